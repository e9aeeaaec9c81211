//! Test helpers of the passthrough modules: a file system over a temporary
//! directory, a root caller, and READ / WRITE through the payload path.

use super::{CacheMode, PassthroughFs};
use crate::server::{
    BufferIo, Context, Created, Creation, FileIo, FileSystem, FsResult, Named, PayloadIo,
};
use rustix::io::Errno;
use std::path::Path;

/// A caller with every id 0.
pub(super) const C: Context = Context {
    uid: 0,
    gid: 0,
    pid: 0,
    arrival_ns: 0,
};

/// Whether the tests run as root (what credential switches need); a
/// run without root under CI is a failure, not a skip.
pub(super) fn running_as_root() -> bool {
    let root = rustix::process::geteuid().is_root();
    assert!(
        root || std::env::var("CI").as_deref() != Ok("true"),
        "credential tests need root (CI=true)"
    );
    root
}

pub(super) fn fs(dir: &Path) -> PassthroughFs {
    PassthroughFs::new(dir, CacheMode::Auto).unwrap()
}

/// The reply value (the passthrough never delays one).
pub(super) fn v<T>(r: FsResult<T>) -> Result<T, Errno> {
    r.map(|t| t.value)
}

pub(super) fn at(parent: u64, name: &[u8]) -> Named<'_> {
    Named { parent, name }
}

pub(super) fn create(
    fs: &PassthroughFs,
    parent: u64,
    name: &[u8],
    flags: u32,
) -> Result<Created, Errno> {
    let how = Creation {
        mode: 0o644,
        umask: 0o022,
        flags,
        open_flags: 0,
    };
    v(fs.create(&C, at(parent, name), how))
}

/// Up to `size` bytes of `fh` at `offset`, through the READ path.
pub(super) fn read(fs: &PassthroughFs, fh: u64, offset: u64, size: u32) -> Vec<u8> {
    let mut io = BufferIo {
        req: &[],
        data: Vec::new(),
    };
    let payload: &mut dyn PayloadIo = &mut io;
    let io_args = FileIo {
        nodeid: 0,
        fh,
        offset,
        size,
        flags: 0,
        at: 0,
        payload,
    };
    v(FileSystem::read(fs, &C, io_args)).unwrap();
    io.data
}

/// `data` to `fh` at `offset`, through the WRITE path.
pub(super) fn write(fs: &PassthroughFs, fh: u64, offset: u64, data: &[u8]) {
    let mut io = BufferIo {
        req: data,
        data: Vec::new(),
    };
    let io_args = FileIo {
        nodeid: 0,
        fh,
        offset,
        size: data.len() as u32,
        flags: 0,
        at: 0,
        payload: &mut io,
    };
    assert_eq!(v(FileSystem::write(fs, &C, io_args)).unwrap(), data.len());
}
