//! The one emulated device every VM's data path goes through, and what
//! belongs to it: the pool allocator ([`pool`]), the DRAM / CXL placement
//! ([`placement`]), the device's clock ([`Clock`]) and its events
//! ([`events`]).
//!
//! The device model itself (`cxlfs-device-model`) is pure: time is an
//! argument. [`SharedDevice`] is the daemon's locked instance of it:
//! charges take the arrival time from the caller, and only the daemon's
//! threads sleep or spin. Nothing here knows the residency plane; the DAX
//! plane subscribes to the device's events instead.
//!
//! The device is sealed: the model and the pool sit behind one lock that
//! never leaves this module. Callers run closures on them through
//! [`SharedDevice::transact`] (which hands every eviction and prefetch the
//! closure caused to the observers once the lock is released) or
//! [`SharedDevice::read`]. One lock means no order to keep between the
//! pool and the device; it is a leaf: closures run under it get the pool
//! and the device, not the `SharedDevice`, and a transaction started from
//! inside another one panics instead of deadlocking.

pub mod clock;
pub mod events;
mod figures;
mod lock_times;
pub mod placement;
pub mod pool;
mod sampling;

pub use clock::Clock;
pub use events::DeviceObserver;
pub use lock_times::LockTimesSnapshot;
pub use pool::{page_runs, ExtentOwner, Pool, EXTENT_SIZE, PAGE};

use crate::ids::FileKey;
use crate::sync::lock;
use cxlfs_device_model::nand::NandStats;
use cxlfs_device_model::write_log::WriteLogStats;
use cxlfs_device_model::{AccessError, Device, DeviceStats, Op, PageFilter, References};
use events::Observers;
use placement::{Placement, SetCxlRatioError, Tier};
use sampling::SampleMarks;
pub use sampling::SamplingCounts;
use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

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
    /// Lines written into the device's write log (`cache.write_log_bytes`).
    pub log_writes: u64,
    /// Reads served from the write log.
    pub log_hits: u64,
    /// Logged lines that merged (rewrites, and lines cleaned together).
    pub log_coalesced: u64,
}

/// The counters [`DeviceActivity`] is the difference of.
type ActivityCounters = (NandStats, (u64, u64), WriteLogStats);

impl DeviceActivity {
    fn read(dev: &Device) -> ActivityCounters {
        let log = dev.write_log().map(|l| l.stats()).unwrap_or_default();
        (dev.nand_stats(), dev.prefetch_counts(), log)
    }

    fn between(before: &ActivityCounters, after: &ActivityCounters) -> Self {
        let (n0, (pi0, pu0), l0) = before;
        let (n1, (pi1, pu1), l1) = after;
        DeviceActivity {
            log_writes: l1.writes.saturating_sub(l0.writes),
            log_hits: l1.hits.saturating_sub(l0.hits),
            log_coalesced: l1.coalesced.saturating_sub(l0.coalesced),
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
    /// Pages access sampling had armed: this access is a sampled one.
    pub sampled_pages: u64,
}

impl Charge {
    /// Folds one device access into the charge.
    fn add(&mut self, o: &cxlfs_device_model::Outcome) {
        self.completes_at_ns = self.completes_at_ns.max(o.completes_at_ns);
        self.page_hits += u64::from(o.page_hits);
        self.page_misses += u64::from(o.page_misses);
    }
}

/// Why a data-path access could not be charged to the device.
#[derive(Debug, thiserror::Error)]
pub enum ChargeAccessError {
    /// The device refused the access.
    #[error("device access failed")]
    Device(#[from] AccessError),
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

/// The most idle files one [`SharedDevice::make_room`] reclaims.
pub const MAKE_ROOM_FILES: usize = 64;

/// Pages the device's prefetcher filled, with when each is ready (ns).
pub type PrefetchedPages = Vec<(u64, u64)>;

/// The device model, the pool, the placement and the daemon's clock,
/// shared by all VMs: the one locked device. It never calls the residency
/// plane: what the device does that a plane must mirror (evictions,
/// prefetch fills, freed extents, pages moved to the CXL tier) goes to the
/// `DeviceObserver`s that subscribed.
pub struct SharedDevice {
    state: Mutex<Locked>,
    clock: Clock,
    /// DRAM / CXL placement of pool pages. Read under the device lock on
    /// the data path and changed under it, so an access is classified by
    /// one ratio.
    placement: Arc<Placement>,
    observers: Observers,
    /// First device byte of the memory regions (memory mode): the pool of
    /// file extents is `[0, memory_base)`, regions `[memory_base,
    /// capacity)`. Region pages are always CXL-tier.
    memory_base: u64,
}

/// What the one lock of a [`SharedDevice`] guards: the device model and
/// the pool of file extents, always together.
struct Locked {
    device: Device,
    pool: Pool,
    marks: SampleMarks,
    /// How long this lock was waited for and held.
    times: lock_times::LockTimes,
}

thread_local! {
    /// Whether this thread holds a [`SharedDevice`]'s lock.
    static HOLDS_DEVICE: Cell<bool> = const { Cell::new(false) };
}

/// The locked device and pool; marks the thread as holding them, and
/// records how long it held them when dropped.
struct StateGuard<'a> {
    locked: MutexGuard<'a, Locked>,
    since: Instant,
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let held = self.since.elapsed();
        self.locked.times.held(held);
        HOLDS_DEVICE.with(|h| h.set(false));
    }
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = Locked;
    fn deref(&self) -> &Locked {
        &self.locked
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut Locked {
        &mut self.locked
    }
}

/// How the evictions a [`SharedDevice::transact`] caused reach the
/// observers (after the lock is released, always).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// Hand them over and go on (the data path, plane threads).
    Hand,
    /// Wait until the observers have dropped them (control commands;
    /// never on a plane thread).
    Wait,
}

/// What a [`SharedDevice::transact`] handed to the observers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    /// Pages the device evicted.
    pub evicted_pages: u64,
    /// Of those, the pages the observers dropped ([`Publish::Wait`] only).
    pub dropped_pages: u64,
}

/// Why device address space could not be set aside for memory regions.
#[derive(Debug, thiserror::Error)]
#[error("memory regions of {wanted} bytes do not fit a device of {capacity} bytes with room for file pages (at least one 2 MiB extent, regions in whole extents)")]
pub struct ReserveMemoryError {
    /// Bytes asked for.
    pub wanted: u64,
    /// The device's capacity.
    pub capacity: u64,
}

impl std::fmt::Debug for SharedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedDevice")
            .field("cxl_ratio", &self.cxl_ratio())
            .finish_non_exhaustive()
    }
}

