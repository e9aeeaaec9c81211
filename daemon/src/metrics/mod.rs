//! Counters per VM, latency histograms, and their exports: the Prometheus
//! text and JSON endpoint, and the JSON-lines time series.
//!
//! A leaf: this module knows no other daemon module (only the FUSE opcode
//! names of the FUSE ABI crate). The figures it
//! does not count itself come in through providers registered at start
//! ([`DeviceSource`] for the device model, placement and pool, and
//! [`PlaneSource`] for the residency plane when DAX is on, both given to
//! [`Metrics::new`]), and the data path hands its
//! device work over as plain [`DeviceWork`]. The implementations live with
//! what they describe: the device's in `device/figures.rs`, the plane's in
//! `dax/`.
//!
//! * [`counters`] — [`VmMetrics`] and the per-VM counter table
//!   ([`VM_COUNTERS`]), both from one `vm_counters!` declaration: adding a
//!   counter is one line there plus the call site that increments it;
//! * [`latency`] — HDR histograms and their export;
//! * [`snapshot`] — [`Snapshot`]: everything exported at one moment, and
//!   its wire form ([`cxlfs_api::metrics::MetricsSnapshot`]);
//! * [`prometheus`] — the text exposition;
//! * [`http`] — the endpoint (`/metrics.json`: JSON; any other path: text);
//! * [`file`] — the JSON-lines series (`--metrics-file`).
//!
//! VM counters survive reconnects (they are keyed by the VM's name). Both
//! the Prometheus text and the JSON outputs are built from one [`Snapshot`],
//! so they always agree.
//!
//! Labels: per-VM families carry `vm="NAME"` and never a `vm="all"` sample
//! (sum over `vm` for the total); device-wide quantities (NAND, GC,
//! placement, residency) are unlabeled families. See `docs/metrics.md`.

pub mod counters;
pub mod file;
pub mod http;
pub mod latency;
pub mod prometheus;
pub mod snapshot;

pub use counters::{DeviceWork, VmMetrics};
pub use cxlfs_api::metrics::{DeviceTotals, HitSourceSample, MemoryRegionSample};
pub use http::serve;
pub use prometheus::render_prometheus;
pub use snapshot::Snapshot;

use crate::sync::lock;
use latency::put;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The residency plane's id of a VM (its VMM's threads' traps count for it).
pub type PlaneVmId = u32;

/// The device-wide figures of the device model, placement and pool:
/// registered at start ([`Metrics::new`]).
pub trait DeviceSource: Send + Sync {
    /// The figures now. The plane's fields (`shared_pages`, `traps`,
    /// `traps_unknown`, `pool_resident_bytes`, `pool_evictions`,
    /// `pool_prefetch_stores`) are left 0: [`Metrics`] fills them from the
    /// [`PlaneSource`].
    fn totals(&self) -> DeviceTotals;
}

/// The residency plane's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlaneFigures {
    /// Traps per VM since the plane started (`None`: threads of no
    /// registered VMM); they never go back.
    pub traps_by_vm: BTreeMap<Option<PlaneVmId>, u64>,
    /// Pool bytes resident in the plane (upper bound).
    pub resident_bytes: u64,
    /// Pool ranges evicted from the plane.
    pub evictions: u64,
    /// Time those evictions waited for the plane's notifier, summed (ns).
    pub eviction_lag_ns: u64,
    /// The longest such wait (ns).
    pub eviction_lag_max_ns: u64,
    /// Misses held back for the backlog of evicted pages, their time held
    /// back (ns), and the waits that hit their limit.
    pub backlog_waits: u64,
    /// See `backlog_waits`.
    pub backlog_wait_ns: u64,
    /// See `backlog_waits`.
    pub backlog_overruns: u64,
    /// The trap path's floor that miss replies are released ahead of
    /// their modeled completion by now (ns; 0: compensation off).
    pub compensation_ns: u64,
    /// Requests answered through FUSE over io_uring (0 on `/dev/fuse`).
    pub ring_requests: u64,
}

