//! [`FusePoolPlane`]: the pool as one file on a host FUSE mount served here.
//!
//! The mount holds one regular file, `pool`, of a fixed size (its size and
//! mtime never change). A VMM maps it `MAP_SHARED`; the host kernel turns a
//! touch of a page that is not in its page cache into a `FUSE_READ`, which
//! [`PoolBackend::on_miss`] times; the reply is written when the modeled
//! access completes and the page becomes an ordinary page-cache page, mapped
//! into every VM that touches it from then on, with no further trap.
//!
//! Threads:
//! * request threads ([`PlaneOptions::readers`], and in
//!   [`ReaderMode::Block`] one more than the VMs registered, so that one
//!   VM's misses stuck in slow host reads leave a thread for the others)
//!   read `/dev/fuse`, answer each request, and spin for replies due within
//!   [`pace::INLINE_SPIN_NS`]; replies due later go to
//! * the pacer, a deadline heap that sleeps, spins the last
//!   [`pace::SPIN_NS`], then writes the reply;
//! * the notifier, the only thread that writes `NOTIFY_STORE` /
//!   `NOTIFY_INVAL_INODE`: a notification may wait for a page whose
//!   `FUSE_READ` is still unanswered, or for a write-back (`FUSE_WRITE`) it
//!   triggers, so it must never be sent by a thread that answers requests —
//!   the kernel would deadlock, uninterruptibly.
//!
//! * with [`Compensation::Auto`], the calibrator: it measures the trap
//!   path's own cost (fault → request, reply → mapped) on the mount's
//!   second file, `calibration` (one page, answered at once, never seen by
//!   the backend), at start and a few times a second, and keeps the floor
//!   that miss replies are released ahead of their modeled completion by
//!   ([`crate::pace::Floor`]; DESIGN.md, "Latency compensation").
//!
//! Rules (DESIGN.md, "Rules learned the hard way"): the pool is opened with
//! `FOPEN_KEEP_CACHE` (else a second `open()` empties its page cache);
//! `max_readahead` ≤ 4096 so every page miss is its own `FUSE_READ`
//! (prefetch is the model's decision, done with `NOTIFY_STORE`);
//! `FUSE_EXPLICIT_INVAL_DATA` so only the plane drops pages; no thread of
//! the plane ever touches the pool mapping.

use crate::metrics::PlaneMetrics;
use crate::pace::{self, Compensation, INLINE_SPIN_NS};
use crate::vm::{VmId, VmResolver};
use crate::{
    MapTarget, Miss, MissData, NotifyTicket, PlaneMetricsSnapshot, PoolBackend, ResidencyPlane,
    SendNotifyError, PAGE_SIZE,
};
use fuse_abi::{
    self as abi, encode_attr_out, encode_dirent, encode_open_out, encode_write_out, fattr,
    init_flags, opcode, Attr, Cursor, EntryOut, InHeader, InitIn, InitOut, Kstatfs, OutHeader,
    ReadIn, SetattrIn, WriteIn,
};
use std::cell::Cell;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The pool file's node id.
pub const POOL_NODEID: u64 = 2;
/// The pool file's name in the mount.
pub const POOL_NAME: &str = "pool";
/// The calibration file's node id (see [`CALIB_NAME`]).
pub const CALIB_NODEID: u64 = 3;
/// The mount's second file: one page of zeros, answered at once without the
/// backend, that the calibrator drops and touches to measure the trap
/// path's own cost. Owner-read-only, not listed (found by name); a VMM
/// never maps it, and the pool file (its size, its pages, its counters)
/// does not change.
pub const CALIB_NAME: &str = "calibration";
/// Probes at start (after [`CALIB_WARMUP`] discarded ones).
const CALIB_START_PROBES: usize = 64;
/// Probes discarded at start (cold caches, first thread wake-ups).
const CALIB_WARMUP: usize = 8;
/// Probes every [`CALIB_PERIOD`] afterwards: sixteen a second, each a
/// trap's worth of work on two threads and 20 µs of spinning (well under
/// 0.1 % of a core), so the estimate follows the host's load within
/// seconds.
const CALIB_PERIODIC_PROBES: usize = 4;
/// How often the periodic probes run.
const CALIB_PERIOD: Duration = Duration::from_millis(250);
/// How long a probe runs before it touches the page.
const CALIB_RUN_NS: u64 = 20_000;
/// How long a mount waits for the first estimate.
const CALIB_START_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a mount waits for the kernel's INIT before it gives up on the
/// ring (the INIT is sent at mount, so it normally comes at once).
const INIT_TIMEOUT: Duration = Duration::from_secs(5);
/// `max_readahead` advertised: one page, so every miss is its own READ.
pub const MAX_READAHEAD: u32 = 4096;
/// Largest WRITE (write-back) accepted.
pub const MAX_WRITE: u32 = 128 * 1024;
/// Attribute / entry validity: the pool never changes, cache it forever.
const VALID_SECS: u64 = 365 * 24 * 3600;

thread_local! {
    static REQUEST_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread answers FUSE requests for a plane (it must
/// never wait for a notification).
pub fn on_request_thread() -> bool {
    REQUEST_THREAD.with(Cell::get)
}

/// How request threads wait for requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderMode {
    /// Sleep in `read(2)` until a request comes (no CPU when idle; a miss
    /// pays the wake-up of the request thread).
    Block,
    /// Poll `/dev/fuse` without sleeping (one core per request thread, busy
    /// even when idle; saves the wake-up on every miss).
    Spin,
}

/// How requests travel between the host kernel and the plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// FUSE over io_uring when the host kernel offers it
    /// (`/sys/module/fuse/parameters/enable_uring`), else `/dev/fuse`.
    #[default]
    Auto,
    /// `read(2)` / `write(2)` on `/dev/fuse` only.
    DevFuse,
    /// FUSE over io_uring, or no mount.
    IoUring,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Auto => "auto",
            Transport::DevFuse => "dev-fuse",
            Transport::IoUring => "io-uring",
        })
    }
}

/// Why a [`Transport`] could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plane transport `{0}`: expected auto, dev-fuse or io-uring")]
pub struct ParseTransportError(pub String);

impl std::str::FromStr for Transport {
    type Err = ParseTransportError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Transport::Auto),
            "dev-fuse" | "devfuse" => Ok(Transport::DevFuse),
            "io-uring" | "io_uring" | "uring" => Ok(Transport::IoUring),
            _ => Err(ParseTransportError(s.to_string())),
        }
    }
}

/// The transport a mounted plane runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveTransport {
    /// `/dev/fuse` request threads.
    DevFuse,
    /// FUSE over io_uring.
    IoUring {
        /// The kernel's queues (one per possible CPU).
        queues: usize,
        /// Worker threads (each owns the entries of some queues).
        workers: usize,
        /// Workers poll their completion queues.
        poll: bool,
    },
}

/// Threads of a split plane that take the helper's forwarded misses.
const SPLIT_RECEIVERS: usize = 2;

/// Most request threads a plane grows to as VMs register.
pub const MAX_READERS: usize = 64;

/// How a plane is set up.
#[derive(Debug, Clone, Copy)]
pub struct PlaneOptions {
    /// Request threads at the start (at least 1). In [`ReaderMode::Block`]
    /// the plane adds one per VM registered beyond that (up to
    /// [`MAX_READERS`]): a reader does the host read of its miss itself.
    pub readers: usize,
    /// How they wait. With FUSE over io_uring, [`ReaderMode::Spin`] makes
    /// one ring worker poll its completion queue (instead of one sleeping
    /// worker per CPU queue).
    pub mode: ReaderMode,
    /// `/dev/fuse` or FUSE over io_uring (split planes: `/dev/fuse`).
    pub transport: Transport,
    /// Refuse the first `READ` of every page (the kernel's readahead on a
    /// `VM_HUGEPAGE` mapping: QEMU's guest RAM) and serve the fault's own
    /// read of the refused folio, so that a trap reads only the faulting
    /// folio (see `readahead.rs`).
    pub refuse_readahead: bool,
    /// Detach the mount once the pool file is open (`umount2(MNT_DETACH)`):
    /// the plane lives on through its descriptors, and nobody — no host
    /// user, no other process of the same user — can reach the pool by
    /// path any more. VMMs get it as a descriptor over vhost-user.
    pub detach: bool,
    /// Release each miss reply ahead of its modeled completion by the trap
    /// path's own cost (see [`Compensation`]; `Auto` measures it with a
    /// calibration thread).
    pub compensation: Compensation,
}

impl Default for PlaneOptions {
    fn default() -> Self {
        PlaneOptions {
            readers: 2,
            mode: ReaderMode::Block,
            transport: Transport::Auto,
            refuse_readahead: false,
            detach: false,
            compensation: Compensation::Off,
        }
    }
}

