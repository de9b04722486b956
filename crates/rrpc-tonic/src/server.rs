//! The server side: tonic's builder shape, one call to pick the transport.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::Routes;
use tower::layer::util::{Identity, Stack};
use tower::{Layer, Service};

use crate::fast::server::serve_conn;
use crate::h2stream::{RrpcConnectInfo, RrpcStream};
use crate::transport::{Negotiated, RrpcListener, Target, negotiate_server};
use crate::{Error, RrpcConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A server builder with the shape of `tonic::transport::Server`.
///
/// Swap `tonic::transport::Server` for `rrpc_tonic::Server`, keep
/// `.layer(..)` and `.add_service(..)`, and finish with
/// [`Router::serve_rrpc`] (any URI: `http://`, `unix://`, `shm://`,
/// `rdma://`, `inproc://`) or [`Router::serve_dual`] (TCP and rrpc at once,
/// as RR-Compound keeps TCP beside RDMA).
///
/// Unlike tonic's `Router`, this one keeps its routes and layers visible,
/// which the fast path needs: it calls the layered router directly, without
/// hyper.
#[derive(Debug, Clone)]
pub struct Server<L = Identity> {
    layer: L,
}

impl Server<Identity> {
    /// A builder with no layers.
    pub fn builder() -> Self {
        Server {
            layer: Identity::new(),
        }
    }
}

impl Default for Server<Identity> {
    fn default() -> Self {
        Self::builder()
    }
}

impl<L> Server<L> {
    /// Wraps every service in a tower layer (applied on every transport and path).
    pub fn layer<N>(self, layer: N) -> Server<Stack<N, L>> {
        Server {
            layer: Stack::new(layer, self.layer),
        }
    }

    /// Adds a generated service (same bounds as tonic's).
    pub fn add_service<S>(self, svc: S) -> Router<L>
    where
        S: Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        Router {
            layer: self.layer,
            routes: Routes::default().add_service(svc),
        }
    }

    /// Starts from ready-made tonic [`Routes`].
    pub fn add_routes(self, routes: Routes) -> Router<L> {
        Router {
            layer: self.layer,
            routes,
        }
    }
}

/// Services plus layers, ready to serve on any transport.
#[derive(Debug, Clone)]
pub struct Router<L = Identity> {
    layer: L,
    routes: Routes,
}

impl<L> Router<L> {
    /// Adds another generated service.
    pub fn add_service<S>(mut self, svc: S) -> Self
    where
        S: Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        self.routes = self.routes.add_service(svc);
        self
    }

    /// Adds a service if `Some` (as tonic's `add_optional_service`).
    pub fn add_optional_service<S>(self, svc: Option<S>) -> Self
    where
        S: Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        match svc {
            Some(s) => self.add_service(s),
            None => self,
        }
    }
}

impl<L, ResBody> Router<L>
where
    L: Layer<Routes> + Clone + Send + Sync + 'static,
    L::Service:
        Service<http::Request<Body>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Future: Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Error: Into<BoxError> + Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    /// Serves until an error; see [`Router::serve_rrpc_with_shutdown`].
    ///
    /// # Errors
    /// As [`Router::serve_rrpc_with_shutdown`].
    pub async fn serve_rrpc(self, uri: &str, config: RrpcConfig) -> Result<(), Error> {
        self.serve_rrpc_with_shutdown(uri, config, std::future::pending())
            .await
    }

    /// Serves on `uri` until `signal` completes, then drains gracefully:
    /// no new connections, new calls on open connections get `Unavailable`,
    /// calls in flight run to completion.
    ///
    /// `http://ip:port` and `unix:///path` serve plain tonic (the baselines);
    /// `shm://`, `rdma://` and `inproc://` serve rrpc, each connection on the
    /// fast path or HTTP/2 as negotiated.
    ///
    /// # Errors
    /// [`Error::InvalidUri`], [`Error::UnsupportedTransport`] (e.g. `rdma://`
    /// without the verbs provider), [`Error::Io`] if the address is taken,
    /// [`Error::Transport`] from tonic.
    pub async fn serve_rrpc_with_shutdown<F>(
        self,
        uri: &str,
        config: RrpcConfig,
        signal: F,
    ) -> Result<(), Error>
    where
        F: Future<Output = ()> + Send,
    {
        let target = Target::parse(uri)?;
        let Router { layer, routes } = self;
        let tonic_router = tonic::transport::Server::builder()
            .layer(layer.clone())
            .add_routes(routes.clone());
        match target {
            Target::Tcp(addr) => {
                let addr = Target::tcp_addr(&addr)?;
                Ok(tonic_router.serve_with_shutdown(addr, signal).await?)
            }
            Target::Unix(path) => {
                let listener = tokio::net::UnixListener::bind(&path)?;
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                let r = tonic_router
                    .serve_with_incoming_shutdown(incoming, signal)
                    .await;
                let _ = std::fs::remove_file(&path);
                Ok(r?)
            }
            t => {
                let listener = RrpcListener::bind(&t, &config)?;
                serve_rings(listener, uri.to_string(), layer, routes, config, signal).await
            }
        }
    }

    /// Serves TCP on `tcp` and rrpc on `uri` from the same services at once
    /// (RR-Compound keeps TCP available beside RDMA), until `signal`.
    ///
    /// # Errors
    /// The first error of either listener.
    pub async fn serve_dual<F>(
        self,
        tcp: SocketAddr,
        uri: &str,
        config: RrpcConfig,
        signal: F,
    ) -> Result<(), Error>
    where
        F: Future<Output = ()> + Send,
    {
        let token = CancellationToken::new();
        let (t1, t2) = (token.clone(), token.clone());
        let tcp_uri = format!("http://{tcp}");
        let a = self
            .clone()
            .serve_rrpc_with_shutdown(
                &tcp_uri,
                config.clone(),
                async move { t1.cancelled().await },
            );
        let b = self.serve_rrpc_with_shutdown(uri, config, async move { t2.cancelled().await });
        let sig = async move {
            signal.await;
            token.cancel();
            Ok::<(), Error>(())
        };
        tokio::try_join!(a, b, sig).map(|_| ())
    }
}

