//! The FUSE kernel ABI: the `cxlfs-fuse-abi` crate ([`fuse_abi`]: `#[repr(C)]`
//! zerocopy structures, opcodes, flags, [`Cursor`], [`DecodeError`]), shared
//! with the residency plane and re-exported here so `crate::abi::…` paths
//! keep working.
//!
//! `InitOut` and `Kstatfs` are, for now, the literal-friendly shapes of
//! [`fuse_abi::compat`] (64-bit `flags`, no padding fields), which the
//! handlers still build; the wire structures are `fuse_abi::InitOut` /
//! `fuse_abi::Kstatfs`. Drop the `compat` line when the handlers move to them.

pub use fuse_abi::compat::{InitOut, Kstatfs};
pub use fuse_abi::*;
