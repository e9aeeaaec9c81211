//! The session and its seams: INIT (version check, feature flags, limits,
//! the DAX map alignment), DESTROY, the DAX window's SETUPMAPPING and
//! REMOVEMAPPING, and FUSE_IOCTL.

use super::ops::parse_err;
use super::reply::{now, OpResult};
use super::{Context, FileSystem, Server, MAX_READ, MAX_WRITE};
use crate::abi::{
    self, init_flags, Cursor, InitIn, IoctlIn, RemoveMappingIn, RemoveMappingOne, SetupMappingIn,
};
use rustix::io::Errno;
use std::sync::atomic::Ordering;

impl<F: FileSystem> Server<F> {
    /// DESTROY: the session ends (a new INIT may start another).
    pub(super) fn destroy(&self) -> OpResult {
        self.initialized.store(false, Ordering::Release);
        if let Some(d) = &self.dax {
            d.unmap_all();
        }
        self.fs.destroy();
        now(Vec::new())
    }

    pub(super) fn init(&self, args: &mut Cursor<'_>) -> OpResult {
        let init = InitIn::parse(args).map_err(parse_err)?;
        if init.major < abi::KERNEL_VERSION
            || (init.major == abi::KERNEL_VERSION && init.minor < abi::MIN_KERNEL_MINOR_VERSION)
        {
            tracing::warn!(
                major = init.major,
                minor = init.minor,
                "unsupported FUSE version"
            );
            return Err(Errno::PROTO);
        }
        // A new session on the same connection (guest reboot) starts over.
        self.initialized.store(false, Ordering::Release);
        if let Some(d) = &self.dax {
            // Slots of an earlier FUSE session on this connection.
            d.unmap_all();
        }
        let mut supported = init_flags::ASYNC_READ
            | init_flags::ATOMIC_O_TRUNC
            | init_flags::BIG_WRITES
            | init_flags::DO_READDIRPLUS
            | init_flags::READDIRPLUS_AUTO
            | init_flags::ASYNC_DIO
            | init_flags::PARALLEL_DIROPS
            | init_flags::MAX_PAGES
            | init_flags::INIT_EXT;
        supported |= self.fs.init(init.flags)?;
        // The guest asks for MAP_ALIGNMENT only when it has a DAX window;
        // grant it when the front-end gave us the channel to fill it.
        let window = self.dax.as_ref().filter(|d| d.window_offered());
        if window.is_some() {
            supported |= init_flags::MAP_ALIGNMENT;
        }
        let max_readahead = match self.opts.max_readahead {
            Some(cap) => init.max_readahead.min(cap),
            None => init.max_readahead,
        };
        let mut out = abi::InitOut {
            major: abi::KERNEL_VERSION,
            minor: abi::KERNEL_MINOR_VERSION,
            max_readahead,
            max_background: 64,
            congestion_threshold: 48,
            max_write: MAX_WRITE,
            time_gran: 1,
            max_pages: (MAX_READ / 4096) as u16,
            map_alignment: match window {
                Some(d) if init.flags & init_flags::MAP_ALIGNMENT != 0 => d.map_alignment_shift(),
                _ => 0,
            },
            ..abi::InitOut::default()
        };
        out.set_flags64(init.flags & supported);
        tracing::info!(
            vm = %self.metrics.name,
            minor = init.minor,
            flags = format_args!("{:#x}", out.flags64()),
            max_readahead,
            "FUSE session initialised"
        );
        self.initialized.store(true, Ordering::Release);
        let mut b = Vec::with_capacity(64);
        out.encode(&mut b);
        now(b)
    }

    pub(super) fn setup_mapping(&self, nodeid: u64, a: &mut Cursor<'_>) -> OpResult {
        let Some(dax) = &self.dax else {
            return Err(Errno::NOSYS);
        };
        let m = a.read::<SetupMappingIn>().map_err(parse_err)?;
        dax.setup_mapping(&self.fs, nodeid, &m)?;
        now(Vec::new())
    }

    pub(super) fn remove_mapping(&self, a: &mut Cursor<'_>) -> OpResult {
        let Some(dax) = &self.dax else {
            return Err(Errno::NOSYS);
        };
        let r = a.read::<RemoveMappingIn>().map_err(parse_err)?;
        if r.count == 0 || r.count > abi::REMOVEMAPPING_MAX_ENTRY {
            return Err(Errno::INVAL);
        }
        // Bounded above: at most a page of entries.
        let mut ranges = Vec::with_capacity(r.count as usize);
        for _ in 0..r.count {
            ranges.push(a.read::<RemoveMappingOne>().map_err(parse_err)?);
        }
        dax.remove_mappings(&ranges)?;
        now(Vec::new())
    }

    pub(super) fn ioctl(&self, ctx: &Context, a: &mut Cursor<'_>) -> OpResult {
        let Some(handler) = &self.ioctl else {
            return Err(Errno::NOTTY);
        };
        let ioc = a.read::<IoctlIn>().map_err(|_| Errno::INVAL)?;
        handler.ioctl(ctx, &self.fs, &ioc, a.rest())
    }
}
