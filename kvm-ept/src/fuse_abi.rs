//! The FUSE kernel ABI (`include/uapi/linux/fuse.h`) as far as cxlfs speaks
//! it: opcodes, flags, the request / reply structures and the server → kernel
//! notifications, decoded from and encoded to little-endian byte slices
//! without `unsafe`.
//!
//! Two servers share it: `cxlfsd`'s virtio-fs server (guest requests over a
//! virtqueue) and the residency plane's pool-file server
//! ([`crate::FusePoolPlane`], host kernel requests over `/dev/fuse`).
//!
//! Every decoder works on a bounded [`Cursor`]; a field that would run past
//! the end of the buffer is a [`ParseRequestError`], never a panic.

/// Protocol major version spoken.
pub const KERNEL_VERSION: u32 = 7;
/// Protocol minor version spoken (7.31: virtio-fs, DAX-era `fuse_init_out`).
pub const KERNEL_MINOR_VERSION: u32 = 31;
/// Lowest minor version accepted from the guest.
pub const MIN_KERNEL_MINOR_VERSION: u32 = 27;
/// The node id of the root directory.
pub const ROOT_ID: u64 = 1;

/// Size of [`InHeader`] on the wire.
pub const IN_HEADER_LEN: usize = 40;
/// Size of [`OutHeader`] on the wire.
pub const OUT_HEADER_LEN: usize = 16;
/// Size of `fuse_attr`.
pub const ATTR_LEN: usize = 88;
/// Size of `fuse_entry_out`.
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
/// Size of `fuse_dirent` without its name.
pub const DIRENT_LEN: usize = 24;

/// FUSE opcodes.
#[allow(missing_docs)]
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;

    /// One past the highest opcode known (sizes per-opcode counters).
    pub const MAX: u32 = 52;

    /// A stable lower-case name for metrics labels.
    pub fn name(op: u32) -> &'static str {
        match op {
            LOOKUP => "lookup",
            FORGET => "forget",
            GETATTR => "getattr",
            SETATTR => "setattr",
            READLINK => "readlink",
            SYMLINK => "symlink",
            MKNOD => "mknod",
            MKDIR => "mkdir",
            UNLINK => "unlink",
            RMDIR => "rmdir",
            RENAME => "rename",
            LINK => "link",
            OPEN => "open",
            READ => "read",
            WRITE => "write",
            STATFS => "statfs",
            RELEASE => "release",
            FSYNC => "fsync",
            SETXATTR => "setxattr",
            GETXATTR => "getxattr",
            LISTXATTR => "listxattr",
            REMOVEXATTR => "removexattr",
            FLUSH => "flush",
            INIT => "init",
            OPENDIR => "opendir",
            READDIR => "readdir",
            RELEASEDIR => "releasedir",
            FSYNCDIR => "fsyncdir",
            GETLK => "getlk",
            SETLK => "setlk",
            SETLKW => "setlkw",
            ACCESS => "access",
            CREATE => "create",
            INTERRUPT => "interrupt",
            BMAP => "bmap",
            DESTROY => "destroy",
            IOCTL => "ioctl",
            POLL => "poll",
            NOTIFY_REPLY => "notify_reply",
            BATCH_FORGET => "batch_forget",
            FALLOCATE => "fallocate",
            READDIRPLUS => "readdirplus",
            RENAME2 => "rename2",
            LSEEK => "lseek",
            COPY_FILE_RANGE => "copy_file_range",
            SETUPMAPPING => "setupmapping",
            REMOVEMAPPING => "removemapping",
            SYNCFS => "syncfs",
            TMPFILE => "tmpfile",
            _ => "unknown",
        }
    }
}

/// `fuse_init_in.flags` / `fuse_init_out.flags` bits.
#[allow(missing_docs)]
pub mod init_flags {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const SPLICE_WRITE: u64 = 1 << 7;
    pub const SPLICE_MOVE: u64 = 1 << 8;
    pub const SPLICE_READ: u64 = 1 << 9;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    pub const SUBMOUNTS: u64 = 1 << 27;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 28;
    pub const INIT_EXT: u64 = 1 << 30;
}

/// Server → kernel notification codes (`fuse_notify_code`): sent as a reply
/// with `unique` = 0 and `error` = the code (see [`encode_notify`]).
#[allow(missing_docs)]
pub mod notify {
    pub const POLL: i32 = 1;
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
    pub const STORE: i32 = 4;
    pub const RETRIEVE: i32 = 5;
    pub const DELETE: i32 = 6;
}

