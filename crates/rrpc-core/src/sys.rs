//! The small operating-system layer: memfd mappings, eventfds and fd passing.
//!
//! Everything that talks to the kernel directly lives here (mio's `sys` pattern),
//! so the rest of the crate works with owned, typed handles.
// The workspace denies `unsafe`; this module maps and unmaps memory, so it allows it, with a
// SAFETY argument on every block.
#![allow(unsafe_code)]
// Under miri a mapping is heap memory: the memfd and huge-page paths go unused.
#![cfg_attr(miri, allow(dead_code, unreachable_code, unused_imports))]

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FallocateFlags, FcntlArg, OFlag, SealFlag, fallocate, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd as NixEventFd};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap, munmap};

use crate::error::{Error, Result};

/// Size of a huge page on x86-64 Linux.
pub(crate) const HUGE_PAGE: usize = 2 << 20;
/// Size of a base page.
pub(crate) const PAGE: usize = 4096;

/// Rounds `n` up to a multiple of `to` (a power of two).
pub(crate) fn round_up(n: usize, to: usize) -> usize {
    debug_assert!(to.is_power_of_two());
    (n + to - 1) & !(to - 1)
}

/// After huge pages failed, allocations skip the attempt for this long: a host
/// without them pays the failed `mmap` (and its four other system calls) once
/// per period, not on every region of every connection.
const HUGE_RETRY: Duration = Duration::from_secs(10);

/// When huge pages last failed, in ns since [`clock_epoch`] plus one (0: never).
static HUGE_FAILED_AT: AtomicU64 = AtomicU64::new(0);

fn clock_epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    u64::try_from(clock_epoch().elapsed().as_nanos())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

fn huge_failed_recently() -> bool {
    let at = HUGE_FAILED_AT.load(Ordering::Relaxed);
    at != 0 && now_ns().saturating_sub(at) < HUGE_RETRY.as_nanos() as u64
}

/// A `MAP_SHARED` mapping of a memfd. Unmapped on drop.
///
/// Under miri, which cannot create or map a memfd, it is zeroed heap memory
/// with the same alignment and length, so that the code that reads and
/// writes regions (`Region`'s accessors, rrpc-ringbuf's byte views) runs
/// under miri too. Nothing that needs the fd (granting a region to a peer,
/// punching holes) runs there.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    #[cfg(not(miri))]
    fd: OwnedFd,
    huge: bool,
}

