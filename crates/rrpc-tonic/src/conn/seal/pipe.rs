//! [`super`]'s sealing under a message pipe: the lowest place both data
//! paths write and read whole ring messages, so both are covered once.
//!
//! - **Send**: the message is encoded into the reserved ring slot, then
//!   sealed in place there, inside the ring's send step (the ring's lock
//!   is held: sequence numbers follow the publication order, whichever
//!   thread sends) and before the slot is published: the peer never sees
//!   it unsealed on the wire (`conn::Link::sealed`).
//! - **Receive**: the message is copied out of the ring (memory the peer
//!   can still write) into a private buffer and opened there; only then
//!   is the plaintext handed on. A message that fails to open delivers no
//!   byte: the receive fails with [`Error::RingTampered`]
//!   (`tonic::Code::DataLoss`), and the connection with it.
//! - **Sizes**: the tag counts against the ring's limit: the pipe's
//!   `Link::max_message` is the ring's less the tag, and a message
//!   over it is [`Error::MessageTooLarge`], as an oversized one is.

use std::task::{Context, Poll};

use super::{OpenError, Opener, RingCipher, RingSecrets, Role};
use crate::Error;
use crate::conn::{BoxFut, MsgRx, Pipe};

/// `pipe`, every message sealed with `role`'s keys of `secrets`: the
/// sending half seals in place in the ring slot ([`Link::sealed`]), the
/// receiving half opens a private copy.
///
/// [`Link::sealed`]: crate::conn::Link::sealed
pub(crate) fn wrap(pipe: Pipe, secrets: &RingSecrets, role: Role, cipher: RingCipher) -> Pipe {
    let (sealer, opener) = secrets.split(role, cipher);
    let (tx, rx) = pipe;
    (
        tx.sealed(sealer),
        Box::new(SealedRx {
            inner: rx,
            opener,
            scratch: Vec::new(),
        }),
    )
}

struct SealedRx {
    inner: Box<dyn MsgRx>,
    opener: Opener,
    /// The private copy a message is opened in (as large as the largest
    /// message received, at most the ring's limit).
    scratch: Vec<u8>,
}

impl MsgRx for SealedRx {
    fn poll_recv_with(
        &mut self,
        cx: &mut Context<'_>,
        f: &mut dyn FnMut(&[u8]),
    ) -> Poll<Result<bool, Error>> {
        let SealedRx {
            inner,
            opener,
            scratch,
        } = self;
        let mut refused: Option<OpenError> = None;
        let mut open = |m: &[u8]| {
            // Copied out first: the peer can write the ring while we
            // read it; only the copy is authenticated and handed on.
            scratch.clear();
            scratch.extend_from_slice(m);
            match opener.open(scratch) {
                Ok(plain) => f(plain),
                Err(e) => refused = Some(e),
            }
        };
        let got = std::task::ready!(inner.poll_recv_with(cx, &mut open))?;
        if let Some(e) = refused {
            tracing::warn!(error = %e, "rrpc: a sealed ring message was refused; failing the connection");
            return Poll::Ready(Err(Error::RingTampered(e)));
        }
        Poll::Ready(Ok(got))
    }
    fn carrier(&self) -> Option<rrpc_core::QpCarrier> {
        self.inner.carrier()
    }
    fn peer_gone(&self) -> Option<BoxFut<'static, ()>> {
        self.inner.peer_gone()
    }
    fn idle_reads(&self) -> Option<rrpc_poller::rings::IdleReads> {
        self.inner.idle_reads()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::mem_pair;
    use crate::conn::seal::{KEY_LEN, TAG_LEN};

    fn secrets() -> RingSecrets {
        RingSecrets {
            c2s: [9; KEY_LEN],
            s2c: [8; KEY_LEN],
        }
    }

    async fn recv(rx: &mut Box<dyn MsgRx>) -> Result<Vec<u8>, Error> {
        let mut got = Vec::new();
        rx.recv_with(&mut |m: &[u8]| got = m.to_vec()).await?;
        Ok(got)
    }

    /// Both halves sealed: messages arrive whole, both ways; the sealed
    /// pipe's limit is the ring's less the tag, and a message over it is
    /// refused as an oversized one is.
    #[tokio::test]
    async fn sealed_pipes_carry_messages_and_respect_the_limit() {
        let (a, b) = mem_pair(1024);
        let c = RingCipher::preferred();
        let (atx, mut arx) = wrap(a, &secrets(), Role::Client, c);
        let (btx, mut brx) = wrap(b, &secrets(), Role::Server, c);
        assert_eq!(atx.max_message(), 1024 - TAG_LEN);
        atx.send_with(5, &mut |s: &mut [u8]| s.copy_from_slice(b"hello"))
            .await
            .unwrap();
        assert_eq!(recv(&mut brx).await.unwrap(), b"hello");
        assert!(
            btx.try_send_with(3, &mut |s: &mut [u8]| s.copy_from_slice(b"bye"))
                .unwrap()
        );
        assert_eq!(recv(&mut arx).await.unwrap(), b"bye");
        let e = atx
            .send_with(1024 - TAG_LEN + 1, &mut |_: &mut [u8]| {})
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::MessageTooLarge { max, .. } if max == 1024 - TAG_LEN),
            "{e}"
        );
    }

    /// A message written by a sender that does not seal (or that an
    /// attacker wrote) is refused: `DataLoss`, and the callback never
    /// sees a byte of it.
    #[tokio::test]
    async fn an_unsealed_message_delivers_nothing() {
        let ((raw_tx, _), b) = mem_pair(1024);
        let (_, mut brx) = wrap(b, &secrets(), Role::Server, RingCipher::Aes256Gcm);
        raw_tx
            .send_with(40, &mut |s: &mut [u8]| s.fill(7))
            .await
            .unwrap();
        let mut called = false;
        let e = brx
            .recv_with(&mut |_: &[u8]| called = true)
            .await
            .unwrap_err();
        assert!(!called);
        assert_eq!(e.code(), tonic::Code::DataLoss, "{e}");
    }
}
