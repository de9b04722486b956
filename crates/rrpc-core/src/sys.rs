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

/// Checks that a peer's fd is an eventfd (and not, say, a pipe, whose
/// writes could block or whose reader could be anything).
///
/// `/proc/self/fd/N` names an eventfd `anon_inode:[eventfd]`. Without
/// `/proc`, the fd must at least be an anonymous inode (the inode every
/// eventfd shares): that excludes pipes, sockets and files, and writing
/// 8 bytes to the other anonymous-inode kinds fails instead of blocking.
///
/// # Errors
/// [`Error::MalformedHandshake`] naming the fd's kind.
pub(crate) fn check_peer_eventfd(fd: BorrowedFd<'_>) -> Result<()> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let kind = match std::fs::read_link(&link) {
        Ok(target) => target.to_string_lossy().into_owned(),
        Err(_) => {
            let theirs = nix::sys::stat::fstat(fd).map_err(|e| Error::nix("fstat", e))?;
            let ours = EventFd::new()?;
            let ours = nix::sys::stat::fstat(ours.as_fd()).map_err(|e| Error::nix("fstat", e))?;
            if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino) {
                return Ok(());
            }
            format!("file of mode {:#o}", theirs.st_mode)
        }
    };
    if kind == "anon_inode:[eventfd]" {
        return Ok(());
    }
    Err(Error::MalformedHandshake(format!(
        "peer eventfd is not an eventfd but {kind}"
    )))
}

/// A peer's eventfd, written to wake the peer. The peer shares this file
/// description and can change its flags and counter at any time, so no write
/// may rely on them: see [`Self::notify`].
#[derive(Debug)]
pub(crate) struct PeerEventFd {
    fd: OwnedFd,
}

impl PeerEventFd {
    /// Checks the kind ([`check_peer_eventfd`]) and makes the fd
    /// non-blocking.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] for a wrong kind; [`Error::Io`].
    pub(crate) fn new(fd: OwnedFd) -> Result<PeerEventFd> {
        check_peer_eventfd(fd.as_fd())?;
        ensure_nonblocking(fd.as_fd())?;
        Ok(PeerEventFd { fd })
    }

    /// Adds 1 to the peer's counter, without blocking.
    ///
    /// A write to an eventfd blocks only when the counter is at its maximum
    /// and the description is blocking. We skip the write when `poll` says
    /// the counter is full (the peer is then readable, i.e. already
    /// notified), restore `O_NONBLOCK` if the peer cleared it, and take
    /// `EAGAIN` as "already notified".
    ///
    /// Residual window: the kernel has no per-call non-blocking eventfd
    /// write, so a peer that clears `O_NONBLOCK` *and* fills its counter in
    /// the few instructions between our `fcntl` and `write` can still make
    /// this write wait until it reads its eventfd.
    pub(crate) fn notify(&self) -> Result<()> {
        if !ready_now(self.fd.as_fd(), PollFlags::POLLOUT)? {
            return Ok(()); // counter full: the peer is readable already
        }
        ensure_nonblocking(self.fd.as_fd())?;
        add_one(self.fd.as_fd()).map_err(|e| Error::nix("peer eventfd write", e))
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

/// Sets `O_NONBLOCK` on `fd` unless it is set already.
fn ensure_nonblocking(fd: BorrowedFd<'_>) -> Result<()> {
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(|e| Error::nix("fcntl(F_GETFL)", e))?;
    let flags = OFlag::from_bits_retain(flags);
    if !flags.contains(OFlag::O_NONBLOCK) {
        fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))
            .map_err(|e| Error::nix("fcntl(F_SETFL)", e))?;
    }
    Ok(())
}

