//! Fast-path client: a `GrpcService<Body>` multiplexing calls over one pipe.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tonic::Status;
use tonic::body::Body;

use super::writer::{FrameWriter, Out};
use super::{Event, RecvBody, parse_grpc_timeout};
use crate::RrpcConfig;
use crate::frame::{self, END_STREAM, Kind};
use crate::pipe::{MsgRx, Pipe};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Default)]
struct Table {
    calls: HashMap<u32, mpsc::Sender<Event>>,
    /// Set once the connection is gone or draining: new calls fail with it.
    closed: Option<(tonic::Code, String)>,
}

#[derive(Debug)]
struct Shared {
    table: Mutex<Table>,
    next_id: AtomicU32,
}

impl Shared {
    fn take(&self, id: u32) -> Option<mpsc::Sender<Event>> {
        self.table.lock().expect("table lock").calls.remove(&id)
    }
    fn get(&self, id: u32) -> Option<mpsc::Sender<Event>> {
        self.table
            .lock()
            .expect("table lock")
            .calls
            .get(&id)
            .cloned()
    }
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    writer: FrameWriter,
    reader: AbortHandle,
    call_buffer: usize,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The fast-path channel: cheap to clone, every clone shares the connection.
#[derive(Debug, Clone)]
pub(crate) struct FastChannel {
    inner: Arc<Inner>,
}

impl FastChannel {
    /// Starts the connection's reader task on a negotiated pipe.
    pub(crate) fn start(pipe: Pipe, cfg: &RrpcConfig) -> FastChannel {
        let (tx, rx) = pipe;
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            next_id: AtomicU32::new(1),
        });
        let writer = FrameWriter::new(tx, cfg.get_zero_copy(), cfg.get_max_chunk());
        let reader = tokio::spawn(read_loop(rx, shared.clone())).abort_handle();
        FastChannel {
            inner: Arc::new(Inner {
                shared,
                writer,
                reader,
                call_buffer: cfg.get_call_buffer(),
            }),
        }
    }
}

async fn read_loop(mut rx: Box<dyn MsgRx>, shared: Arc<Shared>) {
    let mut events: Vec<(u32, Event)> = Vec::new();
    let mut goaway = false;
    let reason = loop {
        let mut bad = None;
        let r = rx
            .recv_with(&mut |msg: &[u8]| {
                for f in frame::frames(msg) {
                    let f = match f {
                        Ok(f) => f,
                        Err(e) => {
                            bad = Some(e);
                            return;
                        }
                    };
                    let ev = match f.kind {
                        Kind::ResponseHeaders => match frame::parse_metadata(f.payload) {
                            Ok(m) => Event::Headers(m),
                            Err(e) => {
                                bad = Some(e);
                                return;
                            }
                        },
                        // The one receive-side copy: ring slot -> body chunk.
                        Kind::Data => Event::Data(Bytes::copy_from_slice(f.payload)),
                        Kind::Trailers => match frame::parse_metadata(f.payload) {
                            Ok(m) => Event::Trailers(m),
                            Err(e) => {
                                bad = Some(e);
                                return;
                            }
                        },
                        Kind::Cancel => {
                            Event::Reset(Status::cancelled("rrpc: call reset by the server"))
                        }
                        Kind::GoAway => {
                            goaway = true;
                            continue;
                        }
                        Kind::RequestHeaders => {
                            bad = Some(frame::FrameError::Invalid(
                                "request headers sent to a client",
                            ));
                            return;
                        }
                    };
                    events.push((f.call_id, ev));
                }
            })
            .await;
        if goaway {
            goaway = false;
            let mut t = shared.table.lock().expect("table lock");
            t.closed.get_or_insert((
                tonic::Code::Unavailable,
                "rrpc: server is shutting down".into(),
            ));
        }
        for (id, ev) in events.drain(..) {
            let last = matches!(ev, Event::Trailers(_) | Event::Reset(_));
            let tx = if last {
                shared.take(id)
            } else {
                shared.get(id)
            };
            if let Some(tx) = tx {
                // Back-pressure: a full call queue holds the connection (documented).
                let _ = tx.send(ev).await;
            }
        }
        if let Some(e) = bad {
            break (
                tonic::Code::Internal,
                format!("rrpc: protocol violation by server: {e}"),
            );
        }
        match r {
            Ok(true) => {}
            Ok(false) => {
                break (
                    tonic::Code::Unavailable,
                    "rrpc: connection closed by the server".to_string(),
                );
            }
            Err(e) => break (tonic::Code::Unavailable, format!("rrpc: {e}")),
        }
    };
    let calls = {
        let mut t = shared.table.lock().expect("table lock");
        t.closed = Some(reason.clone());
        std::mem::take(&mut t.calls)
    };
    for (_, tx) in calls {
        let _ = tx.try_send(Event::Reset(Status::new(reason.0, reason.1.clone())));
    }
}

