//! LRU stack distances in one pass (Mattson et al.), O(log n) per access.
//!
//! Every page access gets a *time slot*; a bitmap over the slots (with a
//! Fenwick tree over its words) marks the slot of each page's latest access. The stack distance of a re-access
//! is the number of marks after the page's previous slot: the distinct pages
//! touched since. A fully associative LRU cache of `C` pages hits exactly the
//! re-accesses of distance `< C`, so one histogram of distances gives every
//! size's misses (counted in buckets between the sizes asked for, so the
//! histogram stays in the CPU's cache). Slots are renumbered (compacted) when they run out, so
//! memory follows the distinct pages, not the trace length.

use super::buckets::Buckets;
use super::page_table::PageTable;
use crate::slot::prefetch_read;

/// Fewest slots the tree is built with.
const MIN_SLOTS: usize = 1 << 16; // a multiple of 64

/// Marker for a slot whose page was accessed again later.
const DEAD: u64 = u64::MAX;

/// 0/1 marks over the slots: a bit per slot, and a Fenwick (binary
/// indexed) tree of the marks per 64-slot word. The tree is 64 times
/// smaller than one over the slots (it stays in the CPU's cache for
/// millions of slots), and a count is a tree walk plus one popcount.
struct Marks {
    bits: Vec<u64>,
    /// Fenwick tree over the words' counts (1-based).
    tree: Vec<u32>,
}

impl Marks {
    /// `n` slots (a multiple of 64) with the first `marked` marked, built in O(n).
    fn with_prefix_marked(n: usize, marked: usize) -> Self {
        let words = n / 64;
        let mut bits = vec![0u64; words];
        for (w, word) in bits.iter_mut().enumerate() {
            let lo = w * 64;
            *word = match marked.saturating_sub(lo) {
                0 => 0,
                k if k >= 64 => u64::MAX,
                k => (1u64 << k) - 1,
            };
        }
        let mut tree = vec![0u32; words + 1];
        for i in 1..=words {
            tree[i] += bits[i - 1].count_ones();
            let parent = i + (i & i.wrapping_neg());
            if parent <= words {
                tree[parent] += tree[i];
            }
        }
        Marks { bits, tree }
    }

    fn len(&self) -> usize {
        self.bits.len() * 64
    }

    #[inline]
    fn set(&mut self, slot: usize, on: bool) {
        let w = slot / 64;
        let bit = 1u64 << (slot % 64);
        let delta: i32 = if on { 1 } else { -1 };
        if on {
            self.bits[w] |= bit;
        } else {
            self.bits[w] &= !bit;
        }
        let mut i = w + 1;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Marks in slots `0..=slot`.
    #[inline]
    fn prefix(&self, slot: usize) -> u64 {
        let w = slot / 64;
        let upto = u64::MAX >> (63 - slot % 64);
        let mut sum = u64::from((self.bits[w] & upto).count_ones());
        let mut i = w;
        while i > 0 {
            sum += u64::from(self.tree[i]);
            i &= i - 1;
        }
        sum
    }
}

/// A sampled re-access's distance `d` (distinct sampled pages touched
/// since) as the full stream's, `⌊d / rate⌋`: each sampled page stands for
/// `1 / rate` pages, and a cache of `C` pages hits iff `d / rate < C`.
/// Saturates at `u64::MAX` (a rate of 0 or less: every re-access misses).
#[inline]
pub fn scaled_distance(d: u64, rate: f64) -> u64 {
    if rate >= 1.0 {
        return d;
    }
    if rate.is_nan() || rate <= 0.0 {
        return u64::MAX;
    }
    // `as` saturates above u64::MAX.
    (d as f64 / rate) as u64
}

/// The most entries of [`StackDistances`]' table of buckets by distance
/// (32 KiB). Where every distance at which the largest size still hits
/// fits it, a distance finds its bucket there, clamped to the last entry,
/// instead of by a binary search over the sizes: the search's chain of
/// dependent compares was half the sampled pass's time over a small
/// working set. A branch on the distance instead (a table for the short
/// ones alone) cost a zipf pass more than it saved.
const TABLE_MAX: usize = 1 << 14;

/// The bucket of each distance `0..L` (scaled at `rate`), where the last,
/// `L − 1`, is the first in the last bucket (missing at every size, as
/// every longer one): empty where that needs more than [`TABLE_MAX`]
/// entries or the buckets do not fit a `u16`.
fn bucket_table(counts: &Buckets, rate: f64) -> Vec<u16> {
    let last = counts.bucket(u64::MAX);
    let mut table = Vec::new();
    for d in 0..TABLE_MAX as u64 {
        let Ok(b) = u16::try_from(counts.bucket(scaled_distance(d, rate))) else {
            return Vec::new();
        };
        table.push(b);
        if usize::from(b) == last {
            return table;
        }
    }
    Vec::new()
}

/// The histogram of LRU stack distances of a page-access stream, counted
/// in buckets between the cache sizes asked for.
pub struct StackDistances {
    /// Each page's latest slot + 1 (0: never accessed).
    last: PageTable<u32>,
    marks: Marks,
    /// The page whose latest access has each slot ([`DEAD`] otherwise).
    slot_page: Vec<u64>,
    /// Next free slot.
    next: usize,
    /// Distinct pages seen.
    live: u64,
    /// Counted accesses: a re-access misses in caches of at most its distance.
    counts: Buckets,
    /// The sampling rate distances are scaled by (1: counted as measured).
    rate: f64,
    /// The bucket of each distance ([`bucket_table`]; empty: searched).
    table: Vec<u16>,
}

impl StackDistances {
    /// Empty, for pages `0..device_pages`, counting for caches of `sizes` pages.
    pub fn new(device_pages: u64, sizes: &[u64]) -> Self {
        StackDistances::scaled(device_pages, sizes, 1.0)
    }

