//! The device's figures for the metrics leaf, which knows no other daemon
//! module: the shared device as a [`DeviceSource`] (given to the metrics
//! registry at start) and the data path's charges as [`DeviceWork`].

use super::{Charge, SharedDevice, EXTENT_SIZE};
use crate::metrics::{DeviceSource, DeviceTotals, DeviceWork};

impl From<&Charge> for DeviceWork {
    fn from(c: &Charge) -> Self {
        let a = &c.activity;
        DeviceWork {
            page_hits: c.page_hits,
            page_misses: c.page_misses,
            dram_pages: c.dram_pages,
            prefetch_issued: a.prefetch_issued,
            prefetch_used: a.prefetch_used,
            nand_reads: a.nand_reads,
            nand_programs: a.nand_programs,
            host_programs: a.host_programs,
            nand_erases: a.nand_erases,
            gc_runs: a.gc_runs,
            log_writes: a.log_writes,
            log_hits: a.log_hits,
            log_coalesced: a.log_coalesced,
        }
    }
}

impl DeviceSource for SharedDevice {
    fn totals(&self) -> DeviceTotals {
        let st = self.stats();
        let cxl_ratio = self.cxl_ratio();
        let (placed_dram_pages, placed_cxl_pages, pool_allocated_bytes, pool_aliased_extents, held) =
            self.read(|pool, _| {
                let (d, c) = pool.placed_pages(cxl_ratio);
                (
                    d,
                    c,
                    pool.allocated_extents() * EXTENT_SIZE,
                    pool.aliased_chunks(),
                    pool.held(),
                )
            });
        let sampling = self.sampling_counts();
        DeviceTotals {
            sampling_armed_pages: sampling.armed_pages,
            sampled_accesses: sampling.sampled_accesses,
            sampling_deferred_pages: sampling.deferred_pages,
            sampling_deferred_programs: sampling.deferred_programs,
            sampling_busy_ns: sampling.busy_ns,
            hits: st.hits,
            misses: st.misses,
            references: st.references,
            nand_reads: st.nand.reads(),
            nand_programs: st.nand.programs(),
            nand_erases: st.nand.erases,
            gc_runs: st.nand.gc_runs,
            write_amplification: st.nand.write_amplification(),
            prefetch_issued: st.prefetch_issued,
            prefetch_used: st.prefetch_used,
            log_writes: st.log_writes,
            log_hits: st.log_hits,
            log_coalesced: st.log_coalesced,
            log_cleanings: st.log_cleanings,
            log_stall_ns: st.log_stall_ns,
            evictions: st.evictions,
            resident_pages: st.resident_pages,
            dirty_pages: st.dirty_pages,
            policy: st.policy,
            cxl_ratio,
            placed_dram_pages,
            placed_cxl_pages,
            pool_allocated_bytes,
            pool_aliased_extents,
            pool_file_refs: held.refs,
            pool_held_bytes: held.extents * EXTENT_SIZE,
            ..DeviceTotals::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Charge, DeviceActivity, SharedDevice};
    use crate::metrics::Metrics;
    use cxlfs_device_model::{Device, DeviceConfig};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn the_shared_device_feeds_the_metrics() {
        let shared = Arc::new(SharedDevice::new(
            Device::new(DeviceConfig::default()).unwrap(),
        ));
        let m = Metrics::new(shared, None);
        let v = m.vm("vm0");
        v.record_charge(&Charge {
            completes_at_ns: 0,
            page_hits: 1,
            page_misses: 2,
            dram_pages: 3,
            activity: DeviceActivity {
                nand_reads: 4,
                host_programs: 5,
                ..DeviceActivity::default()
            },
            sampled_pages: 0,
        });
        assert_eq!(v.device_misses.load(Ordering::Relaxed), 2);
        assert_eq!(v.nand_reads.load(Ordering::Relaxed), 4);
        assert_eq!(v.host_programs.load(Ordering::Relaxed), 5);
        let text = m.render();
        for needle in [
            "cxlfs_nand_reads_total 0",
            "cxlfs_write_amplification 1",
            "cxlfs_cxl_ratio_percent 100",
            "cxlfs_device_policy_info{policy=",
            "cxlfs_vm_nand_reads_total{vm=\"vm0\"} 4",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        m.reset_device_counters();
        assert_eq!(v.device_misses.load(Ordering::Relaxed), 0);
        assert_eq!(m.traps_total(), 0);
    }
}
