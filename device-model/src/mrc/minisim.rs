//! Miniature simulation (Waldspurger et al., ATC'17): a cache of `size × R`
//! pages, run by the device model itself (its own [`Device`] and policy
//! code) on a spatial sample at rate R, stands for a cache of `size`.

use super::repeats::{trim, Trimmed};
use super::shards::{threshold_of, Sample};
use crate::config::DeviceConfig;
use crate::replay::{ReplayError, HINT_IMMINENT, HINT_NEIGHBOURS, LOOKAHEAD};
use crate::trace::Access;
use crate::{Device, LoadConfigError, PAGE_SHIFT, PAGE_SIZE};
use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};

/// The fewest cache pages of a miniature whose replay gives the device
/// hints ahead (see [`replay_closed`]). Below it, the miniature's slots and
/// policy state stay in the CPU's cache, and the hints only cost: without
/// them, the sampled curves of the bench's zipf, uniform and real traces
/// at their default rates took 10–25 % less CPU, while at 1/8 (miniatures
/// of 8 Ki–512 Ki pages) uniform S3-FIFO took 2–4 % more without them.
pub const HINTED_MINIATURE_PAGES: u64 = 1 << 15;

/// Why a miniature simulation failed.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// The miniature's config is not a valid device.
    #[error("miniature of {size_bytes} bytes")]
    Config {
        /// The full-size cache it stands for.
        size_bytes: u64,
        /// What is wrong.
        #[source]
        source: LoadConfigError,
    },
    /// The device refused a sampled access.
    #[error("miniature of {size_bytes} bytes")]
    Replay {
        /// The full-size cache it stands for.
        size_bytes: u64,
        /// What the replay said.
        #[source]
        source: ReplayError,
    },
}

/// One miniature's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Miniature {
    /// The full-size cache it stands for.
    pub size_bytes: u64,
    /// The miniature cache's size.
    pub mini_size_bytes: u64,
    /// Its measured misses (coalesced ones included, as replay counts them).
    pub misses: u64,
    /// The sample's measured page accesses it stands for (the repeats a
    /// replay leaves out, see [`Miniatures`], included).
    pub page_accesses: u64,
    /// The estimate: [`Sample::estimate`] of its misses.
    pub miss_ratio: f64,
    /// The rate of the sample it ran on ([`rate_for`]).
    pub rate: f64,
    /// That sample's realized rate ([`Sample::realized_rate`]).
    pub realized_rate: f64,
    /// That sample's distinct pages.
    pub sampled_pages: u64,
}

/// Pages of the miniature of a `size_bytes` cache at `rate`: `size × rate`
/// rounded, at least one page, and whole sets of `ways` (at least one).
pub fn miniature_pages(size_bytes: u64, rate: f64, ways: u32) -> u64 {
    let pages = ((size_bytes / PAGE_SIZE) as f64 * rate).round().max(1.0) as u64;
    match u64::from(ways) {
        0 => pages,
        w => (pages.div_ceil(w).max(1)) * w,
    }
}

/// The highest rate [`rate_for`] raises a size's to.
pub const MAX_RAISED_RATE: f64 = 0.5;

/// The rate a `size_bytes` cache is simulated at, `base` the curve's: the
/// smallest power-of-two multiple of `base` at which its miniature holds
/// `floor_pages`, at most [`MAX_RAISED_RATE`] (and never below `base`).
/// A miniature of a few pages is a coarse stand-in for a cache of many,
/// and a sampled hot page's own misses weigh 1/R times in it. The price is
/// the higher rate's sample: on a small input the smallest sizes' come
/// near the input itself (docs/device-model.md, "Small miniatures").
pub fn rate_for(base: f64, size_bytes: u64, ways: u32, floor_pages: u64) -> f64 {
    let mut rate = base;
    while miniature_pages(size_bytes, rate, ways) < floor_pages && rate * 2.0 <= MAX_RAISED_RATE {
        rate *= 2.0;
    }
    rate
}

