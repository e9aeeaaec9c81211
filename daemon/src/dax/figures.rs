//! The plane's figures for the metrics registry: its counters, the pages
//! several VMs map, the prefetched pages pushed into it.

use super::DaxPlane;
use crate::metrics::{PlaneFigures, PlaneSource, PlaneVmId};
use std::sync::atomic::Ordering;

impl DaxPlane {
    /// Prefetched pages pushed into the plane so far.
    pub fn prefetch_pushed(&self) -> u64 {
        self.prefetch_pushed.load(Ordering::Relaxed)
    }

    /// Plane counters (`None` once shut down).
    pub fn plane_metrics(&self) -> Option<residency::PlaneMetricsSnapshot> {
        self.plane().map(|p| p.metrics())
    }
}

/// The plane's figures for the metrics registry (attached at start).
impl PlaneSource for DaxPlane {
    fn figures(&self) -> Option<PlaneFigures> {
        self.plane_metrics().map(|m| PlaneFigures {
            traps_by_vm: m.traps_by_vm,
            resident_bytes: m.resident_bytes,
            evictions: m.invalidations,
            eviction_lag_ns: m.invalidation_lag_ns,
            eviction_lag_max_ns: m.invalidation_lag_max_ns,
            backlog_waits: m.backlog_waits,
            backlog_wait_ns: m.backlog_wait_ns,
            backlog_overruns: m.backlog_overruns,
            compensation_ns: m.compensation_ns,
            ring_requests: m.ring_requests,
        })
    }

    fn vm_id(&self, name: &str) -> Option<PlaneVmId> {
        self.find_vm_id(name)
    }

    fn shared_pages(&self) -> u64 {
        DaxPlane::shared_pages(self)
    }

    fn prefetch_stores(&self) -> u64 {
        self.prefetch_pushed()
    }

    fn mapped_bytes(&self, vm: PlaneVmId) -> u64 {
        DaxPlane::mapped_bytes(self, vm)
    }
}
