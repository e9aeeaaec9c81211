//! S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
//! SOSP'23), as libCacheSim's `S3FIFO` (`cache/eviction/S3FIFO.c`) runs it.

use super::list::SlotLists;
use super::{share, EvictionPolicy, Victim};
use super::{PolicyKind, PolicyParams};
use crate::slot::{Frame, SlotId};

/// Frequency bits of a slot's `policy_bits` (saturating at [`FREQ_MAX`]).
const FREQ_MASK: u8 = 0x7f;
/// Saturation point of the frequency: above any threshold the config
/// accepts, so a saturated counter compares as libCacheSim's unbounded one.
const FREQ_MAX: u8 = 127;
/// The slot is in M.
const IN_MAIN: u8 = 0x80;

/// S3-FIFO, per set (libCacheSim's algorithm, sizes in ways of the set):
/// a small FIFO S of capacity `small` = ⌊ways × `s3fifo_small_ratio`⌋ (at
/// least 1), a main FIFO M of capacity `ways − small`, and a ghost FIFO G of
/// ⌊ways × `s3fifo_ghost_ratio`⌋ page numbers (kept by the cache, see
/// [`crate::policy`]). Each resident page has a frequency: 0 when it enters
/// S or M, +1 per hit.
///
/// * Miss: a page found in G leaves G and enters M; any other page enters S,
///   except that until the set's first eviction a full S sends it to M.
/// * Evict (until one slot is free): if |M| > M's capacity or S is empty,
///   take M's tail: frequency ≥ 1 → back to M's head with
///   min(frequency, 3) − 1 (a 2-bit CLOCK), else evict it. Otherwise take S's
///   tail, and keep taking it until one page is evicted: frequency ≥
///   `s3fifo_move_to_main_threshold` → to M's head with frequency 0 (M may
///   grow past its capacity; the next evictions drain it), else evict it and
///   remember it in G. If S empties without an eviction, start over (M is
///   then chosen).
///
/// This is libCacheSim's loop, which evicts until the new object fits;
/// with every page one slot it frees exactly one slot per call.
#[derive(Debug, Clone)]
pub struct S3Fifo {
    /// Lists `2 * set` (small) and `2 * set + 1` (main).
    /// Per slot (`policy_bits`): frequency in [`FREQ_MASK`], [`IN_MAIN`].
    lists: SlotLists,
    /// Per set: has evicted at least once (libCacheSim's `has_evicted`).
    has_evicted: Vec<bool>,
    small_capacity: u32,
    main_capacity: u32,
    ghost_capacity: u32,
    threshold: u8,
}

impl S3Fifo {
    /// Empty S3-FIFO for `sets` sets of `ways` slots.
    pub fn new(sets: u32, ways: u32, params: &PolicyParams) -> Self {
        let small_capacity = share(ways, params.s3fifo_small_ratio, 1);
        S3Fifo {
            lists: SlotLists::new(2 * sets as usize),
            has_evicted: vec![false; sets as usize],
            small_capacity,
            main_capacity: ways - small_capacity,
            ghost_capacity: ghost_share(ways, params.s3fifo_ghost_ratio),
            threshold: params.s3fifo_move_to_main_threshold.min(FREQ_MAX),
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
    fn list_of(frames: &[Frame], set: u32, slot: SlotId) -> usize {
        if frames[slot as usize].policy_bits & IN_MAIN != 0 {
            Self::main(set)
        } else {
            Self::small(set)
        }
    }

    /// The next eviction looks at M (else at S).
    #[inline]
    fn evicts_from_main(&self, set: u32) -> bool {
        self.lists.len(Self::main(set)) > self.main_capacity
            || self.lists.len(Self::small(set)) == 0
    }
}

/// ⌊ways × ratio⌋, for a ratio that may exceed 1 (0 when not finite or
/// not positive).
fn ghost_share(ways: u32, ratio: f64) -> u32 {
    let raw = (f64::from(ways) * ratio).floor();
    if raw.is_finite() && raw > 0.0 {
        raw.min(f64::from(u32::MAX)) as u32
    } else {
        0
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
    fn on_insert(
        &mut self,
        frames: &mut [Frame],
        set: u32,
        slot: SlotId,
        _page: u64,
        from_ghost: bool,
    ) {
        let small = Self::small(set);
        let to_main = from_ghost
            || (!self.has_evicted[set as usize] && self.lists.len(small) >= self.small_capacity);
        if to_main {
            frames[slot as usize].policy_bits = IN_MAIN;
            self.lists.push_front(frames, Self::main(set), slot);
        } else {
            frames[slot as usize].policy_bits = 0;
            self.lists.push_front(frames, small, slot);
        }
    }

    #[inline]
    fn on_hit(&mut self, frames: &mut [Frame], _set: u32, slot: SlotId) {
        let frame = &mut frames[slot as usize];
        if frame.policy_bits & FREQ_MASK < FREQ_MAX {
            frame.policy_bits += 1;
        }
    }

    #[inline]
    fn on_remove(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
        let list = Self::list_of(frames, set, slot);
        self.lists.unlink(frames, list, slot);
    }

    fn evict(&mut self, frames: &mut [Frame], set: u32) -> Option<Victim> {
        let (small, main) = (Self::small(set), Self::main(set));
        self.has_evicted[set as usize] = true;
        // Terminates: each pass evicts, moves one slot from S to M (S only
        // shrinks), or lowers one frequency in M to at most 2.
        loop {
            if self.evicts_from_main(set) {
                let slot = self.lists.back(main)?;
                let frame = &mut frames[slot as usize];
                let freq = frame.policy_bits & FREQ_MASK;
                if freq > 0 {
                    frame.policy_bits = IN_MAIN | (freq.min(3) - 1);
                    self.lists.move_to_front(frames, main, slot);
                } else {
                    self.lists.unlink(frames, main, slot);
                    return Some(Victim::plain(slot));
                }
            } else {
                // Once S is chosen, S's tail is worked until one page is
                // evicted or S is empty, however long M grows meanwhile.
                while let Some(slot) = self.lists.back(small) {
                    self.lists.unlink(frames, small, slot);
                    let frame = &mut frames[slot as usize];
                    if frame.policy_bits & FREQ_MASK >= self.threshold {
                        frame.policy_bits = IN_MAIN;
                        self.lists.push_front(frames, main, slot);
                    } else {
                        return Some(Victim::with_ghost(slot));
                    }
                }
            }
        }
    }

    #[inline]
    fn upcoming_victims(&self, frames: &[Frame], set: u32) -> [Option<SlotId>; 2] {
        let list = if self.evicts_from_main(set) {
            Self::main(set)
        } else {
            Self::small(set)
        };
        self.lists.back_two(frames, list)
    }
    fn tracked(&self, set: u32) -> u32 {
        self.lists.len(Self::small(set)) + self.lists.len(Self::main(set))
    }
}