/// Why a plane could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountPlaneError {
    /// The pool size is zero or not a multiple of the page size.
    #[error("pool size {0:#x} is zero or not a multiple of 4096")]
    BadSize(u64),
    /// `/dev/fuse` cannot be opened (no FUSE, or no permission).
    #[error("cannot open /dev/fuse")]
    OpenDevice(#[source] io::Error),
    /// `mount(2)` failed.
    #[error("cannot mount the pool at {path}")]
    Mount {
        /// The mountpoint.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A thread could not be started.
    #[error("cannot start a plane thread")]
    Spawn(#[source] io::Error),
    /// The pool file cannot be opened on the new mount.
    #[error("cannot open the pool file {path}")]
    OpenPool {
        /// The pool file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The helper process of a split plane could not be started.
    #[error("cannot start the plane's helper process")]
    Helper(#[from] crate::helper_link::SpawnHelperError),
    /// FUSE over io_uring was required but the host kernel does not offer
    /// it (no `enable_uring`, or a kernel before 6.14).
    #[error("FUSE over io_uring was asked for, but {0}")]
    NoUring(&'static str),
    /// FUSE over io_uring was required and could not be started.
    #[error("cannot start FUSE over io_uring")]
    Ring(#[source] crate::uring::StartRingError),
    /// The mount could not be detached once the pool was open.
    #[error("cannot detach the pool mount at {path}")]
    Detach {
        /// The mountpoint.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// The request-answering part of a plane, independent of the transport
/// (tests feed it bytes).
pub(crate) struct Server {
    pub(crate) backend: Arc<dyn PoolBackend>,
    pub(crate) size: u64,
    pub(crate) metrics: PlaneMetrics,
    pub(crate) vms: VmResolver,
    mtime: u64,
    /// `(uid, gid)` the pool belongs to (the daemon's).
    owner: (u32, u32),
    /// Set on shutdown: a GETATTR of the root from `stop_tid` ends the
    /// request thread that answers it.
    stop: AtomicBool,
    stop_tid: AtomicU32,
    /// Request threads still running.
    alive: AtomicUsize,
    /// Pages refused and not served since (`None`: readahead is served).
    readahead: Option<crate::readahead::ReadaheadRefusals>,
    /// The last calibration READ's stamps.
    calib: CalibStamps,
    /// INIT offers FUSE over io_uring.
    offer_uring: bool,
    /// The kernel offered it too (INIT answered with it).
    uring_granted: AtomicBool,
    /// INIT has been answered (set just before its reply is written).
    init_answered: AtomicBool,
}

/// What the last `READ` of the calibration file saw (backend clock), and
/// how long recent misses were held.
#[derive(Debug, Default)]
struct CalibStamps {
    /// Recent misses' holds (release − arrival, ns), smoothed (7/8 old):
    /// a probe's reply is held as long, because the path's cost depends on
    /// it (a toucher that sleeps longer wakes from a deeper idle state).
    hold_ns: AtomicU64,
    /// When the request reached the plane.
    request_ns: AtomicU64,
    /// When its reply was about to be written.
    reply_ns: AtomicU64,
    /// Calibration READs answered (stored after the stamps).
    reads: AtomicU64,
}

/// What to do with a request once handled.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// No reply (FORGET, INTERRUPT, undecodable header).
    None,
    /// Write `out` now.
    Reply,
    /// Write `out` at this time (backend clock).
    ReplyAt(u64),
    /// Write `out` now, then end this request thread.
    ReplyAndExit,
}

/// Starts a reply: a placeholder header that [`finish`] fills in.
fn reply_header(out: &mut Vec<u8>) {
    out.clear();
    OutHeader::default().encode(out);
}

/// Fills in the header of a successful reply whose payload is already in
/// `out` (after the placeholder of [`reply_header`]). A reply too long for
/// the header's `u32` length (or without its placeholder) is an `EINVAL`.
fn finish(out: &mut [u8], unique: u64) -> Result<(), i32> {
    let payload = out.len().saturating_sub(abi::OUT_HEADER_LEN);
    let header = OutHeader::for_payload(unique, 0, payload).map_err(|_| libc::EINVAL)?;
    if header.write_over(out) {
        Ok(())
    } else {
        Err(libc::EINVAL)
    }
}

fn error_reply(out: &mut Vec<u8>, unique: u64, errno: i32) -> Outcome {
    out.clear();
    OutHeader::error_only(unique, errno).encode(out);
    Outcome::Reply
}

impl Server {
    pub(crate) fn new(backend: Arc<dyn PoolBackend>, size: u64) -> Self {
        let mtime = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Server {
            backend,
            size,
            metrics: PlaneMetrics::new(size),
            vms: VmResolver::new(),
            mtime,
            owner: owner(),
            stop: AtomicBool::new(false),
            stop_tid: AtomicU32::new(0),
            alive: AtomicUsize::new(0),
            readahead: None,
            calib: CalibStamps::default(),
            offer_uring: false,
            uring_granted: AtomicBool::new(false),
            init_answered: AtomicBool::new(false),
        }
    }

    /// Releases miss replies ahead of their modeled completion as `mode`
    /// says (see [`PlaneOptions::compensation`]).
    pub(crate) fn compensating(mut self, mode: Compensation) -> Self {
        self.metrics = PlaneMetrics::new(self.size).with_compensation(mode);
        self
    }

    /// Offers FUSE over io_uring in INIT.
    pub(crate) fn offering_uring(mut self) -> Self {
        self.offer_uring = true;
        self
    }

    /// Refuses readahead from now on (see [`PlaneOptions::refuse_readahead`]).
    pub(crate) fn refusing_readahead(mut self) -> Self {
        self.readahead = Some(crate::readahead::ReadaheadRefusals::new(self.size));
        self
    }

    fn attr(&self, nodeid: u64) -> Attr {
        // Owner-only: the pool holds every VM's file pages. The mount is
        // not `allow_other` and checks these bits (`default_permissions`),
        // so only the daemon's own user can open it; VMMs get the file as
        // a descriptor over vhost-user.
        let (mode, size, nlink) = match nodeid {
            abi::ROOT_ID => (libc::S_IFDIR | 0o700, 0, 2),
            CALIB_NODEID => (libc::S_IFREG | 0o400, PAGE_SIZE, 1),
            _ => (libc::S_IFREG | 0o600, self.size, 1),
        };
        Attr {
            ino: nodeid,
            size,
            blocks: size / 512,
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
            mode,
            nlink,
            uid: self.owner.0,
            gid: self.owner.1,
            blksize: PAGE_SIZE as u32,
            ..Attr::default()
        }
    }

    fn known(nodeid: u64) -> bool {
        nodeid == abi::ROOT_ID || nodeid == POOL_NODEID || nodeid == CALIB_NODEID
    }

    /// Answers one request (`req`: what `read(2)` returned) into `out`.
    /// Never panics, whatever the bytes.
    pub(crate) fn handle(&self, req: &[u8], arrival_ns: u64, out: &mut Vec<u8>) -> Outcome {
        let mut c = Cursor::new(req);
        let Ok(h) = InHeader::parse(&mut c) else {
            tracing::warn!(len = req.len(), "undecodable FUSE request header");
            return Outcome::None;
        };
        if h.len as usize != req.len() {
            tracing::warn!(
                header = h.len,
                read = req.len(),
                "FUSE request length mismatch"
            );
            return error_reply(out, h.unique, libc::EINVAL);
        }
        match self.dispatch(&h, &mut c, arrival_ns, out) {
            Ok(o) => o,
            Err(errno) => error_reply(out, h.unique, errno),
        }
    }

    fn dispatch(
        &self,
        h: &InHeader,
        args: &mut Cursor<'_>,
        arrival_ns: u64,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, i32> {
        let inval = |_| libc::EINVAL;
        reply_header(out);
        match h.opcode {
            opcode::INIT => {
                let init = InitIn::parse(args).map_err(inval)?;
                if init.major != abi::KERNEL_VERSION {
                    // Answer with our major only; the kernel retries or gives up.
                    InitOut {
                        major: abi::KERNEL_VERSION,
                        minor: abi::KERNEL_MINOR_VERSION,
                        ..InitOut::default()
                    }
                    .encode(out);
                } else {
                    let mut want = init_flags::BIG_WRITES
                        | init_flags::MAX_PAGES
                        | init_flags::EXPLICIT_INVAL_DATA;
                    if self.offer_uring && init.flags & init_flags::OVER_IO_URING != 0 {
                        // flags2 is read only with INIT_EXT.
                        want |= init_flags::OVER_IO_URING | init_flags::INIT_EXT;
                        self.uring_granted.store(true, Ordering::Release);
                    }
                    let mut reply = InitOut {
                        major: abi::KERNEL_VERSION,
                        minor: abi::KERNEL_MINOR_VERSION,
                        max_readahead: init.max_readahead.min(MAX_READAHEAD),
                        max_background: 64,
                        congestion_threshold: 48,
                        max_write: MAX_WRITE,
                        time_gran: 1,
                        max_pages: (MAX_WRITE / PAGE_SIZE as u32) as u16,
                        map_alignment: 0,
                        ..InitOut::default()
                    };
                    reply.set_flags64(init.flags & want);
                    reply.encode(out);
                    self.init_answered.store(true, Ordering::Release);
                }
            }
            opcode::LOOKUP => {
                let name = args.name().map_err(inval)?;
                if h.nodeid != abi::ROOT_ID {
                    return Err(libc::ENOTDIR);
                }
                let nodeid = if name == POOL_NAME.as_bytes() {
                    POOL_NODEID
                } else if name == CALIB_NAME.as_bytes() {
                    CALIB_NODEID
                } else {
                    return Err(libc::ENOENT);
                };
                EntryOut {
                    nodeid,
                    generation: 1,
                    entry_valid: VALID_SECS,
                    attr_valid: VALID_SECS,
                    attr: self.attr(nodeid),
                    ..EntryOut::default()
                }
                .encode(out);
            }
            opcode::FORGET | opcode::BATCH_FORGET | opcode::INTERRUPT => return Ok(Outcome::None),
            opcode::GETATTR => {
                if !Self::known(h.nodeid) {
                    return Err(libc::ENOENT);
                }
                encode_attr_out(VALID_SECS, 0, &self.attr(h.nodeid), out);
                if h.nodeid == abi::ROOT_ID
                    && self.stop.load(Ordering::Acquire)
                    && h.pid == self.stop_tid.load(Ordering::Acquire)
                {
                    finish(out, h.unique)?;
                    return Ok(Outcome::ReplyAndExit);
                }
            }
            opcode::SETATTR => {
                let a: SetattrIn = args.read().map_err(inval)?;
                if !Self::known(h.nodeid) {
                    return Err(libc::ENOENT);
                }
                let size_change = a.valid & fattr::SIZE != 0 && a.size != self.attr(h.nodeid).size;
                if size_change || a.valid & (fattr::MODE | fattr::UID | fattr::GID) != 0 {
                    return Err(libc::EPERM);
                }
                // Times are ignored: the pool's mtime never changes.
                encode_attr_out(VALID_SECS, 0, &self.attr(h.nodeid), out);
            }
            opcode::OPEN => match h.nodeid {
                POOL_NODEID | CALIB_NODEID => encode_open_out(0, abi::fopen::KEEP_CACHE, out),
                abi::ROOT_ID => return Err(libc::EISDIR),
                _ => return Err(libc::ENOENT),
            },
            opcode::OPENDIR => match h.nodeid {
                abi::ROOT_ID => encode_open_out(0, abi::fopen::CACHE_DIR, out),
                POOL_NODEID | CALIB_NODEID => return Err(libc::ENOTDIR),
                _ => return Err(libc::ENOENT),
            },
            opcode::READDIR => {
                let r: ReadIn = args.read().map_err(inval)?;
                if h.nodeid != abi::ROOT_ID {
                    return Err(libc::ENOTDIR);
                }
                // The calibration file is not listed: it is looked up by
                // name, by the plane itself only.
                let entries: [(u64, u32, &[u8]); 3] = [
                    (abi::ROOT_ID, libc::DT_DIR.into(), b"."),
                    (abi::ROOT_ID, libc::DT_DIR.into(), b".."),
                    (POOL_NODEID, libc::DT_REG.into(), POOL_NAME.as_bytes()),
                ];
                let limit = abi::OUT_HEADER_LEN + r.size as usize;
                for (i, (ino, typ, name)) in entries.iter().enumerate().skip(r.offset as usize) {
                    if out.len() + abi::dirent_size(name.len()) > limit {
                        break;
                    }
                    encode_dirent(*ino, i as u64 + 1, *typ, name, out);
                }
            }
            // ENOSYS makes the kernel stop sending FLUSH (`no_flush`): a
            // close() then never waits on this server (see exit_guard.rs).
            opcode::FLUSH => return Err(libc::ENOSYS),
            opcode::RELEASE
            | opcode::RELEASEDIR
            | opcode::FSYNC
            | opcode::FSYNCDIR
            | opcode::ACCESS
            | opcode::DESTROY => {}
            opcode::STATFS => Kstatfs {
                blocks: self.size / PAGE_SIZE,
                files: 2,
                bsize: PAGE_SIZE as u32,
                namelen: 255,
                frsize: PAGE_SIZE as u32,
                ..Kstatfs::default()
            }
            .encode(out),
            opcode::READ => return self.read(h, args, arrival_ns, out),
            opcode::WRITE => return self.write(h, args, arrival_ns, out),
            _ => return Err(libc::ENOSYS),
        }
        finish(out, h.unique)?;
        Ok(Outcome::Reply)
    }

    fn read(
        &self,
        h: &InHeader,
        args: &mut Cursor<'_>,
        arrival_ns: u64,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, i32> {
        let r: ReadIn = args.read().map_err(|_| libc::EINVAL)?;
        match h.nodeid {
            POOL_NODEID => {}
            CALIB_NODEID => return self.calibration_read(h, &r, arrival_ns, out),
            abi::ROOT_ID => return Err(libc::EISDIR),
            _ => return Err(libc::ENOENT),
        }
        let len = u64::from(r.size).min(self.size.saturating_sub(r.offset)) as usize;
        out.resize(abi::OUT_HEADER_LEN + len, 0);
        if len == 0 {
            finish(out, h.unique)?;
            return Ok(Outcome::Reply);
        }
        if self
            .readahead
            .as_ref()
            .is_some_and(|g| g.refuse(r.offset, len as u64))
        {
            self.metrics.readahead_refused();
            return Err(libc::EIO);
        }
        let vm = self.vms.resolve(h.pid);
        let miss = Miss {
            pool_offset: r.offset,
            len: len as u32,
            pid: h.pid,
            vm,
            arrival_ns,
        };
        let dst = &mut out[abi::OUT_HEADER_LEN..];
        let reply = match self.backend.on_miss(&miss, dst) {
            Ok(reply) => reply,
            Err(e) => {
                tracing::warn!(offset = r.offset, len, error = %e, "pool miss failed");
                self.metrics.trap_error();
                return Err(libc::EIO);
            }
        };
        match reply.data {
            MissData::InPlace { len: n } => dst[n.min(len)..].fill(0),
            MissData::Bytes(b) => {
                let n = b.len().min(len);
                dst[..n].copy_from_slice(&b[..n]);
                dst[n..].fill(0);
            }
            MissData::Zeros => dst.fill(0),
            MissData::File { file, offset } => {
                let mut done = 0;
                while done < len {
                    match file.read_at(&mut dst[done..], offset + done as u64) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            tracing::warn!(offset = r.offset, error = %e, "reading pool data failed");
                            self.metrics.trap_error();
                            return Err(e.raw_os_error().unwrap_or(libc::EIO));
                        }
                    }
                }
                dst[done..].fill(0);
            }
        }
        self.metrics.trap(vm, r.offset, len as u64);
        finish(out, h.unique)?;
        // Ahead of the modeled completion by the trap path's own cost
        // (the deadline itself with compensation off).
        let release = self
            .metrics
            .floor
            .release_at(arrival_ns, reply.completes_at_ns);
        if self.metrics.floor.mode() == Compensation::Auto {
            let hold = release.saturating_sub(arrival_ns);
            let old = self.calib.hold_ns.load(Ordering::Relaxed);
            let new = (old / 8).saturating_mul(7).saturating_add(hold / 8);
            self.calib.hold_ns.store(new, Ordering::Relaxed);
        }
        Ok(Outcome::ReplyAt(release))
    }

    /// A `READ` of the calibration file: zeros, never charged, never
    /// counted as a trap, stamped for the calibrator, and held as long as
    /// recent misses were (at once when they were not held).
    fn calibration_read(
        &self,
        h: &InHeader,
        r: &ReadIn,
        arrival_ns: u64,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, i32> {
        let len = u64::from(r.size).min(PAGE_SIZE.saturating_sub(r.offset)) as usize;
        out.resize(abi::OUT_HEADER_LEN + len, 0);
        out[abi::OUT_HEADER_LEN..].fill(0);
        finish(out, h.unique)?;
        let hold = self.calib.hold_ns.load(Ordering::Relaxed);
        let due = arrival_ns.saturating_add(hold);
        let now = self.backend.now_ns();
        // A held reply is written when due (the pacing spins for it).
        let held = hold > 0 && due > now;
        self.calib.request_ns.store(arrival_ns, Ordering::Relaxed);
        self.calib
            .reply_ns
            .store(if held { due } else { now }, Ordering::Relaxed);
        self.calib.reads.fetch_add(1, Ordering::Release);
        Ok(if held {
            Outcome::ReplyAt(due)
        } else {
            Outcome::Reply
        })
    }

    fn write(
        &self,
        h: &InHeader,
        args: &mut Cursor<'_>,
        arrival_ns: u64,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, i32> {
        let (w, data) = WriteIn::parse_with_data(args).map_err(|_| libc::EINVAL)?;
        if h.nodeid != POOL_NODEID {
            return Err(libc::EBADF);
        }
        if !matches!(w.offset.checked_add(data.len() as u64), Some(e) if e <= self.size) {
            return Err(libc::EFBIG);
        }
        let done = match self.backend.on_writeback(w.offset, data, h.pid, arrival_ns) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(offset = w.offset, len = data.len(), error = %e, "pool write-back failed");
                return Err(libc::EIO);
            }
        };
        self.metrics.writeback(data.len() as u64);
        encode_write_out(w.size, out);
        finish(out, h.unique)?;
        Ok(Outcome::ReplyAt(done))
    }
}

impl crate::uring::RingServer for Server {
    fn now_ns(&self) -> u64 {
        self.backend.now_ns()
    }

    fn answer(&self, request: &[u8], arrival_ns: u64, out: &mut Vec<u8>) -> crate::uring::Due {
        use crate::uring::Due;
        self.metrics.ring_request();
        match self.handle(request, arrival_ns, out) {
            // A stop GETATTR is for `/dev/fuse` readers; a ring worker
            // just answers it.
            Outcome::Reply | Outcome::ReplyAndExit => Due::Now,
            Outcome::ReplyAt(t) => Due::At(t),
            // FORGET and INTERRUPT never come through the ring; anything
            // else without a reply still needs one to free its entry.
            Outcome::None => {
                let unique = InHeader::parse(&mut Cursor::new(request)).map_or(0, |h| h.unique);
                error_reply(out, unique, libc::EIO);
                Due::Now
            }
        }
    }

    fn enter_worker(&self) {
        REQUEST_THREAD.with(|c| c.set(true));
    }
}

/// A reply held until its modeled completion.
struct Held {
    deadline_ns: u64,
    reply: Vec<u8>,
}

impl pace::Deadline for Held {
    fn deadline_ns(&self) -> u64 {
        self.deadline_ns
    }
}

enum NoticeKind {
    Store {
        offset: u64,
        data: Vec<u8>,
    },
    Inval {
        offset: u64,
        len: u64,
    },
    /// Drop the calibration file's page (and its mappings).
    InvalCalib,
}

struct Notice {
    kind: NoticeKind,
    done: SyncSender<Result<Duration, io::Error>>,
}

/// Writes one whole message to `/dev/fuse`; `ENOENT` (the request was
/// interrupted and is gone) is not an error.
pub(crate) fn write_reply(dev: &File, reply: &[u8]) {
    match (&*dev).write(reply) {
        Ok(n) if n == reply.len() => {}
        Ok(n) => tracing::warn!(n, len = reply.len(), "short FUSE reply write"),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => tracing::warn!(error = %e, "cannot write a FUSE reply"),
    }
}

struct Threads {
    readers: std::sync::Mutex<Vec<JoinHandle<()>>>,
    pacer: Option<JoinHandle<()>>,
    notifier: Option<JoinHandle<()>>,
}

/// What it takes to start one more request thread (gone at shutdown).
struct ReaderSpawner {
    server: Arc<Server>,
    dev: Arc<File>,
    pacer: Sender<Held>,
    mode: ReaderMode,
    /// With FUSE over io_uring: readers poll `/dev/fuse` and this eventfd,
    /// which ends them (nothing else reaches a reader once the ring takes
    /// the requests).
    wake: Option<Arc<File>>,
    /// Threads to keep at least.
    base: usize,
    /// VMs ever registered.
    vms: std::collections::HashSet<VmId>,
}

impl ReaderSpawner {
    fn spawn(&self, i: usize) -> Result<JoinHandle<()>, MountPlaneError> {
        let (s, d, tx) = (self.server.clone(), self.dev.clone(), self.pacer.clone());
        let mode = self.mode;
        let wake = self.wake.clone();
        self.server.alive.fetch_add(1, Ordering::AcqRel);
        thread::Builder::new()
            .name(format!("pool-req{i}"))
            .spawn(move || reader(&s, &d, tx, mode, wake.as_deref()))
            .map_err(|e| {
                self.server.alive.fetch_sub(1, Ordering::AcqRel);
                MountPlaneError::Spawn(e)
            })
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The mount and its threads; dropping it unmounts and joins them.
struct Mounted {
    server: Arc<Server>,
    /// Keeps `/dev/fuse` open until the threads are gone (closing it aborts
    /// the connection).
    _dev: Arc<File>,
    mountpoint: PathBuf,
    mode: ReaderMode,
    notify_tx: Option<Sender<Notice>>,
    threads: Threads,
    spawner: std::sync::Mutex<Option<ReaderSpawner>>,
    /// The mount's root (`O_PATH`): reaches the connection after a lazy
    /// unmount, to wake request threads at shutdown.
    root: Option<File>,
    mounted: bool,
    /// Aborts the connection if this process dies without unmounting;
    /// dropped last, after a clean unmount.
    _exit_guard: Option<crate::exit_guard::ExitGuard>,
    /// Split planes: the helper process that reads the requests.
    helper: Option<crate::helper_link::Helper>,
    /// Compensation `auto`: the calibration thread and the way to stop it.
    calibrator: Option<(Sender<()>, JoinHandle<()>)>,
    /// FUSE over io_uring: the eventfd that ends the `/dev/fuse` readers.
    wake: Option<Arc<File>>,
    /// FUSE over io_uring: the ring workers. Last, so that their buffers
    /// are freed only after `/dev/fuse` is closed.
    ring: Option<std::sync::Mutex<crate::uring::RingSet>>,
}

/// The residency plane over a FUSE pool file. See the module docs.
pub struct FusePoolPlane {
    target: MapTarget,
    m: Mounted,
}

impl std::fmt::Debug for FusePoolPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusePoolPlane")
            .field("mountpoint", &self.m.mountpoint)
            .field("size", &self.target.size)
            .finish_non_exhaustive()
    }
}

/// The daemon's effective uid and gid: the pool's only user.
fn owner() -> (u32, u32) {
    // SAFETY: geteuid/getegid have no preconditions and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

impl FusePoolPlane {
    /// Mounts a pool of `size` bytes at `mountpoint` (an existing directory)
    /// served by `backend`. Needs `CAP_SYS_ADMIN` and `/dev/fuse`.
    pub fn mount(
        mountpoint: &Path,
        size: u64,
        backend: Arc<dyn PoolBackend>,
        options: PlaneOptions,
    ) -> Result<Self, MountPlaneError> {
        match Self::start(mountpoint, size, backend.clone(), options, None) {
            // The kernel granted the ring but it could not be started: that
            // connection would hold every request, so it was closed; a
            // `/dev/fuse` mount takes its place.
            Err(MountPlaneError::Ring(e)) if options.transport == Transport::Auto => {
                tracing::warn!(error = %e, "FUSE over io_uring did not start; the pool is mounted on /dev/fuse");
                let options = PlaneOptions {
                    transport: Transport::DevFuse,
                    ..options
                };
                Self::start(mountpoint, size, backend, options, None)
            }
            r => r,
        }
    }

    /// Mounts a pool whose requests a helper process reads (see
    /// the module `split`): for a pool this process maps itself. Write-backs
    /// are stored in `store` by the helper (and charged here afterwards
    /// through [`PoolBackend::on_stored_writeback`]); misses come back here
    /// and are answered as in [`FusePoolPlane::mount`]. `options.readers`
    /// and `options.mode` are not used.
    pub fn mount_split(
        mountpoint: &Path,
        size: u64,
        backend: Arc<dyn PoolBackend>,
        options: PlaneOptions,
        store: &File,
        helper: &crate::helper_link::HelperCommand,
    ) -> Result<Self, MountPlaneError> {
        Self::start(mountpoint, size, backend, options, Some((store, helper)))
    }

    fn start(
        mountpoint: &Path,
        size: u64,
        backend: Arc<dyn PoolBackend>,
        options: PlaneOptions,
        split: Option<(&File, &crate::helper_link::HelperCommand)>,
    ) -> Result<Self, MountPlaneError> {
        if size == 0 || size % PAGE_SIZE != 0 {
            return Err(MountPlaneError::BadSize(size));
        }
        let offered = crate::uring::kernel_offers();
        if options.transport == Transport::IoUring {
            if split.is_some() {
                return Err(MountPlaneError::NoUring(
                    "a split plane's helper reads /dev/fuse",
                ));
            }
            if !offered {
                return Err(MountPlaneError::NoUring(
                    "the host kernel does not offer it (/sys/module/fuse/parameters/enable_uring is not Y)",
                ));
            }
        }
        // A ring that cannot even be created (io_uring_disabled, seccomp,
        // memory) must be known before INIT offers it.
        let wanted = split.is_none() && options.transport != Transport::DevFuse && offered;
        let plan_uring = match (wanted, wanted.then(crate::uring::probe)) {
            (true, Some(Err(e))) if options.transport == Transport::IoUring => {
                return Err(MountPlaneError::Ring(crate::uring::StartRingError::Setup(
                    e,
                )))
            }
            (true, Some(Err(e))) => {
                tracing::info!(error = %e, "no io_uring here; the pool uses /dev/fuse");
                false
            }
            (wanted, _) => wanted,
        };
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/fuse")
            .map_err(MountPlaneError::OpenDevice)?;
        let dev = Arc::new(dev);
        let mount_err = |source| MountPlaneError::Mount {
            path: mountpoint.to_path_buf(),
            source,
        };
        // No `allow_other`: no other host user may even look up the pool.
        // `default_permissions`: the kernel checks the owner-only modes.
        let (uid, gid) = owner();
        let data = format!(
            "fd={},rootmode=40000,user_id={uid},group_id={gid},default_permissions",
            dev.as_raw_fd()
        );
        let target = CString::new(mountpoint.as_os_str().as_bytes())
            .map_err(|e| mount_err(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let data = CString::new(data).map_err(|e| mount_err(io::Error::other(e)))?;
        // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"cxlfs-pool".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(mount_err(io::Error::last_os_error()));
        }
        if options.mode == ReaderMode::Spin || plan_uring {
            // Spinning readers, or readers that poll beside a wake eventfd.
            // SAFETY: fcntl on an fd we own; no pointers.
            let rc = unsafe { libc::fcntl(dev.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
            if rc != 0 {
                tracing::warn!(error = %io::Error::last_os_error(), "cannot make /dev/fuse non-blocking");
            }
        }
        let mut server = Server::new(backend, size).compensating(options.compensation);
        if options.refuse_readahead {
            server = server.refusing_readahead();
        }
        if plan_uring {
            server = server.offering_uring();
        }
        let server = Arc::new(server);
        let wake = if plan_uring {
            Some(Arc::new(
                crate::uring::new_eventfd().map_err(MountPlaneError::Spawn)?,
            ))
        } else {
            None
        };
        let mut m = Mounted {
            server: server.clone(),
            _dev: dev.clone(),
            mountpoint: mountpoint.to_path_buf(),
            mode: options.mode,
            notify_tx: None,
            threads: Threads {
                readers: std::sync::Mutex::new(Vec::new()),
                pacer: None,
                notifier: None,
            },
            spawner: std::sync::Mutex::new(None),
            root: None,
            mounted: true,
            _exit_guard: None,
            helper: None,
            calibrator: None,
            wake: wake.clone(),
            ring: None,
        };
        let (pace_tx, pace_rx) = mpsc::channel::<Held>();
        let (notify_tx, notify_rx) = mpsc::channel::<Notice>();
        m.notify_tx = Some(notify_tx);
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(MountPlaneError::Spawn)
        };
        {
            let (s, d) = (server.clone(), dev.clone());
            m.threads.pacer = Some(spawn(
                "pool-pacer".into(),
                Box::new(move || pacer(&s, &d, pace_rx)),
            )?);
        }
        {
            let (s, d) = (server.clone(), dev.clone());
            m.threads.notifier = Some(spawn(
                "pool-notify".into(),
                Box::new(move || notifier(&s, &d, notify_rx)),
            )?);
        }
        if let Some((store, cmd)) = split {
            let helper = crate::helper_link::Helper::spawn(cmd, &dev, store, size)?;
            let sock = helper.sock.clone();
            m.helper = Some(helper);
            // Found while the helper answers: statting the mountpoint asks it.
            let abort = crate::exit_guard::fusectl_abort_path(mountpoint).ok();
            for i in 0..SPLIT_RECEIVERS {
                let (s, d, k, tx) = (server.clone(), dev.clone(), sock.clone(), pace_tx.clone());
                let abort = abort.clone();
                let h = spawn(
                    format!("pool-fwd{i}"),
                    Box::new(move || forwarded(&s, &d, &k, tx, abort.as_deref())),
                )?;
                lock(&m.threads.readers).push(h);
            }
            drop(pace_tx);
        } else {
            let spawner = ReaderSpawner {
                server: server.clone(),
                dev: dev.clone(),
                pacer: pace_tx,
                // Beside a ring, one reader that sleeps in poll(2): it
                // takes what comes before the ring is ready, then FORGET
                // and INTERRUPT.
                mode: if plan_uring {
                    ReaderMode::Block
                } else {
                    options.mode
                },
                wake,
                base: options.readers.max(1),
                vms: std::collections::HashSet::new(),
            };
            let initial = if plan_uring { 1 } else { spawner.base };
            for i in 0..initial {
                let h = spawner.spawn(i)?;
                lock(&m.threads.readers).push(h);
            }
            *lock(&m.spawner) = Some(spawner);
        }
        if plan_uring {
            // Once INIT grants the ring, the kernel holds every request
            // until each queue has an entry: start the ring before the
            // first request (no path may be touched before).
            let waited = Instant::now();
            while !server.init_answered.load(Ordering::Acquire) && waited.elapsed() < INIT_TIMEOUT {
                thread::sleep(Duration::from_micros(200));
            }
            let granted = server.uring_granted.load(Ordering::Acquire);
            let started = if granted {
                let queues = crate::uring::possible_cpus();
                let poll = options.mode == ReaderMode::Spin;
                let config = crate::uring::RingConfig {
                    queues,
                    per_queue: if poll {
                        crate::uring::POLL_QUEUE_DEPTH
                    } else {
                        options.readers.max(1)
                    },
                    payload_len: (MAX_WRITE as usize).max(abi::MIN_READ_BUFFER),
                    poll,
                };
                let ring_server: Arc<dyn crate::uring::RingServer> = server.clone();
                crate::uring::RingSet::start(&dev, ring_server, config).map(Some)
            } else {
                Ok(None)
            };
            match (started, options.transport) {
                (Ok(Some(r)), _) => m.ring = Some(std::sync::Mutex::new(r)),
                (Ok(None), Transport::IoUring) => {
                    return Err(MountPlaneError::NoUring(
                        "the kernel's INIT did not offer it",
                    ))
                }
                // Granted but not started: the kernel now holds every
                // request until each queue has an entry, so this mount can
                // only be closed (dropping `m` detaches it and closes
                // `/dev/fuse` without a request). `mount` retries `Auto`
                // on `/dev/fuse`.
                (Err(e), _) => return Err(MountPlaneError::Ring(e)),
                (Ok(None), _) => tracing::info!("the kernel's INIT did not offer FUSE over io_uring; the pool stays on /dev/fuse"),
            }
        }
        m.root = Some(
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(mountpoint)
                .map_err(|source| MountPlaneError::OpenPool {
                    path: mountpoint.to_path_buf(),
                    source,
                })?,
        );
        // After the request threads are up: finding the connection stats the
        // mountpoint, which this server must answer.
        match crate::exit_guard::ExitGuard::start(mountpoint) {
            Ok(g) => m._exit_guard = Some(g),
            Err(e) => tracing::warn!(
                error = %e,
                "no exit guard for the pool: if this process is killed mid-eviction it may hang in the kernel"
            ),
        }
        let path = mountpoint.join(POOL_NAME);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|source| MountPlaneError::OpenPool {
                path: path.clone(),
                source,
            })?;
        if options.compensation == Compensation::Auto {
            // Opened before a detach: afterwards no path reaches it.
            let calib = mountpoint.join(CALIB_NAME);
            match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&calib)
            {
                Ok(f) => m.calibrator = start_calibrator(&server, &m, f),
                Err(e) => tracing::warn!(
                    error = %e,
                    path = %calib.display(),
                    "cannot open the calibration file: misses are not compensated"
                ),
            }
        }
        if options.detach {
            m.detach().map_err(|source| MountPlaneError::Detach {
                path: mountpoint.to_path_buf(),
                source,
            })?;
        }
        tracing::info!(
            mountpoint = %mountpoint.display(),
            size,
            detached = options.detach,
            compensation = %options.compensation,
            transport = ?m.ring.as_ref().map(|r| lock(r).config()),
            floor_ns = server.metrics.floor.current_ns(),
            "pool plane mounted"
        );
        Ok(FusePoolPlane {
            target: MapTarget {
                path,
                file: Arc::new(file),
                size,
            },
            m,
        })
    }

    /// The mountpoint.
    pub fn mountpoint(&self) -> &Path {
        &self.m.mountpoint
    }

    /// A split plane's helper process (`None`: requests are read here).
    pub fn helper_pid(&self) -> Option<u32> {
        self.m.helper.as_ref().map(|h| h.child.id())
    }

    /// What carries the requests: `/dev/fuse`, or FUSE over io_uring.
    pub fn transport(&self) -> ActiveTransport {
        match &self.m.ring {
            Some(r) => {
                let r = lock(r);
                let c = r.config();
                ActiveTransport::IoUring {
                    queues: c.queues,
                    workers: r.workers(),
                    poll: c.poll,
                }
            }
            None => ActiveTransport::DevFuse,
        }
    }

    /// Requests answered through the io_uring so far (0 on `/dev/fuse`).
    pub fn ring_requests(&self) -> u64 {
        self.m.server.metrics.snapshot().ring_requests
    }

    /// Request threads started so far.
    pub fn readers(&self) -> usize {
        lock(&self.m.threads.readers).len()
    }

    /// A VM registered: in [`ReaderMode::Block`], keeps one request thread
    /// more than the VMs seen (each reader does its miss's host read
    /// itself, blocking; spinning readers each burn a core and do not grow).
    fn grow_readers(&self, vm: VmId) {
        let mut g = lock(&self.m.spawner);
        let Some(sp) = g.as_mut() else { return };
        sp.vms.insert(vm);
        let want = sp.base.max(sp.vms.len() + 1).min(MAX_READERS);
        if let Some(r) = &self.m.ring {
            // Per queue, as many sleeping ring workers.
            if let Err(e) = lock(r).grow_to(want) {
                tracing::warn!(error = %e, "cannot start more ring workers");
            }
            return;
        }
        // Spinning readers do not grow.
        if sp.mode != ReaderMode::Block {
            return;
        }
        let mut readers = lock(&self.m.threads.readers);
        while readers.len() < want {
            match sp.spawn(readers.len()) {
                Ok(h) => readers.push(h),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start another pool request thread");
                    return;
                }
            }
        }
    }

    /// The floor miss replies are released ahead of their modeled
    /// completion by now (ns; 0: none).
    pub fn compensation_ns(&self) -> u64 {
        self.m.server.metrics.floor.current_ns()
    }

    /// The live counters.
    pub fn live_metrics(&self) -> &PlaneMetrics {
        &self.m.server.metrics
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), SendNotifyError> {
        let ok = offset % PAGE_SIZE == 0
            && len % PAGE_SIZE == 0
            && len > 0
            && offset
                .checked_add(len)
                .is_some_and(|e| e <= self.target.size);
        if ok {
            Ok(())
        } else {
            Err(SendNotifyError::BadRange { offset, len })
        }
    }

    fn queue(&self, kind: NoticeKind) -> Result<NotifyTicket, SendNotifyError> {
        let (done, rx) = mpsc::sync_channel(1);
        self.m
            .notify_tx
            .as_ref()
            .ok_or(SendNotifyError::Closed)?
            .send(Notice { kind, done })
            .map_err(|_| SendNotifyError::Closed)?;
        Ok(NotifyTicket::new(rx))
    }
}

impl ResidencyPlane for FusePoolPlane {
    fn map_target(&self) -> &MapTarget {
        &self.target
    }

    fn fill(&self, pool_offset: u64, data: Vec<u8>) -> Result<NotifyTicket, SendNotifyError> {
        self.check_range(pool_offset, data.len() as u64)?;
        if data.len() > u32::MAX as usize {
            return Err(SendNotifyError::BadRange {
                offset: pool_offset,
                len: data.len() as u64,
            });
        }
        self.queue(NoticeKind::Store {
            offset: pool_offset,
            data,
        })
    }

    fn evict(&self, pool_offset: u64, len: u64) -> Result<NotifyTicket, SendNotifyError> {
        self.check_range(pool_offset, len)?;
        self.queue(NoticeKind::Inval {
            offset: pool_offset,
            len,
        })
    }

    fn sync(&self, pool_offset: u64, len: u64) -> Result<(), SendNotifyError> {
        self.check_range(pool_offset, len)?;
        if on_request_thread() {
            return Err(SendNotifyError::WouldDeadlock);
        }
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: a plain system call on an fd this plane owns.
        let rc = unsafe {
            libc::sync_file_range(
                self.target.file.as_raw_fd(),
                pool_offset as libc::off64_t,
                len as libc::off64_t,
                flags,
            )
        };
        if rc != 0 {
            return Err(SendNotifyError::Kernel(io::Error::last_os_error()));
        }
        Ok(())
    }

    fn register_vmm(&self, vm: VmId, pid: u32) {
        self.m.server.vms.register(vm, pid);
        self.grow_readers(vm);
    }

    fn unregister_vmm(&self, vm: VmId) {
        self.m.server.vms.unregister(vm);
    }

    fn metrics(&self) -> PlaneMetricsSnapshot {
        self.m.server.metrics.snapshot()
    }
}

/// Waits until `dev` has a request (`true`) or `wake` fires (`false`).
fn wait_for_request(dev: &File, wake: &File) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: dev.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfds for the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return false;
        }
        if fds[1].revents != 0 {
            return false;
        }
        // POLLERR / POLLHUP on the device: the read says what happened.
        return true;
    }
}

fn reader(server: &Server, dev: &File, pacer: Sender<Held>, mode: ReaderMode, wake: Option<&File>) {
    REQUEST_THREAD.with(|c| c.set(true));
    let mut buf = vec![0u8; (MAX_WRITE as usize + 4096).max(abi::MIN_READ_BUFFER)];
    let mut out: Vec<u8> = Vec::with_capacity(abi::OUT_HEADER_LEN + MAX_WRITE as usize);
    loop {
        if let Some(w) = wake {
            if !wait_for_request(dev, w) {
                break;
            }
        }
        let n = match (&*dev).read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                Some(libc::EAGAIN) => {
                    if server.stop.load(Ordering::Acquire) {
                        break;
                    }
                    if wake.is_none() {
                        std::hint::spin_loop();
                    }
                    continue;
                }
                // Interrupted, or a request that went away before we read it.
                Some(libc::EINTR) | Some(libc::ENOENT) => continue,
                // The connection ended (unmounted, aborted).
                Some(libc::ENODEV) => break,
                _ => {
                    tracing::warn!(error = %e, "reading /dev/fuse failed; request thread ends");
                    break;
                }
            },
        };
        let arrival = server.backend.now_ns();
        let outcome = server.handle(&buf[..n], arrival, &mut out);
        if outcome == Outcome::ReplyAndExit {
            // Counted out before the reply: whoever waits on it sees it.
            server.alive.fetch_sub(1, Ordering::AcqRel);
            write_reply(dev, &out);
            return;
        }
        deliver(server, dev, &pacer, &mut out, outcome);
        if mode == ReaderMode::Spin && server.stop.load(Ordering::Acquire) {
            break;
        }
    }
    server.alive.fetch_sub(1, Ordering::AcqRel);
}

/// Writes a handled request's reply now, or when it is due: spun for here
/// if due within [`INLINE_SPIN_NS`], else handed to the pacer.
fn deliver(server: &Server, dev: &File, pacer: &Sender<Held>, out: &mut Vec<u8>, outcome: Outcome) {
    match outcome {
        Outcome::None => {}
        Outcome::Reply | Outcome::ReplyAndExit => write_reply(dev, out),
        Outcome::ReplyAt(deadline) => {
            let now = server.backend.now_ns();
            if deadline <= now.saturating_add(INLINE_SPIN_NS) {
                pace::wait_until(|| server.backend.now_ns(), deadline);
                write_reply(dev, out);
            } else {
                let reply = std::mem::replace(
                    out,
                    Vec::with_capacity(abi::OUT_HEADER_LEN + MAX_WRITE as usize),
                );
                let held = Held {
                    deadline_ns: deadline,
                    reply,
                };
                if let Err(mpsc::SendError(h)) = pacer.send(held) {
                    pace::wait_until(|| server.backend.now_ns(), h.deadline_ns);
                    write_reply(dev, &h.reply);
                }
            }
        }
    }
}

/// Daemon threads of a split plane: misses and stored write-backs that
/// the helper forwards. A miss is answered exactly as a local reader
/// would (same server, same pacing); the reply goes to this process's
/// descriptor of the connection. If the helper goes away while the plane
/// is up, nothing could answer write-backs any more: the connection is
/// aborted (every waiter gets an error) rather than left to hang.
fn forwarded(server: &Server, dev: &File, sock: &File, pacer: Sender<Held>, abort: Option<&Path>) {
    use crate::helper_link::{ForwardKind, FORWARD_LEN};
    REQUEST_THREAD.with(|c| c.set(true));
    let mut buf = vec![0u8; crate::helper_link::MAX_FORWARD];
    let mut out: Vec<u8> = Vec::with_capacity(abi::OUT_HEADER_LEN + MAX_WRITE as usize);
    while let Some((f, n)) = crate::helper_link::recv_forward(sock, &mut buf) {
        // The helper stamped the arrival on the monotonic clock.
        let age = crate::helper_link::monotonic_ns().saturating_sub(f.mono_ns);
        let arrival = server.backend.now_ns().saturating_sub(age);
        if f.kind == ForwardKind::Read as u32 {
            let outcome = server.handle(&buf[FORWARD_LEN..n], arrival, &mut out);
            deliver(server, dev, &pacer, &mut out, outcome);
        } else if f.kind == ForwardKind::Stored as u32 {
            match server
                .backend
                .on_stored_writeback(f.offset, f.len, f.pid, arrival)
            {
                Ok(_) => server.metrics.writeback(f.len),
                Err(e) => {
                    tracing::warn!(offset = f.offset, len = f.len, error = %e, "cannot charge a stored write-back")
                }
            }
        } else {
            tracing::warn!(kind = f.kind, "unknown message from the plane helper");
        }
    }
    if server.stop.load(Ordering::Acquire) {
        return;
    }
    tracing::error!("the pool plane helper went away: aborting its connection");
    if let Some(p) = abort {
        if let Err(e) = std::fs::write(p, b"1") {
            tracing::error!(error = %e, path = %p.display(), "cannot abort the plane's connection");
        }
    }
}

fn pacer(server: &Server, dev: &File, rx: Receiver<Held>) {
    REQUEST_THREAD.with(|c| c.set(true));
    // Sleep precision matters: the default timer slack (50 µs) would make
    // every reply handed here late by up to that much.
    // SAFETY: a plain prctl with integer arguments, on this thread only.
    if unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) } != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "cannot set the pacer's timer slack");
    }
    pace::run_pacer(
        &rx,
        || server.backend.now_ns(),
        |due| {
            for h in due {
                write_reply(dev, &h.reply);
            }
        },
    );
}

