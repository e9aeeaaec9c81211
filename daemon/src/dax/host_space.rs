//! Host space for window stores: the host blocks under every file range a
//! window maps writable are reserved before a guest can store there.
//!
//! A store through a window reaches the host file later, in a write-back
//! the daemon makes on its own, where a full share could only fail it with
//! nobody to tell (the kernel marks the page clean, and it reads back
//! stale once the device evicts it). So the share's ENOSPC / EDQUOT comes
//! where a guest can be told: at SETUPMAPPING (the guest's `write` fails,
//! a mapped store gets `SIGBUS`, as a local file system answers a
//! `page_mkwrite` it cannot back), and when the file grows under a range
//! a window already maps writable (a truncation up, or a WRITE, FALLOCATE
//! or copy past the end that leaves a hole: that operation fails). A
//! FALLOCATE that makes a hole under such a range (punch, zero, insert)
//! has its blocks reserved again right after. Blocks already allocated
//! cost nothing; a file system without `fallocate` (or one that copies on
//! write) is left unreserved.

use super::DaxPlane;
use crate::device::PAGE;
use crate::ids::FileKey;
use rustix::fs::FallocateFlags;
use rustix::io::Errno;
use std::fs::File;

/// `fallocate(KEEP_SIZE)` of `[offset, offset + len)`; a file system that
/// cannot (`EOPNOTSUPP`, `ENOSYS`) counts as done.
fn reserve(file: &File, offset: u64, len: u64) -> Result<(), Errno> {
    match rustix::fs::fallocate(file, FallocateFlags::KEEP_SIZE, offset, len) {
        Err(e) if e == Errno::OPNOTSUPP || e == Errno::NOSYS => Ok(()),
        r => r,
    }
}

/// The parts of `ranges` (file byte ranges) within the whole pages that
/// cover `[from, to)`.
fn whole_pages(ranges: Vec<(u64, u64)>, from: u64, to: u64) -> Vec<(u64, u64)> {
    let lo = from / PAGE * PAGE;
    let hi = to.div_ceil(PAGE).saturating_mul(PAGE);
    ranges
        .into_iter()
        .map(|(s, e)| (s.max(lo), e.min(hi)))
        .filter(|(s, e)| s < e)
        .collect()
}

impl DaxPlane {
    /// Reserves host blocks under `[foffset, foffset + len)` of `key`'s
    /// file (clipped to its size) before a window maps it writable. Call
    /// it under the file's change guard (a truncation holds it too), so
    /// that the size it clips to holds until the slot is in the table.
    pub fn reserve_for_stores(&self, key: FileKey, foffset: u64, len: u64) -> Result<(), Errno> {
        let Some(file) = self.window_file(key) else {
            return Ok(());
        };
        let size = u64::try_from(rustix::fs::fstat(&*file)?.st_size).unwrap_or(0);
        let end = foffset
            .saturating_add(len)
            .min(size.div_ceil(PAGE).saturating_mul(PAGE));
        if end <= foffset {
            return Ok(());
        }
        reserve(&file, foffset, end - foffset)
    }

    /// `key`'s file is about to grow to `new_size` (a truncation up, a
    /// FALLOCATE or a WRITE past its end, a copy into it: under the file's
    /// change guard, before the host file changes): the new bytes a window
    /// maps writable get host blocks now (`KEEP_SIZE`, past the end for the
    /// moment), holes included. The size it grows from is read here, under
    /// the guard (a caller's look before it may be stale), and only for a
    /// file a window maps writable. On an error nothing reserved past the
    /// old end is kept, and the operation is refused with it.
    pub(super) fn reserve_for_growth(&self, key: FileKey, new_size: u64) -> Result<(), Errno> {
        let Some(file) = self.window_file(key) else {
            return Ok(());
        };
        let writable = self.writable_ranges(key);
        if !writable.first().is_some_and(|&(start, _)| start < new_size) {
            return Ok(());
        }
        let size = u64::try_from(rustix::fs::fstat(&*file)?.st_size).unwrap_or(0);
        if new_size <= size {
            return Ok(());
        }
        let ranges = whole_pages(writable, size, new_size);
        let Some(err) = ranges
            .iter()
            .find_map(|&(s, e)| reserve(&file, s, e - s).err())
        else {
            return Ok(());
        };
        let past = size.div_ceil(PAGE).saturating_mul(PAGE);
        let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        for (s, e) in ranges {
            let s = s.max(past);
            if s < e {
                if let Err(e2) = rustix::fs::fallocate(&*file, punch, s, e - s) {
                    tracing::debug!(error = %e2, offset = s, "cannot release host blocks a refused growth reserved");
                }
            }
        }
        Err(err)
    }