/// Splits pool bytes `[addr, addr + len)` (one extent at most) by tier
/// at `cxl_ratio`: DRAM-tier pages are counted into `charge` and cost
/// nothing; each CXL-tier run `[from, to)` goes to `cxl`.
fn by_tier(
    cxl_ratio: u8,
    addr: u64,
    len: u64,
    charge: &mut Charge,
    mut cxl: impl FnMut(u64, u64, &mut Charge) -> Result<(), AccessError>,
) -> Result<(), AccessError> {
    if len == 0 {
        return Ok(());
    }
    let end = addr + len;
    for (first, pages, tier) in placement::runs(cxl_ratio, addr / PAGE, (end - 1) / PAGE) {
        match tier {
            Tier::Dram => charge.dram_pages += pages,
            Tier::Cxl => cxl(
                (first * PAGE).max(addr),
                ((first + pages) * PAGE).min(end),
                charge,
            )?,
        }
    }
    Ok(())
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
    by_tier(cxl_ratio, addr, len, charge, |from, to, charge| {
        // A run never crosses an extent (the caller splits there), so it
        // fits a u32.
        charge.add(&dev.access(now_ns, op, from, (to - from) as u32)?);
        Ok(())
    })
}

/// Charges pool bytes `[addr, addr + len)` (one extent at most) as a trap
/// at `now_ns` with the ratio `ratio`: touched, charged, and the sampling
/// marks on them taken.
fn charge_pool_locked(
    pool: &mut Pool,
    dev: &mut Device,
    marks: &mut SampleMarks,
    (ratio, now_ns, op): (u8, u64, Op),
    addr: u64,
    len: u32,
    charge: &mut Charge,
) -> Result<(), AccessError> {
    pool.touch(addr, u64::from(len));
    charge_locked(dev, ratio, now_ns, op, addr, u64::from(len), charge)?;
    charge.sampled_pages = marks.take(addr, u64::from(len));
    Ok(())
}

/// Charges file bytes `(key, offset, len)`: maps them to pool segments
/// (allocating extents as needed), marks those touched, charges each.
fn charge_file_locked(
    pool: &mut Pool,
    dev: &mut Device,
    cxl_ratio: u8,
    now_ns: u64,
    op: Op,
    (key, offset, len): (FileKey, u64, u64),
    charge: &mut Charge,
) -> Result<(), AccessError> {
    for s in pool.segments(key, offset, len) {
        pool.touch(s.addr, u64::from(s.len));
        charge_locked(dev, cxl_ratio, now_ns, op, s.addr, u64::from(s.len), charge)?;
    }
    Ok(())
}

impl SharedDevice {
    /// Wraps a device (every page on the CXL tier); its capacity bounds the pool.
    pub fn new(device: Device) -> Self {
        Self::with_placement(device, Placement::default())
    }

    /// Wraps a device with pages split by `placement`.
    pub fn with_placement(device: Device, placement: Placement) -> Self {
        let capacity = device.capacity_bytes();
        Self::build(device, placement, capacity)
    }

    /// Wraps a device with pages split by `placement` and the top
    /// `memory_bytes` (whole extents) set aside for memory regions.
    pub fn with_memory(
        device: Device,
        placement: Placement,
        memory_bytes: u64,
    ) -> Result<Self, ReserveMemoryError> {
        let capacity = device.capacity_bytes();
        let usable = capacity / EXTENT_SIZE * EXTENT_SIZE;
        match usable.checked_sub(memory_bytes) {
            Some(base) if base >= EXTENT_SIZE && memory_bytes % EXTENT_SIZE == 0 => {
                Ok(Self::build(device, placement, base))
            }
            _ => Err(ReserveMemoryError {
                wanted: memory_bytes,
                capacity,
            }),
        }
    }

