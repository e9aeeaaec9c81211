//! The CSV and binary trace encodings: round trips and every error reason.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use cxlfs_device_model::trace::{
    decode_header, decode_record, decode_records, decode_trace, encode_header, encode_record,
    encode_trace, format_csv_line, is_binary, parse_csv_line, Access, BinaryTraceError,
    TraceLineError, BINARY_MAGIC, HEADER_LEN, MAX_LEN, RECORD_LEN,
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
    assert_eq!(&header[..8], b"CXLTRC01");
    assert_eq!(&header[8..], &5u64.to_le_bytes());
    assert_eq!(&encode_header(None)[8..], &u64::MAX.to_le_bytes());
    assert!(is_binary(&header));
    assert!(!is_binary(b"0,R,0,64\n"));
}

#[test]
fn binary_round_trip() {
    let trace = sample();
    for a in &trace {
        assert_eq!(decode_record(&encode_record(a).unwrap()).unwrap(), *a);
    }
    let bytes = encode_trace(&trace).unwrap();
    assert_eq!(bytes.len(), HEADER_LEN + trace.len() * RECORD_LEN);
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
        decode_header(b"CXLTRC02\0\0\0\0\0\0\0\0"),
        Err(BinaryTraceError::BadMagic { .. })
    ));
    assert!(matches!(
        decode_header(b"0,R,0x1000,64\n\n\n"),
        Err(BinaryTraceError::BadMagic { .. })
    ));
    assert_eq!(
        decode_header(&BINARY_MAGIC[..]),
        Err(BinaryTraceError::TruncatedHeader { got: 8 })
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
    }
}
