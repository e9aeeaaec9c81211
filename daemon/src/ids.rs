//! Identities every layer speaks of (a leaf: imports nothing of the daemon).

pub use residency::VmId;

/// A host file's identity: `(st_dev, st_ino)`. The passthrough filesystem
/// names files by it, the pool keys their extents by it (so two VMs
/// reading one file share its device pages), the DAX plane keeps their
/// host files by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    /// Host device number.
    pub dev: u64,
    /// Host inode number.
    pub ino: u64,
}
