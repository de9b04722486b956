//! [`RrpcConfig`]: the knobs of an rrpc connection.

use std::sync::Arc;

/// Which data path a connection uses (negotiated in the handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PathPreference {
    /// The h2-free fast path when both ends allow it, else HTTP/2 (default).
    #[default]
    Fast,
    /// Always HTTP/2 over the rings (full tonic feature set, see the crate docs).
    Http2,
}

/// Configuration shared by rrpc clients and servers.
///
/// Private fields, documented defaults, chained setters; validated setters
/// return `Result`. Cheap to clone (an `Arc` inside).
///
/// | knob | default | source |
/// |---|---|---|
/// | `max_message_size` | 4 MiB | gRPC's default maximum message; RR-Compound §V-B picks the 4 MB ring to match |
/// | `ring_size` | 4 MiB | RR-Compound §V-B ("we opt to set the ring buffer size at 4 MB") |
/// | `path` | [`PathPreference::Fast`] | issue 5: fast path by default between two rrpc endpoints |
/// | `zero_copy` | on | RR-Compound §IV-F; off reproduces Fig. 14's baseline |
/// | `max_chunk` | 256 KiB | fast-path DATA frames larger than this are split so calls interleave |
/// | `call_buffer` | 64 chunks | per-call receive queue before the connection applies back-pressure |
#[derive(Debug, Clone)]
pub struct RrpcConfig(Arc<Inner>);

#[derive(Debug, Clone)]
struct Inner {
    max_message_size: usize,
    ring_size: usize,
    path: PathPreference,
    zero_copy: bool,
    max_chunk: usize,
    call_buffer: usize,
}

impl Default for RrpcConfig {
    fn default() -> Self {
        RrpcConfig(Arc::new(Inner {
            max_message_size: 4 << 20,
            ring_size: 4 << 20,
            path: PathPreference::Fast,
            zero_copy: true,
            max_chunk: 256 << 10,
            call_buffer: 64,
        }))
    }
}

impl RrpcConfig {
    /// The defaults (see the table above).
    pub fn new() -> Self {
        Self::default()
    }
    fn with(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        f(Arc::make_mut(&mut self.0));
        self
    }
    /// Largest gRPC message (after encoding) a call may carry; larger
    /// messages are split into chunks on the wire and rejected whole by the
    /// receiving tonic codec beyond its own limit (4 MiB unless changed).
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] if `bytes` is 0.
    pub fn max_message_size(self, bytes: usize) -> Result<Self, crate::Error> {
        if bytes == 0 {
            return Err(crate::Error::InvalidConfig("max_message_size must be > 0"));
        }
        Ok(self.with(|i| i.max_message_size = bytes))
    }
    /// Size of each direction's ring in bytes.
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] below 4 KiB.
    pub fn ring_size(self, bytes: usize) -> Result<Self, crate::Error> {
        if bytes < 4096 {
            return Err(crate::Error::InvalidConfig("ring_size must be >= 4096"));
        }
        Ok(self.with(|i| i.ring_size = bytes))
    }
    /// Preferred data path.
    pub fn path(self, path: PathPreference) -> Self {
        self.with(|i| i.path = path)
    }
    /// Encode frames straight into the send ring (on) or through an
    /// intermediate buffer (off, for RR-Compound Fig. 14).
    pub fn zero_copy(self, on: bool) -> Self {
        self.with(|i| i.zero_copy = on)
    }
    /// Largest DATA chunk on the fast path.
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] if `bytes` is 0.
    pub fn max_chunk(self, bytes: usize) -> Result<Self, crate::Error> {
        if bytes == 0 {
            return Err(crate::Error::InvalidConfig("max_chunk must be > 0"));
        }
        Ok(self.with(|i| i.max_chunk = bytes))
    }
    /// Per-call receive queue length, in chunks.
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] if `chunks` is 0.
    pub fn call_buffer(self, chunks: usize) -> Result<Self, crate::Error> {
        if chunks == 0 {
            return Err(crate::Error::InvalidConfig("call_buffer must be > 0"));
        }
        Ok(self.with(|i| i.call_buffer = chunks))
    }

    /// See [`RrpcConfig::max_message_size`].
    pub fn get_max_message_size(&self) -> usize {
        self.0.max_message_size
    }
    /// See [`RrpcConfig::ring_size`].
    pub fn get_ring_size(&self) -> usize {
        self.0.ring_size
    }
    /// See [`RrpcConfig::path`].
    pub fn get_path(&self) -> PathPreference {
        self.0.path
    }
    /// See [`RrpcConfig::zero_copy`].
    pub fn get_zero_copy(&self) -> bool {
        self.0.zero_copy
    }
    /// See [`RrpcConfig::max_chunk`].
    pub fn get_max_chunk(&self) -> usize {
        self.0.max_chunk
    }
    /// See [`RrpcConfig::call_buffer`].
    pub fn get_call_buffer(&self) -> usize {
        self.0.call_buffer
    }
}
