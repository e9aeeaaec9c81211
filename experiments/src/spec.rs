//! Experiment specs (`cxlfs run SPEC.toml`): parsing with `FILE: KEY:`
//! errors, `--set` overrides, sweep expansion and `--quick`.
//!
//! A spec is TOML. It is read as a plain [`toml::Value`] first, so that
//! `--set key=value` (a dotted path into it) and every sweep point (one value
//! per swept path) can be applied to the tree; each resulting tree is then
//! deserialised into [`Spec`], which rejects unknown keys. Free-form tables
//! (`fio` options, `daemon.device` keys) are checked by their consumers: the
//! device keys by building the device config here, fio options by fio itself.
//! The full format is in `experiments/README.md`.

use cxlfs_device_model::presets::preset;
use cxlfs_device_model::units::{parse_duration_ns, parse_size};
use cxlfs_device_model::DeviceConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub use crate::plot_spec::PlotSpec;

/// The preset used when the spec names none (as in `cxlfsd`).
pub const DEFAULT_PRESET: &str = "cylon";
/// `cxlfsd`'s own default placement: every file page on the CXL-SSD.
pub const DEFAULT_CXL_RATIO: u8 = 100;

/// Why a spec could not be loaded or expanded.
#[derive(Debug, thiserror::Error)]
pub enum LoadSpecError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The spec file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The text is not TOML.
    #[error("{path}: {message}")]
    Syntax {
        /// The spec file.
        path: String,
        /// What the TOML parser said (with line and column).
        message: String,
    },
    /// A key is unknown, missing, of the wrong type or out of range.
    #[error("{path}: {key}: {message}")]
    Key {
        /// The spec file.
        path: String,
        /// The dotted key (for a sweep point: the point's values follow).
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A `--set` argument is not `KEY=VALUE`.
    #[error("--set `{0}`: expected KEY=VALUE (a dotted path into the spec)")]
    BadSet(String),
}

/// One experiment, as written (after `--set`, before the sweep).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Short name (plot titles, the table header).
    pub name: String,
    /// What the experiment measures (free text).
    #[serde(default)]
    pub description: String,
    /// Runs per sweep point.
    #[serde(default = "one")]
    pub repeats: u32,
    /// The daemon.
    #[serde(default)]
    pub daemon: DaemonSpec,
    /// The guests.
    #[serde(default)]
    pub vms: VmsSpec,
    /// The guest image: extra Debian packages, the kernel.
    #[serde(default)]
    pub image: ImageSpec,
    /// Free variables for phase commands (`{name}`), sweepable as `vars.NAME`.
    #[serde(default)]
    pub vars: toml::Table,
    /// Files created in the share before the daemon starts.
    #[serde(default)]
    pub files: Vec<FileSpec>,
    /// fio options for every job of every phase (`--KEY=VALUE`).
    #[serde(default)]
    pub fio: toml::Table,
    /// The phases (a fio invocation or a shell command each), in order, in
    /// the same boot.
    pub phases: Vec<PhaseSpec>,
    /// Swept keys: dotted path → values (cartesian product, keys in sorted order).
    #[serde(default)]
    pub sweep: BTreeMap<String, Vec<toml::Value>>,
    /// How `--quick` shrinks the run.
    #[serde(default)]
    pub quick: QuickSpec,
    /// Plots (default: every fio/daemon figure of interest against each swept key).
    #[serde(default)]
    pub plots: Vec<PlotSpec>,
}

fn one() -> u32 {
    1
}

/// `[daemon]`: how `cxlfsd` is started.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonSpec {
    /// Device preset (`cxlfsd --preset`).
    #[serde(default)]
    pub preset: Option<String>,
    /// Device-model keys (`cxlfsd --set KEY=VALUE`), nested or dotted:
    /// `cache.size_bytes = "16MiB"`, `nand.read_ns = "40us"`.
    #[serde(default)]
    pub device: toml::Table,
    /// Guest caching (`cxlfsd --cache`): never | auto | always.
    #[serde(default = "default_cache")]
    pub cache: String,
    /// Share of file pages on the CXL-SSD tier, 0–100 (`cxlfsd --cxl-ratio`;
    /// not passed when absent: the daemon's default, 100).
    #[serde(default)]
    pub cxl_ratio: Option<u8>,
    /// DAX window (`cxlfsd --dax on`; guests get a window and mount with `dax=always`).
    #[serde(default)]
    pub dax: bool,
    /// Memory mode: each VM gets a CXL memory region of this size
    /// (`cxlfsd --cxl-memory VM=SIZE`), its CPU-less NUMA node 1.
    #[serde(default)]
    pub cxl_memory: Option<toml::Value>,
    /// Daemon metrics sample interval (`--metrics-interval`), when the daemon supports it.
    #[serde(default = "default_metrics_interval")]
    pub metrics_interval: String,
    /// Extra `cxlfsd` arguments, verbatim.
    #[serde(default)]
    pub args: Vec<String>,
}

fn default_cache() -> String {
    "never".into()
}

fn default_metrics_interval() -> String {
    "1s".into()
}

impl DaemonSpec {
    /// The CXL memory region size in bytes (memory mode), `None` without
    /// one (a spec that loaded has a valid size here).
    pub fn cxl_memory_bytes(&self) -> Option<u64> {
        self.cxl_memory.as_ref().and_then(|m| size_value(m).ok())
    }
}

