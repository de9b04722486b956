//! The gRPC face: the `rrpc.kv.v1.Kv` service (`proto/kv.proto`) over any
//! [`Execute`], and [`GrpcKv`], a client of it over any [`KvChannel`].
//!
//! The service is plain tonic, so the same [`KvService::into_server`] is
//! served by `tonic::transport::Server` over TCP or by `rrpc_tonic::Server`
//! over `shm://`/`rdma://` (RR-Compound §V-E runs YCSB through exactly this
//! kind of gRPC binding):
//!
//! ```no_run
//! # async fn run<E: rrpc_kv::Execute>(store: E) -> Result<(), rrpc_tonic::Error> {
//! use rrpc_kv::grpc::KvService;
//! use rrpc_tonic::{RrpcConfig, Server};
//! Server::builder()
//!     .add_service(KvService::new(store).into_server())
//!     .serve_rrpc("shm:///tmp/kv.sock", RrpcConfig::default())
//!     .await
//! # }
//! ```
//!
//! # Status codes
//!
//! | what | code |
//! |---|---|
//! | key over [`MAX_KEY_LEN`](crate::op::MAX_KEY_LEN), value over [`MAX_VALUE_LEN`](crate::op::MAX_VALUE_LEN), scan count over [`MAX_SCAN`](crate::op::MAX_SCAN) | `INVALID_ARGUMENT` |
//! | an empty batch, a batch operation with no operation set | `INVALID_ARGUMENT` |
//! | a batch of more than [`MAX_BATCH`] operations | `RESOURCE_EXHAUSTED` (as gRPC answers a message over its size limit) |
//! | [`OpResult::Failed`] from the store | `INTERNAL` with the store's message |
//! | the store answering an operation with a result of the wrong kind | `INTERNAL` |
//!
//! Why `INTERNAL` for every [`OpResult::Failed`]: the store's only bound is
//! its memory bound, which it keeps by LRU eviction rather than by refusing a
//! PUT, so a failure is the store's (its persistent engine), not a quota the
//! caller exceeded. Inside a batch a failed operation does not fail the call:
//! its result is `failed` with the message, the others stand.
//!
//! A batch is validated whole before any of its operations runs: one
//! operation over the limits rejects the batch and changes nothing.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use tonic::codegen::{Body, StdError};
use tonic::{Request, Response, Status};

use crate::op::{Execute, Op, OpResult};

/// Generated code for `proto/kv.proto` (package `rrpc.kv.v1`).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod pb {
    tonic::include_proto!("rrpc.kv.v1");
}

use pb::kv_client::KvClient;
use pb::kv_server::{Kv, KvServer};

/// Most operations one `Batch` call carries.
pub const MAX_BATCH: usize = 1024;

/// The `rrpc.kv.v1.Kv` service over an [`Execute`].
///
/// Each RPC becomes one [`Op`], validated against the limits of
/// [`op`](crate::op), and is carried out by [`Execute::execute`] on the
/// handler's own task (so a store that answers at once lets rrpc-tonic's fast
/// path write the reply without a task hop). A store whose operations block
/// for long (a disk) should be served with [`KvService::blocking`].
pub struct KvService<E> {
    store: Arc<E>,
    blocking: bool,
}

impl<E> Clone for KvService<E> {
    fn clone(&self) -> Self {
        KvService {
            store: self.store.clone(),
            blocking: self.blocking,
        }
    }
}

impl<E> fmt::Debug for KvService<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvService")
            .field("store", &std::any::type_name::<E>())
            .field("blocking", &self.blocking)
            .finish()
    }
}

impl<E: Execute> KvService<E> {
    /// Serves `store`.
    pub fn new(store: E) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// Serves a shared `store`.
    pub fn from_arc(store: Arc<E>) -> Self {
        KvService {
            store,
            blocking: false,
        }
    }

    /// Runs each operation on tokio's blocking pool instead of the handler's
    /// task (default: off). For stores whose operations wait on a disk.
    pub fn blocking(mut self, on: bool) -> Self {
        self.blocking = on;
        self
    }

    /// The store served.
    pub fn store(&self) -> &Arc<E> {
        &self.store
    }

    /// The tonic service, for `add_service` on tonic's or rrpc-tonic's
    /// server builder.
    pub fn into_server(self) -> KvServer<Self> {
        KvServer::new(self)
    }

    /// Validates `op` (`InvalidArgument` if it breaks a limit) and runs it
    /// on the store.
    async fn run(&self, op: Op) -> Result<OpResult, Status> {
        validate(&op)?;
        self.on_store(move |store| store.execute(op)).await
    }

