//! Fabric providers, behind one seam. Everything above `rrpc-core` sees only
//! the provider-neutral types ([`crate::Region`], [`crate::QueuePair`],
//! [`crate::CompletionQueue`]); inside the crate, this module is the only
//! place that tells the providers apart.
//!
//! | provider | module | queue pair | completion queues |
//! |---|---|---|---|
//! | shm (always built) | [`shm`] | `ShmQp` | `SendCq`, `RecvCq` |
//! | verbs (feature `verbs`) | `verbs` | `VerbsQp` | `VerbsCq` |
//! | virtual: a sharer of another queue pair ([`crate::vqp`]) | [`virt`] | `VirtualQp` | `Sharer` |
//!
//! Each hardware provider also has a side channel (`shm::side`, a Unix
//! socket; `verbs::side`, TCP), behind a seam of their own, [`side`].
//!
//! ## The seam
//!
//! [`Qp`] and [`Cq`] are enums with one variant per provider, and their
//! methods are the whole dispatch: [`crate::QueuePair`] and
//! [`crate::CompletionQueue`] hold one each and forward to it, naming no
//! provider and carrying no `cfg(feature = "verbs")` of their own. A
//! provider makes a queue pair and its two completion queues together
//! ([`QpParts`], from [`shm_qp`], `verbs_qp` or [`attach_virtual`]).
//!
//! **Why an enum and not a trait** (rustls's `CryptoProvider` is a struct of
//! trait objects; mio's `sys/` picks one implementation at compile time):
//! the providers are a closed set known to this crate, and every post and
//! every poll goes through the seam, so a `match` the compiler can inline
//! keeps the data path free of virtual calls and of the box a trait object
//! would need; and with the `match`es all here, adding a provider is one
//! variant per enum and the compiler lists every method to extend. Two
//! places are type-erased on purpose, both off the shm data path:
//!
//! * the virtual provider reaches the hardware queue pair under it through
//!   the [`Hardware`] trait, which [`crate::QueuePair`] implements: the
//!   virtual queue pair is a variant of [`Qp`] and is built on a
//!   [`crate::QueuePair`] at once, and naming that type here would close an
//!   import circle (`qp` → `provider` → `qp`). Its posts already take a
//!   lock and post on the hardware queue pair; a few indirect calls are
//!   small beside that.
//! * a [`crate::Region`] holds a provider's memory registration as a
//!   `Box<dyn Registration>` ([`crate::region::Registration`]), for the same
//!   reason: every provider builds on regions. The verbs provider finds its
//!   registration again on each post by a downcast (one indirect
//!   `type_id` call beside `ibv_post_send`).
//!
//! ## The side channels' seam
//!
//! [`side::SideListener`] (a listening socket) and [`side::Side`] (one
//! connection's side channel: its handshake, then its liveness signal) are
//! enums with one variant per hardware provider, like [`Qp`]; their
//! methods and [`side::dial`] / [`side::dial_logical`] are the whole
//! dispatch, and the handshake's steps are each side channel's own.
//! [`crate::conn`] holds these and names no provider: no
//! `provider::shm` or `provider::verbs` path and no `cfg(feature =
//! "verbs")` outside the public TLS settings.
//!
//! ## Dependencies
//!
//! The providers build on the crate's leaf modules (`work`, `settings`,
//! `fail`, `error`, `sys`, `region`, `fault`, `handshake`) and on
//! `conn::budget` (the guards their mappings hold), never on `qp`, `cq` or
//! this module; `qp`, `cq`, `vqp` and `fabric` build on this module. So the
//! module graph of the crate's core has no circle. The side channels
//! (`shm::side`, `verbs::side`) and their seam [`side`] sit above it: they
//! use [`crate::QueuePair`] and `conn`'s leaves (`conn::settings`,
//! `conn::exchange`, `conn::budget`, which import nothing back), and the
//! rest of [`crate::conn`] uses [`side`], never the side channels
//! themselves.

pub(crate) mod shm;
pub(crate) mod side;
#[cfg(feature = "verbs")]
pub(crate) mod verbs;
pub(crate) mod virt;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Weak};