/// Size of `fuse_notify_store_out`.
pub const NOTIFY_STORE_OUT_LEN: usize = 24;
/// Size of `fuse_notify_inval_inode_out`.
pub const NOTIFY_INVAL_INODE_OUT_LEN: usize = 24;
/// Size of `fuse_read_in` / `fuse_write_in` (protocol ≥ 7.9).
pub const READ_IN_LEN: usize = 40;
/// The smallest buffer `/dev/fuse` accepts for `read(2)` (`FUSE_MIN_READ_BUFFER`).
pub const MIN_READ_BUFFER: usize = 8192;

/// Encodes the out header of a notification carrying `payload_len` bytes
/// after it: `len`, `error` = `code`, `unique` = 0.
pub fn encode_notify(code: i32, payload_len: usize, out: &mut Vec<u8>) {
    OutHeader {
        len: (OUT_HEADER_LEN + payload_len) as u32,
        error: code,
        unique: 0,
    }
    .encode(out);
}

/// Encodes a whole `FUSE_NOTIFY_STORE` message up to (not including) its
/// data: header + `fuse_notify_store_out { nodeid, offset, size }`. The
/// `size` bytes of data must follow (e.g. as a second `writev` segment).
pub fn encode_notify_store(nodeid: u64, offset: u64, size: u32, out: &mut Vec<u8>) {
    encode_notify(notify::STORE, NOTIFY_STORE_OUT_LEN + size as usize, out);
    out.extend_from_slice(&nodeid.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// Encodes a whole `FUSE_NOTIFY_INVAL_INODE` message: drop the cached pages
/// of `[offset, offset + len)` of `ino` (`len` ≤ 0: to the end of the file;
/// `offset` < 0: attributes only). The kernel writes dirty pages back first.
pub fn encode_notify_inval_inode(ino: u64, offset: i64, len: i64, out: &mut Vec<u8>) {
    encode_notify(notify::INVAL_INODE, NOTIFY_INVAL_INODE_OUT_LEN, out);
    out.extend_from_slice(&ino.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
}

/// `fuse_read_in` (also the layout of `fuse_write_in` up to `size` / flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    /// `read_flags` (READ) or `write_flags` (WRITE).
    pub flags: u32,
    pub lock_owner: u64,
    /// The open flags of the file.
    pub file_flags: u32,
}

impl ReadIn {
    /// Decodes the 40-byte `fuse_read_in` / `fuse_write_in`.
    pub fn parse(c: &mut Cursor<'_>) -> Result<Self, ParseRequestError> {
        let r = ReadIn {
            fh: c.u64()?,
            offset: c.u64()?,
            size: c.u32()?,
            flags: c.u32()?,
            lock_owner: c.u64()?,
            file_flags: c.u32()?,
        };
        c.skip(4)?;
        Ok(r)
    }

    /// Encodes it (tests).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.fh.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.lock_owner.to_le_bytes());
        out.extend_from_slice(&self.file_flags.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
    }
}

/// Encodes `fuse_write_out`.
pub fn encode_write_out(size: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// `fuse_open_out.open_flags` bits.
#[allow(missing_docs)]
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const NONSEEKABLE: u32 = 1 << 2;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const STREAM: u32 = 1 << 4;
    pub const NOFLUSH: u32 = 1 << 5;
}

/// `fuse_setattr_in.valid` bits.
#[allow(missing_docs)]
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
}

/// `fuse_getattr_in.getattr_flags`: `fh` is valid.
pub const GETATTR_FH: u32 = 1;

/// Why a request could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseRequestError {
    /// A field runs past the end of the request.
    #[error("request truncated: need {need} bytes at offset {at}, have {have}")]
    Truncated {
        /// Where the field starts.
        at: usize,
        /// Bytes the field needs.
        need: usize,
        /// Bytes the request has in all.
        have: usize,
    },
    /// A name without its terminating NUL.
    #[error("name at offset {at} is not NUL-terminated")]
    UnterminatedName {
        /// Where the name starts.
        at: usize,
    },
    /// The header's length disagrees with the bytes the guest supplied.
    #[error("header says {header} bytes, descriptor chain holds {actual}")]
    LengthMismatch {
        /// `fuse_in_header.len`.
        header: u32,
        /// Readable bytes in the chain.
        actual: usize,
    },
}

/// A bounds-checked little-endian reader over one request.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Bytes not consumed yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], ParseRequestError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(ParseRequestError::Truncated {
                at: self.pos,
                need: n,
                have: self.buf.len(),
            })?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// The rest of the buffer.
    pub fn rest(&mut self) -> &'a [u8] {
        let out = &self.buf[self.pos..];
        self.pos = self.buf.len();
        out
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ParseRequestError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, ParseRequestError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, ParseRequestError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, ParseRequestError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Skips `n` bytes.
    pub fn skip(&mut self, n: usize) -> Result<(), ParseRequestError> {
        self.bytes(n).map(|_| ())
    }

    /// A NUL-terminated name (without the NUL).
    pub fn name(&mut self) -> Result<&'a [u8], ParseRequestError> {
        let at = self.pos;
        let rest = &self.buf[self.pos..];
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(ParseRequestError::UnterminatedName { at })?;
        self.pos += nul + 1;
        Ok(&rest[..nul])
    }
}

