//! [`Mode`] and the [`PollerConfig`] builder.

use std::time::Duration;

use rrpc_core::numa::NumaPlacement;

use crate::error::{Error, Result};

/// Connection management method (RR-Compound §IV-B..E, Fig. 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Busy polling: one dedicated polling thread per connection (Fig. 7 (b), left; Figs. 4–6).
    /// The thread wakes the task's `Waker` directly.
    Bp,
    /// Busy-polling time-sharing: `polling_threads` threads each scan many connections
    /// round-robin (Algorithm 1, Fig. 7 (b), right) and wake tasks' `Waker`s directly.
    Bpts,
    /// Event-based: no polling thread. The writer rings the reader's eventfd through a
    /// [`Doorbell`](crate::Doorbell), or the source's completion channel fires
    /// ([`Notifier`](crate::Notifier)); the task sleeps in the tokio reactor (Fig. 7 (c)).
    Event,
    /// Busy-polling driven with events (Algorithm 2, Fig. 7 (d)): the task spins up to
    /// `bp_timeout` (checking its connection, and at each yield point the armed connections
    /// of its shard) before it arms and sleeps; `polling_threads` threads scan every armed
    /// connection and wake its task's `Waker` (see the crate docs for why not an eventfd).
    #[default]
    Bpev,
}

impl Mode {
    /// All four modes, in the paper's order.
    pub const ALL: [Mode; 4] = [Mode::Bp, Mode::Bpts, Mode::Event, Mode::Bpev];

    /// Short upper-case name as in the paper ("BP", "BPTS", "EVENT", "BPEV").
    pub fn name(self) -> &'static str {
        match self {
            Mode::Bp => "BP",
            Mode::Bpts => "BPTS",
            Mode::Event => "EVENT",
            Mode::Bpev => "BPEV",
        }
    }

    /// Parses a name as printed by [`Mode::name`], case-insensitively.
    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
    }

    /// Whether waiting tasks are woken through a per-connection eventfd in the tokio reactor
    /// (as opposed to a `Waker` called from a polling thread or a spinning neighbour).
    pub(crate) fn uses_eventfd(self) -> bool {
        matches!(self, Mode::Event)
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// When a poller hands every wait to the writer's doorbell instead of spinning
/// ([`PollerConfigBuilder::handoff`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Handoff {
    /// Per connection, when its peer needs this process's only CPU (the default): the process
    /// may run on one CPU (the union of its threads' affinity masks, or a cgroup quota of one
    /// CPU or less), and the peer is this process, or a process on this host whose threads
    /// may run only on that CPU. A remote peer, or one pinned to another core, is waited for
    /// by spinning. Looked at again every 100 ms of waiting, so that threads pinned or moved
    /// after the connect count.
    #[default]
    Auto,
    /// Always: no spin anywhere, whatever the CPUs (for hosts known to be oversubscribed;
    /// the polling threads stay backed off).
    Always,
    /// Never: spin as configured even on one CPU (the paper's behaviour).
    Never,
}

