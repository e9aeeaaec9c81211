//! The daemon's public wire types, shared by `cxlfsd` and its clients
//! (`cxlfs ctl`, `cxlfs run`, the e2e harness), so that no client keeps a
//! second copy of a command list or parses the daemon's output back from text.
//!
//! * [`abits`] — the accessed-bit area's layout, shared with the patched
//!   QEMU that marks it;
//! * [`control`] — the control socket's JSON-lines protocol;
//! * [`dax`] — the settings of the DAX window's residency plane, parsed
//!   once for the daemon and the runner;
//! * [`hits`] — the settings of the daemon's hit sources (access sampling,
//!   accessed bits), parsed once for the daemon and the runner;
//! * [`metrics`] — the metrics snapshot (the `/metrics.json` endpoint and
//!   the `--metrics-file` JSON lines).

pub mod abits;
pub mod control;
pub mod dax;
pub mod hits;
pub mod metrics;
