// The module docs: whole with the `tls` feature (in `tls.md`, beside this
// file); without it, a line (the items they link to exist only with it, and
// docs.rs builds the default features).
#![cfg_attr(feature = "tls", doc = include_str!("tls.md"))]
#![cfg_attr(
    not(feature = "tls"),
    doc = "TLS as tonic users have it: needs rrpc-tonic's `tls` feature."
)]

use std::time::Duration;

#[cfg(feature = "tls")]
pub use imp::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
#[cfg(feature = "tls")]
pub(crate) use imp::{ClientTls, PeerInfo, ServerTls, ticket_of};

/// Stand-ins for a build without the `tls` feature: no value of them
/// exists, so every TLS branch is dead code there.
#[cfg(not(feature = "tls"))]
mod off {
    /// A server's TLS (none without the `tls` feature).
    #[derive(Debug)]
    pub(crate) enum ServerTls {}
    /// A client's TLS (none without the `tls` feature).
    #[derive(Debug)]
    pub(crate) enum ClientTls {}
    /// A TLS peer (none without the `tls` feature).
    #[derive(Debug, Clone)]
    pub(crate) enum PeerInfo {}
}
#[cfg(not(feature = "tls"))]
pub(crate) use off::{ClientTls, PeerInfo, ServerTls};

#[cfg(feature = "tls")]
pub use crate::conn::seal::{OpenError, RingCipher, TAG_LEN, cpu_has_aes};

/// What binds a ring connection to the TLS session its negotiation ran in
/// on an `rrpc://` port: 16 bytes both ends export from that session
/// (RFC 8446 §7.5, label [`TICKET_LABEL`]), so it never crosses the wire
/// inside the negotiation. The client presents it as the first message of
/// the ring connection ([`present_ticket`]); the server redeems it once,
/// within the handshake timeout of the negotiation, for the session's
/// peer identity (`Request::peer_certs()` on the rings) and the session's
/// ring keys (ring encryption, [`crate::RingEncryption`]).
pub(crate) type TicketId = [u8; TICKET_LEN];

/// Why a ring connection's ticket was refused: the server's log and the
/// client's error say which.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unredeemed {
    /// Never issued by this server (another server's, or made up), or
    /// issued so long ago that it was forgotten.
    Unknown,
    /// Already redeemed by another ring connection.
    Spent,
    /// Presented `age` after its negotiation, past its `lifetime`.
    Expired { age: Duration, lifetime: Duration },
}

impl std::fmt::Display for Unredeemed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unredeemed::Unknown => f.write_str("unknown TLS ticket"),
            Unredeemed::Spent => f.write_str("TLS ticket already used"),
            Unredeemed::Expired { age, lifetime } => write!(
                f,
                "TLS ticket expired: presented {age:?} after its negotiation, \
                 its lifetime is {lifetime:?}"
            ),
        }
    }
}

/// The least time a ticket stays redeemable.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
const TICKET_LIFETIME_FLOOR: Duration = Duration::from_secs(30);

/// How long a ticket stays redeemable after the negotiation that issued
/// it, on a server whose handshake timeout is `handshake`: the client's
/// ring connect after the negotiation (a side-channel handshake, on verbs
/// inside its own TLS, then the queue pairs and the rings' registration)
/// is bounded by its own handshake timeouts, and on a slow host (soft-RoCE
/// under emulation) took longer than one handshake timeout of 5 s. A
/// longer life costs little: a ticket is single-use, bound to its TLS
/// session, and at most 4,096 are held.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) fn ticket_lifetime(handshake: Duration) -> Duration {
    handshake.saturating_mul(4).max(TICKET_LIFETIME_FLOOR)
}

/// A ticket and what else its TLS session exported: the ring keys of both
/// directions (never sent; used only when both ends seal).
#[derive(Clone)]
pub(crate) struct Ticket {
    pub(crate) id: TicketId,
    #[cfg(feature = "tls")]
    pub(crate) keys: crate::conn::seal::RingSecrets,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Neither the id nor the keys: both are secrets of the session.
        f.write_str("Ticket(..)")
    }
}

/// A ticket's length.
pub(crate) const TICKET_LEN: usize = 16;
/// The exporter label of a ticket.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) const TICKET_LABEL: &[u8] = b"EXPORTER-rrpc-ring-ticket";
/// The first bytes of the ticket message on a ring connection (plaintext
/// rings asked for).
const TICKET_MAGIC: &[u8; 4] = b"RRPT";
/// The first bytes of the ticket message of a client that asks for ring
/// encryption: then the ticket, then its cipher's id.
const SEALED_TICKET_MAGIC: &[u8; 4] = b"RRPE";
/// The server's answer to a ticket: accepted (then whether the rings are
/// sealed and the cipher's id, 0 for none).
const ACCEPT_MAGIC: &[u8; 4] = b"RRPA";
/// The server's answer to a ticket: refused (then why, UTF-8).
const REFUSE_MAGIC: &[u8; 4] = b"RRPN";
/// The longest reason a refusal carries.
const MAX_REASON: usize = 512;
/// How a refusal for disagreeing ring encryption settings starts (the
/// client reads it as [`crate::Error::RingEncryption`]).
const DISAGREE: &str = "ring encryption: ";

/// A ring connection's ticket message, as the server reads it: the ticket
/// and the cipher the client asks its messages be sealed with (`None`:
/// plaintext asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TicketRequest {
    /// The ticket.
    pub(crate) id: [u8; TICKET_LEN],
    /// The cipher id asked for (`None`: plaintext).
    pub(crate) cipher: Option<u8>,
}

/// The server's answer to a ticket, as the client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TicketReply {
    /// Accepted: sealed with this cipher id, or plaintext (`None`).
    Accepted(Option<u8>),
    /// Refused, and why.
    Refused(String),
}

