//! The reconnecting ring connection behind an [`RrpcChannel`](crate::RrpcChannel):
//! one connection at a time, replaced when it can no longer take calls
//! (the side channel saw the server leave, the server said GOAWAY, or a
//! send failed). The call that finds it so dials again (under
//! `connect_timeout`), as tonic's `Reconnect` does; calls already in
//! flight on the old connection finish or fail there, with `Unavailable`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tonic::Status;
use tonic::body::Body;
use tower::Service;

use crate::call::{BoxError, Carrier, ChannelPath, ResponseFuture};
use crate::conn::BoxFut;
use crate::conn::negotiate::Negotiated;
use crate::fast::client::{CallOptions, FastChannel};
use crate::h2stream::{H2Conn, h2_call, h2_channel};
use crate::transport::{Target, dial};
use crate::{Error, RrpcConfig, RrpcContext};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One connection over rings, on whichever path the server chose.
#[derive(Debug, Clone)]
pub(crate) enum Conn {
    Fast(FastChannel),
    /// tonic's channel over ring connections (it reconnects by itself).
    H2(H2Conn),
}

impl Conn {
    fn usable(&self) -> bool {
        match self {
            Conn::Fast(f) => !f.is_retired(),
            Conn::H2(_) => true,
        }
    }

    pub(crate) fn path(&self) -> ChannelPath {
        match self {
            Conn::Fast(_) => ChannelPath::Fast,
            Conn::H2(_) => ChannelPath::Http2,
        }
    }
}

/// Everything needed to connect again, shared by a channel's clones.
#[derive(Debug)]
pub(crate) struct Dialer {
    target: Target,
    config: RrpcConfig,
    /// The runtime state its connections use (poller, device, pools).
    pub(crate) ctx: RrpcContext,
    uri: String,
    connect_timeout: Option<Duration>,
    opts: CallOptions,
    /// tonic's endpoint for the HTTP/2 path (the options it applies there).
    h2: tonic::transport::Endpoint,
    /// The connection new calls use.
    current: Mutex<Option<Conn>>,
    /// What carries the newest ring connection, read from it
    /// ([`crate::RrpcChannel::carrier`]).
    carrier: Arc<Mutex<Option<Carrier>>>,
    /// One dial at a time; the others wait for its result.
    dialing: tokio::sync::Mutex<()>,
}

impl Dialer {
    /// A dialer with no connection yet.
    pub(crate) fn new(
        target: Target,
        config: RrpcConfig,
        ctx: RrpcContext,
        uri: String,
        connect_timeout: Option<Duration>,
        opts: CallOptions,
        h2: tonic::transport::Endpoint,
    ) -> Arc<Self> {
        Arc::new(Dialer {
            target,
            config,
            ctx,
            uri,
            connect_timeout,
            opts,
            h2,
            current: Mutex::new(None),
            carrier: Arc::default(),
            dialing: tokio::sync::Mutex::new(()),
        })
    }

    /// The path a connection will take if the server agrees.
    pub(crate) fn preferred_path(&self) -> ChannelPath {
        match self.config.path() {
            crate::PathPreference::Fast => ChannelPath::Fast,
            crate::PathPreference::Http2 => ChannelPath::Http2,
        }
    }

    /// The connection new calls use, if there is one.
    #[cfg(test)]
    pub(crate) fn current(&self) -> Option<Conn> {
        lock(&self.current).clone()
    }

    /// What carries the newest connection, once there is one.
    pub(crate) fn current_carrier(&self) -> Option<Carrier> {
        lock(&self.carrier).clone()
    }

    /// The path of the current connection, if there is one.
    pub(crate) fn current_path(&self) -> Option<ChannelPath> {
        lock(&self.current).as_ref().map(Conn::path)
    }

    /// The current connection if it takes calls, else a new one.
    ///
    /// Cancel safety: dropping the future abandons this attempt (a
    /// handshake already running on a blocking thread finishes there and
    /// its connection is closed); nothing is left half-installed.
    pub(crate) async fn connection(self: Arc<Self>) -> Result<Conn, Error> {
        let _one = self.dialing.lock().await;
        if let Some(c) = lock(&self.current).as_ref().filter(|c| c.usable()) {
            return Ok(c.clone());
        }
        // The old connection is released once its calls are done.
        *lock(&self.current) = None;
        let conn = match self.connect_timeout {
            Some(t) => tokio::time::timeout(t, self.dial())
                .await
                .map_err(|_| Error::ConnectTimeout(t))??,
            None => self.dial().await?,
        };
        tracing::debug!(uri = %self.uri, path = ?conn.path(), "rrpc: connected");
        *lock(&self.current) = Some(conn.clone());
        Ok(conn)
    }

