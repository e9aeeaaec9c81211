//! The pool: device addresses for file pages, and the one emulated device
//! that every VM's data path goes through.
//!
//! Every host file that a guest reads or writes gets device address space in
//! 2 MiB extents: file bytes `[k * 2 MiB, (k+1) * 2 MiB)` live in one
//! contiguous, 2 MiB-aligned device range. A DAX window slot (issue 4) is
//! 2 MiB, so one slot maps one contiguous pool range. Files are keyed by the
//! host `(st_dev, st_ino)`, not by a VM's node id: two VMs reading the same
//! file touch the same device pages, so the device cache is shared.
//!
//! Extents are allocated on first touch and stay with the file for as long
//! as it exists on the host: the file's data lives on the device whether or
//! not a guest holds it open, so reopening it finds its cached pages again
//! and no other file can inherit them. They return to the pool (and their
//! pages are discarded from the device cache, without write-back) when the
//! file is deleted and the last guest reference goes. A file deleted on the
//! host behind the daemon's back keeps its extents; if the host reuses its
//! inode number, the new file inherits the old one's residency (a timing
//! inaccuracy only: data always comes from the host file).

use crate::placement::{self, Placement, SetCxlRatioError, Tier, TierCensus};
use cxlfs_device_model::nand::NandStats;
use cxlfs_device_model::{AccessError, Device, DeviceStats, Op, PageFilter};
use residency::ResidencyPlane;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

/// Bytes per pool extent (= one DAX window slot).
pub const EXTENT_SIZE: u64 = 2 << 20;
/// Bytes per pool page (= device page, residency-plane page).
pub const PAGE: u64 = 4096;

/// A host file's identity: `(st_dev, st_ino)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    /// Host device number.
    pub dev: u64,
    /// Host inode number.
    pub ino: u64,
}

#[derive(Debug, Default)]
struct FileExtents {
    /// Inode references held by VMs.
    refs: u64,
    /// Pool extent index per 2 MiB file chunk, allocated on first touch.
    extents: HashMap<u64, u64>,
    /// The host file, open for the residency plane's traps and write-backs
    /// (set when a chunk is first mapped into a DAX window).
    dax_file: Option<Arc<File>>,
}

/// Who owns a pool extent (for the residency plane's reverse look-up).
#[derive(Debug, Clone)]
pub struct ExtentOwner {
    /// The host file.
    pub key: FileKey,
    /// The file's 2 MiB chunk held by the extent.
    pub chunk: u64,
    /// The host file, if it was ever mapped through a DAX window.
    pub file: Option<Arc<File>>,
}

/// The pool address allocator.
#[derive(Debug)]
pub struct Pool {
    capacity_extents: u64,
    next: u64,
    free: Vec<u64>,
    files: HashMap<FileKey, FileExtents>,
    aliased: u64,
    /// Extent → (file, chunk), for extents a file owns (not aliased ones).
    owners: HashMap<u64, (FileKey, u64)>,
    /// Extents that have been mapped into a DAX window: their pages may be
    /// resident in the residency plane.
    dax_extents: HashSet<u64>,
    /// Pool pages placed so far (touched), per interleave slot.
    census: TierCensus,
}

/// One contiguous piece of a file range in device address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Device address of the first byte.
    pub addr: u64,
    /// Bytes (never crosses an extent).
    pub len: u32,
}

impl Pool {
    /// A pool over `capacity_bytes` of device address space.
    pub fn new(capacity_bytes: u64) -> Self {
        Pool {
            capacity_extents: capacity_bytes / EXTENT_SIZE,
            next: 0,
            free: Vec::new(),
            files: HashMap::new(),
            aliased: 0,
            owners: HashMap::new(),
            dax_extents: HashSet::new(),
            census: TierCensus::default(),
        }
    }

    /// Pool pages placed (touched) so far: `(dram, cxl)` at `cxl_ratio`.
    pub fn placed_pages(&self, cxl_ratio: u8) -> (u64, u64) {
        self.census.split(cxl_ratio)
    }

    /// Marks pool bytes `[addr, addr + len)` placed (first touch).
    pub fn touch(&mut self, addr: u64, len: u64) {
        if len > 0 {
            self.census.touch(addr / PAGE, (addr + len - 1) / PAGE);
        }
    }

