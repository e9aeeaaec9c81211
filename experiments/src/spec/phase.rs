//! The tables of one `[[phases]]` entry: [`PhaseSpec`], its memory policy
//! ([`NumaSpec`] over [`NodeSet`]s), the figures read from its command's
//! output ([`OutputSpec`], [`CsvCell`]) and its [`ReplayCheckSpec`].

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A node set in a NUMA policy: `"cxl"` (the CPU-less CXL nodes), `"dram"`
/// (nodes with CPUs), a node number, or a list of those.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NodeSet {
    /// One name or number.
    One(NodeName),
    /// Several.
    Many(Vec<NodeName>),
}

/// One entry of a [`NodeSet`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NodeName {
    /// A node number.
    Number(u32),
    /// `cxl` or `dram`.
    Name(String),
}

impl NodeSet {
    /// The entries.
    pub fn names(&self) -> Vec<NodeName> {
        match self {
            NodeSet::One(n) => vec![n.clone()],
            NodeSet::Many(v) => v.clone(),
        }
    }
}

/// `numa = { ... }` of a phase: the memory policy the phase's command runs
/// under (numactl in the guest; `cxlfs-numa` for weighted interleave); a
/// table with exactly one of these keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NumaSpec {
    /// Allocate only on these nodes (`numactl --membind`).
    Membind(NodeSet),
    /// Round-robin pages over these nodes (`numactl --interleave`).
    Interleave(NodeSet),
    /// Prefer this node (`numactl --preferred`).
    Preferred(NodeName),
    /// Pages in proportion to weights (node → weight): `{ dram = 3, cxl = 1 }`
    /// (Linux >= 6.9: `[image] kernel = "backports"`).
    WeightedInterleave(BTreeMap<String, u32>),
    /// DRAM:CXL page ratio, as the seeds write it: `"1:0"` (membind dram),
    /// `"0:1"` (membind cxl), `"3:1"` (weighted interleave 3 to 1).
    Ratio(String),
}

impl NumaSpec {
    /// The policy with `ratio` spelled out as membind or weighted interleave.
    pub fn resolved(&self) -> Result<NumaSpec, String> {
        let NumaSpec::Ratio(r) = self else {
            return Ok(self.clone());
        };
        let bad =
            || format!("ratio `{r}`: DRAM:CXL as two whole numbers, not both 0 (1:0, 3:1, 0:1)");
        let (d, c) = r.split_once(':').ok_or_else(bad)?;
        let (d, c): (u32, u32) = (
            d.trim().parse().map_err(|_| bad())?,
            c.trim().parse().map_err(|_| bad())?,
        );
        let name = |s: &str| NodeSet::One(NodeName::Name(s.into()));
        Ok(match (d, c) {
            (0, 0) => return Err(bad()),
            (_, 0) => NumaSpec::Membind(name("dram")),
            (0, _) => NumaSpec::Membind(name("cxl")),
            (d, c) => NumaSpec::WeightedInterleave(
                [("dram".to_string(), d), ("cxl".to_string(), c)].into(),
            ),
        })
    }

    /// The nodes the (resolved) policy names.
    pub fn nodes(&self) -> Vec<NodeName> {
        match self {
            NumaSpec::Membind(s) | NumaSpec::Interleave(s) => s.names(),
            NumaSpec::Preferred(n) => vec![n.clone()],
            NumaSpec::WeightedInterleave(w) => w
                .keys()
                .map(|k| match k.parse::<u32>() {
                    Ok(i) => NodeName::Number(i),
                    Err(_) => NodeName::Name(k.clone()),
                })
                .collect(),
            NumaSpec::Ratio(_) => Vec::new(),
        }
    }
}

/// How one figure is read from what a phase's command left behind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// The file, relative to the phase's output directory (`$CXLFS_OUT`);
    /// default: the command's stdout.
    #[serde(default)]
    pub file: Option<String>,
    /// A dotted path into the JSON (the whole file, or its last line that is
    /// JSON): `read_mb_s`, `histogram`, `pass_mb_s.read.0`.
    #[serde(default)]
    pub json: Option<String>,
    /// A regular expression; its first capture group is the number.
    #[serde(default)]
    pub regex: Option<String>,
    /// A CSV cell: the row whose first cell is `row`, the column named
    /// `column` in the header (redis-benchmark `--csv`).
    #[serde(default)]
    pub csv: Option<CsvCell>,
    /// The JSON value is a histogram (`{"unit": .., "buckets": [[lo, hi, n], ..]}`):
    /// it goes to `distributions.jsonl`, with its p50/p99 as columns.
    #[serde(default)]
    pub histogram: bool,
    /// Multiply the number by this (unit changes).
    #[serde(default)]
    pub scale: Option<f64>,
    /// The `vm = "all"` row: `mean` (default) or `sum` over the VMs.
    #[serde(default)]
    pub aggregate: Option<String>,
}

