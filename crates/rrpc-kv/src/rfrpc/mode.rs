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
//! * **Flap damping** (ours). `P` does not include the time the server
//!   takes to *pick up* a request (a busy or descheduled server thread;
//!   on shm, where a READ costs ~100 ns, this dominates). When that delay
//!   alone exhausts the retries, the client would return to remote fetch
//!   and leave again every few calls. So when the client leaves remote
//!   fetching less than 64 calls after returning to it, the number of short
//!   calls needed to return next time doubles (up to 1024); 1024 calls in
//!   remote fetch without exhausting restore it to `switch_after`.
//!
//! The RTT estimate is an exponentially weighted mean (weight 1/8) of the READ round trips
//!   measured in remote-fetch mode, starting from
//!   [`ModeSwitch::with_initial_rtt`] (default 2 µs, paper §5: a READ of a
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
    back_after: u32,
    rf_run: u32,
    returned: bool,
}

/// Leaving remote fetch this soon after returning counts as a flap.
const FLAP_CALLS: u32 = 64;
/// Remote-fetch calls without exhaustion that reset the damping.
const CALM_CALLS: u32 = 1024;
/// Cap of the damped `switch_after`.
const MAX_BACK_AFTER: u32 = 1024;

impl ModeSwitch {
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
            back_after: 2,
            rf_run: 0,
            returned: false,
        }
    }

    /// Consecutive calls needed to switch, either way (default 2; at least 1).
    pub fn with_switch_after(mut self, n: u32) -> Self {
        self.switch_after = n.max(1);
        self.back_after = self.switch_after;
        self
    }

    /// The READ round trip assumed before any was measured.
    pub fn with_initial_rtt(mut self, rtt: Duration) -> Self {
        self.rtt = rtt;
        self
    }

    /// The mode the next call must be sent in.
    #[must_use]
    pub fn mode(&self) -> Mode {
        self.mode
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

    /// Consecutive short calls needed to return to remote fetching now
    /// (`switch_after`, raised by flap damping).
    pub fn back_after(&self) -> u32 {
        self.back_after
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
        match (self.mode, r.mode) {
            (Mode::RemoteFetch, Mode::RemoteFetch) => {
                self.short_run = 0;
                self.rf_run = self.rf_run.saturating_add(1);
                if self.rf_run >= CALM_CALLS {
                    self.back_after = self.switch_after;
                }
                if r.failed_reads > self.retry_limit {
                    self.exhausted_run += 1;
                    if self.exhausted_run >= self.switch_after {
                        self.set(Mode::ServerReply);
                    }
                } else {
                    self.exhausted_run = 0;
                }
            }
            (Mode::ServerReply, Mode::ServerReply) => {
                self.exhausted_run = 0;
                if self.is_short(r.server_time) {
                    self.short_run += 1;
                    if self.short_run >= self.back_after {
                        self.set(Mode::RemoteFetch);
                    }
                } else {
                    self.short_run = 0;
                }
            }
            // A report of a call sent before the last switch: ignore it.
            _ => {}
        }
        self.mode
    }

    fn set(&mut self, m: Mode) {
        if m == Mode::ServerReply && self.returned && self.rf_run < FLAP_CALLS {
            self.back_after = self.back_after.saturating_mul(2).min(MAX_BACK_AFTER);
        }
        if m == Mode::RemoteFetch {
            self.returned = true;
        }
        self.rf_run = 0;
        self.mode = m;
        self.exhausted_run = 0;
        self.short_run = 0;
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
        let mut sw = ModeSwitch::new(ModePolicy::Hybrid, 5).with_initial_rtt(rtt);
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

    #[test]
    fn late_pickup_flapping_is_damped() {
        // Processing is instant but the server picks requests up late, so
        // every remote-fetch call exhausts its retries.
        let mut sw = ModeSwitch::new(ModePolicy::Hybrid, 5);
        let rf = CallReport {
            mode: Mode::RemoteFetch,
            failed_reads: 6,
            server_time: Duration::ZERO,
            latency: Duration::from_micros(20),
        };
        let sr = CallReport {
            mode: Mode::ServerReply,
            ..rf
        };
        let mut calls = 0u32;
        for _ in 0..100_000 {
            let r = if sw.mode() == Mode::RemoteFetch {
                rf
            } else {
                sr
            };
            sw.handle_call(r);
            calls += 1;
        }
        // Undamped, it would switch every other call (50 000 times); damped,
        // twice per ~1026 calls once the cap is reached.
        let bound = 2 * (calls as u64 / MAX_BACK_AFTER as u64) + 30;
        assert!(
            sw.switches() < bound,
            "{} switches in {calls} calls",
            sw.switches()
        );
        assert_eq!(sw.back_after(), MAX_BACK_AFTER);
        // A calm stretch in remote fetch restores the default.
        let mut sw2 = sw.clone();
        while sw2.mode() == Mode::ServerReply {
            sw2.handle_call(sr);
        }
        for _ in 0..CALM_CALLS {
            sw2.handle_call(CallReport {
                failed_reads: 0,
                ..rf
            });
        }
        assert_eq!(sw2.back_after(), 2);
    }

    #[test]
    fn one_slow_call_does_not_switch() {
        let rtt = Duration::from_micros(2);
        let mut sw = ModeSwitch::new(ModePolicy::Hybrid, 5).with_initial_rtt(rtt);
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
        /// Under a constant processing time the switch settles in the mode
        /// the definition predicts, within a bounded number of calls, and
        /// never flaps afterwards.
        #[test]
        fn settles_and_never_flaps(r in 1u32..8, rtt_ns in 500u64..5000, proc_ns in 0u64..100_000) {
            let rtt = Duration::from_nanos(rtt_ns);
            let proc = Duration::from_nanos(proc_ns);
            let mut sw = ModeSwitch::new(ModePolicy::Hybrid, r).with_initial_rtt(rtt);
            for _ in 0..8 {
                let c = virtual_call(&mut sw, rtt, proc);
                sw.handle_call(c);
            }
            let settled = sw.mode();
            let sw_count = sw.switches();
            for _ in 0..100 {
                let c = virtual_call(&mut sw, rtt, proc);
                sw.handle_call(c);
            }
            prop_assert_eq!(sw.mode(), settled);
            prop_assert_eq!(sw.switches(), sw_count);
            prop_assert!(sw_count <= 2);
            // Remote fetch is kept exactly when the fetch loop would not
            // exhaust its retries.
            let failed = (rtt / 2 + proc).as_nanos().div_ceil(rtt.as_nanos()).saturating_sub(1) as u32;
            if failed > r {
                prop_assert_eq!(settled, Mode::ServerReply);
            } else {
                prop_assert_eq!(settled, Mode::RemoteFetch);
            }
        }
    }
}
