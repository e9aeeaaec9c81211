//! What a guest's serial console says about how its kernel died: the first
//! oops, BUG or panic, in a line a runner's error can carry.

/// Lines that start a kernel crash report (after the `[ time]` prefix).
const CRASH_STARTS: &[&str] = &[
    "Oops:",
    "BUG:",
    "general protection fault",
    "kernel BUG at",
    "Kernel panic - not syncing",
];

/// Lines of a crash report worth quoting after its first line.
const CRASH_DETAILS: &[&str] = &["RIP:", "Kernel panic - not syncing", "Comm:"];

/// At most this many characters of summary.
const MAX_SUMMARY: usize = 400;

/// The message after the kernel's `[   12.345678] ` timestamp, wherever it
/// stands in the line (the console may have glued firmware output before
/// it); the whole line when it has none.
fn strip_stamp(line: &str) -> &str {
    let mut from = 0;
    while let Some(open) = line[from..].find('[').map(|i| from + i) {
        let rest = &line[open + 1..];
        if let Some(close) = rest.find(']') {
            let stamp = rest[..close].trim();
            let is_stamp = !stamp.is_empty()
                && stamp.contains('.')
                && stamp.chars().all(|c| c.is_ascii_digit() || c == '.');
            if is_stamp {
                return rest[close + 1..].trim_start();
            }
        }
        from = open + 1;
    }
    line.trim_start()
}

/// The first kernel crash in `serial` (a guest's console log), as its first
/// line plus the RIP, task and panic lines that follow, joined with ` | `;
/// `None` when the kernel did not crash.
pub fn kernel_crash(serial: &str) -> Option<String> {
    let lines: Vec<&str> = serial
        .lines()
        .map(|l| strip_stamp(l.trim_end_matches('\r')))
        .collect();
    let start = lines
        .iter()
        .position(|l| CRASH_STARTS.iter().any(|m| l.starts_with(m)))?;
    let mut parts = vec![lines[start].to_string()];
    for l in lines.iter().skip(start + 1).take(80) {
        if CRASH_DETAILS.iter().any(|m| l.contains(m)) && !parts.iter().any(|p| p == l) {
            parts.push((*l).to_string());
        }
    }
    let mut s = parts.join(" | ");
    if s.len() > MAX_SUMMARY {
        let mut cut = MAX_SUMMARY;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    Some(s)
}

/// [`kernel_crash`] of the serial log at `path`; `None` when it cannot be
/// read or holds no crash.
pub fn kernel_crash_in(path: &std::path::Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    kernel_crash(&String::from_utf8_lossy(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_int3_oops_is_named_with_its_rip_task_and_panic() {
        let serial = "\
[    2.401000] devtmpfs: initialized\r
[    2.412345] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\r
[    2.412400] CPU: 1 UID: 0 PID: 1 Comm: swapper/0 Not tainted 6.12.95+deb12-amd64 #1\r
[    2.412500] RIP: 0010:sched_clock_cpu+0x9/0x190\r
[    2.412600] Call Trace:\r
[    2.420000] Kernel panic - not syncing: Fatal exception in interrupt\r
";
        let s = kernel_crash(serial).unwrap();
        assert_eq!(
            s,
            "Oops: int3: 0000 [#1] PREEMPT SMP NOPTI | CPU: 1 UID: 0 PID: 1 Comm: swapper/0 \
             Not tainted 6.12.95+deb12-amd64 #1 | RIP: 0010:sched_clock_cpu+0x9/0x190 | \
             Kernel panic - not syncing: Fatal exception in interrupt"
        );
    }

    #[test]
    fn a_clean_boot_has_no_crash_and_a_bare_panic_is_one() {
        assert_eq!(
            kernel_crash("[ 1.0] Run /init as init process\nCXLFS-EXIT=0\n"),
            None
        );
        assert_eq!(
            kernel_crash("[ 0.5] Kernel panic - not syncing: VFS: Unable to mount root fs\n"),
            Some("Kernel panic - not syncing: VFS: Unable to mount root fs".to_string())
        );
    }

    #[test]
    fn a_panic_glued_to_firmware_output_is_found() {
        let serial = "Booting from ROM..[    1.497422] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n[    1.5] Kernel Offset: disabled\n";
        assert_eq!(
            kernel_crash(serial).as_deref(),
            Some("Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)")
        );
    }

    #[test]
    fn a_long_report_is_cut_at_a_character_boundary() {
        let long = format!("BUG: {}", "é".repeat(500));
        let s = kernel_crash(&long).unwrap();
        assert!(s.ends_with('…'));
        assert!(s.len() <= MAX_SUMMARY + '…'.len_utf8());
    }
}
