//! `cargo xtask ci`: every CI step, timed, with skipped steps saying why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::util::{
    VERBS_FEATURES, note_failure, probe, run, run_env, run_unlinted, target_dir, workspace_root,
};

/// `cargo xtask ci` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct CiArgs {
    /// Seconds to run each fuzz target after building it (0: build only).
    /// CI's smoke run; fuzz for real with `cargo +nightly fuzz run` in
    /// `fuzz/`.
    #[arg(long, default_value_t = 3)]
    fuzz_seconds: u32,
    /// Skip the miri step.
    #[arg(long)]
    no_miri: bool,
    /// Also run `cargo xtask bench all --quick` (every suite once, on the
    /// test build): off in CI, where the regression guard below runs the
    /// suites that carry its ratios, optimised, five times (the smoke run
    /// took 114 s of a CI run that had to be cut under 40 minutes).
    #[arg(long)]
    bench_smoke: bool,
    /// Skip `cargo xtask bench check` (the performance regression guard).
    #[arg(long)]
    no_bench_check: bool,
    /// Skip the verbs suite in the soft-RoCE VM (`cargo xtask rxe`).
    #[arg(long)]
    no_rxe: bool,
    /// Seconds the `rxe` step's VM may run (the host build is not counted).
    #[arg(long, default_value_t = 900)]
    rxe_timeout: u64,
    /// Seconds the test step may run (its build included) before it is killed, with every
    /// process it started: a hung test fails CI with its name (libtest's "has been running
    /// for over 60 seconds" line) instead of using up the job's time.
    #[arg(long, default_value_t = 2400)]
    test_timeout: u64,
    /// Keep `target/debug` after the verbs suite. By default CI deletes it
    /// there (all but the xtask binary, which the bench step runs again),
    /// since no later step uses it, so the release and fuzz builds fit on a
    /// small disk.
    #[arg(long)]
    keep_target: bool,
    /// Let a step that cannot run on this machine (no libibverbs, no VM,
    /// no nightly toolchain with miri or cargo-fuzz) pass as skipped. By
    /// default such a step fails: `.ci/setup` installs all of it, so a
    /// skip in CI means CI ran less than the README says.
    #[arg(long)]
    allow_skips: bool,
}

enum Outcome {
    Ran,
    /// Left out on request (`--no-miri` and the like).
    Skipped(String),
    /// Could not run on this machine (a tool or the VM is missing): a
    /// failure unless `--allow-skips`.
    Unavailable(String),
}

/// `#[ignore]`d tests that CI runs alone after the suite (exact names in
/// their packages' `suite` binaries): they rest on real elapsed time.
const REAL_TIME_TESTS: &[&str] = &["rfrpc_batch::tuner_converges_to_the_latency_bound"];

/// Whether `crates/rrpc-core/Cargo.toml` declares a `verbs` feature.
fn core_has_verbs_feature(root: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(root.join("crates/rrpc-core/Cargo.toml")) else {
        return false;
    };
    toml::from_str::<toml::Table>(&text)
        .ok()
        .and_then(|t| t.get("features")?.as_table()?.get("verbs").cloned())
        .is_some()
}

/// Whether the verbs provider can be built here: rrpc-core declares the
/// feature and libibverbs' headers are installed. `Err` says why not.
pub(crate) fn verbs_buildable(root: &Path) -> Result<(), String> {
    if !core_has_verbs_feature(root) {
        return Err("rrpc-core has no `verbs` feature".into());
    }
    if !probe("pkg-config", &["--exists", "libibverbs"]) {
        return Err(
            "`pkg-config --exists libibverbs` failed (libibverbs-dev not installed)".into(),
        );
    }
    Ok(())
}

/// The workspace's fuzz crate (`fuzz/`, every `cargo fuzz` target), if any.
fn fuzz_dir(root: &Path) -> Option<PathBuf> {
    let dir = root.join("fuzz");
    dir.join("Cargo.toml").is_file().then_some(dir)
}

/// The `cargo fuzz` targets of the fuzz crate at `dir` (`fuzz_targets/*.rs`),
/// sorted; an error when that directory cannot be read or holds none, so
/// the fuzz step never passes having fuzzed nothing.
fn fuzz_targets(dir: &Path) -> Result<Vec<String>> {
    let targets = dir.join("fuzz_targets");
    let mut t = Vec::new();
    for e in
        std::fs::read_dir(&targets).with_context(|| format!("reading {}", targets.display()))?
    {
        let p = e
            .with_context(|| format!("reading {}", targets.display()))?
            .path();
        if p.extension().is_some_and(|x| x == "rs")
            && let Some(stem) = p.file_stem()
        {
            t.push(stem.to_string_lossy().into_owned());
        }
    }
    if t.is_empty() {
        bail!("{} holds no fuzz target (*.rs)", targets.display());
    }
    t.sort();
    Ok(t)
}

/// The checked-in seed corpus of fuzz target `target` (`corpus/<target>`
/// in the fuzz crate at `dir`): an error when it is missing or empty, as a
/// smoke run from no seeds at all exercises little past the first bytes.
fn fuzz_seeds(dir: &Path, target: &str) -> Result<PathBuf> {
    let seeds = dir.join("corpus").join(target);
    let n = std::fs::read_dir(&seeds)
        .with_context(|| {
            format!(
                "fuzz target {target} has no seed corpus: reading {}",
                seeds.display()
            )
        })?
        .count();
    if n == 0 {
        bail!(
            "fuzz target {target}'s seed corpus {} is empty",
            seeds.display()
        );
    }
    Ok(seeds)
}

