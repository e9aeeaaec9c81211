//! Miniature simulation (Waldspurger et al., ATC'17): a cache of `size × R`
//! pages, run by the device model itself (its own [`Device`] and policy
//! code) on a spatial sample at rate R, stands for a cache of `size`.

use super::repeats::{trim, Trimmed};
use super::shards::Sample;
use crate::config::DeviceConfig;
use crate::replay::{ReplayError, LOOKAHEAD};
use crate::trace::Access;
use crate::{Device, LoadConfigError, PAGE_SIZE};
use std::sync::{Arc, Mutex, PoisonError};

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
    /// Its measured page accesses (without the repeats left out, see
    /// [`Miniatures`]).
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
    /// The trimmed samples so far, by settling count.
    trimmed: Mutex<Vec<(Option<u32>, Arc<Trimmed<'a>>)>>,
}

impl<'a> Miniatures<'a> {
    /// Miniatures of `base` on `sample`.
    pub fn new(base: &'a DeviceConfig, sample: &'a Sample) -> Self {
        Miniatures {
            base,
            sample,
            trimmed: Mutex::new(Vec::new()),
        }
    }

    /// Runs the miniature of a `size_bytes` cache, scaled by the sample's
    /// realized rate.
    pub fn simulate(&self, size_bytes: u64) -> Result<Miniature, SimulateError> {
        let cfg = miniature_config(self.base, size_bytes, self.sample.realized_rate);
        let mini_size_bytes = cfg.cache.size_bytes;
        let mut device =
            Device::new(cfg).map_err(|source| SimulateError::Config { size_bytes, source })?;
        let trimmed = self.trimmed_for(device.settling_hits());
        replay_closed(&mut device, &trimmed.accesses, trimmed.warmup)
            .map_err(|source| SimulateError::Replay { size_bytes, source })?;
        let stats = device.stats();
        Ok(Miniature {
            size_bytes,
            mini_size_bytes,
            misses: stats.misses,
            page_accesses: stats.page_accesses,
            miss_ratio: self.sample.estimate(stats.misses),
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
/// are reset after the first `warmup`, if the input gets past them), with
/// the same hints ahead, but keeping only the device's counters: a
/// miniature reports misses, not latencies.
fn replay_closed(device: &mut Device, accesses: &[Access], warmup: u64) -> Result<(), ReplayError> {
    const IMMINENT: usize = LOOKAHEAD / 2;
    const NEIGHBOURS: usize = LOOKAHEAD / 4;
    for a in accesses.iter().take(LOOKAHEAD) {
        device.hint_upcoming(a.addr);
    }
    let mut now = 0u64;
    for (index, a) in (0u64..).zip(accesses) {
        if index == warmup {
            device.reset_stats();
        }
        let i = usize::try_from(index).unwrap_or(usize::MAX);
        if let Some(next) = accesses.get(i.saturating_add(LOOKAHEAD)) {
            device.hint_upcoming(next.addr);
        }
        if let Some(soon) = accesses.get(i.saturating_add(IMMINENT)) {
            device.hint_imminent(soon.addr);
        }
        if let Some(soon) = accesses.get(i.saturating_add(NEIGHBOURS)) {
            device.hint_neighbours(soon.addr);
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