    /// Extents that were ever mapped into a DAX window (still owned).
    pub fn dax_extent_list(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.dax_extents.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// Extents the pool can hand out.
    pub fn capacity_extents(&self) -> u64 {
        self.capacity_extents
    }

    /// Extents currently held by files.
    pub fn allocated_extents(&self) -> u64 {
        self.next - self.free.len() as u64
    }

    /// Chunks that had to share an extent because the pool was full.
    pub fn aliased_chunks(&self) -> u64 {
        self.aliased
    }

    /// A VM took a reference on the file's inode.
    pub fn acquire(&mut self, key: FileKey) {
        self.files.entry(key).or_default().refs += 1;
    }

    /// A VM dropped a reference. The file keeps its extents.
    pub fn release(&mut self, key: FileKey) {
        if let Some(f) = self.files.get_mut(&key) {
            f.refs = f.refs.saturating_sub(1);
        }
    }

    /// The file is gone from the host: returns its own extents (not those it
    /// shared because the pool was full) to the pool, and lists them so the
    /// caller can discard their pages from the device.
    pub fn remove(&mut self, key: FileKey) -> Vec<u64> {
        let own = self.take_file(key);
        self.free_extents(&own);
        own
    }

    /// Forgets the file like [`Pool::remove`] but keeps its own extents off
    /// the free list (the caller frees them with [`Pool::free_extents`] once
    /// their pages are gone from the residency plane). Returns them.
    pub fn take_file(&mut self, key: FileKey) -> Vec<u64> {
        let Some(f) = self.files.remove(&key) else {
            return Vec::new();
        };
        let own: Vec<u64> = f.extents.into_values().filter(|&e| e < self.next).collect();
        for e in &own {
            self.owners.remove(e);
        }
        own
    }

    /// Returns extents taken with [`Pool::take_file`] to the pool.
    pub fn free_extents(&mut self, extents: &[u64]) {
        for e in extents {
            self.dax_extents.remove(e);
            self.census.forget_extent(*e);
        }
        self.free.extend(extents);
    }

    /// Whether the extent was ever mapped into a DAX window (and its pages
    /// may be resident in the residency plane).
    pub fn is_dax_extent(&self, extent: u64) -> bool {
        self.dax_extents.contains(&extent)
    }

    /// The extent holding file chunk `chunk` for a DAX window slot,
    /// allocated if needed and marked as DAX-mapped; `None` when the pool is
    /// full and the chunk would have to share an extent (a window slot must
    /// map the file's own pages). The file is kept open (`file`) for the
    /// plane's traps and write-backs.
    pub fn dax_extent(&mut self, key: FileKey, chunk: u64, file: &Arc<File>) -> Option<u64> {
        self.extent_for(key, chunk);
        let raw = *self.files.get(&key)?.extents.get(&chunk)?;
        if raw >= self.capacity_extents {
            return None;
        }
        if let Some(f) = self.files.get_mut(&key) {
            if f.dax_file.is_none() {
                f.dax_file = Some(file.clone());
            }
        }
        self.dax_extents.insert(raw);
        Some(raw)
    }

    /// The host file kept open for the plane, if the file was DAX-mapped.
    pub fn dax_file(&self, key: FileKey) -> Option<Arc<File>> {
        self.files.get(&key).and_then(|f| f.dax_file.clone())
    }

    /// Who owns pool extent `extent`.
    pub fn owner_of(&self, extent: u64) -> Option<ExtentOwner> {
        let &(key, chunk) = self.owners.get(&extent)?;
        Some(ExtentOwner {
            key,
            chunk,
            file: self.files.get(&key).and_then(|f| f.dax_file.clone()),
        })
    }

    fn extent_for(&mut self, key: FileKey, chunk: u64) -> u64 {
        let cap = self.capacity_extents.max(1);
        let file = self.files.entry(key).or_default();
        if let Some(&e) = file.extents.get(&chunk) {
            return e;
        }
        let e = if let Some(e) = self.free.pop() {
            e
        } else if self.next < self.capacity_extents {
            self.next += 1;
            self.next - 1
        } else {
            // Full: share an extent (deterministically) rather than fail the I/O.
            // TODO(issue-4): DAX needs a real eviction of pool extents here.
            self.aliased += 1;
            (key.ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ chunk) % cap + cap
        };
        file.extents.insert(chunk, e);
        if e < self.capacity_extents {
            self.owners.insert(e, (key, chunk));
        }
        e % cap
    }

    /// Device segments for file bytes `[offset, offset + len)`, allocating
    /// extents as needed.
    pub fn segments(&mut self, key: FileKey, offset: u64, len: u64) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset.saturating_add(len);
        while pos < end {
            let chunk = pos / EXTENT_SIZE;
            let within = pos % EXTENT_SIZE;
            let n = (EXTENT_SIZE - within).min(end - pos);
            let extent = self.extent_for(key, chunk) % self.capacity_extents.max(1);
            out.push(Segment {
                addr: extent * EXTENT_SIZE + within,
                len: n as u32,
            });
            pos += n;
        }
        out
    }

    /// The pool extent holding file chunk `chunk`, if allocated.
    pub fn extent_of(&self, key: FileKey, chunk: u64) -> Option<u64> {
        self.files
            .get(&key)
            .and_then(|f| f.extents.get(&chunk))
            .map(|e| e % self.capacity_extents.max(1))
    }
}

/// What the device did during some accesses (counter deltas), so that
/// NAND work, GC and prefetches can be put down to the VM whose access
/// caused them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceActivity {
    /// NAND page reads (fills, prefetches, GC copies).
    pub nand_reads: u64,
    /// NAND page programs (write-backs, GC copies).
    pub nand_programs: u64,
    /// Of which on behalf of the host (write-backs).
    pub host_programs: u64,
    /// Block erases.
    pub nand_erases: u64,
    /// GC victim blocks reclaimed.
    pub gc_runs: u64,
    /// Prefetches issued.
    pub prefetch_issued: u64,
    /// Prefetched pages used by a demand access.
    pub prefetch_used: u64,
}

