//! Reply bytes: the `fuse_out_header` built by `fuse-abi`'s checked
//! constructors ([`OutHeader::for_payload`], [`OutHeader::error_only`]),
//! the payload encoders of each reply, and [`Server::finish`], which turns an
//! operation's result into what the transport sends.

use super::{AttrReply, FileSystem, Handled, Opened, Server, Timed, Xattr};
use crate::abi::{self, EntryOut, GetxattrOut, InHeader, OutHeader, OUT_HEADER_LEN};
use rustix::io::Errno;
use zerocopy::IntoBytes;

/// A payload of an operation that went through: the reply's bytes after
/// the header, and its release time.
pub(super) type OpResult = Result<Timed<Vec<u8>>, Errno>;

/// A reply: the header (its `len` checked to fit a `u32`) then `payload`;
/// an `ERANGE` error reply instead if the length does not fit.
pub(super) fn reply_bytes(unique: u64, error: i32, payload: &[u8]) -> Vec<u8> {
    match abi::reply(unique, error, &[payload]) {
        Ok(out) => out,
        Err(e) => {
            tracing::debug!(error = %e, "reply too long for a FUSE header");
            error_reply(unique, Errno::RANGE)
        }
    }
}

/// An error reply.
pub fn error_reply(unique: u64, e: Errno) -> Vec<u8> {
    let mut out = Vec::with_capacity(OUT_HEADER_LEN);
    OutHeader::error_only(unique, e.raw_os_error()).encode(&mut out);
    out
}

/// A payload ready now (no device time to wait for).
pub(super) fn now(bytes: Vec<u8>) -> OpResult {
    Ok(Timed::now(bytes))
}

/// `fuse_entry_out`.
pub(super) fn entry_bytes(e: &EntryOut) -> Vec<u8> {
    let mut b = Vec::with_capacity(abi::ENTRY_OUT_LEN);
    e.encode(&mut b);
    b
}

/// `fuse_attr_out`.
pub(super) fn attr_bytes(a: &AttrReply) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + abi::ATTR_LEN);
    abi::encode_attr_out(
        a.timeout.as_secs(),
        a.timeout.subsec_nanos(),
        &a.attr,
        &mut b,
    );
    b
}

/// `fuse_open_out`.
pub(super) fn open_bytes(o: &Opened) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    abi::encode_open_out(o.fh, o.open_flags, &mut b);
    b
}

/// GETXATTR / LISTXATTR: the size asked for (`fuse_getxattr_out`), or the data.
pub(super) fn xattr_bytes(x: Xattr) -> Vec<u8> {
    match x {
        Xattr::Size(size) => GetxattrOut { size, padding: 0 }.as_bytes().to_vec(),
        Xattr::Data(d) => d,
    }
}

impl<F: FileSystem> Server<F> {
    /// The reply to `h` from the operation's `result`, if it fits the
    /// `out_cap` bytes of room (`ERANGE` if the payload does not).
    /// `in_place`: READ data already placed after the header.
    pub(super) fn finish(
        &self,
        h: &InHeader,
        result: OpResult,
        out_cap: usize,
        in_place: usize,
    ) -> Handled {
        let completes_at_ns = result.as_ref().ok().and_then(|t| t.completes_at_ns);
        if in_place > 0 {
            // READ data is already in the reply buffers; only the header is
            // left to write (the size was clamped to the room).
            match OutHeader::for_payload(h.unique, 0, in_place) {
                Ok(header) => {
                    let mut out = Vec::with_capacity(OUT_HEADER_LEN);
                    header.encode(&mut out);
                    return Handled {
                        reply: Some(out),
                        completes_at_ns,
                        in_place,
                        deferred: None,
                    };
                }
                Err(e) => {
                    tracing::debug!(opcode = h.opcode, error = %e, "READ reply too long");
                    return Self::fitting(error_reply(h.unique, Errno::RANGE), out_cap, None);
                }
            }
        }
        let reply = match result {
            Ok(t) if OUT_HEADER_LEN + t.value.len() <= out_cap => {
                reply_bytes(h.unique, 0, &t.value)
            }
            Ok(t) => {
                tracing::debug!(
                    opcode = h.opcode,
                    need = OUT_HEADER_LEN + t.value.len(),
                    out_cap,
                    "reply does not fit the writable buffers"
                );
                error_reply(h.unique, Errno::RANGE)
            }
            Err(e) => error_reply(h.unique, e),
        };
        Self::fitting(reply, out_cap, completes_at_ns)
    }

    /// `reply` to send if it fits the `out_cap` bytes of room (otherwise
    /// nothing is sent).
    fn fitting(reply: Vec<u8>, out_cap: usize, completes_at_ns: Option<u64>) -> Handled {
        Handled {
            reply: (reply.len() <= out_cap).then_some(reply),
            completes_at_ns,
            in_place: 0,
            deferred: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::Cursor;

    #[test]
    fn replies_carry_their_length_and_the_negated_errno() {
        let r = reply_bytes(7, 0, b"abc");
        let h = OutHeader::parse(&mut Cursor::new(&r)).unwrap();
        assert_eq!(
            (h.len as usize, h.error, h.unique),
            (OUT_HEADER_LEN + 3, 0, 7)
        );
        assert_eq!(&r[OUT_HEADER_LEN..], b"abc");
        let e = error_reply(9, Errno::NOENT);
        let h = OutHeader::parse(&mut Cursor::new(&e)).unwrap();
        assert_eq!(e.len(), OUT_HEADER_LEN);
        assert_eq!(
            (h.len as usize, h.error, h.unique),
            (OUT_HEADER_LEN, -libc::ENOENT, 9)
        );
    }
}
