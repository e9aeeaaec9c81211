//! Every FUSE constant cxlfs uses, in one place: protocol versions, opcodes,
//! notification codes and the flag words of the requests and replies.
//! Values are the kernel's (`include/uapi/linux/fuse.h`); the names drop the
//! `FUSE_` / `FOPEN_` / `FATTR_` prefixes, which the module names carry.

/// Protocol major version spoken.
pub const KERNEL_VERSION: u32 = 7;
/// Protocol minor version spoken (7.31: virtio-fs, DAX-era `fuse_init_out`).
pub const KERNEL_MINOR_VERSION: u32 = 31;
/// Lowest minor version accepted from a client.
pub const MIN_KERNEL_MINOR_VERSION: u32 = 27;
/// The node id of the root directory (`FUSE_ROOT_ID`).
pub const ROOT_ID: u64 = 1;
/// The smallest buffer `/dev/fuse` accepts for `read(2)` (`FUSE_MIN_READ_BUFFER`).
pub const MIN_READ_BUFFER: usize = 8192;
/// `fuse_getattr_in.getattr_flags`: `fh` is valid (`FUSE_GETATTR_FH`).
pub const GETATTR_FH: u32 = 1 << 0;
/// Most `fuse_removemapping_one` entries in one REMOVEMAPPING
/// (`FUSE_REMOVEMAPPING_MAX_ENTRY` = `PAGE_SIZE / sizeof(struct
/// fuse_removemapping_one)`, with the 4 KiB pages of the hosts cxlfs runs on).
pub const REMOVEMAPPING_MAX_ENTRY: u32 =
    (4096 / core::mem::size_of::<crate::RemoveMappingOne>()) as u32;
/// Most iovecs in an unrestricted ioctl reply (`FUSE_IOCTL_MAX_IOV`).
pub const IOCTL_MAX_IOV: u32 = 256;

/// FUSE opcodes (`enum fuse_opcode`).
pub mod opcode {
    /// Look a name up in a directory.
    pub const LOOKUP: u32 = 1;
    /// Drop lookup references (no reply).
    pub const FORGET: u32 = 2;
    /// Get attributes.
    pub const GETATTR: u32 = 3;
    /// Set attributes.
    pub const SETATTR: u32 = 4;
    /// Read a symlink.
    pub const READLINK: u32 = 5;
    /// Create a symlink.
    pub const SYMLINK: u32 = 6;
    /// Create a node.
    pub const MKNOD: u32 = 8;
    /// Create a directory.
    pub const MKDIR: u32 = 9;
    /// Remove a file.
    pub const UNLINK: u32 = 10;
    /// Remove a directory.
    pub const RMDIR: u32 = 11;
    /// Rename.
    pub const RENAME: u32 = 12;
    /// Hard link.
    pub const LINK: u32 = 13;
    /// Open a file.
    pub const OPEN: u32 = 14;
    /// Read.
    pub const READ: u32 = 15;
    /// Write.
    pub const WRITE: u32 = 16;
    /// File system statistics.
    pub const STATFS: u32 = 17;
    /// Close a file.
    pub const RELEASE: u32 = 18;
    /// Sync a file.
    pub const FSYNC: u32 = 20;
    /// Set an extended attribute.
    pub const SETXATTR: u32 = 21;
    /// Get an extended attribute.
    pub const GETXATTR: u32 = 22;
    /// List extended attributes.
    pub const LISTXATTR: u32 = 23;
    /// Remove an extended attribute.
    pub const REMOVEXATTR: u32 = 24;
    /// `close()` of a file descriptor.
    pub const FLUSH: u32 = 25;
    /// Session start.
    pub const INIT: u32 = 26;
    /// Open a directory.
    pub const OPENDIR: u32 = 27;
    /// Read a directory.
    pub const READDIR: u32 = 28;
    /// Close a directory.
    pub const RELEASEDIR: u32 = 29;
    /// Sync a directory.
    pub const FSYNCDIR: u32 = 30;
    /// Test a POSIX lock.
    pub const GETLK: u32 = 31;
    /// Set a POSIX lock.
    pub const SETLK: u32 = 32;
    /// Set a POSIX lock, waiting.
    pub const SETLKW: u32 = 33;
    /// Permission check.
    pub const ACCESS: u32 = 34;
    /// Create and open a file.
    pub const CREATE: u32 = 35;
    /// Interrupt an outstanding request (no reply).
    pub const INTERRUPT: u32 = 36;
    /// Block map (block devices).
    pub const BMAP: u32 = 37;
    /// Session end.
    pub const DESTROY: u32 = 38;
    /// ioctl.
    pub const IOCTL: u32 = 39;
    /// poll.
    pub const POLL: u32 = 40;
    /// The kernel's answer to a RETRIEVE notification.
    pub const NOTIFY_REPLY: u32 = 41;
    /// Drop many lookup references (no reply).
    pub const BATCH_FORGET: u32 = 42;
    /// Allocate or punch space.
    pub const FALLOCATE: u32 = 43;
    /// Read a directory with attributes.
    pub const READDIRPLUS: u32 = 44;
    /// Rename with flags.
    pub const RENAME2: u32 = 45;
    /// `lseek` (SEEK_DATA / SEEK_HOLE).
    pub const LSEEK: u32 = 46;
    /// Copy a file range.
    pub const COPY_FILE_RANGE: u32 = 47;
    /// Map a file range into the DAX window (virtio-fs).
    pub const SETUPMAPPING: u32 = 48;
    /// Unmap ranges of the DAX window (virtio-fs).
    pub const REMOVEMAPPING: u32 = 49;
    /// Sync the file system.
    pub const SYNCFS: u32 = 50;
    /// Create an unnamed temporary file.
    pub const TMPFILE: u32 = 51;

