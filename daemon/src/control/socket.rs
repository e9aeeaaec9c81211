//! The host's way in: the control socket (`--control-socket`). Accepts up
//! to [`MAX_CONNECTIONS`] connections, a thread each; reads request lines
//! of at most [`MAX_REQUEST_LINE`] bytes, parses them with
//! [`RequestEnvelope::parse_line`], runs them on the [`Controller`] and
//! answers each with one [`Reply`] line, held until the command's modeled
//! completion. The peer's credentials go to the debug log.

use super::{Controller, Principal, StartControlError};
use crate::sync::lock;
use cxlfs_api::control::{
    ErrorBody, ErrorCode, Reply, Request, RequestEnvelope, MAX_CONNECTIONS, MAX_REQUEST_LINE,
};
use rustix::io::Errno;
use serde_json::Value;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

impl Controller {
    /// Handles one request line from the host; returns the reply line and
    /// the device time to hold it until (the command's modeled completion).
    pub fn handle_line(&self, line: &[u8]) -> (String, u64) {
        let (reply, until, _) = self.handle_line_with_fd(line);
        (reply, until)
    }

    /// [`Controller::handle_line`], plus the descriptor to attach to the
    /// reply (`memory_fd`: the VM's region file, when the command succeeded).
    pub fn handle_line_with_fd(&self, line: &[u8]) -> (String, u64, Option<Arc<std::fs::File>>) {
        let now = self.shared.now_ns();
        let env = match RequestEnvelope::parse_line(line) {
            Ok(env) => env,
            Err(refused) => {
                return (
                    Reply::failure(refused.id, refused.error).to_line(),
                    now,
                    None,
                )
            }
        };
        let region = match &env.request {
            Request::MemoryFd { vm } => self.memory_region(vm).ok().map(|(_, file)| file),
            _ => None,
        };
        let (reply, until) = match self.execute(&Principal::Host, env.request) {
            Ok(done) => (
                Reply::success(env.id, done.result).to_line(),
                done.completes_at_ns.unwrap_or(now),
            ),
            Err(e) => {
                tracing::info!(code = %e.code(), error = %e, "control command refused");
                let error = ErrorBody::new(e.code(), e.to_string());
                (Reply::failure(env.id, error).to_line(), now)
            }
        };
        (reply, until, region)
    }

    /// Sleeps until device time `until_ns` (a reply is not released before
    /// the modeled completion of its command).
    fn wait_until(&self, until_ns: u64) {
        loop {
            let now = self.shared.now_ns();
            if now >= until_ns {
                return;
            }
            thread::sleep(Duration::from_nanos(until_ns - now));
        }
    }
}

/// A reply line refusing a line that never became a request.
fn refusal(code: ErrorCode, message: String) -> String {
    Reply::failure(Value::Null, ErrorBody::new(code, message)).to_line()
}

