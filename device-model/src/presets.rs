//! Named device configurations carrying the parameters of the seed documents
//! (see `docs/device-model.md` for where each number comes from).

use crate::config::{
    merge_into, CacheConfig, DeviceConfig, LinkConfig, LoadConfigError, NandConfig, PolicyKind,
    PolicyParams, PrefetchConfig,
};
use crate::PAGE_SIZE;

/// Names accepted by [`preset`].
pub const PRESETS: [&str; 4] = ["cylon", "cmm-h", "skybyte", "femu"];

/// SkyByte's log cleaning thresholds: compaction starts at 51 % full and
/// stops at 1 % (the default of every preset; the log itself is off).
pub const WRITE_LOG_CLEAN_START: f64 = 0.51;
/// See [`WRITE_LOG_CLEAN_START`].
pub const WRITE_LOG_CLEAN_STOP: f64 = 0.01;

/// Looks a preset up by name.
pub fn preset(name: &str) -> Result<DeviceConfig, LoadConfigError> {
    match name.trim().to_ascii_lowercase().as_str() {
        "cylon" => Ok(cylon()),
        "cmm-h" | "cmmh" => Ok(cmm_h()),
        "skybyte" => Ok(skybyte()),
        "femu" => Ok(femu()),
        _ => Err(LoadConfigError::UnknownPreset {
            name: name.to_string(),
            known: PRESETS.join(", "),
        }),
    }
}

/// The default device is Cylon's.
impl Default for DeviceConfig {
    fn default() -> Self {
        cylon()
    }
}

// Here rather than in `config`: a config file starts from a preset.
impl DeviceConfig {
    /// Parses a TOML config. A top-level `preset = "NAME"` picks the base
    /// (default: `cylon`); every other key must exist in it.
    pub fn from_toml_str(text: &str) -> Result<Self, LoadConfigError> {
        let mut file: toml::Table =
            toml::from_str(text).map_err(|e| LoadConfigError::Syntax(e.message().to_string()))?;
        let base = match file.remove("preset") {
            None => DeviceConfig::default(),
            Some(toml::Value::String(name)) => preset(&name)?,
            Some(other) => {
                return Err(crate::config::bad(
                    "preset",
                    format!("expected a name, got {other}"),
                ))
            }
        };
        let mut merged = base.to_table();
        merge_into(&mut merged, file, "")?;
        Self::from_table(merged)
    }
}

/// A cache of `1/divisor` of the device's logical capacity, rounded down to
/// whole `ways`-page sets.
fn cache_fraction(nand: &NandConfig, divisor: u64, ways: u32) -> u64 {
    let set = u64::from(ways.max(1));
    let pages = nand.logical_pages() / divisor / set * set;
    pages * PAGE_SIZE
}

/// Cylon (built on FEMU): 8 ch x 8 LUN, tR 40 us, tProg 200 us, tBERS 2 ms,
/// cache = capacity / 20, hits invisible to the emulator, S3-FIFO.
pub fn cylon() -> DeviceConfig {
    let nand = NandConfig {
        enabled: true,
        channels: 8,
        luns_per_channel: 8,
        planes_per_lun: 2,
        blocks_per_plane: 768,
        pages_per_block: 256,
        read_ns: 40_000,
        program_ns: 200_000,
        erase_ns: 2_000_000,
        channel_xfer_ns: 0,
        overprovision_ratio: 0.07,
        gc_background_threshold: 0.05,
        gc_foreground_threshold: 0.01,
    };
    DeviceConfig {
        cache: CacheConfig {
            size_bytes: cache_fraction(&nand, 20, 1),
            ways: 0,
            policy: PolicyKind::S3Fifo,
            hit_latency_ns: 50,
            hits_visible: false,
            params: PolicyParams::default(),
            write_log_bytes: 0,
            write_log_clean_start: WRITE_LOG_CLEAN_START,
            write_log_clean_stop: WRITE_LOG_CLEAN_STOP,
        },
        prefetch: PrefetchConfig {
            degree: 0,
            stride_pages: 1,
        },
        nand,
        link: LinkConfig { latency_ns: 150 },
    }
}