use crate::conn::budget::BudgetGuard;
use crate::error::{Error, Result};
use crate::handshake::Hello;
use crate::region::{Access, Local, Region, Remote};
use crate::settings::{ProviderKind, QpCarrier, QpConfig};
use crate::work::{Completion, SendOp};

pub(crate) use virt::{Hardware, Shared as SharedHardware};

/// A queue pair and its send and receive completion queues, as a provider
/// made them ([`crate::QueuePair::from_parts`]).
#[derive(Debug)]
pub(crate) struct QpParts {
    pub(crate) qp: Qp,
    pub(crate) send_cq: Cq,
    pub(crate) recv_cq: Cq,
}

/// An shm queue pair (`shm://`).
///
/// # Errors
/// [`Error::Io`] if the system is out of memfds or eventfds.
pub(crate) fn shm_qp(cfg: &QpConfig) -> Result<QpParts> {
    let q = shm::ShmQp::new(cfg)?;
    let (send, recv) = q.cqs();
    Ok(QpParts {
        qp: Qp::Shm(q),
        send_cq: Cq::ShmSend(send),
        recv_cq: Cq::ShmRecv(recv),
    })
}

/// A verbs queue pair on `dev`, in INIT.
///
/// # Errors
/// As `VerbsQp::new`: sizes the device refuses, or the device's error.
#[cfg(feature = "verbs")]
pub(crate) fn verbs_qp(dev: &Arc<verbs::Device>, cfg: &QpConfig) -> Result<QpParts> {
    let (q, send, recv) = verbs::VerbsQp::new(dev, cfg)?;
    Ok(QpParts {
        qp: Qp::Verbs(q),
        send_cq: Cq::Verbs(send),
        recv_cq: Cq::Verbs(recv),
    })
}

/// A virtual queue pair over `shared`'s hardware queue pair, receiving under
/// `local_tag` ([`crate::vqp::PhysicalQp::attach`]).
///
/// # Errors
/// As [`virt::Shared::attach`].
pub(crate) fn attach_virtual(
    shared: &Arc<SharedHardware>,
    local_tag: u32,
    peer_tag: u32,
) -> Result<QpParts> {
    let (q, send, recv) = shared.attach(local_tag, peer_tag)?;
    Ok(QpParts {
        qp: Qp::Virtual(q),
        send_cq: Cq::Virtual(send),
        recv_cq: Cq::Virtual(recv),
    })
}

// ---------------------------------------------------------------------------
// Domains: what a fabric makes its regions and queue pairs with
// ---------------------------------------------------------------------------

/// The provider a [`crate::Fabric`] opened: shm, or a verbs device context
/// and protection domain.
#[derive(Debug, Clone)]
pub(crate) enum Domain {
    Shm,
    #[cfg(feature = "verbs")]
    Verbs(Arc<verbs::Device>),
}

impl Domain {
    /// The verbs device, port and GID index of `opts`
    /// ([`crate::Fabric::verbs_with`]).
    ///
    /// # Errors
    /// As `verbs::Device::open`.
    #[cfg(feature = "verbs")]
    pub(crate) fn open_verbs(opts: &crate::settings::VerbsOptions) -> Result<Domain> {
        Ok(Domain::Verbs(verbs::Device::open(opts)?))
    }

    /// The provider of `rdma://` addresses, on its defaults (the first
    /// device, port 1).
    ///
    /// # Errors
    /// [`Error::ProviderUnavailable`] without the `verbs` feature; with it,
    /// as [`Self::open_verbs`].
    pub(crate) fn for_rdma() -> Result<Domain> {
        #[cfg(feature = "verbs")]
        return Domain::open_verbs(&crate::settings::VerbsOptions::default());
        #[cfg(not(feature = "verbs"))]
        Err(Error::ProviderUnavailable("verbs"))
    }

    pub(crate) fn kind(&self) -> ProviderKind {
        match self {
            Domain::Shm => ProviderKind::Shm,
            #[cfg(feature = "verbs")]
            Domain::Verbs(_) => ProviderKind::Verbs,
        }
    }

