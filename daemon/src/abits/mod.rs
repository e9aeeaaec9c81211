//! Accessed bits, the preferred hit source (`--access-bits on`, the
//! default): a bit area per VM region beside the VM's socket
//! (`SOCKET.dax-abits` for its DAX window, `SOCKET.cxl-abits` for its CXL
//! memory region), which the VM's QEMU maps and marks: a vCPU's TLB fill
//! of a page sets the page's bit, and QEMU drops the region's TLB entries
//! every period (`--access-bits-period`), so the next access marks again ([`area`]; the
//! protocol: DESIGN.md, "QEMU accessed bits"). The scanner ([`scanner`])
//! reads and clears the bits every period and tells the device's policy of
//! each page as a reference (a hit, no latency, no NAND work), in one
//! device transaction a scan. The window's bits reach pool pages through
//! the VM's slot table; a region's bits are its pages. A VM whose VMM does
//! not attach its area (KVM, a stock QEMU) is left to access sampling.

mod area;
pub mod scanner;

pub use area::{AreaHeader, AreaState, BitArea, CreateAreaError, HEADER_BYTES, MAGIC, VERSION};
pub use scanner::AccessBitsSource;

use crate::hits::RegionKind;
use std::path::Path;
use std::time::Duration;

/// One VM region's area, before the scanner takes it.
#[derive(Debug)]
pub struct VmArea {
    /// The VM.
    pub vm: String,
    /// Which of its regions.
    pub region: RegionKind,
    /// The area.
    pub area: BitArea,
}

/// Creates `region`'s area of `region_bytes` for VM `vm` beside `socket`,
/// for QEMU to re-arm every `period`.
pub fn create_area(
    vm: &str,
    socket: &Path,
    region: RegionKind,
    region_bytes: u64,
    period: Duration,
) -> Result<VmArea, CreateAreaError> {
    let period_us = u32::try_from(period.as_micros()).unwrap_or(u32::MAX);
    let area = BitArea::create(&region.area_path(socket), region_bytes, period_us)?;
    tracing::info!(vm, region = region.as_str(), path = %area.path().display(), pages = area.pages(), "accessed-bit area ready for the VMM");
    Ok(VmArea {
        vm: vm.to_string(),
        region,
        area,
    })
}
