//! The Prometheus text exposition (format 0.0.4) of a [`Snapshot`].

use super::counters::VM_COUNTERS;
use super::latency::{LatencyExport, LatencySummary, BUCKETS_NS};
use super::snapshot::{Snapshot, VmRow};
use cxlfs_api::metrics::{
    FUSE_REQUESTS, POOL_TRAPS, REGION_FAMILIES, UNKNOWN_VM, VM_WRITE_AMPLIFICATION,
};
use std::fmt::Write as _;

/// The latency-compensation gauge (label `path`: `fuse`, `dax`).
const COMPENSATION: &str = "cxlfs_latency_compensation_seconds";
/// Requests the residency plane answered through FUSE over io_uring.
const POOL_RING_REQUESTS: &str = "cxlfs_pool_ring_requests_total";

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn render_latency(
    s: &mut String,
    name: &str,
    help: &str,
    rows: &[VmRow],
    get: fn(&VmRow) -> &LatencyExport,
) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} histogram");
    for r in rows {
        let e = get(r);
        for (le, n) in BUCKETS_NS.iter().zip(&e.buckets) {
            let _ = writeln!(
                s,
                "{name}_bucket{{vm=\"{}\",le=\"{}\"}} {n}",
                r.vm,
                secs(*le)
            );
        }
        let _ = writeln!(
            s,
            "{name}_bucket{{vm=\"{}\",le=\"+Inf\"}} {}",
            r.vm, e.summary.count
        );
        let _ = writeln!(
            s,
            "{name}_sum{{vm=\"{}\"}} {:.9}\n{name}_count{{vm=\"{}\"}} {}",
            r.vm,
            e.summary.mean * e.summary.count as f64 / 1e9,
            r.vm,
            e.summary.count
        );
    }
    let q = format!("{name}_quantiles");
    let _ = writeln!(s, "# HELP {q} {help} (HDR quantiles).\n# TYPE {q} summary");
    for r in rows {
        summary_lines(s, &q, &format!("vm=\"{}\"", r.vm), &get(r).summary);
    }
}

/// The samples of a summary: `name{labels,quantile="Q"}` in seconds for
/// the quantiles 0.5 .. 1 (the max), then `name_count{labels}`.
fn summary_lines(s: &mut String, name: &str, labels: &str, e: &LatencySummary) {
    for (q, v) in ["0.5", "0.9", "0.99", "0.999", "1"]
        .iter()
        .zip([e.p50, e.p90, e.p99, e.p999, e.max])
    {
        let _ = writeln!(s, "{name}{{{labels},quantile=\"{q}\"}} {:.9}", secs(v));
    }
    let _ = writeln!(s, "{name}_count{{{labels}}} {}", e.count);
}

fn render_regions(snap: &Snapshot, s: &mut String) {
    if snap.memory_regions.is_empty() {
        return;
    }
    for f in REGION_FAMILIES {
        let (name, kind) = (f.name, f.kind.name());
        let _ = writeln!(s, "# HELP {name} {}\n# TYPE {name} {kind}", f.help);
        for r in &snap.memory_regions {
            let _ = writeln!(
                s,
                "{name}{{vm=\"{}\",region=\"memory\"}} {}",
                r.vm,
                (f.value)(r)
            );
        }
    }
}

/// Access sampling's catches per VM and region: `region="file"` (DAX pool
/// pages, the VM's traps on armed pages) and `region="memory"` (its CXL
/// memory region).
fn render_sampled_accesses(snap: &Snapshot, s: &mut String) {
    let name = "cxlfs_sampled_accesses_total";
    let _ = writeln!(
        s,
        "# HELP {name} Accesses to resident pages that access sampling caught (traps on armed pages, seen by the policy as hits), by VM and region.\n# TYPE {name} counter"
    );
    for r in &snap.vms {
        let n = r.counter("sampled_accesses");
        let _ = writeln!(s, "{name}{{vm=\"{}\",region=\"file\"}} {n}", r.vm);
    }
    for r in &snap.memory_regions {
        let n = r.sampled_accesses;
        let _ = writeln!(s, "{name}{{vm=\"{}\",region=\"memory\"}} {n}", r.vm);
    }
}

