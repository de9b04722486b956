//! NUMA placement (RB² §IV-C): ring memory on the chosen node and polling
//! threads on its CPUs, checked from `/proc/self/numa_maps` and each
//! thread's `Cpus_allowed_list`.
//!
//! `numa_vm_*` need a machine with two NUMA nodes that have CPUs and memory:
//! they are `#[ignore]`d, and run explicitly they fail (never pass) unless
//! `RRPC_TEST_NUMA_NODE` names a node of this machine. The soft-RoCE VM
//! with two emulated nodes runs them (`docs/testing.md`, "NUMA placement"):
//!
//! ```sh
//! cargo test -p rrpc-poller --features verbs --test numa --no-run   # prints the binary
//! RRPC_RXE_NUMA=2 cargo xtask rxe -- env RRPC_TEST_NUMA_NODE=1 target/debug/deps/numa-<hash> --ignored --test-threads 1
//! ```
//!
//! `placement_on_this_host` runs everywhere (node 0 exists on every Linux
//! with NUMA support), without proving much on a one-node machine.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rrpc_core::numa::{self, NumaPlacement, Sysfs};
use rrpc_core::{Fabric, Region};
use rrpc_poller::PollerConfig;
use rrpc_ringbuf::{LocalRing, RingConfig};

/// The node the NUMA VM tests place on, from `RRPC_TEST_NUMA_NODE`; panics
/// (a failure, not a pass) when it is not set or this machine lacks it.
fn target_node() -> u32 {
    let Ok(v) = std::env::var("RRPC_TEST_NUMA_NODE") else {
        panic!(
            "NOT RUN: this test needs a machine with two NUMA nodes; set RRPC_TEST_NUMA_NODE \
             (the NUMA VM: RRPC_RXE_NUMA=2 cargo xtask rxe -- env RRPC_TEST_NUMA_NODE=1 <this binary> --ignored)"
        )
    };
    let node: u32 = v.parse().expect("RRPC_TEST_NUMA_NODE is a node number");
    let dir = format!("/sys/devices/system/node/node{node}");
    assert!(
        Path::new(&dir).exists(),
        "NOT RUN: this machine has no NUMA node {node} ({dir} is missing)"
    );
    node
}

/// A node other than `node` that has CPUs: where first-touch would put the
/// pages of a thread running there.
fn other_node(node: u32) -> (u32, Vec<usize>) {
    (0..64)
        .filter(|&n| n != node)
        .find_map(|n| {
            let cpus = Sysfs::default().node_cpus(n).ok()?;
            (!cpus.is_empty()).then_some((n, cpus))
        })
        .expect("a second NUMA node with CPUs")
}

/// The CPUs the calling thread may run on.
fn my_cpus() -> Vec<usize> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

fn pin_current_thread(cpus: &[usize]) {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c).unwrap();
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}

/// Touches every page of `regions` from a thread pinned to `cpus`, so that
/// without a binding they would land on that thread's node (first touch).
fn touch_from(cpus: Vec<usize>, regions: Vec<Arc<Region>>) {
    std::thread::spawn(move || {
        pin_current_thread(&cpus);
        for r in &regions {
            for page in (0..r.len()).step_by(4096) {
                r.write_at(page, &[0xa5]).unwrap();
            }
        }
    })
    .join()
    .unwrap();
}

/// The policy and the pages per node of `region`, from numa_maps.
fn placement_of(region: &Region) -> numa::NumaMapsEntry {
    let maps = std::fs::read_to_string("/proc/self/numa_maps").expect("numa_maps");
    numa::numa_maps_entry(&maps, region.as_ptr() as usize)
        .unwrap_or_else(|| panic!("no numa_maps line at {:p}", region.as_ptr()))
}

/// Asserts that every touched page of `region` is on `node`.
fn assert_on_node(what: &str, region: &Region, node: u32) {
    let e = placement_of(region);
    let pages = region
        .len()
        .div_ceil(if region.is_huge() { 2 << 20 } else { 4096 }) as u64;
    println!(
        "{what}: {} bytes, policy {}, pages per node {:?}",
        region.len(),
        e.policy,
        e.pages
    );
    assert_eq!(e.policy, format!("prefer:{node}"), "{what}: {e:?}");
    assert_eq!(
        e.pages.iter().map(|(n, p)| (*n, *p)).collect::<Vec<_>>(),
        vec![(node, pages)],
        "{what}: every page on node {node}"
    );
}

/// CPUs allowed to each live thread whose name starts with `prefix`
/// (`/proc/self/task/*/status`).
fn threads_cpus(prefix: &str) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list");
        out.push((
            comm.trim().to_owned(),
            numa::parse_cpulist(list).expect("a cpulist"),
        ));
    }
    out
}

