//! The metrics snapshot as JSON: what `/metrics.json` and `--metrics-file` carry.
//!
//! * [`MetricsSnapshot`] is the body of `GET /metrics.json` on the daemon's
//!   metrics address: one [`VmSample`] per VM, the `all` row, the
//!   device-wide [`DeviceTotals`], and the table of per-VM counters
//!   ([`CounterInfo`]: JSON field, Prometheus family, help).
//! * [`SampleLine`] is one line of the `--metrics-file` JSON-lines series:
//!   the sample's time and number, one VM's row (or `all`), and the
//!   device-wide gauges ([`DeviceGauges`]) repeated in every line.
//!
//! The daemon serializes these types; clients (`cxlfs run`, the e2e
//! harness) deserialize them, so nobody parses the Prometheus text back.
//! The Prometheus names of the device-wide figures are here too
//! ([`DeviceTotals::families`], [`FUSE_REQUESTS`], …): the daemon renders
//! them and a client that names its columns after them gets the same names.
//! Field meanings: `docs/metrics.md`.

use crate::hits::{HitSourceKind, RegionKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Per-VM family: FUSE requests by VM and opcode (`vm`, `opcode` labels).
pub const FUSE_REQUESTS: &str = "cxlfs_fuse_requests_total";
/// Per-VM gauge: the VM's write amplification.
pub const VM_WRITE_AMPLIFICATION: &str = "cxlfs_vm_write_amplification";
/// Per-VM family: residency-plane traps (also `vm="unknown"`).
pub const POOL_TRAPS: &str = "cxlfs_pool_traps_total";
/// The `vm` label of traps by threads of no registered VMM.
pub const UNKNOWN_VM: &str = "unknown";
/// The `vm` of the total row (JSON only: Prometheus has no `vm="all"`).
pub const ALL_VM: &str = "all";

/// Quantiles of one latency histogram, in ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
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

/// One per-VM counter of the daemon's table: its JSON field in a
/// [`VmSample`] and its Prometheus family (label `vm`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterInfo {
    /// JSON field (a key of [`VmSample::counters`]).
    pub field: String,
    /// Prometheus family, e.g. `cxlfs_read_bytes_total`.
    pub family: String,
    /// `# HELP` text.
    pub help: String,
}

/// One VM's figures, or the `all` row's.
///
/// In JSON the counters are plain fields of the object (`"read_bytes":…`),
/// next to the named ones.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VmSample {
    /// VM name, or `all`.
    pub vm: String,
    /// Requests per opcode (upper-case names), nonzero only.
    pub fuse_ops: BTreeMap<String, u64>,
    /// Residency-plane traps of the VM's VMM threads (`all`: every trap).
    pub traps: u64,
    /// Bytes the VM's DAX window maps now: its resident file pages
    /// (`all`: every VM's).
    pub dax_mapped_bytes: u64,
    /// NAND programs / host programs during the VM's accesses (1 when
    /// none; `all`: the device's).
    pub write_amplification: f64,
    /// FUSE request latency.
    pub fuse_latency_ns: LatencySummary,
    /// Trap latency.
    pub trap_latency_ns: LatencySummary,
    /// Pacing error of data-path replies.
    pub pacing_error_ns: LatencySummary,
    /// Pacing error of replies modeled at >= 20 µs.
    pub pacing_error_ge20us_ns: LatencySummary,
    /// The per-VM counters ([`MetricsSnapshot::counters`]), by JSON field.
    #[serde(flatten)]
    pub counters: BTreeMap<String, u64>,
}

impl VmSample {
    /// Counter `field` (0 if absent).
    pub fn counter(&self, field: &str) -> u64 {
        self.counters.get(field).copied().unwrap_or(0)
    }
}

