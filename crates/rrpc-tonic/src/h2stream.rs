//! The HTTP/2 path: a byte stream (`AsyncRead + AsyncWrite + Connected`) over a pipe.
//!
//! hyper/h2 run unchanged on top, so every tonic feature works. Two small
//! pump tasks move bytes: writes are cut into messages of at most the ring's
//! message size, received messages are queued as chunks for reads.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

use crate::pipe::Pipe;

/// Information about an rrpc connection, available to tonic handlers through
/// `request.extensions().get::<RrpcConnectInfo>()` on the HTTP/2 path.
#[derive(Debug, Clone)]
pub struct RrpcConnectInfo {
    /// The URI the server listens on.
    pub local: String,
}

/// An rrpc connection as a byte stream, for hyper.
#[derive(Debug)]
pub struct RrpcStream {
    tx: PollSender<Bytes>,
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
    max: usize,
    info: RrpcConnectInfo,
}

impl RrpcStream {
    /// Starts the pump tasks over a negotiated pipe.
    pub(crate) fn new(pipe: Pipe, info: RrpcConnectInfo) -> Self {
        let (mut ptx, mut prx) = pipe;
        let max = ptx.max_message();
        let (wtx, mut wrx) = mpsc::channel::<Bytes>(16);
        tokio::spawn(async move {
            while let Some(b) = wrx.recv().await {
                let mut fill = |slot: &mut [u8]| slot.copy_from_slice(&b);
                if ptx.send_with(b.len(), &mut fill).await.is_err() {
                    break;
                }
            }
        });
        let (rtx, rrx) = mpsc::channel::<Bytes>(16);
        tokio::spawn(async move {
            loop {
                let mut got = Bytes::new();
                let r = prx
                    .recv_with(&mut |m: &[u8]| got = Bytes::copy_from_slice(m))
                    .await;
                match r {
                    Ok(true) => {
                        if !got.is_empty() && rtx.send(got).await.is_err() {
                            break;
                        }
                    }
                    _ => break,
                }
            }
        });
        RrpcStream {
            tx: PollSender::new(wtx),
            rx: rrx,
            cur: Bytes::new(),
            max,
            info,
        }
    }
}

impl AsyncRead for RrpcStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.cur.is_empty() {
            match ready!(self.rx.poll_recv(cx)) {
                Some(b) => self.cur = b,
                None => return Poll::Ready(Ok(())), // EOF
            }
        }
        let n = self.cur.len().min(buf.remaining());
        buf.put_slice(&self.cur[..n]);
        self.cur.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for RrpcStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.tx.poll_reserve(cx)).map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        let n = buf.len().min(self.max);
        self.tx
            .send_item(Bytes::copy_from_slice(&buf[..n]))
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tx.close();
        Poll::Ready(Ok(()))
    }
}

impl tonic::transport::server::Connected for RrpcStream {
    type ConnectInfo = RrpcConnectInfo;
    fn connect_info(&self) -> RrpcConnectInfo {
        self.info.clone()
    }
}
