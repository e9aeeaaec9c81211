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
pub use cxlfs_api::hits::RegionKind;
use cxlfs_api::metrics::HitSourceSample;
use std::sync::Arc;

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
                r.serving = self.source_of(&r.vm, r.region);
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

#[cfg(test)]
mod tests;
