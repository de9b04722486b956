//! The message pipe: the one thing rrpc-tonic needs from the layers below.
//!
//! A pipe moves whole messages in order in each direction, with back-pressure
//! when the peer's ring is full (a sender waits; nothing is dropped) and a bounded message
//! size (the ring's slot limit). Both paths are built on it: the fast path puts
//! frames in the messages, the HTTP/2 path puts a byte stream in them.
//!
//! The sending half is the connection's [`Link`] (`conn`): one owner of the
//! ring's sending state, shaped after the ring's zero-copy API (RR-Compound
//! §IV-F): [`Link::send_with`] reserves `len` bytes in the send ring, hands
//! the slot to a closure that encodes straight into it, then publishes. The
//! receiver hands the borrowed slot to a closure ([`MsgRx::recv_with`]) and
//! releases it when the closure returns: no intermediate buffer on either side.
//!
//! Implementations: rings (`rings`), and [`mem_pair`] (in-process; each message is one heap
//! buffer standing in for a ring slot, with ring-sized byte credit for
//! back-pressure).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc};

use crate::Error;
use crate::conn::Link;

/// A boxed, sendable future.
pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The receiving half of a message pipe.
pub(crate) trait MsgRx: Send + 'static {
    /// Waits for the next message and hands it, borrowed, to `f`.
    ///
    /// Returns `Ok(false)` when the peer closed the pipe.
    fn recv_with<'a>(
        &'a mut self,
        f: &'a mut (dyn FnMut(&[u8]) + Send),
    ) -> BoxFut<'a, Result<bool, Error>>;

    /// What carries this pipe, read from its live connection (rings: the
    /// queue pair's provider, device and peer). `None`: not a ring pipe.
    fn carrier(&self) -> Option<rrpc_core::QpCarrier> {
        None
    }

    /// A future that completes when the transport sees the peer leave,
    /// without receiving (rings: the side channel closed). Messages the
    /// peer sent before leaving may still be waiting for [`recv_with`].
    /// `None`: the transport cannot tell (the end shows in `recv_with`).
    ///
    /// [`recv_with`]: MsgRx::recv_with
    fn peer_gone(&self) -> Option<BoxFut<'static, ()>> {
        None
    }

    /// Wakes an owner that reads only on demand when, idle, it has data to
    /// read all the same (rings: the poller's sizing tick found unread data
    /// in a self-sizing ring, such as the peer's resize marker, which must
    /// be read before the peer's ring can shrink). `None`: nothing to read
    /// while idle.
    fn idle_reads(&self) -> Option<rrpc_poller::rings::IdleReads> {
        None
    }
}

/// A connected pipe: both halves.
pub(crate) type Pipe = (Link, Box<dyn MsgRx>);

/// In-process pipe half: receiver.
#[derive(Debug)]
pub(crate) struct MemRx {
    rx: mpsc::UnboundedReceiver<Bytes>,
    credit: Arc<Semaphore>,
}

/// Two connected in-process pipes, each direction with `ring` bytes of credit.
pub(crate) fn mem_pair(ring: usize) -> (Pipe, Pipe) {
    let (a_tx, a_rx) = one_way(ring);
    let (b_tx, b_rx) = one_way(ring);
    ((a_tx, Box::new(b_rx)), (b_tx, Box::new(a_rx)))
}

fn one_way(ring: usize) -> (Link, MemRx) {
    let (tx, rx, credit) = Link::mem(ring);
    (tx, MemRx { rx, credit })
}

impl MsgRx for MemRx {
    fn recv_with<'a>(
        &'a mut self,
        f: &'a mut (dyn FnMut(&[u8]) + Send),
    ) -> BoxFut<'a, Result<bool, Error>> {
        Box::pin(async move {
            match self.rx.recv().await {
                Some(m) => {
                    f(&m);
                    self.credit.add_permits(m.len().max(1));
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }
}

impl Drop for MemRx {
    fn drop(&mut self) {
        // Wake a sender waiting for credit: the peer is gone.
        self.credit.close();
    }
}
