//! The DAX window: guests map the shared pool through the virtio-fs cache
//! window, backed by the residency plane (`residency::FusePoolPlane`).
//!
//! * [`DaxPlane`] (one per daemon): mounts the plane's pool file and
//!   implements its [`PoolBackend`]: a trap at pool offset X finds the file
//!   extent that owns X ([`crate::pool::Pool::owner_of`]), charges the
//!   device model at the trap's arrival and answers with the host file's
//!   bytes (zeros past EOF); a write-back goes to the host file (clamped to
//!   its size) and is charged as a device write.
//! * [`DaxSession`] (one per VM connection): the slot table of that VM's
//!   window. SETUPMAPPING → `VHOST_USER_BACKEND_SHMEM_MAP` of the pool file
//!   at the extent holding the file range; REMOVEMAPPING → `SHMEM_UNMAP`.
//!   Maps never overlap; a read-only slot upgraded to writable is unmapped,
//!   then mapped again.

use crate::fs::PassthroughFs;
use crate::metrics::VmMetrics;
use crate::placement::Tier;
use crate::pool::{FileKey, SharedDevice, EXTENT_SIZE};
use cxlfs_device_model::Op;
use residency::{
    FusePoolPlane, Miss, MissData, MissReply, PlaneOptions, PoolBackend, ResidencyPlane,
    ServeMissError, VmId, WritebackError,
};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};

