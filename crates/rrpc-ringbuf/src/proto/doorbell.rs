//! The doorbell fallback's protocol (sans-IO): a reader about to sleep tells
//! the writer, which then rings once.
//!
//! # Why
//! A reader that spins (or has a polling thread spin for it) learns of a new
//! tail without any system call, at the price of a core. A reader that
//! sleeps must be woken: by a `WRITE_WITH_IMM` whose receive completion
//! fires the queue pair's completion channel (verbs), or the shm provider's
//! equivalent (an eventfd the `post` writes). Ringing costs the writer a
//! second work request and the reader a kernel wake-up, so the writer rings
//! only while the reader says it sleeps.
//!
//! # The sleep word
//! Each receive region carries an 8-byte *sleep word* at
//! [`LOCAL_SLEEP_OFFSET`](crate::LOCAL_SLEEP_OFFSET), written by the peer's
//! receiver (one 8-byte WRITE) and read by our sender. Its value is
//! `epoch << 1 | 1` once the receiver announced its `epoch`-th sleep, 0
//! before the first. The receiver never clears it: the writer rings at most
//! once per epoch ([`Ringer::after_tail`]), so a stale word costs nothing
//! once rung, and an awake reader need not spend a WRITE to say so.
//!
//! # No lost wake-up
//! The reader: announce (a new epoch; on verbs, wait for the WRITE's
//! completion, so the word is in the writer's memory), arm the completion
//! channel, then check the ring once more before it sleeps. The writer:
//! publish the tail, then read the word; ring if it shows an epoch not rung
//! yet. In one memory with sequentially consistent stores and loads (shm,
//! `SeqCst` fences on both sides) this is Dekker's protocol: either the
//! reader's re-check sees the tail or the writer's read sees the epoch, so a
//! reader never sleeps on a published message. The property test in this
//! module checks it over random interleavings.
//!
//! On verbs the two stores travel in opposite directions over the network,
//! and a tail WRITE still in flight when the writer read the word (which
//! the reader's announce had not reached yet) may also miss the reader's
//! re-check. The caller therefore keeps a bounded backstop: the poller's
//! dozing threads rescan armed connections every `idle_poll_interval`, so
//! that window costs at most that latency, never a hang.
//!
//! Garbage in the word (a hostile or broken peer) makes us ring when the
//! peer did not ask (at most once per distinct value): a `WRITE_WITH_IMM`
//! the peer must have a receive for, or its own queue pair fails. Nothing
//! it writes there reaches another connection.

/// The sleep word for `epoch` (at least 1).
pub fn sleep_word(epoch: u64) -> u64 {
    (epoch << 1) | 1
}

/// Whether `word` says "the reader sleeps" (any odd value).
pub fn says_asleep(word: u64) -> bool {
    word & 1 == 1
}

/// The reader's side: numbers its sleeps.
#[derive(Debug, Default, Clone)]
pub struct Sleeper {
    epoch: u64,
}

impl Sleeper {
    /// A reader that has never slept (the word it shows is 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the next sleep: the word to write into the writer's memory
    /// before the final re-check.
    pub fn announce(&mut self) -> u64 {
        self.epoch += 1;
        sleep_word(self.epoch)
    }

    /// Sleeps announced so far.
    pub fn epochs(&self) -> u64 {
        self.epoch
    }
}

/// The writer's side: rings at most once per announced sleep.
#[derive(Debug, Default, Clone)]
pub struct Ringer {
    rung: u64,
    rings: u64,
}

impl Ringer {
    /// A writer that has rung for nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Call after publishing a tail, with the sleep word read after it
    /// (behind a `SeqCst` fence): `true` means ring now.
    pub fn after_tail(&mut self, word: u64) -> bool {
        if self.owes(word) {
            self.rung = word;
            self.rings += 1;
            true
        } else {
            false
        }
    }

    /// Whether `word` shows a sleep not rung yet (what
    /// [`after_tail`](Self::after_tail) would ring for), without recording
    /// a ring: a driver that cannot ring right now asks again after the
    /// next tail.
    pub fn owes(&self, word: u64) -> bool {
        says_asleep(word) && word != self.rung
    }

