//! The rows of one run (per phase, one per VM and one `vm = all`) and its
//! histograms for `distributions.jsonl`: the plan's parameters, fio's and a
//! command's figures, the daemon's counters between two barriers, and the
//! metrics series at the phase's end.

use super::run_output::{PhaseResult, RunOutput};
use crate::daemon_metrics::{sample_at, Figures};
use crate::distributions::{self, Distribution};
use crate::fio_json::FioSummary;
use crate::results::{num, Row};
use crate::spec::{
    access_sampling_text, value_text, MissCheckSpec, MissMode, PhaseSpec, RunPlan,
    DEFAULT_CXL_RATIO,
};
use crate::text_table::counted_hit_share;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The rows of one run: per phase, one per VM and one `all`.
pub(super) fn rows_of(plan: &RunPlan, out: &RunOutput) -> Vec<Row> {
    let vms: Vec<String> = (0..plan.spec.vms.count).map(|i| format!("vm{i}")).collect();
    let (status, run_error) = run_status(out);
    let mut rows = Vec::new();
    for (k, phase) in plan.spec.phases.iter().enumerate() {
        let p = PhaseRows {
            plan,
            out,
            k,
            phase,
            status,
            run_error: run_error.as_deref(),
            window: match (out.snapshots.get(k), out.snapshots.get(k + 1)) {
                (Some(a), Some(b)) => Some((a, b)),
                _ => None,
            },
        };
        let mut totals = Totals::default();
        for vm in &vms {
            rows.push(p.vm_row(vm, &mut totals));
        }
        rows.push(p.all_row(totals));
    }
    add_hit_rates(plan, &mut rows);
    add_counted_shares(&mut rows);
    rows
}

/// Where the guests' fio logs were replayed (`replay.*`): the hit share
/// the daemon counted (`counted_hit_share`, as the table's `hit %`), the
/// replay's counted the same way (`replay.counted_hit_share`: references /
/// (references + misses)), and the first less the second in points
/// (`replay.diff_points`).
fn add_counted_shares(rows: &mut [Row]) {
    for r in rows.iter_mut() {
        let get = |k: &str| r.get(k).and_then(Value::as_f64);
        let (Some(refs), Some(misses)) = (get("replay.references"), get("replay.misses")) else {
            continue;
        };
        let replay = (refs + misses > 0.0).then(|| refs / (refs + misses));
        let full = counted_hit_share(r);
        if let Some(x) = replay {
            r.insert("replay.counted_hit_share".into(), num(x));
        }
        if let Some(x) = full {
            r.insert("counted_hit_share".into(), num(x));
        }
        if let (Some(f), Some(x)) = (full, replay) {
            r.insert("replay.diff_points".into(), num((f - x) * 100.0));
        }
    }
}

/// The run's status and error, for every row: the run's own error wins;
/// else the first guest error (and how many more).
fn run_status(out: &RunOutput) -> (&'static str, Option<String>) {
    let phase_errors: Vec<String> = out
        .phases
        .values()
        .flatten()
        .filter_map(|p| p.error.clone())
        .collect();
    let run_error = out.error.clone().or_else(|| {
        phase_errors.first().map(|e| match phase_errors.len() {
            1 => e.clone(),
            n => format!("{e} (and {} more)", n - 1),
        })
    });
    let status = if out.interrupted {
        "interrupted"
    } else if run_error.is_some() {
        "failed"
    } else {
        "ok"
    };
    (status, run_error)
}

/// Two daemon snapshots (unix ms, figures): before and after a phase.
type Window<'a> = Option<(&'a (u64, Figures), &'a (u64, Figures))>;

/// Sums and means over a phase's VMs, for its `all` row.
#[derive(Default)]
struct Totals {
    sums: BTreeMap<String, f64>,
    /// Sum and count.
    means: BTreeMap<String, (f64, u32)>,
}

impl Totals {
    fn add_to_sum(&mut self, name: String, x: f64) {
        *self.sums.entry(name).or_default() += x;
    }

