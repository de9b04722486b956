//! What a polling thread checks: the [`Readiness`] trait.

use std::io;
use std::os::fd::BorrowedFd;

/// Anything a polling thread (or a spinning task) can check for "there is something to do".
///
/// For a ring buffer's receive side this is "the slot at the head holds a new message"
/// (`RxWatch::has_data`); for its send side "there is free space again"
/// (`TxWatch::has_space`). The check must be cheap (a few atomic loads: the paper's "quick
/// check of the ring buffer's head", §IV-D), side-effect free and callable from any thread:
/// polling threads call it in a loop for every armed connection.
///
/// Everything beyond [`ready`](Readiness::ready) has a default, so a plain closure-like
/// source only implements one method.
pub trait Readiness: Send + Sync + 'static {
    /// `true` when the waiting task has something to do (new data, free space).
    fn ready(&self) -> bool;

    /// `true` once the peer is known to be gone. Checked together with `ready` for armed
    /// connections, so it must be as cheap (an atomic flag, never a system call). A closed
    /// source wakes its task, which then gets [`Error::PeerGone`](crate::Error::PeerGone),
    /// and is removed from the polling threads.
    fn is_closed(&self) -> bool {
        false
    }

    /// A descriptor that becomes readable when the peer dies (the side channel of an rrpc-core
    /// connection, `Connection::liveness_fd`). A sleeping task watches it through the tokio
    /// reactor in addition to its doorbell, so a dead peer is noticed without any polling.
    fn liveness_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// The peer's liveness without a descriptor (an rrpc-core lane's: its lane reader ends it
    /// when the lane closes or its shared connection fails), for a source with no
    /// [`liveness_fd`](Readiness::liveness_fd). A sleeping task watches it as it would the
    /// fd: it wakes, and gets [`Error::PeerGone`](crate::Error::PeerGone), once it ended. One
    /// watcher per registration (each has a waker slot of its own).
    fn liveness(&self) -> Option<rrpc_core::conn::LivenessWatch> {
        None
    }

    /// The source's own notification mechanism for [`Mode::Event`](crate::Mode::Event), if it
    /// has one (a completion channel: `ibv_req_notify_cq` + the channel fd). Without one, Event
    /// mode uses a per-registration eventfd that the writer rings through a [`Doorbell`](crate::Doorbell).
    fn notifier(&self) -> Option<&dyn Notifier> {
        None
    }

    /// The source's doorbell for [`Mode::Bpev`](crate::Mode::Bpev)'s fallback, if it has one:
    /// a [`Notifier`] whose [`announce_sleep`](Notifier::announce_sleep) tells the writer to
    /// ring (see [`PollerConfig::doorbell_park_after`](crate::PollerConfig::doorbell_park_after)).
    fn doorbell(&self) -> Option<&dyn Notifier> {
        None
    }
}

/// A source-supplied notification channel for [`Mode::Event`](crate::Mode::Event), shaped like
/// a verbs completion channel (rrpc-core's `recv_cq().req_notify()` / `channel_fd()` /
/// `ack_events()`).
///
/// Protocol, as the waiting task runs it: check [`Readiness::ready`]; [`arm`](Notifier::arm);
/// check again (arm-then-recheck, so a message that landed between the first check and the arm
/// is not missed); wait until [`fd`](Notifier::fd) is readable; [`ack`](Notifier::ack).
pub trait Notifier: Send + Sync {
    /// The descriptor that becomes readable after an armed event (an eventfd-like fd).
    ///
    /// # Errors
    /// When the source cannot make it (a shared queue pair's sharer makes its channel on
    /// first use).
    fn fd(&self) -> io::Result<BorrowedFd<'_>>;
    /// Requests one notification for the next event (`ibv_req_notify_cq`).
    ///
    /// # Errors
    /// Whatever the underlying call reports.
    fn arm(&self) -> io::Result<()>;
    /// Consumes the pending notification(s), making `fd` non-readable again. Returns
    /// `Err(WouldBlock)` when there was nothing to consume (a spurious readiness).
    ///
    /// # Errors
    /// `WouldBlock` when nothing was pending, or what the underlying call reports.
    fn ack(&self) -> io::Result<()>;

    /// Tells the writer that the reader is about to sleep, so that it rings this notifier
    /// (a ring's sleep word, `rrpc_ringbuf::RxDoorbell`). Returns once the writer can see it,
    /// or after a bounded wait (the caller's rescans cover what comes before the writer sees
    /// it); the caller then checks once more. The default does nothing: an
    /// [`Mode::Event`](crate::Mode::Event) writer rings for every message anyway.
    ///
    /// # Errors
    /// Whatever the underlying call reports (the caller then relies on rescans).
    fn announce_sleep(&self) -> io::Result<()> {
        Ok(())
    }

    /// Whether an announce followed by the caller's re-check can never miss a message: true
    /// when the writer's tail and the sleep word live in memory both sides access directly
    /// (shm: Dekker's pattern, no lost wake-up). False (the default) on a network, where a tail
    /// WRITE in flight while the announce lands can miss both the re-check and the ring. The
    /// poller lets a sleeping task announce for itself only when this is true; otherwise its
    /// polling thread announces, and rescans once after `idle_poll_interval` to cover the gap.
    fn announce_is_exact(&self) -> bool {
        false
    }
}

impl<F> Readiness for F
where
    F: Fn() -> bool + Send + Sync + 'static,
{
    fn ready(&self) -> bool {
        self()
    }
}
