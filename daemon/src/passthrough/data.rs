//! File data: READ and WRITE (the payload moves between the message and
//! the handle's file), FLUSH, FSYNC, SYNCFS, and syncing everything at
//! shutdown.

use super::{lock, Handle, PassthroughFs};
use crate::abi::write_flags;
use crate::server::{Context, Direction, FileIo, FsResult, Timed, Transfer};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use std::io;
use std::sync::Arc;

fn errno(e: &io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

impl PassthroughFs {
    /// READ / WRITE: the payload moves between the message and the handle's file.
    fn move_payload(&self, io: FileIo<'_>, direction: Direction) -> FsResult<usize> {
        let h = self.handle(io.fh)?;
        if direction == Direction::RequestToFile && io.flags & write_flags::KILL_SUIDGID != 0 {
            // Before the data changes, as the kernel's file_remove_privs.
            self.kill_suidgid(&h.inode)?;
        }
        let n = io
            .payload
            .transfer(Transfer {
                direction,
                file: &h.file,
                offset: io.offset,
                at: io.at,
                len: io.size as usize,
            })
            .map_err(|e| errno(&e))?;
        Ok(Timed::now(n))
    }

    pub(super) fn read(&self, _ctx: &Context, io: FileIo<'_>) -> FsResult<usize> {
        self.move_payload(io, Direction::FileToReply)
    }

    pub(super) fn write(&self, _ctx: &Context, io: FileIo<'_>) -> FsResult<usize> {
        self.move_payload(io, Direction::RequestToFile)
    }

    pub(super) fn flush(&self, _ctx: &Context, _nodeid: u64, _fh: u64) -> FsResult<()> {
        // Nothing is buffered here: the host file has every byte.
        Ok(Timed::now(()))
    }

    pub(super) fn fsync(
        &self,
        _ctx: &Context,
        _nodeid: u64,
        fh: u64,
        datasync: bool,
    ) -> FsResult<()> {
        let h = self.handle(fh)?;
        if datasync {
            rustix::fs::fdatasync(&h.file)?;
        } else {
            rustix::fs::fsync(&h.file)?;
        }
        Ok(Timed::now(()))
    }

    pub(super) fn syncfs(&self, _ctx: &Context, _nodeid: u64) -> FsResult<()> {
        // `root` is O_PATH, which syncfs refuses: the directory itself.
        let dir = rustix::fs::openat(
            &self.root,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        rustix::fs::syncfs(&dir)?;
        Ok(Timed::now(()))
    }

    /// Every open handle's inode key and `fsync` (shutdown).
    pub fn sync_all(&self) {
        let handles: Vec<Arc<Handle>> = lock(&self.tables).handles.values().cloned().collect();
        for h in handles {
            if let Err(e) = rustix::fs::fsync(&h.file) {
                tracing::warn!(error = %e, "fsync on shutdown failed");
            }
        }
        // `root` is an O_PATH fd, which syncfs refuses (EBADF): open the
        // directory itself for it.
        let synced = rustix::fs::openat(
            &self.root,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .and_then(|dir| rustix::fs::syncfs(&dir));
        if let Err(e) = synced {
            tracing::warn!(error = %e, "syncfs on shutdown failed");
        }
    }
}
