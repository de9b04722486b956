//! Deterministic pair harness (quinn-style) and property tests for the
//! sans-IO core: an in-memory "fabric" applies WRITEs in RC order when told,
//! and hands completions back late and out of order.

use std::collections::VecDeque;

use proptest::prelude::*;

use super::*;
use crate::config::RingConfig;
use crate::error::Error;

#[derive(Debug, Clone, Copy)]
enum Op {
    Slots {
        offset: usize,
        len: usize,
        wr_id: u64,
        signaled: bool,
    },
    Tail {
        src: usize,
        wr_id: u64,
    },
    Head {
        value: u64,
        wr_id: u64,
        signaled: bool,
    },
}

/// Two endpoints joined by an in-memory fabric.
struct Pair {
    geo: Geometry,
    tx: Sender,
    rx: Receiver,
    rb_s: Vec<u8>,
    rb_r: Vec<u8>,
    tail_src: [u64; MAX_TAIL_INFLIGHT],
    local_tail_word: u64,
    /// The tail as applied in RC order (`local_tail_word` may run ahead of
    /// it when a test places a tail before the slots it covers).
    ordered_tail: u64,
    local_head_word: u64,
    s2r: VecDeque<Op>,
    r2s: VecDeque<Op>,
    tx_cq: Vec<u64>,
    rx_cq: Vec<u64>,
    /// Lengths of committed messages, by message number.
    committed: Vec<usize>,
    received: usize,
    /// The sender's geometries, each from the slot pointer it starts at.
    geos: Vec<(u64, Geometry)>,
    /// Virtual clock of the sizing policy.
    t0: std::time::Instant,
    now_ms: u64,
}

fn payload_byte(msg: usize, i: usize) -> u8 {
    (msg.wrapping_mul(131) ^ i.wrapping_mul(7)) as u8
}

impl Pair {
    fn new(cfg: &RingConfig) -> Self {
        let geo = Geometry::from_config(cfg);
        Pair {
            geo,
            tx: Sender::new(cfg),
            rx: Receiver::new(cfg),
            rb_s: vec![0; geo.ring_bytes()],
            rb_r: vec![0; geo.ring_bytes()],
            tail_src: [0; MAX_TAIL_INFLIGHT],
            local_tail_word: 0,
            ordered_tail: 0,
            local_head_word: 0,
            s2r: VecDeque::new(),
            r2s: VecDeque::new(),
            tx_cq: Vec::new(),
            rx_cq: Vec::new(),
            committed: Vec::new(),
            received: 0,
            geos: vec![(0, Geometry::new(cfg.slot_size(), cfg.initial_slot_count()))],
            t0: std::time::Instant::now(),
            now_ms: 0,
        }
    }

    /// Records a geometry switch the sender just made.
    fn note_geometry(&mut self) {
        let g = self.tx.geometry();
        if self.geos.last().is_some_and(|&(_, last)| last != g) {
            let at = self
                .tx
                .switch_pending()
                .expect("a new geometry waits for its marker");
            self.geos.push((at, g));
        }
    }

    /// The geometry of the slot at absolute pointer `pos`.
    fn geo_at(&self, pos: u64) -> Geometry {
        self.geos
            .iter()
            .rev()
            .find(|&&(start, _)| start <= pos)
            .expect("the first geometry starts at 0")
            .1
    }

    /// The sender applies the head word; a shrink it completes releases
    /// the end of `RB_S` (zeroed here, as a hole punched in the memfd reads).
    fn sender_sees_head(&mut self) -> Result<(), Error> {
        self.tx.handle_local_head(self.local_head_word)?;
        if let Some(keep) = self.tx.take_released() {
            self.rb_s[keep..].fill(0);
        }
        Ok(())
    }

    /// Asks for a resize to `count` slots.
    fn resize(&mut self, count: u64) {
        match self.tx.resize(count, &mut self.rb_s) {
            Ok(_) | Err(Error::WouldBlock) => {}
            Err(e) => panic!("resize to {count}: {e}"),
        }
        self.note_geometry();
        self.post();
    }

    /// Advances the virtual clock and runs the sizing policy.
    fn tick(&mut self, ms: u64) {
        self.now_ms += ms;
        let now = self.t0 + std::time::Duration::from_millis(self.now_ms);
        self.tx.maintain(now, &mut self.rb_s).expect("maintain");
        self.note_geometry();
        self.post();
    }

    /// Posts everything both state machines hand out.
    fn post(&mut self) {
        while let Some(t) = self.tx.poll_transmit() {
            match t {
                Transmit::Slots {
                    offset,
                    len,
                    wr_id,
                    signaled,
                } => self.s2r.push_back(Op::Slots {
                    offset,
                    len,
                    wr_id,
                    signaled,
                }),
                Transmit::Tail { value, src, wr_id } => {
                    self.tail_src[src] = value;
                    self.s2r.push_back(Op::Tail { src, wr_id });
                }
            }
        }
        while let Some(p) = self.rx.poll_transmit() {
            self.r2s.push_back(Op::Head {
                value: p.value,
                wr_id: p.wr_id,
                signaled: p.signaled,
            });
        }
    }

    /// Writes one message of `len` bytes; `commit = false` abandons it.
    fn write(&mut self, len: usize, commit: bool) -> Result<(), Error> {
        // The driver reloads the head word before reserving.
        self.sender_sees_head()?;
        let r = self.tx.reserve(len, &mut self.rb_s);
        self.note_geometry();
        let res = match r {
            Ok(res) => res,
            Err(Error::TooLarge { len: l, max }) => {
                assert_eq!(l, len);
                assert!(
                    max == self.geo.max_payload()
                        || (self.tx.geometry() != self.geo
                            && max == self.tx.geometry().max_payload()),
                    "TooLarge names {max}"
                );
                assert!(len > max);
                return Ok(());
            }
            Err(e) => {
                self.post();
                return Err(e);
            }
        };
        assert!(len <= self.geo.max_payload());
        assert_eq!(res.capacity(), len);
        if commit {
            let n = self.committed.len();
            for i in 0..len {
                self.rb_s[res.offset() + i] = payload_byte(n, i);
            }
            self.tx.commit(res, len, &mut self.rb_s);
            self.committed.push(len);
            // Below the minimum a commit writes the marker that grows the ring.
            self.note_geometry();
        }
        self.post();
        Ok(())
    }

