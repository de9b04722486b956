//! NUMA placement (RB² §IV-C, "NUMA-aware allocation"): rings in the memory
//! of the NIC's NUMA node, polling threads on that node's CPUs.
//!
//! RB² binds its process to the cores of the node the RNIC hangs off and
//! allocates its buffers from that node's memory, so that neither the NIC's
//! DMA nor the polling cores cross the socket interconnect. rrpc does the
//! same per ring and per polling thread:
//!
//! * [`NumaPlacement`] is the setting (ring: `rrpc_ringbuf::RingConfig`,
//!   poller: `rrpc_poller::PollerConfig`, both through
//!   `rrpc_tonic::RrpcConfig::numa_node`). The default,
//!   [`NumaPlacement::Device`], takes the node from sysfs: the verbs
//!   device's `/sys/class/infiniband/<dev>/device/numa_node`, or, for a
//!   soft-RoCE device (no `device` link), its parent netdev's
//!   `/sys/class/net/<netdev>/device/numa_node`. `-1` or no such file means
//!   no preference: nothing is bound or pinned. shm has no device, so by
//!   default nothing is placed there; [`NumaPlacement::Node`] places on
//!   either provider.
//! * Memory: [`crate::Fabric::alloc_region_on`] binds a new region to the
//!   node (`mbind(MPOL_PREFERRED)`, before the memory is first touched or
//!   registered with the NIC). Preferred, not bound: a node out of memory
//!   falls back to another instead of failing the connection.
//! * Threads: [`thread_cpus`] decides which CPUs a polling thread is
//!   pinned to (the node's, within what the process was allowed: a
//!   `taskset` or cpuset the user set is never widened); rrpc-poller applies
//!   it with `sched_setaffinity`.
//!
//! A placement that fails (no such node, a kernel without NUMA support, a
//! mask the user's affinity excludes) is logged at warn level and counted in
//! [`PLACEMENT_FAILURES`]; it never fails the ring or the poller.
//!
//! The parsing and the decisions are plain functions ([`parse_cpulist`],
//! [`parse_node`], [`thread_cpus`], [`Sysfs`] over any root directory), unit
//! tested against a fake sysfs; the system calls are in `region` (mbind)
//! and rrpc-poller (affinity).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Counter of placements that did not happen, label `what` (`memory`,
/// `threads`): a failed `mbind` or `sched_setaffinity`, or a node whose
/// CPUs could not be read.
pub const PLACEMENT_FAILURES: &str = "rrpc_numa_placement_failures_total";

/// Counts one failed placement of `what` ([`PLACEMENT_FAILURES`]).
pub fn count_failure(what: &'static str) {
    metrics::counter!(PLACEMENT_FAILURES, "what" => what).increment(1);
}

/// Where rings and polling threads are placed (RB² §IV-C).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum NumaPlacement {
    /// The NUMA node of the verbs device, read from sysfs (the default);
    /// nothing when the device reports none (`-1`, a VM, a single-node
    /// host) and on shm.
    #[default]
    Device,
    /// This node, whatever the device (shm too): overrides the device's.
    Node(u32),
    /// No placement: memory and threads stay where the kernel puts them.
    Off,
}

impl NumaPlacement {
    /// The node to place on, given the device's (`None`: no placement).
    pub fn resolve(self, device_node: Option<u32>) -> Option<u32> {
        match self {
            NumaPlacement::Device => device_node,
            NumaPlacement::Node(n) => Some(n),
            NumaPlacement::Off => None,
        }
    }
}

/// Parses a sysfs `numa_node` file: a node number, or `-1` (no node).
pub fn parse_node(text: &str) -> Option<u32> {
    text.trim().parse::<u32>().ok()
}

