//! Guests are bounded (issue 11, item 4), against real daemon parts: the
//! real control socket and the hint ioctl through the real FUSE server
//! (in-process daemon core), and real vhost-user connections (the test
//! front-end of `common`) for disconnects, per-VM shares and the open-files
//! cap.
//!
//! * a pin / prefetch / evict of a 16 TiB sparse file (length 0 = to EOF)
//!   is clamped to its data in well under a second, and the daemon's RSS
//!   does not grow;
//! * a pin over the quota is refused before any work; a prefetch is cut to
//!   the range bound and then throttled by the VM's budget;
//! * pool extents come back after a truncation, an `O_TRUNC` open, the last
//!   FORGET of a deleted file, and a disconnect (also with a DAX window
//!   that still mapped them); an existing file's extents stay idle after
//!   its last FORGET and are reclaimed when the pool runs short;
//! * each VM sees only its own directory;
//! * a VM at its open-files cap gets EMFILE while another VM works on.

#![allow(clippy::unwrap_used)]

mod common;

use clap::Parser;
use common::{DaxDaemon, Guest};
use cxlfs_hint::{HintOp, HintReply, HintRequest, CXLFS_IOC_HINT, HINT_SIZE};
use cxlfsd::abi::{self, opcode, Cursor, InHeader, OutHeader, SetattrIn};
use cxlfsd::server::ServerOptions;
use cxlfsd::{
    CacheMode, Cli, ControlSocket, DaemonConfig, DaemonState, Features, FileConfig, QueueOptions,
    SessionOptions, SharedDevice, VmServer, VmSpec, EXTENT_SIZE,
};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

/// 16 TiB less a block: the largest file ext4 allows (`truncate -s 16T`
/// fails there by 4 KiB).
const SPARSE: u64 = (16 << 40) - 4096;

/// A daemon core: device (1 MiB cache), controller, control socket, and
/// the session server of VM "vm0".
struct Rig {
    _dir: tempfile::TempDir,
    share: PathBuf,
    sock: PathBuf,
    state: Arc<DaemonState>,
    _control: Option<ControlSocket>,
    vm: VmServer,
    unique: AtomicU64,
}

#[derive(Clone, Copy)]
struct Open {
    nodeid: u64,
    fh: u64,
}

fn rig(extra: &[&str], prepare: impl FnOnce(&Path)) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    prepare(&share);
    let sock = dir.path().join("ctl.sock");
    let mut args: Vec<String> = [
        "cxlfsd",
        "--shared-dir",
        share.to_str().unwrap(),
        "--control-socket",
        sock.to_str().unwrap(),
        "--preset",
        "femu",
        "--set",
        "cache.size_bytes=1MiB",
        "--set",
        "prefetch.degree=0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let cfg =
        DaemonConfig::merge(&Cli::try_parse_from(args).unwrap(), FileConfig::default()).unwrap();
    let shared = Arc::new(SharedDevice::new(
        cxlfs_device_model::Device::new(cfg.device.clone()).unwrap(),
    ));
    let (state, control) = DaemonState::start(
        shared,
        SessionOptions {
            shared_dir: cfg.shared_dir.clone(),
            max_open_files: cfg.max_open_files,
            guest_ids: Default::default(),
            cache: CacheMode::Never,
            queues: cfg.queues,
            server: ServerOptions {
                max_readahead: None,
            },
        },
        Features {
            dax: None,
            control: Some(&cfg),
            memory: None,
        },
    )
    .unwrap();
    let vm = state.vm_server(state.metrics.vm("vm0"), None).unwrap();
    let r = Rig {
        _dir: dir,
        share,
        sock,
        state,
        _control: control,
        vm,
        unique: AtomicU64::new(1),
    };
    let mut init = Vec::new();
    for v in [7u32, 31, 128 * 1024, 0xffff_ffff] {
        init.extend_from_slice(&v.to_le_bytes());
    }
    init.extend_from_slice(&[0u8; 48]);
    assert_eq!(r.fuse(opcode::INIT, 0, &init).0.error, 0);
    r
}

