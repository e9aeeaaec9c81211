//! `cxlfs mrc`: a miss-ratio curve (miss ratio against cache size) for one
//! or more policies from one pass over a trace or a synthetic workload:
//! exact for LRU (stack distances) and LIFO, sampled for any policy (LRU:
//! stack distances of a spatial sample, SHARDS; the others in miniature on
//! it), or, where a knob rules both out, one replay per size.

use crate::mrc_out::{self, CurvePoint, Method, PolicyCurve};
use crate::parallel_map;
use crate::read_ahead::{self, DriveError};
use crate::replay_cmd::{arrival_of, describe_input, input_of, run_point, Input, ReplayInputArgs};
use crate::split_pass;
use crate::trace_io::{TraceFormat, TraceReader};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use cxlfs_device_model::mrc::shards::Sampler;
use cxlfs_device_model::mrc::sizes::parse_sizes;
use cxlfs_device_model::mrc::{
    default_rate, exact_curve, limits, minisim, sampled_lru, Collected, CurvePass, ExactPoint,
};
use cxlfs_device_model::replay::Arrival;
use cxlfs_device_model::{DeviceConfig, PolicyKind, PAGE_SIZE};
use std::path::PathBuf;
use std::time::Instant;

/// `cxlfs mrc` arguments.
#[derive(Debug, Clone, Args)]
pub struct MrcArgs {
    #[command(flatten)]
    input: ReplayInputArgs,
    /// Cache sizes: a comma-separated list (units or bytes: `64MiB,1GiB`) or
    /// log-spaced ranges `FROM..TO:POINTS` (`1MiB..4GiB:64`), rounded down
    /// to whole pages (whole sets when cache.ways > 0).
    #[arg(long, value_name = "SIZES")]
    sizes: String,
    /// Policies, comma-separated (fifo, lifo, lru, clock, s3fifo, 2q, lfru)
    /// [default: the config's cache.policy].
    #[arg(long, value_name = "P1,P2,...")]
    policy: Option<String>,
    /// How each curve is computed; `auto`: exact for LRU and LIFO where a
    /// one-pass count gives it (LRU: sampled instead when --sampling or
    /// --sample-pages is given), sampled where a miniature can, else replay.
    /// Sampled LRU is SHARDS (stack distances of the sample) where the
    /// exact pass would apply, miniatures otherwise.
    #[arg(long, value_enum, default_value = "auto")]
    method: MethodArg,
    /// Spatial sampling rate R, 0 < R <= 1 [default: enough that the
    /// smallest size's miniature holds 512 pages, within 0.001..=1/16; a
    /// small input may want more].
    #[arg(long, value_name = "R")]
    sampling: Option<f64>,
    /// Fixed-size sampling: keep at most N distinct pages, the rate falling
    /// from --sampling (default 1) as more arrive.
    #[arg(long, value_name = "N")]
    sample_pages: Option<usize>,
    /// The fewest pages a miniature gets: a size whose miniature at R would
    /// hold fewer is simulated at 2R, 4R, … (at most 1/2), on the part of
    /// one sample taken at the highest rate any size needs. More accurate
    /// at the small sizes of a small input, at many times the CPU (32 on a
    /// 4 353-page trace: the largest error over 16 seeds 0.83 -> 0.23
    /// points, 13x the CPU). 0: every size at R. With --sample-pages, no
    /// size goes above the sample's final rate.
    #[arg(long, value_name = "PAGES", default_value_t = 0)]
    miniature_floor: u64,
    /// Seed of the sampling hash: each seed samples another set of pages,
    /// so curves from several seeds show the sampling's spread.
    #[arg(long, value_name = "N", default_value_t = 0)]
    sampling_seed: u64,
    /// Print one JSON object per point instead of a table.
    #[arg(long)]
    json: bool,
    /// Also draw the curves: FILE.png and FILE.svg.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

/// `--method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MethodArg {
    Auto,
    Exact,
    Sampled,
    Replay,
}

