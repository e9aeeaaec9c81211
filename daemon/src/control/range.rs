//! The range commands (prefetch, pin, unpin, evict) on a resolved target:
//! device segments of a file or pool range, the device calls segment by
//! segment, and the residency plane kept in step (DAX on).

use super::{bad, ControlCommandError, Controller, Principal};
use crate::device::{page_runs, EXTENT_SIZE};
use crate::ids::FileKey;
use cxlfs_api::control::{RangeOp, RangeResult};
use cxlfs_device_model::PAGE_SIZE;
use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Arc;

/// A host file a range command acts on, resolved (by path from the host,
/// by open file handle from a guest).
#[derive(Debug, Clone)]
pub struct ResolvedFile {
    /// The file's pool key.
    pub key: FileKey,
    /// The file, open for the residency plane (DAX fill); `None` without
    /// DAX.
    pub plane: Option<Arc<File>>,
    /// Its size in bytes.
    pub size: u64,
}

/// What a range command acts on.
#[derive(Debug, Clone)]
pub enum Target {
    /// Bytes of a host file.
    File {
        /// The file.
        file: ResolvedFile,
        /// First byte.
        offset: u64,
        /// Bytes; 0 = to the end of the file.
        len: u64,
    },
    /// A range of the pool (device address space); host only.
    Pool {
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

impl Controller {
    /// Runs a range command on a resolved target. A guest's result also
    /// carries its pinned bytes and quota.
    pub fn range(
        &self,
        who: &Principal,
        op: RangeOp,
        target: Target,
    ) -> Result<RangeResult, ControlCommandError> {
        let segs = self.segments(who, &target)?;
        let now = self.shared.now_ns();
        let mut r = RangeResult {
            completes_at_ns: now,
            ..RangeResult::default()
        };
        match op {
            RangeOp::Prefetch => self.prefetch(&target, &segs, now, &mut r)?,
            RangeOp::Pin => self.pin(who, &target, &segs, now, &mut r)?,
            RangeOp::Unpin => self.unpin(who, &segs, &mut r)?,
            RangeOp::Evict => self.evict(&segs, now, &mut r)?,
        }
        r.latency_ns = r.completes_at_ns.saturating_sub(now);
        if let Principal::Vm(_) = who {
            r.pinned_bytes = Some(self.pinned_bytes(who));
            r.pin_quota_bytes = Some(self.opts.pin_quota_bytes);
        }
        Ok(r)
    }

    /// Device segments of a target, checked.
    fn segments(
        &self,
        who: &Principal,
        target: &Target,
    ) -> Result<Vec<(u64, u64)>, ControlCommandError> {
        match target {
            Target::File {
                file, offset, len, ..
            } => {
                let (start, end) = file_span(target).ok_or_else(|| {
                    bad(format!(
                        "range {offset}+{len} is not inside the file ({} bytes)",
                        file.size
                    ))
                })?;
                Ok(self
                    .shared
                    .pool()
                    .segments(file.key, start, end - start)
                    .into_iter()
                    .map(|s| (s.addr, u64::from(s.len)))
                    .collect())
            }
            &Target::Pool { offset, len } => {
                if *who != Principal::Host {
                    return Err(ControlCommandError::Forbidden(
                        "guests may only name file ranges".into(),
                    ));
                }
                let cap = self.shared.pool().capacity_extents() * EXTENT_SIZE;
                if len == 0 || offset.checked_add(len).map_or(true, |e| e > cap) {
                    return Err(bad(format!(
                        "pool range {offset:#x}+{len:#x} is empty or beyond the pool ({cap:#x} bytes)"
                    )));
                }
                let mut out = Vec::new();
                let mut pos = offset;
                while pos < offset + len {
                    let n = (EXTENT_SIZE - pos % EXTENT_SIZE).min(offset + len - pos);
                    out.push((pos, n));
                    pos += n;
                }
                Ok(out)
            }
        }
    }

    fn prefetch(
        &self,
        target: &Target,
        segs: &[(u64, u64)],
        now: u64,
        r: &mut RangeResult,
    ) -> Result<(), ControlCommandError> {
        let mut fresh = Vec::new();
        for &(addr, len) in segs {
            let mut dev = self.shared.device();
            let before: Vec<u64> = pages_of(addr, len)
                .filter(|&p| !dev.is_resident(p * PAGE_SIZE))
                .collect();
            let o = dev.prefetch(now, addr, len)?;
            fresh.extend(
                before
                    .into_iter()
                    .filter(|&p| dev.is_resident(p * PAGE_SIZE)),
            );
            let evicted = dev.drain_evictions();
            drop(dev);
            self.mirror(evicted, false);
            r.pages += o.pages;
            r.changed += o.filled;
            r.completes_at_ns = r.completes_at_ns.max(o.completes_at_ns);
        }
        r.plane_filled = self.fill_plane(target, &fresh);
        Ok(())
    }

    fn evict(
        &self,
        segs: &[(u64, u64)],
        now: u64,
        r: &mut RangeResult,
    ) -> Result<(), ControlCommandError> {
        let mut evicted = Vec::new();
        for &(addr, len) in segs {
            let mut dev = self.shared.device();
            let o = dev.evict(now, addr, len)?;
            evicted.extend(dev.drain_evictions());
            drop(dev);
            r.pages += pages_of(addr, len).count() as u64;
            r.changed += o.evicted;
            r.skipped += o.skipped_pinned;
            r.written_back += o.written_back;
            r.completes_at_ns = r.completes_at_ns.max(o.completes_at_ns);
        }
        r.plane_evicted = self.mirror(evicted, true);
        Ok(())
    }

    /// Drops evicted pages (of DAX-mapped extents) from the residency
    /// plane; `wait`: until the kernel has done it (dirty pages written
    /// back). Returns the pages handed over.
    pub(super) fn mirror(&self, evicted: Vec<u64>, wait: bool) -> u64 {
        self.dax
            .as_ref()
            .map_or(0, |d| d.evict_pages(evicted, wait))
    }

    /// DAX on: stores `pages` (device pages a prefetch or pin just brought
    /// into the device cache) into the residency plane with the host file's
    /// bytes, so that the guest's next access does not trap. Only pages of
    /// file targets; each chunk gets its DAX extent first (as SETUPMAPPING
    /// would), so later device evictions reach the plane too.
    pub(super) fn fill_plane(&self, target: &Target, pages: &[u64]) -> u64 {
        let (Target::File { file: f, .. }, Some(dax)) = (target, self.dax.as_ref()) else {
            return 0;
        };
        let Some(host_file) = &f.plane else {
            return 0;
        };
        if pages.is_empty() {
            return 0;
        }
        // Device page -> file offset, through the extents the pool gave the
        // file's chunks (each chunk gets its DAX extent, as SETUPMAPPING would).
        let Some((start, end)) = file_span(target) else {
            return 0;
        };
        let mut by_extent: BTreeMap<u64, u64> = BTreeMap::new(); // extent -> chunk
        for c in start / EXTENT_SIZE..end.div_ceil(EXTENT_SIZE) {
            if let Some(e) = dax.window_extent_of(f.key, c, host_file) {
                by_extent.insert(e, c);
            }
        }
        // Runs of consecutive pages, cut at extent ends, in extents the
        // file owns; the plane stores them only where that cannot race a
        // guest store (`DaxPlane::fill_from_file`).
        let mut sorted = pages.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let per_extent = EXTENT_SIZE / PAGE_SIZE;
        let mut filled = 0u64;
        for (first, count) in page_runs(&sorted) {
            let mut p = first;
            while p < first + count {
                let n = (first + count).min((p / per_extent + 1) * per_extent) - p;
                if by_extent.contains_key(&(p / per_extent)) {
                    filled += dax.fill_from_file(p, n);
                }
                p += n;
            }
        }
        filled
    }
}

/// The byte span `[start, end)` a file target covers: only the file's own
/// pages (up to its last page); `len` 0 = to the end. `None` when empty,
/// past the end, or overflowing.
fn file_span(target: &Target) -> Option<(u64, u64)> {
    let Target::File { file, offset, len } = target else {
        return None;
    };
    let (offset, len) = (*offset, *len);
    let limit = file.size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
    if offset >= limit {
        return None;
    }
    let end = if len == 0 {
        limit
    } else {
        offset.checked_add(len)?.min(limit)
    };
    Some((offset, end))
}

/// Device page numbers of `[addr, addr + len)`.
pub(super) fn pages_of(addr: u64, len: u64) -> impl Iterator<Item = u64> {
    let first = addr / PAGE_SIZE;
    let end = (addr + len).div_ceil(PAGE_SIZE);
    first..end
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pages_of_covers_partial_pages() {
        assert_eq!(pages_of(4095, 2).collect::<Vec<_>>(), [0, 1]);
    }
}
