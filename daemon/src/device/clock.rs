//! Device time: nanoseconds since the daemon started, on the monotonic
//! clock. Every arrival, completion and release is stamped with it.

use std::time::Instant;

/// The device's clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Clock {
            start: Instant::now(),
        }
    }

    /// Nanoseconds since the clock's zero.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
