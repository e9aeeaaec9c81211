//! Settings of the DAX window's residency plane, parsed here once for
//! `cxlfsd` (`--dax-eviction-backlog`, `daemon.toml`) and `cxlfs run`
//! (`[daemon]` of a spec, sweeps).
//!
//! * `dax_eviction_backlog`: how many pages the device evicted may wait
//!   for their invalidation in the guests' windows before a miss's reply
//!   waits for them: `auto` (1/32 of the device cache, within 32..=512
//!   pages), `off` (misses never wait) or a number of pages (`0`: a miss
//!   waits until every eviction before it is written).

use crate::hits::SettingValue;

/// The most pages a `dax_eviction_backlog` may name (4 GiB of 4 KiB pages).
pub const MAX_EVICTION_BACKLOG_PAGES: u64 = 1 << 20;

/// The bound on evicted pages awaiting invalidation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionBacklogSetting {
    /// 1/32 of the device cache, within 32..=512 pages (the default).
    #[default]
    Auto,
    /// No bound: misses never wait for evictions.
    Off,
    /// At most this many pages (0: every eviction is written first).
    Pages(u64),
}

impl EvictionBacklogSetting {
    /// The bound in pages for a device cache of `cache_pages` (`None`: no
    /// bound).
    pub fn pages(self, cache_pages: u64) -> Option<u64> {
        match self {
            EvictionBacklogSetting::Auto => Some((cache_pages / 32).clamp(32, 512)),
            EvictionBacklogSetting::Off => None,
            EvictionBacklogSetting::Pages(n) => Some(n),
        }
    }
}

impl std::fmt::Display for EvictionBacklogSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvictionBacklogSetting::Auto => f.write_str("auto"),
            EvictionBacklogSetting::Off => f.write_str("off"),
            EvictionBacklogSetting::Pages(n) => write!(f, "{n}"),
        }
    }
}

/// Why a `dax_eviction_backlog` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("dax_eviction_backlog {0}: give auto, off or a number of pages, 0 to {MAX_EVICTION_BACKLOG_PAGES}")]
pub struct EvictionBacklogError(pub String);

/// Parses a `dax_eviction_backlog` (a string or a TOML integer).
pub fn eviction_backlog(
    v: SettingValue<'_>,
) -> Result<EvictionBacklogSetting, EvictionBacklogError> {
    let err = || EvictionBacklogError(v.to_string());
    let n = match v {
        SettingValue::Text(t) => match t.trim() {
            "auto" => return Ok(EvictionBacklogSetting::Auto),
            "off" => return Ok(EvictionBacklogSetting::Off),
            t => t.parse::<u64>().map_err(|_| err())?,
        },
        SettingValue::Integer(n) => u64::try_from(n).map_err(|_| err())?,
        SettingValue::Bool(_) | SettingValue::Other(_) => return Err(err()),
    };
    if n > MAX_EVICTION_BACKLOG_PAGES {
        return Err(err());
    }
    Ok(EvictionBacklogSetting::Pages(n))
}

impl std::str::FromStr for EvictionBacklogSetting {
    type Err = EvictionBacklogError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        eviction_backlog(SettingValue::Text(s))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_words_and_pages_and_refuses_the_rest() {
        let t = |s| eviction_backlog(SettingValue::Text(s));
        assert_eq!(t("auto"), Ok(EvictionBacklogSetting::Auto));
        assert_eq!(t("off"), Ok(EvictionBacklogSetting::Off));
        assert_eq!(t("0"), Ok(EvictionBacklogSetting::Pages(0)));
        assert_eq!(t("64"), Ok(EvictionBacklogSetting::Pages(64)));
        assert_eq!(
            eviction_backlog(SettingValue::Integer(8)),
            Ok(EvictionBacklogSetting::Pages(8))
        );
        for bad in ["", "-1", "1.5", "many", "1048577"] {
            assert!(t(bad).is_err(), "{bad:?} accepted");
        }
        assert!(eviction_backlog(SettingValue::Integer(-1)).is_err());
        assert!(eviction_backlog(SettingValue::Bool(true)).is_err());
        let e = t("x").unwrap_err().to_string();
        assert!(e.contains("auto, off or a number of pages"), "{e}");
        for v in [
            EvictionBacklogSetting::Auto,
            EvictionBacklogSetting::Off,
            EvictionBacklogSetting::Pages(3),
        ] {
            assert_eq!(v.to_string().parse::<EvictionBacklogSetting>(), Ok(v));
        }
    }

    #[test]
    fn auto_is_a_32nd_of_the_cache_within_32_to_512_pages() {
        assert_eq!(EvictionBacklogSetting::Auto.pages(256), Some(32));
        assert_eq!(EvictionBacklogSetting::Auto.pages(4096), Some(128));
        assert_eq!(EvictionBacklogSetting::Auto.pages(1 << 20), Some(512));
        assert_eq!(EvictionBacklogSetting::Off.pages(4096), None);
        assert_eq!(EvictionBacklogSetting::Pages(0).pages(4096), Some(0));
    }
}
