//! Miss-ratio curves: a cache's miss ratio at many sizes from one pass over
//! the input.
//!
//! * **Exact** (LRU, LIFO): [`stack_distance`] (LRU) and [`lifo_exact`]
//!   give every size's misses from one pass, equal to a replay of each size
//!   when [`limits::exact`] holds.
//! * **Sampled** (any policy): [`shards`] keeps a spatial sample of the
//!   pages at rate R; [`minisim`] runs the device model itself, with its own
//!   policy code, on a cache of `size × R` pages per size, when
//!   [`limits::miniature`] holds, each leaving out the repeats that
//!   [`repeats`] shows cannot change it. For LRU where [`limits::exact`] holds,
//!   [`sampled_lru`] runs the stack-distance pass over the sample instead
//!   (SHARDS), each distance scaled by 1/R: one pass for every size.
//!
//! A miss is what `replay` counts: a page lookup of a measured access (after
//! the warm-up) that did not hit, each page of a multi-page access counted.
//! The miss ratio is misses over page lookups.

pub mod buckets;
pub mod distinct;
pub mod lifo_exact;
pub mod limits;
pub mod minisim;
mod page_table;
pub mod repeats;
pub mod sampled_lru;
pub mod shards;
pub mod sizes;
pub mod stack_distance;

use crate::device::AccessError;
use crate::trace::{Access, Records};
use crate::{PAGE_SHIFT, PAGE_SIZE};
use buckets::Buckets;
use lifo_exact::LifoThresholds;
use shards::{Sample, Sampler};
use stack_distance::StackDistances;
use std::collections::VecDeque;

/// Why the pass over the input stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("access {index}: {error}")]
pub struct FeedError {
    /// 0-based access index (warm-up included).
    pub index: u64,
    /// What the device would have said.
    pub error: AccessError,
}

/// Why two passes over parts of the input cannot be joined.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JoinPassError {
    /// Not both fixed-rate samples alone ([`CurvePass::splittable`]).
    #[error("only a fixed-rate sample alone can be taken in parts")]
    NotSplittable,
    /// The later part does not start where this one stopped (or is of
    /// another device or warm-up).
    #[error("the later part starts at access {later}, not at {fed}")]
    NotNext {
        /// Accesses this pass was fed up to.
        fed: u64,
        /// Where the later part starts.
        later: u64,
    },
    /// The samples do not join.
    #[error(transparent)]
    Sample(shards::AppendSampleError),
}

/// One pass over the input, feeding the stack and the sampler it was asked for.
pub struct CurvePass {
    capacity_bytes: u64,
    warmup: u64,
    /// Index of the first access this pass is fed (0 unless it takes a
    /// later part of the input: [`CurvePass::part_from`]).
    first: u64,
    fed: u64,
    stack: Option<StackDistances>,
    lifo: Option<LifoThresholds>,
    sampler: Option<Sampler>,
    /// Accesses checked and not yet counted (with their warm-up flag): the
    /// counts are hinted of each [`LOOKAHEAD`] accesses before they count it,
    /// so that its table reads overlap (as the replay loop's look-ahead).
    window: VecDeque<(Access, bool)>,
}

/// Accesses the pass looks ahead; the second hint comes at half of it.
const LOOKAHEAD: usize = 16;

/// What a pass collected.
pub struct Collected {
    /// Accesses fed (warm-up included).
    pub fed: u64,
    /// The stack-distance histogram, if asked for.
    pub stack: Option<StackDistances>,
    /// LIFO's thresholds, if asked for.
    pub lifo: Option<LifoThresholds>,
    /// The sample, if asked for.
    pub sample: Option<Sample>,
}

impl CurvePass {
    /// A pass over accesses to a device of `capacity_bytes`; the first
    /// `warmup` accesses are not measured. Feeds `sampler`, if any.
    pub fn new(capacity_bytes: u64, warmup: u64, sampler: Option<Sampler>) -> CurvePass {
        CurvePass {
            capacity_bytes,
            warmup,
            first: 0,
            fed: 0,
            stack: None,
            lifo: None,
            sampler,
            window: VecDeque::with_capacity(LOOKAHEAD + 1),
        }
    }

    /// Whether the input may be fed in parts, each to its own pass, joined
    /// in order ([`CurvePass::join`]): a fixed-rate sample alone (a stack
    /// or a fixed-size sample depends on every access before).
    pub fn splittable(&self) -> bool {
        self.stack.is_none()
            && self.lifo.is_none()
            && self.sampler.as_ref().is_some_and(Sampler::is_fixed_rate)
    }

    /// This pass, unfed, for the part of the input from access `first` on:
    /// the warm-up and error indices stay those of the whole input.
    pub fn part_from(mut self, first: u64) -> CurvePass {
        if self.fed == self.first {
            self.first = first;
            self.fed = first;
        }
        self
    }