impl DeviceActivity {
    fn read(dev: &Device) -> (NandStats, (u64, u64)) {
        (dev.nand_stats(), dev.prefetch_counts())
    }

    fn between(before: &(NandStats, (u64, u64)), after: &(NandStats, (u64, u64))) -> Self {
        let (n0, (pi0, pu0)) = before;
        let (n1, (pi1, pu1)) = after;
        DeviceActivity {
            nand_reads: n1.reads().saturating_sub(n0.reads()),
            nand_programs: n1.programs().saturating_sub(n0.programs()),
            host_programs: n1.host_programs.saturating_sub(n0.host_programs),
            nand_erases: n1.erases.saturating_sub(n0.erases),
            gc_runs: n1.gc_runs.saturating_sub(n0.gc_runs),
            prefetch_issued: pi1.saturating_sub(*pi0),
            prefetch_used: pu1.saturating_sub(*pu0),
        }
    }
}

/// What a data-path charge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charge {
    /// When the last segment completes (device time, ns since daemon start).
    pub completes_at_ns: u64,
    /// Page hits (CXL tier).
    pub page_hits: u64,
    /// Page misses (CXL tier).
    pub page_misses: u64,
    /// Pages served from the DRAM tier (no device access, no delay).
    pub dram_pages: u64,
    /// What the device did meanwhile.
    pub activity: DeviceActivity,
}

/// Why a data-path access could not be charged to the device.
#[derive(Debug, thiserror::Error)]
pub enum ChargeAccessError {
    /// The device refused the access.
    #[error("device access failed")]
    Device(#[from] AccessError),
}

/// A file's dirty pool pages could not be written back.
#[derive(Debug, thiserror::Error)]
#[error("cannot write back pool pages {offset:#x}+{len:#x}")]
pub struct SyncPoolError {
    /// Pool offset of the range.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// The plane's error.
    #[source]
    pub source: residency::SendNotifyError,
}

/// What a change of `cxl_ratio` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RatioChange {
    /// The ratio before.
    pub old: u8,
    /// The ratio now.
    pub new: u8,
    /// CXL → DRAM pages dropped from the device cache (unwritten: their
    /// data now lives in host DRAM).
    pub discarded_device_pages: u64,
    /// DRAM → CXL pages evicted from the residency plane (DAX): their
    /// next access traps and is charged.
    pub plane_evicted_pages: u64,
}

/// Pages the device's prefetcher filled, with when each is ready (ns).
pub type PrefetchedPages = Vec<(u64, u64)>;

/// The device model, the pool and the daemon's clock, shared by all VMs.
#[derive(Debug)]
pub struct SharedDevice {
    device: Mutex<Device>,
    pool: Mutex<Pool>,
    start: Instant,
    /// The residency plane of the DAX window, once attached: pool pages the
    /// device evicts are evicted there too (the device cache is the
    /// residency authority).
    plane: OnceLock<Weak<dyn ResidencyPlane>>,
    /// DRAM / CXL placement of pool pages. Read under the device lock on
    /// the data path and changed under it, so an access is classified by
    /// one ratio.
    placement: Arc<Placement>,
    /// Serializes pushing file bytes into the plane (NOTIFY_STORE) against
    /// every change of those bytes behind it: FUSE WRITE, truncation, a VM
    /// mapping an extent writable. See [`SharedDevice::plane_fill_guard`].
    plane_fill: Mutex<()>,
    /// Where the prefetcher's fills go to be pushed into the plane (DAX).
    prefetch_fills: OnceLock<Sender<PrefetchedPages>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind: keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Charges pool bytes `[addr, addr + len)` (one extent at most) at
/// `now_ns`: CXL-tier runs go to the device, DRAM-tier pages are counted
/// and cost nothing.
fn charge_locked(
    dev: &mut Device,
    cxl_ratio: u8,
    now_ns: u64,
    op: Op,
    addr: u64,
    len: u64,
    charge: &mut Charge,
) -> Result<(), AccessError> {
    if len == 0 {
        return Ok(());
    }
    let end = addr + len;
    for (first, pages, tier) in placement::runs(cxl_ratio, addr / PAGE, (end - 1) / PAGE) {
        match tier {
            Tier::Dram => charge.dram_pages += pages,
            Tier::Cxl => {
                let from = (first * PAGE).max(addr);
                let to = ((first + pages) * PAGE).min(end);
                // A run never crosses an extent (the caller splits there),
                // so it fits a u32.
                let o = dev.access(now_ns, op, from, (to - from) as u32)?;
                charge.completes_at_ns = charge.completes_at_ns.max(o.completes_at_ns);
                charge.page_hits += u64::from(o.page_hits);
                charge.page_misses += u64::from(o.page_misses);
            }
        }
    }
    Ok(())
}

impl SharedDevice {
    /// Wraps a device (every page on the CXL tier); its capacity bounds the pool.
    pub fn new(device: Device) -> Self {
        Self::with_placement(device, Placement::default())
    }

