//! Memory mode: CXL memory regions on the emulated device, which a VM's
//! QEMU maps as a CPU-less NUMA node.
//!
//! A region is device address space set aside at start (the top of the
//! device, [`SharedDevice::memory_base`] upwards; file extents live below):
//! its pages are charged by the same device model and compete for the same
//! device DRAM cache as every VM's DAX file pages. It is always CXL-tier
//! (`cxl_ratio` places file pages only). The residency mechanism is the
//! DAX plane's, one FUSE file per region, but *split*
//! ([`residency::split`]): the daemon maps the region itself (QEMU passes
//! all guest RAM in `SET_MEM_TABLE`, and the guest may put virtqueues and
//! buffers on the CXL node), so the requests are read by a helper process
//! that never maps guest memory and never waits on the daemon. A write-back
//! lands in the region's backing store (a memfd the daemon owns, never the
//! share) before it is acknowledged; a later miss reads it back from there.
//!
//! Life cycle: the region exists from start; its VM's QEMU gets the file
//! as a descriptor (`cxlfs ctl memory-fd`, SCM_RIGHTS over the control
//! socket). When the VM's connection ends and its QEMU process is gone,
//! the region is *released*: page cache dropped, backing store punched,
//! device pages discarded (write-backs then are not charged) — the next VM
//! of that name starts from zeros.

mod backend;
mod filler;

use crate::device::{DeviceObserver, SharedDevice, PAGE};
use crate::ids::{FileKey, VmId};
use crate::metrics::{MemoryRegionSample, MemorySource};
use crate::sync::lock;
use backend::{FillReads, RegionBackend};
use residency::pace::Compensation;
use residency::{FusePoolPlane, HelperCommand, PlaneOptions, ResidencyPlane};
use std::fs::File;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a released VM's QEMU may take to go away before its region is
/// kept (it may still map it: releasing would zero a live guest's memory).
pub const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// One VM's CXL memory region (`--cxl-memory NAME=SIZE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryRegionSpec {
    /// The VM's name.
    pub vm: String,
    /// Bytes (a positive multiple of 2 MiB).
    pub size: u64,
}

/// Counters of one region (since start; they never go back).
#[derive(Debug, Default)]
pub struct RegionStats {
    /// Traps (misses of the page cache) answered.
    pub traps: AtomicU64,
    /// Of which the device had the page (device-cache hits).
    pub device_hits: AtomicU64,
    /// Of which were device misses (NAND reads).
    pub device_misses: AtomicU64,
    /// Modeled trap time, summed (ns).
    pub trap_modeled_ns: AtomicU64,
    /// Bytes written back (charged as NAND programs).
    pub writeback_bytes: AtomicU64,
    /// Times the region was released.
    pub releases: AtomicU64,
    /// Traps on pages access sampling had armed.
    pub sampled_accesses: AtomicU64,
    /// Pages access sampling armed.
    pub sampling_armed_pages: AtomicU64,
    /// Prefetched pages pushed into the plane (the filler's reads).
    pub filled_pages: AtomicU64,
    /// Lines of write-backs the device's write log took.
    pub log_writes: AtomicU64,
    /// Traps the write log served.
    pub log_hits: AtomicU64,
}

/// One VM's region.
pub struct Region {
    /// The VM's name.
    pub vm: String,
    /// First device byte.
    pub base: u64,
    /// Bytes.
    pub size: u64,
    store: Arc<File>,
    plane: FusePoolPlane,
    stats: Arc<RegionStats>,
    releasing: Arc<AtomicBool>,
    /// Who has it now; held across a release, so a VM that connects
    /// meanwhile waits for the release to end.
    session: Mutex<Session>,
}

