//! Plots of suite tables (SVG and PNG) with plotters, headless.
//!
//! Text is rendered with plotters' `ab_glyph` backend and the bundled DejaVu Sans
//! (`xtask/assets/`), so no fontconfig or system font is needed.
//!
//! Log axes are labelled at whole values chosen here ([`log_ticks`]): powers of two when the
//! data are powers of two (clients 1, 2, 4 … 128; sizes 64 B … 1 MiB), else 1-2-5 decades, and
//! written compactly ([`tick_label`]): `128`, `20k`, and for byte columns (`…_B`, `…_bytes`,
//! `…_kib`, `…_mib`, see [`tick_unit`]) binary suffixes `4K`, `64K`, `1M`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Once;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, LightPoints};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

/// Mirror of `rrpc_bench::report::PlotSpec` (xtask must not depend on the bench crate).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PlotSpec {
    pub(crate) x: String,
    pub(crate) ys: Vec<String>,
    pub(crate) series: Option<String>,
    pub(crate) x_label: Option<String>,
    pub(crate) y_label: Option<String>,
    #[serde(default)]
    pub(crate) log_x: bool,
    #[serde(default)]
    pub(crate) log_y: bool,
    /// Caption (the table's title otherwise).
    #[serde(default)]
    pub(crate) caption: Option<String>,
}

/// Mirror of `rrpc_bench::report::TableFile`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TableFile {
    pub(crate) suite: String,
    #[serde(default)]
    pub(crate) quick: bool,
    pub(crate) machine: serde_json::Value,
    pub(crate) experiment: String,
    pub(crate) title: String,
    pub(crate) columns: Vec<String>,
    pub(crate) rows: Vec<Vec<serde_json::Value>>,
    #[serde(default)]
    pub(crate) notes: Vec<String>,
    pub(crate) plot: Option<PlotSpec>,
    /// Further plots of the same rows, drawn to `<experiment>-2`, `-3`, ...
    #[serde(default)]
    pub(crate) more_plots: Vec<PlotSpec>,
}

impl TableFile {
    pub(crate) fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    /// Every plot of the table with its file stem: `<experiment>` for the main plot,
    /// `<experiment>-2`, `-3`, ... for the others.
    pub(crate) fn plots(&self) -> Vec<(String, &PlotSpec)> {
        let main = self.plot.iter().map(|p| (self.experiment.clone(), p));
        let more = self
            .more_plots
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("{}-{}", self.experiment, i + 2), p));
        main.chain(more).collect()
    }
}

/// One named line of points.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
}

fn cell_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Splits a table into series according to its plot spec (log axes already applied).
pub(crate) fn series_of(t: &TableFile, spec: &PlotSpec) -> Result<Vec<Series>> {
    let xi = t
        .column(&spec.x)
        .ok_or_else(|| anyhow!("no column {}", spec.x))?;
    let yis: Vec<(usize, &str)> = spec
        .ys
        .iter()
        .map(|y| {
            t.column(y)
                .map(|i| (i, y.as_str()))
                .ok_or_else(|| anyhow!("no column {y}"))
        })
        .collect::<Result<_>>()?;
    let si = match &spec.series {
        Some(s) => Some(t.column(s).ok_or_else(|| anyhow!("no column {s}"))?),
        None => None,
    };
    let tx = |v: f64| if spec.log_x { v.log10() } else { v };
    let ty = |v: f64| if spec.log_y { v.log10() } else { v };
    let mut map: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for row in &t.rows {
        let Some(x) = row[xi].as_f64() else { continue };
        for (yi, yname) in &yis {
            let Some(y) = row[*yi].as_f64() else { continue };
            let mut name = si.map(|i| cell_text(&row[i])).unwrap_or_default();
            if yis.len() > 1 || name.is_empty() {
                if !name.is_empty() {
                    name.push(' ');
                }
                name.push_str(yname);
            }
            if (spec.log_x && x <= 0.0) || (spec.log_y && y <= 0.0) {
                continue;
            }
            if !map.contains_key(&name) {
                order.push(name.clone());
            }
            map.entry(name).or_default().push((tx(x), ty(y)));
        }
    }
    Ok(order
        .into_iter()
        .map(|name| {
            let mut points = map.remove(&name).unwrap_or_default();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { name, points }
        })
        .collect())
}

