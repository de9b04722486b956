//! An established connection and the side channel that watches its peer.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::handshake::Message;
use crate::provider::side::Side;
use crate::qp::QueuePair;
use crate::region::Region;

use super::exchange::{Deadline, PeerInfo};
use super::liveness::{Liveness, LivenessWatch};

/// What a logical connection keeps alive beyond a dedicated one (its grants
/// on the shared queue pair, the shared connection): the `logical` module's,
/// behind this seam so that a connection need not know it. Dropped after
/// the queue pair (field order), told first which of our grants to retire.
pub(crate) trait LogicalHold: Send + Sync + std::fmt::Debug {
    /// Keeps `grants` (what the logical connection granted the peer)
    /// registered for the lease; releases older ones.
    fn retire(&self, grants: Vec<(u16, Arc<Region>)>);

    /// Closes the logical connection now, without waiting, its queue pair
    /// failed (a lane: its close is one message on the shared side
    /// channel). Called only when [`Self::is_lane`].
    fn close_now(&self) {}

    /// Whether [`Self::close_now`] closes it (a lane).
    fn is_lane(&self) -> bool {
        false
    }
}

// ---------------------------------------------------------------------------
// Connection
// ---------------------------------------------------------------------------

/// [`Connection::gone_why`]: the side channel closed (or the peer said goodbye).
const GONE_CLOSED: u8 = 0;
/// [`Connection::gone_why`]: the side channel timed out (the peer's host went silent).
const GONE_SILENT: u8 = 1;
/// [`Connection::gone_why`]: the peer's host reset the side channel
/// (`ECONNRESET`): its TCP gave up on this host (its keep-alive ran out: the
/// link may be cut one way only) or its process aborted.
const GONE_RESET: u8 = 2;
/// [`Connection::gone_why`]: the network reports the peer's host unreachable
/// (`EHOSTUNREACH`, `ENETUNREACH`, `ENETDOWN`, `EHOSTDOWN`). A side channel
/// to a host that died can end this way rather than with `ETIMEDOUT`: once
/// its neighbour entry fails, the kernel reports that soft error when the
/// keep-alive or `TCP_USER_TIMEOUT` gives up. The likely cause (inferred,
/// the errno itself was not logged) of a run across two soft-RoCE VMs, one
/// powered off, in which the silent host was reported as a plain close.
const GONE_UNREACHABLE: u8 = 3;

/// What a side channel's read error says about the peer, as a
/// [`Connection::gone_why`]; `None` when it says nothing (try again).
fn gone_reason(e: &io::Error) -> Option<u8> {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => None,
        io::ErrorKind::TimedOut => Some(GONE_SILENT),
        io::ErrorKind::ConnectionReset => Some(GONE_RESET),
        io::ErrorKind::HostUnreachable
        | io::ErrorKind::NetworkUnreachable
        | io::ErrorKind::NetworkDown => Some(GONE_UNREACHABLE),
        _ if e.raw_os_error() == Some(libc::EHOSTDOWN) => Some(GONE_UNREACHABLE),
        // EOF, goodbye bytes, or another socket error: the peer is gone.
        _ => Some(GONE_CLOSED),
    }
}

/// An established connection: a connected queue pair, what the peer granted,
/// and the side channel that tells whether the peer is still there.
#[derive(Debug)]
pub struct Connection {
    pub(crate) qp: Arc<QueuePair>,
    pub(crate) peer: PeerInfo,
    /// The side channel; a lane has none (its liveness is `lane_live`).
    pub(crate) side: Option<Side>,
    /// A lane's liveness (`liveness` module), ended by its lane reader.
    pub(crate) lane_live: Option<Arc<Liveness>>,
    pub(crate) _grants: Vec<(u16, Arc<Region>)>,
    pub(crate) gone: AtomicBool,
    /// Why the peer is gone, once it is: [`GONE_CLOSED`], [`GONE_SILENT`],
    /// [`GONE_RESET`] or [`GONE_UNREACHABLE`].
    pub(crate) gone_why: std::sync::atomic::AtomicU8,
    /// For a logical connection: the peer's grants on the shared queue pair
    /// and the shared connection, both released after `qp` (field order).
    pub(crate) logical: Option<Box<dyn LogicalHold>>,
    /// The side channel carries messages (`conn::mux`): one reader reads
    /// it, and marks the connection gone; [`Self::check_alive`] reads
    /// nothing then.
    pub(crate) muxed: AtomicBool,
    /// Who the peer is ([`Self::peer_key`]), asked of the side channel
    /// once; a lane's is its shared connection's, set when it is made.
    pub(crate) key: std::sync::OnceLock<crate::conn::budget::PeerKey>,
}

