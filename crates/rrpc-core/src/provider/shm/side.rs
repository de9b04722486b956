//! The shm side channel: a Unix socket that carries the handshake and the
//! descriptors of what each end grants (its regions' memfds, its receive
//! queue and its eventfd), and the checks of what a peer passed before any
//! of it is mapped. `rdma://`'s side channel is `provider::verbs::side`.
// The workspace denies `unsafe`; this module maps the memory descriptors the peer passed, so it
// allows it, with a SAFETY argument on every block.
#![allow(unsafe_code)]

use std::io::{self, IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

use super::PeerResources;
pub(crate) use super::{check_region_memfds, granted_bytes};
use crate::conn::budget::BudgetGuard;
use crate::conn::exchange::{Deadline, Offer, base_hello, map_io, reject_error};
use crate::error::{Error, Result};
use crate::handshake::{HEADER_LEN, Header, Hello, MAX_BODY, MAX_REGIONS, Message};
use crate::provider::Qp;
use crate::qp::QueuePair;
use crate::settings::ProviderKind;

const MAX_FDS: usize = MAX_REGIONS + 2;

/// The most descriptors one `sendmsg` can carry (the kernel's `SCM_MAX_FD`).
/// Our control buffer holds that many, so the kernel never has to truncate
/// one message's descriptors.
const SCM_MAX_FD: usize = 253;

/// Control buffer for [`SCM_MAX_FD`] descriptors, in `u64`s (for alignment).
// SAFETY: CMSG_SPACE only computes a size.
const CMSG_WORDS: usize =
    (unsafe { libc::CMSG_SPACE((SCM_MAX_FD * std::mem::size_of::<RawFd>()) as libc::c_uint) }
        as usize)
        .div_ceil(8);

pub(crate) fn send_msg(
    s: &UnixStream,
    m: &Message,
    fds: &[BorrowedFd<'_>],
    deadline: Deadline,
) -> Result<()> {
    let bytes = m.encode()?;
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    let mut n = loop {
        s.set_write_timeout(Some(deadline.remaining()?))
            .map_err(|e| Error::io("set socket timeout", e))?;
        match sendmsg::<()>(
            s.as_raw_fd(),
            &[IoSlice::new(&bytes)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(map_io("sendmsg", io::Error::from_raw_os_error(e as i32))),
        }
    };
    while n < bytes.len() {
        s.set_write_timeout(Some(deadline.remaining()?))
            .map_err(|e| Error::io("set socket timeout", e))?;
        match (&*s).write(&bytes[n..]) {
            Ok(0) => return Err(Error::PeerGone),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(map_io("handshake write", e)),
        }
    }
    Ok(())
}

/// Receives one message and the fds that came with it, by `deadline`. Never
/// allocates more than `HEADER_LEN + MAX_BODY` bytes; extra or unexpected
/// fds are closed.
pub(crate) fn recv_msg(s: &UnixStream, deadline: Deadline) -> Result<(Message, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; HEADER_LEN + MAX_BODY];
    let mut fds = Vec::new();
    // First read: take at most the header so that a malicious length is refused
    // before we read on; fds arrive with the first byte.
    let mut have = 0usize;
    while have < HEADER_LEN {
        let n = recv_with_fds(s, &mut buf[have..HEADER_LEN], &mut fds, deadline)?;
        if n == 0 {
            return Err(Error::PeerGone);
        }
        have += n;
    }
    let header = Header::decode(buf[..HEADER_LEN].try_into().expect("12 bytes"))?;
    let total = HEADER_LEN + header.body_len;
    while have < total {
        let n = recv_with_fds(s, &mut buf[have..total], &mut fds, deadline)?;
        if n == 0 {
            return Err(Error::MalformedHandshake(format!(
                "peer closed after {have} of {total} bytes"
            )));
        }
        have += n;
    }
    let m = Message::decode_body(header.kind, &buf[HEADER_LEN..total])?;
    Ok((m, fds))
}

/// One `recvmsg` into `buf`, with the socket timeout set to what is left
/// of `deadline`. Every descriptor the kernel passed is pushed onto `fds`
/// as an [`OwnedFd`] before anything is checked, so none can leak: on any
/// error the caller drops `fds` and they are closed.
///
/// # Errors
/// [`Error::MalformedHandshake`] if the control data was truncated or the
/// peer sent more than [`MAX_FDS`] descriptors in all; transport errors.
pub(crate) fn recv_with_fds(
    s: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    deadline: Deadline,
) -> Result<usize> {
    let mut control = [0u64; CMSG_WORDS];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let n = loop {
        s.set_read_timeout(Some(deadline.remaining()?))
            .map_err(|e| Error::io("set socket timeout", e))?;
        // SAFETY: an all-zero msghdr is a valid (empty) value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `msg` points at `iov` (which describes `buf`) and at
        // `control`, all live and exclusively borrowed for the call.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            // Own whatever arrived before looking at anything else, a
            // truncated receive included.
            take_fds(&msg, fds);
            if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                return Err(Error::MalformedHandshake(format!(
                    "peer's file descriptors were truncated (it sent more than the \
                     {SCM_MAX_FD} one message carries, or we ran out of descriptors); \
                     a hello carries at most {MAX_FDS}"
                )));
            }
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(map_io("recvmsg", e));
        }
    };
    if fds.len() > MAX_FDS {
        return Err(Error::MalformedHandshake(format!(
            "peer sent {} file descriptors, more than the {MAX_FDS} a hello carries",
            fds.len()
        )));
    }
    Ok(n)
}

