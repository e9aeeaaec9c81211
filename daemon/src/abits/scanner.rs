//! The scanner thread: every period it reads and clears the bits of
//! every attached area, maps them to device pages (a window's through the
//! VM's slot table, a region's by offset), and hands them to the device as
//! references in one transaction; the period they were read for begins at
//! the previous scan (a page filled since is skipped: its miss was the
//! access). It is the [`HitSource`] of kind `access_bits`: it covers a VM
//! region while the region's VMM has the area attached and intact.

use super::VmArea;
use crate::device::PAGE;
use crate::hits::{HitPlanes, HitSource, RegionKind};
use crate::metrics::DeviceTotals;
use cxlfs_api::hits::HitSourceKind;
use cxlfs_api::metrics::HitSourceSample;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a VM may be connected with its area not attached before the
/// daemon says so (QEMU attaches while it starts, before it connects).
const ATTACH_GRACE: Duration = Duration::from_secs(5);

/// Whether VM `name` is connected to the daemon now (so its VMM is up).
pub type Connected = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// One tracked area and its figures.
struct Tracked {
    vm: String,
    region: RegionKind,
    area: super::BitArea,
    /// Covered: attached by the VMM, intact, not refused.
    covered: AtomicBool,
    /// Refused for good (its header was written over).
    refused: AtomicBool,
    bits_read: AtomicU64,
    references: AtomicU64,
    /// When the scanner first saw the VM connected with the area detached.
    detached_since: std::sync::Mutex<Option<Instant>>,
    /// Said that the VMM did not attach it.
    warned: AtomicBool,
}

/// Device-wide figures of the scans.
#[derive(Default)]
struct ScanFigures {
    scans: AtomicU64,
    scan_ns: AtomicU64,
    bits_read: AtomicU64,
    absent: AtomicU64,
    fresh: AtomicU64,
}

/// What the thread reads from and writes to.
struct Shared {
    tracked: Vec<Tracked>,
    figures: ScanFigures,
    on: HitPlanes,
    connected: Connected,
    /// What serves a region whose area is not attached (for the log).
    fallback: &'static str,
    /// How often the bits are read.
    period: Duration,
    stop: AtomicBool,
}

/// The accessed-bit source: its thread reads the bits every period;
/// dropping it stops the thread.
pub struct AccessBitsSource {
    shared: Arc<Shared>,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for AccessBitsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessBitsSource")
            .field("areas", &self.shared.tracked.len())
            .finish()
    }
}