    /// An empty pass like this one for the part of the input from access
    /// `first` on, to be joined after it; `None` unless
    /// [`CurvePass::splittable`].
    pub fn part_like(&self, first: u64) -> Option<CurvePass> {
        if !self.splittable() {
            return None;
        }
        let sampler = self.sampler.as_ref().and_then(Sampler::empty_like)?;
        Some(CurvePass::new(self.capacity_bytes, self.warmup, Some(sampler)).part_from(first))
    }

    /// Makes room for the sample of `accesses` more single-page accesses
    /// ([`Sampler::reserve_for`]), where a sample is taken.
    pub fn reserve_for(&mut self, accesses: u64) {
        if let Some(s) = self.sampler.as_mut() {
            s.reserve_for(accesses);
        }
    }

    /// Access index the pass would count next (the accesses before it fed).
    pub fn next_index(&self) -> u64 {
        self.fed
    }

    /// The pass over this part and the `later` one, which starts where this
    /// one stopped: what one pass fed both in order would hold.
    pub fn join(mut self, later: CurvePass) -> Result<CurvePass, JoinPassError> {
        if !self.splittable() || !later.splittable() {
            return Err(JoinPassError::NotSplittable);
        }
        if later.first != self.fed
            || (later.capacity_bytes, later.warmup) != (self.capacity_bytes, self.warmup)
        {
            return Err(JoinPassError::NotNext {
                fed: self.fed,
                later: later.first,
            });
        }
        if let (Some(s), Some(l)) = (self.sampler.as_mut(), later.sampler) {
            s.append(l).map_err(JoinPassError::Sample)?;
        }
        self.fed = later.fed;
        Ok(self)
    }

    /// Also counts LRU stack distances for caches of `sizes` bytes.
    pub fn with_lru(mut self, sizes: &[u64]) -> CurvePass {
        let pages: Vec<u64> = sizes.iter().map(|s| s / PAGE_SIZE).collect();
        self.stack = Some(StackDistances::new(self.capacity_bytes / PAGE_SIZE, &pages));
        self
    }

    /// Also counts LIFO thresholds for caches of `sizes` bytes.
    pub fn with_lifo(mut self, sizes: &[u64]) -> CurvePass {
        let pages: Vec<u64> = sizes.iter().map(|s| s / PAGE_SIZE).collect();
        self.lifo = Some(LifoThresholds::new(self.capacity_bytes / PAGE_SIZE, &pages));
        self
    }

    /// One access; refused as the device refuses it. Inlined into the
    /// loops over many: a call per access costs the exact pass 5 %.
    #[inline(always)]
    pub fn feed(&mut self, access: &Access) -> Result<(), FeedError> {
        let index = self.fed;
        check(access.addr, access.len, self.capacity_bytes)
            .map_err(|error| FeedError { index, error })?;
        let warm = index < self.warmup;
        self.fed += 1;
        if self.stack.is_none() && self.lifo.is_none() {
            // Nothing to hint: a sample alone counts at once.
            self.count(access, warm);
            return Ok(());
        }
        if let Some(stack) = self.stack.as_ref() {
            stack.hint_upcoming(access.addr >> PAGE_SHIFT);
            if let Some((a, _)) = self.window.get(LOOKAHEAD / 2) {
                stack.hint_imminent(a.addr >> PAGE_SHIFT);
            }
        }
        if let Some(lifo) = self.lifo.as_ref() {
            lifo.hint_upcoming(access.addr >> PAGE_SHIFT);
        }
        self.window.push_back((*access, warm));
        if self.window.len() > LOOKAHEAD {
            if let Some((a, warm)) = self.window.pop_front() {
                self.count(&a, warm);
            }
        }
        Ok(())
    }

    /// Many accesses, as [`CurvePass::feed`] one by one.
    pub fn feed_batch(&mut self, batch: &[Access]) -> Result<(), FeedError> {
        if let (None, None, Some(sampler)) = (&self.stack, &self.lifo, self.sampler.as_mut()) {
            // A sample alone: nothing to look ahead for, every access
            // counted at once, in one loop with the sampler's step inlined.
            for access in batch {
                let index = self.fed;
                check(access.addr, access.len, self.capacity_bytes)
                    .map_err(|error| FeedError { index, error })?;
                self.fed += 1;
                sampler.access(access, index < self.warmup);
            }
            return Ok(());
        }
        batch.iter().try_for_each(|a| self.feed(a))
    }