    /// Wraps a device with pages split by `placement`.
    pub fn with_placement(mut device: Device, placement: Placement) -> Self {
        let pool = Pool::new(device.capacity_bytes());
        let placement = Arc::new(placement);
        let p = placement.clone();
        // DRAM-tier pages hold nothing on the device: never prefetch them.
        device.set_prefetch_skip(Some(PageFilter(Arc::new(move |page| {
            p.tier(page) == Tier::Dram
        }))));
        SharedDevice {
            device: Mutex::new(device),
            pool: Mutex::new(pool),
            start: Instant::now(),
            plane: OnceLock::new(),
            placement,
            plane_fill: Mutex::new(()),
            prefetch_fills: OnceLock::new(),
        }
    }

    /// The placement (read-only; change it with [`SharedDevice::set_cxl_ratio`]).
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The ratio in force (percent of file pages on the CXL tier).
    pub fn cxl_ratio(&self) -> u8 {
        self.placement.cxl_ratio()
    }

    /// Changes the share of file pages on the CXL tier at run time
    /// (0..=100 %). Pages that move CXL → DRAM leave the device cache at
    /// once (discarded without a write-back: their data now lives in host
    /// DRAM, and the host file always has it) and stay resident in the
    /// residency plane. Pages that move DRAM → CXL are evicted from the
    /// residency plane (DAX-mapped extents; waits until the kernel has
    /// dropped them) so that their next access traps and is charged; on
    /// the FUSE path their next access is simply a device miss. Never call
    /// it from a residency-plane thread.
    pub fn set_cxl_ratio(&self, cxl_ratio: u8) -> Result<RatioChange, SetCxlRatioError> {
        placement::check_ratio(u64::from(cxl_ratio))?;
        let mut change = RatioChange {
            new: cxl_ratio,
            ..RatioChange::default()
        };
        {
            let mut dev = self.device();
            change.old = self.placement.swap(cxl_ratio)?;
            if cxl_ratio < change.old {
                for page in dev.resident_page_list() {
                    if placement::tier_at(cxl_ratio, page) == Tier::Dram {
                        match dev.discard(page * PAGE, PAGE) {
                            Ok(n) => change.discarded_device_pages += n,
                            Err(e) => {
                                tracing::warn!(error = %e, page, "cannot discard a page moved to DRAM")
                            }
                        }
                    }
                }
            }
        }
        if cxl_ratio > change.old {
            change.plane_evicted_pages = self.evict_moved_to_cxl(change.old, cxl_ratio);
        }
        tracing::info!(
            old = change.old,
            new = cxl_ratio,
            discarded = change.discarded_device_pages,
            plane_evicted = change.plane_evicted_pages,
            "cxl_ratio changed"
        );
        Ok(change)
    }

    /// Evicts from the residency plane the pages of DAX-mapped extents
    /// whose rank is in `[old, new)` (DRAM at `old`, CXL at `new`);
    /// returns the pages evicted.
    fn evict_moved_to_cxl(&self, old: u8, new: u8) -> u64 {
        let Some(plane) = self.plane() else { return 0 };
        let extents = self.pool().dax_extent_list();
        let per_extent = EXTENT_SIZE / PAGE;
        let mut tickets = Vec::new();
        let mut pages = 0;
        for extent in extents {
            let first = extent * per_extent;
            let last = first + per_extent - 1;
            let mut run: Option<(u64, u64)> = None;
            let mut flush = |run: &mut Option<(u64, u64)>| {
                if let Some((start, n)) = run.take() {
                    match plane.evict(start * PAGE, n * PAGE) {
                        Ok(t) => tickets.push(t),
                        Err(e) => {
                            tracing::warn!(error = %e, start, n, "cannot evict pages moved to CXL")
                        }
                    }
                }
            };
            for page in first..=last {
                let r = placement::rank(page);
                if r >= old && r < new {
                    pages += 1;
                    run = match run {
                        Some((start, n)) if start + n == page => Some((start, n + 1)),
                        other => {
                            let mut o = other;
                            flush(&mut o);
                            Some((page, 1))
                        }
                    };
                }
            }
            flush(&mut run);
        }
        for t in tickets {
            if let Err(e) = t.wait() {
                tracing::warn!(error = %e, "eviction of pages moved to CXL failed");
            }
        }
        pages
    }

    /// Pool pages placed so far, `(dram, cxl)` at the current ratio.
    pub fn placed_pages(&self) -> (u64, u64) {
        let ratio = self.cxl_ratio();
        self.pool().placed_pages(ratio)
    }

    /// Monotonic nanoseconds since the daemon started (device time).
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The pool (locked).
    pub fn pool(&self) -> MutexGuard<'_, Pool> {
        lock(&self.pool)
    }

