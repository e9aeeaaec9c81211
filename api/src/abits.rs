//! The accessed-bit area's layout, shared by the daemon that creates an
//! area, the patched QEMU that marks it (`CxlfsAbitsHeader` in
//! `qemu-configs/patches/qemu-7.2-tcg-accessed-bits.patch`) and the tests
//! that stand in for either side (DESIGN.md, "QEMU accessed bits"): a
//! 64-byte [`AreaHeader`], then one bit per 4 KiB page of the region,
//! little-endian 64-bit words.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The header's `magic`: the bytes `XLSABITS` (little-endian u64).
pub const MAGIC: u64 = u64::from_le_bytes(*b"XLSABITS");
/// The layout's version.
pub const VERSION: u32 = 1;
/// Bytes of the header; the bits follow.
pub const HEADER_BYTES: u32 = 64;
/// Bytes of memory a bit stands for.
pub const PAGE_BYTES: u64 = 4096;

/// The header (little-endian, as QEMU's `CxlfsAbitsHeader`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct AreaHeader {
    /// Daemon: [`MAGIC`].
    pub magic: u64,
    /// Daemon: [`VERSION`].
    pub version: u32,
    /// Daemon: [`HEADER_BYTES`].
    pub header_bytes: u32,
    /// Daemon: the region's pages (bits that follow).
    pub pages: u64,
    /// Daemon: how often QEMU drops the region's TLB entries (µs).
    pub period_us: u32,
    /// QEMU: 1 while it sets bits (TCG), else 0.
    pub active: u32,
    /// QEMU: re-arms done.
    pub rearms: u64,
    /// QEMU: bits it found clear and set.
    pub bits_set: u64,
    /// Zero.
    pub reserved: [u64; 2],
}

const _: () = assert!(std::mem::size_of::<AreaHeader>() == HEADER_BYTES as usize);

impl AreaHeader {
    /// The header a daemon writes for a region of `pages` pages that QEMU
    /// is to re-arm every `period_us`: QEMU's fields zero.
    pub fn new(pages: u64, period_us: u32) -> Self {
        AreaHeader {
            magic: MAGIC,
            version: VERSION,
            header_bytes: HEADER_BYTES,
            pages,
            period_us,
            ..AreaHeader::default()
        }
    }

    /// The header's bytes, as they lie at the start of an area.
    pub fn bytes(&self) -> &[u8] {
        IntoBytes::as_bytes(self)
    }

    /// The header at the start of `bytes`, if they hold one.
    pub fn read(bytes: &[u8]) -> Option<Self> {
        AreaHeader::read_from_prefix(bytes).ok().map(|(h, _)| h)
    }

    /// Bytes of the bits of `pages` pages (whole 64-bit words; at most
    /// 2^61 + 8, so never past a u64).
    pub fn bits_bytes(pages: u64) -> u64 {
        pages.div_ceil(64) * 8
    }

    /// Bytes of a whole area (header and bits) of `pages` pages.
    pub fn area_bytes(pages: u64) -> u64 {
        Self::bits_bytes(pages) + u64::from(HEADER_BYTES)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_layout_is_the_one_qemu_reads() {
        let h = AreaHeader::new(130, 50_000);
        let b = h.bytes();
        assert_eq!(&b[0..8], b"XLSABITS");
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 64);
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 130);
        assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 50_000);
        assert_eq!(std::mem::offset_of!(AreaHeader, active), 28);
        assert_eq!(std::mem::offset_of!(AreaHeader, rearms), 32);
        assert_eq!(std::mem::offset_of!(AreaHeader, bits_set), 40);
        assert_eq!(AreaHeader::read(b), Some(h));
        assert_eq!(AreaHeader::read(&b[..63]), None);
        assert_eq!(AreaHeader::area_bytes(130), 64 + 3 * 8);
        assert_eq!(AreaHeader::area_bytes(u64::MAX), 64 + (1 << 61));
    }
}
