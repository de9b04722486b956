//! Thread pinning and the thread plan every output states.

use std::fmt::Write as _;
use std::io;

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// CPUs the process could use when first asked (cached, so it does not shrink once the calling
/// thread pins itself). Plans and the machine header use this.
pub fn process_cpus() -> Vec<usize> {
    static CPUS: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    CPUS.get_or_init(allowed_cpus).clone()
}

/// CPUs the calling thread may run on now (`sched_getaffinity`); `[0]` if the call fails.
pub fn allowed_cpus() -> Vec<usize> {
    let Ok(set) = sched_getaffinity(Pid::from_raw(0)) else {
        return vec![0];
    };
    (0..CpuSet::count())
        .filter(|&i| set.is_set(i).unwrap_or(false))
        .collect()
}

/// Pins the calling thread to one CPU.
///
/// # Errors
/// `sched_setaffinity`'s error (e.g. `EINVAL` for a CPU outside the allowed set).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &set)?;
    Ok(())
}

/// Which threads each side of a benchmark runs and where they are pinned.
///
/// Every table notes its plan ([`ThreadPlan::describe`]) so a reader sees how many busy threads
/// shared how many cores; [`ThreadPlan::oversubscribed`] flags plans with more busy threads than
/// usable CPUs (which on a 2-core machine turns spin-polling into time-slicing).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadPlan {
    sides: Vec<Side>,
}

#[derive(Debug, Clone, PartialEq)]
struct Side {
    name: String,
    threads: usize,
    pinned: Option<Vec<usize>>,
}

impl ThreadPlan {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a side (`"server"`, `"client"`, `"memcpy"`...) running `threads` busy threads,
    /// pinned to `pinned` CPUs (or free to migrate with `None`).
    pub fn side(mut self, name: &str, threads: usize, pinned: Option<Vec<usize>>) -> Self {
        self.sides.push(Side {
            name: name.to_owned(),
            threads,
            pinned,
        });
        self
    }

    /// Total busy threads.
    pub fn threads(&self) -> usize {
        self.sides.iter().map(|s| s.threads).sum()
    }

    /// Whether the plan runs more busy threads than this process may use CPUs.
    pub fn oversubscribed(&self) -> bool {
        self.threads() > process_cpus().len()
    }

    /// For CPU `i` of the plan, the `i`-th allowed CPU modulo the allowed count (so a plan
    /// written for "cpu 0 and cpu 1" works inside any affinity mask).
    pub fn cpu(i: usize) -> usize {
        let cpus = process_cpus();
        cpus[i % cpus.len()]
    }

    /// One line: `server: 1 thread pinned to cpu 0; client: 2 threads unpinned; 3 busy threads
    /// on 2 cpus (OVERSUBSCRIBED)`.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for s in &self.sides {
            let _ = write!(
                out,
                "{}: {} thread{} ",
                s.name,
                s.threads,
                if s.threads == 1 { "" } else { "s" }
            );
            match &s.pinned {
                Some(cpus) => {
                    let list: Vec<String> = cpus.iter().map(ToString::to_string).collect();
                    let _ = write!(out, "pinned to cpu {}; ", list.join(","));
                }
                None => out.push_str("unpinned; "),
            }
        }
        let cpus = process_cpus().len();
        let _ = write!(out, "{} busy threads on {} cpus", self.threads(), cpus);
        if self.oversubscribed() {
            out.push_str(" (OVERSUBSCRIBED: threads time-share cores)");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_to_an_allowed_cpu_and_rejects_nonsense() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let before = cpus.clone();
        std::thread::spawn(move || {
            pin_current_thread(before[0]).unwrap();
            assert_eq!(allowed_cpus(), vec![before[0]]);
        })
        .join()
        .unwrap();
        assert!(pin_current_thread(usize::MAX).is_err());
    }

    #[test]
    fn plan_describes_and_flags_oversubscription() {
        let n = process_cpus().len();
        let ok = ThreadPlan::new().side("server", 1, Some(vec![0]));
        assert_eq!(
            ok.describe(),
            format!("server: 1 thread pinned to cpu 0; 1 busy threads on {n} cpus")
        );
        assert!(!ok.oversubscribed());
        let over = ThreadPlan::new().side("client", n + 1, None);
        assert!(over.oversubscribed());
        assert!(over.describe().contains("OVERSUBSCRIBED"));
    }
}
