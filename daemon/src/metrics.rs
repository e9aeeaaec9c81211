//! Counters per VM, latency histograms, and the Prometheus text endpoint.
//!
//! VM counters survive reconnects (they are keyed by the VM's name). The
//! endpoint is a tiny blocking HTTP server on its own thread: every request
//! gets the full text exposition, whatever its path.
//!
//! Everything the daemon exports is gathered in one [`Snapshot`] (one row
//! per VM plus the `all` row and the device-wide gauges), which both the
//! Prometheus text ([`Metrics::render`]) and the JSON-lines time series
//! ([`crate::metrics_file`]) are built from, so the two always agree. The
//! per-VM counters are one table ([`VM_COUNTERS`]): adding a row adds the
//! Prometheus family, the JSON field and the `all` total at once.
//!
//! Labels: per-VM families carry `vm="NAME"` and never a `vm="all"` sample
//! (sum over `vm` for the total); device-wide quantities (NAND, GC,
//! placement, residency) are unlabeled families. See `docs/metrics.md`.

use crate::abi::opcode;
use crate::device::{Charge, SharedDevice};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

/// Counters of one VM.
#[derive(Debug)]
pub struct VmMetrics {
    /// The VM's name (label `vm`).
    pub name: String,
    requests: Vec<AtomicU64>,
    /// Bytes returned by READ.
    pub read_bytes: AtomicU64,
    /// Bytes accepted by WRITE.
    pub write_bytes: AtomicU64,
    /// Device page hits caused by this VM (CXL tier).
    pub device_hits: AtomicU64,
    /// Device page misses caused by this VM (CXL tier).
    pub device_misses: AtomicU64,
    /// Page accesses served by the DRAM tier (no device access).
    pub dram_pages: AtomicU64,
    /// NAND page reads during this VM's accesses (fills, prefetches, GC copies).
    pub nand_reads: AtomicU64,
    /// NAND page programs during this VM's accesses (write-backs of the
    /// victims it evicted, GC copies).
    pub nand_programs: AtomicU64,
    /// Of which on behalf of the host (write-backs).
    pub host_programs: AtomicU64,
    /// NAND block erases during this VM's accesses.
    pub nand_erases: AtomicU64,
    /// GC runs (victim blocks reclaimed) during this VM's accesses.
    pub gc_runs: AtomicU64,
    /// Prefetches issued on this VM's misses.
    pub prefetch_issued: AtomicU64,
    /// Prefetched pages this VM used.
    pub prefetch_used: AtomicU64,
    /// Descriptor chains that could not be served (bad addresses, no room).
    pub bad_chains: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// DAX window slots mapped (`SHMEM_MAP` accepted by the front-end).
    pub dax_maps: AtomicU64,
    /// DAX window slots unmapped (`SHMEM_UNMAP` accepted by the front-end).
    pub dax_unmaps: AtomicU64,
    /// Record the latency histograms (FUSE requests, traps, pacing).
    record_latency: AtomicBool,
    /// The reply-side histograms share one lock: a request records two or
    /// three values at once ([`VmMetrics::record_reply`]).
    replies: Mutex<ReplyHistograms>,
    trap_latency: Mutex<Histogram<u64>>,
}

#[derive(Debug)]
struct ReplyHistograms {
    pacing: Histogram<u64>,
    pacing_long: Histogram<u64>,
    fuse: Histogram<u64>,
}

/// Modeled latencies from which on pacing is held to its target (issue 3:
/// p99 < 5 µs for modeled latencies >= 20 µs).
pub const LONG_MODELED_NS: u64 = 20_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s, 3 significant digits: constant, valid bounds.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("constant histogram bounds are valid")
}

fn record(m: &Mutex<Histogram<u64>>, v: u64) {
    put(&mut lock(m), v);
}

fn put(h: &mut Histogram<u64>, v: u64) {
    // Out of range (> 100 s) counts as the highest value.
    h.saturating_record(v.max(1));
}

/// Quantiles of one latency histogram, in ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
    /// Mean (ns).
    pub mean: f64,
}

/// Upper bounds (ns) of the Prometheus histogram buckets (`le`), then +Inf.
pub const BUCKETS_NS: [u64; 18] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
];

/// A latency histogram as exported: quantiles and cumulative buckets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatencyExport {
    /// Quantiles.
    pub summary: LatencySummary,
    /// Samples `<=` each of [`BUCKETS_NS`] (cumulative).
    pub buckets: Vec<u64>,
}

/// The recorded values of a histogram: `(highest equivalent value, count)`
/// per non-empty bucket, ascending. Cheap (only non-empty buckets are
/// visited), so the lock is held briefly and rows can be merged without
/// allocating whole histograms.
fn recorded(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_since_last_iteration()))
        .collect()
}

