//! The sender half: `WRITEMSG` of RB² Algorithm 1.

use std::collections::VecDeque;

use std::time::Instant;

use super::budget::SqBudget;
use super::closed::Closed;
use super::sizing::Sizer;
use super::{
    FLAG_GAP, FLAG_RESIZE, Geometry, HEADER_LEN, Header, MAX_TAIL_INFLIGHT, TRAILER_LEN,
    WR_KIND_TX, WR_SEQ_MASK, stamp_for,
};
use crate::config::RingConfig;
use crate::error::Error;

/// A work request the driver must post, in the order returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transmit {
    /// Slot transmission (1st WRITE): copy `RB_S[offset..offset+len]` to the
    /// same bytes of the peer's `RB_R`.
    Slots {
        /// Byte offset in the array (same on both sides).
        offset: usize,
        /// Bytes to write.
        len: usize,
        /// Work-request id to post with.
        wr_id: u64,
        /// Whether to request a completion.
        signaled: bool,
    },
    /// Pointer advancement (2nd WRITE): store `value` in local source word
    /// `src` and WRITE that word to the peer's `local_tail`. Always signaled;
    /// the word must stay unchanged until the completion (it does: a source
    /// word is reused only after [`MAX_TAIL_INFLIGHT`] later tail WRITEs).
    Tail {
        /// The new tail (absolute slot pointer).
        value: u64,
        /// Index of the local source word to use (`< MAX_TAIL_INFLIGHT`).
        src: usize,
        /// Work-request id to post with.
        wr_id: u64,
    },
}

/// Space reserved by [`Sender::reserve`]: payload bytes
/// `offset..offset+capacity` of `RB_S`, to be filled and then committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a reservation does nothing until committed"]
pub struct Reservation {
    pos: u64,
    offset: usize,
    capacity: usize,
}

impl Reservation {
    /// Byte offset of the payload in the array.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Payload bytes reserved.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// Counters for benchmarks and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Messages committed.
    pub messages: u64,
    /// Slot-transmission WRITEs issued.
    pub slot_writes: u64,
    /// Tail WRITEs issued.
    pub tail_writes: u64,
    /// Pointer advancements deferred by the elastic threshold.
    pub deferrals: u64,
    /// Times the ring was found full.
    pub full: u64,
    /// Head records read with a check word that did not match (being
    /// written; `proto` docs, "Pointer records").
    pub torn_heads: u64,
    /// Resize markers written that grew the ring.
    pub grows: u64,
    /// Resize markers written that shrank the ring.
    pub shrinks: u64,
}

/// Sender state: `tail`, `synced_tail`, `esc_tail`, `local_head` (RB² Fig. 2).
///
/// Invariant: `local_head <= synced_tail <= esc_tail <= tail <= local_head + N`.
#[derive(Debug)]
pub struct Sender {
    /// The geometry in use (`max_geo` for a fixed ring).
    geo: Geometry,
    /// The whole array: the largest geometry.
    max_geo: Geometry,
    /// A self-sizing ring's policy.
    sizer: Option<Sizer>,
    /// After a resize marker: the slot pointer the receiver's head must
    /// reach before anything is written in the new geometry.
    switch_at: Option<u64>,
    /// The pending switch shrinks the ring.
    shrinking: bool,
    /// A shrink completed: the bytes of the array still in use (the rest
    /// of `RB_S` may be released).
    released: Option<usize>,
    alpha: u32,
    beta: u32,
    elastic: bool,
    budget: SqBudget,
    flush_slots: u64,
    /// Next slot to write in `RB_S`.
    tail: u64,
    /// Slots before this were handed to slot transmission.
    esc_tail: u64,
    /// Last tail value handed to pointer advancement.
    synced_tail: u64,
    /// Cache of the receiver's head, pushed by the receiver.
    local_head: u64,
    unsent: u32,
    unsynced: u32,
    tail_deferred: bool,
    tails_inflight: VecDeque<u64>,
    /// Slot WRITEs queued or posted whose completion has not been handled:
    /// their sequence number and the first slot they carry, oldest first.
    /// Their bytes of `RB_S` may still be read by the fabric (a NIC reads
    /// the source again when it retransmits), so they are not rewritten
    /// before their completion even once the receiver has read them
    /// ([`Sender::reusable_before`]).
    slots_inflight: VecDeque<(u64, u64)>,
    /// The fabric reads a WRITE's source inside its post (shm): no slot
    /// WRITE needs tracking ([`Sender::set_source_read_in_post`]).
    source_read_in_post: bool,
    /// The last reservation found the ring full only because slot WRITEs
    /// the receiver has read are not completed yet: room comes with a
    /// completion, not with a head push ([`Sender::wants_completions`]).
    awaits_completions: bool,
    tail_count: u64,
    queue: VecDeque<Transmit>,
    closed: Closed,
    stats: SenderStats,
}

