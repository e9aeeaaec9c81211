//! The daemon's side of the residency plane: what a trap and a write-back
//! do (charge the device, move the host file's bytes).

use super::PlaneState;
use crate::device::{SharedDevice, EXTENT_SIZE};
use crate::ids::VmId;
use crate::metrics::VmMetrics;
use crate::sync::lock;
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
        // The charge and the owner of the page's extent: one transaction.
        let (charge, owner) = self
            .shared
            .charge_trap(miss.arrival_ns, Op::Read, miss.pool_offset, len.max(1))
            .map_err(|e| ServeMissError::Device(e.to_string()))?;
        let at = self.state.file_of(owner, miss.pool_offset);
        if let Some(m) = self.state.vm_metrics(miss.vm) {
            m.record_charge(&charge);
            if charge.sampled_pages > 0 {
                m.sampled_accesses
                    .fetch_add(charge.sampled_pages, std::sync::atomic::Ordering::Relaxed);
            }
            let modeled = charge.completes_at_ns.saturating_sub(miss.arrival_ns);
            m.record_trap_latency(modeled);
            m.trap_modeled_ns
                .fetch_add(modeled, std::sync::atomic::Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::super::discards::Discards;
    use super::*;
    use crate::device::PAGE;
    use crate::ids::FileKey;
    use cxlfs_device_model::{Device, DeviceConfig};
    use std::os::unix::fs::FileExt;

    const P: u64 = PAGE;

    #[test]
    fn split_holds_the_parts_inside_discarding_ranges() {
        let mut d = Discards::default();
        let a = d.begin(vec![(P, 3 * P)]);
        let b = d.begin(vec![(5 * P, 6 * P), (7 * P, 8 * P)]);
        let data: Vec<u8> = (0..10 * P).map(|i| (i / P) as u8).collect();
        let now = d.split(0, &data, 42);
        let stored: Vec<(u64, usize, u8)> = now
            .iter()
            .map(|&(off, bytes)| (off, bytes.len(), bytes[0]))
            .collect();
        assert_eq!(
            stored,
            [
                (0, P as usize, 0),
                (3 * P, 2 * P as usize, 3),
                (6 * P, P as usize, 6),
                (8 * P, 2 * P as usize, 8)
            ]
        );
        let (ranges_b, held_b) = d.end(b);
        assert_eq!(ranges_b, [(5 * P, 6 * P), (7 * P, 8 * P)]);
        let spans: Vec<(u64, usize, u8)> = held_b
            .iter()
            .map(|w| (w.pool_offset, w.data.len(), w.data[0]))
            .collect();
        assert_eq!(spans, [(5 * P, P as usize, 5), (7 * P, P as usize, 7)]);
        assert!(held_b.iter().all(|w| w.pid == 42));
        // `b` ended: its pages are stored again; `a` still holds its own.
        let now = d.split(4 * P, &data[..4 * P as usize], 0);
        assert_eq!(now.len(), 1);
        assert_eq!((now[0].0, now[0].1.len()), (4 * P, 4 * P as usize));
        let now = d.split(2 * P, &data[..2 * P as usize], 0);
        assert_eq!((now[0].0, now[0].1.len()), (3 * P, P as usize));
        let (_, held_a) = d.end(a);
        assert_eq!(held_a.len(), 2, "two write-backs met `a`");
        assert_eq!(held_a[0].data.len(), 2 * P as usize);
        assert_eq!(held_a[1].data.len(), P as usize);
        assert!(d.end(a).1.is_empty(), "ending twice holds nothing");
        assert!(
            d.split(0, &data, 0).len() == 1,
            "nothing discarding: one piece"
        );
    }

    /// A backend over a real device whose pool extent 0.. holds `file`'s
    /// chunk 0, mapped into a window.
    fn backend(file: &std::fs::File, key: FileKey) -> (DaemonPoolBackend, u64) {
        let cfg = DeviceConfig::default()
            .with_overrides(&["cache.size_bytes=16MiB"])
            .unwrap();
        let shared = Arc::new(SharedDevice::new(Device::new(cfg).unwrap()));
        let state = Arc::new(PlaneState::default());
        let extent = shared
            .transact(crate::device::Publish::Hand, |p, _| p.own_extent(key, 0))
            .0
            .unwrap();
        {
            let mut w = lock(&state.windows);
            w.files.insert(key, Arc::new(file.try_clone().unwrap()));
            w.extents.insert(extent);
        }
        (DaemonPoolBackend { shared, state }, extent * EXTENT_SIZE)
    }

    fn pages(file: &std::fs::File, n: u64) -> Vec<u8> {
        let mut b = vec![0u8; (n * P) as usize];
        file.read_exact_at(&mut b, 0).unwrap();
        b.chunks(P as usize).map(|p| p[0]).collect()
    }

    #[test]
    fn writebacks_of_discarding_pages_are_neither_stored_nor_charged_until_restored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0xaa; 4 * P as usize]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let key = FileKey { dev: 1, ino: 7 };
        let (b, base) = backend(&file, key);
        let programs = || b.shared.stats().nand.host_programs;
        // Pages 1 and 2 are being discarded (a punch), page 3 by another
        // discard at the same time.
        let punch = lock(&b.state.discards).begin(vec![(base + P, base + 3 * P)]);
        let other = lock(&b.state.discards).begin(vec![(base + 3 * P, base + 4 * P)]);
        // The kernel writes back all four pages (a periodic sync over them).
        b.on_writeback(base, &[0xbb; 4 * P as usize], 0, 0).unwrap();
        assert_eq!(pages(&file, 4), [0xbb, 0xaa, 0xaa, 0xaa]);
        assert_eq!(programs(), 1, "only the stored page is charged");
        // The punch went through: what it held is gone.
        assert_eq!(lock(&b.state.discards).end(punch).1.len(), 1);
        // The other failed: its held page is stored and charged after all.
        for w in lock(&b.state.discards).end(other).1 {
            b.state
                .store_writeback(&b.shared, w.pool_offset, &w.data, w.pid, 0)
                .unwrap();
        }
        assert_eq!(pages(&file, 4), [0xbb, 0xaa, 0xaa, 0xbb]);
        assert_eq!(programs(), 2);
        // No discard left: write-backs are stored as ever.
        b.on_writeback(base + P, &[0xcc; P as usize], 0, 0).unwrap();
        assert_eq!(pages(&file, 4), [0xbb, 0xcc, 0xaa, 0xbb]);
        assert_eq!(programs(), 3);
    }

    #[test]
    fn concurrent_discards_and_writebacks_keep_to_their_own_pages() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let n = 64u64;
        std::fs::write(&path, vec![0u8; (n * P) as usize]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let (b, base) = backend(&file, FileKey { dev: 1, ino: 8 });
        let b = Arc::new(b);
        // Even pages are discarded (one discard per page, by 4 threads),
        // each written back with 0xff while discarding; other pages are
        // written back meanwhile with their number + 1.
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for round in 0..20 {
                        for p in (0..n).filter(|p| p % 8 == t * 2) {
                            let at = base + p * P;
                            let id = lock(&b.state.discards).begin(vec![(at, at + P)]);
                            let other = (p + 1 + round) % n;
                            let page = vec![(other + 1) as u8; P as usize];
                            b.on_writeback(base + other * P, &page, 0, 0).unwrap();
                            let page = vec![0xff; P as usize];
                            b.on_writeback(at, &page, 0, 0).unwrap();
                            // Its own page's write-backs only (another
                            // thread's may have met this discard too).
                            let held = lock(&b.state.discards).end(id).1;
                            assert!(held.iter().any(|w| w.data[0] == 0xff));
                            assert!(held.iter().all(|w| w.pool_offset == at));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // No discarded page ever reached the file.
        assert!(pages(&file, n).iter().all(|&v| v != 0xff));
        assert!(lock(&b.state.discards).is_empty());
    }
}
