//! Where a polling notifier may run: off the CPUs its evictions come from.
//!
//! An eviction notice is sent by the request thread that answers the trap,
//! and a FUSE-over-io_uring request thread is pinned to the CPU the trap
//! came in on — the faulting vCPU's. A notifier woken by that send lands on
//! the same CPU (the scheduler places a wakee beside its waker) and then
//! polls there. The request threads spin for replies due soon, so they run
//! ahead of their fair share; the next trap's thread, woken while the
//! notifier polls on its CPU, was not let in until the poll ended: 100–130
//! µs, in about 2 % of DAX misses at a 40 µs NAND read (`perf sched
//! timehist` of `experiments/miss-latency.toml`, DESIGN.md). The notifier
//! now polls on the other CPUs, where there are any.

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// The CPU the calling thread runs on (`None`: unknown). glibc reads it
/// from rseq or the vDSO: no system call.
pub(super) fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments; -1 means unknown.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// The notifier's CPU mask: the one it started with, less the CPUs the
/// last batch's evictions came from while it polls.
pub(super) struct NotifierCpus {
    /// The mask it was started with (`None`: unknown; nothing is changed).
    allowed: Option<CpuSet>,
    /// The CPUs left out now (empty: `allowed` is in force).
    excluded: Vec<usize>,
}

impl NotifierCpus {
    /// The calling thread's current mask.
    pub(super) fn of_this_thread() -> Self {
        NotifierCpus {
            allowed: sched_getaffinity(None).ok(),
            excluded: Vec::new(),
        }
    }

    /// Keeps the thread off `senders` (the CPUs a batch's evictions came
    /// from) when it is about to poll, back on every allowed CPU when it is
    /// about to sleep (`polling` false). A mask that would leave no CPU is
    /// not set. Calls the kernel only when the set left out changes.
    pub(super) fn place(&mut self, polling: bool, senders: &mut Vec<usize>) {
        let Some(allowed) = self.allowed else {
            return;
        };
        senders.sort_unstable();
        senders.dedup();
        if !polling {
            senders.clear();
        }
        senders.retain(|&c| c < CpuSet::MAX_CPU && allowed.is_set(c));
        if senders.len() >= allowed.count() as usize {
            senders.clear();
        }
        if *senders == self.excluded {
            return;
        }
        let mut mask = allowed;
        for &c in senders.iter() {
            mask.unset(c);
        }
        if let Err(e) = sched_setaffinity(None, &mask) {
            tracing::debug!(error = %e, "notifier: cannot change its CPU mask");
            return;
        }
        std::mem::swap(&mut self.excluded, senders);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notifier_leaves_its_senders_cpus_while_it_polls_and_comes_back() {
        let start = sched_getaffinity(None).expect("getaffinity");
        let Some(first) = (0..CpuSet::MAX_CPU).find(|&c| start.is_set(c)) else {
            panic!("no CPU in this thread's mask");
        };
        let mut cpus = NotifierCpus::of_this_thread();
        cpus.place(true, &mut vec![first, first]);
        let now = sched_getaffinity(None).expect("getaffinity");
        if start.count() > 1 {
            assert!(
                !now.is_set(first),
                "CPU {first} still in the mask while polling"
            );
            assert_eq!(now.count() + 1, start.count());
        } else {
            assert!(now.is_set(first), "the only CPU left out");
        }
        cpus.place(false, &mut vec![first]);
        let back = sched_getaffinity(None).expect("getaffinity");
        assert_eq!(back.count(), start.count());
        assert!(back.is_set(first));
    }

    #[test]
    fn a_mask_with_no_cpu_left_is_not_set() {
        let start = sched_getaffinity(None).expect("getaffinity");
        let all: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&c| start.is_set(c)).collect();
        let mut cpus = NotifierCpus::of_this_thread();
        cpus.place(true, &mut all.clone());
        let now = sched_getaffinity(None).expect("getaffinity");
        assert_eq!(now.count(), start.count());
        assert!(cpus.excluded.is_empty());
    }
}