    fn add_to_mean(&mut self, name: String, x: f64) {
        let e = self.means.entry(name).or_default();
        e.0 += x;
        e.1 += 1;
    }

    /// The sums, then the means, as cells of `all`.
    fn write_into(self, all: &mut Row) {
        for (name, x) in self.sums {
            all.insert(name, num(x));
        }
        for (name, (s, n)) in self.means {
            all.insert(name, num(s / f64::from(n)));
        }
    }
}

/// The rows of phase `k` of one run.
struct PhaseRows<'a> {
    plan: &'a RunPlan,
    out: &'a RunOutput,
    k: usize,
    phase: &'a PhaseSpec,
    status: &'static str,
    run_error: Option<&'a str>,
    window: Window<'a>,
}

impl PhaseRows<'_> {
    /// The cells every row of the phase has: the run, the phase, the status,
    /// the VM, the plan's parameters.
    fn base(&self, vm: &str) -> Row {
        let plan = self.plan;
        let mut r = Row::new();
        r.insert("run".into(), json!(plan.run));
        r.insert("point".into(), json!(plan.point));
        r.insert("repeat".into(), json!(plan.repeat));
        r.insert("phase".into(), json!(self.phase.name));
        r.insert("status".into(), json!(self.status));
        r.insert(
            "error".into(),
            self.run_error.map_or(Value::Null, Value::from),
        );
        r.insert("vm".into(), json!(vm));
        r.insert("vms".into(), json!(plan.spec.vms.count));
        r.insert("backend".into(), json!(plan.spec.daemon.backend.name()));
        r.insert(
            "cxl_ratio".into(),
            json!(plan.spec.daemon.cxl_ratio.unwrap_or(DEFAULT_CXL_RATIO)),
        );
        r.insert("policy".into(), json!(plan.device.cache.policy.name()));
        for (key, v) in &plan.params {
            r.insert(key.clone(), toml_to_json(v));
        }
        // After the parameters: one spelling (`off`, `N/s`) even when swept.
        r.insert(
            "daemon.access_sampling".into(),
            json!(access_sampling_text(
                plan.spec.daemon.access_sampling_rate()
            )),
        );
        r.insert(
            "daemon.access_bits".into(),
            json!(plan.spec.daemon.access_bits().as_str()),
        );
        if plan.spec.daemon.access_bits().is_on() {
            r.insert(
                "daemon.access_bits_period_ns".into(),
                json!(plan.spec.daemon.access_bits_period_ns()),
            );
        }
        if plan.spec.daemon.dax {
            r.insert(
                "daemon.dax_eviction_backlog".into(),
                json!(plan.spec.daemon.dax_eviction_backlog().to_string()),
            );
        }
        let compensation = plan.spec.daemon.latency_compensation.as_deref();
        r.insert(
            "daemon.latency_compensation".into(),
            json!(compensation.unwrap_or("auto")),
        );
        r
    }

    /// When the phase ended (the snapshot after it), if both snapshots were taken.
    fn end_ms(&self) -> Option<u64> {
        self.window.map(|(_, (t1, _))| *t1)
    }

    fn last_phase(&self) -> bool {
        self.k + 1 == self.plan.spec.phases.len()
    }

    /// Guest `vm`'s row; its figures also go into `totals`.
    fn vm_row(&self, vm: &str, totals: &mut Totals) -> Row {
        let mut r = self.base(vm);
        let pr = self.out.phases.get(vm).and_then(|p| p.get(self.k));
        if let Some(e) = pr.and_then(|p| p.error.clone()) {
            r.insert("error".into(), json!(e));
        }
        if let Some(s) = pr.and_then(|p| p.fio.as_ref()) {
            add_fio(&mut r, s, totals);
        }
        if let Some(x) = pr.and_then(|p| p.file_cache_bytes) {
            r.insert("guest_file_cache_bytes".into(), num(x));
            totals.add_to_sum("guest_file_cache_bytes".into(), x);
        }
        for (name, x) in pr.map(command_figures).unwrap_or_default() {
            r.insert(name.clone(), num(x));
            let summed = name
                .strip_prefix("out.")
                .and_then(|o| self.phase.outputs.get(o))
                .is_some_and(|o| o.aggregate.as_deref() == Some("sum"));
            if summed {
                totals.add_to_sum(name, x);
            } else {
                totals.add_to_mean(name, x);
            }
        }
        let delta = self
            .window
            .map(|((_, a), (_, b))| a.delta(b, vm))
            .unwrap_or_default();
        if let Some(((t0, _), (t1, _))) = self.window {
            r.insert("elapsed_s".into(), num((t1 - t0) as f64 / 1e3));
            let d = &delta;
            for (name, x) in d {
                r.insert(format!("daemon.{name}"), num(*x));
                totals.add_to_sum(format!("daemon.{name}"), *x);
            }
            let hits = d.get("device_hits").copied().unwrap_or(0.0);
            let misses = d.get("device_misses").copied().unwrap_or(0.0);
            r.insert("device_hits".into(), num(hits));
            r.insert("device_misses".into(), num(misses));
            totals.add_to_sum("device_hits".into(), hits);
            totals.add_to_sum("device_misses".into(), misses);
        }
        if let Some(c) = pr.and_then(|p| p.replay) {
            for (name, x) in [
                ("replay.page_accesses", c.page_accesses),
                ("replay.page_hits", c.page_hits),
                ("replay.misses", c.page_misses),
                ("replay.references", c.references),
            ] {
                r.insert(name.into(), num(x as f64));
                totals.add_to_sum(name.into(), x as f64);
            }
        }
        if let (Some(mc), Some(pr)) = (&self.phase.miss_check, pr) {
            add_miss_check(&mut r, mc, pr, &delta);
        }
        add_series(&mut r, self.out, vm, self.end_ms(), self.last_phase());
        r
    }

    /// The `all` row: the VMs' `totals`, the device-wide daemon figures.
    fn all_row(&self, totals: Totals) -> Row {
        let mut all = self.base("all");
        totals.write_into(&mut all);
        if let Some(((t0, a), (t1, b))) = self.window {
            all.insert("elapsed_s".into(), num((t1 - t0) as f64 / 1e3));
            // Device-wide figures (no `vm` label).
            for (name, x) in a.delta(b, "") {
                all.insert(format!("daemon.{name}"), num(x));
            }
        }
        add_file_memory(&mut all, self.out.server_rss_bytes.get(self.k + 1).copied());
        add_series(&mut all, self.out, "all", self.end_ms(), self.last_phase());
        all
    }
}