    /// A FALLOCATE (punch, zero, insert) made `[from, to)` of `key`'s file
    /// a hole (under the file's change guard): the part a window maps
    /// writable gets its host blocks back. The bytes are already gone, so
    /// a share that filled meanwhile is only logged: a store there then
    /// fails in its write-back, as before the reservation.
    pub(super) fn reserve_after_hole(&self, key: FileKey, from: u64, to: u64) {
        let Some(file) = self.window_file(key) else {
            return;
        };
        for (s, e) in whole_pages(self.writable_ranges(key), from, to) {
            if let Err(err) = reserve(&file, s, e - s) {
                tracing::warn!(error = %err, offset = s, len = e - s, "no host space under a writable DAX window after a hole was made there");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{punch, rig_with, Opened, Rig, C};
    use super::super::DaxSession;
    use crate::abi::{fattr, SetattrIn};
    use crate::device::{SharedDevice, PAGE};
    use crate::metrics::VmMetrics;
    use crate::server::{Fallocate, FileSystem};
    use crate::timing::Coherence;
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;

    const P: u64 = PAGE;

    /// A VM session whose window maps `o`'s chunk 0 writable.
    fn writable_window(r: &Rig, o: &Opened) -> Arc<DaxSession> {
        let s = Arc::new(DaxSession::new(
            r.dax.clone(),
            Arc::new(VmMetrics::new("w")),
        ));
        let extent = r.shared.read(|p, _| p.extent_of(o.key, 0)).unwrap();
        s.enter_writable_slot(o.key, extent);
        r.dax.register_session(&s);
        s
    }

    /// Fills the share up: file `name` grows a page at a time until the
    /// share has no room left; returns its size.
    fn fill_share(r: &Rig, name: &str) -> u64 {
        let path = r.share.path().join(name);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        let page = vec![0x5a; P as usize];
        loop {
            match f.write_at(&page, 0) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    return f.metadata().unwrap().len();
                }
                Err(e) => panic!("filling the share: {e}"),
            }
        }
    }

    /// A file that grows (or gets a hole) under a writable window gets host
    /// blocks for it first: on a full share the growth is refused with
    /// ENOSPC and the file keeps its size; granted, the stores the window
    /// takes there later survive their write-back though the share filled up
    /// again meanwhile.
    #[test]
    fn growth_and_holes_under_a_writable_window_keep_their_host_space() {
        let Some(r) = rig_with(SharedDevice::new, Some(64 * P)) else {
            return;
        };
        let f = r.file("f", 4, 0xaa, libc::O_RDWR);
        let _window = writable_window(&r, &f);
        let len = |name: &str| std::fs::metadata(r.share.path().join(name)).unwrap().len();
        let grow = |size: u64| SetattrIn {
            valid: fattr::SIZE,
            size,
            ..SetattrIn::default()
        };
        let filled = fill_share(&r, "fill");
        let e = r.fs.setattr(&C, f.nodeid, &grow(16 * P)).unwrap_err();
        assert_eq!(e, rustix::io::Errno::NOSPC);
        assert_eq!(len("f"), 4 * P, "a refused truncation changed the size");
        // Room made: the truncation up goes through, then the share fills.
        std::fs::File::options()
            .write(true)
            .open(r.share.path().join("fill"))
            .unwrap()
            .set_len(filled - 20 * P)
            .unwrap();
        r.fs.setattr(&C, f.nodeid, &grow(16 * P)).unwrap();
        // A FALLOCATE past the end leaves a hole [16, 20) the window maps.
        let past = Fallocate {
            nodeid: f.nodeid,
            fh: f.fh,
            offset: 20 * P,
            length: P,
            mode: 0,
        };
        r.fs.fallocate(&C, past).unwrap();
        fill_share(&r, "fill");
        for p in 4..20 {
            f.map.store(p, 0xee);
        }
        r.dax.sync_file_range(f.key, 0, u64::MAX).unwrap();
        assert_eq!(
            r.host_pages("f", 21)[4..],
            [[0xee; 16].as_slice(), &[0]].concat()
        );
        // A punch under the window, the share filled again: the stores there
        // still reach the file.
        r.fs.fallocate(&C, punch(&f, P, 2 * P)).unwrap();
        fill_share(&r, "fill");
        f.map.store(1, 0xcd);
        f.map.store(2, 0xcd);
        r.dax.sync_file_range(f.key, 0, u64::MAX).unwrap();
        assert_eq!(r.host_pages("f", 4), [0xaa, 0xcd, 0xcd, 0xaa]);
    }
}
