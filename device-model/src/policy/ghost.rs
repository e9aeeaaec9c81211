//! Ghost queues: per set, a FIFO of the page numbers of recent victims, as
//! libCacheSim's S3-FIFO and 2Q keep them (a `FIFO` cache of object ids with
//! a capacity in objects; a ghost hit *removes* its entry, so the older
//! entries stay longer).
//!
//! Each set's FIFO is a ring of `2 * capacity` page numbers. A push appends
//! at the tail; a ghost hit overwrites its entry with a tombstone
//! ([`EMPTY`]); when a push finds `capacity` live entries, the oldest live
//! one is pushed out (tombstones before it are skipped). Pushes and
//! push-outs walk the ring in order, and a ghost hit writes one word, so a
//! ghost costs no pointer chasing. Should tombstones fill the ring, it is
//! compacted in place (order kept; at least `capacity` pushes pass before
//! the next compaction).
//!
//! The cache stores a ghost's ring position in its page table (the
//! `cache` module, which uses this one); [`GhostQueues::holds`] confirms it. Positions outside
//! the live part of a ring are kept [`EMPTY`], so a page-table entry left
//! behind by a page that was pushed out (or moved by a compaction, or whose
//! position now holds another page) is never taken for a ghost.

use crate::slot::prefetch_read;

/// A free position (never a ghost: page `u64::MAX`, beyond any device, is
/// not remembered).
const EMPTY: u64 = u64::MAX;

/// Largest number of ring positions a [`GhostQueues`] may have.
pub(crate) const MAX_POSITIONS: u64 = u32::MAX as u64;

/// Per-set ring state.
#[derive(Debug, Clone, Copy, Default)]
struct Ring {
    /// Offset of the oldest entry (live or tombstone) in the ring.
    head: u32,
    /// Entries from `head` on, tombstones included.
    used: u32,
    /// Live entries.
    live: u32,
}

/// The ghost FIFOs of every set of a cache.
#[derive(Debug, Clone)]
pub(crate) struct GhostQueues {
    /// Live entries per set at most.
    capacity: u32,
    /// Ring length per set (`2 * capacity`).
    len: u32,
    /// `sets * len` positions, set `s` at `s * len ..`.
    pages: Vec<u64>,
    rings: Vec<Ring>,
}

impl GhostQueues {
    /// FIFOs of `capacity` entries for `sets` sets (0: none). The caller
    /// keeps `sets * 2 * capacity` within [`MAX_POSITIONS`].
    pub(crate) fn new(sets: u32, capacity: u32) -> Self {
        let len = capacity.saturating_mul(2);
        let total = u64::from(sets) * u64::from(len);
        debug_assert!(total <= MAX_POSITIONS, "ghost rings too large");
        GhostQueues {
            capacity,
            len,
            pages: vec![EMPTY; total as usize],
            rings: if capacity == 0 {
                Vec::new()
            } else {
                vec![Ring::default(); sets as usize]
            },
        }
    }

    /// Ring positions needed for `sets` sets of `capacity` entries.
    pub(crate) fn positions(sets: u32, capacity: u32) -> u64 {
        u64::from(sets) * 2 * u64::from(capacity)
    }

