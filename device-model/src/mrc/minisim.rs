//! Miniature simulation (Waldspurger et al., ATC'17): a cache of `size × R`
//! pages, run by the device model itself (its own [`Device`] and policy
//! code) on a spatial sample at rate R, stands for a cache of `size`.

use super::repeats::{trim, Trimmed};
use super::shards::Sample;
use crate::config::DeviceConfig;
use crate::replay::{ReplayError, HINT_IMMINENT, HINT_NEIGHBOURS, LOOKAHEAD};
use crate::trace::Access;
use crate::{Device, LoadConfigError, PAGE_SHIFT, PAGE_SIZE};
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

/// The miniature's config: `base` with the scaled cache and the NAND model
/// off (under closed arrival, what hits does not depend on NAND time; see
/// [`super::limits::miniature`]).
pub fn miniature_config(base: &DeviceConfig, size_bytes: u64, rate: f64) -> DeviceConfig {
    let mut cfg = base.clone();
    cfg.cache.size_bytes = miniature_pages(size_bytes, rate, base.cache.ways) * PAGE_SIZE;
    cfg.nand.enabled = false;
    cfg
}

/// The miniatures of one config on one sample: each size's replays the
/// sample without the repeats its policy cannot tell apart
/// ([`super::repeats`]), trimmed once per settling count and shared by the
/// sizes (and threads) that have it.
pub struct Miniatures<'a> {
    base: &'a DeviceConfig,
    sample: &'a Sample,
    /// The sample's measured part: its first touches and page accesses.
    measured: Measured,
    /// The trimmed samples so far, by settling count.
    trimmed: Mutex<Vec<(Option<u32>, Arc<Trimmed<'a>>)>>,
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
            first_touches: s.pages.saturating_sub(warm_pages),
            page_accesses: (s.accesses.len() - warm) as u64,
        }
    }
}

impl<'a> Miniatures<'a> {
    /// Miniatures of `base` on `sample`.
    pub fn new(base: &'a DeviceConfig, sample: &'a Sample) -> Self {
        Miniatures {
            base,
            sample,
            measured: Measured::of(sample),
            trimmed: Mutex::new(Vec::new()),
        }
    }

    /// Runs the miniature of a `size_bytes` cache, scaled by the sample's
    /// realized rate.
    pub fn simulate(&self, size_bytes: u64) -> Result<Miniature, SimulateError> {
        let cfg = miniature_config(self.base, size_bytes, self.sample.realized_rate);
        let mini_size_bytes = cfg.cache.size_bytes;
        if let Some(m) = self.holds_every_page(&cfg, size_bytes) {
            return Ok(m);
        }
        let mut device =
            Device::new(cfg).map_err(|source| SimulateError::Config { size_bytes, source })?;
        let trimmed = self.trimmed_for(device.settling_hits());
        let hints = mini_size_bytes / PAGE_SIZE >= HINTED_MINIATURE_PAGES;
        replay_closed(&mut device, &trimmed.accesses, trimmed.warmup, hints)
            .map_err(|source| SimulateError::Replay { size_bytes, source })?;
        let stats = device.stats();
        Ok(Miniature {
            size_bytes,
            mini_size_bytes,
            misses: stats.misses,
            page_accesses: self.measured.page_accesses,
            miss_ratio: self.sample.estimate(stats.misses),
        })
    }

    /// Where the miniature is fully associative and holds every sampled
    /// page, nothing is ever evicted, and its misses are the first touches
    /// of the pages the warm-up did not touch, whatever the policy: the
    /// miniature without its replay.
    fn holds_every_page(&self, cfg: &DeviceConfig, size_bytes: u64) -> Option<Miniature> {
        if cfg.cache.ways != 0 || cfg.cache.size_bytes / PAGE_SIZE < self.sample.pages {
            return None;
        }
        let misses = self.measured.first_touches;
        Some(Miniature {
            size_bytes,
            mini_size_bytes: cfg.cache.size_bytes,
            misses,
            page_accesses: self.measured.page_accesses,
            miss_ratio: self.sample.estimate(misses),
        })
    }

    /// The sample trimmed for `settling`, trimming it on first use.
    fn trimmed_for(&self, settling: Option<u32>) -> Arc<Trimmed<'a>> {
        // A poisoned lock only means another miniature panicked after
        // pushing a complete entry: the list is still sound.
        let mut list = self.trimmed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, t)) = list.iter().find(|(s, _)| *s == settling) {
            return Arc::clone(t);
        }
        let t = Arc::new(trim(&self.sample.accesses, self.sample.warmup, settling));
        list.push((settling, Arc::clone(&t)));
        t
    }
}

/// Replays `accesses` into `device` in a closed loop, as
/// [`crate::replay::Replayer::drive`] does under `Arrival::Closed { think_ns: 0 }`
/// (each access arrives when the one before it completes; the counters
/// are reset after the first `warmup`, if the input gets past them),
/// keeping only the device's counters: a miniature reports misses, not
/// latencies. With `hints`, the device gets the same hints ahead as the
/// replayer gives it; they only load memory, so the misses are the same
/// either way.
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
    for (index, a) in (0u64..).zip(accesses) {
        if index == warmup {
            device.reset_stats();
        }
        if hints {
            hint_ahead(device, accesses, index);
        }
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
/// scaled by the sample's realized rate (one size: [`Miniatures`] shares
/// the trimmed sample between sizes).
pub fn simulate(
    base: &DeviceConfig,
    sample: &Sample,
    size_bytes: u64,
) -> Result<Miniature, SimulateError> {
    Miniatures::new(base, sample).simulate(size_bytes)
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
            pages: names.len() as u64,
            accesses,
            warmup,
            rate: 0.5,
            realized_rate: 0.5,
            threshold: u64::MAX / 2,
            seed: 0,
            measured_page_accesses: 12_000,
        }
    }

    #[test]
    fn hints_ahead_change_no_miniature_s_counters() {
        let mut base = DeviceConfig::default()
            .with_overrides(&[
                "cache.ways=0",
                "nand.enabled=false",
                "cache.hits_visible=true",
            ])
            .unwrap_or_else(|e| panic!("{e}"));
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
                let minis = Miniatures::new(&base, &s);
                // At rate 1/2: 2 × the pages is a miniature of them all.
                let size = 2 * s.pages * PAGE_SIZE;
                let cfg = miniature_config(&base, size, s.realized_rate);
                let quick = minis.holds_every_page(&cfg, size);
                let quick = quick.unwrap_or_else(|| panic!("{policy:?}: no short cut"));
                let mut device = Device::new(cfg).unwrap_or_else(|e| panic!("{e}"));
                replay_closed(&mut device, &s.accesses, s.warmup, true)
                    .unwrap_or_else(|e| panic!("{e}"));
                let st = device.stats();
                assert_eq!(
                    (quick.misses, quick.page_accesses),
                    (st.misses, st.page_accesses),
                    "{policy:?}, warm-up {warmup}"
                );
                let smaller = miniature_config(&base, size - 2 * PAGE_SIZE, s.realized_rate);
                assert!(minis.holds_every_page(&smaller, size).is_none());
            }
        }
    }
}