    /// Reads (and verifies) one message; `Ok(false)` if empty.
    fn read(&mut self) -> Result<bool, Error> {
        self.rx.handle_local_tail(self.local_tail_word)?;
        let rb_r = &self.rb_r;
        let got = self
            .rx
            .poll_recv(|off| u64::from_le_bytes(rb_r[off..off + 8].try_into().unwrap()))?;
        if let Some(keep) = self.rx.take_shrunk() {
            self.rb_r[keep..].fill(0);
        }
        let Some(msg) = got else {
            self.post();
            return Ok(false);
        };
        let n = self.received;
        assert!(
            n < self.committed.len(),
            "received a message never committed"
        );
        assert_eq!(
            msg.len(),
            self.committed[n],
            "message {n} has the wrong length"
        );
        let data = &self.rb_r[msg.offset()..msg.offset() + msg.len()];
        for (i, b) in data.iter().enumerate() {
            assert_eq!(*b, payload_byte(n, i), "message {n} byte {i} corrupted");
        }
        self.rx.release(msg);
        self.received += 1;
        self.post();
        Ok(true)
    }

    fn apply_s2r(&mut self) {
        let Some(op) = self.s2r.pop_front() else {
            return;
        };
        match op {
            Op::Slots {
                offset,
                len,
                wr_id,
                signaled,
            } => {
                // No unread slot may be overwritten (each in the geometry
                // it was written in).
                let mut p = self.rx.head();
                while p < self.ordered_tail {
                    let g = self.geo_at(p);
                    let at = g.offset(p);
                    assert!(
                        at + g.slot_size() <= offset || offset + len <= at,
                        "slot write of bytes {offset}..{} overwrites unread slot {p} \
                         (bytes {at}.., N={})",
                        offset + len,
                        g.slot_count()
                    );
                    p += 1;
                }
                self.rb_r[offset..offset + len].copy_from_slice(&self.rb_s[offset..offset + len]);
                if signaled {
                    self.tx_cq.push(wr_id);
                }
            }
            Op::Tail { src, wr_id } => {
                let v = self.tail_src[src];
                assert!(v >= self.ordered_tail, "tail went backwards");
                self.ordered_tail = v;
                self.local_tail_word = self.local_tail_word.max(v);
                self.tx_cq.push(wr_id);
            }
            Op::Head { .. } => unreachable!(),
        }
    }

    /// A responder that reorders placement: the next tail WRITE becomes
    /// visible before the slot WRITEs queued ahead of it, of which the first
    /// has placed only its first `prefix` bytes (in address order). They
    /// stay queued and are placed later, in order; the tail WRITE is then
    /// applied again as a no-op and completes.
    fn tail_first(&mut self, prefix: usize) {
        let Some(v) = self.s2r.iter().find_map(|op| match *op {
            Op::Tail { src, .. } => Some(self.tail_src[src]),
            _ => None,
        }) else {
            return;
        };
        self.local_tail_word = self.local_tail_word.max(v);
        if let Some(&Op::Slots { offset, len, .. }) = self.s2r.front() {
            let n = prefix % (len + 1);
            self.rb_r[offset..offset + n].copy_from_slice(&self.rb_s[offset..offset + n]);
        }
    }

    fn apply_r2s(&mut self) {
        if let Some(Op::Head {
            value,
            wr_id,
            signaled,
        }) = self.r2s.pop_front()
        {
            self.local_head_word = value;
            if signaled {
                self.rx_cq.push(wr_id);
            }
        }
    }

    fn complete_tx(&mut self, pick: usize) {
        if !self.tx_cq.is_empty() {
            let wr = self.tx_cq.swap_remove(pick % self.tx_cq.len());
            self.tx.handle_completion(wr);
            self.post();
        }
    }

    fn complete_rx(&mut self, pick: usize) {
        if !self.rx_cq.is_empty() {
            let wr = self.rx_cq.swap_remove(pick % self.rx_cq.len());
            self.rx.handle_completion(wr);
            self.post();
        }
    }

    fn check_invariants(&self) {
        let n = self.geo.slot_count();
        let g = self.tx.geometry();
        assert!(
            self.tx.switch_pending().is_some()
                || self.tx.tail() - self.tx.local_head() <= g.slot_count(),
            "sender overran its current geometry"
        );
        let t = &self.tx;
        assert!(
            t.local_head() <= t.synced_tail(),
            "local_head > synced_tail"
        );
        assert!(t.synced_tail() <= t.esc_tail(), "synced_tail > esc_tail");
        assert!(t.esc_tail() <= t.tail(), "esc_tail > tail");
        assert!(t.tail() - t.local_head() <= n, "sender overran the ring");
        let r = &self.rx;
        assert!(r.synced_head() <= r.head() && r.head() <= r.local_tail());
        assert!(r.local_tail() - r.head() <= n);
        assert!(r.local_tail() <= t.synced_tail());
        assert!(t.local_head() <= r.head());
        assert!(t.tails_in_flight() <= MAX_TAIL_INFLIGHT);
    }

    /// Flushes and runs the fabric until idle; every committed message must
    /// then have been received. Bounded to catch livelock.
    fn drain(&mut self) {
        for _ in 0..10_000 {
            self.tx.flush();
            self.post();
            while !self.s2r.is_empty() {
                self.apply_s2r();
            }
            while !self.tx_cq.is_empty() {
                self.complete_tx(0);
            }
            while self.read().expect("read during drain") {}
            assert!(
                !self.s2r.is_empty() || self.rx.unplaced().is_none(),
                "a placed message is not read: {:?}",
                self.rx.unplaced()
            );
            while !self.r2s.is_empty() {
                self.apply_r2s();
            }
            while !self.rx_cq.is_empty() {
                self.complete_rx(0);
            }
            self.sender_sees_head().unwrap();
            self.check_invariants();
            if self.received == self.committed.len()
                && self.tx.is_flushed()
                && self.s2r.is_empty()
                && self.r2s.is_empty()
                && self.tx.local_head() == self.tx.tail()
            {
                return;
            }
        }
        panic!(
            "no progress: {} of {} received, sender {:?}",
            self.received,
            self.committed.len(),
            self.tx
        );
    }
}

