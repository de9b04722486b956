//! `cargo xtask rxe [--timeout SECS] [-- CMD...]`: runs CMD (by default the
//! verbs suite) as root inside a throwaway qemu VM whose kernel has soft-RoCE
//! (`rdma_rxe`), so the libibverbs path can be exercised without an RDMA NIC
//! and without kernel RDMA support on the host.
//!
//! What it does, in order:
//! 1. installs what it needs with apt (`sudo` when not root): qemu, rdma-core
//!    user space, busybox, cpio, kmod, iproute2 (and, for the suite, the
//!    headers the `verbs` feature builds against);
//! 2. downloads a Debian kernel (`apt-get download linux-image-*-amd64`),
//!    unpacks it with `dpkg -x` and caches it under `~/.cache/rrpc-rxe` (or
//!    `$RRPC_RXE_CACHE`), with an initramfs built from busybox and the
//!    virtio/9p modules;
//! 3. boots qemu under TCG (software emulation: nested KVM does not boot on
//!    the machines this was written on), `-nic none`, with the host's `/`
//!    shared read-only over 9p (binaries built here run there unchanged), the
//!    workspace and the job directory (`<target>/rxe/job-*`) read-write;
//! 4. inside, as root: loads `rdma_rxe`, creates `rxe0` on a veth whose end
//!    has 10.99.0.1/24 (GID index 1 = `::ffff:10.99.0.1`, RoCE v2), exports
//!    `RRPC_TEST_DEVICE=rxe0`, runs CMD in the workspace directory;
//! 5. streams CMD's output, returns CMD's exit code, prints the VM console's
//!    tail when the job did not finish, and kills the VM after `--timeout`
//!    seconds (exit 124).
//!
//! With no CMD it runs **the verbs suite** ([`suite`]): the test binaries are
//! built on the host first (never cargo inside the VM: TCG is 20-50x slower),
//! then run inside.
//!
//! `--numa` runs instead **the NUMA placement tests** ([`suite::run_numa`],
//! CI's `rxe NUMA` step): a VM with two emulated NUMA nodes, its NIC on
//! node 1 with `rxe1` on it, and the `#[ignore]`d `numa_vm_*` tests of
//! `crates/rrpc-poller/tests/numa.rs`, each of which must pass.
//!
//! Functional checks only: timings taken inside this VM mean nothing. Tested
//! on soft-RoCE (rdma_rxe) in a VM; not run on an RDMA NIC.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::signals;

/// `cargo xtask rxe` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct RxeArgs {
    /// Kill the VM after this many seconds (exit code 124). Host build time is not counted.
    #[arg(long, default_value_t = 900)]
    pub(crate) timeout: u64,
    /// Keep the job directory (`<target>/rxe/job-*`) even when the job succeeded.
    #[arg(long)]
    pub(crate) keep: bool,
    /// How many hosts: 1 (one VM, `rxe0` talking to itself) or 2 (two VMs
    /// joined by a virtual wire; see `rxe_hosts.rs`).
    #[arg(long, default_value_t = 1)]
    pub(crate) hosts: u8,
    /// `--hosts 2`: a `tc netem` spec for the wire on both hosts (e.g.
    /// `"loss 2% delay 1ms 1ms reorder 10% 50%"`).
    #[arg(long)]
    pub(crate) netem: Option<String>,
    /// `--hosts 2`: a `tc netem` spec on host A only (overrides `--netem`).
    #[arg(long)]
    pub(crate) netem_a: Option<String>,
    /// `--hosts 2`: a `tc netem` spec on host B only (overrides `--netem`).
    #[arg(long)]
    pub(crate) netem_b: Option<String>,
    /// `--hosts 2`: host A's MTU on the wire.
    #[arg(long)]
    pub(crate) mtu_a: Option<u32>,
    /// `--hosts 2`: host B's MTU on the wire.
    #[arg(long)]
    pub(crate) mtu_b: Option<u32>,
    /// `--hosts 2`: seconds each soak of the cross-host suite runs.
    #[arg(long, default_value_t = 10)]
    pub(crate) soak_secs: u64,
    /// `--hosts 2`: run the cross-host suite's clean-wire pass only (no
    /// second pass under netem faults with mismatched MTUs and a dead
    /// client host). CI's subset.
    #[arg(long)]
    pub(crate) clean_only: bool,
    /// One host: run only the NUMA placement tests, in a VM with two
    /// emulated NUMA nodes (the `numa_vm_*` tests of
    /// `crates/rrpc-poller/tests/numa.rs`; CI's `rxe NUMA` step).
    #[arg(long, conflicts_with = "cmd")]
    pub(crate) numa: bool,
    /// The command to run inside the VM, as root, in the workspace directory
    /// (default: the verbs suite). With `--hosts 2`: two commands, A's and
    /// B's, each one shell string (default: the cross-host suite).
    #[arg(last = true)]
    pub(crate) cmd: Vec<String>,
}

/// Packages the VM needs on the host.
const VM_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "busybox-static",
    "cpio",
    "kmod",
    "iproute2",
];

/// Packages the host build of the `verbs` feature needs (`rdma-sys`:
/// pkg-config finds libibverbs and librdmacm, bindgen needs libclang).
pub(crate) const BUILD_PACKAGES: &[&str] = &[
    "libibverbs-dev",
    "librdmacm-dev",
    "libclang-dev",
    "pkg-config",
];

/// Kernel modules the initramfs loads (with their dependencies) to mount the 9p shares.
const INITRD_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p"];

/// The initramfs `/init`: mounts the host root read-only, tmpfs over the
/// writable places, the job directory, the kernel's modules and the
/// workspace, then runs the job script chrooted into the host root.
const INIT_SCRIPT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
die() { echo "rrpc-rxe init: $*"; poweroff -f; }
for m in $(cat /mods/order); do insmod /mods/$m.ko || echo "rrpc-rxe init: insmod $m failed"; done
o=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o $o,ro hostroot /newroot || die "cannot mount the host root"
for t in tmp run var/tmp; do mount -t tmpfs tmpfs /newroot/$t 2>/dev/null; done
mount -t proc proc /newroot/proc; mount -t sysfs sys /newroot/sys; mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm; mount -t devpts devpts /newroot/dev/pts; mount -t tmpfs tmpfs /newroot/dev/shm
mkdir -p /newroot/tmp/rxe-job; mount -t 9p -o $o job /newroot/tmp/rxe-job || die "cannot mount the job directory"
kver=$(cat /newroot/tmp/rxe-job/kver); ws=$(cat /newroot/tmp/rxe-job/workspace)
mkdir -p /newroot/tmp/modroot/lib/modules/$kver
mount -t 9p -o $o,ro modules /newroot/tmp/modroot/lib/modules/$kver || die "cannot mount the modules"
# The workspace may live under a place the tmpfs mounts above hide (/tmp):
# make its mount point there first (a no-op on the read-only host root).
mkdir -p "/newroot$ws" 2>/dev/null
mount -t 9p -o $o workspace "/newroot$ws" || die "cannot mount the workspace at $ws"
echo "rrpc-rxe init: running the job"
chroot /newroot /bin/bash /tmp/rxe-job/job.sh
sync
poweroff -f
"#;

/// The job script (run as root, chrooted into the host's root): sets up
/// `rxe0` (`@SETUP@`: a bash function `setup`, [`VETH_SETUP`] for one VM,
/// [`crate::rxe_hosts`]' wire setup for two), then runs `cmd.sh` in the
/// workspace with `RRPC_TEST_DEVICE=rxe0`.
const JOB_SCRIPT: &str = r#"#!/bin/bash
J=/tmp/rxe-job
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# modprobe from the 9p-mounted modules of the VM's kernel; the kernel's own
# module requests (crc32 for rxe's ICRC) go through it too.
printf '#!/bin/sh\nexec /sbin/modprobe -d /tmp/modroot "$@"\n' > /tmp/modprobe; chmod +x /tmp/modprobe
echo /tmp/modprobe > /proc/sys/kernel/modprobe
@SETUP@
. "$J/env.sh"
# For testing this harness: a VM whose setup never finishes.
if [ -n "${RRPC_RXE_HANG_SETUP:-}" ] && [ "$RRPC_RXE_HANG_SETUP" = "$(cat "$J/label")" ]; then
  echo "rrpc-rxe: RRPC_RXE_HANG_SETUP: this VM's setup hangs" > "$J/setup.log"; sleep 100000
fi
if ! ( setup ) > "$J/setup.log" 2>&1; then
  echo "rrpc-rxe: setting up rxe0 failed:" > "$J/out"; cat "$J/setup.log" >> "$J/out"
  echo 125 > "$J/rc"; sync; exit 0
fi
cat "$J/setup.log" > "$J/out"
# The host's harness reads this: past it, a failure is the job's, not the VM's.
touch "$J/setup.ok"; sync
ulimit -l unlimited
export HOME=/tmp RRPC_TEST_DEVICE=rxe0 RRPC_RXE_VM=1
cd "$(cat "$J/workspace")"
bash "$J/cmd.sh" >> "$J/out" 2>&1 < /dev/null
echo $? > "$J/rc.tmp"; mv "$J/rc.tmp" "$J/rc"
sync
"#;

