//! The full-system vs replay cross-check of a pointer-chase phase
//! (`replay_check` in a spec): the device model replays the probe's own
//! access sequence — the chain-building pass (stores), the warm-up laps and
//! the measured laps (loads), one access per load, closed loop — through the
//! run's device configuration, with the same `Replayer` that `cxlfs replay`
//! drives, and predicts the share of the measured loads that hit.
//!
//! In memory mode a resident page is mapped into the guest: its loads never
//! reach the device model, so the policy learns of misses only, unless the
//! daemon samples accesses to resident pages (`--access-sampling`). The
//! replay runs twice, whatever the preset says: with `hits_visible = false`
//! (the policy sees misses only) and with `hits_visible = true` (it sees
//! every load, the most sampling could show it). With accessed bits on,
//! a third replay gets what the bits give the daemon: the policy is blind to
//! hits, and after each period's worth of loads (the phase's own rate times
//! the bits' period) it is told of each page loaded in that period once, as
//! a reference (pages filled in the period skipped, as the device does).

use cxlfs_device_model::replay::{Arrival, ReplayError, Replayer};
use cxlfs_device_model::trace::Access;
use cxlfs_device_model::{Device, DeviceConfig, LoadConfigError, Op};

/// Bytes per device page.
const PAGE: u64 = 4096;