impl Rig {
    /// One FUSE request (the reply is not held for its modeled time).
    fn fuse(&self, op: u32, nodeid: u64, args: &[u8]) -> (OutHeader, Vec<u8>) {
        let mut b = Vec::new();
        InHeader {
            len: (abi::IN_HEADER_LEN + args.len()) as u32,
            opcode: op,
            unique: self.unique.fetch_add(1, Ordering::Relaxed),
            nodeid,
            ..Default::default()
        }
        .encode(&mut b);
        b.extend_from_slice(args);
        let h = self.vm.handle(self.state.shared.now_ns(), &b, 2 << 20);
        let reply = h.reply.unwrap();
        let hdr = OutHeader::parse(&mut Cursor::new(&reply)).unwrap();
        (hdr, reply[16..].to_vec())
    }

    fn lookup(&self, name: &str) -> Result<u64, i32> {
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        let (h, p) = self.fuse(opcode::LOOKUP, 1, &n);
        if h.error != 0 {
            return Err(h.error);
        }
        Ok(u64::from_le_bytes(p[0..8].try_into().unwrap()))
    }

    fn open_flags(&self, nodeid: u64, flags: u32) -> u64 {
        let mut a = flags.to_le_bytes().to_vec();
        a.extend_from_slice(&[0u8; 4]);
        let (h, p) = self.fuse(opcode::OPEN, nodeid, &a);
        assert_eq!(h.error, 0, "open {nodeid}");
        u64::from_le_bytes(p[0..8].try_into().unwrap())
    }

    fn open(&self, name: &str) -> Open {
        let nodeid = self.lookup(name).unwrap();
        Open {
            nodeid,
            fh: self.open_flags(nodeid, libc::O_RDWR as u32),
        }
    }

    fn read(&self, f: Open, off: u64, len: u32) {
        let mut a = Vec::new();
        a.extend_from_slice(&f.fh.to_le_bytes());
        a.extend_from_slice(&off.to_le_bytes());
        a.extend_from_slice(&len.to_le_bytes());
        a.extend_from_slice(&[0u8; 20]);
        assert_eq!(self.fuse(opcode::READ, f.nodeid, &a).0.error, 0);
    }

    fn truncate(&self, nodeid: u64, size: u64) {
        let attr = SetattrIn {
            valid: abi::fattr::SIZE,
            size,
            ..SetattrIn::default()
        };
        assert_eq!(
            self.fuse(opcode::SETATTR, nodeid, attr.as_bytes()).0.error,
            0
        );
    }

    fn forget(&self, nodeid: u64, n: u64) {
        // FORGET has no reply.
        let mut b = Vec::new();
        InHeader {
            len: (abi::IN_HEADER_LEN + 8) as u32,
            opcode: opcode::FORGET,
            unique: self.unique.fetch_add(1, Ordering::Relaxed),
            nodeid,
            ..Default::default()
        }
        .encode(&mut b);
        b.extend_from_slice(&n.to_le_bytes());
        let h = self.vm.handle(self.state.shared.now_ns(), &b, 4096);
        assert!(h.reply.is_none());
    }

    /// The guest's `CXLFS_IOC_HINT` on `f`: (ioctl result, reply).
    fn hint(&self, f: Open, op: HintOp, offset: u64, length: u64) -> (i32, HintReply) {
        let mut req = HintRequest::new(op);
        req.offset = offset;
        req.length = length;
        let data = cxlfs_hint::encode(&req, &HintReply::default());
        let mut a = Vec::new();
        a.extend_from_slice(&f.fh.to_le_bytes());
        a.extend_from_slice(&0u32.to_le_bytes());
        a.extend_from_slice(&CXLFS_IOC_HINT.to_le_bytes());
        a.extend_from_slice(&0x7fff_0000u64.to_le_bytes());
        a.extend_from_slice(&(data.len() as u32).to_le_bytes());
        a.extend_from_slice(&(HINT_SIZE as u32).to_le_bytes());
        a.extend_from_slice(&data);
        let (h, p) = self.fuse(opcode::IOCTL, f.nodeid, &a);
        assert_eq!(h.error, 0);
        let result = i32::from_le_bytes(p[0..4].try_into().unwrap());
        (result, cxlfs_hint::decode(&p[16..]).unwrap().1)
    }

    fn extents(&self) -> u64 {
        self.state.shared.read(|p, _| p.allocated_extents())
    }
}