/// Runs `cxlfs mrc`.
pub fn run(args: &MrcArgs) -> Result<()> {
    let (base, _) = args.input.device.load(&[])?;
    let input = input_of(&args.input)?;
    let (_, recorded) = describe_input(&input)?;
    let (arrival, _) = arrival_of(args.input.arrival, &input, recorded);
    let unit = u64::from(base.cache.ways).max(1) * PAGE_SIZE;
    let sizes = parse_sizes(&args.sizes, unit).context("--sizes")?;
    check_sizes(&base, &sizes)?;
    let policies = policies_of(args.policy.as_deref(), &base)?;
    let plans = policies
        .iter()
        .map(|&p| {
            plan(
                args.method,
                sampling_asked(args),
                &with_policy(&base, p),
                arrival,
            )
        })
        .collect::<Result<Vec<_>>>()?;

    let started = Instant::now();
    let exact = |p: PolicyKind| {
        policies
            .iter()
            .zip(&plans)
            .any(|(&q, &m)| q == p && m == Method::Exact)
    };
    let sampled = plans
        .iter()
        .any(|m| matches!(m, Method::Sampled | Method::SampledStack));
    // The curve's rate (`None`: a fixed-size sample's, known at its end),
    // and the highest any miniature needs, which the pass samples at.
    let base_rate = base_rate_of(args, sizes[0])?;
    let miniatures = plans.contains(&Method::Sampled);
    let top_rate = base_rate.map(|r| {
        if miniatures {
            minisim::rate_for(r, sizes[0], base.cache.ways, args.miniature_floor)
        } else {
            r
        }
    });
    let sampler = sampled.then(|| sampler_of(args, top_rate));
    let collected = if plans.iter().any(|m| *m != Method::Replay) {
        let mut pass = CurvePass::new(base.capacity_bytes(), args.input.warmup, sampler);
        if exact(PolicyKind::Lru) {
            pass = pass.with_lru(&sizes);
        }
        if exact(PolicyKind::Lifo) {
            pass = pass.with_lifo(&sizes);
        }
        Some(one_pass(pass, &input, args.input.warmup)?)
    } else {
        None
    };
    let mut curves = Vec::with_capacity(policies.len());
    for (&policy, &method) in policies.iter().zip(&plans) {
        let cfg = with_policy(&base, policy);
        let points = match method {
            Method::Exact => exact_points(policy, collected.as_ref(), &sizes),
            Method::Sampled => {
                let floor = args.miniature_floor;
                sampled_points(&cfg, collected.as_ref(), &sizes, base_rate, floor)?
            }
            Method::SampledStack => sampled_stack_points(collected.as_ref(), &sizes, base_rate),
            Method::Replay => replay_points(&cfg, &input, arrival, args.input.warmup, &sizes)?,
        };
        curves.push(PolicyCurve {
            policy,
            method,
            points,
        });
    }
    let elapsed = started.elapsed();
    mrc_out::print(args.json, &base, &input, arrival, &curves, elapsed)?;
    if let Some(file) = &args.plot {
        for f in mrc_out::plot(file, &curves)? {
            eprintln!("{}", f.display());
        }
    }
    Ok(())
}

/// Every size must be a cache the device can have.
fn check_sizes(base: &DeviceConfig, sizes: &[u64]) -> Result<()> {
    for &size in sizes {
        let mut cfg = base.clone();
        cfg.cache.size_bytes = size;
        cfg.validate()
            .with_context(|| format!("--sizes: a cache of {size} bytes"))?;
    }
    Ok(())
}

/// `--policy`, or the config's.
fn policies_of(list: Option<&str>, base: &DeviceConfig) -> Result<Vec<PolicyKind>> {
    let Some(list) = list else {
        return Ok(vec![base.cache.policy]);
    };
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let p: PolicyKind = name
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--policy: {e}"))?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        bail!("--policy names no policy");
    }
    Ok(out)
}

fn with_policy(base: &DeviceConfig, policy: PolicyKind) -> DeviceConfig {
    let mut cfg = base.clone();
    cfg.cache.policy = policy;
    cfg
}

/// Whether `--sampling` or `--sample-pages` was given.
fn sampling_asked(args: &MrcArgs) -> bool {
    args.sampling.is_some() || args.sample_pages.is_some()
}

/// The method for one policy: the one asked for if it applies (else the
/// reason it does not), or under `auto` the best that applies; `sampling`:
/// a rate or a sample size was given, which `auto` takes for LRU.
fn plan(asked: MethodArg, sampling: bool, cfg: &DeviceConfig, arrival: Arrival) -> Result<Method> {
    let name = cfg.cache.policy.name();
    let lru = cfg.cache.policy == PolicyKind::Lru;
    Ok(match asked {
        MethodArg::Exact => {
            limits::exact(cfg, arrival).with_context(|| format!("{name}: no exact curve"))?;
            Method::Exact
        }
        MethodArg::Sampled => {
            limits::miniature(cfg, arrival).with_context(|| format!("{name}: no sampled curve"))?;
            sampled_method(lru, cfg, arrival)
        }
        MethodArg::Replay => Method::Replay,
        MethodArg::Auto => match (limits::exact(cfg, arrival), limits::miniature(cfg, arrival)) {
            (Ok(()), _) if lru && sampling => Method::SampledStack,
            (Ok(()), _) => Method::Exact,
            (Err(_), Ok(())) => Method::Sampled,
            (Err(_), Err(why)) => {
                eprintln!("note: {name}: one replay per size, as no sampled curve applies: {why}");
                Method::Replay
            }
        },
    })
}

