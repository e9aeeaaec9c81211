//! The `region-prefetch` thread: region pages the device's prefetcher
//! filled are pushed into their plane, so a guest's first touch of one is a
//! hit with no trap (as the DAX plane's prefetch fills are).
//!
//! Not with `NOTIFY_STORE`: that writes over whatever the page cache holds,
//! and a region page may hold guest stores the device has not seen yet
//! (dirty, not written back). Instead the thread *reads* the pages through
//! the region file: the kernel asks the plane only for pages it does not
//! hold up to date, so nothing a guest wrote is ever replaced. Those READs
//! come from this thread ([`FillReads`]): the backend answers them from the
//! store without charging the device (the prefetch was charged) and only
//! while the device still holds the pages.

use super::backend::FillReads;
use super::{MemoryRegions, Region};
use crate::device::PAGE;
use crate::sync::lock;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Most pages one read asks for (one READ per folio anyway).
const MAX_RUN_PAGES: u64 = 32;

/// Device pages with the time each is ready (ns).
type Batch = Vec<(u64, u64)>;

/// The way to the `region-prefetch` thread.
#[derive(Debug, Default)]
pub(super) struct Filler {
    tx: Mutex<Option<Sender<Batch>>>,
}

impl Filler {
    /// Starts the thread for `regions`; it reads as `fills`.
    pub(super) fn start(
        &self,
        regions: &Arc<MemoryRegions>,
        fills: Arc<FillReads>,
    ) -> std::io::Result<()> {
        let (tx, rx) = mpsc::channel();
        let weak = Arc::downgrade(regions);
        std::thread::Builder::new()
            .name("region-prefetch".into())
            .spawn(move || {
                fills.claim();
                run(&weak, &rx);
            })?;
        *lock(&self.tx) = Some(tx);
        Ok(())
    }

    /// Queues device pages `(page, ready_ns)` (never waits).
    pub(super) fn queue(&self, pages: Batch) {
        if let Some(tx) = lock(&self.tx).as_ref() {
            // The thread gone (shutting down): nothing to push.
            let _ = tx.send(pages);
        }
    }
}

/// The thread: each batch, in order of readiness, run by run of
/// consecutive pages of one region, once its modeled NAND reads are done.
fn run(regions: &Weak<MemoryRegions>, rx: &Receiver<Batch>) {
    let mut buf = vec![0u8; (MAX_RUN_PAGES * PAGE) as usize];
    loop {
        let mut batch = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) if regions.strong_count() > 0 => continue,
            Err(_) => return,
        };
        let Some(m) = regions.upgrade() else { return };
        batch.sort_unstable_by_key(|&(page, ready)| (ready, page));
        let mut i = 0;
        while i < batch.len() {
            let (first, ready) = batch[i];
            residency::pace::wait_until(|| m.shared.now_ns(), ready);
            let now = m.shared.now_ns();
            let Some(region) = m.region_of_page(first) else {
                i += 1;
                continue;
            };
            let mut j = i + 1;
            while j < batch.len()
                && batch[j].0 == batch[j - 1].0 + 1
                && batch[j].1 <= now
                && (j - i) < MAX_RUN_PAGES as usize
                && region.device_pages().contains(&batch[j].0)
            {
                j += 1;
            }
            region.fill(first, (j - i) as u64, &mut buf);
            i = j;
        }
    }
}

impl MemoryRegions {
    /// The region holding device page `page`.
    fn region_of_page(&self, page: u64) -> Option<&Arc<Region>> {
        self.regions
            .iter()
            .find(|r| r.device_pages().contains(&page))
    }
}

impl Region {
    /// Reads `count` pages from device page `first` through the region
    /// file (see the module); a failed read (a page the device dropped
    /// meanwhile) leaves those pages to trap.
    fn fill(&self, first: u64, count: u64, buf: &mut [u8]) {
        if self.releasing.load(Ordering::Acquire) {
            return;
        }
        let offset = (first - self.device_pages().start) * PAGE;
        let len = ((count * PAGE) as usize).min(buf.len());
        if let Err(e) = self.file().read_at(&mut buf[..len], offset) {
            tracing::debug!(vm = %self.vm, offset, error = %e, "prefetch fill refused");
        }
    }
}
