//! `DIR/slurm/sweep.json`: what a Slurm sweep was made of (the spec, its
//! `--set`s, `--quick`) and every job submitted for it, with its runs; what
//! `cxlfs collect` and `--resume` read back.

use crate::results::write_atomic;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};

/// The file, relative to the results directory.
pub(super) const FILE: &str = "slurm/sweep.json";

/// One `sbatch` of the sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Job {
    /// The array job's id.
    pub(super) job_id: String,
    /// Its array indices: the runs it runs.
    pub(super) runs: Vec<u32>,
    /// Its script, relative to the results directory.
    pub(super) script: String,
    pub(super) submitted_unix_ms: u64,
}

/// A Slurm sweep's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SlurmSweep {
    /// The spec (absolute).
    pub(super) spec: PathBuf,
    pub(super) sets: Vec<String>,
    pub(super) quick: bool,
    /// In submission order: a later job's state of a run wins.
    pub(super) jobs: Vec<Job>,
}

impl SlurmSweep {
    /// Reads `DIR/slurm/sweep.json`; `None` if there is none.
    pub(super) fn read(out_dir: &Path) -> Result<Option<Self>> {
        let path = out_dir.join(FILE);
        match fs::read_to_string(&path) {
            Ok(text) => Ok(Some(
                serde_json::from_str(&text)
                    .with_context(|| format!("reading {}", path.display()))?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes `DIR/slurm/sweep.json`.
    pub(super) fn write(&self, out_dir: &Path) -> Result<()> {
        let path = out_dir.join(FILE);
        write_atomic(&path, serde_json::to_string_pretty(self)?.as_bytes())?;
        Ok(())
    }
}
