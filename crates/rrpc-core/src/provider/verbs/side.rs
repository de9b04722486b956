//! The TCP side channel of `rdma://` endpoints: the same handshake messages
//! as shm ([`crate::handshake::Message`]) over a TCP stream, without fd
//! passing — a verbs peer needs only the `Hello` bytes: its queue-pair
//! endpoint (LID, QPN, PSN, GID, MTU; see [`super::endpoint`]) and its region
//! descriptors (address, length, rkey).
//!
//! Function-level API for `conn.rs`:
//!
//! * [`connect_tcp`] / [`bind_tcp`] / [`accept_tcp`]: the stream;
//! * [`fill_hello`]: puts the verbs provider code and our endpoint into a `Hello`;
//! * [`exchange`]: client side — send `Hello`, read `Accept` or `Reject`;
//! * [`read_hello`]: server side — read the client's `Hello`, check token and
//!   provider, answer `Reject` on error;
//! * [`attach`]: connect our queue pair to the peer's `Hello`
//!   (INIT → RTR → RTS, remember its grants for the pre-checks);
//! * [`client`] and [`server_accept`]: the above composed, one call per side;
//! * [`send_msg`] / [`recv_msg`]: one framed message.
//!
//! Every read and write is bounded by one [`Deadline`] for the whole
//! handshake: the socket timeout is set to the time left before each call,
//! so a peer that trickles bytes is cut off when the deadline passes.
//!
//! Builds; not run on an RDMA NIC here (the transport and codec are tested
//! over loopback TCP).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};

use crate::conn::{Deadline, TcpKeepalive};

use super::endpoint::VerbsEndpoint;
use crate::error::{Error, Result};
use crate::fabric::ProviderKind;
use crate::handshake::{HEADER_LEN, Header, Hello, Message, Reject, RejectCode, token_eq};
use crate::qp::{QpInner, QueuePair};

fn map_io(op: &'static str, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout,
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted => Error::PeerGone,
        _ => Error::io(op, e),
    }
}

fn verbs_qp(qp: &QueuePair) -> Result<&super::VerbsQp> {
    match &qp.inner {
        QpInner::Verbs(v) => Ok(v),
        #[allow(unreachable_patterns)]
        _ => Err(Error::InvalidConfig(
            "an rdma:// connection needs a queue pair of a verbs fabric".into(),
        )),
    }
}

/// Connects the side channel to `addr` by `deadline`, with `keepalive` set
/// (see [`set_keepalive`]).
///
/// # Errors
/// [`Error::Io`] if the server cannot be reached or a socket option cannot
/// be set; [`Error::Timeout`].
pub(crate) fn connect_tcp(
    addr: SocketAddr,
    deadline: Deadline,
    keepalive: Option<&TcpKeepalive>,
) -> Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, deadline.remaining()?)
        .map_err(|e| map_io("connect side channel", e))?;
    prepare(&s, deadline.remaining()?, keepalive)?;
    Ok(s)
}

/// Binds the server's side channel.
///
/// # Errors
/// [`Error::Io`] (`AddrInUse`, permission).
pub(crate) fn bind_tcp(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| Error::io("bind side channel", e))
}

/// Accepts one client connection, blocking, with `timeout` on its reads and
/// writes and `keepalive` set (see [`set_keepalive`]).
///
/// # Errors
/// [`Error::WouldBlock`] on a non-blocking listener without a client; [`Error::Io`].
pub(crate) fn accept_tcp(
    l: &TcpListener,
    timeout: Duration,
    keepalive: Option<&TcpKeepalive>,
) -> Result<TcpStream> {
    let (s, _) = match l.accept() {
        Ok(x) => x,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(Error::WouldBlock),
        Err(e) => return Err(Error::io("accept", e)),
    };
    s.set_nonblocking(false)
        .map_err(|e| Error::io("set_nonblocking", e))?;
    prepare(&s, timeout, keepalive)?;
    Ok(s)
}

fn prepare(s: &TcpStream, timeout: Duration, keepalive: Option<&TcpKeepalive>) -> Result<()> {
    s.set_nodelay(true)
        .and_then(|_| s.set_read_timeout(Some(timeout)))
        .and_then(|_| s.set_write_timeout(Some(timeout)))
        .map_err(|e| Error::io("configure side channel", e))?;
    match keepalive {
        Some(k) => set_keepalive(s, k),
        None => Ok(()),
    }
}

/// Whole seconds of a keep-alive timer (validated to fit by [`TcpKeepalive::new`]).
fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