    /// The same provider with a protection domain of its own (verbs; shm:
    /// the same).
    ///
    /// # Errors
    /// The device's refusal of another protection domain.
    pub(crate) fn isolated(&self) -> Result<Domain> {
        Ok(match self {
            Domain::Shm => Domain::Shm,
            #[cfg(feature = "verbs")]
            Domain::Verbs(dev) => Domain::Verbs(dev.isolated()?),
        })
    }

    /// The verbs device's name (`None` on shm).
    pub(crate) fn device_name(&self) -> Option<&str> {
        match self {
            Domain::Shm => None,
            #[cfg(feature = "verbs")]
            Domain::Verbs(dev) => Some(dev.name()),
        }
    }

    /// The opened verbs device (tests).
    #[cfg(all(test, feature = "verbs"))]
    pub(crate) fn verbs_device(&self) -> Option<&verbs::Device> {
        match self {
            Domain::Verbs(dev) => Some(dev),
            Domain::Shm => None,
        }
    }

    /// The verbs port and GID index, `(port, gid_index)` (`None` on shm).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn port(&self) -> Option<(u8, u8)> {
        match self {
            Domain::Shm => None,
            #[cfg(feature = "verbs")]
            Domain::Verbs(dev) => {
                let p = dev.port();
                Some((p.num, p.gid_index))
            }
        }
    }

    /// A zeroed region of at least `len` bytes, registered with the device
    /// on verbs ([`crate::Fabric::alloc_region_on`]).
    ///
    /// # Errors
    /// As [`crate::Fabric::alloc_region`].
    pub(crate) fn alloc_region(
        &self,
        len: usize,
        try_huge: bool,
        access: Access,
        node: Option<u32>,
    ) -> Result<Region> {
        match self {
            Domain::Shm => Region::alloc(len, try_huge, access, node),
            #[cfg(feature = "verbs")]
            Domain::Verbs(dev) => verbs::alloc_region(len, try_huge, dev, access, node),
        }
    }

    /// A queue pair and its completion queues ([`crate::Fabric::create_qp`]).
    ///
    /// # Errors
    /// The provider's: out of memfds or eventfds (shm), sizes the device
    /// refuses or its error (verbs).
    pub(crate) fn create_qp(&self, cfg: &QpConfig) -> Result<QpParts> {
        match self {
            Domain::Shm => shm_qp(cfg),
            #[cfg(feature = "verbs")]
            Domain::Verbs(dev) => verbs_qp(dev, cfg),
        }
    }
}

// ---------------------------------------------------------------------------
// Queue pairs
// ---------------------------------------------------------------------------

/// A provider's queue pair: the dispatch behind [`crate::QueuePair`].
// Queue pairs live behind an `Arc`; boxing the shm variant would add an
// indirection to every post on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Qp {
    Shm(shm::ShmQp),
    #[cfg(feature = "verbs")]
    Verbs(verbs::VerbsQp),
    /// A sharer of another queue pair ([`crate::vqp`]).
    Virtual(virt::VirtualQp),
}

impl Qp {
    /// One send work request.
    #[inline]
    pub(crate) fn post(
        &self,
        wr_id: u64,
        op: SendOp,
        local: Local<'_>,
        remote: Remote,
        signaled: bool,
    ) -> Result<()> {
        match self {
            Qp::Shm(q) => q.post(wr_id, op, local, remote, signaled),
            #[cfg(feature = "verbs")]
            Qp::Verbs(q) => q.post(wr_id, op, local, remote, signaled),
            Qp::Virtual(q) => q.post(wr_id, op, local, remote, signaled),
        }
    }

    pub(crate) fn post_recv(&self, wr_id: u64) -> Result<()> {
        match self {
            Qp::Shm(q) => q.post_recv(wr_id),
            #[cfg(feature = "verbs")]
            Qp::Verbs(q) => q.post_recv(wr_id),
            Qp::Virtual(q) => q.post_recv(wr_id),
        }
    }

    pub(crate) fn fail(&self, reason: &Error) {
        match self {
            Qp::Shm(q) => q.fail(reason),
            #[cfg(feature = "verbs")]
            Qp::Verbs(q) => q.fail(reason),
            Qp::Virtual(q) => q.fail(reason),
        }
    }

