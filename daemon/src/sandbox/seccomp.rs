//! The system-call allow-list, on every thread (`SECCOMP_FILTER_FLAG_TSYNC`).
//!
//! Collected by running the whole test suite (unit, daemon and end-to-end
//! tests with real guests) under `--seccomp log` and reading the kernel's
//! audit lines (`dmesg | grep 'type=1326'`): what the daemon calls while
//! serving, after the sandbox is entered. Start-up calls (mount,
//! pivot_root, unshare, capset) are made before the filter exists and are
//! not on it. DESIGN.md ("Sandbox") says how to extend it.

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};
use std::collections::BTreeMap;

pub use residency::SeccompMode;

/// Why the filter could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallSeccompError {
    /// The rules do not compile for this architecture.
    #[error("cannot build the seccomp filter")]
    Build(#[source] seccompiler::BackendError),
    /// The kernel refused it.
    #[error("cannot install the seccomp filter")]
    Install(#[source] seccompiler::Error),
}

/// Calls every architecture has.
const COMMON: &[i64] = &[
    // Memory.
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_msync,
    // Threads, time, signals.
    libc::SYS_futex,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sched_yield,
    // `--realtime-priority`.
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_setparam,
    libc::SYS_sched_getparam,
    libc::SYS_sched_getaffinity,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_gettimeofday,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    // The kernel resumes a sleep (nanosleep, a futex or poll with a timeout)
    // stopped by SIGSTOP/SIGCONT, a cgroup freeze or a debugger through
    // restart_syscall: without it such a stop killed the daemon (SIGSYS).
    libc::SYS_restart_syscall,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    libc::SYS_kill,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_wait4,
    libc::SYS_prctl,
    libc::SYS_getrandom,
    libc::SYS_getrlimit,
    libc::SYS_prlimit64,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    // Per-request credentials: the passthrough switches the worker
    // thread's euid/egid (raw syscalls, one thread) around a creation.
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_capget,
    // Descriptors and I/O.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fcntl,
    libc::SYS_ioctl,
    libc::SYS_lseek,
    libc::SYS_eventfd2,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_pipe2,
    libc::SYS_memfd_create,
    libc::SYS_sendfile,
    libc::SYS_splice,
    libc::SYS_copy_file_range,
    // Sockets (vhost-user, control, metrics).
    libc::SYS_socket,
    libc::SYS_accept4,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_connect,
    libc::SYS_shutdown,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    // The passthrough.
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_fstatfs,
    libc::SYS_statfs,
    libc::SYS_getdents64,
    libc::SYS_readlinkat,
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
    libc::SYS_symlinkat,
    libc::SYS_linkat,
    libc::SYS_unlinkat,
    libc::SYS_renameat2,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_utimensat,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_syncfs,
    libc::SYS_sync_file_range,
    libc::SYS_fadvise64,
    libc::SYS_flock,
    libc::SYS_fgetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_flistxattr,
    libc::SYS_fremovexattr,
    libc::SYS_getxattr,
    libc::SYS_setxattr,
    libc::SYS_listxattr,
    libc::SYS_removexattr,
    libc::SYS_lgetxattr,
    libc::SYS_lsetxattr,
    libc::SYS_llistxattr,
    libc::SYS_lremovexattr,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_fchdir,
    libc::SYS_getcwd,
    libc::SYS_umask,
    // The pool plane's FUSE over io_uring: ring workers wait and commit in
    // io_uring_enter; more start (setup, restrictions, pinning) as VMs
    // register. Their rings carry only FUSE commands and polls
    // (IORING_REGISTER_RESTRICTIONS), since seccomp does not see inside.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_sched_setaffinity,
    // The CPU an eviction notice was queued on, where glibc cannot read it
    // from rseq (the polling notifier keeps off that CPU).
    libc::SYS_getcpu,
    // The pool plane at shutdown: stopping its request threads, and the
    // lazy unmount (refused without CAP_SYS_ADMIN, harmless: the pool is
    // already detached).
    libc::SYS_umount2,
];

/// Calls only x86-64 has (older forms std or the vhost crates still use).
#[cfg(target_arch = "x86_64")]
const ARCH: &[i64] = &[
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_poll,
    libc::SYS_epoll_wait,
    libc::SYS_access,
    libc::SYS_readlink,
    libc::SYS_unlink,
    libc::SYS_rmdir,
    libc::SYS_mkdir,
    libc::SYS_rename,
    libc::SYS_pipe,
    libc::SYS_dup2,
    libc::SYS_arch_prctl,
    libc::SYS_getdents,
];
#[cfg(not(target_arch = "x86_64"))]
const ARCH: &[i64] = &[];

fn target_arch() -> Result<TargetArch, InstallSeccompError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(InstallSeccompError::Build)
}

/// The compiled filter for `mode` (`None` for [`SeccompMode::None`]).
pub(crate) fn filter(mode: SeccompMode) -> Result<Option<BpfProgram>, InstallSeccompError> {
    let mismatch = match mode {
        SeccompMode::None => return Ok(None),
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Trap => SeccompAction::Trap,
    };
    let rules: BTreeMap<i64, Vec<SeccompRule>> = COMMON
        .iter()
        .chain(ARCH)
        .map(|&nr| (nr, Vec::new()))
        .collect();
    let f = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, target_arch()?)
        .map_err(InstallSeccompError::Build)?;
    BpfProgram::try_from(f)
        .map(Some)
        .map_err(InstallSeccompError::Build)
}

/// Installs the allow-list on every thread (and sets no_new_privs).
pub fn install(mode: SeccompMode) -> Result<(), InstallSeccompError> {
    let Some(prog) = filter(mode)? else {
        tracing::warn!("seccomp off (--seccomp none)");
        return Ok(());
    };
    seccompiler::apply_filter_all_threads(&prog).map_err(InstallSeccompError::Install)?;
    tracing::info!(action = %mode, syscalls = COMMON.len() + ARCH.len(), "seccomp allow-list on every thread");
    Ok(())
}
