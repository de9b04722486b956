//! Tables and reports: CSV, Markdown and JSON writers.
//!
//! One [`Table`] per experiment. [`Report::add`] writes, in the output directory,
//! `<experiment>.csv` (header row + rows), `<experiment>.md` (the Markdown table with its title,
//! machine line and notes) and `<experiment>.json` (a [`TableFile`]), then prints the Markdown
//! (or the JSON with `--json`) on stdout. `cargo xtask bench` concatenates the `.md` files into
//! `summary.md` and draws every table that carries a [`PlotSpec`].

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::{Machine, Ratio, SuiteArgs};

/// One cell of a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    /// An integer (counts, sizes, nanoseconds).
    Int(i64),
    /// A float, printed with 2 decimals in Markdown (or 3 significant digits below 1).
    Float(f64),
    /// Free text (series names, units, modes).
    Text(String),
    /// An empty cell (`null` in JSON, `-` in Markdown, empty in CSV).
    Empty,
}

impl Value {
    /// The numeric value, if the cell is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    fn markdown(&self) -> String {
        match self {
            Value::Int(i) => i.to_string(),
            Value::Float(f) if f.abs() >= 1.0 || *f == 0.0 => format!("{f:.2}"),
            Value::Float(f) => format!("{f:.3}"),
            Value::Text(s) => s.replace('|', "\\|"),
            Value::Empty => "-".to_owned(),
        }
    }

    fn csv(&self) -> String {
        match self {
            Value::Int(i) => i.to_string(),
            Value::Float(f) => format!("{f}"),
            Value::Text(s) if s.contains([',', '"', '\n']) => {
                format!("\"{}\"", s.replace('"', "\"\""))
            }
            Value::Text(s) => s.clone(),
            Value::Empty => String::new(),
        }
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::from(v as u64)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(i64::from(v))
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        if v.is_finite() {
            Value::Float(v)
        } else {
            Value::Empty
        }
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<Ratio> for Value {
    /// A ratio is stored as a float (`Empty` when undefined); name its column `*_x_*` or
    /// `ratio*` so readers know it is a ratio.
    fn from(r: Ratio) -> Self {
        r.get().map_or(Value::Empty, Value::Float)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Empty, Into::into)
    }
}

/// How xtask should plot a table (shaped like the paper's figures).
///
/// Rows are grouped into series by the `series` column (one line per distinct value, e.g. one
/// per transport), or, without it, every column in `ys` is its own line. `x` and the `ys` must
/// be numeric columns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlotSpec {
    /// Column for the x axis (clients, message size, polling threads, `bp_timeout`, ...).
    pub x: String,
    /// Columns for the y axis.
    pub ys: Vec<String>,
    /// Column whose distinct values split the rows into series.
    pub series: Option<String>,
    /// X axis label (defaults to `x`).
    pub x_label: Option<String>,
    /// Y axis label (defaults to the first of `ys`).
    pub y_label: Option<String>,
    /// Logarithmic x axis (message sizes, client counts in powers of two).
    pub log_x: bool,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// Caption of this plot (defaults to the table's title); for a table's extra plots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caption: Option<String>,
}

impl PlotSpec {
    /// A line plot of `ys` against `x`.
    pub fn lines(x: &str, ys: &[&str]) -> Self {
        PlotSpec {
            x: x.to_owned(),
            ys: ys.iter().map(|s| (*s).to_owned()).collect(),
            series: None,
            x_label: None,
            y_label: None,
            log_x: false,
            log_y: false,
            caption: None,
        }
    }
    /// Splits rows into one line per distinct value of `column`.
    pub fn series(mut self, column: &str) -> Self {
        self.series = Some(column.to_owned());
        self
    }
    /// Sets the x axis label.
    pub fn x_label(mut self, label: &str) -> Self {
        self.x_label = Some(label.to_owned());
        self
    }
    /// Sets the y axis label.
    pub fn y_label(mut self, label: &str) -> Self {
        self.y_label = Some(label.to_owned());
        self
    }
    /// Logarithmic x axis.
    pub fn log_x(mut self) -> Self {
        self.log_x = true;
        self
    }
    /// Sets the caption (the table's title otherwise).
    pub fn caption(mut self, caption: &str) -> Self {
        self.caption = Some(caption.to_owned());
        self
    }
    /// Logarithmic y axis.
    pub fn log_y(mut self) -> Self {
        self.log_y = true;
        self
    }
}