    fn build(mut device: Device, placement: Placement, memory_base: u64) -> Self {
        let pool = Pool::new(memory_base);
        let placement = Arc::new(placement);
        let p = placement.clone();
        let first_region_page = memory_base / PAGE;
        // DRAM-tier pages hold nothing on the device: never prefetch them.
        device.set_prefetch_skip(Some(PageFilter(Arc::new(move |page| {
            page < first_region_page && p.tier(page) == Tier::Dram
        }))));
        SharedDevice {
            state: Mutex::new(Locked {
                device,
                pool,
                marks: SampleMarks::default(),
                times: lock_times::LockTimes::new(),
            }),
            clock: Clock::new(),
            placement,
            observers: Observers::default(),
            memory_base,
        }
    }

    /// First device byte of the memory regions (the end of the file pool).
    pub fn memory_base(&self) -> u64 {
        self.memory_base
    }

    /// Charges a memory-region access (device bytes `[addr, addr + len)`,
    /// at or above [`SharedDevice::memory_base`]): always CXL-tier, never
    /// in the pool of file extents.
    pub fn charge_memory(
        &self,
        now_ns: u64,
        op: Op,
        addr: u64,
        len: u32,
    ) -> Result<Charge, ChargeAccessError> {
        self.charged(now_ns, |_, dev, _, charge, marks| {
            charge.add(&dev.access(now_ns, op, addr, len)?);
            charge.sampled_pages = marks.take(addr, u64::from(len));
            Ok(())
        })
    }

    /// A write-back of memory-region bytes: bare NAND programs, as
    /// [`SharedDevice::write_back_pool`] for CXL-tier file pages.
    pub fn write_back_memory(
        &self,
        now_ns: u64,
        addr: u64,
        len: u64,
    ) -> Result<Charge, ChargeAccessError> {
        self.charged(now_ns, |_, dev, _, charge, marks| {
            marks.defer(addr, len, |addr, len| {
                let done = dev.write_back(now_ns, addr, len)?;
                charge.completes_at_ns = charge.completes_at_ns.max(done);
                Ok(())
            })
        })
    }

