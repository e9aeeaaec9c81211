//! Request arguments and reply payloads: every `fuse_*_in` / `fuse_*_out`
//! structure that follows a header, plus the structures they embed.
//!
//! Names follow the kernel's (`fuse_setupmapping_in` → [`SetupMappingIn`]);
//! fields keep the kernel's names, padding included, except `type`, which is
//! `typ`. Requests whose argument is only a name (LOOKUP, UNLINK, …) or
//! nothing (READLINK, STATFS, …) have no structure here: use
//! [`crate::Cursor::name`].

use crate::{Cursor, DecodeError, EncodeError, Wire};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `struct fuse_attr`: a node's attributes.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Access time, seconds.
    pub atime: u64,
    /// Modification time, seconds.
    pub mtime: u64,
    /// Change time, seconds.
    pub ctime: u64,
    /// Access time, nanoseconds.
    pub atimensec: u32,
    /// Modification time, nanoseconds.
    pub mtimensec: u32,
    /// Change time, nanoseconds.
    pub ctimensec: u32,
    /// File type and permissions.
    pub mode: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number (device nodes).
    pub rdev: u32,
    /// Preferred I/O size.
    pub blksize: u32,
    /// [`crate::attr_flags`].
    pub flags: u32,
}

/// `struct fuse_kstatfs`: file system statistics.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct Kstatfs {
    /// Blocks in all (of `frsize`).
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for unprivileged users.
    pub bavail: u64,
    /// Inodes in all.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
    /// Fragment size.
    pub frsize: u32,
    /// Padding.
    pub padding: u32,
    /// Spare.
    pub spare: [u32; 6],
}

/// `struct fuse_file_lock`: a lock range.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct FileLock {
    /// First byte.
    pub start: u64,
    /// Last byte.
    pub end: u64,
    /// `F_RDLCK` / `F_WRLCK` / `F_UNLCK` (`type` in the kernel).
    pub typ: u32,
    /// Owner's pid.
    pub pid: u32,
}

/// `struct fuse_entry_out`: the reply to LOOKUP, MKNOD, MKDIR, SYMLINK, LINK (and CREATE's first part).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct EntryOut {
    /// The node id (0: negative entry).
    pub nodeid: u64,
    /// Inode generation.
    pub generation: u64,
    /// Dentry cache timeout, seconds.
    pub entry_valid: u64,
    /// Attribute cache timeout, seconds.
    pub attr_valid: u64,
    /// Dentry cache timeout, nanoseconds.
    pub entry_valid_nsec: u32,
    /// Attribute cache timeout, nanoseconds.
    pub attr_valid_nsec: u32,
    /// The attributes.
    pub attr: Attr,
}

/// `struct fuse_forget_in`: FORGET's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct ForgetIn {
    /// Lookup references dropped.
    pub nlookup: u64,
}

/// `struct fuse_forget_one`: one entry of BATCH_FORGET.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct ForgetOne {
    /// The node.
    pub nodeid: u64,
    /// Lookup references dropped.
    pub nlookup: u64,
}

/// `struct fuse_batch_forget_in`: BATCH_FORGET's argument, followed by `count` [`ForgetOne`]s.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct BatchForgetIn {
    /// Entries that follow.
    pub count: u32,
    /// Padding.
    pub dummy: u32,
}

/// `struct fuse_getattr_in`: GETATTR's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct GetattrIn {
    /// [`crate::GETATTR_FH`].
    pub getattr_flags: u32,
    /// Padding.
    pub dummy: u32,
    /// File handle (with `GETATTR_FH`).
    pub fh: u64,
}

/// `struct fuse_attr_out`: the reply to GETATTR and SETATTR.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct AttrOut {
    /// Attribute cache timeout, seconds.
    pub attr_valid: u64,
    /// Attribute cache timeout, nanoseconds.
    pub attr_valid_nsec: u32,
    /// Padding.
    pub dummy: u32,
    /// The attributes.
    pub attr: Attr,
}

