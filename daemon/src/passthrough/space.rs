//! Space: FALLOCATE (every mode the host takes), LSEEK's SEEK_DATA and
//! SEEK_HOLE on the host's layout, and COPY_FILE_RANGE between handles.

use super::PassthroughFs;
use crate::server::{Context, CopyRange, Fallocate, FsResult, Timed};
use rustix::io::Errno;

impl PassthroughFs {
    /// FALLOCATE on the handle's file, every mode the host takes.
    pub(super) fn fallocate(&self, _ctx: &Context, range: Fallocate) -> FsResult<()> {
        let h = self.handle(range.fh)?;
        let end = range.offset.checked_add(range.length).ok_or(Errno::FBIG)?;
        if end > i64::MAX as u64 {
            return Err(Errno::FBIG);
        }
        let mode = rustix::fs::FallocateFlags::from_bits(range.mode).ok_or(Errno::OPNOTSUPP)?;
        rustix::fs::fallocate(&h.file, mode, range.offset, range.length)?;
        Ok(Timed::now(()))
    }

    /// LSEEK: SEEK_DATA / SEEK_HOLE on the host's layout (the guest
    /// answers SEEK_SET / CUR / END itself).
    pub(super) fn lseek(
        &self,
        _ctx: &Context,
        _nodeid: u64,
        fh: u64,
        offset: u64,
        whence: u32,
    ) -> FsResult<u64> {
        let h = self.handle(fh)?;
        let offset = i64::try_from(offset).map_err(|_| Errno::NXIO)?;
        let pos = match whence as i32 {
            libc::SEEK_DATA => rustix::fs::SeekFrom::Data(offset as u64),
            libc::SEEK_HOLE => rustix::fs::SeekFrom::Hole(offset as u64),
            libc::SEEK_SET => rustix::fs::SeekFrom::Start(offset as u64),
            libc::SEEK_END => rustix::fs::SeekFrom::End(offset),
            _ => return Err(Errno::INVAL),
        };
        Ok(Timed::now(rustix::fs::seek(&h.file, pos)?))
    }

    pub(super) fn copy_file_range(&self, _ctx: &Context, c: CopyRange) -> FsResult<usize> {
        let from = self.handle(c.fh_in)?;
        let to = self.handle(c.fh_out)?;
        for (off, len) in [(c.off_in, c.len), (c.off_out, c.len)] {
            if off
                .checked_add(len)
                .map_or(true, |end| end > i64::MAX as u64)
            {
                return Err(Errno::INVAL);
            }
        }
        let (mut off_in, mut off_out) = (c.off_in, c.off_out);
        let len = usize::try_from(c.len).map_err(|_| Errno::INVAL)?;
        let n = rustix::fs::copy_file_range(
            &from.file,
            Some(&mut off_in),
            &to.file,
            Some(&mut off_out),
            len,
        )?;
        Ok(Timed::now(n))
    }
}

#[cfg(test)]
mod tests {
    use crate::abi;
    use crate::passthrough::testing::{create, fs, read, v, write, C};
    use crate::server::{CopyRange, Fallocate};
    use rustix::io::Errno;
    #[test]
    fn punch_hole_seek_data_and_copy_range() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let (e, o) = create(&fs, abi::ROOT_ID, b"f", libc::O_RDWR as u32).unwrap();
        let fh = o.fh;
        let data = vec![7u8; 3 << 20];
        write(&fs, fh, 0, &data);
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let range = |mode: i32, offset: u64, length: u64| Fallocate {
            nodeid: e.nodeid,
            fh,
            offset,
            length,
            mode: mode as u32,
        };
        v(fs.fallocate(&C, range(punch, 1 << 20, 1 << 20))).unwrap();
        assert_eq!(read(&fs, fh, 1 << 20, 8), vec![0u8; 8]);
        let seek = |off, whence| v(fs.lseek(&C, e.nodeid, fh, off, whence as u32));
        assert_eq!(seek(0, libc::SEEK_HOLE).unwrap(), 1 << 20);
        assert_eq!(seek(1 << 20, libc::SEEK_DATA).unwrap(), 2 << 20);
        assert_eq!(seek(4 << 20, libc::SEEK_DATA).unwrap_err(), Errno::NXIO);
        assert_eq!(seek(0, 99).unwrap_err(), Errno::INVAL);
        // Allocation with KEEP_SIZE keeps the size; without, it grows.
        v(fs.fallocate(&C, range(libc::FALLOC_FL_KEEP_SIZE, 0, 8 << 20))).unwrap();
        assert_eq!(
            v(fs.getattr(&C, e.nodeid, None)).unwrap().attr.size,
            3 << 20
        );
        v(fs.fallocate(&C, range(0, 0, 4 << 20))).unwrap();
        assert_eq!(
            v(fs.getattr(&C, e.nodeid, None)).unwrap().attr.size,
            4 << 20
        );
        assert_eq!(
            v(fs.fallocate(&C, range(0, u64::MAX, 2))).unwrap_err(),
            Errno::FBIG
        );
        assert_eq!(
            v(fs.fallocate(&C, range(1 << 30, 0, 2))).unwrap_err(),
            Errno::OPNOTSUPP
        );
        // Copy 4 KiB of data into a second file.
        let (e2, o2) = create(&fs, abi::ROOT_ID, b"g", libc::O_RDWR as u32).unwrap();
        let copy = CopyRange {
            nodeid_in: e.nodeid,
            fh_in: fh,
            off_in: 4096,
            nodeid_out: e2.nodeid,
            fh_out: o2.fh,
            off_out: 100,
            len: 4096,
        };
        assert_eq!(v(fs.copy_file_range(&C, copy)).unwrap(), 4096);
        let g = std::fs::read(dir.path().join("g")).unwrap();
        assert_eq!(g.len(), 4196);
        assert!(g[..100].iter().all(|&b| b == 0) && g[100..].iter().all(|&b| b == 7));
        let past = CopyRange {
            off_out: u64::MAX - 10,
            ..copy
        };
        assert_eq!(v(fs.copy_file_range(&C, past)).unwrap_err(), Errno::INVAL);
    }
}