/// One control-socket request; the reply.
fn control(sock: &Path, req: Value) -> Value {
    let mut w = UnixStream::connect(sock).unwrap();
    w.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(w.try_clone().unwrap());
    let mut req = req;
    req["v"] = json!(1);
    req["id"] = json!(1);
    w.write_all(format!("{req}\n").as_bytes()).unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

/// This process's resident set (the daemon core runs in it), in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

fn sparse_share(s: &Path) {
    let f = std::fs::File::create(s.join("sparse.bin")).unwrap();
    f.set_len(SPARSE).unwrap();
    // A little data far in: a page at 1 GiB.
    f.write_at(&[7u8; 4096], 1 << 30).unwrap();
    std::fs::write(s.join("full.bin"), vec![3u8; 4 << 20]).unwrap();
}

#[test]
fn a_16_tib_sparse_pin_to_eof_is_clamped_quickly_and_memory_stays_bounded() {
    let r = rig(&[], sparse_share);
    let rss0 = rss();
    // The host, through the control socket: pin, prefetch, evict, unpin
    // the whole file (no len = to the end of the file).
    for cmd in ["pin", "prefetch", "evict", "unpin"] {
        let t = Instant::now();
        let reply = control(&r.sock, json!({"cmd": cmd, "file": "sparse.bin"}));
        let took = t.elapsed();
        assert_eq!(reply["ok"], json!(true), "{cmd}: {reply}");
        assert!(took < Duration::from_secs(1), "{cmd} took {took:?}");
        let pages = reply["result"]["pages"].as_u64().unwrap();
        // Pin / prefetch: the data page; unpin / evict: the one extent the
        // file owns.
        assert!(pages <= 512, "{cmd}: only the data counts: {reply}");
    }
    assert!(r.extents() <= 1, "one extent for one data page");
    // A guest, through the hint ioctl: length 0 = to EOF.
    let f = r.open("sparse.bin");
    for op in [HintOp::Pin, HintOp::Prefetch, HintOp::Evict, HintOp::Unpin] {
        let t = Instant::now();
        let (res, reply) = r.hint(f, op, 0, 0);
        let took = t.elapsed();
        assert_eq!(res, 0, "{op:?}");
        assert!(took < Duration::from_secs(1), "{op:?} took {took:?}");
        assert!(reply.pages <= 512, "{op:?}: {} pages", reply.pages);
    }
    let grew = rss().saturating_sub(rss0);
    assert!(grew < 64 << 20, "RSS grew by {grew} bytes");
    assert!(r.extents() <= 1);
    assert_eq!(r.state.shared.stats().pinned_pages, 0);
}

#[test]
fn pins_over_the_quota_are_refused_and_prefetch_is_cut_then_throttled() {
    // Quota 256 KiB (25 % of the cache), ranges up to the cache (1 MiB),
    // prefetch budget 1 MiB per second.
    let r = rig(&["--prefetch-budget-bytes", "1MiB"], sparse_share);
    let f = r.open("full.bin");
    let t = Instant::now();
    let (res, reply) = r.hint(f, HintOp::Pin, 0, 0);
    assert_eq!(res, -libc::EDQUOT, "4 MiB of data over a 256 KiB quota");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(reply.pinned_bytes, 0);
    assert_eq!(r.state.shared.stats().pinned_pages, 0, "nothing pinned");
    // Within the quota: fine.
    let (res, reply) = r.hint(f, HintOp::Pin, 0, 128 << 10);
    assert_eq!((res, reply.pages), (0, 32));
    // The host's pin is bounded by the range limit instead.
    let reply = control(&r.sock, json!({"cmd": "pin", "file": "full.bin"}));
    assert_eq!(reply["error"]["code"], json!("bad_request"), "{reply}");
    // A 4 MiB prefetch is cut to the 1 MiB bound, and the budget is spent.
    let (res, reply) = r.hint(f, HintOp::Prefetch, 0, 0);
    assert_eq!(res, 0);
    assert_eq!(reply.pages, 256, "cut to the range bound");
    // Then the budget allows what refills (1 MiB per second) and refuses
    // the rest with EAGAIN.
    let t = Instant::now();
    let (mut pages, mut refused) = (0u64, 0u32);
    while t.elapsed() < Duration::from_millis(300) {
        let (res, reply) = r.hint(f, HintOp::Prefetch, 0, 0);
        match res {
            0 => pages += reply.pages,
            e => {
                assert_eq!(e, -libc::EAGAIN);
                refused += 1;
            }
        }
    }
    let allowed = t.elapsed().as_millis() as u64 * 256 / 1000 + 1;
    assert!(refused > 0, "the budget throttles");
    assert!(
        pages <= allowed,
        "{pages} pages prefetched, {allowed} allowed"
    );
    // Refilled after a second.
    std::thread::sleep(Duration::from_millis(1100));
    let (res, reply) = r.hint(f, HintOp::Prefetch, 0, 0);
    assert_eq!((res, reply.pages), (0, 256));
}

#[test]
fn truncation_o_trunc_the_last_forget_and_a_short_pool_return_extents() {
    let r = rig(&[], |s| {
        std::fs::write(s.join("f.bin"), vec![1u8; 8 << 20]).unwrap();
        std::fs::write(s.join("g.bin"), vec![2u8; 4 << 20]).unwrap();
    });
    let f = r.open("f.bin");
    for off in (0..8 << 20).step_by(EXTENT_SIZE as usize) {
        r.read(f, off, 4096);
    }
    assert_eq!(r.extents(), 4);
    r.truncate(f.nodeid, 3 << 20);
    assert_eq!(r.extents(), 2, "chunks 2 and 3 are past 3 MiB");
    r.truncate(f.nodeid, 0);
    assert_eq!(r.extents(), 0);
    // O_TRUNC on OPEN (FUSE_ATOMIC_O_TRUNC) truncates too.
    let g = r.open("g.bin");
    r.read(g, 0, 4096);
    r.read(g, 3 << 20, 4096);
    assert_eq!(r.extents(), 2);
    r.open_flags(g.nodeid, (libc::O_WRONLY | libc::O_TRUNC) as u32);
    assert_eq!(r.extents(), 0);
    assert_eq!(std::fs::metadata(r.share.join("g.bin")).unwrap().len(), 0);
    // The last FORGET of a file that still exists: its extents stay for a
    // reopen, on the idle list, reclaimed first when the pool runs short.
    std::fs::write(r.share.join("h.bin"), vec![3u8; 4 << 20]).unwrap();
    let h = r.open("h.bin");
    r.read(h, 0, 4096);
    r.read(h, 2 << 20, 4096);
    assert_eq!(r.extents(), 2);
    let again = r.lookup("h.bin").unwrap();
    assert_eq!(again, h.nodeid);
    r.forget(h.nodeid, 1);
    assert!(
        r.state.shared.read(|p, _| p.oldest_idle()).is_none(),
        "one lookup left"
    );
    r.forget(h.nodeid, 1);
    assert_eq!(r.extents(), 2, "idle, kept for a reopen");
    assert!(r.state.shared.read(|p, _| p.oldest_idle()).is_some());
    let cap = r.state.shared.read(|p, _| p.capacity_extents());
    r.state.shared.make_room(cap);
    assert_eq!(r.extents(), 0, "a short pool reclaims idle files");
    // The last FORGET of a deleted file gives its extents back at once.
    std::fs::write(r.share.join("d.bin"), vec![4u8; 4 << 20]).unwrap();
    let d = r.open("d.bin");
    r.read(d, 0, 4096);
    r.read(d, 2 << 20, 4096);
    assert_eq!(r.extents(), 2);
    std::fs::remove_file(r.share.join("d.bin")).unwrap();
    r.forget(d.nodeid, 1);
    assert_eq!(r.extents(), 0, "deleted: reclaimed with the last reference");
}

/// A daemon (no control) whose VMs are `vms` (name, own directory),
/// each VM capped at `max_open_files`; returns the sockets' directory.
fn vm_daemon(
    share: &Path,
    vms: &[(&str, Option<&Path>)],
    max_open_files: u64,
) -> (
    Arc<DaemonState>,
    Vec<std::thread::JoinHandle<()>>,
    tempfile::TempDir,
) {
    let cfg = cxlfs_device_model::DeviceConfig::default()
        .with_overrides(&["cache.size_bytes=4MiB"])
        .unwrap();
    let shared = Arc::new(SharedDevice::new(
        cxlfs_device_model::Device::new(cfg).unwrap(),
    ));
    let (state, _) = DaemonState::start(
        shared,
        SessionOptions {
            shared_dir: share.to_path_buf(),
            max_open_files,
            guest_ids: Default::default(),
            cache: CacheMode::Never,
            queues: QueueOptions {
                request_queues: 1,
                queue_size: 256,
                ..QueueOptions::default()
            },
            server: ServerOptions {
                max_readahead: None,
            },
        },
        Features::default(),
    )
    .unwrap();
    let sockets = tempfile::tempdir().unwrap();
    let threads = vms
        .iter()
        .map(|(n, dir)| {
            state
                .spawn_vm(VmSpec {
                    name: n.to_string(),
                    socket: sockets.path().join(format!("{n}.sock")),
                    dir: dir.map(Path::to_path_buf),
                })
                .unwrap()
        })
        .collect();
    (state, threads, sockets)
}

fn stop(state: &DaemonState, threads: Vec<std::thread::JoinHandle<()>>) {
    state.request_shutdown();
    for t in threads {
        t.join().unwrap();
    }
}

fn lookup(g: &mut Guest, name: &str) -> Result<u64, i32> {
    let mut a = name.as_bytes().to_vec();
    a.push(0);
    let (h, out, _) = g.call(opcode::LOOKUP, abi::ROOT_ID, &a);
    if h.error != 0 {
        return Err(h.error);
    }
    Ok(u64::from_le_bytes(out[0..8].try_into().unwrap()))
}

/// Waits up to 10 s for `f` to hold.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Host fds of this process that point at `path` (deleted or not).
fn fds_on(path: &Path) -> usize {
    let want = path.to_str().unwrap().to_string();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_str().is_some_and(|t| t.starts_with(&want)))
        .count()
}