/// One experiment's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// File stem: `[a-z0-9_-]+`, unique within a suite (e.g. `small_rpc_throughput`).
    pub experiment: String,
    /// Human title (e.g. "Small-RPC throughput vs clients (Fig. 10)").
    pub title: String,
    /// Column names; put the unit in the name (`p50_us`, `mops`, `gib_s`).
    pub columns: Vec<String>,
    /// Rows, each as long as `columns`.
    pub rows: Vec<Vec<Value>>,
    /// Free-form notes printed under the table (threads and pinning, what the baseline is...).
    pub notes: Vec<String>,
    /// How to plot it, if at all.
    pub plot: Option<PlotSpec>,
    /// Further plots of the same rows (e.g. memory beside CPU, as the paper's (a)/(b)
    /// panels), drawn to `<experiment>-2`, `<experiment>-3`, ...
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_plots: Vec<PlotSpec>,
}

impl Table {
    /// An empty table.
    pub fn new(experiment: &str, title: &str, columns: &[&str]) -> Self {
        Table {
            experiment: experiment.to_owned(),
            title: title.to_owned(),
            columns: columns.iter().map(|s| (*s).to_owned()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
            plot: None,
            more_plots: Vec::new(),
        }
    }

    /// Appends a row.
    ///
    /// # Panics
    /// If the row's length differs from the number of columns (a bug in the suite).
    pub fn push(&mut self, row: Vec<Value>) {
        assert_eq!(
            row.len(),
            self.columns.len(),
            "row length must match columns of {}",
            self.experiment
        );
        self.rows.push(row);
    }

    /// Adds a note line (printed under the table).
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Attaches a plot description.
    pub fn plot(&mut self, spec: PlotSpec) {
        self.plot = Some(spec);
    }

    /// Adds a further plot of the same rows (drawn after [`Table::plot`]'s).
    pub fn also_plot(&mut self, spec: PlotSpec) {
        self.more_plots.push(spec);
    }

    /// Index of a column by name.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    /// The table as CSV (header row first, `\n` line ends).
    pub fn to_csv(&self) -> String {
        let mut out = self.columns.join(",");
        out.push('\n');
        for row in &self.rows {
            let cells: Vec<String> = row.iter().map(Value::csv).collect();
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }

    /// The table as Markdown: a `###` title, the table, then the notes as a list.
    pub fn to_markdown(&self) -> String {
        let mut out = format!("### {}\n\n", self.title);
        let _ = writeln!(out, "| {} |", self.columns.join(" | "));
        let _ = writeln!(
            out,
            "|{}|",
            self.columns
                .iter()
                .map(|_| " ---: ")
                .collect::<Vec<_>>()
                .join("|")
        );
        for row in &self.rows {
            let cells: Vec<String> = row.iter().map(Value::markdown).collect();
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                let _ = writeln!(out, "- {n}");
            }
        }
        out
    }
}

/// The JSON document written to `<experiment>.json`; xtask reads it back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableFile {
    /// Suite name (`fabric`, `rpc`, ...).
    pub suite: String,
    /// Whether this was a `--quick` smoke run (numbers mean nothing then).
    pub quick: bool,
    /// The machine the numbers come from.
    pub machine: Machine,
    /// The table.
    #[serde(flatten)]
    pub table: Table,
}

/// A suite's output: an output directory, the machine header and the tables written so far.
#[derive(Debug)]
pub struct Report {
    suite: String,
    out: PathBuf,
    quick: bool,
    json: bool,
    machine: Machine,
    written: Vec<String>,
}

