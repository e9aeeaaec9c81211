//! 2Q (Johnson & Shasha, VLDB'94), the "full" version with a ghost A1out,
//! as libCacheSim's `TwoQ` (`cache/eviction/TwoQ.c`) runs it.

use super::list::SlotLists;
use super::{share, EvictionPolicy, Victim};
use super::{PolicyKind, PolicyParams};
use crate::slot::{Frame, SlotId};

/// `policy_bits` of a slot in Am.
const IN_AM: u8 = 1;

/// 2Q, per set: A1in, a FIFO of first-time pages (Kin = ⌊ways ×
/// `twoq_kin_ratio`⌋, at least 1); A1out, a ghost FIFO of pages evicted from
/// A1in (Kout = ⌊ways × `twoq_kout_ratio`⌋ entries; kept by the cache, see
/// [`crate::policy`]); Am, an LRU of pages re-referenced after leaving A1in.
///
/// * Miss: a page found in A1out leaves A1out and enters Am's MRU end; any
///   other page enters A1in's head.
/// * Hit in Am → MRU; hit in A1in → nothing (the correlated-reference rule:
///   a page must come back from A1out to reach Am).
/// * Evict: if |A1in| > Kin (or Am is empty) evict A1in's tail and remember
///   it in A1out, else evict Am's LRU page.
///
/// libCacheSim also gives Am a capacity of its own (ways − Kin) and drops
/// Am's LRU page when a ghost hit finds Am full; with the set full, |A1in|
/// ≥ Kin always holds (A1in only shrinks while above Kin), so Am is never
/// over it and the rule never fires. It could only after explicit removals
/// or pins, which libCacheSim does not model.
#[derive(Debug, Clone)]
pub struct TwoQ {
    /// Lists `2 * set` (A1in) and `2 * set + 1` (Am).
    /// Per slot (`policy_bits`): [`IN_AM`] or 0 (in A1in).
    lists: SlotLists,
    kin: u32,
    kout: u32,
}

impl TwoQ {
    /// Empty 2Q for `sets` sets of `ways` slots.
    pub fn new(sets: u32, ways: u32, params: &PolicyParams) -> Self {
        TwoQ {
            lists: SlotLists::new(2 * sets as usize),
            kin: share(ways, params.twoq_kin_ratio, 1),
            kout: share(ways, params.twoq_kout_ratio, 0),
        }
    }

    #[inline]
    fn a1in(set: u32) -> usize {
        2 * set as usize
    }

    #[inline]
    fn am(set: u32) -> usize {
        2 * set as usize + 1
    }
}

impl EvictionPolicy for TwoQ {
    fn kind(&self) -> PolicyKind {
        PolicyKind::TwoQ
    }

    fn ghost_capacity(&self) -> u32 {
        self.kout
    }

    #[inline]
    fn on_insert(
        &mut self,
        frames: &mut [Frame],
        set: u32,
        slot: SlotId,
        _page: u64,
        from_ghost: bool,
    ) {
        if from_ghost {
            self.lists.push_front(frames, Self::am(set), slot);
        } else {
            self.lists.push_front(frames, Self::a1in(set), slot);
        }
        frames[slot as usize].policy_bits = if from_ghost { IN_AM } else { 0 };
    }

    #[inline]
    fn on_hit(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
        if frames[slot as usize].policy_bits == IN_AM {
            self.lists.move_to_front(frames, Self::am(set), slot);
        }
    }

    /// A slot enters at the front of A1in (or of Am, from A1out); a hit in
    /// A1in changes nothing, one in Am moves it to Am's front, where it is.
    fn settling_hits(&self) -> Option<u32> {
        Some(0)
    }

    #[inline]
    fn on_remove(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
        let list = if frames[slot as usize].policy_bits == IN_AM {
            Self::am(set)
        } else {
            Self::a1in(set)
        };
        self.lists.unlink(frames, list, slot);
    }

    fn evict(&mut self, frames: &mut [Frame], set: u32) -> Option<Victim> {
        let (a1in, am) = (Self::a1in(set), Self::am(set));
        let in_len = self.lists.len(a1in);
        if in_len > 0 && (in_len > self.kin || self.lists.len(am) == 0) {
            self.lists.pop_back(frames, a1in).map(Victim::with_ghost)
        } else {
            self.lists.pop_back(frames, am).map(Victim::plain)
        }
    }

    #[inline]
    fn upcoming_victims(&self, frames: &[Frame], set: u32) -> [Option<SlotId>; 2] {
        let (a1in, am) = (Self::a1in(set), Self::am(set));
        let in_len = self.lists.len(a1in);
        let from_a1in = in_len > 0 && (in_len > self.kin || self.lists.len(am) == 0);
        self.lists
            .back_two(frames, if from_a1in { a1in } else { am })
    }
    #[inline]
    fn relinks_on_hit(&self) -> bool {
        true
    }
    fn tracked(&self, set: u32) -> u32 {
        self.lists.len(Self::a1in(set)) + self.lists.len(Self::am(set))
    }
}