fn cfg(slot: usize, slots: usize, alpha: u32, beta: u32, gamma: u32, elastic: bool) -> RingConfig {
    RingConfig::builder()
        .slot_size(slot)
        .ring_size(slot * slots)
        .alpha(alpha)
        .beta(beta)
        .gamma(gamma)
        .elastic(elastic)
        .sq_depth(16)
        .build()
        .unwrap()
}

#[derive(Debug, Clone)]
enum Action {
    Write(usize),
    Abandon(usize),
    Read,
    Flush,
    ApplyS2r,
    ApplyR2s,
    CompleteTx(usize),
    CompleteRx(usize),
    /// The responder shows the next tail before the slots it covers (the
    /// first slot WRITE placed up to this many bytes).
    TailFirst(usize),
    /// Resize the ring to `max >> k` slots (`k` wrapped to the valid range).
    Resize(u32),
    /// Advance the virtual clock by this many ms and run the sizing policy.
    Tick(u64),
}

fn action(max: usize) -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (0..=max + 8).prop_map(Action::Write),
        1 => (0..=max).prop_map(Action::Abandon),
        4 => Just(Action::Read),
        1 => Just(Action::Flush),
        4 => Just(Action::ApplyS2r),
        2 => Just(Action::ApplyR2s),
        2 => any::<usize>().prop_map(Action::CompleteTx),
        1 => any::<usize>().prop_map(Action::CompleteRx),
        2 => any::<usize>().prop_map(Action::TailFirst),
        1 => (0u32..8).prop_map(Action::Resize),
        1 => (0u64..1500).prop_map(Action::Tick),
    ]
}

fn config_strategy() -> impl Strategy<Value = RingConfig> {
    (
        prop_oneof![Just(64usize), Just(128)],
        prop_oneof![Just(2usize), Just(4), Just(8), Just(16), Just(64)],
        1u32..40,
        1u32..40,
        1u32..40,
        any::<bool>(),
        0u32..4,
        0u32..3,
    )
        .prop_map(|(slot, slots, a, b, g, elastic, shrink, idle)| {
            let (a, b) = (a.max(b), a.min(b));
            let c = cfg(slot, slots, a, b, g, elastic);
            // A self-sizing ring in most cases, starting `2^shrink` times smaller,
            // and shrinking to `2^idle` times less than that when quiet.
            let min = (c.ring_size() >> shrink).max(2 * slot);
            RingConfig::builder()
                .slot_size(slot)
                .ring_size(c.ring_size())
                .min_ring_size(min)
                .idle_ring_size((min >> idle).max(2 * slot))
                .alpha(a)
                .beta(b)
                .gamma(g)
                .elastic(elastic)
                .sq_depth(16)
                .build()
                .unwrap()
        })
}

/// Actions per case; far fewer under miri, which runs ~1000x slower.
const MAX_ACTIONS: usize = if cfg!(miri) { 40 } else { 300 };

fn run(cfg: &RingConfig, actions: &[Action]) {
    let mut p = Pair::new(cfg);
    for a in actions {
        match *a {
            Action::Write(len) => match p.write(len, true) {
                Ok(()) | Err(Error::WouldBlock) => {}
                Err(e) => panic!("write: {e}"),
            },
            Action::Abandon(len) => match p.write(len, false) {
                Ok(()) | Err(Error::WouldBlock) => {}
                Err(e) => panic!("abandon: {e}"),
            },
            Action::Read => {
                p.read().expect("read");
            }
            Action::Flush => {
                p.tx.flush();
                p.post();
            }
            Action::ApplyS2r => p.apply_s2r(),
            Action::ApplyR2s => p.apply_r2s(),
            Action::CompleteTx(i) => p.complete_tx(i),
            Action::CompleteRx(i) => p.complete_rx(i),
            Action::TailFirst(n) => p.tail_first(n),
            Action::Resize(k) => {
                let max = p.geo.slot_count();
                let k = k % (max.trailing_zeros()).max(1);
                p.resize((max >> k).max(2));
            }
            Action::Tick(ms) => p.tick(ms),
        }
        p.check_invariants();
    }
    p.drain();
    assert_eq!(p.received, p.committed.len());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]

    /// FIFO, nothing lost or duplicated, no unread slot overwritten, pointer
    /// invariants, and no deadlock after a flush, under arbitrary
    /// interleavings, late and reordered completions, and tails placed
    /// before the slots they cover (never a wrong message, never an error).
    #[test]
    fn random_interleavings((cfg, actions) in config_strategy().prop_flat_map(|c| {
        let max = c.max_message().min(600);
        (Just(c), prop::collection::vec(action(max), 0..MAX_ACTIONS))
    })) {
        run(&cfg, &actions);
    }
}

#[test]
fn paper_example_thresholds() {
    // RB² Fig. 4 setting: N = 8, alpha = 4, beta = 2, gamma = 2.
    let c = cfg(64, 8, 4, 2, 2, true);
    let mut p = Pair::new(&c);
    p.write(10, true).unwrap();
    assert!(p.s2r.is_empty(), "one message is batched");
    p.write(10, true).unwrap();
    assert!(
        matches!(
            p.s2r.as_slices().0,
            [Op::Slots {
                offset: 0,
                len: 128,
                ..
            }]
        ),
        "beta = 2: slot transmission ahead of the tail"
    );
    p.write(10, true).unwrap();
    p.write(10, true).unwrap();
    assert_eq!(p.s2r.len(), 3, "alpha = 4: slots then tail");
    assert!(matches!(p.s2r[2], Op::Tail { .. }));
    while !p.s2r.is_empty() {
        p.apply_s2r();
    }
    assert_eq!(p.local_tail_word, 4);
    assert!(p.read().unwrap());
    assert!(p.r2s.is_empty());
    assert!(p.read().unwrap());
    assert_eq!(p.r2s.len(), 1, "gamma = 2: lazy push after two reads");
    assert!(p.read().unwrap());
    assert!(p.read().unwrap());
    assert!(!p.read().unwrap());
    assert_eq!(p.r2s.len(), 2);
}

