//! Human-friendly sizes (`4GiB`, `512KiB`, `4096`) and durations (`40us`, `2ms`, `50`).
//!
//! Config files and `--set` overrides accept either a plain integer (bytes,
//! nanoseconds) or a string with a unit; the effective config always prints
//! plain integers so it can be fed back unchanged.

use serde::de::{self, Deserializer, Visitor};
use std::fmt;

/// Why a size or duration string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {what} `{input}`: {reason}")]
pub struct ParseQuantityError {
    /// "size" or "duration".
    pub what: &'static str,
    /// The text that was given.
    pub input: String,
    /// What was wrong with it.
    pub reason: String,
}

const SIZE_UNITS: &[(&str, u64)] = &[
    ("b", 1),
    ("k", 1 << 10),
    ("kb", 1000),
    ("kib", 1 << 10),
    ("m", 1 << 20),
    ("mb", 1_000_000),
    ("mib", 1 << 20),
    ("g", 1 << 30),
    ("gb", 1_000_000_000),
    ("gib", 1 << 30),
    ("t", 1 << 40),
    ("tb", 1_000_000_000_000),
    ("tib", 1 << 40),
];

const DURATION_UNITS: &[(&str, u64)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
];

fn parse_with_units(
    what: &'static str,
    input: &str,
    units: &[(&str, u64)],
) -> Result<u64, ParseQuantityError> {
    let err = |reason: &str| ParseQuantityError {
        what,
        input: input.to_string(),
        reason: reason.to_string(),
    };
    let text = input.trim().replace('_', "");
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(err("expected a number"));
    }
    let unit_lower = unit.trim().to_lowercase();
    let multiplier = if unit_lower.is_empty() {
        1
    } else {
        units
            .iter()
            .find(|(name, _)| *name == unit_lower)
            .map(|(_, m)| *m)
            .ok_or_else(|| err(&format!("unknown unit `{}`", unit.trim())))?
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole
            .checked_mul(multiplier)
            .ok_or_else(|| err("value too large"));
    }
    let value: f64 = number.parse().map_err(|_| err("expected a number"))?;
    let scaled = value * multiplier as f64;
    if !scaled.is_finite() || scaled < 0.0 || scaled > u64::MAX as f64 {
        return Err(err("value out of range"));
    }
    Ok(scaled.round() as u64)
}

/// Parses a byte size: `4096`, `64KiB`, `1.5GiB`, `4GB` (decimal), `4G` (binary).
pub fn parse_size(input: &str) -> Result<u64, ParseQuantityError> {
    parse_with_units("size", input, SIZE_UNITS)
}

/// Parses a duration in nanoseconds: `50`, `50ns`, `40us`, `2ms`, `1s`.
pub fn parse_duration_ns(input: &str) -> Result<u64, ParseQuantityError> {
    parse_with_units("duration", input, DURATION_UNITS)
}

/// Formats a byte count with a binary unit when it divides evenly (`4GiB`), else bytes.
pub fn format_size(bytes: u64) -> String {
    for (unit, m) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= m && bytes % m == 0 {
            return format!("{}{unit}", bytes / m);
        }
    }
    format!("{bytes}B")
}

struct QuantityVisitor {
    what: &'static str,
    parse: fn(&str) -> Result<u64, ParseQuantityError>,
}

impl Visitor<'_> for QuantityVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a non-negative integer or a {} string with a unit",
            self.what
        )
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(format!("{} must not be negative", self.what)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        (self.parse)(v).map_err(E::custom)
    }
}

/// serde helper: a byte size given as an integer or a string such as `"4GiB"`.
pub fn deserialize_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(QuantityVisitor {
        what: "size",
        parse: parse_size,
    })
}

/// serde helper: nanoseconds given as an integer or a string such as `"40us"`.
pub fn deserialize_duration_ns<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(QuantityVisitor {
        what: "duration",
        parse: parse_duration_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4GB").unwrap(), 4_000_000_000);
        assert_eq!(parse_size("16_777_216").unwrap(), 1 << 24);
        assert!(parse_size("4 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("GiB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("40us").unwrap(), 40_000);
        assert_eq!(parse_duration_ns("2ms").unwrap(), 2_000_000);
        assert_eq!(parse_duration_ns("50").unwrap(), 50);
        assert_eq!(parse_duration_ns("0.5us").unwrap(), 500);
        assert!(parse_duration_ns("5 fortnights").is_err());
    }

    #[test]
    fn format() {
        assert_eq!(format_size(4 << 30), "4GiB");
        assert_eq!(format_size(4097), "4097B");
    }
}
