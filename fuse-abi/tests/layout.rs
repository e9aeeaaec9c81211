//! Sizes and field offsets against `include/uapi/linux/fuse.h`, the bytes of
//! a few encodings, and encode / decode round trips.

use core::mem::offset_of;
use fuse_abi::zerocopy::{FromBytes, IntoBytes};
use fuse_abi::*;

/// Asserts `offset_of!(T, field)` for each field, in declaration order.
macro_rules! offsets {
    ($t:ty { $($f:ident: $off:expr),* $(,)? }) => {
        $(assert_eq!(offset_of!($t, $f), $off, "{}.{}", stringify!($t), stringify!($f));)*
    };
}

#[test]
fn sizes_match_the_kernel() {
    // Every wire struct's size is asserted at compile time next to its
    // kernel name (the `wire!` table); what is left is how they combine.
    // The full 7.36+ fuse_init_in is the 7.31 prefix plus the extension.
    assert_eq!(InitIn::SIZE + InitInExt::SIZE, 64);
    // The *_LEN names of the old API.
    assert_eq!(
        (
            IN_HEADER_LEN,
            OUT_HEADER_LEN,
            ATTR_LEN,
            ENTRY_OUT_LEN,
            DIRENT_LEN
        ),
        (40, 16, 88, 128, 24)
    );
    assert_eq!(
        (
            READ_IN_LEN,
            NOTIFY_STORE_OUT_LEN,
            NOTIFY_INVAL_INODE_OUT_LEN
        ),
        (40, 24, 24)
    );
    assert_eq!(REMOVEMAPPING_MAX_ENTRY, 256);
}

