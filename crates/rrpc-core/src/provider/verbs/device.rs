//! Owned handles on libibverbs objects — the FFI edge of the verbs provider.
//!
//! Each type owns one C object and releases it on drop, holding an `Arc` of
//! whatever must outlive it (a memory region or queue pair keeps its device,
//! a queue pair its completion queues), so destruction always runs in the
//! order libibverbs requires: QP, then CQs, then channels; MRs, then PD, then
//! the device context.
//!
//! Builds; not run on an RDMA NIC here.
// The workspace denies `unsafe`; this module calls libibverbs, so it allows it, with a SAFETY
// argument on every block.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{
    ___ibv_query_port, ibv_ack_cq_events, ibv_alloc_pd, ibv_close_device, ibv_comp_channel,
    ibv_context, ibv_cq, ibv_create_comp_channel, ibv_create_cq, ibv_create_qp, ibv_dealloc_pd,
    ibv_dereg_mr, ibv_destroy_comp_channel, ibv_destroy_cq, ibv_destroy_qp, ibv_device_attr,
    ibv_free_device_list, ibv_get_cq_event, ibv_get_device_list, ibv_get_device_name, ibv_gid,
    ibv_modify_qp, ibv_mr, ibv_open_device, ibv_pd, ibv_poll_cq, ibv_port_attr, ibv_post_recv,
    ibv_post_send, ibv_qp, ibv_qp_cap, ibv_qp_init_attr, ibv_qp_type, ibv_query_device,
    ibv_query_gid, ibv_req_notify_cq, ibv_wc,
};

use super::caps::{self, DeviceCaps, GidEntry};
use super::wr::{Transition, build_recv_wr, mr_access};
use crate::error::{Error, Result};
use crate::region::{Access, Region};
use crate::settings::DEFAULT_INLINE;
use crate::settings::VerbsOptions;

/// Where the kernel lists RDMA devices (GID types are read from here).
const SYSFS: &str = "/sys/class/infiniband";

fn last_os(op: &'static str) -> Error {
    Error::io(op, io::Error::last_os_error())
}

fn errno(op: &'static str, rc: i32) -> Error {
    // Verbs calls return a positive errno, some a negative one, some -1 with errno set.
    if rc == -1 {
        last_os(op)
    } else {
        Error::io(op, io::Error::from_raw_os_error(rc.abs()))
    }
}

/// What the local port looks like (`ibv_query_port` + `ibv_query_gid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PortInfo {
    /// Port number (`port_num`).
    pub(crate) num: u8,
    /// Local identifier (0 on RoCE).
    pub(crate) lid: u16,
    /// The GID at `gid_index`.
    pub(crate) gid: [u8; 16],
    /// Source GID index (`sgid_index`).
    pub(crate) gid_index: u8,
    /// Active MTU (`ibv_mtu` code, checked to be one).
    pub(crate) active_mtu: u32,
}

/// An opened RDMA device and one protection domain on it
/// (`ibv_get_device_list` + `ibv_open_device` + `ibv_alloc_pd`).
pub(crate) struct Device {
    ctx: NonNull<ibv_context>,
    pd: NonNull<ibv_pd>,
    name: String,
    port: PortInfo,
    caps: DeviceCaps,
    /// The most inline bytes this device accepted when it refused
    /// [`DEFAULT_INLINE`] (found once, by bisection, see [`RawQp::new`]).
    inline_cap: std::sync::OnceLock<u32>,
    /// Set on a [`Device::isolated`] handle: the device that owns the
    /// context (closed when the last handle drops), kept alive by this.
    parent: Option<Arc<Device>>,
}

