//! The cache sizes of a curve: `1MiB,64MiB,1GiB` or `1MiB..4GiB:64`.

use crate::units::{parse_size, ParseQuantityError};
use crate::PAGE_SIZE;

/// Why a size list could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseSizesError {
    /// A size that is not one.
    #[error(transparent)]
    Size(#[from] ParseQuantityError),
    /// A range without `:POINTS`, or a bad count.
    #[error("`{0}`: a range is FROM..TO:POINTS, with at least 2 points")]
    Range(String),
    /// A range whose end is below its start.
    #[error("`{0}`: the range ends below its start")]
    Backwards(String),
    /// A size under one page.
    #[error("{0} bytes is less than a 4 KiB page")]
    TooSmall(u64),
    /// Nothing given.
    #[error("no sizes given")]
    Empty,
}

/// Sizes in bytes, ascending, each rounded down to whole `unit`-byte
/// steps (a page, or a set of pages), duplicates dropped.
pub fn parse_sizes(input: &str, unit: u64) -> Result<Vec<u64>, ParseSizesError> {
    let unit = unit.max(PAGE_SIZE);
    let mut sizes = Vec::new();
    for item in input.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match item.split_once("..") {
            Some((from, rest)) => {
                let (to, points) = rest
                    .split_once(':')
                    .ok_or_else(|| ParseSizesError::Range(item.to_string()))?;
                let points: u32 = points
                    .trim()
                    .parse()
                    .ok()
                    .filter(|&n| n >= 2)
                    .ok_or_else(|| ParseSizesError::Range(item.to_string()))?;
                let (a, b) = (parse_size(from.trim())?, parse_size(to.trim())?);
                if b < a {
                    return Err(ParseSizesError::Backwards(item.to_string()));
                }
                sizes.extend(log_spaced(a, b, points));
            }
            None => sizes.push(parse_size(item)?),
        }
    }
    if sizes.is_empty() {
        return Err(ParseSizesError::Empty);
    }
    let mut out = Vec::with_capacity(sizes.len());
    for s in sizes {
        if s < unit {
            return Err(ParseSizesError::TooSmall(s));
        }
        out.push(s / unit * unit);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// `points` sizes from `a` to `b`, evenly spaced in log scale (both ends included).
fn log_spaced(a: u64, b: u64, points: u32) -> Vec<u64> {
    let (la, lb) = ((a.max(1) as f64).ln(), (b.max(1) as f64).ln());
    (0..points)
        .map(|i| match i {
            0 => a,
            i if i + 1 == points => b,
            i => (la + (lb - la) * f64::from(i) / f64::from(points - 1)).exp() as u64,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges() {
        assert_eq!(
            parse_sizes("8KiB, 4096,1MiB", PAGE_SIZE).unwrap(),
            vec![4096, 8192, 1 << 20]
        );
        let r = parse_sizes("1MiB..4GiB:64", PAGE_SIZE).unwrap();
        assert_eq!(r.len(), 64);
        assert_eq!((r[0], r[63]), (1 << 20, 4 << 30));
        assert!(r.iter().all(|s| s % PAGE_SIZE == 0));
        let sets = parse_sizes("1MiB..2MiB:3", 8 * PAGE_SIZE).unwrap();
        assert!(sets.iter().all(|s| s % (8 * PAGE_SIZE) == 0));
    }

    #[test]
    fn bad_lists_say_why() {
        for bad in ["", "1MiB..2MiB", "1MiB..2MiB:1", "2MiB..1MiB:4", "100", "x"] {
            assert!(parse_sizes(bad, PAGE_SIZE).is_err(), "{bad}");
        }
    }
}
