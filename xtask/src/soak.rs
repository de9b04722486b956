//! `cargo xtask soak`: builds the soak binary (`benches/src/bin/soak.rs`) and
//! runs it: many clients, random sizes and patterns, every byte checked. Its
//! last line reads `calls: <n> failed: <f> lost: <l>`; the exit code is the
//! soak's.

use std::path::Path;

use anyhow::Result;

use crate::util::run;

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
    run_soak_with(root, args, None)
}

/// [`run_soak`], or with `prebuilt` (a soak binary already built, e.g. by
/// `cargo test --workspace` in CI) run directly: `cargo run -p rrpc-bench`
/// resolves features for that package alone and recompiles dependencies
/// the workspace build already has.
pub(crate) fn run_soak_with(root: &Path, args: &SoakArgs, prebuilt: Option<&Path>) -> Result<()> {
    let clients = args.clients.to_string();
    let mut soak_args = vec![
        "--duration",
        &args.duration,
        "--clients",
        &clients,
        "--transport",
        &args.transport,
    ];
    soak_args.extend(args.extra.iter().map(String::as_str));
    if let Some(exe) = prebuilt {
        return run(&exe.to_string_lossy(), &soak_args, Some(root));
    }
    let mut argv = vec![
        "run",
        "-p",
        "rrpc-bench",
        "--bin",
        "soak",
        "--profile",
        &args.profile,
        "--",
    ];
    argv.extend(soak_args);
    run("cargo", &argv, Some(root))
}