    /// As [`StackDistances::new`], for a spatial sample at `rate`: each
    /// distance `d` is counted as [`scaled_distance`]`(d, rate)`.
    pub fn scaled(device_pages: u64, sizes: &[u64], rate: f64) -> Self {
        let counts = Buckets::new(sizes);
        let table = bucket_table(&counts, rate);
        StackDistances {
            last: PageTable::new(device_pages),
            marks: Marks::with_prefix_marked(MIN_SLOTS, 0),
            slot_page: vec![DEAD; MIN_SLOTS],
            next: 0,
            live: 0,
            counts,
            rate,
            table,
        }
    }

    /// A hint that `page` will be accessed soon: starts loading its
    /// latest-slot entry (a random read into a table over the device's
    /// pages, the pass's costliest miss). Changes nothing counted.
    #[inline]
    pub fn hint_upcoming(&self, page: u64) {
        self.last.prefetch(page);
    }

    /// A second hint, some accesses after [`StackDistances::hint_upcoming`]:
    /// starts loading the marks' word of `page`'s latest slot.
    #[inline]
    pub fn hint_imminent(&self, page: u64) {
        let prev = self.last.get(page);
        if prev != 0 {
            if let Some(word) = self.marks.bits.get((prev as usize - 1) / 64) {
                prefetch_read(word);
            }
        }
    }

    /// One access to `page`; `counted` false during the warm-up (the
    /// stack moves, the histogram does not).
    #[inline]
    pub fn access(&mut self, page: u64, counted: bool) {
        if self.next == self.marks.len() {
            self.compact();
        }
        let prev = self.last.get(page);
        if prev != 0 && prev as usize == self.next {
            // The page on top of the stack again: distance 0, and the stack
            // stays as it is (a sample's runs of one hot page).
            if counted {
                self.count_reuse(0);
            }
            return;
        }
        if prev == 0 {
            self.live += 1;
            if counted {
                self.counts.cold();
            }
        } else {
            let slot = (prev - 1) as usize;
            let distance = self.live - self.marks.prefix(slot);
            self.marks.set(slot, false);
            self.slot_page[slot] = DEAD;
            if counted {
                self.count_reuse(distance);
            }
        }
        let slot = self.next;
        self.next += 1;
        self.marks.set(slot, true);
        self.slot_page[slot] = page;
        // Slots stay below 2^31: the marks never span more than twice the
        // distinct pages, and those fit the device's u32 page table.
        self.last
            .set(page, u32::try_from(slot + 1).unwrap_or(u32::MAX));
    }

    /// Counts a re-access at (sampled) distance `distance`.
    #[inline]
    fn count_reuse(&mut self, distance: u64) {
        match self.table.len().checked_sub(1) {
            Some(last) => {
                // Clamped: every distance from the last entry on misses at
                // every size.
                let i = usize::try_from(distance).map_or(last, |d| d.min(last));
                self.counts.reuse_in(usize::from(self.table[i]));
            }
            None => self.counts.reuse(scaled_distance(distance, self.rate)),
        }
    }

    /// Renumbers the live slots `0..live` in their order, and makes room
    /// for as many accesses again.
    fn compact(&mut self) {
        let live = usize::try_from(self.live).unwrap_or(usize::MAX);
        let n = (live.saturating_mul(2)).max(MIN_SLOTS).next_multiple_of(64);
        let mut pages = Vec::with_capacity(n);
        pages.extend(self.slot_page.iter().copied().filter(|&p| p != DEAD));
        for (i, &page) in pages.iter().enumerate() {
            self.last
                .set(page, u32::try_from(i + 1).unwrap_or(u32::MAX));
        }
        self.next = pages.len();
        pages.resize(n, DEAD);
        self.slot_page = pages;
        self.marks = Marks::with_prefix_marked(n, self.next);
    }

