//! Zero-copy access to the buffers of one descriptor chain.
//!
//! A chain's device-readable part (the request) and device-writable part
//! (the reply) are resolved once into guest-memory slices. Small things
//! (headers, arguments, non-data replies) are copied; READ and WRITE
//! payloads never are: `preadv` fills the writable slices straight from the
//! host file and `pwritev` writes the readable slices straight to it, as
//! virtiofsd does. `virtio_queue::{Reader, Writer}` do not expose their
//! slices, hence this module.

use crate::server::{Direction, PayloadIo, Transfer};
use std::io;
use std::os::fd::AsRawFd;
use virtio_queue::DescriptorChain;
use vm_memory::{GuestMemory, GuestMemoryMmap, Permissions, VolatileSlice};

/// Most iovecs handed to one `preadv` / `pwritev` (Linux `UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;

/// Why a chain's buffers could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// A descriptor points outside guest memory.
    #[error("descriptor outside guest memory")]
    Memory(#[from] vm_memory::GuestMemoryError),
    /// The descriptors' lengths add up to more than `usize`.
    #[error("descriptor lengths overflow")]
    Overflow,
}

/// The resolved buffers of one descriptor chain.
pub struct ChainBufs<'a> {
    readable: Vec<VolatileSlice<'a, ()>>,
    writable: Vec<VolatileSlice<'a, ()>>,
    readable_len: usize,
    writable_len: usize,
}

fn resolve<'a, I>(
    mem: &'a GuestMemoryMmap,
    descs: I,
    access: Permissions,
) -> Result<(Vec<VolatileSlice<'a, ()>>, usize), ChainError>
where
    I: Iterator<Item = virtio_queue::desc::split::Descriptor>,
{
    let mut out = Vec::new();
    let mut total = 0usize;
    for d in descs {
        let len = d.len() as usize;
        total = total.checked_add(len).ok_or(ChainError::Overflow)?;
        for s in mem.get_slices(d.addr(), len, access)? {
            out.push(s?);
        }
    }
    Ok((out, total))
}

impl<'a> ChainBufs<'a> {
    /// Resolves every descriptor of `chain` in `mem`. The readable part is
    /// the descriptors before the first device-writable one, the writable
    /// part that one and all after it (virtio 1.1, 2.6.4.2).
    pub fn new<M>(mem: &'a GuestMemoryMmap, chain: DescriptorChain<M>) -> Result<Self, ChainError>
    where
        M: std::ops::Deref + Clone,
        M::Target: GuestMemory,
    {
        let (readable, readable_len) = resolve(mem, chain.clone().readable(), Permissions::Read)?;
        let (writable, writable_len) = resolve(mem, chain.writable(), Permissions::Write)?;
        Ok(ChainBufs {
            readable,
            writable,
            readable_len,
            writable_len,
        })
    }

    /// Bytes in the readable (request) part.
    pub fn readable_len(&self) -> usize {
        self.readable_len
    }

    /// Bytes in the writable (reply) part.
    pub fn writable_len(&self) -> usize {
        self.writable_len
    }

    /// Copies request bytes `[skip, skip + dst.len())` into `dst`; returns
    /// the bytes copied (fewer at the end of the readable part).
    pub fn copy_in(&self, skip: usize, dst: &mut [u8]) -> usize {
        let mut done = 0;
        for_range(&self.readable, skip, dst.len(), |s| {
            done += s.copy_to(&mut dst[done..]);
        });
        done
    }

    /// Copies `src` into the reply part at byte `skip`; returns the bytes copied.
    pub fn copy_out(&self, skip: usize, src: &[u8]) -> usize {
        let mut done = 0;
        for_range(&self.writable, skip, src.len(), |s| {
            let n = s.len().min(src.len() - done);
            s.copy_from(&src[done..done + n]);
            done += n;
        });
        done
    }
}

/// Calls `f` on the sub-slices covering `[skip, skip + len)` of `slices`, in order.
fn for_range<'a>(
    slices: &[VolatileSlice<'a, ()>],
    mut skip: usize,
    mut len: usize,
    mut f: impl FnMut(VolatileSlice<'a, ()>),
) {
    for s in slices {
        if len == 0 {
            break;
        }
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        let n = (s.len() - skip).min(len);
        if let Ok(sub) = s.subslice(skip, n) {
            f(sub);
        }
        skip = 0;
        len -= n;
    }
}

fn iovecs(slices: &[VolatileSlice<'_, ()>], skip: usize, len: usize) -> Vec<libc::iovec> {
    let mut v = Vec::with_capacity(slices.len().min(MAX_IOVECS));
    for_range(slices, skip, len, |s| {
        if v.len() < MAX_IOVECS {
            v.push(libc::iovec {
                iov_base: s.ptr_guard_mut().as_ptr().cast(),
                iov_len: s.len(),
            });
        }
    });
    v
}

/// Moves `len` bytes between `slices` (from byte `at`) and a file at
/// `offset` with a positioned vectored syscall, retrying short transfers and
/// EINTR. A zero-byte transfer ends the loop (`zero_is_error`: as WriteZero).
fn transfer_loop(
    slices: &[VolatileSlice<'_, ()>],
    at: usize,
    len: usize,
    offset: u64,
    zero_is_error: bool,
    syscall: impl Fn(&[libc::iovec], libc::off_t) -> isize,
) -> io::Result<usize> {
    let mut done = 0usize;
    while done < len {
        let iov = iovecs(slices, at + done, len - done);
        if iov.is_empty() {
            break;
        }
        let pos = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        match syscall(&iov, pos) {
            0 if zero_is_error => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            0 => break,
            n if n > 0 => done += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(done)
}

impl PayloadIo for ChainBufs<'_> {
    fn transfer(&mut self, t: Transfer<'_>) -> io::Result<usize> {
        let fd = t.file.as_raw_fd();
        match t.direction {
            Direction::FileToReply => {
                let len = t.len.min(self.writable_len.saturating_sub(t.at));
                transfer_loop(&self.writable, t.at, len, t.offset, false, |iov, pos| {
                    // SAFETY: every iovec points into a guest-memory slice of
                    // this chain's writable part (bounds checked when the
                    // chain was resolved; `mem` outlives `self`), `iov_len`
                    // never exceeds the slice, and the kernel only writes
                    // into these ranges.
                    unsafe { libc::preadv(fd, iov.as_ptr(), iov.len() as libc::c_int, pos) }
                })
            }
            Direction::RequestToFile => {
                if t.at
                    .checked_add(t.len)
                    .map_or(true, |end| end > self.readable_len)
                {
                    return Err(io::Error::from_raw_os_error(libc::EINVAL));
                }
                transfer_loop(&self.readable, t.at, t.len, t.offset, true, |iov, pos| {
                    // SAFETY: every iovec points into a guest-memory slice of
                    // this chain's readable part (bounds checked when the
                    // chain was resolved; `mem` outlives `self`); the kernel
                    // only reads them.
                    unsafe { libc::pwritev(fd, iov.as_ptr(), iov.len() as libc::c_int, pos) }
                })
            }
        }
    }
}
