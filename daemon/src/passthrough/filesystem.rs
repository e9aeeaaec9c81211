//! [`FileSystem`] for [`PassthroughFs`]: INIT and DESTROY (the session's
//! start and end), and every other operation handed to the inherent method
//! of the same name in the module that does that job.

use super::{CacheMode, PassthroughFs};
use crate::abi::{self, EntryOut, SetattrIn};
use crate::ids::FileKey;
use crate::server::{
    AttrReply, Context, CopyRange, Created, Creation, DirSink, Fallocate, FileIo, FileSystem,
    FsResult, HostFile, LockRequest, LockWaiter, Named, Opened, Xattr,
};
use rustix::io::Errno;

impl FileSystem for PassthroughFs {
    fn init(&self, _kernel_flags: u64) -> Result<u64, Errno> {
        self.reset();
        // HANDLE_KILLPRIV_V2: the guest kernel leaves killing set-id bits on
        // write, truncation and chown to the server and says when to
        // (KILL_SUIDGID flags); without it, it would send a SETATTR of the
        // mode before each such write.
        // POSIX locks and flocks are held on the host (`locks`), so they
        // conflict across VMs.
        let killpriv = abi::init_flags::HANDLE_KILLPRIV_V2
            | abi::init_flags::POSIX_LOCKS
            | abi::init_flags::FLOCK_LOCKS;
        Ok(if self.cache == CacheMode::Auto {
            abi::init_flags::AUTO_INVAL_DATA | killpriv
        } else {
            killpriv
        })
    }

    fn destroy(&self) {
        self.reset();
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &[u8]) -> FsResult<EntryOut> {
        self.lookup(ctx, parent, name)
    }

    fn forget(&self, ctx: &Context, nodeid: u64, nlookup: u64) {
        self.forget(ctx, nodeid, nlookup);
    }

    fn getattr(&self, ctx: &Context, nodeid: u64, fh: Option<u64>) -> FsResult<AttrReply> {
        self.getattr(ctx, nodeid, fh)
    }

    fn setattr(&self, ctx: &Context, nodeid: u64, a: &SetattrIn) -> FsResult<AttrReply> {
        self.setattr(ctx, nodeid, a)
    }

    fn readlink(&self, ctx: &Context, nodeid: u64) -> FsResult<Vec<u8>> {
        self.readlink(ctx, nodeid)
    }

    fn symlink(&self, ctx: &Context, at: Named<'_>, target: &[u8]) -> FsResult<EntryOut> {
        self.symlink(ctx, at, target)
    }

    fn mkdir(&self, ctx: &Context, at: Named<'_>, how: Creation) -> FsResult<EntryOut> {
        self.mkdir(ctx, at, how)
    }

    fn unlink(&self, ctx: &Context, at: Named<'_>, dir: bool) -> FsResult<()> {
        self.unlink(ctx, at, dir)
    }

    fn rename(&self, ctx: &Context, from: Named<'_>, to: Named<'_>, flags: u32) -> FsResult<()> {
        self.rename(ctx, from, to, flags)
    }

    fn open(&self, ctx: &Context, nodeid: u64, flags: u32, open_flags: u32) -> FsResult<Opened> {
        self.open(ctx, nodeid, flags, open_flags)
    }

    fn create(&self, ctx: &Context, at: Named<'_>, how: Creation) -> FsResult<Created> {
        self.create(ctx, at, how)
    }

    fn read(&self, ctx: &Context, io: FileIo<'_>) -> FsResult<usize> {
        self.read(ctx, io)
    }

    fn write(&self, ctx: &Context, io: FileIo<'_>) -> FsResult<usize> {
        self.write(ctx, io)
    }

    fn flush(&self, ctx: &Context, nodeid: u64, fh: u64) -> FsResult<()> {
        self.flush(ctx, nodeid, fh)
    }

    fn fsync(&self, ctx: &Context, nodeid: u64, fh: u64, datasync: bool) -> FsResult<()> {
        self.fsync(ctx, nodeid, fh, datasync)
    }

