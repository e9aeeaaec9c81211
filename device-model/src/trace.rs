//! Trace records and their two encodings (CSV text and compact binary).
//! Pure: parses and formats bytes; reading files is the caller's job.
//!
//! # CSV
//!
//! One access per line, `time_ns,op,addr,len`:
//!
//! ```text
//! # comment lines and blank lines are skipped
//! time_ns,op,addr,len
//! 0,R,0x1000,64
//! 150,W,8192,4096
//! ```
//!
//! `op` is `R` or `W`; numbers are decimal or `0x` hex; spaces around fields
//! are ignored; the header line is optional. [`format_csv_line`] writes the
//! canonical form (decimal time and length, hex address) that
//! [`parse_csv_line`] reads back unchanged.
//!
//! # Binary
//!
//! A 16-byte header — [`BINARY_MAGIC`] then the record count as a
//! little-endian `u64` ([`UNKNOWN_COUNT`] if the writer did not know it) —
//! followed by 20-byte little-endian records: `u64 time_ns`, `u64 addr`,
//! `u32 len` whose top bit is the op (1 = write), so `len` < 2^31.
//!
//! ```
//! use cxlfs_device_model::trace::{decode_trace, encode_trace, Access};
//! use cxlfs_device_model::Op;
//! let trace = vec![Access { time_ns: 5, op: Op::Write, addr: 0x2000, len: 64 }];
//! let bytes = encode_trace(&trace).unwrap();
//! assert_eq!(decode_trace(&bytes).unwrap(), trace);
//! ```

use crate::device::Op;
use std::fmt;

/// One host access.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    /// Arrival time in ns.
    pub time_ns: u64,
    /// Load or store.
    pub op: Op,
    /// Device byte address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
}

/// The optional CSV header line (also what [`format_csv_line`]'s callers write first).
pub const CSV_HEADER: &str = "time_ns,op,addr,len";

/// Largest access length either format carries (the binary format keeps the op in bit 31).
pub const MAX_LEN: u32 = (1 << 31) - 1;

/// Why one CSV trace line could not be read. The messages name the field
/// (1-based, as in `field 3 (addr)`) and what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceLineError {
    /// Not exactly four comma-separated fields.
    #[error("expected 4 fields, got {got} (format: time_ns,op,addr,len)")]
    FieldCount {
        /// Fields found.
        got: usize,
    },
    /// A numeric field that is not a decimal or `0x` hex number.
    #[error("field {field} ({name}): `{text}` is not a number")]
    NotANumber {
        /// 1-based field position.
        field: usize,
        /// Field name.
        name: &'static str,
        /// The text found.
        text: String,
    },
    /// A numeric field too large for 64 bits.
    #[error("field {field} ({name}): `{text}` does not fit in 64 bits")]
    TooLarge {
        /// 1-based field position.
        field: usize,
        /// Field name.
        name: &'static str,
        /// The text found.
        text: String,
    },
    /// The op field is neither `R` nor `W`.
    #[error("field 2 (op): op must be R or W, got `{text}`")]
    BadOp {
        /// The text found.
        text: String,
    },
    /// A zero length.
    #[error("field 4 (len): len must be > 0")]
    ZeroLen,
    /// A length of 2^31 or more.
    #[error("field 4 (len): len {len} is too large (must be < 2^31)")]
    LenTooLarge {
        /// The length found.
        len: u64,
    },
}

fn parse_number(field: usize, name: &'static str, text: &str) -> Result<u64, TraceLineError> {
    let (digits, radix) = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (text, 10),
    };
    let valid = !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
    if !valid {
        return Err(TraceLineError::NotANumber {
            field,
            name,
            text: text.to_string(),
        });
    }
    u64::from_str_radix(digits, radix).map_err(|_| TraceLineError::TooLarge {
        field,
        name,
        text: text.to_string(),
    })
}

fn parse_op(text: &str) -> Result<Op, TraceLineError> {
    match text {
        "R" | "r" => Ok(Op::Read),
        "W" | "w" => Ok(Op::Write),
        _ => Err(TraceLineError::BadOp {
            text: text.to_string(),
        }),
    }
}

fn is_header(fields: &[&str; 4]) -> bool {
    ["time_ns", "op", "addr", "len"]
        .iter()
        .zip(fields)
        .all(|(want, got)| want.eq_ignore_ascii_case(got))
}