/// Writes one `NOTIFY_STORE` of `data` at `offset` (header in `head`, data
/// as a second `writev` segment).
fn send_store(dev: &File, head: &mut Vec<u8>, offset: u64, data: &[u8]) -> io::Result<()> {
    let size = u32::try_from(data.len()).map_err(io::Error::other)?;
    abi::encode_notify_store(POOL_NODEID, offset, size, head).map_err(io::Error::other)?;
    let want = head.len() + data.len();
    let w = (&*dev).write_vectored(&[IoSlice::new(head), IoSlice::new(data)])?;
    if w == want {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "short notify write {w} of {want}"
        )))
    }
}

fn notifier(server: &Server, dev: &File, rx: Receiver<Notice>) {
    let mut head = Vec::with_capacity(64);
    for n in rx {
        head.clear();
        let start = Instant::now();
        let res = match &n.kind {
            NoticeKind::Store { offset, data } => send_store(dev, &mut head, *offset, data),
            NoticeKind::Inval { offset, len } => {
                abi::encode_notify_inval_inode(POOL_NODEID, *offset as i64, *len as i64, &mut head);
                (&*dev).write(&head).map(|_| ())
            }
            NoticeKind::InvalCalib => {
                abi::encode_notify_inval_inode(CALIB_NODEID, 0, PAGE_SIZE as i64, &mut head);
                (&*dev).write(&head).map(|_| ())
            }
        };
        let took = start.elapsed();
        let res = match res {
            Ok(()) => {
                match &n.kind {
                    NoticeKind::Store { offset, data } => {
                        server.metrics.store(*offset, data.len() as u64)
                    }
                    NoticeKind::Inval { offset, len } => {
                        // The kernel dropped those folios: holes again.
                        if let Some(r) = &server.readahead {
                            r.forget(*offset, *len);
                        }
                        server.metrics.invalidation(*offset, *len)
                    }
                    NoticeKind::InvalCalib => {}
                }
                Ok(took)
            }
            Err(e) => {
                server.metrics.notify_error();
                tracing::warn!(error = %e, "pool notification refused");
                Err(e)
            }
        };
        let _ = n.done.send(res);
    }
}

