//! The hybrid switch between repeated remote fetching and server-reply
//! (paper §3.2, "Discussion"), as a sans-IO state machine.
//!
//! The client owns the switch; the server only obeys the mode written in
//! each request's status word ([`crate::rfrpc::wire::RequestHeader::mode`]).
//! Nothing here reads a clock: the driver reports what it measured.
//!
//! * **RemoteFetch → ServerReply.** A call *exhausts* the retry budget when
//!   its first READ and all `retry_limit` retries found no result
//!   (`failed_reads > retry_limit`). After `switch_after` (default 2, the
//!   paper's "pre-defined number (e.g., two)") consecutive exhausting calls
//!   the next call is sent in server-reply mode. A call that needed fewer
//!   reads resets the count, so one unexpectedly slow request does not
//!   switch (§3.2).
//! * **ServerReply → RemoteFetch.** The paper switches back "if it finds
//!   the response time becomes shorter" and leaves *shorter* open. Let
//!   `rtt` be the client's running estimate of one fetch READ's round trip
//!   and R = `retry_limit`. A server-reply call is *short* when the
//!   processing time `P` the server recorded in the response header is at
//!   most `R × rtt`: a result ready that soon would have been found by the
//!   first READ or one of the R retries, so remote fetching would not have
//!   exhausted its budget. After `switch_after` consecutive short calls
//!   the client returns to remote fetching.
//! * **Measured veto and probes** (ours). The two rules above decide
//!   from READ counts and processing times, which predict the faster mode
//!   only when the server picks a request up at once (the paper's
//!   InfiniBand setting, where R = 5 READs span about 10 µs). On shm a
//!   READ is a memcpy of a few hundred ns, so a busy or descheduled server
//!   thread alone exhausts R, and the rules flap between the modes, at
//!   0.3–0.6× the better fixed mode in `cargo xtask bench kv`. So the switch
//!   also keeps each mode's response time (the median of the last 16 calls
//!   sent in it), and:
//!   - a rule's switch is *vetoed* when the target mode's measured time is
//!     known and not at least 1/16 below the current mode's time: its
//!     median, or the fastest of the calls that triggered the rule when
//!     that is over 1.5 × the median (so a real slowdown still switches
//!     after two calls, as the paper's rule does, while jitter and one
//!     stalled call do not);
//!   - every [`ModeSwitchBuilder::probe`] `every` calls (default 512) the
//!     next `len` calls (default 5) are sent in the other mode, to refresh
//!     its estimate (the first is discarded as a warm-up; the rest replace
//!     the other mode's window); if the other mode then measures at least
//!     1/16 faster, the switch moves to it.
//!
//!   Medians on both sides compare like with like, and one call stalled by
//!   the scheduler cannot make a mode look slow.
//!
//!   Probing costs `len / every` of the calls at the slower mode's price
//!   (about 1 % per 1× of difference), and it makes the hybrid follow
//!   whichever mode is faster on the machine it runs on, which the target
//!   "never more than 10 % below the better mode" asks for.
//!
//! The RTT estimate is an exponentially weighted mean (weight 1/8) of the READ round trips
//!   measured in remote-fetch mode, starting from
//!   [`ModeSwitchBuilder::initial_rtt`] (default 2 µs, paper §5: a READ of a
//!   few hundred bytes on their InfiniBand).

use std::time::Duration;

/// Who delivers a call's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// The server leaves the result in its own response buffer and the
    /// client READs it (RF-RPC proper).
    #[default]
    RemoteFetch,
    /// The server WRITEs the result into the client's reply buffer.
    ServerReply,
}

/// Whether the mode may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ModePolicy {
    /// The hybrid switch (§3.2).
    #[default]
    Hybrid,
    /// Always this mode.
    Fixed(Mode),
}

/// What one finished call tells the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallReport {
    /// The mode the call was sent in.
    pub mode: Mode,
    /// READs that found no result (remote fetch only; 0 in server-reply).
    pub failed_reads: u32,
    /// Server processing time from the response header.
    pub server_time: Duration,
    /// Response time the client observed: request posted to result seen.
    pub latency: Duration,
}

