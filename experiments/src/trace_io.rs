//! Streaming trace files: CSV or binary in (detected by the magic bytes),
//! CSV or binary out. Records are read and written one at a time through
//! large buffers, so traces of any size take constant memory. A trace may
//! record its arrival mode (`# arrival: MODE` in CSV, the binary header);
//! [`TraceReader::arrival`] says what it records.

use crate::trace_map::{MappedPart, MappedTrace};
use cxlfs_device_model::replay::{
    Arrival, ParseArrivalError, ReplayObserver, Replayer, RunError, LOOKAHEAD,
};
use cxlfs_device_model::trace::{
    encode_record, format_csv_arrival, is_binary, parse_csv_arrival, parse_csv_line, Access,
    BinaryReader, BinaryTraceError, CsvLine, ReadBinaryError, Records, TraceHeader, TraceLineError,
    BINARY_MAGIC, BINARY_MAGIC_V1, CSV_HEADER, RECORD_LEN,
};
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

/// Bytes read or written per system call.
pub const BUFFER_BYTES: usize = 1 << 20;

/// Bytes read per system call by a part of a split trace
/// ([`TraceReader::split`]): a buffer that stays in the CPU's own cache
/// between the kernel's copy and the pass (`cxlfs mrc`'s sampled pass took
/// 5 % less CPU than with [`BUFFER_BYTES`]).
const PART_BUFFER_BYTES: usize = 1 << 18;

/// CSV: the line numbers of this many of the last records are kept, so that
/// an access the replay's look-ahead read past can still be named by line.
const LINES_KEPT: usize = 4 * LOOKAHEAD;

/// The two trace encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// `time_ns,op,addr,len` text.
    Csv,
    /// The compact binary format (`CXLTRC01`).
    Bin,
}

impl TraceFormat {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Csv => "csv",
            TraceFormat::Bin => "bin",
        }
    }

    /// The format a file name suggests: `.csv` / `.txt` are CSV, anything else binary.
    pub fn from_extension(path: &Path) -> TraceFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("csv") || ext.eq_ignore_ascii_case("txt") => {
                TraceFormat::Csv
            }
            _ => TraceFormat::Bin,
        }
    }
}

/// Why a trace file could not be read. The messages start with the file
/// name and, for CSV, the line number (`trace.csv:17`); the cause follows
/// as the error's source.
#[derive(Debug, thiserror::Error)]
pub enum ReadTraceError {
    /// The file could not be opened.
    #[error("cannot open trace {path}")]
    Open {
        /// File name as given.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Reading failed (or the CSV text is not UTF-8).
    #[error("{path}:{line}")]
    Io {
        /// File name as given.
        path: String,
        /// 1-based line number (CSV) or record index (binary).
        line: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A malformed CSV line.
    #[error("{path}:{line}")]
    Line {
        /// File name as given.
        path: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong with the line.
        #[source]
        source: TraceLineError,
    },
    /// A malformed `# arrival:` comment.
    #[error("{path}:{line}")]
    Arrival {
        /// File name as given.
        path: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong with it.
        #[source]
        source: ParseArrivalError,
    },
    /// A malformed binary header.
    #[error("{path}: binary header")]
    Header {
        /// File name as given.
        path: String,
        /// What is wrong with it.
        #[source]
        source: BinaryTraceError,
    },
    /// A malformed binary record (or a record count that disagrees with the header).
    #[error("{path}: record {index}")]
    Record {
        /// File name as given.
        path: String,
        /// 0-based record index.
        index: u64,
        /// What is wrong with it.
        #[source]
        source: BinaryTraceError,
    },
}

enum Source {
    Csv {
        reader: BufReader<File>,
        buf: String,
        /// `buf` holds the first record's line, read at open, not yet parsed.
        buffered: bool,
        /// Line numbers of the last [`LINES_KEPT`] records, by record index.
        lines: Box<[u64; LINES_KEPT]>,
    },
    Bin(BinaryReader<BinInput>),
}

/// Where a binary trace's bytes come from: a buffer `read(2)` fills, or
/// (a part of a split trace) the file's mapping, read in place
/// ([`crate::trace_map`]).
enum BinInput {
    Buffered(BufReader<File>),
    Mapped(MappedPart),
}

impl io::Read for BinInput {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            BinInput::Buffered(r) => r.read(buf),
            BinInput::Mapped(r) => r.read(buf),
        }
    }
}

