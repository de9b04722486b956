//! The client side: [`RrpcChannel`], a `Channel` for any rrpc URI
//! ([`RrpcEndpoint`](crate::RrpcEndpoint) builds one; its `connect` and
//! `balance_list` live there).

use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::transport::Channel;
use tower::Service;
use tower::buffer::Buffer;

use crate::call::{BoxError, Carrier, ChannelPath, ResponseFuture};
use crate::client::managed::{Dialer, Managed};

/// A client channel for any URI that the unchanged generated client takes:
/// `GreeterClient::new(RrpcChannel::connect("shm:///run/g.sock", cfg).await?)`.
///
/// Cheap to clone; clones share the connection and multiplex their calls.
///
/// Dropping the last clone (and the calls and response streams made on
/// it) closes the connection: its sockets, eventfds and ring regions are
/// released promptly on both paths, whether the process is busy or idle
/// (`tests/integration/tests/release.rs` counts the process's descriptors
/// and allows 5 s; here three connections per path were released within
/// that test's 0.8 s run).
#[derive(Debug, Clone)]
pub struct RrpcChannel {
    inner: Inner,
    carrier: Carrier,
}

#[derive(Clone)]
enum Inner {
    /// tonic's own channel (`http://`, `unix://`).
    Tonic(Channel, ChannelPath),
    /// A ring connection that reconnects ([`crate::RrpcEndpoint`]).
    Rings(Managed),
    /// Behind a buffer: limits ([`crate::RrpcEndpoint::concurrency_limit`],
    /// `rate_limit`) or a balance; the dialer (if one) tells the path.
    Buffered(
        Buffer<http::Request<Body>, ResponseFuture>,
        Option<Arc<Dialer>>,
    ),
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Inner::Tonic(c, p) => f.debug_tuple("Tonic").field(c).field(p).finish(),
            Inner::Rings(m) => f.debug_tuple("Rings").field(m).finish(),
            Inner::Buffered(..) => f.write_str("Buffered"),
        }
    }
}

impl RrpcChannel {
    /// A balance over several endpoints' channels (behind a buffer).
    pub(crate) fn balanced(
        b: Buffer<http::Request<Body>, ResponseFuture>,
        carriers: Vec<Carrier>,
    ) -> Self {
        RrpcChannel {
            inner: Inner::Buffered(b, None),
            carrier: Carrier::Balanced(carriers),
        }
    }

    pub(crate) fn tonic(ch: Channel, path: ChannelPath, carrier: Carrier) -> Self {
        RrpcChannel {
            inner: Inner::Tonic(ch, path),
            carrier,
        }
    }

    pub(crate) fn managed(m: Managed, carrier: Carrier) -> Self {
        RrpcChannel {
            inner: Inner::Rings(m),
            carrier,
        }
    }

    pub(crate) fn buffered(
        b: Buffer<http::Request<Body>, ResponseFuture>,
        dialer: Arc<Dialer>,
        carrier: Carrier,
    ) -> Self {
        RrpcChannel {
            inner: Inner::Buffered(b, Some(dialer)),
            carrier,
        }
    }

    /// The reconnecting ring connection, if this is one (tests).
    #[cfg(test)]
    pub(crate) fn rings(&self) -> Option<&Managed> {
        match &self.inner {
            Inner::Rings(m) => Some(m),
            _ => None,
        }
    }

    /// What carries this channel's bytes.
    ///
    /// On rings (`shm://`, `rdma://`) it is read from the live connection:
    /// the provider of the queue pair that carries the calls, and on verbs
    /// its device and the peer's address from the GID it is connected to
    /// ([`rrpc_core::QueuePair::carrier`]). Until the channel first
    /// connects (a lazy channel), and on tonic's own paths (`http://`,
    /// `unix://`), it is what the URI asks for; a balanced channel lists
    /// its endpoints' carriers. On `rrpc://` it is the fabric the port's
    /// negotiation chose: [`Carrier::Shm`] (read from the live ring
    /// connection) or [`Carrier::Tcp`]. A lazy `rrpc://` channel
    /// ([`RrpcEndpoint::connect_lazy`](crate::RrpcEndpoint::connect_lazy))
    /// does not negotiate: with TCP allowed it is [`Carrier::Tcp`] from
    /// the start and stays so, even on a host where `connect` would have
    /// chosen shm; check this value if the fabric matters.
    pub fn carrier(&self) -> Carrier {
        let observed = match &self.inner {
            Inner::Rings(m) => m.dialer.current_carrier(),
            Inner::Buffered(_, Some(d)) => d.current_carrier(),
            _ => None,
        };
        observed.unwrap_or_else(|| self.carrier.clone())
    }

    /// The [`RrpcContext`](crate::RrpcContext) this channel's ring connections use
    /// (its poller, device, pools and shared connections): the one given
    /// to [`RrpcEndpoint::context`](crate::RrpcEndpoint::context), else its
    /// config's shared one. `None` on tonic's own paths (`http://`,
    /// `unix://`) and for a balanced channel.
    pub fn context(&self) -> Option<crate::RrpcContext> {
        match &self.inner {
            Inner::Rings(m) => Some(m.dialer.ctx.clone()),
            Inner::Buffered(_, Some(d)) => Some(d.ctx.clone()),
            _ => None,
        }
    }

    /// The path this channel uses: on rings, the path of its current
    /// connection ([`ChannelPath::Fast`] for a lazy channel that has not
    /// connected yet, unless its config asks for HTTP/2; a balanced
    /// channel says [`ChannelPath::Fast`] too).
    pub fn path(&self) -> ChannelPath {
        match &self.inner {
            Inner::Tonic(_, p) => *p,
            Inner::Rings(m) => m.path().unwrap_or_else(|| m.dialer.preferred_path()),
            Inner::Buffered(_, Some(d)) => d.current_path().unwrap_or_else(|| d.preferred_path()),
            Inner::Buffered(_, None) => ChannelPath::Fast,
        }
    }
}

impl Service<http::Request<Body>> for RrpcChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match &mut self.inner {
            Inner::Tonic(c, _) => c.poll_ready(cx).map_err(Into::into),
            Inner::Rings(m) => m.poll_ready(cx),
            Inner::Buffered(b, _) => b.poll_ready(cx),
        }
    }

    fn call(&mut self, req: http::Request<Body>) -> ResponseFuture {
        match &mut self.inner {
            // Plain tonic (TCP, Unix socket): exactly what tonic's own
            // `Channel` reports, statuses untouched.
            Inner::Tonic(c, _) => {
                let fut = c.call(req);
                Box::pin(async move { fut.await.map_err(Into::into) })
            }
            Inner::Rings(m) => m.call(req),
            Inner::Buffered(b, _) => Box::pin(b.call(req)),
        }
    }
}
