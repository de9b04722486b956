//! The fabrics group of [`RrpcConfig`](super::RrpcConfig): what an
//! `rrpc://` connection may run on.

use super::Fabric;
use crate::Error;

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
