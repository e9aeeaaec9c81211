//! The full-system vs replay cross-check of fio phases over the DAX window
//! (`replay_iolog = true` in a spec): every guest's fio logs its I/O
//! (`write_iolog`, fio's version-3 format: a time in µs since the job began,
//! the file, the action, the offset and the length), and the run's device
//! model replays the guests' logs merged by time, phase after phase on one
//! device, as the daemon's device met them.
//!
//! Through the DAX window a resident page is mapped into the guest: its
//! reads never reach the device, whose policy learns of misses only, and of
//! hits through the accessed bits: each page a guest reached in a bits'
//! period, once, after the period. The replay gets the same: the policy is
//! blind to hits, and each guest's pages of each period (the guest's own
//! log time over the bits' period) are told to the device as references
//! when the guest's next period begins, a page filled in the period or
//! evicted since skipped, as the daemon's scan does. So the replay counts
//! what the daemon counts — misses, and references where it would have
//! had bits — and its hit share, counted the same way, stands beside the
//! one the daemon's counters give.
//!
//! A file's pages are laid out in the replay's address space one file
//! after another (names sorted): with a fully associative cache and no
//! prefetch where a page lies does not change a hit; with sets or a
//! prefetcher it can, and the pool's own layout is the daemon's.

use cxlfs_device_model::replay::{Arrival, ReplayError, Replayer};
use cxlfs_device_model::trace::Access;
use cxlfs_device_model::{Device, DeviceConfig, LoadConfigError, Op};
use std::collections::{BTreeMap, HashMap};

/// Bytes per device page.
const PAGE: u64 = 4096;

/// The first line of a log fio's `write_iolog` writes.
pub const HEADER: &str = "fio version 3 iolog";

/// Why a log was refused or the replay failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayIologError {
    /// Not a version-3 log (older fio, or not a log at all).
    #[error("not a fio version 3 iolog (first line {0:?}): fio 3.x's write_iolog writes one")]
    Header(String),
    /// A line that is not `TIME FILE ACTION [OFFSET LENGTH]`.
    #[error("line {line}: {what}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        what: String,
    },
    /// The files do not fit the device.
    #[error("the logged files span {bytes} bytes, more than the device's {capacity}")]
    TooLarge {
        /// The files' bytes, laid end to end.
        bytes: u64,
        /// The device's capacity.
        capacity: u64,
    },
    /// The device config is refused.
    #[error("device config: {0}")]
    Config(#[source] LoadConfigError),
    /// The replay failed.
    #[error("replay: {0}")]
    Replay(#[source] ReplayError),
}

/// One logged read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Io {
    /// µs since the guest's job began.
    pub time_us: u64,
    /// The file, as [`Logs`] numbered it.
    pub file: u32,
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes (not 0).
    pub len: u32,
    /// A write (else a read).
    pub write: bool,
}

/// Logs parsed with one numbering of the files they name.
#[derive(Debug, Default)]
pub struct Logs {
    files: HashMap<String, u32>,
    /// Per file: the end of its furthest I/O, in bytes.
    ends: Vec<u64>,
}

impl Logs {
    /// The reads and writes of one log (opens, closes and the rest skipped).
    pub fn parse(&mut self, text: &str) -> Result<Vec<Io>, ReplayIologError> {
        let mut lines = text.lines().enumerate();
        let first = lines.next().map(|(_, l)| l.trim()).unwrap_or("");
        if first != HEADER {
            return Err(ReplayIologError::Header(first.chars().take(60).collect()));
        }
        let mut out = Vec::new();
        for (i, line) in lines {
            if let Some(io) = self
                .line(line)
                .map_err(|what| ReplayIologError::Line { line: i + 1, what })?
            {
                out.push(io);
            }
        }
        Ok(out)
    }