impl LatencyExport {
    /// Quantiles (as HDR's `value_at_quantile`: the highest equivalent
    /// value of the bucket holding the rank) and buckets of `values`
    /// (ascending `(value, count)` pairs, as [`recorded`] gives them).
    fn from_recorded(values: &[(u64, u64)]) -> Self {
        let count: u64 = values.iter().map(|&(_, n)| n).sum();
        if count == 0 {
            return LatencyExport {
                summary: LatencySummary::default(),
                buckets: vec![0; BUCKETS_NS.len()],
            };
        }
        let qs = [0.5, 0.9, 0.99, 0.999];
        let mut at = [0u64; 4];
        let targets: Vec<u64> = qs
            .iter()
            .map(|q| ((q * count as f64).ceil() as u64).clamp(1, count))
            .collect();
        let mut buckets = vec![0u64; BUCKETS_NS.len()];
        let (mut seen, mut sum, mut qi) = (0u64, 0f64, 0usize);
        for &(v, n) in values {
            seen += n;
            sum += v as f64 * n as f64;
            while qi < qs.len() && seen >= targets[qi] {
                at[qi] = v;
                qi += 1;
            }
            if let Some(b) = BUCKETS_NS.iter().position(|&le| v <= le) {
                buckets[b] += n;
            }
        }
        for i in 1..buckets.len() {
            buckets[i] += buckets[i - 1];
        }
        LatencyExport {
            summary: LatencySummary {
                count,
                p50: at[0],
                p90: at[1],
                p99: at[2],
                p999: at[3],
                max: values.last().map_or(0, |&(v, _)| v),
                mean: sum / count as f64,
            },
            buckets,
        }
    }

    fn of(h: &Histogram<u64>) -> Self {
        Self::from_recorded(&recorded(h))
    }
}

/// Merges ascending `(value, count)` lists into one ascending list.
fn merge_recorded(lists: &[Vec<(u64, u64)>]) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = lists.iter().flatten().copied().collect();
    all.sort_unstable_by_key(|&(v, _)| v);
    all.dedup_by(|b, a| {
        if a.0 == b.0 {
            a.1 += b.1;
            true
        } else {
            false
        }
    });
    all
}

impl VmMetrics {
    /// Zeroed counters for `name`.
    pub fn new(name: &str) -> Self {
        let z = || AtomicU64::new(0);
        VmMetrics {
            name: name.to_string(),
            requests: (0..=opcode::MAX).map(|_| AtomicU64::new(0)).collect(),
            read_bytes: z(),
            write_bytes: z(),
            device_hits: z(),
            device_misses: z(),
            dram_pages: z(),
            nand_reads: z(),
            nand_programs: z(),
            host_programs: z(),
            nand_erases: z(),
            gc_runs: z(),
            prefetch_issued: z(),
            prefetch_used: z(),
            bad_chains: z(),
            connections: z(),
            dax_maps: z(),
            dax_unmaps: z(),
            record_latency: AtomicBool::new(true),
            replies: Mutex::new(ReplyHistograms {
                pacing: new_histogram(),
                pacing_long: new_histogram(),
                fuse: new_histogram(),
            }),
            trap_latency: Mutex::new(new_histogram()),
        }
    }