    async fn dial(&self) -> Result<Conn, Error> {
        let (pipe, path) = dial(&self.target, &self.config, &self.ctx).await?;
        let carrier = pipe.1.carrier().map(|c| Carrier::observed(&c));
        let conn = match path {
            Negotiated::Fast { peer_window } => Conn::Fast(FastChannel::start(
                pipe,
                &self.config,
                peer_window,
                self.opts.clone(),
            )),
            Negotiated::Http2 => Conn::H2(
                h2_channel(
                    self.target.clone(),
                    pipe,
                    self.config.clone(),
                    self.ctx.clone(),
                    self.uri.clone(),
                    self.h2.clone(),
                    self.carrier.clone(),
                )
                .await?,
            ),
        };
        // Recorded once the connection is up (the HTTP/2 connector records
        // tonic's reconnects itself).
        if let Some(c) = carrier {
            tracing::debug!(uri = %self.uri, carrier = ?c, "rrpc: connection carrier");
            *lock(&self.carrier) = Some(c);
        }
        Ok(conn)
    }
}

/// A channel over rings that reconnects: `poll_ready` makes sure there is a
/// connection that takes calls (dialing if not), `call` uses it.
pub(crate) struct Managed {
    pub(crate) dialer: Arc<Dialer>,
    conn: Option<Conn>,
    connecting: Option<BoxFut<'static, Result<Conn, Error>>>,
    /// The last connect error, for the call that follows (tonic's
    /// `Reconnect` does the same: the call fails, the next one retries).
    failed: Option<Status>,
}

impl Clone for Managed {
    fn clone(&self) -> Self {
        Managed {
            dialer: self.dialer.clone(),
            conn: self.conn.clone(),
            connecting: None,
            failed: None,
        }
    }
}

impl std::fmt::Debug for Managed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed")
            .field("uri", &self.dialer.uri)
            .field("conn", &self.conn)
            .finish_non_exhaustive()
    }
}

impl Managed {
    /// A managed channel on `dialer`, using `conn` (which becomes the
    /// dialer's current connection) if there is one.
    pub(crate) fn new(dialer: Arc<Dialer>, conn: Option<Conn>) -> Self {
        if let Some(c) = &conn {
            *lock(&dialer.current) = Some(c.clone());
        }
        Managed {
            dialer,
            conn,
            connecting: None,
            failed: None,
        }
    }

    /// The path of the connection in use (or about to be).
    pub(crate) fn path(&self) -> Option<ChannelPath> {
        self.conn
            .as_ref()
            .map(Conn::path)
            .or_else(|| self.dialer.current_path())
    }
}

impl Service<http::Request<Body>> for Managed {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        loop {
            if let Some(c) = &mut self.conn {
                if c.usable() {
                    return match c {
                        Conn::Fast(f) => f.poll_ready(cx),
                        Conn::H2(h) => h.ch.poll_ready(cx).map_err(Into::into),
                    };
                }
                self.conn = None;
            }
            if self.connecting.is_none() {
                // Another clone may have connected already.
                if let Some(c) = lock(&self.dialer.current).as_ref().filter(|c| c.usable()) {
                    self.conn = Some(c.clone());
                    continue;
                }
                self.connecting = Some(Box::pin(self.dialer.clone().connection()));
            }
            let fut = self.connecting.as_mut().expect("set above");
            let r = ready!(fut.as_mut().poll(cx));
            self.connecting = None;
            match r {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    tracing::debug!(uri = %self.dialer.uri, "rrpc: connect failed: {e}");
                    self.failed = Some(Status::from(e));
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }

    fn call(&mut self, req: http::Request<Body>) -> ResponseFuture {
        if let Some(st) = self.failed.take() {
            return Box::pin(async move { Err(Box::new(st) as BoxError) });
        }
        match &mut self.conn {
            Some(Conn::Fast(f)) => f.call(req),
            Some(Conn::H2(h)) => h2_call(h, req, self.dialer.opts.timeout),
            None => Box::pin(async {
                Err(Box::new(Status::internal("rrpc: call without poll_ready")) as BoxError)
            }),
        }
    }
}
