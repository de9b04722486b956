//! RB² ring-buffer suite (`cargo xtask bench ringbuf`): Exp#1 one-way
//! throughput, Exp#2 ping-pong latency and the Table II ablation over shm,
//! next to raw fabric WRITE, memcpy and an in-process `rtrb` SPSC queue.
//!
//! Sender and receiver are TWO PROCESSES: the suite (receiver / ping-pong
//! client) re-executes this binary with `--role tput-sender|echo` for the
//! peer, connected through a real shm connection (memfd regions,
//! Unix-socket handshake). Each side runs one busy thread pinned to its own
//! core; the suite names the peer's core (`--cpu`), since a child inherits
//! the suite's own one-core affinity and would otherwise pick that same core.
//! `--quick` keeps every experiment and variant but bounds ping-pong warm-up
//! by time too, so a smoke run takes seconds even where round trips are slow.
//! `--role target` is the idle peer of the raw-WRITE reference
//! (`rrpc_bench::fabric`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use rrpc_bench::fabric::{self, FabricPair};
use rrpc_bench::stats::{gib_per_s, rate};
use rrpc_bench::{Latency, PlotSpec, Ratio, Report, SuiteArgs, Table, ThreadPlan, Value};
use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use rrpc_core::{Fabric, FabricAddr, QpConfig};
use rrpc_ringbuf::{Error, LocalRing, RingConfig, RingRx, RingTx};

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    suite: SuiteArgs,
    /// Run only these experiments (comma-separated: exp1, exp2, table2); default all.
    #[arg(long)]
    only: Option<String>,
    /// Internal: `tput-sender`, `echo` (ring peers) or `target` (raw WRITE peer).
    #[arg(long, hide = true)]
    role: Option<String>,
    /// Internal: side-channel endpoint of the parent.
    #[arg(long, hide = true)]
    endpoint: Option<String>,
    /// Internal: message size in bytes.
    #[arg(long, hide = true, default_value_t = 64)]
    size: usize,
    /// Internal: milliseconds to send for (tput-sender).
    #[arg(long, hide = true, default_value_t = 0)]
    count: u64,
    /// Internal: ring variant (index into `variants()`).
    #[arg(long, hide = true, default_value_t = 0)]
    variant: usize,
    /// Internal: the CPU the peer pins its thread to (chosen by the parent: a child inherits
    /// the parent's single-CPU affinity, so it cannot work out "cpu 0 of the plan" itself).
    #[arg(long, hide = true)]
    cpu: Option<usize>,
}

/// Exp#1 sizes.
const SIZES: [usize; 5] = [64, 512, 4096, 65536, 1 << 20];

/// One Table II row: name, ring config, zero-copy send path, what the paper expects.
struct Variant {
    name: &'static str,
    cfg: RingConfig,
    zero_copy: bool,
}

fn variants() -> Result<Vec<Variant>> {
    let b = RingConfig::builder;
    let v = |name, cfg, zero_copy| Variant {
        name,
        cfg,
        zero_copy,
    };
    Ok(vec![
        v("M1 full RB2", RingConfig::default(), true),
        v("M2 - all batching", b().no_batching().build()?, true),
        v("M3 - sync-ahead (beta=alpha)", b().beta(32).build()?, true),
        v("M4 - elastic threshold", b().elastic(false).build()?, true),
        v("M5 - lazy push (gamma=1)", b().gamma(1).build()?, true),
        v("M6 - zero-copy (try_send)", RingConfig::default(), false),
        v(
            "M7 - cache-line alignment",
            b().cache_align(false).build()?,
            true,
        ),
        v("M8 - huge pages", b().huge_pages(false).build()?, true),
    ])
}

fn fabric_for(cfg: &RingConfig) -> Fabric {
    if cfg.huge_pages() {
        Fabric::shm()
    } else {
        Fabric::shm().without_huge_pages()
    }
}

/// Pins the calling thread to CPU `i` of the plan (the parent's view of the CPUs).
fn pin(i: usize) -> usize {
    let cpu = ThreadPlan::cpu(i);
    pin_exactly(cpu);
    cpu
}

/// Pins the calling thread to `cpu`, warning (not failing) if the system refuses.
fn pin_exactly(cpu: usize) {
    if let Err(e) = rrpc_bench::pin_current_thread(cpu) {
        eprintln!("ringbuf: warning: cannot pin to cpu {cpu}: {e}");
    }
}

