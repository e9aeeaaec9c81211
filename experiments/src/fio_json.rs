//! fio's `--output-format=json` output: the figures `cxlfs run` reports.
//!
//! The runner always passes `--group_reporting`, so `jobs[0]` sums every job
//! of the invocation. Fields fio leaves out (an idle direction, an old fio)
//! simply give no cell.

use serde_json::Value;

/// Why a fio output could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ParseFioError {
    /// No `{` in the text (fio failed before writing JSON).
    #[error("no JSON in fio's output")]
    NoJson,
    /// The JSON is malformed.
    #[error("fio JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// There is no `jobs[0]`.
    #[error("fio JSON has no jobs")]
    NoJobs,
}

/// The completion-latency percentiles reported, as fio keys them.
pub const PERCENTILES: [(&str, &str); 4] = [
    ("p50", "50.000000"),
    ("p90", "90.000000"),
    ("p99", "99.000000"),
    ("p999", "99.900000"),
];

/// The summary of one fio invocation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FioSummary {
    /// fio's version string (`fio-3.33`).
    pub version: Option<String>,
    /// Named figures: `read_bw_bytes_per_sec`, `read_iops`, `read_clat_p99_ns`, ...
    pub fields: Vec<(String, f64)>,
    /// fio's error code for the job (0 = none).
    pub error: i64,
}

impl FioSummary {
    /// A figure by name.
    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<f64> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

/// Parses fio's JSON output; text before the first `{` (warnings) is skipped.
pub fn parse(text: &str) -> Result<FioSummary, ParseFioError> {
    let start = text.find('{').ok_or(ParseFioError::NoJson)?;
    // fio may print more text after the JSON object: read one value only.
    let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
    let v = stream.next().ok_or(ParseFioError::NoJson)??;
    let job = v
        .get("jobs")
        .and_then(|j| j.get(0))
        .ok_or(ParseFioError::NoJobs)?;
    let mut fields = Vec::new();
    let mut put = |name: String, x: Option<f64>| {
        if let Some(x) = x {
            fields.push((name, x));
        }
    };
    for dir in ["read", "write"] {
        let d = &job[dir];
        put(format!("{dir}_bw_bytes_per_sec"), d["bw_bytes"].as_f64());
        put(format!("{dir}_iops"), d["iops"].as_f64());
        put(format!("{dir}_io_bytes"), d["io_bytes"].as_f64());
        put(format!("{dir}_ios"), d["total_ios"].as_f64());
        put(format!("{dir}_clat_mean_ns"), d["clat_ns"]["mean"].as_f64());
        for (name, key) in PERCENTILES {
            put(
                format!("{dir}_clat_{name}_ns"),
                d["clat_ns"]["percentile"][key].as_f64(),
            );
        }
        put(format!("{dir}_clat_max_ns"), d["clat_ns"]["max"].as_f64());
    }
    put("fio_runtime_ms".into(), job["job_runtime"].as_f64());
    put("fio_usr_cpu".into(), job["usr_cpu"].as_f64());
    put("fio_sys_cpu".into(), job["sys_cpu"].as_f64());
    Ok(FioSummary {
        version: v["fio version"].as_str().map(str::to_string),
        fields,
        error: job["error"].as_i64().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Captured from a real guest: fio 3.33, mmap random 4 KiB reads of a
    /// 16 MiB file through the DAX window of `cxlfsd` (TCG, 3 s).
    const DAX_RANDREAD: &str = include_str!("../tests/fixtures/fio-dax-mmap-randread.json");

    #[test]
    fn reads_a_real_fio_output() {
        let s = parse(DAX_RANDREAD).unwrap();
        assert_eq!(s.version.as_deref(), Some("fio-3.33"));
        assert_eq!(s.error, 0);
        assert_eq!(s.get("read_bw_bytes_per_sec"), Some(48_884_483.0));
        assert_eq!(s.get("read_iops"), Some(11_934.688437));
        assert_eq!(s.get("read_ios"), Some(35_816.0));
        assert_eq!(s.get("read_clat_p50_ns"), Some(61_184.0));
        assert_eq!(s.get("read_clat_p99_ns"), Some(618_496.0));
        assert_eq!(s.get("read_clat_p999_ns"), Some(1_728_512.0));
        assert_eq!(s.get("write_bw_bytes_per_sec"), Some(0.0));
        // No write completions: fio prints no write percentiles.
        assert_eq!(s.get("write_clat_p50_ns"), None);
        assert!(s.get("fio_runtime_ms").unwrap() >= 3000.0);
    }

    #[test]
    fn skips_leading_warnings_and_rejects_garbage() {
        let text = format!("fio: some warning\n{DAX_RANDREAD}\ntrailing text");
        assert!(parse(&text).is_ok());
        assert!(matches!(
            parse("fio: bad option"),
            Err(ParseFioError::NoJson)
        ));
        assert!(matches!(
            parse("{\"jobs\": []}"),
            Err(ParseFioError::NoJobs)
        ));
        assert!(matches!(
            parse("{\"jobs\": [}"),
            Err(ParseFioError::Json(_))
        ));
    }
}
