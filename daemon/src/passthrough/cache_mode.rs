//! [`CacheMode`]: how much the guest's caches may keep, and the entry and
//! attribute timeouts and open flags that follow from it.

use crate::abi;
use std::time::Duration;

/// How much the guest's own caches may keep (as in virtiofsd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Every read and write reaches the daemon (FOPEN_DIRECT_IO, no attr caching).
    Never,
    /// Guest page cache, invalidated when the file changes; 1 s attr timeout.
    #[default]
    Auto,
    /// Guest page cache kept across opens (FOPEN_KEEP_CACHE); long timeouts.
    Always,
}

impl std::str::FromStr for CacheMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "never" | "none" => Ok(CacheMode::Never),
            "auto" => Ok(CacheMode::Auto),
            "always" => Ok(CacheMode::Always),
            other => Err(format!(
                "cache mode must be never|auto|always, got `{other}`"
            )),
        }
    }
}

impl CacheMode {
    /// Entry and attribute timeout.
    pub fn timeout(self) -> Duration {
        match self {
            CacheMode::Never => Duration::ZERO,
            CacheMode::Auto => Duration::from_secs(1),
            CacheMode::Always => Duration::from_secs(86400),
        }
    }

    /// `fuse_open_out.open_flags` for regular files.
    pub fn file_open_flags(self) -> u32 {
        match self {
            CacheMode::Never => abi::fopen::DIRECT_IO,
            CacheMode::Auto => 0,
            CacheMode::Always => abi::fopen::KEEP_CACHE,
        }
    }

    /// `fuse_open_out.open_flags` for directories.
    pub fn dir_open_flags(self) -> u32 {
        match self {
            CacheMode::Always => abi::fopen::CACHE_DIR,
            _ => 0,
        }
    }
}