/// Parses a ticket message (`RRPT` + ticket, or `RRPE` + ticket + cipher
/// id); `None` for anything else.
pub(crate) fn parse_ticket_request(m: &[u8]) -> Option<TicketRequest> {
    if let Some(id) = parse_ticket(m) {
        return Some(TicketRequest { id, cipher: None });
    }
    let rest = m.strip_prefix(SEALED_TICKET_MAGIC)?;
    let (id, cipher) = rest.split_first_chunk::<TICKET_LEN>()?;
    match cipher {
        [c] => Some(TicketRequest {
            id: *id,
            cipher: Some(*c),
        }),
        _ => None,
    }
}

/// Parses the server's answer to a ticket; `None` for anything else (a
/// reason that is not UTF-8 or longer than 512 bytes included).
pub(crate) fn parse_ticket_reply(m: &[u8]) -> Option<TicketReply> {
    if let Some(rest) = m.strip_prefix(ACCEPT_MAGIC) {
        return match rest {
            [0, 0] => Some(TicketReply::Accepted(None)),
            [1, c] if *c != 0 => Some(TicketReply::Accepted(Some(*c))),
            _ => None,
        };
    }
    let why = m.strip_prefix(REFUSE_MAGIC)?;
    if why.len() > MAX_REASON {
        return None;
    }
    std::str::from_utf8(why)
        .ok()
        .map(|w| TicketReply::Refused(w.to_string()))
}

fn encode_request(r: &TicketRequest) -> Vec<u8> {
    let mut m = Vec::with_capacity(4 + TICKET_LEN + 1);
    match r.cipher {
        None => m.extend(TICKET_MAGIC),
        Some(_) => m.extend(SEALED_TICKET_MAGIC),
    }
    m.extend(r.id);
    m.extend(r.cipher);
    m
}

/// A ticket message and a ticket answer, re-encoded when each parses
/// (the fuzz target's round trip).
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_round_trip(m: &[u8]) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    (
        parse_ticket_request(m).map(|r| encode_request(&r)),
        parse_ticket_reply(m).map(|r| encode_reply(&r)),
    )
}

#[cfg_attr(not(feature = "tls"), allow(dead_code))]
fn encode_reply(r: &TicketReply) -> Vec<u8> {
    match r {
        TicketReply::Accepted(c) => {
            let mut m = ACCEPT_MAGIC.to_vec();
            m.extend(match c {
                Some(c) => [1, *c],
                None => [0, 0],
            });
            m
        }
        TicketReply::Refused(why) => {
            let mut m = REFUSE_MAGIC.to_vec();
            let mut end = why.len().min(MAX_REASON);
            while !why.is_char_boundary(end) {
                end -= 1;
            }
            m.extend(&why.as_bytes()[..end]);
            m
        }
    }
}

/// Whether `cfg` seals the ring connection under `pipe` (by its fabric).
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) fn seals(cfg: &crate::RrpcConfig, pipe: &crate::conn::Pipe) -> bool {
    let provider = pipe
        .1
        .carrier()
        .map_or(rrpc_core::ProviderKind::Shm, |c| c.provider);
    cfg.ring_encryption().seals(provider)
}

/// What a client that needs ring encryption is told without TLS.
pub(crate) fn needs_tls() -> crate::Error {
    crate::Error::RingEncryption(
        "RrpcConfig::ring_encryption asks for sealed rings on this fabric, and their keys come \
         from TLS: dial the server's rrpc:// port with RrpcEndpoint::tls_config (feature `tls`)"
            .into(),
    )
}

async fn send(pipe: &mut crate::conn::Pipe, msg: &[u8]) -> Result<(), crate::Error> {
    pipe.0
        .send_with(msg.len(), &mut |s: &mut [u8]| s.copy_from_slice(msg))
        .await
}

/// Sends `t` as the first message of a ring connection (client side),
/// asking for ring encryption when `cfg` seals this connection's fabric,
/// and reads the server's answer (within the handshake timeout). Accepted
/// with sealing, `pipe` is sealed from the next message on.
pub(crate) async fn present_ticket(
    pipe: &mut crate::conn::Pipe,
    t: &Ticket,
    cfg: &crate::RrpcConfig,
) -> Result<(), crate::Error> {
    use crate::Error;
    let want = seals(cfg, pipe);
    #[cfg(feature = "tls")]
    let cipher = RingCipher::preferred();
    #[cfg(not(feature = "tls"))]
    let asked: Option<u8> = want.then_some(0);
    #[cfg(feature = "tls")]
    let asked = want.then_some(cipher.id());
    let msg = encode_request(&TicketRequest {
        id: t.id,
        cipher: asked,
    });
    send(pipe, &msg).await?;
    let mut reply = None;
    let limit = cfg.handshake_timeout();
    let got = tokio::time::timeout(
        limit,
        pipe.1
            .recv_with(&mut |m: &[u8]| reply = parse_ticket_reply(m)),
    )
    .await
    .map_err(|_| {
        Error::Handshake(format!(
            "the server did not answer the ring ticket within {limit:?}"
        ))
    })??;
    if !got {
        return Err(Error::Handshake(
            "the server closed the ring connection before answering its ticket".into(),
        ));
    }
    match reply {
        None => Err(Error::Handshake(
            "the server's answer to the ring ticket does not parse".into(),
        )),
        Some(TicketReply::Refused(why)) => match why.strip_prefix(DISAGREE) {
            Some(w) => Err(Error::RingEncryption(format!("the server refused: {w}"))),
            None => Err(Error::Handshake(format!(
                "the server refused the ring connection: {why}"
            ))),
        },
        Some(TicketReply::Accepted(None)) if !want => Ok(()),
        #[cfg(feature = "tls")]
        Some(TicketReply::Accepted(Some(c))) if want && c == cipher.id() => {
            let plain = std::mem::replace(pipe, crate::conn::mem_pair(1).0);
            *pipe = crate::conn::seal::pipe::wrap(
                plain,
                &t.keys,
                crate::conn::seal::Role::Client,
                cipher,
            );
            Ok(())
        }
        Some(TicketReply::Accepted(c)) => Err(Error::RingEncryption(format!(
            "the server accepted the ticket with {} although this client asked for {}",
            if c.is_some() {
                "sealed rings"
            } else {
                "plaintext rings"
            },
            if want {
                "sealed rings"
            } else {
                "plaintext rings"
            },
        ))),
    }
}

