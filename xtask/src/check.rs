//! `cargo xtask bench check`: the performance regression guard (issue #30).
//!
//! Runs the quick sources named in a thresholds file (`benches/thresholds.toml`) in N rounds,
//! each round running every source once and the order reversed every other round; reads each
//! headline ratio of every round from the tables that round wrote (numerator and denominator
//! measured in the same process); takes the median across rounds and compares it with the
//! committed threshold widened by its tolerance. It fails naming every ratio that is worse.
//!
//! The pure parts (the thresholds file, selectors, medians, verdicts, the failure message) are
//! at the top and unit tested; running the sources is below them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::BenchArgs;
use crate::plot::TableFile;
use crate::util::{kill_group, utc_timestamp, workspace_root};

/// The thresholds file CI and `cargo xtask bench check` read by default.
pub(crate) const DEFAULT_THRESHOLDS: &str = "benches/thresholds.toml";
/// Rounds by default: the median of five survives two outliers.
pub(crate) const DEFAULT_ROUNDS: usize = 5;
/// The demo runs this many times the rounds (#54): its floors move between two speeds from run
/// to run on a shared host (`tonic-inproc` 1.9 or 3.2 µs, `tonic-h2-mem` 16 or 27 µs, with
/// nothing else running), and a median of 5 of its ratios left a check failing 2 times in 10
/// at limits 1.3x the median; of 10, 0 in 10 (`--rounds 10`, 2026-12-06). A demo round takes
/// about a second.
const DEMO_ROUND_FACTOR: usize = 2;
/// The profile the guard builds by default: optimised, without the `bench` profile's thin LTO
/// (a second full build of everything for a few percent the ratios do not need).
pub(crate) const DEFAULT_PROFILE: &str = "release";
/// A source that runs longer than this is killed, with its process group, and fails its round.
const SOURCE_TIMEOUT: Duration = Duration::from_secs(120);

/// A program that measures: one run writes tables, read back by [`Selector`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Source {
    /// `examples`' `demo --json`: p50/p99 per path in one process (table `demo`).
    Demo,
    /// `ringbuf --quick --only exp1`: `exp1_throughput`, `reference_rtrb_64b`.
    Ringbuf,
    /// `kv --quick --only ycsb --ycsb-workloads c`: `ycsb` (workload C only).
    Kv,
    /// `connect --quick --only connect_time`: `connect_time`.
    Connect,
    /// `poller --quick --only idle_cpu`: `idle_cpu`.
    Poller,
    /// `icount` under callgrind: table `icount` (`op`, `instructions_per_op`).
    Icount,
    /// `demo --only PATH` under callgrind on one CPU, per path: table `demo_icount` (`path`,
    /// `instructions_per_call`; both ends and the runtime, one process).
    #[serde(rename = "demo-icount")]
    DemoIcount,
}

impl Source {
    /// The binary's name.
    pub(crate) fn bin(self) -> &'static str {
        match self {
            Source::Demo => "demo",
            Source::Ringbuf => "ringbuf",
            Source::Kv => "kv",
            Source::Connect => "connect",
            Source::Poller => "poller",
            Source::Icount => "icount",
            Source::DemoIcount => "demo",
        }
    }

    /// The directory of its run in a round.
    fn dir_name(self) -> &'static str {
        match self {
            Source::DemoIcount => "demo-icount",
            s => s.bin(),
        }
    }

    /// Whether its figures are instruction counts (callgrind), the same from run to run up to
    /// a few parts in ten thousand: it runs in the first round only, not in every one (each
    /// `demo-icount` run took ~11 s of the guard's ~90 s of runs).
    pub(crate) fn deterministic(self) -> bool {
        matches!(self, Source::Icount | Source::DemoIcount)
    }

    /// The rounds it runs in, out of `rounds`: the deterministic sources once; the demo twice
    /// as many ([`DEMO_ROUND_FACTOR`]); the others `rounds`.
    pub(crate) fn rounds(self, rounds: usize) -> usize {
        match self {
            _ if self.deterministic() => 1,
            Source::Demo => rounds * DEMO_ROUND_FACTOR,
            _ => rounds,
        }
    }

    /// The package that builds the binary.
    fn package(self) -> &'static str {
        match self {
            Source::Demo | Source::DemoIcount => "examples",
            _ => "rrpc-bench",
        }
    }

    /// Arguments of a run writing its tables to `out`.
    fn args(self, out: &Path) -> Vec<String> {
        let quick = |only: &str| {
            vec![
                "--quick".into(),
                "--json".into(),
                "--no-progress".into(),
                "--out".into(),
                out.display().to_string(),
                "--only".into(),
                only.into(),
            ]
        };
        match self {
            Source::Demo => vec!["--json".into()],
            Source::Ringbuf => quick("exp1"),
            Source::Kv => [quick("ycsb"), vec!["--ycsb-workloads".into(), "c".into()]].concat(),
            Source::Connect => quick("connect_time"),
            Source::Poller => quick("idle_cpu"),
            Source::Icount | Source::DemoIcount => Vec::new(),
        }
    }
}

/// Which way is better for a ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Better {
    /// Latencies, CPU: a larger value is a regression.
    Lower,
    /// Throughputs: a smaller value is a regression.
    Higher,
}