    /// Counts one request of `op` (unknown opcodes share one slot).
    pub fn count_request(&self, op: u32) {
        let i = (op.min(opcode::MAX)) as usize;
        self.requests[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests seen with opcode `op`.
    pub fn requests(&self, op: u32) -> u64 {
        self.requests[(op.min(opcode::MAX)) as usize].load(Ordering::Relaxed)
    }

    /// Counts what one device charge of this VM did.
    pub fn record_charge(&self, c: &Charge) {
        let add = |a: &AtomicU64, v: u64| {
            if v > 0 {
                a.fetch_add(v, Ordering::Relaxed);
            }
        };
        add(&self.device_hits, c.page_hits);
        add(&self.device_misses, c.page_misses);
        add(&self.dram_pages, c.dram_pages);
        let a = &c.activity;
        add(&self.nand_reads, a.nand_reads);
        add(&self.nand_programs, a.nand_programs);
        add(&self.host_programs, a.host_programs);
        add(&self.nand_erases, a.nand_erases);
        add(&self.gc_runs, a.gc_runs);
        add(&self.prefetch_issued, a.prefetch_issued);
        add(&self.prefetch_used, a.prefetch_used);
    }

    fn recording(&self) -> bool {
        self.record_latency.load(Ordering::Relaxed)
    }

    /// Records one reply put on the used ring at `done_ns` for a request
    /// that arrived at `arrival_ns`: its FUSE latency and, for a data-path
    /// reply held until `deadline_ns`, its pacing error (actual minus
    /// modeled release; early releases, which pacing prevents, count as 0).
    /// One lock for all of it.
    pub fn record_reply(&self, arrival_ns: u64, deadline_ns: Option<u64>, done_ns: u64) {
        if !self.recording() {
            return;
        }
        let mut h = lock(&self.replies);
        put(&mut h.fuse, done_ns.saturating_sub(arrival_ns));
        if let Some(deadline) = deadline_ns {
            let error = done_ns.saturating_sub(deadline);
            put(&mut h.pacing, error);
            if deadline.saturating_sub(arrival_ns) >= LONG_MODELED_NS {
                put(&mut h.pacing_long, error);
            }
        }
    }

    /// Records one pacing error: actual minus modeled completion, in ns
    /// (early completions, which pacing prevents, count as 0), for a reply
    /// whose modeled latency was `modeled_ns`.
    pub fn record_pacing_error(&self, error_ns: i64, modeled_ns: u64) {
        if !self.recording() {
            return;
        }
        let v = error_ns.max(1) as u64;
        let mut h = lock(&self.replies);
        put(&mut h.pacing, v);
        if modeled_ns >= LONG_MODELED_NS {
            put(&mut h.pacing_long, v);
        }
    }

    /// Records one FUSE request's latency: arrival to the reply on the used ring.
    pub fn record_fuse_latency(&self, ns: u64) {
        if self.recording() {
            put(&mut lock(&self.replies).fuse, ns);
        }
    }

    /// Records one trap's latency (arrival at the plane to the modeled
    /// completion its reply is held for).
    pub fn record_trap_latency(&self, ns: u64) {
        if self.recording() {
            record(&self.trap_latency, ns);
        }
    }

    /// `(count, [p50, p90, p99, p999, max])` of the pacing error in ns, over
    /// all data-path replies or (`long_only`) those modeled at >= 20 µs.
    pub fn pacing_summary(&self, long_only: bool) -> (u64, [u64; 5]) {
        let h = lock(&self.replies);
        let s = LatencyExport::of(if long_only { &h.pacing_long } else { &h.pacing }).summary;
        (s.count, [s.p50, s.p90, s.p99, s.p999, s.max])
    }
}

type CounterFn = fn(&VmMetrics) -> u64;
type DeviceFn = fn(&DeviceTotals) -> u64;

/// One per-VM counter: its JSON field, its Prometheus family, and how the
/// `all` row gets it (`None`: the sum over VMs; `Some`: the device's own
/// count, which also covers work no VM caused, e.g. the shutdown flush).
#[derive(Clone, Copy)]
pub struct CounterDef {
    /// JSON-lines field.
    pub json: &'static str,
    /// Prometheus family (label `vm`).
    pub prom: &'static str,
    /// `# HELP` text.
    pub help: &'static str,
    /// The VM's value.
    pub vm: CounterFn,
    /// The `all` row's value.
    pub all: Option<DeviceFn>,
}

fn ld(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The per-VM counters, in export order.
pub const VM_COUNTERS: &[CounterDef] = &[
    CounterDef {
        json: "read_bytes",
        prom: "cxlfs_read_bytes_total",
        help: "Bytes returned by FUSE READ.",
        vm: |v| ld(&v.read_bytes),
        all: None,
    },
    CounterDef {
        json: "write_bytes",
        prom: "cxlfs_write_bytes_total",
        help: "Bytes written by FUSE WRITE.",
        vm: |v| ld(&v.write_bytes),
        all: None,
    },
    CounterDef {
        json: "device_hits",
        prom: "cxlfs_device_hits_total",
        help: "Device DRAM-cache page hits caused by the VM (CXL tier).",
        vm: |v| ld(&v.device_hits),
        all: Some(|d| d.hits),
    },
    CounterDef {
        json: "device_misses",
        prom: "cxlfs_device_misses_total",
        help: "Device DRAM-cache page misses caused by the VM (CXL tier).",
        vm: |v| ld(&v.device_misses),
        all: Some(|d| d.misses),
    },
    CounterDef {
        json: "dram_pages",
        prom: "cxlfs_dram_tier_pages_total",
        help: "Page accesses served by the DRAM tier (no device access, no delay).",
        vm: |v| ld(&v.dram_pages),
        all: None,
    },
    CounterDef {
        json: "nand_reads",
        prom: "cxlfs_vm_nand_reads_total",
        help: "NAND page reads during the VM's accesses (fills, prefetches, GC copies).",
        vm: |v| ld(&v.nand_reads),
        all: Some(|d| d.nand_reads),
    },
    CounterDef {
        json: "nand_programs",
        prom: "cxlfs_vm_nand_programs_total",
        help: "NAND page programs during the VM's accesses (write-backs, GC copies).",
        vm: |v| ld(&v.nand_programs),
        all: Some(|d| d.nand_programs),
    },
    CounterDef {
        json: "nand_erases",
        prom: "cxlfs_vm_nand_erases_total",
        help: "NAND block erases during the VM's accesses.",
        vm: |v| ld(&v.nand_erases),
        all: Some(|d| d.nand_erases),
    },
    CounterDef {
        json: "gc_runs",
        prom: "cxlfs_vm_gc_runs_total",
        help: "GC victim blocks reclaimed during the VM's accesses.",
        vm: |v| ld(&v.gc_runs),
        all: Some(|d| d.gc_runs),
    },
    CounterDef {
        json: "prefetch_issued",
        prom: "cxlfs_vm_prefetch_issued_total",
        help: "Prefetches the device issued on the VM's misses.",
        vm: |v| ld(&v.prefetch_issued),
        all: Some(|d| d.prefetch_issued),
    },
    CounterDef {
        json: "prefetch_used",
        prom: "cxlfs_vm_prefetch_used_total",
        help: "Prefetched pages the VM used.",
        vm: |v| ld(&v.prefetch_used),
        all: Some(|d| d.prefetch_used),
    },
    CounterDef {
        json: "dax_maps",
        prom: "cxlfs_dax_maps_total",
        help: "DAX window slots mapped (VHOST_USER_BACKEND_SHMEM_MAP).",
        vm: |v| ld(&v.dax_maps),
        all: None,
    },
    CounterDef {
        json: "dax_unmaps",
        prom: "cxlfs_dax_unmaps_total",
        help: "DAX window slots unmapped (VHOST_USER_BACKEND_SHMEM_UNMAP).",
        vm: |v| ld(&v.dax_unmaps),
        all: None,
    },
    CounterDef {
        json: "bad_descriptor_chains",
        prom: "cxlfs_bad_descriptor_chains_total",
        help: "Descriptor chains dropped as malformed.",
        vm: |v| ld(&v.bad_chains),
        all: None,
    },
    CounterDef {
        json: "connections",
        prom: "cxlfs_vm_connections_total",
        help: "vhost-user connections accepted.",
        vm: |v| ld(&v.connections),
        all: None,
    },
];

/// Device-wide counters and gauges at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceTotals {
    /// Page hits (all sources).
    pub hits: u64,
    /// Page misses.
    pub misses: u64,
    /// NAND page reads (host + GC).
    pub nand_reads: u64,
    /// NAND page programs (host + GC).
    pub nand_programs: u64,
    /// Block erases.
    pub nand_erases: u64,
    /// GC runs.
    pub gc_runs: u64,
    /// Write amplification (all programs / host programs).
    pub write_amplification: f64,
    /// Prefetches issued.
    pub prefetch_issued: u64,
    /// Prefetched pages used.
    pub prefetch_used: u64,
    /// Cache evictions.
    pub evictions: u64,
    /// Pages in the device cache (the CXL tier's resident pages).
    pub resident_pages: u64,
    /// Dirty pages in the device cache.
    pub dirty_pages: u64,
    /// The eviction policy.
    pub policy: String,
    /// `cxl_ratio` in force.
    pub cxl_ratio: u8,
    /// Placed (touched) pool pages on the DRAM tier: always resident.
    pub placed_dram_pages: u64,
    /// Placed pool pages on the CXL tier.
    pub placed_cxl_pages: u64,
    /// Pool pages mapped by two or more VMs' DAX windows.
    pub shared_pages: u64,
    /// Pool bytes allocated to files.
    pub pool_allocated_bytes: u64,
    /// File chunks that had to share an extent.
    pub pool_aliased_extents: u64,
    /// Residency-plane traps (all VMs and unknown threads).
    pub traps: u64,
    /// Traps of threads of no registered VMM.
    pub traps_unknown: u64,
    /// Pool bytes resident in the plane (upper bound).
    pub pool_resident_bytes: u64,
    /// Plane evictions.
    pub pool_evictions: u64,
    /// Prefetched pages pushed into the plane (they never trap).
    pub pool_prefetch_stores: u64,
}

impl DeviceTotals {
    /// The achieved share of placed pages on the CXL tier (0..=1; 1 when
    /// nothing is placed yet and the ratio is 100).
    pub fn achieved_cxl_share(&self) -> f64 {
        let total = self.placed_dram_pages + self.placed_cxl_pages;
        if total == 0 {
            f64::from(self.cxl_ratio) / 100.0
        } else {
            self.placed_cxl_pages as f64 / total as f64
        }
    }
}

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
    /// The value of counter `json` ([`CounterDef::json`]).
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
}

/// All metrics of the daemon.
#[derive(Debug)]
pub struct Metrics {
    vms: Mutex<Vec<Arc<VmMetrics>>>,
    shared: Arc<SharedDevice>,
    dax: std::sync::OnceLock<Arc<crate::dax::DaxPlane>>,
    record_latency: AtomicBool,
    /// Plane trap counts at the last `reset_stats` (the plane's own
    /// counters never go back), by VM id (`None`: unknown threads).
    trap_baseline: Mutex<BTreeMap<Option<residency::VmId>, u64>>,
}

impl Metrics {
    /// Metrics over the shared device.
    pub fn new(shared: Arc<SharedDevice>) -> Self {
        Metrics {
            vms: Mutex::new(Vec::new()),
            shared,
            dax: std::sync::OnceLock::new(),
            record_latency: AtomicBool::new(true),
            trap_baseline: Mutex::new(BTreeMap::new()),
        }
    }

