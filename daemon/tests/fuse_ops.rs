//! The metadata and space operations (LINK, MKNOD, xattrs, FALLOCATE,
//! LSEEK, COPY_FILE_RANGE, locks) over a real vhost-user socket: argument
//! decoding, the error replies to bad flags, names and ranges, and POSIX
//! locks between two VMs — a SETLKW waits off the request path, so its VM
//! keeps being served and the holder's unlock gets through.
#![allow(clippy::unwrap_used)]

mod common;

use common::{start_daemon, Guest};
use cxlfsd::abi::{
    self, opcode, CopyFileRangeIn, CreateIn, FallocateIn, FileLock, GetxattrIn, InterruptIn,
    LinkIn, LkIn, LseekIn, MknodIn, SetxattrIn,
};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

fn wire(f: impl FnOnce(&mut Vec<u8>), tail: &[&[u8]]) -> Vec<u8> {
    let mut b = Vec::new();
    f(&mut b);
    for t in tail {
        b.extend_from_slice(t);
    }
    b
}

fn z(name: &str) -> Vec<u8> {
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    n
}

/// CREATE `name` read-write in the root: (node id, fh).
fn create(g: &mut Guest, name: &str) -> (u64, u64) {
    let c = CreateIn {
        flags: libc::O_RDWR as u32,
        mode: libc::S_IFREG | 0o644,
        umask: 0o022,
        open_flags: 0,
    };
    let args = wire(|b| c.encode(b), &[&z(name)]);
    let (h, out, _) = g.call(opcode::CREATE, abi::ROOT_ID, &args);
    assert_eq!(h.error, 0, "create {name}");
    let nodeid = u64::from_le_bytes(out[0..8].try_into().unwrap());
    let fh_at = abi::ENTRY_OUT_LEN;
    let fh = u64::from_le_bytes(out[fh_at..fh_at + 8].try_into().unwrap());
    (nodeid, fh)
}

fn link(g: &mut Guest, target: u64, name: &[u8]) -> i32 {
    let mut args = wire(|b| LinkIn { oldnodeid: target }.encode(b), &[name]);
    args.push(0);
    g.call(opcode::LINK, abi::ROOT_ID, &args).0.error
}

fn setxattr(g: &mut Guest, nodeid: u64, name: &[u8], value: &[u8], claimed: u32) -> i32 {
    let s = SetxattrIn {
        size: claimed,
        flags: 0,
    };
    let args = wire(|b| s.encode(b), &[name, b"\0", value]);
    g.call(opcode::SETXATTR, nodeid, &args).0.error
}

fn fallocate(g: &mut Guest, nodeid: u64, fh: u64, offset: u64, length: u64, mode: i32) -> i32 {
    let f = FallocateIn {
        fh,
        offset,
        length,
        mode: mode as u32,
        padding: 0,
    };
    g.call(opcode::FALLOCATE, nodeid, &wire(|b| f.encode(b), &[]))
        .0
        .error
}

fn lk(fh: u64, owner: u64, typ: i32, start: u64, end: u64) -> Vec<u8> {
    let l = LkIn {
        fh,
        owner,
        lk: FileLock {
            start,
            end,
            typ: typ as u32,
            pid: 7,
        },
        lk_flags: 0,
        padding: 0,
    };
    wire(|b| l.encode(b), &[])
}

const EOF: u64 = i64::MAX as u64;