/// `struct fuse_mknod_in`: MKNOD's argument, followed by the name.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct MknodIn {
    /// File type and permissions.
    pub mode: u32,
    /// Device number.
    pub rdev: u32,
    /// The caller's umask.
    pub umask: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_mkdir_in`: MKDIR's argument, followed by the name.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct MkdirIn {
    /// Permissions.
    pub mode: u32,
    /// The caller's umask.
    pub umask: u32,
}

/// `struct fuse_rename_in`: RENAME's argument, followed by the old and new names.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct RenameIn {
    /// The new parent.
    pub newdir: u64,
}

/// `struct fuse_rename2_in`: RENAME2's argument, followed by the old and new names.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct Rename2In {
    /// The new parent.
    pub newdir: u64,
    /// `RENAME_*` flags.
    pub flags: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_link_in`: LINK's argument, followed by the new name.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct LinkIn {
    /// The node linked to.
    pub oldnodeid: u64,
}

/// `struct fuse_setattr_in`: SETATTR's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct SetattrIn {
    /// Which fields are valid ([`crate::fattr`]).
    pub valid: u32,
    /// Padding.
    pub padding: u32,
    /// File handle (with `fattr::FH`).
    pub fh: u64,
    /// New size.
    pub size: u64,
    /// Lock owner (with `fattr::LOCKOWNER`).
    pub lock_owner: u64,
    /// Access time, seconds.
    pub atime: u64,
    /// Modification time, seconds.
    pub mtime: u64,
    /// Change time, seconds.
    pub ctime: u64,
    /// Access time, nanoseconds.
    pub atimensec: u32,
    /// Modification time, nanoseconds.
    pub mtimensec: u32,
    /// Change time, nanoseconds.
    pub ctimensec: u32,
    /// New mode.
    pub mode: u32,
    /// Unused.
    pub unused4: u32,
    /// New owner.
    pub uid: u32,
    /// New group.
    pub gid: u32,
    /// Unused.
    pub unused5: u32,
}

/// `struct fuse_open_in`: OPEN's and OPENDIR's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct OpenIn {
    /// `open(2)` flags.
    pub flags: u32,
    /// [`crate::open_in_flags`] (7.33; 0 before).
    pub open_flags: u32,
}

/// `struct fuse_create_in`: CREATE's argument, followed by the name.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct CreateIn {
    /// `open(2)` flags.
    pub flags: u32,
    /// File type and permissions.
    pub mode: u32,
    /// The caller's umask.
    pub umask: u32,
    /// [`crate::open_in_flags`] (7.33; 0 before).
    pub open_flags: u32,
}

/// `struct fuse_open_out`: the reply to OPEN, OPENDIR (and CREATE's second part).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct OpenOut {
    /// File handle.
    pub fh: u64,
    /// [`crate::fopen`] flags.
    pub open_flags: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_release_in`: RELEASE's and RELEASEDIR's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct ReleaseIn {
    /// File handle.
    pub fh: u64,
    /// `open(2)` flags of the file.
    pub flags: u32,
    /// [`crate::release_flags`].
    pub release_flags: u32,
    /// Lock owner.
    pub lock_owner: u64,
}

/// `struct fuse_flush_in`: FLUSH's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct FlushIn {
    /// File handle.
    pub fh: u64,
    /// Unused.
    pub unused: u32,
    /// Padding.
    pub padding: u32,
    /// Lock owner.
    pub lock_owner: u64,
}

/// `struct fuse_read_in`: READ's, READDIR's and READDIRPLUS's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct ReadIn {
    /// File handle.
    pub fh: u64,
    /// Offset (READDIR: the cookie).
    pub offset: u64,
    /// Bytes wanted.
    pub size: u32,
    /// [`crate::read_flags`].
    pub read_flags: u32,
    /// Lock owner.
    pub lock_owner: u64,
    /// `open(2)` flags of the file.
    pub flags: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_write_in`: WRITE's argument, followed by the `size` bytes of data.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct WriteIn {
    /// File handle.
    pub fh: u64,
    /// Offset.
    pub offset: u64,
    /// Bytes of data.
    pub size: u32,
    /// [`crate::write_flags`].
    pub write_flags: u32,
    /// Lock owner.
    pub lock_owner: u64,
    /// `open(2)` flags of the file.
    pub flags: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_write_out`: the reply to WRITE.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct WriteOut {
    /// Bytes written.
    pub size: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_statfs_out`: the reply to STATFS.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct StatfsOut {
    /// The statistics.
    pub st: Kstatfs,
}

