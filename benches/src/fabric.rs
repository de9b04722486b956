//! The fabric suite: raw shm WRITE throughput and latency between two processes, next to a
//! plain `memcpy` of the same sizes in the same run (the physical limit for this provider).
//!
//! Used by `src/bin/fabric.rs` (the suite), `src/bin/fabric-demo.rs` and the criterion bench
//! `benches/fabric.rs` ([`FabricPair::in_process`]).

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rrpc_core::conn::{self, Connection, HandshakeConfig, Offer};
use rrpc_core::{Completion, Fabric, FabricAddr, Local, QpConfig, Region, RemoteRegion};

use crate::stats::{gib_per_s, rate};
use crate::{Latency, PlotSpec, Ratio, Report, SuiteArgs, Table, ThreadPlan, Value};

/// Role under which the target side's region is granted.
pub const TARGET_ROLE: u16 = 1;
/// Size of the target's region: writes cycle through it, and so does the memcpy baseline.
pub const TARGET_LEN: usize = 8 << 20;
/// Message sizes of the suite (64 B, 4 KiB, 1 MiB).
pub const SIZES: [usize; 3] = [64, 4096, 1 << 20];

/// A connected writer: a local source region and the peer's granted target region.
#[derive(Debug)]
pub struct FabricPair {
    /// The writer's connection (its QP posts the WRITEs).
    pub conn: Connection,
    /// Local source region (`TARGET_LEN` bytes).
    pub src: Arc<Region>,
    /// The peer's region.
    pub remote: RemoteRegion,
    child: Option<Child>,
    keep: Option<(Connection, Arc<Region>)>,
    dir: PathBuf,
}