impl AccessBitsSource {
    /// Starts reading `areas` every `period` (the one their headers ask
    /// QEMU for). `sampling`: whether access sampling serves what the bits
    /// do not (for the log).
    pub fn start(
        areas: Vec<VmArea>,
        period: Duration,
        on: HitPlanes,
        connected: Connected,
        sampling: bool,
    ) -> std::io::Result<Self> {
        let tracked = areas
            .into_iter()
            .map(|a| Tracked {
                vm: a.vm,
                region: a.region,
                area: a.area,
                covered: AtomicBool::new(false),
                refused: AtomicBool::new(false),
                bits_read: AtomicU64::new(0),
                references: AtomicU64::new(0),
                detached_since: std::sync::Mutex::new(None),
                warned: AtomicBool::new(false),
            })
            .collect();
        let shared = Arc::new(Shared {
            tracked,
            figures: ScanFigures::default(),
            on,
            connected,
            fallback: if sampling {
                "access sampling (hinting faults)"
            } else {
                "nothing: the policy sees its misses only"
            },
            period,
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("access-bits".into())
            .spawn(move || run(&s))?;
        tracing::info!(areas = shared.tracked.len(), period = ?period, "accessed bits on (read where the VMM attaches its area)");
        Ok(AccessBitsSource {
            shared,
            thread: std::sync::Mutex::new(Some(thread)),
        })
    }

    /// Stops the thread (no bit is read once this returns).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = crate::sync::lock(&self.thread).take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for AccessBitsSource {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread: a scan every period until stopped.
fn run(s: &Shared) {
    let mut since = s.on.device.now_ns();
    let period = s.period;
    let mut next = Instant::now() + period;
    let mut buffers = Buffers::default();
    while !s.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now < next {
            std::thread::park_timeout(next - now);
            continue;
        }
        next += period;
        // After a stall, no burst of scans.
        next = next.max(now + period / 2);
        since = scan(s, since, &mut buffers);
    }
}

/// Buffers kept from scan to scan.
#[derive(Default)]
struct Buffers {
    taken: Vec<u64>,
    device_pages: Vec<u64>,
    /// Per tracked area: its range of `device_pages`.
    spans: Vec<(usize, std::ops::Range<usize>)>,
}

/// One scan, for the period that began at `since` (device time); returns
/// when this one began.
fn scan(s: &Shared, since: u64, b: &mut Buffers) -> u64 {
    let started = Instant::now();
    let now = s.on.device.now_ns();
    b.device_pages.clear();
    b.spans.clear();
    for (i, t) in s.tracked.iter().enumerate() {
        if !check(s, t) {
            continue;
        }
        b.taken.clear();
        t.area.take(&mut b.taken);
        if b.taken.is_empty() {
            continue;
        }
        t.bits_read
            .fetch_add(b.taken.len() as u64, Ordering::Relaxed);
        s.figures
            .bits_read
            .fetch_add(b.taken.len() as u64, Ordering::Relaxed);
        let from = b.device_pages.len();
        device_pages(s, t, &b.taken, &mut b.device_pages);
        b.spans.push((i, from..b.device_pages.len()));
    }
    if !b.spans.is_empty() {
        let groups: Vec<&[u64]> = b
            .spans
            .iter()
            .map(|(_, r)| &b.device_pages[r.clone()])
            .collect();
        let done = s.on.device.reference(since, &groups);
        for ((i, _), r) in b.spans.iter().zip(done) {
            s.tracked[*i]
                .references
                .fetch_add(r.referenced, Ordering::Relaxed);
            s.figures.absent.fetch_add(r.absent, Ordering::Relaxed);
            s.figures.fresh.fetch_add(r.fresh, Ordering::Relaxed);
        }
    }
    s.figures.scans.fetch_add(1, Ordering::Relaxed);
    let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    s.figures.scan_ns.fetch_add(took, Ordering::Relaxed);
    now
}

/// Whether `t` is to be read now: attached by its VMM and intact. Logs
/// when it becomes so, when its VMM leaves it detached past the grace,
/// and refuses it for good once its header was written over.
fn check(s: &Shared, t: &Tracked) -> bool {
    if t.refused.load(Ordering::Relaxed) {
        return false;
    }
    let (vm, region) = (t.vm.as_str(), t.region.as_str());
    if !t.area.intact() {
        t.refused.store(true, Ordering::Relaxed);
        t.covered.store(false, Ordering::Relaxed);
        tracing::error!(vm, region, path = %t.area.path().display(), fallback = s.fallback, "accessed-bit area refused: its header was written over; the VM's hits there are seen through the fallback");
        return false;
    }
    // QEMU marks the area active when it attaches it and leaves the mark
    // when it dies: the area covers the region only while its VM is
    // connected too.
    let connected = (s.connected)(vm);
    let active = t.area.state().active && connected;
    let was = t.covered.swap(active, Ordering::Relaxed);
    if active && !was {
        tracing::info!(
            vm,
            region,
            "hits through accessed bits (its VMM attached the area)"
        );
    } else if !active && was {
        tracing::info!(
            vm,
            region,
            fallback = s.fallback,
            "accessed bits detached by the VMM, or the VM left; hits through the fallback"
        );
    }
    if !active && !t.warned.load(Ordering::Relaxed) && connected {
        let mut since = crate::sync::lock(&t.detached_since);
        let first = *since.get_or_insert_with(Instant::now);
        if first.elapsed() >= ATTACH_GRACE {
            t.warned.store(true, Ordering::Relaxed);
            tracing::warn!(vm, region, path = %t.area.path().display(), fallback = s.fallback, "the VM's VMM did not attach its accessed-bit area (KVM, a stock QEMU, or run-vm.sh without --dax-abits / --cxl-abits); its hits there are seen through the fallback");
        }
    }
    active
}

/// The device pages of `t`'s `taken` pages, appended to `out`.
fn device_pages(s: &Shared, t: &Tracked, taken: &[u64], out: &mut Vec<u64>) {
    match t.region {
        RegionKind::File => {
            if let Some(d) = &s.on.dax {
                d.window_pool_pages(&t.vm, taken, out);
            }
        }
        RegionKind::Memory => {
            let Some(r) = s.on.memory.as_ref().and_then(|m| m.region(&t.vm)) else {
                return;
            };
            let (first, pages) = (r.base / PAGE, r.size / PAGE);
            out.extend(taken.iter().filter(|&&p| p < pages).map(|p| first + p));
        }
    }
}

impl HitSource for AccessBitsSource {
    fn kind(&self) -> HitSourceKind {
        HitSourceKind::AccessBits
    }

    fn covers(&self, vm: &str, region: RegionKind) -> bool {
        self.shared
            .tracked
            .iter()
            .any(|t| t.vm == vm && t.region == region && t.covered.load(Ordering::Relaxed))
    }

    fn samples(&self) -> Vec<HitSourceSample> {
        self.shared
            .tracked
            .iter()
            .map(|t| {
                let st = t.area.state();
                HitSourceSample {
                    vm: t.vm.clone(),
                    region: t.region,
                    source: HitSourceKind::AccessBits,
                    serving: HitSourceKind::None,
                    bits_read: t.bits_read.load(Ordering::Relaxed),
                    references: t.references.load(Ordering::Relaxed),
                    rearms: st.rearms,
                    vmm_bits_set: st.bits_set,
                }
            })
            .collect()
    }

    fn add_totals(&self, totals: &mut DeviceTotals) {
        let f = &self.shared.figures;
        totals.access_bit_scans = f.scans.load(Ordering::Relaxed);
        totals.access_bit_scan_ns = f.scan_ns.load(Ordering::Relaxed);
        totals.access_bits_read = f.bits_read.load(Ordering::Relaxed);
        totals.access_bits_absent = f.absent.load(Ordering::Relaxed);
        totals.access_bits_fresh = f.fresh.load(Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
