//! Greeter client: `helloworld-client --transport tcp|shm|rdma`.

use clap::Parser;
use rrpc_tonic::{RrpcChannel, RrpcConfig};

#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
mod pb {
    tonic::include_proto!("helloworld");
}
use pb::HelloRequest;
use pb::greeter_client::GreeterClient;

/// Command line.
#[derive(Parser, Debug)]
struct Args {
    /// tcp, shm or rdma.
    #[arg(long, default_value = "shm")]
    transport: String,
    /// Override the address (a full URI).
    #[arg(long)]
    uri: Option<String>,
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
            "tcp" => "http://127.0.0.1:50051".into(),
            "shm" => format!(
                "shm://{}/rrpc-helloworld.sock",
                std::env::temp_dir().display()
            ),
            "rdma" => "rdma://127.0.0.1:50051".into(),
            t => anyhow::bail!("unknown transport {t:?} (tcp, shm, rdma)"),
        },
    };
    let channel = RrpcChannel::connect(&uri, RrpcConfig::default()).await?;
    println!(
        "connected to {uri} over {:?}, carried by {:?}",
        channel.path(),
        channel.carrier()
    );
    let mut client = GreeterClient::new(channel);
    let reply = client.say_hello(HelloRequest { name: args.name }).await?;
    println!("RESPONSE={:?}", reply.into_inner().message);
    Ok(())
}