/// Waits until `n` threads named `prefix*` run and all of them have `cpus`.
fn wait_threads_on(prefix: &str, n: usize, cpus: &[usize]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = threads_cpus(prefix);
        if seen.len() == n && seen.iter().all(|(_, c)| c == cpus) {
            println!("polling threads {seen:?}: on CPUs {cpus:?}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "polling threads {prefix}*: want {n} on CPUs {cpus:?}, saw {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ring_config(placement: NumaPlacement) -> RingConfig {
    RingConfig::builder()
        .ring_size(1 << 20)
        .huge_pages(false)
        .numa_node(placement)
        .build()
        .unwrap()
}

/// The override on shm (no device): both ring regions are bound to the
/// node, and their pages are there although a thread of the other node
/// touched them; a ring without placement, touched the same way, lands on
/// the other node (the check can fail).
#[test]
#[ignore = "needs two NUMA nodes: the NUMA VM (RRPC_RXE_NUMA=2 cargo xtask rxe), see the file's docs"]
fn numa_vm_ring_memory_on_the_chosen_node() {
    let node = target_node();
    let (other, other_cpus) = other_node(node);
    let fabric = Fabric::shm();
    let ring = LocalRing::new(&fabric, &ring_config(NumaPlacement::Node(node))).unwrap();
    assert_eq!(ring.numa_node(), Some(node));
    let (rx, tx) = ring.regions();
    let control = LocalRing::new(&fabric, &ring_config(NumaPlacement::Off)).unwrap();
    assert_eq!(control.numa_node(), None);
    touch_from(
        other_cpus,
        vec![rx.clone(), tx.clone(), control.regions().0.clone()],
    );
    assert_on_node("receive region (RB_R)", rx, node);
    assert_on_node("staging region (RB_S)", tx, node);
    let c = placement_of(control.regions().0);
    println!(
        "control (NumaPlacement::Off): policy {}, pages {:?}",
        c.policy, c.pages
    );
    assert_eq!(c.policy, "default");
    assert_eq!(
        c.pages.keys().copied().collect::<Vec<_>>(),
        vec![other],
        "without a binding, first touch puts the pages on the toucher's node"
    );
}

/// Polling threads: pinned to the node's CPUs from the start with
/// `NumaPlacement::Node`, and re-pinned when a device reports its node with
/// the default `NumaPlacement::Device`; `Off` leaves them alone.
#[test]
#[ignore = "needs two NUMA nodes: the NUMA VM (RRPC_RXE_NUMA=2 cargo xtask rxe), see the file's docs"]
fn numa_vm_polling_threads_on_the_chosen_node() {
    let node = target_node();
    let cpus = Sysfs::default().node_cpus(node).unwrap();
    let all = my_cpus();
    assert_ne!(cpus, all, "node {node} must not hold every CPU");

    let fixed = rrpc_poller::Poller::start(
        PollerConfig::builder()
            .numa_node(NumaPlacement::Node(node))
            .polling_threads(2)
            .thread_name("numa-fixed")
            .build()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(fixed.numa_node(), Some(node));
    wait_threads_on("numa-fixed", 2, &cpus);

    let by_device = rrpc_poller::Poller::start(
        PollerConfig::builder()
            .polling_threads(2)
            .thread_name("numa-dev")
            .build()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(by_device.numa_node(), None, "no device yet");
    wait_threads_on("numa-dev", 2, &all);
    assert_eq!(by_device.place_for_device(None), None, "shm: nothing");
    assert_eq!(by_device.place_for_device(Some(node)), Some(node));
    wait_threads_on("numa-dev", 2, &cpus);

    let off = rrpc_poller::Poller::start(
        PollerConfig::builder()
            .numa_node(NumaPlacement::Off)
            .polling_threads(1)
            .thread_name("numa-off")
            .build()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(off.place_for_device(Some(node)), None);
    wait_threads_on("numa-off", 1, &all);
    for p in [fixed, by_device, off] {
        p.shutdown();
    }
}

/// The default placement on verbs: the device's node from sysfs. The VM's
/// NIC sits under a PCI expander bridge on node 1 and `rxe1` runs on it
/// (`RRPC_TEST_NUMA_DEVICE=rxe1`); its rings follow without any setting.
#[cfg(feature = "verbs")]
#[test]
#[ignore = "needs the NUMA VM with its NIC on a node (RRPC_TEST_NUMA_DEVICE), see the file's docs"]
fn numa_vm_device_node_is_the_default() {
    let node = target_node();
    let dev = std::env::var("RRPC_TEST_NUMA_DEVICE")
        .expect("NOT RUN: set RRPC_TEST_NUMA_DEVICE to a verbs device on node RRPC_TEST_NUMA_NODE");
    let fabric = Fabric::verbs(Some(&dev)).unwrap();
    assert_eq!(fabric.numa_node(), Some(node), "{dev}'s node from sysfs");
    let ring = LocalRing::new(&fabric, &ring_config(NumaPlacement::Device)).unwrap();
    assert_eq!(ring.numa_node(), Some(node));
    // Registered (pinned) at allocation: the pages are already placed.
    let (rx, tx) = ring.regions();
    assert_on_node("receive region on verbs", rx, node);
    assert_on_node("staging region on verbs", tx, node);
}

/// Runs on any Linux with NUMA support: node 0's placement takes effect,
/// within the CPUs this process may use.
#[test]
fn placement_on_this_host() {
    let cpus0 = Sysfs::default().node_cpus(0).unwrap();
    let ring = LocalRing::new(&Fabric::shm(), &ring_config(NumaPlacement::Node(0))).unwrap();
    let (rx, _) = ring.regions();
    rx.write_at(0, &[1]).unwrap();
    assert_eq!(placement_of(rx).policy, "prefer:0");
    let p = rrpc_poller::Poller::start(
        PollerConfig::builder()
            .numa_node(NumaPlacement::Node(0))
            .polling_threads(1)
            .thread_name("numa-here")
            .build()
            .unwrap(),
    )
    .unwrap();
    let allowed = my_cpus();
    let want = numa::thread_cpus(&cpus0, &allowed).unwrap();
    wait_threads_on("numa-here", 1, &want);
    // The first device's node stays; a fixed node ignores devices.
    assert_eq!(p.place_for_device(Some(7)), Some(0));
    p.shutdown();
}