    fn release(&self, ctx: &Context, nodeid: u64, fh: u64) {
        self.release(ctx, nodeid, fh);
    }

    fn opendir(&self, ctx: &Context, nodeid: u64) -> FsResult<Opened> {
        self.opendir(ctx, nodeid)
    }

    fn readdir(&self, ctx: &Context, fh: u64, offset: u64, emit: DirSink<'_>) -> FsResult<()> {
        self.readdir(ctx, fh, offset, emit)
    }

    fn statfs(&self, ctx: &Context, nodeid: u64) -> FsResult<abi::Kstatfs> {
        self.statfs(ctx, nodeid)
    }

    fn link(&self, ctx: &Context, nodeid: u64, at: Named<'_>) -> FsResult<EntryOut> {
        self.link(ctx, nodeid, at)
    }

    fn mknod(&self, ctx: &Context, at: Named<'_>, how: Creation, rdev: u32) -> FsResult<EntryOut> {
        self.mknod(ctx, at, how, rdev)
    }

    fn tmpfile(&self, ctx: &Context, parent: u64, how: Creation) -> FsResult<Created> {
        self.tmpfile(ctx, parent, how)
    }

    fn getxattr(&self, ctx: &Context, nodeid: u64, name: &[u8], size: u32) -> FsResult<Xattr> {
        self.getxattr(ctx, nodeid, name, size)
    }

    fn listxattr(&self, ctx: &Context, nodeid: u64, size: u32) -> FsResult<Xattr> {
        self.listxattr(ctx, nodeid, size)
    }

    fn setxattr(
        &self,
        ctx: &Context,
        nodeid: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        self.setxattr(ctx, nodeid, name, value, flags)
    }

    fn removexattr(&self, ctx: &Context, nodeid: u64, name: &[u8]) -> FsResult<()> {
        self.removexattr(ctx, nodeid, name)
    }

    fn fallocate(&self, ctx: &Context, range: Fallocate) -> FsResult<()> {
        self.fallocate(ctx, range)
    }

    fn lseek(
        &self,
        ctx: &Context,
        nodeid: u64,
        fh: u64,
        offset: u64,
        whence: u32,
    ) -> FsResult<u64> {
        self.lseek(ctx, nodeid, fh, offset, whence)
    }

    fn copy_file_range(&self, ctx: &Context, c: CopyRange) -> FsResult<usize> {
        self.copy_file_range(ctx, c)
    }

    fn getlk(&self, ctx: &Context, nodeid: u64, lock: &LockRequest) -> FsResult<abi::FileLock> {
        self.getlk(ctx, nodeid, lock)
    }

    fn setlk(&self, ctx: &Context, nodeid: u64, lock: &LockRequest) -> FsResult<()> {
        self.setlk(ctx, nodeid, lock)
    }

    fn lock_waiter(
        &self,
        ctx: &Context,
        nodeid: u64,
        lock: &LockRequest,
    ) -> Result<LockWaiter, Errno> {
        self.lock_waiter(ctx, nodeid, lock)
    }

    fn unlock_owner(&self, ctx: &Context, nodeid: u64, owner: u64, flock: bool) {
        self.unlock_owner(ctx, nodeid, owner, flock);
    }

    fn syncfs(&self, ctx: &Context, nodeid: u64) -> FsResult<()> {
        self.syncfs(ctx, nodeid)
    }

    fn access(&self, ctx: &Context, nodeid: u64, mask: u32) -> FsResult<()> {
        self.access(ctx, nodeid, mask)
    }

    fn host_file(&self, nodeid: u64, fh: Option<u64>, for_pool: bool) -> Result<HostFile, Errno> {
        self.host_file(nodeid, fh, for_pool)
    }

    fn file_key(&self, nodeid: u64, fh: Option<u64>) -> Result<FileKey, Errno> {
        self.file_key(nodeid, fh)
    }
}
