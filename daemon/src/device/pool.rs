//! The pool: device addresses for file pages (a pure allocator: no
//! device, no clock, no plane).
//!
//! Every host file that a guest reads or writes gets device address space in
//! 2 MiB extents: file bytes `[k * 2 MiB, (k+1) * 2 MiB)` live in one
//! contiguous, 2 MiB-aligned device range. A DAX window slot is 2 MiB, so
//! one slot maps one contiguous pool range. Files are keyed by the host
//! `(st_dev, st_ino)` ([`FileKey`]), not by a VM's node id: two VMs reading
//! the same file touch the same device pages, so the device cache is shared.
//!
//! Extents are allocated on first touch and stay with the file while some
//! VM session knows its inode. They return to the pool ([`Pool::take`],
//! then [`Pool::free_extents`] once their pages are gone from the device
//! and the residency plane):
//! * when the file is truncated: the chunks wholly past the new size;
//! * when the last reference goes and the file is deleted on the host;
//! * when the last reference goes on a file that still exists, the file
//!   joins the *idle list* and keeps its extents (a reopen finds its cached
//!   pages: guest kernels with short entry timeouts forget a file at every
//!   close). Idle files are reclaimed, oldest release first, when the pool
//!   runs short (`SharedDevice::make_room`), so no guest can fill the pool
//!   with files it no longer holds, and extents are shared (aliased) only
//!   when referenced files fill it;
//! * never while a DAX window maps the extent (no alias: a guest would see
//!   the next owner's pages); such extents stay with the file until a later
//!   reclaim finds them unmapped (a disconnect sweeps deleted idle files).
//!
//! Files a host command touched that no VM knows are not on the idle list
//! (no reference ever went); they are reclaimed when a VM's last reference
//! to them goes, or by a truncation.
//!
//! The pool also keeps the census of the pages placed so far (touched at
//! least once) per DRAM / CXL interleave slot ([`super::placement`]), so
//! that the tier split at any ratio is cheap to report.

use super::placement::{tier_at, Tier, PERIOD};
use crate::ids::FileKey;
use std::collections::{BTreeMap, HashMap};

/// Bytes per pool extent (= one DAX window slot).
pub const EXTENT_SIZE: u64 = 2 << 20;
/// Bytes per pool page (= device page, residency-plane page).
pub const PAGE: u64 = 4096;
/// Pages per pool extent (2 MiB / 4 KiB).
const EXTENT_PAGES: u64 = EXTENT_SIZE / PAGE;

#[derive(Debug, Default)]
struct FileExtents {
    /// Inode references held by VMs.
    refs: u64,
    /// With no reference: its place in the idle list (release order).
    idle: Option<u64>,
    /// Deleted on the host when the last reference went.
    deleted: bool,
    /// Pool extent index per 2 MiB file chunk, allocated on first touch.
    extents: HashMap<u64, u64>,
}

/// Who owns a pool extent (for the residency plane's reverse look-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentOwner {
    /// The host file.
    pub key: FileKey,
    /// The file's 2 MiB chunk held by the extent.
    pub chunk: u64,
}

/// The pool address allocator.
#[derive(Debug)]
pub struct Pool {
    capacity_extents: u64,
    next: u64,
    free: Vec<u64>,
    files: HashMap<FileKey, FileExtents>,
    aliased: u64,
    /// Extent → (file, chunk), for extents a file owns (not aliased ones).
    owners: HashMap<u64, (FileKey, u64)>,
    /// Pool pages placed so far (touched), per interleave slot.
    census: TierCensus,
    /// Files no VM references, oldest release first (reclaimed first when
    /// the pool runs short).
    idle: BTreeMap<u64, FileKey>,
    idle_seq: u64,
}

/// What the VMs' sessions hold in the pool ([`Pool::held`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolHeld {
    /// Inode references on pool files.
    pub refs: u64,
    /// Extents owned by files with a reference.
    pub extents: u64,
}