#[test]
fn elastic_threshold_defers_then_sends_on_completion() {
    let c = cfg(64, 64, 2, 1, 1, true);
    let mut p = Pair::new(&c);
    for _ in 0..2 {
        p.write(1, true).unwrap();
    }
    assert_eq!(p.tx.tails_in_flight(), 1);
    for _ in 0..4 {
        p.write(1, true).unwrap();
    }
    assert!(
        p.tx.tail_deferred(),
        "second advancement deferred while the first is in flight"
    );
    assert_eq!(p.tx.stats().tail_writes, 1);
    while !p.s2r.is_empty() {
        p.apply_s2r();
    }
    assert!(p.tx.wants_completions());
    p.complete_tx(0);
    assert!(!p.tx.tail_deferred());
    assert_eq!(p.tx.stats().tail_writes, 2);
    p.drain();

    // Without the elastic threshold every alpha messages write the tail.
    let c = cfg(64, 64, 2, 1, 1, false);
    let mut p = Pair::new(&c);
    for _ in 0..6 {
        p.write(1, true).unwrap();
    }
    assert_eq!(p.tx.stats().tail_writes, 3);
    assert_eq!(p.tx.stats().deferrals, 0);
    p.drain();
}

#[test]
fn wrap_places_gap_and_never_splits() {
    let c = cfg(64, 8, 1, 1, 1, true);
    let mut p = Pair::new(&c);
    // 3 slots each: 0..3, 3..6, then gap 6..8 and message at 0..3.
    for _ in 0..2 {
        p.write(150, true).unwrap();
    }
    p.drain();
    p.write(150, true).unwrap();
    assert_eq!(p.tx.tail(), 8 + 3);
    p.drain();
    assert_eq!(p.received, 3);
}

#[test]
fn full_ring_blocks_then_drain_push_unblocks() {
    let c = cfg(64, 8, 32, 16, 32, true);
    let mut p = Pair::new(&c);
    let mut n = 0;
    // 40 bytes + header + end stamp: one 64-byte slot each.
    while p.write(40, true).is_ok() {
        n += 1;
    }
    assert_eq!(n, 8);
    // WouldBlock flushed the batch; the receiver drains and pushes on empty
    // even though gamma = 32 was not reached.
    while !p.s2r.is_empty() {
        p.apply_s2r();
    }
    while p.read().unwrap() {}
    assert_eq!(p.r2s.len(), 1, "drained receiver pushes its head");
    p.apply_r2s();
    // The receiver read every slot, but their WRITEs have not completed: a
    // NIC may still read (retransmit) their bytes, so they are not reused
    // yet, and the sender says that completions, not the head, give room.
    assert!(p.write(40, true).is_err(), "slots reused before completion");
    assert!(p.tx.awaits_completions() && p.tx.wants_completions());
    while !p.tx_cq.is_empty() {
        p.complete_tx(0);
    }
    assert!(!p.tx.awaits_completions());
    p.write(40, true).unwrap();
}

/// On a fabric that reads a WRITE's source inside its post (shm), slots
/// the receiver has read are reused at once, with no completion polled.
#[test]
fn a_source_read_in_post_frees_slots_with_the_head() {
    let c = cfg(64, 8, 32, 16, 32, true);
    let mut p = Pair::new(&c);
    p.tx.set_source_read_in_post(true);
    while p.write(40, true).is_ok() {}
    while !p.s2r.is_empty() {
        p.apply_s2r();
    }
    while p.read().unwrap() {}
    p.apply_r2s();
    p.write(40, true).unwrap();
    assert!(!p.tx.awaits_completions());
}

/// A shrink takes effect, and its staging is released, only once the
/// WRITEs before the marker completed, not when the receiver passed it.
#[test]
fn a_resize_waits_for_the_writes_before_its_marker() {
    // Not elastic: the marker's tail goes out without a completion.
    let c = cfg(64, 8, 1, 1, 1, false);
    let mut p = Pair::new(&c);
    p.write(40, true).unwrap();
    p.resize(4);
    assert_eq!(p.tx.geometry().slot_count(), 4);
    // Everything is placed and read, and the heads pushed, but no send
    // completion is handled.
    for _ in 0..4 {
        while !p.s2r.is_empty() {
            p.apply_s2r();
        }
        while p.read().unwrap() {}
        p.rx.flush();
        p.post();
        while !p.r2s.is_empty() {
            p.apply_r2s();
        }
        while !p.rx_cq.is_empty() {
            p.complete_rx(0);
        }
        p.sender_sees_head().unwrap();
    }
    assert_eq!(
        p.tx.local_head(),
        p.tx.tail(),
        "the receiver passed the marker"
    );
    assert!(
        p.tx.switch_pending().is_some(),
        "switched before completions"
    );
    assert!(p.tx.take_released().is_none());
    while !p.tx_cq.is_empty() {
        p.complete_tx(0);
    }
    assert!(p.tx.switch_pending().is_none());
    assert!(p.tx.take_released().is_some());
    p.write(40, true).unwrap();
    p.drain();
}

/// Flushes what the sender wrote and places it in the receiver's ring (tail WRITEs complete).
fn deliver(p: &mut Pair) {
    p.tx.flush();
    p.post();
    while !p.s2r.is_empty() || !p.tx_cq.is_empty() {
        while !p.s2r.is_empty() {
            p.apply_s2r();
        }
        p.complete_tx(0);
    }
}

