//! `[[plots]]` in an experiment spec: which figure to draw from a results
//! directory (read by `cxlfs plot` and at the end of `cxlfs run`).

use serde::{Deserialize, Serialize};

/// `[[plots]]`: one PNG.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlotSpec {
    /// Column on the x axis (a swept key, `cxl_ratio`, `policy`, ...).
    pub x: String,
    /// Column on the y axis (`read_bw_bytes_per_sec`, `device_misses`, ...).
    pub y: String,
    /// Columns whose values make one line each (default: `vm` and `phase`).
    #[serde(default)]
    pub series: Option<Vec<String>>,
    /// Only rows of this VM (`all` for the aggregate); default: every row.
    #[serde(default)]
    pub vm: Option<String>,
    /// Title (default: "Y vs X").
    #[serde(default)]
    pub title: Option<String>,
    /// Logarithmic x axis.
    #[serde(default)]
    pub log_x: bool,
    /// Output file name (default: `Y-vs-X.png`).
    #[serde(default)]
    pub file: Option<String>,
}