/// The settings of a [`Poller`](crate::Poller): plain data, which
/// [`Poller::start`](crate::Poller::start) starts a poller with. Defaults
/// follow the paper where it gives one.
///
/// Built like every rrpc config (docs/architecture.md, "Configuration
/// convention"): [`PollerConfig::builder`], setters on
/// [`PollerConfigBuilder`], [`build`](PollerConfigBuilder::build) validates;
/// getters are named after the setting.
///
/// | knob | default | source |
/// |---|---|---|
/// | `mode` | [`Mode::Bpev`] | §IV-D |
/// | `polling_threads` | 2 | §V-A ("two polling threads"), §V-B / Fig. 11: 2–3 suffice |
/// | `bp_timeout` | 20 µs | §V-B / Fig. 13: "marginally longer than the typical RTT"; one shm round trip through tokio measures 5–15 µs here |
/// | `auto_tune` | on | beyond the paper: moving RTT estimate, `bp_timeout` as cap |
/// | `idle_park_after` | 2 ms | beyond the paper (§V-D future work) |
/// | `doorbell_park_after` | 100 µs | beyond the paper (§V-D "sleep mode"): when every armed connection of a polling thread has a doorbell (a ring receiver: the writer rings once the reader announced its sleep, `rrpc_ringbuf::proto::doorbell`), the thread dozes after this much idle time instead of `idle_park_after`, announcing the sleep of each armed connection before it parks, and the task wakes from the doorbell; `None`: plain BPEV |
/// | `spin_backoff` | on | beyond the paper (§V-D future work, "spinning that knows when it is losing"): a task's spin grants nothing while fewer than 1 in 8 of its spins catch data within 50 µs (a spin that ran out is a miss only if the data came 4 budgets and 500 µs after the wait began; one probe spin in 16 waits; judged per phase, the waits begun since this end last sent; [`SpinTuner`](crate::SpinTuner)), and a polling thread that lost over 30 % of a 1 ms window to the run queue (its yields to the worker it woke excused, up to 50 µs each), or woke fewer than 2 readers in it, or whose spin episodes mostly did not earn (under 1 in 8 woke readers for under 10 µs of spin each, about what a doorbell costs both ends), backs off for 4 ms to 128 ms: it dozes and its armed connections are left to their doorbells, and it scans them again when the back-off ends, so a sleep whose ring never came waits no longer than that ([`backoff`](crate::backoff)). Backing off a polling thread needs the doorbell fallback |
/// | `handoff` | [`Handoff::Auto`] | beyond the paper: when a connection's peer needs **this process's only CPU** (the process may run on one CPU, by the union of its threads' affinity masks as `taskset` gives them or by its cgroup quota, and the peer is this process or a process on this host confined to that CPU: `SO_PEERCRED`, then its threads' masks; looked at again every 100 ms of waiting), a spin can only delay the peer it waits for. That connection's waits then never spin: each is announced to the writer and woken by its doorbell, one wake-up ([`Registration::hands_off`](crate::Registration::hands_off)). Processes pinned each to a core of its own keep spinning. In [`Mode::Event`] it drops the receive spin. In BPEV it needs the doorbell fallback for the doorbell; without it the wait sleeps until its polling thread finds the data |
/// | `numa_node` | [`NumaPlacement::Device`] | RB² §IV-C ("bound to the CPU cores of the NUMA node to which the RNIC belongs"): pinned to the device's node once a connection names it ([`Poller::place_for_device`](crate::Poller::place_for_device); from sysfs, nothing on shm) |
/// | `idle_poll_interval` | 3 ms | beyond the paper: rescan period of dozing threads (one thread rescans for all); bounds the extra latency of the first message after an idle period. A rescan costs ~40 µs per 256 armed shm connections here (one cold cache line and TLB entry per ring). While every armed connection's sleep is announced to a doorbell the rescans are only a backstop and stretch, doubling up to 64 × this period: 256 idle connections measured 0.2 % of a core (plain BPEV: 5.4 %) |
/// | `completion_limit` | 30 s | beyond the paper: how long a connection's work may wait on send completions with none coming before the connection is failed (`Error::CompletionOverdue`, the device's fault). A NIC completes a WRITE in microseconds or fails it once its retries run out (with the default `QpConfig`, about half a second); soft-RoCE can stall a queue pair's sends for good when the link goes down under it, and both ends then waited for ever |
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use rrpc_poller::{Mode, Poller, PollerConfig};
/// let cfg = PollerConfig::builder()
///     .mode(Mode::Bpev)
///     .polling_threads(1)
///     .bp_timeout(Duration::from_micros(10))
///     .build()?;
/// let poller = Poller::start(cfg)?;
/// assert_eq!(poller.config().mode(), Mode::Bpev);
/// # Ok::<(), rrpc_poller::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollerConfig {
    mode: Mode,
    polling_threads: usize,
    bp_timeout: Duration,
    auto_tune: bool,
    idle_park_after: Option<Duration>,
    doorbell_park_after: Option<Duration>,
    spin_backoff: bool,
    handoff: Handoff,
    idle_poll_interval: Duration,
    thread_name: String,
    numa_node: NumaPlacement,
    completion_limit: Duration,
}

