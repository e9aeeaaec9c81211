//! Latency histograms (HDR, 1 ns .. 100 s, 3 significant digits) and their
//! export: quantiles ([`LatencySummary`]) and cumulative Prometheus buckets.

use hdrhistogram::Histogram;

pub use cxlfs_api::metrics::LatencySummary;

/// Upper bounds (ns) of the Prometheus histogram buckets (`le`), then +Inf.
pub const BUCKETS_NS: [u64; 18] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
];

/// A new, empty latency histogram.
pub(super) fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s, 3 significant digits: constant, valid bounds.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("constant histogram bounds are valid")
}

/// Records `v` ns; out of range (> 100 s) counts as the highest value.
pub(super) fn put(h: &mut Histogram<u64>, v: u64) {
    h.saturating_record(v.max(1));
}

/// The histograms a reply records into, under one lock.
#[derive(Debug)]
pub(super) struct ReplyHistograms {
    pub(super) pacing: Histogram<u64>,
    pub(super) pacing_long: Histogram<u64>,
    pub(super) fuse: Histogram<u64>,
}

impl Default for ReplyHistograms {
    fn default() -> Self {
        ReplyHistograms {
            pacing: new_histogram(),
            pacing_long: new_histogram(),
            fuse: new_histogram(),
        }
    }
}

/// A latency histogram as exported: quantiles and cumulative buckets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatencyExport {
    /// Quantiles.
    pub summary: LatencySummary,
    /// Samples `<=` each of [`BUCKETS_NS`] (cumulative).
    pub buckets: Vec<u64>,
}

/// The recorded values of a histogram: `(highest equivalent value, count)`
/// per non-empty bucket, ascending. Cheap (only non-empty buckets are
/// visited), so the lock is held briefly and rows can be merged without
/// allocating whole histograms.
pub(super) fn recorded(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_since_last_iteration()))
        .collect()
}

impl LatencyExport {
    /// Quantiles (as HDR's `value_at_quantile`: the highest equivalent
    /// value of the bucket holding the rank) and buckets of `values`
    /// (ascending `(value, count)` pairs, as [`recorded`] gives them).
    pub(super) fn from_recorded(values: &[(u64, u64)]) -> Self {
        let count: u64 = values.iter().map(|&(_, n)| n).sum();
        if count == 0 {
            return LatencyExport {
                summary: LatencySummary::default(),
                buckets: vec![0; BUCKETS_NS.len()],
            };
        }
        let qs = [0.5, 0.9, 0.99, 0.999];
        let mut at = [0u64; 4];
        let targets: Vec<u64> = qs
            .iter()
            .map(|q| ((q * count as f64).ceil() as u64).clamp(1, count))
            .collect();
        let mut buckets = vec![0u64; BUCKETS_NS.len()];
        let (mut seen, mut sum, mut qi) = (0u64, 0f64, 0usize);
        for &(v, n) in values {
            seen += n;
            sum += v as f64 * n as f64;
            while qi < qs.len() && seen >= targets[qi] {
                at[qi] = v;
                qi += 1;
            }
            if let Some(b) = BUCKETS_NS.iter().position(|&le| v <= le) {
                buckets[b] += n;
            }
        }
        for i in 1..buckets.len() {
            buckets[i] += buckets[i - 1];
        }
        LatencyExport {
            summary: LatencySummary {
                count,
                p50: at[0],
                p90: at[1],
                p99: at[2],
                p999: at[3],
                max: values.last().map_or(0, |&(v, _)| v),
                mean: sum / count as f64,
            },
            buckets,
        }
    }

    /// The export of one histogram.
    pub(super) fn of(h: &Histogram<u64>) -> Self {
        Self::from_recorded(&recorded(h))
    }
}

/// Merges ascending `(value, count)` lists into one ascending list.
pub(super) fn merge_recorded(lists: &[Vec<(u64, u64)>]) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = lists.iter().flatten().copied().collect();
    all.sort_unstable_by_key(|&(v, _)| v);
    all.dedup_by(|b, a| {
        if a.0 == b.0 {
            a.1 += b.1;
            true
        } else {
            false
        }
    });
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_buckets_match_hdr() {
        let mut a = new_histogram();
        let mut b = new_histogram();
        let mut both = new_histogram();
        let mut x = 12345u64;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = 500 + x % 3_000_000;
            let h = if i % 3 == 0 { &mut a } else { &mut b };
            h.record(v).unwrap();
            both.record(v).unwrap();
        }
        let merged = LatencyExport::from_recorded(&merge_recorded(&[recorded(&a), recorded(&b)]));
        for e in [LatencyExport::of(&both), merged] {
            let s = e.summary;
            assert_eq!(s.count, 20_000);
            assert_eq!(s.p50, both.value_at_quantile(0.5));
            assert_eq!(s.p90, both.value_at_quantile(0.9));
            assert_eq!(s.p99, both.value_at_quantile(0.99));
            assert_eq!(s.p999, both.value_at_quantile(0.999));
            assert_eq!(s.max, both.max());
            assert!((s.mean - both.mean()).abs() / both.mean() < 0.01);
            // `le` counts the buckets whose every value is <= le: HDR's
            // count up to le, less at most the bucket that straddles le.
            for (&le, &n) in BUCKETS_NS.iter().zip(&e.buckets) {
                let below = both.count_between(0, both.lowest_equivalent(le) - 1);
                assert!(below <= n && n <= both.count_between(0, le), "le {le}: {n}");
            }
        }
        let empty = LatencyExport::of(&new_histogram());
        assert_eq!(empty.summary, LatencySummary::default());
        assert!(empty.buckets.iter().all(|&n| n == 0));
    }
}
