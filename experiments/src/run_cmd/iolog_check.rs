//! `replay_iolog`: the guests' fio logs of one run, read from the share,
//! replayed through the run's device (`crate::iolog_replay`), and what each
//! guest counted per phase put beside its own results.

use super::run_output::RunOutput;
use crate::guest_script::{logged_phases, IOLOG};
use crate::iolog_replay::{self, Io, Logs};
use crate::spec::RunPlan;
use anyhow::{Context, Result};
use std::fs;
use std::path::Path;

/// Replays the logs the guests `vms` left in `share` and puts each guest's
/// counts into its phase results in `out`; a failure is the first guest's
/// error for every fio phase. Nothing at a `cxl_ratio` under 100 (the
/// pool's split is the daemon's: the guests log nothing there) or after a
/// run that failed.
pub(super) fn replay_iologs(plan: &RunPlan, share: &Path, vms: &[String], out: &mut RunOutput) {
    let fio_phases = logged_phases(&plan.spec);
    if fio_phases.is_empty() || out.error.is_some() {
        return;
    }
    match counted(plan, share, vms, &fio_phases) {
        Ok(per_phase) => {
            for (&k, guests) in fio_phases.iter().zip(per_phase) {
                for (vm, c) in vms.iter().zip(guests) {
                    if let Some(r) = out.phases.get_mut(vm).and_then(|p| p.get_mut(k)) {
                        r.replay = Some(c);
                    }
                }
            }
        }
        Err(e) => {
            for &k in &fio_phases {
                let first = vms.first().and_then(|vm| out.phases.get_mut(vm));
                if let Some(r) = first.and_then(|p| p.get_mut(k)) {
                    let name = &plan.spec.phases[k].name;
                    r.error
                        .get_or_insert(format!("{name}: replay_iolog: {e:#}"));
                }
            }
        }
    }
}

/// Every guest's log of every phase in `fio_phases`, replayed.
fn counted(
    plan: &RunPlan,
    share: &Path,
    vms: &[String],
    fio_phases: &[usize],
) -> Result<Vec<Vec<iolog_replay::Counted>>> {
    let mut logs = Logs::default();
    let mut phases: Vec<Vec<Vec<Io>>> = Vec::new();
    for &k in fio_phases {
        let mut guests = Vec::new();
        for vm in vms {
            let path = share
                .join(".cxlfs/out")
                .join(vm)
                .join(k.to_string())
                .join(IOLOG);
            let text = fs::read_to_string(&path)
                .with_context(|| format!("{vm}'s log of phase {k}: {}", path.display()))?;
            guests.push(
                logs.parse(&text)
                    .with_context(|| format!("{vm}'s log of phase {k}"))?,
            );
        }
        phases.push(guests);
    }
    let daemon = &plan.spec.daemon;
    let period = daemon
        .access_bits()
        .is_on()
        .then(|| daemon.access_bits_period_ns());
    Ok(iolog_replay::replay(&plan.device, &logs, &phases, period)?)
}
