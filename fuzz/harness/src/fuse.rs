//! `fuse_request`: one FUSE request (header + arguments) through
//! `Server<TimedFs<PassthroughFs>>` over a real temporary directory, READ
//! and WRITE payloads moved through the in-memory [`BufferIo`] (as
//! `daemon/tests/fuse_server.rs` drives it).
//!
//! Input: `out_cap` (u32 LE, taken modulo [`OUT_CAP_MAX`] + 1: the room in
//! the chain's writable part), then the request's bytes.
//!
//! Every input starts from the same state, so a crash replays alone: the
//! directory is rebuilt (a file `f` of [`F_LEN`] bytes, a directory `d`
//! holding `g`, a symlink `l` → `f`) and a fresh server is
//! initialised, with `f` looked up and opened (nodeid [`F_NODEID`], handle
//! [`F_FH`]) and the root opened as a directory (handle [`ROOT_FH`]), before
//! the input runs. The directory is created once per process.
//!
//! [`BufferIo`]: cxlfsd::server::BufferIo

use cxlfs_device_model::{Device, DeviceConfig};
use cxlfsd::abi::{self, opcode, Cursor, InHeader, OutHeader};
use cxlfsd::server::{Server, ServerOptions, MAX_READ};
use cxlfsd::{CacheMode, PassthroughFs, SharedDevice, TimedFs, VmMetrics};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// Largest `out_cap` tried: a maximal READ's reply and then some.
pub const OUT_CAP_MAX: u32 = MAX_READ + 8192;
/// Bytes of the file `f`.
pub const F_LEN: usize = 64 * 1024;
/// `f`'s nodeid (the first LOOKUP after the root).
pub const F_NODEID: u64 = abi::ROOT_ID + 1;
/// `f`'s open handle.
pub const F_FH: u64 = 1;
/// The root's directory handle.
pub const ROOT_FH: u64 = 2;

pub(crate) type FuzzServer = Server<TimedFs<PassthroughFs>>;

/// A share directory, made once per process (one per target, so that the
/// targets' tests may run side by side).
pub(crate) fn share(cell: &'static OnceLock<tempfile::TempDir>) -> &'static Path {
    cell.get_or_init(|| {
        tempfile::Builder::new()
            .prefix("cxlfs-fuzz-share")
            .tempdir()
            .expect("a temporary directory for the share")
    })
    .path()
}

/// Puts the share back as every input expects it.
pub(crate) fn reset(dir: &Path) {
    // The previous input may have chmod-ed the root.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod share");
    for e in std::fs::read_dir(dir).expect("read the share") {
        let p = e.expect("a directory entry").path();
        let is_dir = std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir());
        if is_dir {
            std::fs::remove_dir_all(&p).expect("remove a directory");
        } else {
            std::fs::remove_file(&p).expect("remove a file");
        }
    }
    let pattern: Vec<u8> = (0..F_LEN).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.join("f"), pattern).expect("write f");
    std::fs::create_dir(dir.join("d")).expect("mkdir d");
    std::fs::write(dir.join("d/g"), b"g").expect("write d/g");
    std::os::unix::fs::symlink("f", dir.join("l")).expect("symlink l");
    // A FIFO made on the host: opening it must never block a worker (the
    // fuzzer's per-input timeout turns a regression into a hang report).
    let fifo = std::ffi::CString::new(dir.join("p").as_os_str().as_encoded_bytes())
        .expect("no NUL in the share path");
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) };
    assert_eq!(rc, 0, "mkfifo p: {}", std::io::Error::last_os_error());
    // An attribute for GETXATTR / REMOVEXATTR (a guest's `security.k` is
    // the host's `user.cxlfs.security.k`).
    let f = std::ffi::CString::new(dir.join("f").as_os_str().as_encoded_bytes())
        .expect("no NUL in the share path");
    for name in [c"user.k", c"user.cxlfs.security.k"] {
        // SAFETY: valid NUL-terminated path and name; the value is 2 bytes.
        let rc = unsafe { libc::setxattr(f.as_ptr(), name.as_ptr(), b"vv".as_ptr().cast(), 2, 0) };
        assert_eq!(rc, 0, "setxattr on f: {}", std::io::Error::last_os_error());
    }
}

/// A fresh device (small cache, half the pages on the CXL tier).
pub(crate) fn device() -> Arc<SharedDevice> {
    let cfg = DeviceConfig::default()
        .with_overrides(&["cache.size_bytes=256KiB", "nand.read_ns=30us"])
        .expect("a valid device config");
    Arc::new(SharedDevice::with_placement(
        Device::new(cfg).expect("a device"),
        cxlfsd::Placement::new(50).expect("a valid ratio"),
    ))
}