/// log2 of the window's map alignment and slot size (2 MiB), advertised in
/// FUSE_INIT (`map_alignment`).
pub const MAP_ALIGNMENT_SHIFT: u16 = 21;
/// Bytes of one window slot (= one pool extent).
pub const SLOT_SIZE: u64 = EXTENT_SIZE;
/// Default size of the window reported by `GET_SHMEM_CONFIG`.
pub const DEFAULT_WINDOW_BYTES: u64 = 1 << 30;
/// `fuse_setupmapping_in.flags`: the mapping is writable.
pub const SETUPMAPPING_FLAG_WRITE: u64 = 1;
/// Most ranges one REMOVEMAPPING may carry (as the kernel's
/// `FUSE_REMOVEMAPPING_MAX_ENTRY`, a page of entries).
pub const MAX_REMOVEMAPPING: u32 = 4096 / 16;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why the DAX window could not be set up (the daemon then serves without it).
#[derive(Debug, thiserror::Error)]
pub enum StartDaxError {
    /// The mountpoint could not be created.
    #[error("cannot create the pool mountpoint {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The plane could not be mounted (no /dev/fuse, no permission, ...).
    #[error("cannot mount the residency plane")]
    Mount(#[from] residency::MountPlaneError),
    /// The window size is not a positive multiple of 2 MiB.
    #[error("DAX window size {0:#x} is not a positive multiple of 2 MiB")]
    BadWindow(u64),
    /// The prefetch filler thread could not be started.
    #[error("cannot start the pool-prefetch thread")]
    SpawnFiller(#[source] std::io::Error),
}

/// The per-VM counters the plane's traps are charged to, indexed by [`VmId`].
type VmTable = Mutex<Vec<Arc<VmMetrics>>>;

/// The daemon's [`PoolBackend`]: traps and write-backs against host files.
struct DaemonPoolBackend {
    shared: Arc<SharedDevice>,
    vms: Arc<VmTable>,
    /// The VMM pid of each VM (write-backs come with the writer's pid).
    vmm_pids: Arc<Mutex<Vec<(u32, VmId)>>>,
}

impl DaemonPoolBackend {
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

impl PoolBackend for DaemonPoolBackend {
    fn now_ns(&self) -> u64 {
        self.shared.now_ns()
    }

    fn on_miss(&self, miss: &Miss, _dst: &mut [u8]) -> Result<MissReply, ServeMissError> {
        let extent = miss.pool_offset / EXTENT_SIZE;
        let within = miss.pool_offset % EXTENT_SIZE;
        // A trap never crosses an extent (the kernel asks for one page).
        let len = u64::from(miss.len).min(EXTENT_SIZE - within) as u32;
        let owner = self.shared.pool().owner_of(extent);
        let charge = self
            .shared
            .charge_pool(miss.arrival_ns, Op::Read, miss.pool_offset, len.max(1))
            .map_err(|e| ServeMissError::Device(e.to_string()))?;
        if let Some(m) = self.vm_metrics(miss.vm) {
            m.record_charge(&charge);
            m.record_trap_latency(charge.completes_at_ns.saturating_sub(miss.arrival_ns));
        }
        let data = match owner.and_then(|o| o.file.map(|f| (f, o.chunk))) {
            Some((file, chunk)) => MissData::File {
                file,
                offset: chunk * EXTENT_SIZE + within,
            },
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
        let mut done = arrival_ns;
        let mut pos = 0usize;
        while pos < data.len() {
            let off = pool_offset + pos as u64;
            let within = off % EXTENT_SIZE;
            let n = ((EXTENT_SIZE - within) as usize).min(data.len() - pos);
            let owner = self.shared.pool().owner_of(off / EXTENT_SIZE);
            if let Some((file, chunk)) = owner.and_then(|o| o.file.map(|f| (f, o.chunk))) {
                let at = chunk * EXTENT_SIZE + within;
                // Bytes past the host file's end are the zero tail of the
                // last page: writing them would grow the file.
                let size = file.metadata()?.len();
                let keep = size.saturating_sub(at).min(n as u64) as usize;
                if keep > 0 {
                    file.write_all_at(&data[pos..pos + keep], at)?;
                }
            }
            let c = self
                .shared
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
}

/// The residency plane of the daemon and the VMs that use it.
pub struct DaxPlane {
    plane: Mutex<Option<Arc<FusePoolPlane>>>,
    shared: Arc<SharedDevice>,
    mountpoint: PathBuf,
    created_dir: bool,
    window: u64,
    vms: Arc<VmTable>,
    vmm_pids: Arc<Mutex<Vec<(u32, VmId)>>>,
    /// Every VM session's window, for the pages mapped by several VMs.
    sessions: Mutex<Vec<std::sync::Weak<DaxSession>>>,
    /// Prefetched pages pushed into the plane (no trap when first touched).
    prefetch_pushed: AtomicU64,
}

impl std::fmt::Debug for DaxPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaxPlane")
            .field("mountpoint", &self.mountpoint)
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

/// A fresh mountpoint name under `/run/cxlfsd` for this process.
pub fn default_pool_dir() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    if n == 0 {
        PathBuf::from(format!("/run/cxlfsd/pool-{pid}"))
    } else {
        PathBuf::from(format!("/run/cxlfsd/pool-{pid}-{n}"))
    }
}

impl DaxPlane {
    /// Mounts the pool (the device's whole address space) at `dir` (created
    /// if missing; `None`: [`default_pool_dir`]) and attaches the plane to
    /// the device, for windows of `window` bytes.
    pub fn start(
        dir: Option<&Path>,
        shared: Arc<SharedDevice>,
        window: u64,
    ) -> Result<Arc<Self>, StartDaxError> {
        if window == 0 || window % SLOT_SIZE != 0 {
            return Err(StartDaxError::BadWindow(window));
        }
        let mountpoint = dir.map_or_else(default_pool_dir, Path::to_path_buf);
        let created_dir = !mountpoint.exists();
        std::fs::create_dir_all(&mountpoint).map_err(|source| StartDaxError::CreateDir {
            path: mountpoint.clone(),
            source,
        })?;
        let size = shared.pool().capacity_extents() * EXTENT_SIZE;
        let vms: Arc<VmTable> = Arc::new(Mutex::new(Vec::new()));
        let vmm_pids = Arc::new(Mutex::new(Vec::new()));
        let backend = Arc::new(DaemonPoolBackend {
            shared: shared.clone(),
            vms: vms.clone(),
            vmm_pids: vmm_pids.clone(),
        });
        let plane = match FusePoolPlane::mount(&mountpoint, size, backend, PlaneOptions::default())
        {
            Ok(p) => Arc::new(p),
            Err(e) => {
                if created_dir {
                    let _ = std::fs::remove_dir(&mountpoint);
                }
                return Err(e.into());
            }
        };
        let weak: std::sync::Weak<dyn ResidencyPlane> =
            Arc::downgrade(&(plane.clone() as Arc<dyn ResidencyPlane>));
        shared.attach_plane(weak);
        let (fill_tx, fill_rx) = std::sync::mpsc::channel::<Vec<(u64, u64)>>();
        shared.attach_prefetch_filler(fill_tx);
        let dax = Arc::new(DaxPlane {
            plane: Mutex::new(Some(plane)),
            shared,
            mountpoint,
            created_dir,
            window,
            vms,
            vmm_pids,
            sessions: Mutex::new(Vec::new()),
            prefetch_pushed: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&dax);
        std::thread::Builder::new()
            .name("pool-prefetch".into())
            .spawn(move || prefetch_filler(&weak, &fill_rx))
            .map_err(StartDaxError::SpawnFiller)?;
        Ok(dax)
    }

    /// Prefetched pages pushed into the plane so far.
    pub fn prefetch_pushed(&self) -> u64 {
        self.prefetch_pushed.load(Ordering::Relaxed)
    }

    /// Whether any VM maps pool extent `extent` writable (its pages may
    /// then hold guest stores the host file does not have yet).
    fn mapped_writable(&self, extent: u64) -> bool {
        let sessions: Vec<Arc<DaxSession>> = lock(&self.sessions)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        sessions.iter().any(|s| {
            lock(&s.slots)
                .values()
                .any(|slot| slot.writable && slot.extent == extent)
        })
    }

    /// Pushes the host file's bytes of `count` pool pages from `first_page`
    /// (one extent) into the plane with NOTIFY_STORE, so a guest
    /// reaches them without a trap; waits until the kernel has them. Only
    /// pages the device holds (or DRAM-tier ones) are stored, and nothing
    /// while a VM maps the extent writable. Under the fill guard the file's
    /// bytes cannot change and no guest can store into the pages, so a
    /// store that races a trap of the same page writes what the page holds
    /// anyway. Returns the pages stored. Never call it from a plane thread.
    pub fn fill_from_file(&self, first_page: u64, count: u64) -> u64 {
        let Some(plane) = self.plane() else { return 0 };
        let page = residency::PAGE_SIZE;
        let extent = first_page * page / EXTENT_SIZE;
        if count == 0 || (first_page + count - 1) * page / EXTENT_SIZE != extent {
            return 0;
        }
        let _guard = self.shared.plane_fill_guard();
        if self.mapped_writable(extent) {
            return 0;
        }
        let Some((file, chunk)) = self
            .shared
            .pool()
            .owner_of(extent)
            .and_then(|o| o.file.map(|f| (f, o.chunk)))
        else {
            return 0;
        };
        let pool_off = first_page * page;
        let file_off = chunk * EXTENT_SIZE + pool_off % EXTENT_SIZE;
        let mut data = vec![0u8; (count * page) as usize];
        let mut got = 0usize;
        while got < data.len() {
            match file.read_at(&mut data[got..], file_off + got as u64) {
                Ok(0) => break, // zeros past the end of the file
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read file bytes to fill the plane");
                    return 0;
                }
            }
        }
        // Queue the stores under the device lock, page run by page run:
        // an eviction the device makes after this check queues its INVAL
        // behind our STORE, so the plane never keeps a page the device
        // dropped.
        let mut tickets = Vec::new();
        let mut stored = 0;
        {
            let dev = self.shared.device();
            let mut p = first_page;
            while p < first_page + count {
                let held = |p: u64| {
                    dev.is_resident(p * page) || self.shared.placement().tier(p) == Tier::Dram
                };
                if !held(p) {
                    p += 1;
                    continue;
                }
                let mut q = p + 1;
                while q < first_page + count && held(q) {
                    q += 1;
                }
                let at = ((p - first_page) * page) as usize;
                let bytes = data[at..at + ((q - p) * page) as usize].to_vec();
                match plane.fill(p * page, bytes) {
                    Ok(t) => {
                        tickets.push(t);
                        stored += q - p;
                    }
                    Err(e) => tracing::warn!(error = %e, page = p, "plane fill refused"),
                }
                p = q;
            }
        }
        for t in tickets {
            if let Err(e) = t.wait() {
                tracing::warn!(error = %e, "plane fill failed");
            }
        }
        stored
    }

    /// The residency plane (`None` after [`DaxPlane::shutdown`]).
    pub fn plane(&self) -> Option<Arc<FusePoolPlane>> {
        lock(&self.plane).clone()
    }

    /// Unmounts the plane now, whoever still holds this `DaxPlane` (it must
    /// happen before the process exits: a process that still has the pool
    /// file open when its own FUSE server threads die hangs in the kernel
    /// at exit, closing that file). Mappings of the pool that are still
    /// alive get `SIGBUS`. Idempotent.
    pub fn shutdown(&self) {
        let plane = lock(&self.plane).take();
        if let Some(p) = plane {
            if Arc::strong_count(&p) > 1 {
                tracing::warn!(
                    "the residency plane is still referenced; it unmounts when the last user goes"
                );
            }
            drop(p);
        }
    }

    /// The window size each VM gets.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// The [`VmId`] of VM `metrics.name` (assigned on first use).
    pub fn vm_id(&self, metrics: &Arc<VmMetrics>) -> VmId {
        let mut vms = lock(&self.vms);
        if let Some(i) = vms.iter().position(|v| v.name == metrics.name) {
            return i as VmId;
        }
        vms.push(metrics.clone());
        (vms.len() - 1) as VmId
    }

    /// The [`VmId`] of VM `name`, if it has one.
    pub fn find_vm_id(&self, name: &str) -> Option<VmId> {
        lock(&self.vms)
            .iter()
            .position(|v| v.name == name)
            .map(|i| i as VmId)
    }

    /// The name of VM `id`.
    pub fn vm_name(&self, id: VmId) -> Option<String> {
        lock(&self.vms).get(id as usize).map(|v| v.name.clone())
    }

    /// Plane counters (`None` once shut down).
    pub fn plane_metrics(&self) -> Option<residency::PlaneMetricsSnapshot> {
        self.plane().map(|p| p.metrics())
    }

    /// A VM's VMM process connected: its threads' traps count for it.
    pub fn register_vmm(&self, vm: VmId, pid: u32) {
        {
            let mut pids = lock(&self.vmm_pids);
            pids.retain(|(_, v)| *v != vm);
            pids.push((pid, vm));
        }
        if let Some(p) = self.plane() {
            p.register_vmm(vm, pid);
        }
    }

    /// A VM's VMM disconnected.
    pub fn unregister_vmm(&self, vm: VmId) {
        lock(&self.vmm_pids).retain(|(_, v)| *v != vm);
        if let Some(p) = self.plane() {
            p.unregister_vmm(vm);
        }
    }

    /// Tracks `session`'s window for [`DaxPlane::shared_pages`].
    pub fn register_session(&self, session: &Arc<DaxSession>) {
        let mut s = lock(&self.sessions);
        s.retain(|w| w.strong_count() > 0);
        s.push(Arc::downgrade(session));
    }

    /// Pool pages mapped by the windows of two or more VMs now.
    pub fn shared_pages(&self) -> u64 {
        let sessions: Vec<Arc<DaxSession>> = lock(&self.sessions)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        // extent -> (vm, bytes mapped from the extent's start), largest per VM.
        let mut by_extent: std::collections::HashMap<u64, Vec<(VmId, u64)>> =
            std::collections::HashMap::new();
        for s in &sessions {
            for slot in lock(&s.slots).values() {
                let vms = by_extent.entry(slot.extent).or_default();
                match vms.iter_mut().find(|(v, _)| *v == s.vm) {
                    Some((_, len)) => *len = (*len).max(slot.len),
                    None => vms.push((s.vm, slot.len)),
                }
            }
        }
        by_extent
            .values()
            .map(|vms| {
                // Pages [0, second-largest len) are mapped by >= 2 VMs.
                let mut lens: Vec<u64> = vms.iter().map(|(_, l)| *l).collect();
                lens.sort_unstable_by(|a, b| b.cmp(a));
                lens.get(1).copied().unwrap_or(0) / residency::PAGE_SIZE
            })
            .sum()
    }
}

impl Drop for DaxPlane {
    fn drop(&mut self) {
        // Unmounts (and joins the plane's threads) when the last user goes.
        self.shutdown();
        if self.created_dir {
            let _ = std::fs::remove_dir(&self.mountpoint);
        }
    }
}

/// One live window slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    key: FileKey,
    foffset: u64,
    len: u64,
    writable: bool,
    extent: u64,
}

/// `fuse_setupmapping_in`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupMapping {
    /// File handle.
    pub fh: u64,
    /// File offset.
    pub foffset: u64,
    /// Bytes.
    pub len: u64,
    /// `SETUPMAPPING_FLAG_*`.
    pub flags: u64,
    /// Window offset.
    pub moffset: u64,
}

/// The DAX window of one VM connection.
pub struct DaxSession {
    dax: Arc<DaxPlane>,
    vm: VmId,
    metrics: Arc<VmMetrics>,
    backend: Mutex<Option<Backend>>,
    slots: Mutex<BTreeMap<u64, Slot>>,
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
        fs: &PassthroughFs,
        nodeid: u64,
        m: SetupMapping,
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
        if m.len == 0 || m.len > SLOT_SIZE || m.len % residency::PAGE_SIZE != 0 {
            return Err(bad("bad length"));
        }
        if !m
            .moffset
            .checked_add(m.len)
            .is_some_and(|end| end <= window)
        {
            return Err(bad("outside the window"));
        }
        let inode = if m.fh == u64::MAX {
            fs.inode(nodeid)?
        } else {
            fs.handle(m.fh)?.inode.clone()
        };
        let size = rustix::fs::fstat(&inode.fd)?.st_size as u64;
        let limit = size.div_ceil(SLOT_SIZE) * SLOT_SIZE;
        if !m.foffset.checked_add(m.len).is_some_and(|end| end <= limit) {
            return Err(bad("past the end of the file"));
        }
        let writable = m.flags & SETUPMAPPING_FLAG_WRITE != 0;
        let key = inode.key;
        let chunk = m.foffset / SLOT_SIZE;
        // A writable slot lets the guest store into pool pages: no plane
        // fill of them may be in flight (see `DaxPlane::fill_from_file`).
        let _fill_guard = writable.then(|| self.dax.shared.plane_fill_guard());
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
        let known = self.dax.shared.pool().dax_file(key);
        let file = match known {
            Some(f) => f,
            None => Arc::new(fs.open_for_pool(&inode)?),
        };
        let extent = self
            .dax
            .shared_pool_extent(key, chunk, &file)
            .ok_or_else(|| {
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
    pub fn remove_mappings(&self, ranges: &[(u64, u64)]) -> Result<(), Errno> {
        let backend = self.backend()?;
        let mut slots = lock(&self.slots);
        let mut result = Ok(());
        for &(moffset, len) in ranges {
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

impl DaxPlane {
    /// The pool extent of `(key, chunk)` for a window slot (see
    /// [`crate::pool::Pool::dax_extent`]).
    fn shared_pool_extent(&self, key: FileKey, chunk: u64, file: &Arc<File>) -> Option<u64> {
        self.shared.pool().dax_extent(key, chunk, file)
    }
}

/// The `pool-prefetch` thread: pushes the pages the device's prefetcher
/// filled into the plane once each is ready (its modeled NAND read done).
/// Ends when the plane is shut down or the daemon drops it.
fn prefetch_filler(
    dax: &std::sync::Weak<DaxPlane>,
    rx: &std::sync::mpsc::Receiver<Vec<(u64, u64)>>,
) {
    use std::sync::mpsc::RecvTimeoutError;
    loop {
        let mut batch = match rx.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) => match dax.upgrade() {
                Some(d) if d.plane().is_some() => continue,
                _ => return,
            },
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let Some(d) = dax.upgrade() else { return };
        if d.plane().is_none() {
            return;
        }
        batch.sort_unstable_by_key(|&(page, ready)| (ready, page));
        let mut i = 0;
        while i < batch.len() {
            let (first, ready) = batch[i];
            residency::pace::wait_until(|| d.shared.now_ns(), ready);
            // A run of consecutive pages of one extent, all ready by now.
            let now = d.shared.now_ns();
            let extent = first * residency::PAGE_SIZE / EXTENT_SIZE;
            let mut j = i + 1;
            while j < batch.len()
                && batch[j].0 == batch[j - 1].0 + 1
                && batch[j].1 <= now
                && batch[j].0 * residency::PAGE_SIZE / EXTENT_SIZE == extent
            {
                j += 1;
            }
            let stored = d.fill_from_file(first, (j - i) as u64);
            d.prefetch_pushed.fetch_add(stored, Ordering::Relaxed);
            i = j;
        }
    }
}
