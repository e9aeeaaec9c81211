//! Child processes of `cxlfs run`: signals, process trees, a tiny HTTP GET.
//!
//! Guests run as `run-vm.sh` → `timeout` → QEMU; `timeout` puts itself into
//! a process group of its own, so a guest is stopped by walking `/proc` for
//! the whole tree.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours;
        // `pid` is a child we have not reaped yet or one of its descendants.
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

/// Waits up to `limit` for `child` to exit.
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

/// Stops `child` and its descendants: SIGTERM to all of them, then after
/// `grace` SIGKILL to whatever is left; reaps `child`.
pub fn terminate_tree(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(st)) = child.try_wait() {
        return Some(st);
    }
    let pid = child.id();
    let kids = descendants(pid);
    for &d in kids.iter().rev() {
        signal(d, libc::SIGTERM);
    }
    signal(pid, libc::SIGTERM);
    if let Some(st) = wait_timeout(child, grace) {
        return Some(st);
    }
    signal(pid, libc::SIGSTOP);
    for d in descendants(pid) {
        signal(d, libc::SIGKILL);
    }
    let _ = child.kill();
    child.wait().ok()
}

/// A plain HTTP/1.0 GET; returns the body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).map_err(|e| e.to_string())?;
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| "no end of headers".to_string())?;
    if !head.split_whitespace().nth(1).is_some_and(|c| c == "200") {
        return Err(format!(
            "bad response: {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(body.to_string())
}

/// The last `n` lines of a text file (escape sequences made visible).
pub fn tail(path: &std::path::Path, n: usize) -> String {
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
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    #[test]
    fn terminates_a_process_tree() {
        let mut child = Command::new("sh")
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
        assert!(terminate_tree(&mut child, Duration::from_secs(5)).is_some());
        std::thread::sleep(Duration::from_millis(100));
        for k in kids {
            let alive =
                fs::read_to_string(format!("/proc/{k}/stat")).is_ok_and(|s| !s.contains(") Z "));
            assert!(!alive, "{k} survived");
        }
    }
}
