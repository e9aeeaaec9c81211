//! The server's answers, fed as bytes: the protocol, garbage, INIT, misses
//! released ahead by the floor, and the calibration file.

use super::*;
use crate::{Miss, MissData, MissReply, ServeMissError, WritebackError};
use fuse_abi::zerocopy::{FromBytes, IntoBytes};
use fuse_abi::{ForgetIn, WriteIn};

struct Zero;
impl PoolBackend for Zero {
    fn now_ns(&self) -> u64 {
        0
    }
    fn on_miss(&self, m: &Miss, dst: &mut [u8]) -> Result<MissReply, ServeMissError> {
        dst.fill(0xab);
        Ok(MissReply {
            data: MissData::InPlace {
                len: m.len as usize,
            },
            completes_at_ns: 5,
        })
    }
    fn on_writeback(&self, _: u64, _: &[u8], _: u32, _: u64) -> Result<u64, WritebackError> {
        Ok(7)
    }
}

fn request(opcode: u32, nodeid: u64, args: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    InHeader {
        len: (abi::IN_HEADER_LEN + args.len()) as u32,
        opcode,
        unique: 9,
        nodeid,
        pid: 1,
        ..InHeader::default()
    }
    .encode(&mut b);
    b.extend_from_slice(args);
    b
}

fn out_error(out: &[u8]) -> i32 {
    OutHeader::parse(&mut Cursor::new(out)).unwrap().error
}

#[test]
fn garbage_never_panics() {
    let s = Server::new(Arc::new(Zero), 1 << 20);
    let mut out = Vec::new();
    let mut x = 0x1234_5678_9abc_def0u64;
    for len in 0..400usize {
        let mut b: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let _ = s.handle(&b, 0, &mut out);
        if let Ok((mut h, _)) = InHeader::read_from_prefix(&b) {
            // Valid length, every opcode, random arguments.
            h.len = len as u32;
            for op in 0..60u32 {
                h.opcode = op;
                for node in [0u64, 1, 2, 3] {
                    h.nodeid = node;
                    assert!(h.write_to_prefix(&mut b).is_ok());
                    let _ = s.handle(&b, 0, &mut out);
                }
            }
        }
    }
}

#[test]
fn answers_the_pool_protocol() {
    let s = Server::new(Arc::new(Zero), 1 << 20);
    let mut out = Vec::new();
    assert_eq!(
        s.handle(&request(opcode::LOOKUP, 1, b"pool\0"), 0, &mut out),
        Outcome::Reply
    );
    assert_eq!(out_error(&out), 0);
    assert_eq!(out.len(), abi::OUT_HEADER_LEN + abi::ENTRY_OUT_LEN);
    s.handle(&request(opcode::LOOKUP, 1, b"nope\0"), 0, &mut out);
    assert_eq!(out_error(&out), -libc::ENOENT);
    s.handle(&request(999, 1, b""), 0, &mut out);
    assert_eq!(out_error(&out), -libc::ENOSYS);
    // A READ past the end is clipped, one at the end is empty.
    let mut a = Vec::new();
    ReadIn {
        offset: (1 << 20) - 4096,
        size: 8192,
        ..ReadIn::default()
    }
    .encode(&mut a);
    assert_eq!(
        s.handle(&request(opcode::READ, 2, &a), 0, &mut out),
        Outcome::ReplyAt(5)
    );
    assert_eq!(out.len(), abi::OUT_HEADER_LEN + 4096);
    assert!(out[abi::OUT_HEADER_LEN..].iter().all(|&b| b == 0xab));
    // A WRITE past the end is refused.
    let mut a = Vec::new();
    WriteIn {
        offset: 1 << 20,
        size: 4,
        ..WriteIn::default()
    }
    .encode(&mut a);
    a.extend_from_slice(b"abcd");
    s.handle(&request(opcode::WRITE, 2, &a), 0, &mut out);
    assert_eq!(out_error(&out), -libc::EFBIG);
    // SETATTR changing the size is refused.
    let a = SetattrIn {
        valid: fattr::SIZE,
        ..SetattrIn::default()
    };
    s.handle(&request(opcode::SETATTR, 2, a.as_bytes()), 0, &mut out);
    assert_eq!(out_error(&out), -libc::EPERM);
    assert_eq!(s.metrics.snapshot().traps, 1);
    // FORGET has no reply.
    assert_eq!(
        s.handle(
            &request(opcode::FORGET, 2, ForgetIn::default().as_bytes()),
            0,
            &mut out
        ),
        Outcome::None
    );
}