/// What libtest reported in a run's output (every binary cargo ran).
#[derive(Debug, Default, PartialEq)]
struct TestsRan {
    /// The sum of `N passed` over the `test result:` lines.
    passed: u64,
    /// How many `test result:` lines (binaries, doctest runs) there were.
    binaries: usize,
    /// The tests reported `... ok`, by name.
    ok: Vec<String>,
}

/// Reads libtest's output (`test NAME ... ok`, `test result: ok. N passed;
/// ...`), so a step that selects its tests by name can fail when the
/// filter selected nothing: libtest exits 0 having run no test.
fn tests_ran(output: &str) -> TestsRan {
    let mut ran = TestsRan::default();
    for line in output.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("test result: ") {
            ran.binaries += 1;
            // "ok. 2 passed; 0 failed; ..." or "FAILED. 1 passed; 1 failed; ..."
            let passed = rest
                .split_once(". ")
                .and_then(|(_, counts)| counts.split(';').next())
                .and_then(|c| c.trim().strip_suffix(" passed"))
                .and_then(|n| n.trim().parse::<u64>().ok());
            ran.passed += passed.unwrap_or(0);
        } else if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|r| r.strip_suffix(" ... ok"))
        {
            ran.ok.push(name.to_owned());
        }
    }
    ran
}

/// Fails unless `ran` counts a passed test, and each of `filters` (libtest
/// name filters, substrings; `exact`: whole names) matched one of them.
fn check_ran(ran: &TestsRan, filters: &[&str], exact: bool) -> Result<()> {
    if ran.passed == 0 {
        bail!(
            "no test ran ({} `test result:` lines, 0 passed): the filters {filters:?} \
             selected nothing",
            ran.binaries
        );
    }
    let missing: Vec<&str> = filters
        .iter()
        .copied()
        .filter(|f| {
            !ran.ok
                .iter()
                .any(|n| if exact { n == f } else { n.contains(f) })
        })
        .collect();
    if !missing.is_empty() {
        bail!(
            "{} tests passed, but none matched {missing:?} (renamed or moved?)",
            ran.passed
        );
    }
    eprintln!(
        "ci: {} tests passed in {} runs; every filter matched",
        ran.passed, ran.binaries
    );
    Ok(())
}

/// [`crate::util::run_env`] that also returns what the program printed on
/// stdout (libtest's lines, for [`tests_ran`]); `remove` names variables to
/// clear (as `run_unlinted` does with [`crate::util::LINT_VARS`]).
fn run_captured(
    program: &str,
    args: &[&str],
    dir: &Path,
    env: &[(&str, &str)],
    remove: &[&str],
) -> Result<String> {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;
    eprintln!("==> {program} {}", args.join(" "));
    let mut cmd = Command::new(program);
    for var in remove {
        cmd.env_remove(var);
    }
    let mut child = cmd
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {program}"))?;
    let forward = |r: Box<dyn Read + Send>, to_stderr: bool| {
        std::thread::spawn(move || {
            let mut kept = String::new();
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                if to_stderr {
                    eprintln!("{line}");
                } else {
                    println!("{line}");
                    kept.push_str(&line);
                    kept.push('\n');
                }
                if crate::util::is_failure_line(&line) {
                    note_failure(line);
                }
            }
            kept
        })
    };
    let out = child.stdout.take().map(|o| forward(Box::new(o), false));
    let err = child.stderr.take().map(|e| forward(Box::new(e), true));
    let status = child
        .wait()
        .with_context(|| format!("waiting for {program}"))?;
    let stdout = out
        .map(|t| t.join().unwrap_or_default())
        .unwrap_or_default();
    if let Some(t) = err {
        let _ = t.join();
    }
    if !status.success() {
        bail!("`{program} {}` failed with {status}", args.join(" "));
    }
    Ok(stdout)
}

/// Where `.ci/setup` installs the foreign gRPC clients of
/// `suite::one_port` (grpcio's venv; grpc-go's modules live in Go's own
/// caches): `$RRPC_INTEROP_CACHE`, else `~/.cache/rrpc-interop`, as in
/// `.ci/setup`.
fn interop_cache() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("RRPC_INTEROP_CACHE") {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rrpc-interop"))
}

/// The test step's variables for `suite::one_port`'s foreign clients:
/// `RRPC_GRPCIO_PYTHON`, the venv's Python (unless the caller chose one),
/// and `RRPC_REQUIRE_INTEROP=1` unless skips are allowed, under which a
/// client that cannot run fails its test instead of skipping it.
fn interop_env(allow_skips: bool) -> Vec<(&'static str, String)> {
    let mut env = Vec::new();
    if !allow_skips {
        env.push(("RRPC_REQUIRE_INTEROP", "1".to_owned()));
    }
    if std::env::var_os("RRPC_GRPCIO_PYTHON").is_none()
        && let Some(cache) = interop_cache()
    {
        let python = cache.join("grpcio-venv/bin/python3");
        if python.exists() {
            env.push(("RRPC_GRPCIO_PYTHON", python.to_string_lossy().into_owned()));
        } else {
            eprintln!(
                "test: no {} (`.ci/setup` makes it): grpcio from python3",
                python.display()
            );
        }
    }
    env
}

