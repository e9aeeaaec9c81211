//! Server → kernel notifications: a [`crate::OutHeader`] with `unique` = 0
//! and `error` = the code ([`crate::notify`]), then one of these.

use crate::header::message_len;
use crate::{notify, EncodeError, OutHeader};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `struct fuse_notify_poll_wakeup_out`: the POLL notification.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct NotifyPollWakeupOut {
    /// The kernel handle of [`crate::PollIn`].
    pub kh: u64,
}

/// `struct fuse_notify_inval_inode_out`: the INVAL_INODE notification.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct NotifyInvalInodeOut {
    /// The inode.
    pub ino: u64,
    /// First byte (< 0: attributes only).
    pub off: i64,
    /// Length (≤ 0: to the end of the file).
    pub len: i64,
}

/// `struct fuse_notify_inval_entry_out`: the INVAL_ENTRY notification, followed by the name and a NUL.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct NotifyInvalEntryOut {
    /// The parent.
    pub parent: u64,
    /// Bytes of name.
    pub namelen: u32,
    /// Padding (`flags` from 7.37).
    pub padding: u32,
}

/// `struct fuse_notify_delete_out`: the DELETE notification, followed by the name and a NUL.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct NotifyDeleteOut {
    /// The parent.
    pub parent: u64,
    /// The child.
    pub child: u64,
    /// Bytes of name.
    pub namelen: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_notify_store_out`: the STORE notification, followed by `size` bytes of data.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct NotifyStoreOut {
    /// The inode.
    pub nodeid: u64,
    /// Offset of the data.
    pub offset: u64,
    /// Bytes of data.
    pub size: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_notify_retrieve_out`: the RETRIEVE notification.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct NotifyRetrieveOut {
    /// Echoed as the `unique` of the kernel's NOTIFY_REPLY.
    pub notify_unique: u64,
    /// The inode.
    pub nodeid: u64,
    /// Offset.
    pub offset: u64,
    /// Bytes wanted.
    pub size: u32,
    /// Padding.
    pub padding: u32,
}

/// `struct fuse_notify_retrieve_in`: the argument of the kernel's NOTIFY_REPLY (laid out as [`crate::WriteIn`]), followed by the data.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct NotifyRetrieveIn {
    /// Unused.
    pub dummy1: u64,
    /// Offset.
    pub offset: u64,
    /// Bytes of data.
    pub size: u32,
    /// Unused.
    pub dummy2: u32,
    /// Unused.
    pub dummy3: u64,
    /// Unused.
    pub dummy4: u64,
}

wire! {
    NotifyPollWakeupOut = 8, "fuse_notify_poll_wakeup_out";
    NotifyInvalInodeOut = 24, "fuse_notify_inval_inode_out";
    NotifyInvalEntryOut = 16, "fuse_notify_inval_entry_out";
    NotifyDeleteOut = 24, "fuse_notify_delete_out";
    NotifyStoreOut = 24, "fuse_notify_store_out";
    NotifyRetrieveOut = 32, "fuse_notify_retrieve_out";
    NotifyRetrieveIn = 40, "fuse_notify_retrieve_in";
}

/// Size of `fuse_notify_store_out`.
pub const NOTIFY_STORE_OUT_LEN: usize = NotifyStoreOut::SIZE;
/// Size of `fuse_notify_inval_inode_out`.
pub const NOTIFY_INVAL_INODE_OUT_LEN: usize = NotifyInvalInodeOut::SIZE;

/// Encodes the out header of a notification carrying `payload_len` bytes
/// after it: `len` (checked), `error` = `code`, `unique` = 0.
pub fn encode_notify(code: i32, payload_len: usize, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    OutHeader {
        len: message_len(payload_len)?,
        error: code,
        unique: 0,
    }
    .encode(out);
    Ok(())
}

/// Encodes a whole `FUSE_NOTIFY_STORE` message up to (not including) its
/// data: header + `fuse_notify_store_out { nodeid, offset, size }`. The
/// `size` bytes of data must follow (e.g. as a second `writev` segment).
/// Fails, writing nothing, if the whole message would not fit a `u32` length.
pub fn encode_notify_store(
    nodeid: u64,
    offset: u64,
    size: u32,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let payload = NOTIFY_STORE_OUT_LEN
        .checked_add(size as usize)
        .ok_or(EncodeError::TooLong { len: usize::MAX })?;
    encode_notify(notify::STORE, payload, out)?;
    NotifyStoreOut {
        nodeid,
        offset,
        size,
        padding: 0,
    }
    .encode(out);
    Ok(())
}

/// Encodes a whole `FUSE_NOTIFY_INVAL_INODE` message: drop the cached pages
/// of `[offset, offset + len)` of `ino` (`len` ≤ 0: to the end of the file;
/// `offset` < 0: attributes only). The kernel writes dirty pages back first.
pub fn encode_notify_inval_inode(ino: u64, offset: i64, len: i64, out: &mut Vec<u8>) {
    OutHeader {
        len: (OutHeader::SIZE + NOTIFY_INVAL_INODE_OUT_LEN) as u32,
        error: notify::INVAL_INODE,
        unique: 0,
    }
    .encode(out);
    NotifyInvalInodeOut {
        ino,
        off: offset,
        len,
    }
    .encode(out);
}
