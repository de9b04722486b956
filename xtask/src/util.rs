//! What every command shares: running programs (echoed, with a digest of the
//! lines that name a failure), cargo metadata, and the workspace's
//! feature set for the verbs builds.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// `cargo metadata --no-deps` of the workspace at `root`, parsed.
pub(crate) fn cargo_metadata(root: &Path) -> Result<serde_json::Value> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed");
    }
    serde_json::from_slice(&out.stdout).context("parsing cargo metadata")
}

/// The cargo target directory of the workspace at `root`.
pub(crate) fn target_dir(root: &Path) -> Result<PathBuf> {
    let meta = cargo_metadata(root)?;
    let dir = meta["target_directory"]
        .as_str()
        .context("cargo metadata has no target_directory")?;
    Ok(PathBuf::from(dir))
}

/// What failed, in a few lines, gathered by the steps as they go and printed
/// again at the very end of `cargo xtask ci` (after the step table), where a
/// reader of a long CI log looks first.
static DIGEST: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// At most this many digest lines are kept (the first ones: later failures
/// are mostly consequences).
const DIGEST_MAX: usize = 60;

/// Adds a line to the failure digest.
pub(crate) fn note_failure(line: impl Into<String>) {
    let mut d = DIGEST.lock().unwrap_or_else(|e| e.into_inner());
    if d.len() < DIGEST_MAX {
        d.push(line.into());
    }
}

