//! Trace records and their two encodings (CSV text and compact binary).
//! Pure: parses and formats bytes; opening files is the caller's job
//! ([`BinaryReader`] decodes from any [`BufRead`] the caller hands it).
//!
//! # Arrival mode
//!
//! A trace may record how its accesses are meant to arrive ([`Arrival`]):
//! `trace` (each at its own `time_ns`), `closed[:THINK]` (one outstanding:
//! the times carry no meaning) or `fixed:INTERVAL`. `cxlfs trace gen` records
//! the mode it was asked for and `cxlfs replay --trace` replays with it
//! unless `--arrival` says otherwise; a trace that records nothing is
//! replayed at its own times.
//!
//! # CSV
//!
//! One access per line, `time_ns,op,addr,len`:
//!
//! ```text
//! # comment lines and blank lines are skipped
//! # arrival: closed
//! time_ns,op,addr,len
//! 0,R,0x1000,64
//! 150,W,8192,4096
//! ```
//!
//! `op` is `R` or `W`; numbers are decimal or `0x` hex; spaces around fields
//! are ignored; the header line is optional. A comment `# arrival: MODE`
//! before the first record records the arrival mode ([`parse_csv_arrival`]).
//! [`format_csv_line`] writes the canonical form (decimal time and length,
//! hex address) that [`parse_csv_line`] reads back unchanged.
//!
//! # Binary
//!
//! A 32-byte header, all little-endian:
//!
//! | bytes  | field                                                        |
//! |--------|--------------------------------------------------------------|
//! | 0..8   | [`BINARY_MAGIC`] `CXLTRC02`                                  |
//! | 8..16  | `u64` record count ([`UNKNOWN_COUNT`] if the writer did not know it) |
//! | 16..20 | `u32` arrival mode: 0 none recorded, 1 trace, 2 closed, 3 fixed |
//! | 20..24 | `u32` reserved, 0                                            |
//! | 24..32 | `u64` the mode's argument in ns (think time, interval; else 0) |
//!
//! followed by 20-byte records: `u64 time_ns`, `u64 addr`, `u32 len` whose
//! top bit is the op (1 = write), so `len` < 2^31. Version 1 traces
//! (`CXLTRC01`: a 16-byte header of magic and count, no arrival mode, the
//! same records) are still read.
//!
//! ```
//! use cxlfs_device_model::trace::{decode_trace, encode_trace, Access};
//! use cxlfs_device_model::Op;
//! let trace = vec![Access { time_ns: 5, op: Op::Write, addr: 0x2000, len: 64 }];
//! let bytes = encode_trace(&trace).unwrap();
//! assert_eq!(decode_trace(&bytes).unwrap(), trace);
//! ```

use crate::arrival::{Arrival, ParseArrivalError};
use crate::device::Op;
use std::fmt;
use std::io::{self, BufRead};

mod raw_records;
pub use raw_records::{RawRecord, RawRecords, Records};

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

/// The comment that records a CSV trace's arrival mode, up to the mode.
pub const CSV_ARRIVAL_PREFIX: &str = "# arrival:";

/// The comment line (no newline) recording `arrival` in a CSV trace: `# arrival: closed`.
pub fn format_csv_arrival(arrival: Arrival) -> String {
    format!("{CSV_ARRIVAL_PREFIX} {arrival}")
}

/// Whether `line` is a `# arrival: MODE` comment, and if so the mode it records.
pub fn parse_csv_arrival(line: &str) -> Option<Result<Arrival, ParseArrivalError>> {
    let rest = line.trim().strip_prefix('#')?.trim_start();
    let mode = rest
        .get(..8)
        .filter(|word| word.eq_ignore_ascii_case("arrival:"))
        .map(|_| &rest[8..])?;
    Some(mode.parse())
}