/// Why the prediction failed.
#[derive(Debug, thiserror::Error)]
pub enum PredictHitShareError {
    /// The sequence file is not whole u32 records.
    #[error("the sequence file has {0} bytes, not a multiple of 4")]
    Torn(usize),
    /// The sequence is empty.
    #[error("the sequence file is empty")]
    Empty,
    /// The device config is refused.
    #[error("device config: {0}")]
    Config(#[source] LoadConfigError),
    /// The replay failed.
    #[error("replay: {0}")]
    Replay(#[source] ReplayError),
}

/// Decodes a `cxlfs-memlat --sequence` file (little-endian u32 page indices).
pub fn decode_sequence(bytes: &[u8]) -> Result<Vec<u32>, PredictHitShareError> {
    if bytes.len() % 4 != 0 {
        return Err(PredictHitShareError::Torn(bytes.len()));
    }
    if bytes.is_empty() {
        return Err(PredictHitShareError::Empty);
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// What the replay predicts for the measured laps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Share of the measured loads that hit the device cache.
    pub hit_share: f64,
    /// Loads in the measured laps.
    pub loads: u64,
    /// Device misses over the whole phase (the stores, the warm-up and the
    /// measured laps): what the daemon's device counts for the phase.
    pub phase_misses: u64,
}

/// The replay's predictions with the policy blind to hits and seeing them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Predictions {
    /// `hits_visible = false`: the policy learns of misses only.
    pub hidden: Prediction,
    /// `hits_visible = true`: the policy sees every load.
    pub visible: Prediction,
    /// What the accessed bits show the policy ([`Hits::Bits`]), when asked.
    pub bits: Option<Prediction>,
}

/// What the replay's policy learns of the hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hits {
    /// Nothing: misses only.
    Blind,
    /// Every load.
    Every,
    /// Each page loaded in a period of this many loads, once, at the
    /// period's end (accessed bits).
    Bits {
        /// Loads per period (at least 1).
        period_loads: u64,
    },
}

/// [`predict`] blind and seeing every hit, and with the bits' granularity
/// when `bits_period_loads` is given.
pub fn predict_all(
    config: &DeviceConfig,
    seq: &[u32],
    warmup_laps: u32,
    laps: u32,
    bits_period_loads: Option<u64>,
) -> Result<Predictions, PredictHitShareError> {
    Ok(Predictions {
        hidden: predict(config, seq, warmup_laps, laps, Hits::Blind)?,
        visible: predict(config, seq, warmup_laps, laps, Hits::Every)?,
        bits: bits_period_loads
            .map(|n| {
                predict(
                    config,
                    seq,
                    warmup_laps,
                    laps,
                    Hits::Bits { period_loads: n },
                )
            })
            .transpose()?,
    })
}

/// The accessed bits' periods over a replay: the pages loaded in the
/// current one, told to the device as references when it ends.
struct BitPeriods {
    period_loads: u64,
    loads: u64,
    began_ns: u64,
    pages: Vec<u64>,
}

impl BitPeriods {
    /// Feeds one lap of loads of `seq`, ending periods as they fill.
    fn lap(&mut self, r: &mut Replayer<'_>, seq: &[u32]) -> Result<(), ReplayError> {
        for &page in seq {
            r.feed(Access {
                time_ns: 0,
                op: Op::Read,
                addr: u64::from(page) * PAGE,
                len: 8,
            })?;
            self.pages.push(u64::from(page));
            self.loads += 1;
            if self.loads % self.period_loads == 0 {
                self.pages.sort_unstable();
                self.pages.dedup();
                r.reference(self.began_ns, &self.pages);
                self.pages.clear();
                self.began_ns = r.clock_ns();
            }
        }
        Ok(())
    }
}

/// Replays `seq` (one lap) as: one pass of stores, `warmup_laps` of loads,
/// then `laps` of loads that are measured, with the policy learning of the
/// hits as `hits` says (whatever `config` says).
pub fn predict(
    config: &DeviceConfig,
    seq: &[u32],
    warmup_laps: u32,
    laps: u32,
    hits: Hits,
) -> Result<Prediction, PredictHitShareError> {
    let mut cfg = config.clone();
    cfg.cache.hits_visible = hits == Hits::Every;
    let mut device = Device::new(cfg).map_err(PredictHitShareError::Config)?;
    let mut replayer = Replayer::new(&mut device, Arrival::Closed { think_ns: 0 });
    let lap = |op: Op| {
        seq.iter().map(move |&page| Access {
            time_ns: 0,
            op,
            addr: u64::from(page) * PAGE,
            len: 8,
        })
    };
    let mut bits = match hits {
        Hits::Bits { period_loads } => Some(BitPeriods {
            period_loads: period_loads.max(1),
            loads: 0,
            began_ns: 0,
            pages: Vec::new(),
        }),
        Hits::Blind | Hits::Every => None,
    };
    let mut loads = |r: &mut Replayer<'_>| -> Result<(), PredictHitShareError> {
        match bits.as_mut() {
            Some(b) => b.lap(r, seq),
            None => r.run(lap(Op::Read)).map(|_| ()),
        }
        .map_err(PredictHitShareError::Replay)
    };
    replayer
        .run(lap(Op::Write))
        .map_err(PredictHitShareError::Replay)?;
    for _ in 0..warmup_laps {
        loads(&mut replayer)?;
    }
    let before_measured = replayer.report().misses;
    replayer.reset_stats();
    for _ in 0..laps.max(1) {
        loads(&mut replayer)?;
    }
    let r = replayer.report();
    Ok(Prediction {
        hit_share: r.hit_rate,
        loads: r.accesses,
        phase_misses: before_measured + r.misses,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use cxlfs_device_model::PolicyKind;

    fn with_policy(pages: u64, policy: PolicyKind) -> DeviceConfig {
        let mut c = cxlfs_device_model::presets::preset("cylon").unwrap();
        c.cache.size_bytes = pages * PAGE;
        c.cache.ways = 0;
        c.cache.policy = policy;
        c.prefetch.degree = 0;
        c
    }

    fn fifo(pages: u64) -> DeviceConfig {
        with_policy(pages, PolicyKind::Fifo)
    }

    /// 80% of the loads go to 64 hot pages (random among them), 20% walk a
    /// cycle over 448 cold pages: 512 pages over a 128-page cache.
    fn skewed() -> Vec<u32> {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut cold = 0_u32;
        (0..20_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x % 10 < 8 {
                    ((x >> 8) % 64) as u32
                } else {
                    cold = (cold + 1) % 448;
                    64 + cold
                }
            })
            .collect()
    }

    #[test]
    fn lru_keeps_the_hot_pages_only_when_it_sees_the_hits() {
        let seq = skewed();
        let p = predict_all(&with_policy(128, PolicyKind::Lru), &seq, 1, 1, None).unwrap();
        // Seeing hits, LRU keeps the 64 hot pages (~80% of the loads hit);
        // blind to them, it evicts in miss order, as FIFO does.
        assert!(p.visible.hit_share > 0.75, "{p:?}");
        assert!(
            p.visible.hit_share > p.hidden.hit_share + 0.1,
            "visible {:?} hidden {:?}",
            p.visible,
            p.hidden
        );
        assert_eq!(p.visible.loads, p.hidden.loads);
    }

    #[test]
    fn the_bits_granularity_lies_between_blind_and_every_hit() {
        let seq = skewed();
        let lru = with_policy(128, PolicyKind::Lru);
        let p = predict_all(&lru, &seq, 1, 1, Some(200)).unwrap();
        let bits = p.bits.unwrap();
        // 200 loads a period, 64 hot pages: LRU learns of every hot page
        // each period, nearly as good as seeing each hit.
        assert!(
            bits.hit_share > p.hidden.hit_share + 0.1
                && bits.hit_share <= p.visible.hit_share + 0.02,
            "{p:?}"
        );
        // A period longer than the run: the policy learns nothing in time.
        let never = predict(
            &lru,
            &seq,
            1,
            1,
            Hits::Bits {
                period_loads: 1 << 40,
            },
        )
        .unwrap();
        assert_eq!(never, p.hidden);
        // FIFO ignores hits however they come.
        let f = predict_all(&fifo(128), &seq, 1, 1, Some(200)).unwrap();
        assert_eq!(f.bits.unwrap(), f.hidden);
    }

    #[test]
    fn fifo_is_the_same_whether_hits_are_visible_or_not() {
        let seq = skewed();
        let p = predict_all(&fifo(128), &seq, 1, 1, None).unwrap();
        assert_eq!(p.visible, p.hidden);
        // And not trivially: some loads hit, some miss.
        assert!(
            p.hidden.hit_share > 0.2 && p.hidden.hit_share < 0.95,
            "{p:?}"
        );
    }

    #[test]
    fn a_cycle_that_fits_always_hits_and_one_that_does_not_never_does() {
        let fits: Vec<u32> = (0..64).collect();
        let p = predict(&fifo(128), &fits, 1, 2, Hits::Blind).unwrap();
        assert_eq!(p.loads, 128);
        assert!((p.hit_share - 1.0).abs() < 1e-12, "{p:?}");
        // The phase's misses: the store pass's first touches only.
        assert_eq!(p.phase_misses, 64);
        // A cyclic scan over twice the cache under FIFO: every load misses,
        // in every pass (stores, one warm-up lap, one measured lap).
        let scan: Vec<u32> = (0..256).collect();
        let p = predict(&fifo(128), &scan, 1, 1, Hits::Blind).unwrap();
        assert!(p.hit_share < 1e-12, "{p:?}");
        assert_eq!(p.phase_misses, 3 * 256);
    }

    #[test]
    fn lines_of_random_pages_hit_about_cache_over_working_set() {
        // 64 loads per page in a random order over 4x the cache: about a
        // quarter of the loads hit (IRM).
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut seq: Vec<u32> = (0..512 * 64).map(|i| (i / 64) as u32).collect();
        for i in (1..seq.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            seq.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let p = predict(&fifo(128), &seq, 1, 1, Hits::Blind).unwrap();
        assert!((p.hit_share - 0.25).abs() < 0.05, "{p:?}");
    }

    #[test]
    fn sequence_files_are_whole_u32_records() {
        assert_eq!(decode_sequence(&[1, 0, 0, 0, 2, 0, 0, 0]).unwrap(), [1, 2]);
        assert!(decode_sequence(&[1, 0, 0]).is_err());
        assert!(decode_sequence(&[]).is_err());
    }
}
