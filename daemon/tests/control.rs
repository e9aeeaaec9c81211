//! Cache control against a real daemon core: the real control socket
//! (JSON lines over a Unix socket), the real FUSE server over real files in
//! a temp share (READ and FUSE_IOCTL requests as the guest kernel sends
//! them), the real device model, and the real Prometheus endpoint over HTTP.
//! Each command must change what the device does; bad requests must get
//! clear errors and change nothing.

#![allow(clippy::unwrap_used)]

use clap::Parser;
use cxlfs_api::control::MAX_REQUEST_LINE;
use cxlfs_hint::{HintOp, HintReply, HintRequest, CXLFS_IOC_HINT, HINT_SIZE};
use cxlfsd::abi::{self, opcode, Cursor, InHeader, OutHeader};
use cxlfsd::server::ServerOptions;
use cxlfsd::{
    CacheMode, Cli, ControlSocket, DaemonConfig, DaemonState, Features, FileConfig, SessionOptions,
    SharedDevice, VmServer,
};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A daemon core: device, metrics endpoint, controller, control socket,
/// and one VM session's FUSE server ("vm0").
struct Rig {
    _dir: tempfile::TempDir,
    share: PathBuf,
    sock: PathBuf,
    state: Arc<DaemonState>,
    control: Option<ControlSocket>,
    metrics_addr: SocketAddr,
    vm: VmServer,
    unique: AtomicU64,
}

fn rig(extra: &[&str], prepare: impl FnOnce(&Path)) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    prepare(&share);
    let sock = dir.path().join("ctl.sock");
    let mut args = vec![
        "cxlfsd".to_string(),
        "--shared-dir".into(),
        share.display().to_string(),
        "--vm".into(),
        format!("vm0={}", dir.path().join("vm0.sock").display()),
        "--control-socket".into(),
        sock.display().to_string(),
        // 1 MiB fully associative FIFO cache (256 pages), 30 µs reads, no
        // prefetcher: every effect below is countable page by page.
        "--preset".into(),
        "femu".into(),
        "--set".into(),
        "cache.size_bytes=1MiB".into(),
        "--set".into(),
        "cache.ways=0".into(),
        "--set".into(),
        "cache.policy=fifo".into(),
        "--set".into(),
        "nand.read_ns=30us".into(),
        "--set".into(),
        "prefetch.degree=0".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let cfg =
        DaemonConfig::merge(&Cli::try_parse_from(args).unwrap(), FileConfig::default()).unwrap();
    let shared = Arc::new(SharedDevice::new(
        cxlfs_device_model::Device::new(cfg.device.clone()).unwrap(),
    ));
    let (state, control) = DaemonState::start(
        shared.clone(),
        SessionOptions {
            shared_dir: cfg.shared_dir.clone(),
            max_open_files: cfg.max_open_files,
            cache: CacheMode::Never,
            queues: cfg.queues,
            server: ServerOptions {
                max_readahead: None,
            },
            guest_ids: Default::default(),
        },
        Features {
            dax: None,
            control: Some(&cfg),
            memory: None,
        },
    )
    .unwrap();
    let metrics_addr =
        cxlfsd::serve_metrics("127.0.0.1:0".parse().unwrap(), false, state.metrics.clone())
            .unwrap();
    // The daemon's own session server: passthrough under the timing layer,
    // the controller's hint handler as its ioctl seam.
    let vm = state.vm_server(state.metrics.vm("vm0"), None).unwrap();
    let r = Rig {
        _dir: dir,
        share,
        sock,
        state,
        control,
        metrics_addr,
        vm,
        unique: AtomicU64::new(1),
    };
    let init = r.fuse(opcode::INIT, 0, &init_args());
    assert_eq!(init.0.error, 0);
    r
}

fn init_args() -> Vec<u8> {
    let mut a = Vec::new();
    for v in [7u32, 31, 128 * 1024, 0xffff_ffff] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    a.extend_from_slice(&[0u8; 48]);
    a
}

/// An open file of the VM session.
#[derive(Clone, Copy)]
struct Open {
    nodeid: u64,
    fh: u64,
}

