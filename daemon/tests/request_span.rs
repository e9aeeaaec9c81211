//! Each FUSE request runs in a `fuse_request` span carrying the VM, the
//! opcode and the request's unique id. Alone in its own test binary: tracing
//! caches each callsite's interest globally, and a test thread that hits a
//! callsite first while no subscriber is set can disable it for this test's
//! scoped subscriber (a race that made it flaky among the unit tests).
#![allow(clippy::unwrap_used)]

use cxlfs_device_model::{config::DeviceConfig, Device};
use cxlfsd::server::{Server, ServerOptions};
use cxlfsd::{CacheMode, PassthroughFs, SharedDevice, TimedFs, VmMetrics};
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A FUSE request: header (`fuse_in_header`, 40 bytes) + arguments.
fn req(op: u32, unique: u64, nodeid: u64, args: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&((40 + args.len()) as u32).to_le_bytes());
    b.extend_from_slice(&op.to_le_bytes());
    b.extend_from_slice(&unique.to_le_bytes());
    b.extend_from_slice(&nodeid.to_le_bytes());
    b.extend_from_slice(&[0u8; 16]); // uid, gid, pid, total_extlen + padding
    b.extend_from_slice(args);
    b
}

#[test]
fn each_request_runs_in_a_span_with_vm_opcode_and_unique() {
    let buf = Buf::default();
    let out = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || out.clone())
        .finish();
    let dir = tempfile::tempdir().unwrap();
    let cfg = DeviceConfig::default()
        .with_overrides(&["cache.size_bytes=1MiB"])
        .unwrap();
    let shared = Arc::new(SharedDevice::new(Device::new(cfg).unwrap()));
    let metrics = Arc::new(VmMetrics::new("t"));
    let fs = PassthroughFs::new(dir.path(), CacheMode::Never).unwrap();
    let s = Server::new(
        TimedFs::new(fs, shared, metrics.clone(), None),
        metrics,
        ServerOptions {
            max_readahead: None,
        },
    );
    let mut init = Vec::new();
    for v in [7u32, 31, 128 * 1024, 0xffff_ffff] {
        init.extend_from_slice(&v.to_le_bytes());
    }
    init.extend_from_slice(&[0u8; 48]);
    tracing::subscriber::with_default(subscriber, || {
        s.handle(0, &req(26, 1, 0, &init), 4096); // INIT
                                                  // A truncated LOOKUP: its "malformed" debug event is logged inside
                                                  // the request's span.
        s.handle(0, &req(1, 77, 1, b"x"), 4096);
    });
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("fuse_request{vm=t opcode=\"lookup\" unique=77 nodeid=1}"),
        "{text}"
    );
    assert!(text.contains("opcode=\"init\" unique=1"), "{text}");
}
