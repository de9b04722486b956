//! The shm side channel: a Unix socket that carries the handshake and the
//! descriptors of what each end grants (its regions' memfds, its receive
//! queue and its doorbell pipe), and the checks of what a peer passed before any
//! of it is mapped. `rdma://`'s side channel is `provider::verbs::side`;
//! the connection layer reaches both through `provider::side`.
//!
//! Function-level API for `provider::side`:
//!
//! * [`bind`] / [`accept`] / [`connect_unix`]: the socket;
//! * [`read_client_hello`]: server side — read the client's `Hello` and
//!   its descriptors, check token, provider and the bytes granted, reserve
//!   them against the listener's budget, answer `Reject` on error;
//! * [`answer`]: server side — attach our queue pair to the client's
//!   grants and answer `Accept` with ours;
//! * [`dial`] / [`dial_logical`]: the client side, one call each;
//! * [`start_dial`] / [`answer_arrived`] / [`finish_dial`]: [`dial`] in
//!   two halves around its one wait, for a caller that waits on readiness;
//! * [`send_msg`] / [`recv_msg`]: one message with its descriptors.
// The workspace denies `unsafe`; this module maps the memory descriptors the peer passed, so it
// allows it, with a SAFETY argument on every block.
#![allow(unsafe_code)]

use std::io::{self, IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

use super::PeerResources;
pub(crate) use super::{check_region_memfds, granted_bytes};
use crate::conn::budget::{Budget, BudgetGuard, PeerKey};
use crate::conn::exchange::{
    Deadline, Offer, Passed, PeerInfo, base_hello, map_io, peer_info, reject_code_for, reject_error,
};
use crate::conn::settings::HandshakeConfig;
use crate::error::{Error, Result};
use crate::handshake::{
    HEADER_LEN, Header, Hello, MAX_BODY, MAX_REGIONS, Message, Reject, RejectCode, token_eq,
};
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
    fds.push(ep.bell_fd);
    let hello = Hello {
        provider: ProviderKind::Shm.code(),
        endpoint,
        ..base_hello(offer)
    };
    Ok((hello, fds))
}

/// Checks a peer's shm grants before anything is mapped: the endpoint's
/// shape, one descriptor per region plus the receive queue and the doorbell,
/// the total bytes against `max_bytes`, and every descriptor's kind (sealed
/// memfds at least as long as claimed, a pipe's write end). Returns the bytes
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
    crate::sys::check_peer_bell(fds[n + 1].as_fd())?;
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
    let bell_fd = it.next().expect("counted");
    let shm = shm_qp(qp)?;
    shm.connect(PeerResources {
        regions,
        cq_fd,
        cq_len,
        cq_cap,
        bell_fd,
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

// ---------------------------------------------------------------------------
// The socket
// ---------------------------------------------------------------------------

/// Binds the side channel at `path`. A stale socket file left by a dead
/// server is replaced; a live one is an error.
///
/// # Errors
/// [`Error::Io`] (`AddrInUse` if another server is listening there).
pub(crate) fn bind(path: &Path) -> Result<UnixListener> {
    remove_stale(path)?;
    UnixListener::bind(path).map_err(|e| Error::io("bind side channel", e))
}

fn remove_stale(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(Error::io(
            "bind side channel",
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ),
        ));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(Error::io(
            "bind side channel",
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a server is listening on {}", path.display()),
            ),
        ));
    }
    std::fs::remove_file(path).map_err(|e| Error::io("remove stale socket", e))
}

/// Takes one client off the listening socket.
///
/// # Errors
/// [`Error::WouldBlock`] on a non-blocking listener with no pending
/// client; [`Error::Io`] if `accept(2)` fails.
pub(crate) fn accept(l: &UnixListener) -> Result<UnixStream> {
    let (s, _) = match l.accept() {
        Ok(x) => x,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return Err(Error::WouldBlock);
        }
        Err(e) => return Err(Error::io("accept", e)),
    };
    Ok(s)
}

