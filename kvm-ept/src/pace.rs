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

/// Whether a reply due at `deadline_ns` stays with the thread that made
/// it, which spins for it ([`wait_until`]), rather than going to the pacer
/// thread: it is due within [`INLINE_SPIN_NS`] of `now_ns`. The one rule
/// for the virtio transport's queue workers and the plane's request
/// threads.
pub fn keep_inline(now_ns: u64, deadline_ns: u64) -> bool {
    deadline_ns <= now_ns.saturating_add(INLINE_SPIN_NS)
}

/// Asks for no timer slack on this thread: the default (50 µs) would make
/// every sleep towards a deadline late by up to that much. Every thread
/// that paces replies calls it once at its start.
pub fn precise_timer_slack() {
    if let Err(e) = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1)) {
        tracing::debug!(error = %e, "cannot set this thread's timer slack");
    }
}

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

/// How a pacer accounts for the cost of the path a reply still has to
/// travel (and the one the request already travelled) before the waiter
/// sees it: the *floor*. A reply is released at
/// `max(arrival, deadline - floor)` ([`release_at`]), so that the waiter
/// sees the modeled latency whenever the model asks for more than the
/// floor, and the floor when it asks for less. DESIGN.md, "Latency
/// compensation (issue 15)".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compensation {
    /// Hold every reply until its modeled completion (the trap path's own
    /// cost comes on top).
    #[default]
    Off,
    /// Measure the floor (a residency plane: calibration probes at start
    /// and periodically; the FUSE path: one host thread wake-up) and
    /// subtract the current estimate.
    Auto,
    /// Subtract this many ns.
    Fixed(u64),
}

impl std::fmt::Display for Compensation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compensation::Off => f.write_str("off"),
            Compensation::Auto => f.write_str("auto"),
            Compensation::Fixed(ns) => write!(f, "{ns}ns"),
        }
    }
}

/// Why a [`Compensation`] could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "latency compensation `{0}`: expected auto, off, or a duration (e.g. 12000, 12000ns, 12us)"
)]
pub struct ParseCompensationError(pub String);

impl std::str::FromStr for Compensation {
    type Err = ParseCompensationError;

    /// `auto`, `off`, or a duration: plain ns, or with `ns` / `us` / `µs`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        match t {
            "auto" => return Ok(Compensation::Auto),
            "off" => return Ok(Compensation::Off),
            _ => {}
        }
        let err = || ParseCompensationError(s.to_string());
        let (num, scale) = if let Some(n) = t.strip_suffix("ns") {
            (n, 1)
        } else if let Some(n) = t.strip_suffix("us").or_else(|| t.strip_suffix("µs")) {
            (n, 1_000)
        } else {
            (t, 1)
        };
        let n: u64 = num.trim().parse().map_err(|_| err())?;
        n.checked_mul(scale)
            .map(Compensation::Fixed)
            .ok_or_else(err)
    }
}

/// When to release a reply that arrived at `arrival_ns` and whose modeled
/// completion is `deadline_ns`, given a floor of `floor_ns`:
/// `max(arrival, deadline - floor)`. A floor of 0 holds to the deadline
/// itself (today's pacing, unchanged).
pub fn release_at(arrival_ns: u64, deadline_ns: u64, floor_ns: u64) -> u64 {
    if floor_ns == 0 {
        return deadline_ns;
    }
    deadline_ns.saturating_sub(floor_ns).max(arrival_ns)
}

/// Most probes a [`Floor`]'s estimate is taken from.
pub const FLOOR_WINDOW: usize = 64;

/// The quantile of the recent samples that a [`Floor`] takes: the lower
/// quartile, not the median. The samples are often bimodal (two request
/// threads take turns, one of them on a core that has gone idle), and a
/// median between the modes can land on either: a floor above the path a
/// miss really takes releases it early, a miss faster than the model. The
/// lower quartile errs the other way, by little (DESIGN.md).
pub const FLOOR_QUANTILE_DIV: usize = 4;

