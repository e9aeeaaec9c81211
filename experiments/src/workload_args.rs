//! Command-line description of a synthetic workload (shared by `replay` and `trace gen`).

use clap::Args;
use cxlfs_device_model::units::parse_size;
use cxlfs_device_model::workload::{WorkloadKind, WorkloadSpec};

/// Shape of a synthetic workload (with `--workload KIND`).
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Working-set size (units ok: 16GiB) [default: 1GiB].
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    pub wss: Option<u64>,
    /// Total accesses [default: --passes passes; a pass is one access per
    /// page for uniform/zipf, per slot for seq/pointer-chase, one lap for stride].
    #[arg(long, value_name = "N", value_parser = count_arg, conflicts_with = "passes")]
    pub accesses: Option<u64>,
    /// Passes over the working set when --accesses is not given [default: 1].
    #[arg(long, value_name = "N", value_parser = count_arg)]
    pub passes: Option<u64>,
    /// Seed of the workload's random streams [default: 1].
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Probability that an access is a store, 0..=1 [default: 0].
    #[arg(long, value_name = "F")]
    pub write_ratio: Option<f64>,
    /// Bytes per access (units ok) [default: 64].
    #[arg(long, value_name = "BYTES", value_parser = u32_size_arg)]
    pub access_size: Option<u32>,
    /// Device address where the working set starts (units ok) [default: 0].
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    pub base_addr: Option<u64>,
}

impl WorkloadArgs {
    /// The spec for `kind`, defaults filled in.
    pub fn spec(&self, kind: WorkloadKind) -> WorkloadSpec {
        let d = WorkloadSpec::default();
        WorkloadSpec {
            kind,
            wss_bytes: self.wss.unwrap_or(d.wss_bytes),
            accesses: self.accesses,
            passes: self.passes.unwrap_or(d.passes),
            seed: self.seed.unwrap_or(d.seed),
            write_ratio: self.write_ratio.unwrap_or(d.write_ratio),
            access_size: self.access_size.unwrap_or(d.access_size),
            base_addr: self.base_addr.unwrap_or(d.base_addr),
        }
    }

    /// The first option given, if any (they only make sense with `--workload`).
    pub fn first_given(&self) -> Option<&'static str> {
        [
            (self.wss.is_some(), "--wss"),
            (self.accesses.is_some(), "--accesses"),
            (self.passes.is_some(), "--passes"),
            (self.seed.is_some(), "--seed"),
            (self.write_ratio.is_some(), "--write-ratio"),
            (self.access_size.is_some(), "--access-size"),
            (self.base_addr.is_some(), "--base-addr"),
        ]
        .into_iter()
        .find_map(|(given, name)| given.then_some(name))
    }
}

/// clap parser for workload kinds.
pub fn kind_arg(s: &str) -> Result<WorkloadKind, String> {
    s.parse()
        .map_err(|e: cxlfs_device_model::workload::ParseWorkloadKindError| e.to_string())
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn u32_size_arg(s: &str) -> Result<u32, String> {
    let v = size_arg(s)?;
    u32::try_from(v).map_err(|_| format!("{v} does not fit in 32 bits"))
}

/// A count: `20000000`, `20_000_000`, `20M` (decimal suffixes k, M, G).
pub fn count_arg(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000),
        Some((i, 'm' | 'M')) => (&t[..i], 1_000_000),
        Some((i, 'g' | 'G')) => (&t[..i], 1_000_000_000),
        _ => (t.as_str(), 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("`{s}` is not a count (e.g. 1000000, 1_000_000 or 1M)"))
}
