//! The JSON-lines metrics time series (`--metrics-file PATH`,
//! `--metrics-interval DURATION`).
//!
//! Every interval the writer appends one sample: one JSON object per VM and
//! one with `"vm":"all"`, one per line, all with the same `seq`. At a clean
//! shutdown the daemon writes a last sample with `"final":true` after the
//! device flush ([`MetricsFileWriter::finish`]), so a runner can read the
//! final counters. Counters are cumulative since the daemon started. The
//! file is created (truncated) at start. Each line is a
//! [`cxlfs_api::metrics::SampleLine`], so the experiment runner reads them
//! with the daemon's own types; field names are fixed: see `docs/metrics.md`.

use super::Metrics;
use super::Snapshot;
pub use cxlfs_api::metrics::SampleInfo;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Default sampling interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// The lines of one sample: one per VM, then `all`, each ending in `\n`
/// (each a [`cxlfs_api::metrics::SampleLine`]).
pub fn sample_lines(info: &SampleInfo, snap: &Snapshot) -> String {
    let mut out = String::new();
    for line in snap.to_api().lines(*info) {
        // Plain data (strings and numbers): serializing cannot fail.
        out.push_str(&serde_json::to_string(&line).unwrap_or_default());
        out.push('\n');
    }
    out
}

/// Why the metrics file could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartMetricsFileError {
    /// The file could not be created.
    #[error("cannot create the metrics file {path}")]
    Create {
        /// The file.
        path: PathBuf,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// The writer thread could not be spawned.
    #[error("cannot spawn the metrics-file thread")]
    Spawn(#[source] io::Error),
}

/// Opens (creating or truncating) the series file without following a
/// symlink at `path` (the daemon runs as root: a planted link must not
/// make it truncate another file) and without blocking on a FIFO; only a
/// regular file is accepted.
fn open_series(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    // Truncated only once known to be a regular file.
    file.set_len(0)?;
    Ok(file)
}

/// Why the final sample could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteMetricsFileError {
    /// Writing or syncing the file failed.
    #[error("cannot write the metrics file {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// OS error.
        #[source]
        source: io::Error,
    },
}

struct Sink {
    path: PathBuf,
    out: BufWriter<File>,
    metrics: Arc<Metrics>,
    started: Instant,
    seq: u64,
}

impl Sink {
    fn write_sample(&mut self, is_final: bool) -> io::Result<()> {
        let ts_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let info = SampleInfo {
            ts_unix_ms,
            elapsed_s: self.started.elapsed().as_secs_f64(),
            seq: self.seq,
            is_final,
        };
        let lines = sample_lines(&info, &self.metrics.snapshot());
        self.seq += 1;
        self.out.write_all(lines.as_bytes())?;
        self.out.flush()
    }
}

/// The periodic writer: a thread that samples every interval.
pub struct MetricsFileWriter {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<Sink>>,
    path: PathBuf,
}

