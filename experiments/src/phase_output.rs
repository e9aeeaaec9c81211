//! Figures read from what a phase's command left behind (`outputs` of a
//! `[[phases]]`): a JSON field, a regular expression's first group, a CSV
//! cell, or a histogram (`{"unit": .., "buckets": [[lo, hi, n], ..]}`).

use crate::distributions::Buckets;
use crate::spec::OutputSpec;
use serde_json::Value;

/// What one output gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Extracted {
    /// A number (after `scale`).
    Number(f64),
    /// A histogram: its unit and buckets `(low, high, count)`.
    Histogram {
        /// Unit of the bounds (`ns`).
        unit: String,
        /// Buckets, ascending.
        buckets: Buckets,
    },
}

/// Why an output could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtractOutputError {
    /// Neither the whole text nor any line of it is JSON.
    #[error("{file}: no JSON object in it")]
    NoJson {
        /// The file read.
        file: String,
    },
    /// The JSON path leads nowhere, or not to a number / histogram.
    #[error("{file}: `{path}`: {why}")]
    JsonPath {
        /// The file read.
        file: String,
        /// The dotted path.
        path: String,
        /// What is there instead.
        why: String,
    },
    /// The regular expression does not compile or does not match.
    #[error("{file}: regex `{regex}`: {why}")]
    Regex {
        /// The file read.
        file: String,
        /// The expression.
        regex: String,
        /// What went wrong.
        why: String,
    },
    /// No such row or column in the CSV.
    #[error("{file}: CSV row `{row}`, column `{column}`: {why}")]
    Csv {
        /// The file read.
        file: String,
        /// The row's first cell.
        row: String,
        /// The column.
        column: String,
        /// What went wrong.
        why: String,
    },
    /// The spec gives no way to read it.
    #[error("give one of json, regex, csv")]
    NoExtractor,
}

/// The JSON of an output file: the whole text, else its last line that is
/// a JSON value (programs that print logs before their JSON line).
pub fn json_of(text: &str) -> Option<Value> {
    serde_json::from_str(text).ok().or_else(|| {
        text.lines()
            .rev()
            .filter(|l| l.trim_start().starts_with(['{', '[']))
            .find_map(|l| serde_json::from_str(l).ok())
    })
}

