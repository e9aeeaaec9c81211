//! A value per device page for the one-pass curves: a flat table (zeroed
//! memory costs nothing until touched) or, for a device too large for one,
//! a hash map. The default value stands for "never set".

use crate::slot::prefetch_read;
use rustc_hash::FxHashMap;

/// Pages up to this many are kept in a flat table.
const FLAT_PAGES: u64 = 1 << 30;

/// A value per page.
pub(crate) enum PageTable<T> {
    Flat(Vec<T>),
    Map(FxHashMap<u64, T>),
}

impl<T: Copy + Default> PageTable<T> {
    /// Every value the default, for pages `0..device_pages`.
    pub(crate) fn new(device_pages: u64) -> Self {
        match usize::try_from(device_pages) {
            Ok(n) if device_pages <= FLAT_PAGES => PageTable::Flat(vec![T::default(); n]),
            _ => PageTable::Map(FxHashMap::default()),
        }
    }

    #[inline]
    pub(crate) fn get(&self, page: u64) -> T {
        match self {
            PageTable::Flat(v) => usize::try_from(page)
                .ok()
                .and_then(|i| v.get(i).copied())
                .unwrap_or_default(),
            PageTable::Map(m) => m.get(&page).copied().unwrap_or_default(),
        }
    }

    /// Starts loading `page`'s value into the CPU's cache.
    #[inline]
    pub(crate) fn prefetch(&self, page: u64) {
        if let PageTable::Flat(v) = self {
            if let Some(e) = usize::try_from(page).ok().and_then(|i| v.get(i)) {
                prefetch_read(e);
            }
        }
    }

    #[inline]
    pub(crate) fn set(&mut self, page: u64, value: T) {
        match self {
            PageTable::Flat(v) => {
                if let Some(e) = usize::try_from(page).ok().and_then(|i| v.get_mut(i)) {
                    *e = value;
                }
            }
            PageTable::Map(m) => {
                m.insert(page, value);
            }
        }
    }
}