#[test]
fn offsets_match_the_kernel() {
    offsets!(InHeader {
        len: 0,
        opcode: 4,
        unique: 8,
        nodeid: 16,
        uid: 24,
        gid: 28,
        pid: 32,
        total_extlen: 36,
        padding: 38
    });
    offsets!(OutHeader {
        len: 0,
        error: 4,
        unique: 8
    });
    offsets!(Attr {
        ino: 0,
        size: 8,
        blocks: 16,
        atime: 24,
        mtime: 32,
        ctime: 40,
        atimensec: 48,
        mtimensec: 52,
        ctimensec: 56,
        mode: 60,
        nlink: 64,
        uid: 68,
        gid: 72,
        rdev: 76,
        blksize: 80,
        flags: 84
    });
    offsets!(EntryOut {
        nodeid: 0,
        generation: 8,
        entry_valid: 16,
        attr_valid: 24,
        entry_valid_nsec: 32,
        attr_valid_nsec: 36,
        attr: 40
    });
    offsets!(AttrOut {
        attr_valid: 0,
        attr_valid_nsec: 8,
        dummy: 12,
        attr: 16
    });
    offsets!(GetattrIn {
        getattr_flags: 0,
        dummy: 4,
        fh: 8
    });
    offsets!(SetattrIn {
        valid: 0,
        padding: 4,
        fh: 8,
        size: 16,
        lock_owner: 24,
        atime: 32,
        mtime: 40,
        ctime: 48,
        atimensec: 56,
        mtimensec: 60,
        ctimensec: 64,
        mode: 68,
        unused4: 72,
        uid: 76,
        gid: 80,
        unused5: 84
    });
    offsets!(ReadIn {
        fh: 0,
        offset: 8,
        size: 16,
        read_flags: 20,
        lock_owner: 24,
        flags: 32,
        padding: 36
    });
    offsets!(WriteIn {
        fh: 0,
        offset: 8,
        size: 16,
        write_flags: 20,
        lock_owner: 24,
        flags: 32,
        padding: 36
    });
    offsets!(InitIn {
        major: 0,
        minor: 4,
        max_readahead: 8,
        flags: 12
    });
    offsets!(InitInExt {
        flags2: 0,
        unused: 4
    });
    offsets!(InitOut {
        major: 0,
        minor: 4,
        max_readahead: 8,
        flags: 12,
        max_background: 16,
        congestion_threshold: 18,
        max_write: 20,
        time_gran: 24,
        max_pages: 28,
        map_alignment: 30,
        flags2: 32,
        max_stack_depth: 36,
        unused: 40
    });
    offsets!(Kstatfs {
        blocks: 0,
        bfree: 8,
        bavail: 16,
        files: 24,
        ffree: 32,
        bsize: 40,
        namelen: 44,
        frsize: 48,
        padding: 52,
        spare: 56
    });
    offsets!(OpenIn {
        flags: 0,
        open_flags: 4
    });
    offsets!(OpenOut {
        fh: 0,
        open_flags: 8,
        padding: 12
    });
    offsets!(CreateIn {
        flags: 0,
        mode: 4,
        umask: 8,
        open_flags: 12
    });
    offsets!(MknodIn {
        mode: 0,
        rdev: 4,
        umask: 8,
        padding: 12
    });
    offsets!(Rename2In {
        newdir: 0,
        flags: 8,
        padding: 12
    });
    offsets!(ReleaseIn {
        fh: 0,
        flags: 8,
        release_flags: 12,
        lock_owner: 16
    });
    offsets!(FlushIn {
        fh: 0,
        unused: 8,
        padding: 12,
        lock_owner: 16
    });
    offsets!(FsyncIn {
        fh: 0,
        fsync_flags: 8,
        padding: 12
    });
    offsets!(FileLock {
        start: 0,
        end: 8,
        typ: 16,
        pid: 20
    });
    offsets!(LkIn {
        fh: 0,
        owner: 8,
        lk: 16,
        lk_flags: 40,
        padding: 44
    });
    offsets!(BatchForgetIn { count: 0, dummy: 4 });
    offsets!(ForgetOne {
        nodeid: 0,
        nlookup: 8
    });
    offsets!(Dirent {
        ino: 0,
        off: 8,
        namelen: 16,
        typ: 20
    });
    offsets!(DirentPlus {
        entry_out: 0,
        dirent: 128
    });
    offsets!(IoctlIn {
        fh: 0,
        flags: 8,
        cmd: 12,
        arg: 16,
        in_size: 24,
        out_size: 28
    });
    offsets!(IoctlOut {
        result: 0,
        flags: 4,
        in_iovs: 8,
        out_iovs: 12
    });
    offsets!(PollIn {
        fh: 0,
        kh: 8,
        flags: 16,
        events: 20
    });
    offsets!(FallocateIn {
        fh: 0,
        offset: 8,
        length: 16,
        mode: 24,
        padding: 28
    });
    offsets!(LseekIn {
        fh: 0,
        offset: 8,
        whence: 16,
        padding: 20
    });
    offsets!(CopyFileRangeIn {
        fh_in: 0,
        off_in: 8,
        nodeid_out: 16,
        fh_out: 24,
        off_out: 32,
        len: 40,
        flags: 48
    });
    offsets!(SetupMappingIn {
        fh: 0,
        foffset: 8,
        len: 16,
        flags: 24,
        moffset: 32
    });
    offsets!(RemoveMappingIn { count: 0 });
    offsets!(RemoveMappingOne { moffset: 0, len: 8 });
    offsets!(NotifyStoreOut {
        nodeid: 0,
        offset: 8,
        size: 16,
        padding: 20
    });
    offsets!(NotifyInvalInodeOut {
        ino: 0,
        off: 8,
        len: 16
    });
    offsets!(NotifyInvalEntryOut {
        parent: 0,
        namelen: 8,
        padding: 12
    });
    offsets!(NotifyDeleteOut {
        parent: 0,
        child: 8,
        namelen: 16,
        padding: 20
    });
    offsets!(NotifyRetrieveOut {
        notify_unique: 0,
        nodeid: 8,
        offset: 16,
        size: 24,
        padding: 28
    });
    offsets!(NotifyRetrieveIn {
        dummy1: 0,
        offset: 8,
        size: 16,
        dummy2: 20,
        dummy3: 24,
        dummy4: 32
    });
}

