//! Device configuration: TOML in, validated structs out.
//!
//! A config is always complete: a file names an optional `preset` to start
//! from (default `cylon`), and every key it sets must exist in that preset, so
//! a misspelt key is an error that names the key instead of a silently ignored
//! setting. `--set key=value` overrides go through the same path.

use crate::units::{deserialize_duration_ns, deserialize_size, format_size};
use crate::PAGE_SIZE;
use serde::{Deserialize, Serialize};

/// Why a device configuration could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoadConfigError {
    /// The TOML text itself is malformed.
    #[error("malformed TOML: {0}")]
    Syntax(String),
    /// A key that the device model does not have.
    #[error("unknown config key `{key}`")]
    UnknownKey {
        /// Dotted path of the key, e.g. `cache.sise_bytes`.
        key: String,
    },
    /// A key whose value has the wrong type or is out of range.
    #[error("bad value for `{key}`: {reason}")]
    BadValue {
        /// Dotted path of the key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An override that is not of the form `key=value`.
    #[error("override `{0}` is not of the form key=value")]
    MalformedOverride(String),
    /// A preset name that does not exist.
    #[error("unknown preset `{name}` (known: {known})")]
    UnknownPreset {
        /// The name that was asked for.
        name: String,
        /// Comma-separated list of presets.
        known: String,
    },
}

pub(crate) fn bad(key: &str, reason: impl Into<String>) -> LoadConfigError {
    LoadConfigError::BadValue {
        key: key.to_string(),
        reason: reason.into(),
    }
}

pub use crate::policy::{PolicyKind, PolicyParams};

/// The device's DRAM cache of 4 KiB pages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Cache capacity in bytes (a multiple of 4 KiB).
    #[serde(deserialize_with = "deserialize_size")]
    pub size_bytes: u64,
    /// Associativity: 0 = fully associative, 1 = direct-mapped, N = N-way.
    pub ways: u32,
    /// Eviction policy.
    pub policy: PolicyKind,
    /// Time to serve a page from the DRAM cache.
    #[serde(deserialize_with = "deserialize_duration_ns")]
    pub hit_latency_ns: u64,
    /// Whether the policy sees hits (false: only misses, as when hits never trap).
    pub hits_visible: bool,
    /// Policy tuning.
    pub params: PolicyParams,
    /// The cache-line write log (SkyByte's `write_log_enable` /
    /// `write_log_ratio`), in bytes: 0 = off. It is carved out of the
    /// cache's DRAM, as in SkyByte: the page cache keeps
    /// `size_bytes - write_log_bytes` (rounded down to whole sets). A
    /// multiple of 64 (one entry per 64-byte line), at least 4 KiB (one
    /// page's lines), smaller than `size_bytes`. See `write_log.rs`.
    #[serde(deserialize_with = "deserialize_size")]
    pub write_log_bytes: u64,
    /// Log cleaning (compaction) starts when the log is at least this full
    /// (a fraction; SkyByte: 0.51).
    pub write_log_clean_start: f64,
    /// Cleaning stops once the log is at most this full (a fraction below
    /// `write_log_clean_start`; SkyByte: 0.01).
    pub write_log_clean_stop: f64,
}

impl CacheConfig {
    /// Capacity in pages.
    pub fn pages(&self) -> u64 {
        self.size_bytes / PAGE_SIZE
    }

    /// (number of sets, ways per set) after resolving `ways = 0`.
    pub fn geometry(&self) -> (u64, u64) {
        let pages = self.pages();
        if self.ways == 0 || u64::from(self.ways) >= pages {
            (1, pages)
        } else {
            (pages / u64::from(self.ways), u64::from(self.ways))
        }
    }

    /// Bytes of the page cache proper: `size_bytes` less the write log,
    /// rounded down to whole `ways`-page sets (all of `size_bytes` when the
    /// log is off).
    pub fn page_cache_bytes(&self) -> u64 {
        if self.write_log_bytes == 0 {
            return self.size_bytes;
        }
        let pages = self.size_bytes.saturating_sub(self.write_log_bytes) / PAGE_SIZE;
        let set = u64::from(self.ways.max(1));
        pages / set * set * PAGE_SIZE
    }

    /// The config of the page cache proper (see [`CacheConfig::page_cache_bytes`]).
    pub fn page_cache(&self) -> CacheConfig {
        CacheConfig {
            size_bytes: self.page_cache_bytes(),
            ..self.clone()
        }
    }
}

/// The next-N prefetcher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefetchConfig {
    /// Pages fetched ahead of each demand miss (0 = off).
    pub degree: u32,
    /// Distance between prefetched pages, in pages.
    pub stride_pages: u32,
}