/// Starts the calibration thread on `file` (the calibration file, open)
/// and waits for its first estimate (at most [`CALIB_START_TIMEOUT`]).
/// `None` (logged) if it cannot start: misses are then not compensated.
fn start_calibrator(
    server: &Arc<Server>,
    m: &Mounted,
    file: File,
) -> Option<(Sender<()>, JoinHandle<()>)> {
    let notify = m.notify_tx.clone()?;
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::sync_channel::<()>(1);
    let s = server.clone();
    let h = thread::Builder::new()
        .name("pool-calibrate".into())
        .spawn(move || calibrator(&s, &file, &notify, &stop_rx, &ready_tx));
    match h {
        Ok(h) => {
            if ready_rx.recv_timeout(CALIB_START_TIMEOUT).is_err() {
                tracing::warn!(
                    "no trap-path floor measured in time; misses are compensated once it is"
                );
            }
            Some((stop_tx, h))
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the calibration thread: misses are not compensated");
            None
        }
    }
}

/// A read-only shared mapping of the calibration file's page.
struct CalibMap(*const u8);

impl CalibMap {
    fn new(file: &File) -> io::Result<Self> {
        // SAFETY: a fresh read-only shared mapping of one page of an open
        // file; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE_SIZE as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(CalibMap(p.cast()))
    }

