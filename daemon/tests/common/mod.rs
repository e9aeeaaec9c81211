//! A vhost-user virtio-fs front-end for tests, no VM: memfd-backed guest
//! memory and a split virtqueue whose descriptors the test writes itself
//! (the same as `vhost_frontend.rs`'s, without the DAX window).
#![allow(clippy::unwrap_used, dead_code)]

use cxlfsd::abi::{self, opcode, Cursor, InHeader, OutHeader};
use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

const MEM_SIZE: u64 = 4 << 20;
const QSIZE: u16 = 16;
const DESC: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const REQ: u64 = 0x10_0000;
const REP: u64 = 0x20_0000;
const SLOT: u64 = 0x2_0000;
const REQUEST_QUEUE: usize = 1;

/// A front-end with one request queue set up.
pub struct Guest {
    frontend: Frontend,
    mem: GuestMemoryMmap,
    kick: EventFd,
    _call: EventFd,
    avail_idx: u16,
    used_seen: u16,
    next_desc: u16,
    unique: u64,
    /// Busy-poll the used ring instead of sleeping between polls (benchmarks).
    pub spin: bool,
}

impl Guest {
    /// Connects and sets up the request queue (no DAX window).
    pub fn connect(socket: &Path) -> Guest {
        let mut frontend = Frontend::connect(socket, 2).unwrap();
        let features = frontend.get_features().unwrap();
        frontend.set_owner().unwrap();
        frontend.set_features(features).unwrap();
        let proto = frontend.get_protocol_features().unwrap();
        assert!(proto.contains(VhostUserProtocolFeatures::MQ));
        frontend
            .set_protocol_features(proto & VhostUserProtocolFeatures::MQ)
            .unwrap();
        assert_eq!(frontend.get_queue_num().unwrap(), 2);

        let fd = rustix::fs::memfd_create("guest-ram", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let file = File::from(fd);
        file.set_len(MEM_SIZE).unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files(&[(
            GuestAddress(0),
            MEM_SIZE as usize,
            Some(FileOffset::new(file, 0)),
        )])
        .unwrap();
        let va = mem.get_host_address(GuestAddress(0)).unwrap() as u64;
        let region = mem.find_region(GuestAddress(0)).unwrap();
        frontend
            .set_mem_table(&[VhostUserMemoryRegionInfo::from_guest_region(region).unwrap()])
            .unwrap();
        frontend.set_vring_num(REQUEST_QUEUE, QSIZE).unwrap();
        frontend
            .set_vring_addr(
                REQUEST_QUEUE,
                &VringConfigData {
                    queue_max_size: QSIZE,
                    queue_size: QSIZE,
                    flags: 0,
                    desc_table_addr: va + DESC,
                    used_ring_addr: va + USED,
                    avail_ring_addr: va + AVAIL,
                    log_addr: None,
                },
            )
            .unwrap();
        frontend.set_vring_base(REQUEST_QUEUE, 0).unwrap();
        let kick = EventFd::new(0).unwrap();
        let call = EventFd::new(0).unwrap();
        frontend.set_vring_call(REQUEST_QUEUE, &call).unwrap();
        frontend.set_vring_kick(REQUEST_QUEUE, &kick).unwrap();
        frontend.set_vring_enable(REQUEST_QUEUE, true).unwrap();
        Guest {
            frontend,
            mem,
            kick,
            _call: call,
            avail_idx: 0,
            used_seen: 0,
            next_desc: 0,
            unique: 1,
            spin: false,
        }
    }

    /// Queues a chain of `(gpa, len, device-writable)` and kicks; returns the head.
    pub fn submit(&mut self, descs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, writable)) in descs.iter().enumerate() {
            let idx = (head + i as u16) % QSIZE;
            let next = (idx + 1) % QSIZE;
            let mut flags = 0u16;
            if i + 1 < descs.len() {
                flags |= 1; // NEXT
            }
            if writable {
                flags |= 2; // WRITE
            }
            let base = GuestAddress(DESC + 16 * u64::from(idx));
            self.mem.write_obj(addr, base).unwrap();
            self.mem.write_obj(len, GuestAddress(base.0 + 8)).unwrap();
            self.mem
                .write_obj(flags, GuestAddress(base.0 + 12))
                .unwrap();
            self.mem.write_obj(next, GuestAddress(base.0 + 14)).unwrap();
        }
        self.next_desc = (head + descs.len() as u16) % QSIZE;
        let slot = AVAIL + 4 + 2 * u64::from(self.avail_idx % QSIZE);
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
        self.kick.write(1).unwrap();
        head
    }

    /// Waits for the next used element: `(id, len)`.
    pub fn wait_used(&mut self, timeout: Duration) -> Option<(u32, u32)> {
        let start = Instant::now();
        loop {
            let idx: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
            if idx != self.used_seen {
                let e = USED + 4 + 8 * u64::from(self.used_seen % QSIZE);
                let id: u32 = self.mem.read_obj(GuestAddress(e)).unwrap();
                let len: u32 = self.mem.read_obj(GuestAddress(e + 4)).unwrap();
                self.used_seen = self.used_seen.wrapping_add(1);
                return Some((id, len));
            }
            if start.elapsed() > timeout {
                return None;
            }
            if self.spin {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    pub fn request_bytes(&mut self, op: u32, nodeid: u64, args: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        InHeader {
            len: (abi::IN_HEADER_LEN + args.len()) as u32,
            opcode: op,
            unique: self.unique,
            nodeid,
            ..Default::default()
        }
        .encode(&mut b);
        self.unique += 1;
        b.extend_from_slice(args);
        b
    }

    /// Sends raw request bytes; returns (out header, payload, elapsed).
    pub fn raw(&mut self, req: &[u8], reply_cap: u32) -> (OutHeader, Vec<u8>, Duration) {
        let slot = u64::from(self.next_desc);
        let req_at = REQ + slot * SLOT / 2;
        let rep_at = REP + slot * SLOT;
        self.mem.write_slice(req, GuestAddress(req_at)).unwrap();
        let t0 = Instant::now();
        let head = self.submit(&[(req_at, req.len() as u32, false), (rep_at, reply_cap, true)]);
        let (id, len) = self.wait_used(Duration::from_secs(10)).expect("no reply");
        let elapsed = t0.elapsed();
        assert_eq!(id, u32::from(head));
        assert!(len as usize >= abi::OUT_HEADER_LEN, "reply of {len} bytes");
        let mut out = vec![0u8; len as usize];
        self.mem.read_slice(&mut out, GuestAddress(rep_at)).unwrap();
        let h = OutHeader::parse(&mut Cursor::new(&out)).unwrap();
        assert_eq!(h.len, len);
        (h, out[abi::OUT_HEADER_LEN..].to_vec(), elapsed)
    }

    pub fn call(&mut self, op: u32, nodeid: u64, args: &[u8]) -> (OutHeader, Vec<u8>, Duration) {
        let req = self.request_bytes(op, nodeid, args);
        self.raw(&req, 64 * 1024)
    }

    pub fn init(&mut self) {
        let mut a = Vec::new();
        for v in [7u32, 31, 4096, 0] {
            a.extend_from_slice(&v.to_le_bytes());
        }
        a.extend_from_slice(&[0u8; 48]);
        let (h, out, _) = self.call(opcode::INIT, 0, &a);
        assert_eq!(h.error, 0);
        assert_eq!(u32::from_le_bytes(out[0..4].try_into().unwrap()), 7);
    }

    pub fn lookup(&mut self, name: &str) -> u64 {
        let mut a = name.as_bytes().to_vec();
        a.push(0);
        let (h, out, _) = self.call(opcode::LOOKUP, abi::ROOT_ID, &a);
        assert_eq!(h.error, 0, "lookup {name}");
        u64::from_le_bytes(out[0..8].try_into().unwrap())
    }

    pub fn open(&mut self, nodeid: u64) -> u64 {
        let (h, out, _) = self.call(opcode::OPEN, nodeid, &[0u8; 8]);
        assert_eq!(h.error, 0);
        u64::from_le_bytes(out[0..8].try_into().unwrap())
    }

    pub fn read(&mut self, nodeid: u64, fh: u64, off: u64, size: u32) -> (Vec<u8>, Duration) {
        let mut a = Vec::new();
        a.extend_from_slice(&fh.to_le_bytes());
        a.extend_from_slice(&off.to_le_bytes());
        a.extend_from_slice(&size.to_le_bytes());
        a.extend_from_slice(&[0u8; 20]);
        let (h, out, t) = self.call(opcode::READ, nodeid, &a);
        assert_eq!(h.error, 0);
        (out, t)
    }
}
