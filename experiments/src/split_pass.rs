//! A fixed-rate sampled pass over a binary trace taken in parts, one per
//! CPU: each thread reads, decodes and samples its own range of records,
//! and the parts' samples are joined in order into the sample one pass
//! would have taken ([`CurvePass::join`]). What every access costs (the
//! read, the decode, the hash and the distinct count) is then spread over
//! the CPUs; what only the sample costs stays after the join. On one CPU
//! the trace is one part, read in place from its mapping (no copy by the
//! kernel): 28 % less CPU than a buffered read (docs/device-model.md).

use crate::parallel_map;
use crate::trace_io::TraceReader;
use anyhow::{anyhow, Context, Result};
use cxlfs_device_model::mrc::CurvePass;
use std::thread;

/// Records a part gets at least: below that a thread costs more than it
/// saves.
pub const MIN_PART_RECORDS: u64 = 1 << 20;

/// `pass` (unfed, [`CurvePass::splittable`]) fed `reader`'s trace in
/// parts, when the trace is binary, unread and long enough to cut;
/// otherwise hands both back for a pass of its own.
pub fn try_run(
    pass: CurvePass,
    reader: TraceReader,
) -> Result<Result<CurvePass, (CurvePass, TraceReader)>> {
    // One part per CPU.
    try_run_in(pass, reader, parallel_map::cpus(), MIN_PART_RECORDS)
}

/// [`try_run`] in `parts` parts of at least `min_records` records.
fn try_run_in(
    pass: CurvePass,
    reader: TraceReader,
    parts: usize,
    min_records: u64,
) -> Result<Result<CurvePass, (CurvePass, TraceReader)>> {
    let cut = if pass.splittable() && pass.next_index() == 0 {
        reader.split(parts, min_records)?
    } else {
        None
    };
    let Some(readers) = cut else {
        return Ok(Err((pass, reader)));
    };
    // Parts are of equal length (the last up to `parts` records longer);
    // the first part's sample becomes the whole one's, so it makes room
    // for all of them.
    let per_part = match readers.as_slice() {
        [a, b, ..] => b.records_before() - a.records_before(),
        _ => 0,
    };
    let n = readers.len() as u64;
    let fed: Vec<Result<CurvePass>> = thread::scope(|s| {
        let threads: Vec<_> = readers
            .into_iter()
            .enumerate()
            .map(|(k, r)| {
                let mut part = pass.part_like(r.records_before());
                if let Some(p) = part.as_mut() {
                    p.reserve_for(if k == 0 {
                        per_part * n + n
                    } else {
                        per_part + n
                    });
                }
                s.spawn(move || feed(part, r))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow!("a trace part's thread panicked")))
            })
            .collect()
    });
    // The first error is the earliest in the trace: parts are in order.
    let mut joined = pass;
    for part in fed {
        joined = joined.join(part?)?;
    }
    Ok(Ok(joined))
}

