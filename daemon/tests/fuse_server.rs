//! The FUSE server over the timing layer, driven with plain byte buffers:
//! malformed requests get errors (never a panic), requests before INIT
//! fail, READ is charged and paced, DRAM-tier pages cost nothing.

#![allow(clippy::unwrap_used)]
use cxlfs_device_model::{Device, DeviceConfig};
use cxlfsd::abi::{self, opcode, Cursor, InHeader, OutHeader};
use cxlfsd::device::SharedDevice;
use cxlfsd::metrics::VmMetrics;
use cxlfsd::passthrough::{CacheMode, PassthroughFs};
use cxlfsd::server::{Handled, Server, ServerOptions};
use cxlfsd::timing::TimedFs;
use std::sync::atomic::Ordering;
use std::sync::Arc;

type TestServer = Server<TimedFs<PassthroughFs>>;

fn server(dir: &std::path::Path) -> TestServer {
    server_at(dir, 100)
}

/// The server over the timing layer (the charges these tests check
/// are the timing layer's), without pool references or DAX.
fn server_at(dir: &std::path::Path, cxl_ratio: u8) -> TestServer {
    let cfg = DeviceConfig::default()
        .with_overrides(&["cache.size_bytes=1MiB", "nand.read_ns=30us"])
        .unwrap();
    let shared = Arc::new(SharedDevice::with_placement(
        Device::new(cfg).unwrap(),
        cxlfsd::device::placement::Placement::new(cxl_ratio).unwrap(),
    ));
    let metrics = Arc::new(VmMetrics::new("t"));
    let fs = PassthroughFs::new(dir, CacheMode::Never).unwrap();
    let timed = TimedFs::new(fs, shared, metrics.clone(), None);
    Server::new(
        timed,
        metrics,
        ServerOptions {
            max_readahead: None,
        },
    )
}

fn req(op: u32, unique: u64, nodeid: u64, args: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    InHeader {
        len: (abi::IN_HEADER_LEN + args.len()) as u32,
        opcode: op,
        unique,
        nodeid,
        ..Default::default()
    }
    .encode(&mut b);
    b.extend_from_slice(args);
    b
}

fn init_args() -> Vec<u8> {
    let mut a = Vec::new();
    for v in [7u32, 31, 128 * 1024, 0xffff_ffff] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    a.extend_from_slice(&[0u8; 48]);
    a
}

fn reply_header(r: &Handled) -> OutHeader {
    OutHeader::parse(&mut Cursor::new(r.reply.as_ref().unwrap())).unwrap()
}

#[test]
fn malformed_requests_get_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path());
    // Shorter than a header.
    for n in 0..std::mem::size_of::<InHeader>() {
        let r = s.handle(0, &vec![0xff; n], 4096);
        assert_eq!(reply_header(&r).error, -libc::EINVAL);
    }
    // Header length beyond the buffer.
    let mut b = req(opcode::INIT, 9, 0, &init_args());
    b[0..4].copy_from_slice(&10_000u32.to_le_bytes());
    let r = s.handle(0, &b, 4096);
    assert_eq!(reply_header(&r).error, -libc::EINVAL);
    assert_eq!(reply_header(&r).unique, 9);
    // Header length below the header size.
    b[0..4].copy_from_slice(&8u32.to_le_bytes());
    assert_eq!(reply_header(&s.handle(0, &b, 4096)).error, -libc::EINVAL);
    // No room for even a reply header: no reply.
    assert_eq!(s.handle(0, &b, 8).reply, None);
    // Init, then truncated argument structs for many opcodes.
    let r = s.handle(0, &req(opcode::INIT, 1, 0, &init_args()), 4096);
    assert_eq!(reply_header(&r).error, 0);
    for op in [
        opcode::LOOKUP,
        opcode::SETATTR,
        opcode::OPEN,
        opcode::CREATE,
        opcode::READ,
        opcode::WRITE,
        opcode::MKDIR,
        opcode::RENAME,
        opcode::RENAME2,
        opcode::READDIR,
        opcode::READDIRPLUS,
        opcode::FSYNC,
        opcode::UNLINK,
        opcode::SYMLINK,
    ] {
        for n in [0usize, 3, 7, 12] {
            let r = s.handle(0, &req(op, 5, 1, &vec![0x41; n]), 4096);
            assert!(reply_header(&r).error < 0, "op {op} with {n} arg bytes");
        }
    }
    // A WRITE whose size claims more than it carries.
    let mut w = Vec::new();
    w.extend_from_slice(&1u64.to_le_bytes());
    w.extend_from_slice(&0u64.to_le_bytes());
    w.extend_from_slice(&4096u32.to_le_bytes());
    w.extend_from_slice(&[0u8; 20]);
    w.extend_from_slice(b"short");
    let r = s.handle(0, &req(opcode::WRITE, 6, 1, &w), 4096);
    assert_eq!(reply_header(&r).error, -libc::EINVAL);
    // Unknown opcodes.
    for op in [0u32, 7, 48, 49, 200, u32::MAX] {
        let r = s.handle(0, &req(op, 8, 1, &[]), 4096);
        assert_eq!(reply_header(&r).error, -libc::ENOSYS, "op {op}");
    }
    // FORGET takes no reply, even malformed.
    assert_eq!(
        s.handle(0, &req(opcode::FORGET, 1, 99, &[1]), 4096).reply,
        None
    );
    assert_eq!(
        s.handle(0, &req(opcode::BATCH_FORGET, 1, 0, &[0xff; 12]), 4096)
            .reply,
        None
    );
}

