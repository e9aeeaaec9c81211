//! NAND flash back end: geometry, FEMU-style per-LUN / per-channel busy
//! timelines, a page-mapped FTL with over-provisioning, greedy GC.
//!
//! # Timing (FEMU's model)
//!
//! Every LUN and every channel has a *next-free* timestamp. An operation
//! arriving at `now` starts on a resource at `max(now, next_free)` and pushes
//! that resource's next-free time to its end; the caller measures latency from
//! `now`. Operations on different LUNs overlap, operations on one LUN queue.
//!
//! * read: `lun_done = max(now, lun_free) + tR`, then the page crosses the
//!   channel: `done = max(lun_done, ch_free) + xfer`.
//! * program: the page crosses the channel first,
//!   `xfer_done = max(now, ch_free) + xfer`, then
//!   `done = max(xfer_done, lun_free) + tProg`.
//! * erase: `tBERS` on the LUN.
//! * GC copies a page inside its LUN (copyback): `tR + tProg` on the LUN
//!   timeline, nothing on the channel.
//!
//! With `channel_xfer_ns = 0` the channels are left out entirely. Planes are
//! part of the geometry (capacity) but not of the timing: a LUN does one
//! operation at a time.
//!
//! # LUN numbering
//!
//! LUN `g` (`0..luns`) sits on channel `g % channels` and is LUN
//! `g / channels` of that channel, so consecutive LUN numbers walk the
//! channels first.
//!
//! # FTL
//!
//! Page-mapped and out of place. The logical-to-physical map holds `u32`
//! entries in 64 KiB chunks allocated on first write; the reverse map (the
//! logical page of each programmed physical page, `u32`) is a slab that grows
//! by one block's worth when a block is first opened, contiguous per block so
//! GC reads a victim's entries in one sweep. A device with hundreds of
//! millions of pages thus starts instantly and stays small when only a few GiB
//! are written. Per-block metadata (valid count, write pointer, state, slab
//! slot: 16 bytes) is allocated up front.
//!
//! The reverse map is not cleared when a page is overwritten: a physical page
//! is valid exactly when the two maps agree (`l2p[rev[ppn]] == ppn`), so a
//! host overwrite only decrements the old block's valid count.
//!
//! A physical page number interleaves the LUNs:
//! `ppn = (block * pages_per_block + page) * luns + lun`, so the LUN of a
//! page is `ppn % luns` (a mask when `luns` is a power of two) and a read is a
//! map lookup plus two timeline updates.
//!
//! **Pages never written** are taken to hold pre-existing data at a static,
//! striped location: LUN `lpn % luns` (channel `lpn % channels`, LUN
//! `(lpn / channels) % luns_per_channel` of that channel). Reading one costs an
//! ordinary page read there and takes no FTL space. Logical pages at or beyond
//! [`Nand::logical_pages`] are charged the same way (reads and programs), with
//! no FTL state; the device layer is expected to keep addresses in range.
//!
//! Host programs are striped by a write pointer that walks all LUNs round
//! robin in LUN-number order (channels first, then the LUNs of each channel).
//! Each LUN has one open block shared by host writes and GC copies; when it
//! fills, the LUN takes a free block (recycled blocks first, oldest erase
//! first, then never-used blocks in index order). One free block per LUN is
//! kept in reserve for GC: a host write may open a new block only when the LUN
//! has at least two free blocks. A LUN that cannot take the write is skipped;
//! when no LUN can, the program fails with [`NandOpError::Full`] (unreachable
//! while host pages stay within the logical capacity, since each LUN has at
//! least two blocks of over-provisioning).
//!
//! # Garbage collection
//!
//! Greedy and per LUN: the victim is the full block with the fewest valid
//! pages (ties: lowest block index); blocks with no invalid page are never
//! picked. Its valid pages are copied into the LUN's open block, then it is
//! erased and becomes free.
//!
//! * Foreground: before a host program is placed on a LUN whose free-block
//!   share is at or under `gc_foreground_threshold` (or that has fewer than two
//!   free blocks), victims are reclaimed until the share is above the
//!   threshold or no victim is left. The reclaims queue on the LUN timeline
//!   from `max(now, lun_free)`, so the host program waits for them and its
//!   latency includes the GC.
//! * Background: after each host program, the LUN the write pointer will use
//!   next is checked; if its free-block share is under
//!   `gc_background_threshold` and it is idle at `now` (`lun_free <= now`), one
//!   victim is reclaimed starting at `now`, provided (as in FEMU) the victim
//!   has at least `pages_per_block / 8` invalid pages, so idle-time GC does not
//!   burn programs on nearly full blocks. (With a single LUN, that LUN has just
//!   been given the program and is busy, so only foreground GC runs.)
//!
//! Victim search is a linear scan of the LUN's blocks, skipped outright when
//! the LUN's full blocks hold no invalid page; host reads and programs are
//! O(1) otherwise.
//!
//! With `enabled = false` none of this exists: a read costs `read_ns`, a
//! program `program_ns`, with no queueing and no FTL; the counters still count.

use crate::config::NandConfig;
use std::collections::VecDeque;
use std::fmt;

/// Why a NAND operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NandOpError {
    /// No free page anywhere even after GC (all blocks hold only valid data).
    #[error("NAND is full: no free page even after garbage collection")]
    Full,
}

