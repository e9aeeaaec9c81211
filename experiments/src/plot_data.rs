//! What a figure shows, independent of how it is drawn: the curves of a
//! `[[plots]]` entry built from `results.json` (mean and min–max over
//! repeats), `distributions.jsonl` (histogram, CDF) or one run's
//! `metrics.jsonl` (time series). `plot_draw.rs` draws a [`Figure`].

use crate::daemon_metrics::parse_series;
use crate::distributions::Distribution;
use crate::plot_axis::{axis_info, humanise, AxisInfo};
use crate::plot_spec::{PlotKind, PlotSpec};
use crate::results::{cell_text, ResultsFile, Row};
use cxlfs_device_model::units::parse_size;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// One point: `y` is the mean, `lo..hi` the spread (min–max over repeats).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pt {
    /// X (a category's index for a categorical axis).
    pub x: f64,
    /// Y (the mean over repeats).
    pub y: f64,
    /// Smallest y.
    pub lo: f64,
    /// Largest y.
    pub hi: f64,
    /// How many values went into it.
    pub n: usize,
}

impl Pt {
    /// A point without spread.
    pub fn at(x: f64, y: f64) -> Pt {
        Pt {
            x,
            y,
            lo: y,
            hi: y,
            n: 1,
        }
    }
}

/// How a curve is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Line through the means, a marker at each, min–max whiskers.
    LineMarkers,
    /// A plain line (time series, CDF).
    Line,
    /// A histogram outline, lightly filled.
    Steps,
    /// Bars (categorical x), whiskers on top.
    Bars,
}

/// One line of a figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// Legend text (empty: not in the legend).
    pub name: String,
    /// Points in data units (already scaled), ascending x.
    pub points: Vec<Pt>,
    /// How it is drawn.
    pub style: Style,
}

/// One axis.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Axis {
    /// Title with unit.
    pub label: String,
    /// Logarithmic.
    pub log: bool,
    /// Category names (non-empty: a categorical axis, x = index).
    pub categories: Vec<String>,
    /// Put the ticks at these values (the swept values), if set.
    pub ticks: Option<Vec<f64>>,
    /// Fixed range (data units), else from the data.
    pub range: Option<(f64, f64)>,
}

/// A figure, ready to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Title.
    pub title: String,
    /// X axis.
    pub x: Axis,
    /// Y axis.
    pub y: Axis,
    /// The curves, in legend order.
    pub curves: Vec<Curve>,
}

/// Groups `(x, y)` values by x: mean, min and max of each x, ascending x.
pub fn group_mean_min_max(values: &[(f64, f64)]) -> Vec<Pt> {
    let mut by_x: BTreeMap<i64, Vec<(f64, f64)>> = BTreeMap::new();
    for &(x, y) in values {
        by_x.entry((x * 1e6).round() as i64)
            .or_default()
            .push((x, y));
    }
    by_x.values()
        .map(|v| {
            let n = v.len();
            let sum: f64 = v.iter().map(|p| p.1).sum();
            Pt {
                x: v[0].0,
                y: sum / n as f64,
                lo: v.iter().map(|p| p.1).fold(f64::INFINITY, f64::min),
                hi: v.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max),
                n,
            }
        })
        .collect()
}

/// A size or number as a number: `16777216`, `"16MiB"`, `"4k"`, `"1G"`.
pub fn number_of(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        // Sizes written as text (`"16MiB"`), as specs allow.
        Value::String(s) => parse_size(s.trim()).ok().map(|b| b as f64),
        _ => None,
    }
}

/// The legend's short name of a column ("phase", "VM", "working set").
pub fn short_name(col: &str) -> String {
    let c = col.strip_prefix("params.").unwrap_or(col);
    match c {
        "vm" => "VM".into(),
        "phase" => "phase".into(),
        "cxl_ratio" | "daemon.cxl_ratio" => "CXL share".into(),
        "policy" | "daemon.device.cache.policy" => "policy".into(),
        "fio.size" => "working set".into(),
        "numa" | "phase.numa" => "NUMA".into(),
        "miss_p50_ns" => "median".into(),
        "latency_compensation" | "daemon.latency_compensation" => "compensation".into(),
        "miss_p99_ns" => "p99".into(),
        _ => {
            let n = axis_info(c).name;
            // Lower-case the first letter unless it starts an acronym.
            let mut ch = n.chars();
            match (ch.next(), ch.next()) {
                (Some(a), Some(b)) if !b.is_uppercase() => {
                    a.to_lowercase().collect::<String>() + &n[a.len_utf8()..]
                }
                _ => n,
            }
        }
    }
}