impl Default for DaemonSpec {
    fn default() -> Self {
        DaemonSpec {
            preset: None,
            device: toml::Table::new(),
            cache: default_cache(),
            cxl_ratio: None,
            dax: false,
            cxl_memory: None,
            metrics_interval: default_metrics_interval(),
            args: Vec::new(),
        }
    }
}

/// `[vms]`: the guests, all alike, named `vm0`, `vm1`, ...
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmsSpec {
    /// How many guests run at once.
    #[serde(default = "one")]
    pub count: u32,
    /// Guest RAM (QEMU syntax).
    #[serde(default = "default_memory")]
    pub memory: String,
    /// vCPUs per guest.
    #[serde(default = "one")]
    pub smp: u32,
    /// Guest mount options of the share (default with DAX: `dax=always`).
    #[serde(default)]
    pub mountopts: Option<String>,
    /// DAX window per guest (QEMU `cache-size`), used when `daemon.dax` is on.
    #[serde(default = "default_dax_window")]
    pub dax_window: String,
    /// Guest time limit per run (the guest is killed after it).
    #[serde(default = "default_vm_timeout")]
    pub timeout: String,
}

fn default_memory() -> String {
    "1G".into()
}

fn default_dax_window() -> String {
    "64M".into()
}

fn default_vm_timeout() -> String {
    "600s".into()
}

impl Default for VmsSpec {
    fn default() -> Self {
        VmsSpec {
            count: 1,
            memory: default_memory(),
            smp: 1,
            mountopts: None,
            dax_window: default_dax_window(),
            timeout: default_vm_timeout(),
        }
    }
}

/// `[[files]]`: a file in the share, filled with deterministic pseudo-random bytes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// Path in the share; with `count > 1` it must contain `{i}` (0, 1, ...).
    pub path: String,
    /// Size (`16MiB`, `4k`, bytes).
    pub size: toml::Value,
    /// How many files of this pattern.
    #[serde(default = "one")]
    pub count: u32,
}

/// `[image]`: what `cxlfs image build` puts in the guest image.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// Extra Debian packages (all their files and shared libraries).
    #[serde(default)]
    pub packages: Vec<String>,
    /// Kernel: `default` (Debian 12's), `backports` (bookworm-backports:
    /// weighted interleave needs Linux >= 6.9) or a package name.
    #[serde(default)]
    pub kernel: Option<String>,
}

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
}

/// `[quick]`: what `--quick` does.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuickSpec {
    /// File sizes, fio sizes and the device cache are divided by this.
    #[serde(default = "default_divisor")]
    pub size_divisor: u32,
    /// No size shrinks below this.
    #[serde(default = "default_min_size")]
    pub min_size: String,
    /// fio `runtime` and `ramp_time` are capped at this.
    #[serde(default = "default_max_runtime")]
    pub max_runtime: String,
    /// Keys set under `--quick` (dotted path → value, as `--set`), applied
    /// before the sweep: `"sweep.vars.x" = [1, 2]`, `"vars.laps" = 1`.
    #[serde(default)]
    pub set: toml::Table,
}

fn default_divisor() -> u32 {
    8
}

fn default_min_size() -> String {
    "1MiB".into()
}

fn default_max_runtime() -> String {
    "2s".into()
}

impl Default for QuickSpec {
    fn default() -> Self {
        QuickSpec {
            size_divisor: default_divisor(),
            min_size: default_min_size(),
            max_runtime: default_max_runtime(),
            set: toml::Table::new(),
        }
    }
}

/// A spec as loaded: the TOML tree (after `--set`) and the parsed spec.
#[derive(Debug, Clone)]
pub struct LoadedSpec {
    /// Where it came from (for error messages).
    pub path: String,
    /// The tree after `--set`.
    pub tree: toml::Value,
    /// The parsed spec.
    pub spec: Spec,
    /// The `--set` arguments it was loaded with.
    pub sets: Vec<String>,
}

/// One run's configuration: a sweep point (and repeat) with everything resolved.
#[derive(Debug, Clone, Serialize)]
pub struct RunPlan {
    /// 1-based run number over the whole experiment.
    pub run: u32,
    /// 0-based sweep point.
    pub point: u32,
    /// 0-based repeat.
    pub repeat: u32,
    /// The swept keys and this point's values.
    pub params: Vec<(String, toml::Value)>,
    /// The spec at this point (after `--quick`).
    pub spec: Spec,
    /// `cxlfsd --set` arguments (flattened `daemon.device`).
    pub device_sets: Vec<String>,
    /// The effective device config.
    #[serde(skip)]
    pub device: DeviceConfig,
}

