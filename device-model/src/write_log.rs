//! The device's cache-line write log (SkyByte's write log, seed 004 §IV-B),
//! on when `cache.write_log_bytes > 0`.
//!
//! * **Space.** The log is part of the SSD DRAM: the page cache shrinks by
//!   its size ([`crate::config::CacheConfig::page_cache_bytes`]). It holds
//!   `write_log_bytes / 64` entries of one 64-byte line each.
//! * **Writes.** Every write lands in the log, one entry per 64-byte line it
//!   touches (a 4 KiB page write is 64 entries: a page write-back fills the
//!   log as its lines would). A line already logged is overwritten in place
//!   (SkyByte's index points at the newest copy): no new entry, counted as
//!   coalesced. Appending costs the hit latency; the page cache is not
//!   filled and never made dirty by a write (a resident page is updated in
//!   place and stays clean: the log holds the change).
//! * **Reads.** A read whose lines (within one page) are all in the log is
//!   served from it at the hit latency, with no NAND read (a log hit);
//!   otherwise it goes to the page cache as usual (a fill merges the logged
//!   lines into the page for free).
//! * **Cleaning** (log compaction) starts when the log is at least
//!   `write_log_clean_start` full after an append and takes pages, oldest
//!   first logged, until it is at most `write_log_clean_stop` full. Each
//!   page's entries coalesce into one read-modify-write: a NAND read of the
//!   page unless the page cache holds it, then one NAND program. The reads
//!   and programs are issued at once on the NAND's per-LUN and per-channel
//!   timelines, so host reads issued later on the same LUN queue behind
//!   them. A cleaned page's entries stay allocated until its program
//!   completes.
//! * **Stalls.** A write that finds no room (entries logged plus entries
//!   being cleaned would exceed the capacity) waits until enough cleaning
//!   programs have completed (cleaning first, if the uncleaned entries
//!   alone fill the log); the wait is part of its latency.
//!
//! Pure and deterministic like the rest of the model: pages are cleaned in
//! the order they were first logged, and time is an argument.

use crate::cache::Cache;
use crate::config::CacheConfig;
use crate::nand::{Nand, NandOpError};
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Bytes per log entry (one cache line).
pub const LINE_BYTES: u64 = 64;
/// Lines per 4 KiB page.
pub const LINES_PER_PAGE: u32 = 64;

/// The lines of one page an access `[addr, addr + len)` touches, as a bit
/// mask (bit `i` = line `i` of the page). `page_addr` is the page's first byte.
pub fn line_mask(page_addr: u64, addr: u64, len: u64) -> u64 {
    if addr + len <= page_addr || addr >= page_addr + crate::PAGE_SIZE {
        return 0;
    }
    let start = addr.max(page_addr) - page_addr;
    let end = (addr + len).min(page_addr + crate::PAGE_SIZE) - page_addr;
    if end <= start {
        return 0;
    }
    let first = start / LINE_BYTES;
    let last = (end - 1) / LINE_BYTES;
    let width = last - first + 1;
    let ones = if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    };
    ones << first
}

/// Write-log counters since creation or the last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteLogStats {
    /// Lines written into the log (overwrites of logged lines included).
    pub writes: u64,
    /// Read page lookups served from the log.
    pub hits: u64,
    /// Lines that merged: overwrites of a line already logged, plus every
    /// entry beyond the first of a page cleaned in one program.
    pub coalesced: u64,
    /// Cleaning passes.
    pub cleanings: u64,
    /// Pages programmed by cleaning.
    pub programs: u64,
    /// NAND reads by cleaning (pages not in the page cache).
    pub rmw_reads: u64,
    /// Page writes that waited for room.
    pub stalls: u64,
    /// Time they waited, summed, in ns.
    pub stall_ns: u64,
}

/// NAND work one call caused (the device adds it to the access's outcome).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanCost {
    /// NAND page reads.
    pub reads: u32,
    /// NAND page programs.
    pub programs: u32,
}

/// The logged lines of one page.
#[derive(Debug, Clone, Copy)]
struct PageLines {
    mask: u64,
    /// Its position in the cleaning order (stale queue entries differ).
    seq: u64,
}

