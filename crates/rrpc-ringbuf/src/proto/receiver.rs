//! The receiver half: `READMSG` of RB² Algorithm 1 plus lazy push.

use super::budget::SqBudget;
use super::closed::Closed;
use super::{
    FLAG_GAP, FLAG_RESIZE, Geometry, HEADER_LEN, Header, OVERHEAD, WR_KIND_RX, stamp_for, tag_for,
};
use crate::config::RingConfig;
use crate::error::{Corruption, Error, StampOf, Unplaced};

/// A validated message at the head of `RB_R`: payload bytes
/// `offset..offset+len` of the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a message must be released to free its slots"]
pub struct Message {
    pos: u64,
    offset: usize,
    len: usize,
    slots: u64,
}

impl Message {
    /// Byte offset of the payload in the array.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Payload length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Absolute slot pointer of the message.
    pub fn pos(&self) -> u64 {
        self.pos
    }
    /// Slots the message occupies.
    pub fn slots(&self) -> u64 {
        self.slots
    }
}

/// A head push (lazy push, RB² §IV-A): WRITE `value` into the sender's
/// `local_head` word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadPush {
    /// The head to publish.
    pub value: u64,
    /// Work-request id to post with.
    pub wr_id: u64,
    /// Whether to request a completion.
    pub signaled: bool,
}

/// Receiver state: `head`, `synced_head`, `local_tail` (RB² Fig. 2).
///
/// Invariant: `synced_head <= head <= local_tail <= head + N`.
#[derive(Debug)]
pub struct Receiver {
    /// The geometry in use (the sender's, as its resize markers say).
    geo: Geometry,
    /// Largest slot count a resize marker may name (the whole array).
    max_count: u64,
    /// A resize marker shrank the ring: the bytes of `RB_R` still in use.
    shrunk: Option<usize>,
    resizes: u64,
    gamma: u32,
    head: u64,
    synced_head: u64,
    local_tail: u64,
    unpushed: u32,
    push_pending: bool,
    /// A signaled push was asked for by [`confirm_pushes`](Self::confirm_pushes).
    confirm: bool,
    /// The sequence number of the last signaled push, if any.
    last_signaled: Option<u64>,
    budget: SqBudget,
    flush_slots: u64,
    closed: Closed,
    pushes: u64,
    /// The largest message released so far, in slots.
    largest: u64,
    torn_tails: u64,
    /// The message at `head` is covered by the tail but not placed yet:
    /// what was seen instead (module docs, "Placement order").
    unplaced: Option<(u64, Unplaced)>,
}

impl Receiver {
    /// A receiver for a ring configured by `cfg`, whose sender starts at
    /// `cfg`'s initial size ([`RingConfig::initial_slot_count`]).
    pub fn new(cfg: &RingConfig) -> Self {
        Receiver::with_initial_slots(cfg, cfg.initial_slot_count())
    }

    /// A receiver whose sender starts with `slot_count` slots (the peer's
    /// initial size, from the handshake).
    ///
    /// # Panics
    /// If `slot_count` is not a power of two in `2..=cfg.slot_count()`
    /// (the driver validates the peer's value first).
    pub fn with_initial_slots(cfg: &RingConfig, slot_count: u64) -> Self {
        assert!(slot_count <= cfg.slot_count());
        Receiver {
            geo: Geometry::new(cfg.slot_size(), slot_count),
            max_count: cfg.slot_count(),
            shrunk: None,
            resizes: 0,
            gamma: cfg.gamma(),
            head: 0,
            synced_head: 0,
            local_tail: 0,
            unpushed: 0,
            push_pending: false,
            confirm: false,
            last_signaled: None,
            budget: SqBudget::new(WR_KIND_RX, cfg.receiver_outstanding()),
            flush_slots: super::flush_slots(slot_count),
            closed: Closed::default(),
            pushes: 0,
            largest: 0,
            torn_tails: 0,
            unplaced: None,
        }
    }

