//! READ and WRITE payloads: moved between a host file and the message
//! buffers by the transport, without a bounce buffer where it can
//! (`preadv` / `pwritev` on guest memory, in the vhost-user transport), or
//! through plain byte buffers ([`BufferIo`], for tests and tools).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Which way a payload moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// READ: file → reply.
    FileToReply,
    /// WRITE: request → file.
    RequestToFile,
}

/// One payload move: `len` bytes between message byte `at` (of the reply
/// for a READ, of the request for a WRITE) and `file` at `offset`.
#[derive(Debug, Clone, Copy)]
pub struct Transfer<'f> {
    /// Which way.
    pub direction: Direction,
    /// The host file.
    pub file: &'f File,
    /// File offset.
    pub offset: u64,
    /// Message offset.
    pub at: usize,
    /// Bytes.
    pub len: usize,
}

/// Moves READ and WRITE payloads for the server.
pub trait PayloadIo {
    /// Does `t`; returns the bytes moved (a READ is short only at end of
    /// file; a WRITE moves all or fails).
    fn transfer(&mut self, t: Transfer<'_>) -> io::Result<usize>;
}

/// [`PayloadIo`] over plain byte buffers: the request in `req`, READ data
/// collected in `data` (to be appended to the reply).
#[derive(Debug)]
pub struct BufferIo<'a> {
    /// The whole request.
    pub req: &'a [u8],
    /// READ data.
    pub data: Vec<u8>,
}

impl PayloadIo for BufferIo<'_> {
    fn transfer(&mut self, t: Transfer<'_>) -> io::Result<usize> {
        match t.direction {
            Direction::FileToReply => {
                self.data.resize(t.len, 0);
                let mut done = 0usize;
                while done < t.len {
                    match t
                        .file
                        .read_at(&mut self.data[done..], t.offset + done as u64)
                    {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    }
                }
                self.data.truncate(done);
                Ok(done)
            }
            Direction::RequestToFile => {
                let data =
                    t.at.checked_add(t.len)
                        .and_then(|end| self.req.get(t.at..end))
                        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
                t.file.write_all_at(data, t.offset)?;
                Ok(t.len)
            }
        }
    }
}
