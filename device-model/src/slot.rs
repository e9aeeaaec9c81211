//! Cache slots as the cache and its eviction policies both name them (a
//! leaf: the policies must not reach into the cache), and the one record per
//! slot they share.

/// Index of a cache slot (one 4 KiB frame). Set `s` owns slots `s*ways .. (s+1)*ways`.
pub type SlotId = u32;

/// "No slot" in list links and free lists.
pub(crate) const NIL: u32 = u32::MAX;

/// Everything known about one slot, the cache's part and the policy's part
/// in one 28-byte record: a miss or a hit then touches one or two cache
/// lines per slot instead of one per array. Packed to 4-byte alignment (not
/// 32 bytes) so that a slot costs no more memory than the separate arrays
/// did; about a third of the records straddle two lines.
#[derive(Debug, Clone, Copy)]
#[repr(C, packed(4))]
pub struct Frame {
    /// Cache: device page number held (meaningful while resident).
    pub(crate) page: u64,
    /// Cache: when the fill of the page completes.
    pub(crate) ready_at_ns: u64,
    /// Policy: neighbour toward the front of the slot's list ([`NIL`]:
    /// none); for a policy whose queues are rings (S3-FIFO), the slot's
    /// position in its ring.
    pub(crate) prev: u32,
    /// Policy: neighbour toward the back of the slot's list (unused by ring
    /// policies); while the slot is free, the cache's next free slot of the
    /// set ([`NIL`]: none).
    pub(crate) next: u32,
    /// Cache: residency, dirty, pinned and prefetched bits.
    pub(crate) flags: u8,
    /// Policy: whatever per-slot state the policy keeps (a frequency, a
    /// queue bit, a reference bit).
    pub(crate) policy_bits: u8,
}

impl Frame {
    /// A free slot whose free-list successor is `next`.
    pub(crate) const fn free(next: u32) -> Self {
        Frame {
            page: 0,
            ready_at_ns: 0,
            prev: NIL,
            next,
            flags: 0,
            policy_bits: 0,
        }
    }
}

/// Starts loading `slot`'s record into the CPU cache (both lines when it
/// straddles two). A hint: no effect on contents, nothing for a slot out
/// of range.
#[inline(always)]
pub(crate) fn prefetch_frame(frames: &[Frame], slot: SlotId) {
    if let Some(frame) = frames.get(slot as usize) {
        let first = std::ptr::from_ref(frame).cast::<u8>();
        prefetch_read(first);
        prefetch_read(first.wrapping_add(std::mem::size_of::<Frame>() - 1));
    }
}

/// Issues a CPU prefetch of the cache line holding `value`.
#[inline(always)]
pub(crate) fn prefetch_read<T>(value: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint that never faults, whatever the address,
    // and changes no memory state; SSE is part of the x86_64 baseline, so
    // the target feature is always present.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(value.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

// Per-slot memory: no more than the arrays it replaced (16-byte record,
// flags, free link and list links: 29 bytes, 30 with a policy byte).
const _: () = assert!(std::mem::size_of::<Frame>() == 28);