impl Rig {
    /// One FUSE request; waits for its modeled completion, as the guest
    /// would wait for the paced reply. Returns the header and payload.
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
        let shared = &self.state.shared;
        let h = self.vm.handle(shared.now_ns(), &b, 2 << 20);
        if let Some(t) = h.completes_at_ns {
            while shared.now_ns() < t {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        let reply = h.reply.unwrap();
        let hdr = OutHeader::parse(&mut Cursor::new(&reply)).unwrap();
        (hdr, reply[16..].to_vec())
    }

    fn open(&self, name: &str) -> Open {
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        let (h, p) = self.fuse(opcode::LOOKUP, 1, &n);
        assert_eq!(h.error, 0, "lookup {name}");
        let nodeid = u64::from_le_bytes(p[0..8].try_into().unwrap());
        let (h, p) = self.fuse(opcode::OPEN, nodeid, &[0u8; 8]);
        assert_eq!(h.error, 0, "open {name}");
        Open {
            nodeid,
            fh: u64::from_le_bytes(p[0..8].try_into().unwrap()),
        }
    }

    fn opendir_root(&self) -> Open {
        let (h, p) = self.fuse(opcode::OPENDIR, 1, &[0u8; 8]);
        assert_eq!(h.error, 0);
        Open {
            nodeid: 1,
            fh: u64::from_le_bytes(p[0..8].try_into().unwrap()),
        }
    }

    /// Reads `[off, off+len)` in 64 KiB requests; returns the bytes.
    fn read(&self, f: Open, off: u64, len: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut pos = off;
        while pos < off + len {
            let n = (64 * 1024).min(off + len - pos) as u32;
            let mut a = Vec::new();
            a.extend_from_slice(&f.fh.to_le_bytes());
            a.extend_from_slice(&pos.to_le_bytes());
            a.extend_from_slice(&n.to_le_bytes());
            a.extend_from_slice(&[0u8; 20]);
            let (h, p) = self.fuse(opcode::READ, f.nodeid, &a);
            assert_eq!(h.error, 0);
            assert!(!p.is_empty(), "read past EOF at {pos}");
            pos += p.len() as u64;
            out.extend_from_slice(&p);
        }
        out
    }

    /// (hits, misses) of vm0 so far.
    fn vm_counts(&self) -> (u64, u64) {
        let m = self.state.metrics.vm("vm0");
        (
            m.device_hits.load(Ordering::Relaxed),
            m.device_misses.load(Ordering::Relaxed),
        )
    }

    /// (hits, misses) of a read of `[off, off+len)`.
    fn read_counting(&self, f: Open, off: u64, len: u64) -> (u64, u64) {
        let (h0, m0) = self.vm_counts();
        self.read(f, off, len);
        let (h1, m1) = self.vm_counts();
        (h1 - h0, m1 - m0)
    }

    /// The guest's `CXLFS_IOC_HINT` on `f`: (ioctl result, reply).
    fn hint(&self, f: Open, req: &HintRequest, dir: bool) -> (i32, HintReply) {
        self.hint_raw(
            f,
            CXLFS_IOC_HINT,
            &cxlfs_hint::encode(req, &HintReply::default()),
            dir,
        )
        .unwrap()
    }

    fn hint_raw(&self, f: Open, cmd: u32, data: &[u8], dir: bool) -> Result<(i32, HintReply), i32> {
        let mut a = Vec::new();
        a.extend_from_slice(&f.fh.to_le_bytes());
        a.extend_from_slice(&(if dir { 1u32 << 4 } else { 0 }).to_le_bytes());
        a.extend_from_slice(&cmd.to_le_bytes());
        a.extend_from_slice(&0x7fff_0000u64.to_le_bytes());
        a.extend_from_slice(&(data.len() as u32).to_le_bytes());
        a.extend_from_slice(&(HINT_SIZE as u32).to_le_bytes());
        a.extend_from_slice(data);
        let (h, p) = self.fuse(opcode::IOCTL, f.nodeid, &a);
        if h.error != 0 {
            return Err(h.error);
        }
        let result = i32::from_le_bytes(p[0..4].try_into().unwrap());
        let (_, reply) = cxlfs_hint::decode(&p[16..]).unwrap();
        Ok((result, reply))
    }

    fn client(&self) -> Client {
        Client::new(&self.sock)
    }

    fn scrape(&self) -> String {
        let mut s = TcpStream::connect(self.metrics_addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    }

    fn device(&self) -> (u64, u64, String) {
        let st = self.state.shared.stats();
        (st.resident_pages, st.pinned_pages, st.policy)
    }
}

/// A Prometheus sample's value.
fn metric(text: &str, name_labels: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name_labels)
                .and_then(|rest| rest.strip_prefix(' '))
                .map(|v| v.trim().parse::<f64>().unwrap() as u64)
        })
        .unwrap_or_else(|| panic!("no sample {name_labels}"))
}

