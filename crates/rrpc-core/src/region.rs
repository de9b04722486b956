//! Registered memory: [`Region`] (ours), [`RemoteRegion`] (a peer's grant),
//! [`Local`] and [`Remote`] (the two ends of one work request).
// The workspace denies `unsafe`; this module hands out views of registered memory a peer or NIC
// writes, so it allows it, with a SAFETY argument on every block.
#![allow(unsafe_code)]

use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicU64;

use crate::error::{Error, Result};
use crate::sys::Mapping;

/// Cache-line size every slice handed to a peer is aligned to.
pub const CACHE_LINE: usize = 64;

/// Memory registered with the fabric and owned by this process
/// (verbs: `ibv_reg_mr` over a huge-page mapping; shm: a `memfd` mapping).
///
/// The mapping is page aligned (2 MiB aligned when huge pages were available)
/// and zero-filled on creation. Regions are shared with `Arc`: a queue pair, a
/// ring and the peer's grant may all refer to the same one.
///
/// A region is *peer-writable* once granted: a peer may change its bytes at any
/// moment. Read such memory once, validate, then use it (DESIGN.md principle 3).
#[derive(Debug)]
pub struct Region {
    /// The provider's registration of the memory with a device (verbs: an
    /// `ibv_mr`), if any; declared before `map` so it is deregistered
    /// before the memory is unmapped.
    registration: Option<Box<dyn Registration>>,
    map: Mem,
    /// `map`'s start and length, kept here so that the accessors on the
    /// data path are a field load each, not a match on `map` (with the
    /// match they were no longer inlined: +21 % instructions per ring
    /// message, journal "Lanes taken back out of main").
    base: Base,
    len: usize,
    rkey: u32,
    access: Access,
}

/// The start of a region's memory.
#[derive(Debug, Clone, Copy)]
struct Base(std::ptr::NonNull<u8>);

// SAFETY: it points into the region's own memory (`Region::map`: its own
// mapping, or its parent's, which the view keeps alive), which lives as
// long as the region; every access through it goes through the region's
// methods, the same raw-pointer accesses `Mapping` allows (sys.rs).
unsafe impl Send for Base {}
// SAFETY: `&Base` only gives the pointer out; see above.
unsafe impl Sync for Base {}

impl Base {
    fn of(mem: &Mem) -> Base {
        // A mapping's start is never null (`mmap` fails instead, and a
        // view's start is inside its parent's mapping).
        Base(std::ptr::NonNull::new(mem.ptr()).expect("a mapping's start is not null"))
    }
}

/// A region's memory: a mapping of its own, or a range of another
/// region's ([`Region::view`]).
#[derive(Debug)]
enum Mem {
    Own(Mapping),
    View {
        parent: std::sync::Arc<Region>,
        offset: usize,
        len: usize,
    },
}

impl Mem {
    fn ptr(&self) -> *mut u8 {
        match self {
            Mem::Own(m) => m.ptr(),
            Mem::View { parent, offset, .. } => {
                // SAFETY: `offset + len <= parent.len()` (checked in
                // `Region::view`): the pointer stays inside the parent's mapping.
                unsafe { parent.as_ptr().add(*offset) }
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Mem::Own(m) => m.len(),
            Mem::View { len, .. } => *len,
        }
    }

    fn is_huge(&self) -> bool {
        match self {
            Mem::Own(m) => m.is_huge(),
            Mem::View { parent, .. } => parent.is_huge(),
        }
    }

    fn discard(&self, offset: usize, len: usize) -> Result<usize> {
        match self {
            Mem::Own(m) => m.discard(offset, len),
            Mem::View {
                parent, offset: o, ..
            } => parent.discard(o + offset, len),
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Mem::Own(m) => m.fd(),
            Mem::View { parent, .. } => parent.fd(),
        }
    }
}

/// A provider's registration of a [`Region`]'s memory with a device (verbs:
/// a memory registration, `ibv_mr`). The region owns it and drops it before
/// it unmaps the memory; the provider that made it finds it again with
/// [`Region::registration`] (and a downcast through [`std::any::Any`]).
///
/// Type-erased so that this module names no provider: regions are built
/// on by every provider, so a field of a provider's type here would close
/// an import circle.
pub(crate) trait Registration: std::any::Any + std::fmt::Debug + Send + Sync {}

/// What a connected peer may do to a region (its memory registration's
/// remote access flags on verbs; local access is always allowed).
///
/// On verbs the NIC enforces it: a READ of a region without
/// [`Access::remote_read`] (or a WRITE without `remote_write`) completes
/// with [`crate::cq::Status::RemoteAccessError`] on the peer and breaks its
/// queue pair. On shm it is recorded, not enforced: a peer maps the granted
/// memfd read-write (it can read what it may write; see the README's
/// security model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access {
    /// The peer may READ it.
    pub remote_read: bool,
    /// The peer may WRITE (and WRITE_WITH_IMM) into it.
    pub remote_write: bool,
}

