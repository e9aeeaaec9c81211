//! SHARDS proper for LRU (Waldspurger et al., FAST'15): the exact pass's
//! [`StackDistances`] runs over a spatial sample ([`super::shards`]) alone,
//! each re-access's distance scaled to `d / R`, one pass for every size.
//!
//! R is the sample's realized rate (its share of the input's distinct
//! pages), as for the miniatures. In fixed-size mode the sample is the one
//! its final rate would have taken from the start ([`super::shards::Sampler`]
//! drops what it kept at higher rates), so every distance is scaled by
//! that one rate; SHARDS' online fixed-size pass instead scales each
//! distance by the rate of its moment and keeps counts of evicted pages.
//! The estimate is SHARDS_adj's ([`Sample::estimate`]): misses over R × the
//! input's page lookups, which puts the difference between the sampled
//! lookups and R × the input's into the first bucket (hits at every size).

use super::shards::Sample;
use super::stack_distance::StackDistances;
use crate::{PAGE_SHIFT, PAGE_SIZE};

/// One point of a sampled LRU curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledPoint {
    /// Cache size.
    pub size_bytes: u64,
    /// Measured misses of the sample (scaled distances at or above the
    /// size, and first accesses).
    pub sampled_misses: u64,
    /// The estimate: [`Sample::estimate`] of `sampled_misses`.
    pub miss_ratio: f64,
}

/// The sampled LRU curve of `sample` at `sizes` (bytes, whole pages).
pub fn curve(sample: &Sample, sizes: &[u64]) -> Vec<SampledPoint> {
    let pages: Vec<u64> = sizes.iter().map(|s| s / PAGE_SIZE).collect();
    // Sample pages are renamed 0, 1, 2, …: a table over the largest name.
    let names = sample
        .accesses
        .iter()
        .map(|a| a.addr >> PAGE_SHIFT)
        .max()
        .map_or(0, |m| m.saturating_add(1));
    let mut stack = StackDistances::scaled(names, &pages, sample.realized_rate);
    for (i, a) in (0u64..).zip(&sample.accesses) {
        stack.access(a.addr >> PAGE_SHIFT, i >= sample.warmup);
    }
    stack
        .misses(&pages)
        .into_iter()
        .zip(sizes)
        .filter_map(|(misses, &size_bytes)| {
            let sampled_misses = misses?;
            Some(SampledPoint {
                size_bytes,
                sampled_misses,
                miss_ratio: sample.estimate(sampled_misses),
            })
        })
        .collect()
}