/// NAND geometry, timing, FTL and GC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NandConfig {
    /// false: a miss costs a flat `read_ns` (a write-back `program_ns`), no queues, no FTL.
    pub enabled: bool,
    /// Independent channels.
    pub channels: u32,
    /// LUNs (dies) per channel.
    pub luns_per_channel: u32,
    /// Planes per LUN.
    pub planes_per_lun: u32,
    /// Erase blocks per plane.
    pub blocks_per_plane: u32,
    /// 4 KiB pages per erase block.
    pub pages_per_block: u32,
    /// Page read (tR).
    #[serde(deserialize_with = "deserialize_duration_ns")]
    pub read_ns: u64,
    /// Page program (tProg).
    #[serde(deserialize_with = "deserialize_duration_ns")]
    pub program_ns: u64,
    /// Block erase (tBERS).
    #[serde(deserialize_with = "deserialize_duration_ns")]
    pub erase_ns: u64,
    /// Moving one page over the channel.
    #[serde(deserialize_with = "deserialize_duration_ns")]
    pub channel_xfer_ns: u64,
    /// Share of physical pages hidden from the logical capacity.
    pub overprovision_ratio: f64,
    /// Background GC runs on an idle LUN whose free-block share is below this.
    pub gc_background_threshold: f64,
    /// Foreground GC blocks writes on a LUN whose free-block share is below this.
    pub gc_foreground_threshold: f64,
}

impl NandConfig {
    /// Total LUNs.
    pub fn luns(&self) -> u64 {
        u64::from(self.channels) * u64::from(self.luns_per_channel)
    }

    /// Erase blocks per LUN.
    pub fn blocks_per_lun(&self) -> u64 {
        u64::from(self.planes_per_lun) * u64::from(self.blocks_per_plane)
    }

    /// Physical 4 KiB pages.
    pub fn physical_pages(&self) -> u64 {
        self.luns() * self.blocks_per_lun() * u64::from(self.pages_per_block)
    }

    /// Pages the host can address: physical minus over-provisioning.
    pub fn logical_pages(&self) -> u64 {
        let physical = self.physical_pages();
        let hidden = (physical as f64 * self.overprovision_ratio).ceil() as u64;
        physical.saturating_sub(hidden)
    }
}

/// The CXL link between host and device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    /// Added to every access (CXL.mem protocol and flight time).
    #[serde(deserialize_with = "deserialize_duration_ns")]
    pub latency_ns: u64,
}

/// A complete device configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// DRAM cache.
    pub cache: CacheConfig,
    /// Prefetcher.
    pub prefetch: PrefetchConfig,
    /// NAND back end.
    pub nand: NandConfig,
    /// CXL link.
    pub link: LinkConfig,
}

