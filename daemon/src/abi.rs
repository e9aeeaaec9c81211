//! The FUSE kernel ABI: the `cxlfs-fuse-abi` crate ([`fuse_abi`]: `#[repr(C)]`
//! zerocopy structures, opcodes, flags, [`Cursor`], [`DecodeError`]), shared
//! with the residency plane and re-exported here so `crate::abi::…` paths
//! keep working.

pub use fuse_abi::*;