/// Wraps every descriptor of every `SCM_RIGHTS` message in `msg`'s control
/// data (as far as the kernel filled it) in an [`OwnedFd`].
#[allow(clippy::unnecessary_cast)] // `msg_controllen` / `cmsg_len` are not `usize` on every libc
pub(crate) fn take_fds(msg: &libc::msghdr, fds: &mut Vec<OwnedFd>) {
    if msg.msg_control.is_null() || msg.msg_controllen == 0 {
        return;
    }
    let start = msg.msg_control as usize;
    let end = start + msg.msg_controllen as usize;
    // SAFETY: `msg` describes a control buffer the kernel filled;
    // CMSG_FIRSTHDR returns null or a header inside it.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !c.is_null() {
        // SAFETY: `c` is a header inside the control buffer (CMSG_FIRSTHDR /
        // CMSG_NXTHDR check that a whole `cmsghdr` fits), aligned because the
        // buffer is 8-byte aligned and headers are CMSG_ALIGNed.
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_DATA only offsets `c` by the header size.
            let data = unsafe { libc::CMSG_DATA(c) } as usize;
            // SAFETY: CMSG_LEN only computes a size.
            let header = unsafe { libc::CMSG_LEN(0) } as usize;
            // The payload the header claims, clamped to the buffer's end.
            let claimed = (h.cmsg_len as usize).saturating_sub(header);
            let avail = end.saturating_sub(data);
            let count = claimed.min(avail) / std::mem::size_of::<RawFd>();
            for i in 0..count {
                // SAFETY: `data + 4 * i .. + 4` lies inside the control buffer
                // (`count` is clamped to it); the kernel may not align it.
                let fd = unsafe { std::ptr::read_unaligned((data as *const RawFd).add(i)) };
                if fd >= 0 {
                    // SAFETY: the kernel just installed `fd` in our table for us;
                    // nothing else refers to it, so we own it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        // SAFETY: `c` is a valid header of `msg`'s control buffer.
        c = unsafe { libc::CMSG_NXTHDR(msg, c) };
    }
}

pub(crate) fn shm_qp(qp: &QueuePair) -> Result<&crate::provider::shm::ShmQp> {
    match &qp.inner {
        Qp::Shm(shm) => Ok(shm),
        #[cfg(feature = "verbs")]
        Qp::Verbs(_) => Err(Error::InvalidConfig(
            "a verbs queue pair needs an rdma:// endpoint".into(),
        )),
        Qp::Virtual(_) => Err(Error::InvalidConfig(
            "a shared queue pair is attached after its hardware queue pair connects".into(),
        )),
    }
}

pub(crate) fn make_hello<'a>(
    qp: &'a QueuePair,
    offer: &'a Offer,
) -> Result<(Hello, Vec<BorrowedFd<'a>>)> {
    let shm = shm_qp(qp)?;
    let ep = shm.endpoint();
    let mut endpoint = Vec::with_capacity(16);
    endpoint.extend_from_slice(&ep.cq_len.to_le_bytes());
    endpoint.extend_from_slice(&ep.cq_cap.to_le_bytes());
    let mut fds: Vec<BorrowedFd<'a>> = offer.grants.iter().map(|(_, r)| r.fd()).collect();
    fds.push(ep.cq_fd);
    fds.push(ep.event_fd);
    let hello = Hello {
        provider: ProviderKind::Shm.code(),
        endpoint,
        ..base_hello(offer)
    };
    Ok((hello, fds))
}

