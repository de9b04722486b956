//! Ctrl-C / SIGTERM handling: a flag the supervisors poll, so they can stop what they started.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Set by the handler (signal-hook's flag: an atomic store, async-signal-safe).
fn flag() -> &'static Arc<AtomicBool> {
    static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    INTERRUPTED.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Installs the SIGINT/SIGTERM handler (idempotent).
pub(crate) fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            if let Err(e) = signal_hook::flag::register(sig, Arc::clone(flag())) {
                eprintln!("xtask: cannot handle signal {sig}: {e}");
            }
        }
    });
}

/// Whether Ctrl-C or SIGTERM arrived.
pub(crate) fn interrupted() -> bool {
    flag().load(Ordering::SeqCst)
}
