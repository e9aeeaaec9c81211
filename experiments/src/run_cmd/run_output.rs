//! What one run produced — the run's error, the daemon's snapshots at the
//! barriers, each guest's result per phase, the metrics series — and how
//! the guests' part is read back from what they left in the share (kept in
//! the run directory as `out/VM/PHASE/` and `fio/`).

use crate::daemon_metrics::{parse_series, Figures, SeriesSample};
use crate::distributions::{self, Buckets};
use crate::fio_json::{self, FioSummary};
use crate::phase_output::{self, Extracted};
use crate::replay_check;
use crate::spec::{PhaseSpec, ReplayCheckSpec, RunPlan};
use anyhow::{bail, Context, Result};
use cxlfs::guest_log::kernel_crash_in;
use cxlfs::procs::tail;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it): the
/// time of a snapshot, and of a sweep's start and end in `provenance.json`.
pub(super) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What one guest left behind for one phase.
#[derive(Debug, Default)]
pub(super) struct PhaseResult {
    pub(super) fio: Option<FioSummary>,
    /// Numbers a command's `outputs` gave (`out.NAME`).
    pub(super) outputs: BTreeMap<String, f64>,
    /// Histograms a command's `outputs` gave: name, unit, buckets.
    pub(super) histograms: Vec<(String, String, Buckets)>,
    /// `replay_check`: measured and predicted hit shares.
    pub(super) hit_shares: Option<HitShares>,
    /// `replay_iolog`: what the replay of the guests' fio logs counted.
    pub(super) replay: Option<crate::iolog_replay::Counted>,
    /// The guest's file page cache at the phase's end, over what it held
    /// at boot (`meminfo.json`).
    pub(super) file_cache_bytes: Option<f64>,
    pub(super) error: Option<String>,
}

/// `replay_check`'s hit shares of the measured laps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct HitShares {
    /// Measured in the full system (loads below `hit_below_ns`).
    pub(super) full_system: f64,
    /// The replay with what the device could see: hits invisible to the
    /// policy, or with accessed bits on, each page once a bits' period.
    pub(super) replay: f64,
    /// With accessed bits on: the replay blind to hits.
    pub(super) replay_blind: Option<f64>,
    /// The replay with hits visible to the policy.
    pub(super) replay_visible: f64,
    /// The replays' device misses over the whole phase (hits invisible,
    /// visible).
    pub(super) replay_misses: (u64, u64),
}

/// Everything one run produced.
#[derive(Debug, Default)]
pub(super) struct RunOutput {
    /// The run's error (daemon, guests, barrier); `None` if it got through.
    pub(super) error: Option<String>,
    /// Snapshots at the barriers (index K = before phase K); none with a
    /// back-end that has no figures (`virtiofsd`).
    pub(super) snapshots: Vec<(u64, Figures)>,
    /// The back-end's anonymous resident bytes at each barrier (index K =
    /// before phase K).
    pub(super) server_rss_bytes: Vec<u64>,
    /// Per VM, per phase.
    pub(super) phases: BTreeMap<String, Vec<PhaseResult>>,
    /// The metrics series (empty if the daemon wrote none).
    pub(super) series: Vec<SeriesSample>,
    /// `versions.txt` of the first guest that wrote one.
    pub(super) guest_versions: Option<String>,
    pub(super) interrupted: bool,
}

/// Reads what the guests `vms` left in `share` into `out` (their results per
/// phase, the first `versions.txt`), keeping copies in `run_dir`, and the
/// daemon's metrics series from `run_dir`.
pub(super) fn collect(
    plan: &RunPlan,
    share: &Path,
    run_dir: &Path,
    vms: &[String],
    out: &mut RunOutput,
) {
    let fio_dir = run_dir.join("fio");
    let _ = fs::create_dir_all(&fio_dir);
    for vm in vms {
        let dir = share.join(".cxlfs/out").join(vm);
        if out.guest_versions.is_none() {
            out.guest_versions = fs::read_to_string(dir.join("versions.txt")).ok();
        }
        let serial = run_dir.join(format!("{vm}.serial.log"));
        let mut results = Vec::new();
        for (k, phase) in plan.spec.phases.iter().enumerate() {
            let src = dir.join(k.to_string());
            let kept = run_dir.join("out").join(vm).join(&phase.name);
            let _ = copy_dir(&src, &kept);
            let _ = fs::copy(
                src.join("fio.json"),
                fio_dir.join(format!("{vm}-{}.json", phase.name)),
            );
            let _ = fs::copy(
                src.join("stderr"),
                fio_dir.join(format!("{vm}-{}.log", phase.name)),
            );
            results.push(read_phase(plan, phase, &kept, vm, &serial));
        }
        out.phases.insert(vm.clone(), results);
    }
    if let Ok(text) = fs::read_to_string(run_dir.join("metrics.jsonl")) {
        out.series = parse_series(&text).0;
    }
}

/// Copies the plain files of `src` into `dst` (created), one level deep.
fn copy_dir(src: &Path, dst: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dst)?;
    for e in fs::read_dir(src)? {
        let e = e?;
        // A fio log is read from the share, not kept (tens of MB a phase).
        if e.file_type()?.is_file() && e.file_name() != crate::guest_script::IOLOG {
            fs::copy(e.path(), dst.join(e.file_name()))?;
        }
    }
    Ok(())
}