/// Who the peer is: its process, by `SO_PEERCRED`.
pub(crate) fn peer_key(s: &UnixStream) -> PeerKey {
    match nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials) {
        Ok(c) => PeerKey::Process {
            uid: c.uid(),
            pid: c.pid(),
        },
        Err(_) => PeerKey::Unknown,
    }
}

/// The peer, for logs: `pid=.. uid=..` when the kernel reports them.
pub(crate) fn peer_addr(s: &UnixStream) -> String {
    match nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials) {
        Ok(c) => format!("pid={} uid={}", c.pid(), c.uid()),
        Err(_) => "unix peer".to_string(),
    }
}

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// Server side: reads the client's `Hello` and the descriptors that came
/// with it, by `deadline`, and checks version, token, provider and the
/// bytes granted against `cfg`'s [`HandshakeConfig::max_grant_bytes`];
/// those bytes are reserved against `budget` for the client's process. A
/// bad client is answered with a `Reject` naming the problem. The
/// descriptors themselves are checked by [`answer`].
///
/// # Errors
/// [`Error::MalformedHandshake`], [`Error::AuthFailed`],
/// [`Error::VersionMismatch`], [`Error::LimitExceeded`], transport errors.
pub(crate) fn read_client_hello(
    s: &UnixStream,
    cfg: &HandshakeConfig,
    budget: &Arc<Budget>,
    deadline: Deadline,
) -> Result<(Hello, PeerInfo, Passed)> {
    let peer_addr = peer_addr(s);
    let key = peer_key(s);
    s.set_nonblocking(false)
        .map_err(|e| Error::io("set_nonblocking", e))?;
    let refused = |s: &UnixStream, e: Error| refuse(s, e, deadline, &peer_addr);
    let (m, fds) = match recv_msg(s, deadline) {
        Ok(x) => x,
        Err(e @ (Error::VersionMismatch { .. } | Error::MalformedHandshake(_))) => {
            return Err(refused(s, e));
        }
        Err(e) => return Err(e),
    };
    let hello = match m {
        Message::Hello(h) => h,
        other => {
            let e = Error::MalformedHandshake(format!("expected Hello, got {:?}", other.kind()));
            return Err(refused(s, e));
        }
    };
    if let Some(want) = cfg.token() {
        let ok = hello.token.as_deref().is_some_and(|t| token_eq(t, want));
        if !ok {
            return Err(refused(s, Error::AuthFailed));
        }
    }
    let peer = match peer_info(&hello, ProviderKind::Shm) {
        Ok(p) => p,
        Err(e) => {
            let _ = send_msg(
                s,
                &Message::Reject(Reject {
                    code: RejectCode::Incompatible,
                    reason: e.to_string(),
                }),
                &[],
                deadline,
            );
            crate::handshake::count_refusal(RejectCode::Incompatible);
            tracing::warn!(error = %e, peer = %peer_addr, reason = "incompatible", "handshake refused");
            return Err(e);
        }
    };
    let bytes = match granted_bytes(&hello, cfg.max_grant_bytes) {
        Ok(b) => b,
        Err(e) => return Err(refused(s, e)),
    };
    let budget = match budget.reserve(key, bytes) {
        Ok(g) => g,
        Err(e) => return Err(refused(s, e)),
    };
    Ok((
        hello,
        peer,
        Passed {
            fds,
            budget: Some(budget),
        },
    ))
}

/// Server side after [`read_client_hello`]: attaches `qp` to the client's
/// grants (its descriptors checked first, at most `max_grant_bytes`) and
/// answers `Accept` with `offer`'s grants and our endpoint. If the client's
/// grants cannot be mapped a `Reject` is sent instead.
///
/// # Errors
/// As [`attach`]; transport errors while answering.
pub(crate) fn answer(
    s: &UnixStream,
    qp: &QueuePair,
    client: &Hello,
    passed: Passed,
    max_grant_bytes: u64,
    offer: &Offer,
    deadline: Deadline,
) -> Result<()> {
    if let Err(e) = attach(qp, client, passed.fds, max_grant_bytes, passed.budget) {
        return Err(refuse(s, e, deadline, "-"));
    }
    let (hello, fds) = make_hello(qp, offer)?;
    send_msg(s, &Message::Accept(hello), &fds, deadline)
}

