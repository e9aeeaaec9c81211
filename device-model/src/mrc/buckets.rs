//! Counts of a one-pass curve: every measured page access is a cold miss or
//! has a *threshold* `d` (it misses in caches of at most `d` pages, hits in
//! larger ones), counted in buckets between the cache sizes asked for, so
//! the counts stay in the CPU's cache and any size's misses are a sum.

/// Misses per size of a one-pass curve.
#[derive(Debug, Clone)]
pub struct Buckets {
    /// The sizes asked for, in pages, ascending, distinct.
    bounds: Vec<u64>,
    /// `counts[i]`: re-accesses with `bounds[i-1] <= d < bounds[i]` (0:
    /// below the smallest size, the last: at or above the largest).
    counts: Vec<u64>,
    /// First accesses (misses at every size).
    cold: u64,
    /// Page accesses.
    accesses: u64,
}

impl Buckets {
    /// Empty, for caches of `sizes` pages.
    pub fn new(sizes: &[u64]) -> Self {
        let mut bounds = sizes.to_vec();
        bounds.sort_unstable();
        bounds.dedup();
        Buckets {
            counts: vec![0; bounds.len() + 1],
            bounds,
            cold: 0,
            accesses: 0,
        }
    }

    /// A first access.
    #[inline]
    pub fn cold(&mut self) {
        self.cold += 1;
        self.accesses += 1;
    }

    /// A re-access that misses in caches of at most `d` pages.
    #[inline]
    pub fn reuse(&mut self, d: u64) {
        self.reuse_in(self.bucket(d));
    }

    /// The bucket of a re-access that misses in caches of at most `d`
    /// pages (for [`Buckets::reuse_in`]): a binary search over the sizes.
    #[inline]
    pub fn bucket(&self, d: u64) -> usize {
        self.bounds.partition_point(|&c| c <= d)
    }

    /// A re-access in bucket `b` ([`Buckets::bucket`]); one past the last
    /// is taken as the last.
    #[inline]
    pub fn reuse_in(&mut self, b: usize) {
        let last = self.counts.len() - 1;
        self.counts[b.min(last)] += 1;
        self.accesses += 1;
    }

    /// Page accesses counted.
    pub fn accesses(&self) -> u64 {
        self.accesses
    }

    /// Misses of a cache of each of `pages_list` pages (`None`: not a size
    /// asked for).
    pub fn misses(&self, pages_list: &[u64]) -> Vec<Option<u64>> {
        // suffix[i]: re-accesses with d >= bounds[i].
        let mut suffix = vec![0u64; self.bounds.len()];
        let mut sum = 0;
        for i in (0..self.bounds.len()).rev() {
            sum += self.counts[i + 1];
            suffix[i] = sum;
        }
        pages_list
            .iter()
            .map(|c| {
                let i = self.bounds.binary_search(c).ok()?;
                Some(self.cold + suffix[i])
            })
            .collect()
    }
}