/// A pacer's live floor: its [`Compensation`] and, under
/// [`Compensation::Auto`], the lower quartile of the last [`FLOOR_WINDOW`]
/// measured samples. Read on every reply (two relaxed loads).
///
/// Under `Auto` the estimate is also bounded by what the misses themselves
/// show ([`Floor::observe_gap`]): the time from a miss's reply to the next
/// miss of the same faulting thread holds the whole trap path (reply →
/// resumed, fault → request) plus whatever the thread ran between, so the
/// lower quartile of those gaps is an upper bound on the floor. Probes
/// from a host thread can take a longer path than a stream of guest
/// misses (a request thread woken from an idle core against one that has
/// just answered): the bound keeps such a floor from releasing the
/// stream's misses early.
#[derive(Debug)]
pub struct Floor {
    mode: Compensation,
    /// The probes' estimate (ns; under `Fixed`, the fixed floor).
    probe_ns: std::sync::atomic::AtomicU64,
    /// The gaps' bound (ns; `u64::MAX`: none yet).
    gap_bound_ns: std::sync::atomic::AtomicU64,
    /// Samples taken so far.
    samples: std::sync::atomic::AtomicU64,
    window: std::sync::Mutex<std::collections::VecDeque<u64>>,
    gaps: std::sync::Mutex<GapWindow>,
}

/// Most recent reply → next-miss gaps the bound is taken from.
pub const GAP_WINDOW: usize = 256;
/// Gaps needed before they bound the floor.
pub const GAP_MIN_SAMPLES: usize = 32;
/// The bound is recomputed every this many gaps.
const GAP_RECOMPUTE_EVERY: u64 = 16;

/// The recent gaps and how many were seen.
#[derive(Debug, Default)]
struct GapWindow {
    gaps: std::collections::VecDeque<u64>,
    seen: u64,
}

impl Floor {
    /// A floor for `mode`: 0 until measured under `Auto`.
    pub fn new(mode: Compensation) -> Self {
        let start = match mode {
            Compensation::Fixed(ns) => ns,
            Compensation::Off | Compensation::Auto => 0,
        };
        Floor {
            mode,
            probe_ns: std::sync::atomic::AtomicU64::new(start),
            gap_bound_ns: std::sync::atomic::AtomicU64::new(u64::MAX),
            samples: std::sync::atomic::AtomicU64::new(0),
            window: std::sync::Mutex::new(std::collections::VecDeque::with_capacity(FLOOR_WINDOW)),
            gaps: std::sync::Mutex::new(GapWindow::default()),
        }
    }

    /// The mode it was made with.
    pub fn mode(&self) -> Compensation {
        self.mode
    }

    /// The floor subtracted now (0: none): the probes' estimate, bounded
    /// by the gaps'.
    pub fn current_ns(&self) -> u64 {
        let probe = self.probe_ns.load(std::sync::atomic::Ordering::Relaxed);
        let bound = self.gap_bound_ns.load(std::sync::atomic::Ordering::Relaxed);
        probe.min(bound)
    }

