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

/// What a load task sees of the measurement: whether its calls count yet, and whether
/// to stop; and what it has counted.
#[derive(Clone)]
struct Window {
    counting: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Window {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Counts a call started at `t0` (now done) if the window is open.
    fn record(&self, t0: Instant, ops: &mut u64, lat: &mut Latency) {
        if self.counting.load(Ordering::Relaxed) {
            *ops += 1;
            lat.record(t0.elapsed());
        }
    }
}

/// Runs `load` on every client as a task of its own, lets them warm up for `dur / 5`, counts
/// for `dur`, stops them and sums up what each counted (its calls and their latencies).
async fn measure<F, Fut>(clients: Vec<AnyClient>, dur: Duration, load: F) -> Result<Throughput>
where
    F: Fn(AnyClient, Window) -> Fut,
    Fut: std::future::Future<Output = Result<(u64, Latency)>> + Send + 'static,
{
    let w = Window {
        counting: Arc::new(AtomicBool::new(false)),
        stop: Arc::new(AtomicBool::new(false)),
    };
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|c| tokio::spawn(load(c, w.clone())))
        .collect();
    tokio::time::sleep(dur / 5).await;
    w.counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(dur).await;
    w.counting.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed();
    w.stop.store(true, Ordering::Relaxed);
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
    measure(clients, dur, move |mut c, w| async move {
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
            w.record(t0, &mut ops, &mut lat);
            if w.stopped() {
                break;
            }
            tx.send(req.clone())
                .await
                .map_err(|_| anyhow!("stream closed"))?;
            sent.push_back(Instant::now());
        }
        drop(tx);
        Ok((ops, lat))
    })
    .await
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
    measure(clients, dur, move |mut c, w| async move {
        let req = Req {
            payload: vec![1; req_len],
            resp_len,
        };
        let (mut ops, mut lat) = (0u64, Latency::new());
        let mut next = tokio::time::Instant::now();
        while !w.stopped() {
            let t0 = Instant::now();
            c.unary(req.clone()).await?;
            w.record(t0, &mut ops, &mut lat);
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
        Ok((ops, lat))
    })
    .await
}