impl Sender {
    /// A sender for a ring configured by `cfg`.
    pub fn new(cfg: &RingConfig) -> Self {
        let max_geo = Geometry::from_config(cfg);
        let geo = Geometry::new(cfg.slot_size(), cfg.initial_slot_count());
        Sender {
            geo,
            max_geo,
            sizer: cfg.self_sizing().then(|| {
                Sizer::new(
                    cfg.slot_size(),
                    cfg.initial_slot_count(),
                    cfg.slot_count(),
                    cfg.shrink_after(),
                )
                .with_cache_slots((cfg.cache_ring_size() / cfg.slot_size()) as u64)
                .with_idle_slots((cfg.idle_ring_size() / cfg.slot_size()) as u64)
            }),
            switch_at: None,
            shrinking: false,
            released: None,
            alpha: cfg.alpha(),
            beta: cfg.beta(),
            elastic: cfg.elastic(),
            budget: SqBudget::new(WR_KIND_TX, cfg.sender_outstanding()),
            flush_slots: super::flush_slots(geo.slot_count()),
            tail: 0,
            esc_tail: 0,
            synced_tail: 0,
            local_head: 0,
            unsent: 0,
            unsynced: 0,
            tail_deferred: false,
            tails_inflight: VecDeque::with_capacity(MAX_TAIL_INFLIGHT),
            slots_inflight: VecDeque::new(),
            source_read_in_post: false,
            awaits_completions: false,
            tail_count: 0,
            queue: VecDeque::new(),
            closed: Closed::default(),
            stats: SenderStats::default(),
        }
    }

