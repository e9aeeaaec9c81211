//! Directories: OPENDIR and READDIR (host `getdents` from the offset the
//! guest gives).

use super::{lock, DirEntry, PassthroughFs};
use crate::server::{Context, DirSink, FsResult, Opened, Timed};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use std::fs::File;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;

impl PassthroughFs {
    pub(super) fn opendir(&self, _ctx: &Context, nodeid: u64) -> FsResult<Opened> {
        let inode = self.inode(nodeid)?;
        if !inode.is_dir() {
            return Err(Errno::NOTDIR);
        }
        let fd = rustix::fs::openat(
            &inode.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let fh = self.add_handle(inode, File::from(fd));
        Ok(Timed::now(Opened {
            fh,
            open_flags: self.cache.dir_open_flags(),
        }))
    }

    pub(super) fn readdir(
        &self,
        _ctx: &Context,
        fh: u64,
        offset: u64,
        emit: DirSink<'_>,
    ) -> FsResult<()> {
        let h = self.handle(fh)?;
        if !h.inode.is_dir() {
            return Err(Errno::NOTDIR);
        }
        let _guard = lock(&h.dir_lock);
        rustix::fs::seek(&h.file, rustix::fs::SeekFrom::Start(offset))?;
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 16 * 1024];
        let mut dir = rustix::fs::RawDir::new(h.file.as_fd(), &mut buf);
        while let Some(entry) = dir.next() {
            let entry = entry?;
            let e = DirEntry {
                ino: entry.ino(),
                next_off: entry.next_entry_cookie(),
                typ: entry.file_type().as_raw_mode() >> 12,
                name: entry.file_name().to_bytes().to_vec(),
            };
            if !emit(&e) {
                break;
            }
        }
        Ok(Timed::now(()))
    }
}