impl Connection {
    pub(crate) fn new(
        side: Side,
        qp: QueuePair,
        peer: PeerInfo,
        grants: Vec<(u16, Arc<Region>)>,
    ) -> Result<Self> {
        // The TLS session ends with the handshake (`verbs::side` docs, "TLS").
        let side = side.end_session();
        side.set_timeouts(None)?;
        side.set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        Ok(Connection {
            qp: Arc::new(qp),
            peer,
            side: Some(side),
            lane_live: None,
            _grants: grants,
            gone: AtomicBool::new(false),
            gone_why: std::sync::atomic::AtomicU8::new(GONE_CLOSED),
            logical: None,
            muxed: AtomicBool::new(false),
            key: std::sync::OnceLock::new(),
        })
    }

    /// A lane's connection (`lanes` module): no side channel of its own,
    /// its liveness `live` (ended by the lane reader), its peer the shared
    /// connection's peer `key`.
    pub(crate) fn lane(
        live: Arc<Liveness>,
        qp: QueuePair,
        peer: PeerInfo,
        key: crate::conn::budget::PeerKey,
    ) -> Connection {
        Connection {
            qp: Arc::new(qp),
            peer,
            side: None,
            lane_live: Some(live),
            _grants: Vec::new(),
            gone: AtomicBool::new(false),
            gone_why: std::sync::atomic::AtomicU8::new(GONE_CLOSED),
            logical: None,
            muxed: AtomicBool::new(false),
            key: std::sync::OnceLock::from(key),
        }
    }

    /// The connected queue pair.
    pub fn qp(&self) -> &Arc<QueuePair> {
        &self.qp
    }

    /// What the peer offered.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// The peer's process when it runs on this host (`shm://`: the side
    /// channel's `SO_PEERCRED`); `None` for a remote peer, or when the
    /// kernel does not say.
    pub fn peer_pid(&self) -> Option<i32> {
        match self.peer_key() {
            crate::conn::budget::PeerKey::Process { pid, .. } => Some(pid),
            _ => None,
        }
    }

    /// Who the peer is, as the side channel says (`SO_PEERCRED` on shm,
    /// the address on `rdma://`): what per-peer limits count by.
    pub fn peer_key(&self) -> crate::conn::budget::PeerKey {
        *self.key.get_or_init(|| {
            self.side
                .as_ref()
                .map_or(crate::conn::budget::PeerKey::Unknown, Side::peer_key)
        })
    }