/// Device-wide counters and gauges at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
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
    /// Inode references the VMs' sessions hold on pool files (0 with no
    /// VM connected).
    pub pool_file_refs: u64,
    /// Pool bytes of files some VM references (the rest of the allocated
    /// bytes belong to idle files and can be reclaimed).
    pub pool_held_bytes: u64,
    /// Residency-plane traps (all VMs and unknown threads).
    pub traps: u64,
    /// Traps of threads of no registered VMM.
    pub traps_unknown: u64,
    /// Pool bytes resident in the plane (upper bound).
    pub pool_resident_bytes: u64,
    /// Plane evictions.
    pub pool_evictions: u64,
    /// Time plane evictions waited between the device dropping the pages
    /// and the kernel dropping them, summed (ns): meanwhile a guest still
    /// reaches them without a trap.
    #[serde(default)]
    pub pool_eviction_lag_ns: u64,
    /// The longest such wait (ns).
    #[serde(default)]
    pub pool_eviction_lag_max_ns: u64,
    /// Pool misses held back while more evicted pages than the plane's
    /// bound waited for their invalidation (the device makes room before
    /// it takes a page in).
    #[serde(default)]
    pub pool_backlog_waits: u64,
    /// Their time held back, summed (ns).
    #[serde(default)]
    pub pool_backlog_wait_ns: u64,
    /// Of those, the waits that ended at their limit (20 ms) with the
    /// backlog still over the bound.
    #[serde(default)]
    pub pool_backlog_overruns: u64,
    /// Prefetched pages pushed into the plane (they never trap).
    pub pool_prefetch_stores: u64,
    /// Access sampling: resident pages armed (dropped from their plane so
    /// that their next access traps).
    pub sampling_armed_pages: u64,
    /// Access sampling: traps on armed pages, every plane (accesses the
    /// policy saw as hits; each an extra trap).
    pub sampled_accesses: u64,
    /// Access sampling: write-backs of armed pages whose NAND program was
    /// deferred (the page stayed dirty in the model), in pages.
    pub sampling_deferred_pages: u64,
    /// Access sampling: deferred programs charged since.
    pub sampling_deferred_programs: u64,
    /// Access sampling: time the sampler spent arming pages (ns).
    pub sampling_busy_ns: u64,
    /// References the device's policy was told of (accessed bits: resident
    /// pages the guests reached, at most once a page a period; not in
    /// `hits`, which counts trapped lookups).
    pub references: u64,
    /// Accessed bits: scans done (one device transaction each).
    pub access_bit_scans: u64,
    /// Accessed bits: time the scans took, summed (ns).
    pub access_bit_scan_ns: u64,
    /// Accessed bits: pages read from the areas, every VM region.
    pub access_bits_read: u64,
    /// Accessed bits: of those, pages not in the device cache (evicted
    /// since the access, or DRAM-tier file pages): skipped.
    pub access_bits_absent: u64,
    /// Accessed bits: of those, pages filled during the period (their
    /// miss was the period's access): skipped.
    pub access_bits_fresh: u64,
    /// Write log: 64-byte lines written into it.
    pub log_writes: u64,
    /// Write log: reads it served.
    pub log_hits: u64,
    /// Write log: lines that merged (rewrites, lines cleaned together).
    pub log_coalesced: u64,
    /// Write log: cleaning passes.
    pub log_cleanings: u64,
    /// Write log: time writes waited for room (ns).
    pub log_stall_ns: u64,
}

/// Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyKind {
    /// Only goes up (name ends in `_total`).
    Counter,
    /// Any value.
    Gauge,
}

impl FamilyKind {
    /// The `# TYPE` word.
    pub fn name(self) -> &'static str {
        match self {
            FamilyKind::Counter => "counter",
            FamilyKind::Gauge => "gauge",
        }
    }
}

/// One device-wide Prometheus sample (no `vm` label).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceFamily {
    /// Family name.
    pub name: &'static str,
    /// Counter or gauge.
    pub kind: FamilyKind,
    /// `# HELP` text.
    pub help: &'static str,
    /// Its one label (`tier`, `policy`), if any.
    pub label: Option<(&'static str, String)>,
    /// The value.
    pub value: f64,
}

impl DeviceTotals {
    /// The achieved share of placed pages on the CXL tier (0..=1; the
    /// ratio / 100 while nothing is placed).
    pub fn achieved_cxl_share(&self) -> f64 {
        let total = self.placed_dram_pages + self.placed_cxl_pages;
        if total == 0 {
            f64::from(self.cxl_ratio) / 100.0
        } else {
            self.placed_cxl_pages as f64 / total as f64
        }
    }

