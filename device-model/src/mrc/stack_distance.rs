//! LRU stack distances in one pass (Mattson et al.), O(log n) per access.
//!
//! Every page access gets a *time slot*; a Fenwick tree over the slots marks
//! the slot of each page's latest access. The stack distance of a re-access
//! is the number of marks after the page's previous slot: the distinct pages
//! touched since. A fully associative LRU cache of `C` pages hits exactly the
//! re-accesses of distance `< C`, so one histogram of distances gives every
//! size's misses. Slots are renumbered (compacted) when they run out, so
//! memory follows the distinct pages, not the trace length.

use rustc_hash::FxHashMap;

/// Fewest slots the tree is built with.
const MIN_SLOTS: usize = 1 << 16;

/// Pages up to this many are tracked in a flat table (zeroed memory costs
/// nothing until touched); beyond, in a hash map.
const FLAT_PAGES: u64 = 1 << 30;

/// Marker for a slot whose page was accessed again later.
const DEAD: u64 = u64::MAX;

/// A page's latest slot (+ 1; 0: never accessed).
enum LastSlot {
    Flat(Vec<u32>),
    Map(FxHashMap<u64, u32>),
}

impl LastSlot {
    fn new(device_pages: u64) -> Self {
        match usize::try_from(device_pages) {
            Ok(n) if device_pages <= FLAT_PAGES => LastSlot::Flat(vec![0; n]),
            _ => LastSlot::Map(FxHashMap::default()),
        }
    }

    #[inline]
    fn get(&self, page: u64) -> u32 {
        match self {
            LastSlot::Flat(v) => usize::try_from(page)
                .ok()
                .and_then(|i| v.get(i).copied())
                .unwrap_or(0),
            LastSlot::Map(m) => m.get(&page).copied().unwrap_or(0),
        }
    }

    #[inline]
    fn set(&mut self, page: u64, slot_plus_one: u32) {
        match self {
            LastSlot::Flat(v) => {
                if let Some(e) = usize::try_from(page).ok().and_then(|i| v.get_mut(i)) {
                    *e = slot_plus_one;
                }
            }
            LastSlot::Map(m) => {
                m.insert(page, slot_plus_one);
            }
        }
    }
}

/// A Fenwick (binary indexed) tree of 0/1 marks over the slots.
struct Fenwick(Vec<u32>);

impl Fenwick {
    /// A tree of `n` slots with the first `marked` marked, built in O(n).
    fn with_prefix_marked(n: usize, marked: usize) -> Self {
        let mut t = vec![0u32; n + 1];
        for i in 1..=n {
            if i <= marked {
                t[i] += 1;
            }
            let parent = i + (i & i.wrapping_neg());
            if parent <= n {
                t[parent] += t[i];
            }
        }
        Fenwick(t)
    }

