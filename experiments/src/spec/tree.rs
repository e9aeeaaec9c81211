//! The spec as a plain TOML tree: `--set KEY=VALUE` values and dotted
//! paths, setting a path in the tree, and flattening a nested table back
//! to `KEY=VALUE` overrides.

use super::LoadSpecError;
use cxlfs_device_model::units::parse_size;

/// A TOML value as plain text: strings unquoted.
pub fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Reads a `--set` value: TOML if it parses (`5`, `true`, `[0, 50]`,
/// `"x"`), else the text as a string.
pub(super) fn parse_set_value(text: &str) -> toml::Value {
    let text = text.trim();
    toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_string()))
}

/// Splits a dotted path. Under `sweep`, the rest is one key
/// (`sweep.daemon.cxl_ratio` → `["sweep", "daemon.cxl_ratio"]`).
pub(super) fn split_path(path: &str) -> Vec<String> {
    match path.strip_prefix("sweep.") {
        Some(rest) => vec!["sweep".to_string(), rest.to_string()],
        None => path.split('.').map(str::to_string).collect(),
    }
}

/// Sets `path` in `tree`, creating tables on the way; array elements are
/// addressed by index (`phases.1.fio.rw`).
pub(super) fn set_path(
    tree: &mut toml::Value,
    path: &[String],
    value: toml::Value,
) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("empty key".into());
    };
    let mut node = tree;
    for (i, part) in parents.iter().enumerate() {
        let here = path[..=i].join(".");
        node = match node {
            toml::Value::Table(t) => t
                .entry(part.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new())),
            toml::Value::Array(a) => {
                let idx: usize = part
                    .parse()
                    .map_err(|_| format!("{here}: `{part}` is not an index into an array"))?;
                let len = a.len();
                a.get_mut(idx)
                    .ok_or_else(|| format!("{here}: index {idx} out of range (length {len})"))?
            }
            _ => return Err(format!("{}: not a table", path[..i].join("."))),
        };
    }
    match node {
        toml::Value::Table(t) => {
            t.insert(last.clone(), value);
            Ok(())
        }
        toml::Value::Array(a) => {
            let idx: usize = last
                .parse()
                .map_err(|_| format!("{}: `{last}` is not an index", path.join(".")))?;
            let len = a.len();
            *a.get_mut(idx).ok_or_else(|| {
                format!(
                    "{}: index {idx} out of range (length {len})",
                    path.join(".")
                )
            })? = value;
            Ok(())
        }
        _ => Err(format!("{}: not a table", parents.join("."))),
    }
}

/// Applies `--set KEY=VALUE` arguments to `tree`.
pub(super) fn apply_sets(
    path: &str,
    tree: &mut toml::Value,
    sets: &[String],
) -> Result<(), LoadSpecError> {
    for s in sets {
        let (key, value) = s
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty())
            .ok_or_else(|| LoadSpecError::BadSet(s.clone()))?;
        set_path(tree, &split_path(key.trim()), parse_set_value(value)).map_err(|message| {
            LoadSpecError::Key {
                path: path.to_string(),
                key: format!("{} (--set)", key.trim()),
                message,
            }
        })?;
    }
    Ok(())
}

/// Flattens a nested table to `a.b.c=value` overrides (strings unquoted).
pub(super) fn flatten_sets(prefix: &str, t: &toml::Table, out: &mut Vec<String>) {
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(inner) => flatten_sets(&key, inner, out),
            other => out.push(format!("{key}={}", value_text(other))),
        }
    }
}

/// A size given as a number of bytes or a string with a unit.
pub fn size_value(v: &toml::Value) -> Result<u64, String> {
    match v {
        toml::Value::Integer(n) if *n >= 0 => Ok(*n as u64),
        toml::Value::String(s) => parse_size(s).map_err(|e| e.to_string()),
        other => Err(format!("expected a size, got {other}")),
    }
}