    /// Drops memory-region bytes from the device cache without writing
    /// them anywhere (a region released with its VM). Returns the pages
    /// dropped.
    pub fn discard_memory(&self, addr: u64, len: u64) -> Result<u64, AccessError> {
        self.discard(addr, len)
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
            let mut state = self.state();
            let Locked {
                device: dev, marks, ..
            } = &mut *state;
            change.old = self.placement.swap(cxl_ratio)?;
            if cxl_ratio < change.old {
                let first_region_page = self.memory_base / PAGE;
                for page in dev.resident_page_list() {
                    // Memory-region pages are CXL whatever the ratio.
                    if page < first_region_page && placement::tier_at(cxl_ratio, page) == Tier::Dram
                    {
                        // In DRAM now: a deferred program is owed no more.
                        marks.forget(page * PAGE, PAGE);
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
            change.plane_evicted_pages = self
                .observers
                .live()
                .iter()
                .map(|o| o.moved_to_cxl(change.old, cxl_ratio))
                .sum();
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

    /// Pool pages placed so far, `(dram, cxl)` at the current ratio.
    pub fn placed_pages(&self) -> (u64, u64) {
        let ratio = self.cxl_ratio();
        self.read(|pool, _| pool.placed_pages(ratio))
    }

    /// Monotonic nanoseconds since the daemon started (device time).
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// The device's clock (device time).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The lock of the device and the pool. Panics if this thread holds
    /// it already (a transaction started inside another one).
    fn state(&self) -> StateGuard<'_> {
        assert!(
            !HOLDS_DEVICE.with(Cell::get),
            "a device transaction started inside another one"
        );
        let asked = Instant::now();
        let mut locked = lock(&self.state);
        let since = Instant::now();
        locked.times.waited(since.duration_since(asked));
        HOLDS_DEVICE.with(|h| h.set(true));
        StateGuard { locked, since }
    }

    /// Runs `f` on the locked pool and device, then (the lock released)
    /// hands the evictions and prefetch fills it caused to the observers:
    /// with `Publish::Wait`, returns once they have dropped the evicted
    /// pages. Every change to the device or the pool goes through here, so
    /// none of them leaves a page mapped that the device evicted. `f` must
    /// not wait: the data path of every VM waits for it.
    pub fn transact<R>(
        &self,
        publish: Publish,
        f: impl FnOnce(&mut Pool, &mut Device) -> R,
    ) -> (R, Published) {
        self.transact_marked(publish, |pool, device, _| f(pool, device))
    }

    /// [`SharedDevice::transact`] with access sampling's marks at hand too.
    /// The pages the device evicted lose their marks (a deferred program is
    /// charged now) before the lock is released.
    fn transact_marked<R>(
        &self,
        publish: Publish,
        f: impl FnOnce(&mut Pool, &mut Device, &mut SampleMarks) -> R,
    ) -> (R, Published) {
        let (r, evicted, prefetched) = {
            let mut state = self.state();
            let Locked {
                device,
                pool,
                marks,
                ..
            } = &mut *state;
            let r = f(pool, device, marks);
            let evicted = device.drain_evictions();
            if let Err(e) = marks.settle(device, || self.clock.now_ns(), &evicted) {
                tracing::warn!(error = %e, "cannot charge a deferred write-back");
            }
            let prefetched = device.drain_prefetches();
            marks.filled(&prefetched);
            (r, evicted, prefetched)
        };
        let mut done = Published {
            evicted_pages: evicted.len() as u64,
            ..Published::default()
        };
        match publish {
            Publish::Hand => self.observers.evicted(evicted),
            Publish::Wait => done.dropped_pages = self.observers.evicted_wait(evicted),
        }
        self.observers.prefetched(prefetched);
        (r, done)
    }

    /// Drops device bytes `[addr, addr + len)` from the cache without
    /// writing them back (their data is gone); their sampling marks go too.
    fn discard(&self, addr: u64, len: u64) -> Result<u64, AccessError> {
        self.transact_marked(Publish::Hand, |_, dev, marks| {
            marks.forget(addr, len);
            dev.discard(addr, len)
        })
        .0
    }

    /// Arms device `pages` for access sampling (see `sampling`): the caller
    /// then drops them from their residency plane. Returns the pages newly
    /// armed.
    pub fn arm_sampled(&self, pages: &[u64]) -> Vec<u64> {
        let mut state = self.state();
        let Locked { device, marks, .. } = &mut *state;
        let resident: Vec<u64> = pages
            .iter()
            .copied()
            .filter(|p| device.is_resident(p * PAGE))
            .collect();
        marks.arm(&resident)
    }

    /// References seen after the fact (accessed bits): each group of
    /// device `pages` goes to [`Device::reference`] with `since_ns`, the
    /// start of the period they were read for, all in one transaction.
    /// With sampling on, a referenced page counts as heard of (it is not
    /// the one to arm next).
    pub fn reference(&self, since_ns: u64, groups: &[&[u64]]) -> Vec<References> {
        self.transact_marked(Publish::Hand, |_, dev, marks| {
            groups
                .iter()
                .map(|pages| {
                    marks.referenced(dev, pages);
                    dev.reference(since_ns, pages)
                })
                .collect()
        })
        .0
    }

    /// Starts keeping the order in which traps last reached each resident
    /// page (for [`SharedDevice::sampling_candidates`]); sampling only.
    pub fn track_recency(&self) {
        self.state().marks.track();
    }

    /// Up to `n` resident pages to arm: not armed, those whose last trap is
    /// oldest first.
    pub fn sampling_candidates(&self, n: usize) -> Vec<u64> {
        self.state().marks.oldest(n)
    }

    /// Adds `ns` of the sampler's time (arming pages) to its counters.
    pub fn record_sampling_time(&self, ns: u64) {
        self.state().marks.record_time(ns);
    }

    /// Charges the programs deferred by sampling for device bytes
    /// `[addr, addr + len)` now (a sync of them); returns the pages.
    pub fn write_back_deferred(&self, addr: u64, len: u64) -> Result<u64, AccessError> {
        let now = self.now_ns();
        self.transact_marked(Publish::Hand, |_, dev, marks| {
            marks.flush(dev, now, addr, len)
        })
        .0
    }

    /// Access sampling's counters.
    pub fn sampling_counts(&self) -> SamplingCounts {
        self.state().marks.counts()
    }

    /// Runs `f` on the locked pool and device, read-only (lookups, counters,
    /// the resident set). `f` must not wait.
    pub fn read<R>(&self, f: impl FnOnce(&Pool, &Device) -> R) -> R {
        let state = self.state();
        f(&state.pool, &state.device)
    }

    /// Runs `f` on the locked pool. Pool changes cause no device events,
    /// so there is nothing to drain or publish.
    fn with_pool<R>(&self, f: impl FnOnce(&mut Pool) -> R) -> R {
        f(&mut self.state().pool)
    }

    /// How long the device lock was waited for and held, since the start
    /// or [`SharedDevice::reset_lock_times`] (this call's own acquisition
    /// included).
    pub fn lock_times(&self) -> LockTimesSnapshot {
        self.state().times.snapshot()
    }

    /// Starts [`SharedDevice::lock_times`] over.
    pub fn reset_lock_times(&self) {
        self.state().times.reset();
    }

    /// Device counters.
    pub fn stats(&self) -> DeviceStats {
        self.read(|_, dev| dev.stats())
    }

    /// Subscribes `observer` to the device's events (see
    /// `DeviceObserver`); from now on the device logs its evictions and
    /// prefetch fills for it. Held weakly: an observer that goes away is
    /// dropped from the list.
    pub fn subscribe(&self, observer: Weak<dyn DeviceObserver>) {
        self.observers.add(observer);
        let mut state = self.state();
        state.device.log_evictions(true);
        state.device.log_prefetches(true);
    }

    /// Runs `f` on the locked device (with the ratio in force), puts the
    /// device activity it caused into the charge, then hands the evictions
    /// and prefetches it logged to the residency plane, outside the lock.
    fn charged(
        &self,
        now_ns: u64,
        f: impl FnOnce(
            &mut Pool,
            &mut Device,
            u8,
            &mut Charge,
            &mut SampleMarks,
        ) -> Result<(), AccessError>,
    ) -> Result<Charge, ChargeAccessError> {
        let mut charge = Charge {
            completes_at_ns: now_ns,
            ..Charge::default()
        };
        self.transact_marked(Publish::Hand, |pool, dev, marks| {
            let before = DeviceActivity::read(dev);
            f(pool, dev, self.placement.cxl_ratio(), &mut charge, marks)?;
            charge.activity = DeviceActivity::between(&before, &DeviceActivity::read(dev));
            Ok::<_, AccessError>(())
        })
        .0?;
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
        self.charged(now_ns, |pool, dev, ratio, charge, marks| {
            charge_pool_locked(pool, dev, marks, (ratio, now_ns, op), addr, len, charge)
        })
    }

    /// [`SharedDevice::charge_pool`] of a trap, and in the same transaction
    /// (one take of the lock) the owner of the extent it lies in: the host
    /// file the trap reads from (`None`: a free extent).
    pub fn charge_trap(
        &self,
        now_ns: u64,
        op: Op,
        addr: u64,
        len: u32,
    ) -> Result<(Charge, Option<ExtentOwner>), ChargeAccessError> {
        let mut owner = None;
        let charge = self.charged(now_ns, |pool, dev, ratio, charge, marks| {
            owner = pool.owner_of(addr / EXTENT_SIZE);
            charge_pool_locked(pool, dev, marks, (ratio, now_ns, op), addr, len, charge)
        })?;
        Ok((charge, owner))
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
        self.charged(now_ns, |_, dev, ratio, charge, marks| {
            marks.defer(addr, len, |addr, len| {
                by_tier(ratio, addr, len, charge, |from, to, charge| {
                    let done = dev.write_back(now_ns, from, to - from)?;
                    charge.completes_at_ns = charge.completes_at_ns.max(done);
                    Ok(())
                })
            })
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
        // Short of extents: reclaim idle files first (outside the lock),
        // then charge. Usually not short: one transaction.
        let want = len.div_ceil(EXTENT_SIZE) + 1;
        let mut short = false;
        let charge = self.charged(now_ns, |pool, dev, ratio, charge, _| {
            if pool.free_count() < want && pool.oldest_idle().is_some() {
                short = true;
                return Ok(());
            }
            charge_file_locked(pool, dev, ratio, now_ns, op, (key, offset, len), charge)
        })?;
        if !short {
            return Ok(charge);
        }
        self.make_room(want);
        self.charged(now_ns, |pool, dev, ratio, charge, _| {
            charge_file_locked(pool, dev, ratio, now_ns, op, (key, offset, len), charge)
        })
    }

    /// Drops the device-cache pages of file bytes `[offset, offset + len)`
    /// of `key` without writing them back (a hole was punched, a range
    /// zeroed or shifted, a tail truncated: the bytes are gone from the
    /// host file, so no NAND program of them is owed). Whole pages only: a
    /// page the range covers in part still holds live bytes. Only extents
    /// the file already owns are looked at: nothing is allocated for a
    /// range nobody touched, and pages of chunks that share an extent
    /// because the pool was full are left (they are other files' too).
    /// Pinned pages go as well (their data no longer exists). The
    /// residency plane is not told: the caller drops the plane's copies
    /// (the timing layer's coherence step). Returns the pages dropped.
    pub fn discard_file_range(&self, key: FileKey, offset: u64, len: u64) -> u64 {
        let first = offset.div_ceil(PAGE).saturating_mul(PAGE);
        let end = offset.saturating_add(len) / PAGE * PAGE;
        if first >= end {
            return 0;
        }
        let ranges: Vec<(u64, u64)> = self
            .read(|pool, _| pool.own_extents(key))
            .into_iter()
            .filter_map(|(chunk, extent)| {
                let lo = chunk.checked_mul(EXTENT_SIZE)?.max(first);
                let hi = chunk.saturating_add(1).saturating_mul(EXTENT_SIZE).min(end);
                (lo < hi).then(|| (extent * EXTENT_SIZE + lo % EXTENT_SIZE, hi - lo))
            })
            .collect();
        let mut dropped = 0;
        for (addr, n) in ranges {
            // One extent per lock: the data path waits for one at most.
            match self.discard(addr, n) {
                Ok(k) => dropped += k,
                Err(e) => tracing::warn!(error = %e, addr, len = n, "cannot discard file pages"),
            }
        }
        dropped
    }

    /// Takes one reference on a file (a VM session registered it).
    pub fn acquire_file(&self, key: FileKey) {
        self.with_pool(|pool| pool.acquire(key));
    }

    /// Drops one reference on a file (`deleted`: the host file has no links
    /// left). With the last one, a deleted file's extents go back to the
    /// pool at once; a file that still exists keeps them on the idle list
    /// (see `pool`), reclaimed when the pool runs short.
    pub fn release_file(&self, key: FileKey, deleted: bool) {
        if self.with_pool(|pool| pool.release(key, deleted)) == 0 && deleted {
            self.reclaim_where(key, 0, true);
        }
    }

    /// Reclaims idle files, oldest release first, until `want` extents are
    /// free (or no idle file is left; a file whose extents a window maps is
    /// passed over). At most `MAKE_ROOM_FILES` files per call. Never call
    /// it from a plane thread, nor holding a slot table, the pool or the
    /// device lock.
    pub fn make_room(&self, want: u64) {
        for _ in 0..MAKE_ROOM_FILES {
            let next = self.read(|pool, _| {
                (pool.free_count() < want)
                    .then(|| pool.oldest_idle())
                    .flatten()
            });
            let Some(key) = next else { return };
            if self.reclaim_where(key, 0, true) == 0 {
                self.with_pool(|pool| pool.requeue_idle(key));
            }
        }
    }

    /// Makes room for one DAX window slot, which must map an extent of its
    /// file's own: idle files first ([`SharedDevice::make_room`]), then the
    /// extents no window maps of files VMs still reference, the file with
    /// the most first (their dirty pages are written back to the files
    /// first; their next touch takes an extent again, or shares one). At
    /// most [`MAKE_ROOM_FILES`] files. Same rules as `make_room`.
    pub fn make_room_for_window(&self) {
        self.make_room(1);
        let mut tried = Vec::new();
        while tried.len() < MAKE_ROOM_FILES {
            let next = self.read(|pool, _| {
                (pool.free_count() == 0)
                    .then(|| pool.largest_referenced(&tried))
                    .flatten()
            });
            let Some(key) = next else { return };
            tried.push(key);
            let n = self.reclaim_where(key, 0, false);
            if n > 0 {
                tracing::debug!(
                    ?key,
                    extents = n,
                    "pool full: extents taken from a referenced file for a window slot"
                );
            }
        }
    }

    /// Reclaims the file's chunks from `from_chunk` on (the file was
    /// truncated to `from_chunk` chunks or fewer): their device pages are
    /// discarded unwritten (the bytes are gone from the host file), the
    /// observers drop them from the residency plane, then the extents
    /// return to the pool. Extents a DAX window maps stay with the file.
    /// Returns the extents reclaimed. Never call it from a plane thread,
    /// nor holding the pool or device lock.
    pub fn reclaim(&self, key: FileKey, from_chunk: u64) -> u64 {
        self.reclaim_where(key, from_chunk, false)
    }

    /// [`SharedDevice::reclaim`]; `unreferenced`: only if no VM holds a
    /// reference on the file (checked under the pool lock).
    fn reclaim_where(&self, key: FileKey, from_chunk: u64, unreferenced: bool) -> u64 {
        let mut freed = Vec::new();
        let mut gone = false;
        self.observers.with_mapped(&mut |mapped| {
            self.with_pool(|pool| {
                if unreferenced && pool.refs(key) > 0 {
                    return;
                }
                freed = pool.take(key, from_chunk, mapped);
                gone = !pool.knows(key);
            });
        });
        if freed.is_empty() {
            if gone {
                self.observers.released(key, &[], true);
            }
            return 0;
        }
        for &extent in &freed {
            // One extent per lock: the data path waits for one at most.
            if let Err(e) = self.discard(extent * EXTENT_SIZE, EXTENT_SIZE) {
                tracing::warn!(error = %e, extent, "cannot discard a reclaimed pool extent");
            }
        }
        self.observers.released(key, &freed, gone);
        self.with_pool(|pool| pool.free_extents(&freed));
        tracing::debug!(
            ?key,
            from_chunk,
            extents = freed.len(),
            "pool extents reclaimed"
        );
        freed.len() as u64
    }

    /// Reclaims every idle file that was deleted on the host (after a VM
    /// disconnected: extents its window kept are unmapped now). Returns the
    /// extents reclaimed.
    pub fn reclaim_deleted_idle(&self) -> u64 {
        let keys = self.with_pool(|pool| pool.idle_deleted());
        keys.into_iter()
            .map(|k| self.reclaim_where(k, 0, true))
            .sum()
    }

    /// Writes every dirty device page back; returns when that is durable.
    pub fn flush(&self) -> Result<u64, AccessError> {
        let now = self.now_ns();
        self.transact(Publish::Hand, |_, dev| dev.flush(now)).0
    }
}

#[cfg(test)]
mod tests {
    use super::placement;
    use super::*;
    use std::collections::BTreeSet;

    /// An observer that records what it was handed.
    #[derive(Default)]
    struct Recorder {
        evicted: Mutex<Vec<u64>>,
        waited: Mutex<u64>,
        prefetched: Mutex<BTreeSet<u64>>,
    }

    impl DeviceObserver for Recorder {
        fn evicted(&self, pages: Vec<u64>) {
            lock(&self.evicted).extend(pages);
        }
        fn evicted_wait(&self, pages: Vec<u64>) -> u64 {
            *lock(&self.waited) += pages.len() as u64;
            self.evicted(pages);
            0
        }
        fn prefetched(&self, pages: Vec<(u64, u64)>) {
            lock(&self.prefetched).extend(pages.into_iter().map(|(p, _)| p));
        }
        fn released(&self, _: FileKey, _: &[u64], _: bool) {}
        fn moved_to_cxl(&self, _: u8, _: u8) -> u64 {
            0
        }
    }

    /// Every way of changing the device publishes what it evicted: after
    /// each operation the observer was handed one page per eviction the
    /// device counted, among them every page resident before and gone
    /// after, and the device's own log is empty. An operation added without going
    /// through `transact` leaves pages in the log and fails here.
    #[test]
    fn every_operation_hands_its_evictions_to_the_observers() {
        let cfg = cxlfs_device_model::DeviceConfig::default()
            .with_overrides(&["cache.size_bytes=1MiB", "prefetch.degree=2"])
            .unwrap();
        let shared =
            SharedDevice::with_memory(Device::new(cfg).unwrap(), Placement::default(), EXTENT_SIZE)
                .unwrap();
        let rec = Arc::new(Recorder::default());
        let weak: Weak<dyn DeviceObserver> =
            Arc::downgrade(&(rec.clone() as Arc<dyn DeviceObserver>));
        shared.subscribe(weak);
        shared.with_pool(|p| p.acquire(K));
        let region = shared.memory_base();
        let resident = || -> BTreeSet<u64> {
            shared
                .read(|_, dev| dev.resident_page_list())
                .into_iter()
                .collect()
        };
        let mut t = 0;
        let mut step = |what: &str, op: &dyn Fn(u64)| {
            let (before, counted) = (resident(), shared.stats().evictions);
            lock(&rec.evicted).clear();
            op(t);
            t += 1_000_000;
            let evictions = shared.stats().evictions - counted;
            assert!(
                evictions > 0,
                "{what}: evicted nothing (the test is too weak)"
            );
            let handed = lock(&rec.evicted).clone();
            assert_eq!(
                handed.len() as u64,
                evictions,
                "{what}: evictions not handed over"
            );
            let handed: BTreeSet<u64> = handed.into_iter().collect();
            let after = resident();
            assert!(
                before.difference(&after).all(|p| handed.contains(p)),
                "{what}: a page left the cache unannounced"
            );
            let undrained = shared.state().device.drain_evictions();
            assert!(
                undrained.is_empty(),
                "{what}: {} pages left in the log",
                undrained.len()
            );
        };
        // Each step goes through more than the 256-page cache.
        step("charge", &|t| {
            shared.charge(t, Op::Read, K, 0, 2 * EXTENT_SIZE).unwrap();
        });
        step("charge_pool", &|t| {
            for a in (0..2 * EXTENT_SIZE).step_by(PAGE as usize) {
                shared
                    .charge_pool(t, Op::Write, a + EXTENT_SIZE, PAGE as u32)
                    .unwrap();
            }
        });
        step("charge_memory", &|t| {
            for a in (0..EXTENT_SIZE / 2).step_by(PAGE as usize) {
                shared
                    .charge_memory(t, Op::Write, region + a, PAGE as u32)
                    .unwrap();
            }
        });
        step("transact: evict", &|t| {
            let (o, done) =
                shared.transact(Publish::Wait, |_, dev| dev.evict(t, 0, region).unwrap());
            assert_eq!(done.evicted_pages, o.evicted);
        });
        assert!(*lock(&rec.waited) > 0, "evict waited for nobody");
        step("transact: pin", &|t| {
            shared.transact(Publish::Hand, |_, dev| dev.pin(t, 0, 128 * PAGE).unwrap());
            shared.transact(Publish::Hand, |_, dev| {
                dev.prefetch(t, 2 * EXTENT_SIZE, 200 * PAGE).unwrap()
            });
        });
        assert!(
            !lock(&rec.prefetched).is_empty(),
            "no prefetch fill handed over"
        );
    }

    #[test]
    #[should_panic(expected = "a device transaction started inside another one")]
    fn a_transaction_inside_another_panics_instead_of_deadlocking() {
        let shared = SharedDevice::new(Device::new(Default::default()).unwrap());
        shared.read(|_, _| shared.stats());
    }

    const K: FileKey = FileKey { dev: 1, ino: 2 };

    #[test]
    fn deleting_a_file_discards_its_device_pages_and_idle_files_keep_theirs() {
        let cfg = cxlfs_device_model::DeviceConfig::default()
            .with_overrides(&["cache.size_bytes=16MiB"])
            .unwrap();
        let shared = SharedDevice::new(Device::new(cfg).unwrap());
        // Two sessions know the file.
        shared.with_pool(|p| p.acquire(K));
        shared.with_pool(|p| p.acquire(K));
        let first = shared.charge(0, Op::Read, K, 0, 8192).unwrap();
        assert_eq!(first.page_misses, 2);
        shared.release_file(K, false);
        let again = shared
            .charge(first.completes_at_ns, Op::Read, K, 0, 8192)
            .unwrap();
        assert_eq!(
            again.page_hits, 2,
            "a file another session knows keeps its cached pages"
        );
        shared.release_file(K, false);
        assert_eq!(
            shared.with_pool(|p| p.allocated_extents()),
            1,
            "an existing file stays idle with its extent"
        );
        shared.with_pool(|p| p.acquire(K));
        let third = shared
            .charge(again.completes_at_ns, Op::Read, K, 0, 8192)
            .unwrap();
        assert_eq!(third.page_hits, 2, "a reopen finds its cached pages");
        shared.release_file(K, true);
        assert_eq!(
            shared.with_pool(|p| p.allocated_extents()),
            0,
            "deleted: reclaimed"
        );
        assert_eq!(shared.stats().resident_pages, 0);
        let other = FileKey { dev: 1, ino: 9 };
        shared.with_pool(|p| p.acquire(other));
        let fresh = shared
            .charge(again.completes_at_ns, Op::Read, other, 0, 8192)
            .unwrap();
        assert_eq!(
            fresh.page_misses, 2,
            "a new file must not hit a deleted file's pages"
        );
    }

    #[test]
    fn truncation_reclaims_the_chunks_past_the_end() {
        let shared = device_with(100, &[]);
        shared.with_pool(|p| p.acquire(K));
        shared.charge(0, Op::Write, K, 0, 5 * EXTENT_SIZE).unwrap();
        assert_eq!(shared.with_pool(|p| p.allocated_extents()), 5);
        assert_eq!(shared.reclaim(K, 2), 3);
        assert_eq!(shared.with_pool(|p| p.allocated_extents()), 2);
        assert!(shared.with_pool(|p| p.extent_of(K, 1)).is_some());
        assert!(shared.with_pool(|p| p.extent_of(K, 2)).is_none());
        shared.release_file(K, true);
        assert_eq!(shared.with_pool(|p| p.allocated_extents()), 0);
        assert_eq!(shared.stats().resident_pages, 0);
    }

    #[test]
    fn a_short_pool_reclaims_idle_files_before_aliasing() {
        // A small device: one 64 MiB LUN (a pool of ~30 extents).
        let cfg = cxlfs_device_model::DeviceConfig::default()
            .with_overrides(&[
                "cache.size_bytes=1MiB",
                "nand.channels=1",
                "nand.luns_per_channel=1",
                "nand.planes_per_lun=1",
                "nand.blocks_per_plane=64",
                "nand.pages_per_block=256",
            ])
            .unwrap();
        let shared = SharedDevice::new(Device::new(cfg).unwrap());
        let cap = shared.with_pool(|p| p.capacity_extents());
        // Idle files (released, not deleted) hold every extent.
        for ino in 0..cap {
            let k = FileKey {
                dev: 1,
                ino: 100 + ino,
            };
            shared.with_pool(|p| p.acquire(k));
            shared.charge(0, Op::Read, k, 0, 4096).unwrap();
            shared.release_file(k, false);
        }
        // Each new file found the pool short and reclaimed the oldest idle
        // one: nothing shared an extent.
        let (free, aliased) = shared.read(|p, _| (p.free_count(), p.aliased_chunks()));
        assert_eq!((free, aliased), (1, 0));
        // A referenced file gets extents of its own: idle ones are reclaimed.
        shared.with_pool(|p| p.acquire(K));
        shared.charge(0, Op::Read, K, 0, 3 * EXTENT_SIZE).unwrap();
        assert_eq!(shared.with_pool(|p| p.aliased_chunks()), 0);
        assert_eq!(
            shared.with_pool(|p| p.oldest_idle()),
            Some(FileKey {
                dev: 1,
                ino: 100 + 4
            }),
            "the oldest idle files went first"
        );
    }

    #[test]
    fn discarding_a_file_range_drops_whole_pages_of_owned_extents_and_allocates_nothing() {
        let shared = device_with(100, &[]);
        shared.with_pool(|p| p.acquire(K));
        // Chunks 0 and 2 are touched, chunk 1 is not.
        let c = shared.charge(0, Op::Write, K, 0, 8 * PAGE).unwrap();
        shared
            .charge(c.completes_at_ns, Op::Write, K, 2 * EXTENT_SIZE, 4 * PAGE)
            .unwrap();
        assert_eq!(shared.stats().resident_pages, 12);
        // Bytes 100..(3 pages + 5): only pages 1 and 2 are wholly inside.
        assert_eq!(shared.discard_file_range(K, 100, 3 * PAGE - 95), 2);
        let base = shared.with_pool(|p| p.extent_of(K, 0)).unwrap() * EXTENT_SIZE;
        shared.read(|_, dev| {
            assert!(dev.is_resident(base) && dev.is_resident(base + 3 * PAGE));
            assert!(!dev.is_resident(base + PAGE) && !dev.is_resident(base + 2 * PAGE));
        });
        // From page 6 to the end of everything: chunk 0's pages 6, 7 and
        // chunk 2's four; chunk 1 (and beyond) gets no extent.
        assert_eq!(shared.discard_file_range(K, 6 * PAGE, u64::MAX), 6);
        assert_eq!(shared.with_pool(|p| p.allocated_extents()), 2);
        assert!(shared.with_pool(|p| p.extent_of(K, 1)).is_none());
        let st = shared.stats();
        assert_eq!((st.discarded, st.resident_pages), (8, 4));
        assert_eq!(st.nand.host_programs, 0, "nothing written back");
        // Inside one page, an unknown file, an empty range: nothing.
        assert_eq!(shared.discard_file_range(K, 1, 100), 0);
        assert_eq!(
            shared.discard_file_range(FileKey { dev: 9, ino: 9 }, 0, u64::MAX),
            0
        );
        assert_eq!(shared.discard_file_range(K, u64::MAX, u64::MAX), 0);
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
        shared.with_pool(|p| p.acquire(K));
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
            shared.with_pool(|p| p.acquire(K));
            let pages = 1000;
            let c = shared.charge(0, Op::Read, K, 0, pages * PAGE).unwrap();
            let base = shared.with_pool(|p| p.extent_of(K, 0)).unwrap() * EXTENT_SIZE / PAGE;
            let want_cxl = (base..base + pages)
                .filter(|&p| placement::tier_at(ratio, p) == Tier::Cxl)
                .count() as u64;
            assert_eq!(c.page_misses + c.page_hits, want_cxl, "ratio {ratio}");
            assert_eq!(c.dram_pages, pages - want_cxl);
            assert!(want_cxl.abs_diff(pages * u64::from(ratio) / 100) <= 3);
            for p in shared.read(|_, dev| dev.resident_page_list()) {
                assert_eq!(
                    placement::tier_at(ratio, p),
                    Tier::Cxl,
                    "page {p} at {ratio}"
                );
            }
            assert_eq!(shared.placed_pages(), (pages - want_cxl, want_cxl));
        }
    }

    #[test]
    fn changing_the_ratio_moves_pages_between_tiers() {
        let shared = device_with(100, &[]);
        shared.with_pool(|p| p.acquire(K));
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
}
