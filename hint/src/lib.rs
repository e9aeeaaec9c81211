//! `cxlfs-hint`: cache hints from applications inside a cxlfs guest.
//!
//! An application opens a file on the virtio-fs share and asks the emulated
//! CXL-SSD to prefetch, pin, unpin or evict a range of it, or (on any file
//! or the share's directory) to change the policy or the prefetcher, or to
//! report its statistics. The request is one ioctl, [`CXLFS_IOC_HINT`], that
//! the guest kernel forwards to `cxlfsd` as `FUSE_IOCTL`: no guest kernel
//! change. The layout is [`CxlfsHint`], [`HINT_SIZE`] bytes, little-endian,
//! the same as `include/cxlfs_hint.h`; `cxlfsd` decodes it with this crate.
//!
//! ```no_run
//! let f = std::fs::File::open("/mnt/data.bin")?;
//! let out = cxlfs_hint::prefetch(&f, 0, 8 << 20)?;
//! println!("{} pages, {} read from NAND", out.pages, out.changed);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Version of the request layout ([`HintRequest::abi_version`]).
pub const ABI_VERSION: u32 = 1;
/// The ioctl "type" byte.
pub const IOC_MAGIC: u32 = 0xCF;
/// Bytes of `struct cxlfs_hint`.
pub const HINT_SIZE: usize = 184;
/// Bytes of the policy name fields.
pub const POLICY_LEN: usize = 16;
/// `_IOWR(0xCF, 0x01, struct cxlfs_hint)`.
pub const CXLFS_IOC_HINT: u32 = (3 << 30) | ((HINT_SIZE as u32) << 16) | (IOC_MAGIC << 8) | 0x01;

/// `enum cxlfs_hint_op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum HintOp {
    /// Bring the range into the device cache.
    Prefetch = 1,
    /// Bring it in and keep it there (counts against the VM's pin quota).
    Pin = 2,
    /// Release this VM's pins on the range.
    Unpin = 3,
    /// Drop the range from the device cache (pinned pages stay).
    Evict = 4,
    /// Switch the eviction policy (`policy`).
    SetPolicy = 5,
    /// Change the prefetcher (`degree`, `stride`).
    SetPrefetch = 6,
    /// Change the DRAM/CXL placement ratio (`percent`).
    SetCxlRatio = 7,
    /// Only fill in the statistics.
    QueryStats = 8,
    /// Zero the device's counters.
    ResetStats = 9,
}

impl HintOp {
    /// The op with this number.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => HintOp::Prefetch,
            2 => HintOp::Pin,
            3 => HintOp::Unpin,
            4 => HintOp::Evict,
            5 => HintOp::SetPolicy,
            6 => HintOp::SetPrefetch,
            7 => HintOp::SetCxlRatio,
            8 => HintOp::QueryStats,
            9 => HintOp::ResetStats,
            _ => return None,
        })
    }

    /// Whether it acts on a byte range of the file.
    pub fn is_range(self) -> bool {
        matches!(
            self,
            HintOp::Prefetch | HintOp::Pin | HintOp::Unpin | HintOp::Evict
        )
    }
}

/// `struct cxlfs_hint` (`include/cxlfs_hint.h`), as the ioctl carries it.
///
/// The layout is the compiler's: `#[repr(C)]` over the two halves, each a
/// `#[repr(C)]` struct with the header's fields in the header's order, so
/// every field lands where the C compiler puts it (`tests/c_header.rs`
/// compiles the header and compares the offset and size of every field).
/// The `IntoBytes` derive proves there is no implicit padding anywhere.
#[derive(Debug, Clone, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct CxlfsHint {
    /// The "in" fields (`abi_version` .. `policy`), bytes 0..56.
    pub req: HintRequest,
    /// The "out" fields (`pages` .. `prefetch_stride`), bytes 56..152.
    pub reply: HintReply,
    /// `reserved[4]`: zero, room for later fields.
    pub reserved: [u64; 4],
}

