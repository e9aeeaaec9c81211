//! The device's DRAM cache: residency, sets, pins, dirty bits. No timing here
//! (that is the device's job); eviction decisions come from [`crate::policy`].
//!
//! Layout: slot `s` of set `k` is global slot `k * ways + s`; page `p` maps to
//! set `p % sets` (a fully associative cache is one set of `capacity` ways, so
//! a one-set set-associative cache is exactly a fully associative one). The
//! page → slot map is a lazily allocated two-level table (chunks of 65 536
//! entries, allocated on the first insert into the chunk); slot metadata is
//! one flat array of [`Frame`]s, each holding the cache's record of the slot
//! and the policy's (list links, bits) together, so that a miss touches one
//! record per slot it involves; free slots form per-set intrusive stacks
//! through the frames' `next` links. Pinned slots are hidden from the
//! policy, so it never picks one as a victim.
//!
//! Ghosts: the page table also points into the policies' ghost FIFOs (see
//! [`crate::policy`] and `policy/ghost.rs`). An entry is 0 (unknown
//! page), `slot + 1` (resident), or `capacity + 1 + n` for a page held at
//! position `n` of the ghost rings. A page pushed out of a full ghost FIFO
//! keeps its entry (clearing it would cost a random write per eviction);
//! the look-up asks the rings whether position `n` still holds that page,
//! so a stale entry reads as unknown.

use crate::config::{CacheConfig, PolicyKind, PolicyParams};
use crate::policy::ghost::{self, GhostQueues};
use crate::policy::{EvictionPolicy, Policy};
pub use crate::slot::SlotId;
use crate::slot::{prefetch_frame, prefetch_read, Frame, NIL};
use rustc_hash::FxHashMap;
use std::fmt;

/// What is known about a resident page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotState {
    /// Device page number held by the slot.
    pub page: u64,
    /// When the fill of this page completes (MSHR: accesses before this wait for it).
    pub ready_at_ns: u64,
    /// Written since it was filled; needs a NAND program on eviction.
    pub dirty: bool,
    /// Pinned: never chosen as a victim.
    pub pinned: bool,
    /// Brought in by the prefetcher and not yet touched by a demand access.
    pub prefetched_unused: bool,
}

/// A page that left the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    /// Device page number.
    pub page: u64,
    /// It must be written back.
    pub dirty: bool,
    /// It was prefetched and never used (a wasted prefetch).
    pub prefetched_unused: bool,
}

/// Result of [`Cache::insert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    /// The page now lives in `slot`; `evicted` is the victim that made room, if any.
    Placed {
        /// Slot of the new page.
        slot: SlotId,
        /// Page evicted to make room.
        evicted: Option<Evicted>,
    },
    /// Every way of the page's set is pinned: the access must bypass the cache.
    SetFullyPinned,
}

/// log2 of the entries per chunk of a [`PageMap`].
const CHUNK_SHIFT: u32 = 16;
const CHUNK_LEN: usize = 1 << CHUNK_SHIFT;
const CHUNK_MASK: u64 = (1 << CHUNK_SHIFT) - 1;
/// Pages at or above this live in an overflow hash map instead of the chunks
/// (keeps the first level of a [`PageMap`] at most 2^18 entries).
const TABLE_LIMIT_PAGES: u64 = 1 << 34;

/// A map from page numbers to non-zero `u32` values (0 = absent) with O(1),
/// hash-free look-ups: a two-level table whose chunks of 65 536 entries are
/// allocated (zeroed, so the OS commits memory as it is written) on the first
/// write into them. Pages from 2^34 up go to a hash map. It counts the
/// entries whose value is within `1..=counted_max`.
#[derive(Debug, Clone, Default)]
struct PageMap {
    chunks: Vec<Box<[u32]>>,
    overflow: FxHashMap<u64, u32>,
    counted_max: u32,
    counted: usize,
}

impl PageMap {
    /// An empty map, its first level sized for pages `0 .. pages_hint`.
    fn new(pages_hint: u64, counted_max: u32) -> Self {
        let n = pages_hint.min(TABLE_LIMIT_PAGES).div_ceil(CHUNK_LEN as u64) as usize;
        let mut chunks = Vec::with_capacity(n);
        chunks.resize_with(n, || Box::<[u32]>::from([]));
        PageMap {
            chunks,
            overflow: FxHashMap::default(),
            counted_max,
            counted: 0,
        }
    }

    /// The value of `page` (0: absent).
    #[inline]
    fn get(&self, page: u64) -> u32 {
        match self.chunks.get((page >> CHUNK_SHIFT) as usize) {
            Some(chunk) => chunk
                .get((page & CHUNK_MASK) as usize)
                .copied()
                .unwrap_or(0),
            None if page >= TABLE_LIMIT_PAGES && !self.overflow.is_empty() => {
                self.overflow.get(&page).copied().unwrap_or(0)
            }
            None => 0,
        }
    }

