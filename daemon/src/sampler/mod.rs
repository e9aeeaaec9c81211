//! Access sampling's thread (`--access-sampling RATE`): it arms resident
//! device-cache pages at RATE pages a second, picked at random from the
//! device cache, in whichever residency plane holds them (a DAX window's
//! pool, a CXL memory region). An armed page leaves its plane while the
//! device cache keeps it, so the guest's next access to it traps and is
//! charged as a device hit: the policy sees an access that otherwise runs
//! at memory speed unseen, about when it happened. The marks that keep the
//! model unchanged otherwise (no NAND time, dirty pages stay dirty) are the
//! device's (`device/sampling.rs`).

use crate::dax::DaxPlane;
use crate::device::SharedDevice;
use crate::memory::MemoryRegions;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the thread wakes to arm what the rate allows since.
const TICK: Duration = Duration::from_millis(10);
/// How long a copy of the device cache's resident list serves picks (the
/// device checks each pick is still resident when it arms it).
const DECK_LIFE: Duration = Duration::from_millis(250);

/// The running sampler; dropping it stops the thread.
#[derive(Debug)]
pub struct AccessSampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The planes whose pages are armed.
struct Planes {
    shared: Arc<SharedDevice>,
    dax: Option<Arc<DaxPlane>>,
    memory: Option<Arc<MemoryRegions>>,
}

impl AccessSampler {
    /// Starts arming `rate` pages a second of the planes given.
    pub fn start(
        shared: Arc<SharedDevice>,
        dax: Option<Arc<DaxPlane>>,
        memory: Option<Arc<MemoryRegions>>,
        rate: u32,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let planes = Planes {
            shared,
            dax,
            memory,
        };
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("access-sampler".into())
            .spawn(move || run(&planes, rate, &flag))?;
        tracing::info!(rate, "access sampling on (resident pages armed per second)");
        Ok(AccessSampler {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for AccessSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: every tick, arms the pages the rate allows since the last
/// one (fractions carry over).
fn run(planes: &Planes, rate: u32, stop: &AtomicBool) {
    let mut deck = Deck {
        pages: Vec::new(),
        next: 0,
        dealt_at: Instant::now(),
        rng: XorShift(0x9e37_79b9_7f4a_7c15),
    };
    let mut owed = 0.0_f64;
    let mut last = Instant::now();
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(TICK);
        let now = Instant::now();
        owed += f64::from(rate) * now.duration_since(last).as_secs_f64();
        last = now;
        // At most one second's worth at once (after a stall, no burst).
        owed = owed.min(f64::from(rate));
        let n = owed as usize;
        if n == 0 {
            continue;
        }
        let picked = deck.deal(&planes.shared, n);
        owed -= picked.len() as f64;
        if picked.is_empty() {
            owed = 0.0;
            continue;
        }
        let started = Instant::now();
        if let Some(d) = &planes.dax {
            d.arm_sampled(picked);
        }
        if let Some(m) = &planes.memory {
            m.arm_sampled(picked);
        }
        planes
            .shared
            .record_sampling_time(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
}

/// The device cache's resident pages, dealt at random without repeats
/// until they run out or the copy is [`DECK_LIFE`] old.
struct Deck {
    pages: Vec<u64>,
    next: usize,
    dealt_at: Instant,
    rng: XorShift,
}

impl Deck {
    /// Up to `n` pages not dealt since the last refill.
    fn deal(&mut self, shared: &SharedDevice, n: usize) -> &[u64] {
        if self.next >= self.pages.len() || self.dealt_at.elapsed() > DECK_LIFE {
            self.pages = shared.read(|_, dev| dev.resident_page_list());
            self.next = 0;
            self.dealt_at = Instant::now();
        }
        let start = self.next;
        let got = pick(&mut self.pages[start..], n, &mut self.rng).len();
        self.next += got;
        &self.pages[start..start + got]
    }
}

/// `n` distinct pages of `pages` at random (a partial Fisher-Yates shuffle:
/// they end up first), or all of them.
fn pick<'a>(pages: &'a mut [u64], n: usize, rng: &mut XorShift) -> &'a [u64] {
    let n = n.min(pages.len());
    for i in 0..n {
        let span = (pages.len() - i) as u64;
        let j = i + (rng.next() % span) as usize;
        pages.swap(i, j);
    }
    &pages[..n]
}

/// A small fast generator (xorshift64); the sample needs no more.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

#[cfg(test)]
mod tests;
