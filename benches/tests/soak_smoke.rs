//! The soak binary end to end, briefly (2 s, 4 clients, shm fast path): it
//! exits 0 and its last line reports calls made, none failed, none lost.
//! Besides checking the binary, this makes `cargo test --workspace` build
//! it, so CI's soak step runs that build instead of compiling it again
//! with a different feature set (`cargo xtask ci`).

use std::process::Command;

#[test]
fn a_short_soak_loses_nothing() {
    let out = Command::new(env!("CARGO_BIN_EXE_soak"))
        .args(["--duration", "2s", "--clients", "4", "--transport", "shm"])
        .output()
        .expect("run the soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "soak failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let n: Vec<u64> = last
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        last.starts_with("calls: ") && n.len() == 3 && n[0] > 0 && n[1] == 0 && n[2] == 0,
        "last line: {last:?}"
    );
}