#[test]
fn a_disconnect_returns_the_sessions_extents_and_fds() {
    let share = tempfile::tempdir().unwrap();
    std::fs::write(share.path().join("keep.bin"), vec![1u8; 4 << 20]).unwrap();
    std::fs::write(share.path().join("gone.bin"), vec![2u8; 4 << 20]).unwrap();
    let (state, threads, sockets) = vm_daemon(share.path(), &[("a", None)], 1024);
    let mut g = Guest::connect(&sockets.path().join("a.sock"));
    g.init();
    for name in ["keep.bin", "gone.bin"] {
        let n = g.lookup(name);
        let fh = g.open(n);
        g.read(n, fh, 0, 4096);
        g.read(n, fh, 2 << 20, 4096);
    }
    assert_eq!(state.shared.read(|p, _| p.allocated_extents()), 4);
    // Deleted on the host while the guest holds it: its fds and disk space
    // live on until the session lets go.
    std::fs::remove_file(share.path().join("gone.bin")).unwrap();
    assert!(fds_on(&share.path().join("gone.bin")) > 0);
    drop(g);
    eventually("the deleted file's extents come back", || {
        state.shared.read(|p, _| p.allocated_extents()) == 2
    });
    eventually("the deleted file's fds are closed", || {
        fds_on(&share.path().join("gone.bin")) == 0
    });
    // The file that still exists is idle: no reference holds its extents.
    assert!(state.shared.read(|p, _| p.oldest_idle()).is_some());
    let cap = state.shared.read(|p, _| p.capacity_extents());
    state.shared.make_room(cap);
    assert_eq!(state.shared.read(|p, _| p.allocated_extents()), 0);
    // A new connection works as before.
    let mut g = Guest::connect(&sockets.path().join("a.sock"));
    g.init();
    let n = g.lookup("keep.bin");
    let fh = g.open(n);
    assert_eq!(g.read(n, fh, 0, 4096).0, vec![1u8; 4096]);
    drop(g);
    stop(&state, threads);
}