// SAFETY: libibverbs contexts and protection domains are thread-safe objects;
// we only pass their pointers to libibverbs calls, never dereference them for writing.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("caps", &self.caps)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Opens the device `opts` names, or the first one listed
    /// (`ibv_get_device_list`, `ibv_open_device`, `ibv_alloc_pd`), reads its
    /// limits (`ibv_query_device`) and the chosen port and GID
    /// (`ibv_query_port`, `ibv_query_gid`).
    ///
    /// # Errors
    /// [`Error::Io`] with kind `NotFound` and the message "no RDMA device found"
    /// when libibverbs lists no device (no NIC, no kernel support) or none of
    /// that name; [`Error::InvalidConfig`] for a port or GID index the device
    /// does not have; [`Error::Io`] if opening or querying the device fails.
    pub(crate) fn open(opts: &VerbsOptions) -> Result<Arc<Device>> {
        let name = opts.device();
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the returned list is freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() || n <= 0 {
            if !list.is_null() {
                // SAFETY: `list` came from ibv_get_device_list and is freed once.
                unsafe { ibv_free_device_list(list) };
            }
            return Err(Error::io(
                "ibv_get_device_list",
                io::Error::new(io::ErrorKind::NotFound, "no RDMA device found"),
            ));
        }
        let mut names = Vec::with_capacity(n as usize);
        let mut chosen = None;
        for i in 0..n as usize {
            // SAFETY: the list holds `n` valid device pointers (NULL-terminated after them).
            let dev = unsafe { *list.add(i) };
            // SAFETY: `dev` is a listed device; its name is a NUL-terminated string
            // owned by libibverbs that lives as long as the list.
            let dname = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if chosen.is_none() && name.is_none_or(|w| w == dname) {
                chosen = Some((dev, dname.clone()));
            }
            names.push(dname);
        }
        let result = match chosen {
            None => Err(Error::io(
                "ibv_get_device_list",
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "no RDMA device found named {:?} (devices: {})",
                        name.unwrap_or_default(),
                        names.join(", ")
                    ),
                ),
            )),
            Some((dev, dname)) => Self::open_listed(dev, dname, opts),
        };
        // SAFETY: opening a device keeps its own reference; the list may be freed now.
        unsafe { ibv_free_device_list(list) };
        result.map(Arc::new)
    }

    fn open_listed(
        dev: *mut rdma_sys::ibv_device,
        name: String,
        opts: &VerbsOptions,
    ) -> Result<Device> {
        // SAFETY: `dev` is a live entry of the device list.
        let ctx = NonNull::new(unsafe { ibv_open_device(dev) })
            .ok_or_else(|| last_os("ibv_open_device"))?;
        // SAFETY: `ctx` was just opened.
        let pd = match NonNull::new(unsafe { ibv_alloc_pd(ctx.as_ptr()) }) {
            Some(pd) => pd,
            None => {
                let e = last_os("ibv_alloc_pd");
                // SAFETY: `ctx` is ours and has no children.
                unsafe { ibv_close_device(ctx.as_ptr()) };
                return Err(e);
            }
        };
        let mut d = Device {
            ctx,
            pd,
            name,
            port: PortInfo {
                num: opts.port(),
                lid: 0,
                gid: [0; 16],
                gid_index: 0,
                active_mtu: 0,
            },
            caps: DeviceCaps {
                phys_port_cnt: 0,
                max_qp_wr: 0,
                max_cqe: 0,
            },
            inline_cap: std::sync::OnceLock::new(),
            parent: None,
        };
        // On error `d` drops and releases pd and ctx.
        d.caps = d.query_device()?;
        caps::check_port(&d.name, opts.port(), &d.caps)?;
        d.port = d.query_port(opts.port(), opts.gid_index())?;
        tracing::info!(
            device = %d.name,
            port = d.port.num,
            lid = d.port.lid,
            gid_index = d.port.gid_index,
            gid = %std::net::Ipv6Addr::from(d.port.gid),
            active_mtu = super::qp_address::mtu_bytes(d.port.active_mtu),
            max_qp_wr = d.caps.max_qp_wr,
            "verbs device opened"
        );
        Ok(d)
    }

    fn query_device(&self) -> Result<DeviceCaps> {
        // SAFETY: `ibv_device_attr` is plain integers and a char array; zero is valid.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer.
        let rc = unsafe { ibv_query_device(self.ctx.as_ptr(), &mut attr) };
        if rc != 0 {
            return Err(errno("ibv_query_device", rc));
        }
        let non_neg = |v: i32| u32::try_from(v).unwrap_or(0);
        Ok(DeviceCaps {
            phys_port_cnt: attr.phys_port_cnt,
            max_qp_wr: non_neg(attr.max_qp_wr),
            max_cqe: non_neg(attr.max_cqe),
        })
    }

    /// One GID table entry: `ibv_query_gid` (an empty entry reads as zero)
    /// and, for RoCE, its type from sysfs.
    fn gid_entry(&self, port: u8, index: u8) -> Result<GidEntry> {
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: valid context and out-pointer; `index` is below the port's
        // `gid_tbl_len` (the caller's loop bound), and libibverbs checks it anyway.
        let rc = unsafe { ibv_query_gid(self.ctx.as_ptr(), port, index.into(), &mut gid) };
        if rc != 0 {
            return Err(errno("ibv_query_gid", rc));
        }
        // SAFETY: `raw` covers the whole union; any bytes are valid.
        let gid = unsafe { gid.raw };
        let roce_v2 = gid != [0; 16]
            && caps::sysfs_gid_type(std::path::Path::new(SYSFS), &self.name, port, index)
                .is_some_and(|t| t == "RoCE v2");
        Ok(GidEntry { gid, roce_v2 })
    }

    fn query_port(&self, port: u8, gid_index: Option<u8>) -> Result<PortInfo> {
        // SAFETY: `ibv_port_attr` is plain integers; zero is valid.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer; `port` was checked against
        // the device's port count.
        let rc = unsafe { ___ibv_query_port(self.ctx.as_ptr(), port, &mut attr) };
        if rc != 0 {
            return Err(errno("ibv_query_port", rc));
        }
        if super::qp_address::mtu_bytes(attr.active_mtu).is_none() {
            return Err(Error::io(
                "ibv_query_port",
                io::Error::other(format!(
                    "port {port} of {} reports active MTU code {}, not an ibv_mtu code (1..=5)",
                    self.name, attr.active_mtu
                )),
            ));
        }
        let roce = attr.link_layer == caps::LINK_LAYER_ETHERNET;
        let table_len = u32::try_from(attr.gid_tbl_len).unwrap_or(0);
        let location = format!("device {} port {port}", self.name);
        let index = caps::choose_gid_index(&location, gid_index, table_len, roce, |i| {
            self.gid_entry(port, i)
        })?;
        let gid = self.gid_entry(port, index)?.gid;
        Ok(PortInfo {
            num: port,
            lid: attr.lid,
            gid,
            gid_index: index,
            active_mtu: attr.active_mtu,
        })
    }

    /// The device's name (e.g. `mlx5_0`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The port the queue pairs use.
    pub(crate) fn port(&self) -> PortInfo {
        self.port
    }

    /// The limits queue pairs are checked against.
    pub(crate) fn caps(&self) -> DeviceCaps {
        self.caps
    }

    fn pd(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }

    /// A handle on the same device context with a protection domain of
    /// its own (`ibv_alloc_pd`). A region registered through it is
    /// reachable only by queue pairs made through it: the NIC refuses a
    /// peer's WRITE or READ that names the region's key on any other
    /// queue pair (`IBV_WC_REM_ACCESS_ERR`), so a peer that learned
    /// another connection's key, or guessed one, touches nothing (issue
    /// 14, "Scoped memory").
    ///
    /// # Errors
    /// [`Error::Io`] if the device refuses another protection domain.
    pub(crate) fn isolated(self: &Arc<Self>) -> Result<Arc<Device>> {
        let root = self.parent.clone().unwrap_or_else(|| self.clone());
        // SAFETY: `root.ctx` is open as long as `root` lives, and the new
        // handle holds `root`.
        let pd = NonNull::new(unsafe { ibv_alloc_pd(root.ctx.as_ptr()) })
            .ok_or_else(|| last_os("ibv_alloc_pd"))?;
        let inline_cap = std::sync::OnceLock::new();
        if let Some(v) = root.inline_cap.get() {
            let _ = inline_cap.set(*v);
        }
        Ok(Arc::new(Device {
            ctx: root.ctx,
            pd,
            name: root.name.clone(),
            port: root.port,
            caps: root.caps,
            inline_cap,
            parent: Some(root),
        }))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: every MR, CQ and QP holds an `Arc<Device>`, so none is left on
        // this PD / context when the last reference drops. An isolated handle
        // closes only its PD: its parent (dropped after this) owns the context.
        unsafe {
            ibv_dealloc_pd(self.pd.as_ptr());
            if self.parent.is_none() {
                ibv_close_device(self.ctx.as_ptr());
            }
        }
    }
}

