//! [`Cursor`]: a bounds-checked reader over one request, and the errors of
//! decoding ([`DecodeError`]) and encoding ([`EncodeError`]).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Why a request (or reply, in tests) could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A field runs past the end of the request.
    #[error("request truncated: need {need} bytes at offset {at}, have {have}")]
    Truncated {
        /// Where the field starts.
        at: usize,
        /// Bytes the field needs.
        need: usize,
        /// Bytes the request has in all.
        have: usize,
    },
    /// A name without its terminating NUL.
    #[error("name at offset {at} is not NUL-terminated")]
    UnterminatedName {
        /// Where the name starts.
        at: usize,
    },
    /// The header's length disagrees with the bytes the sender supplied.
    #[error("header says {header} bytes, descriptor chain holds {actual}")]
    LengthMismatch {
        /// `fuse_in_header.len`.
        header: u32,
        /// Readable bytes in the chain.
        actual: usize,
    },
    /// An element count in the request is larger than the protocol allows.
    #[error("{what}: count {count} exceeds the maximum {max}")]
    TooMany {
        /// What is counted (e.g. `"fuse_removemapping_one"`).
        what: &'static str,
        /// The count the request carries.
        count: u64,
        /// The protocol's maximum.
        max: u64,
    },
}

/// The pre-`fuse-abi` name of [`DecodeError`].
pub type ParseRequestError = DecodeError;

/// Why a message could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The message is longer than `fuse_out_header.len` (a `u32`) can say.
    #[error("a FUSE message of {len} bytes does not fit a u32 length")]
    TooLong {
        /// The length in bytes (saturated at `usize::MAX`).
        len: usize,
    },
}

/// A bounds-checked reader over one request. Every read either returns the
/// whole value and advances, or returns a [`DecodeError`] and leaves the
/// position unchanged; nothing panics, whatever the bytes.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    /// Invariant: `pos <= buf.len()`.
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Bytes consumed so far (the offset of the next read).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes not consumed yet.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn unread(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    fn truncated(&self, need: usize) -> DecodeError {
        DecodeError::Truncated {
            at: self.pos,
            need,
            have: self.buf.len(),
        }
    }

    /// Decodes one `T` (a copy: the buffer needs no alignment).
    pub fn read<T: FromBytes + KnownLayout + Immutable>(&mut self) -> Result<T, DecodeError> {
        let need = core::mem::size_of::<T>();
        let (value, rest) = T::read_from_prefix(self.unread()).map_err(|_| self.truncated(need))?;
        self.pos = self.buf.len() - rest.len();
        Ok(value)
    }

    /// Decodes a `T` from what is left, up to its size: bytes past the end
    /// of the request read as zero (an older, shorter version of a
    /// structure that grew by appending fields, as the kernel itself
    /// accepts). Consumes `min(remaining, size_of::<T>())` bytes.
    pub fn read_zero_extended<T: FromBytes + IntoBytes + KnownLayout + Immutable>(&mut self) -> T {
        let mut value = T::new_zeroed();
        let dst = value.as_mut_bytes();
        let src = self.unread();
        let n = dst.len().min(src.len());
        dst[..n].copy_from_slice(&src[..n]);
        self.pos += n;
        value
    }

    /// Decodes `count` consecutive `T`s (e.g. the `fuse_forget_one`s of a
    /// BATCH_FORGET). The bytes must all be present before anything is
    /// allocated, so a hostile count cannot make a large allocation.
    pub fn read_many<T: FromBytes + KnownLayout + Immutable>(
        &mut self,
        count: usize,
    ) -> Result<Vec<T>, DecodeError> {
        let need = core::mem::size_of::<T>()
            .checked_mul(count)
            .ok_or_else(|| self.truncated(usize::MAX))?;
        let bytes = self.bytes(need)?;
        let mut c = Cursor::new(bytes);
        (0..count).map(|_| c.read()).collect()
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let out = self.unread().get(..n).ok_or_else(|| self.truncated(n))?;
        self.pos += n;
        Ok(out)
    }

    /// The rest of the buffer.
    pub fn rest(&mut self) -> &'a [u8] {
        let out = self.unread();
        self.pos = self.buf.len();
        out
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        self.read()
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        self.read()
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        self.read()
    }

    /// Skips `n` bytes.
    pub fn skip(&mut self, n: usize) -> Result<(), DecodeError> {
        self.bytes(n).map(|_| ())
    }

    /// A NUL-terminated name (without the NUL); consumes the NUL too.
    pub fn name(&mut self) -> Result<&'a [u8], DecodeError> {
        let at = self.pos;
        let rest = self.unread();
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::UnterminatedName { at })?;
        self.pos += nul + 1;
        Ok(&rest[..nul])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_advance_and_errors_do_not() {
        let b = [1u8, 0, 2, 0, 0, 0, b'a', b'b', 0, 9];
        let mut c = Cursor::new(&b);
        assert_eq!(c.u16().unwrap(), 1);
        assert_eq!(c.u32().unwrap(), 2);
        assert_eq!(c.position(), 6);
        assert_eq!(
            c.u64(),
            Err(DecodeError::Truncated {
                at: 6,
                need: 8,
                have: 10
            })
        );
        assert_eq!(c.position(), 6);
        assert_eq!(c.name().unwrap(), b"ab");
        assert_eq!(c.remaining(), 1);
        assert_eq!(c.name(), Err(DecodeError::UnterminatedName { at: 9 }));
        assert_eq!(c.rest(), &[9]);
        assert_eq!(c.remaining(), 0);
        assert!(c.bytes(usize::MAX).is_err());
        assert!(c.skip(1).is_err());
        assert_eq!(c.bytes(0).unwrap(), b"");
    }

    #[test]
    fn zero_extended_and_many() {
        let mut c = Cursor::new(&[1, 0, 0, 0, 2]);
        let v: [u32; 2] = c.read_zero_extended();
        assert_eq!(v, [1, 2]);
        assert_eq!(c.remaining(), 0);
        let b: Vec<u8> = (0u8..16).collect();
        let mut c = Cursor::new(&b);
        assert_eq!(c.read_many::<u32>(3).unwrap().len(), 3);
        assert!(c.read_many::<u32>(2).is_err());
        assert_eq!(c.remaining(), 4);
        assert!(c.read_many::<u64>(usize::MAX).is_err());
        assert_eq!(c.read_many::<u64>(0).unwrap(), Vec::<u64>::new());
    }
}
