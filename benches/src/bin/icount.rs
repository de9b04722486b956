//! Instruction-count workloads for the sans-IO cores (rustls's habit: instruction counts are
//! stable on a noisy machine, where times are not).
//!
//! `icount --op OP --iters N` runs OP N times and exits; `cargo xtask bench check` runs it under
//! `valgrind --tool=callgrind` at two iteration counts and divides the difference of the
//! instruction totals by the difference of the counts: instructions per operation, start-up
//! and set-up cancelled out. Ops:
//!
//! - `frame-unary`: rrpc-tonic's fast-path wire format (`rrpc_tonic::frame`) for one unary
//!   call, both directions: the client encodes REQUEST_HEADERS (path, two metadata entries)
//!   and a 37-byte DATA with END_STREAM into one message, the server decodes and validates
//!   it; the server encodes RESPONSE_HEADERS, DATA and TRAILERS (`grpc-status: 0`), the client
//!   decodes them.
//! - `ring-64b`, `ring-4k`: the RB² ring (`rrpc_ringbuf`) over one in-process shm connection,
//!   one message of 64 B (4 KiB) per op, in bursts of 64: the writer reserves and fills it,
//!   commits, flushes at the end of a burst; the reader receives it and copies it out.
//! - `rtrb-64b`: the reference SPSC queue (`rtrb`), the same bursts of `[u8; 64]` pushed and
//!   popped on one thread. `memcpy-4k`: one 4 KiB `copy_from_slice` per op, the bytes' floor.
//!
//! The workloads are single-threaded and take no clock; the only I/O is the ring's
//! connection set-up, which the two iteration counts cancel. So the count does not depend on
//! the machine's load (the ring ratios timed between two processes on two shared cores moved
//! 20x from round to round; #54).

use std::hint::black_box;

use anyhow::{Result, bail, ensure};
use clap::Parser;
use rrpc_tonic::frame::{self, END_STREAM, Kind};
use tonic::codegen::http::{HeaderMap, HeaderValue, StatusCode};

#[derive(Parser, Debug)]
struct Cli {
    /// The operation (`frame-unary`, `ring-64b`, `ring-4k`, `rtrb-64b`, `memcpy-4k`).
    #[arg(long)]
    op: String,
    /// How many times.
    #[arg(long, default_value_t = 1000)]
    iters: u64,
}

fn frame_unary(req_meta: &HeaderMap, resp_meta: &HeaderMap, trailers: &HeaderMap) -> Result<()> {
    let body = [7u8; 37];
    // Client -> server: one ring message.
    let mut msg = Vec::with_capacity(256);
    let head = frame::request_headers_payload("/helloworld.Greeter/SayHello", "", req_meta);
    frame::push_frame(&mut msg, Kind::RequestHeaders, 0, 1, &head);
    frame::push_frame(&mut msg, Kind::Data, END_STREAM, 1, &body);
    let mut got = 0usize;
    for f in frame::frames(black_box(&msg)) {
        let f = f?;
        match f.kind {
            Kind::RequestHeaders => {
                let h = frame::parse_request_headers(f.payload)?;
                got += h.headers.len();
            }
            Kind::Data => got += f.payload.len(),
            k => bail!("unexpected {k:?}"),
        }
    }
    ensure!(got == 2 + body.len(), "decoded {got}");
    // Server -> client.
    let mut msg = Vec::with_capacity(256);
    let head = frame::response_headers_payload(StatusCode::OK, resp_meta);
    frame::push_frame(&mut msg, Kind::ResponseHeaders, 0, 1, &head);
    frame::push_frame(&mut msg, Kind::Data, 0, 1, &body);
    let tr = frame::metadata_payload(trailers);
    frame::push_frame(&mut msg, Kind::Trailers, END_STREAM, 1, &tr);
    let mut got = 0usize;
    for f in frame::frames(black_box(&msg)) {
        let f = f?;
        match f.kind {
            Kind::ResponseHeaders => got += frame::parse_response_headers(f.payload)?.1.len(),
            Kind::Data => got += f.payload.len(),
            Kind::Trailers => got += frame::parse_metadata(f.payload)?.len(),
            k => bail!("unexpected {k:?}"),
        }
    }
    ensure!(got == 1 + body.len() + 1, "decoded {got}");
    Ok(())
}