/// The client's side of the hybrid switch.
#[derive(Debug, Clone)]
pub struct ModeSwitch {
    policy: ModePolicy,
    mode: Mode,
    retry_limit: u32,
    switch_after: u32,
    exhausted_run: u32,
    short_run: u32,
    rtt: Duration,
    switches: u64,
    /// The last response times per mode (`[RemoteFetch, ServerReply]`).
    recent: [Recent; 2],
    /// The fastest response time of the calls in the current exhausted or
    /// short run (the calls a rule switches on).
    run_latency: Duration,
    /// Calls since the last probe.
    since_probe: u32,
    /// Probe calls still to send in the other mode.
    probe_left: u32,
    probe_every: u32,
    probe_len: u32,
    probes: u64,
    /// Whether the measured veto applies (see the module docs).
    measured: bool,
}

fn idx(m: Mode) -> usize {
    match m {
        Mode::RemoteFetch => 0,
        Mode::ServerReply => 1,
    }
}

fn other(m: Mode) -> Mode {
    match m {
        Mode::RemoteFetch => Mode::ServerReply,
        Mode::ServerReply => Mode::RemoteFetch,
    }
}

/// `a` is clearly (at least 1/16) below `b`.
fn clearly_below(a: Duration, b: Duration) -> bool {
    a < b.saturating_sub(b / 16)
}

/// Response times kept per mode.
const WINDOW: usize = 16;

/// The last [`WINDOW`] response times of one mode; its estimate is their
/// median, so a call stalled by the scheduler (a millisecond against
/// microseconds) does not move it, and a lasting change shows after half
/// a window.
#[derive(Debug, Clone, Copy, Default)]
struct Recent {
    samples: [Duration; WINDOW],
    len: usize,
    next: usize,
}

impl Recent {
    fn push(&mut self, d: Duration) {
        self.samples[self.next] = d;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
    }

    fn clear(&mut self) {
        self.len = 0;
        self.next = 0;
    }

    fn median(&self) -> Option<Duration> {
        if self.len == 0 {
            return None;
        }
        let mut v = self.samples;
        let got = &mut v[..self.len];
        got.sort_unstable();
        let n = got.len();
        Some(if n % 2 == 1 {
            got[n / 2]
        } else {
            (got[n / 2 - 1] + got[n / 2]) / 2
        })
    }
}

/// Builder of a [`ModeSwitch`] ([`ModeSwitch::builder`]): its tuning
/// knobs, each clamped to its range.
#[derive(Debug, Clone)]
pub struct ModeSwitchBuilder {
    switch: ModeSwitch,
}

impl ModeSwitchBuilder {
    /// `false`: the paper's two rules alone (§3.2), without the measured
    /// veto and with probing off; `true` (the default): both (see the
    /// module docs). The paper's rules alone flap on a host where the
    /// server's pick-up delay, not its processing, exhausts R (shm on a
    /// loaded machine), and are deterministic in what they decide.
    pub fn measured(mut self, on: bool) -> Self {
        self.switch.measured = on;
        if !on {
            self.switch.probe_every = 0;
        }
        self
    }

    /// Every `every` calls, send `len` calls in the other mode to measure
    /// it (defaults 512 and 5; `every = 0` turns probing off). `len` is
    /// 2..=17: the first probe call is a warm-up, the median of the others
    /// is the other mode's new estimate.
    pub fn probe(mut self, every: u32, len: u32) -> Self {
        self.switch.probe_every = every;
        self.switch.probe_len = len.clamp(2, WINDOW as u32 + 1);
        self
    }

    /// Consecutive calls needed to switch, either way (default 2; at least 1).
    pub fn switch_after(mut self, n: u32) -> Self {
        self.switch.switch_after = n.max(1);
        self
    }

    /// The READ round trip assumed before any was measured.
    pub fn initial_rtt(mut self, rtt: Duration) -> Self {
        self.switch.rtt = rtt;
        self
    }

    /// The switch.
    ///
    /// # Errors
    /// None today (every knob is clamped to its range); a `Result` like
    /// every config's `build`, so that a check added later is not a
    /// breaking change.
    pub fn build(self) -> crate::Result<ModeSwitch> {
        Ok(self.switch)
    }
}

impl ModeSwitch {
    /// A builder of a switch with `policy` and `retry_limit` = R, the other
    /// settings at their defaults ([`ModeSwitchBuilder`]); built like every
    /// rrpc config (docs/architecture.md, "Configuration convention").
    pub fn builder(policy: ModePolicy, retry_limit: u32) -> ModeSwitchBuilder {
        ModeSwitchBuilder {
            switch: ModeSwitch::new(policy, retry_limit),
        }
    }