/// The miniature's config: `base` with the scaled cache and the NAND model
/// off (under closed arrival, what hits does not depend on NAND time; see
/// [`super::limits::miniature`]).
pub fn miniature_config(base: &DeviceConfig, size_bytes: u64, rate: f64) -> DeviceConfig {
    let mut cfg = base.clone();
    cfg.cache.size_bytes = miniature_pages(size_bytes, rate, base.cache.ways) * PAGE_SIZE;
    cfg.nand.enabled = false;
    cfg
}

/// The rates [`Miniatures`] simulates each size at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// The curve's rate: the sizes whose miniatures hold `floor_pages` at
    /// it run at it.
    pub base: f64,
    /// The fewest pages a miniature gets, by a higher rate ([`rate_for`];
    /// 0 or 1: none raised).
    pub floor_pages: u64,
}

/// The miniatures of one config on one sample: each size's replays the
/// sample (or the part of it at the size's rate, [`rate_for`]) without the
/// repeats its policy cannot tell apart ([`super::repeats`]), subsampled
/// once per rate and trimmed once per rate and settling count, shared by
/// the sizes (and threads) that have them.
pub struct Miniatures<'a> {
    base: &'a DeviceConfig,
    sample: &'a Sample,
    rates: Rates,
    /// The sample's measured part.
    measured: Measured,
    /// The samples at lower rates so far, by threshold.
    lower: Mutex<Vec<(u64, Arc<Rated>)>>,
    /// The trimmed samples so far, by threshold and settling count.
    trimmed: Mutex<Vec<(TrimKey, Arc<Trimmed<'a>>)>>,
}

/// A trimmed sample's key: the sample's threshold (its rate) and the
/// settling count it was trimmed for.
type TrimKey = (u64, Option<u32>);

/// A sample at a lower rate than the pass's, and its measured part.
struct Rated {
    sample: Sample,
    measured: Measured,
}

/// What a sample's measured part (after its warm-up) holds.
#[derive(Debug, Clone, Copy)]
struct Measured {
    /// Pages first touched in it: the misses of a miniature that evicts
    /// nothing.
    first_touches: u64,
    /// Its page accesses (one per access: a sample's stay within a page).
    page_accesses: u64,
}

impl Measured {
    /// As the replay takes the warm-up: a sample that ends within it is
    /// measured whole. The sample's pages are named in the order of their
    /// first access, so the warm-up touched pages `0..=k`, k the largest
    /// it names.
    fn of(s: &Sample) -> Measured {
        let warm = usize::try_from(s.warmup)
            .ok()
            .filter(|&w| w <= s.accesses.len())
            .unwrap_or(0);
        let warm_pages = s.accesses[..warm]
            .iter()
            .map(|a| (a.addr >> PAGE_SHIFT) + 1)
            .max()
            .unwrap_or(0);
        Measured {
            first_touches: s.pages().saturating_sub(warm_pages),
            page_accesses: (s.accesses.len() - warm) as u64,
        }
    }
}

impl<'a> Miniatures<'a> {
    /// Miniatures of `base` on `sample`, each size at the rate `rates` give
    /// it, at most the sample's own.
    pub fn new(base: &'a DeviceConfig, sample: &'a Sample, rates: Rates) -> Self {
        Miniatures {
            base,
            sample,
            rates,
            measured: Measured::of(sample),
            lower: Mutex::new(Vec::new()),
            trimmed: Mutex::new(Vec::new()),
        }
    }