fn read_args(offset: u64, size: u32) -> Vec<u8> {
    let mut a = Vec::new();
    ReadIn {
        offset,
        size,
        ..ReadIn::default()
    }
    .encode(&mut a);
    a
}

#[test]
fn miss_replies_are_released_ahead_by_the_floor_and_calibration_reads_are_not_traps() {
    // Off: held to the modeled completion (5), as before.
    let s = Server::new(Arc::new(Zero), 1 << 20);
    let mut out = Vec::new();
    let r = request(opcode::READ, POOL_NODEID, &read_args(0, 4096));
    assert_eq!(s.handle(&r, 0, &mut out), Outcome::ReplyAt(5));
    // A floor of 3: at 5 - 3; one above the modeled time: at arrival.
    let s = Server::new(Arc::new(Zero), 1 << 20).compensating(Compensation::Fixed(3));
    assert_eq!(s.handle(&r, 0, &mut out), Outcome::ReplyAt(2));
    assert_eq!(s.metrics.snapshot().compensation_ns, 3);
    let s = Server::new(Arc::new(Zero), 1 << 20).compensating(Compensation::Fixed(9));
    assert_eq!(s.handle(&r, 1, &mut out), Outcome::ReplyAt(1));
    // The calibration file: found by name, one page of zeros, answered
    // at once, stamped, no trap; not listed.
    let s = Server::new(Arc::new(Zero), 1 << 20).compensating(Compensation::Auto);
    assert_eq!(
        s.handle(&request(opcode::LOOKUP, 1, b"calibration\0"), 0, &mut out),
        Outcome::Reply
    );
    let mut c = Cursor::new(&out[abi::OUT_HEADER_LEN..]);
    let e: EntryOut = c.read().unwrap();
    assert_eq!((e.nodeid, e.attr.size), (CALIB_NODEID, PAGE_SIZE));
    let r = request(opcode::READ, CALIB_NODEID, &read_args(0, 8192));
    assert_eq!(s.handle(&r, 7, &mut out), Outcome::Reply);
    assert_eq!(out.len(), abi::OUT_HEADER_LEN + 4096);
    assert!(out[abi::OUT_HEADER_LEN..].iter().all(|&b| b == 0));
    assert_eq!(s.calib.request_ns.load(Ordering::Relaxed), 7);
    assert_eq!(s.calib.reads.load(Ordering::Relaxed), 1);
    assert_eq!(s.metrics.snapshot().traps, 0);
    let mut a = Vec::new();
    ReadIn {
        size: 4096,
        ..ReadIn::default()
    }
    .encode(&mut a);
    s.handle(&request(opcode::READDIR, 1, &a), 0, &mut out);
    let listing = &out[abi::OUT_HEADER_LEN..];
    assert!(listing.windows(4).any(|w| w == b"pool"));
    assert!(!listing.windows(11).any(|w| w == b"calibration"));
}

#[test]
fn init_caps_readahead_and_keeps_explicit_invalidation() {
    let s = Server::new(Arc::new(Zero), 1 << 20);
    let a = InitIn {
        major: 7,
        minor: 45,
        max_readahead: 128 * 1024,
        flags: u32::MAX,
    };
    let mut out = Vec::new();
    s.handle(&request(opcode::INIT, 0, a.as_bytes()), 0, &mut out);
    assert_eq!(out.len(), abi::OUT_HEADER_LEN + InitOut::SIZE);
    let mut c = Cursor::new(&out[abi::OUT_HEADER_LEN..]);
    let init: InitOut = c.read().unwrap();
    assert_eq!((init.major, init.minor), (7, 31));
    assert_eq!(init.max_readahead, MAX_READAHEAD);
    let flags = init.flags64();
    assert_ne!(flags & init_flags::EXPLICIT_INVAL_DATA, 0);
    assert_eq!(flags & init_flags::AUTO_INVAL_DATA, 0);
    assert_eq!(flags & init_flags::WRITEBACK_CACHE, 0);
    assert_eq!(flags & init_flags::HANDLE_KILLPRIV_V2, 0);
}
