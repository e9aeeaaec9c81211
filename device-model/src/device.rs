//! The device: the DRAM cache, the prefetcher and the NAND back end put
//! together behind `access(now, op, addr, len) -> Outcome`.
//!
//! Timing of one page (all times in ns, `now` = arrival at the device):
//! * hit: `max(now, ready_at) + hit_latency` (a page whose fill is still in
//!   flight makes the access wait for that fill: MSHR coalescing);
//! * miss: `nand.read(now) + hit_latency` (fill the frame, then serve it);
//! * write miss covering the whole page: allocated without a fill;
//! * a dirty victim is written back with `nand.program(now)`: the access does
//!   not wait for it, but it occupies the LUN and channel it lands on.
//!
//! The access completes when its last page does, plus the CXL link latency.
//!
//! With the write log on (`cache.write_log_bytes > 0`, see
//! [`crate::write_log`]) writes go to the log instead of the page cache, and
//! reads of logged lines are served from it; the page cache is the rest of
//! the DRAM.

use crate::cache::{Cache, Evicted, Insert, SlotId};
use crate::config::{DeviceConfig, LoadConfigError, PolicyKind};
use crate::nand::{Nand, NandOpError, NandStats};
use crate::write_log::{line_mask, CleanCost, WriteLog};
use crate::{PAGE_SHIFT, PAGE_SIZE};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Says whether a device page holds no host data (the host placed that
/// page elsewhere, e.g. in a DRAM tier): the prefetcher skips such pages.
/// Must be deterministic for the model to stay so.
#[derive(Clone)]
pub struct PageFilter(pub Arc<dyn Fn(u64) -> bool + Send + Sync>);

impl fmt::Debug for PageFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PageFilter(..)")
    }
}

/// Load or store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Op {
    /// Load.
    #[default]
    Read,
    /// Store.
    Write,
}

impl Op {
    /// `R` or `W`, as in trace files.
    pub fn letter(self) -> char {
        match self {
            Op::Read => 'R',
            Op::Write => 'W',
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.letter())
    }
}

impl FromStr for Op {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "R" | "r" | "read" | "READ" => Ok(Op::Read),
            "W" | "w" | "write" | "WRITE" => Ok(Op::Write),
            other => Err(format!("op must be R or W, got `{other}`")),
        }
    }
}

/// Why an access or a cache-control command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The range reaches past the device's logical capacity.
    #[error("address range {addr:#x}+{len} is beyond the device capacity of {capacity} bytes")]
    OutOfRange {
        /// First byte.
        addr: u64,
        /// Length in bytes.
        len: u64,
        /// Device capacity in bytes.
        capacity: u64,
    },
    /// A zero-length access.
    #[error("zero-length access at {addr:#x}")]
    Empty {
        /// The address given.
        addr: u64,
    },
    /// Pinning needs a way that is not pinned yet.
    #[error("cannot pin page {page}: every way of its cache set is already pinned")]
    SetFullyPinned {
        /// Device page number.
        page: u64,
    },
    /// The NAND back end failed.
    #[error(transparent)]
    Nand(#[from] NandOpError),
}

/// What one access did and when it completes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// When the data is back at the host.
    pub completes_at_ns: u64,
    /// `completes_at_ns - now`.
    pub latency_ns: u64,
    /// Every page touched was resident and ready: served at DRAM-cache speed.
    pub hit: bool,
    /// Pages touched.
    pub pages: u32,
    /// Of which hits.
    pub page_hits: u32,
    /// Of which misses (including coalesced and bypassed ones).
    pub page_misses: u32,
    /// Misses that joined a fill already in flight (MSHR).
    pub coalesced: u32,
    /// Misses served around the cache because their set is fully pinned.
    pub bypassed: u32,
    /// NAND page reads this access caused (fills and prefetches).
    pub nand_reads: u32,
    /// NAND page programs this access caused (write-backs of victims,
    /// bypassed writes, write-log cleaning it started).
    pub nand_programs: u32,
    /// Pages served by the write log (writes appended, reads of logged lines).
    pub log_pages: u32,
}

