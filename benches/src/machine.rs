//! The machine header every report carries.

use std::fs;
use std::process::Command;

use serde::{Deserialize, Serialize};

/// What machine the numbers come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Machine {
    /// `model name` from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// CPUs this process may run on (`sched_getaffinity`), which is what the suites can use.
    pub cores: usize,
    /// `MemTotal` from `/proc/meminfo`, in MiB.
    pub mem_mib: u64,
    /// `uname -sr`-like kernel string from `/proc/sys/kernel/{ostype,osrelease}`.
    pub kernel: String,
    /// Hostname.
    pub host: String,
    /// `git rev-parse --short HEAD` (+ `-dirty` if the work tree has changes), or `unknown`.
    pub git_rev: String,
    /// Fabric provider used (`shm`, `verbs`, or `-` for suites without one); set by the suite.
    pub provider: String,
    /// Thread pinning description; set by the suite (see [`crate::ThreadPlan`]).
    pub pinning: String,
}

impl Machine {
    /// Reads everything but `provider` and `pinning` from `/proc` and git.
    pub fn collect() -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let read = |p: &str| {
            fs::read_to_string(p)
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        let kernel = format!(
            "{} {}",
            read("/proc/sys/kernel/ostype"),
            read("/proc/sys/kernel/osrelease")
        );
        Machine {
            cpu_model,
            cores: crate::pin::process_cpus().len(),
            mem_mib: mem_kib / 1024,
            kernel,
            host: read("/proc/sys/kernel/hostname"),
            git_rev: git_rev(),
            provider: "-".to_owned(),
            pinning: "none".to_owned(),
        }
    }

    /// One Markdown paragraph.
    pub fn markdown(&self) -> String {
        format!(
            "**Machine:** {} ({} cores usable), {} MiB RAM, {}, host `{}`, git `{}`, provider `{}`, pinning: {}",
            self.cpu_model,
            self.cores,
            self.mem_mib,
            self.kernel,
            self.host,
            self.git_rev,
            self.provider,
            self.pinning
        )
    }
}

fn git_rev() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match out(&["rev-parse", "--short", "HEAD"]) {
        Some(rev) => {
            let dirty = out(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{rev}-dirty") } else { rev }
        }
        None => "unknown".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_something_real() {
        let m = Machine::collect();
        assert!(m.cores >= 1);
        assert!(m.mem_mib > 0);
        assert!(m.kernel.starts_with("Linux"), "{}", m.kernel);
        assert!(m.markdown().contains(&m.cpu_model));
    }
}