/// A sampled curve's method: SHARDS' sampled stack distances for LRU
/// where the exact pass applies (fully associative, hits visible),
/// miniatures otherwise.
fn sampled_method(lru: bool, cfg: &DeviceConfig, arrival: Arrival) -> Method {
    if lru && limits::exact(cfg, arrival).is_ok() {
        Method::SampledStack
    } else {
        Method::Sampled
    }
}

/// The curve's sampling rate: `--sampling`, or by default one that gives
/// the smallest size's miniature
/// [`cxlfs_device_model::mrc::MIN_MINIATURE_PAGES`] pages (within
/// bounds: [`default_rate`]); `None` with `--sample-pages`, whose rate is
/// the sample's final one.
fn base_rate_of(args: &MrcArgs, smallest: u64) -> Result<Option<f64>> {
    if let Some(r) = args.sampling {
        if !(r > 0.0 && r <= 1.0) {
            bail!("--sampling {r} is not within 0 < R <= 1");
        }
    }
    Ok(match args.sample_pages {
        Some(0) => bail!("--sample-pages must be at least 1"),
        Some(_) => None,
        None => Some(args.sampling.unwrap_or_else(|| default_rate(smallest))),
    })
}

/// The sampler: at `rate`, or fixed-size as `--sample-pages` asks.
fn sampler_of(args: &MrcArgs, rate: Option<f64>) -> Sampler {
    let sampler = match (args.sample_pages, rate) {
        (Some(n), _) => Sampler::fixed_size(n, args.sampling.unwrap_or(1.0)),
        (None, rate) => Sampler::fixed_rate(rate.unwrap_or(1.0)),
    };
    sampler.seeded(args.sampling_seed)
}

/// Reads the input once into `pass`.
fn one_pass(pass: CurvePass, input: &Input, warmup: u64) -> Result<Collected> {
    let pass = match input {
        Input::Workload(spec) => {
            let mut pass = pass;
            for access in spec.generate()? {
                pass.feed(&access).context("workload")?;
            }
            pass
        }
        Input::Trace(path) => match split_pass::try_run(pass, TraceReader::open(path)?)? {
            Ok(pass) => pass,
            Err((pass, reader)) => trace_pass(pass, reader)?,
        },
    };
    let collected = pass.finish();
    if warmup > 0 && collected.fed <= warmup {
        bail!(
            "--warmup {warmup} leaves nothing to measure: the input has {} accesses",
            collected.fed
        );
    }
    Ok(collected)
}

/// `reader`'s accesses fed to `pass` in one stream: a binary trace read on a
/// second thread, ahead of a pass that counts every page (stack distances);
/// CSV, and a binary trace for a sample alone that was not cut into parts
/// (a short one, or one that cannot be mapped: the records undecoded, as
/// each part reads them; a thread ahead would only add a decode), here, so
/// that an error names its line or record.
fn trace_pass(mut pass: CurvePass, mut reader: TraceReader) -> Result<CurvePass> {
    if reader.format() == TraceFormat::Bin && !pass.splittable() {
        let (reader, outcome) = read_ahead::drive(reader, |b| pass.feed_batch(b));
        return match outcome {
            Ok(()) => Ok(pass),
            Err(DriveError::Consume(e)) => {
                let at = reader.map(|r| r.location_of(e.index));
                Err(e).context(at.unwrap_or_default())
            }
            Err(e) => Err(e.into()),
        };
    }
    while let Some(records) = reader.next_records() {
        if let Err(e) = pass.feed_records(records?) {
            let at = reader.location_of(e.index);
            return Err(e).context(at);
        }
    }
    Ok(pass)
}