    /// The ring geometry.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }
    /// `head`: next slot to read.
    pub fn head(&self) -> u64 {
        self.head
    }
    /// `synced_head`: the head value last pushed to the sender.
    pub fn synced_head(&self) -> u64 {
        self.synced_head
    }
    /// `local_tail`: the sender's tail as last written to us.
    pub fn local_tail(&self) -> u64 {
        self.local_tail
    }
    /// Head pushes issued.
    pub fn pushes(&self) -> u64 {
        self.pushes
    }
    /// Resize markers read.
    pub fn resizes(&self) -> u64 {
        self.resizes
    }
    /// A resize marker shrank the ring since the last call: the bytes of
    /// `RB_R` still in use. The sender writes nothing past them until a
    /// later marker grows the ring again, so the driver may give the rest
    /// back to the system.
    pub fn take_shrunk(&mut self) -> Option<usize> {
        self.shrunk.take()
    }
    /// Tail records read with a check word that did not match (being
    /// written; `proto` docs, "Pointer records").
    pub fn torn_tails(&self) -> u64 {
        self.torn_tails
    }
    /// The error that closed the receiver, if any.
    pub fn closed(&self) -> Option<&Corruption> {
        self.closed.reason()
    }
    /// The slot pointer of a message the tail covers but that is not placed
    /// yet (its header tag or end stamp is not there), as the last
    /// [`poll_recv`](Self::poll_recv) found it. The driver bounds how long
    /// this may last ([`placement_timed_out`](Self::placement_timed_out)).
    pub fn unplaced(&self) -> Option<u64> {
        self.unplaced.as_ref().map(|u| u.0)
    }

    /// The message at [`unplaced`](Self::unplaced) was not placed within the
    /// driver's bound: the peer wrote something else. Closes the receiver.
    pub fn placement_timed_out(&mut self) -> Error {
        let what = match self.unplaced.take() {
            Some((slot, seen)) => Corruption::NeverPlaced { slot, seen },
            None => Corruption::PlacementTimedOut,
        };
        self.closed.close(what)
    }

    fn not_placed(&mut self, seen: Unplaced) -> Result<Option<Message>, Error> {
        self.unplaced = Some((self.head, seen));
        Ok(None)
    }

    /// True if a head push is owed (it goes out from [`poll_transmit`](Self::poll_transmit)).
    #[inline]
    pub fn push_pending(&self) -> bool {
        self.push_pending
    }
    /// True if a head push is owed but the send-queue budget needs completions.
    pub fn wants_completions(&self) -> bool {
        (self.push_pending || self.confirm) && self.budget.is_full()
    }

    /// Makes the owed head push signaled, or asks for one if pushes went out
    /// whose completion is unknown (unsignaled ones, on a NIC) and no
    /// signaled push covers them: its completion then says how they all
    /// went, since an RC queue pair completes in order. The push carries the
    /// current head (the same value again if nothing was read since, which
    /// the sender ignores).
    /// For a receiver about to wait for data: a failed push the sender
    /// needed would otherwise leave both sides waiting on a connection
    /// that is gone.
    pub fn confirm_pushes(&mut self) {
        // Pushes up to the last signaled one are covered by its completion.
        let covered = self.last_signaled.map_or(0, |s| s + 1);
        if self.push_pending || self.budget.next_seq() > covered.max(self.budget.done_seq()) {
            self.confirm = true;
        }
    }

    /// True while a signaled head push is owed (asked for by
    /// [`confirm_pushes`](Self::confirm_pushes)) or posted and its completion
    /// not handled yet.
    pub fn confirming(&self) -> bool {
        self.confirm
            || self
                .last_signaled
                .is_some_and(|s| self.budget.done_seq() <= s)
    }

    /// The sender wrote a tail record into our `local_tail` words, read as
    /// `value` and `check` (`proto` docs, "Pointer records"). Returns
    /// whether it was consistent (and then applied); an inconsistent one
    /// is being written, or garbage: the driver reads it again and bounds
    /// how long that may last ([`record_timed_out`](Self::record_timed_out)).
    ///
    /// # Errors
    /// As [`handle_local_tail`](Self::handle_local_tail).
    pub fn handle_tail_record(&mut self, value: u64, check: u64) -> Result<bool, Error> {
        match super::decode_pointer(value, check) {
            Some(v) => self.handle_local_tail(v).map(|()| true),
            None => {
                self.closed.check()?;
                self.torn_tails += 1;
                Ok(false)
            }
        }
    }

    /// The tail record stayed inconsistent (`value`, `check`) past the
    /// driver's bound: the peer wrote garbage there. Closes the receiver.
    pub fn record_timed_out(&mut self, value: u64, check: u64) -> Error {
        self.closed.record_timed_out("tail", value, check)
    }