/// Reads the first message of a ring connection as a ticket (server side):
/// `None` if it is anything else, or the peer closed first.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) async fn read_ticket(
    pipe: &mut crate::conn::Pipe,
) -> Result<Option<TicketRequest>, crate::Error> {
    let mut got = None;
    if !pipe
        .1
        .recv_with(&mut |m: &[u8]| got = parse_ticket_request(m))
        .await?
    {
        return Ok(None);
    }
    Ok(got)
}

/// The server's side of the ticket exchange on a ring connection of a
/// TLS port: reads the ticket, redeems it, checks that both ends agree on
/// ring encryption (`cfg`'s setting for this fabric against the client's
/// ask), answers, and seals `pipe` when agreed. A refusal is answered
/// with its reason (the client reports it) and returned.
#[cfg(feature = "tls")]
pub(crate) async fn accept_ticket(
    pipe: &mut crate::conn::Pipe,
    tls: &ServerTls,
    cfg: &crate::RrpcConfig,
) -> Result<PeerInfo, crate::Error> {
    use crate::Error;
    let refuse = |why: String| TicketReply::Refused(why);
    let request = read_ticket(pipe).await?;
    let want = seals(cfg, pipe);
    let (verdict, err) = match request {
        // Not a client of this exchange: it would read an answer as its
        // first message; closed without one.
        None => {
            return Err(Error::Handshake(
                "a ring connection on a port with TLS presented no ticket \
                 (dial the port with RrpcEndpoint::tls_config, not its socket)"
                    .into(),
            ));
        }
        Some(r) => match tls.redeem(&r.id) {
            Err(why) => {
                tracing::warn!(reason = %why, "rrpc: a ring connection's TLS ticket was refused");
                (
                    refuse(why.to_string()),
                    Error::Handshake(format!("a ring connection was refused: {why}")),
                )
            }
            Ok((peer, keys)) => match (want, r.cipher.map(RingCipher::from_id)) {
                (false, None) => {
                    send(pipe, &encode_reply(&TicketReply::Accepted(None))).await?;
                    return Ok(peer);
                }
                (true, Some(Some(c))) => {
                    send(pipe, &encode_reply(&TicketReply::Accepted(Some(c.id())))).await?;
                    let plain = std::mem::replace(pipe, crate::conn::mem_pair(1).0);
                    *pipe = crate::conn::seal::pipe::wrap(
                        plain,
                        &keys,
                        crate::conn::seal::Role::Server,
                        c,
                    );
                    return Ok(peer);
                }
                (true, Some(None)) => {
                    let w = "the client asked for a cipher this server does not know";
                    (
                        refuse(format!("{DISAGREE}{w}")),
                        Error::RingEncryption(w.into()),
                    )
                }
                (true, None) => {
                    let w = "the server requires sealed rings on this fabric \
                             (RrpcConfig::ring_encryption) and the client did not ask for them";
                    (
                        refuse(format!("{DISAGREE}{w}")),
                        Error::RingEncryption(w.into()),
                    )
                }
                (false, Some(_)) => {
                    let w = "the client asked for sealed rings and this server has ring \
                             encryption off on this fabric (RrpcConfig::ring_encryption)";
                    (
                        refuse(format!("{DISAGREE}{w}")),
                        Error::RingEncryption(w.into()),
                    )
                }
            },
        },
    };
    // Best effort: the refusal is for the client's report; ours stands.
    let _ = send(pipe, &encode_reply(&verdict)).await;
    linger(pipe, cfg.handshake_timeout()).await;
    Err(err)
}

/// Waits, within `bound`, until the peer closes `pipe` after a refusal was
/// sent on it, discarding what it sends: on verbs the refusal is an RDMA
/// write that a lossy wire may have to retransmit, and closing the queue
/// pair at once lost it (the client saw the connection closed, not why).
/// The client closes once it has read the refusal.
#[cfg(feature = "tls")]
async fn linger(pipe: &mut crate::conn::Pipe, bound: Duration) {
    let _ = tokio::time::timeout(bound, async {
        while let Ok(true) = pipe.1.recv_with(&mut |_: &[u8]| {}).await {}
    })
    .await;
}

/// A connection for tonic's server (the HTTP/2 path over rings) with the
/// TLS peer its ticket named, if any: its connect info carries the peer
/// beside the stream's own, and [`split_peer`] puts both in each request.
#[derive(Debug)]
pub(crate) struct WithPeer<S> {
    pub(crate) inner: S,
    pub(crate) peer: Option<PeerInfo>,
}

/// [`WithPeer`]'s connect info.
#[derive(Debug, Clone)]
pub(crate) struct PeerConnectInfo<I> {
    inner: I,
    peer: Option<PeerInfo>,
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for WithPeer<S> {
    type ConnectInfo = PeerConnectInfo<S::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        PeerConnectInfo {
            inner: self.inner.connect_info(),
            peer: self.peer.clone(),
        }
    }
}

