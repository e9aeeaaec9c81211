//! The replay driver: feeds a stream of [`Access`]es to a [`Device`], assigns
//! arrival times, and sums up what happened in a [`ReplayReport`].
//!
//! Arrival modes ([`Arrival`]):
//! * `trace` — each access arrives at its own `time_ns` (must not decrease);
//! * `closed[:THINK]` — one access outstanding: each is issued when the
//!   previous one completed, plus the think time (dependent loads);
//! * `fixed:INTERVAL` — open loop: access `i` arrives at `i × INTERVAL`,
//!   whether or not earlier ones have completed.
//!
//! ```no_run
//! use cxlfs_device_model::replay::{Arrival, Replayer};
//! use cxlfs_device_model::workload::WorkloadSpec;
//! use cxlfs_device_model::{Device, DeviceConfig};
//! let cfg = DeviceConfig::default().with_overrides(&["cache.size_bytes=64MiB"]).unwrap();
//! let mut dev = Device::new(cfg).unwrap();
//! let mut replayer = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
//! replayer.run(WorkloadSpec::default().generate().unwrap()).unwrap();
//! println!("hit rate {}", replayer.report().hit_rate);
//! ```
//!
//! One loop feeds every replay: [`Replayer::try_run`] (and [`Replayer::run`]
//! for inputs that cannot fail) keeps a look-ahead window of upcoming
//! accesses and hints each to the device before it is fed, so that its
//! look-up overlaps the accesses before it instead of stalling on memory.
//! [`Replayer::drive`] adds the warm-up and progress reports on top;
//! `cxlfs replay` (traces, binary and CSV, and generated workloads alike)
//! and the replay benchmark both run through it.
//!
//! Pure and deterministic: the same device config, accesses and arrival mode
//! give the same report (the driver measures no wall-clock time; callers that
//! want throughput time the call to [`Replayer::drive`] themselves, or from
//! [`ReplayObserver::measuring`]).

pub use crate::arrival::{Arrival, ParseArrivalError};
use crate::device::{AccessError, Device, Op, Outcome};
use crate::trace::Access;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::convert::Infallible;
use std::fmt;

/// Accesses the look-ahead window holds: each is hinted to the device this
/// many accesses before it is fed (its page-table entry), and again half as
/// many before (its cache metadata). 32 beat 8 and 16 by 10-25 % on zipf
/// and by a few % on uniform (4 Mi pages, 1 Mi-page cache; 64 gained
/// nothing more): a memory miss here takes a few accesses' time.
pub const LOOKAHEAD: usize = 32;
/// An access's second hint (its cache metadata) comes this many accesses
/// before it is fed.
pub const HINT_IMMINENT: usize = LOOKAHEAD / 2;
/// An access's third hint (what a hit on it would relink) comes this many
/// accesses before it is fed.
pub const HINT_NEIGHBOURS: usize = LOOKAHEAD / 4;

/// Distinct latency values counted beside the histogram (see `Replayer::count_latency`).
const PENDING_LATENCIES: usize = 4;

/// Accesses between two [`ReplayObserver::progress`] calls in [`Replayer::drive`].
pub const PROGRESS_EVERY: u64 = 1 << 16;

/// Why a replay stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The device refused access number `index` (0-based, counted from the
    /// start of the replay, warm-up included).
    #[error("access {index}: {error}")]
    Device {
        /// 0-based access index.
        index: u64,
        /// What the device said.
        error: AccessError,
    },
    /// In `trace` arrival mode, an access earlier than its predecessor.
    #[error("access {index}: time {time_ns} ns is before the previous access's {previous_ns} ns (trace times must not decrease)")]
    TimeWentBackwards {
        /// 0-based access index.
        index: u64,
        /// Its time.
        time_ns: u64,
        /// The previous access's time.
        previous_ns: u64,
    },
}

impl ReplayError {
    /// 0-based index of the access that failed.
    pub fn index(&self) -> u64 {
        match self {
            ReplayError::Device { index, .. } | ReplayError::TimeWentBackwards { index, .. } => {
                *index
            }
        }
    }
}

