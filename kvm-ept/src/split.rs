//! A pool plane whose FUSE requests are read by a helper *process*: for a
//! pool that the serving process itself maps (memory mode: a VMM hands its
//! CXL node's memory to the vhost-user back-end in `SET_MEM_TABLE`).
//!
//! Why a process and not threads: unmapping a shared FUSE file waits in the
//! kernel for its dirty pages' write-back (`munmap` → `fuse_vma_close` →
//! `write_inode_now`), holding the unmapping process's `mmap_lock`. If the
//! thread that must answer that `FUSE_WRITE` lives in the same process, it
//! can itself be waiting for the same `mmap_lock` (a page fault, heap growth
//! in `mprotect`): both wait forever, uninterruptibly, and the VMM's exit
//! waits behind them. The helper has its own `mm`, maps no guest memory and
//! never waits for the daemon:
//!
//! * it reads every request from `/dev/fuse` and answers all but `READ`
//!   itself (the protocol of one fixed-size file, as [`crate::FusePoolPlane`]);
//! * a write-back (`FUSE_WRITE`) is stored in the backing store (an fd the
//!   daemon created: a memfd or a sparse file, never a share) and answered
//!   at once; the daemon hears of it afterwards (to charge NAND programs);
//! * a miss (`READ`) is forwarded to the daemon through a queue and a socket
//!   without waiting for anything; the daemon charges the device model and
//!   writes the reply to its own descriptor of the same `/dev/fuse`
//!   connection when the modeled access completes (data from the store).
//!
//! So whatever the daemon's threads wait for, write-backs are answered, and
//! every `munmap` — the daemon's, the VMM's, an exiting process's — ends.
//! Notifications (`NOTIFY_STORE` / `NOTIFY_INVAL_INODE`) stay with the
//! daemon's notifier thread as in [`crate::FusePoolPlane`].
//!
//! The helper is the program given by [`HelperCommand`] (by default the
//! daemon's own executable), run with [`HELPER_ENV`] set; its `main` must
//! call [`helper_main_if_requested`] before anything else. It dies when the
//! daemon closes its end of the socket (or exits).

use crate::fuse_plane::{Outcome, Server};
use crate::{Miss, MissReply, PoolBackend, ServeMissError, WritebackError};
use fuse_abi::zerocopy::{FromBytes, IntoBytes};
use fuse_abi::{opcode, Cursor, InHeader};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread;
use zerocopy::{Immutable, KnownLayout};

/// The environment variable that makes a program a plane helper: its value
/// says which inherited descriptors to use (`dev=N sock=N store=N size=N`).
pub const HELPER_ENV: &str = "CXLFS_PLANE_HELPER";

/// Request threads of a helper: each only reads, forwards or stores, never
/// waits on the daemon, so a few are enough for any number of vCPUs.
const HELPER_READERS: usize = 4;

/// What a forwarded message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum ForwardKind {
    /// A `FUSE_READ` (a miss); the raw request follows the header.
    Read = 1,
    /// A write-back the helper stored: `offset`, `len`, `pid`.
    Stored = 2,
}

/// The header of every helper → daemon message (one `SOCK_SEQPACKET`
/// record each).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub(crate) struct Forward {
    /// [`ForwardKind`].
    pub kind: u32,
    /// The requesting thread (FUSE header pid).
    pub pid: u32,
    /// When the request reached the helper (`CLOCK_MONOTONIC` ns).
    pub mono_ns: u64,
    /// Pool offset (`Stored`).
    pub offset: u64,
    /// Bytes (`Stored`).
    pub len: u64,
}

/// Bytes of [`Forward`].
pub(crate) const FORWARD_LEN: usize = std::mem::size_of::<Forward>();

/// Largest record: the header plus a READ request (80 bytes) with room.
pub(crate) const MAX_FORWARD: usize = FORWARD_LEN + 512;

/// `CLOCK_MONOTONIC` in ns: the one clock both processes read.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// How to start a helper: a program whose `main` calls
/// [`helper_main_if_requested`] first.
#[derive(Debug, Clone)]
pub struct HelperCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments (the helper ignores them; a test harness may need some).
    pub args: Vec<OsString>,
}

impl HelperCommand {
    /// The running executable (`/proc/self/exe`, resolved by the kernel at
    /// `execve`, so it works in any mount namespace).
    pub fn current_exe() -> Self {
        HelperCommand {
            program: PathBuf::from("/proc/self/exe"),
            args: Vec::new(),
        }
    }
}