/// Cancels the call on drop unless it finished (RST_STREAM's role).
#[derive(Debug)]
pub(crate) struct CallGuard {
    id: u32,
    inner: Arc<Inner>,
    sender: Option<AbortHandle>,
    done: bool,
}

impl CallGuard {
    pub(crate) fn finished(&mut self) {
        self.done = true;
        self.inner.shared.take(self.id);
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(s) = self.sender.take()
            && !self.done
        {
            s.abort();
        }
        if self.done {
            return;
        }
        let was_open = self.inner.shared.take(self.id).is_some();
        if was_open && let Ok(rt) = tokio::runtime::Handle::try_current() {
            let w = self.inner.writer.clone();
            let id = self.id;
            rt.spawn(async move {
                let _ = w
                    .send(vec![Out::new(Kind::Cancel, 0, id, Bytes::new())])
                    .await;
            });
        }
    }
}

impl tower::Service<http::Request<Body>> for FastChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = crate::channel::ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Back-pressure comes from the ring when frames are written.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(call(inner, req))
    }
}

async fn call(
    inner: Arc<Inner>,
    req: http::Request<Body>,
) -> Result<http::Response<Body>, BoxError> {
    let timeout = parse_grpc_timeout(req.headers());
    let (tx, rx) = mpsc::channel(inner.call_buffer);
    let id = {
        let mut t = inner.shared.table.lock().expect("table lock");
        if let Some((code, msg)) = &t.closed {
            return Err(Box::new(Status::new(*code, msg.clone())));
        }
        let mut id = inner.shared.next_id.fetch_add(1, Ordering::Relaxed);
        while id == 0 || t.calls.contains_key(&id) {
            id = inner.shared.next_id.fetch_add(1, Ordering::Relaxed);
        }
        t.calls.insert(id, tx);
        id
    };
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let headers = frame::request_headers_payload(path, &parts.headers);
    let writer = inner.writer.clone();
    let shared = inner.shared.clone();
    let sender = tokio::spawn(send_request(writer, shared, id, headers, body)).abort_handle();
    let mut guard = CallGuard {
        id,
        inner,
        sender: Some(sender),
        done: false,
    };

    let mut rx = rx;
    let first = match timeout {
        Some(d) => match tokio::time::timeout(d, rx.recv()).await {
            Ok(ev) => ev,
            // Same error as tonic's own channel: the caller sees the same Status on every transport.
            Err(_) => return Err(Box::new(tonic::TimeoutExpired(()))),
        },
        None => rx.recv().await,
    };
    let mut builder = http::Response::builder()
        .status(200)
        .version(http::Version::HTTP_2);
    match first {
        Some(Event::Headers(h)) => {
            if let Some(hm) = builder.headers_mut() {
                *hm = h;
            }
            let mut body = RecvBody::new(rx, false);
            body.guard = Some(guard);
            Ok(builder.body(Body::new(body))?)
        }
        Some(Event::Trailers(t)) => {
            // Trailers-only response, as HTTP/2 would deliver it.
            guard.finished();
            if let Some(hm) = builder.headers_mut() {
                *hm = t;
            }
            Ok(builder.body(Body::empty())?)
        }
        Some(Event::Reset(s)) => {
            guard.finished();
            Err(Box::new(s))
        }
        Some(Event::Data(_)) => Err(Box::new(Status::internal(
            "rrpc: data before response headers",
        ))),
        None => {
            guard.finished();
            Err(Box::new(Status::unavailable("rrpc: connection lost")))
        }
    }
}

async fn send_request(
    writer: FrameWriter,
    shared: Arc<Shared>,
    id: u32,
    headers: Vec<u8>,
    mut body: Body,
) {
    let mut batch = vec![Out::new(Kind::RequestHeaders, 0, id, headers)];
    let mut ended = false;
    // Greedily batch what the body has ready now: a unary request becomes one ring message.
    loop {
        let next = if batch.is_empty() {
            Some(body.frame().await)
        } else {
            body.frame().now_or_never()
        };
        match next {
            None => {
                // Body not ready: flush what we have and wait.
                if writer.send(std::mem::take(&mut batch)).await.is_err() {
                    return;
                }
            }
            Some(Some(Ok(f))) => {
                if let Ok(data) = f.into_data()
                    && !data.is_empty()
                {
                    batch.push(Out::new(Kind::Data, 0, id, data));
                }
            }
            Some(None) => {
                ended = true;
                break;
            }
            Some(Some(Err(e))) => {
                let status = e;
                if let Some(tx) = shared.take(id) {
                    let _ = tx.try_send(Event::Reset(status));
                }
                batch.push(Out::new(Kind::Cancel, 0, id, Bytes::new()));
                break;
            }
        }
    }
    if ended {
        match batch.last_mut() {
            Some(last) => last.flags |= END_STREAM,
            None => batch.push(Out::new(Kind::Data, END_STREAM, id, Bytes::new())),
        }
    }
    let _ = writer.send(batch).await;
}
