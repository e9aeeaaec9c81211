//! The share a run's guests mount, prepared before `cxlfsd` starts: the
//! guest script (`.cxlfs/run.sh`), the fio job files, the per-VM output and
//! barrier directories, and the spec's files, filled with deterministic bytes.

use super::command_lines::template_base;
use super::tools::Tools;
use crate::guest_script;
use crate::spec::{size_value, RunPlan};
use anyhow::{Context, Result};
use std::fs;
use std::io::Write;
use std::path::Path;

/// Fills `share` for the guests `vms` of `plan`; the guest script is also
/// kept as `guest-run.sh` in `run_dir`.
pub(super) fn prepare_share(
    plan: &RunPlan,
    tools: &Tools,
    share: &Path,
    run_dir: &Path,
    vms: &[String],
) -> Result<()> {
    for vm in vms {
        fs::create_dir_all(share.join(".cxlfs/out").join(vm))?;
    }
    fs::create_dir_all(share.join(".cxlfs/sync"))?;
    let script = guest_script::script(&plan.spec, &template_base(plan))?;
    fs::write(share.join(".cxlfs/run.sh"), &script)?;
    fs::write(run_dir.join("guest-run.sh"), &script)?;
    for (k, phase) in plan.spec.phases.iter().enumerate() {
        if let Some(j) = guest_script::job_file(&plan.spec, phase) {
            let src = tools.spec_dir.join(&j);
            let dst = share.join(".cxlfs/jobs").join(format!("{k}.fio"));
            fs::create_dir_all(share.join(".cxlfs/jobs"))?;
            fs::copy(&src, &dst).with_context(|| format!("fio.job_file {}", src.display()))?;
        }
    }
    create_files(plan, share)
}

/// Fills `path` with `len` deterministic pseudo-random bytes (splitmix64
/// seeded by the file's name: same spec, same bytes).
fn fill_file(path: &Path, name: &str, len: u64) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d)?;
    }
    let mut state = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut f = std::io::BufWriter::with_capacity(1 << 20, fs::File::create(path)?);
    let mut left = len;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        for chunk in buf.chunks_mut(8) {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()
}

/// Creates the spec's files in `share`.
fn create_files(plan: &RunPlan, share: &Path) -> Result<()> {
    for f in &plan.spec.files {
        let len = size_value(&f.size).map_err(anyhow::Error::msg)?;
        for i in 0..f.count {
            let name = f.path.replace("{i}", &i.to_string());
            fill_file(&share.join(&name), &name, len)
                .with_context(|| format!("creating {name} ({len} bytes) in the share"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::run_cmd::test_spec::SPEC;
    use crate::spec::load_str;

    #[test]
    fn files_are_filled_deterministically() {
        let dir = tempfile::tempdir().unwrap();
        let plans = load_str("t.toml", SPEC, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        create_files(&plans[0], dir.path()).unwrap();
        let a = fs::read(dir.path().join("f0.bin")).unwrap();
        let b = fs::read(dir.path().join("f1.bin")).unwrap();
        assert_eq!(a.len(), 1 << 20);
        assert_ne!(a, b);
        assert_ne!(&a[..4096], &a[4096..8192]);
        fill_file(&dir.path().join("again"), "f0.bin", 1 << 20).unwrap();
        assert_eq!(fs::read(dir.path().join("again")).unwrap(), a);
    }
}
