//! `cargo xtask rxe --hosts 2 [wire options] [-- CMD_A CMD_B]`: two throwaway
//! soft-RoCE VMs, hosts A (10.99.1.1) and B (10.99.1.2), joined by a virtual
//! Ethernet wire, each with `rxe0` on its own `eth0`. The RDMA traffic
//! between them crosses the wire: ARP, two GID tables, two MTUs, RC
//! retransmission, a peer host that can vanish, none of which one device
//! talking to itself (`cargo xtask rxe`) exercises.
//!
//! - **The wire** is qemu's `socket` netdev in UDP mode on 127.0.0.1 (its TCP
//!   mode stalls every multi-frame exchange by about 40 ms). GID index 1 on
//!   each host is the IPv4-mapped RoCE v2 GID, which rrpc picks by default.
//! - **Faults on the wire** (`--netem`, `--netem-a`, `--netem-b`): a
//!   `tc qdisc … netem` spec applied to `eth0` on both hosts or on one, e.g.
//!   `"loss 2% delay 1ms 1ms reorder 10% 50%"`, `"duplicate 1%"`,
//!   `"corrupt 0.1%"`; `--mtu-a` / `--mtu-b` give the hosts different MTUs.
//! - **Inside** each VM, as root, the command runs in the workspace with
//!   `RRPC_TEST_DEVICE=rxe0`, `RRPC_RXE_HOST` (`A`/`B`), `RRPC_RXE_SELF`,
//!   `RRPC_RXE_PEER` (addresses) and `RRPC_RXE_WIRE`, a directory both hosts
//!   see (under the workspace's `target/rxe/`) for the two sides to signal
//!   each other through files.
//! - **Exit code**: A's if it failed, else B's; 124 when the time bound
//!   (`--timeout`) killed the VMs; each host's output is streamed with an
//!   `A| ` / `B| ` prefix and a failed host's console tail is printed.
//!
//! With no command it runs **the cross-host suite** ([`suite_scripts`]): servers
//! on A, clients on B, every client asserting that verbs carried its traffic
//! (`carried by Verbs { device: "rxe0", peer: Some(10.99.1.1) }`, read
//! from the live queue pair), on a clean wire and again under
//! the faults given (`--netem` etc.).
//!
//! Besides the examples and the soak, the suite checks token and TLS on the
//! side channel (and that a wrong token and a client without TLS are
//! refused), TLS on one `rrpc://` port (the integration suite's
//! `tls::cross_host` server on A, client on B: B lands on verbs to A on
//! both call paths, A's handler sees B's certificate, plaintext and
//! certificate-less clients are refused), and rrpc-kv (its gRPC face, and RF-RPC with remote fetching,
//! the hybrid switch and batching). On the clean wire it ends with two
//! faults of its own: **partition and heal** (B loses every frame for 4 s,
//! then for [`PARTITION_SECS`], under a stream of checked calls: each call
//! returns its bytes or fails `Unavailable` or at its deadline, and the
//! channel reconnects after the heal) and **a dead server host** (A powers
//! off with `sysrq o` while a call from B waits on it: no FIN, no RST; the
//! call must fail `Unavailable` within [`DEAD_HOST_BOUND_SECS`], and the
//! time it took is printed). The faulty pass also gives A an MTU of 9000
//! against B's 1500, and ends with **a dead client host** (B powers off; A's
//! server must be back to its descriptor count within the same bound).
//!
//! Shared queue pairs run in a soak of their own; the connection pool (on by
//! default on `rdma://`) and self-sizing rings (the default) are in every
//! soak, though nothing yet shows the pool's hits across hosts.
//!
//! **The cluster-mode bench over ssh** ([`cluster_bench_step`]; clean wire,
//! full suite only: it costs 100-160 s of VM time, so it is not in
//! `--clean-only`, the subset `cargo xtask ci` runs): both hosts start a
//! throwaway sshd on their wire address (root by key only; host keys and
//! B's client key generated in each VM's tmpfs, the public halves passed
//! through the wire directory), and B runs `xtask bench rpc --quick
//! --hosts … --launcher ssh` with a generated hosts file
//! ([`cluster_hosts_toml`]): the server on A, 2 clients on B, rrpc over
//! `rdma://` on `rxe0`, each started through ssh. The `xtask` and `rpc`
//! binaries are the host's builds ([`ClusterStage`]; no cargo runs in a
//! VM). It checks the exit code, the result files, A's `READY rdma://`,
//! that calls completed, and the carrier B's clients read from their live
//! queue pairs (`Verbs { device: "rxe0", peer: Some(10.99.1.1) }`).
//! Functional only: the table's rates and latencies stay in the VM.
//!
//! NUMA placement is tested on one host, not here: `cargo xtask rxe
//! --numa` (CI's `rxe NUMA` step) boots one VM with two emulated nodes and
//! its NIC on node 1 ([`crate::rxe::suite::run_numa`]); these two VMs
//! have one node each.
//!
//! Functional checks only: soft-RoCE under TCG runs 20-50x slower than a
//! NIC. Tested on soft-RoCE (rdma_rxe) in VMs; not run on an RDMA NIC.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::rxe::suite::SuiteBins;
use crate::rxe::{RxeArgs, VmSpec, run_vms, sh_quote};

/// The two hosts: label, address, MAC.
const HOSTS: [(&str, &str, &str); 2] = [
    ("A", "10.99.1.1", "52:54:00:99:01:01"),
    ("B", "10.99.1.2", "52:54:00:99:01:02"),
];

/// The `setup` function of a host's job script: `rxe0` on the wire's
/// `eth0`, the wire's faults, and a wait until the peer answers.
fn wire_setup(me: &str, peer: &str, mtu: Option<u32>, netem: Option<&str>) -> String {
    let hex = |ip: &str| {
        let o: Vec<u8> = ip.split('.').filter_map(|p| p.parse().ok()).collect();
        format!("{:02x}{:02x}:{:02x}{:02x}", o[0], o[1], o[2], o[3])
    };
    let mtu = mtu.map_or(String::new(), |m| format!("  ip link set eth0 mtu {m}\n"));
    let netem = netem.map_or(String::new(), |n| {
        format!(
            "  tc qdisc add dev eth0 root netem {n}\n  echo \"rrpc-rxe: netem on eth0: $(tc qdisc show dev eth0)\"\n"
        )
    });
    format!(
        r#"setup() {{
  set -e
  for m in crc32_generic ib_uverbs rdma_rxe virtio_net sch_netem; do /tmp/modprobe "$m" || [ "$m" = crc32_generic ] || [ "$m" = sch_netem ]; done
  ip link set lo up
  dev=$(ls /sys/class/net | grep -v '^lo$' | head -n1)
  [ -n "$dev" ] || {{ echo "no network card"; exit 1; }}
  [ "$dev" = eth0 ] || ip link set "$dev" name eth0
  ip addr add {me}/24 dev eth0
{mtu}  ip link set eth0 up
  rdma link add rxe0 type rxe netdev eth0
  for _ in $(seq 100); do
    g=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null || true)
    case "$g" in *{gid}) break ;; esac
    sleep 0.1
  done
{netem}  # The peer boots at the same time: wait (60 s at most) until it answers.
  for _ in $(seq 120); do busybox ping -c 1 -W 1 {peer} >/dev/null 2>&1 && break; sleep 0.5; done
  busybox ping -c 1 -W 2 {peer} >/dev/null || {{ echo "the peer {peer} does not answer"; exit 1; }}
  echo "rrpc-rxe: rxe0 on eth0 {me} (MTU $(cat /sys/class/net/eth0/mtu)), port $(cat /sys/class/infiniband/rxe0/ports/1/state), GID[1] $(cat /sys/class/infiniband/rxe0/ports/1/gids/1); peer {peer} answers"
}}"#,
        gid = hex(me),
    )
}

