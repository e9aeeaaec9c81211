//! `cxlfsd`: a multi-VM vhost-user virtio-fs back-end whose data path is
//! timed by the cxlfs CXL-SSD device model.
//!
//! The library is the daemon's own code; its public surface is what the
//! binary (`main.rs`), the integration tests and benches (`daemon/tests`,
//! `daemon/benches`) and the fuzz harness (`fuzz/`) use, and no more
//! (vhost-user-backend's shape: private modules, a small re-exported API):
//! * the public modules [`abi`] (the FUSE ABI crate, re-exported),
//!   [`server`] (the FUSE server `Server<F: FileSystem>`, the
//!   [`server::FileSystem`] trait and its types, the payload and seam
//!   traits) and [`sandbox`] (the confinement steps, in their order);
//! * at the crate root, what runs the daemon: the configuration
//!   ([`Cli`], [`DaemonConfig`], [`VmSpec`]), the shared state and its
//!   sessions ([`DaemonState`], [`listen`], [`SessionOptions`]), the
//!   device ([`SharedDevice`], [`Placement`]), memory mode
//!   ([`MemoryRegions`]), access sampling ([`AccessSampler`]), the control socket ([`ControlSocket`]), the
//!   metrics ([`serve_metrics`], [`MetricsFileWriter`],
//!   [`render_prometheus`]), termination signals; the filesystem stack the
//!   tests build by hand ([`PassthroughFs`] under [`TimedFs`]); and the
//!   parts the fuzz harness drives alone ([`ChainBufs`], [`HintHandler`]
//!   with its [`Controller`]).
//!
//! Inside, layers each depend only on those below them (`DESIGN.md` has the
//! picture; `daemon/tests/module_graph.rs` fails on an import cycle, among
//! these or among the submodules of any module):
//! * `daemon` (+ `main.rs`) — the only place that knows every type: wires
//!   the layers, one serving thread per VM, reconnects, shutdown;
//! * `sampler` — access sampling's thread: arms resident pages of the DAX
//!   pool and the memory regions so that their next access traps;
//! * `backend` — the vhost-user transport of one connection: vring
//!   workers, zero-copy payloads, the pacer;
//! * `control` — cache control at run time: the socket, the executor, the
//!   guest hint ioctl (the server's ioctl seam);
//! * `memory` — memory mode: CXL memory regions (a CPU-less NUMA node
//!   per VM) on the same device, served by split planes;
//! * `dax` — the DAX window: the residency plane's back-end, each VM's
//!   slot table (the server's DAX mapper), coherence for the timing layer;
//! * `timing` — wraps any [`server::FileSystem`] and charges the device;
//! * `passthrough` — host I/O over the shared directory;
//! * [`server`] — decode, dispatch, encode; the `FileSystem` trait and the
//!   two seams;
//! * `device` — the pool allocator, placement, the locked device and its
//!   clock, its events;
//! * `metrics` — counters, histograms, the endpoints (uses only `sync`);
//! * `config` — command line and `daemon.toml`, validated once;
//! * `ids`, [`abi`], `signals`, `heap` (the allocator's free memory back
//!   to the host every minute), `sync` (the poison-tolerant lock every
//!   module uses) — leaves; [`sandbox`] beside them.

pub mod abi;
pub mod abits;
mod backend;
mod config;
mod control;
mod daemon;
mod dax;
mod device;
mod heap;
pub mod hits;
mod ids;
mod memory;
mod metrics;
mod passthrough;
mod sampler;
pub mod sandbox;
pub mod server;
mod signals;
mod sync;
mod timing;

// Running the daemon (`main.rs`): configuration, the shared state and its
// sessions, the sockets, the metrics endpoints, termination signals.
pub use backend::{make_daemon_realtime, FsTag, MakeRealtimeError, QueueOptions};
pub use config::{Cli, DaemonConfig, FileConfig, VmSpec, DEFAULT_MAX_OPEN_FILES};
pub use control::{ControlSocket, StartControlError};
pub use daemon::{listen, DaemonState, Features, ListeningVm, SessionOptions, VmServer};
pub use device::placement::{tier_at, Placement, Tier};
pub use device::{DeviceObserver, LockTimesSnapshot, Publish, SharedDevice, EXTENT_SIZE, PAGE};
pub use heap::{spawn_heap_trimmer, trim_heap, HEAP_TRIM_EVERY};
pub use ids::FileKey;
pub use memory::{MemoryRegions, RegionPlane};
pub use metrics::file::MetricsFileWriter;
pub use metrics::{render_prometheus, serve as serve_metrics, Metrics, VmMetrics};
pub use passthrough::{CacheMode, GuestIds, IdMap, PassthroughFs};
pub use sampler::AccessSampler;
pub use signals::{block_termination_signals, wait_for_termination};
pub use timing::TimedFs;

// The pieces the fuzz harness drives on their own: a descriptor chain's
// buffers and the guest hint ioctl with its controller.
pub use backend::chain::ChainBufs;
pub use control::hint::HintHandler;
pub use control::{ControlOptions, Controller, DevicePlacement, Planes};
