//! `cxlfsd`: a multi-VM vhost-user virtio-fs back-end whose data path is
//! timed by the cxlfs CXL-SSD device model.
//!
//! Module map:
//! * [`abi`] — FUSE kernel ABI structs, decoded without `unsafe` (re-exported
//!   from `residency::fuse_abi`, shared with the residency plane);
//! * [`fs`] — the passthrough filesystem over the shared directory (one per VM session);
//! * [`fuse`] — the FUSE request dispatcher (bytes in, reply bytes + release time out);
//! * [`pool`] — the pool address allocator and the one shared device model;
//! * [`placement`] — DRAM / CXL placement of file pages (`cxl_ratio`);
//! * [`dax`] — the DAX window: the residency plane's back-end and each VM's slot table;
//! * [`metrics`] — per-VM counters, latency histograms and their exports: the
//!   Prometheus and JSON endpoint, the JSON-lines time series (`--metrics-file`);
//!   a leaf that knows no other daemon module;
//! * [`metrics_sources`] — the daemon's figures for [`metrics`]: the device
//!   and residency-plane providers, charges as device work;
//! * [`backend`] — the vhost-user back-end of one connection: vring workers and the pacer;
//! * [`config`] — command line and `daemon.toml`;
//! * [`control`] — cache control at run time: the control socket and its executor;
//! * [`hint_ioctl`] — `FUSE_IOCTL` cache hints from guest applications;
//! * [`daemon`] — one serving thread per VM, reconnects, shutdown;
//! * [`signals`] — SIGINT / SIGTERM.

pub mod abi;
pub mod backend;
pub mod chain;
pub mod config;
pub mod control;
pub mod daemon;
pub mod dax;
pub mod fs;
pub mod fuse;
pub mod hint_ioctl;
pub mod metrics;
pub mod metrics_sources;
pub mod placement;
pub mod pool;
pub mod signals;
