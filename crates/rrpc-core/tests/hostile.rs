//! A hostile peer against the public handshake API (leaked descriptors, wrong
//! kinds of descriptor, address-space exhaustion, a handshake that never
//! ends): raw clients and servers built here with `sendmsg` and hand-made
//! file descriptors. Each test checks that the attack is refused with a typed
//! error and a `Reject`, that nothing leaks, and that an honest client still
//! connects afterwards.
//!
//! The tests take one lock so that counting `/proc/self/fd` sees only its
//! own test's descriptors.

use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use rrpc_core::conn::{self, HandshakeConfig, Listener, Offer};
use rrpc_core::handshake::{Hello, Message, RejectCode};
use rrpc_core::{
    Completion, Error, Fabric, FabricAddr, Fault, Local, ProviderKind, QpConfig, RegionDesc,
    RemoteRegion,
};

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn sock_path(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rrpc-hostile-{}-{}-{}",
        std::process::id(),
        tag,
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("s.sock")
}

fn bind(tag: &str, cfg: HandshakeConfig) -> (Listener, FabricAddr, PathBuf) {
    let path = sock_path(tag);
    let ep = FabricAddr::Shm(path.clone());
    (Listener::bind(&ep, cfg).unwrap(), ep, path)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A memfd of `len` bytes (sparse) with `seals` added.
fn memfd(len: u64, seals: SealFlag) -> OwnedFd {
    let fd = memfd_create(
        c"hostile",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .unwrap();
    nix::unistd::ftruncate(&fd, len as i64).unwrap();
    if !seals.is_empty() {
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).unwrap();
    }
    fd
}

fn sealed(len: u64) -> OwnedFd {
    memfd(len, SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW)
}

/// A doorbell as an honest peer passes it: a pipe's write end (sent), and
/// its read end (kept).
fn bell() -> (OwnedFd, OwnedFd) {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).unwrap();
    (w, r)
}

/// Receive-queue geometry a hostile peer claims: capacity 4, the smallest
/// length that holds it.
const CQ_CAP: u64 = 4;
const CQ_LEN: u64 = 192 + CQ_CAP * 8;

/// A well-formed shm hello (or accept) granting `regions` (role 1, fake
/// addresses) with a receive queue of `CQ_LEN` bytes.
fn shm_hello(regions: &[u64]) -> Hello {
    let mut endpoint = CQ_LEN.to_le_bytes().to_vec();
    endpoint.extend_from_slice(&CQ_CAP.to_le_bytes());
    Hello {
        provider: ProviderKind::Shm.code(),
        endpoint,
        regions: regions
            .iter()
            .enumerate()
            .map(|(i, &len)| RegionDesc {
                role: 1,
                remote: RemoteRegion {
                    addr: 0x1000_0000_0000 * (i as u64 + 1),
                    len,
                    rkey: 100 + i as u32,
                },
            })
            .collect(),
        ..Hello::default()
    }
}