/// A cell's value in a legend: numbers with the column's unit.
pub fn value_text(col: &str, v: &Value) -> String {
    let c = col.strip_prefix("params.").unwrap_or(col);
    if matches!(c, "run" | "point" | "repeat" | "vms") {
        return cell_text(v);
    }
    match v {
        Value::Number(n) => n
            .as_f64()
            .map_or_else(|| cell_text(v), |x| axis_info(c).value_text(x)),
        Value::String(s) if axis_info(c).unit == "MiB" => {
            number_of(v).map_or_else(|| s.clone(), |x| axis_info(c).value_text(x))
        }
        _ => cell_text(v),
    }
}

/// "phase: first-touch, VM: vm0" from the columns' values.
fn series_label(cols: &[String], get: &dyn Fn(&str) -> Option<Value>) -> String {
    cols.iter()
        .filter_map(|c| {
            let v = get(c)?;
            let t = value_text(c, &v);
            (!t.is_empty()).then(|| format!("{}: {t}", short_name(c)))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `v` equals the spec's filter value (as text, so 50 = "50").
fn same(v: Option<&Value>, want: &Value) -> bool {
    v.is_some_and(|v| cell_text(v) == cell_text(want))
}

fn row_matches(r: &Row, p: &PlotSpec) -> bool {
    let s = |k: &str| r.get(k).and_then(Value::as_str);
    p.vm.as_deref().map_or(true, |vm| s("vm") == Some(vm))
        && p.phase.as_deref().map_or(true, |ph| s("phase") == Some(ph))
        && p.filter
            .iter()
            .flatten()
            .all(|(k, want)| same(r.get(k), want))
}

fn is_ok(r: &Row) -> bool {
    r.get("status").and_then(Value::as_str) == Some("ok")
}

/// Drops the columns whose value is the same in every item.
fn varying<T>(
    cols: Vec<String>,
    items: &[T],
    get: impl Fn(&T, &str) -> Option<Value>,
) -> Vec<String> {
    cols.into_iter()
        .filter(|c| {
            let mut seen: Vec<String> = items
                .iter()
                .map(|i| get(i, c).map(|v| cell_text(&v)).unwrap_or_default())
                .collect();
            seen.sort();
            seen.dedup();
            seen.len() > 1
        })
        .collect()
}

/// Positive values spanning two decades or more.
pub fn spans_decades(values: impl IntoIterator<Item = f64>) -> bool {
    let mut lo = f64::INFINITY;
    let mut hi = 0.0_f64;
    for v in values {
        if v <= 0.0 || !v.is_finite() {
            return false;
        }
        lo = lo.min(v);
        hi = hi.max(v);
    }
    lo.is_finite() && hi / lo >= 100.0
}

/// Four or more positive values, each about twice the last or more (a
/// doubling sweep: 4, 8, 16, 32 MiB), which reads best on a log axis.
pub fn geometric(sorted: &[f64]) -> bool {
    sorted.len() >= 4 && sorted[0] > 0.0 && sorted.windows(2).all(|w| w[1] / w[0] >= 1.9)
}

/// The y axis's info: the column's, with the spec's overrides.
fn y_info(p: &PlotSpec, col: &str) -> AxisInfo {
    let mut info = axis_info(col);
    if let Some(s) = p.y_scale.filter(|s| *s != 0.0 && s.is_finite()) {
        info.scale = s;
    }
    info
}

/// `kind = "line"`: y against x from the rows; `None` if no row has both.
pub fn line_figure(res: &ResultsFile, p: &PlotSpec) -> Option<Figure> {
    let rows: Vec<&Row> = res
        .rows
        .iter()
        .filter(|r| is_ok(r) && row_matches(r, p))
        .filter(|r| r.get(&p.y).and_then(Value::as_f64).is_some())
        .filter(|r| r.get(&p.x).is_some_and(|v| !v.is_null()))
        .collect();
    if rows.is_empty() || p.x.is_empty() {
        return None;
    }
    let xi = axis_info(&p.x);
    let yi = y_info(p, &p.y);
    let numeric = rows.iter().all(|r| number_of(&r[&p.x]).is_some());
    let mut categories: Vec<String> = Vec::new();
    // Default: VM, phase and the other swept keys (so that different
    // sweep points are never merged as if they were repeats).
    let mut series_cols = p.series.clone().unwrap_or_else(|| {
        let mut c = vec!["vm".to_string(), "phase".to_string()];
        c.extend(res.param_columns.iter().cloned());
        c
    });
    series_cols.retain(|c| *c != p.x);
    let series_cols = varying(series_cols, &rows, |r, c| r.get(c).cloned());
    // Series in first-seen order.
    let mut order: Vec<String> = Vec::new();
    let mut values: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &rows {
        let name = series_label(&series_cols, &|c| r.get(c).cloned());
        let x = if numeric {
            number_of(&r[&p.x]).unwrap_or(0.0) / xi.scale
        } else {
            let t = cell_text(&r[&p.x]);
            match categories.iter().position(|c| *c == t) {
                Some(i) => i as f64,
                None => {
                    categories.push(t);
                    (categories.len() - 1) as f64
                }
            }
        };
        for col in std::iter::once(&p.y).chain(&p.y_also) {
            let Some(y) = r.get(col).and_then(Value::as_f64) else {
                continue;
            };
            let name = if p.y_also.is_empty() {
                name.clone()
            } else if name.is_empty() {
                short_name(col)
            } else {
                format!("{name}, {}", short_name(col))
            };
            if !order.contains(&name) {
                order.push(name.clone());
            }
            values.entry(name).or_default().push((x, y / yi.scale));
        }
    }
    let style = if numeric {
        Style::LineMarkers
    } else {
        Style::Bars
    };
    let mut curves: Vec<Curve> = order
        .iter()
        .map(|name| Curve {
            name: name.clone(),
            points: group_mean_min_max(values.get(name).map_or(&[][..], |v| &v[..])),
            style,
        })
        .collect();
    if p.identity_line && numeric {
        curves.push(identity_curve(&curves));
    }
    let xs: Vec<f64> = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.x))
        .collect();
    let ys = curves
        .iter()
        .flat_map(|c| c.points.iter().flat_map(|p| [p.lo, p.hi]));
    let mut distinct = xs.clone();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup_by(|a, b| (*a - *b).abs() <= 1e-9 * b.abs().max(1.0));
    let log_x = numeric
        && p.log_x
            .unwrap_or_else(|| spans_decades(xs.iter().copied()) || geometric(&distinct));
    let log_y = p.log_y.unwrap_or_else(|| numeric && spans_decades(ys));
    let title = p.title.clone().unwrap_or_else(|| {
        format!(
            "{}: {} vs {}",
            res.experiment,
            yi.name,
            lower_first(&xi.name)
        )
    });
    Some(Figure {
        title,
        x: Axis {
            label: p.x_label.clone().unwrap_or_else(|| xi.label()),
            log: log_x,
            categories,
            ticks: numeric.then_some(distinct),
            range: None,
        },
        y: Axis {
            label: p.y_label.clone().unwrap_or_else(|| yi.label()),
            log: log_y,
            ..Axis::default()
        },
        curves,
    })
}

/// The line y = x across the span of `curves`' x values (from 0 when they
/// are positive), as the last curve: where the data can be read against
/// it, without stretching the x axis to the largest y (a p99).
fn identity_curve(curves: &[Curve]) -> Curve {
    let all = curves.iter().flat_map(|c| c.points.iter().map(|p| p.x));
    let (lo, hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (lo, hi) = if lo <= hi {
        (lo.min(0.0), hi)
    } else {
        (0.0, 1.0)
    };
    Curve {
        name: "y = x".into(),
        points: vec![Pt::at(lo, lo), Pt::at(hi, hi)],
        style: Style::Line,
    }
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match (c.next(), c.next()) {
        (Some(a), Some(b)) if !b.is_uppercase() => {
            a.to_lowercase().collect::<String>() + &s[a.len_utf8()..]
        }
        _ => s.to_string(),
    }
}

/// Buckets of several distributions summed (same `(lo, hi)` = same bucket),
/// ascending.
pub fn merge_buckets<'a>(ds: impl IntoIterator<Item = &'a Distribution>) -> Vec<(f64, f64, u64)> {
    let mut m: BTreeMap<(i64, i64), (f64, f64, u64)> = BTreeMap::new();
    for d in ds {
        for &(lo, hi, n) in &d.buckets {
            let key = ((lo * 1e3).round() as i64, (hi * 1e3).round() as i64);
            m.entry(key).or_insert((lo, hi, 0)).2 += n;
        }
    }
    let mut v: Vec<(f64, f64, u64)> = m.into_values().collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    v
}

/// A histogram's outline: (x, share %) corners, dropping to 0 at gaps.
pub fn histogram_steps(buckets: &[(f64, f64, u64)]) -> Vec<(f64, f64)> {
    let total = crate::distributions::total(buckets);
    if total == 0 {
        return Vec::new();
    }
    let mut pts = Vec::new();
    let mut prev_hi: Option<f64> = None;
    for &(lo, hi, n) in buckets {
        let share = n as f64 * 100.0 / total as f64;
        match prev_hi {
            Some(ph) if (lo - ph).abs() <= 1e-9 * ph.abs().max(1.0) => {}
            Some(ph) => {
                pts.push((ph, 0.0));
                pts.push((lo, 0.0));
            }
            None => pts.push((lo, 0.0)),
        }
        pts.push((lo, share));
        pts.push((hi, share));
        prev_hi = Some(hi);
    }
    if let Some(ph) = prev_hi {
        pts.push((ph, 0.0));
    }
    pts
}

/// A cumulative distribution: (x, share % at or below x), linear inside a
/// bucket (as [`crate::distributions::share_below`]), flat across gaps.
pub fn cdf_points(buckets: &[(f64, f64, u64)]) -> Vec<(f64, f64)> {
    let total = crate::distributions::total(buckets);
    if total == 0 {
        return Vec::new();
    }
    let mut pts = Vec::new();
    let mut seen = 0u64;
    for &(lo, hi, n) in buckets {
        pts.push((lo, seen as f64 * 100.0 / total as f64));
        seen += n;
        pts.push((hi, seen as f64 * 100.0 / total as f64));
    }
    pts
}

/// A distribution's value for a series or filter column: `phase`, `vm`,
/// `run`, `point`, `repeat`, or a swept key (`params.KEY` or `KEY`).
fn dist_value(d: &Distribution, col: &str) -> Option<Value> {
    Some(match col {
        "phase" => Value::from(d.phase.clone()),
        "vm" => Value::from(d.vm.clone()),
        "run" => Value::from(d.run),
        "point" => Value::from(d.point),
        "repeat" => Value::from(d.repeat),
        "name" => Value::from(d.name.clone()),
        _ => d
            .params
            .get(col.strip_prefix("params.").unwrap_or(col))
            .cloned()?,
    })
}

/// The distribution a histogram/CDF spec names: its `distribution`, else
/// `latency` if there is one, else the first.
pub fn distribution_name(ds: &[Distribution], p: &PlotSpec) -> Option<String> {
    if let Some(n) = &p.distribution {
        return Some(n.clone());
    }
    if ds.iter().any(|d| d.name == "latency") {
        return Some("latency".into());
    }
    ds.first().map(|d| d.name.clone())
}

/// `kind = "histogram"` or `"cdf"`: one curve per group of distributions
/// (repeats and runs of one group merged by summing their buckets).
pub fn distribution_figure(ds: &[Distribution], p: &PlotSpec, experiment: &str) -> Option<Figure> {
    let name = distribution_name(ds, p)?;
    let picked: Vec<&Distribution> = ds
        .iter()
        .filter(|d| d.name == name && crate::distributions::total(&d.buckets) > 0)
        .filter(|d| p.vm.as_deref().map_or(true, |vm| d.vm == vm))
        .filter(|d| p.phase.as_deref().map_or(true, |ph| d.phase == ph))
        .filter(|d| {
            p.filter
                .iter()
                .flatten()
                .all(|(k, want)| same(dist_value(d, k).as_ref(), want))
        })
        .collect();
    if picked.is_empty() {
        return None;
    }
    let cols = p.series.clone().unwrap_or_else(|| {
        let mut c = vec!["phase".to_string(), "vm".to_string()];
        let mut keys: Vec<String> = picked
            .iter()
            .flat_map(|d| d.params.keys().cloned())
            .collect();
        keys.sort();
        keys.dedup();
        c.extend(keys);
        varying(c, &picked, |d, c| dist_value(d, c))
    });
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<String, Vec<&Distribution>> = BTreeMap::new();
    for d in &picked {
        let label = series_label(&cols, &|c| dist_value(d, c));
        if !order.contains(&label) {
            order.push(label.clone());
        }
        groups.entry(label).or_default().push(d);
    }
    // Unit: ns shown as µs when the typical value is 1 µs or more.
    let unit = picked[0].unit.clone();
    let lo = picked
        .iter()
        .filter_map(|d| d.buckets.first().map(|b| b.0))
        .fold(f64::INFINITY, f64::min);
    let hi = picked
        .iter()
        .filter_map(|d| d.buckets.last().map(|b| b.1))
        .fold(0.0_f64, f64::max);
    let mid = if lo > 0.0 { (lo * hi).sqrt() } else { hi / 2.0 };
    let (unit_shown, scale) = match unit.as_str() {
        "ns" if mid >= 1e3 => ("µs".to_string(), 1e3),
        "us" | "µs" if mid >= 1e3 => ("ms".to_string(), 1e3),
        u => (if u == "us" { "µs" } else { u }.to_string(), 1.0),
    };
    let cdf = p.kind == PlotKind::Cdf;
    let mut curves = Vec::new();
    for label in &order {
        let members = groups.get(label).map_or(&[][..], |v| &v[..]);
        let merged = merge_buckets(members.iter().copied());
        let scaled: Vec<(f64, f64, u64)> = merged
            .iter()
            .map(|&(l, h, n)| (l / scale, h / scale, n))
            .collect();
        let q = |x: f64| {
            crate::distributions::quantile(&scaled, x)
                .map_or_else(String::new, crate::plot_axis::eng)
        };
        let stats = format!("p50 {} {unit_shown}, p99 {} {unit_shown}", q(0.5), q(0.99));
        let name = if label.is_empty() {
            stats
        } else {
            format!("{label} ({stats})")
        };
        let pts = if cdf {
            cdf_points(&scaled)
        } else {
            histogram_steps(&scaled)
        };
        curves.push(Curve {
            name,
            points: pts.into_iter().map(|(x, y)| Pt::at(x, y)).collect(),
            style: if cdf { Style::Line } else { Style::Steps },
        });
    }
    let xs = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.x))
        .filter(|x| *x > 0.0);
    let log_x = p.log_x.unwrap_or_else(|| spans_decades(xs));
    let what = humanise(&name);
    let (y_label, title_what) = if cdf {
        ("Cumulative share of samples (%)", "CDF")
    } else {
        ("Share of samples (%)", "histogram")
    };
    Some(Figure {
        title: p
            .title
            .clone()
            .unwrap_or_else(|| format!("{experiment}: {} {title_what}", lower_first(&what))),
        x: Axis {
            label: p
                .x_label
                .clone()
                .unwrap_or_else(|| format!("{what} ({unit_shown})")),
            log: log_x,
            ..Axis::default()
        },
        y: Axis {
            label: p.y_label.clone().unwrap_or_else(|| y_label.to_string()),
            log: p.log_y.unwrap_or(false),
            range: cdf.then_some((0.0, 100.0)),
            ..Axis::default()
        },
        curves,
    })
}