/// Why a replay of a fallible input ([`Replayer::try_run`], [`Replayer::drive`]) stopped.
#[derive(Debug)]
pub enum RunError<E> {
    /// The input failed at its access number `index` (0-based, counted like
    /// [`ReplayError::index`]); every access before it was fed.
    Input {
        /// 0-based index of the access the input could not give.
        index: u64,
        /// What the input said.
        error: E,
    },
    /// The replay itself failed.
    Replay(ReplayError),
}

impl<E: fmt::Display> fmt::Display for RunError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Input { error, .. } => error.fmt(f),
            RunError::Replay(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RunError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Input { error, .. } => error.source(),
            RunError::Replay(e) => e.source(),
        }
    }
}

/// What [`Replayer::drive`] tells its caller along the way.
pub trait ReplayObserver {
    /// The warm-up is over and the statistics were reset: the measured part
    /// starts now (called once, also when there is no warm-up).
    fn measuring(&mut self) {}
    /// `fed` accesses (warm-up included) have been replayed; called every
    /// [`PROGRESS_EVERY`] accesses of the measured part and at its end.
    fn progress(&mut self, fed: u64) {
        let _ = fed;
    }
}

/// No observer.
impl ReplayObserver for () {}

/// Most misses of a replay joined a fill already in flight because the
/// accesses arrived faster than misses complete, all at once in the
/// extreme: what a trace whose times are not real arrival times (every
/// access stamped 0, say) replays as. See [`Replayer::coalescing_note`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CoalescingNote {
    /// The arrival mode.
    pub arrival: Arrival,
    /// Measured accesses.
    pub accesses: u64,
    /// Page misses.
    pub misses: u64,
    /// Of which coalesced.
    pub coalesced: u64,
    /// Arrival of the first measured access.
    pub first_arrival_ns: u64,
    /// Arrival of the last one.
    pub last_arrival_ns: u64,
}

impl fmt::Display for CoalescingNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} misses ({:.1} %) joined a fill already in flight: ",
            self.coalesced,
            self.misses,
            self.coalesced as f64 * 100.0 / self.misses.max(1) as f64
        )?;
        let span = self.last_arrival_ns - self.first_arrival_ns;
        if span == 0 {
            write!(
                f,
                "all {} accesses arrive at t = {} ns (arrival {}), so every re-access of a page \
                 still being filled is a miss",
                self.accesses, self.first_arrival_ns, self.arrival
            )
        } else {
            write!(
                f,
                "the {} accesses arrive within {} ns, one every {:.1} ns on average (arrival {}), \
                 faster than misses complete",
                self.accesses,
                span,
                span as f64 / self.accesses.saturating_sub(1).max(1) as f64,
                self.arrival
            )
        }
    }
}

/// Latency distribution of the measured accesses, in ns.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Exact mean.
    pub mean: f64,
    /// Exact minimum.
    pub min: u64,
    /// Exact maximum.
    pub max: u64,
}

/// NAND traffic during the measured part.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NandSummary {
    /// Flash page reads (host + GC).
    pub reads: u64,
    /// Flash page programs (host + GC).
    pub programs: u64,
    /// Block erases.
    pub erases: u64,
    /// GC runs.
    pub gc_runs: u64,
    /// GC runs that blocked writes.
    pub gc_foreground_runs: u64,
    /// Flash programs per host program.
    pub write_amplification: f64,
}

/// Prefetcher effectiveness during the measured part.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PrefetchSummary {
    /// Pages prefetched.
    pub issued: u64,
    /// Prefetched pages later used.
    pub used: u64,
    /// Prefetched pages evicted unused.
    pub wasted: u64,
}

