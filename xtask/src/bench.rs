//! `cargo xtask bench`: build the suite binaries once, run them, collect, summarize, plot.

use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::BenchArgs;
use crate::plot::{self, TableFile};
use crate::util::{build_bench, kill_group, utc_timestamp, workspace_root};
use crate::{cluster, paper, signals};

/// Every suite `all` runs, in order (later issues add `connect` and `kv`).
pub(crate) const SUITES: &[&str] = &["fabric", "ringbuf", "poller", "rpc", "kv", "connect"];

/// Where cargo puts the binaries of a profile.
pub(crate) fn profile_dir(profile: &str) -> &str {
    match profile {
        "dev" | "test" => "debug",
        "release" | "bench" => "release",
        other => other,
    }
}

/// The target directory and the bin targets of `rrpc-bench`, from `cargo metadata`.
pub(crate) fn bench_metadata(root: &Path) -> Result<(PathBuf, Vec<String>)> {
    let meta = crate::util::cargo_metadata(root)?;
    let target = meta["target_directory"]
        .as_str()
        .context("cargo metadata has no target_directory")?;
    let bins = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"] == "rrpc-bench")
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    Ok((PathBuf::from(target), bins))
}

/// Waits for a child, killing its process group on Ctrl-C.
fn wait_interruptible(child: &mut Child) -> Result<std::process::ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if signals::interrupted() {
            kill_group(child, Duration::from_secs(2));
            bail!("interrupted: stopped the running suite");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Debug, Serialize)]
struct SuiteRun {
    suite: String,
    status: String,
    elapsed_s: f64,
    dir: PathBuf,
    #[serde(skip)]
    tables: Vec<TableFile>,
    plots: Vec<PathBuf>,
}

/// Reads every `<experiment>.json` of a suite directory.
pub(crate) fn read_tables(dir: &Path) -> Result<Vec<TableFile>> {
    let mut paths: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        let text = fs::read_to_string(&p)?;
        match serde_json::from_str::<TableFile>(&text) {
            Ok(t) => out.push(t),
            Err(e) => eprintln!("warning: {} is not a suite table: {e}", p.display()),
        }
    }
    Ok(out)
}

/// Entry point of `cargo xtask plot`: redraws every table with a plot spec in `dirs` and in their
/// immediate subdirectories (the per-suite directories of a `bench all` run).
pub(crate) fn replot(dirs: &[PathBuf]) -> Result<()> {
    let mut drawn = 0;
    for dir in dirs {
        let mut suite_dirs = vec![dir.clone()];
        let mut subs: Vec<PathBuf> = fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        subs.sort();
        suite_dirs.extend(subs);
        for d in suite_dirs {
            for t in read_tables(&d)? {
                for svg in plot::draw(&t, &d)? {
                    eprintln!("drew {}", svg.with_extension("png").display());
                    drawn += 1;
                }
            }
        }
    }
    if drawn == 0 {
        bail!("no table with a plot spec found");
    }
    Ok(())
}

