//! Cluster mode's roles (`cargo xtask bench rpc --hosts hosts.toml`): a server
//! ([`cluster_server`]) and a streaming client ([`cluster_client`]) on separate hosts.
//!
//! Both speak tonic over TCP, or rrpc over `rdma://` (fast path) when
//! [`RDMA_DEVICE_ENV`](super::RDMA_DEVICE_ENV) names a device (xtask sets it from the hosts
//! file's `rdma_device`). The client reports what carried its calls, read from the live
//! connection, and fails if `rdma://` was not carried by verbs.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};

use super::pb::bench_client::BenchClient;
use super::pb::bench_server::BenchServer;
use super::{AnyClient, Svc, Transport, connect_once, rdma_device, rrpc_config, stream_throughput};

/// Cluster server role: tonic over TCP on `listen` (rrpc over `rdma://listen` with a device),
/// prints `READY` once bound, serves until killed.
///
/// # Errors
/// Bind errors (for `rdma://`, a device that does not open).
pub fn cluster_server(listen: SocketAddr) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        use std::io::Write as _;
        if rdma_device().is_some() {
            let uri = format!("rdma://{listen}");
            let incoming = rrpc_tonic::RrpcIncoming::bind(&uri, rrpc_config(Transport::RrpcFast))?;
            println!("READY {uri}");
            std::io::stdout().flush()?;
            rrpc_tonic::Server::builder()
                .add_service(BenchServer::new(Svc))
                .serve_rrpc_incoming(incoming, std::future::pending())
                .await?;
            return Ok(());
        }
        let l = tokio::net::TcpListener::bind(listen).await?;
        let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
        println!("READY {listen}");
        std::io::stdout().flush()?;
        tonic::transport::Server::builder()
            .add_service(BenchServer::new(Svc))
            .serve_with_incoming(incoming)
            .await?;
        Ok(())
    })
}

/// Cluster client role: `clients` connections to `connect` for `dur`; prints
/// `RESULT {"clients","ops","secs","p50_us","p99_us","carrier"}`.
///
/// # Errors
/// Connect or call errors; over `rdma://`, a channel not carried by verbs.
pub fn cluster_client(connect_to: SocketAddr, clients: usize, dur: Duration) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let (r, carrier) = rt.block_on(async {
        let (t, target) = match rdma_device() {
            Some(_) => (Transport::RrpcFast, format!("rdma://{connect_to}")),
            None => (Transport::TonicTcp, format!("http://{connect_to}")),
        };
        let mut cs = Vec::new();
        let mut channels = Vec::new();
        for _ in 0..clients {
            if t == Transport::RrpcFast {
                // The channel is kept to read its carrier after the run.
                let ch = rrpc_tonic::RrpcChannel::connect(&target, rrpc_config(t)).await?;
                channels.push(ch.clone());
                cs.push(AnyClient::Rrpc(
                    BenchClient::new(ch).max_decoding_message_size(64 << 20),
                ));
            } else {
                cs.push(connect_once(t, &target, &rrpc_config(t)).await?);
            }
        }
        let r = stream_throughput(cs, 32, 8, 32, dur).await?;
        // Read from the live connections after the calls: every channel's carrier.
        let mut carrier = "Tcp".to_owned();
        for ch in &channels {
            let c = ch.carrier();
            if !matches!(c, rrpc_tonic::Carrier::Verbs { peer: Some(_), .. }) {
                bail!("a channel to {target} is carried by {c:?}, not verbs");
            }
            carrier = format!("{c:?}");
        }
        anyhow::Ok((r, carrier))
    })?;
    let s = r.latency.summary();
    println!(
        "RESULT {}",
        serde_json::json!({
            "clients": clients, "ops": r.ops, "secs": r.elapsed.as_secs_f64(),
            "p50_us": s.p50_us(), "p99_us": s.p99_us(), "carrier": carrier,
        })
    );
    Ok(())
}