fn send_with_fds(s: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    let n = sendmsg::<()>(
        s.as_raw_fd(),
        &[IoSlice::new(bytes)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .unwrap();
    (&*s).write_all(&bytes[n..]).unwrap();
}

/// Everything the server sent until it closed, decoded as one message.
fn read_answer(s: &UnixStream) -> Option<Message> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut back = Vec::new();
    let _ = (&*s).read_to_end(&mut back);
    Message::decode(&back).ok().flatten().map(|(m, _)| m)
}

fn reject_reason(m: Option<Message>) -> String {
    match m {
        Some(Message::Reject(r)) => r.reason,
        other => panic!("expected a Reject, got {other:?}"),
    }
}

/// Server side of an honest connect: accept and attach a fresh queue pair.
fn serve_one(l: &Listener, fabric: &Fabric) -> rrpc_core::Result<conn::Connection> {
    let region = fabric.alloc_region(4096)?;
    l.accept()?.accept(
        fabric.create_qp(&QpConfig::default())?,
        Offer::new().grant(1, region),
    )
}

/// An honest client connects to `l` (served on a thread) and both sides work.
fn honest_connect(l: &Listener, ep: &FabricAddr) {
    let fabric = Fabric::shm();
    std::thread::scope(|sc| {
        let server = sc.spawn(|| serve_one(l, &fabric));
        let region = fabric.alloc_region(4096).unwrap();
        let c = conn::connect(
            ep,
            fabric.create_qp(&QpConfig::default()).unwrap(),
            Offer::new().grant(1, region.clone()),
            &HandshakeConfig::default(),
        )
        .expect("an honest client still connects");
        let s = server.join().unwrap().expect("and the server accepts it");
        // A WRITE into the server's grant completes.
        region.write_at(0, b"ok").unwrap();
        let remote = c.peer().region(1).unwrap();
        c.qp()
            .post_write(1, Local::new(&region, 0, 2), remote.at(0), true)
            .unwrap();
        let mut wc = [Completion::EMPTY; 2];
        assert_eq!(c.qp().send_cq().poll(&mut wc).unwrap(), 1);
        drop(s);
    });
}

// ---------------------------------------------------------------------------
// Descriptors received with SCM_RIGHTS never leak
// ---------------------------------------------------------------------------

#[test]
fn too_many_fds_never_leak_and_get_a_reject() {
    let _g = serial();
    let (l, ep, path) = bind("fds", HandshakeConfig::default());
    let bytes = Message::Hello(shm_hello(&[])).encode().unwrap();
    let spare = sealed(4096);
    let attack = |rounds: usize| {
        let (errors, answers) = std::thread::scope(|sc| {
            let server = sc.spawn(|| (0..rounds).map(|_| l.accept()).collect::<Vec<_>>());
            let answers: Vec<String> = (0..rounds)
                .map(|_| {
                    let s = UnixStream::connect(&path).unwrap();
                    let forty: Vec<BorrowedFd<'_>> = (0..40).map(|_| spare.as_fd()).collect();
                    send_with_fds(&s, &bytes, &forty);
                    match read_answer(&s) {
                        Some(Message::Reject(r)) => r.reason,
                        other => format!("no Reject but {other:?}"),
                    }
                })
                .collect();
            (server.join().unwrap(), answers)
        });
        (errors, answers)
    };
    attack(1); // warm up lazily opened descriptors
    let before = open_fds();
    let (errors, answers) = attack(200);
    let after = open_fds();
    assert!(
        after <= before + 2,
        "server leaked descriptors: {before} open before 200 attacks, {after} after"
    );
    for why in answers {
        assert!(why.contains("descriptors"), "{why}");
    }
    for r in errors {
        assert!(matches!(r, Err(Error::MalformedHandshake(_))), "{r:?}");
    }
    honest_connect(&l, &ep);
}

// ---------------------------------------------------------------------------
// Wrong kinds of descriptor
// ---------------------------------------------------------------------------

/// Sends a hello granting one 4 KiB region with the given fds and returns
/// the server's error and the client's answer.
/// A hand-made shm hello for one region of `len` bytes, sent with `fds`
/// (the region, the receive queue, the doorbell), which `l` accepts. Returns
/// the server's connection and the client's socket (the peer stays while
/// it is open).
fn hand_made_hello_accepted(
    l: &Listener,
    path: &PathBuf,
    len: u64,
    fds: [&dyn AsFd; 3],
) -> (conn::Connection, UnixStream) {
    let s = UnixStream::connect(path).unwrap();
    let bytes = Message::Hello(shm_hello(&[len])).encode().unwrap();
    send_with_fds(&s, &bytes, &fds.map(AsFd::as_fd));
    let qp = Fabric::shm().create_qp(&QpConfig::default()).unwrap();
    let c = l.accept().unwrap().accept(qp, Offer::new()).unwrap();
    (c, s)
}

fn hello_with(
    l: &Listener,
    path: &PathBuf,
    regions: &[u64],
    fds: &[BorrowedFd<'_>],
) -> (Error, Option<Message>) {
    let bytes = Message::Hello(shm_hello(regions)).encode().unwrap();
    let fabric = Fabric::shm();
    std::thread::scope(|sc| {
        let server = sc.spawn(|| {
            l.accept()
                .and_then(|inc| inc.accept(fabric.create_qp(&QpConfig::default())?, Offer::new()))
        });
        let s = UnixStream::connect(path).unwrap();
        send_with_fds(&s, &bytes, fds);
        let answer = read_answer(&s);
        let e = server
            .join()
            .unwrap()
            .expect_err("the hello must be refused");
        (e, answer)
    })
}

/// The doorbell must be a pipe's write end: a pipe's read end, an eventfd
/// (whose one description the peer shares with us: a peer that clears
/// `O_NONBLOCK` could block our writes), a Unix socket or a TCP socket
/// (bytes that leave the host) are refused by name.
#[test]
fn anything_but_a_pipes_write_end_as_doorbell_is_refused() {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket, socketpair};
    let _g = serial();
    let (l, ep, path) = bind("kind", HandshakeConfig::default());
    let region = sealed(4096);
    let cq = sealed(CQ_LEN);
    let (_w, pipe_r) = bell();
    let ev: OwnedFd = nix::sys::eventfd::EventFd::new().unwrap().into();
    let (unix, _u) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    let tcp = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    for (what, fd, says) in [
        ("pipe read end", pipe_r.as_fd(), "not its write end"),
        ("eventfd", ev.as_fd(), "eventfd"),
        ("Unix socket", unix.as_fd(), "socket"),
        ("TCP socket", tcp.as_fd(), "socket"),
    ] {
        let (e, answer) = hello_with(&l, &path, &[4096], &[region.as_fd(), cq.as_fd(), fd]);
        assert!(
            matches!(e, Error::MalformedHandshake(ref m) if m.contains("doorbell") && m.contains(says)),
            "{what}: {e}"
        );
        let why = reject_reason(answer);
        assert!(why.contains("doorbell"), "{what}: {why}");
    }
    honest_connect(&l, &ep);
}

#[test]
fn wrong_memory_objects_are_refused() {
    let _g = serial();
    let (l, ep, path) = bind("mem", HandshakeConfig::default());
    let (ev, _bell_rx) = bell();
    let good = sealed(4096);
    let cq = sealed(CQ_LEN);
    let (pr, _pw) = nix::unistd::pipe().unwrap();
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    let cases: Vec<(&str, OwnedFd, &[u64])> = vec![
        ("unsealed memfd", memfd(4096, SealFlag::empty()), &[4096]),
        (
            "memfd that may still grow",
            memfd(4096, SealFlag::F_SEAL_SHRINK),
            &[4096],
        ),
        ("memfd shorter than claimed", sealed(4096), &[8192]),
        ("pipe", pr.try_clone().unwrap(), &[4096]),
        ("regular file", file.try_clone().unwrap().into(), &[4096]),
    ];
    for (what, fd, regions) in cases {
        let (e, answer) = hello_with(&l, &path, regions, &[fd.as_fd(), cq.as_fd(), ev.as_fd()]);
        assert!(matches!(e, Error::MalformedHandshake(_)), "{what}: {e}");
        let why = reject_reason(answer);
        assert!(why.contains("region"), "{what}: {why}");
    }
    // The receive queue is checked the same way.
    let (e, answer) = hello_with(&l, &path, &[4096], &[good.as_fd(), pr.as_fd(), ev.as_fd()]);
    assert!(matches!(e, Error::MalformedHandshake(_)), "{e}");
    assert!(reject_reason(answer).contains("receive queue"));
    honest_connect(&l, &ep);
}

/// A peer that clears `O_NONBLOCK` on its doorbell and fills it must not
/// block our `WRITE_WITH_IMM`: the ring is written with
/// `pwritev2(RWF_NOWAIT)`, which no flag of the peer's can undo.
#[test]
fn peer_doorbell_that_would_block_never_blocks_a_post() {
    let _g = serial();
    let (l, _ep, path) = bind("evblock", HandshakeConfig::default());
    let region = sealed(4096);
    let cq = sealed(CQ_LEN);
    let (ev, _ev_rx) = bell();
    let fabric = Fabric::shm();
    let bytes = Message::Hello(shm_hello(&[4096])).encode().unwrap();
    let server = {
        let fabric = fabric.clone();
        std::thread::spawn(move || {
            let c = l
                .accept()?
                .accept(fabric.create_qp(&QpConfig::default())?, Offer::new())?;
            Ok::<_, Error>((c, l))
        })
    };
    let s = UnixStream::connect(&path).unwrap();
    send_with_fds(&s, &bytes, &[region.as_fd(), cq.as_fd(), ev.as_fd()]);
    let (c, _l) = server.join().unwrap().expect("a valid hello is accepted");
    // The peer posts receives, arms its queue, fills the doorbell's pipe
    // (nobody reads the other end) and makes it blocking.
    nix::sys::uio::pwrite(&cq, &8u64.to_ne_bytes(), 72).unwrap(); // POSTED
    nix::sys::uio::pwrite(&cq, &1u64.to_ne_bytes(), 128).unwrap(); // ARMED
    let chunk = [0u8; 4096];
    let mut filled = 0usize;
    loop {
        match nix::unistd::write(&ev, &chunk) {
            Ok(n) => filled += n,
            Err(nix::errno::Errno::EAGAIN) => break,
            Err(e) => panic!("filling the doorbell: {e}"),
        }
    }
    assert!(filled > 0);
    fcntl(&ev, FcntlArg::F_SETFL(OFlag::empty())).unwrap();
    let local = fabric.alloc_region(4096).unwrap();
    let remote = c.peer().region(1).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let poster = std::thread::spawn(move || {
        let r = c
            .qp()
            .post_write_imm(1, Local::new(&local, 0, 8), remote.at(0), 7, true);
        tx.send(r.map_err(|e| e.to_string())).unwrap();
        c
    });
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("post_write_imm blocked on the peer's doorbell");
    assert!(r.is_ok(), "{r:?}");
    poster.join().unwrap();
    // The entry reached the peer's queue (PROD word = 1).
    let mut word = [0u8; 8];
    nix::sys::uio::pread(&cq, &mut word, 0).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 1);
    drop(s);
}