#[test]
fn a_disconnect_returns_extents_a_dax_window_still_mapped() {
    let share = tempfile::tempdir().unwrap();
    std::fs::write(share.path().join("m.bin"), vec![5u8; 4 << 20]).unwrap();
    let Some(mut d) = DaxDaemon::start(share.path(), &["a"], &[], |_| {}) else {
        return;
    };
    let (window, mut g) = d.connect("a");
    g.init();
    let n = g.lookup("m.bin");
    let fh = g.open(n);
    let mut a = Vec::new();
    for v in [fh, 0, EXTENT_SIZE, 2 /* READ */, 0] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(g.call(opcode::SETUPMAPPING, n, &a).0.error, 0);
    assert_eq!(window.read(0, 4), vec![5u8; 4]);
    assert_eq!(d.state.shared.read(|p, _| p.allocated_extents()), 1);
    // The file is deleted on the host, and the guest forgets it but keeps
    // the slot (a misbehaving guest): the mapped extent must not go back to
    // the pool yet.
    std::fs::remove_file(share.path().join("m.bin")).unwrap();
    let mut forget = Vec::new();
    forget.extend_from_slice(&1u64.to_le_bytes());
    let req = g.request_bytes(opcode::FORGET, n, &forget);
    g.submit_only(&req);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        d.state.shared.read(|p, _| p.allocated_extents()),
        1,
        "a mapped extent stays with its file"
    );
    drop(g);
    eventually(
        "the window's extent comes back after the disconnect",
        || d.state.shared.read(|p, _| p.allocated_extents()) == 0,
    );
    d.shutdown();
}