/// Runs the CI steps in order, printing each step's elapsed time and the total.
pub(crate) fn run_ci(args: &CiArgs) -> Result<()> {
    let root = workspace_root();
    let total = Instant::now();
    let allow_skips = args.allow_skips;
    let mut times: Vec<(String, Duration, String)> = Vec::new();
    let mut step = |name: &str, f: &mut dyn FnMut() -> Result<Outcome>| -> Result<()> {
        eprintln!("\n=== step: {name} ({})", disk_free(&root));
        let t = Instant::now();
        let mark = crate::util::digest_len();
        let outcome = match f() {
            Ok(Outcome::Unavailable(why)) if !allow_skips => Err(anyhow::anyhow!(
                "cannot run here: {why} (`.ci/setup` installs what it needs; \
                 `cargo xtask ci --allow-skips` lets it pass as skipped)"
            )),
            other => other,
        };
        let el = t.elapsed();
        match &outcome {
            Err(e) => note_failure(format!("step {name}: {e:#}")),
            Ok(_) => crate::util::digest_truncate(mark),
        }
        let status = match &outcome {
            Ok(Outcome::Ran) => "ok".to_owned(),
            Ok(Outcome::Skipped(why)) => format!("skipped: {why}"),
            Ok(Outcome::Unavailable(why)) => format!("skipped (--allow-skips): {why}"),
            Err(e) => format!("FAILED: {e:#}"),
        };
        eprintln!("=== step {name}: {status} in {:.1}s", el.as_secs_f64());
        times.push((name.to_owned(), el, status));
        outcome.map(|_| ())
    };
    let root_ref = root.as_path();
    let result = (|| -> Result<()> {
        step("fmt", &mut || {
            run("cargo", &["fmt", "--all", "--", "--check"], Some(root_ref)).map(|()| Outcome::Ran)
        })?;
        step("layers (import circles, layer order)", &mut || {
            crate::layers::run(
                root_ref,
                &crate::layers::LayersArgs {
                    verbose: false,
                    root: None,
                },
            )
            .map(|()| Outcome::Ran)
        })?;
        step("test (built under clippy, warnings denied)", &mut || {
            // With libibverbs present the workspace is tested with every
            // `verbs` feature on: the shm tests run as they would without
            // it, the verbs tests skip (no RRPC_TEST_DEVICE on the host),
            // and the rxe step runs those same binaries in the VM.
            // Under coreutils `timeout`, which signals its whole process group: cargo, the
            // test binaries and the servers they spawned.
            let limit = args.test_timeout.to_string();
            let mut cmd = vec![
                "--kill-after=30",
                limit.as_str(),
                "cargo",
                "test",
                "--workspace",
            ];
            match verbs_buildable(root_ref) {
                Ok(()) => cmd.extend(["--features", VERBS_FEATURES]),
                Err(why) => eprintln!("test: without the verbs features: {why}"),
            }
            // The build is the lint pass: `run_entry` set `lint_env`, so every
            // crate of the workspace is compiled by clippy-driver with warnings
            // denied (a clippy or rustc warning fails the build, named above).
            // A separate `cargo clippy --all-targets`, with and without `verbs`,
            // checked everything once more: 155 s of a CI run that had to fit
            // in 40 minutes. The bench targets, which `cargo test` does not
            // build, are built (and so linted) first.
            let mut benches = cmd.clone();
            benches.extend(["--benches", "--no-run"]);
            run("timeout", &benches, Some(root_ref))
                .context("building the bench targets under clippy failed (see above)")?;
            // The foreign gRPC clients `suite::one_port` calls the `rrpc://`
            // port with: grpcio and grpc-go, which `.ci/setup` installs, so
            // the tests fail here rather than skip when they cannot run.
            let interop = interop_env(args.allow_skips);
            let interop: Vec<(&str, &str)> =
                interop.iter().map(|(k, v)| (*k, v.as_str())).collect();
            run_env("timeout", &cmd, Some(root_ref), &interop).with_context(|| {
                format!(
                    "the test step failed (a failing test or a lint is named above; exit 124 \
                         instead means it ran past its {limit} s, and the hung test printed \
                         `has been running for over 60 seconds`)"
                )
            })?;
            // The tests that rest on real elapsed time and need the machine
            // to themselves, each alone now that the suite is done: rrpc-kv's
            // batch-size tuner converging on a real server (`#[ignore]`d in
            // plain `cargo test`; its decisions are unit-tested on a virtual
            // clock there). Every package's `suite` binary gets the exact
            // filter; only rrpc-kv's has the test.
            // Each must have run and passed: an `--exact` name that matches
            // nothing (a renamed or moved test) passes libtest having run
            // nothing.
            for exact in REAL_TIME_TESTS {
                let mut cmd = cmd.clone();
                cmd.extend(["--test", "suite", "--", "--ignored", "--exact", exact]);
                let out = run_captured("timeout", &cmd, root_ref, &[], &[])
                    .with_context(|| format!("the real-time test {exact} failed"))?;
                check_ran(&tests_ran(&out), &[exact], true)
                    .with_context(|| format!("the real-time test {exact}"))?;
            }
            Ok(Outcome::Ran)
        })?;
        step(
            "soak (short: 10 s on the shm fast path, 5 s on shm HTTP/2, 10 s low load under a busy loop per CPU)",
            &mut || {
                // The test step built the soak binary (its smoke test needs
                // it) in the `test` profile, with the workspace's features.
                let target = target_dir(root_ref)?;
                let built = target.join("debug").join("soak");
                let prebuilt = built.is_file().then_some(built.as_path());
                let hogged: Vec<String> =
                    ["--hog", "--think-us", "2000"].map(String::from).to_vec();
                for (transport, duration, clients, extra) in [
                    ("shm", "10s", 16, Vec::new()),
                    ("shm-h2", "5s", 16, Vec::new()),
                    // Low, uneven load with every thread preempted at random: where the
                    // spin back-off leaves sleeping readers to their doorbells.
                    ("shm", "10s", 4, hogged),
                ] {
                    crate::soak::run_soak_with(
                        root_ref,
                        &crate::soak::SoakArgs {
                            duration: duration.into(),
                            clients,
                            transport: transport.into(),
                            profile: "test".into(),
                            extra,
                        },
                        prebuilt,
                    )?;
                }
                Ok(Outcome::Ran)
            },
        )?;
        step("docs (rustdoc, warnings denied)", &mut || {
            // The docs users read (docs.rs's build: the five library crates,
            // every feature), broken intra-doc links failing; the doctests ran
            // in the test step. With `verbs`, only where libibverbs can be
            // built against. Not the unpublished crates (benches, examples,
            // tests, xtask): their dependencies (clap, criterion, redis,
            // plotters ...) would have to be checked just for this step, as
            // rustdoc reads metadata that the test build's rlibs do not serve.
            let mut a = vec!["doc", "--no-deps"];
            for c in crate::package::CRATES {
                a.extend(["-p", c]);
            }
            match verbs_buildable(root_ref) {
                Ok(()) => a.push("--all-features"),
                Err(why) => return Ok(Outcome::Unavailable(why)),
            }
            run_env(
                "cargo",
                &a,
                Some(root_ref),
                &[("RUSTDOCFLAGS", "-D warnings")],
            )
            .map(|()| Outcome::Ran)
        })?;
        step("package (cargo add check)", &mut || {
            // The five library crates packaged, each holding every file git
            // tracks in its crate; a project outside the workspace builds and
            // runs against the packages without `verbs` (xtask/src/package.rs;
            // the test step, linted, and the docs step built the sources with it).
            let args = crate::package::PackageArgs {
                allow_dirty: true,
                no_scratch: false,
                verbs_build: false,
            };
            crate::package::run_package(root_ref, &args, verbs_buildable(root_ref))
                .map(|()| Outcome::Ran)
        })?;
        // Why a soft-RoCE VM step cannot run here, if it cannot.
        let vm_skip = || -> Option<Outcome> {
            if args.no_rxe {
                return Some(Outcome::Skipped("--no-rxe".into()));
            }
            if !core_has_verbs_feature(root_ref) {
                return Some(Outcome::Unavailable(
                    "rrpc-core has no `verbs` feature".into(),
                ));
            }
            crate::rxe::supported()
                .err()
                .map(|why| Outcome::Unavailable(format!("cannot boot a soft-RoCE VM here: {why}")))
        };
        step("rxe (verbs suite on soft-RoCE)", &mut || {
            if let Some(skip) = vm_skip() {
                return Ok(skip);
            }
            let target = target_dir(root_ref)?;
            let code = crate::rxe::suite::run(
                root_ref,
                &target,
                Duration::from_secs(args.rxe_timeout),
                false,
            )?;
            if code != 0 {
                bail!("the verbs suite in the soft-RoCE VM exited with {code}");
            }
            Ok(Outcome::Ran)
        })?;
        step(
            "rxe NUMA (placement tests in a VM with two emulated NUMA nodes)",
            &mut || {
                if let Some(skip) = vm_skip() {
                    return Ok(skip);
                }
                let target = target_dir(root_ref)?;
                // The test step's build: nothing to compile; a VM of its
                // own (two nodes, the NIC on node 1), bounded at 300 s.
                let code = crate::rxe::suite::run_numa(
                    root_ref,
                    &target,
                    Duration::from_secs(args.rxe_timeout.min(300)),
                    false,
                )?;
                if code != 0 {
                    bail!("the NUMA placement tests in the soft-RoCE VM exited with {code}");
                }
                Ok(Outcome::Ran)
            },
        )?;
        step(
            "rxe --hosts 2 (cross-host suite on two soft-RoCE VMs, clean-wire pass: examples, soak, token and TLS, rrpc-kv, partition and heal, dead server host)",
            &mut || {
                if let Some(skip) = vm_skip() {
                    return Ok(skip);
                }
                let target = target_dir(root_ref)?;
                let code = crate::rxe_hosts::run(
                    root_ref,
                    &target,
                    &crate::rxe::RxeArgs {
                        hosts: 2,
                        timeout: args.rxe_timeout,
                        keep: false,
                        netem: None,
                        netem_a: None,
                        netem_b: None,
                        mtu_a: None,
                        mtu_b: None,
                        soak_secs: 5,
                        // The clean-wire pass (examples, soak on both paths, token
                        // and TLS, rrpc-kv, partition and heal, a dead server host):
                        // the netem pass would double the step's time.
                        clean_only: true,
                        numa: false,
                        cmd: Vec::new(),
                    },
                )?;
                if code != 0 {
                    bail!("the cross-host suite on two soft-RoCE VMs exited with {code}");
                }
                Ok(Outcome::Ran)
            },
        )?;
        step("bench all --quick", &mut || {
            if !args.bench_smoke {
                return Ok(Outcome::Skipped(
                    "not asked for (--bench-smoke); the bench check below runs the suites its ratios come from"
                        .into(),
                ));
            }
            let exe = std::env::current_exe().context("locating xtask")?;
            let exe = exe.to_string_lossy().into_owned();
            // The smoke run proves each suite runs; its numbers say nothing about
            // speed. It runs the suite binaries the test step built (one profile
            // for CI, no second build; thin-LTO `bench` builds are for real
            // measurements).
            run(
                &exe,
                &["bench", "all", "--quick", "--profile", "test", "--no-build"],
                Some(root_ref),
            )
            .map(|()| Outcome::Ran)
        })?;
        if !args.keep_target {
            // The test profile's build (several GiB) is not used past this
            // point (the bench smoke run above used its binaries); fuzzing
            // builds in `target/fuzz`.
            let debug = root_ref.join("target/debug");
            if debug.is_dir() {
                let size = Command::new("du")
                    .args(["-sh", &debug.to_string_lossy()])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                    .unwrap_or_default();
                eprintln!("ci: test build: {size}");
                // This very program lives there too, and the bench step runs it again.
                let exe = std::env::current_exe().context("locating xtask")?;
                prune_except(&debug, &exe)?;
                eprintln!(
                    "ci: removed {} but {} ({})",
                    debug.display(),
                    exe.display(),
                    disk_free(root_ref)
                );
            }
        }
        step("bench check (performance regression guard)", &mut || {
            if args.no_bench_check {
                return Ok(Outcome::Skipped("--no-bench-check".into()));
            }
            let exe = std::env::current_exe().context("locating xtask")?;
            let exe = exe.to_string_lossy().into_owned();
            // Medians of 5 alternating quick rounds against benches/thresholds.toml. It
            // builds its binaries in `release` (the test step's build is unoptimised: its
            // ratios would guard nothing), after the test build is pruned (disk).
            // `--strict`: a ratio skipped for want of redis-server or valgrind fails
            // (`.ci/setup` installs both), unless skips are allowed.
            let mut a = vec!["bench", "check"];
            if !args.allow_skips {
                a.push("--strict");
            }
            run(&exe, &a, Some(root_ref)).map(|()| Outcome::Ran)
        })?;
        step("miri", &mut || {
            if args.no_miri {
                return Ok(Outcome::Skipped("--no-miri".into()));
            }
            if !probe("cargo", &["+nightly", "miri", "--version"]) {
                return Ok(Outcome::Unavailable(
                    "no nightly toolchain with the miri component".into(),
                ));
            }
            // The unsafe memory code on heap-backed regions (rrpc-core's
            // `sys::Mapping` under miri): the region accessors, the shm
            // provider's copy into peer memory, the ring's staging views and
            // its atomic copy out of the receive ring (a peer writing during
            // the copy included), `LocalRing::new` taking the staging ring; and
            // the handshake codec's fixed cases, since it parses peer bytes.
            // (The codec has no unsafe code: its property tests run natively
            // and its fuzz target below, and under miri four cases of each
            // took 165 of this step's 242 s. The ring's pointer logic is safe
            // code and takes too long under miri for CI.)
            for (krate, filters) in [
                (
                    "rrpc-core",
                    &[
                        "handshake::tests::header_errors",
                        "handshake::tests::sections_a_peer",
                        "handshake::tests::oversized_fields",
                        "handshake::tests::tokens_compare",
                        "region::tests",
                        "copy_out",
                    ][..],
                ),
                (
                    "rrpc-ringbuf",
                    &[
                        "mem::tests",
                        "driver::tests::a_local_ring_stages_exactly_its_ring",
                    ][..],
                ),
            ] {
                let mut a = vec!["+nightly", "miri", "test", "-p", krate, "--lib", "--"];
                a.extend_from_slice(filters);
                // Every filter must select a test that passed under miri: a
                // renamed module would otherwise drop out unseen.
                let out = run_captured(
                    "cargo",
                    &a,
                    root_ref,
                    &[("MIRIFLAGS", "-Zmiri-disable-isolation")],
                    crate::util::LINT_VARS,
                )?;
                check_ran(&tests_ran(&out), filters, false)
                    .with_context(|| format!("miri on {krate}"))?;
            }
            Ok(Outcome::Ran)
        })?;
        step("fuzz build", &mut || {
            let Some(dir) = fuzz_dir(root_ref) else {
                return Ok(Outcome::Unavailable("no fuzz/ crate".into()));
            };
            // cargo-fuzz needs nightly (`-Zsanitizer`); `+nightly` overrides the
            // toolchain that ran xtask.
            if !probe("cargo", &["+nightly", "fuzz", "--version"]) {
                return Ok(Outcome::Unavailable(
                    "cargo-fuzz or a nightly toolchain is not installed".into(),
                ));
            }
            // Every target in one crate, so one build with one feature
            // resolution (as one crate per library, tokio, tonic and
            // rrpc-core were built more than once). `--dev`: unoptimised,
            // with debug assertions and overflow checks, which suits a
            // short smoke run and builds in 206 s instead of 299 s here.
            let fuzz_target = root_ref.join("target/fuzz");
            let fuzz_target = fuzz_target.to_string_lossy().into_owned();
            // The verbs provider's parsers need libibverbs to build.
            let verbs = verbs_buildable(root_ref);
            let features: &[&str] = match &verbs {
                Ok(()) => &["--features", "verbs"],
                Err(why) => {
                    eprintln!("fuzz: without the `verbs` targets: {why}");
                    &[]
                }
            };
            let mut build = vec![
                "+nightly",
                "fuzz",
                "build",
                "--dev",
                "--target-dir",
                &fuzz_target,
            ];
            build.extend(features);
            run_unlinted("cargo", &build, Some(&dir), &[])?;
            if args.fuzz_seconds > 0 {
                let budget = format!("-max_total_time={}", args.fuzz_seconds);
                let mut fuzzed = 0;
                for t in fuzz_targets(&dir)? {
                    if verbs.is_err() && t.starts_with("verbs_") {
                        continue;
                    }
                    let seeds = fuzz_seeds(&dir, &t)?;
                    // New inputs go to a scratch corpus under target/, so a CI run
                    // never dirties the checked-in seed corpus.
                    let scratch = root_ref.join("target/fuzz-corpus").join(&t);
                    std::fs::create_dir_all(&scratch)?;
                    let scratch = scratch.to_string_lossy().into_owned();
                    let seeds = seeds.to_string_lossy().into_owned();
                    let mut args = vec![
                        "+nightly",
                        "fuzz",
                        "run",
                        "--dev",
                        "--target-dir",
                        &fuzz_target,
                    ];
                    args.extend(features);
                    args.extend([t.as_str(), scratch.as_str(), seeds.as_str()]);
                    args.extend(["--", budget.as_str()]);
                    run_unlinted("cargo", &args, Some(&dir), &[])?;
                    fuzzed += 1;
                }
                if fuzzed == 0 {
                    bail!("no fuzz target ran (all need `verbs`, which cannot be built here)");
                }
            }
            Ok(Outcome::Ran)
        })?;
        Ok(())
    })();
    eprintln!("\n=== ci summary");
    for (name, el, status) in &times {
        eprintln!("  {name:<20} {:>8.1}s  {status}", el.as_secs_f64());
    }
    eprintln!("  {:<20} {:>8.1}s", "total", total.elapsed().as_secs_f64());
    let digest = crate::util::digest();
    if result.is_err() && !digest.is_empty() {
        eprintln!(
            "\n=== ci: what failed (first {} lines naming a failure in the steps that failed; the full output is above)",
            digest.len()
        );
        for line in &digest {
            eprintln!("  {line}");
        }
    }
    result
}