/// A receiver owes its head before a wait only while its sender's view of the ring may be
/// too full for a message like the largest so far: never in a ping-pong of small messages,
/// always after messages of half the ring.
#[test]
fn a_push_is_owed_before_a_wait_only_for_messages_large_next_to_the_ring() {
    let c = cfg(64, 64, 32, 16, 32, true);
    let mut p = Pair::new(&c);
    let read_one = |p: &mut Pair, len: usize| {
        p.write(len, true).unwrap();
        deliver(p);
        assert!(p.read().unwrap());
    };
    // 40 bytes: one 64-byte slot each. Five leave five slots unpushed (the head goes out
    // every 32 messages or 8 slots), and small messages owe nothing before a wait.
    for _ in 0..5 {
        read_one(&mut p, 40);
        assert!(!p.rx.push_owed_before_wait());
    }
    assert_eq!(p.rx.head() - p.rx.synced_head(), 5);
    // A message of 40 slots (header and stamp included) is pushed as it is released.
    read_one(&mut p, 40 * 64 - 16);
    assert_eq!(p.rx.head(), p.rx.synced_head());
    assert!(!p.rx.push_owed_before_wait(), "nothing unpushed");
    // Now one small message leaves a slot unpushed, and a sender writing another message
    // like the large one may need the whole ring: 1 + 2 * 40 > 64.
    read_one(&mut p, 40);
    assert!(p.rx.push_owed_before_wait());
    p.rx.flush();
    p.post();
    assert!(!p.rx.push_owed_before_wait(), "pushed");
}

#[test]
fn too_large_names_both_sizes() {
    let c = cfg(64, 8, 1, 1, 1, true);
    let mut s = Sender::new(&c);
    let mut ring = vec![0; 512];
    match s.reserve(600, &mut ring) {
        Err(e @ Error::TooLarge { len: 600, max: 496 }) => {
            assert!(e.to_string().contains("600") && e.to_string().contains("496"))
        }
        other => panic!("{other:?}"),
    }
    assert!(s.reserve(496, &mut ring).is_ok());
}

fn corrupt_rx(tail: u64, words: &[(usize, u64)]) -> Result<Option<Message>, Error> {
    let c = cfg(64, 8, 1, 1, 1, true);
    let mut rx = Receiver::new(&c);
    rx.handle_local_tail(tail)?;
    let mut ring = vec![0u8; 512];
    for &(off, w) in words {
        ring[off..off + 8].copy_from_slice(&w.to_le_bytes());
    }
    match rx.poll_recv(|o| u64::from_le_bytes(ring[o..o + 8].try_into().unwrap()))? {
        Some(m) => Ok(Some(m)),
        // Not placed: the driver waits its placement timeout, then closes.
        None if rx.unplaced().is_some() => {
            let e = rx.placement_timed_out();
            assert!(rx.poll_recv(|_| 0).is_err(), "closed stays closed");
            Err(e)
        }
        None => Ok(None),
    }
}

fn hdr(len: u32, flags: u16, pos: u64) -> u64 {
    u64::from_le_bytes(Header::new(len, flags, pos).encode())
}

#[test]
fn corrupt_peer_data_is_an_error() {
    // Good header and end stamp for contrast.
    let good = [(0, hdr(10, 0, 0)), (56, stamp_for(0))];
    assert!(corrupt_rx(1, &good).unwrap().is_some());
    let bad = [
        corrupt_rx(1, &[(0, 0)]),                                 // garbage tag
        corrupt_rx(1, &[(0, hdr(10, 0, 1))]),                     // stale tag
        corrupt_rx(1, &[(0, hdr(10, 0, 0))]),                     // no end stamp
        corrupt_rx(1, &[(0, hdr(10, 0, 0)), (56, stamp_for(8))]), // an earlier lap's stamp
        corrupt_rx(1, &[(0, hdr(100, 0, 0))]),                    // beyond published tail
        corrupt_rx(8, &[(0, hdr(1 << 20, 0, 0))]),                // beyond ring
        corrupt_rx(1, &[(0, hdr(0, FLAG_GAP, 0))]),               // gap at index 0
        corrupt_rx(1, &[(0, hdr(0, 4, 0))]),                      // unknown flag
        corrupt_rx(9, &[]),                                       // tail beyond N
    ];
    for r in bad {
        assert!(matches!(r, Err(Error::Corrupt(_))), "{r:?}");
    }
    let c = cfg(64, 8, 1, 1, 1, true);
    let mut rx = Receiver::new(&c);
    rx.handle_local_tail(4).unwrap();
    assert!(rx.handle_local_tail(3).is_err(), "tail moving backwards");
    assert!(rx.handle_local_tail(5).is_err(), "closed stays closed");
    let mut tx = Sender::new(&c);
    assert!(
        matches!(tx.handle_local_head(1), Err(Error::Corrupt(_))),
        "head beyond tail"
    );
    let mut ring = vec![0; 512];
    assert!(matches!(tx.reserve(1, &mut ring), Err(Error::Corrupt(_))));
}

#[test]
fn inconsistent_pointer_records_are_waits_until_the_driver_gives_up() {
    let c = cfg(64, 8, 1, 1, 1, true);
    let mut rx = Receiver::new(&c);
    let check = pointer_check(4);
    assert!(matches!(rx.handle_tail_record(4, check ^ 1), Ok(false)));
    assert!(matches!(rx.handle_tail_record(4, 0), Ok(false)));
    assert_eq!((rx.local_tail(), rx.torn_tails()), (0, 2));
    assert!(matches!(rx.handle_tail_record(4, check), Ok(true)));
    assert_eq!(rx.local_tail(), 4);
    // A consistent record is checked like a bare pointer.
    assert!(rx.handle_tail_record(3, pointer_check(3)).is_err());
    let mut rx = Receiver::new(&c);
    let e = rx.record_timed_out(4, 0);
    assert!(e.to_string().contains("tail record 0x4"), "{e}");
    assert!(
        rx.handle_tail_record(0, pointer_check(0)).is_err(),
        "stays closed"
    );

    let mut tx = Sender::new(&c);
    assert!(matches!(
        tx.handle_head_record(0, pointer_check(0)),
        Ok(true)
    ));
    assert!(matches!(tx.handle_head_record(1, 7), Ok(false)));
    assert_eq!(tx.stats().torn_heads, 1);
    assert!(
        matches!(
            tx.handle_head_record(1, pointer_check(1)),
            Err(Error::Corrupt(_))
        ),
        "head beyond tail"
    );
    let mut tx = Sender::new(&c);
    let e = tx.record_timed_out(1, 7);
    assert!(e.to_string().contains("head record 0x1"), "{e}");
}

