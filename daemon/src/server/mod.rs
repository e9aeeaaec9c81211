//! The FUSE server: one request's bytes in, one reply's bytes out, plus the
//! moment (device time) the reply may be released.
//!
//! [`Server<F>`] only decodes, dispatches and encodes (virtiofsd's shape):
//! every operation goes to the [`FileSystem`] `F` — in `cxlfsd`, the
//! passthrough filesystem wrapped by the timing layer
//! (`timing/`), which charges the device model — and the
//! two seams, a [`DaxMapper`] (SETUPMAPPING / REMOVEMAPPING) and an
//! [`IoctlHandler`] (FUSE_IOCTL), are injected. Wire structs are the typed
//! `#[repr(C)]` structs of the `fuse-abi` crate: no offsets by hand.
//!
//! It knows nothing about virtqueues: the transport (`backend/`) copies the readable
//! part of a descriptor chain into a buffer, calls [`FuseHandler::handle_io`],
//! writes the reply into the writable part and paces its release. That keeps
//! the parser testable with plain byte slices ([`Server::handle`]).

pub mod filesystem;
pub mod payload;
pub mod seams;

pub use filesystem::{
    AttrReply, Context, CopyRange, Created, Creation, DirEntry, DirSink, Fallocate, FileIo,
    FileSystem, FsResult, HostFile, LockRequest, LockWaiter, Named, Opened, StopWaiting, Timed,
    Xattr,
};
pub use payload::{BufferIo, Direction, PayloadIo, Transfer};
pub use seams::{DaxMapper, IoctlHandler};

use crate::abi::{
    self, init_flags, lk_flags, opcode, release_flags, AccessIn, BatchForgetIn, CopyFileRangeIn,
    CreateIn, Cursor, EntryOut, FallocateIn, FlushIn, ForgetIn, ForgetOne, FsyncIn, GetattrIn,
    GetxattrIn, GetxattrOut, InHeader, InitIn, InterruptIn, IoctlIn, LinkIn, LkIn, LkOut, LseekIn,
    LseekOut, MkdirIn, MknodIn, OpenIn, OutHeader, ParseRequestError, ReadIn, ReleaseIn,
    RemoveMappingIn, RemoveMappingOne, Rename2In, RenameIn, SetattrIn, SetupMappingIn, SetxattrIn,
    WriteIn,
};
use crate::metrics::VmMetrics;
use crate::sync::lock;
use rustix::io::Errno;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use zerocopy::IntoBytes;

/// Largest WRITE payload accepted (advertised as `max_write`).
pub const MAX_WRITE: u32 = 1 << 20;
/// Largest READ served (and `max_pages` * 4 KiB).
pub const MAX_READ: u32 = 1 << 20;
/// Largest request the transport needs to buffer: a maximal WRITE plus headers.
pub const MAX_REQUEST: usize = MAX_WRITE as usize + 4096;
/// Bytes of a WRITE request before its payload (`fuse_in_header` + `fuse_write_in`).
pub const WRITE_PAYLOAD_AT: usize =
    std::mem::size_of::<InHeader>() + std::mem::size_of::<WriteIn>();
/// Bytes of `fuse_out_header`.
const OUT_HEADER_LEN: usize = std::mem::size_of::<OutHeader>();
/// Largest extended-attribute value and list (`XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: u32 = 64 * 1024;
/// Largest extended-attribute name (`XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// Most SETLKW waits one VM may have outstanding; more get `ENOLCK`.
pub const MAX_LOCK_WAITERS: usize = 64;

/// Server options.
#[derive(Debug, Clone, Copy)]
pub struct ServerOptions {
    /// Cap on the guest's readahead (bytes); `None` keeps the guest's value.
    pub max_readahead: Option<u32>,
}

/// A reply that comes later, from a thread of its own (a SETLKW that met
/// a conflict): runs until it has the reply's bytes (header included).
pub struct Deferred(pub Box<dyn FnOnce() -> Vec<u8> + Send>);

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred")
    }
}

/// What to do with one request.
#[derive(Debug, Default)]
pub struct Handled {
    /// Reply bytes (header included); `None`: the request takes no reply.
    pub reply: Option<Vec<u8>>,
    /// Device time at which the reply may be released (data path only).
    pub completes_at_ns: Option<u64>,
    /// READ data already placed in the reply buffers right after `reply`
    /// (by [`PayloadIo::transfer`]); the reply's length is
    /// `reply.len() + in_place`. Always 0 from [`Server::handle`].
    pub in_place: usize,
    /// The reply comes later (then `reply` is `None`): the transport runs
    /// this off the request path and sends what it returns.
    pub deferred: Option<Deferred>,
}

/// One request as the transport hands it over.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    /// Arrival, in device time.
    pub arrival_ns: u64,
    /// The request's first bytes: all of it, except that a WRITE may stop
    /// after its arguments ([`WRITE_PAYLOAD_AT`]; the payload is then moved
    /// by the [`PayloadIo`]).
    pub bytes: &'a [u8],
    /// Size of the whole request part of the chain.
    pub total: usize,
    /// Room in the chain's writable part.
    pub out_cap: usize,
}

