//! One side's share of the ring's send queue, shared by the sender and the
//! receiver: sequence numbers for its work requests, which of them are
//! signaled, and how many may be outstanding.
//!
//! An RC queue pair completes in order, so one signaled completion retires
//! every earlier request: a side signals every `max / 2`-th request and may
//! have `max` outstanding, never more than its share of the send depth
//! ([`RingConfig::send_queue_need`](crate::RingConfig::send_queue_need)).

use super::WR_SEQ_MASK;

#[derive(Debug, Clone)]
pub(crate) struct SqBudget {
    /// The `WR_KIND_*` bits of this side's work request ids.
    kind: u64,
    max_outstanding: u64,
    signal_every: u64,
    next_seq: u64,
    /// Requests before this one completed.
    done_seq: u64,
    last_signaled: u64,
}

impl SqBudget {
    pub(crate) fn new(kind: u64, max_outstanding: u32) -> SqBudget {
        let max_outstanding = u64::from(max_outstanding);
        SqBudget {
            kind,
            max_outstanding,
            signal_every: (max_outstanding / 2).max(1),
            next_seq: 0,
            done_seq: 0,
            last_signaled: 0,
        }
    }

    /// Whether request `seq` may be posted now.
    pub(crate) fn admits(&self, seq: u64) -> bool {
        seq < self.done_seq + self.max_outstanding
    }

    /// Whether the next request must wait for a completion.
    pub(crate) fn is_full(&self) -> bool {
        !self.admits(self.next_seq)
    }

    /// Numbers the next request; signaled if it is `signal_every` past the
    /// last signaled one. Returns its sequence number and whether it is
    /// signaled.
    pub(crate) fn next(&mut self) -> (u64, bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let signaled = seq - self.last_signaled >= self.signal_every;
        if signaled {
            self.last_signaled = seq;
        }
        (seq, signaled)
    }

    /// Numbers the next request, which is signaled whatever the count.
    pub(crate) fn next_signaled(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.last_signaled = seq;
        seq
    }

    /// The work request id of request `seq`.
    pub(crate) fn wr_id(&self, seq: u64) -> u64 {
        self.kind | seq
    }

    /// Requests before this one completed.
    pub(crate) fn done_seq(&self) -> u64 {
        self.done_seq
    }

    /// Requests numbered so far (the next one's sequence number).
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// A signaled request completed: it and every earlier one are done.
    /// Completions may come late or out of order (stale ones change
    /// nothing). Returns false for an id this side never posted.
    pub(crate) fn complete(&mut self, wr_id: u64) -> bool {
        let seq = wr_id & WR_SEQ_MASK;
        if wr_id & !WR_SEQ_MASK != self.kind || seq >= self.next_seq {
            return false;
        }
        self.done_seq = self.done_seq.max(seq + 1);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::WR_KIND_TX;
    use super::*;

    #[test]
    fn signals_every_half_budget_and_blocks_at_the_budget() {
        let mut b = SqBudget::new(WR_KIND_TX, 4);
        let got: Vec<_> = (0..4).map(|_| b.next()).collect();
        assert_eq!(got, [(0, false), (1, false), (2, true), (3, false)]);
        assert!(b.is_full(), "four outstanding");
        assert!(!b.complete(b.wr_id(4)), "never posted");
        assert!(!b.complete(2 << 56 | 1), "another side's id");
        assert!(b.complete(b.wr_id(2)));
        assert_eq!(b.done_seq(), 3);
        assert!(!b.is_full());
        assert!(b.complete(b.wr_id(0)), "a stale completion is ours");
        assert_eq!(b.done_seq(), 3, "and retires nothing");
        assert_eq!(b.next_signaled(), 4);
        assert_eq!(b.next(), (5, false), "counted from the forced signal");
    }
}