    /// Starts loading the entry of `page` into the CPU cache (a hint; no effect on contents).
    #[inline]
    fn prefetch(&self, page: u64) {
        let entry = self
            .chunks
            .get((page >> CHUNK_SHIFT) as usize)
            .and_then(|chunk| chunk.get((page & CHUNK_MASK) as usize));
        if let Some(entry) = entry {
            prefetch_read(entry);
        }
    }

    #[inline]
    fn is_counted(&self, value: u32) -> bool {
        value.wrapping_sub(1) < self.counted_max
    }

    /// Sets the value of `page` (0 removes it).
    #[inline]
    fn set(&mut self, page: u64, value: u32) {
        let old = if page >= TABLE_LIMIT_PAGES {
            if value == 0 {
                self.overflow.remove(&page)
            } else {
                self.overflow.insert(page, value)
            }
            .unwrap_or(0)
        } else {
            let hi = (page >> CHUNK_SHIFT) as usize;
            let lo = (page & CHUNK_MASK) as usize;
            match self.chunks.get_mut(hi).and_then(|c| c.get_mut(lo)) {
                Some(e) => std::mem::replace(e, value),
                None if value != 0 => {
                    self.set_slow(hi, lo, value);
                    0
                }
                None => 0,
            }
        };
        self.counted =
            self.counted + usize::from(self.is_counted(value)) - usize::from(self.is_counted(old));
    }

    #[cold]
    fn set_slow(&mut self, hi: usize, lo: usize, value: u32) {
        if hi >= self.chunks.len() {
            self.chunks.resize_with(hi + 1, || Box::<[u32]>::from([]));
        }
        let mut chunk = vec![0u32; CHUNK_LEN].into_boxed_slice();
        chunk[lo] = value;
        self.chunks[hi] = chunk;
    }

    /// Number of pages whose value is within `1..=counted_max`.
    fn counted(&self) -> usize {
        self.counted
    }
}

const F_RESIDENT: u8 = 1;
const F_DIRTY: u8 = 2;
const F_PINNED: u8 = 4;
const F_PREFETCHED: u8 = 8;

/// DRAM cache of 4 KiB pages.
pub struct Cache {
    sets: u32,
    ways: u32,
    /// `page & mask` is the set when the number of sets is a power of two.
    set_mask: Option<u64>,
    /// `slot >> shift` is the set when `ways` is a power of two.
    ways_shift: Option<u32>,
    /// Page → 0, slot + 1 or `capacity + 1` + ghost position (see the module docs).
    table: PageMap,
    /// Per slot: page, fill time, `F_*` flags (0: free), the policy's links
    /// and bits; a free slot's `next` is the next free slot of its set.
    frames: Vec<Frame>,
    /// First free slot of each set ([`NIL`]: none).
    free_head: Vec<u32>,
    policy: Policy,
    /// The ghost FIFOs, as many entries per set as the policy asks for
    /// (capped so that node numbers fit the page-table entries).
    ghosts: GhostQueues,
    resident: u64,
    pinned: u64,
    dirty: u64,
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("sets", &self.sets)
            .field("ways", &self.ways)
            .field("policy", &self.policy.kind())
            .field("resident", &self.resident)
            .field("pinned", &self.pinned)
            .field("dirty", &self.dirty)
            .finish_non_exhaustive()
    }
}

impl Cache {
    /// An empty cache for a device of `device_pages` pages.
    ///
    /// The geometry comes from [`CacheConfig::geometry`]; a capacity beyond
    /// 2^32 − 2 pages (which config validation rejects) is cut down to it. A
    /// cache of zero pages is allowed: every insert then bypasses it
    /// ([`Insert::SetFullyPinned`]).
    pub fn new(cfg: &CacheConfig, device_pages: u64) -> Self {
        let (sets, ways) = cfg.geometry();
        let max_slots = u64::from(u32::MAX - 1);
        let sets = sets.clamp(1, max_slots);
        let ways = ways.min(max_slots / sets);
        // All fit: sets <= 2^32 - 2 and ways <= (2^32 - 2) / sets.
        let (sets, ways) = (sets as u32, ways as u32);
        let capacity = sets * ways;

        // Each set's free list starts as its slots in ascending order.
        let frames: Vec<Frame> = (1..=capacity)
            .map(|next| Frame::free(if next % ways == 0 { NIL } else { next }))
            .collect();
        let free_head: Vec<u32> = (0..sets)
            .map(|set| if ways == 0 { NIL } else { set * ways })
            .collect();

        let policy = Policy::new(cfg.policy, &cfg.params, sets, ways);
        let ghosts = GhostQueues::new(sets, Self::ghosts_per_set(&policy, sets, capacity));
        Cache {
            sets,
            ways,
            set_mask: sets.is_power_of_two().then(|| u64::from(sets) - 1),
            ways_shift: ways.is_power_of_two().then(|| ways.trailing_zeros()),
            table: PageMap::new(device_pages, capacity),
            frames,
            free_head,
            ghosts,
            policy,
            resident: 0,
            pinned: 0,
            dirty: 0,
        }
    }

