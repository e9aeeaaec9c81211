//! FIFO queues of slot ids kept as rings (circular arrays), for policies
//! whose queues are mostly pushed at one end and popped at the other
//! (S3-FIFO's S and M). Against a linked list through the frames, the next
//! entries to be popped are known without touching any frame, so their
//! frames can be prefetched several pops ahead instead of each pop loading
//! the frame that names the next one.
//!
//! Each ring has `len` positions (a policy gives a set's rings `ways`
//! positions each: never fewer than the slots it can hold). A slot's
//! position in its ring lives in the `prev` word of its [`Frame`] (unused
//! by ring policies otherwise), so any slot can be taken out: its position
//! becomes a tombstone ([`NIL`]) that pops skip; the oldest position is
//! always live (tombstones there are dropped at once), and a push into a
//! ring whose positions are all used compacts it in place first.
//! Orientation as in [`super::list`]: pushes add the newest entry, pops
//! take the oldest.

use crate::slot::{prefetch_frame, prefetch_read, Frame, SlotId, NIL};

/// Most positions [`SlotRings::prefetch_rings`] prefetches (four lines).
const PREFETCH_POSITIONS_MAX: usize = 64;

/// Per-ring state.
#[derive(Debug, Clone, Copy, Default)]
struct RingState {
    /// Offset of the oldest position in use (live whenever `used > 0`).
    tail: u32,
    /// Positions in use from `tail` on, tombstones included.
    used: u32,
    /// Live entries.
    live: u32,
}

/// Many rings of `len` slot ids each, ring `r` at `r * len ..`.
#[derive(Debug, Clone)]
pub(crate) struct SlotRings {
    len: u32,
    slots: Vec<SlotId>,
    rings: Vec<RingState>,
}

impl SlotRings {
    /// `rings` empty rings of `len` positions each.
    pub(crate) fn new(rings: usize, len: u32) -> Self {
        SlotRings {
            len,
            slots: vec![NIL; rings * len as usize],
            rings: vec![RingState::default(); rings],
        }
    }

    #[inline]
    fn base(&self, ring: usize) -> usize {
        ring * self.len as usize
    }

    /// `offset + k` around a ring (`offset < len`, `k <= len`).
    #[inline]
    fn wrap(&self, offset: u32, k: u32) -> u32 {
        let sum = u64::from(offset) + u64::from(k);
        let len = u64::from(self.len);
        // Below `len`, a u32.
        (if sum >= len { sum - len } else { sum }) as u32
    }

    /// Live entries of `ring`.
    #[inline]
    pub(crate) fn live(&self, ring: usize) -> u32 {
        self.rings[ring].live
    }

    /// The entry `k` positions after the oldest of `ring`: the `k + 1`-th
    /// pop if nothing else changes and no tombstone lies before it (`None`
    /// beyond the used positions, or a tombstone).
    #[inline]
    pub(crate) fn peek(&self, ring: usize, k: u32) -> Option<SlotId> {
        let state = self.rings[ring];
        if k >= state.used {
            return None;
        }
        let slot = self.slots[self.base(ring) + self.wrap(state.tail, k) as usize];
        (slot != NIL).then_some(slot)
    }

    /// Starts loading the frame of the entry `k` positions after the oldest
    /// of `ring` (a hint).
    #[inline]
    pub(crate) fn prefetch_ahead(&self, frames: &[Frame], ring: usize, k: u32) {
        if let Some(slot) = self.peek(ring, k) {
            prefetch_frame(frames, slot);
        }
    }

    /// Starts loading the state and, when they span at most
    /// [`PREFETCH_POSITIONS_MAX`] positions, the positions of rings
    /// `first .. first + count` (a hint; small rings, as a set-associative
    /// cache's, fit a line or two).
    #[inline]
    pub(crate) fn prefetch_rings(&self, first: usize, count: usize) {
        let (Some(a), Some(b)) = (self.rings.get(first), self.rings.get(first + count - 1)) else {
            return;
        };
        prefetch_read(a);
        prefetch_read(b);
        let positions = count * self.len as usize;
        if positions <= PREFETCH_POSITIONS_MAX {
            let start = self.base(first);
            for at in (start..start + positions)
                .step_by(16)
                .chain([start + positions - 1])
            {
                if let Some(p) = self.slots.get(at) {
                    prefetch_read(p);
                }
            }
        }
    }

