//! The handshake and admission group of [`RrpcConfig`](super::RrpcConfig):
//! how long a connection's setup may take, who may connect (token, TLS),
//! and how many connections a server takes.

use std::sync::Arc;
use std::time::Duration;

use rrpc_core::conn::HandshakeConfig;

use crate::Error;

/// The default of [`RrpcConfig::max_connections`](super::RrpcConfig::max_connections):
/// with the default 4 MiB rings grown to their largest, 4096 connections
/// pin 32 GiB of ring memory, half of rrpc-core's default global grant
/// budget (64 GiB).
pub(super) const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// The default of
/// [`RrpcConfig::max_connections_per_peer`](super::RrpcConfig::max_connections_per_peer):
/// a sixteenth of `DEFAULT_MAX_CONNECTIONS`, so that at least sixteen
/// peers fit at their limit, and far above what one client needs (a
/// channel holds one connection; a balanced pool a few).
pub(super) const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 256;

/// The most connections a server lets be in setup at once: the permits of
/// the tokio semaphore that counts them (more panics when it is made).
pub(super) const MAX_PENDING_HANDSHAKES: usize = tokio::sync::Semaphore::MAX_PERMITS;

/// What a client checks the server's side-channel certificate with.
#[cfg(feature = "verbs")]
pub(super) type TlsClient = (
    Arc<rrpc_core::rustls::ClientConfig>,
    rrpc_core::rustls::pki_types::ServerName<'static>,
);

/// The side channel's TLS settings (`verbs` feature). rustls configs have
/// no equality: two settings are equal when they hold the same configs
/// (`Arc::ptr_eq`), or none, and the same server name.
#[cfg(feature = "verbs")]
#[derive(Debug, Clone, Default)]
pub(super) struct TlsSettings {
    pub(super) server: Option<Arc<rrpc_core::rustls::ServerConfig>>,
    pub(super) client: Option<TlsClient>,
}

#[cfg(feature = "verbs")]
impl PartialEq for TlsSettings {
    fn eq(&self, o: &Self) -> bool {
        let same_server = match (&self.server, &o.server) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        };
        let same_client = match (&self.client, &o.client) {
            (Some((a, na)), Some((b, nb))) => Arc::ptr_eq(a, b) && na == nb,
            (a, b) => a.is_none() && b.is_none(),
        };
        same_server && same_client
    }
}

/// The handshake and admission group ([`RrpcConfig`](super::RrpcConfig)
/// docs, "Settings").
#[derive(Debug, Clone, PartialEq)]
pub(super) struct AdmissionSettings {
    pub(super) handshake_timeout: Duration,
    pub(super) max_pending_handshakes: usize,
    /// Established connections a server holds at once, all peers.
    pub(super) max_connections: usize,
    /// Established connections one peer holds at once at a server.
    pub(super) max_connections_per_peer: usize,
    pub(super) token: Option<Arc<[u8]>>,
    #[cfg(feature = "verbs")]
    pub(super) tls: TlsSettings,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        AdmissionSettings {
            handshake_timeout: Duration::from_secs(5),
            max_pending_handshakes: 1024,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            token: None,
            #[cfg(feature = "verbs")]
            tls: TlsSettings::default(),
        }
    }
}

impl AdmissionSettings {
    /// Checks every setting of the group. The timeout and the token are
    /// checked by rrpc-core's own [`HandshakeConfig`] (the one a
    /// connection builds from them), one at a time so that a refusal
    /// names its setting; a token must also not be empty.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first setting refused and its rule.
    pub(super) fn validate(&self) -> Result<(), Error> {
        let bad = |rule: &'static str| Err(Error::InvalidConfig(rule));
        let hs = HandshakeConfig::builder().timeout(self.handshake_timeout);
        if hs.clone().build().is_err() {
            return bad("handshake_timeout must be > 0");
        }
        if let Some(t) = &self.token
            && (t.is_empty() || hs.token(t.to_vec()).build().is_err())
        {
            return bad("token must be 1..=256 bytes");
        }
        if !(1..=MAX_PENDING_HANDSHAKES).contains(&self.max_pending_handshakes) {
            return bad(
                "max_pending_handshakes must be within 1..=usize::MAX >> 3 (tokio's semaphore)",
            );
        }
        if self.max_connections == 0 {
            return bad("max_connections must be > 0");
        }
        if !(1..=self.max_connections).contains(&self.max_connections_per_peer) {
            return bad("max_connections_per_peer must be within 1..=max_connections");
        }
        Ok(())
    }
}
