//! S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
//! SOSP'23; libCacheSim `S3FIFO`).

use super::list::SlotLists;
use super::{share, EvictionPolicy, Victim};
use super::{PolicyKind, PolicyParams};
use crate::slot::SlotId;

const FREQ_MASK: u8 = 0b011;
const FREQ_MAX: u8 = 3;
const IN_MAIN: u8 = 0b100;

/// S3-FIFO, per set: a small FIFO S (target `small_ratio` of the set's ways,
/// at least 1), a main FIFO M and a ghost FIFO G of evicted page numbers
/// (capacity: the ways left to M; kept by the cache, see [`crate::policy`]).
/// Each slot has a 2-bit frequency, bumped on hits and capped at 3.
///
/// Miss: a page found in G enters M (and leaves G), any other enters S, with
/// frequency 0. Evict: while |S| ≥ target (or M is empty), look at S's tail:
/// frequency ≥ `move_to_main_threshold` → move it to M with frequency 0,
/// else evict it and ghost its page. Otherwise take M's tail: frequency > 0
/// → reinsert at M's head with frequency − 1, else evict it.
///
/// Deviation from the paper / libCacheSim: one call frees exactly one slot;
/// moving a page from S to M never triggers a nested eviction from M (the
/// loop re-checks |S| against its target instead), and M has no hard size
/// limit of its own (S and M share the set's ways).
#[derive(Debug, Clone)]
pub struct S3Fifo {
    /// Lists `2 * set` (small) and `2 * set + 1` (main).
    lists: SlotLists,
    /// Per slot: frequency in bits 0-1, [`IN_MAIN`] in bit 2.
    state: Vec<u8>,
    small_target: u32,
    ghost_capacity: u32,
    threshold: u8,
}

impl S3Fifo {
    /// Empty S3-FIFO for `sets` sets of `ways` slots.
    pub fn new(sets: u32, ways: u32, params: &PolicyParams) -> Self {
        let slots = sets as usize * ways as usize;
        let small_target = share(ways, params.s3fifo_small_ratio, 1);
        S3Fifo {
            lists: SlotLists::new(slots, 2 * sets as usize),
            state: vec![0; slots],
            small_target,
            ghost_capacity: ways - small_target,
            threshold: params.s3fifo_move_to_main_threshold,
        }
    }

    #[inline]
    fn small(set: u32) -> usize {
        2 * set as usize
    }

    #[inline]
    fn main(set: u32) -> usize {
        2 * set as usize + 1
    }

    #[inline]
    fn list_of(&self, set: u32, slot: SlotId) -> usize {
        if self.state[slot as usize] & IN_MAIN != 0 {
            Self::main(set)
        } else {
            Self::small(set)
        }
    }
}

impl EvictionPolicy for S3Fifo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::S3Fifo
    }

    fn ghost_capacity(&self) -> u32 {
        self.ghost_capacity
    }

    #[inline]
    fn on_insert(&mut self, set: u32, slot: SlotId, _page: u64, from_ghost: bool) {
        if from_ghost {
            self.state[slot as usize] = IN_MAIN;
            self.lists.push_front(Self::main(set), slot);
        } else {
            self.state[slot as usize] = 0;
            self.lists.push_front(Self::small(set), slot);
        }
    }

    #[inline]
    fn on_hit(&mut self, _set: u32, slot: SlotId) {
        let s = &mut self.state[slot as usize];
        if *s & FREQ_MASK < FREQ_MAX {
            *s += 1;
        }
    }

    #[inline]
    fn on_remove(&mut self, set: u32, slot: SlotId) {
        let list = self.list_of(set, slot);
        self.lists.unlink(list, slot);
    }

    fn evict(&mut self, set: u32) -> Option<Victim> {
        let (small, main) = (Self::small(set), Self::main(set));
        // Terminates: each pass evicts, moves one slot from S to M (S only
        // shrinks), or lowers one frequency in M (bounded by 3 per slot).
        loop {
            let s_len = self.lists.len(small);
            if s_len > 0 && (s_len >= self.small_target || self.lists.len(main) == 0) {
                let slot = self.lists.back(small)?;
                self.lists.unlink(small, slot);
                let st = &mut self.state[slot as usize];
                if *st & FREQ_MASK >= self.threshold {
                    *st = IN_MAIN;
                    self.lists.push_front(main, slot);
                } else {
                    return Some(Victim::with_ghost(slot));
                }
            } else {
                let slot = self.lists.back(main)?;
                let st = &mut self.state[slot as usize];
                if *st & FREQ_MASK > 0 {
                    *st -= 1;
                    self.lists.move_to_front(main, slot);
                } else {
                    self.lists.unlink(main, slot);
                    return Some(Victim::plain(slot));
                }
            }
        }
    }

    #[inline]
    fn upcoming_victims(&self, set: u32) -> [Option<SlotId>; 2] {
        let (small, main) = (Self::small(set), Self::main(set));
        let s_len = self.lists.len(small);
        let from_small = s_len > 0 && (s_len >= self.small_target || self.lists.len(main) == 0);
        self.lists.back_two(if from_small { small } else { main })
    }
    #[inline]
    fn prefetch_slot(&self, slot: SlotId) {
        self.lists.prefetch_link(slot);
        if let Some(st) = self.state.get(slot as usize) {
            crate::slot::prefetch_read(st);
        }
    }
    fn tracked(&self, set: u32) -> u32 {
        self.lists.len(Self::small(set)) + self.lists.len(Self::main(set))
    }
}