/// The "in" half of `struct cxlfs_hint`.
#[derive(Debug, Clone, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct HintRequest {
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// `enum cxlfs_hint_op` (raw, so that a daemon can refuse unknown ones).
    pub op: u32,
    /// File offset (range commands).
    pub offset: u64,
    /// Bytes (range commands); 0 = to the end of the file.
    pub length: u64,
    /// Prefetch degree.
    pub degree: u32,
    /// Prefetch stride in pages (0 = keep).
    pub stride: u32,
    /// DRAM/CXL ratio.
    pub percent: u32,
    /// Must be 0.
    pub flags: u32,
    /// Policy name (NUL-padded).
    pub policy: [u8; POLICY_LEN],
}

/// The "out" half of `struct cxlfs_hint`.
#[derive(Debug, Clone, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct HintReply {
    /// Pages in the range.
    pub pages: u64,
    /// Pages filled / pinned / unpinned / evicted.
    pub changed: u64,
    /// Pages left alone.
    pub skipped: u64,
    /// This VM's device page hits.
    pub hits: u64,
    /// This VM's device page misses.
    pub misses: u64,
    /// This VM's DAX pool traps.
    pub traps: u64,
    /// Bytes this VM holds pinned.
    pub pinned_bytes: u64,
    /// This VM's pin quota.
    pub pin_quota_bytes: u64,
    /// Modeled device time the command took.
    pub latency_ns: u64,
    /// The eviction policy in force (NUL-padded).
    pub current_policy: [u8; POLICY_LEN],
    /// Prefetch degree in force.
    pub prefetch_degree: u32,
    /// Prefetch stride in force.
    pub prefetch_stride: u32,
}

// The ABI is the header's: 184 bytes, the "out" half starting at byte 56
// (the halves are nested here, so that must hold for the flat C struct to
// agree), `reserved` at 152.
const _: () = assert!(core::mem::size_of::<CxlfsHint>() == HINT_SIZE);
const _: () = assert!(core::mem::size_of::<HintRequest>() == 56);
const _: () = assert!(core::mem::size_of::<HintReply>() == 96);
const _: () = assert!(core::mem::offset_of!(CxlfsHint, reply) == 56);
const _: () = assert!(core::mem::offset_of!(CxlfsHint, reserved) == 152);
const _: () = assert!(core::mem::align_of::<CxlfsHint>() == 8);
// The struct travels in the guest's byte order, which is little-endian
// (x86-64, aarch64 guests), and is read in place here in the host's: the
// native-endian fields above are only right on a little-endian host. A
// big-endian port would swap these fields for zerocopy::little_endian types.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "struct cxlfs_hint is little-endian; cxlfs-hint reads it natively"
);

impl CxlfsHint {
    /// The struct with these halves and `reserved` zero.
    pub fn new(req: HintRequest, reply: HintReply) -> Self {
        CxlfsHint {
            req,
            reply,
            reserved: [0; 4],
        }
    }
}

impl HintRequest {
    /// A request for `op` with everything else zero.
    pub fn new(op: HintOp) -> Self {
        HintRequest {
            abi_version: ABI_VERSION,
            op: op as u32,
            offset: 0,
            length: 0,
            degree: 0,
            stride: 0,
            percent: 0,
            flags: 0,
            policy: [0; POLICY_LEN],
        }
    }

    /// The policy name up to its first NUL (`None`: not UTF-8 or not terminated).
    pub fn policy_name(&self) -> Option<&str> {
        let end = self.policy.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&self.policy[..end]).ok()
    }
}

impl HintReply {
    /// The policy in force, as text.
    pub fn policy(&self) -> String {
        let end = self
            .current_policy
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(POLICY_LEN);
        String::from_utf8_lossy(&self.current_policy[..end]).into_owned()
    }
}

/// Copies `name` into a NUL-padded policy field (`None` if it does not fit).
pub fn policy_field(name: &str) -> Option<[u8; POLICY_LEN]> {
    let b = name.as_bytes();
    if b.len() >= POLICY_LEN || b.contains(&0) {
        return None;
    }
    let mut f = [0u8; POLICY_LEN];
    f[..b.len()].copy_from_slice(b);
    Some(f)
}

