//! Attributing a trap to a VM: the FUSE request header carries the faulting
//! *thread*'s id; a VM is a VMM *process* (whose pid the daemon learns from
//! the vhost-user socket's `SO_PEERCRED`). A thread maps to its process
//! through `/proc/<tid>/status` (`Tgid:`), cached per thread id.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// A VM, as the daemon numbers them.
pub type VmId = u32;

/// Reads the thread-group id (process id) of thread `tid` from
/// `/proc/<tid>/status`; `None` if the thread is gone or unreadable.
pub fn tgid_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    parse_tgid(&status)
}

fn parse_tgid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Maps faulting thread ids to VMs, given the VMM pids.
#[derive(Debug, Default)]
pub struct VmResolver {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    vmm_pids: HashMap<u32, VmId>,
    /// tid → tgid (None: unknown, e.g. the thread had gone).
    tgids: HashMap<u32, Option<u32>>,
}

/// Bounds the tid cache (thread ids are reused; a full cache starts over).
const MAX_CACHED_TIDS: usize = 1 << 16;

impl VmResolver {
    /// An empty resolver (no VMMs).
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `pid` (a process) is the VMM of `vm`.
    pub fn register(&self, vm: VmId, pid: u32) {
        let mut g = self.lock();
        g.vmm_pids.retain(|_, v| *v != vm);
        g.vmm_pids.insert(pid, vm);
        // A recycled tid might be cached with an old process.
        g.tgids.clear();
    }

    /// Forgets `vm`'s VMM.
    pub fn unregister(&self, vm: VmId) {
        let mut g = self.lock();
        g.vmm_pids.retain(|_, v| *v != vm);
        g.tgids.clear();
    }

    /// The VM thread `tid` belongs to, if any. The first call for a thread
    /// reads `/proc` (tens of µs); later ones are a hash lookup.
    pub fn resolve(&self, tid: u32) -> Option<VmId> {
        if tid == 0 {
            return None;
        }
        {
            let g = self.lock();
            if g.vmm_pids.is_empty() {
                return None;
            }
            if let Some(&vm) = g.vmm_pids.get(&tid) {
                return Some(vm);
            }
            if let Some(tgid) = g.tgids.get(&tid) {
                return tgid.and_then(|p| g.vmm_pids.get(&p).copied());
            }
        }
        let tgid = tgid_of(tid);
        let mut g = self.lock();
        if g.tgids.len() >= MAX_CACHED_TIDS {
            g.tgids.clear();
        }
        g.tgids.insert(tid, tgid);
        tgid.and_then(|p| g.vmm_pids.get(&p).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        assert_eq!(
            parse_tgid("Name:\tx\nTgid:\t1234\nPid:\t1240\n"),
            Some(1234)
        );
        assert_eq!(parse_tgid("Name:\tx\n"), None);
        assert_eq!(parse_tgid("Tgid:\tnope\n"), None);
    }

    #[test]
    fn threads_resolve_to_their_process() {
        let me = std::process::id();
        let r = VmResolver::new();
        let tid = std::thread::spawn(thread_id).join().unwrap();
        assert_eq!(r.resolve(tid), None);
        r.register(7, me);
        assert_eq!(tgid_of(tid).or(Some(me)), Some(me));
        assert_eq!(r.resolve(me), Some(7));
        assert_eq!(r.resolve(thread_id()), Some(7));
        r.unregister(7);
        assert_eq!(r.resolve(me), None);
        assert_eq!(r.resolve(0), None);
    }

    fn thread_id() -> u32 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() as u32 }
    }
}
