//! The daemon's metrics as `cxlfs run` reads them, with the daemon's own
//! types (`cxlfs_api::metrics`): the `/metrics.json` snapshot (taken at
//! every phase boundary, so each phase gets its own counter deltas), and the
//! JSON-lines time series of `--metrics-file` (one object per VM per
//! sample, plus `"vm":"all"`; fields the runner does not know become
//! columns as they are, fields that are missing give empty cells).

use cxlfs_api::metrics::{
    MetricsSnapshot, SampleLine, FUSE_REQUESTS, POOL_TRAPS, REGION_FAMILIES, UNKNOWN_VM,
    VM_WRITE_AMPLIFICATION,
};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Figures per VM (`""` for the device-wide ones, which have no `vm` label).
pub type ByVm = BTreeMap<String, BTreeMap<String, f64>>;

/// One `/metrics.json` snapshot, reduced to counters and plain gauges by
/// VM and named as on the Prometheus endpoint without `cxlfs_` and
/// `_total`: `cxlfs_device_hits_total{vm="vm0"}` → `["vm0"]["device_hits"]`;
/// samples with other labels (`opcode`, `tier`) are summed over them;
/// latency summaries and histograms are left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// Counters (families whose name ends in `_total`), by VM.
    pub counters: ByVm,
    /// Gauges, by VM.
    pub gauges: ByVm,
}

impl Figures {
    /// Parses a `/metrics.json` body and reduces it.
    pub fn parse(json: &str) -> Result<Figures, serde_json::Error> {
        Ok(Figures::of(&serde_json::from_str(json)?))
    }

    fn add(&mut self, vm: &str, family: &str, value: f64) {
        if !value.is_finite() {
            return;
        }
        let short = family.strip_prefix("cxlfs_").unwrap_or(family);
        let (table, key) = match short.strip_suffix("_total") {
            Some(k) => (&mut self.counters, k),
            None => (&mut self.gauges, short),
        };
        *table
            .entry(vm.to_string())
            .or_default()
            .entry(key.to_string())
            .or_default() += value;
    }

    /// Reduces one snapshot: the per-VM families of each VM row (FUSE
    /// requests, the daemon's counter table, write amplification, traps),
    /// the traps of unknown threads, and the device-wide families.
    pub fn of(snap: &MetricsSnapshot) -> Figures {
        let mut f = Figures::default();
        for row in &snap.vms {
            for n in row.fuse_ops.values() {
                f.add(&row.vm, FUSE_REQUESTS, *n as f64);
            }
            for c in &snap.counters {
                f.add(&row.vm, &c.family, row.counter(&c.field) as f64);
            }
            f.add(&row.vm, VM_WRITE_AMPLIFICATION, row.write_amplification);
            f.add(&row.vm, POOL_TRAPS, row.traps as f64);
        }
        f.add(UNKNOWN_VM, POOL_TRAPS, snap.device.traps_unknown as f64);
        // Memory mode: each VM's CXL memory region (`daemon.region_*`).
        for r in &snap.memory_regions {
            for fam in REGION_FAMILIES {
                f.add(&r.vm, fam.name, (fam.value)(r) as f64);
            }
        }
        // Accessed bits: each VM's references and bits read, its regions
        // summed (`daemon.references`, `daemon.access_bits_region_read`).
        for r in &snap.hit_sources {
            if r.source == cxlfs_api::hits::HitSourceKind::AccessBits {
                f.add(&r.vm, "cxlfs_references_total", r.references as f64);
                f.add(
                    &r.vm,
                    "cxlfs_access_bits_region_read_total",
                    r.bits_read as f64,
                );
            }
        }
        for d in snap.device.families() {
            f.add("", d.name, d.value);
        }
        f
    }

