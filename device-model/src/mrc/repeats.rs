//! Runs of accesses to one page, cut to the accesses a miniature can tell
//! apart.
//!
//! Where [`super::limits::miniature`] holds (a closed loop, no prefetch, no
//! write log), an access to the page that the access before it touched is
//! a hit: that access placed the page, and nothing has happened since. A
//! hit changes what later accesses find in two ways only: the policy hears
//! it, and its state settles after [`crate::Device::settling_hits`] hits in
//! a row; and a write sets the page's dirty bit, which decides write-backs
//! but no victim (a write miss allocates as a read miss does). So in a run
//! of accesses to one page, the first access and the next `settling` ones
//! are all that decide later misses; leaving out the others changes no
//! miss, eviction or resident page (only which pages are dirty, which a
//! miniature does not report).
//!
//! A real trace's sample is often mostly such runs: a hot page, once
//! sampled, brings its references in long runs (the other pages are not
//! in the sample to break them), and every miniature replays the whole
//! sample.

use crate::trace::Access;
use crate::PAGE_SHIFT;
use std::borrow::Cow;

/// A sample's accesses with the runs' settled repeats left out.
#[derive(Debug, Clone)]
pub struct Trimmed<'a> {
    /// The accesses kept, in order.
    pub accesses: Cow<'a, [Access]>,
    /// How many of them (the first ones) belong to the warm-up.
    pub warmup: u64,
}

/// `accesses` (the first `warmup` of them the warm-up's) without the
/// repeats that `settling` hits in a row make void (module doc). `None`:
/// the policy never settles, and every access is kept.
pub fn trim(accesses: &[Access], warmup: u64, settling: Option<u32>) -> Trimmed<'_> {
    let whole = Trimmed {
        accesses: Cow::Borrowed(accesses),
        warmup,
    };
    let Some(settling) = settling else {
        return whole;
    };
    let mut run = Run::new(settling);
    let kept = accesses.iter().filter(|a| run.keeps(a)).count();
    if kept == accesses.len() {
        return whole;
    }
    let mut run = Run::new(settling);
    let mut out = Vec::with_capacity(kept);
    let mut warm_kept = 0u64;
    for (i, a) in accesses.iter().enumerate() {
        if run.keeps(a) {
            if (i as u64) < warmup {
                warm_kept += 1;
            }
            out.push(*a);
        }
    }
    Trimmed {
        accesses: Cow::Owned(out),
        // An input that ends within its warm-up is measured whole (as a
        // replay takes it): so is the trimmed one.
        warmup: if usize::try_from(warmup).map_or(true, |w| w > accesses.len()) {
            warmup
        } else {
            warm_kept
        },
    }
}

/// The run of accesses to one page that the last access belongs to.
struct Run {
    settling: u32,
    /// Its page (`None`: the last access spanned pages, and no run is open).
    page: Option<u64>,
    /// Accesses of the run after its first, as far as kept for settling.
    hits: u32,
}

impl Run {
    fn new(settling: u32) -> Self {
        Run {
            settling,
            page: None,
            hits: 0,
        }
    }

    /// Whether `a` may decide a later miss (and so is kept); moves the run on.
    fn keeps(&mut self, a: &Access) -> bool {
        let page = a.addr >> PAGE_SHIFT;
        let last = a.addr.saturating_add(u64::from(a.len.max(1)) - 1) >> PAGE_SHIFT;
        if last != page {
            self.page = None;
            return true;
        }
        if self.page != Some(page) {
            self.page = Some(page);
            self.hits = 0;
            return true;
        }
        if self.hits < self.settling {
            self.hits += 1;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Op, PAGE_SIZE};

    fn at(page: u64, op: Op) -> Access {
        Access {
            time_ns: 0,
            op,
            addr: page * PAGE_SIZE + 8,
            len: 64,
        }
    }

    #[test]
    fn a_run_keeps_its_first_access_and_the_settling_hits() {
        let r = Op::Read;
        let w = Op::Write;
        let seq = [
            at(1, r),
            at(1, r),
            at(1, r),
            at(1, r),
            at(1, w),
            at(1, w),
            at(2, r),
            at(1, r),
        ];
        let t = trim(&seq, 3, Some(1));
        let kept: Vec<_> = t
            .accesses
            .iter()
            .map(|a| (a.addr / PAGE_SIZE, a.op))
            .collect();
        assert_eq!(kept, vec![(1, r), (1, r), (2, r), (1, r)]);
        // Of the first three (the warm-up), two are kept.
        assert_eq!(t.warmup, 2);
        // Settling 0: only each run's first access.
        assert_eq!(trim(&seq, 0, Some(0)).accesses.len(), 3);
        // A warm-up that the input ends within stays past its end; one
        // that ends with it, at its end.
        assert_eq!(trim(&seq, 20, Some(1)).warmup, 20);
        assert_eq!(trim(&seq, 8, Some(1)).warmup, 4);
        // Never settling: everything, borrowed.
        assert!(matches!(trim(&seq, 0, None).accesses, Cow::Borrowed(_)));
    }

    #[test]
    fn an_access_over_two_pages_ends_the_run() {
        let span = Access {
            time_ns: 0,
            op: Op::Read,
            addr: PAGE_SIZE - 8,
            len: 16,
        };
        let seq = [at(0, Op::Read), span, at(0, Op::Read), at(0, Op::Read)];
        let t = trim(&seq, 0, Some(0));
        assert_eq!(t.accesses.len(), 3);
    }
}