/// A control-socket connection.
struct Client {
    w: UnixStream,
    r: BufReader<UnixStream>,
    id: u64,
}

impl Client {
    fn new(sock: &Path) -> Client {
        let w = UnixStream::connect(sock).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Client {
            r: BufReader::new(w.try_clone().unwrap()),
            w,
            id: 0,
        }
    }

    fn raw(&mut self, line: &[u8]) -> Value {
        self.w.write_all(line).unwrap();
        self.w.write_all(b"\n").unwrap();
        let mut s = String::new();
        self.r.read_line(&mut s).unwrap();
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("reply {s:?}: {e}"))
    }

    /// Sends `req` (with `v` and a fresh `id`); returns the whole reply.
    fn send(&mut self, mut req: Value) -> Value {
        self.id += 1;
        req["v"] = json!(1);
        req["id"] = json!(self.id);
        let reply = self.raw(req.to_string().as_bytes());
        assert_eq!(reply["id"], json!(self.id), "id echoed: {reply}");
        assert_eq!(reply["v"], json!(1));
        reply
    }

    fn ok(&mut self, req: Value) -> Value {
        let r = self.send(req.clone());
        assert_eq!(r["ok"], json!(true), "{req} -> {r}");
        r["result"].clone()
    }

    fn err(&mut self, req: Value, code: &str) -> String {
        let r = self.send(req.clone());
        assert_eq!(r["ok"], json!(false), "{req} should fail: {r}");
        assert_eq!(r["error"]["code"], json!(code), "{req} -> {r}");
        r["error"]["message"].as_str().unwrap().to_string()
    }
}

fn write_file(share: &Path, name: &str, len: u64, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect();
    std::fs::write(share.join(name), &data).unwrap();
    data
}

#[test]
fn a_pinned_range_survives_a_scan_that_evicts_everything_else() {
    let r = rig(&[], |s| {
        write_file(s, "hot.bin", 512 * 1024, 1);
        write_file(s, "scan.bin", 2 << 20, 2);
    });
    let hot = r.open("hot.bin");
    let scan = r.open("scan.bin");
    // The host pins the first 256 KiB (64 pages); the guest warms all 512 KiB.
    let pin = r
        .client()
        .ok(json!({"cmd": "pin", "file": "hot.bin", "len": 256 * 1024}));
    assert_eq!(pin["pages"], json!(64));
    assert_eq!(pin["changed"], json!(64));
    assert_eq!(r.read_counting(hot, 256 * 1024, 256 * 1024), (0, 64));
    assert_eq!(r.device().1, 64, "64 pages pinned on the device");
    // A 2 MiB scan through a 1 MiB cache evicts everything not pinned.
    let (_, m) = r.read_counting(scan, 0, 2 << 20);
    assert_eq!(m, 512);
    assert_eq!(
        r.read_counting(hot, 0, 256 * 1024),
        (64, 0),
        "the pinned range survived"
    );
    assert_eq!(
        r.read_counting(hot, 256 * 1024, 256 * 1024),
        (0, 64),
        "the unpinned half was evicted"
    );
    // Unpin, scan again: now the range goes too.
    let un = r.client().ok(json!({"cmd": "unpin", "file": "hot.bin"}));
    assert_eq!(un["changed"], json!(64));
    assert_eq!(r.device().1, 0);
    r.read(scan, 0, 2 << 20);
    assert_eq!(r.read_counting(hot, 0, 256 * 1024), (0, 64));
}

