//! Writes the seed corpora: `fuzz/corpus/<target>/<seed>` for every target
//! (`cargo run --manifest-path fuzz/Cargo.toml -p cxlfs-fuzz-harness --bin gen-seeds`).
//! Files libFuzzer added to a corpus are left alone.

use cxlfs_fuzz_harness::{seeds::seeds, TARGETS};
use std::path::Path;

fn main() -> std::io::Result<()> {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus");
    for target in TARGETS {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir)?;
        let list = seeds(target);
        for (name, bytes) in &list {
            std::fs::write(dir.join(name), bytes)?;
        }
        println!("{target}: {} seeds in {}", list.len(), dir.display());
    }
    Ok(())
}