/// A memory registration (`ibv_reg_mr` with local write and the region's
/// remote access, see [`mr_access`]); `ibv_dereg_mr` on drop.
pub(crate) struct Mr {
    mr: NonNull<ibv_mr>,
    dev: Arc<Device>,
}

// SAFETY: an `ibv_mr` is immutable after registration; we read its keys only.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("device", &self.dev.name)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .finish()
    }
}

impl Mr {
    /// Registers `len` bytes at `addr` with `dev`'s protection domain.
    ///
    /// # Safety
    /// `addr..addr+len` must be a mapping that outlives the returned `Mr`
    /// (the owner must drop the `Mr` before unmapping).
    pub(crate) unsafe fn register(
        dev: &Arc<Device>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr> {
        let flags = mr_access(access);
        // SAFETY: valid PD; the caller guarantees the memory outlives the registration.
        let mr = unsafe { rdma_sys::ibv_reg_mr(dev.pd(), addr.cast(), len, flags as i32) };
        let mr = NonNull::new(mr).ok_or_else(|| last_os("ibv_reg_mr"))?;
        Ok(Mr {
            mr,
            dev: dev.clone(),
        })
    }

    /// The local key, for `ibv_sge::lkey`.
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is live while `self` is.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The remote key the peer puts in `wr.rdma.rkey`.
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: the MR is live while `self` is.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// Whether this registration belongs to `dev`'s protection domain.
    pub(crate) fn is_on(&self, dev: &Device) -> bool {
        std::ptr::eq(self.dev.pd(), dev.pd())
    }
}

impl crate::region::Registration for Mr {}

/// The verbs registration of `region`, if it has one ([`alloc_region`]).
pub(crate) fn mr_of(region: &Region) -> Option<&Mr> {
    let any: &dyn std::any::Any = region.registration()?;
    any.downcast_ref::<Mr>()
}

/// Allocates a region and registers it with `dev`: `mmap` (a memfd
/// mapping, huge pages when possible) + `ibv_reg_mr` with local write and
/// the remote access of `access`. The remote key is the registration's
/// `rkey`.
pub(crate) fn alloc_region(
    len: usize,
    try_huge: bool,
    dev: &Arc<Device>,
    access: Access,
    node: Option<u32>,
) -> Result<Region> {
    let region = Region::alloc_registered(len, try_huge, access, node, |addr, len| {
        // SAFETY: `addr..addr + len` is the mapping of the region
        // `alloc_registered` builds around this registration, which drops
        // the registration (deregisters) before it unmaps the memory.
        let mr = unsafe { Mr::register(dev, addr, len, access)? };
        let rkey = mr.rkey();
        Ok((mr, rkey))
    })?;
    tracing::debug!(
        len,
        huge = region.is_huge(),
        rkey = region.remote().rkey,
        device = dev.name(),
        ?access,
        "region registered"
    );
    Ok(region)
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once; the memory is still mapped
        // (the owning `Region` drops its `Mr` before its mapping).
        unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// A completion queue and its own completion channel
/// (`ibv_create_comp_channel` + `ibv_create_cq`). The channel's fd is made
/// non-blocking so [`RawCq::ack_events`] never blocks.
pub(crate) struct RawCq {
    cq: NonNull<ibv_cq>,
    channel: NonNull<ibv_comp_channel>,
    dev: Arc<Device>,
}

// SAFETY: libibverbs CQ calls are thread-safe; our callers serialise polling anyway.
unsafe impl Send for RawCq {}
// SAFETY: as above.
unsafe impl Sync for RawCq {}

impl std::fmt::Debug for RawCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawCq")
            .field("device", &self.dev.name)
            .field("fd", &self.fd())
            .finish()
    }
}