    /// The gauges every line of the JSON-lines series repeats.
    pub fn gauges(&self) -> DeviceGauges {
        DeviceGauges {
            cxl_ratio: self.cxl_ratio,
            policy: self.policy.clone(),
            resident_dram_pages: self.placed_dram_pages,
            resident_cxl_pages: self.resident_pages,
            shared_pages: self.shared_pages,
            placed_dram_pages: self.placed_dram_pages,
            placed_cxl_pages: self.placed_cxl_pages,
            achieved_cxl_share: self.achieved_cxl_share(),
            device_dirty_pages: self.dirty_pages,
            device_evictions: self.evictions,
            pool_resident_bytes: self.pool_resident_bytes,
            pool_prefetch_stores: self.pool_prefetch_stores,
        }
    }

    /// The device-wide Prometheus samples, in exposition order: the
    /// unlabeled families, then the per-tier and policy ones.
    pub fn families(&self) -> Vec<DeviceFamily> {
        use FamilyKind::{Counter, Gauge};
        let f = |name, kind, help, value: f64| DeviceFamily {
            name,
            kind,
            help,
            label: None,
            value,
        };
        let n = |v: u64| v as f64;
        let mut out = vec![
            f("cxlfs_nand_reads_total", Counter, "NAND page reads (host + GC).", n(self.nand_reads)),
            f("cxlfs_nand_programs_total", Counter, "NAND page programs (host + GC).", n(self.nand_programs)),
            f("cxlfs_nand_erases_total", Counter, "NAND block erases.", n(self.nand_erases)),
            f("cxlfs_gc_runs_total", Counter, "GC victim blocks reclaimed.", n(self.gc_runs)),
            f("cxlfs_write_amplification", Gauge, "NAND programs / host programs.", self.write_amplification),
            f("cxlfs_prefetch_issued_total", Counter, "Prefetches issued by the device.", n(self.prefetch_issued)),
            f("cxlfs_prefetch_used_total", Counter, "Prefetched pages used.", n(self.prefetch_used)),
            f("cxlfs_device_hits_all_total", Counter, "Device page hits (all sources).", n(self.hits)),
            f("cxlfs_device_misses_all_total", Counter, "Device page misses (all sources).", n(self.misses)),
            f("cxlfs_device_evictions_total", Counter, "Device cache evictions.", n(self.evictions)),
            f("cxlfs_device_resident_pages", Gauge, "Pages in the device cache.", n(self.resident_pages)),
            f("cxlfs_device_dirty_pages", Gauge, "Dirty pages in the device cache.", n(self.dirty_pages)),
            f("cxlfs_cxl_ratio_percent", Gauge, "Share of file pages placed on the CXL tier (setting).", f64::from(self.cxl_ratio)),
            f("cxlfs_placed_cxl_share", Gauge, "Achieved share of placed pages on the CXL tier.", self.achieved_cxl_share()),
            f("cxlfs_shared_pages", Gauge, "Pool pages mapped by two or more VMs' DAX windows.", n(self.shared_pages)),
            f("cxlfs_pool_allocated_bytes", Gauge, "Pool bytes allocated to files.", n(self.pool_allocated_bytes)),
            f("cxlfs_pool_aliased_extents_total", Counter, "File chunks that had to share a pool extent.", n(self.pool_aliased_extents)),
            f("cxlfs_pool_file_references", Gauge, "Inode references the VMs' sessions hold on pool files.", n(self.pool_file_refs)),
            f("cxlfs_pool_held_bytes", Gauge, "Pool bytes of files some VM references (the rest can be reclaimed).", n(self.pool_held_bytes)),
            f("cxlfs_pool_resident_bytes", Gauge, "Pool bytes resident in the residency plane (upper bound).", n(self.pool_resident_bytes)),
            f("cxlfs_pool_evictions_total", Counter, "Pool ranges evicted from the residency plane.", n(self.pool_evictions)),
            f("cxlfs_pool_eviction_lag_seconds_total", Counter, "Time pool evictions waited between the device dropping the pages and the residency plane dropping them (meanwhile a guest reaches them without a trap).", self.pool_eviction_lag_ns as f64 / 1e9),
            f("cxlfs_pool_eviction_lag_max_seconds", Gauge, "The longest wait of one pool eviction for the residency plane.", self.pool_eviction_lag_max_ns as f64 / 1e9),
            f("cxlfs_pool_backlog_waits_total", Counter, "Pool misses held back until the residency plane's backlog of evicted pages fell under its bound.", n(self.pool_backlog_waits)),
            f("cxlfs_pool_backlog_wait_seconds_total", Counter, "Time pool misses were held back for the backlog of evicted pages, summed.", self.pool_backlog_wait_ns as f64 / 1e9),
            f("cxlfs_pool_backlog_overruns_total", Counter, "Pool misses released at the wait's limit with the backlog of evicted pages still over its bound.", n(self.pool_backlog_overruns)),
            f("cxlfs_pool_prefetch_stores_total", Counter, "Prefetched pages pushed into the residency plane (NOTIFY_STORE): first touches that do not trap.", n(self.pool_prefetch_stores)),
            f("cxlfs_traps_all_total", Counter, "Residency-plane traps, every VM and unknown threads.", n(self.traps)),
            f("cxlfs_sampling_armed_pages_total", Counter, "Access sampling: resident pages armed (dropped from their plane so that their next access traps).", n(self.sampling_armed_pages)),
            f("cxlfs_sampled_accesses_all_total", Counter, "Access sampling: traps on armed pages, every plane (accesses the policy saw as hits; each one an extra trap).", n(self.sampled_accesses)),
            f("cxlfs_sampling_deferred_pages_total", Counter, "Access sampling: write-backs of armed pages whose NAND program was deferred (dirty in the model until evicted).", n(self.sampling_deferred_pages)),
            f("cxlfs_sampling_deferred_programs_total", Counter, "Access sampling: deferred NAND programs charged since.", n(self.sampling_deferred_programs)),
            f("cxlfs_sampling_busy_seconds_total", Counter, "Access sampling: time the sampler spent arming pages.", self.sampling_busy_ns as f64 / 1e9),
            f("cxlfs_device_references_total", Counter, "References the device's policy was told of (accessed bits: resident pages the guests reached, at most once a page a period; not counted as hits).", n(self.references)),
            f("cxlfs_access_bit_scans_total", Counter, "Accessed bits: scans of every VM's areas (one device transaction each).", n(self.access_bit_scans)),
            f("cxlfs_access_bit_scan_seconds_total", Counter, "Accessed bits: time the scans took (the daemon's CPU for the source).", self.access_bit_scan_ns as f64 / 1e9),
            f("cxlfs_access_bits_read_total", Counter, "Accessed bits: set bits read and cleared, every VM region.", n(self.access_bits_read)),
            f("cxlfs_access_bits_absent_total", Counter, "Accessed bits: pages not in the device cache when read (evicted since, or DRAM tier): skipped.", n(self.access_bits_absent)),
            f("cxlfs_access_bits_fresh_total", Counter, "Accessed bits: pages filled during the period (the miss was the access): skipped.", n(self.access_bits_fresh)),
            f("cxlfs_log_writes_all_total", Counter, "Write log: 64-byte lines written into it (cache.write_log_bytes).", n(self.log_writes)),
            f("cxlfs_log_hits_all_total", Counter, "Write log: reads it served (hit latency, no NAND read).", n(self.log_hits)),
            f("cxlfs_log_coalesced_all_total", Counter, "Write log: lines that merged (rewrites of a logged line, lines of one page cleaned together).", n(self.log_coalesced)),
            f("cxlfs_log_cleanings_total", Counter, "Write log: cleaning passes.", n(self.log_cleanings)),
            f("cxlfs_log_stall_seconds_total", Counter, "Write log: time writes waited for room.", self.log_stall_ns as f64 / 1e9),
        ];
        const PLACED: &str =
            "Pool pages placed (touched) per tier; dram pages are always resident.";
        const RESIDENT: &str = "Resident pages per tier: dram = placed DRAM-tier pages, cxl = pages in the device cache.";
        let tiers = [
            ("cxlfs_placed_pages", PLACED, "dram", self.placed_dram_pages),
            ("cxlfs_placed_pages", PLACED, "cxl", self.placed_cxl_pages),
            (
                "cxlfs_resident_pages",
                RESIDENT,
                "dram",
                self.placed_dram_pages,
            ),
            ("cxlfs_resident_pages", RESIDENT, "cxl", self.resident_pages),
        ];
        out.extend(tiers.map(|(name, help, tier, v)| DeviceFamily {
            label: Some(("tier", tier.to_string())),
            ..f(name, Gauge, help, n(v))
        }));
        out.push(DeviceFamily {
            label: Some(("policy", self.policy.clone())),
            ..f(
                "cxlfs_device_policy_info",
                Gauge,
                "The device cache's eviction policy.",
                1.0,
            )
        });
        out
    }
}