impl RunPlan {
    /// `key=value` of each swept key, for logs and file names.
    pub fn label(&self) -> String {
        if self.params.is_empty() {
            return "default".into();
        }
        self.params
            .iter()
            .map(|(k, v)| format!("{k}={}", value_text(v)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A TOML value as plain text: strings unquoted.
pub fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Reads a `--set` value: TOML if it parses (`5`, `true`, `[0, 50]`,
/// `"x"`), else the text as a string.
pub fn parse_set_value(text: &str) -> toml::Value {
    let text = text.trim();
    toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_string()))
}

/// Splits a dotted path. Under `sweep`, the rest is one key
/// (`sweep.daemon.cxl_ratio` → `["sweep", "daemon.cxl_ratio"]`).
pub fn split_path(path: &str) -> Vec<String> {
    match path.strip_prefix("sweep.") {
        Some(rest) => vec!["sweep".to_string(), rest.to_string()],
        None => path.split('.').map(str::to_string).collect(),
    }
}

/// Sets `path` in `tree`, creating tables on the way; array elements are
/// addressed by index (`phases.1.fio.rw`).
pub fn set_path(tree: &mut toml::Value, path: &[String], value: toml::Value) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("empty key".into());
    };
    let mut node = tree;
    for (i, part) in parents.iter().enumerate() {
        let here = path[..=i].join(".");
        node = match node {
            toml::Value::Table(t) => t
                .entry(part.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new())),
            toml::Value::Array(a) => {
                let idx: usize = part
                    .parse()
                    .map_err(|_| format!("{here}: `{part}` is not an index into an array"))?;
                let len = a.len();
                a.get_mut(idx)
                    .ok_or_else(|| format!("{here}: index {idx} out of range (length {len})"))?
            }
            _ => return Err(format!("{}: not a table", path[..i].join("."))),
        };
    }
    match node {
        toml::Value::Table(t) => {
            t.insert(last.clone(), value);
            Ok(())
        }
        toml::Value::Array(a) => {
            let idx: usize = last
                .parse()
                .map_err(|_| format!("{}: `{last}` is not an index", path.join(".")))?;
            let len = a.len();
            *a.get_mut(idx).ok_or_else(|| {
                format!(
                    "{}: index {idx} out of range (length {len})",
                    path.join(".")
                )
            })? = value;
            Ok(())
        }
        _ => Err(format!("{}: not a table", parents.join("."))),
    }
}

/// Deserialises a tree into a [`Spec`], naming the failing key.
fn parse_tree(path: &str, tree: &toml::Value, context: &str) -> Result<Spec, LoadSpecError> {
    let spec: Spec = serde_path_to_error::deserialize(tree.clone()).map_err(|e| {
        let key = e.path().to_string();
        LoadSpecError::Key {
            path: path.to_string(),
            key: if key == "." {
                "(top level)".into()
            } else {
                key
            } + context,
            // toml appends "in `KEY`" lines; the key is already named.
            message: e
                .into_inner()
                .to_string()
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
        }
    })?;
    let key_err = |key: &str, message: String| LoadSpecError::Key {
        path: path.to_string(),
        key: format!("{key}{context}"),
        message,
    };
    if spec.phases.is_empty() {
        return Err(key_err(
            "phases",
            "at least one [[phases]] is needed".into(),
        ));
    }
    for (i, p) in spec.phases.iter().enumerate() {
        if p.name.is_empty()
            || !p
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(key_err(
                &format!("phases.{i}.name"),
                format!("`{}`: use letters, digits, `-`, `_`, `.`", p.name),
            ));
        }
        if spec.phases[..i].iter().any(|q| q.name == p.name) {
            return Err(key_err(
                &format!("phases.{i}.name"),
                format!("`{}` used twice", p.name),
            ));
        }
    }
    if spec.repeats == 0 {
        return Err(key_err("repeats", "must be at least 1".into()));
    }
    if spec.vms.count == 0 || spec.vms.count > 16 {
        return Err(key_err("vms.count", format!("{} (1..=16)", spec.vms.count)));
    }
    if let Some(r) = spec.daemon.cxl_ratio {
        if r > 100 {
            return Err(key_err("daemon.cxl_ratio", format!("{r} (0..=100)")));
        }
    }
    if !matches!(spec.daemon.cache.as_str(), "never" | "auto" | "always") {
        return Err(key_err(
            "daemon.cache",
            format!("`{}`: never | auto | always", spec.daemon.cache),
        ));
    }
    parse_duration_ns(&spec.vms.timeout).map_err(|e| key_err("vms.timeout", e.to_string()))?;
    parse_duration_ns(&spec.daemon.metrics_interval)
        .map_err(|e| key_err("daemon.metrics_interval", e.to_string()))?;
    parse_size(&spec.quick.min_size).map_err(|e| key_err("quick.min_size", e.to_string()))?;
    parse_duration_ns(&spec.quick.max_runtime)
        .map_err(|e| key_err("quick.max_runtime", e.to_string()))?;
    if spec.quick.size_divisor == 0 {
        return Err(key_err("quick.size_divisor", "must be at least 1".into()));
    }
    for (i, f) in spec.files.iter().enumerate() {
        size_value(&f.size).map_err(|e| key_err(&format!("files.{i}.size"), e))?;
        if f.count > 1 && !f.path.contains("{i}") {
            return Err(key_err(
                &format!("files.{i}.path"),
                format!(
                    "`{}`: count = {} needs `{{i}}` in the path",
                    f.path, f.count
                ),
            ));
        }
        check_share_path(&f.path).map_err(|e| key_err(&format!("files.{i}.path"), e))?;
    }
    for (k, values) in &spec.sweep {
        if values.is_empty() {
            return Err(key_err(&format!("sweep.{k}"), "no values".into()));
        }
        if k.starts_with("sweep") || k.is_empty() {
            return Err(key_err(
                &format!("sweep.{k}"),
                "cannot sweep this key".into(),
            ));
        }
    }
    device_config(&spec.daemon).map_err(|(key, message)| key_err(&key, message))?;
    if let Some(m) = &spec.daemon.cxl_memory {
        let b = size_value(m).map_err(|e| key_err("daemon.cxl_memory", e))?;
        if b < 16 << 20 || b % (2 << 20) != 0 {
            return Err(key_err(
                "daemon.cxl_memory",
                format!("{b} bytes: at least 16 MiB, a multiple of 2 MiB"),
            ));
        }
    }
    for (k, _) in &spec.vars {
        if !is_identifier(k) {
            return Err(key_err(
                &format!("vars.{k}"),
                "a variable name is letters, digits and `_`, not starting with a digit".into(),
            ));
        }
    }
    for k in spec.sweep.keys() {
        if k.starts_with("image") {
            return Err(key_err(
                &format!("sweep.{k}"),
                "the image is one per experiment: not sweepable".into(),
            ));
        }
    }
    for (i, p) in spec.phases.iter().enumerate() {
        check_phase(&spec, p)
            .map_err(|(key, message)| key_err(&format!("phases.{i}.{key}"), message))?;
    }
    Ok(spec)
}

