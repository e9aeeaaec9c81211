//! [`Snapshot`]: everything the daemon exports at one moment, one row per
//! VM plus the `all` row and the device-wide values. The Prometheus text,
//! `/metrics.json` and the JSON lines are all made from it; the JSON ones
//! through its wire form, [`MetricsSnapshot`] (crate `cxlfs-api`).

use super::counters::VM_COUNTERS;
use super::latency::{merge_recorded, recorded, LatencyExport};
use super::{DeviceTotals, Metrics};
use crate::sync::lock;
use cxlfs_api::metrics::{CounterInfo, MetricsSnapshot, VmSample, ALL_VM};
use fuse_abi::opcode;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// One VM's row (or the `all` row) of a [`Snapshot`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VmRow {
    /// VM name, or `all`.
    pub vm: String,
    /// Requests per opcode (lower-case names), nonzero only.
    pub fuse_ops: BTreeMap<&'static str, u64>,
    /// [`VM_COUNTERS`] values, in table order.
    pub counters: Vec<u64>,
    /// Traps attributed to the VM (the `all` row: every trap).
    pub traps: u64,
    /// Bytes the VM's DAX window maps now (the `all` row: every VM's).
    pub dax_mapped_bytes: u64,
    /// Host programs during the VM's accesses (for its write amplification).
    pub host_programs: u64,
    /// FUSE request latency.
    pub fuse_latency: LatencyExport,
    /// Trap latency.
    pub trap_latency: LatencyExport,
    /// Pacing error of data-path replies.
    pub pacing_error: LatencyExport,
    /// Pacing error of replies modeled at >= 20 µs.
    pub pacing_error_long: LatencyExport,
}

impl VmRow {
    /// The value of counter `json` ([`super::counters::CounterDef::json`]).
    pub fn counter(&self, json: &str) -> u64 {
        VM_COUNTERS
            .iter()
            .position(|c| c.json == json)
            .and_then(|i| self.counters.get(i).copied())
            .unwrap_or(0)
    }

    /// Write amplification of the NAND work during this row's accesses.
    pub fn write_amplification(&self) -> f64 {
        let programs = self.counter("nand_programs");
        if self.host_programs == 0 {
            1.0
        } else {
            programs as f64 / self.host_programs as f64
        }
    }

    fn to_api(&self, write_amplification: f64) -> VmSample {
        VmSample {
            vm: self.vm.clone(),
            fuse_ops: self
                .fuse_ops
                .iter()
                .map(|(op, n)| (op.to_ascii_uppercase(), *n))
                .collect(),
            traps: self.traps,
            dax_mapped_bytes: self.dax_mapped_bytes,
            write_amplification,
            fuse_latency_ns: self.fuse_latency.summary,
            trap_latency_ns: self.trap_latency.summary,
            pacing_error_ns: self.pacing_error.summary,
            pacing_error_ge20us_ns: self.pacing_error_long.summary,
            counters: VM_COUNTERS
                .iter()
                .zip(&self.counters)
                .map(|(c, v)| (c.json.to_string(), *v))
                .collect(),
        }
    }
}

/// Everything exported, at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// One row per VM, in the order they first appeared.
    pub vms: Vec<VmRow>,
    /// Totals (`vm` = `all`).
    pub all: VmRow,
    /// Device-wide values.
    pub device: DeviceTotals,
    /// Memory mode's regions.
    pub memory_regions: Vec<cxlfs_api::metrics::MemoryRegionSample>,
    /// The hit sources' VM regions.
    pub hit_sources: Vec<cxlfs_api::metrics::HitSourceSample>,
    /// Latency compensation floors (ns) by path: `fuse` always, `dax`
    /// when the residency plane is up.
    pub compensation_ns: Vec<(&'static str, u64)>,
    /// Requests the residency plane answered through FUSE over io_uring
    /// (`None`: no plane).
    pub pool_ring_requests: Option<u64>,
}