/// The device-wide gauges that every line of the JSON-lines series carries
/// (the same in every line of one sample).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceGauges {
    /// `cxl_ratio` in force.
    pub cxl_ratio: u8,
    /// The device cache's eviction policy.
    pub policy: String,
    /// Resident DRAM-tier pages (every placed DRAM page).
    pub resident_dram_pages: u64,
    /// Pages in the device cache (CXL tier).
    pub resident_cxl_pages: u64,
    /// Pool pages mapped by two or more VMs' DAX windows.
    pub shared_pages: u64,
    /// Placed pool pages on the DRAM tier.
    pub placed_dram_pages: u64,
    /// Placed pool pages on the CXL tier.
    pub placed_cxl_pages: u64,
    /// `placed_cxl / (placed_dram + placed_cxl)`.
    pub achieved_cxl_share: f64,
    /// Dirty pages in the device cache.
    pub device_dirty_pages: u64,
    /// Device cache evictions.
    pub device_evictions: u64,
    /// Pool bytes resident in the residency plane (upper bound).
    pub pool_resident_bytes: u64,
    /// Prefetched pages pushed into the plane.
    pub pool_prefetch_stores: u64,
}

/// Everything the daemon exports at one moment: the body of `GET /metrics.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MetricsSnapshot {
    /// The per-VM counters, in table order: the keys of
    /// [`VmSample::counters`] and their Prometheus families.
    pub counters: Vec<CounterInfo>,
    /// One row per VM, in the order they first appeared.
    pub vms: Vec<VmSample>,
    /// Totals (`vm` = `all`).
    pub all: VmSample,
    /// Device-wide values.
    pub device: DeviceTotals,
    /// Memory mode: one row per VM's CXL memory region (`region="memory"`
    /// in the Prometheus text; the DAX file pages are the per-VM traps).
    #[serde(default)]
    pub memory_regions: Vec<MemoryRegionSample>,
    /// One row per VM region a hit source tracks.
    #[serde(default)]
    pub hit_sources: Vec<HitSourceSample>,
}

