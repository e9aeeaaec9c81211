//! Drawing one [`Figure`] on any plotters backend (the PNG and the SVG go
//! through the same code): the title, the legend above the plot, the axes
//! and grid, then each curve as a line with markers and whiskers, a filled
//! step outline or grouped bars.

use crate::plot_data::{Curve, Figure, Pt, Style};
use crate::plot_scale::{x_scale, y_scale, Scale, Ticked};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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
/// Draws `fig` on `root` (any backend).
pub fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let top = draw_title(root, &fig.title)?;
    let top = draw_legend(root, &fig.curves, top)?;
    let (_, area) = root.split_vertically(top + 4);
    let pad = fig
        .curves
        .iter()
        .any(|c| matches!(c.style, Style::LineMarkers));
    let xs = x_scale(&fig.x, &fig.curves, pad);
    let ys = y_scale(&fig.y, &fig.curves);
    let mut chart = draw_axes(&area, fig, &xs, &ys)?;
    draw_curves(&mut chart, &fig.curves, &xs, &ys)
}

/// Draws the title at the top, shrunk until it fits, else on two lines;
/// returns the y where the legend starts.
fn draw_title<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
) -> Result<u32, String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let (w, _) = root.dim_in_pixel();
    let fits = |t: &str, size: u32| {
        root.estimate_text_size(t, &font(size))
            .is_ok_and(|s| s.0 + 40 <= w)
    };
    let mut size = 24;
    while size > 18 && !fits(title, size) {
        size -= 1;
    }
    let lines = if fits(title, size) {
        vec![title.to_string()]
    } else {
        split_title(title)
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
    Ok(top + 8)
}

/// Draws the legend of the named curves from `top` down, above the plot
/// so it never covers data; returns the y below it.
fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    curves: &[Curve],
    mut top: u32,
) -> Result<u32, String> {
    let (w, _) = root.dim_in_pixel();
    let named: Vec<(usize, &str)> = curves
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
            legend_entry(root, &curves[i], i, color(i, curves.len()), (x, y))?;
            x += ew as i32;
        }
        top += LEGEND_ROW;
    }
    Ok(top)
}

/// One legend entry at `(x, y)` (left, middle): the curve's swatch in its
/// style, then its name.
fn legend_entry<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &Curve,
    i: usize,
    color: RGBColor,
    (x, y): (i32, i32),
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
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
    Ok(())
}

/// Builds the chart on `area` and draws its axes, labels and grid.
fn draw_axes<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    fig: &Figure,
    xs: &Scale,
    ys: &Scale,
) -> Result<Chart<'a, DB>, String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut chart = ChartBuilder::on(area)
        .margin_left(14)
        .margin_right(30)
        .margin_bottom(8)
        .x_label_area_size(62)
        .y_label_area_size(86)
        .build_cartesian_2d(Ticked::of(xs), Ticked::of(ys))
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
    Ok(chart)
}

/// Draws every curve in order; the bar curves side by side at each x.
fn draw_curves<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    curves: &[Curve],
    xs: &Scale,
    ys: &Scale,
) -> Result<(), String> {
    let n_bars = curves
        .iter()
        .filter(|c| c.style == Style::Bars)
        .count()
        .max(1);
    let mut bar_k = 0;
    for (i, c) in curves.iter().enumerate() {
        let color = color(i, curves.len());
        if c.style == Style::Bars {
            draw_bars(chart, c, ys, color, (bar_k, n_bars))?;
            bar_k += 1;
        } else {
            draw_line(chart, c, i, (xs, ys), color)?;
        }
    }
    Ok(())
}

/// A line (with markers and whiskers for `LineMarkers`) or a filled step
/// outline.
fn draw_line<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    c: &Curve,
    i: usize,
    (xs, ys): (&Scale, &Scale),
    color: RGBColor,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let pts: Vec<(f64, f64)> = c.points.iter().map(|p| (xs.t(p.x), ys.t(p.y))).collect();
    if c.style == Style::Steps {
        chart
            .draw_series(std::iter::once(Polygon::new(
                pts.clone(),
                color.mix(0.18).filled(),
            )))
            .map_err(e)?;
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?;
    } else {
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))
            .map_err(e)?;
    }
    if c.style == Style::LineMarkers {
        for p in &c.points {
            whisker(chart, xs.t(p.x), p, ys, color)?;
            marker(chart.plotting_area(), (xs.t(p.x), ys.t(p.y)), i, color)?;
        }
    }
    Ok(())
}

/// The bars of curve number `bar_k` of `n_bars` bar curves, each with its
/// whisker (categories are at whole x; a group spans 0.8 of a step).
fn draw_bars<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    c: &Curve,
    ys: &Scale,
    color: RGBColor,
    (bar_k, n_bars): (usize, usize),
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
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
        whisker(chart, (x0 + x1) / 2.0, p, ys, BLACK)?;
    }
    Ok(())
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<Ticked, Ticked>>;

/// A min–max whisker at drawing x `x` (nothing when the spread is nil).
fn whisker<DB: DrawingBackend>(
    chart: &Chart<'_, DB>,
    x: f64,
    p: &Pt,
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
