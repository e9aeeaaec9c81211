//! The `hint_ioctl` target: see `cxlfs_fuzz_harness::hint`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cxlfs_fuzz_harness::run("hint_ioctl", data));