#[test]
fn a_prefetch_turns_misses_into_hits_and_evict_undoes_it() {
    let r = rig(&[], |s| {
        write_file(s, "b.bin", 256 * 1024, 3);
    });
    let b = r.open("b.bin");
    assert_eq!(r.read_counting(b, 0, 256 * 1024), (0, 64), "cold");
    assert_eq!(r.read_counting(b, 0, 256 * 1024), (64, 0), "warm");
    let ev = r.client().ok(json!({"cmd": "evict", "file": "b.bin"}));
    assert_eq!(ev["changed"], json!(64));
    assert_eq!(r.read_counting(b, 0, 256 * 1024), (0, 64), "evicted");
    r.client().ok(json!({"cmd": "evict", "file": "b.bin"}));
    let pf = r
        .client()
        .ok(json!({"cmd": "prefetch", "file": "b.bin", "offset": 64 * 1024, "len": 128 * 1024}));
    assert_eq!(pf["pages"], json!(32));
    assert_eq!(pf["changed"], json!(32), "read from NAND");
    assert!(pf["latency_ns"].as_u64().unwrap() >= 30_000);
    // The reply came after the modeled completion: every page is ready.
    assert_eq!(r.read_counting(b, 64 * 1024, 128 * 1024), (32, 0));
    assert_eq!(
        r.read_counting(b, 0, 64 * 1024),
        (0, 16),
        "outside the range"
    );
    // The same through a pool range (device addresses) from the host.
    let ev = r
        .client()
        .ok(json!({"cmd": "evict", "pool_offset": 0, "len": 4 << 20}));
    assert!(ev["changed"].as_u64().unwrap() >= 48);
    assert_eq!(r.read_counting(b, 64 * 1024, 128 * 1024), (0, 32));
}

#[test]
fn guest_hints_act_on_open_files_within_the_quota() {
    let r = rig(&["--pin-quota-bytes", "64KiB"], |s| {
        write_file(s, "g.bin", 256 * 1024, 4);
        write_file(s, "scan.bin", 2 << 20, 5);
    });
    let g = r.open("g.bin");
    let scan = r.open("scan.bin");
    let mut req = HintRequest::new(HintOp::Prefetch);
    req.length = 64 * 1024;
    let (rc, out) = r.hint(g, &req, false);
    assert_eq!(rc, 0);
    assert_eq!((out.pages, out.changed), (16, 16));
    assert_eq!(out.pin_quota_bytes, 64 * 1024);
    assert_eq!(
        r.read_counting(g, 0, 64 * 1024),
        (16, 0),
        "guest prefetch -> hits"
    );
    // Pin 64 KiB (exactly the quota), then 4 KiB more: EDQUOT, nothing pinned.
    let mut pin = HintRequest::new(HintOp::Pin);
    pin.offset = 64 * 1024;
    pin.length = 64 * 1024;
    let (rc, out) = r.hint(g, &pin, false);
    assert_eq!(rc, 0);
    assert_eq!(out.pinned_bytes, 64 * 1024);
    let before = r.device();
    pin.offset = 128 * 1024;
    pin.length = 4096;
    let (rc, out) = r.hint(g, &pin, false);
    assert_eq!(rc, -libc::EDQUOT);
    assert_eq!(out.pinned_bytes, 64 * 1024);
    assert_eq!(r.device(), before, "an over-quota pin changes nothing");
    // The pinned range survives a scan.
    r.read(scan, 0, 2 << 20);
    assert_eq!(r.read_counting(g, 64 * 1024, 64 * 1024), (16, 0));
    // Stats from the guest agree with the VM's counters.
    let (rc, st) = r.hint(g, &HintRequest::new(HintOp::QueryStats), false);
    assert_eq!(rc, 0);
    assert_eq!((st.hits, st.misses), r.vm_counts());
    assert_eq!(st.policy(), "fifo");
    // Device-wide commands are refused without --guest-device-control.
    let before = r.device();
    let mut sp = HintRequest::new(HintOp::SetPolicy);
    sp.policy = cxlfs_hint::policy_field("lru").unwrap();
    let root = r.opendir_root();
    assert_eq!(r.hint(root, &sp, true).0, -libc::EPERM);
    assert_eq!(r.device().2, "fifo");
    assert_eq!(
        r.hint(root, &HintRequest::new(HintOp::ResetStats), true).0,
        -libc::EPERM
    );
    // A range hint on a directory, a bad version, unknown op, flags: EINVAL.
    assert_eq!(r.hint(root, &req, true).0, -libc::EINVAL);
    let mut bad = req.clone();
    bad.abi_version = 9;
    assert_eq!(r.hint(g, &bad, false).0, -libc::EINVAL);
    let mut bad = req.clone();
    bad.op = 77;
    assert_eq!(r.hint(g, &bad, false).0, -libc::EINVAL);
    let mut bad = req.clone();
    bad.flags = 1;
    assert_eq!(r.hint(g, &bad, false).0, -libc::EINVAL);
    // A range past the end of the file.
    let mut past = req.clone();
    past.offset = 1 << 30;
    assert_eq!(r.hint(g, &past, false).0, -libc::EINVAL);
    // Another ioctl (e.g. FS_IOC_GETFLAGS) and a truncated struct.
    assert_eq!(
        r.hint_raw(g, 0x8008_6601, &[0u8; 8], false).unwrap_err(),
        -libc::ENOTTY
    );
    assert_eq!(
        r.hint_raw(g, CXLFS_IOC_HINT, &[0u8; 100], false)
            .unwrap_err(),
        -libc::EINVAL
    );
    // A file handle the guest never opened.
    let forged = Open {
        nodeid: g.nodeid,
        fh: 999_999,
    };
    assert_eq!(
        r.hint_raw(
            forged,
            CXLFS_IOC_HINT,
            &cxlfs_hint::encode(&req, &HintReply::default()),
            false
        )
        .unwrap_err(),
        -libc::EBADF
    );
    assert_eq!(r.device(), before);
    // The guest unpins; the host sees no pins left.
    let mut un = HintRequest::new(HintOp::Unpin);
    un.length = 0;
    let (rc, out) = r.hint(g, &un, false);
    assert_eq!((rc, out.changed, out.pinned_bytes), (0, 16, 0));
    assert_eq!(r.device().1, 0);
}