/// The memory that holds file data at the phase's end, on the `all` row:
/// the back-end's anonymous resident bytes on the host (`server_rss_bytes`:
/// `cxlfsd`, or every `virtiofsd`), the DAX pool's resident bytes
/// (`daemon.pool_resident_bytes`) and the guests' file page caches summed
/// (`guest_file_cache_bytes`): `file_memory_bytes`. The host's own page
/// cache of the shared files is not in it (one copy of what was read, in
/// every configuration).
fn add_file_memory(all: &mut Row, server_rss: Option<u64>) {
    let Some(rss) = server_rss else {
        return;
    };
    all.insert("server_rss_bytes".into(), json!(rss));
    let get = |k: &str| all.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let total = rss as f64 + get("daemon.pool_resident_bytes") + get("guest_file_cache_bytes");
    all.insert("file_memory_bytes".into(), num(total));
}

/// fio's figures as cells of `r`: latencies are averaged over the VMs,
/// the rest (but `fio_*`) summed.
/// `miss_check`: the guest's latency over the loads that trapped (above
/// the threshold) and the model's mean time for the phase's traps of that
/// mode (`delta`: the VM's daemon figures over the phase).
fn add_miss_check(
    r: &mut Row,
    mc: &MissCheckSpec,
    pr: &PhaseResult,
    delta: &BTreeMap<String, f64>,
) {
    r.insert("mode".into(), json!(mc.mode.name()));
    if let Some((_, _, buckets)) = pr.histograms.iter().find(|h| h.0 == mc.histogram) {
        for (q, col) in [(0.5, "miss_p50_ns"), (0.99, "miss_p99_ns")] {
            if let Some(x) = distributions::quantile_above(buckets, mc.miss_above_ns, q) {
                r.insert(col.into(), num(x));
            }
        }
    }
    let (time, traps) = match mc.mode {
        MissMode::File => ("vm_trap_modeled_ns", "pool_traps"),
        MissMode::Memory => ("region_trap_modeled_ns", "region_traps"),
    };
    let traps = delta.get(traps).copied().unwrap_or(0.0);
    if traps > 0.0 {
        let modeled = delta.get(time).copied().unwrap_or(0.0) / traps;
        r.insert("modeled_miss_ns".into(), num(modeled));
    }
}