#[test]
fn each_vm_sees_only_its_own_directory() {
    let root = tempfile::tempdir().unwrap();
    let (common_dir, a_dir, b_dir) = (
        root.path().join("common"),
        root.path().join("a"),
        root.path().join("b"),
    );
    for (d, f) in [(&common_dir, "c.txt"), (&a_dir, "a.txt"), (&b_dir, "b.txt")] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join(f), f).unwrap();
    }
    let (state, threads, sockets) = vm_daemon(
        &common_dir,
        &[
            ("a", Some(&a_dir)),
            ("b", Some(&b_dir)),
            ("c1", None),
            ("c2", None),
        ],
        1024,
    );
    let see = |vm: &str| -> Vec<&'static str> {
        let mut g = Guest::connect(&sockets.path().join(format!("{vm}.sock")));
        g.init();
        ["a.txt", "b.txt", "c.txt"]
            .into_iter()
            .filter(|n| match lookup(&mut g, n) {
                Ok(_) => true,
                Err(e) => {
                    assert_eq!(e, -libc::ENOENT, "{vm} {n}");
                    false
                }
            })
            .collect()
    };
    assert_eq!(see("a"), ["a.txt"]);
    assert_eq!(see("b"), ["b.txt"]);
    assert_eq!(see("c1"), ["c.txt"]);
    assert_eq!(see("c2"), ["c.txt"], "VMs without a directory share one");
    // `..` of a VM's root does not leave it.
    let mut g = Guest::connect(&sockets.path().join("a.sock"));
    g.init();
    assert!(lookup(&mut g, "..").is_err());
    drop(g);
    // A VM whose directory does not exist is refused at start.
    let missing = state.spawn_vm(VmSpec {
        name: "x".into(),
        socket: sockets.path().join("x.sock"),
        dir: Some(root.path().join("missing")),
    });
    assert!(missing.is_err());
    stop(&state, threads);
}

#[test]
fn a_vm_at_its_open_files_cap_gets_emfile_and_the_other_vm_works_on() {
    let share = tempfile::tempdir().unwrap();
    for i in 0..64 {
        std::fs::write(share.path().join(format!("f{i}")), b"x").unwrap();
    }
    let (state, threads, sockets) = vm_daemon(share.path(), &[("a", None), ("b", None)], 32);
    let mut a = Guest::connect(&sockets.path().join("a.sock"));
    a.init();
    let mut b = Guest::connect(&sockets.path().join("b.sock"));
    b.init();
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..64 {
        match lookup(&mut a, &format!("f{i}")) {
            Ok(n) => held.push(n),
            Err(e) => {
                assert_eq!(e, -libc::EMFILE);
                refused += 1;
            }
        }
    }
    // The root inode counts: 31 more.
    assert_eq!((held.len(), refused), (31, 33));
    let m = state.metrics.vm("a");
    assert_eq!(m.open_files_refused.load(Ordering::Relaxed), 33);
    // The other VM is not affected.
    for i in 0..20 {
        lookup(&mut b, &format!("f{i}")).unwrap();
    }
    // FORGET frees room.
    for &n in &held[..5] {
        let req = a.request_bytes(opcode::FORGET, n, &1u64.to_le_bytes());
        a.submit_only(&req);
    }
    eventually("forgotten inodes free room", || {
        lookup(&mut a, "f60").is_ok()
    });
    drop((a, b));
    stop(&state, threads);
}
