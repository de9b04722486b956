//! `cargo xtask package`: what a stranger's `cargo add` gets.
//!
//! 1. `cargo package --no-verify` for the five library crates ([`CRATES`]):
//!    the `.crate` files crates.io would hold, their sizes and file counts
//!    printed.
//! 2. Each `.crate` unpacked under `target/package-check/crates/`: from here
//!    on nothing of the workspace is used, only what the packages hold
//!    (their normalised manifests, sources, build scripts and protos).
//! 3. A scratch project outside the workspace (`target/package-check/scratch`,
//!    with its own `Cargo.lock`) that depends on `rrpc-tonic` and `rrpc-kv`
//!    by version, as `cargo add` writes them, with `[patch.crates-io]`
//!    pointing those names (and their rrpc dependencies) at the unpacked
//!    packages. It builds and runs a tonic service (`grpc.health.v1.Health`
//!    from `tonic-health`, generated code a user would have) over `shm://`,
//!    and runs rrpc-kv's store (as a library: `default-features = false`,
//!    without its binaries' dependencies), without features. With
//!    `--verbs-build` (and libibverbs to build against) it builds and runs
//!    once more with `features = ["verbs"]`.
//! 4. Every file git tracks in each crate's directory is in its package
//!    ([`missing_from_package`]): a source that only one feature compiles
//!    (the `verbs` provider's) cannot be left out of the `.crate` unseen
//!    when the scratch build does not turn that feature on. CI runs the
//!    scratch build without `verbs` and this listing check (the verbs
//!    build of the scratch project cost 108 of the step's 257 s; the test
//!    step, linted as it builds, and the rustdoc step build the same
//!    sources with `verbs`).
//!
//! Building each package from its unpacked sources is what `cargo package`'s
//! own verification does; this does it once for all five (with the crates'
//! real dependents) instead of five times, and then runs something.
//!
//! The scratch build shares the workspace's target directory and copies its
//! `[profile.*]` tables, so the dependencies whose features match the test
//! build's are not compiled again (`--profile test`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util::run;

/// The library crates, in dependency order.
pub(crate) const CRATES: &[&str] = &[
    "rrpc-core",
    "rrpc-ringbuf",
    "rrpc-poller",
    "rrpc-tonic",
    "rrpc-kv",
];

/// What `cargo xtask package` takes.
#[derive(clap::Args, Debug)]
pub(crate) struct PackageArgs {
    /// Package a working tree with uncommitted changes (`cargo package
    /// --allow-dirty`); CI packages a clean clone.
    #[arg(long)]
    pub(crate) allow_dirty: bool,
    /// Only build the `.crate` files and print their sizes (and check that
    /// they hold every tracked file).
    #[arg(long)]
    pub(crate) no_scratch: bool,
    /// Build and run the scratch project a second time with
    /// `features = ["verbs"]` (needs libibverbs' headers).
    #[arg(long)]
    pub(crate) verbs_build: bool,
}

/// One packaged crate.
#[derive(Debug)]
struct Packaged {
    name: &'static str,
    file: PathBuf,
    bytes: u64,
    files: usize,
    /// Where it was unpacked.
    dir: PathBuf,
}

