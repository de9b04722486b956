//! RB² ring-buffer suite: Exp#1 throughput, Exp#2 ping-pong latency and the
//! Table II ablation over shm, with raw fabric WRITE, memcpy and an
//! in-process `rtrb` SPSC queue as references.
//!
//! Usage: `ringbuf [--quick] [--out DIR]`. Sender and receiver run on two
//! threads pinned to CPUs 0 and 1, connected through a real shm connection
//! (memfd regions, Unix-socket handshake); both ends live in one process.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rrpc_core::conn::{self, HandshakeConfig, Offer};
use rrpc_core::{Completion, Endpoint, Fabric, Local, QpConfig};
use rrpc_ringbuf::{Error, LocalRing, RingConfig, RingRx, RingTx};

struct Args {
    quick: bool,
    out: Option<PathBuf>,
}

fn args() -> Args {
    let mut a = Args {
        quick: false,
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(s) = it.next() {
        match s.as_str() {
            "--quick" => a.quick = true,
            "--out" => a.out = it.next().map(PathBuf::from),
            _ => {}
        }
    }
    a
}

fn pin(cpu: usize) {
    let _ = rrpc_bench::pin_current_thread(cpu);
}

type Side = (conn::Connection, RingTx, RingRx);

/// One shm connection with a ring in each direction.
fn pair(cfg: &RingConfig, tag: &str) -> Result<(Side, Side)> {
    let dir = std::env::temp_dir().join(format!("rrpc-bench-rb-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ep = Endpoint::parse(&format!("shm://{}/s.sock", dir.display()))?;
    let fabric = if cfg.huge_pages() {
        Fabric::shm()
    } else {
        Fabric::shm().without_huge_pages()
    };
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default())?;
    let (f2, c2) = (fabric.clone(), cfg.clone());
    let server = std::thread::spawn(move || -> Result<Side> {
        let local = LocalRing::new(&f2, &c2)?;
        let inc = listener.accept()?;
        let c = inc.accept(
            f2.create_qp(&QpConfig::default())?,
            local.add_to_offer(Offer::new()),
        )?;
        let (tx, rx) = local.connect(&c)?;
        Ok((c, tx, rx))
    });
    let local = LocalRing::new(&fabric, cfg)?;
    let c = conn::connect(
        &ep,
        fabric.create_qp(&QpConfig::default())?,
        local.add_to_offer(Offer::new()),
        &HandshakeConfig::default(),
    )?;
    let (tx, rx) = local.connect(&c)?;
    let s = server.join().unwrap()?;
    Ok(((c, tx, rx), s))
}

/// Exp#1: one-way throughput; returns (messages/s, GB/s).
fn throughput(
    cfg: &RingConfig,
    size: usize,
    total_bytes: usize,
    zero_copy: bool,
    tag: &str,
) -> Result<(f64, f64)> {
    let n = (total_bytes / size).max(64) as u64;
    let ((_c1, mut tx, _r1), (_c2, _t2, mut rx)) = pair(cfg, tag)?;
    let start = Arc::new(Barrier::new(2));
    let s2 = start.clone();
    let recv = std::thread::spawn(move || -> Result<Duration> {
        pin(1);
        s2.wait();
        let t0 = Instant::now();
        let mut got = 0u64;
        let mut sink = 0u64;
        while got < n {
            match rx.try_recv() {
                Ok(m) => {
                    if zero_copy {
                        sink = sink.wrapping_add(u64::from(m[0]) + u64::from(m[m.len() - 1]));
                    } else {
                        let v = m.to_vec();
                        sink = sink.wrapping_add(u64::from(v[0]));
                    }
                    got += 1;
                }
                Err(Error::WouldBlock) => std::hint::spin_loop(),
                Err(e) => return Err(e.into()),
            }
        }
        std::hint::black_box(sink);
        Ok(t0.elapsed())
    });
    pin(0);
    let payload = vec![0x5au8; size];
    start.wait();
    for _ in 0..n {
        loop {
            let r = if zero_copy {
                tx.try_reserve(size).and_then(|mut g| {
                    g[0] = 1;
                    let l = g.len();
                    g[l - 1] = 2;
                    if size > 64 {
                        g.copy_from_slice(&payload); // "encode" straight into RB_S
                    }
                    g.commit()
                })
            } else {
                let staged = payload.clone(); // the middle layer's copy
                tx.try_send(&staged)
            };
            match r {
                Ok(()) => break,
                Err(Error::WouldBlock) => std::hint::spin_loop(),
                Err(e) => return Err(e.into()),
            }
        }
    }
    tx.flush()?;
    let el = recv.join().unwrap()?.as_secs_f64();
    Ok((n as f64 / el, (n as usize * size) as f64 / el / 1e9))
}

/// Exp#2: ping-pong round trips; returns (avg µs, p99.9 µs).
fn pingpong(cfg: &RingConfig, size: usize, rounds: u64, tag: &str) -> Result<(f64, f64)> {
    let ((_c1, mut ctx, mut crx), (_c2, mut stx, mut srx)) = pair(cfg, tag)?;
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let server = std::thread::spawn(move || -> Result<()> {
        pin(1);
        let mut buf = vec![0u8; size];
        while !st.load(Ordering::Relaxed) {
            match srx.try_recv() {
                Ok(m) => {
                    buf.copy_from_slice(&m);
                    drop(m);
                    while let Err(e) = stx.try_send(&buf) {
                        anyhow::ensure!(matches!(e, Error::WouldBlock), "{e}");
                    }
                    stx.flush()?;
                }
                Err(Error::WouldBlock) => std::hint::spin_loop(),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    });
    pin(0);
    let msg = vec![1u8; size];
    let mut h = hdrhistogram::Histogram::<u64>::new(3)?;
    let warm = rounds / 3;
    for i in 0..rounds + warm {
        let t0 = Instant::now();
        while let Err(e) = ctx.try_send(&msg) {
            anyhow::ensure!(matches!(e, Error::WouldBlock), "{e}");
        }
        ctx.flush()?;
        loop {
            match crx.try_recv() {
                Ok(m) => {
                    std::hint::black_box(m[0]);
                    break;
                }
                Err(Error::WouldBlock) => std::hint::spin_loop(),
                Err(e) => return Err(e.into()),
            }
        }
        if i >= warm {
            h.record(t0.elapsed().as_nanos() as u64)?;
        }
    }
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap()?;
    Ok((h.mean() / 1e3, h.value_at_quantile(0.999) as f64 / 1e3))
}

/// Reference: raw fabric WRITE of `size` bytes back to back (signaled every 64).
fn raw_write(size: usize, total: usize) -> Result<f64> {
    let fabric = Fabric::shm();
    let dir = std::env::temp_dir().join(format!("rrpc-bench-raw-{}-{size}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ep = Endpoint::parse(&format!("shm://{}/s.sock", dir.display()))?;
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default())?;
    let f2 = fabric.clone();
    let server = std::thread::spawn(move || -> Result<_> {
        let inbox = f2.alloc_region(size.max(4096))?;
        let c = listener.accept()?.accept(
            f2.create_qp(&QpConfig::default())?,
            Offer::new().grant(1, inbox.clone()),
        )?;
        Ok((c, inbox))
    });
    let src = fabric.alloc_region(size.max(4096))?;
    let c = conn::connect(
        &ep,
        fabric.create_qp(&QpConfig::default())?,
        Offer::new(),
        &HandshakeConfig::default(),
    )?;
    let _keep = server.join().unwrap()?;
    let remote = c.peer().region(1).context("grant")?;
    let n = (total / size).max(64) as u64;
    let mut wc = [Completion::EMPTY; 16];
    pin(0);
    let t0 = Instant::now();
    for i in 0..n {
        let sig = i % 64 == 63;
        c.qp()
            .post_write(i, Local::new(&src, 0, size), remote.at(0), sig)?;
        if sig {
            while c.qp().send_cq().poll(&mut wc)? == 0 {}
        }
    }
    Ok((n as usize * size) as f64 / t0.elapsed().as_secs_f64() / 1e9)
}

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
    for _ in 0..n {
        while p.push([7u8; 64]).is_err() {}
    }
    cons.join().unwrap();
    n as f64 / t0.elapsed().as_secs_f64()
}

fn memcpy_gbs(size: usize, total: usize) -> f64 {
    let src = vec![1u8; size];
    let mut dst = vec![0u8; size];
    let n = (total / size).max(16);
    let t0 = Instant::now();
    for _ in 0..n {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    (n * size) as f64 / t0.elapsed().as_secs_f64() / 1e9
}

fn emit(out: &Option<PathBuf>, name: &str, header: &[&str], rows: &[Vec<String>]) -> Result<()> {
    println!("\n### {name}\n");
    println!("| {} |", header.join(" | "));
    println!(
        "|{}|",
        header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
    );
    for r in rows {
        println!("| {} |", r.join(" | "));
    }
    if let Some(dir) = out {
        std::fs::create_dir_all(dir)?;
        let mut f = std::fs::File::create(dir.join(format!("{name}.csv")))?;
        writeln!(f, "{}", header.join(","))?;
        for r in rows {
            writeln!(f, "{}", r.join(","))?;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let a = args();
    let total = if a.quick { 64 << 20 } else { 1 << 30 };
    let rounds = if a.quick { 20_000 } else { 300_000 };
    println!(
        "# RB² ring buffer (shm)\n\nthreads pinned: sender/client on CPU 0, receiver/server on CPU 1 (two cores, one each; both ends in one process over a real shm connection). quick = {}",
        a.quick
    );
    let full = RingConfig::default();

    let sizes = [64usize, 512, 4096, 65536, 1 << 20];
    let mut rows = Vec::new();
    for &s in &sizes {
        let (mps, gbs) = throughput(&full, s, total, true, &format!("t{s}"))?;
        let raw = raw_write(s, total)?;
        let mc = memcpy_gbs(s, total);
        rows.push(vec![
            s.to_string(),
            format!("{:.0}", mps),
            format!("{gbs:.2}"),
            format!("{raw:.2}"),
            format!("{mc:.2}"),
            format!("{:.2}", gbs / mc),
        ]);
    }
    emit(
        &a.out,
        "exp1_throughput",
        &[
            "size_B",
            "msgs_per_s",
            "rb2_GB_s",
            "raw_write_GB_s",
            "memcpy_GB_s",
            "rb2_over_memcpy",
        ],
        &rows,
    )?;
    let rt = rtrb_rate(if a.quick { 5_000_000 } else { 50_000_000 });
    let rb64 = rows[0][1].parse::<f64>().unwrap_or(0.0);
    emit(
        &a.out,
        "reference_rtrb_64B",
        &["rtrb_msgs_per_s", "rb2_64B_msgs_per_s", "ratio"],
        &[vec![
            format!("{rt:.0}"),
            format!("{rb64:.0}"),
            format!("{:.2}", rb64 / rt),
        ]],
    )?;

    let mut rows = Vec::new();
    for &s in &sizes {
        let (avg, p999) = pingpong(&full, s, rounds, &format!("p{s}"))?;
        rows.push(vec![
            s.to_string(),
            format!("{avg:.2}"),
            format!("{p999:.2}"),
        ]);
    }
    emit(
        &a.out,
        "exp2_pingpong",
        &["size_B", "avg_us", "p99_9_us"],
        &rows,
    )?;

    let b = RingConfig::builder;
    let variants: Vec<(&str, RingConfig, bool)> = vec![
        ("M1 full RB2", full.clone(), true),
        ("M2 - all batching", b().no_batching().build()?, true),
        ("M3 - sync-ahead (beta=alpha)", b().beta(32).build()?, true),
        ("M4 - elastic threshold", b().elastic(false).build()?, true),
        ("M5 - lazy push (gamma=1)", b().gamma(1).build()?, true),
        ("M6 - zero-copy", full.clone(), false),
        (
            "M7 - cache-line alignment",
            b().cache_align(false).build()?,
            true,
        ),
        ("M8 - huge pages", b().huge_pages(false).build()?, true),
    ];
    let mut rows = Vec::new();
    for (i, (name, cfg, zc)) in variants.iter().enumerate() {
        let (_, small) = throughput(cfg, 512, total, *zc, &format!("a{i}s"))?;
        let (_, large) = throughput(cfg, 1 << 20, total, *zc, &format!("a{i}l"))?;
        let (lat, _) = pingpong(cfg, 512, rounds / 4, &format!("a{i}p"))?;
        rows.push(vec![
            name.to_string(),
            format!("{:.2}", small * 8.0),
            format!("{:.2}", large * 8.0),
            format!("{lat:.2}"),
        ]);
    }
    emit(
        &a.out,
        "table2_ablation",
        &[
            "variant",
            "small_512B_Gbps",
            "large_1MiB_Gbps",
            "pingpong_512B_avg_us",
        ],
        &rows,
    )?;
    Ok(())
}