fn add_fio(r: &mut Row, s: &FioSummary, totals: &mut Totals) {
    for (name, x) in &s.fields {
        r.insert(name.clone(), num(*x));
        if name.contains("_clat_") {
            totals.add_to_mean(name.clone(), *x);
        } else if !name.starts_with("fio_") {
            totals.add_to_sum(name.clone(), *x);
        }
    }
}

/// `device_hit_rate` where a row has hits or misses; through the DAX window
/// hits never reach the daemon: no hit rate there.
fn add_hit_rates(plan: &RunPlan, rows: &mut [Row]) {
    for r in rows.iter_mut().filter(|_| !plan.spec.daemon.dax) {
        let get = |k: &str| r.get(k).and_then(Value::as_f64);
        if let (Some(h), Some(m)) = (get("device_hits"), get("device_misses")) {
            if h + m > 0.0 {
                r.insert("device_hit_rate".into(), num(h / (h + m)));
            }
        }
    }
}

/// A command phase's columns: `out.NAME` per number, `out.NAME_p50` /
/// `_p99` per histogram, and the `replay_check` hit shares (measured, the
/// replay with hits invisible and visible to the policy, and measured minus
/// the invisible replay in points).
fn command_figures(p: &PhaseResult) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = p
        .outputs
        .iter()
        .map(|(k, x)| (format!("out.{k}"), *x))
        .collect();
    for (name, _, buckets) in &p.histograms {
        for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
            if let Some(x) = distributions::quantile(buckets, q) {
                v.push((format!("out.{name}_{label}"), x));
            }
        }
    }
    if let Some(h) = p.hit_shares {
        v.push(("hit_share.full_system".into(), h.full_system));
        v.push(("hit_share.replay".into(), h.replay));
        v.push(("hit_share.replay_visible".into(), h.replay_visible));
        if let Some(b) = h.replay_blind {
            v.push(("hit_share.replay_blind".into(), b));
        }
        v.push(("device_misses.replay".into(), h.replay_misses.0 as f64));
        v.push((
            "device_misses.replay_visible".into(),
            h.replay_misses.1 as f64,
        ));
        v.push((
            "hit_share.diff_points".into(),
            (h.full_system - h.replay) * 100.0,
        ));
    }
    v
}

/// The histograms of one run, for `distributions.jsonl`.
pub(super) fn distributions_of(plan: &RunPlan, out: &RunOutput) -> Vec<Distribution> {
    let params: BTreeMap<String, Value> = plan
        .params
        .iter()
        .map(|(k, v)| (k.clone(), toml_to_json(v)))
        .collect();
    let mut ds = Vec::new();
    for (vm, phases) in &out.phases {
        for (phase, r) in plan.spec.phases.iter().zip(phases) {
            for (name, unit, buckets) in &r.histograms {
                ds.push(Distribution {
                    run: plan.run,
                    point: plan.point,
                    repeat: plan.repeat,
                    phase: phase.name.clone(),
                    vm: vm.clone(),
                    params: params.clone(),
                    name: name.clone(),
                    unit: unit.clone(),
                    buckets: buckets.clone(),
                });
            }
        }
    }
    ds
}