    /// Many accesses, decoded or not, as [`CurvePass::feed`] one by one. A
    /// sample alone reads an undecoded record's address and length and
    /// decodes only a record it keeps. Undecoded records may be unchecked
    /// ([`crate::trace::BinaryReader::next_records_unchecked`]): one of
    /// length 0 is refused as [`CurvePass::feed`] refuses an empty access.
    pub fn feed_records(&mut self, records: Records<'_>) -> Result<(), FeedError> {
        let raw = match records {
            Records::Decoded(batch) => return self.feed_batch(batch),
            Records::Raw(raw) => raw,
        };
        if let (None, None, Some(sampler)) = (&self.stack, &self.lifo, self.sampler.as_mut()) {
            let first = self.fed;
            let warm = usize::try_from(self.warmup.saturating_sub(first)).unwrap_or(usize::MAX);
            let taken = sampler.access_records(raw, warm, self.capacity_bytes);
            self.fed += taken as u64;
            // The record that stopped it, if any, refused as `feed` would.
            return match raw.get(taken) {
                Some(record) => self.feed(&record.access()),
                None => Ok(()),
            };
        }
        raw.iter().try_for_each(|r| self.feed(&r.access()))
    }

    /// Counts one checked access.
    #[inline]
    fn count(&mut self, access: &Access, warm: bool) {
        let first = access.addr >> PAGE_SHIFT;
        let last = (access.addr + u64::from(access.len) - 1) >> PAGE_SHIFT;
        if let Some(stack) = self.stack.as_mut() {
            for page in first..=last {
                stack.access(page, !warm);
            }
        }
        if let Some(lifo) = self.lifo.as_mut() {
            for page in first..=last {
                lifo.access(page, !warm);
            }
        }
        if let Some(sampler) = self.sampler.as_mut() {
            sampler.access(access, warm);
        }
    }

    /// The pass's results.
    pub fn finish(mut self) -> Collected {
        while let Some((a, warm)) = self.window.pop_front() {
            self.count(&a, warm);
        }
        Collected {
            fed: self.fed,
            stack: self.stack,
            lifo: self.lifo,
            sample: self.sampler.map(Sampler::finish),
        }
    }
}

/// Whether the device would take an access of `len` bytes at `addr`: not
/// empty, within its `capacity_bytes`.
#[inline]
fn check(addr: u64, len: u32, capacity_bytes: u64) -> Result<(), AccessError> {
    let len = u64::from(len);
    match addr.checked_add(len) {
        _ if len == 0 => Err(AccessError::Empty { addr }),
        Some(end) if end <= capacity_bytes => Ok(()),
        _ => Err(AccessError::OutOfRange {
            addr,
            len,
            capacity: capacity_bytes,
        }),
    }
}

/// One point of an exact curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExactPoint {
    /// Cache size.
    pub size_bytes: u64,
    /// Measured misses.
    pub misses: u64,
    /// Measured page lookups.
    pub page_accesses: u64,
}

impl ExactPoint {
    /// Misses over page lookups (0 with none).
    pub fn miss_ratio(&self) -> f64 {
        if self.page_accesses == 0 {
            0.0
        } else {
            self.misses as f64 / self.page_accesses as f64
        }
    }
}

/// An exact curve (LRU's stack distances, LIFO's thresholds) at `sizes`
/// (bytes, whole pages; those the pass counted for, others left out).
pub fn exact_curve(counts: &Buckets, sizes: &[u64]) -> Vec<ExactPoint> {
    let pages: Vec<u64> = sizes.iter().map(|s| s / PAGE_SIZE).collect();
    counts
        .misses(&pages)
        .into_iter()
        .zip(sizes)
        .filter_map(|(misses, &size_bytes)| {
            Some(ExactPoint {
                size_bytes,
                misses: misses?,
                page_accesses: counts.accesses(),
            })
        })
        .collect()
}

/// The default sampling rate for a curve whose smallest cache is
/// `smallest_bytes`: enough that its miniature holds [`MIN_MINIATURE_PAGES`],
/// within [`MIN_RATE`]..=[`MAX_DEFAULT_RATE`].
pub fn default_rate(smallest_bytes: u64) -> f64 {
    let pages = (smallest_bytes / PAGE_SIZE).max(1) as f64;
    (MIN_MINIATURE_PAGES as f64 / pages).clamp(MIN_RATE, MAX_DEFAULT_RATE)
}

/// The highest default rate, for inputs whose smallest size is under
/// 16 × [`MIN_MINIATURE_PAGES`] pages (8 192). Such an input is small, and a few of
/// its pages may carry most of its references. A sampled page stands for
/// 1/R pages, so a sampled hot page's own misses count 1/R times: at
/// 1/32, one seed in 8 of a 4353-page real trace (five pages carry 75 %
/// of its 10 M references) put the smallest sizes 6–11 points off; at
/// 1/16 every one of 16 seeds stayed within 0.83 points (docs/device-model.md,
/// "Hot pages and the default rate").
pub const MAX_DEFAULT_RATE: f64 = 1.0 / 16.0;

/// Pages the smallest miniature cache gets at the default rate.
pub const MIN_MINIATURE_PAGES: u64 = 512;

/// The lowest default rate.
pub const MIN_RATE: f64 = 0.001;