    /// The side channel's fd: becomes readable when the peer closes or says
    /// goodbye. Watch it (tokio `AsyncFd`, `poll(2)`) and call
    /// [`Self::check_alive`] when it fires. `None` for a lane: watch
    /// [`Self::liveness`] instead.
    pub fn liveness_fd(&self) -> Option<BorrowedFd<'_>> {
        self.side.as_ref().map(Side::as_fd)
    }

    /// A lane's liveness, watched without a descriptor (rrpc-core
    /// `conn::liveness`): ready once the lane ended (its peer closed it,
    /// its shared connection failed, or it was closed here). `None` for a
    /// connection with a side channel of its own ([`Self::liveness_fd`]).
    pub fn liveness(&self) -> Option<LivenessWatch> {
        self.lane_live.as_ref().map(Liveness::watch)
    }

    /// Non-blocking liveness check.
    ///
    /// # Errors
    /// Once the peer is gone (the queue pair is failed with the same error):
    /// [`Error::PeerGone`] when the side channel closed or the peer said
    /// goodbye; [`Error::PeerUnresponsive`] when the peer's host stopped
    /// answering (the side channel's keep-alive or `TCP_USER_TIMEOUT` ran
    /// out: no FIN, no RST, the way a host dies or a link is cut), or the
    /// network reports it unreachable.
    pub fn check_alive(&self) -> Result<()> {
        if self.gone.load(Ordering::Acquire) {
            return Err(self.gone_error());
        }
        if self.muxed.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(side) = &self.side else {
            // A lane: its lane reader ends its liveness.
            if self.lane_live.as_ref().is_some_and(|l| l.is_gone()) {
                self.mark_gone();
                return Err(self.gone_error());
            }
            return Ok(());
        };
        let mut b = [0u8; 1];
        let why = match side.read(&mut b) {
            Err(e) => match gone_reason(&e) {
                None => return Ok(()),
                Some(why) => why,
            },
            // EOF, or goodbye bytes: the peer is gone.
            Ok(_) => GONE_CLOSED,
        };
        if why != GONE_CLOSED {
            self.gone_why.store(why, Ordering::Release);
        }
        self.mark_gone();
        Err(self.gone_error())
    }

    /// The error that says why the peer is gone ([`Self::check_alive`]);
    /// [`Error::PeerGone`] while it is not known to be.
    pub fn gone_error(&self) -> Error {
        match self.gone_why.load(Ordering::Acquire) {
            GONE_SILENT => {}
            GONE_UNREACHABLE => {
                return Error::PeerUnresponsive(
                    "its host stopped answering: the network reports it unreachable \
                     (no close was seen: the host is down or the link is cut)"
                        .to_string(),
                );
            }
            _ => return Error::PeerGone,
        }
        let after = self.side.as_ref().and_then(Side::user_timeout_ms);
        Error::PeerUnresponsive(match after {
            Some(ms) if ms > 0 => format!(
                "its host stopped answering: the side channel's keep-alive gave up after {:.1} s \
                 without an answer (no close was seen: the host is down or the link is cut)",
                f64::from(ms) / 1000.0
            ),
            _ => "its host stopped answering: the side channel timed out \
                  (no close was seen: the host is down or the link is cut)"
                .to_string(),
        })
    }

    pub(crate) fn mark_gone(&self) {
        if !self.gone.swap(true, Ordering::AcqRel) {
            let e = self.gone_error();
            tracing::debug!(error = %e, "peer gone");
            self.qp.fail(&e);
            if let Some(l) = &self.lane_live {
                l.end();
            }
        }
    }

    /// Whether the peer reset the side channel (`ECONNRESET`) instead of
    /// closing it or saying goodbye: its process aborted, or its TCP gave
    /// up on this host (its keep-alive ran out: the link may be cut in one
    /// direction only). [`Self::check_alive`] still reports
    /// [`Error::PeerGone`]; this says a little more about how.
    pub fn was_reset(&self) -> bool {
        self.gone_why.load(Ordering::Acquire) == GONE_RESET
    }

    /// Whether the peer is known to be gone (no system call).
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire) || self.lane_live.as_ref().is_some_and(|l| l.is_gone())
    }

    /// Orderly close: tells the peer goodbye and fails our queue pair with
    /// [`Error::NotConnected`]. A lane ([`Self::closes_without_waiting`])
    /// sends its close on the shared side channel instead, waiting for
    /// nothing.
    pub fn close(&self) {
        if self.closes_without_waiting() {
            // A lane: its close goes over the shared side channel (rrpc-core
            // `conn::lanes`); it has no side channel of its own, so no
            // goodbye, and nothing here waits.
            self.qp.fail(&Error::NotConnected);
            self.gone.store(true, Ordering::Release);
            if let Some(l) = &self.logical {
                l.close_now();
            }
            // Our own watchers see it end.
            if let Some(l) = &self.lane_live {
                l.end();
            }
            tracing::debug!("lane closed");
            return;
        }
        if let Some(side) = &self.side {
            let _ = side.set_nonblocking(false);
            // Best effort, never long: 12 bytes into a socket nothing else writes.
            let _ = side.send(&Message::Goodbye, Deadline::after(Duration::from_secs(1)));
            side.shutdown();
        }
        self.qp.fail(&Error::NotConnected);
        self.gone.store(true, Ordering::Release);
        tracing::debug!("connection closed");
    }
}

impl Connection {
    /// Whether [`Self::close`] never waits (a lane's close is one message on
    /// its shared connection's side channel): callers on an async worker
    /// may call it there, with no blocking thread.
    pub fn closes_without_waiting(&self) -> bool {
        self.logical.as_ref().is_some_and(|l| l.is_lane())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(side) = &self.side {
            side.shutdown();
        }
        self.qp.fail(&Error::NotConnected);
        if let Some(l) = &self.logical {
            // The peer may still write into what we granted (module docs of
            // `logical`, "Retired grants").
            l.retire(std::mem::take(&mut self._grants));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read error of the side channel says why the peer left: a silent host
    /// (timed out, or reported unreachable: what a dead host's channel ends
    /// with once its neighbour entry failed), a reset, or a close; a read that
    /// would block says nothing.
    #[test]
    fn a_side_channel_error_says_why_the_peer_left() {
        let os = io::Error::from_raw_os_error;
        for (errno, want) in [
            (libc::EAGAIN, None),
            (libc::EINTR, None),
            (libc::ETIMEDOUT, Some(GONE_SILENT)),
            (libc::ECONNRESET, Some(GONE_RESET)),
            (libc::EHOSTUNREACH, Some(GONE_UNREACHABLE)),
            (libc::ENETUNREACH, Some(GONE_UNREACHABLE)),
            (libc::ENETDOWN, Some(GONE_UNREACHABLE)),
            (libc::EHOSTDOWN, Some(GONE_UNREACHABLE)),
            (libc::EPIPE, Some(GONE_CLOSED)),
        ] {
            assert_eq!(gone_reason(&os(errno)), want, "errno {errno}");
        }
    }
}