    /// A switch in remote-fetch mode (or the fixed mode) with
    /// `retry_limit` = R (paper default 5).
    pub fn new(policy: ModePolicy, retry_limit: u32) -> Self {
        ModeSwitch {
            policy,
            mode: match policy {
                ModePolicy::Hybrid => Mode::RemoteFetch,
                ModePolicy::Fixed(m) => m,
            },
            retry_limit,
            switch_after: 2,
            exhausted_run: 0,
            short_run: 0,
            rtt: Duration::from_micros(2),
            switches: 0,
            recent: [Recent::default(); 2],
            run_latency: Duration::MAX,
            since_probe: 0,
            probe_left: 0,
            probe_every: 512,
            probe_len: 5,
            probes: 0,
            measured: true,
        }
    }

    /// The mode the next call must be sent in (the current mode, or the
    /// other one during a probe).
    #[must_use]
    pub fn mode(&self) -> Mode {
        if self.probe_left > 0 {
            other(self.mode)
        } else {
            self.mode
        }
    }

    /// The mode the switch has settled on (probes aside).
    pub fn current(&self) -> Mode {
        self.mode
    }

    /// The response-time estimate of calls sent in `mode` (the median of
    /// the last 16), once one was.
    pub fn latency(&self, mode: Mode) -> Option<Duration> {
        self.recent[idx(mode)].median()
    }

    /// How many probes of the other mode ran.
    pub fn probes(&self) -> u64 {
        self.probes
    }

    /// R.
    pub fn retry_limit(&self) -> u32 {
        self.retry_limit
    }

    /// Changes R (a tuner's new choice).
    pub fn set_retry_limit(&mut self, r: u32) {
        self.retry_limit = r;
    }

    /// The current READ round-trip estimate.
    pub fn rtt(&self) -> Duration {
        self.rtt
    }

    /// Processing times at or below this are *short* (`retry_limit × rtt`).
    pub fn short_threshold(&self) -> Duration {
        self.rtt.saturating_mul(self.retry_limit.max(1))
    }

    /// Whether a server-reply call was *short* (see the module docs).
    pub fn is_short(&self, server_time: Duration) -> bool {
        server_time <= self.short_threshold()
    }

    /// How many times the mode changed.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// One fetch READ took `rtt` (posted to completion).
    pub fn handle_fetch_rtt(&mut self, rtt: Duration) {
        // rtt_est += (sample - rtt_est) / 8, in nanoseconds.
        let est = self.rtt.as_nanos() as i128;
        let s = rtt.as_nanos().min(u64::MAX as u128) as i128;
        let next = est + (s - est) / 8;
        self.rtt = Duration::from_nanos(next.max(1) as u64);
    }

    /// A call finished; returns the mode the next call uses.
    pub fn handle_call(&mut self, r: CallReport) -> Mode {
        if self.policy != ModePolicy::Hybrid {
            return self.mode;
        }
        if self.probe_left > 0 && r.mode == other(self.mode) {
            self.handle_probe(r);
            return self.mode();
        }
        if r.mode != self.mode {
            // A report of a call sent before the last switch: ignore it.
            return self.mode();
        }
        self.recent[idx(r.mode)].push(r.latency);
        match self.mode {
            Mode::RemoteFetch => {
                self.short_run = 0;
                if r.failed_reads > self.retry_limit {
                    self.exhausted_run += 1;
                    self.run_latency = self.run_latency.min(r.latency);
                    if self.exhausted_run >= self.switch_after {
                        let run = self.run_latency;
                        self.exhausted_run = 0;
                        self.run_latency = Duration::MAX;
                        self.switch_unless_vetoed(Mode::ServerReply, run);
                    }
                } else {
                    self.exhausted_run = 0;
                    self.run_latency = Duration::MAX;
                }
            }
            Mode::ServerReply => {
                self.exhausted_run = 0;
                if self.is_short(r.server_time) {
                    self.short_run += 1;
                    self.run_latency = self.run_latency.min(r.latency);
                    if self.short_run >= self.switch_after {
                        let run = self.run_latency;
                        self.short_run = 0;
                        self.run_latency = Duration::MAX;
                        self.switch_unless_vetoed(Mode::RemoteFetch, run);
                    }
                } else {
                    self.short_run = 0;
                    self.run_latency = Duration::MAX;
                }
            }
        }
        self.since_probe = self.since_probe.saturating_add(1);
        if self.probe_every > 0 && self.since_probe >= self.probe_every {
            self.since_probe = 0;
            self.probe_left = self.probe_len;
            // The probe's calls replace what was known of the other mode.
            self.recent[idx(other(self.mode))].clear();
        }
        self.mode()
    }

