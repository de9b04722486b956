//! Cluster mode's roles (`cargo xtask bench rpc --hosts hosts.toml`): a tonic-over-TCP server
//! ([`cluster_server`]) and a streaming client ([`cluster_client`]) on separate hosts.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;

use super::pb::bench_server::BenchServer;
use super::{Svc, Transport, connect_once, rrpc_config, stream_throughput};

/// Cluster server role: tonic over TCP on `listen`, prints `READY`, serves until killed.
///
/// # Errors
/// Bind errors.
pub fn cluster_server(listen: SocketAddr) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind(listen).await?;
        let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
        println!("READY {listen}");
        use std::io::Write as _;
        std::io::stdout().flush()?;
        tonic::transport::Server::builder()
            .add_service(BenchServer::new(Svc))
            .serve_with_incoming(incoming)
            .await?;
        Ok(())
    })
}

/// Cluster client role: `clients` TCP connections to `connect` for `dur`; prints
/// `RESULT {"clients","ops","secs","p50_us","p99_us"}`.
///
/// # Errors
/// Connect or call errors.
pub fn cluster_client(connect_to: SocketAddr, clients: usize, dur: Duration) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let r = rt.block_on(async {
        let mut cs = Vec::new();
        for _ in 0..clients {
            cs.push(
                connect_once(
                    Transport::TonicTcp,
                    &format!("http://{connect_to}"),
                    &rrpc_config(Transport::TonicTcp),
                )
                .await?,
            );
        }
        stream_throughput(cs, 32, 8, 32, dur).await
    })?;
    let s = r.latency.summary();
    println!(
        "RESULT {}",
        serde_json::json!({
            "clients": clients, "ops": r.ops, "secs": r.elapsed.as_secs_f64(),
            "p50_us": s.p50_us(), "p99_us": s.p99_us(),
        })
    );
    Ok(())
}
