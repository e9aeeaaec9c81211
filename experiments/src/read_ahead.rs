//! A trace read on its own thread, a few batches ahead of the pass that
//! consumes it: the kernel's copy of the file and the decode of its records
//! overlap the consumer's own work instead of adding to it.
//!
//! Batches travel as owned buffers over a bounded channel and come back
//! empty over a second one, so the reader decodes into warm memory and at
//! most [`AHEAD`] + 2 batches exist at once (memory bounded whatever the
//! trace's length).

use crate::trace_io::{ReadTraceError, TraceReader};
use cxlfs_device_model::trace::Access;
use std::sync::mpsc;
use std::thread;

/// Accesses per batch handed over: large enough that a hand-over (a few
/// hundred ns, a wake-up when a side waits) is rare against the work on the
/// batch, small enough to stay in the second-level cache.
pub const BATCH_ACCESSES: usize = 8 * 1024;

/// Batches the reader may have decoded and not yet handed over.
pub const AHEAD: usize = 4;

/// Why [`drive`] stopped before the trace's end.
#[derive(Debug, thiserror::Error)]
pub enum DriveError<E> {
    /// Reading or decoding the trace failed.
    #[error(transparent)]
    Read(ReadTraceError),
    /// The consumer refused a batch.
    #[error(transparent)]
    Consume(E),
    /// The reader thread panicked.
    #[error("the trace reader thread panicked")]
    ReaderPanicked,
}

/// Feeds every access of `reader`, batch by batch in order, to `consume`,
/// reading on a second thread. Returns the reader (for
/// [`TraceReader::location_of`] after an error) with the outcome; the reader
/// is `None` only when its thread panicked.
pub fn drive<E: Send>(
    reader: TraceReader,
    mut consume: impl FnMut(&[Access]) -> Result<(), E>,
) -> (Option<TraceReader>, Result<(), DriveError<E>>) {
    let (full_tx, full_rx) = mpsc::sync_channel::<Result<Vec<Access>, ReadTraceError>>(AHEAD);
    let (empty_tx, empty_rx) = mpsc::channel::<Vec<Access>>();
    thread::scope(|s| {
        let producer = s.spawn(move || produce(reader, &full_tx, &empty_rx));
        let mut outcome = Ok(());
        for batch in full_rx.iter() {
            match batch {
                Ok(batch) => {
                    if let Err(e) = consume(&batch) {
                        outcome = Err(DriveError::Consume(e));
                        break;
                    }
                    // The reader gone (at its end) is fine: nothing to refill.
                    let _ = empty_tx.send(batch);
                }
                Err(e) => {
                    outcome = Err(DriveError::Read(e));
                    break;
                }
            }
        }
        // Unblocks a reader waiting to hand over more.
        drop(full_rx);
        match producer.join() {
            Ok(reader) => (Some(reader), outcome),
            Err(_) => (None, outcome.and(Err(DriveError::ReaderPanicked))),
        }
    })
}

/// The reader thread: fills recycled buffers until the end, an error, or
/// the consumer's leaving; hands back the reader.
fn produce(
    mut reader: TraceReader,
    full: &mpsc::SyncSender<Result<Vec<Access>, ReadTraceError>>,
    empty: &mpsc::Receiver<Vec<Access>>,
) -> TraceReader {
    loop {
        let mut batch = empty
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(BATCH_ACCESSES));
        batch.clear();
        let item = match reader.next_batch_into(&mut batch, BATCH_ACCESSES) {
            Some(Ok(())) => Ok(batch),
            Some(Err(e)) => Err(e),
            None => return reader,
        };
        let failed = item.is_err();
        if full.send(item).is_err() || failed {
            return reader;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cxlfs_device_model::trace::{encode_trace, Access};
    use cxlfs_device_model::Op;
    use std::io::Write;

    fn accesses(n: u64) -> Vec<Access> {
        (0..n)
            .map(|i| Access {
                time_ns: i,
                op: if i % 3 == 0 { Op::Write } else { Op::Read },
                addr: (i * 7919 % 1000) * 4096,
                len: 4096,
            })
            .collect()
    }

    fn trace_file(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(bytes).expect("write");
        f
    }

    #[test]
    fn every_access_arrives_once_in_order_across_batches() {
        let want = accesses(3 * BATCH_ACCESSES as u64 + 17);
        let f = trace_file(&encode_trace(&want).expect("encode"));
        let reader = TraceReader::open(f.path()).expect("open");
        let mut got = Vec::new();
        let (back, outcome) = drive(reader, |b| {
            got.extend_from_slice(b);
            Ok::<(), ()>(())
        });
        assert!(outcome.is_ok());
        assert_eq!(got, want);
        assert_eq!(
            back.expect("reader").location_of(5),
            format!("{}: record 5", f.path().display())
        );
    }

    #[test]
    fn a_refused_batch_stops_the_reader_and_gives_it_back() {
        let want = accesses(20 * BATCH_ACCESSES as u64);
        let f = trace_file(&encode_trace(&want).expect("encode"));
        let reader = TraceReader::open(f.path()).expect("open");
        let mut batches = 0;
        let (back, outcome) = drive(reader, |_| {
            batches += 1;
            if batches == 2 {
                Err("refused")
            } else {
                Ok(())
            }
        });
        assert!(matches!(outcome, Err(DriveError::Consume("refused"))));
        assert_eq!(batches, 2);
        assert!(back.is_some());
    }

    #[test]
    fn a_torn_record_is_an_error_after_the_whole_ones() {
        let want = accesses(BATCH_ACCESSES as u64 + 5);
        let mut bytes = encode_trace(&want).expect("encode");
        bytes.truncate(bytes.len() - 3);
        let f = trace_file(&bytes);
        let reader = TraceReader::open(f.path()).expect("open");
        let mut got = 0usize;
        let (_, outcome) = drive(reader, |b| {
            got += b.len();
            Ok::<(), ()>(())
        });
        assert!(matches!(outcome, Err(DriveError::Read(_))), "{outcome:?}");
        assert_eq!(got, want.len() - 1);
    }

    #[test]
    fn a_csv_trace_is_read_whole_and_a_bad_line_follows_the_good_ones() {
        let f = trace_file(b"time_ns,op,addr,len\n0,R,0,4096\n1,W,4096,4096\n2,R,nope,1\n");
        let reader = TraceReader::open(f.path()).expect("open");
        let mut got = Vec::new();
        let (_, outcome) = drive(reader, |b| {
            got.extend_from_slice(b);
            Ok::<(), ()>(())
        });
        assert_eq!(got.len(), 2);
        match outcome {
            Err(DriveError::Read(e)) => assert!(e.to_string().contains(":4"), "{e}"),
            other => panic!("not a read error: {other:?}"),
        }
    }
}