/// `setup` for one VM: `rxe0` on a veth whose end has 10.99.0.1/24 (no wire;
/// loopback traffic only).
pub(crate) const VETH_SETUP: &str = r#"setup() {
  set -e
  for m in crc32_generic ib_uverbs rdma_rxe veth; do /tmp/modprobe "$m" || [ "$m" = crc32_generic ]; done
  ip link set lo up
  ip link add veth0 type veth peer name veth1
  ip addr add 10.99.0.1/24 dev veth0
  ip link set veth0 up; ip link set veth1 up
  rdma link add rxe0 type rxe netdev veth0
  # Wait for the IPv4-mapped GID (index 1) and an active port.
  for _ in $(seq 100); do
    g=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null || true)
    case "$g" in *0a63:0001) break ;; esac
    sleep 0.1
  done
  echo "rrpc-rxe: rxe0 on veth0, port $(cat /sys/class/infiniband/rxe0/ports/1/state), GID[1] $(cat /sys/class/infiniband/rxe0/ports/1/gids/1)"
}
"#;

/// Host environment variables passed into the VM when set.
const PASSED_ENV: &[&str] = &[
    "RUST_LOG",
    "RUST_BACKTRACE",
    "RUST_TEST_THREADS",
    "RRPC_TEST_VERBOSE",
    "RRPC_RXE_HANG_SETUP",
];

/// Whether this host can run the harness at all (`Err` says why not).
pub(crate) fn supported() -> std::result::Result<(), String> {
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        return Err(format!(
            "needs Linux on x86_64 (this is {} on {})",
            std::env::consts::OS,
            std::env::consts::ARCH
        ));
    }
    let have_dpkg = Path::new("/usr/bin/dpkg").exists();
    let have_apt = Path::new("/usr/bin/apt-get").exists();
    if !have_dpkg || !have_apt {
        return Err(
            "needs a Debian-like host with dpkg and apt-get (to install qemu and fetch a kernel)"
                .into(),
        );
    }
    Ok(())
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `Command` for a privileged program: itself when root, else through sudo.
fn privileged(program: &str) -> Command {
    if is_root() {
        Command::new(program)
    } else {
        let mut c = Command::new("sudo");
        c.arg(program);
        c
    }
}

fn status_ok(cmd: &mut Command, what: &str) -> Result<()> {
    let st = cmd.status().with_context(|| format!("spawning {what}"))?;
    if !st.success() {
        bail!("{what} failed with {st}");
    }
    Ok(())
}

/// Installs the packages of `pkgs` that `dpkg -s` does not find.
pub(crate) fn ensure_packages(pkgs: &[&str]) -> Result<()> {
    let missing: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg")
                .args(["-s", p])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("rxe: installing {}", missing.join(" "));
    status_ok(
        privileged("apt-get").args(["update", "-qq"]),
        "apt-get update",
    )?;
    status_ok(
        privileged("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing),
        "apt-get install",
    )
}

/// The cache directory (`$RRPC_RXE_CACHE`, else `~/.cache/rrpc-rxe`).
fn cache_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("RRPC_RXE_CACHE") {
        return Ok(PathBuf::from(d));
    }
    let home = std::env::var_os("HOME").context("HOME is not set (or set RRPC_RXE_CACHE)")?;
    Ok(PathBuf::from(home).join(".cache/rrpc-rxe"))
}

/// An unpacked Debian kernel.
#[derive(Debug)]
struct Kernel {
    version: String,
    vmlinuz: PathBuf,
    modules: PathBuf,
}

/// The name of the versioned kernel package `linux-image-amd64` depends on.
fn kernel_package() -> Result<String> {
    let out = Command::new("apt-cache")
        .args(["depends", "linux-image-amd64"])
        .output()
        .context("running apt-cache")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(parse_kernel_package(&text).unwrap_or_default())
}

/// `Depends: linux-image-6.1.0-44-amd64` in `apt-cache depends` output.
fn parse_kernel_package(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let dep = l.trim().strip_prefix("Depends:")?.trim();
        let rest = dep.strip_prefix("linux-image-")?;
        (rest.starts_with(|c: char| c.is_ascii_digit()) && rest.ends_with("-amd64"))
            .then(|| dep.to_owned())
    })
}

/// Downloads and unpacks a Debian kernel into the cache (once).
fn ensure_kernel(cache: &Path) -> Result<Kernel> {
    let kver_file = cache.join("kver");
    if !kver_file.is_file() {
        let mut pkg = kernel_package()?;
        if pkg.is_empty() {
            status_ok(
                privileged("apt-get").args(["update", "-qq"]),
                "apt-get update",
            )?;
            pkg = kernel_package()?;
        }
        if pkg.is_empty() {
            bail!(
                "cannot find a linux-image-*-amd64 package (apt-cache depends linux-image-amd64)"
            );
        }
        eprintln!("rxe: downloading {pkg} into {}", cache.display());
        let dl = cache.join("download");
        let kern = cache.join("kern");
        let _ = std::fs::remove_dir_all(&dl);
        let _ = std::fs::remove_dir_all(&kern);
        std::fs::create_dir_all(&dl)?;
        status_ok(
            Command::new("apt-get")
                .args(["download", "-qq", &pkg])
                .current_dir(&dl),
            "apt-get download",
        )?;
        let deb = std::fs::read_dir(&dl)?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .context("apt-get download produced no .deb")?;
        status_ok(
            Command::new("dpkg").arg("-x").arg(&deb).arg(&kern),
            "dpkg -x",
        )?;
        std::fs::remove_dir_all(&dl)?;
        let version = std::fs::read_dir(kern.join("lib/modules"))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .next()
            .context("the kernel package has no lib/modules/<version>")?;
        let depmod = ["/sbin/depmod", "/usr/sbin/depmod"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("depmod");
        status_ok(
            Command::new(depmod).arg("-b").arg(&kern).arg(&version),
            "depmod",
        )?;
        std::fs::write(&kver_file, &version)?;
    }
    let version = std::fs::read_to_string(&kver_file)?.trim().to_owned();
    let kern = cache.join("kern");
    let k = Kernel {
        vmlinuz: kern.join(format!("boot/vmlinuz-{version}")),
        modules: kern.join(format!("lib/modules/{version}")),
        version,
    };
    if !k.vmlinuz.is_file() || !k.modules.join("modules.dep").is_file() {
        bail!(
            "the kernel cache in {} is incomplete; remove it and retry",
            cache.display()
        );
    }
    Ok(k)
}

/// Module name as the kernel spells it, from a `modules.dep` path.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// `modules.dep`: module name -> (path, dependencies' paths).
fn parse_modules_dep(text: &str) -> BTreeMap<String, (String, Vec<String>)> {
    text.lines()
        .filter_map(|l| {
            let (m, deps) = l.split_once(':')?;
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            Some((module_name(m), (m.to_owned(), deps)))
        })
        .collect()
}

/// `wanted` and their dependencies, dependencies first (modules built into
/// the kernel are absent from `modules.dep` and skipped).
fn module_load_order(
    dep: &BTreeMap<String, (String, Vec<String>)>,
    wanted: &[&str],
) -> Vec<(String, String)> {
    fn visit(
        name: &str,
        dep: &BTreeMap<String, (String, Vec<String>)>,
        seen: &mut HashSet<String>,
        out: &mut Vec<(String, String)>,
    ) {
        if !seen.insert(name.to_owned()) {
            return;
        }
        let Some((path, deps)) = dep.get(name) else {
            return;
        };
        for d in deps {
            visit(&module_name(d), dep, seen, out);
        }
        out.push((name.to_owned(), path.clone()));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for w in wanted {
        visit(w, dep, &mut seen, &mut out);
    }
    out
}

/// A short content hash (FNV-1a), to key cached artefacts on their inputs.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
    }
    h
}