/// One contiguous piece of a file range in device address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Device address of the first byte.
    pub addr: u64,
    /// Bytes (never crosses an extent).
    pub len: u32,
}

impl Pool {
    /// A pool over `capacity_bytes` of device address space.
    pub fn new(capacity_bytes: u64) -> Self {
        Pool {
            capacity_extents: capacity_bytes / EXTENT_SIZE,
            next: 0,
            free: Vec::new(),
            files: HashMap::new(),
            aliased: 0,
            owners: HashMap::new(),
            census: TierCensus::default(),
            idle: BTreeMap::new(),
            idle_seq: 0,
        }
    }

    /// Pool pages placed (touched) so far: `(dram, cxl)` at `cxl_ratio`.
    pub fn placed_pages(&self, cxl_ratio: u8) -> (u64, u64) {
        self.census.split(cxl_ratio)
    }

    /// Marks pool bytes `[addr, addr + len)` placed (first touch).
    pub fn touch(&mut self, addr: u64, len: u64) {
        if len > 0 {
            self.census.touch(addr / PAGE, (addr + len - 1) / PAGE);
        }
    }

    /// Extents the pool can hand out.
    pub fn capacity_extents(&self) -> u64 {
        self.capacity_extents
    }

    /// Extents currently held by files.
    pub fn allocated_extents(&self) -> u64 {
        self.next - self.free.len() as u64
    }

    /// Chunks that had to share an extent because the pool was full (so
    /// far: one that gets an extent of its own later still counts).
    pub fn aliased_chunks(&self) -> u64 {
        self.aliased
    }

    /// A VM took a reference on the file's inode.
    pub fn acquire(&mut self, key: FileKey) {
        let f = self.files.entry(key).or_default();
        f.refs += 1;
        if let Some(seq) = f.idle.take() {
            self.idle.remove(&seq);
        }
    }

    /// A VM dropped a reference (`deleted`: the host file has no links
    /// left); returns the references left. A file with none joins the idle
    /// list and keeps its extents until the caller reclaims them
    /// ([`Pool::take`]); one with no extent is forgotten at once (a file a
    /// guest only looked up or listed holds nothing worth keeping).
    pub fn release(&mut self, key: FileKey, deleted: bool) -> u64 {
        let Some(f) = self.files.get_mut(&key) else {
            return 0;
        };
        f.refs = f.refs.saturating_sub(1);
        if f.refs > 0 {
            return f.refs;
        }
        if f.extents.is_empty() {
            self.forget(key);
            return 0;
        }
        f.deleted |= deleted;
        if f.idle.is_none() {
            self.idle_seq += 1;
            f.idle = Some(self.idle_seq);
            self.idle.insert(self.idle_seq, key);
        }
        0
    }

    /// Drops the file from the tables and the idle list.
    fn forget(&mut self, key: FileKey) {
        if let Some(seq) = self.files.remove(&key).and_then(|f| f.idle) {
            self.idle.remove(&seq);
        }
    }

    /// The idle file (no reference, extents held) released longest ago.
    pub fn oldest_idle(&self) -> Option<FileKey> {
        self.idle.values().next().copied()
    }

    /// Moves an idle file to the young end of the idle list (its extents
    /// could not be reclaimed now: a window maps them).
    pub fn requeue_idle(&mut self, key: FileKey) {
        if let Some(f) = self.files.get_mut(&key) {
            if let Some(seq) = f.idle.take() {
                self.idle.remove(&seq);
                self.idle_seq += 1;
                f.idle = Some(self.idle_seq);
                self.idle.insert(self.idle_seq, key);
            }
        }
    }

    /// Idle files that were deleted on the host (their extents serve no
    /// reopen).
    pub fn idle_deleted(&self) -> Vec<FileKey> {
        self.idle
            .values()
            .filter(|k| self.files.get(k).is_some_and(|f| f.deleted))
            .copied()
            .collect()
    }