/// Sample fields that are device-wide (the same in every line of a
/// sample): drawn once, from the `all` line.
pub const DEVICE_FIELDS: [&str; 12] = [
    "cxl_ratio",
    "resident_dram_pages",
    "resident_cxl_pages",
    "shared_pages",
    "placed_dram_pages",
    "placed_cxl_pages",
    "achieved_cxl_share",
    "device_dirty_pages",
    "device_evictions",
    "pool_resident_bytes",
    "pool_prefetch_stores",
    "policy",
];

/// The run a time series shows: `run`, else the first ok run whose rows
/// match `filter`.
pub fn timeseries_run(res: &ResultsFile, p: &PlotSpec) -> Option<u32> {
    if let Some(r) = p.run {
        return Some(r);
    }
    res.rows
        .iter()
        .filter(|r| is_ok(r))
        .find(|r| {
            p.filter
                .iter()
                .flatten()
                .all(|(k, want)| same(r.get(k), want))
        })
        .and_then(|r| r.get("run").and_then(Value::as_u64))
        .and_then(|r| u32::try_from(r).ok())
}

/// The fields a time series draws (default: `traps`).
pub fn timeseries_fields(p: &PlotSpec) -> Vec<String> {
    p.fields
        .clone()
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| vec!["traps".to_string()])
}