// SAFETY: the mapping is plain shared memory; all access goes through raw pointers
// whose users synchronise with atomics. Moving the owner between threads is fine.
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` only hands out raw pointers and the fd; see above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates a new anonymous memfd of at least `len` bytes and maps it.
    /// Tries huge pages first when `try_huge` and silently falls back.
    pub(crate) fn create(len: usize, try_huge: bool) -> Result<Mapping> {
        if len == 0 {
            return Err(Error::InvalidConfig("region length must be > 0".into()));
        }
        #[cfg(miri)]
        {
            let _ = try_huge;
            Self::create_on_heap(len)
        }
        #[cfg(not(miri))]
        {
            Self::create_memfd(len, try_huge)
        }
    }

    /// Zeroed, page-aligned heap memory (miri only: see the type's docs).
    #[cfg(miri)]
    fn create_on_heap(len: usize) -> Result<Mapping> {
        let size = round_up(len, PAGE);
        let layout = std::alloc::Layout::from_size_align(size, PAGE)
            .map_err(|_| Error::InvalidConfig(format!("region of {size} bytes")))?;
        // SAFETY: `layout` has a non-zero size (`len > 0`, checked by `create`).
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| Error::InvalidConfig(format!("no memory for {size} bytes")))?;
        Ok(Mapping {
            ptr,
            len: size,
            huge: false,
        })
    }

    #[cfg(not(miri))]
    fn create_memfd(len: usize, try_huge: bool) -> Result<Mapping> {
        if try_huge && len >= HUGE_PAGE && !huge_failed_recently() {
            match Self::create_with(len, true) {
                Ok(m) => return Ok(m),
                Err(e) => {
                    HUGE_FAILED_AT.store(now_ns(), Ordering::Relaxed);
                    static ONCE: Once = Once::new();
                    ONCE.call_once(
                        || tracing::debug!(error = %e, "huge pages unavailable; using 4 KiB pages"),
                    );
                }
            }
        }
        Self::create_with(len, false)
    }

    #[cfg(not(miri))]
    fn create_with(len: usize, huge: bool) -> Result<Mapping> {
        let name: &CStr = c"rrpc-region";
        let mut flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        let size = if huge {
            flags |= MFdFlags::MFD_HUGETLB | MFdFlags::MFD_HUGE_2MB;
            round_up(len, HUGE_PAGE)
        } else {
            round_up(len, PAGE)
        };
        let fd = memfd_create(name, flags).map_err(|e| Error::nix("memfd_create", e))?;
        let off = libc::off_t::try_from(size)
            .map_err(|_| Error::InvalidConfig(format!("region of {size} bytes")))?;
        nix::unistd::ftruncate(&fd, off).map_err(|e| Error::nix("ftruncate", e))?;
        // Seal the size: a peer we grant this fd to must not be able to shrink
        // it under our mapping (a SIGBUS on our next access), nor we under its.
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).map_err(|e| Error::nix("memfd seal", e))?;
        let mut m = Self::map(fd, size)?;
        m.huge = huge;
        if huge {
            // Touch every huge page now: a hugetlb mapping whose pool is empty would
            // otherwise SIGBUS at first touch instead of failing here.
            // SAFETY: the range is exactly our fresh mapping, which nobody else uses yet;
            // POPULATE_WRITE only faults pages in and changes no contents.
            unsafe { madvise(m.ptr.cast(), size, MmapAdvise::MADV_POPULATE_WRITE) }
                .map_err(|e| Error::nix("madvise(POPULATE_WRITE)", e))?;
        }
        Ok(m)
    }

    /// Maps an fd received from a peer. `len` is the length the peer claims;
    /// it is checked against the file's real size, so a lying peer cannot make us
    /// map past the end of the file (which would SIGBUS on access). `what`
    /// names the object in errors ("region 2", "receive queue").
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] as [`check_peer_memfd`].
    pub(crate) fn map_peer(fd: OwnedFd, len: usize, what: &str) -> Result<Mapping> {
        check_peer_memfd(fd.as_fd(), len as u64, what)?;
        #[cfg(miri)]
        return Err(Error::InvalidConfig(format!(
            "cannot map the peer's {what} under miri"
        )));
        #[cfg(not(miri))]
        Self::map(fd, len)
    }

    #[cfg(not(miri))]
    fn map(fd: OwnedFd, len: usize) -> Result<Mapping> {
        let nz = std::num::NonZeroUsize::new(len)
            .ok_or_else(|| Error::InvalidConfig("zero-length mapping".into()))?;
        // SAFETY: we map a shared file mapping of `len` bytes of a valid fd at an address
        // the kernel chooses; no existing Rust object is aliased.
        let ptr = unsafe {
            mmap(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| Error::nix("mmap", e))?;
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
            fd,
            huge: false,
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    pub(crate) fn is_huge(&self) -> bool {
        self.huge
    }
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        #[cfg(miri)]
        unreachable!("a region has no memfd under miri");
        #[cfg(not(miri))]
        self.fd.as_fd()
    }

    /// Releases the whole pages inside `offset..offset + len` (the caller
    /// checked the range): a hole punched in the memfd, so every mapping of
    /// it reads zeros there and the pages are freed. Returns the bytes
    /// released.
    pub(crate) fn discard(&self, offset: usize, len: usize) -> Result<usize> {
        let start = round_up(offset, PAGE);
        let end = (offset + len) / PAGE * PAGE;
        if end <= start {
            return Ok(0);
        }
        // Punching a hole changes file contents (to zeros), never the mapping's
        // extent: the memory stays mapped and every pointer into it valid.
        #[cfg(miri)]
        {
            // SAFETY: inside the allocation (the caller checked the range).
            unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(start), 0, end - start) };
            return Ok(end - start);
        }
        #[cfg(not(miri))]
        let off = |n: usize| {
            libc::off_t::try_from(n).map_err(|_| Error::InvalidConfig(format!("offset {n}")))
        };
        #[cfg(not(miri))]
        fallocate(
            &self.fd,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            off(start)?,
            off(end - start)?,
        )
        .map_err(|e| Error::nix("fallocate(PUNCH_HOLE)", e))?;
        Ok(end - start)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[cfg(miri)]
        {
            let layout = std::alloc::Layout::from_size_align(self.len, PAGE).expect("as created");
            // SAFETY: allocated in `create_on_heap` with this layout (`len` is its size).
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
        #[cfg(not(miri))]
        // SAFETY: `ptr`/`len` describe exactly the mapping created in `map`, and no
        // reference derived from it outlives `self` (borrows are tied to `&self`).
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// Checks that a peer's fd is safe to map `len` bytes of, shared and
/// writable: a memfd (a regular shmem file) sealed against shrinking and
/// growing — otherwise the peer could truncate it under our mapping and
/// crash us with SIGBUS — not sealed against writes, and at least `len`
/// bytes long.
///
/// # Errors
/// [`Error::MalformedHandshake`] naming `what` and the problem.
pub(crate) fn check_peer_memfd(fd: BorrowedFd<'_>, len: u64, what: &str) -> Result<()> {
    let bad = |why: String| Err(Error::MalformedHandshake(format!("peer {what} {why}")));
    let st = match nix::sys::stat::fstat(fd) {
        Ok(st) => st,
        Err(e) => return bad(format!("cannot be inspected: {e}")),
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return bad("is not a memfd (not a regular file)".into());
    }
    let Ok(seals) = fcntl(fd, FcntlArg::F_GET_SEALS) else {
        return bad("is not a memfd (it cannot carry seals)".into());
    };
    let seals = SealFlag::from_bits_retain(seals);
    if !seals.contains(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW) {
        return bad("is not a memfd sealed against shrinking and growing".into());
    }
    if seals.intersects(SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_FUTURE_WRITE) {
        return bad("is sealed against writes".into());
    }
    if len == 0 || (st.st_size as u64) < len {
        return bad(format!(
            "claims {len} bytes but its memory object has {}",
            st.st_size
        ));
    }
    Ok(())
}

/// Our end of a doorbell a peer rings: the read end of a pipe (the shm
/// provider's receive queue channel). The peer gets the write end
/// ([`BellRx::peer_end`]) and writes a byte to wake us.
///
/// A pipe, not an eventfd: its two ends are two file descriptions, so
/// nothing the peer does to its end (clearing `O_NONBLOCK`, say) reaches
/// ours, and the peer's end is written with `pwritev2(RWF_NOWAIT)`, which
/// is non-blocking per call whatever any flag says. An eventfd is one
/// description both processes share, and the kernel has no per-call
/// non-blocking eventfd write: a peer that cleared `O_NONBLOCK` and filled
/// its counter at the right moment could block our writer, and with it
/// every connection its thread serves. (A Unix socket pair is as safe and
/// was measured ~2.7 µs per wake-up slower on the HTTP/2 path on one CPU;
/// docs/measured.md.)
#[derive(Debug)]
pub(crate) struct BellRx {
    fd: OwnedFd,
    peer: OwnedFd,
}

/// Bytes one [`BellRx::drain`] reads at most: a peer that writes more than
/// that only wakes itself spuriously later.
const BELL_DRAIN_MAX: usize = 16 * 1024;

impl BellRx {
    /// A new doorbell: our end and the end the peer receives.
    ///
    /// # Errors
    /// [`Error::Io`] when the kernel refuses a pipe (out of descriptors).
    pub(crate) fn new() -> Result<BellRx> {
        let (fd, peer) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| Error::nix("doorbell pipe", e))?;
        Ok(BellRx { fd, peer })
    }

    /// The end to pass to the peer (it stays open here too, for a later
    /// handshake of the same queue pair).
    pub(crate) fn peer_end(&self) -> BorrowedFd<'_> {
        self.peer.as_fd()
    }

    /// Consumes the rings pending; returns how many bytes were read (0 if
    /// none). Never blocks: our read end's `O_NONBLOCK` is ours alone.
    ///
    /// # Errors
    /// [`Error::Io`] for a failed read other than "nothing pending".
    pub(crate) fn drain(&self) -> Result<u64> {
        let mut buf = [0u8; 256];
        let mut total = 0u64;
        while (total as usize) < BELL_DRAIN_MAX {
            match nix::unistd::read(&self.fd, &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    if n < buf.len() {
                        break;
                    }
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break,
                Err(e) => return Err(Error::nix("doorbell read", e)),
            }
        }
        Ok(total)
    }
}

impl AsFd for BellRx {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Set once the kernel refused `pwritev2(RWF_NOWAIT)` on a pipe (never tried again; read,
/// not written, on every ring).
static NOWAIT_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The peer's doorbell ([`BellRx`]'s write end, passed to us): a byte
/// written to it wakes the peer.
#[derive(Debug)]
pub(crate) struct PeerBell {
    fd: OwnedFd,
}

impl PeerBell {
    /// Checks the kind ([`check_peer_bell`]).
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] for a wrong kind.
    pub(crate) fn new(fd: OwnedFd) -> Result<PeerBell> {
        check_peer_bell(fd.as_fd())?;
        Ok(PeerBell { fd })
    }

    /// Rings: one byte, never blocking. A full pipe means the peer has
    /// wake-ups pending already; a broken one, that the peer left (its side
    /// channel reports that): neither is an error. (A write to a pipe whose
    /// reader is gone raises `SIGPIPE`, which Rust programs ignore.)
    ///
    /// Kernels without `RWF_NOWAIT` on pipes get a `poll` for room, our
    /// `O_NONBLOCK` restored and a plain `write`: a peer that clears the
    /// flag and fills its pipe in the few instructions between our `fcntl`
    /// and the write can still make that write wait until it reads.
    ///
    /// # Errors
    /// [`Error::Io`] for any other failed write.
    pub(crate) fn notify(&self) -> Result<()> {
        let one = [1u8];
        if !NOWAIT_REFUSED.load(Ordering::Relaxed) && !cfg!(miri) {
            let iov = libc::iovec {
                iov_base: one.as_ptr() as *mut libc::c_void,
                iov_len: 1,
            };
            loop {
                // SAFETY: `iov` describes `one`, 1 readable byte that outlives
                // the call (the kernel only reads it); `fd` is open and
                // borrowed for the call; offset -1: the file position (a pipe
                // has none).
                let n =
                    unsafe { libc::pwritev2(self.fd.as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) };
                if n >= 0 {
                    return Ok(());
                }
                match Errno::last() {
                    Errno::EAGAIN | Errno::EPIPE => return Ok(()),
                    Errno::EINTR => {}
                    Errno::EOPNOTSUPP | Errno::EINVAL | Errno::ENOSYS => {
                        NOWAIT_REFUSED.store(true, Ordering::Relaxed);
                        break;
                    }
                    e => return Err(Error::nix("peer doorbell write", e)),
                }
            }
        }
        match poll(
            &mut [PollFd::new(self.fd.as_fd(), PollFlags::POLLOUT)],
            PollTimeout::ZERO,
        ) {
            Ok(0) => return Ok(()), // full: the peer is readable already
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(Error::nix("poll", e)),
        }
        let flags =
            fcntl(&self.fd, FcntlArg::F_GETFL).map_err(|e| Error::nix("fcntl(F_GETFL)", e))?;
        let flags = OFlag::from_bits_retain(flags);
        if !flags.contains(OFlag::O_NONBLOCK) {
            fcntl(&self.fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))
                .map_err(|e| Error::nix("fcntl(F_SETFL)", e))?;
        }
        match nix::unistd::write(&self.fd, &one) {
            Ok(_) | Err(Errno::EAGAIN | Errno::EPIPE) => Ok(()),
            Err(e) => Err(Error::nix("peer doorbell write", e)),
        }
    }
}

/// Checks that a peer's doorbell is the write end of a pipe: writing a
/// byte to it then never blocks ([`PeerBell::notify`]) and never leaves the
/// host.
///
/// # Errors
/// [`Error::MalformedHandshake`] naming what the fd is instead.
pub(crate) fn check_peer_bell(fd: BorrowedFd<'_>) -> Result<()> {
    let bad = |why: String| Err(Error::MalformedHandshake(format!("peer doorbell {why}")));
    let st = match nix::sys::stat::fstat(fd) {
        Ok(st) => st,
        Err(e) => return bad(format!("cannot be inspected: {e}")),
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        let kind = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("a file of mode {:#o}", st.st_mode));
        return bad(format!("is not a pipe but {kind}"));
    }
    match fcntl(fd, FcntlArg::F_GETFL) {
        Ok(fl) if OFlag::from_bits_retain(fl) & OFlag::O_ACCMODE == OFlag::O_WRONLY => Ok(()),
        Ok(_) => bad("is a pipe, but not its write end".into()),
        Err(e) => bad(format!("cannot be inspected: {e}")),
    }
}

/// Adds 1 to an eventfd's counter; a full counter (`EAGAIN`) already means
/// "readable", which is all a notification has to achieve.
fn add_one(fd: BorrowedFd<'_>) -> nix::Result<()> {
    match nix::unistd::write(fd, &1u64.to_ne_bytes()) {
        Ok(_) | Err(Errno::EAGAIN) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A non-blocking, close-on-exec eventfd (mio's waker pattern): the
/// doorbell of the shm provider's completion channels and of the poller's
/// sleeping shards.
#[derive(Debug)]
pub struct EventFd {
    fd: NixEventFd,
}

impl EventFd {
    /// A new eventfd with a zero counter.
    ///
    /// # Errors
    /// [`Error::Io`] when the kernel refuses one (out of descriptors).
    pub fn new() -> Result<EventFd> {
        let fd =
            NixEventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(|e| Error::nix("eventfd", e))?;
        Ok(EventFd { fd })
    }

    /// Adds 1 to the counter. A full counter (`EAGAIN`, after 2^64-2 unread
    /// notifications) already means "readable".
    ///
    /// # Errors
    /// [`Error::Io`] for any other failed write.
    pub fn notify(&self) -> Result<()> {
        add_one(self.fd.as_fd()).map_err(|e| Error::nix("eventfd write", e))
    }

    /// Reads and resets the counter; returns the number of events (0 if none).
    ///
    /// # Errors
    /// [`Error::Io`] for a failed read other than "nothing pending".
    pub fn drain(&self) -> Result<u64> {
        match self.fd.read() {
            Ok(v) => Ok(v),
            Err(Errno::EAGAIN) => Ok(0),
            Err(e) => Err(Error::nix("eventfd read", e)),
        }
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_fd().as_raw_fd()
    }
}

/// Returns a random 32-bit value (for remote keys and tokens) from the kernel.
pub(crate) fn random_u32() -> u32 {
    getrandom::u32().unwrap_or_else(|_| {
        // getrandom never fails for 4 bytes after boot; fall back to a time-based value.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0x5eed);
        t ^ std::process::id()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring is a byte the drain counts; a full doorbell and a gone peer
    /// are no error for the ringer, and nothing blocks.
    #[test]
    #[cfg_attr(miri, ignore = "system calls")]
    fn a_doorbell_rings_drains_and_never_blocks() {
        let rx = BellRx::new().unwrap();
        let tx = PeerBell::new(rx.peer_end().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(rx.drain().unwrap(), 0);
        tx.notify().unwrap();
        tx.notify().unwrap();
        assert_eq!(rx.drain().unwrap(), 2);
        assert_eq!(rx.drain().unwrap(), 0);
        // More rings than the pipe holds (64 KiB by default): the rest are
        // no-ops, none blocks, and each drain reads at most its bound.
        for _ in 0..70_000 {
            tx.notify().unwrap();
        }
        let mut got = 0;
        loop {
            let n = rx.drain().unwrap();
            assert!(n as usize <= BELL_DRAIN_MAX);
            if n == 0 {
                break;
            }
            got += n;
        }
        assert!(got > 0 && got < 70_000, "{got}");
        // The peer leaves: ringing is still not an error.
        drop(rx);
        tx.notify().unwrap();
    }

    /// The peer's doorbell must be a pipe's write end.
    #[test]
    #[cfg_attr(miri, ignore = "system calls")]
    fn a_peer_doorbell_must_be_a_pipes_write_end() {
        let ev = EventFd::new().unwrap();
        let e = PeerBell::new(ev.as_fd().try_clone_to_owned().unwrap()).unwrap_err();
        assert!(
            matches!(e, Error::MalformedHandshake(ref m) if m.contains("eventfd")),
            "{e}"
        );
        let rx = BellRx::new().unwrap();
        let e = PeerBell::new(rx.as_fd().try_clone_to_owned().unwrap()).unwrap_err();
        assert!(
            matches!(e, Error::MalformedHandshake(ref m) if m.contains("write end")),
            "{e}"
        );
        PeerBell::new(rx.peer_end().try_clone_to_owned().unwrap()).unwrap();
    }

    #[test]
    fn discard_frees_whole_pages_for_every_mapping_and_keeps_the_rest() {
        let m = Mapping::create(8 * PAGE, false).unwrap();
        let fd = m.fd().try_clone_to_owned().unwrap();
        let peer = Mapping::map_peer(fd, 8 * PAGE, "region").unwrap();
        // SAFETY: both are 8-page mappings of the same memfd, used by this thread only.
        let (ours, theirs) = unsafe {
            (
                std::slice::from_raw_parts_mut(m.ptr(), 8 * PAGE),
                std::slice::from_raw_parts(peer.ptr(), 8 * PAGE),
            )
        };
        ours.fill(0xA5);
        // From the middle of page 1 to the middle of page 6: pages 2..=5 go.
        let released = m.discard(PAGE + 100, 5 * PAGE).unwrap();
        assert_eq!(released, 4 * PAGE);
        for (i, &b) in theirs.iter().enumerate() {
            let want = if (2 * PAGE..6 * PAGE).contains(&i) {
                0
            } else {
                0xA5
            };
            assert_eq!(b, want, "byte {i} as the peer sees it");
        }
        // The hole is writable again (the sealed size is unchanged).
        ours[3 * PAGE] = 7;
        assert_eq!(theirs[3 * PAGE], 7);
        assert_eq!(
            m.discard(PAGE + 1, PAGE).unwrap(),
            0,
            "no whole page inside"
        );
    }

    #[test]
    fn own_regions_are_sealed_and_mappable_by_a_peer() {
        let m = Mapping::create(8192, false).unwrap();
        let fd = m.fd().try_clone_to_owned().unwrap();
        let peer = Mapping::map_peer(fd, 8192, "region").unwrap();
        // SAFETY: both mappings are 8192 bytes of the same memfd.
        unsafe {
            *m.ptr() = 42;
            assert_eq!(*peer.ptr(), 42);
        }
        assert!(
            nix::unistd::ftruncate(m.fd(), 0).is_err(),
            "a sealed region cannot shrink"
        );
    }

    #[test]
    fn unsealed_or_short_peer_memory_is_refused() {
        let fd = memfd_create(c"x", MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, 4096).unwrap();
        assert!(matches!(
            Mapping::map_peer(fd, 4096, "region"),
            Err(Error::MalformedHandshake(_))
        ));
        let m = Mapping::create(4096, false).unwrap();
        let fd = m.fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            Mapping::map_peer(fd, 1 << 20, "region"),
            Err(Error::MalformedHandshake(_))
        ));
    }
}
