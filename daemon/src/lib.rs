//! `cxlfsd`: a multi-VM vhost-user virtio-fs back-end whose data path is
//! timed by the cxlfs CXL-SSD device model.
//!
//! Layers, each depending only on those below it (`DESIGN.md` has the
//! picture; `daemon/tests/module_graph.rs` fails on an import cycle, among
//! these or among the submodules of any module):
//! * [`daemon`] (+ `main.rs`) — the only place that knows every type: wires
//!   the layers, one serving thread per VM, reconnects, shutdown;
//! * [`backend`] — the vhost-user transport of one connection: vring
//!   workers, zero-copy payloads, the pacer;
//! * [`control`] — cache control at run time: the socket, the executor, the
//!   guest hint ioctl (the server's ioctl seam);
//! * [`memory`] — memory mode: CXL memory regions (a CPU-less NUMA node
//!   per VM) on the same device, served by split planes;
//! * [`dax`] — the DAX window: the residency plane's back-end, each VM's
//!   slot table (the server's DAX mapper), coherence for the timing layer;
//! * [`timing`] — wraps any [`server::FileSystem`] and charges the device;
//! * [`passthrough`] — host I/O over the shared directory;
//! * [`server`] — the FUSE server `Server<F: FileSystem>`: decode,
//!   dispatch, encode; the `FileSystem` trait and the two seams;
//! * [`device`] — the pool allocator, placement, the locked device and its
//!   clock, its events;
//! * [`metrics`] — counters, histograms, the endpoints (uses only `sync`);
//! * [`config`] — command line and `daemon.toml`, validated once;
//! * [`ids`], [`abi`] (the FUSE ABI crate), [`signals`], `sync` (the
//!   poison-tolerant lock every module uses) — leaves.

pub mod abi;
pub mod backend;
pub mod config;
pub mod control;
pub mod daemon;
pub mod dax;
pub mod device;
pub mod ids;
pub mod memory;
pub mod metrics;
pub mod passthrough;
pub mod sandbox;
pub mod server;
pub mod signals;
mod sync;
pub mod timing;
