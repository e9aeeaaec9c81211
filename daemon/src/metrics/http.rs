//! The metrics endpoint: a tiny blocking HTTP server on its own thread.
//! `GET /metrics.json` gets the snapshot as one JSON object
//! ([`cxlfs_api::metrics::MetricsSnapshot`]); every other request gets the
//! full Prometheus text exposition, whatever its path.

use super::Metrics;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// The path of the JSON snapshot.
pub const JSON_PATH: &str = "/metrics.json";

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
            for stream in listener.incoming() {
                match stream {
                    Ok(s) => {
                        if let Err(e) = answer(s, &metrics) {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    }
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

fn answer(stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    // The request line names the path; the rest of the head is ignored.
    let mut first = String::new();
    let mut line = String::new();
    loop {
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
        assert_eq!(got.counters.len(), super::super::VM_COUNTERS.len());
        // Other paths keep the text.
        let (_, text) = get(bound, "/metrics.jsonx");
        assert!(text.starts_with("# HELP"), "{text}");
    }
}