/// What the transport asks of a FUSE server (object safe, so the
/// vhost-user back-end needs no filesystem type).
pub trait FuseHandler: Send + Sync {
    /// Handles one request; READ data and WRITE payloads move through `io`
    /// (then `Handled::in_place` > 0 for a READ). Never panics on malformed
    /// input: it answers with an error or with nothing.
    fn handle_io(&self, req: Incoming<'_>, io: &mut dyn PayloadIo) -> Handled;

    /// The connection ends: replies still waiting ([`Handled::deferred`])
    /// give up now.
    fn close_waits(&self) {}
}

/// A FUSE server for one VM session over the filesystem `F`.
pub struct Server<F: FileSystem> {
    fs: F,
    metrics: Arc<VmMetrics>,
    opts: ServerOptions,
    initialized: AtomicBool,
    dax: Option<Arc<dyn DaxMapper>>,
    ioctl: Option<Arc<dyn IoctlHandler>>,
    waits: Arc<LockWaits>,
}

/// The SETLKW requests of a session waiting off the request path, by
/// `unique`: FUSE_INTERRUPT and the session's end stop them.
#[derive(Debug, Default)]
pub struct LockWaits {
    waiting: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    /// INTERRUPTs that came (on the hiprio queue) before their SETLKW was
    /// registered; the last few only.
    early: Mutex<std::collections::VecDeque<u64>>,
    closing: AtomicBool,
}

/// Early INTERRUPTs remembered.
const EARLY_INTERRUPTS: usize = 64;

impl LockWaits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<AtomicBool>>> {
        lock(&self.waiting)
    }

    /// Stops every wait (the session ends); new ones are refused.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        for stop in self.lock().values() {
            stop.store(true, Ordering::Release);
        }
    }

    /// Waits outstanding.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is outstanding.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn interrupt(&self, unique: u64) {
        let waiting = self.lock();
        match waiting.get(&unique) {
            Some(stop) => stop.store(true, Ordering::Release),
            None => {
                let mut early = lock(&self.early);
                if early.len() == EARLY_INTERRUPTS {
                    early.pop_front();
                }
                early.push_back(unique);
            }
        }
    }

    /// Whether `unique` was interrupted before it waited (forgets it).
    fn interrupted_early(&self, unique: u64) -> bool {
        let mut early = lock(&self.early);
        match early.iter().position(|&u| u == unique) {
            Some(i) => {
                early.remove(i);
                true
            }
            None => false,
        }
    }
}

/// A SETLKW's place in [`LockWaits`], given up when its wait ends or is
/// dropped unrun.
struct WaitEntry {
    waits: Arc<LockWaits>,
    unique: u64,
}

impl Drop for WaitEntry {
    fn drop(&mut self) {
        self.waits.lock().remove(&self.unique);
    }
}

impl<F: FileSystem> std::fmt::Debug for Server<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("vm", &self.metrics.name)
            .field("dax", &self.dax.is_some())
            .field("ioctl", &self.ioctl.is_some())
            .finish_non_exhaustive()
    }
}

/// A payload of an operation that went through: the reply's bytes after
/// the header, and its release time.
type OpResult = Result<Timed<Vec<u8>>, Errno>;

fn parse_err(e: ParseRequestError) -> Errno {
    tracing::debug!(error = %e, "malformed FUSE request");
    Errno::INVAL
}

/// A reply: header (`len` computed) then `payload`.
fn reply_bytes(unique: u64, error: i32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OUT_HEADER_LEN + payload.len());
    OutHeader {
        len: (OUT_HEADER_LEN + payload.len()) as u32,
        error,
        unique,
    }
    .encode(&mut out);
    out.extend_from_slice(payload);
    out
}

/// An error reply.
pub fn error_reply(unique: u64, e: Errno) -> Vec<u8> {
    reply_bytes(unique, -e.raw_os_error(), &[])
}

fn now(bytes: Vec<u8>) -> OpResult {
    Ok(Timed::now(bytes))
}

fn entry_bytes(e: &EntryOut) -> Vec<u8> {
    let mut b = Vec::with_capacity(abi::ENTRY_OUT_LEN);
    e.encode(&mut b);
    b
}

fn attr_bytes(a: &AttrReply) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + abi::ATTR_LEN);
    abi::encode_attr_out(
        a.timeout.as_secs(),
        a.timeout.subsec_nanos(),
        &a.attr,
        &mut b,
    );
    b
}

/// `name` in the directory the request names.
/// Most bytes one COPY_FILE_RANGE copies (the guest loops for more).
pub const MAX_COPY: u64 = 16 << 20;

/// An xattr name the kernel could have sent: 1 to 255 bytes.
fn check_xattr_name(name: &[u8]) -> Result<&[u8], Errno> {
    match name.len() {
        0 => Err(Errno::INVAL),
        n if n > XATTR_NAME_MAX => Err(Errno::RANGE),
        _ => Ok(name),
    }
}

