//! SIGINT / SIGTERM: blocked in every thread, received by one.

use std::io;

/// Why the signal mask could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BlockSignalsError {
    /// `pthread_sigmask` failed.
    #[error("pthread_sigmask failed")]
    Mask(#[source] io::Error),
}

fn term_set() -> libc::sigset_t {
    // SAFETY: sigset_t is a plain C bitset; all-zero is a valid (empty) value
    // and sigemptyset/sigaddset only write into the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Blocks SIGINT and SIGTERM in the calling thread (and every thread it
/// spawns afterwards), so that [`wait_for_termination`] can take them.
pub fn block_termination_signals() -> Result<(), BlockSignalsError> {
    let set = term_set();
    // SAFETY: `set` is a valid, initialised sigset; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(BlockSignalsError::Mask(io::Error::from_raw_os_error(rc)));
    }
    Ok(())
}

/// Waits for SIGINT or SIGTERM (they must be blocked); returns its number.
pub fn wait_for_termination() -> i32 {
    let set = term_set();
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is a valid sigset and `sig` a valid out-pointer.
        let rc = unsafe { libc::sigwait(&set, &mut sig) };
        if rc == 0 {
            return sig;
        }
    }
}
