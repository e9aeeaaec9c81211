//! Binary records handed out undecoded: a pass that looks only at where
//! each access falls reads its address and length from the bytes, and
//! decodes the whole record only for the few accesses it keeps. Records
//! are checked to decode (a length other than 0) by
//! [`RawRecords::leading`], or, lent unchecked, by their consumer.

use super::{Access, Op, RECORD_LEN, WRITE_BIT};

/// One whole binary record: known to decode (its length is not 0) unless
/// it was lent unchecked ([`RawRecords::whole`]).
#[derive(Debug, Clone, Copy)]
pub struct RawRecord<'a>(&'a [u8; RECORD_LEN]);

impl<'a> RawRecord<'a> {
    /// `bytes` if it decodes, `None` if its length is 0.
    #[inline]
    pub fn new(bytes: &'a [u8; RECORD_LEN]) -> Option<RawRecord<'a>> {
        let record = RawRecord(bytes);
        (record.bytes() != 0).then_some(record)
    }

    /// `bytes`, not checked to decode: its length may be 0, for the
    /// consumer to refuse.
    #[inline]
    pub fn unchecked(bytes: &'a [u8; RECORD_LEN]) -> RawRecord<'a> {
        RawRecord(bytes)
    }

    #[inline]
    fn word(&self) -> u32 {
        let mut word = [0u8; 4];
        word.copy_from_slice(&self.0[16..]);
        u32::from_le_bytes(word)
    }

    /// Device byte address.
    #[inline]
    pub fn addr(&self) -> u64 {
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&self.0[8..16]);
        u64::from_le_bytes(addr)
    }

    /// Bytes (0 only in a record lent unchecked).
    #[inline]
    pub fn bytes(&self) -> u32 {
        self.word() & !WRITE_BIT
    }

    /// The byte after the access: `addr + bytes`, wrapped past 2^64.
    /// `bytes` is below 2^31, so the access is empty or wraps exactly when
    /// this is at or below [`RawRecord::addr`].
    #[inline]
    pub fn end(&self) -> u64 {
        self.addr().wrapping_add(u64::from(self.bytes()))
    }

    /// The whole access.
    #[inline]
    pub fn access(&self) -> Access {
        let mut time = [0u8; 8];
        time.copy_from_slice(&self.0[..8]);
        let word = self.word();
        Access {
            time_ns: u64::from_le_bytes(time),
            op: if word & WRITE_BIT != 0 {
                Op::Write
            } else {
                Op::Read
            },
            addr: self.addr(),
            len: word & !WRITE_BIT,
        }
    }
}

/// Whole binary records in trace order, each known to decode unless
/// lent unchecked ([`RawRecords::whole`]).
#[derive(Debug, Clone, Copy)]
pub struct RawRecords<'a> {
    bytes: &'a [u8],
}

impl<'a> RawRecords<'a> {
    /// The whole records at the start of `bytes` that decode: those before
    /// the first that does not (a length of 0) or before a torn tail.
    /// The second value is the index in `bytes` of the record that does
    /// not decode, if any.
    pub fn leading(bytes: &'a [u8]) -> (RawRecords<'a>, Option<usize>) {
        let whole = &bytes[..bytes.len() - bytes.len() % RECORD_LEN];
        let bad = whole
            .chunks_exact(RECORD_LEN)
            .position(|chunk| chunk.first_chunk().and_then(RawRecord::new).is_none());
        let good = bad.unwrap_or(whole.len() / RECORD_LEN);
        (
            RawRecords {
                bytes: &whole[..good * RECORD_LEN],
            },
            bad,
        )
    }

