//! The operations whose arguments take more than one step to decode:
//! each reads its `*_in` struct and names from the request, bounds what the
//! guest asked for, calls the [`FileSystem`] and encodes the reply payload.

use super::reply::{entry_bytes, open_bytes, xattr_bytes, OpResult};
use super::{
    Context, CopyRange, Creation, FileIo, FileSystem, FsResult, Named, PayloadIo, Server, MAX_COPY,
    MAX_READ, MAX_WRITE, WRITE_PAYLOAD_AT, XATTR_NAME_MAX, XATTR_SIZE_MAX,
};
use crate::abi::{
    self, CopyFileRangeIn, CreateIn, Cursor, EntryOut, GetxattrIn, InHeader, LinkIn, MkdirIn,
    MknodIn, ParseRequestError, ReadIn, Rename2In, RenameIn, SetxattrIn, WriteIn, OUT_HEADER_LEN,
};
use rustix::io::Errno;

pub(super) fn parse_err(e: ParseRequestError) -> Errno {
    tracing::debug!(error = %e, "malformed FUSE request");
    Errno::INVAL
}

/// `name` in the directory the request names.
pub(super) fn in_dir<'a>(h: &InHeader, name: &'a [u8]) -> Named<'a> {
    Named {
        parent: h.nodeid,
        name,
    }
}

/// An xattr name the kernel could have sent: 1 to 255 bytes.
pub(super) fn check_xattr_name(name: &[u8]) -> Result<&[u8], Errno> {
    match name.len() {
        0 => Err(Errno::INVAL),
        n if n > XATTR_NAME_MAX => Err(Errno::RANGE),
        _ => Ok(name),
    }
}

impl<F: FileSystem> Server<F> {
    pub(super) fn create(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let c = a.read::<CreateIn>().map_err(parse_err)?;
        let name = a.name().map_err(parse_err)?;
        let at = in_dir(h, name);
        let how = Creation {
            mode: c.mode,
            umask: c.umask,
            flags: c.flags,
            open_flags: c.open_flags,
        };
        let t = self.fs.create(ctx, at, how)?;
        Ok(t.map(|(entry, opened)| {
            let mut b = entry_bytes(&entry);
            b.extend_from_slice(&open_bytes(&opened));
            b
        }))
    }

    /// READ: the data goes straight into the reply through `io`; the
    /// value is the bytes read.
    pub(super) fn read(
        &self,
        ctx: &Context,
        h: &InHeader,
        a: &mut Cursor<'_>,
        out_cap: usize,
        io: &mut dyn PayloadIo,
    ) -> FsResult<usize> {
        let r = a.read::<ReadIn>().map_err(parse_err)?;
        let room = out_cap.saturating_sub(OUT_HEADER_LEN);
        let size = r
            .size
            .min(MAX_READ)
            .min(u32::try_from(room).unwrap_or(u32::MAX));
        self.fs.read(
            ctx,
            FileIo {
                nodeid: h.nodeid,
                fh: r.fh,
                offset: r.offset,
                size,
                flags: r.read_flags,
                at: OUT_HEADER_LEN,
                payload: io,
            },
        )
    }

    /// WRITE: the payload goes straight from the request to the file through `io`.
    pub(super) fn write(
        &self,
        ctx: &Context,
        h: &InHeader,
        a: &mut Cursor<'_>,
        hlen: usize,
        io: &mut dyn PayloadIo,
    ) -> OpResult {
        let w = a.read::<WriteIn>().map_err(parse_err)?;
        let fits = WRITE_PAYLOAD_AT
            .checked_add(w.size as usize)
            .is_some_and(|end| end <= hlen);
        if w.size > MAX_WRITE || !fits {
            return Err(Errno::INVAL);
        }
        let t = self.fs.write(
            ctx,
            FileIo {
                nodeid: h.nodeid,
                fh: w.fh,
                offset: w.offset,
                size: w.size,
                flags: w.write_flags,
                at: WRITE_PAYLOAD_AT,
                payload: io,
            },
        )?;
        Ok(t.map(|n| {
            let mut b = Vec::with_capacity(8);
            abi::encode_write_out(n as u32, &mut b);
            b
        }))
    }

    pub(super) fn link(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let l = a.read::<LinkIn>().map_err(parse_err)?;
        let name = a.name().map_err(parse_err)?;
        let e = self.fs.link(ctx, l.oldnodeid, in_dir(h, name))?;
        Ok(e.map(|e| entry_bytes(&e)))
    }

    pub(super) fn mknod(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let m = a.read::<MknodIn>().map_err(parse_err)?;
        let name = a.name().map_err(parse_err)?;
        let how = Creation {
            mode: m.mode,
            umask: m.umask,
            flags: 0,
            open_flags: 0,
        };
        let e = self.fs.mknod(ctx, in_dir(h, name), how, m.rdev)?;
        Ok(e.map(|e| entry_bytes(&e)))
    }

    /// TMPFILE: CREATE's argument; the name (a placeholder) is not used.
    pub(super) fn tmpfile(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let c = a.read::<CreateIn>().map_err(parse_err)?;
        let how = Creation {
            mode: c.mode,
            umask: c.umask,
            flags: c.flags,
            open_flags: c.open_flags,
        };
        let t = self.fs.tmpfile(ctx, h.nodeid, how)?;
        Ok(t.map(|(entry, opened)| {
            let mut b = entry_bytes(&entry);
            b.extend_from_slice(&open_bytes(&opened));
            b
        }))
    }