/// The listening control socket; removed on [`ControlSocket::shutdown`].
#[derive(Debug)]
pub struct ControlSocket {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl ControlSocket {
    /// Listens on `path` (mode `mode`, e.g. 0o600) for host commands.
    pub fn start(
        path: &Path,
        mode: u32,
        controller: Arc<Controller>,
    ) -> Result<ControlSocket, StartControlError> {
        let shown = path.display().to_string();
        if let Ok(md) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !md.file_type().is_socket() {
                return Err(StartControlError::NotASocket(shown));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(StartControlError::InUse(shown));
            }
            // A stale socket of an earlier run.
            let _ = std::fs::remove_file(path);
        }
        // Created owner-only, then set to `mode`: nobody else can connect
        // in between.
        let listener =
            crate::sandbox::bind_owner_only(path).map_err(|source| StartControlError::Bind {
                path: shown.clone(),
                source,
            })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o777)).map_err(
            |source| StartControlError::Bind {
                path: shown.clone(),
                source,
            },
        )?;
        listener
            .set_nonblocking(true)
            .map_err(|source| StartControlError::Bind {
                path: shown.clone(),
                source,
            })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = thread::Builder::new()
            .name("cxlfsd-control".into())
            .spawn(move || accept_loop(listener, controller, stop2))
            .map_err(StartControlError::Spawn)?;
        tracing::info!(path = %shown, mode = format_args!("{:o}", mode & 0o777), "control socket up");
        Ok(ControlSocket {
            path: path.to_path_buf(),
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting and removes the socket file. Idempotent.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: UnixListener, controller: Arc<Controller>, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        let fd = listener.as_fd();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(Errno::INTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "poll on the control socket failed");
                thread::sleep(Duration::from_millis(200));
                continue;
            }
        }
        let (mut stream, _) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept on the control socket failed");
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        let peer = peer_cred(&stream);
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            let busy = refusal(
                ErrorCode::Busy,
                format!("too many control connections (at most {MAX_CONNECTIONS})"),
            );
            let _ = stream.write_all(busy.as_bytes());
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let c = controller.clone();
        let a = active.clone();
        let spawned = thread::Builder::new()
            .name("cxlfsd-ctl-conn".into())
            .spawn(move || {
                tracing::debug!(peer_uid = ?peer.map(|p| p.0), peer_pid = ?peer.map(|p| p.1), "control connection");
                serve_connection(stream, &c);
                a.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "cannot spawn a control connection thread");
        }
    }
}

/// `(uid, pid)` of the peer (`SO_PEERCRED`), for the logs.
fn peer_cred(stream: &UnixStream) -> Option<(u32, i32)> {
    use std::os::fd::AsRawFd;
    // SAFETY: ucred is plain data; all-zero is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred`/`len` are valid for writes of `len` bytes; the fd is
    // borrowed from `stream` for the call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some((cred.uid, cred.pid))
}

/// One line of input, bounded.
enum Line {
    /// A complete line (newline stripped).
    Full(Vec<u8>),
    /// Longer than the limit: skipped up to its newline.
    TooLong,
    /// End of input.
    Eof,
}

fn read_line_bounded(r: &mut impl BufRead, max: usize) -> io::Result<Line> {
    let mut buf = Vec::new();
    let mut too_long = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(if too_long {
                Line::TooLong
            } else if buf.is_empty() {
                Line::Eof
            } else {
                Line::Full(buf)
            });
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > max {
                too_long = true;
                buf = Vec::new();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        r.consume(take + usize::from(done));
        if done {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Full(buf)
            });
        }
    }
}

fn serve_connection(stream: UnixStream, controller: &Controller) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot clone a control connection");
            return;
        }
    };
    let mut reader = BufReader::new(stream);
    loop {
        let reply = match read_line_bounded(&mut reader, MAX_REQUEST_LINE) {
            Ok(Line::Eof) => return,
            Ok(Line::TooLong) => refusal(
                ErrorCode::TooLarge,
                format!("request line longer than {MAX_REQUEST_LINE} bytes; ignored"),
            ),
            Ok(Line::Full(line)) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let (reply, until, fd) = controller.handle_line_with_fd(&line);
                controller.wait_until(until);
                if let Some(fd) = fd {
                    // The descriptor rides on the reply's first byte.
                    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
                    if writer
                        .send_with_fd(reply.as_bytes(), fd.as_raw_fd())
                        .map(|n| n == reply.len())
                        .unwrap_or(false)
                    {
                        continue;
                    }
                    return;
                }
                reply
            }
            Err(e) => {
                tracing::debug!(error = %e, "control connection read failed");
                return;
            }
        };
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bounded_lines() {
        let data = b"short\n0123456789abcdef\nok\nlast";
        let mut r = BufReader::with_capacity(4, &data[..]);
        let mut got = Vec::new();
        loop {
            match read_line_bounded(&mut r, 8).unwrap() {
                Line::Full(l) => got.push(String::from_utf8(l).unwrap()),
                Line::TooLong => got.push("<too long>".into()),
                Line::Eof => break,
            }
        }
        assert_eq!(got, ["short", "<too long>", "ok", "last"]);
    }
}