/// A region's current user.
#[derive(Debug, Default)]
struct Session {
    /// The VMM process.
    vmm: Option<u32>,
    /// Connections so far: a release started for one connection is
    /// skipped if another came since.
    epoch: u64,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("vm", &self.vm)
            .field("base", &self.base)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Why a region could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum StartMemoryError {
    /// The backing store could not be created.
    #[error("cannot create the backing store of the memory region of {vm}")]
    Store {
        /// The VM.
        vm: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The region's directory could not be created.
    #[error("cannot create the mountpoint {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The `region-prefetch` thread could not be started.
    #[error("cannot start the region-prefetch thread")]
    Filler(#[source] std::io::Error),
    /// The region's plane could not be mounted.
    #[error("cannot mount the memory region of {vm}")]
    Mount {
        /// The VM.
        vm: String,
        /// The error.
        #[source]
        source: residency::MountPlaneError,
    },
}

/// How every region's plane is set up.
struct PlaneSetup<'a> {
    /// The helper process's command.
    helper: &'a HelperCommand,
    /// Latency compensation and transport of the region's plane.
    plane: RegionPlane,
    /// The filler thread, whose reads are not traps.
    fills: Arc<FillReads>,
}

/// How a region's plane runs (the daemon's `--latency-compensation` for
/// DAX and its `--plane-transport`).
#[derive(Debug, Clone, Copy)]
pub struct RegionPlane {
    /// Latency compensation of the region's misses.
    pub compensation: Compensation,
    /// What carries the helper's requests.
    pub transport: residency::Transport,
}

/// A sparse memfd of `size` bytes (reads as zeros).
fn memfd(name: &str, size: u64) -> std::io::Result<File> {
    let fd = rustix::fs::memfd_create(
        format!("cxlfs-memory-{name}"),
        rustix::fs::MemfdFlags::CLOEXEC,
    )?;
    let f = File::from(fd);
    f.set_len(size)?;
    Ok(f)
}

impl Region {
    fn start(
        shared: &Arc<SharedDevice>,
        vm: &str,
        base: u64,
        size: u64,
        dir: &Path,
        setup: &PlaneSetup<'_>,
    ) -> Result<Self, StartMemoryError> {
        let store = Arc::new(memfd(vm, size).map_err(|source| StartMemoryError::Store {
            vm: vm.to_string(),
            source,
        })?);
        let stats = Arc::new(RegionStats::default());
        let releasing = Arc::new(AtomicBool::new(false));
        let backend = Arc::new(RegionBackend {
            shared: shared.clone(),
            base,
            store: store.clone(),
            stats: stats.clone(),
            releasing: releasing.clone(),
            fills: setup.fills.clone(),
        });
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| StartMemoryError::Dir {
                path: dir.to_path_buf(),
                source,
            })?;
        // QEMU maps guest RAM MADV_HUGEPAGE: a fault must read its page,
        // not a 2–4 MiB window. The helper refuses the readahead and hands
        // the fault's first arrival on, so compensation covers the refusal.
        let options = PlaneOptions {
            detach: true,
            refuse_readahead: true,
            compensation: setup.plane.compensation,
            transport: setup.plane.transport,
            // Every region miss evicts a page: a notifier that sleeps is
            // woken on the other CPU for each (DESIGN.md, "Memory mode").
            notifier_poll: residency::EVICTING_NOTIFIER_POLL,
            ..PlaneOptions::default()
        };
        let plane = FusePoolPlane::mount_split(dir, size, backend, options, &store, setup.helper)
            .map_err(|source| StartMemoryError::Mount {
            vm: vm.to_string(),
            source,
        })?;
        // Detached: the directory is empty again.
        let _ = std::fs::remove_dir(dir);
        tracing::info!(vm, base, size, helper = ?plane.helper_pid(), "CXL memory region ready");
        Ok(Region {
            vm: vm.to_string(),
            base,
            size,
            store,
            plane,
            stats,
            releasing,
            session: Mutex::new(Session::default()),
        })
    }

    /// The region file, open read-write: what the VMM maps (handed over
    /// as a descriptor).
    pub fn file(&self) -> &Arc<File> {
        &self.plane.map_target().file
    }

    /// The region's device page numbers.
    fn device_pages(&self) -> std::ops::Range<u64> {
        self.base / PAGE..(self.base + self.size) / PAGE
    }

    /// The figures now; `resident`: the device cache's pages.
    fn sample(&self, resident: &[u64]) -> MemoryRegionSample {
        let pages = self.device_pages();
        let s = &self.stats;
        let plane = self.plane.metrics();
        MemoryRegionSample {
            vm: self.vm.clone(),
            size_bytes: self.size,
            traps: s.traps.load(Ordering::Relaxed),
            device_hits: s.device_hits.load(Ordering::Relaxed),
            device_misses: s.device_misses.load(Ordering::Relaxed),
            trap_modeled_ns_total: s.trap_modeled_ns.load(Ordering::Relaxed),
            vmm_traps: plane
                .traps_by_vm
                .get(&Some(REGION_VM_ID))
                .copied()
                .unwrap_or(0),
            writeback_bytes: s.writeback_bytes.load(Ordering::Relaxed),
            device_resident_pages: resident.iter().filter(|p| pages.contains(*p)).count() as u64,
            plane_resident_bytes: plane.resident_bytes,
            readahead_refused: plane.readahead_refused,
            releases: s.releases.load(Ordering::Relaxed),
            sampled_accesses: s.sampled_accesses.load(Ordering::Relaxed),
            sampling_armed_pages: s.sampling_armed_pages.load(Ordering::Relaxed),
            prefetch_filled_pages: s.filled_pages.load(Ordering::Relaxed),
            log_writes: s.log_writes.load(Ordering::Relaxed),
            log_hits: s.log_hits.load(Ordering::Relaxed),
            compensation_ns: plane.compensation_ns,
            calibration_probes: plane.calibration_probes,
        }
    }

    /// Evicts the region pages among device `pages` from the page cache
    /// (the device dropped them): their next touch traps. `wait`: until the
    /// kernel has dropped them. Returns the pages handed over.
    fn evict_device_pages(&self, pages: &[u64], wait: bool) -> u64 {
        let range = self.device_pages();
        let mut mine: Vec<u64> = pages
            .iter()
            .filter(|p| range.contains(*p))
            .map(|p| p - range.start)
            .collect();
        if mine.is_empty() {
            return 0;
        }
        mine.sort_unstable();
        mine.dedup();
        let runs = crate::device::page_runs(&mine)
            .into_iter()
            .map(|(p, n)| (p * PAGE, n * PAGE));
        residency::evict_ranges(|o, l| self.plane.evict(o, l), runs, wait, "region pages");
        mine.len() as u64
    }

    /// Access sampling: arms the region pages among device `pages` and
    /// drops them from the plane, waiting until they are gone (their next
    /// touch traps, as a device hit). Returns the pages armed.
    fn arm_sampled(&self, shared: &SharedDevice, pages: &[u64]) -> u64 {
        let range = self.device_pages();
        let mine: Vec<u64> = pages
            .iter()
            .copied()
            .filter(|p| range.contains(p))
            .collect();
        if mine.is_empty() || self.releasing.load(Ordering::Acquire) {
            return 0;
        }
        let armed = shared.arm_sampled(&mine);
        self.evict_device_pages(&armed, true);
        self.stats
            .sampling_armed_pages
            .fetch_add(armed.len() as u64, Ordering::Relaxed);
        armed.len() as u64
    }

    /// Drops everything the region holds: page cache (dirty pages are
    /// written back, uncharged), backing store, device pages.
    fn release(&self, shared: &SharedDevice) {
        self.releasing.store(true, Ordering::Release);
        match self.plane.evict(0, self.size).map(|t| t.wait()) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(vm = %self.vm, error = %e, "cannot drop the region's pages")
            }
        }
        let punch = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
        if let Err(e) = rustix::fs::fallocate(&*self.store, punch, 0, self.size) {
            tracing::warn!(vm = %self.vm, error = %e, "cannot punch the region's store");
        }
        let dropped = shared.discard_memory(self.base, self.size).unwrap_or(0);
        self.stats.releases.fetch_add(1, Ordering::Relaxed);
        tracing::info!(vm = %self.vm, device_pages = dropped, "CXL memory region released");
    }
}