    pub(super) fn mkdir(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let m = a.read::<MkdirIn>().map_err(parse_err)?;
        let name = a.name().map_err(parse_err)?;
        let at = in_dir(h, name);
        let how = Creation {
            mode: m.mode,
            umask: m.umask,
            flags: 0,
            open_flags: 0,
        };
        let e = self.fs.mkdir(ctx, at, how)?;
        Ok(e.map(|e| entry_bytes(&e)))
    }

    pub(super) fn symlink(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let name = a.name().map_err(parse_err)?;
        let target = a.name().map_err(parse_err)?;
        let at = in_dir(h, name);
        let e = self.fs.symlink(ctx, at, target)?;
        Ok(e.map(|e| entry_bytes(&e)))
    }

    pub(super) fn unlink(
        &self,
        ctx: &Context,
        h: &InHeader,
        a: &mut Cursor<'_>,
        dir: bool,
    ) -> OpResult {
        let name = a.name().map_err(parse_err)?;
        let at = in_dir(h, name);
        let t = self.fs.unlink(ctx, at, dir)?;
        Ok(t.map(|()| Vec::new()))
    }

    pub(super) fn rename(
        &self,
        ctx: &Context,
        h: &InHeader,
        a: &mut Cursor<'_>,
        v2: bool,
    ) -> OpResult {
        let (newdir, flags) = if v2 {
            let r = a.read::<Rename2In>().map_err(parse_err)?;
            (r.newdir, r.flags)
        } else {
            (a.read::<RenameIn>().map_err(parse_err)?.newdir, 0)
        };
        let old = a.name().map_err(parse_err)?;
        let new = a.name().map_err(parse_err)?;
        let from = in_dir(h, old);
        let to = Named {
            parent: newdir,
            name: new,
        };
        let t = self.fs.rename(ctx, from, to, flags)?;
        Ok(t.map(|()| Vec::new()))
    }

    pub(super) fn readdir(
        &self,
        ctx: &Context,
        h: &InHeader,
        a: &mut Cursor<'_>,
        plus: bool,
        out_cap: usize,
    ) -> OpResult {
        let r = a.read::<ReadIn>().map_err(parse_err)?;
        let size = (r.size as usize)
            .min(out_cap.saturating_sub(OUT_HEADER_LEN))
            .min(MAX_READ as usize);
        // The kernel names the directory in the header; a guest that names
        // another one only gets lookups it could make itself.
        let dir_nodeid = h.nodeid;
        let mut buf = Vec::with_capacity(size.min(64 * 1024));
        let t = self.fs.readdir(ctx, r.fh, r.offset, &mut |e| {
            let dirent = abi::dirent_size(e.name.len());
            let need = if plus {
                abi::ENTRY_OUT_LEN + dirent
            } else {
                dirent
            };
            if buf.len() + need > size {
                return false;
            }
            if plus {
                let entry = if e.name == b"." || e.name == b".." {
                    EntryOut::default()
                } else {
                    match self.fs.lookup(ctx, dir_nodeid, &e.name) {
                        Ok(entry) => entry.value,
                        // Gone since getdents: skip it.
                        Err(_) => return true,
                    }
                };
                entry.encode(&mut buf);
            }
            abi::encode_dirent(e.ino, e.next_off, e.typ, &e.name, &mut buf);
            true
        })?;
        Ok(t.map(|()| buf))
    }

    pub(super) fn getxattr(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let g = a.read::<GetxattrIn>().map_err(parse_err)?;
        let name = check_xattr_name(a.name().map_err(parse_err)?)?;
        let x = self
            .fs
            .getxattr(ctx, h.nodeid, name, g.size.min(XATTR_SIZE_MAX))?;
        Ok(x.map(xattr_bytes))
    }

    pub(super) fn setxattr(&self, ctx: &Context, h: &InHeader, a: &mut Cursor<'_>) -> OpResult {
        let s = a.read::<SetxattrIn>().map_err(parse_err)?;
        let name = check_xattr_name(a.name().map_err(parse_err)?)?;
        if s.size > XATTR_SIZE_MAX {
            return Err(Errno::TOOBIG);
        }
        let value = a.bytes(s.size as usize).map_err(parse_err)?;
        let t = self.fs.setxattr(ctx, h.nodeid, name, value, s.flags)?;
        Ok(t.map(|()| Vec::new()))
    }

    pub(super) fn copy_file_range(
        &self,
        ctx: &Context,
        h: &InHeader,
        a: &mut Cursor<'_>,
    ) -> OpResult {
        let c = a.read::<CopyFileRangeIn>().map_err(parse_err)?;
        if c.flags != 0 {
            return Err(Errno::INVAL);
        }
        let copy = CopyRange {
            nodeid_in: h.nodeid,
            fh_in: c.fh_in,
            off_in: c.off_in,
            nodeid_out: c.nodeid_out,
            fh_out: c.fh_out,
            off_out: c.off_out,
            // Bounded before any work: a short copy is a valid answer and
            // the guest goes on with the rest.
            len: c.len.min(MAX_COPY),
        };
        let t = self.fs.copy_file_range(ctx, copy)?;
        Ok(t.map(|n| {
            let mut b = Vec::with_capacity(8);
            abi::encode_write_out(n as u32, &mut b);
            b
        }))
    }
}
