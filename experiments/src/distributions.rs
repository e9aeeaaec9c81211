//! Distributions a run collected (a probe's latency histogram, say):
//! `distributions.jsonl` in the results directory, one JSON object a line,
//! written by `cxlfs run` as runs end and read by `cxlfs plot`
//! (histogram and CDF figures).

use crate::results::ResultsError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;

/// The file name inside a results directory.
pub const FILE: &str = "distributions.jsonl";

/// Histogram buckets `(low, high, count)`: `low <= x < high`, ascending.
pub type Buckets = Vec<(f64, f64, u64)>;

/// One histogram of one phase of one VM in one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    /// The run (as in `results.csv`).
    pub run: u32,
    /// The sweep point.
    pub point: u32,
    /// The repeat.
    pub repeat: u32,
    /// The phase name.
    pub phase: String,
    /// The VM.
    pub vm: String,
    /// The run's swept values (column → value), as in `results.csv`.
    #[serde(default)]
    pub params: BTreeMap<String, Value>,
    /// What was measured (`latency`, ...): the output's name in the spec.
    pub name: String,
    /// The unit of the bucket bounds (`ns`).
    pub unit: String,
    /// Buckets `[low, high, count]`: `low <= x < high`, ascending, empty
    /// buckets left out.
    pub buckets: Buckets,
}

/// The number of samples in `buckets`.
pub fn total(buckets: &[(f64, f64, u64)]) -> u64 {
    buckets.iter().map(|b| b.2).sum()
}

/// The share of samples below `x` (buckets that straddle `x` count in
/// proportion, as if uniform inside).
pub fn share_below(buckets: &[(f64, f64, u64)], x: f64) -> f64 {
    let n = total(buckets);
    if n == 0 {
        return 0.0;
    }
    let mut below = 0.0;
    for &(lo, hi, k) in buckets {
        if hi <= x {
            below += k as f64;
        } else if lo < x {
            below += k as f64 * (x - lo) / (hi - lo);
        }
    }
    below / n as f64
}

/// The `q` quantile (0..=1), linear inside the bucket; `None` if empty.
pub fn quantile(buckets: &[(f64, f64, u64)], q: f64) -> Option<f64> {
    let n = total(buckets);
    if n == 0 {
        return None;
    }
    let want = q.clamp(0.0, 1.0) * n as f64;
    let mut seen = 0.0;
    for &(lo, hi, k) in buckets {
        let next = seen + k as f64;
        if next >= want && k > 0 {
            return Some(lo + (hi - lo) * ((want - seen) / k as f64));
        }
        seen = next;
    }
    buckets.last().map(|b| b.1)
}

/// Quantile `q` of the values above `x` alone (the buckets that start at
/// `x` or later); `None` when there are none.
pub fn quantile_above(buckets: &[(f64, f64, u64)], x: f64, q: f64) -> Option<f64> {
    let above: Vec<(f64, f64, u64)> = buckets.iter().copied().filter(|b| b.0 >= x).collect();
    quantile(&above, q)
}

/// Appends `ds` to `dir/distributions.jsonl`.
pub fn append(dir: &Path, ds: &[Distribution]) -> Result<(), ResultsError> {
    if ds.is_empty() {
        return Ok(());
    }
    let path = dir.join(FILE);
    let io = |source| ResultsError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut text = String::new();
    for d in ds {
        text.push_str(
            &serde_json::to_string(d).map_err(|source| ResultsError::Json {
                path: path.display().to_string(),
                source,
            })?,
        );
        text.push('\n');
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)
}

/// Reads `dir/distributions.jsonl` (no file: none).
pub fn read(dir: &Path) -> Result<Vec<Distribution>, ResultsError> {
    let path = dir.join(FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ResultsError::Io {
                path: path.display().to_string(),
                source,
            })
        }
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).map_err(|source| ResultsError::Json {
                path: path.display().to_string(),
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn d() -> Distribution {
        Distribution {
            run: 1,
            point: 0,
            repeat: 0,
            phase: "p".into(),
            vm: "vm0".into(),
            params: BTreeMap::new(),
            name: "latency".into(),
            unit: "ns".into(),
            buckets: vec![(100.0, 200.0, 60), (50_000.0, 100_000.0, 40)],
        }
    }

    #[test]
    fn shares_and_quantiles_read_the_buckets() {
        let b = d().buckets;
        assert_eq!(total(&b), 100);
        assert!((share_below(&b, 1_000.0) - 0.6).abs() < 1e-9);
        assert!((share_below(&b, 150.0) - 0.3).abs() < 1e-9);
        assert!((quantile(&b, 0.5).unwrap() - 183.333).abs() < 0.01);
        assert!(quantile(&b, 0.9).unwrap() > 50_000.0);
        assert_eq!(quantile(&[], 0.5), None);
        // Above 1 us: the slow 40 % alone.
        let slow = quantile_above(&b, 1_000.0, 0.0).unwrap();
        assert!(slow >= 1_000.0, "{slow}");
        assert!(quantile_above(&b, 1_000.0, 0.5).unwrap() > quantile(&b, 0.5).unwrap());
        assert_eq!(quantile_above(&b, 1e12, 0.5), None);
    }

    #[test]
    fn round_trips_through_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_empty());
        append(dir.path(), &[d()]).unwrap();
        append(dir.path(), &[d(), d()]).unwrap();
        let back = read(dir.path()).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[0], d());
    }
}