/// What a replay measured (since the start or the last [`Replayer::reset_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReplayReport {
    /// Accesses replayed.
    pub accesses: u64,
    /// Of which reads.
    pub reads: u64,
    /// Of which writes.
    pub writes: u64,
    /// Page lookups (an access spanning two pages counts two).
    pub page_accesses: u64,
    /// Page lookups that hit.
    pub hits: u64,
    /// Page lookups that missed (coalesced and bypassed included).
    pub misses: u64,
    /// hits / page lookups.
    pub hit_rate: f64,
    /// Accesses all of whose pages hit.
    pub access_hits: u64,
    /// Misses that joined a fill in flight.
    pub coalesced: u64,
    /// Misses that bypassed a fully pinned set.
    pub bypasses: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Dirty pages written back.
    pub writebacks: u64,
    /// Per-access latency, arrival to completion.
    pub latency_ns: LatencySummary,
    /// NAND traffic.
    pub nand: NandSummary,
    /// Prefetcher.
    pub prefetch: PrefetchSummary,
    /// Simulated time from the first arrival to the last completion.
    pub sim_time_ns: u64,
    /// Eviction policy at the end.
    pub policy: String,
    /// Resident pages at the end.
    pub resident_pages: u64,
    /// Pinned pages at the end.
    pub pinned_pages: u64,
    /// Dirty pages at the end.
    pub dirty_pages: u64,
    /// Mean latency of the measured writes, in ns, to 3 decimals (0 without writes).
    pub write_latency_mean_ns: f64,
    /// All NAND page programs (host and GC: the same as `nand.programs`).
    pub nand_programs: u64,
    /// 64-byte lines written into the write log (0 with the log off).
    pub log_writes: u64,
    /// Read page lookups served from the write log.
    pub log_hits: u64,
    /// Log lines that merged into a line already logged or into a page
    /// cleaned in one program with them.
    pub log_coalesced: u64,
    /// Write-log cleaning passes.
    pub log_cleanings: u64,
    /// Page writes that waited for room in the log.
    pub log_stalls: u64,
    /// Their waits, summed, in ns.
    pub log_stall_ns: u64,
}

/// Drives a device with a stream of accesses.
#[derive(Debug)]
pub struct Replayer<'d> {
    device: &'d mut Device,
    arrival: Arrival,
    histogram: Histogram<u64>,
    /// Accesses fed since creation (the error index).
    index: u64,
    /// Measured accesses (since the last reset).
    measured: u64,
    access_hits: u64,
    latency_sum: u128,
    /// Measured writes and the sum of their latencies.
    write_count: u64,
    write_latency_sum: u128,
    latency_min: u64,
    latency_max: u64,
    /// Counts of a few latencies not yet in the histogram: `(value, count)`.
    pending: [(u64, u64); PENDING_LATENCIES],
    /// The entry of `pending` the next new value replaces.
    pending_next: usize,
    /// Arrival time of the next access in closed mode; last arrival in trace mode.
    clock_ns: u64,
    /// Fixed mode: arrival of the first access.
    fixed_origin_ns: u64,
    /// Arrival of the first measured access.
    first_arrival_ns: Option<u64>,
    /// Arrival of the last access.
    last_arrival_ns: u64,
    last_completion_ns: u64,
}

impl<'d> Replayer<'d> {
    /// A replayer starting at simulated time 0.
    pub fn new(device: &'d mut Device, arrival: Arrival) -> Self {
        Self::starting_at(device, arrival, 0)
    }

    /// A replayer whose first generated arrival (closed and fixed modes) is `start_ns`.
    pub fn starting_at(device: &'d mut Device, arrival: Arrival, start_ns: u64) -> Self {
        Replayer {
            device,
            arrival,
            histogram: new_histogram(),
            index: 0,
            measured: 0,
            access_hits: 0,
            latency_sum: 0,
            write_count: 0,
            write_latency_sum: 0,
            latency_min: u64::MAX,
            latency_max: 0,
            pending: [(0, 0); PENDING_LATENCIES],
            pending_next: 0,
            clock_ns: start_ns,
            fixed_origin_ns: start_ns,
            first_arrival_ns: None,
            last_arrival_ns: start_ns,
            last_completion_ns: start_ns,
        }
    }

    /// The arrival mode.
    pub fn arrival(&self) -> Arrival {
        self.arrival
    }

    /// Accesses fed so far (warm-up included).
    pub fn fed(&self) -> u64 {
        self.index
    }

    /// The device being driven.
    pub fn device(&self) -> &Device {
        self.device
    }

    /// The replay's clock: the next arrival in closed mode, the last one
    /// otherwise.
    pub fn clock_ns(&self) -> u64 {
        self.clock_ns
    }

    /// Tells the device of `pages` referenced since `since_ns` (see
    /// [`Device::reference`]): a source of hits seen after the fact.
    pub fn reference(&mut self, since_ns: u64, pages: &[u64]) -> crate::device::References {
        self.device.reference(since_ns, pages)
    }