/// One guarded ratio of the thresholds file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RatioSpec {
    /// Its name in the table and in the failure message (`fast/tcp`).
    pub(crate) name: String,
    /// The program whose tables hold both of its cells.
    pub(crate) source: Source,
    /// The numerator (or the value itself, without `over`): `table:column[key=value,...]`.
    pub(crate) value: String,
    /// The denominator, from the same run.
    #[serde(default)]
    pub(crate) over: Option<String>,
    /// Which way is better.
    pub(crate) better: Better,
    /// The committed threshold: measured median plus a margin for noise.
    pub(crate) threshold: f64,
    /// How far past the threshold a median may go, as a fraction of it (0.1 = 10 %).
    pub(crate) tolerance: f64,
    /// Why this threshold: the medians measured and the margin.
    pub(crate) reason: String,
    /// A program the ratio needs on `PATH` (`redis-server`): without it the ratio is reported
    /// as skipped, never passed.
    #[serde(default)]
    pub(crate) requires: Option<String>,
    /// A bound every round must meet, not only the median: for a ratio with two modes, where
    /// a median of mostly good rounds hides a bad one (the HTTP/2 path's sleeping mode, #54).
    #[serde(default)]
    pub(crate) round_limit: Option<f64>,
}

impl RatioSpec {
    /// The worst median that still passes: the threshold widened by the tolerance.
    pub(crate) fn limit(&self) -> f64 {
        match self.better {
            Better::Lower => self.threshold * (1.0 + self.tolerance),
            Better::Higher => self.threshold * (1.0 - self.tolerance),
        }
    }

    /// Whether `median` passes.
    pub(crate) fn passes(&self, median: f64) -> bool {
        match self.better {
            Better::Lower => median <= self.limit(),
            Better::Higher => median >= self.limit(),
        }
    }

    /// The rounds' values beyond [`round_limit`](Self::round_limit), if it is set.
    pub(crate) fn rounds_beyond(&self, values: &[f64]) -> Vec<f64> {
        let Some(l) = self.round_limit else {
            return Vec::new();
        };
        values
            .iter()
            .copied()
            .filter(|&v| match self.better {
                Better::Lower => v > l,
                Better::Higher => v < l,
            })
            .collect()
    }

    /// The ratio in one round's tables.
    pub(crate) fn measure(&self, tables: &[TableFile]) -> Result<f64> {
        let v = Selector::parse(&self.value)?.find(tables)?;
        match &self.over {
            None => Ok(v),
            Some(o) => {
                let d = Selector::parse(o)?.find(tables)?;
                if !(d.is_finite() && d > 0.0) {
                    bail!("{o} is {d}, not a positive number");
                }
                Ok(v / d)
            }
        }
    }
}

/// The thresholds file: `[[ratio]]` entries.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Thresholds {
    #[serde(rename = "ratio")]
    pub(crate) ratios: Vec<RatioSpec>,
}

impl Thresholds {
    /// Parses and checks a thresholds file's text.
    pub(crate) fn parse(text: &str) -> Result<Self> {
        let t: Thresholds = toml::from_str(text).context("parsing the thresholds file")?;
        if t.ratios.is_empty() {
            bail!("the thresholds file lists no [[ratio]]");
        }
        for (i, r) in t.ratios.iter().enumerate() {
            if t.ratios[..i].iter().any(|o| o.name == r.name) {
                bail!("ratio `{}` is listed twice", r.name);
            }
            if !(r.threshold.is_finite() && r.threshold > 0.0) {
                bail!(
                    "ratio `{}`: threshold {} is not a positive number",
                    r.name,
                    r.threshold
                );
            }
            if !(0.0..1.0).contains(&r.tolerance) {
                bail!(
                    "ratio `{}`: tolerance {} is not a fraction in [0, 1)",
                    r.name,
                    r.tolerance
                );
            }
            if r.reason.trim().is_empty() {
                bail!("ratio `{}` gives no reason for its threshold", r.name);
            }
            Selector::parse(&r.value).with_context(|| format!("ratio `{}`", r.name))?;
            if let Some(o) = &r.over {
                Selector::parse(o).with_context(|| format!("ratio `{}`", r.name))?;
            }
        }
        Ok(t)
    }

    /// The sources the ratios need, each once, in a fixed order.
    pub(crate) fn sources(&self) -> Vec<Source> {
        let mut s: Vec<Source> = self.ratios.iter().map(|r| r.source).collect();
        s.sort();
        s.dedup();
        s
    }
}

/// A cell of a suite table: `table:column[key=value,...]`, the row whose cells equal every
/// `key=value` (the first such row).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Selector {
    pub(crate) table: String,
    pub(crate) column: String,
    pub(crate) filters: Vec<(String, String)>,
}

impl Selector {
    pub(crate) fn parse(s: &str) -> Result<Self> {
        let (table, rest) = s
            .split_once(':')
            .with_context(|| format!("selector `{s}`: expected table:column[key=value,...]"))?;
        let (column, filters) = match rest.split_once('[') {
            None => (rest, Vec::new()),
            Some((column, f)) => {
                let f = f
                    .strip_suffix(']')
                    .with_context(|| format!("selector `{s}`: no closing `]`"))?;
                let filters = f
                    .split(',')
                    .map(|kv| {
                        kv.split_once('=')
                            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                            .with_context(|| format!("selector `{s}`: `{kv}` is not key=value"))
                    })
                    .collect::<Result<Vec<_>>>()?;
                (column, filters)
            }
        };
        if table.is_empty() || column.is_empty() {
            bail!("selector `{s}`: empty table or column");
        }
        Ok(Selector {
            table: table.to_owned(),
            column: column.to_owned(),
            filters,
        })
    }