// ---------------------------------------------------------------------------
// Address-space exhaustion
// ---------------------------------------------------------------------------

const TIB: u64 = 1 << 40;

#[test]
fn terabyte_grant_is_refused() {
    let _g = serial();
    let (l, ep, path) = bind("tib", HandshakeConfig::default());
    let huge = sealed(TIB);
    let cq = sealed(CQ_LEN);
    let (ev, _bell_rx) = bell();
    let (e, answer) = hello_with(&l, &path, &[TIB], &[huge.as_fd(), cq.as_fd(), ev.as_fd()]);
    assert!(
        matches!(e, Error::LimitExceeded { requested, limit, .. }
            if requested == TIB + CQ_LEN && limit == conn::DEFAULT_MAX_GRANT_BYTES),
        "{e}"
    );
    assert_eq!(e.fault(), Fault::Local);
    let why = reject_reason(answer);
    assert!(
        why.contains(&(TIB + CQ_LEN).to_string())
            && why.contains(&conn::DEFAULT_MAX_GRANT_BYTES.to_string()),
        "{why}"
    );
    assert_eq!(l.peer_bytes_mapped(), 0);
    honest_connect(&l, &ep);
}

/// The listener's total is refused once spent and comes back when the
/// connection holding it is dropped.
#[test]
fn total_budget_is_enforced_and_released() {
    let _g = serial();
    const MIB: u64 = 1 << 20;
    let cfg = HandshakeConfig::builder()
        .max_total_grant_bytes(3 * MIB)
        .build()
        .unwrap();
    let (l, ep, path) = bind("budget", cfg);
    let (ev, _bell_rx) = bell();
    let cq = sealed(CQ_LEN);
    // A first peer takes 2 MiB (+ its queue) and is accepted.
    let two = sealed(2 * MIB);
    let (first, s1) = hand_made_hello_accepted(&l, &path, 2 * MIB, [&two, &cq, &ev]);
    assert_eq!(l.peer_bytes_mapped(), 2 * MIB + CQ_LEN);
    // A second one asking for 1 MiB more is refused: it would pass 3 MiB.
    let one = sealed(MIB);
    let (e, answer) = hello_with(&l, &path, &[MIB], &[one.as_fd(), cq.as_fd(), ev.as_fd()]);
    assert!(
        matches!(e, Error::LimitExceeded { requested, limit, .. }
            if requested == 3 * MIB + 2 * CQ_LEN && limit == 3 * MIB),
        "{e}"
    );
    let why = reject_reason(answer);
    assert!(why.contains(&(3 * MIB).to_string()), "{why}");
    assert_eq!(l.peer_bytes_mapped(), 2 * MIB + CQ_LEN);
    // The first connection goes; its bytes come back and the second fits.
    drop(first);
    drop(s1);
    assert_eq!(l.peer_bytes_mapped(), 0);
    let (second, _s2) = hand_made_hello_accepted(&l, &path, MIB, [&one, &cq, &ev]);
    assert_eq!(l.peer_bytes_mapped(), MIB + CQ_LEN);
    drop(second);
    honest_connect(&l, &ep);
    assert_eq!(l.peer_bytes_mapped(), 0);
}