/// Samsung CMM-H: 48 GiB DRAM cache, 8-way LRU, write-allocate / write-back,
/// in front of a 1 TiB NVMe SSD (MLC-class timings from SkyByte's table).
pub fn cmm_h() -> DeviceConfig {
    DeviceConfig {
        cache: CacheConfig {
            size_bytes: 48 << 30,
            ways: 8,
            policy: PolicyKind::Lru,
            hit_latency_ns: 100,
            hits_visible: true,
            params: PolicyParams::default(),
            write_log_bytes: 0,
            write_log_clean_start: WRITE_LOG_CLEAN_START,
            write_log_clean_stop: WRITE_LOG_CLEAN_STOP,
        },
        prefetch: PrefetchConfig {
            degree: 0,
            stride_pages: 1,
        },
        nand: NandConfig {
            enabled: true,
            channels: 8,
            luns_per_channel: 8,
            planes_per_lun: 2,
            blocks_per_plane: 2048,
            pages_per_block: 1024,
            read_ns: 50_000,
            program_ns: 600_000,
            erase_ns: 3_000_000,
            channel_xfer_ns: 3_000,
            overprovision_ratio: 0.07,
            gc_background_threshold: 0.05,
            gc_foreground_threshold: 0.01,
        },
        link: LinkConfig { latency_ns: 200 },
    }
}

/// SkyByte's CXL-SSD (Table II): 16 ch x 64 dies, 1 plane, 128 blocks of 256
/// pages (128 GiB), Z-NAND tR 3 us / tProg 100 us / tBERS 1 ms, 512 MiB data
/// cache, 40 ns CXL protocol latency.
pub fn skybyte() -> DeviceConfig {
    DeviceConfig {
        cache: CacheConfig {
            size_bytes: 512 << 20,
            ways: 0,
            policy: PolicyKind::Lru,
            hit_latency_ns: 50,
            hits_visible: true,
            params: PolicyParams::default(),
            write_log_bytes: 0,
            write_log_clean_start: WRITE_LOG_CLEAN_START,
            write_log_clean_stop: WRITE_LOG_CLEAN_STOP,
        },
        prefetch: PrefetchConfig {
            degree: 0,
            stride_pages: 1,
        },
        nand: NandConfig {
            enabled: true,
            channels: 16,
            luns_per_channel: 64,
            planes_per_lun: 1,
            blocks_per_plane: 128,
            pages_per_block: 256,
            read_ns: 3_000,
            program_ns: 100_000,
            erase_ns: 1_000_000,
            channel_xfer_ns: 250,
            overprovision_ratio: 0.07,
            gc_background_threshold: 0.05,
            gc_foreground_threshold: 0.01,
        },
        link: LinkConfig { latency_ns: 40 },
    }
}

/// FEMU's default black-box SSD: 8 ch x 8 LUN, 1 plane, 256 blocks of 256
/// pages (16 GiB), tR 40 us, tProg 200 us, tBERS 2 ms;
/// a FIFO cache of capacity / 20 as Cylon puts in front of it.
pub fn femu() -> DeviceConfig {
    let nand = NandConfig {
        enabled: true,
        channels: 8,
        luns_per_channel: 8,
        planes_per_lun: 1,
        blocks_per_plane: 256,
        pages_per_block: 256,
        read_ns: 40_000,
        program_ns: 200_000,
        erase_ns: 2_000_000,
        channel_xfer_ns: 0,
        overprovision_ratio: 0.07,
        gc_background_threshold: 0.05,
        gc_foreground_threshold: 0.01,
    };
    DeviceConfig {
        cache: CacheConfig {
            size_bytes: cache_fraction(&nand, 20, 1),
            ways: 0,
            policy: PolicyKind::Fifo,
            hit_latency_ns: 50,
            hits_visible: true,
            params: PolicyParams::default(),
            write_log_bytes: 0,
            write_log_clean_start: WRITE_LOG_CLEAN_START,
            write_log_clean_stop: WRITE_LOG_CLEAN_STOP,
        },
        prefetch: PrefetchConfig {
            degree: 0,
            stride_pages: 1,
        },
        nand,
        link: LinkConfig { latency_ns: 40 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_config_loads_back() {
        for name in PRESETS {
            let cfg = preset(name).unwrap();
            let text = cfg.to_toml_string();
            assert_eq!(DeviceConfig::from_toml_str(&text).unwrap(), cfg, "{name}");
        }
    }

    #[test]
    fn presets_validate() {
        for name in PRESETS {
            preset(name).unwrap().validate().unwrap();
        }
        assert!(preset("nope").is_err());
    }

    #[test]
    fn cylon_cache_is_a_twentieth() {
        let c = cylon();
        let ratio = c.capacity_bytes() as f64 / c.cache.size_bytes as f64;
        assert!((ratio - 20.0).abs() < 0.01, "{ratio}");
        assert_eq!(c.nand.luns(), 64);
    }
}