    /// The sender wrote `value` into our `local_tail` word.
    ///
    /// # Errors
    /// [`Error::Corrupt`] (and the receiver closes) if the tail moves
    /// backwards or more than `N` slots past our head.
    pub fn handle_local_tail(&mut self, value: u64) -> Result<(), Error> {
        self.closed.check()?;
        if value == self.local_tail {
            return Ok(());
        }
        if value < self.local_tail || value - self.head > self.geo.slot_count() {
            return Err(self.closed.close(Corruption::Pointer {
                record: "tail",
                value,
                min: self.local_tail,
                max: self.head + self.geo.slot_count(),
            }));
        }
        self.local_tail = value;
        Ok(())
    }

    /// Returns the message at the head, if any, after validating its header
    /// and its end stamp (`read_word(offset)` returns the little-endian
    /// `u64` at byte `offset` of `RB_R`, 8-byte aligned; it is called at
    /// most eight times). Gaps and resize markers are skipped. When the ring is found empty and
    /// the sender has not been told the latest head, a head push is
    /// scheduled (so a sender waiting for space is never left waiting on the
    /// `gamma` threshold).
    ///
    /// A message the tail covers whose header tag or end stamp is not the
    /// one for its slot is not placed yet: `Ok(None)`, and
    /// [`unplaced`](Self::unplaced) says so (module docs, "Placement order").
    /// The driver must read the end stamp before the payload with acquire
    /// ordering (a fence after this returns the message).
    ///
    /// A header that is inconsistent in any way (wrong tag, unknown flags, a
    /// length beyond the ring or the published tail, a gap that does not
    /// end at the array end) or a wrong end stamp is treated the same way:
    /// a peer that wrote garbage is closed by the driver's placement
    /// timeout, with what was seen in the error.
    ///
    /// # Errors
    /// [`Error::Corrupt`] once the receiver was closed.
    pub fn poll_recv(
        &mut self,
        mut read_word: impl FnMut(usize) -> u64,
    ) -> Result<Option<Message>, Error> {
        self.closed.check()?;
        // At most a gap, a resize marker and a gap in the new geometry
        // precede a message (a marker waits for the head to pass it, so
        // two are never read in one call).
        for _ in 0..4 {
            if self.head == self.local_tail {
                self.unplaced = None;
                if self.head != self.synced_head {
                    self.push_pending = true;
                }
                return Ok(None);
            }
            let idx = self.geo.index(self.head);
            let avail = self.local_tail - self.head;
            let h = Header::decode(read_word(self.geo.offset(self.head)));
            // Anything but a consistent header and end stamp is "not placed
            // yet" (a stale header, or a rare stale tag that matches):
            // garbage is told apart from a late placement by time only, in
            // the driver (`placement_timed_out`).
            if h.tag != tag_for(self.head) {
                return self.not_placed(Unplaced::Tag {
                    slot: self.head,
                    tag: h.tag,
                    expected: tag_for(self.head),
                });
            }
            if h.flags == FLAG_RESIZE {
                let n = u64::from(h.len);
                if !n.is_power_of_two() || n < crate::MIN_SLOT_COUNT || n > self.max_count {
                    return self.not_placed(Unplaced::ResizeMarker {
                        slot: self.head,
                        count: n,
                        max: self.max_count,
                    });
                }
                let stamp = read_word(self.geo.stamp_offset(self.head, 1));
                if stamp != stamp_for(self.head) {
                    return self.not_placed(Unplaced::Stamp {
                        slot: self.head,
                        what: StampOf::Resize,
                        stamp,
                        expected: stamp_for(self.head),
                    });
                }
                self.head += 1;
                if n < self.geo.slot_count() {
                    self.shrunk = Some(n as usize * self.geo.slot_size());
                }
                self.geo = Geometry::new(self.geo.slot_size(), n);
                self.flush_slots = super::flush_slots(n);
                self.resizes += 1;
                // The sender waits for this head before writing on.
                self.push_pending = true;
                continue;
            }
            if h.flags & !FLAG_GAP != 0 {
                return self.not_placed(Unplaced::Flags {
                    slot: self.head,
                    flags: h.flags,
                });
            }
            if h.flags & FLAG_GAP != 0 {
                let gap = self.geo.slot_count() - idx;
                if idx == 0 || h.len != 0 || gap > avail {
                    return self.not_placed(Unplaced::GapMarker {
                        slot: self.head,
                        len: h.len,
                        avail,
                    });
                }
                let stamp = read_word(self.geo.stamp_offset(self.head, gap));
                if stamp != stamp_for(self.head) {
                    return self.not_placed(Unplaced::Stamp {
                        slot: self.head,
                        what: StampOf::Gap,
                        stamp,
                        expected: stamp_for(self.head),
                    });
                }
                self.head += gap;
                continue;
            }
            let len = h.len as usize;
            let slots = (OVERHEAD + len).div_ceil(self.geo.slot_size()) as u64;
            if len > self.geo.max_payload() || slots > avail || idx + slots > self.geo.slot_count()
            {
                return self.not_placed(Unplaced::Length {
                    slot: self.head,
                    len,
                    avail,
                });
            }
            let stamp = read_word(self.geo.stamp_offset(self.head, slots));
            if stamp != stamp_for(self.head) {
                return self.not_placed(Unplaced::Stamp {
                    slot: self.head,
                    what: StampOf::Message(len),
                    stamp,
                    expected: stamp_for(self.head),
                });
            }
            self.unplaced = None;
            return Ok(Some(Message {
                pos: self.head,
                offset: self.geo.offset(self.head) + HEADER_LEN,
                len,
                slots,
            }));
        }
        self.not_placed(Unplaced::Markers { slot: self.head })
    }

