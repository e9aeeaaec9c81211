//! The daemon's metrics as `cxlfs run` reads them: the Prometheus endpoint
//! (scraped at every phase boundary, so each phase gets its own counter
//! deltas), and the JSON-lines time series of `--metrics-file` (one object
//! per VM per sample, plus `"vm":"all"`; fields the runner does not know
//! become columns as they are, fields that are missing give empty cells).

use cxlfs::prometheus::{Metrics, ParseMetricsError, Sample};
use serde_json::Value;
use std::collections::BTreeMap;

/// Figures per VM (`""` for samples without a `vm` label).
pub type ByVm = BTreeMap<String, BTreeMap<String, f64>>;

/// One scrape of `/metrics`, reduced to counters and plain gauges by VM:
/// `cxlfs_device_hits_total{vm="vm0"}` → `["vm0"]["device_hits"]`; samples
/// with other labels (`opcode`) are summed over them; summaries and
/// histograms (`quantile`, `le`, `_count`, `_sum`, `_bucket`) are left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromSnapshot {
    /// Counters (names that ended in `_total`), by VM.
    pub counters: ByVm,
    /// Gauges, by VM.
    pub gauges: ByVm,
}

impl PromSnapshot {
    /// Parses the text exposition format and reduces it.
    pub fn parse(text: &str) -> Result<PromSnapshot, ParseMetricsError> {
        Ok(PromSnapshot::from_metrics(&Metrics::parse(text)?))
    }

    /// Reduces the samples of one scrape to counters and gauges by VM.
    pub fn from_metrics(metrics: &Metrics) -> PromSnapshot {
        let mut snap = PromSnapshot::default();
        for Sample {
            name,
            labels,
            value,
        } in &metrics.samples
        {
            if labels.contains_key("quantile")
                || labels.contains_key("le")
                || name.ends_with("_count")
                || name.ends_with("_sum")
                || name.ends_with("_bucket")
                || !value.is_finite()
            {
                continue;
            }
            let vm = labels.get("vm").cloned().unwrap_or_default();
            let short = name.strip_prefix("cxlfs_").unwrap_or(name);
            let (table, key) = match short.strip_suffix("_total") {
                Some(k) => (&mut snap.counters, k),
                None => (&mut snap.gauges, short),
            };
            *table
                .entry(vm)
                .or_default()
                .entry(key.to_string())
                .or_default() += value;
        }
        snap
    }

    /// Every figure of `vm` between `self` (earlier) and `later`: counter
    /// deltas and the later gauge values.
    pub fn delta(&self, later: &PromSnapshot, vm: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        if let Some(after) = later.counters.get(vm) {
            let before = self.counters.get(vm);
            for (k, v) in after {
                let b = before.and_then(|m| m.get(k)).copied().unwrap_or(0.0);
                out.insert(k.clone(), v - b);
            }
        }
        if let Some(g) = later.gauges.get(vm) {
            out.extend(g.iter().map(|(k, v)| (k.clone(), *v)));
        }
        out
    }
}

/// One object of the `--metrics-file` series.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesSample {
    /// `vm` (`all` for the total).
    pub vm: String,
    /// `ts_unix_ms` (0 when missing).
    pub ts_unix_ms: u64,
    /// `final` (the shutdown sample).
    pub is_final: bool,
    /// Every other numeric field, nested objects flattened with dots
    /// (`trap_latency_ns.p99`), strings kept as text.
    pub fields: BTreeMap<String, Value>,
}

/// Fields that identify a sample rather than measure anything.
const SERIES_META: [&str; 5] = ["vm", "ts_unix_ms", "final", "seq", "elapsed_s"];

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
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
        Value::Number(_) | Value::String(_) | Value::Bool(_) => {
            out.insert(prefix.to_string(), v.clone());
        }
        Value::Null | Value::Array(_) => {}
    }
}

/// Parses a JSON-lines series; lines that are not JSON objects (a torn
/// last line, say) are skipped and counted.
pub fn parse_series(text: &str) -> (Vec<SeriesSample>, usize) {
    let mut samples = Vec::new();
    let mut skipped = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(line) else {
            skipped += 1;
            continue;
        };
        let vm = obj
            .get("vm")
            .and_then(Value::as_str)
            .unwrap_or("all")
            .to_string();
        let mut fields = BTreeMap::new();
        for (k, v) in &obj {
            if !SERIES_META.contains(&k.as_str()) {
                flatten(k, v, &mut fields);
            }
        }
        samples.push(SeriesSample {
            vm,
            ts_unix_ms: obj.get("ts_unix_ms").and_then(Value::as_u64).unwrap_or(0),
            is_final: obj.get("final").and_then(Value::as_bool).unwrap_or(false),
            fields,
        });
    }
    (samples, skipped)
}

