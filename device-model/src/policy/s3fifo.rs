//! S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
//! SOSP'23), as libCacheSim's `S3FIFO` (`cache/eviction/S3FIFO.c`) runs it.

use super::ring::SlotRings;
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

/// Each pop from S or M starts loading the frame this many entries further
/// on in the same queue: the queues are rings, so the slots that the next
/// evictions will read are known long before they are reached.
const PREFETCH_FRAMES_AHEAD: u32 = 16;
/// [`EvictionPolicy::upcoming_victims`] names the entry this many places
/// from the tail of the queue the next eviction takes from (its frame was
/// prefetched [`PREFETCH_FRAMES_AHEAD`] pops before), so that the cache can
/// prefetch the page-table entry of its page.
const PREFETCH_TABLE_AHEAD: u32 = 4;

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
///
/// S and M are rings of slot ids (`policy/ring.rs`), `ways` positions each
/// (a slot's position in the `prev` word of its frame), not lists through
/// the frames: nearly every operation is a push at the head or a pop at the
/// tail, and the victims to come can be prefetched several evictions ahead.
#[derive(Debug, Clone)]
pub struct S3Fifo {
    /// Rings `2 * set` (small) and `2 * set + 1` (main).
    /// Per slot (`policy_bits`): frequency in [`FREQ_MASK`], [`IN_MAIN`].
    rings: SlotRings,
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
            rings: SlotRings::new(2 * sets as usize, ways),
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
    fn ring_of(frames: &[Frame], set: u32, slot: SlotId) -> usize {
        if frames[slot as usize].policy_bits & IN_MAIN != 0 {
            Self::main(set)
        } else {
            Self::small(set)
        }
    }

    /// The next eviction looks at M (else at S).
    #[inline]
    fn evicts_from_main(&self, set: u32) -> bool {
        self.rings.live(Self::main(set)) > self.main_capacity
            || self.rings.live(Self::small(set)) == 0
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
            || (!self.has_evicted[set as usize] && self.rings.live(small) >= self.small_capacity);
        if to_main {
            frames[slot as usize].policy_bits = IN_MAIN;
            self.rings.push(frames, Self::main(set), slot);
        } else {
            frames[slot as usize].policy_bits = 0;
            self.rings.push(frames, small, slot);
        }
    }

    #[inline]
    fn on_hit(&mut self, frames: &mut [Frame], _set: u32, slot: SlotId) {
        let frame = &mut frames[slot as usize];
        if frame.policy_bits & FREQ_MASK < FREQ_MAX {
            frame.policy_bits += 1;
        }
    }

    /// A slot enters with frequency 0; a hit raises it, and nothing reads it but as
    /// `min(frequency, 3)` (in M) or against the threshold (in S): once it
    /// reaches both, a further hit changes no later decision.
    fn settling_hits(&self) -> Option<u32> {
        Some(u32::from(self.threshold.max(3)))
    }

    /// The frequency has reached both 3 and the threshold.
    #[inline]
    fn hit_settled(&self, frames: &[Frame], _set: u32, slot: SlotId) -> bool {
        frames[slot as usize].policy_bits & FREQ_MASK >= self.threshold.max(3)
    }

    #[inline]
    fn on_remove(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
        let ring = Self::ring_of(frames, set, slot);
        self.rings.remove(frames, ring, slot);
    }

    fn evict(&mut self, frames: &mut [Frame], set: u32) -> Option<Victim> {
        let (small, main) = (Self::small(set), Self::main(set));
        self.has_evicted[set as usize] = true;
        // Terminates: each pass evicts, moves one slot from S to M (S only
        // shrinks), or lowers one frequency in M to at most 2.
        loop {
            if self.evicts_from_main(set) {
                let slot = self.rings.pop(main)?;
                self.rings
                    .prefetch_ahead(frames, main, PREFETCH_FRAMES_AHEAD);
                let frame = &mut frames[slot as usize];
                let freq = frame.policy_bits & FREQ_MASK;
                if freq > 0 {
                    frame.policy_bits = IN_MAIN | (freq.min(3) - 1);
                    self.rings.push(frames, main, slot);
                } else {
                    return Some(Victim::plain(slot));
                }
            } else {
                // Once S is chosen, S's tail is worked until one page is
                // evicted or S is empty, however long M grows meanwhile.
                while let Some(slot) = self.rings.pop(small) {
                    self.rings
                        .prefetch_ahead(frames, small, PREFETCH_FRAMES_AHEAD);
                    let frame = &mut frames[slot as usize];
                    if frame.policy_bits & FREQ_MASK >= self.threshold {
                        frame.policy_bits = IN_MAIN;
                        self.rings.push(frames, main, slot);
                    } else {
                        return Some(Victim::with_ghost(slot));
                    }
                }
            }
        }
    }

    /// Not the next victims: the entry `PREFETCH_TABLE_AHEAD` places from
    /// the tail of the queue the next eviction takes from, whose page-table
    /// entry the cache prefetches (its frame is already on its way:
    /// [`Self::evict`] prefetches frames as it pops), and no second one.
    #[inline]
    fn upcoming_victims(&self, _frames: &[Frame], set: u32) -> [Option<SlotId>; 2] {
        let ring = if self.evicts_from_main(set) {
            Self::main(set)
        } else {
            Self::small(set)
        };
        [self.rings.peek(ring, PREFETCH_TABLE_AHEAD), None]
    }

    #[inline]
    fn prefetch_set(&self, set: u32) {
        self.rings.prefetch_rings(Self::small(set), 2);
    }