/// Encodes a whole `struct cxlfs_hint` (the "out" half as given, `reserved` zero).
pub fn encode(req: &HintRequest, reply: &HintReply) -> [u8; HINT_SIZE] {
    zerocopy::transmute!(CxlfsHint::new(req.clone(), reply.clone()))
}

/// Decodes both halves from the first [`HINT_SIZE`] bytes of `b` (any
/// alignment); `None` if `b` is shorter.
pub fn decode(b: &[u8]) -> Option<(HintRequest, HintReply)> {
    let (h, _) = CxlfsHint::read_from_prefix(b).ok()?;
    Some((h.req, h.reply))
}

/// Why a hint failed.
#[derive(Debug, thiserror::Error)]
pub enum HintError {
    /// The daemon refused it or the file is not on a cxlfs share; the
    /// reply's "out" fields (quota, stats) come along when the daemon sent them.
    #[error("cxlfs hint refused")]
    Refused {
        /// errno (see the header for what each means).
        #[source]
        source: std::io::Error,
        /// What the daemon reported with the error.
        reply: Box<HintReply>,
    },
    /// A policy name longer than 15 bytes.
    #[error("policy name `{0}` is too long")]
    PolicyName(String),
}

/// Issues `req` on `file` (any file or directory on the share).
#[cfg(target_os = "linux")]
pub fn hint(file: &impl std::os::fd::AsRawFd, req: &HintRequest) -> Result<HintReply, HintError> {
    let mut h = CxlfsHint::new(req.clone(), HintReply::default());
    // SAFETY: `h` is a `#[repr(C)]` `struct cxlfs_hint`, HINT_SIZE writable
    // bytes (the size CXLFS_IOC_HINT encodes), any bit pattern of which is
    // valid (FromBytes); it lives across the call; the fd is borrowed from `file`.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            CXLFS_IOC_HINT as libc::Ioctl,
            std::ptr::from_mut(&mut h),
        )
    };
    let err = (rc < 0).then(std::io::Error::last_os_error);
    let reply = h.reply;
    match err {
        None => Ok(reply),
        Some(source) => Err(HintError::Refused {
            source,
            reply: Box::new(reply),
        }),
    }
}

#[cfg(target_os = "linux")]
fn range(
    file: &impl std::os::fd::AsRawFd,
    op: HintOp,
    offset: u64,
    length: u64,
) -> Result<HintReply, HintError> {
    let mut r = HintRequest::new(op);
    r.offset = offset;
    r.length = length;
    hint(file, &r)
}

/// Brings `[offset, offset + length)` of `file` into the device cache (0 = to EOF).
#[cfg(target_os = "linux")]
pub fn prefetch(
    file: &impl std::os::fd::AsRawFd,
    offset: u64,
    length: u64,
) -> Result<HintReply, HintError> {
    range(file, HintOp::Prefetch, offset, length)
}

/// Pins a range of `file` in the device cache (0 = to EOF).
#[cfg(target_os = "linux")]
pub fn pin(
    file: &impl std::os::fd::AsRawFd,
    offset: u64,
    length: u64,
) -> Result<HintReply, HintError> {
    range(file, HintOp::Pin, offset, length)
}

/// Releases this VM's pins on a range of `file` (0 = to EOF).
#[cfg(target_os = "linux")]
pub fn unpin(
    file: &impl std::os::fd::AsRawFd,
    offset: u64,
    length: u64,
) -> Result<HintReply, HintError> {
    range(file, HintOp::Unpin, offset, length)
}

/// Drops a range of `file` from the device cache (0 = to EOF).
#[cfg(target_os = "linux")]
pub fn evict(
    file: &impl std::os::fd::AsRawFd,
    offset: u64,
    length: u64,
) -> Result<HintReply, HintError> {
    range(file, HintOp::Evict, offset, length)
}