#[test]
fn guest_device_control_when_allowed() {
    let r = rig(&["--guest-device-control"], |s| {
        write_file(s, "g.bin", 64 * 1024, 6);
    });
    let root = r.opendir_root();
    let mut sp = HintRequest::new(HintOp::SetPolicy);
    sp.policy = cxlfs_hint::policy_field("lru").unwrap();
    let (rc, out) = r.hint(root, &sp, true);
    assert_eq!(rc, 0);
    assert_eq!(out.policy(), "lru");
    assert_eq!(r.device().2, "lru");
    sp.policy = cxlfs_hint::policy_field("nope").unwrap();
    assert_eq!(r.hint(root, &sp, true).0, -libc::EINVAL);
    let mut pf = HintRequest::new(HintOp::SetPrefetch);
    pf.degree = 4;
    pf.stride = 2;
    let (rc, out) = r.hint(root, &pf, true);
    assert_eq!((rc, out.prefetch_degree, out.prefetch_stride), (0, 4, 2));
    let mut cx = HintRequest::new(HintOp::SetCxlRatio);
    cx.percent = 50;
    assert_eq!(
        r.hint(root, &cx, true).0,
        0,
        "a guest may set the ratio here"
    );
    cx.percent = 150;
    assert_eq!(r.hint(root, &cx, true).0, -libc::EINVAL);
    let g = r.open("g.bin");
    r.read(g, 0, 64 * 1024);
    assert!(r.vm_counts().1 > 0);
    assert_eq!(
        r.hint(root, &HintRequest::new(HintOp::ResetStats), true).0,
        0
    );
    assert_eq!(r.vm_counts(), (0, 0));
    assert_eq!(r.state.shared.stats().misses, 0);
}