    /// The selected number in `tables`.
    pub(crate) fn find(&self, tables: &[TableFile]) -> Result<f64> {
        let t = tables
            .iter()
            .find(|t| t.experiment == self.table)
            .with_context(|| format!("no table `{}`", self.table))?;
        let col = |name: &str| {
            t.column(name)
                .with_context(|| format!("table `{}` has no column `{name}`", self.table))
        };
        let c = col(&self.column)?;
        let keys = self
            .filters
            .iter()
            .map(|(k, v)| Ok((col(k)?, v.as_str())))
            .collect::<Result<Vec<_>>>()?;
        let row = t
            .rows
            .iter()
            .find(|row| {
                keys.iter()
                    .all(|(i, v)| row.get(*i).is_some_and(|cell| cell_text(cell) == *v))
            })
            .with_context(|| format!("table `{}` has no row {:?}", self.table, self.filters))?;
        row.get(c)
            .and_then(serde_json::Value::as_f64)
            .filter(|v| v.is_finite())
            .with_context(|| {
                format!(
                    "table `{}` row {:?}: `{}` is not a number",
                    self.table, self.filters, self.column
                )
            })
    }
}

/// A cell as the text a selector's `key=value` compares with (`C`, `4096`).
fn cell_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The median (the mean of the middle two for an even count); `None` when empty.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The outcome of one ratio.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    Pass,
    /// Worse than its threshold beyond the tolerance.
    Fail,
    /// Measured in too few rounds to judge (a source failed or a row was missing).
    NotMeasured(String),
    /// A required program is missing (`skipped: redis-server not found`).
    Skipped(String),
}

/// One ratio's row of the result table.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub(crate) name: String,
    pub(crate) values: Vec<f64>,
    pub(crate) median: Option<f64>,
    pub(crate) verdict: Verdict,
}

/// Judges one ratio from its per-round values (`Err`: why a round has none) out of `rounds`.
pub(crate) fn judge(
    spec: &RatioSpec,
    per_round: &[Result<f64, String>],
    rounds: usize,
    missing_tool: Option<&str>,
) -> Outcome {
    let values: Vec<f64> = per_round.iter().filter_map(|r| r.clone().ok()).collect();
    let med = median(&values);
    let verdict = if let Some(tool) = missing_tool {
        Verdict::Skipped(format!("skipped: {tool} not found"))
    } else if values.len() * 2 <= rounds {
        // A majority of rounds must measure it: a median of one noisy run is not a guard.
        let why = per_round
            .iter()
            .find_map(|r| r.clone().err())
            .unwrap_or_else(|| "no round".into());
        Verdict::NotMeasured(format!(
            "measured in {} of {rounds} rounds ({why})",
            values.len()
        ))
    } else if med.is_some_and(|m| spec.passes(m)) && spec.rounds_beyond(&values).is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail
    };
    Outcome {
        name: spec.name.clone(),
        values,
        median: med,
        verdict,
    }
}

/// The result table in Markdown.
pub(crate) fn table_markdown(specs: &[RatioSpec], outcomes: &[Outcome]) -> String {
    let mut s = String::from(
        "| ratio | better | median | min-max | rounds | threshold (limit) | verdict |\n\
         | --- | --- | ---: | ---: | ---: | ---: | --- |\n",
    );
    for (spec, o) in specs.iter().zip(outcomes) {
        let (lo, hi) = o
            .values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(*v), b.max(*v))
            });
        let range = if o.values.is_empty() {
            "-".to_owned()
        } else {
            format!("{lo:.3}-{hi:.3}")
        };
        let verdict = match &o.verdict {
            Verdict::Pass => "pass".to_owned(),
            Verdict::Fail => "**FAIL**".to_owned(),
            Verdict::NotMeasured(w) => format!("**FAIL**: {w}"),
            Verdict::Skipped(w) => w.clone(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {range} | {} | {:.3} ({} {:.3}{}) | {verdict} |",
            o.name,
            match spec.better {
                Better::Lower => "lower",
                Better::Higher => "higher",
            },
            o.median.map_or("-".to_owned(), |m| format!("{m:.3}")),
            o.values.len(),
            spec.threshold,
            match spec.better {
                Better::Lower => "<=",
                Better::Higher => ">=",
            },
            spec.limit(),
            spec.round_limit
                .map_or(String::new(), |l| format!("; every round {l:.3}")),
        );
    }
    s
}