/// Runs the whole check (see the module docs). `verbs_buildable`: whether
/// libibverbs can be built against here (`Err` says why not).
pub(crate) fn run_package(
    root: &Path,
    args: &PackageArgs,
    verbs_buildable: Result<(), String>,
) -> Result<()> {
    let target = crate::util::target_dir(root)?;
    let mut cmd = vec!["package", "--no-verify"];
    if args.allow_dirty {
        cmd.push("--allow-dirty");
    }
    for c in CRATES {
        cmd.extend(["-p", c]);
    }
    run("cargo", &cmd, Some(root))?;
    let check = target.join("package-check");
    let unpacked = check.join("crates");
    if unpacked.exists() {
        std::fs::remove_dir_all(&unpacked)
            .with_context(|| format!("removing {}", unpacked.display()))?;
    }
    std::fs::create_dir_all(&unpacked)?;
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))?
        .parse()
        .context("parsing Cargo.toml")?;
    let version = workspace_version(&manifest)?;
    let mut packaged = Vec::new();
    for name in CRATES {
        let file = target
            .join("package")
            .join(format!("{name}-{version}.crate"));
        let bytes = std::fs::metadata(&file)
            .with_context(|| format!("cargo package made no {}", file.display()))?
            .len();
        let list = Command::new("tar").arg("tzf").arg(&file).output()?;
        if !list.status.success() {
            bail!("tar cannot list {}", file.display());
        }
        let listed = String::from_utf8_lossy(&list.stdout).into_owned();
        let files = listed.lines().count();
        let tracked = capture_quiet("git", &["ls-files", "--", &format!("crates/{name}")], root)?;
        let missing = missing_from_package(
            &format!("crates/{name}/"),
            &tracked,
            &format!("{name}-{version}/"),
            &listed,
        );
        if !missing.is_empty() {
            bail!(
                "{} lacks files git tracks in crates/{name} (a build with a feature that \
                 compiles them would fail for `cargo add` users; see `include`/`exclude` \
                 in its Cargo.toml): {}",
                file.display(),
                missing.join(", ")
            );
        }
        // `m`: the files get the time of unpacking, so cargo rebuilds the
        // packages from them every run (with their own times, a scratch
        // target from an earlier run looked fresh, and a package missing
        // its build script's input still passed).
        let st = Command::new("tar")
            .arg("xzmf")
            .arg(&file)
            .arg("-C")
            .arg(&unpacked)
            .status()?;
        if !st.success() {
            bail!("tar cannot unpack {}", file.display());
        }
        packaged.push(Packaged {
            name,
            file: file.clone(),
            bytes,
            files,
            dir: unpacked.join(format!("{name}-{version}")),
        });
    }
    eprintln!("package: the five library crates as crates.io would hold them:");
    for p in &packaged {
        eprintln!(
            "  {:<14} {:>8.1} KiB  {:>4} files  {}",
            p.name,
            p.bytes as f64 / 1024.0,
            p.files,
            p.file.display()
        );
    }
    if args.no_scratch {
        return Ok(());
    }
    let profiles = profile_tables(&manifest)?;
    eprintln!("package: each package holds every file git tracks in its crate");
    let mut variants = vec![("plain", "")];
    match (args.verbs_build, verbs_buildable) {
        (true, Ok(())) => variants.push(("verbs", ", features = [\"verbs\"]")),
        (true, Err(why)) => bail!("--verbs-build: cannot build with `verbs` here: {why}"),
        (false, _) => eprintln!(
            "package: the scratch project without `verbs` (`--verbs-build` adds a build with it)"
        ),
    }
    for (label, features) in variants {
        let dir = check.join(format!("scratch-{label}"));
        write_scratch(&dir, &packaged, &version, features, &profiles)?;
        // Its own lock file, resolved against crates.io as a user's would be.
        let _ = std::fs::remove_file(dir.join("Cargo.lock"));
        let target_s = target.to_string_lossy().into_owned();
        let manifest = dir.join("Cargo.toml").to_string_lossy().into_owned();
        let common = [
            "--profile",
            "test",
            "--target-dir",
            target_s.as_str(),
            "--manifest-path",
            manifest.as_str(),
        ];
        let mut build = vec!["build"];
        build.extend(common);
        let out = capture("cargo", &build, &dir).with_context(|| {
            format!("building the scratch project ({label}) against the packaged crates")
        })?;
        // A user sees the warnings of the packages (patched path dependencies
        // are local to cargo): none may come from ours.
        let warned: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("warning: `rrpc-") && l.contains(" generated "))
            .collect();
        if !warned.is_empty() {
            bail!(
                "the packaged crates build with warnings ({label}): {}",
                warned.join("; ")
            );
        }
        let mut run_args = vec!["run"];
        run_args.extend(common);
        run("cargo", &run_args, Some(&dir))
            .with_context(|| format!("running the scratch project ({label})"))?;
    }
    Ok(())
}

/// What `git ls-files` lists under `crate_dir` (`crates/NAME/`) that the
/// package listing (`tar tzf`, every path under `prefix`, `NAME-VERSION/`)
/// lacks, as paths relative to the crate.
fn missing_from_package(crate_dir: &str, tracked: &str, prefix: &str, listed: &str) -> Vec<String> {
    let packaged: std::collections::BTreeSet<&str> = listed
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .collect();
    tracked
        .lines()
        .filter_map(|l| l.strip_prefix(crate_dir))
        .filter(|f| !packaged.contains(f))
        .map(str::to_owned)
        .collect()
}

