//! Every seed and every saved crash input (`fuzz/regressions/<target>/`)
//! through its target's harness, without libFuzzer (stable toolchain):
//! `cargo test --manifest-path fuzz/Cargo.toml -p cxlfs-fuzz-harness`.
//! The committed seed files must be what `gen-seeds` writes.

use cxlfs_fuzz_harness::{run, seeds::seeds, TARGETS};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd.map(|e| e.expect("a directory entry").path()).collect();
    v.sort();
    v
}

fn replay(target: &str) {
    let generated = seeds(target);
    assert!(!generated.is_empty());
    for (name, bytes) in &generated {
        let committed = fuzz_dir().join("corpus").join(target).join(name);
        let on_disk = std::fs::read(&committed)
            .unwrap_or_else(|e| panic!("{}: {e} (run gen-seeds)", committed.display()));
        assert!(&on_disk == bytes, "{} is stale (run gen-seeds)", committed.display());
        run(target, bytes);
    }
    for f in files(&fuzz_dir().join("regressions").join(target)) {
        let bytes = std::fs::read(&f).expect("read a saved input");
        eprintln!("replaying {}", f.display());
        run(target, &bytes);
    }
}

#[test]
fn fuse_request() {
    replay("fuse_request");
}

#[test]
fn control_line() {
    replay("control_line");
}

#[test]
fn hint_ioctl() {
    replay("hint_ioctl");
}

#[test]
fn chain_walk() {
    replay("chain_walk");
}
