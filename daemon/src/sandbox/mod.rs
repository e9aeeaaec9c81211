//! The sandbox, in virtiofsd's order: everything the daemon needs from the
//! host is opened first (`/dev/fuse` and the pool mount, the sockets, the
//! metrics file); then [`prepare`] (before any thread: file-descriptor limit,
//! a private mount namespace), [`enter`] (a new root holding only the
//! shares, `/proc` and fusectl), [`drop_capabilities`] (every thread keeps
//! only what the data path needs) and [`seccomp::install`] (an allow-list
//! on every thread).
//!
//! Not a PID namespace (virtiofsd has one): the residency plane attributes
//! a trap to its VM by the faulting VMM's pid, which a FUSE request carries
//! translated into the server's PID namespace; from a child namespace the
//! VMMs' pids would all read 0.

pub mod caps;
pub mod seccomp;

use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use caps::{drop_capabilities, DropCapabilitiesError};
pub use seccomp::{InstallSeccompError, SeccompMode};

/// How the daemon confines itself (virtiofsd's `--sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// A private mount namespace whose root holds only the shares, `/proc`
    /// and fusectl (`pivot_root`); other host paths are unreachable.
    #[default]
    Namespace,
    /// No file-system confinement (capabilities and seccomp still apply).
    None,
}

impl std::str::FromStr for SandboxMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "namespace" => Ok(SandboxMode::Namespace),
            "none" => Ok(SandboxMode::None),
            "chroot" => Err("--sandbox chroot is not supported: it would need every \
                 session to be opened from descriptors taken before the chroot; use \
                 namespace (the default) or none"
                .into()),
            other => Err(format!("unknown sandbox mode {other:?} (namespace, none)")),
        }
    }
}

impl std::fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SandboxMode::Namespace => "namespace",
            SandboxMode::None => "none",
        })
    }
}