impl Access {
    /// Remote read and write (what [`crate::Fabric::alloc_region`] grants).
    pub const ALL: Access = Access {
        remote_read: true,
        remote_write: true,
    };
    /// Remote WRITEs only: a receive ring, a reply buffer.
    pub const REMOTE_WRITE: Access = Access {
        remote_read: false,
        remote_write: true,
    };
    /// No remote access: staging areas, READ destinations.
    pub const LOCAL: Access = Access {
        remote_read: false,
        remote_write: false,
    };
}

/// Binds the memory of `map` to `node`, if any ([`crate::numa`]): a
/// warning and a count in [`crate::numa::PLACEMENT_FAILURES`] when the
/// kernel refuses (no such node, no NUMA support), never an error.
fn place(map: &Mapping, node: Option<u32>) {
    let Some(node) = node else {
        return;
    };
    match mbind_preferred(map, node) {
        Ok(()) => tracing::debug!(node, len = map.len(), "region bound to NUMA node"),
        Err(e) => {
            crate::numa::count_failure("memory");
            tracing::warn!(node, len = map.len(), error = %e, "rrpc: cannot bind a region to its NUMA node; it stays where the kernel puts it");
        }
    }
}

/// `mbind(MPOL_PREFERRED, {node}, MPOL_MF_MOVE)` over the whole mapping:
/// pages not yet touched (a fresh memfd has none; the policy belongs to the
/// memfd, so the peer's faults on shm follow it) come from `node` while it
/// has memory, and pages already there (huge pages are populated when
/// created) are moved.
fn mbind_preferred(map: &Mapping, node: u32) -> std::io::Result<()> {
    /// Bits of the node mask we pass (the kernel's largest `MAX_NUMNODES`).
    const MASK_BITS: usize = 1024;
    const WORD: usize = u64::BITS as usize;
    /// `MPOL_MF_MOVE` of `<linux/mempolicy.h>` (not in the libc crate).
    const MPOL_MF_MOVE: libc::c_ulong = 1 << 1;
    let node = node as usize;
    if node >= MASK_BITS {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("NUMA node {node} is past {MASK_BITS}"),
        ));
    }
    if cfg!(miri) {
        // Heap memory under miri; no system calls.
        return Ok(());
    }
    let mut mask = [0u64; MASK_BITS / WORD];
    mask[node / WORD] |= 1 << (node % WORD);
    // SAFETY: mbind only changes the memory policy of (and may migrate) the
    // pages of `map`, a mapping this process owns for as long as `map`
    // lives; it does not change their contents or the mapping itself. `mask`
    // is a live array of MASK_BITS bits, and `maxnode` (MASK_BITS + 1: the
    // kernel reads `maxnode - 1` bits) does not make the kernel read past it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            map.ptr() as libc::c_ulong,
            map.len() as libc::c_ulong,
            libc::MPOL_PREFERRED as libc::c_ulong,
            mask.as_ptr(),
            (MASK_BITS + 1) as libc::c_ulong,
            MPOL_MF_MOVE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Region {
    /// Allocates a region of at least `len` bytes, its memory bound to NUMA
    /// node `node` if one is given. Prefer [`crate::Fabric::alloc_region`].
    pub(crate) fn alloc(
        len: usize,
        try_huge: bool,
        access: Access,
        node: Option<u32>,
    ) -> Result<Region> {
        let map = Mapping::create(len, try_huge)?;
        place(&map, node);
        let mut rkey = crate::sys::random_u32();
        if rkey == 0 {
            rkey = 1;
        }
        tracing::debug!(len, huge = map.is_huge(), rkey, ?access, "region allocated");
        let map = Mem::Own(map);
        Ok(Region {
            registration: None,
            base: Base::of(&map),
            len: map.len(),
            map,
            rkey,
            access,
        })
    }

    /// Allocates a region of at least `len` bytes (its memory bound to NUMA
    /// node `node` first, if one is given) and has `register` register that
    /// memory with a device: `register` gets the mapping's start and length
    /// and returns the registration and the remote key peers will use.
    ///
    /// The region owns the registration and drops it before it unmaps the
    /// memory, so a registration may rely on the memory it was given
    /// staying mapped for as long as it lives.
    // Called only by providers that register memory (verbs, a cargo
    // feature): unused in a build without them.
    #[allow(dead_code)]
    pub(crate) fn alloc_registered<R: Registration>(
        len: usize,
        try_huge: bool,
        access: Access,
        node: Option<u32>,
        register: impl FnOnce(*mut u8, usize) -> Result<(R, u32)>,
    ) -> Result<Region> {
        let map = Mapping::create(len, try_huge)?;
        // Before the registration pins the pages where they are.
        place(&map, node);
        let (registration, rkey) = register(map.ptr(), map.len())?;
        let map = Mem::Own(map);
        Ok(Region {
            registration: Some(Box::new(registration)),
            base: Base::of(&map),
            len: map.len(),
            map,
            rkey,
            access,
        })
    }

    /// The provider's registration of the memory, if it has one
    /// ([`Self::alloc_registered`]).
    #[allow(dead_code)] // as `alloc_registered`
    pub(crate) fn registration(&self) -> Option<&dyn Registration> {
        match &self.map {
            Mem::View { parent, .. } => parent.registration(),
            Mem::Own(_) => self.registration.as_deref(),
        }
    }

    /// The `len` bytes of `parent` from `offset` as a region of their own:
    /// the same memory, remote key and access, addressed from `offset` (a
    /// ring in one slot of an arena, rrpc-core `conn::mux`). It keeps
    /// `parent` alive. A peer that was granted `parent` reaches it as
    /// `parent.remote().at(offset)`; a view is never granted in a
    /// handshake of its own (its descriptor is the parent's: the peer
    /// would map the parent from its start).
    ///
    /// # Errors
    /// [`Error::LocalOutOfBounds`] for a range outside `parent`, or empty;
    /// [`Error::InvalidConfig`] for an offset not on a cache line.
    pub fn view(parent: &std::sync::Arc<Region>, offset: usize, len: usize) -> Result<Region> {
        if len == 0 {
            return Err(Error::LocalOutOfBounds {
                offset: offset as u64,
                len: 0,
                region_len: parent.len() as u64,
            });
        }
        parent.check(offset, len)?;
        if !offset.is_multiple_of(CACHE_LINE) {
            return Err(Error::InvalidConfig(format!(
                "a view at {offset}, not on a cache line"
            )));
        }
        let map = Mem::View {
            parent: parent.clone(),
            offset,
            len,
        };
        Ok(Region {
            registration: None,
            base: Base::of(&map),
            len,
            map,
            rkey: parent.rkey,
            access: parent.access,
        })
    }

    /// Whether it is a [`Region::view`] of another region.
    pub fn is_view(&self) -> bool {
        matches!(self.map, Mem::View { .. })
    }

    /// What a connected peer may do to it ([`Access`]).
    pub fn access(&self) -> Access {
        self.access
    }

    /// Length in bytes (as requested; the mapping may be larger).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: regions have at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the region is backed by huge pages.
    pub fn is_huge(&self) -> bool {
        self.map.is_huge()
    }

    /// Start of the mapping. Page aligned.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.0.as_ptr()
    }

    /// Gives the memory of `offset..offset + len` back to the operating
    /// system: the whole pages inside the range read as zero afterwards and
    /// hold no memory until written again. Returns the bytes released.
    ///
    /// Only an unregistered region on normal pages can do this (the shm
    /// provider): a verbs registration pins its pages (releasing them would
    /// leave the NIC writing into pages the mapping no longer shows), and a
    /// huge page is released whole or not at all. Those return `Ok(0)`.
    ///
    /// On shm the pages are released for every process mapping the region,
    /// so a peer must not be writing into the range (a self-sizing ring
    /// releases only the part its peer agreed to stop using).
    ///
    /// # Errors
    /// [`Error::LocalOutOfBounds`] if the range is outside the region,
    /// [`Error::Io`] if the system call fails.
    pub fn discard(&self, offset: usize, len: usize) -> Result<usize> {
        self.check(offset, len)?;
        if self.registration().is_some() {
            return Ok(0);
        }
        if self.map.is_huge() {
            return Ok(0);
        }
        self.map.discard(offset, len)
    }

    /// Bytes of memory its backing memory object holds now (its pages
    /// allocated, `fstat`'s blocks), for every process mapping it: what
    /// [`Self::discard`] gives back shows here. A view's is its parent's.
    ///
    /// # Errors
    /// [`Error::Io`] if the system call fails.
    pub fn allocated_bytes(&self) -> Result<usize> {
        let st = nix::sys::stat::fstat(self.fd()).map_err(|e| Error::nix("fstat", e))?;
        Ok(usize::try_from(st.st_blocks).unwrap_or(0) * 512)
    }

    /// The descriptor a peer needs to WRITE into or READ from this region.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.base.0.as_ptr() as u64,
            len: self.len() as u64,
            rkey: self.rkey,
        }
    }

    /// The memory object backing the region (shm: passed to the peer in the handshake).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.map.fd()
    }

    /// Checks that `offset..offset+len` lies inside the region.
    ///
    /// # Errors
    /// [`Error::LocalOutOfBounds`] otherwise.
    pub fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Error::LocalOutOfBounds {
                offset: offset as u64,
                len: len as u64,
                region_len: self.len() as u64,
            }),
        }
    }

    /// An atomic 64-bit word inside the region, for pointer words a peer writes
    /// (read them with `Acquire`) or that we publish (`Release`).
    ///
    /// # Errors
    /// [`Error::LocalOutOfBounds`] if `offset` is not 8-byte aligned or out of bounds.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        self.check(offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(Error::LocalOutOfBounds {
                offset: offset as u64,
                len: 8,
                region_len: self.len() as u64,
            });
        }
        // SAFETY: in bounds and 8-byte aligned (the mapping is page aligned). AtomicU64
        // has the layout of u64, the memory lives as long as `&self`, and every access
        // to it — ours and the peer's shm copies — is atomic or a plain byte copy on a
        // shared mapping, which the kernel treats as ordinary memory.
        Ok(unsafe { &*(self.base.0.as_ptr().add(offset) as *const AtomicU64) })
    }

    /// Copies `src` into the region at `offset` (a local store, not a fabric operation).
    ///
    /// # Errors
    /// [`Error::LocalOutOfBounds`] if the range does not fit.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: the destination range is inside the mapping (checked above) and
        // cannot overlap `src`, which is a Rust borrow of other memory or of a disjoint
        // slice the caller owns.
        unsafe { std::ptr::copy(src.as_ptr(), self.base.0.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Copies bytes out of the region at `offset` into `dst`.
    ///
    /// # Errors
    /// [`Error::LocalOutOfBounds`] if the range does not fit.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        // SAFETY: the source range is inside the mapping (checked above); `dst` is an
        // exclusive borrow, so it does not alias the mapping mutably.
        unsafe {
            std::ptr::copy(
                self.base.0.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    /// Borrows `len` bytes at `offset`.
    ///
    /// # Safety
    /// The range must be in bounds, and for as long as the slice lives nobody —
    /// neither this process nor a peer following the protocol — may write to it.
    /// A misbehaving peer can still change the bytes; callers must treat the
    /// content as untrusted and never derive memory addresses from it unchecked.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        debug_assert!(self.check(offset, len).is_ok());
        // SAFETY: upheld by the caller (see above).
        unsafe { std::slice::from_raw_parts(self.base.0.as_ptr().add(offset), len) }
    }

    /// Mutably borrows `len` bytes at `offset`.
    ///
    /// # Safety
    /// The range must be in bounds and not borrowed elsewhere while the slice
    /// lives; the peer must not be allowed to read it (by the protocol) until the
    /// slice is dropped.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        debug_assert!(self.check(offset, len).is_ok());
        // SAFETY: upheld by the caller (see above).
        unsafe { std::slice::from_raw_parts_mut(self.base.0.as_ptr().add(offset), len) }
    }
}

/// A region a peer granted to us: the triple a verbs work request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The peer's virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key that authorises access.
    pub rkey: u32,
}

