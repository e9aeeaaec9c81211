//! The daemon's poison-tolerant lock: a thread that panicked while holding
//! a mutex leaves plain data behind, so the others keep going with it.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data over from a holder that panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
