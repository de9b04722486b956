//! Plots of suite tables (SVG and PNG) with plotters, headless.
//!
//! Text is rendered with plotters' `ab_glyph` backend and the bundled DejaVu Sans
//! (`xtask/assets/`), so no fontconfig or system font is needed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Once;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
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
}

impl TableFile {
    pub(crate) fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
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

fn axis_label(v: f64, log: bool) -> String {
    let v = if log { 10f64.powf(v) } else { v };
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
    let title = if t.quick {
        format!("{} (--quick)", t.title)
    } else {
        t.title.clone()
    };
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let (lx, ly) = (spec.log_x, spec.log_y);
    chart
        .configure_mesh()
        .x_desc(spec.x_label.clone().unwrap_or_else(|| spec.x.clone()))
        .y_desc(spec.y_label.clone().unwrap_or_else(|| spec.ys[0].clone()))
        .x_label_formatter(&|v| axis_label(*v, lx))
        .y_label_formatter(&|v| axis_label(*v, ly))
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

/// Draws `t` (if it has a plot spec) to `<stem>.svg` and `<stem>.png`; returns whether it drew.
pub(crate) fn draw(t: &TableFile, stem: &Path) -> Result<bool> {
    let Some(spec) = &t.plot else {
        return Ok(false);
    };
    REGISTER.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            eprintln!("warning: bundled font rejected; plots will have no text");
        }
    });
    let series = series_of(t, spec)?;
    let size = (900, 560);
    let svg = stem.with_extension("svg");
    draw_on(
        SVGBackend::new(&svg, size).into_drawing_area(),
        t,
        spec,
        &series,
    )?;
    let png = stem.with_extension("png");
    draw_on(
        BitMapBackend::new(&png, size).into_drawing_area(),
        t,
        spec,
        &series,
    )?;
    Ok(true)
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
        assert!(draw(&table(), &stem).unwrap());
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
    fn labels() {
        assert_eq!(axis_label(2.0, true), "100");
        assert_eq!(axis_label(1_500_000.0, false), "1.500M");
        assert_eq!(axis_label(0.5, false), "0.50");
    }
}
