//! The results of `cxlfs run`: rows (one per run, phase and VM, plus `vm =
//! all`), written as `results.csv` and `results.json` after every run (so
//! an interrupted sweep keeps what it measured), and read back by `cxlfs
//! plot` / `cxlfs table` (whose argument, the directory, is
//! [`ResultsDirArgs`]).

use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::io;
use std::path::{Path, PathBuf};

/// `cxlfs plot` / `cxlfs table` arguments.
#[derive(Debug, Clone, Args)]
pub struct ResultsDirArgs {
    /// A results directory written by `cxlfs run`.
    #[arg(value_name = "RESULTS_DIR")]
    pub dir: PathBuf,
}

/// One row: column → cell (`null` = empty).
pub type Row = Map<String, Value>;

/// Columns that always come first, in this order.
pub const LEADING_COLUMNS: [&str; 10] = [
    "run",
    "point",
    "repeat",
    "phase",
    "status",
    "error",
    "vm",
    "vms",
    "cxl_ratio",
    "policy",
];

/// Figures that come right after the swept parameters, in this order.
pub const MAIN_FIGURES: [&str; 19] = [
    "read_bw_bytes_per_sec",
    "write_bw_bytes_per_sec",
    "read_iops",
    "write_iops",
    "device_hits",
    "device_misses",
    "device_hit_rate",
    "read_clat_mean_ns",
    "read_clat_p50_ns",
    "read_clat_p90_ns",
    "read_clat_p99_ns",
    "read_clat_p999_ns",
    "write_clat_mean_ns",
    "write_clat_p50_ns",
    "write_clat_p90_ns",
    "write_clat_p99_ns",
    "write_clat_p999_ns",
    "elapsed_s",
    "fio_runtime_ms",
];

/// Everything in `results.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ResultsFile {
    /// The experiment's name.
    pub experiment: String,
    /// The swept keys (also columns).
    pub param_columns: Vec<String>,
    /// Every column, in CSV order.
    pub columns: Vec<String>,
    /// The rows.
    pub rows: Vec<Row>,
}

/// Why results could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// A file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// `results.json` is malformed.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: String,
        /// What is wrong.
        source: serde_json::Error,
    },
}