fn temp_endpoint(tag: &str) -> Result<(PathBuf, FabricAddr)> {
    let dir = std::env::temp_dir().join(format!("rrpc-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ep = FabricAddr::parse(&format!("shm://{}/fabric.sock", dir.display()))?;
    Ok((dir, ep))
}

fn connect_writer(
    fabric: &Fabric,
    ep: &FabricAddr,
) -> Result<(Connection, Arc<Region>, RemoteRegion)> {
    let src = fabric.alloc_region(TARGET_LEN)?;
    let qp = fabric.create_qp(&QpConfig::default())?;
    let c = conn::connect(ep, qp, Offer::new(), &HandshakeConfig::default())?;
    let remote = c
        .peer()
        .region(TARGET_ROLE)
        .context("target granted no region")?;
    Ok((c, src, remote))
}

impl FabricPair {
    /// Both sides in this process (the target side accepts on a helper thread and stays idle).
    ///
    /// # Errors
    /// Fabric or handshake errors.
    pub fn in_process() -> Result<Self> {
        let (dir, ep) = temp_endpoint("inproc")?;
        let fabric = Fabric::shm();
        let listener = conn::Listener::bind(&ep, HandshakeConfig::default())?;
        let f2 = fabric.clone();
        let server = std::thread::spawn(move || -> Result<(Connection, Arc<Region>)> {
            let target = f2.alloc_region(TARGET_LEN)?;
            let incoming = listener.accept()?;
            let qp = f2.create_qp(&QpConfig::default())?;
            let c = incoming.accept(qp, Offer::new().grant(TARGET_ROLE, target.clone()))?;
            Ok((c, target))
        });
        let (conn, src, remote) = connect_writer(&fabric, &ep)?;
        let keep = server
            .join()
            .map_err(|_| anyhow::anyhow!("target thread panicked"))??;
        Ok(FabricPair {
            conn,
            src,
            remote,
            child: None,
            keep: Some(keep),
            dir,
        })
    }

    /// The target side in a child process: re-executes the current binary as
    /// `<exe> --role target --endpoint shm://...` (see [`run_target`]).
    ///
    /// # Errors
    /// If the child cannot be started, does not get ready, or the handshake fails.
    pub fn with_child() -> Result<Self> {
        let (dir, ep) = temp_endpoint("child")?;
        let uri = format!("shm://{}/fabric.sock", dir.display());
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--role", "target", "--endpoint", &uri])
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .context("starting the target process")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        if !line.starts_with("READY") {
            let _ = child.kill();
            bail!("target process did not get ready: {line:?}");
        }
        let (conn, src, remote) = connect_writer(&Fabric::shm(), &ep)?;
        Ok(FabricPair {
            conn,
            src,
            remote,
            child: Some(child),
            keep: None,
            dir,
        })
    }

    /// Posts one WRITE of `len` bytes from source offset `off` to target offset `off`.
    ///
    /// # Errors
    /// Whatever `post_write` returns.
    #[inline]
    pub fn write(
        &self,
        wr_id: u64,
        off: usize,
        len: usize,
        signaled: bool,
    ) -> rrpc_core::Result<()> {
        self.conn.qp().post_write(
            wr_id,
            Local::new(&self.src, off, len),
            self.remote.at(off as u64),
            signaled,
        )
    }

    /// Polls the send CQ until `n` completions arrived.
    ///
    /// # Errors
    /// A poll error or a completion with an error status.
    #[inline]
    pub fn reap(&self, mut n: usize, wc: &mut [Completion]) -> Result<()> {
        while n > 0 {
            let got = self.conn.qp().send_cq().poll(wc)?;
            for c in &wc[..got] {
                if c.status != rrpc_core::Status::Success {
                    bail!("completion {} failed: {:?}", c.wr_id, c.status);
                }
            }
            n = n.saturating_sub(got);
        }
        Ok(())
    }
}

impl Drop for FabricPair {
    fn drop(&mut self) {
        self.conn.close();
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        self.keep.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The command line of the fabric binaries (`fabric`, `fabric-demo`): the suite's
/// arguments, or the internal target role.
#[derive(clap::Parser, Debug)]
pub struct Cli {
    #[command(flatten)]
    suite: SuiteArgs,
    /// Internal: `target` runs the idle peer that grants the written region.
    #[arg(long, hide = true)]
    role: Option<String>,
    /// Internal: the target's side-channel endpoint.
    #[arg(long, hide = true)]
    endpoint: Option<String>,
}

/// The `main` of the fabric binaries: the target role when asked for, else the suite
/// (always `--quick` when `quick`), reported under `suite`.
///
/// # Errors
/// As [`run_target`], [`run_suite`] and writing the report.
pub fn main(suite: &str, quick: bool) -> Result<()> {
    let mut cli = <Cli as clap::Parser>::parse();
    if cli.role.as_deref() == Some("target") {
        return run_target(cli.endpoint.as_deref().unwrap_or_default());
    }
    cli.suite.quick |= quick;
    let mut report = Report::new(suite, &cli.suite)?;
    run_suite(&cli.suite, &mut report)?;
    report.finish()
}

/// The target process: binds `endpoint`, prints `READY`, accepts one writer, grants a
/// `TARGET_LEN` region and idles (0 busy threads) until the writer goes away.
///
/// # Errors
/// Bind, accept or handshake errors.
pub fn run_target(endpoint: &str) -> Result<()> {
    let ep = FabricAddr::parse(endpoint)?;
    let fabric = Fabric::shm();
    let target = fabric.alloc_region(TARGET_LEN)?;
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default())?;
    println!("READY");
    use std::io::Write as _;
    std::io::stdout().flush()?;
    let incoming = listener.accept()?;
    let qp = fabric.create_qp(&QpConfig::default())?;
    let c = incoming.accept(qp, Offer::new().grant(TARGET_ROLE, target))?;
    while c.check_alive().is_ok() {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Offsets cycle through the target region in steps of `len` (shared by fabric and memcpy).
#[inline]
fn offset(i: u64, len: usize) -> usize {
    let slots = (TARGET_LEN / len).max(1) as u64;
    ((i % slots) as usize) * len
}

/// Throughput of a single-thread `memcpy` (`copy_from_slice`) of `len` bytes, `TARGET_LEN`
/// window, for `dur`. Returns (ops, elapsed).
pub fn memcpy_throughput(len: usize, dur: Duration) -> (u64, Duration) {
    let src = vec![0x5au8; TARGET_LEN];
    let mut dst = vec![0u8; TARGET_LEN];
    let batch = (TARGET_LEN / len).clamp(1, 4096) as u64;
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < dur {
        for _ in 0..batch {
            let off = offset(i, len);
            dst[off..off + len].copy_from_slice(&src[off..off + len]);
            i += 1;
        }
        std::hint::black_box(&mut dst);
    }
    (i, start.elapsed())
}

/// WRITE throughput: posts of `len` bytes, one signaled every 64, completions reaped as they
/// come, for `dur`. Returns (ops, elapsed).
///
/// # Errors
/// Fabric errors.
pub fn write_throughput(p: &FabricPair, len: usize, dur: Duration) -> Result<(u64, Duration)> {
    const SIGNAL_EVERY: u64 = 64;
    let mut wc = [Completion::EMPTY; 16];
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < dur {
        for _ in 0..SIGNAL_EVERY {
            let signaled = i % SIGNAL_EVERY == SIGNAL_EVERY - 1;
            p.write(i, offset(i, len), len, signaled)?;
            i += 1;
        }
        p.reap(1, &mut wc)?;
    }
    Ok((i, start.elapsed()))
}

/// Latency of one signaled WRITE plus polling its completion: per-op samples (each includes one
/// `Instant::now()` pair) and a batched mean over `batch` ops (no clock in the loop).
///
/// # Errors
/// Fabric errors.
pub fn write_latency(
    p: &FabricPair,
    len: usize,
    samples: u64,
    batch: u64,
) -> Result<(Latency, f64)> {
    let mut wc = [Completion::EMPTY; 4];
    let mut lat = Latency::new();
    for i in 0..samples {
        let t = Instant::now();
        p.write(i, offset(i, len), len, true)?;
        p.reap(1, &mut wc)?;
        lat.record(t.elapsed());
    }
    let t = Instant::now();
    for i in 0..batch {
        p.write(i, offset(i, len), len, true)?;
        p.reap(1, &mut wc)?;
    }
    Ok((lat, t.elapsed().as_nanos() as f64 / batch.max(1) as f64))
}

/// The cost of one `Instant::now()` pair (subtract mentally from per-op latency samples).
pub fn clock_overhead_ns() -> f64 {
    let n = 100_000u32;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(Instant::now());
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// Runs the whole fabric suite into `report`.
///
/// # Errors
/// Fabric, handshake or I/O errors.
pub fn run_suite(args: &SuiteArgs, report: &mut Report) -> Result<()> {
    let cpu = ThreadPlan::cpu(0);
    crate::pin_current_thread(cpu).context("pinning the writer thread")?;
    let plan = ThreadPlan::new()
        .side(
            "writer (and memcpy, run one after the other)",
            1,
            Some(vec![cpu]),
        )
        .side("target process (idle: WRITEs need no target CPU)", 0, None);
    report.machine_mut().provider = "shm".into();
    report.machine_mut().pinning = plan.describe();
    let pair = FabricPair::with_child()?;
    let dur = args.duration(Duration::from_millis(200), Duration::from_secs(2));
    let bar = args.progress(SIZES.len() as u64 * 2 + 1, "fabric");

    let mut thr = Table::new(
        "write_throughput",
        "shm WRITE throughput vs single-thread memcpy (same sizes, same run)",
        &[
            "size_B",
            "write_mops",
            "gib_s",
            "memcpy_mops",
            "memcpy_gib_s",
            "ratio_vs_memcpy",
        ],
    );
    for &len in &SIZES {
        bar.set_message(format!("write {len} B"));
        let (wops, wel) = write_throughput(&pair, len, dur)?;
        bar.inc(1);
        bar.set_message(format!("memcpy {len} B"));
        let (mops, mel) = memcpy_throughput(len, dur);
        bar.inc(1);
        let (wg, mg) = (
            gib_per_s(wops * len as u64, wel),
            gib_per_s(mops * len as u64, mel),
        );
        thr.push(vec![
            Value::from(len),
            Value::from(rate(wops, wel) / 1e6),
            Value::from(wg),
            Value::from(rate(mops, mel) / 1e6),
            Value::from(mg),
            Value::from(Ratio::of(wg, mg)),
        ]);
    }
    thr.note(plan.describe());
    thr.note(format!(
        "{} per point; WRITEs signaled 1 in 64; both sides cycle through an {} MiB window; target: 1 MiB WRITE >= 80 % of memcpy",
        humantime(dur),
        TARGET_LEN >> 20
    ));
    thr.plot(
        PlotSpec::lines("size_B", &["gib_s", "memcpy_gib_s"])
            .log_x()
            .x_label("message size (B)")
            .y_label("GiB/s"),
    );

    bar.set_message("latency");
    let (samples, batch) = args.pick((20_000, 100_000), (1_000_000, 5_000_000));
    let mut lat = Table::new(
        "write_latency",
        "shm WRITE + completion latency (post, then poll until its completion)",
        &[
            "size_B",
            "batched_mean_ns",
            "p50_ns",
            "p99_ns",
            "p999_ns",
            "samples",
        ],
    );
    for &len in &SIZES {
        let (l, mean) = write_latency(
            &pair,
            len,
            samples / if len > 4096 { 100 } else { 1 },
            batch / if len > 4096 { 100 } else { 1 },
        )?;
        let s = l.summary();
        lat.push(vec![
            Value::from(len),
            Value::from(mean),
            Value::from(s.p50_ns),
            Value::from(s.p99_ns),
            Value::from(s.p999_ns),
            Value::from(s.count),
        ]);
    }
    bar.inc(1);
    bar.finish_and_clear();
    lat.note(plan.describe());
    lat.note(format!(
        "per-op percentiles include one Instant::now() pair (~{:.0} ns here); batched_mean_ns has no clock in the loop; target: 64 B under 100 ns",
        clock_overhead_ns()
    ));
    report.add(thr)?;
    report.add(lat)?;
    drop(pair);
    Ok(())
}

fn humantime(d: Duration) -> String {
    if d.as_secs() >= 1 {
        format!("{} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}