    /// Extents the pool can still hand out without reclaiming.
    pub fn free_count(&self) -> u64 {
        self.capacity_extents - self.allocated_extents()
    }

    /// Takes the file's chunks from `from_chunk` on out of it, except those
    /// whose extent `keep` holds (a window maps it): returns the file's own
    /// extents among them, off the free list (the caller frees them with
    /// [`Pool::free_extents`] once their pages are gone). Aliased chunks
    /// are simply forgotten. A file left with no chunk and no reference is
    /// forgotten. Work is bounded by the file's chunks.
    pub fn take(&mut self, key: FileKey, from_chunk: u64, keep: &dyn Fn(u64) -> bool) -> Vec<u64> {
        let cap = self.capacity_extents;
        let Some(f) = self.files.get_mut(&key) else {
            return Vec::new();
        };
        let mut own = Vec::new();
        f.extents.retain(|&chunk, &mut e| {
            if chunk < from_chunk || (e < cap && keep(e)) {
                return true;
            }
            if e < cap {
                own.push(e);
            }
            false
        });
        if f.extents.is_empty() && f.refs == 0 {
            self.forget(key);
        }
        // The owners stay until the extents are freed: the plane writes
        // back the taken extents' dirty pages meanwhile, to their files.
        own
    }

    /// The file is gone from the host: returns its own extents (not those it
    /// shared because the pool was full) to the pool, and lists them so the
    /// caller can discard their pages from the device.
    pub fn remove(&mut self, key: FileKey) -> Vec<u64> {
        let own = self.take_file(key);
        self.free_extents(&own);
        own
    }

    /// Forgets the file like [`Pool::remove`] but keeps its own extents off
    /// the free list (the caller frees them with [`Pool::free_extents`] once
    /// their pages are gone from the residency plane). Returns them.
    pub fn take_file(&mut self, key: FileKey) -> Vec<u64> {
        let own = self.take(key, 0, &|_| false);
        self.forget(key);
        own
    }

    /// Returns extents taken with [`Pool::take_file`] (or
    /// [`Pool::take`]) to the pool; their owners are forgotten now.
    pub fn free_extents(&mut self, extents: &[u64]) {
        for e in extents {
            self.census.forget_extent(*e);
            self.owners.remove(e);
        }
        self.free.extend(extents);
    }

    /// The extent holding file chunk `chunk` as the file's own (allocated
    /// if needed); `None` when the pool is full and the chunk would have
    /// to share an extent (a DAX window slot must map the file's own pages).
    /// A chunk that shares an extent (the pool was full when it was first
    /// touched) gets one of its own once one is free.
    pub fn own_extent(&mut self, key: FileKey, chunk: u64) -> Option<u64> {
        self.extent_for(key, chunk);
        let raw = *self.files.get(&key)?.extents.get(&chunk)?;
        if raw < self.capacity_extents {
            return Some(raw);
        }
        let e = self.free_extent()?;
        self.files.get_mut(&key)?.extents.insert(chunk, e);
        self.owners.insert(e, (key, chunk));
        Some(e)
    }

    /// An extent off the free list or never handed out, if any.
    fn free_extent(&mut self) -> Option<u64> {
        if let Some(e) = self.free.pop() {
            return Some(e);
        }
        (self.next < self.capacity_extents).then(|| {
            self.next += 1;
            self.next - 1
        })
    }