#[test]
fn set_policy_under_load_keeps_data_and_residency() {
    let r = Arc::new(rig(&[], |s| {
        write_file(s, "load.bin", 1536 * 1024, 7);
    }));
    let expect = std::fs::read(r.share.join("load.bin")).unwrap();
    let f = r.open("load.bin");
    // Quiet switch: resident and pinned pages stay.
    r.read(f, 0, 512 * 1024);
    r.client()
        .ok(json!({"cmd": "pin", "file": "load.bin", "len": 16384}));
    let before = r.device();
    let mut c = r.client();
    let sw =
        c.ok(json!({"cmd": "set_policy", "name": "s3fifo", "params": {"s3fifo_small_ratio": 0.2}}));
    assert_eq!(
        (sw["previous"].as_str(), sw["policy"].as_str()),
        (Some("fifo"), Some("s3fifo"))
    );
    assert_eq!(sw["params"]["s3fifo_small_ratio"], json!(0.2));
    let after = r.device();
    assert_eq!(
        (after.0, after.1),
        (before.0, before.1),
        "residency and pins kept"
    );
    assert_eq!(after.2, "s3fifo");
    assert_eq!(
        r.read_counting(f, 0, 512 * 1024),
        (128, 0),
        "still resident"
    );
    // Under load: a reader verifies every byte while the host switches.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (r, stop, expect) = (r.clone(), stop.clone(), expect.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) || rounds < 2 {
                let off = (rounds * 192 * 1024) % (1536 * 1024 - 256 * 1024);
                let got = r.read(f, off, 256 * 1024);
                assert!(
                    got == expect[off as usize..off as usize + 256 * 1024],
                    "data differs at round {rounds}"
                );
                rounds += 1;
            }
            rounds
        })
    };
    let names = ["fifo", "lifo", "lru", "clock", "s3fifo", "2q", "lfru"];
    for i in 0..28 {
        let name = names[i % names.len()];
        let res = c.ok(json!({"cmd": "set_policy", "name": name}));
        assert_eq!(res["policy"], json!(name));
        let st = c.ok(json!({"cmd": "query_stats"}));
        assert_eq!(st["policy"], json!(name));
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = reader.join().expect("reader failed");
    assert!(rounds >= 2);
    assert_eq!(r.device().1, 4, "pins survive every switch");
    // A bad name or parameter changes nothing.
    let pol = r.device().2;
    c.err(json!({"cmd": "set_policy", "name": "mru"}), "bad_request");
    c.err(
        json!({"cmd": "set_policy", "name": "lru", "params": {"s3fifo_small_ratio": 7.0}}),
        "bad_request",
    );
    c.err(
        json!({"cmd": "set_policy", "name": "lru", "params": {"nope": 1}}),
        "bad_request",
    );
    assert_eq!(r.device().2, pol);
    // The prefetcher: degree 4 → one miss brings 4 more pages.
    c.ok(json!({"cmd": "evict", "pool_offset": 0, "len": 8 << 20}));
    c.ok(json!({"cmd": "unpin", "pool_offset": 0, "len": 8 << 20}));
    c.ok(json!({"cmd": "evict", "pool_offset": 0, "len": 8 << 20}));
    let p = c.ok(json!({"cmd": "set_prefetch", "degree": 4}));
    assert_eq!(
        (p["degree"].as_u64(), p["stride"].as_u64()),
        (Some(4), Some(1))
    );
    assert_eq!(r.read_counting(f, 0, 4096), (0, 1));
    std::thread::sleep(Duration::from_millis(1));
    assert_eq!(
        r.read_counting(f, 4096, 4 * 4096),
        (4, 0),
        "prefetched by the device"
    );
    c.err(
        json!({"cmd": "set_prefetch", "degree": 1, "stride": 0}),
        "bad_request",
    );
    assert_eq!(r.state.shared.read(|_, d| d.config().prefetch.degree), 4);
}