impl Default for PollerConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Bpev,
            polling_threads: 2,
            bp_timeout: Duration::from_micros(20),
            auto_tune: true,
            idle_park_after: Some(Duration::from_millis(2)),
            doorbell_park_after: Some(Duration::from_micros(100)),
            spin_backoff: true,
            handoff: Handoff::Auto,
            idle_poll_interval: Duration::from_millis(3),
            thread_name: "rrpc-poll".to_owned(),
            numa_node: NumaPlacement::Device,
            completion_limit: Duration::from_secs(30),
        }
    }
}

impl PollerConfig {
    /// A builder starting from the defaults (see the table above).
    pub fn builder() -> PollerConfigBuilder {
        PollerConfigBuilder {
            cfg: Self::default(),
        }
    }

    /// A builder starting from this config, to derive a modified one.
    pub fn to_builder(&self) -> PollerConfigBuilder {
        PollerConfigBuilder { cfg: self.clone() }
    }

    /// The paper's configuration of a mode: no idle parking, no doorbell, no auto-tuning, no
    /// spin back-off, no one-CPU hand-off (what the benchmarks compare against).
    pub fn paper(mode: Mode) -> Self {
        Self {
            mode,
            auto_tune: false,
            idle_park_after: None,
            doorbell_park_after: None,
            spin_backoff: false,
            handoff: Handoff::Never,
            ..Self::default()
        }
    }

    /// The [`completion_limit`](PollerConfigBuilder::completion_limit) setting.
    pub fn completion_limit(&self) -> Duration {
        self.completion_limit
    }

    /// The [`mode`](PollerConfigBuilder::mode) setting.
    pub fn mode(&self) -> Mode {
        self.mode
    }
    /// The [`polling_threads`](PollerConfigBuilder::polling_threads) setting.
    pub fn polling_threads(&self) -> usize {
        self.polling_threads
    }
    /// The [`bp_timeout`](PollerConfigBuilder::bp_timeout) setting (the cap of the tuned value with
    /// auto-tuning).
    pub fn bp_timeout(&self) -> Duration {
        self.bp_timeout
    }
    /// The [`auto_tune`](PollerConfigBuilder::auto_tune) setting.
    pub fn auto_tune(&self) -> bool {
        self.auto_tune
    }
    /// The [`idle_park_after`](PollerConfigBuilder::idle_park_after) setting.
    pub fn idle_park_after(&self) -> Option<Duration> {
        self.idle_park_after
    }
    /// The [`doorbell_park_after`](PollerConfigBuilder::doorbell_park_after) setting (`None`: no doorbell
    /// fallback).
    pub fn doorbell_park_after(&self) -> Option<Duration> {
        self.doorbell_park_after
    }
    /// Whether the doorbell fallback is on: [`Mode::Bpev`], `doorbell_park_after` set, and
    /// idle parking on (a thread that never parks announces nothing).
    pub fn doorbell_fallback(&self) -> bool {
        self.mode == Mode::Bpev
            && self.doorbell_park_after.is_some()
            && self.idle_park_after.is_some()
    }
    /// The [`spin_backoff`](PollerConfigBuilder::spin_backoff) setting.
    pub fn spin_backoff(&self) -> bool {
        self.spin_backoff
    }
    /// The [`handoff`](PollerConfigBuilder::handoff) setting.
    pub fn handoff(&self) -> Handoff {
        self.handoff
    }
    /// The [`idle_poll_interval`](PollerConfigBuilder::idle_poll_interval) setting.
    pub fn idle_poll_interval(&self) -> Duration {
        self.idle_poll_interval
    }
    /// The [`numa_node`](PollerConfigBuilder::numa_node) setting.
    pub fn numa_node(&self) -> NumaPlacement {
        self.numa_node
    }
    /// The [`thread_name`](PollerConfigBuilder::thread_name) setting.
    pub fn thread_name(&self) -> &str {
        &self.thread_name
    }
}

