//! The link between a split plane's two processes (the module `split`
//! says why there are two): the forwarded-message format, the helper's
//! command and its spawning. A leaf: both the daemon's side (the pool
//! plane's `mount_split`) and the helper's side use it.

use fuse_abi::zerocopy::{FromBytes, IntoBytes};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use zerocopy::{Immutable, KnownLayout};

pub use crate::helper_seccomp::SeccompMode;

/// The environment variable that makes a program a plane helper: its value
/// says which inherited descriptors to use (`dev=N sock=N store=N size=N`,
/// and `ra=N`: the readahead map, where the plane refuses readahead),
/// `seccomp=kill|log|trap|none`, and `ring=1` where its INIT may offer
/// FUSE over io_uring.
pub const HELPER_ENV: &str = "CXLFS_PLANE_HELPER";

/// What a forwarded message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum ForwardKind {
    /// A `FUSE_READ` (a miss); the raw request follows the header.
    Read = 1,
    /// A write-back the helper stored: `offset`, `len`, `pid`.
    Stored = 2,
    /// A `FUSE_READ` that arrived on the helper's ring: answered with a
    /// [`Verdict`] and the reply on the same socket (the helper commits
    /// it when due); the raw request follows the header.
    ReadRing = 3,
    /// A `FUSE_READ` the helper answered itself from the store (its ring
    /// had no entry to spare): charged, never answered.
    ReadServed = 4,
    /// The helper's transport, once it serves: `queues`.
    Hello = 5,
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
    /// A READ: how long before `mono_ns` the same thread's first refused
    /// READ arrived (the fault began then), 0 if none.
    pub lead_ns: u64,
    /// `Hello`: the helper's ring queues (0: `/dev/fuse`).
    pub queues: u64,
}

/// Bytes of [`Forward`].
pub(crate) const FORWARD_LEN: usize = std::mem::size_of::<Forward>();

/// The header of a daemon → helper reply to a [`ForwardKind::ReadRing`]
/// (one `SOCK_SEQPACKET` record: this, then the whole FUSE reply).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub(crate) struct Verdict {
    /// The request's `unique`.
    pub unique: u64,
    /// When the helper is to commit the reply (`CLOCK_MONOTONIC` ns).
    pub due_mono_ns: u64,
}

/// Bytes of [`Verdict`].
pub(crate) const VERDICT_LEN: usize = std::mem::size_of::<Verdict>();

/// Largest verdict record: the header, the FUSE out-header and a read of
/// 128 KiB (a plane's `max_write`, which the plane asserts fits).
pub(crate) const MAX_VERDICT: usize = VERDICT_LEN + fuse_abi::OUT_HEADER_LEN + (128 << 10);

/// Most sockets (CPUs) a helper gets.
pub(crate) const MAX_SOCKETS: usize = 64;

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
/// `helper_main_if_requested` first.
#[derive(Debug, Clone)]
pub struct HelperCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments (the helper ignores them; a test harness may need some).
    pub args: Vec<OsString>,
    /// What a call outside the helper's allow-list does
    /// ([`crate::helper_seccomp`]).
    pub seccomp: SeccompMode,
}

impl HelperCommand {
    /// The running executable (`/proc/self/exe`, resolved by the kernel at
    /// `execve`, so it works in any mount namespace).
    pub fn current_exe() -> Self {
        HelperCommand {
            program: PathBuf::from("/proc/self/exe"),
            args: Vec::new(),
            seccomp: SeccompMode::Kill,
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
pub(crate) fn seqpacket_pair() -> io::Result<(File, File)> {
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

/// A running helper and the daemon's ends of its sockets (one per CPU:
/// the helper sends on the socket of the CPU it runs on, whose receiver
/// the daemon pins there).
#[derive(Debug)]
pub(crate) struct Helper {
    pub child: Child,
    pub socks: Vec<Arc<File>>,
}

/// Sockets for a helper: one per possible CPU (the kernel's ring queues)
/// and configured CPU, at most [`MAX_SOCKETS`].
pub(crate) fn socket_count() -> usize {
    // SAFETY: sysconf with a constant name; no pointers.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n)
        .unwrap_or(1)
        .max(crate::uring::possible_cpus())
        .clamp(1, MAX_SOCKETS)
}

impl Helper {
    /// Starts `cmd` as the helper of the connection on `dev`, storing
    /// write-backs in `store`, refusing readahead on the shared map
    /// `refusals` (if any), for a pool file of `size` bytes; `ring`: its
    /// INIT offers FUSE over io_uring.
    pub fn spawn(
        cmd: &HelperCommand,
        dev: &File,
        store: &File,
        refusals: Option<&File>,
        size: u64,
        ring: bool,
    ) -> Result<Self, SpawnHelperError> {
        let pairs = (0..socket_count())
            .map(|_| seqpacket_pair())
            .collect::<io::Result<Vec<_>>>()
            .map_err(SpawnHelperError::Socket)?;
        let (ours, theirs): (Vec<File>, Vec<File>) = pairs.into_iter().unzip();
        let ra = refusals.map_or(-1, |f| f.as_raw_fd());
        let mut fds = vec![dev.as_raw_fd(), store.as_raw_fd(), ra];
        fds.extend(theirs.iter().map(|f| f.as_raw_fd()));
        let socks = theirs
            .iter()
            .map(|f| f.as_raw_fd().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut spec = format!(
            "dev={} sock={socks} store={} size={size} seccomp={}",
            fds[0], fds[1], cmd.seccomp
        );
        if ra >= 0 {
            spec.push_str(&format!(" ra={ra}"));
        }
        if ring {
            spec.push_str(" ring=1");
        }
        let mut c = Command::new(&cmd.program);
        c.args(&cmd.args).env(HELPER_ENV, spec).stdin(Stdio::null());
        // SAFETY: the closure runs in the child between fork and exec and
        // makes only async-signal-safe calls (fcntl) on fds it inherited.
        unsafe {
            c.pre_exec(move || {
                for &fd in fds.iter().filter(|&&fd| fd >= 0) {
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
            socks: ours.into_iter().map(Arc::new).collect(),
        })
    }

    /// Ends the helper: closes the socket both ways (its main thread sees
    /// the end and exits), then reaps it (killed if it is still there
    /// after two seconds).
    pub fn stop(&mut self) {
        for s in &self.socks {
            // SAFETY: shutdown on a socket fd we own; no pointers.
            unsafe { libc::shutdown(s.as_raw_fd(), libc::SHUT_RDWR) };
        }
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
