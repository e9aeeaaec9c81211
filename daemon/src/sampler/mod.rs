//! Access sampling's thread (`--access-sampling RATE`): it arms resident
//! device-cache pages at RATE pages a second, in whichever residency plane
//! holds them (a DAX window's pool, a CXL memory region), those the daemon
//! has not heard of for the longest first (their last trap is oldest: under
//! a recency policy they are the next to be evicted, so a hit on them is
//! the one the policy must not miss). An armed page leaves its plane while the
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
        planes.shared.track_recency();
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
        let picked = planes.shared.sampling_candidates(n);
        let picked = picked.as_slice();
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

#[cfg(test)]
mod tests;
