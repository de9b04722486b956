//! The ring switches both sides must share travel in the handshake; a
//! mismatch is refused at connect time with `Error::Incompatible` naming
//! both values, instead of surfacing later as `Error::Corrupt`.

use crate::common;

use common::{Provider, pair_with};
use rrpc_core::QpConfig;
use rrpc_ringbuf::{Error, RingConfig};

fn incompatible(a: &RingConfig, b: &RingConfig) -> (String, String) {
    let (c, s) = pair_with(&Provider::Shm, a, b, &QpConfig::default());
    let msg = |r: Result<common::Side, Error>| match r {
        Err(Error::Incompatible(m)) => m,
        Err(e) => panic!("expected Incompatible, got {e}"),
        Ok(_) => panic!("mismatched rings connected"),
    };
    (msg(c), msg(s))
}

#[test]
fn cache_align_mismatch_is_refused_on_both_sides() {
    let on = RingConfig::builder().ring_size(64 << 10).build().unwrap();
    let off = RingConfig::builder()
        .ring_size(64 << 10)
        .cache_align(false)
        .build()
        .unwrap();
    let (c, s) = incompatible(&on, &off);
    assert!(
        c.contains("peer ring has cache_align = false") && c.contains("ours cache_align = true"),
        "{c}"
    );
    assert!(
        s.contains("peer ring has cache_align = true") && s.contains("ours cache_align = false"),
        "{s}"
    );
}

#[test]
fn tail_with_imm_mismatch_is_refused_on_both_sides() {
    let plain = RingConfig::builder().ring_size(64 << 10).build().unwrap();
    let imm = RingConfig::builder()
        .ring_size(64 << 10)
        .tail_with_imm(true)
        .build()
        .unwrap();
    let (c, s) = incompatible(&imm, &plain);
    assert!(
        c.contains("tail_with_imm = false") && c.contains("ours tail_with_imm = true"),
        "{c}"
    );
    assert!(s.contains("peer ring has tail_with_imm = true"), "{s}");
}

#[test]
fn slot_geometry_mismatch_is_refused() {
    let a = RingConfig::builder().ring_size(64 << 10).build().unwrap();
    let b = RingConfig::builder()
        .ring_size(64 << 10)
        .slot_size(128)
        .build()
        .unwrap();
    let (c, _) = incompatible(&a, &b);
    assert!(
        c.contains("512 slots of 128 bytes") && c.contains("1024 slots of 64 bytes"),
        "{c}"
    );
    let b = RingConfig::builder().ring_size(128 << 10).build().unwrap();
    let (c, _) = incompatible(&a, &b);
    assert!(
        c.contains("2048 slots") && c.contains("ours 1024 slots"),
        "{c}"
    );
}

#[test]
fn matching_non_default_switches_connect_and_carry_data() {
    // Thresholds may differ (they only pace each side's own WRITEs); the
    // switches match: unaligned array, tail with immediate.
    let base = || {
        RingConfig::builder()
            .ring_size(64 << 10)
            .slot_size(32)
            .cache_align(false)
            .tail_with_imm(true)
    };
    let a = base().alpha(4).beta(2).build().unwrap();
    let b = base().gamma(3).build().unwrap();
    let (c, s) = pair_with(&Provider::Shm, &a, &b, &QpConfig::default());
    let ((_c1, mut tx, _r1), (_c2, _t2, mut rx)) = (c.unwrap(), s.unwrap());
    rx.post_receives(64).unwrap();
    for i in 0..40u8 {
        tx.try_send(&[i; 13]).unwrap();
    }
    tx.flush().unwrap();
    for i in 0..40u8 {
        let m = rx.try_recv().unwrap();
        assert_eq!(&*m, &[i; 13]);
    }
    assert!(matches!(rx.try_recv(), Err(Error::WouldBlock)));
}

/// A queue pair whose send queue is shallower than the ring's send-queue
/// need (sender half + receiver quarter of `sq_depth`) is refused at
/// connect time, naming both values, instead of failing later with
/// `QueueFull` under load.
#[test]
fn shallow_send_queue_is_refused_naming_both_values() {
    let cfg = RingConfig::builder().ring_size(64 << 10).build().unwrap();
    assert_eq!(cfg.send_queue_need(), 1024 / 2 + 1024 / 4 + 2);
    let shallow = QpConfig::builder().send_depth(512).build().unwrap();
    let (c, _) = pair_with(&Provider::Shm, &cfg, &cfg, &shallow);
    match c {
        Err(Error::InvalidConfig(m)) => assert!(
            m.contains("needs 770 send-queue slots") && m.contains("send depth is 512"),
            "{m}"
        ),
        Err(e) => panic!("expected InvalidConfig, got {e}"),
        Ok(_) => panic!("a ring connected over a send queue it can overflow"),
    }
    let enough = QpConfig::builder().send_depth(770).build().unwrap();
    let (c, s) = pair_with(&Provider::Shm, &cfg, &cfg, &enough);
    assert!(c.is_ok() && s.is_ok());
}

/// The ring's parameters are peer-written bytes in the handshake (a
/// section under the ring's role): a peer that sends none, or ones this
/// build cannot read, is refused with a reason, never misread.
#[test]
fn missing_or_unreadable_ring_parameters_are_refused() {
    use rrpc_core::conn::{self, HandshakeConfig, Offer};
    use rrpc_ringbuf::ROLE_RING;

    let fabric = Provider::Shm.fabric();
    let cfg = RingConfig::builder().ring_size(64 << 10).build().unwrap();
    let mut bad_flags = rrpc_ringbuf::RingParams::of(&cfg).encode();
    bad_flags[4] = 0x40;
    let cases: [(Option<Vec<u8>>, &str); 3] = [
        (None, "sent no ring parameters under role 0x5242"),
        (Some(vec![9; 26]), "version 9"),
        (Some(bad_flags), "unknown flags 0x40000000"),
    ];
    for (section, why) in cases {
        let (dir, listener, ep) = common::listen(&fabric);
        let srv = common::serve_one(listener, &fabric, &cfg, &QpConfig::default());
        let region = fabric
            .alloc_region_with(128 << 10, rrpc_core::Access::REMOTE_WRITE)
            .unwrap();
        let mut offer = Offer::new().grant(ROLE_RING, region);
        if let Some(bytes) = section {
            offer = offer.section(ROLE_RING, bytes);
        }
        let _c = conn::connect(
            &ep,
            fabric.create_qp(&QpConfig::default()).unwrap(),
            offer,
            &HandshakeConfig::default(),
        )
        .unwrap();
        match srv.join().unwrap().map(|_| ()) {
            Err(Error::Incompatible(m)) => assert!(m.contains(why), "{why}: {m}"),
            other => panic!("{why}: {other:?}"),
        }
        if let Some(dir) = dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
