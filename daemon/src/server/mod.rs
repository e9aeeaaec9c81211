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
//! part of a descriptor chain into a buffer, calls `FuseHandler::handle_io`,
//! writes the reply into the writable part and paces its release. That keeps
//! the parser testable with plain byte slices ([`Server::handle`]).
//!
//! Files: `dispatch` (header checks, the requests without a reply, each
//! opcode by group), `ops` (argument decoding of the multi-step
//! operations), `session` (INIT, DESTROY, the DAX window, IOCTL),
//! `lock_waits` (SETLKW waits off the request path), `reply` (reply
//! headers through `fuse-abi`'s checked constructors, payload encoders),
//! `filesystem` (the [`FileSystem`] trait and its types), `payload`
//! (READ / WRITE data movement) and `seams` (the injected DAX and ioctl
//! handlers).

mod dispatch;
pub(crate) mod filesystem;
mod lock_waits;
mod ops;
pub(crate) mod payload;
mod reply;
pub(crate) mod seams;
mod session;

pub use filesystem::{
    AttrReply, Context, CopyRange, Created, Creation, DirEntry, DirSink, Fallocate, FileIo,
    FileSystem, FsResult, HostFile, LockRequest, LockWaiter, Named, Opened, StopWaiting, Timed,
    Xattr,
};
pub(crate) use lock_waits::LockWaits;
pub use payload::{BufferIo, Direction, PayloadIo, Transfer};
pub use seams::{DaxMapper, IoctlHandler};

use crate::abi::{InHeader, WriteIn};
use crate::metrics::VmMetrics;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Largest WRITE payload accepted (advertised as `max_write`).
pub(crate) const MAX_WRITE: u32 = 1 << 20;
/// Largest READ served (and `max_pages` * 4 KiB).
pub const MAX_READ: u32 = 1 << 20;
/// Largest request the transport needs to buffer: a maximal WRITE plus headers.
pub(crate) const MAX_REQUEST: usize = MAX_WRITE as usize + 4096;
/// Bytes of a WRITE request before its payload (`fuse_in_header` + `fuse_write_in`).
pub(crate) const WRITE_PAYLOAD_AT: usize =
    std::mem::size_of::<InHeader>() + std::mem::size_of::<WriteIn>();
/// Largest extended-attribute value and list (`XATTR_SIZE_MAX`).
pub(crate) const XATTR_SIZE_MAX: u32 = 64 * 1024;
/// Largest extended-attribute name (`XATTR_NAME_MAX`).
pub(crate) const XATTR_NAME_MAX: usize = 255;
/// Most SETLKW waits one VM may have outstanding; more get `ENOLCK`.
pub(crate) const MAX_LOCK_WAITERS: usize = 64;
/// Most bytes one COPY_FILE_RANGE copies (the guest loops for more).
pub(crate) const MAX_COPY: u64 = 16 << 20;

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
pub(crate) struct Incoming<'a> {
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
pub(crate) trait FuseHandler: Send + Sync {
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

impl<F: FileSystem> std::fmt::Debug for Server<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("vm", &self.metrics.name)
            .field("dax", &self.dax.is_some())
            .field("ioctl", &self.ioctl.is_some())
            .finish_non_exhaustive()
    }
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
}

impl<F: FileSystem> FuseHandler for Server<F> {
    fn handle_io(&self, req: Incoming<'_>, io: &mut dyn PayloadIo) -> Handled {
        self.handle_request(req, io)
    }

    fn close_waits(&self) {
        self.waits.close();
    }
}
