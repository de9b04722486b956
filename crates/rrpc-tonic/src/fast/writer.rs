//! Shared frame writer: many call tasks, one send ring.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::Mutex;

use crate::Error;
use crate::frame::{self, HEADER_LEN, Kind};
use crate::pipe::MsgTx;

/// One frame to write: header fields and a payload.
#[derive(Debug)]
pub(crate) struct Out {
    pub(crate) kind: Kind,
    pub(crate) flags: u8,
    pub(crate) call_id: u32,
    pub(crate) payload: Bytes,
}

impl Out {
    pub(crate) fn new(kind: Kind, flags: u8, call_id: u32, payload: impl Into<Bytes>) -> Self {
        Out {
            kind,
            flags,
            call_id,
            payload: payload.into(),
        }
    }
    fn wire_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }
}

/// Writes frames into the send ring.
///
/// Zero-copy on: `send_with` reserves the exact length and the frame headers
/// and payloads are written straight into the ring slot (one copy of the
/// payload: tonic's encode buffer → ring). Zero-copy off: the batch is first
/// assembled in a heap buffer, then that buffer is copied into the slot (two
/// copies), the baseline of RR-Compound Fig. 14.
#[derive(Clone)]
pub(crate) struct FrameWriter {
    tx: Arc<Mutex<Box<dyn MsgTx>>>,
    zero_copy: bool,
    /// Largest DATA payload per frame.
    pub(crate) chunk: usize,
}

impl std::fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameWriter")
            .field("zero_copy", &self.zero_copy)
            .field("chunk", &self.chunk)
            .finish()
    }
}

impl FrameWriter {
    pub(crate) fn new(tx: Box<dyn MsgTx>, zero_copy: bool, max_chunk: usize) -> Self {
        let chunk = max_chunk
            .min(tx.max_message().saturating_sub(HEADER_LEN))
            .max(1);
        FrameWriter {
            tx: Arc::new(Mutex::new(tx)),
            zero_copy,
            chunk,
        }
    }

    /// Sends a batch of frames as one ring message when it fits, splitting
    /// DATA payloads larger than the chunk size into several frames (and
    /// messages), so that one large message never starves other calls.
    pub(crate) async fn send(&self, batch: Vec<Out>) -> Result<(), Error> {
        let max_msg = self.tx.lock().await.max_message();
        let mut pending: Vec<Out> = Vec::new();
        let mut pending_len = 0usize;
        for out in batch {
            let mut out = out;
            loop {
                if out.kind == Kind::Data && out.payload.len() > self.chunk {
                    let head = out.payload.split_to(self.chunk);
                    let piece = Out::new(Kind::Data, 0, out.call_id, head);
                    self.push(&mut pending, &mut pending_len, piece, max_msg)
                        .await?;
                    continue;
                }
                self.push(&mut pending, &mut pending_len, out, max_msg)
                    .await?;
                break;
            }
        }
        if !pending.is_empty() {
            self.write_message(&pending, pending_len).await?;
        }
        Ok(())
    }

    async fn push(
        &self,
        pending: &mut Vec<Out>,
        len: &mut usize,
        out: Out,
        max_msg: usize,
    ) -> Result<(), Error> {
        let l = out.wire_len();
        if l > max_msg {
            return Err(Error::MessageTooLarge {
                len: l,
                max: max_msg,
            });
        }
        if *len + l > max_msg {
            self.write_message(pending, *len).await?;
            pending.clear();
            *len = 0;
        }
        *len += l;
        pending.push(out);
        Ok(())
    }

    async fn write_message(&self, frames: &[Out], total: usize) -> Result<(), Error> {
        if self.zero_copy {
            let mut fill = |slot: &mut [u8]| {
                let mut at = 0;
                for f in frames {
                    frame::put_header(
                        &mut slot[at..],
                        f.kind,
                        f.flags,
                        f.call_id,
                        f.payload.len() as u32,
                    );
                    at += HEADER_LEN;
                    slot[at..at + f.payload.len()].copy_from_slice(&f.payload);
                    at += f.payload.len();
                }
            };
            self.tx.lock().await.send_with(total, &mut fill).await
        } else {
            let mut buf = Vec::with_capacity(total);
            for f in frames {
                frame::push_frame(&mut buf, f.kind, f.flags, f.call_id, &f.payload);
            }
            let mut fill = |slot: &mut [u8]| slot.copy_from_slice(&buf);
            self.tx.lock().await.send_with(total, &mut fill).await
        }
    }
}