/// Entry point of `cargo xtask bench`.
pub(crate) fn run(args: &BenchArgs) -> Result<()> {
    if args.suite == "check" {
        return crate::check::run(args);
    }
    if args.rounds.is_some() || args.thresholds.is_some() || args.strict {
        bail!("--rounds, --thresholds and --strict are options of `cargo xtask bench check`");
    }
    signals::install();
    let root = workspace_root();
    let suites: Vec<&str> = if args.suite == "all" {
        SUITES.to_vec()
    } else if SUITES.contains(&args.suite.as_str()) {
        vec![args.suite.as_str()]
    } else {
        bail!(
            "unknown suite `{}` (expected one of {} or all)",
            args.suite,
            SUITES.join(", ")
        );
    };
    let out = args.out.clone().unwrap_or_else(|| {
        root.join("target").join("bench-results").join(format!(
            "{}-{}",
            utc_timestamp(),
            args.suite
        ))
    });
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let (target, bins) = bench_metadata(&root)?;
    let bin_dir = target.join(profile_dir(args.profile()));

    if let Some(hosts) = &args.hosts {
        return cluster::run(args, hosts, &root, &bin_dir, &out);
    }

    let present: Vec<&str> = suites
        .iter()
        .copied()
        .filter(|s| bins.iter().any(|b| b == s))
        .collect();
    if present.is_empty() {
        bail!(
            "no suite binary found for {} in rrpc-bench",
            suites.join(", ")
        );
    }
    if args.no_build {
        for b in &present {
            let exe = bin_dir.join(b);
            if !exe.is_file() {
                bail!(
                    "--no-build: {} is not built (build it with `cargo build --profile {} -p rrpc-bench`)",
                    exe.display(),
                    args.profile()
                );
            }
        }
    } else {
        build_bench(&root, args.profile(), &present)?;
    }

    let mut runs: Vec<SuiteRun> = Vec::new();
    let mut failed = Vec::new();
    for (i, suite) in suites.iter().enumerate() {
        let dir = if suites.len() > 1 {
            out.join(suite)
        } else {
            out.clone()
        };
        if !present.contains(suite) {
            eprintln!(
                "=== [{}/{}] {suite}: SKIPPED (benches/src/bin/{suite}.rs does not exist yet)",
                i + 1,
                suites.len()
            );
            runs.push(SuiteRun {
                suite: (*suite).to_owned(),
                status: "skipped: no binary".into(),
                elapsed_s: 0.0,
                dir,
                tables: Vec::new(),
                plots: Vec::new(),
            });
            continue;
        }
        fs::create_dir_all(&dir)?;
        eprintln!(
            "=== [{}/{}] {suite} -> {}",
            i + 1,
            suites.len(),
            dir.display()
        );
        let mut cmd = Command::new(bin_dir.join(suite));
        cmd.arg("--out")
            .arg(&dir)
            .current_dir(&root)
            .process_group(0);
        if args.quick {
            cmd.arg("--quick");
        }
        if args.json {
            cmd.arg("--json").stdout(Stdio::null());
        }
        cmd.args(&args.suite_args);
        let t = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting suite {suite}"))?;
        let status = wait_interruptible(&mut child)?;
        let elapsed_s = t.elapsed().as_secs_f64();
        let status = if status.success() {
            "ok".to_owned()
        } else {
            failed.push((*suite).to_owned());
            format!("FAILED ({status})")
        };
        eprintln!("=== {suite}: {status} in {elapsed_s:.1}s");
        let tables = read_tables(&dir)?;
        let mut plots = Vec::new();
        for t in &tables {
            match plot::draw(t, &dir) {
                Ok(svgs) => plots.extend(svgs),
                Err(e) => eprintln!("warning: plot {}: {e:#}", t.experiment),
            }
        }
        runs.push(SuiteRun {
            suite: (*suite).to_owned(),
            status,
            elapsed_s,
            dir,
            tables,
            plots,
        });
    }

    let all_tables: Vec<&TableFile> = runs.iter().flat_map(|r| r.tables.iter()).collect();
    let compare = args.compare_paper.then(|| paper::compare(&all_tables));
    let summary = summary_markdown(&out, &runs, compare.as_deref(), args, "");
    fs::write(out.join("summary.md"), &summary)?;
    if writes_doc(args) {
        let doc = write_doc(&root, &out, &runs, compare.as_deref(), args)?;
        eprintln!("benchmarks doc: {}", doc.display());
    }
    if args.json {
        let doc = serde_json::json!({
            "out_dir": out,
            "quick": args.quick,
            "suites": runs,
            "tables": all_tables,
            "compare_paper": compare,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        if let Some(c) = &compare {
            println!("{c}");
        }
        eprintln!("summary: {}", out.join("summary.md").display());
    }
    if !failed.is_empty() {
        bail!("suite(s) failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Whether this run regenerates `docs/benchmarks.md`: a full local run of
/// every suite (`cargo xtask bench all`), not a `--quick` smoke run, not a
/// cluster run, not `--no-doc`.
fn writes_doc(args: &BenchArgs) -> bool {
    args.suite == "all" && !args.quick && args.hosts.is_none() && !args.no_doc
}

/// Where `cargo xtask bench all` writes its figures: the page, and its
/// plots under `img/bench/` beside it.
pub(crate) const DOC: &str = "docs/benchmarks.md";

/// Writes [`DOC`] from a finished run: the run's summary (commit, machine,
/// each suite's thread plan, every table) with its plots copied to
/// `docs/img/bench/`, replacing what an earlier run wrote there.
fn write_doc(
    root: &Path,
    out: &Path,
    runs: &[SuiteRun],
    compare: Option<&str>,
    args: &BenchArgs,
) -> Result<PathBuf> {
    let doc = root.join(DOC);
    let img = doc.parent().expect("docs/").join("img").join("bench");
    if img.exists() {
        fs::remove_dir_all(&img).with_context(|| format!("clearing {}", img.display()))?;
    }
    for r in runs {
        for svg in &r.plots {
            let rel = svg.strip_prefix(out).unwrap_or(svg);
            let to = img.join(rel);
            fs::create_dir_all(to.parent().expect("a file"))?;
            fs::copy(svg, &to).with_context(|| format!("copying {}", svg.display()))?;
        }
    }
    let mut s = String::from(
        "<!-- Generated by `cargo xtask bench all`: do not edit by hand; re-run it. -->\n",
    );
    s.push_str(&summary_markdown(out, runs, compare, args, "img/bench/"));
    fs::write(&doc, s).with_context(|| format!("writing {}", doc.display()))?;
    Ok(doc)
}

/// The run's Markdown summary; plot links are `img_prefix` + their path
/// under `out`.
fn summary_markdown(
    out: &Path,
    runs: &[SuiteRun],
    compare: Option<&str>,
    args: &BenchArgs,
    img_prefix: &str,
) -> String {
    let mut s = String::from("# rrpc benchmark results\n\n");
    let cmd = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let _ = writeln!(
        s,
        "Command: `cargo xtask {cmd}` (profile `{}`), {}\n",
        args.profile(),
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    if args.quick {
        s.push_str("**--quick smoke run: these numbers say nothing about speed.**\n\n");
    }
    if let Some(m) = runs
        .iter()
        .flat_map(|r| r.tables.first())
        .map(|t| &t.machine)
        .next()
    {
        let g = |k: &str| {
            m[k].as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| m[k].to_string())
        };
        let _ = writeln!(
            s,
            "Machine: {} ({} cores usable), {} MiB RAM, {}, host `{}`, git `{}`\n",
            g("cpu_model"),
            g("cores"),
            g("mem_mib"),
            g("kernel"),
            g("host"),
            g("git_rev")
        );
    }
    s.push_str("| suite | status | time (s) |\n| --- | --- | ---: |\n");
    for r in runs {
        let _ = writeln!(s, "| {} | {} | {:.1} |", r.suite, r.status, r.elapsed_s);
    }
    s.push('\n');
    for r in runs {
        if r.tables.is_empty() {
            continue;
        }
        let _ = writeln!(s, "## {}\n", r.suite);
        let pinning = r.tables[0].machine["pinning"]
            .as_str()
            .unwrap_or("-")
            .to_owned();
        let provider = r.tables[0].machine["provider"]
            .as_str()
            .unwrap_or("-")
            .to_owned();
        let _ = writeln!(s, "Provider `{provider}`; threads and pinning: {pinning}\n");
        for t in &r.tables {
            let md_path = r.dir.join(format!("{}.md", t.experiment));
            match fs::read_to_string(&md_path) {
                Ok(md) => s.push_str(&md),
                Err(_) => {
                    let _ = writeln!(s, "### {}\n\n(no markdown written)", t.title);
                }
            }
            s.push('\n');
            for (stem, spec) in t.plots() {
                let rel = r
                    .dir
                    .strip_prefix(out)
                    .unwrap_or(&r.dir)
                    .join(format!("{stem}.svg"));
                let caption = spec.caption.as_ref().unwrap_or(&t.title);
                let _ = writeln!(s, "![{caption}]({img_prefix}{})\n", rel.display());
            }
        }
    }
    if let Some(c) = compare {
        s.push_str(c);
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn bench_args(argv: &[&str]) -> BenchArgs {
        use clap::Parser as _;
        let cli = crate::Cli::try_parse_from(argv).expect("valid arguments");
        match cli.cmd {
            crate::Cmd::Bench(b) => b,
            other => panic!("not bench: {other:?}"),
        }
    }

    /// Only a full local run of every suite rewrites docs/benchmarks.md:
    /// never a smoke run (CI's), one suite, a cluster run, or `--no-doc`.
    #[test]
    fn only_a_full_bench_all_writes_the_doc() {
        assert!(writes_doc(&bench_args(&["xtask", "bench", "all"])));
        for argv in [
            &["xtask", "bench", "all", "--quick"][..],
            &["xtask", "bench", "rpc"],
            &["xtask", "bench", "all", "--no-doc"],
            &["xtask", "bench", "all", "--hosts", "h.toml"],
        ] {
            assert!(!writes_doc(&bench_args(argv)), "{argv:?}");
        }
    }

    #[test]
    fn profile_dirs() {
        assert_eq!(profile_dir("bench"), "release");
        assert_eq!(profile_dir("dev"), "debug");
        assert_eq!(profile_dir("custom"), "custom");
    }

    #[test]
    fn kill_group_stops_grandchildren() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30; wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            live_members(pgid) >= 2,
            "the shell and its sleeps are running"
        );
        kill_group(&mut child, Duration::from_secs(1));
        // A killed process leaves /proc a moment after the signal (CI once counted 2 live
        // members right after the SIGKILL), and a backgrounded sleep may linger as a zombie
        // until init reaps it: wait, boundedly, for no live ones.
        let t0 = std::time::Instant::now();
        while live_members(pgid) > 0 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            live_members(pgid),
            0,
            "process group {pgid} still has live members 5 s after the SIGKILL"
        );
    }

    /// Processes of group `pgid` that are not zombies.
    pub(crate) fn live_members(pgid: i32) -> usize {
        fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| fs::read_to_string(e.path().join("stat")).ok())
            .filter(|stat| {
                let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                    return false;
                };
                let f: Vec<&str> = rest.split_whitespace().collect();
                f.len() > 2 && f[2] == pgid.to_string() && f[0] != "Z" && f[0] != "X"
            })
            .count()
    }
}
