//! One VM's DAX window: its slot table, mapped through the front-end.
//!
//! SETUPMAPPING → `VHOST_USER_BACKEND_SHMEM_MAP` of the pool file at the
//! extent holding the file range; REMOVEMAPPING → `SHMEM_UNMAP`. Maps never
//! overlap; a read-only slot upgraded to writable is unmapped, then mapped
//! again.

use super::{lock, DaxPlane, MAP_ALIGNMENT_SHIFT, SLOT_SIZE};
use crate::abi::{setupmapping_flags, RemoveMappingOne, SetupMappingIn};
use crate::backend::CacheWindow;
use crate::device::{EXTENT_SIZE, PAGE};
use crate::ids::{FileKey, VmId};
use crate::metrics::VmMetrics;
use crate::server::{DaxMapper, FileSystem};
use crate::timing::Coherence;
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};

/// One live window slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    key: FileKey,
    foffset: u64,
    pub(super) len: u64,
    pub(super) writable: bool,
    pub(super) extent: u64,
}

/// The DAX window of one VM connection.
pub struct DaxSession {
    dax: Arc<DaxPlane>,
    pub(super) vm: VmId,
    metrics: Arc<VmMetrics>,
    backend: Mutex<Option<Backend>>,
    pub(super) slots: Mutex<BTreeMap<u64, Slot>>,
}

impl std::fmt::Debug for DaxSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaxSession")
            .field("vm", &self.metrics.name)
            .field("slots", &lock(&self.slots).len())
            .finish_non_exhaustive()
    }
}

impl DaxSession {
    /// A session of VM `metrics.name` over the daemon's plane.
    pub fn new(dax: Arc<DaxPlane>, metrics: Arc<VmMetrics>) -> Self {
        let vm = dax.vm_id(&metrics);
        DaxSession {
            dax,
            vm,
            metrics,
            backend: Mutex::new(None),
            slots: Mutex::new(BTreeMap::new()),
        }
    }

    /// The daemon's plane.
    pub fn plane(&self) -> &Arc<DaxPlane> {
        &self.dax
    }

    /// This VM's id in the plane.
    pub fn vm(&self) -> VmId {
        self.vm
    }

    /// The front-end handed over its back-end request channel.
    pub fn set_backend(&self, backend: Backend) {
        *lock(&self.backend) = Some(backend);
    }

    /// Whether the front-end can take SHMEM_MAP requests (it gave us the
    /// back-end channel).
    pub fn window_offered(&self) -> bool {
        lock(&self.backend).is_some()
    }

    /// Live slots.
    pub fn slot_count(&self) -> usize {
        lock(&self.slots).len()
    }

    fn backend(&self) -> Result<Backend, Errno> {
        lock(&self.backend).clone().ok_or(Errno::NOSYS)
    }

    /// FUSE_SETUPMAPPING of node `nodeid`. The kernel sends `fh` = -1 and
    /// names the file by its node id; a real `fh` is also accepted.
    pub fn setup_mapping(
        &self,
        fs: &dyn FileSystem,
        nodeid: u64,
        m: &SetupMappingIn,
    ) -> Result<(), Errno> {
        let window = self.dax.window;
        let plane = self.dax.plane().ok_or(Errno::NOSYS)?;
        let backend = self.backend()?;
        let bad = |why: &str| {
            tracing::debug!(vm = %self.metrics.name, ?m, why, "SETUPMAPPING refused");
            Errno::INVAL
        };
        if m.moffset % SLOT_SIZE != 0 || m.foffset % SLOT_SIZE != 0 {
            return Err(bad("misaligned"));
        }
        if m.len == 0 || m.len > SLOT_SIZE || m.len % PAGE != 0 {
            return Err(bad("bad length"));
        }
        if !m
            .moffset
            .checked_add(m.len)
            .is_some_and(|end| end <= window)
        {
            return Err(bad("outside the window"));
        }
        let fh = (m.fh != u64::MAX).then_some(m.fh);
        let file = fs.host_file(nodeid, fh, false)?;
        if file.is_dir {
            return Err(bad("not a regular file"));
        }
        let limit = file.size.div_ceil(SLOT_SIZE).saturating_mul(SLOT_SIZE);
        if !m.foffset.checked_add(m.len).is_some_and(|end| end <= limit) {
            return Err(bad("past the end of the file"));
        }
        let writable = m.flags & setupmapping_flags::WRITE != 0;
        let key = file.key;
        let chunk = m.foffset / SLOT_SIZE;
        // A writable slot lets the guest store into pool pages: no plane
        // fill of them may be in flight (see `DaxPlane::fill_from_file`).
        let _fill_guard = writable.then(|| self.dax.change_guard());
        let mut slots = lock(&self.slots);
        if let Some(old) = slots.get(&m.moffset).copied() {
            if (old.key, old.foffset, old.len) != (key, m.foffset, m.len) {
                return Err(bad("overlaps a live slot"));
            }
            // The same range again (e.g. read-only upgraded to writable):
            // unmap, then map.
            self.unmap(&backend, m.moffset, old.len)?;
            slots.remove(&m.moffset);
        }
        let open = || {
            fs.host_file(nodeid, fh, true)?
                .pool_file
                .ok_or(Errno::INVAL)
        };
        let extent = self.dax.window_extent(key, chunk, open)?.ok_or_else(|| {
            tracing::warn!(vm = %self.metrics.name, "pool full: no extent of its own for a DAX slot");
            Errno::NOMEM
        })?;
        let req = VhostUserMMap {
            shmid: 0,
            padding: [0; 7],
            fd_offset: extent * EXTENT_SIZE,
            shm_offset: m.moffset,
            len: m.len,
            flags: if writable {
                VhostUserMMapFlags::WRITABLE.bits()
            } else {
                0
            },
        };
        let target = plane.map_target();
        if let Err(e) = backend.shmem_map(&req, &*target.file) {
            tracing::warn!(vm = %self.metrics.name, error = %e, moffset = m.moffset, "SHMEM_MAP failed");
            return Err(Errno::IO);
        }
        slots.insert(
            m.moffset,
            Slot {
                key,
                foffset: m.foffset,
                len: m.len,
                writable,
                extent,
            },
        );
        self.metrics.dax_maps.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(vm = %self.metrics.name, moffset = m.moffset, foffset = m.foffset, extent, writable, "DAX slot mapped");
        Ok(())
    }

