//! `cxlfs replay --out DIR [--plots FILE]`: a replay sweep written as a
//! results directory (`results.json`, `results.csv`, `provenance.json`),
//! so that `cxlfs plot DIR` and `cxlfs table DIR` read it like the output
//! of `cxlfs run`, and the `[[plots]]` of FILE (e.g.
//! `experiments/write-log.toml`) drawn into it.
//!
//! One row per sweep point: `run` and `point` (1-based), `status = ok`,
//! `vm = all`, `phase = replay`, the swept keys (numbers where the value
//! reads as one) and every field of the replay's JSON report, nested
//! objects flattened with dots (`latency_ns.mean`, `nand.programs`).

use crate::plot;
use crate::results::{write_atomic, ResultsFile, Row};
use crate::spec::PlotSpec;
use anyhow::{Context, Result};
use cxlfs_device_model::replay::ReplayReport;
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::Path;

/// The parts of a plots file that `--plots` reads.
#[derive(Debug, Default, Deserialize)]
struct PlotsFile {
    /// The experiment's name (default: `replay`).
    #[serde(default)]
    name: Option<String>,
    /// The figures.
    #[serde(default)]
    plots: Vec<PlotSpec>,
}

/// Writes the results directory and draws the plots; returns the figure files.
pub fn write(
    dir: &Path,
    plots_file: Option<&Path>,
    sweep_keys: &[String],
    points: &[(Vec<(String, String)>, ReplayReport)],
) -> Result<Vec<std::path::PathBuf>> {
    let spec: PlotsFile = match plots_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("{}", p.display()))?;
            let table: toml::Table =
                toml::from_str(&text).with_context(|| format!("{}", p.display()))?;
            let name = table.get("name").cloned();
            let plots = table.get("plots").cloned();
            let mut sub = toml::Table::new();
            if let Some(n) = name {
                sub.insert("name".into(), n);
            }
            if let Some(p) = plots {
                sub.insert("plots".into(), p);
            }
            sub.try_into()
                .with_context(|| format!("{}: [[plots]]", p.display()))?
        }
        None => PlotsFile::default(),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    let name = spec.name.clone().unwrap_or_else(|| "replay".to_string());
    let mut res = ResultsFile::new(&name, sweep_keys.to_vec());
    let rows: Vec<Row> = points
        .iter()
        .enumerate()
        .map(|(i, (params, report))| row(i + 1, params, report))
        .collect::<Result<_>>()?;
    res.push(rows);
    res.write(dir)?;
    let provenance = json!({ "spec": { "name": name, "plots": spec.plots } });
    write_atomic(
        &dir.join("provenance.json"),
        serde_json::to_string_pretty(&provenance)?.as_bytes(),
    )?;
    Ok(plot::render_all(&res, &spec.plots, dir)?)
}

/// One sweep point's row.
fn row(point: usize, params: &[(String, String)], report: &ReplayReport) -> Result<Row> {
    let mut r = Row::new();
    r.insert("run".into(), Value::from(point));
    r.insert("point".into(), Value::from(point));
    r.insert("repeat".into(), Value::from(0));
    r.insert("status".into(), Value::from("ok"));
    r.insert("vm".into(), Value::from("all"));
    r.insert("phase".into(), Value::from("replay"));
    for (k, v) in params {
        let cell = v
            .parse::<u64>()
            .map(Value::from)
            .or_else(|_| v.parse::<f64>().map(Value::from))
            .unwrap_or_else(|_| Value::from(v.as_str()));
        r.insert(k.clone(), cell);
    }
    flatten("", &serde_json::to_value(report)?, &mut r);
    Ok(r)
}

fn flatten(prefix: &str, v: &Value, out: &mut Row) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, x, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rows_flatten_the_report_and_type_the_params() {
        let report = ReplayReport {
            nand_programs: 7,
            ..ReplayReport::default()
        };
        let params = vec![("cache.write_log_bytes".to_string(), "4096".to_string())];
        let r = row(2, &params, &report).unwrap();
        assert_eq!(r["cache.write_log_bytes"], 4096);
        assert_eq!(r["nand_programs"], 7);
        assert!(r.contains_key("latency_ns.mean"));
        assert_eq!(r["status"], "ok");
    }
}
