//! The library half of the `cxlfs` package: host-side pieces shared by the
//! `cxlfs run` experiment runner and the end-to-end test harness
//! (`cxlfs-e2e`), which both start `cxlfsd` and QEMU guests and read the
//! daemon's metrics.
//!
//! * [`procs`]: signals, process trees through `/proc`, waiting with a
//!   limit, a plain HTTP GET, log tails;
//! * [`prometheus`]: the Prometheus text exposition as samples with labels
//!   (for the e2e tests of the endpoint itself);
//! * [`guest_log`]: the kernel crash (oops, BUG, panic) in a guest's serial
//!   log, for errors that say why a guest's command never ran.

pub mod guest_log;
pub mod procs;
pub mod prometheus;