/// `struct fuse_fsync_in`: FSYNC's and FSYNCDIR's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct FsyncIn {
    /// File handle.
    pub fh: u64,
    /// [`crate::fsync_flags`].
    pub fsync_flags: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_setxattr_in` in its pre-7.33 (8-byte) form: SETXATTR's argument, followed by the name and `size` bytes of value.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct SetxattrIn {
    /// Bytes of value.
    pub size: u32,
    /// `XATTR_CREATE` / `XATTR_REPLACE`.
    pub flags: u32,
}

/// `struct fuse_getxattr_in`: GETXATTR's and LISTXATTR's argument (GETXATTR: followed by the name).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct GetxattrIn {
    /// Buffer size (0: ask for the size).
    pub size: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_getxattr_out`: the reply to a GETXATTR / LISTXATTR of size 0.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct GetxattrOut {
    /// Bytes needed.
    pub size: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_lk_in`: GETLK's, SETLK's and SETLKW's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct LkIn {
    /// File handle.
    pub fh: u64,
    /// Lock owner.
    pub owner: u64,
    /// The lock.
    pub lk: FileLock,
    /// [`crate::lk_flags`].
    pub lk_flags: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_lk_out`: the reply to GETLK.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct LkOut {
    /// The conflicting lock, or `F_UNLCK`.
    pub lk: FileLock,
}

/// `struct fuse_access_in`: ACCESS's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct AccessIn {
    /// `access(2)` mask.
    pub mask: u32,
    /// Padding.
    pub padding: u32,
}

/// The 16-byte `struct fuse_init_in` of protocol 7.31: INIT's argument (see [`InitInExt`] for what follows with `INIT_EXT`, and [`InitIn::parse`]).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct InitIn {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Largest readahead.
    pub max_readahead: u32,
    /// Bits 0–31 of [`crate::init_flags`].
    pub flags: u32,
}

/// The rest of `struct fuse_init_in` (7.36+), present when `flags` has [`crate::init_flags::INIT_EXT`].
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct InitInExt {
    /// Bits 32–63 of [`crate::init_flags`].
    pub flags2: u32,
    /// Unused.
    pub unused: [u32; 11],
}

/// `struct fuse_init_out`: the reply to INIT (the 64-byte form; see [`InitOut::flags64`]).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct InitOut {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Largest readahead.
    pub max_readahead: u32,
    /// Bits 0–31 of [`crate::init_flags`].
    pub flags: u32,
    /// Background requests in flight.
    pub max_background: u16,
    /// Background requests before congestion.
    pub congestion_threshold: u16,
    /// Largest WRITE.
    pub max_write: u32,
    /// Timestamp granularity, ns.
    pub time_gran: u32,
    /// Pages per request (with `MAX_PAGES`).
    pub max_pages: u16,
    /// log2 of the DAX mapping alignment (with `MAP_ALIGNMENT`).
    pub map_alignment: u16,
    /// Bits 32–63 of [`crate::init_flags`] (with `INIT_EXT`).
    pub flags2: u32,
    /// Stacking depth (7.40; unused before).
    pub max_stack_depth: u32,
    /// Unused.
    pub unused: [u32; 6],
}

/// `struct fuse_interrupt_in`: INTERRUPT's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct InterruptIn {
    /// The request interrupted.
    pub unique: u64,
}