    /// Samples measured so far.
    pub fn samples(&self) -> u64 {
        self.samples.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes measured samples (ns); under `Auto` the estimate becomes the
    /// lower quartile of the last [`FLOOR_WINDOW`]. Ignored in the other
    /// modes.
    pub fn record(&self, samples: &[u64]) {
        if self.mode != Compensation::Auto || samples.is_empty() {
            return;
        }
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        for &s in samples {
            if w.len() == FLOOR_WINDOW {
                w.pop_front();
            }
            w.push_back(s);
        }
        let q = lower_quartile(w.iter().copied());
        self.probe_ns.store(q, std::sync::atomic::Ordering::Relaxed);
        self.samples
            .fetch_add(samples.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Takes one gap (ns) from a miss's reply to the next miss of the same
    /// thread ([`MissGaps`]); under `Auto`, once [`GAP_MIN_SAMPLES`] were
    /// seen, the floor is at most the lower quartile of the last
    /// [`GAP_WINDOW`]. Ignored in the other modes.
    pub fn observe_gap(&self, gap_ns: u64) {
        if self.mode != Compensation::Auto {
            return;
        }
        let mut g = self.gaps.lock().unwrap_or_else(|e| e.into_inner());
        if g.gaps.len() == GAP_WINDOW {
            g.gaps.pop_front();
        }
        g.gaps.push_back(gap_ns);
        g.seen += 1;
        if g.gaps.len() < GAP_MIN_SAMPLES || g.seen % GAP_RECOMPUTE_EVERY != 0 {
            return;
        }
        let q = lower_quartile(g.gaps.iter().copied());
        drop(g);
        self.gap_bound_ns
            .store(q, std::sync::atomic::Ordering::Relaxed);
    }

    /// The gaps' bound now (`None`: too few gaps yet, or not `Auto`).
    pub fn gap_bound_ns(&self) -> Option<u64> {
        let b = self.gap_bound_ns.load(std::sync::atomic::Ordering::Relaxed);
        (b != u64::MAX).then_some(b)
    }

    /// [`release_at`] with the current floor.
    pub fn release_at(&self, arrival_ns: u64, deadline_ns: u64) -> u64 {
        release_at(arrival_ns, deadline_ns, self.current_ns())
    }
}

/// The lower quartile ([`FLOOR_QUANTILE_DIV`]) of a non-empty set.
fn lower_quartile(values: impl Iterator<Item = u64>) -> u64 {
    let mut v: Vec<u64> = values.collect();
    v.sort_unstable();
    v.get(v.len() / FLOOR_QUANTILE_DIV).copied().unwrap_or(0)
}

/// Threads whose last miss reply is remembered.
const GAP_THREADS: usize = 64;

/// When each recent faulting thread's last miss reply was released, to
/// measure the gap to its next miss ([`Floor::observe_gap`]). A faulting
/// thread waits for its reply, so the gap holds the whole trap path.
#[derive(Debug, Default)]
pub struct MissGaps {
    /// `(thread id, release ns)`, most recent last.
    last: std::sync::Mutex<std::collections::VecDeque<(u32, u64)>>,
}

impl MissGaps {
    /// Notes a miss of thread `tid` that arrived at `arrival_ns` and is
    /// released at `release_ns`; returns the gap since the thread's
    /// previous release, if it is remembered and not after this arrival.
    pub fn miss(&self, tid: u32, arrival_ns: u64, release_ns: u64) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let prev = last
            .iter()
            .position(|&(t, _)| t == tid)
            .and_then(|i| last.remove(i))
            .map(|(_, r)| r);
        if last.len() == GAP_THREADS {
            last.pop_front();
        }
        last.push_back((tid, release_ns));
        drop(last);
        prev.and_then(|r| arrival_ns.checked_sub(r))
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

    #[test]
    fn the_hold_is_the_deadline_less_the_floor_but_never_before_arrival() {
        // Off (a floor of 0): held to the deadline, exactly as before.
        assert_eq!(release_at(1_000, 41_000, 0), 41_000);
        assert_eq!(release_at(1_000, 500, 0), 500);
        let off = Floor::new(Compensation::Off);
        off.record(&[9_000]);
        assert_eq!(off.current_ns(), 0, "off never measures");
        assert_eq!(off.release_at(1_000, 41_000), 41_000);
        // A floor: deadline - floor, or at once when the model asks less.
        assert_eq!(release_at(1_000, 41_000, 15_000), 26_000);
        assert_eq!(release_at(1_000, 4_000, 15_000), 1_000);
        assert_eq!(release_at(1_000, 16_000, 15_000), 1_000);
        assert_eq!(release_at(0, 10, u64::MAX), 0);
        let fixed = Floor::new(Compensation::Fixed(12_000));
        fixed.record(&[1]);
        assert_eq!(fixed.current_ns(), 12_000);
        assert_eq!(fixed.release_at(100, 40_100), 28_100);
        // Auto: the lower quartile of the recent samples.
        let auto = Floor::new(Compensation::Auto);
        assert_eq!(auto.release_at(100, 40_100), 40_100, "nothing measured yet");
        auto.record(&[10_000, 30_000, 12_000, 11_000, 900_000]);
        assert_eq!(auto.current_ns(), 11_000);
        assert_eq!(auto.samples(), 5);
        assert_eq!(auto.release_at(100, 40_100), 29_100);
        // Bimodal (two request threads, one slow): the fast mode.
        let bimodal = Floor::new(Compensation::Auto);
        bimodal.record(&[
            12_000, 36_000, 12_500, 35_000, 11_800, 37_000, 12_200, 34_000,
        ]);
        assert_eq!(bimodal.current_ns(), 12_200);
        // Old samples leave the window.
        auto.record(&[20_000; FLOOR_WINDOW]);
        assert_eq!(auto.current_ns(), 20_000);
    }

    #[test]
    fn gaps_between_a_threads_misses_bound_the_probes_floor() {
        let f = Floor::new(Compensation::Auto);
        f.record(&[25_000; 8]);
        assert_eq!((f.current_ns(), f.gap_bound_ns()), (25_000, None));
        // Too few gaps: no bound yet.
        for _ in 0..GAP_MIN_SAMPLES - 1 {
            f.observe_gap(18_000);
        }
        assert_eq!(f.current_ns(), 25_000);
        // Enough (the bound is recomputed every few): their lower quartile.
        for g in [17_000, 19_000].into_iter().cycle().take(GAP_MIN_SAMPLES) {
            f.observe_gap(g);
        }
        assert_eq!(f.gap_bound_ns(), Some(18_000));
        assert_eq!(f.current_ns(), 18_000);
        assert_eq!(f.release_at(0, 40_000), 22_000);
        // A bound above the probes changes nothing; new probes still move
        // the floor under it.
        for _ in 0..GAP_WINDOW {
            f.observe_gap(90_000);
        }
        assert_eq!(f.current_ns(), 25_000);
        f.record(&[12_000; FLOOR_WINDOW]);
        assert_eq!(f.current_ns(), 12_000);
        // Off and Fixed take no gaps.
        let fixed = Floor::new(Compensation::Fixed(30_000));
        for _ in 0..GAP_WINDOW {
            fixed.observe_gap(1_000);
        }
        assert_eq!((fixed.current_ns(), fixed.gap_bound_ns()), (30_000, None));
    }

    #[test]
    fn a_gap_is_from_the_same_threads_last_release() {
        let g = MissGaps::default();
        assert_eq!(g.miss(7, 1_000, 41_000), None, "first miss of thread 7");
        assert_eq!(g.miss(8, 2_000, 42_000), None);
        assert_eq!(g.miss(7, 60_000, 100_000), Some(19_000));
        assert_eq!(g.miss(8, 50_000, 90_000), Some(8_000));
        // An arrival before the remembered release is no gap.
        assert_eq!(g.miss(8, 80_000, 120_000), None);
        // Old threads are forgotten.
        for t in 100..100 + GAP_THREADS as u32 {
            g.miss(t, 0, 0);
        }
        assert_eq!(g.miss(7, 200_000, 240_000), None);
    }

    #[test]
    fn compensation_parses_and_prints() {
        for (s, c) in [
            ("auto", Compensation::Auto),
            ("off", Compensation::Off),
            ("12000", Compensation::Fixed(12_000)),
            ("12000ns", Compensation::Fixed(12_000)),
            ("12us", Compensation::Fixed(12_000)),
            ("3µs", Compensation::Fixed(3_000)),
            ("0", Compensation::Fixed(0)),
        ] {
            assert_eq!(s.parse::<Compensation>(), Ok(c), "{s}");
            assert_eq!(c.to_string().parse::<Compensation>(), Ok(c));
        }
        for bad in ["", "on", "-1", "12ms", "1.5us", "99999999999999999999"] {
            assert!(bad.parse::<Compensation>().is_err(), "{bad}");
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