/// A hostile server granting a TiB in its Accept is refused by the client.
#[test]
fn client_refuses_terabyte_accept() {
    let _g = serial();
    let path = sock_path("tibsrv");
    let ls = UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = ls.accept().unwrap();
        let mut buf = [0u8; 4096];
        let _ = (&s).read(&mut buf);
        let huge = sealed(TIB);
        let cq = sealed(CQ_LEN);
        let (ev, _bell_rx) = bell();
        let bytes = Message::Accept(shm_hello(&[TIB])).encode().unwrap();
        send_with_fds(&s, &bytes, &[huge.as_fd(), cq.as_fd(), ev.as_fd()]);
        let _ = (&s).read(&mut buf); // until the client hangs up
    });
    let fabric = Fabric::shm();
    let r = conn::connect(
        &FabricAddr::Shm(path),
        fabric.create_qp(&QpConfig::default()).unwrap(),
        Offer::new(),
        &HandshakeConfig::default(),
    );
    let e = r.expect_err("a 1 TiB grant must be refused");
    assert!(
        matches!(e, Error::LimitExceeded { requested, .. } if requested == TIB + CQ_LEN),
        "{e}"
    );
    server.join().unwrap();
}

// ---------------------------------------------------------------------------
// The timeout bounds the whole handshake
// ---------------------------------------------------------------------------

