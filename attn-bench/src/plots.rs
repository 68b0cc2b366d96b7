//! PNG plots of a results file (plotters, log-log axes).
//!
//! A slice is one (dtype, D, causal) combination. For every slice: time vs N and TFLOP/s vs N, one
//! panel per family, one line per (implementation, pass). For the main slice (see [`main_slice`])
//! also peak memory vs N and the Taylor-vs-softmax crossover (time vs N of softmax, taylor1 and
//! taylor2 side by side, one panel per pass). `<stem>.png` is the main slice's time plot.
//!
//! Text is drawn with DejaVu Sans compiled into the binary (plotters' ab_glyph backend), so plotting
//! needs no fontconfig or freetype on the machine that runs the benchmark.

use crate::error::BenchError;
use crate::grid::FamilyId;
use crate::schema::{BenchFile, Row};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The family name every text style uses; [`register_font`] binds it to the compiled-in face.
const FONT: &str = "sans-serif";

/// Register DejaVu Sans under [`FONT`] once per process. Anything in the process that draws text with
/// plotters (these plots, criterion's reports) needs it first: plotters is built with ab_glyph here,
/// which knows no system fonts.
pub fn register_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| "the compiled-in DejaVu Sans face did not parse".to_string())
        })
        .clone()
}

/// One (dtype, D, causal) combination.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Slice {
    pub dtype: String,
    pub head_dim: usize,
    pub causal: bool,
}

impl Slice {
    fn of(r: &Row) -> Self {
        Slice {
            dtype: r.dtype.clone(),
            head_dim: r.head_dim,
            causal: r.causal,
        }
    }
    fn contains(&self, r: &Row) -> bool {
        r.dtype == self.dtype && r.head_dim == self.head_dim && r.causal == self.causal
    }
    /// `bf16-d128-causal`, for file names.
    pub fn tag(&self) -> String {
        format!(
            "{}-d{}-{}",
            self.dtype,
            self.head_dim,
            if self.causal { "causal" } else { "full" }
        )
    }
    fn title(&self) -> String {
        format!(
            "{} D={}{}",
            self.dtype,
            self.head_dim,
            if self.causal { " causal" } else { "" }
        )
    }
}

/// The slice the headline plots show: the most common dtype, non-causal when measured, the
/// smallest head dim.
pub fn main_slice(file: &BenchFile) -> Option<Slice> {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &file.rows {
        *count.entry(r.dtype.as_str()).or_default() += 1;
    }
    let dtype = count.into_iter().max_by_key(|(_, c)| *c)?.0;
    file.rows
        .iter()
        .filter(|r| r.dtype == dtype)
        .map(Slice::of)
        .min_by_key(|s| (s.causal, s.head_dim))
}

struct Series {
    label: String,
    points: Vec<(f64, f64)>,
}

/// Lines of `rows` grouped by `key`, each sorted by N, with `y` of each row (rows without a
/// positive y are left out).
fn series(rows: &[&Row], key: impl Fn(&Row) -> String, y: impl Fn(&Row) -> Option<f64>) -> Vec<Series> {
    let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows {
        if let Some(v) = y(r).filter(|v| v.is_finite() && *v > 0.0) {
            by.entry(key(r)).or_default().push((r.seq_q as f64, v));
        }
    }
    by.into_iter()
        .map(|(label, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { label, points }
        })
        .collect()
}

type PlotResult<T> = Result<T, String>;

/// Line colours (Tableau 10), distinct on white.
const PALETTE: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (255, 127, 14),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

