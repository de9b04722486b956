//! The fabrics group of [`RrpcConfig`](super::RrpcConfig): what an
//! `rrpc://` connection may run on.

use crate::Error;

/// A fabric an `rrpc://` connection may run on ([`RrpcConfig::fabrics`](super::RrpcConfig::fabrics)).
///
/// The negotiation on an `rrpc://` port takes the best fabric both ends
/// allow and can use, in this order: [`Fabric::Shm`] (same host only),
/// then [`Fabric::Verbs`] (both ends built with the `verbs` feature and
/// with an active device, the client's queue pair reaching the server's),
/// then [`Fabric::Tcp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fabric {
    /// HTTP/2 (tonic) on the TCP connection the negotiation ran on.
    Tcp,
    /// Shared-memory rings through the server's shm listener, when both
    /// ends are on the same host (`rrpc://` docs in [`crate::RrpcEndpoint`]).
    Shm,
    /// RDMA rings through the server's `rdma://` side channel. Offered only
    /// by a build with the `verbs` feature; a server grants it only when
    /// its device opened.
    Verbs,
}

impl Fabric {
    /// The fabric's bit in the negotiation's offer.
    pub(crate) fn bit(self) -> u8 {
        match self {
            Fabric::Tcp => 1,
            Fabric::Shm => 2,
            Fabric::Verbs => 4,
        }
    }

    /// Its name in logs, metrics and errors.
    pub fn name(self) -> &'static str {
        match self {
            Fabric::Tcp => "tcp",
            Fabric::Shm => "shm",
            Fabric::Verbs => "verbs",
        }
    }
}

impl std::fmt::Display for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The fabrics an `rrpc://` connection may use, as [`Fabric::bit`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FabricSet(pub(super) u8);

impl Default for FabricSet {
    fn default() -> Self {
        FabricSet(Fabric::Tcp.bit() | Fabric::Shm.bit() | Fabric::Verbs.bit())
    }
}

impl FabricSet {
    /// The set of `fabrics`.
    pub(super) fn of(fabrics: impl IntoIterator<Item = Fabric>) -> Self {
        FabricSet(fabrics.into_iter().fold(0, |b, f| b | f.bit()))
    }

    /// Whether the set holds `fabric`.
    pub(super) fn allows(self, fabric: Fabric) -> bool {
        self.0 & fabric.bit() != 0
    }

    /// Checks the group's one setting.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty set.
    pub(super) fn validate(self) -> Result<(), Error> {
        if self.0 == 0 {
            return Err(Error::InvalidConfig(
                "fabrics must allow at least one fabric",
            ));
        }
        Ok(())
    }
}
