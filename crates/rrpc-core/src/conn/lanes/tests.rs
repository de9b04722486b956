//! Lanes in one process: a shared connection with lanes, its two ends
//! driven by hand (no runtime), to check what each end's lane reader does
//! to the lanes' liveness.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Wake, Waker};

use crate::conn::mux::{MuxLimits, MuxRole, Parts};
use crate::conn::{
    Connection, HandshakeConfig, LaneArenas, LaneEvent, Listener, Offer, SharedConnection, connect,
};
use crate::error::Error;
use crate::vqp::VqpConfig;
use crate::{Fabric, FabricAddr, QpConfig};

/// Slots, and the bytes of each: small rings are enough here.
const SLOTS: u32 = 2;
const SLOT: usize = 8192;

struct Count(AtomicUsize);
impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Both ends of a shared connection with lanes, on shm.
fn shared_pair() -> (Arc<SharedConnection>, Arc<SharedConnection>) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rrpc-core-lanes-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let ep = FabricAddr::Shm(dir.join("s.sock"));
    let listener = Listener::bind(&ep, HandshakeConfig::default()).unwrap();
    let fabric = Fabric::shm().without_huge_pages();
    let arenas = || LaneArenas::new(&fabric, SLOTS, SLOT, SLOT).unwrap();
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let ours = arenas();
            let offer = ours.add_to_offer(Offer::new()).unwrap();
            let c = listener
                .accept()
                .unwrap()
                .accept(fabric.create_qp(&QpConfig::default()).unwrap(), offer)
                .unwrap();
            SharedConnection::with_lanes(
                c,
                VqpConfig::default(),
                MuxRole::Server,
                ours,
                MuxLimits::default(),
            )
            .unwrap()
        });
        let ours = arenas();
        let offer = ours.add_to_offer(Offer::new()).unwrap();
        let c = connect(
            &ep,
            fabric.create_qp(&QpConfig::default()).unwrap(),
            offer,
            &HandshakeConfig::default(),
        )
        .unwrap();
        let client = SharedConnection::with_lanes(
            c,
            VqpConfig::default(),
            MuxRole::Client,
            ours,
            MuxLimits::default(),
        )
        .unwrap();
        (client, srv.join().unwrap())
    })
}

