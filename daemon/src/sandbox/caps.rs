//! Dropping capabilities on every thread.
//!
//! Capability sets are per thread, and by the time the daemon is ready to
//! drop them the residency plane, the control socket and the metrics
//! threads are already running (the pool mount needs its request threads
//! before the pool can be opened). So the drop is broadcast the way glibc
//! broadcasts `setuid`: a real-time signal to every thread, whose handler
//! makes the (async-signal-safe) `prctl`/`capset` calls on itself; the
//! caller waits for every thread to report, repeats until no thread is
//! left unvisited, then checks each thread's `CapEff`/`CapBnd` in
//! `/proc/self/task`. io_uring's worker threads are left out: they run no
//! signal handler and do each request with its submitter's credentials.

use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the data path needs (virtiofsd's default set): acting on files
/// of any owner on a guest's behalf, switching fsuid/fsgid per request,
/// creating device nodes, setting file capabilities. Not CAP_SYS_ADMIN:
/// the pool is mounted and detached before the drop.
pub const KEPT: &[u32] = &[
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    27, // CAP_MKNOD
    31, // CAP_SETFCAP
];

/// CAP_SETPCAP: needed (in the effective set) to shrink the bounding set.
const CAP_SETPCAP: u32 = 8;
/// `_LINUX_CAPABILITY_VERSION_3`.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Why capabilities could not be dropped.
#[derive(Debug, thiserror::Error)]
pub enum DropCapabilitiesError {
    /// The signal handler could not be installed.
    #[error("cannot install the capability-drop signal handler")]
    Handler(#[source] io::Error),
    /// `/proc/self/task` could not be listed.
    #[error("cannot list this process's threads")]
    Threads(#[source] io::Error),
    /// A thread did not run the handler in time.
    #[error("{count} thread(s) did not drop their capabilities within {ANSWER_WAIT:?}: {threads}")]
    Timeout {
        /// Threads that never answered.
        count: usize,
        /// Each one's tid, name, state and wait channel.
        threads: String,
    },
    /// A thread's `prctl`/`capset` failed.
    #[error("{0} thread(s) failed to drop their capabilities")]
    Failed(usize),
    /// A thread still holds a capability outside [`KEPT`].
    #[error("thread {tid} still holds capabilities {extra:#x} ({set})")]
    StillHeld {
        /// The thread.
        tid: u32,
        /// `CapEff` or `CapBnd`.
        set: &'static str,
        /// The capabilities beyond [`KEPT`].
        extra: u64,
    },
}

/// The capability set every thread keeps, low and high words (read by the
/// signal handler: atomics, no locks).
static KEEP_LO: AtomicU32 = AtomicU32::new(0);
static KEEP_HI: AtomicU32 = AtomicU32::new(0);
static LAST_CAP: AtomicU32 = AtomicU32::new(40);
static DONE: AtomicUsize = AtomicUsize::new(0);
static FAILED: AtomicUsize = AtomicUsize::new(0);
/// The threads that answered, in order (the first [`MAX_ACKS`]): a thread
/// signalled but gone before its handler ran never answers, and holds
/// nothing either; the wait tells it from one that is late by this list.
const MAX_ACKS: usize = 1024;
static ACKED: [AtomicU32; MAX_ACKS] = [const { AtomicU32::new(0) }; MAX_ACKS];

/// Counts one answer from `tid`. Only atomics: it runs in a signal handler.
fn ack(tid: u32) {
    let i = DONE.fetch_add(1, Ordering::AcqRel);
    if let Some(slot) = ACKED.get(i) {
        slot.store(tid, Ordering::Release);
    }
}

/// How long the broadcast waits for every thread's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// How often a thread that has not answered is signalled again.
const RESIGNAL_EVERY: Duration = Duration::from_millis(250);

/// The threads of `visited` still alive that have not answered (beyond
/// [`MAX_ACKS`] answers, the later ones cannot be told apart: their
/// threads stay listed, which only makes the wait longer).
fn unanswered(visited: &HashSet<u32>) -> io::Result<Vec<u32>> {
    let done = DONE.load(Ordering::Acquire).min(MAX_ACKS);
    let acked: HashSet<u32> = ACKED[..done]
        .iter()
        .map(|a| a.load(Ordering::Acquire))
        .collect();
    Ok(tids()?
        .into_iter()
        .filter(|t| visited.contains(t) && !acked.contains(t))
        .collect())
}

/// `tid`'s name, scheduler state and wait channel, for the timeout error.
fn describe_thread(tid: u32) -> String {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/self/task/{tid}/{f}"));
    let name = read("comm").unwrap_or_default();
    let state = read("stat")
        .ok()
        .and_then(|st| {
            Some(
                st.rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .next()?
                    .to_string(),
            )
        })
        .unwrap_or_default();
    let wchan = read("wchan").unwrap_or_default();
    format!("{tid} {} {state} {wchan}", name.trim())
}

/// `struct __user_cap_header_struct` (linux/capability.h).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct` (linux/capability.h); v3 takes two.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn keep_mask() -> u64 {
    KEPT.iter().fold(0u64, |m, &c| m | (1u64 << c))
}

/// Drops this thread's capabilities to the kept set. Only system calls:
/// it runs in a signal handler.
fn drop_on_this_thread() -> bool {
    let (lo, hi) = (
        KEEP_LO.load(Ordering::Acquire),
        KEEP_HI.load(Ordering::Acquire),
    );
    let keep = u64::from(lo) | (u64::from(hi) << 32);
    let mut ok = true;
    // The bounding set first, while CAP_SETPCAP is still effective.
    for cap in 0..=LAST_CAP.load(Ordering::Acquire).min(63) {
        if keep & (1u64 << cap) == 0 && cap != CAP_SETPCAP {
            // SAFETY: prctl with integer arguments only.
            ok &= unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) }
                == 0;
        }
    }
    // SAFETY: as above.
    ok &= unsafe {
        libc::prctl(
            libc::PR_CAPBSET_DROP,
            libc::c_ulong::from(CAP_SETPCAP),
            0,
            0,
            0,
        )
    } == 0;
    // SAFETY: as above.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [
        CapData {
            effective: lo,
            permitted: lo,
            inheritable: 0,
        },
        CapData {
            effective: hi,
            permitted: hi,
            inheritable: 0,
        },
    ];
    // SAFETY: `header` and `data` are the v3 layouts the kernel reads.
    ok &= unsafe {
        libc::syscall(
            libc::SYS_capset,
            std::ptr::addr_of_mut!(header),
            data.as_mut_ptr(),
        )
    } == 0;
    // A thread started by one that had already dropped inherits the
    // dropped sets and may no longer drop (EPERM without CAP_SETPCAP):
    // what counts is that nothing beyond `keep` is left.
    ok || holds_only(keep)
}