/// Messages per burst of the ring and rtrb ops.
const BURST: u64 = 64;

/// `n` messages of `size` bytes through an in-process RB² ring (`ring-64b`, `ring-4k`).
fn ring(size: usize, n: u64) -> Result<()> {
    use rrpc_core::conn::{self, HandshakeConfig, Offer};
    use rrpc_core::{Fabric, FabricAddr, QpConfig};
    use rrpc_ringbuf::{Error, LocalRing, RingConfig};

    let dir = std::env::temp_dir().join(format!("rrpc-icount-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ep = FabricAddr::parse(&format!("shm://{}/s.sock", dir.display()))?;
    let cfg = RingConfig::default();
    let fabric = Fabric::shm();
    let listener = conn::Listener::bind(&ep, HandshakeConfig::default())?;
    let (f2, c2) = (fabric.clone(), cfg.clone());
    let server = std::thread::spawn(move || -> Result<_> {
        let local = LocalRing::new(&f2, &c2)?;
        let c = listener.accept()?.accept(
            f2.create_qp(&QpConfig::default())?,
            local.add_to_offer(Offer::new()),
        )?;
        let (tx, rx) = local.connect(&c)?;
        Ok((c, tx, rx))
    });
    let local = LocalRing::new(&fabric, &cfg)?;
    let c = conn::connect(
        &ep,
        fabric.create_qp(&QpConfig::default())?,
        local.add_to_offer(Offer::new()),
        &HandshakeConfig::default(),
    )?;
    let (mut tx, _rx) = local.connect(&c)?;
    let (_c2, _tx2, mut rx) = server.join().expect("ring server thread")?;
    let _ = std::fs::remove_dir_all(&dir);
    let msg = vec![7u8; size];
    let mut out = vec![0u8; size];
    let (mut sent, mut got) = (0u64, 0u64);
    while got < n {
        let end = (sent + BURST).min(n);
        while sent < end {
            let mut g = tx.try_reserve(size)?;
            g.copy_from_slice(black_box(&msg));
            g.commit()?;
            sent += 1;
        }
        tx.flush()?;
        loop {
            match rx.try_recv() {
                Ok(m) => {
                    out.copy_from_slice(&m);
                    black_box(&out);
                    got += 1;
                }
                Err(Error::WouldBlock) => break,
                Err(e) => return Err(e.into()),
            }
        }
        ensure!(got == sent, "sent {sent}, received {got}");
    }
    Ok(())
}

/// `n` `[u8; 64]` through an `rtrb` queue on one thread, in bursts (`rtrb-64b`).
fn rtrb_64b(n: u64) -> Result<()> {
    let (mut p, mut c) = rtrb::RingBuffer::<[u8; 64]>::new(65536);
    let msg = [7u8; 64];
    let mut done = 0u64;
    while done < n {
        let end = (done + BURST).min(n);
        for _ in done..end {
            p.push(*black_box(&msg))?;
        }
        for _ in done..end {
            black_box(c.pop()?);
        }
        done = end;
    }
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.op.as_str() {
        "ring-64b" => ring(64, cli.iters)?,
        "ring-4k" => ring(4096, cli.iters)?,
        "rtrb-64b" => rtrb_64b(cli.iters)?,
        "memcpy-4k" => {
            let src = vec![7u8; 4096];
            let mut dst = vec![0u8; 4096];
            for _ in 0..cli.iters {
                dst.copy_from_slice(black_box(&src));
                black_box(&mut dst);
            }
        }
        "frame-unary" => {
            let mut req = HeaderMap::new();
            req.insert("content-type", HeaderValue::from_static("application/grpc"));
            req.insert("te", HeaderValue::from_static("trailers"));
            let mut resp = HeaderMap::new();
            resp.insert("content-type", HeaderValue::from_static("application/grpc"));
            let mut tr = HeaderMap::new();
            tr.insert("grpc-status", HeaderValue::from_static("0"));
            for _ in 0..cli.iters {
                frame_unary(black_box(&req), black_box(&resp), black_box(&tr))?;
            }
        }
        other => {
            bail!("unknown op {other:?} (frame-unary, ring-64b, ring-4k, rtrb-64b, memcpy-4k)")
        }
    }
    Ok(())
}
