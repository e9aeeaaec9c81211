//! Hit sources: how the guests' hits on mapped device pages, which run at
//! memory speed with no trap, reach the device's policy. Two sources
//! implement [`HitSource`]:
//! * accessed bits (`abits`): the VMM marks each page a vCPU reaches
//!   (QEMU's TLB fills under TCG); the daemon reads the marks every period
//!   and hands them to the device as references, every hit at most once a
//!   page a period, at no cost to the guest;
//! * access sampling (`sampler`): hinting faults on a sample of resident
//!   pages, for VMMs without the bits (KVM, stock QEMU); each sampled hit
//!   costs the guest a trap.
//!
//! A VM region is served by the first source, in order of preference, that
//! covers it now ([`HitSources::source_of`]); sampling leaves alone what
//! the bits cover. A KVM source (the EPT's accessed bits, DESIGN.md) would
//! be one more implementation, preferred like the QEMU one.

use crate::dax::DaxPlane;
use crate::device::SharedDevice;
use crate::memory::MemoryRegions;
use crate::metrics::{DeviceTotals, HitSourcesSource};
use cxlfs_api::hits::HitSourceKind;
use cxlfs_api::metrics::HitSourceSample;
use std::sync::Arc;

/// Which of a VM's mapped regions a hit lands in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegionKind {
    /// Its DAX window (pool pages of shared files).
    File,
    /// Its CXL memory region (memory mode).
    Memory,
}

impl RegionKind {
    /// The `region` label: `file` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            RegionKind::File => "file",
            RegionKind::Memory => "memory",
        }
    }
}

/// What a hit source works on: the device, and the residency planes whose
/// pages the guests map (the DAX window's, the memory regions).
#[derive(Clone)]
pub struct HitPlanes {
    /// The device its hits go to.
    pub device: Arc<SharedDevice>,
    /// The DAX window's plane, when the daemon has one.
    pub dax: Option<Arc<DaxPlane>>,
    /// The CXL memory regions (memory mode).
    pub memory: Option<Arc<MemoryRegions>>,
}

impl std::fmt::Debug for HitPlanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HitPlanes")
            .field("dax", &self.dax.is_some())
            .field("memory", &self.memory.is_some())
            .finish()
    }
}

/// A source of the guests' hits on mapped pages.
pub trait HitSource: Send + Sync {
    /// What it is.
    fn kind(&self) -> HitSourceKind;
    /// Whether it sees VM `vm`'s hits in `region` now.
    fn covers(&self, vm: &str, region: RegionKind) -> bool;
    /// Its figures, one row per VM region it tracks.
    fn samples(&self) -> Vec<HitSourceSample>;
    /// Adds its device-wide figures to `totals` (none by default).
    fn add_totals(&self, _totals: &mut DeviceTotals) {}
}

/// The daemon's hit sources, most preferred first.
#[derive(Default, Clone)]
pub struct HitSources {
    sources: Vec<Arc<dyn HitSource>>,
}

impl std::fmt::Debug for HitSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.sources.iter().map(|s| s.kind()))
            .finish()
    }
}

impl HitSources {
    /// Adds `source`, less preferred than those added before.
    pub fn push(&mut self, source: Arc<dyn HitSource>) {
        self.sources.push(source);
    }

    /// The source that serves VM `vm`'s `region` now.
    pub fn source_of(&self, vm: &str, region: RegionKind) -> HitSourceKind {
        self.sources
            .iter()
            .find(|s| s.covers(vm, region))
            .map_or(HitSourceKind::None, |s| s.kind())
    }

    /// Whether there is no source at all.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }
}

impl HitSourcesSource for HitSources {
    /// Every source's rows, each with the source that serves it now.
    fn samples(&self) -> Vec<HitSourceSample> {
        let mut rows: Vec<HitSourceSample> = Vec::new();
        for s in &self.sources {
            for mut r in s.samples() {
                let region = if r.region == RegionKind::File.as_str() {
                    RegionKind::File
                } else {
                    RegionKind::Memory
                };
                r.serving = self.source_of(&r.vm, region);
                rows.push(r);
            }
        }
        rows
    }

    fn add_totals(&self, totals: &mut DeviceTotals) {
        for s in &self.sources {
            s.add_totals(totals);
        }
    }
}

/// What a less preferred source must leave alone: what some more
/// preferred one covers. Shared, so that a source added later is seen.
#[derive(Default, Clone)]
pub struct Preferred(Arc<std::sync::OnceLock<Arc<dyn HitSource>>>);

impl std::fmt::Debug for Preferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Preferred")
            .field(&self.0.get().map(|s| s.kind()))
            .finish()
    }
}

impl Preferred {
    /// `source` is preferred from now on (only the first call counts).
    pub fn set(&self, source: Arc<dyn HitSource>) {
        let _ = self.0.set(source);
    }

    /// Whether a preferred source covers VM `vm`'s `region` now.
    pub fn covers(&self, vm: &str, region: RegionKind) -> bool {
        self.0.get().is_some_and(|s| s.covers(vm, region))
    }
}

#[cfg(test)]
mod tests;