const SHORT: Duration = Duration::from_millis(400);

/// Writes `bytes` one at a time, every 150 ms, for at most 6 s, then stays
/// silent (connected) until `stop`.
fn trickle(mut s: &UnixStream, bytes: &[u8], stop: &AtomicBool) {
    let end = Instant::now() + Duration::from_secs(6);
    for b in bytes {
        if stop.load(Ordering::Acquire)
            || Instant::now() > end
            || s.write_all(std::slice::from_ref(b)).is_err()
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn trickling_client_is_cut_off_at_the_deadline() {
    let _g = serial();
    let cfg = HandshakeConfig::builder().timeout(SHORT).build().unwrap();
    let (l, ep, path) = bind("trickle", cfg);
    // A hello whose bytes would take minutes at this pace.
    let mut h = shm_hello(&[]);
    h.sections = vec![rrpc_core::Section {
        tag: 9,
        bytes: vec![7; 1000],
    }];
    let bytes = Message::Hello(h).encode().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let s = UnixStream::connect(&path).unwrap();
            trickle(&s, &bytes, &stop);
        })
    };
    let t = Instant::now();
    let e = l.accept().expect_err("a trickling client must time out");
    let took = t.elapsed();
    stop.store(true, Ordering::Release);
    client.join().unwrap();
    assert!(matches!(e, Error::Timeout), "{e}");
    // Generous bound: with a per-read timeout this takes minutes.
    assert!(took < Duration::from_secs(4), "handshake held for {took:?}");
    honest_connect(&l, &ep);
}

#[test]
fn trickling_server_is_cut_off_at_the_deadline() {
    let _g = serial();
    let path = sock_path("tricklesrv");
    let ls = UnixListener::bind(&path).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (s, _) = ls.accept().unwrap();
            let m = Message::Reject(rrpc_core::handshake::Reject {
                code: RejectCode::Busy,
                reason: "x".repeat(400),
            });
            trickle(&s, &m.encode().unwrap(), &stop);
        })
    };
    let fabric = Fabric::shm();
    let t = Instant::now();
    let r = conn::connect(
        &FabricAddr::Shm(path),
        fabric.create_qp(&QpConfig::default()).unwrap(),
        Offer::new(),
        &HandshakeConfig::builder().timeout(SHORT).build().unwrap(),
    );
    let took = t.elapsed();
    stop.store(true, Ordering::Release);
    server.join().unwrap();
    assert!(matches!(r, Err(Error::Timeout)), "{r:?}");
    assert!(took < Duration::from_secs(4), "connect held for {took:?}");
}