/// Parses a kernel CPU list (`0-3,8,10-11`, as in
/// `/sys/devices/system/node/node<N>/cpulist`) into sorted, distinct CPU
/// numbers. An empty list (a memory-only node) is empty.
///
/// # Errors
/// A message naming the bad part for anything else.
pub fn parse_cpulist(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let num = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("bad CPU {s:?} in CPU list {text:?}"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b || b - a > 1 << 16 {
                    return Err(format!("bad range {part:?} in CPU list {text:?}"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The CPUs a polling thread is pinned to: those of the node that the
/// thread was allowed anyway (`allowed`, the affinity of the thread that
/// started the poller: a `taskset` or cpuset is respected, never widened).
/// `None`: leave the thread as it is, because the node has no CPUs
/// (memory-only) or none of them is allowed.
pub fn thread_cpus(node_cpus: &[usize], allowed: &[usize]) -> Option<Vec<usize>> {
    let cpus: Vec<usize> = node_cpus
        .iter()
        .copied()
        .filter(|c| allowed.contains(c))
        .collect();
    (!cpus.is_empty()).then_some(cpus)
}

/// The sysfs lookups of placement, under a root directory (`/` on a real
/// system, a fake tree in tests).
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::at("/")
    }
}

impl Sysfs {
    /// Lookups under `root` (which holds `sys/...`).
    pub fn at(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    fn read(&self, rel: &Path) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel)).ok()
    }

    /// The NUMA node of the verbs device `dev` (`mlx5_0`, `rxe0`):
    /// `sys/class/infiniband/<dev>/device/numa_node`, or for a soft-RoCE
    /// device, which has no `device`, that of the netdev named in
    /// `sys/class/infiniband/<dev>/parent`
    /// (`sys/class/net/<netdev>/device/numa_node`); a device without the
    /// file (a virtio NIC's) takes its parent's. `None` for `-1`, no file
    /// or a name with a `/`.
    pub fn device_node(&self, dev: &str) -> Option<u32> {
        let safe = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != "..";
        if !safe(dev) {
            return None;
        }
        let ib = Path::new("sys/class/infiniband").join(dev);
        if self.root.join(&ib).join("device").exists() {
            return self.node_of(&ib.join("device"));
        }
        let parent = self.read(&ib.join("parent"))?;
        let netdev = parent.trim();
        if !safe(netdev) {
            return None;
        }
        self.node_of(&Path::new("sys/class/net").join(netdev).join("device"))
    }

    /// The `numa_node` of the device at `rel`, or, when it has none, of its
    /// parent within `sys/devices`: a virtio NIC's `device` is the virtio
    /// device, whose PCI parent holds the node.
    fn node_of(&self, rel: &Path) -> Option<u32> {
        if let Some(t) = self.read(&rel.join("numa_node")) {
            return parse_node(&t);
        }
        let top = std::fs::canonicalize(self.root.join("sys/devices")).ok()?;
        let parent = std::fs::canonicalize(self.root.join(rel)).ok()?;
        let parent = parent.parent()?;
        if !parent.starts_with(&top) || parent == top {
            return None;
        }
        parse_node(&std::fs::read_to_string(parent.join("numa_node")).ok()?)
    }

    /// The CPUs of node `node` (`sys/devices/system/node/node<N>/cpulist`).
    ///
    /// # Errors
    /// A message when the file cannot be read (no such node) or parsed.
    pub fn node_cpus(&self, node: u32) -> Result<Vec<usize>, String> {
        let rel = format!("sys/devices/system/node/node{node}/cpulist");
        let text = self
            .read(Path::new(&rel))
            .ok_or_else(|| format!("cannot read /{rel} (no NUMA node {node}?)"))?;
        parse_cpulist(&text)
    }
}

/// One mapping's line of `/proc/<pid>/numa_maps` ([`numa_maps_entry`]):
/// where its pages are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaMapsEntry {
    /// The mapping's memory policy as the kernel prints it (`default`,
    /// `prefer:1`, `bind:0-1`).
    pub policy: String,
    /// Resident pages per node (`N<node>=<pages>`); empty while nothing is
    /// touched.
    pub pages: std::collections::BTreeMap<u32, u64>,
}

/// The entry of the mapping that starts at `addr` in the text of a
/// `/proc/<pid>/numa_maps` (for checks of where a region's pages are:
/// [`crate::Region::as_ptr`] is the start of its mapping). `None` if no
/// line starts there.
pub fn numa_maps_entry(numa_maps: &str, addr: usize) -> Option<NumaMapsEntry> {
    let want = format!("{addr:x}");
    numa_maps.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next()? != want {
            return None;
        }
        let policy = words.next()?.to_owned();
        let pages = words
            .filter_map(|w| {
                let (k, v) = w.strip_prefix('N')?.split_once('=')?;
                Some((k.parse().ok()?, v.parse().ok()?))
            })
            .collect();
        Some(NumaMapsEntry { policy, pages })
    })
}

