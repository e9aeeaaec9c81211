//! A vhost-user virtio-fs front-end for tests and benchmarks, no VM:
//! memfd-backed guest memory, a split virtqueue whose descriptors the test
//! writes itself, FUSE requests in guest memory; optionally the DAX window
//! (SHMEM_MAP / SHMEM_UNMAP served by really mmapping the pool file into a
//! window the front-end owns, as QEMU does).
#![allow(clippy::unwrap_used, dead_code)]

use cxlfs_device_model::{Device, DeviceConfig};
use cxlfsd::abi::{self, opcode, Cursor, InHeader, OutHeader};
use cxlfsd::server::ServerOptions;
use cxlfsd::{
    CacheMode, DaemonState, Features, QueueOptions, SessionOptions, SharedDevice, VmSpec,
};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserMMap, VhostUserProtocolFeatures};
use vhost::vhost_user::{
    Frontend, FrontendReqHandler, HandlerResult, VhostUserFrontend, VhostUserFrontendReqHandler,
};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

/// Guest RAM size.
pub const MEM_SIZE: u64 = 4 << 20;
const QSIZE: u16 = 16;
const DESC: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const REQ: u64 = 0x10_0000;
/// Where replies go in guest memory.
pub const REP: u64 = 0x20_0000;
const SLOT: u64 = 0x2_0000;
const REQUEST_QUEUE: usize = 1;
/// The NAND read time of [`start_daemon`]'s device.
pub const NAND_READ_NS: u64 = 300_000;
/// The DAX window size of [`DaxDaemon`].
pub const WINDOW: u64 = 16 << 20;

/// The front-end's DAX window: a PROT_NONE reservation that SHMEM_MAP fills
/// with `MAP_SHARED | MAP_FIXED` mappings of the fd it is sent, as QEMU does.
pub struct Window {
    base: usize,
    size: u64,
    /// shm_offset → (len, writable).
    maps: Mutex<BTreeMap<u64, (u64, bool)>>,
}

impl Window {
    pub fn new(size: u64) -> Arc<Window> {
        // SAFETY: a fresh anonymous reservation; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Arc::new(Window {
            base: p as usize,
            size,
            maps: Mutex::new(BTreeMap::new()),
        })
    }

    fn reserve(&self, off: u64, len: u64) -> bool {
        // SAFETY: the range lies inside our own reservation.
        let p = unsafe {
            libc::mmap(
                (self.base + off as usize) as *mut libc::c_void,
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        p != libc::MAP_FAILED
    }

    /// Copies `len` bytes of the window at `off` (faulting them in).
    pub fn read(&self, off: u64, len: usize) -> Vec<u8> {
        assert!(off + len as u64 <= self.size);
        let mut out = vec![0u8; len];
        // SAFETY: the caller maps the range first (else SIGSEGV, as a guest).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.base + off as usize) as *const u8,
                out.as_mut_ptr(),
                len,
            )
        };
        out
    }

    pub fn write(&self, off: u64, data: &[u8]) {
        assert!(off + data.len() as u64 <= self.size);
        // SAFETY: the caller maps the range writable first.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.base + off as usize) as *mut u8,
                data.len(),
            )
        };
    }

    pub fn live(&self) -> Vec<(u64, u64, bool)> {
        self.maps
            .lock()
            .unwrap()
            .iter()
            .map(|(&o, &(l, w))| (o, l, w))
            .collect()
    }
}

