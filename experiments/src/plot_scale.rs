//! The axes of a figure as drawn: a [`Scale`] (range, major and minor
//! ticks in drawing coordinates — log10 on a log axis — and tick labels)
//! chosen from an [`Axis`] and the curves' points, and [`Ticked`], the
//! plotters coordinate whose grid lines are exactly those ticks.

use crate::plot_axis::{eng, linear_ticks, log_ticks, nice_ceiling};
use crate::plot_data::{Axis, Curve, Style};
use plotters::coord::ranged1d::Ranged;

/// One axis as drawn: its range and ticks in drawing coordinates (log10
/// for a log axis), and how a tick is labelled.
pub(crate) struct Scale {
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    ticks: Vec<f64>,
    minor: Vec<f64>,
    pub(crate) log: bool,
    categories: Vec<String>,
}

impl Scale {
    /// A data value in drawing coordinates.
    pub(crate) fn t(&self, v: f64) -> f64 {
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

    /// The label of a tick at `v` (drawing coordinates).
    pub(crate) fn label(&self, v: f64) -> String {
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
pub(crate) fn x_scale(ax: &Axis, curves: &[Curve], pad: bool) -> Scale {
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

/// The y scale: every point's min–max spread, with zero in it when a
/// linear axis has bars.
pub(crate) fn y_scale(ax: &Axis, curves: &[Curve]) -> Scale {
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

/// A numeric scale over `vals` (or the axis's own range): log decades or
/// 1-2-5 ticks (from zero when `from_zero`), 4 % padding when `pad`.
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

/// A linear f64 axis (in drawing coordinates) whose grid lines and labels
/// are exactly the given ticks.
#[derive(Debug, Clone)]
pub(crate) struct Ticked {
    lo: f64,
    hi: f64,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl Ticked {
    /// The axis of a scale: its range, its ticks inside it.
    pub(crate) fn of(s: &Scale) -> Self {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::plot_data::Pt;

    #[test]
    fn ticks_read_well() {
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
