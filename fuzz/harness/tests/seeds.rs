//! Every seed and every saved crash input (`fuzz/regressions/<target>/`)
//! through its target's harness, without libFuzzer (stable toolchain):
//! `cargo test --manifest-path fuzz/Cargo.toml -p cxlfs-fuzz-harness`.
//! The committed seed files must be what `gen-seeds` writes.

use cxlfs_fuzz_harness::{run, seeds::seeds};
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
        assert!(
            &on_disk == bytes,
            "{} is stale (run gen-seeds)",
            committed.display()
        );
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

/// The valid seeds are valid: they get past the decoders into the
/// filesystem and the hint executor (so the fuzzer starts deep).
#[test]
fn valid_seeds_succeed() {
    use cxlfs_fuzz_harness::{chain, control, fuse, hint};
    let refused = [
        "lookup_dotdot",
        "rmdir",
        "readlink",
        "setupmapping",
        "removemapping",
        "unknown_op",
        "ioctl",
    ];
    let mut wrong = Vec::new();
    for (name, bytes) in seeds("fuse_request") {
        let r = fuse::run(&bytes);
        let ok = match name.as_str() {
            "forget" | "batch_forget" | "interrupt" | "no_room" => r.is_none(),
            n if refused.contains(&n) => r.is_some_and(|e| e < 0),
            _ => r == Some(0),
        };
        if !ok {
            wrong.push(format!("fuse_request/{name}: {r:?}"));
        }
    }
    for (name, bytes) in seeds("hint_ioctl") {
        let r = hint::run(&bytes);
        let ok = match name.as_str() {
            "other_ioctl" => r == Err(-libc::ENOTTY),
            "short" => r == Err(-libc::EINVAL),
            "bad_version" | "pin_on_dir" => r.is_ok_and(|e| e < 0),
            _ => r == Ok(0),
        };
        if !ok {
            wrong.push(format!("hint_ioctl/{name}: {r:?}"));
        }
    }
    for (name, bytes) in seeds("control_line") {
        let bad = [
            "bad_json",
            "not_object",
            "bad_version",
            "unknown_cmd",
            "extra_field",
        ];
        if control::run(&bytes) == bad.contains(&name.as_str()) {
            wrong.push(format!("control_line/{name}"));
        }
    }
    for (name, bytes) in seeds("chain_walk") {
        let r = chain::run(&bytes);
        let ok = match name.as_str() {
            "outside_memory" => r.is_none(),
            "one_readable" | "cycle" | "across_regions" => r.is_some_and(|(_, w)| w == 0),
            _ => r.is_some_and(|(r, w)| r > 0 && w > 0),
        };
        if !ok {
            wrong.push(format!("chain_walk/{name}: {r:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