/// The hit sources, per VM region: which one serves it (`cxlfs_hit_source`,
/// 1 for the serving source), and the accessed bits' figures.
fn render_hit_sources(snap: &Snapshot, s: &mut String) {
    if snap.hit_sources.is_empty() {
        return;
    }
    let name = "cxlfs_hit_source";
    let _ = writeln!(
        s,
        "# HELP {name} The source through which the VM region's hits reach the device's policy (1 for the one serving it: access_bits, sampling or none).\n# TYPE {name} gauge"
    );
    let mut seen = std::collections::BTreeSet::new();
    for r in &snap.hit_sources {
        if seen.insert((&r.vm, &r.region)) {
            let _ = writeln!(
                s,
                "{name}{{vm=\"{}\",region=\"{}\",source=\"{}\"}} 1",
                r.vm,
                r.region,
                r.serving.as_str()
            );
        }
    }
    let bits: Vec<_> = snap
        .hit_sources
        .iter()
        .filter(|r| r.source == cxlfs_api::hits::HitSourceKind::AccessBits)
        .collect();
    type Pick = fn(&cxlfs_api::metrics::HitSourceSample) -> u64;
    let families: [(&str, &str, Pick); 4] = [
        ("cxlfs_access_bits_region_read_total", "Accessed bits read and cleared from the VM region's area.", |r| r.bits_read),
        ("cxlfs_references_total", "References the device's policy was told of from the VM region's accessed bits (resident pages; at most one a page a period).", |r| r.references),
        ("cxlfs_access_bits_rearms_total", "The VMM's re-arms of the VM region (its TLB entries dropped so that the next access marks again).", |r| r.rearms),
        ("cxlfs_access_bits_vmm_set_total", "Bits the VMM set in the VM region's area (TLB refills that found their bit clear).", |r| r.vmm_bits_set),
    ];
    for (name, help, pick) in families {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
        for r in &bits {
            let _ = writeln!(
                s,
                "{name}{{vm=\"{}\",region=\"{}\"}} {}",
                r.vm,
                r.region,
                pick(r)
            );
        }
    }
}

/// The Prometheus text of a snapshot.
pub fn render_prometheus(snap: &Snapshot) -> String {
    let rows = &snap.vms;
    let mut s = String::with_capacity(8192);
    render_regions(snap, &mut s);
    let _ = writeln!(
        s,
        "# HELP {FUSE_REQUESTS} FUSE requests received, by VM and opcode.\n# TYPE {FUSE_REQUESTS} counter"
    );
    for r in rows {
        for (op, n) in &r.fuse_ops {
            let _ = writeln!(s, "{FUSE_REQUESTS}{{vm=\"{}\",opcode=\"{op}\"}} {n}", r.vm);
        }
    }
    for (i, c) in VM_COUNTERS.iter().enumerate() {
        let _ = writeln!(s, "# HELP {} {}\n# TYPE {} counter", c.prom, c.help, c.prom);
        for r in rows {
            let _ = writeln!(s, "{}{{vm=\"{}\"}} {}", c.prom, r.vm, r.counters[i]);
        }
    }
    render_sampled_accesses(snap, &mut s);
    render_hit_sources(snap, &mut s);
    let _ = writeln!(
        s,
        "# HELP cxlfs_dax_mapped_bytes Bytes the VM's DAX window maps now (its resident file pages).\n# TYPE cxlfs_dax_mapped_bytes gauge"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "cxlfs_dax_mapped_bytes{{vm=\"{}\"}} {}",
            r.vm, r.dax_mapped_bytes
        );
    }
    let _ = writeln!(
        s,
        "# HELP {VM_WRITE_AMPLIFICATION} NAND programs / host programs during the VM's accesses.\n# TYPE {VM_WRITE_AMPLIFICATION} gauge"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{VM_WRITE_AMPLIFICATION}{{vm=\"{}\"}} {}",
            r.vm,
            r.write_amplification()
        );
    }
    let _ = writeln!(
        s,
        "# HELP cxlfs_pacing_error_seconds Actual minus modeled completion of data-path replies.\n# TYPE cxlfs_pacing_error_seconds summary"
    );
    for r in rows {
        for (class, e) in [("all", &r.pacing_error), ("ge20us", &r.pacing_error_long)] {
            let labels = format!("vm=\"{}\",modeled=\"{class}\"", r.vm);
            summary_lines(&mut s, "cxlfs_pacing_error_seconds", &labels, &e.summary);
        }
    }
    render_latency(
        &mut s,
        "cxlfs_fuse_latency_seconds",
        "FUSE request latency: arrival on the queue to the reply on the used ring",
        rows,
        |r| &r.fuse_latency,
    );
    render_latency(
        &mut s,
        "cxlfs_trap_latency_seconds",
        "DAX trap latency: arrival at the residency plane to the modeled completion",
        rows,
        |r| &r.trap_latency,
    );
    let mut last = "";
    for f in snap.device.families() {
        if f.name != last {
            let _ = writeln!(
                s,
                "# HELP {0} {1}\n# TYPE {0} {2}",
                f.name,
                f.help,
                f.kind.name()
            );
            last = f.name;
        }
        match &f.label {
            Some((k, v)) => {
                let _ = writeln!(s, "{}{{{k}=\"{v}\"}} {}", f.name, f.value);
            }
            None => {
                let _ = writeln!(s, "{} {}", f.name, f.value);
            }
        }
    }
    let _ = writeln!(
        s,
        "# HELP {COMPENSATION} What held replies are released ahead of their modeled completion by: the path's own cost, measured or set (0: compensation off).\n# TYPE {COMPENSATION} gauge"
    );
    for (path, ns) in &snap.compensation_ns {
        let _ = writeln!(s, "{COMPENSATION}{{path=\"{path}\"}} {:.9}", secs(*ns));
    }
    if let Some(n) = snap.pool_ring_requests {
        let _ = writeln!(
            s,
            "# HELP {POOL_RING_REQUESTS} Requests the residency plane answered through FUSE over io_uring (0: it runs on /dev/fuse).\n# TYPE {POOL_RING_REQUESTS} counter\n{POOL_RING_REQUESTS} {n}"
        );
    }
    let _ = writeln!(
        s,
        "# HELP {POOL_TRAPS} Pool page misses that trapped into the daemon, by VM (unknown: not a registered VMM).\n# TYPE {POOL_TRAPS} counter"
    );
    for r in rows {
        let _ = writeln!(s, "{POOL_TRAPS}{{vm=\"{}\"}} {}", r.vm, r.traps);
    }
    let _ = writeln!(
        s,
        "{POOL_TRAPS}{{vm=\"{UNKNOWN_VM}\"}} {}",
        snap.device.traps_unknown
    );
    s
}