impl BufRead for BinInput {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        match self {
            BinInput::Buffered(r) => r.fill_buf(),
            BinInput::Mapped(r) => r.fill_buf(),
        }
    }

    fn consume(&mut self, amt: usize) {
        match self {
            BinInput::Buffered(r) => r.consume(amt),
            BinInput::Mapped(r) => r.consume(amt),
        }
    }
}

/// A trace file opened for streaming; iterates over its accesses.
pub struct TraceReader {
    path: String,
    src: Source,
    arrival: Option<Arrival>,
    /// Records returned so far.
    records: u64,
    /// CSV: 1-based line number of the last line read.
    line: u64,
    done: bool,
    /// CSV: the access [`TraceReader::next_batch`] hands out.
    single: Access,
    /// CSV: the error [`TraceReader::next_batch_into`] met after the
    /// accesses it appended, handed out on its next call.
    pending: Option<ReadTraceError>,
}

impl TraceReader {
    /// Opens `path`, telling CSV from binary by the magic bytes; reads the
    /// binary header, or the CSV lines up to the first record (for an
    /// `# arrival:` comment).
    pub fn open(path: &Path) -> Result<TraceReader, ReadTraceError> {
        let shown = path.display().to_string();
        let file = File::open(path).map_err(|source| ReadTraceError::Open {
            path: shown.clone(),
            source,
        })?;
        let mut reader = BufReader::with_capacity(BUFFER_BYTES, file);
        let head = reader.fill_buf().map_err(|source| ReadTraceError::Io {
            path: shown.clone(),
            line: 1,
            source,
        })?;
        // A file shorter than the magic that starts like it is a truncated binary trace.
        let binary = is_binary(head)
            || (!head.is_empty()
                && head.len() < BINARY_MAGIC.len()
                && (BINARY_MAGIC.starts_with(head) || BINARY_MAGIC_V1.starts_with(head)));
        let mut trace = if binary {
            let bin =
                BinaryReader::new(BinInput::Buffered(reader)).map_err(|e| bin_error(&shown, e))?;
            TraceReader {
                path: shown,
                arrival: bin.header().arrival,
                src: Source::Bin(bin),
                records: 0,
                line: 0,
                done: false,
                single: Access::default(),
                pending: None,
            }
        } else {
            TraceReader {
                path: shown,
                src: Source::Csv {
                    reader,
                    buf: String::with_capacity(128),
                    buffered: false,
                    lines: Box::new([0; LINES_KEPT]),
                },
                arrival: None,
                records: 0,
                line: 0,
                done: false,
                single: Access::default(),
                pending: None,
            }
        };
        trace.read_csv_preamble()?;
        Ok(trace)
    }

    /// CSV: reads the lines before the first record, taking the arrival
    /// mode from a `# arrival:` comment, and leaves the first record's line
    /// buffered.
    fn read_csv_preamble(&mut self) -> Result<(), ReadTraceError> {
        let Source::Csv {
            reader,
            buf,
            buffered,
            ..
        } = &mut self.src
        else {
            return Ok(());
        };
        loop {
            buf.clear();
            self.line += 1;
            let read = reader.read_line(buf).map_err(|source| ReadTraceError::Io {
                path: self.path.clone(),
                line: self.line,
                source,
            })?;
            if read == 0 {
                // No records; `next` finds the end again.
                self.line -= 1;
                return Ok(());
            }
            if let Some(arrival) = parse_csv_arrival(buf) {
                self.arrival = Some(arrival.map_err(|source| ReadTraceError::Arrival {
                    path: self.path.clone(),
                    line: self.line,
                    source,
                })?);
                continue;
            }
            match parse_csv_line(buf) {
                Ok(None) => continue,
                // A record, or a bad line that `next` reports.
                Ok(Some(_)) | Err(_) => {
                    self.line -= 1;
                    *buffered = true;
                    return Ok(());
                }
            }
        }
    }

    /// CSV or binary.
    pub fn format(&self) -> TraceFormat {
        match self.src {
            Source::Csv { .. } => TraceFormat::Csv,
            Source::Bin { .. } => TraceFormat::Bin,
        }
    }

    /// The arrival mode the trace records (`None`: it records none).
    pub fn arrival(&self) -> Option<Arrival> {
        self.arrival
    }

    /// The record count a binary header declares.
    pub fn declared_records(&self) -> Option<u64> {
        match &self.src {
            Source::Bin(bin) => bin.header().count,
            Source::Csv { .. } => None,
        }
    }