    /// Adds `slot` (in no ring) as the newest entry of `ring`, which must
    /// hold fewer than `len` live entries.
    #[inline]
    pub(crate) fn push(&mut self, frames: &mut [Frame], ring: usize, slot: SlotId) {
        if self.rings[ring].used == self.len {
            self.compact(frames, ring);
        }
        let state = self.rings[ring];
        debug_assert!(state.used < self.len, "push into a full ring");
        let offset = self.wrap(state.tail, state.used);
        let base = self.base(ring);
        self.slots[base + offset as usize] = slot;
        frames[slot as usize].prev = offset;
        let state = &mut self.rings[ring];
        state.used += 1;
        state.live += 1;
    }

    /// Takes the oldest entry out of `ring`.
    #[inline]
    pub(crate) fn pop(&mut self, ring: usize) -> Option<SlotId> {
        let state = self.rings[ring];
        if state.live == 0 {
            return None;
        }
        let slot = self.slots[self.base(ring) + state.tail as usize];
        debug_assert!(slot != NIL, "tombstone at the tail");
        self.advance(ring);
        self.rings[ring].live -= 1;
        self.trim(ring);
        Some(slot)
    }

    /// Takes `slot`, which must be in `ring`, out of it (a tombstone unless
    /// it was the oldest).
    #[inline]
    pub(crate) fn remove(&mut self, frames: &[Frame], ring: usize, slot: SlotId) {
        let offset = frames[slot as usize].prev;
        let at = self.base(ring) + offset as usize;
        debug_assert_eq!(self.slots[at], slot, "slot not at its ring position");
        self.slots[at] = NIL;
        self.rings[ring].live -= 1;
        if offset == self.rings[ring].tail {
            self.trim(ring);
        }
    }

    /// Drops the oldest position of `ring` (in use).
    #[inline]
    fn advance(&mut self, ring: usize) {
        let tail = self.wrap(self.rings[ring].tail, 1);
        let state = &mut self.rings[ring];
        state.tail = tail;
        state.used -= 1;
    }

    /// Drops the tombstones at the tail of `ring`.
    #[inline]
    fn trim(&mut self, ring: usize) {
        let base = self.base(ring);
        while self.rings[ring].used > 0 && self.slots[base + self.rings[ring].tail as usize] == NIL
        {
            self.advance(ring);
        }
    }

    /// Moves the live entries of `ring` together, in order, from the tail
    /// on, and tells their frames their new positions.
    #[cold]
    fn compact(&mut self, frames: &mut [Frame], ring: usize) {
        let base = self.base(ring);
        let state = self.rings[ring];
        let mut kept = 0;
        for i in 0..state.used {
            let from = self.wrap(state.tail, i);
            let slot = self.slots[base + from as usize];
            if slot == NIL {
                continue;
            }
            if kept != i {
                let to = self.wrap(state.tail, kept);
                self.slots[base + to as usize] = slot;
                self.slots[base + from as usize] = NIL;
                frames[slot as usize].prev = to;
            }
            kept += 1;
        }
        debug_assert_eq!(kept, state.live);
        self.rings[ring].used = kept;
    }

    /// Entries of `ring`, oldest first.
    #[cfg(test)]
    pub(crate) fn entries(&self, ring: usize) -> Vec<SlotId> {
        (0..self.rings[ring].used)
            .filter_map(|k| self.peek(ring, k))
            .collect()
    }