/// `Err` naming every failing ratio (and why), `Ok` when none failed; skipped ones pass
/// the check but stay visible in the table and in `skipped`.
pub(crate) fn failures(specs: &[RatioSpec], outcomes: &[Outcome]) -> Result<Vec<String>> {
    let mut failed = Vec::new();
    let mut skipped = Vec::new();
    for (spec, o) in specs.iter().zip(outcomes) {
        match &o.verdict {
            Verdict::Pass => {}
            Verdict::Fail if o.median.is_some_and(|m| spec.passes(m)) => {
                let beyond = spec.rounds_beyond(&o.values);
                failed.push(format!(
                    "{} ({} of {} rounds {} than the round limit {:.3}: {})",
                    o.name,
                    beyond.len(),
                    o.values.len(),
                    match spec.better {
                        Better::Lower => "higher",
                        Better::Higher => "lower",
                    },
                    spec.round_limit.unwrap_or(f64::NAN),
                    beyond
                        .iter()
                        .map(|v| format!("{v:.3}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            Verdict::Fail => failed.push(format!(
                "{} (median {:.3}, {} than the limit {:.3} = threshold {} {} {:.0} %)",
                o.name,
                o.median.unwrap_or(f64::NAN),
                match spec.better {
                    Better::Lower => "higher",
                    Better::Higher => "lower",
                },
                spec.limit(),
                spec.threshold,
                match spec.better {
                    Better::Lower => "+",
                    Better::Higher => "-",
                },
                spec.tolerance * 100.0
            )),
            Verdict::NotMeasured(w) => failed.push(format!("{} ({w})", o.name)),
            Verdict::Skipped(w) => skipped.push(format!("{} ({w})", o.name)),
        }
    }
    if failed.is_empty() {
        Ok(skipped)
    } else {
        bail!(
            "performance regression guard: {} ratio(s) worse than their thresholds: {}",
            failed.len(),
            failed.join("; ")
        )
    }
}

/// The rounds' order of sources: as listed in even rounds, reversed in odd ones, so that no
/// source always runs right after the same neighbour (or always first, on a cold machine).
/// A [`Source::deterministic`] one runs in the first round only.
pub(crate) fn round_order(sources: &[Source], round: usize, rounds: usize) -> Vec<Source> {
    let mut s: Vec<Source> = sources
        .iter()
        .copied()
        .filter(|s| round < s.rounds(rounds))
        .collect();
    if round % 2 == 1 {
        s.reverse();
    }
    s
}

/// Whether `program` is an executable file on `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// The demo's `--json` object as a table `demo` (`path`, `p50_us`, `p99_us`).
pub(crate) fn demo_table(stdout: &str) -> Result<TableFile> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("demo --json printed no JSON object")?;
    let doc: serde_json::Value = serde_json::from_str(line).context("parsing demo --json")?;
    let rows = doc["paths"]
        .as_array()
        .context("demo --json: no `paths` array")?
        .iter()
        .map(|p| vec![p["path"].clone(), p["p50_us"].clone(), p["p99_us"].clone()])
        .collect();
    Ok(TableFile {
        suite: "demo".into(),
        quick: false,
        machine: serde_json::Value::Null,
        experiment: "demo".into(),
        title: "demo p50/p99 per path".into(),
        columns: vec!["path".into(), "p50_us".into(), "p99_us".into()],
        rows,
        notes: Vec::new(),
        plot: None,
        more_plots: Vec::new(),
    })
}

/// The ops of `icount` the guard counts, and the two iteration counts whose difference
/// cancels start-up.
const ICOUNT_OPS: &[&str] = &[
    "frame-unary",
    "ring-64b",
    "rtrb-64b",
    "ring-4k",
    "memcpy-4k",
];
const ICOUNT_ITERS: (u64, u64) = (200, 2200);

/// The instruction total of one callgrind run (its `Collected : N` line on stderr).
pub(crate) fn callgrind_total(stderr: &str) -> Result<u64> {
    stderr
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("Collected :")?;
            rest.trim().parse().ok()
        })
        .context("callgrind printed no `Collected :` line")
}

/// The instructions one unit of work costs: `command(n, out_file)` (a program under
/// callgrind that does `n` units after the same start-up) at both of `counts`, the difference
/// of the two totals over `units`, the units between them. `label` names the runs' files in
/// `dir` and the program in errors.
fn callgrind_difference(
    dir: &Path,
    root: &Path,
    label: &str,
    counts: (u64, u64),
    units: f64,
    command: impl Fn(u64, &Path) -> Command,
) -> Result<f64> {
    let mut totals = Vec::new();
    for n in [counts.0, counts.1] {
        let out = command(n, &dir.join(format!("callgrind.{label}.{n}")))
            .current_dir(root)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting {label} under callgrind"))?;
        let err = String::from_utf8_lossy(&out.stderr);
        fs::write(dir.join(format!("stderr.{label}.{n}.log")), err.as_bytes())?;
        if !out.status.success() {
            bail!("{label} under callgrind exited with {}", out.status);
        }
        totals.push(callgrind_total(&err)?);
    }
    Ok((totals[1] as f64 - totals[0] as f64) / units)
}

/// A table of instruction counts, one row per `(key, count)`.
fn count_table(
    experiment: &str,
    title: &str,
    columns: [&str; 2],
    rows: Vec<(&str, f64)>,
) -> TableFile {
    TableFile {
        suite: experiment.replace('_', "-"),
        quick: false,
        machine: serde_json::Value::Null,
        experiment: experiment.into(),
        title: title.into(),
        columns: columns.iter().map(|c| c.to_string()).collect(),
        rows: rows
            .into_iter()
            .map(|(k, v)| vec![serde_json::json!(k), serde_json::json!(v)])
            .collect(),
        notes: Vec::new(),
        plot: None,
        more_plots: Vec::new(),
    }
}