/// `struct fuse_bmap_in`: BMAP's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct BmapIn {
    /// Block in the file.
    pub block: u64,
    /// Block size.
    pub blocksize: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_bmap_out`: the reply to BMAP.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct BmapOut {
    /// Block on the device.
    pub block: u64,
}

/// `struct fuse_ioctl_in`: IOCTL's argument, followed by `in_size` bytes of input.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct IoctlIn {
    /// File handle.
    pub fh: u64,
    /// [`crate::ioctl_flags`].
    pub flags: u32,
    /// The ioctl number.
    pub cmd: u32,
    /// The ioctl argument (a user pointer).
    pub arg: u64,
    /// Bytes of input that follow.
    pub in_size: u32,
    /// Bytes of output wanted.
    pub out_size: u32,
}

/// `struct fuse_ioctl_iovec`: one buffer of an unrestricted ioctl.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct IoctlIovec {
    /// User address.
    pub base: u64,
    /// Length.
    pub len: u64,
}

/// `struct fuse_ioctl_out`: the reply to IOCTL, followed by the output.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct IoctlOut {
    /// The ioctl's return value.
    pub result: i32,
    /// [`crate::ioctl_flags`].
    pub flags: u32,
    /// Input iovecs (with `RETRY`).
    pub in_iovs: u32,
    /// Output iovecs (with `RETRY`).
    pub out_iovs: u32,
}

/// `struct fuse_poll_in`: POLL's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct PollIn {
    /// File handle.
    pub fh: u64,
    /// Kernel handle for notifications.
    pub kh: u64,
    /// [`crate::poll_flags`].
    pub flags: u32,
    /// Events polled for.
    pub events: u32,
}

/// `struct fuse_poll_out`: the reply to POLL.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct PollOut {
    /// Events ready.
    pub revents: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_fallocate_in`: FALLOCATE's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct FallocateIn {
    /// File handle.
    pub fh: u64,
    /// Start.
    pub offset: u64,
    /// Length.
    pub length: u64,
    /// `fallocate(2)` mode.
    pub mode: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_dirent` without its name: one READDIR entry, followed by `namelen` bytes of name and zero padding to 8 bytes (see [`encode_dirent`]).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct Dirent {
    /// Inode number.
    pub ino: u64,
    /// Cookie of the next entry.
    pub off: u64,
    /// Bytes of name.
    pub namelen: u32,
    /// `DT_*` type (`type` in the kernel).
    pub typ: u32,
}

/// `struct fuse_direntplus` without its name: one READDIRPLUS entry.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct DirentPlus {
    /// The entry (as LOOKUP's reply).
    pub entry_out: EntryOut,
    /// The directory entry.
    pub dirent: Dirent,
}

/// `struct fuse_lseek_in`: LSEEK's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct LseekIn {
    /// File handle.
    pub fh: u64,
    /// Offset.
    pub offset: u64,
    /// `SEEK_*`.
    pub whence: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_lseek_out`: the reply to LSEEK.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct LseekOut {
    /// The resulting offset.
    pub offset: u64,
}

/// `struct fuse_copy_file_range_in`: COPY_FILE_RANGE's argument.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct CopyFileRangeIn {
    /// Source handle.
    pub fh_in: u64,
    /// Source offset.
    pub off_in: u64,
    /// Destination node.
    pub nodeid_out: u64,
    /// Destination handle.
    pub fh_out: u64,
    /// Destination offset.
    pub off_out: u64,
    /// Bytes.
    pub len: u64,
    /// Flags.
    pub flags: u64,
}

/// `struct fuse_setupmapping_in`: SETUPMAPPING's argument (virtio-fs DAX).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct SetupMappingIn {
    /// File handle.
    pub fh: u64,
    /// Offset in the file.
    pub foffset: u64,
    /// Length.
    pub len: u64,
    /// [`crate::setupmapping_flags`].
    pub flags: u64,
    /// Offset in the DAX window.
    pub moffset: u64,
}

/// `struct fuse_removemapping_in`: REMOVEMAPPING's argument, followed by `count` [`RemoveMappingOne`]s (at most [`crate::REMOVEMAPPING_MAX_ENTRY`] per request).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct RemoveMappingIn {
    /// Entries that follow.
    pub count: u32,
}

/// `struct fuse_removemapping_one`: one range of REMOVEMAPPING.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct RemoveMappingOne {
    /// Offset in the DAX window.
    pub moffset: u64,
    /// Length.
    pub len: u64,
}

