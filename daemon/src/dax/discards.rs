//! Held-discard bookkeeping: the pool ranges being discarded
//! ([`crate::timing::Coherence::discard_file_range`]) and the write-backs of
//! them the kernel makes meanwhile, held instead of stored until the
//! discard ends.

use crate::timing::DiscardId;

/// The discards in progress.
#[derive(Debug, Default)]
pub(super) struct Discards {
    next_id: u64,
    live: Vec<HeldRanges>,
}

/// One discard: its pool ranges (page aligned, disjoint) and the
/// write-backs of them the kernel made meanwhile, held until it ends.
#[derive(Debug)]
struct HeldRanges {
    id: u64,
    ranges: Vec<(u64, u64)>,
    held: Vec<HeldWriteback>,
}

/// A write-back held by a discard: stored after all if the discard is
/// ended with `restore`.
#[derive(Debug)]
pub(super) struct HeldWriteback {
    pub(super) pool_offset: u64,
    pub(super) data: Vec<u8>,
    pub(super) pid: u32,
}

impl Discards {
    /// Registers a discard of `ranges` (`[start, end)` pool ranges).
    pub(super) fn begin(&mut self, ranges: Vec<(u64, u64)>) -> DiscardId {
        self.next_id += 1;
        self.live.push(HeldRanges {
            id: self.next_id,
            ranges,
            held: Vec::new(),
        });
        DiscardId(self.next_id)
    }

    /// Ends discard `id`; returns its ranges and what it held.
    pub(super) fn end(&mut self, id: DiscardId) -> (Vec<(u64, u64)>, Vec<HeldWriteback>) {
        match self.live.iter().position(|d| d.id == id.0) {
            Some(i) => {
                let d = self.live.swap_remove(i);
                (d.ranges, d.held)
            }
            None => (Vec::new(), Vec::new()),
        }
    }

    /// Splits a write-back of `data` at `pool_offset`: the parts inside a
    /// discarding range are held there; returns the others (offset, bytes)
    /// to be stored now.
    pub(super) fn split<'d>(
        &mut self,
        pool_offset: u64,
        data: &'d [u8],
        pid: u32,
    ) -> Vec<(u64, &'d [u8])> {
        let end = pool_offset.saturating_add(data.len() as u64);
        let mut out = Vec::new();
        let mut pos = pool_offset;
        while pos < end {
            let at = (pos - pool_offset) as usize;
            // The discarding range holding `pos`, if any.
            let inside = self.live.iter_mut().find_map(|d| {
                let r = d
                    .ranges
                    .iter()
                    .find(|&&(s, e)| s <= pos && pos < e)
                    .copied();
                r.map(|(_, e)| (d, e))
            });
            if let Some((d, e)) = inside {
                let to = e.min(end);
                d.held.push(HeldWriteback {
                    pool_offset: pos,
                    data: data[at..(to - pool_offset) as usize].to_vec(),
                    pid,
                });
                pos = to;
                continue;
            }
            // Stored up to the next discarding range (or the end).
            let to = self
                .live
                .iter()
                .flat_map(|d| d.ranges.iter())
                .filter(|&&(s, _)| s > pos)
                .map(|&(s, _)| s)
                .min()
                .map_or(end, |s| s.min(end));
            out.push((pos, &data[at..(to - pool_offset) as usize]));
            pos = to;
        }
        out
    }

    /// Whether no discard is in progress.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}