fn is_identifier(k: &str) -> bool {
    k.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A phase's own rules: fio or a command, one policy, readable outputs.
fn check_phase(spec: &Spec, p: &PhaseSpec) -> Result<(), (String, String)> {
    let job_file = p.fio.contains_key("job_file") || spec.fio.contains_key("job_file");
    if p.command.is_some() {
        if !p.fio.is_empty() || !p.jobs.is_empty() {
            return Err((
                "command".into(),
                "a command phase takes no fio options or jobs".into(),
            ));
        }
    } else {
        if !p.outputs.is_empty() || p.replay_check.is_some() {
            return Err((
                "outputs".into(),
                "outputs and replay_check read a command's output: set `command`".into(),
            ));
        }
        if job_file {
            let extra: Vec<&String> = spec
                .fio
                .keys()
                .chain(p.fio.keys())
                .filter(|k| *k != "job_file")
                .collect();
            if !extra.is_empty() || !p.jobs.is_empty() {
                return Err((
                    "fio.job_file".into(),
                    format!(
                        "a job file runs verbatim: put {extra:?} in it (fio's ${{VAR}} reads the spec's [vars] from the environment)"
                    ),
                ));
            }
        }
    }
    if let Some(n) = &p.numa {
        let n = n.resolved().map_err(|e| ("numa.ratio".to_string(), e))?;
        if let NumaSpec::WeightedInterleave(w) = &n {
            if let Some((k, v)) = w.iter().find(|(_, v)| **v == 0 || **v > 255) {
                return Err((
                    "numa.weighted_interleave".into(),
                    format!("{k} = {v}: weights are 1..=255 (leave a node out for 0)"),
                ));
            }
        }
        let names = n.nodes();
        for name in &names {
            match name {
                NodeName::Name(s) if s == "cxl" && spec.daemon.cxl_memory.is_none() => {
                    return Err((
                        "numa".into(),
                        "`cxl` needs a CXL memory node: set daemon.cxl_memory".into(),
                    ))
                }
                NodeName::Name(s) if s != "cxl" && s != "dram" => {
                    return Err((
                        "numa".into(),
                        format!("node `{s}`: a number, `cxl` or `dram`"),
                    ))
                }
                _ => {}
            }
        }
    }
    for (name, o) in &p.outputs {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
        {
            return Err((
                format!("outputs.{name}"),
                "output names are letters, digits, `_`, `-`".into(),
            ));
        }
        let ways = [o.json.is_some(), o.regex.is_some(), o.csv.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        if ways != 1 {
            return Err((
                format!("outputs.{name}"),
                "give exactly one of json, regex, csv".into(),
            ));
        }
        if o.histogram && o.json.is_none() {
            return Err((
                format!("outputs.{name}.histogram"),
                "a histogram is read from JSON".into(),
            ));
        }
        if let Some(r) = &o.regex {
            let re = regex::Regex::new(r)
                .map_err(|e| (format!("outputs.{name}.regex"), e.to_string()))?;
            if re.captures_len() < 2 {
                return Err((
                    format!("outputs.{name}.regex"),
                    "needs a capture group: the number is group 1".into(),
                ));
            }
        }
        if let Some(f) = &o.file {
            check_share_path(f).map_err(|e| (format!("outputs.{name}.file"), e))?;
        }
        if !matches!(o.aggregate.as_deref(), None | Some("mean" | "sum")) {
            return Err((format!("outputs.{name}.aggregate"), "mean | sum".into()));
        }
    }
    if let Some(rc) = &p.replay_check {
        check_share_path(&rc.sequence).map_err(|e| ("replay_check.sequence".to_string(), e))?;
        if !p.outputs.get(&rc.histogram).is_some_and(|o| o.histogram) {
            return Err((
                "replay_check.histogram".into(),
                format!("`{}` is not a histogram output of this phase", rc.histogram),
            ));
        }
        if rc.hit_below_ns.is_nan() || rc.hit_below_ns <= 0.0 {
            return Err((
                "replay_check.hit_below_ns".into(),
                "must be positive".into(),
            ));
        }
    }
    Ok(())
}

fn check_share_path(p: &str) -> Result<(), String> {
    let bad = p.is_empty()
        || p.starts_with('/')
        || p.split('/')
            .any(|c| c.is_empty() || c == "." || c == ".." || c == ".cxlfs");
    if bad {
        Err(format!(
            "`{p}`: a relative path inside the share (no `..`, not `.cxlfs`)"
        ))
    } else {
        Ok(())
    }
}

/// A size given as a number of bytes or a string with a unit.
pub fn size_value(v: &toml::Value) -> Result<u64, String> {
    match v {
        toml::Value::Integer(n) if *n >= 0 => Ok(*n as u64),
        toml::Value::String(s) => parse_size(s).map_err(|e| e.to_string()),
        other => Err(format!("expected a size, got {other}")),
    }
}

/// Flattens a nested table to `a.b.c=value` overrides (strings unquoted).
pub fn flatten_sets(prefix: &str, t: &toml::Table, out: &mut Vec<String>) {
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(inner) => flatten_sets(&key, inner, out),
            other => out.push(format!("{key}={}", value_text(other))),
        }
    }
}

