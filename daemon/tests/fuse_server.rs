//! The FUSE server over the timing layer, driven with plain byte buffers:
//! malformed requests get errors (never a panic), requests before INIT
//! fail, READ is charged and paced, DRAM-tier pages cost nothing.

#![allow(clippy::unwrap_used)]
use cxlfs_device_model::{Device, DeviceConfig};
use cxlfsd::abi::{self, opcode, Cursor, InHeader, OutHeader};
use cxlfsd::server::{Handled, Server, ServerOptions};
use cxlfsd::{CacheMode, PassthroughFs, SharedDevice, TimedFs, VmMetrics};
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
        cxlfsd::Placement::new(cxl_ratio).unwrap(),
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
        opcode::LINK,
        opcode::MKNOD,
        opcode::TMPFILE,
        opcode::GETXATTR,
        opcode::SETXATTR,
        opcode::REMOVEXATTR,
        opcode::FALLOCATE,
        opcode::LSEEK,
        opcode::COPY_FILE_RANGE,
        opcode::GETLK,
        opcode::SETLK,
        opcode::SETLKW,
        opcode::ACCESS,
        opcode::FLUSH,
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

/// `fuse_init_out.flags` of an INIT reply.
fn init_reply_flags(r: &Handled) -> u32 {
    let reply = r.reply.as_ref().unwrap();
    u32::from_le_bytes(reply[16 + 12..16 + 16].try_into().unwrap())
}

fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn write_args(fh: u64, offset: u64, write_flags: u32, data: &[u8]) -> Vec<u8> {
    use cxlfsd::abi::zerocopy::IntoBytes;
    let w = abi::WriteIn {
        fh,
        offset,
        size: data.len() as u32,
        write_flags,
        ..Default::default()
    };
    let mut a = w.as_bytes().to_vec();
    a.extend_from_slice(data);
    a
}

fn setattr_args(s: abi::SetattrIn) -> Vec<u8> {
    use cxlfsd::abi::zerocopy::IntoBytes;
    s.as_bytes().to_vec()
}

#[test]
fn killpriv_v2_is_negotiated_and_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f");
    std::fs::write(&f, b"0123456789").unwrap();
    let s = server(dir.path());
    let r = s.handle(0, &req(opcode::INIT, 1, 0, &init_args()), 4096);
    let flags = u64::from(init_reply_flags(&r));
    assert_ne!(flags & abi::init_flags::HANDLE_KILLPRIV_V2, 0);
    assert_eq!(
        flags & abi::init_flags::DONT_MASK,
        0,
        "the kernel applies the umask"
    );

    // WRITE: set-id bits stay without the flag, go with it.
    chmod(&f, 0o6755);
    let (nodeid, _) = open_f(&s);
    let rdwr = (libc::O_RDWR as u32).to_le_bytes();
    let r = s.handle(
        0,
        &req(opcode::OPEN, 9, nodeid, &[&rdwr[..], &[0; 4]].concat()),
        4096,
    );
    let fh = u64::from_le_bytes(r.reply.unwrap()[16..24].try_into().unwrap());
    let w = |unique, flags| {
        let r = s.handle(
            0,
            &req(
                opcode::WRITE,
                unique,
                nodeid,
                &write_args(fh, 0, flags, b"ab"),
            ),
            4096,
        );
        assert_eq!(reply_header(&r).error, 0);
    };
    w(10, 0);
    assert_eq!(mode_of(&f), 0o6755);
    w(11, abi::write_flags::KILL_SUIDGID);
    assert_eq!(mode_of(&f), 0o755);
    // S_ISGID without group exec is not a set-gid program: kept.
    chmod(&f, 0o6745);
    w(12, abi::write_flags::KILL_SUIDGID);
    assert_eq!(mode_of(&f), 0o2745);

    // SETATTR of the size with FATTR_KILL_SUIDGID.
    chmod(&f, 0o4755);
    let a = abi::SetattrIn {
        valid: abi::fattr::SIZE | abi::fattr::KILL_SUIDGID,
        size: 3,
        ..Default::default()
    };
    let r = s.handle(0, &req(opcode::SETATTR, 13, nodeid, &setattr_args(a)), 4096);
    assert_eq!(reply_header(&r).error, 0);
    assert_eq!(mode_of(&f), 0o755);
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 3);

    // OPEN with O_TRUNC and FUSE_OPEN_KILL_SUIDGID.
    chmod(&f, 0o4755);
    let mut o = Vec::new();
    o.extend_from_slice(&((libc::O_WRONLY | libc::O_TRUNC) as u32).to_le_bytes());
    o.extend_from_slice(&abi::open_in_flags::KILL_SUIDGID.to_le_bytes());
    let r = s.handle(0, &req(opcode::OPEN, 14, nodeid, &o), 4096);
    assert_eq!(reply_header(&r).error, 0);
    assert_eq!(mode_of(&f), 0o755);
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 0);
}

#[test]
fn setattr_size_beyond_off_t_is_einval() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"keep").unwrap();
    let s = server(dir.path());
    let (nodeid, fh) = open_f(&s);
    for (i, size) in [u64::MAX, 1 << 63, (1 << 63) + 4096]
        .into_iter()
        .enumerate()
    {
        for with_fh in [false, true] {
            let a = abi::SetattrIn {
                valid: abi::fattr::SIZE | if with_fh { abi::fattr::FH } else { 0 },
                fh,
                size,
                ..Default::default()
            };
            let r = s.handle(
                0,
                &req(opcode::SETATTR, 20 + i as u64, nodeid, &setattr_args(a)),
                4096,
            );
            assert_eq!(reply_header(&r).error, -libc::EINVAL, "size {size:#x}");
        }
    }
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"keep");
}