/// Runs `scripts` (A's, B's) on the two hosts; returns the exit code.
///
/// A pair whose VMs did not both get through their setup (`rxe0` on the
/// wire and the peer's ping; a VM failure, none of rrpc's code ran in it:
/// a TCG guest's kernel that hung at boot, a wire that never came up) is
/// booted once more with fresh VMs, and says so. A second such failure,
/// and every failure after setup, fails the run.
pub(crate) fn run_pair(
    root: &Path,
    target: &Path,
    args: &RxeArgs,
    scripts: [String; 2],
) -> Result<i32> {
    let mut runs = pair_runs(root, target, args, scripts.clone())?;
    if let Some(i) = runs.iter().position(|r| r.code != 0 && !r.set_up) {
        eprintln!(
            "rxe --hosts 2: host {} did not get through its setup (exit {}; a VM failure, before any of rrpc's code ran): booting both hosts once more",
            HOSTS[i].0, runs[i].code
        );
        runs = pair_runs(root, target, args, scripts)?;
    }
    let (a, b) = (runs[0].code, runs[1].code);
    eprintln!("rxe --hosts 2: A exited {a}, B exited {b}");
    for (label, run) in HOSTS.iter().map(|h| h.0).zip(&runs) {
        for line in run
            .output
            .lines()
            .filter(|l| crate::util::is_failure_line(l))
        {
            crate::util::note_failure(format!("cross-host {label}: {line}"));
        }
        if run.code != 0 {
            crate::util::note_failure(format!("cross-host {label}: exited {}", run.code));
        }
    }
    Ok(if a != 0 { a } else { b })
}