/// The residency plane's figures (DAX on): attached once it is up
/// (given to [`Metrics::new`]).
pub trait PlaneSource: Send + Sync {
    /// The plane's counters now (`None` once it is shut down).
    fn figures(&self) -> Option<PlaneFigures>;
    /// The plane's id of VM `name`, if it has one.
    fn vm_id(&self, name: &str) -> Option<PlaneVmId>;
    /// Pool pages mapped by two or more VMs' DAX windows now.
    fn shared_pages(&self) -> u64;
    /// Prefetched pages pushed into the plane so far.
    fn prefetch_stores(&self) -> u64;
    /// Bytes VM `vm`'s DAX window maps now.
    fn mapped_bytes(&self, vm: PlaneVmId) -> u64;
}

/// Memory mode's regions (registered at start when there are any).
pub trait MemorySource: Send + Sync {
    /// One row per region, now.
    fn regions(&self) -> Vec<MemoryRegionSample>;
}

/// The hit sources (accessed bits, access sampling) as the metrics see them.
pub trait HitSourcesSource: Send + Sync {
    /// One row per VM region a source tracks, now.
    fn samples(&self) -> Vec<HitSourceSample>;
    /// Adds the sources' device-wide figures to `totals`.
    fn add_totals(&self, totals: &mut DeviceTotals);
}

/// All metrics of the daemon.
pub struct Metrics {
    vms: Mutex<Vec<Arc<VmMetrics>>>,
    device: Arc<dyn DeviceSource>,
    plane: Option<Arc<dyn PlaneSource>>,
    memory: Option<Arc<dyn MemorySource>>,
    /// Set once the sources start (after the metrics).
    hits: std::sync::OnceLock<Arc<dyn HitSourcesSource>>,
    record_latency: AtomicBool,
    /// Plane trap counts at the last `reset_stats` (the plane's own
    /// counters never go back), by VM id (`None`: unknown threads).
    trap_baseline: Mutex<BTreeMap<Option<PlaneVmId>, u64>>,
    /// The virtio-fs path's latency-compensation floor (ns; 0: off).
    fuse_compensation_ns: AtomicU64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("vms", &self.vm_names())
            .field("plane", &self.plane.as_ref().is_some())
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Adds memory mode's regions to what is exported.
    pub fn with_memory(mut self, memory: Arc<dyn MemorySource>) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Adds the hit sources to what is exported (once; later calls are ignored).
    pub fn set_hit_sources(&self, hits: Arc<dyn HitSourcesSource>) {
        let _ = self.hits.set(hits);
    }

    /// The hit sources' rows now (none before they start).
    pub fn hit_sources(&self) -> Vec<HitSourceSample> {
        self.hits.get().map(|h| h.samples()).unwrap_or_default()
    }

    /// The memory regions' rows now (none without memory mode).
    pub fn memory_regions(&self) -> Vec<MemoryRegionSample> {
        self.memory
            .as_ref()
            .map(|m| m.regions())
            .unwrap_or_default()
    }

    /// Metrics over the device figures of `device`.
    pub fn new(device: Arc<dyn DeviceSource>, plane: Option<Arc<dyn PlaneSource>>) -> Self {
        Metrics {
            vms: Mutex::new(Vec::new()),
            device,
            plane,
            memory: None,
            hits: std::sync::OnceLock::new(),
            record_latency: AtomicBool::new(true),
            trap_baseline: Mutex::new(BTreeMap::new()),
            fuse_compensation_ns: AtomicU64::new(0),
        }
    }

    /// Sets the virtio-fs path's latency-compensation floor (ns) that
    /// `cxlfs_latency_compensation_seconds{path="fuse"}` shows.
    pub fn set_fuse_compensation_ns(&self, ns: u64) {
        self.fuse_compensation_ns.store(ns, Ordering::Relaxed);
    }

    /// The virtio-fs path's latency-compensation floor (ns; 0: off).
    pub fn fuse_compensation_ns(&self) -> u64 {
        self.fuse_compensation_ns.load(Ordering::Relaxed)
    }

    /// The counters of VM `name`, if it was ever configured or seen.
    pub fn vm_if_known(&self, name: &str) -> Option<Arc<VmMetrics>> {
        lock(&self.vms).iter().find(|v| v.name == name).cloned()
    }

    /// Names of the VMs with counters.
    pub fn vm_names(&self) -> Vec<String> {
        lock(&self.vms).iter().map(|v| v.name.clone()).collect()
    }