/// `icount OP` at both iteration counts under callgrind: table `icount`.
fn run_icount(bin_dir: &Path, root: &Path, dir: &Path) -> Result<Vec<TableFile>> {
    let mut rows = Vec::new();
    for op in ICOUNT_OPS {
        let units = (ICOUNT_ITERS.1 - ICOUNT_ITERS.0) as f64;
        let per_op = callgrind_difference(dir, root, op, ICOUNT_ITERS, units, |iters, out| {
            let mut c = Command::new("valgrind");
            c.arg("--tool=callgrind")
                .arg(format!("--callgrind-out-file={}", out.display()))
                .arg(bin_dir.join("icount"))
                .args(["--op", op, "--iters", &iters.to_string()]);
            c
        })?;
        rows.push((*op, per_op));
    }
    Ok(vec![count_table(
        "icount",
        "instructions per operation (callgrind)",
        ["op", "instructions_per_op"],
        rows,
    )])
}

/// The demo's paths `demo-icount` counts, and the two call counts whose difference cancels
/// start-up (each after the demo's warm-up of 10 %).
const DEMO_ICOUNT_PATHS: &[&str] = &["shm-fast", "inproc-fast", "tonic-inproc"];
const DEMO_ICOUNT_CALLS: (u64, u64) = (1000, 3000);

/// One CPU this process may run on (the first of its affinity mask).
fn one_cpu() -> Result<usize> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .context("sched_getaffinity")?;
    (0..nix::sched::CpuSet::count())
        .find(|&c| set.is_set(c).unwrap_or(false))
        .context("no CPU in this process's affinity mask")
}

/// `demo --only PATH --calls N --no-pin` under callgrind, confined to one CPU with `taskset`
/// (util-linux): table `demo_icount`. On one CPU every wait of the ring paths is handed to the
/// peer (no spin: `rrpc_poller::Handoff::Auto`), so the count is what a call's work costs, both
/// ends together, and it repeats from run to run (a spin's count would depend on the
/// scheduler).
fn run_demo_icount(bin_dir: &Path, root: &Path, dir: &Path) -> Result<Vec<TableFile>> {
    let cpu = one_cpu()?.to_string();
    let mut rows = Vec::new();
    for path in DEMO_ICOUNT_PATHS {
        // The demo runs 10 % more calls than asked (its warm-up).
        let units = (DEMO_ICOUNT_CALLS.1 - DEMO_ICOUNT_CALLS.0) as f64 * 1.1;
        let per_call =
            callgrind_difference(dir, root, path, DEMO_ICOUNT_CALLS, units, |calls, out| {
                let mut c = Command::new("taskset");
                c.args(["-c", &cpu, "valgrind", "--tool=callgrind"])
                    .arg(format!("--callgrind-out-file={}", out.display()))
                    .arg(bin_dir.join("demo"))
                    .args(["--only", path, "--no-pin", "--calls", &calls.to_string()]);
                c
            })?;
        rows.push((*path, per_call));
    }
    Ok(vec![count_table(
        "demo_icount",
        "demo: instructions per call on one CPU (callgrind)",
        ["path", "instructions_per_call"],
        rows,
    )])
}