fn xattr_bytes(x: Xattr) -> Vec<u8> {
    match x {
        Xattr::Size(size) => GetxattrOut { size, padding: 0 }.as_bytes().to_vec(),
        Xattr::Data(d) => d,
    }
}

fn lock_request(l: &LkIn) -> LockRequest {
    LockRequest {
        fh: l.fh,
        owner: l.owner,
        lock: l.lk,
        flock: l.lk_flags & lk_flags::FLOCK != 0,
    }
}

fn in_dir<'a>(h: &InHeader, name: &'a [u8]) -> Named<'a> {
    Named {
        parent: h.nodeid,
        name,
    }
}

fn open_bytes(o: &Opened) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    abi::encode_open_out(o.fh, o.open_flags, &mut b);
    b
}

impl<F: FileSystem> Server<F> {
    /// A server over `fs`, counting into `metrics`.
    pub fn new(fs: F, metrics: Arc<VmMetrics>, opts: ServerOptions) -> Self {
        Server {
            fs,
            metrics,
            opts,
            initialized: AtomicBool::new(false),
            dax: None,
            ioctl: None,
            waits: Arc::new(LockWaits::default()),
        }
    }

    /// Serves FUSE_IOCTL through `handler` (otherwise `ENOTTY`).
    pub fn with_ioctl(mut self, handler: Option<Arc<dyn IoctlHandler>>) -> Self {
        self.ioctl = handler;
        self
    }

    /// Serves the DAX window through `mapper` (SETUPMAPPING,
    /// REMOVEMAPPING, the map alignment in INIT; otherwise `ENOSYS`).
    pub fn with_dax(mut self, mapper: Option<Arc<dyn DaxMapper>>) -> Self {
        self.dax = mapper;
        self
    }

    /// The filesystem.
    pub fn fs(&self) -> &F {
        &self.fs
    }

    /// The VM's counters.
    pub fn metrics(&self) -> &Arc<VmMetrics> {
        &self.metrics
    }

    /// Handles one request that arrived at device time `arrival_ns`.
    /// `out_cap` is the room in the chain's writable part. Never panics on
    /// malformed input: it answers with an error or with nothing.
    pub fn handle(&self, arrival_ns: u64, req: &[u8], out_cap: usize) -> Handled {
        let mut io = BufferIo {
            req,
            data: Vec::new(),
        };
        let incoming = Incoming {
            arrival_ns,
            bytes: req,
            total: req.len(),
            out_cap,
        };
        let mut handled = self.handle_io(incoming, &mut io);
        if handled.in_place > 0 {
            if let Some(reply) = handled.reply.as_mut() {
                reply.extend_from_slice(&io.data[..handled.in_place]);
            }
            handled.in_place = 0;
        }
        handled
    }