/// Labels of a linear axis (plotters' own tick positions).
fn axis_label(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.3}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.3}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}K", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
    .trim_end_matches(".000")
    .to_owned()
}

/// How the tick values of a log axis are written, chosen from the column name by [`tick_unit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum TickUnit {
    /// Plain numbers: `1`, `128`, `5000`, `20k`, `1M` (decimal suffixes from 10 000 up).
    Plain,
    /// Sizes, written with binary suffixes: `64`, `4K`, `1M`. The factor turns one column unit
    /// into bytes.
    Bytes(f64),
}

/// The unit of a column, from its name: `…_B` (case-sensitive) or `…_bytes` are bytes, `…_kib`
/// and `…_mib` (any case) are KiB and MiB; anything else is a plain number.
pub(crate) fn tick_unit(column: &str) -> TickUnit {
    let lower = column.to_ascii_lowercase();
    if column.ends_with("_B") || lower.ends_with("_bytes") {
        TickUnit::Bytes(1.0)
    } else if lower.ends_with("_kib") {
        TickUnit::Bytes(1024.0)
    } else if lower.ends_with("_mib") {
        TickUnit::Bytes(1024.0 * 1024.0)
    } else {
        TickUnit::Plain
    }
}

/// Tick positions of a log axis, in data units (not logarithms).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogTicks {
    /// Labelled ticks (bold grid lines).
    pub(crate) major: Vec<f64>,
    /// Unlabelled light grid lines between them.
    pub(crate) minor: Vec<f64>,
}

/// Whether `v` is `2^k` for some integer `k` (up to rounding of a log round trip).
fn is_power_of_two(v: f64) -> bool {
    v > 0.0 && {
        let p = 2f64.powi(v.log2().round() as i32);
        ((v - p) / p).abs() < 1e-9
    }
}

/// Chooses at most `max` labelled ticks for a log axis spanning `[lo, hi]` (data units, `lo > 0`).
///
/// If every value in `data` is a power of two (client counts 1, 2, 4 …; sizes 64 … 1M) the ticks
/// are powers of two, thinned to every 2nd, 3rd … exponent (multiples of the step, so 4^k or
/// 8^k) when there are more than `max`; the skipped powers become light lines. Otherwise they are
/// 1-2-5 decades (1, 2, 5, 10, 20 …), falling back to 1, 10, 100 … (again thinned) on wide
/// ranges and to 1…9 × 10^k on narrow ones; a range too narrow for any of these gets its ends.
pub(crate) fn log_ticks(lo: f64, hi: f64, data: &[f64], max: usize) -> LogTicks {
    let max = max.max(2);
    let inside = |v: f64| v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9);
    if !data.is_empty() && data.iter().all(|&v| is_power_of_two(v)) {
        let exps: Vec<i32> = ((lo.log2().floor() as i32)..=(hi.log2().ceil() as i32))
            .filter(|&e| inside(2f64.powi(e)))
            .collect();
        if exps.len() >= 2 {
            let step = exps.len().div_ceil(max) as i32;
            let (major, minor): (Vec<i32>, Vec<i32>) =
                exps.iter().partition(|&&e| e.rem_euclid(step) == 0);
            let pow = |es: Vec<i32>| es.into_iter().map(|e| 2f64.powi(e)).collect();
            return LogTicks {
                major: pow(major),
                minor: pow(minor),
            };
        }
    }
    let (d0, d1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let decades = |mults: &[f64], step: i32| -> Vec<f64> {
        (d0..=d1)
            .filter(|d| d.rem_euclid(step) == 0)
            .flat_map(|d| mults.iter().map(move |m| m * 10f64.powi(d)))
            .filter(|&v| inside(v))
            .collect()
    };
    let all = decades(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], 1);
    let minor_of = |major: &[f64]| -> Vec<f64> {
        all.iter().copied().filter(|v| !major.contains(v)).collect()
    };
    let one_two_five = decades(&[1.0, 2.0, 5.0], 1);
    let major = if (2..=max).contains(&one_two_five.len()) {
        one_two_five
    } else if one_two_five.len() > max {
        let ones = decades(&[1.0], 1);
        decades(&[1.0], ones.len().div_ceil(max) as i32)
    } else if all.len() >= 2 {
        all.clone()
    } else {
        return LogTicks {
            major: vec![lo, hi],
            minor: Vec::new(),
        };
    };
    LogTicks {
        minor: minor_of(&major),
        major,
    }
}

