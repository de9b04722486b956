//! The load generators the experiments drive their clients with: ping-pong ([`pingpong`]),
//! streaming with a window in flight ([`stream_throughput`]) and closed-loop unary calls
//! ([`unary_load`]), each measured over a window after a warm-up ([`Throughput`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use tokio::sync::mpsc;

use super::AnyClient;
use super::pb::Req;
use crate::Latency;

/// Ping-pong: `n` sequential unary calls of `req_len` bytes answered with `resp_len` bytes.
///
/// # Errors
/// A failed call.
pub async fn pingpong(
    c: &mut AnyClient,
    req_len: usize,
    resp_len: u32,
    warmup: u64,
    n: u64,
) -> Result<Latency> {
    let mut lat = Latency::new();
    for i in 0..warmup + n {
        let req = Req {
            payload: vec![1; req_len],
            resp_len,
        };
        let t = Instant::now();
        c.unary(req).await?;
        if i >= warmup {
            lat.record(t.elapsed());
        }
    }
    Ok(lat)
}

/// Result of a throughput run.
#[derive(Debug, Clone, Default)]
pub struct Throughput {
    /// Completed RPCs in the window.
    pub ops: u64,
    /// Window length.
    pub elapsed: Duration,
    /// Per-RPC latency (send to response, with `window` in flight).
    pub latency: Latency,
}

/// The load tasks' result: completed calls and their latencies while `counting` was set.
type LoadTask = tokio::task::JoinHandle<Result<(u64, Latency)>>;

/// Lets the load tasks warm up for `dur / 5`, counts for `dur`, stops them and sums up.
async fn measure_window(
    tasks: Vec<LoadTask>,
    counting: &AtomicBool,
    stop: &AtomicBool,
    dur: Duration,
) -> Result<Throughput> {
    tokio::time::sleep(dur / 5).await;
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(dur).await;
    counting.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut out = Throughput {
        elapsed,
        ..Default::default()
    };
    for t in tasks {
        let (ops, lat) = t.await??;
        out.ops += ops;
        out.latency.merge(&lat);
    }
    Ok(out)
}

/// Streaming throughput: `clients` connections, each one stream with `window` requests in
/// flight, for `dur`.
///
/// # Errors
/// A failed connect or stream.
pub async fn stream_throughput(
    clients: Vec<AnyClient>,
    req_len: usize,
    resp_len: u32,
    window: usize,
    dur: Duration,
) -> Result<Throughput> {
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let mut tasks: Vec<LoadTask> = Vec::new();
    for mut c in clients {
        let (stop, counting) = (stop.clone(), counting.clone());
        tasks.push(tokio::spawn(async move {
            let (tx, rx) = mpsc::channel(window * 2);
            let mut sent: VecDeque<Instant> = VecDeque::with_capacity(window);
            let req = Req {
                payload: vec![1; req_len],
                resp_len,
            };
            for _ in 0..window {
                tx.send(req.clone())
                    .await
                    .map_err(|_| anyhow!("stream closed"))?;
                sent.push_back(Instant::now());
            }
            let mut inbound = c.stream(rx).await?;
            let (mut ops, mut lat) = (0u64, Latency::new());
            while let Some(_r) = inbound.message().await? {
                let t0 = sent.pop_front().unwrap_or_else(Instant::now);
                if counting.load(Ordering::Relaxed) {
                    ops += 1;
                    lat.record(t0.elapsed());
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                tx.send(req.clone())
                    .await
                    .map_err(|_| anyhow!("stream closed"))?;
                sent.push_back(Instant::now());
            }
            drop(tx);
            Ok::<_, anyhow::Error>((ops, lat))
        }));
    }
    measure_window(tasks, &counting, &stop, dur).await
}

/// Closed-loop unary load: every client has one call in flight; with `interval`, a client
/// starts a call at most once per `interval` (a rate limiter; it does not catch up when a call
/// took longer). Runs `dur` after a 20 % warm-up.
///
/// tokio's timer has a 1 ms resolution, so intervals below 1 ms behave as 1 ms.
///
/// # Errors
/// A failed call.
pub async fn unary_load(
    clients: Vec<AnyClient>,
    req_len: usize,
    resp_len: u32,
    interval: Option<Duration>,
    dur: Duration,
) -> Result<Throughput> {
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let mut tasks: Vec<LoadTask> = Vec::new();
    for mut c in clients {
        let (stop, counting) = (stop.clone(), counting.clone());
        tasks.push(tokio::spawn(async move {
            let req = Req {
                payload: vec![1; req_len],
                resp_len,
            };
            let (mut ops, mut lat) = (0u64, Latency::new());
            let mut next = tokio::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                c.unary(req.clone()).await?;
                if counting.load(Ordering::Relaxed) {
                    ops += 1;
                    lat.record(t0.elapsed());
                }
                if let Some(iv) = interval {
                    next += iv;
                    let now = tokio::time::Instant::now();
                    if next < now {
                        next = now;
                    } else {
                        tokio::time::sleep_until(next).await;
                    }
                }
            }
            Ok::<_, anyhow::Error>((ops, lat))
        }));
    }
    measure_window(tasks, &counting, &stop, dur).await
}