/// `a.b.0.c` into `v`.
pub fn json_at<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(v, |node, key| match node {
        Value::Object(m) => m.get(key),
        Value::Array(a) => key.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn number_in(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn histogram_in(v: &Value) -> Option<(String, Buckets)> {
    let unit = v.get("unit")?.as_str()?.to_string();
    let buckets = v
        .get("buckets")?
        .as_array()?
        .iter()
        .map(|b| {
            let a = b.as_array()?;
            let lo = a.first().and_then(Value::as_f64)?;
            let hi = a.get(1).and_then(Value::as_f64)?;
            let n = a.get(2).and_then(Value::as_u64)?;
            (lo < hi).then_some((lo, hi, n))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((unit, buckets))
}

/// Splits one CSV line (double quotes, `""` inside them).
fn csv_cells(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.trim_end_matches('\r').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                if let Some(s) = cells.last_mut() {
                    s.push('"');
                }
            }
            '"' => quoted = !quoted,
            ',' if !quoted => cells.push(String::new()),
            c => {
                if let Some(s) = cells.last_mut() {
                    s.push(c);
                }
            }
        }
    }
    cells
}

/// Reads output `spec` from `text` (the content of `file`, for messages).
pub fn extract(spec: &OutputSpec, file: &str, text: &str) -> Result<Extracted, ExtractOutputError> {
    let scale = spec.scale.unwrap_or(1.0);
    if let Some(path) = &spec.json {
        let root = json_of(text).ok_or_else(|| ExtractOutputError::NoJson {
            file: file.to_string(),
        })?;
        let bad = |why: &str| ExtractOutputError::JsonPath {
            file: file.to_string(),
            path: path.clone(),
            why: why.to_string(),
        };
        let v = json_at(&root, path).ok_or_else(|| bad("not there"))?;
        if spec.histogram {
            let (unit, buckets) = histogram_in(v)
                .ok_or_else(|| bad("not a histogram {\"unit\", \"buckets\": [[lo, hi, n], ..]}"))?;
            return Ok(Extracted::Histogram { unit, buckets });
        }
        return number_in(v)
            .map(|x| Extracted::Number(x * scale))
            .ok_or_else(|| bad(&format!("not a number: {v}")));
    }
    if let Some(re) = &spec.regex {
        let bad = |why: String| ExtractOutputError::Regex {
            file: file.to_string(),
            regex: re.clone(),
            why,
        };
        let r = regex::Regex::new(re).map_err(|e| bad(e.to_string()))?;
        let caps = r.captures(text).ok_or_else(|| bad("no match".into()))?;
        let m = caps
            .get(1)
            .ok_or_else(|| bad("the expression needs a capture group".into()))?;
        return m
            .as_str()
            .trim()
            .parse::<f64>()
            .map(|x| Extracted::Number(x * scale))
            .map_err(|_| bad(format!("`{}` is not a number", m.as_str())));
    }
    if let Some(cell) = &spec.csv {
        let bad = |why: String| ExtractOutputError::Csv {
            file: file.to_string(),
            row: cell.row.clone(),
            column: cell.column.clone(),
            why,
        };
        let mut lines = text.lines().filter(|l| l.contains(','));
        let header = lines
            .next()
            .map(csv_cells)
            .ok_or_else(|| bad("no CSV".into()))?;
        let col = header
            .iter()
            .position(|h| h.trim() == cell.column)
            .ok_or_else(|| bad(format!("no such column (header: {})", header.join(","))))?;
        let row = lines
            .map(csv_cells)
            .find(|r| r.first().is_some_and(|c| c.trim() == cell.row))
            .ok_or_else(|| bad("no such row".into()))?;
        let v = row.get(col).ok_or_else(|| bad("short row".into()))?;
        return v
            .trim()
            .parse::<f64>()
            .map(|x| Extracted::Number(x * scale))
            .map_err(|_| bad(format!("`{v}` is not a number")));
    }
    Err(ExtractOutputError::NoExtractor)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::spec::CsvCell;

    #[test]
    fn json_fields_and_histograms_after_log_lines() {
        let text = "starting\n{\"read_mb_s\": 1234.5, \"h\": {\"unit\": \"ns\", \"buckets\": [[100, 110, 5], [50000, 60000, 2]]}, \"a\": [1, {\"b\": \"7\"}]}\n";
        let num = |path: &str, scale: Option<f64>| {
            extract(
                &OutputSpec {
                    json: Some(path.into()),
                    scale,
                    ..Default::default()
                },
                "stdout",
                text,
            )
        };
        assert_eq!(num("read_mb_s", None).unwrap(), Extracted::Number(1234.5));
        assert_eq!(num("a.1.b", Some(2.0)).unwrap(), Extracted::Number(14.0));
        assert!(num("missing", None)
            .unwrap_err()
            .to_string()
            .contains("not there"));
        assert!(num("h", None)
            .unwrap_err()
            .to_string()
            .contains("not a number"));
        let h = extract(
            &OutputSpec {
                json: Some("h".into()),
                histogram: true,
                ..Default::default()
            },
            "stdout",
            text,
        )
        .unwrap();
        assert_eq!(
            h,
            Extracted::Histogram {
                unit: "ns".into(),
                buckets: vec![(100.0, 110.0, 5), (50000.0, 60000.0, 2)]
            }
        );
        assert!(matches!(
            extract(
                &OutputSpec {
                    json: Some("x".into()),
                    ..Default::default()
                },
                "f",
                "no json"
            ),
            Err(ExtractOutputError::NoJson { .. })
        ));
    }

    #[test]
    fn regex_groups_and_csv_cells() {
        let bench = "\"test\",\"rps\",\"avg_latency_ms\",\"p99_latency_ms\"\n\"SET\",\"9000.00\",\"1.0\",\"3.1\"\n\"GET\",\"12345.67\",\"0.5\",\"2.5\"\n";
        let csv = |row: &str, column: &str| {
            extract(
                &OutputSpec {
                    csv: Some(CsvCell {
                        row: row.into(),
                        column: column.into(),
                    }),
                    ..Default::default()
                },
                "stdout",
                bench,
            )
        };
        assert_eq!(csv("GET", "rps").unwrap(), Extracted::Number(12345.67));
        assert_eq!(
            csv("SET", "p99_latency_ms").unwrap(),
            Extracted::Number(3.1)
        );
        assert!(csv("DEL", "rps").is_err());
        assert!(csv("GET", "p42").is_err());
        let re = |r: &str| {
            extract(
                &OutputSpec {
                    regex: Some(r.into()),
                    ..Default::default()
                },
                "stdout",
                "ops: 42.5 per second",
            )
        };
        assert_eq!(re(r"ops: ([0-9.]+)").unwrap(), Extracted::Number(42.5));
        assert!(re(r"ops: [0-9.]+")
            .unwrap_err()
            .to_string()
            .contains("capture group"));
        assert!(re(r"nope (\d)")
            .unwrap_err()
            .to_string()
            .contains("no match"));
        assert!(re(r"(").is_err());
    }
}
