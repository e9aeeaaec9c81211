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
//!
//! It is the [`HitSource`] of kind `sampling`, less preferred than the
//! accessed bits: it arms no page of a VM region a preferred source covers
//! (a memory region whose VMM sets bits; the DAX pool once every VM that
//! maps it sets bits).

use crate::dax::DaxPlane;
use crate::hits::{HitPlanes, HitSource, RegionKind};
use cxlfs_api::hits::HitSourceKind;
use cxlfs_api::metrics::HitSourceSample;
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
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
    planes: Arc<Planes>,
}

/// The planes whose pages are armed, and what is left to other sources.
struct Planes {
    on: HitPlanes,
    /// The source preferred to sampling (the accessed bits), if any.
    preferred: Option<Arc<dyn HitSource>>,
}

impl std::fmt::Debug for Planes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planes")
            .field("on", &self.on)
            .field("preferred", &self.preferred.as_ref().map(|p| p.kind()))
            .finish()
    }
}

impl Planes {
    /// Whether the preferred source covers VM `vm`'s `region` now.
    fn left_to_preferred(&self, vm: &str, region: RegionKind) -> bool {
        self.preferred
            .as_ref()
            .is_some_and(|p| p.covers(vm, region))
    }

    /// The VM regions sampling can arm: every VM's window, every region.
    fn regions(&self) -> Vec<(String, RegionKind)> {
        let mut out = Vec::new();
        if let Some(d) = &self.on.dax {
            out.extend(d.vm_names().into_iter().map(|v| (v, RegionKind::File)));
        }
        if let Some(m) = &self.on.memory {
            out.extend(
                m.regions()
                    .iter()
                    .map(|r| (r.vm.clone(), RegionKind::Memory)),
            );
        }
        out
    }

    /// Whether a preferred source covers every VM that maps the pool.
    fn pool_covered(&self, dax: &DaxPlane) -> bool {
        let vms = dax.vm_names();
        !vms.is_empty()
            && vms
                .iter()
                .all(|v| self.left_to_preferred(v, RegionKind::File))
    }
}

impl AccessSampler {
    /// Starts arming `rate` pages a second of the planes `on`, leaving
    /// alone what `preferred` covers.
    pub fn start(
        on: HitPlanes,
        rate: u32,
        preferred: Option<Arc<dyn HitSource>>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let planes = Arc::new(Planes { on, preferred });
        planes.on.device.track_recency();
        let flag = stop.clone();
        let p = planes.clone();
        let thread = std::thread::Builder::new()
            .name("access-sampler".into())
            .spawn(move || run(&p, rate, &flag))?;
        tracing::info!(rate, "access sampling on (resident pages armed per second)");
        Ok(AccessSampler {
            stop,
            thread: std::sync::Mutex::new(Some(thread)),
            planes,
        })
    }

    /// Stops the thread (no page is armed once this returns).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = crate::sync::lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Drop for AccessSampler {
    fn drop(&mut self) {
        self.stop();
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
        let picked = planes.on.device.sampling_candidates(n);
        let picked = picked.as_slice();
        owed -= picked.len() as f64;
        if picked.is_empty() {
            owed = 0.0;
            continue;
        }
        let started = Instant::now();
        if let Some(d) = planes.on.dax.as_ref().filter(|d| !planes.pool_covered(d)) {
            d.arm_sampled(picked);
        }
        if let Some(m) = &planes.on.memory {
            m.arm_sampled(picked, |vm| {
                planes.left_to_preferred(vm, RegionKind::Memory)
            });
        }
        planes
            .on
            .device
            .record_sampling_time(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
}

impl HitSource for AccessSampler {
    fn kind(&self) -> HitSourceKind {
        HitSourceKind::Sampling
    }

    /// Every VM region with a plane (what a preferred source covers is
    /// left to it: the sources are asked in order).
    fn covers(&self, vm: &str, region: RegionKind) -> bool {
        self.planes
            .regions()
            .iter()
            .any(|(v, r)| v == vm && *r == region)
    }

    fn samples(&self) -> Vec<HitSourceSample> {
        self.planes
            .regions()
            .into_iter()
            .map(|(vm, r)| HitSourceSample {
                vm,
                region: r,
                source: HitSourceKind::Sampling,
                ..HitSourceSample::default()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