/// `fuse_in_header`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InHeader {
    /// Total request length including this header.
    pub len: u32,
    /// Operation.
    pub opcode: u32,
    /// Request id, echoed in the reply.
    pub unique: u64,
    /// Target inode.
    pub nodeid: u64,
    /// Caller's uid.
    pub uid: u32,
    /// Caller's gid.
    pub gid: u32,
    /// Caller's pid: the calling (for a page fault: the faulting) thread's
    /// id in the server's pid namespace, 0 if it has none there.
    pub pid: u32,
    /// Length of extension headers after the arguments (in 8-byte units).
    pub total_extlen: u16,
}

impl InHeader {
    /// Decodes the header.
    pub fn parse(c: &mut Cursor<'_>) -> Result<Self, ParseRequestError> {
        let h = InHeader {
            len: c.u32()?,
            opcode: c.u32()?,
            unique: c.u64()?,
            nodeid: c.u64()?,
            uid: c.u32()?,
            gid: c.u32()?,
            pid: c.u32()?,
            total_extlen: c.u16()?,
        };
        c.skip(2)?;
        Ok(h)
    }

    /// Encodes the header (used by tests and the front-end test driver).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.opcode.to_le_bytes());
        out.extend_from_slice(&self.unique.to_le_bytes());
        out.extend_from_slice(&self.nodeid.to_le_bytes());
        out.extend_from_slice(&self.uid.to_le_bytes());
        out.extend_from_slice(&self.gid.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.total_extlen.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
    }
}

/// `fuse_out_header`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutHeader {
    /// Total reply length including this header.
    pub len: u32,
    /// 0 or a negative errno.
    pub error: i32,
    /// The request's id.
    pub unique: u64,
}

impl OutHeader {
    /// Decodes a reply header (tests, front-end driver).
    pub fn parse(c: &mut Cursor<'_>) -> Result<Self, ParseRequestError> {
        Ok(OutHeader {
            len: c.u32()?,
            error: c.u32()? as i32,
            unique: c.u64()?,
        })
    }

    /// Encodes the header.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.error.to_le_bytes());
        out.extend_from_slice(&self.unique.to_le_bytes());
    }
}

/// `fuse_attr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

impl Attr {
    /// Encodes the 88-byte `fuse_attr`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [
            self.ino,
            self.size,
            self.blocks,
            self.atime,
            self.mtime,
            self.ctime,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.atimensec,
            self.mtimensec,
            self.ctimensec,
            self.mode,
            self.nlink,
            self.uid,
            self.gid,
            self.rdev,
            self.blksize,
            self.flags,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// `fuse_entry_out`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

impl EntryOut {
    /// Encodes the 128-byte `fuse_entry_out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.nodeid.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.entry_valid.to_le_bytes());
        out.extend_from_slice(&self.attr_valid.to_le_bytes());
        out.extend_from_slice(&self.entry_valid_nsec.to_le_bytes());
        out.extend_from_slice(&self.attr_valid_nsec.to_le_bytes());
        self.attr.encode(out);
    }
}

/// Encodes `fuse_attr_out`.
pub fn encode_attr_out(attr_valid: u64, attr_valid_nsec: u32, attr: &Attr, out: &mut Vec<u8>) {
    out.extend_from_slice(&attr_valid.to_le_bytes());
    out.extend_from_slice(&attr_valid_nsec.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    attr.encode(out);
}

/// Encodes `fuse_open_out`.
pub fn encode_open_out(fh: u64, open_flags: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&fh.to_le_bytes());
    out.extend_from_slice(&open_flags.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// Encodes one `fuse_dirent` (padded to 8 bytes).
pub fn encode_dirent(ino: u64, off: u64, typ: u32, name: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&ino.to_le_bytes());
    out.extend_from_slice(&off.to_le_bytes());
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&typ.to_le_bytes());
    out.extend_from_slice(name);
    let pad = dirent_size(name.len()) - DIRENT_LEN - name.len();
    out.resize(out.len() + pad, 0);
}

/// Size of a `fuse_dirent` with a name of `namelen` bytes, padded.
pub fn dirent_size(namelen: usize) -> usize {
    (DIRENT_LEN + namelen + 7) & !7
}

/// `fuse_init_in`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// `flags | flags2 << 32`.
    pub flags: u64,
}