    #[inline]
    fn add(&mut self, slot: usize, delta: i32) {
        let mut i = slot + 1;
        while i < self.0.len() {
            self.0[i] = self.0[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Marks in slots `0..=slot`.
    #[inline]
    fn prefix(&self, slot: usize) -> u64 {
        let mut i = slot + 1;
        let mut sum = 0u64;
        while i > 0 {
            sum += u64::from(self.0[i]);
            i &= i - 1;
        }
        sum
    }
}

/// The histogram of LRU stack distances of a page-access stream.
pub struct StackDistances {
    last: LastSlot,
    tree: Fenwick,
    /// The page whose latest access has each slot ([`DEAD`] otherwise).
    slot_page: Vec<u64>,
    /// Next free slot.
    next: usize,
    /// Distinct pages seen.
    live: u64,
    /// `hist[d]`: counted re-accesses at distance `d`.
    hist: Vec<u64>,
    /// Counted first accesses (misses at every size).
    cold: u64,
    /// Counted page accesses.
    accesses: u64,
}

impl StackDistances {
    /// Empty, for pages `0..device_pages`.
    pub fn new(device_pages: u64) -> Self {
        StackDistances {
            last: LastSlot::new(device_pages),
            tree: Fenwick::with_prefix_marked(MIN_SLOTS, 0),
            slot_page: vec![DEAD; MIN_SLOTS],
            next: 0,
            live: 0,
            hist: Vec::new(),
            cold: 0,
            accesses: 0,
        }
    }

    /// One access to `page`; `counted` false during the warm-up (the
    /// stack moves, the histogram does not).
    #[inline]
    pub fn access(&mut self, page: u64, counted: bool) {
        if self.next == self.slot_page.len() {
            self.compact();
        }
        let prev = self.last.get(page);
        if prev == 0 {
            self.live += 1;
            if counted {
                self.cold += 1;
            }
        } else {
            let slot = (prev - 1) as usize;
            let distance = self.live - self.tree.prefix(slot);
            self.tree.add(slot, -1);
            self.slot_page[slot] = DEAD;
            if counted {
                let d = usize::try_from(distance).unwrap_or(usize::MAX);
                if d >= self.hist.len() {
                    self.hist
                        .resize(d.saturating_add(1).max(self.hist.len() * 2), 0);
                }
                self.hist[d] += 1;
            }
        }
        if counted {
            self.accesses += 1;
        }
        let slot = self.next;
        self.next += 1;
        self.tree.add(slot, 1);
        self.slot_page[slot] = page;
        // Slots stay below 2^31: the tree never holds more than twice the
        // distinct pages, and the cache's page numbers fit in u32 frames.
        self.last
            .set(page, u32::try_from(slot + 1).unwrap_or(u32::MAX));
    }

    /// Renumbers the live slots `0..live` in their order, and makes room
    /// for as many accesses again.
    fn compact(&mut self) {
        let live = usize::try_from(self.live).unwrap_or(usize::MAX);
        let n = (live.saturating_mul(2)).max(MIN_SLOTS);
        let mut pages = Vec::with_capacity(n);
        pages.extend(self.slot_page.iter().copied().filter(|&p| p != DEAD));
        for (i, &page) in pages.iter().enumerate() {
            self.last
                .set(page, u32::try_from(i + 1).unwrap_or(u32::MAX));
        }
        self.next = pages.len();
        pages.resize(n, DEAD);
        self.slot_page = pages;
        self.tree = Fenwick::with_prefix_marked(n, self.next);
    }

    /// Counted page accesses.
    pub fn accesses(&self) -> u64 {
        self.accesses
    }

    /// Distinct pages seen (warm-up included).
    pub fn distinct_pages(&self) -> u64 {
        self.live
    }

    /// Counted misses of a fully associative LRU cache of `pages` pages,
    /// for each of `pages_list` (any order).
    pub fn misses(&self, pages_list: &[u64]) -> Vec<u64> {
        // suffix[d] = re-accesses at distance >= d.
        let mut suffix = vec![0u64; self.hist.len() + 1];
        for d in (0..self.hist.len()).rev() {
            suffix[d] = suffix[d + 1] + self.hist[d];
        }
        pages_list
            .iter()
            .map(|&c| {
                let c = usize::try_from(c)
                    .unwrap_or(usize::MAX)
                    .min(self.hist.len());
                self.cold + suffix[c]
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Misses of an LRU of `c` pages by brute force.
    fn brute(pages: &[u64], c: usize) -> u64 {
        let mut stack: Vec<u64> = Vec::new();
        let mut misses = 0;
        for &p in pages {
            match stack.iter().position(|&q| q == p) {
                Some(i) if i < c => {
                    stack.remove(i);
                }
                Some(i) => {
                    stack.remove(i);
                    misses += 1;
                }
                None => misses += 1,
            }
            stack.insert(0, p);
        }
        misses
    }

    #[test]
    fn distances_match_a_brute_force_lru_through_compactions() {
        let mut x = 12345u64;
        let pages: Vec<u64> = (0..200_000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 33) % 300
            })
            .collect();
        for flat in [true, false] {
            let mut sd = StackDistances::new(if flat { 300 } else { u64::MAX });
            for &p in &pages {
                sd.access(p, true);
            }
            let sizes = [1u64, 2, 10, 100, 299, 300, 1000];
            let got = sd.misses(&sizes);
            for (&c, &m) in sizes.iter().zip(&got) {
                assert_eq!(m, brute(&pages, c as usize), "size {c}");
            }
        }
    }

    #[test]
    fn warm_up_accesses_move_the_stack_but_are_not_counted() {
        let mut sd = StackDistances::new(16);
        for p in [1, 2, 3] {
            sd.access(p, false);
        }
        sd.access(1, true);
        assert_eq!(sd.accesses(), 1);
        assert_eq!(sd.misses(&[2, 3]), vec![1, 0]);
    }
}