/// [`Sysfs::device_node`] on the real sysfs, read once per device name.
pub(crate) fn cached_device_node(dev: &str) -> Option<u32> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<u32>>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    *cache
        .entry(dev.to_owned())
        .or_insert_with(|| Sysfs::default().device_node(dev))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fabric;

    #[test]
    fn cpulists_parse() {
        assert_eq!(parse_cpulist("0-3,8\n").unwrap(), vec![0, 1, 2, 3, 8]);
        assert_eq!(parse_cpulist("1").unwrap(), vec![1]);
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpulist("10-11,2,2-3").unwrap(), vec![2, 3, 10, 11]);
        assert!(parse_cpulist("3-1").is_err());
        assert!(parse_cpulist("a").is_err());
        assert!(parse_cpulist("0-").is_err());
        assert!(parse_cpulist("0-999999999").is_err());
    }

    #[test]
    fn nodes_parse() {
        assert_eq!(parse_node("1\n"), Some(1));
        assert_eq!(parse_node("-1\n"), None);
        assert_eq!(parse_node(""), None);
    }

    #[test]
    fn placement_resolves() {
        assert_eq!(NumaPlacement::default(), NumaPlacement::Device);
        assert_eq!(NumaPlacement::Device.resolve(Some(1)), Some(1));
        assert_eq!(NumaPlacement::Device.resolve(None), None);
        assert_eq!(NumaPlacement::Node(0).resolve(Some(1)), Some(0));
        assert_eq!(NumaPlacement::Node(3).resolve(None), Some(3));
        assert_eq!(NumaPlacement::Off.resolve(Some(1)), None);
    }

    #[test]
    fn threads_stay_within_what_they_were_allowed() {
        assert_eq!(thread_cpus(&[2, 3], &[0, 1, 2, 3]), Some(vec![2, 3]));
        // taskset -c 1-2: the node's CPUs the user allowed.
        assert_eq!(thread_cpus(&[2, 3], &[1, 2]), Some(vec![2]));
        // The user's mask excludes the node: leave it alone.
        assert_eq!(thread_cpus(&[2, 3], &[0, 1]), None);
        // A memory-only node.
        assert_eq!(thread_cpus(&[], &[0, 1]), None);
    }

    /// A fake sysfs tree in a fresh temporary directory.
    struct FakeSys(PathBuf);

    impl FakeSys {
        fn new() -> FakeSys {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("rrpc-numa-sysfs-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            FakeSys(dir)
        }
        fn file(&self, rel: &str, text: &str) -> &Self {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
            self
        }
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn device_node_from_the_device_or_the_parent_netdev() {
        let fake = FakeSys::new();
        fake.file("sys/class/infiniband/mlx5_0/device/numa_node", "1\n")
            .file("sys/class/infiniband/mlx5_1/device/numa_node", "-1\n")
            // soft-RoCE: no `device`, a parent netdev that has one.
            .file("sys/class/infiniband/rxe0/parent", "eth1\n")
            .file("sys/class/net/eth1/device/numa_node", "0\n")
            // soft-RoCE on a virtual netdev (veth): no node anywhere.
            .file("sys/class/infiniband/rxe1/parent", "veth0\n")
            // a parent that tries to leave the tree
            .file("sys/class/infiniband/rxe2/parent", "../../x\n")
            .file("sys/class/x/device/numa_node", "1\n")
            // a virtio NIC: the node is on the virtio device's PCI parent
            .file("sys/devices/pci0000:80/0000:80:00.0/numa_node", "1\n")
            .file("sys/devices/pci0000:80/0000:80:00.0/virtio1/uevent", "")
            .file("sys/devices/virtio9/uevent", "")
            .file("sys/class/infiniband/rxe3/parent", "eth2\n")
            .file("sys/class/infiniband/rxe4/parent", "eth3\n");
        for (target, at) in [
            (
                "sys/devices/pci0000:80/0000:80:00.0/virtio1",
                "sys/class/net/eth2/device",
            ),
            // no node on it nor its parent (`sys/devices` itself)
            ("sys/devices/virtio9", "sys/class/net/eth3/device"),
        ] {
            std::fs::create_dir_all(fake.0.join(at).parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(fake.0.join(target), fake.0.join(at)).unwrap();
        }
        let sys = Sysfs::at(&fake.0);
        assert_eq!(sys.device_node("rxe3"), Some(1), "virtio: its PCI parent's");
        assert_eq!(sys.device_node("rxe4"), None);
        assert_eq!(sys.device_node("mlx5_0"), Some(1));
        assert_eq!(sys.device_node("mlx5_1"), None, "-1 is no preference");
        assert_eq!(sys.device_node("rxe0"), Some(0));
        assert_eq!(sys.device_node("rxe1"), None);
        assert_eq!(sys.device_node("rxe2"), None);
        assert_eq!(sys.device_node("nosuch"), None);
        assert_eq!(sys.device_node("../mlx5_0"), None);
    }

    #[test]
    fn node_cpus_from_sysfs() {
        let fake = FakeSys::new();
        fake.file("sys/devices/system/node/node0/cpulist", "0-1,4\n")
            .file("sys/devices/system/node/node1/cpulist", "\n");
        let sys = Sysfs::at(&fake.0);
        assert_eq!(sys.node_cpus(0).unwrap(), vec![0, 1, 4]);
        assert_eq!(sys.node_cpus(1).unwrap(), Vec::<usize>::new());
        let e = sys.node_cpus(2).unwrap_err();
        assert!(e.contains("node2") && e.contains("no NUMA node 2"), "{e}");
    }

    #[test]
    fn numa_maps_lines_parse() {
        let text = "7f00 default anon=1 dirty=1 N0=1 kernelpagesize_kB=4\n\
                    7f1000 prefer:1 file=/memfd:rrpc-region\\040(deleted) dirty=3 N1=2 N0=1 kernelpagesize_kB=4\n\
                    7f2000 bind:0-1 file=/memfd:x\n";
        let e = numa_maps_entry(text, 0x7f1000).unwrap();
        assert_eq!(e.policy, "prefer:1");
        assert_eq!(
            e.pages.into_iter().collect::<Vec<_>>(),
            vec![(0, 1), (1, 2)]
        );
        let e = numa_maps_entry(text, 0x7f2000).unwrap();
        assert_eq!((e.policy.as_str(), e.pages.len()), ("bind:0-1", 0));
        assert_eq!(numa_maps_entry(text, 0x7f), None);
    }

    #[test]
    fn shm_has_no_device_node() {
        assert_eq!(Fabric::shm().numa_node(), None);
    }
}