/// Replaces a request's [`PeerConnectInfo`] with what it carries: the
/// stream's own connect info (`RrpcConnectInfo`) and, with a TLS peer,
/// tonic's `TlsConnectInfo` (`Request::peer_certs()`). The outermost
/// layer of the tonic server that serves [`WithPeer`] streams.
pub(crate) fn split_peer<I: Clone + Send + Sync + 'static>(
    mut req: http::Request<tonic::body::Body>,
) -> http::Request<tonic::body::Body> {
    if let Some(c) = req.extensions_mut().remove::<PeerConnectInfo<I>>() {
        req.extensions_mut().insert(c.inner);
        if let Some(p) = c.peer {
            req.extensions_mut().insert(p);
        }
    }
    req
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WithPeer<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WithPeer<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A plaintext ticket message's ticket.
fn parse_ticket(m: &[u8]) -> Option<TicketId> {
    let rest = m.strip_prefix(TICKET_MAGIC)?;
    rest.try_into().ok()
}

/// The first byte of a TLS record carrying a handshake (a ClientHello).
pub(crate) const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The prefix of a port's refusal of a plaintext hello when it requires
/// TLS (the client maps it to [`crate::Error::Handshake`] with the fix).
pub(crate) const TLS_REQUIRED: &str = "this server requires TLS";

#[cfg(feature = "tls")]
mod imp {
    use std::io::Cursor;
    use std::sync::Arc;
    use std::time::Duration;

    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Instant;

    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, TrustAnchor};
    use tokio::io::{AsyncRead, AsyncWrite};
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

    use crate::Error;
    use crate::conn::seal::{KEY_LABEL_C2S, KEY_LABEL_S2C, KEY_LEN, RingSecrets};
    use crate::tls::{TICKET_LABEL, TICKET_LEN, Ticket, TicketId, Unredeemed};

    /// What a request learns of a TLS peer: tonic's own type, which
    /// `Request::peer_certs()` reads.
    pub(crate) type PeerInfo = TlsConnectInfo<TcpConnectInfo>;

    /// The most tickets a server holds unredeemed.
    const MAX_TICKETS: usize = 4096;

    /// The ticket of a finished TLS session and its ring keys
    /// ([`super::Ticket`]; RFC 8446 §7.5, one exporter label each).
    pub(crate) fn ticket_of<D>(c: &rustls::ConnectionCommon<D>) -> Result<Ticket, Error> {
        let export = |label: &[u8]| {
            c.export_keying_material([0u8; KEY_LEN], label, None)
                .map_err(|e| Error::Tls(format!("exporting the ring keys: {e}")))
        };
        Ok(Ticket {
            id: c
                .export_keying_material([0u8; TICKET_LEN], TICKET_LABEL, None)
                .map_err(|e| Error::Tls(format!("exporting the ring ticket: {e}")))?,
            keys: RingSecrets {
                c2s: export(KEY_LABEL_C2S)?,
                s2c: export(KEY_LABEL_S2C)?,
            },
        })
    }

    /// HTTP/2's ALPN id: tonic's connector requires it, and grpc-go
    /// refuses a server that does not select it.
    const ALPN_H2: &[u8] = b"h2";

    /// A PEM-encoded X.509 certificate (one or more), as
    /// `tonic::transport::Certificate`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Certificate {
        pem: Vec<u8>,
    }

    impl Certificate {
        /// A PEM-encoded certificate; it must hold at least one
        /// certificate (checked where it is used).
        pub fn from_pem(pem: impl AsRef<[u8]>) -> Self {
            Certificate {
                pem: pem.as_ref().to_vec(),
            }
        }

        /// The PEM.
        pub fn get_ref(&self) -> &[u8] {
            &self.pem
        }

        /// The PEM, taken out.
        pub fn into_inner(self) -> Vec<u8> {
            self.pem
        }

        fn tonic(&self) -> tonic::transport::Certificate {
            tonic::transport::Certificate::from_pem(&self.pem)
        }

        fn ders(&self) -> Result<Vec<CertificateDer<'static>>, Error> {
            let certs = CertificateDer::pem_reader_iter(&mut Cursor::new(&self.pem))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| Error::InvalidConfig("TLS: a certificate's PEM does not parse"))?;
            if certs.is_empty() {
                return Err(Error::InvalidConfig(
                    "TLS: a certificate's PEM holds no certificate",
                ));
            }
            Ok(certs)
        }
    }

    impl AsRef<[u8]> for Certificate {
        fn as_ref(&self) -> &[u8] {
            &self.pem
        }
    }

    impl From<tonic::transport::Certificate> for Certificate {
        fn from(c: tonic::transport::Certificate) -> Self {
            Certificate {
                pem: c.into_inner(),
            }
        }
    }

    /// A certificate chain and its private key, PEM-encoded, as
    /// `tonic::transport::Identity`.
    #[derive(Clone)]
    pub struct Identity {
        cert: Certificate,
        key: Vec<u8>,
    }

    impl std::fmt::Debug for Identity {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Identity")
                .field("cert", &self.cert)
                .finish_non_exhaustive()
        }
    }

    impl Identity {
        /// A PEM-encoded certificate chain and private key (PKCS#8, PKCS#1
        /// or SEC1).
        pub fn from_pem(cert: impl AsRef<[u8]>, key: impl AsRef<[u8]>) -> Self {
            Identity {
                cert: Certificate::from_pem(cert),
                key: key.as_ref().to_vec(),
            }
        }

        fn tonic(&self) -> tonic::transport::Identity {
            tonic::transport::Identity::from_pem(&self.cert.pem, &self.key)
        }

        fn ders(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
            let key =
                PrivateKeyDer::from_pem_reader(&mut Cursor::new(&self.key)).map_err(|_| {
                    Error::InvalidConfig("TLS: the identity's key PEM holds no private key")
                })?;
            Ok((self.cert.ders()?, key))
        }
    }

    /// A server's TLS settings, as `tonic::transport::ServerTlsConfig`.
    #[derive(Debug, Clone, Default)]
    pub struct ServerTlsConfig {
        identity: Option<Identity>,
        client_ca_root: Option<Certificate>,
        client_auth_optional: bool,
        ignore_client_order: bool,
        use_key_log: bool,
        timeout: Option<Duration>,
    }

    impl ServerTlsConfig {
        /// No identity yet (one is required).
        pub fn new() -> Self {
            Self::default()
        }

        /// The server's certificate chain and key.
        #[must_use]
        pub fn identity(self, identity: Identity) -> Self {
            ServerTlsConfig {
                identity: Some(identity),
                ..self
            }
        }

        /// Requires clients to present a certificate this CA signed (mTLS).
        #[must_use]
        pub fn client_ca_root(self, cert: Certificate) -> Self {
            ServerTlsConfig {
                client_ca_root: Some(cert),
                ..self
            }
        }

        /// With a client CA: also admit clients that present no
        /// certificate (a certificate presented is still verified).
        #[must_use]
        pub fn client_auth_optional(self, optional: bool) -> Self {
            ServerTlsConfig {
                client_auth_optional: optional,
                ..self
            }
        }

        /// Choose the cipher suite by the server's order, not the client's.
        #[must_use]
        pub fn ignore_client_order(self, ignore: bool) -> Self {
            ServerTlsConfig {
                ignore_client_order: ignore,
                ..self
            }
        }

        /// Log the session keys to the file `$SSLKEYLOGFILE` names (for
        /// debugging with a packet capture; never in production).
        #[must_use]
        pub fn use_key_log(self) -> Self {
            ServerTlsConfig {
                use_key_log: true,
                ..self
            }
        }

        /// A bound on the TLS handshake (tonic's; on the `rrpc://` port the
        /// shorter of it and [`crate::RrpcConfig::handshake_timeout`]).
        #[must_use]
        pub fn timeout(self, timeout: Duration) -> Self {
            ServerTlsConfig {
                timeout: Some(timeout),
                ..self
            }
        }
    }

    /// A client's TLS settings, as `tonic::transport::ClientTlsConfig`.
    #[derive(Debug, Clone, Default)]
    pub struct ClientTlsConfig {
        domain: Option<String>,
        certs: Vec<Certificate>,
        trust_anchors: Vec<TrustAnchor<'static>>,
        identity: Option<Identity>,
        assume_http2: bool,
        use_key_log: bool,
        timeout: Option<Duration>,
    }

    impl ClientTlsConfig {
        /// No trusted CA yet (one is required: rrpc has no system roots).
        pub fn new() -> Self {
            Self::default()
        }

        /// The name the server's certificate must carry (default: the
        /// URI's host).
        #[must_use]
        pub fn domain_name(self, domain_name: impl Into<String>) -> Self {
            ClientTlsConfig {
                domain: Some(domain_name.into()),
                ..self
            }
        }

        /// A CA whose certificates the client trusts.
        #[must_use]
        pub fn ca_certificate(mut self, cert: Certificate) -> Self {
            self.certs.push(cert);
            self
        }

        /// CAs whose certificates the client trusts.
        #[must_use]
        pub fn ca_certificates(mut self, certs: impl IntoIterator<Item = Certificate>) -> Self {
            self.certs.extend(certs);
            self
        }

        /// A trust anchor (a CA's name and key, without its certificate).
        #[must_use]
        pub fn trust_anchor(mut self, anchor: TrustAnchor<'static>) -> Self {
            self.trust_anchors.push(anchor);
            self
        }

        /// Trust anchors.
        #[must_use]
        pub fn trust_anchors(
            mut self,
            anchors: impl IntoIterator<Item = TrustAnchor<'static>>,
        ) -> Self {
            self.trust_anchors.extend(anchors);
            self
        }

        /// Log the session keys to the file `$SSLKEYLOGFILE` names (for
        /// debugging with a packet capture; never in production).
        #[must_use]
        pub fn use_key_log(self) -> Self {
            ClientTlsConfig {
                use_key_log: true,
                ..self
            }
        }

        /// The client's own certificate and key (mTLS).
        #[must_use]
        pub fn identity(self, identity: Identity) -> Self {
            ClientTlsConfig {
                identity: Some(identity),
                ..self
            }
        }

        /// Accept a server that does not select HTTP/2 by ALPN (tonic's).
        #[must_use]
        pub fn assume_http2(self, assume_http2: bool) -> Self {
            ClientTlsConfig {
                assume_http2,
                ..self
            }
        }

        /// A bound on the TLS handshake (tonic's; rrpc's connects are also
        /// bounded by `connect_timeout` or the handshake timeout).
        #[must_use]
        pub fn timeout(self, timeout: Duration) -> Self {
            ClientTlsConfig {
                timeout: Some(timeout),
                ..self
            }
        }
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
    }

    fn rustls_error(what: &'static str, e: &rustls::Error) -> Error {
        tracing::warn!(error = %e, "rrpc: {what}");
        Error::InvalidConfig(what)
    }

    /// A server's TLS, built once: tonic's config for the legs tonic
    /// serves, rustls's for the port and the verbs side channel.
    pub(crate) struct ServerTls {
        tonic: tonic::transport::ServerTlsConfig,
        config: Arc<rustls::ServerConfig>,
        timeout: Option<Duration>,
        /// Tickets issued to negotiations that chose a ring fabric.
        tickets: Tickets<(PeerInfo, RingSecrets)>,
    }

    /// Tickets issued and not yet redeemed, with their peers and expiry,
    /// and the ids of the last ones redeemed (for the refusal's reason).
    pub(crate) struct Tickets<P> {
        state: Mutex<TicketState<P>>,
        max: usize,
    }

    struct TicketState<P> {
        live: HashMap<TicketId, Issued<P>>,
        /// The ids redeemed last, oldest first (at most `max`).
        spent: std::collections::VecDeque<TicketId>,
    }

    struct Issued<P> {
        peer: P,
        at: Instant,
        until: Instant,
    }

    impl<P> Tickets<P> {
        fn new(max: usize) -> Self {
            Tickets {
                state: Mutex::new(TicketState {
                    live: HashMap::new(),
                    spent: std::collections::VecDeque::new(),
                }),
                max,
            }
        }

        /// Issues `ticket` for `peer`, redeemable once within `ttl`; past
        /// the bound the oldest goes (a client that never dials its ring
        /// loses nothing but its own ticket).
        fn issue(&self, ticket: TicketId, peer: P, ttl: Duration) {
            let now = Instant::now();
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let t = &mut s.live;
            // Expired tickets stay until the next issue, so that a late
            // one is refused as late, not as unknown.
            t.retain(|_, i| i.until + ttl > now);
            if t.len() >= self.max
                && let Some(oldest) = t.iter().min_by_key(|(_, i)| i.until).map(|(k, _)| *k)
            {
                t.remove(&oldest);
            }
            t.insert(
                ticket,
                Issued {
                    peer,
                    at: now,
                    until: now + ttl,
                },
            );
        }

        /// The peer of `ticket`, once, if it has not expired; else why not.
        fn redeem(&self, ticket: &TicketId) -> Result<P, Unredeemed> {
            let now = Instant::now();
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let Some(i) = s.live.remove(ticket) else {
                return Err(if s.spent.contains(ticket) {
                    Unredeemed::Spent
                } else {
                    Unredeemed::Unknown
                });
            };
            if s.spent.len() >= self.max {
                s.spent.pop_front();
            }
            s.spent.push_back(*ticket);
            if i.until > now {
                Ok(i.peer)
            } else {
                Err(Unredeemed::Expired {
                    age: now - i.at,
                    lifetime: i.until - i.at,
                })
            }
        }
    }

    impl std::fmt::Debug for ServerTls {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ServerTls")
                .field("client_auth", &self.tonic)
                .field("timeout", &self.timeout)
                .finish_non_exhaustive()
        }
    }

    impl ServerTls {
        /// Both configs from `c`, as tonic builds its acceptor.
        pub(crate) fn new(c: &ServerTlsConfig) -> Result<Self, Error> {
            let identity = c.identity.as_ref().ok_or(Error::InvalidConfig(
                "TLS: ServerTlsConfig needs an identity",
            ))?;
            let builder = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| rustls_error("TLS: the crypto provider has no protocol", &e))?;
            let builder = match &c.client_ca_root {
                None => builder.with_no_client_auth(),
                Some(ca) => {
                    let mut roots = rustls::RootCertStore::empty();
                    let (added, _) = roots.add_parsable_certificates(ca.ders()?);
                    if added == 0 {
                        return Err(Error::InvalidConfig(
                            "TLS: the client CA root holds no usable certificate",
                        ));
                    }
                    let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                        roots.into(),
                        provider(),
                    );
                    let v = if c.client_auth_optional {
                        v.allow_unauthenticated()
                    } else {
                        v
                    };
                    let v = v.build().map_err(|e| {
                        tracing::warn!(error = %e, "rrpc: TLS client verifier");
                        Error::InvalidConfig("TLS: the client CA root was refused by rustls")
                    })?;
                    builder.with_client_cert_verifier(v)
                }
            };
            let (chain, key) = identity.ders()?;
            let mut config = builder.with_single_cert(chain, key).map_err(|e| {
                rustls_error(
                    "TLS: rustls refused the identity (does the key match the certificate?)",
                    &e,
                )
            })?;
            config.ignore_client_order = c.ignore_client_order;
            if c.use_key_log {
                config.key_log = Arc::new(rustls::KeyLogFile::new());
            }
            config.alpn_protocols.push(ALPN_H2.to_vec());
            let mut t = tonic::transport::ServerTlsConfig::new()
                .identity(identity.tonic())
                .client_auth_optional(c.client_auth_optional)
                .ignore_client_order(c.ignore_client_order);
            if let Some(ca) = &c.client_ca_root {
                t = t.client_ca_root(ca.tonic());
            }
            if let Some(d) = c.timeout {
                t = t.timeout(d);
            }
            if c.use_key_log {
                t = t.use_key_log();
            }
            Ok(ServerTls {
                tonic: t,
                config: Arc::new(config),
                timeout: c.timeout,
                tickets: Tickets::new(MAX_TICKETS),
            })
        }

        /// Issues `ticket` for `peer`, redeemable once within `ttl`.
        pub(crate) fn issue(&self, ticket: Ticket, peer: PeerInfo, ttl: Duration) {
            self.tickets.issue(ticket.id, (peer, ticket.keys), ttl);
        }

        /// The peer and the ring keys of `ticket`, once, if it has not
        /// expired; else why not.
        pub(crate) fn redeem(
            &self,
            ticket: &TicketId,
        ) -> Result<(PeerInfo, RingSecrets), Unredeemed> {
            self.tickets.redeem(ticket)
        }

        /// tonic's config, for the legs tonic terminates.
        pub(crate) fn tonic(&self) -> tonic::transport::ServerTlsConfig {
            self.tonic.clone()
        }

        /// rustls's config (the verbs side channel's).
        #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
        pub(crate) fn rustls(&self) -> &Arc<rustls::ServerConfig> {
            &self.config
        }

        /// Runs the server side of a TLS handshake on `io`.
        pub(crate) async fn accept<IO>(
            &self,
            io: IO,
        ) -> Result<tokio_rustls::server::TlsStream<IO>, Error>
        where
            IO: AsyncRead + AsyncWrite + Unpin,
        {
            let accept = tokio_rustls::TlsAcceptor::from(self.config.clone()).accept(io);
            let r = match self.timeout {
                Some(t) => tokio::time::timeout(t, accept)
                    .await
                    .map_err(|_| Error::Handshake(format!("TLS handshake took over {t:?}")))?,
                None => accept.await,
            };
            r.map_err(|e| Error::Handshake(format!("TLS handshake: {e}")))
        }
    }

    /// A client's TLS, built once: tonic's config for `http://`, rustls's
    /// for the port and the verbs side channel.
    pub(crate) struct ClientTls {
        tonic: tonic::transport::ClientTlsConfig,
        config: Arc<rustls::ClientConfig>,
        domain: Option<String>,
        assume_http2: bool,
        timeout: Option<Duration>,
    }

    impl std::fmt::Debug for ClientTls {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ClientTls")
                .field("domain", &self.domain)
                .field("timeout", &self.timeout)
                .finish_non_exhaustive()
        }
    }

    impl ClientTls {
        /// Both configs from `c`, as tonic builds its connector.
        pub(crate) fn new(c: &ClientTlsConfig) -> Result<Self, Error> {
            let mut roots = rustls::RootCertStore::from_iter(c.trust_anchors.iter().cloned());
            for ca in &c.certs {
                roots.add_parsable_certificates(ca.ders()?);
            }
            if roots.is_empty() {
                return Err(Error::InvalidConfig(
                    "TLS: ClientTlsConfig needs a CA certificate (ca_certificate) or a trust anchor",
                ));
            }
            let builder = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| rustls_error("TLS: the crypto provider has no protocol", &e))?
                .with_root_certificates(roots);
            let mut config = match &c.identity {
                Some(id) => {
                    let (chain, key) = id.ders()?;
                    builder.with_client_auth_cert(chain, key).map_err(|e| {
                        rustls_error(
                            "TLS: rustls refused the client identity (does the key match?)",
                            &e,
                        )
                    })?
                }
                None => builder.with_no_client_auth(),
            };
            if c.use_key_log {
                config.key_log = Arc::new(rustls::KeyLogFile::new());
            }
            config.alpn_protocols.push(ALPN_H2.to_vec());
            let mut t = tonic::transport::ClientTlsConfig::new()
                .ca_certificates(c.certs.iter().map(Certificate::tonic))
                .trust_anchors(c.trust_anchors.iter().cloned())
                .assume_http2(c.assume_http2);
            if c.use_key_log {
                t = t.use_key_log();
            }
            if let Some(d) = &c.domain {
                t = t.domain_name(d.clone());
            }
            if let Some(id) = &c.identity {
                t = t.identity(id.tonic());
            }
            if let Some(d) = c.timeout {
                t = t.timeout(d);
            }
            Ok(ClientTls {
                tonic: t,
                config: Arc::new(config),
                domain: c.domain.clone(),
                assume_http2: c.assume_http2,
                timeout: c.timeout,
            })
        }

        /// tonic's config, for `http://` and `unix://`.
        pub(crate) fn tonic(&self) -> tonic::transport::ClientTlsConfig {
            self.tonic.clone()
        }

        /// rustls's config (the verbs side channel's).
        #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
        pub(crate) fn rustls(&self) -> &Arc<rustls::ClientConfig> {
            &self.config
        }

        /// The name the server's certificate must carry: the configured
        /// domain, else `host` (a `host:port`'s host, brackets removed).
        pub(crate) fn server_name(&self, addr: &str) -> Result<ServerName<'static>, Error> {
            let host = match &self.domain {
                Some(d) => d.as_str(),
                None => host_of(addr),
            };
            ServerName::try_from(host.to_string()).map_err(|_| Error::InvalidUri {
                uri: addr.to_string(),
                reason: "TLS: the host is no valid server name (set ClientTlsConfig::domain_name)"
                    .into(),
            })
        }

        /// Runs the client side of a TLS handshake on `io` to `addr`
        /// (`host:port`).
        pub(crate) async fn connect<IO>(
            &self,
            addr: &str,
            io: IO,
        ) -> Result<tokio_rustls::client::TlsStream<IO>, Error>
        where
            IO: AsyncRead + AsyncWrite + Unpin,
        {
            let name = self.server_name(addr)?;
            let connect = tokio_rustls::TlsConnector::from(self.config.clone()).connect(name, io);
            let r = match self.timeout {
                Some(t) => tokio::time::timeout(t, connect)
                    .await
                    .map_err(|_| Error::Handshake(format!("TLS handshake took over {t:?}")))?,
                None => connect.await,
            };
            let s = r.map_err(|e| {
                Error::Handshake(format!(
                    "rrpc://{addr}: TLS handshake: {e} (does the server have TLS, \
                     and does this client trust its certificate?)"
                ))
            })?;
            if !self.assume_http2 && s.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
                return Err(Error::Handshake(format!(
                    "rrpc://{addr}: the server did not select HTTP/2 by ALPN"
                )));
            }
            Ok(s)
        }
    }

    /// The host of `host:port` (`[v6]:port` without brackets).
    fn host_of(addr: &str) -> &str {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']')
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn pair() -> (String, String) {
            let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("rcgen");
            (c.cert.pem(), c.signing_key.serialize_pem())
        }

        #[test]
        fn configs_build_from_pems_and_bad_pems_are_clear_errors() {
            let (cert, key) = pair();
            let s = ServerTls::new(
                &ServerTlsConfig::new()
                    .identity(Identity::from_pem(&cert, &key))
                    .client_ca_root(Certificate::from_pem(&cert)),
            )
            .expect("server");
            assert_eq!(s.rustls().alpn_protocols, vec![b"h2".to_vec()]);
            let c = ClientTls::new(
                &ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(&cert).into())
                    .identity(Identity::from_pem(&cert, &key)),
            )
            .expect("client");
            assert!(c.server_name("localhost:5").is_ok());
            assert!(c.server_name("[::1]:5").is_ok());
            assert!(c.server_name("127.0.0.1:5").is_ok());
            for (e, says) in [
                (
                    ServerTls::new(&ServerTlsConfig::new()).unwrap_err(),
                    "needs an identity",
                ),
                (
                    ServerTls::new(
                        &ServerTlsConfig::new().identity(Identity::from_pem("junk", &key)),
                    )
                    .unwrap_err(),
                    "no certificate",
                ),
                (
                    ServerTls::new(
                        &ServerTlsConfig::new().identity(Identity::from_pem(&cert, "junk")),
                    )
                    .unwrap_err(),
                    "no private key",
                ),
                (
                    ClientTls::new(&ClientTlsConfig::new()).unwrap_err(),
                    "needs a CA",
                ),
            ] {
                assert!(
                    matches!(&e, Error::InvalidConfig(m) if m.contains(says)),
                    "{e}"
                );
            }
            // A key of another certificate.
            let (_, other) = pair();
            let e =
                ServerTls::new(&ServerTlsConfig::new().identity(Identity::from_pem(&cert, &other)))
                    .unwrap_err();
            assert!(
                matches!(&e, Error::InvalidConfig(m) if m.contains("key match")),
                "{e}"
            );
        }

        #[test]
        fn a_ticket_is_redeemed_once_and_not_after_it_expires() {
            let t = Tickets::new(2);
            let long = Duration::from_secs(3600);
            t.issue([1; TICKET_LEN], "a", long);
            assert_eq!(
                t.redeem(&[2; TICKET_LEN]),
                Err(Unredeemed::Unknown),
                "never issued"
            );
            assert_eq!(t.redeem(&[1; TICKET_LEN]), Ok("a"));
            assert_eq!(t.redeem(&[1; TICKET_LEN]), Err(Unredeemed::Spent));
            // Expired (a zero lifetime has passed by the time it is read).
            t.issue([3; TICKET_LEN], "c", Duration::ZERO);
            assert!(
                matches!(
                    t.redeem(&[3; TICKET_LEN]),
                    Err(Unredeemed::Expired { lifetime, .. }) if lifetime == Duration::ZERO
                ),
                "expired"
            );
            // Past the bound the oldest goes.
            t.issue([4; TICKET_LEN], "d", long);
            t.issue([5; TICKET_LEN], "e", long + Duration::from_secs(1));
            t.issue([6; TICKET_LEN], "f", long + Duration::from_secs(2));
            assert_eq!(
                t.redeem(&[4; TICKET_LEN]),
                Err(Unredeemed::Unknown),
                "the oldest went"
            );
            assert_eq!(t.redeem(&[5; TICKET_LEN]), Ok("e"));
            assert_eq!(t.redeem(&[6; TICKET_LEN]), Ok("f"));
            // The refusal's reason names the lifetime a late client missed.
            let late = Unredeemed::Expired {
                age: Duration::from_secs(7),
                lifetime: Duration::from_secs(5),
            };
            assert!(late.to_string().contains("expired"), "{late}");
        }

        #[test]
        fn a_ticket_outlives_a_slow_ring_connect() {
            // The default handshake timeout (5 s) is not a ticket's life:
            // a verbs ring connect under emulation took longer.
            let five = Duration::from_secs(5);
            assert!(super::super::ticket_lifetime(five) >= Duration::from_secs(30));
            let big = Duration::from_secs(60);
            assert_eq!(super::super::ticket_lifetime(big), 4 * big);
        }

        #[test]
        fn ticket_messages_parse_only_whole() {
            let mut m = b"RRPT".to_vec();
            m.extend([7u8; TICKET_LEN]);
            assert_eq!(super::super::parse_ticket(&m), Some([7u8; TICKET_LEN]));
            for bad in [&m[..m.len() - 1], &b"RRPX"[..], &[][..]] {
                assert_eq!(super::super::parse_ticket(bad), None);
            }
            let mut long = m.clone();
            long.push(0);
            assert_eq!(super::super::parse_ticket(&long), None);
        }

        #[test]
        fn hosts_are_read_from_addresses() {
            assert_eq!(host_of("a.test:5"), "a.test");
            assert_eq!(host_of("[::1]:5"), "::1");
            assert_eq!(host_of("10.0.0.1:5"), "10.0.0.1");
        }
    }
}