/// Builds the initramfs (once per kernel and init script).
fn ensure_initrd(cache: &Path, k: &Kernel) -> Result<PathBuf> {
    let key = fnv(&[INIT_SCRIPT.as_bytes(), k.version.as_bytes()]);
    let out = cache.join(format!("initrd-{key:016x}.gz"));
    if out.is_file() {
        return Ok(out);
    }
    eprintln!("rxe: building the initramfs");
    let d = cache.join("initrd-build");
    let _ = std::fs::remove_dir_all(&d);
    for sub in ["bin", "dev", "proc", "sys", "newroot", "mods"] {
        std::fs::create_dir_all(d.join(sub))?;
    }
    std::fs::copy("/bin/busybox", d.join("bin/busybox")).context("copying /bin/busybox")?;
    let dep = parse_modules_dep(&std::fs::read_to_string(k.modules.join("modules.dep"))?);
    let order = module_load_order(&dep, INITRD_MODULES);
    let mut names = Vec::new();
    for (name, path) in &order {
        let src = k.modules.join(path);
        let dst = d.join(format!("mods/{name}.ko"));
        let decompress = if path.ends_with(".ko.xz") {
            Some("xz")
        } else if path.ends_with(".ko.zst") {
            Some("zstd")
        } else if path.ends_with(".ko.gz") {
            Some("gzip")
        } else {
            None
        };
        match decompress {
            None => {
                std::fs::copy(&src, &dst).with_context(|| format!("copying {}", src.display()))?;
            }
            Some(tool) => {
                let out = Command::new(tool)
                    .arg("-dc")
                    .arg(&src)
                    .output()
                    .with_context(|| format!("running {tool} -dc"))?;
                if !out.status.success() {
                    bail!("{tool} -dc {} failed", src.display());
                }
                std::fs::write(&dst, out.stdout)?;
            }
        }
        names.push(name.clone());
    }
    std::fs::write(d.join("mods/order"), names.join("\n") + "\n")?;
    write_executable(&d.join("init"), INIT_SCRIPT)?;
    let tmp = cache.join("initrd.tmp");
    status_ok(
        Command::new("sh")
            .arg("-c")
            .arg("find . | cpio -o -H newc --quiet | gzip -1 > \"$0\"")
            .arg(&tmp)
            .current_dir(&d),
        "cpio | gzip",
    )?;
    std::fs::rename(&tmp, &out)?;
    std::fs::remove_dir_all(&d)?;
    Ok(out)
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Quotes `s` for a POSIX shell.
pub(crate) fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What one VM run produced.
#[derive(Debug)]
pub(crate) struct VmRun {
    /// CMD's exit code; 124 when the VM was killed at the timeout; 125 when
    /// the VM did not get as far as running CMD.
    pub(crate) code: i32,
    /// Everything CMD printed (also streamed while it ran).
    pub(crate) output: String,
    /// Wall time of the VM (boot included).
    pub(crate) elapsed: Duration,
    /// Whether its setup (`rxe0`, and for a wire the peer's ping) finished:
    /// if not, nothing of rrpc's ran in it, and the failure is the VM's.
    pub(crate) set_up: bool,
}

/// How long a VM may take to boot and set up `rxe0` (and, on a wire, see
/// its peer answer: up to ~3 min by the wire's own wait) before its run is
/// stopped as a VM failure rather than left to the job's timeout.
const SETUP_BOUND: Duration = Duration::from_secs(330);

/// How long the other VMs of a run go on once one VM's job has failed (or
/// its VM stopped without an exit code): time for their own output, not
/// for the whole timeout; the run has failed already.
const FAILED_PEER_GRACE: Duration = Duration::from_secs(60);

/// Boots the VM and runs `script` (a bash script) inside; see the module docs.
pub(crate) fn run_in_vm(
    root: &Path,
    target: &Path,
    script: &str,
    timeout: Duration,
    keep: bool,
) -> Result<VmRun> {
    let spec = VmSpec {
        label: String::new(),
        script: script.to_owned(),
        setup: VETH_SETUP.to_owned(),
        nic: None,
        numa: None,
    };
    let mut runs = run_vms(root, target, vec![spec], timeout, keep)?;
    Ok(runs.remove(0))
}

/// One VM of [`run_vms`].
#[derive(Debug, Clone)]
pub(crate) struct VmSpec {
    /// Its name in the output (`A`, `B`; empty for a lone VM, whose output is
    /// not prefixed) and its job directory's.
    pub(crate) label: String,
    /// The bash script it runs (`cmd.sh`).
    pub(crate) script: String,
    /// The `setup` function of its job script ([`VETH_SETUP`] or a wire's).
    pub(crate) setup: String,
    /// Its network card: qemu's `-netdev` value (id `n0`) and the MAC address;
    /// `None`: `-nic none`.
    pub(crate) nic: Option<(String, String)>,
    /// Emulated NUMA nodes ([`numa_args`]); `None`: as `RRPC_RXE_NUMA` says
    /// (unset: one node).
    pub(crate) numa: Option<usize>,
}

/// Boots one VM per spec at once, each running its script, and waits for
/// all of them (or the timeout, which kills every VM still running). Output is
/// streamed as it comes, prefixed `label| ` when there are several.
pub(crate) fn run_vms(
    root: &Path,
    target: &Path,
    specs: Vec<VmSpec>,
    timeout: Duration,
    keep: bool,
) -> Result<Vec<VmRun>> {
    supported().map_err(|why| anyhow::anyhow!("cargo xtask rxe: {why}"))?;
    ensure_packages(VM_PACKAGES)?;
    let cache = cache_dir()?;
    std::fs::create_dir_all(&cache)?;
    let kernel = ensure_kernel(&cache)?;
    let initrd = ensure_initrd(&cache, &kernel)?;

    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let base = target
        .join("rxe")
        .join(format!("job-{stamp}-{}", std::process::id()));
    let mem = std::env::var("RRPC_RXE_MEM").unwrap_or_else(|_| "2048".into());
    let cpus = std::env::var("RRPC_RXE_CPUS").unwrap_or_else(|_| "2".into());
    signals::install();
    let start = Instant::now();
    let mut vms = Vec::new();
    for spec in specs {
        let job = base.join(&spec.label);
        std::fs::create_dir_all(&job)?;
        for p in [root, job.as_path(), kernel.modules.as_path()] {
            if p.to_string_lossy().contains([',', ' ', '\n', '"']) {
                bail!(
                    "cargo xtask rxe: path {} has a comma, space or quote (qemu's -virtfs cannot share it)",
                    p.display()
                );
            }
        }
        std::fs::write(job.join("kver"), &kernel.version)?;
        std::fs::write(job.join("label"), &spec.label)?;
        std::fs::write(job.join("workspace"), root.to_string_lossy().as_bytes())?;
        let mut env = String::new();
        for k in PASSED_ENV {
            if let Ok(v) = std::env::var(k) {
                env.push_str(&format!("export {k}={}\n", sh_quote(&v)));
            }
        }
        std::fs::write(job.join("env.sh"), env)?;
        write_executable(
            &job.join("job.sh"),
            &JOB_SCRIPT.replace("@SETUP@", &spec.setup),
        )?;
        write_executable(&job.join("cmd.sh"), &spec.script)?;
        let qemu = qemu_command(root, &job, &kernel, &initrd, &mem, &cpus, &spec)?;
        eprintln!(
            "rxe: booting VM {}(TCG, kernel {}, {mem} MiB, {cpus} vCPUs, timeout {}s); job files in {}",
            if spec.label.is_empty() {
                String::new()
            } else {
                format!("{} ", spec.label)
            },
            kernel.version,
            timeout.as_secs(),
            job.display()
        );
        let mut qemu = qemu;
        let child = qemu.spawn().context("starting qemu-system-x86_64")?;
        vms.push((spec.label, job, child, Vec::new()));
    }
    let prefixed = vms.len() > 1;
    let stream = |label: &str, job: &Path, output: &mut Vec<u8>| {
        if let Ok(mut f) = std::fs::File::open(job.join("out")) {
            let mut buf = Vec::new();
            if f.seek(SeekFrom::Start(output.len() as u64)).is_ok()
                && f.read_to_end(&mut buf).is_ok()
            {
                let mut so = std::io::stdout();
                if prefixed {
                    // Whole lines only, so that two VMs' lines do not mix.
                    let whole = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                    buf.truncate(whole);
                    for line in String::from_utf8_lossy(&buf).lines() {
                        let _ = writeln!(so, "{label}| {line}");
                    }
                } else {
                    let _ = so.write_all(&buf);
                }
                let _ = so.flush();
                output.extend_from_slice(&buf);
            }
        }
    };
    let mut why_killed = None;
    // The first VM whose job failed, and when it was seen.
    let mut failed: Option<(String, Instant)> = None;
    loop {
        let mut running = 0;
        let mut not_set_up = None;
        for (label, job, child, output) in &mut vms {
            stream(label, job, output);
            let stopped = child.try_wait()?.is_some();
            if !stopped {
                running += 1;
            }
            let rc = read_rc(job);
            if failed.is_none() && (rc.is_some_and(|rc| rc != 0) || (stopped && rc.is_none())) {
                let what = match rc {
                    Some(125) if !job.join("setup.ok").exists() => "its setup failed".to_owned(),
                    Some(rc) => format!("its job exited with {rc}"),
                    None => "it stopped before its job finished".to_owned(),
                };
                failed = Some((format!("VM {label}: {what}"), Instant::now()));
            }
            if !stopped && rc.is_none() && !job.join("setup.ok").exists() {
                not_set_up = Some(label.clone());
            }
        }
        if running == 0 {
            break;
        }
        if start.elapsed() > timeout {
            why_killed = Some(format!("timeout after {}s", timeout.as_secs()));
        } else if signals::interrupted() {
            why_killed = Some("interrupted".into());
        } else if let Some(label) = not_set_up.filter(|_| start.elapsed() > SETUP_BOUND) {
            why_killed = Some(format!(
                "VM {label} had not set up rxe0 {}s after boot (a VM failure: none of rrpc's code had run in it)",
                SETUP_BOUND.as_secs()
            ));
        } else if let Some((what, at)) = &failed
            && vms.len() > 1
            && at.elapsed() > FAILED_PEER_GRACE
        {
            why_killed = Some(format!(
                "{what}; the others stopped {}s after",
                FAILED_PEER_GRACE.as_secs()
            ));
        }
        if why_killed.is_some() {
            for (_, _, child, _) in &mut vms {
                let _ = child.kill();
                let _ = child.wait();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let elapsed = start.elapsed();
    let mut runs = Vec::new();
    for (label, job, mut child, mut output) in vms {
        // A partial last line, left by the prefixed stream.
        stream(&label, &job, &mut output);
        if let Ok(Some(st)) = child.try_wait()
            && !st.success()
        {
            eprintln!("rxe: qemu {label} exited with {st}");
        }
        let name = if label.is_empty() {
            "the VM".to_owned()
        } else {
            format!("VM {label}")
        };
        let rc = read_rc(&job);
        let set_up = job.join("setup.ok").exists();
        let code = match (rc, &why_killed) {
            (Some(rc), _) => rc,
            (None, Some(why)) => {
                eprintln!("rxe: the job of {name} did not finish ({why}); console tail:");
                print_tail(&job.join("console"), 40);
                124
            }
            (None, None) => {
                eprintln!("rxe: {name} stopped before its job finished; console tail:");
                print_tail(&job.join("console"), 40);
                print_tail(&job.join("qemu.log"), 20);
                125
            }
        };
        if code != 0 && rc.is_some() {
            eprintln!("rxe: the job of {name} exited with {code}; console tail:");
            print_tail(&job.join("console"), 15);
        }
        if code != 0 {
            if !set_up {
                eprintln!("rxe: {name} never finished its setup; its setup log:");
                print_tail(&job.join("setup.log"), 20);
            }
            print_hung_tasks(&name, &job.join("console"));
        }
        eprintln!(
            "rxe: {name} ran {:.1}s (boot included), job exit code {code}",
            elapsed.as_secs_f64()
        );
        runs.push(VmRun {
            code,
            output: String::from_utf8_lossy(&output).into_owned(),
            elapsed,
            set_up,
        });
    }
    if runs.iter().all(|r| r.code == 0) && !keep {
        let _ = std::fs::remove_dir_all(&base);
    } else {
        eprintln!("rxe: job files kept in {}", base.display());
    }
    Ok(runs)
}

/// The qemu command of one VM: TCG, the host's `/` read-only, the kernel's
/// modules, the workspace and the job directory over 9p, the console into
/// `<job>/console`; the NIC and NUMA nodes as `spec` says.
fn qemu_command(
    root: &Path,
    job: &Path,
    kernel: &Kernel,
    initrd: &Path,
    mem: &str,
    cpus: &str,
    spec: &VmSpec,
) -> Result<Command> {
    let nic = spec.nic.as_ref();
    let virtfs = |path: &Path, tag: &str, ro: bool| {
        format!(
            "local,path={},mount_tag={tag},security_model=none{}",
            path.display(),
            if ro {
                ",readonly=on,multidevs=remap"
            } else {
                ""
            }
        )
    };
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args([
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-m",
        mem,
        "-smp",
        cpus,
    ])
    .args(["-display", "none", "-monitor", "none", "-no-reboot"]);
    let numa = spec
        .numa
        .filter(|&n| n > 1)
        .map_or_else(numa_nodes, |n| Ok(Some(n)))?
        .map(|nodes| numa_args(nodes, mem, cpus))
        .transpose()?;
    if let Some((nodes, _)) = &numa {
        qemu.args(nodes);
    }
    match nic {
        None => {
            qemu.args(["-nic", "none"]);
        }
        Some((netdev, mac)) => {
            qemu.arg("-netdev")
                .arg(netdev)
                .arg("-device")
                .arg(format!("virtio-net-pci,netdev=n0,mac={mac}"));
        }
    }
    qemu.arg("-serial")
        .arg(format!("file:{}", job.join("console").display()))
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 quiet panic=-1"])
        .arg("-virtfs")
        .arg(virtfs(Path::new("/"), "hostroot", true))
        .arg("-virtfs")
        .arg(virtfs(&kernel.modules, "modules", true))
        .arg("-virtfs")
        .arg(virtfs(root, "workspace", false))
        .arg("-virtfs")
        .arg(virtfs(job, "job", false));
    if let Some((_, nic)) = &numa {
        // After the shares: qemu puts a device without a bus on the last
        // bus that takes it, which must not be the expander's.
        qemu.args(nic);
    }
    qemu.stdin(Stdio::null())
        .stdout(std::fs::File::create(job.join("qemu.log"))?)
        .stderr(std::fs::File::create(job.join("qemu.log"))?);
    Ok(qemu)
}

/// `RRPC_RXE_NUMA=<nodes>`: boot the VM with that many emulated NUMA nodes
/// (by hand; `--numa` sets two for the NUMA placement tests,
/// `crates/rrpc-poller/tests/numa.rs`, through [`VmSpec::numa`]); unset
/// or 1: one node, as before. An environment variable rather than an
/// option of [`RxeArgs`] (like `RRPC_RXE_MEM` and `RRPC_RXE_CPUS`), so that
/// the callers building `RxeArgs` need no change.
fn numa_nodes() -> Result<Option<usize>> {
    match std::env::var("RRPC_RXE_NUMA") {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(0 | 1) => Ok(None),
            Ok(n) if n <= 8 => Ok(Some(n)),
            _ => bail!("RRPC_RXE_NUMA={v}: a node count in 1..=8"),
        },
    }
}

/// qemu's arguments for `nodes` NUMA nodes over `mem` MiB and `cpus` vCPUs:
/// each node a RAM backend of an equal share of the memory and an equal run
/// of the CPUs (`-numa node,nodeid=i,cpus=a-b,memdev=mi`), and a virtio NIC
/// (`eth0` in the VM, on an empty hub) under a PCI expander bridge of the
/// last node, so that its netdev's `numa_node` in sysfs names that node (a
/// soft-RoCE device on it reports the node: the device-derived default).
fn numa_args(nodes: usize, mem: &str, cpus: &str) -> Result<(Vec<String>, Vec<String>)> {
    let mem: usize = mem
        .trim()
        .parse()
        .with_context(|| format!("RRPC_RXE_MEM={mem}: MiB"))?;
    let cpus: usize = cpus
        .trim()
        .parse()
        .with_context(|| format!("RRPC_RXE_CPUS={cpus}: a count"))?;
    if cpus < nodes || mem < 64 * nodes {
        bail!("RRPC_RXE_NUMA={nodes}: needs a vCPU and 64 MiB per node ({cpus} vCPUs, {mem} MiB)");
    }
    let mut args = Vec::new();
    for i in 0..nodes {
        let (first, next) = (i * cpus / nodes, (i + 1) * cpus / nodes);
        let size = mem / nodes + if i == nodes - 1 { mem % nodes } else { 0 };
        args.push("-object".to_owned());
        args.push(format!("memory-backend-ram,id=m{i},size={size}M"));
        args.push("-numa".to_owned());
        args.push(format!(
            "node,nodeid={i},cpus={first}-{},memdev=m{i}",
            next - 1
        ));
    }
    let last = nodes - 1;
    // qemu plugs only bridges into an expander: the NIC goes behind one.
    let nic = [
        "-device".to_owned(),
        format!("pxb,id=pxb{last},bus_nr=128,numa_node={last},bus=pci.0"),
        "-device".to_owned(),
        format!("pci-bridge,id=numa_br,chassis_nr=9,bus=pxb{last}"),
        "-netdev".to_owned(),
        "hubport,id=numa_nic,hubid=9".to_owned(),
        "-device".to_owned(),
        "virtio-net-pci,netdev=numa_nic,bus=numa_br,addr=1,mac=52:54:00:12:99:01".to_owned(),
    ];
    Ok((args, nic.to_vec()))
}

/// A job's exit code, once its job script wrote it.
fn read_rc(job: &Path) -> Option<i32> {
    std::fs::read_to_string(job.join("rc"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
}

/// The kernel's hung-task reports in a VM's console (`task … blocked for
/// more than … seconds` and the stack after it): what a hang in the kernel
/// (a soft-RoCE teardown, a 9p mount) looks like, which a console tail
/// shows only when it happens to be last.
fn print_hung_tasks(name: &str, console: &Path) {
    let text = std::fs::read(console).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    let mut shown = 0;
    for (i, l) in lines.iter().enumerate() {
        if l.contains("blocked for more than") && shown < 3 {
            shown += 1;
            eprintln!("rxe: {name}'s kernel reported a hung task:");
            for l in &lines[i..(i + 30).min(lines.len())] {
                eprintln!("  | {l}");
            }
        }
    }
}

fn print_tail(path: &Path, lines: usize) {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let all: Vec<&str> = text.lines().collect();
    for l in &all[all.len().saturating_sub(lines)..] {
        eprintln!("  | {l}");
    }
}

/// Entry point of `cargo xtask rxe` on one host (`--hosts 2` is
/// [`crate::rxe_hosts::run`]): returns the exit code to leave with.
pub(crate) fn run(args: &RxeArgs) -> Result<i32> {
    let root = crate::util::workspace_root();
    let target = crate::util::target_dir(&root)?;
    let timeout = Duration::from_secs(args.timeout);
    if args.numa {
        if args.hosts != 1 {
            bail!("--numa runs on one host");
        }
        return suite::run_numa(&root, &target, timeout, args.keep);
    }
    if args.cmd.is_empty() {
        return suite::run(&root, &target, timeout, args.keep);
    }
    let line: Vec<String> = args.cmd.iter().map(|a| sh_quote(a)).collect();
    let script = format!("#!/bin/bash\n{}\n", line.join(" "));
    Ok(run_in_vm(&root, &target, &script, timeout, args.keep)?.code)
}

pub(crate) mod suite {
    //! The verbs suite: the `verbs`-feature test binaries, built on the host,
    //! each run on `rxe0` (or a named device) with a filter that selects the
    //! tests that use verbs; plus the examples over `rdma://` ([`EXAMPLES`]).
    //!
    //! | package | binaries | filter |
    //! |---|---|---|
    //! | rrpc-core | lib unit tests, `tests/suite` (`conformance`, `two_process`, `shared_qp`, `logical`, `tls`), `tests/hostile` | `provider::verbs` (lib), `verbs` |
    //! | rrpc-ringbuf | `tests/suite`: `two_process`, `pingpong`, `event_mode`, `placement`, `shared_qp`, `self_sizing` | `verbs` |
    //! | rrpc-poller | `tests/suite`: `e2e` (`modes`, `stress`, `parked_release`, `metrics` and the binaries `leaks`, `backoff` drive fake sources only: no verbs tests there) | `verbs` |
    //! | rrpc-kv | `tests/suite`: `rfrpc_verbs` | `verbs` |
    //! | rrpc-integration-tests | `tests/*` | `rdma_` (the `rdma_h2` / `rdma_fast` modules) |
    //! | examples | `helloworld-server`, `helloworld-client` | `--transport rdma` |
    //! | examples | `routeguide-server`, `routeguide-client` (all four RPC kinds) | `--transport rdma` |
    //! | examples | `demo` (rdma-h2 and rdma-fast paths, 50 calls each) | `--transport rdma --calls 50 --no-baselines --no-pin` |
    //!
    //! Every test in it asserts that verbs carried the traffic (fabric kind
    //! `Verbs`, device name, or `Carrier::Verbs { device, peer }` read from
    //! the live queue pair; an example's output must say
    //! `carried by Verbs { device: "<device>", peer: Some(<address>) }`).

    use super::*;

    /// One test binary and the filter that selects its verbs tests.
    #[derive(Debug, Clone)]
    pub(crate) struct TestBin {
        /// `package/target`, for the report.
        pub(crate) name: String,
        /// The executable.
        pub(crate) exe: PathBuf,
        /// libtest filter.
        pub(crate) filter: &'static str,
        /// How many tests the filter selects (from `--list` on the host).
        pub(crate) selected: usize,
        /// Their paths (`module::case`).
        pub(crate) tests: Vec<String>,
    }

    /// The built suite.
    #[derive(Debug)]
    pub(crate) struct Suite {
        /// Test binaries with at least one selected test.
        pub(crate) bins: Vec<TestBin>,
        /// The examples over `rdma://`, in [`EXAMPLES`] order.
        pub(crate) examples: Vec<Example>,
    }

    /// An example run over `rdma://`, counted as one test.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct ExampleSpec {
        /// Name in the report (`examples/<name>`).
        pub(crate) name: &'static str,
        /// Server binary and its arguments, started in the background
        /// first; the client is then retried until it gets through.
        /// `None`: the client alone is the whole run.
        pub(crate) server: Option<(&'static str, &'static [&'static str])>,
        /// Client binary and its arguments.
        pub(crate) client: (&'static str, &'static [&'static str]),
        /// How many `carried by Verbs { device: "<device>", peer: Some(..) }` lines the
        /// client's output must have (one per channel it opened on rdma).
        pub(crate) verbs_lines: usize,
        /// Fixed strings the client's output must contain (its RPCs' results).
        pub(crate) expect: &'static [&'static str],
    }

    /// The examples the suite runs over `rdma://`.
    pub(crate) const EXAMPLES: &[ExampleSpec] = &[
        ExampleSpec {
            name: "helloworld",
            server: Some(("helloworld-server", &["--transport", "rdma"])),
            client: ("helloworld-client", &["--transport", "rdma"]),
            verbs_lines: 1,
            expect: &["RESPONSE=\"Hello rrpc!\""],
        },
        ExampleSpec {
            name: "routeguide",
            server: Some(("routeguide-server", &["--transport", "rdma"])),
            client: ("routeguide-client", &["--transport", "rdma"]),
            verbs_lines: 1,
            // One line per RPC kind: unary, server streaming, client
            // streaming, bidirectional.
            expect: &[
                "GetFeature: Feature { name: \"Place 3,6\"",
                "ListFeatures: 8 features",
                "RecordRoute: RouteSummary { point_count: 10,",
                "RouteChat: got \"note 0\"",
            ],
        },
        ExampleSpec {
            name: "demo",
            server: None,
            client: (
                "demo",
                &[
                    "--transport",
                    "rdma",
                    "--calls",
                    "50",
                    "--no-baselines",
                    "--no-pin",
                ],
            ),
            verbs_lines: 2,
            expect: &["rdma-h2 p50 ", "rdma-fast p50 "],
        },
    ];

    /// An [`ExampleSpec`] with its binaries built.
    #[derive(Debug, Clone)]
    pub(crate) struct Example {
        /// What to run and check.
        pub(crate) spec: ExampleSpec,
        /// The server's executable, if the example has one.
        pub(crate) server: Option<PathBuf>,
        /// The client's executable.
        pub(crate) client: PathBuf,
    }

    /// What must contribute verbs tests: a binary (`package/target`), or a
    /// module of one (`package/target::module`: some selected test's path
    /// starts with `module::`).
    const REQUIRED: &[&str] = &[
        "rrpc-core/rrpc_core",
        "rrpc-core/suite::conformance",
        "rrpc-core/suite::two_process",
        "rrpc-core/suite::shared_qp",
        "rrpc-core/suite::logical",
        "rrpc-ringbuf/suite::two_process",
        "rrpc-ringbuf/suite::shared_qp",
        "rrpc-ringbuf/suite::pingpong",
        "rrpc-ringbuf/suite::event_mode",
        "rrpc-ringbuf/suite::placement",
        "rrpc-core/suite::tls",
        "rrpc-ringbuf/suite::self_sizing",
        "rrpc-poller/suite::e2e",
        "rrpc-kv/suite::rfrpc_verbs",
        // Every integration file with rdma variants (`rdma_h2` / `rdma_fast`):
        // the modules of the `suite` binary, and the binaries of their own.
        "integration/suite::accept",
        "integration/suite::auth",
        "integration/suite::cancellation",
        "integration/suite::compression",
        "integration/suite::concurrency",
        "integration/suite::deadlines",
        "integration/suite::endpoint",
        "integration/suite::flow_control",
        "integration/suite::layers",
        "integration/suite::message_sizes",
        "integration/suite::metadata",
        "integration/suite::one_port",
        "integration/suite::panics",
        "integration/suite::parity",
        "integration/suite::pool",
        "integration/suite::rpc_kinds",
        "integration/suite::server_options",
        "integration/suite::sharing",
        "integration/suite::shutdown",
        "integration/suite::port_fold",
        // TLS on the port with verbs (`tls::rdma_verbs`: the integration
        // tests' `tls` feature, in VERBS_FEATURES).
        "integration/suite::tls",
        "integration/link_faults",
        "integration/release",
        "integration/ring_sizing",
        "integration/sigkill",
        // The reconnect storm, rdma_fast among its transports (16 clients
        // in the VM: functional only).
        "integration/storm",
    ];

    /// Whether `bins` hold what the [`REQUIRED`] entry `req` names.
    fn holds(bins: &[TestBin], req: &str) -> bool {
        let (bin, module) = match req.split_once("::") {
            Some((b, m)) => (b, Some(m)),
            None => (req, None),
        };
        bins.iter().any(|b| {
            b.name == bin
                && module.is_none_or(|m| {
                    b.tests
                        .iter()
                        .any(|t| t.strip_prefix(m).is_some_and(|r| r.starts_with("::")))
                })
        })
    }

    /// Which tests of a package's binary are verbs tests.
    fn filter_for(package_dir: &str, kind: &str) -> Option<&'static str> {
        match (package_dir, kind) {
            ("rrpc-core", "lib") => Some("provider::verbs"),
            ("rrpc-core" | "rrpc-ringbuf" | "rrpc-poller" | "rrpc-kv", "test") => Some("verbs"),
            ("integration", "test") => Some("rdma_"),
            _ => None,
        }
    }

    fn cargo() -> Command {
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
    }

    /// Runs a cargo build with `--message-format=json-render-diagnostics`
    /// and returns `(package dir name, target kind, target name, executable)`
    /// of every executable artefact.
    fn cargo_executables(
        root: &Path,
        args: &[&str],
    ) -> Result<Vec<(String, String, String, PathBuf)>> {
        eprintln!("==> cargo {}", args.join(" "));
        let out = cargo()
            .args(args)
            .arg("--message-format=json-render-diagnostics")
            .current_dir(root)
            .stderr(Stdio::inherit())
            .output()
            .context("running cargo")?;
        if !out.status.success() {
            bail!("`cargo {}` failed", args.join(" "));
        }
        let mut found = Vec::new();
        for line in out.stdout.split(|b| *b == b'\n') {
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
                continue;
            };
            if v["reason"] != "compiler-artifact" {
                continue;
            }
            let Some(exe) = v["executable"].as_str() else {
                continue;
            };
            let pkg = Path::new(v["manifest_path"].as_str().unwrap_or_default())
                .parent()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let kind = v["target"]["kind"][0]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let name = v["target"]["name"].as_str().unwrap_or_default().to_owned();
            // A binary's own test harness is a `bin` too: tell them apart.
            let kind = if kind == "bin" && v["profile"]["test"].as_bool() == Some(true) {
                "bin-test".to_owned()
            } else {
                kind
            };
            found.push((pkg, kind, name, PathBuf::from(exe)));
        }
        Ok(found)
    }

    /// Tests of `exe` that `filter` selects (`--list`, run on the host).
    fn list_selected(exe: &Path, filter: &str) -> Result<Vec<String>> {
        let out = Command::new(exe)
            .args([filter, "--list", "--format", "terse"])
            .stderr(Stdio::null())
            .output()
            .with_context(|| format!("listing the tests of {}", exe.display()))?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(str::to_owned)
            .collect())
    }

    /// Builds the suite on the host (the `verbs` feature of each package).
    pub(crate) fn build(root: &Path) -> Result<Suite> {
        let tests = test_build(root)?;
        let mut bins = Vec::new();
        for (pkg, kind, name, exe) in tests.iter().cloned() {
            let Some(filter) = filter_for(&pkg, &kind) else {
                continue;
            };
            let tests = list_selected(&exe, filter)?;
            let selected = tests.len();
            if selected > 0 {
                bins.push(TestBin {
                    name: format!("{pkg}/{name}"),
                    exe,
                    filter,
                    selected,
                    tests,
                });
            }
        }
        bins.sort_by(|a, b| a.name.cmp(&b.name));
        // A binary whose verbs tests vanished (renamed, or compiled out by a
        // missing feature) must fail the suite, not shrink it silently.
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|r| !holds(&bins, r))
            .collect();
        if !missing.is_empty() {
            bail!(
                "the verbs suite lost its tests in: {} (no test matches the filter)",
                missing.join(", ")
            );
        }
        // The examples' binaries: `cargo test` builds them for their
        // integration test (examples/tests/cli.rs), so they come with the
        // test binaries, built with the same features.
        let find = |n: &str| find_bin(&tests, n);
        let examples = EXAMPLES
            .iter()
            .map(|spec| {
                Ok(Example {
                    spec: *spec,
                    server: spec.server.map(|(s, _)| find(s)).transpose()?,
                    client: find(spec.client.0)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Suite { bins, examples })
    }

    /// The workspace's test build with every `verbs` feature: the same
    /// package selection and features as the CI test step, so that after it
    /// this builds nothing. Returns (package, kind, name, executable).
    fn test_build(root: &Path) -> Result<Vec<(String, String, String, PathBuf)>> {
        ensure_packages(BUILD_PACKAGES)?;
        cargo_executables(
            root,
            &[
                "test",
                "--no-run",
                "--workspace",
                "--features",
                crate::util::VERBS_FEATURES,
            ],
        )
    }

    /// The binary target `name` of a [`test_build`].
    fn find_bin(built: &[(String, String, String, PathBuf)], name: &str) -> Result<PathBuf> {
        built
            .iter()
            .find(|e| e.1 == "bin" && e.2 == name)
            .map(|e| e.3.clone())
            .with_context(|| format!("building the tests produced no binary `{name}`"))
    }

    /// The binaries the cross-host suite runs, built on the host.
    #[derive(Debug)]
    pub(crate) struct SuiteBins {
        pub(crate) hello_server: std::path::PathBuf,
        pub(crate) hello_client: std::path::PathBuf,
        pub(crate) route_server: std::path::PathBuf,
        pub(crate) route_client: std::path::PathBuf,
        pub(crate) soak: std::path::PathBuf,
        pub(crate) kv_server: std::path::PathBuf,
        pub(crate) kv_bench: std::path::PathBuf,
        /// The integration tests' `suite` binary (its `tls::cross_host`
        /// server on A, client on B).
        pub(crate) integration_suite: std::path::PathBuf,
    }

    /// Builds what the cross-host suite runs (`cargo xtask rxe --hosts 2`):
    /// the examples' servers and clients and the soak, from the same build
    /// as the suite's test binaries.
    pub(crate) fn build_cross_host(root: &Path) -> Result<SuiteBins> {
        let built = test_build(root)?;
        let find = |n: &str| find_bin(&built, n);
        Ok(SuiteBins {
            hello_server: find("helloworld-server")?,
            hello_client: find("helloworld-client")?,
            route_server: find("routeguide-server")?,
            route_client: find("routeguide-client")?,
            soak: find("soak")?,
            kv_server: find("rrpc-kv-server")?,
            kv_bench: find("rrpc-kv-bench")?,
            integration_suite: built
                .iter()
                .find(|e| e.0 == "integration" && e.1 == "test" && e.2 == "suite")
                .map(|e| e.3.clone())
                .context("building the tests produced no integration `suite` test binary")?,
        })
    }

    /// Tests the suite does not run, each with the open defect it shows
    /// (printed in every run; listed in docs/status.md). Remove an
    /// entry once its defect is fixed.
    pub(crate) const KNOWN_FAILURES: &[(&str, &str, &str)] = &[];

    /// The most a test binary may run in the VM before it is killed (its
    /// hung test named by libtest's "running for over 60 seconds" line).
    /// (`integration/suite`, 19 files' tests in one binary, is the
    /// longest: about 130 s on soft-RoCE under TCG.)
    const PER_BINARY_SECS: u64 = 360;

    /// Marker lines the suite script prints, parsed back by [`summarize`].
    const BEGIN: &str = "=== rrpc-verbs-suite begin:";
    const END: &str = "=== rrpc-verbs-suite end:";

    /// The bash script that runs the suite (in the VM, or natively for
    /// `verbs-selftest`); `device` is exported as `RRPC_TEST_DEVICE` when set.
    pub(crate) fn script(s: &Suite, device: Option<&str>, per_bin_timeout: u64) -> String {
        // No backtraces: symbolizing one under TCG emulation takes seconds,
        // and the tests that bound a call's time after a handler panics
        // (tests/integration/tests/suite/panics.rs, 10 s) then fail for it, not
        // for rrpc (seen: `rdma_fast::handler_panics_at_first_poll`, whose
        // panic was the process's first and paid for loading the debug info).
        let mut sh = String::from("#!/bin/bash\nfailed=0\nexport RUST_BACKTRACE=0\n");
        if let Some(d) = device {
            sh.push_str(&format!("export RRPC_TEST_DEVICE={}\n", sh_quote(d)));
        }
        sh.push_str("echo \"verbs suite on device ${RRPC_TEST_DEVICE:?RRPC_TEST_DEVICE must name a device}\"\n");
        // `--show-output`: libtest prints what passing tests wrote, so a test
        // that skipped for want of a device (its `skipped: RRPC_TEST_DEVICE
        // not set` line) is counted as a skip, and a skip fails the suite,
        // instead of passing silently.
        for b in &s.bins {
            let mut skips = String::new();
            for (bin, test, why) in KNOWN_FAILURES {
                if b.name == *bin {
                    sh.push_str(&format!(
                        "echo {}\n",
                        sh_quote(&format!("KNOWN FAILURE, not run: {bin} {test}: {why}"))
                    ));
                    // libtest's `--skip` matches a substring of the test's path.
                    skips.push_str(&format!(" --skip {}", sh_quote(test)));
                }
            }
            sh.push_str(&format!(
                "echo '{BEGIN} {name} (filter {filter}, {n} tests)'\n\
                 t0=$SECONDS; timeout -k 10 {per_bin_timeout} {exe} {filter}{skips} --test-threads=2 --show-output\n\
                 rc=$?; echo \"{END} {name} ($((SECONDS - t0)) s) rc=$rc\"; [ $rc = 0 ] || failed=1\n",
                name = b.name,
                filter = sh_quote(b.filter),
                n = b.selected,
                exe = sh_quote(&b.exe.to_string_lossy()),
            ));
        }
        for e in &s.examples {
            sh.push_str(&example_script(e));
        }
        sh.push_str("exit $failed\n");
        sh
    }

    /// The script block of one example: runs it (the server in the
    /// background, the client retried until the server listens, for at most
    /// three minutes), then counts it as one test, passed if the client
    /// succeeded and its output shows the verbs carrier and every expected
    /// result.
    fn example_script(e: &Example) -> String {
        let name = e.spec.name;
        let cmd = |exe: &Path, args: &[&str]| {
            let mut c = sh_quote(&exe.to_string_lossy());
            for a in args {
                c.push(' ');
                c.push_str(&sh_quote(a));
            }
            c
        };
        let client = cmd(&e.client, e.spec.client.1);
        let clog = format!("/tmp/example-{name}-client.log");
        let slog = format!("/tmp/example-{name}-server.log");
        let mut sh = format!(
            "echo '{BEGIN} examples/{name} ({})'\n",
            e.spec.client.1.join(" ")
        );
        match (&e.server, e.spec.server) {
            (Some(server), Some((_, sargs))) => sh.push_str(&format!(
                r#"{server} > {slog} 2>&1 &
spid=$!
ok=0
deadline=$((SECONDS + 180))
while [ $SECONDS -lt $deadline ]; do
  if timeout 60 {client} > {clog} 2>&1; then ok=1; break; fi
  kill -0 $spid 2>/dev/null || break
  sleep 0.5
done
kill $spid 2>/dev/null; wait $spid 2>/dev/null
"#,
                server = cmd(server, sargs),
            )),
            _ => sh.push_str(&format!(
                ": > {slog}\nok=0\ntimeout 300 {client} > {clog} 2>&1 && ok=1\n"
            )),
        }
        sh.push_str(&format!("cat {clog}\nrc=1\nchecks=ok\n"));
        sh.push_str(&format!(
            "[ \"$(grep -cF \"carried by Verbs {{ device: \\\"$RRPC_TEST_DEVICE\\\", peer: Some(\" {clog})\" -ge {} ] || checks=\"no verbs carrier\"\n",
            e.spec.verbs_lines
        ));
        for want in e.spec.expect {
            sh.push_str(&format!(
                "grep -qF -- {} {clog} || checks={}\n",
                sh_quote(want),
                sh_quote(&format!("missing {want}"))
            ));
        }
        sh.push_str(&format!(
            r#"if [ $ok = 1 ] && [ "$checks" = ok ]; then
  rc=0; echo "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out"
else
  echo "examples/{name} over rdma failed (client ok=$ok, checks: $checks); server log:"; cat {slog}
  echo "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out"
fi
echo "{END} examples/{name} rc=$rc"; [ $rc = 0 ] || failed=1
"#
        ));
        sh
    }

    /// Per binary: (name, passed, failed, ignored, skipped-for-no-device, exit code).
    pub(crate) type Row = (String, u64, u64, u64, u64, Option<i32>);

    /// Parses the suite's output into one row per binary.
    pub(crate) fn summarize(output: &str) -> Vec<Row> {
        let mut rows: Vec<Row> = Vec::new();
        for line in output.lines() {
            if let Some(rest) = line.strip_prefix(BEGIN) {
                let name = rest
                    .trim()
                    .split(" (")
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                rows.push((name, 0, 0, 0, 0, None));
            } else if let Some(row) = rows.last_mut() {
                if let Some(rest) = line.strip_prefix(END) {
                    row.5 = rest
                        .rsplit("rc=")
                        .next()
                        .and_then(|s| s.trim().parse().ok());
                } else if let Some(rest) = line.strip_prefix("test result: ") {
                    let num = |word: &str| -> u64 {
                        rest.split(';')
                            .find_map(|p| {
                                let p = p
                                    .trim()
                                    .trim_start_matches("ok. ")
                                    .trim_start_matches("FAILED. ");
                                p.strip_suffix(word)?.trim().parse().ok()
                            })
                            .unwrap_or(0)
                    };
                    // The last result of a block is the binary's own (a
                    // two-process test's child prints one before it).
                    row.1 = num("passed");
                    row.2 = num("failed");
                    row.3 = num("ignored");
                } else if line.contains("skipped: RRPC_TEST_DEVICE not set") {
                    row.4 += 1;
                }
            }
        }
        rows
    }

    /// Prints the table and returns the totals (passed, failed, ignored, skipped).
    pub(crate) fn print_summary(rows: &[Row]) -> (u64, u64, u64, u64) {
        eprintln!(
            "\n=== verbs suite summary (tested on soft-RoCE (rdma_rxe) in a VM unless run by verbs-selftest; not run on an RDMA NIC)"
        );
        let mut t = (0, 0, 0, 0);
        for (name, p, f, i, s, rc) in rows {
            let rc = rc.map_or("did not finish".to_owned(), |c| format!("exit {c}"));
            eprintln!(
                "  {name:<45} passed {p:>3}  failed {f:>3}  ignored {i:>3}  no-device skips {s:>3}  {rc}"
            );
            t.0 += p;
            t.1 += f;
            t.2 += i;
            t.3 += s;
        }
        eprintln!(
            "  {:<45} passed {:>3}  failed {:>3}  ignored {:>3}  no-device skips {:>3}",
            "total", t.0, t.1, t.2, t.3
        );
        t
    }

    /// `cargo xtask rxe` without a command: build, then run the suite in the VM.
    pub(crate) fn run(root: &Path, target: &Path, timeout: Duration, keep: bool) -> Result<i32> {
        let t0 = Instant::now();
        let suite = build(root)?;
        let build_time = t0.elapsed();
        eprintln!(
            "rxe: verbs suite built in {:.1}s: {} test binaries ({} tests selected), examples {}",
            build_time.as_secs_f64(),
            suite.bins.len(),
            suite.bins.iter().map(|b| b.selected).sum::<usize>(),
            suite
                .examples
                .iter()
                .map(|e| e.spec.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
        // One hung binary must not use up the VM's time: it is killed after
        // PER_BINARY_SECS (the slowest, `integration/suite`, takes ~130 s), and the others
        // still run and are counted.
        let per_bin = timeout
            .as_secs()
            .saturating_sub(60)
            .clamp(60, PER_BINARY_SECS);
        let script = script(&suite, None, per_bin);
        let vm = run_in_vm(root, target, &script, timeout, keep)?;
        let rows = summarize(&vm.output);
        let (_, failed, _, skipped) = print_summary(&rows);
        for line in vm
            .output
            .lines()
            .filter(|l| crate::util::is_failure_line(l))
        {
            crate::util::note_failure(format!("verbs suite: {line}"));
        }
        for (name, _, f, _, sk, rc) in &rows {
            if *f > 0 || *sk > 0 || *rc != Some(0) {
                crate::util::note_failure(format!(
                    "verbs suite: {name}: {f} failed, {sk} skipped for want of a device, {}",
                    rc.map_or("did not finish".to_owned(), |c| format!("exit {c}"))
                ));
            }
        }
        let expected = suite.bins.len() + suite.examples.len();
        eprintln!(
            "rxe: host build {:.1}s, VM {:.1}s, total {:.1}s",
            build_time.as_secs_f64(),
            vm.elapsed.as_secs_f64(),
            t0.elapsed().as_secs_f64()
        );
        if vm.code == 0 && (failed > 0 || skipped > 0 || rows.len() != expected) {
            eprintln!(
                "rxe: the suite exited 0 but reported {failed} failures, {skipped} skips for want of a device, {} of {expected} binaries: treating as a failure",
                rows.len()
            );
            return Ok(1);
        }
        Ok(vm.code)
    }

    /// The NUMA placement tests (`crates/rrpc-poller/tests/numa.rs`, the
    /// `#[ignore]`d `numa_vm_*`): each must run and pass; a test that
    /// vanished, was skipped or failed fails the step.
    pub(crate) const NUMA_TESTS: &[&str] = &[
        "numa_vm_ring_memory_on_the_chosen_node",
        "numa_vm_polling_threads_on_the_chosen_node",
        "numa_vm_device_node_is_the_default",
    ];

    /// The emulated node the NUMA VM's NIC (and so `rxe1`) sits on, and the
    /// tests place on.
    const NUMA_NODE: usize = 1;

    /// The script of the NUMA VM ([`run_numa`]): `rxe1` on the NIC that
    /// [`numa_args`] put behind a PCI expander bridge on node
    /// [`NUMA_NODE`], then the `numa_vm_*` tests of `exe`, one at a time.
    pub(crate) fn numa_script(exe: &Path) -> String {
        format!(
            r#"set -u
/tmp/modprobe virtio_net
for _ in $(seq 100); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done
ip link set eth0 up && rdma link add rxe1 type rxe netdev eth0 || {{ echo "numa: no rxe1 on eth0"; ls /sys/class/net; exit 1; }}
echo "numa: $(ls -d /sys/devices/system/node/node[0-9]* | wc -l) nodes; eth0 on node $(cat /sys/class/net/eth0/device/numa_node /sys/class/net/eth0/device/../numa_node 2>/dev/null | head -n1); node {n} CPUs $(cat /sys/devices/system/node/node{n}/cpulist)"
export RUST_BACKTRACE=0 RRPC_TEST_NUMA_NODE={n} RRPC_TEST_NUMA_DEVICE=rxe1
# The ring memory test creates its unplaced control ring on whichever CPU
# its thread runs, and that first touch puts a page on that CPU's node
# (seen: `pages {{0: 256, 1: 1}}`, failing "first touch puts the pages on
# the toucher's node" when the thread ran on node {n}): run it on node 0's
# CPUs, the toucher's node. The others read and set CPU masks: unpinned.
timeout -k 10 120 taskset -c "$(cat /sys/devices/system/node/node0/cpulist)" {exe} numa_vm_ring_memory_on_the_chosen_node --exact --ignored --show-output
timeout -k 10 120 {exe} numa_vm_ --skip numa_vm_ring_memory_on_the_chosen_node --ignored --test-threads 1 --show-output
"#,
            n = NUMA_NODE,
            exe = sh_quote(&exe.to_string_lossy()),
        )
    }

    /// Whether the NUMA VM's output shows every [`NUMA_TESTS`] test passed
    /// and nothing failed; `Err` names what is missing.
    pub(crate) fn numa_passed(output: &str) -> Result<(), String> {
        for t in NUMA_TESTS {
            if !output
                .lines()
                .any(|l| l.trim() == format!("test {t} ... ok"))
            {
                return Err(format!("{t} did not pass"));
            }
        }
        // Two runs (numa_script): both must pass.
        let results: Vec<&str> = output
            .lines()
            .filter(|l| l.starts_with("test result: "))
            .collect();
        if results.len() != 2 || results.iter().any(|l| !l.starts_with("test result: ok.")) {
            return Err(format!("want two passing runs, saw {results:?}"));
        }
        Ok(())
    }

    /// `cargo xtask rxe --numa` and CI's `rxe NUMA` step: the NUMA
    /// placement tests in a VM booted with two emulated nodes (1 GiB and
    /// one vCPU each, the NIC on node 1), from the suite's test build.
    pub(crate) fn run_numa(
        root: &Path,
        target: &Path,
        timeout: Duration,
        keep: bool,
    ) -> Result<i32> {
        let t0 = Instant::now();
        let built = test_build(root)?;
        let exe = built
            .iter()
            .find(|e| e.0 == "rrpc-poller" && e.1 == "test" && e.2 == "numa")
            .map(|e| e.3.clone())
            .context("building the tests produced no rrpc-poller `numa` test binary")?;
        let listed = list_selected(&exe, "numa_vm_")?;
        let build_time = t0.elapsed();
        // `--list` without `--ignored` lists ignored tests too.
        if let Some(t) = NUMA_TESTS.iter().find(|t| !listed.iter().any(|l| l == *t)) {
            bail!(
                "the NUMA suite lost its test {t} (listed: {listed:?}); without the `verbs` feature?"
            );
        }
        let spec = VmSpec {
            label: String::new(),
            script: numa_script(&exe),
            setup: VETH_SETUP.to_owned(),
            nic: None,
            numa: Some(2),
        };
        let vm = run_vms(root, target, vec![spec], timeout, keep)?.remove(0);
        eprintln!(
            "rxe NUMA: host build {:.1}s, VM {:.1}s (two emulated nodes, boot included)",
            build_time.as_secs_f64(),
            vm.elapsed.as_secs_f64()
        );
        if let Err(why) = numa_passed(&vm.output) {
            crate::util::note_failure(format!("rxe NUMA: {why} (VM exited {})", vm.code));
            eprintln!("rxe NUMA: FAILED: {why}");
            return Ok(if vm.code == 0 { 1 } else { vm.code });
        }
        eprintln!(
            "rxe NUMA: {} tests passed on node {NUMA_NODE} of two",
            NUMA_TESTS.len()
        );
        Ok(vm.code)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn numa_results_need_every_test_to_pass() {
            let ok = "test numa_vm_ring_memory_on_the_chosen_node ... ok\n\
                      test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 3 filtered out\n\
                      test numa_vm_device_node_is_the_default ... ok\n\
                      test numa_vm_polling_threads_on_the_chosen_node ... ok\n\
                      test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out\n";
            assert_eq!(numa_passed(ok), Ok(()));
            let skipped = ok.replace(
                "test numa_vm_device_node_is_the_default ... ok\n",
                "test numa_vm_device_node_is_the_default ... ignored\n",
            );
            assert!(numa_passed(&skipped).is_err());
            let failed = ok.replace(
                "test result: ok. 2 passed; 0 failed",
                "test result: FAILED. 2 passed; 1 failed",
            );
            assert!(numa_passed(&failed).is_err());
            assert!(numa_passed("").is_err());
            let s = numa_script(Path::new("/ws/target/debug/deps/numa-1"));
            assert!(s.contains("RRPC_TEST_NUMA_NODE=1 RRPC_TEST_NUMA_DEVICE=rxe1"));
            assert!(s.contains("/ws/target/debug/deps/numa-1 numa_vm_ --skip"));
            assert!(s.contains("taskset -c"));
        }

        /// A required module is held only by a selected test in it; a
        /// module whose name merely starts the same does not count.
        #[test]
        fn required_modules_are_matched_by_path() {
            let bins = [TestBin {
                name: "integration/suite".into(),
                exe: PathBuf::from("suite"),
                filter: "rdma_",
                selected: 2,
                tests: vec![
                    "auth::rdma_fast::tls_is_checked".into(),
                    "sharing_more::rdma_h2::x".into(),
                ],
            }];
            assert!(holds(&bins, "integration/suite"));
            assert!(holds(&bins, "integration/suite::auth"));
            assert!(!holds(&bins, "integration/suite::sharing"));
            assert!(!holds(&bins, "integration/suite::accept"));
            assert!(!holds(&bins, "integration/other"));
        }

        #[test]
        fn summarize_reads_libtest_results() {
            let out = format!(
                "{BEGIN} rrpc-core/conformance (filter verbs, 3 tests)\n\
                 running 3 tests\n\
                 test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 9 filtered out; finished in 1.0s\n\
                 {END} rrpc-core/conformance rc=0\n\
                 {BEGIN} integration/rpc_kinds (filter rdma_, 2 tests)\n\
                 skipped: RRPC_TEST_DEVICE not set\n\
                 test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 19 filtered out\n\
                 test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n\
                 {END} integration/rpc_kinds rc=101\n\
                 {BEGIN} examples/helloworld (--transport rdma)\n"
            );
            let rows = summarize(&out);
            assert_eq!(rows.len(), 3);
            assert_eq!(
                rows[0],
                ("rrpc-core/conformance".into(), 3, 0, 1, 0, Some(0))
            );
            assert_eq!(
                rows[1],
                ("integration/rpc_kinds".into(), 1, 1, 0, 1, Some(101))
            );
            assert_eq!(rows[2], ("examples/helloworld".into(), 0, 0, 0, 0, None));
        }

        /// Runs every example's block with fake binaries (shell scripts
        /// printing `lines`) and returns the summary rows.
        fn run_examples_with(dir: &Path, lines: impl Fn(&ExampleSpec) -> Vec<String>) -> Vec<Row> {
            std::fs::create_dir_all(dir).unwrap();
            let mut sh = String::from("failed=0\nexport RRPC_TEST_DEVICE=rxe0\n");
            for spec in EXAMPLES {
                let client = dir.join(format!("{}-client", spec.name));
                let mut body = String::from("#!/bin/sh\n");
                for l in lines(spec) {
                    body.push_str(&format!("echo {}\n", sh_quote(&l)));
                }
                write_executable(&client, &body).unwrap();
                let server = spec.server.map(|_| {
                    let p = dir.join(format!("{}-server", spec.name));
                    write_executable(&p, "#!/bin/sh\nexec sleep 30\n").unwrap();
                    p
                });
                sh.push_str(&example_script(&Example {
                    spec: *spec,
                    server,
                    client,
                }));
            }
            let out = Command::new("bash").arg("-c").arg(&sh).output().unwrap();
            summarize(&String::from_utf8_lossy(&out.stdout))
        }

        #[test]
        fn example_blocks_count_one_test_each_and_check_the_carrier() {
            let dir = std::env::temp_dir().join(format!("rrpc-xtask-ex-{}", std::process::id()));
            let carried = |spec: &ExampleSpec, carrier: &str| {
                let mut l = vec![
                    format!("connected to x over Fast, carried by {carrier}");
                    spec.verbs_lines
                ];
                l.extend(spec.expect.iter().map(|e| format!("{e} and more")));
                l
            };
            let ok = run_examples_with(&dir.join("ok"), |s| {
                carried(s, r#"Verbs { device: "rxe0", peer: Some(10.0.2.15) }"#)
            });
            assert_eq!(ok.len(), EXAMPLES.len());
            for (row, spec) in ok.iter().zip(EXAMPLES) {
                assert_eq!(
                    *row,
                    (format!("examples/{}", spec.name), 1, 0, 0, 0, Some(0))
                );
            }
            // Another device, shm, too few carrier lines, a missing result:
            // each fails its example.
            for (case, f) in [
                (
                    "other-device",
                    &(|s: &ExampleSpec| carried(s, r#"Verbs { device: "mlx5_0" }"#))
                        as &dyn Fn(&ExampleSpec) -> Vec<String>,
                ),
                ("shm", &|s: &ExampleSpec| carried(s, "Shm")),
                ("few", &|s: &ExampleSpec| {
                    let mut l = carried(s, r#"Verbs { device: "rxe0", peer: Some(10.0.2.15) }"#);
                    l.remove(0);
                    l
                }),
                ("missing", &|s: &ExampleSpec| {
                    let mut l = carried(s, r#"Verbs { device: "rxe0", peer: Some(10.0.2.15) }"#);
                    l.pop();
                    l
                }),
            ] {
                let rows = run_examples_with(&dir.join(case), f);
                assert_eq!(rows.len(), EXAMPLES.len(), "{case}");
                for row in &rows {
                    assert_eq!((row.1, row.2, row.5), (0, 1, Some(1)), "{case}: {row:?}");
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_versioned_kernel_package() {
        let text = "linux-image-amd64\n  Depends: linux-image-6.1.0-44-amd64\n  Depends: foo\n";
        assert_eq!(
            parse_kernel_package(text).as_deref(),
            Some("linux-image-6.1.0-44-amd64")
        );
        assert_eq!(
            parse_kernel_package("  Depends: linux-image-amd64-signed\n"),
            None
        );
    }

    #[test]
    fn loads_dependencies_first() {
        let dep = parse_modules_dep(
            "kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz\n\
             kernel/net/9p/9pnet.ko.xz:\n\
             kernel/fs/netfs/netfs.ko.xz:\n\
             kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/drivers/virtio/virtio_ring.ko\n\
             kernel/drivers/virtio/virtio_ring.ko:\n",
        );
        let order: Vec<String> = module_load_order(&dep, &["9pnet_virtio", "9p", "virtio_pci"])
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            order,
            ["9pnet", "virtio_ring", "9pnet_virtio", "netfs", "9p"]
        );
    }

    #[test]
    fn numa_nodes_split_memory_and_cpus() {
        let join = |(a, b): (Vec<String>, Vec<String>)| format!("{} {}", a.join(" "), b.join(" "));
        let a = join(numa_args(2, "2048", "2").unwrap());
        assert!(
            a.contains(
                "memory-backend-ram,id=m0,size=1024M -numa node,nodeid=0,cpus=0-0,memdev=m0"
            ),
            "{a}"
        );
        assert!(
            a.contains(
                "memory-backend-ram,id=m1,size=1024M -numa node,nodeid=1,cpus=1-1,memdev=m1"
            ),
            "{a}"
        );
        assert!(a.contains("pxb,id=pxb1,bus_nr=128,numa_node=1"), "{a}");
        let a = join(numa_args(2, "1001", "4").unwrap());
        assert!(a.contains("size=500M") && a.contains("size=501M"), "{a}");
        assert!(a.contains("cpus=0-1") && a.contains("cpus=2-3"), "{a}");
        assert!(numa_args(3, "2048", "2").is_err());
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(sh_quote("abc-1.2/x"), "abc-1.2/x");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
    }
}