    /// Doorbells rung so far.
    pub fn rings(&self) -> u64 {
        self.rings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rings_once_per_epoch_and_never_for_an_awake_reader() {
        let mut s = Sleeper::new();
        let mut r = Ringer::new();
        assert!(!r.after_tail(0), "a reader that never slept is awake");
        let w = s.announce();
        assert!(r.after_tail(w));
        assert!(!r.after_tail(w), "the same sleep is rung once");
        let w2 = s.announce();
        assert_ne!(w, w2);
        assert!(r.after_tail(w2));
        assert!(!r.after_tail(w2 & !1), "an even word is awake");
        assert_eq!((r.rings(), s.epochs()), (2, 2));
    }

    /// One step of either side, run atomically; the interleaving is the
    /// proptest's input. The memory is sequentially consistent (shm with
    /// `SeqCst` fences between each side's store and load).
    #[derive(Debug, Default)]
    struct World {
        // Shared memory.
        tail: u64,
        word: u64,
        bell: u64,
        // The writer: publishes `to_send` messages one by one.
        to_send: u64,
        w_pc: u8,
        ringer: Ringer,
        // The reader.
        head: u64,
        r_pc: u8,
        sleeper: Sleeper,
        bells_seen: u64,
    }

    impl World {
        fn writer_step(&mut self) {
            match self.w_pc {
                0 if self.to_send > 0 => {
                    self.tail += 1; // publish a tail
                    self.to_send -= 1;
                    self.w_pc = 1;
                }
                1 => {
                    if self.ringer.after_tail(self.word) {
                        self.bell += 1;
                    }
                    self.w_pc = 0;
                }
                _ => {}
            }
        }

        /// 0: poll; 1: announce; 2: re-check; 3: asleep until a bell.
        fn reader_step(&mut self) {
            match self.r_pc {
                0 => {
                    if self.tail > self.head {
                        self.head = self.tail;
                    } else {
                        self.r_pc = 1;
                    }
                }
                1 => {
                    self.word = self.sleeper.announce();
                    self.r_pc = 2;
                }
                2 => {
                    if self.tail > self.head {
                        self.head = self.tail;
                        self.r_pc = 0;
                    } else {
                        self.r_pc = 3;
                    }
                }
                3 => {
                    if self.bell > self.bells_seen {
                        self.bells_seen = self.bell;
                        self.r_pc = 0;
                    }
                }
                _ => unreachable!(),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Whatever the interleaving, once the writer is done and the
        /// reader has run to quiescence, the reader has every message: it
        /// never sleeps with a published message unseen and no bell coming.
        #[test]
        fn no_lost_wakeup_under_any_interleaving(
            messages in 1u64..6,
            schedule in proptest::collection::vec(any::<bool>(), 0..80),
        ) {
            let mut w = World { to_send: messages, ..World::default() };
            for writer in schedule {
                if writer { w.writer_step() } else { w.reader_step() }
            }
            // The writer finishes; then the reader runs until it sleeps.
            while w.to_send > 0 || w.w_pc != 0 {
                w.writer_step();
            }
            for _ in 0..16 {
                w.reader_step();
            }
            prop_assert_eq!(w.r_pc, 3, "the reader ends asleep");
            prop_assert_eq!(w.head, messages, "and with every message");
            // Rings are bounded by the sleeps announced.
            prop_assert!(w.ringer.rings() <= w.sleeper.epochs());
        }
    }

    /// The control: a writer that reads the word *before* publishing (the
    /// order Dekker forbids) loses a wake-up on some interleaving, so the
    /// model above can tell a right order from a wrong one.
    #[test]
    fn the_model_catches_the_wrong_order() {
        // Writer reads the word (reader awake: no ring), reader announces
        // and re-checks (nothing yet) and sleeps, writer publishes.
        let mut w = World {
            to_send: 1,
            ..World::default()
        };
        let ring = w.ringer.after_tail(w.word); // read first: awake
        w.reader_step(); // poll: empty
        w.reader_step(); // announce
        w.reader_step(); // re-check: empty -> asleep
        w.tail += 1; // publish after the read
        w.to_send = 0;
        assert!(!ring);
        for _ in 0..16 {
            w.reader_step();
        }
        assert_eq!(w.r_pc, 3);
        assert_eq!(w.head, 0, "wrong order: asleep with a message unseen");
    }
}