    /// One line: an I/O, or `None` for a file action.
    fn line(&mut self, line: &str) -> Result<Option<Io>, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |w: &str, what: &str| {
            w.parse::<u64>()
                .map_err(|_| format!("{what} `{w}` is not a whole number"))
        };
        let (time, file, action, rest) = match words.as_slice() {
            [] => return Ok(None),
            [t, f, a, rest @ ..] => (number(t, "the time")?, *f, *a, rest),
            _ => {
                return Err(format!(
                    "`{line}`: expected TIME FILE ACTION [OFFSET LENGTH]"
                ))
            }
        };
        let write = match action {
            "read" => false,
            "write" => true,
            "add" | "open" | "close" | "wait" | "sync" | "datasync" | "trim" => return Ok(None),
            other => return Err(format!("unknown action `{other}`")),
        };
        let [offset, len] = rest else {
            return Err(format!("`{line}`: a {action} needs OFFSET LENGTH"));
        };
        let (offset, len) = (number(offset, "the offset")?, number(len, "the length")?);
        let len = u32::try_from(len)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| format!("length {len} is not 1..2^32"))?;
        let end = offset
            .checked_add(u64::from(len))
            .ok_or_else(|| format!("offset {offset} + length {len} overflows"))?;
        let id = self.file_id(file)?;
        let e = &mut self.ends[id as usize];
        *e = (*e).max(end);
        Ok(Some(Io {
            time_us: time,
            file: id,
            offset,
            len,
            write,
        }))
    }

    /// The number of file `name`, given at its first I/O (a name is
    /// copied once, not once a line).
    fn file_id(&mut self, name: &str) -> Result<u32, String> {
        if let Some(&id) = self.files.get(name) {
            return Ok(id);
        }
        let id = u32::try_from(self.files.len()).map_err(|_| "too many files".to_string())?;
        self.files.insert(name.to_string(), id);
        self.ends.push(0);
        Ok(id)
    }

    /// Each file's first byte in the replay's address space: files end to
    /// end in name order, each rounded up to whole pages; and the bytes
    /// they span.
    fn layout(&self) -> (Vec<u64>, u64) {
        let by_name: BTreeMap<&str, u32> =
            self.files.iter().map(|(n, &i)| (n.as_str(), i)).collect();
        let mut bases = vec![0; self.ends.len()];
        let mut next = 0u64;
        for id in by_name.into_values() {
            bases[id as usize] = next;
            next = next.saturating_add(self.ends[id as usize].div_ceil(PAGE).saturating_mul(PAGE));
        }
        (bases, next)
    }
}

/// What the replay counted for one guest in one phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    /// Device pages its I/O touched.
    pub page_accesses: u64,
    /// Of which hits.
    pub page_hits: u64,
    /// Of which misses: what the daemon counts as its device misses.
    pub page_misses: u64,
    /// References its periods told the device (resident pages, each once a
    /// period): what the daemon counts from the accessed bits.
    pub references: u64,
}

/// One guest's current bits' period.
#[derive(Default)]
struct Period {
    index: Option<u64>,
    pages: Vec<u64>,
}

/// Replays `phases` (per phase, per guest, its log's I/O) on one device of
/// `config`, blind to hits, with each guest's pages told as references
/// once a period of `bits_period_ns` (none: no references); what each
/// guest counted, per phase.
pub fn replay(
    config: &DeviceConfig,
    logs: &Logs,
    phases: &[Vec<Vec<Io>>],
    bits_period_ns: Option<u64>,
) -> Result<Vec<Vec<Counted>>, ReplayIologError> {
    let mut cfg = config.clone();
    cfg.cache.hits_visible = false;
    let capacity = cfg.capacity_bytes();
    let (bases, bytes) = logs.layout();
    if bytes > capacity {
        return Err(ReplayIologError::TooLarge { bytes, capacity });
    }
    // A period of 0 tells nothing, as none.
    let period_ns = bits_period_ns.filter(|&p| p > 0);
    let mut device = Device::new(cfg).map_err(ReplayIologError::Config)?;
    let mut r = Replayer::new(&mut device, Arrival::Trace);
    let mut offset_ns = 0u64;
    let mut out = Vec::with_capacity(phases.len());
    for guests in phases {
        let mut merged: Vec<(u64, usize, &Io)> = guests
            .iter()
            .enumerate()
            .flat_map(|(g, ios)| ios.iter().map(move |io| (io.time_us, g, io)))
            .collect();
        merged.sort_by_key(|&(t, g, _)| (t, g));
        let mut counted = vec![Counted::default(); guests.len()];
        let mut periods: Vec<Period> = guests.iter().map(|_| Period::default()).collect();
        let mut end_ns = offset_ns;
        for (t, g, io) in merged {
            let now = offset_ns.saturating_add(t.saturating_mul(1000));
            end_ns = now;
            if let Some(p) = period_ns {
                let index = now / p;
                let period = &mut periods[g];
                if period.index != Some(index) {
                    tell(&mut r, period, p, &mut counted[g]);
                    period.index = Some(index);
                }
            }
            let addr = bases[io.file as usize] + io.offset;
            let o = r
                .feed(Access {
                    time_ns: now,
                    op: if io.write { Op::Write } else { Op::Read },
                    addr,
                    len: io.len,
                })
                .map_err(ReplayIologError::Replay)?;
            let c = &mut counted[g];
            c.page_accesses += u64::from(o.pages);
            c.page_hits += u64::from(o.page_hits);
            c.page_misses += u64::from(o.page_misses);
            if period_ns.is_some() {
                let last = (addr + u64::from(io.len) - 1) / PAGE;
                periods[g].pages.extend(addr / PAGE..=last);
            }
        }
        // The last periods' scans come after the phase's I/O.
        if let Some(p) = period_ns {
            for (period, c) in periods.iter_mut().zip(&mut counted) {
                tell(&mut r, period, p, c);
            }
        }
        // The next phase's logs start at 0 again: after this one.
        offset_ns = end_ns.saturating_add(period_ns.unwrap_or(0).max(1_000_000));
        out.push(counted);
    }
    Ok(out)
}