impl VhostUserFrontendReqHandler for Window {
    fn shmem_map(&self, req: &VhostUserMMap, fd: &dyn AsRawFd) -> HandlerResult<u64> {
        let (off, len, fd_off, flags) = (req.shm_offset, req.len, req.fd_offset, req.flags);
        let mut maps = self.maps.lock().unwrap();
        let overlaps = maps
            .iter()
            .any(|(&o, &(l, _))| o < off + len && off < o + l);
        if req.shmid != 0 || off + len > self.size || overlaps {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let writable = flags & 1 != 0;
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: the range lies inside our own reservation.
        let p = unsafe {
            libc::mmap(
                (self.base + off as usize) as *mut libc::c_void,
                len as usize,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                fd_off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        maps.insert(off, (len, writable));
        Ok(0)
    }

    fn shmem_unmap(&self, req: &VhostUserMMap) -> HandlerResult<u64> {
        let (off, len) = (req.shm_offset, req.len);
        let mut maps = self.maps.lock().unwrap();
        match maps.get(&off) {
            Some(&(l, _)) if l == len => {}
            _ => return Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
        }
        assert!(self.reserve(off, len));
        maps.remove(&off);
        Ok(0)
    }
}

/// A front-end with one request queue set up.
pub struct Guest {
    /// The vhost-user connection (for requests this module does not wrap).
    pub frontend: Frontend,
    mem: GuestMemoryMmap,
    kick: EventFd,
    _call: EventFd,
    avail_idx: u16,
    used_seen: u16,
    next_desc: u16,
    unique: u64,
    /// Busy-poll the used ring instead of sleeping between polls (benchmarks).
    pub spin: bool,
}

impl Guest {
    /// Connects and sets up the request queue (no DAX window).
    pub fn connect(socket: &Path) -> Guest {
        Self::connect_with(socket, None)
    }

    /// Connects; with `window`, also negotiates the DAX window and hands
    /// the back-end channel over, served by `window` on its own thread.
    pub fn connect_with(socket: &Path, window: Option<Arc<Window>>) -> Guest {
        Self::connect_inner(socket, window, true).0
    }

    /// Connects with the DAX window negotiated and a back-end channel that
    /// nobody reads (a hung VMM): every SHMEM_MAP / SHMEM_UNMAP waits for an
    /// ack that never comes. The handler keeps the channel open; drop it to
    /// close it.
    pub fn connect_unanswered(socket: &Path) -> (Guest, FrontendReqHandler<Window>) {
        let (g, h) = Self::connect_inner(socket, Some(Window::new(WINDOW)), false);
        (g, h.unwrap())
    }

    fn connect_inner(
        socket: &Path,
        window: Option<Arc<Window>>,
        serve: bool,
    ) -> (Guest, Option<FrontendReqHandler<Window>>) {
        let mut unserved = None;
        let mut frontend = Frontend::connect(socket, 2).unwrap();
        let features = frontend.get_features().unwrap();
        frontend.set_owner().unwrap();
        frontend.set_features(features).unwrap();
        let proto = frontend.get_protocol_features().unwrap();
        assert!(proto.contains(VhostUserProtocolFeatures::MQ));
        let dax = VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::BACKEND_SEND_FD
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::SHMEM;
        if let Some(window) = window {
            assert!(
                proto.contains(dax),
                "DAX protocol features offered: {proto:?}"
            );
            frontend
                .set_protocol_features(proto & (VhostUserProtocolFeatures::MQ | dax))
                .unwrap();
            let mut handler = FrontendReqHandler::new(window).unwrap();
            handler.set_reply_ack_flag(true);
            // SAFETY: the handler owns the fd and outlives this borrow.
            let tx = unsafe { std::os::fd::BorrowedFd::borrow_raw(handler.get_tx_raw_fd()) };
            frontend.set_backend_request_fd(&tx).unwrap();
            if serve {
                std::thread::spawn(move || while handler.handle_request().is_ok() {});
            } else {
                unserved = Some(handler);
            }
        } else {
            frontend
                .set_protocol_features(proto & VhostUserProtocolFeatures::MQ)
                .unwrap();
        }
        assert_eq!(frontend.get_queue_num().unwrap(), 2);

        let fd = rustix::fs::memfd_create("guest-ram", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let file = File::from(fd);
        file.set_len(MEM_SIZE).unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files(&[(
            GuestAddress(0),
            MEM_SIZE as usize,
            Some(FileOffset::new(file, 0)),
        )])
        .unwrap();
        let va = mem.get_host_address(GuestAddress(0)).unwrap() as u64;
        let region = mem.find_region(GuestAddress(0)).unwrap();
        frontend
            .set_mem_table(&[VhostUserMemoryRegionInfo::from_guest_region(region).unwrap()])
            .unwrap();
        frontend.set_vring_num(REQUEST_QUEUE, QSIZE).unwrap();
        frontend
            .set_vring_addr(
                REQUEST_QUEUE,
                &VringConfigData {
                    queue_max_size: QSIZE,
                    queue_size: QSIZE,
                    flags: 0,
                    desc_table_addr: va + DESC,
                    used_ring_addr: va + USED,
                    avail_ring_addr: va + AVAIL,
                    log_addr: None,
                },
            )
            .unwrap();
        frontend.set_vring_base(REQUEST_QUEUE, 0).unwrap();
        let kick = EventFd::new(0).unwrap();
        let call = EventFd::new(0).unwrap();
        frontend.set_vring_call(REQUEST_QUEUE, &call).unwrap();
        frontend.set_vring_kick(REQUEST_QUEUE, &kick).unwrap();
        frontend.set_vring_enable(REQUEST_QUEUE, true).unwrap();
        let guest = Guest {
            frontend,
            mem,
            kick,
            _call: call,
            avail_idx: 0,
            used_seen: 0,
            next_desc: 0,
            unique: 1,
            spin: false,
        };
        (guest, unserved)
    }

    /// Queues a chain of `(gpa, len, device-writable)` and kicks; returns the head.
    pub fn submit(&mut self, descs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, writable)) in descs.iter().enumerate() {
            let idx = (head + i as u16) % QSIZE;
            let next = (idx + 1) % QSIZE;
            let mut flags = 0u16;
            if i + 1 < descs.len() {
                flags |= 1; // NEXT
            }
            if writable {
                flags |= 2; // WRITE
            }
            let base = GuestAddress(DESC + 16 * u64::from(idx));
            self.mem.write_obj(addr, base).unwrap();
            self.mem.write_obj(len, GuestAddress(base.0 + 8)).unwrap();
            self.mem
                .write_obj(flags, GuestAddress(base.0 + 12))
                .unwrap();
            self.mem.write_obj(next, GuestAddress(base.0 + 14)).unwrap();
        }
        self.next_desc = (head + descs.len() as u16) % QSIZE;
        let slot = AVAIL + 4 + 2 * u64::from(self.avail_idx % QSIZE);
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
        self.kick.write(1).unwrap();
        head
    }

    /// Writes `bytes` into guest memory at `gpa`.
    pub fn write_mem(&self, gpa: u64, bytes: &[u8]) {
        self.mem.write_slice(bytes, GuestAddress(gpa)).unwrap();
    }

    /// Reads `len` bytes of guest memory at `gpa`.
    pub fn read_mem(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.mem.read_slice(&mut out, GuestAddress(gpa)).unwrap();
        out
    }

    /// Waits for the next used element: `(id, len)`.
    pub fn wait_used(&mut self, timeout: Duration) -> Option<(u32, u32)> {
        let start = Instant::now();
        loop {
            let idx: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
            if idx != self.used_seen {
                let e = USED + 4 + 8 * u64::from(self.used_seen % QSIZE);
                let id: u32 = self.mem.read_obj(GuestAddress(e)).unwrap();
                let len: u32 = self.mem.read_obj(GuestAddress(e + 4)).unwrap();
                self.used_seen = self.used_seen.wrapping_add(1);
                return Some((id, len));
            }
            if start.elapsed() > timeout {
                return None;
            }
            if self.spin {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    pub fn request_bytes(&mut self, op: u32, nodeid: u64, args: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        InHeader {
            len: (abi::IN_HEADER_LEN + args.len()) as u32,
            opcode: op,
            unique: self.unique,
            nodeid,
            ..Default::default()
        }
        .encode(&mut b);
        self.unique += 1;
        b.extend_from_slice(args);
        b
    }

    /// Sends raw request bytes; returns (out header, payload, elapsed).
    pub fn raw(&mut self, req: &[u8], reply_cap: u32) -> (OutHeader, Vec<u8>, Duration) {
        let t0 = Instant::now();
        let (head, rep_at) = self.send(req, reply_cap);
        let (id, len) = self.wait_used(Duration::from_secs(10)).expect("no reply");
        let elapsed = t0.elapsed();
        assert_eq!(id, u32::from(head));
        let (h, payload) = self.reply_at(rep_at, len);
        (h, payload, elapsed)
    }

    /// Queues a request without waiting: returns its head and where its
    /// reply will be (for [`Guest::reply_at`] once `wait_used` gives it).
    pub fn send(&mut self, req: &[u8], reply_cap: u32) -> (u16, u64) {
        let slot = u64::from(self.next_desc);
        let req_at = REQ + slot * SLOT / 2;
        let rep_at = REP + slot * SLOT;
        self.mem.write_slice(req, GuestAddress(req_at)).unwrap();
        let head = self.submit(&[(req_at, req.len() as u32, false), (rep_at, reply_cap, true)]);
        (head, rep_at)
    }

    /// The reply of `len` bytes at `rep_at`: (out header, payload).
    pub fn reply_at(&self, rep_at: u64, len: u32) -> (OutHeader, Vec<u8>) {
        assert!(len as usize >= abi::OUT_HEADER_LEN, "reply of {len} bytes");
        let mut out = vec![0u8; len as usize];
        self.mem.read_slice(&mut out, GuestAddress(rep_at)).unwrap();
        let h = OutHeader::parse(&mut Cursor::new(&out)).unwrap();
        assert_eq!(h.len, len);
        (h, out[abi::OUT_HEADER_LEN..].to_vec())
    }

    /// Sends a request that has no reply (FORGET); waits until the
    /// back-end has used its descriptor.
    pub fn submit_only(&mut self, req: &[u8]) {
        let slot = u64::from(self.next_desc);
        let req_at = REQ + slot * SLOT / 2;
        self.mem.write_slice(req, GuestAddress(req_at)).unwrap();
        self.submit(&[(req_at, req.len() as u32, false)]);
        self.wait_used(Duration::from_secs(10)).expect("not used");
    }

    pub fn call(&mut self, op: u32, nodeid: u64, args: &[u8]) -> (OutHeader, Vec<u8>, Duration) {
        let req = self.request_bytes(op, nodeid, args);
        self.raw(&req, 64 * 1024)
    }

    pub fn init(&mut self) {
        let mut a = Vec::new();
        for v in [7u32, 31, 4096, 0] {
            a.extend_from_slice(&v.to_le_bytes());
        }
        a.extend_from_slice(&[0u8; 48]);
        let (h, out, _) = self.call(opcode::INIT, 0, &a);
        assert_eq!(h.error, 0);
        assert_eq!(u32::from_le_bytes(out[0..4].try_into().unwrap()), 7);
    }

    pub fn lookup(&mut self, name: &str) -> u64 {
        let mut a = name.as_bytes().to_vec();
        a.push(0);
        let (h, out, _) = self.call(opcode::LOOKUP, abi::ROOT_ID, &a);
        assert_eq!(h.error, 0, "lookup {name}");
        u64::from_le_bytes(out[0..8].try_into().unwrap())
    }

    pub fn open(&mut self, nodeid: u64) -> u64 {
        let (h, out, _) = self.call(opcode::OPEN, nodeid, &[0u8; 8]);
        assert_eq!(h.error, 0);
        u64::from_le_bytes(out[0..8].try_into().unwrap())
    }

    pub fn read(&mut self, nodeid: u64, fh: u64, off: u64, size: u32) -> (Vec<u8>, Duration) {
        let mut a = Vec::new();
        a.extend_from_slice(&fh.to_le_bytes());
        a.extend_from_slice(&off.to_le_bytes());
        a.extend_from_slice(&size.to_le_bytes());
        a.extend_from_slice(&[0u8; 20]);
        let (h, out, t) = self.call(opcode::READ, nodeid, &a);
        assert_eq!(h.error, 0);
        (out, t)
    }
}

/// A daemon with VMs `a` and `b` (4 MiB device cache, NAND reads of
/// [`NAND_READ_NS`]).
pub fn start_daemon(
    share: &Path,
    sockets: &Path,
) -> (Arc<DaemonState>, Vec<std::thread::JoinHandle<()>>) {
    start_daemon_with(share, sockets, &["a", "b"], &[], None, |_| {})
}

/// A daemon with `vms`, device overrides `extra` on top of
/// [`start_daemon`]'s, the DAX window on when `dax_pool_dir` is given (a
/// [`WINDOW`]-sized window; off if the plane cannot be mounted), and
/// `before_vms` run before the VMs' sockets open.
pub fn start_daemon_with(
    share: &Path,
    sockets: &Path,
    vms: &[&str],
    extra: &[&str],
    dax_pool_dir: Option<&Path>,
    before_vms: impl FnOnce(&DaemonState),
) -> (Arc<DaemonState>, Vec<std::thread::JoinHandle<()>>) {
    let mut overrides = vec![
        "cache.size_bytes=4MiB".to_string(),
        format!("nand.read_ns={NAND_READ_NS}"),
    ];
    overrides.extend(extra.iter().map(|s| s.to_string()));
    let cfg = DeviceConfig::default().with_overrides(&overrides).unwrap();
    let shared = Arc::new(SharedDevice::new(Device::new(cfg).unwrap()));
    let (state, _) = DaemonState::start(
        shared,
        SessionOptions {
            shared_dir: share.to_path_buf(),
            max_open_files: cxlfsd::DEFAULT_MAX_OPEN_FILES,
            cache: CacheMode::Never,
            queues: QueueOptions {
                request_queues: 1,
                queue_size: 256,
                ..QueueOptions::default()
            },
            server: ServerOptions {
                max_readahead: None,
            },
            guest_ids: Default::default(),
        },
        Features {
            dax: dax_pool_dir.map(|d| (Some(d), WINDOW)),
            control: None,
            memory: None,
        },
    )
    .unwrap();
    before_vms(&state);
    let threads = vms
        .iter()
        .map(|n| {
            state
                .spawn_vm(VmSpec {
                    name: n.to_string(),
                    socket: sockets.join(format!("{n}.sock")),
                    dir: None,
                })
                .unwrap()
        })
        .collect();
    (state, threads)
}

/// A daemon with the DAX window enabled (the residency plane mounted in a
/// pool directory of its own). Dropping it unmounts the plane, panicking or
/// not: a process that exits with the pool still mounted by itself hangs in
/// the kernel.
pub struct DaxDaemon {
    pub state: Arc<DaemonState>,
    threads: Vec<JoinHandle<()>>,
    sockets: tempfile::TempDir,
    _pool_dir: tempfile::TempDir,
}

/// A missing prerequisite: under `CI=true` the test fails (a green CI run
/// means it ran); elsewhere a SKIP line and the test passes.
pub fn skip_or_fail(why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{why}; CI=true, so this test may not be skipped (run it as root with /dev/fuse available)");
    }
    eprintln!("SKIP: {why}");
}

impl DaxDaemon {
    /// [`start_daemon_with`] (sockets in a directory of its own) with the
    /// DAX window on, `before_dax` run before the VMs' sockets open; `None`,
    /// with a SKIP line and the daemon shut down, where the residency plane
    /// cannot be mounted (no /dev/fuse or no permission); a panic instead
    /// under `CI=true` ([`skip_or_fail`]).
    pub fn start(
        share: &Path,
        vms: &[&str],
        extra: &[&str],
        before_dax: impl FnOnce(&DaemonState),
    ) -> Option<DaxDaemon> {
        let sockets = tempfile::tempdir().unwrap();
        let pool_dir = tempfile::tempdir().unwrap();
        let (state, threads) = start_daemon_with(
            share,
            sockets.path(),
            vms,
            extra,
            Some(pool_dir.path()),
            before_dax,
        );
        let dax_on = state.dax().is_some();
        let mut daemon = DaxDaemon {
            state,
            threads,
            sockets,
            _pool_dir: pool_dir,
        };
        if !dax_on {
            daemon.shutdown();
            skip_or_fail(
                "the residency plane cannot be mounted here (no /dev/fuse or no permission)",
            );
            return None;
        }
        Some(daemon)
    }

    /// A front-end for `vm` with a [`WINDOW`]-sized DAX window of its own.
    pub fn connect(&self, vm: &str) -> (Arc<Window>, Guest) {
        let window = Window::new(WINDOW);
        let socket = self.sockets.path().join(format!("{vm}.sock"));
        let guest = Guest::connect_with(&socket, Some(window.clone()));
        (window, guest)
    }

    /// A front-end for `vm` whose back-end channel is never answered
    /// ([`Guest::connect_unanswered`]).
    pub fn connect_unanswered(&self, vm: &str) -> (Guest, FrontendReqHandler<Window>) {
        let socket = self.sockets.path().join(format!("{vm}.sock"));
        Guest::connect_unanswered(&socket)
    }

    /// Stops the VMs' threads and waits for them (the plane stays mounted
    /// until the drop).
    pub fn shutdown(&mut self) {
        self.state.request_shutdown();
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

impl Drop for DaxDaemon {
    fn drop(&mut self) {
        self.state.stop_dax();
    }
}