/// Parses one CSV line (a trailing `\n` or `\r\n` is fine). Blank lines,
/// `#` comments and the header line give `Ok(None)`.
pub fn parse_csv_line(line: &str) -> Result<Option<Access>, TraceLineError> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let mut fields = [""; 4];
    let mut got = 0;
    for field in line.split(',') {
        if let Some(slot) = fields.get_mut(got) {
            *slot = field.trim();
        }
        got += 1;
    }
    if got != 4 {
        return Err(TraceLineError::FieldCount { got });
    }
    if is_header(&fields) {
        return Ok(None);
    }
    let time_ns = parse_number(1, "time_ns", fields[0])?;
    let op = parse_op(fields[1])?;
    let addr = parse_number(3, "addr", fields[2])?;
    let len = parse_number(4, "len", fields[3])?;
    if len == 0 {
        return Err(TraceLineError::ZeroLen);
    }
    let len = match u32::try_from(len) {
        Ok(l) if l <= MAX_LEN => l,
        _ => return Err(TraceLineError::LenTooLarge { len }),
    };
    Ok(Some(Access {
        time_ns,
        op,
        addr,
        len,
    }))
}

/// Displays an access as a canonical CSV line (no newline) without allocating:
/// `write!(out, "{}", CsvLine(&access))`.
#[derive(Debug, Clone, Copy)]
pub struct CsvLine<'a>(pub &'a Access);

impl fmt::Display for CsvLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self.0;
        write!(f, "{},{},{:#x},{}", a.time_ns, a.op.letter(), a.addr, a.len)
    }
}

/// One canonical CSV line for `access`, without a newline: `150,W,0x2000,64`.
pub fn format_csv_line(access: &Access) -> String {
    CsvLine(access).to_string()
}

/// Magic bytes opening a binary trace.
pub const BINARY_MAGIC: [u8; 8] = *b"CXLTRC01";
/// Bytes in the binary header (magic + record count).
pub const HEADER_LEN: usize = 16;
/// Bytes in one binary record.
pub const RECORD_LEN: usize = 20;
/// The header's record count when the writer did not know it.
pub const UNKNOWN_COUNT: u64 = u64::MAX;

const WRITE_BIT: u32 = 1 << 31;

/// Why binary trace bytes could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BinaryTraceError {
    /// The first 8 bytes are not [`BINARY_MAGIC`].
    #[error("not a cxlfs binary trace: magic is {found:?}, expected \"CXLTRC01\"")]
    BadMagic {
        /// The bytes found (lossily as text).
        found: String,
    },
    /// Fewer than [`HEADER_LEN`] bytes.
    #[error("truncated header: {got} of 16 bytes")]
    TruncatedHeader {
        /// Bytes present.
        got: usize,
    },
    /// The data ends inside a record.
    #[error("truncated record: {got} of 20 bytes")]
    TruncatedRecord {
        /// Bytes present.
        got: usize,
    },
    /// A record with length 0.
    #[error("len must be > 0")]
    ZeroLen,
    /// An access too long to encode (the op lives in bit 31).
    #[error("len {len} is too large (must be < 2^31)")]
    LenTooLarge {
        /// The length.
        len: u32,
    },
    /// The header's count disagrees with the records present.
    #[error("header declares {declared} records but the trace holds {found}")]
    CountMismatch {
        /// Count in the header.
        declared: u64,
        /// Records found.
        found: u64,
    },
}

/// Whether `prefix` (the first bytes of a file) starts with [`BINARY_MAGIC`].
pub fn is_binary(prefix: &[u8]) -> bool {
    prefix.starts_with(&BINARY_MAGIC)
}

/// The binary header for `count` records (`None`: unknown).
pub fn encode_header(count: Option<u64>) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[..8].copy_from_slice(&BINARY_MAGIC);
    out[8..].copy_from_slice(&count.unwrap_or(UNKNOWN_COUNT).to_le_bytes());
    out
}

/// Reads a binary header from the start of `bytes`; returns the declared
/// record count (`None`: unknown).
pub fn decode_header(bytes: &[u8]) -> Result<Option<u64>, BinaryTraceError> {
    let magic_len = bytes.len().min(BINARY_MAGIC.len());
    if bytes[..magic_len] != BINARY_MAGIC[..magic_len] {
        return Err(BinaryTraceError::BadMagic {
            found: String::from_utf8_lossy(&bytes[..magic_len]).into_owned(),
        });
    }
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Err(BinaryTraceError::TruncatedHeader { got: bytes.len() });
    };
    let mut count = [0u8; 8];
    count.copy_from_slice(&header[8..]);
    let count = u64::from_le_bytes(count);
    Ok((count != UNKNOWN_COUNT).then_some(count))
}