async fn serve_rings<L, ResBody, F>(
    mut listener: RrpcListener,
    local: String,
    layer: L,
    routes: Routes,
    config: RrpcConfig,
    signal: F,
) -> Result<(), Error>
where
    L: Layer<Routes> + Clone + Send + Sync + 'static,
    L::Service:
        Service<http::Request<Body>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Future: Send + 'static,
    <L::Service as Service<http::Request<Body>>>::Error: Into<BoxError> + Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    F: Future<Output = ()> + Send,
{
    let token = CancellationToken::new();
    // HTTP/2 connections go to tonic's own server, fed through this queue.
    let (h2_tx, h2_rx) = mpsc::channel::<Result<RrpcStream, std::io::Error>>(16);
    let h2_token = token.clone();
    let tonic_router = tonic::transport::Server::builder()
        .layer(layer.clone())
        .add_routes(routes.clone());
    let h2_task = tokio::spawn(async move {
        tonic_router
            .serve_with_incoming_shutdown(ReceiverStream::new(h2_rx), async move {
                h2_token.cancelled().await
            })
            .await
    });
    let svc = layer.layer(routes.prepare());
    let mut conns = JoinSet::new();
    let mut signal = std::pin::pin!(signal);
    let setups = Arc::new(Semaphore::new(config.get_max_pending_handshakes()));
    // Every branch is cancel safe: `accept` only takes a client off the
    // socket (its handshake runs in the connection's own task, bounded by
    // `handshake_timeout`), so a connection ending, or a shutdown, never
    // cuts a handshake short.
    loop {
        tokio::select! {
            biased;
            _ = &mut signal => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            a = listener.accept() => {
                let Some(accepted) = a else { break };
                let Ok(permit) = setups.clone().try_acquire_owned() else {
                    tracing::warn!(
                        peer = %accepted.peer(),
                        limit = config.get_max_pending_handshakes(),
                        "rrpc: too many connections in setup; closing the new one",
                    );
                    continue;
                };
                let (svc, config, token, h2_tx) = (svc.clone(), config.clone(), token.child_token(), h2_tx.clone());
                let info = RrpcConnectInfo { local: local.clone() };
                conns.spawn(async move {
                    let peer = accepted.peer();
                    let limit = config.get_handshake_timeout();
                    let setup = async {
                        let mut pipe = accepted.establish().await?;
                        let path = negotiate_server(&mut pipe, &config).await?;
                        Ok::<_, Error>((pipe, path))
                    };
                    let r = match tokio::time::timeout(limit, setup).await {
                        Ok(r) => r,
                        Err(_) => Err(Error::Handshake(format!(
                            "connection setup took longer than {limit:?}"
                        ))),
                    };
                    drop(permit);
                    match r {
                        Ok((pipe, Negotiated::Fast { peer_window })) => {
                            tracing::debug!(%peer, "rrpc connection on the fast path");
                            if let Err(e) = serve_conn(pipe, svc, config, token, peer_window).await {
                                tracing::warn!(%peer, error = %e, "rrpc connection failed");
                            }
                        }
                        Ok((pipe, Negotiated::Http2)) => {
                            tracing::debug!(%peer, "rrpc connection on the HTTP/2 path");
                            let _ = h2_tx.send(Ok(RrpcStream::new(pipe, info))).await;
                        }
                        Err(e) => tracing::warn!(%peer, error = %e, "rrpc connection setup failed"),
                    }
                });
            }
        }
    }
    drop(listener);
    token.cancel();
    while conns.join_next().await.is_some() {}
    drop(h2_tx);
    match h2_task.await {
        Ok(r) => Ok(r?),
        Err(e) => Err(Error::Io(std::io::Error::other(e))),
    }
}