impl RawCq {
    /// Creates a channel and a CQ of at least `entries` entries on it.
    pub(crate) fn new(dev: &Arc<Device>, entries: u32) -> Result<RawCq> {
        // SAFETY: valid context.
        let channel = NonNull::new(unsafe { ibv_create_comp_channel(dev.ctx.as_ptr()) })
            .ok_or_else(|| last_os("ibv_create_comp_channel"))?;
        let destroy_channel = |e: Error| {
            // SAFETY: the channel is ours and has no CQ.
            unsafe { ibv_destroy_comp_channel(channel.as_ptr()) };
            e
        };
        // SAFETY: `fd` is the channel's open descriptor.
        let fd = unsafe { (*channel.as_ptr()).fd };
        // SAFETY: fcntl on an fd we own; no memory is passed.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            return Err(destroy_channel(last_os(
                "fcntl(O_NONBLOCK) on completion channel",
            )));
        }
        let cqe = i32::try_from(entries).unwrap_or(i32::MAX);
        // SAFETY: valid context and channel; no cq_context.
        let cq = unsafe {
            ibv_create_cq(
                dev.ctx.as_ptr(),
                cqe,
                std::ptr::null_mut(),
                channel.as_ptr(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| destroy_channel(last_os("ibv_create_cq")))?;
        Ok(RawCq {
            cq,
            channel,
            dev: dev.clone(),
        })
    }

    /// `ibv_poll_cq` into `out`; returns how many entries were written.
    pub(crate) fn poll(&self, out: &mut [std::mem::MaybeUninit<ibv_wc>]) -> Result<usize> {
        let n = i32::try_from(out.len()).unwrap_or(i32::MAX);
        // SAFETY: `out` has room for `n` entries; the CQ is live. `ibv_poll_cq`
        // (an inline call through the context's ops table) writes at most `n`.
        let rc = unsafe { ibv_poll_cq(self.cq.as_ptr(), n, out.as_mut_ptr().cast()) };
        if rc < 0 {
            return Err(errno("ibv_poll_cq", rc));
        }
        Ok(rc as usize)
    }

    /// `ibv_req_notify_cq(cq, 0)`: the next completion makes the channel readable.
    pub(crate) fn req_notify(&self) -> Result<()> {
        // SAFETY: live CQ.
        let rc = unsafe { ibv_req_notify_cq(self.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(errno("ibv_req_notify_cq", rc));
        }
        Ok(())
    }

    /// The completion channel's file descriptor.
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the channel lives as long as `self`, and its fd is open
        // until `ibv_destroy_comp_channel` in our drop: the borrow cannot
        // outlive it.
        unsafe { std::os::fd::BorrowedFd::borrow_raw((*self.channel.as_ptr()).fd) }
    }

    /// Drains the (non-blocking) channel with `ibv_get_cq_event` and
    /// acknowledges what it got with `ibv_ack_cq_events`.
    pub(crate) fn ack_events(&self) -> Result<u64> {
        let mut n: u32 = 0;
        loop {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: live channel and valid out-pointers; the fd is non-blocking,
            // so the call returns -1 / EAGAIN instead of sleeping.
            let rc = unsafe { ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut ctx) };
            if rc != 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock || n > 0 {
                    break;
                }
                return Err(Error::io("ibv_get_cq_event", e));
            }
            debug_assert_eq!(cq, self.cq.as_ptr(), "one CQ per channel");
            n += 1;
        }
        if n > 0 {
            // SAFETY: acknowledges exactly the events we just took from this CQ's channel.
            unsafe { ibv_ack_cq_events(self.cq.as_ptr(), n) };
        }
        Ok(n.into())
    }
}

