//! `cxlfs-hint`: cache hints from applications inside a cxlfs guest.
//!
//! An application opens a file on the virtio-fs share and asks the emulated
//! CXL-SSD to prefetch, pin, unpin or evict a range of it, or (on any file
//! or the share's directory) to change the policy or the prefetcher, or to
//! report its statistics. The request is one ioctl, [`CXLFS_IOC_HINT`], that
//! the guest kernel forwards to `cxlfsd` as `FUSE_IOCTL`: no guest kernel
//! change. The layout is [`HINT_SIZE`] bytes, little-endian, the same as
//! `include/cxlfs_hint.h`; `cxlfsd` decodes it with this crate.
//!
//! ```no_run
//! let f = std::fs::File::open("/mnt/data.bin")?;
//! let out = cxlfs_hint::prefetch(&f, 0, 8 << 20)?;
//! println!("{} pages, {} read from NAND", out.pages, out.changed);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

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

/// The "in" half of `struct cxlfs_hint`.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// The "out" half of `struct cxlfs_hint`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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

fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Byte offsets of the fields (as laid out by the C compiler; see the header).
mod at {
    pub const ABI_VERSION: usize = 0;
    pub const OP: usize = 4;
    pub const OFFSET: usize = 8;
    pub const LENGTH: usize = 16;
    pub const DEGREE: usize = 24;
    pub const STRIDE: usize = 28;
    pub const PERCENT: usize = 32;
    pub const FLAGS: usize = 36;
    pub const POLICY: usize = 40;
    pub const PAGES: usize = 56;
    pub const CHANGED: usize = 64;
    pub const SKIPPED: usize = 72;
    pub const HITS: usize = 80;
    pub const MISSES: usize = 88;
    pub const TRAPS: usize = 96;
    pub const PINNED_BYTES: usize = 104;
    pub const PIN_QUOTA_BYTES: usize = 112;
    pub const LATENCY_NS: usize = 120;
    pub const CURRENT_POLICY: usize = 128;
    pub const PREFETCH_DEGREE: usize = 144;
    pub const PREFETCH_STRIDE: usize = 148;
}

/// Encodes a whole `struct cxlfs_hint` (the "out" half as given).
pub fn encode(req: &HintRequest, reply: &HintReply) -> [u8; HINT_SIZE] {
    let mut b = [0u8; HINT_SIZE];
    put_u32(&mut b, at::ABI_VERSION, req.abi_version);
    put_u32(&mut b, at::OP, req.op);
    put_u64(&mut b, at::OFFSET, req.offset);
    put_u64(&mut b, at::LENGTH, req.length);
    put_u32(&mut b, at::DEGREE, req.degree);
    put_u32(&mut b, at::STRIDE, req.stride);
    put_u32(&mut b, at::PERCENT, req.percent);
    put_u32(&mut b, at::FLAGS, req.flags);
    b[at::POLICY..at::POLICY + POLICY_LEN].copy_from_slice(&req.policy);
    put_u64(&mut b, at::PAGES, reply.pages);
    put_u64(&mut b, at::CHANGED, reply.changed);
    put_u64(&mut b, at::SKIPPED, reply.skipped);
    put_u64(&mut b, at::HITS, reply.hits);
    put_u64(&mut b, at::MISSES, reply.misses);
    put_u64(&mut b, at::TRAPS, reply.traps);
    put_u64(&mut b, at::PINNED_BYTES, reply.pinned_bytes);
    put_u64(&mut b, at::PIN_QUOTA_BYTES, reply.pin_quota_bytes);
    put_u64(&mut b, at::LATENCY_NS, reply.latency_ns);
    b[at::CURRENT_POLICY..at::CURRENT_POLICY + POLICY_LEN].copy_from_slice(&reply.current_policy);
    put_u32(&mut b, at::PREFETCH_DEGREE, reply.prefetch_degree);
    put_u32(&mut b, at::PREFETCH_STRIDE, reply.prefetch_stride);
    b
}

/// Decodes both halves; `None` if `b` is shorter than [`HINT_SIZE`].
pub fn decode(b: &[u8]) -> Option<(HintRequest, HintReply)> {
    if b.len() < HINT_SIZE {
        return None;
    }
    let mut policy = [0u8; POLICY_LEN];
    policy.copy_from_slice(&b[at::POLICY..at::POLICY + POLICY_LEN]);
    let mut current_policy = [0u8; POLICY_LEN];
    current_policy.copy_from_slice(&b[at::CURRENT_POLICY..at::CURRENT_POLICY + POLICY_LEN]);
    Some((
        HintRequest {
            abi_version: get_u32(b, at::ABI_VERSION),
            op: get_u32(b, at::OP),
            offset: get_u64(b, at::OFFSET),
            length: get_u64(b, at::LENGTH),
            degree: get_u32(b, at::DEGREE),
            stride: get_u32(b, at::STRIDE),
            percent: get_u32(b, at::PERCENT),
            flags: get_u32(b, at::FLAGS),
            policy,
        },
        HintReply {
            pages: get_u64(b, at::PAGES),
            changed: get_u64(b, at::CHANGED),
            skipped: get_u64(b, at::SKIPPED),
            hits: get_u64(b, at::HITS),
            misses: get_u64(b, at::MISSES),
            traps: get_u64(b, at::TRAPS),
            pinned_bytes: get_u64(b, at::PINNED_BYTES),
            pin_quota_bytes: get_u64(b, at::PIN_QUOTA_BYTES),
            latency_ns: get_u64(b, at::LATENCY_NS),
            current_policy,
            prefetch_degree: get_u32(b, at::PREFETCH_DEGREE),
            prefetch_stride: get_u32(b, at::PREFETCH_STRIDE),
        },
    ))
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
    let mut buf = encode(req, &HintReply::default());
    // SAFETY: `buf` is HINT_SIZE writable bytes, the size CXLFS_IOC_HINT
    // encodes, and it lives across the call; the fd is borrowed from `file`.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            CXLFS_IOC_HINT as libc::Ioctl,
            buf.as_mut_ptr(),
        )
    };
    let err = (rc < 0).then(std::io::Error::last_os_error);
    let reply = decode(&buf).map(|(_, r)| r).unwrap_or_default();
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
    fn c_header_agrees() {
        // The header is the other definition of the ABI: compile it and
        // print sizeof/offsetof when a C compiler is around.
        let dir = std::env::temp_dir().join(format!("cxlfs-hint-abi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("abi.c");
        std::fs::write(
            &src,
            r#"#include <stdio.h>
#include <stddef.h>
#include "cxlfs_hint.h"
int main(void) {
    printf("%zu %zu %zu %zu %zu %lu\n", sizeof(struct cxlfs_hint),
        offsetof(struct cxlfs_hint, policy), offsetof(struct cxlfs_hint, pages),
        offsetof(struct cxlfs_hint, current_policy), offsetof(struct cxlfs_hint, prefetch_stride),
        (unsigned long)CXLFS_IOC_HINT);
    return 0;
}
"#,
        )
        .unwrap();
        let include = concat!(env!("CARGO_MANIFEST_DIR"), "/include");
        let exe = dir.join("abi");
        let Ok(out) = std::process::Command::new("cc")
            .args(["-I", include, "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
        else {
            eprintln!("no C compiler: skipping the header check");
            return;
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let run = std::process::Command::new(&exe).output().unwrap();
        let text = String::from_utf8(run.stdout).unwrap();
        assert_eq!(
            text.trim(),
            format!("{HINT_SIZE} 40 56 128 148 {}", CXLFS_IOC_HINT)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
