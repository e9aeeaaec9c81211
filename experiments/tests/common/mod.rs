//! What the `cxlfs` binary's tests share.

use std::process::{Command, Output};

/// A small device: the FEMU preset with a 4 MiB cache.
pub const SMALL: [&str; 4] = ["--preset", "femu", "--set", "cache.size_bytes=4MiB"];

/// Runs the `cxlfs` binary with `args`.
pub fn cxlfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cxlfs"))
        .args(args)
        .output()
        .expect("run cxlfs")
}
