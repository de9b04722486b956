//! CPU time and memory readers (for the CPU/memory-per-client experiments, Figs. 15–16).

use std::fs;
use std::io;
use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::time::TimeVal;
use nix::unistd::{SysconfVar, sysconf};

/// User and system CPU time consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    /// Time in user mode.
    pub user: Duration,
    /// Time in kernel mode.
    pub system: Duration,
}

impl CpuTimes {
    /// User + system.
    pub fn total(&self) -> Duration {
        self.user + self.system
    }

    /// This process (all threads), from `getrusage(RUSAGE_SELF)`.
    pub fn process() -> io::Result<Self> {
        rusage(UsageWho::RUSAGE_SELF)
    }

    /// The calling thread, from `getrusage(RUSAGE_THREAD)`.
    pub fn thread() -> io::Result<Self> {
        rusage(UsageWho::RUSAGE_THREAD)
    }

    /// Any process, from fields 14 and 15 (`utime`, `stime`) of `/proc/<pid>/stat`.
    pub fn of_pid(pid: u32) -> io::Result<Self> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
        parse_proc_stat(&stat, clock_ticks())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc/pid/stat"))
    }

    /// CPU utilisation between two samples over `wall` time, in percent of one core
    /// (200 % = two cores busy).
    pub fn percent_since(&self, earlier: &CpuTimes, wall: Duration) -> f64 {
        let used = self.total().saturating_sub(earlier.total());
        if wall.is_zero() {
            0.0
        } else {
            100.0 * used.as_secs_f64() / wall.as_secs_f64()
        }
    }
}

fn rusage(who: UsageWho) -> io::Result<CpuTimes> {
    let ru = getrusage(who)?;
    // rusage times are never negative.
    let tv = |t: TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    Ok(CpuTimes {
        user: tv(ru.user_time()),
        system: tv(ru.system_time()),
    })
}

fn clock_ticks() -> u64 {
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as u64,
        _ => 100,
    }
}

/// Parses utime/stime out of a `/proc/<pid>/stat` line. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted after the last `)`.
fn parse_proc_stat(stat: &str, ticks: u64) -> Option<CpuTimes> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let d = |t: u64| Duration::from_nanos(t * 1_000_000_000 / ticks);
    Some(CpuTimes {
        user: d(utime),
        system: d(stime),
    })
}

/// Resident set size of a process (`VmRSS` in `/proc/<pid>/status`; `None` = this process).
pub fn rss_bytes(pid: Option<u32>) -> io::Result<u64> {
    status_field(pid, "VmRSS:").map(|kib| kib * 1024)
}

/// Number of threads of a process (`Threads` in `/proc/<pid>/status`; `None` = this process).
pub fn thread_count(pid: Option<u32>) -> io::Result<u64> {
    status_field(pid, "Threads:")
}

fn status_field(pid: Option<u32>, key: &str) -> io::Result<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_owned(),
    };
    let status = fs::read_to_string(path)?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no {key}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_tricky_comm() {
        let line = "1234 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 100 0 0";
        let t = parse_proc_stat(line, 100).unwrap();
        assert_eq!(t.user, Duration::from_millis(2500));
        assert_eq!(t.system, Duration::from_millis(500));
        assert_eq!(parse_proc_stat("garbage", 100), None);
    }

    #[test]
    fn own_cpu_time_grows_with_work() {
        let before = CpuTimes::thread().unwrap();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = CpuTimes::thread().unwrap();
        assert!(after.total() > before.total());
        let me = CpuTimes::of_pid(std::process::id()).unwrap();
        assert!(me.total() <= CpuTimes::process().unwrap().total() + Duration::from_millis(20));
        assert!(rss_bytes(None).unwrap() > 0);
        // The test thread and the one spawned here are alive (other tests' threads come and
        // go, so only a lower bound holds).
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || rx.recv());
        assert!(thread_count(None).unwrap() >= 2);
        assert!(thread_count(Some(u32::MAX)).is_err());
        drop(tx);
        let _ = h.join();
    }

    #[test]
    fn percent() {
        let a = CpuTimes::default();
        let b = CpuTimes {
            user: Duration::from_millis(150),
            system: Duration::from_millis(50),
        };
        assert_eq!(b.percent_since(&a, Duration::from_millis(100)), 200.0);
        assert_eq!(b.percent_since(&a, Duration::ZERO), 0.0);
    }
}