    /// Touches the page (a trap when it was dropped).
    fn touch(&self) -> u8 {
        // SAFETY: the first byte of a live one-page mapping; the file is a
        // page long, so the read is never past its end.
        unsafe { self.0.read_volatile() }
    }
}

impl Drop for CalibMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the page `new` mapped.
        unsafe { libc::munmap(self.0.cast_mut().cast(), PAGE_SIZE as usize) };
    }
}

/// One probe: drops the calibration page (the plane's own invalidation,
/// through the notifier), touches it, and returns the trap path's floor
/// `(request - touch) + (mapped - reply)`, or `None` if the touch did not
/// trap exactly once or the notifier is gone.
fn probe(server: &Server, map: &CalibMap, notify: &Sender<Notice>) -> Option<u64> {
    let (done, rx) = mpsc::sync_channel(1);
    notify
        .send(Notice {
            kind: NoticeKind::InvalCalib,
            done,
        })
        .ok()?;
    rx.recv().ok()?.ok()?;
    // Run a little first, as a toucher (a vCPU) is running when it
    // faults: the wake-up from the notifier's answer is not part of a trap.
    let warm = server.backend.now_ns() + CALIB_RUN_NS;
    while server.backend.now_ns() < warm {
        std::hint::spin_loop();
    }
    let before = server.calib.reads.load(Ordering::Acquire);
    let t0 = server.backend.now_ns();
    std::hint::black_box(map.touch());
    let t1 = server.backend.now_ns();
    if server.calib.reads.load(Ordering::Acquire) != before + 1 {
        return None;
    }
    let req = server.calib.request_ns.load(Ordering::Relaxed);
    let rep = server.calib.reply_ns.load(Ordering::Relaxed);
    (t0 <= req && req <= rep && rep <= t1).then(|| (req - t0) + (t1 - rep))
}