    /// Releases the message returned by [`poll_recv`](Self::poll_recv):
    /// advances `head` and schedules a lazy push every `gamma` messages
    /// (Algorithm 1 lines 21-24), or once [`super::flush_slots`] slots were
    /// consumed since the last push (large messages).
    ///
    /// # Panics
    /// If `msg` is not the message at the head.
    pub fn release(&mut self, msg: Message) {
        assert_eq!(
            msg.pos, self.head,
            "released a message that is not at the head"
        );
        self.head += msg.slots;
        self.largest = self.largest.max(msg.slots);
        self.unpushed += 1;
        if self.unpushed >= self.gamma || self.head - self.synced_head >= self.flush_slots {
            self.push_pending = true;
        }
    }

    /// Whether a receiver about to wait for data should push its head before the wait, not
    /// only if the wait goes to sleep: the sender's view of the ring (the slots this side
    /// read and has not pushed) may be too full for a message as large as the largest
    /// released so far, written where it needs the most room (a message never wraps, so up
    /// to its size less one slot of gap comes first). A ping-pong of messages small next to
    /// the ring never owes one; a stream of messages of half the ring or more always does.
    /// A message larger than any before may still find the ring full until the push.
    pub fn push_owed_before_wait(&self) -> bool {
        let unpushed = self.head - self.synced_head;
        unpushed > 0 && unpushed + 2 * self.largest > self.geo.slot_count()
    }

    /// Requests a head push now if the sender has not seen the latest head.
    pub fn flush(&mut self) {
        if self.head != self.synced_head {
            self.push_pending = true;
        }
    }

    /// The next head push to post, if one is owed and the send-queue budget allows.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<HeadPush> {
        if !(self.push_pending || self.confirm) || self.closed.is_closed() {
            return None;
        }
        if self.head == self.synced_head && !self.confirm {
            self.push_pending = false;
            return None;
        }
        if self.budget.is_full() {
            return None;
        }
        let (seq, signaled) = if self.confirm {
            (self.budget.next_signaled(), true)
        } else {
            self.budget.next()
        };
        if signaled {
            self.last_signaled = Some(seq);
        }
        self.confirm = false;
        self.push_pending = false;
        self.unpushed = 0;
        self.synced_head = self.head;
        self.pushes += 1;
        Some(HeadPush {
            value: self.head,
            wr_id: self.budget.wr_id(seq),
            signaled,
        })
    }

    /// A signaled head push completed (it and all earlier ones are done).
    pub fn handle_completion(&mut self, wr_id: u64) {
        let ours = self.budget.complete(wr_id);
        debug_assert!(
            ours,
            "completion {wr_id:#x} was never posted by this receiver"
        );
    }
}
