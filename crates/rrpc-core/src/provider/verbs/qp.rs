//! The verbs queue pair and completion queues: the same pre-checks and
//! send-queue accounting as shm, then one `ibv_post_send` / `ibv_poll_cq`.
//!
//! Builds; not run on an RDMA NIC here.
// The workspace denies `unsafe`; this module posts work requests to libibverbs, so it allows it,
// with a SAFETY argument on every block.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rdma_sys::ibv_wc;

use super::caps::{self, QpSizes};
use super::device::{Device, RawCq, RawQp, mr_of};
use super::qp_address::{QpAddress, mtu_bytes, path_mtu};
use super::wr::{
    self, MAX_MESSAGE, Op, Wc, WorkRequest, build_send_wr, err_transition, init_transition,
    recv_completion, rtr_transition, rts_transition, send_completion,
};
use crate::error::{Error, Result};
use crate::fail::{FailReason, FailState};
use crate::region::{Local, Remote, RemoteRegion};
use crate::settings::QpConfig;
use crate::work::{Completion, Status};

// ---------------------------------------------------------------------------
// Send-queue accounting (pure)
// ---------------------------------------------------------------------------

/// Send-queue slots, verbs style: a work request holds its slot until a
/// signaled completion at or after it is polled. The device sees our sequence
/// number as `wr_id`; the caller's `wr_id` and the operation are kept here.
#[derive(Debug)]
pub(crate) struct SendSlots {
    depth: u32,
    posted: u64,
    retired: u64,
    table: Vec<(u64, Op)>,
}

impl SendSlots {
    /// Slots for `depth` outstanding work requests.
    pub(crate) fn new(depth: u32) -> Self {
        SendSlots {
            depth,
            posted: 0,
            retired: 0,
            table: vec![(0, Op::Write); depth as usize],
        }
    }

    /// Takes a slot; returns the sequence number to post as the device `wr_id`.
    ///
    /// # Errors
    /// [`Error::QueueFull`] when `depth` work requests are outstanding.
    pub(crate) fn reserve(&mut self, wr_id: u64, op: Op) -> Result<u64> {
        if self.posted - self.retired >= u64::from(self.depth) {
            return Err(Error::QueueFull { depth: self.depth });
        }
        self.posted += 1;
        let seq = self.posted;
        self.table[(seq % u64::from(self.depth)) as usize] = (wr_id, op);
        Ok(seq)
    }

    /// Gives back the slot of the last reservation (the post failed).
    pub(crate) fn unreserve(&mut self, seq: u64) {
        debug_assert_eq!(seq, self.posted);
        self.posted -= 1;
    }

    /// A completion for `seq` was polled: retires every slot up to it and
    /// returns what was posted there, or `None` for a sequence number that is
    /// not outstanding (which a correct device never reports).
    pub(crate) fn complete(&mut self, seq: u64) -> Option<(u64, Op)> {
        if seq <= self.retired || seq > self.posted {
            return None;
        }
        self.retired = seq;
        Some(self.table[(seq % u64::from(self.depth)) as usize])
    }

    /// Work requests posted and not retired.
    pub(crate) fn outstanding(&self) -> u64 {
        self.posted - self.retired
    }
}

// ---------------------------------------------------------------------------
// Failure state shared by the queue pair and its completion queues
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Completion queues
// ---------------------------------------------------------------------------

/// Entries fetched per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// The send or receive completion queue of a verbs queue pair.
#[derive(Debug)]
pub(crate) struct VerbsCq {
    raw: Arc<RawCq>,
    side: CqSide,
    fail: Arc<FailState>,
}

#[derive(Debug)]
enum CqSide {
    Send(Arc<Mutex<SendSlots>>),
    Recv(Arc<AtomicU64>),
}