/// The calibration thread: [`CALIB_START_PROBES`] probes at start (then
/// `ready`), then [`CALIB_PERIODIC_PROBES`] every [`CALIB_PERIOD`] until
/// `stop` closes; each batch goes into the plane's floor.
fn calibrator(
    server: &Server,
    file: &File,
    notify: &Sender<Notice>,
    stop: &Receiver<()>,
    ready: &SyncSender<()>,
) {
    let map = match CalibMap::new(file) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "cannot map the calibration file: misses are not compensated");
            return;
        }
    };
    let mut batch = Vec::with_capacity(CALIB_START_PROBES);
    for i in 0..CALIB_WARMUP + CALIB_START_PROBES {
        if let Some(ns) = probe(server, &map, notify) {
            if i >= CALIB_WARMUP {
                batch.push(ns);
            }
        }
    }
    server.metrics.floor.record(&batch);
    tracing::info!(
        floor_ns = server.metrics.floor.current_ns(),
        probes = batch.len(),
        "trap-path floor calibrated"
    );
    let _ = ready.try_send(());
    loop {
        match stop.recv_timeout(CALIB_PERIOD) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        batch.clear();
        for _ in 0..CALIB_PERIODIC_PROBES {
            if let Some(ns) = probe(server, &map, notify) {
                batch.push(ns);
            }
        }
        server.metrics.floor.record(&batch);
    }
}