/// Removes everything in `dir` but `keep` (a file directly in it).
fn prune_except(dir: &Path, keep: &Path) -> Result<()> {
    let keep = keep.canonicalize().unwrap_or_else(|_| keep.to_path_buf());
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.canonicalize().is_ok_and(|p| p == keep) {
            continue;
        }
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

/// Space left on the file system that holds `dir`, for the log (`df`'s
/// words; "unknown" when `df` fails).
fn disk_free(dir: &Path) -> String {
    Command::new("df")
        .args(["-Pk", &dir.to_string_lossy()])
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8(o.stdout).ok()?;
            let avail_kib: u64 = text
                .lines()
                .nth(1)?
                .split_whitespace()
                .nth(3)?
                .parse()
                .ok()?;
            Some(format!(
                "{:.1} GiB free",
                avail_kib as f64 / (1024.0 * 1024.0)
            ))
        })
        .unwrap_or_else(|| "disk space unknown".into())
}

/// Set for every CI step unless the caller set it: no incremental
/// compilation, whose caches (7 GiB of the test profile's 17 GiB here) a
/// one-shot build never reads, and which once filled a CI machine's disk.
const CI_ENV: &[(&str, &str)] = &[("CARGO_INCREMENTAL", "0")];

/// Links with mold when it is installed (`.ci/setup` installs it), on
/// x86-64 Linux, unless the caller chose rustflags: the test build links
/// about 70 test binaries, and GNU ld took 5.5 of the 7.6 s that one
/// integration test binary took to rebuild (mold: 2.0 s in all). Only
/// the test build is affected: cargo-fuzz and miri set `RUSTFLAGS`, which
/// takes precedence.
fn fast_linker() -> Option<(&'static str, &'static str)> {
    const VAR: &str = "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS";
    let x86_linux = cfg!(all(target_arch = "x86_64", target_os = "linux"));
    let chosen = std::env::var_os(VAR).is_some()
        || std::env::var_os("RUSTFLAGS").is_some()
        || std::env::var_os("CARGO_ENCODED_RUSTFLAGS").is_some();
    (x86_linux && !chosen && probe("mold", &["--version"]))
        .then_some((VAR, "-C link-arg=-fuse-ld=mold"))
}