/// Every VM's region, and the device observer that keeps them coherent
/// with the device cache.
pub struct MemoryRegions {
    shared: Arc<SharedDevice>,
    regions: Vec<Arc<Region>>,
    /// The `region-prefetch` thread's queue.
    filler: filler::Filler,
}

impl std::fmt::Debug for MemoryRegions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.regions.iter()).finish()
    }
}

impl MemoryRegions {
    /// Sets the regions up (`(vm, size)` each) from
    /// [`SharedDevice::memory_base`] upwards, each served by a helper run
    /// as `helper`, mounted (then detached) under `dir`. Subscribes to the
    /// device's evictions. Call before any thread of the daemon maps guest
    /// memory (and before the sandbox: it runs a program). Misses are
    /// released ahead of their modeled completion as `compensation` says
    /// (as the DAX plane's), over the transport `plane` names.
    pub fn start(
        shared: &Arc<SharedDevice>,
        specs: &[MemoryRegionSpec],
        dir: &Path,
        helper: &HelperCommand,
        plane: RegionPlane,
    ) -> Result<Arc<Self>, StartMemoryError> {
        let mut base = shared.memory_base();
        let mut regions = Vec::new();
        let setup = PlaneSetup {
            helper,
            plane,
            fills: Arc::new(FillReads::default()),
        };
        for spec in specs {
            let dir = dir.join(&spec.vm);
            let r = Region::start(shared, &spec.vm, base, spec.size, &dir, &setup)?;
            base += spec.size;
            regions.push(Arc::new(r));
        }
        let me = Arc::new(MemoryRegions {
            shared: shared.clone(),
            regions,
            filler: filler::Filler::default(),
        });
        me.filler
            .start(&me, setup.fills)
            .map_err(StartMemoryError::Filler)?;
        let observer: Arc<dyn DeviceObserver> = me.clone();
        shared.subscribe(Arc::downgrade(&observer));
        Ok(me)
    }