/// Whether this thread's bounding, effective and permitted sets hold
/// nothing beyond `keep`. Only system calls: it runs in a signal handler.
fn holds_only(keep: u64) -> bool {
    for cap in 0..=LAST_CAP.load(Ordering::Acquire).min(63) {
        // SAFETY: prctl with integer arguments only.
        let held = unsafe { libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0, 0, 0) };
        if keep & (1u64 << cap) == 0 && held != 0 {
            return false;
        }
    }
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: `header` and `data` are the v3 layouts the kernel writes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            std::ptr::addr_of_mut!(header),
            data.as_mut_ptr(),
        )
    };
    let set = |w: fn(&CapData) -> u32| u64::from(w(&data[0])) | (u64::from(w(&data[1])) << 32);
    rc == 0 && (set(|d| d.effective) | set(|d| d.permitted)) & !keep == 0
}

extern "C" fn on_signal(_: libc::c_int) {
    if !drop_on_this_thread() {
        FAILED.fetch_add(1, Ordering::AcqRel);
    }
    // SAFETY: no preconditions; async-signal-safe.
    let tid = unsafe { libc::gettid() };
    ack(tid as u32);
}

fn signal() -> libc::c_int {
    libc::SIGRTMIN() + 4
}

fn install_handler() -> io::Result<()> {
    // SAFETY: sigaction is plain data; all-zero is a valid value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: `sa` is initialised; the handler only makes system calls
    // and touches atomics.
    if unsafe { libc::sigaction(signal(), &sa, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The process's threads, less its io_uring workers ([`is_io_worker`]).
fn tids() -> io::Result<Vec<u32>> {
    Ok(std::fs::read_dir("/proc/self/task")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&tid| !is_io_worker(tid))
        .collect())
}

/// `PF_IO_WORKER` among a task's flags (`/proc/…/stat`, field 9).
const PF_IO_WORKER: u64 = 0x10;

/// Whether `tid` is an io_uring worker (`iou-wrk-…`): a kernel thread
/// listed among the process's tasks that runs no signal handler, so it
/// can never answer the broadcast. It holds no credentials of its own
/// that matter: each request it runs is done under the credentials of the
/// thread that submitted it (taken at submission), so once the submitting
/// threads have dropped theirs, so has its work.
fn is_io_worker(tid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return false;
    };
    // After the parenthesised name: state, ppid, pgrp, session, tty_nr,
    // tpgid, flags.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(6)?.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_IO_WORKER != 0)
}

/// `key`'s hex mask in `/proc/self/task/TID/status`.
fn task_caps(tid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    status.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix(':')?;
        u64::from_str_radix(v.trim(), 16).ok()
    })
}

