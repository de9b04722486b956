//! The README's "Using it" example, whole: a Greeter served over `shm://`
//! and called through the generated client. Every line of the README's
//! snippet appears here in order (`tests/cli.rs` checks it), so the README
//! shows code that compiles and runs.

use std::time::{Duration, Instant};

use rrpc_tonic::{RrpcConfig, Server}; // was: tonic::transport::Server
use tonic::{Request, Response, Status};

#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
mod pb {
    tonic::include_proto!("helloworld");
}
use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

/// The Greeter; its greeting word is state a real service would have.
#[derive(Debug)]
struct MyGreeter {
    greeting: &'static str,
}

impl Default for MyGreeter {
    fn default() -> Self {
        MyGreeter { greeting: "Hello" }
    }
}

#[tonic::async_trait]
impl Greeter for MyGreeter {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        Ok(Response::new(HelloReply {
            message: format!("{} {}!", self.greeting, req.into_inner().name),
        }))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // (A socket left by an earlier run would look like a server that is up.)
    let _ = std::fs::remove_file("/tmp/greeter.sock");
    let uri = "shm:///tmp/greeter.sock";
    // server: the same services and layers; one import and one call change
    let server = tokio::spawn(async move {
        Server::builder()
            .add_service(GreeterServer::new(MyGreeter::default()))
            .serve_rrpc(uri, RrpcConfig::default()) // or rdma://0.0.0.0:50051
            .await?;
        Ok::<(), rrpc_tonic::Error>(())
    });
    // (The server binds in its own task: wait for its socket.)
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::path::Path::new("/tmp/greeter.sock").exists() {
        anyhow::ensure!(Instant::now() < deadline, "the server never bound");
        anyhow::ensure!(
            !server.is_finished(),
            "the server stopped: {:?}",
            server.await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // client: the generated client, unchanged, over an rrpc channel (`http://` still means TCP)
    let channel = rrpc_tonic::RrpcChannel::connect(uri, RrpcConfig::default()).await?;
    let carrier = channel.carrier();
    let mut client = GreeterClient::new(channel);

    let reply = client
        .say_hello(HelloRequest {
            name: "rrpc".into(),
        })
        .await?;
    println!("{} (carried by {carrier:?})", reply.into_inner().message);
    server.abort();
    Ok(())
}
