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
//!
//! The workload is single-threaded, takes no clock and does no I/O, so the count does not
//! depend on the machine's load.

use std::hint::black_box;

use anyhow::{Result, bail, ensure};
use clap::Parser;
use rrpc_tonic::frame::{self, END_STREAM, Kind};
use tonic::codegen::http::{HeaderMap, HeaderValue, StatusCode};

#[derive(Parser, Debug)]
struct Cli {
    /// The operation (`frame-unary`).
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

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.op.as_str() {
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
        other => bail!("unknown op {other:?} (frame-unary)"),
    }
    Ok(())
}