    /// A hint that `page` will be looked up soon: starts loading its
    /// page-table entry into the CPU cache so that the look-up does not wait
    /// on memory. Replay drivers call it a few accesses ahead.
    #[inline]
    pub fn prefetch_lookup(&self, page: u64) {
        self.table.prefetch(page);
    }

    /// A hint that `page` will be accessed very soon, issued after
    /// [`Cache::prefetch_lookup`] had time to bring its table entry in: if it
    /// is resident, starts loading its slot record and policy state; if it
    /// looks like a ghost, the ghost entry that the miss will remove; if not
    /// resident and the cache has more than one set, the policy's state of
    /// the set that the miss will evict from.
    #[inline]
    pub fn prefetch_slot_of(&self, page: u64) {
        let entry = self.table.get(page);
        if let Some(slot) = Self::resident_slot(entry, self.frames.len()) {
            prefetch_frame(&self.frames, slot);
            return;
        }
        if let Some(pos) = entry.checked_sub(self.frames.len() as u32 + 1) {
            self.ghosts.prefetch(pos);
        }
        if self.sets > 1 {
            self.policy.prefetch_set(self.set_of(page));
        }
    }

    /// A third hint, issued after [`Cache::prefetch_slot_of`] had time to
    /// bring the frame in: when the policy relinks a slot on a hit (LRU and
    /// kin), starts loading the frames of its list neighbours, which the
    /// relinking writes.
    #[inline]
    pub fn prefetch_neighbours_of(&self, page: u64) {
        if !self.policy.relinks_on_hit() {
            return;
        }
        let frame = self
            .lookup(page)
            .and_then(|slot| self.frames.get(slot as usize));
        if let Some(frame) = frame {
            prefetch_frame(&self.frames, frame.prev);
            prefetch_frame(&self.frames, frame.next);
        }
    }

    /// Slot holding `page`, if resident.
    #[inline]
    pub fn lookup(&self, page: u64) -> Option<SlotId> {
        Self::resident_slot(self.table.get(page), self.frames.len())
    }

    /// The slot a page-table entry names, if it names one (0 wraps around
    /// and ghost numbers are beyond the slots).
    #[inline]
    fn resident_slot(entry: u32, capacity: usize) -> Option<SlotId> {
        let slot = entry.wrapping_sub(1);
        ((slot as usize) < capacity).then_some(slot)
    }

    /// State of a resident slot (of a free slot: an all-false state of page 0).
    ///
    /// # Panics
    /// If `slot` is not below [`Cache::capacity_pages`].
    #[inline]
    pub fn state(&self, slot: SlotId) -> SlotState {
        let frame = self.frames[slot as usize];
        let flags = frame.flags;
        SlotState {
            page: frame.page,
            ready_at_ns: frame.ready_at_ns,
            dirty: flags & F_DIRTY != 0,
            pinned: flags & F_PINNED != 0,
            prefetched_unused: flags & F_PREFETCHED != 0,
        }
    }

    /// Tells the policy about a (visible) hit on `slot`.
    ///
    /// A pinned or free slot is outside the policy's view: nothing happens.
    /// Always inlined: it is on every visible hit, and with three callers
    /// (the device's page path, the write log's, references) the compiler
    /// stopped inlining it.
    #[inline(always)]
    pub fn record_hit(&mut self, slot: SlotId) {
        let flags = self.frames.get(slot as usize).map_or(0, |f| f.flags);
        if flags & (F_RESIDENT | F_PINNED) == F_RESIDENT {
            let set = self.set_of_slot(slot);
            self.policy.on_hit(&mut self.frames, set, slot);
        }
    }

    /// The policy's [`EvictionPolicy::settling_hits`].
    pub fn settling_hits(&self) -> Option<u32> {
        self.policy.settling_hits()
    }

    /// Whether [`Cache::record_hit`] on `slot` now would change nothing a
    /// later decision depends on: a slot outside the policy's view (not
    /// resident, or pinned) or one the policy calls settled
    /// ([`EvictionPolicy::hit_settled`]).
    #[inline]
    pub fn hit_settled(&self, slot: SlotId) -> bool {
        let flags = self.frames.get(slot as usize).map_or(0, |f| f.flags);
        if flags & (F_RESIDENT | F_PINNED) != F_RESIDENT {
            return true;
        }
        let set = self.set_of_slot(slot);
        self.policy.hit_settled(&self.frames, set, slot)
    }