/// Writes `v` with at most three significant digits, without trailing zeros.
fn short_number(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// The label of log-axis tick `v` (in data units): compact, with suffixes per `unit`.
pub(crate) fn tick_label(v: f64, unit: TickUnit) -> String {
    // Undo the rounding of the log10 / 10^x round trip the chart coordinates go through.
    let v = format!("{v:.11e}").parse::<f64>().unwrap_or(v);
    let (v, base, suffixes) = match unit {
        TickUnit::Plain if v.abs() < 1e4 => return short_number(v),
        TickUnit::Plain => (v, 1000.0, ["k", "M", "G", "T"]),
        TickUnit::Bytes(f) => (v * f, 1024.0, ["K", "M", "G", "T"]),
    };
    let mut scaled = v;
    let mut suffix = "";
    for s in suffixes {
        if scaled.abs() < base {
            break;
        }
        scaled /= base;
        suffix = s;
    }
    format!("{}{suffix}", short_number(scaled))
}

/// A chart axis over `f64` with tick positions chosen here, not by plotters (plotters'
/// `WithKeyPoints` over `RangedCoordf64` has no label formatter, so this small axis type).
struct TickedAxis {
    inner: RangedCoordf64,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl TickedAxis {
    /// An axis over `range` (chart coordinates: log10 of the data on a log axis); `data` are the
    /// plotted values in data units, which [`log_ticks`] looks at.
    fn new(range: std::ops::Range<f64>, log: bool, data: &[f64]) -> Self {
        let inner = RangedCoordf64::from(range.clone());
        let (bold, light) = if log {
            let t = log_ticks(10f64.powf(range.start), 10f64.powf(range.end), data, 10);
            let lg = |v: Vec<f64>| v.into_iter().map(f64::log10).collect();
            (lg(t.major), lg(t.minor))
        } else {
            (
                inner.key_points(10),
                inner.key_points(LightPoints::new(10, 100)),
            )
        };
        TickedAxis { inner, bold, light }
    }
}

impl Ranged for TickedAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }
}

fn draw_on<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    t: &TableFile,
    spec: &PlotSpec,
    series: &[Series],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plotting {}: {e:?}", t.experiment);
    area.fill(&WHITE).map_err(err)?;
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if (x1 - x0).abs() < f64::EPSILON {
        x1 = x0 + 1.0;
        x0 -= 1.0;
    }
    if !spec.log_y {
        y0 = y0.min(0.0);
    }
    let pad = ((y1 - y0) * 0.08).max(1e-9);
    y1 += pad;
    if spec.log_y {
        y0 -= pad;
    }
    let base = spec.caption.as_ref().unwrap_or(&t.title);
    let title = if t.quick {
        format!("{base} (--quick)")
    } else {
        base.clone()
    };
    let raw = |v: f64, log: bool| if log { 10f64.powf(v) } else { v };
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| raw(p.0, spec.log_x)))
        .collect();
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| raw(p.1, spec.log_y)))
        .collect();
    // Long titles (the suites name the paper's figure in them) shrink to fit the width.
    let title_px = (20.0 * 80.0 / title.chars().count().max(1) as f64).clamp(11.0, 20.0);
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", title_px))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            TickedAxis::new(x0..x1, spec.log_x, &xs),
            TickedAxis::new(y0..y1, spec.log_y, &ys),
        )
        .map_err(err)?;
    let label = |v: f64, log: bool, unit: TickUnit| {
        if log {
            tick_label(10f64.powf(v), unit)
        } else {
            axis_label(v)
        }
    };
    let (lx, ly, ux) = (spec.log_x, spec.log_y, tick_unit(&spec.x));
    chart
        .configure_mesh()
        .x_desc(spec.x_label.clone().unwrap_or_else(|| spec.x.clone()))
        .y_desc(spec.y_label.clone().unwrap_or_else(|| spec.ys[0].clone()))
        .x_label_formatter(&|v| label(*v, lx, ux))
        .y_label_formatter(&|v| label(*v, ly, TickUnit::Plain))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    area.present().map_err(err)?;
    Ok(())
}