    /// The counters of VM `name`, if it was ever configured or seen.
    pub fn vm_if_known(&self, name: &str) -> Option<Arc<VmMetrics>> {
        lock(&self.vms).iter().find(|v| v.name == name).cloned()
    }

    /// Names of the VMs with counters.
    pub fn vm_names(&self) -> Vec<String> {
        lock(&self.vms).iter().map(|v| v.name.clone()).collect()
    }

    /// Pool traps of `vm` since start or the last reset (0 without DAX);
    /// the value of `cxlfs_pool_traps_total{vm}`.
    pub fn traps_of(&self, vm: &str) -> u64 {
        let Some(d) = self.dax.get() else { return 0 };
        let Some(id) = d.find_vm_id(vm) else { return 0 };
        let snap = d.plane_metrics().unwrap_or_default();
        self.traps_since_reset(Some(id), &snap)
    }

    /// All pool traps (VMs and unknown threads) since start or the last reset.
    pub fn traps_total(&self) -> u64 {
        let Some(d) = self.dax.get() else { return 0 };
        let snap = d.plane_metrics().unwrap_or_default();
        self.all_traps_since_reset(&snap)
    }

    fn all_traps_since_reset(&self, snap: &residency::PlaneMetricsSnapshot) -> u64 {
        snap.traps_by_vm
            .keys()
            .map(|&k| self.traps_since_reset(k, snap))
            .sum()
    }

