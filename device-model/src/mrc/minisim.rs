//! Miniature simulation (Waldspurger et al., ATC'17): a cache of `size × R`
//! pages, run by the device model itself (its own [`Device`] and policy
//! code) on a spatial sample at rate R, stands for a cache of `size`.

use super::shards::Sample;
use crate::config::DeviceConfig;
use crate::replay::{Arrival, ReplayError, Replayer, RunError};
use crate::{Device, LoadConfigError, PAGE_SIZE};
use std::convert::Infallible;

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
    /// Its measured page accesses.
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

/// Runs the miniature of a `size_bytes` cache of `base` on `sample`,
/// scaled by the sample's realized rate.
pub fn simulate(
    base: &DeviceConfig,
    sample: &Sample,
    size_bytes: u64,
) -> Result<Miniature, SimulateError> {
    let cfg = miniature_config(base, size_bytes, sample.realized_rate);
    let mini_size_bytes = cfg.cache.size_bytes;
    let mut device =
        Device::new(cfg).map_err(|source| SimulateError::Config { size_bytes, source })?;
    let mut replayer = Replayer::new(&mut device, Arrival::Closed { think_ns: 0 });
    let accesses = sample.accesses.iter().map(|a| Ok::<_, Infallible>(*a));
    match replayer.drive(accesses, sample.warmup, &mut ()) {
        Ok(_) => {}
        Err(RunError::Input { error, .. }) => match error {},
        Err(RunError::Replay(source)) => return Err(SimulateError::Replay { size_bytes, source }),
    }
    let stats = replayer.device().stats();
    Ok(Miniature {
        size_bytes,
        mini_size_bytes,
        misses: stats.misses,
        page_accesses: stats.page_accesses,
        miss_ratio: sample.estimate(stats.misses),
    })
}