fn exact_points(policy: PolicyKind, c: Option<&Collected>, sizes: &[u64]) -> Vec<CurvePoint> {
    let counts = match policy {
        PolicyKind::Lru => c.and_then(|c| c.stack.as_ref()).map(|s| s.counts()),
        PolicyKind::Lifo => c.and_then(|c| c.lifo.as_ref()).map(|l| l.counts()),
        _ => None,
    };
    let Some(counts) = counts else {
        return Vec::new();
    };
    exact_curve(counts, sizes)
        .into_iter()
        .map(|p: ExactPoint| CurvePoint::counted(p.size_bytes, p.misses, p.page_accesses))
        .collect()
}

fn sampled_points(
    cfg: &DeviceConfig,
    collected: Option<&Collected>,
    sizes: &[u64],
    base_rate: Option<f64>,
    floor_pages: u64,
) -> Result<Vec<CurvePoint>> {
    let Some(sample) = collected.and_then(|c| c.sample.as_ref()) else {
        return Ok(Vec::new());
    };
    let rates = minisim::Rates {
        base: base_rate.unwrap_or(sample.rate),
        floor_pages,
    };
    // Each size's miniature replays the sample into its own device:
    // independent, one thread per CPU.
    let miniatures = minisim::Miniatures::new(cfg, sample, rates);
    parallel_map::map_in_order(sizes, |&size| {
        let m = miniatures.simulate(size)?;
        Ok(CurvePoint::sampled(&m, sample))
    })
    .into_iter()
    .collect()
}

/// LRU's curve from the stack distances of the sample at the curve's rate
/// (SHARDS).
fn sampled_stack_points(
    collected: Option<&Collected>,
    sizes: &[u64],
    base_rate: Option<f64>,
) -> Vec<CurvePoint> {
    let Some(sample) = collected.and_then(|c| c.sample.as_ref()) else {
        return Vec::new();
    };
    let lower = base_rate.and_then(|r| sample.subsample(r));
    let sample = lower.as_ref().unwrap_or(sample);
    sampled_lru::curve(sample, sizes)
        .into_iter()
        .map(|p| CurvePoint::estimated(p.size_bytes, p.miss_ratio, sample))
        .collect()
}

/// One full replay per size (the reference, and what is left when a knob
/// rules out the other methods).
fn replay_points(
    cfg: &DeviceConfig,
    input: &Input,
    arrival: Arrival,
    warmup: u64,
    sizes: &[u64],
) -> Result<Vec<CurvePoint>> {
    sizes
        .iter()
        .map(|&size| {
            let mut c = cfg.clone();
            c.cache.size_bytes = size;
            let r = run_point(&c, input, arrival, warmup, None)
                .with_context(|| format!("replay of a {size}-byte cache"))?
                .report;
            Ok(CurvePoint::counted(size, r.misses, r.page_accesses))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(policy: PolicyKind, hits_visible: bool) -> DeviceConfig {
        let mut c = DeviceConfig::default();
        c.cache.policy = policy;
        c.cache.ways = 0;
        c.cache.hits_visible = hits_visible;
        c.prefetch.degree = 0;
        c.cache.write_log_bytes = 0;
        c
    }

    #[test]
    fn sampled_lru_is_shards_where_the_exact_pass_applies_and_auto_takes_it_given_a_rate() {
        let closed = Arrival::Closed { think_ns: 0 };
        let plan_of = |asked, sampling, c: &DeviceConfig| plan(asked, sampling, c, closed).ok();
        let lru = cfg(PolicyKind::Lru, true);
        assert_eq!(plan_of(MethodArg::Auto, false, &lru), Some(Method::Exact));
        assert_eq!(
            plan_of(MethodArg::Auto, true, &lru),
            Some(Method::SampledStack)
        );
        let sampled = Some(Method::SampledStack);
        assert_eq!(plan_of(MethodArg::Sampled, false, &lru), sampled);
        // Hits invisible: not the LRU of stack distances; miniatures.
        let hidden = cfg(PolicyKind::Lru, false);
        assert_eq!(
            plan_of(MethodArg::Sampled, false, &hidden),
            Some(Method::Sampled)
        );
        assert_eq!(
            plan_of(MethodArg::Auto, true, &hidden),
            Some(Method::Sampled)
        );
        // LIFO stays exact under auto; FIFO is sampled in miniature.
        let lifo = cfg(PolicyKind::Lifo, true);
        assert_eq!(plan_of(MethodArg::Auto, true, &lifo), Some(Method::Exact));
        let fifo = cfg(PolicyKind::Fifo, true);
        assert_eq!(
            plan_of(MethodArg::Sampled, false, &fifo),
            Some(Method::Sampled)
        );
    }
}
