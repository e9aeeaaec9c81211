//! Child processes of `cxlfs run` and of the e2e harness: signals, process
//! trees, waiting with a limit, a tiny HTTP GET, log tails.
//!
//! Guests run as `run-vm.sh` → `timeout` → QEMU; `timeout` puts itself into
//! a process group of its own, so a guest is stopped by walking `/proc` for
//! the whole tree.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours;
        // callers pass a child they have not reaped yet (or one of its
        // descendants), so it cannot name a recycled process of someone else's.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Every descendant of `root`, found through `/proc/*/stat`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|s| s.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent.push((pid, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent {
            if pp == p && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// Waits up to `limit` for `child` to exit; `None` if it is still running
/// (or cannot be waited for).
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if t.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

/// Kills `child` and all its descendants, and reaps it. `child` is stopped
/// first (SIGSTOP) so that it cannot start new children while they are
/// killed (SIGKILL); then it is killed itself.
pub fn kill_tree(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(st)) = child.try_wait() {
        return Some(st);
    }
    let pid = child.id();
    signal(pid, libc::SIGSTOP);
    for d in descendants(pid) {
        signal(d, libc::SIGKILL);
    }
    let _ = child.kill();
    child.wait().ok()
}

/// Stops `child` and its descendants: SIGTERM to all of them, then after
/// `grace` [`kill_tree`] for whatever is left; reaps `child`.
pub fn terminate_tree(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(st)) = child.try_wait() {
        return Some(st);
    }
    let pid = child.id();
    for &d in descendants(pid).iter().rev() {
        signal(d, libc::SIGTERM);
    }
    signal(pid, libc::SIGTERM);
    if let Some(st) = wait_timeout(child, grace) {
        return Some(st);
    }
    kill_tree(child)
}

/// Why [`http_get`] got no body.
#[derive(Debug, thiserror::Error)]
pub enum HttpGetError {
    /// No connection within 5 s.
    #[error("connect to {addr}: {source}")]
    Connect {
        /// The server.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The request or the response failed (10 s read timeout).
    #[error("GET from {addr}: {source}")]
    Io {
        /// The server.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The response has no blank line after its headers.
    #[error("no end of headers in {response:?}")]
    NoEndOfHeaders {
        /// The whole response.
        response: String,
    },
    /// The response is not `HTTP/1.x 200`.
    #[error("bad response: {status_line}")]
    NotOk {
        /// The response's first line.
        status_line: String,
    },
}

/// A plain HTTP/1.0 GET of `path`; returns the body of a `200` response.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String, HttpGetError> {
    let io = |source| HttpGetError::Io { addr, source };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|source| HttpGetError::Connect { addr, source })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(io)?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).map_err(io)?;
    let Some((head, body)) = resp.split_once("\r\n\r\n") else {
        return Err(HttpGetError::NoEndOfHeaders { response: resp });
    };
    if !head.starts_with("HTTP/1.") || !head.split_whitespace().nth(1).is_some_and(|c| c == "200") {
        return Err(HttpGetError::NotOk {
            status_line: head.lines().next().unwrap_or("").to_string(),
        });
    }
    Ok(body.to_string())
}

/// The last `n` lines of a log file, carriage returns removed and escape
/// characters made visible (`^[`).
pub fn tail(path: &Path, n: usize) -> String {
    let Ok(bytes) = fs::read(path) else {
        return format!("({} unreadable)", path.display());
    };
    let text = String::from_utf8_lossy(&bytes)
        .replace('\r', "")
        .replace('\u{1b}', "^[");
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::net::TcpListener;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// `sh` with two `sleep` children, in a process group of its own (as
    /// `timeout` puts QEMU), and the children's pids once both are up.
    fn spawn_tree() -> (Child, Vec<u32>) {
        let child = Command::new("sh")
            .args(["-c", "sleep 300 & sleep 300 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let t = Instant::now();
        let mut kids = Vec::new();
        while kids.len() < 2 && t.elapsed() < Duration::from_secs(5) {
            kids = descendants(child.id());
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(kids.len(), 2, "{kids:?}");
        (child, kids)
    }

    fn assert_all_gone(kids: Vec<u32>) {
        std::thread::sleep(Duration::from_millis(100));
        for k in kids {
            let alive =
                fs::read_to_string(format!("/proc/{k}/stat")).is_ok_and(|s| !s.contains(") Z "));
            assert!(!alive, "{k} survived");
        }
    }

    #[test]
    fn kills_a_process_tree() {
        let (mut child, kids) = spawn_tree();
        assert!(kill_tree(&mut child).is_some());
        assert!(child.try_wait().unwrap().is_some(), "root reaped");
        assert_all_gone(kids);
    }

    #[test]
    fn terminates_a_process_tree() {
        let (mut child, kids) = spawn_tree();
        assert!(terminate_tree(&mut child, Duration::from_secs(5)).is_some());
        assert_all_gone(kids);
    }

    #[test]
    fn wait_timeout_gives_up_on_a_running_child() {
        let mut child = Command::new("sleep").arg("300").spawn().unwrap();
        let t = Instant::now();
        assert!(wait_timeout(&mut child, Duration::from_millis(100)).is_none());
        assert!(t.elapsed() >= Duration::from_millis(100));
        assert!(kill_tree(&mut child).is_some());
        let mut quick = Command::new("true").spawn().unwrap();
        assert!(wait_timeout(&mut quick, Duration::from_secs(10)).is_some_and(|s| s.success()));
    }

    /// Serves one connection with `response` on a loopback port.
    fn serve_once(response: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // The whole request head first: answering and closing after a
            // partial read would break the client's pipe mid-request.
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            s.write_all(response.as_bytes()).unwrap();
        });
        addr
    }

    #[test]
    fn http_get_returns_the_body_of_a_200_only() {
        let ok = serve_once("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nx 1\n");
        assert_eq!(http_get(ok, "/metrics").unwrap(), "x 1\n");
        let missing = serve_once("HTTP/1.0 404 Not Found\r\n\r\nnope");
        let e = http_get(missing, "/metrics").unwrap_err();
        assert!(matches!(e, HttpGetError::NotOk { .. }), "{e}");
        assert!(e.to_string().contains("404"), "{e}");
        let torn = serve_once("HTTP/1.0 200 OK\r\n");
        let e = http_get(torn, "/metrics").unwrap_err();
        assert!(matches!(e, HttpGetError::NoEndOfHeaders { .. }), "{e}");
    }
}