/// Turns on TCP keep-alive with `k`'s timers and sets `TCP_USER_TIMEOUT` to
/// [`TcpKeepalive::bound`], so a dead remote host fails the socket with
/// `ETIMEDOUT` within that bound whether the side channel is idle or has
/// data in flight.
///
/// # Errors
/// [`Error::Io`] naming the option the kernel refused.
pub(crate) fn set_keepalive(s: &TcpStream, k: &TcpKeepalive) -> Result<()> {
    let user_timeout = u32::try_from(k.bound().as_millis()).unwrap_or(u32::MAX);
    setsockopt(s, sockopt::TcpKeepIdle, &secs(k.idle()))
        .map_err(|e| Error::nix("setsockopt(TCP_KEEPIDLE)", e))?;
    setsockopt(s, sockopt::TcpKeepInterval, &secs(k.interval()))
        .map_err(|e| Error::nix("setsockopt(TCP_KEEPINTVL)", e))?;
    setsockopt(s, sockopt::TcpKeepCount, &k.count())
        .map_err(|e| Error::nix("setsockopt(TCP_KEEPCNT)", e))?;
    setsockopt(s, sockopt::TcpUserTimeout, &user_timeout)
        .map_err(|e| Error::nix("setsockopt(TCP_USER_TIMEOUT)", e))?;
    setsockopt(s, sockopt::KeepAlive, &true).map_err(|e| Error::nix("setsockopt(SO_KEEPALIVE)", e))
}

/// Writes one message by `deadline`.
///
/// # Errors
/// [`Error::PeerGone`], [`Error::Timeout`], [`Error::Io`]; [`Error::InvalidConfig`]
/// if the message exceeds the codec's limits.
pub(crate) fn send_msg(mut s: &TcpStream, m: &Message, deadline: Deadline) -> Result<()> {
    let bytes = m.encode()?;
    let mut n = 0;
    while n < bytes.len() {
        s.set_write_timeout(Some(deadline.remaining()?))
            .map_err(|e| Error::io("set socket timeout", e))?;
        match s.write(&bytes[n..]) {
            Ok(0) => return Err(Error::PeerGone),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(map_io("handshake write", e)),
        }
    }
    Ok(())
}

/// Fills `buf` by `deadline`. `Ok(false)` if the peer closed before the
/// first byte, an error if it closed after it.
fn read_exact_by(mut s: &TcpStream, buf: &mut [u8], deadline: Deadline) -> Result<bool> {
    let mut have = 0;
    while have < buf.len() {
        s.set_read_timeout(Some(deadline.remaining()?))
            .map_err(|e| Error::io("set socket timeout", e))?;
        match s.read(&mut buf[have..]) {
            Ok(0) if have == 0 => return Ok(false),
            Ok(0) => {
                return Err(Error::MalformedHandshake(format!(
                    "peer closed after {have} of {} bytes",
                    buf.len()
                )));
            }
            Ok(k) => have += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(map_io("handshake read", e)),
        }
    }
    Ok(true)
}

/// Reads one message by `deadline`: the 12-byte header first (a bad magic,
/// version or length is refused before the body is read), then exactly the
/// body.
///
/// # Errors
/// [`Error::MalformedHandshake`], [`Error::VersionMismatch`],
/// [`Error::PeerGone`] (closed before a header), [`Error::Timeout`].
pub(crate) fn recv_msg(s: &TcpStream, deadline: Deadline) -> Result<Message> {
    let mut head = [0u8; HEADER_LEN];
    if !read_exact_by(s, &mut head, deadline)? {
        return Err(Error::PeerGone);
    }
    let header = Header::decode(&head)?;
    let mut body = vec![0u8; header.body_len];
    if !read_exact_by(s, &mut body, deadline)? {
        return Err(Error::MalformedHandshake(format!(
            "peer closed inside a {}-byte body",
            header.body_len
        )));
    }
    Message::decode_body(header.kind, &body)
}

/// Sets `hello.provider` to verbs and `hello.endpoint` to our queue pair's
/// LID, QPN, PSN, GID and port MTU.
///
/// # Errors
/// [`Error::InvalidConfig`] if `qp` is not a verbs queue pair.
pub(crate) fn fill_hello(qp: &QueuePair, hello: &mut Hello) -> Result<()> {
    let v = verbs_qp(qp)?;
    hello.provider = ProviderKind::Verbs.code();
    hello.endpoint = v.endpoint().encode();
    Ok(())
}