impl VerbsCq {
    /// `ibv_poll_cq`, each `ibv_wc` mapped to a [`Completion`]. A failed
    /// completion other than a flush fails the queue pair with
    /// [`Error::CompletionError`] (the device moved it to the error state).
    ///
    /// The send side polls and retires under the slots lock, so two threads
    /// polling the same queue retire in the device's order: were the lock
    /// taken per completion, a thread holding the completion of request 100
    /// could lose the race to one holding 101, and find 100 already retired.
    pub(crate) fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let mut slots = match &self.side {
            CqSide::Send(slots) => Some(slots.lock().unwrap_or_else(|p| p.into_inner())),
            CqSide::Recv(_) => None,
        };
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(POLL_BATCH);
            let mut wcs = [const { MaybeUninit::<ibv_wc>::uninit() }; POLL_BATCH];
            let got = self.raw.poll(&mut wcs[..want])?;
            for w in &wcs[..got] {
                // SAFETY: `ibv_poll_cq` initialised the first `got` entries.
                let wc = Wc::from_ffi(unsafe { w.assume_init_ref() });
                out[done] = self.map(&wc, slots.as_deref_mut())?;
                done += 1;
            }
            if got < want {
                break;
            }
        }
        Ok(done)
    }

    /// Maps one completion; `slots` is the send side's table, locked by
    /// [`VerbsCq::poll`] (`None` on the receive side).
    fn map(&self, wc: &Wc, slots: Option<&mut SendSlots>) -> Result<Completion> {
        let c = match slots {
            Some(slots) => {
                let rec = slots.complete(wc.wr_id);
                let Some(rec) = rec else {
                    tracing::error!(
                        wr_id = wc.wr_id,
                        "device reported a completion for a work request not outstanding"
                    );
                    return Err(Error::CompletionError {
                        wr_id: wc.wr_id,
                        status: Status::Fatal,
                    });
                };
                if !wr::wc_opcode_matches(wc, rec.1) {
                    tracing::warn!(opcode = wc.opcode, "device reported an unexpected opcode");
                }
                send_completion(wc, rec)
            }
            None => {
                if let CqSide::Recv(posted) = &self.side {
                    let _ = posted
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| p.checked_sub(1));
                }
                recv_completion(wc)
            }
        };
        if !matches!(c.status, Status::Success | Status::Flushed)
            && self.fail.set(FailReason::Completion {
                wr_id: c.wr_id,
                status: c.status,
            })
        {
            tracing::debug!(wr_id = c.wr_id, status = ?c.status, "queue pair failed by a completion");
        }
        Ok(c)
    }

    /// `ibv_req_notify_cq(cq, 0)`.
    pub(crate) fn req_notify(&self) -> Result<()> {
        self.raw.req_notify()
    }

    /// The completion channel's fd.
    pub(crate) fn channel_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.raw.fd()
    }

    /// `ibv_get_cq_event` until empty, then `ibv_ack_cq_events`.
    pub(crate) fn ack_events(&self) -> Result<u64> {
        self.raw.ack_events()
    }
}

// ---------------------------------------------------------------------------
// Queue pair
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct Peer {
    regions: Vec<RemoteRegion>,
    later: Arc<LaterRegions>,
}

/// Regions the peer granted after the queue pair connected, by the logical
/// connections a shared queue pair carries ([`crate::vqp`]), by remote key.
pub(crate) type LaterRegions = std::sync::RwLock<std::collections::HashMap<u32, RemoteRegion>>;

/// A verbs RC queue pair with its two completion queues.
#[derive(Debug)]
pub(crate) struct VerbsQp {
    // The completion queues are the seam's (`provider::QpParts`); the raw
    // queue pair holds their `RawCq`s, so they outlive it.
    raw: RawQp,
    slots: Arc<Mutex<SendSlots>>,
    recv_posted: Arc<AtomicU64>,
    recv_depth: u32,
    psn: u32,
    retry: crate::settings::RcRetry,
    /// The peer's GID, once connected.
    remote_gid: OnceLock<[u8; 16]>,
    peer: OnceLock<Peer>,
    fail: Arc<FailState>,
}

