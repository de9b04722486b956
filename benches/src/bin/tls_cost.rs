//! What TLS and ring encryption cost (issue #57 part 4), measured in ONE
//! run on shm, alternating the setups in rounds (the machine's noise hits
//! both alike):
//!
//! * p50 of a 64 B unary call (64 B reply), rings sealed
//!   (`RingEncryption::Required`) against the same rings in plaintext, both
//!   over TLS-negotiated `rrpc://` connections: every round's row and the
//!   ratio (goal: sealed ≤ 1.2 × plaintext);
//! * throughput of 1 MiB unary calls (1 MiB each way), sealed against
//!   plaintext (goal: ≥ 0.7 ×);
//! * the cipher, and whether the CPU has AES instructions (`/proc/cpuinfo`);
//! * the TLS handshake's cost in connect time: p50 connect of `rrpc://`
//!   with TLS against without, and tonic over TCP with TLS against
//!   without.
//!
//! `cargo run --release -p rrpc-bench --features tls --bin tls_cost`

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use rrpc_bench::rpc::pb::Req;
use rrpc_bench::rpc::pb::bench_client::BenchClient;
use rrpc_bench::rpc::pb::bench_server::BenchServer;
use rrpc_bench::rpc::{Svc, pb};
use rrpc_tonic::tls::{Certificate, ClientTlsConfig, Identity, RingCipher, ServerTlsConfig};
use rrpc_tonic::{RingEncryption, RrpcChannel, RrpcConfig, RrpcEndpoint, Server};
use tokio::sync::oneshot;

#[derive(Parser, Debug)]
struct Cli {
    /// Rounds; each runs every setup once, in turn.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// 64 B calls per setup per round.
    #[arg(long, default_value_t = 20_000)]
    calls: usize,
    /// 1 MiB calls per setup per round.
    #[arg(long, default_value_t = 200)]
    big_calls: usize,
    /// Connects per setup per round.
    #[arg(long, default_value_t = 30)]
    connects: usize,
}

/// A CA and a server certificate for 127.0.0.1 it signed, as PEMs.
struct Pki {
    ca: String,
    cert: String,
    key: String,
}

fn pki() -> Result<Pki> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])?
        .signed_by(&key, &issuer)?;
    Ok(Pki {
        ca: ca_cert.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

impl Pki {
    fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(Identity::from_pem(&self.cert, &self.key))
    }
    fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca))
    }
}

fn cfg(mode: RingEncryption) -> Result<RrpcConfig> {
    Ok(RrpcConfig::builder().ring_encryption(mode).build()?)
}

/// An `rrpc://` port serving the bench service, with TLS if given; stops
/// when the sender is dropped.
async fn rrpc_server(
    tls: Option<ServerTlsConfig>,
    config: RrpcConfig,
) -> Result<(String, oneshot::Sender<()>)> {
    let mut server = Server::builder();
    if let Some(t) = tls {
        server = server.tls_config(t)?;
    }
    let router = server.add_service(BenchServer::new(Svc));
    let incoming = router.bind("rrpc://127.0.0.1:0", config)?;
    let uri = incoming.uri().to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(router.serve_rrpc_incoming(incoming, async move {
        let _ = stopped.await;
    }));
    Ok((uri, stop))
}

/// tonic's own server over TCP, with TLS if given.
async fn tonic_server(
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> Result<(String, oneshot::Sender<()>)> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
    let mut b = tonic::transport::Server::builder();
    let scheme = if let Some(t) = tls {
        b = b.tls_config(t)?;
        "https"
    } else {
        "http"
    };
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        b.add_service(BenchServer::new(Svc))
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stopped.await;
            }),
    );
    Ok((format!("{scheme}://{addr}"), stop))
}

async fn rrpc_client(
    uri: &str,
    config: RrpcConfig,
    tls: Option<ClientTlsConfig>,
) -> Result<BenchClient<RrpcChannel>> {
    let mut ep = RrpcEndpoint::new(uri)?.config(config);
    if let Some(t) = tls {
        ep = ep.tls_config(t)?;
    }
    let ch = ep.connect().await?;
    Ok(BenchClient::new(ch).max_decoding_message_size(4 << 20))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// p50 and p99 of `n` 64 B calls.
async fn small_calls(c: &mut BenchClient<RrpcChannel>, n: usize) -> Result<(Duration, Duration)> {
    let req = Req {
        payload: vec![7; 64],
        resp_len: 64,
    };
    // Warm-up: rings at their size, spins tuned.
    for _ in 0..n / 10 {
        c.unary(req.clone()).await?;
    }
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        c.unary(req.clone()).await?;
        lat.push(t.elapsed());
    }
    lat.sort();
    Ok((percentile(&lat, 0.5), percentile(&lat, 0.99)))
}

/// MiB/s of `n` 1 MiB calls (1 MiB request, 1 MiB reply: 2 MiB moved each).
async fn big_calls(c: &mut BenchClient<RrpcChannel>, n: usize) -> Result<f64> {
    let req = Req {
        payload: vec![7; 1 << 20],
        resp_len: 1 << 20,
    };
    for _ in 0..2 {
        c.unary(req.clone()).await?;
    }
    let t = Instant::now();
    for _ in 0..n {
        c.unary(req.clone()).await?;
    }
    Ok((2 * n) as f64 / t.elapsed().as_secs_f64())
}

