//! The plane helper's own system-call allow-list. The helper holds
//! `/dev/fuse` of a region, its backing store and a socket to the daemon,
//! and does nothing but read requests, answer or forward them, and store
//! write-backs: this is all it may call once it serves (every thread,
//! `SECCOMP_FILTER_FLAG_TSYNC`). Its start — mapping the readahead map,
//! starting threads — comes before the filter and is not on it.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// What a call outside an allow-list does: the daemon's `--seccomp`
/// (virtiofsd's), which its plane helpers take on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeccompMode {
    /// Kill the process (the default).
    #[default]
    Kill,
    /// Allow and log it (`dmesg`): for finding what a new path needs.
    Log,
    /// Send SIGSYS.
    Trap,
    /// No filter.
    None,
}

impl std::str::FromStr for SeccompMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kill" => Ok(SeccompMode::Kill),
            "log" => Ok(SeccompMode::Log),
            "trap" => Ok(SeccompMode::Trap),
            "none" => Ok(SeccompMode::None),
            other => Err(format!(
                "unknown seccomp action {other:?} (kill, log, trap, none)"
            )),
        }
    }
}

impl std::fmt::Display for SeccompMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SeccompMode::Kill => "kill",
            SeccompMode::Log => "log",
            SeccompMode::Trap => "trap",
            SeccompMode::None => "none",
        })
    }
}

/// Why the helper's filter could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallSeccompModeError {
    /// The rules do not compile for this architecture.
    #[error("cannot build the helper's seccomp filter")]
    Build(#[source] seccompiler::BackendError),
    /// The kernel refused it.
    #[error("cannot install the helper's seccomp filter")]
    Install(#[source] seccompiler::Error),
}

/// The calls a serving helper makes.
const ALLOWED: &[i64] = &[
    // Requests, replies, the store, the daemon's socket.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_close,
    // The ring (set up before the filter; its SQEs are restricted to FUSE
    // commands and polls), and the main thread's wait for the daemon.
    libc::SYS_io_uring_enter,
    libc::SYS_poll,
    libc::SYS_ppoll,
    // Memory (the allocator).
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    // Threads, locks, time, signals, exit.
    libc::SYS_futex,
    libc::SYS_sched_yield,
    // glibc sizes a new thread's malloc arena by the CPUs it may run on.
    libc::SYS_sched_getaffinity,
    // sched_getcpu, where glibc does not read it from rseq.
    libc::SYS_getcpu,
    libc::SYS_rseq,
    libc::SYS_set_robust_list,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_tgkill,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// The compiled filter (`None` for [`SeccompMode::None`]).
pub(crate) fn filter(mode: SeccompMode) -> Result<Option<BpfProgram>, InstallSeccompModeError> {
    let mismatch = match mode {
        SeccompMode::None => return Ok(None),
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Trap => SeccompAction::Trap,
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&nr| (nr, Vec::new())).collect();
    // A thread names itself as it starts (`prctl(PR_SET_NAME)`), which may
    // come after the filter: that and nothing else of prctl.
    let set_name = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        libc::PR_SET_NAME as u64,
    )
    .and_then(|c| SeccompRule::new(vec![c]))
    .map_err(InstallSeccompModeError::Build)?;
    rules.insert(libc::SYS_prctl, vec![set_name]);
    let arch: TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(InstallSeccompModeError::Build)?;
    let f = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch)
        .map_err(InstallSeccompModeError::Build)?;
    BpfProgram::try_from(f)
        .map(Some)
        .map_err(InstallSeccompModeError::Build)
}

/// Installs the list on every thread of the helper.
pub(crate) fn install(mode: SeccompMode) -> Result<(), InstallSeccompModeError> {
    if let Some(prog) = filter(mode)? {
        seccompiler::apply_filter_all_threads(&prog).map_err(InstallSeccompModeError::Install)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_has_a_word_and_compiles() {
        for m in [
            SeccompMode::Kill,
            SeccompMode::Log,
            SeccompMode::Trap,
            SeccompMode::None,
        ] {
            assert_eq!(m.to_string().parse::<SeccompMode>(), Ok(m));
            assert_eq!(
                filter(m).expect("compiles").is_some(),
                m != SeccompMode::None
            );
        }
        assert!("allow".parse::<SeccompMode>().is_err());
    }
}