/// Why the sandbox could not be prepared or entered.
#[derive(Debug, thiserror::Error)]
pub enum EnterSandboxError {
    /// A namespace must be made before any thread exists (namespaces are
    /// per thread).
    #[error("the sandbox must be prepared before any thread starts ({0} threads running)")]
    Threads(usize),
    /// `setrlimit(RLIMIT_NOFILE)` failed.
    #[error("cannot raise the open-file limit")]
    RaiseFileLimit(#[source] io::Error),
    /// `unshare` failed (no CAP_SYS_ADMIN, or namespaces disabled).
    #[error("cannot create a mount namespace (run as root, or pass --sandbox none)")]
    Unshare(#[source] io::Error),
    /// A mount step failed.
    #[error("sandbox: cannot {what} {path}")]
    Mount {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// `pivot_root` into the new root failed.
    #[error("sandbox: cannot pivot_root into {0}")]
    PivotRoot(PathBuf, #[source] io::Error),
    /// A path to keep is not absolute or not a directory.
    #[error("sandbox: {0} is not an absolute path to a directory")]
    NotADirectory(PathBuf),
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn mount_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> EnterSandboxError {
    let path = path.to_path_buf();
    move |source| EnterSandboxError::Mount { what, path, source }
}

/// `mount(2)`: `src`, `fstype` and `data` may be absent (null).
pub(crate) fn mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = src.map(cstr).transpose()?;
    let target = cstr(target)?;
    let fstype = fstype
        .map(CString::new)
        .transpose()
        .map_err(io::Error::other)?;
    let data = data
        .map(CString::new)
        .transpose()
        .map_err(io::Error::other)?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that
    // outlives the call.
    let rc = unsafe {
        libc::mount(
            ptr(&src),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Raises the open-file limit (every VM's inodes are held as
/// descriptors): to `fs.nr_open` where the process may raise its hard
/// limit (CAP_SYS_RESOURCE, before the capabilities are dropped), else the
/// soft limit to the hard one. Returns the new limit.
pub(crate) fn raise_file_limit() -> Result<u64, EnterSandboxError> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(EnterSandboxError::RaiseFileLimit(io::Error::last_os_error()));
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
        .unwrap_or(lim.rlim_max)
        .max(lim.rlim_max);
    let mut last = None;
    for max in [nr_open, lim.rlim_max] {
        if lim.rlim_cur >= max {
            return Ok(lim.rlim_cur);
        }
        let want = libc::rlimit {
            rlim_cur: max,
            rlim_max: max,
        };
        // SAFETY: `want` is a valid, initialised rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            return Ok(max);
        }
        last = Some(io::Error::last_os_error());
    }
    Err(EnterSandboxError::RaiseFileLimit(
        last.unwrap_or_else(|| io::Error::other("no limit to raise")),
    ))
}

/// First step, before any thread exists: raises the open-file limit and,
/// in [`SandboxMode::Namespace`], moves the process into a private mount
/// and IPC namespace whose mounts receive the host's but never propagate
/// back (so the pool mount, and every later one, is invisible outside).
pub fn prepare(mode: SandboxMode) -> Result<u64, EnterSandboxError> {
    let limit = raise_file_limit()?;
    if mode == SandboxMode::Namespace {
        let n = threads();
        if n != 1 {
            return Err(EnterSandboxError::Threads(n));
        }
        // SAFETY: unshare has no memory arguments; single-threaded here.
        if unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC) } != 0 {
            return Err(EnterSandboxError::Unshare(io::Error::last_os_error()));
        }
        let root = Path::new("/");
        mount(None, root, None, libc::MS_SLAVE | libc::MS_REC, None)
            .map_err(mount_err("make slave", root))?;
    }
    Ok(limit)
}

/// What the new root keeps of the host: directories bound read-write at
/// the same absolute paths, so no path the daemon holds changes meaning.
#[derive(Debug, Default, Clone)]
pub struct Keep {
    /// The shared directories.
    pub dirs: Vec<PathBuf>,
}

/// Where the new root is built (an owner-only directory, removed from the
/// host once the daemon is inside).
fn new_root_dir() -> PathBuf {
    PathBuf::from(format!("/run/cxlfsd/sandbox-{}", std::process::id()))
}

/// Makes `path` (absolute) and its parents under `root`.
fn mirror_dir(root: &Path, path: &Path) -> Result<PathBuf, EnterSandboxError> {
    let rel = path
        .strip_prefix("/")
        .map_err(|_| EnterSandboxError::NotADirectory(path.to_path_buf()))?;
    let at = root.join(rel);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&at)
        .map_err(mount_err("create", &at))?;
    Ok(at)
}

/// Second step ([`SandboxMode::Namespace`] only; a no-op otherwise): builds
/// a tmpfs root holding `keep`'s directories, a fresh `/proc` and fusectl
/// (the pool's exit guard aborts the connection there), pivots into it and
/// detaches the old root. Threads already running move with the process.
pub fn enter(mode: SandboxMode, keep: &Keep) -> Result<(), EnterSandboxError> {
    if mode != SandboxMode::Namespace {
        return Ok(());
    }
    for d in &keep.dirs {
        if !d.is_absolute() || !d.is_dir() {
            return Err(EnterSandboxError::NotADirectory(d.clone()));
        }
    }
    let root = new_root_dir();
    let parent = root.parent().unwrap_or(Path::new("/")).to_path_buf();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&root)
        .map_err(mount_err("create", &root))?;
    // Held across the pivot: the host's `/run/cxlfsd`, to remove the
    // (then empty) root directory from the host afterwards.
    let parent_fd: OwnedFd = rustix::fs::open(
        &parent,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| EnterSandboxError::Mount {
        what: "open",
        path: parent.clone(),
        source: e.into(),
    })?;
    mount(
        Some(Path::new("cxlfsd-root")),
        &root,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("mode=0755,size=1m,nr_inodes=4096"),
    )
    .map_err(mount_err("mount a tmpfs on", &root))?;
    // Parents before children: a later bind of a parent would hide an
    // earlier one of its child.
    let mut dirs = keep.dirs.clone();
    dirs.sort_by(|a, b| (a.components().count(), a).cmp(&(b.components().count(), b)));
    dirs.dedup();
    for d in &dirs {
        let at = mirror_dir(&root, d)?;
        mount(Some(d), &at, None, libc::MS_BIND | libc::MS_REC, None)
            .map_err(mount_err("bind", d))?;
    }
    let proc = mirror_dir(&root, Path::new("/proc"))?;
    mount(
        Some(Path::new("proc")),
        &proc,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(mount_err("mount proc on", &proc))?;
    let fusectl = Path::new("/sys/fs/fuse/connections");
    if fusectl.is_dir() {
        let at = mirror_dir(&root, fusectl)?;
        mount(Some(fusectl), &at, None, libc::MS_BIND, None).map_err(mount_err("bind", fusectl))?;
    }
    pivot_into(&root)?;
    // The old root is gone from this namespace, so the directory the new
    // one was mounted on is an ordinary empty directory on the host.
    if let Some(name) = root.file_name() {
        if let Err(e) = rustix::fs::unlinkat(&parent_fd, name, rustix::fs::AtFlags::REMOVEDIR) {
            tracing::debug!(error = %e, dir = %root.display(), "cannot remove the sandbox root's host directory");
        }
    }
    // Nothing is created in the root itself from now on.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
        None,
    )
    .map_err(mount_err("remount read-only", Path::new("/")))?;
    tracing::info!(
        kept = ?keep.dirs,
        "sandbox: private mount namespace, root holds the shares, /proc and fusectl"
    );
    Ok(())
}

/// `pivot_root(".", ".")` (the old root stacks on the new one) and a lazy
/// unmount of the old root, as virtiofsd does.
fn pivot_into(root: &Path) -> Result<(), EnterSandboxError> {
    let err = |e: io::Error| EnterSandboxError::PivotRoot(root.to_path_buf(), e);
    std::env::set_current_dir(root).map_err(err)?;
    let dot = c".";
    // SAFETY: valid NUL-terminated strings.
    if unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) } != 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: valid NUL-terminated string.
    if unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(err(io::Error::last_os_error()));
    }
    std::env::set_current_dir("/").map_err(err)?;
    Ok(())
}