/// The effective device config of a daemon spec; on error the failing key.
pub fn device_config(d: &DaemonSpec) -> Result<DeviceConfig, (String, String)> {
    let name = d.preset.as_deref().unwrap_or(DEFAULT_PRESET);
    let base = preset(name).map_err(|e| ("daemon.preset".to_string(), e.to_string()))?;
    let mut sets = Vec::new();
    flatten_sets("", &d.device, &mut sets);
    base.with_overrides(&sets)
        .map_err(|e| ("daemon.device".to_string(), e.to_string()))
}

/// Loads `path`, applies `sets` (`KEY=VALUE`, dotted paths) and parses it.
pub fn load(path: &Path, sets: &[String]) -> Result<LoadedSpec, LoadSpecError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| LoadSpecError::Read {
        path: shown.clone(),
        source,
    })?;
    load_str(&shown, &text, sets)
}

/// [`load`] from text (`path` names it in errors).
pub fn load_str(path: &str, text: &str, sets: &[String]) -> Result<LoadedSpec, LoadSpecError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| LoadSpecError::Syntax {
        path: path.to_string(),
        message: e.to_string().trim_end().to_string(),
    })?;
    let mut tree = toml::Value::Table(table);
    apply_sets(path, &mut tree, sets)?;
    let spec = parse_tree(path, &tree, "")?;
    Ok(LoadedSpec {
        path: path.to_string(),
        tree,
        spec,
        sets: sets.to_vec(),
    })
}

/// Applies `--set KEY=VALUE` arguments to `tree`.
fn apply_sets(path: &str, tree: &mut toml::Value, sets: &[String]) -> Result<(), LoadSpecError> {
    for s in sets {
        let (key, value) = s
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty())
            .ok_or_else(|| LoadSpecError::BadSet(s.clone()))?;
        set_path(tree, &split_path(key.trim()), parse_set_value(value)).map_err(|message| {
            LoadSpecError::Key {
                path: path.to_string(),
                key: format!("{} (--set)", key.trim()),
                message,
            }
        })?;
    }
    Ok(())
}

impl LoadedSpec {
    /// Every run: the cartesian product of the sweep (first key outermost),
    /// each point repeated `repeats` times; with `quick` the sizes and
    /// runtimes shrink but the points stay.
    pub fn expand(&self, quick: bool) -> Result<Vec<RunPlan>, LoadSpecError> {
        if quick && !self.spec.quick.set.is_empty() {
            return self.with_quick_sets()?.expand_points(true);
        }
        self.expand_points(quick)
    }

    /// The spec with `[quick] set` applied to its tree, then the command
    /// line's `--set` again (what the user asks for wins).
    fn with_quick_sets(&self) -> Result<LoadedSpec, LoadSpecError> {
        let mut tree = self.tree.clone();
        for (key, value) in &self.spec.quick.set {
            set_path(&mut tree, &split_path(key), value.clone()).map_err(|message| {
                LoadSpecError::Key {
                    path: self.path.clone(),
                    key: format!("quick.set.{key}"),
                    message,
                }
            })?;
        }
        if let Some(toml::Value::Table(q)) = tree.get_mut("quick") {
            q.remove("set");
        }
        apply_sets(&self.path, &mut tree, &self.sets)?;
        let spec = parse_tree(&self.path, &tree, " (quick.set)")?;
        Ok(LoadedSpec {
            path: self.path.clone(),
            tree,
            spec,
            sets: self.sets.clone(),
        })
    }

