//! Greeter server: `helloworld-server --transport tcp|shm|rdma`.

use clap::Parser;
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
    /// tcp, shm or rdma.
    #[arg(long, default_value = "shm")]
    transport: String,
    /// Override the address (a full URI).
    #[arg(long)]
    uri: Option<String>,
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

/// The URI for a transport name.
fn uri(transport: &str) -> anyhow::Result<String> {
    Ok(match transport {
        "tcp" => "http://127.0.0.1:50051".into(),
        "shm" => format!(
            "shm://{}/rrpc-helloworld.sock",
            std::env::temp_dir().display()
        ),
        "rdma" => "rdma://127.0.0.1:50051".into(),
        t => anyhow::bail!("unknown transport {t:?} (tcp, shm, rdma)"),
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let uri = match args.uri {
        Some(u) => u,
        None => uri(&args.transport)?,
    };
    println!("GreeterServer listening on {uri}");
    Server::builder()
        .add_service(GreeterServer::new(MyGreeter))
        .serve_rrpc(&uri, RrpcConfig::default())
        .await?;
    Ok(())
}