    /// Checks `ring` against the frames (for tests): counts agree, the tail
    /// is live, and every live entry's frame names its position.
    #[cfg(test)]
    pub(crate) fn check(&self, frames: &[Frame], ring: usize) -> Result<(), String> {
        let state = self.rings[ring];
        if state.used > self.len
            || state.live > state.used
            || (self.len > 0 && state.tail >= self.len)
        {
            return Err(format!("ring {ring}: {state:?} of {}", self.len));
        }
        if state.used > 0 && self.peek(ring, 0).is_none() {
            return Err(format!("ring {ring}: tombstone at the tail"));
        }
        let mut live = 0;
        for k in 0..state.used {
            let offset = self.wrap(state.tail, k);
            if let Some(slot) = self.peek(ring, k) {
                live += 1;
                if frames[slot as usize].prev != offset {
                    return Err(format!("ring {ring}: slot {slot} is not at {offset}"));
                }
            }
        }
        if live != state.live {
            return Err(format!("ring {ring}: {live} live, counted {}", state.live));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    #[test]
    fn push_pop_remove() {
        let mut r = SlotRings::new(2, 4);
        let f = &mut vec![Frame::free(NIL); 8][..];
        for s in 0..3 {
            r.push(f, 0, s);
        }
        r.push(f, 1, 7);
        assert_eq!(r.entries(0), vec![0, 1, 2]);
        r.remove(f, 0, 1);
        assert_eq!(r.entries(0), vec![0, 2]);
        assert_eq!((r.live(0), r.peek(0, 1)), (2, None));
        r.remove(f, 0, 0);
        assert_eq!(r.peek(0, 0), Some(2));
        r.push(f, 0, 3);
        r.push(f, 0, 4);
        r.push(f, 0, 5);
        // Four live in four positions, wrapped around.
        assert_eq!(r.entries(0), vec![2, 3, 4, 5]);
        r.check(f, 0).unwrap();
        assert_eq!(r.pop(0), Some(2));
        assert_eq!(r.pop(0), Some(3));
        assert_eq!(r.live(0), 2);
        assert_eq!(r.pop(1), Some(7));
        assert_eq!(r.pop(1), None);
        r.check(f, 0).unwrap();
        r.check(f, 1).unwrap();
    }

    #[test]
    fn a_full_ring_with_tombstones_is_compacted() {
        let mut r = SlotRings::new(1, 4);
        let f = &mut vec![Frame::free(NIL); 8][..];
        for s in 0..4 {
            r.push(f, 0, s);
        }
        r.remove(f, 0, 1);
        r.remove(f, 0, 2);
        // 0 _ _ 3: the push compacts to 0 3 and goes after them.
        r.push(f, 0, 5);
        assert_eq!(r.entries(0), vec![0, 3, 5]);
        assert_eq!((f[3].prev, f[5].prev), (1, 2));
        r.check(f, 0).unwrap();
    }

    /// Random pushes, pops and removals against a `VecDeque`.
    #[test]
    fn matches_a_fifo_with_removal() {
        let mut rand = crate::policy::test_rng(0x9e37_79b9_7f4a_7c15_u64);
        for len in [1u32, 2, 3, 7, 16] {
            let mut r = SlotRings::new(3, len);
            let f = &mut vec![Frame::free(NIL); 3 * len as usize][..];
            let mut model: [VecDeque<SlotId>; 3] = Default::default();
            // Slots not in any ring (each ring holds at most `len`).
            let mut spare: Vec<SlotId> = (0..3 * len).collect();
            for _ in 0..20_000 {
                let ring = rand(3) as usize;
                let fifo = &mut model[ring];
                match rand(10) {
                    0..=4 if fifo.len() < len as usize && !spare.is_empty() => {
                        let slot = spare.swap_remove(rand(spare.len() as u64) as usize);
                        r.push(f, ring, slot);
                        fifo.push_back(slot);
                    }
                    5..=7 => {
                        let got = r.pop(ring);
                        assert_eq!(got, fifo.pop_front());
                        spare.extend(got);
                    }
                    _ if !fifo.is_empty() => {
                        let slot = fifo
                            .remove(rand(fifo.len() as u64) as usize)
                            .expect("in range");
                        r.remove(f, ring, slot);
                        spare.push(slot);
                    }
                    _ => {}
                }
                assert_eq!(r.entries(ring), Vec::from(model[ring].clone()));
                assert_eq!(r.live(ring) as usize, model[ring].len());
                r.check(f, ring).unwrap();
            }
        }
    }
}