    fn unmap(&self, backend: &Backend, moffset: u64, len: u64) -> Result<(), Errno> {
        let req = VhostUserMMap {
            shmid: 0,
            padding: [0; 7],
            fd_offset: 0,
            shm_offset: moffset,
            len,
            flags: 0,
        };
        match backend.shmem_unmap(&req) {
            Ok(_) => {
                self.metrics.dax_unmaps.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(vm = %self.metrics.name, error = %e, moffset, len, "SHMEM_UNMAP failed");
                Err(Errno::IO)
            }
        }
    }

    /// FUSE_REMOVEMAPPING of `(moffset, len)` ranges: each must be a live
    /// slot exactly. All are tried; the first error is returned.
    pub fn remove_mappings(&self, ranges: &[RemoveMappingOne]) -> Result<(), Errno> {
        let backend = self.backend()?;
        let mut slots = lock(&self.slots);
        let mut result = Ok(());
        for r in ranges {
            let (moffset, len) = (r.moffset, r.len);
            let r = match slots.get(&moffset) {
                Some(s) if s.len == len => self.unmap(&backend, moffset, len).map(|()| {
                    slots.remove(&moffset);
                }),
                _ => {
                    tracing::debug!(vm = %self.metrics.name, moffset, len, "REMOVEMAPPING of no slot");
                    Err(Errno::INVAL)
                }
            };
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// The guest's FUSE session ended (DESTROY) or restarted (INIT): asks
    /// the front-end to unmap every live slot (best effort), then forgets them.
    pub fn unmap_all(&self) {
        let slots = std::mem::take(&mut *lock(&self.slots));
        if slots.is_empty() {
            return;
        }
        if let Ok(backend) = self.backend() {
            for (moffset, s) in slots {
                let _ = self.unmap(&backend, moffset, s.len);
            }
        }
    }

    /// The front-end dropped its maps (device reset, disconnect): forget
    /// the slots without a message.
    pub fn forget_all(&self) {
        lock(&self.slots).clear();
    }

    /// Writable slots (for tests and logs).
    pub fn writable_slots(&self) -> usize {
        lock(&self.slots).values().filter(|s| s.writable).count()
    }
}

impl DaxMapper for DaxSession {
    fn window_offered(&self) -> bool {
        DaxSession::window_offered(self)
    }

    fn map_alignment_shift(&self) -> u16 {
        MAP_ALIGNMENT_SHIFT
    }

    fn setup_mapping(
        &self,
        fs: &dyn FileSystem,
        nodeid: u64,
        m: &SetupMappingIn,
    ) -> Result<(), Errno> {
        DaxSession::setup_mapping(self, fs, nodeid, m)
    }

    fn remove_mappings(&self, ranges: &[RemoveMappingOne]) -> Result<(), Errno> {
        DaxSession::remove_mappings(self, ranges)
    }

    fn unmap_all(&self) {
        DaxSession::unmap_all(self);
    }
}

impl CacheWindow for DaxSession {
    fn set_backend(&self, backend: Backend) {
        DaxSession::set_backend(self, backend);
    }

    fn window_bytes(&self) -> u64 {
        self.dax.window()
    }

    fn forget_all(&self) {
        DaxSession::forget_all(self);
    }
}
