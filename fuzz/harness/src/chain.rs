//! `chain_walk`: the vhost-user transport's descriptor-chain walker
//! (`cxlfsd::ChainBufs`) over a guest-chosen descriptor
//! table, in small real guest memory (`GuestMemoryMmap`: 96 KiB in two
//! adjacent regions, then a gap, then 4 KiB), popped from a real split
//! virtqueue (`virtio_queue::Queue`) as the daemon's vring workers pop it.
//!
//! Input: `head` (u8, taken modulo [`QSIZE`]), `skip` (u16), `len` (u16),
//! `offset` (u32), then up to [`QSIZE`] raw 16-byte descriptors written at
//! the table (address 0), then bytes written at [`DATA`] (where indirect
//! tables and payloads may go).
//!
//! Checks, where the chain resolves: its readable part is what
//! `virtio_queue::Reader` (the same walk, kept by rust-vmm) reads; partial
//! copies agree with the whole; `copy_out` stops at the writable part's end;
//! a WRITE payload (`pwritev` from guest memory) lands in the file byte for
//! byte, and one past the readable part is refused; a READ (`preadv` into
//! guest memory) moves no more than the room.

use cxlfsd::server::{Direction, PayloadIo, Transfer};
use cxlfsd::ChainBufs;
use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, OnceLock};
use virtio_queue::{Queue, QueueOwnedT, QueueT, Reader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// The queue's size (descriptors in the table).
pub const QSIZE: u16 = 16;
/// Where the available ring is.
const AVAIL: u64 = 0x100;
/// Where the used ring is.
const USED: u64 = 0x200;
/// Where the input's trailing bytes are written.
pub const DATA: u64 = 0x1000;
/// The regions: two adjacent (a slice may span them), a gap, a small one.
pub const REGIONS: [(u64, usize); 3] = [(0, 0x10000), (0x10000, 0x8000), (0x20000, 0x1000)];
/// Bytes of the header before the descriptors.
pub const HEADER: usize = 1 + 2 + 2 + 4;
/// Most bytes of the readable part compared in full.
const COMPARE_MAX: usize = 256 * 1024;

fn file() -> &'static Mutex<File> {
    static FILE: OnceLock<Mutex<File>> = OnceLock::new();
    FILE.get_or_init(|| {
        // SAFETY: the name is a valid NUL-terminated string; memfd_create
        // returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"cxlfs-fuzz-chain".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Mutex::new(unsafe { File::from_raw_fd(fd) })
    })
}

