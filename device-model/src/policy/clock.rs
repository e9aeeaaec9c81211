//! CLOCK (second chance).

use super::list::SlotLists;
use super::PolicyKind;
use super::{EvictionPolicy, Victim};
use crate::slot::{Frame, SlotId};

/// `policy_bits` of a referenced slot.
const REFERENCED: u8 = 1;

/// CLOCK / second chance with one reference bit per slot (libCacheSim
/// `Clock` with a 1-bit counter). Slots sit on a per-set FIFO standing in for
/// the ring: the back is under the hand. New slots enter unreferenced; a hit
/// sets the bit; the victim search looks at the back: referenced → clear the
/// bit and move it to the front (the hand advances past it), else evict.
#[derive(Debug, Clone)]
pub struct Clock {
    lists: SlotLists,
}

impl Clock {
    /// Empty CLOCK for `sets` sets of `ways` slots.
    pub fn new(sets: u32, _ways: u32) -> Self {
        Clock {
            lists: SlotLists::new(sets as usize),
        }
    }
}

impl EvictionPolicy for Clock {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Clock
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
        frames[slot as usize].policy_bits = 0;
        self.lists.push_front(frames, set as usize, slot);
    }
    #[inline]
    fn on_hit(&mut self, frames: &mut [Frame], _set: u32, slot: SlotId) {
        frames[slot as usize].policy_bits = REFERENCED;
    }
    /// A slot enters with its bit clear; a hit sets it.
    fn settling_hits(&self) -> Option<u32> {
        Some(1)
    }
    /// A hit sets the bit: nothing to change once it is set.
    #[inline]
    fn hit_settled(&self, frames: &[Frame], _set: u32, slot: SlotId) -> bool {
        frames[slot as usize].policy_bits == REFERENCED
    }
    #[inline]
    fn on_remove(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
        self.lists.unlink(frames, set as usize, slot);
    }
    fn evict(&mut self, frames: &mut [Frame], set: u32) -> Option<Victim> {
        let list = set as usize;
        // Terminates: every pass either evicts or clears one bit.
        loop {
            let slot = self.lists.back(list)?;
            let frame = &mut frames[slot as usize];
            if frame.policy_bits == REFERENCED {
                frame.policy_bits = 0;
                self.lists.move_to_front(frames, list, slot);
            } else {
                self.lists.unlink(frames, list, slot);
                return Some(Victim::plain(slot));
            }
        }
    }
    #[inline]
    fn upcoming_victims(&self, frames: &[Frame], set: u32) -> [Option<SlotId>; 2] {
        self.lists.back_two(frames, set as usize)
    }
    fn tracked(&self, set: u32) -> u32 {
        self.lists.len(set as usize)
    }
}
