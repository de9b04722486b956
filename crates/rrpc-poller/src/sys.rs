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
    register(inner, tokio::io::Interest::READABLE)
}

/// Registers `inner` with the current tokio reactor for `interest`: the one place this
/// workspace hands a descriptor to tokio.
fn register<T: StableFd>(
    inner: T,
    interest: tokio::io::Interest,
) -> io::Result<tokio::io::unix::AsyncFd<T>> {
    #[allow(unsafe_code)]
    // SAFETY: `T: StableFd` owns its descriptor (an `OwnedFd`, or an `Arc` keeping one alive),
    // so the fd is valid, open and the same for as long as the `AsyncFd` owns `inner`.
    let r = unsafe { tokio::io::unix::AsyncFd::register_with_interest(inner, interest) };
    r.map_err(|e| e.into_parts().1)
}

/// A descriptor someone else owns (a side channel's socket, a listener), watched for
/// readiness by the current tokio reactor.
///
/// It registers a duplicate of the descriptor, which it owns, so the registration can never
/// outlive the descriptor it watches, whatever the owner does: the sound way to await a
/// borrowed fd (tokio's safe constructors for borrowed descriptors are deprecated as unsound).
/// The duplicate shares the open file: reads, accepts and flags on the original are seen
/// through it. The cost is one `dup` per watch.
#[derive(Debug)]
pub struct WatchedFd(tokio::io::unix::AsyncFd<DupFd>);

/// Readiness reported by a [`WatchedFd`]; see tokio's `AsyncFdReadyGuard`.
#[derive(Debug)]
pub struct ReadyGuard<'a>(tokio::io::unix::AsyncFdReadyGuard<'a, DupFd>);

impl ReadyGuard<'_> {
    /// Forgets the readiness this guard reported: call it once the descriptor said
    /// `EAGAIN`, or the next wait returns at once.
    pub fn clear_ready(&mut self) {
        self.0.clear_ready();
    }

    /// Whether the readiness includes the peer shutting down its sending side (a stream
    /// socket's `EPOLLRDHUP` or a hang-up): nothing more will arrive after what is queued.
    pub fn is_read_closed(&self) -> bool {
        self.0.ready().is_read_closed()
    }
}

impl WatchedFd {
    /// Watches `fd` for `interest` on the current tokio runtime.
    ///
    /// # Errors
    /// The `dup` or the reactor's registration failed; or there is no runtime.
    pub fn new(fd: BorrowedFd<'_>, interest: tokio::io::Interest) -> io::Result<WatchedFd> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other("WatchedFd::new outside a tokio runtime"));
        }
        register(DupFd::new(fd)?, interest).map(WatchedFd)
    }

    /// Waits until the descriptor is readable (or the reactor says so spuriously).
    ///
    /// Cancel safe: dropping the future loses no readiness.
    ///
    /// # Errors
    /// The reactor shut down.
    pub async fn readable(&self) -> io::Result<ReadyGuard<'_>> {
        self.0.readable().await.map(ReadyGuard)
    }

    /// Waits until the descriptor is writable. Cancel safe, as [`readable`](Self::readable).
    ///
    /// # Errors
    /// The reactor shut down.
    pub async fn writable(&self) -> io::Result<ReadyGuard<'_>> {
        self.0.writable().await.map(ReadyGuard)
    }
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

/// The calling thread's kernel id (what `sched_setaffinity` names a thread by).
pub(crate) fn thread_id() -> i32 {
    nix::unistd::gettid().as_raw()
}

/// The CPUs thread `tid` may run on (`0`: the calling thread).
pub(crate) fn affinity(tid: i32) -> io::Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(tid))?;
    Ok((0..cpu_ids())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// How many CPU numbers a mask can name on this machine: the CPUs configured
/// (`_SC_NPROCESSORS_CONF`), within a `CpuSet`'s 1024. A mask is read bit by bit, and a
/// loop over all 1024 bits per thread made each re-read of [`process_cpus`] cost ~200 k
/// instructions on a 2-CPU machine with ten threads.
fn cpu_ids() -> usize {
    static IDS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let max = nix::sched::CpuSet::count();
    *IDS.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_CONF)
            .ok()
            .flatten()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
            .map_or(max, |n| n.min(max))
    })
}

/// Pins thread `tid` (`0`: the calling thread) to `cpus`.
pub(crate) fn set_affinity(tid: i32, cpus: &[usize]) -> io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c)?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set)?;
    Ok(())
}

/// The CPUs the threads of process `pid` may run on together: the union of their affinity
/// masks (`/proc/PID/task`). A process whose threads were pinned apart may use all of them
/// even while its main thread sits on one. `None` when it cannot be read.
fn process_mask(pid: i32) -> Option<Vec<usize>> {
    use nix::sched::sched_getaffinity;
    let mut union = vec![false; cpu_ids()];
    let mut any = false;
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Some(tid) = e
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        else {
            continue;
        };
        // A thread that ended meanwhile has no mask: it no longer counts.
        let Ok(m) = sched_getaffinity(nix::unistd::Pid::from_raw(tid)) else {
            continue;
        };
        any = true;
        for (c, u) in union.iter_mut().enumerate() {
            *u |= m.is_set(c).unwrap_or(false);
        }
    }
    any.then(|| (0..union.len()).filter(|&c| union[c]).collect())
}

