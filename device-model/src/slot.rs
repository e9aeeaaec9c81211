//! Cache slots as the cache and its eviction policies both name them (a
//! leaf: the policies must not reach into the cache).

/// Index of a cache slot (one 4 KiB frame). Set `s` owns slots `s*ways .. (s+1)*ways`.
pub type SlotId = u32;

/// Issues a CPU prefetch of the cache line holding `value`.
#[inline(always)]
pub(crate) fn prefetch_read<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint that never faults and changes no memory
    // state; the pointer comes from a live reference; SSE is part of the
    // x86_64 baseline, so the target feature is always present.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (value as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