impl VerbsQp {
    /// `ibv_create_comp_channel` + `ibv_create_cq` for each side, then
    /// `ibv_create_qp` (RC) and `ibv_modify_qp` RESET → INIT.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the configured value and the device's
    /// limit when a depth exceeds `max_qp_wr` or `max_cqe`, or the device
    /// refuses a required inline size ([`QpConfig::max_inline`]);
    /// [`Error::Io`] when the device refuses a call.
    /// A queue pair in INIT, with its send and its receive completion queue.
    pub(crate) fn new(dev: &Arc<Device>, cfg: &QpConfig) -> Result<(VerbsQp, VerbsCq, VerbsCq)> {
        let recv_depth = cfg.recv_depth().next_power_of_two();
        caps::check_qp_sizes(
            dev.name(),
            QpSizes {
                send_depth: cfg.send_depth(),
                recv_depth,
            },
            &dev.caps(),
        )?;
        let send_raw = Arc::new(RawCq::new(dev, cfg.send_depth())?);
        let recv_raw = Arc::new(RawCq::new(dev, recv_depth)?);
        let raw = RawQp::new(
            dev,
            &send_raw,
            &recv_raw,
            cfg.send_depth(),
            recv_depth,
            cfg.max_inline(),
        )?;
        raw.modify(init_transition(dev.port().num), "ibv_modify_qp(INIT)")?;
        let slots = Arc::new(Mutex::new(SendSlots::new(cfg.send_depth())));
        let recv_posted = Arc::new(AtomicU64::new(0));
        let fail = Arc::new(FailState::default());
        let psn = crate::sys::random_u32() & 0x00ff_ffff;
        let send_cq = VerbsCq {
            raw: send_raw,
            side: CqSide::Send(slots.clone()),
            fail: fail.clone(),
        };
        let recv_cq = VerbsCq {
            raw: recv_raw,
            side: CqSide::Recv(recv_posted.clone()),
            fail: fail.clone(),
        };
        let qp = VerbsQp {
            raw,
            slots,
            recv_posted,
            recv_depth,
            psn,
            retry: cfg.rc_retry(),
            remote_gid: OnceLock::new(),
            peer: OnceLock::new(),
            fail,
        };
        Ok((qp, send_cq, recv_cq))
    }

    /// What carries this queue pair ([`crate::QueuePair::carrier`]).
    pub(crate) fn carrier(&self) -> crate::settings::QpCarrier {
        let dev = self.raw.device();
        crate::settings::QpCarrier {
            provider: crate::settings::ProviderKind::Verbs,
            device: Some(dev.name().to_string()),
            local_gid: Some(dev.port().gid),
            remote_gid: self.remote_gid.get().copied(),
            shared: false,
        }
    }

    /// Our queue-pair address for the handshake: the port's LID, GID and active MTU,
    /// our QPN and PSN.
    pub(crate) fn endpoint(&self) -> QpAddress {
        let port = self.raw.device().port();
        QpAddress {
            lid: port.lid,
            qpn: self.raw.qpn(),
            psn: self.psn,
            gid: port.gid,
            mtu: port.active_mtu,
        }
    }

