//! LFRU: least frequently recently used.

use super::list::SlotLists;
use super::{share, EvictionPolicy, Victim};
use super::{PolicyKind, PolicyParams};
use crate::slot::{Frame, SlotId};

/// Highest frequency bucket of the unprivileged partition.
const FREQ_MAX: u8 = 7;
/// Lists per set: index 0 is the privileged LRU, 1..=7 the frequency buckets.
const LISTS: usize = 1 + FREQ_MAX as usize;
/// `policy_bits` of a privileged slot.
const PRIVILEGED: u8 = 0;

/// LFRU (Bilal & Kang; as in CXL-SSD-Sim and Wikipedia's "least frequently
/// recently used"), per set: a privileged partition kept in LRU order
/// (target `privileged_ratio` of the ways) and an unprivileged partition
/// approximating LFU with frequency buckets 1..=7 (FIFO within a bucket).
///
/// New pages enter the unprivileged partition with frequency 1. A hit there
/// raises the frequency (capped at 7); once it reaches `promote_threshold`
/// the page moves to the privileged MRU end, and if the privileged partition
/// then exceeds its target its LRU page is demoted to the unprivileged
/// partition with frequency 1. A hit in the privileged partition → MRU.
/// Victim: the oldest page of the lowest non-empty unprivileged bucket; only
/// if that partition is empty, the privileged LRU page.
///
/// With `promote_threshold` above 7 nothing is ever promoted (pure
/// approximate LFU); with a privileged target of 0 a promoted page is demoted
/// straight back with frequency 1.
#[derive(Debug, Clone)]
pub struct Lfru {
    /// Lists `LISTS * set + k`, see [`LISTS`].
    /// Per slot (`policy_bits`): [`PRIVILEGED`] or the unprivileged
    /// frequency (1..=7).
    lists: SlotLists,
    privileged_target: u32,
    promote_threshold: u8,
}

impl Lfru {
    /// Empty LFRU for `sets` sets of `ways` slots.
    pub fn new(sets: u32, ways: u32, params: &PolicyParams) -> Self {
        Lfru {
            lists: SlotLists::new(LISTS * sets as usize),
            privileged_target: share(ways, params.lfru_privileged_ratio, 0),
            promote_threshold: params.lfru_promote_threshold,
        }
    }

    #[inline]
    fn list(set: u32, k: u8) -> usize {
        LISTS * set as usize + k as usize
    }
}

impl EvictionPolicy for Lfru {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lfru
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
        frames[slot as usize].policy_bits = 1;
        self.lists.push_front(frames, Self::list(set, 1), slot);
    }

    fn on_hit(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
        let f = frames[slot as usize].policy_bits;
        if f == PRIVILEGED {
            self.lists
                .move_to_front(frames, Self::list(set, PRIVILEGED), slot);
            return;
        }
        let nf = (f + 1).min(FREQ_MAX);
        if nf >= self.promote_threshold {
            self.lists.unlink(frames, Self::list(set, f), slot);
            let privileged = Self::list(set, PRIVILEGED);
            frames[slot as usize].policy_bits = PRIVILEGED;
            self.lists.push_front(frames, privileged, slot);
            if self.lists.len(privileged) > self.privileged_target {
                if let Some(demoted) = self.lists.pop_back(frames, privileged) {
                    frames[demoted as usize].policy_bits = 1;
                    self.lists.push_front(frames, Self::list(set, 1), demoted);
                }
            }
        } else if nf != f {
            self.lists.unlink(frames, Self::list(set, f), slot);
            frames[slot as usize].policy_bits = nf;
            self.lists.push_front(frames, Self::list(set, nf), slot);
        }
    }

    /// A slot enters with frequency 1; hits raise it until the slot is
    /// promoted (then a hit only moves it to the privileged front, where it
    /// is) or reaches [`FREQ_MAX`]. With no privileged room, a promoted slot
    /// is demoted straight back to frequency 1 and the climb starts again:
    /// never settled.
    fn settling_hits(&self) -> Option<u32> {
        (self.privileged_target > 0).then_some(u32::from(FREQ_MAX - 1))
    }

    /// A privileged slot at its list's front (a hit would move it where it
    /// is), or an unprivileged one whose frequency a hit would neither
    /// raise nor promote (at [`FREQ_MAX`], promotion above it).
    #[inline]
    fn hit_settled(&self, frames: &[Frame], set: u32, slot: SlotId) -> bool {
        let f = frames[slot as usize].policy_bits;
        if f == PRIVILEGED {
            return self.lists.front(Self::list(set, PRIVILEGED)) == Some(slot);
        }
        let nf = (f + 1).min(FREQ_MAX);
        nf == f && nf < self.promote_threshold
    }

    #[inline]
    fn on_remove(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
        let f = frames[slot as usize].policy_bits;
        self.lists.unlink(frames, Self::list(set, f), slot);
    }

    fn evict(&mut self, frames: &mut [Frame], set: u32) -> Option<Victim> {
        (1..=FREQ_MAX)
            .chain(std::iter::once(PRIVILEGED))
            .find_map(|k| self.lists.pop_back(frames, Self::list(set, k)))
            .map(Victim::plain)
    }

    #[inline]
    fn relinks_on_hit(&self) -> bool {
        true
    }

    fn tracked(&self, set: u32) -> u32 {
        (0..=FREQ_MAX)
            .map(|k| self.lists.len(Self::list(set, k)))
            .sum()
    }
}