    /// Tells the sender that the fabric reads a WRITE's source inside its
    /// post (shm copies the bytes there), so that staging may be rewritten
    /// as soon as the receiver has read it: the receiver can read only
    /// what was posted, and nothing reads a posted WRITE's source again.
    /// Off by default (a NIC reads the source after the post, and again
    /// when it retransmits); set it before the first message.
    pub fn set_source_read_in_post(&mut self, yes: bool) {
        self.source_read_in_post = yes;
    }
    /// The ring geometry in use (of a self-sizing ring: its current size).
    pub fn geometry(&self) -> Geometry {
        self.geo
    }
    /// The whole array: a self-sizing ring's largest geometry.
    pub fn max_geometry(&self) -> Geometry {
        self.max_geo
    }
    /// The slot pointer the receiver's head must reach (and the WRITEs
    /// before it complete) before the sender writes in the geometry of its
    /// last resize marker, if that is pending.
    pub fn switch_pending(&self) -> Option<u64> {
        self.switch_at
    }
    /// A shrink completed since the last call: the bytes of `RB_S` still
    /// in use; the driver may give the rest back to the system.
    pub fn take_released(&mut self) -> Option<usize> {
        self.released.take()
    }
    /// `tail`: next slot to be written.
    pub fn tail(&self) -> u64 {
        self.tail
    }
    /// `esc_tail`: slots before it have been handed to slot transmission.
    pub fn esc_tail(&self) -> u64 {
        self.esc_tail
    }
    /// `synced_tail`: the last tail value handed to pointer advancement.
    pub fn synced_tail(&self) -> u64 {
        self.synced_tail
    }
    /// `local_head`: the receiver's head as last pushed.
    pub fn local_head(&self) -> u64 {
        self.local_head
    }
    /// Free slots as far as the sender knows (none while a resize waits
    /// for the receiver to pass its marker): slots the receiver has read
    /// *and* whose WRITEs completed ([`reusable_before`](Self::reusable_before)).
    #[inline]
    pub fn free_slots(&self) -> u64 {
        if self.switch_at.is_some() {
            return 0;
        }
        self.geo.slot_count() - (self.tail - self.reusable_before())
    }
    /// Slots before this may be rewritten in `RB_S`: the receiver has read
    /// them (`local_head`) and the WRITEs that carried them completed. A
    /// WRITE's source must not change before its completion: a NIC that
    /// retransmits it (its ACK lost) reads the source again, and the
    /// responder places the duplicate again, so new bytes in `RB_S` could
    /// land over a message the receiver has not read yet. On shm a WRITE
    /// completes inside its post, so this is the head.
    #[inline]
    pub fn reusable_before(&self) -> u64 {
        // Nothing is tracked on shm (`set_source_read_in_post`).
        self.slots_inflight
            .front()
            .map_or(self.local_head, |&(_, start)| start.min(self.local_head))
    }
    /// Whether [`reserve`](Self::reserve) of `len` bytes would find room
    /// with the cached `local_head` (gap included). A driver reloads the
    /// peer-written head word only when this says no (rtrb's cached-index
    /// pattern: the shared word is touched only when the ring looks full).
    #[inline]
    pub fn fits(&self, len: usize) -> bool {
        let n = self.geo.slots_for(len);
        let count = self.geo.slot_count();
        let idx = self.geo.index(self.tail);
        let need = if idx + n > count { count - idx + n } else { n };
        need <= self.free_slots()
    }
    /// Pointer advancement (and slot transmission) also happens once this
    /// many slots are unsynced, whatever `alpha` says (see [`super::flush_slots`]).
    pub fn flush_slots(&self) -> u64 {
        self.flush_slots
    }
    /// A pointer advancement is owed but held back by the elastic threshold
    /// until a tail WRITE completes.
    pub fn tail_deferred(&self) -> bool {
        self.tail_deferred
    }
    /// Tail WRITEs queued or posted whose completion has not been handled.
    pub fn tails_in_flight(&self) -> usize {
        self.tails_inflight.len()
    }
    /// True if progress waits for completions to be polled: work requests
    /// held back (the send-queue budget is used up or a tail WRITE is
    /// deferred), or room ([`awaits_completions`](Self::awaits_completions)).
    pub fn wants_completions(&self) -> bool {
        self.tail_deferred
            || self.awaits_completions
            || self
                .queue
                .front()
                .is_some_and(|t| !self.budget.admits(seq_of(t)))
    }
    /// The last reservation found the ring full only because slots the
    /// receiver has read wait for their WRITEs' completions
    /// ([`reusable_before`](Self::reusable_before)): room comes with
    /// completions, not with a head push. Implies
    /// [`wants_completions`](Self::wants_completions).
    pub fn awaits_completions(&self) -> bool {
        self.awaits_completions
    }
    /// True if everything committed has been handed out as work requests,
    /// including the tail that covers it.
    pub fn is_flushed(&self) -> bool {
        self.queue.is_empty() && self.synced_tail == self.tail && !self.tail_deferred
    }
    /// Counters.
    pub fn stats(&self) -> SenderStats {
        self.stats
    }
    /// The error that closed the sender, if any.
    pub fn closed(&self) -> Option<&crate::error::Corruption> {
        self.closed.reason()
    }