    /// Places a non-resident page, evicting a victim chosen by the policy if the set is full.
    ///
    /// The new page enters the policy's view (unpinned). If `page` is
    /// already resident, nothing is evicted or reordered: its slot is
    /// returned and `dirty` is OR-ed into its state.
    pub fn insert(&mut self, page: u64, ready_at_ns: u64, dirty: bool, prefetched: bool) -> Insert {
        let entry = self.table.get(page);
        if let Some(slot) = Self::resident_slot(entry, self.frames.len()) {
            if dirty {
                self.set_dirty(slot, true);
            }
            return Insert::Placed {
                slot,
                evicted: None,
            };
        }
        let set = self.set_of(page);
        let head = self.free_head[set as usize];
        if head == NIL && self.policy.tracked(set) == 0 {
            // Every way pinned: the page is not placed and its ghost stays.
            return Insert::SetFullyPinned;
        }
        // A ghost hit removes the ghost before the eviction that makes room
        // (which may push a new one), as libCacheSim's find-then-evict does.
        let from_ghost = match self.ghost_position(page, entry) {
            Some(pos) => {
                self.ghosts.remove(set, pos);
                true
            }
            None => false,
        };
        let (slot, evicted) = if head != NIL {
            self.free_head[set as usize] = self.frames[head as usize].next;
            (head, None)
        } else {
            let Some(victim) = self.policy.evict(&mut self.frames, set) else {
                return Insert::SetFullyPinned;
            };
            let ghost = if victim.remember {
                let page = self.frames[victim.slot as usize].page;
                self.push_ghost(set, page)
            } else {
                0
            };
            let evicted = self.release(victim.slot, ghost);
            (victim.slot, Some(evicted))
        };
        let mut flags = F_RESIDENT;
        if dirty {
            flags |= F_DIRTY;
            self.dirty += 1;
        }
        if prefetched {
            flags |= F_PREFETCHED;
        }
        let frame = &mut self.frames[slot as usize];
        frame.page = page;
        frame.ready_at_ns = ready_at_ns;
        frame.flags = flags;
        self.resident += 1;
        self.table.set(page, slot + 1);
        self.policy
            .on_insert(&mut self.frames, set, slot, page, from_ghost);
        // After the insert, which may change the queue the next eviction
        // takes from (S3-FIFO's ghost hits grow M).
        if evicted.is_some() {
            self.prefetch_upcoming_victims(set);
        }
        Insert::Placed { slot, evicted }
    }

    /// Under a stream of misses the next victims are predictable: start
    /// loading what evicting them will touch (the first one's page-table
    /// entry, the second one's frame), so that the next evictions do not
    /// each stall on memory. Only a hint.
    #[inline]
    fn prefetch_upcoming_victims(&self, set: u32) {
        let [first, second] = self.policy.upcoming_victims(&self.frames, set);
        if let Some(slot) = second {
            prefetch_frame(&self.frames, slot);
        }
        if let Some(frame) = first.and_then(|slot| self.frames.get(slot as usize)) {
            self.table.prefetch(frame.page);
        }
    }

    /// Ghost entries per set for `policy`: its wish, capped so that every
    /// ring position fits a page-table entry above the slots.
    fn ghosts_per_set(policy: &Policy, sets: u32, capacity: u32) -> u32 {
        let room = u64::from(u32::MAX - 1 - capacity).min(ghost::MAX_POSITIONS);
        let wish = policy.ghost_capacity();
        if GhostQueues::positions(sets, wish) <= room {
            wish
        } else {
            // Below `wish`, a u32.
            (room / 2 / u64::from(sets)) as u32
        }
    }

    /// The ghost position holding `page`, whose table entry is `entry`, if any.
    #[inline]
    fn ghost_position(&self, page: u64, entry: u32) -> Option<u32> {
        let pos = entry.checked_sub(self.frames.len() as u32 + 1)?;
        self.ghosts.holds(pos, page).then_some(pos)
    }

    /// Remembers `page` (a victim of `set`) in the set's ghost FIFO; returns
    /// its page-table entry (0 when the policy keeps no ghosts).
    #[inline]
    fn push_ghost(&mut self, set: u32, page: u64) -> u32 {
        let first = self.frames.len() as u32 + 1;
        let table = &mut self.table;
        let pushed = self
            .ghosts
            .push(set, page, |moved, pos| table.set(moved, first + pos));
        let Some((pos, pushed_out)) = pushed else {
            return 0;
        };
        // Stale entries are harmless in the table but would pile up in the
        // overflow map: drop those.
        if let Some((old, old_pos)) = pushed_out.filter(|&(p, _)| p >= TABLE_LIMIT_PAGES) {
            if self.table.get(old) == first + old_pos {
                self.table.set(old, 0);
            }
        }
        first + pos
    }

    /// Marks a slot dirty.
    ///
    /// No effect on a free slot.
    #[inline]
    pub fn set_dirty(&mut self, slot: SlotId, dirty: bool) {
        let Some(frame) = self.frames.get_mut(slot as usize) else {
            return;
        };
        let f = frame.flags;
        if f & F_RESIDENT == 0 || (f & F_DIRTY != 0) == dirty {
            return;
        }
        if dirty {
            frame.flags = f | F_DIRTY;
            self.dirty += 1;
        } else {
            frame.flags = f & !F_DIRTY;
            self.dirty -= 1;
        }
    }

    /// Clears the prefetched-unused flag (first demand use).
    #[inline]
    pub fn mark_used(&mut self, slot: SlotId) {
        if let Some(frame) = self.frames.get_mut(slot as usize) {
            frame.flags &= !F_PREFETCHED;
        }
    }