    /// Every figure of `vm` between `self` (earlier) and `later`: counter
    /// deltas and the later gauge values.
    pub fn delta(&self, later: &Figures, vm: &str) -> BTreeMap<String, f64> {
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

/// Parses a JSON-lines series: each line is read as the daemon's
/// [`SampleLine`] (fields it lacks take their defaults), and its columns are
/// the fields as written. Lines that are not such an object (a torn last
/// line, say) are skipped and counted.
pub fn parse_series(text: &str) -> (Vec<SeriesSample>, usize) {
    let mut samples = Vec::new();
    let mut skipped = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(line) else {
            skipped += 1;
            continue;
        };
        let Ok(typed) = SampleLine::deserialize(&Value::Object(obj.clone())) else {
            skipped += 1;
            continue;
        };
        let mut fields = BTreeMap::new();
        for (k, v) in &obj {
            if !SERIES_META.contains(&k.as_str()) {
                flatten(k, v, &mut fields);
            }
        }
        samples.push(SeriesSample {
            vm: if obj.contains_key("vm") {
                typed.row.vm
            } else {
                "all".to_string()
            },
            ts_unix_ms: typed.info.ts_unix_ms,
            is_final: typed.info.is_final,
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

    /// A snapshot as `/metrics.json` serves it (shortened).
    fn snapshot(hits: u64, nand_reads: u64) -> String {
        format!(
            r#"{{"counters":[{{"field":"device_hits","family":"cxlfs_device_hits_total","help":""}},
                {{"field":"device_misses","family":"cxlfs_device_misses_total","help":""}}],
              "vms":[{{"vm":"vm0","fuse_ops":{{"READ":10,"LOOKUP":5}},"device_hits":{hits},"device_misses":0,
                       "fuse_latency_ns":{{"count":2,"p50":100000000}}}},
                     {{"vm":"vm1","device_hits":0,"device_misses":3}}],
              "device":{{"nand_reads":{nand_reads},"resident_pages":12,"policy":"lru","cxl_ratio":100}}}}"#
        )
    }

    #[test]
    fn snapshot_counters_and_gauges_by_vm() {
        let a = Figures::parse(&snapshot(7, 40)).unwrap();
        assert_eq!(a.counters["vm0"]["fuse_requests"], 15.0);
        assert_eq!(a.counters["vm0"]["device_hits"], 7.0);
        assert_eq!(a.counters["vm1"]["device_misses"], 3.0);
        assert_eq!(a.counters[""]["nand_reads"], 40.0);
        assert_eq!(a.gauges[""]["device_resident_pages"], 12.0);
        assert_eq!(a.gauges[""]["device_policy_info"], 1.0);
        assert_eq!(a.gauges["vm0"]["vm_write_amplification"], 0.0);
        assert!(
            !a.gauges["vm0"].keys().any(|k| k.contains("latency")),
            "summaries are left out"
        );
        let b = Figures::parse(&snapshot(19, 45)).unwrap();
        let d = a.delta(&b, "vm0");
        assert_eq!(d["device_hits"], 12.0);
        assert_eq!(d["fuse_requests"], 0.0);
        assert_eq!(a.delta(&b, "")["nand_reads"], 5.0);
        assert_eq!(a.delta(&b, "")["device_resident_pages"], 12.0);
        assert!(a.delta(&b, "vm9").is_empty());
        assert!(Figures::parse("{\"vms\":[{\"vm\":1}]}").is_err());
        assert!(Figures::parse("x abc").is_err());
    }

    #[test]
    fn memory_regions_give_region_columns_with_access_sampling() {
        let snap = |sampled: u64, armed: u64| {
            format!(
                r#"{{"vms":[{{"vm":"vm0"}}],"device":{{}},
                  "memory_regions":[{{"vm":"vm0","size_bytes":1024,"traps":4,
                    "sampled_accesses":{sampled},"sampling_armed_pages":{armed}}}]}}"#
            )
        };
        let a = Figures::parse(&snap(10, 100)).unwrap();
        let b = Figures::parse(&snap(25, 160)).unwrap();
        let d = a.delta(&b, "vm0");
        assert_eq!(d["region_sampled_accesses"], 15.0);
        assert_eq!(d["region_sampling_armed_pages"], 60.0);
        assert_eq!(d["region_traps"], 0.0);
        assert_eq!(d["region_size_bytes"], 1024.0);
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