impl DeviceConfig {
    /// Applies `key=value` overrides in order (`cache.policy=s3fifo`,
    /// `cache.size_bytes=1GiB`). The value is read as TOML, else as a string.
    pub fn with_overrides<S: AsRef<str>>(&self, overrides: &[S]) -> Result<Self, LoadConfigError> {
        let mut table = self.to_table();
        for item in overrides {
            let item = item.as_ref();
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| LoadConfigError::MalformedOverride(item.to_string()))?;
            set_path(&mut table, key.trim(), parse_override_value(value.trim()))?;
        }
        Self::from_table(table)
    }

    /// The effective config as TOML text, loadable by [`DeviceConfig::from_toml_str`].
    pub fn to_toml_string(&self) -> String {
        // Serialising plain structs of numbers, bools and strings cannot fail.
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print config: {e}\n"))
    }

    pub(crate) fn to_table(&self) -> toml::Table {
        match toml::Table::try_from(self) {
            Ok(t) => t,
            // Unreachable for this type; an empty table makes the caller fail loudly.
            Err(_) => toml::Table::new(),
        }
    }

    pub(crate) fn from_table(table: toml::Table) -> Result<Self, LoadConfigError> {
        let cfg: DeviceConfig = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| {
                let key = e.path().to_string();
                LoadConfigError::BadValue {
                    key: if key == "." {
                        "config".to_string()
                    } else {
                        key
                    },
                    reason: e.inner().message().to_string(),
                }
            })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Logical capacity of the device in bytes (what addresses may reach).
    pub fn capacity_bytes(&self) -> u64 {
        self.nand.logical_pages() * PAGE_SIZE
    }

    /// Checks ranges and cross-field rules.
    pub fn validate(&self) -> Result<(), LoadConfigError> {
        let c = &self.cache;
        if c.size_bytes == 0 || c.size_bytes % PAGE_SIZE != 0 {
            return Err(bad(
                "cache.size_bytes",
                format!("{} is not a positive multiple of 4 KiB", c.size_bytes),
            ));
        }
        if c.ways > 0 && c.pages() % u64::from(c.ways) != 0 {
            return Err(bad(
                "cache.ways",
                format!("{} pages do not divide into {}-way sets", c.pages(), c.ways),
            ));
        }
        if c.pages() > u64::from(u32::MAX - 1) {
            return Err(bad("cache.size_bytes", "more than 2^32-2 pages"));
        }
        validate_write_log(c)?;
        let p = &c.params;
        for (key, v) in [
            ("cache.params.s3fifo_small_ratio", p.s3fifo_small_ratio),
            ("cache.params.twoq_kin_ratio", p.twoq_kin_ratio),
            ("cache.params.twoq_kout_ratio", p.twoq_kout_ratio),
            (
                "cache.params.lfru_privileged_ratio",
                p.lfru_privileged_ratio,
            ),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(bad(key, format!("{v} is not within 0..=1")));
            }
        }
        // A ghost costs 16 bytes: up to 4 per way.
        if !(0.0..=4.0).contains(&p.s3fifo_ghost_ratio) {
            return Err(bad(
                "cache.params.s3fifo_ghost_ratio",
                format!("{} is not within 0..=4", p.s3fifo_ghost_ratio),
            ));
        }
        // S3-FIFO's frequency counter saturates at 127.
        if p.s3fifo_move_to_main_threshold > 127 {
            return Err(bad(
                "cache.params.s3fifo_move_to_main_threshold",
                format!("{} is above 127", p.s3fifo_move_to_main_threshold),
            ));
        }
        if self.prefetch.stride_pages == 0 {
            return Err(bad("prefetch.stride_pages", "must be at least 1"));
        }
        let n = &self.nand;
        for (key, v) in [
            ("nand.channels", n.channels),
            ("nand.luns_per_channel", n.luns_per_channel),
            ("nand.planes_per_lun", n.planes_per_lun),
            ("nand.blocks_per_plane", n.blocks_per_plane),
            ("nand.pages_per_block", n.pages_per_block),
        ] {
            if v == 0 {
                return Err(bad(key, "must be at least 1"));
            }
        }
        if n.blocks_per_lun() < 4 {
            return Err(bad(
                "nand.blocks_per_plane",
                "each LUN needs at least 4 erase blocks (one open, two reserved for GC)",
            ));
        }
        if n.physical_pages() >= u64::from(u32::MAX) {
            return Err(bad("nand", "more than 2^32-1 physical pages (16 TiB)"));
        }
        if !(0.0..0.9).contains(&n.overprovision_ratio) {
            return Err(bad("nand.overprovision_ratio", "must be within 0..0.9"));
        }
        if n.enabled && n.overprovision_ratio * (n.blocks_per_lun() as f64) < 2.0 {
            return Err(bad(
                "nand.overprovision_ratio",
                "too small: each LUN needs at least 2 spare blocks for GC",
            ));
        }
        for (key, v) in [
            ("nand.gc_background_threshold", n.gc_background_threshold),
            ("nand.gc_foreground_threshold", n.gc_foreground_threshold),
        ] {
            if !(0.0..1.0).contains(&v) {
                return Err(bad(key, format!("{v} is not within 0..1")));
            }
        }
        if n.gc_foreground_threshold > n.gc_background_threshold {
            return Err(bad(
                "nand.gc_foreground_threshold",
                "must not exceed nand.gc_background_threshold",
            ));
        }
        if c.size_bytes > self.capacity_bytes() {
            return Err(bad(
                "cache.size_bytes",
                format!(
                    "cache ({}) is larger than the device ({})",
                    format_size(c.size_bytes),
                    format_size(self.capacity_bytes())
                ),
            ));
        }
        Ok(())
    }
}

