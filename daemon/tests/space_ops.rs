//! The device side of the space operations without DAX (issue 14): the
//! timing layer over a real passthrough and a real device. A hard link
//! reaches the same pool pages; a punched hole and a truncated tail leave
//! the device cache unwritten; COPY_FILE_RANGE is charged as reads of the
//! source and writes of the destination; allocation is not charged.
//! (With DAX: `daemon/src/dax/mod.rs`'s tests.)
#![allow(clippy::unwrap_used)]

use cxlfs_device_model::{Device, DeviceConfig};
use cxlfsd::abi::{fattr, SetattrIn, ROOT_ID};
use cxlfsd::server::{
    BufferIo, Context, CopyRange, Creation, Fallocate, FileIo, FileSystem, Named, PayloadIo,
};
use cxlfsd::{CacheMode, PassthroughFs, SharedDevice, TimedFs, VmMetrics, EXTENT_SIZE, PAGE};
use std::sync::Arc;

const P: u64 = PAGE;

struct Rig {
    fs: TimedFs<PassthroughFs>,
    shared: Arc<SharedDevice>,
    dir: tempfile::TempDir,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let cfg = DeviceConfig::default()
        .with_overrides(&["cache.size_bytes=16MiB", "nand.read_ns=30us"])
        .unwrap();
    let shared = Arc::new(SharedDevice::new(Device::new(cfg).unwrap()));
    let fs = PassthroughFs::new(dir.path(), CacheMode::Never).unwrap();
    let metrics = Arc::new(VmMetrics::new("t"));
    let fs = TimedFs::new(fs, shared.clone(), metrics, None);
    Rig { fs, shared, dir }
}

/// A request arriving at `ms` milliseconds of device time (later than
/// every fill before it).
fn at(ms: u64) -> Context {
    Context {
        arrival_ns: ms * 1_000_000,
        ..Context::default()
    }
}

impl Rig {
    /// CREATE `name` read-write: (node, handle).
    fn create(&self, name: &str) -> (u64, u64) {
        let how = Creation {
            mode: 0o644,
            umask: 0o022,
            flags: libc::O_RDWR as u32,
            open_flags: 0,
        };
        let named = Named {
            parent: ROOT_ID,
            name: name.as_bytes(),
        };
        let (e, o) = self.fs.create(&at(0), named, how).unwrap().value;
        (e.nodeid, o.fh)
    }

    fn write(&self, ctx: &Context, node: (u64, u64), offset: u64, data: &[u8]) {
        let mut io = BufferIo {
            req: data,
            data: Vec::new(),
        };
        let payload: &mut dyn PayloadIo = &mut io;
        let io = FileIo {
            nodeid: node.0,
            fh: node.1,
            offset,
            size: data.len() as u32,
            flags: 0,
            at: 0,
            payload,
        };
        assert_eq!(self.fs.write(ctx, io).unwrap().value, data.len());
    }

    fn read(&self, ctx: &Context, node: (u64, u64), offset: u64, size: u32) -> Vec<u8> {
        let mut io = BufferIo {
            req: &[],
            data: Vec::new(),
        };
        let payload: &mut dyn PayloadIo = &mut io;
        let args = FileIo {
            nodeid: node.0,
            fh: node.1,
            offset,
            size,
            flags: 0,
            at: 0,
            payload,
        };
        self.fs.read(ctx, args).unwrap();
        io.data
    }

    fn falloc(&self, node: (u64, u64), offset: u64, length: u64, mode: i32) {
        let f = Fallocate {
            nodeid: node.0,
            fh: node.1,
            offset,
            length,
            mode: mode as u32,
        };
        self.fs.fallocate(&at(0), f).unwrap();
    }

    fn host(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.path().join(name)).unwrap()
    }

    fn host_programs(&self) -> u64 {
        self.shared.stats().nand.host_programs
    }
}

#[test]
fn a_hard_link_reaches_the_same_pool_pages() {
    let r = rig();
    let a = r.create("a");
    r.write(&at(0), a, 0, &[7u8; 4 * P as usize]);
    let named = Named {
        parent: ROOT_ID,
        name: b"b",
    };
    let b = r.fs.link(&at(0), a.0, named).unwrap().value.nodeid;
    let fh =
        r.fs.open(&at(0), b, libc::O_RDONLY as u32, 0)
            .unwrap()
            .value
            .fh;
    assert_eq!(
        r.fs.file_key(a.0, Some(a.1)).unwrap(),
        r.fs.file_key(b, Some(fh)).unwrap()
    );
    let before = r.shared.stats();
    assert_eq!(
        r.read(&at(100), (b, fh), 0, 4 * P as u32),
        [7u8; 4 * P as usize]
    );
    let after = r.shared.stats();
    assert_eq!(
        (after.hits - before.hits, after.misses - before.misses),
        (4, 0),
        "the other name's pages are device-cache hits"
    );
    assert_eq!(r.shared.read(|p, _| p.allocated_extents()), 1);
}

