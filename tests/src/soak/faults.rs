//! The faults a soak injects, their schedule, and the ones done on the host
//! alone: a share that fills up (ENOSPC), a mapped file truncated or
//! deleted under the guests, and storms on the control socket.
//! (SIGKILL of a VM and SIGSTOP of the daemon need the soak's processes:
//! `soak/mod.rs`.)

use crate::cxlfs_cli;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL of one VM's QEMU, then the VM booted again under its name.
    KillVm,
    /// SIGSTOP of one VM's QEMU for a few seconds (under the daemon's DAX
    /// reply timeout), then SIGCONT: a front-end that answers nothing,
    /// SETUPMAPPING's map requests included, while its guest is frozen.
    StallVm,
    /// SIGSTOP of the daemon for a few seconds, then SIGCONT.
    StopDaemon,
    /// The share's file system filled up on the host, then freed.
    Enospc,
    /// The file the guests map truncated to nothing on the host, then
    /// written again.
    TruncateMapped,
    /// The file the guests map deleted on the host, then created again.
    DeleteMapped,
    /// Policy switches, evictions of everything, CXL-ratio changes and pins
    /// up to the quota and back, back to back on the control socket.
    ControlStorm,
}

impl Fault {
    /// Every fault, in the order a schedule takes them.
    pub const ALL: [Fault; 7] = [
        Fault::ControlStorm,
        Fault::TruncateMapped,
        Fault::KillVm,
        Fault::Enospc,
        Fault::StallVm,
        Fault::DeleteMapped,
        Fault::StopDaemon,
    ];

    /// The name in logs and the final table.
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillVm => "SIGKILL a VM + restart",
            Fault::StallVm => "front-end silent (SIGSTOP)",
            Fault::StopDaemon => "SIGSTOP/SIGCONT daemon",
            Fault::Enospc => "ENOSPC on the share",
            Fault::TruncateMapped => "truncate a mapped file",
            Fault::DeleteMapped => "delete a mapped file",
            Fault::ControlStorm => "control-socket storm",
        }
    }
}

/// When each fault starts: `rounds` passes over [`Fault::ALL`], spread
/// evenly between `warmup` and `end - cooldown`.
pub fn schedule(
    warmup: Duration,
    end: Duration,
    cooldown: Duration,
    rounds: u32,
) -> Vec<(Duration, Fault)> {
    let n = Fault::ALL.len() as u32 * rounds.max(1);
    let span = end.saturating_sub(warmup + cooldown);
    (0..n)
        .map(|i| {
            let at = warmup + span * i / n;
            (at, Fault::ALL[i as usize % Fault::ALL.len()])
        })
        .collect()
}

/// Fills the file system under `share` with a ballast file, in chunks
/// down to 64 KiB until nothing more fits, topped up each second while it
/// is held (the guests free space too), then removes it.
pub fn fill_share(share: &Path, hold: Duration) -> Result<String, String> {
    let ballast = share.join("soak/.ballast");
    let f = fs::File::create(&ballast).map_err(|e| format!("create ballast: {e}"))?;
    let mut filled = 0u64;
    let mut top_up = || {
        let mut chunk = 16u64 << 20;
        while chunk >= 64 << 10 {
            if fallocate(&f, filled, chunk).is_ok() {
                filled += chunk;
            } else {
                chunk /= 4;
            }
        }
    };
    let t = Instant::now();
    top_up();
    let mut least_free = u64::MAX;
    while t.elapsed() < hold {
        std::thread::sleep(Duration::from_secs(1));
        least_free = least_free.min(free_bytes(share)?);
        top_up();
    }
    fs::remove_file(&ballast).map_err(|e| format!("remove ballast: {e}"))?;
    Ok(format!(
        "{} MiB ballast, at most {} KiB left free, held {hold:?}",
        filled >> 20,
        least_free >> 10
    ))
}

/// Allocates `len` bytes of `f` from `offset` (`fallocate(2)`: tmpfs
/// takes the pages now).
fn fallocate(f: &fs::File, offset: u64, len: u64) -> Result<(), String> {
    rustix::fs::fallocate(f, rustix::fs::FallocateFlags::empty(), offset, len)
        .map_err(|e| e.to_string())
}

