//! `--config FILE | --preset NAME` and `--set key=value`: building the
//! effective device configuration.

use clap::Args;
use cxlfs_device_model::presets::preset;
use cxlfs_device_model::{DeviceConfig, LoadConfigError};
use serde::Serialize;
use std::io;
use std::path::PathBuf;

/// The preset used when neither `--config` nor `--preset` is given.
pub const DEFAULT_PRESET: &str = "cylon";

/// Where the device configuration comes from.
#[derive(Debug, Clone, Args)]
pub struct DeviceArgs {
    /// Device config file (TOML; may name a `preset` to start from).
    #[arg(long, value_name = "FILE", conflicts_with = "preset")]
    pub config: Option<PathBuf>,
    /// Start from a named preset (see `cxlfs presets`) [default: cylon].
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// Override one config key after the file or preset, e.g.
    /// `--set cache.policy=lru --set cache.size_bytes=4MiB` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
}

/// Why the device configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LoadDeviceConfigError {
    /// The config file could not be read.
    #[error("cannot read config {path}")]
    Read {
        /// File name as given.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The config file is malformed or has a bad key.
    #[error("config {path}")]
    File {
        /// File name as given.
        path: String,
        /// What is wrong (names the key).
        #[source]
        source: LoadConfigError,
    },
    /// An unknown preset, a bad `--set`, or an invalid result.
    #[error(transparent)]
    Config(#[from] LoadConfigError),
}

/// How the effective configuration was made, for reports.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigOrigin {
    /// Preset name (when no file was given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// Config file (when one was given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// `key=value` overrides applied, in order.
    pub overrides: Vec<String>,
}

impl DeviceArgs {
    /// The base config (file or preset) before any override.
    fn base(&self) -> Result<(DeviceConfig, ConfigOrigin), LoadDeviceConfigError> {
        let origin = |preset: Option<String>, file: Option<String>| ConfigOrigin {
            preset,
            file,
            overrides: Vec::new(),
        };
        if let Some(path) = &self.config {
            let shown = path.display().to_string();
            let text =
                std::fs::read_to_string(path).map_err(|source| LoadDeviceConfigError::Read {
                    path: shown.clone(),
                    source,
                })?;
            let cfg = DeviceConfig::from_toml_str(&text).map_err(|source| {
                LoadDeviceConfigError::File {
                    path: shown.clone(),
                    source,
                }
            })?;
            return Ok((cfg, origin(None, Some(shown))));
        }
        let name = self.preset.as_deref().unwrap_or(DEFAULT_PRESET);
        Ok((preset(name)?, origin(Some(name.to_string()), None)))
    }

    /// The effective config: base, then `--set` overrides, then `extra` ones.
    pub fn load(
        &self,
        extra: &[String],
    ) -> Result<(DeviceConfig, ConfigOrigin), LoadDeviceConfigError> {
        let (base, mut origin) = self.base()?;
        origin.overrides = self.sets.iter().chain(extra).cloned().collect();
        let cfg = base.with_overrides(&origin.overrides)?;
        Ok((cfg, origin))
    }
}

/// A one-line description of a config: the parts that matter most to results.
pub fn summary(cfg: &DeviceConfig) -> String {
    let c = &cfg.cache;
    let ways = match c.geometry() {
        (1, _) => "fully associative".to_string(),
        (_, 1) => "direct-mapped".to_string(),
        (_, w) => format!("{w}-way"),
    };
    let hits = if c.hits_visible {
        "hits visible"
    } else {
        "hits invisible"
    };
    let n = &cfg.nand;
    let nand = if n.enabled {
        format!(
            "NAND {} LUNs, tR {} tProg {} tBERS {}",
            n.luns(),
            format_ns(n.read_ns as f64),
            format_ns(n.program_ns as f64),
            format_ns(n.erase_ns as f64)
        )
    } else {
        format!(
            "NAND off (flat tR {} tProg {})",
            format_ns(n.read_ns as f64),
            format_ns(n.program_ns as f64)
        )
    };
    let prefetch = if cfg.prefetch.degree == 0 {
        "no prefetch".to_string()
    } else {
        format!(
            "prefetch {}x stride {}",
            cfg.prefetch.degree, cfg.prefetch.stride_pages
        )
    };
    format!(
        "{} cache {}, {ways}, {hits}, {prefetch} | {nand} | capacity {}",
        c.policy,
        human_size(c.size_bytes),
        human_size(cfg.capacity_bytes())
    )
}

/// A byte count for people: `4GiB` when exact, else `4.46GiB`.
pub fn human_size(bytes: u64) -> String {
    for (unit, m) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= m {
            return if bytes % m == 0 {
                format!("{}{unit}", bytes / m)
            } else {
                format!("{:.2}{unit}", bytes as f64 / m as f64)
            };
        }
    }
    format!("{bytes}B")
}

/// `850 ns`, `40 us`, `2.5 ms`, `1.2 s`.
pub fn format_ns(ns: f64) -> String {
    let (value, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "us")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    if unit == "ns" || value >= 100.0 || value.fract() == 0.0 {
        format!("{value:.0} {unit}")
    } else if value >= 10.0 {
        format!("{value:.1} {unit}")
    } else {
        format!("{value:.2} {unit}")
    }
}