/// A fresh server for VM `vm` over `dir` and `shared`, as the daemon
/// builds it (less pool references and DAX).
pub(crate) fn server(dir: &Path, shared: Arc<SharedDevice>, metrics: Arc<VmMetrics>) -> FuzzServer {
    let fs = PassthroughFs::new(dir, CacheMode::Never).expect("open the share");
    let timed = TimedFs::new(fs, shared, metrics.clone(), None);
    Server::new(
        timed,
        metrics,
        ServerOptions {
            max_readahead: Some(128 * 1024),
        },
    )
}

/// A request: header (`len` = the whole request) then `args`.
pub fn request(op: u32, unique: u64, nodeid: u64, args: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(abi::IN_HEADER_LEN + args.len());
    InHeader {
        len: u32::try_from(abi::IN_HEADER_LEN + args.len()).expect("a small request"),
        opcode: op,
        unique,
        nodeid,
        ..Default::default()
    }
    .encode(&mut b);
    b.extend_from_slice(args);
    b
}

/// INIT's arguments: protocol 7.31, 128 KiB readahead, every flag (the
/// extension too, so `fuse_init_in` is the long form).
pub fn init_args() -> Vec<u8> {
    let init = abi::InitIn {
        major: abi::KERNEL_VERSION,
        minor: abi::KERNEL_MINOR_VERSION,
        max_readahead: 128 * 1024,
        flags: u32::MAX,
    };
    let ext = abi::InitInExt {
        flags2: u32::MAX,
        ..Default::default()
    };
    let mut b = zerocopy::IntoBytes::as_bytes(&init).to_vec();
    b.extend_from_slice(zerocopy::IntoBytes::as_bytes(&ext));
    b
}

fn expect_ok(s: &FuzzServer, req: &[u8], what: &str) -> Vec<u8> {
    let reply = s.handle(0, req, 4096).reply.expect("a reply");
    let h = OutHeader::parse(&mut Cursor::new(&reply)).expect("a reply header");
    assert_eq!(h.error, 0, "set-up step {what} failed");
    reply
}

/// INIT, LOOKUP f, OPEN f, OPENDIR root: the state every input starts from.
pub(crate) fn prepare(s: &FuzzServer) {
    expect_ok(s, &request(opcode::INIT, 1, 0, &init_args()), "INIT");
    let r = expect_ok(
        s,
        &request(opcode::LOOKUP, 2, abi::ROOT_ID, b"f\0"),
        "LOOKUP",
    );
    let nodeid = u64::from_le_bytes(r[16..24].try_into().expect("8 bytes"));
    assert_eq!(nodeid, F_NODEID);
    let open = abi::OpenIn {
        flags: libc::O_RDWR as u32,
        ..Default::default()
    };
    let r = expect_ok(
        s,
        &request(
            opcode::OPEN,
            3,
            F_NODEID,
            zerocopy::IntoBytes::as_bytes(&open),
        ),
        "OPEN",
    );
    assert_eq!(u64::from_le_bytes(r[16..24].try_into().expect("8")), F_FH);
    let r = expect_ok(
        s,
        &request(opcode::OPENDIR, 4, abi::ROOT_ID, &[0u8; 8]),
        "OPENDIR",
    );
    assert_eq!(
        u64::from_le_bytes(r[16..24].try_into().expect("8")),
        ROOT_FH
    );
}

/// Runs one input (see the module's documentation).
///
/// # Panics
/// When the server panics, or breaks what it promises the transport: a
/// reply longer than `out_cap`, a reply header whose `len` is not the
/// reply's length, an `unique` that is not the request's, an error that is
/// not a negative errno.
///
/// Returns the reply's error (0: success; `None`: no reply).
pub fn run(data: &[u8]) -> Option<i32> {
    let mut rest = data;
    let out_cap = (u32::from_le_bytes(crate::take::<4>(&mut rest)) % (OUT_CAP_MAX + 1)) as usize;
    static SHARE: OnceLock<tempfile::TempDir> = OnceLock::new();
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = share(&SHARE);
    reset(dir);
    let s = server(dir, device(), Arc::new(VmMetrics::new("fuzz")));
    prepare(&s);
    let handled = s.handle(1_000, rest, out_cap);
    assert_eq!(handled.in_place, 0, "Server::handle folds READ data in");
    let reply = handled.reply?;
    assert!(
        reply.len() <= out_cap,
        "reply of {} bytes for {out_cap} bytes of room",
        reply.len()
    );
    let h = OutHeader::parse(&mut Cursor::new(&reply)).expect("every reply has a header");
    assert_eq!(h.len as usize, reply.len(), "header length = reply length");
    assert!(
        (-4095..=0).contains(&h.error),
        "error {} is not -errno",
        h.error
    );
    if let Ok(req) = Cursor::new(rest).read::<InHeader>() {
        assert_eq!(h.unique, req.unique, "the reply answers the request");
    }
    if h.error != 0 {
        assert_eq!(
            reply.len(),
            std::mem::size_of::<OutHeader>(),
            "errors carry no payload"
        );
    }
    Some(h.error)
}
