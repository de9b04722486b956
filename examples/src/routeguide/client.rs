//! RouteGuide client (all four RPC kinds): `routeguide-client --transport tcp|shm|rdma`.

use clap::Parser;
use rrpc_tonic::{RrpcChannel, RrpcConfig};

#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
mod pb {
    tonic::include_proto!("routeguide");
}
use pb::route_guide_client::RouteGuideClient;
use pb::{Point, Rectangle, RouteNote};

/// Command line.
#[derive(Parser, Debug)]
struct Args {
    /// tcp, shm or rdma.
    #[arg(long, default_value = "shm")]
    transport: String,
    /// Override the address (a full URI, e.g. `rdma://10.99.1.1:10000`).
    #[arg(long)]
    uri: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let uri = match args.uri.clone() {
        Some(u) => u,
        None => match args.transport.as_str() {
            "tcp" => "http://127.0.0.1:10000".to_string(),
            "shm" => format!(
                "shm://{}/rrpc-routeguide.sock",
                std::env::temp_dir().display()
            ),
            "rdma" => "rdma://127.0.0.1:10000".to_string(),
            t => anyhow::bail!("unknown transport {t:?} (tcp, shm, rdma)"),
        },
    };
    let channel = RrpcChannel::connect(&uri, RrpcConfig::default()).await?;
    println!(
        "connected to {uri} over {:?}, carried by {:?}",
        channel.path(),
        channel.carrier()
    );
    let mut client = RouteGuideClient::new(channel);

    // Unary.
    let f = client
        .get_feature(Point {
            latitude: 3,
            longitude: 6,
        })
        .await?
        .into_inner();
    println!("GetFeature: {f:?}");

    // Server streaming.
    let rect = Rectangle {
        lo: Some(Point {
            latitude: 0,
            longitude: 0,
        }),
        hi: Some(Point {
            latitude: 4,
            longitude: 4,
        }),
    };
    let mut s = client.list_features(rect).await?.into_inner();
    let mut n = 0;
    while let Some(f) = s.message().await? {
        n += 1;
        println!("ListFeatures: {}", f.name);
    }
    println!("ListFeatures: {n} features");

    // Client streaming.
    let points: Vec<Point> = (0..10)
        .map(|i| Point {
            latitude: i,
            longitude: 2 * i,
        })
        .collect();
    let summary = client
        .record_route(tokio_stream::iter(points))
        .await?
        .into_inner();
    println!("RecordRoute: {summary:?}");

    // Bidirectional.
    let notes: Vec<RouteNote> = (0..6)
        .map(|i| RouteNote {
            location: Some(Point {
                latitude: i % 2,
                longitude: 0,
            }),
            message: format!("note {i}"),
        })
        .collect();
    let mut chat = client
        .route_chat(tokio_stream::iter(notes))
        .await?
        .into_inner();
    while let Some(note) = chat.message().await? {
        println!("RouteChat: got {:?} at {:?}", note.message, note.location);
    }
    Ok(())
}