/// Client side: sends `hello` and returns the server's `Accept`.
///
/// # Errors
/// [`Error::AuthFailed`] / [`Error::Rejected`] when the server refused,
/// [`Error::MalformedHandshake`] for any other answer, transport errors.
pub(crate) fn exchange(s: &TcpStream, hello: Hello, deadline: Deadline) -> Result<Hello> {
    send_msg(s, &Message::Hello(hello), deadline)?;
    match recv_msg(s, deadline)? {
        Message::Accept(h) => {
            check_provider(&h)?;
            Ok(h)
        }
        Message::Reject(r) => Err(match r.code {
            RejectCode::Auth => Error::AuthFailed,
            _ => Error::Rejected(r.reason),
        }),
        other => Err(Error::MalformedHandshake(format!(
            "expected Accept, got {:?}",
            other.kind()
        ))),
    }
}

fn check_provider(h: &Hello) -> Result<()> {
    if h.provider != ProviderKind::Verbs.code() {
        return Err(Error::MalformedHandshake(format!(
            "peer offers provider code {} on an rdma:// side channel",
            h.provider
        )));
    }
    VerbsEndpoint::decode(&h.endpoint)?;
    Ok(())
}

/// Server side: reads the client's `Hello`, checks the token (when `token` is
/// set) and that it offers a valid verbs endpoint. A bad client is answered
/// with a `Reject` and the error is returned.
///
/// # Errors
/// [`Error::MalformedHandshake`], [`Error::VersionMismatch`],
/// [`Error::AuthFailed`], transport errors.
pub(crate) fn read_hello(s: &TcpStream, token: Option<&[u8]>, deadline: Deadline) -> Result<Hello> {
    let refuse = |code: RejectCode, e: Error| -> Error {
        let _ = send_msg(
            s,
            &Message::Reject(Reject {
                code,
                reason: e.to_string(),
            }),
            deadline,
        );
        crate::handshake::count_refusal(code);
        tracing::warn!(
            error = %e,
            peer = ?s.peer_addr().ok(),
            reason = code.name(),
            "rdma handshake refused"
        );
        e
    };
    let hello = match recv_msg(s, deadline) {
        Ok(Message::Hello(h)) => h,
        Ok(other) => {
            let e = Error::MalformedHandshake(format!("expected Hello, got {:?}", other.kind()));
            return Err(refuse(RejectCode::Malformed, e));
        }
        Err(e @ Error::VersionMismatch { .. }) => return Err(refuse(RejectCode::Version, e)),
        Err(e @ Error::MalformedHandshake(_)) => return Err(refuse(RejectCode::Malformed, e)),
        Err(e) => return Err(e),
    };
    if let Some(want) = token
        && !hello.token.as_deref().is_some_and(|t| token_eq(t, want))
    {
        return Err(refuse(RejectCode::Auth, Error::AuthFailed));
    }
    if let Err(e) = check_provider(&hello) {
        return Err(refuse(RejectCode::Incompatible, e));
    }
    Ok(hello)
}

/// Connects `qp` to the peer described by `peer`: INIT → RTR → RTS towards its
/// endpoint, and its region descriptors become the grants every post is
/// checked against.
///
/// # Errors
/// [`Error::MalformedHandshake`] for a bad endpoint; [`Error::Io`] if the
/// device refuses a transition; [`Error::InvalidConfig`] for a non-verbs or
/// already-connected queue pair.
pub(crate) fn attach(qp: &QueuePair, peer: &Hello) -> Result<()> {
    let v = verbs_qp(qp)?;
    let ep = VerbsEndpoint::decode(&peer.endpoint)?;
    v.connect(&ep, peer.regions.iter().map(|d| d.remote).collect())
}

/// The whole client side: connect to `addr` (with `keepalive`), send `hello` (its provider and
/// endpoint filled in from `qp`), read the server's `Accept`, and connect `qp`
/// to the server's queue pair, all by `deadline`. Returns the side channel
/// (timeouts still set) and the server's `Accept` body.
///
/// # Errors
/// As [`connect_tcp`], [`exchange`] and [`attach`].
pub(crate) fn client(
    addr: SocketAddr,
    qp: &QueuePair,
    mut hello: Hello,
    deadline: Deadline,
    keepalive: Option<&TcpKeepalive>,
) -> Result<(TcpStream, Hello)> {
    fill_hello(qp, &mut hello)?;
    let s = connect_tcp(addr, deadline, keepalive)?;
    let accept = exchange(&s, hello, deadline)?;
    attach(qp, &accept)?;
    Ok((s, accept))
}

