// The module docs: whole with the `tls` feature (in `tls.md`, beside this
// file); without it, a line (the items they link to exist only with it, and
// docs.rs builds the default features).
#![cfg_attr(feature = "tls", doc = include_str!("tls.md"))]
#![cfg_attr(
    not(feature = "tls"),
    doc = "TLS as tonic users have it: needs rrpc-tonic's `tls` feature."
)]

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

/// What binds a ring connection to the TLS session its negotiation ran in
/// on an `rrpc://` port: 16 bytes both ends export from that session
/// (RFC 8446 §7.5, label [`TICKET_LABEL`]), so it never crosses the wire
/// inside the negotiation. The client presents it as the first message of
/// the ring connection ([`present_ticket`]); the server redeems it once,
/// within the handshake timeout of the negotiation, for the session's
/// peer identity (`Request::peer_certs()` on the rings).
pub(crate) type Ticket = [u8; TICKET_LEN];
/// A ticket's length.
pub(crate) const TICKET_LEN: usize = 16;
/// The exporter label of a ticket.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) const TICKET_LABEL: &[u8] = b"EXPORTER-rrpc-ring-ticket";
/// The first bytes of the ticket message on a ring connection.
const TICKET_MAGIC: &[u8; 4] = b"RRPT";

/// Sends `t` as the first message of a ring connection (client side).
pub(crate) async fn present_ticket(
    pipe: &mut crate::pipe::Pipe,
    t: &Ticket,
) -> Result<(), crate::Error> {
    let mut msg = [0u8; 4 + TICKET_LEN];
    msg[..4].copy_from_slice(TICKET_MAGIC);
    msg[4..].copy_from_slice(t);
    pipe.0
        .send_with(msg.len(), &mut |s: &mut [u8]| s.copy_from_slice(&msg))
        .await
}

/// Reads the first message of a ring connection as a ticket (server side):
/// `None` if it is anything else, or the peer closed first.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) async fn read_ticket(
    pipe: &mut crate::pipe::Pipe,
) -> Result<Option<Ticket>, crate::Error> {
    let mut got = None;
    if !pipe
        .1
        .recv_with(&mut |m: &[u8]| got = parse_ticket(m))
        .await?
    {
        return Ok(None);
    }
    Ok(got)
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

/// A ticket message's ticket (`pub(crate)` for `fuzzing::ring_ticket`).
pub(crate) fn parse_ticket(m: &[u8]) -> Option<Ticket> {
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

    use super::{TICKET_LABEL, TICKET_LEN, Ticket};
    use crate::Error;

    /// What a request learns of a TLS peer: tonic's own type, which
    /// `Request::peer_certs()` reads.
    pub(crate) type PeerInfo = TlsConnectInfo<TcpConnectInfo>;

    /// The most tickets a server holds unredeemed.
    const MAX_TICKETS: usize = 4096;

    /// The ticket of a finished TLS session ([`super::Ticket`]).
    pub(crate) fn ticket_of<D>(c: &rustls::ConnectionCommon<D>) -> Result<Ticket, Error> {
        c.export_keying_material([0u8; TICKET_LEN], TICKET_LABEL, None)
            .map_err(|e| Error::Handshake(format!("TLS: exporting the ring ticket: {e}")))
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
        tickets: Tickets<PeerInfo>,
    }

    /// Tickets issued and not yet redeemed, with their peers and expiry.
    pub(crate) struct Tickets<P> {
        map: Mutex<HashMap<Ticket, (P, Instant)>>,
        max: usize,
    }

    impl<P> Tickets<P> {
        fn new(max: usize) -> Self {
            Tickets {
                map: Mutex::default(),
                max,
            }
        }

        /// Issues `ticket` for `peer`, redeemable once within `ttl`; past
        /// the bound the oldest goes (a client that never dials its ring
        /// loses nothing but its own ticket).
        fn issue(&self, ticket: Ticket, peer: P, ttl: Duration) {
            let now = Instant::now();
            let mut t = self.map.lock().unwrap_or_else(|e| e.into_inner());
            t.retain(|_, (_, until)| *until > now);
            if t.len() >= self.max
                && let Some(oldest) = t.iter().min_by_key(|(_, (_, u))| *u).map(|(k, _)| *k)
            {
                t.remove(&oldest);
            }
            t.insert(ticket, (peer, now + ttl));
        }

        /// The peer of `ticket`, once, if it has not expired.
        fn redeem(&self, ticket: &Ticket) -> Option<P> {
            let mut t = self.map.lock().unwrap_or_else(|e| e.into_inner());
            let (peer, until) = t.remove(ticket)?;
            (until > Instant::now()).then_some(peer)
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
            self.tickets.issue(ticket, peer, ttl);
        }

        /// The peer of `ticket`, once, if it has not expired.
        pub(crate) fn redeem(&self, ticket: &Ticket) -> Option<PeerInfo> {
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
            assert_eq!(t.redeem(&[2; TICKET_LEN]), None, "never issued");
            assert_eq!(t.redeem(&[1; TICKET_LEN]), Some("a"));
            assert_eq!(t.redeem(&[1; TICKET_LEN]), None, "spent");
            // Expired (a zero lifetime has passed by the time it is read).
            t.issue([3; TICKET_LEN], "c", Duration::ZERO);
            assert_eq!(t.redeem(&[3; TICKET_LEN]), None, "expired");
            // Past the bound the oldest goes.
            t.issue([4; TICKET_LEN], "d", long);
            t.issue([5; TICKET_LEN], "e", long + Duration::from_secs(1));
            t.issue([6; TICKET_LEN], "f", long + Duration::from_secs(2));
            assert_eq!(t.redeem(&[4; TICKET_LEN]), None, "the oldest went");
            assert_eq!(t.redeem(&[5; TICKET_LEN]), Some("e"));
            assert_eq!(t.redeem(&[6; TICKET_LEN]), Some("f"));
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