/// Magic bytes opening a binary trace (version 2, with an arrival mode).
pub const BINARY_MAGIC: [u8; 8] = *b"CXLTRC02";
/// Magic bytes opening a version 1 binary trace (no arrival mode), still read.
pub const BINARY_MAGIC_V1: [u8; 8] = *b"CXLTRC01";
/// Bytes in the binary header.
pub const HEADER_LEN: usize = 32;
/// Bytes in a version 1 binary header (magic + record count).
pub const HEADER_LEN_V1: usize = 16;
/// Bytes in one binary record.
pub const RECORD_LEN: usize = 20;
/// The header's record count when the writer did not know it.
pub const UNKNOWN_COUNT: u64 = u64::MAX;

const WRITE_BIT: u32 = 1 << 31;

/// Why binary trace bytes could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BinaryTraceError {
    /// The first 8 bytes are not [`BINARY_MAGIC`] (or [`BINARY_MAGIC_V1`]).
    #[error(
        "not a cxlfs binary trace: magic is {found:?}, expected \"CXLTRC02\" (or \"CXLTRC01\")"
    )]
    BadMagic {
        /// The bytes found (lossily as text).
        found: String,
    },
    /// Fewer bytes than the header needs.
    #[error("truncated header: {got} of {want} bytes")]
    TruncatedHeader {
        /// Bytes present.
        got: usize,
        /// Bytes the header's version needs.
        want: usize,
    },
    /// An arrival mode code this version does not know, or reserved bytes not zero.
    #[error("bad arrival mode in the header: code {code}, reserved {reserved:#x}")]
    BadArrival {
        /// The mode code (bytes 16..20).
        code: u32,
        /// The reserved word (bytes 20..24).
        reserved: u32,
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

/// Whether `prefix` (the first bytes of a file) starts with a binary trace's
/// magic, of either version.
pub fn is_binary(prefix: &[u8]) -> bool {
    prefix.starts_with(&BINARY_MAGIC) || prefix.starts_with(&BINARY_MAGIC_V1)
}

/// What a binary trace's header says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceHeader {
    /// Records in the trace (`None`: the writer did not know).
    pub count: Option<u64>,
    /// How the accesses are meant to arrive (`None`: not recorded; replay
    /// then uses their own times).
    pub arrival: Option<Arrival>,
}

impl TraceHeader {
    /// The header's bytes ([`BINARY_MAGIC`], version 2).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let (code, arg) = match self.arrival {
            None => (0u32, 0u64),
            Some(Arrival::Trace) => (1, 0),
            Some(Arrival::Closed { think_ns }) => (2, think_ns),
            Some(Arrival::Fixed { interval_ns }) => (3, interval_ns),
        };
        let mut out = [0u8; HEADER_LEN];
        out[..8].copy_from_slice(&BINARY_MAGIC);
        out[8..16].copy_from_slice(&self.count.unwrap_or(UNKNOWN_COUNT).to_le_bytes());
        out[16..20].copy_from_slice(&code.to_le_bytes());
        out[24..32].copy_from_slice(&arg.to_le_bytes());
        out
    }

    /// Bytes in the header that `magic` (a file's first 8 bytes) opens.
    pub fn len_for(magic: &[u8]) -> Result<usize, BinaryTraceError> {
        let n = magic.len().min(8);
        if BINARY_MAGIC.starts_with(&magic[..n]) && n == 8 {
            Ok(HEADER_LEN)
        } else if BINARY_MAGIC_V1.starts_with(&magic[..n]) && n == 8 {
            Ok(HEADER_LEN_V1)
        } else if BINARY_MAGIC.starts_with(&magic[..n]) || BINARY_MAGIC_V1.starts_with(&magic[..n])
        {
            Err(BinaryTraceError::TruncatedHeader {
                got: n,
                want: HEADER_LEN,
            })
        } else {
            Err(BinaryTraceError::BadMagic {
                found: String::from_utf8_lossy(&magic[..n]).into_owned(),
            })
        }
    }

    /// Reads a header (either version) from the start of `bytes`; returns
    /// it and its length in bytes (where the records start).
    pub fn decode(bytes: &[u8]) -> Result<(TraceHeader, usize), BinaryTraceError> {
        let len = Self::len_for(&bytes[..bytes.len().min(8)])?;
        let Some(header) = bytes.get(..len) else {
            return Err(BinaryTraceError::TruncatedHeader {
                got: bytes.len(),
                want: len,
            });
        };
        let u64_at = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&header[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let u32_at = |at: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&header[at..at + 4]);
            u32::from_le_bytes(w)
        };
        let count = u64_at(8);
        let count = (count != UNKNOWN_COUNT).then_some(count);
        if len == HEADER_LEN_V1 {
            return Ok((
                TraceHeader {
                    count,
                    arrival: None,
                },
                len,
            ));
        }
        let (code, reserved, arg) = (u32_at(16), u32_at(20), u64_at(24));
        let arrival = match (code, reserved) {
            (0, 0) => None,
            (1, 0) => Some(Arrival::Trace),
            (2, 0) => Some(Arrival::Closed { think_ns: arg }),
            (3, 0) => Some(Arrival::Fixed { interval_ns: arg }),
            _ => return Err(BinaryTraceError::BadArrival { code, reserved }),
        };
        Ok((TraceHeader { count, arrival }, len))
    }
}

