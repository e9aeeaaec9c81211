//! Waiting for a submitted job array: `squeue` every second until none of
//! its tasks is queued or running, a line whenever the counts change;
//! SIGINT / SIGTERM cancels the job (`scancel`) and waits for it to go.

use super::state::{cancel, queued};
use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a cancelled job may take to leave the queue (Slurm's KillWait
/// is 30 s by default).
const CANCEL_GRACE: Duration = Duration::from_secs(90);

/// Waits until job `id` has no task left in the queue; true if `stop` was
/// set (the job is then cancelled).
pub(super) fn wait_for(id: &str, stop: &AtomicBool) -> Result<bool> {
    let mut last = String::new();
    let mut cancelled: Option<Instant> = None;
    loop {
        if cancelled.is_none() && stop.load(Ordering::Relaxed) {
            eprintln!("cxlfs run: interrupted: scancel {id}");
            cancel(id)?;
            cancelled = Some(Instant::now());
        }
        let tasks = queued(id)?;
        if tasks.is_empty() {
            return Ok(cancelled.is_some());
        }
        if cancelled.is_some_and(|t| t.elapsed() > CANCEL_GRACE) {
            eprintln!("cxlfs run: job {id} still in the queue {CANCEL_GRACE:?} after scancel");
            return Ok(true);
        }
        let line = summary(&tasks);
        if line != last {
            eprintln!("cxlfs run: job {id}: {line}");
            last = line;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `RUNNING (12_1), PENDING (12_[2-3%1])`.
fn summary(tasks: &[(String, String)]) -> String {
    tasks
        .iter()
        .map(|(t, s)| format!("{s} ({t})"))
        .collect::<Vec<_>>()
        .join(", ")
}
