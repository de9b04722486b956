//! The README's "Using it" example, whole: a Greeter served on one
//! `rrpc://` port and called through the generated client, over rrpc (shm:
//! the same host) and over plain HTTP/2 (a tonic `Channel`) on that port. Every line of the README's
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
    let uri = "rrpc://127.0.0.1:50151"; // one port: shm on one host, RDMA across hosts, else TCP
    // server: the same services and layers; one import and one call change
    let server = tokio::spawn(async move {
        Server::builder()
            .add_service(GreeterServer::new(MyGreeter::default()))
            .serve_rrpc(uri, RrpcConfig::default()) // plain gRPC clients share the port
            .await?;
        Ok::<(), rrpc_tonic::Error>(())
    });
    // (The server binds in its own task: wait for its port.)
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect("127.0.0.1:50151")
        .await
        .is_err()
    {
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

    // tonic's own client on the same port (grpc-go and grpcio alike).
    let plain = tonic::transport::Endpoint::from_static("http://127.0.0.1:50151")
        .connect()
        .await?;
    let reply = GreeterClient::new(plain)
        .say_hello(HelloRequest {
            name: "tonic".into(),
        })
        .await?;
    println!(
        "{} (plain HTTP/2 on the same port)",
        reply.into_inner().message
    );
    server.abort();
    Ok(())
}