#[cfg(test)]
mod tests {
    use super::super::test_support::metrics;
    use fuse_abi::opcode;

    #[test]
    fn renders_required_families() {
        let m = metrics();
        m.set_fuse_compensation_ns(4_500);
        let v = m.vm("vm0");
        v.count_request(opcode::READ);
        v.count_request(999);
        v.record_pacing_error(1500, 30_000);
        v.record_fuse_latency(3_000);
        v.record_fuse_latency(40_000);
        v.record_fuse_latency(40_000);
        v.record_trap_latency(15_000);
        let text = m.render();
        for needle in [
            "cxlfs_fuse_requests_total{vm=\"vm0\",opcode=\"read\"} 1",
            "cxlfs_fuse_requests_total{vm=\"vm0\",opcode=\"unknown\"} 1",
            "cxlfs_read_bytes_total{vm=\"vm0\"} 0",
            "cxlfs_write_bytes_total{vm=\"vm0\"}",
            "cxlfs_device_hits_total{vm=\"vm0\"}",
            "cxlfs_device_misses_total{vm=\"vm0\"}",
            "cxlfs_nand_reads_total 0",
            "cxlfs_nand_programs_total 0",
            "cxlfs_pacing_error_seconds{vm=\"vm0\",modeled=\"ge20us\",quantile=\"0.99\"}",
            "cxlfs_fuse_latency_seconds_bucket{vm=\"vm0\",le=\"0.000002\"} 0",
            "cxlfs_fuse_latency_seconds_bucket{vm=\"vm0\",le=\"0.000005\"} 1",
            "cxlfs_fuse_latency_seconds_bucket{vm=\"vm0\",le=\"0.00002\"} 1",
            "cxlfs_fuse_latency_seconds_bucket{vm=\"vm0\",le=\"0.00005\"} 3",
            "cxlfs_fuse_latency_seconds_bucket{vm=\"vm0\",le=\"+Inf\"} 3",
            "cxlfs_fuse_latency_seconds_count{vm=\"vm0\"} 3",
            "cxlfs_fuse_latency_seconds_quantiles{vm=\"vm0\",quantile=\"0.5\"} 0.0000400",
            "cxlfs_trap_latency_seconds_count{vm=\"vm0\"} 1",
            "cxlfs_trap_latency_seconds_quantiles{vm=\"vm0\",quantile=\"1\"} 0.0000150",
            "cxlfs_dram_tier_pages_total{vm=\"vm0\"} 0",
            "cxlfs_vm_nand_reads_total{vm=\"vm0\"} 0",
            "cxlfs_vm_write_amplification{vm=\"vm0\"} 1",
            "cxlfs_nand_erases_total 0",
            "cxlfs_gc_runs_total 0",
            "cxlfs_write_amplification 1",
            "cxlfs_cxl_ratio_percent 100",
            "cxlfs_placed_pages{tier=\"dram\"} 0",
            "cxlfs_resident_pages{tier=\"cxl\"} 0",
            "cxlfs_shared_pages 0",
            "cxlfs_pool_traps_total{vm=\"vm0\"} 0",
            "cxlfs_pool_traps_total{vm=\"unknown\"} 0",
            "cxlfs_latency_compensation_seconds{path=\"fuse\"} 0.000004500",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        // No vm="all" sample in Prometheus: totals are sums over `vm`.
        assert!(!text.contains("vm=\"all\""));
        // Every sample line is `name{labels} value` with a number.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "bad sample line {line}");
        }
        // One HELP and TYPE per family.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let mut unique = types.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(types.len(), unique.len());
        assert!(std::sync::Arc::ptr_eq(&m.vm("vm0"), &v));
    }
}