/// One VM region as a hit source sees it (`cxlfs_hit_source` and the
/// `cxlfs_access_bits_*` families, labels `vm` and `region`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HitSourceSample {
    /// The VM.
    pub vm: String,
    /// `file` (its DAX window) or `memory` (its CXL memory region).
    pub region: RegionKind,
    /// The source this row is from.
    pub source: HitSourceKind,
    /// The source that serves the region now (the first that covers it).
    pub serving: HitSourceKind,
    /// Accessed bits: set bits read from the region's area.
    pub bits_read: u64,
    /// Accessed bits: of those, resident pages told to the policy.
    pub references: u64,
    /// Accessed bits: the VMM's re-arms (its TLB entries of the region
    /// dropped, so that the next access marks again).
    pub rearms: u64,
    /// Accessed bits: bits the VMM set (each one a TLB refill that found
    /// its bit clear).
    pub vmm_bits_set: u64,
}

impl Default for HitSourceSample {
    fn default() -> Self {
        HitSourceSample {
            vm: String::new(),
            region: RegionKind::File,
            source: HitSourceKind::None,
            serving: HitSourceKind::None,
            bits_read: 0,
            references: 0,
            rearms: 0,
            vmm_bits_set: 0,
        }
    }
}

/// One CXL memory region's figures (memory mode).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryRegionSample {
    /// The VM.
    pub vm: String,
    /// Bytes.
    pub size_bytes: u64,
    /// Traps (page-cache misses of the region) answered.
    pub traps: u64,
    /// Of which by threads of the VM's own VMM (the rest: other processes
    /// that map the region, such as the daemon reading virtqueues there).
    pub vmm_traps: u64,
    /// Device-cache hits among the trapped pages.
    pub device_hits: u64,
    /// Device misses (NAND reads) among the trapped pages.
    pub device_misses: u64,
    /// Modeled time of the traps, summed (arrival to modeled completion;
    /// divide by `traps` for the mean a trap should take).
    pub trap_modeled_ns_total: u64,
    /// Bytes written back (NAND programs).
    pub writeback_bytes: u64,
    /// Region pages in the device cache now.
    pub device_resident_pages: u64,
    /// Region bytes resident in the residency plane (upper bound).
    pub plane_resident_bytes: u64,
    /// Readahead READs refused (each fault reads only its own page).
    pub readahead_refused: u64,
    /// Times the region was released (its VM went away).
    pub releases: u64,
    /// Accesses to resident region pages that access sampling caught and
    /// handed to the device's policy as hits (`cxlfsd --access-sampling`).
    pub sampled_accesses: u64,
    /// Resident region pages access sampling armed (dropped from the
    /// plane so that their next access traps): what sampling cost.
    pub sampling_armed_pages: u64,
    /// Lines of the region's write-backs the device's write log took.
    pub log_writes: u64,
    /// Region traps the write log served.
    pub log_hits: u64,
    /// Prefetched region pages pushed into the plane (read through the
    /// region file by the daemon's filler, uncharged): their first guest
    /// touch is a hit with no trap.
    pub prefetch_filled_pages: u64,
    /// The region plane's latency-compensation floor now (ns; 0: off):
    /// how far ahead of its modeled completion a miss reply is released.
    pub compensation_ns: u64,
    /// Calibration probes the floor is taken from.
    pub calibration_probes: u64,
}

