//! The seed corpora: valid (and a few typical invalid) inputs for each
//! target, built with the crates' own encoders, as the tests build them.
//! `cargo run -p cxlfs-fuzz-harness --bin gen-seeds` writes them under
//! `fuzz/corpus/<target>/`; `tests/seeds.rs` checks the committed files are
//! these.

use crate::chain::{self, DATA};
use crate::fuse::{init_args, request, F_FH, F_NODEID, OUT_CAP_MAX, ROOT_FH};
use crate::hint;
use cxlfs_api::control::{RangeOp, RangeSpec, Request, RequestEnvelope};
use cxlfs_hint::{HintOp, HintReply, HintRequest, CXLFS_IOC_HINT, HINT_SIZE};
use cxlfsd::abi::{self, fattr as setattr_valid, opcode};
use zerocopy::IntoBytes;

/// The seeds of target `name`: (file name, bytes).
///
/// # Panics
/// On an unknown target.
pub fn seeds(name: &str) -> Vec<(String, Vec<u8>)> {
    match name {
        "fuse_request" => fuse(),
        "control_line" => control(),
        "hint_ioctl" => hint_seeds(),
        "chain_walk" => chain_seeds(),
        _ => panic!("unknown fuzz target {name}"),
    }
}

fn fuse_input(out_cap: u32, req: Vec<u8>) -> Vec<u8> {
    let mut b = out_cap.to_le_bytes().to_vec();
    b.extend(req);
    b
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// One FUSE seed before framing: (file name, reply room, request).
type FuseSeed = (&'static str, u32, Vec<u8>);

/// The reply room most FUSE seeds give.
const CAP: u32 = 4096;

/// The fuse_request seeds, one request family after another.
fn fuse() -> Vec<(String, Vec<u8>)> {
    [
        fuse_session(),
        fuse_lookup_and_attrs(),
        fuse_file_io(),
        fuse_directories(),
        fuse_statfs_forget_interrupt(),
        fuse_ioctl_and_dax(),
        fuse_links_and_nodes(),
        fuse_xattrs(),
        fuse_ranges(),
        fuse_locks(),
        fuse_misc(),
    ]
    .into_iter()
    .flatten()
    .map(|(n, cap, r)| (n.to_string(), fuse_input(cap, r)))
    .collect()
}

fn read_args(fh: u64, offset: u64, size: u32) -> Vec<u8> {
    abi::ReadIn {
        fh,
        offset,
        size,
        ..Default::default()
    }
    .as_bytes()
    .to_vec()
}

fn setattr_args(valid: u32, size: u64, mode: u32) -> Vec<u8> {
    abi::SetattrIn {
        valid,
        size,
        mode,
        fh: F_FH,
        ..Default::default()
    }
    .as_bytes()
    .to_vec()
}

fn create_in() -> abi::CreateIn {
    abi::CreateIn {
        flags: (libc::O_RDWR | libc::O_CREAT) as u32,
        mode: 0o100644,
        umask: 0o022,
        ..Default::default()
    }
}

fn fsync_in() -> abi::FsyncIn {
    abi::FsyncIn {
        fh: F_FH,
        fsync_flags: 1,
        ..Default::default()
    }
}

/// INIT (whole and cut short) and DESTROY.
fn fuse_session() -> Vec<FuseSeed> {
    let c = CAP;
    vec![
        ("init", c, request(opcode::INIT, 1, 0, &init_args())),
        (
            "init_short",
            c,
            request(opcode::INIT, 1, 0, &init_args()[..16]),
        ),
        ("destroy", c, request(opcode::DESTROY, 9, 0, &[])),
    ]
}

/// LOOKUP, GETATTR and SETATTR.
fn fuse_lookup_and_attrs() -> Vec<FuseSeed> {
    let root = abi::ROOT_ID;
    let getattr_fh = abi::GetattrIn {
        getattr_flags: abi::GETATTR_FH,
        fh: F_FH,
        ..Default::default()
    };
    let c = CAP;
    vec![
        ("lookup_f", c, request(opcode::LOOKUP, 9, root, b"f\0")),
        (
            "lookup_dotdot",
            c,
            request(opcode::LOOKUP, 9, root, b"..\0"),
        ),
        ("lookup_d", c, request(opcode::LOOKUP, 9, root, b"d\0")),
        ("getattr", c, request(opcode::GETATTR, 9, F_NODEID, &[])),
        (
            "getattr_fh",
            c,
            request(opcode::GETATTR, 9, F_NODEID, getattr_fh.as_bytes()),
        ),
        (
            "setattr_mode",
            c,
            request(
                opcode::SETATTR,
                9,
                F_NODEID,
                &setattr_args(setattr_valid::MODE, 0, 0o600),
            ),
        ),
        (
            "setattr_size",
            c,
            request(
                opcode::SETATTR,
                9,
                F_NODEID,
                &setattr_args(setattr_valid::SIZE | setattr_valid::FH, 4096, 0),
            ),
        ),
        (
            "setattr_times",
            c,
            request(
                opcode::SETATTR,
                9,
                F_NODEID,
                &setattr_args(setattr_valid::ATIME_NOW | setattr_valid::MTIME_NOW, 0, 0),
            ),
        ),
    ]
}

/// OPEN, CREATE, READ, WRITE, RELEASE, FLUSH and FSYNC on a file.
fn fuse_file_io() -> Vec<FuseSeed> {
    let root = abi::ROOT_ID;
    let write_in = abi::WriteIn {
        fh: F_FH,
        offset: 100,
        size: 8,
        ..Default::default()
    };
    let release = abi::ReleaseIn {
        fh: F_FH,
        ..Default::default()
    };
    let open_ro = abi::OpenIn::default();
    let c = CAP;
    vec![
        (
            "open",
            c,
            request(opcode::OPEN, 9, F_NODEID, open_ro.as_bytes()),
        ),
        (
            "create",
            c,
            request(
                opcode::CREATE,
                9,
                root,
                &cat(&[create_in().as_bytes(), b"new\0"]),
            ),
        ),
        (
            "read",
            OUT_CAP_MAX,
            request(opcode::READ, 9, F_NODEID, &read_args(F_FH, 0, 64 * 1024)),
        ),
        (
            "read_short_room",
            100,
            request(opcode::READ, 9, F_NODEID, &read_args(F_FH, 10, 4096)),
        ),
        (
            "write",
            c,
            request(
                opcode::WRITE,
                9,
                F_NODEID,
                &cat(&[write_in.as_bytes(), b"abcdefgh"]),
            ),
        ),
        (
            "release",
            c,
            request(opcode::RELEASE, 9, F_NODEID, release.as_bytes()),
        ),
        (
            "flush",
            c,
            request(
                opcode::FLUSH,
                9,
                F_NODEID,
                &[F_FH.as_bytes(), &[0u8; 16]].concat(),
            ),
        ),
        (
            "fsync",
            c,
            request(opcode::FSYNC, 9, F_NODEID, fsync_in().as_bytes()),
        ),
    ]
}

/// Directory handles and reads, and the namespace changes: MKDIR,
/// SYMLINK, READLINK, UNLINK, RMDIR and RENAME(2).
fn fuse_directories() -> Vec<FuseSeed> {
    let root = abi::ROOT_ID;
    let mkdir_in = abi::MkdirIn {
        mode: 0o755,
        umask: 0o022,
    };
    let rename2 = abi::Rename2In {
        newdir: root,
        flags: 0,
        ..Default::default()
    };
    let releasedir = abi::ReleaseIn {
        fh: ROOT_FH,
        ..Default::default()
    };
    let c = CAP;
    vec![
        ("opendir", c, request(opcode::OPENDIR, 9, root, &[0u8; 8])),
        (
            "readdir",
            c,
            request(opcode::READDIR, 9, root, &read_args(ROOT_FH, 0, 4096)),
        ),
        (
            "readdirplus",
            c,
            request(opcode::READDIRPLUS, 9, root, &read_args(ROOT_FH, 0, 4096)),
        ),
        (
            "releasedir",
            c,
            request(opcode::RELEASEDIR, 9, root, releasedir.as_bytes()),
        ),
        (
            "fsyncdir",
            c,
            request(opcode::FSYNCDIR, 9, root, fsync_in().as_bytes()),
        ),
        (
            "mkdir",
            c,
            request(opcode::MKDIR, 9, root, &cat(&[mkdir_in.as_bytes(), b"e\0"])),
        ),
        ("symlink", c, request(opcode::SYMLINK, 9, root, b"s\0f\0")),
        ("readlink", c, request(opcode::READLINK, 9, F_NODEID, &[])),
        ("unlink", c, request(opcode::UNLINK, 9, root, b"f\0")),
        ("rmdir", c, request(opcode::RMDIR, 9, root, b"d\0")),
        (
            "rename",
            c,
            request(opcode::RENAME, 9, root, &cat(&[root.as_bytes(), b"f\0h\0"])),
        ),
        (
            "rename2",
            c,
            request(
                opcode::RENAME2,
                9,
                root,
                &cat(&[rename2.as_bytes(), b"f\0h2\0"]),
            ),
        ),
    ]
}

/// STATFS, and the requests that get no reply: FORGET, BATCH_FORGET and
/// INTERRUPT.
fn fuse_statfs_forget_interrupt() -> Vec<FuseSeed> {
    let root = abi::ROOT_ID;
    let batch = abi::BatchForgetIn {
        count: 2,
        ..Default::default()
    };
    let forget_one = abi::ForgetOne {
        nodeid: F_NODEID,
        nlookup: 1,
    };
    let c = CAP;
    vec![
        ("statfs", c, request(opcode::STATFS, 9, root, &[])),
        (
            "forget",
            c,
            request(opcode::FORGET, 9, F_NODEID, &1u64.to_le_bytes()),
        ),
        (
            "batch_forget",
            c,
            request(
                opcode::BATCH_FORGET,
                9,
                0,
                &cat(&[
                    batch.as_bytes(),
                    forget_one.as_bytes(),
                    forget_one.as_bytes(),
                ]),
            ),
        ),
        (
            "interrupt",
            c,
            request(opcode::INTERRUPT, 9, 0, &9u64.to_le_bytes()),
        ),
    ]
}

/// The hint IOCTL and the DAX window's SETUPMAPPING and REMOVEMAPPING.
fn fuse_ioctl_and_dax() -> Vec<FuseSeed> {
    let ioctl_in = abi::IoctlIn {
        fh: F_FH,
        cmd: CXLFS_IOC_HINT,
        in_size: HINT_SIZE as u32,
        out_size: HINT_SIZE as u32,
        ..Default::default()
    };
    let hint_bytes =
        cxlfs_hint::encode(&HintRequest::new(HintOp::QueryStats), &HintReply::default());
    let setup = abi::SetupMappingIn {
        fh: F_FH,
        len: 2 << 20,
        ..Default::default()
    };
    let remove = abi::RemoveMappingIn { count: 1 };
    let remove_one = abi::RemoveMappingOne {
        moffset: 0,
        len: 2 << 20,
    };
    let c = CAP;
    vec![
        (
            "ioctl",
            c,
            request(
                opcode::IOCTL,
                9,
                F_NODEID,
                &hint::ioctl_args(&ioctl_in, &hint_bytes),
            ),
        ),
        (
            "setupmapping",
            c,
            request(opcode::SETUPMAPPING, 9, F_NODEID, setup.as_bytes()),
        ),
        (
            "removemapping",
            c,
            request(
                opcode::REMOVEMAPPING,
                9,
                0,
                &cat(&[remove.as_bytes(), remove_one.as_bytes()]),
            ),
        ),
    ]
}

/// LINK, MKNOD (a FIFO) and TMPFILE.
fn fuse_links_and_nodes() -> Vec<FuseSeed> {
    let root = abi::ROOT_ID;
    let mknod_in = abi::MknodIn {
        mode: libc::S_IFIFO | 0o644,
        umask: 0o022,
        ..Default::default()
    };
    let c = CAP;
    vec![
        (
            "link",
            c,
            request(
                opcode::LINK,
                9,
                root,
                &cat(&[
                    abi::LinkIn {
                        oldnodeid: F_NODEID,
                    }
                    .as_bytes(),
                    b"hard\0",
                ]),
            ),
        ),
        (
            "mknod_fifo",
            c,
            request(
                opcode::MKNOD,
                9,
                root,
                &cat(&[mknod_in.as_bytes(), b"fifo2\0"]),
            ),
        ),
        (
            "tmpfile",
            c,
            request(
                opcode::TMPFILE,
                9,
                root,
                &cat(&[create_in().as_bytes(), b"/\0"]),
            ),
        ),
    ]
}

/// SETXATTR, GETXATTR, LISTXATTR and REMOVEXATTR.
fn fuse_xattrs() -> Vec<FuseSeed> {
    let setxattr_in = abi::SetxattrIn { size: 2, flags: 0 };
    let getxattr_in = abi::GetxattrIn {
        size: 64,
        padding: 0,
    };
    let c = CAP;
    vec![
        (
            "setxattr",
            c,
            request(
                opcode::SETXATTR,
                9,
                F_NODEID,
                &cat(&[setxattr_in.as_bytes(), b"user.k\0vv"]),
            ),
        ),
        (
            "getxattr",
            c,
            request(
                opcode::GETXATTR,
                9,
                F_NODEID,
                &cat(&[getxattr_in.as_bytes(), b"security.k\0"]),
            ),
        ),
        (
            "listxattr",
            c,
            request(opcode::LISTXATTR, 9, F_NODEID, getxattr_in.as_bytes()),
        ),
        (
            "removexattr",
            c,
            request(opcode::REMOVEXATTR, 9, F_NODEID, b"user.k\0"),
        ),
    ]
}

/// The byte-range requests: FALLOCATE (punch a hole), LSEEK (to a hole)
/// and COPY_FILE_RANGE.
fn fuse_ranges() -> Vec<FuseSeed> {
    let fallocate_in = abi::FallocateIn {
        fh: F_FH,
        offset: 0,
        length: 4096,
        mode: (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32,
        padding: 0,
    };
    let lseek_in = abi::LseekIn {
        fh: F_FH,
        offset: 0,
        whence: libc::SEEK_HOLE as u32,
        padding: 0,
    };
    let copy_in = abi::CopyFileRangeIn {
        fh_in: F_FH,
        off_in: 0,
        nodeid_out: F_NODEID,
        fh_out: F_FH,
        off_out: 8192,
        len: 4096,
        flags: 0,
    };
    let c = CAP;
    vec![
        (
            "fallocate_punch",
            c,
            request(opcode::FALLOCATE, 9, F_NODEID, fallocate_in.as_bytes()),
        ),
        (
            "lseek_hole",
            c,
            request(opcode::LSEEK, 9, F_NODEID, lseek_in.as_bytes()),
        ),
        (
            "copy_file_range",
            c,
            request(opcode::COPY_FILE_RANGE, 9, F_NODEID, copy_in.as_bytes()),
        ),
    ]
}

/// The POSIX lock requests: GETLK, SETLK and SETLKW.
fn fuse_locks() -> Vec<FuseSeed> {
    let lk_in = abi::LkIn {
        fh: F_FH,
        owner: 1,
        lk: abi::FileLock {
            start: 0,
            end: i64::MAX as u64,
            typ: libc::F_WRLCK as u32,
            pid: 1,
        },
        ..Default::default()
    };
    let c = CAP;
    vec![
        (
            "getlk",
            c,
            request(opcode::GETLK, 9, F_NODEID, lk_in.as_bytes()),
        ),
        (
            "setlk",
            c,
            request(opcode::SETLK, 9, F_NODEID, lk_in.as_bytes()),
        ),
        (
            "setlkw",
            c,
            request(opcode::SETLKW, 9, F_NODEID, lk_in.as_bytes()),
        ),
    ]
}

/// SYNCFS and ACCESS, an unknown opcode, and a request with no room for
/// its reply.
fn fuse_misc() -> Vec<FuseSeed> {
    let root = abi::ROOT_ID;
    let c = CAP;
    vec![
        ("syncfs", c, request(opcode::SYNCFS, 9, root, &[0u8; 8])),
        (
            "access",
            c,
            request(opcode::ACCESS, 9, F_NODEID, &[4, 0, 0, 0, 0, 0, 0, 0]),
        ),
        ("unknown_op", c, request(200, 9, root, &[])),
        ("no_room", 8, request(opcode::STATFS, 9, root, &[])),
    ]
}

fn control() -> Vec<(String, Vec<u8>)> {
    let file = RangeSpec::file("f", Some(4096), Some(8192));
    let mut params = serde_json::Map::new();
    params.insert("ghost_fraction".into(), serde_json::json!(0.5));
    let reqs = vec![
        ("prefetch", Request::range(RangeOp::Prefetch, file.clone())),
        (
            "pin",
            Request::range(RangeOp::Pin, RangeSpec::file("f", None, None)),
        ),
        ("unpin", Request::range(RangeOp::Unpin, file.clone())),
        (
            "evict_pool",
            Request::range(RangeOp::Evict, RangeSpec::pool(0, Some(1 << 21))),
        ),
        (
            "set_policy",
            Request::SetPolicy {
                name: "lru".into(),
                params: Default::default(),
            },
        ),
        (
            "set_policy_params",
            Request::SetPolicy {
                name: "s3fifo".into(),
                params,
            },
        ),
        (
            "set_prefetch",
            Request::SetPrefetch {
                degree: 4,
                stride: Some(1),
            },
        ),
        ("set_cxl_ratio", Request::SetCxlRatio { percent: 50 }),
        (
            "query_stats",
            Request::QueryStats {
                vm: Some("vm0".into()),
            },
        ),
        ("reset_stats", Request::ResetStats {}),
        ("get_config", Request::GetConfig {}),
    ];
    let mut out: Vec<(String, Vec<u8>)> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, (n, r))| {
            let line = RequestEnvelope::new(i as u64, r).to_line();
            (n.to_string(), line.trim_end().as_bytes().to_vec())
        })
        .collect();
    for (n, line) in [
        ("bad_json", &b"{\"v\":1,"[..]),
        ("not_object", b"[1,2]"),
        (
            "bad_version",
            b"{\"v\":2,\"id\":\"x\",\"cmd\":\"get_config\"}",
        ),
        (
            "unknown_cmd",
            b"{\"v\":1,\"id\":null,\"cmd\":\"format_disk\"}",
        ),
        (
            "extra_field",
            b"{\"v\":1,\"id\":1.5,\"cmd\":\"pin\",\"file\":\"f\",\"bogus\":1}",
        ),
    ] {
        out.push((n.to_string(), line.to_vec()));
    }
    out
}

fn hint_seeds() -> Vec<(String, Vec<u8>)> {
    let with = |op: HintOp, f: &dyn Fn(&mut HintRequest)| {
        let mut r = HintRequest::new(op);
        f(&mut r);
        hint::input(&cxlfs_hint::encode(&r, &HintReply::default()))
    };
    let range = |offset: u64, length: u64| {
        move |r: &mut HintRequest| {
            r.offset = offset;
            r.length = length;
        }
    };
    let mut out = vec![
        ("prefetch", with(HintOp::Prefetch, &range(0, 16384))),
        ("pin", with(HintOp::Pin, &range(4096, 8192))),
        ("pin_all", with(HintOp::Pin, &range(0, 0))),
        ("unpin", with(HintOp::Unpin, &range(0, 0))),
        ("evict", with(HintOp::Evict, &range(8192, 4096))),
        (
            "set_policy",
            with(HintOp::SetPolicy, &|r| {
                r.policy = cxlfs_hint::policy_field("clock").unwrap_or_default()
            }),
        ),
        (
            "set_prefetch",
            with(HintOp::SetPrefetch, &|r| {
                r.degree = 2;
                r.stride = 1;
            }),
        ),
        (
            "set_cxl_ratio",
            with(HintOp::SetCxlRatio, &|r| r.percent = 25),
        ),
        ("query_stats", with(HintOp::QueryStats, &|_| {})),
        ("reset_stats", with(HintOp::ResetStats, &|_| {})),
        (
            "bad_version",
            with(HintOp::QueryStats, &|r| r.abi_version = 99),
        ),
    ];
    // The root's handle (selector bit 3): a directory.
    let mut dir = with(HintOp::Pin, &range(0, 0));
    dir[0] = 8;
    out.push(("pin_on_dir", dir));
    // Another ioctl (selector bit 0, FS_IOC_GETFLAGS).
    let mut other = with(HintOp::QueryStats, &|_| {});
    other[0] = 1;
    other[1..5].copy_from_slice(&0x8008_6601u32.to_le_bytes());
    out.push(("other_ioctl", other));
    out.push(("short", hint::input(&[1, 0, 0, 0, 8, 0, 0, 0])));
    out.into_iter().map(|(n, b)| (n.to_string(), b)).collect()
}

fn chain_seeds() -> Vec<(String, Vec<u8>)> {
    const NEXT: u16 = 1;
    const WRITE: u16 = 2;
    const INDIRECT: u16 = 4;
    // A FUSE header as the request's first bytes, so that the data is
    // something a transport would see.
    let req = request(opcode::GETATTR, 5, abi::ROOT_ID, &[0u8; 16]);
    let d = DATA;
    let mut indirect_table = Vec::new();
    for (addr, len, flags, next) in [(d + 0x100, 40u32, NEXT, 1u16), (d + 0x800, 256, WRITE, 0)] {
        indirect_table.extend_from_slice(&addr.to_le_bytes());
        indirect_table.extend_from_slice(&len.to_le_bytes());
        indirect_table.extend_from_slice(&flags.to_le_bytes());
        indirect_table.extend_from_slice(&next.to_le_bytes());
    }
    let mut with_table = vec![0u8; 0x40];
    with_table.extend_from_slice(&indirect_table);
    vec![
        (
            "one_readable",
            chain::input(0, 0, 40, 0, &[(d, 40, 0, 0)], &req),
        ),
        (
            "request_reply",
            chain::input(
                0,
                8,
                16,
                4096,
                &[(d, 40, NEXT, 1), (d + 0x400, 4096, WRITE, 0)],
                &req,
            ),
        ),
        (
            "three_parts",
            chain::input(
                2,
                30,
                40,
                0,
                &[
                    (d + 0x400, 512, WRITE, 0),
                    (d + 20, 20, NEXT, 0),
                    (d, 20, NEXT, 1),
                ],
                &req,
            ),
        ),
        (
            "indirect",
            chain::input(0, 0, 40, 0, &[(d + 0x40, 32, INDIRECT, 0)], &with_table),
        ),
        (
            "across_regions",
            chain::input(0, 0x100, 0x400, 0, &[(0xfe00, 0x400, 0, 0)], &req),
        ),
        (
            "outside_memory",
            chain::input(0, 0, 16, 0, &[(0x1_8000, 0x100, 0, 0)], &req),
        ),
        (
            "cycle",
            chain::input(0, 0, 16, 0, &[(d, 8, NEXT, 1), (d, 8, NEXT, 0)], &req),
        ),
        (
            "gap_region",
            chain::input(
                0,
                0,
                64,
                0,
                &[(d, 40, NEXT, 1), (0x2_0000, 0x1000, WRITE, 0)],
                &req,
            ),
        ),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_string(), b))
    .collect()
}