    /// One call of a probe of the other mode finished.
    fn handle_probe(&mut self, r: CallReport) {
        let first = self.probe_left == self.probe_len;
        self.probe_left -= 1;
        if !first {
            self.recent[idx(r.mode)].push(r.latency);
        }
        if self.probe_left > 0 {
            return;
        }
        self.probes += 1;
        if let (Some(measured), Some(cur)) =
            (self.latency(other(self.mode)), self.latency(self.mode))
            && clearly_below(measured, cur)
        {
            self.set(other(self.mode));
        }
    }

    /// A rule asks for `to` after calls that each took at least `run`:
    /// switch unless `to` was measured no faster than both those calls and
    /// the current mode's median (a real slowdown shows in `run` at once;
    /// a pick-up delay that exhausts R without slowing the calls, or one
    /// stalled call, does not).
    fn switch_unless_vetoed(&mut self, to: Mode, run: Duration) {
        if !self.measured {
            self.set(to);
            return;
        }
        let vetoed = match (self.latency(to), self.latency(self.mode)) {
            // The triggering calls count only when clearly slower than
            // usual (1.5 x the median): ordinary jitter does not switch.
            (Some(target), Some(cur)) => {
                let now = if run > cur + cur / 2 { run } else { cur };
                !clearly_below(target, now)
            }
            _ => false,
        };
        if !vetoed {
            self.set(to);
        }
    }