    /// One past the highest opcode known (sizes per-opcode counters).
    pub const MAX: u32 = 52;

    /// A stable lower-case name for metrics labels (`"unknown"` for others).
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

/// `fuse_init_in` / `fuse_init_out` flags as one 64-bit word: bits 0–31
/// are `flags`, bits 32–63 are `flags2` (present with [`init_flags::INIT_EXT`]).
pub mod init_flags {
    /// Asynchronous reads.
    pub const ASYNC_READ: u64 = 1 << 0;
    /// POSIX file locks.
    pub const POSIX_LOCKS: u64 = 1 << 1;
    /// `fh` in file operations (obsolete).
    pub const FILE_OPS: u64 = 1 << 2;
    /// O_TRUNC handled by OPEN.
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    /// LOOKUP of "." and "..".
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    /// Writes larger than 4 KiB.
    pub const BIG_WRITES: u64 = 1 << 5;
    /// The kernel does not apply the umask.
    pub const DONT_MASK: u64 = 1 << 6;
    /// splice() writes to the device.
    pub const SPLICE_WRITE: u64 = 1 << 7;
    /// splice() moves to the device.
    pub const SPLICE_MOVE: u64 = 1 << 8;
    /// splice() reads from the device.
    pub const SPLICE_READ: u64 = 1 << 9;
    /// BSD flock locks.
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    /// ioctl on directories.
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    /// Invalidate cached pages on mtime / size change.
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    /// READDIRPLUS.
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    /// Adaptive READDIRPLUS.
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    /// Asynchronous direct I/O.
    pub const ASYNC_DIO: u64 = 1 << 15;
    /// Write-back caching.
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    /// ENOSYS from OPEN means "no open needed".
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    /// Parallel lookups / readdirs in one directory.
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    /// The server kills suid/sgid on write / chown / truncate.
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    /// POSIX ACLs.
    pub const POSIX_ACL: u64 = 1 << 20;
    /// Reading the device after abort returns ECONNABORTED.
    pub const ABORT_ERROR: u64 = 1 << 21;
    /// `max_pages` is valid.
    pub const MAX_PAGES: u64 = 1 << 22;
    /// Cache READLINK replies.
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    /// ENOSYS from OPENDIR means "no opendir needed".
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    /// Only the server invalidates cached pages (NOTIFY_INVAL_INODE).
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    /// `map_alignment` is valid (virtio-fs DAX).
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    /// Submounts (FUSE_ATTR_SUBMOUNT).
    pub const SUBMOUNTS: u64 = 1 << 27;
    /// HANDLE_KILLPRIV, version 2.
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    /// Extended `fuse_setxattr_in`.
    pub const SETXATTR_EXT: u64 = 1 << 29;
    /// `flags2` follows `flags` in `fuse_init_in` / `fuse_init_out`.
    pub const INIT_EXT: u64 = 1 << 30;
    /// Reserved (`FUSE_INIT_RESERVED`).
    pub const INIT_RESERVED: u64 = 1 << 31;
    /// Security context on create (first bit of `flags2`).
    pub const SECURITY_CTX: u64 = 1 << 32;
    /// Per-inode DAX (`FUSE_ATTR_DAX`).
    pub const HAS_INODE_DAX: u64 = 1 << 33;
    /// FUSE over io_uring (protocol 7.42; the kernel offers it only while
    /// the `fuse` module's `enable_uring` parameter is set). See
    /// [`crate::uring`].
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// Server → kernel notification codes (`enum fuse_notify_code`): sent as a
/// message with `unique` = 0 and `error` = the code (see
/// [`crate::encode_notify`]).
pub mod notify {
    /// Wake up a poller.
    pub const POLL: i32 = 1;
    /// Drop an inode's cached attributes / pages.
    pub const INVAL_INODE: i32 = 2;
    /// Drop a dentry.
    pub const INVAL_ENTRY: i32 = 3;
    /// Push data into an inode's page cache.
    pub const STORE: i32 = 4;
    /// Ask for data from an inode's page cache.
    pub const RETRIEVE: i32 = 5;
    /// Drop a dentry and its inode.
    pub const DELETE: i32 = 6;
}

/// `fuse_open_out.open_flags` bits.
pub mod fopen {
    /// Bypass the page cache.
    pub const DIRECT_IO: u32 = 1 << 0;
    /// Keep the page cache on open.
    pub const KEEP_CACHE: u32 = 1 << 1;
    /// Not seekable.
    pub const NONSEEKABLE: u32 = 1 << 2;
    /// Cache directory contents.
    pub const CACHE_DIR: u32 = 1 << 3;
    /// A stream (no file position).
    pub const STREAM: u32 = 1 << 4;
    /// No FLUSH on close.
    pub const NOFLUSH: u32 = 1 << 5;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    /// `mode` is valid.
    pub const MODE: u32 = 1 << 0;
    /// `uid` is valid.
    pub const UID: u32 = 1 << 1;
    /// `gid` is valid.
    pub const GID: u32 = 1 << 2;
    /// `size` is valid.
    pub const SIZE: u32 = 1 << 3;
    /// `atime` is valid.
    pub const ATIME: u32 = 1 << 4;
    /// `mtime` is valid.
    pub const MTIME: u32 = 1 << 5;
    /// `fh` is valid.
    pub const FH: u32 = 1 << 6;
    /// Set atime to now.
    pub const ATIME_NOW: u32 = 1 << 7;
    /// Set mtime to now.
    pub const MTIME_NOW: u32 = 1 << 8;
    /// `lock_owner` is valid.
    pub const LOCKOWNER: u32 = 1 << 9;
    /// `ctime` is valid.
    pub const CTIME: u32 = 1 << 10;
    /// Kill suid/sgid (HANDLE_KILLPRIV_V2).
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_attr.flags` bits.
pub mod attr_flags {
    /// The inode is a submount root.
    pub const SUBMOUNT: u32 = 1 << 0;
    /// DAX for this inode (HAS_INODE_DAX).
    pub const DAX: u32 = 1 << 1;
}

/// `fuse_release_in.release_flags` bits.
pub mod release_flags {
    /// Flush before release.
    pub const FLUSH: u32 = 1 << 0;
    /// Release the flock locks.
    pub const FLOCK_UNLOCK: u32 = 1 << 1;
}

/// `fuse_write_in.write_flags` bits.
pub mod write_flags {
    /// A delayed write from the page cache.
    pub const CACHE: u32 = 1 << 0;
    /// `lock_owner` is valid.
    pub const LOCKOWNER: u32 = 1 << 1;
    /// Kill suid/sgid (`FUSE_WRITE_KILL_SUIDGID`, formerly
    /// `FUSE_WRITE_KILL_PRIV`; with HANDLE_KILLPRIV_V2: the writer lacks
    /// CAP_FSETID).
    pub const KILL_SUIDGID: u32 = 1 << 2;
    /// The old name of [`KILL_SUIDGID`].
    pub const KILL_PRIV: u32 = KILL_SUIDGID;
}

/// `fuse_open_in.open_flags` / `fuse_create_in.open_flags` bits (7.33).
pub mod open_in_flags {
    /// Kill suid/sgid (`FUSE_OPEN_KILL_SUIDGID`): an O_TRUNC open by a
    /// caller without CAP_FSETID, with HANDLE_KILLPRIV_V2.
    pub const KILL_SUIDGID: u32 = 1 << 0;
}

/// `fuse_read_in.read_flags` bits.
pub mod read_flags {
    /// `lock_owner` is valid.
    pub const LOCKOWNER: u32 = 1 << 1;
}

/// `fuse_fsync_in.fsync_flags` bits.
pub mod fsync_flags {
    /// Data only (`fdatasync`).
    pub const FDATASYNC: u32 = 1 << 0;
}

/// `fuse_lk_in.lk_flags` bits.
pub mod lk_flags {
    /// A BSD flock rather than a POSIX lock.
    pub const FLOCK: u32 = 1 << 0;
}

/// `fuse_poll_in.flags` bits.
pub mod poll_flags {
    /// Request a POLL notification on readiness.
    pub const SCHEDULE_NOTIFY: u32 = 1 << 0;
}

/// `fuse_ioctl_in.flags` / `fuse_ioctl_out.flags` bits.
pub mod ioctl_flags {
    /// A 32-bit compat ioctl on a 64-bit kernel.
    pub const COMPAT: u32 = 1 << 0;
    /// Not restricted to well-formed ioctls (CUSE, or `iovec` replies).
    pub const UNRESTRICTED: u32 = 1 << 1;
    /// Retry with the iovecs of the reply.
    pub const RETRY: u32 = 1 << 2;
    /// 32-bit ioctl.
    pub const BITS_32: u32 = 1 << 3;
    /// The ioctl is on a directory.
    pub const DIR: u32 = 1 << 4;
    /// x32 compat ioctl.
    pub const COMPAT_X32: u32 = 1 << 5;
}

/// `fuse_setupmapping_in.flags` bits.
pub mod setupmapping_flags {
    /// Map writable.
    pub const WRITE: u64 = 1 << 0;
    /// Map readable.
    pub const READ: u64 = 1 << 1;
}
