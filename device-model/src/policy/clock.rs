//! CLOCK (second chance).

use super::list::SlotLists;
use super::PolicyKind;
use super::{EvictionPolicy, Victim};
use crate::slot::SlotId;

/// CLOCK / second chance with one reference bit per slot (libCacheSim
/// `Clock` with a 1-bit counter). Slots sit on a per-set FIFO standing in for
/// the ring: the back is under the hand. New slots enter unreferenced; a hit
/// sets the bit; the victim search looks at the back: referenced → clear the
/// bit and move it to the front (the hand advances past it), else evict.
#[derive(Debug, Clone)]
pub struct Clock {
    lists: SlotLists,
    referenced: Vec<bool>,
}

impl Clock {
    /// Empty CLOCK for `sets` sets of `ways` slots.
    pub fn new(sets: u32, ways: u32) -> Self {
        let slots = sets as usize * ways as usize;
        Clock {
            lists: SlotLists::new(slots, sets as usize),
            referenced: vec![false; slots],
        }
    }
}

impl EvictionPolicy for Clock {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Clock
    }
    #[inline]
    fn on_insert(&mut self, set: u32, slot: SlotId, _page: u64, _from_ghost: bool) {
        self.referenced[slot as usize] = false;
        self.lists.push_front(set as usize, slot);
    }
    #[inline]
    fn on_hit(&mut self, _set: u32, slot: SlotId) {
        self.referenced[slot as usize] = true;
    }
    #[inline]
    fn on_remove(&mut self, set: u32, slot: SlotId) {
        self.lists.unlink(set as usize, slot);
    }
    fn evict(&mut self, set: u32) -> Option<Victim> {
        let list = set as usize;
        // Terminates: every pass either evicts or clears one bit.
        loop {
            let slot = self.lists.back(list)?;
            let r = &mut self.referenced[slot as usize];
            if *r {
                *r = false;
                self.lists.move_to_front(list, slot);
            } else {
                self.lists.unlink(list, slot);
                return Some(Victim::plain(slot));
            }
        }
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
