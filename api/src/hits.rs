//! How the daemon sees the guests' hits on mapped device pages, which run
//! at memory speed without a trap: the two settings of its hit sources,
//! parsed here once for `cxlfsd` (`--access-sampling`, `--access-bits`,
//! `daemon.toml`) and `cxlfs run` (`[daemon]` of a spec, sweeps).
//!
//! * `access_sampling`: hinting faults, `off` or a rate of resident pages
//!   armed per second (`2000/s`, `"2000"` or the integer 2000);
//! * `access_bits`: accessed bits from the VMM's page walks, `on` or `off`
//!   (a TOML boolean too).

use serde::{Deserialize, Serialize};

/// A setting's value as written, whatever the format it came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingValue<'a> {
    /// A string (a command-line argument, a TOML string).
    Text(&'a str),
    /// A TOML integer.
    Integer(i64),
    /// A TOML boolean.
    Bool(bool),
    /// Anything else, as written (refused).
    Other(&'a str),
}

impl std::fmt::Display for SettingValue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettingValue::Text(t) => write!(f, "{t:?}"),
            SettingValue::Integer(n) => write!(f, "{n}"),
            SettingValue::Bool(b) => write!(f, "{b}"),
            SettingValue::Other(o) => f.write_str(o),
        }
    }
}

#[cfg(feature = "toml")]
impl<'a> From<&'a toml::Value> for SettingValue<'a> {
    fn from(v: &'a toml::Value) -> Self {
        match v {
            toml::Value::String(s) => SettingValue::Text(s),
            toml::Value::Integer(n) => SettingValue::Integer(*n),
            toml::Value::Boolean(b) => SettingValue::Bool(*b),
            other => SettingValue::Other(other.type_str()),
        }
    }
}

/// How often the daemon reads the accessed bits and the VMM re-arms them,
/// by default (ns): a page's hits reach the policy at most once a period.
pub const DEFAULT_ACCESS_BITS_PERIOD_NS: u64 = 10_000_000;
/// The shortest and the longest period (ns): below 1 ms the re-arms'
/// TLB refills would cost the guest more than the bits save it; above 10 s
/// a period spans whole phases.
pub const ACCESS_BITS_PERIOD_RANGE_NS: std::ops::RangeInclusive<u64> = 1_000_000..=10_000_000_000;

/// Why an `access_bits_period` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an accessed-bit period of {0} ns: give 1ms to 10s")]
pub struct AccessBitsPeriodError(pub u64);

/// Checks a period (ns, as a duration parser gave it).
pub fn access_bits_period(ns: u64) -> Result<u64, AccessBitsPeriodError> {
    if ACCESS_BITS_PERIOD_RANGE_NS.contains(&ns) {
        Ok(ns)
    } else {
        Err(AccessBitsPeriodError(ns))
    }
}

/// The highest access-sampling rate (pages armed per second).
pub const MAX_ACCESS_SAMPLING: u32 = 1_000_000;

/// Why an `access_sampling` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseAccessSamplingError {
    /// Neither `off`, a whole number nor `N/s`.
    #[error("{0}: give \"off\" or a whole number of pages per second (\"2000/s\", 2000)")]
    Form(String),
    /// A rate of 0 (write `off`).
    #[error("a rate of 0 pages per second: write \"off\"")]
    Zero,
    /// Above [`MAX_ACCESS_SAMPLING`].
    #[error("{0} pages per second: at most {MAX_ACCESS_SAMPLING}")]
    TooHigh(u64),
}

/// Pages armed per second; `None` for `off`.
pub fn access_sampling_rate(v: SettingValue<'_>) -> Result<Option<u32>, ParseAccessSamplingError> {
    let bad = || ParseAccessSamplingError::Form(v.to_string());
    let rate: u64 = match v {
        SettingValue::Text(s) if s.trim() == "off" => return Ok(None),
        SettingValue::Text(s) => {
            let s = s.trim();
            let digits = s.strip_suffix("/s").unwrap_or(s).trim();
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            digits.parse().map_err(|_| bad())?
        }
        SettingValue::Integer(n) => u64::try_from(n).map_err(|_| bad())?,
        SettingValue::Bool(_) | SettingValue::Other(_) => return Err(bad()),
    };
    match u32::try_from(rate) {
        Ok(0) => Err(ParseAccessSamplingError::Zero),
        Ok(r) if r <= MAX_ACCESS_SAMPLING => Ok(Some(r)),
        _ => Err(ParseAccessSamplingError::TooHigh(rate)),
    }
}

/// The rate as `cxlfsd` takes it and results write it: `off` or `N/s`.
pub fn access_sampling_text(rate: Option<u32>) -> String {
    rate.map_or_else(|| "off".to_string(), |r| format!("{r}/s"))
}

/// Whether the daemon reads accessed bits where the VMM offers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessBits {
    /// Read them (the default).
    #[default]
    On,
    /// Do not: hits are seen only through sampling, if that is on.
    Off,
}

impl AccessBits {
    /// `on` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessBits::On => "on",
            AccessBits::Off => "off",
        }
    }

    /// Whether bits are read.
    pub fn is_on(self) -> bool {
        self == AccessBits::On
    }
}

