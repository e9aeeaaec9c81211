//! The real `cxlfsd` binary, confined: a private mount namespace whose root
//! holds only the share, no CAP_SYS_ADMIN on any thread, a seccomp filter,
//! owner-only sockets whatever the umask, a pool no path or other user
//! reaches — and it still serves a real vhost-user front-end.

#![allow(clippy::unwrap_used)]

mod common;

use common::{skip_or_fail, Guest};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CAP_SYS_ADMIN: u64 = 1 << 21;

struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.path("cxlfsd.log")).unwrap_or_default()
    }
    /// SIGTERM, then the exit status within 30 s.
    fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "no exit after SIGTERM\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn root_or_skip() -> bool {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        skip_or_fail("the sandbox tests need root and /dev/fuse");
        return false;
    }
    true
}

/// Starts cxlfsd under umask 0 with a share holding `hello.txt`.
fn start(extra: &[&str]) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    std::fs::write(share.join("hello.txt"), b"hello from the host\n").unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cxlfsd"));
    cmd.arg("--shared-dir")
        .arg(&share)
        .arg("--vm")
        .arg(format!("vm0={}", dir.path().join("vm0.sock").display()))
        .arg("--control-socket")
        .arg(dir.path().join("control.sock"))
        .args(extra)
        .stdin(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.path().join("cxlfsd.log")).unwrap(),
        ));
    // SAFETY: umask(2) is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        })
    };
    let child = cmd.spawn().unwrap();
    let d = Daemon { child, dir };
    let t = Instant::now();
    while !d.log().contains("confined; serving") {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "cxlfsd did not come up\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    d
}

fn status_field(status: &str, key: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("{key} missing in {status}"))
        .trim()
        .to_string()
}

/// Every thread: a seccomp filter, no CAP_SYS_ADMIN effective, permitted
/// or in the bounding set.
fn assert_confined_threads(pid: u32) {
    let tasks: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(tasks.len() > 3, "expected a multi-threaded daemon");
    for t in tasks {
        // A thread may have ended since the listing.
        let Ok(status) = std::fs::read_to_string(t.join("status")) else {
            continue;
        };
        assert_eq!(status_field(&status, "Seccomp"), "2", "{}", t.display());
        for set in ["CapEff", "CapPrm", "CapBnd"] {
            let v = u64::from_str_radix(&status_field(&status, set), 16).unwrap();
            assert_eq!(v & CAP_SYS_ADMIN, 0, "{} {set} {v:#x}", t.display());
        }
    }
}

/// Reads hello.txt through the vhost-user socket.
fn read_hello(sock: &Path) -> Vec<u8> {
    let mut g = Guest::connect(sock);
    g.init();
    let node = g.lookup("hello.txt");
    let fh = g.open(node);
    g.read(node, fh, 0, 4096).0
}

/// Whether user `nobody` can open `path` (in a forked child).
fn nobody_can_open(path: &Path) -> bool {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: the child only makes async-signal-safe calls, then _exit.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            let ok = libc::setgid(65534) == 0 && libc::setuid(65534) == 0;
            let fd = if ok {
                libc::open(c.as_ptr(), libc::O_RDONLY)
            } else {
                -1
            };
            libc::_exit(if ok && fd >= 0 { 0 } else { 1 });
        }
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0
    }
}

#[test]
fn namespace_sandbox_serves_without_admin_rights_and_hides_the_pool() {
    if !root_or_skip() {
        return;
    }
    let mut d = start(&[]);
    let pid = d.pid();
    assert_eq!(read_hello(&d.path("vm0.sock")), b"hello from the host\n");
    assert_confined_threads(pid);
    assert!(
        d.log().contains("sandbox=namespace seccomp=kill"),
        "{}",
        d.log()
    );

    // Owner-only sockets although the daemon's umask is 0.
    for s in ["vm0.sock", "control.sock"] {
        let mode = std::fs::metadata(d.path(s)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{s}: {mode:o}");
    }

    // Its own mount namespace: a tmpfs root with the share, /proc and
    // fusectl; the pool is mounted nowhere, there or here.
    let own = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(own, std::fs::read_link("/proc/self/ns/mnt").unwrap());
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root_line = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .unwrap();
    assert!(root_line.contains("tmpfs cxlfsd-root"), "{mounts}");
    let share = std::fs::canonicalize(d.path("share")).unwrap();
    assert!(
        mounts.contains(&format!(" {} ", share.display())),
        "{mounts}"
    );
    assert!(!mounts.contains("cxlfs-pool"), "{mounts}");
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !host.contains(&format!("/pool-{pid} ")),
        "pool visible on the host"
    );
    assert!(!Path::new(&format!("/run/cxlfsd/pool-{pid}")).exists());
    assert!(!Path::new(&format!("/run/cxlfsd/sandbox-{pid}")).exists());

    // The only way left to the pool is the daemon's own descriptor:
    // another user cannot open it through /proc.
    let pool_fd = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read_link(p).is_ok_and(|t| t.ends_with("pool")))
        .expect("the daemon holds the pool open");
    assert!(
        !nobody_can_open(&pool_fd),
        "nobody opened {}",
        pool_fd.display()
    );
    assert!(!nobody_can_open(&d.path("vm0.sock")));

    let st = d.stop();
    assert!(st.success(), "{st}\n{}", d.log());
    assert!(d.log().contains("clean shutdown"), "{}", d.log());
    for s in ["vm0.sock", "control.sock"] {
        assert!(!d.path(s).exists(), "{s} left behind");
    }
}