/// The peer holds the other end of our receive queue's doorbell (it writes
/// it to wake us). A peer that clears `O_NONBLOCK` on its end must not make
/// our `ack_events` block (the ends are two file descriptions, and we read
/// our end, whose `O_NONBLOCK` is ours alone).
#[test]
fn peer_clearing_nonblock_on_our_doorbell_never_blocks_ack_events() {
    let _g = serial();
    let path = sock_path("ourev");
    let ls = UnixListener::bind(&path).unwrap();
    let (got_fd, fd_rx) = std::sync::mpsc::channel::<OwnedFd>();
    let server = std::thread::spawn(move || {
        let (s, _) = ls.accept().unwrap();
        let mut buf = vec![0u8; 16384];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(18))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        rustix::net::recvmsg(
            &s,
            &mut iov,
            &mut control,
            rustix::net::RecvFlags::CMSG_CLOEXEC,
        )
        .unwrap();
        let mut fds: Vec<OwnedFd> = Vec::new();
        for c in control.drain() {
            if let rustix::net::RecvAncillaryMessage::ScmRights(received) = c {
                fds.extend(received);
            }
        }
        // The client's hello carries its receive queue and its doorbell last.
        got_fd.send(fds.pop().expect("client doorbell")).unwrap();
        let region = sealed(4096);
        let cq = sealed(CQ_LEN);
        let (ev, _bell_rx) = bell();
        let bytes = Message::Accept(shm_hello(&[4096])).encode().unwrap();
        send_with_fds(&s, &bytes, &[region.as_fd(), cq.as_fd(), ev.as_fd()]);
        let _ = (&s).read(&mut buf[..1]); // until the client hangs up
    });
    let fabric = Fabric::shm();
    let c = conn::connect(
        &FabricAddr::Shm(path),
        fabric.create_qp(&QpConfig::default()).unwrap(),
        Offer::new(),
        &HandshakeConfig::default(),
    )
    .expect("the hostile server's accept is well formed");
    let theirs = fd_rx.recv().unwrap();
    // The peer makes its end of our doorbell blocking; nothing is pending.
    fcntl(&theirs, FcntlArg::F_SETFL(OFlag::empty())).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let acker = std::thread::spawn(move || {
        let r = c.qp().recv_cq().ack_events();
        tx.send(r.map_err(|e| e.to_string())).unwrap();
        c
    });
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("ack_events blocked on a doorbell the peer made blocking");
    assert_eq!(r, Ok(0));
    drop(acker.join().unwrap());
    server.join().unwrap();
}

// ---------------------------------------------------------------------------
// One peer cannot lock the others out of a listener
// ---------------------------------------------------------------------------

/// Tells [`greedy_peer_child`] where to connect: `path|first grant`.
const GREEDY_ENV: &str = "RRPC_HOSTILE_GREEDY_PEER";

/// Reads one whole handshake message off `s` (descriptors that came with it
/// are dropped by the kernel: no control buffer).
fn read_one(mut s: &UnixStream) -> Option<Message> {
    use rrpc_core::handshake::{HEADER_LEN, Header};
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).ok()?;
    let h = Header::decode(&head).ok()?;
    let mut all = head.to_vec();
    all.resize(HEADER_LEN + h.body_len, 0);
    s.read_exact(&mut all[HEADER_LEN..]).ok()?;
    Message::decode(&all).ok().flatten().map(|(m, _)| m)
}

/// The greedy peer, a process of its own (the budget is per process): it
/// opens connections granting sparse sealed memfds of `first grant` bytes,
/// and when refused halves the grant, down to a page, so that it takes all
/// the listener will give it. It holds every accepted connection, prints
/// `greedy: accepted N BYTES` and `greedy: refusal REASON`, and waits for
/// its stdin to close.
#[test]
#[ignore = "the child process of one_peer_at_its_maximum_locks_no_one_out, which runs it"]
fn greedy_peer_child() {
    let Ok(spec) = std::env::var(GREEDY_ENV) else {
        return; // Run by hand: nothing to attack.
    };
    let (path, first) = spec.split_once('|').expect("path|grant");
    let mut len: u64 = first.parse().expect("grant");
    let (ev, _bell_rx) = bell();
    let cq = sealed(CQ_LEN);
    let (mut held, mut accepted) = (Vec::new(), 0u64);
    let refusal = loop {
        let region = sealed(len);
        let s = UnixStream::connect(path).unwrap();
        let bytes = Message::Hello(shm_hello(&[len])).encode().unwrap();
        send_with_fds(&s, &bytes, &[region.as_fd(), cq.as_fd(), ev.as_fd()]);
        match read_one(&s) {
            Some(Message::Accept(_)) => {
                accepted += len + CQ_LEN;
                held.push(s);
            }
            Some(Message::Reject(_)) if len > 4096 => len /= 2,
            Some(Message::Reject(r)) => break r.reason,
            other => panic!("greedy peer: unexpected answer {other:?}"),
        }
    };
    // libtest may print its "test ... " on the same line: each is tagged.
    println!("\ngreedy: accepted {} {accepted}", held.len());
    println!("greedy: refusal {refusal}");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
}

