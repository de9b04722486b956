//! `cargo xtask verbs-selftest [--device NAME] [--list]`: on a machine with an
//! RDMA device, runs the verbs suite natively (the same binaries and filters
//! as `cargo xtask rxe`) plus a short `ibv_rc_pingpong` on the device. Without
//! a device it says so, listing what it found: devices under
//! `/sys/class/infiniband`, their ports, GIDs, and the memlock limit.
//!
//! Only the "no device" report and the listing have been run by the authors
//! (the listing also inside the soft-RoCE VM); the suite it runs is the one
//! `cargo xtask rxe` runs on soft-RoCE. Not run on an RDMA NIC.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::rxe::suite;

/// `cargo xtask verbs-selftest` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct SelftestArgs {
    /// The RDMA device to test (default: the only one listed; with several, name one).
    #[arg(long)]
    device: Option<String>,
    /// Only list devices, ports, GIDs and the memlock limit.
    #[arg(long)]
    list: bool,
    /// Seconds each test binary may run.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
}

/// One port of a device.
#[derive(Debug, Clone)]
pub(crate) struct Port {
    pub(crate) num: u32,
    pub(crate) state: String,
    pub(crate) link_layer: String,
    /// (index, gid, type) of every non-zero GID.
    pub(crate) gids: Vec<(u32, String, String)>,
}

fn read_trim(p: &Path) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn sorted_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort_by_key(|n| (n.parse::<u64>().unwrap_or(u64::MAX), n.clone()));
    v
}

/// Devices under `sysfs` (`/sys/class/infiniband`) with their ports.
pub(crate) fn discover(sysfs: &Path) -> Vec<(String, Vec<Port>)> {
    sorted_entries(sysfs)
        .into_iter()
        .map(|dev| {
            let pdir = sysfs.join(&dev).join("ports");
            let ports = sorted_entries(&pdir)
                .into_iter()
                .filter_map(|p| {
                    let num = p.parse().ok()?;
                    let base = pdir.join(&p);
                    let gids = sorted_entries(&base.join("gids"))
                        .into_iter()
                        .filter_map(|i| {
                            let gid = read_trim(&base.join("gids").join(&i));
                            if gid.is_empty() || gid.chars().all(|c| c == '0' || c == ':') {
                                return None;
                            }
                            let ty = read_trim(&base.join("gid_attrs/types").join(&i));
                            Some((i.parse().ok()?, gid, ty))
                        })
                        .collect();
                    Some(Port {
                        num,
                        state: read_trim(&base.join("state")),
                        link_layer: read_trim(&base.join("link_layer")),
                        gids,
                    })
                })
                .collect();
            (dev, ports)
        })
        .collect()
}

/// The GID index to use: an IPv4-mapped RoCE v2 GID if there is one, else
/// the first listed.
pub(crate) fn preferred_gid(port: &Port) -> Option<u32> {
    port.gids
        .iter()
        .find(|(_, g, t)| g.starts_with("0000:0000:0000:0000:0000:ffff:") && t.contains("v2"))
        .or(port.gids.first())
        .map(|(i, _, _)| *i)
}

fn memlock() -> String {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_MEMLOCK) else {
        return "unknown".into();
    };
    let show = |v: u64| {
        if v == RLIM_INFINITY {
            "unlimited".to_owned()
        } else {
            format!("{} KiB", v / 1024)
        }
    };
    format!("soft {}, hard {}", show(soft), show(hard))
}

fn report(devs: &[(String, Vec<Port>)]) {
    eprintln!("RDMA devices (/sys/class/infiniband): {}", devs.len());
    for (d, ports) in devs {
        eprintln!("  {d}");
        for p in ports {
            eprintln!(
                "    port {}: {} ({}), preferred GID index {}",
                p.num,
                p.state,
                p.link_layer,
                preferred_gid(p).map_or("none".into(), |i| i.to_string())
            );
            for (i, g, t) in &p.gids {
                eprintln!("      GID[{i}] {g} {t}");
            }
        }
    }
    eprintln!("memlock limit (ulimit -l): {}", memlock());
}

