//! The window-mapped extents: which pool extents some DAX window maps (their
//! pages may be resident in the plane) and the host files behind them.

use super::{DaxPlane, PlaneState};
use crate::device::{ExtentOwner, Publish, SharedDevice, EXTENT_SIZE, PAGE};
use crate::ids::FileKey;
use crate::sync::lock;
use std::fs::File;
use std::sync::Arc;

impl PlaneState {
    /// The host file and file offset behind pool offset `pool_offset`.
    pub(super) fn file_at(
        &self,
        shared: &SharedDevice,
        pool_offset: u64,
    ) -> Option<(Arc<File>, u64)> {
        let owner = shared.read(|p, _| p.owner_of(pool_offset / EXTENT_SIZE));
        self.file_of(owner, pool_offset)
    }

    /// The host file and file offset behind pool offset `pool_offset`,
    /// whose extent `owner` holds (as the pool said).
    pub(super) fn file_of(
        &self,
        owner: Option<ExtentOwner>,
        pool_offset: u64,
    ) -> Option<(Arc<File>, u64)> {
        let owner = owner?;
        let file = lock(&self.windows).files.get(&owner.key).cloned()?;
        Some((file, owner.chunk * EXTENT_SIZE + pool_offset % EXTENT_SIZE))
    }

    /// The items of `items` whose pool page (`page_of`) lies in a
    /// window-mapped extent, under one look at the table.
    pub(super) fn in_windows<T>(&self, items: Vec<T>, page_of: impl Fn(&T) -> u64) -> Vec<T> {
        let w = lock(&self.windows);
        items
            .into_iter()
            .filter(|t| w.extents.contains(&(page_of(t) * PAGE / EXTENT_SIZE)))
            .collect()
    }
}

impl DaxPlane {
    /// The pool extent of file chunk `chunk` of `key` for a window slot,
    /// allocated if needed and marked as window-mapped; the host file is
    /// kept open for traps and write-backs (`open` runs only the first
    /// time). A full pool first gives back what idle files and unmapped
    /// extents of other files hold
    /// ([`SharedDevice::make_room_for_window`]). `Ok(None)`: still full,
    /// and the chunk has no extent of its own. Never call it from a plane
    /// thread, nor holding a slot table.
    pub fn window_extent(
        &self,
        key: FileKey,
        chunk: u64,
        open: impl FnOnce() -> Result<File, rustix::io::Errno>,
    ) -> Result<Option<u64>, rustix::io::Errno> {
        let known = lock(&self.state.windows).files.get(&key).cloned();
        let file = match known {
            Some(f) => f,
            None => Arc::new(open()?),
        };
        if let Some(e) = self.window_extent_of(key, chunk, &file) {
            return Ok(Some(e));
        }
        self.shared.make_room_for_window();
        Ok(self.window_extent_of(key, chunk, &file))
    }

    /// [`DaxPlane::window_extent`] with the host file already open.
    pub fn window_extent_of(&self, key: FileKey, chunk: u64, file: &Arc<File>) -> Option<u64> {
        let extent = self
            .shared
            .transact(Publish::Hand, |p, _| p.own_extent(key, chunk))
            .0?;
        let mut w = lock(&self.state.windows);
        w.files.entry(key).or_insert_with(|| file.clone());
        w.extents.insert(extent);
        Some(extent)
    }

    /// The host file of `key`, if it was ever mapped into a window.
    pub fn window_file(&self, key: FileKey) -> Option<Arc<File>> {
        lock(&self.state.windows).files.get(&key).cloned()
    }

    /// The pool ranges (page aligned, within window-mapped extents) that
    /// hold the file's bytes `[offset, offset + len)`, in file order.
    pub(super) fn window_ranges(&self, key: FileKey, offset: u64, len: u64) -> Vec<(u64, u64)> {
        if len == 0 {
            return Vec::new();
        }
        let start = offset / PAGE * PAGE;
        let end = offset
            .saturating_add(len)
            .div_ceil(PAGE)
            .saturating_mul(PAGE);
        let own = self.shared.read(|p, _| p.own_extents(key));
        let windows = lock(&self.state.windows);
        own.into_iter()
            .filter(|&(chunk, e)| {
                let (lo, hi) = (chunk * EXTENT_SIZE, (chunk + 1) * EXTENT_SIZE);
                lo < end && hi > start && windows.extents.contains(&e)
            })
            .map(|(chunk, e)| {
                let lo = (chunk * EXTENT_SIZE).max(start);
                let hi = ((chunk + 1) * EXTENT_SIZE).min(end);
                (e * EXTENT_SIZE + lo % EXTENT_SIZE, hi - lo)
            })
            .collect()
    }
}