/// The greedy peer, with the default limits: 1 GiB grants at first (the
/// largest ring), as many as the listener takes, then smaller ones to fill
/// what is left. It gets its per-peer share (16 GiB), is refused past it
/// with a reason naming that limit, and honest clients of another process
/// keep connecting while it holds it. Before the per-peer budget, it took
/// the whole 64 GiB and every honest connect was refused ("bytes of peer
/// memory mapped by this listener ... exceeds the limit").
#[test]
fn one_peer_at_its_maximum_locks_no_one_out() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let _g = serial();
    let cfg = HandshakeConfig::default();
    let share = cfg.max_peer_grant_bytes();
    assert_eq!(share, conn::DEFAULT_MAX_PEER_GRANT_BYTES);
    assert!(share < cfg.max_total_grant_bytes());
    let (l, ep, path) = bind("greedy", cfg);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "greedy_peer_child", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(GREEDY_ENV, format!("{}|{}", path.display(), 1u64 << 30))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let child_key = conn::PeerKey::Process {
        uid: nix::unistd::getuid().as_raw(),
        pid: child.id() as i32,
    };
    // Read to its end after it is told to go (it writes libtest's summary).
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    // Serve the greedy peer until it says what it got.
    let done = AtomicBool::new(false);
    let (lines, held) = std::thread::scope(|sc| {
        let server = sc.spawn(|| {
            let fabric = Fabric::shm();
            let (mut held, mut refused) = (Vec::new(), 0usize);
            l.set_nonblocking(true).unwrap();
            let start = Instant::now();
            while !done.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(120) {
                match l.accept_pending() {
                    Ok(p) => match p.handshake().and_then(|inc| {
                        inc.accept(fabric.create_qp(&QpConfig::default())?, Offer::new())
                    }) {
                        Ok(c) => held.push(c),
                        Err(Error::LimitExceeded { .. }) => refused += 1,
                        Err(e) => panic!("greedy peer: unexpected server error {e}"),
                    },
                    Err(Error::WouldBlock) => std::thread::sleep(Duration::from_millis(2)),
                    Err(e) => panic!("accept: {e}"),
                }
            }
            l.set_nonblocking(false).unwrap();
            (held, refused)
        });
        let lines: Vec<String> = out
            .by_ref()
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| l.find("greedy: ").map(|at| l[at + 8..].to_owned()))
            .take(2)
            .collect();
        done.store(true, Ordering::Release);
        let (held, refused) = server.join().unwrap();
        assert!(refused > 0, "the greedy peer was never refused");
        (lines, held)
    });
    // Honest clients (this process) keep connecting, and hold connections
    // next to the greedy one.
    let (ev, _bell_rx) = bell();
    let cq = sealed(CQ_LEN);
    let mut honest = Vec::new();
    for _ in 0..4 {
        let region = sealed(1 << 30);
        honest.push(hand_made_hello_accepted(
            &l,
            &path,
            1 << 30,
            [&region, &cq, &ev],
        ));
    }
    assert_eq!(lines.len(), 2, "the greedy peer died: {lines:?}");
    let taken: u64 = lines[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        lines[1].contains("one peer") && lines[1].contains(&share.to_string()),
        "refused for the wrong reason: {lines:?}"
    );
    // It holds all of its share but a page's worth, and no more.
    assert!(
        taken <= share && taken + 4096 + CQ_LEN > share,
        "{taken} of {share}"
    );
    assert_eq!(l.peer_bytes_mapped_by(&child_key), taken);
    honest_connect(&l, &ep);
    drop(child.stdin.take());
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    assert!(
        child.wait().unwrap().success(),
        "the greedy peer failed: {rest}"
    );
    drop(held);
    assert_eq!(l.peer_bytes_mapped_by(&child_key), 0);
    drop(honest);
    assert_eq!(l.peer_bytes_mapped(), 0);
}
