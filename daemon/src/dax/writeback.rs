//! Writing dirty pool pages back to the host files: the `pool-writeback`
//! timer thread and [`DaxPlane::write_back_all`].

use super::DaxPlane;
use crate::sync::lock;
use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Why dirty pool pages could not all be written back.
#[derive(Debug, thiserror::Error)]
pub enum WriteBackError {
    /// The plane refused or failed the write-back.
    #[error("cannot write back the pool's dirty pages")]
    Pool(#[source] residency::SendNotifyError),
    /// A host file could not be fsynced.
    #[error("cannot fsync a host file behind the pool")]
    Fsync(#[source] std::io::Error),
}

/// The `pool-writeback` thread: every [`DaxPlane::set_writeback_interval`]
/// writes back the pool's dirty pages, so a daemon crash (whose exit guard
/// aborts the pool's connection, dropping dirty pages) loses at most that
/// much of the guests' window stores. Ends with the plane.
pub(super) fn run_writeback(dax: &std::sync::Weak<DaxPlane>) {
    let tick = std::time::Duration::from_millis(100);
    let mut since = std::time::Duration::ZERO;
    loop {
        std::thread::sleep(tick);
        since += tick;
        let Some(d) = dax.upgrade() else { return };
        if d.plane().is_none() {
            return;
        }
        let every = d.writeback_ms.load(Ordering::Relaxed);
        if every == 0 || since.as_millis() < u128::from(every) {
            continue;
        }
        since = std::time::Duration::ZERO;
        if let Some(plane) = d.plane() {
            let size = plane.map_target().size;
            if let Err(e) = plane.sync(0, size) {
                tracing::warn!(error = %e, "periodic write-back of the pool failed");
            }
        }
    }
}

impl DaxPlane {
    /// Sets the period of the background write-back of dirty pool pages
    /// (`Duration::ZERO`: off; see [`DEFAULT_WRITEBACK_INTERVAL`]).
    pub fn set_writeback_interval(&self, t: std::time::Duration) {
        let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
        self.writeback_ms.store(ms, Ordering::Relaxed);
    }

    /// Writes every dirty pool page back to its host file (stores guests
    /// made through their windows), then fsyncs the host files behind
    /// window-mapped extents. Never call it from a plane thread.
    pub fn write_back_all(&self) -> Result<(), WriteBackError> {
        let Some(plane) = self.plane() else {
            return Ok(());
        };
        let size = plane.map_target().size;
        plane.sync(0, size).map_err(WriteBackError::Pool)?;
        drop(plane);
        let files: Vec<Arc<File>> = lock(&self.state.windows).files.values().cloned().collect();
        // Every file is tried; the first failure is returned.
        let mut result = Ok(());
        for f in files {
            if let Err(e) = f.sync_data() {
                if result.is_ok() {
                    result = Err(WriteBackError::Fsync(e));
                }
            }
        }
        result
    }
}
