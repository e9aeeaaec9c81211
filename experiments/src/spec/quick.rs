//! `--quick`: the `[quick]` table ([`QuickSpec`](super::types::QuickSpec)) and how it shrinks one
//! spec — file sizes, fio sizes and the device cache divided, fio runtimes
//! capped. Its `set` keys are applied to the tree in `sweep.rs`.

use super::tree::size_value;
use super::types::Spec;
use cxlfs_device_model::units::{parse_duration_ns, parse_size};

/// fio options holding a size that `--quick` divides.
const QUICK_SIZE_KEYS: [&str; 4] = ["size", "filesize", "io_size", "io_limit"];
/// fio options holding a duration that `--quick` caps.
const QUICK_TIME_KEYS: [&str; 2] = ["runtime", "ramp_time"];

/// Shrinks one spec for `--quick` (see [`QuickSpec`](super::types::QuickSpec)); on error the failing key.
pub(super) fn apply_quick(spec: &mut Spec) -> Result<(), (String, String)> {
    let q = spec.quick.clone();
    let div = u64::from(q.size_divisor.max(1));
    let min = parse_size(&q.min_size).map_err(|e| ("quick.min_size".to_string(), e.to_string()))?;
    let max_ns = parse_duration_ns(&q.max_runtime)
        .map_err(|e| ("quick.max_runtime".to_string(), e.to_string()))?;
    let shrink = |bytes: u64| -> u64 {
        let s = (bytes / div).max(min.min(bytes));
        // Whole 4 KiB pages (fio and the device work in pages).
        if s >= 4096 {
            s / 4096 * 4096
        } else {
            s
        }
    };
    for (i, f) in spec.files.iter_mut().enumerate() {
        let b = size_value(&f.size).map_err(|e| (format!("files.{i}.size"), e))?;
        f.size = toml::Value::Integer(shrink(b) as i64);
    }
    let fix_fio = |t: &mut toml::Table, at: &str| -> Result<(), (String, String)> {
        for key in QUICK_SIZE_KEYS {
            if let Some(v) = t.get_mut(key) {
                // Percentages and ranges are left to fio.
                if let Some(b) = fio_size(v) {
                    *v = toml::Value::Integer(shrink(b) as i64);
                } else if !matches!(v, toml::Value::String(s) if s.contains(['%', '-', ':'])) {
                    return Err((format!("{at}.{key}"), format!("cannot read {v} as a size")));
                }
            }
        }
        for key in QUICK_TIME_KEYS {
            if let Some(v) = t.get_mut(key) {
                let ns = fio_duration_ns(v).ok_or_else(|| {
                    (
                        format!("{at}.{key}"),
                        format!("cannot read {v} as a duration"),
                    )
                })?;
                if ns > max_ns {
                    *v = toml::Value::String(format!("{}ms", max_ns / 1_000_000));
                }
            }
        }
        Ok(())
    };
    fix_fio(&mut spec.fio, "fio")?;
    for (i, p) in spec.phases.iter_mut().enumerate() {
        fix_fio(&mut p.fio, &format!("phases.{i}.fio"))?;
        for (j, job) in p.jobs.iter_mut().enumerate() {
            fix_fio(job, &format!("phases.{i}.jobs.{j}"))?;
        }
    }
    // The device cache shrinks with the files, so working set / cache stays.
    if let Some(toml::Value::Table(cache)) = spec.daemon.device.get_mut("cache") {
        if let Some(v) = cache.get_mut("size_bytes") {
            let b = size_value(v).map_err(|e| ("daemon.device.cache.size_bytes".to_string(), e))?;
            *v = toml::Value::Integer(shrink(b) as i64);
        }
    }
    Ok(())
}

/// A fio size option as bytes (`16m`, `4k`, `1g`, `512`); `None` if it is
/// not a plain size.
fn fio_size(v: &toml::Value) -> Option<u64> {
    match v {
        toml::Value::Integer(n) if *n >= 0 => Some(*n as u64),
        toml::Value::String(s) => parse_size(s).ok(),
        _ => None,
    }
}

/// A fio time option in ns: a bare number is seconds (fio's default unit);
/// `ms`, `us`, `s`, `m` (minutes) and `h` suffixes.
fn fio_duration_ns(v: &toml::Value) -> Option<u64> {
    let s = match v {
        toml::Value::Integer(n) if *n >= 0 => return Some(*n as u64 * 1_000_000_000),
        toml::Value::String(s) => s.trim().to_ascii_lowercase(),
        _ => return None,
    };
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match unit.trim() {
        "" | "s" | "sec" => 1e9,
        "ms" | "msec" => 1e6,
        "us" | "usec" => 1e3,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        _ => return None,
    };
    Some((n * mult) as u64)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::spec::load_str;
    use crate::spec::test_specs::SPEC;

    #[test]
    fn quick_shrinks_sizes_and_runtimes_but_not_points() {
        let l = load_str("s.toml", SPEC, &[]).unwrap();
        let full = l.expand(false).unwrap();
        let quick = l.expand(true).unwrap();
        assert_eq!(full.len(), quick.len());
        for (f, q) in full.iter().zip(&quick) {
            assert_eq!(f.params, q.params);
        }
        let q = &quick[0].spec;
        assert_eq!(size_value(&q.files[0].size).unwrap(), 4 << 20);
        assert_eq!(fio_size(&q.fio["size"]), Some(4 << 20));
        assert_eq!(q.fio["runtime"].as_str(), Some("2000ms"));
        assert_eq!(quick[0].device.cache.size_bytes, 2 << 20);
        assert_eq!(full[0].device.cache.size_bytes, 16 << 20);
        // Never below min_size, nor bigger than it was.
        let mut s = l.spec.clone();
        s.files[0].size = toml::Value::String("2MiB".into());
        s.fio
            .insert("size".into(), toml::Value::String("50%".into()));
        s.fio.insert("runtime".into(), toml::Value::Integer(1));
        apply_quick(&mut s).unwrap();
        assert_eq!(size_value(&s.files[0].size).unwrap(), 1 << 20);
        assert_eq!(s.fio["size"].as_str(), Some("50%"));
        assert_eq!(s.fio["runtime"].as_integer(), Some(1));
        assert_eq!(
            fio_duration_ns(&toml::Value::String("1m".into())),
            Some(60_000_000_000)
        );
        assert_eq!(
            fio_duration_ns(&toml::Value::String("250ms".into())),
            Some(250_000_000)
        );
        assert_eq!(fio_duration_ns(&toml::Value::String("x".into())), None);
    }
}