#[test]
fn bytes_are_little_endian_in_kernel_order() {
    let h = OutHeader {
        len: 0x0102_0304,
        error: -2,
        unique: 0x1122_3344_5566_7788,
    };
    assert_eq!(
        h.as_bytes(),
        [4, 3, 2, 1, 0xfe, 0xff, 0xff, 0xff, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]
    );
    let r = RemoveMappingOne {
        moffset: 1 << 21,
        len: 2,
    };
    assert_eq!(
        r.as_bytes(),
        [0, 0, 0x20, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn header_round_trip() {
    let h = InHeader {
        len: 40,
        opcode: opcode::LOOKUP,
        unique: 7,
        nodeid: 1,
        uid: 2,
        gid: 3,
        pid: 4,
        total_extlen: 5,
        padding: 0,
    };
    let mut b = Vec::new();
    h.encode(&mut b);
    assert_eq!(b.len(), IN_HEADER_LEN);
    assert_eq!(InHeader::parse(&mut Cursor::new(&b)).unwrap(), h);
    assert_eq!(InHeader::decode(&mut Cursor::new(&b)).unwrap(), h);
    assert!(matches!(
        InHeader::parse(&mut Cursor::new(&b[..39])),
        Err(DecodeError::Truncated {
            at: 0,
            need: 40,
            have: 39
        })
    ));
}

#[test]
fn reply_and_out_header() {
    let r = reply(9, -2, &[b"ab", b"", b"cde"]).unwrap();
    assert_eq!(r.len(), OUT_HEADER_LEN + 5);
    let mut c = Cursor::new(&r);
    let h = OutHeader::parse(&mut c).unwrap();
    assert_eq!((h.len, h.error, h.unique), (21, -2, 9));
    assert_eq!(c.rest(), b"abcde");
    assert_eq!(
        OutHeader::for_payload(1, 0, u32::MAX as usize),
        Err(EncodeError::TooLong {
            len: u32::MAX as usize + OUT_HEADER_LEN
        })
    );
    assert!(OutHeader::for_payload(1, 0, usize::MAX).is_err());
    let mut msg = vec![0u8; 20];
    assert!(h.write_over(&mut msg));
    assert_eq!(&msg[..OUT_HEADER_LEN], h.as_bytes());
    assert!(!h.write_over(&mut [0u8; 15]));
}

#[test]
fn init_in_with_and_without_ext() {
    let base = InitIn {
        major: 7,
        minor: 31,
        max_readahead: 4096,
        flags: 0x1234,
    };
    let r = InitIn::parse(&mut Cursor::new(base.as_bytes())).unwrap();
    assert_eq!(
        (r.major, r.minor, r.max_readahead, r.flags),
        (7, 31, 4096, 0x1234)
    );
    // flags2 without INIT_EXT is ignored.
    let mut b = base.as_bytes().to_vec();
    InitInExt {
        flags2: 2,
        ..InitInExt::default()
    }
    .encode(&mut b);
    assert_eq!(InitIn::parse(&mut Cursor::new(&b)).unwrap().flags, 0x1234);
    // With INIT_EXT it is bits 32..64, whether the extension is whole or cut short.
    let ext = InitIn {
        flags: 0x1234 | init_flags::INIT_EXT as u32,
        ..base
    };
    b[..InitIn::SIZE].copy_from_slice(ext.as_bytes());
    let want = 0x1234 | init_flags::INIT_EXT | init_flags::HAS_INODE_DAX;
    assert_eq!(InitIn::parse(&mut Cursor::new(&b)).unwrap().flags, want);
    assert_eq!(
        InitIn::parse(&mut Cursor::new(&b[..20])).unwrap().flags,
        want
    );
    assert_eq!(
        InitIn::parse(&mut Cursor::new(&b[..16])).unwrap().flags,
        0x1234 | init_flags::INIT_EXT
    );
    assert!(InitIn::parse(&mut Cursor::new(&b[..15])).is_err());
}

#[test]
fn init_out_flags_split_in_two_words() {
    let mut o = InitOut::default();
    o.set_flags64(init_flags::MAP_ALIGNMENT | init_flags::HAS_INODE_DAX);
    assert_eq!((o.flags, o.flags2), (1 << 26, 1 << 1));
    assert_eq!(
        o.flags64(),
        init_flags::MAP_ALIGNMENT | init_flags::HAS_INODE_DAX
    );
    let mut b = Vec::new();
    o.encode(&mut b);
    assert_eq!(b.len(), InitOut::SIZE);
    assert_eq!(InitOut::read_from_bytes(&b).unwrap(), o);
}

#[test]
fn old_encoders_have_kernel_sizes() {
    let mut b = Vec::new();
    Attr::default().encode(&mut b);
    assert_eq!(b.len(), ATTR_LEN);
    b.clear();
    EntryOut::default().encode(&mut b);
    assert_eq!(b.len(), ENTRY_OUT_LEN);
    b.clear();
    encode_attr_out(1, 2, &Attr::default(), &mut b);
    assert_eq!(b.len(), AttrOut::SIZE);
    assert_eq!(AttrOut::read_from_bytes(&b).unwrap().attr_valid_nsec, 2);
    b.clear();
    encode_open_out(3, fopen::KEEP_CACHE, &mut b);
    assert_eq!(
        OpenOut::read_from_bytes(&b).unwrap(),
        OpenOut {
            fh: 3,
            open_flags: fopen::KEEP_CACHE,
            padding: 0
        }
    );
    b.clear();
    encode_write_out(7, &mut b);
    assert_eq!(WriteOut::read_from_bytes(&b).unwrap().size, 7);
    b.clear();
    encode_dirent(1, 2, 3, b"abcde", &mut b);
    assert_eq!(b.len(), 32);
    let mut c = Cursor::new(&b);
    let d: Dirent = c.read().unwrap();
    assert_eq!((d.ino, d.off, d.namelen, d.typ), (1, 2, 5, 3));
    assert_eq!(c.rest(), b"abcde\0\0\0");
    assert_eq!(dirent_size(8), 32);
    assert_eq!(dirent_size(9), 40);
    assert_eq!(dirent_size(usize::MAX) % 8, 0);
    b.clear();
    let e = EntryOut {
        nodeid: 5,
        attr: Attr {
            ino: 77,
            ..Attr::default()
        },
        ..EntryOut::default()
    };
    encode_direntplus(&e, 9, 4, b"x", &mut b).unwrap();
    assert_eq!(b.len(), direntplus_size(1));
    assert_eq!(b.len(), 160);
    let p = DirentPlus::read_from_prefix(&b).unwrap().0;
    assert_eq!((p.entry_out, p.dirent.ino, p.dirent.namelen), (e, 77, 1));
    b.clear();
    encode_notify_store(2, 4096, 4096, &mut b).unwrap();
    assert_eq!(b.len(), OUT_HEADER_LEN + NOTIFY_STORE_OUT_LEN);
    let h = OutHeader::parse(&mut Cursor::new(&b)).unwrap();
    assert_eq!(
        (h.len, h.error, h.unique),
        (16 + 24 + 4096, notify::STORE, 0)
    );
    b.clear();
    assert!(encode_notify_store(2, 0, u32::MAX, &mut b).is_err());
    assert!(b.is_empty());
    encode_notify_inval_inode(2, 0, -1, &mut b);
    assert_eq!(b.len(), OUT_HEADER_LEN + NOTIFY_INVAL_INODE_OUT_LEN);
    let mut c = Cursor::new(&b);
    let h: OutHeader = c.read().unwrap();
    let n: NotifyInvalInodeOut = c.read().unwrap();
    assert_eq!((h.len, h.error), (40, notify::INVAL_INODE));
    assert_eq!((n.ino, n.off, n.len), (2, 0, -1));
}

#[test]
fn read_in_round_trip() {
    let r = ReadIn {
        fh: 1,
        offset: 2,
        size: 3,
        read_flags: 4,
        lock_owner: 5,
        flags: 6,
        padding: 0,
    };
    let mut b = Vec::new();
    r.encode(&mut b);
    assert_eq!(b.len(), READ_IN_LEN);
    assert_eq!(ReadIn::parse(&mut Cursor::new(&b)).unwrap(), r);
    assert!(ReadIn::parse(&mut Cursor::new(&b[..39])).is_err());
}

#[test]
fn write_in_with_data() {
    let mut b = Vec::new();
    WriteIn {
        offset: 8,
        size: 3,
        ..WriteIn::default()
    }
    .encode(&mut b);
    b.extend_from_slice(b"abcd");
    let mut c = Cursor::new(&b);
    let (w, data) = WriteIn::parse_with_data(&mut c).unwrap();
    assert_eq!((w.offset, data), (8, &b"abc"[..]));
    assert_eq!(c.rest(), b"d");
    // Data shorter than `size`: an error, and the cursor does not move.
    let mut c = Cursor::new(&b[..42]);
    assert!(WriteIn::parse_with_data(&mut c).is_err());
    assert_eq!(c.position(), 0);
}

#[test]
fn removemapping_entries_are_bounded() {
    let mut b = Vec::new();
    RemoveMappingIn { count: 2 }.encode(&mut b);
    for i in 0..2u64 {
        RemoveMappingOne {
            moffset: i << 21,
            len: 1 << 21,
        }
        .encode(&mut b);
    }
    let (r, e) = RemoveMappingIn::parse_with_entries(&mut Cursor::new(&b)).unwrap();
    assert_eq!((r.count, e.len(), e[1].moffset), (2, 2, 1 << 21));
    assert!(RemoveMappingIn::parse_with_entries(&mut Cursor::new(&b[..35])).is_err());
    let too_many = RemoveMappingIn {
        count: REMOVEMAPPING_MAX_ENTRY + 1,
    };
    assert_eq!(
        RemoveMappingIn::parse_with_entries(&mut Cursor::new(too_many.as_bytes())),
        Err(DecodeError::TooMany {
            what: "fuse_removemapping_one",
            count: 257,
            max: 256
        })
    );
}

#[test]
fn opcode_names() {
    assert_eq!(opcode::name(opcode::SETUPMAPPING), "setupmapping");
    assert_eq!(opcode::name(opcode::READ), "read");
    assert_eq!(opcode::name(opcode::MAX), "unknown");
    assert_eq!(opcode::name(7), "unknown");
}

#[test]
fn uring_structs_match_the_kernel() {
    // include/uapi/linux/fuse.h (7.42): fuse_uring_ent_in_out,
    // fuse_uring_req_header, fuse_uring_cmd_req.
    offsets!(UringEntInOut {
        flags: 0,
        commit_id: 8,
        payload_sz: 16,
        padding: 20,
        reserved: 24
    });
    offsets!(UringReqHeader {
        in_out: 0,
        op_in: 128,
        ring_ent_in_out: 256
    });
    offsets!(UringCmdReq {
        flags: 0,
        commit_id: 8,
        qid: 16,
        padding: 18
    });
    assert_eq!((uring_cmd::REGISTER, uring_cmd::COMMIT_AND_FETCH), (1, 2));
    assert_eq!(init_flags::OVER_IO_URING, 1 << 41);
    let cmd = UringCmdReq {
        commit_id: 0x0102_0304_0506_0708,
        qid: 3,
        ..UringCmdReq::default()
    };
    let area = cmd.command_area();
    assert_eq!(&area[8..16], &0x0102_0304_0506_0708u64.to_ne_bytes());
    assert_eq!(&area[16..18], &3u16.to_ne_bytes());
    assert!(area[24..].iter().all(|&b| b == 0));
}
