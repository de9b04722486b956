//! The provider handle: [`Fabric`] (verbs: an opened device context plus a
//! protection domain).

use std::sync::Arc;

use crate::addr::FabricAddr;
use crate::error::Result;
use crate::provider;
use crate::qp::{QpConfig, QueuePair};
use crate::region::{Access, Region};
pub use crate::settings::ProviderKind;
#[cfg(feature = "verbs")]
pub use crate::settings::{VerbsOptions, VerbsOptionsBuilder};

/// A handle on one provider. Cheap to clone.
///
/// Providers are chosen at run time (by URI scheme, see [`Fabric::for_endpoint`])
/// and dispatched with a `match` on an enum, never a `dyn` call per message.
#[derive(Debug, Clone)]
pub struct Fabric {
    /// The provider, and on verbs the opened device and protection domain.
    domain: provider::Domain,
    huge_pages: bool,
}

impl Fabric {
    /// The shared-memory provider, trying huge pages for large regions.
    pub fn shm() -> Fabric {
        Fabric {
            domain: provider::Domain::Shm,
            huge_pages: true,
        }
    }

    /// The libibverbs provider on the device named `device` (e.g. `mlx5_0`), or
    /// on the first device listed, port 1 and the default GID index:
    /// [`Fabric::verbs_with`] with [`VerbsOptions::default`] and that device.
    /// Tested on soft-RoCE; not run on an RDMA NIC.
    ///
    /// # Errors
    /// As [`Fabric::verbs_with`].
    #[cfg(feature = "verbs")]
    pub fn verbs(device: Option<&str>) -> Result<Fabric> {
        let mut opts = VerbsOptions::builder();
        if let Some(d) = device {
            opts = opts.device(d);
        }
        Fabric::verbs_with(&opts.build()?)
    }

    /// The libibverbs provider with the device, port and GID index of `opts`:
    /// `ibv_get_device_list` + `ibv_open_device` + `ibv_alloc_pd`, then
    /// `ibv_query_device` (the limits queue pairs are checked against),
    /// `ibv_query_port` (LID, active MTU, GID table length) and
    /// `ibv_query_gid` (the GID the handshake carries; see
    /// [`VerbsOptionsBuilder::gid_index`] for the default choice). Tested on
    /// soft-RoCE; not run on an RDMA NIC.
    ///
    /// # Errors
    /// [`crate::Error::Io`] of kind `NotFound` saying "no RDMA device found" when
    /// libibverbs lists no device (no NIC or no kernel RDMA support) or none
    /// of that name (the message lists the devices there are);
    /// [`crate::Error::InvalidConfig`] for a port the device does not have or a GID
    /// index outside the port's table or naming an empty entry (the message
    /// names what was asked for and what exists); [`crate::Error::Io`] when opening
    /// or querying the device fails.
    #[cfg(feature = "verbs")]
    pub fn verbs_with(opts: &VerbsOptions) -> Result<Fabric> {
        Ok(Fabric {
            domain: provider::Domain::open_verbs(opts)?,
            huge_pages: true,
        })
    }

    /// A fabric for one connection's resources: on verbs, the same device
    /// with a protection domain of its own, so that the regions allocated
    /// through it are reachable only by the queue pairs created through
    /// it. A peer that learned another connection's remote key (it holds
    /// two connections, or kept a key of a closed one), or guessed one,
    /// gets a remote access error from the NIC and touches nothing. Make
    /// each connection's regions and queue pair through its own isolated
    /// fabric (rrpc-tonic does). shm: a clone (each connection's regions
    /// are separate memfds already). Cheap: one `ibv_alloc_pd`.
    ///
    /// # Errors
    /// [`crate::Error::Io`] if the device refuses another protection domain.
    pub fn isolated(&self) -> Result<Fabric> {
        Ok(Fabric {
            domain: self.domain.isolated()?,
            huge_pages: self.huge_pages,
        })
    }

    /// The name of the verbs device (`None` for shm).
    #[cfg(feature = "verbs")]
    pub fn device_name(&self) -> Option<&str> {
        self.domain.device_name()
    }

    /// The verbs port and GID index in use, `(port, gid_index)` (`None` for
    /// shm): what [`VerbsOptions`] asked for or its defaults chose.
    #[cfg(feature = "verbs")]
    pub fn verbs_port(&self) -> Option<(u8, u8)> {
        self.domain.port()
    }

