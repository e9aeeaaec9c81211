//! The cxlfs CXL-SSD device model.
//!
//! A memory-semantic SSD: a DRAM cache of 4 KiB pages (set-associative or
//! fully associative, pluggable eviction policies, next-N prefetch, MSHR
//! coalescing, write-back / write-allocate) in front of NAND flash with
//! FEMU-style per-LUN and per-channel busy timelines, a page-mapped FTL and
//! greedy garbage collection.
//!
//! The model is pure and deterministic: it never reads a clock and does no
//! I/O. Every call takes the arrival time in nanoseconds and returns when the
//! operation completes; callers (the replay front end, the daemon) decide how
//! to pace real time. Same inputs, same outputs.
//!
//! ```
//! use cxlfs_device_model::{Device, DeviceConfig, Op};
//! let cfg = DeviceConfig::default().with_overrides(&["cache.size_bytes=1MiB"]).unwrap();
//! let mut dev = Device::new(cfg).unwrap();
//! let first = dev.access(0, Op::Read, 0x1000, 64).unwrap();
//! assert!(!first.hit);
//! let again = dev.access(first.completes_at_ns, Op::Read, 0x1000, 64).unwrap();
//! assert!(again.hit);
//! ```

pub mod arrival;
pub mod cache;
pub mod config;
pub mod device;
pub mod mrc;
pub mod nand;
pub mod policy;
pub mod presets;
pub mod replay;
pub mod slot;
pub mod trace;
pub mod units;
pub mod workload;
pub mod write_log;

pub use config::{DeviceConfig, LoadConfigError, PolicyKind};
pub use device::{AccessError, Device, DeviceStats, Op, Outcome, PageFilter, References};

/// Size of a cache page and of a NAND page.
pub const PAGE_SIZE: u64 = 4096;
/// log2 of [`PAGE_SIZE`].
pub const PAGE_SHIFT: u32 = 12;