#[test]
fn operations_decode_their_arguments_and_refuse_bad_ones() {
    let share = tempfile::tempdir().unwrap();
    let socks = tempfile::tempdir().unwrap();
    let (state, threads) = start_daemon(share.path(), socks.path());
    let mut a = Guest::connect(&socks.path().join("a.sock"));
    a.init();
    let (f, fh) = create(&mut a, "f");

    // LINK: a second name for one inode; bad names are refused by name.
    assert_eq!(link(&mut a, f, b"g"), 0);
    assert_eq!(
        std::fs::metadata(share.path().join("f")).unwrap().nlink(),
        2
    );
    assert_eq!(link(&mut a, f, &[b'n'; 256]), -libc::ENAMETOOLONG);
    assert_eq!(link(&mut a, f, b"a/b"), -libc::EINVAL);
    assert_eq!(link(&mut a, f, b"g"), -libc::EEXIST);
    assert_eq!(link(&mut a, abi::ROOT_ID, b"root"), -libc::EPERM);
    assert_eq!(link(&mut a, 999_999, b"x"), -libc::EBADF);
    // A name without its NUL is a malformed request.
    let args = wire(|b| LinkIn { oldnodeid: f }.encode(b), &[b"noterm"]);
    assert_eq!(
        a.call(opcode::LINK, abi::ROOT_ID, &args).0.error,
        -libc::EINVAL
    );

    // MKNOD: a FIFO with exactly its mode; an unknown file type is EINVAL.
    let m = MknodIn {
        mode: libc::S_IFIFO | 0o640,
        rdev: 0,
        umask: 0o022,
        padding: 0,
    };
    let args = wire(|b| m.encode(b), &[&z("fifo")]);
    assert_eq!(a.call(opcode::MKNOD, abi::ROOT_ID, &args).0.error, 0);
    let st = std::fs::symlink_metadata(share.path().join("fifo")).unwrap();
    assert_eq!(st.mode() & libc::S_IFMT, libc::S_IFIFO);
    assert_eq!(st.mode() & 0o7777, 0o640);
    let bad = MknodIn {
        mode: 0o170000,
        ..m
    };
    let args = wire(|b| bad.encode(b), &[&z("bad")]);
    assert_eq!(
        a.call(opcode::MKNOD, abi::ROOT_ID, &args).0.error,
        -libc::EINVAL
    );

    // SETXATTR / GETXATTR: value round trip, size query, and the bounds.
    assert_eq!(setxattr(&mut a, f, b"user.k", b"value", 5), 0);
    let g = GetxattrIn {
        size: 0,
        padding: 0,
    };
    let args = wire(|b| g.encode(b), &[&z("user.k")]);
    let (h, out, _) = a.call(opcode::GETXATTR, f, &args);
    assert_eq!(
        (h.error, u32::from_le_bytes(out[0..4].try_into().unwrap())),
        (0, 5)
    );
    let g = GetxattrIn {
        size: 64,
        padding: 0,
    };
    let args = wire(|b| g.encode(b), &[&z("user.k")]);
    let (h, out, _) = a.call(opcode::GETXATTR, f, &args);
    assert_eq!((h.error, out.as_slice()), (0, &b"value"[..]));
    assert_eq!(setxattr(&mut a, f, b"user.k", b"v", 1 << 20), -libc::E2BIG);
    assert_eq!(setxattr(&mut a, f, b"user.k", b"short", 50), -libc::EINVAL);
    assert_eq!(setxattr(&mut a, f, b"", b"v", 1), -libc::EINVAL);
    assert_eq!(setxattr(&mut a, f, &[b'u'; 256], b"v", 1), -libc::ERANGE);
    assert_eq!(setxattr(&mut a, f, b"system.x", b"v", 1), -libc::EOPNOTSUPP);

    // FALLOCATE: unknown mode bits, ranges past off_t, a bad handle.
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(share.path().join("f"))
        .unwrap();
    w.set_len(1 << 20).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(
        fallocate(&mut a, f, fh, 0, 4096, 1 << 30),
        -libc::EOPNOTSUPP
    );
    assert_eq!(
        fallocate(&mut a, f, fh, u64::MAX - 1, 4096, 0),
        -libc::EFBIG
    );
    assert_eq!(fallocate(&mut a, f, 424_242, 0, 4096, 0), -libc::EBADF);
    assert_eq!(fallocate(&mut a, f, fh, 0, 4 << 20, 0), 0);
    assert_eq!(fallocate(&mut a, f, fh, 4096, 8192, punch), 0);

    // LSEEK: SEEK_HOLE on the host's layout; a bad whence is EINVAL.
    let seek = |g: &mut Guest, offset: u64, whence: i32| {
        let l = LseekIn {
            fh,
            offset,
            whence: whence as u32,
            padding: 0,
        };
        let (h, out, _) = g.call(opcode::LSEEK, f, &wire(|b| l.encode(b), &[]));
        (
            h.error,
            out.get(0..8)
                .map(|o| u64::from_le_bytes(o.try_into().unwrap())),
        )
    };
    assert_eq!(seek(&mut a, 0, 99).0, -libc::EINVAL);
    assert_eq!(seek(&mut a, u64::MAX, libc::SEEK_DATA).0, -libc::ENXIO);
    let (e, hole) = seek(&mut a, 0, libc::SEEK_HOLE);
    assert_eq!(e, 0);
    assert!(
        hole.unwrap() < 4 << 20,
        "the punched page is a hole: {hole:?}"
    );

    // COPY_FILE_RANGE: flags must be 0; ranges past off_t are EINVAL.
    let (g2, fh2) = create(&mut a, "copy");
    let copy = |g: &mut Guest, off_in: u64, len: u64, flags: u64| {
        let c = CopyFileRangeIn {
            fh_in: fh,
            off_in,
            nodeid_out: g2,
            fh_out: fh2,
            off_out: 0,
            len,
            flags,
        };
        let (h, out, _) = g.call(opcode::COPY_FILE_RANGE, f, &wire(|b| c.encode(b), &[]));
        (
            h.error,
            out.get(0..4)
                .map(|o| u32::from_le_bytes(o.try_into().unwrap())),
        )
    };
    assert_eq!(copy(&mut a, 0, 4096, 1).0, -libc::EINVAL);
    assert_eq!(copy(&mut a, u64::MAX - 5, 4096, 0).0, -libc::EINVAL);
    assert_eq!(copy(&mut a, 0, 100, 0), (0, Some(100)));

    // SETLK: unknown type and reversed range.
    assert_eq!(
        a.call(opcode::SETLK, f, &lk(fh, 1, 9, 0, EOF)).0.error,
        -libc::EINVAL
    );
    assert_eq!(
        a.call(opcode::SETLK, f, &lk(fh, 1, libc::F_WRLCK, 10, 5))
            .0
            .error,
        -libc::EINVAL
    );

    drop(a);
    state.request_shutdown();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn locks_conflict_between_vms_and_setlkw_waits_off_the_queue() {
    let share = tempfile::tempdir().unwrap();
    std::fs::write(share.path().join("shared"), b"x").unwrap();
    let socks = tempfile::tempdir().unwrap();
    let (state, threads) = start_daemon(share.path(), socks.path());
    let mut a = Guest::connect(&socks.path().join("a.sock"));
    let mut b = Guest::connect(&socks.path().join("b.sock"));
    a.init();
    b.init();
    let (na, nb) = (a.lookup("shared"), b.lookup("shared"));
    let (fa, fb) = (a.open(na), b.open(nb));

    // VM a holds a write lock; VM b sees it (GETLK) and cannot take one.
    assert_eq!(
        a.call(opcode::SETLK, na, &lk(fa, 1, libc::F_WRLCK, 0, EOF))
            .0
            .error,
        0
    );
    let (h, out, _) = b.call(opcode::GETLK, nb, &lk(fb, 1, libc::F_RDLCK, 0, 0));
    assert_eq!(h.error, 0);
    let seen_type = u32::from_le_bytes(out[16..20].try_into().unwrap());
    assert_eq!(seen_type, libc::F_WRLCK as u32);
    assert_eq!(
        b.call(opcode::SETLK, nb, &lk(fb, 1, libc::F_RDLCK, 0, 0))
            .0
            .error,
        -libc::EAGAIN
    );

    // SETLKW from b waits; meanwhile b's queue is served.
    let req = b.request_bytes(opcode::SETLKW, nb, &lk(fb, 1, libc::F_WRLCK, 0, EOF));
    let (wait_head, wait_rep) = b.send(&req, 4096);
    let (h, _, _) = b.call(opcode::GETATTR, nb, &[0u8; 16]);
    assert_eq!(h.error, 0, "b's queue is not blocked by its waiting SETLKW");
    // The holder's unlock releases the waiter.
    assert_eq!(
        a.call(opcode::SETLK, na, &lk(fa, 1, libc::F_UNLCK, 0, EOF))
            .0
            .error,
        0
    );
    let (id, len) = b
        .wait_used(Duration::from_secs(5))
        .expect("SETLKW answered");
    assert_eq!(id, u32::from(wait_head));
    assert_eq!(b.reply_at(wait_rep, len).0.error, 0);
    // Now a is the one refused.
    assert_eq!(
        a.call(opcode::SETLK, na, &lk(fa, 1, libc::F_RDLCK, 0, 0))
            .0
            .error,
        -libc::EAGAIN
    );

    // A SETLKW from a that b's lock blocks, interrupted: EINTR.
    let req = a.request_bytes(opcode::SETLKW, na, &lk(fa, 1, libc::F_WRLCK, 0, EOF));
    let unique = u64::from_le_bytes(req[8..16].try_into().unwrap());
    let (wait_head, wait_rep) = a.send(&req, 4096);
    let i = wire(|b| InterruptIn { unique }.encode(b), &[]);
    let ireq = a.request_bytes(opcode::INTERRUPT, 0, &i);
    a.submit_only(&ireq);
    let (id, len) = a
        .wait_used(Duration::from_secs(5))
        .expect("SETLKW interrupted");
    assert_eq!(id, u32::from(wait_head));
    assert_eq!(a.reply_at(wait_rep, len).0.error, -libc::EINTR);

    // b disconnects: its locks go with its session.
    drop(b);
    let mut took = false;
    for _ in 0..100 {
        if a.call(opcode::SETLK, na, &lk(fa, 1, libc::F_WRLCK, 0, EOF))
            .0
            .error
            == 0
        {
            took = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(took, "b's lock outlived its connection");

    drop(a);
    state.request_shutdown();
    for t in threads {
        t.join().unwrap();
    }
}