    /// The counts.
    pub fn counts(&self) -> &Buckets {
        &self.counts
    }

    /// Counted page accesses.
    pub fn accesses(&self) -> u64 {
        self.counts.accesses()
    }

    /// Distinct pages seen (warm-up included).
    pub fn distinct_pages(&self) -> u64 {
        self.live
    }

    /// Counted misses of a fully associative LRU cache of each of
    /// `pages_list` pages (`None`: not a size given to [`StackDistances::new`]).
    pub fn misses(&self, pages_list: &[u64]) -> Vec<Option<u64>> {
        self.counts.misses(pages_list)
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
            let sizes = [1u64, 2, 10, 63, 64, 65, 100, 299, 300, 1000];
            let mut sd = StackDistances::new(if flat { 300 } else { u64::MAX }, &sizes);
            for &p in &pages {
                sd.access(p, true);
            }
            let got = sd.misses(&sizes);
            for (&c, &m) in sizes.iter().zip(&got) {
                assert_eq!(m, Some(brute(&pages, c as usize)), "size {c}");
            }
            assert_eq!(sd.misses(&[7]), vec![None]);
        }
    }

    #[test]
    fn sampled_distances_are_scaled_by_one_over_the_rate() {
        assert_eq!(scaled_distance(0, 0.01), 0);
        assert_eq!(scaled_distance(3, 0.01), 300);
        assert_eq!(scaled_distance(7, 1.0), 7);
        assert_eq!(scaled_distance(1, 0.3), 3);
        assert_eq!(scaled_distance(u64::MAX, 0.5), u64::MAX);
        assert_eq!(scaled_distance(1, 0.0), u64::MAX);
        // In the pass: a, b, c, a has distance 2, counted as 8 at rate 1/4:
        // it misses in caches of up to 8 pages, hits in one of 9.
        let mut sd = StackDistances::scaled(16, &[2, 3, 8, 9], 0.25);
        for p in [1, 2, 3, 1] {
            sd.access(p, true);
        }
        assert_eq!(
            sd.misses(&[2, 3, 8, 9]),
            vec![Some(4), Some(4), Some(4), Some(3)]
        );
        let mut exact = StackDistances::new(16, &[2, 3]);
        for p in [1, 2, 3, 1] {
            exact.access(p, true);
        }
        assert_eq!(exact.misses(&[2, 3]), vec![Some(4), Some(3)]);
    }

    #[test]
    fn a_table_of_buckets_counts_as_the_search_does() {
        assert_eq!(
            bucket_table(&Buckets::new(&[2, 5]), 1.0),
            vec![0, 0, 1, 1, 1, 2]
        );
        assert_eq!(bucket_table(&Buckets::new(&[2, 5]), 0.5), vec![0, 1, 1, 2]);
        assert!(bucket_table(&Buckets::new(&[TABLE_MAX as u64]), 1.0).is_empty());
        // A cycle over n pages, twice: every re-access is at distance
        // n − 1. Sizes within the table's reach (a table), and past it
        // (searched).
        let cycle = |n: u64, sizes: &[u64], rate: f64| {
            let mut sd = StackDistances::scaled(n, sizes, rate);
            for p in (0..n).chain(0..n) {
                sd.access(p, true);
            }
            sd.misses(sizes)
        };
        let sizes = [8190, 8192, 8194];
        assert!(!bucket_table(&Buckets::new(&sizes), 1.0).is_empty());
        for (n, rate, misses) in [
            (4096u64, 1.0, [4096, 4096, 4096]),
            (4096, 0.5, [8192, 4096, 4096]),
            (4097, 0.5, [8194, 8194, 4097]),
            (4100, 0.5, [8200, 8200, 8200]),
            (8193, 1.0, [16386, 16386, 8193]),
        ] {
            let want: Vec<Option<u64>> = misses.iter().map(|&m| Some(m)).collect();
            assert_eq!(cycle(n, &sizes, rate), want, "{n} pages at {rate}");
        }
        let far = [20_000];
        assert!(bucket_table(&Buckets::new(&far), 1.0).is_empty());
        assert_eq!(cycle(20_000, &far, 1.0), vec![Some(20_000)]);
        assert_eq!(cycle(20_001, &far, 1.0), vec![Some(40_002)]);
    }

    #[test]
    fn warm_up_accesses_move_the_stack_but_are_not_counted() {
        let mut sd = StackDistances::new(16, &[2, 3]);
        for p in [1, 2, 3] {
            sd.access(p, false);
        }
        sd.access(1, true);
        assert_eq!(sd.accesses(), 1);
        assert_eq!(sd.misses(&[2, 3]), vec![Some(1), Some(0)]);
    }
}
