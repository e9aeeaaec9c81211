//! The range commands (prefetch, pin, unpin, evict) on a resolved target:
//! device segments of a file or pool range, the device calls segment by
//! segment, and the residency plane kept in step (DAX on).
//!
//! A range is untrusted (a guest chooses it): its work is bounded before
//! it starts. A file range covers only the host file's allocated data
//! (`SEEK_DATA` / `SEEK_HOLE`, not its apparent size, so a 16 TiB sparse
//! file is empty), at most [`super::ControlOptions::max_range_bytes`] of
//! it; pin and prefetch then allocate pool extents for those bytes only,
//! while unpin and evict act on the extents the file already owns and
//! allocate none. A pin over the quota or the bound is refused before any
//! page list is built; a prefetch is cut to the bound and to the VM's
//! prefetch budget.

use super::{bad, ControlCommandError, Controller, Principal};
use crate::device::{page_runs, Publish, EXTENT_SIZE};
use crate::ids::FileKey;
use cxlfs_api::control::{RangeOp, RangeResult};
use cxlfs_device_model::AccessError;
use cxlfs_device_model::PAGE_SIZE;
use rustix::fs::SeekFrom;
use rustix::io::Errno;
use std::collections::BTreeSet;
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
    /// The file open for reading its layout (`SEEK_DATA` / `SEEK_HOLE`).
    pub data: Arc<File>,
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
    /// A range of a CXL memory region, in device address space (checked
    /// against the region); host only.
    Memory {
        /// First device byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

/// The page-aligned data spans `[start, end)` of a file range, at most
/// `max` bytes of them; `true` when there was more data than that.
type Spans = (Vec<(u64, u64)>, bool);

impl Controller {
    /// Runs a range command on a resolved target. A guest's result also
    /// carries its pinned bytes and quota.
    pub fn range(
        &self,
        who: &Principal,
        op: RangeOp,
        target: Target,
    ) -> Result<RangeResult, ControlCommandError> {
        let now = self.shared.now_ns();
        let mut r = RangeResult {
            completes_at_ns: now,
            ..RangeResult::default()
        };
        let segs = self.segments(who, op, &target)?;
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

    /// The most bytes `op` may cover for `who` in one command, and the
    /// error when a range holds more (`None`: cut the range instead).
    fn range_bound(
        &self,
        who: &Principal,
        op: RangeOp,
    ) -> Result<(u64, Option<ControlCommandError>), ControlCommandError> {
        let max = self.opts.max_range_bytes;
        match (op, who) {
            (RangeOp::Pin, Principal::Vm(vm)) => {
                let held = self.pinned_bytes(who);
                let room = self.opts.pin_quota_bytes.saturating_sub(held);
                let refusal = ControlCommandError::QuotaExceeded {
                    vm: vm.clone(),
                    requested_bytes: room.min(max).saturating_add(1),
                    held_bytes: held,
                    quota_bytes: self.opts.pin_quota_bytes,
                };
                Ok((room.min(max), Some(refusal)))
            }
            (RangeOp::Pin, Principal::Host) => Ok((max, Some(too_large(max)))),
            (RangeOp::Prefetch, Principal::Vm(vm)) => {
                let budget = self.prefetch_budget(vm);
                if budget < PAGE_SIZE {
                    return Err(ControlCommandError::Throttled {
                        vm: vm.clone(),
                        budget_bytes: self.opts.prefetch_budget_bytes,
                    });
                }
                Ok((max.min(budget), None))
            }
            _ => Ok((max, None)),
        }
    }

    /// Device segments of a target, bounded and checked (see the module
    /// comment); no lock is held while the file's layout is read.
    fn segments(
        &self,
        who: &Principal,
        op: RangeOp,
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
                if matches!(op, RangeOp::Unpin | RangeOp::Evict) {
                    return Ok(self.owned_segments(file.key, start, end));
                }
                let (max, refusal) = self.range_bound(who, op)?;
                let (spans, more) = data_spans(&file.data, start, end, max).map_err(|e| {
                    ControlCommandError::Io {
                        what: "read the file's layout (SEEK_DATA)".into(),
                        source: e.into(),
                    }
                })?;
                if more {
                    if let Some(e) = refusal {
                        return Err(e);
                    }
                }
                if let (RangeOp::Prefetch, Principal::Vm(vm)) = (op, who) {
                    let bytes = spans.iter().map(|&(a, b)| b - a).sum();
                    self.spend_prefetch_budget(vm, bytes);
                }
                // Bounded: at most `max` bytes in 2 MiB pieces.
                let want = spans
                    .iter()
                    .map(|&(a, b)| (b - a).div_ceil(EXTENT_SIZE) + 1)
                    .sum();
                self.shared.make_room(want);
                let segments = self.shared.transact(Publish::Hand, |pool, _| {
                    spans
                        .iter()
                        .flat_map(|&(a, b)| pool.segments(file.key, a, b - a))
                        .map(|s| (s.addr, u64::from(s.len)))
                        .collect()
                });
                Ok(segments.0)
            }
            &Target::Pool { offset, len } | &Target::Memory { offset, len } => {
                if *who != Principal::Host {
                    return Err(ControlCommandError::Forbidden(
                        "guests may only name file ranges".into(),
                    ));
                }
                let cap = self.shared.read(|p, _| p.capacity_extents()) * EXTENT_SIZE;
                let in_pool = matches!(target, Target::Pool { .. });
                if in_pool && (len == 0 || offset.checked_add(len).map_or(true, |e| e > cap)) {
                    return Err(bad(format!(
                        "pool range {offset:#x}+{len:#x} is empty or beyond the pool ({cap:#x} bytes)"
                    )));
                }
                let max = self.opts.max_range_bytes;
                if matches!(op, RangeOp::Pin | RangeOp::Prefetch) && len > max {
                    return Err(too_large(max));
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

    /// Device segments of file bytes `[start, end)` in extents the file
    /// already owns (nothing is allocated: unpin and evict have nothing to
    /// do elsewhere). Work is bounded by the file's extents, not the range.
    fn owned_segments(&self, key: FileKey, start: u64, end: u64) -> Vec<(u64, u64)> {
        let own = self.shared.read(|p, _| p.own_extents(key));
        own.into_iter()
            .filter_map(|(chunk, extent)| {
                let lo = chunk.checked_mul(EXTENT_SIZE)?.max(start);
                let hi = chunk.checked_add(1)?.saturating_mul(EXTENT_SIZE).min(end);
                (lo < hi).then(|| (extent * EXTENT_SIZE + lo % EXTENT_SIZE, hi - lo))
            })
            .collect()
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
            let (o, _) = self.shared.transact(Publish::Hand, |_, dev| {
                let before: Vec<u64> = pages_of(addr, len)
                    .filter(|&p| !dev.is_resident(p * PAGE_SIZE))
                    .collect();
                let o = dev.prefetch(now, addr, len)?;
                fresh.extend(
                    before
                        .into_iter()
                        .filter(|&p| dev.is_resident(p * PAGE_SIZE)),
                );
                Ok::<_, AccessError>(o)
            });
            let o = o?;
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
        for &(addr, len) in segs {
            // Waits until the residency plane dropped the pages (dirty ones
            // written back): when the command returns, no window maps them.
            let (o, published) = self
                .shared
                .transact(Publish::Wait, |_, dev| dev.evict(now, addr, len));
            let o = o?;
            r.plane_evicted += published.dropped_pages;
            r.pages += pages_of(addr, len).count() as u64;
            r.changed += o.evicted;
            r.skipped += o.skipped_pinned;
            r.written_back += o.written_back;
            r.completes_at_ns = r.completes_at_ns.max(o.completes_at_ns);
        }
        Ok(())
    }

    /// DAX on: stores `pages` (device pages a prefetch or pin just brought
    /// into the device cache) into the residency plane with the host file's
    /// bytes, so that the guest's next access does not trap. Only pages of
    /// file targets; each chunk gets its DAX extent first (as SETUPMAPPING
    /// would), so later device evictions reach the plane too. The chunks
    /// are those of the pages (a bounded set), never the whole range.
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
        let per_extent = EXTENT_SIZE / PAGE_SIZE;
        let mut sorted = pages.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        // Device page -> the file chunk its extent holds (the pool's owner
        // table), then each chunk gets its DAX extent.
        let extents: BTreeSet<u64> = sorted.iter().map(|p| p / per_extent).collect();
        let chunks: Vec<u64> = self.shared.read(|pool, _| {
            extents
                .iter()
                .filter_map(|&e| pool.owner_of(e).filter(|o| o.key == f.key))
                .map(|o| o.chunk)
                .collect()
        });
        let windowed: BTreeSet<u64> = chunks
            .into_iter()
            .filter_map(|c| dax.window_extent_of(f.key, c, host_file))
            .collect();
        // Runs of consecutive pages, cut at extent ends, in extents the
        // file owns; the plane stores them only where that cannot race a
        // guest store (`DaxPlane::fill_from_file`).
        let mut filled = 0u64;
        for (first, count) in page_runs(&sorted) {
            let mut p = first;
            while p < first + count {
                let n = (first + count).min((p / per_extent + 1) * per_extent) - p;
                if windowed.contains(&(p / per_extent)) {
                    filled += dax.fill_from_file(p, n);
                }
                p += n;
            }
        }
        filled
    }
}

fn too_large(max: u64) -> ControlCommandError {
    bad(format!(
        "the range holds more than {max} bytes of data; one command covers at most that (cxlfsd --max-range-bytes)"
    ))
}

/// The byte span `[start, end)` a file target covers: only the file's own
/// pages (up to its last page); `len` 0 = to the end. `None` when empty,
/// past the end, or overflowing.
fn file_span(target: &Target) -> Option<(u64, u64)> {
    let Target::File { file, offset, len } = target else {
        return None;
    };
    let (offset, len) = (*offset, *len);
    let limit = file.size.div_ceil(PAGE_SIZE).checked_mul(PAGE_SIZE)?;
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

/// The allocated data of `file` within `[start, end)`, page aligned, at
/// most `max` bytes (see [`Spans`]). Holes cost one `lseek` each, and each
/// data span is at least a page, so the walk is bounded by `max` too. A
/// file system without `SEEK_DATA` counts as all data.
fn data_spans(file: &File, start: u64, end: u64, max: u64) -> Result<Spans, Errno> {
    let mut spans = Vec::new();
    let mut total = 0u64;
    let mut pos = start;
    while pos < end {
        let data = match rustix::fs::seek(file, SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data at or after `pos`.
            Err(Errno::NXIO) => break,
            Err(Errno::INVAL) => pos,
            Err(e) => return Err(e),
        };
        if data >= end {
            break;
        }
        let hole = match rustix::fs::seek(file, SeekFrom::Hole(data)) {
            Ok(h) => h,
            Err(Errno::NXIO | Errno::INVAL) => end,
            Err(e) => return Err(e),
        };
        let lo = data / PAGE_SIZE * PAGE_SIZE;
        let hi = hole
            .max(data.saturating_add(1))
            .div_ceil(PAGE_SIZE)
            .saturating_mul(PAGE_SIZE)
            .min(end);
        let lo = lo.max(spans.last().map_or(start, |&(_, h)| h));
        if lo < hi {
            let n = hi - lo;
            if total + n > max {
                let room = (max - total) / PAGE_SIZE * PAGE_SIZE;
                if room > 0 {
                    spans.push((lo, lo + room));
                }
                return Ok((spans, true));
            }
            total += n;
            spans.push((lo, hi));
        }
        pos = hi;
    }
    Ok((spans, false))
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
    use std::os::unix::fs::FileExt;

    #[test]
    fn pages_of_covers_partial_pages() {
        assert_eq!(pages_of(4095, 2).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn data_spans_skip_holes_and_stop_at_the_bound() {
        // 16 TiB apparent size (less a block: ext4's largest file), data
        // only at 1 MiB and 8 GiB.
        const SIZE: u64 = (16 << 40) - 4096;
        let f = tempfile::tempfile().unwrap();
        f.set_len(SIZE).unwrap();
        f.write_at(&[1; 10], 1 << 20).unwrap();
        f.write_at(&[2; 5000], 8 << 30).unwrap();
        let t = std::time::Instant::now();
        let (spans, more) = data_spans(&f, 0, SIZE, 1 << 30).unwrap();
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert!(!more);
        let bytes: u64 = spans.iter().map(|&(a, b)| b - a).sum();
        // One file-system block each at least, far from 16 TiB.
        assert!((3 * PAGE_SIZE..=(4 << 20)).contains(&bytes), "{spans:?}");
        assert!(spans.iter().any(|&(a, b)| a <= 1 << 20 && b > 1 << 20));
        assert!(spans
            .iter()
            .any(|&(a, b)| a <= 8 << 30 && b >= (8 << 30) + 5000));
        // A bound of one page: one page, and "more".
        let (spans, more) = data_spans(&f, 0, SIZE, PAGE_SIZE).unwrap();
        assert!(more);
        assert_eq!(spans.iter().map(|&(a, b)| b - a).sum::<u64>(), PAGE_SIZE);
        // An empty sparse file has no data at all.
        let g = tempfile::tempfile().unwrap();
        g.set_len(SIZE).unwrap();
        assert_eq!(data_spans(&g, 0, SIZE, u64::MAX).unwrap(), (vec![], false));
    }
}
