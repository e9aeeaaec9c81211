//! Streaming trace files: CSV or binary in (detected by the magic bytes),
//! CSV or binary out. Records are read and written one at a time through
//! large buffers, so traces of any size take constant memory.

use cxlfs_device_model::trace::{
    decode_header, decode_record, encode_header, encode_record, is_binary, parse_csv_line, Access,
    BinaryTraceError, CsvLine, TraceLineError, BINARY_MAGIC, CSV_HEADER, HEADER_LEN, RECORD_LEN,
};
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

const BUFFER_BYTES: usize = 1 << 20;

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
    },
    Bin {
        reader: BufReader<File>,
        declared: Option<u64>,
    },
}

/// A trace file opened for streaming; iterates over its accesses.
pub struct TraceReader {
    path: String,
    src: Source,
    /// Records returned so far.
    records: u64,
    /// CSV: 1-based line number of the last line read.
    line: u64,
    done: bool,
}

impl TraceReader {
    /// Opens `path`, telling CSV from binary by the magic bytes.
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
                && BINARY_MAGIC.starts_with(head));
        let src = if binary {
            let mut header = [0u8; HEADER_LEN];
            let got = read_full(&mut reader, &mut header).map_err(|source| ReadTraceError::Io {
                path: shown.clone(),
                line: 0,
                source,
            })?;
            let declared =
                decode_header(&header[..got]).map_err(|source| ReadTraceError::Header {
                    path: shown.clone(),
                    source,
                })?;
            Source::Bin { reader, declared }
        } else {
            Source::Csv {
                reader,
                buf: String::with_capacity(128),
            }
        };
        Ok(TraceReader {
            path: shown,
            src,
            records: 0,
            line: 0,
            done: false,
        })
    }

    /// CSV or binary.
    pub fn format(&self) -> TraceFormat {
        match self.src {
            Source::Csv { .. } => TraceFormat::Csv,
            Source::Bin { .. } => TraceFormat::Bin,
        }
    }

    /// The record count a binary header declares.
    pub fn declared_records(&self) -> Option<u64> {
        match self.src {
            Source::Bin { declared, .. } => declared,
            Source::Csv { .. } => None,
        }
    }

    /// Where the last access returned came from: `trace.csv:17` or
    /// `trace.bin: record 16`.
    pub fn location(&self) -> String {
        match self.src {
            Source::Csv { .. } => format!("{}:{}", self.path, self.line),
            Source::Bin { .. } => {
                format!("{}: record {}", self.path, self.records.saturating_sub(1))
            }
        }
    }

    fn next_csv(&mut self) -> Option<Result<Access, ReadTraceError>> {
        let Source::Csv { reader, buf } = &mut self.src else {
            return None;
        };
        loop {
            buf.clear();
            self.line += 1;
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
            match parse_csv_line(buf) {
                Ok(None) => continue,
                Ok(Some(access)) => return Some(Ok(access)),
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

    #[inline]
    fn next_bin(&mut self) -> Option<Result<Access, ReadTraceError>> {
        let Source::Bin { reader, declared } = &mut self.src else {
            return None;
        };
        let index = self.records;
        let record_err = |source| ReadTraceError::Record {
            path: self.path.clone(),
            index,
            source,
        };
        let io_err = |source| ReadTraceError::Io {
            path: self.path.clone(),
            line: index,
            source,
        };
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) => return Some(Err(io_err(e))),
        };
        let mut record = [0u8; RECORD_LEN];
        if let Some(bytes) = buf.get(..RECORD_LEN) {
            record.copy_from_slice(bytes);
            reader.consume(RECORD_LEN);
        } else if buf.is_empty() {
            return match *declared {
                Some(declared) if declared != index => {
                    Some(Err(record_err(BinaryTraceError::CountMismatch {
                        declared,
                        found: index,
                    })))
                }
                _ => None,
            };
        } else {
            // A record straddling the buffer's end.
            let got = match read_full(reader, &mut record) {
                Ok(got) => got,
                Err(e) => return Some(Err(io_err(e))),
            };
            if got < RECORD_LEN {
                return Some(Err(record_err(BinaryTraceError::TruncatedRecord { got })));
            }
        }
        Some(decode_record(&record).map_err(record_err))
    }
}

impl Iterator for TraceReader {
    type Item = Result<Access, ReadTraceError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = match self.src {
            Source::Csv { .. } => self.next_csv(),
            Source::Bin { .. } => self.next_bin(),
        };
        match &item {
            Some(Ok(_)) => self.records += 1,
            Some(Err(_)) | None => self.done = true,
        }
        item
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(reader: &mut impl io::Read, buf: &mut [u8]) -> io::Result<usize> {
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
    records: u64,
}

impl TraceWriter {
    /// Creates (truncates) `path` and writes the header.
    pub fn create(path: &Path, format: TraceFormat) -> Result<TraceWriter, WriteTraceError> {
        let shown = path.display().to_string();
        let file = File::create(path).map_err(|source| WriteTraceError::Create {
            path: shown.clone(),
            source,
        })?;
        let mut out = BufWriter::with_capacity(BUFFER_BYTES, file);
        let header = match format {
            TraceFormat::Csv => out
                .write_all(CSV_HEADER.as_bytes())
                .and_then(|()| out.write_all(b"\n")),
            TraceFormat::Bin => out.write_all(&encode_header(None)),
        };
        header.map_err(|source| WriteTraceError::Io {
            path: shown.clone(),
            source,
        })?;
        Ok(TraceWriter {
            path: shown,
            format,
            out,
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
            file.write_all(&encode_header(Some(self.records)))
                .map_err(io_err)?;
        }
        Ok(self.records)
    }
}