/// NAND counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NandStats {
    /// Page reads on behalf of the host (cache fills, prefetches).
    pub host_reads: u64,
    /// Page programs on behalf of the host (write-backs).
    pub host_programs: u64,
    /// Valid pages copied by GC (each one read + one program).
    pub gc_page_copies: u64,
    /// Block erases.
    pub erases: u64,
    /// GC victim blocks reclaimed.
    pub gc_runs: u64,
    /// Of which with writes blocked (free space under the foreground threshold).
    pub gc_foreground_runs: u64,
    /// LUN time spent on GC (page copies and erases), summed over LUNs, in ns.
    pub gc_busy_ns: u64,
}

impl NandStats {
    /// All flash page reads (host + GC).
    pub fn reads(&self) -> u64 {
        self.host_reads + self.gc_page_copies
    }
    /// All flash page programs (host + GC).
    pub fn programs(&self) -> u64 {
        self.host_programs + self.gc_page_copies
    }
    /// Flash programs per host program (1.0 with no GC, or no writes).
    pub fn write_amplification(&self) -> f64 {
        if self.host_programs == 0 {
            1.0
        } else {
            self.programs() as f64 / self.host_programs as f64
        }
    }
    /// GC victims reclaimed in the background (on idle LUNs).
    pub fn gc_background_runs(&self) -> u64 {
        self.gc_runs - self.gc_foreground_runs
    }
}

/// Map entry meaning "no page" (in both maps).
const UNMAPPED: u32 = u32::MAX;
/// `LunFtl::open` when the LUN has no open block.
const NO_BLOCK: u32 = u32::MAX;
/// Entries per lazily allocated map chunk (64 KiB of `u32`).
const CHUNK_SHIFT: u32 = 14;
const CHUNK_LEN: usize = 1 << CHUNK_SHIFT;
const CHUNK_MASK: u64 = CHUNK_LEN as u64 - 1;

type Chunk = Box<[u32; CHUNK_LEN]>;

/// A `u32` table of fixed length whose chunks are allocated on first write;
/// unwritten entries read as [`UNMAPPED`].
struct LazyTable {
    chunks: Vec<Option<Chunk>>,
}

impl LazyTable {
    fn new(len: u64) -> Self {
        let n = len.div_ceil(CHUNK_LEN as u64) as usize;
        LazyTable {
            chunks: (0..n).map(|_| None).collect(),
        }
    }

    #[inline]
    fn get(&self, i: u64) -> u32 {
        match self.chunks.get((i >> CHUNK_SHIFT) as usize) {
            Some(Some(chunk)) => chunk[(i & CHUNK_MASK) as usize],
            _ => UNMAPPED,
        }
    }

    /// Sets entry `i`; an index past the table's end is ignored.
    fn set(&mut self, i: u64, value: u32) {
        let Some(slot) = self.chunks.get_mut((i >> CHUNK_SHIFT) as usize) else {
            return;
        };
        let chunk = match slot {
            Some(chunk) => chunk,
            None => {
                if value == UNMAPPED {
                    return; // already reads as UNMAPPED
                }
                slot.insert(new_chunk())
            }
        };
        chunk[(i & CHUNK_MASK) as usize] = value;
    }

    fn allocated_chunks(&self) -> usize {
        self.chunks.iter().filter(|c| c.is_some()).count()
    }

    /// `(index, value)` of every mapped entry, in index order.
    fn mapped(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.chunks.iter().enumerate().flat_map(|(ci, chunk)| {
            chunk.iter().flat_map(move |c| {
                c.iter()
                    .enumerate()
                    .filter(|(_, v)| **v != UNMAPPED)
                    .map(move |(j, v)| (((ci as u64) << CHUNK_SHIFT) + j as u64, *v))
            })
        })
    }
}

fn new_chunk() -> Chunk {
    Box::new([UNMAPPED; CHUNK_LEN])
}

/// `x / d` and `x % d` with a shift and a mask when `d` is a power of two.
#[derive(Debug, Clone, Copy)]
struct Divisor {
    d: u64,
    shift: u32,
    mask: u64,
    pow2: bool,
}

impl Divisor {
    fn new(d: u64) -> Self {
        let d = d.max(1);
        Divisor {
            d,
            shift: d.trailing_zeros(),
            mask: d - 1,
            pow2: d.is_power_of_two(),
        }
    }

    #[inline]
    fn rem(self, x: u64) -> u64 {
        if self.pow2 {
            x & self.mask
        } else {
            x % self.d
        }
    }

