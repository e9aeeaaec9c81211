//! FIFO, LIFO and LRU: one ordered list per set, differing only in which end
//! is evicted and whether a hit reorders. One generic type, resolved at
//! compile time, so each keeps its own fast path.

use super::list::SlotLists;
use super::PolicyKind;
use super::{EvictionPolicy, Victim};
use crate::slot::{Frame, SlotId};

/// Discipline of an [`Ordered`] policy.
const FIFO: u8 = 0;
const LIFO: u8 = 1;
const LRU: u8 = 2;

/// One list per set, newest (or most recently used) at the front.
#[derive(Debug, Clone)]
pub struct Ordered<const DISCIPLINE: u8> {
    lists: SlotLists,
}

/// First in, first out: evicts the slot inserted longest ago; hits are
/// ignored (libCacheSim `FIFO`).
pub type Fifo = Ordered<FIFO>;
/// Last in, first out: evicts the slot inserted most recently (Cylon's LIFO,
/// which keeps the head of a strided scan resident); hits are ignored.
pub type Lifo = Ordered<LIFO>;
/// Least recently used: a hit moves the slot to the front, the victim is the
/// back (libCacheSim `LRU`).
pub type Lru = Ordered<LRU>;

impl<const DISCIPLINE: u8> Ordered<DISCIPLINE> {
    /// An empty policy for `sets` sets of `ways` slots.
    pub fn new(sets: u32, _ways: u32) -> Self {
        Ordered {
            lists: SlotLists::new(sets as usize),
        }
    }
}

impl<const DISCIPLINE: u8> EvictionPolicy for Ordered<DISCIPLINE> {
    fn kind(&self) -> PolicyKind {
        match DISCIPLINE {
            FIFO => PolicyKind::Fifo,
            LIFO => PolicyKind::Lifo,
            _ => PolicyKind::Lru,
        }
    }
    #[inline]
    fn on_insert(
        &mut self,
        frames: &mut [Frame],
        set: u32,
        slot: SlotId,
        _page: u64,
        _from_ghost: bool,
    ) {
        self.lists.push_front(frames, set as usize, slot);
    }
    #[inline]
    fn on_hit(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
        if DISCIPLINE == LRU {
            self.lists.move_to_front(frames, set as usize, slot);
        }
    }
    /// FIFO and LIFO ignore hits; LRU's access leaves the slot at the
    /// front, where a hit leaves it.
    fn settling_hits(&self) -> Option<u32> {
        Some(0)
    }
    #[inline]
    fn on_remove(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
        self.lists.unlink(frames, set as usize, slot);
    }
    #[inline]
    fn evict(&mut self, frames: &mut [Frame], set: u32) -> Option<Victim> {
        let victim = if DISCIPLINE == LIFO {
            self.lists.pop_front(frames, set as usize)
        } else {
            self.lists.pop_back(frames, set as usize)
        };
        victim.map(Victim::plain)
    }
    #[inline]
    fn upcoming_victims(&self, frames: &[Frame], set: u32) -> [Option<SlotId>; 2] {
        // LIFO's victims are the newest slots, already in the CPU cache.
        if DISCIPLINE == LIFO {
            [None, None]
        } else {
            self.lists.back_two(frames, set as usize)
        }
    }
    #[inline]
    fn relinks_on_hit(&self) -> bool {
        DISCIPLINE == LRU
    }
    fn tracked(&self, set: u32) -> u32 {
        self.lists.len(set as usize)
    }
}