impl std::fmt::Display for AccessBits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an `access_bits` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}: give \"on\" or \"off\" (or true / false)")]
pub struct ParseAccessBitsError(pub String);

/// `on` / `off` (or a boolean).
pub fn access_bits(v: SettingValue<'_>) -> Result<AccessBits, ParseAccessBitsError> {
    match v {
        SettingValue::Text(s) if s.trim() == "on" => Ok(AccessBits::On),
        SettingValue::Text(s) if s.trim() == "off" => Ok(AccessBits::Off),
        SettingValue::Bool(true) => Ok(AccessBits::On),
        SettingValue::Bool(false) => Ok(AccessBits::Off),
        _ => Err(ParseAccessBitsError(v.to_string())),
    }
}

/// Which of a VM's mapped regions a hit lands in (the `region` label).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum RegionKind {
    /// Its DAX window (pool pages of shared files).
    #[default]
    File,
    /// Its CXL memory region (memory mode).
    Memory,
}

impl RegionKind {
    /// The `region` label: `file` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            RegionKind::File => "file",
            RegionKind::Memory => "memory",
        }
    }

    /// The accessed-bit area `cxlfsd --access-bits on` makes for this
    /// region of the VM whose socket is `socket`: `SOCKET.dax-abits`,
    /// `SOCKET.cxl-abits` (what QEMU is given: `run-vm.sh --dax-abits`,
    /// `--cxl-abits`).
    pub fn area_path(self, socket: &std::path::Path) -> std::path::PathBuf {
        let mut p = socket.as_os_str().to_os_string();
        p.push(match self {
            RegionKind::File => ".dax-abits",
            RegionKind::Memory => ".cxl-abits",
        });
        p.into()
    }
}

impl std::fmt::Display for RegionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The source a VM's hits reach the device through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HitSourceKind {
    /// Accessed bits from the VMM, read every period: every hit, at most
    /// once a page a period.
    AccessBits,
    /// Hinting faults on sampled resident pages: a sample of the hits.
    Sampling,
    /// None: hits are not seen (the policy sees misses only).
    None,
}

impl HitSourceKind {
    /// The name metrics and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            HitSourceKind::AccessBits => "access_bits",
            HitSourceKind::Sampling => "sampling",
            HitSourceKind::None => "none",
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use SettingValue::{Bool, Integer, Other, Text};

    #[test]
    fn sampling_rates_off_numbers_and_per_second_strings() {
        assert_eq!(access_sampling_rate(Text("off")), Ok(None));
        assert_eq!(access_sampling_rate(Integer(2000)), Ok(Some(2000)));
        assert_eq!(access_sampling_rate(Text("2000/s")), Ok(Some(2000)));
        assert_eq!(access_sampling_rate(Text("2000")), Ok(Some(2000)));
        assert_eq!(access_sampling_rate(Text(" 50 /s")), Ok(Some(50)));
        assert_eq!(access_sampling_text(Some(2000)), "2000/s");
        assert_eq!(access_sampling_text(None), "off");
    }

    #[test]
    fn other_sampling_values_are_refused_with_the_reason() {
        assert_eq!(
            access_sampling_rate(Integer(0)),
            Err(ParseAccessSamplingError::Zero)
        );
        assert_eq!(
            access_sampling_rate(Text("0/s")),
            Err(ParseAccessSamplingError::Zero)
        );
        assert_eq!(
            access_sampling_rate(Integer(2_000_000)),
            Err(ParseAccessSamplingError::TooHigh(2_000_000))
        );
        for bad in [
            Integer(-5),
            Text("on"),
            Text("2k/s"),
            Text("/s"),
            Text("-1/s"),
            Bool(true),
            Other("1.5"),
        ] {
            assert!(
                matches!(
                    access_sampling_rate(bad),
                    Err(ParseAccessSamplingError::Form(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn access_bits_on_off_and_booleans() {
        assert_eq!(access_bits(Text("on")), Ok(AccessBits::On));
        assert_eq!(access_bits(Text(" off")), Ok(AccessBits::Off));
        assert_eq!(access_bits(Bool(false)), Ok(AccessBits::Off));
        let e = access_bits(Text("yes")).unwrap_err();
        assert!(e.to_string().contains("\"yes\""), "{e}");
        assert!(access_bits(Integer(1)).is_err());
        assert_eq!(AccessBits::default(), AccessBits::On);
        assert_eq!(HitSourceKind::AccessBits.as_str(), "access_bits");
        let socket = std::path::Path::new("w/vm0.sock");
        assert_eq!(
            RegionKind::File.area_path(socket),
            std::path::Path::new("w/vm0.sock.dax-abits")
        );
        assert_eq!(
            RegionKind::Memory.area_path(socket),
            std::path::Path::new("w/vm0.sock.cxl-abits")
        );
        assert_eq!(access_bits_period(10_000_000), Ok(10_000_000));
        assert!(access_bits_period(999_999).is_err());
        assert!(access_bits_period(10_000_000_001).is_err());
    }
}