/// One memory-mode family: a field of [`MemoryRegionSample`], exposed per
/// region with labels `vm` and `region="memory"`.
#[derive(Debug, Clone, Copy)]
pub struct RegionFamily {
    /// Family name.
    pub name: &'static str,
    /// Counter or gauge.
    pub kind: FamilyKind,
    /// `# HELP` text.
    pub help: &'static str,
    /// The field.
    pub value: fn(&MemoryRegionSample) -> u64,
}

/// Memory mode's families (the Prometheus endpoint and `cxlfs run`'s
/// `daemon.region_*` columns both read them here).
#[rustfmt::skip]
pub const REGION_FAMILIES: &[RegionFamily] = &[
    RegionFamily { name: "cxlfs_region_size_bytes", kind: FamilyKind::Gauge, help: "Size of the VM's CXL memory region.", value: |r| r.size_bytes },
    RegionFamily { name: "cxlfs_region_traps_total", kind: FamilyKind::Counter, help: "Traps (page-cache misses) of the region answered.", value: |r| r.traps },
    RegionFamily { name: "cxlfs_region_vmm_traps_total", kind: FamilyKind::Counter, help: "Region traps by threads of the VM's own VMM.", value: |r| r.vmm_traps },
    RegionFamily { name: "cxlfs_region_device_hits_total", kind: FamilyKind::Counter, help: "Trapped region pages the device cache held.", value: |r| r.device_hits },
    RegionFamily { name: "cxlfs_region_device_misses_total", kind: FamilyKind::Counter, help: "Trapped region pages read from NAND.", value: |r| r.device_misses },
    RegionFamily { name: "cxlfs_region_trap_modeled_ns_total", kind: FamilyKind::Counter, help: "Modeled time of the region's traps, summed (ns).", value: |r| r.trap_modeled_ns_total },
    RegionFamily { name: "cxlfs_region_writeback_bytes_total", kind: FamilyKind::Counter, help: "Region bytes written back (NAND programs).", value: |r| r.writeback_bytes },
    RegionFamily { name: "cxlfs_region_device_resident_pages", kind: FamilyKind::Gauge, help: "Region pages in the device cache.", value: |r| r.device_resident_pages },
    RegionFamily { name: "cxlfs_region_plane_resident_bytes", kind: FamilyKind::Gauge, help: "Region bytes resident in the plane (upper bound).", value: |r| r.plane_resident_bytes },
    RegionFamily { name: "cxlfs_region_readahead_refused_total", kind: FamilyKind::Counter, help: "Readahead READs of the region refused (a fault reads its own page).", value: |r| r.readahead_refused },
    RegionFamily { name: "cxlfs_region_releases_total", kind: FamilyKind::Counter, help: "Times the region was released with its VM.", value: |r| r.releases },
    RegionFamily { name: "cxlfs_region_sampled_accesses_total", kind: FamilyKind::Counter, help: "Accesses to resident region pages caught by access sampling (hits the policy saw).", value: |r| r.sampled_accesses },
    RegionFamily { name: "cxlfs_region_sampling_armed_pages_total", kind: FamilyKind::Counter, help: "Resident region pages access sampling armed (their next access traps).", value: |r| r.sampling_armed_pages },
    RegionFamily { name: "cxlfs_region_prefetch_filled_pages_total", kind: FamilyKind::Counter, help: "Prefetched region pages pushed into the plane (their first touch does not trap).", value: |r| r.prefetch_filled_pages },
    RegionFamily { name: "cxlfs_region_log_writes_total", kind: FamilyKind::Counter, help: "Lines of the region's write-backs the device's write log took.", value: |r| r.log_writes },
    RegionFamily { name: "cxlfs_region_log_hits_total", kind: FamilyKind::Counter, help: "Region traps the device's write log served.", value: |r| r.log_hits },
    RegionFamily { name: "cxlfs_region_compensation_ns", kind: FamilyKind::Gauge, help: "The region plane's latency-compensation floor (ns): how far ahead of its modeled completion a miss is released.", value: |r| r.compensation_ns },
];

