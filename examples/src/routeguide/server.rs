//! RouteGuide server (all four RPC kinds): `routeguide-server --transport tcp|shm|rdma`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use clap::Parser;
use rrpc_tonic::{RrpcConfig, Server};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
mod pb {
    tonic::include_proto!("routeguide");
}
use pb::route_guide_server::{RouteGuide, RouteGuideServer};
use pb::{Feature, Point, Rectangle, RouteNote, RouteSummary};

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

/// Notes left so far, by location.
type NoteBook = Arc<Mutex<HashMap<(i32, i32), Vec<RouteNote>>>>;

#[derive(Debug, Default)]
struct Guide {
    notes: NoteBook,
}

fn feature_at(p: &Point) -> Feature {
    let name = if (p.latitude + p.longitude) % 3 == 0 {
        format!("Place {},{}", p.latitude, p.longitude)
    } else {
        String::new()
    };
    Feature {
        name,
        location: Some(*p),
    }
}

type Notes = Pin<Box<dyn Stream<Item = Result<RouteNote, Status>> + Send>>;
type Features = Pin<Box<dyn Stream<Item = Result<Feature, Status>> + Send>>;

#[tonic::async_trait]
impl RouteGuide for Guide {
    async fn get_feature(&self, req: Request<Point>) -> Result<Response<Feature>, Status> {
        Ok(Response::new(feature_at(req.get_ref())))
    }

    type ListFeaturesStream = Features;

    async fn list_features(&self, req: Request<Rectangle>) -> Result<Response<Features>, Status> {
        let r = req.into_inner();
        let (lo, hi) = (r.lo.unwrap_or_default(), r.hi.unwrap_or_default());
        let mut out = Vec::new();
        for lat in lo.latitude.min(hi.latitude)..=lo.latitude.max(hi.latitude) {
            for lon in lo.longitude.min(hi.longitude)..=lo.longitude.max(hi.longitude) {
                let f = feature_at(&Point {
                    latitude: lat,
                    longitude: lon,
                });
                if !f.name.is_empty() {
                    out.push(Ok(f));
                }
            }
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(out))))
    }

    async fn record_route(
        &self,
        req: Request<Streaming<Point>>,
    ) -> Result<Response<RouteSummary>, Status> {
        let mut s = req.into_inner();
        let start = std::time::Instant::now();
        let mut sum = RouteSummary::default();
        let mut last: Option<Point> = None;
        while let Some(p) = s.message().await? {
            sum.point_count += 1;
            if !feature_at(&p).name.is_empty() {
                sum.feature_count += 1;
            }
            if let Some(l) = last {
                sum.distance += (p.latitude - l.latitude).abs() + (p.longitude - l.longitude).abs();
            }
            last = Some(p);
        }
        sum.elapsed_time = start.elapsed().as_secs() as i32;
        Ok(Response::new(sum))
    }

    type RouteChatStream = Notes;

    async fn route_chat(
        &self,
        req: Request<Streaming<RouteNote>>,
    ) -> Result<Response<Notes>, Status> {
        let mut s = req.into_inner();
        let notes = self.notes.clone();
        let out = async_stream_like(move |tx| async move {
            while let Ok(Some(note)) = s.message().await {
                let loc = note.location.unwrap_or_default();
                let earlier = {
                    let mut n = notes.lock().expect("notes");
                    let v = n.entry((loc.latitude, loc.longitude)).or_default();
                    let earlier = v.clone();
                    v.push(note);
                    earlier
                };
                for e in earlier {
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(out))
    }
}

/// A stream fed by a task through a channel.
fn async_stream_like<F, Fut>(f: F) -> Notes
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<RouteNote, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
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
    println!("RouteGuideServer listening on {uri}");
    Server::builder()
        .add_service(RouteGuideServer::new(Guide::default()))
        .serve_rrpc(&uri, RrpcConfig::default())
        .await?;
    Ok(())
}