    /// Runs the miniature of a `size_bytes` cache, scaled by the realized
    /// rate of the sample at its rate.
    pub fn simulate(&self, size_bytes: u64) -> Result<Miniature, SimulateError> {
        let rate = rate_for(
            self.rates.base,
            size_bytes,
            self.base.cache.ways,
            self.rates.floor_pages,
        );
        let lower = self.lower_for(rate);
        let (sample, measured) = match &lower {
            Some(l) => (&l.sample, l.measured),
            None => (self.sample, self.measured),
        };
        let cfg = miniature_config(self.base, size_bytes, sample.realized_rate);
        let mini_size_bytes = cfg.cache.size_bytes;
        let point = |misses| Miniature {
            size_bytes,
            mini_size_bytes,
            misses,
            page_accesses: measured.page_accesses,
            miss_ratio: sample.estimate(misses),
            rate: sample.rate,
            realized_rate: sample.realized_rate,
            sampled_pages: sample.pages(),
        };
        if holds_every_page(&cfg, sample) {
            return Ok(point(measured.first_touches));
        }
        let mut device =
            Device::new(cfg).map_err(|source| SimulateError::Config { size_bytes, source })?;
        let trimmed = self.trimmed_for(lower.as_deref(), device.settling_hits());
        let hints = mini_size_bytes / PAGE_SIZE >= HINTED_MINIATURE_PAGES;
        replay_closed(&mut device, &trimmed.accesses, trimmed.warmup, hints)
            .map_err(|source| SimulateError::Replay { size_bytes, source })?;
        Ok(point(device.stats().misses))
    }

    /// The sample at `rate`, taken on first use; `None` where that is the
    /// pass's own.
    fn lower_for(&self, rate: f64) -> Option<Arc<Rated>> {
        let threshold = threshold_of(rate);
        if threshold >= self.sample.threshold {
            return None;
        }
        // A poisoned lock only means another miniature panicked after
        // pushing a complete entry: the list is still sound.
        let mut list = self.lower.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, r)) = list.iter().find(|(t, _)| *t == threshold) {
            return Some(Arc::clone(r));
        }
        let sample = self.sample.subsample(rate)?;
        let measured = Measured::of(&sample);
        let r = Arc::new(Rated { sample, measured });
        list.push((threshold, Arc::clone(&r)));
        Some(r)
    }

    /// The sample (`lower`, or the pass's) trimmed for `settling`, trimming
    /// it on first use.
    fn trimmed_for(&self, lower: Option<&Rated>, settling: Option<u32>) -> Arc<Trimmed<'a>> {
        let key = (
            lower.map_or(self.sample.threshold, |l| l.sample.threshold),
            settling,
        );
        let mut list = self.trimmed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, t)) = list.iter().find(|(k, _)| *k == key) {
            return Arc::clone(t);
        }
        let t = Arc::new(match lower {
            None => trim(&self.sample.accesses, self.sample.warmup, settling),
            // A lower rate's sample lives in `self.lower`, not for `'a`:
            // its trimmed accesses are copied out.
            Some(l) => {
                let t = trim(&l.sample.accesses, l.sample.warmup, settling);
                Trimmed {
                    accesses: Cow::Owned(t.accesses.into_owned()),
                    warmup: t.warmup,
                }
            }
        });
        list.push((key, Arc::clone(&t)));
        t
    }
}

/// Whether the miniature `cfg` is fully associative and holds every page
/// of `sample`: it evicts nothing, so its misses are the first touches of
/// the pages the warm-up did not touch, whatever the policy, and it needs
/// no replay.
fn holds_every_page(cfg: &DeviceConfig, sample: &Sample) -> bool {
    cfg.cache.ways == 0 && cfg.cache.size_bytes / PAGE_SIZE >= sample.pages()
}