/// The write log (see the module docs).
#[derive(Debug)]
pub struct WriteLog {
    capacity: u64,
    /// Cleaning starts at this many entries ...
    start_at: u64,
    /// ... and stops at this many.
    stop_at: u64,
    pages: FxHashMap<u64, PageLines>,
    /// Pages in the order first logged: `(page, seq)`.
    order: VecDeque<(u64, u64)>,
    next_seq: u64,
    /// Entries logged and not yet taken by cleaning.
    used: u64,
    /// Entries taken by cleaning whose program has not completed.
    in_flight: u64,
    /// `(program completes, entries freed then)`.
    freeing: BinaryHeap<Reverse<(u64, u64)>>,
    stats: WriteLogStats,
}

impl WriteLog {
    /// The log `cfg` asks for; `None` when it is off.
    pub fn new(cfg: &CacheConfig) -> Option<WriteLog> {
        if cfg.write_log_bytes == 0 {
            return None;
        }
        let capacity = (cfg.write_log_bytes / LINE_BYTES).max(u64::from(LINES_PER_PAGE));
        let start_at =
            ((cfg.write_log_clean_start * capacity as f64).ceil() as u64).clamp(1, capacity);
        let stop_at =
            ((cfg.write_log_clean_stop * capacity as f64).floor() as u64).min(start_at - 1);
        Some(WriteLog {
            capacity,
            start_at,
            stop_at,
            pages: FxHashMap::default(),
            order: VecDeque::new(),
            next_seq: 0,
            used: 0,
            in_flight: 0,
            freeing: BinaryHeap::new(),
            stats: WriteLogStats::default(),
        })
    }

    /// Entries the log holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Entries logged and not yet cleaned.
    pub fn entries(&self) -> u64 {
        self.used
    }

    /// Entries being cleaned (their programs still in flight at the last call).
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Counters.
    pub fn stats(&self) -> WriteLogStats {
        self.stats
    }

    /// Zeroes the counters (the log's contents stay).
    pub fn reset_stats(&mut self) {
        self.stats = WriteLogStats::default();
    }

    /// A read of `mask`'s lines of `page`: whether the log holds them all
    /// (then it serves the read, counted as a log hit).
    pub fn read_hit(&mut self, page: u64, mask: u64) -> bool {
        let hit = mask != 0 && self.pages.get(&page).is_some_and(|p| p.mask & mask == mask);
        self.stats.hits += u64::from(hit);
        hit
    }

    /// Releases the entries whose cleaning program has completed by `now`.
    fn reap(&mut self, now: u64) {
        while let Some(&Reverse((at, n))) = self.freeing.peek() {
            if at > now {
                break;
            }
            self.freeing.pop();
            self.in_flight -= n;
        }
    }

    /// Writes `mask`'s lines of `page` arriving at `now`; returns when the
    /// lines are in the log (later than `now` when the write had to wait
    /// for room) and the NAND work of any cleaning it started.
    pub fn write(
        &mut self,
        now: u64,
        page: u64,
        mask: u64,
        cache: &mut Cache,
        nand: &mut Nand,
    ) -> Result<(u64, CleanCost), NandOpError> {
        let mut cost = CleanCost::default();
        let mut at = now;
        self.reap(now);
        // Cleaning to make room may take this page's lines: then they are
        // all new, and need more room.
        let old = loop {
            let old = self.pages.get(&page).map_or(0, |p| p.mask);
            let new = u64::from((mask & !old).count_ones());
            if self.used + self.in_flight + new <= self.capacity {
                break old;
            }
            at = self.make_room(at, new, cache, nand, &mut cost)?;
        };
        let new = u64::from((mask & !old).count_ones());
        if at > now {
            self.stats.stalls += 1;
            self.stats.stall_ns += at - now;
        }
        self.stats.writes += u64::from(mask.count_ones());
        self.stats.coalesced += u64::from((mask & old).count_ones());
        if old == 0 && mask != 0 {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.order.push_back((page, seq));
            self.pages.insert(page, PageLines { mask, seq });
        } else if let Some(p) = self.pages.get_mut(&page) {
            p.mask |= mask;
        }
        self.used += new;
        if self.used >= self.start_at {
            self.clean(at, self.stop_at, cache, nand, &mut cost)?;
        }
        Ok((at, cost))
    }