/// The variables under which cargo compiles the workspace's own crates with
/// clippy-driver (a rustc that also runs clippy's lints), warnings denied:
/// what `cargo clippy -- -D warnings` sets for its check build, here for
/// every build CI makes, so the test build is also the lint pass. Crates
/// from crates.io are compiled by rustc as ever. `util::run_unlinted`
/// clears them where a build must not be linted (the guard's optimised
/// build: clippy-driver turns MIR optimisations off) or cannot be (miri and
/// cargo-fuzz wrap rustc themselves).
fn lint_env(driver: &str) -> [(&'static str, &str); 2] {
    [
        ("RUSTC_WORKSPACE_WRAPPER", driver),
        // clippy-driver's arguments, each followed by this separator (as
        // cargo-clippy passes `-- -D warnings`).
        (
            "CLIPPY_ARGS",
            "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
        ),
    ]
}

/// The path of `toolchain`'s clippy-driver (`rustup which`); an error
/// when clippy is not installed for it.
fn clippy_driver(toolchain: &str) -> Result<String> {
    let out = Command::new("rustup")
        .args(["which", "--toolchain", toolchain, "clippy-driver"])
        .output()
        .context("running `rustup which clippy-driver`")?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || path.is_empty() {
        bail!(
            "no clippy-driver for toolchain {toolchain} (CI lints while it builds the tests): \
             `rustup component add --toolchain {toolchain} clippy` ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(path)
}

/// The rustup toolchain of the workspace's `rust-version` (`1.95` →
/// `1.95.0`: the oldest release that version admits).
pub(crate) fn msrv_toolchain(root: &Path) -> Result<String> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).context("reading Cargo.toml")?;
    let table: toml::Table = toml::from_str(&text).context("parsing Cargo.toml")?;
    let v = table
        .get("workspace")
        .and_then(|w| w.get("package"))
        .and_then(|p| p.get("rust-version"))
        .and_then(|v| v.as_str())
        .context("Cargo.toml has no [workspace.package] rust-version")?;
    Ok(match v.split('.').count() {
        2 => format!("{v}.0"),
        _ => v.to_owned(),
    })
}

/// Entry point of `cargo xtask ci`. Re-runs itself once with [`CI_ENV`] (and
/// [`fast_linker`]'s choice) in its environment, so that every cargo it starts, directly or through the
/// soak, rxe and bench commands, builds the same way.
pub(crate) fn run_entry(args: &CiArgs) -> Result<()> {
    let mut env: Vec<(&str, &str)> = CI_ENV.to_vec();
    if let Some(link) = fast_linker() {
        env.push(link);
    }
    // Every stable build with the toolchain the manifests' `rust-version`
    // names (`.ci/setup` installs it), so the version cargo add's users
    // are promised is the one CI builds and tests with. `+nightly` (miri,
    // cargo-fuzz) still takes precedence over this variable.
    let toolchain = msrv_toolchain(&workspace_root())?;
    env.push(("RUSTUP_TOOLCHAIN", toolchain.as_str()));
    let driver = clippy_driver(&toolchain)?;
    env.extend(lint_env(&driver));
    let missing: Vec<_> = env
        .iter()
        .filter(|(k, v)| std::env::var(k).ok().as_deref() != Some(*v))
        .collect();
    if missing.is_empty() {
        return run_ci(args);
    }
    let exe = std::env::current_exe().context("locating xtask")?;
    let status = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .envs(missing.iter().map(|(k, v)| (*k, *v)))
        .status()
        .context("re-running xtask ci")?;
    if !status.success() {
        bail!("cargo xtask ci failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_verbs_feature_of_this_workspace() {
        let root = workspace_root();
        let text = std::fs::read_to_string(root.join("crates/rrpc-core/Cargo.toml")).unwrap();
        assert_eq!(core_has_verbs_feature(&root), text.contains("\nverbs"));
    }

    /// The test build goes, the running xtask stays (the bench step runs
    /// it again; the last CI rehearsal failed there when it went too).
    #[test]
    fn the_msrv_toolchain_is_a_full_release() {
        let t = msrv_toolchain(&workspace_root()).unwrap();
        assert_eq!(t.split('.').count(), 3, "{t}");
    }

    /// libtest's lines as a filtered `cargo test` prints them: binaries
    /// that ran nothing, one that ran the test, a doctest run.
    const FILTERED_RUN: &str = "
running 0 tests

test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 120 filtered out; finished in 0.00s


running 1 test
test rfrpc_batch::tuner_converges_to_the_latency_bound ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 87 filtered out; finished in 4.12s

running 2 tests
test region::tests::bounds ... ok
test region::tests::copy_out_wraps ... ok

test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out; finished in 9.50s

   Doc-tests rrpc_core

running 0 tests

test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 3 filtered out; finished in 0.00s
";

    #[test]
    fn libtest_counts_are_summed_over_binaries() {
        let ran = tests_ran(FILTERED_RUN);
        assert_eq!(ran.passed, 3);
        assert_eq!(ran.binaries, 4);
        assert_eq!(
            ran.ok,
            [
                "rfrpc_batch::tuner_converges_to_the_latency_bound",
                "region::tests::bounds",
                "region::tests::copy_out_wraps"
            ]
        );
        // A failed run still counts what passed (the step fails on its exit).
        let failed = tests_ran(
            "test a ... FAILED\ntest b ... ok\n\
             test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n",
        );
        assert_eq!((failed.passed, failed.binaries), (1, 1));
        assert_eq!(failed.ok, ["b"]);
        assert_eq!(
            tests_ran("   Compiling x v0.1.0\nno tests here\n"),
            TestsRan::default()
        );
    }

    #[test]
    fn a_filtered_step_that_ran_nothing_fails() {
        // Every binary filtered everything out: 0 passed.
        let none = tests_ran(
            "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; \
             120 filtered out; finished in 0.00s\n",
        );
        let e = check_ran(&none, &["rfrpc_batch::tuner"], true).unwrap_err();
        assert!(format!("{e}").contains("no test ran"), "{e}");
        // No libtest output at all (the binary never ran).
        assert!(check_ran(&TestsRan::default(), &["x"], false).is_err());

        let ran = tests_ran(FILTERED_RUN);
        check_ran(
            &ran,
            &["rfrpc_batch::tuner_converges_to_the_latency_bound"],
            true,
        )
        .unwrap();
        check_ran(&ran, &["region::tests", "copy_out"], false).unwrap();
        // One filter of several matched nothing: named.
        let e = check_ran(&ran, &["region::tests", "mem::tests"], false).unwrap_err();
        assert!(format!("{e}").contains("mem::tests"), "{e}");
        // `--exact` wants the whole name.
        assert!(check_ran(&ran, &["rfrpc_batch::tuner"], true).is_err());
    }

    /// Real libtest output, captured: this test binary run again with an
    /// `--exact` name that matches nothing passes (libtest exits 0) and is
    /// caught; with a test's name, it counts that one test.
    #[test]
    fn a_real_exact_filter_that_matches_nothing_is_caught() {
        let me = std::env::current_exe().unwrap();
        let me = me.to_string_lossy();
        let dir = workspace_root();
        let out = run_captured(
            &me,
            &["--exact", "ci::tests::no_such_test", "--test-threads=1"],
            &dir,
            &[],
            &[],
        )
        .expect("libtest exits 0 having run nothing");
        let e = check_ran(&tests_ran(&out), &["ci::tests::no_such_test"], true).unwrap_err();
        assert!(format!("{e}").contains("no test ran"), "{e}");
        let name = "ci::tests::the_msrv_toolchain_is_a_full_release";
        let out = run_captured(&me, &["--exact", name], &dir, &[], &[]).unwrap();
        let ran = tests_ran(&out);
        assert_eq!((ran.passed, ran.ok.as_slice()), (1, &[name.to_owned()][..]));
        check_ran(&ran, &[name], true).unwrap();
    }

    #[test]
    fn fuzz_targets_and_seeds_must_exist() {
        let dir = std::env::temp_dir().join(format!("rrpc-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // No fuzz_targets directory: an error, not an empty list.
        std::fs::create_dir_all(&dir).unwrap();
        assert!(fuzz_targets(&dir).is_err());
        // An empty one.
        std::fs::create_dir_all(dir.join("fuzz_targets")).unwrap();
        let e = fuzz_targets(&dir).unwrap_err();
        assert!(format!("{e}").contains("no fuzz target"), "{e}");
        std::fs::write(dir.join("fuzz_targets/b.rs"), "").unwrap();
        std::fs::write(dir.join("fuzz_targets/a.rs"), "").unwrap();
        std::fs::write(dir.join("fuzz_targets/notes.txt"), "").unwrap();
        assert_eq!(fuzz_targets(&dir).unwrap(), ["a", "b"]);
        // Seeds: missing, then empty, then one file.
        assert!(fuzz_seeds(&dir, "a").is_err());
        std::fs::create_dir_all(dir.join("corpus/a")).unwrap();
        let e = fuzz_seeds(&dir, "a").unwrap_err();
        assert!(format!("{e}").contains("empty"), "{e}");
        std::fs::write(dir.join("corpus/a/seed"), b"x").unwrap();
        assert_eq!(fuzz_seeds(&dir, "a").unwrap(), dir.join("corpus/a"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The workspace's own fuzz crate passes the checks the fuzz step makes.
    #[test]
    fn every_fuzz_target_of_this_workspace_has_seeds() {
        let dir = fuzz_dir(&workspace_root()).expect("fuzz/");
        for t in fuzz_targets(&dir).unwrap() {
            fuzz_seeds(&dir, &t).unwrap();
        }
    }

    #[test]
    fn pruning_keeps_the_running_program() {
        let dir = std::env::temp_dir().join(format!("rrpc-prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("deps/sub")).unwrap();
        std::fs::write(dir.join("deps/sub/x.rlib"), b"x").unwrap();
        std::fs::write(dir.join("xtask"), b"me").unwrap();
        std::fs::write(dir.join("soak"), b"other").unwrap();
        prune_except(&dir, &dir.join("xtask")).unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["xtask"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