/// Free bytes of the file system that holds `p` (`statvfs`).
pub fn free_bytes(p: &Path) -> Result<u64, String> {
    let st = rustix::fs::statvfs(p).map_err(|e| e.to_string())?;
    Ok(st.f_bavail * st.f_frsize)
}

/// Truncates the mapped file to nothing, waits `hold`, writes it again.
pub fn truncate_mapped(file: &Path, bytes: &[u8], hold: Duration) -> Result<String, String> {
    let f = fs::OpenOptions::new()
        .write(true)
        .open(file)
        .map_err(|e| format!("open {}: {e}", file.display()))?;
    f.set_len(0).map_err(|e| format!("truncate: {e}"))?;
    std::thread::sleep(hold);
    fs::write(file, bytes).map_err(|e| format!("rewrite: {e}"))?;
    Ok(format!("truncated to 0 for {hold:?}, rewritten"))
}

/// Deletes the mapped file, waits `hold`, creates it again.
pub fn delete_mapped(file: &Path, bytes: &[u8], hold: Duration) -> Result<String, String> {
    fs::remove_file(file).map_err(|e| format!("delete {}: {e}", file.display()))?;
    std::thread::sleep(hold);
    fs::write(file, bytes).map_err(|e| format!("recreate: {e}"))?;
    Ok(format!("deleted for {hold:?}, created again"))
}

/// Back-to-back control requests: every policy, evictions of each VM's
/// region and of the shared file, CXL ratios 0 / 50 / 100 and back, pins
/// of the shared file until the quota refuses, then unpins. Refusals the
/// daemon must give (quota, fully pinned cache) are counted, any other
/// failure is an error.
pub fn control_storm(
    socket: &Path,
    vms: &[String],
    shared: &str,
    ratio: u8,
) -> Result<String, String> {
    let t = Instant::now();
    let mut sent = 0;
    let mut refused = 0;
    let mut run = |args: &[&str]| -> Result<(), String> {
        sent += 1;
        let out = Command::new(cxlfs_cli())
            .args(["ctl", "--timeout", "60", "--socket"])
            .arg(socket)
            .args(args)
            .output()
            .map_err(|e| format!("cxlfs ctl: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        if err.contains("quota") || err.contains("pinned") {
            refused += 1;
            return Ok(());
        }
        Err(format!("ctl {args:?}: {}", err.trim()))
    };
    for p in ["lru", "fifo", "clock", "2q", "s3fifo"] {
        run(&["set-policy", p])?;
    }
    for vm in vms {
        run(&[
            "evict",
            "--vm",
            vm,
            "--memory-offset",
            "0",
            "--len",
            "64MiB",
        ])?;
    }
    run(&["evict", "--file", shared])?;
    for r in ["0", "50", "100", &ratio.to_string()] {
        run(&["set-cxl-ratio", r])?;
    }
    for _ in 0..4 {
        run(&["pin", "--file", shared])?;
    }
    run(&["unpin", "--file", shared])?;
    run(&["stats"])?;
    Ok(format!(
        "{sent} requests in {:.1?}, {refused} refused as they must be",
        t.elapsed()
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_schedule_takes_every_fault_each_round_between_warmup_and_cooldown() {
        let s = schedule(
            Duration::from_secs(30),
            Duration::from_secs(300),
            Duration::from_secs(30),
            2,
        );
        assert_eq!(s.len(), 14);
        assert_eq!(s[0], (Duration::from_secs(30), Fault::ControlStorm));
        assert_eq!(s[7].1, Fault::ControlStorm);
        assert!(s.iter().all(|(at, _)| *at < Duration::from_secs(270)));
        assert!(s.windows(2).all(|w| w[0].0 < w[1].0));
        for f in Fault::ALL {
            assert_eq!(s.iter().filter(|(_, g)| *g == f).count(), 2, "{f:?}");
        }
    }

    #[test]
    fn a_mapped_file_is_truncated_and_deleted_then_back() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("v.bin");
        fs::write(&f, b"abcd").unwrap();
        truncate_mapped(&f, b"abcd", Duration::ZERO).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"abcd");
        delete_mapped(&f, b"efgh", Duration::ZERO).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"efgh");
        assert!(delete_mapped(&d.path().join("none"), b"", Duration::ZERO).is_err());
        assert!(free_bytes(d.path()).unwrap() > 0);
    }
}