    /// The region of VM `vm`.
    pub fn region(&self, vm: &str) -> Option<&Arc<Region>> {
        self.regions.iter().find(|r| r.vm == vm)
    }

    /// Every region.
    pub fn regions(&self) -> &[Arc<Region>] {
        &self.regions
    }

    /// Access sampling: arms the region pages among device `pages` (see
    /// [`Region::arm_sampled`]), except in the regions of the VMs `skip`
    /// names (another source sees their hits); returns the pages armed.
    pub fn arm_sampled(&self, pages: &[u64], skip: impl Fn(&str) -> bool) -> u64 {
        self.regions
            .iter()
            .filter(|r| !skip(&r.vm))
            .map(|r| r.arm_sampled(&self.shared, pages))
            .sum()
    }

    /// VM `vm` connected from VMM process `pid`: traps of its threads
    /// count for it (the region's plane knows one VM: id 0).
    pub fn vm_connected(&self, vm: &str, pid: Option<u32>) {
        let Some(r) = self.region(vm) else { return };
        // Waits here while a release of the previous connection runs.
        let mut session = lock(&r.session);
        session.epoch += 1;
        session.vmm = pid;
        r.releasing.store(false, Ordering::Release);
        if let Some(pid) = pid {
            r.plane.register_vmm(REGION_VM_ID, pid);
        }
    }

    /// VM `vm`'s connection ended (and the daemon unmapped its memory):
    /// once its VMM process is gone (within `RELEASE_WAIT`), the region
    /// is released, on a thread of its own — unless the VM connected again
    /// meanwhile.
    pub fn vm_disconnected(self: &Arc<Self>, vm: &str) {
        let Some(r) = self.region(vm).cloned() else {
            return;
        };
        r.plane.unregister_vmm(REGION_VM_ID);
        let (pid, epoch) = {
            let mut session = lock(&r.session);
            (session.vmm.take(), session.epoch)
        };
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("release-{vm}"))
            .spawn(move || {
                if let Some(pid) = pid {
                    if !wait_gone(pid, RELEASE_WAIT) {
                        tracing::warn!(vm = %r.vm, pid, "the VMM still runs after its connection ended: its CXL memory region is kept");
                        return;
                    }
                }
                let session = lock(&r.session);
                if session.epoch != epoch {
                    tracing::info!(vm = %r.vm, "the VM connected again: its region is kept");
                    return;
                }
                r.release(&me.shared);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the region release thread");
        }
    }
}

impl MemoryRegions {
    /// Drops the region pages among device `pages` from their planes (see
    /// [`Region::evict_device_pages`]); returns the pages handed over.
    fn evict_device_pages(&self, pages: &[u64], wait: bool) -> u64 {
        if pages.iter().all(|p| *p < self.shared.memory_base() / PAGE) {
            return 0;
        }
        self.regions
            .iter()
            .map(|r| r.evict_device_pages(pages, wait))
            .sum()
    }
}

/// The id of a region's VM in its own plane (one VM per region).
const REGION_VM_ID: VmId = 0;

/// Whether process `pid` is gone (or a zombie) within `limit`.
fn wait_gone(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = &s[s.rfind(')')? + 1..];
                rest.split_whitespace().next().map(str::to_string)
            });
        match state.as_deref() {
            None | Some("Z") | Some("X") => return true,
            _ if Instant::now() >= deadline => return false,
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

impl DeviceObserver for MemoryRegions {
    fn evicted(&self, pages: Vec<u64>) {
        self.evict_device_pages(&pages, false);
    }

    fn evicted_wait(&self, pages: Vec<u64>) -> u64 {
        self.evict_device_pages(&pages, true)
    }

    fn prefetched(&self, pages: Vec<(u64, u64)>) {
        let base = self.shared.memory_base() / PAGE;
        let mine: Vec<(u64, u64)> = pages.into_iter().filter(|p| p.0 >= base).collect();
        if !mine.is_empty() {
            self.filler.queue(mine);
        }
    }

    fn released(&self, _key: FileKey, _extents: &[u64], _file_gone: bool) {}

    fn moved_to_cxl(&self, _old: u8, _new: u8) -> u64 {
        0
    }
}

impl MemorySource for MemoryRegions {
    fn regions(&self) -> Vec<MemoryRegionSample> {
        // One look at the device cache for every region.
        let resident = self.shared.read(|_, dev| dev.resident_page_list());
        self.regions.iter().map(|r| r.sample(&resident)).collect()
    }
}
