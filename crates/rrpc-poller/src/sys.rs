//! The OS-facing layer: owned duplicates of foreign descriptors, their tokio registration,
//! and the thread clock. The eventfd doorbell is rrpc-core's [`EventFd`].

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

pub(crate) use rrpc_core::EventFd;

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

/// Reads what a polling thread's [`Governor`](crate::backoff::Governor) needs from the OS for
/// the calling thread: its CPU time and, where the kernel reports it, its run-queue delay.
/// Made on the thread it measures; one `clock_gettime` and one `pread` per reading.
#[derive(Debug)]
pub(crate) struct ThreadClock {
    schedstat: Option<std::fs::File>,
}

impl ThreadClock {
    pub(crate) fn for_current_thread() -> Self {
        Self {
            schedstat: std::fs::File::open("/proc/thread-self/schedstat").ok(),
        }
    }

    pub(crate) fn sample(&self) -> crate::backoff::ThreadSample {
        use nix::time::{ClockId, clock_gettime};
        let cpu = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
            .map(std::time::Duration::from)
            .unwrap_or_default();
        crate::backoff::ThreadSample {
            cpu,
            run_delay: self.schedstat.as_ref().and_then(read_run_delay),
        }
    }
}

/// `schedstat` is "<ns on cpu> <ns waiting on a run queue> <slices>".
fn read_run_delay(f: &std::fs::File) -> Option<std::time::Duration> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 96];
    let n = f.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(buf.get(..n)?).ok()?;
    let ns: u64 = text.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(std::time::Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spinning_thread_sees_its_cpu_time_grow() {
        let clock = ThreadClock::for_current_thread();
        let a = clock.sample();
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(5) {
            std::hint::spin_loop();
        }
        let b = clock.sample();
        assert!(b.cpu > a.cpu, "{a:?} -> {b:?}");
        // Where the kernel has schedstat, the run-queue delay never goes back.
        if let (Some(x), Some(y)) = (a.run_delay, b.run_delay) {
            assert!(y >= x);
        }
    }
}