/// `kind = "timeseries"` from the text of a run's `metrics.jsonl`: x =
/// seconds since the first sample, one curve per VM and field (the
/// device-wide fields once).
pub fn timeseries_figure(series_text: &str, p: &PlotSpec, title: &str) -> Option<Figure> {
    let (samples, _) = parse_series(series_text);
    let t0 = samples
        .iter()
        .map(|s| s.ts_unix_ms)
        .filter(|t| *t > 0)
        .min()?;
    let fields = timeseries_fields(p);
    let mut vms: Vec<String> = Vec::new();
    for s in &samples {
        if !vms.contains(&s.vm) {
            vms.push(s.vm.clone());
        }
    }
    // Per-VM lines for the VMs; `all` only when asked for (or alone).
    let per_vm: Vec<String> = match &p.vm {
        Some(v) => vec![v.clone()],
        None => {
            let v: Vec<String> = vms.iter().filter(|v| *v != "all").cloned().collect();
            if v.is_empty() {
                vms.clone()
            } else {
                v
            }
        }
    };
    let mut curves = Vec::new();
    for f in &fields {
        let info = y_info(p, f);
        let device_wide = DEVICE_FIELDS.contains(&f.as_str());
        let lines: Vec<String> = if device_wide {
            vec![if vms.iter().any(|v| v == "all") {
                "all".to_string()
            } else {
                vms.first().cloned().unwrap_or_default()
            }]
        } else {
            per_vm.clone()
        };
        for vm in lines {
            let points: Vec<Pt> = samples
                .iter()
                .filter(|s| s.vm == vm && s.ts_unix_ms >= t0)
                .filter_map(|s| {
                    let y = s.fields.get(f.as_str()).and_then(Value::as_f64)?;
                    Some(Pt::at((s.ts_unix_ms - t0) as f64 / 1e3, y / info.scale))
                })
                .collect();
            if points.is_empty() {
                continue;
            }
            let who = if device_wide {
                "device".to_string()
            } else {
                vm.clone()
            };
            let name = if fields.len() == 1 {
                who
            } else {
                format!("{who}: {}", lower_first(&info.name))
            };
            curves.push(Curve {
                name,
                points,
                style: Style::Line,
            });
        }
    }
    if curves.is_empty() {
        return None;
    }
    let infos: Vec<AxisInfo> = fields.iter().map(|f| y_info(p, f)).collect();
    let y_label = if infos.len() == 1 {
        infos[0].label()
    } else if infos.iter().all(|i| i.unit == infos[0].unit) {
        let unit = &infos[0].unit;
        let all_pages = fields.iter().all(|f| f.ends_with("pages") || f == "traps");
        let n = if all_pages { "Pages" } else { "Value" };
        if unit.is_empty() {
            n.to_string()
        } else {
            format!("{n} ({unit})")
        }
    } else {
        "Value".to_string()
    };
    let ys = curves.iter().flat_map(|c| c.points.iter().map(|p| p.y));
    Some(Figure {
        title: title.to_string(),
        x: Axis {
            label: p
                .x_label
                .clone()
                .unwrap_or_else(|| "Time since the first sample (s)".to_string()),
            log: p.log_x.unwrap_or(false),
            ..Axis::default()
        },
        y: Axis {
            label: p.y_label.clone().unwrap_or(y_label),
            log: p.log_y.unwrap_or_else(|| spans_decades(ys)),
            ..Axis::default()
        },
        curves,
    })
}