/// The binary header for `count` records (`None`: unknown), no arrival mode recorded.
pub fn encode_header(count: Option<u64>) -> [u8; HEADER_LEN] {
    TraceHeader {
        count,
        arrival: None,
    }
    .encode()
}

/// Reads a binary header (either version) from the start of `bytes`;
/// returns the declared record count (`None`: unknown). See
/// [`TraceHeader::decode`] for the arrival mode.
pub fn decode_header(bytes: &[u8]) -> Result<Option<u64>, BinaryTraceError> {
    TraceHeader::decode(bytes).map(|(h, _)| h.count)
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
    RawRecord::new(bytes)
        .map(|r| r.access())
        .ok_or(BinaryTraceError::ZeroLen)
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

/// Encodes a whole trace (header with the count, no arrival mode, then the records).
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
    out[8..16].copy_from_slice(&count.to_le_bytes());
    Ok(out)
}

/// Decodes a whole in-memory trace (either version), checking the header's
/// count if it has one.
pub fn decode_trace(bytes: &[u8]) -> Result<Vec<Access>, BinaryTraceError> {
    let (header, start) = TraceHeader::decode(bytes)?;
    let declared = header.count;
    let body = &bytes[start..];
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

/// Why a binary trace streamed through [`BinaryReader`] could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadBinaryError {
    /// Reading the header failed.
    #[error("binary header")]
    HeaderIo(#[source] io::Error),
    /// The header is malformed.
    #[error("binary header")]
    Header(#[source] BinaryTraceError),
    /// Reading failed at record `index`.
    #[error("record {index}")]
    Io {
        /// 0-based record index.
        index: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A malformed record (or a record count that disagrees with the header).
    #[error("record {index}")]
    Record {
        /// 0-based record index.
        index: u64,
        /// What is wrong with it.
        #[source]
        source: BinaryTraceError,
    },
}

/// Records [`BinaryReader`] decodes at a time.
const BATCH: usize = 1024;

/// Streams the accesses of a binary trace (either version) from `R` in
/// constant memory, decoding 1024 records at a time so that handing
/// out one is a copy; checks the header's count at the end.
/// `cxlfs replay --trace` and the replay benchmark read traces with it.
#[derive(Debug)]
pub struct BinaryReader<R> {
    reader: R,
    header: TraceHeader,
    /// The header's bytes: where the records start.
    header_len: usize,
    /// Index of the record after the last one to read (a part of the
    /// trace: [`BinaryReader::part`]); `None`: read to the end.
    end: Option<u64>,
    /// Index of the next record to decode (records decoded so far, handed
    /// out or in `batch`, for a reader of the whole trace).
    decoded: u64,
    /// Decoded records; `batch[pos..]` not yet handed out.
    batch: Vec<Access>,
    pos: usize,
    /// What stopped decoding, handed out after the records before it.
    error: Option<ReadBinaryError>,
    /// The input is exhausted (or failed).
    ended: bool,
    /// Bytes of the reader's buffer lent out undecoded
    /// ([`BinaryReader::next_records`]), consumed before the next read.
    lent: usize,
    /// A record that straddled the reader's buffer, lent out undecoded.
    straddle: [u8; RECORD_LEN],
}

impl<R: BufRead> BinaryReader<R> {
    /// Reads and checks the header; the records follow on iteration.
    pub fn new(mut reader: R) -> Result<Self, ReadBinaryError> {
        let mut head = [0u8; HEADER_LEN];
        let got = read_full(&mut reader, &mut head[..8]).map_err(ReadBinaryError::HeaderIo)?;
        let len = TraceHeader::len_for(&head[..got]).map_err(ReadBinaryError::Header)?;
        let rest = read_full(&mut reader, &mut head[8..len]).map_err(ReadBinaryError::HeaderIo)?;
        let (header, _) =
            TraceHeader::decode(&head[..8 + rest]).map_err(ReadBinaryError::Header)?;
        Ok(BinaryReader {
            reader,
            header,
            header_len: len,
            end: None,
            decoded: 0,
            batch: Vec::with_capacity(BATCH),
            pos: 0,
            error: None,
            ended: false,
            lent: 0,
            straddle: [0; RECORD_LEN],
        })
    }

    /// What the header says.
    pub fn header(&self) -> TraceHeader {
        self.header
    }

    /// The header's length in bytes: record `i` starts at
    /// `header_len() + i * RECORD_LEN`.
    pub fn header_len(&self) -> usize {
        self.header_len
    }

    /// A reader of part of a trace whose header was read by
    /// [`BinaryReader::new`]: `reader` is positioned at record `first`, and
    /// `records` of them are read (`None`: to the end, where the header's
    /// count is checked). Indices in errors are the whole trace's.
    pub fn part<W>(reader: R, whole: &BinaryReader<W>, first: u64, records: Option<u64>) -> Self {
        BinaryReader {
            reader,
            header: whole.header,
            header_len: whole.header_len,
            end: records.map(|n| first.saturating_add(n)),
            decoded: first,
            batch: Vec::with_capacity(BATCH),
            pos: 0,
            error: None,
            ended: false,
            lent: 0,
            straddle: [0; RECORD_LEN],
        }
    }

    /// Records returned so far.
    pub fn records_read(&self) -> u64 {
        self.decoded - (self.batch.len() - self.pos) as u64
    }

    /// Decodes the next batch; at the end, checks the count; keeps the first
    /// error for after the records before it.
    #[inline(never)]
    fn refill(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        self.pos = 0;
        self.decode_into(&mut batch, BATCH);
        self.batch = batch;
    }

    /// Decodes records onto `out` until it holds `limit` or the input ends
    /// (then checks the count) or fails (the error kept for after the
    /// records before it).
    fn decode_into(&mut self, out: &mut Vec<Access>, limit: usize) {
        self.reader.consume(std::mem::take(&mut self.lent));
        while out.len() < limit {
            let n = match self.find_whole(limit - out.len()) {
                None => break,
                Some(Whole::Straddled) => {
                    match decode_record(&self.straddle) {
                        Ok(access) => {
                            out.push(access);
                            self.decoded += 1;
                        }
                        Err(source) => self.fail(ReadBinaryError::Record {
                            index: self.decoded,
                            source,
                        }),
                    }
                    continue;
                }
                Some(Whole::Buffered(n)) => n,
            };
            let buf = match buffered(&mut self.reader, n * RECORD_LEN) {
                Ok(buf) => buf,
                Err(source) => {
                    let index = self.decoded;
                    self.fail(ReadBinaryError::Io { index, source });
                    break;
                }
            };
            let mut used = 0;
            for chunk in buf.chunks_exact(RECORD_LEN) {
                let mut record = [0u8; RECORD_LEN];
                record.copy_from_slice(chunk);
                match decode_record(&record) {
                    Ok(access) => {
                        out.push(access);
                        used += RECORD_LEN;
                    }
                    Err(source) => {
                        let index = self.decoded + (used / RECORD_LEN) as u64;
                        self.ended = true;
                        self.error = Some(ReadBinaryError::Record { index, source });
                        break;
                    }
                }
            }
            self.reader.consume(used);
            self.decoded += (used / RECORD_LEN) as u64;
        }
    }

    /// Appends the next records to `out` until it holds `limit` (those
    /// already decoded first): one batch of the caller's size, decoded
    /// straight into the caller's buffer. `Some(Ok(()))` when it appended
    /// any; the error that stopped decoding after the records before it;
    /// `None` at the end. Mixes with [`BinaryReader::next_batch`].
    pub fn next_batch_into(
        &mut self,
        out: &mut Vec<Access>,
        limit: usize,
    ) -> Option<Result<(), ReadBinaryError>> {
        let before = out.len();
        let kept = (self.batch.len() - self.pos).min(limit.saturating_sub(before));
        out.extend_from_slice(&self.batch[self.pos..self.pos + kept]);
        self.pos += kept;
        if self.pos >= self.batch.len() {
            self.decode_into(out, limit);
        }
        if out.len() > before {
            return Some(Ok(()));
        }
        self.error.take().map(Err)
    }

    /// The next decoded records (up to 1024), handed out together; the
    /// error that stopped decoding after the records before it; `None` at
    /// the end. Mixes with [`Iterator::next`].
    #[inline]
    pub fn next_batch(&mut self) -> Option<Result<&[Access], ReadBinaryError>> {
        if self.pos >= self.batch.len() && !self.ended {
            self.refill();
        }
        if self.pos >= self.batch.len() {
            return self.error.take().map(Err);
        }
        let start = self.pos;
        self.pos = self.batch.len();
        Some(Ok(&self.batch[start..]))
    }

    /// The next records: those a batch already decoded, or else whole
    /// records straight from the reader's buffer, undecoded and each known
    /// to decode (no copy, no decode: for a pass that decodes only what it
    /// keeps); the error that stopped reading after the records before it;
    /// `None` at the end. Mixes with the other ways of reading.
    pub fn next_records(&mut self) -> Option<Result<Records<'_>, ReadBinaryError>> {
        self.lend(true)
    }

    /// As [`BinaryReader::next_records`], but the undecoded records' lengths
    /// are not checked, which saves a pass over them: a record of length 0
    /// may be among them, and the reader does not stop at it. For a
    /// consumer that tests every record's extent anyway and refuses a
    /// length of 0 with its index, as `CurvePass::feed_records` does.
    pub fn next_records_unchecked(&mut self) -> Option<Result<Records<'_>, ReadBinaryError>> {
        self.lend(false)
    }

    /// [`BinaryReader::next_records`], undecoded records checked or not.
    fn lend(&mut self, check: bool) -> Option<Result<Records<'_>, ReadBinaryError>> {
        self.reader.consume(std::mem::take(&mut self.lent));
        if self.pos < self.batch.len() {
            let start = self.pos;
            self.pos = self.batch.len();
            return Some(Ok(Records::Decoded(&self.batch[start..])));
        }
        let index = self.decoded;
        let n = match self.find_whole(usize::MAX) {
            None => return self.error.take().map(Err),
            Some(Whole::Straddled) => {
                if check && RawRecord::new(&self.straddle).is_none() {
                    let source = BinaryTraceError::ZeroLen;
                    self.ended = true;
                    return Some(Err(ReadBinaryError::Record { index, source }));
                }
                self.decoded += 1;
                return Some(Ok(Records::Raw(RawRecords::whole(&self.straddle))));
            }
            Some(Whole::Buffered(n)) => n,
        };
        let buf = match buffered(&mut self.reader, n * RECORD_LEN) {
            Ok(buf) => buf,
            Err(source) => {
                self.ended = true;
                return Some(Err(ReadBinaryError::Io { index, source }));
            }
        };
        let good = if check {
            let (good, bad) = RawRecords::leading(buf);
            if let Some(bad) = bad {
                // After the records before it.
                self.ended = true;
                self.error = Some(ReadBinaryError::Record {
                    index: index + bad as u64,
                    source: BinaryTraceError::ZeroLen,
                });
            }
            good
        } else {
            RawRecords::whole(buf)
        };
        if good.is_empty() {
            return self.error.take().map(Err);
        }
        self.decoded += good.len() as u64;
        self.lent = good.len() * RECORD_LEN;
        Some(Ok(Records::Raw(good)))
    }

    /// Finds the next whole records, at most `max`: `n` at the start of the
    /// reader's buffer, or one that straddled it, copied to `straddle`.
    /// `None` at the end (the header's count checked) or on an error (kept
    /// in `error`).
    fn find_whole(&mut self, max: usize) -> Option<Whole> {
        while !self.ended {
            let index = self.decoded;
            let left_in_part = match self.end {
                Some(end) if index >= end => {
                    self.ended = true;
                    break;
                }
                Some(end) => usize::try_from(end - index).unwrap_or(usize::MAX),
                None => usize::MAX,
            };
            let buf = match self.reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    self.fail(ReadBinaryError::Io { index, source });
                    break;
                }
            };
            if buf.is_empty() {
                self.end_of_input(index);
                break;
            }
            let whole = (buf.len() / RECORD_LEN).min(left_in_part).min(max);
            if whole > 0 {
                return Some(Whole::Buffered(whole));
            }
            // A record straddling the buffer's end.
            match read_full(&mut self.reader, &mut self.straddle) {
                Ok(RECORD_LEN) => return Some(Whole::Straddled),
                Ok(got) => self.fail(ReadBinaryError::Record {
                    index,
                    source: BinaryTraceError::TruncatedRecord { got },
                }),
                Err(source) => self.fail(ReadBinaryError::Io { index, source }),
            }
        }
        None
    }

    /// The input ended after `index` records: checks the header's count.
    fn end_of_input(&mut self, index: u64) {
        self.ended = true;
        if let Some(declared) = self.header.count.filter(|&d| d != index) {
            self.error = Some(ReadBinaryError::Record {
                index,
                source: BinaryTraceError::CountMismatch {
                    declared,
                    found: index,
                },
            });
        }
    }

    fn fail(&mut self, error: ReadBinaryError) {
        self.ended = true;
        self.error = Some(error);
    }
}