    /// Connects to the peer: remembers the regions it granted (for the
    /// pre-checks) and moves the queue pair INIT → RTR → RTS
    /// (`ibv_modify_qp` twice), RTR with the path MTU
    /// min(our port's active MTU, the peer's).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if already connected; [`Error::MalformedHandshake`]
    /// for a peer MTU that is not an `ibv_mtu` code; [`Error::Io`] if the
    /// device refuses a transition.
    pub(crate) fn connect(&self, peer: &QpAddress, regions: Vec<RemoteRegion>) -> Result<()> {
        if self.peer.get().is_some() {
            return Err(Error::InvalidConfig("queue pair already connected".into()));
        }
        let port = self.raw.device().port();
        let mtu = path_mtu(port.active_mtu, peer.mtu)?;
        self.raw.modify(
            rtr_transition(peer, mtu, port.num, port.gid_index, self.retry),
            "ibv_modify_qp(RTR)",
        )?;
        self.raw
            .modify(rts_transition(self.psn, self.retry), "ibv_modify_qp(RTS)")?;
        self.peer
            .set(Peer {
                regions,
                later: Arc::default(),
            })
            .map_err(|_| Error::InvalidConfig("queue pair already connected".into()))?;
        // A zero GID is an InfiniBand peer routed by LID: no address to show.
        if peer.gid != [0; 16] {
            let _ = self.remote_gid.set(peer.gid);
        }
        tracing::debug!(
            qpn = self.raw.qpn(),
            peer_qpn = peer.qpn,
            path_mtu = mtu_bytes(mtu),
            ack_timeout = self.retry.ack_timeout(),
            retry_count = self.retry.retry_count(),
            "verbs queue pair connected"
        );
        Ok(())
    }

    /// Fails the queue pair: records the reason and moves it to `IBV_QPS_ERR`
    /// so the device flushes outstanding work requests.
    pub(crate) fn fail(&self, e: &Error) {
        if self.fail.set(FailReason::from_error(e)) {
            tracing::debug!(error = %e, "verbs queue pair failed");
            if let Err(err) = self.raw.modify(err_transition(), "ibv_modify_qp(ERR)") {
                tracing::warn!(error = %err, "could not move the queue pair to the error state");
            }
        }
    }

    /// What a NIC's fatal error does: moves the queue pair to
    /// `IBV_QPS_ERR` behind the connection's back (nothing recorded), so
    /// every outstanding and later work request completes flushed.
    pub(crate) fn inject_device_error(&self) -> Result<()> {
        self.raw.modify(err_transition(), "ibv_modify_qp(ERR)")
    }

    /// The error the queue pair failed with, if it did.
    pub(crate) fn failure(&self) -> Option<Error> {
        self.fail.get()
    }

    /// Inline bytes the device granted (`max_inline_data`).
    #[cfg(test)]
    pub(crate) fn max_inline(&self) -> u32 {
        self.raw.max_inline()
    }

