//! Figures of a results directory, each as a PNG and an SVG beside it
//! (`plotters`, bitmap and SVG backends, one drawing function generic over
//! the backend). What a figure shows comes from `plot_data.rs`; its words,
//! units and ticks from `plot_axis.rs`.
//!
//! Text is drawn with plotters' `ab_glyph` renderer from a TrueType file
//! read at run time (DejaVu Sans from Debian's `fonts-dejavu-core`, which
//! `make demo` / `make test` install; `$CXLFS_PLOT_FONT` names another), so
//! no fontconfig or freetype library is needed.

use crate::distributions::{self, Distribution};
use crate::plot_axis::{eng, linear_ticks, log_ticks, nice_ceiling};
use crate::plot_data::{
    distribution_figure, distribution_name, line_figure, read_series, short_name,
    timeseries_fields, timeseries_figure, timeseries_run, value_text, Axis, Curve, Figure, Style,
};
use crate::plot_spec::{PlotKind, PlotSpec};
use crate::results::ResultsFile;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where the plot font is looked for (first found wins).
pub const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Why plotting failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PlotError {
    /// No usable font file.
    #[error("no font for plot text: install Debian's fonts-dejavu-core (apt-get install fonts-dejavu-core) or set CXLFS_PLOT_FONT to a .ttf file ({0})")]
    Font(String),
    /// plotters failed to draw or to write the PNG.
    #[error("drawing {path}: {message}")]
    Draw {
        /// The PNG.
        path: String,
        /// What plotters said.
        message: String,
    },
}

/// Loads and registers the font once per process.
fn ensure_font() -> Result<(), PlotError> {
    static FONT: OnceLock<Result<(), PlotError>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates: Vec<PathBuf> = std::env::var_os("CXLFS_PLOT_FONT")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .into_iter()
            .chain(FONT_PATHS.iter().map(PathBuf::from))
            .collect();
        let mut tried = Vec::new();
        for p in candidates {
            match std::fs::read(&p) {
                Ok(bytes) => {
                    // Registered fonts live for the whole process: leak one copy.
                    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                    return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                        .map_err(|_| {
                            PlotError::Font(format!("{} is not a usable font", p.display()))
                        });
                }
                Err(e) => tried.push(format!("{}: {e}", p.display())),
            }
        }
        Err(PlotError::Font(tried.join("; ")))
    })
    .clone()
}

/// Pixel size of every figure (PNG and SVG).
pub const SIZE: (u32, u32) = (960, 600);

/// Line colours (Okabe–Ito, readable by colour-blind readers and in print).
const COLORS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(90, 90, 90),
    RGBColor(150, 100, 40),
];