/// The error of a message that never became consistent says what was seen.
#[test]
fn placement_timeout_names_what_was_seen() {
    let e = corrupt_rx(1, &[(0, hdr(10, 0, 0)), (56, 7)]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("slot 0") && msg.contains("end stamp 0x0000000000000007"),
        "{msg}"
    );
}

/// A tail placed before its slots (a responder that reorders across
/// WRITEs): the receiver waits, then reads the right message once the
/// slots land; each message of a burst is checked on its own.
#[test]
fn tail_before_slots_is_a_wait_not_an_error() {
    let c = cfg(64, 16, 4, 4, 1, true);
    let mut p = Pair::new(&c);
    for len in [10, 100, 30, 48] {
        p.write(len, true).unwrap();
    }
    assert!(matches!(p.s2r.back(), Some(Op::Tail { .. })));
    // The tail, and the slots up to the middle of the second message: the
    // first is whole, the second's header is there but not its end stamp.
    p.tail_first(64 + 8 + 50);
    assert!(p.read().unwrap(), "the first message is placed whole");
    assert!(!p.read().unwrap(), "the second is not");
    assert_eq!(p.rx.unplaced(), Some(1));
    // A stale copy of the same bytes from an earlier lap would not do
    // either: only the exact stamp for each slot pointer matches.
    p.apply_s2r(); // the slots
    assert!(p.read().unwrap() && p.read().unwrap() && p.read().unwrap());
    assert!(!p.read().unwrap());
    assert_eq!(p.rx.unplaced(), None);
    p.apply_s2r(); // the tail WRITE itself, a no-op now
    p.drain();
    assert_eq!(p.received, 4);
}

#[test]
fn fixed_threshold_bounds_tail_writes_in_flight() {
    // Elastic threshold off, a tail WRITE per message, nothing applied yet:
    // at most MAX_TAIL_INFLIGHT tail WRITEs may be outstanding, since each
    // needs its own stable source word.
    let c = cfg(64, 64, 1, 1, 1, false);
    let mut p = Pair::new(&c);
    for _ in 0..20 {
        p.write(1, true).unwrap();
    }
    assert_eq!(p.tx.tails_in_flight(), MAX_TAIL_INFLIGHT);
    assert!(p.tx.tail_deferred());
    while !p.s2r.is_empty() {
        p.apply_s2r();
        while p.read().unwrap() {}
    }
    p.drain();
    assert_eq!(p.received, 20);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 512 }))]

    /// A pointer record read while it is overwritten, any byte from either
    /// write (soft-RoCE copies byte by byte; a reader's two loads may
    /// straddle the copy), decodes to the old value, the new one, or
    /// nothing: never to a third value.
    #[test]
    fn a_torn_pointer_record_never_decodes_to_a_third_value(
        old in any::<u64>(),
        delta in prop_oneof![1u64..4, 1u64..1 << 16, any::<u64>()],
        mask in any::<u16>(),
    ) {
        let new = old.wrapping_add(delta);
        let (a, b) = (encode_pointer(old), encode_pointer(new));
        let mut seen = [0u8; POINTER_RECORD_LEN];
        for i in 0..POINTER_RECORD_LEN {
            seen[i] = if mask & (1 << i) != 0 { b[i] } else { a[i] };
        }
        let word = |i: usize| u64::from_le_bytes(seen[i..i + 8].try_into().unwrap());
        match decode_pointer(word(0), word(8)) {
            None => {}
            Some(v) => prop_assert!(v == old || v == new, "{v:#x} from {old:#x} / {new:#x}"),
        }
        prop_assert_eq!(decode_pointer(old, pointer_check(old)), Some(old));
    }

    /// The fuzz target's check in miniature: arbitrary `RB_R` bytes and
    /// pointer words only ever produce errors, never a panic, an
    /// out-of-bounds index or a message outside the published range.
    #[test]
    fn garbage_never_panics(
        slots in prop_oneof![Just(2usize), Just(8), Just(64)],
        ops in prop::collection::vec((0u8..5, any::<u8>(), any::<u64>()), 0..MAX_ACTIONS),
    ) {
        let c = cfg(64, slots, 2, 1, 2, true);
        let mut ring = vec![0u8; 64 * slots];
        let mut rx = Receiver::new(&c);
        let mut tx = Sender::new(&c);
        let mut tx_ring = vec![0u8; 64 * slots];
        for (kind, b, word) in ops {
            match kind {
                0 => {
                    let v = word % (4 * slots as u64);
                    // Half of the time as a record, its check right or not.
                    if b & 1 == 0 {
                        let _ = rx.handle_local_tail(v);
                    } else {
                        let _ = rx.handle_tail_record(v, pointer_check(v) ^ u64::from(b >> 5));
                    }
                }
                1 => {
                    let off = (usize::from(b) * 8) % ring.len();
                    ring[off..off + 8].copy_from_slice(&word.to_le_bytes());
                }
                2 => {
                    let off = (usize::from(b) * 64) % ring.len();
                    if b & 1 == 1 {
                        // A correct end stamp somewhere, so whole messages pass too.
                        let end = off + 56;
                        ring[end..end + 8].copy_from_slice(&stamp_for(rx.head()).to_le_bytes());
                        continue;
                    }
                    let tag = u64::from(tag_for(rx.head()));
                    let w = (word & 0x0000_0001_0000_0fff) | (tag << 48);
                    ring[off..off + 8].copy_from_slice(&w.to_le_bytes());
                }
                3 => {
                    match rx.poll_recv(|o| u64::from_le_bytes(ring[o..o + 8].try_into().unwrap())) {
                        Ok(Some(m)) => {
                            prop_assert!(m.pos() + m.slots() <= rx.local_tail());
                            prop_assert!(m.offset() + m.len() <= ring.len());
                            rx.release(m);
                            let _ = rx.poll_transmit();
                        }
                        Ok(None) if b % 4 == 0 && rx.unplaced().is_some() => {
                            // The driver's placement timeout.
                            prop_assert!(matches!(rx.placement_timed_out(), Error::Corrupt(_)));
                        }
                        _ => {}
                    }
                }
                _ => {
                    let v = word % (4 * slots as u64);
                    if b & 1 == 0 {
                        let _ = tx.handle_local_head(v);
                    } else {
                        let _ = tx.handle_head_record(v, pointer_check(v) ^ u64::from(b >> 5));
                    }
                    if let Ok(r) = tx.reserve(usize::from(b), &mut tx_ring) {
                        tx.commit(r, usize::from(b), &mut tx_ring);
                    }
                    while tx.poll_transmit().is_some() {}
                }
            }
            prop_assert!(rx.head() <= rx.local_tail());
            prop_assert!(rx.local_tail() - rx.head() <= slots as u64);
        }
    }
}