impl Report {
    /// Creates the output directory (`args.out` or `target/bench-results/<time>-<suite>/`) and
    /// collects the machine header (printed with the first table, after the suite set
    /// `provider` and `pinning`).
    ///
    /// # Errors
    /// If the directory cannot be created.
    pub fn new(suite: &str, args: &SuiteArgs) -> Result<Self> {
        let out = args.out.clone().unwrap_or_else(|| default_out_dir(suite));
        fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let machine = Machine::collect();
        if !args.json {
            println!(
                "## {suite}{}\n",
                if args.quick {
                    " (--quick smoke run)"
                } else {
                    ""
                }
            );
            println!("{}\n", machine.markdown());
        }
        Ok(Report {
            suite: suite.to_owned(),
            out,
            quick: args.quick,
            json: args.json,
            machine,
            written: Vec::new(),
        })
    }

    /// The output directory.
    pub fn out_dir(&self) -> &Path {
        &self.out
    }

    /// The machine header.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// Mutable machine header (suites set `provider` and `pinning`).
    pub fn machine_mut(&mut self) -> &mut Machine {
        &mut self.machine
    }

    /// Writes `<experiment>.csv`, `.md` and `.json` and prints the table.
    ///
    /// # Errors
    /// If a file cannot be written.
    pub fn add(&mut self, table: Table) -> Result<()> {
        let stem = table.experiment.clone();
        let write = |ext: &str, body: &str| -> Result<()> {
            let path = self.out.join(format!("{stem}.{ext}"));
            fs::write(&path, body).with_context(|| format!("writing {}", path.display()))
        };
        write("csv", &table.to_csv())?;
        let md = table.to_markdown();
        write("md", &md)?;
        let file = TableFile {
            suite: self.suite.clone(),
            quick: self.quick,
            machine: self.machine.clone(),
            table,
        };
        let json = serde_json::to_string_pretty(&file)?;
        write("json", &json)?;
        if self.json {
            println!("{}", serde_json::to_string(&file)?);
        } else {
            if self.written.is_empty() {
                let quick = if self.quick {
                    " (--quick smoke run)"
                } else {
                    ""
                };
                println!("## {}{quick}\n\n{}\n", self.suite, self.machine.markdown());
            }
            println!("{md}");
        }
        self.written.push(file.table.experiment);
        Ok(())
    }

    /// Prints where the results went (on stderr, so stdout stays tables only).
    ///
    /// # Errors
    /// Never at present; kept fallible for future writers.
    pub fn finish(self) -> Result<()> {
        eprintln!(
            "{}: wrote {} experiment(s) to {}",
            self.suite,
            self.written.len(),
            self.out.display()
        );
        Ok(())
    }
}

/// `<workspace>/target/bench-results/<YYYYmmdd-HHMMSS>-<suite>/` (UTC).
pub fn default_out_dir(suite: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.join("target")
        .join("bench-results")
        .join(format!("{}-{suite}", utc_timestamp()))
}

/// The current UTC time as `YYYYmmdd-HHMMSS`.
pub fn utc_timestamp() -> String {
    chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new("x", "X vs y", &["clients", "mops", "name"]);
        t.push(vec![1u64.into(), 0.5.into(), "a,b".into()]);
        t.push(vec![2u64.into(), Value::Empty, "c|d".into()]);
        t.note("1 thread");
        t
    }

    #[test]
    fn csv_quotes_and_empties() {
        assert_eq!(
            sample().to_csv(),
            "clients,mops,name\n1,0.5,\"a,b\"\n2,,c|d\n"
        );
    }

    #[test]
    fn markdown_escapes_pipes_and_lists_notes() {
        let md = sample().to_markdown();
        assert!(md.starts_with("### X vs y\n\n| clients | mops | name |\n"));
        assert!(md.contains("| 1 | 0.500 | a,b |"));
        assert!(md.contains("| 2 | - | c\\|d |"));
        assert!(md.ends_with("- 1 thread\n"));
    }

    #[test]
    fn json_round_trips() {
        let mut t = sample();
        t.plot(PlotSpec::lines("clients", &["mops"]).series("name").log_x());
        let s = serde_json::to_string(&t).unwrap();
        let back: Table = serde_json::from_str(&s).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    #[should_panic(expected = "row length")]
    fn short_row_is_a_bug() {
        sample().push(vec![1u64.into()]);
    }

    #[test]
    fn timestamp_shape() {
        let ts = utc_timestamp();
        assert_eq!(ts.len(), 15, "{ts}");
        assert_eq!(&ts[8..9], "-");
        assert!(ts.starts_with("20"));
    }
}
