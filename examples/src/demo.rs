//! The demo: one Greeter served on TCP, a Unix socket and shm at once; a few
//! thousand calls on each path; one line per path:
//! `<path> p50 <x>us p99 <y>us`, then the ratios to `tcp`.

use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use rrpc_tonic::{PathPreference, RrpcChannel, RrpcConfig, Server};
use tonic::{Request, Response, Status};

#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
mod pb {
    tonic::include_proto!("helloworld");
}
use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

/// Command line.
#[derive(Parser, Debug)]
struct Args {
    /// Calls per path (after a warm-up of 10%).
    #[arg(long, default_value_t = 3000)]
    calls: u64,
}

#[derive(Debug, Default)]
struct MyGreeter;

#[tonic::async_trait]
impl Greeter for MyGreeter {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        Ok(Response::new(HelloReply {
            message: format!("Hello {}!", req.into_inner().name),
        }))
    }
}

async fn measure(uri: &str, cfg: RrpcConfig, calls: u64) -> anyhow::Result<(f64, f64)> {
    let mut last = None;
    let mut channel = None;
    for _ in 0..200 {
        match RrpcChannel::connect(uri, cfg.clone()).await {
            Ok(c) => {
                channel = Some(c);
                break;
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let channel = channel.ok_or_else(|| anyhow::anyhow!("connect {uri}: {last:?}"))?;
    let mut client = GreeterClient::new(channel);
    let mut hist = Histogram::<u64>::new(3)?;
    for i in 0..calls + calls / 10 {
        let t = Instant::now();
        client
            .say_hello(HelloRequest {
                name: "demo".into(),
            })
            .await?;
        if i >= calls / 10 {
            hist.record(t.elapsed().as_nanos() as u64)?;
        }
    }
    Ok((
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let tcp = format!("http://127.0.0.1:{port}");
    let uds = format!("unix://{}/rrpc-demo-{pid}.uds", dir.display());
    let shm = format!("shm://{}/rrpc-demo-{pid}.sock", dir.display());

    let router = Server::builder().add_service(GreeterServer::new(MyGreeter));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = Vec::new();
    for uri in [tcp.clone(), uds.clone(), shm.clone()] {
        let (r, mut stop) = (router.clone(), stop_rx.clone());
        servers.push(tokio::spawn(async move {
            r.serve_rrpc_with_shutdown(&uri, RrpcConfig::default(), async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
        }));
    }

    let paths = [
        ("tcp", tcp.as_str(), RrpcConfig::default()),
        ("uds", uds.as_str(), RrpcConfig::default()),
        (
            "shm-h2",
            shm.as_str(),
            RrpcConfig::default().path(PathPreference::Http2),
        ),
        ("shm-fast", shm.as_str(), RrpcConfig::default()),
    ];
    let mut results = Vec::new();
    for (name, uri, cfg) in paths {
        let (p50, p99) = measure(uri, cfg, args.calls).await?;
        println!("{name} p50 {p50:.1}us p99 {p99:.1}us");
        results.push((name, p50, p99));
    }
    let (_, t50, t99) = results[0];
    for (name, p50, p99) in &results[1..] {
        println!("{name}/tcp p50 {:.2}x p99 {:.2}x", p50 / t50, p99 / t99);
    }
    let _ = stop_tx.send(true);
    for s in servers {
        s.await??;
    }
    Ok(())
}
