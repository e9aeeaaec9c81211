//! `[[plots]]` in an experiment spec: which figure to draw from a results
//! directory (read by `cxlfs plot` and at the end of `cxlfs run`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// What a figure shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlotKind {
    /// `y` against `x` from `results.json`: the mean over repeats with
    /// min–max whiskers, one line per series (bars for a non-numeric x).
    #[default]
    Line,
    /// A histogram from `distributions.jsonl` (share of samples per bucket).
    Histogram,
    /// A cumulative distribution from `distributions.jsonl`.
    Cdf,
    /// Fields of one run's `runs/NNN/metrics.jsonl` over time.
    Timeseries,
}

/// `[[plots]]`: one figure, written as a PNG and an SVG beside it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlotSpec {
    /// What the figure shows (default: `line`).
    #[serde(default)]
    pub kind: PlotKind,
    /// `line`: the column on the x axis (a swept key, `cxl_ratio`,
    /// `policy`, ...). Unused by the other kinds.
    #[serde(default)]
    pub x: String,
    /// `line`: the column on the y axis (`read_bw_bytes_per_sec`,
    /// `device_misses`, `out.read_mb_s`, ...). Unused by the other kinds.
    #[serde(default)]
    pub y: String,
    /// `line`: more columns drawn against the same x on the same y axis
    /// (a p99 beside a p50): one line per series and column, the column's
    /// name in the legend. Unused by the other kinds.
    #[serde(default)]
    pub y_also: Vec<String>,
    /// Columns whose values make one line each. `line` default: `vm` and
    /// `phase`; `histogram`/`cdf` default: whichever of `phase`, `vm` and
    /// the run's swept keys (`params`) differ between the distributions
    /// (runs and repeats are merged); `timeseries`: `vm` (always).
    #[serde(default)]
    pub series: Option<Vec<String>>,
    /// Only rows (distributions, series lines) of this VM (`all` for the
    /// aggregate); default: every row.
    #[serde(default)]
    pub vm: Option<String>,
    /// Only rows (distributions) of this phase; default: every phase.
    #[serde(default)]
    pub phase: Option<String>,
    /// Only rows whose columns have these values (`{ "daemon.cxl_ratio" =
    /// 50 }`); for `timeseries`, picks the first `ok` run that matches.
    #[serde(default)]
    pub filter: Option<BTreeMap<String, Value>>,
    /// Title (default: the experiment's name and what is plotted).
    #[serde(default)]
    pub title: Option<String>,
    /// X axis title (default: from the column name, with its unit).
    #[serde(default)]
    pub x_label: Option<String>,
    /// Y axis title (default: from the column name, with its unit).
    #[serde(default)]
    pub y_label: Option<String>,
    /// Divide y values by this (default: the column's own scale, e.g. 1e6
    /// for bytes/s shown as MB/s). Set it with `y_label`.
    #[serde(default)]
    pub y_scale: Option<f64>,
    /// Logarithmic x axis; default: when the positive data spans two
    /// decades or more.
    #[serde(default)]
    pub log_x: Option<bool>,
    /// Logarithmic y axis; default: as `log_x` for `line` and
    /// `timeseries`, linear for `histogram` and `cdf`.
    #[serde(default)]
    pub log_y: Option<bool>,
    /// `histogram`/`cdf`: the distribution's `name` (default: `latency`,
    /// else the first name found).
    #[serde(default)]
    pub distribution: Option<String>,
    /// `timeseries`: the sample fields on the y axis (flattened as in the
    /// `metrics.*` columns: `traps`, `resident_cxl_pages`,
    /// `trap_latency_ns.p99`); default: `["traps"]`.
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    /// `timeseries`: a file each guest command phase wrote, one JSON object
    /// per line with the guest's uptime `t_s` (`vmstat.jsonl`), read from
    /// `runs/NNN/out/VM/PHASE/` (`vm` and `phase` say which); default: the
    /// daemon's `runs/NNN/metrics.jsonl`.
    #[serde(default)]
    pub source: Option<String>,
    /// `timeseries`: the run to draw (default: the first `ok` run that
    /// matches `filter`).
    #[serde(default)]
    pub run: Option<u32>,
    /// Output file name (default: `Y-vs-X.png`, `KIND-NAME.png`, ...); the
    /// SVG takes the same name with `.svg`.
    #[serde(default)]
    pub file: Option<String>,
    /// Line plots: draw the line y = x across the x values (where the y axis
    /// equals the x axis: felt against modeled latency, both in one unit).
    #[serde(default)]
    pub identity_line: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn old_specs_still_parse_and_new_fields_are_optional() {
        let p: PlotSpec = toml::from_str(
            r#"x = "fio.size"
               y = "read_bw_bytes_per_sec"
               series = ["phase"]
               vm = "all"
               log_x = true
               title = "t""#,
        )
        .unwrap();
        assert_eq!(p.kind, PlotKind::Line);
        assert_eq!(p.log_x, Some(true));
        assert_eq!(p.log_y, None);
        let p: PlotSpec = toml::from_str(
            r#"kind = "timeseries"
               fields = ["traps"]
               filter = { "daemon.cxl_ratio" = 50 }
               log_x = false"#,
        )
        .unwrap();
        assert_eq!(p.kind, PlotKind::Timeseries);
        assert_eq!(p.log_x, Some(false));
        assert_eq!(p.filter.unwrap()["daemon.cxl_ratio"], 50);
        assert!(toml::from_str::<PlotSpec>("kind = \"pie\"").is_err());
        assert!(toml::from_str::<PlotSpec>("x = \"a\"\nlogx = true").is_err());
    }
}