    /// Pins a resident slot (removes it from the policy's view).
    ///
    /// No effect on a free or already pinned slot.
    pub fn pin(&mut self, slot: SlotId) {
        let Some(frame) = self.frames.get_mut(slot as usize) else {
            return;
        };
        if frame.flags & (F_RESIDENT | F_PINNED) != F_RESIDENT {
            return;
        }
        frame.flags |= F_PINNED;
        self.pinned += 1;
        let set = self.set_of_slot(slot);
        self.policy.on_remove(&mut self.frames, set, slot);
    }

    /// Unpins a slot (hands it back to the policy as a fresh insertion).
    ///
    /// No effect on a free or unpinned slot.
    pub fn unpin(&mut self, slot: SlotId) {
        let Some(frame) = self.frames.get_mut(slot as usize) else {
            return;
        };
        if frame.flags & (F_RESIDENT | F_PINNED) != F_RESIDENT | F_PINNED {
            return;
        }
        frame.flags &= !F_PINNED;
        let page = frame.page;
        self.pinned -= 1;
        let set = self.set_of_slot(slot);
        self.policy
            .on_insert(&mut self.frames, set, slot, page, false);
    }

    /// Removes `page` (explicit eviction), pinned or not.
    ///
    /// The policy records no ghost for it. `None` if it was not resident.
    pub fn remove(&mut self, page: u64) -> Option<Evicted> {
        let slot = self.lookup(page)?;
        let set = self.set_of_slot(slot);
        if self.frames[slot as usize].flags & F_PINNED == 0 {
            self.policy.on_remove(&mut self.frames, set, slot);
        }
        let evicted = self.release(slot, 0);
        self.frames[slot as usize].next = self.free_head[set as usize];
        self.free_head[set as usize] = slot;
        Some(evicted)
    }

    /// Switches policy, keeping every resident page.
    ///
    /// The new policy (built with `params`) receives each set's unpinned
    /// resident slots as fresh insertions, in the order the old policy would
    /// have evicted them (first victim first), so the new one starts with
    /// the old one's recency order as far as it can represent it. The ghost
    /// FIFOs are kept: a policy with ghosts sees the newest pages the
    /// previous one remembered (as many as its own ghost capacity).
    /// O(capacity + ghosts).
    pub fn set_policy(&mut self, kind: PolicyKind, params: &PolicyParams) {
        let new = Policy::new(kind, params, self.sets, self.ways);
        let per_set = Self::ghosts_per_set(&new, self.sets, self.frames.len() as u32);
        let mut old = std::mem::replace(&mut self.policy, new);
        let mut order = Vec::with_capacity(self.ways as usize);
        // Set by set: the old policy's links of the other sets stay intact
        // in the shared frames until their turn.
        for set in 0..self.sets {
            order.clear();
            old.drain_set(&mut self.frames, set, &mut order);
            for &slot in &order {
                let page = self.frames[slot as usize].page;
                self.policy
                    .on_insert(&mut self.frames, set, slot, page, false);
            }
        }
        let old_ghosts = std::mem::replace(&mut self.ghosts, GhostQueues::new(self.sets, per_set));
        if old_ghosts.is_empty() {
            return;
        }
        let first = self.frames.len() as u32 + 1;
        for set in 0..self.sets {
            let entries = old_ghosts.entries(set);
            let keep = entries.len().saturating_sub(per_set as usize);
            for &(pos, page) in &entries {
                if self.table.get(page) == first + pos {
                    self.table.set(page, 0);
                }
            }
            for &(_, page) in &entries[keep..] {
                let entry = self.push_ghost(set, page);
                self.table.set(page, entry);
            }
        }
    }

    /// Current policy.
    pub fn policy(&self) -> PolicyKind {
        self.policy.kind()
    }

    /// Capacity in pages.
    pub fn capacity_pages(&self) -> u64 {
        u64::from(self.sets) * u64::from(self.ways)
    }

    /// Resident pages.
    pub fn resident_pages(&self) -> u64 {
        self.resident
    }

    /// Pinned pages.
    pub fn pinned_pages(&self) -> u64 {
        self.pinned
    }

    /// Dirty pages.
    pub fn dirty_pages(&self) -> u64 {
        self.dirty
    }

    /// Slots holding dirty pages, in slot order.
    pub fn dirty_slots(&self) -> Vec<SlotId> {
        self.slots_with(F_RESIDENT | F_DIRTY).collect()
    }

    /// Number of sets (1 when fully associative).
    pub fn sets(&self) -> u32 {
        self.sets
    }

    /// Slots per set (the capacity when fully associative).
    pub fn ways(&self) -> u32 {
        self.ways
    }

    /// The set `page` maps to: `page % sets`.
    #[inline]
    pub fn set_of(&self, page: u64) -> u32 {
        match self.set_mask {
            Some(mask) => (page & mask) as u32,
            // The remainder is below `sets`, a u32.
            None => (page % u64::from(self.sets)) as u32,
        }
    }

    /// The set that owns `slot`: `slot / ways`.
    #[inline]
    pub fn set_of_slot(&self, slot: SlotId) -> u32 {
        if self.sets == 1 {
            0
        } else {
            match self.ways_shift {
                Some(shift) => slot >> shift,
                None => slot / self.ways,
            }
        }
    }