#[test]
fn requests_before_init_fail() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path());
    let r = s.handle(0, &req(opcode::LOOKUP, 1, 1, b"x\0"), 4096);
    assert_eq!(reply_header(&r).error, -libc::EIO);
}

#[test]
fn reads_of_dram_tier_pages_are_not_delayed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), vec![7u8; 64 * 1024]).unwrap();
    let s = server_at(dir.path(), 0);
    let (nodeid, fh) = open_f(&s);
    let a = read_args(fh, 0, 64 * 1024);
    for t in [1000, 2000] {
        let r = s.handle(t, &req(opcode::READ, 4, nodeid, &a), 128 * 1024);
        assert_eq!(r.reply.as_ref().unwrap().len(), 16 + 64 * 1024);
        assert_eq!(r.completes_at_ns, Some(t), "DRAM tier: no device delay");
    }
    let m = s.metrics();
    assert_eq!(m.device_misses.load(Ordering::Relaxed), 0);
    assert_eq!(m.device_hits.load(Ordering::Relaxed), 0);
    assert_eq!(m.dram_pages.load(Ordering::Relaxed), 32);
    assert_eq!(m.nand_reads.load(Ordering::Relaxed), 0);
}

fn open_f(s: &TestServer) -> (u64, u64) {
    s.handle(0, &req(opcode::INIT, 1, 0, &init_args()), 4096);
    let r = s.handle(0, &req(opcode::LOOKUP, 2, 1, b"f\0"), 4096);
    let reply = r.reply.unwrap();
    let nodeid = u64::from_le_bytes(reply[16..24].try_into().unwrap());
    let r = s.handle(0, &req(opcode::OPEN, 3, nodeid, &[0u8; 8]), 4096);
    let reply = r.reply.unwrap();
    (
        nodeid,
        u64::from_le_bytes(reply[16..24].try_into().unwrap()),
    )
}

fn read_args(fh: u64, offset: u64, size: u32) -> Vec<u8> {
    let mut a = Vec::new();
    a.extend_from_slice(&fh.to_le_bytes());
    a.extend_from_slice(&offset.to_le_bytes());
    a.extend_from_slice(&size.to_le_bytes());
    a.extend_from_slice(&[0u8; 20]);
    a
}

#[test]
fn read_is_charged_and_paced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), vec![7u8; 8192]).unwrap();
    let s = server(dir.path());
    s.handle(0, &req(opcode::INIT, 1, 0, &init_args()), 4096);
    let r = s.handle(0, &req(opcode::LOOKUP, 2, 1, b"f\0"), 4096);
    let reply = r.reply.unwrap();
    let nodeid = u64::from_le_bytes(reply[16..24].try_into().unwrap());
    let r = s.handle(0, &req(opcode::OPEN, 3, nodeid, &[0u8; 8]), 4096);
    let reply = r.reply.unwrap();
    let fh = u64::from_le_bytes(reply[16..24].try_into().unwrap());
    let open_flags = u32::from_le_bytes(reply[24..28].try_into().unwrap());
    assert_eq!(open_flags & abi::fopen::DIRECT_IO, abi::fopen::DIRECT_IO);
    let mut a = Vec::new();
    a.extend_from_slice(&fh.to_le_bytes());
    a.extend_from_slice(&0u64.to_le_bytes());
    a.extend_from_slice(&4096u32.to_le_bytes());
    a.extend_from_slice(&[0u8; 20]);
    let first = s.handle(1000, &req(opcode::READ, 4, nodeid, &a), 8192);
    assert_eq!(first.reply.as_ref().unwrap().len(), 16 + 4096);
    let t1 = first.completes_at_ns.unwrap();
    assert!(t1 >= 1000 + 30_000, "a miss costs the NAND read: {t1}");
    let second = s.handle(t1, &req(opcode::READ, 5, nodeid, &a), 8192);
    let t2 = second.completes_at_ns.unwrap();
    assert!(t2 - t1 < 30_000, "a hit is cheap: {}", t2 - t1);
    assert_eq!(s.metrics().device_misses.load(Ordering::Relaxed), 1);
    assert_eq!(s.metrics().device_hits.load(Ordering::Relaxed), 1);
    assert_eq!(s.metrics().read_bytes.load(Ordering::Relaxed), 8192);
    // A read clamped by the room in the chain.
    let small = s.handle(t2, &req(opcode::READ, 6, nodeid, &a), 16 + 100);
    assert_eq!(small.reply.unwrap().len(), 116);
}