/// What [`Device::reference`] did with the pages it was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct References {
    /// Resident pages told to the policy as hits.
    pub referenced: u64,
    /// Pages not resident (evicted since the access): skipped.
    pub absent: u64,
    /// Pages filled after the period began (their miss was the access): skipped.
    pub fresh: u64,
}

/// Result of a range command (`prefetch`, `pin`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RangeOutcome {
    /// When the last page of the range is resident.
    pub completes_at_ns: u64,
    /// Pages in the range.
    pub pages: u64,
    /// Pages that had to be read from NAND.
    pub filled: u64,
}

/// Result of [`Device::evict`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EvictOutcome {
    /// When the last write-back is durable (`now` if there was none).
    pub completes_at_ns: u64,
    /// Pages dropped from the cache.
    pub evicted: u64,
    /// Of which dirty ones written back.
    pub written_back: u64,
    /// Pinned pages left in place.
    pub skipped_pinned: u64,
}

/// Counters since creation or the last [`Device::reset_stats`], plus gauges.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeviceStats {
    /// `access` calls.
    pub accesses: u64,
    /// Of which reads.
    pub reads: u64,
    /// Of which writes.
    pub writes: u64,
    /// Bytes read by the host.
    pub bytes_read: u64,
    /// Bytes written by the host.
    pub bytes_written: u64,
    /// Page lookups (an access spanning three pages counts three).
    pub page_accesses: u64,
    /// Page lookups served from a ready cache frame.
    pub hits: u64,
    /// Page lookups that were not (includes coalesced and bypassed).
    pub misses: u64,
    /// Misses that joined an in-flight fill.
    pub coalesced: u64,
    /// Misses that bypassed a fully pinned set.
    pub bypasses: u64,
    /// References ([`Device::reference`]): accesses seen after the fact,
    /// told to the policy as hits, not counted in `page_accesses`.
    pub references: u64,
    /// Pages evicted by the policy or explicitly.
    pub evictions: u64,
    /// Of which dirty (written back).
    pub writebacks: u64,
    /// Pages dropped without write-back by [`Device::discard`].
    pub discarded: u64,
    /// Pages brought in by the prefetcher or a `prefetch` command.
    pub prefetch_issued: u64,
    /// Prefetched pages later touched by a demand access.
    pub prefetch_used: u64,
    /// Prefetched pages evicted untouched.
    pub prefetch_wasted: u64,
    /// Gauge: resident pages.
    pub resident_pages: u64,
    /// Gauge: pinned pages.
    pub pinned_pages: u64,
    /// Gauge: dirty pages.
    pub dirty_pages: u64,
    /// Gauge: the eviction policy in force.
    pub policy: String,
    /// 64-byte lines written into the write log (0 with the log off).
    pub log_writes: u64,
    /// Read page lookups served from the write log.
    pub log_hits: u64,
    /// Log lines that merged: into a line already logged, or into a page
    /// cleaned in one program with them.
    pub log_coalesced: u64,
    /// Write-log cleaning passes.
    pub log_cleanings: u64,
    /// NAND programs issued by write-log cleaning.
    pub log_programs: u64,
    /// Page writes that waited for room in the log.
    pub log_stalls: u64,
    /// Their waits, summed, in ns.
    pub log_stall_ns: u64,
    /// Gauge: lines in the log (not yet cleaned).
    pub log_entries: u64,
    /// All NAND page programs (host and GC; the same as `nand.programs`).
    pub nand_programs: u64,
    /// NAND counters.
    #[serde(serialize_with = "serialize_nand_stats")]
    pub nand: NandStats,
}

impl DeviceStats {
    /// hits / page lookups (0 when there were none).
    pub fn hit_rate(&self) -> f64 {
        if self.page_accesses == 0 {
            0.0
        } else {
            self.hits as f64 / self.page_accesses as f64
        }
    }
}