/// Host paths the daemon removes at exit although the sandbox hides them
/// (its sockets): each is remembered as its parent directory's descriptor,
/// taken before the sandbox, and the name in it.
#[derive(Debug, Default)]
pub struct Leftovers(Vec<(OwnedFd, std::ffi::OsString)>);

impl Leftovers {
    /// Remembers `path` (ignored if its directory cannot be opened).
    pub fn remember(&mut self, path: &Path) {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return;
        };
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        match rustix::fs::open(
            dir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            Ok(fd) => self.0.push((fd, name.to_os_string())),
            Err(e) => {
                tracing::debug!(error = %e, path = %path.display(), "cannot remember a path to remove at exit")
            }
        }
    }

    /// Removes every remembered name.
    pub fn remove_all(self) {
        for (dir, name) in self.0 {
            if let Err(e) = rustix::fs::unlinkat(&dir, &name, rustix::fs::AtFlags::empty()) {
                tracing::debug!(error = %e, name = ?name, "cannot remove at exit");
            }
        }
    }
}

/// A Unix socket at `path` that only the daemon's user can connect to,
/// whatever the umask and without changing it (the umask is process-wide):
/// bound in a fresh owner-only directory beside `path`, set to 0600, then
/// renamed over `path` (replacing a stale socket of an earlier run), so no
/// other user can connect at any moment.
pub(crate) fn bind_owner_only(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let private = parent.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let staged = private.join("sock");
    let bound = std::os::unix::net::UnixListener::bind(&staged).and_then(|l| {
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&staged, path)?;
        Ok(l)
    });
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    bound
}