    /// Every resident page, in slot order.
    pub fn resident_page_list(&self) -> Vec<u64> {
        self.slots_with(F_RESIDENT)
            .map(|s| self.frames[s as usize].page)
            .collect()
    }

    /// Slots whose flags include all of `mask`, in slot order.
    fn slots_with(&self, mask: u8) -> impl Iterator<Item = SlotId> + '_ {
        self.frames
            .iter()
            .enumerate()
            .filter(move |(_, f)| f.flags & mask == mask)
            .map(|(i, _)| i as SlotId)
    }

    /// Checks the internal invariants (for tests; O(capacity + ghosts)):
    /// the page table and the slots agree, the counters match the slots,
    /// every resident page sits in its set, the free lists hold exactly the
    /// free slots, the policy tracks exactly the resident unpinned slots of
    /// each set, and every ghost FIFO entry is a page of its set whose
    /// table entry names it. Returns what is wrong.
    pub fn check_invariants(&self) -> Result<(), String> {
        let (mut resident, mut pinned, mut dirty) = (0u64, 0u64, 0u64);
        for (i, s) in self.frames.iter().enumerate() {
            let (f, page) = (s.flags, s.page);
            if f & F_RESIDENT == 0 {
                if f != 0 {
                    return Err(format!("free slot {i} has flags {f:#x}"));
                }
                continue;
            }
            resident += 1;
            pinned += u64::from(f & F_PINNED != 0);
            dirty += u64::from(f & F_DIRTY != 0);
            if self.lookup(page) != Some(i as SlotId) {
                return Err(format!(
                    "page {page} of slot {i} maps to {:?}",
                    self.lookup(page)
                ));
            }
            if self.set_of(page) != self.set_of_slot(i as SlotId) {
                return Err(format!("page {page} sits in slot {i} of the wrong set"));
            }
        }
        if (resident, pinned, dirty) != (self.resident, self.pinned, self.dirty) {
            return Err(format!(
                "counters (resident, pinned, dirty) = {:?}, slots say {:?}",
                (self.resident, self.pinned, self.dirty),
                (resident, pinned, dirty)
            ));
        }
        let mapped = self.table.counted() as u64;
        if mapped != resident {
            return Err(format!("{mapped} pages mapped, {resident} resident"));
        }
        for set in 0..self.sets {
            let first = set as usize * self.ways as usize;
            let frames = &self.frames[first..first + self.ways as usize];
            let free = frames.iter().filter(|f| f.flags & F_RESIDENT == 0).count();
            let unpinned = frames
                .iter()
                .filter(|f| f.flags & (F_RESIDENT | F_PINNED) == F_RESIDENT)
                .count();
            let mut listed = 0;
            let mut cur = self.free_head[set as usize];
            while cur != NIL {
                if listed > free || self.set_of_slot(cur) != set {
                    return Err(format!("free list of set {set} is corrupt"));
                }
                if self.frames[cur as usize].flags & F_RESIDENT != 0 {
                    return Err(format!("resident slot {cur} is on the free list"));
                }
                listed += 1;
                cur = self.frames[cur as usize].next;
            }
            if listed != free {
                return Err(format!("set {set}: {free} free slots, {listed} listed"));
            }
            let tracked = self.policy.tracked(set) as usize;
            if tracked != unpinned {
                return Err(format!(
                    "set {set}: policy tracks {tracked} slots, {unpinned} are resident and unpinned"
                ));
            }
            for (pos, page) in self.ghosts.entries(set) {
                if self.set_of(page) != set {
                    return Err(format!("ghost page {page} sits in set {set}"));
                }
                if self.ghost_position(page, self.table.get(page)) != Some(pos) {
                    return Err(format!(
                        "ghost page {page} of set {set} is not mapped to it"
                    ));
                }
            }
        }
        self.ghosts.check()
    }

    /// Unmaps a resident slot and clears it, leaving `entry` (0 or a ghost)
    /// in the page table; the caller has already taken the slot out of the
    /// policy's view and decides where it goes.
    #[inline]
    fn release(&mut self, slot: SlotId, entry: u32) -> Evicted {
        let frame = &mut self.frames[slot as usize];
        let (page, flags) = (frame.page, frame.flags);
        frame.flags = 0;
        debug_assert!(flags & F_RESIDENT != 0, "releasing a free slot");
        self.resident -= 1;
        if flags & F_DIRTY != 0 {
            self.dirty -= 1;
        }
        if flags & F_PINNED != 0 {
            self.pinned -= 1;
        }
        self.table.set(page, entry);
        Evicted {
            page,
            dirty: flags & F_DIRTY != 0,
            prefetched_unused: flags & F_PREFETCHED != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DeviceConfig;

    fn cfg(size_pages: u64, ways: u32, policy: PolicyKind) -> CacheConfig {
        let mut c = DeviceConfig::default().cache;
        c.size_bytes = size_pages * crate::PAGE_SIZE;
        c.ways = ways;
        c.policy = policy;
        c
    }

    fn placed(r: Insert) -> (SlotId, Option<Evicted>) {
        match r {
            Insert::Placed { slot, evicted } => (slot, evicted),
            Insert::SetFullyPinned => panic!("set fully pinned"),
        }
    }

    #[test]
    fn insert_lookup_remove_and_counters() {
        let mut c = Cache::new(&cfg(4, 0, PolicyKind::Lru), 1 << 20);
        assert_eq!((c.sets(), c.ways(), c.capacity_pages()), (1, 4, 4));
        let (s, ev) = placed(c.insert(7, 100, true, false));
        assert_eq!(ev, None);
        assert_eq!(c.lookup(7), Some(s));
        assert_eq!(
            c.state(s),
            SlotState {
                page: 7,
                ready_at_ns: 100,
                dirty: true,
                pinned: false,
                prefetched_unused: false
            }
        );
        let (s2, _) = placed(c.insert(9, 0, false, true));
        assert!(c.state(s2).prefetched_unused);
        c.mark_used(s2);
        assert!(!c.state(s2).prefetched_unused);
        assert_eq!((c.resident_pages(), c.dirty_pages()), (2, 1));
        c.set_dirty(s2, true);
        c.set_dirty(s2, true);
        assert_eq!(c.dirty_pages(), 2);
        let mut dirty = vec![s, s2];
        dirty.sort_unstable();
        assert_eq!(c.dirty_slots(), dirty);
        c.pin(s);
        c.pin(s);
        assert_eq!(c.pinned_pages(), 1);
        c.check_invariants().unwrap();
        let ev = c.remove(7).unwrap();
        assert_eq!(
            ev,
            Evicted {
                page: 7,
                dirty: true,
                prefetched_unused: false
            }
        );
        assert_eq!(
            (c.resident_pages(), c.pinned_pages(), c.dirty_pages()),
            (1, 0, 1)
        );
        assert_eq!(c.lookup(7), None);
        assert_eq!(c.remove(7), None);
        c.check_invariants().unwrap();
        // Re-inserting a resident page changes nothing but the dirty bit.
        c.set_dirty(s2, false);
        let (again, ev) = placed(c.insert(9, 5, true, false));
        assert_eq!((again, ev), (s2, None));
        assert!(c.state(s2).dirty);
        c.check_invariants().unwrap();
    }

    #[test]
    fn huge_and_out_of_table_pages() {
        let mut c = Cache::new(&cfg(4, 0, PolicyKind::Fifo), 16);
        for p in [0, 1 << 20, (1 << 34) + 3, u64::MAX] {
            placed(c.insert(p, 0, false, false));
            assert!(c.lookup(p).is_some(), "{p}");
        }
        let (_, ev) = placed(c.insert(5, 0, false, false));
        assert_eq!(ev.unwrap().page, 0);
        let (_, ev) = placed(c.insert(6, 0, false, false));
        assert_eq!(ev.unwrap().page, 1 << 20);
        let (_, ev) = placed(c.insert(7, 0, false, false));
        assert_eq!(ev.unwrap().page, (1 << 34) + 3);
        assert_eq!(c.lookup((1 << 34) + 3), None);
        assert!(c.lookup(u64::MAX).is_some());
        c.check_invariants().unwrap();
    }

    #[test]
    fn fully_pinned_set_bypasses() {
        let mut c = Cache::new(&cfg(4, 2, PolicyKind::S3Fifo), 64);
        assert_eq!((c.sets(), c.ways()), (2, 2));
        let (a, _) = placed(c.insert(0, 0, false, false));
        let (b, _) = placed(c.insert(2, 0, false, false));
        c.pin(a);
        c.pin(b);
        assert_eq!(c.insert(4, 0, false, false), Insert::SetFullyPinned);
        // The other set is unaffected.
        placed(c.insert(1, 0, false, false));
        c.unpin(b);
        let (slot, ev) = placed(c.insert(4, 0, false, false));
        assert_eq!((slot, ev.map(|e| e.page)), (b, Some(2)));
        c.check_invariants().unwrap();
        let mut empty = Cache::new(&cfg(0, 0, PolicyKind::Lru), 64);
        assert_eq!(empty.capacity_pages(), 0);
        assert_eq!(empty.insert(1, 0, false, false), Insert::SetFullyPinned);
        empty.check_invariants().unwrap();
    }

    #[test]
    fn non_power_of_two_geometry() {
        let mut c = Cache::new(&cfg(15, 3, PolicyKind::Clock), 1000);
        assert_eq!((c.sets(), c.ways()), (5, 3));
        for p in 0..200 {
            if let Some(s) = c.lookup(p % 37) {
                c.record_hit(s);
            } else {
                placed(c.insert(p % 37, 0, p % 3 == 0, false));
            }
        }
        for p in 0..37 {
            if let Some(s) = c.lookup(p) {
                assert_eq!(c.set_of_slot(s), (p % 5) as u32);
            }
        }
        c.check_invariants().unwrap();
    }

    /// Accesses `pages` the device's way (lookup → hit, else insert) and
    /// returns the evicted page of each miss (`None`: hit or free slot).
    fn trace(c: &mut Cache, pages: &[u64]) -> Vec<Option<u64>> {
        pages
            .iter()
            .map(|&p| match c.lookup(p) {
                Some(s) => {
                    c.record_hit(s);
                    None
                }
                None => placed(c.insert(p, 0, false, false)).1.map(|e| e.page),
            })
            .collect()
    }

    fn is_ghost(c: &Cache, page: u64) -> bool {
        c.ghost_position(page, c.table.get(page)).is_some()
    }

    #[test]
    fn ghosts_live_in_the_page_table() {
        // S3-FIFO, 4 ways, default ratios: S 1, M 3, G ⌊3.6⌋ = 3.
        let mut c = Cache::new(&cfg(4, 0, PolicyKind::S3Fifo), 64);
        assert_eq!(c.ghosts.capacity(), 3);
        // 1 → S; 2 3 4 → M (S full before the first eviction); 5 6 7 each
        // evict S's one-hit tail: 1, 5, 6 become ghosts.
        trace(&mut c, &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(c.lookup(1), None);
        assert_eq!(c.remove(1), None);
        assert!(is_ghost(&c, 1) && is_ghost(&c, 5) && is_ghost(&c, 6));
        assert!(!is_ghost(&c, 2) && !is_ghost(&c, 7) && !is_ghost(&c, 8));
        c.check_invariants().unwrap();
        // A policy without ghosts has none; switching keeps the newest ones,
        // as many as the new policy holds (2Q: 2 of 4 ways).
        c.set_policy(PolicyKind::TwoQ, &PolicyParams::default());
        assert_eq!(c.ghosts.capacity(), 2);
        assert!(!is_ghost(&c, 1) && is_ghost(&c, 5) && is_ghost(&c, 6));
        c.check_invariants().unwrap();
        c.set_policy(PolicyKind::Fifo, &PolicyParams::default());
        assert_eq!(c.ghosts.capacity(), 0);
        assert!(!is_ghost(&c, 5) && !is_ghost(&c, 6));
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_ghost_hit_removes_the_entry_and_stale_entries_are_not_ghosts() {
        let mut c = Cache::new(&cfg(4, 0, PolicyKind::S3Fifo), 64);
        // Ghosts 1 5 6 (oldest first), as above. 1 comes back: a ghost hit,
        // it leaves G (5 6) and enters M, evicting S's tail 7 into G
        // (5 6 7): nothing was pushed out, since the hit made room.
        trace(&mut c, &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(trace(&mut c, &[1]), vec![Some(7)]);
        assert!(c.lookup(1).is_some());
        let ghosts: Vec<u64> = c.ghosts.entries(0).iter().map(|&(_, p)| p).collect();
        assert_eq!(ghosts, vec![5, 6, 7]);
        c.check_invariants().unwrap();
        // 8: M (1 4 3 2) is over its capacity of 3, so M's tail 2
        // (frequency 0) goes, without a ghost.
        assert_eq!(trace(&mut c, &[8]), vec![Some(2)]);
        // 9 10 11: S's tail each time → G pushes out 5, 6, 7 in turn.
        trace(&mut c, &[9, 10, 11]);
        let ghosts: Vec<u64> = c.ghosts.entries(0).iter().map(|&(_, p)| p).collect();
        assert_eq!(ghosts, vec![8, 9, 10]);
        // 5's entry still names its old position, now empty: not a ghost.
        assert!(c.table.get(5) > 4 && !is_ghost(&c, 5));
        c.check_invariants().unwrap();
    }

    #[test]
    fn ghosts_of_pages_beyond_the_table() {
        // Pages from 2^34 up live in the overflow map; their ghosts work the
        // same, and a page pushed out of G leaves the map.
        let base = 1u64 << 40;
        let mut c = Cache::new(&cfg(4, 0, PolicyKind::S3Fifo), 64);
        let pages: Vec<u64> = (0..40).map(|i| base + i).collect();
        trace(&mut c, &pages);
        // 4 residents + 3 ghosts.
        assert_eq!(c.table.overflow.len(), 7);
        assert!(is_ghost(&c, base + 37) && !is_ghost(&c, base + 30));
        // A ghost hit: the page comes back into M.
        trace(&mut c, &[base + 37]);
        assert!(c.lookup(base + 37).is_some());
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_fully_pinned_set_keeps_the_ghost() {
        let mut c = Cache::new(&cfg(4, 0, PolicyKind::S3Fifo), 64);
        trace(&mut c, &[1, 2, 3, 4, 5]);
        assert!(is_ghost(&c, 1));
        for p in [2, 3, 4, 5] {
            let s = c.lookup(p).unwrap();
            c.pin(s);
        }
        assert_eq!(c.insert(1, 0, false, false), Insert::SetFullyPinned);
        assert!(is_ghost(&c, 1));
        c.check_invariants().unwrap();
    }
}
