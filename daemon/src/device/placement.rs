//! DRAM / CXL placement of file pages: a deterministic weighted interleave.
//!
//! Every pool page (4 KiB of device address space, i.e. one page of one
//! file in the pool) lives either in a **DRAM tier** (host memory:
//! always resident, never charged device time, never in the device cache)
//! or in the **CXL tier** (the emulated CXL-SSD: charged to the device model
//! as before). `cxl_ratio` (0–100 %) says which share goes to the CXL tier.
//!
//! ## The interleave
//!
//! The pool page number `p` picks a *slot* `p mod 100`, and each slot has a
//! fixed *rank* `rank(s) = 41·s mod 100`, a permutation of `0..100`. A page
//! is on the CXL tier iff `rank(p mod 100) < cxl_ratio`. So:
//!
//! * **exact**: any 100 consecutive pool pages hold exactly `cxl_ratio` CXL
//!   pages (every slot occurs once), and since a file's 2 MiB chunk is 512
//!   consecutive pool pages, the split of any file of a few hundred pages
//!   is the ratio to within a few pages;
//! * **spread out**: the CXL slots for ratio `r` are `61·k mod 100` for
//!   `k < r`, a Kronecker sequence with step 0.61 (close to the golden
//!   ratio), so the CXL pages are evenly spaced at every ratio (any window
//!   of `L` pages is within ±3 pages of `L·r/100`, tested) and a strided
//!   or small access pattern sees the ratio, not long runs of one tier;
//! * **monotone**: raising the ratio only moves pages DRAM → CXL (the CXL
//!   set for `r` contains the one for every `r' < r`), so a sweep from 0 to
//!   100 % only ever adds CXL pages;
//! * **deterministic and stateless**: the tier is a function of the pool
//!   address and the ratio, so the FUSE data path and the DAX traps (which
//!   only know pool offsets) agree without a table.
//!
//! Placement is lazy, like first-touch allocation: a page is *placed* when
//! the daemon first sees an access to it. The pool counts the placed pages
//! per slot, so the achieved split at any ratio is a 100-term sum.

use std::sync::atomic::{AtomicU8, Ordering};

/// Pages per interleave period (one percent = one page of it).
pub const PERIOD: u64 = 100;
/// `rank(slot) = slot * RANK_STEP mod 100` (41 = 61⁻¹ mod 100).
const RANK_STEP: u64 = 41;

/// The default ratio: every file page on the CXL-SSD.
pub const DEFAULT_CXL_RATIO: u8 = 100;

/// Where a page lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Host DRAM: always resident, never charged.
    Dram,
    /// The emulated CXL-SSD.
    Cxl,
}

impl Tier {
    /// `"dram"` / `"cxl"` (metric labels).
    pub fn name(self) -> &'static str {
        match self {
            Tier::Dram => "dram",
            Tier::Cxl => "cxl",
        }
    }
}

/// The rank of pool page `page`'s slot: the page is on the CXL tier for
/// every ratio above it.
#[inline]
pub fn rank(page: u64) -> u8 {
    // Both factors are below 100: no overflow, and the result fits a u8.
    ((page % PERIOD) * RANK_STEP % PERIOD) as u8
}

/// The tier of pool page `page` at `cxl_ratio` percent.
#[inline]
pub fn tier_at(cxl_ratio: u8, page: u64) -> Tier {
    if rank(page) < cxl_ratio {
        Tier::Cxl
    } else {
        Tier::Dram
    }
}

/// Why a ratio was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetCxlRatioError {
    /// Above 100 %.
    #[error("cxl_ratio must be 0..=100 (percent of file pages on the CXL-SSD), got {0}")]
    OutOfRange(u64),
}

/// Checks a ratio given as a number.
pub fn check_ratio(value: u64) -> Result<u8, SetCxlRatioError> {
    u8::try_from(value)
        .ok()
        .filter(|&r| u64::from(r) <= PERIOD)
        .ok_or(SetCxlRatioError::OutOfRange(value))
}

/// The share's placement: the current ratio. Changed only through
/// [`crate::device::SharedDevice::set_cxl_ratio`], which also moves the pages
/// (device cache, residency plane).
#[derive(Debug)]
pub struct Placement {
    ratio: AtomicU8,
}

impl Default for Placement {
    /// Every page on the CXL tier (`DEFAULT_CXL_RATIO`).
    fn default() -> Self {
        Placement {
            ratio: AtomicU8::new(DEFAULT_CXL_RATIO),
        }
    }
}

impl Placement {
    /// A placement at `cxl_ratio` percent.
    pub fn new(cxl_ratio: u8) -> Result<Self, SetCxlRatioError> {
        let r = check_ratio(u64::from(cxl_ratio))?;
        Ok(Placement {
            ratio: AtomicU8::new(r),
        })
    }

