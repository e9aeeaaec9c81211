//! The plane as the device's [`DeviceObserver`]: evicted pages leave the
//! plane, prefetched ones are queued for the `pool-prefetch` thread, a
//! released file's extents are dropped before reuse, pages moved to the CXL
//! tier are evicted.

use super::DaxPlane;
use crate::device::{DeviceObserver, EXTENT_SIZE};
use crate::ids::FileKey;
use crate::sync::lock;
use std::collections::HashSet;

impl DeviceObserver for DaxPlane {
    fn evicted(&self, pages: Vec<u64>) {
        self.evict_pages(pages, false);
    }

    fn evicted_wait(&self, pages: Vec<u64>) -> u64 {
        self.evict_pages(pages, true)
    }

    fn prefetched(&self, pages: Vec<(u64, u64)>) {
        let pages = self.state.in_windows(pages, |&(p, _)| p);
        if pages.is_empty() {
            return;
        }
        if let Some(tx) = lock(&self.prefetch_tx).as_ref() {
            // The filler gone (shutting down): nothing to push.
            let _ = tx.send(pages);
        }
    }

    fn released(&self, key: FileKey, extents: &[u64], file_gone: bool) {
        let window: Vec<u64> = {
            let mut w = lock(&self.state.windows);
            if file_gone {
                // The pool forgot the file: close the fd kept for traps.
                w.files.remove(&key);
            }
            extents
                .iter()
                .copied()
                .filter(|e| w.extents.remove(e))
                .collect()
        };
        // The plane must forget the reclaimed pages before another file
        // gets the extents (their write-backs find no owner and are dropped).
        let Some(plane) = self.plane() else { return };
        for extent in window {
            match plane.evict(extent * EXTENT_SIZE, EXTENT_SIZE) {
                Ok(t) => {
                    if let Err(e) = t.wait() {
                        tracing::warn!(error = %e, extent, "pool eviction of a reclaimed extent failed");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, extent, "cannot evict a reclaimed pool extent")
                }
            }
        }
    }

    /// Holds every VM's slot table while `f` runs, so no SETUPMAPPING can
    /// pick up an extent the pool is taking back.
    fn with_mapped(&self, f: crate::device::events::WithMapped<'_>) {
        let sessions = self.live_sessions();
        // One reclaim at a time takes several slot tables; nobody else holds
        // two, so this order cannot deadlock.
        let _one = lock(&self.reclaiming);
        let tables: Vec<_> = sessions.iter().map(|s| lock(&s.slots)).collect();
        let mapped: HashSet<u64> = tables
            .iter()
            .flat_map(|t| t.values().map(|slot| slot.extent))
            .collect();
        f(&|e| mapped.contains(&e));
    }

    fn moved_to_cxl(&self, old: u8, new: u8) -> u64 {
        self.evict_moved_to_cxl(old, new)
    }
}