    /// Reserves room for a payload of `len` bytes in `ring` (`RB_S`), writing
    /// a gap header first when the message would cross the end of the array.
    ///
    /// # Errors
    /// [`Error::TooLarge`] if `len` exceeds the ring (the whole array, or
    /// the size a ring resized by hand has now); [`Error::WouldBlock`] if
    /// there is not enough free space (the batch is flushed so the receiver
    /// can drain and push its head); [`Error::Corrupt`] after a bad head.
    pub fn reserve(&mut self, len: usize, ring: &mut [u8]) -> Result<Reservation, Error> {
        self.closed.check()?;
        if len > self.max_geo.max_payload() {
            return Err(Error::TooLarge {
                len,
                max: self.max_geo.max_payload(),
            });
        }
        debug_assert!(ring.len() >= self.max_geo.ring_bytes());
        if self.switch_at.is_some() {
            // The receiver has not passed the last resize marker yet (or
            // the WRITEs before it have not completed).
            return Err(self.on_full(false, None));
        }
        if let Some(target) = self
            .sizer
            .as_ref()
            .and_then(|s| s.grow_for(len, self.geo.slot_count()))
            && !self.grows_after(len)
        {
            // Grow before the message that needs it; it goes out once the
            // receiver has passed the marker.
            return Err(match self.resize(target, ring) {
                Ok(_) => Error::WouldBlock,
                Err(Error::WouldBlock) => self.on_full(true, Some(1)),
                Err(e) => e,
            });
        }
        let n = self.geo.slots_for(len);
        let count = self.geo.slot_count();
        if n > count {
            // Only after a resize by hand ([`Sender::resize`]): the policy
            // grows the ring before any message that needs it.
            return Err(Error::TooLarge {
                len,
                max: self.geo.max_payload(),
            });
        }
        let idx = self.geo.index(self.tail);
        if idx + n > count {
            let gap = count - idx;
            if self.free_slots() < gap {
                return Err(self.on_full(true, Some(gap)));
            }
            let off = self.geo.offset(self.tail);
            ring[off..off + HEADER_LEN]
                .copy_from_slice(&Header::new(0, FLAG_GAP, self.tail).encode());
            // The gap ends with a stamp too: a receiver that consumes it
            // has seen its whole WRITE placed, so the source slots it
            // frees are no longer being read (`proto` docs, "Gaps").
            let end = self.geo.stamp_offset(self.tail, gap);
            ring[end..end + TRAILER_LEN].copy_from_slice(&stamp_for(self.tail).to_le_bytes());
            self.tail += gap;
        }
        if self.free_slots() < n {
            return Err(self.on_full(true, Some(n)));
        }
        if self.awaits_completions {
            self.awaits_completions = false;
        }
        Ok(Reservation {
            pos: self.tail,
            offset: self.geo.offset(self.tail) + HEADER_LEN,
            capacity: len,
        })
    }

    /// Whether a message of `len` bytes goes out before the marker that
    /// grows the ring ([`commit`](Self::commit) writes it): below the
    /// minimum (a quiet ring at its idle size) a message that fits, with a
    /// slot to spare, does not wait for a resize round trip, so the first
    /// message after a quiet spell costs what it did before the ring shrank.
    fn grows_after(&self, len: usize) -> bool {
        let count = self.geo.slot_count();
        self.sizer.as_ref().is_some_and(|s| count < s.min_slots())
            && self.geo.slots_for(len) < count
    }

