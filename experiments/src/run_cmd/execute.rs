//! One run of a plan: a temp work dir with the share, the back-end started
//! (`cxlfsd`, or one `virtiofsd` per guest), the guests booted at once, the
//! phase barriers passed (a daemon snapshot and the back-end's resident
//! memory at each), the guests powered off (or stopped), the back-end
//! stopped with SIGTERM, and what the guests left read back.

use super::guests::{boot, Guest};
use super::host_memory::rss_bytes;
use super::iolog_check::replay_iologs;
use super::run_output::{collect, unix_ms, RunOutput};
use super::server::Server;
use super::share::prepare_share;
use super::tools::Tools;
use crate::spec::RunPlan;
use cxlfs_device_model::units::parse_duration_ns;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Runs one plan; never panics on bad input: every problem ends up in
/// `RunOutput::error`.
pub(super) fn execute(
    plan: &RunPlan,
    tools: &Tools,
    run_dir: &Path,
    stop: &AtomicBool,
) -> RunOutput {
    let mut out = RunOutput::default();
    let vms: Vec<String> = (0..plan.spec.vms.count).map(|i| format!("vm{i}")).collect();
    let work = match tempfile::Builder::new().prefix("cxlfs-run.").tempdir() {
        Ok(w) => w,
        Err(e) => {
            out.error = Some(format!("cannot create a work dir: {e}"));
            return out;
        }
    };
    let share = work.path().join("share");
    if let Err(e) = prepare_share(plan, tools, &share, run_dir, &vms) {
        out.error = Some(format!("preparing the share: {e:#}"));
        return out;
    }
    let daemon = match Server::start(plan, tools, work.path(), run_dir, &vms) {
        Ok(d) => d,
        Err(e) => {
            out.error = Some(e);
            return out;
        }
    };
    let mut guests = boot_guests(plan, tools, work.path(), run_dir, &vms, &mut out);
    let limit =
        Duration::from_nanos(parse_duration_ns(&plan.spec.vms.timeout).unwrap_or(600_000_000_000))
            + Duration::from_secs(30);
    let sync = share.join(".cxlfs/sync");
    let barriers = Barriers {
        vms: &vms,
        sync: &sync,
        started: Instant::now(),
        limit,
        stop,
    };
    if out.error.is_none() {
        match barriers.pass_all(plan, &daemon, &mut guests, run_dir, &mut out) {
            Ok(()) => {}
            Err(Halt::Interrupted) => {
                out.interrupted = true;
                out.error = Some("interrupted".into());
            }
            Err(Halt::Failed(e)) => out.error = Some(e),
        }
    }
    power_off(&mut guests, stop, &mut out);
    if let Err(e) = daemon.stop() {
        out.error.get_or_insert(e);
    }
    collect(plan, &share, run_dir, &vms, &mut out);
    replay_iologs(plan, &share, &vms, &mut out);
    out
}

/// Boots the guests `vms` in order; the first that cannot start ends the
/// booting and sets the run's error.
fn boot_guests(
    plan: &RunPlan,
    tools: &Tools,
    work: &Path,
    run_dir: &Path,
    vms: &[String],
    out: &mut RunOutput,
) -> Vec<Guest> {
    let mut guests = Vec::new();
    for vm in vms {
        match boot(plan, tools, work, run_dir, vm) {
            Ok(g) => guests.push(g),
            Err(e) => {
                out.error = Some(e);
                break;
            }
        }
    }
    guests
}

/// Why the barriers were not all passed.
enum Halt {
    /// SIGINT / SIGTERM.
    Interrupted,
    /// A guest ended, the guests were late, or the daemon did not answer.
    Failed(String),
}

/// The phase barriers of one run: before phase K every guest writes
/// `ready-VM-K` into `sync`, the host reads the daemon's snapshot and
/// answers with `go-K`.
struct Barriers<'a> {
    vms: &'a [String],
    sync: &'a Path,
    /// When the guests were booted.
    started: Instant,
    /// How long after `started` the guests may take in all.
    limit: Duration,
    stop: &'a AtomicBool,
}

impl Barriers<'_> {
    /// Passes barriers 0 to the number of phases; the daemon's snapshot at
    /// each goes into `out.snapshots` (and `metrics-K.json` in `run_dir`),
    /// the back-end's resident bytes into `out.server_rss_bytes`.
    fn pass_all(
        &self,
        plan: &RunPlan,
        daemon: &Server,
        guests: &mut [Guest],
        run_dir: &Path,
        out: &mut RunOutput,
    ) -> Result<(), Halt> {
        for k in 0..=plan.spec.phases.len() {
            self.wait(k, guests)?;
            out.server_rss_bytes.push(rss_bytes(&daemon.pids()));
            match daemon.scrape() {
                Some(Ok((text, snap))) => {
                    let _ = fs::write(run_dir.join(format!("metrics-{k}.json")), text);
                    out.snapshots.push((unix_ms(), snap));
                }
                Some(Err(e)) => {
                    return Err(Halt::Failed(format!("scraping cxlfsd at barrier {k}: {e}")))
                }
                None => {}
            }
            if let Err(e) = fs::write(self.sync.join(format!("go-{k}")), b"") {
                return Err(Halt::Failed(format!("writing go-{k}: {e}")));
            }
        }
        Ok(())
    }

    /// Waits until every guest is at barrier `k`.
    fn wait(&self, k: usize, guests: &mut [Guest]) -> Result<(), Halt> {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Err(Halt::Interrupted);
            }
            let ready = self
                .vms
                .iter()
                .all(|vm| self.sync.join(format!("ready-{vm}-{k}")).exists());
            if ready {
                return Ok(());
            }
            let mut ended = None;
            for g in guests.iter_mut() {
                if !self.sync.join(format!("ready-{}-{k}", g.name)).exists() && !g.running() {
                    ended = Some(g.describe_end());
                    break;
                }
            }
            if let Some(e) = ended {
                return Err(Halt::Failed(format!("barrier {k}: {e}")));
            }
            if self.started.elapsed() > self.limit {
                return Err(Halt::Failed(format!(
                    "barrier {k}: guests not there after {:?}",
                    self.limit
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The guests power off after the last barrier; stops any that do not
/// (within 60 s, or at once after an error or an interrupt). A guest that
/// did not exit 0 is the run's error if it has none yet.
fn power_off(guests: &mut [Guest], stop: &AtomicBool, out: &mut RunOutput) {
    let end = Instant::now();
    for g in guests {
        while out.error.is_none() && g.running() && end.elapsed() < Duration::from_secs(60) {
            if stop.load(Ordering::Relaxed) {
                out.interrupted = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if g.running() {
            g.stop();
        }
        if out.error.is_none() && g.status != Some(0) {
            out.error = Some(g.describe_end());
        }
    }
}