    /// The device (locked).
    pub fn device(&self) -> MutexGuard<'_, Device> {
        lock(&self.device)
    }

    /// Device counters.
    pub fn stats(&self) -> DeviceStats {
        self.device().stats()
    }

    /// Attaches the residency plane: from now on the device logs its
    /// evictions and every evicted page of a DAX-mapped extent is evicted
    /// from the plane, so the next guest access traps again. Once only.
    pub fn attach_plane(&self, plane: Weak<dyn ResidencyPlane>) {
        if self.plane.set(plane).is_ok() {
            self.device().log_evictions(true);
        }
    }

    /// Held across anything that pushes host-file bytes into the plane, and
    /// across anything that changes a file's bytes behind the plane (FUSE
    /// WRITE, truncation) or lets a guest store into them (a writable DAX
    /// slot): a fill then always stores what the page holds anyway, so it
    /// can race a trap of the same page without losing a store.
    pub fn plane_fill_guard(&self) -> MutexGuard<'_, ()> {
        lock(&self.plane_fill)
    }

    /// From now on the pages the device's prefetcher fills (with their ready
    /// times) are sent to `tx`, to be pushed into the plane. Once only.
    pub fn attach_prefetch_filler(&self, tx: Sender<PrefetchedPages>) {
        if self.prefetch_fills.set(tx).is_ok() {
            self.device().log_prefetches(true);
        }
    }

    /// Sends the prefetched pages of DAX-mapped extents to the filler.
    fn mirror_prefetches(&self, filled: Vec<(u64, u64)>) {
        if filled.is_empty() {
            return;
        }
        let Some(tx) = self.prefetch_fills.get() else {
            return;
        };
        let filled: Vec<(u64, u64)> = {
            let pool = self.pool();
            filled
                .into_iter()
                .filter(|&(p, _)| pool.is_dax_extent(p * PAGE / EXTENT_SIZE))
                .collect()
        };
        if !filled.is_empty() {
            // The filler gone (shutting down): nothing to push.
            let _ = tx.send(filled);
        }
    }

    /// The residency plane of the DAX window, while one is attached.
    pub fn plane(&self) -> Option<Arc<dyn ResidencyPlane>> {
        self.plane.get().and_then(Weak::upgrade)
    }

    /// Hands pages the caller drained from the device's eviction log
    /// ([`Device::drain_evictions`]) to the plane, as the data path does
    /// (control commands that run the device directly).
    pub fn mirror_evicted_pages(&self, evicted: Vec<u64>) {
        self.mirror_evictions(evicted);
    }

    /// Hands the device's evicted pages (those of DAX-mapped extents) to
    /// the plane as coalesced ranges. Never waits: safe on plane threads.
    fn mirror_evictions(&self, evicted: Vec<u64>) {
        if evicted.is_empty() {
            return;
        }
        let Some(plane) = self.plane() else { return };
        let page = residency::PAGE_SIZE;
        let mut pages: Vec<u64> = {
            let pool = self.pool();
            evicted
                .into_iter()
                .filter(|p| pool.is_dax_extent(p * page / EXTENT_SIZE))
                .collect()
        };
        pages.sort_unstable();
        pages.dedup();
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j] == pages[j - 1] + 1 {
                j += 1;
            }
            let (off, len) = (pages[i] * page, (j - i) as u64 * page);
            // The ticket is dropped: the notifier goes on without a waiter.
            if let Err(e) = plane.evict(off, len) {
                tracing::warn!(error = %e, off, len, "cannot evict pool pages from the plane");
            }
            i = j;
        }
    }

    /// Runs `f` on the locked device (with the ratio in force), puts the
    /// device activity it caused into the charge, then hands the evictions
    /// and prefetches it logged to the residency plane, outside the lock.
    fn charged(
        &self,
        now_ns: u64,
        f: impl FnOnce(&mut Device, u8, &mut Charge) -> Result<(), AccessError>,
    ) -> Result<Charge, ChargeAccessError> {
        let mut charge = Charge {
            completes_at_ns: now_ns,
            ..Charge::default()
        };
        let (evicted, prefetched) = {
            let mut dev = self.device();
            let before = DeviceActivity::read(&dev);
            f(&mut dev, self.placement.cxl_ratio(), &mut charge)?;
            charge.activity = DeviceActivity::between(&before, &DeviceActivity::read(&dev));
            (dev.drain_evictions(), dev.drain_prefetches())
        };
        self.mirror_evictions(evicted);
        self.mirror_prefetches(prefetched);
        Ok(charge)
    }

    /// Charges a pool (device) range directly: a residency-plane trap at
    /// `addr` (never crosses an extent). DRAM-tier pages cost nothing and
    /// never enter the device cache.
    pub fn charge_pool(
        &self,
        now_ns: u64,
        op: Op,
        addr: u64,
        len: u32,
    ) -> Result<Charge, ChargeAccessError> {
        self.pool().touch(addr, u64::from(len));
        self.charged(now_ns, |dev, ratio, charge| {
            charge_locked(dev, ratio, now_ns, op, addr, u64::from(len), charge)
        })
    }

    /// A residency-plane write-back of pool bytes `[addr, addr+len)` (never
    /// crosses an extent): stores through DAX windows never reached the
    /// model (hits are invisible), so CXL-tier pages are bare NAND programs
    /// (`Device::write_back`: no fill, no hit or miss); DRAM-tier pages are
    /// free.
    pub fn write_back_pool(
        &self,
        now_ns: u64,
        addr: u64,
        len: u64,
    ) -> Result<Charge, ChargeAccessError> {
        self.charged(now_ns, |dev, ratio, charge| {
            if len == 0 {
                return Ok(());
            }
            let end = addr + len;
            for (first, pages, tier) in placement::runs(ratio, addr / PAGE, (end - 1) / PAGE) {
                match tier {
                    Tier::Dram => charge.dram_pages += pages,
                    Tier::Cxl => {
                        let from = (first * PAGE).max(addr);
                        let to = ((first + pages) * PAGE).min(end);
                        let done = dev.write_back(now_ns, from, to - from)?;
                        charge.completes_at_ns = charge.completes_at_ns.max(done);
                    }
                }
            }
            Ok(())
        })
    }

    /// Charges file bytes `[offset, offset+len)` of `key` arriving at `now_ns`.
    pub fn charge(
        &self,
        now_ns: u64,
        op: Op,
        key: FileKey,
        offset: u64,
        len: u64,
    ) -> Result<Charge, ChargeAccessError> {
        if len == 0 {
            return Ok(Charge {
                completes_at_ns: now_ns,
                ..Charge::default()
            });
        }
        let segments = {
            let mut pool = self.pool();
            let segments = pool.segments(key, offset, len);
            for s in &segments {
                pool.touch(s.addr, u64::from(s.len));
            }
            segments
        };
        self.charged(now_ns, |dev, ratio, charge| {
            for s in segments {
                charge_locked(dev, ratio, now_ns, op, s.addr, u64::from(s.len), charge)?;
            }
            Ok(())
        })
    }

    /// Makes the residency plane drop file bytes `[offset, offset + len)` of
    /// `key` (page-rounded; only chunks mapped into a DAX window), writing
    /// dirty pages back first, and waits: called before the host file is
    /// changed behind the pool (FUSE WRITE, truncation), so that a window
    /// never shows stale bytes and a late write-back never overwrites new
    /// ones. Never call it from a plane thread. No-op without DAX.
    pub fn evict_file_range(&self, key: FileKey, offset: u64, len: u64) {
        let Some(plane) = self.plane() else { return };
        for (off, n) in self.dax_pool_ranges(key, offset, len) {
            match plane.evict(off, n).map(|t| t.wait()) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) | Err(e) => {
                    tracing::warn!(error = %e, off, len = n, "cannot evict pool pages before a file change")
                }
            }
        }
    }

    /// Writes back the dirty pool pages of a file's byte range (stores made
    /// through DAX windows) to the host file and waits; the pages stay
    /// resident. For FSYNC. No-op without DAX.
    pub fn sync_file_range(
        &self,
        key: FileKey,
        offset: u64,
        len: u64,
    ) -> Result<(), SyncPoolError> {
        let Some(plane) = self.plane() else {
            return Ok(());
        };
        for (off, n) in self.dax_pool_ranges(key, offset, len) {
            plane.sync(off, n).map_err(|source| SyncPoolError {
                offset: off,
                len: n,
                source,
            })?;
        }
        Ok(())
    }

    /// The pool ranges (page aligned, within DAX extents) that hold the
    /// file's bytes `[offset, offset + len)`, in file order.
    fn dax_pool_ranges(&self, key: FileKey, offset: u64, len: u64) -> Vec<(u64, u64)> {
        if len == 0 {
            return Vec::new();
        }
        let page = residency::PAGE_SIZE;
        let start = offset / page * page;
        let end = offset
            .saturating_add(len)
            .div_ceil(page)
            .saturating_mul(page);
        let pool = self.pool();
        let Some(f) = pool.files.get(&key) else {
            return Vec::new();
        };
        let mut chunks: Vec<(u64, u64)> = f
            .extents
            .iter()
            .map(|(&chunk, &e)| (chunk, e))
            .filter(|&(chunk, e)| {
                let (lo, hi) = (chunk * EXTENT_SIZE, (chunk + 1) * EXTENT_SIZE);
                lo < end && hi > start && e < pool.capacity_extents && pool.is_dax_extent(e)
            })
            .collect();
        chunks.sort_unstable();
        chunks
            .into_iter()
            .map(|(chunk, e)| {
                let lo = (chunk * EXTENT_SIZE).max(start);
                let hi = ((chunk + 1) * EXTENT_SIZE).min(end);
                (e * EXTENT_SIZE + lo % EXTENT_SIZE, hi - lo)
            })
            .collect()
    }

    /// Drops one reference on a file; `deleted`: the host file no longer
    /// exists (no links left), so with the last reference its extents go
    /// back to the pool and their device pages are discarded unwritten.
    pub fn release_file(&self, key: FileKey, deleted: bool) {
        let (freed, dax) = {
            let mut pool = self.pool();
            pool.release(key);
            let unused = pool.files.get(&key).is_some_and(|f| f.refs == 0);
            if deleted && unused {
                let own = pool.take_file(key);
                let dax: Vec<u64> = own
                    .iter()
                    .copied()
                    .filter(|&e| pool.is_dax_extent(e))
                    .collect();
                (own, dax)
            } else {
                (Vec::new(), Vec::new())
            }
        };
        {
            let mut dev = self.device();
            for &extent in &freed {
                if let Err(e) = dev.discard(extent * EXTENT_SIZE, EXTENT_SIZE) {
                    tracing::warn!(error = %e, extent, "cannot discard a freed pool extent");
                }
            }
        }
        // The plane must forget the deleted file's pages before another file
        // gets the extents (its write-backs find no owner and are dropped).
        if let Some(plane) = self.plane() {
            for &extent in &dax {
                match plane.evict(extent * EXTENT_SIZE, EXTENT_SIZE) {
                    Ok(t) => {
                        if let Err(e) = t.wait() {
                            tracing::warn!(error = %e, extent, "pool eviction of a deleted file failed");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, extent, "cannot evict a deleted file's pool extent")
                    }
                }
            }
        }
        self.pool().free_extents(&freed);
    }

    /// Writes every dirty device page back; returns when that is durable.
    pub fn flush(&self) -> Result<u64, AccessError> {
        let now = self.now_ns();
        self.device().flush(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: FileKey = FileKey { dev: 1, ino: 2 };

    #[test]
    fn extents_are_contiguous_and_aligned() {
        let mut p = Pool::new(64 * EXTENT_SIZE);
        p.acquire(K);
        let s = p.segments(K, EXTENT_SIZE - 4096, 8192);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].len, 4096);
        assert_eq!(s[1].len, 4096);
        assert_eq!(s[0].addr % EXTENT_SIZE, EXTENT_SIZE - 4096);
        assert_eq!(s[1].addr % EXTENT_SIZE, 0);
        // Same file range, same addresses.
        assert_eq!(p.segments(K, EXTENT_SIZE - 4096, 8192), s);
        assert_eq!(p.allocated_extents(), 2);
    }

    #[test]
    fn files_do_not_overlap_keep_extents_and_remove_frees() {
        let mut p = Pool::new(4 * EXTENT_SIZE);
        let other = FileKey { dev: 1, ino: 3 };
        p.acquire(K);
        p.acquire(other);
        let a = p.segments(K, 0, 1)[0].addr / EXTENT_SIZE;
        let b = p.segments(other, 0, 1)[0].addr / EXTENT_SIZE;
        assert_ne!(a, b);
        p.release(K);
        // Still on the device: reopening finds the same extent, and no other
        // file can be handed it.
        assert_eq!(p.allocated_extents(), 2);
        let third = FileKey { dev: 1, ino: 4 };
        assert_ne!(p.segments(third, 0, 1)[0].addr / EXTENT_SIZE, a);
        p.acquire(K);
        assert_eq!(p.segments(K, 0, 1)[0].addr / EXTENT_SIZE, a);
        assert_eq!(p.remove(K), vec![a]);
        assert_eq!(p.allocated_extents(), 2);
        assert_eq!(
            p.segments(FileKey { dev: 1, ino: 5 }, 0, 1)[0].addr / EXTENT_SIZE,
            a
        );
    }

    #[test]
    fn deleting_a_file_discards_its_device_pages() {
        let cfg = cxlfs_device_model::DeviceConfig::default()
            .with_overrides(&["cache.size_bytes=16MiB"])
            .unwrap();
        let shared = SharedDevice::new(Device::new(cfg).unwrap());
        shared.pool().acquire(K);
        let first = shared.charge(0, Op::Read, K, 0, 8192).unwrap();
        assert_eq!(first.page_misses, 2);
        shared.release_file(K, false);
        shared.pool().acquire(K);
        let again = shared
            .charge(first.completes_at_ns, Op::Read, K, 0, 8192)
            .unwrap();
        assert_eq!(again.page_hits, 2, "a closed file keeps its cached pages");
        shared.release_file(K, true);
        assert_eq!(shared.stats().resident_pages, 0);
        let other = FileKey { dev: 1, ino: 9 };
        shared.pool().acquire(other);
        let fresh = shared
            .charge(again.completes_at_ns, Op::Read, other, 0, 8192)
            .unwrap();
        assert_eq!(
            fresh.page_misses, 2,
            "a new file must not hit a deleted file's pages"
        );
    }

    fn device_with(ratio: u8, extra: &[&str]) -> SharedDevice {
        let mut o = vec!["cache.size_bytes=16MiB", "nand.read_ns=30us"];
        o.extend_from_slice(extra);
        let cfg = cxlfs_device_model::DeviceConfig::default()
            .with_overrides(&o)
            .unwrap();
        SharedDevice::with_placement(Device::new(cfg).unwrap(), Placement::new(ratio).unwrap())
    }

    #[test]
    fn dram_tier_pages_cost_no_device_access() {
        let shared = device_with(0, &[]);
        shared.pool().acquire(K);
        let c = shared.charge(1000, Op::Read, K, 0, 256 * PAGE).unwrap();
        assert_eq!((c.page_hits, c.page_misses, c.dram_pages), (0, 0, 256));
        assert_eq!(c.completes_at_ns, 1000, "no delay");
        assert_eq!(c.activity, DeviceActivity::default());
        let w = shared.charge(2000, Op::Write, K, 100, 3 * PAGE).unwrap();
        assert_eq!(
            (w.page_misses, w.dram_pages, w.completes_at_ns),
            (0, 4, 2000)
        );
        let st = shared.stats();
        assert_eq!((st.accesses, st.hits, st.misses), (0, 0, 0));
        assert_eq!((st.resident_pages, st.nand.reads()), (0, 0));
        assert_eq!(shared.placed_pages(), (256, 0));
        // A trap / write-back on a DRAM page: the same.
        let t = shared.charge_pool(5000, Op::Read, 0, PAGE as u32).unwrap();
        assert_eq!(
            (t.page_misses, t.dram_pages, t.completes_at_ns),
            (0, 1, 5000)
        );
    }

    #[test]
    fn the_split_follows_the_ratio_and_dram_pages_never_enter_the_cache() {
        for ratio in [1u8, 30, 50, 99] {
            // A prefetcher that would pull neighbours in.
            let shared = device_with(ratio, &["prefetch.degree=4"]);
            shared.pool().acquire(K);
            let pages = 1000;
            let c = shared.charge(0, Op::Read, K, 0, pages * PAGE).unwrap();
            let base = shared.pool().extent_of(K, 0).unwrap() * EXTENT_SIZE / PAGE;
            let want_cxl = (base..base + pages)
                .filter(|&p| placement::tier_at(ratio, p) == Tier::Cxl)
                .count() as u64;
            assert_eq!(c.page_misses + c.page_hits, want_cxl, "ratio {ratio}");
            assert_eq!(c.dram_pages, pages - want_cxl);
            assert!(want_cxl.abs_diff(pages * u64::from(ratio) / 100) <= 3);
            let dev = shared.device();
            for p in dev.resident_page_list() {
                assert_eq!(
                    placement::tier_at(ratio, p),
                    Tier::Cxl,
                    "page {p} at {ratio}"
                );
            }
            drop(dev);
            assert_eq!(shared.placed_pages(), (pages - want_cxl, want_cxl));
        }
    }

    #[test]
    fn changing_the_ratio_moves_pages_between_tiers() {
        let shared = device_with(100, &[]);
        shared.pool().acquire(K);
        let pages = 400;
        let first = shared.charge(0, Op::Read, K, 0, pages * PAGE).unwrap();
        assert_eq!(first.page_misses, pages);
        assert_eq!(shared.stats().resident_pages, pages);
        // 100 -> 30: 70 % of the pages leave the device cache.
        let ch = shared.set_cxl_ratio(30).unwrap();
        assert_eq!((ch.old, ch.new), (100, 30));
        assert_eq!(ch.discarded_device_pages, pages * 70 / 100);
        assert_eq!(shared.stats().resident_pages, pages * 30 / 100);
        let t = first.completes_at_ns;
        let again = shared.charge(t, Op::Read, K, 0, pages * PAGE).unwrap();
        assert_eq!(
            (again.page_hits, again.page_misses, again.dram_pages),
            (120, 0, 280)
        );
        // 30 -> 60: the pages that moved to CXL miss on their next access.
        let ch = shared.set_cxl_ratio(60).unwrap();
        assert_eq!(ch.discarded_device_pages, 0);
        let t = again.completes_at_ns;
        let third = shared.charge(t, Op::Read, K, 0, pages * PAGE).unwrap();
        assert_eq!(
            (third.page_hits, third.page_misses, third.dram_pages),
            (120, 120, 160)
        );
        assert_eq!(shared.placed_pages(), (160, 240));
        assert_eq!(
            shared.set_cxl_ratio(101).unwrap_err(),
            SetCxlRatioError::OutOfRange(101)
        );
        assert_eq!(shared.cxl_ratio(), 60, "a refused ratio changes nothing");
    }

    #[test]
    fn full_pool_aliases_instead_of_failing() {
        let mut p = Pool::new(2 * EXTENT_SIZE);
        p.acquire(K);
        let s = p.segments(K, 0, 5 * EXTENT_SIZE);
        assert_eq!(s.len(), 5);
        assert!(s.iter().all(|s| s.addr < 2 * EXTENT_SIZE));
        assert_eq!(p.aliased_chunks(), 3);
        assert_eq!(
            p.remove(K).len(),
            2,
            "only the file's own extents are freed"
        );
        assert_eq!(p.allocated_extents(), 0);
    }
}