    /// Counts one latency. A few values (a hit's, a plain miss's, with the
    /// NAND model off) make up most accesses: they are counted here and
    /// handed to the histogram when their entry is replaced or read.
    #[inline(always)]
    fn count_latency(&mut self, latency: u64) {
        for entry in &mut self.pending {
            if entry.0 == latency {
                entry.1 += 1;
                return;
            }
        }
        self.replace_pending(latency);
    }

    #[inline(never)]
    fn replace_pending(&mut self, latency: u64) {
        let (value, count) = self.pending[self.pending_next];
        record(&mut self.histogram, value, count);
        self.pending[self.pending_next] = (latency, 1);
        self.pending_next = (self.pending_next + 1) % PENDING_LATENCIES;
    }

    /// Feeds one access; its arrival time follows the mode.
    #[inline(always)]
    pub fn feed(&mut self, access: Access) -> Result<Outcome, ReplayError> {
        let index = self.index;
        let now = match self.arrival {
            Arrival::Trace => {
                if access.time_ns < self.clock_ns && index > 0 {
                    return Err(ReplayError::TimeWentBackwards {
                        index,
                        time_ns: access.time_ns,
                        previous_ns: self.clock_ns,
                    });
                }
                access.time_ns
            }
            Arrival::Closed { .. } => self.clock_ns,
            Arrival::Fixed { interval_ns } => self
                .fixed_origin_ns
                .saturating_add(index.saturating_mul(interval_ns)),
        };
        let out = self
            .device
            .access(now, access.op, access.addr, access.len)
            .map_err(|error| ReplayError::Device { index, error })?;
        self.index = index + 1;
        self.clock_ns = match self.arrival {
            Arrival::Closed { think_ns } => out.completes_at_ns.saturating_add(think_ns),
            _ => now,
        };
        if self.first_arrival_ns.is_none() {
            self.first_arrival_ns = Some(now);
        }
        self.last_arrival_ns = now;
        self.measured += 1;
        self.access_hits += u64::from(out.hit);
        let latency = out.latency_ns;
        self.count_latency(latency);
        self.latency_sum += u128::from(latency);
        if access.op == Op::Write {
            self.write_count += 1;
            self.write_latency_sum += u128::from(latency);
        }
        self.latency_min = self.latency_min.min(latency);
        self.latency_max = self.latency_max.max(latency);
        self.last_completion_ns = self.last_completion_ns.max(out.completes_at_ns);
        Ok(out)
    }

    /// Feeds every access of `accesses` through the look-ahead loop (see
    /// [`Replayer::try_run`]); returns how many were fed.
    pub fn run<I>(&mut self, accesses: I) -> Result<u64, ReplayError>
    where
        I: IntoIterator<Item = Access>,
    {
        match self.try_run(accesses.into_iter().map(Ok::<Access, Infallible>)) {
            Ok(fed) => Ok(fed),
            Err(RunError::Replay(e)) => Err(e),
            Err(RunError::Input { error, .. }) => match error {},
        }
    }

