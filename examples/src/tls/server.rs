//! Greeter server with TLS, as tonic's `tls` example, on rrpc:
//! `tls-server --cert server.pem --key server.key [--client-ca ca.pem]`.
//!
//! The switch from tonic is the import of the TLS types
//! (`rrpc_tonic::tls` instead of `tonic::transport`) and the builder
//! (`rrpc_tonic::Server`, `serve_rrpc`); the `ServerTlsConfig` calls are
//! tonic's. One identity then serves every leg: on an `rrpc://` port,
//! plain gRPC clients with TLS (tonic, grpc-go, grpcio) and rrpc clients,
//! whose negotiation runs inside TLS before they move to shared memory or
//! RDMA; the handler sees the client's certificate (`peer_certs()`) on
//! every fabric.

use clap::Parser;
use rrpc_tonic::tls::{Certificate, Identity, ServerTlsConfig};
use rrpc_tonic::{RrpcConfig, Server};
use tonic::{Request, Response, Status};

#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
mod pb {
    tonic::include_proto!("helloworld");
}
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

/// Command line.
#[derive(Parser, Debug)]
struct Args {
    /// rrpc (one port: TLS clients of any gRPC stack, rrpc clients moved
    /// to shm or verbs), tcp (`http://`, tonic's own TLS) or rdma (the side
    /// channel's handshake under TLS).
    #[arg(long, default_value = "rrpc")]
    transport: String,
    /// Override the address (a full URI).
    #[arg(long)]
    uri: Option<String>,
    /// The server's certificate chain (PEM).
    #[arg(long)]
    cert: std::path::PathBuf,
    /// The server's private key (PEM).
    #[arg(long)]
    key: std::path::PathBuf,
    /// A CA (PEM) whose client certificates are required (mutual TLS).
    #[arg(long)]
    client_ca: Option<std::path::PathBuf>,
}

#[derive(Debug, Default)]
struct MyGreeter;

#[tonic::async_trait]
impl Greeter for MyGreeter {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        // What tonic gives a TLS server: the client's certificate chain.
        let certs = req.peer_certs().map_or(0, |c| c.len());
        Ok(Response::new(HelloReply {
            message: format!(
                "Hello {}! (your TLS certificate chain: {certs} certificate(s))",
                req.into_inner().name
            ),
        }))
    }
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
    let identity = Identity::from_pem(std::fs::read(&args.cert)?, std::fs::read(&args.key)?);
    let mut tls = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &args.client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(std::fs::read(ca)?));
    }
    println!("GreeterServer (TLS) listening on {uri}");
    Server::builder()
        .tls_config(tls)?
        .add_service(GreeterServer::new(MyGreeter))
        .serve_rrpc(&uri, RrpcConfig::default())
        .await?;
    Ok(())
}