/// Refuses a handshake: sends `Reject` with the code `e` maps to (best
/// effort: the client may be gone), counts and logs the refusal, and hands
/// `e` back for the caller to return.
fn refuse(s: &UnixStream, e: Error, deadline: Deadline, peer: &str) -> Error {
    let code = reject_code_for(&e);
    let reject = Message::Reject(Reject {
        code,
        reason: e.to_string(),
    });
    let _ = send_msg(s, &reject, &[], deadline);
    crate::handshake::count_refusal(code);
    tracing::warn!(error = %e, peer, reason = code.name(), "handshake refused");
    e
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// The whole client side: connects to `path`, sends our hello (`offer`'s
/// grants and `qp`'s endpoint, with their descriptors), reads the server's
/// `Accept` and attaches `qp` to its grants (at most `max_grant_bytes`),
/// all by `deadline`.
///
/// # Errors
/// As [`connect_unix`], [`exchange_unix`] and [`attach`];
/// [`Error::MalformedHandshake`] for an `Accept` of another provider.
pub(crate) fn dial(
    path: &Path,
    qp: &QueuePair,
    offer: &Offer,
    max_grant_bytes: u64,
    deadline: Deadline,
) -> Result<(UnixStream, PeerInfo)> {
    let s = connect_unix(path, deadline)?;
    let (hello, fds) = make_hello(qp, offer)?;
    let (h, fds) = exchange_unix(&s, hello, &fds, deadline)?;
    let peer = peer_info(&h, ProviderKind::Shm)?;
    attach(qp, &h, fds, max_grant_bytes, None)?;
    Ok((s, peer))
}

/// The client side's first half, without blocking: connects to `path`
/// and sends our hello (as [`dial`]). Returns `None`, having sent nothing,
/// when either step would have to wait (the server's listen backlog is
/// full, or the socket has no room for the hello): the caller then runs
/// [`dial`] where it may block. The socket returned is blocking again, its
/// hello sent; [`finish_dial`] reads the answer.
///
/// # Errors
/// As [`connect_unix`] and [`send_msg`].
pub(crate) fn start_dial(
    path: &Path,
    qp: &QueuePair,
    offer: &Offer,
    deadline: Deadline,
) -> Result<Option<UnixStream>> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, socket};
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| Error::nix("socket", e))?;
    let s = UnixStream::from(fd);
    let addr = UnixAddr::new(path).map_err(|e| Error::nix("connect side channel", e))?;
    loop {
        match nix::sys::socket::connect(s.as_raw_fd(), &addr) {
            Ok(()) => break,
            Err(nix::errno::Errno::EINTR) => deadline.remaining().map(drop)?,
            // A full backlog: a blocking connect waits for room.
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => {
                return Err(map_io(
                    "connect side channel",
                    io::Error::from_raw_os_error(e as i32),
                ));
            }
        }
    }
    let (hello, fds) = make_hello(qp, offer)?;
    let bytes = Message::Hello(hello).encode()?;
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    let n = loop {
        match sendmsg::<()>(
            s.as_raw_fd(),
            &[IoSlice::new(&bytes)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            None,
        ) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => continue,
            // Nothing sent: the blocking dial starts over on a new socket
            // (this one closes; the server sees a client leave before its hello).
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(map_io("sendmsg", io::Error::from_raw_os_error(e as i32))),
        }
    };
    s.set_nonblocking(false)
        .map_err(|e| Error::io("set_nonblocking", e))?;
    // The rest of a hello sent in part (a fresh socket's buffer holds a
    // whole one, so this does not happen in practice), bounded by `deadline`.
    let mut n = n;
    while n < bytes.len() {
        s.set_write_timeout(Some(deadline.remaining()?))
            .map_err(|e| Error::io("set socket timeout", e))?;
        match (&s).write(&bytes[n..]) {
            Ok(0) => return Err(Error::PeerGone),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(map_io("handshake write", e)),
        }
    }
    Ok(Some(s))
}

