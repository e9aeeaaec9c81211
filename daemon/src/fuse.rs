//! The FUSE server: one request's bytes in, one reply's bytes out, plus the
//! moment (device time) the reply may be released.
//!
//! It knows nothing about virtqueues: [`crate::backend`] copies the readable
//! part of a descriptor chain into a buffer, calls [`FuseServer::handle`],
//! writes the reply into the writable part and paces its release. That keeps
//! the parser testable with plain byte slices.
//!
//! READ and WRITE go through the device model: the file range is mapped to
//! pool addresses ([`crate::pool`]), charged with `Device::access` at the
//! request's arrival time, and the reply is held until `completes_at_ns`.

use crate::abi::{
    self, init_flags, opcode, Cursor, EntryOut, InHeader, OutHeader, ParseRequestError,
};
use crate::dax::{DaxSession, SetupMapping, MAP_ALIGNMENT_SHIFT, MAX_REMOVEMAPPING};
use crate::fs::{Caller, PassthroughFs};
use crate::metrics::VmMetrics;
use crate::pool::SharedDevice;
use cxlfs_device_model::Op;
use rustix::io::Errno;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Largest WRITE payload accepted (advertised as `max_write`).
pub const MAX_WRITE: u32 = 1 << 20;
/// Largest READ served (and `max_pages` * 4 KiB).
pub const MAX_READ: u32 = 1 << 20;
/// Largest request the transport needs to buffer: a maximal WRITE plus headers.
pub const MAX_REQUEST: usize = MAX_WRITE as usize + 4096;
/// Bytes of a WRITE request before its payload (`fuse_in_header` + `fuse_write_in`).
pub const WRITE_PAYLOAD_AT: usize = abi::IN_HEADER_LEN + 40;

/// Moves READ and WRITE payloads between a host file and the request /
/// reply buffers, so that the transport can do it without a bounce buffer
/// (`preadv` / `pwritev` on guest memory, see [`crate::chain`]).
pub trait PayloadIo {
    /// READ: reads up to `len` bytes of `file` at `offset` into the reply
    /// at byte `at`; returns the bytes read (short only at end of file).
    fn read_payload(
        &mut self,
        file: &File,
        offset: u64,
        at: usize,
        len: usize,
    ) -> io::Result<usize>;
    /// WRITE: writes the `len` request bytes that start at request byte
    /// `at` to `file` at `offset`; returns the bytes written (all of them).
    fn write_payload(
        &mut self,
        file: &File,
        offset: u64,
        at: usize,
        len: usize,
    ) -> io::Result<usize>;
}

/// [`PayloadIo`] over plain byte buffers: the request in `req`, READ data
/// collected in `data` (then appended to the reply). Used by
/// [`FuseServer::handle`].
struct BufferIo<'a> {
    req: &'a [u8],
    data: Vec<u8>,
}

