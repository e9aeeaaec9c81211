//! What the soak samples every 10 s: the daemon's anonymous memory, open
//! descriptors and threads (from `/proc`), and its pool's allocated and
//! held bytes and file references (from `/metrics.json`); and the growth of
//! each over a span of samples.

use std::fs;
use std::time::Duration;

/// One sample of the daemon.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DaemonSample {
    /// Since the soak started.
    pub at: Duration,
    /// Anonymous resident memory (`RssAnon`: heap and stacks, not the
    /// pool's shared pages, which `pool` follows), KiB.
    pub anon_rss_kib: u64,
    /// Open descriptors (`/proc/PID/fd`).
    pub fds: u64,
    /// Threads (`Threads`).
    pub threads: u64,
    /// The pool.
    pub pool: PoolSample,
}

/// The pool's figures in one sample (`/metrics.json`'s `device`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolSample {
    /// Bytes allocated to files (`pool_allocated_bytes`).
    pub allocated_bytes: u64,
    /// Bytes of the files some VM references (`pool_held_bytes`).
    pub held_bytes: u64,
    /// Inode references the VMs hold on pool files (`pool_file_refs`).
    pub file_refs: u64,
}

/// Reads `/proc/PID/status` and `/proc/PID/fd`; `None` once the process is
/// gone (or stopped reading: a sample is skipped, not invented).
pub fn sample_process(pid: u32, at: Duration, pool: PoolSample) -> Option<DaemonSample> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(DaemonSample {
        at,
        anon_rss_kib: field("RssAnon:")?,
        fds,
        threads: field("Threads:")?,
        pool,
    })
}

/// How much one figure grew over the second half of the samples: the mean
/// of the last quarter against the mean of the quarter that ends at the
/// half, in percent of the latter (a figure at 0 that stays 0: 0 %).
pub fn growth_pct(samples: &[DaemonSample], figure: fn(&DaemonSample) -> u64) -> f64 {
    let n = samples.len();
    if n < 4 {
        return 0.0;
    }
    let q = n / 4;
    let mean =
        |s: &[DaemonSample]| s.iter().map(|x| figure(x) as f64).sum::<f64>() / s.len() as f64;
    let before = mean(&samples[n / 2 - q..n / 2]);
    let after = mean(&samples[n - q..]);
    if before == 0.0 {
        return if after == 0.0 { 0.0 } else { 100.0 };
    }
    (after - before) / before * 100.0
}

/// How fast one figure moved over the second half of the samples: the
/// least-squares slope against time, per hour (0 for fewer than 4
/// samples or no time between them).
pub fn per_hour(samples: &[DaemonSample], figure: fn(&DaemonSample) -> u64) -> f64 {
    let n = samples.len();
    if n < 4 {
        return 0.0;
    }
    let half = &samples[n / 2..];
    let m = half.len() as f64;
    let t = |s: &DaemonSample| s.at.as_secs_f64() / 3600.0;
    let (mt, my) = half.iter().fold((0.0, 0.0), |(a, b), s| {
        (a + t(s) / m, b + figure(s) as f64 / m)
    });
    let (cov, var) = half.iter().fold((0.0, 0.0), |(c, v), s| {
        let dt = t(s) - mt;
        (c + dt * (figure(s) as f64 - my), v + dt * dt)
    });
    if var == 0.0 {
        0.0
    } else {
        cov / var
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn s(i: u64, rss: u64) -> DaemonSample {
        DaemonSample {
            at: Duration::from_secs(10 * i),
            anon_rss_kib: rss,
            fds: 40,
            threads: 12,
            pool: PoolSample::default(),
        }
    }

    #[test]
    fn growth_compares_the_last_quarter_with_the_one_before_the_half() {
        let flat: Vec<DaemonSample> = (0..8).map(|i| s(i, 1000)).collect();
        assert_eq!(growth_pct(&flat, |x| x.anon_rss_kib), 0.0);
        let rising: Vec<DaemonSample> = (0..8).map(|i| s(i, 1000 + 100 * i)).collect();
        // Quarter before the half: samples 2, 3 (1250); last: 6, 7 (1650).
        assert!((growth_pct(&rising, |x| x.anon_rss_kib) - 32.0).abs() < 1e-9);
        assert_eq!(growth_pct(&rising, |x| x.pool.allocated_bytes), 0.0);
        assert_eq!(growth_pct(&rising[..3], |x| x.anon_rss_kib), 0.0);
    }

    #[test]
    fn the_rate_per_hour_is_the_second_half_s_slope() {
        // 100 KiB every 10 s = 36 000 KiB an hour.
        let rising: Vec<DaemonSample> = (0..8).map(|i| s(i, 1000 + 100 * i)).collect();
        assert!((per_hour(&rising, |x| x.anon_rss_kib) - 36_000.0).abs() < 1e-6);
        // A first half that climbed does not count.
        let settled: Vec<DaemonSample> = (0..8).map(|i| s(i, 1000 * i.min(4))).collect();
        assert_eq!(per_hour(&settled, |x| x.anon_rss_kib), 0.0);
        assert_eq!(per_hour(&rising[..3], |x| x.anon_rss_kib), 0.0);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let pool = PoolSample {
            allocated_bytes: 7,
            held_bytes: 5,
            file_refs: 2,
        };
        let me = sample_process(std::process::id(), Duration::ZERO, pool).unwrap();
        assert!(me.anon_rss_kib > 0 && me.fds > 0 && me.threads > 0);
        assert_eq!(me.pool, pool);
        assert!(sample_process(u32::MAX, Duration::ZERO, pool).is_none());
    }
}