/// Encodes one record.
#[inline]
pub fn encode_record(access: &Access) -> Result<[u8; RECORD_LEN], BinaryTraceError> {
    if access.len == 0 {
        return Err(BinaryTraceError::ZeroLen);
    }
    if access.len > MAX_LEN {
        return Err(BinaryTraceError::LenTooLarge { len: access.len });
    }
    let word = access.len | if access.op == Op::Write { WRITE_BIT } else { 0 };
    let mut out = [0u8; RECORD_LEN];
    out[..8].copy_from_slice(&access.time_ns.to_le_bytes());
    out[8..16].copy_from_slice(&access.addr.to_le_bytes());
    out[16..].copy_from_slice(&word.to_le_bytes());
    Ok(out)
}

/// Decodes one record.
#[inline]
pub fn decode_record(bytes: &[u8; RECORD_LEN]) -> Result<Access, BinaryTraceError> {
    let (time, rest) = bytes.split_at(8);
    let (addr, word) = rest.split_at(8);
    let mut t = [0u8; 8];
    let mut a = [0u8; 8];
    let mut w = [0u8; 4];
    t.copy_from_slice(time);
    a.copy_from_slice(addr);
    w.copy_from_slice(word);
    let word = u32::from_le_bytes(w);
    let len = word & !WRITE_BIT;
    if len == 0 {
        return Err(BinaryTraceError::ZeroLen);
    }
    Ok(Access {
        time_ns: u64::from_le_bytes(t),
        op: if word & WRITE_BIT != 0 {
            Op::Write
        } else {
            Op::Read
        },
        addr: u64::from_le_bytes(a),
        len,
    })
}

/// Iterator over the records in a byte slice (no header); see [`decode_records`].
#[derive(Debug, Clone)]
pub struct BinaryRecords<'a> {
    chunks: std::slice::ChunksExact<'a, u8>,
    tail_reported: bool,
}

impl Iterator for BinaryRecords<'_> {
    type Item = Result<Access, BinaryTraceError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(chunk) = self.chunks.next() {
            let mut record = [0u8; RECORD_LEN];
            record.copy_from_slice(chunk);
            return Some(decode_record(&record));
        }
        let tail = self.chunks.remainder().len();
        if tail != 0 && !self.tail_reported {
            self.tail_reported = true;
            return Some(Err(BinaryTraceError::TruncatedRecord { got: tail }));
        }
        None
    }
}

/// Decodes back-to-back records (no header). A trailing partial record
/// yields one [`BinaryTraceError::TruncatedRecord`] at the end.
pub fn decode_records(bytes: &[u8]) -> BinaryRecords<'_> {
    BinaryRecords {
        chunks: bytes.chunks_exact(RECORD_LEN),
        tail_reported: false,
    }
}

/// Encodes a whole trace (header with the count, then the records).
pub fn encode_trace<'a, I>(accesses: I) -> Result<Vec<u8>, BinaryTraceError>
where
    I: IntoIterator<Item = &'a Access>,
{
    let mut out = encode_header(None).to_vec();
    let mut count = 0u64;
    for access in accesses {
        out.extend_from_slice(&encode_record(access)?);
        count += 1;
    }
    out[8..HEADER_LEN].copy_from_slice(&count.to_le_bytes());
    Ok(out)
}

/// Decodes a whole in-memory trace, checking the header's count if it has one.
pub fn decode_trace(bytes: &[u8]) -> Result<Vec<Access>, BinaryTraceError> {
    let declared = decode_header(bytes)?;
    let body = &bytes[HEADER_LEN..];
    let out = decode_records(body).collect::<Result<Vec<_>, _>>()?;
    if let Some(declared) = declared {
        if declared != out.len() as u64 {
            return Err(BinaryTraceError::CountMismatch {
                declared,
                found: out.len() as u64,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_basics() {
        let a = parse_csv_line("10,W,0x1000,64\r\n").unwrap().unwrap();
        assert_eq!(
            a,
            Access {
                time_ns: 10,
                op: Op::Write,
                addr: 0x1000,
                len: 64
            }
        );
        assert_eq!(format_csv_line(&a), "10,W,0x1000,64");
        assert_eq!(parse_csv_line("# hi").unwrap(), None);
        assert_eq!(parse_csv_line("  ").unwrap(), None);
        assert_eq!(parse_csv_line(CSV_HEADER).unwrap(), None);
    }

    #[test]
    fn binary_basics() {
        let a = Access {
            time_ns: u64::MAX,
            op: Op::Write,
            addr: 7,
            len: MAX_LEN,
        };
        assert_eq!(decode_record(&encode_record(&a).unwrap()).unwrap(), a);
        assert_eq!(decode_header(&encode_header(Some(3))).unwrap(), Some(3));
        assert_eq!(decode_header(&encode_header(None)).unwrap(), None);
    }
}