/// The colour of curve `i` of `n`: the palette, or with more curves than
/// it has colours a viridis-like ramp (distinct, ordered like the series).
fn color(i: usize, n: usize) -> RGBColor {
    if n <= COLORS.len() {
        return COLORS[i % COLORS.len()];
    }
    const RAMP: [(f64, f64, f64); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (200.0, 200.0, 30.0),
    ];
    let t = i as f64 / (n - 1) as f64 * (RAMP.len() - 1) as f64;
    let k = (t.floor() as usize).min(RAMP.len() - 2);
    let f = t - k as f64;
    let (a, b) = (RAMP[k], RAMP[k + 1]);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Figures of interest, in this order, for the default plots.
const DEFAULT_YS: [&str; 8] = [
    "read_bw_bytes_per_sec",
    "write_bw_bytes_per_sec",
    "read_clat_p99_ns",
    "write_clat_p99_ns",
    "device_hit_rate",
    "device_misses",
    "device_hits",
    "daemon.pool_traps",
];

/// The plots drawn when a spec names none: each figure of interest that is
/// not all zero (the main fio and device figures, DAX traps, every
/// `out.*` output) against each swept key, from the aggregate rows; and a
/// histogram and a CDF of each distribution the runs collected.
pub fn default_plots(res: &ResultsFile, dists: &[Distribution]) -> Vec<PlotSpec> {
    let ok = || {
        res.rows
            .iter()
            .filter(|r| r.get("status").and_then(Value::as_str) == Some("ok"))
    };
    let has_all = ok().any(|r| r.get("vm").and_then(Value::as_str) == Some("all"));
    let mut ys: Vec<String> = DEFAULT_YS.iter().map(|s| s.to_string()).collect();
    ys.extend(
        res.columns
            .iter()
            .filter(|c| c.starts_with("out."))
            .cloned(),
    );
    let mut out = Vec::new();
    for x in &res.param_columns {
        for y in &ys {
            let nonzero = ok().any(|r| r.get(y).and_then(Value::as_f64).is_some_and(|v| v != 0.0));
            if nonzero && y != x {
                out.push(PlotSpec {
                    x: x.clone(),
                    y: y.clone(),
                    vm: has_all.then(|| "all".to_string()),
                    ..PlotSpec::default()
                });
            }
        }
    }
    let mut names: Vec<&str> = dists.iter().map(|d| d.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        for kind in [PlotKind::Histogram, PlotKind::Cdf] {
            out.push(PlotSpec {
                kind,
                distribution: Some(name.to_string()),
                ..PlotSpec::default()
            });
        }
    }
    out
}

/// A file-name-safe version of a column name.
fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The PNG file name of a plot (the SVG: the same with `.svg`). A
/// time series names its run: `timeseries-traps-run001.png`.
pub fn plot_file(p: &PlotSpec, dists: &[Distribution], run: Option<u32>) -> String {
    if let Some(f) = &p.file {
        return if f.ends_with(".png") {
            f.clone()
        } else {
            format!("{f}.png")
        };
    }
    match p.kind {
        PlotKind::Line => format!("{}-vs-{}.png", slug(&p.y), slug(&p.x)),
        PlotKind::Histogram | PlotKind::Cdf => {
            let kind = if p.kind == PlotKind::Cdf {
                "cdf"
            } else {
                "histogram"
            };
            let name = distribution_name(dists, p).unwrap_or_default();
            format!("{kind}-{}.png", slug(&name))
        }
        PlotKind::Timeseries => format!(
            "timeseries-{}-run{:03}.png",
            slug(&timeseries_fields(p).join("+")),
            run.unwrap_or(0)
        ),
    }
}

/// Draws every plot into `dir` (the spec's, else [`default_plots`]);
/// returns the PNGs written (each has an SVG beside it). A plot with no
/// data (every run failed, say) is skipped.
pub fn render_all(
    res: &ResultsFile,
    plots: &[PlotSpec],
    dir: &Path,
) -> Result<Vec<PathBuf>, PlotError> {
    let dists = distributions::read(dir).unwrap_or_else(|e| {
        eprintln!("cxlfs plot: {e}: histograms left out");
        Vec::new()
    });
    let plots = if plots.is_empty() {
        default_plots(res, &dists)
    } else {
        plots.to_vec()
    };
    let mut written = Vec::new();
    for p in &plots {
        if let Some((file, fig)) = figure(res, &dists, dir, p) {
            let path = dir.join(file);
            write_figure(&fig, &path)?;
            written.push(path);
        }
    }
    Ok(written)
}

/// The figure of one plot and its file name; `None` if there is nothing to
/// draw.
pub fn figure(
    res: &ResultsFile,
    dists: &[Distribution],
    dir: &Path,
    p: &PlotSpec,
) -> Option<(String, Figure)> {
    match p.kind {
        PlotKind::Line => line_figure(res, p).map(|f| (plot_file(p, dists, None), f)),
        PlotKind::Histogram | PlotKind::Cdf => {
            distribution_figure(dists, p, &res.experiment).map(|f| (plot_file(p, dists, None), f))
        }
        PlotKind::Timeseries => {
            let run = timeseries_run(res, p)?;
            let text = read_series(dir, run)?;
            let title = p
                .title
                .clone()
                .unwrap_or_else(|| timeseries_title(res, p, run));
            timeseries_figure(&text, p, &title).map(|f| (plot_file(p, dists, Some(run)), f))
        }
    }
}

/// "EXPERIMENT: file pages faulted in per VM, run 3 (CXL share: 50 %)".
fn timeseries_title(res: &ResultsFile, p: &PlotSpec, run: u32) -> String {
    let fields = timeseries_fields(p);
    let what = match fields.as_slice() {
        [f] => crate::plot_axis::axis_info(f).name,
        _ => "metrics".to_string(),
    };
    let row = res
        .rows
        .iter()
        .find(|r| r.get("run").and_then(Value::as_u64) == Some(u64::from(run)));
    let params: Vec<String> = row
        .map(|r| {
            res.param_columns
                .iter()
                .filter_map(|c| {
                    let v = r.get(c)?;
                    Some(format!("{}: {}", short_name(c), value_text(c, v)))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut t = format!("{}: {what} over time, run {run}", res.experiment);
    if !params.is_empty() {
        t.push_str(&format!(" ({})", params.join(", ")));
    }
    t
}

/// Writes `fig` as the PNG `png` and as the SVG beside it.
pub fn write_figure(fig: &Figure, png: &Path) -> Result<(), PlotError> {
    ensure_font()?;
    let err = |path: &Path| {
        let path = path.display().to_string();
        move |message: String| PlotError::Draw { path, message }
    };
    {
        let root = BitMapBackend::new(png, SIZE).into_drawing_area();
        draw(&root, fig).map_err(err(png))?;
        root.present().map_err(|e| err(png)(e.to_string()))?;
    }
    let svg = png.with_extension("svg");
    let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
    draw(&root, fig).map_err(err(&svg))?;
    root.present().map_err(|e| err(&svg)(e.to_string()))?;
    Ok(())
}

/// One axis as drawn: its range and ticks in drawing coordinates (log10
/// for a log axis), and how a tick is labelled.
struct Scale {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    minor: Vec<f64>,
    log: bool,
    categories: Vec<String>,
}

impl Scale {
    /// A data value in drawing coordinates.
    fn t(&self, v: f64) -> f64 {
        if self.log {
            // Zero and below sit on the axis.
            if v > 0.0 {
                v.log10().max(self.lo)
            } else {
                self.lo
            }
        } else {
            v
        }
    }

    fn label(&self, v: f64) -> String {
        if !self.categories.is_empty() {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 {
                return self.categories.get(i as usize).cloned().unwrap_or_default();
            }
            return String::new();
        }
        eng(if self.log { 10f64.powf(v) } else { v })
    }
}

/// The x scale: categories, the swept values as ticks when they read
/// well, else 1-2-5 ticks.
fn x_scale(ax: &Axis, curves: &[Curve], pad: bool) -> Scale {
    if !ax.categories.is_empty() {
        let n = ax.categories.len();
        return Scale {
            lo: -0.5,
            hi: n as f64 - 0.5,
            ticks: (0..n).map(|i| i as f64).collect(),
            minor: Vec::new(),
            log: false,
            categories: ax.categories.clone(),
        };
    }
    let xs: Vec<f64> = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.x))
        .filter(|x| x.is_finite() && (!ax.log || *x > 0.0))
        .collect();
    numeric_scale(ax, &xs, pad, false)
}

fn y_scale(ax: &Axis, curves: &[Curve]) -> Scale {
    let mut ys: Vec<f64> = curves
        .iter()
        .flat_map(|c| c.points.iter().flat_map(|p| [p.lo, p.hi]))
        .filter(|y| y.is_finite() && (!ax.log || *y > 0.0))
        .collect();
    if !ax.log && curves.iter().any(|c| c.style == Style::Bars) {
        ys.push(0.0);
    }
    numeric_scale(ax, &ys, false, true)
}

fn numeric_scale(ax: &Axis, vals: &[f64], pad: bool, from_zero: bool) -> Scale {
    let (mut lo, mut hi) = vals
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    if let Some((a, b)) = ax.range {
        (lo, hi) = (a, b);
    }
    if !lo.is_finite() || !hi.is_finite() {
        (lo, hi) = if ax.log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    let empty = Scale {
        lo: 0.0,
        hi: 1.0,
        ticks: Vec::new(),
        minor: Vec::new(),
        log: ax.log,
        categories: Vec::new(),
    };
    if ax.log {
        if hi <= lo {
            lo /= 2.0;
            hi *= 2.0;
        }
        let (mut a, mut b) = if ax.range.is_some() {
            (lo, hi)
        } else {
            (lo / 1.15, hi * 1.15)
        };
        let (mut major, mut minor) = log_ticks(a, b);
        if major.len() < 2 {
            a = 10f64.powf(a.log10().floor());
            b = 10f64.powf(b.log10().ceil());
            (major, minor) = log_ticks(a, b);
        }
        if let Some(t) = data_ticks(ax, true, lo, hi) {
            major = t;
            minor = Vec::new();
        }
        return Scale {
            lo: a.log10(),
            hi: b.log10(),
            ticks: major.iter().map(|v| v.log10()).collect(),
            minor: minor.iter().map(|v| v.log10()).collect(),
            ..empty
        };
    }
    if ax.range.is_none() {
        if from_zero && lo >= 0.0 {
            lo = 0.0;
            hi = nice_ceiling(hi * 1.04, 7);
        } else if from_zero {
            let top = if hi > 0.0 {
                nice_ceiling(hi * 1.04, 7)
            } else {
                0.0
            };
            let bottom = -nice_ceiling(-lo * 1.04, 7);
            (lo, hi) = (bottom, top);
        }
    }
    if hi - lo < 1e-12 {
        lo -= 1.0;
        hi += 1.0;
    }
    let ticks = data_ticks(ax, false, lo, hi).unwrap_or_else(|| linear_ticks(lo, hi, 7));
    if pad {
        let p = (hi - lo) * 0.04;
        lo -= p;
        hi += p;
    }
    Scale {
        lo,
        hi,
        ticks,
        ..empty
    }
}

/// The swept values as ticks, when few and far enough apart to read.
fn data_ticks(ax: &Axis, log: bool, lo: f64, hi: f64) -> Option<Vec<f64>> {
    let t = ax.ticks.as_ref()?;
    if t.len() < 2 || t.len() > 10 {
        return None;
    }
    let ok = t.windows(2).all(|w| {
        if log {
            w[0] > 0.0 && w[1] / w[0] >= 1.4
        } else {
            w[1] - w[0] >= (hi - lo) / 11.0
        }
    });
    // Linear: only when they are round steps (1, 2, 4, 8 is fine; 0, 5,
    // 10, 20, 30, 50 reads better as 0, 20, 40, ...).
    (ok && (log || t.len() <= 6)).then(|| t.clone())
}

fn font(size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&BLACK)
}

/// One legend entry's width in pixels.
fn entry_width<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, name: &str) -> u32 {
    let w = root
        .estimate_text_size(name, &font(LEGEND_FONT))
        .map_or(name.len() as u32 * 9, |s| s.0);
    SWATCH + 8 + w + 26
}

const LEGEND_FONT: u32 = 17;
const LEGEND_ROW: u32 = 26;
const SWATCH: u32 = 32;

/// Lays out the legend in rows (indices into the named curves).
fn legend_rows<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    names: &[(usize, &str)],
    width: u32,
) -> Vec<Vec<(usize, u32)>> {
    let mut rows: Vec<Vec<(usize, u32)>> = Vec::new();
    let mut used = 0;
    for &(i, name) in names {
        let w = entry_width(root, name);
        if rows.is_empty() || used + w > width {
            rows.push(Vec::new());
            used = 0;
        }
        if let Some(r) = rows.last_mut() {
            r.push((i, w));
        }
        used += w;
    }
    rows
}

/// Draws a marker of shape `shape` at `at`.
fn marker<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    at: CT::From,
    shape: usize,
    color: RGBColor,
) -> Result<(), String>
where
    CT::From: Clone + 'static,
{
    let style = color.filled();
    let r = match shape % 4 {
        0 => area.draw(&(EmptyElement::at(at) + Circle::new((0, 0), 5, style))),
        1 => area.draw(&(EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], style))),
        2 => area.draw(&(EmptyElement::at(at) + TriangleMarker::new((0, 0), 6, style))),
        _ => area.draw(
            &(EmptyElement::at(at) + Polygon::new(vec![(0, -6), (6, 0), (0, 6), (-6, 0)], style)),
        ),
    };
    r.map_err(|e| e.to_string())
}