    /// The provider serving `endpoint`'s scheme.
    ///
    /// # Errors
    /// [`crate::Error::ProviderUnavailable`] for `rdma://` when the `verbs` feature is
    /// off; with it, the errors of `Fabric::verbs` (first device).
    pub fn for_endpoint(endpoint: &FabricAddr) -> Result<Fabric> {
        match endpoint {
            FabricAddr::Shm(_) => Ok(Fabric::shm()),
            FabricAddr::Rdma(_) => Ok(Fabric {
                domain: provider::Domain::for_rdma()?,
                huge_pages: true,
            }),
        }
    }

    /// Disables huge pages (for the RB² ablation "no huge pages").
    pub fn without_huge_pages(mut self) -> Fabric {
        self.huge_pages = false;
        self
    }

    /// The provider this fabric opened (the verbs provider's tests).
    #[cfg(all(test, feature = "verbs"))]
    pub(crate) fn domain(&self) -> &provider::Domain {
        &self.domain
    }

    /// Which provider this is.
    pub fn kind(&self) -> ProviderKind {
        self.domain.kind()
    }

    /// Allocates and registers a zeroed region of at least `len` bytes
    /// (verbs: `mmap` + `ibv_reg_mr` with local write, remote write and remote
    /// read access). Huge pages are used when the system has them and `len` is
    /// at least 2 MiB; otherwise 4 KiB pages, logged once at debug level.
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] for `len == 0`; [`crate::Error::Io`] if the system is out
    /// of memory or memfds.
    pub fn alloc_region(&self, len: usize) -> Result<Arc<Region>> {
        self.alloc_region_with(len, Access::ALL)
    }

    /// [`Self::alloc_region`] with the narrowest remote access that works
    /// ([`Access`]): a receive ring needs [`Access::REMOTE_WRITE`], a
    /// staging area or a READ destination [`Access::LOCAL`]. Enforced by
    /// the NIC on verbs, recorded on shm.
    ///
    /// # Errors
    /// As [`Self::alloc_region`].
    pub fn alloc_region_with(&self, len: usize, access: Access) -> Result<Arc<Region>> {
        self.alloc_region_placed(len, access, None)
    }

    /// [`Self::alloc_region_with`], the memory bound to NUMA node `node`
    /// (`None`: nowhere in particular) before it is touched or registered
    /// ([`Fabric::alloc_region_on`]).
    pub(crate) fn alloc_region_placed(
        &self,
        len: usize,
        access: Access,
        node: Option<u32>,
    ) -> Result<Arc<Region>> {
        Ok(Arc::new(self.domain.alloc_region(
            len,
            self.huge_pages,
            access,
            node,
        )?))
    }

    /// Creates a reliable-connection queue pair with its own send and receive
    /// completion queues and completion channel (verbs: `ibv_create_comp_channel`,
    /// two `ibv_create_cq`, `ibv_create_qp`). It is connected by the handshake
    /// ([`crate::conn`]).
    ///
    /// # Errors
    /// [`crate::Error::Io`] if the system is out of memfds or eventfds.
    pub fn create_qp(&self, cfg: &QpConfig) -> Result<QueuePair> {
        Ok(QueuePair::from_parts(self.domain.create_qp(cfg)?))
    }
}

// NUMA placement ([`crate::numa`]).
impl Fabric {
    /// The NUMA node of this fabric's device
    /// ([`Sysfs::device_node`](crate::numa::Sysfs::device_node), read once
    /// per device and process): `None` on shm, and for a device that
    /// reports none. What
    /// [`NumaPlacement::Device`](crate::numa::NumaPlacement::Device)
    /// resolves to.
    pub fn numa_node(&self) -> Option<u32> {
        self.domain
            .device_name()
            .and_then(crate::numa::cached_device_node)
    }

    /// [`Fabric::alloc_region_with`], with the region's memory bound to
    /// NUMA node `node` (`None`: as `alloc_region_with`). The binding
    /// (`mbind(MPOL_PREFERRED)`) is made before the memory is touched or
    /// registered; on shm it holds for the peer's faults too (the policy
    /// belongs to the memfd). A binding that fails is a warning and a count
    /// in [`PLACEMENT_FAILURES`](crate::numa::PLACEMENT_FAILURES), not an error.
    ///
    /// # Errors
    /// As [`Fabric::alloc_region_with`].
    pub fn alloc_region_on(
        &self,
        len: usize,
        access: Access,
        node: Option<u32>,
    ) -> Result<Arc<Region>> {
        self.alloc_region_placed(len, access, node)
    }
}