    pub(crate) fn inject_device_error(&self) -> Result<()> {
        match self {
            Qp::Shm(q) => {
                q.inject_device_error();
                Ok(())
            }
            #[cfg(feature = "verbs")]
            Qp::Verbs(q) => q.inject_device_error(),
            Qp::Virtual(q) => q.inject_device_error(),
        }
    }

    #[inline]
    pub(crate) fn failure(&self) -> Option<Error> {
        match self {
            Qp::Shm(q) => q.failure(),
            #[cfg(feature = "verbs")]
            Qp::Verbs(q) => q.failure(),
            Qp::Virtual(q) => q.failure(),
        }
    }

    pub(crate) fn send_depth(&self) -> u32 {
        match self {
            Qp::Shm(q) => q.send_depth(),
            #[cfg(feature = "verbs")]
            Qp::Verbs(q) => q.send_depth(),
            Qp::Virtual(q) => q.send_depth(),
        }
    }

    pub(crate) fn recv_depth(&self) -> u32 {
        match self {
            Qp::Shm(q) => q.recv_depth(),
            #[cfg(feature = "verbs")]
            Qp::Verbs(q) => q.recv_depth(),
            Qp::Virtual(q) => q.recv_depth(),
        }
    }

    /// Bits of immediate data a `WRITE_WITH_IMM` carries.
    pub(crate) fn imm_bits(&self) -> u32 {
        match self {
            Qp::Virtual(q) => q.imm_bits(),
            _ => 32,
        }
    }

    /// Whether a post's outcome is known when it returns.
    pub(crate) fn completes_in_post(&self) -> bool {
        match self {
            Qp::Shm(q) => q.completes_in_post(),
            #[cfg(feature = "verbs")]
            Qp::Verbs(_) => false,
            Qp::Virtual(_) => false,
        }
    }

    /// What carries the queue pair's traffic.
    pub(crate) fn carrier(&self) -> QpCarrier {
        match self {
            Qp::Shm(_) => QpCarrier {
                provider: ProviderKind::Shm,
                device: None,
                local_gid: None,
                remote_gid: None,
                shared: false,
            },
            #[cfg(feature = "verbs")]
            Qp::Verbs(q) => q.carrier(),
            Qp::Virtual(q) => QpCarrier {
                shared: true,
                ..q.physical_carrier()
            },
        }
    }

    pub(crate) fn is_virtual(&self) -> bool {
        matches!(self, Qp::Virtual(_))
    }

    pub(crate) fn outstanding(&self) -> u64 {
        match self {
            Qp::Shm(q) => q.outstanding(),
            #[cfg(feature = "verbs")]
            Qp::Verbs(q) => q.outstanding(),
            Qp::Virtual(q) => q.outstanding(),
        }
    }

    /// Adds the regions a peer granted in a logical connection's hello `h`
    /// ([`crate::conn::connect_logical`]) to this hardware queue pair: on
    /// shm mapped from their descriptors `fds` (checked, and at most
    /// `max_bytes` in all), with `budget` held as long as the mappings; on
    /// verbs by their descriptions. Posts may target them until the returned
    /// [`LaterGrants`] drops.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] for descriptors that do not match the
    /// hello or a remote key already granted; [`Error::LimitExceeded`];
    /// [`Error::InvalidConfig`] on a virtual queue pair; the provider's
    /// error.
    pub(crate) fn add_grants(
        &self,
        h: &Hello,
        fds: Vec<OwnedFd>,
        max_bytes: u64,
        budget: Option<BudgetGuard>,
    ) -> Result<LaterGrants> {
        match self {
            Qp::Shm(q) => {
                if fds.len() != h.regions.len() {
                    return Err(Error::MalformedHandshake(format!(
                        "peer granted {} regions but passed {} descriptors in a logical hello",
                        h.regions.len(),
                        fds.len()
                    )));
                }
                shm::granted_bytes(h, max_bytes)?;
                shm::check_region_memfds(h, &fds)?;
                let regions = h.regions.iter().map(|d| d.remote).zip(fds).collect();
                let (table, keys) = q.add_grants(regions)?;
                Ok(LaterGrants {
                    table: LaterTable::Shm(table),
                    keys,
                    _budget: budget,
                })
            }
            #[cfg(feature = "verbs")]
            Qp::Verbs(q) => {
                // Nothing is mapped on verbs: no budget is held (it is
                // released when this returns).
                let (table, keys) = q.add_grants(h.regions.iter().map(|d| d.remote).collect())?;
                Ok(LaterGrants {
                    table: LaterTable::Verbs(table),
                    keys,
                    _budget: None,
                })
            }
            Qp::Virtual(_) => Err(Error::InvalidConfig(
                "a shared queue pair cannot itself be shared".into(),
            )),
        }
    }
}

