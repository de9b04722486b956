//! The OS-facing layer: a non-blocking, close-on-exec eventfd (mio's waker pattern).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::sys::eventfd::{EfdFlags, EventFd as NixEventFd};

/// A non-blocking, close-on-exec eventfd used as a per-connection doorbell.
///
/// `signal` adds 1 to the counter (the fd becomes readable); `drain` reads and resets it.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: NixEventFd,
}

impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
        let fd =
            NixEventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(io::Error::from)?;
        Ok(Self { fd })
    }

    /// Adds 1 to the counter. An overflowing counter (`EAGAIN`, only after 2^64-2 unread
    /// signals) means the fd is already readable, which is all a signal has to achieve.
    pub(crate) fn signal(&self) {
        match self.fd.write(1) {
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(e) => tracing::warn!(error = %e, "eventfd write failed"),
        }
    }

    /// Reads and resets the counter. `Err(WouldBlock)` when it was zero.
    pub(crate) fn drain(&self) -> io::Result<u64> {
        self.fd.read().map_err(io::Error::from)
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_fd().as_raw_fd()
    }
}

/// An owned duplicate of a foreign fd (a completion channel, a liveness socket), so that the
/// tokio registration never outlives the descriptor it watches.
#[derive(Debug)]
pub(crate) struct DupFd(pub(crate) OwnedFd);

impl DupFd {
    pub(crate) fn new(fd: BorrowedFd<'_>) -> io::Result<Self> {
        fd.try_clone_to_owned().map(DupFd)
    }
}

impl AsRawFd for DupFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Fd owners that keep one open descriptor for their whole life: `AsRawFd` always returns the
/// same, valid fd until the value is dropped. That is the contract `AsyncFd::register` needs.
pub(crate) trait StableFd: AsRawFd {}

impl StableFd for DupFd {}
impl StableFd for EventFd {}
impl<T: StableFd> StableFd for std::sync::Arc<T> {}

/// Registers `inner` with the current tokio reactor for readability.
pub(crate) fn register_readable<T: StableFd>(inner: T) -> io::Result<tokio::io::unix::AsyncFd<T>> {
    #[allow(unsafe_code)]
    // SAFETY: `T: StableFd` owns its descriptor (an `OwnedFd`, or an `Arc` keeping one alive),
    // so the fd is valid, open and the same for as long as the `AsyncFd` owns `inner`.
    let r = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE)
    };
    r.map_err(|e| e.into_parts().1)
}

/// Borrows a raw fd owned by `_owner` for as long as `_owner` is borrowed.
pub(crate) fn borrow_fd<T: ?Sized>(_owner: &T, fd: RawFd) -> BorrowedFd<'_> {
    #[allow(unsafe_code)]
    // SAFETY: callers pass an fd that `_owner` owns and keeps open for its whole life
    // (rrpc-core's `Connection::liveness_fd`, `CompletionQueue::channel_fd`); the returned
    // borrow cannot outlive `_owner`.
    unsafe {
        BorrowedFd::borrow_raw(fd)
    }
}
