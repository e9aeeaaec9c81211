//! LIFO's whole curve in one pass, exactly.
//!
//! A fully associative LIFO cache of `C` pages evicts the page inserted
//! last, and a hit changes nothing. Once full, it holds for ever the first
//! `C − 1` pages ever accessed (ranks `0..C−1` in order of first access),
//! and its last frame holds the page of the latest access to any other
//! page (that access either hit that frame or missed into it). So a
//! re-access of page `X` (rank `r`) hits iff `r < C − 1`, or no page of
//! rank `≥ C − 1` was accessed since `X`'s previous access: with `M` the
//! largest rank accessed in between (−1 if none), it hits iff
//! `C > min(r, M) + 1`. `M` comes from a stack of (time, rank) whose ranks
//! fall from bottom to top — a suffix maximum, found by binary search. A
//! new page has the largest rank yet and empties the stack, so it stays
//! short.

use super::buckets::Buckets;
use super::page_table::PageTable;

/// The LIFO thresholds of a page-access stream.
pub struct LifoThresholds {
    /// Each page's first-access rank + 1 (0: never accessed).
    rank: PageTable<u64>,
    /// Each page's latest access time. (Two tables of integers: zeroed
    /// memory, touched only where pages are.)
    time_of: PageTable<u64>,
    /// (time, rank) of accesses whose rank is above every later one's.
    maxima: Vec<(u64, u64)>,
    time: u64,
    ranks: u64,
    counts: Buckets,
}

impl LifoThresholds {
    /// Empty, for pages `0..device_pages`, counting for caches of `sizes` pages.
    pub fn new(device_pages: u64, sizes: &[u64]) -> Self {
        LifoThresholds {
            rank: PageTable::new(device_pages),
            time_of: PageTable::new(device_pages),
            maxima: Vec::new(),
            time: 0,
            ranks: 0,
            counts: Buckets::new(sizes),
        }
    }

    /// A hint that `page` will be accessed soon: starts loading its entry.
    #[inline]
    pub fn hint_upcoming(&self, page: u64) {
        self.rank.prefetch(page);
        self.time_of.prefetch(page);
    }

    /// One access to `page`; `counted` false during the warm-up.
    #[inline]
    pub fn access(&mut self, page: u64, counted: bool) {
        let rank_plus_one = self.rank.get(page);
        let rank = if rank_plus_one == 0 {
            self.ranks += 1;
            if counted {
                self.counts.cold();
            }
            self.ranks - 1
        } else {
            let rank = rank_plus_one - 1;
            if counted {
                // The largest rank accessed after the page's previous access.
                let previous = self.time_of.get(page);
                let i = self.maxima.partition_point(|&(t, _)| t <= previous);
                let threshold = match self.maxima.get(i) {
                    Some(&(_, m)) => rank.min(m) + 1,
                    None => 0,
                };
                self.counts.reuse(threshold);
            }
            rank
        };
        while self.maxima.last().is_some_and(|&(_, r)| r <= rank) {
            self.maxima.pop();
        }
        self.maxima.push((self.time, rank));
        self.rank.set(page, rank + 1);
        self.time_of.set(page, self.time);
        self.time += 1;
    }

    /// The counts.
    pub fn counts(&self) -> &Buckets {
        &self.counts
    }

    /// Counted page accesses.
    pub fn accesses(&self) -> u64 {
        self.counts.accesses()
    }

    /// Counted misses of a fully associative LIFO cache of each of
    /// `pages_list` pages (`None`: not a size given to [`LifoThresholds::new`]).
    pub fn misses(&self, pages_list: &[u64]) -> Vec<Option<u64>> {
        self.counts.misses(pages_list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Misses of a LIFO cache of `c` pages by brute force.
    fn brute(pages: &[u64], c: usize) -> u64 {
        let mut cache: Vec<u64> = Vec::new();
        let mut misses = 0;
        for &p in pages {
            if cache.contains(&p) {
                continue;
            }
            misses += 1;
            if cache.len() == c {
                cache.pop();
            }
            cache.push(p);
        }
        misses
    }

    #[test]
    fn thresholds_match_a_brute_force_lifo() {
        let mut x = 99u64;
        let pages: Vec<u64> = (0..50_000)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Mostly a hot set, with scans and repeats.
                match (x >> 60) % 4 {
                    0 => (x >> 33) % 400,
                    1 => i % 97,
                    _ => (x >> 40) % 40,
                }
            })
            .collect();
        let sizes = [1u64, 2, 3, 10, 39, 40, 41, 100, 399, 400, 500];
        for flat in [true, false] {
            let mut t = LifoThresholds::new(if flat { 400 } else { u64::MAX }, &sizes);
            for &p in &pages {
                t.access(p, true);
            }
            for (&c, m) in sizes.iter().zip(t.misses(&sizes)) {
                assert_eq!(m, Some(brute(&pages, c as usize)), "size {c}");
            }
        }
    }
}