    /// The file some VM references that owns the most extents, leaving
    /// out `skip` (ties: the smaller key): where a DAX slot takes extents
    /// from when no idle file has any. Work is bounded by the files.
    pub fn largest_referenced(&self, skip: &[FileKey]) -> Option<FileKey> {
        let cap = self.capacity_extents;
        self.files
            .iter()
            .filter(|(k, f)| f.refs > 0 && !skip.contains(k))
            .map(|(k, f)| (f.extents.values().filter(|&&e| e < cap).count(), *k))
            .filter(|&(n, _)| n > 0)
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, k)| k)
    }

    /// The file's own extents (not shared ones) as `(chunk, extent)`, in
    /// chunk order.
    pub fn own_extents(&self, key: FileKey) -> Vec<(u64, u64)> {
        let Some(f) = self.files.get(&key) else {
            return Vec::new();
        };
        let mut v: Vec<(u64, u64)> = f
            .extents
            .iter()
            .map(|(&c, &e)| (c, e))
            .filter(|&(_, e)| e < self.capacity_extents)
            .collect();
        v.sort_unstable();
        v
    }

    /// What the VMs' sessions hold now: their inode references on pool
    /// files, and the extents those files own. The other allocated extents
    /// belong to idle files and can be reclaimed; with no VM connected
    /// both are 0. Work is bounded by the files.
    pub fn held(&self) -> PoolHeld {
        let cap = self.capacity_extents;
        let mut held = PoolHeld::default();
        for f in self.files.values().filter(|f| f.refs > 0) {
            held.refs += f.refs;
            held.extents += f.extents.values().filter(|&&e| e < cap).count() as u64;
        }
        held
    }

    /// Whether the pool knows the file (references or extents).
    pub fn knows(&self, key: FileKey) -> bool {
        self.files.contains_key(&key)
    }

    /// References VMs hold on the file.
    pub fn refs(&self, key: FileKey) -> u64 {
        self.files.get(&key).map_or(0, |f| f.refs)
    }

    /// Who owns pool extent `extent`.
    pub fn owner_of(&self, extent: u64) -> Option<ExtentOwner> {
        let &(key, chunk) = self.owners.get(&extent)?;
        Some(ExtentOwner { key, chunk })
    }

    fn extent_for(&mut self, key: FileKey, chunk: u64) -> u64 {
        let cap = self.capacity_extents.max(1);
        if let Some(&e) = self.files.get(&key).and_then(|f| f.extents.get(&chunk)) {
            return e;
        }
        let e = if let Some(e) = self.free_extent() {
            e
        } else {
            // Full even after `SharedDevice::make_room` reclaimed idle files'
            // extents: share one (deterministically) rather than fail the I/O.
            // A DAX window never maps a shared extent (`own_extent`).
            self.aliased += 1;
            (key.ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ chunk) % cap + cap
        };
        self.files.entry(key).or_default().extents.insert(chunk, e);
        if e < self.capacity_extents {
            self.owners.insert(e, (key, chunk));
        }
        e % cap
    }

    /// Device segments for file bytes `[offset, offset + len)`, allocating
    /// extents as needed.
    pub fn segments(&mut self, key: FileKey, offset: u64, len: u64) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset.saturating_add(len);
        while pos < end {
            let chunk = pos / EXTENT_SIZE;
            let within = pos % EXTENT_SIZE;
            let n = (EXTENT_SIZE - within).min(end - pos);
            let extent = self.extent_for(key, chunk) % self.capacity_extents.max(1);
            out.push(Segment {
                addr: extent * EXTENT_SIZE + within,
                len: n as u32,
            });
            pos += n;
        }
        out
    }

    /// The pool extent holding file chunk `chunk`, if allocated.
    pub fn extent_of(&self, key: FileKey, chunk: u64) -> Option<u64> {
        self.files
            .get(&key)
            .and_then(|f| f.extents.get(&chunk))
            .map(|e| e % self.capacity_extents.max(1))
    }
}

