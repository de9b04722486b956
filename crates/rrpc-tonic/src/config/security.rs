//! The security group of [`RrpcConfig`](super::RrpcConfig): whether ring
//! messages are sealed (`crate::conn::seal`, feature `tls`).

use rrpc_core::ProviderKind;

use crate::Error;

/// Whether every ring message is encrypted and authenticated (an AEAD
/// keyed from the TLS session of the connection's `rrpc://` negotiation;
/// docs/security.md). Needs TLS on the connection: with it set and no TLS,
/// connecting and serving fail with [`Error::RingEncryption`]. Both ends
/// must agree for the connection's fabric (checked in the ring ticket
/// exchange; a mismatch is [`Error::RingEncryption`] on both ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RingEncryption {
    /// Ring messages in plaintext (default): TLS protects the negotiation
    /// and binds the rings to the TLS peer, not the ring traffic.
    #[default]
    Off,
    /// Sealed on `rdma://` (the bytes cross a wire), plaintext on `shm://`
    /// (the memory never leaves the host).
    Remote,
    /// Sealed on every ring fabric, `shm://` included.
    Required,
}

impl RingEncryption {
    /// Whether a ring connection on `provider` is sealed.
    pub fn seals(self, provider: ProviderKind) -> bool {
        match self {
            RingEncryption::Off => false,
            RingEncryption::Remote => provider != ProviderKind::Shm,
            RingEncryption::Required => true,
        }
    }
}

/// The security group ([`RrpcConfig`](super::RrpcConfig) docs, "Settings").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct SecuritySettings {
    pub(super) ring_encryption: RingEncryption,
}

/// The one rule of the group.
pub(super) const NEEDS_TLS_FEATURE: &str =
    "ring_encryption other than Off needs rrpc-tonic's `tls` feature (the keys come from TLS)";

impl SecuritySettings {
    /// Checks every setting of the group: sealing needs the `tls` feature
    /// (whether a connection has TLS is known only where it is made: see
    /// [`RingEncryption`]).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the rule.
    pub(super) fn validate(&self) -> Result<(), Error> {
        if !cfg!(feature = "tls") && self.ring_encryption != RingEncryption::Off {
            return Err(Error::InvalidConfig(NEEDS_TLS_FEATURE));
        }
        Ok(())
    }
}