    fn traps_since_reset(
        &self,
        vm: Option<residency::VmId>,
        snap: &residency::PlaneMetricsSnapshot,
    ) -> u64 {
        let now = snap.traps_by_vm.get(&vm).copied().unwrap_or(0);
        let base = lock(&self.trap_baseline).get(&vm).copied().unwrap_or(0);
        now.saturating_sub(base)
    }

    /// `reset_stats`: zeroes every VM's device-activity counters (hits,
    /// misses, NAND, GC, prefetch) and restarts the trap counts, so
    /// Prometheus sees a counter reset; FUSE request counts, bytes and
    /// latency histograms run on.
    pub fn reset_device_counters(&self) {
        for v in lock(&self.vms).iter() {
            for c in [
                &v.device_hits,
                &v.device_misses,
                &v.dram_pages,
                &v.nand_reads,
                &v.nand_programs,
                &v.host_programs,
                &v.nand_erases,
                &v.gc_runs,
                &v.prefetch_issued,
                &v.prefetch_used,
            ] {
                c.store(0, Ordering::Relaxed);
            }
        }
        if let Some(snap) = self.dax.get().and_then(|d| d.plane_metrics()) {
            *lock(&self.trap_baseline) = snap.traps_by_vm.clone();
        }
    }

    /// Adds the residency plane's counters (DAX on). Once only.
    pub fn attach_dax(&self, dax: Arc<crate::dax::DaxPlane>) {
        let _ = self.dax.set(dax);
    }

