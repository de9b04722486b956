//! NUMA placement of the polling threads (RB² §IV-C: "the process is bound
//! to the CPU cores of the NUMA node to which the RNIC belongs";
//! [`rrpc_core::numa`]).
//!
//! Which CPUs is [`rrpc_core::numa::thread_cpus`]'s decision: the node's
//! CPUs within the affinity of the thread that started the poller (a
//! `taskset` or cpuset the user set is narrowed, never widened; a node
//! outside it leaves the threads alone). A node comes from the setting
//! ([`NumaPlacement::Node`]) when the poller starts, or, with
//! [`NumaPlacement::Device`], from the first device a connection reports
//! ([`crate::Poller::place_for_device`]); then every polling thread, running
//! or started later, is pinned. A pinning that fails is a warning and a
//! count, never an error.

use std::sync::Mutex;

use rrpc_core::numa::{self, NumaPlacement, Sysfs};

use crate::sys;

/// The placement of one poller's threads.
#[derive(Debug)]
pub(super) struct Placement {
    setting: NumaPlacement,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The node in force (`None`: no placement).
    node: Option<u32>,
    /// What the threads are pinned to (`None`: left as they are).
    cpus: Option<Vec<usize>>,
    /// The CPUs the starting thread was allowed (`None`: unknown, pin nothing).
    allowed: Option<Vec<usize>>,
    /// Kernel ids of the running polling threads.
    threads: Vec<i32>,
}

impl Placement {
    /// Reads the starting thread's affinity and, for a fixed node, the
    /// node's CPUs.
    pub(super) fn new(setting: NumaPlacement) -> Placement {
        let allowed = match setting {
            NumaPlacement::Off => None,
            _ => sys::affinity(0)
                .map_err(|e| tracing::debug!(error = %e, "sched_getaffinity"))
                .ok(),
        };
        let mut state = State {
            node: None,
            cpus: None,
            allowed,
            threads: Vec::new(),
        };
        if let NumaPlacement::Node(n) = setting {
            state.set_node(n);
        }
        Placement {
            setting,
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by each polling thread when it starts: recorded, and pinned
    /// if a node is in force.
    pub(super) fn enter(&self) {
        let tid = sys::thread_id();
        let mut s = self.lock();
        s.threads.push(tid);
        if let Some(cpus) = &s.cpus {
            pin(tid, cpus, s.node);
        }
    }

    /// Called by each polling thread when it ends.
    pub(super) fn leave(&self) {
        let tid = sys::thread_id();
        self.lock().threads.retain(|&t| t != tid);
    }

    /// [`NumaPlacement::Device`]: places the threads on `device_node`, if
    /// there is one and no device placed them yet. Returns the node in force.
    pub(super) fn for_device(&self, device_node: Option<u32>) -> Option<u32> {
        let mut s = self.lock();
        if let (NumaPlacement::Device, Some(n), None) = (self.setting, device_node, s.node) {
            s.set_node(n);
            if let Some(cpus) = s.cpus.clone() {
                for &tid in &s.threads {
                    pin(tid, &cpus, s.node);
                }
            }
        }
        s.node
    }

    /// The node in force.
    pub(super) fn node(&self) -> Option<u32> {
        self.lock().node
    }
}

impl State {
    fn set_node(&mut self, node: u32) {
        self.node = Some(node);
        let Some(allowed) = &self.allowed else {
            return;
        };
        let node_cpus = match Sysfs::default().node_cpus(node) {
            Ok(c) => c,
            Err(e) => {
                numa::count_failure("threads");
                tracing::warn!(node, error = %e, "rrpc: polling threads not pinned: cannot read the CPUs of their NUMA node");
                return;
            }
        };
        self.cpus = numa::thread_cpus(&node_cpus, allowed);
        if self.cpus.is_none() {
            numa::count_failure("threads");
            tracing::warn!(
                node,
                ?node_cpus,
                ?allowed,
                "rrpc: polling threads not pinned: the NUMA node has no CPU this process may run on"
            );
        } else {
            tracing::debug!(node, cpus = ?self.cpus, "polling threads pinned to their NUMA node");
        }
    }
}

fn pin(tid: i32, cpus: &[usize], node: Option<u32>) {
    if let Err(e) = sys::set_affinity(tid, cpus) {
        numa::count_failure("threads");
        tracing::warn!(?node, ?cpus, tid, error = %e, "rrpc: cannot pin a polling thread to its NUMA node");
    }
}