/// How long a reading of [`process_cpus`] stands: threads may be pinned after the process
/// started (a benchmark that pins its main thread to one core while it sets up, then moves
/// it), so the answer is re-read, at most this often.
pub(crate) const CPUS_RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// How many CPUs this process may use: the union of its threads' affinity masks (as
/// `taskset` gives them), capped by the cgroup's CPU limits (cpuset and quota, as
/// [`std::thread::available_parallelism`] reads them). Re-read at most every
/// [`CPUS_RECHECK`]. `None` when it cannot be read.
pub(crate) fn process_cpus() -> Option<usize> {
    type Reading = Option<(std::time::Instant, Option<usize>)>;
    static LAST: std::sync::Mutex<Reading> = std::sync::Mutex::new(None);
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((at, cpus)) = *last
        && at.elapsed() < CPUS_RECHECK
    {
        return cpus;
    }
    let me = i32::try_from(std::process::id()).ok();
    let cpus = me
        .and_then(process_mask)
        .map(|m| cgroup_cpus().map_or(m.len(), |q| q.min(m.len())));
    *last = Some((std::time::Instant::now(), cpus));
    cpus
}

/// The cgroup's CPU limits: what [`std::thread::available_parallelism`] reports on a thread
/// that asked for every CPU (the kernel keeps only those the cpuset allows; the quota caps
/// the count). Read once per process (cgroup limits are the container's, set before start).
fn cgroup_cpus() -> Option<usize> {
    static CPUS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        use nix::sched::{CpuSet, sched_setaffinity};
        std::thread::Builder::new()
            .name("rrpc-cpus".into())
            .spawn(|| {
                let mut all = CpuSet::new();
                for c in 0..CpuSet::count() {
                    let _ = all.set(c);
                }
                sched_setaffinity(nix::unistd::Pid::from_raw(0), &all).ok()?;
                std::thread::available_parallelism().ok().map(|n| n.get())
            })
            .ok()?
            .join()
            .ok()
            .flatten()
    })
}

/// Whether a peer process on this host needs this process's only CPU: this process may run on
/// one CPU (mask or quota), and the peer is this very process, or may run on that CPU alone.
/// Then a wait that spins only delays the peer it waits for ([`crate::Handoff::Auto`]).
pub(crate) fn peer_shares_only_cpu(peer_pid: i32) -> bool {
    if process_cpus() != Some(1) {
        return false;
    }
    let Ok(me) = i32::try_from(std::process::id()) else {
        return false;
    };
    if peer_pid == me {
        return true;
    }
    match (process_mask(me), process_mask(peer_pid)) {
        (Some(mine), Some(theirs)) => {
            mine.len() == 1 && !theirs.is_empty() && theirs.iter().all(|c| mine.contains(c))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's mask, read over the configured CPUs only, holds every CPU this thread
    /// may use: the bound on the loop loses none.
    #[test]
    fn the_process_mask_holds_this_threads_cpus() {
        let mine = affinity(0).expect("own affinity");
        assert!(!mine.is_empty());
        let me = i32::try_from(std::process::id()).expect("pid");
        let all = process_mask(me).expect("process mask");
        for c in &mine {
            assert!(*c < cpu_ids(), "cpu {c} beyond {}", cpu_ids());
            assert!(all.contains(c), "cpu {c} missing from {all:?}");
        }
        assert!(process_cpus().is_some_and(|n| n >= 1 && n <= all.len()));
    }

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

    #[tokio::test(flavor = "current_thread")]
    async fn a_watched_fd_wakes_on_data_and_outlives_its_owner_soundly() {
        use std::io::{Read, Write};
        use std::os::fd::AsFd;
        use std::time::Duration;
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let w = WatchedFd::new(a.as_fd(), tokio::io::Interest::READABLE).unwrap();
        // Nothing to read: the wait does not end.
        let early = tokio::time::timeout(Duration::from_millis(50), w.readable()).await;
        assert!(early.is_err(), "readable with nothing written");
        b.write_all(b"x").unwrap();
        let mut g = tokio::time::timeout(Duration::from_secs(5), w.readable())
            .await
            .expect("woken by the write")
            .unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(
            a.read(&mut buf).unwrap(),
            1,
            "the read goes to the shared file"
        );
        assert!(a.read(&mut buf).is_err(), "drained");
        g.clear_ready();
        // The owner closes first: the watch holds its own duplicate, so
        // the registration never names a closed (or reused) descriptor.
        drop(a);
        drop(b);
        let hup = tokio::time::timeout(Duration::from_secs(5), w.readable()).await;
        assert!(
            hup.is_ok(),
            "the peer's close is reported through the duplicate"
        );
        drop(w);
    }

    #[test]
    fn watching_needs_a_runtime() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        use std::os::fd::AsFd;
        let e = WatchedFd::new(a.as_fd(), tokio::io::Interest::READABLE).unwrap_err();
        assert!(e.to_string().contains("outside a tokio runtime"), "{e}");
    }
}
