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
//!
//! This module holds loading ([`load`], [`load_str`]) and its errors; the
//! rest is in its submodules:
//!
//! * [`types`]: the spec's top-level tables;
//! * [`phase`]: a phase's tables (memory policy, outputs, replay check);
//! * [`tree`]: the TOML tree (`--set` values, dotted paths, flattening);
//! * [`check`]: deserialising a tree and the spec-wide checks;
//! * [`check_phase`]: one phase's checks;
//! * [`quick`]: `[quick]` and how `--quick` shrinks a spec;
//! * [`sweep`]: sweep expansion into [`RunPlan`]s.

mod check;
mod check_phase;
mod phase;
mod quick;
mod sweep;
#[cfg(test)]
pub(crate) mod test_specs;
mod tree;
mod types;

pub use crate::plot_spec::PlotSpec;
pub use cxlfs_api::hits::access_sampling_text;
#[cfg(test)]
pub use phase::CsvCell;
pub use phase::{
    MissCheckSpec, MissMode, NodeName, NumaSpec, OutputSpec, PhaseSpec, ReplayCheckSpec,
};
pub use sweep::RunPlan;
pub use tree::size_value;
pub use tree::value_text;
pub use types::{Backend, ImageSpec, Spec};

use check::parse_tree;
use std::path::Path;
use tree::apply_sets;

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

/// A spec as loaded: the TOML tree (after `--set`) and the parsed spec.
#[derive(Debug, Clone)]
pub struct LoadedSpec {
    /// Where it came from (for error messages).
    path: String,
    /// The tree after `--set`.
    tree: toml::Value,
    /// The parsed spec.
    pub spec: Spec,
    /// The `--set` arguments it was loaded with.
    sets: Vec<String>,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::check::device_config;
    use super::test_specs::SPEC;
    use super::tree::{flatten_sets, parse_set_value};
    use super::*;

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
}