    /// Live entries per set at most.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Whether any set keeps ghosts.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.capacity == 0
    }

    /// Is `page` the live ghost at position `pos`?
    #[inline]
    pub(crate) fn holds(&self, pos: u32, page: u64) -> bool {
        page != EMPTY && self.pages.get(pos as usize) == Some(&page)
    }

    /// Starts loading position `pos` into the CPU cache (a hint).
    #[inline]
    pub(crate) fn prefetch(&self, pos: u32) {
        if let Some(p) = self.pages.get(pos as usize) {
            prefetch_read(p);
        }
    }

    /// Live entries of `set` now.
    #[cfg(test)]
    pub(crate) fn live(&self, set: u32) -> u32 {
        self.rings.get(set as usize).map_or(0, |r| r.live)
    }

    /// Appends `page` as the newest ghost of `set`, pushing out the oldest
    /// live one if `capacity` are live. Returns the position now holding
    /// `page` and the page pushed out with its old position, if any; `None`
    /// when nothing is kept (capacity 0, or page `u64::MAX`). A compaction
    /// reports each ghost it moves to `moved(page, new_position)`.
    #[inline]
    pub(crate) fn push(
        &mut self,
        set: u32,
        page: u64,
        moved: impl FnMut(u64, u32),
    ) -> Option<(u32, Option<(u64, u32)>)> {
        if self.capacity == 0 || page == EMPTY {
            return None;
        }
        let base = set * self.len;
        let mut pushed_out = None;
        if self.rings[set as usize].live == self.capacity {
            let ring = &mut self.rings[set as usize];
            // `live > 0`: a live entry lies ahead, the loop ends there.
            loop {
                let pos = base + ring.head;
                let old = std::mem::replace(&mut self.pages[pos as usize], EMPTY);
                ring.head = if ring.head + 1 == self.len {
                    0
                } else {
                    ring.head + 1
                };
                ring.used -= 1;
                if old != EMPTY {
                    ring.live -= 1;
                    pushed_out = Some((old, pos));
                    break;
                }
            }
            self.trim(set);
        }
        if self.rings[set as usize].used == self.len {
            self.compact(set, moved);
        }
        let ring = &mut self.rings[set as usize];
        let pos = base + (ring.head + ring.used) % self.len;
        self.pages[pos as usize] = page;
        ring.used += 1;
        ring.live += 1;
        Some((pos, pushed_out))
    }

    /// Takes the live ghost at `pos` of `set` out of its FIFO (a ghost hit).
    #[inline]
    pub(crate) fn remove(&mut self, set: u32, pos: u32) {
        debug_assert!(self.pages[pos as usize] != EMPTY, "removing a dead ghost");
        self.pages[pos as usize] = EMPTY;
        self.rings[set as usize].live -= 1;
        if pos == set * self.len + self.rings[set as usize].head {
            self.trim(set);
        }
    }

    /// Drops the tombstones at the head of `set`'s ring.
    #[inline]
    fn trim(&mut self, set: u32) {
        let base = set * self.len;
        let ring = &mut self.rings[set as usize];
        while ring.used > 0 && self.pages[(base + ring.head) as usize] == EMPTY {
            ring.head = if ring.head + 1 == self.len {
                0
            } else {
                ring.head + 1
            };
            ring.used -= 1;
        }
    }

    /// Moves the live entries of `set`'s ring together, in order, from the
    /// head on; reports each moved ghost.
    #[cold]
    fn compact(&mut self, set: u32, mut moved: impl FnMut(u64, u32)) {
        let base = set * self.len;
        let ring = self.rings[set as usize];
        let at = |i: u32| base + (ring.head + i) % self.len;
        let mut kept = 0;
        for i in 0..ring.used {
            let page = self.pages[at(i) as usize];
            if page == EMPTY {
                continue;
            }
            if kept != i {
                self.pages[at(kept) as usize] = page;
                self.pages[at(i) as usize] = EMPTY;
                moved(page, at(kept));
            }
            kept += 1;
        }
        let ring = &mut self.rings[set as usize];
        ring.used = kept;
        debug_assert_eq!(kept, ring.live);
    }

    /// The ghosts of `set`, oldest first, with their positions.
    pub(crate) fn entries(&self, set: u32) -> Vec<(u32, u64)> {
        let Some(ring) = self.rings.get(set as usize) else {
            return Vec::new();
        };
        let base = set * self.len;
        (0..ring.used)
            .map(|i| base + (ring.head + i) % self.len)
            .map(|pos| (pos, self.pages[pos as usize]))
            .filter(|&(_, page)| page != EMPTY)
            .collect()
    }

    /// Checks every ring (for tests; O(positions)): counts agree, no more
    /// than `capacity` are live, the head is live, and every position
    /// outside the used part is empty.
    pub(crate) fn check(&self) -> Result<(), String> {
        for (set, ring) in self.rings.iter().enumerate() {
            let base = set * self.len as usize;
            if ring.used > self.len || ring.head >= self.len {
                return Err(format!("ghost ring of set {set}: {ring:?}"));
            }
            let mut live = 0;
            for i in 0..self.len {
                let page = self.pages[base + ((ring.head + i) % self.len) as usize];
                if i >= ring.used && page != EMPTY {
                    return Err(format!(
                        "ghost ring of set {set}: page {page} outside the used part"
                    ));
                }
                live += u32::from(page != EMPTY);
            }
            if live != ring.live || live > self.capacity {
                return Err(format!(
                    "ghost ring of set {set}: {live} live, counted {}, capacity {}",
                    ring.live, self.capacity
                ));
            }
            if ring.used > 0 && self.pages[base + ring.head as usize] == EMPTY {
                return Err(format!("ghost ring of set {set}: tombstone at the head"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(g: &GhostQueues, set: u32) -> Vec<u64> {
        g.entries(set).into_iter().map(|(_, p)| p).collect()
    }

    fn push(g: &mut GhostQueues, set: u32, page: u64) -> (u32, Option<u64>) {
        let (pos, out) = g
            .push(set, page, |_, _| panic!("no compaction expected"))
            .unwrap();
        (pos, out.map(|(p, _)| p))
    }

    #[test]
    fn fifo_with_removal() {
        let mut g = GhostQueues::new(2, 3);
        let (a, out) = push(&mut g, 0, 10);
        assert_eq!(out, None);
        let (b, _) = push(&mut g, 0, 11);
        push(&mut g, 0, 12);
        assert!(g.holds(a, 10) && !g.holds(a, 11));
        assert_eq!(pages(&g, 0), vec![10, 11, 12]);
        // Full: the oldest goes (and its position is emptied).
        assert_eq!(push(&mut g, 0, 13).1, Some(10));
        assert!(!g.holds(a, 10));
        // A ghost hit frees room: the next push pushes nothing out.
        g.remove(0, b);
        assert!(!g.holds(b, 11));
        assert_eq!(pages(&g, 0), vec![12, 13]);
        assert_eq!(push(&mut g, 0, 14).1, None);
        assert_eq!(pages(&g, 0), vec![12, 13, 14]);
        assert_eq!(push(&mut g, 0, 15).1, Some(12));
        // The other set is separate.
        assert_eq!(g.live(1), 0);
        let (f, _) = push(&mut g, 1, 20);
        assert!((6..12).contains(&f));
        g.check().unwrap();
        // Removing the newest, the oldest, the only one.
        let pos: Vec<_> = g.entries(0).into_iter().map(|(n, _)| n).collect();
        g.remove(0, pos[2]);
        g.remove(0, pos[0]);
        assert_eq!(pages(&g, 0), vec![14]);
        g.check().unwrap();
        g.remove(0, pos[1]);
        assert_eq!(g.live(0), 0);
        g.check().unwrap();
        assert_eq!(push(&mut g, 0, 1).1, None);
        g.check().unwrap();
    }

    #[test]
    fn tombstones_are_skipped_and_compacted() {
        // Capacity 3, ring of 6. Keep the head live and remove the middle
        // ones, so tombstones pile up behind it until the ring is full.
        let mut g = GhostQueues::new(1, 3);
        let (head, _) = push(&mut g, 0, 100);
        for page in 200..205 {
            let (pos, _) = push(&mut g, 0, page);
            g.remove(0, pos);
        }
        // Ring: 100 and five tombstones. One more push compacts (100 stays
        // where it is, nothing moves) and goes right after it.
        let mut moves = Vec::new();
        let (pos, out) = g.push(0, 300, |p, at| moves.push((p, at))).unwrap();
        assert_eq!((out, moves.as_slice()), (None, &[][..]));
        assert!(g.holds(head, 100) && g.holds(pos, 300));
        g.check().unwrap();
        // Removing the head makes the next live entry the head.
        push(&mut g, 0, 301);
        g.remove(0, head);
        assert_eq!(pages(&g, 0), vec![300, 301]);
        g.check().unwrap();
        // 302 and 303 (301 removed meanwhile) fill to 3 live; 304 pushes out
        // 300, and the tombstone of 301 behind it goes too.
        push(&mut g, 0, 302);
        let p301 = g.entries(0)[1].0;
        g.remove(0, p301);
        push(&mut g, 0, 303);
        assert_eq!(push(&mut g, 0, 304).1, Some(300));
        assert_eq!(pages(&g, 0), vec![302, 303, 304]);
        g.check().unwrap();
    }

    #[test]
    fn compaction_reports_moves_in_order() {
        // Capacity 3, ring of 6: 1 _ _ _ 5 _ (tombstones at 2, 3, 4, 6):
        // full ring, 2 live. The next push compacts: 1 stays, 5 moves next
        // to it, and the new page follows.
        let mut g = GhostQueues::new(1, 3);
        for page in 1..=6 {
            let (pos, _) = push(&mut g, 0, page);
            if ![1, 5].contains(&page) {
                g.remove(0, pos);
            }
        }
        let mut moves = Vec::new();
        let (pos, out) = g.push(0, 7, |p, at| moves.push((p, at))).unwrap();
        assert_eq!((pos, out, moves), (2, None, vec![(5, 1)]));
        assert!(g.holds(0, 1) && g.holds(1, 5) && !g.holds(4, 5));
        assert_eq!(pages(&g, 0), vec![1, 5, 7]);
        g.check().unwrap();
    }

    /// Random pushes and ghost hits against a plain FIFO with removal.
    #[test]
    fn matches_a_fifo_with_removal() {
        use std::collections::{HashMap, VecDeque};
        let mut rand = crate::policy::test_rng(0x2545_f491_4f6c_dd1d_u64);
        let mut compactions = 0;
        for capacity in [1u32, 2, 3, 5, 8] {
            let mut g = GhostQueues::new(2, capacity);
            let mut model: [VecDeque<u64>; 2] = Default::default();
            let mut at: HashMap<u64, u32> = HashMap::new();
            let mut next = 0u64;
            for _ in 0..20_000 {
                let set = rand(2) as u32;
                let fifo = &mut model[set as usize];
                if !fifo.is_empty() && rand(100) < 45 {
                    let page = fifo.remove(rand(fifo.len() as u64) as usize).unwrap();
                    let pos = at.remove(&page).unwrap();
                    assert!(g.holds(pos, page));
                    g.remove(set, pos);
                    assert!(!g.holds(pos, page));
                } else {
                    next += 1;
                    let mut moved = false;
                    let (pos, out) = g
                        .push(set, next, |p, to| {
                            moved = true;
                            at.insert(p, to);
                        })
                        .unwrap();
                    compactions += u32::from(moved);
                    let expect =
                        (fifo.len() == capacity as usize).then(|| fifo.pop_front().unwrap());
                    assert_eq!(out.map(|(p, _)| p), expect);
                    if let Some(p) = expect {
                        at.remove(&p);
                    }
                    fifo.push_back(next);
                    at.insert(next, pos);
                }
                let got: Vec<u64> = g.entries(set).into_iter().map(|(_, p)| p).collect();
                assert_eq!(got, Vec::from(model[set as usize].clone()));
            }
            g.check().unwrap();
            for (&page, &pos) in &at {
                assert!(g.holds(pos, page));
            }
        }
        assert!(compactions > 0, "no compaction exercised");
    }

    #[test]
    fn zero_capacity_and_the_reserved_page() {
        let mut g = GhostQueues::new(4, 0);
        assert!(g.is_empty());
        assert_eq!(g.push(2, 5, |_, _| {}), None);
        assert!(!g.holds(0, 5));
        assert!(g.entries(2).is_empty());
        g.check().unwrap();
        let mut g = GhostQueues::new(1, 2);
        assert_eq!(g.push(0, u64::MAX, |_, _| {}), None);
        assert!(!g.holds(0, u64::MAX));
    }
}
