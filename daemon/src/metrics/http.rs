//! The metrics endpoint: a tiny blocking HTTP server on its own thread.
//! `GET /metrics.json` gets the snapshot as one JSON object
//! ([`cxlfs_api::metrics::MetricsSnapshot`]); every other request gets the
//! full Prometheus text exposition, whatever its path.
//!
//! Bounded, because any local user can connect: a request head of at most
//! [`MAX_HEAD`] bytes (the rest is not read), [`IO_TIMEOUT`] for reading it
//! and for writing the answer, and at most [`MAX_CLIENTS`] connections
//! answered at once (each on its own short-lived thread; more are closed
//! unanswered), so a slow or hostile client neither blocks the scraper nor
//! grows the daemon. A full HTTP library would not change what is served
//! (one GET, one body) and would bring an async runtime into a daemon that
//! has none.

use super::Metrics;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// The path of the JSON snapshot.
pub const JSON_PATH: &str = "/metrics.json";
/// Largest request head read (request line and headers).
pub const MAX_HEAD: u64 = 8 * 1024;
/// Time allowed to read the request and to write the answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections answered at once.
pub const MAX_CLIENTS: usize = 4;

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartMetricsError {
    /// Not a loopback address and `--metrics-allow-remote` not given.
    #[error("metrics address {0} is not loopback; pass --metrics-allow-remote to expose it")]
    NotLoopback(SocketAddr),
    /// bind() failed.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Starts the HTTP endpoint; returns the bound address.
pub fn serve(
    addr: SocketAddr,
    allow_remote: bool,
    metrics: Arc<Metrics>,
) -> Result<SocketAddr, StartMetricsError> {
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(StartMetricsError::NotLoopback(addr));
    }
    let listener =
        TcpListener::bind(addr).map_err(|source| StartMetricsError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| StartMetricsError::Bind { addr, source })?;
    thread::Builder::new()
        .name("cxlfsd-metrics".into())
        .spawn(move || {
            let active = Arc::new(AtomicUsize::new(0));
            for stream in listener.incoming() {
                match stream {
                    Ok(s) => admit(s, &metrics, &active),
                    Err(e) => tracing::debug!(error = %e, "metrics accept failed"),
                }
            }
        })
        .map_err(|source| StartMetricsError::Bind { addr, source })?;
    Ok(bound)
}

/// The path of a request line (`GET /p?q HTTP/1.1` → `/p`).
fn request_path(line: &str) -> &str {
    let target = line.split_whitespace().nth(1).unwrap_or("/");
    target.split(['?', '#']).next().unwrap_or(target)
}

/// The body and content type for a request of `path`.
fn body_for(path: &str, metrics: &Metrics) -> (String, &'static str) {
    if path == JSON_PATH {
        let snap = metrics.snapshot().to_api();
        // Plain data (strings and numbers): serializing cannot fail.
        let body = serde_json::to_string(&snap).unwrap_or_default();
        (body, "application/json")
    } else {
        (metrics.render(), "text/plain; version=0.0.4")
    }
}

/// Answers `stream` on a thread of its own, or closes it when
/// [`MAX_CLIENTS`] are being answered already.
fn admit(stream: TcpStream, metrics: &Arc<Metrics>, active: &Arc<AtomicUsize>) {
    if active.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
        active.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!("metrics: too many clients; connection closed");
        return;
    }
    let (m, a) = (metrics.clone(), active.clone());
    let spawned = thread::Builder::new()
        .name("cxlfsd-metrics-client".into())
        .spawn(move || {
            if let Err(e) = answer(stream, &m) {
                tracing::debug!(error = %e, "metrics request failed");
            }
            a.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        active.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!(error = %e, "metrics: cannot spawn a client thread");
    }
}