    /// Turns the latency histograms (FUSE requests, traps, pacing error)
    /// on or off for every VM, present and future (counters always count).
    pub fn set_latency_recording(&self, on: bool) {
        self.record_latency.store(on, Ordering::Relaxed);
        for v in lock(&self.vms).iter() {
            v.record_latency.store(on, Ordering::Relaxed);
        }
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

    /// The device (for device-wide values).
    pub fn shared(&self) -> &Arc<SharedDevice> {
        &self.shared
    }

    /// Device-wide values now.
    pub fn device_totals(&self) -> DeviceTotals {
        let st = self.shared.stats();
        let cxl_ratio = self.shared.cxl_ratio();
        let (placed_dram_pages, placed_cxl_pages, pool_allocated_bytes, pool_aliased_extents) = {
            let pool = self.shared.pool();
            let (d, c) = pool.placed_pages(cxl_ratio);
            (
                d,
                c,
                pool.allocated_extents() * crate::device::EXTENT_SIZE,
                pool.aliased_chunks(),
            )
        };
        let dax = self.dax.get();
        let plane = dax.and_then(|d| d.plane_metrics()).unwrap_or_default();
        DeviceTotals {
            hits: st.hits,
            misses: st.misses,
            nand_reads: st.nand.reads(),
            nand_programs: st.nand.programs(),
            nand_erases: st.nand.erases,
            gc_runs: st.nand.gc_runs,
            write_amplification: st.nand.write_amplification(),
            prefetch_issued: st.prefetch_issued,
            prefetch_used: st.prefetch_used,
            evictions: st.evictions,
            resident_pages: st.resident_pages,
            dirty_pages: st.dirty_pages,
            policy: st.policy,
            cxl_ratio,
            placed_dram_pages,
            placed_cxl_pages,
            shared_pages: dax.map_or(0, |d| d.shared_pages()),
            pool_allocated_bytes,
            pool_aliased_extents,
            traps: self.all_traps_since_reset(&plane),
            traps_unknown: self.traps_since_reset(None, &plane),
            pool_resident_bytes: plane.resident_bytes,
            pool_evictions: plane.invalidations,
            pool_prefetch_stores: dax.map_or(0, |d| d.prefetch_pushed()),
        }
    }

    /// Everything exported, now.
    pub fn snapshot(&self) -> Snapshot {
        let vms = lock(&self.vms).clone();
        let device = self.device_totals();
        let dax = self.dax.get();
        let plane = dax.and_then(|d| d.plane_metrics()).unwrap_or_default();
        let mut all = VmRow {
            vm: "all".to_string(),
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
            let host_programs = ld(&v.host_programs);
            all.host_programs += host_programs;
            let traps = dax
                .and_then(|d| d.find_vm_id(&v.name))
                .map_or(0, |id| self.traps_since_reset(Some(id), &plane));
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
        Snapshot {
            vms: rows,
            all,
            device,
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        render_prometheus(&self.snapshot())
    }
}

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
        let e = &get(r).summary;
        for (label, v) in ["0.5", "0.9", "0.99", "0.999", "1"]
            .iter()
            .zip([e.p50, e.p90, e.p99, e.p999, e.max])
        {
            let _ = writeln!(
                s,
                "{q}{{vm=\"{}\",quantile=\"{label}\"}} {:.9}",
                r.vm,
                secs(v)
            );
        }
        let _ = writeln!(s, "{q}_count{{vm=\"{}\"}} {}", r.vm, e.count);
    }
}

/// The Prometheus text of a snapshot.
pub fn render_prometheus(snap: &Snapshot) -> String {
    let rows = &snap.vms;
    let mut s = String::with_capacity(8192);
    let _ = writeln!(
        s,
        "# HELP cxlfs_fuse_requests_total FUSE requests received, by VM and opcode.\n# TYPE cxlfs_fuse_requests_total counter"
    );
    for r in rows {
        for (op, n) in &r.fuse_ops {
            let _ = writeln!(
                s,
                "cxlfs_fuse_requests_total{{vm=\"{}\",opcode=\"{op}\"}} {n}",
                r.vm
            );
        }
    }
    for (i, c) in VM_COUNTERS.iter().enumerate() {
        let _ = writeln!(s, "# HELP {} {}\n# TYPE {} counter", c.prom, c.help, c.prom);
        for r in rows {
            let _ = writeln!(s, "{}{{vm=\"{}\"}} {}", c.prom, r.vm, r.counters[i]);
        }
    }
    let _ = writeln!(
        s,
        "# HELP cxlfs_vm_write_amplification NAND programs / host programs during the VM's accesses.\n# TYPE cxlfs_vm_write_amplification gauge"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "cxlfs_vm_write_amplification{{vm=\"{}\"}} {}",
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
            let q = &e.summary;
            for (label, val) in ["0.5", "0.9", "0.99", "0.999", "1"]
                .iter()
                .zip([q.p50, q.p90, q.p99, q.p999, q.max])
            {
                let _ = writeln!(
                    s,
                    "cxlfs_pacing_error_seconds{{vm=\"{}\",modeled=\"{class}\",quantile=\"{label}\"}} {:.9}",
                    r.vm,
                    secs(val)
                );
            }
            let _ = writeln!(
                s,
                "cxlfs_pacing_error_seconds_count{{vm=\"{}\",modeled=\"{class}\"}} {}",
                r.vm, q.count
            );
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
    let d = &snap.device;
    let global: [(&str, &str, &str, String); 21] = [
        (
            "cxlfs_nand_reads_total",
            "counter",
            "NAND page reads (host + GC).",
            d.nand_reads.to_string(),
        ),
        (
            "cxlfs_nand_programs_total",
            "counter",
            "NAND page programs (host + GC).",
            d.nand_programs.to_string(),
        ),
        (
            "cxlfs_nand_erases_total",
            "counter",
            "NAND block erases.",
            d.nand_erases.to_string(),
        ),
        (
            "cxlfs_gc_runs_total",
            "counter",
            "GC victim blocks reclaimed.",
            d.gc_runs.to_string(),
        ),
        (
            "cxlfs_write_amplification",
            "gauge",
            "NAND programs / host programs.",
            d.write_amplification.to_string(),
        ),
        (
            "cxlfs_prefetch_issued_total",
            "counter",
            "Prefetches issued by the device.",
            d.prefetch_issued.to_string(),
        ),
        (
            "cxlfs_prefetch_used_total",
            "counter",
            "Prefetched pages used.",
            d.prefetch_used.to_string(),
        ),
        (
            "cxlfs_device_hits_all_total",
            "counter",
            "Device page hits (all sources).",
            d.hits.to_string(),
        ),
        (
            "cxlfs_device_misses_all_total",
            "counter",
            "Device page misses (all sources).",
            d.misses.to_string(),
        ),
        (
            "cxlfs_device_evictions_total",
            "counter",
            "Device cache evictions.",
            d.evictions.to_string(),
        ),
        (
            "cxlfs_device_resident_pages",
            "gauge",
            "Pages in the device cache.",
            d.resident_pages.to_string(),
        ),
        (
            "cxlfs_device_dirty_pages",
            "gauge",
            "Dirty pages in the device cache.",
            d.dirty_pages.to_string(),
        ),
        (
            "cxlfs_cxl_ratio_percent",
            "gauge",
            "Share of file pages placed on the CXL tier (setting).",
            d.cxl_ratio.to_string(),
        ),
        (
            "cxlfs_placed_cxl_share",
            "gauge",
            "Achieved share of placed pages on the CXL tier.",
            d.achieved_cxl_share().to_string(),
        ),
        (
            "cxlfs_shared_pages",
            "gauge",
            "Pool pages mapped by two or more VMs' DAX windows.",
            d.shared_pages.to_string(),
        ),
        (
            "cxlfs_pool_allocated_bytes",
            "gauge",
            "Pool bytes allocated to files.",
            d.pool_allocated_bytes.to_string(),
        ),
        (
            "cxlfs_pool_aliased_extents_total",
            "counter",
            "File chunks that had to share a pool extent.",
            d.pool_aliased_extents.to_string(),
        ),
        (
            "cxlfs_pool_resident_bytes",
            "gauge",
            "Pool bytes resident in the residency plane (upper bound).",
            d.pool_resident_bytes.to_string(),
        ),
        (
            "cxlfs_pool_evictions_total",
            "counter",
            "Pool ranges evicted from the residency plane.",
            d.pool_evictions.to_string(),
        ),
        (
            "cxlfs_pool_prefetch_stores_total",
            "counter",
            "Prefetched pages pushed into the residency plane (NOTIFY_STORE): first touches that do not trap.",
            d.pool_prefetch_stores.to_string(),
        ),
        (
            "cxlfs_traps_all_total",
            "counter",
            "Residency-plane traps, every VM and unknown threads.",
            d.traps.to_string(),
        ),
    ];
    for (name, typ, help, v) in global {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {typ}\n{name} {v}");
    }
    let _ = writeln!(
        s,
        "# HELP cxlfs_placed_pages Pool pages placed (touched) per tier; dram pages are always resident.\n# TYPE cxlfs_placed_pages gauge\ncxlfs_placed_pages{{tier=\"dram\"}} {}\ncxlfs_placed_pages{{tier=\"cxl\"}} {}",
        d.placed_dram_pages, d.placed_cxl_pages
    );
    let _ = writeln!(
        s,
        "# HELP cxlfs_resident_pages Resident pages per tier: dram = placed DRAM-tier pages, cxl = pages in the device cache.\n# TYPE cxlfs_resident_pages gauge\ncxlfs_resident_pages{{tier=\"dram\"}} {}\ncxlfs_resident_pages{{tier=\"cxl\"}} {}",
        d.placed_dram_pages, d.resident_pages
    );
    let _ = writeln!(
        s,
        "# HELP cxlfs_device_policy_info The device cache's eviction policy.\n# TYPE cxlfs_device_policy_info gauge\ncxlfs_device_policy_info{{policy=\"{}\"}} 1",
        d.policy
    );
    let _ = writeln!(
        s,
        "# HELP cxlfs_pool_traps_total Pool page misses that trapped into the daemon, by VM (unknown: not a registered VMM).\n# TYPE cxlfs_pool_traps_total counter"
    );
    for r in rows {
        let _ = writeln!(s, "cxlfs_pool_traps_total{{vm=\"{}\"}} {}", r.vm, r.traps);
    }
    let _ = writeln!(
        s,
        "cxlfs_pool_traps_total{{vm=\"unknown\"}} {}",
        d.traps_unknown
    );
    s
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartMetricsError {
    /// Not a loopback address and `--metrics-allow-remote` not given.
    #[error("metrics address {0} is not loopback; pass --metrics-allow-remote to expose it")]
    NotLoopback(SocketAddr),
    /// bind() failed.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Starts the HTTP endpoint; returns the bound address.
pub fn serve(
    addr: SocketAddr,
    allow_remote: bool,
    metrics: Arc<Metrics>,
) -> Result<SocketAddr, StartMetricsError> {
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(StartMetricsError::NotLoopback(addr));
    }
    let listener =
        TcpListener::bind(addr).map_err(|source| StartMetricsError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| StartMetricsError::Bind { addr, source })?;
    thread::Builder::new()
        .name("cxlfsd-metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(s) => {
                        if let Err(e) = answer(s, &metrics) {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "metrics accept failed"),
                }
            }
        })
        .map_err(|source| StartMetricsError::Bind { addr, source })?;
    Ok(bound)
}

fn answer(stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    // Read the request head (and ignore it).
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let body = metrics.render();
    let mut w = stream;
    write!(
        w,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cxlfs_device_model::{Device, DeviceConfig};

    #[test]
    fn renders_required_families() {
        let shared = Arc::new(SharedDevice::new(
            Device::new(DeviceConfig::default()).unwrap(),
        ));
        let m = Metrics::new(shared);
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
        assert!(Arc::ptr_eq(&m.vm("vm0"), &v));
    }

    #[test]
    fn quantiles_and_buckets_match_hdr() {
        let mut a = new_histogram();
        let mut b = new_histogram();
        let mut both = new_histogram();
        let mut x = 12345u64;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = 500 + x % 3_000_000;
            let h = if i % 3 == 0 { &mut a } else { &mut b };
            h.record(v).unwrap();
            both.record(v).unwrap();
        }
        let merged = LatencyExport::from_recorded(&merge_recorded(&[recorded(&a), recorded(&b)]));
        for e in [LatencyExport::of(&both), merged] {
            let s = e.summary;
            assert_eq!(s.count, 20_000);
            assert_eq!(s.p50, both.value_at_quantile(0.5));
            assert_eq!(s.p90, both.value_at_quantile(0.9));
            assert_eq!(s.p99, both.value_at_quantile(0.99));
            assert_eq!(s.p999, both.value_at_quantile(0.999));
            assert_eq!(s.max, both.max());
            assert!((s.mean - both.mean()).abs() / both.mean() < 0.01);
            // `le` counts the buckets whose every value is <= le: HDR's
            // count up to le, less at most the bucket that straddles le.
            for (&le, &n) in BUCKETS_NS.iter().zip(&e.buckets) {
                let below = both.count_between(0, both.lowest_equivalent(le) - 1);
                assert!(below <= n && n <= both.count_between(0, le), "le {le}: {n}");
            }
        }
        let empty = LatencyExport::of(&new_histogram());
        assert_eq!(empty.summary, LatencySummary::default());
        assert!(empty.buckets.iter().all(|&n| n == 0));
    }

    #[test]
    fn refuses_remote_without_flag() {
        let shared = Arc::new(SharedDevice::new(
            Device::new(DeviceConfig::default()).unwrap(),
        ));
        let m = Arc::new(Metrics::new(shared));
        let addr: SocketAddr = "0.0.0.0:0".parse().unwrap();
        assert!(matches!(
            serve(addr, false, m.clone()),
            Err(StartMetricsError::NotLoopback(_))
        ));
        let bound = serve("127.0.0.1:0".parse().unwrap(), false, m).unwrap();
        let mut s = TcpStream::connect(bound).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut s, &mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"));
        assert!(out.contains("cxlfs_nand_reads_total"));
    }
}