/// Draws every plot of `t` ([`TableFile::plots`]) into `dir` as `<stem>.svg` and
/// `<stem>.png`; returns the SVG paths drawn.
pub(crate) fn draw(t: &TableFile, dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    REGISTER.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            eprintln!("warning: bundled font rejected; plots will have no text");
        }
    });
    let mut drawn = Vec::new();
    for (stem, spec) in t.plots() {
        let series = series_of(t, spec)?;
        let size = (900, 560);
        let svg = dir.join(format!("{stem}.svg"));
        draw_on(
            SVGBackend::new(&svg, size).into_drawing_area(),
            t,
            spec,
            &series,
        )?;
        let png = dir.join(format!("{stem}.png"));
        draw_on(
            BitMapBackend::new(&png, size).into_drawing_area(),
            t,
            spec,
            &series,
        )?;
        drawn.push(svg);
    }
    Ok(drawn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn table() -> TableFile {
        serde_json::from_value(json!({
            "suite": "rpc", "quick": true, "machine": {},
            "experiment": "t", "title": "Throughput vs clients",
            "columns": ["transport", "clients", "krps"],
            "rows": [["tcp", 1, 10.0], ["tcp", 4, 30.5], ["uds", 1, 20], ["uds", 4, null]],
            "notes": [],
            "plot": {"x": "clients", "ys": ["krps"], "series": "transport",
                     "x_label": null, "y_label": null, "log_x": true, "log_y": false}
        }))
        .unwrap()
    }

    #[test]
    fn splits_series_and_skips_empty_cells() {
        let t = table();
        let s = series_of(&t, t.plot.as_ref().unwrap()).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "tcp");
        assert_eq!(s[0].points, vec![(0.0, 10.0), (4f64.log10(), 30.5)]);
        assert_eq!(s[1].name, "uds");
        assert_eq!(s[1].points, vec![(0.0, 20.0)]);
    }

    #[test]
    fn unknown_column_is_an_error() {
        let t = table();
        let mut spec = t.plot.clone().unwrap();
        spec.ys = vec!["nope".into()];
        assert!(series_of(&t, &spec).is_err());
    }

    #[test]
    fn draws_svg_and_png_with_text() {
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stem = dir.join("t");
        assert_eq!(
            draw(&table(), &dir).unwrap(),
            vec![stem.with_extension("svg")]
        );
        let svg = std::fs::read_to_string(stem.with_extension("svg")).unwrap();
        assert!(
            svg.contains("Throughput vs clients"),
            "title text is in the SVG"
        );
        let png = std::fs::read(stem.with_extension("png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn extra_plots_get_their_own_files_and_captions() {
        let dir = std::env::temp_dir().join(format!("xtask-plot2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut t = table();
        let mut extra = t.plot.clone().unwrap();
        extra.caption = Some("Second panel".into());
        t.more_plots.push(extra);
        let drawn = draw(&t, &dir).unwrap();
        assert_eq!(drawn, vec![dir.join("t.svg"), dir.join("t-2.svg")]);
        let svg = std::fs::read_to_string(dir.join("t-2.svg")).unwrap();
        assert!(svg.contains("Second panel"), "extra plot uses its caption");
        assert!(dir.join("t-2.png").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn linear_labels() {
        assert_eq!(axis_label(1_500_000.0), "1.500M");
        assert_eq!(axis_label(0.5), "0.50");
    }

    #[test]
    fn units_from_column_names() {
        assert_eq!(tick_unit("size_B"), TickUnit::Bytes(1.0));
        assert_eq!(tick_unit("msg_bytes"), TickUnit::Bytes(1.0));
        assert_eq!(tick_unit("buf_KiB"), TickUnit::Bytes(1024.0));
        assert_eq!(tick_unit("ring_mib"), TickUnit::Bytes(1048576.0));
        assert_eq!(tick_unit("clients"), TickUnit::Plain);
        assert_eq!(tick_unit("rtt_b"), TickUnit::Plain, "`_b` is not bytes");
    }

    #[test]
    fn tick_labels_are_compact() {
        let plain = |v| tick_label(v, TickUnit::Plain);
        let bytes = |v| tick_label(v, TickUnit::Bytes(1.0));
        assert_eq!(plain(1.0), "1");
        assert_eq!(plain(128.0), "128");
        assert_eq!(plain(1024.0), "1024");
        assert_eq!(plain(20_000.0), "20k");
        assert_eq!(plain(16_384.0), "16.4k");
        assert_eq!(plain(2e6), "2M");
        assert_eq!(plain(0.5), "0.5");
        assert_eq!(plain(0.125), "0.125");
        assert_eq!(bytes(64.0), "64");
        assert_eq!(bytes(4096.0), "4K");
        assert_eq!(bytes(65536.0), "64K");
        assert_eq!(bytes(1_048_576.0), "1M");
        assert_eq!(bytes(1536.0), "1.5K");
        assert_eq!(bytes(1000.0), "1000");
        assert_eq!(tick_label(64.0, TickUnit::Bytes(1024.0)), "64K");
        // What the chart hands back after a log10 / 10^x round trip.
        assert_eq!(plain(10f64.powf(8f64.log10())), "8");
        assert_eq!(bytes(10f64.powf(1_048_576f64.log10())), "1M");
    }

    #[test]
    fn powers_of_two_data_get_powers_of_two_ticks() {
        let clients = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
        let t = log_ticks(1.0, 128.0, &clients, 10);
        assert_eq!(t.major, clients);
        assert!(t.minor.is_empty());
        // 64 B .. 1 MiB is 15 powers: every second one (even exponents) is labelled.
        let t = log_ticks(64.0, 1_048_576.0, &[64.0, 4096.0, 1_048_576.0], 10);
        let labels: Vec<String> = t
            .major
            .iter()
            .map(|&v| tick_label(v, TickUnit::Bytes(1.0)))
            .collect();
        assert_eq!(
            labels,
            ["64", "256", "1K", "4K", "16K", "64K", "256K", "1M"]
        );
        assert_eq!(
            t.minor,
            [128.0, 512.0, 2048.0, 8192.0, 32768.0, 131072.0, 524288.0]
        );
        // Sparse data (1 and 4) still get the powers in between.
        assert_eq!(log_ticks(1.0, 4.0, &[1.0, 4.0], 10).major, [1.0, 2.0, 4.0]);
    }

    #[test]
    fn other_data_get_one_two_five_decades() {
        let t = log_ticks(1.0, 300.0, &[1.0, 10.0, 300.0], 10);
        assert_eq!(t.major, [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0]);
        assert!(t.minor.contains(&3.0) && t.minor.contains(&300.0));
        assert!(!t.minor.contains(&2.0));
        // Eight decades: 1-2-5 would be 24 ticks, so only the powers of ten.
        let t = log_ticks(1.0, 1e8, &[1.0, 3.0, 1e8], 10);
        assert_eq!(t.major.len(), 9);
        assert_eq!(t.major[1], 10.0);
        // Eighteen decades: every second power of ten.
        let t = log_ticks(1.0, 1e18, &[1.0, 3.0, 1e18], 10);
        assert_eq!(t.major.len(), 10);
        assert_eq!(t.major[1], 100.0);
        // Narrow: 3..8 has only 5 from 1-2-5, so the integers.
        assert_eq!(
            log_ticks(3.0, 8.0, &[3.0, 8.0], 10).major,
            [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
        );
        // Too narrow for any: the ends.
        assert_eq!(log_ticks(3.2, 3.7, &[3.3], 10).major, [3.2, 3.7]);
    }

    #[test]
    fn ticks_stay_inside_the_range() {
        for (lo, hi, data) in [
            (1.0, 128.0, vec![1.0, 128.0]),
            (0.1, 10.0, vec![1.0]),
            (7.0, 9e5, vec![7.0, 9e5]),
            (0.013, 0.9, vec![0.013, 0.9]),
        ] {
            let t = log_ticks(lo, hi, &data, 10);
            assert!(t.major.len() >= 2 && t.major.len() <= 10, "{t:?}");
            for v in t.major.iter().chain(&t.minor) {
                assert!(
                    *v >= lo * 0.999 && *v <= hi * 1.001,
                    "{v} outside {lo}..{hi}"
                );
            }
        }
    }
}