fn serialize_nand_stats<S: serde::Serializer>(n: &NandStats, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut st = s.serialize_struct("NandStats", 9)?;
    st.serialize_field("reads", &n.reads())?;
    st.serialize_field("programs", &n.programs())?;
    st.serialize_field("erases", &n.erases)?;
    st.serialize_field("gc_runs", &n.gc_runs)?;
    st.serialize_field("gc_foreground_runs", &n.gc_foreground_runs)?;
    st.serialize_field("gc_page_copies", &n.gc_page_copies)?;
    st.serialize_field("host_reads", &n.host_reads)?;
    st.serialize_field("host_programs", &n.host_programs)?;
    st.serialize_field("write_amplification", &n.write_amplification())?;
    st.end()
}

/// The emulated CXL-SSD.
#[derive(Debug)]
pub struct Device {
    cfg: DeviceConfig,
    cache: Cache,
    nand: Nand,
    capacity_pages: u64,
    stats: DeviceStats,
    /// Pages that left the cache (policy victims and explicit evictions),
    /// kept only while a caller asked for them ([`Device::log_evictions`]).
    eviction_log: Option<Vec<u64>>,
    /// Pages the prefetcher filled and when each is ready, kept only while
    /// a caller asked for them ([`Device::log_prefetches`]).
    prefetch_log: Option<Vec<(u64, u64)>>,
    /// Pages the prefetcher must not fetch ([`Device::set_prefetch_skip`]).
    prefetch_skip: Option<PageFilter>,
    /// The write log, when `cache.write_log_bytes > 0`.
    log: Option<WriteLog>,
}

impl Device {
    /// A device with an empty cache and erased NAND.
    pub fn new(cfg: DeviceConfig) -> Result<Self, LoadConfigError> {
        cfg.validate()?;
        let capacity_pages = cfg.nand.logical_pages();
        Ok(Device {
            cache: Cache::new(&cfg.cache.page_cache(), capacity_pages),
            log: WriteLog::new(&cfg.cache),
            nand: Nand::new(&cfg.nand),
            capacity_pages,
            stats: DeviceStats::default(),
            eviction_log: None,
            prefetch_log: None,
            prefetch_skip: None,
            cfg,
        })
    }

