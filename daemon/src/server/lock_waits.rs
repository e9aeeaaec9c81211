//! SETLKW off the request path: [`LockWaits`], the session's waiting
//! lock requests (FUSE_INTERRUPT and the session's end stop them), and
//! [`Server::setlkw`], which answers at once or defers the wait.

use super::reply::{error_reply, reply_bytes};
use super::{Context, Deferred, FileSystem, Handled, LockRequest, Server, MAX_LOCK_WAITERS};
use crate::abi::{InHeader, OUT_HEADER_LEN};
use rustix::io::Errno;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The SETLKW requests of a session waiting off the request path, by
/// `unique`: FUSE_INTERRUPT and the session's end stop them.
#[derive(Debug, Default)]
pub struct LockWaits {
    waiting: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    /// INTERRUPTs that came (on the hiprio queue) before their SETLKW was
    /// registered; the last few only.
    early: Mutex<VecDeque<u64>>,
    closing: AtomicBool,
}

/// Early INTERRUPTs remembered.
const EARLY_INTERRUPTS: usize = 64;

impl LockWaits {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<AtomicBool>>> {
        crate::sync::lock(&self.waiting)
    }

    /// Stops every wait (the session ends); new ones are refused.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        for stop in self.lock().values() {
            stop.store(true, Ordering::Release);
        }
    }

    /// Waits outstanding.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn interrupt(&self, unique: u64) {
        let waiting = self.lock();
        match waiting.get(&unique) {
            Some(stop) => stop.store(true, Ordering::Release),
            None => {
                let mut early = crate::sync::lock(&self.early);
                if early.len() == EARLY_INTERRUPTS {
                    early.pop_front();
                }
                early.push_back(unique);
            }
        }
    }

    /// Whether `unique` was interrupted before it waited (forgets it).
    fn interrupted_early(&self, unique: u64) -> bool {
        let mut early = crate::sync::lock(&self.early);
        match early.iter().position(|&u| u == unique) {
            Some(i) => {
                early.remove(i);
                true
            }
            None => false,
        }
    }
}

/// A SETLKW's place in [`LockWaits`], given up when its wait ends or is
/// dropped unrun.
struct WaitEntry {
    waits: Arc<LockWaits>,
    unique: u64,
}

impl Drop for WaitEntry {
    fn drop(&mut self) {
        self.waits.lock().remove(&self.unique);
    }
}

impl<F: FileSystem> Server<F> {
    /// SETLKW: one try on the request path; on a conflict the wait goes
    /// off it (a [`Deferred`] reply), so the holder's unlock, queued
    /// behind, is still served.
    pub(super) fn setlkw(
        &self,
        ctx: &Context,
        h: &InHeader,
        lock: &LockRequest,
        out_cap: usize,
    ) -> Handled {
        let first = self.fs.setlk(ctx, h.nodeid, lock);
        if !matches!(first, Err(Errno::AGAIN)) || out_cap < OUT_HEADER_LEN {
            let first = first.map(|t| t.map(|()| Vec::new()));
            return self.finish(h, first, out_cap, 0);
        }
        if self.waits.closing.load(Ordering::Acquire) {
            return self.finish(h, Err(Errno::INTR), out_cap, 0);
        }
        let stop = Arc::new(AtomicBool::new(false));
        {
            let mut waiting = self.waits.lock();
            // Checked under the table's lock, which `interrupt` holds too.
            if self.waits.interrupted_early(h.unique) {
                drop(waiting);
                return self.finish(h, Err(Errno::INTR), out_cap, 0);
            }
            if waiting.len() >= MAX_LOCK_WAITERS {
                tracing::warn!(vm = %self.metrics.name, "too many SETLKW waits; answering ENOLCK");
                drop(waiting);
                return self.finish(h, Err(Errno::NOLCK), out_cap, 0);
            }
            waiting.insert(h.unique, stop.clone());
        }
        let waiter = match self.fs.lock_waiter(ctx, h.nodeid, lock) {
            Ok(w) => w,
            Err(e) => {
                self.waits.lock().remove(&h.unique);
                return self.finish(h, Err(e), out_cap, 0);
            }
        };
        let entry = WaitEntry {
            waits: self.waits.clone(),
            unique: h.unique,
        };
        let unique = h.unique;
        let run = move || {
            let stopped = || stop.load(Ordering::Acquire);
            let result = waiter(&stopped);
            drop(entry);
            match result {
                Ok(()) => reply_bytes(unique, 0, &[]),
                Err(e) => error_reply(unique, e),
            }
        };
        Handled {
            deferred: Some(Deferred(Box::new(run))),
            ..Handled::default()
        }
    }

    /// The session's SETLKW waits (the transport stops them when the
    /// connection ends).
    pub fn lock_waits(&self) -> &Arc<LockWaits> {
        &self.waits
    }
}
