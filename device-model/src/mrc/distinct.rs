//! Distinct pages of a stream, counted exactly: a bitmap over the device's
//! pages (zeroed memory costs nothing until touched), or a hash set for a
//! device too large for one.

use rustc_hash::FxHashSet;

/// Devices up to this many pages get a bitmap (512 MiB of address space at most).
const BITMAP_PAGES: u64 = 1 << 32;

/// The set of pages seen.
pub enum DistinctPages {
    /// One bit per page.
    Bitmap {
        /// The bits.
        words: Vec<u64>,
        /// Pages set.
        count: u64,
    },
    /// The pages.
    Set(FxHashSet<u64>),
}

impl DistinctPages {
    /// Empty, for pages `0..device_pages`.
    pub fn new(device_pages: u64) -> Self {
        match usize::try_from(device_pages.div_ceil(64)) {
            Ok(words) if device_pages <= BITMAP_PAGES => DistinctPages::Bitmap {
                words: vec![0; words],
                count: 0,
            },
            _ => DistinctPages::Set(FxHashSet::default()),
        }
    }

    /// Notes `page`.
    #[inline]
    pub fn insert(&mut self, page: u64) {
        match self {
            DistinctPages::Bitmap { words, count } => {
                let Some(w) = usize::try_from(page / 64)
                    .ok()
                    .and_then(|i| words.get_mut(i))
                else {
                    return;
                };
                let bit = 1u64 << (page % 64);
                if *w & bit == 0 {
                    *w |= bit;
                    *count += 1;
                }
            }
            DistinctPages::Set(set) => {
                set.insert(page);
            }
        }
    }

    /// Pages seen.
    pub fn count(&self) -> u64 {
        match self {
            DistinctPages::Bitmap { count, .. } => *count,
            DistinctPages::Set(set) => set.len() as u64,
        }
    }
}