/// One boot of the pair: a fresh wire directory and ports, both VMs.
fn pair_runs(
    root: &Path,
    target: &Path,
    args: &RxeArgs,
    scripts: [String; 2],
) -> Result<Vec<crate::rxe::VmRun>> {
    // The wire directory must be writable in the VMs: under the workspace
    // (shared read-write; the rest of the host is read-only there). A
    // target directory elsewhere (`CARGO_TARGET_DIR`) is still read from
    // for the binaries; the wire then goes to the workspace's `target/`.
    let wire_base = if target.starts_with(root) {
        target.to_path_buf()
    } else {
        root.join("target")
    };
    let wire = wire_base.join("rxe").join(format!(
        "wire-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    std::fs::create_dir_all(&wire)?;
    // A random pair of UDP ports for the wire.
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let specs = HOSTS
        .iter()
        .zip(scripts)
        .enumerate()
        .map(|(i, ((label, me, mac), script))| {
            let peer = HOSTS[1 - i].1;
            let (mtu, netem) = if i == 0 {
                (args.mtu_a, args.netem_a.as_deref().or(args.netem.as_deref()))
            } else {
                (args.mtu_b, args.netem_b.as_deref().or(args.netem.as_deref()))
            };
            let (here, there) = if i == 0 { (port, port + 1) } else { (port + 1, port) };
            let script = format!(
                "#!/bin/bash\nexport RRPC_RXE_HOST={label} RRPC_RXE_SELF={me} RRPC_RXE_PEER={peer} RRPC_RXE_WIRE={}\n{script}\n",
                sh_quote(&wire.to_string_lossy())
            );
            VmSpec {
                label: (*label).to_owned(),
                script,
                setup: wire_setup(me, peer, mtu, netem),
                nic: Some((
                    format!("socket,id=n0,udp=127.0.0.1:{there},localaddr=127.0.0.1:{here}"),
                    (*mac).to_owned(),
                )),
                numa: None,
            }
        })
        .collect();
    let runs = run_vms(
        root,
        target,
        specs,
        Duration::from_secs(args.timeout),
        args.keep,
    )?;
    let _ = std::fs::remove_dir_all(&wire);
    Ok(runs)
}

/// How a pass of the cross-host suite ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Partition and heal, then host A (the servers') powers off mid-call.
    DeadServer,
    /// Host B (a client's) powers off mid-call; A's server must free the
    /// connection within the bound.
    DeadClient,
}

/// The cross-host suite's two scripts. Servers start on A and run until B
/// is done (`$RRPC_RXE_WIRE/b.done`) or a host powers off; B runs each
/// client, retrying its first connect until A listens, and checks its
/// output. B's exit code is the number of failed checks; A's says whether
/// every server was still up at the end (and, for [`Ending::DeadClient`],
/// whether it freed the dead client's connection in time).
///
/// With `cluster` (a [`ClusterStage`]'s directory) both hosts start an sshd
/// and B runs the cluster-mode bench over ssh ([`cluster_bench_step`])
/// after the rrpc-kv checks.
pub(crate) fn suite_scripts(
    bins: &SuiteBins,
    soak_secs: u64,
    ending: Ending,
    cluster: Option<&Path>,
    full: bool,
) -> [String; 2] {
    let q = |p: &Path| sh_quote(&p.to_string_lossy());
    let dead_server = u8::from(ending == Ending::DeadServer);
    // The full suite only (CI's `--clean-only` subset leaves it out: about
    // 30 s of VM time; CI covers the naming through the integration suite's
    // `injected_faults` and the dead-host check).
    let retry_check = if full && ending == Ending::DeadServer {
        RETRY_CHECK
            .replace("{soak}", &q(&bins.soak))
            .replace("{verbs}", VERBS_CARRIER)
            .replace("{retry_bound}", &RETRY_BOUND_SECS.to_string())
    } else {
        String::new()
    };
    let (sshd_a, cluster_b) = match cluster {
        Some(stage) => (sshd_start(), cluster_bench_step(stage)),
        None => (String::new(), String::new()),
    };
    let a = format!(
        r#"set -u
{hs} --uri rdma://$RRPC_RXE_SELF:50051 > /tmp/hello-server.log 2>&1 & p1=$!
{rs} --uri rdma://$RRPC_RXE_SELF:10000 > /tmp/route-server.log 2>&1 & p2=$!
{soak} --role serve --transport rdma --uri rdma://$RRPC_RXE_SELF:50061 > /tmp/soak-server.log 2>&1 & p3=$!
{soak} --role serve --transport rdma-h2 --uri rdma://$RRPC_RXE_SELF:50062 > /tmp/soak-h2-server.log 2>&1 & p4=$!
# Token and TLS on the side channel: the certificate reaches B through the wire directory.
{soak} --role serve --transport rdma --uri rdma://$RRPC_RXE_SELF:50063 --token cross-host-secret --tls-dir "$RRPC_RXE_WIRE" > /tmp/soak-tls-server.log 2>&1 & p5=$!
# Shared queue pairs (KRCore): the clients' connections share one queue pair.
{soak} --role serve --transport rdma --uri rdma://$RRPC_RXE_SELF:50065 --shared-qps > /tmp/soak-shared-server.log 2>&1 & p8=$!
# rrpc-kv: its gRPC face on rdma://, and RF-RPC (remote fetching) beside it.
{kvs} --listen rdma://$RRPC_RXE_SELF:50070 --rfrpc rdma://$RRPC_RXE_SELF:50071 --memory-mib 64 --partitions 1 > /tmp/kv-server.log 2>&1 & p7=$!
# One port (rrpc://): rrpc clients get the best fabric both ends share,
# plain HTTP/2 clients tonic; the rdma:// side channel runs beside it.
{hs} --uri rrpc://$RRPC_RXE_SELF:50052 > /tmp/port-server.log 2>&1 & p9=$!
# TLS on one port across hosts: the integration suite's `tls::cross_host`
# server (certificates to B through $RRPC_RXE_WIRE/tls-port; it ends when B
# is done with it).
{suite} tls::cross_host::server --exact --ignored --show-output > /tmp/tls-port-server.log 2>&1 & p10=$!
# The dead client's server: its descriptors, counted once a first connection
# (from A itself) came and went, must come back to that count after B dies.
{soak} --role serve --transport rdma --uri rdma://$RRPC_RXE_SELF:50064 > /tmp/soak-dc-server.log 2>&1 & p6=$!
rc=0
if [ {dead_server} = 0 ]; then
  warm=0
  for _ in $(seq 60); do timeout 60 {soak} --role client --transport rdma --uri rdma://$RRPC_RXE_SELF:50064 --duration 1s --clients 1 > /tmp/warm.log 2>&1 && {{ warm=1; break; }}; sleep 1; done
  [ $warm = 1 ] || {{ echo "cross-host: dead client FAILED: no first connection to A's own server"; cat /tmp/warm.log; rc=1; }}
  sleep 3; base=$(ls /proc/$p6/fd | wc -l)
  echo "cross-host: A's dead-client server holds $base descriptors with no client"
fi
{sshd_a}touch "$RRPC_RXE_WIRE/a.up"
while [ ! -e "$RRPC_RXE_WIRE/b.done" ] && [ ! -e "$RRPC_RXE_WIRE/poweroff" ] && [ ! -e "$RRPC_RXE_WIRE/b.poweroff" ]; do sleep 0.1; done
for p in $p1 $p2 $p3 $p4 $p5 $p6 $p7 $p8 $p9; do kill -0 $p 2>/dev/null || rc=1; done
[ $rc = 0 ] || {{ echo "cross-host: a server on A died"; tail -n 20 /tmp/*-server.log; }}
# The TLS port's server ends once B is done with it: it must have passed.
for _ in $(seq 100); do kill -0 $p10 2>/dev/null || break; sleep 0.1; done
if kill -0 $p10 2>/dev/null; then tls_ok="still running"; elif wait $p10 && grep -qF "test result: ok. 1 passed" /tmp/tls-port-server.log; then tls_ok=ok; else tls_ok=FAILED; fi
echo "cross-host: A's TLS port server (tls::cross_host::server): $tls_ok"
[ "$tls_ok" = ok ] || {{ tail -n 30 /tmp/tls-port-server.log; rc=1; }}
echo "cross-host: servers on A up to the end: $([ $rc = 0 ] && echo yes || echo NO)"
if [ -e "$RRPC_RXE_WIRE/b.poweroff" ]; then
  # B powers off right after it creates the file: count from here.
  t0=$(date +%s%N); n=-1
  for _ in $(seq 600); do [ -d /proc/$p6 ] || break; n=$(ls /proc/$p6/fd | wc -l); [ "$n" -le "$base" ] && break; sleep 0.1; done
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ ! -d /proc/$p6 ]; then
    echo "cross-host: dead client FAILED: A's server died"; tail -n 20 /tmp/soak-dc-server.log; rc=1
  elif [ "$n" -le "$base" ] && [ $ms -le {dead_bound}000 ]; then
    echo "cross-host: dead client ok: A's server freed the dead client's connection (descriptors $n, base $base) $ms ms after B powered off (bound {dead_bound} s)"
  else
    echo "cross-host: dead client FAILED: A's server holds $n descriptors (base $base) $ms ms after B powered off (bound {dead_bound} s)"; rc=1
  fi
fi
if [ -e "$RRPC_RXE_WIRE/poweroff" ]; then
  # Die the way a host dies: no FIN, no RST, no goodbye.
  echo "cross-host: A powers off now (sysrq o)"
  echo $rc > /tmp/rxe-job/rc; sync
  echo 1 > /proc/sys/kernel/sysrq; echo o > /proc/sysrq-trigger; sleep 60
fi
kill $p1 $p2 $p3 $p4 $p5 $p6 $p7 $p8 $p9 $p10 2>/dev/null; wait 2>/dev/null
exit $rc
"#,
        hs = q(&bins.hello_server),
        rs = q(&bins.route_server),
        soak = q(&bins.soak),
        kvs = q(&bins.kv_server),
        suite = q(&bins.integration_suite),
        dead_bound = DEAD_HOST_BOUND_SECS,
    );
    // Read from the live queue pair: the device, and the peer's GID is the other host's.
    let verbs = VERBS_CARRIER;
    let b = format!(
        r#"set -u
trap 'mkdir -p "$RRPC_RXE_WIRE/tls-port"; touch "$RRPC_RXE_WIRE/tls-port/done" "$RRPC_RXE_WIRE/b.done"' EXIT
for _ in $(seq 180); do [ -e "$RRPC_RXE_WIRE/a.up" ] && break; sleep 1; done
failed=0
# check NAME LOG: the client's exit code is in $ok; every further argument is a string its log must hold.
check() {{
  name=$1; log=$2; shift 2; why=ok
  [ "$ok" = 0 ] || why="client exited $ok"
  for want in "$@"; do grep -qF -- "$want" "$log" || why="missing: $want"; done
  if [ "$why" = ok ]; then echo "cross-host: $name ok"; else echo "cross-host: $name FAILED ($why)"; cat "$log"; failed=$((failed + 1)); fi
}}
retry() {{ # until the server listens, 120 s at most
  for _ in $(seq 60); do "$@" && return 0; sleep 2; done; return 1
}}
{wire}retry timeout 60 {hc} --uri rdma://$RRPC_RXE_PEER:50051 > /tmp/hello.log 2>&1; ok=$?
check helloworld /tmp/hello.log "{verbs}" 'RESPONSE="Hello rrpc!"'
# One port, three clients at once: the default rrpc client lands on verbs
# (another host: no shm), one with verbs forbidden on TCP, a plain HTTP/2
# client (tonic on http://) on TCP; then one whose device does not open
# falls back to TCP.
retry timeout 60 {hc} --uri rrpc://$RRPC_RXE_PEER:50052 > /dev/null 2>&1
timeout 60 {hc} --uri rrpc://$RRPC_RXE_PEER:50052 > /tmp/port-verbs.log 2>&1 & q1=$!
timeout 60 {hc} --uri rrpc://$RRPC_RXE_PEER:50052 --fabrics shm,tcp > /tmp/port-tcp.log 2>&1 & q2=$!
timeout 60 {hc} --uri http://$RRPC_RXE_PEER:50052 > /tmp/port-h2.log 2>&1 & q3=$!
wait $q1; ok=$?
check "one port: an rrpc client lands on verbs" /tmp/port-verbs.log "{verbs}" 'RESPONSE="Hello rrpc!"'
wait $q2; ok=$?
check "one port: verbs forbidden lands on tcp (at once)" /tmp/port-tcp.log "carried by Tcp" 'RESPONSE="Hello rrpc!"'
wait $q3; ok=$?
check "one port: a plain HTTP/2 client (at once)" /tmp/port-h2.log "carried by Tcp" 'RESPONSE="Hello rrpc!"'
timeout 60 {hc} --uri rrpc://$RRPC_RXE_PEER:50052 --rdma-device no-such-device > /tmp/port-nodev.log 2>&1; ok=$?
check "one port: a client without the device falls back to tcp" /tmp/port-nodev.log "carried by Tcp" 'RESPONSE="Hello rrpc!"'
retry timeout 120 {rc} --uri rdma://$RRPC_RXE_PEER:10000 > /tmp/route.log 2>&1; ok=$?
check "routeguide (all four RPC kinds)" /tmp/route.log "{verbs}" 'GetFeature: Feature {{ name: "Place 3,6"' 'ListFeatures: 8 features' 'RecordRoute: RouteSummary {{ point_count: 10,' 'RouteChat: got "note 0"'
for t in rdma:50061 rdma-h2:50062; do
  timeout 300 {soak} --role client --transport ${{t%%:*}} --uri rdma://$RRPC_RXE_PEER:${{t##*:}} --duration {soak_secs}s --clients 4 --max-size-kib 6144 --empty --stall-after 60s > /tmp/soak.log 2>&1; ok=$?
  check "soak ${{t%%:*}} ({soak_secs} s, 4 clients, 0 B..6 MiB, every byte checked)" /tmp/soak.log "calls: " "soak: {verbs}"
  grep -E '^(calls|ran|fds)' /tmp/soak.log
done
# Shared queue pairs (the connection pool, on by default on rdma://, and self-sizing rings are in every soak).
# One queue pair carries all four clients' calls, so under netem every lost
# packet holds them all (RC's go-back-N on soft-RoCE): calls of up to 4 MiB
# took 30-37 s each at 1 % loss on an idle machine, past 60 s on a busy one.
timeout 300 {soak} --role client --transport rdma --uri rdma://$RRPC_RXE_PEER:50065 --shared-qps --duration 3s --clients 4 --stall-after 180s > /tmp/shared.log 2>&1; ok=$?
check "shared queue pairs (4 clients, one queue pair; 3 s)" /tmp/shared.log "calls: " "soak: {verbs}"
grep -E '^(calls|pool)' /tmp/shared.log
# Token and TLS: the right ones pass; a wrong token, or no TLS, is refused before any region or queue pair.
timeout 300 {soak} --role client --transport rdma --uri rdma://$RRPC_RXE_PEER:50063 --token cross-host-secret --tls-dir "$RRPC_RXE_WIRE" --duration 3s --clients 2 --stall-after 60s > /tmp/tls.log 2>&1; ok=$?
check "token and TLS on the side channel (2 clients, 3 s)" /tmp/tls.log "calls: " "soak: {verbs}"
# What carried a refusal: A's side channel (TCP), and no RoCE packet (no queue pair).
wire_mark
timeout 120 {soak} --role refused --transport rdma --uri rdma://$RRPC_RXE_PEER:50063 --token wrong-secret --tls-dir "$RRPC_RXE_WIRE" > /tmp/refused.log 2>&1; ok=$?
wire_refused /tmp/refused.log
check "a wrong token is refused (Unauthenticated) on the side channel, before any queue pair" /tmp/refused.log "refused: the connect failed: Unauthenticated"
grep -h -e '^refused' -e '^wire:' /tmp/refused.log
wire_mark
timeout 120 {soak} --role refused --transport rdma --uri rdma://$RRPC_RXE_PEER:50063 --token cross-host-secret > /tmp/refused2.log 2>&1; ok=$?
wire_refused /tmp/refused2.log
check "a client without TLS is refused on the side channel, before any queue pair" /tmp/refused2.log "refused: the connect failed"
grep -h -e '^refused' -e '^wire:' /tmp/refused2.log
# TLS on one port (rrpc://): B's client allows verbs only, negotiates inside
# TLS and must land on rxe0 connected to A, on both call paths, over sealed
# rings, with A's handler seeing its certificate; plaintext,
# certificate-less and plaintext-ring clients are refused (the integration suite's `tls::cross_host::client`).
timeout 240 {suite} tls::cross_host::client --exact --ignored --show-output > /tmp/tls-port.log 2>&1; ok=$?
touch "$RRPC_RXE_WIRE/tls-port/done"
check "TLS on one port: an rrpc client lands on verbs, both paths, its certificate seen across hosts; refusals" /tmp/tls-port.log "test result: ok. 1 passed" "{verbs}"
grep -h '^cross-host tls:' /tmp/tls-port.log
# rrpc-kv across hosts (YCSB A, 300 records, 300 operations, 2 clients): the
# gRPC face over rdma://; RF-RPC with the client READing the results out of
# A's memory (remote fetch); the hybrid switch with request batches of 8.
# rrpc-kv-bench prints no carrier and no READ count: the wire counters say
# what carried each run: RoCE v2 packets from B to A (at least {kv_roce};
# 600 calls, 75 batches with --batch 8), and in remote-fetch mode at least
# one RDMA READ request per call of the run phase ({kv_ops}; the load
# phase's 300 are fetched too).
kv() {{ # NAME MIN_READS ARGS...
  name=$1; min_reads=$2; shift 2
  wire_mark
  timeout 300 {kvb} --workload a --records 300 --ops {kv_ops} --clients 2 --no-progress "$@" > /tmp/kv.log 2>&1; ok=$?
  wire_since >> /tmp/kv.log
  if [ "$ok" = 0 ]; then
    if [ "$roce" -lt {kv_roce} ]; then ok="0, but only $roce RoCE packets went to A: verbs did not carry it"
    elif [ "$reads" -lt "$min_reads" ]; then ok="0, but only $reads RDMA READ requests went to A (want at least $min_reads)"
    fi
  fi
  check "$name" /tmp/kv.log "run phase:"
  echo "cross-host: $name: B sent A $roce RoCE v2 packets on rxe0, $reads of them RDMA READ requests"
  if grep -q "operations failed" /tmp/kv.log; then echo "cross-host: $name FAILED (operations failed)"; grep "operations failed" /tmp/kv.log; failed=$((failed + 1)); fi
}}
retry timeout 60 {kvb} --workload c --records 10 --ops 10 --clients 1 --no-progress --target grpc+rdma://$RRPC_RXE_PEER:50070 > /dev/null 2>&1
kv "rrpc-kv gRPC face over rdma://" 0 --target grpc+rdma://$RRPC_RXE_PEER:50070
kv "rrpc-kv RF-RPC, remote fetch (READs from A's memory)" {kv_ops} --target rfrpc+rdma://$RRPC_RXE_PEER:50071 --rf-mode remote-fetch
kv "rrpc-kv RF-RPC, hybrid switch, batches of 8" 0 --target rfrpc+rdma://$RRPC_RXE_PEER:50071 --rf-mode hybrid --batch 8
{cluster_b}{retry_check}if [ {dead_server} = 1 ]; then
  # Partition and heal: B's frames are all lost, under a stream of calls with
  # 3 s deadlines, for 4 s (calls wait, or fail at their deadline) and then
  # for {cut} s (longer than the keep-alive's 16 s: calls in flight fail, and
  # the channel reconnects after the heal).
  {soak} --role partition --transport rdma --uri rdma://$RRPC_RXE_PEER:50061 --duration {part_secs}s --signal /tmp/healed > /tmp/part.log 2>&1 & pp=$!
  for _ in $(seq 120); do grep -q "carried by" /tmp/part.log && break; sleep 0.5; done
  sleep 2; tc qdisc replace dev eth0 root netem loss 100%
  if busybox ping -c 1 -W 1 $RRPC_RXE_PEER > /dev/null 2>&1; then echo "cross-host: partition FAILED (the wire is not cut: ping answers)"; failed=$((failed + 1)); else echo "cross-host: wire cut for 4 s (ping fails)"; fi
  sleep 3; tc qdisc del dev eth0 root; echo "cross-host: wire restored"
  sleep 4; tc qdisc replace dev eth0 root netem loss 100%; echo "cross-host: wire cut for {cut} s"
  sleep {cut}; tc qdisc del dev eth0 root; touch /tmp/healed; echo "cross-host: wire restored"
  wait $pp; ok=$?
  check "partition and heal (4 s and {cut} s cuts under calls; checked bytes; reconnects)" /tmp/part.log "soak: {verbs}" "calls ok"
  grep -E '^partition' /tmp/part.log | tail -n 6
  # A dead server host: A powers off (sysrq) while a call waits on it.
  timeout 120 {soak} --role dead-peer --transport rdma --uri rdma://$RRPC_RXE_PEER:50061 --signal "$RRPC_RXE_WIRE/poweroff" --bound {dead_bound}s > /tmp/dead.log 2>&1; ok=$?
  check "dead host (A powered off mid-call; Unavailable within {dead_bound} s, naming the silent host)" /tmp/dead.log "soak: {verbs}" "dead-peer: the call failed after" "its host stopped answering"
  grep -E '^dead-peer' /tmp/dead.log
else
  # A dead client host: B powers off while its call waits on A's server.
  {soak} --role dead-peer --transport rdma --uri rdma://$RRPC_RXE_PEER:50064 --signal /tmp/in-flight > /tmp/dead.log 2>&1 &
  for _ in $(seq 240); do [ -e /tmp/in-flight ] && break; sleep 0.5; done
  if [ -e /tmp/in-flight ]; then echo "cross-host: dead client: call in flight"; else echo "cross-host: dead client FAILED (no call in flight)"; cat /tmp/dead.log; failed=$((failed + 1)); fi
  echo "cross-host: $failed failed; B powers off now (sysrq o)"
  echo $failed > /tmp/rxe-job/rc; sync
  touch "$RRPC_RXE_WIRE/b.poweroff"
  echo 1 > /proc/sys/kernel/sysrq; echo o > /proc/sysrq-trigger; sleep 60
fi
echo "cross-host: $failed failed"
exit $failed
"#,
        hc = q(&bins.hello_client),
        rc = q(&bins.route_client),
        soak = q(&bins.soak),
        kvb = q(&bins.kv_bench),
        suite = q(&bins.integration_suite),
        wire = WIRE_COUNTERS,
        kv_ops = 300,
        kv_roce = 100,
        dead_bound = DEAD_HOST_BOUND_SECS,
        cut = PARTITION_SECS,
        part_secs = PARTITION_SECS + 35,
    );
    [a, b]
}

/// `cargo xtask rxe --hosts 2`.
pub(crate) fn run(root: &Path, target: &Path, args: &RxeArgs) -> Result<i32> {
    if args.hosts != 2 {
        bail!("--hosts takes 1 or 2");
    }
    if args.numa {
        bail!("--numa runs on one host (no --hosts 2)");
    }
    let scripts = match args.cmd.as_slice() {
        [] => {
            let bins = crate::rxe::suite::build_cross_host(root)?;
            // The cluster-mode bench over ssh costs 100-160 s of VM time:
            // the full suite only, not `--clean-only` (CI's subset). Its rpc
            // binary comes from the same verbs build as the soak.
            let stage = if args.clean_only {
                None
            } else {
                Some(ClusterStage::new(
                    root,
                    target,
                    &bins.soak.with_file_name("rpc"),
                )?)
            };
            let mut code = run_pair(
                root,
                target,
                args,
                suite_scripts(
                    &bins,
                    args.soak_secs,
                    Ending::DeadServer,
                    stage.as_ref().map(|s| s.dir.as_path()),
                    !args.clean_only,
                ),
            )?;
            drop(stage);
            if code == 0
                && !args.clean_only
                && args.netem.is_none()
                && args.netem_a.is_none()
                && args.netem_b.is_none()
            {
                // The same suite on a faulty wire: RC must hide loss,
                // reordering and duplicates (it costs time, never a call).
                // And different MTUs: A's jumbo frames (RoCE MTU 4096) against
                // B's 1500 (1024): both ends must use the smaller path MTU.
                let faulty = RxeArgs {
                    netem: Some(DEFAULT_FAULTS.to_owned()),
                    mtu_a: args.mtu_a.or(Some(9000)),
                    ..args.clone()
                };
                eprintln!(
                    "rxe --hosts 2: again with netem {DEFAULT_FAULTS} on both hosts, and MTU {} on A",
                    faulty.mtu_a.unwrap_or(1500)
                );
                code = run_pair(
                    root,
                    target,
                    &faulty,
                    suite_scripts(&bins, args.soak_secs, Ending::DeadClient, None, true),
                )?;
            }
            return Ok(code);
        }
        [a, b] => [a.clone(), b.clone()],
        _ => {
            bail!("cargo xtask rxe --hosts 2 -- CMD_A CMD_B: two commands (each one shell string)")
        }
    };
    run_pair(root, target, args, scripts)
}

/// How long after its host powered off a call waiting on it must have
/// failed: the side channel's default keep-alive bound (10 s idle + 3 probes
/// 2 s apart = 16 s; `rrpc_core::conn::TcpKeepalive::bound`) plus slack for
/// the emulated hosts and the signal's path through the shared directory.
pub(crate) const DEAD_HOST_BOUND_SECS: u64 = 20;

/// Counters of what B sends A, for the checks whose binaries print no
/// carrier (rrpc-kv-bench; the refusals, which have no connection to read
/// one from): `clsact` filters on `eth0`'s egress count RoCE v2 packets
/// to A (UDP port 4791, at byte 22 of the IPv4 header: rxe sends no IP
/// options), among them RDMA READ requests (BTH opcode 0x0C, the first
/// byte after the UDP header, at 28), and TCP packets to A (the side
/// channels). `wire_mark` notes the counts, `wire_since` sets `roce`,
/// `reads` and `tcp` to what was sent since and prints them;
/// `wire_refused LOG` turns `ok` into a failure unless the side channel
/// carried the exchange (TCP) and no RoCE packet went out. Counters
/// that cannot be set up fail every check that reads them.
const WIRE_COUNTERS: &str = r#"for m in sch_ingress cls_u32 act_gact; do /tmp/modprobe $m || true; done
u32_to_a="u32 match ip dst $RRPC_RXE_PEER/32"
if tc qdisc add dev eth0 clsact \
  && tc filter add dev eth0 egress prio 1 protocol ip $u32_to_a match u16 4791 0xffff at 22 match u8 0x0c 0xff at 28 action gact continue index 41 \
  && tc filter add dev eth0 egress prio 2 protocol ip $u32_to_a match u16 4791 0xffff at 22 action gact continue index 42 \
  && tc filter add dev eth0 egress prio 3 protocol ip $u32_to_a match ip protocol 6 0xff action gact continue index 43; then
  echo "cross-host: wire counters on eth0 (RoCE v2 to A, RDMA READ requests, TCP to A)"
else
  echo "cross-host: wire counters FAILED to start"; tc qdisc del dev eth0 clsact 2>/dev/null
fi
wire_pkts() { tc -s actions get action gact index $1 2>/dev/null | awk '/Sent/ { print $4; exit }'; }
wire_mark() { w_read=$(wire_pkts 41); w_roce=$(wire_pkts 42); w_tcp=$(wire_pkts 43); }
wire_since() {
  local r=$(wire_pkts 41) a=$(wire_pkts 42) t=$(wire_pkts 43)
  if [ -n "$r" ] && [ -n "$a" ] && [ -n "$t" ] && [ -n "$w_read" ] && [ -n "$w_roce" ] && [ -n "$w_tcp" ]; then
    reads=$((r - w_read)); roce=$((a - w_roce)); tcp=$((t - w_tcp))
  else
    reads=-1; roce=-1; tcp=-1; [ "$ok" = 0 ] && ok="0, but the wire counters are not there"
  fi
  echo "wire: B sent A $roce RoCE v2 packets ($reads RDMA READ requests) and $tcp TCP packets"
}
wire_refused() {
  wire_since >> "$1"
  if [ "$ok" = 0 ]; then
    if [ "$roce" != 0 ]; then ok="0, but $roce RoCE packets went to A: not refused before any queue pair"
    elif [ "$tcp" -lt 3 ]; then ok="0, but only $tcp TCP packets went to A: the side channel did not carry the refusal"
    fi
  fi
}
"#;

/// What a client prints when verbs carried its calls to the other host (in
/// a double-quoted shell string).
const VERBS_CARRIER: &str =
    "carried by Verbs { device: \\\"$RRPC_TEST_DEVICE\\\", peer: Some($RRPC_RXE_PEER) }";

/// A wire cut under a sending stream (`soak --role retry-exhausted`): B's
/// frames are all lost while a stream keeps 64 KiB messages in flight; the
/// call must fail `Unavailable` within [`RETRY_BOUND_SECS`], naming what
/// happened: the queue pair's retries (`IBV_WC_RETRY_EXC_ERR`, about half a
/// second on a NIC with `RcRetry`'s defaults) or, on soft-RoCE, which
/// raised none within 56 s of a cut, the side channel's keep-alive (16 s).
const RETRY_CHECK: &str = r#"# A wire cut under a sending stream: the call fails Unavailable, naming the cause.
rm -f /tmp/retry-cut
{soak} --role retry-exhausted --transport rdma --uri rdma://$RRPC_RXE_PEER:50061 --signal /tmp/retry-cut --bound {retry_bound}s > /tmp/retry.log 2>&1 & rp=$!
for _ in $(seq 240); do [ -e /tmp/retry-cut ] && break; sleep 0.25; done
tc qdisc replace dev eth0 root netem loss 100%
wait $rp; ok=$?
tc qdisc del dev eth0 root
# The wire answers again before the next check connects.
for _ in $(seq 40); do busybox ping -c 1 -W 1 $RRPC_RXE_PEER > /dev/null 2>&1 && break; sleep 0.5; done
check "wire cut under a sending stream (Unavailable within {retry_bound} s, naming the retries or the keep-alive)" /tmp/retry.log "soak: {verbs}" "retry-exhausted: named:"
grep -E '^retry-exhausted' /tmp/retry.log
"#;

/// How long after the wire was cut under a sending stream the call must
/// have failed: the keep-alive's 16 s bound (soft-RoCE raises no
/// `IBV_WC_RETRY_EXC_ERR`) plus slack for timers in emulated VMs (22 s
/// seen once); a NIC's retries give up after about 8 × 67 ms.
pub(crate) const RETRY_BOUND_SECS: u64 = 30;

/// The long cut of the partition test: longer than the side channel's
/// keep-alive bound (16 s), so calls in flight fail and the channel must
/// reconnect after the heal.
pub(crate) const PARTITION_SECS: u64 = 20;

/// The faults of the suite's second run: loss, delay with jitter,
/// reordering, duplicates and corrupted frames on both hosts (a corrupted
/// RoCE packet fails its ICRC and is dropped by the receiving device, so
/// RC must recover it as it recovers a loss).
pub(crate) const DEFAULT_FAULTS: &str =
    "loss 1% delay 1ms 1ms reorder 10% 50% duplicate 1% corrupt 1%";

/// The cluster-mode bench's files, staged on the host before the VMs boot
/// (nothing is built in a VM: TCG runs 20-50x slower): hard links to the
/// host-built `xtask` (the running one) and the `rpc` suite binary of the
/// suite's verbs build (`bin_dir` of the generated hosts file), the
/// workspace's `cargo metadata`, and `cargo`, a stand-in that answers
/// only `cargo metadata` from that file (`xtask bench` asks it for the
/// target directory through `$CARGO`) and fails anything else.
/// Removed when dropped.
pub(crate) struct ClusterStage {
    pub(crate) dir: PathBuf,
}

impl ClusterStage {
    /// Installs openssh-server and openssh-client on the host (the VMs
    /// share its root) and stages the files under `target/rxe/`.
    pub(crate) fn new(root: &Path, target: &Path, rpc: &Path) -> Result<Self> {
        crate::rxe::ensure_packages(&["openssh-server", "openssh-client"])?;
        if !rpc.is_file() {
            bail!(
                "the suite's verbs build has no {} (the rpc suite binary of rrpc-bench)",
                rpc.display()
            );
        }
        let dir = target
            .join("rxe")
            .join(format!("cluster-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let stage = ClusterStage { dir };
        // A hard link keeps this build even if cargo replaces the file meanwhile.
        let link = |from: &Path, name: &str| -> Result<()> {
            let to = stage.dir.join(name);
            if std::fs::hard_link(from, &to).is_err() {
                std::fs::copy(from, &to)
                    .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
            }
            Ok(())
        };
        link(&std::env::current_exe()?, "xtask")?;
        link(rpc, "rpc")?;
        let meta = crate::util::cargo_metadata(root)?;
        std::fs::write(stage.dir.join("metadata.json"), meta.to_string())?;
        let cargo = stage.dir.join("cargo");
        std::fs::write(&cargo, cargo_stand_in(&stage.dir))?;
        std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        Ok(stage)
    }
}

impl Drop for ClusterStage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `cargo` of [`ClusterStage`]: `cargo metadata` from the staged file, nothing else.
fn cargo_stand_in(dir: &Path) -> String {
    format!(
        "#!/bin/sh\n# cargo in the VMs of `cargo xtask rxe --hosts 2`: nothing is built there.\n\
         [ \"$1\" = metadata ] && exec cat {meta}\n\
         echo \"cargo $*: cargo does not run in the VM (everything is built on the host)\" >&2\nexit 101\n",
        meta = sh_quote(&dir.join("metadata.json").to_string_lossy())
    )
}

/// The port of the VMs' sshd.
const SSH_PORT: u16 = 22;
/// The cluster-mode bench server's port on A.
const CLUSTER_BENCH_PORT: u16 = 50090;

/// The hosts file of the cluster-mode bench: the server on A, 2 clients on
/// B, rrpc over `rdma://` on `rxe0`, root by the client key B generated
/// (`/tmp/ssh`, tmpfs), trusting exactly the two hosts' keys.
pub(crate) fn cluster_hosts_toml(bin_dir: &Path) -> String {
    let [(_, a, _), (_, b, _)] = HOSTS;
    format!(
        r#"# Generated by `cargo xtask rxe --hosts 2` (rxe_hosts.rs): the cluster-mode bench across the two VMs.
[defaults]
user = "root"
ssh_key = "/tmp/ssh/client_key"
ssh_port = {SSH_PORT}
ssh_options = [
    "UserKnownHostsFile=/tmp/ssh/known_hosts",
    "GlobalKnownHostsFile=/dev/null",
    "StrictHostKeyChecking=yes",
    "IdentitiesOnly=yes",
    "IdentityAgent=none",
]
bin_dir = "{bin}"
port = {CLUSTER_BENCH_PORT}
# ssh, then a debug build starting over 9p under TCG.
ready_timeout_secs = 120
# --quick's 1 s window (after 1/5 of it as warm-up) can close before the first
# call under TCG: 4 s (0.8 s warm-up).
duration_ms = 4000

[[hosts]]
name = "a"
address = "{a}"
role = "server"
rdma_device = "rxe0"

[[hosts]]
name = "b"
address = "{b}"
role = "client"
rdma_device = "rxe0"
clients = 2
"#,
        bin = bin_dir.display(),
    )
}

/// Bash that starts a throwaway sshd on this host (`$RRPC_RXE_SELF`, port
/// [`SSH_PORT`]): a fresh host key in tmpfs (`/tmp/ssh`), root by key only
/// (the keys in `$RRPC_RXE_WIRE/ssh/authorized_keys`), and the host's
/// `known_hosts` line published as `$RRPC_RXE_WIRE/ssh/known_hosts.$RRPC_RXE_HOST`.
pub(crate) fn sshd_start() -> String {
    format!(
        r#"# A throwaway sshd for the cluster-mode bench: root by key only, on the wire's address.
mkdir -p /tmp/ssh "$RRPC_RXE_WIRE/ssh" && mkdir -p -m 0755 /run/sshd
ssh-keygen -q -t ed25519 -N '' -C "rrpc-rxe-host-$RRPC_RXE_HOST" -f /tmp/ssh/host_key
cat > /tmp/ssh/sshd_config <<SSHD
Port {SSH_PORT}
ListenAddress $RRPC_RXE_SELF
HostKey /tmp/ssh/host_key
PidFile /tmp/ssh/sshd.pid
AuthorizedKeysFile $RRPC_RXE_WIRE/ssh/authorized_keys
AllowUsers root
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The wire directory is a 9p share: its modes prove nothing.
StrictModes no
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTTY no
PrintMotd no
PrintLastLog no
LogLevel ERROR
# bash in an ssh session reads \$HOME/.bashrc: not the host's /root/.bashrc (shared read-only).
SetEnv HOME=/tmp/ssh
SSHD
# sshd forks once it listens.
if /usr/sbin/sshd -f /tmp/ssh/sshd_config -E /tmp/ssh/sshd.log; then
  echo "$RRPC_RXE_SELF $(cat /tmp/ssh/host_key.pub)" > "$RRPC_RXE_WIRE/ssh/known_hosts.tmp.$RRPC_RXE_HOST"
  mv "$RRPC_RXE_WIRE/ssh/known_hosts.tmp.$RRPC_RXE_HOST" "$RRPC_RXE_WIRE/ssh/known_hosts.$RRPC_RXE_HOST"
  echo "cross-host: sshd on $RRPC_RXE_SELF:{SSH_PORT} (root by key only)"
else
  echo "cross-host: sshd did not start on $RRPC_RXE_SELF"; cat /tmp/ssh/sshd.log
fi
"#
    )
}

/// Bash for B's script (inside [`suite_scripts`], where `check` is
/// defined): `xtask bench rpc --hosts` with the `ssh` launcher, as built on
/// the host (`stage`: [`ClusterStage`]), starting the server on A and 2
/// clients on B through the two sshd's, rrpc over `rdma://` on `rxe0`. It
/// checks the exit code, the result files, the carrier the client read
/// from its live connections (verbs on `rxe0`, peer A) and that calls
/// completed. Functional only: no timing from a VM is printed.
pub(crate) fn cluster_bench_step(stage: &Path) -> String {
    let q = |p: &str| sh_quote(&stage.join(p).to_string_lossy());
    let peer = HOSTS[0].1;
    format!(
        r#"# The cluster-mode bench over ssh: xtask on B (built on the host, no cargo
# here) starts the server on A and the clients on B through each host's sshd.
{sshd}ssh-keygen -q -t ed25519 -N '' -C rrpc-rxe-client -f /tmp/ssh/client_key
cp /tmp/ssh/client_key.pub "$RRPC_RXE_WIRE/ssh/authorized_keys"
for _ in $(seq 120); do [ -e "$RRPC_RXE_WIRE/ssh/known_hosts.A" ] && [ -e "$RRPC_RXE_WIRE/ssh/known_hosts.B" ] && break; sleep 0.5; done
cat "$RRPC_RXE_WIRE/ssh/known_hosts.A" "$RRPC_RXE_WIRE/ssh/known_hosts.B" > /tmp/ssh/known_hosts
cat > /tmp/ssh/hosts.toml <<'TOML'
{toml}TOML
rm -rf /tmp/cluster-bench
CARGO={cargo} timeout 600 {xtask} bench rpc --quick --profile test --no-build --hosts /tmp/ssh/hosts.toml --launcher ssh --out /tmp/cluster-bench > /tmp/cluster.log 2>&1; ok=$?
for f in cluster_throughput.md cluster_throughput.json cluster_throughput.csv summary.md; do
  [ -s /tmp/cluster-bench/$f ] || {{ echo "result file $f: missing" >> /tmp/cluster.log; [ "$ok" != 0 ] || ok="0, but $f is missing"; }}
done
[ -e /tmp/cluster-bench/cluster_throughput.md ] && cat /tmp/cluster-bench/cluster_throughput.md >> /tmp/cluster.log
# The calls B's clients completed (the table's total row).
calls=$(awk -F'|' '$2 ~ /^ *total *$/ {{ gsub(/ /, "", $4); print $4 }}' /tmp/cluster-bench/cluster_throughput.md 2>/dev/null)
[ "${{calls:-0}}" -gt 0 ] 2>/dev/null || [ "$ok" != 0 ] || ok="0, but no calls completed"
# A's READY names its rdma:// URI; B's row names the carrier its clients read from their live queue pairs.
check "cluster-mode bench over ssh (server on A, 2 clients on B, rdma:// on rxe0; functional only)" /tmp/cluster.log "[a] READY rdma://" "(rrpc over rdma://)" "| b | 2 | $calls |" 'Verbs {{ device: "rxe0", peer: Some({peer}) }}'
echo "cross-host: cluster bench: ${{calls:-no}} calls from B to A over verbs (functional only: no timing from a VM)"
"#,
        sshd = sshd_start(),
        toml = cluster_hosts_toml(stage),
        cargo = q("cargo"),
        xtask = q("xtask"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{HostsFile, LauncherKind, Role, plan, start_command};

    fn bins() -> SuiteBins {
        let p = |n: &str| PathBuf::from(format!("/ws/target/debug/{n}"));
        SuiteBins {
            hello_server: p("helloworld-server"),
            hello_client: p("helloworld-client"),
            route_server: p("routeguide-server"),
            route_client: p("routeguide-client"),
            soak: p("soak"),
            kv_server: p("rrpc-kv-server"),
            kv_bench: p("rrpc-kv-bench"),
            integration_suite: p("deps/suite-1"),
        }
    }

    /// `bash -n`: the script parses.
    fn parses(script: &str) {
        let out = std::process::Command::new("bash")
            .args(["-n", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn the_cluster_hosts_file_puts_the_server_on_a_and_the_clients_on_b() {
        let stage = Path::new("/ws/target/rxe/cluster-bench-1");
        let f = HostsFile::parse(&cluster_hosts_toml(stage)).unwrap();
        let p = plan(&f, "rpc", Path::new("/unused"), true).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].host.role, p[0].host.address.as_str()),
            (Role::Server, "10.99.1.1")
        );
        assert_eq!(
            (p[1].host.role, p[1].host.address.as_str()),
            (Role::Client, "10.99.1.2")
        );
        for x in &p {
            assert_eq!(x.program, stage.join("rpc"), "the staged host build");
            assert!(
                x.env
                    .contains(&("RRPC_BENCH_RDMA_DEVICE".into(), "rxe0".into())),
                "rrpc over rdma:// on rxe0"
            );
        }
        let client = p[1].args.join(" ");
        assert!(client.contains("--connect 10.99.1.1:50090"), "{client}");
        assert!(
            client.contains("--clients 2 --duration-ms 4000"),
            "{client}"
        );
        // Over ssh as root, with B's key, trusting only the two hosts' keys.
        let ssh: Vec<String> = {
            let c = start_command(LauncherKind::Ssh, &p[0], "R");
            std::iter::once(c.get_program())
                .chain(c.get_args())
                .map(|s| s.to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(
            ssh[..3],
            ["ssh", "-o", "UserKnownHostsFile=/tmp/ssh/known_hosts"]
        );
        assert!(ssh.contains(&"StrictHostKeyChecking=yes".to_owned()));
        assert!(ssh.windows(2).any(|w| w == ["-i", "/tmp/ssh/client_key"]));
        assert!(ssh.contains(&"root@10.99.1.1".to_owned()), "{ssh:?}");
    }

    #[test]
    fn sshd_takes_root_by_key_only_on_the_wire() {
        let s = sshd_start();
        for want in [
            "ListenAddress $RRPC_RXE_SELF",
            "HostKey /tmp/ssh/host_key",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "AuthorizedKeysFile $RRPC_RXE_WIRE/ssh/authorized_keys",
            "/usr/sbin/sshd -f /tmp/ssh/sshd_config",
        ] {
            assert!(s.contains(want), "missing {want}");
        }
        parses(&s);
    }

    #[test]
    fn the_bench_step_runs_the_host_build_and_checks_the_carrier() {
        let stage = Path::new("/ws/target/rxe/cluster-bench-1");
        let s = cluster_bench_step(stage);
        assert!(s.contains(
            "CARGO=/ws/target/rxe/cluster-bench-1/cargo timeout 600 \
             /ws/target/rxe/cluster-bench-1/xtask bench rpc --quick --profile test --no-build \
             --hosts /tmp/ssh/hosts.toml --launcher ssh"
        ));
        assert!(s.contains(r#"'Verbs { device: "rxe0", peer: Some(10.99.1.1) }'"#));
        assert!(s.contains("\"[a] READY rdma://\""));
        assert!(
            s.contains(&cluster_hosts_toml(stage)),
            "the hosts file, verbatim"
        );
        parses(&s);
    }

    #[test]
    fn the_cargo_stand_in_answers_metadata_only() {
        let dir = std::env::temp_dir().join(format!("xtask-stand-in-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("metadata.json"), "{\"target_directory\":\"/t\"}").unwrap();
        let run = |arg: &str| {
            std::process::Command::new("sh")
                .args(["-c", &cargo_stand_in(&dir), "cargo", arg])
                .output()
                .unwrap()
        };
        let meta = run("metadata");
        let build = run("build");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(meta.status.success());
        assert_eq!(meta.stdout, b"{\"target_directory\":\"/t\"}");
        assert_eq!(build.status.code(), Some(101));
        assert!(String::from_utf8_lossy(&build.stderr).contains("does not run in the VM"));
    }

    #[test]
    fn the_suite_runs_tls_on_one_port_across_hosts_on_both_wires() {
        for ending in [Ending::DeadServer, Ending::DeadClient] {
            let [a, b] = suite_scripts(&bins(), 5, ending, None, false);
            let server = a
                .find("/ws/target/debug/deps/suite-1 tls::cross_host::server --exact --ignored")
                .expect("A serves the TLS port");
            assert!(server < a.find("a.up\"").unwrap(), "before B starts");
            assert!(a.contains("A's TLS port server (tls::cross_host::server): $tls_ok"));
            let client = b
                .find("/ws/target/debug/deps/suite-1 tls::cross_host::client --exact --ignored")
                .expect("B's client");
            let done = b[client..]
                .find("touch \"$RRPC_RXE_WIRE/tls-port/done\"")
                .expect("B releases A's server");
            assert!(b[client + done..].contains(
                "\"test result: ok. 1 passed\" \"carried by Verbs { device: \\\"$RRPC_TEST_DEVICE\\\", peer: Some($RRPC_RXE_PEER) }\""
            ));
            assert!(b.contains(
                "trap 'mkdir -p \"$RRPC_RXE_WIRE/tls-port\"; touch \"$RRPC_RXE_WIRE/tls-port/done\""
            ));
            parses(&a);
            parses(&b);
        }
    }

    #[test]
    fn the_suite_runs_the_cluster_bench_only_when_staged() {
        let stage = Path::new("/ws/target/rxe/cluster-bench-1");
        let [a, b] = suite_scripts(&bins(), 5, Ending::DeadServer, Some(stage), true);
        let sshd = a.find("/usr/sbin/sshd").expect("sshd on A");
        assert!(
            sshd < a.find("a.up\"").unwrap(),
            "A's sshd is up before B starts"
        );
        let bench = b.find("xtask bench rpc").expect("the bench on B");
        assert!(bench > b.find("rrpc-kv RF-RPC, hybrid").unwrap());
        assert!(
            bench < b.find("Partition and heal").unwrap(),
            "before the faults"
        );
        parses(&a);
        parses(&b);
        let retry = b.find("--role retry-exhausted").expect("the retry check");
        assert!(retry < b.find("Partition and heal").unwrap());
        let [a, b] = suite_scripts(&bins(), 5, Ending::DeadClient, None, true);
        assert!(!a.contains("sshd") && !b.contains("sshd") && !b.contains("xtask"));
        assert!(!b.contains("retry-exhausted"), "on the clean wire only");
        let [_, b] = suite_scripts(&bins(), 5, Ending::DeadServer, None, false);
        assert!(!b.contains("retry-exhausted"), "not in CI's subset");
        parses(&a);
        parses(&b);
    }
}