    fn handle_request(&self, incoming: Incoming<'_>, io: &mut dyn PayloadIo) -> Handled {
        let Incoming {
            arrival_ns,
            bytes: req,
            total: req_total,
            out_cap,
        } = incoming;
        let mut c = Cursor::new(req);
        let h = match c.read::<InHeader>() {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(error = %e, "request shorter than a FUSE header");
                self.metrics.count_request(opcode::MAX);
                return Handled {
                    reply: (out_cap >= OUT_HEADER_LEN).then(|| error_reply(0, Errno::INVAL)),
                    ..Handled::default()
                };
            }
        };
        self.metrics.count_request(h.opcode);
        // One span per request (cheap when debug is off: a static check).
        let span = tracing::debug_span!(
            "fuse_request",
            vm = %self.metrics.name,
            opcode = opcode::name(h.opcode),
            unique = h.unique,
            nodeid = h.nodeid
        );
        let _entered = span.enter();
        let hlen = h.len as usize;
        let supplied = if h.opcode == opcode::WRITE {
            req_total.max(req.len())
        } else {
            req.len()
        };
        let header_len = std::mem::size_of::<InHeader>();
        if hlen > supplied || hlen < header_len {
            tracing::debug!(
                error = %ParseRequestError::LengthMismatch { header: h.len, actual: supplied },
                "bad FUSE request length"
            );
            return self.finish(&h, Err(Errno::INVAL), out_cap, 0);
        }
        // Arguments are what the header claims, not what the chain holds.
        let mut args = Cursor::new(&req[header_len..hlen.min(req.len())]);
        let ctx = Context {
            uid: h.uid,
            gid: h.gid,
            pid: h.pid,
            arrival_ns,
        };
        let mut in_place = 0usize;
        let result = match h.opcode {
            opcode::FORGET => {
                if let Ok(f) = args.read::<ForgetIn>() {
                    self.fs.forget(&ctx, h.nodeid, f.nlookup);
                }
                return Handled::default();
            }
            opcode::BATCH_FORGET => {
                self.batch_forget(&ctx, &mut args);
                return Handled::default();
            }
            opcode::INTERRUPT => {
                // Only a waiting SETLKW can be interrupted; every other
                // request is answered before the next is read.
                if let Ok(i) = args.read::<InterruptIn>() {
                    self.waits.interrupt(i.unique);
                }
                return Handled::default();
            }
            _ if h.opcode != opcode::INIT && !self.initialized.load(Ordering::Acquire) => {
                Err(Errno::IO)
            }
            opcode::INIT => self.init(&mut args),
            opcode::DESTROY => {
                self.initialized.store(false, Ordering::Release);
                if let Some(d) = &self.dax {
                    d.unmap_all();
                }
                self.fs.destroy();
                now(Vec::new())
            }
            opcode::LOOKUP => {
                let name = args.name().map_err(parse_err);
                name.and_then(|n| self.fs.lookup(&ctx, h.nodeid, n))
                    .map(|e| e.map(|e| entry_bytes(&e)))
            }
            opcode::GETATTR => {
                // A short GETATTR (old kernels) is a plain getattr.
                let fh = args
                    .read::<GetattrIn>()
                    .ok()
                    .filter(|g| g.getattr_flags & abi::GETATTR_FH != 0)
                    .map(|g| g.fh);
                self.fs
                    .getattr(&ctx, h.nodeid, fh)
                    .map(|a| a.map(|a| attr_bytes(&a)))
            }
            opcode::SETATTR => args.read::<SetattrIn>().map_err(parse_err).and_then(|s| {
                self.fs
                    .setattr(&ctx, h.nodeid, &s)
                    .map(|a| a.map(|a| attr_bytes(&a)))
            }),
            opcode::OPEN => args.read::<OpenIn>().map_err(parse_err).and_then(|o| {
                self.fs
                    .open(&ctx, h.nodeid, o.flags, o.open_flags)
                    .map(|o| o.map(|o| open_bytes(&o)))
            }),
            opcode::CREATE => self.create(&ctx, &h, &mut args),
            opcode::READ => self.read(&ctx, &h, &mut args, out_cap, io).map(|r| {
                in_place = r.value;
                r.map(|_| Vec::new())
            }),
            opcode::WRITE => self.write(&ctx, &h, &mut args, hlen, io),
            opcode::RELEASE | opcode::RELEASEDIR => {
                args.read::<ReleaseIn>().map_err(parse_err).and_then(|r| {
                    if r.release_flags & release_flags::FLOCK_UNLOCK != 0 {
                        self.fs.unlock_owner(&ctx, h.nodeid, r.lock_owner, true);
                    }
                    self.fs.release(&ctx, h.nodeid, r.fh);
                    now(Vec::new())
                })
            }
            opcode::FLUSH => args.read::<FlushIn>().map_err(parse_err).and_then(|f| {
                // A close in the guest drops the closing process's POSIX
                // locks on the file, whichever descriptor took them.
                self.fs.unlock_owner(&ctx, h.nodeid, f.lock_owner, false);
                self.fs
                    .flush(&ctx, h.nodeid, f.fh)
                    .map(|t| t.map(|()| Vec::new()))
            }),
            opcode::FSYNC | opcode::FSYNCDIR => {
                args.read::<FsyncIn>().map_err(parse_err).and_then(|f| {
                    self.fs
                        .fsync(&ctx, h.nodeid, f.fh, f.fsync_flags & 1 != 0)
                        .map(|t| t.map(|()| Vec::new()))
                })
            }
            opcode::OPENDIR => self
                .fs
                .opendir(&ctx, h.nodeid)
                .map(|o| o.map(|o| open_bytes(&o))),
            opcode::READDIR => self.readdir(&ctx, &h, &mut args, false, out_cap),
            opcode::READDIRPLUS => self.readdir(&ctx, &h, &mut args, true, out_cap),
            opcode::MKDIR => self.mkdir(&ctx, &h, &mut args),
            opcode::SYMLINK => self.symlink(&ctx, &h, &mut args),
            opcode::READLINK => self.fs.readlink(&ctx, h.nodeid),
            opcode::UNLINK => self.unlink(&ctx, &h, &mut args, false),
            opcode::RMDIR => self.unlink(&ctx, &h, &mut args, true),
            opcode::RENAME => self.rename(&ctx, &h, &mut args, false),
            opcode::RENAME2 => self.rename(&ctx, &h, &mut args, true),
            opcode::STATFS => self.fs.statfs(&ctx, h.nodeid).map(|s| {
                s.map(|st| {
                    let mut b = Vec::with_capacity(80);
                    st.encode(&mut b);
                    b
                })
            }),
            opcode::LINK => self.link(&ctx, &h, &mut args),
            opcode::MKNOD => self.mknod(&ctx, &h, &mut args),
            opcode::TMPFILE => self.tmpfile(&ctx, &h, &mut args),
            opcode::GETXATTR => self.getxattr(&ctx, &h, &mut args),
            opcode::LISTXATTR => args.read::<GetxattrIn>().map_err(parse_err).and_then(|g| {
                let size = g.size.min(XATTR_SIZE_MAX);
                let x = self.fs.listxattr(&ctx, h.nodeid, size)?;
                Ok(x.map(xattr_bytes))
            }),
            opcode::SETXATTR => self.setxattr(&ctx, &h, &mut args),
            opcode::REMOVEXATTR => {
                let name = args.name().map_err(parse_err);
                name.and_then(check_xattr_name)
                    .and_then(|n| self.fs.removexattr(&ctx, h.nodeid, n))
                    .map(|t| t.map(|()| Vec::new()))
            }
            opcode::FALLOCATE => args.read::<FallocateIn>().map_err(parse_err).and_then(|f| {
                let range = Fallocate {
                    nodeid: h.nodeid,
                    fh: f.fh,
                    offset: f.offset,
                    length: f.length,
                    mode: f.mode,
                };
                self.fs
                    .fallocate(&ctx, range)
                    .map(|t| t.map(|()| Vec::new()))
            }),
            opcode::LSEEK => args.read::<LseekIn>().map_err(parse_err).and_then(|l| {
                let t = self.fs.lseek(&ctx, h.nodeid, l.fh, l.offset, l.whence)?;
                Ok(t.map(|offset| LseekOut { offset }.as_bytes().to_vec()))
            }),
            opcode::COPY_FILE_RANGE => self.copy_file_range(&ctx, &h, &mut args),
            opcode::GETLK => args.read::<LkIn>().map_err(parse_err).and_then(|l| {
                let lk = self.fs.getlk(&ctx, h.nodeid, &lock_request(&l))?;
                Ok(lk.map(|lk| LkOut { lk }.as_bytes().to_vec()))
            }),
            opcode::SETLK => args.read::<LkIn>().map_err(parse_err).and_then(|l| {
                let t = self.fs.setlk(&ctx, h.nodeid, &lock_request(&l))?;
                Ok(t.map(|()| Vec::new()))
            }),
            opcode::SETLKW => {
                let l = match args.read::<LkIn>() {
                    Ok(l) => l,
                    Err(e) => return self.finish(&h, Err(parse_err(e)), out_cap, 0),
                };
                return self.setlkw(&ctx, &h, &lock_request(&l), out_cap);
            }
            opcode::SYNCFS => self
                .fs
                .syncfs(&ctx, h.nodeid)
                .map(|t| t.map(|()| Vec::new())),
            opcode::ACCESS => args.read::<AccessIn>().map_err(parse_err).and_then(|a| {
                self.fs
                    .access(&ctx, h.nodeid, a.mask)
                    .map(|t| t.map(|()| Vec::new()))
            }),
            opcode::SETUPMAPPING => self.setup_mapping(h.nodeid, &mut args),
            opcode::REMOVEMAPPING => self.remove_mapping(&mut args),
            opcode::IOCTL => self.ioctl(&ctx, &mut args),
            _ => Err(Errno::NOSYS),
        };
        self.finish(&h, result, out_cap, in_place)
    }

    fn finish(&self, h: &InHeader, result: OpResult, out_cap: usize, in_place: usize) -> Handled {
        let completes_at_ns = result.as_ref().ok().and_then(|t| t.completes_at_ns);
        if in_place > 0 {
            // READ data is already in the reply buffers; only the header is
            // left to write (the size was clamped to the room).
            let mut out = Vec::with_capacity(OUT_HEADER_LEN);
            OutHeader {
                len: (OUT_HEADER_LEN + in_place) as u32,
                error: 0,
                unique: h.unique,
            }
            .encode(&mut out);
            return Handled {
                reply: Some(out),
                completes_at_ns,
                in_place,
                deferred: None,
            };
        }
        let reply = match result {
            Ok(t) if OUT_HEADER_LEN + t.value.len() <= out_cap => {
                reply_bytes(h.unique, 0, &t.value)
            }
            Ok(t) => {
                tracing::debug!(
                    opcode = h.opcode,
                    need = OUT_HEADER_LEN + t.value.len(),
                    out_cap,
                    "reply does not fit the writable buffers"
                );
                error_reply(h.unique, Errno::RANGE)
            }
            Err(e) => error_reply(h.unique, e),
        };
        Handled {
            reply: (reply.len() <= out_cap).then_some(reply),
            completes_at_ns,
            in_place: 0,
            deferred: None,
        }
    }

    fn batch_forget(&self, ctx: &Context, args: &mut Cursor<'_>) {
        let Ok(b) = args.read::<BatchForgetIn>() else {
            return;
        };
        // Bounded by the request: each entry is read before it is acted on.
        for _ in 0..b.count {
            let Ok(one) = args.read::<ForgetOne>() else {
                return;
            };
            self.fs.forget(ctx, one.nodeid, one.nlookup);
        }
    }

    fn init(&self, args: &mut Cursor<'_>) -> OpResult {
        let init = InitIn::parse(args).map_err(parse_err)?;
        if init.major < abi::KERNEL_VERSION
            || (init.major == abi::KERNEL_VERSION && init.minor < abi::MIN_KERNEL_MINOR_VERSION)
        {
            tracing::warn!(
                major = init.major,
                minor = init.minor,
                "unsupported FUSE version"
            );
            return Err(Errno::PROTO);
        }
        // A new session on the same connection (guest reboot) starts over.
        self.initialized.store(false, Ordering::Release);
        if let Some(d) = &self.dax {
            // Slots of an earlier FUSE session on this connection.
            d.unmap_all();
        }
        let mut supported = init_flags::ASYNC_READ
            | init_flags::ATOMIC_O_TRUNC
            | init_flags::BIG_WRITES
            | init_flags::DO_READDIRPLUS
            | init_flags::READDIRPLUS_AUTO
            | init_flags::ASYNC_DIO
            | init_flags::PARALLEL_DIROPS
            | init_flags::MAX_PAGES
            | init_flags::INIT_EXT;
        supported |= self.fs.init(init.flags)?;
        // The guest asks for MAP_ALIGNMENT only when it has a DAX window;
        // grant it when the front-end gave us the channel to fill it.
        let window = self.dax.as_ref().filter(|d| d.window_offered());
        if window.is_some() {
            supported |= init_flags::MAP_ALIGNMENT;
        }
        let max_readahead = match self.opts.max_readahead {
            Some(cap) => init.max_readahead.min(cap),
            None => init.max_readahead,
        };
        let mut out = abi::InitOut {
            major: abi::KERNEL_VERSION,
            minor: abi::KERNEL_MINOR_VERSION,
            max_readahead,
            max_background: 64,
            congestion_threshold: 48,
            max_write: MAX_WRITE,
            time_gran: 1,
            max_pages: (MAX_READ / 4096) as u16,
            map_alignment: match window {
                Some(d) if init.flags & init_flags::MAP_ALIGNMENT != 0 => d.map_alignment_shift(),
                _ => 0,
            },
            ..abi::InitOut::default()
        };
        out.set_flags64(init.flags & supported);
        tracing::info!(
            vm = %self.metrics.name,
            minor = init.minor,
            flags = format_args!("{:#x}", out.flags64()),
            max_readahead,
            "FUSE session initialised"
        );
        self.initialized.store(true, Ordering::Release);
        let mut b = Vec::with_capacity(64);
        out.encode(&mut b);
        now(b)
    }

    fn create(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let c = a.read::<CreateIn>().map_err(parse_err)?;
        let name = a.name().map_err(parse_err)?;
        let at = in_dir(h, name);
        let how = Creation {
            mode: c.mode,
            umask: c.umask,
            flags: c.flags,
            open_flags: c.open_flags,
        };
        let t = self.fs.create(ctx, at, how)?;
        Ok(t.map(|(entry, opened)| {
            let mut b = entry_bytes(&entry);
            b.extend_from_slice(&open_bytes(&opened));
            b
        }))
    }

    /// READ: the data goes straight into the reply through `io`; the
    /// value is the bytes read.
    fn read(
        &self,
        ctx: &Context,
        h: &InHeader,
        a: &mut Cursor<'_>,
        out_cap: usize,
        io: &mut dyn PayloadIo,
    ) -> FsResult<usize> {
        let r = a.read::<ReadIn>().map_err(parse_err)?;
        let room = out_cap.saturating_sub(OUT_HEADER_LEN);
        let size = r
            .size
            .min(MAX_READ)
            .min(u32::try_from(room).unwrap_or(u32::MAX));
        self.fs.read(
            ctx,
            FileIo {
                nodeid: h.nodeid,
                fh: r.fh,
                offset: r.offset,
                size,
                flags: r.read_flags,
                at: OUT_HEADER_LEN,
                payload: io,
            },
        )
    }

    /// WRITE: the payload goes straight from the request to the file through `io`.
    fn write(
        &self,
        ctx: &Context,
        h: &InHeader,
        a: &mut Cursor<'_>,
        hlen: usize,
        io: &mut dyn PayloadIo,
    ) -> OpResult {
        let w = a.read::<WriteIn>().map_err(parse_err)?;
        let fits = WRITE_PAYLOAD_AT
            .checked_add(w.size as usize)
            .is_some_and(|end| end <= hlen);
        if w.size > MAX_WRITE || !fits {
            return Err(Errno::INVAL);
        }
        let t = self.fs.write(
            ctx,
            FileIo {
                nodeid: h.nodeid,
                fh: w.fh,
                offset: w.offset,
                size: w.size,
                flags: w.write_flags,
                at: WRITE_PAYLOAD_AT,
                payload: io,
            },
        )?;
        Ok(t.map(|n| {
            let mut b = Vec::with_capacity(8);
            abi::encode_write_out(n as u32, &mut b);
            b
        }))
    }

    fn link(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let l = a.read::<LinkIn>().map_err(parse_err)?;
        let name = a.name().map_err(parse_err)?;
        let e = self.fs.link(ctx, l.oldnodeid, in_dir(h, name))?;
        Ok(e.map(|e| entry_bytes(&e)))
    }

    fn mknod(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let m = a.read::<MknodIn>().map_err(parse_err)?;
        let name = a.name().map_err(parse_err)?;
        let how = Creation {
            mode: m.mode,
            umask: m.umask,
            flags: 0,
            open_flags: 0,
        };
        let e = self.fs.mknod(ctx, in_dir(h, name), how, m.rdev)?;
        Ok(e.map(|e| entry_bytes(&e)))
    }

    /// TMPFILE: CREATE's argument; the name (a placeholder) is not used.
    fn tmpfile(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let c = a.read::<CreateIn>().map_err(parse_err)?;
        let how = Creation {
            mode: c.mode,
            umask: c.umask,
            flags: c.flags,
            open_flags: c.open_flags,
        };
        let t = self.fs.tmpfile(ctx, h.nodeid, how)?;
        Ok(t.map(|(entry, opened)| {
            let mut b = entry_bytes(&entry);
            b.extend_from_slice(&open_bytes(&opened));
            b
        }))
    }

    fn getxattr(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let g = a.read::<GetxattrIn>().map_err(parse_err)?;
        let name = check_xattr_name(a.name().map_err(parse_err)?)?;
        let x = self
            .fs
            .getxattr(ctx, h.nodeid, name, g.size.min(XATTR_SIZE_MAX))?;
        Ok(x.map(xattr_bytes))
    }

    fn setxattr(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let s = a.read::<SetxattrIn>().map_err(parse_err)?;
        let name = check_xattr_name(a.name().map_err(parse_err)?)?;
        if s.size > XATTR_SIZE_MAX {
            return Err(Errno::TOOBIG);
        }
        let value = a.bytes(s.size as usize).map_err(parse_err)?;
        let t = self.fs.setxattr(ctx, h.nodeid, name, value, s.flags)?;
        Ok(t.map(|()| Vec::new()))
    }

    fn copy_file_range(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let c = a.read::<CopyFileRangeIn>().map_err(parse_err)?;
        if c.flags != 0 {
            return Err(Errno::INVAL);
        }
        let copy = CopyRange {
            nodeid_in: h.nodeid,
            fh_in: c.fh_in,
            off_in: c.off_in,
            nodeid_out: c.nodeid_out,
            fh_out: c.fh_out,
            off_out: c.off_out,
            // Bounded before any work: a short copy is a valid answer and
            // the guest goes on with the rest.
            len: c.len.min(MAX_COPY),
        };
        let t = self.fs.copy_file_range(ctx, copy)?;
        Ok(t.map(|n| {
            let mut b = Vec::with_capacity(8);
            abi::encode_write_out(n as u32, &mut b);
            b
        }))
    }

    /// SETLKW: one try on the request path; on a conflict the wait goes
    /// off it (a [`Deferred`] reply), so the holder's unlock, queued
    /// behind, is still served.
    fn setlkw(&self, ctx: &Context, h: &InHeader, lock: &LockRequest, out_cap: usize) -> Handled {
        let first = self.fs.setlk(ctx, h.nodeid, lock);
        if !matches!(first, Err(Errno::AGAIN)) || out_cap < OUT_HEADER_LEN {
            let first = first.map(|t| t.map(|()| Vec::new()));
            return self.finish(h, first, out_cap, 0);
        }
        if self.waits.closing.load(Ordering::Acquire) {
            return self.finish(h, Err(Errno::INTR), out_cap, 0);
        }
        let stop = Arc::new(AtomicBool::new(false));
        {
            let mut waiting = self.waits.lock();
            // Checked under the table's lock, which `interrupt` holds too.
            if self.waits.interrupted_early(h.unique) {
                drop(waiting);
                return self.finish(h, Err(Errno::INTR), out_cap, 0);
            }
            if waiting.len() >= MAX_LOCK_WAITERS {
                tracing::warn!(vm = %self.metrics.name, "too many SETLKW waits; answering ENOLCK");
                drop(waiting);
                return self.finish(h, Err(Errno::NOLCK), out_cap, 0);
            }
            waiting.insert(h.unique, stop.clone());
        }
        let waiter = match self.fs.lock_waiter(ctx, h.nodeid, lock) {
            Ok(w) => w,
            Err(e) => {
                self.waits.lock().remove(&h.unique);
                return self.finish(h, Err(e), out_cap, 0);
            }
        };
        let entry = WaitEntry {
            waits: self.waits.clone(),
            unique: h.unique,
        };
        let unique = h.unique;
        let run = move || {
            let stopped = || stop.load(Ordering::Acquire);
            let result = waiter(&stopped);
            drop(entry);
            match result {
                Ok(()) => reply_bytes(unique, 0, &[]),
                Err(e) => error_reply(unique, e),
            }
        };
        Handled {
            deferred: Some(Deferred(Box::new(run))),
            ..Handled::default()
        }
    }

    /// The session's SETLKW waits (the transport stops them when the
    /// connection ends).
    pub fn lock_waits(&self) -> &Arc<LockWaits> {
        &self.waits
    }

    fn setup_mapping(&self, nodeid: u64, a: &mut Cursor<'_>) -> OpResult {
        let Some(dax) = &self.dax else {
            return Err(Errno::NOSYS);
        };
        let m = a.read::<SetupMappingIn>().map_err(parse_err)?;
        dax.setup_mapping(&self.fs, nodeid, &m)?;
        now(Vec::new())
    }

    fn remove_mapping(&self, a: &mut Cursor<'_>) -> OpResult {
        let Some(dax) = &self.dax else {
            return Err(Errno::NOSYS);
        };
        let r = a.read::<RemoveMappingIn>().map_err(parse_err)?;
        if r.count == 0 || r.count > abi::REMOVEMAPPING_MAX_ENTRY {
            return Err(Errno::INVAL);
        }
        // Bounded above: at most a page of entries.
        let mut ranges = Vec::with_capacity(r.count as usize);
        for _ in 0..r.count {
            ranges.push(a.read::<RemoveMappingOne>().map_err(parse_err)?);
        }
        dax.remove_mappings(&ranges)?;
        now(Vec::new())
    }

    fn ioctl(&self, ctx: &Context, a: &mut Cursor<'_>) -> OpResult {
        let Some(handler) = &self.ioctl else {
            return Err(Errno::NOTTY);
        };
        let ioc = a.read::<IoctlIn>().map_err(|_| Errno::INVAL)?;
        handler.ioctl(ctx, &self.fs, &ioc, a.rest())
    }

    fn readdir(
        &self,
        ctx: &Context,
        h: &InHeader,
        a: &mut Cursor<'_>,
        plus: bool,
        out_cap: usize,
    ) -> OpResult {
        let r = a.read::<ReadIn>().map_err(parse_err)?;
        let size = (r.size as usize)
            .min(out_cap.saturating_sub(OUT_HEADER_LEN))
            .min(MAX_READ as usize);
        // The kernel names the directory in the header; a guest that names
        // another one only gets lookups it could make itself.
        let dir_nodeid = h.nodeid;
        let mut buf = Vec::with_capacity(size.min(64 * 1024));
        let t = self.fs.readdir(ctx, r.fh, r.offset, &mut |e| {
            let dirent = abi::dirent_size(e.name.len());
            let need = if plus {
                abi::ENTRY_OUT_LEN + dirent
            } else {
                dirent
            };
            if buf.len() + need > size {
                return false;
            }
            if plus {
                let entry = if e.name == b"." || e.name == b".." {
                    EntryOut::default()
                } else {
                    match self.fs.lookup(ctx, dir_nodeid, &e.name) {
                        Ok(entry) => entry.value,
                        // Gone since getdents: skip it.
                        Err(_) => return true,
                    }
                };
                entry.encode(&mut buf);
            }
            abi::encode_dirent(e.ino, e.next_off, e.typ, &e.name, &mut buf);
            true
        })?;
        Ok(t.map(|()| buf))
    }

    fn mkdir(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let m = a.read::<MkdirIn>().map_err(parse_err)?;
        let name = a.name().map_err(parse_err)?;
        let at = in_dir(h, name);
        let how = Creation {
            mode: m.mode,
            umask: m.umask,
            flags: 0,
            open_flags: 0,
        };
        let e = self.fs.mkdir(ctx, at, how)?;
        Ok(e.map(|e| entry_bytes(&e)))
    }

    fn symlink(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let name = a.name().map_err(parse_err)?;
        let target = a.name().map_err(parse_err)?;
        let at = in_dir(h, name);
        let e = self.fs.symlink(ctx, at, target)?;
        Ok(e.map(|e| entry_bytes(&e)))
    }

    fn unlink(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>, dir: bool) -> OpResult {
        let name = a.name().map_err(parse_err)?;
        let at = in_dir(h, name);
        let t = self.fs.unlink(ctx, at, dir)?;
        Ok(t.map(|()| Vec::new()))
    }

    fn rename(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>, v2: bool) -> OpResult {
        let (newdir, flags) = if v2 {
            let r = a.read::<Rename2In>().map_err(parse_err)?;
            (r.newdir, r.flags)
        } else {
            (a.read::<RenameIn>().map_err(parse_err)?.newdir, 0)
        };
        let old = a.name().map_err(parse_err)?;
        let new = a.name().map_err(parse_err)?;
        let from = in_dir(h, old);
        let to = Named {
            parent: newdir,
            name: new,
        };
        let t = self.fs.rename(ctx, from, to, flags)?;
        Ok(t.map(|()| Vec::new()))
    }
}

impl<F: FileSystem> FuseHandler for Server<F> {
    fn handle_io(&self, req: Incoming<'_>, io: &mut dyn PayloadIo) -> Handled {
        self.handle_request(req, io)
    }

    fn close_waits(&self) {
        self.waits.close();
    }
}