impl Pair {
    /// Writes one message, draining while the ring has no room (a gap at
    /// the array end can need the whole ring).
    fn write_eventually(&mut self, len: usize) {
        for _ in 0..3 {
            match self.write(len, true) {
                Ok(()) => {
                    self.drain();
                    return;
                }
                Err(Error::WouldBlock) => self.drain(),
                Err(e) => panic!("write {len}: {e}"),
            }
        }
        panic!(
            "no room for {len} bytes after draining twice: {:?}",
            self.tx
        );
    }
}

fn sizing_cfg(min_slots: usize, max_slots: usize) -> RingConfig {
    RingConfig::builder()
        .slot_size(64)
        .ring_size(64 * max_slots)
        .min_ring_size(64 * min_slots)
        .alpha(4)
        .beta(2)
        .gamma(4)
        .sq_depth(16)
        .build()
        .unwrap()
}

#[test]
fn a_resize_switches_in_band_and_waits_for_the_receiver_to_pass_its_marker() {
    // A fixed ring resized by hand: no policy interferes.
    let c = sizing_cfg(64, 64);
    let mut p = Pair::new(&c);
    assert_eq!(p.tx.geometry().slot_count(), 64);
    p.resize(4);
    p.drain();
    assert_eq!(p.rx.geometry().slot_count(), 4);
    p.write(40, true).unwrap();
    p.resize(16);
    let at =
        p.tx.switch_pending()
            .expect("the marker waits for the head");
    assert_eq!(p.tx.free_slots(), 0);
    assert!(matches!(p.write(10, true), Err(Error::WouldBlock)));
    // The receiver reads the message, then the marker, and pushes its head.
    p.drain();
    assert_eq!(p.rx.geometry().slot_count(), 16);
    assert_eq!(p.rx.resizes(), 2);
    assert!(p.tx.local_head() >= at && p.tx.switch_pending().is_none());
    // Sixteen slots now: messages of up to 16 slots go through, in order.
    for len in [900, 10, 500, 0, 700] {
        p.write_eventually(len);
    }
    p.resize(4);
    p.drain();
    assert_eq!(p.rx.geometry().slot_count(), 4);
    assert_eq!((p.tx.stats().grows, p.tx.stats().shrinks), (1, 2));
    // Without a policy, what the small ring cannot hold is refused.
    let e = p.tx.reserve(900, &mut p.rb_s).unwrap_err();
    assert!(matches!(e, Error::TooLarge { len: 900, max: 240 }), "{e}");
    assert_eq!(p.received, p.committed.len());
}

/// `sizing_cfg` with a quiet ring going down to `idle_slots` after 1 s.
fn idle_cfg(idle_slots: usize, min_slots: usize, max_slots: usize) -> RingConfig {
    sizing_cfg(min_slots, max_slots)
        .to_builder()
        .idle_ring_size(64 * idle_slots)
        .shrink_after(std::time::Duration::from_secs(1))
        .build()
        .unwrap()
}

/// Ticks of the policy every `shrink_after / 2` (as the driver's upkeep
/// task runs it), starting at a burst's end, until the sender switches to
/// `slots`; the number of ticks it took (panics past 10).
fn ticks_until_geometry(p: &mut Pair, slots: u64) -> u32 {
    for ticks in 1..=10 {
        p.tick(500);
        if p.tx.geometry().slot_count() == slots {
            return ticks;
        }
    }
    panic!(
        "no switch to {slots} slots in 10 ticks: {:?}",
        p.tx.geometry()
    );
}

