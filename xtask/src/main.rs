//! Developer tasks for the rrpc workspace. Run `cargo xtask --help`.
//!
//! - `cargo xtask ci`: everything CI checks, each step timed.
//! - `cargo xtask bench <suite> [--quick] [--out DIR] [--json] [--compare-paper]
//!   [--hosts hosts.toml --launcher ssh|local]`: builds the suite binaries of `rrpc-bench` once,
//!   runs them, and writes CSV + Markdown + JSON per experiment, `summary.md` and SVG/PNG plots;
//!   a full `bench all` also regenerates `docs/benchmarks.md` (`--no-doc` keeps it).
//!   Cluster mode is tested on one machine with `--hosts xtask/hosts.loopback.toml --launcher
//!   local`, and over real ssh with `xtask/loopback-ssh.sh` (a throwaway sshd on 127.0.0.1 only;
//!   needs `/usr/sbin/sshd`; starts a daemon, so it is not part of `ci`).
//! - `cargo xtask rxe [--timeout SECS] [-- CMD...]`: runs CMD (default: the verbs suite, built
//!   on the host first) as root in a throwaway qemu VM with a soft-RoCE device `rxe0`; see
//!   `rxe.rs`.
//! - `cargo xtask verbs-selftest [--device NAME]`: the verbs suite natively on a real RDMA device
//!   plus a short ping-pong; without a device, a report of what was found.
//! - `cargo xtask bench check [--rounds N] [--thresholds FILE] [--no-build]`: the performance
//!   regression guard (`check.rs`): medians of alternating quick runs against the committed
//!   thresholds of `benches/thresholds.toml`; fails naming each ratio that is worse.
//! - `cargo xtask plot <DIR>...`: redraws the SVG/PNG plots of results already written by
//!   `bench` (each `<experiment>.json` in DIR and its suite subdirectories), in place.

mod bench;
mod check;
mod ci;
mod cluster;
mod layers;
mod package;
mod paper;
mod plot;
mod rxe;
mod rxe_hosts;
mod selftest;
mod signals;
mod soak;
mod util;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(about = "rrpc developer tasks")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
    /// Everything CI checks: fmt, clippy -D warnings, tests, verbs build + work-request tests (if
    /// possible), the verbs suite in a soft-RoCE VM (`cargo xtask rxe`; `--no-rxe`), miri on the sans-IO cores (if installed),
    /// `bench all --quick`, fuzz builds (if cargo-fuzz is installed).
    Ci(ci::CiArgs),
    /// Run a benchmark suite and write tables and plots.
    Bench(BenchArgs),
    /// Run a command (default: the verbs suite) as root in a throwaway qemu VM with a
    /// soft-RoCE device `rxe0` (`RRPC_TEST_DEVICE=rxe0`); exits with the command's code
    /// (124 on timeout). Tested on soft-RoCE (rdma_rxe) in a VM; not run on an RDMA NIC.
    Rxe(rxe::RxeArgs),
    /// On a machine with an RDMA device: the verbs suite natively plus a short
    /// `ibv_rc_pingpong`; without one, says so and lists what it found.
    VerbsSelftest(selftest::SelftestArgs),
    /// Many clients, random traffic, every byte checked.
    Soak(soak::SoakArgs),
    /// Package the five library crates and build and run a scratch project
    /// outside the workspace against the packages (what `cargo add` gets).
    Package(package::PackageArgs),
    /// The import circles inside each library crate, and the declared layer
    /// order of those that have one (CI fails on a circle or a back-arrow not
    /// listed with its reason).
    Layers(layers::LayersArgs),
    /// Redraw the plots of existing results (`target/bench-results/<run>/`), in place.
    Plot {
        /// Result directories written by `cargo xtask bench` (suite subdirectories included).
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
}

/// `cargo xtask bench` options.
#[derive(clap::Args, Debug, Clone)]
struct BenchArgs {
    /// Suite: fabric, ringbuf, poller, rpc, kv, connect or all; or `check`, the performance
    /// regression guard (medians of alternating quick runs against `benches/thresholds.toml`).
    suite: String,
    /// Short smoke run (seconds per suite): proves the suite runs, says nothing about speed.
    #[arg(long)]
    quick: bool,
    /// Output directory (default `target/bench-results/<timestamp>-<suite>/`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print one machine-readable JSON document on stdout instead of the tables.
    #[arg(long)]
    json: bool,
    /// Add a table of the paper's headline figures beside ours (different hardware!).
    #[arg(long)]
    compare_paper: bool,
    /// Cluster mode: start servers and clients on the hosts listed in this file.
    #[arg(long)]
    hosts: Option<PathBuf>,
    /// How cluster mode starts processes: over ssh, or as local processes (same plan).
    #[arg(long, value_enum, default_value_t = cluster::LauncherKind::Ssh)]
    launcher: cluster::LauncherKind,
    /// Cargo profile for the suite binaries (`bench` = release + thin LTO, or `release`).
    /// Default: `bench`; `release` for `check`.
    #[arg(long)]
    profile: Option<String>,
    /// `bench all` (full, local) regenerates `docs/benchmarks.md` and its plots in
    /// `docs/img/bench/`; this keeps the docs as they are.
    #[arg(long)]
    no_doc: bool,
    /// Run the suite binaries already built in `--profile`'s directory instead
    /// of building them (CI: the test step's build made them, with the
    /// workspace's features, so the smoke run costs no second build).
    #[arg(long)]
    no_build: bool,
    /// `check`: rounds (each runs every source once; the median across rounds is judged).
    #[arg(long)]
    rounds: Option<usize>,
    /// `check`: the thresholds file (default `benches/thresholds.toml`).
    #[arg(long)]
    thresholds: Option<PathBuf>,
    /// `check`: a ratio skipped for a missing program (redis-server, valgrind) fails the
    /// check (CI: `.ci/setup` installs them).
    #[arg(long)]
    strict: bool,
    /// Passed to the suite binary after `--`, e.g. `cargo xtask bench rpc -- --only resources`
    /// (see `<suite> --help`).
    #[arg(last = true)]
    suite_args: Vec<String>,
}

impl BenchArgs {
    /// The cargo profile of the suite binaries (`bench` unless `--profile`).
    fn profile(&self) -> &str {
        self.profile.as_deref().unwrap_or("bench")
    }
}

/// Errors are printed with their causes, without a backtrace (CI sets
/// `RUST_BACKTRACE`, and anyhow's trace of xtask would bury the step table
/// and the failure digest that end the log).
fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Ci(args) => ci::run_entry(&args),
        Cmd::Bench(args) => bench::run(&args),
        Cmd::Plot { dirs } => bench::replot(&dirs),
        Cmd::Rxe(args) => {
            let code = if args.hosts == 1 {
                rxe::run(&args)?
            } else {
                let root = util::workspace_root();
                rxe_hosts::run(&root, &util::target_dir(&root)?, &args)?
            };
            std::process::exit(code)
        }
        Cmd::VerbsSelftest(args) => {
            let code = selftest::run(&args)?;
            std::process::exit(code)
        }
        Cmd::Soak(args) => soak::run_soak(&util::workspace_root(), &args),
        Cmd::Layers(args) => layers::run(&util::workspace_root(), &args),
        Cmd::Package(args) => {
            let root = util::workspace_root();
            let verbs = ci::verbs_buildable(&root);
            package::run_package(&root, &args, verbs)
        }
    }
}