/// A long title in two lines, split at the space nearest the middle.
fn split_title(t: &str) -> Vec<String> {
    let mid = t.len() / 2;
    let cut = t
        .match_indices(' ')
        .map(|(i, _)| i)
        .min_by_key(|i| i.abs_diff(mid));
    match cut {
        Some(i) => vec![t[..i].to_string(), t[i + 1..].to_string()],
        None => vec![t.to_string()],
    }
}

/// Draws `fig` on `root` (any backend).
pub fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (w, _) = root.dim_in_pixel();
    // Title: shrunk until it fits, else on two lines.
    let fits = |t: &str, size: u32| {
        root.estimate_text_size(t, &font(size))
            .is_ok_and(|s| s.0 + 40 <= w)
    };
    let mut size = 24;
    while size > 18 && !fits(&fig.title, size) {
        size -= 1;
    }
    let lines = if fits(&fig.title, size) {
        vec![fig.title.clone()]
    } else {
        split_title(&fig.title)
    };
    let mut top = 12;
    for line in &lines {
        root.draw(&Text::new(
            line.clone(),
            ((w / 2) as i32, top as i32),
            font(size).pos(Pos::new(HPos::Center, VPos::Top)),
        ))
        .map_err(e)?;
        top += size + 4;
    }
    top += 8;
    // Legend: above the plot, so it never covers data.
    let named: Vec<(usize, &str)> = fig
        .curves
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.name.is_empty())
        .map(|(i, c)| (i, c.name.as_str()))
        .collect();
    let rows = legend_rows(root, &named, w.saturating_sub(60));
    for row in &rows {
        let total: u32 = row.iter().map(|(_, w)| w).sum();
        let mut x = (w.saturating_sub(total) / 2) as i32;
        let y = (top + LEGEND_ROW / 2) as i32;
        for &(i, ew) in row {
            let c = &fig.curves[i];
            let color = color(i, fig.curves.len());
            let sw = SWATCH as i32;
            match c.style {
                Style::Steps | Style::Bars => {
                    root.draw(&Rectangle::new(
                        [(x, y - 8), (x + sw, y + 8)],
                        color
                            .mix(if c.style == Style::Bars { 1.0 } else { 0.25 })
                            .filled(),
                    ))
                    .map_err(e)?;
                    root.draw(&Rectangle::new(
                        [(x, y - 8), (x + sw, y + 8)],
                        color.stroke_width(2),
                    ))
                    .map_err(e)?;
                }
                Style::Line | Style::LineMarkers => {
                    root.draw(&PathElement::new(
                        vec![(x, y), (x + sw, y)],
                        color.stroke_width(3),
                    ))
                    .map_err(e)?;
                    if c.style == Style::LineMarkers {
                        marker(root, (x + sw / 2, y), i, color)?;
                    }
                }
            }
            root.draw(&Text::new(
                c.name.clone(),
                (x + sw + 8, y),
                font(LEGEND_FONT).pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(e)?;
            x += ew as i32;
        }
        top += LEGEND_ROW;
    }
    let (_, area) = root.split_vertically(top + 4);
    let pad = fig
        .curves
        .iter()
        .any(|c| matches!(c.style, Style::LineMarkers));
    let xs = x_scale(&fig.x, &fig.curves, pad);
    let ys = y_scale(&fig.y, &fig.curves);
    let mut chart = ChartBuilder::on(&area)
        .margin_left(14)
        .margin_right(30)
        .margin_bottom(8)
        .x_label_area_size(62)
        .y_label_area_size(86)
        .build_cartesian_2d(Ticked::of(&xs), Ticked::of(&ys))
        .map_err(e)?;
    let fx = |v: &f64| xs.label(*v);
    let fy = |v: &f64| ys.label(*v);
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(fig.x.label.as_str())
        .y_desc(fig.y.label.as_str())
        .x_label_formatter(&fx)
        .y_label_formatter(&fy)
        .label_style(font(16))
        .axis_desc_style(font(19))
        .bold_line_style(RGBColor(215, 215, 215))
        .light_line_style(RGBColor(238, 238, 238));
    if !fig.x.categories.is_empty() {
        mesh.disable_x_mesh();
    }
    mesh.draw().map_err(e)?;
    let n_bars = fig
        .curves
        .iter()
        .filter(|c| c.style == Style::Bars)
        .count()
        .max(1);
    let mut bar_k = 0;
    for (i, c) in fig.curves.iter().enumerate() {
        let color = color(i, fig.curves.len());
        let pts: Vec<(f64, f64)> = c.points.iter().map(|p| (xs.t(p.x), ys.t(p.y))).collect();
        match c.style {
            Style::Line | Style::LineMarkers => {
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))
                    .map_err(e)?;
            }
            Style::Steps => {
                chart
                    .draw_series(std::iter::once(Polygon::new(
                        pts.clone(),
                        color.mix(0.18).filled(),
                    )))
                    .map_err(e)?;
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(e)?;
            }
            Style::Bars => {
                let width = 0.8 / n_bars as f64;
                let base = ys.t(if ys.log {
                    0.0
                } else {
                    ys.lo.max(0.0).min(ys.hi)
                });
                for p in &c.points {
                    let x0 = p.x - 0.4 + width * bar_k as f64 + width * 0.06;
                    let x1 = x0 + width * 0.88;
                    chart
                        .draw_series(std::iter::once(Rectangle::new(
                            [(x0, base), (x1, ys.t(p.y))],
                            color.filled(),
                        )))
                        .map_err(e)?;
                    whisker(&chart, (x0 + x1) / 2.0, p, &ys, BLACK)?;
                }
                bar_k += 1;
                continue;
            }
        }
        if c.style == Style::LineMarkers {
            for p in &c.points {
                whisker(&chart, xs.t(p.x), p, &ys, color)?;
                marker(chart.plotting_area(), (xs.t(p.x), ys.t(p.y)), i, color)?;
            }
        }
    }
    Ok(())
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<Ticked, Ticked>>;

