//! What a region's plane calls: traps, the filler's reads and write-backs,
//! against the device model and the region's backing store.

use super::RegionStats;
use crate::device::{SharedDevice, PAGE};
use cxlfs_device_model::Op;
use residency::{Miss, MissData, MissReply, PoolBackend, ServeMissError, WritebackError};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// The thread whose reads of a region file are prefetch fills, not guest
/// traps (0: none yet). Its READs are served from the store, uncharged,
/// and only while the device still holds every page they ask for.
#[derive(Debug, Default)]
pub(super) struct FillReads {
    tid: AtomicU32,
}

impl FillReads {
    /// The calling thread is the filler from now on.
    pub(super) fn claim(&self) {
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        self.tid.store(tid as u32, Ordering::Release);
    }

    fn is_filler(&self, pid: u32) -> bool {
        pid != 0 && self.tid.load(Ordering::Acquire) == pid
    }
}

/// What a region's plane calls: traps and write-backs against the device
/// and the backing store.
pub(super) struct RegionBackend {
    pub(super) shared: Arc<SharedDevice>,
    /// The region's first device byte.
    pub(super) base: u64,
    pub(super) store: Arc<File>,
    pub(super) stats: Arc<RegionStats>,
    /// Set while the region is released: write-backs are not charged.
    pub(super) releasing: Arc<AtomicBool>,
    /// The filler thread, whose reads are not traps.
    pub(super) fills: Arc<FillReads>,
}

impl PoolBackend for RegionBackend {
    fn now_ns(&self) -> u64 {
        self.shared.now_ns()
    }

    fn on_miss(&self, miss: &Miss, _: &mut [u8]) -> Result<MissReply, ServeMissError> {
        let addr = self
            .base
            .checked_add(miss.pool_offset)
            .ok_or_else(|| ServeMissError::Device("region offset overflows".into()))?;
        if self.fills.is_filler(miss.pid) {
            return self.fill_read(addr, miss);
        }
        let charge = self
            .shared
            .charge_memory(miss.arrival_ns, Op::Read, addr, miss.len.max(1))
            .map_err(|e| ServeMissError::Device(e.to_string()))?;
        self.stats.traps.fetch_add(1, Ordering::Relaxed);
        self.stats
            .log_hits
            .fetch_add(charge.activity.log_hits, Ordering::Relaxed);
        self.stats
            .sampled_accesses
            .fetch_add(charge.sampled_pages, Ordering::Relaxed);
        self.stats
            .device_hits
            .fetch_add(charge.page_hits, Ordering::Relaxed);
        self.stats
            .device_misses
            .fetch_add(charge.page_misses, Ordering::Relaxed);
        self.stats.trap_modeled_ns.fetch_add(
            charge.completes_at_ns.saturating_sub(miss.arrival_ns),
            Ordering::Relaxed,
        );
        Ok(self.reply_from_store(miss.pool_offset, charge.completes_at_ns))
    }

    fn on_writeback(
        &self,
        pool_offset: u64,
        data: &[u8],
        pid: u32,
        arrival_ns: u64,
    ) -> Result<u64, WritebackError> {
        // Only a plane that is not split calls this (tests): store, then charge.
        self.store.write_all_at(data, pool_offset)?;
        self.on_stored_writeback(pool_offset, data.len() as u64, pid, arrival_ns)
    }

    fn on_stored_writeback(
        &self,
        pool_offset: u64,
        len: u64,
        _pid: u32,
        arrival_ns: u64,
    ) -> Result<u64, WritebackError> {
        if self.releasing.load(Ordering::Acquire) {
            return Ok(arrival_ns);
        }
        let c = self
            .shared
            .write_back_memory(arrival_ns, self.base + pool_offset, len)
            .map_err(|e| WritebackError::Device(e.to_string()))?;
        self.stats.writeback_bytes.fetch_add(len, Ordering::Relaxed);
        self.stats
            .log_writes
            .fetch_add(c.activity.log_writes, Ordering::Relaxed);
        Ok(c.completes_at_ns)
    }
}

impl RegionBackend {
    /// A reply with the store's bytes at `offset`, due at `completes_at_ns`.
    fn reply_from_store(&self, offset: u64, completes_at_ns: u64) -> MissReply {
        MissReply {
            data: MissData::File {
                file: self.store.clone(),
                offset,
            },
            completes_at_ns,
        }
    }

    /// The filler's read of prefetched pages: the store's bytes at once,
    /// uncharged (the prefetch was), if the device still holds every page.
    /// A page it dropped meanwhile is refused: it must trap again. If the
    /// device drops one after this check, its invalidation waits in the
    /// kernel for this read's folio and drops it after.
    fn fill_read(&self, addr: u64, miss: &Miss) -> Result<MissReply, ServeMissError> {
        let pages = u64::from(miss.len.max(1)).div_ceil(PAGE);
        let held = self
            .shared
            .read(|_, dev| (0..pages).all(|i| dev.is_resident(addr + i * PAGE)));
        if !held {
            return Err(ServeMissError::NotHeld);
        }
        self.stats.filled_pages.fetch_add(pages, Ordering::Relaxed);
        Ok(self.reply_from_store(miss.pool_offset, miss.arrival_ns))
    }
}