/// Checks a peer's shm grants before anything is mapped: the endpoint's
/// shape, one descriptor per region plus the receive queue and the eventfd,
/// the total bytes against `max_bytes`, and every descriptor's kind (sealed
/// memfds at least as long as claimed, a real eventfd). Returns the bytes
/// that attaching will map.
///
/// # Errors
/// [`Error::LimitExceeded`] for too many bytes; [`Error::MalformedHandshake`]
/// naming the first wrong descriptor.
pub(crate) fn check_shm_grants(h: &Hello, fds: &[OwnedFd], max_bytes: u64) -> Result<u64> {
    if h.endpoint.len() != 16 {
        return Err(Error::MalformedHandshake(format!(
            "shm endpoint must be 16 bytes, got {}",
            h.endpoint.len()
        )));
    }
    if fds.len() != h.regions.len() + 2 {
        return Err(Error::MalformedHandshake(format!(
            "peer granted {} regions but passed {} descriptors (expected {})",
            h.regions.len(),
            fds.len(),
            h.regions.len() + 2
        )));
    }
    let bytes = granted_bytes(h, max_bytes)?;
    let cq_len = u64::from_le_bytes(h.endpoint[0..8].try_into().expect("8"));
    check_region_memfds(h, fds)?;
    let n = h.regions.len();
    crate::sys::check_peer_memfd(fds[n].as_fd(), cq_len, "receive queue")?;
    crate::sys::check_peer_eventfd(fds[n + 1].as_fd())?;
    Ok(bytes)
}

/// Attaches `qp` to the peer's shm grants (checked by [`check_shm_grants`]
/// first); `budget` is held with the mappings.
pub(crate) fn attach(
    qp: &QueuePair,
    h: &Hello,
    fds: Vec<OwnedFd>,
    max_bytes: u64,
    budget: Option<BudgetGuard>,
) -> Result<()> {
    check_shm_grants(h, &fds, max_bytes)?;
    let cq_len = u64::from_le_bytes(h.endpoint[0..8].try_into().expect("8"));
    let cq_cap = u64::from_le_bytes(h.endpoint[8..16].try_into().expect("8"));
    let mut it = fds.into_iter();
    let regions = h
        .regions
        .iter()
        .map(|d| (d.remote, it.next().expect("counted")))
        .collect();
    let cq_fd = it.next().expect("counted");
    let event_fd = it.next().expect("counted");
    let shm = shm_qp(qp)?;
    shm.connect(PeerResources {
        regions,
        cq_fd,
        cq_len,
        cq_cap,
        event_fd,
        budget,
    })
}

/// Connects a Unix stream socket to `path`, waiting for room in a full
/// listen backlog no longer than `deadline` (`SO_SNDTIMEO` bounds a Unix
/// `connect`).
pub(crate) fn connect_unix(path: &Path, deadline: Deadline) -> Result<UnixStream> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, socket};
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| Error::nix("socket", e))?;
    let s = UnixStream::from(fd);
    s.set_write_timeout(Some(deadline.remaining()?))
        .map_err(|e| Error::io("set socket timeout", e))?;
    let addr = UnixAddr::new(path).map_err(|e| Error::nix("connect side channel", e))?;
    loop {
        match nix::sys::socket::connect(s.as_raw_fd(), &addr) {
            Ok(()) => return Ok(s),
            Err(nix::errno::Errno::EINTR) => deadline.remaining().map(drop)?,
            Err(e) => {
                return Err(map_io(
                    "connect side channel",
                    io::Error::from_raw_os_error(e as i32),
                ));
            }
        }
    }
}

/// Client side on a Unix side channel: sends `hello` with `fds` and
/// returns the server's `Accept` and the descriptors that came with it.
///
/// # Errors
/// The server's `Reject` ([`reject_error`]), any other answer
/// ([`Error::MalformedHandshake`]), transport errors.
pub(crate) fn exchange_unix(
    s: &UnixStream,
    hello: Hello,
    fds: &[BorrowedFd<'_>],
    deadline: Deadline,
) -> Result<(Hello, Vec<OwnedFd>)> {
    send_msg(s, &Message::Hello(hello), fds, deadline)?;
    let (answer, fds) = recv_msg(s, deadline)?;
    match answer {
        Message::Accept(h) => Ok((h, fds)),
        Message::Reject(r) => Err(reject_error(r)),
        other => Err(Error::MalformedHandshake(format!(
            "expected Accept, got {:?}",
            other.kind()
        ))),
    }
}

pub(crate) fn set_timeouts(s: &UnixStream, t: Option<Duration>) -> Result<()> {
    s.set_read_timeout(t)
        .and_then(|_| s.set_write_timeout(t))
        .map_err(|e| Error::io("set socket timeout", e))
}