/// Whether the server's whole answer (header and body) waits in `s`'s
/// receive queue, so that [`finish_dial`] will not wait for it; also
/// `true` when waiting would not help (the server closed or shut the
/// socket, with or without part of an answer sent, or the header does not
/// decode: [`finish_dial`] then fails at once).
/// Peeks without consuming and without blocking.
///
/// # Errors
/// Transport errors.
pub(crate) fn answer_arrived(s: &UnixStream) -> Result<bool> {
    use nix::sys::socket::recv;
    let mut buf = vec![0u8; HEADER_LEN + MAX_BODY];
    let n = match recv(
        s.as_raw_fd(),
        &mut buf,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(n) => n,
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return Ok(false),
        Err(e) => return Err(map_io("recv", io::Error::from_raw_os_error(e as i32))),
    };
    if n == 0 {
        return Ok(true);
    }
    if n >= HEADER_LEN {
        let head: &[u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("12 bytes");
        match Header::decode(head) {
            Ok(h) if n < HEADER_LEN + h.body_len => {}
            _ => return Ok(true),
        }
    }
    // Part of an answer: worth waiting for unless the server has shut its
    // side, after which the rest never comes.
    peer_shut(s)
}

/// Whether the peer has shut its sending side (or the socket hung up):
/// `poll` with no wait.
fn peer_shut(s: &UnixStream) -> Result<bool> {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid `pollfd` for the duration of the call, timeout 0.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(map_io("poll", e));
    }
    Ok(p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0)
}

/// The client side's second half, after [`start_dial`]: reads the server's
/// `Accept` and attaches `qp` to its grants (at most `max_grant_bytes`),
/// by `deadline`. Blocks only while the answer has not arrived whole
/// ([`answer_arrived`]).
///
/// # Errors
/// As [`dial`].
pub(crate) fn finish_dial(
    s: &UnixStream,
    qp: &QueuePair,
    max_grant_bytes: u64,
    deadline: Deadline,
) -> Result<PeerInfo> {
    let (answer, fds) = recv_msg(s, deadline)?;
    let h = match answer {
        Message::Accept(h) => h,
        Message::Reject(r) => return Err(reject_error(r)),
        other => {
            return Err(Error::MalformedHandshake(format!(
                "expected Accept, got {:?}",
                other.kind()
            )));
        }
    };
    let peer = peer_info(&h, ProviderKind::Shm)?;
    attach(qp, &h, fds, max_grant_bytes, None)?;
    Ok(peer)
}

/// The client side of a logical connection (`conn::connect_logical`):
/// connects to `path` and sends a hello without an endpoint carrying
/// `offer`'s grants and their memfds. Returns the server's `Accept` and the
/// descriptors that came with it (attached by the caller).
///
/// # Errors
/// As [`exchange_unix`]; [`Error::MalformedHandshake`] if the server
/// answers with an endpoint.
pub(crate) fn dial_logical(
    path: &Path,
    offer: &Offer,
    deadline: Deadline,
) -> Result<(UnixStream, Hello, Vec<OwnedFd>)> {
    let s = connect_unix(path, deadline)?;
    let hello = Hello {
        provider: ProviderKind::Shm.code(),
        ..base_hello(offer)
    };
    let fds: Vec<_> = offer.grants.iter().map(|(_, r)| r.fd()).collect();
    let (h, fds) = exchange_unix(&s, hello, &fds, deadline)?;
    if !h.endpoint.is_empty() {
        return Err(Error::MalformedHandshake(
            "the server answered a logical connection with a queue-pair endpoint".into(),
        ));
    }
    Ok((s, h, fds))
}
