//! The command line every suite binary accepts.

use std::path::PathBuf;
use std::time::Duration;

/// Common options of every suite binary (`--quick`, `--out DIR`, `--json`).
///
/// Suites embed it with `#[command(flatten)]` when they have options of their own, or parse it
/// directly with [`clap::Parser::parse`].
#[derive(clap::Parser, Debug, Clone, Default)]
pub struct SuiteArgs {
    /// Short smoke run (seconds): proves the suite runs, measures nothing meaningful.
    #[arg(long)]
    pub quick: bool,
    /// Directory for `<experiment>.csv` and `<experiment>.json` (created if missing).
    /// Default: `target/bench-results/<unix-time>-<suite>/`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print one JSON document per table on stdout instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// Do not draw progress bars (set by xtask when it draws its own).
    #[arg(long)]
    pub no_progress: bool,
}

impl SuiteArgs {
    /// How long one measurement point runs: `quick` if `--quick`, else `full`.
    pub fn duration(&self, quick: Duration, full: Duration) -> Duration {
        if self.quick { quick } else { full }
    }

    /// Picks `quick` or `full` (for iteration counts, client lists, sizes, ...).
    pub fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick { quick } else { full }
    }

    /// A progress bar of `len` steps on stderr, hidden with `--no-progress`, `--json` or when
    /// stderr is not a terminal (indicatif hides it itself then).
    pub fn progress(&self, len: u64, what: &str) -> indicatif::ProgressBar {
        if self.no_progress || self.json {
            return indicatif::ProgressBar::hidden();
        }
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix:>10} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            )
            .expect("static template"),
        );
        bar.set_prefix(what.to_owned());
        bar
    }
}