/// What guest `vm` left for `phase` in `dir` (a copy of its `$out/K/`):
/// fio's JSON, or a command's outputs; never fails, errors go into the result
/// (a phase that never ran names the guest kernel's crash in `serial`, if any).
fn read_phase(
    plan: &RunPlan,
    phase: &PhaseSpec,
    dir: &Path,
    vm: &str,
    serial: &Path,
) -> PhaseResult {
    let mut r = PhaseResult::default();
    let what = if phase.command.is_some() {
        "command"
    } else {
        "fio"
    };
    let name = &phase.name;
    let rc = fs::read_to_string(dir.join("rc"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    let stderr_tail = || {
        tail(&dir.join("stderr"), 4)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    match rc {
        None => {
            r.error = Some(match kernel_crash_in(serial) {
                Some(c) => {
                    format!("{vm} {name}: the {what} did not run: guest kernel crashed: {c}")
                }
                None => format!("{vm} {name}: the {what} did not run"),
            });
            return r;
        }
        Some(0) => {}
        Some(code) => {
            r.error = Some(format!(
                "{vm} {name}: {what} exited {code}: {}",
                stderr_tail()
            ));
            return r;
        }
    }
    r.file_cache_bytes = fs::read_to_string(dir.join("meminfo.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| {
            v.get("file_cache_bytes")
                .and_then(serde_json::Value::as_f64)
        });
    if phase.command.is_none() {
        match fs::read_to_string(dir.join("fio.json"))
            .map_err(|e| e.to_string())
            .and_then(|t| fio_json::parse(&t).map_err(|e| e.to_string()))
        {
            Ok(s) => {
                if s.error != 0 {
                    r.error = Some(format!("{vm} {name}: fio job error {}", s.error));
                }
                r.fio = Some(s);
            }
            Err(e) => r.error = Some(format!("{vm} {name}: {e}")),
        }
        return r;
    }
    let mut errors = Vec::new();
    // Each file read once, however many outputs it holds.
    let mut texts: BTreeMap<&str, Result<String, String>> = BTreeMap::new();
    for (out_name, o) in &phase.outputs {
        let file = o.file.as_deref().unwrap_or("stdout");
        let text = texts
            .entry(file)
            .or_insert_with(|| fs::read_to_string(dir.join(file)).map_err(|e| e.to_string()));
        match text.as_deref().map(|t| phase_output::extract(o, file, t)) {
            Ok(Ok(Extracted::Number(x))) => {
                r.outputs.insert(out_name.clone(), x);
            }
            Ok(Ok(Extracted::Histogram { unit, buckets })) => {
                r.histograms.push((out_name.clone(), unit, buckets));
            }
            Ok(Err(e)) => errors.push(format!("{out_name}: {e}")),
            Err(e) => errors.push(format!("{out_name}: {file}: {e}")),
        }
    }
    if let Some(rc) = &phase.replay_check {
        let probe = phase
            .outputs
            .get(&rc.histogram)
            .and_then(|o| texts.get(o.file.as_deref().unwrap_or("stdout")))
            .and_then(|t| t.as_deref().ok());
        match hit_share_check(plan, rc, dir, &r, probe) {
            Ok(v) => r.hit_shares = Some(v),
            Err(e) => errors.push(format!("replay_check: {e:#}")),
        }
    }
    if !errors.is_empty() {
        r.error = Some(format!("{vm} {name}: {}", errors.join("; ")));
    }
    r
}

/// `replay_check`: the measured hit share (the histogram below
/// `hit_below_ns`) and the replay's predictions for the probe's sequence.
fn hit_share_check(
    plan: &RunPlan,
    rc: &ReplayCheckSpec,
    dir: &Path,
    r: &PhaseResult,
    probe_output: Option<&str>,
) -> Result<HitShares> {
    let (_, unit, buckets) = r
        .histograms
        .iter()
        .find(|h| h.0 == rc.histogram)
        .context("the histogram output is missing")?;
    if unit != "ns" {
        bail!("the histogram is in {unit}, not ns");
    }
    let measured = distributions::share_below(buckets, rc.hit_below_ns);
    let probe = probe_output
        .and_then(phase_output::json_of)
        .context("the probe's JSON is missing")?;
    let field = |k: &str| {
        probe
            .get(k)
            .and_then(Value::as_u64)
            .and_then(|x| u32::try_from(x).ok())
            .with_context(|| format!("the probe's JSON has no `{k}`"))
    };
    let (laps, warmup) = (field("laps")?, field("warmup_laps")?);
    let bytes = fs::read(dir.join(&rc.sequence))
        .with_context(|| format!("reading the sequence {}", rc.sequence))?;
    let seq = replay_check::decode_sequence(&bytes)?;
    // With the bits on: a period's worth of the phase's own loads.
    let bits_period_loads = if plan.spec.daemon.access_bits().is_on() {
        // The measured rate (Zipf laps), else one load per mean load time
        // plus the timer's own (a chain's laps time each load).
        let num = |k: &str| probe.get(k).and_then(Value::as_f64);
        let rate = num("loads_per_s")
            .or_else(|| {
                let per_load = num("mean_ns")? + num("timer_overhead_ns").unwrap_or(0.0);
                (per_load > 0.0).then(|| 1e9 / per_load)
            })
            .context("the probe's JSON has neither `loads_per_s` nor `mean_ns`")?;
        let period_s = plan.spec.daemon.access_bits_period_ns() as f64 / 1e9;
        Some((rate * period_s).round().max(1.0) as u64)
    } else {
        None
    };
    let p = replay_check::predict_all(&plan.device, &seq, warmup, laps, bits_period_loads)?;
    let seen = p.bits.unwrap_or(p.hidden);
    Ok(HitShares {
        full_system: measured,
        replay: seen.hit_share,
        replay_blind: p.bits.map(|_| p.hidden.hit_share),
        replay_visible: p.visible.hit_share,
        replay_misses: (seen.phase_misses, p.visible.phase_misses),
    })
}