impl ResultsFile {
    /// An empty result set.
    pub fn new(experiment: &str, param_columns: Vec<String>) -> Self {
        ResultsFile {
            experiment: experiment.to_string(),
            param_columns,
            columns: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// Adds rows and recomputes the column list: leading columns, swept
    /// keys, main figures, then everything else sorted.
    pub fn push(&mut self, rows: impl IntoIterator<Item = Row>) {
        self.rows.extend(rows);
        let mut cols: Vec<String> = LEADING_COLUMNS.iter().map(|s| s.to_string()).collect();
        for p in &self.param_columns {
            if !cols.contains(p) {
                cols.push(p.clone());
            }
        }
        for f in MAIN_FIGURES {
            if !cols.iter().any(|c| c == f) {
                cols.push(f.to_string());
            }
        }
        let mut rest: Vec<String> = self
            .rows
            .iter()
            .flat_map(|r| r.keys())
            .filter(|k| !cols.contains(k))
            .cloned()
            .collect();
        rest.sort();
        rest.dedup();
        cols.extend(rest);
        self.columns = cols;
    }

    /// The CSV text.
    pub fn to_csv(&self) -> String {
        let mut s = String::new();
        let header: Vec<String> = self.columns.iter().map(|c| csv_field(c)).collect();
        s.push_str(&header.join(","));
        s.push('\n');
        for r in &self.rows {
            let cells: Vec<String> = self
                .columns
                .iter()
                .map(|c| {
                    r.get(c)
                        .map(cell_text)
                        .map(|t| csv_field(&t))
                        .unwrap_or_default()
                })
                .collect();
            s.push_str(&cells.join(","));
            s.push('\n');
        }
        s
    }

    /// Writes `results.csv` and `results.json` into `dir` (each through a
    /// temp file and a rename, so a reader never sees half a file).
    pub fn write(&self, dir: &Path) -> Result<(), ResultsError> {
        let json = serde_json::to_string_pretty(self).map_err(|source| ResultsError::Json {
            path: "results.json".into(),
            source,
        })?;
        write_atomic(&dir.join("results.json"), json.as_bytes())?;
        write_atomic(&dir.join("results.csv"), self.to_csv().as_bytes())
    }

    /// Reads `dir/results.json`.
    pub fn read(dir: &Path) -> Result<ResultsFile, ResultsError> {
        let path = dir.join("results.json");
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|source| ResultsError::Io {
            path: shown.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| ResultsError::Json {
            path: shown,
            source,
        })
    }
}

/// Writes `path` through `path.tmp` and a rename.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), ResultsError> {
    let tmp = path.with_extension("tmp");
    let io_err = |source| ResultsError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::write(&tmp, data).map_err(io_err)?;
    std::fs::rename(&tmp, path).map_err(io_err)
}

/// A cell as text: numbers without a needless `.0`, strings as they are.
pub fn cell_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            (None, Some(f)) => format!("{f}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A number cell: integral values stored as integers, others rounded to
/// 6 significant digits (fio prints no more than that, and sums would
/// otherwise show float noise).
pub fn num(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9e15 {
        return Value::from(x as i64);
    }
    let rounded = format!("{x:.5e}").parse::<f64>().unwrap_or(x);
    serde_json::Number::from_f64(rounded).map_or(Value::Null, Value::Number)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn row(v: Value) -> Row {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn csv_has_leading_params_then_figures_and_quotes_cells() {
        let mut res = ResultsFile::new("t", vec!["daemon.cxl_ratio".into()]);
        res.push([
            row(
                json!({"run": 1, "status": "ok", "vm": "vm0", "daemon.cxl_ratio": 50,
                       "read_bw_bytes_per_sec": 1.5e6, "zzz": "a,b", "metrics.x": 2.25}),
            ),
            row(
                json!({"run": 2, "status": "failed", "vm": "all", "error": "fio said \"no\"\nbye"}),
            ),
        ]);
        let csv = res.to_csv();
        let mut lines = csv.lines();
        let header = lines.next().unwrap();
        assert!(header.starts_with("run,point,repeat,phase,status,error,vm,vms,cxl_ratio,policy,daemon.cxl_ratio,read_bw_bytes_per_sec,"), "{header}");
        assert!(header.ends_with(",metrics.x,zzz"), "{header}");
        let cols = header.split(',').count();
        let first = lines.next().unwrap();
        assert!(first.starts_with("1,,,,ok,,vm0,,,,50,1500000,"), "{first}");
        assert!(first.ends_with(",2.25,\"a,b\""), "{first}");
        assert_eq!(first.split(',').count(), cols + 1, "one quoted comma");
        assert!(csv.contains("\"fio said \"\"no\"\"\nbye\""), "{csv}");
    }

    #[test]
    fn results_round_trip_through_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut res = ResultsFile::new("t", vec![]);
        res.push([row(
            json!({"run": 1, "status": "ok", "vm": "all", "read_bw_bytes_per_sec": 3e6}),
        )]);
        res.write(dir.path()).unwrap();
        let back = ResultsFile::read(dir.path()).unwrap();
        assert_eq!(back.rows, res.rows);
        assert_eq!(back.columns, res.columns);
        let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
        assert_eq!(csv, res.to_csv());
        assert_eq!(cell_text(&num(2.0)), "2");
        assert_eq!(cell_text(&num(2.5)), "2.5");
        assert_eq!(cell_text(&num(11675.281858999999)), "11675.3");
        assert_eq!(cell_text(&num(0.123456789)), "0.123457");
        assert!(ResultsFile::read(&dir.path().join("nope")).is_err());
    }
}