/// Builder for [`PollerConfig`]; every setter documents its range, and
/// [`build`](Self::build) rejects anything outside it. Building starts no
/// thread: [`Poller::start`](crate::Poller::start) does.
#[derive(Debug, Clone)]
pub struct PollerConfigBuilder {
    cfg: PollerConfig,
}

impl PollerConfigBuilder {
    /// Sets the connection management method.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.cfg.mode = mode;
        self
    }

    /// Number of shared polling threads for [`Mode::Bpts`] and [`Mode::Bpev`] (ignored by
    /// `Bp`, which uses one per connection, and `Event`, which uses none).
    ///
    /// `1..=256`, default 2.
    pub fn polling_threads(mut self, n: usize) -> Self {
        self.cfg.polling_threads = n;
        self
    }

    /// How long a task busy-polls its own connection before it arms and sleeps ([`Mode::Bpev`];
    /// Algorithm 2, lines 16–26). Zero makes BPEV purely event-driven (§V-B). With
    /// [`auto_tune`](Self::auto_tune) this is the cap of the tuned value.
    pub fn bp_timeout(mut self, t: Duration) -> Self {
        self.cfg.bp_timeout = t;
        self
    }

    /// Tune the spin time of each connection from a moving estimate of its round-trip time
    /// (`1.25 × RTT`, at most `bp_timeout`).
    pub fn auto_tune(mut self, on: bool) -> Self {
        self.cfg.auto_tune = on;
        self
    }

    /// Park a polling thread when none of its connections had anything for this long
    /// (`None`: never park, the paper's behaviour). A parked thread resumes at the next arm
    /// and otherwise rescans every [`idle_poll_interval`](Self::idle_poll_interval).
    pub fn idle_park_after(mut self, t: Option<Duration>) -> Self {
        self.cfg.idle_park_after = t;
        self
    }

    /// The doorbell fallback ([`Mode::Bpev`] with idle parking on): a polling thread whose
    /// armed connections all have a doorbell ([`Readiness::doorbell`](crate::Readiness::doorbell))
    /// dozes after this much idle time; before it parks it announces each armed connection's
    /// sleep to the writer, and the task wakes from the doorbell, not from a rescan. Dozing threads
    /// still rescan every [`idle_poll_interval`](Self::idle_poll_interval) as a backstop (on
    /// verbs a tail WRITE crossing the announce on the wire can miss both the re-check and the
    /// ring). `None` turns the fallback off: plain BPEV.
    pub fn doorbell_park_after(mut self, t: Option<Duration>) -> Self {
        self.cfg.doorbell_park_after = t;
        self
    }

    /// How long a connection's work (a tail WRITE, messages held back behind
    /// it, a head push) may wait on send completions with none coming
    /// before the connection is failed with [`Error::CompletionOverdue`]
    /// (default 30 s; at least 1 ms). Make it longer than the queue pair's
    /// own retry timeout (`rrpc_core::QpConfig`'s ack timeout and retry
    /// count: a NIC fails a WRITE it cannot deliver by then); it catches a
    /// device that neither completes nor fails them.
    pub fn completion_limit(mut self, t: Duration) -> Self {
        self.cfg.completion_limit = t;
        self
    }

    /// Spinning that backs off when it stops paying (BPEV): a task stops spinning while its
    /// spins rarely catch data or lose their core, and a polling thread that is descheduled or
    /// wakes too few readers dozes for a while and leaves its connections to their doorbells
    /// (the latter only with the [doorbell fallback](Self::doorbell_park_after)). `false`:
    /// spin every time, as the paper does.
    pub fn spin_backoff(mut self, on: bool) -> Self {
        self.cfg.spin_backoff = on;
        self
    }

    /// When a wait is handed to the writer's doorbell instead of spinning (in BPEV the
    /// doorbell needs the [doorbell fallback](Self::doorbell_park_after); [`Mode::Event`]
    /// drops its receive spin). Default [`Handoff::Auto`]: on each connection whose peer
    /// needs this process's only CPU, where a spin only delays the answer;
    /// [`Handoff::Always`] also keeps the polling threads backed off for good.
    pub fn handoff(mut self, h: Handoff) -> Self {
        self.cfg.handoff = h;
        self
    }

    /// Rescan period of a parked polling thread that still has armed connections. Bounds the
    /// extra latency of the first message after an idle period.
    /// More than zero and at most one second; default 3 ms.
    pub fn idle_poll_interval(mut self, t: Duration) -> Self {
        self.cfg.idle_poll_interval = t;
        self
    }

    /// Name prefix of the polling threads (default `rrpc-poll`).
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.cfg.thread_name = name.into();
        self
    }

    /// Where the polling threads run (RB² §IV-C, [`rrpc_core::numa`]):
    /// pinned to the CPUs of a NUMA node, within the CPUs the thread that
    /// starts the poller may use (a `taskset` is narrowed, never widened).
    /// Default [`NumaPlacement::Device`]: the node of the first device a
    /// connection reports through
    /// [`Poller::place_for_device`](crate::Poller::place_for_device) (the
    /// verbs device's `numa_node` in sysfs), nothing before that, on shm,
    /// or for a device without one. [`NumaPlacement::Node`] pins them from
    /// the start, whatever the device; [`NumaPlacement::Off`] never pins.
    pub fn numa_node(mut self, placement: NumaPlacement) -> Self {
        self.cfg.numa_node = placement;
        self
    }

    /// Validates and returns the config.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting and its range: unless
    /// `polling_threads` is in `1..=256` and `idle_poll_interval` in
    /// `(0, 1 s]`.
    pub fn build(self) -> Result<PollerConfig> {
        let c = self.cfg;
        if c.polling_threads == 0 || c.polling_threads > 256 {
            return Err(Error::InvalidConfig("polling_threads must be in 1..=256"));
        }
        if c.idle_poll_interval.is_zero() || c.idle_poll_interval > Duration::from_secs(1) {
            return Err(Error::InvalidConfig(
                "idle_poll_interval must be in (0, 1 s]",
            ));
        }
        if c.completion_limit < Duration::from_millis(1) {
            return Err(Error::InvalidConfig(
                "completion_limit must be at least 1 ms",
            ));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_checks_the_ranges() {
        let b = PollerConfig::builder;
        assert_eq!(b().build().unwrap(), PollerConfig::default());
        let err = |b: PollerConfigBuilder| b.build().unwrap_err().to_string();
        assert!(err(b().polling_threads(0)).contains("polling_threads must be in 1..=256"));
        assert!(err(b().polling_threads(257)).contains("polling_threads must be in 1..=256"));
        assert!(b().polling_threads(256).build().is_ok());
        let e = err(b().idle_poll_interval(Duration::ZERO));
        assert!(e.contains("idle_poll_interval must be in (0, 1 s]"), "{e}");
        assert!(
            err(b().idle_poll_interval(Duration::from_millis(1001))).contains("idle_poll_interval")
        );
        assert!(
            b().idle_poll_interval(Duration::from_secs(1))
                .build()
                .is_ok()
        );
    }

    #[test]
    fn paper_and_to_builder_keep_the_other_settings() {
        let p = PollerConfig::paper(Mode::Bp);
        assert_eq!(p.mode(), Mode::Bp);
        assert!(!p.auto_tune() && !p.spin_backoff());
        assert_eq!((p.idle_park_after(), p.doorbell_park_after()), (None, None));
        assert_eq!(
            p.polling_threads(),
            PollerConfig::default().polling_threads()
        );
        let q = p.to_builder().polling_threads(3).build().unwrap();
        assert_eq!(q.polling_threads(), 3);
        assert_eq!((q.mode(), q.auto_tune()), (Mode::Bp, false));
    }
}
