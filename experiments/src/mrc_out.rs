//! `cxlfs mrc`'s output: the curves as a table, as JSON lines, as a plot.

use crate::device_args::{human_size, summary};
use crate::plot::{write_figure, PlotError};
use crate::plot_data::{Axis, Curve, Figure, Pt, Style};
use crate::replay_cmd::Input;
use anyhow::Result;
use cxlfs_device_model::mrc::minisim::Miniature;
use cxlfs_device_model::mrc::shards::Sample;
use cxlfs_device_model::replay::Arrival;
use cxlfs_device_model::{DeviceConfig, PolicyKind};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a curve was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// One pass: LRU stack distances, LIFO thresholds.
    Exact,
    /// Miniature simulations of a spatial sample.
    Sampled,
    /// LRU stack distances of a spatial sample, scaled by 1/R (SHARDS);
    /// `sampled` in JSON, as the miniatures.
    #[serde(rename = "sampled")]
    SampledStack,
    /// One full replay per size.
    Replay,
}

impl Method {
    fn describe(self) -> &'static str {
        match self {
            Method::Exact => "exact (one pass: LRU stack distances, LIFO thresholds)",
            Method::Sampled => "sampled (miniature caches of size × R on a spatial sample)",
            Method::SampledStack => {
                "sampled (stack distances of a spatial sample, scaled by 1/R: SHARDS)"
            }
            Method::Replay => "one full replay per size",
        }
    }
}

/// One point of a curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CurvePoint {
    /// Cache size.
    pub size_bytes: u64,
    /// Misses over page lookups (sampled: estimated).
    pub miss_ratio: f64,
    /// Counted misses (exact and replay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub misses: Option<u64>,
    /// Counted page lookups (exact and replay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_accesses: Option<u64>,
    /// Sampled: the rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampling_rate: Option<f64>,
    /// Sampled: the sampling hash's seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampling_seed: Option<u64>,
    /// Sampled: the share of the input's distinct pages the sample holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub realized_rate: Option<f64>,
    /// Sampled: distinct pages in the sample.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampled_pages: Option<u64>,
    /// Sampled: the miniature cache's size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub miniature_bytes: Option<u64>,
}

impl CurvePoint {
    /// A point from counted misses.
    pub fn counted(size_bytes: u64, misses: u64, page_accesses: u64) -> Self {
        CurvePoint {
            size_bytes,
            miss_ratio: if page_accesses == 0 {
                0.0
            } else {
                misses as f64 / page_accesses as f64
            },
            misses: Some(misses),
            page_accesses: Some(page_accesses),
            sampling_rate: None,
            sampling_seed: None,
            realized_rate: None,
            sampled_pages: None,
            miniature_bytes: None,
        }
    }

    /// A miniature's point: at the rate of the sample it ran on, a part of
    /// `sample` where its size's rate is lower.
    pub fn sampled(m: &Miniature, sample: &Sample) -> Self {
        CurvePoint {
            miniature_bytes: Some(m.mini_size_bytes),
            sampling_rate: Some(m.rate),
            realized_rate: Some(m.realized_rate),
            sampled_pages: Some(m.sampled_pages),
            ..CurvePoint::estimated(m.size_bytes, m.miss_ratio, sample)
        }
    }

    /// A point estimated from `sample` (no miniature: sampled stack distances).
    pub fn estimated(size_bytes: u64, miss_ratio: f64, sample: &Sample) -> Self {
        CurvePoint {
            size_bytes,
            miss_ratio,
            misses: None,
            page_accesses: None,
            sampling_rate: Some(sample.rate),
            sampling_seed: Some(sample.seed),
            realized_rate: Some(sample.realized_rate),
            sampled_pages: Some(sample.pages()),
            miniature_bytes: None,
        }
    }
}

/// One policy's curve.
#[derive(Debug, Clone)]
pub struct PolicyCurve {
    /// The policy.
    pub policy: PolicyKind,
    /// How its points were computed.
    pub method: Method,
    /// Ascending sizes.
    pub points: Vec<CurvePoint>,
}

