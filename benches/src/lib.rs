//! Shared helpers for the rrpc benchmark suites.
//!
//! Every suite is a binary in this crate (`src/bin/<suite>.rs`) that `cargo xtask bench <suite>`
//! runs as
//!
//! ```text
//! cargo run --profile bench -p rrpc-bench --bin <suite> -- [--quick] --out DIR [--json]
//! ```
//!
//! A suite measures one or more *experiments*; each experiment is one [`Table`]. A suite collects
//! its tables in a [`Report`], which writes `DIR/<experiment>.csv` and `DIR/<experiment>.json`
//! and prints the Markdown tables (or, with `--json`, one JSON document per table) on stdout.
//! `xtask` reads the JSON files back to write `summary.md` and draw the plots, so the JSON file
//! is the contract between a suite and xtask (see [`report::TableFile`]).
//!
//! # Modules
//! - [`args`]: the command line every suite accepts ([`SuiteArgs`]).
//! - [`report`]: [`Table`], [`Value`], [`PlotSpec`], [`Report`] with CSV, Markdown and JSON writers.
//! - [`machine`]: the [`Machine`] header (CPU model, cores, memory, kernel, git revision, ...).
//! - [`stats`]: [`Latency`], an hdrhistogram in nanoseconds, and its [`Summary`] (p50/p99/...).
//! - [`cpu`]: CPU time and memory readers ([`CpuTimes`] from getrusage and `/proc/<pid>/stat`,
//!   [`rss_bytes`] and [`thread_count`] from `/proc/<pid>/status`).
//! - [`pin`]: thread pinning with `sched_setaffinity` and a [`ThreadPlan`] that says, in every
//!   output, how many threads each side uses and whether they oversubscribe the machine.
//! - [`ratio`]: [`Ratio`], the "ours / baseline" column every table carries.
//!
//! # Example
//!
//! ```no_run
//! use rrpc_bench::{Report, SuiteArgs, Table, Value, Latency, PlotSpec};
//! use clap::Parser;
//!
//! let args = SuiteArgs::parse();
//! let mut report = Report::new("demo", &args)?;
//! let mut lat = Latency::new();
//! for _ in 0..1000 {
//!     let t = std::time::Instant::now();
//!     std::hint::black_box(vec![0u8; 64]);
//!     lat.record(t.elapsed());
//! }
//! let s = lat.summary();
//! let mut table = Table::new("alloc", "Allocation latency", &["size_B", "p50_ns", "p99_ns"]);
//! table.push(vec![Value::from(64u64), Value::from(s.p50_ns), Value::from(s.p99_ns)]);
//! table.plot(PlotSpec::lines("size_B", &["p50_ns", "p99_ns"]).y_label("latency (ns)"));
//! report.add(table)?;
//! report.finish()?;
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod args;
pub mod connect;
pub mod cpu;
pub mod fabric;
pub mod kv;
pub mod machine;
pub mod pin;
pub mod ratio;
pub mod report;
pub mod rpc;
pub mod stats;

pub use args::SuiteArgs;
pub use cpu::{CpuTimes, rss_bytes, thread_count};
pub use machine::Machine;
pub use pin::{ThreadPlan, pin_current_thread, process_cpus};
pub use ratio::Ratio;
pub use report::{PlotSpec, Report, Table, Value};
pub use stats::{Latency, Summary};
