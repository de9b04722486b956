//! Descriptors a client passes with its hello (`SCM_RIGHTS`) are closed on
//! the server when that handshake ends, however it ends: the client gone
//! at any point of its hello, the handshake timeout, a malformed or a
//! refused hello. Counted on the server's `/proc/self/fd`, so this file
//! holds one test (no other test's descriptors in the count).
//!
//! The hostile client is what a killed process leaves: its socket closes
//! with its hello (and the descriptors sent with it) partly delivered. Its
//! own copies of the descriptors are closed too, so the count comes back
//! to where it was only if the server let go of everything it received.

use std::io::{IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use rrpc_core::handshake::{Hello, Message};
use rrpc_core::{ProviderKind, RegionDesc, RemoteRegion};
use rrpc_integration_tests::pb::Input;
use rrpc_integration_tests::{Harness, Transport, config};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc").count()
}

/// What the process's descriptors are, for a failure's message.
fn fd_kinds() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc")
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    v.sort();
    v
}

fn sealed(len: u64) -> OwnedFd {
    let fd = memfd_create(
        c"hello-fds",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .expect("memfd");
    nix::unistd::ftruncate(&fd, len as i64).expect("ftruncate");
    fcntl(
        &fd,
        FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
    )
    .expect("seal");
    fd
}

/// A well-formed shm hello granting one 64 KiB region, with rrpc-tonic's
/// path hello; `section` replaces that section's bytes when given.
fn hello(token: Option<&[u8]>, section: Option<Vec<u8>>) -> Vec<u8> {
    const CQ_CAP: u64 = 4;
    let mut endpoint = (192 + CQ_CAP * 8).to_le_bytes().to_vec();
    endpoint.extend_from_slice(&CQ_CAP.to_le_bytes());
    Message::Hello(Hello {
        provider: ProviderKind::Shm.code(),
        endpoint,
        token: token.map(<[u8]>::to_vec),
        regions: vec![RegionDesc {
            role: 1,
            remote: RemoteRegion {
                addr: 0x1000_0000_0000,
                len: 64 << 10,
                rkey: 1,
            },
        }],
        sections: vec![rrpc_core::Section {
            tag: rrpc_tonic::frame::HANDSHAKE_SECTION,
            bytes: section.unwrap_or_else(|| rrpc_tonic::frame::path_hello(1, 64 << 10).to_vec()),
        }],
    })
    .encode()
    .expect("encode")
}

/// Connects, sends the first `cut` bytes of `bytes` with three descriptors
/// (a region, a receive queue, a doorbell pipe) on the first of them, and
/// returns the socket; every descriptor of ours is closed on return.
fn send_part(path: &Path, bytes: &[u8], cut: usize) -> UnixStream {
    let s = UnixStream::connect(path).expect("connect");
    let region = sealed(64 << 10);
    let cq = sealed(192 + 4 * 8);
    let (_ev_rx, ev) = nix::unistd::pipe().expect("doorbell");
    let raw: Vec<RawFd> = [region.as_fd(), cq.as_fd(), ev.as_fd()]
        .iter()
        .map(AsRawFd::as_raw_fd)
        .collect();
    let part = &bytes[..cut];
    let n = sendmsg::<()>(
        s.as_raw_fd(),
        &[IoSlice::new(part)],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .expect("sendmsg");
    // The rest of the part, if the kernel took less; the server may have
    // refused and closed already.
    let _ = (&s).write_all(&part[n..]);
    s
}

/// Waits until the server holds no more descriptors than `baseline`.
fn released_within(limit: Duration, baseline: usize) -> Result<(), usize> {
    let start = Instant::now();
    loop {
        let now = open_fds();
        if now <= baseline {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(now - baseline);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sock_path(h: &Harness) -> PathBuf {
    PathBuf::from(h.uri.strip_prefix("shm://").expect("shm uri"))
}

/// Every way a hello can end early, on a server whose handshake timeout
/// (30 s) is far beyond the wait: a client gone after 1, 12 (the header),
/// 20 bytes or one byte short of its hello must be let go of at once, as
/// must a malformed hello and one with a wrong token. Then, on a server
/// with a 300 ms timeout, a client that sends 20 bytes and stays is let go
/// of at the timeout. Before: the server's wait for the rest of a hello
/// peeked the socket again on every readiness, and a closed socket stays
/// ready for good (tokio never clears "read closed"), so a client gone
/// mid-hello left a server task spinning on a core; with one such task per
/// worker the runtime never parked, its timers never fired, and the socket
/// (with the descriptors sent on it) was never let go of: 2 descriptors and
/// a busy core per dead client, past any timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_of_an_unfinished_hello_are_closed() {
    const AT_ONCE: Duration = Duration::from_secs(3);
    let t = Transport::ShmFast;
    // Fixed-size rings: a self-sizing ring of the honest connection could
    // swap its region (and descriptors) in the middle of the count.
    let cfg = config(t)
        .to_builder()
        .min_ring_size(1 << 20)
        .handshake_timeout(Duration::from_secs(30))
        .token(b"secret".to_vec())
        .build()
        .expect("fixed rings");
    let h = Harness::start_with(t, cfg.clone()).await;
    let path = sock_path(&h);
    // Everything a connection and a call open lazily, opened once.
    let mut honest = {
        let ch = rrpc_tonic::RrpcChannel::connect(&h.uri, cfg.clone())
            .await
            .expect("honest connect");
        rrpc_integration_tests::pb::test_client::TestClient::new(ch)
    };
    honest.unary(Input::default()).await.expect("call");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let baseline = open_fds();

    let good = hello(Some(b"secret"), None);
    let cases: Vec<(&str, Vec<u8>, usize)> = vec![
        ("gone after 1 byte", good.clone(), 1),
        ("gone after the header", good.clone(), 12),
        ("gone after 20 bytes", good.clone(), 20),
        ("gone one byte short", good.clone(), good.len() - 1),
        (
            "malformed path hello",
            hello(Some(b"secret"), Some(vec![0xff; 3])),
            usize::MAX,
        ),
        ("wrong token", hello(Some(b"guess"), None), usize::MAX),
    ];
    let mut leaks = Vec::new();
    let first = baseline;
    let mut baseline = baseline;
    for (what, bytes, cut) in cases {
        let before = fd_kinds();
        let cut = cut.min(bytes.len());
        let s = tokio::task::block_in_place(|| send_part(&path, &bytes, cut));
        // The client is gone (as if killed) once its part is in.
        drop(s);
        let r = tokio::task::block_in_place(|| released_within(AT_ONCE, baseline));
        if let Err(n) = r {
            let mut now = fd_kinds();
            now.retain(|k| !before.contains(k));
            leaks.push(format!(
                "{what}: {n} descriptors still open after {AT_ONCE:?}: {now:?}"
            ));
            // Count the next case from here.
            baseline = open_fds();
        }
    }
    // Whatever was held is let go of by the handshake timeout at the latest.
    let late = tokio::task::block_in_place(|| released_within(Duration::from_secs(40), first));
    assert!(
        leaks.is_empty(),
        "{leaks:?} (by the 30 s timeout: {late:?})"
    );
    // The server still serves.
    honest.unary(Input::default()).await.expect("call after");
    drop(honest);
    drop(h);

    // A client that stays silent mid-hello is let go of at the timeout.
    let cfg = cfg
        .to_builder()
        .handshake_timeout(Duration::from_millis(300))
        .build()
        .expect("timeout");
    let h = Harness::start_with(t, cfg.clone()).await;
    let path = sock_path(&h);
    let mut honest = rrpc_integration_tests::pb::test_client::TestClient::new(
        rrpc_tonic::RrpcChannel::connect(&h.uri, cfg)
            .await
            .expect("honest connect"),
    );
    honest.unary(Input::default()).await.expect("call");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let baseline = open_fds();
    let s = tokio::task::block_in_place(|| send_part(&path, &good, 20));
    let ours = 1; // the silent client's own socket
    let r = tokio::task::block_in_place(|| released_within(AT_ONCE, baseline + ours));
    assert_eq!(
        r,
        Ok(()),
        "a silent client's descriptors outlived the timeout"
    );
    drop(s);
    honest.unary(Input::default()).await.expect("call after");
}
