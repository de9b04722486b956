//! A lane's liveness without a descriptor: a flag set once when the lane
//! ends (its peer closed it, its shared connection failed, or it was
//! closed here), which wakes every task watching it.
//!
//! A dedicated connection's liveness is its side channel's fd, readable
//! when the peer leaves; a watcher (the poller's registrations, a
//! `peer_gone` future) duplicates it and registers the duplicate with its
//! reactor. A lane has no side channel of its own: giving it one (a socket
//! pair) cost, per lane and both ends, the pair, a duplicate and an
//! `epoll_ctl` add and delete per watcher, and their closes (26 of the 81
//! system calls of a lane connect and close). The lane reader, which sees
//! the lane end on the shared side channel, ends its [`Liveness`] instead:
//! one flag and one wake-up per watcher, no system call.
//!
//! Each watcher ([`LivenessWatch`]) has a slot for its task's waker; a
//! poll stores the waker, then looks at the flag; [`Liveness::end`] sets
//! the flag, then wakes what the slots hold. Either the poll sees the flag
//! or the end sees the waker (both under the slots' lock): no wake-up is
//! lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// A watcher's place in a [`Liveness`].
#[derive(Debug, Default)]
struct Slot {
    taken: bool,
    waker: Option<Waker>,
}

/// A lane's liveness (module docs).
#[derive(Debug, Default)]
pub struct Liveness {
    gone: AtomicBool,
    /// A slot per watcher: whether a watcher holds it, and its task's
    /// waker once it polled.
    slots: Mutex<Vec<Slot>>,
}

impl Liveness {
    /// A new liveness, not ended.
    pub fn new() -> Arc<Liveness> {
        Arc::new(Liveness::default())
    }

    fn slots(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the lane ended (no system call, no lock).
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Ends it: every watcher's task is woken, and every poll from now on
    /// is ready. Idempotent.
    pub fn end(&self) {
        if self.gone.swap(true, Ordering::AcqRel) {
            return;
        }
        let wakers: Vec<Waker> = self
            .slots()
            .iter_mut()
            .filter_map(|s| s.waker.take())
            .collect();
        for w in wakers {
            w.wake();
        }
    }

    /// A new watcher, with a waker slot of its own (so that the tasks of
    /// two watchers, a receive and a send, are both woken).
    pub fn watch(self: &Arc<Self>) -> LivenessWatch {
        let mut slots = self.slots();
        // Reuse a slot a dropped watcher left.
        let slot = match slots.iter().position(|s| !s.taken) {
            Some(i) => i,
            None => {
                slots.push(Slot::default());
                slots.len() - 1
            }
        };
        slots[slot] = Slot {
            taken: true,
            waker: None,
        };
        drop(slots);
        LivenessWatch {
            live: self.clone(),
            slot,
        }
    }
}

/// One watcher of a [`Liveness`]: [`Self::poll_gone`] is ready once the
/// lane ended. Dropping it frees its slot.
#[derive(Debug)]
pub struct LivenessWatch {
    live: Arc<Liveness>,
    slot: usize,
}

impl LivenessWatch {
    /// Whether the lane ended.
    pub fn is_gone(&self) -> bool {
        self.live.is_gone()
    }

    /// Ready once the lane ended; else `cx`'s waker is woken when it ends.
    pub fn poll_gone(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.live.is_gone() {
            return Poll::Ready(());
        }
        {
            let mut slots = self.live.slots();
            if let Some(s) = slots.get_mut(self.slot) {
                match &s.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => s.waker = Some(cx.waker().clone()),
                }
            }
        }
        // Stored before this look (the lock orders both with `end`).
        if self.live.is_gone() {
            return Poll::Ready(());
        }
        Poll::Pending
    }

    /// Waits until the lane ended.
    pub async fn gone(&self) {
        std::future::poll_fn(|cx| self.poll_gone(cx)).await;
    }
}

impl Drop for LivenessWatch {
    fn drop(&mut self) {
        if let Some(s) = self.live.slots().get_mut(self.slot) {
            *s = Slot::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    /// Every watcher that polled is woken once when the lane ends, and is
    /// ready from then on; a watcher made after the end is ready at once.
    #[test]
    fn ending_wakes_every_watcher_once() {
        let live = Liveness::new();
        let (a, b) = (live.watch(), live.watch());
        let (ca, wa) = counter();
        let (cb, wb) = counter();
        assert!(a.poll_gone(&mut Context::from_waker(&wa)).is_pending());
        assert!(b.poll_gone(&mut Context::from_waker(&wb)).is_pending());
        // Polled again with the same waker: still one slot, one wake.
        assert!(a.poll_gone(&mut Context::from_waker(&wa)).is_pending());
        assert!(!live.is_gone());
        live.end();
        live.end();
        assert_eq!(ca.0.load(Ordering::SeqCst), 1);
        assert_eq!(cb.0.load(Ordering::SeqCst), 1);
        assert!(a.poll_gone(&mut Context::from_waker(&wa)).is_ready());
        assert!(b.is_gone());
        let late = live.watch();
        assert!(late.poll_gone(&mut Context::from_waker(&wa)).is_ready());
    }

    /// A dropped watcher's slot is reused and woken for its new watcher
    /// only; the old waker is not woken.
    #[test]
    fn a_dropped_watcher_is_not_woken() {
        let live = Liveness::new();
        let a = live.watch();
        let (ca, wa) = counter();
        assert!(a.poll_gone(&mut Context::from_waker(&wa)).is_pending());
        drop(a);
        let b = live.watch();
        let (cb, wb) = counter();
        assert!(b.poll_gone(&mut Context::from_waker(&wb)).is_pending());
        assert_eq!(live.slots().len(), 1, "the slot was reused");
        live.end();
        assert_eq!(ca.0.load(Ordering::SeqCst), 0);
        assert_eq!(cb.0.load(Ordering::SeqCst), 1);
    }

    /// An end racing a poll on another thread: either the poll is ready or
    /// its waker is woken, never neither (a lost wake-up is a task asleep
    /// for good on a lane that ended).
    #[test]
    fn no_wake_up_is_lost_to_a_race() {
        for _ in 0..2000 {
            let live = Liveness::new();
            let w = live.watch();
            let (c, waker) = counter();
            let l2 = live.clone();
            let t = std::thread::spawn(move || l2.end());
            let ready = w.poll_gone(&mut Context::from_waker(&waker)).is_ready();
            t.join().unwrap();
            assert!(ready || c.0.load(Ordering::SeqCst) == 1);
        }
    }
}