impl PayloadIo for BufferIo<'_> {
    fn read_payload(
        &mut self,
        file: &File,
        offset: u64,
        _at: usize,
        len: usize,
    ) -> io::Result<usize> {
        self.data.resize(len, 0);
        let mut done = 0usize;
        while done < len {
            match file.read_at(&mut self.data[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        self.data.truncate(done);
        Ok(done)
    }

    fn write_payload(
        &mut self,
        file: &File,
        offset: u64,
        at: usize,
        len: usize,
    ) -> io::Result<usize> {
        let data = at
            .checked_add(len)
            .and_then(|end| self.req.get(at..end))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        file.write_all_at(data, offset)?;
        Ok(len)
    }
}

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
    /// (by [`PayloadIo::read_payload`]); the reply's length is
    /// `reply.len() + in_place`. Always 0 from [`FuseServer::handle`].
    pub in_place: usize,
}

/// A FUSE server for one VM session.
#[derive(Debug)]
pub struct FuseServer {
    fs: PassthroughFs,
    shared: Arc<SharedDevice>,
    metrics: Arc<VmMetrics>,
    opts: ServerOptions,
    initialized: AtomicBool,
    dax: Option<Arc<DaxSession>>,
    control: Option<Arc<crate::control::Controller>>,
}

type OpResult = Result<Vec<u8>, Errno>;

fn parse_err(e: ParseRequestError) -> Errno {
    tracing::debug!(error = %e, "malformed FUSE request");
    Errno::INVAL
}

fn out_with_header(unique: u64, error: i32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(abi::OUT_HEADER_LEN + payload.len());
    OutHeader {
        len: (abi::OUT_HEADER_LEN + payload.len()) as u32,
        error,
        unique,
    }
    .encode(&mut out);
    out.extend_from_slice(payload);
    out
}

fn io_errno(e: &io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

/// An error reply.
pub fn error_reply(unique: u64, e: Errno) -> Vec<u8> {
    out_with_header(unique, -e.raw_os_error(), &[])
}

impl FuseServer {
    /// A server over `fs`.
    pub fn new(
        fs: PassthroughFs,
        shared: Arc<SharedDevice>,
        metrics: Arc<VmMetrics>,
        opts: ServerOptions,
    ) -> Self {
        FuseServer {
            fs,
            shared,
            metrics,
            opts,
            initialized: AtomicBool::new(false),
            dax: None,
            control: None,
        }
    }

    /// Takes cache hints from the guest (`FUSE_IOCTL`, see [`crate::hint_ioctl`]).
    pub fn with_control(mut self, control: Option<Arc<crate::control::Controller>>) -> Self {
        self.control = control;
        self
    }

    /// Serves the DAX window of this VM through `dax` (SETUPMAPPING,
    /// REMOVEMAPPING, the map alignment in INIT).
    pub fn with_dax(mut self, dax: Option<Arc<DaxSession>>) -> Self {
        self.dax = dax;
        self
    }

    /// The DAX window of this session, if the daemon has one.
    pub fn dax(&self) -> Option<&Arc<DaxSession>> {
        self.dax.as_ref()
    }

    /// The filesystem.
    pub fn fs(&self) -> &PassthroughFs {
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
        let mut handled = self.handle_io(arrival_ns, req, req.len(), out_cap, &mut io);
        if handled.in_place > 0 {
            if let Some(reply) = handled.reply.as_mut() {
                reply.extend_from_slice(&io.data[..handled.in_place]);
            }
            handled.in_place = 0;
        }
        handled
    }

    /// Handles one request whose first bytes are `req`. `req_total` is the
    /// size of the whole request part of the chain. For a WRITE, `req` may
    /// stop after the WRITE arguments ([`WRITE_PAYLOAD_AT`]): the payload is
    /// moved by `io`, as is READ data (then `Handled::in_place` > 0). Any
    /// other request must be all in `req`.
    pub fn handle_io(
        &self,
        arrival_ns: u64,
        req: &[u8],
        req_total: usize,
        out_cap: usize,
        io: &mut dyn PayloadIo,
    ) -> Handled {
        let mut c = Cursor::new(req);
        let h = match InHeader::parse(&mut c) {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(error = %e, "request shorter than a FUSE header");
                self.metrics.count_request(opcode::MAX);
                return Handled {
                    reply: (out_cap >= abi::OUT_HEADER_LEN).then(|| error_reply(0, Errno::INVAL)),
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
        if hlen > supplied || hlen < abi::IN_HEADER_LEN {
            tracing::debug!(
                error = %ParseRequestError::LengthMismatch { header: h.len, actual: supplied },
                "bad FUSE request length"
            );
            return self.finish(&h, Err(Errno::INVAL), out_cap, None, 0);
        }
        // Arguments are what the header claims, not what the chain holds.
        let mut args = Cursor::new(&req[abi::IN_HEADER_LEN..hlen.min(req.len())]);
        let mut completes_at = None;
        let mut in_place = 0usize;
        let result = match h.opcode {
            opcode::FORGET => {
                if let Ok(n) = args.u64() {
                    self.fs.forget(h.nodeid, n);
                }
                return Handled::default();
            }
            opcode::BATCH_FORGET => {
                self.batch_forget(&mut args);
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
                self.fs.reset();
                Ok(Vec::new())
            }
            opcode::LOOKUP => self.lookup(&h, &mut args),
            opcode::GETATTR => self.getattr(&h, &mut args),
            opcode::SETATTR => self.setattr(&h, &mut args),
            opcode::OPEN => self.open(&h, &mut args),
            opcode::CREATE => self.create(&h, &mut args),
            opcode::READ => self
                .read(&mut args, arrival_ns, out_cap, io)
                .map(|(n, at)| {
                    in_place = n;
                    completes_at = at;
                    Vec::new()
                }),
            opcode::WRITE => self.write(&mut args, hlen, arrival_ns, &mut completes_at, io),
            opcode::RELEASE | opcode::RELEASEDIR => args.u64().map_err(parse_err).map(|fh| {
                self.fs.release(fh);
                Vec::new()
            }),
            opcode::FLUSH => Ok(Vec::new()),
            opcode::FSYNC | opcode::FSYNCDIR => self.fsync(&mut args),
            opcode::OPENDIR => self.opendir(&h),
            opcode::READDIR => self.readdir(&mut args, false, out_cap),
            opcode::READDIRPLUS => self.readdir(&mut args, true, out_cap),
            opcode::MKDIR => self.mkdir(&h, &mut args),
            opcode::SYMLINK => self.symlink(&h, &mut args),
            opcode::READLINK => self.fs.readlink(h.nodeid),
            opcode::UNLINK => self.unlink(&h, &mut args, false),
            opcode::RMDIR => self.unlink(&h, &mut args, true),
            opcode::RENAME => self.rename(&h, &mut args, false),
            opcode::RENAME2 => self.rename(&h, &mut args, true),
            opcode::STATFS => self.statfs(&h),
            opcode::SETUPMAPPING => self.setup_mapping(h.nodeid, &mut args),
            opcode::REMOVEMAPPING => self.remove_mapping(&mut args),
            opcode::IOCTL => match &self.control {
                Some(c) => {
                    crate::hint_ioctl::handle_ioctl(c, &self.fs, &self.metrics.name, &mut args).map(
                        |r| {
                            completes_at = r.completes_at_ns;
                            r.payload
                        },
                    )
                }
                None => Err(Errno::NOTTY),
            },
            _ => Err(Errno::NOSYS),
        };
        self.finish(&h, result, out_cap, completes_at, in_place)
    }

    fn finish(
        &self,
        h: &InHeader,
        result: OpResult,
        out_cap: usize,
        completes_at_ns: Option<u64>,
        in_place: usize,
    ) -> Handled {
        if in_place > 0 {
            // READ data is already in the reply buffers; only the header is
            // left to write (the size was clamped to the room).
            let mut out = Vec::with_capacity(abi::OUT_HEADER_LEN);
            OutHeader {
                len: (abi::OUT_HEADER_LEN + in_place) as u32,
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
            Ok(payload) if abi::OUT_HEADER_LEN + payload.len() <= out_cap => {
                out_with_header(h.unique, 0, &payload)
            }
            Ok(payload) => {
                tracing::debug!(
                    opcode = h.opcode,
                    need = abi::OUT_HEADER_LEN + payload.len(),
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

    fn batch_forget(&self, args: &mut Cursor<'_>) {
        let Ok(count) = args.u32() else { return };
        if args.skip(4).is_err() {
            return;
        }
        for _ in 0..count {
            let (Ok(nodeid), Ok(n)) = (args.u64(), args.u64()) else {
                return;
            };
            self.fs.forget(nodeid, n);
        }
    }

    fn init(&self, args: &mut Cursor<'_>) -> OpResult {
        let init = abi::InitIn::parse(args).map_err(parse_err)?;
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
        if self.initialized.swap(false, Ordering::AcqRel) {
            // A new session on the same connection (guest reboot): start over.
            self.fs.reset();
        }
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
        if self.fs.cache == crate::fs::CacheMode::Auto {
            supported |= init_flags::AUTO_INVAL_DATA;
        }
        // The guest asks for MAP_ALIGNMENT only when it has a DAX window;
        // grant it when the front-end gave us the back-end channel to fill it.
        let window = self.dax.as_ref().is_some_and(|d| d.window_offered());
        if window {
            supported |= init_flags::MAP_ALIGNMENT;
        }
        let max_readahead = match self.opts.max_readahead {
            Some(cap) => init.max_readahead.min(cap),
            None => init.max_readahead,
        };
        let out = abi::InitOut {
            major: abi::KERNEL_VERSION,
            minor: abi::KERNEL_MINOR_VERSION,
            max_readahead,
            flags: init.flags & supported,
            max_background: 64,
            congestion_threshold: 48,
            max_write: MAX_WRITE,
            time_gran: 1,
            max_pages: (MAX_READ / 4096) as u16,
            map_alignment: if window && init.flags & init_flags::MAP_ALIGNMENT != 0 {
                MAP_ALIGNMENT_SHIFT
            } else {
                0
            },
        };
        tracing::info!(
            vm = %self.metrics.name,
            minor = init.minor,
            flags = format_args!("{:#x}", out.flags),
            max_readahead,
            "FUSE session initialised"
        );
        self.initialized.store(true, Ordering::Release);
        let mut b = Vec::with_capacity(64);
        out.encode(&mut b);
        Ok(b)
    }

    fn entry_bytes(e: &EntryOut) -> Vec<u8> {
        let mut b = Vec::with_capacity(abi::ENTRY_OUT_LEN);
        e.encode(&mut b);
        b
    }

    fn caller(h: &InHeader) -> Caller {
        Caller {
            uid: h.uid,
            gid: h.gid,
        }
    }

    fn lookup(&self, h: &InHeader, args: &mut Cursor<'_>) -> OpResult {
        let name = args.name().map_err(parse_err)?;
        Ok(Self::entry_bytes(&self.fs.lookup(h.nodeid, name)?))
    }

    fn attr_bytes(&self, attr: &abi::Attr) -> Vec<u8> {
        let t = self.fs.cache.timeout();
        let mut b = Vec::with_capacity(16 + abi::ATTR_LEN);
        abi::encode_attr_out(t.as_secs(), t.subsec_nanos(), attr, &mut b);
        b
    }

    fn getattr(&self, h: &InHeader, args: &mut Cursor<'_>) -> OpResult {
        // fuse_getattr_in: getattr_flags, dummy, fh.
        let fh = match (args.u32(), args.u32(), args.u64()) {
            (Ok(flags), Ok(_), Ok(fh)) if flags & abi::GETATTR_FH != 0 => Some(fh),
            _ => None,
        };
        let attr = self.fs.getattr(h.nodeid, fh)?;
        Ok(self.attr_bytes(&attr))
    }

    fn setattr(&self, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let p = |e| parse_err(e);
        let valid = a.u32().map_err(p)?;
        a.skip(4).map_err(p)?;
        let fh = a.u64().map_err(p)?;
        let size = a.u64().map_err(p)?;
        let _lock_owner = a.u64().map_err(p)?;
        let atime = a.u64().map_err(p)?;
        let mtime = a.u64().map_err(p)?;
        let _ctime = a.u64().map_err(p)?;
        let atimensec = a.u32().map_err(p)?;
        let mtimensec = a.u32().map_err(p)?;
        let _ctimensec = a.u32().map_err(p)?;
        let mode = a.u32().map_err(p)?;
        a.skip(4).map_err(p)?;
        let uid = a.u32().map_err(p)?;
        let gid = a.u32().map_err(p)?;
        let fh = (valid & abi::fattr::FH != 0).then_some(fh);
        let attr = self.fs.setattr(
            h.nodeid,
            valid,
            fh,
            mode,
            uid,
            gid,
            size,
            (atime, atimensec),
            (mtime, mtimensec),
        )?;
        Ok(self.attr_bytes(&attr))
    }

    fn open(&self, h: &InHeader, args: &mut Cursor<'_>) -> OpResult {
        let flags = args.u32().map_err(parse_err)?;
        let (fh, open_flags) = self.fs.open(h.nodeid, flags)?;
        let mut b = Vec::with_capacity(16);
        abi::encode_open_out(fh, open_flags, &mut b);
        Ok(b)
    }

    fn create(&self, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let flags = a.u32().map_err(parse_err)?;
        let mode = a.u32().map_err(parse_err)?;
        let umask = a.u32().map_err(parse_err)?;
        a.skip(4).map_err(parse_err)?;
        let name = a.name().map_err(parse_err)?;
        let (entry, fh, open_flags) =
            self.fs
                .create(Self::caller(h), h.nodeid, name, flags, mode, umask)?;
        let mut b = Self::entry_bytes(&entry);
        abi::encode_open_out(fh, open_flags, &mut b);
        Ok(b)
    }

    /// READ: the data goes straight into the reply through `io`; returns
    /// `(bytes read, release time)`.
    fn read(
        &self,
        a: &mut Cursor<'_>,
        arrival_ns: u64,
        out_cap: usize,
        io: &mut dyn PayloadIo,
    ) -> Result<(usize, Option<u64>), Errno> {
        let fh = a.u64().map_err(parse_err)?;
        let offset = a.u64().map_err(parse_err)?;
        let size = a.u32().map_err(parse_err)?;
        let room = out_cap.saturating_sub(abi::OUT_HEADER_LEN) as u32;
        let size = size.min(MAX_READ).min(room);
        let handle = self.fs.handle(fh)?;
        let n = io
            .read_payload(&handle.file, offset, abi::OUT_HEADER_LEN, size as usize)
            .map_err(|e| io_errno(&e))?;
        self.metrics
            .read_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok((
            n,
            self.charge(arrival_ns, Op::Read, handle.inode.key, offset, n),
        ))
    }

    /// WRITE: the payload goes straight from the request to the file through `io`.
    fn write(
        &self,
        a: &mut Cursor<'_>,
        hlen: usize,
        arrival_ns: u64,
        completes_at: &mut Option<u64>,
        io: &mut dyn PayloadIo,
    ) -> OpResult {
        let fh = a.u64().map_err(parse_err)?;
        let offset = a.u64().map_err(parse_err)?;
        let size = a.u32().map_err(parse_err)?;
        // write_flags, lock_owner, flags, padding.
        a.skip(4 + 8 + 4 + 4).map_err(parse_err)?;
        if size > MAX_WRITE || WRITE_PAYLOAD_AT + size as usize > hlen {
            return Err(Errno::INVAL);
        }
        let handle = self.fs.handle(fh)?;
        // DAX: the pool may hold (dirty) pages of this range; no plane fill
        // may read the file until the new bytes are in it.
        let fill_guard = self.dax.is_some().then(|| self.shared.plane_fill_guard());
        if fill_guard.is_some() {
            self.shared
                .evict_file_range(handle.inode.key, offset, u64::from(size));
        }
        let n = io
            .write_payload(&handle.file, offset, WRITE_PAYLOAD_AT, size as usize)
            .map_err(|e| io_errno(&e))?;
        drop(fill_guard);
        self.metrics
            .write_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
        *completes_at = self.charge(arrival_ns, Op::Write, handle.inode.key, offset, n);
        let mut b = Vec::with_capacity(8);
        b.extend_from_slice(&size.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        Ok(b)
    }

    /// Charges the device; returns the release time (`None`: nothing to wait for).
    fn charge(
        &self,
        arrival_ns: u64,
        op: Op,
        key: crate::pool::FileKey,
        offset: u64,
        len: usize,
    ) -> Option<u64> {
        if len == 0 {
            return None;
        }
        match self.shared.charge(arrival_ns, op, key, offset, len as u64) {
            Ok(c) => {
                self.metrics.record_charge(&c);
                Some(c.completes_at_ns)
            }
            Err(e) => {
                tracing::warn!(error = %e, "device charge failed; reply not delayed");
                None
            }
        }
    }

    /// SETUPMAPPING: `{fh, foffset, len, flags, moffset}`.
    fn setup_mapping(&self, nodeid: u64, a: &mut Cursor<'_>) -> OpResult {
        let Some(dax) = &self.dax else {
            return Err(Errno::NOSYS);
        };
        let m = SetupMapping {
            fh: a.u64().map_err(parse_err)?,
            foffset: a.u64().map_err(parse_err)?,
            len: a.u64().map_err(parse_err)?,
            flags: a.u64().map_err(parse_err)?,
            moffset: a.u64().map_err(parse_err)?,
        };
        dax.setup_mapping(&self.fs, nodeid, m)?;
        Ok(Vec::new())
    }

    /// REMOVEMAPPING: `{u32 count}` then `count` × `{moffset, len}`.
    fn remove_mapping(&self, a: &mut Cursor<'_>) -> OpResult {
        let Some(dax) = &self.dax else {
            return Err(Errno::NOSYS);
        };
        let count = a.u32().map_err(parse_err)?;
        if count == 0 || count > MAX_REMOVEMAPPING {
            return Err(Errno::INVAL);
        }
        let mut ranges = Vec::with_capacity(count as usize);
        for _ in 0..count {
            ranges.push((a.u64().map_err(parse_err)?, a.u64().map_err(parse_err)?));
        }
        dax.remove_mappings(&ranges)?;
        Ok(Vec::new())
    }

    fn fsync(&self, a: &mut Cursor<'_>) -> OpResult {
        let fh = a.u64().map_err(parse_err)?;
        let flags = a.u32().map_err(parse_err)?;
        if self.dax.is_some() {
            // Stores made through DAX windows sit in the pool until written back.
            let handle = self.fs.handle(fh)?;
            if let Err(e) = self.shared.sync_file_range(handle.inode.key, 0, u64::MAX) {
                tracing::warn!(error = %e, "fsync: cannot write back the file's pool pages");
                return Err(Errno::IO);
            }
        }
        self.fs.fsync(fh, flags & 1 != 0)?;
        Ok(Vec::new())
    }

    fn opendir(&self, h: &InHeader) -> OpResult {
        let (fh, flags) = self.fs.opendir(h.nodeid)?;
        let mut b = Vec::with_capacity(16);
        abi::encode_open_out(fh, flags, &mut b);
        Ok(b)
    }

    fn readdir(&self, a: &mut Cursor<'_>, plus: bool, out_cap: usize) -> OpResult {
        let fh = a.u64().map_err(parse_err)?;
        let offset = a.u64().map_err(parse_err)?;
        let size = a.u32().map_err(parse_err)? as usize;
        let size = size
            .min(out_cap.saturating_sub(abi::OUT_HEADER_LEN))
            .min(MAX_READ as usize);
        let dir_nodeid = self.fs.handle(fh)?.inode.nodeid;
        let mut buf = Vec::with_capacity(size.min(64 * 1024));
        self.fs.readdir(fh, offset, |e| {
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
                    match self.fs.lookup(dir_nodeid, &e.name) {
                        Ok(entry) => entry,
                        // Gone since getdents: skip it.
                        Err(_) => return true,
                    }
                };
                entry.encode(&mut buf);
            }
            abi::encode_dirent(e.ino, e.next_off, e.typ, &e.name, &mut buf);
            true
        })?;
        Ok(buf)
    }

    fn mkdir(&self, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let mode = a.u32().map_err(parse_err)?;
        let umask = a.u32().map_err(parse_err)?;
        let name = a.name().map_err(parse_err)?;
        let e = self
            .fs
            .mkdir(Self::caller(h), h.nodeid, name, mode, umask)?;
        Ok(Self::entry_bytes(&e))
    }

    fn symlink(&self, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let name = a.name().map_err(parse_err)?;
        let target = a.name().map_err(parse_err)?;
        let e = self.fs.symlink(Self::caller(h), h.nodeid, name, target)?;
        Ok(Self::entry_bytes(&e))
    }

    fn unlink(&self, h: &InHeader, a: &mut Cursor<'_>, dir: bool) -> OpResult {
        let name = a.name().map_err(parse_err)?;
        self.fs.unlink(h.nodeid, name, dir)?;
        Ok(Vec::new())
    }

    fn rename(&self, h: &InHeader, a: &mut Cursor<'_>, v2: bool) -> OpResult {
        let newdir = a.u64().map_err(parse_err)?;
        let flags = if v2 {
            let f = a.u32().map_err(parse_err)?;
            a.skip(4).map_err(parse_err)?;
            f
        } else {
            0
        };
        let old = a.name().map_err(parse_err)?;
        let new = a.name().map_err(parse_err)?;
        self.fs.rename(h.nodeid, old, newdir, new, flags)?;
        Ok(Vec::new())
    }

    fn statfs(&self, h: &InHeader) -> OpResult {
        let st = self.fs.statfs(h.nodeid)?;
        let mut b = Vec::with_capacity(80);
        st.encode(&mut b);
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::CacheMode;
    use cxlfs_device_model::{Device, DeviceConfig};

    fn server(dir: &std::path::Path) -> FuseServer {
        server_at(dir, 100)
    }

    fn server_at(dir: &std::path::Path, cxl_ratio: u8) -> FuseServer {
        let cfg = DeviceConfig::default()
            .with_overrides(&["cache.size_bytes=1MiB", "nand.read_ns=30us"])
            .unwrap();
        let shared = Arc::new(SharedDevice::with_placement(
            Device::new(cfg).unwrap(),
            crate::placement::Placement::new(cxl_ratio).unwrap(),
        ));
        let fs = PassthroughFs::new(dir, CacheMode::Never, shared.clone()).unwrap();
        FuseServer::new(
            fs,
            shared,
            Arc::new(VmMetrics::new("t")),
            ServerOptions {
                max_readahead: None,
            },
        )
    }

    fn req(op: u32, unique: u64, nodeid: u64, args: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        InHeader {
            len: (abi::IN_HEADER_LEN + args.len()) as u32,
            opcode: op,
            unique,
            nodeid,
            ..Default::default()
        }
        .encode(&mut b);
        b.extend_from_slice(args);
        b
    }

    fn init_args() -> Vec<u8> {
        let mut a = Vec::new();
        for v in [7u32, 31, 128 * 1024, 0xffff_ffff] {
            a.extend_from_slice(&v.to_le_bytes());
        }
        a.extend_from_slice(&[0u8; 48]);
        a
    }

    fn reply_header(r: &Handled) -> OutHeader {
        OutHeader::parse(&mut Cursor::new(r.reply.as_ref().unwrap())).unwrap()
    }

    #[test]
    fn malformed_requests_get_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let s = server(dir.path());
        // Shorter than a header.
        for n in 0..abi::IN_HEADER_LEN {
            let r = s.handle(0, &vec![0xff; n], 4096);
            assert_eq!(reply_header(&r).error, -libc::EINVAL);
        }
        // Header length beyond the buffer.
        let mut b = req(opcode::INIT, 9, 0, &init_args());
        b[0..4].copy_from_slice(&10_000u32.to_le_bytes());
        let r = s.handle(0, &b, 4096);
        assert_eq!(reply_header(&r).error, -libc::EINVAL);
        assert_eq!(reply_header(&r).unique, 9);
        // Header length below the header size.
        b[0..4].copy_from_slice(&8u32.to_le_bytes());
        assert_eq!(reply_header(&s.handle(0, &b, 4096)).error, -libc::EINVAL);
        // No room for even a reply header: no reply.
        assert_eq!(s.handle(0, &b, 8).reply, None);
        // Init, then truncated argument structs for many opcodes.
        let r = s.handle(0, &req(opcode::INIT, 1, 0, &init_args()), 4096);
        assert_eq!(reply_header(&r).error, 0);
        for op in [
            opcode::LOOKUP,
            opcode::SETATTR,
            opcode::OPEN,
            opcode::CREATE,
            opcode::READ,
            opcode::WRITE,
            opcode::MKDIR,
            opcode::RENAME,
            opcode::RENAME2,
            opcode::READDIR,
            opcode::READDIRPLUS,
            opcode::FSYNC,
            opcode::UNLINK,
            opcode::SYMLINK,
        ] {
            for n in [0usize, 3, 7, 12] {
                let r = s.handle(0, &req(op, 5, 1, &vec![0x41; n]), 4096);
                assert!(reply_header(&r).error < 0, "op {op} with {n} arg bytes");
            }
        }
        // A WRITE whose size claims more than it carries.
        let mut w = Vec::new();
        w.extend_from_slice(&1u64.to_le_bytes());
        w.extend_from_slice(&0u64.to_le_bytes());
        w.extend_from_slice(&4096u32.to_le_bytes());
        w.extend_from_slice(&[0u8; 20]);
        w.extend_from_slice(b"short");
        let r = s.handle(0, &req(opcode::WRITE, 6, 1, &w), 4096);
        assert_eq!(reply_header(&r).error, -libc::EINVAL);
        // Unknown opcodes.
        for op in [0u32, 7, 48, 49, 200, u32::MAX] {
            let r = s.handle(0, &req(op, 8, 1, &[]), 4096);
            assert_eq!(reply_header(&r).error, -libc::ENOSYS, "op {op}");
        }
        // FORGET takes no reply, even malformed.
        assert_eq!(
            s.handle(0, &req(opcode::FORGET, 1, 99, &[1]), 4096).reply,
            None
        );
        assert_eq!(
            s.handle(0, &req(opcode::BATCH_FORGET, 1, 0, &[0xff; 12]), 4096)
                .reply,
            None
        );
    }

    #[test]
    fn requests_before_init_fail() {
        let dir = tempfile::tempdir().unwrap();
        let s = server(dir.path());
        let r = s.handle(0, &req(opcode::LOOKUP, 1, 1, b"x\0"), 4096);
        assert_eq!(reply_header(&r).error, -libc::EIO);
    }

    #[test]
    fn reads_of_dram_tier_pages_are_not_delayed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![7u8; 64 * 1024]).unwrap();
        let s = server_at(dir.path(), 0);
        let (nodeid, fh) = open_f(&s);
        let a = read_args(fh, 0, 64 * 1024);
        for t in [1000, 2000] {
            let r = s.handle(t, &req(opcode::READ, 4, nodeid, &a), 128 * 1024);
            assert_eq!(r.reply.as_ref().unwrap().len(), 16 + 64 * 1024);
            assert_eq!(r.completes_at_ns, Some(t), "DRAM tier: no device delay");
        }
        let m = s.metrics();
        assert_eq!(m.device_misses.load(Ordering::Relaxed), 0);
        assert_eq!(m.device_hits.load(Ordering::Relaxed), 0);
        assert_eq!(m.dram_pages.load(Ordering::Relaxed), 32);
        assert_eq!(m.nand_reads.load(Ordering::Relaxed), 0);
    }

    fn open_f(s: &FuseServer) -> (u64, u64) {
        s.handle(0, &req(opcode::INIT, 1, 0, &init_args()), 4096);
        let r = s.handle(0, &req(opcode::LOOKUP, 2, 1, b"f\0"), 4096);
        let reply = r.reply.unwrap();
        let nodeid = u64::from_le_bytes(reply[16..24].try_into().unwrap());
        let r = s.handle(0, &req(opcode::OPEN, 3, nodeid, &[0u8; 8]), 4096);
        let reply = r.reply.unwrap();
        (
            nodeid,
            u64::from_le_bytes(reply[16..24].try_into().unwrap()),
        )
    }

    fn read_args(fh: u64, offset: u64, size: u32) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&fh.to_le_bytes());
        a.extend_from_slice(&offset.to_le_bytes());
        a.extend_from_slice(&size.to_le_bytes());
        a.extend_from_slice(&[0u8; 20]);
        a
    }

    #[test]
    fn read_is_charged_and_paced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![7u8; 8192]).unwrap();
        let s = server(dir.path());
        s.handle(0, &req(opcode::INIT, 1, 0, &init_args()), 4096);
        let r = s.handle(0, &req(opcode::LOOKUP, 2, 1, b"f\0"), 4096);
        let reply = r.reply.unwrap();
        let nodeid = u64::from_le_bytes(reply[16..24].try_into().unwrap());
        let r = s.handle(0, &req(opcode::OPEN, 3, nodeid, &[0u8; 8]), 4096);
        let reply = r.reply.unwrap();
        let fh = u64::from_le_bytes(reply[16..24].try_into().unwrap());
        let open_flags = u32::from_le_bytes(reply[24..28].try_into().unwrap());
        assert_eq!(open_flags & abi::fopen::DIRECT_IO, abi::fopen::DIRECT_IO);
        let mut a = Vec::new();
        a.extend_from_slice(&fh.to_le_bytes());
        a.extend_from_slice(&0u64.to_le_bytes());
        a.extend_from_slice(&4096u32.to_le_bytes());
        a.extend_from_slice(&[0u8; 20]);
        let first = s.handle(1000, &req(opcode::READ, 4, nodeid, &a), 8192);
        assert_eq!(first.reply.as_ref().unwrap().len(), 16 + 4096);
        let t1 = first.completes_at_ns.unwrap();
        assert!(t1 >= 1000 + 30_000, "a miss costs the NAND read: {t1}");
        let second = s.handle(t1, &req(opcode::READ, 5, nodeid, &a), 8192);
        let t2 = second.completes_at_ns.unwrap();
        assert!(t2 - t1 < 30_000, "a hit is cheap: {}", t2 - t1);
        assert_eq!(s.metrics().device_misses.load(Ordering::Relaxed), 1);
        assert_eq!(s.metrics().device_hits.load(Ordering::Relaxed), 1);
        assert_eq!(s.metrics().read_bytes.load(Ordering::Relaxed), 8192);
        // A read clamped by the room in the chain.
        let small = s.handle(t2, &req(opcode::READ, 6, nodeid, &a), 16 + 100);
        assert_eq!(small.reply.unwrap().len(), 116);
    }
}
