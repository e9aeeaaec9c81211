//! Keeps an abnormal exit of the serving process from wedging the kernel.
//!
//! The pool is served by the same process that maps it and evicts from it.
//! If that process is SIGKILLed (or crashes) while one of its threads waits
//! in the kernel for a FUSE reply — an eviction's NOTIFY_INVAL_INODE waiting
//! on a dirty page's write-back, or a `close()` waiting on FLUSH — the wait
//! is uninterruptible and the request threads that would answer are already
//! dead. The process then never finishes exiting, and closing `/dev/fuse`
//! (which would abort the connection) never happens.
//!
//! The guard is a small child process forked at mount time from a dedicated
//! thread. It asks the kernel for a signal when that thread dies
//! (`PR_SET_PDEATHSIG`): a thread of a dying process dies with it. On that
//! signal the child aborts the connection through fusectl
//! (`/sys/fs/fuse/connections/N/abort`), which fails every pending request
//! with `ENOTCONN` and unblocks the stuck thread, then detaches the mount.
//! A clean unmount stops the guard with SIGTERM first.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};

/// Where fusectl is mounted on every distribution that has it.
const FUSECTL: &str = "/sys/fs/fuse/connections";

/// Why the guard could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartExitGuardError {
    /// The mountpoint could not be inspected.
    #[error("cannot stat the pool mountpoint {path}")]
    Stat {
        /// The mountpoint.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// fusectl is not mounted and cannot be mounted.
    #[error("fusectl has no entry {0} (is fusectl mounted at /sys/fs/fuse/connections?)")]
    NoFusectl(PathBuf),
    /// A path contained a NUL byte.
    #[error("path {0} contains a NUL byte")]
    Nul(PathBuf),
    /// The guard thread could not be started.
    #[error("cannot start the exit-guard thread")]
    Spawn(#[source] io::Error),
    /// `fork` failed.
    #[error("cannot fork the exit-guard process")]
    Fork(#[source] io::Error),
}

/// The fusectl `abort` file of the connection mounted at `mountpoint`.
/// fusectl names a connection by the kernel's encoding of the superblock's
/// device number (`major << 20 | minor`). The number comes from
/// `/proc/self/mountinfo` (the latest mount on that path), which asks the
/// file system nothing: a connection whose server is gone or stuck cannot
/// hang this. `stat` of the mountpoint is the fall-back.
pub fn fusectl_abort_path(mountpoint: &Path) -> Result<PathBuf, StartExitGuardError> {
    let (major, minor) = match mountinfo_dev(mountpoint) {
        Some(d) => d,
        None => {
            let dev = std::fs::metadata(mountpoint)
                .map_err(|source| StartExitGuardError::Stat {
                    path: mountpoint.to_path_buf(),
                    source,
                })?
                .dev();
            (libc::major(dev), libc::minor(dev))
        }
    };
    let kernel_dev = (u64::from(major) << 20) | u64::from(minor);
    Ok(PathBuf::from(format!("{FUSECTL}/{kernel_dev}/abort")))
}

/// The `major:minor` of the latest mount at `mountpoint` in this
/// process's `/proc/self/mountinfo` (paths there escape blanks as octal;
/// a mountpoint with one is not found and takes the fall-back).
fn mountinfo_dev(mountpoint: &Path) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_str()?;
    parse_mountinfo_dev(&text, want)
}

fn parse_mountinfo_dev(text: &str, mountpoint: &str) -> Option<(u32, u32)> {
    text.lines()
        .rev()
        .find_map(|l| {
            let mut f = l.split(' ');
            let dev = f.nth(2)?;
            let point = f.nth(1)?;
            (point == mountpoint).then_some(dev)
        })
        .and_then(|dev| {
            let (a, b) = dev.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
}

/// Mounts fusectl when its directory exists but is empty (not mounted).
fn ensure_fusectl(abort: &Path) -> Result<(), StartExitGuardError> {
    if abort.exists() {
        return Ok(());
    }
    // SAFETY: constant NUL-terminated strings; a null data pointer is allowed.
    let rc = unsafe {
        libc::mount(
            c"fusectl".as_ptr(),
            c"/sys/fs/fuse/connections".as_ptr(),
            c"fusectl".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "cannot mount fusectl");
    }
    if abort.exists() {
        Ok(())
    } else {
        Err(StartExitGuardError::NoFusectl(abort.to_path_buf()))
    }
}

/// A running guard; dropping it stops the guard process without aborting.
#[derive(Debug)]
pub struct ExitGuard {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    pid: libc::pid_t,
}

impl ExitGuard {
    /// Starts a guard for the FUSE connection mounted at `mountpoint`.
    pub fn start(mountpoint: &Path) -> Result<Self, StartExitGuardError> {
        let abort = fusectl_abort_path(mountpoint)?;
        ensure_fusectl(&abort)?;
        let abort_c = CString::new(abort.as_os_str().as_bytes())
            .map_err(|_| StartExitGuardError::Nul(abort.clone()))?;
        let mount_c = CString::new(mountpoint.as_os_str().as_bytes())
            .map_err(|_| StartExitGuardError::Nul(mountpoint.to_path_buf()))?;
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (pid_tx, pid_rx) = mpsc::channel::<io::Result<libc::pid_t>>();
        let thread = thread::Builder::new()
            .name("pool-exit-guard".into())
            .spawn(move || {
                // SAFETY: no preconditions.
                let parent = unsafe { libc::getpid() };
                // SAFETY: the child only makes async-signal-safe system
                // calls on memory prepared before the fork (see `guard_child`).
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    // SAFETY: we are the freshly forked child; both strings
                    // are valid and were allocated before the fork.
                    unsafe { guard_child(parent, &abort_c, &mount_c) };
                }
                if pid < 0 {
                    let _ = pid_tx.send(Err(io::Error::last_os_error()));
                    return;
                }
                let _ = pid_tx.send(Ok(pid));
                // This thread's life is the guard's lease: it ends only when
                // the plane is dropped (or the whole process dies, which is
                // what the child waits for).
                let _ = stop_rx.recv();
                // SAFETY: signalling and reaping our own child.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                    let mut status = 0;
                    libc::waitpid(pid, &mut status, 0);
                }
            })
            .map_err(StartExitGuardError::Spawn)?;
        let pid = match pid_rx.recv() {
            Ok(Ok(pid)) => pid,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(StartExitGuardError::Fork(e));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(StartExitGuardError::Fork(io::Error::other(
                    "the guard thread ended before forking",
                )));
            }
        };
        tracing::debug!(pid, abort = %abort.display(), "pool exit guard started");
        Ok(ExitGuard {
            stop: Some(stop_tx),
            thread: Some(thread),
            pid,
        })
    }

    /// The guard process's pid.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.stop = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The guard process. Only async-signal-safe system calls: the parent was
/// multi-threaded, so nothing here may allocate or take a lock.
///
/// # Safety
/// Must be called only in a child right after `fork`, with strings that
/// were allocated before the fork.
unsafe fn guard_child(parent: libc::pid_t, abort: &CString, mountpoint: &CString) -> ! {
    // SAFETY: plain system calls on valid pointers; see the function's contract.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        // Hold nothing of the parent's: in particular not `/dev/fuse`, whose
        // last close is the other way the connection ends.
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            for fd in 3..4096 {
                libc::close(fd);
            }
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1 as libc::c_ulong);
        let mut sig = if libc::getppid() != parent {
            libc::SIGUSR1
        } else {
            0
        };
        while sig != libc::SIGUSR1 && sig != libc::SIGTERM {
            sig = libc::sigwaitinfo(&set, std::ptr::null_mut());
        }
        if sig == libc::SIGUSR1 {
            let fd = libc::open(abort.as_ptr(), libc::O_WRONLY);
            if fd >= 0 {
                libc::write(fd, b"1".as_ptr().cast(), 1);
                libc::close(fd);
            }
            libc::umount2(mountpoint.as_ptr(), libc::MNT_DETACH);
        }
        libc::_exit(0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_gives_the_latest_mount_of_a_path() {
        let text = "22 1 0:21 / /proc rw - proc proc rw\n90 22 0:55 / /run/x rw - fuse cxlfs-pool rw\n91 22 0:56 / /run/x rw - fuse cxlfs-pool rw\n";
        assert_eq!(super::parse_mountinfo_dev(text, "/run/x"), Some((0, 56)));
        assert_eq!(super::parse_mountinfo_dev(text, "/run/y"), None);
    }
}