/// Why a helper could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnHelperError {
    /// `socketpair` failed.
    #[error("cannot create the helper's socket pair")]
    Socket(#[source] io::Error),
    /// The program could not be run.
    #[error("cannot start the plane helper {program}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// A `SOCK_SEQPACKET` pair (close-on-exec): record boundaries are kept, so
/// one `read` is one message.
fn seqpacket_pair() -> io::Result<(File, File)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid out array of two ints.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// A running helper and the daemon's end of its socket.
#[derive(Debug)]
pub(crate) struct Helper {
    pub child: Child,
    pub sock: Arc<File>,
}

impl Helper {
    /// Starts `cmd` as the helper of the connection on `dev`, storing
    /// write-backs in `store`, for a pool file of `size` bytes.
    pub fn spawn(
        cmd: &HelperCommand,
        dev: &File,
        store: &File,
        size: u64,
    ) -> Result<Self, SpawnHelperError> {
        let (ours, theirs) = seqpacket_pair().map_err(SpawnHelperError::Socket)?;
        let fds = [dev.as_raw_fd(), theirs.as_raw_fd(), store.as_raw_fd()];
        let spec = format!(
            "dev={} sock={} store={} size={size}",
            fds[0], fds[1], fds[2]
        );
        let mut c = Command::new(&cmd.program);
        c.args(&cmd.args).env(HELPER_ENV, spec).stdin(Stdio::null());
        // SAFETY: the closure runs in the child between fork and exec and
        // makes only async-signal-safe calls (fcntl) on fds it inherited.
        unsafe {
            c.pre_exec(move || {
                for fd in fds {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = c.spawn().map_err(|source| SpawnHelperError::Spawn {
            program: cmd.program.clone(),
            source,
        })?;
        drop(theirs);
        tracing::info!(pid = child.id(), size, "pool plane helper started");
        Ok(Helper {
            child,
            sock: Arc::new(ours),
        })
    }

    /// Ends the helper: closes the socket both ways (its main thread sees
    /// the end and exits), then reaps it (killed if it is still there
    /// after two seconds).
    pub fn stop(&mut self) {
        // SAFETY: shutdown on a socket fd we own; no pointers.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if std::time::Instant::now() < deadline => {
                    thread::sleep(std::time::Duration::from_millis(5))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
            }
        }
    }
}

/// Reads one forwarded record from the daemon's end; `None` at the end.
pub(crate) fn recv_forward(sock: &File, buf: &mut [u8]) -> Option<(Forward, usize)> {
    loop {
        match (&*sock).read(buf) {
            Ok(0) => return None,
            Ok(n) => {
                let (f, _) = Forward::read_from_prefix(&buf[..n]).ok()?;
                return Some((f, n));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
}

/// The helper's backend: stores write-backs, never serves a miss (the
/// reader forwards every READ before it reaches the server).
struct StoreBackend {
    store: File,
    to_daemon: Sender<Vec<u8>>,
}

impl PoolBackend for StoreBackend {
    fn now_ns(&self) -> u64 {
        monotonic_ns()
    }

    fn on_miss(&self, _: &Miss, _: &mut [u8]) -> Result<MissReply, ServeMissError> {
        Err(ServeMissError::Device(
            "a plane helper forwards misses to the daemon".into(),
        ))
    }

    fn on_writeback(
        &self,
        pool_offset: u64,
        data: &[u8],
        pid: u32,
        arrival_ns: u64,
    ) -> Result<u64, WritebackError> {
        self.store.write_all_at(data, pool_offset)?;
        let f = Forward {
            kind: ForwardKind::Stored as u32,
            pid,
            mono_ns: arrival_ns,
            offset: pool_offset,
            len: data.len() as u64,
        };
        // The daemon gone: the write is stored all the same.
        let _ = self.to_daemon.send(f.as_bytes().to_vec());
        Ok(arrival_ns)
    }
}

/// Parsed [`HELPER_ENV`].
struct HelperSpec {
    dev: RawFd,
    sock: RawFd,
    store: RawFd,
    size: u64,
}

fn parse_spec(s: &str) -> Option<HelperSpec> {
    let mut spec = HelperSpec {
        dev: -1,
        sock: -1,
        store: -1,
        size: 0,
    };
    for part in s.split_whitespace() {
        let (k, v) = part.split_once('=')?;
        match k {
            "dev" => spec.dev = v.parse().ok()?,
            "sock" => spec.sock = v.parse().ok()?,
            "store" => spec.store = v.parse().ok()?,
            "size" => spec.size = v.parse().ok()?,
            _ => return None,
        }
    }
    (spec.dev >= 0 && spec.sock >= 0 && spec.store >= 0 && spec.size > 0).then_some(spec)
}

/// If this process was started as a plane helper ([`HELPER_ENV`] set),
/// serves until the daemon goes away and exits; otherwise returns at once.
/// Call it first thing in `main`, before any thread starts.
pub fn helper_main_if_requested() {
    let Some(spec) = std::env::var_os(HELPER_ENV) else {
        return;
    };
    let code = match spec.to_str().and_then(parse_spec) {
        Some(spec) => {
            run_helper(spec);
            0
        }
        None => {
            eprintln!("cxlfs plane helper: malformed {HELPER_ENV}");
            2
        }
    };
    std::process::exit(code);
}

fn run_helper(spec: HelperSpec) {
    // SAFETY: a plain prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    // SAFETY: the daemon handed these three fds to this process alone
    // (HELPER_ENV names them); each is wrapped exactly once.
    let (dev, sock, store) = unsafe {
        (
            Arc::new(File::from_raw_fd(spec.dev)),
            Arc::new(File::from_raw_fd(spec.sock)),
            File::from_raw_fd(spec.store),
        )
    };
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let server = Arc::new(Server::new(
        Arc::new(StoreBackend {
            store,
            to_daemon: tx.clone(),
        }),
        spec.size,
    ));
    {
        let sock = sock.clone();
        // A forwarder that blocks on a full socket holds up no reader.
        let _ = thread::Builder::new()
            .name("plane-forward".into())
            .spawn(move || forward(&sock, rx));
    }
    for i in 0..HELPER_READERS {
        let (server, dev, tx) = (server.clone(), dev.clone(), tx.clone());
        let _ = thread::Builder::new()
            .name(format!("plane-req{i}"))
            .spawn(move || helper_reader(&server, &dev, &tx));
    }
    drop(tx);
    // The daemon sends nothing; its end closing (or its exit) ends us.
    let mut buf = [0u8; 64];
    loop {
        match (&*sock).read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn forward(sock: &File, rx: Receiver<Vec<u8>>) {
    for msg in rx {
        if (&*sock).write(&msg).is_err() {
            // The daemon is gone: the main thread ends the process.
            return;
        }
    }
}

fn helper_reader(server: &Server, dev: &File, to_daemon: &Sender<Vec<u8>>) {
    let mut buf =
        vec![0u8; fuse_abi::MIN_READ_BUFFER.max(crate::fuse_plane::MAX_WRITE as usize + 4096)];
    let mut out = Vec::with_capacity(fuse_abi::OUT_HEADER_LEN + 4096);
    loop {
        let n = match (&*dev).read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::ENOENT) | Some(libc::EAGAIN) => continue,
                _ => return, // ENODEV: the connection ended
            },
        };
        let arrival = monotonic_ns();
        let req = &buf[..n];
        let is_read = InHeader::parse(&mut Cursor::new(req))
            .map(|h| h.opcode == opcode::READ)
            .unwrap_or(false);
        if is_read && n + std::mem::size_of::<Forward>() <= MAX_FORWARD {
            let h = Forward {
                kind: ForwardKind::Read as u32,
                mono_ns: arrival,
                ..Forward::default()
            };
            let mut msg = Vec::with_capacity(std::mem::size_of::<Forward>() + n);
            msg.extend_from_slice(h.as_bytes());
            msg.extend_from_slice(req);
            if to_daemon.send(msg).is_err() {
                return;
            }
            continue;
        }
        match server.handle(req, arrival, &mut out) {
            Outcome::None => {}
            Outcome::Reply | Outcome::ReplyAt(_) | Outcome::ReplyAndExit => {
                crate::fuse_plane::write_reply(dev, &out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_round_trips_and_rejects_garbage() {
        let s = parse_spec("dev=3 sock=4 store=5 size=8192").expect("parses");
        assert_eq!((s.dev, s.sock, s.store, s.size), (3, 4, 5, 8192));
        assert!(parse_spec("dev=3 sock=4 size=8192").is_none());
        assert!(parse_spec("dev=3 sock=4 store=5 size=0").is_none());
        assert!(parse_spec("dev=x sock=4 store=5 size=1").is_none());
        assert!(parse_spec("dev=3 sock=4 store=5 size=1 other=2").is_none());
    }

    #[test]
    fn a_forward_header_is_what_the_receiver_reads() {
        let f = Forward {
            kind: ForwardKind::Stored as u32,
            pid: 7,
            mono_ns: 11,
            offset: 4096,
            len: 8192,
        };
        let (a, b) = seqpacket_pair().expect("socketpair");
        (&a).write_all(f.as_bytes()).expect("send");
        let mut buf = [0u8; MAX_FORWARD];
        let (g, n) = recv_forward(&b, &mut buf).expect("one record");
        assert_eq!(n, std::mem::size_of::<Forward>());
        assert_eq!(
            (g.kind, g.pid, g.mono_ns, g.offset, g.len),
            (2, 7, 11, 4096, 8192)
        );
        drop(a);
        assert!(
            recv_forward(&b, &mut buf).is_none(),
            "end of the peer = None"
        );
    }
}