/// One JSON line.
#[derive(Serialize)]
struct JsonPoint<'a> {
    policy: &'static str,
    method: Method,
    #[serde(flatten)]
    point: &'a CurvePoint,
}

/// Prints the curves: JSON lines, or a header and a table of miss ratios
/// (a row per size, a column per policy).
pub fn print(
    json: bool,
    cfg: &DeviceConfig,
    input: &Input,
    arrival: Arrival,
    curves: &[PolicyCurve],
    elapsed: Duration,
) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if json {
        for c in curves {
            for point in &c.points {
                let line = JsonPoint {
                    policy: c.policy.name(),
                    method: c.method,
                    point,
                };
                serde_json::to_writer(&mut out, &line)?;
                writeln!(out)?;
            }
        }
        return Ok(());
    }
    let input = match input {
        Input::Trace(path) => format!("trace {}", path.display()),
        Input::Workload(spec) => format!("workload {spec}"),
    };
    writeln!(out, "device: {}", summary(cfg))?;
    writeln!(out, "input: {input} | arrival {arrival}")?;
    for c in curves {
        let mut line = format!("{}: {}", c.policy.name(), c.method.describe());
        // The largest size's rate is the curve's; smaller sizes may run
        // at higher ones (miniatures of at least `--miniature-floor` pages).
        if let Some(p) = c.points.last().filter(|p| p.sampling_rate.is_some()) {
            line += &format!(
                ", R = {:.5} ({:.5} of the pages), {} sampled pages",
                p.sampling_rate.unwrap_or(0.0),
                p.realized_rate.unwrap_or(0.0),
                p.sampled_pages.unwrap_or(0)
            );
            let top = c
                .points
                .iter()
                .filter_map(|p| p.sampling_rate)
                .fold(0.0, f64::max);
            if top > p.sampling_rate.unwrap_or(0.0) {
                line += &format!("; up to R = {top:.5} at the smaller sizes");
            }
        }
        writeln!(out, "{line}")?;
    }
    writeln!(out)?;
    write!(out, "{}", table(curves))?;
    writeln!(out, "\n{:.3} s for the curves", elapsed.as_secs_f64())?;
    Ok(())
}

/// Miss ratios in %, a row per size, a column per policy.
fn table(curves: &[PolicyCurve]) -> String {
    let mut header = vec!["cache size".to_string()];
    header.extend(curves.iter().map(|c| format!("{} miss %", c.policy.name())));
    let mut rows = vec![header];
    let sizes = curves.first().map_or(0, |c| c.points.len());
    for i in 0..sizes {
        let size = curves[0].points[i].size_bytes;
        let mut row = vec![human_size(size)];
        row.extend(curves.iter().map(|c| {
            c.points
                .get(i)
                .map_or(String::new(), |p| format!("{:.2}", p.miss_ratio * 100.0))
        }));
        rows.push(row);
    }
    crate::text_table::aligned(&rows, 1)
}

/// Draws the curves as `file` with the extension `png`, and the SVG beside it.
pub fn plot(file: &Path, curves: &[PolicyCurve]) -> Result<Vec<PathBuf>, PlotError> {
    let png = file.with_extension("png");
    let fig = Figure {
        title: "Miss ratio against cache size".to_string(),
        x: Axis {
            label: "Cache size (MiB)".to_string(),
            log: true,
            ..Axis::default()
        },
        y: Axis {
            label: "Miss ratio (% of page lookups)".to_string(),
            ..Axis::default()
        },
        curves: curves
            .iter()
            .map(|c| Curve {
                name: format!("{} ({})", c.policy.name(), method_word(c.method)),
                points: c
                    .points
                    .iter()
                    .map(|p| {
                        Pt::at(
                            p.size_bytes as f64 / (1024.0 * 1024.0),
                            p.miss_ratio * 100.0,
                        )
                    })
                    .collect(),
                style: Style::Line,
            })
            .collect(),
    };
    write_figure(&fig, &png)?;
    Ok(vec![png.clone(), png.with_extension("svg")])
}

fn method_word(m: Method) -> &'static str {
    match m {
        Method::Exact => "exact",
        Method::Sampled | Method::SampledStack => "sampled",
        Method::Replay => "replayed",
    }
}