/// The parent's half: listens, starts the peer process, accepts it.
struct Peer {
    child: Child,
    conn: Connection,
    tx: RingTx,
    rx: RingRx,
    huge: bool,
    dir: std::path::PathBuf,
}

impl Peer {
    fn start(role: &str, variant: usize, size: usize, count: u64) -> Result<Peer> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rrpc-bench-rb-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let uri = format!("shm://{}/s.sock", dir.display());
        let cfg = &variants()?[variant].cfg;
        let fabric = fabric_for(cfg);
        let listener = conn::Listener::bind(&FabricAddr::parse(&uri)?, HandshakeConfig::default())?;
        let local = LocalRing::new(&fabric, cfg)?;
        let huge = local.is_huge();
        let child = Command::new(std::env::current_exe()?)
            .args(["--role", role, "--endpoint", &uri])
            .args(["--size", &size.to_string(), "--count", &count.to_string()])
            .args(["--variant", &variant.to_string()])
            .args(["--cpu", &ThreadPlan::cpu(0).to_string()])
            .stdin(Stdio::null())
            .spawn()
            .context("starting the peer process")?;
        let conn = listener.accept()?.accept(
            fabric.create_qp(&QpConfig::default())?,
            local.add_to_offer(Offer::new()),
        )?;
        let (tx, rx) = local.connect(&conn)?;
        Ok(Peer {
            child,
            conn,
            tx,
            rx,
            huge,
            dir,
        })
    }

    fn finish(mut self) -> Result<()> {
        self.conn.close();
        let st = self.child.wait()?;
        if !st.success() {
            bail!("peer process failed: {st}");
        }
        Ok(())
    }
}

