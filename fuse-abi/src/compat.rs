//! Shapes of the pre-`fuse-abi` API that are not wire layouts, kept for
//! callers that build them with struct literals (`cxlfsd`'s handlers, until
//! they move to the typed structures). Each converts to its wire structure
//! and encodes through it.
//!
//! Prefer [`crate::InitOut`] and [`crate::Kstatfs`] in new code; this module
//! goes away with its last user.

/// `fuse_init_out` with `flags` and `flags2` as one 64-bit word and no
/// reserved fields; encodes as [`crate::InitOut`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InitOut {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Largest readahead.
    pub max_readahead: u32,
    /// `flags | flags2 << 32` ([`crate::init_flags`]).
    pub flags: u64,
    /// Background requests in flight.
    pub max_background: u16,
    /// Background requests before congestion.
    pub congestion_threshold: u16,
    /// Largest WRITE.
    pub max_write: u32,
    /// Timestamp granularity, ns.
    pub time_gran: u32,
    /// Pages per request.
    pub max_pages: u16,
    /// log2 of the DAX mapping alignment.
    pub map_alignment: u16,
}

impl From<InitOut> for crate::InitOut {
    fn from(o: InitOut) -> Self {
        let mut w = crate::InitOut {
            major: o.major,
            minor: o.minor,
            max_readahead: o.max_readahead,
            max_background: o.max_background,
            congestion_threshold: o.congestion_threshold,
            max_write: o.max_write,
            time_gran: o.time_gran,
            max_pages: o.max_pages,
            map_alignment: o.map_alignment,
            ..crate::InitOut::default()
        };
        w.set_flags64(o.flags);
        w
    }
}

impl InitOut {
    /// Encodes the 64-byte `fuse_init_out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        crate::InitOut::from(*self).encode(out);
    }
}

/// `fuse_kstatfs` without its padding and spare fields; encodes as
/// [`crate::Kstatfs`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
}

impl From<Kstatfs> for crate::Kstatfs {
    fn from(s: Kstatfs) -> Self {
        crate::Kstatfs {
            blocks: s.blocks,
            bfree: s.bfree,
            bavail: s.bavail,
            files: s.files,
            ffree: s.ffree,
            bsize: s.bsize,
            namelen: s.namelen,
            frsize: s.frsize,
            ..crate::Kstatfs::default()
        }
    }
}

impl Kstatfs {
    /// Encodes the 80-byte `fuse_kstatfs`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        crate::Kstatfs::from(*self).encode(out);
    }
}