/// Replays `accesses` into `device` in a closed loop, as
/// [`crate::replay::Replayer::drive`] does under `Arrival::Closed { think_ns: 0 }`
/// (each access arrives when the one before it completes; the counters
/// are reset after the first `warmup`, if the input gets past them),
/// keeping only the device's counters: a miniature reports misses, not
/// latencies. With `hints`, the device gets the same hints ahead as the
/// replayer gives it; they only load memory, so the misses are the same
/// either way. An access to the page the one before it touched, which the
/// device calls settled ([`Device::repeat_settled`]: a hit that changes
/// nothing a later miss depends on), is not made at all: what
/// [`super::repeats`] leaves out by counting, read off the page's state (a
/// hot page's repeats whose run had settled it before it began).
fn replay_closed(
    device: &mut Device,
    accesses: &[Access],
    warmup: u64,
    hints: bool,
) -> Result<(), ReplayError> {
    if hints {
        for a in accesses.iter().take(LOOKAHEAD) {
            device.hint_upcoming(a.addr);
        }
    }
    let mut now = 0u64;
    // A sample's accesses stay within one page. `settled`: the page of
    // `previous` was found settled, and a skipped access changes nothing,
    // so it stays so until the next access that is made.
    let (mut previous, mut settled) = (u64::MAX, false);
    for (index, a) in (0u64..).zip(accesses) {
        if index == warmup {
            device.reset_stats();
        }
        if hints {
            hint_ahead(device, accesses, index);
        }
        let page = a.addr >> PAGE_SHIFT;
        if page == previous && (settled || device.repeat_settled(now, page)) {
            settled = true;
            continue;
        }
        (previous, settled) = (page, false);
        let out = device
            .access(now, a.op, a.addr, a.len)
            .map_err(|error| ReplayError::Device { index, error })?;
        now = out.completes_at_ns;
    }
    if usize::try_from(warmup).is_ok_and(|w| w == accesses.len()) {
        device.reset_stats();
    }
    Ok(())
}

/// The replayer's hints for the accesses ahead of the `index`th.
#[inline]
fn hint_ahead(device: &Device, accesses: &[Access], index: u64) {
    let i = usize::try_from(index).unwrap_or(usize::MAX);
    if let Some(next) = accesses.get(i.saturating_add(LOOKAHEAD)) {
        device.hint_upcoming(next.addr);
    }
    if let Some(soon) = accesses.get(i.saturating_add(HINT_IMMINENT)) {
        device.hint_imminent(soon.addr);
    }
    if let Some(soon) = accesses.get(i.saturating_add(HINT_NEIGHBOURS)) {
        device.hint_neighbours(soon.addr);
    }
}

