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
    AttrReply, Context, Created, Creation, DirEntry, DirSink, FileIo, FileSystem, FsResult,
    HostFile, Named, Opened, Timed,
};
pub use payload::{BufferIo, Direction, PayloadIo, Transfer};
pub use seams::{DaxMapper, IoctlHandler};

use crate::abi::{
    self, init_flags, opcode, BatchForgetIn, CreateIn, Cursor, EntryOut, ForgetIn, ForgetOne,
    FsyncIn, GetattrIn, InHeader, InitIn, IoctlIn, MkdirIn, OpenIn, OutHeader, ParseRequestError,
    ReadIn, ReleaseIn, RemoveMappingIn, RemoveMappingOne, Rename2In, RenameIn, SetattrIn,
    SetupMappingIn, WriteIn,
};
use crate::metrics::VmMetrics;
use rustix::io::Errno;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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

/// Server options.
#[derive(Debug, Clone, Copy)]
pub struct ServerOptions {
    /// Cap on the guest's readahead (bytes); `None` keeps the guest's value.
    pub max_readahead: Option<u32>,
}

/// What to do with one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handled {
    /// Reply bytes (header included); `None`: the request takes no reply.
    pub reply: Option<Vec<u8>>,
    /// Device time at which the reply may be released (data path only).
    pub completes_at_ns: Option<u64>,
    /// READ data already placed in the reply buffers right after `reply`
    /// (by [`PayloadIo::transfer`]); the reply's length is
    /// `reply.len() + in_place`. Always 0 from [`Server::handle`].
    pub in_place: usize,
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
}

/// A FUSE server for one VM session over the filesystem `F`.
pub struct Server<F: FileSystem> {
    fs: F,
    metrics: Arc<VmMetrics>,
    opts: ServerOptions,
    initialized: AtomicBool,
    dax: Option<Arc<dyn DaxMapper>>,
    ioctl: Option<Arc<dyn IoctlHandler>>,
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
                    completes_at_ns: None,
                    in_place: 0,
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
            opcode::INTERRUPT => return Handled::default(),
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
                    self.fs.release(&ctx, h.nodeid, r.fh);
                    now(Vec::new())
                })
            }
            opcode::FLUSH => {
                // fuse_flush_in starts with the handle.
                let fh = args.read::<u64>().map_err(parse_err);
                fh.and_then(|fh| self.fs.flush(&ctx, h.nodeid, fh))
                    .map(|t| t.map(|()| Vec::new()))
            }
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
}
