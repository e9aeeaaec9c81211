//! The FUSE kernel ABI (`include/uapi/linux/fuse.h`, protocol 7.31 plus the
//! virtio-fs DAX requests) as `#[repr(C)]` [`zerocopy`] types: every request,
//! reply and notification structure cxlfs speaks, the opcodes and flags, a
//! bounds-checked [`Cursor`] to decode requests and one error enum,
//! [`DecodeError`].
//!
//! Two servers share it: `cxlfsd`'s virtio-fs server (guest requests over a
//! virtqueue) and the residency plane's pool-file server (`cxlfs-residency`,
//! host kernel requests over `/dev/fuse`).
//!
//! The compiler owns every layout: a structure's fields are declared in the
//! kernel's order with its names and explicit padding fields, zerocopy's
//! derives refuse any implicit padding, and each structure carries a
//! compile-time assertion of its kernel size. Decoding is
//! [`Cursor::read`] (a copy out of the buffer, no alignment needed, never
//! `unsafe`, never a panic); encoding is [`zerocopy::IntoBytes::as_bytes`]
//! (or the generated `encode`). No offset is counted by hand anywhere.
//!
//! Module map: [`cursor`] ([`Cursor`], [`DecodeError`], [`EncodeError`]),
//! [`header`] ([`InHeader`], [`OutHeader`], [`reply`]), [`ops`] (request
//! and reply arguments), [`notifications`] (server → kernel messages),
//! [`uring`] (FUSE over io_uring: entry header and SQE command), and
//! [`consts`] (opcodes, flags, versions; re-exported at the root).

// FUSE (and virtio-fs, whose FUSE messages are little endian by the virtio
// spec) puts every integer on the wire in the host's byte order, and this
// crate reads and writes fields as native integers. cxlfs supports
// little-endian hosts only; a big-endian build would misread every field.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "cxlfs-fuse-abi supports little-endian hosts only (FUSE/virtio-fs are little endian)"
);

/// Declares wire structures: a compile-time size assertion against the
/// kernel's size, `SIZE`, `encode` and `decode`, and [`Wire`].
macro_rules! wire {
    ($($name:ident = $size:literal, $kernel:literal;)*) => {$(
        const _: () = assert!(core::mem::size_of::<$name>() == $size);

        impl $name {
            /// Size of this structure on the wire (the kernel's `sizeof`).
            pub const SIZE: usize = $size;

            /// Appends the wire bytes of this structure to `out`.
            pub fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(zerocopy::IntoBytes::as_bytes(self));
            }

            /// Decodes this structure at the cursor's position.
            pub fn decode(c: &mut $crate::Cursor<'_>) -> Result<Self, $crate::DecodeError> {
                c.read()
            }
        }

        impl $crate::Wire for $name {
            const KERNEL_NAME: &'static str = $kernel;
        }
    )*};
}

pub mod consts;
pub mod cursor;
pub mod header;
pub mod notifications;
pub mod ops;
pub mod uring;

/// The zerocopy version the structures derive from (its traits give
/// `as_bytes`, `read_from_prefix`, `write_to_prefix`, …).
pub use zerocopy;

pub use consts::*;
pub use cursor::{Cursor, DecodeError, EncodeError, ParseRequestError};
pub use header::{reply, InHeader, OutHeader, IN_HEADER_LEN, OUT_HEADER_LEN};
pub use notifications::*;
pub use ops::*;
pub use uring::*;

/// A FUSE wire structure: plain old data whose bytes are its wire form.
///
/// Implemented (by the crate's `wire!` declarations) for every structure in
/// [`header`], [`ops`] and [`notifications`], each of which also has
/// inherent `SIZE`, `encode` and `decode`.
pub trait Wire:
    zerocopy::FromBytes
    + zerocopy::IntoBytes
    + zerocopy::KnownLayout
    + zerocopy::Immutable
    + Copy
    + core::fmt::Debug
{
    /// The structure's name in `include/uapi/linux/fuse.h`.
    const KERNEL_NAME: &'static str;
}
