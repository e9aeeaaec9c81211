//! Moving pool pages into the plane (the host file's bytes, pushed with
//! NOTIFY_STORE) and out of it (evictions of device-evicted pages and of
//! pages moved to the CXL tier).

use super::DaxPlane;
use crate::device::placement::{self, Tier};
use crate::device::{page_runs, EXTENT_SIZE, PAGE};
use crate::sync::lock;
use crate::timing::Coherence;
use std::os::unix::fs::FileExt;

impl DaxPlane {
    /// Pushes the host file's bytes of `count` pool pages from `first_page`
    /// (one extent) into the plane with NOTIFY_STORE, so a guest
    /// reaches them without a trap; waits until the kernel has them. Only
    /// pages the device holds (or DRAM-tier ones) are stored, and nothing
    /// while a VM maps the extent writable. Under the fill guard the file's
    /// bytes cannot change and no guest can store into the pages, so a
    /// store that races a trap of the same page writes what the page holds
    /// anyway. Returns the pages stored. Never call it from a plane thread.
    pub fn fill_from_file(&self, first_page: u64, count: u64) -> u64 {
        let Some(plane) = self.plane() else { return 0 };
        let page = residency::PAGE_SIZE;
        let extent = first_page * page / EXTENT_SIZE;
        if count == 0 || (first_page + count - 1) * page / EXTENT_SIZE != extent {
            return 0;
        }
        let Some(owner) = self.shared.read(|p, _| p.owner_of(extent)) else {
            return 0;
        };
        let _guard = self.change_guard(owner.key);
        if self.mapped_writable(extent) {
            return 0;
        }
        let pool_off = first_page * page;
        // Under the guard: the extent must still be that file's.
        if self.shared.read(|p, _| p.owner_of(extent)).map(|o| o.key) != Some(owner.key) {
            return 0;
        }
        let Some((file, file_off)) = self.state.file_at(&self.shared, pool_off) else {
            return 0;
        };
        let mut data = vec![0u8; (count * page) as usize];
        let mut got = 0usize;
        while got < data.len() {
            match file.read_at(&mut data[got..], file_off + got as u64) {
                Ok(0) => break, // zeros past the end of the file
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read file bytes to fill the plane");
                    return 0;
                }
            }
        }
        // Queue the stores under the device lock, page run by page run:
        // an eviction the device makes after this check queues its INVAL
        // behind our STORE, so the plane never keeps a page the device
        // dropped.
        let mut tickets = Vec::new();
        let mut stored = 0;
        self.shared.read(|_, dev| {
            let mut p = first_page;
            while p < first_page + count {
                let held = |p: u64| {
                    dev.is_resident(p * page) || self.shared.placement().tier(p) == Tier::Dram
                };
                if !held(p) {
                    p += 1;
                    continue;
                }
                let mut q = p + 1;
                while q < first_page + count && held(q) {
                    q += 1;
                }
                let at = ((p - first_page) * page) as usize;
                let bytes = data[at..at + ((q - p) * page) as usize].to_vec();
                match plane.fill(p * page, bytes) {
                    Ok(t) => {
                        tickets.push(t);
                        stored += q - p;
                    }
                    Err(e) => tracing::warn!(error = %e, page = p, "plane fill refused"),
                }
                p = q;
            }
        });
        for t in tickets {
            if let Err(e) = t.wait() {
                tracing::warn!(error = %e, "plane fill failed");
            }
        }
        stored
    }

    /// Drops `pages` (pool page numbers) of window-mapped extents from the
    /// plane; `wait`: until the kernel has done it (dirty pages written
    /// back; never on a plane thread). Returns the pages handed over.
    pub fn evict_pages(&self, pages: Vec<u64>, wait: bool) -> u64 {
        let Some(plane) = self.plane() else { return 0 };
        let mut pages = self.state.in_windows(pages, |&p| p);
        pages.sort_unstable();
        pages.dedup();
        let runs = page_runs(&pages)
            .into_iter()
            .map(|(first, n)| (first * PAGE, n * PAGE));
        residency::evict_ranges(|o, l| plane.evict(o, l), runs, wait, "pool pages");
        pages.len() as u64
    }

    /// Access sampling: arms the device `pages` that lie in window-mapped
    /// extents and drops them from the plane (their next access traps, as
    /// a device hit), waiting until they are gone. Returns the pages armed.
    pub fn arm_sampled(&self, pages: &[u64]) -> u64 {
        if self.plane().is_none() {
            return 0;
        }
        let armed = self
            .shared
            .arm_sampled(&self.state.in_windows(pages.to_vec(), |&p| p));
        self.evict_pages(armed, true)
    }

    /// Evicts the pages of window-mapped extents whose rank is in
    /// `[old, new)` (DRAM at `old`, CXL at `new`); returns the pages evicted.
    pub(super) fn evict_moved_to_cxl(&self, old: u8, new: u8) -> u64 {
        let Some(plane) = self.plane() else { return 0 };
        let mut extents: Vec<u64> = lock(&self.state.windows).extents.iter().copied().collect();
        extents.sort_unstable();
        let per_extent = EXTENT_SIZE / PAGE;
        let mut pages = Vec::new();
        for extent in extents {
            let first = extent * per_extent;
            pages.extend((first..first + per_extent).filter(|&p| {
                let r = placement::rank(p);
                r >= old && r < new
            }));
        }
        let runs = page_runs(&pages)
            .into_iter()
            .map(|(start, n)| (start * PAGE, n * PAGE));
        residency::evict_ranges(|o, l| plane.evict(o, l), runs, true, "pages moved to CXL");
        pages.len() as u64
    }
}