/// The first `bytes` of `reader`'s buffer, which [`BinaryReader::find_whole`]
/// has just seen hold them: an error if the reader broke its contract (its
/// buffer, not empty, shrank between two `fill_buf` calls with no
/// `consume` between them).
fn buffered<R: BufRead>(reader: &mut R, bytes: usize) -> io::Result<&[u8]> {
    match reader.fill_buf()? {
        buf if buf.len() >= bytes => Ok(&buf[..bytes]),
        _ => Err(io::Error::other(
            "the reader's buffer shrank between two reads",
        )),
    }
}

/// Where [`BinaryReader::find_whole`] found records.
enum Whole {
    /// This many at the start of the reader's buffer.
    Buffered(usize),
    /// One in `straddle`.
    Straddled,
}

impl<R: BufRead> Iterator for BinaryReader<R> {
    type Item = Result<Access, ReadBinaryError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(&access) = self.batch.get(self.pos) {
            self.pos += 1;
            return Some(Ok(access));
        }
        if !self.ended {
            self.refill();
            if let Some(&access) = self.batch.get(self.pos) {
                self.pos += 1;
                return Some(Ok(access));
            }
        }
        self.error.take().map(Err)
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
pub fn read_full(reader: &mut impl io::Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
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
        for arrival in [
            None,
            Some(Arrival::Trace),
            Some(Arrival::Closed { think_ns: 7 }),
            Some(Arrival::Fixed { interval_ns: 9 }),
        ] {
            let h = TraceHeader {
                count: Some(1),
                arrival,
            };
            assert_eq!(TraceHeader::decode(&h.encode()).unwrap(), (h, HEADER_LEN));
        }
    }
}
