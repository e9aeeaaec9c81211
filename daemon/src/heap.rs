//! The allocator's free memory goes back to the host once a minute.
//!
//! glibc keeps the memory a burst freed in its arenas (one per thread
//! group), so a daemon's resident memory follows the highest it ever held
//! rather than what it holds: a burst leaves a step that stays.
//! `malloc_trim(0)` hands the free pages of every arena back
//! (`madvise(MADV_DONTNEED)` and `brk`, both on the seccomp list); memory
//! still in use stays, so a leak still shows. Measured in
//! `tests/README.md`, "The soak".

use std::io;
use std::thread;
use std::time::Duration;

/// How often the trimmer runs.
pub const HEAP_TRIM_EVERY: Duration = Duration::from_secs(60);

/// Returns the allocator's free pages to the host now; true if it could
/// release any.
pub fn trim_heap() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim takes no pointer; it walks glibc's own
        // arenas, each under its own lock, and may be called from any
        // thread at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

/// Starts the thread that calls [`trim_heap`] every `every` for the rest of
/// the process's life.
pub fn spawn_heap_trimmer(every: Duration) -> io::Result<()> {
    thread::Builder::new()
        .name("cxlfsd-heap-trim".into())
        .spawn(move || loop {
            thread::sleep(every);
            trim_heap();
        })
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_goes_back_to_the_host() {
        // 8 MiB in 4 KiB blocks stays in the arena once freed (each block
        // is under the mmap threshold); the trim gives it back.
        let blocks: Vec<Vec<u8>> = (0..2048).map(|i| vec![i as u8; 4096]).collect();
        assert_eq!(blocks.iter().map(|b| b.len()).sum::<usize>(), 8 << 20);
        drop(blocks);
        assert!(trim_heap(), "nothing released after 8 MiB was freed");
        assert!(spawn_heap_trimmer(Duration::from_secs(3600)).is_ok());
    }
}