impl RemoteRegion {
    /// The remote address `offset` bytes into the region, with its key.
    /// Bounds are checked when a work request using it is posted.
    pub fn at(&self, offset: u64) -> Remote {
        Remote {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }

    /// Whether `addr..addr+len` lies inside this region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match (addr.checked_sub(self.addr), addr.checked_add(len)) {
            (Some(off), Some(_)) => off <= self.len && len <= self.len - off,
            _ => false,
        }
    }
}

/// Refuses remote keys granted twice: within `keys`, or already granted
/// (`taken`).
///
/// # Errors
/// [`Error::MalformedHandshake`] naming the first such key.
pub(crate) fn check_new_keys(keys: &[u32], taken: impl Fn(u32) -> bool) -> Result<()> {
    for (i, &k) in keys.iter().enumerate() {
        if taken(k) || keys[..i].contains(&k) {
            return Err(Error::MalformedHandshake(format!(
                "remote key {k:#x} is already granted on this queue pair"
            )));
        }
    }
    Ok(())
}

/// The remote end of a work request (verbs: `wr.rdma.remote_addr` and `wr.rdma.rkey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// Peer virtual address.
    pub addr: u64,
    /// Remote key of the granted region containing `addr`.
    pub rkey: u32,
}

/// The local end of a work request (verbs: one `ibv_sge` with the region's `lkey`).
#[derive(Debug, Clone, Copy)]
pub struct Local<'a> {
    /// The registered region.
    pub region: &'a Region,
    /// Offset of the first byte inside the region.
    pub offset: usize,
    /// Number of bytes.
    pub len: usize,
}