#[test]
fn without_a_namespace_capabilities_and_seccomp_still_apply() {
    if !root_or_skip() {
        return;
    }
    let mut d = start(&["--sandbox", "none"]);
    let pid = d.pid();
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap(),
        std::fs::read_link("/proc/self/ns/mnt").unwrap()
    );
    assert_eq!(read_hello(&d.path("vm0.sock")), b"hello from the host\n");
    assert_confined_threads(pid);
    // Detached: no path leads to the pool even in the host's namespace.
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !host.contains(&format!("/pool-{pid} ")),
        "pool mounted on the host"
    );
    assert!(d.stop().success(), "{}", d.log());
}

#[test]
fn chroot_mode_is_refused_with_a_reason() {
    let out = Command::new(env!("CARGO_BIN_EXE_cxlfsd"))
        .args([
            "--sandbox",
            "chroot",
            "--shared-dir",
            "/",
            "--vm",
            "a=/nonexistent/a.sock",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chroot is not supported"), "{err}");
}

/// Memory mode: a VM's CXL memory region is reachable by path nowhere and
/// by descriptor only for the daemon's own user: neither the daemon's nor
/// its plane helper's descriptors of the region file or its backing store
/// open for another user.
#[test]
fn a_memory_region_is_reachable_only_through_the_daemons_descriptors() {
    if !root_or_skip() {
        return;
    }
    let mut d = start(&["--cxl-memory", "vm0=4MiB"]);
    let pid = d.pid();
    assert_eq!(read_hello(&d.path("vm0.sock")), b"hello from the host\n");
    let children: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect::<Vec<u32>>()
        })
        .collect();
    let helpers: Vec<u32> = children
        .into_iter()
        .filter(|c| {
            std::fs::read(format!("/proc/{c}/environ"))
                .is_ok_and(|e| e.windows(18).any(|w| w == b"CXLFS_PLANE_HELPER"))
        })
        .collect();
    assert_eq!(helpers.len(), 1, "one plane helper for the one region");
    let mut checked = 0;
    for p in std::iter::once(pid).chain(helpers) {
        for fd in std::fs::read_dir(format!("/proc/{p}/fd")).unwrap() {
            let fd = fd.unwrap().path();
            let Ok(target) = std::fs::read_link(&fd) else {
                continue;
            };
            let t = target.to_string_lossy();
            if t.ends_with("/pool") || t.contains("cxlfs-memory-vm0") {
                assert!(
                    !nobody_can_open(&fd),
                    "nobody opened {} ({t})",
                    fd.display()
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 3,
        "the region file and its store, in both processes: {checked}"
    );
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !host.contains("cxlfs-pool"),
        "a pool or region mounted on the host"
    );
    assert!(!Path::new(&format!("/run/cxlfsd/memory-{pid}")).exists());
    let st = d.stop();
    assert!(st.success(), "{st}\n{}", d.log());
}

/// A stopped and continued daemon (SIGSTOP/SIGCONT, a cgroup freeze, a
/// debugger attaching) resumes its timed sleeps through restart_syscall;
/// the seccomp filter must let that through instead of killing it.
#[test]
fn a_stopped_and_continued_daemon_keeps_serving() {
    if !root_or_skip() {
        return;
    }
    let mut d = start(&[]);
    let pid = d.pid() as i32;
    assert_eq!(read_hello(&d.path("vm0.sock")), b"hello from the host\n");
    for _ in 0..3 {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            d.child.try_wait().unwrap().is_none(),
            "cxlfsd died after SIGSTOP/SIGCONT (seccomp and restart_syscall?)\n{}",
            d.log()
        );
    }
    assert_eq!(read_hello(&d.path("vm0.sock")), b"hello from the host\n");
    assert!(d.stop().success(), "{}", d.log());
}