    /// The send queue's depth.
    pub(crate) fn send_depth(&self) -> u32 {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).depth
    }

    pub(crate) fn recv_depth(&self) -> u32 {
        self.recv_depth
    }

    /// Work requests posted and not yet retired.
    pub(crate) fn outstanding(&self) -> u64 {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .outstanding()
    }

    /// Adds regions the peer granted after we connected (a logical
    /// connection over this queue pair) to the grants posts are checked
    /// against. Returns the table they were added to and their keys: they
    /// stay until removed from it (the seam's `LaterGrants` does on drop).
    ///
    /// # Errors
    /// [`Error::NotConnected`] before [`Self::connect`];
    /// [`Error::MalformedHandshake`] for a remote key already granted
    /// (nothing is added then).
    pub(crate) fn add_grants(
        &self,
        regions: Vec<RemoteRegion>,
    ) -> Result<(std::sync::Weak<LaterRegions>, Vec<u32>)> {
        let peer = self.peer.get().ok_or(Error::NotConnected)?;
        let mut later = peer.later.write().unwrap_or_else(|p| p.into_inner());
        let keys: Vec<u32> = regions.iter().map(|r| r.rkey).collect();
        crate::region::check_new_keys(&keys, |k| {
            later.contains_key(&k) || peer.regions.iter().any(|r| r.rkey == k)
        })?;
        for r in regions {
            later.insert(r.rkey, r);
        }
        Ok((Arc::downgrade(&peer.later), keys))
    }

    fn ready(&self) -> Result<&Peer> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        self.peer.get().ok_or(Error::NotConnected)
    }

    /// The pre-checks shared with shm, then the work request in verbs' words.
    fn check(&self, local: &Local<'_>, remote: Remote) -> Result<(u64, u32, u32)> {
        let peer = self.ready()?;
        local.region.check(local.offset, local.len)?;
        match check_remote(&peer.regions, remote, local.len as u64) {
            Err(Error::BadRemoteKey { rkey }) => {
                let later = peer.later.read().unwrap_or_else(|p| p.into_inner());
                let r = later.get(&rkey).ok_or(Error::BadRemoteKey { rkey })?;
                check_remote(std::slice::from_ref(r), remote, local.len as u64)?;
            }
            other => other?,
        }
        if local.len as u64 > MAX_MESSAGE {
            return Err(Error::InvalidConfig(format!(
                "a work request carries at most {MAX_MESSAGE} bytes, got {}",
                local.len
            )));
        }
        let mr = mr_of(local.region)
            .filter(|mr| mr.is_on(self.raw.device()))
            .ok_or_else(|| {
                Error::InvalidConfig(
                    "local region is not registered with this queue pair's verbs device and \
                     protection domain (allocate it through the same Fabric, or the same \
                     Fabric::isolated handle)"
                        .into(),
                )
            })?;
        let addr = local.region.as_ptr() as u64 + local.offset as u64;
        Ok((addr, local.len as u32, mr.lkey()))
    }

    /// `ibv_post_send` of one WRITE, WRITE_WITH_IMM or READ. Unlike shm, a
    /// WRITE_WITH_IMM that finds no receive on the peer is not detected here:
    /// the device retries (RNR) and the peer's late `post_recv` completes it.
    pub(crate) fn post(
        &self,
        wr_id: u64,
        op: Op,
        local: Local<'_>,
        remote: Remote,
        signaled: bool,
    ) -> Result<()> {
        let (local_addr, len, lkey) = self.check(&local, remote)?;
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let seq = slots.reserve(wr_id, op)?;
        let (wr, sge) = build_send_wr(
            &WorkRequest {
                wr_id: seq,
                op,
                local_addr,
                len,
                lkey,
                remote_addr: remote.addr,
                rkey: remote.rkey,
                signaled,
            },
            self.raw.max_inline(),
        );
        // Posted under the lock so sequence numbers reach the device in order.
        if let Err(e) = self.raw.post_send(wr, sge) {
            slots.unreserve(seq);
            return Err(e);
        }
        Ok(())
    }

    /// Test only: a signaled WRITE to `remote` without the check that the
    /// peer granted it: what a hostile peer's own code can post.
    #[cfg(test)]
    pub(crate) fn post_write_ungranted(
        &self,
        wr_id: u64,
        local: Local<'_>,
        remote: Remote,
    ) -> Result<()> {
        let mr = mr_of(local.region).expect("a verbs region");
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let seq = slots.reserve(wr_id, Op::Write)?;
        let (wr, sge) = build_send_wr(
            &WorkRequest {
                wr_id: seq,
                op: Op::Write,
                local_addr: local.region.as_ptr() as u64 + local.offset as u64,
                len: local.len as u32,
                lkey: mr.lkey(),
                remote_addr: remote.addr,
                rkey: remote.rkey,
                signaled: true,
            },
            self.raw.max_inline(),
        );
        self.raw.post_send(wr, sge)
    }

    /// `ibv_post_recv` with no scatter entries.
    pub(crate) fn post_recv(&self, wr_id: u64) -> Result<()> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let depth = u64::from(self.recv_depth);
        self.recv_posted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p < depth).then_some(p + 1)
            })
            .map_err(|_| Error::QueueFull {
                depth: self.recv_depth,
            })?;
        if let Err(e) = self.raw.post_recv(wr_id) {
            self.recv_posted.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        Ok(())
    }
}