    fn expand_points(&self, quick: bool) -> Result<Vec<RunPlan>, LoadSpecError> {
        let dims: Vec<(&String, &Vec<toml::Value>)> = self.spec.sweep.iter().collect();
        let points: usize = dims.iter().map(|(_, v)| v.len()).product();
        let mut plans = Vec::new();
        let mut run = 0;
        for point in 0..points {
            // Mixed-radix digits, the last key fastest.
            let mut rest = point;
            let mut params = vec![(String::new(), toml::Value::Boolean(false)); dims.len()];
            for (i, (k, values)) in dims.iter().enumerate().rev() {
                params[i] = ((*k).clone(), values[rest % values.len()].clone());
                rest /= values.len();
            }
            let mut tree = self.tree.clone();
            if let toml::Value::Table(t) = &mut tree {
                t.remove("sweep");
            }
            for (k, v) in &params {
                set_path(&mut tree, &split_path(k), v.clone()).map_err(|message| {
                    LoadSpecError::Key {
                        path: self.path.clone(),
                        key: format!("sweep.{k}"),
                        message,
                    }
                })?;
            }
            let context = format!(
                " (sweep point {})",
                params
                    .iter()
                    .map(|(k, v)| format!("{k}={}", value_text(v)))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            let mut spec = parse_tree(&self.path, &tree, &context)?;
            spec.sweep = self.spec.sweep.clone();
            if quick {
                apply_quick(&mut spec).map_err(|(key, message)| LoadSpecError::Key {
                    path: self.path.clone(),
                    key: key + &context,
                    message,
                })?;
            }
            let device =
                device_config(&spec.daemon).map_err(|(key, message)| LoadSpecError::Key {
                    path: self.path.clone(),
                    key: key + &context,
                    message,
                })?;
            let mut device_sets = Vec::new();
            flatten_sets("", &spec.daemon.device, &mut device_sets);
            for repeat in 0..spec.repeats {
                run += 1;
                plans.push(RunPlan {
                    run,
                    point: point as u32,
                    repeat,
                    params: params.clone(),
                    spec: spec.clone(),
                    device_sets: device_sets.clone(),
                    device: device.clone(),
                });
            }
        }
        Ok(plans)
    }
}

/// fio options holding a size that `--quick` divides.
const QUICK_SIZE_KEYS: [&str; 4] = ["size", "filesize", "io_size", "io_limit"];
/// fio options holding a duration that `--quick` caps.
const QUICK_TIME_KEYS: [&str; 2] = ["runtime", "ramp_time"];

/// Shrinks one spec for `--quick` (see [`QuickSpec`]); on error the failing key.
pub fn apply_quick(spec: &mut Spec) -> Result<(), (String, String)> {
    let q = spec.quick.clone();
    let div = u64::from(q.size_divisor.max(1));
    let min = parse_size(&q.min_size).map_err(|e| ("quick.min_size".to_string(), e.to_string()))?;
    let max_ns = parse_duration_ns(&q.max_runtime)
        .map_err(|e| ("quick.max_runtime".to_string(), e.to_string()))?;
    let shrink = |bytes: u64| -> u64 {
        let s = (bytes / div).max(min.min(bytes));
        // Whole 4 KiB pages (fio and the device work in pages).
        if s >= 4096 {
            s / 4096 * 4096
        } else {
            s
        }
    };
    for (i, f) in spec.files.iter_mut().enumerate() {
        let b = size_value(&f.size).map_err(|e| (format!("files.{i}.size"), e))?;
        f.size = toml::Value::Integer(shrink(b) as i64);
    }
    let fix_fio = |t: &mut toml::Table, at: &str| -> Result<(), (String, String)> {
        for key in QUICK_SIZE_KEYS {
            if let Some(v) = t.get_mut(key) {
                // Percentages and ranges are left to fio.
                if let Some(b) = fio_size(v) {
                    *v = toml::Value::Integer(shrink(b) as i64);
                } else if !matches!(v, toml::Value::String(s) if s.contains(['%', '-', ':'])) {
                    return Err((format!("{at}.{key}"), format!("cannot read {v} as a size")));
                }
            }
        }
        for key in QUICK_TIME_KEYS {
            if let Some(v) = t.get_mut(key) {
                let ns = fio_duration_ns(v).ok_or_else(|| {
                    (
                        format!("{at}.{key}"),
                        format!("cannot read {v} as a duration"),
                    )
                })?;
                if ns > max_ns {
                    *v = toml::Value::String(format!("{}ms", max_ns / 1_000_000));
                }
            }
        }
        Ok(())
    };
    fix_fio(&mut spec.fio, "fio")?;
    for (i, p) in spec.phases.iter_mut().enumerate() {
        fix_fio(&mut p.fio, &format!("phases.{i}.fio"))?;
        for (j, job) in p.jobs.iter_mut().enumerate() {
            fix_fio(job, &format!("phases.{i}.jobs.{j}"))?;
        }
    }
    // The device cache shrinks with the files, so working set / cache stays.
    if let Some(toml::Value::Table(cache)) = spec.daemon.device.get_mut("cache") {
        if let Some(v) = cache.get_mut("size_bytes") {
            let b = size_value(v).map_err(|e| ("daemon.device.cache.size_bytes".to_string(), e))?;
            *v = toml::Value::Integer(shrink(b) as i64);
        }
    }
    Ok(())
}

/// A fio size option as bytes (`16m`, `4k`, `1g`, `512`); `None` if it is
/// not a plain size.
pub fn fio_size(v: &toml::Value) -> Option<u64> {
    match v {
        toml::Value::Integer(n) if *n >= 0 => Some(*n as u64),
        toml::Value::String(s) => parse_size(s).ok(),
        _ => None,
    }
}

/// A fio time option in ns: a bare number is seconds (fio's default unit);
/// `ms`, `us`, `s`, `m` (minutes) and `h` suffixes.
pub fn fio_duration_ns(v: &toml::Value) -> Option<u64> {
    let s = match v {
        toml::Value::Integer(n) if *n >= 0 => return Some(*n as u64 * 1_000_000_000),
        toml::Value::String(s) => s.trim().to_ascii_lowercase(),
        _ => return None,
    };
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match unit.trim() {
        "" | "s" | "sec" => 1e9,
        "ms" | "msec" => 1e6,
        "us" | "usec" => 1e3,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        _ => return None,
    };
    Some((n * mult) as u64)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const SPEC: &str = r#"
name = "t"
repeats = 2
[daemon]
preset = "femu"
device.cache.size_bytes = "16MiB"
device.nand.read_ns = "40us"
cxl_ratio = 50
[vms]
count = 2
[[files]]
path = "data/f{i}.bin"
size = "32MiB"
count = 3
[fio]
rw = "randread"
size = "32m"
runtime = "10s"
time_based = 1
[[phases]]
name = "first"
[[phases]]
name = "second"
fio.bs = "64k"
[sweep]
"daemon.cxl_ratio" = [0, 100]
"vms.count" = [1, 2, 3]
"#;

    #[test]
    fn parses_a_spec_and_flattens_device_keys() {
        let l = load_str("s.toml", SPEC, &[]).unwrap();
        assert_eq!(l.spec.repeats, 2);
        assert_eq!(l.spec.vms.count, 2);
        assert_eq!(l.spec.daemon.cxl_ratio, Some(50));
        let mut sets = Vec::new();
        flatten_sets("", &l.spec.daemon.device, &mut sets);
        assert_eq!(sets, ["cache.size_bytes=16MiB", "nand.read_ns=40us"]);
        let dev = device_config(&l.spec.daemon).unwrap();
        assert_eq!(dev.cache.size_bytes, 16 << 20);
        assert_eq!(dev.nand.read_ns, 40_000);
    }

    #[test]
    fn unknown_keys_are_named_with_the_file() {
        let bad = SPEC.replace("count = 2", "count = 2\nmemry = \"1G\"");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("s.toml: vms.memry: unknown field `memry`"),
            "{e}"
        );
        let bad = SPEC.replace("repeats = 2", "repeats = 2\nsweeep = 1");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(e.contains("s.toml: ") && e.contains("sweeep"), "{e}");
        let bad = SPEC.replace("device.nand.read_ns", "device.nand.red_ns");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("s.toml: daemon.device: ") && e.contains("red_ns"),
            "{e}"
        );
        let bad = SPEC.replace("cxl_ratio = 50", "cxl_ratio = 150");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(e.starts_with("s.toml: daemon.cxl_ratio: "), "{e}");
        let e = load_str("s.toml", "name = \"x\"\n[[phases]]\nname = \"a b\"", &[])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.toml: phases.0.name: "), "{e}");
        let e = load_str("s.toml", "name = ", &[]).unwrap_err().to_string();
        assert!(e.starts_with("s.toml: "), "{e}");
        let e = load_str("s.toml", "name = \"x\"", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("phases"), "{e}");
        let bad = SPEC.replace("path = \"data/f{i}.bin\"", "path = \"../f{i}.bin\"");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(e.starts_with("s.toml: files.0.path: "), "{e}");
    }

    #[test]
    fn set_overrides_any_field() {
        let sets = [
            "repeats=1",
            "vms.memory=2G",
            "daemon.device.cache.policy=lru",
            "phases.1.fio.rw=randwrite",
            "fio.iodepth=4",
            "sweep.daemon.cxl_ratio=[10, 20, 30]",
            "daemon.dax=true",
        ]
        .map(String::from);
        let l = load_str("s.toml", SPEC, &sets).unwrap();
        assert_eq!(l.spec.repeats, 1);
        assert_eq!(l.spec.vms.memory, "2G");
        assert!(l.spec.daemon.dax);
        assert_eq!(l.spec.phases[1].fio["rw"].as_str(), Some("randwrite"));
        assert_eq!(l.spec.fio["iodepth"].as_integer(), Some(4));
        assert_eq!(l.spec.sweep["daemon.cxl_ratio"].len(), 3);
        assert_eq!(
            device_config(&l.spec.daemon).unwrap().cache.policy.name(),
            "lru"
        );
        let e = load_str("s.toml", SPEC, &["vms.cont=3".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("vms.cont"), "{e}");
        let e = load_str("s.toml", SPEC, &["phases.7.fio.rw=read".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("out of range"), "{e}");
        assert!(matches!(
            load_str("s.toml", SPEC, &["novalue".into()]),
            Err(LoadSpecError::BadSet(_))
        ));
        assert_eq!(parse_set_value("abc"), toml::Value::String("abc".into()));
        assert_eq!(parse_set_value("\"5\""), toml::Value::String("5".into()));
        assert_eq!(parse_set_value("5"), toml::Value::Integer(5));
    }

    #[test]
    fn sweep_expands_to_the_cartesian_product_with_repeats() {
        let l = load_str("s.toml", SPEC, &[]).unwrap();
        let plans = l.expand(false).unwrap();
        assert_eq!(plans.len(), 2 * 3 * 2);
        let pts: Vec<(i64, i64, u32)> = plans
            .iter()
            .map(|p| {
                (
                    i64::from(p.spec.daemon.cxl_ratio.unwrap()),
                    i64::from(p.spec.vms.count),
                    p.repeat,
                )
            })
            .collect();
        assert_eq!(pts[0], (0, 1, 0));
        assert_eq!(pts[1], (0, 1, 1));
        assert_eq!(pts[2], (0, 2, 0));
        assert_eq!(pts[6], (100, 1, 0));
        assert_eq!(pts[11], (100, 3, 1));
        assert_eq!(
            plans.iter().map(|p| p.run).collect::<Vec<_>>(),
            (1..=12).collect::<Vec<_>>()
        );
        assert_eq!(plans[2].point, 1);
        assert_eq!(plans[6].label(), "daemon.cxl_ratio=100 vms.count=1");
        // A bad value surfaces with its point.
        let bad = load_str("s.toml", SPEC, &["sweep.vms.count=[1, 0]".into()]).unwrap();
        let e = bad.expand(false).unwrap_err().to_string();
        assert!(e.contains("vms.count") && e.contains("sweep point"), "{e}");
        let bad = load_str("s.toml", SPEC, &["sweep.daemon.cxl_rattio=[1]".into()]).unwrap();
        let e = bad.expand(false).unwrap_err().to_string();
        assert!(e.contains("cxl_rattio"), "{e}");
        // A sweep over a phase's fio option.
        let l = load_str(
            "s.toml",
            SPEC,
            &["sweep.phases.0.fio.bs=[\"4k\", \"1m\"]".into()],
        )
        .unwrap();
        let plans = l.expand(false).unwrap();
        assert_eq!(plans.len(), 2 * 2 * 3 * 2);
        assert_eq!(plans[0].spec.phases[0].fio["bs"].as_str(), Some("4k"));
        // No sweep: one point.
        let l = load_str("s.toml", SPEC, &["repeats=1".into()]).unwrap();
        let mut l2 = l.clone();
        l2.spec.sweep.clear();
        if let toml::Value::Table(t) = &mut l2.tree {
            t.remove("sweep");
        }
        let plans = l2.expand(false).unwrap();
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].label(), "default");
    }

    #[test]
    fn quick_shrinks_sizes_and_runtimes_but_not_points() {
        let l = load_str("s.toml", SPEC, &[]).unwrap();
        let full = l.expand(false).unwrap();
        let quick = l.expand(true).unwrap();
        assert_eq!(full.len(), quick.len());
        for (f, q) in full.iter().zip(&quick) {
            assert_eq!(f.params, q.params);
        }
        let q = &quick[0].spec;
        assert_eq!(size_value(&q.files[0].size).unwrap(), 4 << 20);
        assert_eq!(fio_size(&q.fio["size"]), Some(4 << 20));
        assert_eq!(q.fio["runtime"].as_str(), Some("2000ms"));
        assert_eq!(quick[0].device.cache.size_bytes, 2 << 20);
        assert_eq!(full[0].device.cache.size_bytes, 16 << 20);
        // Never below min_size, nor bigger than it was.
        let mut s = l.spec.clone();
        s.files[0].size = toml::Value::String("2MiB".into());
        s.fio
            .insert("size".into(), toml::Value::String("50%".into()));
        s.fio.insert("runtime".into(), toml::Value::Integer(1));
        apply_quick(&mut s).unwrap();
        assert_eq!(size_value(&s.files[0].size).unwrap(), 1 << 20);
        assert_eq!(s.fio["size"].as_str(), Some("50%"));
        assert_eq!(s.fio["runtime"].as_integer(), Some(1));
        assert_eq!(
            fio_duration_ns(&toml::Value::String("1m".into())),
            Some(60_000_000_000)
        );
        assert_eq!(
            fio_duration_ns(&toml::Value::String("250ms".into())),
            Some(250_000_000)
        );
        assert_eq!(fio_duration_ns(&toml::Value::String("x".into())), None);
    }

    const MEMORY: &str = r#"