    /// The counters of VM `name` (created on first use, kept across reconnects).
    pub fn vm(&self, name: &str) -> Arc<VmMetrics> {
        let mut vms = lock(&self.vms);
        if let Some(v) = vms.iter().find(|v| v.name == name) {
            return v.clone();
        }
        let v = Arc::new(VmMetrics::new(name));
        v.record_latency.store(
            self.record_latency.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        vms.push(v.clone());
        v
    }

    /// The plane's figures now (all zero without DAX).
    fn plane_figures(&self) -> PlaneFigures {
        self.plane
            .as_ref()
            .and_then(|p| p.figures())
            .unwrap_or_default()
    }

    /// Pool traps of `vm` since start or the last reset (0 without DAX);
    /// the value of `cxlfs_pool_traps_total{vm}`.
    pub fn traps_of(&self, vm: &str) -> u64 {
        let Some(id) = self.plane.as_ref().and_then(|p| p.vm_id(vm)) else {
            return 0;
        };
        self.traps_since_reset(Some(id), &self.plane_figures())
    }

    /// All pool traps (VMs and unknown threads) since start or the last reset.
    pub fn traps_total(&self) -> u64 {
        self.all_traps_since_reset(&self.plane_figures())
    }

    fn all_traps_since_reset(&self, plane: &PlaneFigures) -> u64 {
        plane
            .traps_by_vm
            .keys()
            .map(|&k| self.traps_since_reset(k, plane))
            .sum()
    }

    fn traps_since_reset(&self, vm: Option<PlaneVmId>, plane: &PlaneFigures) -> u64 {
        let now = plane.traps_by_vm.get(&vm).copied().unwrap_or(0);
        let base = lock(&self.trap_baseline).get(&vm).copied().unwrap_or(0);
        now.saturating_sub(base)
    }

    /// `reset_stats`: zeroes every VM's device-activity counters (hits,
    /// misses, NAND, GC, prefetch: what `DeviceWork` feeds) and restarts
    /// the trap counts, so Prometheus sees a counter reset; FUSE request
    /// counts, bytes and latency histograms run on.
    pub fn reset_device_counters(&self) {
        for v in lock(&self.vms).iter() {
            for c in v.work_counters() {
                c.store(0, Ordering::Relaxed);
            }
        }
        if let Some(plane) = self.plane.as_ref().and_then(|p| p.figures()) {
            *lock(&self.trap_baseline) = plane.traps_by_vm;
        }
    }

    /// Turns the latency histograms (FUSE requests, traps, pacing error)
    /// on or off for every VM, present and future (counters always count).
    pub fn set_latency_recording(&self, on: bool) {
        self.record_latency.store(on, Ordering::Relaxed);
        for v in lock(&self.vms).iter() {
            v.record_latency.store(on, Ordering::Relaxed);
        }
    }

    /// Device-wide values now.
    pub fn device_totals(&self) -> DeviceTotals {
        self.device_totals_with(&self.plane_figures())
    }

    fn device_totals_with(&self, plane: &PlaneFigures) -> DeviceTotals {
        let source = self.plane.as_ref();
        let mut totals = DeviceTotals {
            shared_pages: source.map_or(0, |p| p.shared_pages()),
            traps: self.all_traps_since_reset(plane),
            traps_unknown: self.traps_since_reset(None, plane),
            pool_resident_bytes: plane.resident_bytes,
            pool_evictions: plane.evictions,
            pool_eviction_lag_ns: plane.eviction_lag_ns,
            pool_eviction_lag_max_ns: plane.eviction_lag_max_ns,
            pool_backlog_waits: plane.backlog_waits,
            pool_backlog_wait_ns: plane.backlog_wait_ns,
            pool_backlog_overruns: plane.backlog_overruns,
            pool_prefetch_stores: source.map_or(0, |p| p.prefetch_stores()),
            ..self.device.totals()
        };
        if let Some(h) = self.hits.get() {
            h.add_totals(&mut totals);
        }
        totals
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        render_prometheus(&self.snapshot())
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! A fixed device for the module's own tests.
    use super::*;

    /// The figures of an idle default device (ratio 100, no work yet).
    #[derive(Debug)]
    pub struct IdleDevice;

    impl DeviceSource for IdleDevice {
        fn totals(&self) -> DeviceTotals {
            DeviceTotals {
                write_amplification: 1.0,
                policy: "lru".into(),
                cxl_ratio: 100,
                ..DeviceTotals::default()
            }
        }
    }

    /// Metrics over [`IdleDevice`].
    pub fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::new(Arc::new(IdleDevice), None))
    }
}
