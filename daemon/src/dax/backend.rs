//! The daemon's side of the residency plane: what a trap and a write-back
//! do (charge the device, move the host file's bytes).

use super::{lock, PlaneState};
use crate::device::{SharedDevice, EXTENT_SIZE};
use crate::ids::VmId;
use crate::metrics::VmMetrics;
use cxlfs_device_model::Op;
use residency::{Miss, MissData, MissReply, PoolBackend, ServeMissError, WritebackError};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// The daemon's [`PoolBackend`]: traps and write-backs against host files.
pub(super) struct DaemonPoolBackend {
    pub(super) shared: Arc<SharedDevice>,
    pub(super) state: Arc<PlaneState>,
}

impl PoolBackend for DaemonPoolBackend {
    fn now_ns(&self) -> u64 {
        self.shared.now_ns()
    }

    fn on_miss(&self, miss: &Miss, _dst: &mut [u8]) -> Result<MissReply, ServeMissError> {
        let within = miss.pool_offset % EXTENT_SIZE;
        // A trap never crosses an extent (the kernel asks for one page).
        let len = u64::from(miss.len).min(EXTENT_SIZE - within) as u32;
        let at = self.state.file_at(&self.shared, miss.pool_offset);
        let charge = self
            .shared
            .charge_pool(miss.arrival_ns, Op::Read, miss.pool_offset, len.max(1))
            .map_err(|e| ServeMissError::Device(e.to_string()))?;
        if let Some(m) = self.state.vm_metrics(miss.vm) {
            m.record_charge(&charge);
            m.record_trap_latency(charge.completes_at_ns.saturating_sub(miss.arrival_ns));
        }
        let data = match at {
            Some((file, offset)) => MissData::File { file, offset },
            // Nobody owns it (a freed extent): zeros.
            None => MissData::Zeros,
        };
        Ok(MissReply {
            data,
            completes_at_ns: charge.completes_at_ns,
        })
    }

    fn on_writeback(
        &self,
        pool_offset: u64,
        data: &[u8],
        pid: u32,
        arrival_ns: u64,
    ) -> Result<u64, WritebackError> {
        // Pages being discarded are held, not stored: their bytes are about
        // to be destroyed in the host file, and storing them after that
        // would bring the old bytes back.
        let now = lock(&self.state.discards).split(pool_offset, data, pid);
        let mut done = arrival_ns;
        for (off, bytes) in now {
            let d = self
                .state
                .store_writeback(&self.shared, off, bytes, pid, arrival_ns)?;
            done = done.max(d);
        }
        Ok(done)
    }
}

impl PlaneState {
    /// Stores written-back pool bytes `data` at `pool_offset` in the host
    /// files behind them (clamped to each file's size) and charges them as
    /// NAND programs to the VM of `pid`. Returns the modeled completion.
    pub(super) fn store_writeback(
        &self,
        shared: &SharedDevice,
        pool_offset: u64,
        data: &[u8],
        pid: u32,
        arrival_ns: u64,
    ) -> Result<u64, WritebackError> {
        let mut done = arrival_ns;
        let mut pos = 0usize;
        while pos < data.len() {
            let off = pool_offset + pos as u64;
            let within = off % EXTENT_SIZE;
            let n = ((EXTENT_SIZE - within) as usize).min(data.len() - pos);
            if let Some((file, at)) = self.file_at(shared, off) {
                // Bytes past the host file's end are the zero tail of the
                // last page: writing them would grow the file.
                let size = file.metadata()?.len();
                let keep = size.saturating_sub(at).min(n as u64) as usize;
                if keep > 0 {
                    file.write_all_at(&data[pos..pos + keep], at)?;
                }
            }
            let c = shared
                .write_back_pool(arrival_ns, off, n as u64)
                .map_err(|e| WritebackError::Device(e.to_string()))?;
            if let Some(m) = self.vm_metrics(self.vm_of_pid(pid)) {
                m.record_charge(&c);
            }
            done = done.max(c.completes_at_ns);
            pos += n;
        }
        Ok(done)
    }

    fn vm_metrics(&self, vm: Option<VmId>) -> Option<Arc<VmMetrics>> {
        vm.and_then(|id| lock(&self.vms).get(id as usize).cloned())
    }

    /// The VM whose VMM process is `pid` (write-backs are usually written
    /// by the kernel on behalf of the VMM, with its tgid or 0).
    fn vm_of_pid(&self, pid: u32) -> Option<VmId> {
        lock(&self.vmm_pids)
            .iter()
            .find(|(p, _)| *p == pid && pid != 0)
            .map(|(_, v)| *v)
    }
}