/// Runs the miniature of a `size_bytes` cache of `base` on `sample`,
/// scaled by the sample's realized rate, at the sample's rate (one size:
/// [`Miniatures`] shares the trimmed sample between sizes, and can raise a
/// small size's rate).
pub fn simulate(
    base: &DeviceConfig,
    sample: &Sample,
    size_bytes: u64,
) -> Result<Miniature, SimulateError> {
    let rates = Rates {
        base: sample.rate,
        floor_pages: 0,
    };
    Miniatures::new(base, sample, rates).simulate(size_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Op, PolicyKind};

    /// 6 000 accesses over 300 pages, named in the order of their first
    /// access as a sample's are, a third of them writes.
    fn sample(warmup: u64) -> Sample {
        let mut x = 99u64;
        let mut names = std::collections::HashMap::new();
        let accesses: Vec<Access> = (0..6_000)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let raw = (x >> 33) % 300;
                let next = names.len() as u64;
                let page = *names.entry(raw).or_insert(next);
                Access {
                    time_ns: 0,
                    op: if i % 3 == 0 { Op::Write } else { Op::Read },
                    addr: page * PAGE_SIZE + 8,
                    len: 8,
                }
            })
            .collect();
        Sample {
            // Every page's hash under the threshold.
            page_hashes: (0..names.len() as u64).collect(),
            distinct: (600, 0.0),
            accesses,
            warmup,
            rate: 0.5,
            realized_rate: 0.5,
            threshold: u64::MAX / 2,
            seed: 0,
            measured_page_accesses: 12_000,
        }
    }

    /// A fully associative miniature's base config with hits seen.
    fn visible_hits() -> DeviceConfig {
        DeviceConfig::default()
            .with_overrides(&[
                "cache.ways=0",
                "nand.enabled=false",
                "cache.hits_visible=true",
            ])
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The loop that skips settled repeats against every access made, on
    /// runs of one page (1–40 long) over 60 pages: the same misses and
    /// evictions for every policy and size, hits visible, with a warm-up.
    #[test]
    fn a_miniature_s_loop_misses_as_a_replay_of_every_access_does() {
        let mut x = 5u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut accesses = Vec::new();
        while accesses.len() < 20_000 {
            let page = next(60);
            for _ in 0..[1, 1, 2, 3, 5, 8, 40][next(7) as usize] {
                let op = if next(4) == 0 { Op::Write } else { Op::Read };
                accesses.push(Access {
                    time_ns: 0,
                    op,
                    addr: page * PAGE_SIZE + 64,
                    len: 64,
                });
            }
        }
        let mut base = visible_hits();
        for policy in PolicyKind::ALL {
            base.cache.policy = policy;
            for pages in [2, 5, 20, 50] {
                let cfg = miniature_config(&base, pages * PAGE_SIZE, 1.0);
                let mut mini = Device::new(cfg.clone()).unwrap_or_else(|e| panic!("{e}"));
                replay_closed(&mut mini, &accesses, 3_000, false).unwrap_or_else(|e| panic!("{e}"));
                let mut every = Device::new(cfg).unwrap_or_else(|e| panic!("{e}"));
                let mut now = 0;
                for (i, a) in accesses.iter().enumerate() {
                    if i == 3_000 {
                        every.reset_stats();
                    }
                    let o = every
                        .access(now, a.op, a.addr, a.len)
                        .unwrap_or_else(|e| panic!("{e}"));
                    now = o.completes_at_ns;
                }
                let (m, e) = (mini.stats(), every.stats());
                assert_eq!(
                    (m.misses, m.evictions),
                    (e.misses, e.evictions),
                    "{policy:?}, {pages} pages"
                );
            }
        }
    }

    #[test]
    fn hints_ahead_change_no_miniature_s_counters() {
        let mut base = visible_hits();
        let s = sample(1_000);
        for policy in PolicyKind::ALL {
            base.cache.policy = policy;
            for pages in [3, 40, 150] {
                let cfg = miniature_config(&base, pages * PAGE_SIZE, 1.0);
                let run = |hints| {
                    let mut device = Device::new(cfg.clone()).unwrap_or_else(|e| panic!("{e}"));
                    replay_closed(&mut device, &s.accesses, s.warmup, hints)
                        .unwrap_or_else(|e| panic!("{e}"));
                    let st = device.stats();
                    (st.misses, st.hits, st.evictions, st.page_accesses)
                };
                assert_eq!(run(true), run(false), "{policy:?}, {pages} pages");
            }
        }
    }

    #[test]
    fn a_miniature_holding_every_page_misses_on_its_first_touches_as_its_replay_does() {
        let mut base = DeviceConfig::default()
            .with_overrides(&["cache.ways=0", "nand.enabled=false"])
            .unwrap_or_else(|e| panic!("{e}"));
        for policy in PolicyKind::ALL {
            base.cache.policy = policy;
            for warmup in [0, 40, 2_500, 6_000, 9_000] {
                let s = sample(warmup);
                let minis = Miniatures::new(
                    &base,
                    &s,
                    Rates {
                        base: 0.5,
                        floor_pages: 0,
                    },
                );
                // At rate 1/2: 2 × the pages is a miniature of them all.
                let size = 2 * s.pages() * PAGE_SIZE;
                let cfg = miniature_config(&base, size, s.realized_rate);
                assert!(holds_every_page(&cfg, &s), "{policy:?}: no short cut");
                let quick = minis.simulate(size).unwrap_or_else(|e| panic!("{e}"));
                let mut device = Device::new(cfg).unwrap_or_else(|e| panic!("{e}"));
                replay_closed(&mut device, &s.accesses, s.warmup, true)
                    .unwrap_or_else(|e| panic!("{e}"));
                // The loop skips settled repeats, so the device counts
                // fewer lookups: the measured ones are the sample's after
                // its warm-up (all of it when the warm-up runs past it).
                let measured = match usize::try_from(s.warmup) {
                    Ok(w) if w <= s.accesses.len() => s.accesses.len() - w,
                    _ => s.accesses.len(),
                };
                assert_eq!(
                    (quick.misses, quick.page_accesses),
                    (device.stats().misses, measured as u64),
                    "{policy:?}, warm-up {warmup}"
                );
                let smaller = miniature_config(&base, size - 2 * PAGE_SIZE, s.realized_rate);
                assert!(!holds_every_page(&smaller, &s));
            }
        }
    }
}