/// The remote pre-check: `remote` must name a region the peer granted (by
/// key) and `addr..addr+len` must lie inside it.
pub(crate) fn check_remote(regions: &[RemoteRegion], remote: Remote, len: u64) -> Result<()> {
    let r = regions
        .iter()
        .find(|r| r.rkey == remote.rkey)
        .ok_or(Error::BadRemoteKey { rkey: remote.rkey })?;
    if !r.contains(remote.addr, len) {
        return Err(Error::RemoteOutOfBounds {
            addr: remote.addr,
            len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fill_then_refuse() {
        let mut s = SendSlots::new(4);
        for i in 0..4 {
            assert_eq!(s.reserve(100 + i, Op::Write).unwrap(), i + 1);
        }
        assert!(matches!(
            s.reserve(9, Op::Write),
            Err(Error::QueueFull { depth: 4 })
        ));
        assert_eq!(s.outstanding(), 4);
    }

    #[test]
    fn a_signaled_completion_retires_everything_before_it() {
        let mut s = SendSlots::new(4);
        let ops = [Op::Write, Op::WriteImm(5), Op::Read];
        for (i, op) in ops.iter().enumerate() {
            s.reserve(10 + i as u64, *op).unwrap();
        }
        // Only the third was signaled: its completion frees all three slots.
        assert_eq!(s.complete(3), Some((12, Op::Read)));
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.complete(3), None, "already retired");
        assert_eq!(s.complete(2), None, "retired by a later completion");
        assert_eq!(s.complete(4), None, "never posted");
        // Slots wrap around the table without clobbering outstanding records.
        for i in 0..4 {
            s.reserve(20 + i, Op::Write).unwrap();
        }
        assert_eq!(s.complete(5), Some((21, Op::Write)));
        assert_eq!(s.complete(7), Some((23, Op::Write)));
        assert_eq!(s.outstanding(), 0);
    }

    #[test]
    fn a_failed_post_gives_its_slot_back() {
        let mut s = SendSlots::new(1);
        let seq = s.reserve(1, Op::Write).unwrap();
        s.unreserve(seq);
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.reserve(2, Op::Read).unwrap(), 1);
        assert_eq!(s.complete(1), Some((2, Op::Read)));
    }

    #[test]
    fn remote_checks_match_shm() {
        let granted = [
            RemoteRegion {
                addr: 0x1000,
                len: 0x100,
                rkey: 7,
            },
            RemoteRegion {
                addr: 0x9000,
                len: 0x10,
                rkey: 8,
            },
        ];
        let at = |addr, rkey| Remote { addr, rkey };
        assert!(check_remote(&granted, at(0x1000, 7), 0x100).is_ok());
        assert!(check_remote(&granted, at(0x10f8, 7), 8).is_ok());
        assert!(check_remote(&granted, at(0x9000, 8), 0).is_ok());
        assert!(matches!(
            check_remote(&granted, at(0x10f9, 7), 8),
            Err(Error::RemoteOutOfBounds { .. })
        ));
        assert!(matches!(
            check_remote(&granted, at(0x0fff, 7), 1),
            Err(Error::RemoteOutOfBounds { .. })
        ));
        assert!(matches!(
            check_remote(&granted, at(0x9000, 7), 1),
            Err(Error::RemoteOutOfBounds { .. })
        ));
        assert!(matches!(
            check_remote(&granted, at(0x1000, 9), 1),
            Err(Error::BadRemoteKey { rkey: 9 })
        ));
        assert!(matches!(
            check_remote(&granted, at(u64::MAX, 7), 2),
            Err(Error::RemoteOutOfBounds { .. })
        ));
    }

    #[test]
    fn failure_keeps_the_first_reason() {
        let f = FailState::default();
        assert!(f.get().is_none());
        assert!(f.set(FailReason::Completion {
            wr_id: 4,
            status: Status::RemoteAccessError
        }));
        assert!(!f.set(FailReason::PeerGone));
        assert!(matches!(
            f.get(),
            Some(Error::CompletionError {
                wr_id: 4,
                status: Status::RemoteAccessError
            })
        ));
    }
}