impl Snapshot {
    /// The wire form: the body of `/metrics.json`, and what the JSON lines
    /// are made of. The `all` row's write amplification is the device's.
    pub fn to_api(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            counters: VM_COUNTERS
                .iter()
                .map(|c| CounterInfo {
                    field: c.json.into(),
                    family: c.prom.into(),
                    help: c.help.into(),
                })
                .collect(),
            vms: self
                .vms
                .iter()
                .map(|r| r.to_api(r.write_amplification()))
                .collect(),
            all: self.all.to_api(self.device.write_amplification),
            device: self.device.clone(),
            memory_regions: self.memory_regions.clone(),
            hit_sources: self.hit_sources.clone(),
        }
    }
}

impl Metrics {
    /// Everything exported, now.
    pub fn snapshot(&self) -> Snapshot {
        let vms = lock(&self.vms).clone();
        let plane = self.plane_figures();
        let device = self.device_totals_with(&plane);
        let source = self.plane.as_ref();
        let mut all = VmRow {
            vm: ALL_VM.to_string(),
            counters: vec![0; VM_COUNTERS.len()],
            traps: device.traps,
            ..VmRow::default()
        };
        // Per histogram kind: every VM's recorded values, merged for `all`.
        let mut merged: [Vec<Vec<(u64, u64)>>; 4] = Default::default();
        let mut rows = Vec::with_capacity(vms.len());
        for v in &vms {
            let mut fuse_ops = BTreeMap::new();
            for op in 0..=opcode::MAX {
                let n = v.requests(op);
                if n > 0 {
                    fuse_ops.insert(opcode::name(op), n);
                    *all.fuse_ops.entry(opcode::name(op)).or_insert(0) += n;
                }
            }
            let counters: Vec<u64> = VM_COUNTERS.iter().map(|c| (c.vm)(v)).collect();
            for (i, c) in VM_COUNTERS.iter().enumerate() {
                if c.all.is_none() {
                    all.counters[i] += counters[i];
                }
            }
            let host_programs = v.host_programs.load(Ordering::Relaxed);
            all.host_programs += host_programs;
            let id = source.and_then(|p| p.vm_id(&v.name).map(|id| (p, id)));
            let traps = id.map_or(0, |(_, id)| self.traps_since_reset(Some(id), &plane));
            let dax_mapped_bytes = id.map_or(0, |(p, id)| p.mapped_bytes(id));
            all.dax_mapped_bytes += dax_mapped_bytes;
            let (fuse, pacing, long) = {
                let h = lock(&v.replies);
                (
                    recorded(&h.fuse),
                    recorded(&h.pacing),
                    recorded(&h.pacing_long),
                )
            };
            let trap = recorded(&lock(&v.trap_latency));
            let mut export = |values: Vec<(u64, u64)>, kind: usize| {
                let e = LatencyExport::from_recorded(&values);
                merged[kind].push(values);
                e
            };
            rows.push(VmRow {
                vm: v.name.clone(),
                fuse_ops,
                counters,
                traps,
                dax_mapped_bytes,
                host_programs,
                fuse_latency: export(fuse, 0),
                trap_latency: export(trap, 1),
                pacing_error: export(pacing, 2),
                pacing_error_long: export(long, 3),
            });
        }
        for (i, c) in VM_COUNTERS.iter().enumerate() {
            if let Some(f) = c.all {
                all.counters[i] = f(&device);
            }
        }
        let [fuse, trap, pacing, long] =
            merged.map(|l| LatencyExport::from_recorded(&merge_recorded(&l)));
        all.fuse_latency = fuse;
        all.trap_latency = trap;
        all.pacing_error = pacing;
        all.pacing_error_long = long;
        let mut compensation_ns = vec![("fuse", self.fuse_compensation_ns())];
        let plane_up = self.plane.as_ref().is_some_and(|p| p.figures().is_some());
        if plane_up {
            compensation_ns.push(("dax", plane.compensation_ns));
        }
        Snapshot {
            vms: rows,
            all,
            device,
            memory_regions: self.memory_regions(),
            hit_sources: self.hit_sources(),
            compensation_ns,
            pool_ring_requests: plane_up.then_some(plane.ring_requests),
        }
    }
}