    /// The ring has no room: flush so the receiver can drain and push its
    /// head. `counted`: a wait for space (not for a resize to take effect),
    /// which the sizing policy and [`SenderStats::full`] count. `need`: the
    /// slots the reservation needed (`None`: it waits for a resize marker
    /// to be passed). Notes whether completions, not the head, would give
    /// the room ([`wants_completions`](Self::wants_completions)).
    fn on_full(&mut self, counted: bool, need: Option<u64>) -> Error {
        self.awaits_completions = match need {
            Some(n) => {
                !self.slots_inflight.is_empty()
                    && self.geo.slot_count() - (self.tail - self.local_head) >= n
            }
            None => self.switch_at.is_some_and(|s| self.local_head >= s),
        };
        if counted {
            self.stats.full += 1;
            if let Some(s) = &mut self.sizer {
                s.on_full();
            }
        }
        self.flush();
        Error::WouldBlock
    }

    /// Switches the ring to `slot_count` slots (a power of two, at least
    /// 2, at most the whole array) with an in-band resize marker: a
    /// one-slot message at `tail` that tells the receiver the geometry of
    /// everything after it. The marker is flushed at once; nothing is
    /// written in the new geometry until the receiver's head has passed it
    /// ([`switch_pending`](Self::switch_pending)), so no slot of the old
    /// geometry is overwritten before it is read (`proto` docs, "Rings that
    /// size themselves"). Returns `Ok(false)` if the ring already has that
    /// size.
    ///
    /// # Errors
    /// [`Error::WouldBlock`] while an earlier switch is pending or no slot
    /// is free for the marker; [`Error::InvalidConfig`] for a slot count
    /// out of range; [`Error::Corrupt`] once closed.
    pub fn resize(&mut self, slot_count: u64, ring: &mut [u8]) -> Result<bool, Error> {
        self.closed.check()?;
        if !slot_count.is_power_of_two()
            || slot_count < crate::MIN_SLOT_COUNT
            || slot_count > self.max_geo.slot_count()
        {
            return Err(Error::InvalidConfig(format!(
                "ring slot count {slot_count} must be a power of two in {}..={}",
                crate::MIN_SLOT_COUNT,
                self.max_geo.slot_count()
            )));
        }
        if slot_count == self.geo.slot_count() {
            return Ok(false);
        }
        if self.free_slots() < 1 {
            return Err(Error::WouldBlock);
        }
        let off = self.geo.offset(self.tail);
        ring[off..off + HEADER_LEN]
            .copy_from_slice(&Header::new(slot_count as u32, FLAG_RESIZE, self.tail).encode());
        let end = self.geo.stamp_offset(self.tail, 1);
        ring[end..end + TRAILER_LEN].copy_from_slice(&stamp_for(self.tail).to_le_bytes());
        self.tail += 1;
        // Out now, in the old geometry (slot transmission splits at its end).
        self.flush();
        self.shrinking = slot_count < self.geo.slot_count();
        if self.shrinking {
            self.stats.shrinks += 1;
        } else {
            self.stats.grows += 1;
        }
        self.geo = Geometry::new(self.geo.slot_size(), slot_count);
        self.flush_slots = super::flush_slots(slot_count);
        self.switch_at = Some(self.tail);
        Ok(true)
    }