/// A short `ibv_rc_pingpong` between two processes on `device`.
fn pingpong(device: &str, gid: Option<u32>) -> Result<bool> {
    if Command::new("ibv_rc_pingpong")
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        eprintln!(
            "ibv_rc_pingpong not installed (apt-get install ibverbs-utils): ping-pong skipped"
        );
        return Ok(false);
    }
    let mut args = vec![
        "-d".to_owned(),
        device.to_owned(),
        "-n".into(),
        "1000".into(),
        "-p".into(),
        "18515".into(),
    ];
    if let Some(g) = gid {
        args.extend(["-g".into(), g.to_string()]);
    }
    let mut server = Command::new("ibv_rc_pingpong")
        .args(&args)
        .spawn()
        .context("starting ibv_rc_pingpong")?;
    std::thread::sleep(Duration::from_millis(500));
    let client = Command::new("timeout")
        .arg("60")
        .arg("ibv_rc_pingpong")
        .args(&args)
        .arg("127.0.0.1")
        .status()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let server_ok = loop {
        if let Some(st) = server.try_wait()? {
            break st.success();
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            let _ = server.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok(client.success() && server_ok)
}

/// Entry point: returns the exit code (2 when there is no device to test).
pub(crate) fn run(args: &SelftestArgs) -> Result<i32> {
    let devs = discover(Path::new("/sys/class/infiniband"));
    report(&devs);
    if args.list {
        return Ok(0);
    }
    let chosen = match (&args.device, devs.len()) {
        (Some(d), _) if devs.iter().any(|(n, _)| n == d) => d.clone(),
        (Some(d), _) => {
            eprintln!("verbs-selftest: no RDMA device named {d:?} here: nothing tested");
            return Ok(2);
        }
        (None, 0) => {
            eprintln!(
                "verbs-selftest: no RDMA device on this machine: nothing tested \
                 (`cargo xtask rxe` runs the same suite on soft-RoCE in a VM)"
            );
            return Ok(2);
        }
        (None, 1) => devs[0].0.clone(),
        (None, _) => {
            eprintln!("verbs-selftest: several devices: name one with --device");
            return Ok(2);
        }
    };
    let root = crate::util::workspace_root();
    let t0 = Instant::now();
    let built = suite::build(&root)?;
    eprintln!(
        "verbs-selftest: suite built in {:.1}s; running it on {chosen}",
        t0.elapsed().as_secs_f64()
    );
    let script = suite::script(&built, Some(&chosen), args.timeout);
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(&root)
        .stderr(Stdio::inherit())
        .output()
        .context("running the suite")?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    let rows = suite::summarize(&text);
    let (_, failed, _, skipped) = suite::print_summary(&rows);
    let gid = devs
        .iter()
        .find(|(n, _)| *n == chosen)
        .and_then(|(_, ports)| ports.first())
        .and_then(preferred_gid);
    let ping = pingpong(&chosen, gid)?;
    eprintln!(
        "verbs-selftest on {chosen}: suite {}, ibv_rc_pingpong {}",
        if out.status.success() && failed == 0 && skipped == 0 {
            "passed"
        } else {
            "FAILED"
        },
        if ping { "passed" } else { "failed or skipped" }
    );
    Ok(
        if out.status.success() && failed == 0 && skipped == 0 && ping {
            0
        } else {
            1
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovers_a_fake_sysfs_and_prefers_ipv4_mapped_roce_v2() {
        let d = std::env::temp_dir().join(format!("rrpc-selftest-{}", std::process::id()));
        let port = d.join("rxe0/ports/1");
        std::fs::create_dir_all(port.join("gids")).unwrap();
        std::fs::create_dir_all(port.join("gid_attrs/types")).unwrap();
        std::fs::write(port.join("state"), "4: ACTIVE\n").unwrap();
        std::fs::write(port.join("link_layer"), "Ethernet\n").unwrap();
        let gids = [
            "fe80:0000:0000:0000:38a4:1dff:fecb:261c",
            "0000:0000:0000:0000:0000:ffff:0a63:0001",
            "0000:0000:0000:0000:0000:0000:0000:0000",
        ];
        for (i, g) in gids.iter().enumerate() {
            std::fs::write(port.join(format!("gids/{i}")), g).unwrap();
            std::fs::write(port.join(format!("gid_attrs/types/{i}")), "RoCE v2\n").unwrap();
        }
        let devs = discover(&d);
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].0, "rxe0");
        let p = &devs[0].1[0];
        assert_eq!((p.num, p.state.as_str()), (1, "4: ACTIVE"));
        assert_eq!(p.gids.len(), 2, "the zero GID is not listed");
        assert_eq!(preferred_gid(p), Some(1));
        assert!(discover(Path::new("/nonexistent-rrpc")).is_empty());
    }
}
