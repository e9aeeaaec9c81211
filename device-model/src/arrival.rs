//! When accesses arrive at the device ([`Arrival`]): a trace's own
//! timestamps, a closed loop, or a fixed rate. Its own module because both
//! the trace format (which records a trace's mode in its header) and the
//! replay driver use it.

use crate::units::parse_duration_ns;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// When each access arrives at the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Arrival {
    /// Each access's own `time_ns` (non-decreasing).
    Trace,
    /// Closed loop, one outstanding access: issued at the previous completion plus `think_ns`.
    Closed {
        /// Gap between a completion and the next issue.
        think_ns: u64,
    },
    /// Open loop at a fixed rate: access `i` arrives at `i × interval_ns`.
    Fixed {
        /// Gap between consecutive arrivals.
        interval_ns: u64,
    },
}

impl fmt::Display for Arrival {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arrival::Trace => f.write_str("trace"),
            Arrival::Closed { think_ns: 0 } => f.write_str("closed"),
            Arrival::Closed { think_ns } => write!(f, "closed:{think_ns}"),
            Arrival::Fixed { interval_ns } => write!(f, "fixed:{interval_ns}"),
        }
    }
}

/// Why an arrival mode string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad arrival mode `{input}`: {reason} (expected trace, closed, closed:THINK or fixed:INTERVAL)"
)]
pub struct ParseArrivalError {
    /// The text given.
    pub input: String,
    /// What was wrong.
    pub reason: String,
}

impl FromStr for Arrival {
    type Err = ParseArrivalError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| ParseArrivalError {
            input: s.to_string(),
            reason,
        };
        let text = s.trim();
        let (name, arg) = match text.split_once(':') {
            Some((n, a)) => (n.trim(), Some(a.trim())),
            None => (text, None),
        };
        let duration = |arg: &str| parse_duration_ns(arg).map_err(|e| err(e.reason));
        match (name.to_ascii_lowercase().as_str(), arg) {
            ("trace", None) => Ok(Arrival::Trace),
            ("closed", None) => Ok(Arrival::Closed { think_ns: 0 }),
            ("closed", Some(arg)) => Ok(Arrival::Closed {
                think_ns: duration(arg)?,
            }),
            ("fixed", Some(arg)) => Ok(Arrival::Fixed {
                interval_ns: duration(arg)?,
            }),
            ("fixed", None) => Err(err("fixed needs an interval, e.g. fixed:100ns".to_string())),
            ("trace", Some(_)) => Err(err("trace takes no argument".to_string())),
            _ => Err(err(format!("unknown mode `{name}`"))),
        }
    }
}