/// `(first, count)` runs of consecutive page numbers in sorted `pages`.
pub fn page_runs(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in pages {
        match out.last_mut() {
            Some((first, count)) if *first + *count == p => *count += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

/// The pool pages placed so far (touched at least once), counted per
/// interleave slot, so that the split at any ratio is cheap to report.
#[derive(Debug)]
struct TierCensus {
    /// One bit per page of each touched extent.
    extents: HashMap<u64, [u64; (EXTENT_PAGES / 64) as usize]>,
    per_slot: [u64; PERIOD as usize],
}

impl Default for TierCensus {
    fn default() -> Self {
        TierCensus {
            extents: HashMap::new(),
            per_slot: [0; PERIOD as usize],
        }
    }
}

impl TierCensus {
    /// Marks pool pages `[first, last]` placed.
    fn touch(&mut self, first: u64, last: u64) {
        let mut page = first;
        while page <= last {
            let extent = page / EXTENT_PAGES;
            let bits = self
                .extents
                .entry(extent)
                .or_insert([0; (EXTENT_PAGES / 64) as usize]);
            let end = last.min((extent + 1) * EXTENT_PAGES - 1);
            while page <= end {
                let i = page % EXTENT_PAGES;
                let (w, b) = ((i / 64) as usize, 1u64 << (i % 64));
                if bits[w] & b == 0 {
                    bits[w] |= b;
                    self.per_slot[(page % PERIOD) as usize] += 1;
                }
                page += 1;
            }
        }
    }

    /// The extent's pages are no longer file pages (the file is gone).
    fn forget_extent(&mut self, extent: u64) {
        let Some(bits) = self.extents.remove(&extent) else {
            return;
        };
        for (w, word) in bits.iter().enumerate() {
            let mut word = *word;
            while word != 0 {
                let i = u64::from(word.trailing_zeros());
                word &= word - 1;
                let page = extent * EXTENT_PAGES + w as u64 * 64 + i;
                self.per_slot[(page % PERIOD) as usize] -= 1;
            }
        }
    }

    /// `(dram pages, cxl pages)` placed, at `cxl_ratio`.
    fn split(&self, cxl_ratio: u8) -> (u64, u64) {
        let mut dram = 0;
        let mut cxl = 0;
        for (slot, &n) in self.per_slot.iter().enumerate() {
            match tier_at(cxl_ratio, slot as u64) {
                Tier::Dram => dram += n,
                Tier::Cxl => cxl += n,
            }
        }
        (dram, cxl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: FileKey = FileKey { dev: 1, ino: 2 };

    #[test]
    fn an_aliased_chunk_gets_its_own_extent_once_one_is_free() {
        let mut p = Pool::new(2 * EXTENT_SIZE);
        let other = FileKey { dev: 1, ino: 3 };
        p.acquire(K);
        p.acquire(other);
        assert_eq!(p.own_extent(K, 0), Some(0));
        assert_eq!(p.own_extent(K, 1), Some(1));
        // Full: the other file's chunk shares an extent, and has none of
        // its own for a window.
        assert_eq!(p.segments(other, 0, 4096).len(), 1);
        assert_eq!(p.aliased_chunks(), 1);
        assert_eq!(p.own_extent(other, 0), None);
        // K's chunk 1 is taken back: the alias becomes an own extent.
        let taken = p.take(K, 1, &|_| false);
        assert_eq!(taken, [1]);
        // Taken, not yet freed: still owned (its dirty pages are written
        // back to K meanwhile).
        assert_eq!(p.owner_of(1), Some(ExtentOwner { key: K, chunk: 1 }));
        p.free_extents(&taken);
        assert_eq!(p.owner_of(1), None);
        assert_eq!(p.own_extent(other, 0), Some(1));
        assert_eq!(
            p.owner_of(1),
            Some(ExtentOwner {
                key: other,
                chunk: 0
            })
        );
        assert_eq!(p.aliased_chunks(), 1, "a count of what happened");
        assert_eq!(p.segments(other, 0, 4096)[0].addr, EXTENT_SIZE);
    }

    #[test]
    fn the_largest_referenced_file_gives_extents_first() {
        let mut p = Pool::new(8 * EXTENT_SIZE);
        let (a, b, idle) = (
            FileKey { dev: 1, ino: 10 },
            FileKey { dev: 1, ino: 11 },
            FileKey { dev: 1, ino: 12 },
        );
        for k in [a, b, idle] {
            p.acquire(k);
        }
        p.segments(a, 0, EXTENT_SIZE);
        p.segments(b, 0, 3 * EXTENT_SIZE);
        p.segments(idle, 0, 4 * EXTENT_SIZE);
        p.release(idle, false);
        assert_eq!(p.largest_referenced(&[]), Some(b));
        assert_eq!(p.largest_referenced(&[b]), Some(a));
        assert_eq!(
            p.largest_referenced(&[a, b]),
            None,
            "idle files are make_room's"
        );
    }

    #[test]
    fn what_sessions_hold_goes_with_their_last_reference() {
        let mut p = Pool::new(8 * EXTENT_SIZE);
        let other = FileKey { dev: 1, ino: 3 };
        p.acquire(K);
        p.acquire(K);
        p.acquire(other);
        p.segments(K, 0, 2 * EXTENT_SIZE);
        p.segments(other, 0, 1);
        assert_eq!(
            p.held(),
            PoolHeld {
                refs: 3,
                extents: 3
            }
        );
        p.release(other, false);
        assert_eq!(
            p.held(),
            PoolHeld {
                refs: 2,
                extents: 2
            }
        );
        p.release(K, false);
        p.release(K, false);
        // Idle files keep their extents, but nobody holds them.
        assert_eq!(p.held(), PoolHeld::default());
        assert_eq!(p.allocated_extents(), 3);
    }

    #[test]
    fn a_released_file_with_no_extent_is_forgotten() {
        let mut p = Pool::new(8 * EXTENT_SIZE);
        let looked_up: Vec<FileKey> = (0..1000).map(|ino| FileKey { dev: 2, ino }).collect();
        for &k in &looked_up {
            p.acquire(k);
            p.acquire(k);
        }
        p.acquire(K);
        p.segments(K, 0, 1);
        for &k in &looked_up {
            assert_eq!(p.release(k, false), 1);
            assert!(p.knows(k), "a reference is left");
            assert_eq!(p.release(k, false), 0);
        }
        p.release(K, false);
        // Only the file with an extent is kept (idle), and reclaimed first.
        assert!(looked_up.iter().all(|&k| !p.knows(k)));
        assert_eq!(p.oldest_idle(), Some(K));
        assert_eq!(p.files.len(), 1);
    }

    #[test]
    fn runs_coalesce() {
        assert_eq!(page_runs(&[1, 2, 3, 7, 9, 10]), [(1, 3), (7, 1), (9, 2)]);
        assert!(page_runs(&[]).is_empty());
    }

    #[test]
    fn extents_are_contiguous_and_aligned() {
        let mut p = Pool::new(64 * EXTENT_SIZE);
        p.acquire(K);
        let s = p.segments(K, EXTENT_SIZE - 4096, 8192);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].len, 4096);
        assert_eq!(s[1].len, 4096);
        assert_eq!(s[0].addr % EXTENT_SIZE, EXTENT_SIZE - 4096);
        assert_eq!(s[1].addr % EXTENT_SIZE, 0);
        // Same file range, same addresses.
        assert_eq!(p.segments(K, EXTENT_SIZE - 4096, 8192), s);
        assert_eq!(p.allocated_extents(), 2);
    }

    #[test]
    fn files_do_not_overlap_keep_extents_and_remove_frees() {
        let mut p = Pool::new(4 * EXTENT_SIZE);
        let other = FileKey { dev: 1, ino: 3 };
        p.acquire(K);
        p.acquire(other);
        let a = p.segments(K, 0, 1)[0].addr / EXTENT_SIZE;
        let b = p.segments(other, 0, 1)[0].addr / EXTENT_SIZE;
        assert_ne!(a, b);
        assert_eq!(p.release(K, false), 0);
        // Still on the device until the caller takes it: no other file can
        // be handed it.
        assert_eq!(p.allocated_extents(), 2);
        let third = FileKey { dev: 1, ino: 4 };
        assert_ne!(p.segments(third, 0, 1)[0].addr / EXTENT_SIZE, a);
        p.acquire(K);
        assert_eq!(p.segments(K, 0, 1)[0].addr / EXTENT_SIZE, a);
        assert_eq!(p.remove(K), vec![a]);
        assert_eq!(p.allocated_extents(), 2);
        assert_eq!(
            p.segments(FileKey { dev: 1, ino: 5 }, 0, 1)[0].addr / EXTENT_SIZE,
            a
        );
    }

    #[test]
    fn take_keeps_earlier_chunks_and_mapped_extents() {
        let mut p = Pool::new(8 * EXTENT_SIZE);
        p.acquire(K);
        p.segments(K, 0, 4 * EXTENT_SIZE);
        let mapped = p.extent_of(K, 3).unwrap();
        let taken = p.take(K, 1, &|e| e == mapped);
        assert_eq!(taken.len(), 2);
        assert!(p.extent_of(K, 0).is_some() && p.extent_of(K, 3).is_some());
        // Owned until freed: their dirty pages are written back meanwhile.
        assert!(taken
            .iter()
            .all(|e| p.owner_of(*e).is_some_and(|o| o.key == K)));
        p.free_extents(&taken);
        assert!(taken.iter().all(|e| p.owner_of(*e).is_none()));
        assert_eq!(p.allocated_extents(), 2);
        p.release(K, false);
        assert_eq!(p.oldest_idle(), Some(K));
        assert!(p.idle_deleted().is_empty());
        assert_eq!(p.take(K, 0, &|_| false).len(), 2);
        assert!(!p.knows(K), "no chunk, no reference: forgotten");
        assert_eq!(p.oldest_idle(), None, "and off the idle list");
    }

    #[test]
    fn the_idle_list_is_in_release_order_and_acquire_leaves_it() {
        let mut p = Pool::new(8 * EXTENT_SIZE);
        let (a, b) = (FileKey { dev: 1, ino: 10 }, FileKey { dev: 1, ino: 11 });
        for k in [a, b] {
            p.acquire(k);
            p.segments(k, 0, 1);
        }
        p.release(b, false);
        p.release(a, true);
        assert_eq!(p.oldest_idle(), Some(b));
        assert_eq!(p.idle_deleted(), vec![a]);
        p.requeue_idle(b);
        assert_eq!(p.oldest_idle(), Some(a));
        p.acquire(a);
        assert_eq!(p.oldest_idle(), Some(b));
        assert_eq!(p.free_count(), 6);
    }

    #[test]
    fn full_pool_aliases_instead_of_failing() {
        let mut p = Pool::new(2 * EXTENT_SIZE);
        p.acquire(K);
        let s = p.segments(K, 0, 5 * EXTENT_SIZE);
        assert_eq!(s.len(), 5);
        assert!(s.iter().all(|s| s.addr < 2 * EXTENT_SIZE));
        assert_eq!(p.aliased_chunks(), 3);
        assert_eq!(
            p.remove(K).len(),
            2,
            "only the file's own extents are freed"
        );
        assert_eq!(p.allocated_extents(), 0);
    }

    #[test]
    fn census_counts_distinct_pages_and_forgets_extents() {
        let mut c = TierCensus::default();
        c.touch(0, 999);
        c.touch(500, 1499); // overlaps: 500 new pages only
        let (d, x) = c.split(30);
        assert_eq!((d + x, x), (1500, 450));
        assert_eq!(c.split(0), (1500, 0));
        assert_eq!(c.split(100), (0, 1500));
        // Pages 0..512 are extent 0.
        c.forget_extent(0);
        let (d, x) = c.split(100);
        assert_eq!((d, x), (0, 1500 - 512));
        c.forget_extent(0);
        c.forget_extent(77);
        assert_eq!(c.split(100).1, 988);
    }
}