    /// The configuration in force (reflects `set_policy` / `set_prefetch`).
    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }

    /// Addressable bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_pages * PAGE_SIZE
    }

    fn page_range(&self, addr: u64, len: u64) -> Result<(u64, u64), AccessError> {
        if len == 0 {
            return Err(AccessError::Empty { addr });
        }
        let capacity = self.capacity_bytes();
        match addr.checked_add(len) {
            Some(end) if end <= capacity => Ok((addr >> PAGE_SHIFT, (end - 1) >> PAGE_SHIFT)),
            _ => Err(AccessError::OutOfRange {
                addr,
                len,
                capacity,
            }),
        }
    }

    /// A hint that `addr` will be accessed soon (see [`Cache::prefetch_lookup`]);
    /// changes nothing the model reports.
    #[inline]
    pub fn hint_upcoming(&self, addr: u64) {
        self.cache.prefetch_lookup(addr >> PAGE_SHIFT);
    }

    /// A second hint, a few accesses after [`Device::hint_upcoming`] for the
    /// same address: loads the resident page's cache metadata.
    #[inline]
    pub fn hint_imminent(&self, addr: u64) {
        self.cache.prefetch_slot_of(addr >> PAGE_SHIFT);
    }

    /// A third hint, a few accesses after [`Device::hint_imminent`]: loads
    /// what a hit will relink (see [`Cache::prefetch_neighbours_of`]).
    #[inline]
    pub fn hint_neighbours(&self, addr: u64) {
        self.cache.prefetch_neighbours_of(addr >> PAGE_SHIFT);
    }

    /// One host access arriving at `now_ns`.
    pub fn access(
        &mut self,
        now_ns: u64,
        op: Op,
        addr: u64,
        len: u32,
    ) -> Result<Outcome, AccessError> {
        let (first, last) = self.page_range(addr, u64::from(len))?;
        let mut out = Outcome {
            hit: true,
            ..Outcome::default()
        };
        let mut done_max = now_ns;
        for page in first..=last {
            // A write covering the whole page needs no fill.
            let whole_page = op == Op::Write
                && addr <= page << PAGE_SHIFT
                && addr + u64::from(len) >= (page + 1) << PAGE_SHIFT;
            let done = if self.log.is_some() {
                let mask = line_mask(page << PAGE_SHIFT, addr, u64::from(len));
                self.access_page_logged(now_ns, op, page, mask, &mut out)?
            } else {
                self.access_page(now_ns, op, page, whole_page, &mut out)?
            };
            done_max = done_max.max(done);
            out.pages += 1;
        }
        out.hit = out.page_misses == 0;
        out.completes_at_ns = done_max + self.cfg.link.latency_ns;
        out.latency_ns = out.completes_at_ns - now_ns;

        let s = &mut self.stats;
        s.accesses += 1;
        match op {
            Op::Read => {
                s.reads += 1;
                s.bytes_read += u64::from(len);
            }
            Op::Write => {
                s.writes += 1;
                s.bytes_written += u64::from(len);
            }
        }
        s.page_accesses += u64::from(out.pages);
        s.hits += u64::from(out.page_hits);
        s.misses += u64::from(out.page_misses);
        s.coalesced += u64::from(out.coalesced);
        s.bypasses += u64::from(out.bypassed);
        Ok(out)
    }

    /// Serves one page of an access, counting it in `out`; returns when the page is served.
    ///
    /// Always inlined: since the write log's path calls it too (a second
    /// call site), the compiler kept it out of line, and a replay paid a
    /// call and its spills on every page (S3-FIFO zipf 10 M: 0.90x).
    #[inline(always)]
    fn access_page(
        &mut self,
        now: u64,
        op: Op,
        page: u64,
        whole_page: bool,
        out: &mut Outcome,
    ) -> Result<u64, AccessError> {
        let hit_latency = self.cfg.cache.hit_latency_ns;
        if let Some(slot) = self.cache.lookup(page) {
            let state = self.cache.state(slot);
            if self.cfg.cache.hits_visible {
                self.cache.record_hit(slot);
            }
            if state.prefetched_unused {
                self.cache.mark_used(slot);
                self.stats.prefetch_used += 1;
            }
            if op == Op::Write && !state.dirty {
                self.cache.set_dirty(slot, true);
            }
            if state.ready_at_ns > now {
                out.page_misses += 1;
                out.coalesced += 1;
            } else {
                out.page_hits += 1;
            }
            return Ok(now.max(state.ready_at_ns) + hit_latency);
        }

        // Miss: fill (unless a whole-page write), allocate, prefetch ahead.
        let ready = if whole_page {
            now
        } else {
            out.nand_reads += 1;
            self.nand.read(now, page)
        };
        match self.cache.insert(page, ready, op == Op::Write, false) {
            Insert::Placed { evicted, .. } => {
                if let Some(victim) = evicted {
                    self.retire(now, victim, out)?;
                }
            }
            Insert::SetFullyPinned => {
                let done = match op {
                    Op::Read => ready,
                    Op::Write => {
                        out.nand_programs += 1;
                        self.nand.program(now, page)?
                    }
                };
                out.page_misses += 1;
                out.bypassed += 1;
                return Ok(done + hit_latency);
            }
        }
        out.page_misses += 1;
        self.prefetch_after_miss(now, page, out)?;
        Ok(ready + hit_latency)
    }

    /// Serves one page of an access with the write log on: a write goes to
    /// the log, a read of lines all logged is served from it, any other
    /// read goes to the page cache. Returns when the page is served.
    /// Kept out of line: the log's path should not crowd the common one.
    #[inline(never)]
    fn access_page_logged(
        &mut self,
        now: u64,
        op: Op,
        page: u64,
        mask: u64,
        out: &mut Outcome,
    ) -> Result<u64, AccessError> {
        let hit_latency = self.cfg.cache.hit_latency_ns;
        let Some(log) = self.log.as_mut() else {
            return self.access_page(now, op, page, false, out);
        };
        match op {
            Op::Read if log.read_hit(page, mask) => {
                out.page_hits += 1;
                out.log_pages += 1;
                Ok(now + hit_latency)
            }
            Op::Read => self.access_page(now, op, page, false, out),
            Op::Write => {
                let (at, cost) = log.write(now, page, mask, &mut self.cache, &mut self.nand)?;
                add_cost(out, cost);
                out.page_hits += 1;
                out.log_pages += 1;
                // A resident page is updated in place (and stays clean).
                if let Some(slot) = self.cache.lookup(page) {
                    if self.cfg.cache.hits_visible {
                        self.cache.record_hit(slot);
                    }
                    if self.cache.state(slot).prefetched_unused {
                        self.cache.mark_used(slot);
                        self.stats.prefetch_used += 1;
                    }
                }
                Ok(at + hit_latency)
            }
        }
    }

    /// Next-N prefetch with a stride, issued on a demand miss (as in Cylon);
    /// every prefetched page costs a NAND read.
    fn prefetch_after_miss(
        &mut self,
        now: u64,
        page: u64,
        out: &mut Outcome,
    ) -> Result<(), AccessError> {
        let degree = u64::from(self.cfg.prefetch.degree);
        let stride = u64::from(self.cfg.prefetch.stride_pages);
        for k in 1..=degree {
            let target = page + k * stride;
            if target >= self.capacity_pages {
                break;
            }
            if self.cache.lookup(target).is_some() {
                continue;
            }
            if self.prefetch_skip.as_ref().is_some_and(|f| (f.0)(target)) {
                continue;
            }
            match self.fill_prefetch(now, target, out)? {
                Some((_, ready)) => {
                    if let Some(log) = self.prefetch_log.as_mut() {
                        log.push((target, ready));
                    }
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Reads `page` from NAND into the cache as a prefetch; `None` if its set is fully pinned.
    fn fill_prefetch(
        &mut self,
        now: u64,
        page: u64,
        out: &mut Outcome,
    ) -> Result<Option<(SlotId, u64)>, AccessError> {
        let ready = self.nand.read(now, page);
        out.nand_reads += 1;
        match self.cache.insert(page, ready, false, true) {
            Insert::Placed { slot, evicted } => {
                self.stats.prefetch_issued += 1;
                if let Some(victim) = evicted {
                    self.retire(now, victim, out)?;
                }
                Ok(Some((slot, ready)))
            }
            Insert::SetFullyPinned => Ok(None),
        }
    }

    /// Accounts for a page leaving the cache; writes it back if dirty.
    fn retire(&mut self, now: u64, victim: Evicted, out: &mut Outcome) -> Result<u64, AccessError> {
        self.stats.evictions += 1;
        if let Some(log) = self.eviction_log.as_mut() {
            log.push(victim.page);
        }
        if victim.prefetched_unused {
            self.stats.prefetch_wasted += 1;
        }
        if victim.dirty {
            self.stats.writebacks += 1;
            out.nand_programs += 1;
            return Ok(self.nand.program(now, victim.page)?);
        }
        Ok(now)
    }

    /// References to `pages` (device page numbers) seen after the fact, by
    /// a source that notices accesses without trapping them (accessed
    /// bits, read once per `since_ns`..now period): each resident page is
    /// told to the policy as a hit, with no latency and no NAND work. A
    /// page not resident is skipped (the device evicted it since: a
    /// reference never brings a page back), and so is one filled after
    /// `since_ns` (its miss is this period's access already: the policy
    /// must not hear it twice; a prefetched page not used yet is no such
    /// page). Returns what became of them.
    pub fn reference(&mut self, since_ns: u64, pages: &[u64]) -> References {
        let mut r = References::default();
        for &page in pages {
            let Some(slot) = self.cache.lookup(page) else {
                r.absent += 1;
                continue;
            };
            let state = self.cache.state(slot);
            // A prefetch fill is no access: its page's first use is one.
            if state.ready_at_ns > since_ns && !state.prefetched_unused {
                r.fresh += 1;
                continue;
            }
            self.cache.record_hit(slot);
            if state.prefetched_unused {
                self.cache.mark_used(slot);
                self.stats.prefetch_used += 1;
            }
            r.referenced += 1;
        }
        self.stats.references += r.referenced;
        r
    }

    /// Brings a range into the cache ahead of use (the `prefetch` command).
    pub fn prefetch(
        &mut self,
        now_ns: u64,
        addr: u64,
        len: u64,
    ) -> Result<RangeOutcome, AccessError> {
        let (first, last) = self.page_range(addr, len)?;
        let mut result = RangeOutcome {
            completes_at_ns: now_ns,
            pages: last - first + 1,
            filled: 0,
        };
        let mut scratch = Outcome::default();
        for page in first..=last {
            match self.cache.lookup(page) {
                Some(slot) => {
                    let ready = self.cache.state(slot).ready_at_ns;
                    result.completes_at_ns = result.completes_at_ns.max(ready);
                }
                None => {
                    if let Some((_, ready)) = self.fill_prefetch(now_ns, page, &mut scratch)? {
                        result.filled += 1;
                        result.completes_at_ns = result.completes_at_ns.max(ready);
                    }
                }
            }
        }
        Ok(result)
    }

    /// Makes a range resident and keeps it so until [`Device::unpin`].
    pub fn pin(&mut self, now_ns: u64, addr: u64, len: u64) -> Result<RangeOutcome, AccessError> {
        let (first, last) = self.page_range(addr, len)?;
        let mut result = RangeOutcome {
            completes_at_ns: now_ns,
            pages: last - first + 1,
            filled: 0,
        };
        let mut scratch = Outcome::default();
        for page in first..=last {
            let slot = match self.cache.lookup(page) {
                Some(slot) => slot,
                None => {
                    let ready = self.nand.read(now_ns, page);
                    result.filled += 1;
                    match self.cache.insert(page, ready, false, false) {
                        Insert::Placed { slot, evicted } => {
                            if let Some(victim) = evicted {
                                self.retire(now_ns, victim, &mut scratch)?;
                            }
                            slot
                        }
                        Insert::SetFullyPinned => return Err(AccessError::SetFullyPinned { page }),
                    }
                }
            };
            let state = self.cache.state(slot);
            result.completes_at_ns = result.completes_at_ns.max(state.ready_at_ns);
            if !state.pinned {
                self.cache.pin(slot);
            }
        }
        Ok(result)
    }

    /// Releases pins on a range; returns how many pages were pinned.
    pub fn unpin(&mut self, addr: u64, len: u64) -> Result<u64, AccessError> {
        let (first, last) = self.page_range(addr, len)?;
        let mut released = 0;
        for page in first..=last {
            if let Some(slot) = self.cache.lookup(page) {
                if self.cache.state(slot).pinned {
                    self.cache.unpin(slot);
                    released += 1;
                }
            }
        }
        Ok(released)
    }

    /// Drops a range from the cache, writing dirty pages back; pinned pages stay.
    pub fn evict(&mut self, now_ns: u64, addr: u64, len: u64) -> Result<EvictOutcome, AccessError> {
        let (first, last) = self.page_range(addr, len)?;
        let mut result = EvictOutcome {
            completes_at_ns: now_ns,
            ..EvictOutcome::default()
        };
        let mut scratch = Outcome::default();
        for page in first..=last {
            let Some(slot) = self.cache.lookup(page) else {
                continue;
            };
            if self.cache.state(slot).pinned {
                result.skipped_pinned += 1;
                continue;
            }
            if let Some(victim) = self.cache.remove(page) {
                result.evicted += 1;
                if victim.dirty {
                    result.written_back += 1;
                }
                let done = self.retire(now_ns, victim, &mut scratch)?;
                result.completes_at_ns = result.completes_at_ns.max(done);
            }
        }
        Ok(result)
    }

    /// Drops a range from the cache without writing anything back, pinned
    /// pages included: its data no longer exists (a deleted file, a TRIM).
    /// Returns the pages dropped.
    pub fn discard(&mut self, addr: u64, len: u64) -> Result<u64, AccessError> {
        let (first, last) = self.page_range(addr, len)?;
        if let Some(log) = self.log.as_mut() {
            for page in first..=last {
                log.discard(page);
            }
        }
        let dropped = (first..=last)
            .filter(|&page| self.cache.remove(page).is_some())
            .count() as u64;
        self.stats.discarded += dropped;
        Ok(dropped)
    }

    /// Writes every dirty page back (pages stay resident, now clean); returns
    /// when the last program is durable.
    pub fn flush(&mut self, now_ns: u64) -> Result<u64, AccessError> {
        let mut done = now_ns;
        if let Some(log) = self.log.as_mut() {
            done = log.clean_all(now_ns, &mut self.cache, &mut self.nand)?;
        }
        for slot in self.cache.dirty_slots() {
            let page = self.cache.state(slot).page;
            done = done.max(self.nand.program(now_ns, page)?);
            self.cache.set_dirty(slot, false);
            self.stats.writebacks += 1;
        }
        Ok(done)
    }

    /// Programs `[addr, addr + len)` to NAND the way a dirty page leaving
    /// the cache is: no lookup, no fill, no hit or miss. For data the model
    /// never saw being written (stores through a DAX window reach resident
    /// pages without an access: hits are invisible) and that is now being
    /// written back. A page still resident is left clean. Returns when the
    /// last program completes.
    ///
    /// With the write log on, the pages go into the log instead (64 lines
    /// each; cleaning programs them later) and the result is when the last
    /// one is logged.
    pub fn write_back(&mut self, now_ns: u64, addr: u64, len: u64) -> Result<u64, AccessError> {
        let (first, last) = self.page_range(addr, len)?;
        let mut done = now_ns;
        if let Some(log) = self.log.as_mut() {
            for page in first..=last {
                let (at, _) = log.write(now_ns, page, u64::MAX, &mut self.cache, &mut self.nand)?;
                done = done.max(at);
            }
            return Ok(done);
        }
        for page in first..=last {
            done = done.max(self.nand.program(now_ns, page)?);
            if let Some(slot) = self.cache.lookup(page) {
                self.cache.set_dirty(slot, false);
            }
        }
        Ok(done)
    }

    /// Switches the eviction policy at run time; resident pages stay.
    pub fn set_policy(&mut self, kind: PolicyKind) {
        self.cache.set_policy(kind, &self.cfg.cache.params);
        self.cfg.cache.policy = kind;
    }

    /// Switches the eviction policy and its tuning at run time (the
    /// `set_policy` control command); resident pages and pins stay. The
    /// parameters are checked like a config file's.
    pub fn set_policy_with_params(
        &mut self,
        kind: PolicyKind,
        params: crate::config::PolicyParams,
    ) -> Result<(), LoadConfigError> {
        let mut cfg = self.cfg.clone();
        cfg.cache.params = params;
        cfg.cache.policy = kind;
        cfg.validate()?;
        self.cfg.cache.params = cfg.cache.params;
        self.set_policy(kind);
        Ok(())
    }

    /// Whether the page holding `addr` is resident (ready or being filled).
    pub fn is_resident(&self, addr: u64) -> bool {
        self.cache.lookup(addr >> PAGE_SHIFT).is_some()
    }

    /// Whether the page holding `addr` is resident and pinned.
    pub fn is_pinned(&self, addr: u64) -> bool {
        self.cache
            .lookup(addr >> PAGE_SHIFT)
            .is_some_and(|slot| self.cache.state(slot).pinned)
    }

    /// Changes the prefetcher (degree 0 = off).
    pub fn set_prefetch(&mut self, degree: u32, stride_pages: u32) {
        self.cfg.prefetch.degree = degree;
        self.cfg.prefetch.stride_pages = stride_pages.max(1);
    }

    /// Hits in a row on one resident page after which a further hit
    /// changes nothing in the cache's policy: the policy's own count
    /// ([`crate::policy::EvictionPolicy::settling_hits`]), or 0 when hits
    /// are not visible to it. `None`: it never settles.
    pub fn settling_hits(&self) -> Option<u32> {
        if self.cfg.cache.hits_visible {
            self.cache.settling_hits()
        } else {
            Some(0)
        }
    }

    /// Whether an access to `page` arriving at `now_ns` would be a hit that
    /// changes nothing a later miss, eviction or placement depends on: the
    /// page resident and filled, with no unused prefetch mark, and its
    /// policy state settled ([`Cache::hit_settled`]) or hits not seen.
    /// (Such a hit may still set the page's dirty bit, which decides
    /// write-backs, not victims.) Never with a write log, where a write is
    /// no plain hit. A miniature's loop skips such an access.
    #[inline]
    pub fn repeat_settled(&self, now_ns: u64, page: u64) -> bool {
        if self.log.is_some() {
            return false;
        }
        let Some(slot) = self.cache.lookup(page) else {
            return false;
        };
        let state = self.cache.state(slot);
        if state.prefetched_unused || state.ready_at_ns > now_ns {
            return false;
        }
        !self.cfg.cache.hits_visible || self.cache.hit_settled(slot)
    }

    /// Counters and gauges.
    pub fn stats(&self) -> DeviceStats {
        let mut s = self.stats.clone();
        s.resident_pages = self.cache.resident_pages();
        s.pinned_pages = self.cache.pinned_pages();
        s.dirty_pages = self.cache.dirty_pages();
        s.policy = self.cache.policy().name().to_string();
        s.nand = self.nand.stats();
        s.nand_programs = s.nand.programs();
        if let Some(log) = &self.log {
            let l = log.stats();
            s.log_writes = l.writes;
            s.log_hits = l.hits;
            s.log_coalesced = l.coalesced;
            s.log_cleanings = l.cleanings;
            s.log_programs = l.programs;
            s.log_stalls = l.stalls;
            s.log_stall_ns = l.stall_ns;
            s.log_entries = log.entries();
        }
        s
    }

    /// The write log, when it is on.
    pub fn write_log(&self) -> Option<&WriteLog> {
        self.log.as_ref()
    }

    /// Starts (`true`) or stops keeping a log of the pages that leave the
    /// cache by eviction (policy victims and [`Device::evict`], not
    /// [`Device::discard`]), for a caller that mirrors residency elsewhere
    /// (the daemon's residency plane). Off by default; stopping drops the log.
    pub fn log_evictions(&mut self, on: bool) {
        self.eviction_log = on.then(|| self.eviction_log.take().unwrap_or_default());
    }

    /// Starts (or stops) logging the pages the next-N prefetcher fills, for
    /// a caller that mirrors residency elsewhere (the DAX residency plane).
    pub fn log_prefetches(&mut self, on: bool) {
        self.prefetch_log = on.then(|| self.prefetch_log.take().unwrap_or_default());
    }

    /// Takes the `(page, ready_at_ns)` pairs the prefetcher filled since the
    /// last call (in fill order); empty when logging is off.
    pub fn drain_prefetches(&mut self) -> Vec<(u64, u64)> {
        self.prefetch_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Takes the evicted page numbers logged since the last call (oldest
    /// first); empty when logging is off.
    pub fn drain_evictions(&mut self) -> Vec<u64> {
        self.eviction_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Makes the next-N prefetcher skip the pages `skip` names (pages that
    /// hold no data on this device: the host placed them in another tier);
    /// `None` prefetches every page again. The explicit
    /// [`Device::prefetch`] command is not filtered.
    pub fn set_prefetch_skip(&mut self, skip: Option<PageFilter>) {
        self.prefetch_skip = skip;
    }

    /// `(prefetch_issued, prefetch_used)` so far: cheap, unlike
    /// [`Device::stats`] (no cache walk, no allocation).
    pub fn prefetch_counts(&self) -> (u64, u64) {
        (self.stats.prefetch_issued, self.stats.prefetch_used)
    }

    /// Every page resident in the cache, in slot order (O(capacity)).
    pub fn resident_page_list(&self) -> Vec<u64> {
        self.cache.resident_page_list()
    }

    /// The NAND counters (cheap: a copy of a few integers).
    pub fn nand_stats(&self) -> NandStats {
        self.nand.stats()
    }

    /// Zeroes the counters; cache contents, pins and NAND state stay.
    pub fn reset_stats(&mut self) {
        self.stats = DeviceStats::default();
        self.nand.reset_stats();
        if let Some(log) = self.log.as_mut() {
            log.reset_stats();
        }
    }
}

/// Adds the NAND work of write-log cleaning to an access's outcome.
fn add_cost(out: &mut Outcome, cost: CleanCost) {
    out.nand_reads += cost.reads;
    out.nand_programs += cost.programs;
}
