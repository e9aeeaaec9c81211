//! Waiting until a modeled completion time: sleep while far, spin when near.
//!
//! `thread::sleep` overshoots by tens of µs on a busy host, so the last
//! [`SPIN_NS`] before a deadline are spent spinning.

use std::time::Duration;

/// Spin (instead of sleeping) for deadlines this close.
pub const SPIN_NS: u64 = 50_000;
/// A request thread keeps a reply due within this much and spins for it
/// itself, instead of handing it to the pacer thread (a hand-off costs a
/// futex wake-up, tens of µs on a busy host).
pub const INLINE_SPIN_NS: u64 = 80_000;

/// Blocks until `now() >= deadline_ns`: sleeps until [`SPIN_NS`] before it,
/// then spins. Returns the clock value seen last.
pub fn wait_until(now: impl Fn() -> u64, deadline_ns: u64) -> u64 {
    loop {
        let t = now();
        if t >= deadline_ns {
            return t;
        }
        let left = deadline_ns - t;
        if left > SPIN_NS {
            std::thread::sleep(Duration::from_nanos(left - SPIN_NS));
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn waits_at_least_until_the_deadline() {
        let start = Instant::now();
        let now = || start.elapsed().as_nanos() as u64;
        for d in [0u64, 10_000, 120_000] {
            let deadline = now() + d;
            let t = wait_until(now, deadline);
            assert!(t >= deadline);
            assert!(now() >= deadline);
        }
    }
}
