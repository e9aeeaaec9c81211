//! The Prometheus text exposition (format 0.0.4) of `cxlfsd`'s `/metrics`,
//! parsed into samples with their labels. The e2e tests query it by name
//! and labels ([`Metrics::get`], [`Metrics::sum`]) to check the endpoint
//! itself. Clients that want the daemon's numbers read `/metrics.json` or
//! the `--metrics-file` lines with the types of `cxlfs_api::metrics`
//! instead (as `cxlfs run` does).

use std::collections::BTreeMap;

/// One sample of a Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (with any `_count`/`_sum`/`_bucket` suffix).
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value (`+Inf`/`-Inf` included).
    pub value: f64,
}

/// Why a Prometheus text could not be parsed.
#[derive(Debug, thiserror::Error)]
#[error("metrics text line {line}: {message}: {text}")]
pub struct ParseMetricsError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
    /// The line itself.
    pub text: String,
}

/// A parsed Prometheus text exposition.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Every sample, in order.
    pub samples: Vec<Sample>,
}

/// The labels of a sample; `s` starts right after '{'. Returns them and the
/// rest of the line after '}'.
fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without '='")?;
        let key = rest[..eq].trim().to_string();
        let mut chars = rest[eq + 1..].char_indices();
        if !matches!(chars.next(), Some((_, '"'))) {
            return Err(format!("label {key}: value not quoted"));
        }
        let mut value = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => break,
                },
                '"' => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end.ok_or_else(|| format!("label {key}: unterminated value"))?;
        labels.insert(key, value);
        rest = &rest[end..];
    }
}

/// One sample line: `name[{labels}] value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let (labels, rest) = if line[name_end..].starts_with('{') {
        parse_labels(&line[name_end + 1..])?
    } else {
        (BTreeMap::new(), &line[name_end..])
    };
    let v = rest.split_whitespace().next().ok_or("no value")?;
    let value = match v {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().map_err(|e| format!("value {v:?}: {e}"))?,
    };
    Ok(Sample {
        name: line[..name_end].to_string(),
        labels,
        value,
    })
}

impl Metrics {
    /// Parses the text format: comments and blank lines are skipped; every
    /// other line is `name[{labels}] value [timestamp]`.
    pub fn parse(text: &str) -> Result<Metrics, ParseMetricsError> {
        let mut samples = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let sample = parse_sample(line).map_err(|message| ParseMetricsError {
                line: n + 1,
                message,
                text: line.to_string(),
            })?;
            samples.push(sample);
        }
        Ok(Metrics { samples })
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
        })
    }

    /// The first sample of `name` whose labels include `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).next().map(|s| s.value)
    }

    /// The sum over every sample of `name` whose labels include `labels`
    /// (0 if there is none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// `sum` as an integer counter.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.sum(name, labels).round() as u64
    }

    /// Whether any sample of `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_prometheus_text() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total{vm=\"vm0\",opcode=\"read\"} 12\n\
                    a_total{vm=\"vm1\",opcode=\"read\"} 3\na_total{vm=\"vm1\",opcode=\"write\"} 4 1700000000\n\
                    g 1.5e3\nq{x=\"a\\\"b\\\\c\",y=\"\"} +Inf\n\n";
        let m = Metrics::parse(text).unwrap();
        assert_eq!(m.samples.len(), 5);
        assert_eq!(m.get("a_total", &[("vm", "vm0")]), Some(12.0));
        assert_eq!(m.sum("a_total", &[("vm", "vm1")]), 7.0);
        assert_eq!(m.count("a_total", &[]), 19);
        assert_eq!(m.get("g", &[]), Some(1500.0));
        assert_eq!(
            m.get("q", &[("x", "a\"b\\c"), ("y", "")]),
            Some(f64::INFINITY)
        );
        assert_eq!(m.get("a_total", &[("vm", "vm2")]), None);
        assert!(m.has("g") && !m.has("nope"));
        assert!(Metrics::parse("x{vm=\"a} 1").is_err());
        let e = Metrics::parse("x 1 2\ny").unwrap_err();
        assert_eq!((e.line, e.text.as_str()), (2, "y"));
        assert!(Metrics::parse("x abc").is_err());
    }
}
