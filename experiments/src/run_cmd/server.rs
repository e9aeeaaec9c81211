//! The virtio-fs back-end of one run, whichever it is (`daemon.backend`):
//! one `cxlfsd` for every guest, or one stock `virtiofsd` per guest. Both
//! are started before the guests boot and stopped after they are gone;
//! only `cxlfsd` has figures to scrape.

use super::daemon::{start_daemon, DaemonProc};
use super::tools::Tools;
use super::virtiofsd::{start_virtiofsd, VirtiofsdProcs};
use crate::daemon_metrics::Figures;
use crate::spec::{Backend, RunPlan};
use std::path::Path;

/// A started back-end.
pub(super) enum Server {
    Cxlfsd(DaemonProc),
    Virtiofsd(VirtiofsdProcs),
}

impl Server {
    /// Starts the plan's back-end for the guests `vms`.
    pub(super) fn start(
        plan: &RunPlan,
        tools: &Tools,
        work: &Path,
        run_dir: &Path,
        vms: &[String],
    ) -> Result<Server, String> {
        match plan.spec.daemon.backend {
            Backend::Cxlfsd => start_daemon(plan, tools, work, run_dir, vms).map(Server::Cxlfsd),
            Backend::Virtiofsd => {
                start_virtiofsd(plan, tools, work, run_dir, vms).map(Server::Virtiofsd)
            }
        }
    }

    /// `cxlfsd`'s snapshot (its text and figures); `None`: `virtiofsd` has none.
    pub(super) fn scrape(&self) -> Option<Result<(String, Figures), String>> {
        match self {
            Server::Cxlfsd(d) => Some(d.scrape()),
            Server::Virtiofsd(_) => None,
        }
    }

    /// The back-end's processes.
    pub(super) fn pids(&self) -> Vec<u32> {
        match self {
            Server::Cxlfsd(d) => vec![d.pid()],
            Server::Virtiofsd(v) => v.pids(),
        }
    }

    /// Stops it (SIGTERM).
    pub(super) fn stop(self) -> Result<(), String> {
        match self {
            Server::Cxlfsd(d) => d.stop(),
            Server::Virtiofsd(v) => v.stop(),
        }
    }
}
