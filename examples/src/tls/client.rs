//! Greeter client with TLS, as tonic's `tls` example, on rrpc:
//! `tls-client --ca ca.pem [--cert client.pem --key client.key]`.
//!
//! On an `rrpc://` port the client negotiates inside TLS and moves to the
//! best fabric both ends have (shm on one host); it prints which.

use clap::Parser;
use rrpc_tonic::RrpcEndpoint;
use rrpc_tonic::tls::{Certificate, ClientTlsConfig, Identity};

#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
mod pb {
    tonic::include_proto!("helloworld");
}
use pb::HelloRequest;
use pb::greeter_client::GreeterClient;

/// Command line.
#[derive(Parser, Debug)]
struct Args {
    /// rrpc, tcp or rdma (as the server's `--transport`).
    #[arg(long, default_value = "rrpc")]
    transport: String,
    /// Override the address (a full URI).
    #[arg(long)]
    uri: Option<String>,
    /// The CA (PEM) that signed the server's certificate.
    #[arg(long)]
    ca: std::path::PathBuf,
    /// The name the server's certificate must carry.
    #[arg(long, default_value = "localhost")]
    domain: String,
    /// This client's certificate chain (PEM), for a server that requires one.
    #[arg(long, requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// This client's private key (PEM).
    #[arg(long, requires = "cert")]
    key: Option<std::path::PathBuf>,
    /// Who to greet.
    #[arg(long, default_value = "rrpc")]
    name: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let uri = match args.uri {
        Some(u) => u,
        None => match args.transport.as_str() {
            "rrpc" => "rrpc://127.0.0.1:50052".into(),
            "tcp" => "http://127.0.0.1:50052".into(),
            "rdma" => "rdma://127.0.0.1:50052".into(),
            t => anyhow::bail!("unknown transport {t:?} (rrpc, tcp, rdma)"),
        },
    };
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&args.ca)?))
        .domain_name(args.domain);
    if let (Some(cert), Some(key)) = (&args.cert, &args.key) {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(cert)?,
            std::fs::read(key)?,
        ));
    }
    let channel = RrpcEndpoint::new(&uri)?.tls_config(tls)?.connect().await?;
    println!(
        "connected to {uri}: carried by {:?}, {:?} path",
        channel.carrier(),
        channel.path()
    );
    let mut client = GreeterClient::new(channel);
    let reply = client
        .say_hello(HelloRequest { name: args.name })
        .await?
        .into_inner();
    println!("RESPONSE={:?}", reply.message);
    Ok(())
}