/// When and which sample a set of lines is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SampleInfo {
    /// Wall clock, ms since the Unix epoch.
    pub ts_unix_ms: u64,
    /// Seconds since the writer started.
    pub elapsed_s: f64,
    /// Sample number (0, 1, ...); every line of one sample has the same.
    pub seq: u64,
    /// The last sample, written at shutdown after the device flush.
    #[serde(rename = "final")]
    pub is_final: bool,
}

/// One line of the `--metrics-file` series: a flat JSON object with the
/// sample's fields, the device-wide gauges and one VM's row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SampleLine {
    /// When and which sample.
    #[serde(flatten)]
    pub info: SampleInfo,
    /// Device-wide gauges (the same in every line of a sample). Declared
    /// before `row`: when reading, it takes its fields first, and the row's
    /// counters get the rest.
    #[serde(flatten)]
    pub device: DeviceGauges,
    /// The VM's row (or `all`).
    #[serde(flatten)]
    pub row: VmSample,
    /// The VM's CXL memory region (memory mode), if it has one: resident
    /// pages and traps per VM over time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_region: Option<MemoryRegionSample>,
}

impl MetricsSnapshot {
    /// The lines of one sample: one per VM, then `all`.
    pub fn lines(&self, info: SampleInfo) -> Vec<SampleLine> {
        let device = self.device.gauges();
        self.vms
            .iter()
            .chain(std::iter::once(&self.all))
            .map(|row| SampleLine {
                info,
                device: device.clone(),
                row: row.clone(),
                memory_region: self.memory_regions.iter().find(|r| r.vm == row.vm).cloned(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn snapshot() -> MetricsSnapshot {
        let row = |vm: &str, n: u64| VmSample {
            vm: vm.into(),
            fuse_ops: [("READ".to_string(), n)].into(),
            traps: n,
            write_amplification: 1.5,
            fuse_latency_ns: LatencySummary {
                count: 3,
                p50: 10,
                p90: 20,
                p99: 30,
                p999: 40,
                max: 50,
                mean: 21.5,
            },
            counters: [("read_bytes".to_string(), n * 4096), ("dax_maps".into(), 1)].into(),
            ..VmSample::default()
        };
        MetricsSnapshot {
            counters: vec![CounterInfo {
                field: "read_bytes".into(),
                family: "cxlfs_read_bytes_total".into(),
                help: "Bytes.".into(),
            }],
            vms: vec![row("vm0", 2), row("vm1", 3)],
            all: row(ALL_VM, 5),
            device: DeviceTotals {
                policy: "s3fifo".into(),
                cxl_ratio: 50,
                placed_dram_pages: 1,
                placed_cxl_pages: 3,
                write_amplification: 1.25,
                ..DeviceTotals::default()
            },
            memory_regions: Vec::new(),
            hit_sources: vec![HitSourceSample {
                vm: "vm0".into(),
                region: RegionKind::File,
                source: HitSourceKind::AccessBits,
                serving: HitSourceKind::AccessBits,
                bits_read: 7,
                references: 5,
                rearms: 3,
                vmm_bits_set: 9,
            }],
        }
    }

    #[test]
    fn snapshot_round_trips() {
        let s = snapshot();
        let text = serde_json::to_string(&s).unwrap();
        let back: MetricsSnapshot = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["vms"][0]["read_bytes"], 8192, "counters are plain fields");
        assert_eq!(v["all"]["fuse_ops"]["READ"], 5);
    }

    #[test]
    fn sample_lines_are_flat_and_round_trip() {
        let s = snapshot();
        let info = SampleInfo {
            ts_unix_ms: 1_700_000_000_000,
            elapsed_s: 1.5,
            seq: 7,
            is_final: true,
        };
        let lines = s.lines(info);
        assert_eq!(lines.len(), 3);
        for line in &lines {
            let text = serde_json::to_string(line).unwrap();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            for f in [
                "ts_unix_ms",
                "elapsed_s",
                "seq",
                "final",
                "vm",
                "cxl_ratio",
                "policy",
                "fuse_ops",
                "read_bytes",
                "dax_maps",
                "traps",
                "write_amplification",
                "resident_dram_pages",
                "resident_cxl_pages",
                "achieved_cxl_share",
                "trap_latency_ns",
                "fuse_latency_ns",
                "pacing_error_ns",
                "pacing_error_ge20us_ns",
            ] {
                assert!(v.get(f).is_some(), "missing {f} in {text}");
            }
            assert_eq!(v["final"], true);
            assert_eq!(v["achieved_cxl_share"], 0.75);
            let back: SampleLine = serde_json::from_str(&text).unwrap();
            assert_eq!(&back, line);
            assert_eq!(back.row.counters.len(), 2, "only counters in the map");
        }
        // A VM with a CXL memory region carries it in its line (and only it).
        let mut s = snapshot();
        s.memory_regions.push(MemoryRegionSample {
            vm: "vm1".into(),
            size_bytes: 1 << 27,
            device_resident_pages: 42,
            ..MemoryRegionSample::default()
        });
        let lines = s.lines(info);
        let regions: Vec<Option<u64>> = lines
            .iter()
            .map(|l| l.memory_region.as_ref().map(|r| r.device_resident_pages))
            .collect();
        assert_eq!(regions, [None, Some(42), None]);
        let text = serde_json::to_string(&lines[1]).unwrap();
        let back: SampleLine = serde_json::from_str(&text).unwrap();
        assert_eq!(back, lines[1]);
        assert_eq!(back.row.counters.len(), 2, "the region is not a counter");
        // Lines of older or partial writers still read, with defaults.
        let l: SampleLine =
            serde_json::from_str(r#"{"vm":"vm0","seq":1,"device_hits":5,"policy":"lru"}"#).unwrap();
        assert_eq!((l.row.counter("device_hits"), l.info.is_final), (5, false));
        assert_eq!(l.device.policy, "lru");
    }

    #[test]
    fn device_families_are_named_once() {
        let d = snapshot().device;
        let f = d.families();
        assert_eq!(f.len(), 49);
        let get = |name: &str| f.iter().find(|x| x.name == name).unwrap();
        assert_eq!(get("cxlfs_cxl_ratio_percent").value, 50.0);
        assert_eq!(get("cxlfs_placed_cxl_share").value, 0.75);
        assert!(f
            .iter()
            .all(|x| (x.kind == FamilyKind::Counter) == x.name.ends_with("_total")));
    }
}
