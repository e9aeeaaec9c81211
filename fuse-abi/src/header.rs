//! The request and reply headers, and [`reply`], which builds a whole reply.

use crate::{Cursor, DecodeError, EncodeError};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `struct fuse_in_header`: the start of every request.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct InHeader {
    /// Total request length including this header.
    pub len: u32,
    /// Operation (see [`crate::opcode`]).
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
    /// Length of extension headers after the arguments, in 8-byte units
    /// (7.38; part of `padding` before).
    pub total_extlen: u16,
    /// Padding.
    pub padding: u16,
}

/// `struct fuse_out_header`: the start of every reply and notification.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, Default, PartialEq, Eq,
)]
pub struct OutHeader {
    /// Total reply length including this header.
    pub len: u32,
    /// 0, a negative errno, or (with `unique` = 0) a notification code.
    pub error: i32,
    /// The request's id (0 for a notification).
    pub unique: u64,
}

wire! {
    InHeader = 40, "fuse_in_header";
    OutHeader = 16, "fuse_out_header";
}

/// Size of [`InHeader`] on the wire.
pub const IN_HEADER_LEN: usize = InHeader::SIZE;
/// Size of [`OutHeader`] on the wire.
pub const OUT_HEADER_LEN: usize = OutHeader::SIZE;

/// `OUT_HEADER_LEN + payload_len` as a `u32` message length.
pub(crate) fn message_len(payload_len: usize) -> Result<u32, EncodeError> {
    let len = OUT_HEADER_LEN
        .checked_add(payload_len)
        .ok_or(EncodeError::TooLong { len: usize::MAX })?;
    u32::try_from(len).map_err(|_| EncodeError::TooLong { len })
}

impl InHeader {
    /// Decodes the header (same as [`InHeader::decode`]).
    pub fn parse(c: &mut Cursor<'_>) -> Result<Self, DecodeError> {
        c.read()
    }
}

impl OutHeader {
    /// The header of a message with `payload_len` bytes after it; its
    /// length checked to fit the `u32` `len`.
    pub fn for_payload(unique: u64, error: i32, payload_len: usize) -> Result<Self, EncodeError> {
        Ok(OutHeader {
            len: message_len(payload_len)?,
            error,
            unique,
        })
    }

    /// The whole of a reply that only reports `errno` (positive; sent
    /// negated, as the kernel expects).
    pub fn error_only(unique: u64, errno: i32) -> Self {
        OutHeader {
            len: OUT_HEADER_LEN as u32,
            error: -errno,
            unique,
        }
    }

    /// Decodes a reply header (same as [`OutHeader::decode`]; tests,
    /// front-end drivers).
    pub fn parse(c: &mut Cursor<'_>) -> Result<Self, DecodeError> {
        c.read()
    }

    /// Writes this header over the first [`OUT_HEADER_LEN`] bytes of `msg`
    /// (a reply whose payload was built after a placeholder header).
    /// Returns `false`, writing nothing, if `msg` is shorter than a header.
    pub fn write_over(&self, msg: &mut [u8]) -> bool {
        self.write_to_prefix(msg).is_ok()
    }
}

/// A whole reply: the header (`len` computed and checked, `error`,
/// `unique`) followed by `parts` in order.
pub fn reply(unique: u64, error: i32, parts: &[&[u8]]) -> Result<Vec<u8>, EncodeError> {
    let payload = parts.iter().try_fold(0usize, |n, p| {
        n.checked_add(p.len())
            .ok_or(EncodeError::TooLong { len: usize::MAX })
    })?;
    let header = OutHeader::for_payload(unique, error, payload)?;
    let mut out = Vec::with_capacity(OUT_HEADER_LEN + payload);
    out.extend_from_slice(header.as_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
    Ok(out)
}
