//! The two seams injected into the [`Server`](super::Server): the DAX
//! window's mapper and the ioctl handler. The server decodes the request
//! and hands it over; it knows nothing of pools, planes or controllers.

use crate::abi::{IoctlIn, RemoveMappingOne, SetupMappingIn};
use crate::server::filesystem::{Context, FileSystem, Timed};
use rustix::io::Errno;

/// Serves FUSE_SETUPMAPPING / FUSE_REMOVEMAPPING for one VM's DAX window.
pub trait DaxMapper: Send + Sync {
    /// Whether the front-end can take map requests now (then the server
    /// grants `FUSE_MAP_ALIGNMENT` in INIT).
    fn window_offered(&self) -> bool;

    /// log2 of the window's slot size, advertised in INIT.
    fn map_alignment_shift(&self) -> u16;

    /// Maps `m` of node `nodeid` (files resolved through `fs`).
    fn setup_mapping(
        &self,
        fs: &dyn FileSystem,
        nodeid: u64,
        m: &SetupMappingIn,
    ) -> Result<(), Errno>;

    /// Unmaps each range; all are tried, the first error is returned.
    fn remove_mappings(&self, ranges: &[RemoveMappingOne]) -> Result<(), Errno>;

    /// The guest's FUSE session ended or restarted: unmap every slot.
    fn unmap_all(&self);
}

/// Serves FUSE_IOCTL for one VM.
pub trait IoctlHandler: Send + Sync {
    /// Handles `ioctl` with its input bytes `data`; returns the reply
    /// payload (`fuse_ioctl_out` and the output bytes). `Err` is a
    /// FUSE-level error (e.g. `ENOTTY`: not an ioctl of ours).
    fn ioctl(
        &self,
        ctx: &Context,
        fs: &dyn FileSystem,
        ioctl: &IoctlIn,
        data: &[u8],
    ) -> Result<Timed<Vec<u8>>, Errno>;
}