    /// Feeds every access of a fallible input (a trace being read); returns
    /// how many were fed. The replayer's one loop (a miniature's
    /// counters-only loop, in `mrc::minisim`, hints on the same schedule):
    /// it keeps a window of the next
    /// [`LOOKAHEAD`] accesses and hints each to the device three times — its
    /// page-table entry as it enters the window, its cache metadata halfway
    /// through, what a hit on it would relink at three quarters — so that
    /// its look-up overlaps the accesses before it instead of stalling on
    /// memory. The hints change nothing the model reports:
    /// the result is that of [`Replayer::feed`] on each access in turn.
    ///
    /// When the input fails, the accesses before the failure are fed first,
    /// then [`RunError::Input`] is returned; the input is not read further.
    pub fn try_run<I, E>(&mut self, accesses: I) -> Result<u64, RunError<E>>
    where
        I: IntoIterator<Item = Result<Access, E>>,
    {
        let start = self.index;
        let mut upcoming = accesses.into_iter();
        let mut failed = None;
        let mut more = true;
        let mut window = [Access::default(); LOOKAHEAD];
        let mut pending = 0;
        while pending < LOOKAHEAD {
            match upcoming.next() {
                Some(Ok(access)) => {
                    self.device.hint_upcoming(access.addr);
                    window[pending] = access;
                    pending += 1;
                }
                Some(Err(error)) => {
                    failed = Some(error);
                    more = false;
                    break;
                }
                None => {
                    more = false;
                    break;
                }
            }
        }
        // `window[head..]` then `window[..head]` hold the `pending` accesses in order.
        let mut head = 0;
        while pending > 0 {
            let current = window[head];
            match if more { upcoming.next() } else { None } {
                Some(Ok(next)) => {
                    self.device.hint_upcoming(next.addr);
                    window[head] = next;
                }
                Some(Err(error)) => {
                    failed = Some(error);
                    more = false;
                    pending -= 1;
                }
                None => {
                    more = false;
                    pending -= 1;
                }
            }
            head = (head + 1) % LOOKAHEAD;
            if pending > HINT_IMMINENT {
                self.device
                    .hint_imminent(window[(head + HINT_IMMINENT - 1) % LOOKAHEAD].addr);
            }
            if pending > HINT_NEIGHBOURS {
                self.device
                    .hint_neighbours(window[(head + HINT_NEIGHBOURS - 1) % LOOKAHEAD].addr);
            }
            self.feed(current).map_err(RunError::Replay)?;
        }
        match failed {
            Some(error) => Err(RunError::Input {
                index: self.index,
                error,
            }),
            None => Ok(self.index - start),
        }
    }

    /// Replays a whole input as `cxlfs replay` does: the first `warmup`
    /// accesses warm the cache, then the statistics are reset
    /// ([`Replayer::reset_stats`]) and the rest is measured, in runs of
    /// [`PROGRESS_EVERY`] accesses through [`Replayer::try_run`]'s loop.
    /// Returns the accesses fed (warm-up included). If the input ends
    /// within the warm-up, nothing is reset and `observer.measuring()` is
    /// not called.
    pub fn drive<I, E>(
        &mut self,
        accesses: I,
        warmup: u64,
        observer: &mut impl ReplayObserver,
    ) -> Result<u64, RunError<E>>
    where
        I: IntoIterator<Item = Result<Access, E>>,
    {
        let start = self.index;
        let mut input = accesses.into_iter();
        if warmup > 0 {
            let take = usize::try_from(warmup).unwrap_or(usize::MAX);
            let warmed = self.try_run(input.by_ref().take(take))?;
            if warmed < warmup {
                return Ok(warmed);
            }
            self.reset_stats();
        }
        observer.measuring();
        loop {
            let fed = self.index - start;
            let chunk = PROGRESS_EVERY - fed % PROGRESS_EVERY;
            let got = self.try_run(input.by_ref().take(chunk as usize))?;
            if got > 0 {
                observer.progress(fed + got);
            }
            if got < chunk {
                return Ok(fed + got);
            }
        }
    }

    /// `Some` when most of the measured misses (more than half) joined a
    /// fill already in flight under an open-loop arrival mode (`trace` or
    /// `fixed`): the accesses arrived faster than misses complete. A trace
    /// whose accesses all carry the same time replays so — every re-access
    /// of a page being filled a miss — and says nothing about the cache;
    /// callers should tell the user. Never under `closed` arrival.
    pub fn coalescing_note(&self) -> Option<CoalescingNote> {
        if matches!(self.arrival, Arrival::Closed { .. }) {
            return None;
        }
        let s = self.device.stats();
        let first_arrival_ns = self.first_arrival_ns?;
        (s.misses > 0 && s.coalesced.saturating_mul(2) > s.misses).then_some(CoalescingNote {
            arrival: self.arrival,
            accesses: self.measured,
            misses: s.misses,
            coalesced: s.coalesced,
            first_arrival_ns,
            last_arrival_ns: self.last_arrival_ns,
        })
    }

    /// Zeroes the measurements and the device's counters (after a warm-up);
    /// the cache contents and the simulated clock carry on.
    pub fn reset_stats(&mut self) {
        self.device.reset_stats();
        self.histogram.reset();
        for entry in &mut self.pending {
            entry.1 = 0;
        }
        self.measured = 0;
        self.access_hits = 0;
        self.latency_sum = 0;
        self.write_count = 0;
        self.write_latency_sum = 0;
        self.latency_min = u64::MAX;
        self.latency_max = 0;
        self.first_arrival_ns = None;
    }