/// Reads `DIR/runs/NNN/metrics.jsonl` (None: no such file).
pub fn read_series(dir: &Path, run: u32) -> Option<String> {
    std::fs::read_to_string(
        dir.join("runs")
            .join(format!("{run:03}"))
            .join("metrics.jsonl"),
    )
    .ok()
}

/// Reads a guest phase's series `DIR/runs/NNN/out/VM/PHASE/FILE` (lines
/// with the guest's uptime `t_s`) as a `metrics.jsonl` text of that VM
/// (`ts_unix_ms` from `t_s`); None: no such file, or a name that is not a
/// plain file name.
pub fn read_phase_series(
    dir: &Path,
    run: u32,
    vm: &str,
    phase: &str,
    file: &str,
) -> Option<String> {
    let plain = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != "..";
    if !(plain(vm) && plain(phase) && plain(file)) {
        return None;
    }
    let path = dir
        .join("runs")
        .join(format!("{run:03}"))
        .join("out")
        .join(vm)
        .join(phase)
        .join(file);
    let text = std::fs::read_to_string(path).ok()?;
    let mut out = String::new();
    for line in text.lines() {
        let Ok(Value::Object(mut o)) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(t) = o.remove("t_s").and_then(|t| t.as_f64()) else {
            continue;
        };
        o.insert("ts_unix_ms".into(), Value::from((t * 1e3).round() as u64));
        o.insert("vm".into(), Value::from(vm));
        out.push_str(&Value::Object(o).to_string());
        out.push('\n');
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn repeats_become_mean_min_max() {
        let pts = group_mean_min_max(&[(2.0, 10.0), (1.0, 5.0), (2.0, 20.0), (2.0, 30.0)]);
        assert_eq!(pts.len(), 2);
        assert_eq!(
            pts[0],
            Pt {
                x: 1.0,
                y: 5.0,
                lo: 5.0,
                hi: 5.0,
                n: 1
            }
        );
        assert_eq!(
            pts[1],
            Pt {
                x: 2.0,
                y: 20.0,
                lo: 10.0,
                hi: 30.0,
                n: 3
            }
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(number_of(&json!("16MiB")), Some(16.0 * 1048576.0));
        assert_eq!(number_of(&json!("4k")), Some(4096.0));
        assert_eq!(number_of(&json!(5)), Some(5.0));
        assert_eq!(number_of(&json!("lru")), None);
        assert_eq!(number_of(&json!("2q")), None);
    }

    fn d(phase: &str, numa: &str, repeat: u32, buckets: Vec<(f64, f64, u64)>) -> Distribution {
        Distribution {
            run: repeat + 1,
            point: 0,
            repeat,
            phase: phase.into(),
            vm: "vm0".into(),
            params: [("phase.numa".to_string(), json!(numa))].into(),
            name: "latency".into(),
            unit: "ns".into(),
            buckets,
        }
    }

    #[test]
    fn histogram_and_cdf_from_buckets() {
        let b = vec![
            (100.0, 200.0, 60),
            (200.0, 400.0, 20),
            (50_000.0, 100_000.0, 20),
        ];
        let steps = histogram_steps(&b);
        assert_eq!(
            steps,
            vec![
                (100.0, 0.0),
                (100.0, 60.0),
                (200.0, 60.0),
                (200.0, 20.0),
                (400.0, 20.0),
                (400.0, 0.0),
                (50_000.0, 0.0),
                (50_000.0, 20.0),
                (100_000.0, 20.0),
                (100_000.0, 0.0)
            ]
        );
        let cdf = cdf_points(&b);
        assert_eq!(cdf.first(), Some(&(100.0, 0.0)));
        assert_eq!(cdf.last(), Some(&(100_000.0, 100.0)));
        assert!(cdf.windows(2).all(|w| w[1].1 >= w[0].1 && w[1].0 >= w[0].0));
        assert_eq!(cdf[3], (400.0, 80.0));
        assert!(histogram_steps(&[]).is_empty());
        // Repeats of one group are summed; groups by the swept key.
        let ds = vec![
            d("p", "dram", 0, vec![(100.0, 200.0, 10)]),
            d("p", "dram", 1, vec![(100.0, 200.0, 30), (200.0, 400.0, 10)]),
            d("p", "cxl", 0, vec![(50_000.0, 100_000.0, 5)]),
        ];
        let m = merge_buckets(&ds[..2]);
        assert_eq!(m, vec![(100.0, 200.0, 40), (200.0, 400.0, 10)]);
        let p = PlotSpec {
            kind: PlotKind::Histogram,
            ..PlotSpec::default()
        };
        let f = distribution_figure(&ds, &p, "t").unwrap();
        assert_eq!(f.curves.len(), 2);
        assert!(
            f.curves[0].name.starts_with("NUMA: dram"),
            "{}",
            f.curves[0].name
        );
        assert!(f.x.log, "100 ns .. 100 µs spans decades");
        assert_eq!(f.x.label, "Latency (µs)");
        // 40 of 50 in the first bucket, now in µs.
        assert!(f.curves[0].points.contains(&Pt::at(0.1, 80.0)));
        let p = PlotSpec {
            kind: PlotKind::Cdf,
            log_x: Some(false),
            filter: Some([("phase.numa".to_string(), json!("cxl"))].into()),
            ..PlotSpec::default()
        };
        let f = distribution_figure(&ds, &p, "t").unwrap();
        assert_eq!(f.curves.len(), 1);
        assert!(!f.x.log);
        assert_eq!(f.curves[0].points.last().unwrap().y, 100.0);
    }

    #[test]
    fn an_identity_line_spans_the_x_axis() {
        let mut res = ResultsFile::new("t", vec![]);
        for (run, modeled, felt) in [(1, 20_000.0, 60_000.0), (2, 40_000.0, 80_000.0)] {
            res.push([
                json!({"run": run, "status": "ok", "vm": "vm0", "phase": "memory",
                "modeled_miss_ns": modeled, "miss_p50_ns": felt})
                .as_object()
                .unwrap()
                .clone(),
            ]);
        }
        let mut p = PlotSpec {
            x: "modeled_miss_ns".into(),
            y: "miss_p50_ns".into(),
            ..PlotSpec::default()
        };
        assert_eq!(line_figure(&res, &p).unwrap().curves.len(), 1);
        p.identity_line = true;
        let f = line_figure(&res, &p).unwrap();
        let line = f.curves.last().unwrap();
        assert_eq!(line.name, "y = x");
        // From 0 to the largest x, in the axes' unit (µs).
        assert_eq!(line.points, [Pt::at(0.0, 0.0), Pt::at(40.0, 40.0)]);
    }

    #[test]
    fn y_also_draws_a_line_per_series_and_column() {
        let mut res = ResultsFile::new("t", vec![]);
        for (run, mode, p50, p99) in [
            (1, "file", 30_000.0, 90_000.0),
            (2, "memory", 25_000.0, 70_000.0),
        ] {
            res.push([
                json!({"run": run, "status": "ok", "vm": "vm0", "mode": mode,
                "modeled_miss_ns": 20_000.0, "miss_p50_ns": p50, "miss_p99_ns": p99})
                .as_object()
                .unwrap()
                .clone(),
            ]);
        }
        let p = PlotSpec {
            x: "modeled_miss_ns".into(),
            y: "miss_p50_ns".into(),
            y_also: vec!["miss_p99_ns".into()],
            series: Some(vec!["mode".into()]),
            ..PlotSpec::default()
        };
        let f = line_figure(&res, &p).unwrap();
        let names: Vec<&str> = f.curves.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "mode: file, median",
                "mode: file, p99",
                "mode: memory, median",
                "mode: memory, p99"
            ]
        );
        assert_eq!(f.curves[1].points, [Pt::at(20.0, 90.0)]);
    }

    #[test]
    fn timeseries_reads_per_vm_and_device_fields() {
        let text = r#"{"ts_unix_ms":1000,"seq":0,"vm":"vm0","traps":0,"resident_cxl_pages":0}
{"ts_unix_ms":1000,"seq":0,"vm":"vm1","traps":0,"resident_cxl_pages":0}
{"ts_unix_ms":1000,"seq":0,"vm":"all","traps":0,"resident_cxl_pages":0}
{"ts_unix_ms":2000,"seq":1,"vm":"vm0","traps":100,"resident_cxl_pages":150}
{"ts_unix_ms":2000,"seq":1,"vm":"vm1","traps":50,"resident_cxl_pages":150}
{"ts_unix_ms":2000,"seq":1,"vm":"all","traps":150,"resident_cxl_pages":150}
"#;
        let p = PlotSpec {
            kind: PlotKind::Timeseries,
            fields: Some(vec!["traps".into(), "resident_cxl_pages".into()]),
            ..PlotSpec::default()
        };
        let f = timeseries_figure(text, &p, "t").unwrap();
        let names: Vec<&str> = f.curves.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "vm0: file pages faulted in (DAX traps)",
                "vm1: file pages faulted in (DAX traps)",
                "device: pages in the device cache"
            ]
        );
        assert_eq!(f.curves[0].points[1], Pt::at(1.0, 100.0));
        assert_eq!(f.y.label, "Pages");
        assert!(timeseries_figure("", &p, "t").is_none());
    }

    #[test]
    fn a_guest_phase_series_reads_as_its_vm_s_samples() {
        let dir = std::env::temp_dir().join(format!("cxlfs-phase-series-{}", std::process::id()));
        let at = dir.join("runs/002/out/vm0/chase");
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(
            at.join("vmstat.jsonl"),
            "{\"t_s\":4.5,\"pgpromote_success\":0}\nnot json\n{\"t_s\":6.0,\"pgpromote_success\":48}\n",
        )
        .unwrap();
        let text = read_phase_series(&dir, 2, "vm0", "chase", "vmstat.jsonl").unwrap();
        let p = PlotSpec {
            kind: PlotKind::Timeseries,
            fields: Some(vec!["pgpromote_success".into()]),
            vm: Some("vm0".into()),
            ..PlotSpec::default()
        };
        let f = timeseries_figure(&text, &p, "t").unwrap();
        assert_eq!(f.curves.len(), 1);
        assert_eq!(f.curves[0].points, [Pt::at(0.0, 0.0), Pt::at(1.5, 48.0)]);
        assert!(read_phase_series(&dir, 2, "vm0", "chase", "../x").is_none());
        assert!(read_phase_series(&dir, 3, "vm0", "chase", "vmstat.jsonl").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