/// A quiet ring goes below its minimum to its idle size within the bound
/// `ring_shrink_after` promises (the marker at a tick between 1 and 1.5 ×
/// `shrink_after` after the last message: 2 or 3 ticks of half of it),
/// both ends release everything past it, and the next message grows it
/// back to the minimum first and arrives intact.
#[test]
fn a_quiet_ring_shrinks_to_its_idle_size_within_the_bound_and_grows_back() {
    let c = idle_cfg(2, 16, 64);
    let mut p = Pair::new(&c);
    for _ in 0..20 {
        p.write_eventually(900);
    }
    assert_eq!(p.tx.geometry().slot_count(), 64, "grew for the burst");
    // The busy window ends at this tick.
    p.tick(0);
    let ticks = ticks_until_geometry(&mut p, 2);
    assert!(
        (2..=3).contains(&ticks),
        "the marker went out after {ticks} half-periods, not within 1..=1.5 x shrink_after"
    );
    p.drain();
    assert_eq!(p.rx.geometry().slot_count(), 2, "the receiver switched");
    assert!(p.rb_s[2 * 64..].iter().all(|&b| b == 0), "RB_S released");
    assert!(p.rb_r[2 * 64..].iter().all(|&b| b == 0), "RB_R released");
    // The next message, if it fits, goes out at once in the idle ring, and
    // the marker that grows the ring back to its minimum follows it.
    p.write(10, true).unwrap();
    assert_eq!(p.tx.geometry().slot_count(), 16, "back to the minimum");
    assert!(
        p.tx.switch_pending().is_some(),
        "the marker follows the message"
    );
    p.drain();
    assert_eq!(p.rx.geometry().slot_count(), 16);
    assert_eq!(p.received, p.committed.len(), "the message came");
    for len in [10, 900, 30] {
        p.write_eventually(len);
    }
    assert_eq!(p.received, p.committed.len());
    assert_eq!(p.received, 24);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 64 }))]

    /// Bursts and pauses: every pause of at least 1.5 x `shrink_after`
    /// leaves the ring at its idle size, with both ends' arrays released
    /// past it, and every message of every burst arrives intact and in
    /// order across the shrinks and the grows after them.
    #[test]
    fn bursts_and_pauses_keep_every_message_and_shrink_to_idle(
        idle in 0u32..4,
        rounds in prop::collection::vec(
            (prop::collection::vec(0usize..2000, 1..30), 0u32..6),
            1..8,
        ),
    ) {
        let idle_slots = 16usize >> idle;
        let c = idle_cfg(idle_slots.max(2), 16, 64);
        let idle_slots = c.idle_ring_size() as u64 / 64;
        let mut p = Pair::new(&c);
        for (burst, pause_ticks) in rounds {
            for len in burst {
                p.write_eventually(len);
            }
            p.tick(0);
            for _ in 0..pause_ticks {
                p.tick(500);
                p.drain();
            }
            if pause_ticks >= 3 {
                prop_assert_eq!(p.tx.geometry().slot_count(), idle_slots);
                prop_assert_eq!(p.rx.geometry().slot_count(), idle_slots);
                let keep = idle_slots as usize * 64;
                prop_assert!(p.rb_s[keep..].iter().all(|&b| b == 0));
                prop_assert!(p.rb_r[keep..].iter().all(|&b| b == 0));
            }
        }
        p.drain();
        prop_assert_eq!(p.received, p.committed.len());
    }
}

#[test]
fn the_policy_grows_before_a_large_message_and_shrinks_a_quiet_ring() {
    let c = sizing_cfg(4, 64);
    let mut p = Pair::new(&c);
    // 1000 bytes take 16 slots and ask for 64 (3 x 1000 bytes, rounded up).
    assert!(matches!(p.write(1000, true), Err(Error::WouldBlock)));
    assert_eq!(p.tx.geometry().slot_count(), 64, "grew before the message");
    assert_eq!(p.committed.len(), 0, "nothing committed before the switch");
    p.drain();
    for _ in 0..20 {
        p.write_eventually(1000);
    }
    assert_eq!(p.rx.geometry().slot_count(), 64);
    // Quiet: the first tick starts the quiet time, one second later it shrinks.
    p.tick(0);
    p.tick(600);
    assert_eq!(p.tx.geometry().slot_count(), 64);
    p.tick(600);
    assert_eq!(p.tx.geometry().slot_count(), 4, "shrunk to the minimum");
    p.drain();
    assert_eq!(p.rx.geometry().slot_count(), 4);
    // Both sides released the end of their arrays (zeroed in this harness),
    // and the ring still carries messages.
    assert!(p.rb_s[4 * 64..].iter().all(|&b| b == 0));
    assert!(p.rb_r[4 * 64..].iter().all(|&b| b == 0));
    for len in [10, 40, 20] {
        p.write_eventually(len);
    }
    assert_eq!(p.received, 23);
    assert_eq!(p.tx.geometry().slot_count(), 4, "small messages fit");
}

/// A receiver about to wait for data confirms its unsignaled head pushes
/// with a signaled one carrying the same head (a NIC reports a failed
/// WRITE only in a completion, and an unsignaled one has none otherwise);
/// once that completes nothing is left to confirm. An owed push is itself
/// made signaled rather than followed by another.
#[test]
fn confirming_pushes_signals_one_covering_the_unsignaled_ones() {
    let c = cfg(64, 8, 1, 1, 1, true);
    let mut rx = Receiver::new(&c);
    let ring = {
        let mut r = vec![0u8; 512];
        r[..8].copy_from_slice(&hdr(10, 0, 0).to_le_bytes());
        r[56..64].copy_from_slice(&stamp_for(0).to_le_bytes());
        r
    };
    rx.handle_local_tail(1).unwrap();
    let m = rx
        .poll_recv(|o| u64::from_le_bytes(ring[o..o + 8].try_into().unwrap()))
        .unwrap()
        .expect("a message");
    rx.release(m);
    rx.flush();
    let first = rx.poll_transmit().expect("the head push");
    assert_eq!(first.value, 1);
    assert!(!first.signaled, "the first push of a budget is unsignaled");
    assert!(!rx.confirming());
    rx.confirm_pushes();
    assert!(rx.confirming(), "owed");
    let confirm = rx.poll_transmit().expect("the confirming push");
    assert!(confirm.signaled);
    assert_eq!(confirm.value, 1, "the same head again");
    assert!(rx.poll_transmit().is_none());
    assert!(rx.confirming(), "posted, not completed");
    rx.handle_completion(confirm.wr_id);
    assert!(!rx.confirming());
    rx.confirm_pushes();
    assert!(!rx.confirming(), "nothing left unconfirmed");
    assert!(rx.poll_transmit().is_none());
    // A push owed (a message read since) becomes the signaled one itself.
    let mut ring = ring;
    ring[64..72].copy_from_slice(&hdr(10, 0, 1).to_le_bytes());
    ring[120..128].copy_from_slice(&stamp_for(1).to_le_bytes());
    rx.handle_local_tail(2).unwrap();
    let m = rx
        .poll_recv(|o| u64::from_le_bytes(ring[o..o + 8].try_into().unwrap()))
        .unwrap()
        .expect("a second message");
    rx.release(m);
    rx.flush();
    rx.confirm_pushes();
    let owed = rx.poll_transmit().expect("the owed push");
    assert!(owed.signaled && owed.value == 2, "{owed:?}");
    assert!(rx.poll_transmit().is_none(), "one push, not two");
}
