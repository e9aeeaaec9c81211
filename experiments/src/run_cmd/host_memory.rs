//! The host memory a run's back-end holds, read at each barrier: the
//! anonymous resident memory of its processes (`RssAnon`: one `cxlfsd`, or
//! every `virtiofsd`) — their heaps and buffers. Their `VmRSS` also counts
//! the guest memory a vhost-user back-end maps and touches (each request's
//! buffers), which is the guest's own memory, counted in the guest. With
//! `cxlfsd` the DAX pool's resident bytes come from its own figures
//! (`daemon.pool_resident_bytes`).

/// The anonymous resident bytes of the processes `pids` together (one
/// that is gone counts 0).
pub(super) fn rss_bytes(pids: &[u32]) -> u64 {
    pids.iter()
        .map(|&p| process_rss_bytes(p).unwrap_or(0))
        .sum()
}

/// `RssAnon` of process `pid`, in bytes.
fn process_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    rss_of_status(&status)
}

/// `RssAnon` of a `/proc/PID/status` text, in bytes.
fn rss_of_status(status: &str) -> Option<u64> {
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read_from_the_status_and_summed() {
        assert_eq!(
            rss_of_status("Name:\tx\nVmRSS:\t  900 kB\nRssAnon:\t  812 kB\nThreads:\t3\n"),
            Some(812 * 1024)
        );
        assert_eq!(rss_of_status("Name:\tkthread\n"), None);
        let me = rss_bytes(&[std::process::id()]);
        assert!(me > 0, "this process has resident memory");
        assert_eq!(rss_bytes(&[u32::MAX]), 0, "a process that is gone counts 0");
    }
}
