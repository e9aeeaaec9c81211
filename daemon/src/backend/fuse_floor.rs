//! The virtio-fs path's floor: what every VM's held READ / WRITE replies
//! are released ahead of their modeled completion by. Under
//! `--latency-compensation fuse=auto` it is one host thread wake-up
//! ([`WakeupProbe`]), measured [`START_ROUNDS`] times before any VM is
//! served and [`REPROBE_ROUNDS`] more every [`REPROBE_EVERY`]; the floor
//! is the lower quartile of the last [`pace::FLOOR_WINDOW`] samples
//! ([`pace::Floor`]), so a host that was busy at start (or is now) moves
//! it within a minute, and one slow probe does not. `/metrics` shows the
//! floor in use (`cxlfs_latency_compensation_seconds{path="fuse"}`).

use crate::metrics::Metrics;
use residency::pace::{self, Compensation, Floor};
use residency::wakeup_probe::WakeupProbe;
use std::sync::{Arc, Weak};
use std::thread;
use std::time::Duration;

/// Wake-ups measured before the first VM is served (about 7 ms).
pub const START_ROUNDS: usize = pace::FLOOR_WINDOW;
/// Wake-ups measured at each re-probe (about 2 ms).
pub const REPROBE_ROUNDS: usize = 16;
/// How often the floor is re-probed.
pub const REPROBE_EVERY: Duration = Duration::from_secs(10);

/// The daemon's virtio-fs floor for `mode`: fixed, off, or (auto)
/// measured now and kept up to date by a `fuse-floor` thread, which ends
/// at its first wake-up after the floor or `metrics` is dropped.
pub fn start(mode: Compensation, metrics: &Arc<Metrics>) -> Arc<Floor> {
    start_every(mode, metrics, REPROBE_EVERY)
}

/// [`start`], re-probing every `every`.
fn start_every(mode: Compensation, metrics: &Arc<Metrics>, every: Duration) -> Arc<Floor> {
    let floor = Arc::new(Floor::new(mode));
    if mode == Compensation::Auto {
        match WakeupProbe::spawn() {
            Ok(probe) => {
                floor.record(&probe.samples(START_ROUNDS));
                spawn_reprobe(
                    probe,
                    every,
                    Arc::downgrade(&floor),
                    Arc::downgrade(metrics),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "no wake-up probe: the virtio-fs path's floor stays 0");
            }
        }
    }
    metrics.set_fuse_compensation_ns(floor.current_ns());
    floor
}

fn spawn_reprobe(probe: WakeupProbe, every: Duration, floor: Weak<Floor>, metrics: Weak<Metrics>) {
    let spawned = thread::Builder::new()
        .name("fuse-floor".into())
        .spawn(move || loop {
            thread::sleep(every);
            let (Some(floor), Some(metrics)) = (floor.upgrade(), metrics.upgrade()) else {
                return;
            };
            floor.record(&probe.samples(REPROBE_ROUNDS));
            metrics.set_fuse_compensation_ns(floor.current_ns());
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot spawn the fuse-floor thread: the virtio-fs path's floor stays as measured at start");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::metrics::test_support::metrics;

    #[test]
    fn off_and_fixed_are_as_given_and_auto_is_measured_and_shown() {
        let m = metrics();
        assert_eq!(start(Compensation::Off, &m).current_ns(), 0);
        assert_eq!(m.fuse_compensation_ns(), 0);
        assert_eq!(start(Compensation::Fixed(7_000), &m).current_ns(), 7_000);
        assert_eq!(m.fuse_compensation_ns(), 7_000);
        let auto = start(Compensation::Auto, &m);
        let ns = auto.current_ns();
        assert!(ns > 0 && ns < 10_000_000, "{ns} ns");
        assert_eq!(auto.samples(), START_ROUNDS as u64);
        assert_eq!(m.fuse_compensation_ns(), ns);
    }

    #[test]
    fn auto_is_reprobed_while_the_floor_lives() {
        let m = metrics();
        let floor = start_every(Compensation::Auto, &m, Duration::from_millis(5));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while floor.samples() < (START_ROUNDS + 2 * REPROBE_ROUNDS) as u64 {
            assert!(
                std::time::Instant::now() < deadline,
                "not re-probed: {} samples",
                floor.samples()
            );
            thread::sleep(Duration::from_millis(5));
        }
        // The metric follows each re-probe (set just after the floor).
        let shown = m.fuse_compensation_ns();
        assert!(shown > 0 && shown < 10_000_000, "{shown} ns");
    }
}
