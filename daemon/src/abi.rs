//! The FUSE kernel ABI, shared with the residency plane: it lives in
//! [`residency::fuse_abi`] (the pool file's host-side FUSE server speaks the
//! same protocol) and is re-exported here so `crate::abi::…` paths keep working.

pub use residency::fuse_abi::*;
