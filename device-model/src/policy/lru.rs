//! Least recently used.

use super::list::SlotLists;
use super::{EvictionPolicy, Victim};
use crate::cache::SlotId;
use crate::config::PolicyKind;

/// Least recently used: one recency list per set; a hit moves the slot to
/// the MRU end, the victim is the LRU end (libCacheSim `LRU`).
#[derive(Debug, Clone)]
pub struct Lru {
    lists: SlotLists,
}

impl Lru {
    /// Empty LRU for `sets` sets of `ways` slots.
    pub fn new(sets: u32, ways: u32) -> Self {
        Lru {
            lists: SlotLists::new(sets as usize * ways as usize, sets as usize),
        }
    }
}

impl EvictionPolicy for Lru {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lru
    }
    #[inline]
    fn on_insert(&mut self, set: u32, slot: SlotId, _page: u64, _from_ghost: bool) {
        self.lists.push_front(set as usize, slot);
    }
    #[inline]
    fn on_hit(&mut self, set: u32, slot: SlotId) {
        self.lists.move_to_front(set as usize, slot);
    }
    #[inline]
    fn on_remove(&mut self, set: u32, slot: SlotId) {
        self.lists.unlink(set as usize, slot);
    }
    #[inline]
    fn evict(&mut self, set: u32) -> Option<Victim> {
        self.lists.pop_back(set as usize).map(Victim::plain)
    }
    #[inline]
    fn upcoming_victims(&self, set: u32) -> [Option<SlotId>; 2] {
        self.lists.back_two(set as usize)
    }
    #[inline]
    fn prefetch_slot(&self, slot: SlotId) {
        self.lists.prefetch_link(slot);
    }
    fn tracked(&self, set: u32) -> u32 {
        self.lists.len(set as usize)
    }
}
