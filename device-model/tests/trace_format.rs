//! The CSV and binary trace encodings: round trips and every error reason.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use cxlfs_device_model::replay::Arrival;
use cxlfs_device_model::trace::{
    decode_header, decode_record, decode_records, decode_trace, encode_header, encode_record,
    encode_trace, format_csv_arrival, format_csv_line, is_binary, parse_csv_arrival,
    parse_csv_line, Access, BinaryReader, BinaryTraceError, ReadBinaryError, Records, TraceHeader,
    TraceLineError, BINARY_MAGIC, BINARY_MAGIC_V1, HEADER_LEN, HEADER_LEN_V1, MAX_LEN, RECORD_LEN,
};
use cxlfs_device_model::Op;
use proptest::prelude::*;

fn access(time_ns: u64, op: Op, addr: u64, len: u32) -> Access {
    Access {
        time_ns,
        op,
        addr,
        len,
    }
}

fn sample() -> Vec<Access> {
    vec![
        access(0, Op::Read, 0, 64),
        access(150, Op::Write, 0x1000, 4096),
        access(150, Op::Read, u64::MAX - 1, 1),
        access(u64::MAX, Op::Write, 0x0dea_dbee_f000, MAX_LEN),
    ]
}

#[test]
fn csv_round_trip() {
    for a in sample() {
        let line = format_csv_line(&a);
        assert_eq!(parse_csv_line(&line).unwrap(), Some(a), "{line}");
        // With a newline, CRLF and padding too.
        assert_eq!(parse_csv_line(&format!("{line}\n")).unwrap(), Some(a));
        assert_eq!(parse_csv_line(&format!("{line}\r\n")).unwrap(), Some(a));
    }
    assert_eq!(format_csv_line(&sample()[1]), "150,W,0x1000,4096");
}

#[test]
fn csv_accepts_decimal_hex_spaces_and_lowercase_ops() {
    let want = access(7, Op::Write, 4096, 64);
    for line in [
        "7,W,4096,64",
        "7,w,0x1000,64",
        " 7 , W , 0X1000 , 0x40 ",
        "0x7,W,4096,64",
    ] {
        assert_eq!(parse_csv_line(line).unwrap(), Some(want), "{line}");
    }
}

#[test]
fn csv_skips_blank_comment_and_header_lines() {
    for line in [
        "",
        "   ",
        "\n",
        "# a comment",
        "  # indented",
        "time_ns,op,addr,len",
        "TIME_NS, op, addr, len\n",
    ] {
        assert_eq!(parse_csv_line(line).unwrap(), None, "{line:?}");
    }
}

fn csv_err(line: &str) -> TraceLineError {
    parse_csv_line(line).unwrap_err()
}

#[test]
fn csv_field_count() {
    assert_eq!(csv_err("1,R,0x10"), TraceLineError::FieldCount { got: 3 });
    assert_eq!(
        csv_err("1,R,0x10,4,5"),
        TraceLineError::FieldCount { got: 5 }
    );
    assert_eq!(csv_err("garbage"), TraceLineError::FieldCount { got: 1 });
    let msg = csv_err("1,R,0x10").to_string();
    assert!(msg.contains("expected 4 fields, got 3"), "{msg}");
}