name = "m"
[daemon]
device.cache.size_bytes = "32MiB"
cxl_memory = "256MiB"
[vars]
x = 1.0
[[phases]]
name = "cxl"
command = "probe --size {int:x*cache_bytes}"
numa = { ratio = "3:1" }
outputs.bw = { json = "read_mb_s" }
outputs.lat = { json = "histogram", histogram = true }
replay_check = { sequence = "seq.bin", histogram = "lat", hit_below_ns = 5000 }
[sweep]
"vars.x" = [0.5, 2.0]
[quick]
size_divisor = 1
set = { "daemon.device.cache.size_bytes" = "8MiB", "sweep.vars.x" = [1.0] }
"#;

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

    #[test]
    fn quick_sets_apply_before_the_sweep_and_the_command_line_wins() {
        let quick = load_str("m.toml", MEMORY, &[])
            .unwrap()
            .expand(true)
            .unwrap();
        assert_eq!(quick.len(), 1);
        assert_eq!(quick[0].device.cache.size_bytes, 8 << 20);
        let mine = load_str(
            "m.toml",
            MEMORY,
            &["daemon.device.cache.size_bytes=16MiB".into()],
        )
        .unwrap()
        .expand(true)
        .unwrap();
        assert_eq!(mine[0].device.cache.size_bytes, 16 << 20);
    }

    #[test]
    fn bad_phases_are_refused_with_their_key() {
        let err = |from: &str, to: &str| {
            let text = MEMORY.replace(from, to);
            load_str("m.toml", &text, &[])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let e = err(
            r#"numa = { ratio = "3:1" }"#,
            r#"numa = { membind = "dram", interleave = "cxl" }"#,
        );
        assert!(e.contains("phases[0].numa"), "{e}");
        let e = err(r#"cxl_memory = "256MiB""#, "");
        assert!(e.contains("set daemon.cxl_memory"), "{e}");
        let e = err(
            r#"numa = { ratio = "3:1" }"#,
            r#"numa = { membind = "hbm" }"#,
        );
        assert!(e.contains("node `hbm`"), "{e}");
        let e = err(
            r#"outputs.bw = { json = "read_mb_s" }"#,
            r#"outputs.bw = { regex = "bw [0-9]+" }"#,
        );
        assert!(e.contains("capture group"), "{e}");
        let e = err(
            r#"outputs.bw = { json = "read_mb_s" }"#,
            r#"outputs.bw = { json = "a", regex = "(1)" }"#,
        );
        assert!(e.contains("exactly one of json, regex, csv"), "{e}");
        let e = err(r#"histogram = "lat""#, r#"histogram = "bw""#);
        assert!(e.contains("not a histogram output"), "{e}");
        let e = err(
            r#"command = "probe --size {int:x*cache_bytes}""#,
            "fio.rw = \"read\"",
        );
        assert!(e.contains("set `command`"), "{e}");
        let e = err(r#"cxl_memory = "256MiB""#, r#"cxl_memory = "3MiB""#);
        assert!(e.contains("at least 16 MiB"), "{e}");
    }
}