// ---------------------------------------------------------------------------
// Completion queues
// ---------------------------------------------------------------------------

/// A provider's completion queue: the dispatch behind
/// [`crate::CompletionQueue`]. The provider's queue pair holds the same
/// queue (an `Arc`, or the device's queue) to complete work into it.
#[derive(Debug)]
pub(crate) enum Cq {
    ShmSend(Arc<shm::SendCq>),
    ShmRecv(Arc<shm::RecvCq>),
    #[cfg(feature = "verbs")]
    Verbs(verbs::VerbsCq),
    Virtual(Arc<virt::Sharer>),
}

impl Cq {
    #[inline]
    pub(crate) fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        match self {
            Cq::ShmSend(cq) => Ok(cq.poll(out)),
            Cq::ShmRecv(cq) => cq.poll(out),
            #[cfg(feature = "verbs")]
            Cq::Verbs(cq) => cq.poll(out),
            Cq::Virtual(cq) => cq.poll(out),
        }
    }

    pub(crate) fn req_notify(&self) -> Result<()> {
        match self {
            Cq::ShmSend(cq) => cq.req_notify(),
            Cq::ShmRecv(cq) => cq.req_notify(),
            #[cfg(feature = "verbs")]
            Cq::Verbs(cq) => return cq.req_notify(),
            Cq::Virtual(cq) => return cq.req_notify(),
        }
        Ok(())
    }

    pub(crate) fn channel_fd(&self) -> Result<BorrowedFd<'_>> {
        Ok(match self {
            Cq::ShmSend(cq) => cq.channel_fd(),
            Cq::ShmRecv(cq) => cq.channel_fd(),
            #[cfg(feature = "verbs")]
            Cq::Verbs(cq) => cq.channel_fd(),
            Cq::Virtual(cq) => return cq.channel_fd(),
        })
    }

    pub(crate) fn ack_events(&self) -> Result<u64> {
        match self {
            Cq::ShmSend(cq) => cq.ack_events(),
            Cq::ShmRecv(cq) => cq.ack_events(),
            #[cfg(feature = "verbs")]
            Cq::Verbs(cq) => cq.ack_events(),
            Cq::Virtual(cq) => cq.ack_events(),
        }
    }
}

// ---------------------------------------------------------------------------
// Grants added after connect (logical connections over a shared queue pair)
// ---------------------------------------------------------------------------

/// Where a queue pair keeps the regions granted after it connected.
#[derive(Debug)]
enum LaterTable {
    Shm(Weak<shm::LaterRegions>),
    #[cfg(feature = "verbs")]
    Verbs(Weak<verbs::LaterRegions>),
}

/// Regions a peer granted after its queue pair connected (one logical
/// connection's rings, [`crate::conn::connect_logical`]): posts may target
/// them until this drops, and then no more.
#[derive(Debug)]
pub(crate) struct LaterGrants {
    table: LaterTable,
    keys: Vec<u32>,
    _budget: Option<BudgetGuard>,
}

impl Drop for LaterGrants {
    fn drop(&mut self) {
        match &self.table {
            LaterTable::Shm(t) => {
                if let Some(t) = t.upgrade() {
                    let mut t = t.write().unwrap_or_else(|p| p.into_inner());
                    for k in &self.keys {
                        t.remove(k);
                    }
                }
            }
            #[cfg(feature = "verbs")]
            LaterTable::Verbs(t) => {
                if let Some(t) = t.upgrade() {
                    let mut t = t.write().unwrap_or_else(|p| p.into_inner());
                    for k in &self.keys {
                        t.remove(k);
                    }
                }
            }
        }
    }
}