wire! {
    Attr = 88, "fuse_attr";
    Kstatfs = 80, "fuse_kstatfs";
    FileLock = 24, "fuse_file_lock";
    EntryOut = 128, "fuse_entry_out";
    ForgetIn = 8, "fuse_forget_in";
    ForgetOne = 16, "fuse_forget_one";
    BatchForgetIn = 8, "fuse_batch_forget_in";
    GetattrIn = 16, "fuse_getattr_in";
    AttrOut = 104, "fuse_attr_out";
    MknodIn = 16, "fuse_mknod_in";
    MkdirIn = 8, "fuse_mkdir_in";
    RenameIn = 8, "fuse_rename_in";
    Rename2In = 16, "fuse_rename2_in";
    LinkIn = 8, "fuse_link_in";
    SetattrIn = 88, "fuse_setattr_in";
    OpenIn = 8, "fuse_open_in";
    CreateIn = 16, "fuse_create_in";
    OpenOut = 16, "fuse_open_out";
    ReleaseIn = 24, "fuse_release_in";
    FlushIn = 24, "fuse_flush_in";
    ReadIn = 40, "fuse_read_in";
    WriteIn = 40, "fuse_write_in";
    WriteOut = 8, "fuse_write_out";
    StatfsOut = 80, "fuse_statfs_out";
    FsyncIn = 16, "fuse_fsync_in";
    SetxattrIn = 8, "fuse_setxattr_in";
    GetxattrIn = 8, "fuse_getxattr_in";
    GetxattrOut = 8, "fuse_getxattr_out";
    LkIn = 48, "fuse_lk_in";
    LkOut = 24, "fuse_lk_out";
    AccessIn = 8, "fuse_access_in";
    InitIn = 16, "fuse_init_in";
    InitInExt = 48, "fuse_init_in";
    InitOut = 64, "fuse_init_out";
    InterruptIn = 8, "fuse_interrupt_in";
    BmapIn = 16, "fuse_bmap_in";
    BmapOut = 8, "fuse_bmap_out";
    IoctlIn = 32, "fuse_ioctl_in";
    IoctlIovec = 16, "fuse_ioctl_iovec";
    IoctlOut = 16, "fuse_ioctl_out";
    PollIn = 24, "fuse_poll_in";
    PollOut = 8, "fuse_poll_out";
    FallocateIn = 32, "fuse_fallocate_in";
    Dirent = 24, "fuse_dirent";
    DirentPlus = 152, "fuse_direntplus";
    LseekIn = 24, "fuse_lseek_in";
    LseekOut = 8, "fuse_lseek_out";
    CopyFileRangeIn = 56, "fuse_copy_file_range_in";
    SetupMappingIn = 40, "fuse_setupmapping_in";
    RemoveMappingIn = 4, "fuse_removemapping_in";
    RemoveMappingOne = 16, "fuse_removemapping_one";
}

/// Size of `fuse_attr`.
pub const ATTR_LEN: usize = Attr::SIZE;
/// Size of `fuse_entry_out`.
pub const ENTRY_OUT_LEN: usize = EntryOut::SIZE;
/// Size of `fuse_dirent` without its name.
pub const DIRENT_LEN: usize = Dirent::SIZE;
/// Size of `fuse_direntplus` without its name.
pub const DIRENTPLUS_LEN: usize = DirentPlus::SIZE;
/// Size of `fuse_read_in` / `fuse_write_in` (protocol ≥ 7.9).
pub const READ_IN_LEN: usize = ReadIn::SIZE;

/// INIT's argument with the 64-bit flags put together: what
/// [`InitIn::parse`] returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InitRequest {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Largest readahead.
    pub max_readahead: u32,
    /// `flags | flags2 << 32` ([`crate::init_flags`]).
    pub flags: u64,
}

impl InitIn {
    /// Decodes INIT's argument: the 16-byte `fuse_init_in` and, when its
    /// flags have `INIT_EXT` and more bytes follow, the extension
    /// ([`InitInExt`], zero-extended if the sender's is shorter), whose
    /// `flags2` becomes bits 32–63 of the result's `flags`.
    pub fn parse(c: &mut Cursor<'_>) -> Result<InitRequest, DecodeError> {
        let init: InitIn = c.read()?;
        let mut flags = u64::from(init.flags);
        if flags & crate::init_flags::INIT_EXT != 0 && c.remaining() > 0 {
            let ext: InitInExt = c.read_zero_extended();
            flags |= u64::from(ext.flags2) << 32;
        }
        Ok(InitRequest {
            major: init.major,
            minor: init.minor,
            max_readahead: init.max_readahead,
            flags,
        })
    }
}

impl InitOut {
    /// `flags | flags2 << 32` ([`crate::init_flags`]).
    pub fn flags64(&self) -> u64 {
        u64::from(self.flags) | u64::from(self.flags2) << 32
    }

    /// Sets `flags` and `flags2` from one 64-bit word.
    pub fn set_flags64(&mut self, flags: u64) {
        self.flags = flags as u32;
        self.flags2 = (flags >> 32) as u32;
    }
}

impl ReadIn {
    /// Decodes the 40-byte `fuse_read_in` (same as [`ReadIn::decode`]).
    pub fn parse(c: &mut Cursor<'_>) -> Result<Self, DecodeError> {
        c.read()
    }
}