impl<'a> Local<'a> {
    /// Names `len` bytes at `offset` of `region`. Checked when posted.
    pub fn new(region: &'a Region, offset: usize, len: usize) -> Self {
        Local {
            region,
            offset,
            len,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    /// A view is the parent's memory from its offset: what one writes the
    /// other reads, a peer reaches it at the parent's address plus the
    /// offset under the parent's key, and it keeps the parent alive.
    #[test]
    fn a_view_is_a_range_of_its_parent() {
        let parent = std::sync::Arc::new(
            Region::alloc(4 * 4096, false, Access::REMOTE_WRITE, None).unwrap(),
        );
        let v = Region::view(&parent, 4096, 8192).unwrap();
        assert!(v.is_view() && !parent.is_view());
        assert_eq!(v.len(), 8192);
        v.write_at(8, b"hello").unwrap();
        let mut b = [0u8; 5];
        parent.read_at(4096 + 8, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        let (r, p) = (v.remote(), parent.remote());
        assert_eq!((r.addr, r.len, r.rkey), (p.addr + 4096, 8192, p.rkey));
        assert!(v.check(8190, 4).is_err(), "past the view's end");
        assert!(Region::view(&parent, 3 * 4096, 4097).is_err());
        assert!(Region::view(&parent, 0, 0).is_err());
        assert!(Region::view(&parent, 8, 64).is_err(), "off a cache line");
        drop(parent);
        v.write_at(8190, b"ok").unwrap();
    }

    /// `alloc_region_on` binds before the first touch: the pages of a
    /// region bound to node 0 (every Linux with NUMA support has it) are
    /// there and its policy says so; a node that does not exist is a
    /// warning, not an error; the setting ends with the call.
    #[cfg(not(miri))]
    #[test]
    fn regions_are_bound_to_their_node() {
        let fabric = crate::Fabric::shm().without_huge_pages();
        let r = fabric
            .alloc_region_on(64 << 10, Access::ALL, Some(0))
            .unwrap();
        for page in (0..r.len()).step_by(4096) {
            r.write_at(page, &[1]).unwrap();
        }
        let maps = std::fs::read_to_string("/proc/self/numa_maps").unwrap();
        let e = crate::numa::numa_maps_entry(&maps, r.as_ptr() as usize).expect("mapped");
        assert_eq!(e.policy, "prefer:0", "{e:?}");
        assert_eq!(e.pages.get(&0), Some(&16), "{e:?}");
        let plain = fabric.alloc_region(4096).unwrap();
        let maps = std::fs::read_to_string("/proc/self/numa_maps").unwrap();
        let e = crate::numa::numa_maps_entry(&maps, plain.as_ptr() as usize).expect("mapped");
        assert_eq!(e.policy, "default", "no node, no policy");
        let far = fabric
            .alloc_region_on(4096, Access::ALL, Some(1000))
            .unwrap();
        far.write_at(0, b"still usable").unwrap();
    }

    /// The accessors reach exactly the region's bytes, see each other's
    /// stores and refuse anything outside. Runs under miri too, on heap
    /// memory (`sys::Mapping`).
    #[test]
    fn accessors_stay_inside_and_see_each_others_bytes() {
        let r = Region::alloc(4096 + 100, false, Access::ALL, None).unwrap();
        assert_eq!(r.len(), 8192, "rounded up to whole pages");
        r.write_at(4090, b"0123456789").unwrap();
        let mut out = [0u8; 10];
        r.read_at(4090, &mut out).unwrap();
        assert_eq!(&out, b"0123456789");
        r.atomic_u64(8)
            .unwrap()
            .store(0x1122_3344_5566_7788, Ordering::Release);
        let mut word = [0u8; 8];
        r.read_at(8, &mut word).unwrap();
        assert_eq!(u64::from_le_bytes(word), 0x1122_3344_5566_7788);
        // SAFETY: in bounds, and nothing writes the range while the view lives.
        assert_eq!(unsafe { r.slice(4090, 10) }, b"0123456789");
        // SAFETY: in bounds, and no other view of the range is alive.
        unsafe { r.slice_mut(8190, 2) }.copy_from_slice(b"zz");
        r.read_at(8190, &mut out[..2]).unwrap();
        assert_eq!(&out[..2], b"zz");
        let oob = |e: Result<()>| matches!(e, Err(Error::LocalOutOfBounds { .. }));
        assert!(oob(r.write_at(8190, b"abc")));
        assert!(oob(r.read_at(usize::MAX, &mut out)));
        assert!(oob(r.check(8192, 1)));
        assert!(r.atomic_u64(4).is_err(), "unaligned");
        assert!(r.atomic_u64(8192).is_err(), "past the end");
    }
}