impl std::fmt::Debug for MetricsFileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsFileWriter")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl MetricsFileWriter {
    /// Creates `path` and starts sampling `metrics` every `interval` (the
    /// first sample one interval from now).
    pub fn start(
        path: &Path,
        interval: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StartMetricsFileError> {
        let file = open_series(path).map_err(|source| StartMetricsFileError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        let mut sink = Sink {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
            metrics,
            started: Instant::now(),
            seq: 0,
        };
        let (tx, rx) = mpsc::channel::<()>();
        let interval = interval.max(Duration::from_millis(1));
        let thread = thread::Builder::new()
            .name("cxlfsd-metrics-file".into())
            .spawn(move || {
                let mut next = sink.started + interval;
                loop {
                    let wait = next.saturating_duration_since(Instant::now());
                    match rx.recv_timeout(wait) {
                        Err(RecvTimeoutError::Timeout) => {
                            if let Err(e) = sink.write_sample(false) {
                                tracing::warn!(path = %sink.path.display(), error = %e, "cannot write a metrics sample");
                            }
                            next += interval;
                            // Fell behind (a stalled disk): skip, don't burst.
                            let now = Instant::now();
                            if next < now {
                                next = now + interval;
                            }
                        }
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return sink,
                    }
                }
            })
            .map_err(StartMetricsFileError::Spawn)?;
        Ok(MetricsFileWriter {
            stop: Some(tx),
            thread: Some(thread),
            path: path.to_path_buf(),
        })
    }

    /// Stops the periodic samples and writes the final one (`"final":true`),
    /// then syncs the file. Call after the device flush.
    pub fn finish(mut self) -> Result<(), WriteMetricsFileError> {
        self.stop.take();
        let sink = self.thread.take().and_then(|t| t.join().ok());
        let Some(mut sink) = sink else {
            return Err(WriteMetricsFileError::Write {
                path: self.path.clone(),
                source: io::Error::other("the metrics-file thread panicked"),
            });
        };
        let err = |source| WriteMetricsFileError::Write {
            path: self.path.clone(),
            source,
        };
        sink.write_sample(true).map_err(err)?;
        sink.out.get_ref().sync_data().map_err(err)
    }
}

impl Drop for MetricsFileWriter {
    fn drop(&mut self) {
        // Without finish(): stop the thread, no final sample.
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::metrics;
    use super::super::DeviceWork;
    use super::*;
    use fuse_abi::opcode;
    use serde_json::Value;

    const REQUIRED: [&str; 28] = [
        "ts_unix_ms",
        "elapsed_s",
        "seq",
        "final",
        "vm",
        "cxl_ratio",
        "policy",
        "fuse_ops",
        "read_bytes",
        "write_bytes",
        "dax_maps",
        "dax_unmaps",
        "traps",
        "device_hits",
        "device_misses",
        "nand_reads",
        "nand_programs",
        "nand_erases",
        "gc_runs",
        "write_amplification",
        "prefetch_issued",
        "prefetch_used",
        "resident_dram_pages",
        "resident_cxl_pages",
        "shared_pages",
        "trap_latency_ns",
        "fuse_latency_ns",
        "pacing_error_ns",
    ];

    #[test]
    fn refuses_a_symlink_and_a_fifo_and_leaves_their_targets_alone() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let link = dir.path().join("series.jsonl");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = MetricsFileWriter::start(&link, Duration::from_secs(1), metrics()).unwrap_err();
        assert!(matches!(err, StartMetricsFileError::Create { .. }), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Returns (ENXIO: no reader) rather than blocking.
        assert!(MetricsFileWriter::start(&fifo, Duration::from_secs(1), metrics()).is_err());
    }

    #[test]
    fn one_line_per_vm_and_all_with_the_fixed_fields() {
        let m = metrics();
        let a = m.vm("vm0");
        let b = m.vm("vm1");
        a.count_request(opcode::READ);
        a.count_request(opcode::READ);
        b.count_request(opcode::WRITE);
        a.read_bytes
            .fetch_add(8192, std::sync::atomic::Ordering::Relaxed);
        a.record_charge(DeviceWork {
            page_hits: 1,
            page_misses: 2,
            dram_pages: 3,
            nand_reads: 2,
            ..DeviceWork::default()
        });
        b.record_charge(DeviceWork {
            page_misses: 5,
            ..DeviceWork::default()
        });
        a.record_fuse_latency(10_000);
        a.record_fuse_latency(30_000);
        b.record_fuse_latency(20_000);
        let info = SampleInfo {
            ts_unix_ms: 1_700_000_000_000,
            elapsed_s: 1.5,
            seq: 7,
            is_final: true,
        };
        let text = sample_lines(&info, &m.snapshot());
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines
                .iter()
                .map(|l| l["vm"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["vm0", "vm1", "all"]
        );
        for l in &lines {
            for f in REQUIRED {
                assert!(l.get(f).is_some(), "missing {f} in {l}");
            }
            assert_eq!(l["seq"], 7);
            assert_eq!(l["final"], true);
            assert_eq!(l["ts_unix_ms"], 1_700_000_000_000u64);
            assert_eq!(l["cxl_ratio"], 100);
            for h in ["trap_latency_ns", "fuse_latency_ns", "pacing_error_ns"] {
                for k in ["count", "p50", "p90", "p99", "p999", "max"] {
                    assert!(l[h][k].is_u64(), "{h}.{k} in {l}");
                }
            }
        }
        let (vm0, vm1, all) = (&lines[0], &lines[1], &lines[2]);
        assert_eq!(vm0["fuse_ops"]["READ"], 2);
        assert_eq!(vm1["fuse_ops"]["WRITE"], 1);
        assert_eq!(all["fuse_ops"]["READ"], 2);
        assert_eq!(all["fuse_ops"]["WRITE"], 1);
        assert_eq!(vm0["read_bytes"], 8192);
        assert_eq!(all["read_bytes"], 8192);
        assert_eq!(vm0["device_misses"], 2);
        assert_eq!(vm1["device_misses"], 5);
        assert_eq!(vm0["dram_pages"], 3);
        assert_eq!(vm0["nand_reads"], 2);
        // The all row's device counters are the device model's own (no
        // real access happened here).
        assert_eq!(all["device_misses"], 0);
        assert_eq!(vm0["fuse_latency_ns"]["count"], 2);
        assert_eq!(all["fuse_latency_ns"]["count"], 3);
        let max = all["fuse_latency_ns"]["max"].as_u64().unwrap();
        assert!((29_990..=30_100).contains(&max), "{max}");
    }

    #[test]
    fn periodic_samples_then_a_final_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let m = metrics();
        m.vm("vm0").count_request(opcode::LOOKUP);
        let w = MetricsFileWriter::start(&path, Duration::from_millis(20), m.clone()).unwrap();
        std::thread::sleep(Duration::from_millis(130));
        m.vm("vm0").count_request(opcode::LOOKUP);
        w.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(lines.len() >= 2 * 4, "{text}");
        let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
        assert!(seqs.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
        let finals: Vec<&Value> = lines.iter().filter(|l| l["final"] == true).collect();
        assert_eq!(finals.len(), 2, "vm0 and all");
        assert_eq!(finals[0]["fuse_ops"]["LOOKUP"], 2);
        assert!(lines[..lines.len() - 2].iter().all(|l| l["final"] == false));
        let t: Vec<f64> = lines
            .iter()
            .map(|l| l["elapsed_s"].as_f64().unwrap())
            .collect();
        assert!(t.windows(2).all(|w| w[1] >= w[0]));
    }

    #[test]
    fn unwritable_path_is_an_error() {
        let e = MetricsFileWriter::start(
            Path::new("/nonexistent-dir/m.jsonl"),
            DEFAULT_INTERVAL,
            metrics(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir/m.jsonl"));
    }
}