/// A cell of a CSV output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsvCell {
    /// First cell of the row.
    pub row: String,
    /// Header name of the column.
    pub column: String,
}

/// `replay_check`: the full-system hit share against what `cxlfs replay`
/// predicts for the same access sequence on the same device config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayCheckSpec {
    /// The `cxlfs-memlat --sequence` file (page index per load of one lap,
    /// u32 LE), relative to the phase's output directory.
    pub sequence: String,
    /// The histogram output (cxlfs-memlat's JSON: `laps`, `warmup_laps`).
    pub histogram: String,
    /// Loads faster than this are hits.
    pub hit_below_ns: f64,
}

/// Which residency plane a `miss_check`'s loads trap into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MissMode {
    /// File pages through the DAX window (the VM's pool traps).
    File,
    /// The VM's CXL memory region (its region traps).
    Memory,
}

impl MissMode {
    /// The `mode` column's value.
    pub fn name(self) -> &'static str {
        match self {
            MissMode::File => "file",
            MissMode::Memory => "memory",
        }
    }
}

/// `miss_check`: the latency the guest felt on its misses against what the
/// device model charged for them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MissCheckSpec {
    /// The histogram output of per-load latencies.
    pub histogram: String,
    /// Loads slower than this trapped (misses).
    pub miss_above_ns: f64,
    /// Where the misses trap: `file` or `memory`.
    pub mode: MissMode,
}

/// `[[phases]]`: one fio invocation or shell command in every guest, all
/// guests at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseSpec {
    /// Phase name (`first-touch`); results carry it in the `phase` column.
    pub name: String,
    /// A shell line run instead of fio (`{var}` replaced, see `vars`); its
    /// stdout and any file it writes to `$CXLFS_OUT` are kept.
    #[serde(default)]
    pub command: Option<String>,
    /// The memory policy of the phase (fio or command).
    #[serde(default)]
    pub numa: Option<NumaSpec>,
    /// Figures read from the command's output: column `out.NAME`.
    #[serde(default)]
    pub outputs: BTreeMap<String, OutputSpec>,
    /// Cross-check the hit share against the device model's replay.
    #[serde(default)]
    pub replay_check: Option<ReplayCheckSpec>,
    /// Felt against modeled miss latency (columns `mode`, `miss_p50_ns`,
    /// `miss_p99_ns`, `modeled_miss_ns`).
    #[serde(default)]
    pub miss_check: Option<MissCheckSpec>,
    /// fio options for this phase (over the top-level `fio`).
    #[serde(default)]
    pub fio: toml::Table,
    /// Several jobs in one fio invocation (each a table of options, over
    /// `fio` and the phase's `fio`); fio reports them as one group.
    #[serde(default)]
    pub jobs: Vec<toml::Table>,
    /// Drop the guest's page cache before the phase.
    #[serde(default)]
    pub drop_caches: bool,
    /// Linux memory tiering in the guest for this phase and after (memory
    /// mode): promotion through NUMA-balancing hinting faults
    /// (`kernel.numa_balancing=2`) and demotion on reclaim
    /// (`/sys/kernel/mm/numa/demotion_enabled`).
    #[serde(default)]
    pub tiering: Option<TieringSpec>,
}

/// `tiering = { promotion = true, demotion = true }`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TieringSpec {
    /// Promote hot pages of the slower tier (NUMA balancing in tiering
    /// mode, `kernel.numa_balancing=2`; 0 when off).
    #[serde(default)]
    pub promotion: bool,
    /// Demote cold pages to the slower tier on reclaim
    /// (`demotion_enabled`).
    #[serde(default)]
    pub demotion: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::spec::load_str;
    use crate::spec::test_specs::MEMORY;

    #[test]
    fn command_phases_policies_and_outputs_load() {
        let l = load_str("m.toml", MEMORY, &[]).unwrap();
        let p = &l.spec.phases[0];
        assert_eq!(l.spec.daemon.cxl_memory_bytes(), Some(256 << 20));
        assert_eq!(
            p.numa.as_ref().unwrap().resolved().unwrap(),
            NumaSpec::WeightedInterleave([("cxl".into(), 1), ("dram".into(), 3)].into())
        );
        assert_eq!(
            NumaSpec::Ratio("0:1".into()).resolved().unwrap(),
            NumaSpec::Membind(NodeSet::One(NodeName::Name("cxl".into())))
        );
        assert!(NumaSpec::Ratio("0:0".into()).resolved().is_err());
        assert_eq!(p.outputs.len(), 2);
        assert_eq!(l.expand(false).unwrap().len(), 2);
    }
}