/// A command's standard output; fails on a non-zero exit.
fn capture_quiet(program: &str, args: &[&str], dir: &Path) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .with_context(|| format!("starting {program}"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed with {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command, echoing its output; fails on a non-zero exit. Returns
/// what it wrote to stderr (cargo's messages).
fn capture(program: &str, args: &[&str], dir: &Path) -> Result<String> {
    eprintln!("==> {program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .with_context(|| format!("starting {program}"))?;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprint!("{err}");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        bail!("`{program} {}` failed with {}", args.join(" "), out.status);
    }
    Ok(err)
}

/// `[workspace.package] version`.
fn workspace_version(doc: &toml::Table) -> Result<String> {
    doc.get("workspace")
        .and_then(|w| w.get("package"))
        .and_then(|p| p.get("version"))
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .context("no [workspace.package] version in Cargo.toml")
}

/// The workspace manifest's `[profile.*]` tables, as TOML text.
fn profile_tables(doc: &toml::Table) -> Result<String> {
    let Some(profile) = doc.get("profile") else {
        return Ok(String::new());
    };
    let mut t = toml::Table::new();
    t.insert("profile".into(), profile.clone());
    Ok(toml::to_string(&t)?)
}

fn write_scratch(
    dir: &Path,
    packaged: &[Packaged],
    version: &str,
    features: &str,
    profiles: &str,
) -> Result<()> {
    std::fs::create_dir_all(dir.join("src"))?;
    let mut patch = String::new();
    for p in packaged {
        patch.push_str(&format!(
            "{} = {{ path = {:?} }}\n",
            p.name,
            p.dir.to_string_lossy()
        ));
    }
    let manifest = format!(
        r#"# Written by `cargo xtask package`: a user's project, outside the rrpc
# workspace, depending on the packaged crates (see xtask/src/package.rs).
[package]
name = "rrpc-cargo-add-check"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[dependencies]
rrpc-tonic = {{ version = "{version}"{features} }}
rrpc-kv = {{ version = "{version}", default-features = false{features} }}
tokio = {{ version = "1", features = ["macros", "rt-multi-thread"] }}
tonic-health = "0.14"

[patch.crates-io]
{patch}
{profiles}"#
    );
    std::fs::write(dir.join("Cargo.toml"), manifest)?;
    std::fs::write(dir.join("src/main.rs"), SCRATCH_MAIN)?;
    Ok(())
}

/// The scratch project's program: a tonic service over `shm://` on the
/// packaged rrpc-tonic, and rrpc-kv's store.
const SCRATCH_MAIN: &str = r#"//! Written by `cargo xtask package`.
use std::time::Duration;

use rrpc_kv::{Execute, Op, OpResult};
use rrpc_tonic::{RrpcChannel, RrpcConfig, Server};
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("rrpc-cargo-add-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let uri = format!("shm://{}", dir.join("health.sock").display());
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("greeter", ServingStatus::Serving)
        .await;
    let at = uri.clone();
    let server = tokio::spawn(async move {
        Server::builder()
            .add_service(service)
            .serve_rrpc(&at, RrpcConfig::default())
            .await
    });
    let mut tries = 0;
    let channel = loop {
        match RrpcChannel::connect(&uri, RrpcConfig::default()).await {
            Ok(c) => break c,
            Err(e) if tries < 250 && !server.is_finished() => {
                tries += 1;
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(format!("connecting to {uri}: {e}").into()),
        }
    };
    let mut client = HealthClient::new(channel.clone());
    let status = client
        .check(HealthCheckRequest { service: "greeter".into() })
        .await?
        .into_inner()
        .status;
    if status != ServingStatus::Serving as i32 {
        return Err(format!("health check answered {status}, not SERVING").into());
    }
    let store = rrpc_kv::store::Store::open(
        rrpc_kv::store::StoreConfig::builder()
            .partitions(1)
            .memory_bound(16 << 20).build()?,
    )?;
    let put = store.execute(Op::Put { key: "k".into(), value: "v".into() });
    let got = store.execute(Op::Get { key: "k".into() });
    if put != OpResult::Ok || got != OpResult::Value("v".into()) {
        return Err(format!("rrpc-kv's store: PUT {put:?}, then GET {got:?}").into());
    }
    println!(
        "cargo-add check: grpc.health.v1.Health over {uri} answered SERVING; carried by {:?}; rrpc-kv's store PUT and GET a key",
        channel.carrier()
    );
    server.abort();
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracked_file_left_out_of_the_package_is_named() {
        let tracked = "crates/rrpc-core/Cargo.toml\ncrates/rrpc-core/src/lib.rs\n\
                       crates/rrpc-core/src/provider/verbs.rs\n";
        let listed = "rrpc-core-0.1.0/Cargo.toml\nrrpc-core-0.1.0/Cargo.toml.orig\n\
                      rrpc-core-0.1.0/src/lib.rs\n";
        assert_eq!(
            missing_from_package("crates/rrpc-core/", tracked, "rrpc-core-0.1.0/", listed),
            ["src/provider/verbs.rs"]
        );
        let whole = format!("{listed}rrpc-core-0.1.0/src/provider/verbs.rs\n");
        assert!(
            missing_from_package("crates/rrpc-core/", tracked, "rrpc-core-0.1.0/", &whole)
                .is_empty()
        );
    }
}