#[test]
fn csv_bad_numbers_name_the_field() {
    let e = csv_err("1,R,0xzz,64");
    assert_eq!(
        e,
        TraceLineError::NotANumber {
            field: 3,
            name: "addr",
            text: "0xzz".into()
        }
    );
    assert_eq!(e.to_string(), "field 3 (addr): `0xzz` is not a number");
    assert!(csv_err("soon,R,0,64")
        .to_string()
        .starts_with("field 1 (time_ns): `soon`"));
    assert!(csv_err("1,R,0,")
        .to_string()
        .starts_with("field 4 (len): ``"));
    assert!(csv_err("1,R,-5,64")
        .to_string()
        .starts_with("field 3 (addr)"));
    assert!(csv_err("1,R,0x,64")
        .to_string()
        .starts_with("field 3 (addr)"));
    let e = csv_err("1,R,99999999999999999999999,64");
    assert!(
        matches!(e, TraceLineError::TooLarge { field: 3, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("does not fit in 64 bits"));
}

#[test]
fn csv_bad_op() {
    let e = csv_err("1,X,0,64");
    assert_eq!(e, TraceLineError::BadOp { text: "X".into() });
    assert!(e.to_string().contains("op must be R or W"), "{e}");
    assert!(e.to_string().contains("field 2 (op)"), "{e}");
}

#[test]
fn csv_bad_len() {
    let e = csv_err("1,R,0,0");
    assert_eq!(e, TraceLineError::ZeroLen);
    assert!(e.to_string().contains("len must be > 0"), "{e}");
    let e = csv_err("1,R,0,2147483648");
    assert_eq!(e, TraceLineError::LenTooLarge { len: 1 << 31 });
    assert!(parse_csv_line("1,R,0,2147483647").unwrap().is_some());
}

#[test]
fn binary_layout_is_little_endian_with_op_in_top_bit() {
    let rec = encode_record(&access(0x0102, Op::Write, 0x0a0b, 64)).unwrap();
    assert_eq!(rec.len(), RECORD_LEN);
    assert_eq!(&rec[..8], &0x0102u64.to_le_bytes());
    assert_eq!(&rec[8..16], &0x0a0bu64.to_le_bytes());
    assert_eq!(&rec[16..], &(64u32 | 1 << 31).to_le_bytes());
    let header = encode_header(Some(5));
    assert_eq!(header.len(), HEADER_LEN);
    assert_eq!(HEADER_LEN, 32);
    assert_eq!(&header[..8], b"CXLTRC02");
    assert_eq!(&header[8..16], &5u64.to_le_bytes());
    assert_eq!(&header[16..], &[0u8; 16]);
    assert_eq!(&encode_header(None)[8..16], &u64::MAX.to_le_bytes());
    assert!(is_binary(&header));
    assert!(is_binary(b"CXLTRC01"));
    assert!(!is_binary(b"0,R,0,64\n"));
    // The arrival mode: code at 16..20, argument at 24..32.
    let closed = TraceHeader {
        count: Some(5),
        arrival: Some(Arrival::Closed { think_ns: 0x0102 }),
    }
    .encode();
    assert_eq!(&closed[16..20], &2u32.to_le_bytes());
    assert_eq!(&closed[20..24], &[0u8; 4]);
    assert_eq!(&closed[24..], &0x0102u64.to_le_bytes());
    let fixed = TraceHeader {
        count: None,
        arrival: Some(Arrival::Fixed { interval_ns: 100 }),
    }
    .encode();
    assert_eq!(&fixed[16..20], &3u32.to_le_bytes());
    assert_eq!(&fixed[24..], &100u64.to_le_bytes());
    let trace = TraceHeader {
        count: None,
        arrival: Some(Arrival::Trace),
    }
    .encode();
    assert_eq!(&trace[16..20], &1u32.to_le_bytes());
}

#[test]
fn binary_header_records_the_arrival_mode() {
    for arrival in [
        None,
        Some(Arrival::Trace),
        Some(Arrival::Closed { think_ns: 0 }),
        Some(Arrival::Closed { think_ns: 250 }),
        Some(Arrival::Fixed { interval_ns: 100 }),
    ] {
        for count in [None, Some(0), Some(7)] {
            let h = TraceHeader { count, arrival };
            assert_eq!(TraceHeader::decode(&h.encode()).unwrap(), (h, HEADER_LEN));
        }
    }
    let mut bad = TraceHeader::default().encode();
    bad[16] = 4;
    assert_eq!(
        TraceHeader::decode(&bad),
        Err(BinaryTraceError::BadArrival {
            code: 4,
            reserved: 0
        })
    );
    let mut bad = TraceHeader::default().encode();
    bad[21] = 1;
    assert!(matches!(
        TraceHeader::decode(&bad),
        Err(BinaryTraceError::BadArrival { code: 0, .. })
    ));
}

#[test]
fn version_1_traces_still_read() {
    let trace = sample();
    let mut v1 = BINARY_MAGIC_V1.to_vec();
    v1.extend_from_slice(&(trace.len() as u64).to_le_bytes());
    assert_eq!(v1.len(), HEADER_LEN_V1);
    for a in &trace {
        v1.extend_from_slice(&encode_record(a).unwrap());
    }
    assert_eq!(
        TraceHeader::decode(&v1).unwrap(),
        (
            TraceHeader {
                count: Some(4),
                arrival: None
            },
            HEADER_LEN_V1
        )
    );
    assert_eq!(decode_trace(&v1).unwrap(), trace);
    let streamed = BinaryReader::new(&v1[..]).unwrap();
    assert_eq!(streamed.header().arrival, None);
    assert_eq!(streamed.collect::<Result<Vec<_>, _>>().unwrap(), trace);
}

#[test]
fn binary_reader_streams_what_decode_trace_decodes() {
    let trace = sample();
    let mut bytes = TraceHeader {
        count: Some(trace.len() as u64),
        arrival: Some(Arrival::Closed { think_ns: 0 }),
    }
    .encode()
    .to_vec();
    for a in &trace {
        bytes.extend_from_slice(&encode_record(a).unwrap());
    }
    assert_eq!(decode_trace(&bytes).unwrap(), trace);
    // A reader handing out a few bytes at a time: records straddle its buffer.
    let slow = std::io::BufReader::with_capacity(7, &bytes[..]);
    let mut reader = BinaryReader::new(slow).unwrap();
    assert_eq!(
        reader.header().arrival,
        Some(Arrival::Closed { think_ns: 0 })
    );
    let got: Vec<Access> = reader.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(got, trace);
    assert_eq!(reader.records_read(), 4);
    // Truncated: the record's index and the bytes present.
    let cut = &bytes[..bytes.len() - 3];
    let errs: Vec<_> = BinaryReader::new(cut).unwrap().collect();
    assert_eq!(errs.len(), 4);
    match &errs[3] {
        Err(ReadBinaryError::Record {
            index: 3,
            source: BinaryTraceError::TruncatedRecord { got: 17 },
        }) => {}
        other => panic!("{other:?}"),
    }
    // A count that disagrees: after the last record.
    let mut wrong = bytes.clone();
    wrong[8..16].copy_from_slice(&5u64.to_le_bytes());
    let last = BinaryReader::new(&wrong[..]).unwrap().last().unwrap();
    assert!(
        matches!(
            last,
            Err(ReadBinaryError::Record {
                index: 4,
                source: BinaryTraceError::CountMismatch {
                    declared: 5,
                    found: 4
                }
            })
        ),
        "{last:?}"
    );
    // A bad or short header.
    assert!(matches!(
        BinaryReader::new(&b"CXLTRC09\0\0\0\0\0\0\0\0"[..]),
        Err(ReadBinaryError::Header(BinaryTraceError::BadMagic { .. }))
    ));
    assert!(matches!(
        BinaryReader::new(&bytes[..20]),
        Err(ReadBinaryError::Header(BinaryTraceError::TruncatedHeader {
            got: 20,
            want: 32
        }))
    ));
}

/// Every access a reader's `next_records` hands out, decoded, and the
/// error it ended with.
fn all_records<R: std::io::BufRead>(
    reader: &mut BinaryReader<R>,
) -> (Vec<Access>, Option<ReadBinaryError>) {
    let mut out = Vec::new();
    while let Some(records) = reader.next_records() {
        match records {
            Ok(Records::Decoded(batch)) => out.extend_from_slice(batch),
            Ok(Records::Raw(raw)) => out.extend(raw.iter().map(|r| r.access())),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

fn many(n: u64) -> Vec<Access> {
    (0..n)
        .map(|i| {
            access(
                i,
                if i % 3 == 0 { Op::Write } else { Op::Read },
                i * 4096,
                64 + i as u32,
            )
        })
        .collect()
}

#[test]
fn undecoded_records_are_the_decoded_ones() {
    let trace = many(1000);
    let bytes = encode_trace(&trace).unwrap();
    // Buffers of 7 bytes (every record straddles), 100 (some do) and the
    // default; the counts checked at the end.
    for capacity in [7, 100, 8192] {
        let buffered = std::io::BufReader::with_capacity(capacity, &bytes[..]);
        let mut reader = BinaryReader::new(buffered).unwrap();
        let (got, error) = all_records(&mut reader);
        assert!(error.is_none(), "{error:?}");
        assert_eq!(got, trace, "buffer of {capacity}");
        assert_eq!(reader.records_read(), 1000);
    }
    // Mixed with the other ways of reading: what one decoded first, the
    // other does not hand out again.
    let mut reader = BinaryReader::new(&bytes[..]).unwrap();
    let first = reader.next().unwrap().unwrap();
    let (rest, error) = all_records(&mut reader);
    assert!(error.is_none());
    assert_eq!([vec![first], rest].concat(), trace);
    let mut reader =
        BinaryReader::new(std::io::BufReader::with_capacity(8192, &bytes[..])).unwrap();
    let Some(Ok(Records::Raw(raw))) = reader.next_records() else {
        panic!("raw records first");
    };
    let lent = raw.len();
    let mut rest: Vec<Access> = raw.iter().map(|r| r.access()).collect();
    rest.extend(reader.by_ref().map(|a| a.unwrap()));
    assert_eq!(rest, trace);
    assert!(lent > 0 && lent < 1000);
}

#[test]
fn undecoded_records_stop_where_decoding_does() {
    let trace = many(500);
    // A record of length 0: the records before it, then its index.
    let mut bytes = encode_trace(&trace).unwrap();
    let at = bytes.len() - 100 * RECORD_LEN;
    bytes[at + 16..at + 20].copy_from_slice(&(1u32 << 31).to_le_bytes());
    for capacity in [7, 8192] {
        let mut reader =
            BinaryReader::new(std::io::BufReader::with_capacity(capacity, &bytes[..])).unwrap();
        let (got, error) = all_records(&mut reader);
        assert_eq!(got, trace[..400]);
        assert!(
            matches!(
                error,
                Some(ReadBinaryError::Record {
                    index: 400,
                    source: BinaryTraceError::ZeroLen
                })
            ),
            "{error:?}"
        );
        assert!(reader.next_records().is_none());
    }
    // Lent unchecked, the record of length 0 is among the others, for the
    // consumer to refuse.
    let mut reader = BinaryReader::new(&bytes[..]).unwrap();
    let mut lent = Vec::new();
    while let Some(records) = reader.next_records_unchecked() {
        let Ok(Records::Raw(raw)) = records else {
            panic!("undecoded records");
        };
        lent.extend(raw.iter().map(|r| r.bytes()));
    }
    assert_eq!(lent.len(), 500);
    assert_eq!(lent.iter().position(|&b| b == 0), Some(400));
    // A torn last record, and a count the records miss.
    let whole = encode_trace(&trace).unwrap();
    let (got, error) = all_records(&mut BinaryReader::new(&whole[..whole.len() - 3]).unwrap());
    assert_eq!(got, trace[..499]);
    assert!(
        matches!(
            error,
            Some(ReadBinaryError::Record {
                index: 499,
                source: BinaryTraceError::TruncatedRecord { got: 17 }
            })
        ),
        "{error:?}"
    );
    let mut short = whole.clone();
    short[8..16].copy_from_slice(&501u64.to_le_bytes());
    let (got, error) = all_records(&mut BinaryReader::new(&short[..]).unwrap());
    assert_eq!(got.len(), 500);
    assert!(matches!(
        error,
        Some(ReadBinaryError::Record {
            index: 500,
            source: BinaryTraceError::CountMismatch {
                declared: 501,
                found: 500
            }
        })
    ));
    // A part stops at its end.
    let whole_reader = BinaryReader::new(&whole[..]).unwrap();
    let from = whole_reader.header_len() + 100 * RECORD_LEN;
    let mut part = BinaryReader::part(&whole[from..], &whole_reader, 100, Some(50));
    let (got, error) = all_records(&mut part);
    assert!(error.is_none());
    assert_eq!(got, trace[100..150]);
}

#[test]
fn csv_arrival_comment() {
    for arrival in [
        Arrival::Trace,
        Arrival::Closed { think_ns: 0 },
        Arrival::Closed { think_ns: 5 },
        Arrival::Fixed { interval_ns: 100 },
    ] {
        let line = format_csv_arrival(arrival);
        assert_eq!(parse_csv_arrival(&line), Some(Ok(arrival)), "{line}");
        // Still a comment to the record parser.
        assert_eq!(parse_csv_line(&line).unwrap(), None);
    }
    assert_eq!(
        format_csv_arrival(Arrival::Closed { think_ns: 0 }),
        "# arrival: closed"
    );
    assert_eq!(
        parse_csv_arrival("  #Arrival:fixed:1us \r\n"),
        Some(Ok(Arrival::Fixed { interval_ns: 1000 }))
    );
    assert!(matches!(
        parse_csv_arrival("# arrival: sometimes"),
        Some(Err(_))
    ));
    assert_eq!(parse_csv_arrival("# arrivals are closed"), None);
    assert_eq!(parse_csv_arrival("# demo"), None);
    assert_eq!(parse_csv_arrival("0,R,0,64"), None);
}

#[test]
fn binary_round_trip() {
    let trace = sample();
    for a in &trace {
        assert_eq!(decode_record(&encode_record(a).unwrap()).unwrap(), *a);
    }
    let bytes = encode_trace(&trace).unwrap();
    assert_eq!(bytes.len(), HEADER_LEN + trace.len() * RECORD_LEN);
    assert_eq!(
        TraceHeader::decode(&bytes).unwrap().0,
        TraceHeader {
            count: Some(trace.len() as u64),
            arrival: None
        }
    );
    assert_eq!(decode_header(&bytes).unwrap(), Some(trace.len() as u64));
    assert_eq!(decode_trace(&bytes).unwrap(), trace);
    let streamed: Vec<Access> = decode_records(&bytes[HEADER_LEN..])
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(streamed, trace);
    // Unknown count is fine.
    let mut unknown = bytes.clone();
    unknown[..HEADER_LEN].copy_from_slice(&encode_header(None));
    assert_eq!(decode_header(&unknown).unwrap(), None);
    assert_eq!(decode_trace(&unknown).unwrap(), trace);
}

#[test]
fn binary_errors() {
    assert!(matches!(
        decode_header(b"CXLTRC03\0\0\0\0\0\0\0\0"),
        Err(BinaryTraceError::BadMagic { .. })
    ));
    assert!(matches!(
        decode_header(b"0,R,0x1000,64\n\n\n"),
        Err(BinaryTraceError::BadMagic { .. })
    ));
    assert_eq!(
        decode_header(&BINARY_MAGIC[..]),
        Err(BinaryTraceError::TruncatedHeader { got: 8, want: 32 })
    );
    assert_eq!(
        decode_header(&BINARY_MAGIC_V1[..]),
        Err(BinaryTraceError::TruncatedHeader { got: 8, want: 16 })
    );
    assert_eq!(
        decode_header(b"CXLT"),
        Err(BinaryTraceError::TruncatedHeader { got: 4, want: 32 })
    );
    let bytes = encode_trace(&sample()).unwrap();
    let cut = &bytes[..bytes.len() - 3];
    assert_eq!(
        decode_trace(cut),
        Err(BinaryTraceError::TruncatedRecord {
            got: RECORD_LEN - 3
        })
    );
    let mut records = decode_records(&cut[HEADER_LEN..]);
    for _ in 0..3 {
        assert!(records.next().unwrap().is_ok());
    }
    assert_eq!(
        records.next(),
        Some(Err(BinaryTraceError::TruncatedRecord { got: 17 }))
    );
    assert_eq!(records.next(), None);
    // Zero length on decode and encode, too long on encode.
    let mut zero = encode_record(&access(1, Op::Write, 2, 3)).unwrap();
    zero[16..].copy_from_slice(&(1u32 << 31).to_le_bytes());
    assert_eq!(decode_record(&zero), Err(BinaryTraceError::ZeroLen));
    assert_eq!(
        encode_record(&access(1, Op::Read, 2, 0)),
        Err(BinaryTraceError::ZeroLen)
    );
    assert_eq!(
        encode_record(&access(1, Op::Read, 2, 1 << 31)),
        Err(BinaryTraceError::LenTooLarge { len: 1 << 31 })
    );
    // A count that disagrees with the body.
    let mut wrong = bytes.clone();
    wrong[8..16].copy_from_slice(&9u64.to_le_bytes());
    assert_eq!(
        decode_trace(&wrong),
        Err(BinaryTraceError::CountMismatch {
            declared: 9,
            found: 4
        })
    );
}

fn any_access() -> impl Strategy<Value = Access> {
    (any::<u64>(), any::<bool>(), any::<u64>(), 1..=MAX_LEN)
        .prop_map(|(t, w, addr, len)| access(t, if w { Op::Write } else { Op::Read }, addr, len))
}

proptest! {
    #[test]
    fn any_access_round_trips_both_ways(a in any_access()) {
        prop_assert_eq!(parse_csv_line(&format_csv_line(&a)).unwrap(), Some(a));
        prop_assert_eq!(decode_record(&encode_record(&a).unwrap()).unwrap(), a);
    }

    #[test]
    fn csv_parser_never_panics(line in "\\PC{0,40}") {
        let _ = parse_csv_line(&line);
        let _ = parse_csv_arrival(&line);
        let _ = parse_csv_arrival(&format!("# arrival:{line}"));
    }

    #[test]
    fn header_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
        let _ = TraceHeader::decode(&bytes);
        let mut v2 = BINARY_MAGIC.to_vec();
        v2.extend_from_slice(&bytes);
        if let Ok((h, len)) = TraceHeader::decode(&v2) {
            prop_assert_eq!(len, HEADER_LEN);
            prop_assert_eq!(TraceHeader::decode(&h.encode()).unwrap(), (h, HEADER_LEN));
        }
    }
}