#[cfg(test)]
mod exchange_tests {
    use super::*;

    /// The ticket exchange's messages parse only whole: each one encoded
    /// parses back to itself, and a byte short, a byte long, another
    /// magic, an unknown flag or a reason that is not UTF-8 parses as
    /// nothing (the connection is then refused, never half-read).
    #[test]
    fn ticket_exchange_messages_parse_only_whole() {
        let id = [5u8; TICKET_LEN];
        for r in [
            TicketRequest { id, cipher: None },
            TicketRequest {
                id,
                cipher: Some(1),
            },
        ] {
            let m = encode_request(&r);
            assert_eq!(parse_ticket_request(&m), Some(r));
            assert_eq!(parse_ticket_request(&m[..m.len() - 1]), None);
            let mut long = m.clone();
            long.push(0);
            assert_eq!(parse_ticket_request(&long), None);
            assert_eq!(fuzz_round_trip(&m).0, Some(m));
        }
        for r in [
            TicketReply::Accepted(None),
            TicketReply::Accepted(Some(2)),
            TicketReply::Refused("ring encryption: no".into()),
        ] {
            let m = encode_reply(&r);
            assert_eq!(parse_ticket_reply(&m), Some(r));
            assert_eq!(fuzz_round_trip(&m).1, Some(m));
        }
        for bad in [
            &b"RRPA\x01\x00"[..],
            b"RRPA\x02\x01",
            b"RRPA\x00\x01",
            b"RRPA\x00",
            b"RRPN\xff",
            b"RRPX",
            b"",
        ] {
            assert_eq!(parse_ticket_reply(bad), None, "{bad:?}");
        }
        let mut long = REFUSE_MAGIC.to_vec();
        long.extend([b'a'; MAX_REASON + 1]);
        assert_eq!(parse_ticket_reply(&long), None);
        // A refusal's reason is cut to fit, on a character boundary.
        let m = encode_reply(&TicketReply::Refused("é".repeat(MAX_REASON)));
        assert!(
            matches!(parse_ticket_reply(&m), Some(TicketReply::Refused(w)) if w.len() <= MAX_REASON)
        );
    }
}
