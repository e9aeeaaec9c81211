//! The library half of the `cxlfs` package: host-side pieces shared by the
//! `cxlfs run` experiment runner and the end-to-end test harness
//! (`cxlfs-e2e`), which both start `cxlfsd` and QEMU guests and read the
//! daemon's metrics.
//!
//! * [`procs`]: signals, process trees through `/proc`, waiting with a
//!   limit, a plain HTTP GET, log tails;
//! * [`prometheus`]: the Prometheus text exposition as samples with labels
//!   (for the e2e tests of the endpoint itself).

pub mod procs;
pub mod prometheus;
