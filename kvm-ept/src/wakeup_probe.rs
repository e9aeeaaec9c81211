//! A host thread's wake-up, measured: two threads that take turns, each
//! sleeping in a futex until the other wakes it. One wake-up is a lower
//! bound of what a request crossing a thread boundary pays, and what
//! [`Compensation::Auto`](crate::pace::Compensation) takes as the virtio-fs
//! path's floor (DESIGN.md, "Latency compensation").

use std::io;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the echo thread is left alone before each round trip, so that
/// it is asleep when woken, as an idle server thread is.
const SETTLE: Duration = Duration::from_micros(50);

/// Why a probe could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnWakeupProbeError {
    /// The echo thread could not be spawned.
    #[error("cannot spawn the wake-up probe's echo thread")]
    Spawn(#[source] io::Error),
}

/// A probe: a sleeping echo thread, woken once per round trip. Kept for
/// the daemon's life, so later measurements spawn nothing (and take no
/// system call a sandbox might refuse once serving).
#[derive(Debug)]
pub struct WakeupProbe {
    to_echo: Option<Sender<()>>,
    back: Receiver<()>,
    echo: Option<JoinHandle<()>>,
}

impl WakeupProbe {
    /// Starts the echo thread.
    pub fn spawn() -> Result<Self, SpawnWakeupProbeError> {
        let (to_echo, rx) = mpsc::channel::<()>();
        let (tx, back) = mpsc::channel::<()>();
        let echo = std::thread::Builder::new()
            .name("wakeup-probe".into())
            .spawn(move || {
                for () in rx {
                    if tx.send(()).is_err() {
                        break;
                    }
                }
            })
            .map_err(SpawnWakeupProbeError::Spawn)?;
        Ok(WakeupProbe {
            to_echo: Some(to_echo),
            back,
            echo: Some(echo),
        })
    }

    /// Up to `rounds` one-way wake-ups (ns): each a round trip halved,
    /// taken after the echo thread has slept [`SETTLE`]. Fewer (none) if
    /// the echo thread is gone. About 0.1 ms per round on an idle host.
    pub fn samples(&self, rounds: usize) -> Vec<u64> {
        let Some(to_echo) = &self.to_echo else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            std::thread::sleep(SETTLE);
            let t0 = Instant::now();
            if to_echo.send(()).is_err() || self.back.recv().is_err() {
                break;
            }
            let rt = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
            out.push(rt / 2);
        }
        out
    }
}

impl Drop for WakeupProbe {
    fn drop(&mut self) {
        // Closing the channel ends the echo thread's loop.
        self.to_echo.take();
        if let Some(h) = self.echo.take() {
            if h.join().is_err() {
                tracing::warn!("the wake-up probe's echo thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn wakeups_are_measured_positive_and_bounded() {
        let probe = WakeupProbe::spawn().unwrap();
        let s = probe.samples(8);
        assert_eq!(s.len(), 8);
        assert!(s.iter().all(|&x| x > 0 && x < 10_000_000), "{s:?}");
        // The same probe measures again later (the daemon re-probes).
        assert_eq!(probe.samples(3).len(), 3);
    }
}
