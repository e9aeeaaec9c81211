//! What the `cargo fuzz` targets of `fuzz/` do with one input, and the
//! seed inputs they start from.
//!
//! Each target is `fuzz_target!(|data| harness::<target>::run(data))`; the
//! work is here so that it builds on stable, and `tests/seeds.rs` replays
//! every committed seed (and every saved crash) without libFuzzer.
//! A harness panics when the code under test breaks a promise it makes
//! (a reply longer than the room it was given, a bad header, a parse that
//! does not survive its own encoding), not only when the code panics.

pub mod chain;
pub mod control;
pub mod fuse;
pub mod hint;
pub mod seeds;

/// The fuzz targets, by name (`fuzz/fuzz_targets/<name>.rs`,
/// `fuzz/corpus/<name>/`).
pub const TARGETS: &[&str] = &["fuse_request", "control_line", "hint_ioctl", "chain_walk"];

/// Runs one input through the target `name`.
///
/// # Panics
/// On an unknown target, and wherever the target's harness finds a bug.
pub fn run(name: &str, data: &[u8]) {
    match name {
        "fuse_request" => drop(fuse::run(data)),
        "control_line" => drop(control::run(data)),
        "hint_ioctl" => drop(hint::run(data)),
        "chain_walk" => drop(chain::run(data)),
        _ => panic!("unknown fuzz target {name}"),
    }
}

/// Reads a little-endian integer from the front of `data`, advancing it;
/// missing bytes read as zero (fuzz inputs may be short).
pub(crate) fn take<const N: usize>(data: &mut &[u8]) -> [u8; N] {
    let mut b = [0u8; N];
    let n = N.min(data.len());
    b[..n].copy_from_slice(&data[..n]);
    *data = &data[n..];
    b
}