/// How many digest lines there are (a step's mark, see [`digest_truncate`]).
pub(crate) fn digest_len() -> usize {
    DIGEST.lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// Drops the digest lines after `len`: a step that passed named no failure
/// (its panics were tests' deliberate ones, such as the handlers that panic
/// on purpose in the integration suite), and they would crowd out the lines
/// of the step that failed.
pub(crate) fn digest_truncate(len: usize) {
    DIGEST
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .truncate(len);
}

/// Whether a line of test or suite output names a failure worth repeating
/// in the digest: libtest's failed tests and panics, a hung test, the
/// cross-host suite's failed checks, a suite row with failures.
pub(crate) fn is_failure_line(line: &str) -> bool {
    line.contains("FAILED")
        || line.contains("panicked at")
        || line.contains("has been running for over")
        || line.starts_with("error: test failed")
        || line.starts_with("error[")
        || line.starts_with("error: ")
        || line.starts_with("Error: ")
}

/// Runs a command, echoing its output as it comes and keeping the lines that
/// name a failure for the digest; fails on a non-zero exit.
fn run_digested(
    program: &str,
    args: &[&str],
    dir: Option<&Path>,
    env: &[(&str, &str)],
    remove: &[&str],
) -> Result<()> {
    use std::io::{BufRead, BufReader};
    eprintln!("==> {program} {}", args.join(" "));
    let mut cmd = Command::new(program);
    for var in remove {
        cmd.env_remove(var);
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    let mut child = cmd.spawn().with_context(|| format!("spawning {program}"))?;
    let forward = |r: Box<dyn std::io::Read + Send>, to_stderr: bool| {
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                if to_stderr {
                    eprintln!("{line}");
                } else {
                    println!("{line}");
                }
                if is_failure_line(&line) {
                    note_failure(line);
                }
            }
        })
    };
    let out = child.stdout.take().map(|o| forward(Box::new(o), false));
    let err = child.stderr.take().map(|e| forward(Box::new(e), true));
    let status = child
        .wait()
        .with_context(|| format!("waiting for {program}"))?;
    for t in [out, err].into_iter().flatten() {
        let _ = t.join();
    }
    if !status.success() {
        bail!("`{program} {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

/// Runs a command, failing on a non-zero exit.
pub(crate) fn run(program: &str, args: &[&str], dir: Option<&Path>) -> Result<()> {
    run_env(program, args, dir, &[])
}

/// Runs a command with extra environment variables, failing on a non-zero
/// exit; its output is echoed, and lines naming a failure go to the digest.
pub(crate) fn run_env(
    program: &str,
    args: &[&str],
    dir: Option<&Path>,
    env: &[(&str, &str)],
) -> Result<()> {
    run_digested(program, args, dir, env, &[])
}

/// The variables with which `cargo xtask ci` builds the workspace's own
/// crates under clippy (its test build is its lint pass, see
/// `ci::lint_env`): a build that must not be linted, or that a wrapper
/// would break, runs without them.
pub(crate) const LINT_VARS: &[&str] = &["RUSTC_WORKSPACE_WRAPPER", "CLIPPY_ARGS"];

/// [`run_env`] without [`LINT_VARS`]: the optimised build the regression
/// guard measures (clippy-driver turns MIR optimisations off), and nightly
/// builds (miri and cargo-fuzz wrap rustc themselves).
pub(crate) fn run_unlinted(
    program: &str,
    args: &[&str],
    dir: Option<&Path>,
    env: &[(&str, &str)],
) -> Result<()> {
    run_digested(program, args, dir, env, LINT_VARS)
}

/// The failure digest so far.
pub(crate) fn digest() -> Vec<String> {
    DIGEST.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Whether a command runs and exits 0 (for probes such as `pkg-config --exists`).
pub(crate) fn probe(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The workspace root (xtask lives in `<root>/xtask`).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

/// The `verbs` feature of every workspace package that has one. The test
/// step and the soft-RoCE suite (`cargo xtask rxe`) both build with
/// `--workspace --features VERBS_FEATURES`, so cargo resolves the same
/// features for both and the suite reuses the test step's binaries instead
/// of building ~40 test binaries a second time.
///
/// It turns on rrpc-tonic's `tls` too (and the integration tests' `tls`,
/// which run `suite::tls`): the one build of the test step then covers TLS
/// on every fabric the suite reaches.
pub(crate) const VERBS_FEATURES: &str = "rrpc-core/verbs,rrpc-ringbuf/verbs,rrpc-poller/verbs,\
rrpc-tonic/verbs,rrpc-kv/verbs,rrpc-integration-tests/verbs,rrpc-bench/verbs,examples/verbs,\
rrpc-tonic/tls,rrpc-integration-tests/tls,rrpc-bench/tls,examples/tls";

/// Builds the benchmark suites' binaries (`rrpc-bench`) (one cargo invocation, one profile).
pub(crate) fn build_bench(root: &Path, profile: &str, bins: &[&str]) -> Result<()> {
    let mut args = vec!["build", "--profile", profile, "-p", "rrpc-bench"];
    for b in bins {
        args.extend(["--bin", b]);
    }
    let t = Instant::now();
    run("cargo", &args, Some(root))?;
    eprintln!(
        "built {} suite binaries in {:.1}s",
        bins.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Kills a process group: SIGTERM, then SIGKILL after `grace`.
pub(crate) fn kill_group(child: &mut Child, grace: Duration) {
    let Ok(pgid) = i32::try_from(child.id()) else {
        return;
    };
    // The child's own process group, which we created with `process_group(0)`.
    let group = Pid::from_raw(pgid);
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Stragglers in the group get SIGKILL.
    let _ = killpg(group, Signal::SIGKILL);
    let _ = child.wait();
}

/// The current UTC time as `YYYYmmdd-HHMMSS`.
pub(crate) fn utc_timestamp() -> String {
    chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_lines_are_recognised() {
        for l in [
            "test rdma_fast::tls_is_checked ... FAILED",
            "thread 'x' panicked at src/lib.rs:1:1:",
            "test a::b has been running for over 60 seconds",
            "cross-host: partition and heal (4 s) FAILED (missing: calls ok)",
            "B| cross-host: soak rdma FAILED (missing: calls: )",
            "error: test failed, to rerun pass `-p rrpc-tonic --test integration`",
        ] {
            assert!(is_failure_line(l), "{l}");
        }
        for l in [
            "test rdma_fast::tls_is_checked ... ok",
            "test result: ok. 2 passed; 0 failed; 0 ignored",
            "calls: 93 failed: 0 lost: 0",
            "   Compiling rrpc-core v0.1.0",
        ] {
            assert!(!is_failure_line(l), "{l}");
        }
    }

    #[test]
    fn probe_distinguishes_success_and_failure() {
        assert!(probe("true", &[]));
        assert!(!probe("false", &[]));
        assert!(!probe("/nonexistent/program", &[]));
    }
}