/// p50 connect time of `n` connects made by `connect`.
async fn connects<F, Fut>(n: usize, mut connect: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        connect().await?;
        t.push(s.elapsed());
    }
    t.sort();
    Ok(percentile(&t, 0.5))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn cpu_aes_flag() -> Option<bool> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let flags = info.lines().find(|l| l.starts_with("flags"))?;
    Some(flags.split_whitespace().any(|f| f == "aes"))
}

async fn run(cli: &Cli) -> Result<()> {
    let pki = pki().context("certificates")?;
    println!(
        "# tls_cost: cipher {} | CPU aes flag (/proc/cpuinfo): {} | AES+PCLMUL detected: {}",
        RingCipher::preferred(),
        cpu_aes_flag().map_or("unknown".into(), |a| a.to_string()),
        rrpc_tonic::tls::cpu_has_aes(),
    );

    // The two ring setups, both over TLS-negotiated rrpc:// connections.
    let (sealed_uri, _s1) = rrpc_server(Some(pki.server()), cfg(RingEncryption::Required)?).await?;
    let (plain_uri, _s2) = rrpc_server(Some(pki.server()), cfg(RingEncryption::Off)?).await?;
    let mut sealed = rrpc_client(
        &sealed_uri,
        cfg(RingEncryption::Required)?,
        Some(pki.client()),
    )
    .await?;
    let mut plain = rrpc_client(&plain_uri, cfg(RingEncryption::Off)?, Some(pki.client())).await?;

    println!("\n## 64 B unary, p50/p99 (µs), {} calls per row", cli.calls);
    println!(
        "round | plaintext p50 | sealed p50 | plaintext p99 | sealed p99 | sealed/plaintext p50"
    );
    let mut ratios = Vec::new();
    for r in 0..cli.rounds {
        let (p50, p99) = small_calls(&mut plain, cli.calls).await?;
        let (s50, s99) = small_calls(&mut sealed, cli.calls).await?;
        let ratio = us(s50) / us(p50);
        ratios.push(ratio);
        println!(
            "{r} | {:.2} | {:.2} | {:.2} | {:.2} | {ratio:.3}",
            us(p50),
            us(s50),
            us(p99),
            us(s99)
        );
    }
    let small = median(ratios);
    println!("median ratio: {small:.3} (goal ≤ 1.2)");

    println!(
        "\n## 1 MiB unary (1 MiB each way), MiB/s, {} calls per row",
        cli.big_calls
    );
    println!("round | plaintext | sealed | sealed/plaintext");
    let mut ratios = Vec::new();
    for r in 0..cli.rounds {
        let p = big_calls(&mut plain, cli.big_calls).await?;
        let s = big_calls(&mut sealed, cli.big_calls).await?;
        ratios.push(s / p);
        println!("{r} | {p:.0} | {s:.0} | {:.3}", s / p);
    }
    let big = median(ratios);
    println!("median ratio: {big:.3} (goal ≥ 0.7)");
    drop((sealed, plain));

    // Connect: rrpc:// with and without TLS; tonic over TCP with and without.
    let (rrpc_tls, _s3) = rrpc_server(Some(pki.server()), cfg(RingEncryption::Off)?).await?;
    let (rrpc_bare, _s4) = rrpc_server(None, cfg(RingEncryption::Off)?).await?;
    let tonic_identity = tonic::transport::Identity::from_pem(&pki.cert, &pki.key);
    let (tonic_tls, _s5) = tonic_server(Some(
        tonic::transport::ServerTlsConfig::new().identity(tonic_identity),
    ))
    .await?;
    let (tonic_bare, _s6) = tonic_server(None).await?;
    let tonic_ca = tonic::transport::Certificate::from_pem(&pki.ca);
    println!("\n## connect p50 (µs), {} connects per row", cli.connects);
    println!(
        "round | rrpc:// TLS | rrpc:// plain | rrpc TLS/plain | tonic TCP TLS | tonic TCP plain | tonic TLS/plain"
    );
    let (mut rr, mut tr) = (Vec::new(), Vec::new());
    for r in 0..cli.rounds {
        let a = connects(cli.connects, || async {
            rrpc_client(&rrpc_tls, RrpcConfig::default(), Some(pki.client())).await?;
            Ok(())
        })
        .await?;
        let b = connects(cli.connects, || async {
            rrpc_client(&rrpc_bare, RrpcConfig::default(), None).await?;
            Ok(())
        })
        .await?;
        let c = connects(cli.connects, || async {
            let tls = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic_ca.clone())
                .domain_name("127.0.0.1");
            tonic::transport::Endpoint::from_shared(tonic_tls.clone())?
                .tls_config(tls)?
                .connect()
                .await?;
            Ok(())
        })
        .await?;
        let d = connects(cli.connects, || async {
            tonic::transport::Endpoint::from_shared(tonic_bare.clone())?
                .connect()
                .await?;
            Ok(())
        })
        .await?;
        rr.push(us(a) / us(b));
        tr.push(us(c) / us(d));
        println!(
            "{r} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2}",
            us(a),
            us(b),
            us(a) / us(b),
            us(c),
            us(d),
            us(c) / us(d)
        );
    }
    println!(
        "median: rrpc TLS/plain {:.2}, tonic TLS/plain {:.2}",
        median(rr),
        median(tr)
    );
    let _ = pb::Resp::default();
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(&cli))
}