/// Runs one source into `dir` and returns its tables.
fn run_source(bin_dir: &Path, root: &Path, source: Source, dir: &Path) -> Result<Vec<TableFile>> {
    fs::create_dir_all(dir)?;
    if source == Source::Icount {
        return run_icount(bin_dir, root, dir);
    }
    if source == Source::DemoIcount {
        return run_demo_icount(bin_dir, root, dir);
    }
    let log = fs::File::create(dir.join("stderr.log"))?;
    let stdout_path = dir.join("stdout.txt");
    let stdout = fs::File::create(&stdout_path)?;
    let mut child = Command::new(bin_dir.join(source.bin()))
        .args(source.args(dir))
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", source.bin()))?;
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if crate::signals::interrupted() {
            kill_group(&mut child, Duration::from_secs(2));
            bail!("interrupted");
        }
        if t0.elapsed() > SOURCE_TIMEOUT {
            kill_group(&mut child, Duration::from_secs(2));
            bail!(
                "{} ran over {} s: killed",
                source.bin(),
                SOURCE_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !status.success() {
        let err = fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        bail!(
            "{} exited with {status}: {}",
            source.bin(),
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
    }
    match source {
        Source::Demo => Ok(vec![demo_table(&fs::read_to_string(&stdout_path)?)?]),
        _ => crate::bench::read_tables(dir),
    }
}

/// Entry point of `cargo xtask bench check`.
pub(crate) fn run(args: &BenchArgs) -> Result<()> {
    crate::signals::install();
    let root = workspace_root();
    let path = args
        .thresholds
        .clone()
        .unwrap_or_else(|| root.join(DEFAULT_THRESHOLDS));
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let th = Thresholds::parse(&text).with_context(|| format!("in {}", path.display()))?;
    let rounds = args.rounds.unwrap_or(DEFAULT_ROUNDS);
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let profile = args.profile.as_deref().unwrap_or(DEFAULT_PROFILE);
    let sources = th.sources();
    let target = crate::util::target_dir(&root)?;
    let bin_dir = target.join(crate::bench::profile_dir(profile));
    if args.no_build {
        for s in &sources {
            let exe = bin_dir.join(s.bin());
            if !exe.is_file() {
                bail!(
                    "--no-build: {} is not built (build it with `cargo build --profile {profile} -p {} --bin {}`)",
                    exe.display(),
                    s.package(),
                    s.bin()
                );
            }
        }
    } else {
        let mut a: Vec<String> = vec!["build".into(), "--profile".into(), profile.into()];
        for pkg in ["rrpc-bench", "examples"] {
            let mut bins: Vec<&str> = sources
                .iter()
                .filter(|s| s.package() == pkg)
                .map(|s| s.bin())
                .collect();
            bins.dedup();
            if bins.is_empty() {
                continue;
            }
            a.extend(["-p".into(), pkg.into()]);
            for b in bins {
                a.extend(["--bin".into(), b.into()]);
            }
        }
        let t = Instant::now();
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        // Never under `cargo xtask ci`'s clippy-driver (it turns MIR optimisations off).
        crate::util::run_unlinted("cargo", &a, Some(&root), &[])?;
        eprintln!("check: built in {:.1}s", t.elapsed().as_secs_f64());
    }
    let out = args.out.clone().unwrap_or_else(|| {
        root.join("target")
            .join("bench-results")
            .join(format!("{}-check", utc_timestamp()))
    });
    fs::create_dir_all(&out)?;
    let missing: BTreeMap<&str, Option<String>> = th
        .ratios
        .iter()
        .map(|r| (r.name.as_str(), r.requires.clone().filter(|p| !on_path(p))))
        .collect();

    // A source whose every ratio is skipped (its tool is missing) does not run.
    let sources: Vec<Source> = sources
        .into_iter()
        .filter(|s| {
            th.ratios
                .iter()
                .any(|r| r.source == *s && missing[r.name.as_str()].is_none())
        })
        .collect();
    // per_round[ratio][round]
    let mut per_round: Vec<Vec<Result<f64, String>>> = vec![Vec::new(); th.ratios.len()];
    let t_all = Instant::now();
    let all_rounds = sources.iter().map(|s| s.rounds(rounds)).max().unwrap_or(0);
    for round in 0..all_rounds {
        let mut tables: BTreeMap<Source, Result<Vec<TableFile>, String>> = BTreeMap::new();
        for s in round_order(&sources, round, rounds) {
            let dir = out.join(format!("round{}", round + 1)).join(s.dir_name());
            let t = Instant::now();
            let r = run_source(&bin_dir, &root, s, &dir).map_err(|e| format!("{e:#}"));
            eprintln!(
                "check: round {}/{all_rounds} {:<8} {} in {:.1}s",
                round + 1,
                s.dir_name(),
                if r.is_ok() { "ok" } else { "FAILED" },
                t.elapsed().as_secs_f64()
            );
            if let Err(e) = &r {
                eprintln!("check:   {e}");
            }
            tables.insert(s, r);
        }
        let mut line = format!("check: round {}:", round + 1);
        for (i, spec) in th.ratios.iter().enumerate() {
            if round >= spec.source.rounds(rounds) {
                continue;
            }
            let v = match tables
                .get(&spec.source)
                .unwrap_or(&Err("not run".to_owned()))
            {
                Err(e) => Err(format!("{} failed: {e}", spec.source.bin())),
                Ok(t) => spec.measure(t).map_err(|e| format!("{e:#}")),
            };
            match &v {
                Ok(x) => {
                    let _ = write!(line, " {}={x:.3}", spec.name);
                }
                Err(_) => {
                    let _ = write!(line, " {}=-", spec.name);
                }
            }
            per_round[i].push(v);
        }
        eprintln!("{line}");
    }
    let outcomes: Vec<Outcome> = th
        .ratios
        .iter()
        .zip(&per_round)
        .map(|(spec, v)| {
            let n = spec.source.rounds(rounds);
            judge(spec, v, n, missing[spec.name.as_str()].as_deref())
        })
        .collect();
    let md = table_markdown(&th.ratios, &outcomes);
    let mut report = format!(
        "# Performance regression guard\n\n{rounds} rounds in {:.0} s, profile `{profile}`, thresholds {}\n\n{md}",
        t_all.elapsed().as_secs_f64(),
        path.display()
    );
    for spec in &th.ratios {
        let _ = writeln!(report, "\n- {}: {}", spec.name, spec.reason);
    }
    fs::write(out.join("check.md"), &report)?;
    println!("{md}");
    eprintln!("check: results in {}", out.join("check.md").display());
    let skipped = failures(&th.ratios, &outcomes)?;
    for s in &skipped {
        eprintln!("check: {s}");
    }
    if args.strict && !skipped.is_empty() {
        bail!(
            "--strict: {} ratio(s) skipped: {}",
            skipped.len(),
            skipped.join("; ")
        );
    }
    eprintln!("check: every ratio within its threshold");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(better: Better, threshold: f64, tolerance: f64) -> RatioSpec {
        RatioSpec {
            name: "fast/tcp".into(),
            source: Source::Demo,
            value: "demo:p50_us[path=shm-fast]".into(),
            over: Some("demo:p50_us[path=tcp]".into()),
            better,
            threshold,
            tolerance,
            reason: "r".into(),
            requires: None,
            round_limit: None,
        }
    }

    /// A ratio with two modes (#54): the median of mostly good rounds passes, the round
    /// limit fails the bad one, and names it.
    #[test]
    fn a_round_limit_fails_one_bad_round_that_the_median_hides() {
        let mut s = spec(Better::Lower, 1.0, 0.1);
        let rounds = [Ok(0.6), Ok(0.62), Ok(3.5), Ok(0.61), Ok(0.6)];
        assert_eq!(judge(&s, &rounds, 5, None).verdict, Verdict::Pass);
        s.round_limit = Some(1.1);
        let o = judge(&s, &rounds, 5, None);
        assert_eq!(o.verdict, Verdict::Fail);
        let msg = failures(&[s.clone()], &[o]).unwrap_err().to_string();
        assert!(
            msg.contains("1 of 5 rounds higher than the round limit 1.100: 3.500"),
            "{msg}"
        );
        let good = [Ok(0.6), Ok(0.62), Ok(1.05), Ok(0.61), Ok(0.6)];
        assert_eq!(judge(&s, &good, 5, None).verdict, Verdict::Pass);
    }

    fn table() -> TableFile {
        demo_table(
            "human line\n{\"paths\":[{\"path\":\"tcp\",\"p50_us\":40.0,\"p99_us\":60},\
             {\"path\":\"shm-fast\",\"p50_us\":8,\"p99_us\":9}]}\n",
        )
        .unwrap()
    }

    #[test]
    fn committed_thresholds_parse() {
        let text = fs::read_to_string(workspace_root().join(DEFAULT_THRESHOLDS)).unwrap();
        let th = Thresholds::parse(&text).unwrap();
        assert!(th.ratios.len() >= 9, "{} ratios", th.ratios.len());
        assert_eq!(
            th.sources(),
            [
                Source::Demo,
                Source::Kv,
                Source::Connect,
                Source::Poller,
                Source::Icount,
                Source::DemoIcount
            ]
        );
    }

    #[test]
    fn thresholds_are_checked() {
        let ok = r#"
[[ratio]]
name = "a"
source = "demo"
value = "demo:p50_us[path=shm-fast]"
over = "demo:p50_us[path=tcp]"
better = "lower"
threshold = 0.3
tolerance = 0.1
reason = "measured 0.25"
"#;
        let th = Thresholds::parse(ok).unwrap();
        assert_eq!(th.ratios[0].better, Better::Lower);
        assert_eq!(th.ratios[0].requires, None);
        let bad = |from: &str, to: &str| Thresholds::parse(&ok.replace(from, to)).unwrap_err();
        assert!(format!("{:#}", bad("0.1", "1.5")).contains("tolerance"));
        assert!(format!("{:#}", bad("0.3", "-1")).contains("threshold"));
        assert!(format!("{:#}", bad("measured 0.25", " ")).contains("reason"));
        assert!(format!("{:#}", bad("\"lower\"", "\"less\"")).contains("parsing"));
        assert!(format!("{:#}", bad("source", "sauce")).contains("parsing"));
        assert!(format!("{:#}", bad("demo:p50_us[", "demo-p50_us[")).contains("selector"));
        let twice = format!("{ok}{ok}");
        assert!(format!("{:#}", Thresholds::parse(&twice).unwrap_err()).contains("twice"));
    }

    #[test]
    fn selectors_parse_and_find() {
        let s = Selector::parse("ycsb:kops[workload=C, backend=rf-rpc]").unwrap();
        assert_eq!(s.table, "ycsb");
        assert_eq!(s.column, "kops");
        assert_eq!(
            s.filters,
            [
                ("workload".to_owned(), "C".to_owned()),
                ("backend".to_owned(), "rf-rpc".to_owned())
            ]
        );
        assert_eq!(Selector::parse("t:c").unwrap().filters, []);
        assert!(Selector::parse("t:c[k]").is_err());
        assert!(Selector::parse("t:c[k=v").is_err());
        assert!(Selector::parse("c").is_err());

        let t = [table()];
        let sel = |s: &str| Selector::parse(s).unwrap().find(&t);
        assert_eq!(sel("demo:p50_us[path=shm-fast]").unwrap(), 8.0);
        assert_eq!(sel("demo:p99_us[path=tcp]").unwrap(), 60.0);
        // Numbers compare as their text.
        assert!(sel("demo:path[p50_us=8]").is_err(), "path is text");
        assert_eq!(sel("demo:p99_us[p50_us=8]").unwrap(), 9.0);
        assert!(format!("{:#}", sel("demo:p50_us[path=uds]").unwrap_err()).contains("no row"));
        assert!(format!("{:#}", sel("x:p50_us").unwrap_err()).contains("no table"));
        assert!(format!("{:#}", sel("demo:p51_us").unwrap_err()).contains("no column"));
    }

    #[test]
    fn ratio_of_two_cells_from_one_run() {
        let t = [table()];
        assert_eq!(spec(Better::Lower, 1.0, 0.1).measure(&t).unwrap(), 0.2);
        let mut s = spec(Better::Lower, 1.0, 0.1);
        s.over = None;
        assert_eq!(s.measure(&t).unwrap(), 8.0);
    }

    #[test]
    fn callgrind_totals() {
        let err = "==12== Events    : Ir\n==12== Collected : 1234567\n==12==\n==12== I   refs:      1,234,567\n";
        assert_eq!(callgrind_total(err).unwrap(), 1_234_567);
        assert!(callgrind_total("==12== I refs: 5").is_err());
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 100.0]), Some(5.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 100.0]), Some(3.0));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
    }

    #[test]
    fn direction_and_tolerance() {
        let lower = spec(Better::Lower, 0.3, 0.1);
        assert!((lower.limit() - 0.33).abs() < 1e-12);
        assert!(lower.passes(0.1));
        assert!(lower.passes(0.32));
        assert!(!lower.passes(0.34));
        let higher = spec(Better::Higher, 2.0, 0.25);
        assert_eq!(higher.limit(), 1.5);
        assert!(higher.passes(10.0));
        assert!(higher.passes(1.6));
        assert!(!higher.passes(1.4));
    }

    #[test]
    fn verdicts_use_the_median_and_name_the_ratio() {
        let s = spec(Better::Lower, 0.3, 0.1);
        // Two bad rounds out of five do not fail it: the median is robust to them.
        let ok: Vec<Result<f64, String>> = [0.2, 0.9, 0.25, 5.0, 0.21].map(Ok).to_vec();
        let o = judge(&s, &ok, 5, None);
        assert_eq!(o.verdict, Verdict::Pass);
        assert_eq!(o.median, Some(0.25));
        // Three bad rounds do.
        let bad: Vec<Result<f64, String>> = [0.2, 0.9, 0.5, 5.0, 0.21].map(Ok).to_vec();
        let o = judge(&s, &bad, 5, None);
        assert_eq!(o.verdict, Verdict::Fail);
        let err = failures(std::slice::from_ref(&s), std::slice::from_ref(&o)).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("fast/tcp"), "{msg}");
        assert!(msg.contains("median 0.500"), "{msg}");
        assert!(msg.contains("higher than the limit 0.330"), "{msg}");
        let md = table_markdown(std::slice::from_ref(&s), std::slice::from_ref(&o));
        assert!(
            md.contains("| fast/tcp | lower | 0.500 | 0.200-5.000 | 5 |"),
            "{md}"
        );
        assert!(md.contains("**FAIL**"), "{md}");
    }

    #[test]
    fn unmeasured_fails_and_missing_tool_skips() {
        let s = spec(Better::Higher, 3.0, 0.2);
        let rounds: Vec<Result<f64, String>> =
            vec![Ok(9.0), Err("kv failed".into()), Err("kv failed".into())];
        let o = judge(&s, &rounds, 3, None);
        assert!(
            matches!(&o.verdict, Verdict::NotMeasured(w) if w.contains("1 of 3") && w.contains("kv failed")),
            "{o:?}"
        );
        assert!(failures(std::slice::from_ref(&s), std::slice::from_ref(&o)).is_err());

        let o = judge(&s, &[], 3, Some("redis-server"));
        assert_eq!(
            o.verdict,
            Verdict::Skipped("skipped: redis-server not found".into())
        );
        let skipped = failures(std::slice::from_ref(&s), std::slice::from_ref(&o)).unwrap();
        assert_eq!(skipped, ["fast/tcp (skipped: redis-server not found)"]);
        let md = table_markdown(std::slice::from_ref(&s), std::slice::from_ref(&o));
        assert!(md.contains("skipped: redis-server not found"), "{md}");
    }

    #[test]
    fn rounds_alternate_the_order() {
        let s = [Source::Demo, Source::Kv, Source::Poller];
        assert_eq!(round_order(&s, 0, 5), s);
        assert_eq!(
            round_order(&s, 1, 5),
            [Source::Poller, Source::Kv, Source::Demo]
        );
        assert_eq!(round_order(&s, 2, 5), s);
    }

    #[test]
    fn instruction_counts_run_in_the_first_round_only_and_the_demo_in_twice_as_many() {
        let s = [Source::Demo, Source::Kv, Source::Icount, Source::DemoIcount];
        assert_eq!(round_order(&s, 0, 5), s);
        assert_eq!(round_order(&s, 1, 5), [Source::Kv, Source::Demo]);
        assert_eq!(round_order(&s, 4, 5), [Source::Demo, Source::Kv]);
        assert_eq!(round_order(&s, 5, 5), [Source::Demo]);
        assert_eq!(round_order(&s, 9, 5), [Source::Demo]);
        assert!(round_order(&s, 10, 5).is_empty());
        assert_eq!(Source::DemoIcount.rounds(5), 1);
        assert_eq!(Source::Kv.rounds(5), 5);
        assert_eq!(Source::Demo.rounds(5), 10);
        // One count is a verdict; none is not.
        let sp = spec(Better::Lower, 2.5, 0.05);
        assert_eq!(judge(&sp, &[Ok(2.43)], 1, None).verdict, Verdict::Pass);
        assert_eq!(judge(&sp, &[Ok(2.9)], 1, None).verdict, Verdict::Fail);
        assert!(matches!(
            judge(&sp, &[Err("valgrind failed".into())], 1, None).verdict,
            Verdict::NotMeasured(_)
        ));
    }
}