    /// The whole records at the start of `bytes`, not checked to decode:
    /// one of length 0 may be among them, for the consumer to refuse.
    pub fn whole(bytes: &'a [u8]) -> RawRecords<'a> {
        RawRecords {
            bytes: &bytes[..bytes.len() - bytes.len() % RECORD_LEN],
        }
    }

    /// The records' bytes, [`RECORD_LEN`] a record.
    #[inline]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Records held.
    #[inline]
    pub fn len(&self) -> usize {
        self.bytes.len() / RECORD_LEN
    }

    /// Whether it holds none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The first `mid` records and the rest (`mid` at most [`RawRecords::len`]).
    #[inline]
    pub fn split_at(&self, mid: usize) -> (RawRecords<'a>, RawRecords<'a>) {
        let (a, b) = self.bytes.split_at(mid * RECORD_LEN);
        (RawRecords { bytes: a }, RawRecords { bytes: b })
    }

    /// Record `index`, if held.
    #[inline]
    pub fn get(&self, index: usize) -> Option<RawRecord<'a>> {
        let start = index.checked_mul(RECORD_LEN)?;
        self.bytes.get(start..)?.first_chunk().map(RawRecord)
    }

    /// The records, in order.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = RawRecord<'a>> + 'a {
        self.bytes
            .chunks_exact(RECORD_LEN)
            .filter_map(|chunk| chunk.first_chunk().map(RawRecord))
    }
}

/// What a trace reader hands out: accesses already decoded, or whole
/// binary records still undecoded.
#[derive(Debug, Clone, Copy)]
pub enum Records<'a> {
    /// Decoded accesses.
    Decoded(&'a [Access]),
    /// Undecoded binary records.
    Raw(RawRecords<'a>),
}

impl Records<'_> {
    /// Accesses held.
    pub fn len(&self) -> usize {
        match self {
            Records::Decoded(a) => a.len(),
            Records::Raw(r) => r.len(),
        }
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{decode_record, encode_record};

    fn record(time_ns: u64, op: Op, addr: u64, len: u32) -> [u8; RECORD_LEN] {
        encode_record(&Access {
            time_ns,
            op,
            addr,
            len,
        })
        .expect("encodes")
    }

    #[test]
    fn a_raw_record_reads_as_the_decoded_one() {
        for (t, op, addr, len) in [
            (7, Op::Read, 0x1234_5678_9abc, 4096),
            (u64::MAX, Op::Write, u64::MAX - 1, (1 << 31) - 1),
            (0, Op::Write, 0, 1),
        ] {
            let bytes = record(t, op, addr, len);
            let raw = RawRecord::new(&bytes).expect("decodes");
            let access = decode_record(&bytes).expect("decodes");
            assert_eq!(raw.access(), access);
            assert_eq!((raw.addr(), raw.bytes()), (addr, len));
        }
        let mut zero = record(1, Op::Write, 4096, 1);
        zero[16..].copy_from_slice(&WRITE_BIT.to_le_bytes());
        assert!(RawRecord::new(&zero).is_none());
        assert!(decode_record(&zero).is_err());
    }

    #[test]
    fn leading_stops_at_a_record_that_does_not_decode_or_a_torn_tail() {
        let mut bytes: Vec<u8> = (0..5)
            .flat_map(|i| record(i, Op::Read, i * 4096, 64))
            .collect();
        let (all, bad) = RawRecords::leading(&bytes);
        assert_eq!((all.len(), bad), (5, None));
        let addrs: Vec<u64> = all.iter().map(|r| r.addr()).collect();
        assert_eq!(addrs, [0, 4096, 8192, 12288, 16384]);
        bytes.truncate(bytes.len() - 3);
        let (torn, bad) = RawRecords::leading(&bytes);
        assert_eq!((torn.len(), bad), (4, None));
        bytes[2 * RECORD_LEN + 16..3 * RECORD_LEN].fill(0);
        let (before, bad) = RawRecords::leading(&bytes);
        assert_eq!((before.len(), bad), (2, Some(2)));
        let (none, bad) = RawRecords::leading(&bytes[2 * RECORD_LEN..]);
        assert!(none.is_empty());
        assert_eq!(bad, Some(0));
    }
}