    /// Waits (from `now`) until `need` more entries fit; starts cleaning
    /// first if the log is short of room. Returns when they fit.
    fn make_room(
        &mut self,
        now: u64,
        need: u64,
        cache: &mut Cache,
        nand: &mut Nand,
        cost: &mut CleanCost,
    ) -> Result<u64, NandOpError> {
        self.reap(now);
        if self.used + self.in_flight + need <= self.capacity {
            return Ok(now);
        }
        // Entries being cleaned free room as their programs complete: wait
        // for them. Clean now only if the uncleaned entries alone leave no
        // room (a start threshold of 1).
        if self.used + need > self.capacity {
            let target = self.stop_at.min(self.capacity.saturating_sub(need));
            self.clean(now, target, cache, nand, cost)?;
        }
        let mut at = now;
        while self.used + self.in_flight + need > self.capacity {
            let Some(Reverse((free_at, n))) = self.freeing.pop() else {
                break;
            };
            at = at.max(free_at);
            self.in_flight -= n;
        }
        Ok(at)
    }

    /// Cleans pages, oldest first logged, until at most `target` entries
    /// are left (one read-modify-write per page, issued at `now`).
    fn clean(
        &mut self,
        now: u64,
        target: u64,
        cache: &mut Cache,
        nand: &mut Nand,
        cost: &mut CleanCost,
    ) -> Result<(), NandOpError> {
        self.stats.cleanings += 1;
        while self.used > target {
            let Some((page, seq)) = self.order.pop_front() else {
                break;
            };
            match self.pages.get(&page) {
                Some(p) if p.seq == seq => {}
                _ => continue, // discarded, or logged again later
            }
            let Some(lines) = self.pages.remove(&page) else {
                continue;
            };
            let n = u64::from(lines.mask.count_ones());
            self.used -= n;
            let done = self.clean_page(now, page, cache, nand, cost)?;
            self.stats.programs += 1;
            self.stats.coalesced += n - 1;
            self.in_flight += n;
            self.freeing.push(Reverse((done, n)));
        }
        Ok(())
    }

    /// One page's read-modify-write; returns when its program completes.
    fn clean_page(
        &mut self,
        now: u64,
        page: u64,
        cache: &mut Cache,
        nand: &mut Nand,
        cost: &mut CleanCost,
    ) -> Result<u64, NandOpError> {
        let base = match cache.lookup(page) {
            Some(slot) => {
                let state = cache.state(slot);
                if state.dirty {
                    cache.set_dirty(slot, false);
                }
                now.max(state.ready_at_ns)
            }
            None => {
                self.stats.rmw_reads += 1;
                cost.reads += 1;
                nand.read(now, page)
            }
        };
        cost.programs += 1;
        nand.program(base, page)
    }

    /// Cleans every entry at `now` (a flush); returns when the last
    /// cleaning program completes (`now` if none is in flight).
    pub fn clean_all(
        &mut self,
        now: u64,
        cache: &mut Cache,
        nand: &mut Nand,
    ) -> Result<u64, NandOpError> {
        let mut cost = CleanCost::default();
        if self.used > 0 {
            self.clean(now, 0, cache, nand, &mut cost)?;
        }
        let last = self
            .freeing
            .iter()
            .map(|&Reverse((at, _))| at)
            .max()
            .unwrap_or(now);
        Ok(last.max(now))
    }

    /// Drops `page`'s logged lines without writing them (a discard: its
    /// data no longer exists); returns how many there were.
    pub fn discard(&mut self, page: u64) -> u64 {
        match self.pages.remove(&page) {
            Some(lines) => {
                let n = u64::from(lines.mask.count_ones());
                self.used -= n;
                n
            }
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_masks() {
        assert_eq!(line_mask(0, 0, 64), 1);
        assert_eq!(line_mask(0, 64, 64), 2);
        assert_eq!(line_mask(0, 60, 8), 3);
        assert_eq!(line_mask(0, 0, 4096), u64::MAX);
        assert_eq!(line_mask(4096, 4032, 128), 1);
        assert_eq!(line_mask(0, 4032, 128), 1 << 63);
        assert_eq!(line_mask(4096, 0, 64), 0);
    }
}
