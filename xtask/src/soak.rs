//! `cargo xtask soak`: builds the soak binary (`benches/src/bin/soak.rs`) and
//! runs it: many clients, random sizes and patterns, every byte checked. Its
//! last line reads `calls: <n> failed: <f> lost: <l>`; the exit code is the
//! soak's.

use std::path::Path;

use anyhow::Result;

use crate::ci::run;

/// Arguments of `cargo xtask soak`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct SoakArgs {
    /// How long the clients run (`60s`, `2m`, `500ms`).
    #[arg(long, default_value = "60s")]
    pub(crate) duration: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    pub(crate) clients: usize,
    /// `shm` (fast path), `shm-h2`, `tcp` or `inproc`.
    #[arg(long, default_value = "shm")]
    pub(crate) transport: String,
    /// Cargo profile to build with (`test` reuses `cargo test`'s build).
    #[arg(long, default_value = "test")]
    pub(crate) profile: String,
    /// Further arguments for the soak binary (after `--`).
    #[arg(last = true)]
    pub(crate) extra: Vec<String>,
}

/// Builds and runs the soak in `root`.
pub(crate) fn run_soak(root: &Path, args: &SoakArgs) -> Result<()> {
    let clients = args.clients.to_string();
    let mut argv = vec![
        "run",
        "-p",
        "rrpc-bench",
        "--bin",
        "soak",
        "--profile",
        &args.profile,
        "--",
        "--duration",
        &args.duration,
        "--clients",
        &clients,
        "--transport",
        &args.transport,
    ];
    argv.extend(args.extra.iter().map(String::as_str));
    run("cargo", &argv, Some(root))
}