/// Switches the device's eviction policy.
#[cfg(target_os = "linux")]
pub fn set_policy(file: &impl std::os::fd::AsRawFd, name: &str) -> Result<HintReply, HintError> {
    let mut r = HintRequest::new(HintOp::SetPolicy);
    r.policy = policy_field(name).ok_or_else(|| HintError::PolicyName(name.to_string()))?;
    hint(file, &r)
}

/// Changes the device's prefetcher (`stride` 0 keeps the current stride).
#[cfg(target_os = "linux")]
pub fn set_prefetch(
    file: &impl std::os::fd::AsRawFd,
    degree: u32,
    stride: u32,
) -> Result<HintReply, HintError> {
    let mut r = HintRequest::new(HintOp::SetPrefetch);
    r.degree = degree;
    r.stride = stride;
    hint(file, &r)
}

/// Changes the DRAM/CXL placement ratio.
#[cfg(target_os = "linux")]
pub fn set_cxl_ratio(
    file: &impl std::os::fd::AsRawFd,
    percent: u32,
) -> Result<HintReply, HintError> {
    let mut r = HintRequest::new(HintOp::SetCxlRatio);
    r.percent = percent;
    hint(file, &r)
}

/// This VM's statistics and the device's policy.
#[cfg(target_os = "linux")]
pub fn query_stats(file: &impl std::os::fd::AsRawFd) -> Result<HintReply, HintError> {
    hint(file, &HintRequest::new(HintOp::QueryStats))
}

/// Zeroes the device's counters.
#[cfg(target_os = "linux")]
pub fn reset_stats(file: &impl std::os::fd::AsRawFd) -> Result<HintReply, HintError> {
    hint(file, &HintRequest::new(HintOp::ResetStats))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ioctl_number_matches_iowr() {
        // _IOWR('\xcf', 1, 184 bytes): dir 3, size 0xb8, type 0xcf, nr 1.
        assert_eq!(CXLFS_IOC_HINT, 0xC0B8_CF01);
    }

    #[test]
    fn round_trip_and_offsets() {
        let mut req = HintRequest::new(HintOp::Pin);
        req.offset = 0x1122_3344_5566_7788;
        req.length = 4096;
        req.degree = 3;
        req.stride = 2;
        req.percent = 40;
        req.policy = policy_field("s3fifo").unwrap();
        let reply = HintReply {
            pages: 1,
            changed: 2,
            skipped: 3,
            hits: 4,
            misses: 5,
            traps: 6,
            pinned_bytes: 7,
            pin_quota_bytes: 8,
            latency_ns: 9,
            current_policy: policy_field("lru").unwrap(),
            prefetch_degree: 10,
            prefetch_stride: 11,
        };
        let b = encode(&req, &reply);
        assert_eq!(&b[0..4], &1u32.to_le_bytes());
        assert_eq!(&b[4..8], &2u32.to_le_bytes());
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[40..46], b"s3fifo");
        assert_eq!(&b[128..131], b"lru");
        assert_eq!(&b[148..152], &11u32.to_le_bytes());
        let (r2, p2) = decode(&b).unwrap();
        assert_eq!(r2, req);
        assert_eq!(p2, reply);
        assert_eq!(r2.policy_name(), Some("s3fifo"));
        assert_eq!(p2.policy(), "lru");
        assert!(decode(&b[..HINT_SIZE - 1]).is_none());
        assert!(policy_field("sixteen-bytes-xx").is_none());
        assert_eq!(HintOp::from_u32(4), Some(HintOp::Evict));
        assert_eq!(HintOp::from_u32(0), None);
    }

    #[test]
    fn decode_reads_unaligned_and_longer_buffers() {
        let mut req = HintRequest::new(HintOp::SetPrefetch);
        req.degree = 7;
        let mut buf = vec![0xAAu8];
        buf.extend_from_slice(&encode(&req, &HintReply::default()));
        buf.extend_from_slice(&[0xBB; 8]);
        let (r, p) = decode(&buf[1..]).unwrap();
        assert_eq!(r, req);
        assert_eq!(p, HintReply::default());
        assert_eq!(&encode(&req, &HintReply::default())[152..], &[0u8; 32]);
    }
}