impl Drop for Peer {
    /// Also on error paths: no peer process or socket directory outlives the measurement.
    fn drop(&mut self) {
        let _ = self.child.kill(); // a no-op once `finish` has reaped it
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The child's half: dials the parent (retrying until it listens).
fn dial(endpoint: &str, cfg: &RingConfig) -> Result<(Connection, RingTx, RingRx)> {
    let ep = FabricAddr::parse(endpoint)?;
    let fabric = fabric_for(cfg);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let local = LocalRing::new(&fabric, cfg)?;
        let qp = fabric.create_qp(&QpConfig::default())?;
        match conn::connect(
            &ep,
            qp,
            local.add_to_offer(Offer::new()),
            &HandshakeConfig::default(),
        ) {
            Ok(c) => {
                let (tx, rx) = local.connect(&c)?;
                return Ok((c, tx, rx));
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Retries `$e` until it stops returning `WouldBlock`; checks the peer's
/// liveness now and then. A macro so the result may borrow the ring.
macro_rules! spin {
    ($c:expr, $e:expr) => {{
        let mut n = 0u32;
        loop {
            match $e {
                Ok(v) => break Ok::<_, anyhow::Error>(v),
                Err(Error::WouldBlock) => {
                    n = n.wrapping_add(1);
                    if n.is_multiple_of(1 << 16) {
                        if let Err(e) = $c.check_alive() {
                            break Err(anyhow::Error::from(e).context("peer gone"));
                        }
                    }
                    std::hint::spin_loop();
                }
                Err(e) => break Err(e.into()),
            }
        }
    }};
}

/// Child: sends messages of `size` bytes as fast as the ring takes them for
/// `millis`, then an empty end marker.
fn tput_sender(endpoint: &str, variant: usize, size: usize, millis: u64, cpu: usize) -> Result<()> {
    pin_exactly(cpu);
    let v = &variants()?[variant];
    let (c, mut tx, _rx) = dial(endpoint, &v.cfg)?;
    let payload = vec![0x5au8; size];
    let end = Instant::now() + Duration::from_millis(millis);
    let mut i = 0u64;
    while i & 63 != 0 || Instant::now() < end {
        i += 1;
        if v.zero_copy {
            // Zero-copy: the message is encoded in place in RB_S; here the
            // "encoding" stamps a sequence number at both ends.
            spin!(
                &c,
                tx.try_reserve(size).and_then(|mut g| {
                    stamp(&mut g, i);
                    g.commit()
                })
            )?;
        } else {
            // A middle layer hands over a finished buffer: one extra copy.
            spin!(&c, tx.try_send(&payload))?;
        }
    }
    spin!(&c, tx.try_send(&[]))?; // end marker
    tx.flush()?;
    while c.check_alive().is_ok() {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

#[inline]
fn stamp(buf: &mut [u8], i: u64) {
    let b = (i as u8) | 1;
    buf[0] = b;
    let l = buf.len();
    buf[l - 1] = b;
}

/// Child: echoes messages back until the empty end marker.
fn echo(endpoint: &str, variant: usize, cpu: usize) -> Result<()> {
    pin_exactly(cpu);
    let v = &variants()?[variant];
    let (c, mut tx, mut rx) = dial(endpoint, &v.cfg)?;
    loop {
        let m = spin!(&c, rx.try_recv())?;
        if m.is_empty() {
            break; // end marker
        }
        if v.zero_copy {
            let mut g = spin!(&c, tx.try_reserve(m.len()))?;
            g.copy_from_slice(&m);
            g.commit()?;
        } else {
            let copy = m.to_vec();
            spin!(&c, tx.try_send(&copy))?;
        }
        drop(m);
        tx.flush()?;
    }
    while c.check_alive().is_ok() {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Parent: receives for `dur` (until the sender's empty end marker);
/// returns (msgs/s, GiB/s) from the first to the last message.
fn throughput(variant: usize, size: usize, dur: Duration) -> Result<(f64, f64, bool)> {
    let mut p = Peer::start("tput-sender", variant, size, dur.as_millis() as u64)?;
    let zero_copy = variants()?[variant].zero_copy;
    let mut sink = 0u64;
    let mut t0 = Instant::now();
    let mut n = 0u64;
    loop {
        let m = spin!(&p.conn, p.rx.try_recv())?;
        if m.is_empty() {
            break;
        }
        n += 1;
        if n == 1 {
            t0 = Instant::now();
        }
        anyhow::ensure!(m.len() == size, "message {n}: {} bytes", m.len());
        if zero_copy {
            let want = (n as u8) | 1;
            anyhow::ensure!(m[0] == want && m[size - 1] == want, "message {n} stamp");
        }
        sink = sink.wrapping_add(u64::from(m[size / 2]));
    }
    let el = t0.elapsed();
    std::hint::black_box(sink);
    let huge = p.huge;
    p.finish()?;
    let n = n - 1; // timed from the first message's arrival
    Ok((rate(n, el), gib_per_s(n * size as u64, el), huge))
}

/// Parent: ping-pong client; returns the round-trip latency distribution.
///
/// Runs `rounds / 4` warm-up rounds, then up to `rounds` measured ones, stopping once `dur` has
/// passed. With `quick`, the warm-up also ends after `dur / 4` and the clock is read more often,
/// so a host where round trips take a scheduler tick (both processes on one core) still finishes
/// a smoke run in about `dur`.
fn pingpong(
    variant: usize,
    size: usize,
    rounds: u64,
    dur: Duration,
    quick: bool,
) -> Result<Latency> {
    let mut warm = rounds / 4;
    let mut p = Peer::start("echo", variant, size, 0)?;
    let msg = vec![1u8; size];
    let mut lat = Latency::new();
    let start = Instant::now();
    let end = start + dur;
    let (warm_end, mask) = if quick {
        (start + dur / 4, 15)
    } else {
        (end, 255)
    };
    for i in 0..rounds + warm {
        if quick && i < warm && i & mask == 0 && Instant::now() > warm_end {
            warm = i;
        }
        if i > warm && i & mask == 0 && Instant::now() > end {
            break;
        }
        let t = Instant::now();
        spin!(&p.conn, p.tx.try_send(&msg))?;
        p.tx.flush()?;
        let m = spin!(&p.conn, p.rx.try_recv())?;
        std::hint::black_box(m[0]);
        drop(m);
        if i >= warm {
            lat.record(t.elapsed());
        }
    }
    spin!(&p.conn, p.tx.try_send(&[]))?; // end marker
    p.tx.flush()?;
    p.finish()?;
    Ok(lat)
}

/// In-process rtrb SPSC of 64-byte elements, two pinned threads: msgs/s.
fn rtrb_rate(n: u64) -> f64 {
    let (mut p, mut c) = rtrb::RingBuffer::<[u8; 64]>::new(65536);
    let cons = std::thread::spawn(move || {
        pin(1);
        let mut got = 0;
        while got < n {
            if let Ok(v) = c.pop() {
                std::hint::black_box(v);
                got += 1;
            }
        }
    });
    pin(0);
    let t0 = Instant::now();
    for i in 0..n {
        let mut v = [0u8; 64];
        v[0] = i as u8;
        while p.push(v).is_err() {
            std::hint::spin_loop();
        }
    }
    cons.join().expect("rtrb consumer");
    rate(n, t0.elapsed())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let ep = cli.endpoint.as_deref().unwrap_or_default();
    let peer_cpu = cli.cpu.unwrap_or_else(|| ThreadPlan::cpu(0));
    match cli.role.as_deref() {
        Some("tput-sender") => {
            return tput_sender(ep, cli.variant, cli.size, cli.count, peer_cpu);
        }
        Some("echo") => return echo(ep, cli.variant, peer_cpu),
        Some("target") => return fabric::run_target(ep),
        Some(other) => bail!("unknown role {other}"),
        None => {}
    }
    let args = cli.suite.clone();
    let mut report = Report::new("ringbuf", &args)?;
    let (c0, c1) = (ThreadPlan::cpu(0), ThreadPlan::cpu(1));
    let plan = ThreadPlan::new()
        .side("sender/echo process", 1, Some(vec![c0]))
        .side("receiver/client process (the suite)", 1, Some(vec![c1]));
    report.machine_mut().provider = "shm".into();
    report.machine_mut().pinning = plan.describe();
    eprintln!("ringbuf: two processes, {}", plan.describe());
    pin(1);
    let dur = args.duration(Duration::from_millis(150), Duration::from_secs(1));
    let vs = variants()?;
    let want = |e: &str| {
        cli.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|x| x == e))
    };

    let rounds = args.pick(20_000u64, 200_000);
    let mut huge = false;
    if want("exp1") {
        let mut e1 = Table::new(
            "exp1_throughput",
            "RB² Exp#1: one-way throughput between two processes vs raw WRITE and memcpy",
            &[
                "size_B",
                "zc_msgs_per_s",
                "zc_gib_s",
                "copy_gib_s",
                "raw_write_gib_s",
                "memcpy_gib_s",
                "zc_x_vs_memcpy",
                "zc_x_vs_write",
            ],
        );
        let raw = FabricPair::with_child()?;
        let bar = args.progress(SIZES.len() as u64, "exp1");
        let mut zc64 = 0.0;
        for &s in &SIZES {
            bar.set_message(format!("{s} B"));
            let (mps, zc, h) = throughput(0, s, dur)?;
            huge = h;
            let (_, copy, _) = throughput(5, s, dur)?;
            let (wops, wel) = fabric::write_throughput(&raw, s, dur)?;
            let (mops, mel) = fabric::memcpy_throughput(s, dur);
            let (w, m) = (
                gib_per_s(wops * s as u64, wel),
                gib_per_s(mops * s as u64, mel),
            );
            if s == 64 {
                zc64 = mps;
            }
            e1.push(vec![
                Value::from(s),
                Value::from(mps),
                Value::from(zc),
                Value::from(copy),
                Value::from(w),
                Value::from(m),
                Value::from(Ratio::of(zc, m)),
                Value::from(Ratio::of(zc, w)),
            ]);
            bar.inc(1);
        }
        bar.finish_and_clear();
        drop(raw);
        e1.note(plan.describe());
        e1.note(format!(
        "ring 4 MiB of 64 B slots, alpha/beta/gamma = 32/16/32, huge pages: {huge}; zc = try_reserve + stamp both ends + commit (the transport's one fabric copy), copy = try_send from a user buffer (+1 memcpy); receiver reads the message in place; time-bound: the sender sends for one point's duration, then an empty end marker; timed at the receiver from the first to the last message"
    ));
        e1.note(format!(
        "raw WRITE and memcpy: rrpc_bench::fabric over an {} MiB window, {} per point, same run",
        fabric::TARGET_LEN >> 20,
        if args.quick { "150 ms" } else { "1 s" }
    ));
        e1.plot(
            PlotSpec::lines("size_B", &["zc_gib_s", "raw_write_gib_s", "memcpy_gib_s"])
                .log_x()
                .x_label("message size (B)")
                .y_label("GiB/s"),
        );
        report.add(e1)?;

        let rt = rtrb_rate(args.pick(5_000_000, 50_000_000));
        pin(1);
        let mut rr = Table::new(
            "reference_rtrb_64b",
            "64 B message rate: RB² between two processes vs rtrb between two threads",
            &["rb2_msgs_per_s", "rtrb_msgs_per_s", "x_vs_rtrb"],
        );
        rr.push(vec![
            Value::from(zc64),
            Value::from(rt),
            Value::from(Ratio::of(zc64, rt)),
        ]);
        rr.note(plan.describe());
        rr.note("rtrb: [u8; 64] elements, 65536 capacity, producer and consumer threads pinned like the ring's processes; target x_vs_rtrb >= 0.5");
        report.add(rr)?;
    }

    if want("exp2") {
        let mut e2 = Table::new(
            "exp2_pingpong",
            "RB² Exp#2: ping-pong round trip between two processes (send + flush, echo, receive)",
            &["size_B", "mean_us", "p50_us", "p99_us", "p999_us", "rounds"],
        );
        for &s in &SIZES {
            let r = if s >= 65536 { rounds / 20 } else { rounds };
            let l = pingpong(0, s, r, dur * 2, args.quick)?.summary();
            e2.push(vec![
                Value::from(s),
                Value::from(l.mean_ns / 1e3),
                Value::from(l.p50_us()),
                Value::from(l.p99_us()),
                Value::from(l.p999_ns as f64 / 1e3),
                Value::from(l.count),
            ]);
        }
        e2.note(plan.describe());
        e2.note("each sample includes one Instant::now() pair; the echo side answers with try_reserve + copy + commit + flush");
        report.add(e2)?;
    }

    if want("table2") {
        let mut t2 = Table::new(
            "table2_ablation",
            "RB² Table II ablation: each row removes one technique from M1",
            &[
                "variant",
                "small_512B_gbps",
                "small_x_vs_m1",
                "large_1MiB_gbps",
                "large_x_vs_m1",
                "pingpong_512B_mean_us",
                "lat_x_vs_m1",
                "paper_direction",
            ],
        );
        let bar = args.progress(vs.len() as u64, "ablation");
        let mut base = (0.0, 0.0, 0.0);
        for (i, v) in vs.iter().enumerate() {
            bar.set_message(v.name);
            let (_, small, _) = throughput(i, 512, dur)?;
            let (_, large, h) = throughput(i, 1 << 20, dur)?;
            if i == 0 {
                huge = h;
            }
            let lat = pingpong(i, 512, rounds / 2, dur, args.quick)?
                .summary()
                .mean_ns
                / 1e3;
            let (small, large) = (small * 8.0 * 1.073_741_824, large * 8.0 * 1.073_741_824);
            if i == 0 {
                base = (small, large, lat);
            }
            // The paper: removing any technique lowers throughput or raises latency.
            let dir = if i == 0 {
                "-".to_owned()
            } else {
                let worse = [
                    (small < base.0 * 0.95, "small"),
                    (large < base.1 * 0.95, "large"),
                    (lat > base.2 * 1.05, "latency"),
                ];
                let hit: Vec<&str> = worse.iter().filter(|w| w.0).map(|w| w.1).collect();
                if hit.is_empty() {
                    "no (within 5 %)".to_owned()
                } else {
                    format!("yes: worse {}", hit.join(", "))
                }
            };
            t2.push(vec![
                Value::from(v.name),
                Value::from(small),
                Value::from(Ratio::of(small, base.0)),
                Value::from(large),
                Value::from(Ratio::of(large, base.1)),
                Value::from(lat),
                Value::from(Ratio::of(lat, base.2)),
                Value::from(dir),
            ]);
            bar.inc(1);
        }
        bar.finish_and_clear();
        t2.note(plan.describe());
        t2.note("Gbps = 1e9 bit/s; paper_direction: 'yes' if the row is >5 % worse than M1 in small or large throughput or in latency (the paper's direction), else 'no'");
        t2.note(
            "huge pages on this host: shm regions report huge = ".to_owned() + &huge.to_string(),
        );
        report.add(t2)?;
    }
    report.finish()
}