    /// Runs the sizing policy of a self-sizing ring at `now` (the driver
    /// calls this every `shrink_after / 2`; `proto::sizing` docs) and starts
    /// the resize it asks for. Returns whether a resize marker was written.
    /// A fixed ring, or one whose last switch is pending, does nothing.
    ///
    /// # Errors
    /// [`Error::Corrupt`] once closed.
    pub fn maintain(&mut self, now: Instant, ring: &mut [u8]) -> Result<bool, Error> {
        self.closed.check()?;
        let current = self.geo.slot_count();
        let Some(target) = self.sizer.as_mut().and_then(|s| s.tick(now, current)) else {
            return Ok(false);
        };
        if self.switch_at.is_some() {
            return Ok(false);
        }
        match self.resize(target, ring) {
            Ok(done) => Ok(done),
            Err(Error::WouldBlock) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Commits `len <= res.capacity()` payload bytes of a reservation: writes
    /// the header and the end stamp, advances `tail` and applies the
    /// thresholds (Algorithm 1 lines 5-15).
    ///
    /// # Panics
    /// If `res` is not the latest reservation or `len` exceeds its capacity.
    pub fn commit(&mut self, res: Reservation, len: usize, ring: &mut [u8]) {
        assert_eq!(res.pos, self.tail, "stale reservation");
        assert!(len <= res.capacity, "commit beyond reservation");
        let off = self.geo.offset(self.tail);
        ring[off..off + HEADER_LEN]
            .copy_from_slice(&Header::new(len as u32, 0, self.tail).encode());
        let slots = self.geo.slots_for(len);
        let end = self.geo.stamp_offset(self.tail, slots);
        ring[end..end + TRAILER_LEN].copy_from_slice(&stamp_for(self.tail).to_le_bytes());
        self.tail += slots;
        self.stats.messages += 1;
        let mut grow = None;
        if let Some(s) = &mut self.sizer {
            s.on_message(len);
            if self.geo.slot_count() < s.min_slots() && self.switch_at.is_none() {
                grow = Some(s.target_for(len));
            }
        }
        self.unsent += 1;
        self.unsynced += 1;
        if self.unsynced >= self.alpha || self.tail - self.synced_tail >= self.flush_slots {
            // Pointer advancement: flush the slots, then (elastic threshold
            // permitting) write the tail. Like Algorithm 1 line 9 the batch
            // counter restarts even when the tail WRITE is deferred. Large
            // messages get here by volume (`flush_slots`): a ring holding
            // only a few of them must not wait for `alpha` of them.
            self.transmit_slots();
            self.unsynced = 0;
            self.advance();
        } else if self.unsent >= self.beta {
            // Synchronization-ahead slot transmission.
            self.transmit_slots();
        }
        if let Some(target) = grow {
            // Below the minimum (`grows_after`): the marker follows the
            // message (and flushes it). With no slot free for it, the next
            // reservation tries again; only a closed sender fails here, and
            // its next call says so.
            let _ = self.resize(target, ring);
        }
    }

    /// Pushes whatever is batched: transmits untransmitted slots and
    /// advances the tail (or marks it deferred while a tail WRITE is in
    /// flight under the elastic threshold; it then goes out from
    /// [`handle_completion`](Self::handle_completion)).
    pub fn flush(&mut self) {
        if self.closed.is_closed() {
            return;
        }
        self.transmit_slots();
        if self.esc_tail != self.synced_tail {
            self.unsynced = 0;
            self.advance();
        }
    }

    fn transmit_slots(&mut self) {
        if self.esc_tail == self.tail {
            return;
        }
        let count = self.geo.slot_count();
        let mut pos = self.esc_tail;
        while pos < self.tail {
            let idx = self.geo.index(pos);
            let n = (self.tail - pos).min(count - idx);
            let (seq, signaled) = self.budget.next();
            if !self.source_read_in_post {
                self.slots_inflight.push_back((seq, pos));
            }
            self.queue.push_back(Transmit::Slots {
                offset: self.geo.offset(pos),
                len: n as usize * self.geo.slot_size(),
                wr_id: self.budget.wr_id(seq),
                signaled,
            });
            self.stats.slot_writes += 1;
            pos += n;
        }
        self.esc_tail = self.tail;
        self.unsent = 0;
    }

    fn advance(&mut self) {
        if self.esc_tail == self.synced_tail {
            self.tail_deferred = false;
            return;
        }
        let cap = if self.elastic { 1 } else { MAX_TAIL_INFLIGHT };
        if self.tails_inflight.len() >= cap {
            if !self.tail_deferred {
                self.stats.deferrals += 1;
            }
            self.tail_deferred = true;
            return;
        }
        let seq = self.budget.next_signaled();
        self.tails_inflight.push_back(seq);
        let src = (self.tail_count % MAX_TAIL_INFLIGHT as u64) as usize;
        self.tail_count += 1;
        self.queue.push_back(Transmit::Tail {
            value: self.esc_tail,
            src,
            wr_id: self.budget.wr_id(seq),
        });
        self.stats.tail_writes += 1;
        self.synced_tail = self.esc_tail;
        self.tail_deferred = false;
    }

    /// The next work request to post, or `None` if there is none or the
    /// send-queue budget needs completions first.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let front = self.queue.front()?;
        if !self.budget.admits(seq_of(front)) {
            return None;
        }
        self.queue.pop_front()
    }

    /// A signaled work request `wr_id` completed successfully: it and every
    /// earlier one are done (RC order). Completions may be handled late or
    /// out of order; stale ones are ignored.
    pub fn handle_completion(&mut self, wr_id: u64) {
        if !self.budget.complete(wr_id) {
            debug_assert!(
                false,
                "completion {wr_id:#x} was never posted by this sender"
            );
            return;
        }
        let done = self.budget.done_seq();
        while self.tails_inflight.front().is_some_and(|&s| s < done) {
            self.tails_inflight.pop_front();
        }
        while self.slots_inflight.front().is_some_and(|&(s, _)| s < done) {
            self.slots_inflight.pop_front();
        }
        if self.awaits_completions || self.switch_at.is_some() {
            if self.reusable_before() == self.local_head {
                self.awaits_completions = false;
            }
            self.settle_switch();
        }
        if self.tail_deferred {
            self.advance();
        }
    }

    /// The receiver pushed a head record into our `local_head` words, read
    /// as `value` and `check` (`proto` docs, "Pointer records"). Returns
    /// whether it was consistent (and then applied); an inconsistent one
    /// is being written, or garbage: the driver reads it again and bounds
    /// how long that may last ([`record_timed_out`](Self::record_timed_out)).
    ///
    /// # Errors
    /// As [`handle_local_head`](Self::handle_local_head).
    pub fn handle_head_record(&mut self, value: u64, check: u64) -> Result<bool, Error> {
        match super::decode_pointer(value, check) {
            Some(v) => self.handle_local_head(v).map(|()| true),
            None => {
                self.closed.check()?;
                self.stats.torn_heads += 1;
                Ok(false)
            }
        }
    }

    /// The head record stayed inconsistent (`value`, `check`) past the
    /// driver's bound: the peer wrote garbage there. Closes the sender.
    pub fn record_timed_out(&mut self, value: u64, check: u64) -> Error {
        self.closed.record_timed_out("head", value, check)
    }

    /// The receiver pushed `value` into our `local_head` word.
    ///
    /// # Errors
    /// [`Error::Corrupt`] (and the sender closes) if the value moves backwards
    /// or past the tail we published.
    pub fn handle_local_head(&mut self, value: u64) -> Result<(), Error> {
        self.closed.check()?;
        if value == self.local_head {
            return Ok(());
        }
        if value < self.local_head || value > self.synced_tail {
            return Err(self.closed.close(crate::error::Corruption::Pointer {
                record: "head",
                value,
                min: self.local_head,
                max: self.synced_tail,
            }));
        }
        self.local_head = value;
        self.settle_switch();
        Ok(())
    }

    /// A pending resize takes effect once the receiver has passed its
    /// marker and the WRITEs before it completed: nothing reads the old
    /// geometry's slots any more, in `RB_R` or `RB_S`.
    fn settle_switch(&mut self) {
        if self.switch_at.is_some_and(|s| self.reusable_before() >= s) {
            self.switch_at = None;
            self.awaits_completions = false;
            if std::mem::take(&mut self.shrinking) {
                self.released = Some(self.geo.ring_bytes());
            }
        }
    }
}

fn seq_of(t: &Transmit) -> u64 {
    match *t {
        Transmit::Slots { wr_id, .. } | Transmit::Tail { wr_id, .. } => wr_id & WR_SEQ_MASK,
    }
}