impl WriteIn {
    /// Decodes `fuse_write_in` and the `size` bytes of data that follow it.
    pub fn parse_with_data<'a>(c: &mut Cursor<'a>) -> Result<(Self, &'a [u8]), DecodeError> {
        let mut probe = c.clone();
        let w: WriteIn = probe.read()?;
        let data = probe.bytes(w.size as usize)?;
        *c = probe;
        Ok((w, data))
    }
}

impl RemoveMappingIn {
    /// Decodes REMOVEMAPPING's argument and its ranges, refusing more than
    /// [`crate::REMOVEMAPPING_MAX_ENTRY`] of them.
    pub fn parse_with_entries(
        c: &mut Cursor<'_>,
    ) -> Result<(Self, Vec<RemoveMappingOne>), DecodeError> {
        let mut probe = c.clone();
        let r: RemoveMappingIn = probe.read()?;
        if r.count > crate::REMOVEMAPPING_MAX_ENTRY {
            return Err(DecodeError::TooMany {
                what: RemoveMappingOne::KERNEL_NAME,
                count: r.count.into(),
                max: crate::REMOVEMAPPING_MAX_ENTRY.into(),
            });
        }
        let entries = probe.read_many(r.count as usize)?;
        *c = probe;
        Ok((r, entries))
    }
}

impl Dirent {
    /// The header of an entry named `name` (`namelen` checked to fit).
    pub fn new(ino: u64, off: u64, typ: u32, name: &[u8]) -> Result<Self, EncodeError> {
        Ok(Dirent {
            ino,
            off,
            namelen: u32::try_from(name.len())
                .map_err(|_| EncodeError::TooLong { len: name.len() })?,
            typ,
        })
    }
}

/// Encodes `fuse_attr_out`.
pub fn encode_attr_out(attr_valid: u64, attr_valid_nsec: u32, attr: &Attr, out: &mut Vec<u8>) {
    AttrOut {
        attr_valid,
        attr_valid_nsec,
        dummy: 0,
        attr: *attr,
    }
    .encode(out);
}

/// Encodes `fuse_open_out`.
pub fn encode_open_out(fh: u64, open_flags: u32, out: &mut Vec<u8>) {
    OpenOut {
        fh,
        open_flags,
        padding: 0,
    }
    .encode(out);
}

/// Encodes `fuse_write_out`.
pub fn encode_write_out(size: u32, out: &mut Vec<u8>) {
    WriteOut { size, padding: 0 }.encode(out);
}

/// Size of a `fuse_dirent` with a name of `namelen` bytes, padded to 8
/// (`FUSE_DIRENT_SIZE`); saturates at `usize::MAX` rounded down to 8.
pub fn dirent_size(namelen: usize) -> usize {
    align8(DIRENT_LEN.saturating_add(namelen))
}

/// Size of a `fuse_direntplus` with a name of `namelen` bytes, padded to 8
/// (`FUSE_DIRENTPLUS_SIZE`).
pub fn direntplus_size(namelen: usize) -> usize {
    align8(DIRENTPLUS_LEN.saturating_add(namelen))
}

fn align8(n: usize) -> usize {
    n.checked_add(7).map_or(usize::MAX, |n| n) & !7
}

/// Appends `name` and the zero padding that ends an entry at a multiple of 8.
fn name_and_padding(name: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(name);
    let pad = align8(name.len()) - name.len();
    out.resize(out.len() + pad, 0);
}

/// Encodes one `fuse_dirent` and its name, padded to 8 bytes. Names are
/// directory-entry names (at most `NAME_MAX` bytes), so `namelen` always
/// fits; a longer one is recorded as `u32::MAX`.
pub fn encode_dirent(ino: u64, off: u64, typ: u32, name: &[u8], out: &mut Vec<u8>) {
    let d = Dirent::new(ino, off, typ, name).unwrap_or(Dirent {
        ino,
        off,
        namelen: u32::MAX,
        typ,
    });
    d.encode(out);
    name_and_padding(name, out);
}

/// Encodes one `fuse_direntplus` (`entry`, then the dirent) and its name,
/// padded to 8 bytes.
pub fn encode_direntplus(
    entry: &EntryOut,
    off: u64,
    typ: u32,
    name: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    DirentPlus {
        entry_out: *entry,
        dirent: Dirent::new(entry.attr.ino, off, typ, name)?,
    }
    .encode(out);
    name_and_padding(name, out);
    Ok(())
}
