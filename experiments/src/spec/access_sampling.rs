//! `[daemon] access_sampling`: how many resident device-cache pages per
//! second `cxlfsd --access-sampling` arms, so that the guest's hits at
//! memory speed reach the eviction policy. `"off"` (the default), a whole
//! number, or `"N/s"`.

/// Why an `access_sampling` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseAccessSamplingError {
    /// Neither `off`, a whole number nor `N/s`.
    #[error("`{0}`: \"off\", a whole number of pages per second, or \"N/s\" (\"2000/s\")")]
    Form(String),
    /// A rate of 0 (write `off`).
    #[error("a rate of 0 pages per second: write \"off\"")]
    Zero,
}

/// Pages armed per second; `None` for `off`.
pub fn access_sampling_rate(v: &toml::Value) -> Result<Option<u64>, ParseAccessSamplingError> {
    let bad = || ParseAccessSamplingError::Form(super::value_text(v));
    let rate = match v {
        toml::Value::String(s) if s.trim() == "off" => return Ok(None),
        toml::Value::String(s) => {
            let digits = s.trim().strip_suffix("/s").ok_or_else(bad)?.trim();
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            digits.parse::<u64>().map_err(|_| bad())?
        }
        toml::Value::Integer(n) => u64::try_from(*n).map_err(|_| bad())?,
        _ => return Err(bad()),
    };
    if rate == 0 {
        return Err(ParseAccessSamplingError::Zero);
    }
    Ok(Some(rate))
}

/// The value as the results and `cxlfsd` write it: `off` or `N/s`.
pub fn access_sampling_text(rate: Option<u64>) -> String {
    rate.map_or_else(|| "off".to_string(), |r| format!("{r}/s"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rate(s: &str) -> Result<Option<u64>, ParseAccessSamplingError> {
        let t: toml::Table = toml::from_str(&format!("v = {s}")).unwrap();
        access_sampling_rate(&t["v"])
    }

    #[test]
    fn off_integers_and_per_second_strings() {
        assert_eq!(rate("\"off\""), Ok(None));
        assert_eq!(rate("2000"), Ok(Some(2000)));
        assert_eq!(rate("\"2000/s\""), Ok(Some(2000)));
        assert_eq!(rate("\" 50 /s\""), Ok(Some(50)));
        assert_eq!(access_sampling_text(Some(2000)), "2000/s");
        assert_eq!(access_sampling_text(None), "off");
    }

    #[test]
    fn other_values_are_refused() {
        assert_eq!(rate("0"), Err(ParseAccessSamplingError::Zero));
        assert_eq!(rate("\"0/s\""), Err(ParseAccessSamplingError::Zero));
        for bad in [
            "-5", "\"on\"", "\"2000\"", "\"2k/s\"", "\"/s\"", "1.5", "true", "\"-1/s\"",
        ] {
            assert!(
                matches!(rate(bad), Err(ParseAccessSamplingError::Form(_))),
                "{bad}: {:?}",
                rate(bad)
            );
        }
    }
}