/// One part's pass: its reader's records, in order.
fn feed(part: Option<CurvePass>, mut reader: TraceReader) -> Result<CurvePass> {
    let mut pass = part.context("the pass cannot be taken in parts")?;
    while let Some(records) = reader.next_records() {
        if let Err(e) = pass.feed_records(records?) {
            let at = reader.location_of(e.index);
            return Err(e).context(at);
        }
    }
    Ok(pass)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cxlfs_device_model::mrc::shards::Sampler;
    use cxlfs_device_model::trace::{encode_header, encode_trace, Access, RECORD_LEN};
    use cxlfs_device_model::Op;
    use std::io::Write;

    const CAP: u64 = 1 << 30;

    fn accesses(n: u64) -> Vec<Access> {
        (0..n)
            .map(|i| Access {
                time_ns: i,
                op: if i % 4 == 0 { Op::Write } else { Op::Read },
                addr: (i * 7919 % 5000) * 4096 + (i % 3) * 2048,
                len: 4096,
            })
            .collect()
    }

    fn file(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(bytes).expect("write");
        f
    }

    fn sampled(warmup: u64) -> CurvePass {
        CurvePass::new(CAP, warmup, Some(Sampler::fixed_rate(0.1)))
    }

    /// The pass in 3 parts, or the error's text; panics if not cut.
    fn in_parts(f: &tempfile::NamedTempFile, warmup: u64) -> Result<CurvePass, String> {
        in_n_parts(f, warmup, 3)
    }

    /// The pass in `n` parts, or the error's text; panics if not cut.
    fn in_n_parts(f: &tempfile::NamedTempFile, warmup: u64, n: usize) -> Result<CurvePass, String> {
        let reader = TraceReader::open(f.path()).expect("open");
        match try_run_in(sampled(warmup), reader, n, 1) {
            Ok(Ok(pass)) => Ok(pass),
            Ok(Err(_)) => panic!("not cut"),
            Err(e) => Err(format!("{e:#}")),
        }
    }

    #[test]
    fn a_trace_sampled_in_parts_gives_the_sample_of_one_pass() {
        let all = accesses(10_001);
        let f = file(&encode_trace(&all).expect("encode"));
        let mut one = sampled(2_500);
        one.feed_batch(&all).expect("in range");
        let one = one.finish();
        let o = one.sample.expect("sample");
        assert!(o.warmup > 0 && o.pages() > 100);
        // Three parts, and one part read in place (one CPU).
        for n in [3, 1] {
            let parts = in_n_parts(&f, 2_500, n).expect("read").finish();
            assert_eq!(parts.fed, one.fed);
            let p = parts.sample.expect("sample");
            assert_eq!(p.accesses, o.accesses);
            assert_eq!(p.warmup, o.warmup);
            assert_eq!(p.realized_rate, o.realized_rate);
        }
    }

    #[test]
    fn errors_name_the_whole_traces_record() {
        // An access past the device in the second part.
        let mut all = accesses(9_000);
        all[4_500].addr = CAP;
        let f = file(&encode_trace(&all).expect("encode"));
        let e = in_parts(&f, 0).err().expect("out of range");
        assert!(e.contains("record 4500"), "{e}");
        // A record of length 0 (the reader lends records unchecked; the
        // pass refuses it), in the first part and in the last.
        for at in [1_234, 7_000] {
            let mut bytes = encode_trace(&accesses(9_000)).expect("encode");
            let word = bytes.len() - (9_000 - at) * RECORD_LEN + 16;
            bytes[word..word + 4].copy_from_slice(&(1u32 << 31).to_le_bytes());
            let e = in_parts(&file(&bytes), 0).err().expect("zero length");
            assert!(
                e.contains(&format!("record {at}")) && e.contains("zero-length"),
                "{e}"
            );
        }
        // A torn last record: the last part says so, after the whole ones.
        let mut bytes = encode_trace(&accesses(9_000)).expect("encode");
        bytes.truncate(bytes.len() - 7);
        let e = in_parts(&file(&bytes), 0).err().expect("torn");
        assert!(e.contains("8999"), "{e}");
        // A header count the records do not meet.
        let mut bytes = encode_trace(&accesses(9_000)).expect("encode");
        let head = encode_header(Some(9_001));
        bytes[..head.len()].copy_from_slice(&head);
        let e = in_parts(&file(&bytes), 0).err().expect("count");
        assert!(e.contains("9001") && e.contains("9000"), "{e}");
    }

    #[test]
    fn only_an_unread_long_enough_binary_trace_with_a_fixed_rate_sample_is_cut() {
        let all = accesses(3_000);
        let f = file(&encode_trace(&all).expect("encode"));
        let cut = |pass: CurvePass, min| {
            let reader = TraceReader::open(f.path()).expect("open");
            matches!(try_run_in(pass, reader, 3, min), Ok(Ok(_)))
        };
        assert!(cut(sampled(0), 1_000));
        assert!(!cut(sampled(0), 1_001));
        // One part (one CPU), read in place.
        let reader = TraceReader::open(f.path()).expect("open");
        assert!(matches!(try_run_in(sampled(0), reader, 1, 1), Ok(Ok(_))));
        assert!(!cut(
            CurvePass::new(CAP, 0, Some(Sampler::fixed_size(10, 1.0))),
            1
        ));
        assert!(!cut(CurvePass::new(CAP, 0, None).with_lru(&[1 << 20]), 1));
        let csv = file(b"0,R,0,4096\n1,R,4096,4096\n2,R,8192,4096\n");
        let reader = TraceReader::open(csv.path()).expect("open");
        assert!(matches!(try_run_in(sampled(0), reader, 3, 1), Ok(Err(_))));
    }
}