    fn set(&mut self, m: Mode) {
        self.mode = m;
        self.exhausted_run = 0;
        self.short_run = 0;
        self.run_latency = Duration::MAX;
        self.since_probe = 0;
        self.probe_left = 0;
        self.switches += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A virtual client and server: READs take `rtt`, the server takes
    /// `proc` per request; returns the report of one call in `mode`.
    fn virtual_call(sw: &mut ModeSwitch, rtt: Duration, proc: Duration) -> CallReport {
        let mode = sw.mode();
        match mode {
            Mode::RemoteFetch => {
                // The request lands at t = rtt/2; the result is ready at
                // rtt/2 + proc. READ k (k = 0, 1, ...) is issued at rtt/2 +
                // k·rtt and samples the buffer at its midpoint (k+1)·rtt.
                let mut t = Duration::ZERO;
                let mut failed = 0;
                loop {
                    t += rtt;
                    sw.handle_fetch_rtt(rtt);
                    if t >= rtt / 2 + proc {
                        break;
                    }
                    failed += 1;
                }
                CallReport {
                    mode,
                    failed_reads: failed,
                    server_time: proc,
                    latency: t,
                }
            }
            // Half a round trip each way, plus the processing.
            Mode::ServerReply => CallReport {
                mode,
                failed_reads: 0,
                server_time: proc,
                latency: rtt + proc,
            },
        }
    }

    #[test]
    fn slow_server_switches_to_server_reply_then_back() {
        let rtt = Duration::from_micros(2);
        let mut sw = ModeSwitch::builder(ModePolicy::Hybrid, 5)
            .initial_rtt(rtt)
            .build()
            .unwrap();
        // Fast handler: stays in remote fetch.
        for _ in 0..100 {
            let r = virtual_call(&mut sw, rtt, Duration::from_micros(1));
            sw.handle_call(r);
            assert_eq!(sw.mode(), Mode::RemoteFetch);
        }
        // Slow handler (50 µs ≫ 5 × 2 µs): two calls later, server-reply.
        let r = virtual_call(&mut sw, rtt, Duration::from_micros(50));
        assert!(r.failed_reads > 5);
        assert_eq!(sw.handle_call(r), Mode::RemoteFetch);
        let r = virtual_call(&mut sw, rtt, Duration::from_micros(50));
        assert_eq!(sw.handle_call(r), Mode::ServerReply);
        // Still slow: stays.
        for _ in 0..10 {
            let r = virtual_call(&mut sw, rtt, Duration::from_micros(50));
            assert_eq!(sw.handle_call(r), Mode::ServerReply);
        }
        // Fast again: back after two short calls.
        let r = virtual_call(&mut sw, rtt, Duration::from_micros(3));
        assert_eq!(sw.handle_call(r), Mode::ServerReply);
        let r = virtual_call(&mut sw, rtt, Duration::from_micros(3));
        assert_eq!(sw.handle_call(r), Mode::RemoteFetch);
        assert_eq!(sw.switches(), 2);
    }

    /// Calls whose latency in each mode is fixed: the switch's view of a
    /// server that picks requests up late (every remote-fetch call
    /// exhausts R although processing is instant).
    fn late_pickup(sw: &mut ModeSwitch, rf_us: u64, sr_us: u64) -> CallReport {
        let mode = sw.mode();
        CallReport {
            mode,
            failed_reads: if mode == Mode::RemoteFetch { 6 } else { 0 },
            server_time: Duration::ZERO,
            latency: Duration::from_micros(match mode {
                Mode::RemoteFetch => rf_us,
                Mode::ServerReply => sr_us,
            }),
        }
    }

    #[test]
    fn late_pickup_keeps_the_faster_mode_without_flapping() {
        // Remote fetch measures faster although it exhausts R every call
        // (shm, a busy server thread): after one trip to server-reply the
        // veto keeps remote fetch; the cost is the probes alone.
        let mut sw = ModeSwitch::new(ModePolicy::Hybrid, 5);
        let (mut rf, mut sr) = (0u32, 0u32);
        for _ in 0..100_000 {
            let r = late_pickup(&mut sw, 4, 6);
            match r.mode {
                Mode::RemoteFetch => rf += 1,
                Mode::ServerReply => sr += 1,
            }
            sw.handle_call(r);
        }
        assert_eq!(sw.current(), Mode::RemoteFetch);
        assert!(sw.switches() <= 2, "{} switches", sw.switches());
        // 5 probe calls per 512: about 1 %.
        assert!(sr < 1_100, "{sr} server-reply calls of {}", rf + sr);
        assert!(sw.probes() > 150);

        // Server-reply faster (and remote fetch exhausting): it moves there
        // and stays, though each server-reply call is "short" by the rule.
        let mut sw = ModeSwitch::new(ModePolicy::Hybrid, 5);
        let mut rf = 0u32;
        for _ in 0..100_000 {
            let r = late_pickup(&mut sw, 9, 6);
            rf += u32::from(r.mode == Mode::RemoteFetch);
            sw.handle_call(r);
        }
        assert_eq!(sw.current(), Mode::ServerReply);
        assert!(sw.switches() <= 3, "{} switches", sw.switches());
        assert!(rf < 1_100, "{rf} remote-fetch calls");
    }

    #[test]
    fn the_paper_rules_alone_flap_where_the_measured_switch_does_not() {
        // The trace of the test above (remote fetch faster, every call
        // exhausting R): the paper's rules alone switch on every second
        // call; the measured switch settles.
        let run = |measured: bool| {
            let mut sw = ModeSwitch::builder(ModePolicy::Hybrid, 5)
                .measured(measured)
                .build()
                .unwrap();
            for _ in 0..1_000 {
                let r = late_pickup(&mut sw, 4, 6);
                sw.handle_call(r);
            }
            (sw.switches(), sw.probes())
        };
        let (paper, paper_probes) = run(false);
        let (measured, _) = run(true);
        assert!(paper >= 400, "{paper} switches");
        assert_eq!(paper_probes, 0);
        assert!(measured <= 2, "{measured} switches");
    }

    #[test]
    fn one_stalled_call_does_not_move_the_switch() {
        let mut sw = ModeSwitch::new(ModePolicy::Hybrid, 5);
        for _ in 0..100 {
            let r = late_pickup(&mut sw, 4, 6);
            sw.handle_call(r);
        }
        assert_eq!(sw.current(), Mode::RemoteFetch);
        let switches = sw.switches();
        // A 2 ms scheduler stall on one remote-fetch call.
        let mut r = late_pickup(&mut sw, 4, 6);
        r.latency = Duration::from_millis(2);
        sw.handle_call(r);
        for _ in 0..3 {
            let r = late_pickup(&mut sw, 4, 6);
            sw.handle_call(r);
        }
        assert_eq!(sw.current(), Mode::RemoteFetch, "{sw:?}");
        assert_eq!(sw.switches(), switches);
        assert!(sw.latency(Mode::RemoteFetch).unwrap() < Duration::from_micros(6));
    }

    #[test]
    fn probes_follow_a_change_the_rules_cannot_see() {
        // Server-reply starts faster; then remote fetch becomes faster
        // while server-reply calls are never short (processing 20 µs
        // against R × rtt = 10 µs), so only a probe can find it.
        let rtt = Duration::from_micros(2);
        let mut sw = ModeSwitch::builder(ModePolicy::Hybrid, 5)
            .initial_rtt(rtt)
            .build()
            .unwrap();
        let call = |sw: &mut ModeSwitch, rf_us: u64, sr_us: u64| {
            let mode = sw.mode();
            CallReport {
                mode,
                failed_reads: if mode == Mode::RemoteFetch { 10 } else { 0 },
                server_time: Duration::from_micros(20),
                latency: Duration::from_micros(if mode == Mode::RemoteFetch {
                    rf_us
                } else {
                    sr_us
                }),
            }
        };
        for _ in 0..2_000 {
            let r = call(&mut sw, 30, 22);
            sw.handle_call(r);
        }
        assert_eq!(sw.current(), Mode::ServerReply);
        for _ in 0..1_100 {
            let r = call(&mut sw, 21, 30);
            sw.handle_call(r);
        }
        assert_eq!(sw.current(), Mode::RemoteFetch, "{sw:?}");
    }

    #[test]
    fn without_probes_the_rules_switch_and_the_veto_stops_the_flapping() {
        let mut sw = ModeSwitch::builder(ModePolicy::Hybrid, 5)
            .probe(0, 5)
            .build()
            .unwrap();
        for _ in 0..10_000 {
            let r = late_pickup(&mut sw, 4, 6);
            assert_eq!(r.mode, sw.current(), "no probes");
            sw.handle_call(r);
        }
        // Out on the exhaustion rule (server-reply unmeasured), back on the
        // short-call rule (remote fetch measured faster), then vetoed.
        assert_eq!(sw.switches(), 2);
        assert_eq!(sw.current(), Mode::RemoteFetch);
        assert_eq!(sw.probes(), 0);
    }

    #[test]
    fn one_slow_call_does_not_switch() {
        let rtt = Duration::from_micros(2);
        let mut sw = ModeSwitch::builder(ModePolicy::Hybrid, 5)
            .initial_rtt(rtt)
            .build()
            .unwrap();
        for i in 0..50 {
            let proc = if i % 2 == 0 { 100 } else { 1 };
            let r = virtual_call(&mut sw, rtt, Duration::from_micros(proc));
            assert_eq!(sw.handle_call(r), Mode::RemoteFetch);
        }
    }

    #[test]
    fn fixed_policy_never_switches() {
        let mut sw = ModeSwitch::new(ModePolicy::Fixed(Mode::ServerReply), 1);
        for _ in 0..10 {
            let r = CallReport {
                mode: Mode::ServerReply,
                failed_reads: 0,
                server_time: Duration::ZERO,
                latency: Duration::ZERO,
            };
            assert_eq!(sw.handle_call(r), Mode::ServerReply);
        }
    }

    proptest! {
        /// Under a constant processing time the switch settles, stops
        /// switching, and runs at most 10 % (plus the probes) above the
        /// faster fixed mode's response time.
        #[test]
        fn settles_near_the_faster_mode(r in 1u32..8, rtt_ns in 500u64..5000, proc_ns in 0u64..100_000) {
            let rtt = Duration::from_nanos(rtt_ns);
            let proc = Duration::from_nanos(proc_ns);
            let fixed = |m: Mode| {
                let mut sw = ModeSwitch::builder(ModePolicy::Fixed(m), r)
            .initial_rtt(rtt)
            .build()
            .unwrap();
                virtual_call(&mut sw, rtt, proc).latency
            };
            let best = fixed(Mode::RemoteFetch).min(fixed(Mode::ServerReply));
            let mut sw = ModeSwitch::builder(ModePolicy::Hybrid, r)
            .initial_rtt(rtt)
            .build()
            .unwrap();
            for _ in 0..1_100 {
                let c = virtual_call(&mut sw, rtt, proc);
                sw.handle_call(c);
            }
            let settled = sw.switches();
            prop_assert!(settled <= 3, "{} switches", settled);
            let mut total = Duration::ZERO;
            for _ in 0..2_048 {
                let c = virtual_call(&mut sw, rtt, proc);
                total += c.latency;
                sw.handle_call(c);
            }
            prop_assert_eq!(sw.switches(), settled, "flapped: {:?}", sw);
            let mean = total / 2_048;
            prop_assert!(mean <= best + best / 10, "mean {:?} best {:?} ({:?})", mean, best, sw);
        }
    }
}