#[test]
fn a_punched_hole_leaves_the_device_cache_unwritten() {
    let r = rig();
    let f = r.create("f");
    r.write(&at(0), f, 0, &[9u8; 8 * P as usize]);
    let resident = r.shared.stats().resident_pages;
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    r.falloc(f, 2 * P, 4 * P, mode);
    let st = r.shared.stats();
    assert_eq!((st.discarded, st.resident_pages), (4, resident - 4));
    let host = r.host("f");
    assert_eq!(host.len() as u64, 8 * P);
    assert!(host[2 * P as usize..6 * P as usize].iter().all(|&b| b == 0));
    // The pages left are the only ones the device ever programs.
    let before = r.host_programs();
    r.shared.flush().unwrap();
    assert_eq!(r.host_programs() - before, 4);
    // The hole reads back as zeros, and misses: the device forgot it.
    let before = r.shared.stats();
    assert_eq!(r.read(&at(100), f, 2 * P, P as u32), [0u8; P as usize]);
    assert_eq!(r.shared.stats().misses - before.misses, 1);
    // ZERO_RANGE, partly covering its edge pages: the whole pages only.
    r.falloc(f, 100, 2 * P, libc::FALLOC_FL_ZERO_RANGE);
    assert_eq!(r.shared.stats().discarded, 5);
    assert!(r.host("f")[100..2 * P as usize + 100]
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn a_copy_is_charged_as_source_reads_and_destination_writes() {
    let r = rig();
    let src = r.create("src");
    let dst = r.create("dst");
    let data: Vec<u8> = (0..4 * P).map(|i| (i % 251) as u8).collect();
    std::fs::write(r.dir.path().join("src"), &data).unwrap();
    let copy = CopyRange {
        nodeid_in: src.0,
        fh_in: src.1,
        off_in: 0,
        nodeid_out: dst.0,
        fh_out: dst.1,
        off_out: P,
        len: 4 * P,
    };
    let t = r.fs.copy_file_range(&at(0), copy).unwrap();
    assert_eq!(t.value, 4 * P as usize);
    assert_eq!(&r.host("dst")[P as usize..], &data[..]);
    let st = r.shared.stats();
    assert_eq!((st.reads, st.bytes_read), (1, 4 * P));
    assert_eq!((st.writes, st.bytes_written), (1, 4 * P));
    assert!(
        t.completes_at_ns.unwrap() >= 30_000,
        "the reply waits for the source's NAND reads"
    );
    // The copied pages are the destination's: a READ of them hits.
    let before = r.shared.stats();
    r.read(&at(100), dst, P, 4 * P as u32);
    assert_eq!(r.shared.stats().hits - before.hits, 4);
}

#[test]
fn allocation_is_not_charged() {
    let r = rig();
    let f = r.create("f");
    r.falloc(f, 0, 64 * P, libc::FALLOC_FL_KEEP_SIZE);
    assert_eq!(r.host("f").len(), 0);
    r.falloc(f, 0, 64 * P, 0);
    assert_eq!(r.host("f").len() as u64, 64 * P);
    let st = r.shared.stats();
    assert_eq!(
        (st.accesses, st.nand.reads(), st.nand.programs()),
        (0, 0, 0)
    );
    assert_eq!(
        r.shared.read(|p, _| p.allocated_extents()),
        0,
        "no extent for it"
    );
}

#[test]
fn a_truncated_tail_leaves_the_device_cache_unwritten() {
    let r = rig();
    let f = r.create("f");
    r.write(&at(0), f, 0, &[5u8; 8 * P as usize]);
    r.write(&at(0), f, 2 * EXTENT_SIZE, &[5u8; P as usize]);
    assert_eq!(r.shared.read(|p, _| p.allocated_extents()), 2);
    let attr = SetattrIn {
        valid: fattr::SIZE,
        size: 2 * P + 1,
        ..SetattrIn::default()
    };
    r.fs.setattr(&at(0), f.0, &attr).unwrap();
    // Pages 3..8 of chunk 0 and chunk 2's extent went unwritten.
    assert_eq!(r.shared.stats().discarded, 6);
    assert_eq!(r.shared.read(|p, _| p.allocated_extents()), 1);
    let before = r.host_programs();
    r.shared.flush().unwrap();
    assert_eq!(r.host_programs() - before, 3, "pages 0..=2 only");
}
