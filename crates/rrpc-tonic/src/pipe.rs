//! The message pipe: the one thing rrpc-tonic needs from the layers below.
//!
//! A pipe moves whole messages in order in each direction, with back-pressure
//! when the peer's ring is full (a sender waits; nothing is dropped) and a bounded message
//! size (the ring's slot limit). Both paths are built on it: the fast path puts
//! frames in the messages, the HTTP/2 path puts a byte stream in them.
//!
//! The sender side is shaped after the ring's zero-copy API (RR-Compound
//! §IV-F): [`MsgTx::send_with`] reserves `len` bytes in the send ring, hands
//! the slot to a closure that encodes straight into it, then commits. The
//! receiver hands the borrowed slot to a closure ([`MsgRx::recv_with`]) and
//! releases it when the closure returns: no intermediate buffer on either side.
//!
//! Implementations: [`mem_pair`] (in-process; each message is one heap
//! buffer standing in for a ring slot, with ring-sized byte credit for
//! back-pressure).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::{Semaphore, mpsc};

use crate::Error;

/// A boxed, sendable future.
pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The sending half of a message pipe.
pub(crate) trait MsgTx: Send + 'static {
    /// Largest message the pipe carries, in bytes.
    fn max_message(&self) -> usize;
    /// Largest message the pipe carries best, in bytes (at most
    /// [`MsgTx::max_message`]): writers that can split their data into
    /// messages this large should. Rings: a third of the ring's cache cap,
    /// which keeps a self-sizing ring at a size its cores' caches hold.
    fn preferred_message(&self) -> usize {
        self.max_message()
    }
    /// Reserves `len` bytes, lets `fill` write all of them, then commits.
    ///
    /// Waits while the peer's ring is full. Fails with
    /// [`Error::MessageTooLarge`] if `len > max_message()` and with
    /// [`Error::PeerGone`] when the peer is gone.
    fn send_with<'a>(
        &'a mut self,
        len: usize,
        fill: &'a mut (dyn FnMut(&mut [u8]) + Send),
    ) -> BoxFut<'a, Result<(), Error>>;

    /// Like [`MsgTx::send_with`] but never waits: `Ok(false)` (and `fill`
    /// not called, nothing reserved) when the peer's ring has no room now.
    ///
    /// This is the uncontended fast path of every writer: no future, no
    /// allocation, no wake-up.
    fn try_send_with(
        &mut self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<bool, Error>;

    /// A one-line account of the sender's state for diagnostics (a hung
    /// call's dump): rings report their sender's pointers, what is held
    /// back for completions and the connection's liveness. Never waits
    /// (a sender in use says so).
    fn state(&self) -> String {
        String::new()
    }

    /// The pipe's synchronous side, shared: sends that need no wait, from
    /// any thread, beside the owner of this half (rings: one short step
    /// under the ring's own lock, also while the owner waits for room,
    /// which holds no lock). `None`: only through this half.
    fn direct(&self) -> Option<std::sync::Arc<dyn SyncTx>> {
        None
    }
}

/// [`MsgTx::direct`]: [`MsgTx::try_send_with`] through a shared reference.
pub(crate) trait SyncTx: Send + Sync + 'static {
    /// As [`MsgTx::try_send_with`].
    fn try_send_with(
        &self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<bool, Error>;
}

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
pub(crate) type Pipe = (Box<dyn MsgTx>, Box<dyn MsgRx>);

/// In-process pipe half: sender.
#[derive(Debug)]
pub(crate) struct MemTx {
    tx: mpsc::UnboundedSender<Bytes>,
    credit: Arc<Semaphore>,
    ring: usize,
}

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
    (
        (Box::new(a_tx), Box::new(b_rx)),
        (Box::new(b_tx), Box::new(a_rx)),
    )
}

fn one_way(ring: usize) -> (MemTx, MemRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    let credit = Arc::new(Semaphore::new(ring));
    (
        MemTx {
            tx,
            credit: credit.clone(),
            ring,
        },
        MemRx { rx, credit },
    )
}

impl MsgTx for MemTx {
    fn max_message(&self) -> usize {
        self.ring
    }
    fn send_with<'a>(
        &'a mut self,
        len: usize,
        fill: &'a mut (dyn FnMut(&mut [u8]) + Send),
    ) -> BoxFut<'a, Result<(), Error>> {
        Box::pin(async move {
            let permits = self.permits(len)?;
            let p = self
                .credit
                .acquire_many(permits)
                .await
                .map_err(|_| Error::PeerGone)?;
            p.forget();
            let mut slot = BytesMut::zeroed(len);
            fill(&mut slot);
            self.tx.send(slot.freeze()).map_err(|_| Error::PeerGone)
        })
    }
    fn try_send_with(
        &mut self,
        len: usize,
        fill: &mut (dyn FnMut(&mut [u8]) + Send),
    ) -> Result<bool, Error> {
        let permits = self.permits(len)?;
        match self.credit.try_acquire_many(permits) {
            Ok(p) => p.forget(),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(Error::PeerGone),
            Err(tokio::sync::TryAcquireError::NoPermits) => return Ok(false),
        }
        let mut slot = BytesMut::zeroed(len);
        fill(&mut slot);
        self.tx.send(slot.freeze()).map_err(|_| Error::PeerGone)?;
        Ok(true)
    }
}

impl MemTx {
    fn permits(&self, len: usize) -> Result<u32, Error> {
        if len > self.ring {
            return Err(Error::MessageTooLarge {
                len,
                max: self.ring,
            });
        }
        u32::try_from(len.max(1)).map_err(|_| Error::MessageTooLarge {
            len,
            max: self.ring,
        })
    }
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
