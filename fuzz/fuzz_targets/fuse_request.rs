//! The `fuse_request` target: see `cxlfs_fuzz_harness::fuse`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cxlfs_fuzz_harness::run("fuse_request", data));