impl Mounted {
    /// Lazily unmounts the pool (once): path lookups end, the descriptors
    /// keep the connection.
    fn detach(&mut self) -> io::Result<()> {
        if !self.mounted {
            return Ok(());
        }
        let p = CString::new(self.mountpoint.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(io::Error::last_os_error());
        }
        self.mounted = false;
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // 0. The calibrator first: it touches a file of this mount and
        //    queues notifications.
        if let Some((stop, h)) = self.calibrator.take() {
            drop(stop);
            let _ = h.join();
        }
        // 0b. No new request threads; the pacer ends once the readers have.
        lock(&self.spawner).take();
        // 1. No more notifications; let queued ones finish (they may wait
        //    for write-backs the request threads answer).
        self.notify_tx = None;
        if let Some(h) = self.threads.notifier.take() {
            let _ = h.join();
        }
        // 2. Lazy unmount: no new path lookups; the root fd keeps the
        //    connection reachable.
        if let Err(e) = self.detach() {
            tracing::warn!(error = %e, "cannot unmount the pool");
        }
        // 2b. A split plane: end the helper (it answered the write-backs
        //     of step 1); the threads that take its messages then end.
        if let Some(h) = self.helper.as_mut() {
            self.server.stop.store(true, Ordering::Release);
            h.stop();
        }
        // 3. Stop the request threads: a GETATTR of the root from this
        //    thread ends the one that answers it (blocking readers have no
        //    other way to leave read(2)); spinning ones see the flag.
        self.server.stop_tid.store(gettid(), Ordering::Release);
        self.server.stop.store(true, Ordering::Release);
        // The ring's workers stop on their eventfd; its buffers stay until
        // the connection is closed (the `ring` field drops last).
        if let Some(r) = &self.ring {
            lock(r).stop();
        }
        if let Some(w) = &self.wake {
            if let Err(e) = (&**w).write(&1u64.to_ne_bytes()) {
                tracing::warn!(error = %e, "cannot wake the pool's /dev/fuse readers");
            }
        } else if self.mode == ReaderMode::Block {
            if let Some(root) = &self.root {
                while self.server.alive.load(Ordering::Acquire) > 0 {
                    // SAFETY: `st` is a valid out buffer; the path is a valid empty C string.
                    let rc = unsafe {
                        let mut st: libc::statx = std::mem::zeroed();
                        libc::statx(
                            root.as_raw_fd(),
                            c"".as_ptr(),
                            libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
                            libc::STATX_BASIC_STATS,
                            &mut st,
                        )
                    };
                    if rc != 0 {
                        break;
                    }
                }
            }
        }
        self.root = None;
        let readers = std::mem::take(&mut *lock(&self.threads.readers));
        if self.server.alive.load(Ordering::Acquire) > 0 {
            // Could not reach them (connection already gone?): they end on
            // ENODEV; don't block on them.
            tracing::warn!("pool request threads still running at shutdown; detaching them");
        } else {
            for h in readers {
                let _ = h.join();
            }
        }
        if let Some(h) = self.threads.pacer.take() {
            let _ = h.join();
        }
        tracing::info!(mountpoint = %self.mountpoint.display(), "pool plane unmounted");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MissReply, ServeMissError, WritebackError};
    use fuse_abi::zerocopy::{FromBytes, IntoBytes};
    use fuse_abi::ForgetIn;

