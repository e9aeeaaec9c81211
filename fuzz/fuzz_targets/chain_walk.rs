//! The `chain_walk` target: see `cxlfs_fuzz_harness::chain`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cxlfs_fuzz_harness::run("chain_walk", data));
