//! The provider handle: [`Fabric`] (verbs: an opened device context plus a
//! protection domain).

use std::sync::Arc;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::provider::shm::ShmQp;
use crate::qp::{QpConfig, QpInner, QueuePair};
use crate::region::Region;

/// Which provider implements the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProviderKind {
    /// Same-host shared memory (always built; the default).
    Shm,
    /// libibverbs (cargo feature `verbs`).
    Verbs,
}

impl ProviderKind {
    /// The provider's wire code in the handshake.
    pub fn code(self) -> u8 {
        match self {
            ProviderKind::Shm => 1,
            ProviderKind::Verbs => 2,
        }
    }

    /// The provider for a wire code.
    pub fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(ProviderKind::Shm),
            2 => Some(ProviderKind::Verbs),
            _ => None,
        }
    }
}

/// A handle on one provider. Cheap to clone.
///
/// Providers are chosen at run time (by URI scheme, see [`Fabric::for_endpoint`])
/// and dispatched with a `match` on an enum, never a `dyn` call per message.
#[derive(Debug, Clone)]
pub struct Fabric {
    kind: ProviderKind,
    huge_pages: bool,
    /// The opened device and protection domain of a verbs fabric.
    #[cfg(feature = "verbs")]
    device: Option<Arc<crate::provider::verbs::Device>>,
}

impl Fabric {
    /// The shared-memory provider, trying huge pages for large regions.
    pub fn shm() -> Fabric {
        Fabric {
            kind: ProviderKind::Shm,
            huge_pages: true,
            #[cfg(feature = "verbs")]
            device: None,
        }
    }

    /// The libibverbs provider on the device named `device` (e.g. `mlx5_0`), or
    /// on the first device listed: `ibv_get_device_list` + `ibv_open_device` +
    /// `ibv_alloc_pd` (and `ibv_query_port` / `ibv_query_gid` on port 1 for the
    /// handshake's LID and GID). Builds; not run on an RDMA NIC here.
    ///
    /// # Errors
    /// [`Error::Io`] of kind `NotFound` saying "no RDMA device found" when
    /// libibverbs lists no device (no NIC or no kernel RDMA support) or none
    /// named `device`; [`Error::Io`] when opening or querying it fails.
    #[cfg(feature = "verbs")]
    pub fn verbs(device: Option<&str>) -> Result<Fabric> {
        let dev = crate::provider::verbs::Device::open(device)?;
        Ok(Fabric {
            kind: ProviderKind::Verbs,
            huge_pages: true,
            device: Some(dev),
        })
    }

    /// The name of the verbs device (`None` for shm).
    #[cfg(feature = "verbs")]
    pub fn device_name(&self) -> Option<&str> {
        self.device.as_deref().map(|d| d.name())
    }

    /// The provider serving `endpoint`'s scheme.
    ///
    /// # Errors
    /// [`Error::ProviderUnavailable`] for `rdma://` when the `verbs` feature is
    /// off; with it, the errors of [`Fabric::verbs`] (first device).
    pub fn for_endpoint(endpoint: &Endpoint) -> Result<Fabric> {
        match endpoint {
            Endpoint::Shm(_) => Ok(Fabric::shm()),
            #[cfg(feature = "verbs")]
            Endpoint::Rdma(_) => Fabric::verbs(None),
            #[cfg(not(feature = "verbs"))]
            Endpoint::Rdma(_) => Err(Error::ProviderUnavailable("verbs")),
        }
    }

    /// Disables huge pages (for the RB² ablation "no huge pages").
    pub fn without_huge_pages(mut self) -> Fabric {
        self.huge_pages = false;
        self
    }

    /// Which provider this is.
    pub fn kind(&self) -> ProviderKind {
        self.kind
    }

    /// Allocates and registers a zeroed region of at least `len` bytes
    /// (verbs: `mmap` + `ibv_reg_mr` with local write, remote write and remote
    /// read access). Huge pages are used when the system has them and `len` is
    /// at least 2 MiB; otherwise 4 KiB pages, logged once at debug level.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for `len == 0`; [`Error::Io`] if the system is out
    /// of memory or memfds.
    pub fn alloc_region(&self, len: usize) -> Result<Arc<Region>> {
        #[cfg(feature = "verbs")]
        if let Some(dev) = &self.device {
            return Ok(Arc::new(Region::alloc_verbs(len, self.huge_pages, dev)?));
        }
        Ok(Arc::new(Region::alloc(len, self.huge_pages)?))
    }

    /// Creates a reliable-connection queue pair with its own send and receive
    /// completion queues and completion channel (verbs: `ibv_create_comp_channel`,
    /// two `ibv_create_cq`, `ibv_create_qp`). It is connected by the handshake
    /// ([`crate::conn`]).
    ///
    /// # Errors
    /// [`Error::Io`] if the system is out of memfds or eventfds.
    pub fn create_qp(&self, cfg: &QpConfig) -> Result<QueuePair> {
        match self.kind {
            ProviderKind::Shm => Ok(QueuePair {
                inner: QpInner::Shm(ShmQp::new(cfg)?),
            }),
            #[cfg(feature = "verbs")]
            ProviderKind::Verbs => {
                let dev = self
                    .device
                    .as_ref()
                    .ok_or(Error::ProviderUnavailable("verbs"))?;
                Ok(QueuePair {
                    inner: QpInner::Verbs(crate::provider::verbs::VerbsQp::new(dev, cfg)?),
                })
            }
            #[cfg(not(feature = "verbs"))]
            ProviderKind::Verbs => Err(Error::ProviderUnavailable("verbs")),
        }
    }
}