/// Whether `fd` is ready for `events` right now (`poll` with a zero
/// timeout; an interrupted poll counts as ready, the caller's non-blocking
/// call then decides).
fn ready_now(fd: BorrowedFd<'_>, events: PollFlags) -> Result<bool> {
    match poll(&mut [PollFd::new(fd, events)], PollTimeout::ZERO) {
        Ok(n) => Ok(n > 0),
        Err(Errno::EINTR) => Ok(true),
        Err(e) => Err(Error::nix("poll", e)),
    }
}

/// Whether `preadv2(RWF_NOWAIT)` works on eventfds here: 0 untried, 1 yes, 2 no.
static NOWAIT_READ: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Reads and resets an eventfd's counter without blocking, whatever its
/// `O_NONBLOCK` flag says (`preadv2` with `RWF_NOWAIT`): `Some(0)` when
/// nothing is pending, `None` when the kernel does not offer it (then never
/// tried again).
fn read_nowait(fd: BorrowedFd<'_>) -> Result<Option<u64>> {
    if NOWAIT_READ.load(Ordering::Relaxed) == 2 || cfg!(miri) {
        return Ok(None);
    }
    let mut buf = [0u8; 8];
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    loop {
        // SAFETY: `iov` describes `buf`, 8 writable bytes that outlive the
        // call; `fd` is an open descriptor borrowed for the call; offset -1
        // means the file position (an eventfd has none to move).
        let n = unsafe { libc::preadv2(fd.as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) };
        if n == 8 {
            NOWAIT_READ.store(1, Ordering::Relaxed);
            return Ok(Some(u64::from_ne_bytes(buf)));
        }
        match Errno::last() {
            _ if n >= 0 => {
                return Err(Error::nix("eventfd read", Errno::EIO));
            }
            Errno::EAGAIN => {
                NOWAIT_READ.store(1, Ordering::Relaxed);
                return Ok(Some(0));
            }
            Errno::EINTR => continue,
            Errno::EOPNOTSUPP | Errno::EINVAL | Errno::ENOSYS => {
                NOWAIT_READ.store(2, Ordering::Relaxed);
                return Ok(None);
            }
            e => return Err(Error::nix("eventfd read", e)),
        }
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

    /// [`Self::drain`] for an eventfd whose description a peer shares (our
    /// receive queue's, which the peer writes to wake us): the peer may have
    /// cleared `O_NONBLOCK` and may drain the counter itself, so skip the
    /// read when nothing is pending and restore `O_NONBLOCK` before reading.
    /// Same residual window as [`PeerEventFd::notify`].
    ///
    /// Where the kernel offers a per-call non-blocking eventfd read
    /// (`preadv2` with `RWF_NOWAIT`, Linux 5.12 and later), that is one
    /// system call with no window at all; older kernels take the path above.
    pub(crate) fn drain_shared(&self) -> Result<u64> {
        if let Some(n) = read_nowait(self.fd.as_fd())? {
            return Ok(n);
        }
        if !ready_now(self.fd.as_fd(), PollFlags::POLLIN)? {
            return Ok(0);
        }
        ensure_nonblocking(self.fd.as_fd())?;
        self.drain()
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

    #[cfg(test)]
    pub(crate) fn into_owned(self) -> OwnedFd {
        OwnedFd::from(self.fd)
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

    /// The one-syscall drain reads a blocking eventfd (a peer cleared
    /// `O_NONBLOCK`) without blocking, and reads what was added.
    #[test]
    #[cfg_attr(miri, ignore = "system calls")]
    fn read_nowait_never_blocks_and_reads_the_counter() {
        let ev = NixEventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).unwrap();
        let Some(n) = read_nowait(ev.as_fd()).unwrap() else {
            eprintln!("skipped: no preadv2(RWF_NOWAIT) on eventfds in this kernel");
            return;
        };
        assert_eq!(n, 0);
        add_one(ev.as_fd()).unwrap();
        add_one(ev.as_fd()).unwrap();
        assert_eq!(read_nowait(ev.as_fd()).unwrap(), Some(2));
        assert_eq!(read_nowait(ev.as_fd()).unwrap(), Some(0));
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