/// Polls `end` until it has events (its side channel is non-blocking).
fn events(end: &Arc<SharedConnection>) -> Vec<LaneEvent> {
    for _ in 0..10_000 {
        let ev = end.lane_poll().unwrap();
        if !ev.is_empty() {
            return ev;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("no lane event");
}

/// Lane `tag` between both ends: (client's, server's) connection.
fn lane(
    client: &Arc<SharedConnection>,
    server: &Arc<SharedConnection>,
    tag: u32,
) -> (Connection, Connection) {
    let mine = client.lane_slots(SLOT, SLOT).unwrap();
    let req = client
        .lane_open(
            tag,
            Parts {
                sections: vec![],
                slices: vec![(1, mine.slice)],
            },
        )
        .unwrap();
    let Some(LaneEvent::OpenRequested {
        req: r,
        tag: t,
        parts,
        ahead: None,
    }) = events(server).pop()
    else {
        panic!("no open");
    };
    let theirs = server.lane_slots(SLOT, SLOT).unwrap();
    let s = server
        .lane_accept(
            r,
            t,
            &parts,
            Parts {
                sections: vec![],
                slices: vec![(1, theirs.slice)],
            },
        )
        .unwrap();
    let Some(LaneEvent::Opened { req: got, conn }) = events(client).pop() else {
        panic!("not opened");
    };
    assert_eq!(got, req);
    (conn.unwrap(), s)
}

/// A lane has no side channel of its own; its watchers (a task that
/// polled) are woken when the peer closes it, and from then on it is gone
/// (`is_gone`, `check_alive`), its queue pair failed. The other lane is
/// untouched.
#[test]
fn a_lane_closed_by_its_peer_wakes_its_watchers() {
    let (client, server) = shared_pair();
    let (c1, s1) = lane(&client, &server, 1);
    let (_c2, s2) = lane(&client, &server, 2);
    assert!(s1.liveness_fd().is_none() && c1.liveness_fd().is_none());
    let (w1, w2) = (s1.liveness().unwrap(), s2.liveness().unwrap());
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    assert!(w1.poll_gone(&mut Context::from_waker(&waker)).is_pending());
    assert!(w2.poll_gone(&mut Context::from_waker(&waker)).is_pending());
    // The client closes lane 1: one message on the shared side channel.
    c1.close();
    let _ = events_or_none(&server);
    assert_eq!(count.0.load(Ordering::SeqCst), 1, "lane 1's watcher woken");
    assert!(w1.poll_gone(&mut Context::from_waker(&waker)).is_ready());
    assert!(s1.is_gone());
    assert!(matches!(s1.check_alive(), Err(Error::PeerGone)));
    assert!(s1.qp().failure().is_some());
    assert!(w2.poll_gone(&mut Context::from_waker(&waker)).is_pending());
    assert!(s2.check_alive().is_ok() && !s2.is_gone());
}

/// The shared side channel closing (the peer process gone) ends every
/// lane over it: their watchers are woken and they are gone.
#[test]
fn the_shared_side_channel_closing_ends_every_lane() {
    let (client, server) = shared_pair();
    let (_c1, s1) = lane(&client, &server, 1);
    let (_c2, s2) = lane(&client, &server, 2);
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let (w1, w2) = (s1.liveness().unwrap(), s2.liveness().unwrap());
    assert!(w1.poll_gone(&mut Context::from_waker(&waker)).is_pending());
    assert!(w2.poll_gone(&mut Context::from_waker(&waker)).is_pending());
    // As when the client's process dies: its side channel closes.
    client.connection().side.as_ref().unwrap().shutdown();
    let mut ended = false;
    for _ in 0..10_000 {
        if server.lane_poll().is_err() {
            ended = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(ended, "the lane reader saw the side channel close");
    assert_eq!(count.0.load(Ordering::SeqCst), 2, "both watchers woken");
    assert!(s1.is_gone() && s2.is_gone());
    assert!(s1.check_alive().is_err() && s2.check_alive().is_err());
}

/// Polls `end` until its side channel has nothing more (a close's answer
/// is sent from inside the poll, which returns no event for it).
fn events_or_none(end: &Arc<SharedConnection>) -> Vec<LaneEvent> {
    let mut all = Vec::new();
    for _ in 0..50 {
        all.extend(end.lane_poll().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    all
}

/// Grants `n` of the server's slots ahead to the client (as rrpc-tonic
/// does after an accept), and waits until the client has them.
fn credit(client: &Arc<SharedConnection>, server: &Arc<SharedConnection>, n: u16) {
    let slices = (0..n)
        .map(|i| (i, server.lane_slots(SLOT, SLOT).unwrap().slice))
        .collect();
    server
        .lane_credit(Parts {
            sections: vec![(9, b"answer".to_vec())],
            slices,
        })
        .unwrap();
    let _ = events_or_none(client);
    assert_eq!(client.lane_ahead_left(), usize::from(n));
    assert_eq!(server.lane_credited(), usize::from(n));
}

/// A lane opened ahead is open at the client before the server has read
/// its open: its peer is the slot granted ahead and the sections granted
/// with it. The server builds its end over the same slot and confirms.
/// Closing it gives every slot back at both ends.
#[test]
fn a_lane_opened_ahead_writes_into_the_slot_granted_ahead() {
    let (client, server) = shared_pair();
    let (free_c, free_s) = (client.lane_free_slots(), server.lane_free_slots());
    credit(&client, &server, 2);
    let mine = client.lane_slots(SLOT, SLOT).unwrap();
    let (req, c) = client
        .lane_open_ahead(
            5,
            Parts {
                sections: vec![],
                slices: vec![(1, mine.slice)],
            },
            1,
            |_| true,
        )
        .unwrap()
        .expect("a slot in hand");
    assert_eq!(client.lane_ahead_left(), 1);
    assert_eq!(c.peer().section(9), Some(&b"answer"[..]));
    let theirs = c.peer().region(1).expect("the server's slot");
    assert!(c.check_alive().is_ok());
    let Some(LaneEvent::OpenRequested {
        req: r,
        tag: 5,
        parts,
        ahead: Some(slot),
    }) = events(&server).pop()
    else {
        panic!("no open ahead");
    };
    assert_eq!(r, req);
    assert_eq!(server.lane_credited(), 1);
    assert_eq!(theirs.len, slot.len);
    let s = server.lane_accept(r, 5, &parts, Parts::default()).unwrap();
    assert_eq!(
        s.peer().region(1).unwrap().len,
        mine.slice.len,
        "the server writes into the client's slot"
    );
    // The confirmation hands out nothing: the connection was made already.
    assert!(events_or_none(&client).is_empty());
    drop(c);
    let _ = events_or_none(&server);
    let _ = events_or_none(&client);
    drop(s);
    assert_eq!(client.lane_free_slots(), free_c);
    // The slot granted ahead and not opened is still the client's.
    assert_eq!(server.lane_free_slots(), free_s - 1);
    assert_eq!(client.lanes_open() + server.lanes_open(), 0);
}

/// A server that will not serve a lane opened ahead (its listener gone,
/// a limit of the layer above) closes it: the client's lane is gone (its
/// watchers woken), and the slots come back at both ends once the close
/// is answered.
#[test]
fn a_lane_opened_ahead_and_refused_is_closed() {
    let (client, server) = shared_pair();
    let (free_c, free_s) = (client.lane_free_slots(), server.lane_free_slots());
    credit(&client, &server, 1);
    let mine = client.lane_slots(SLOT, SLOT).unwrap();
    let (_, c) = client
        .lane_open_ahead(
            6,
            Parts {
                sections: vec![],
                slices: vec![(1, mine.slice)],
            },
            1,
            |_| true,
        )
        .unwrap()
        .expect("a slot in hand");
    let w = c.liveness().unwrap();
    let Some(LaneEvent::OpenRequested { req, .. }) = events(&server).pop() else {
        panic!("no open ahead");
    };
    server.lane_refuse(req, "no room").unwrap();
    let _ = events_or_none(&client);
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    assert!(w.poll_gone(&mut Context::from_waker(&waker)).is_ready());
    assert!(c.is_gone());
    let why = c.qp().failure().expect("its queue pair failed");
    assert!(why.to_string().contains("no room"), "{why}");
    let _ = events_or_none(&server);
    drop(c);
    assert_eq!(client.lane_free_slots(), free_c);
    assert_eq!(server.lane_free_slots(), free_s);
    assert_eq!(client.lanes_open() + server.lanes_open(), 0);
    // Without a slot in hand, no open ahead.
    let mine = client.lane_slots(SLOT, SLOT).unwrap();
    let none = client
        .lane_open_ahead(
            7,
            Parts {
                sections: vec![],
                slices: vec![(1, mine.slice)],
            },
            1,
            |_| true,
        )
        .unwrap();
    assert!(none.is_none());
}
