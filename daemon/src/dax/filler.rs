//! The `pool-prefetch` thread: the device's prefetch fills, pushed into
//! the plane once each is ready.

use super::DaxPlane;
use crate::device::{EXTENT_SIZE, PAGE};
use std::sync::atomic::Ordering;

/// The `pool-prefetch` thread: pushes the pages the device's prefetcher
/// filled into the plane once each is ready (its modeled NAND read done).
/// Ends when the plane is shut down or the daemon drops it.
pub(super) fn run(
    dax: &std::sync::Weak<DaxPlane>,
    rx: &std::sync::mpsc::Receiver<Vec<(u64, u64)>>,
) {
    use std::sync::mpsc::RecvTimeoutError;
    loop {
        let mut batch = match rx.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) => match dax.upgrade() {
                Some(d) if d.plane().is_some() => continue,
                _ => return,
            },
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let Some(d) = dax.upgrade() else { return };
        if d.plane().is_none() {
            return;
        }
        batch.sort_unstable_by_key(|&(page, ready)| (ready, page));
        let mut i = 0;
        while i < batch.len() {
            let (first, ready) = batch[i];
            residency::pace::wait_until(|| d.shared.now_ns(), ready);
            // A run of consecutive pages of one extent, all ready by now.
            let now = d.shared.now_ns();
            let extent = first * PAGE / EXTENT_SIZE;
            let mut j = i + 1;
            while j < batch.len()
                && batch[j].0 == batch[j - 1].0 + 1
                && batch[j].1 <= now
                && batch[j].0 * PAGE / EXTENT_SIZE == extent
            {
                j += 1;
            }
            let stored = d.fill_from_file(first, (j - i) as u64);
            d.prefetch_pushed.fetch_add(stored, Ordering::Relaxed);
            i = j;
        }
    }
}