impl Drop for RawCq {
    fn drop(&mut self) {
        // SAFETY: the QP using this CQ was destroyed first (it holds an Arc of us);
        // every event was acknowledged in `ack_events`.
        unsafe {
            ibv_destroy_cq(self.cq.as_ptr());
            ibv_destroy_comp_channel(self.channel.as_ptr());
        }
    }
}

/// An RC queue pair (`ibv_create_qp` with `IBV_QPT_RC`); `ibv_destroy_qp` on drop.
pub(crate) struct RawQp {
    qp: NonNull<ibv_qp>,
    max_inline: u32,
    _send_cq: Arc<RawCq>,
    _recv_cq: Arc<RawCq>,
    dev: Arc<Device>,
}

// SAFETY: `ibv_post_send` / `ibv_post_recv` / `ibv_modify_qp` are thread-safe in libibverbs.
unsafe impl Send for RawQp {}
// SAFETY: as above.
unsafe impl Sync for RawQp {}

impl std::fmt::Debug for RawQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawQp")
            .field("device", &self.dev.name)
            .field("qpn", &self.qpn())
            .field("max_inline", &self.max_inline)
            .finish()
    }
}

impl RawQp {
    /// Creates an RC queue pair on `send` / `recv` with `max_inline` bytes of
    /// inline data ([`crate::QpConfig::max_inline`]):
    ///
    /// * `Some(n)`: exactly checked. If the device refuses `n` but accepts a
    ///   queue pair without inline data, the most it accepts is found by
    ///   bisection and the error names both.
    /// * `None`: [`DEFAULT_INLINE`] bytes, or the most the device accepts if
    ///   it refuses that (found once per device, then reused).
    ///
    /// The depths were checked against the device's limits by the caller.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an inline size the device refuses;
    /// [`Error::Io`] when `ibv_create_qp` fails for another reason.
    pub(crate) fn new(
        dev: &Arc<Device>,
        send: &Arc<RawCq>,
        recv: &Arc<RawCq>,
        send_depth: u32,
        recv_depth: u32,
        max_inline: Option<u32>,
    ) -> Result<RawQp> {
        let create = |inline: u32| Self::create(dev, send, recv, send_depth, recv_depth, inline);
        let want = max_inline.unwrap_or_else(|| {
            dev.inline_cap
                .get()
                .map_or(DEFAULT_INLINE, |&cap| cap.min(DEFAULT_INLINE))
        });
        let first = match create(want) {
            Ok(qp) => return Self::check_granted(qp, &dev.name, max_inline, want),
            Err(e) if want == 0 => return Err(e),
            Err(e) => e,
        };
        // Was it the inline size? A queue pair without inline data tells.
        let Ok(bare) = create(0) else {
            return Err(first);
        };
        let most = caps::largest_inline(want, |n| Ok(create(n).is_ok()))?;
        match max_inline {
            Some(n) => Err(Error::InvalidConfig(format!(
                "max_inline {n} bytes exceeds what device {} accepts: at most {most} bytes \
                 (send_depth {send_depth}, recv_depth {recv_depth})",
                dev.name
            ))),
            None => {
                let cap = *dev.inline_cap.get_or_init(|| most);
                tracing::info!(
                    device = %dev.name,
                    asked = DEFAULT_INLINE,
                    accepted = cap,
                    "verbs device takes less inline data than asked for"
                );
                if cap == 0 {
                    return Ok(bare);
                }
                drop(bare);
                let qp = create(cap)?;
                Self::check_granted(qp, &dev.name, None, cap)
            }
        }
    }