/// Tells the device of the pages of a guest's period that ended (a page
/// filled since the period began or evicted since skipped).
fn tell(r: &mut Replayer<'_>, period: &mut Period, period_ns: u64, c: &mut Counted) {
    let Some(index) = period.index else {
        return;
    };
    period.pages.sort_unstable();
    period.pages.dedup();
    let told = r.reference(index.saturating_mul(period_ns), &period.pages);
    c.references += told.referenced;
    period.pages.clear();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use cxlfs_device_model::PolicyKind;
    use std::fmt::Write as _;

    fn lru(pages: u64) -> DeviceConfig {
        let mut c = cxlfs_device_model::presets::preset("cylon").unwrap();
        c.cache.size_bytes = pages * PAGE;
        c.cache.ways = 0;
        c.cache.policy = PolicyKind::Lru;
        c.prefetch.degree = 0;
        c.nand.enabled = false;
        c
    }

    /// A log of 4 KiB reads of `file`, one every `gap_us`, of the pages `pages`.
    fn log(file: &str, gap_us: u64, pages: impl IntoIterator<Item = u64>) -> String {
        let mut s = format!("{HEADER}\n0 {file} add\n1 {file} open\n");
        for (i, p) in pages.into_iter().enumerate() {
            let _ = writeln!(s, "{} {file} read {} 4096", 2 + i as u64 * gap_us, p * PAGE);
        }
        let _ = writeln!(s, "999999999 {file} close");
        s
    }

    #[test]
    fn logs_parse_reads_and_writes_and_skip_file_actions() {
        let mut logs = Logs::default();
        let text = format!("{HEADER}\n21 d/f0 add\n147 d/f0 open\n151 d/f0 read 122880 4096\n\n594 d/f1 write 8192 8192\n600 d/f0 close\n");
        let ios = logs.parse(&text).unwrap();
        assert_eq!(
            ios,
            [
                Io {
                    time_us: 151,
                    file: 0,
                    offset: 122880,
                    len: 4096,
                    write: false
                },
                Io {
                    time_us: 594,
                    file: 1,
                    offset: 8192,
                    len: 8192,
                    write: true
                },
            ]
        );
        // Names in order: d/f0 first, rounded up to its pages.
        assert_eq!(logs.layout(), (vec![0, 31 * PAGE], 35 * PAGE));
    }

    #[test]
    fn bad_logs_are_refused_with_the_line() {
        let mut logs = Logs::default();
        assert!(matches!(
            logs.parse("fio version 2 iolog\n"),
            Err(ReplayIologError::Header(_))
        ));
        assert!(matches!(logs.parse(""), Err(ReplayIologError::Header(_))));
        for (bad, what) in [
            ("x f read 0 4096", "the time `x`"),
            ("1 f read 0", "needs OFFSET LENGTH"),
            ("1 f read 0 0", "length 0"),
            ("1 f seek 0 4096", "unknown action `seek`"),
            ("1 f read 18446744073709551615 4096", "overflows"),
            ("1 f", "expected TIME FILE ACTION"),
        ] {
            let e = logs
                .parse(&format!("{HEADER}\n1 f add\n{bad}\n"))
                .unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with("line 3: ") && text.contains(what),
                "{bad}: {text}"
            );
        }
    }

    #[test]
    fn a_set_that_fits_is_referenced_once_a_period_and_counted_like_the_daemon() {
        // 64 pages read round and round, one read every 10 µs, a 128-page
        // cache: 64 first-touch misses, then hits the policy learns of once
        // per page per 1 ms period (100 reads: each page once or twice).
        let mut logs = Logs::default();
        let ios = logs
            .parse(&log("f", 10, (0..20_000u64).map(|i| i % 64)))
            .unwrap();
        let c = replay(&lru(128), &logs, &[vec![ios.clone()]], Some(1_000_000)).unwrap();
        let c = c[0][0];
        assert_eq!(c.page_accesses, 20_000);
        assert_eq!(c.page_misses, 64);
        assert_eq!(c.page_hits, 20_000 - 64);
        // 200 ms of reads: 200 periods, each of 100 reads of 64 pages; the
        // first period's 64 pages were filled in it.
        assert!((199 * 64 - 64..=200 * 64).contains(&c.references), "{c:?}");
        let share = c.references as f64 / (c.references + c.page_misses) as f64;
        assert!(share > 0.99, "{c:?}");
        // Without the bits, no references: the share is 0.
        let blind = replay(&lru(128), &logs, &[vec![ios]], None).unwrap()[0][0];
        assert_eq!((blind.references, blind.page_misses), (0, 64));
    }

    #[test]
    fn references_let_lru_keep_a_hot_set_a_blind_one_loses() {
        // Guest 0 reads 16 hot pages over and over; guest 1 scans 4096 cold
        // pages of another file, at the same pace: through a 64-page cache,
        // blind LRU is FIFO and the scan flushes the hot pages; told of them
        // each period, LRU keeps them.
        let mut logs = Logs::default();
        let hot = logs
            .parse(&log("hot", 5, (0..40_000u64).map(|i| i % 16)))
            .unwrap();
        let cold = logs
            .parse(&log("cold", 5, (0..40_000u64).map(|i| i % 4096)))
            .unwrap();
        let phases = [vec![hot, cold]];
        let blind = replay(&lru(64), &logs, &phases, None).unwrap();
        let bits = replay(&lru(64), &logs, &phases, Some(100_000)).unwrap();
        let (b, s) = (blind[0][0], bits[0][0]);
        assert!(s.page_misses * 10 < b.page_misses, "blind {b:?} bits {s:?}");
        // The scanning guest misses on every read either way.
        assert_eq!(bits[0][1].page_misses, 40_000);
        assert_eq!(blind[0][1].page_misses, 40_000);
    }

    #[test]
    fn phases_go_on_with_the_device_they_found() {
        // The second phase's log starts at time 0 again and finds the first
        // phase's pages resident.
        let mut logs = Logs::default();
        let one = logs.parse(&log("f", 10, 0..32)).unwrap();
        let two = logs.parse(&log("f", 10, 0..32)).unwrap();
        let c = replay(&lru(64), &logs, &[vec![one], vec![two]], Some(1_000_000)).unwrap();
        assert_eq!(c[0][0].page_misses, 32);
        assert_eq!(c[1][0].page_misses, 0);
        assert_eq!(c[1][0].page_hits, 32);
    }

    #[test]
    fn files_that_do_not_fit_the_device_are_refused() {
        let mut logs = Logs::default();
        let big = 1u64 << 50;
        let ios = logs
            .parse(&format!("{HEADER}\n1 f read {big} 4096\n"))
            .unwrap();
        let e = replay(&lru(64), &logs, &[vec![ios]], None).unwrap_err();
        assert!(matches!(e, ReplayIologError::TooLarge { .. }), "{e}");
    }
}