    /// The ratio in force (percent of pages on the CXL tier).
    #[inline]
    pub fn cxl_ratio(&self) -> u8 {
        self.ratio.load(Ordering::Relaxed)
    }

    /// The tier of pool page `page` now.
    #[inline]
    pub fn tier(&self, page: u64) -> Tier {
        tier_at(self.cxl_ratio(), page)
    }

    /// Sets the ratio; returns the old one. Callers move the pages.
    pub(crate) fn swap(&self, cxl_ratio: u8) -> Result<u8, SetCxlRatioError> {
        let r = check_ratio(u64::from(cxl_ratio))?;
        Ok(self.ratio.swap(r, Ordering::Relaxed))
    }
}

/// Runs of one tier in pool pages `[first, last]` at `cxl_ratio`:
/// `(first page, pages, tier)`, in order.
pub fn runs(cxl_ratio: u8, first: u64, last: u64) -> impl Iterator<Item = (u64, u64, Tier)> {
    let mut next = first;
    std::iter::from_fn(move || {
        if next > last {
            return None;
        }
        let start = next;
        let tier = tier_at(cxl_ratio, start);
        // All one tier at 0 and 100 %: one run.
        if cxl_ratio == 0 || u64::from(cxl_ratio) >= PERIOD {
            next = last + 1;
        } else {
            next += 1;
            while next <= last && tier_at(cxl_ratio, next) == tier {
                next += 1;
            }
        }
        Some((start, next.saturating_sub(start), tier))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cxl_in(r: u8, from: u64, len: u64) -> u64 {
        (from..from + len)
            .filter(|&p| tier_at(r, p) == Tier::Cxl)
            .count() as u64
    }

    #[test]
    fn ranks_are_a_permutation() {
        let mut seen = [false; 100];
        for s in 0..100 {
            seen[rank(s) as usize] = true;
        }
        assert!(seen.iter().all(|&b| b));
    }

    #[test]
    fn every_period_is_exact_at_every_ratio() {
        for r in 0..=100u8 {
            for start in [0u64, 1, 37, 99, 512, 1_000_003] {
                assert_eq!(cxl_in(r, start, 100), u64::from(r), "r={r} start={start}");
                assert_eq!(cxl_in(r, start, 51_200), 512 * u64::from(r), "r={r}");
            }
        }
    }

    #[test]
    fn any_window_is_within_three_pages_of_the_ratio() {
        for r in 0..=100u8 {
            for start in 0..100u64 {
                let mut cxl = 0i64;
                for len in 1..=300u64 {
                    if tier_at(r, start + len - 1) == Tier::Cxl {
                        cxl += 1;
                    }
                    let want = len as f64 * f64::from(r) / 100.0;
                    assert!(
                        (cxl as f64 - want).abs() <= 3.0,
                        "r={r} start={start} len={len}: {cxl} CXL pages, want {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn raising_the_ratio_only_moves_pages_to_cxl() {
        for page in 0..1000u64 {
            let mut was_cxl = false;
            for r in 0..=100u8 {
                let cxl = tier_at(r, page) == Tier::Cxl;
                assert!(!was_cxl || cxl, "page {page} went back to DRAM at {r}");
                was_cxl = cxl;
            }
            assert_eq!(tier_at(0, page), Tier::Dram);
            assert_eq!(tier_at(100, page), Tier::Cxl);
        }
    }

    #[test]
    fn deterministic_and_checked() {
        let p = Placement::new(30).unwrap();
        let a: Vec<Tier> = (0..1000).map(|x| p.tier(x)).collect();
        let b: Vec<Tier> = (0..1000).map(|x| tier_at(30, x)).collect();
        assert_eq!(a, b);
        assert_eq!(
            Placement::new(101).unwrap_err(),
            SetCxlRatioError::OutOfRange(101)
        );
        assert_eq!(check_ratio(300), Err(SetCxlRatioError::OutOfRange(300)));
        assert_eq!(p.swap(70), Ok(30));
        assert!(p.swap(101).is_err());
        assert_eq!(p.cxl_ratio(), 70);
    }

    #[test]
    fn runs_cover_the_range_in_order() {
        for r in [0u8, 1, 33, 50, 99, 100] {
            let mut next = 17u64;
            for (start, n, tier) in runs(r, 17, 700) {
                assert_eq!(start, next);
                assert!(n > 0);
                for p in start..start + n {
                    assert_eq!(tier_at(r, p), tier);
                }
                next = start + n;
            }
            assert_eq!(next, 701);
        }
        assert_eq!(runs(100, 5, 5).collect::<Vec<_>>(), [(5, 1, Tier::Cxl)]);
    }
}
