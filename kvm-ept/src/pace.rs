//! Waiting until a modeled completion time: sleep while far, spin when near.
//!
//! `thread::sleep` overshoots by tens of µs on a busy host, so the last
//! [`SPIN_NS`] before a deadline are spent spinning.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
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

/// Something held until its modeled completion time.
pub trait Deadline {
    /// When it may be released (the pacer's clock, ns).
    fn deadline_ns(&self) -> u64;
}

/// A heap entry: by deadline, then by order of arrival at the pacer.
struct Entry<T> {
    deadline_ns: u64,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, o: &Self) -> bool {
        (self.deadline_ns, self.seq) == (o.deadline_ns, o.seq)
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.deadline_ns, self.seq).cmp(&(o.deadline_ns, o.seq))
    }
}

/// A pacer thread's loop: takes items from `rx` and hands each batch of
/// due ones (deadline order) to `release`, at their deadline by `now()`.
/// It sleeps while the next deadline is far and spins for the last
/// [`SPIN_NS`], taking in new arrivals meanwhile (they may be due earlier).
/// Returns once `rx` is closed and every item has been released.
pub fn run_pacer<T: Deadline>(
    rx: &Receiver<T>,
    now: impl Fn() -> u64,
    mut release: impl FnMut(Vec<T>),
) {
    let mut heap: BinaryHeap<Reverse<Entry<T>>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Reverse<Entry<T>>>, item: T| {
        seq += 1;
        heap.push(Reverse(Entry {
            deadline_ns: item.deadline_ns(),
            seq,
            item,
        }));
    };
    let mut open = true;
    loop {
        let Some(next) = heap.peek().map(|e| e.0.deadline_ns) else {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(item) => push(&mut heap, item),
                Err(_) => open = false,
            }
            continue;
        };
        let t = now();
        if t + SPIN_NS < next {
            let wait = Duration::from_nanos(next - t - SPIN_NS);
            if open {
                match rx.recv_timeout(wait) {
                    Ok(item) => push(&mut heap, item),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            } else {
                std::thread::sleep(wait);
            }
            continue;
        }
        if t < next {
            if open {
                match rx.try_recv() {
                    Ok(item) => push(&mut heap, item),
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                    Err(TryRecvError::Disconnected) => open = false,
                }
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        let mut due = Vec::new();
        while heap.peek().is_some_and(|e| e.0.deadline_ns <= t) {
            if let Some(Reverse(e)) = heap.pop() {
                due.push(e.item);
            }
        }
        release(due);
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

    struct Item(u64, u32);
    impl Deadline for Item {
        fn deadline_ns(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn pacer_releases_in_deadline_order_then_arrival_order_and_drains_on_close() {
        let start = Instant::now();
        let now = || start.elapsed().as_nanos() as u64;
        let (tx, rx) = std::sync::mpsc::channel();
        let base = now() + 2_000_000;
        for (d, id) in [(300_000, 1), (100_000, 2), (100_000, 3), (0, 4)] {
            tx.send(Item(base + d, id))
                .unwrap_or_else(|_| unreachable!());
        }
        drop(tx);
        let mut seen = Vec::new();
        run_pacer(&rx, now, |due| {
            let t = now();
            for it in due {
                assert!(t >= it.0, "released before its deadline");
                seen.push(it.1);
            }
        });
        assert_eq!(seen, [4, 2, 3, 1]);
    }
}