/// An input: `head`, `skip`, `len`, `offset`, the descriptors
/// (`(addr, len, flags, next)`), then `data` (written at [`DATA`]).
pub fn input(
    head: u8,
    skip: u16,
    len: u16,
    offset: u32,
    descs: &[(u64, u32, u16, u16)],
    data: &[u8],
) -> Vec<u8> {
    let mut b = vec![head];
    b.extend_from_slice(&skip.to_le_bytes());
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    let mut table = [0u8; QSIZE as usize * 16];
    for (i, (addr, l, flags, next)) in descs.iter().enumerate() {
        let d = &mut table[i * 16..(i + 1) * 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&l.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
    }
    b.extend_from_slice(&table);
    b.extend_from_slice(data);
    b
}

/// Runs one input (see the module's documentation).
///
/// # Panics
/// When the walker panics or disagrees with the checks above.
///
/// Returns the readable and writable lengths of a chain that resolved.
pub fn run(data: &[u8]) -> Option<(usize, usize)> {
    let mut rest = data;
    let head = u16::from(crate::take::<1>(&mut rest)[0]) % QSIZE;
    let skip = usize::from(u16::from_le_bytes(crate::take::<2>(&mut rest)));
    let len = usize::from(u16::from_le_bytes(crate::take::<2>(&mut rest)));
    let offset = u64::from(u32::from_le_bytes(crate::take::<4>(&mut rest)));
    let table_len = rest.len().min(usize::from(QSIZE) * 16);
    let (table, payload) = rest.split_at(table_len);

    let ranges: Vec<(GuestAddress, usize)> =
        REGIONS.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
    let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&ranges).expect("guest memory");
    mem.write_slice(table, GuestAddress(0))
        .expect("the table fits");
    let room = REGIONS[0].1 + REGIONS[1].1 - DATA as usize;
    mem.write_slice(&payload[..payload.len().min(room)], GuestAddress(DATA))
        .expect("the data fits");
    // The available ring: flags 0, idx 1, ring[0] = head.
    mem.write_obj(0u16, GuestAddress(AVAIL)).expect("avail");
    mem.write_obj(1u16, GuestAddress(AVAIL + 2)).expect("avail");
    mem.write_obj(head, GuestAddress(AVAIL + 4)).expect("avail");

    let mut q = Queue::new(QSIZE).expect("a queue");
    q.set_size(QSIZE);
    q.set_desc_table_address(Some(0), Some(0));
    q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
    q.set_used_ring_address(Some(USED as u32), Some(0));
    q.set_ready(true);
    assert!(q.is_valid(&mem), "the queue's layout is valid");
    let chain = q
        .iter(&mem)
        .expect("a ready queue")
        .next()
        .expect("one chain is available");

    let reader = Reader::<()>::new(&mem, chain.clone());
    let mut bufs = ChainBufs::new(&mem, chain).ok()?;
    let total = bufs.readable_len();
    let out = bufs.writable_len();

    // The whole readable part (up to COMPARE_MAX), against rust-vmm's reader.
    let whole_len = total.min(COMPARE_MAX);
    let mut whole = vec![0u8; whole_len];
    assert_eq!(bufs.copy_in(0, &mut whole), whole_len);
    let mut reader = reader.expect("rust-vmm's Reader takes every chain ChainBufs takes");
    assert_eq!(reader.available_bytes(), total, "readable length");
    let mut theirs = vec![0u8; whole_len];
    reader
        .read_exact(&mut theirs)
        .expect("the reader reads as far");
    assert!(
        whole == theirs,
        "readable bytes differ from virtio_queue::Reader's"
    );

    // A part of it.
    let mut part = vec![0u8; len];
    let n = bufs.copy_in(skip, &mut part);
    assert_eq!(n, len.min(total.saturating_sub(skip)), "copy_in length");
    if skip + n <= whole_len {
        assert!(part[..n] == whole[skip..skip + n], "copy_in({skip}, {len})");
    }

    let f = file().lock().unwrap_or_else(|e| e.into_inner());
    f.set_len(0).expect("truncate the memfd");
    // WRITE: request bytes [skip, skip + len) to the file at `offset`.
    let w = bufs.transfer(Transfer {
        direction: Direction::RequestToFile,
        file: &f,
        offset,
        at: skip,
        len,
    });
    if skip + len > total {
        assert!(w.is_err(), "a WRITE past the request is refused");
    } else {
        assert_eq!(w.expect("a WRITE inside the request"), len);
        if skip + len <= whole_len {
            let mut back = vec![0u8; len];
            f.read_exact_at(&mut back, offset).expect("read back");
            assert!(back == whole[skip..skip + len], "WRITE payload bytes");
        }
    }
    // READ: file bytes at 0 into the reply at `skip`.
    let pattern: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    f.write_all_at(&pattern, 0).expect("fill the memfd");
    let r = bufs.transfer(Transfer {
        direction: Direction::FileToReply,
        file: &f,
        offset: 0,
        at: skip,
        len,
    });
    let moved = r.expect("a READ into the reply");
    assert!(
        moved <= len.min(out.saturating_sub(skip)),
        "READ moved {moved}"
    );

    // A reply at `skip`: stops at the end of the writable part.
    let n = bufs.copy_out(skip, &pattern);
    assert_eq!(n, len.min(out.saturating_sub(skip)), "copy_out length");
    Some((total, out))
}
