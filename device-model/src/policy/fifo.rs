//! FIFO and LIFO: one insertion-ordered list per set; hits change nothing.

use super::list::SlotLists;
use super::{EvictionPolicy, Victim};
use crate::cache::SlotId;
use crate::config::PolicyKind;

/// First in, first out: evicts the slot inserted longest ago. Hits are
/// ignored (libCacheSim `FIFO`).
#[derive(Debug, Clone)]
pub struct Fifo {
    lists: SlotLists,
}

impl Fifo {
    /// Empty FIFO for `sets` sets of `ways` slots.
    pub fn new(sets: u32, ways: u32) -> Self {
        Fifo {
            lists: SlotLists::new(sets as usize * ways as usize, sets as usize),
        }
    }
}

impl EvictionPolicy for Fifo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Fifo
    }
    #[inline]
    fn on_insert(&mut self, set: u32, slot: SlotId, _page: u64, _from_ghost: bool) {
        self.lists.push_front(set as usize, slot);
    }
    #[inline]
    fn on_hit(&mut self, _set: u32, _slot: SlotId) {}
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

/// Last in, first out: evicts the slot inserted most recently (Cylon's LIFO,
/// which keeps the head of a strided scan resident). Hits are ignored.
#[derive(Debug, Clone)]
pub struct Lifo {
    lists: SlotLists,
}

impl Lifo {
    /// Empty LIFO for `sets` sets of `ways` slots.
    pub fn new(sets: u32, ways: u32) -> Self {
        Lifo {
            lists: SlotLists::new(sets as usize * ways as usize, sets as usize),
        }
    }
}

impl EvictionPolicy for Lifo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lifo
    }
    #[inline]
    fn on_insert(&mut self, set: u32, slot: SlotId, _page: u64, _from_ghost: bool) {
        self.lists.push_front(set as usize, slot);
    }
    #[inline]
    fn on_hit(&mut self, _set: u32, _slot: SlotId) {}
    #[inline]
    fn on_remove(&mut self, set: u32, slot: SlotId) {
        self.lists.unlink(set as usize, slot);
    }
    #[inline]
    fn evict(&mut self, set: u32) -> Option<Victim> {
        self.lists.pop_front(set as usize).map(Victim::plain)
    }
    fn tracked(&self, set: u32) -> u32 {
        self.lists.len(set as usize)
    }
}