#[test]
fn query_stats_agrees_with_prometheus_and_reset_zeroes_both() {
    let r = rig(&[], |s| {
        write_file(s, "q.bin", 512 * 1024, 8);
    });
    let f = r.open("q.bin");
    r.read(f, 0, 512 * 1024);
    r.read(f, 0, 256 * 1024);
    r.client()
        .ok(json!({"cmd": "pin", "file": "q.bin", "len": 8192}));
    let mut c = r.client();
    let st = c.ok(json!({"cmd": "query_stats"}));
    let text = r.scrape();
    let vm = &st["vms"]["vm0"];
    assert_eq!(
        vm["hits"].as_u64().unwrap(),
        metric(&text, "cxlfs_device_hits_total{vm=\"vm0\"}")
    );
    assert_eq!(
        vm["misses"].as_u64().unwrap(),
        metric(&text, "cxlfs_device_misses_total{vm=\"vm0\"}")
    );
    assert_eq!(
        vm["traps"].as_u64().unwrap(),
        metric(&text, "cxlfs_pool_traps_total{vm=\"vm0\"}")
    );
    assert_eq!(
        (vm["hits"].as_u64(), vm["misses"].as_u64()),
        (Some(64), Some(128))
    );
    assert_eq!(
        vm["pinned_bytes"],
        json!(0),
        "the host's pins are not the VM's"
    );
    let total = &st["total"];
    assert_eq!(
        total["hits"].as_u64().unwrap(),
        metric(&text, "cxlfs_device_hits_all_total")
    );
    assert_eq!(
        total["misses"].as_u64().unwrap(),
        metric(&text, "cxlfs_device_misses_all_total")
    );
    assert_eq!(total["pinned_bytes"], json!(8192));
    assert_eq!(st["policy"], json!("fifo"));
    let one = c.ok(json!({"cmd": "query_stats", "vm": "vm0"}));
    assert_eq!(one["vms"].as_object().unwrap().len(), 1);
    c.err(json!({"cmd": "query_stats", "vm": "nobody"}), "not_found");
    c.ok(json!({"cmd": "reset_stats"}));
    let st = c.ok(json!({"cmd": "query_stats"}));
    let text = r.scrape();
    assert_eq!(st["vms"]["vm0"]["hits"], json!(0));
    assert_eq!(metric(&text, "cxlfs_device_hits_total{vm=\"vm0\"}"), 0);
    assert_eq!(metric(&text, "cxlfs_device_misses_all_total"), 0);
    assert_eq!(
        st["total"]["pinned_bytes"],
        json!(8192),
        "a reset keeps the pins"
    );
    let cfg = c.ok(json!({"cmd": "get_config"}));
    assert_eq!(cfg["device"]["cache"]["size_bytes"], json!(1 << 20));
    assert_eq!(cfg["protocol_version"], json!(1));
    assert_eq!(cfg["vms"][0]["name"], json!("vm0"));
    assert!(cfg["device_toml"].as_str().unwrap().contains("policy"));
    let r = c.ok(json!({"cmd": "set_cxl_ratio", "percent": 30}));
    assert_eq!(
        (r["old_cxl_ratio"].clone(), r["cxl_ratio"].clone()),
        (json!(100), json!(30))
    );
    c.err(
        json!({"cmd": "set_cxl_ratio", "percent": 101}),
        "bad_request",
    );
    let cfg = c.ok(json!({"cmd": "get_config"}));
    assert_eq!(
        cfg["cxl_ratio"],
        json!(30),
        "get_config reports the ratio in force"
    );
}