/// A linear f64 axis (in drawing coordinates) whose grid lines and labels
/// are exactly the given ticks.
#[derive(Debug, Clone)]
pub struct Ticked {
    lo: f64,
    hi: f64,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl Ticked {
    fn of(s: &Scale) -> Self {
        let inside = |v: &&f64| **v >= s.lo - 1e-9 && **v <= s.hi + 1e-9;
        Ticked {
            lo: s.lo,
            hi: s.hi,
            bold: s.ticks.iter().filter(inside).copied().collect(),
            light: s.minor.iter().filter(inside).copied().collect(),
        }
    }
}

impl Ranged for Ticked {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        if self.hi == self.lo {
            return (limit.0 + limit.1) / 2;
        }
        let f = (v - self.lo) / (self.hi - self.lo);
        let len = f64::from(limit.1 - limit.0);
        limit.0 + (len * f + 1e-3).floor() as i32
    }

    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// A min–max whisker at drawing x `x` (nothing when the spread is nil).
fn whisker<DB: DrawingBackend>(
    chart: &Chart<'_, DB>,
    x: f64,
    p: &crate::plot_data::Pt,
    ys: &Scale,
    color: RGBColor,
) -> Result<(), String> {
    if p.n < 2 || p.hi <= p.lo {
        return Ok(());
    }
    let (lo, hi) = (ys.t(p.lo), ys.t(p.hi));
    let style = color.stroke_width(2);
    let area = chart.plotting_area();
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.draw(&PathElement::new(vec![(x, lo), (x, hi)], style))
        .map_err(e)?;
    for y in [lo, hi] {
        area.draw(&(EmptyElement::at((x, y)) + PathElement::new(vec![(-6, 0), (6, 0)], style)))
            .map_err(e)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    /// A sweep of the CXL ratio with 3 repeats, 2 phases, 2 VMs and the
    /// aggregate; a policy column; an output column.
    fn results() -> ResultsFile {
        let mut res = ResultsFile::new(
            "virtiofs-cxl-ratio",
            vec![
                "daemon.cxl_ratio".into(),
                "daemon.device.cache.policy".into(),
            ],
        );
        let mut rows = Vec::new();
        let mut run = 0;
        for ratio in [0, 5, 10, 20, 30, 50, 80, 100] {
            for policy in ["lru", "s3fifo"] {
                for repeat in 0..3 {
                    run += 1;
                    for (k, phase) in ["first-touch", "second-touch"].iter().enumerate() {
                        for vm in ["vm0", "vm1", "all"] {
                            let wobble = f64::from(repeat) * 0.04 - 0.04;
                            let base = if k == 0 { 9e8 } else { 2.2e9 };
                            let bw = base / (1.0 + f64::from(ratio) / 12.0) * (1.0 + wobble);
                            let bw = if vm == "all" { bw } else { bw / 2.0 };
                            rows.push(
                                json!({"run": run, "repeat": repeat, "status": "ok", "vm": vm,
                                       "phase": phase, "daemon.cxl_ratio": ratio,
                                       "daemon.device.cache.policy": policy,
                                       "read_bw_bytes_per_sec": bw,
                                       "read_clat_p99_ns": 4e9 / bw * 1e3,
                                       "daemon.pool_traps": ratio * 300 + repeat * 40,
                                       "out.hit_share": 1.0 - f64::from(ratio) / 150.0
                                           - if policy == "lru" { 0.0 } else { 0.05 }})
                                .as_object()
                                .unwrap()
                                .clone(),
                            );
                        }
                    }
                }
            }
        }
        rows.push(
            json!({"run": 99, "status": "failed", "vm": "all", "daemon.cxl_ratio": 5})
                .as_object()
                .unwrap()
                .clone(),
        );
        res.push(rows);
        res
    }

    /// Per-load latency of a pointer chase: DRAM ~100 ns, CXL bimodal
    /// (device-cache hits ~1 µs, misses ~55 µs).
    fn distributions() -> Vec<Distribution> {
        let mut out = Vec::new();
        let buckets = |centers: &[(f64, u64)]| -> Vec<(f64, f64, u64)> {
            // Log-spaced buckets, 8 per decade, from 10 ns to 1 ms.
            let edges: Vec<f64> = (0..=40)
                .map(|i| 10f64 * 10f64.powf(f64::from(i) / 8.0))
                .collect();
            edges
                .windows(2)
                .filter_map(|w| {
                    let mid = (w[0] * w[1]).sqrt();
                    let n: f64 = centers
                        .iter()
                        .map(|(c, n)| *n as f64 * (-((mid / c).ln()).powi(2) / 0.08).exp())
                        .sum();
                    (n >= 1.0).then_some((w[0].round(), w[1].round(), n as u64))
                })
                .collect()
        };
        for repeat in 0..2 {
            for (numa, centers) in [
                ("dram", vec![(95.0, 9000)]),
                ("cxl", vec![(900.0, 5000), (55_000.0, 4000)]),
            ] {
                out.push(Distribution {
                    run: repeat + 1,
                    point: 0,
                    repeat,
                    phase: "chase".into(),
                    vm: "vm0".into(),
                    params: [("phase.numa".to_string(), json!(numa))].into(),
                    name: "latency".into(),
                    unit: "ns".into(),
                    buckets: buckets(&centers),
                });
            }
        }
        out
    }

    /// A metrics series of 2 VMs: file pages faulted in over 30 s.
    fn series() -> String {
        let mut s = String::new();
        for seq in 0..31u64 {
            let t = 1_700_000_000_000 + seq * 1000;
            let t_s = seq as f64;
            let vm0 = (4096.0 * (1.0 - (-t_s / 6.0).exp())) as u64;
            let vm1 = (3000.0 * (1.0 - (-(t_s - 8.0).max(0.0) / 5.0).exp())) as u64;
            let dev = ((vm0 + vm1) as f64 * 0.6) as u64;
            for (vm, traps) in [("vm0", vm0), ("vm1", vm1), ("all", vm0 + vm1)] {
                s.push_str(&format!(
                    "{{\"ts_unix_ms\":{t},\"seq\":{seq},\"final\":false,\"vm\":\"{vm}\",\"traps\":{traps},\"resident_cxl_pages\":{dev},\"dax_maps\":{},\"policy\":\"lru\"}}\n",
                    traps / 512
                ));
            }
        }
        s
    }

    fn is_png(path: &Path) -> bool {
        let b = std::fs::read(path).unwrap();
        b.len() > 1000 && b.starts_with(b"\x89PNG\r\n\x1a\n")
    }

    fn is_svg(path: &Path) -> bool {
        let t = std::fs::read_to_string(path).unwrap();
        t.contains("<svg") && t.contains("</svg>") && t.contains("<text")
    }

    fn write_dir(dir: &Path) -> ResultsFile {
        let res = results();
        distributions::append(dir, &distributions()).unwrap();
        let run_dir = dir.join("runs").join("001");
        std::fs::create_dir_all(&run_dir).unwrap();
        std::fs::write(run_dir.join("metrics.jsonl"), series()).unwrap();
        res
    }

    fn spec_plots() -> Vec<PlotSpec> {
        let toml = r#"
[[plots]]
x = "daemon.cxl_ratio"
y = "read_bw_bytes_per_sec"
series = ["phase"]
vm = "all"
filter = { "daemon.device.cache.policy" = "lru" }
file = "bw-vs-ratio.png"

[[plots]]
x = "daemon.device.cache.policy"
y = "out.hit_share"
series = ["phase"]
vm = "all"
filter = { "daemon.cxl_ratio" = 50 }
file = "hit-share-vs-policy"

[[plots]]
x = "daemon.cxl_ratio"
y = "read_clat_p99_ns"
series = ["vm", "daemon.device.cache.policy"]
phase = "second-touch"
log_y = false
file = "p99-per-vm.png"

[[plots]]
kind = "histogram"
distribution = "latency"
y_label = "Share of loads (%)"
title = "Pointer chase: per-load latency, DRAM vs CXL node"

[[plots]]
kind = "cdf"
y_label = "Loads at or below (%)"

[[plots]]
kind = "timeseries"
fields = ["traps"]
y_label = "File pages faulted in"
title = "virtiofs on CXL: file pages faulted in per VM over time"

[[plots]]
kind = "timeseries"
run = 1
fields = ["traps", "resident_cxl_pages"]
file = "ts-two-fields.png"
"#;
        #[derive(serde::Deserialize)]
        struct S {
            plots: Vec<PlotSpec>,
        }
        toml::from_str::<S>(toml).unwrap().plots
    }

    #[test]
    fn draws_spec_and_default_plots_as_png_and_svg() {
        let tmp = tempfile::tempdir().unwrap();
        // CXLFS_KEEP_PLOTS=DIR keeps the figures to look at.
        let keep = std::env::var_os("CXLFS_KEEP_PLOTS").map(PathBuf::from);
        let dir = keep.unwrap_or_else(|| tmp.path().to_path_buf());
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join(distributions::FILE));
        let res = write_dir(&dir);
        let files = render_all(&res, &spec_plots(), &dir).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "bw-vs-ratio.png",
                "hit-share-vs-policy.png",
                "p99-per-vm.png",
                "histogram-latency.png",
                "cdf-latency.png",
                "timeseries-traps-run001.png",
                "ts-two-fields.png"
            ]
        );
        for f in &files {
            assert!(is_png(f), "{}", f.display());
            assert!(is_svg(&f.with_extension("svg")), "{}", f.display());
        }
        let svg = std::fs::read_to_string(dir.join("bw-vs-ratio.svg")).unwrap();
        assert!(svg.contains("Read bandwidth (MB/s)"));
        assert!(svg.contains("File pages on the CXL-SSD (%)"));
        assert!(svg.contains("phase: first-touch"));
        // Defaults: each figure against each swept key, plus the
        // distributions' histogram and CDF.
        let defaults = default_plots(&res, &distributions());
        let ys: Vec<(&str, &str)> = defaults
            .iter()
            .map(|p| (p.x.as_str(), p.y.as_str()))
            .collect();
        assert!(ys.contains(&("daemon.cxl_ratio", "read_bw_bytes_per_sec")));
        assert!(ys.contains(&("daemon.device.cache.policy", "daemon.pool_traps")));
        assert!(ys.contains(&("daemon.cxl_ratio", "out.hit_share")));
        assert!(!ys.iter().any(|(_, y)| *y == "write_bw_bytes_per_sec"));
        assert_eq!(
            defaults.iter().filter(|p| p.kind != PlotKind::Line).count(),
            2
        );
        let sub = dir.join("defaults");
        std::fs::create_dir_all(&sub).unwrap();
        let _ = std::fs::remove_file(sub.join(distributions::FILE));
        distributions::append(&sub, &distributions()).unwrap();
        let files = render_all(&res, &[], &sub).unwrap();
        assert_eq!(files.len(), defaults.len());
        for f in &files {
            assert!(is_png(f), "{}", f.display());
        }
        // Nothing to draw: no file, no error.
        let none = PlotSpec {
            x: "daemon.cxl_ratio".into(),
            y: "no_such_column".into(),
            ..PlotSpec::default()
        };
        let ts = PlotSpec {
            kind: PlotKind::Timeseries,
            run: Some(7),
            ..PlotSpec::default()
        };
        assert!(render_all(&res, &[none, ts], tmp.path())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn sizes_on_an_automatic_log_axis() {
        let mut res = ResultsFile::new("bandwidth-vs-wss", vec!["fio.size".into()]);
        let mut rows = Vec::new();
        for (i, mib) in [4u64, 8, 16, 32, 64].iter().enumerate() {
            for repeat in 0..3u32 {
                let bw = if *mib <= 16 {
                    2.4e9
                } else {
                    2.4e9 * 16.0 / *mib as f64
                };
                let bw = bw * (1.0 + 0.03 * (f64::from(repeat) - 1.0));
                rows.push(
                    json!({"run": i * 3 + repeat as usize + 1, "status": "ok", "vm": "all",
                           "phase": "measure", "fio.size": format!("{mib}MiB"),
                           "read_bw_bytes_per_sec": bw})
                    .as_object()
                    .unwrap()
                    .clone(),
                );
            }
        }
        res.push(rows);
        let p = PlotSpec {
            x: "fio.size".into(),
            y: "read_bw_bytes_per_sec".into(),
            file: Some("bw-vs-wss.png".into()),
            ..PlotSpec::default()
        };
        let (_, fig) = figure(&res, &[], Path::new("."), &p).unwrap();
        assert!(fig.x.log, "a doubling sweep goes on a log axis");
        assert_eq!(fig.x.label, "Working set (MiB)");
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::env::var_os("CXLFS_KEEP_PLOTS")
            .map_or_else(|| tmp.path().to_path_buf(), PathBuf::from);
        std::fs::create_dir_all(&dir).unwrap();
        let files = render_all(&res, &[p], &dir).unwrap();
        let svg = std::fs::read_to_string(files[0].with_extension("svg")).unwrap();
        for tick in ["4", "16", "64", "2.5k"] {
            assert!(svg.contains(&format!(">\n{tick}\n</text>")), "{tick}");
        }
    }

    #[test]
    fn ticks_read_well() {
        use crate::plot_data::Pt;
        let ax = Axis {
            ticks: Some(vec![4.0, 8.0, 16.0, 32.0, 64.0]),
            log: true,
            ..Axis::default()
        };
        let c = Curve {
            name: String::new(),
            points: vec![Pt::at(4.0, 1.0), Pt::at(64.0, 1.0)],
            style: Style::LineMarkers,
        };
        let s = x_scale(&ax, std::slice::from_ref(&c), true);
        let labels: Vec<String> = s.ticks.iter().map(|t| s.label(*t)).collect();
        assert_eq!(labels, ["4", "8", "16", "32", "64"]);
        // 0, 5, 10, 20 ... 100: 1-2-5 ticks instead of crowded sweep values.
        let ax = Axis {
            ticks: Some(vec![0.0, 5.0, 10.0, 20.0, 30.0, 50.0, 80.0, 100.0]),
            ..Axis::default()
        };
        let c = Curve {
            points: vec![Pt::at(0.0, 0.0), Pt::at(100.0, 6.6e8)],
            ..c
        };
        let s = x_scale(&ax, std::slice::from_ref(&c), true);
        let labels: Vec<String> = s.ticks.iter().map(|t| s.label(*t)).collect();
        assert_eq!(labels, ["0", "20", "40", "60", "80", "100"]);
        let s = y_scale(&Axis::default(), &[c]);
        let labels: Vec<String> = s.ticks.iter().map(|t| s.label(*t)).collect();
        assert_eq!(labels.last().unwrap(), "700M");
        assert!(labels.iter().all(|l| !l.contains('e')), "{labels:?}");
    }
}
