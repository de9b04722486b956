//! Connection management for rrpc: the component that notices "this connection has new
//! messages" and wakes the tokio task that reads them (RR-Compound §IV-B..E, Algorithms 1–2).
//!
//! # Contents
//! - [`Mode`]: the four methods `Bp`, `Bpts`, `Event`, `Bpev` (default), and how each maps onto
//!   the paper (below).
//! - [`PollerConfig`] → [`Poller`]: owns the polling threads; [`Poller::register`] takes any
//!   [`Readiness`] source and returns a [`Registration`] whose async
//!   [`wait_ready`](Registration::wait_ready) is the only thing a reader task calls.
//! - [`Doorbell`]: the writer-side wake-up of an `Event`-mode source that has no [`Notifier`]
//!   of its own (a custom [`Readiness`]; rrpc's rings bring their own notifiers).
//! - [`Notifier`]: a source's own completion channel (verbs-style) for `Event` mode.
//! - [`SpinTuner`]: sans-IO tuning of a task's spin: `bp_timeout` from a moving RTT estimate,
//!   and no spin while its spins rarely catch data.
//! - [`backoff`]: sans-IO decisions of when a polling thread stops spinning (descheduled, or
//!   not earning), tested on a virtual clock.
//! - [`rings`]: [`rings::AsyncConn`] over an rrpc-ringbuf ring pair and an rrpc-core connection,
//!   split into [`rings::AsyncSender`] / [`rings::AsyncReceiver`], or with
//!   [`split_managed`](rings::AsyncConn::split_managed) into a [`rings::ManagedSender`] whose
//!   completion progress and ring-sizing tick the poller runs (what the tonic layer uses: it
//!   names no ring type on its data path).
//! - [`Stats`]: counters (polls, empty polls, eventfd writes, wake-ups, spin hits, parks).
//! - [`report`]: the same counters and each polling thread's busy fraction in the `metrics`
//!   facade, for operators' dashboards ([`Poller::report_metrics`]).
//!
//! # The modes and the paper
//!
//! | mode | paper | who detects data | how the task is woken | CPU when idle |
//! |---|---|---|---|---|
//! | [`Mode::Bp`] | Fig. 7 (b) left; Figs. 4–6 "busy-polling" | one dedicated thread per connection | `Waker::wake` | one spinning thread per connection (parks with `idle_park_after`) |
//! | [`Mode::Bpts`] | Algorithm 1, Fig. 7 (b) right | `polling_threads` threads, round-robin over their connections | `Waker::wake` | `polling_threads` spinning threads (parks with `idle_park_after`) |
//! | [`Mode::Event`] | Fig. 7 (c), "RDMA-Event" | the writer ([`Doorbell`], or `WRITE_WITH_IMM` + completion channel via [`Notifier`]) | eventfd / channel fd in the tokio reactor (epoll) | none |
//! | [`Mode::Bpev`] | Algorithm 2, Fig. 7 (d) | `polling_threads` threads scan every *armed* connection; a spinning task also scans its neighbours (16 per yield, round-robin); a dozing thread hands its connections to the writers' doorbells | `Waker::wake`, after the task spun up to `bp_timeout`; the doorbell's fd in the reactor while the thread dozes | parked threads: a rescan every `idle_poll_interval` while connections are armed, nothing otherwise |
//!
//! ## What differs on tokio
//! - The paper's "working threads" that call `epoll_wait` are tokio worker threads. Algorithm
//!   2's `WaitEvents` busy-poll (lines 16–26) becomes the spin at the start of
//!   [`Registration::wait_ready`]: the task checks its own connection, and at every yield
//!   point (after 1 µs, then every 5 µs) it also scans the armed connections of its polling
//!   shard and wakes those with data, as the paper's working thread polls all of its
//!   connections. It stops spinning as soon as a yield shows that other tasks on its worker
//!   had work (the working thread has events to handle) and then arms.
//! - How a polling thread wakes a task (measured, see `benches/src/bin/poller.rs`): BPEV
//!   calls the task's `Waker`, not a per-connection eventfd. The paper's eventfd + `epoll`
//!   path exists in tokio only as the reactor's own wake-up: a `Waker` called while the worker
//!   sleeps in `epoll_wait` writes tokio's eventfd, which is the same kernel path the paper
//!   takes; a `Waker` called while the worker is busy is a queue push with no system call,
//!   where a connection eventfd would still cost a write, an `epoll_wait` and a read. The
//!   per-connection eventfd remains in [`Mode::Event`], where the writer rings it
//!   ([`Doorbell`]).
//! - BP and BPTS in the paper make the working thread itself poll; here polling threads wake
//!   the task's `Waker` directly, which is the closest tokio equivalent (a tokio task cannot
//!   own a core). BP has one thread per connection: [`rings::AsyncConn::split`] registers the
//!   send direction as a [`sibling`](Registration::register_sibling) of the receive one.
//! - Polling threads only look at *armed* connections (a task that found nothing and is about
//!   to sleep). A task that is processing or spinning costs the polling threads nothing.
//!   After a scan that woke a task a polling thread yields its core once, so a worker queued
//!   on the same core runs at once.
//! - Arm-then-recheck (see [`poller`](crate::Poller) internals): the task sets `armed`, fences,
//!   and checks once more before sleeping; the waker side checks data, then wins `armed` with a
//!   swap before it calls the waker or writes the eventfd. No wake-up is lost and none is
//!   doubled.
//!
//! ## Beyond the paper (its §V-D future work)
//! - **The doorbell fallback** (default; [`PollerConfig::doorbell_park_after`]). A polling
//!   thread whose armed connections all have a doorbell ([`Readiness::doorbell`]; rings over
//!   rrpc-ringbuf do, through [`rings::AsyncConn`]) dozes after 100 µs without data instead of
//!   2 ms. Before it parks it announces each armed reader's sleep to the writer (a sleep word
//!   the writer reads after each tail, `rrpc_ringbuf::proto::doorbell`), checks once more, and
//!   the writer rings once per announced sleep: a `WRITE_WITH_IMM` whose receive completion
//!   wakes the reader's completion channel, which the task watches in the tokio reactor beside
//!   its waker. A reader that spins again costs the writer nothing. On shm no wake-up is lost
//!   (Dekker across one memory, property-tested over interleavings); on verbs a tail crossing
//!   the announce on the wire can miss both, and the dozing rescan bounds that. With every
//!   armed sleep announced the rescans stretch (doubling up to 64 × `idle_poll_interval`), so
//!   256 idle connections cost 0.2 % of a core (rpc suite, `idle_connections`). Counters:
//!   [`Stats::announces`], [`Stats::bell_wakes`].
//! - **Spin back-off** (default; [`PollerConfig::spin_backoff`]). Spinning pays only while it
//!   catches data and holds a core. A task skips its spin while fewer than 1 in 8 of its spins
//!   caught data within 50 µs (a later catch cost more CPU than the wake-up it saved; a spin
//!   that ran out counts as a miss only when the data came at least 4 budgets and 500 µs
//!   after the wait began; one probe spin in 16 waits; judged apart for
//!   each phase, the waits begun since this end last sent: a reply's wait is not an idle
//!   one), and cuts a spin short when a gap of 20 µs
//!   between two of its clock reads shows it was descheduled ([`SpinTuner`]). A spin that
//!   stopped because the worker's other tasks had work is a miss too: with many clients on
//!   few cores a connection's spin only delays its neighbours, so it stops spinning and arms
//!   at once (Fig. 8 (a) at 256 clients, 3 alternating runs: 0.50-0.56 -> 0.89-1.00 of the
//!   best mode; docs/measured.md). A polling thread
//!   measures each 1 ms window of spinning (run-queue delay from
//!   `/proc/thread-self/schedstat`, else wall minus CPU time; readers woken) and each spin
//!   episode (resume to doze); when it lost over 30 % of a window (its `sched_yield`s to the
//!   worker it woke are excused, up to 50 µs each: #58), woke fewer than 2 readers
//!   in one, or fewer than 1 in 8 of its episodes earned (woke readers for under 10 µs of
//!   spin each, about what their doorbells cost), it backs off for 4 ms, doubling
//!   up to 128 ms ([`backoff::Governor`]). Backed off, it dozes as soon as its armed
//!   connections all have doorbells, and their tasks announce their own sleeps instead of
//!   kicking it where an announce misses nothing (shm; one futex wake saved per sleep). So
//!   do waits whose own spin backed off because their data was far (at least 500 µs and 4
//!   budgets: a server between requests at low load, [`SpinTuner::leaves_thread`]); a spin
//!   backed off for a busy worker or replies a little past it still kicks the thread (#58).
//!   Counters: [`Stats::spin_skips`],
//!   [`Stats::lost_core_spins`], [`Stats::busy_worker_spins`],
//!   [`Stats::backoffs_descheduled`],
//!   [`Stats::backoffs_not_earning`], [`Stats::self_announces`].
//! - **Busy worker: yield before sleeping** (BPEV). A wait whose spin found nothing (or was
//!   skipped) while its worker was last seen busy with other connections (a yield of its
//!   spin saw other waits on the worker complete) does not arm a sleep at once: it yields to
//!   the worker's other tasks and looks again when they had their turn, up to 16 times while
//!   their waits keep completing, then sleeps as any other wait. Nothing is armed or
//!   announced meanwhile (the task is in the run queue), so a wait that its data meets on one
//!   of those turns costs no doorbell (a system call at each end) and no wake-up: with many
//!   clients on few cores most sleeps were announced by the task itself, its polling thread
//!   backed off for competing with the workers. A worker with one connection, or one at low
//!   load, waits as before. Counter: [`Stats::busy_yield_hits`].
//! - **One CPU: hand off, never spin** (default; [`PollerConfig::handoff`], [`Handoff`]). When
//!   the process may run on one CPU only (`taskset -c N`, a one-CPU container: the union
//!   of its threads' affinity masks, capped by the cgroup's limits) and a connection's peer
//!   needs that same CPU (it is this process, or a process on this host confined to that CPU, by
//!   `SO_PEERCRED` and its mask), every spin only delays the answer. That connection's waits
//!   then never spin: each yields first (the worker's other tasks, up to 4 turns while this
//!   end has sent nothing since the data it last returned, then the CPU; a wait that follows
//!   this end's own send gives the CPU to the peer first, its worker's turn only if no answer
//!   came, at most 8 waits in a row; a peer that answers meanwhile rings nothing,
//!   [`Stats::yield_hits`]), then is announced to the writer and
//!   woken by its doorbell, one wake-up ([`Registration::hands_off`]; [`Stats::spins`]
//!   stays 0). Processes pinned each to a core
//!   of its own, the benchmarks' layout and HPC's, keep spinning.
//!   Demo under `taskset -c 1`: the fast path's p50 went from 72–126 µs to 11 µs, 0.30 × tonic
//!   over a Unix socket in the same run, the HTTP/2 path's to 26 µs, 0.72 × (docs/measured.md).
//! - **Idle parking.** A polling thread that found nothing for `idle_park_after` parks; a task
//!   that arms resumes it at once, and while parked it still rescans its armed connections
//!   every `idle_poll_interval`, which bounds the extra latency of the first message after an
//!   idle period. The paper's two polling threads use 200 % CPU at idle (Fig. 16);
//!   [`PollerConfig::paper`] turns parking off to reproduce that.
//! - **Auto-tuned `bp_timeout`.** With `auto_tune`, each registration spins
//!   `1.25 × RTT + 1 µs` (moving average, gain 1/8) capped by `bp_timeout`, following §V-B's
//!   guideline "marginally longer than the typical RTT" ([`SpinTuner`]).
//! - **Wake-up latency.** A task woken by a polling thread or a spinning neighbour measures
//!   the time from the `Waker::wake` call to its running ([`Stats::mean_wake_latency`], and
//!   the histogram [`report::WAKE_LATENCY`]).
//! - **Counters, metrics and tracing.** [`Poller::stats`]; the `metrics` facade ([`report`]:
//!   polling threads report about once a second while they run, and before they park);
//!   `tracing` debug events when a polling thread parks, resumes, starts or stops, and when a
//!   registration is closed.
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use rrpc_poller::{Mode, Poller, PollerConfig, Readiness};
//!
//! struct Counter { written: AtomicU64, read: AtomicU64 }
//! impl Readiness for Counter {
//!     fn ready(&self) -> bool {
//!         self.written.load(Ordering::Acquire) > self.read.load(Ordering::Relaxed)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rrpc_poller::Error> {
//! let poller = Poller::start(PollerConfig::builder().mode(Mode::Bpev).polling_threads(1).build()?)?;
//! let src = Arc::new(Counter { written: AtomicU64::new(0), read: AtomicU64::new(0) });
//! let mut reg = poller.register(src.clone())?;
//! let writer = src.clone();
//! std::thread::spawn(move || writer.written.store(1, Ordering::Release));
//! reg.wait_ready().await?;           // spins, then sleeps until the polling thread wakes it
//! src.read.store(1, Ordering::Relaxed);
//! drop(reg);
//! poller.shutdown();                 // joins the polling thread
//! # Ok(()) }
//! ```
// `unsafe` (denied by the workspace): only `sys`'s registration with tokio.

pub mod backoff;
mod config;
mod error;
mod poller;
pub mod report;
pub mod rings;
mod source;
mod stats;
mod sys;
mod tune;

pub use config::{Handoff, Mode, PollerConfig, PollerConfigBuilder};
pub use error::{Error, Result};
pub use poller::{Doorbell, Poller, Registration, SendLog};
pub use source::{Notifier, Readiness};
pub use stats::{Stats, ThreadLoad};
pub use sys::{ReadyGuard, WatchedFd};
pub use tune::{SpinTuner, Waited};