/// `metrics.FIELD` cells from the series sample describing the phase's end.
fn add_series(r: &mut Row, out: &RunOutput, vm: &str, end_ms: Option<u64>, last_phase: bool) {
    let Some(end) = end_ms else { return };
    if let Some(s) = sample_at(&out.series, vm, end, last_phase) {
        for (k, v) in &s.fields {
            r.insert(format!("metrics.{k}"), v.clone());
        }
    }
}

/// A parameter's value as a JSON cell.
pub(super) fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::Integer(i) => json!(i),
        toml::Value::Float(f) => num(*f),
        toml::Value::Boolean(b) => json!(b),
        other => json!(value_text(other)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fio_json;
    use crate::run_cmd::run_output::HitShares;
    use crate::run_cmd::test_spec::SPEC;
    use crate::spec::load_str;
    use cxlfs_api::metrics::{CounterInfo, DeviceTotals, MetricsSnapshot, VmSample};

    #[test]
    fn rows_per_phase_and_vm_with_an_aggregate() {
        let plans = load_str("t.toml", SPEC, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        let fixture = include_str!("../../tests/fixtures/fio-dax-mmap-randread.json");
        let prom = |h: u64| {
            let counter = |f: &str| CounterInfo {
                field: f.into(),
                family: format!("cxlfs_{f}_total"),
                help: String::new(),
            };
            let row = |vm: &str, hits: u64, misses: u64| VmSample {
                vm: vm.into(),
                counters: [
                    ("device_hits".into(), hits),
                    ("device_misses".into(), misses),
                ]
                .into(),
                ..VmSample::default()
            };
            Figures::of(&MetricsSnapshot {
                counters: vec![counter("device_hits"), counter("device_misses")],
                vms: vec![row("vm0", h, h * 2), row("vm1", 0, h * 3)],
                device: DeviceTotals {
                    nand_reads: h * 4,
                    ..DeviceTotals::default()
                },
                ..MetricsSnapshot::default()
            })
        };
        let mut out = RunOutput {
            snapshots: vec![(1000, prom(0)), (3000, prom(10)), (4000, prom(15))],
            ..RunOutput::default()
        };
        for vm in ["vm0", "vm1"] {
            out.phases.insert(
                vm.into(),
                vec![
                    PhaseResult {
                        fio: Some(fio_json::parse(fixture).unwrap()),
                        ..PhaseResult::default()
                    },
                    PhaseResult {
                        fio: Some(fio_json::parse(fixture).unwrap()),
                        ..PhaseResult::default()
                    },
                ],
            );
        }
        let rows = rows_of(&plans[0], &out);
        assert_eq!(rows.len(), 2 * 3);
        let r0 = &rows[0];
        assert_eq!(r0["vm"], "vm0");
        assert_eq!(r0["phase"], "a");
        assert_eq!(r0["status"], "ok");
        assert_eq!(r0["cxl_ratio"], 0);
        assert_eq!(r0["daemon.cxl_ratio"], 0);
        assert_eq!(r0["policy"], plans[0].device.cache.policy.name());
        assert_eq!(r0["daemon.access_sampling"], "off");
        assert_eq!(r0["daemon.access_bits"], "on");
        let mut sampled = plans[0].clone();
        sampled.spec.daemon.access_sampling = Some(toml::Value::Integer(2000));
        assert_eq!(
            rows_of(&sampled, &out)[0]["daemon.access_sampling"],
            "2000/s"
        );
        assert_eq!(r0["device_hits"], 10);
        assert_eq!(r0["device_misses"], 20);
        assert!(
            !r0.contains_key("device_hit_rate"),
            "hits are invisible under DAX"
        );
        let mut no_dax = plans[0].clone();
        no_dax.spec.daemon.dax = false;
        assert_eq!(rows_of(&no_dax, &out)[0]["device_hit_rate"], num(1.0 / 3.0));
        assert_eq!(r0["elapsed_s"], 2);
        assert_eq!(r0["read_bw_bytes_per_sec"], 48_884_483);
        let all = &rows[2];
        assert_eq!(all["vm"], "all");
        assert_eq!(all["read_bw_bytes_per_sec"], 2 * 48_884_483);
        assert_eq!(all["read_clat_p99_ns"], 618_496);
        assert_eq!(all["device_misses"], 20 + 30);
        assert_eq!(all["daemon.nand_reads"], 40);
        let all_b = &rows[5];
        assert_eq!(all_b["phase"], "b");
        assert_eq!(all_b["device_misses"], 10 + 15);
        // One guest's fio failed: the run is failed, that row names the error.
        out.phases.get_mut("vm1").unwrap()[1] = PhaseResult {
            error: Some("vm1 b: fio exited 1: bad option".into()),
            ..PhaseResult::default()
        };
        let rows = rows_of(&plans[0], &out);
        assert!(rows.iter().all(|r| r["status"] == "failed"));
        assert_eq!(rows[4]["error"], "vm1 b: fio exited 1: bad option");
        // The daemon never started: rows with the error and no figures.
        let out = RunOutput {
            error: Some("cxlfsd exited at start".into()),
            ..RunOutput::default()
        };
        let rows = rows_of(&plans[1], &out);
        assert_eq!(rows.len(), 6);
        assert!(rows
            .iter()
            .all(|r| r["status"] == "failed" && r["error"] == "cxlfsd exited at start"));
        assert!(rows
            .iter()
            .all(|r| !r.contains_key("read_bw_bytes_per_sec")));
    }

    #[test]
    fn file_memory_is_the_back_ends_rss_the_pool_and_the_guests_caches() {
        let plans = load_str("t.toml", SPEC, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        let pool = |bytes: u64| {
            Figures::of(&MetricsSnapshot {
                device: DeviceTotals {
                    pool_resident_bytes: bytes,
                    ..DeviceTotals::default()
                },
                ..MetricsSnapshot::default()
            })
        };
        let cached = |mib: f64| PhaseResult {
            file_cache_bytes: Some(mib * 1048576.0),
            ..PhaseResult::default()
        };
        let mut out = RunOutput {
            snapshots: vec![
                (1000, pool(0)),
                (2000, pool(8 << 20)),
                (3000, pool(16 << 20)),
            ],
            server_rss_bytes: vec![1 << 20, 3 << 20, 4 << 20],
            ..RunOutput::default()
        };
        out.phases
            .insert("vm0".into(), vec![cached(10.0), cached(20.0)]);
        out.phases
            .insert("vm1".into(), vec![cached(30.0), cached(40.0)]);
        let rows = rows_of(&plans[0], &out);
        assert_eq!(rows[0]["guest_file_cache_bytes"], num(10.0 * 1048576.0));
        assert_eq!(rows[0]["backend"], "cxlfsd");
        let (all_a, all_b) = (&rows[2], &rows[5]);
        assert_eq!(all_a["server_rss_bytes"], 3 << 20);
        assert_eq!(
            all_a["file_memory_bytes"],
            num(f64::from((3 + 8 + 10 + 30) << 20))
        );
        assert_eq!(
            all_b["file_memory_bytes"],
            num(f64::from((4 + 16 + 20 + 40) << 20))
        );
        assert!(
            !rows[0].contains_key("file_memory_bytes"),
            "on the all rows only"
        );
        // No barrier reached: no memory figures.
        let none = rows_of(&plans[0], &RunOutput::default());
        assert!(none.iter().all(|r| !r.contains_key("file_memory_bytes")));
    }

    #[test]
    fn miss_check_takes_the_slow_loads_and_the_modes_modeled_mean() {
        use crate::spec::{MissCheckSpec, MissMode};
        // 90 hits at ~200 ns, 10 misses at 40-80 us.
        let p = PhaseResult {
            histograms: vec![(
                "lat".into(),
                "ns".into(),
                vec![
                    (100.0, 300.0, 90),
                    (40_000.0, 60_000.0, 5),
                    (60_000.0, 80_000.0, 5),
                ],
            )],
            ..PhaseResult::default()
        };
        let delta: BTreeMap<String, f64> = [
            ("region_trap_modeled_ns".to_string(), 450_000.0),
            ("region_traps".to_string(), 10.0),
            ("vm_trap_modeled_ns".to_string(), 1_000.0),
            ("pool_traps".to_string(), 1.0),
        ]
        .into();
        let mut mc = MissCheckSpec {
            histogram: "lat".into(),
            miss_above_ns: 5_000.0,
            mode: MissMode::Memory,
        };
        let mut r = Row::new();
        add_miss_check(&mut r, &mc, &p, &delta);
        assert_eq!(r["mode"], "memory");
        assert_eq!(r["miss_p50_ns"], 60_000);
        assert!(r["miss_p99_ns"].as_f64().unwrap() > 78_000.0, "{r:?}");
        assert_eq!(r["modeled_miss_ns"], 45_000);
        mc.mode = MissMode::File;
        let mut r = Row::new();
        add_miss_check(&mut r, &mc, &p, &delta);
        assert_eq!(
            (r["mode"].as_str(), r["modeled_miss_ns"].as_i64()),
            (Some("file"), Some(1_000))
        );
        // No trap of that mode: no modeled figure rather than a zero.
        let mut r = Row::new();
        add_miss_check(&mut r, &mc, &p, &BTreeMap::new());
        assert!(!r.contains_key("modeled_miss_ns"), "{r:?}");
    }

    #[test]
    fn replayed_logs_give_both_counted_shares_and_their_difference() {
        let mut rows = vec![
            json!({"device_hits": 4.0, "device_misses": 100.0, "daemon.references": 296.0,
                "replay.references": 285.0, "replay.misses": 95.0})
            .as_object()
            .unwrap()
            .clone(),
            // No replay (another ratio): nothing added.
            json!({"device_hits": 4.0, "device_misses": 100.0})
                .as_object()
                .unwrap()
                .clone(),
        ];
        add_counted_shares(&mut rows);
        let v = |rows: &[Row], k: &str| rows[0][k].as_f64().unwrap();
        assert!((v(&rows, "counted_hit_share") - 0.75).abs() < 1e-12);
        assert!((v(&rows, "replay.counted_hit_share") - 0.75).abs() < 1e-12);
        assert!(v(&rows, "replay.diff_points").abs() < 1e-9);
        assert!(!rows[1].contains_key("counted_hit_share"));
        rows[0].insert("replay.references".into(), json!(0.0));
        add_counted_shares(&mut rows);
        assert_eq!(v(&rows, "replay.counted_hit_share"), 0.0);
        assert!((v(&rows, "replay.diff_points") - 75.0).abs() < 1e-9);
    }

    #[test]
    fn replay_check_columns_hold_both_replays() {
        let p = PhaseResult {
            hit_shares: Some(HitShares {
                full_system: 0.5,
                replay: 0.25,
                replay_blind: None,
                replay_visible: 0.75,
                replay_misses: (30, 20),
            }),
            ..PhaseResult::default()
        };
        let v: BTreeMap<String, f64> = command_figures(&p).into_iter().collect();
        assert_eq!(v["hit_share.full_system"], 0.5);
        assert_eq!(v["hit_share.replay"], 0.25);
        assert_eq!(v["hit_share.replay_visible"], 0.75);
        assert_eq!(v["hit_share.diff_points"], 25.0);
        assert_eq!(v["device_misses.replay"], 30.0);
        assert_eq!(v["device_misses.replay_visible"], 20.0);
    }
}
