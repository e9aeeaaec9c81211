//! The plane as the timing layer's [`Coherence`]: the pool kept coherent
//! with host files around FUSE operations that change them (guards,
//! evictions, write-backs, discards).

use super::DaxPlane;
use crate::device::PAGE;
use crate::ids::FileKey;
use crate::sync::lock;
use crate::timing::{Coherence, DiscardId, FileGuard, SyncAllError, SyncPoolError};
use rustix::io::Errno;

impl Coherence for DaxPlane {
    fn change_guard(&self, key: FileKey) -> FileGuard<'_> {
        self.plane_fill.lock(key)
    }

    fn evict_file_range(&self, key: FileKey, offset: u64, len: u64) {
        let Some(plane) = self.plane() else { return };
        for (off, n) in self.window_ranges(key, offset, len) {
            match plane.evict(off, n).map(|t| t.wait()) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) | Err(e) => {
                    tracing::warn!(error = %e, off, len = n, "cannot evict pool pages before a file change")
                }
            }
        }
    }

    fn sync_file_range(&self, key: FileKey, offset: u64, len: u64) -> Result<(), SyncPoolError> {
        let Some(plane) = self.plane() else {
            return Ok(());
        };
        for (off, n) in self.window_ranges(key, offset, len) {
            plane.sync(off, n).map_err(|source| SyncPoolError {
                offset: off,
                len: n,
                source,
            })?;
            self.write_back_deferred(off, n);
        }
        Ok(())
    }

    /// Marks the file's window-mapped pool pages of the range as
    /// discarding, then evicts them: the write-backs the kernel makes on
    /// the way (and any other write-back of those pages until
    /// [`Coherence::end_discard`]) are held by the backend, neither stored
    /// nor charged. Write-backs of other pool pages go on as ever.
    fn discard_file_range(&self, key: FileKey, offset: u64, len: u64) -> DiscardId {
        // Whole pages: a page the range covers in part is not the caller's
        // to drop.
        let start = offset.div_ceil(PAGE).saturating_mul(PAGE);
        let end = offset.saturating_add(len) / PAGE * PAGE;
        let ranges = if start < end {
            self.window_ranges(key, start, end - start)
        } else {
            Vec::new()
        };
        let id = lock(&self.state.discards).begin(
            ranges
                .iter()
                .map(|&(off, n)| (off, off.saturating_add(n)))
                .collect(),
        );
        if let Some(plane) = self.plane() {
            for (off, n) in ranges {
                match plane.evict(off, n).map(|t| t.wait()) {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) | Err(e) => {
                        tracing::warn!(error = %e, off, len = n, "cannot discard pool pages before a file change")
                    }
                }
            }
        }
        id
    }

    fn end_discard(&self, id: DiscardId, restore: bool) {
        let (ranges, held) = lock(&self.state.discards).end(id);
        if !restore || held.is_empty() {
            return;
        }
        // The change failed: the guests' stores go to the file after all.
        let now = self.shared.now_ns();
        for w in held {
            let (off, pid) = (w.pool_offset, w.pid);
            if let Err(e) = self
                .state
                .store_writeback(&self.shared, off, &w.data, pid, now)
            {
                tracing::warn!(error = %e, pool_offset = off, "cannot store a held write-back after a failed discard");
            }
        }
        // A page a trap brought back meanwhile read the file without them.
        let Some(plane) = self.plane() else { return };
        for (start, end) in ranges {
            match plane.evict(start, end - start).map(|t| t.wait()) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) | Err(e) => {
                    tracing::warn!(error = %e, start, "cannot evict pool pages after a failed discard")
                }
            }
        }
    }

    fn reserve_growth(&self, key: FileKey, new_size: u64) -> Result<(), Errno> {
        self.reserve_for_growth(key, new_size)
    }

    fn reserve_hole(&self, key: FileKey, offset: u64, end: u64) {
        self.reserve_after_hole(key, offset, end);
    }

    /// Writes back every dirty pool page (every file's window stores); the
    /// host files' durability is the caller's (SYNCFS syncs the share's
    /// file system next).
    fn sync_all(&self) -> Result<(), SyncAllError> {
        let Some(plane) = self.plane() else {
            return Ok(());
        };
        let size = plane.map_target().size;
        plane.sync(0, size).map_err(|e| SyncAllError(Box::new(e)))?;
        self.write_back_deferred(0, size);
        Ok(())
    }
}

impl DaxPlane {
    /// A sync's programs of the pages whose write-back access sampling
    /// deferred (the kernel had nothing left to write back of them).
    fn write_back_deferred(&self, pool_offset: u64, len: u64) {
        if let Err(e) = self.shared.write_back_deferred(pool_offset, len) {
            tracing::warn!(error = %e, pool_offset, len, "cannot charge deferred write-backs");
        }
    }
}