impl InitIn {
    /// Decodes `fuse_init_in` (the old 16-byte form or the extended one).
    pub fn parse(c: &mut Cursor<'_>) -> Result<Self, ParseRequestError> {
        let major = c.u32()?;
        let minor = c.u32()?;
        let max_readahead = c.u32()?;
        let flags = u64::from(c.u32()?);
        let mut init = InitIn {
            major,
            minor,
            max_readahead,
            flags,
        };
        if init.flags & init_flags::INIT_EXT != 0 && c.remaining() >= 4 {
            init.flags |= u64::from(c.u32()?) << 32;
        }
        Ok(init)
    }
}

/// `fuse_init_out`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// `flags | flags2 << 32`.
    pub flags: u64,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
}

impl InitOut {
    /// Encodes the 64-byte `fuse_init_out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.major.to_le_bytes());
        out.extend_from_slice(&self.minor.to_le_bytes());
        out.extend_from_slice(&self.max_readahead.to_le_bytes());
        out.extend_from_slice(&(self.flags as u32).to_le_bytes());
        out.extend_from_slice(&self.max_background.to_le_bytes());
        out.extend_from_slice(&self.congestion_threshold.to_le_bytes());
        out.extend_from_slice(&self.max_write.to_le_bytes());
        out.extend_from_slice(&self.time_gran.to_le_bytes());
        out.extend_from_slice(&self.max_pages.to_le_bytes());
        out.extend_from_slice(&self.map_alignment.to_le_bytes());
        out.extend_from_slice(&((self.flags >> 32) as u32).to_le_bytes());
        out.extend_from_slice(&[0u8; 28]);
    }
}

/// `fuse_kstatfs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Kstatfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

impl Kstatfs {
    /// Encodes the 80-byte `fuse_kstatfs`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.blocks, self.bfree, self.bavail, self.files, self.ffree] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.bsize, self.namelen, self.frsize] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&[0u8; 28]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = InHeader {
            len: 40,
            opcode: opcode::LOOKUP,
            unique: 7,
            nodeid: 1,
            uid: 2,
            gid: 3,
            pid: 4,
            total_extlen: 0,
        };
        let mut b = Vec::new();
        h.encode(&mut b);
        assert_eq!(b.len(), IN_HEADER_LEN);
        assert_eq!(InHeader::parse(&mut Cursor::new(&b)).unwrap(), h);
    }

    #[test]
    fn truncated_fields_are_errors() {
        let b = [0u8; 39];
        assert!(matches!(
            InHeader::parse(&mut Cursor::new(&b)),
            Err(ParseRequestError::Truncated { .. })
        ));
        let mut c = Cursor::new(&[1, 2, 3]);
        assert!(c.u32().is_err());
        assert!(c.bytes(usize::MAX).is_err());
        assert!(Cursor::new(b"abc").name().is_err());
        assert_eq!(Cursor::new(b"abc\0d").name().unwrap(), b"abc");
    }

    #[test]
    fn sizes_match_the_kernel() {
        let mut b = Vec::new();
        Attr::default().encode(&mut b);
        assert_eq!(b.len(), ATTR_LEN);
        b.clear();
        EntryOut::default().encode(&mut b);
        assert_eq!(b.len(), ENTRY_OUT_LEN);
        b.clear();
        InitOut::default().encode(&mut b);
        assert_eq!(b.len(), 64);
        b.clear();
        Kstatfs::default().encode(&mut b);
        assert_eq!(b.len(), 80);
        b.clear();
        encode_dirent(1, 2, 3, b"abcde", &mut b);
        assert_eq!(b.len(), 32);
        assert_eq!(dirent_size(8), 32);
        assert_eq!(dirent_size(9), 40);
        b.clear();
        encode_notify_store(2, 4096, 4096, &mut b);
        assert_eq!(b.len(), OUT_HEADER_LEN + NOTIFY_STORE_OUT_LEN);
        let h = OutHeader::parse(&mut Cursor::new(&b)).unwrap();
        assert_eq!(
            (h.len, h.error, h.unique),
            (16 + 24 + 4096, notify::STORE, 0)
        );
        b.clear();
        encode_notify_inval_inode(2, 0, -1, &mut b);
        assert_eq!(b.len(), OUT_HEADER_LEN + NOTIFY_INVAL_INODE_OUT_LEN);
        b.clear();
        ReadIn::default().encode(&mut b);
        assert_eq!(b.len(), READ_IN_LEN);
        let r = ReadIn {
            fh: 1,
            offset: 2,
            size: 3,
            flags: 4,
            lock_owner: 5,
            file_flags: 6,
        };
        b.clear();
        r.encode(&mut b);
        assert_eq!(ReadIn::parse(&mut Cursor::new(&b)).unwrap(), r);
        assert!(ReadIn::parse(&mut Cursor::new(&b[..39])).is_err());
    }
}