fn answer(stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?.take(MAX_HEAD));
    // The whole head within IO_TIMEOUT, not each read: a client trickling
    // a byte at a time gets no longer than one that sends nothing.
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    // The request line names the path; the rest of the head is ignored.
    let mut first = String::new();
    let mut line = String::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if first.is_empty() {
            first = line.clone();
        }
    }
    let (body, content_type) = body_for(request_path(&first), metrics);
    let mut w = stream;
    write!(
        w,
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::super::counters::VM_COUNTERS;
    use super::super::test_support::metrics;
    use super::*;
    use cxlfs_api::metrics::MetricsSnapshot;
    use fuse_abi::opcode;

    fn get(addr: SocketAddr, path: &str) -> (String, String) {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        io::Read::read_to_string(&mut s, &mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        (head.to_string(), body.to_string())
    }

    #[test]
    fn refuses_remote_without_flag() {
        let m = metrics();
        let addr: SocketAddr = "0.0.0.0:0".parse().unwrap();
        assert!(matches!(
            serve(addr, false, m.clone()),
            Err(StartMetricsError::NotLoopback(_))
        ));
        let bound = serve("127.0.0.1:0".parse().unwrap(), false, m).unwrap();
        let (head, body) = get(bound, "/metrics");
        assert!(head.starts_with("HTTP/1.1 200 OK"));
        assert!(body.contains("cxlfs_nand_reads_total"));
    }

    #[test]
    fn a_silent_client_does_not_hold_up_a_scrape_and_heads_are_capped() {
        let bound = serve("127.0.0.1:0".parse().unwrap(), false, metrics()).unwrap();
        let _silent = TcpStream::connect(bound).unwrap();
        let t = std::time::Instant::now();
        let (head, _) = get(bound, "/metrics");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(t.elapsed() < IO_TIMEOUT, "waited {:?}", t.elapsed());
        // A head far beyond MAX_HEAD, never ended: cut off, not buffered.
        let mut big = TcpStream::connect(bound).unwrap();
        let line = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n", "a".repeat(64 * 1024));
        let _ = big.write_all(line.as_bytes());
        let mut out = String::new();
        let _ = io::Read::read_to_string(&mut big, &mut out);
        assert!(
            out.is_empty() || out.starts_with("HTTP/1.1 200 OK"),
            "{out:.80}"
        );
    }

    #[test]
    fn clients_beyond_the_cap_are_closed_and_service_resumes() {
        let bound = serve("127.0.0.1:0".parse().unwrap(), false, metrics()).unwrap();
        let silent: Vec<TcpStream> = (0..MAX_CLIENTS)
            .map(|_| TcpStream::connect(bound).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        // Over the cap: closed without an answer, at once.
        let mut s = TcpStream::connect(bound).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let _ = write!(s, "GET /metrics HTTP/1.1\r\n\r\n");
        let mut out = String::new();
        let _ = io::Read::read_to_string(&mut s, &mut out);
        assert!(out.is_empty(), "answered over the cap: {out:.80}");
        // The silent ones time out; then scrapes are answered again.
        std::thread::sleep(IO_TIMEOUT + Duration::from_millis(500));
        let (head, _) = get(bound, "/metrics");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        drop(silent);
    }

    #[test]
    fn metrics_json_is_the_snapshot() {
        let m = metrics();
        let v = m.vm("vm0");
        v.count_request(opcode::READ);
        v.read_bytes
            .fetch_add(4096, std::sync::atomic::Ordering::Relaxed);
        v.record_fuse_latency(12_000);
        m.vm("vm1").count_request(opcode::LOOKUP);
        let bound = serve("127.0.0.1:0".parse().unwrap(), false, m.clone()).unwrap();
        let (head, body) = get(bound, "/metrics.json?x=1");
        assert!(head.contains("Content-Type: application/json"), "{head}");
        let got: MetricsSnapshot = serde_json::from_str(&body).unwrap();
        assert_eq!(got, m.snapshot().to_api());
        assert_eq!(got.vms[0].counter("read_bytes"), 4096);
        assert_eq!(got.vms[0].fuse_ops["READ"], 1);
        assert_eq!(got.all.fuse_ops["LOOKUP"], 1);
        assert_eq!(got.vms[0].fuse_latency_ns.count, 1);
        assert_eq!(got.counters.len(), VM_COUNTERS.len());
        // Other paths keep the text.
        let (_, text) = get(bound, "/metrics.jsonx");
        assert!(text.starts_with("# HELP"), "{text}");
    }
}
