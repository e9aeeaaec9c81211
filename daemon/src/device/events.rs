//! What the device tells those who mirror it (the DAX plane): pages it
//! evicted or prefetched, extents it gave back, pages the placement moved
//! to the CXL tier. Observers subscribe with
//! [`SharedDevice::subscribe`](super::SharedDevice::subscribe); the device
//! never calls a plane itself.

use crate::ids::FileKey;
use crate::sync::lock;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// A test of whether a pool extent is mapped (by a DAX window).
pub type MappedTest<'a> = &'a dyn Fn(u64) -> bool;
/// What runs while mappings are held still.
pub type WithMapped<'a> = &'a mut dyn FnMut(MappedTest<'_>);

/// Receives the device's events. Called outside the device and pool locks.
pub trait DeviceObserver: Send + Sync {
    /// Pool pages the device evicted (page numbers, unsorted). Must not
    /// wait: it runs on data-path threads, plane threads included.
    fn evicted(&self, pages: Vec<u64>);

    /// As [`evicted`](DeviceObserver::evicted), but returns once the pages
    /// are gone from what the observer mirrors (dirty ones written back):
    /// the pages it dropped. May wait; never called on a plane thread.
    fn evicted_wait(&self, pages: Vec<u64>) -> u64 {
        self.evicted(pages);
        0
    }

    /// Pool pages the prefetcher filled, each with the device time it is
    /// ready at. Must not wait.
    fn prefetched(&self, pages: Vec<(u64, u64)>);

    /// Extents of the host file `key` are reclaimed (truncated away, or
    /// the file's last reference went: `file_gone`); they go back to the
    /// pool right after this returns: drop every page of them now (may
    /// wait; never called on a plane thread).
    fn released(&self, key: FileKey, extents: &[u64], file_gone: bool);

    /// Runs `f` with a test of which extents the observer maps now (a DAX
    /// window slot); while `f` runs, no new mapping can start. The pool
    /// never reclaims an extent a window maps: a guest would reach the
    /// pages of whatever file gets it next.
    fn with_mapped(&self, f: WithMapped<'_>) {
        f(&|_| false);
    }

    /// The CXL share went from `old` to `new` (> `old`) percent: pages that
    /// were DRAM-tier are CXL-tier now, and their next access must reach
    /// the device. Returns the pages dropped (may wait).
    fn moved_to_cxl(&self, old: u8, new: u8) -> u64;
}

/// The subscribed observers (held weakly).
#[derive(Default)]
pub(super) struct Observers {
    list: Mutex<Vec<Weak<dyn DeviceObserver>>>,
}

impl Observers {
    fn lock(&self) -> MutexGuard<'_, Vec<Weak<dyn DeviceObserver>>> {
        lock(&self.list)
    }

    pub(super) fn add(&self, o: Weak<dyn DeviceObserver>) {
        let mut l = self.lock();
        l.retain(|w| w.strong_count() > 0);
        l.push(o);
    }

    /// The observers still alive.
    pub(super) fn live(&self) -> Vec<Arc<dyn DeviceObserver>> {
        self.lock().iter().filter_map(Weak::upgrade).collect()
    }

    pub(super) fn evicted(&self, pages: Vec<u64>) {
        if pages.is_empty() {
            return;
        }
        for o in self.live() {
            o.evicted(pages.clone());
        }
    }

    /// [`DeviceObserver::evicted_wait`] of every live observer: the pages
    /// they dropped, summed.
    pub(super) fn evicted_wait(&self, pages: Vec<u64>) -> u64 {
        if pages.is_empty() {
            return 0;
        }
        self.live()
            .iter()
            .map(|o| o.evicted_wait(pages.clone()))
            .sum()
    }

    pub(super) fn prefetched(&self, pages: Vec<(u64, u64)>) {
        if pages.is_empty() {
            return;
        }
        for o in self.live() {
            o.prefetched(pages.clone());
        }
    }

    pub(super) fn released(&self, key: FileKey, extents: &[u64], file_gone: bool) {
        for o in self.live() {
            o.released(key, extents, file_gone);
        }
    }

    /// Runs `f` with the union of every live observer's mapped test, all
    /// of them holding their mappings still.
    pub(super) fn with_mapped(&self, f: WithMapped<'_>) {
        fn nest(obs: &[Arc<dyn DeviceObserver>], outer: &dyn Fn(u64) -> bool, f: WithMapped<'_>) {
            match obs.split_first() {
                None => f(outer),
                Some((o, rest)) => o.with_mapped(&mut |mapped| {
                    nest(rest, &|e| outer(e) || mapped(e), f);
                }),
            }
        }
        nest(&self.live(), &|_| false, f);
    }
}