    /// The measured latency distribution (per access, in ns).
    pub fn histogram(&self) -> Histogram<u64> {
        let mut h = self.histogram.clone();
        for &(value, count) in &self.pending {
            record(&mut h, value, count);
        }
        h
    }

    /// What was measured so far.
    pub fn report(&self) -> ReplayReport {
        let s = self.device.stats();
        let h = &self.histogram();
        let mean = if self.measured == 0 {
            0.0
        } else {
            self.latency_sum as f64 / self.measured as f64
        };
        let latency_ns = LatencySummary {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            mean,
            min: if self.measured == 0 {
                0
            } else {
                self.latency_min
            },
            max: self.latency_max,
        };
        let sim_time_ns = match self.first_arrival_ns {
            Some(first) => self.last_completion_ns.saturating_sub(first),
            None => 0,
        };
        ReplayReport {
            accesses: s.accesses,
            reads: s.reads,
            writes: s.writes,
            page_accesses: s.page_accesses,
            hits: s.hits,
            misses: s.misses,
            hit_rate: s.hit_rate(),
            access_hits: self.access_hits,
            coalesced: s.coalesced,
            bypasses: s.bypasses,
            evictions: s.evictions,
            writebacks: s.writebacks,
            latency_ns,
            nand: NandSummary {
                reads: s.nand.reads(),
                programs: s.nand.programs(),
                erases: s.nand.erases,
                gc_runs: s.nand.gc_runs,
                gc_foreground_runs: s.nand.gc_foreground_runs,
                write_amplification: s.nand.write_amplification(),
            },
            prefetch: PrefetchSummary {
                issued: s.prefetch_issued,
                used: s.prefetch_used,
                wasted: s.prefetch_wasted,
            },
            sim_time_ns,
            policy: s.policy,
            resident_pages: s.resident_pages,
            pinned_pages: s.pinned_pages,
            dirty_pages: s.dirty_pages,
            write_latency_mean_ns: if self.write_count == 0 {
                0.0
            } else {
                // To the picosecond: short decimals survive a JSON round trip.
                let mean = self.write_latency_sum as f64 / self.write_count as f64;
                (mean * 1000.0).round() / 1000.0
            },
            nand_programs: s.nand_programs,
            log_writes: s.log_writes,
            log_hits: s.log_hits,
            log_coalesced: s.log_coalesced,
            log_cleanings: s.log_cleanings,
            log_stalls: s.log_stalls,
            log_stall_ns: s.log_stall_ns,
        }
    }
}

fn record(h: &mut Histogram<u64>, value: u64, count: u64) {
    if count > 0 && h.record_n(value, count).is_err() {
        // Beyond what even a resized histogram tracks (~146 years): clamp.
        h.saturating_record_n(value, count);
    }
}

fn new_histogram() -> Histogram<u64> {
    // 3 significant digits; sized for 10 s up front so that the replay loop
    // does not resize, auto-resizing beyond that.
    let mut h = Histogram::new_with_bounds(1, 10_000_000_000, 3)
        .expect("1 ns .. 10 s at 3 significant digits is a valid histogram");
    h.auto(true);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_parses() {
        assert_eq!("trace".parse::<Arrival>().unwrap(), Arrival::Trace);
        assert_eq!(
            "closed".parse::<Arrival>().unwrap(),
            Arrival::Closed { think_ns: 0 }
        );
        assert_eq!(
            "closed:1us".parse::<Arrival>().unwrap(),
            Arrival::Closed { think_ns: 1000 }
        );
        assert_eq!(
            "fixed:100".parse::<Arrival>().unwrap(),
            Arrival::Fixed { interval_ns: 100 }
        );
        assert!("fixed".parse::<Arrival>().is_err());
        assert!("open".parse::<Arrival>().is_err());
        for a in ["trace", "closed", "closed:5", "fixed:100"] {
            assert_eq!(a.parse::<Arrival>().unwrap().to_string(), a);
        }
    }
}