    #[inline]
    fn div(self, x: u64) -> u64 {
        if self.pow2 {
            x >> self.shift
        } else {
            x / self.d
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum BlockState {
    /// Erased (or never used), in the LUN's free pool.
    #[default]
    Free,
    /// The LUN's open block, being filled.
    Open,
    /// Every page programmed; a GC candidate.
    Full,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    /// Pages holding the current copy of some logical page.
    valid: u32,
    /// Pages programmed since the last erase.
    wp: u32,
    /// This block's reverse-map entries start at `rev * pages_per_block` in
    /// `Nand::rev`; [`NO_BLOCK`] while the block holds no data (before it
    /// is first opened, and once a full block's last valid page is gone).
    rev: u32,
    state: BlockState,
}

impl Default for Block {
    fn default() -> Self {
        Block {
            valid: 0,
            wp: 0,
            rev: NO_BLOCK,
            state: BlockState::Free,
        }
    }
}

/// FTL state of one LUN (block indices are local to the LUN).
#[derive(Debug, Clone)]
struct LunFtl {
    /// Open block, or [`NO_BLOCK`].
    open: u32,
    /// Free blocks: `erased.len() + (blocks_per_lun - next_fresh)`.
    free: u32,
    /// Blocks from here on have never been used.
    next_fresh: u32,
    /// Blocks erased by GC, oldest first.
    erased: VecDeque<u32>,
    /// Invalid pages in full blocks (what GC can win back).
    invalid_full: u64,
}

/// Timeline of one LUN (with its channel, to keep a read in one cache line).
#[derive(Debug, Clone, Copy)]
struct LunTime {
    free_at: u64,
    channel: u32,
}

/// The NAND array with its FTL.
pub struct Nand {
    enabled: bool,
    read_ns: u64,
    program_ns: u64,
    erase_ns: u64,
    xfer_ns: u64,
    channels: u64,
    luns: u64,
    lun_div: Divisor,
    ppb_div: Divisor,
    pages_per_block: u64,
    blocks_per_lun: u64,
    logical: u64,
    physical: u64,
    /// Foreground GC when `free <= fg_limit` (at least 1).
    fg_limit: u64,
    /// Background GC when `free < bg_limit`.
    bg_limit: u64,
    /// Background GC leaves victims with fewer invalid pages than this alone.
    bg_min_invalid: u64,
    lun_time: Vec<LunTime>,
    ch_free: Vec<u64>,
    l2p: LazyTable,
    /// Reverse map slab: `pages_per_block` logical page numbers per block
    /// that holds data (the open block, and full blocks with a valid page;
    /// an erased block has given its slot back already).
    rev: Vec<u32>,
    /// Slots of `rev` no block holds, taken before the slab grows: the slab
    /// follows the blocks holding data, not every block ever written.
    free_rev: Vec<u32>,
    /// Indexed by `lun * blocks_per_lun + block`.
    blocks: Vec<Block>,
    lun_ftl: Vec<LunFtl>,
    /// The LUN the next host program tries first.
    cursor: u64,
    valid_pages: u64,
    stats: NandStats,
}

impl fmt::Debug for Nand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nand")
            .field("enabled", &self.enabled)
            .field("channels", &self.channels)
            .field("luns", &self.luns)
            .field("blocks_per_lun", &self.blocks_per_lun)
            .field("pages_per_block", &self.pages_per_block)
            .field("logical_pages", &self.logical)
            .field("valid_pages", &self.valid_pages)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Nand {
    /// A fresh (erased) device.
    pub fn new(cfg: &NandConfig) -> Self {
        let channels = u64::from(cfg.channels.max(1));
        let luns = cfg.luns().max(1);
        let blocks_per_lun = cfg.blocks_per_lun().max(1);
        let pages_per_block = u64::from(cfg.pages_per_block.max(1));
        let logical = cfg.logical_pages();
        let physical = cfg.physical_pages();
        let bpl = blocks_per_lun as f64;
        let fg_limit = ((cfg.gc_foreground_threshold * bpl).floor().max(0.0) as u64).max(1);
        let bg_limit = (cfg.gc_background_threshold * bpl).ceil().max(0.0) as u64;
        let (lun_time, ch_free, l2p, blocks, lun_ftl) = if cfg.enabled {
            let lun_time = (0..luns)
                .map(|g| LunTime {
                    free_at: 0,
                    channel: (g % channels) as u32,
                })
                .collect();
            let lun_ftl = (0..luns)
                .map(|_| LunFtl {
                    open: NO_BLOCK,
                    free: blocks_per_lun as u32,
                    next_fresh: 0,
                    erased: VecDeque::new(),
                    invalid_full: 0,
                })
                .collect();
            (
                lun_time,
                vec![0; channels as usize],
                LazyTable::new(logical),
                vec![Block::default(); (luns * blocks_per_lun) as usize],
                lun_ftl,
            )
        } else {
            (
                Vec::new(),
                Vec::new(),
                LazyTable::new(0),
                Vec::new(),
                Vec::new(),
            )
        };
        Nand {
            enabled: cfg.enabled,
            read_ns: cfg.read_ns,
            program_ns: cfg.program_ns,
            erase_ns: cfg.erase_ns,
            xfer_ns: cfg.channel_xfer_ns,
            channels,
            luns,
            lun_div: Divisor::new(luns),
            ppb_div: Divisor::new(pages_per_block),
            pages_per_block,
            blocks_per_lun,
            logical,
            physical,
            fg_limit,
            bg_limit,
            bg_min_invalid: (pages_per_block / 8).max(1),
            lun_time,
            ch_free,
            l2p,
            rev: Vec::new(),
            free_rev: Vec::new(),
            blocks,
            lun_ftl,
            cursor: 0,
            valid_pages: 0,
            stats: NandStats::default(),
        }
    }

    /// Reads logical page `lpn` arriving at `now_ns`; returns when the data is on the controller.
    ///
    /// A page never written is read from its static striped LUN (`lpn % luns`).
    #[inline]
    pub fn read(&mut self, now_ns: u64, lpn: u64) -> u64 {
        self.stats.host_reads += 1;
        if !self.enabled {
            return now_ns + self.read_ns;
        }
        let ppn = self.l2p.get(lpn);
        let key = if ppn == UNMAPPED { lpn } else { u64::from(ppn) };
        let lun = self.lun_div.rem(key) as usize;
        let Some(lt) = self.lun_time.get_mut(lun) else {
            return now_ns + self.read_ns;
        };
        let lun_done = now_ns.max(lt.free_at) + self.read_ns;
        lt.free_at = lun_done;
        if self.xfer_ns == 0 {
            return lun_done;
        }
        let channel = lt.channel as usize;
        match self.ch_free.get_mut(channel) {
            Some(ch) => {
                let done = lun_done.max(*ch) + self.xfer_ns;
                *ch = done;
                done
            }
            None => lun_done + self.xfer_ns,
        }
    }

    /// Programs logical page `lpn` arriving at `now_ns`; returns when it is durable.
    ///
    /// The completion includes any foreground GC the target LUN needed first.
    pub fn program(&mut self, now_ns: u64, lpn: u64) -> Result<u64, NandOpError> {
        if !self.enabled {
            self.stats.host_programs += 1;
            return Ok(now_ns + self.program_ns);
        }
        if lpn >= self.logical {
            // Out of the logical range: timing only, at the striped location.
            self.stats.host_programs += 1;
            let lun = self.lun_div.rem(lpn) as usize;
            return Ok(self.charge_program(now_ns, lun));
        }
        let lun = self.choose_lun(now_ns)?;
        let ppn = self.place(lun, lpn).ok_or(NandOpError::Full)?;
        self.stats.host_programs += 1;
        let old = self.l2p.get(lpn);
        self.l2p.set(lpn, ppn as u32);
        if old == UNMAPPED {
            self.valid_pages += 1;
        } else {
            self.invalidate(u64::from(old));
        }
        let done = self.charge_program(now_ns, lun);
        self.background_gc(now_ns);
        Ok(done)
    }

    /// Counters since creation or the last reset.
    pub fn stats(&self) -> NandStats {
        self.stats.clone()
    }

    /// Zeroes the counters (not the FTL state or the timelines).
    pub fn reset_stats(&mut self) {
        self.stats = NandStats::default();
    }

    /// Whether the NAND model is on (timelines, FTL and GC).
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Logical pages the host can address.
    pub fn logical_pages(&self) -> u64 {
        self.logical
    }

    /// Physical pages of the array.
    pub fn physical_pages(&self) -> u64 {
        self.physical
    }

    /// Number of LUNs (`channels * luns_per_channel`).
    pub fn luns(&self) -> u64 {
        self.luns
    }

    /// Number of channels.
    pub fn channels(&self) -> u64 {
        self.channels
    }

    /// The channel LUN `lun` sits on (`lun % channels`).
    pub fn channel_of_lun(&self, lun: u64) -> u64 {
        lun % self.channels
    }

    /// The LUN that holds logical page `lpn` now: where it was last written,
    /// or its static striped LUN (`lpn % luns`) if it never was.
    pub fn lun_of(&self, lpn: u64) -> u64 {
        let ppn = self.l2p.get(lpn);
        let key = if ppn == UNMAPPED { lpn } else { u64::from(ppn) };
        self.lun_div.rem(key)
    }

    /// Whether logical page `lpn` has been written (has a place in the FTL).
    pub fn is_mapped(&self, lpn: u64) -> bool {
        self.l2p.get(lpn) != UNMAPPED
    }

    /// Logical pages with a place in the FTL (written at least once).
    pub fn valid_pages(&self) -> u64 {
        self.valid_pages
    }

    /// Free (erased or never used) blocks of LUN `lun`; 0 for an unknown LUN
    /// or with the model off.
    pub fn free_blocks(&self, lun: u64) -> u64 {
        self.lun_ftl
            .get(lun as usize)
            .map_or(0, |l| u64::from(l.free))
    }

    /// When LUN `lun` is next free (0 for an unknown LUN or with the model off).
    pub fn busy_until(&self, lun: u64) -> u64 {
        self.lun_time.get(lun as usize).map_or(0, |l| l.free_at)
    }

    /// When channel `channel` is next free (0 for an unknown channel, with the
    /// model off, or with no channel transfer time).
    pub fn channel_busy_until(&self, channel: u64) -> u64 {
        self.ch_free.get(channel as usize).copied().unwrap_or(0)
    }

    /// Approximate heap bytes in use by the maps and the block metadata.
    pub fn memory_bytes(&self) -> u64 {
        let chunk = (CHUNK_LEN * std::mem::size_of::<u32>()) as u64;
        let chunks = self.l2p.allocated_chunks() as u64;
        let tables = self.l2p.chunks.len() as u64 * std::mem::size_of::<Option<Chunk>>() as u64;
        let erased: usize = self.lun_ftl.iter().map(|l| l.erased.capacity()).sum();
        chunks * chunk
            + tables
            + ((self.rev.len() + self.free_rev.capacity()) * std::mem::size_of::<u32>()) as u64
            + (self.blocks.len() * std::mem::size_of::<Block>()) as u64
            + (self.lun_ftl.len() * std::mem::size_of::<LunFtl>()) as u64
            + (erased * std::mem::size_of::<u32>()) as u64
            + (self.lun_time.len() * std::mem::size_of::<LunTime>()) as u64
            + (self.ch_free.len() * std::mem::size_of::<u64>()) as u64
    }

    /// Checks the FTL's internal consistency: both maps agree, per-block valid
    /// counts and write pointers match the reverse map, block states and free
    /// counts agree, every LUN keeps its GC reserve, and no more pages are
    /// valid than the logical capacity. Walks every written page: for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        let mut total_valid = 0u64;
        for (g, lf) in self.lun_ftl.iter().enumerate() {
            total_valid += self.check_lun_invariants(g, lf)?;
        }
        if total_valid != self.valid_pages {
            return Err(format!(
                "{total_valid} valid physical pages, counter {}",
                self.valid_pages
            ));
        }
        if total_valid > self.logical {
            return Err(format!(
                "{total_valid} valid pages exceed {} logical pages",
                self.logical
            ));
        }
        self.check_rev_slots()?;
        self.check_l2p_invariants()
    }

    /// Every slot of the reverse-map slab is held by one block or free, never
    /// both, never twice.
    fn check_rev_slots(&self) -> Result<(), String> {
        let slots = self.rev.len() as u64 / self.pages_per_block;
        let mut owner = vec![false; slots as usize];
        let held = self
            .blocks
            .iter()
            .filter(|b| b.rev != NO_BLOCK)
            .map(|b| b.rev);
        for slot in held.chain(self.free_rev.iter().copied()) {
            match owner.get_mut(slot as usize) {
                Some(seen @ false) => *seen = true,
                Some(true) => return Err(format!("reverse-map slot {slot} held twice")),
                None => return Err(format!("reverse-map slot {slot} past the slab ({slots})")),
            }
        }
        match owner.iter().position(|seen| !seen) {
            Some(slot) => Err(format!("reverse-map slot {slot} neither held nor free")),
            None => Ok(()),
        }
    }

    /// [`Self::check_invariants`] for LUN `g`: each block's write pointer,
    /// state and valid pages, then the LUN's counters. Returns the LUN's
    /// valid pages.
    fn check_lun_invariants(&self, g: usize, lf: &LunFtl) -> Result<u64, String> {
        let ppb = self.pages_per_block;
        let bpl = self.blocks_per_lun;
        let g64 = g as u64;
        let mut lun_valid = 0u64;
        let mut free = 0u64;
        let mut invalid_full = 0u64;
        let mut open_seen = 0u32;
        for b in 0..bpl {
            let blk = self.blocks[(g64 * bpl + b) as usize];
            let ctx = || format!("LUN {g} block {b}");
            if u64::from(blk.wp) > ppb || blk.valid > blk.wp {
                return Err(format!("{}: wp {} valid {}", ctx(), blk.wp, blk.valid));
            }
            match blk.state {
                BlockState::Free => {
                    free += 1;
                    if blk.wp != 0 {
                        return Err(format!("{}: free with wp {}", ctx(), blk.wp));
                    }
                }
                BlockState::Open => {
                    open_seen += 1;
                    if u64::from(lf.open) != b || u64::from(blk.wp) >= ppb {
                        return Err(format!("{}: stray open block (wp {})", ctx(), blk.wp));
                    }
                }
                BlockState::Full => {
                    if u64::from(blk.wp) != ppb {
                        return Err(format!("{}: full with wp {}", ctx(), blk.wp));
                    }
                    invalid_full += ppb - u64::from(blk.valid);
                }
            }
            let holds_data = blk.state == BlockState::Open || blk.valid > 0;
            if holds_data && blk.rev == NO_BLOCK {
                return Err(format!("{}: holds data but has no reverse-map slot", ctx()));
            }
            if blk.state == BlockState::Full && blk.valid == 0 && blk.rev != NO_BLOCK {
                return Err(format!(
                    "{}: empty full block keeps a reverse-map slot",
                    ctx()
                ));
            }
            lun_valid += u64::from(self.check_block_pages(g, b, &blk)?);
        }
        self.check_lun_counters(g, lf, free, open_seen, invalid_full)?;
        Ok(lun_valid)
    }

    /// Walks the written pages of block `b` on LUN `g`: each held page maps a
    /// logical page in range, and their count is the block's valid count.
    /// Returns that count.
    fn check_block_pages(&self, g: usize, b: u64, blk: &Block) -> Result<u32, String> {
        let ctx = || format!("LUN {g} block {b}");
        let mut valid = 0u32;
        for p in 0..u64::from(blk.wp) {
            let ppn = (b * self.pages_per_block + p) * self.luns + g as u64;
            if let Some(lpn) = self.holder(ppn) {
                if u64::from(lpn) >= self.logical {
                    return Err(format!("{}: page {p} holds lpn {lpn} out of range", ctx()));
                }
                valid += 1;
            }
        }
        if valid != blk.valid {
            return Err(format!("{}: valid count {} != {valid}", ctx(), blk.valid));
        }
        Ok(valid)
    }

    /// LUN `g`'s counters against its blocks' tallies: one open block at
    /// most, the free count and the erased pool, the never-used blocks, the
    /// GC reserve, and the invalid pages in full blocks.
    fn check_lun_counters(
        &self,
        g: usize,
        lf: &LunFtl,
        free: u64,
        open_seen: u32,
        invalid_full: u64,
    ) -> Result<(), String> {
        let bpl = self.blocks_per_lun;
        let g64 = g as u64;
        if (lf.open == NO_BLOCK) != (open_seen == 0) || open_seen > 1 {
            return Err(format!(
                "LUN {g}: open block {} but {open_seen} open",
                lf.open
            ));
        }
        let pool = lf.erased.len() as u64 + (bpl - u64::from(lf.next_fresh));
        if free != u64::from(lf.free) || free != pool {
            return Err(format!(
                "LUN {g}: {free} free blocks, counter {}, pool {pool}",
                lf.free
            ));
        }
        for &b in &lf.erased {
            if u64::from(b) >= u64::from(lf.next_fresh)
                || self.blocks[(g64 * bpl + u64::from(b)) as usize].state != BlockState::Free
            {
                return Err(format!("LUN {g}: erased list holds non-free block {b}"));
            }
        }
        for b in u64::from(lf.next_fresh)..bpl {
            if self.blocks[(g64 * bpl + b) as usize].state != BlockState::Free {
                return Err(format!("LUN {g}: never-used block {b} is not free"));
            }
        }
        if free < 1 {
            return Err(format!("LUN {g}: no free block left for GC"));
        }
        if invalid_full != lf.invalid_full {
            return Err(format!(
                "LUN {g}: {invalid_full} invalid pages in full blocks, counter {}",
                lf.invalid_full
            ));
        }
        Ok(())
    }

    /// The forward map against the blocks and the reverse map: every mapped
    /// logical page points at a written page of a used block whose reverse
    /// entry points back, and as many are mapped as pages are valid.
    fn check_l2p_invariants(&self) -> Result<(), String> {
        let ppb = self.pages_per_block;
        let mut mapped = 0u64;
        for (lpn, ppn) in self.l2p.mapped() {
            let (g, b) = self.locate(u64::from(ppn));
            let page = u64::from(ppn) / self.luns % ppb;
            let blk = self
                .blocks
                .get(self.block_index(g, b))
                .copied()
                .unwrap_or_default();
            if blk.state == BlockState::Free || page >= u64::from(blk.wp) {
                return Err(format!(
                    "lpn {lpn} -> ppn {ppn}: page {page} of {:?} block {b} (wp {}) on LUN {g}",
                    blk.state, blk.wp
                ));
            }
            if u64::from(self.rev_entry(u64::from(ppn))) != lpn {
                return Err(format!(
                    "lpn {lpn} -> ppn {ppn} has no matching reverse entry"
                ));
            }
            mapped += 1;
        }
        if mapped != self.valid_pages {
            return Err(format!(
                "{mapped} mapped lpns, {} valid pages",
                self.valid_pages
            ));
        }
        Ok(())
    }

    // ---- internals -------------------------------------------------------

    /// Channel transfer then tProg on `lun`; returns the completion.
    fn charge_program(&mut self, now_ns: u64, lun: usize) -> u64 {
        let Some(lt) = self.lun_time.get(lun).copied() else {
            return now_ns + self.program_ns;
        };
        let data_in = if self.xfer_ns == 0 {
            now_ns
        } else {
            match self.ch_free.get_mut(lt.channel as usize) {
                Some(ch) => {
                    let end = now_ns.max(*ch) + self.xfer_ns;
                    *ch = end;
                    end
                }
                None => now_ns + self.xfer_ns,
            }
        };
        let done = data_in.max(lt.free_at) + self.program_ns;
        if let Some(lt) = self.lun_time.get_mut(lun) {
            lt.free_at = done;
        }
        done
    }

    fn block_index(&self, lun: usize, block: u32) -> usize {
        lun * self.blocks_per_lun as usize + block as usize
    }

    fn ppn_of(&self, lun: usize, block: u32, page: u64) -> u64 {
        (u64::from(block) * self.pages_per_block + page) * self.luns + lun as u64
    }

    /// (LUN, block within the LUN) of a physical page.
    fn locate(&self, ppn: u64) -> (usize, u32) {
        let lun = self.lun_div.rem(ppn) as usize;
        let block = self.ppb_div.div(self.lun_div.div(ppn)) as u32;
        (lun, block)
    }

    /// The reverse-map entry of physical page `ppn` (possibly stale).
    fn rev_entry(&self, ppn: u64) -> u32 {
        let (lun, block) = self.locate(ppn);
        let page = self.ppb_div.rem(self.lun_div.div(ppn));
        match self.blocks.get(self.block_index(lun, block)) {
            Some(blk) if blk.rev != NO_BLOCK => {
                let at = u64::from(blk.rev) * self.pages_per_block + page;
                self.rev.get(at as usize).copied().unwrap_or(UNMAPPED)
            }
            _ => UNMAPPED,
        }
    }

    /// The logical page whose current copy is physical page `ppn`, if any.
    /// The reverse map may hold stale entries: only an entry that the forward
    /// map agrees with is valid.
    fn holder(&self, ppn: u64) -> Option<u32> {
        let lpn = self.rev_entry(ppn);
        (lpn != UNMAPPED && u64::from(self.l2p.get(u64::from(lpn))) == ppn).then_some(lpn)
    }

    /// Whether a host program may be placed on `lun` (keeps one free block for GC).
    fn host_can_place(&self, lun: usize) -> bool {
        self.lun_ftl
            .get(lun)
            .is_some_and(|l| l.open != NO_BLOCK || l.free >= 2)
    }

    fn needs_foreground_gc(&self, lun: usize) -> bool {
        self.lun_ftl
            .get(lun)
            .is_some_and(|l| u64::from(l.free) <= self.fg_limit)
    }

    /// Picks the LUN for the next host program, running foreground GC where
    /// due, and advances the write pointer past it.
    fn choose_lun(&mut self, now_ns: u64) -> Result<usize, NandOpError> {
        for _ in 0..self.luns {
            let lun = self.cursor as usize;
            self.cursor += 1;
            if self.cursor == self.luns {
                self.cursor = 0;
            }
            if self.needs_foreground_gc(lun) {
                while self.needs_foreground_gc(lun) && self.reclaim(lun, now_ns, true) {}
            }
            if self.host_can_place(lun) {
                return Ok(lun);
            }
        }
        Err(NandOpError::Full)
    }

    /// One background reclaim on the LUN the write pointer uses next, if it
    /// is short of free blocks and idle at `now_ns`.
    fn background_gc(&mut self, now_ns: u64) {
        let lun = self.cursor as usize;
        let due = self
            .lun_ftl
            .get(lun)
            .is_some_and(|l| u64::from(l.free) < self.bg_limit && l.invalid_full > 0);
        let idle = self.lun_time.get(lun).is_some_and(|l| l.free_at <= now_ns);
        if due && idle {
            self.reclaim(lun, now_ns, false);
        }
    }

    /// Programs `lpn` into the open block of `lun` (opening a free block when
    /// needed) and records the reverse mapping; the caller updates the forward
    /// map. `None` when the LUN has no free page at all.
    fn place(&mut self, lun: usize, lpn: u64) -> Option<u64> {
        let bpl = self.blocks_per_lun as u32;
        let ppb = self.pages_per_block;
        let lf = self.lun_ftl.get_mut(lun)?;
        if lf.open == NO_BLOCK {
            let block = match lf.erased.pop_front() {
                Some(b) => b,
                None if lf.next_fresh < bpl => {
                    lf.next_fresh += 1;
                    lf.next_fresh - 1
                }
                None => return None,
            };
            lf.free -= 1;
            lf.open = block;
        }
        let block = lf.open;
        let bi = lun * self.blocks_per_lun as usize + block as usize;
        let blk = self.blocks.get_mut(bi)?;
        if blk.rev == NO_BLOCK {
            // A block without a slot in the reverse-map slab: one no block
            // holds, else a new one. A reused slot's stale entries are
            // overwritten page by page; until then the forward map disowns
            // them.
            blk.rev = match self.free_rev.pop() {
                Some(slot) => slot,
                None => {
                    let slot = (self.rev.len() as u64 / ppb) as u32;
                    self.rev.resize(self.rev.len() + ppb as usize, UNMAPPED);
                    slot
                }
            };
        }
        blk.state = BlockState::Open;
        let page = u64::from(blk.wp);
        blk.wp += 1;
        blk.valid += 1;
        if u64::from(blk.wp) == ppb {
            blk.state = BlockState::Full;
            lf.invalid_full += ppb - u64::from(blk.valid);
            lf.open = NO_BLOCK;
        }
        if let Some(slot) = self.rev.get_mut((u64::from(blk.rev) * ppb + page) as usize) {
            *slot = lpn as u32;
        }
        Some((u64::from(block) * ppb + page) * self.luns + lun as u64)
    }

    /// Counts physical page `ppn` as no longer holding valid data (its
    /// reverse-map entry is left stale, so a host overwrite touches one block
    /// record and no reverse-map line). A full block left with no valid page
    /// gives its reverse-map slot back: nothing in it needs a reverse entry.
    fn invalidate(&mut self, ppn: u64) {
        let (lun, block) = self.locate(ppn);
        let bi = self.block_index(lun, block);
        if let Some(blk) = self.blocks.get_mut(bi) {
            blk.valid = blk.valid.saturating_sub(1);
            if blk.state == BlockState::Full {
                if let Some(lf) = self.lun_ftl.get_mut(lun) {
                    lf.invalid_full += 1;
                }
                if blk.valid == 0 && blk.rev != NO_BLOCK {
                    self.free_rev.push(blk.rev);
                    blk.rev = NO_BLOCK;
                }
            }
        }
    }

    /// Greedy victim of `lun`: the full block with the fewest valid pages,
    /// lowest index on ties, if it has at least `min_invalid` (>= 1) invalid
    /// pages.
    fn pick_victim(&self, lun: usize, min_invalid: u64) -> Option<u32> {
        if self.lun_ftl.get(lun)?.invalid_full == 0 {
            return None;
        }
        let base = self.block_index(lun, 0);
        let blocks = self.blocks.get(base..base + self.blocks_per_lun as usize)?;
        let mut best = None;
        // Strictly fewer valid pages than this qualifies.
        let mut best_valid = self.pages_per_block + 1 - min_invalid.max(1);
        for (b, blk) in blocks.iter().enumerate() {
            if blk.state == BlockState::Full && u64::from(blk.valid) < best_valid {
                best = Some(b as u32);
                best_valid = u64::from(blk.valid);
                if best_valid == 0 {
                    break;
                }
            }
        }
        best
    }

    /// Reclaims one victim of `lun` (copyback of its valid pages, then erase),
    /// queued on the LUN from `max(start_ns, lun_free)`. False when there was
    /// no victim. Background GC, like FEMU's, skips victims with fewer than
    /// `pages_per_block / 8` invalid pages.
    fn reclaim(&mut self, lun: usize, start_ns: u64, foreground: bool) -> bool {
        let min_invalid = if foreground { 1 } else { self.bg_min_invalid };
        let Some(victim) = self.pick_victim(lun, min_invalid) else {
            return false;
        };
        let bi = self.block_index(lun, victim);
        let Some(rev_base) = self
            .blocks
            .get(bi)
            .map(|b| u64::from(b.rev) * self.pages_per_block)
        else {
            return false;
        };
        let mut copies = 0u64;
        let mut complete = true;
        for page in 0..self.pages_per_block {
            if self.blocks.get(bi).map_or(true, |b| b.valid == 0) {
                break; // the rest is stale, and the slot may be another block's now
            }
            let lpn = self
                .rev
                .get((rev_base + page) as usize)
                .copied()
                .unwrap_or(UNMAPPED);
            let old = self.ppn_of(lun, victim, page);
            if lpn == UNMAPPED || u64::from(self.l2p.get(u64::from(lpn))) != old {
                continue; // stale: overwritten since
            }
            let Some(new) = self.place(lun, u64::from(lpn)) else {
                // Cannot happen while the LUN keeps its free-block reserve.
                complete = false;
                break;
            };
            self.l2p.set(u64::from(lpn), new as u32);
            self.invalidate(old);
            copies += 1;
        }
        let mut busy = copies * (self.read_ns + self.program_ns);
        if complete {
            if let Some(blk) = self.blocks.get_mut(bi) {
                // Erased: its reverse-map slot went back when its last valid
                // page moved.
                blk.valid = 0;
                blk.wp = 0;
                blk.state = BlockState::Free;
            }
            if let Some(lf) = self.lun_ftl.get_mut(lun) {
                lf.invalid_full -= self.pages_per_block;
                lf.erased.push_back(victim);
                lf.free += 1;
            }
            busy += self.erase_ns;
            self.stats.erases += 1;
        }
        if let Some(lt) = self.lun_time.get_mut(lun) {
            lt.free_at = start_ns.max(lt.free_at) + busy;
        }
        self.stats.gc_runs += 1;
        if foreground {
            self.stats.gc_foreground_runs += 1;
        }
        self.stats.gc_page_copies += copies;
        self.stats.gc_busy_ns += busy;
        complete
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NandConfig {
        NandConfig {
            enabled: true,
            channels: 2,
            luns_per_channel: 3,
            planes_per_lun: 1,
            blocks_per_plane: 8,
            pages_per_block: 4,
            read_ns: 10,
            program_ns: 100,
            erase_ns: 1000,
            channel_xfer_ns: 1,
            overprovision_ratio: 0.25,
            gc_background_threshold: 0.5,
            gc_foreground_threshold: 0.25,
        }
    }

    #[test]
    fn lazy_table_reads_unmapped_until_set() {
        let mut t = LazyTable::new(3 * CHUNK_LEN as u64 + 5);
        assert_eq!(t.chunks.len(), 4);
        assert_eq!(t.get(7), UNMAPPED);
        assert_eq!(t.get(1 << 40), UNMAPPED);
        t.set(7, UNMAPPED);
        assert_eq!(t.allocated_chunks(), 0);
        t.set(3 * CHUNK_LEN as u64 + 4, 42);
        t.set(1 << 40, 1); // ignored
        assert_eq!(t.allocated_chunks(), 1);
        assert_eq!(t.get(3 * CHUNK_LEN as u64 + 4), 42);
        assert_eq!(
            t.mapped().collect::<Vec<_>>(),
            vec![(3 * CHUNK_LEN as u64 + 4, 42)]
        );
    }

    #[test]
    fn divisor_matches_div_and_rem() {
        for d in [1u64, 2, 3, 6, 64, 1000, 1024] {
            let m = Divisor::new(d);
            for x in [0u64, 1, 5, 63, 64, 999, 12345, u64::from(u32::MAX)] {
                assert_eq!(m.rem(x), x % d, "{x} % {d}");
                assert_eq!(m.div(x), x / d, "{x} / {d}");
            }
        }
    }

    #[test]
    fn ppn_layout_round_trips() {
        let nand = Nand::new(&cfg());
        for lun in 0..6 {
            for block in 0..8u32 {
                for page in 0..4 {
                    let ppn = nand.ppn_of(lun, block, page);
                    assert!(ppn < nand.physical_pages());
                    assert_eq!(nand.locate(ppn), (lun, block));
                }
            }
        }
    }

    #[test]
    fn write_pointer_stripes_channels_first() {
        let mut nand = Nand::new(&cfg());
        let luns: Vec<u64> = (0..6)
            .map(|lpn| {
                nand.program(0, lpn).unwrap();
                nand.lun_of(lpn)
            })
            .collect();
        assert_eq!(luns, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(
            (0..6).map(|g| nand.channel_of_lun(g)).collect::<Vec<_>>(),
            vec![0, 1, 0, 1, 0, 1]
        );
        nand.check_invariants().unwrap();
    }

    #[test]
    fn thresholds_in_blocks() {
        let nand = Nand::new(&cfg());
        // 8 blocks per LUN: fg at <= 2 free, bg at < 4 free.
        assert_eq!(nand.fg_limit, 2);
        assert_eq!(nand.bg_limit, 4);
    }
}