/// The sample of `vm` that describes the state at `ts_unix_ms`: the last one
/// taken at or before it; `None` if there is none. With `last_phase`, the
/// final (shutdown) sample wins, as it includes everything.
pub fn sample_at<'a>(
    samples: &'a [SeriesSample],
    vm: &str,
    ts_unix_ms: u64,
    last_phase: bool,
) -> Option<&'a SeriesSample> {
    let of_vm = || samples.iter().filter(move |s| s.vm == vm);
    if last_phase {
        if let Some(f) = of_vm().rfind(|s| s.is_final) {
            return Some(f);
        }
    }
    of_vm().rfind(|s| s.ts_unix_ms <= ts_unix_ms)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const PROM: &str = "# HELP x\n# TYPE cxlfs_fuse_requests_total counter\n\
        cxlfs_fuse_requests_total{vm=\"vm0\",opcode=\"read\"} 10\n\
        cxlfs_fuse_requests_total{vm=\"vm0\",opcode=\"lookup\"} 5\n\
        cxlfs_device_hits_total{vm=\"vm0\"} 7\ncxlfs_device_misses_total{vm=\"vm1\"} 3\n\
        cxlfs_pacing_error_seconds{vm=\"vm0\",modeled=\"all\",quantile=\"0.5\"} 0.1\n\
        cxlfs_pacing_error_seconds_count{vm=\"vm0\",modeled=\"all\"} 2\n\
        cxlfs_nand_reads_total 40\ncxlfs_device_resident_pages 12\n";

    #[test]
    fn prometheus_counters_and_gauges_by_vm() {
        let a = PromSnapshot::parse(PROM).unwrap();
        assert_eq!(a.counters["vm0"]["fuse_requests"], 15.0);
        assert_eq!(a.counters["vm0"]["device_hits"], 7.0);
        assert_eq!(a.counters["vm1"]["device_misses"], 3.0);
        assert_eq!(a.counters[""]["nand_reads"], 40.0);
        assert_eq!(a.gauges[""]["device_resident_pages"], 12.0);
        assert!(!a.gauges.contains_key("vm0"), "summaries are left out");
        let b = PromSnapshot::parse(
            &PROM
                .replace("} 7", "} 19")
                .replace("reads_total 40", "reads_total 45"),
        )
        .unwrap();
        let d = a.delta(&b, "vm0");
        assert_eq!(d["device_hits"], 12.0);
        assert_eq!(d["fuse_requests"], 0.0);
        assert_eq!(a.delta(&b, "")["nand_reads"], 5.0);
        assert_eq!(a.delta(&b, "")["device_resident_pages"], 12.0);
        assert!(a.delta(&b, "vm9").is_empty());
        assert!(PromSnapshot::parse("x{vm=\"a} 1").is_err());
        assert!(PromSnapshot::parse("x abc").is_err());
    }

    #[test]
    fn series_is_read_tolerantly() {
        let text = r#"{"ts_unix_ms":1000,"seq":0,"final":false,"vm":"vm0","cxl_ratio":50,"policy":"lru","fuse_ops":{"READ":3},"device_hits":1,"trap_latency_ns":{"count":2,"p99":900}}
{"ts_unix_ms":1000,"seq":0,"final":false,"vm":"all","device_hits":1}
{"ts_unix_ms":2000,"seq":1,"vm":"vm0","device_hits":5}
not json
{"ts_unix_ms":2500,"seq":2,"final":true,"vm":"vm0","device_hits":6}
{"ts_unix_ms":25"#;
        let (s, skipped) = parse_series(text);
        assert_eq!(skipped, 2);
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].fields["fuse_ops.READ"], 3);
        assert_eq!(s[0].fields["trap_latency_ns.p99"], 900);
        assert_eq!(s[0].fields["policy"], "lru");
        assert!(!s[0].fields.contains_key("seq"));
        assert_eq!(
            sample_at(&s, "vm0", 1500, false).unwrap().fields["device_hits"],
            1
        );
        assert_eq!(
            sample_at(&s, "vm0", 2400, false).unwrap().fields["device_hits"],
            5
        );
        assert_eq!(
            sample_at(&s, "vm0", 1500, true).unwrap().fields["device_hits"],
            6
        );
        assert_eq!(
            sample_at(&s, "all", 9999, true).unwrap().fields["device_hits"],
            1
        );
        assert!(sample_at(&s, "vm0", 10, false).is_none());
        assert!(sample_at(&s, "vm7", 9999, true).is_none());
    }
}