    /// The verbs contract: the device grants at least the inline size asked
    /// for (it may grant more). Refuses a queue pair that got less when the
    /// size was required.
    fn check_granted(qp: RawQp, device: &str, required: Option<u32>, asked: u32) -> Result<RawQp> {
        if qp.max_inline < asked {
            if let Some(n) = required {
                return Err(Error::InvalidConfig(format!(
                    "max_inline {n} bytes: device {device} granted only {}",
                    qp.max_inline
                )));
            }
            tracing::warn!(
                device,
                asked,
                granted = qp.max_inline,
                "device granted less inline data than asked for"
            );
        }
        Ok(qp)
    }

    /// One `ibv_create_qp` (RC) asking for `inline` bytes of inline data.
    fn create(
        dev: &Arc<Device>,
        send: &Arc<RawCq>,
        recv: &Arc<RawCq>,
        send_depth: u32,
        recv_depth: u32,
        inline: u32,
    ) -> Result<RawQp> {
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send.cq.as_ptr(),
            recv_cq: recv.cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: send_depth,
                max_recv_wr: recv_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
            },
            qp_type: ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: valid PD, CQs of the same context, and an init struct that
        // the call reads and updates (`cap` gets the granted values).
        let qp = unsafe { ibv_create_qp(dev.pd(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(|| last_os("ibv_create_qp"))?;
        Ok(RawQp {
            qp,
            max_inline: init.cap.max_inline_data,
            _send_cq: send.clone(),
            _recv_cq: recv.clone(),
            dev: dev.clone(),
        })
    }

    /// Our queue pair number.
    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: live QP; `qp_num` is set at creation and never changes.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    /// Inline bytes the device granted.
    pub(crate) fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// The device.
    pub(crate) fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// `ibv_modify_qp` with one transition of [`super::wr`].
    pub(crate) fn modify(&self, mut t: Transition, op: &'static str) -> Result<()> {
        // SAFETY: live QP and a fully initialised attribute struct.
        let rc = unsafe { ibv_modify_qp(self.qp.as_ptr(), &mut t.attr, t.mask as i32) };
        if rc != 0 {
            return Err(errno(op, rc));
        }
        Ok(())
    }

    /// `ibv_post_send` of one work request built by [`super::wr::build_send_wr`].
    pub(crate) fn post_send(
        &self,
        mut wr: rdma_sys::ibv_send_wr,
        mut sge: rdma_sys::ibv_sge,
    ) -> Result<()> {
        if wr.num_sge > 0 {
            wr.sg_list = &mut sge;
        }
        wr.next = std::ptr::null_mut();
        let mut bad = std::ptr::null_mut();
        // SAFETY: `wr` and `sge` live on our stack for the duration of the call
        // (libibverbs copies them into the send queue); `next` is null, so the
        // list has exactly one element; the local range was bounds-checked
        // against a region registered with this PD.
        let rc = unsafe { ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(errno("ibv_post_send", rc));
        }
        Ok(())
    }

    /// `ibv_post_recv` with no scatter entries.
    pub(crate) fn post_recv(&self, wr_id: u64) -> Result<()> {
        let mut wr = build_recv_wr(wr_id);
        let mut bad = std::ptr::null_mut();
        // SAFETY: a single receive WR with no SGEs, live for the call.
        let rc = unsafe { ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(errno("ibv_post_recv", rc));
        }
        Ok(())
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // SAFETY: created by us and destroyed once, before the CQs it holds.
        unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
    }
}
