//! The counters of one VM ([`VmMetrics`]) and the per-VM counter table
//! ([`VM_COUNTERS`]), both made by one declaration ([`vm_counters!`]).
//!
//! Adding a per-VM counter is one line in the `vm_counters!` invocation
//! below (field, Prometheus family, JSON field, how the `all` row gets it,
//! help) plus the call site that increments the new field: the struct
//! field, its zeroed start, the Prometheus family, the JSON field and the
//! `all` total all come from that line.

use super::latency::{new_histogram, LatencyExport, ReplyHistograms};
use super::{put, DeviceTotals};
use crate::sync::lock;
use fuse_abi::opcode;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Modeled latencies from which on pacing is held to its target (issue 3:
/// p99 < 5 µs for modeled latencies >= 20 µs).
pub const LONG_MODELED_NS: u64 = 20_000;

type CounterFn = fn(&VmMetrics) -> u64;
type DeviceFn = fn(&DeviceTotals) -> u64;

/// One per-VM counter: its JSON field, its Prometheus family, and how the
/// `all` row gets it (`None`: the sum over VMs; `Some`: the device's own
/// count, which also covers work no VM caused, e.g. the shutdown flush).
#[derive(Clone, Copy)]
pub struct CounterDef {
    /// JSON field.
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

/// What one device access of a VM did, as the VM's counters take it
/// ([`VmMetrics::record_charge`]). The daemon's data path converts its
/// charges into this (`device/figures.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceWork {
    /// CXL-tier pages found in the device cache.
    pub page_hits: u64,
    /// CXL-tier pages the device cache had to fill.
    pub page_misses: u64,
    /// DRAM-tier pages: served without the device.
    pub dram_pages: u64,
    /// Prefetches the device started.
    pub prefetch_issued: u64,
    /// Prefetched pages a demand access then used.
    pub prefetch_used: u64,
    /// NAND pages read while the access ran.
    pub nand_reads: u64,
    /// NAND pages programmed while it ran.
    pub nand_programs: u64,
    /// The part of `nand_programs` the host asked for (write-backs).
    pub host_programs: u64,
    /// NAND blocks erased while it ran.
    pub nand_erases: u64,
    /// Garbage collections (victim blocks) while it ran.
    pub gc_runs: u64,
    /// Lines written into the device's write log while it ran.
    pub log_writes: u64,
    /// Reads the write log served while it ran.
    pub log_hits: u64,
    /// Logged lines that merged while it ran.
    pub log_coalesced: u64,
}

impl DeviceWork {
    /// The values, in the order of [`VmMetrics::work_counters`].
    fn values(&self) -> [u64; 13] {
        [
            self.page_hits,
            self.page_misses,
            self.dram_pages,
            self.prefetch_issued,
            self.prefetch_used,
            self.nand_reads,
            self.nand_programs,
            self.host_programs,
            self.nand_erases,
            self.gc_runs,
            self.log_writes,
            self.log_hits,
            self.log_coalesced,
        ]
    }
}

/// The `all` value of a counter: the sum over the VMs, or (with a
/// [`DeviceTotals`] field) the device's own count.
macro_rules! all_rule {
    () => {
        None
    };
    ($f:ident) => {
        Some(|d: &DeviceTotals| d.$f)
    };
}

/// A counter's JSON field: its field name unless given.
macro_rules! json_name {
    ($f:ident) => {
        stringify!($f)
    };
    ($f:ident, $json:literal) => {
        $json
    };
}

/// Declares the per-VM counters, one line each:
///
/// `field => "prometheus_family" [, json "json_field"] [, all device(FIELD)], help "…";`
///
/// The JSON field defaults to the field's name; the `all` row takes the
/// sum over the VMs unless `all device(FIELD)` names the [`DeviceTotals`]
/// field to take instead. From each line come the `AtomicU64` field of
/// [`VmMetrics`] (documented by the help text), its zeroed start in
/// [`VmMetrics::new`] and the [`VM_COUNTERS`] entry.
macro_rules! vm_counters {
    ($($field:ident => $prom:literal $(, json $json:literal)? $(, all device($dev:ident))?, help $help:literal;)*) => {
        /// Counters of one VM.
        #[derive(Debug)]
        pub struct VmMetrics {
            /// The VM's name (label `vm`).
            pub name: String,
            requests: Vec<AtomicU64>,
            $(#[doc = $help] pub $field: AtomicU64,)*
            /// NAND programs on behalf of the host during this VM's accesses
            /// (for its write amplification; not exported by itself).
            pub host_programs: AtomicU64,
            /// Record the latency histograms (FUSE requests, traps, pacing).
            pub(super) record_latency: AtomicBool,
            /// The reply-side histograms share one lock: a request records two or
            /// three values at once ([`VmMetrics::record_reply`]).
            pub(super) replies: Mutex<ReplyHistograms>,
            pub(super) trap_latency: Mutex<Histogram<u64>>,
        }

        impl VmMetrics {
            /// Zeroed counters for `name`.
            pub fn new(name: &str) -> Self {
                VmMetrics {
                    name: name.to_string(),
                    requests: (0..=opcode::MAX).map(|_| AtomicU64::new(0)).collect(),
                    $($field: AtomicU64::new(0),)*
                    host_programs: AtomicU64::new(0),
                    record_latency: AtomicBool::new(true),
                    replies: Mutex::new(ReplyHistograms::default()),
                    trap_latency: Mutex::new(new_histogram()),
                }
            }
        }

        /// The per-VM counters, in export order.
        pub const VM_COUNTERS: &[CounterDef] = &[$(CounterDef {
            json: json_name!($field $(, $json)?),
            prom: $prom,
            help: $help,
            vm: |v| v.$field.load(Ordering::Relaxed),
            all: all_rule!($($dev)?),
        },)*];
    };
}

// The per-VM counters, in export order. Adding one: a line here, and the
// call site that increments the new field.
vm_counters! {
    read_bytes => "cxlfs_read_bytes_total", help "Bytes returned by FUSE READ.";
    write_bytes => "cxlfs_write_bytes_total", help "Bytes written by FUSE WRITE.";
    device_hits => "cxlfs_device_hits_total", all device(hits), help "Device DRAM-cache page hits caused by the VM (CXL tier).";
    device_misses => "cxlfs_device_misses_total", all device(misses), help "Device DRAM-cache page misses caused by the VM (CXL tier).";
    dram_pages => "cxlfs_dram_tier_pages_total", help "Page accesses served by the DRAM tier (no device access, no delay).";
    nand_reads => "cxlfs_vm_nand_reads_total", all device(nand_reads), help "NAND page reads during the VM's accesses (fills, prefetches, GC copies).";
    nand_programs => "cxlfs_vm_nand_programs_total", all device(nand_programs), help "NAND page programs during the VM's accesses (write-backs, GC copies).";
    nand_erases => "cxlfs_vm_nand_erases_total", all device(nand_erases), help "NAND block erases during the VM's accesses.";
    gc_runs => "cxlfs_vm_gc_runs_total", all device(gc_runs), help "GC victim blocks reclaimed during the VM's accesses.";
    prefetch_issued => "cxlfs_vm_prefetch_issued_total", all device(prefetch_issued), help "Prefetches the device issued on the VM's misses.";
    prefetch_used => "cxlfs_vm_prefetch_used_total", all device(prefetch_used), help "Prefetched pages the VM used.";
    log_writes => "cxlfs_vm_log_writes_total", all device(log_writes), help "64-byte lines the VM's writes and write-backs put into the device's write log (cache.write_log_bytes).";
    log_hits => "cxlfs_vm_log_hits_total", all device(log_hits), help "The VM's reads the device's write log served (hit latency, no NAND read).";
    log_coalesced => "cxlfs_vm_log_coalesced_total", all device(log_coalesced), help "Logged lines that merged during the VM's accesses (rewrites of a logged line, lines of one page cleaned together).";
    trap_modeled_ns => "cxlfs_vm_trap_modeled_ns_total", help "Modeled time of the VM's DAX traps, summed (arrival to modeled completion, ns; divided by its traps: the mean a trap should take).";
    sampled_accesses => "cxlfs_vm_sampled_file_accesses_total", help "Traps of the VM on DAX pool pages access sampling had armed: accesses to resident file pages the device's policy saw as hits.";
    dax_maps => "cxlfs_dax_maps_total", help "DAX window slots mapped (VHOST_USER_BACKEND_SHMEM_MAP).";
    dax_unmaps => "cxlfs_dax_unmaps_total", help "DAX window slots unmapped (VHOST_USER_BACKEND_SHMEM_UNMAP).";
    dax_map_waits => "cxlfs_dax_map_waits_total", help "SETUPMAPPING/REMOVEMAPPING requests that waited for an in-flight mapping or removal of the same window slot.";
    dax_map_refusals => "cxlfs_dax_map_refusals_total", help "SETUPMAPPING/REMOVEMAPPING requests refused: a range the guest does not hold, bad arguments, or a slot still in flight after the front-end's reply timeout.";
    dax_window_overruns => "cxlfs_dax_window_overruns_total", help "SETUPMAPPING requests for a range past the end of the VM's DAX window (the VMM's window is larger than --dax-window; also in cxlfs_dax_map_refusals_total).";
    dax_slot_reuses => "cxlfs_dax_slot_reuses_total", help "Window slots mapped for another file range than they held last (the guest took the range back from one file for another: window pressure).";
    backend_timeouts => "cxlfs_backend_channel_timeouts_total", help "Back-end channel requests the front-end did not acknowledge in time (the connection was dropped).";
    bad_chains => "cxlfs_bad_descriptor_chains_total", json "bad_descriptor_chains", help "Descriptor chains dropped as malformed.";
    connections => "cxlfs_vm_connections_total", help "vhost-user connections accepted.";
    open_files_refused => "cxlfs_open_files_refused_total", help "LOOKUP/OPEN/CREATE answered EMFILE: the VM held its cap of inodes + handles.";
}

impl VmMetrics {
    /// Counts one request of `op` (unknown opcodes share one slot).
    pub fn count_request(&self, op: u32) {
        let i = (op.min(opcode::MAX)) as usize;
        self.requests[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests seen with opcode `op`.
    pub fn requests(&self, op: u32) -> u64 {
        self.requests[(op.min(opcode::MAX)) as usize].load(Ordering::Relaxed)
    }

    /// The counters [`DeviceWork`] feeds, in the order of its values; they
    /// are the ones `reset_stats` zeroes.
    pub(super) fn work_counters(&self) -> [&AtomicU64; 13] {
        [
            &self.device_hits,
            &self.device_misses,
            &self.dram_pages,
            &self.prefetch_issued,
            &self.prefetch_used,
            &self.nand_reads,
            &self.nand_programs,
            &self.host_programs,
            &self.nand_erases,
            &self.gc_runs,
            &self.log_writes,
            &self.log_hits,
            &self.log_coalesced,
        ]
    }

    /// Counts what one device access of this VM did (a `&Charge` of the
    /// data path converts into `DeviceWork`).
    pub fn record_charge(&self, work: impl Into<DeviceWork>) {
        let work = work.into();
        for (c, v) in self.work_counters().into_iter().zip(work.values()) {
            if v > 0 {
                c.fetch_add(v, Ordering::Relaxed);
            }
        }
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

    /// [`VmMetrics::record_reply`] for a reply released `floor_ns` ahead of
    /// its modeled completion `modeled_ns` (latency compensation): the
    /// pacing error is the estimated one the guest sees,
    /// `done + floor − modeled` (early counts as 0); the FUSE latency is
    /// still arrival to the used ring. A floor of 0 is `record_reply`.
    pub fn record_reply_compensated(
        &self,
        arrival_ns: u64,
        modeled_ns: u64,
        done_ns: u64,
        floor_ns: u64,
    ) {
        if !self.recording() {
            return;
        }
        let mut h = lock(&self.replies);
        put(&mut h.fuse, done_ns.saturating_sub(arrival_ns));
        let error = done_ns.saturating_add(floor_ns).saturating_sub(modeled_ns);
        put(&mut h.pacing, error);
        if modeled_ns.saturating_sub(arrival_ns) >= LONG_MODELED_NS {
            put(&mut h.pacing_long, error);
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
            put(&mut lock(&self.trap_latency), ns);
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