/// The server side after [`read_hello`]: connect `qp` to the client's queue
/// pair, then answer `Accept` with `hello` (provider and endpoint filled in).
/// If the client's endpoint cannot be reached a `Reject` is sent instead.
///
/// # Errors
/// As [`attach`]; transport errors while answering.
pub(crate) fn server_accept(
    s: &TcpStream,
    qp: &QueuePair,
    client: &Hello,
    mut hello: Hello,
    deadline: Deadline,
) -> Result<()> {
    if let Err(e) = fill_hello(qp, &mut hello).and_then(|_| attach(qp, client)) {
        let _ = send_msg(
            s,
            &Message::Reject(Reject {
                code: RejectCode::Malformed,
                reason: e.to_string(),
            }),
            deadline,
        );
        crate::handshake::count_refusal(RejectCode::Malformed);
        tracing::warn!(error = %e, peer = ?s.peer_addr().ok(), "rdma handshake refused");
        return Err(e);
    }
    send_msg(s, &Message::Accept(hello), deadline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::{RegionDesc, RingGeometry};
    use crate::region::RemoteRegion;

    fn dl() -> Deadline {
        Deadline::after(Duration::from_secs(5))
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let c = connect_tcp(addr, dl(), None).unwrap();
        let s = accept_tcp(&l, Duration::from_secs(5), None).unwrap();
        (c, s)
    }

    fn verbs_hello(token: Option<&[u8]>) -> Hello {
        Hello {
            token: token.map(<[u8]>::to_vec),
            provider: ProviderKind::Verbs.code(),
            endpoint: VerbsEndpoint {
                lid: 3,
                qpn: 0x77,
                psn: 0x1234,
                gid: [0; 16],
                mtu: rdma_sys::ibv_mtu::IBV_MTU_1024,
            }
            .encode(),
            geometry: RingGeometry {
                slot_size: 64,
                slot_count: 8,
                ..RingGeometry::default()
            },
            regions: vec![RegionDesc {
                role: 1,
                remote: RemoteRegion {
                    addr: 0x10_0000,
                    len: 4096,
                    rkey: 0xabc,
                },
            }],
            app: b"app".to_vec(),
        }
    }

    #[test]
    fn accept_round_trip_over_tcp() {
        let (c, s) = pair();
        let server = std::thread::spawn(move || {
            let h = read_hello(&s, Some(b"secret"), dl()).unwrap();
            let mut answer = verbs_hello(None);
            answer.app = h.app.iter().rev().copied().collect();
            send_msg(&s, &Message::Accept(answer), dl()).unwrap();
            h
        });
        let sent = verbs_hello(Some(b"secret"));
        let got = exchange(&c, sent.clone(), dl()).unwrap();
        assert_eq!(got.app, b"ppa");
        assert_eq!(server.join().unwrap(), sent);
    }

    #[test]
    fn wrong_token_is_rejected_on_both_sides() {
        let (c, s) = pair();
        let server = std::thread::spawn(move || read_hello(&s, Some(b"secret"), dl()));
        assert!(matches!(
            exchange(&c, verbs_hello(Some(b"guess")), dl()),
            Err(Error::AuthFailed)
        ));
        assert!(matches!(server.join().unwrap(), Err(Error::AuthFailed)));
    }

    #[test]
    fn shm_hello_on_rdma_channel_is_incompatible() {
        let (c, s) = pair();
        let server = std::thread::spawn(move || read_hello(&s, None, dl()));
        let mut h = verbs_hello(None);
        h.provider = ProviderKind::Shm.code();
        assert!(matches!(exchange(&c, h, dl()), Err(Error::Rejected(_))));
        assert!(matches!(
            server.join().unwrap(),
            Err(Error::MalformedHandshake(_))
        ));
        // A verbs hello with a truncated endpoint is refused the same way.
        let (c, s) = pair();
        let server = std::thread::spawn(move || read_hello(&s, None, dl()));
        let mut h = verbs_hello(None);
        h.endpoint.truncate(10);
        assert!(matches!(exchange(&c, h, dl()), Err(Error::Rejected(_))));
        assert!(server.join().unwrap().is_err());
    }

    #[test]
    fn garbage_and_early_close_are_typed_errors() {
        let (mut c, s) = pair();
        c.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        assert!(matches!(
            read_hello(&s, None, dl()),
            Err(Error::MalformedHandshake(_))
        ));
        let (c, s) = pair();
        drop(c);
        assert!(matches!(recv_msg(&s, dl()), Err(Error::PeerGone)));
        // A header promising a body that never comes.
        let (mut c, s) = pair();
        let mut bytes = Message::Hello(verbs_hello(None)).encode().unwrap();
        bytes.truncate(HEADER_LEN + 3);
        c.write_all(&bytes).unwrap();
        drop(c);
        assert!(matches!(
            recv_msg(&s, dl()),
            Err(Error::MalformedHandshake(_))
        ));
    }

    #[test]
    fn reads_time_out_instead_of_hanging() {
        let l = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let c = connect_tcp(addr, dl(), None).unwrap();
        let _s = accept_tcp(&l, Duration::from_secs(5), None).unwrap();
        let deadline = Deadline::after(Duration::from_millis(50));
        assert!(matches!(recv_msg(&c, deadline), Err(Error::Timeout)));
    }

    /// One byte every 100 ms never times out a single read, but the
    /// deadline for the whole handshake still cuts the peer off.
    #[test]
    fn trickling_peer_is_cut_off_at_the_deadline() {
        let (c, s) = pair();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let trickler = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let bytes = Message::Hello(verbs_hello(None)).encode().unwrap();
                let mut c = c;
                for b in bytes.iter().take(60) {
                    if stop.load(std::sync::atomic::Ordering::Acquire) {
                        break;
                    }
                    let _ = c.write_all(std::slice::from_ref(b));
                    std::thread::sleep(Duration::from_millis(100));
                }
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let t = std::time::Instant::now();
        let r = read_hello(&s, None, Deadline::after(Duration::from_millis(300)));
        let took = t.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Release);
        trickler.join().unwrap();
        assert!(matches!(r, Err(Error::Timeout)), "{r:?}");
        // Generous: a timeout per read would let it run for the whole 6 s.
        assert!(took < Duration::from_secs(3), "held for {took:?}");
    }

    /// What `getsockopt` reads back: (SO_KEEPALIVE, idle s, interval s, count, user timeout ms).
    fn keepalive_of(s: &impl std::os::fd::AsFd) -> (bool, u32, u32, u32, u32) {
        use nix::sys::socket::getsockopt;
        (
            getsockopt(s, sockopt::KeepAlive).unwrap(),
            getsockopt(s, sockopt::TcpKeepIdle).unwrap(),
            getsockopt(s, sockopt::TcpKeepInterval).unwrap(),
            getsockopt(s, sockopt::TcpKeepCount).unwrap(),
            getsockopt(s, sockopt::TcpUserTimeout).unwrap(),
        )
    }

    #[test]
    fn keepalive_is_set_on_both_ends() {
        let k = TcpKeepalive::default();
        assert_eq!(k.bound(), Duration::from_secs(16));
        let l = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let c = connect_tcp(addr, dl(), Some(&k)).unwrap();
        let s = accept_tcp(&l, Duration::from_secs(5), Some(&k)).unwrap();
        assert_eq!(
            keepalive_of(&c),
            (true, 10, 2, 3, 16_000),
            "connecting socket"
        );
        assert_eq!(
            keepalive_of(&s),
            (true, 10, 2, 3, 16_000),
            "accepted socket"
        );
        // Other timers are carried through as given.
        let k = TcpKeepalive::new(Duration::from_secs(30), Duration::from_secs(5), 4).unwrap();
        let c = connect_tcp(addr, dl(), Some(&k)).unwrap();
        let s = accept_tcp(&l, Duration::from_secs(5), Some(&k)).unwrap();
        assert_eq!(keepalive_of(&c), (true, 30, 5, 4, 50_000));
        assert_eq!(keepalive_of(&s), (true, 30, 5, 4, 50_000));
        // None leaves keep-alive off.
        let c = connect_tcp(addr, dl(), None).unwrap();
        let s = accept_tcp(&l, Duration::from_secs(5), None).unwrap();
        assert!(!keepalive_of(&c).0 && !keepalive_of(&s).0);
    }

    /// The listener of `conn` passes `HandshakeConfig::keepalive` to the
    /// accepted socket (the client side is [`client`], tested on a device).
    #[test]
    fn listener_sets_the_configured_keepalive() {
        use crate::conn::{HandshakeConfig, Listener};
        let ep = crate::Endpoint::parse("rdma://127.0.0.1:0").unwrap();
        for (cfg, want) in [
            (HandshakeConfig::default(), (true, 10, 2, 3, 16_000)),
            (
                HandshakeConfig::default().with_keepalive(Some(
                    TcpKeepalive::new(Duration::from_secs(7), Duration::from_secs(1), 2).unwrap(),
                )),
                (true, 7, 1, 2, 9_000),
            ),
        ] {
            let l = Listener::bind(&ep, cfg).unwrap();
            let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let p = l.accept_pending().unwrap();
            assert_eq!(keepalive_of(&p), want);
        }
        let l = Listener::bind(&ep, HandshakeConfig::default().with_keepalive(None)).unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(!keepalive_of(&l.accept_pending().unwrap()).0);
    }
}