/// The write log's size and cleaning thresholds (see [`CacheConfig::write_log_bytes`]).
fn validate_write_log(c: &CacheConfig) -> Result<(), LoadConfigError> {
    for (key, v) in [
        ("cache.write_log_clean_start", c.write_log_clean_start),
        ("cache.write_log_clean_stop", c.write_log_clean_stop),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(bad(key, format!("{v} is not within 0..=1")));
        }
    }
    if c.write_log_clean_start <= 0.0 {
        return Err(bad("cache.write_log_clean_start", "must be above 0"));
    }
    if c.write_log_clean_stop >= c.write_log_clean_start {
        return Err(bad(
            "cache.write_log_clean_stop",
            "must be below cache.write_log_clean_start",
        ));
    }
    let log = c.write_log_bytes;
    if log == 0 {
        return Ok(());
    }
    if log % 64 != 0 || log < PAGE_SIZE {
        return Err(bad(
            "cache.write_log_bytes",
            format!("{log} is not 0 or a multiple of 64 bytes of at least 4 KiB"),
        ));
    }
    if log >= c.size_bytes || c.page_cache_bytes() == 0 {
        return Err(bad(
            "cache.write_log_bytes",
            format!(
                "the log ({}) leaves no page cache in cache.size_bytes ({})",
                format_size(log),
                format_size(c.size_bytes)
            ),
        ));
    }
    Ok(())
}

fn parse_override_value(text: &str) -> toml::Value {
    // `key = VALUE` parses integers, floats, bools and quoted strings the TOML way;
    // anything else (`s3fifo`, `4GiB`) is taken as a bare string.
    match toml::from_str::<toml::Table>(&format!("v = {text}")) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(text.to_string())),
        Err(_) => toml::Value::String(text.to_string()),
    }
}

fn set_path(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), LoadConfigError> {
    let unknown = || LoadConfigError::UnknownKey {
        key: key.to_string(),
    };
    let mut parts = key.split('.').peekable();
    let mut current = table;
    while let Some(part) = parts.next() {
        let slot = current.get_mut(part).ok_or_else(unknown)?;
        if parts.peek().is_none() {
            if slot.is_table() {
                return Err(bad(key, "is a section, not a value"));
            }
            *slot = value;
            return Ok(());
        }
        current = slot.as_table_mut().ok_or_else(unknown)?;
    }
    Err(unknown())
}

pub(crate) fn merge_into(
    base: &mut toml::Table,
    over: toml::Table,
    prefix: &str,
) -> Result<(), LoadConfigError> {
    for (name, value) in over {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let slot = base
            .get_mut(&name)
            .ok_or_else(|| LoadConfigError::UnknownKey { key: key.clone() })?;
        match (slot, value) {
            (toml::Value::Table(b), toml::Value::Table(o)) => merge_into(b, o, &key)?,
            (toml::Value::Table(_), _) => return Err(bad(&key, "is a section, not a value")),
            (slot, value) => *slot = value,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_is_named() {
        let err = DeviceConfig::from_toml_str("[cache]\nsise_bytes = 4096\n").unwrap_err();
        assert_eq!(
            err,
            LoadConfigError::UnknownKey {
                key: "cache.sise_bytes".into()
            }
        );
        let err = DeviceConfig::default()
            .with_overrides(&["nand.read_nss=3"])
            .unwrap_err();
        assert_eq!(
            err,
            LoadConfigError::UnknownKey {
                key: "nand.read_nss".into()
            }
        );
    }

    #[test]
    fn overrides_parse_units_and_names() {
        let cfg = DeviceConfig::default()
            .with_overrides(&[
                "cache.policy=s3fifo",
                "cache.size_bytes=1GiB",
                "nand.read_ns=3us",
                "cache.hits_visible=false",
            ])
            .unwrap();
        assert_eq!(cfg.cache.policy, PolicyKind::S3Fifo);
        assert_eq!(cfg.cache.size_bytes, 1 << 30);
        assert_eq!(cfg.nand.read_ns, 3000);
        assert!(!cfg.cache.hits_visible);
    }

    #[test]
    fn bad_values_are_reported() {
        let err = DeviceConfig::default()
            .with_overrides(&["cache.policy=mru"])
            .unwrap_err();
        assert!(err.to_string().contains("mru"), "{err}");
        let err = DeviceConfig::default()
            .with_overrides(&["cache.size_bytes=1000"])
            .unwrap_err();
        assert!(err.to_string().contains("cache.size_bytes"), "{err}");
        let err = DeviceConfig::default()
            .with_overrides(&["nand.channels=0"])
            .unwrap_err();
        assert!(err.to_string().contains("nand.channels"), "{err}");
        let err = DeviceConfig::default()
            .with_overrides(&["cache"])
            .unwrap_err();
        assert!(matches!(err, LoadConfigError::MalformedOverride(_)));
    }

    #[test]
    fn file_starts_from_named_preset() {
        let cfg = DeviceConfig::from_toml_str(
            "preset = \"skybyte\"\n[cache]\npolicy = \"lru\"\nsize_bytes = \"64MiB\"\n",
        )
        .unwrap();
        assert_eq!(cfg.nand.read_ns, 3_000);
        assert_eq!(cfg.cache.size_bytes, 64 << 20);
    }
}