fn panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    title: &str,
    y_desc: &str,
    lines: &[Series],
) -> PlotResult<()> {
    let pts = lines.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, 0.0f64, f64::INFINITY, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !(x0.is_finite() && y0.is_finite()) {
        area.titled(&format!("{title}: no data"), (FONT, 16))
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (x0 / 1.2..x1 * 1.2).log_scale().base(2.0),
            (y0 / 1.5..y1 * 1.5).log_scale(),
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("N")
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{}", x.round() as u64))
        .y_label_formatter(&|y| crate::report::sig3(*y))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in lines.iter().enumerate() {
        let (r, g, b) = PALETTE[i % PALETTE.len()];
        let color = RGBColor(r, g, b).to_rgba();
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Draw `panels` (title, lines) on a grid into `path`.
fn figure(
    path: &Path,
    title: &str,
    y_desc: &str,
    panels: &[(String, Vec<Series>)],
) -> Result<(), BenchError> {
    let plot_err = |reason: String| BenchError::Plot {
        path: path.to_path_buf(),
        reason,
    };
    let cols = panels.len().clamp(1, 3);
    let rows = panels.len().div_ceil(cols).max(1);
    let size = (560 * cols as u32, 440 * rows as u32 + 40);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(e.to_string()))?;
    let body = root
        .titled(title, (FONT, 24))
        .map_err(|e| plot_err(e.to_string()))?;
    for (area, (t, lines)) in body.split_evenly((rows, cols)).iter().zip(panels) {
        panel(area, t, y_desc, lines).map_err(plot_err)?;
    }
    root.present().map_err(|e| plot_err(e.to_string()))
}

fn families_in(rows: &[&Row]) -> Vec<String> {
    let set: BTreeSet<&str> = rows.iter().map(|r| r.family.as_str()).collect();
    let mut v: Vec<String> = set.into_iter().map(String::from).collect();
    v.sort_by_key(|f| {
        FamilyId::ALL
            .iter()
            .position(|x| x.label() == f)
            .unwrap_or(usize::MAX)
    });
    v
}

fn impl_pass(r: &Row) -> String {
    format!("{} {}", r.implementation, r.pass)
}

/// Write every plot for `file` under `dir`, named from `stem`; returns the files written.
pub fn write_plots(file: &BenchFile, dir: &Path, stem: &str) -> Result<Vec<PathBuf>, BenchError> {
    let mut written = Vec::new();
    let Some(main) = main_slice(file) else {
        return Ok(written);
    };
    register_font().map_err(|reason| BenchError::Plot {
        path: dir.to_path_buf(),
        reason,
    })?;
    let slices: BTreeSet<Slice> = file.rows.iter().map(Slice::of).collect();
    let title = |what: &str, s: &Slice| format!("{what} — {} — {}", s.title(), file.device);
    for slice in &slices {
        let rows: Vec<&Row> = file.rows.iter().filter(|r| slice.contains(r)).collect();
        let per_family = |y: &dyn Fn(&Row) -> Option<f64>| -> Vec<(String, Vec<Series>)> {
            families_in(&rows)
                .into_iter()
                .map(|f| {
                    let fr: Vec<&Row> = rows.iter().copied().filter(|r| r.family == f).collect();
                    (f, series(&fr, impl_pass, y))
                })
                .collect()
        };
        let time = per_family(&|r| Some(r.ms_median));
        let rate = per_family(&|r| Some(r.tflops));
        let tag = slice.tag();
        for (suffix, what, y_desc, panels) in [
            ("time", "median time vs N", "ms", &time),
            ("tflops", "TFLOP/s vs N", "TFLOP/s", &rate),
        ] {
            let path = dir.join(format!("{stem}-{tag}-{suffix}.png"));
            figure(&path, &title(what, slice), y_desc, panels)?;
            written.push(path);
        }
        if *slice == main {
            let path = dir.join(format!("{stem}.png"));
            figure(&path, &title("median time vs N", slice), "ms", &time)?;
            written.insert(0, path);
            let memory = per_family(&|r| r.peak_mib);
            if memory.iter().any(|(_, s)| !s.is_empty()) {
                let path = dir.join(format!("{stem}-memory.png"));
                figure(&path, &title("peak memory vs N", slice), "MiB", &memory)?;
                written.push(path);
            }
            let passes: BTreeSet<&str> = rows.iter().map(|r| r.pass.as_str()).collect();
            let cross: Vec<(String, Vec<Series>)> = passes
                .into_iter()
                .map(|p| {
                    let pr: Vec<&Row> = rows
                        .iter()
                        .copied()
                        .filter(|r| {
                            r.pass == p && ["softmax", "taylor1", "taylor2"].contains(&r.family.as_str())
                        })
                        .collect();
                    (
                        p.to_string(),
                        series(
                            &pr,
                            |r| format!("{} {}", r.family, r.implementation),
                            |r| Some(r.ms_median),
                        ),
                    )
                })
                .collect();
            if cross
                .iter()
                .any(|(_, s)| s.iter().any(|l| l.label.starts_with("taylor")))
            {
                let path = dir.join(format!("{stem}-crossover.png"));
                figure(&path, &title("Taylor vs softmax: time vs N", slice), "ms", &cross)?;
                written.push(path);
            }
        }
    }
    Ok(written)
}