/// Waits until every thread of `visited` still alive has answered. A
/// short-lived thread may take the signal to its exit and never run the
/// handler: once every thread still listed has answered, the rest are
/// gone. A thread that has not answered is signalled again every
/// [`RESIGNAL_EVERY`] (a second drop is harmless; the final check reads
/// every thread's sets anyway).
fn await_answers(pid: libc::pid_t, visited: &HashSet<u32>) -> Result<(), DropCapabilitiesError> {
    let start = Instant::now();
    let mut resent = start;
    loop {
        let waiting = unanswered(visited).map_err(DropCapabilitiesError::Threads)?;
        if waiting.is_empty() {
            return Ok(());
        }
        if start.elapsed() > ANSWER_WAIT {
            let threads: Vec<String> = waiting.iter().map(|&t| describe_thread(t)).collect();
            return Err(DropCapabilitiesError::Timeout {
                count: waiting.len(),
                threads: threads.join("; "),
            });
        }
        if resent.elapsed() >= RESIGNAL_EVERY {
            resent = Instant::now();
            for &tid in &waiting {
                // SAFETY: signalling a thread of our own process (one that
                // exits meanwhile is no longer listed next time round).
                unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, signal()) };
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// CAP_SYS_NICE, kept only for `--realtime-priority`.
pub const CAP_SYS_NICE: u32 = 23;

/// Drops every thread's capabilities (effective, permitted, inheritable,
/// ambient, bounding) to [`KEPT`] plus `extra`. A no-op when not running
/// as root.
pub fn drop_capabilities(extra: &[u32]) -> Result<(), DropCapabilitiesError> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let keep = extra
        .iter()
        .filter(|&&c| c < 64)
        .fold(keep_mask(), |m, &c| m | (1u64 << c));
    KEEP_LO.store(keep as u32, Ordering::Release);
    KEEP_HI.store((keep >> 32) as u32, Ordering::Release);
    if let Some(last) = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        LAST_CAP.store(last, Ordering::Release);
    }
    install_handler().map_err(DropCapabilitiesError::Handler)?;
    // SAFETY: no preconditions.
    let (pid, me) = unsafe { (libc::getpid(), libc::gettid()) };
    let mut visited = HashSet::new();
    DONE.store(0, Ordering::Release);
    FAILED.store(0, Ordering::Release);
    // A thread spawned by one not yet visited inherits full capabilities
    // and is missing from the first listing: list again until none is new.
    for _ in 0..16 {
        let fresh: Vec<u32> = tids()
            .map_err(DropCapabilitiesError::Threads)?
            .into_iter()
            .filter(|t| !visited.contains(t))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for tid in fresh {
            visited.insert(tid);
            if tid as libc::pid_t == me {
                on_signal(0);
                continue;
            }
            // SAFETY: signalling a thread of our own process.
            let rc = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, signal()) };
            if rc != 0 {
                // Exited meanwhile: nothing to drop.
                ack(tid);
            }
        }
        await_answers(pid, &visited)?;
    }
    let failed = FAILED.load(Ordering::Acquire);
    if failed > 0 {
        return Err(DropCapabilitiesError::Failed(failed));
    }
    for tid in tids().map_err(DropCapabilitiesError::Threads)? {
        for set in ["CapEff", "CapBnd"] {
            let extra = task_caps(tid, set).unwrap_or(0) & !keep;
            if extra != 0 {
                return Err(DropCapabilitiesError::StillHeld { tid, set, extra });
            }
        }
    }
    tracing::info!(
        threads = visited.len(),
        kept = format!("{keep:#x}"),
        "capabilities dropped on every thread"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_of_ours_is_listed_and_is_no_io_worker() {
        // SAFETY: no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        assert!(!is_io_worker(me));
        assert!(tids().unwrap().contains(&me));
        assert!(!is_io_worker(u32::MAX), "a thread that is not there");
    }

    #[test]
    fn holds_only_checks_what_is_left_not_how_it_got_there() {
        // Everything is within "everything".
        assert!(holds_only(u64::MAX));
        // This test's thread drops nothing: its bounding set (full for root,
        // and never just the kept set) holds more than the kept set.
        assert!(!holds_only(keep_mask()));
    }
}
