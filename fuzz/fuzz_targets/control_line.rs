//! The `control_line` target: see `cxlfs_fuzz_harness::control`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cxlfs_fuzz_harness::run("control_line", data));
