//! Greeter client: `helloworld-client --transport tcp|shm|rdma`, or
//! `--uri rrpc://host:port [--fabrics verbs,tcp]` for one port.

use clap::Parser;
use rrpc_tonic::{Fabric, RrpcChannel, RrpcConfig};

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
    /// `rrpc://`: the fabrics this client allows, comma-separated (shm,
    /// verbs, tcp; default: all).
    #[arg(long, value_delimiter = ',')]
    fabrics: Vec<String>,
    /// The RDMA device to open (default: the first).
    #[arg(long)]
    rdma_device: Option<String>,
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
    let mut config = RrpcConfig::builder();
    if !args.fabrics.is_empty() {
        let fabrics = args
            .fabrics
            .iter()
            .map(|f| match f.as_str() {
                "shm" => Ok(Fabric::Shm),
                "verbs" => Ok(Fabric::Verbs),
                "tcp" => Ok(Fabric::Tcp),
                f => anyhow::bail!("unknown fabric {f:?} (shm, verbs, tcp)"),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        config = config.fabrics(fabrics);
    }
    if let Some(d) = args.rdma_device {
        config = config.rdma_device(d);
    }
    let channel = RrpcChannel::connect(&uri, config.build()?).await?;
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