    /// The next accesses: many at a time from a binary trace, one at a
    /// time from CSV; `None` at the end (or after an error).
    pub fn next_batch(&mut self) -> Option<Result<&[Access], ReadTraceError>> {
        if self.done {
            return None;
        }
        if !matches!(self.src, Source::Bin(_)) {
            return match self.next()? {
                Ok(access) => {
                    self.single = access;
                    Some(Ok(std::slice::from_ref(&self.single)))
                }
                Err(e) => Some(Err(e)),
            };
        }
        let Source::Bin(bin) = &mut self.src else {
            return None;
        };
        let got = bin.next_batch();
        counted(
            got,
            |b| b.len(),
            &self.path,
            &mut self.records,
            &mut self.done,
        )
    }

    /// The next accesses: a binary trace's many at a time, undecoded where
    /// its reader has not decoded them yet, and then not checked to decode
    /// ([`BinaryReader::next_records_unchecked`]: the consumer refuses a
    /// length of 0, as `CurvePass::feed_records` does), CSV's one at a
    /// time; `None` at the end (or after an error).
    pub fn next_records(&mut self) -> Option<Result<Records<'_>, ReadTraceError>> {
        if self.done {
            return None;
        }
        if !matches!(self.src, Source::Bin(_)) {
            return self.next_batch().map(|batch| batch.map(Records::Decoded));
        }
        let Source::Bin(bin) = &mut self.src else {
            return None;
        };
        let got = bin.next_records_unchecked();
        counted(
            got,
            |r| r.len(),
            &self.path,
            &mut self.records,
            &mut self.done,
        )
    }

    /// Appends the next accesses to `out` until it holds `limit`: a binary
    /// trace's decoded straight into it, a CSV trace's line by line.
    /// `Some(Ok(()))` when it appended any; the error that stopped reading
    /// after the accesses before it; `None` at the end.
    pub fn next_batch_into(
        &mut self,
        out: &mut Vec<Access>,
        limit: usize,
    ) -> Option<Result<(), ReadTraceError>> {
        if let Some(e) = self.pending.take() {
            return Some(Err(e));
        }
        if self.done {
            return None;
        }
        let before = out.len();
        let Source::Bin(bin) = &mut self.src else {
            while out.len() < limit {
                match self.next() {
                    Some(Ok(access)) => out.push(access),
                    Some(Err(e)) if out.len() == before => return Some(Err(e)),
                    // Kept for the next call, after these accesses.
                    Some(Err(e)) => {
                        self.pending = Some(e);
                        break;
                    }
                    None => break,
                }
            }
            return (out.len() > before).then_some(Ok(()));
        };
        let got = bin.next_batch_into(out, limit);
        let appended = out.len() - before;
        counted(
            got,
            |()| appended,
            &self.path,
            &mut self.records,
            &mut self.done,
        )
    }

    /// An unread binary trace cut into `parts` readers of consecutive
    /// record ranges (each with its own file handle, for a thread each),
    /// the last reading to the end and checking the header's count; `None`
    /// for CSV, a trace already read from, or fewer than `min_records`
    /// records per part. One part only where the file can be mapped: it
    /// then reads its records in place, where this reader copies them.
    /// Their errors and locations use the whole trace's record indices.
    pub fn split(
        &self,
        parts: usize,
        min_records: u64,
    ) -> Result<Option<Vec<TraceReader>>, ReadTraceError> {
        let Source::Bin(bin) = &self.src else {
            return Ok(None);
        };
        if self.records != 0 || bin.records_read() != 0 || parts == 0 {
            return Ok(None);
        }
        let open = || {
            File::open(&self.path).map_err(|source| ReadTraceError::Open {
                path: self.path.clone(),
                source,
            })
        };
        let io = |source| ReadTraceError::Io {
            path: self.path.clone(),
            line: 0,
            source,
        };
        let file = open()?;
        let len = file.metadata().map_err(io)?.len();
        let start = bin.header_len() as u64;
        let records = len.saturating_sub(start) / RECORD_LEN as u64;
        let n = parts as u64;
        if records / n < min_records.max(1) {
            return Ok(None);
        }
        let mapped = MappedTrace::map(&file);
        if parts == 1 && mapped.is_none() {
            return Ok(None);
        }
        (0..n)
            .map(|k| {
                let first = records * k / n;
                let count = (k + 1 < n).then(|| records * (k + 1) / n - first);
                let at = start + first * RECORD_LEN as u64;
                let reader = match &mapped {
                    Some(m) => {
                        let stop = count.map_or(len, |c| at + c * RECORD_LEN as u64);
                        let byte = |b: u64| usize::try_from(b).unwrap_or(usize::MAX);
                        BinInput::Mapped(m.part(byte(at), byte(stop)))
                    }
                    None => {
                        let mut file = open()?;
                        file.seek(SeekFrom::Start(at)).map_err(io)?;
                        BinInput::Buffered(BufReader::with_capacity(PART_BUFFER_BYTES, file))
                    }
                };
                Ok(TraceReader {
                    path: self.path.clone(),
                    arrival: self.arrival,
                    src: Source::Bin(BinaryReader::part(reader, bin, first, count)),
                    records: first,
                    line: 0,
                    done: false,
                    single: Access::default(),
                    pending: None,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Records before the next one this reader returns: its first record's
    /// index, for a part of a trace ([`TraceReader::split`]).
    pub fn records_before(&self) -> u64 {
        self.records
    }

    /// Where access `index` (0-based, counted from the first record) came
    /// from: `trace.csv:17` or `trace.bin: record 16`. For CSV, the line is
    /// known for the last few records read (more than the replay's look-ahead).
    pub fn location_of(&self, index: u64) -> String {
        match &self.src {
            Source::Csv { lines, .. } => {
                let known = index < self.records && self.records - index <= LINES_KEPT as u64;
                if known {
                    format!("{}:{}", self.path, lines[index as usize % LINES_KEPT])
                } else {
                    format!("{}: record {index}", self.path)
                }
            }
            Source::Bin { .. } => format!("{}: record {index}", self.path),
        }
    }

    /// Replays the rest of the trace through [`Replayer::drive`]. A binary
    /// trace goes straight from its [`BinaryReader`] into the loop, as in
    /// the replay benchmark; a CSV one through this reader.
    pub fn drive(
        &mut self,
        replayer: &mut Replayer<'_>,
        warmup: u64,
        observer: &mut impl ReplayObserver,
    ) -> Result<u64, RunError<ReadTraceError>> {
        if self.done {
            return Ok(0);
        }
        let result = match &mut self.src {
            Source::Bin(bin) => {
                let path = &self.path;
                let accesses = bin.by_ref().map(|r| r.map_err(|e| bin_error(path, e)));
                let result = replayer.drive(accesses, warmup, observer);
                self.records = bin.records_read();
                result
            }
            Source::Csv { .. } => replayer.drive(self.by_ref(), warmup, observer),
        };
        self.done = true;
        result
    }

    fn next_csv(&mut self) -> Option<Result<Access, ReadTraceError>> {
        let Source::Csv {
            reader,
            buf,
            buffered,
            lines,
        } = &mut self.src
        else {
            return None;
        };
        loop {
            self.line += 1;
            if !std::mem::take(buffered) {
                buf.clear();
                match reader.read_line(buf) {
                    Ok(0) => return None,
                    Ok(_) => {}
                    Err(source) => {
                        return Some(Err(ReadTraceError::Io {
                            path: self.path.clone(),
                            line: self.line,
                            source,
                        }))
                    }
                }
            }
            match parse_csv_line(buf) {
                Ok(None) => continue,
                Ok(Some(access)) => {
                    lines[self.records as usize % LINES_KEPT] = self.line;
                    return Some(Ok(access));
                }
                Err(source) => {
                    return Some(Err(ReadTraceError::Line {
                        path: self.path.clone(),
                        line: self.line,
                        source,
                    }))
                }
            }
        }
    }
}

/// A binary reader's outcome for a [`TraceReader`]: what it handed out
/// (`len` accesses) counted into `records`, `done` set at the end or on an
/// error, which then names `path`.
fn counted<T>(
    got: Option<Result<T, ReadBinaryError>>,
    len: impl Fn(&T) -> usize,
    path: &str,
    records: &mut u64,
    done: &mut bool,
) -> Option<Result<T, ReadTraceError>> {
    match got {
        Some(Ok(t)) => {
            *records += len(&t) as u64;
            Some(Ok(t))
        }
        Some(Err(e)) => {
            *done = true;
            Some(Err(bin_error(path, e)))
        }
        None => {
            *done = true;
            None
        }
    }
}

/// A [`ReadBinaryError`] as a [`ReadTraceError`] naming the file.
fn bin_error(path: &str, e: ReadBinaryError) -> ReadTraceError {
    let path = path.to_string();
    match e {
        ReadBinaryError::HeaderIo(source) => ReadTraceError::Io {
            path,
            line: 0,
            source,
        },
        ReadBinaryError::Header(source) => ReadTraceError::Header { path, source },
        ReadBinaryError::Io { index, source } => ReadTraceError::Io {
            path,
            line: index,
            source,
        },
        ReadBinaryError::Record { index, source } => ReadTraceError::Record {
            path,
            index,
            source,
        },
    }
}

impl Iterator for TraceReader {
    type Item = Result<Access, ReadTraceError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = match &mut self.src {
            Source::Bin(bin) => match bin.next() {
                Some(Ok(access)) => Some(Ok(access)),
                Some(Err(e)) => Some(Err(bin_error(&self.path, e))),
                None => None,
            },
            Source::Csv { .. } => self.next_csv(),
        };
        match &item {
            Some(Ok(_)) => self.records += 1,
            Some(Err(_)) | None => self.done = true,
        }
        item
    }
}

/// Why a trace file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteTraceError {
    /// The file could not be created.
    #[error("cannot create {path}")]
    Create {
        /// File name as given.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Writing failed.
    #[error("writing {path}")]
    Io {
        /// File name as given.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An access the binary format cannot hold.
    #[error("{path}: record {index}")]
    Encode {
        /// File name as given.
        path: String,
        /// 0-based record index.
        index: u64,
        /// Why.
        #[source]
        source: BinaryTraceError,
    },
}

/// A trace file being written; call [`TraceWriter::finish`] at the end.
pub struct TraceWriter {
    path: String,
    format: TraceFormat,
    out: BufWriter<File>,
    arrival: Option<Arrival>,
    records: u64,
}

impl TraceWriter {
    /// Creates (truncates) `path` and writes the header, recording the
    /// arrival mode `arrival` (`None`: none; replay then uses the times).
    pub fn create(
        path: &Path,
        format: TraceFormat,
        arrival: Option<Arrival>,
    ) -> Result<TraceWriter, WriteTraceError> {
        let shown = path.display().to_string();
        let file = File::create(path).map_err(|source| WriteTraceError::Create {
            path: shown.clone(),
            source,
        })?;
        let mut out = BufWriter::with_capacity(BUFFER_BYTES, file);
        let header = match format {
            TraceFormat::Csv => match arrival {
                Some(arrival) => writeln!(out, "{}", format_csv_arrival(arrival)),
                None => Ok(()),
            }
            .and_then(|()| writeln!(out, "{CSV_HEADER}")),
            TraceFormat::Bin => out.write_all(
                &TraceHeader {
                    count: None,
                    arrival,
                }
                .encode(),
            ),
        };
        header.map_err(|source| WriteTraceError::Io {
            path: shown.clone(),
            source,
        })?;
        Ok(TraceWriter {
            path: shown,
            format,
            out,
            arrival,
            records: 0,
        })
    }

    /// Appends one access.
    #[inline]
    pub fn write(&mut self, access: &Access) -> Result<(), WriteTraceError> {
        let result = match self.format {
            TraceFormat::Csv => writeln!(self.out, "{}", CsvLine(access)),
            TraceFormat::Bin => {
                let record = encode_record(access).map_err(|source| WriteTraceError::Encode {
                    path: self.path.clone(),
                    index: self.records,
                    source,
                })?;
                self.out.write_all(&record)
            }
        };
        result.map_err(|source| WriteTraceError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.records += 1;
        Ok(())
    }

    /// Flushes, fills in the binary header's record count, and returns the
    /// number of records written.
    pub fn finish(self) -> Result<u64, WriteTraceError> {
        let path = self.path;
        let io_err = |source| WriteTraceError::Io {
            path: path.clone(),
            source,
        };
        let mut file = self.out.into_inner().map_err(|e| io_err(e.into_error()))?;
        if self.format == TraceFormat::Bin {
            file.seek(SeekFrom::Start(0)).map_err(io_err)?;
            let header = TraceHeader {
                count: Some(self.records),
                arrival: self.arrival,
            };
            file.write_all(&header.encode()).map_err(io_err)?;
        }
        Ok(self.records)
    }
}