#[test]
fn malformed_oversized_and_escaping_requests_change_nothing() {
    // Ranges up to 4 MiB, so that the 2 MiB pin below reaches the device
    // (tests/bounds.rs covers the refusal at the default bound).
    let r = rig(&["--max-range-bytes", "4MiB"], |s| {
        write_file(s, "ok.bin", 64 * 1024, 9);
        std::fs::create_dir(s.join("sub")).unwrap();
        write_file(&s.join("sub"), "in.bin", 8192, 10);
        std::os::unix::fs::symlink("/etc/passwd", s.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", s.join("etcdir")).unwrap();
        std::os::unix::fs::symlink("sub", s.join("subl")).unwrap();
    });
    let f = r.open("ok.bin");
    r.read(f, 0, 32 * 1024);
    let before = r.device();
    let mut c = r.client();
    let check = |c: &mut Client, line: &[u8], code: &str| {
        let v = c.raw(line);
        assert_eq!(v["ok"], json!(false), "{}", String::from_utf8_lossy(line));
        assert_eq!(v["error"]["code"], json!(code), "{v}");
    };
    check(&mut c, b"{not json", "parse_error");
    check(&mut c, b"[1,2]", "bad_request");
    check(&mut c, br#"{"id":1,"cmd":"get_config"}"#, "bad_request");
    check(
        &mut c,
        br#"{"v":2,"id":1,"cmd":"get_config"}"#,
        "unsupported_version",
    );
    check(
        &mut c,
        br#"{"v":1,"id":{"a":1},"cmd":"get_config"}"#,
        "bad_request",
    );
    check(&mut c, br#"{"v":1,"id":1}"#, "bad_request");
    check(
        &mut c,
        br#"{"v":1,"id":1,"cmd":"format_disk"}"#,
        "unknown_command",
    );
    check(
        &mut c,
        br#"{"v":1,"id":1,"cmd":"pin","file":"ok.bin","lenn":5}"#,
        "bad_request",
    );
    check(
        &mut c,
        br#"{"v":1,"id":1,"cmd":"pin","file":"ok.bin","pool_offset":0}"#,
        "bad_request",
    );
    check(
        &mut c,
        br#"{"v":1,"id":1,"cmd":"pin","len":-1,"file":"ok.bin"}"#,
        "bad_request",
    );
    check(
        &mut c,
        br#"{"v":1,"id":1,"cmd":"set_prefetch","degree":"x"}"#,
        "bad_request",
    );
    // Oversized: refused, and the connection still serves.
    let mut big = br#"{"v":1,"id":1,"cmd":"get_config","pad":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', MAX_REQUEST_LINE + 10));
    big.extend_from_slice(b"\"}");
    check(&mut c, &big, "too_large");
    c.ok(json!({"cmd": "get_config"}));
    // Paths that leave the share, or are not files there.
    for (path, code) in [
        ("../etc/passwd", "forbidden"),
        ("/etc/passwd", "forbidden"),
        ("sub/../ok.bin", "forbidden"),
        ("./ok.bin", "forbidden"),
        ("sub//in.bin", "forbidden"),
        ("link", "forbidden"),
        ("etcdir/passwd", "forbidden"),
        ("subl/in.bin", "forbidden"),
        ("missing.bin", "not_found"),
        ("sub", "bad_request"),
        ("", "bad_request"),
    ] {
        for cmd in ["prefetch", "pin", "unpin", "evict"] {
            c.err(json!({"cmd": cmd, "file": path}), code);
        }
    }
    // Ranges outside the file or the pool.
    c.err(
        json!({"cmd": "pin", "file": "ok.bin", "offset": 1 << 20}),
        "bad_request",
    );
    c.err(
        json!({"cmd": "pin", "file": "ok.bin", "offset": u64::MAX, "len": 10}),
        "bad_request",
    );
    c.err(
        json!({"cmd": "pin", "pool_offset": u64::MAX - 4096, "len": 8192}),
        "bad_request",
    );
    c.err(json!({"cmd": "pin", "pool_offset": 0}), "bad_request");
    c.err(
        json!({"cmd": "pin", "pool_offset": 0, "len": 0}),
        "bad_request",
    );
    assert_eq!(r.device(), before, "nothing changed");
    // A file in a subdirectory is fine.
    let ok = c.ok(json!({"cmd": "prefetch", "file": "sub/in.bin"}));
    assert_eq!(ok["pages"], json!(2));
    // Pinning more than the cache holds fails cleanly and pins nothing.
    std::fs::write(r.share.join("huge.bin"), vec![0u8; 2 << 20]).unwrap();
    let before = r.device();
    c.err(
        json!({"cmd": "pin", "file": "huge.bin"}),
        "cache_fully_pinned",
    );
    assert_eq!(r.device().1, before.1, "a refused pin is rolled back");
}

#[test]
fn the_socket_is_owner_only_by_default() {
    let r = rig(&[], |_| {});
    let mode = std::fs::metadata(&r.sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(
            connect_as(&r.sock, 65534),
            libc::EACCES,
            "another uid is refused"
        );
        assert_eq!(connect_as(&r.sock, 0), 0, "the owner connects");
    } else {
        // Under CI=true this check may not be skipped: a green CI run means it ran.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "not root: the connect-as-another-uid check needs root, and CI=true forbids skipping it"
        );
        eprintln!("SKIP: not root: skipping the connect-as-another-uid check");
    }
    // Widened on request.
    let w = rig(&["--control-socket-mode", "0660"], |_| {});
    let mode = std::fs::metadata(&w.sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    // A mode that locks the owner out is refused at configuration time.
    let bad = Cli::try_parse_from([
        "cxlfsd",
        "--shared-dir",
        "/tmp",
        "--control-socket-mode",
        "0066",
    ])
    .unwrap();
    assert!(DaemonConfig::merge(&bad, FileConfig::default()).is_err());
    // A second daemon on the same path is refused; shutdown removes the file.
    let dup = ControlSocket::start(&r.sock, 0o600, r.state.control().unwrap().clone());
    assert!(matches!(dup, Err(cxlfsd::StartControlError::InUse(_))));
    if let Some(s) = &r.control {
        s.shutdown();
    }
    assert!(!r.sock.exists());
}

/// Connects to `sock` from a child process running as `uid`; returns 0 or
/// the errno of connect(2).
fn connect_as(sock: &Path, uid: u32) -> i32 {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(sock.as_os_str().as_bytes()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: the child only calls async-signal-safe functions (setgid,
    // setuid, socket, connect, _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above; the child never returns.
        unsafe {
            if libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                libc::_exit(200);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let rc = libc::connect(
                fd,
                std::ptr::addr_of!(addr).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            let code = if rc == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            libc::_exit(code);
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status));
    let code = libc::WEXITSTATUS(status);
    assert_ne!(code, 200, "setuid failed in the child");
    code
}
