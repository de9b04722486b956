//! Arbitrary bytes as `RB_R` content and as the pointer words a peer writes
//! (`local_tail` for the receiver, `local_head` for the sender): the state
//! machines must only ever return errors, never panic, index out of bounds
//! or loop forever. Half the rings size themselves, and a quarter of the
//! garbage headers are resize markers (any slot count).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rrpc_ringbuf::RingConfig;
use rrpc_ringbuf::proto::{FLAG_RESIZE, Receiver, Sender, pointer_check, stamp_for, tag_for};

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let slots = 2usize << (data[0] % 6); // 2..=64 slots
    let slot = 64usize << (data[1] % 2);
    let shrink = if data[1] & 2 != 0 { (data[1] >> 2) % 4 } else { 0 };
    let Ok(cfg) = RingConfig::builder()
        .slot_size(slot)
        .ring_size(slot * slots)
        .min_ring_size((slot * slots) >> shrink)
        .alpha(2)
        .beta(1)
        .gamma(2)
        .build()
    else {
        return;
    };
    let mut ring = vec![0u8; slot * slots];
    let mut rx = Receiver::new(&cfg);
    let mut tx = Sender::new(&cfg);
    let mut tx_ring = vec![0u8; slot * slots];
    let mut ops = data[2..].chunks_exact(10);
    for op in &mut ops {
        let word = u64::from_le_bytes(op[2..10].try_into().unwrap());
        match op[0] % 7 {
            0 => {
                // A bare pointer, or a record whose check is right when
                // op[1] >> 1 is zero.
                if op[1] & 1 == 0 {
                    let _ = rx.handle_local_tail(word);
                } else {
                    let _ = rx.handle_tail_record(word, pointer_check(word) ^ u64::from(op[1] >> 1));
                }
            }
            1 => {
                let off = (usize::from(op[1]) * 8) % ring.len();
                ring[off..off + 8].copy_from_slice(&word.to_le_bytes());
            }
            2 => {
                // Garbage header words get the right tag half of the time,
                // so the length checks are exercised too.
                let off = (usize::from(op[1]) * slot) % ring.len();
                let mut w = word;
                if op[1] & 1 == 0 {
                    let tag = tag_for(rx.head());
                    w = (w & 0x0000_ffff_ffff_ffff) | (u64::from(tag) << 48);
                    if op[1] & 2 == 0 {
                        // A resize marker naming any slot count.
                        w = (w & 0xffff_0000_ffff_ffff) | (u64::from(FLAG_RESIZE) << 32);
                    }
                }
                ring[off..off + 8].copy_from_slice(&w.to_le_bytes());
            }
            3 => match rx.poll_recv(|o| u64::from_le_bytes(ring[o..o + 8].try_into().unwrap())) {
                Ok(Some(m)) => {
                    let _ = &ring[m.offset()..m.offset() + m.len()];
                    rx.release(m);
                    let _ = rx.poll_transmit();
                }
                Ok(None) | Err(_) => {}
            },
            5 => {
                // A right end stamp for the head, somewhere.
                let off = (usize::from(op[1]) * 8) % ring.len();
                ring[off..off + 8].copy_from_slice(&stamp_for(rx.head()).to_le_bytes());
            }
            6 => {
                // The driver's placement timeout.
                if rx.unplaced().is_some() {
                    let _ = rx.placement_timed_out();
                }
            }
            _ => {
                if op[1] & 1 == 0 {
                    let _ = tx.handle_local_head(word);
                } else {
                    let _ = tx.handle_head_record(word, pointer_check(word) ^ u64::from(op[1] >> 1));
                }
                if let Ok(r) = tx.reserve(usize::from(op[1]), &mut tx_ring) {
                    tx.commit(r, usize::from(op[1]), &mut tx_ring);
                }
                if op[1] % 5 == 0 {
                    let _ = tx.resize(word % 130, &mut tx_ring);
                }
                while tx.poll_transmit().is_some() {}
            }
        }
        assert!(rx.head() <= rx.local_tail());
        assert!(rx.local_tail() - rx.head() <= slots as u64);
    }
});
