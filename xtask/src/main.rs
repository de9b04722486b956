//! Developer tasks for the rrpc workspace. Run `cargo xtask --help`.

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(about = "rrpc developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Everything CI checks: fmt, clippy -D warnings, the test suite.
    Ci,
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    eprintln!("==> {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .status()
        .with_context(|| format!("spawning {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Ci => {
            run("cargo", &["fmt", "--all", "--", "--check"])?;
            run(
                "cargo",
                &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"],
            )?;
            run("cargo", &["test", "--workspace"])?;
        }
    }
    Ok(())
}