    fn tracked(&self, set: u32) -> u32 {
        self.rings.live(Self::small(set)) + self.rings.live(Self::main(set))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::NIL;
    use std::collections::VecDeque;

    /// S3-FIFO of one set written plainly, queues as `VecDeque`s (front:
    /// oldest), for the rings to be checked against.
    struct Plain {
        small: VecDeque<SlotId>,
        main: VecDeque<SlotId>,
        freq: Vec<u8>,
        has_evicted: bool,
        small_capacity: usize,
        main_capacity: usize,
        threshold: u8,
    }

    impl Plain {
        fn insert(&mut self, slot: SlotId, from_ghost: bool) {
            self.freq[slot as usize] = 0;
            if from_ghost || (!self.has_evicted && self.small.len() >= self.small_capacity) {
                self.main.push_back(slot);
            } else {
                self.small.push_back(slot);
            }
        }

        fn remove(&mut self, slot: SlotId) {
            self.small.retain(|&s| s != slot);
            self.main.retain(|&s| s != slot);
        }

        fn evict(&mut self) -> Option<Victim> {
            self.has_evicted = true;
            loop {
                if self.main.len() > self.main_capacity || self.small.is_empty() {
                    let slot = self.main.pop_front()?;
                    let freq = &mut self.freq[slot as usize];
                    if *freq == 0 {
                        return Some(Victim::plain(slot));
                    }
                    *freq = (*freq).min(3) - 1;
                    self.main.push_back(slot);
                } else {
                    while let Some(slot) = self.small.pop_front() {
                        if self.freq[slot as usize] < self.threshold {
                            return Some(Victim::with_ghost(slot));
                        }
                        self.freq[slot as usize] = 0;
                        self.main.push_back(slot);
                    }
                }
            }
        }
    }

    /// Random inserts (some as ghosts), hits, removals and evictions on
    /// two sets: the same victims as the plain version, and the rings stay
    /// consistent through tombstones and compactions.
    #[test]
    fn rings_evict_as_plain_queues() {
        let mut rand = crate::policy::test_rng(0x2545_f491_4f6c_dd1d_u64);
        for (ways, small_ratio, threshold) in
            [(1u32, 0.1, 2u8), (4, 0.25, 1), (10, 0.1, 2), (33, 0.3, 3)]
        {
            let params = PolicyParams {
                s3fifo_small_ratio: small_ratio,
                s3fifo_move_to_main_threshold: threshold,
                ..PolicyParams::default()
            };
            let sets = 2;
            let mut p = S3Fifo::new(sets, ways, &params);
            let f = &mut vec![Frame::free(NIL); (sets * ways) as usize][..];
            let mut plain: Vec<Plain> = (0..sets)
                .map(|_| Plain {
                    small: VecDeque::new(),
                    main: VecDeque::new(),
                    freq: vec![0; (sets * ways) as usize],
                    has_evicted: false,
                    small_capacity: p.small_capacity as usize,
                    main_capacity: p.main_capacity as usize,
                    threshold,
                })
                .collect();
            let mut resident: Vec<Vec<SlotId>> = vec![Vec::new(); sets as usize];
            let mut free: Vec<Vec<SlotId>> = (0..sets)
                .map(|s| (s * ways..(s + 1) * ways).rev().collect())
                .collect();
            for _ in 0..30_000 {
                let set = rand(u64::from(sets)) as u32;
                let (res, fr, pl) = (
                    &mut resident[set as usize],
                    &mut free[set as usize],
                    &mut plain[set as usize],
                );
                match rand(10) {
                    0..=4 => {
                        // A miss: evict if the set is full, then insert.
                        if fr.is_empty() {
                            let v = p.evict(f, set);
                            assert_eq!(v, pl.evict());
                            let v = v.expect("a full set has a victim");
                            res.retain(|&s| s != v.slot);
                            fr.push(v.slot);
                        }
                        let slot = fr.pop().expect("a free slot");
                        let ghost = rand(4) == 0;
                        p.on_insert(f, set, slot, 0, ghost);
                        pl.insert(slot, ghost);
                        res.push(slot);
                    }
                    5..=7 if !res.is_empty() => {
                        let slot = res[rand(res.len() as u64) as usize];
                        p.on_hit(f, set, slot);
                        let freq = &mut pl.freq[slot as usize];
                        *freq = (*freq + 1).min(FREQ_MAX);
                    }
                    8 if !res.is_empty() => {
                        let slot = res.swap_remove(rand(res.len() as u64) as usize);
                        p.on_remove(f, set, slot);
                        pl.remove(slot);
                        fr.push(slot);
                    }
                    _ => {}
                }
                assert_eq!(p.tracked(set) as usize, res.len());
                for ring in [S3Fifo::small(set), S3Fifo::main(set)] {
                    p.rings.check(f, ring).unwrap();
                }
                assert_eq!(
                    p.rings.entries(S3Fifo::small(set)),
                    Vec::from(pl.small.clone())
                );
                assert_eq!(
                    p.rings.entries(S3Fifo::main(set)),
                    Vec::from(pl.main.clone())
                );
            }
            for set in 0..sets {
                let mut out = Vec::new();
                p.drain_set(f, set, &mut out);
                let pl = &mut plain[set as usize];
                let expect: Vec<SlotId> =
                    std::iter::from_fn(|| pl.evict().map(|v| v.slot)).collect();
                assert_eq!(out, expect);
            }
        }
    }
}