    struct Zero;
    impl PoolBackend for Zero {
        fn now_ns(&self) -> u64 {
            0
        }
        fn on_miss(&self, m: &Miss, dst: &mut [u8]) -> Result<MissReply, ServeMissError> {
            dst.fill(0xab);
            Ok(MissReply {
                data: MissData::InPlace {
                    len: m.len as usize,
                },
                completes_at_ns: 5,
            })
        }
        fn on_writeback(&self, _: u64, _: &[u8], _: u32, _: u64) -> Result<u64, WritebackError> {
            Ok(7)
        }
    }

    fn request(opcode: u32, nodeid: u64, args: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        InHeader {
            len: (abi::IN_HEADER_LEN + args.len()) as u32,
            opcode,
            unique: 9,
            nodeid,
            pid: 1,
            ..InHeader::default()
        }
        .encode(&mut b);
        b.extend_from_slice(args);
        b
    }

    fn out_error(out: &[u8]) -> i32 {
        OutHeader::parse(&mut Cursor::new(out)).unwrap().error
    }

    #[test]
    fn garbage_never_panics() {
        let s = Server::new(Arc::new(Zero), 1 << 20);
        let mut out = Vec::new();
        let mut x = 0x1234_5678_9abc_def0u64;
        for len in 0..400usize {
            let mut b: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = s.handle(&b, 0, &mut out);
            if let Ok((mut h, _)) = InHeader::read_from_prefix(&b) {
                // Valid length, every opcode, random arguments.
                h.len = len as u32;
                for op in 0..60u32 {
                    h.opcode = op;
                    for node in [0u64, 1, 2, 3] {
                        h.nodeid = node;
                        assert!(h.write_to_prefix(&mut b).is_ok());
                        let _ = s.handle(&b, 0, &mut out);
                    }
                }
            }
        }
    }

    #[test]
    fn answers_the_pool_protocol() {
        let s = Server::new(Arc::new(Zero), 1 << 20);
        let mut out = Vec::new();
        assert_eq!(
            s.handle(&request(opcode::LOOKUP, 1, b"pool\0"), 0, &mut out),
            Outcome::Reply
        );
        assert_eq!(out_error(&out), 0);
        assert_eq!(out.len(), abi::OUT_HEADER_LEN + abi::ENTRY_OUT_LEN);
        s.handle(&request(opcode::LOOKUP, 1, b"nope\0"), 0, &mut out);
        assert_eq!(out_error(&out), -libc::ENOENT);
        s.handle(&request(999, 1, b""), 0, &mut out);
        assert_eq!(out_error(&out), -libc::ENOSYS);
        // A READ past the end is clipped, one at the end is empty.
        let mut a = Vec::new();
        ReadIn {
            offset: (1 << 20) - 4096,
            size: 8192,
            ..ReadIn::default()
        }
        .encode(&mut a);
        assert_eq!(
            s.handle(&request(opcode::READ, 2, &a), 0, &mut out),
            Outcome::ReplyAt(5)
        );
        assert_eq!(out.len(), abi::OUT_HEADER_LEN + 4096);
        assert!(out[abi::OUT_HEADER_LEN..].iter().all(|&b| b == 0xab));
        // A WRITE past the end is refused.
        let mut a = Vec::new();
        WriteIn {
            offset: 1 << 20,
            size: 4,
            ..WriteIn::default()
        }
        .encode(&mut a);
        a.extend_from_slice(b"abcd");
        s.handle(&request(opcode::WRITE, 2, &a), 0, &mut out);
        assert_eq!(out_error(&out), -libc::EFBIG);
        // SETATTR changing the size is refused.
        let a = SetattrIn {
            valid: fattr::SIZE,
            ..SetattrIn::default()
        };
        s.handle(&request(opcode::SETATTR, 2, a.as_bytes()), 0, &mut out);
        assert_eq!(out_error(&out), -libc::EPERM);
        assert_eq!(s.metrics.snapshot().traps, 1);
        // FORGET has no reply.
        assert_eq!(
            s.handle(
                &request(opcode::FORGET, 2, ForgetIn::default().as_bytes()),
                0,
                &mut out
            ),
            Outcome::None
        );
    }

    fn read_args(offset: u64, size: u32) -> Vec<u8> {
        let mut a = Vec::new();
        ReadIn {
            offset,
            size,
            ..ReadIn::default()
        }
        .encode(&mut a);
        a
    }

    #[test]
    fn miss_replies_are_released_ahead_by_the_floor_and_calibration_reads_are_not_traps() {
        // Off: held to the modeled completion (5), as before.
        let s = Server::new(Arc::new(Zero), 1 << 20);
        let mut out = Vec::new();
        let r = request(opcode::READ, POOL_NODEID, &read_args(0, 4096));
        assert_eq!(s.handle(&r, 0, &mut out), Outcome::ReplyAt(5));
        // A floor of 3: at 5 - 3; one above the modeled time: at arrival.
        let s = Server::new(Arc::new(Zero), 1 << 20).compensating(Compensation::Fixed(3));
        assert_eq!(s.handle(&r, 0, &mut out), Outcome::ReplyAt(2));
        assert_eq!(s.metrics.snapshot().compensation_ns, 3);
        let s = Server::new(Arc::new(Zero), 1 << 20).compensating(Compensation::Fixed(9));
        assert_eq!(s.handle(&r, 1, &mut out), Outcome::ReplyAt(1));
        // The calibration file: found by name, one page of zeros, answered
        // at once, stamped, no trap; not listed.
        let s = Server::new(Arc::new(Zero), 1 << 20).compensating(Compensation::Auto);
        assert_eq!(
            s.handle(&request(opcode::LOOKUP, 1, b"calibration\0"), 0, &mut out),
            Outcome::Reply
        );
        let mut c = Cursor::new(&out[abi::OUT_HEADER_LEN..]);
        let e: EntryOut = c.read().unwrap();
        assert_eq!((e.nodeid, e.attr.size), (CALIB_NODEID, PAGE_SIZE));
        let r = request(opcode::READ, CALIB_NODEID, &read_args(0, 8192));
        assert_eq!(s.handle(&r, 7, &mut out), Outcome::Reply);
        assert_eq!(out.len(), abi::OUT_HEADER_LEN + 4096);
        assert!(out[abi::OUT_HEADER_LEN..].iter().all(|&b| b == 0));
        assert_eq!(s.calib.request_ns.load(Ordering::Relaxed), 7);
        assert_eq!(s.calib.reads.load(Ordering::Relaxed), 1);
        assert_eq!(s.metrics.snapshot().traps, 0);
        let mut a = Vec::new();
        ReadIn {
            size: 4096,
            ..ReadIn::default()
        }
        .encode(&mut a);
        s.handle(&request(opcode::READDIR, 1, &a), 0, &mut out);
        let listing = &out[abi::OUT_HEADER_LEN..];
        assert!(listing.windows(4).any(|w| w == b"pool"));
        assert!(!listing.windows(11).any(|w| w == b"calibration"));
    }

    #[test]
    fn init_caps_readahead_and_keeps_explicit_invalidation() {
        let s = Server::new(Arc::new(Zero), 1 << 20);
        let a = InitIn {
            major: 7,
            minor: 45,
            max_readahead: 128 * 1024,
            flags: u32::MAX,
        };
        let mut out = Vec::new();
        s.handle(&request(opcode::INIT, 0, a.as_bytes()), 0, &mut out);
        assert_eq!(out.len(), abi::OUT_HEADER_LEN + InitOut::SIZE);
        let mut c = Cursor::new(&out[abi::OUT_HEADER_LEN..]);
        let init: InitOut = c.read().unwrap();
        assert_eq!((init.major, init.minor), (7, 31));
        assert_eq!(init.max_readahead, MAX_READAHEAD);
        let flags = init.flags64();
        assert_ne!(flags & init_flags::EXPLICIT_INVAL_DATA, 0);
        assert_eq!(flags & init_flags::AUTO_INVAL_DATA, 0);
        assert_eq!(flags & init_flags::WRITEBACK_CACHE, 0);
        assert_eq!(flags & init_flags::HANDLE_KILLPRIV_V2, 0);
    }
}