    async fn run_batch(&self, ops: Vec<Op>) -> Result<Vec<OpResult>, Status> {
        self.on_store(move |store| ops.into_iter().map(|op| store.execute(op)).collect())
            .await
    }

    /// Runs `f` on the store: on the handler's task, or on tokio's blocking
    /// pool when [`blocking`](Self::blocking) is on.
    async fn on_store<T, F>(&self, f: F) -> Result<T, Status>
    where
        F: FnOnce(&E) -> T + Send + 'static,
        T: Send + 'static,
    {
        if self.blocking {
            let store = self.store.clone();
            tokio::task::spawn_blocking(move || f(&store))
                .await
                .map_err(|e| Status::internal(format!("store task failed: {e}")))
        } else {
            Ok(f(&self.store))
        }
    }
}

/// `INVALID_ARGUMENT` for an operation over the limits (the crate's one
/// mapping, [`crate::Error::code`]).
fn validate(op: &Op) -> Result<(), Status> {
    op.validate().map_err(Status::from)
}

fn failed(msg: String) -> Status {
    Status::internal(format!("store failed: {msg}"))
}

fn unexpected(what: &str, r: &OpResult) -> Status {
    Status::internal(format!("store answered a {what} with {r:?}"))
}

fn entries(e: Vec<(Bytes, Bytes)>) -> pb::ScanResponse {
    pb::ScanResponse {
        entries: e
            .into_iter()
            .map(|(k, v)| pb::Entry {
                key: k.into(),
                value: v.into(),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl<E: Execute> Kv for KvService<E> {
    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        let op = Op::Get {
            key: req.into_inner().key.into(),
        };
        match self.run(op).await? {
            OpResult::Value(v) => Ok(Response::new(pb::GetResponse {
                found: true,
                value: v.into(),
            })),
            OpResult::NotFound => Ok(Response::new(pb::GetResponse::default())),
            OpResult::Failed(m) => Err(failed(m)),
            r => Err(unexpected("GET", &r)),
        }
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let r = req.into_inner();
        let op = Op::Put {
            key: r.key.into(),
            value: r.value.into(),
        };
        match self.run(op).await? {
            OpResult::Ok => Ok(Response::new(pb::PutResponse {})),
            OpResult::Failed(m) => Err(failed(m)),
            r => Err(unexpected("PUT", &r)),
        }
    }

    async fn delete(
        &self,
        req: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let op = Op::Delete {
            key: req.into_inner().key.into(),
        };
        match self.run(op).await? {
            OpResult::Ok => Ok(Response::new(pb::DeleteResponse { found: true })),
            OpResult::NotFound => Ok(Response::new(pb::DeleteResponse { found: false })),
            OpResult::Failed(m) => Err(failed(m)),
            r => Err(unexpected("DELETE", &r)),
        }
    }

    async fn scan(
        &self,
        req: Request<pb::ScanRequest>,
    ) -> Result<Response<pb::ScanResponse>, Status> {
        let r = req.into_inner();
        let op = Op::Scan {
            start: r.start.into(),
            count: r.count,
        };
        match self.run(op).await? {
            OpResult::Entries(e) => Ok(Response::new(entries(e))),
            OpResult::Failed(m) => Err(failed(m)),
            r => Err(unexpected("SCAN", &r)),
        }
    }

    async fn batch(
        &self,
        req: Request<pb::BatchRequest>,
    ) -> Result<Response<pb::BatchResponse>, Status> {
        let ops = req.into_inner().ops;
        if ops.is_empty() {
            return Err(Status::invalid_argument("empty batch"));
        }
        if ops.len() > MAX_BATCH {
            return Err(Status::resource_exhausted(format!(
                "batch of {} operations is over the limit of {MAX_BATCH}",
                ops.len()
            )));
        }
        let ops = ops
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                let op = Op::try_from(o).map_err(|s| {
                    Status::invalid_argument(format!("operation {i}: {}", s.message()))
                })?;
                op.validate()
                    .map_err(|e| Status::invalid_argument(format!("operation {i}: {e}")))?;
                Ok(op)
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let results = self.run_batch(ops).await?;
        Ok(Response::new(pb::BatchResponse {
            results: results.into_iter().map(pb::OpResult::from).collect(),
        }))
    }
}

impl From<Op> for pb::Operation {
    fn from(op: Op) -> Self {
        use pb::operation::Op as P;
        let op = match op {
            Op::Get { key } => P::Get(pb::GetRequest { key: key.into() }),
            Op::Put { key, value } => P::Put(pb::PutRequest {
                key: key.into(),
                value: value.into(),
            }),
            Op::Delete { key } => P::Delete(pb::DeleteRequest { key: key.into() }),
            Op::Scan { start, count } => P::Scan(pb::ScanRequest {
                start: start.into(),
                count,
            }),
        };
        pb::Operation { op: Some(op) }
    }
}

impl TryFrom<pb::Operation> for Op {
    type Error = Status;

    /// `INVALID_ARGUMENT` for an operation with none of its fields set.
    fn try_from(o: pb::Operation) -> Result<Self, Status> {
        use pb::operation::Op as P;
        Ok(match o.op {
            Some(P::Get(r)) => Op::Get { key: r.key.into() },
            Some(P::Put(r)) => Op::Put {
                key: r.key.into(),
                value: r.value.into(),
            },
            Some(P::Delete(r)) => Op::Delete { key: r.key.into() },
            Some(P::Scan(r)) => Op::Scan {
                start: r.start.into(),
                count: r.count,
            },
            None => return Err(Status::invalid_argument("no operation set")),
        })
    }
}

impl From<OpResult> for pb::OpResult {
    fn from(r: OpResult) -> Self {
        use pb::op_result::Result as P;
        let r = match r {
            OpResult::Ok => P::Ok(pb::Ok {}),
            OpResult::NotFound => P::NotFound(pb::Ok {}),
            OpResult::Value(v) => P::Value(v.into()),
            OpResult::Entries(e) => P::Entries(entries(e)),
            OpResult::Failed(m) => P::Failed(m),
        };
        pb::OpResult { result: Some(r) }
    }
}

impl TryFrom<pb::OpResult> for OpResult {
    type Error = Status;

    /// `INTERNAL` for a result with none of its fields set (a server that
    /// does not speak this protocol).
    fn try_from(r: pb::OpResult) -> Result<Self, Status> {
        use pb::op_result::Result as P;
        Ok(match r.result {
            Some(P::Ok(_)) => OpResult::Ok,
            Some(P::NotFound(_)) => OpResult::NotFound,
            Some(P::Value(v)) => OpResult::Value(v.into()),
            Some(P::Entries(e)) => OpResult::Entries(
                e.entries
                    .into_iter()
                    .map(|e| (e.key.into(), e.value.into()))
                    .collect(),
            ),
            Some(P::Failed(m)) => OpResult::Failed(m),
            None => return Err(Status::internal("batch result with no result set")),
        })
    }
}

/// A client of the `rrpc.kv.v1.Kv` service over any tonic channel: tonic's
/// `Channel`, or rrpc-tonic's [`RrpcChannel`](rrpc_tonic::RrpcChannel)
/// (TCP, `shm://`, `rdma://`).
///
/// Calls take `&self` (each clones the generated client, which is cheap), so
/// one `GrpcKv` is shared by many tasks. Errors are the call's
/// [`Status`]; the client does not check the limits itself, the server does.
pub struct GrpcKv<C> {
    client: KvClient<C>,
}

impl<C> fmt::Debug for GrpcKv<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcKv")
            .field("channel", &std::any::type_name::<C>())
            .finish()
    }
}

impl<C: Clone> Clone for GrpcKv<C> {
    fn clone(&self) -> Self {
        GrpcKv {
            client: self.client.clone(),
        }
    }
}

impl GrpcKv<rrpc_tonic::RrpcChannel> {
    /// Connects to `uri` (`http://host:port`, `shm:///path`, `rdma://ip:port`)
    /// through rrpc-tonic.
    ///
    /// # Errors
    /// The channel's connection error.
    pub async fn connect(
        uri: &str,
        config: rrpc_tonic::RrpcConfig,
    ) -> Result<Self, rrpc_tonic::Error> {
        Ok(Self::new(
            rrpc_tonic::RrpcChannel::connect(uri, config).await?,
        ))
    }
}

/// What [`GrpcKv`] can call through: a tonic channel (an rrpc-tonic
/// [`RrpcChannel`](rrpc_tonic::RrpcChannel), tonic's own `Channel`, or any
/// `GrpcService` with the bounds tonic's generated clients ask for). Every
/// such type implements it; name it in code generic over the transport.
pub trait KvChannel:
    tonic::client::GrpcService<
        tonic::body::Body,
        Future: Send,
        Error: Into<StdError>,
        ResponseBody: Body<Data = Bytes, Error: Into<StdError> + Send> + Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<C> KvChannel for C where
    C: tonic::client::GrpcService<
            tonic::body::Body,
            Future: Send,
            Error: Into<StdError>,
            ResponseBody: Body<Data = Bytes, Error: Into<StdError> + Send> + Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

impl<C: KvChannel> GrpcKv<C> {
    /// A client over `channel`. Messages up to 64 MiB are accepted (a full
    /// batch of scans can exceed tonic's default 4 MiB).
    pub fn new(channel: C) -> Self {
        GrpcKv {
            client: KvClient::new(channel).max_decoding_message_size(64 << 20),
        }
    }

    /// The generated client, for calls with metadata or deadlines.
    pub fn client(&self) -> KvClient<C> {
        self.client.clone()
    }

    /// The value of `key`, `None` when there is none.
    ///
    /// # Errors
    /// The call's status.
    pub fn get(
        &self,
        key: impl Into<Bytes>,
    ) -> impl Future<Output = Result<Option<Bytes>, Status>> + Send {
        let mut c = self.client();
        let key = key.into().into();
        async move {
            let r = c.get(pb::GetRequest { key }).await?.into_inner();
            Ok(r.found.then(|| r.value.into()))
        }
    }

    /// Stores `value` under `key`.
    ///
    /// # Errors
    /// The call's status.
    pub fn put(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
    ) -> impl Future<Output = Result<(), Status>> + Send {
        let mut c = self.client();
        let req = pb::PutRequest {
            key: key.into().into(),
            value: value.into().into(),
        };
        async move {
            c.put(req).await?;
            Ok(())
        }
    }

    /// Removes `key`; whether it was there.
    ///
    /// # Errors
    /// The call's status.
    pub fn delete(
        &self,
        key: impl Into<Bytes>,
    ) -> impl Future<Output = Result<bool, Status>> + Send {
        let mut c = self.client();
        let key = key.into().into();
        async move {
            Ok(c.delete(pb::DeleteRequest { key })
                .await?
                .into_inner()
                .found)
        }
    }

    /// Up to `count` entries at or after `start`, in key order.
    ///
    /// # Errors
    /// The call's status.
    pub fn scan(
        &self,
        start: impl Into<Bytes>,
        count: u32,
    ) -> impl Future<Output = Result<Vec<(Bytes, Bytes)>, Status>> + Send {
        let mut c = self.client();
        let start = start.into().into();
        async move {
            Ok(c.scan(pb::ScanRequest { start, count })
                .await?
                .into_inner()
                .entries
                .into_iter()
                .map(|e| (e.key.into(), e.value.into()))
                .collect())
        }
    }

    /// Carries out `ops` in order in one call; one result per operation.
    ///
    /// # Errors
    /// The call's status (a failed operation is an [`OpResult::Failed`]).
    pub fn batch(
        &self,
        ops: Vec<Op>,
    ) -> impl Future<Output = Result<Vec<OpResult>, Status>> + Send + use<C> {
        let mut c = self.client();
        let n = ops.len();
        let req = pb::BatchRequest {
            ops: ops.into_iter().map(pb::Operation::from).collect(),
        };
        async move {
            let results = c.batch(req).await?.into_inner().results;
            if results.len() != n {
                return Err(Status::internal(format!(
                    "batch of {n} operations answered with {} results",
                    results.len()
                )));
            }
            results.into_iter().map(OpResult::try_from).collect()
        }
    }

    /// Carries out one operation through its own RPC, with the result the
    /// store would give: GET → `Value`/`NotFound`, PUT → `Ok`, DELETE →
    /// `Ok`/`NotFound`, SCAN → `Entries`.
    ///
    /// # Errors
    /// The call's status (an `INTERNAL` from the store's failure included).
    pub fn execute(
        &self,
        op: Op,
    ) -> impl Future<Output = Result<OpResult, Status>> + Send + use<C> {
        let kv = GrpcKv {
            client: self.client(),
        };
        async move {
            Ok(match op {
                Op::Get { key } => match kv.get(key).await? {
                    Some(v) => OpResult::Value(v),
                    None => OpResult::NotFound,
                },
                Op::Put { key, value } => {
                    kv.put(key, value).await?;
                    OpResult::Ok
                }
                Op::Delete { key } => {
                    if kv.delete(key).await? {
                        OpResult::Ok
                    } else {
                        OpResult::NotFound
                    }
                }
                Op::Scan { start, count } => OpResult::Entries(kv.scan(start, count).await?),
            })
        }
    }
}
