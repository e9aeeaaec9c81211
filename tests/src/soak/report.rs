//! The soak's verdict: what the guests logged (laps, errors), the host's
//! checks, the daemon's samples and the faults, read into one [`Report`]
//! that prints as tables and lists every problem that fails the soak.

use super::faults::Fault;
use super::samples::{growth_pct, per_hour, DaemonSample, PoolSample};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// One lap of a guest's loop, on the host's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lap {
    /// Since the soak started (the boot's start + the guest's uptime).
    pub at: Duration,
    /// The page chase's median and p99 on node 1 that lap (ns).
    pub p50_ns: f64,
    /// See `p50_ns`.
    pub p99_ns: f64,
}

/// What one VM's files say, over all its boots.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GuestLog {
    /// Laps, in order.
    pub laps: Vec<Lap>,
    /// Boots that logged a start.
    pub boots: usize,
    /// Boots that reached the stop file.
    pub stops: usize,
    /// Injected failures seen (ENOSPC, the mapped file gone), by kind.
    pub injected: BTreeMap<String, u64>,
    /// Every other error line.
    pub errors: Vec<String>,
}

/// Reads a VM's `laps` and `errors` texts; `boots_at` is when each boot of
/// the VM started on the host clock (the k-th `BOOT` line is the k-th boot).
pub fn read_guest_log(laps: &str, errors: &str, boots_at: &[Duration]) -> GuestLog {
    let mut g = GuestLog::default();
    let mut base = Duration::ZERO;
    for line in laps.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let uptime = w.first().and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0);
        match w.get(1).copied() {
            Some("BOOT") => {
                base = boots_at.get(g.boots).copied().unwrap_or(base);
                g.boots += 1;
            }
            Some("STOP") => g.stops += 1,
            Some("LAP") => {
                let num = |i: usize| w.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                g.laps.push(Lap {
                    at: base + Duration::from_secs_f64(uptime.max(0.0)),
                    p50_ns: num(3),
                    p99_ns: num(4),
                });
            }
            _ => {}
        }
    }
    for line in errors.lines() {
        let kind = line.split_whitespace().nth(1).unwrap_or("");
        if matches!(kind, "ENOSPC" | "VICTIM") {
            *g.injected.entry(kind.to_string()).or_default() += 1;
        } else if !line.trim().is_empty() {
            g.errors.push(line.to_string());
        }
    }
    g
}

/// One injected fault as it happened.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRecord {
    /// Which.
    pub fault: Fault,
    /// The VM it hit (a VM kill), if one.
    pub vm: Option<String>,
    /// When it started and ended (a killed VM: when it was back).
    pub start: Duration,
    /// See `start`.
    pub end: Duration,
    /// What was done, or why it could not be.
    pub outcome: Result<String, String>,
}

/// Bounds the soak holds the daemon to.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Anonymous-memory growth over the second half, percent (`None`: a
    /// run too short to tell warm-up from growth; only the cap holds).
    pub rss_growth_pct: Option<f64>,
    /// Anonymous memory the daemon may never exceed, MiB.
    pub rss_cap_mib: u64,
    /// Descriptor and thread growth over the second half, percent.
    pub fd_growth_pct: f64,
    /// A guest with no lap for this long (outside its own faults) is stuck.
    pub stuck_after: Duration,
    /// Latency of unfaulted VMs while another VM is killed: at most this
    /// times their own unfaulted median lap p99.
    pub neighbour_p99_ratio: f64,
    /// Latency windows.
    pub window: Duration,
}

/// Everything the soak found.
#[derive(Debug, Clone)]
pub struct Report {
    /// Per VM.
    pub guests: BTreeMap<String, GuestLog>,
    /// The faults, in order.
    pub faults: Vec<FaultRecord>,
    /// The daemon, every 10 s.
    pub samples: Vec<DaemonSample>,
    /// Files whose content the host checked against their names' sums.
    pub files_checked: u64,
    /// Files that did not match (name and what was found).
    pub file_mismatches: Vec<String>,
    /// Guest kernel oopses, BUGs and hung tasks (VM: line).
    pub kernel_problems: Vec<String>,
    /// Guests that did not stop when asked.
    pub unstopped: Vec<String>,
    /// The run's length.
    pub length: Duration,
    /// File chunks that had to share a pool extent (the pool ran short).
    pub pool_aliased_extents: u64,
    /// What the VMs' sessions still held in the pool once every VM had
    /// stopped (nothing, unless a session leaked its references).
    pub pool_left: PoolSample,
    /// The pool was sized to run short (it must have).
    pub small_pool: bool,
    /// The bounds.
    pub bounds: Bounds,
}

/// Nearest-rank percentile of unsorted values (0 for none).
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

impl Report {
    /// Whether a moment falls in a fault's window.
    fn in_fault(&self, at: Duration, pick: impl Fn(&FaultRecord) -> bool) -> bool {
        self.faults
            .iter()
            .any(|f| pick(f) && at >= f.start && at <= f.end)
    }

    /// Lap p99s of `vm` outside every fault, and while another VM was
    /// killed or stalled.
    fn neighbour_laps(&self, vm: &str) -> (Vec<f64>, Vec<f64>) {
        let Some(g) = self.guests.get(vm) else {
            return (Vec::new(), Vec::new());
        };
        let calm = g
            .laps
            .iter()
            .filter(|l| !self.in_fault(l.at, |_| true))
            .map(|l| l.p99_ns)
            .collect();
        let during = g
            .laps
            .iter()
            .filter(|l| {
                self.in_fault(l.at, |f| {
                    matches!(f.fault, Fault::KillVm | Fault::StallVm) && f.vm.as_deref() != Some(vm)
                })
            })
            .map(|l| l.p99_ns)
            .collect();
        (calm, during)
    }

    /// Median lap p99 of `vm` outside every fault, and while another VM was
    /// killed or stalled (None: no lap there).
    pub fn neighbour_latency(&self, vm: &str) -> (Option<f64>, Option<f64>) {
        let (calm, during) = self.neighbour_laps(vm);
        let med = |v: &[f64]| (!v.is_empty()).then(|| percentile(v, 50.0));
        (med(&calm), med(&during))
    }

    /// The same over every VM's laps together (a fault window holds a few
    /// laps of each VM: one VM's median of three is noise): median lap p99
    /// outside faults, and that of the neighbours of killed or stalled VMs,
    /// with how many laps the latter has.
    pub fn neighbours_pooled(&self) -> (Option<f64>, Option<f64>, usize) {
        let (mut calm, mut during) = (Vec::new(), Vec::new());
        for vm in self.guests.keys() {
            let (c, d) = self.neighbour_laps(vm);
            calm.extend(c);
            during.extend(d);
        }
        let med = |v: &[f64]| (!v.is_empty()).then(|| percentile(v, 50.0));
        (med(&calm), med(&during), during.len())
    }

    /// The longest stretch without a lap of `vm`, outside its own kills and
    /// the daemon's stops (between the first lap and the last).
    pub fn longest_stall(&self, vm: &str) -> Duration {
        let Some(g) = self.guests.get(vm) else {
            return Duration::ZERO;
        };
        g.laps
            .windows(2)
            .filter(|w| {
                !self.faults.iter().any(|f| {
                    let own = f.vm.as_deref() == Some(vm) || f.fault == Fault::StopDaemon;
                    own && f.start <= w[1].at && f.end >= w[0].at
                })
            })
            .map(|w| w[1].at.saturating_sub(w[0].at))
            .max()
            .unwrap_or_default()
    }

    /// Every reason the soak fails; empty: it passed.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (vm, g) in &self.guests {
            p.extend(g.errors.iter().map(|e| format!("{vm}: {e}")));
            if g.laps.is_empty() {
                p.push(format!("{vm}: no lap completed"));
            }
            let stall = self.longest_stall(vm);
            if stall > self.bounds.stuck_after {
                p.push(format!("{vm}: no lap for {stall:.0?} outside its faults"));
            }
        }
        if let (Some(calm), Some(during), n) = self.neighbours_pooled() {
            if during > calm * self.bounds.neighbour_p99_ratio {
                p.push(format!(
                    "neighbours' median lap p99 {during:.0} ns while a VM was killed or stalled ({n} laps), > {:.1}x their {calm:.0} ns outside faults",
                    self.bounds.neighbour_p99_ratio
                ));
            }
        }
        p.extend(
            self.file_mismatches
                .iter()
                .map(|m| format!("file mismatch: {m}")),
        );
        p.extend(
            self.kernel_problems
                .iter()
                .map(|k| format!("guest kernel: {k}")),
        );
        p.extend(
            self.unstopped
                .iter()
                .map(|v| format!("{v}: did not stop when asked")),
        );
        for f in &self.faults {
            if let Err(e) = &f.outcome {
                p.push(format!("fault {} at {:.0?}: {e}", f.fault.name(), f.start));
            }
        }
        let peak = self
            .samples
            .iter()
            .map(|x| x.anon_rss_kib >> 10)
            .max()
            .unwrap_or(0);
        if peak > self.bounds.rss_cap_mib {
            p.push(format!(
                "daemon anonymous RSS reached {peak} MiB (cap {} MiB)",
                self.bounds.rss_cap_mib
            ));
        }
        let left = self.pool_left;
        if left.file_refs > 0 || left.held_bytes > 0 {
            p.push(format!(
                "after every VM stopped, the daemon still holds {} pool file references ({} MiB of extents)",
                left.file_refs,
                left.held_bytes >> 20
            ));
        }
        for (name, growth, bound) in self.growths() {
            if growth > bound {
                p.push(format!(
                    "daemon {name} grew {growth:.1} % over the second half (bound {bound} %)"
                ));
            }
        }
        p
    }

    /// (figure, growth over the second half in %, bound).
    fn growths(&self) -> [(&'static str, f64, f64); 3] {
        let b = self.bounds;
        [
            (
                "anonymous RSS",
                growth_pct(&self.samples, |s| s.anon_rss_kib),
                b.rss_growth_pct.unwrap_or(f64::INFINITY),
            ),
            (
                "open descriptors",
                growth_pct(&self.samples, |s| s.fds),
                b.fd_growth_pct,
            ),
            (
                "threads",
                growth_pct(&self.samples, |s| s.threads),
                b.fd_growth_pct,
            ),
        ]
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "soak: {:.0?}, {} VMs", self.length, self.guests.len())?;
        self.write_guests(f)?;
        self.write_windows(f)?;
        self.write_faults(f)?;
        self.write_daemon(f)?;
        self.write_verdict(f)
    }
}

/// Nanoseconds as microseconds, or `-` for none.
fn us(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{:.1} µs", v / 1e3))
}

impl Report {
    /// Per VM: boots, laps, errors, its latency outside faults and beside
    /// a faulted VM; then the same over every VM.
    fn write_guests(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\n{:<10} {:>6} {:>6} {:>7} {:>9} {:>9}  injected",
            "vm", "boots", "laps", "errors", "calm p99", "beside"
        )?;
        for (vm, g) in &self.guests {
            let (calm, during) = self.neighbour_latency(vm);
            writeln!(
                f,
                "{vm:<10} {:>6} {:>6} {:>7} {:>9} {:>9}  {:?}",
                g.boots,
                g.laps.len(),
                g.errors.len(),
                us(calm),
                us(during),
                g.injected
            )?;
        }
        let (calm, during, n) = self.neighbours_pooled();
        writeln!(
            f,
            "all VMs: median lap p99 {} outside faults, {} beside a killed or stalled VM ({n} laps)",
            us(calm),
            us(during)
        )
    }

    /// Per VM and window: median lap p50 / p99 of lap p99s.
    fn write_windows(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\nlatency per {:.0?} window (median of lap p50 / p99 of lap p99, µs):",
            self.bounds.window
        )?;
        let w = self.bounds.window.as_secs_f64().max(1.0);
        let n = (self.length.as_secs_f64() / w).ceil() as usize;
        for (vm, g) in &self.guests {
            write!(f, "{vm:<10}")?;
            for i in 0..n {
                let laps: Vec<&Lap> = g
                    .laps
                    .iter()
                    .filter(|l| (l.at.as_secs_f64() / w) as usize == i)
                    .collect();
                if laps.is_empty() {
                    write!(f, "  -")?;
                    continue;
                }
                let p50: Vec<f64> = laps.iter().map(|l| l.p50_ns).collect();
                let p99: Vec<f64> = laps.iter().map(|l| l.p99_ns).collect();
                write!(
                    f,
                    "  {:.1}/{:.1}",
                    percentile(&p50, 50.0) / 1e3,
                    percentile(&p99, 99.0) / 1e3
                )?;
            }
            writeln!(f)?;
        }
        Ok(())
    }

    /// Every fault with its window and outcome, then how many of each
    /// survived.
    fn write_faults(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\nfaults:")?;
        let mut counts: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
        for r in &self.faults {
            let c = counts.entry(r.fault.name()).or_default();
            c.0 += 1;
            c.1 += u32::from(r.outcome.is_ok());
            let what = match &r.outcome {
                Ok(d) => d.clone(),
                Err(e) => format!("FAILED: {e}"),
            };
            writeln!(
                f,
                "  {:>7.1}s–{:>7.1}s {:<26} {:<5} {what}",
                r.start.as_secs_f64(),
                r.end.as_secs_f64(),
                r.fault.name(),
                r.vm.as_deref().unwrap_or("")
            )?;
        }
        for (name, (n, ok)) in &counts {
            writeln!(f, "  {name}: {ok} of {n} survived")?;
        }
        Ok(())
    }

    /// The daemon's first and last sample, growth over the second half, the
    /// pool, and what the VMs still held after they stopped.
    fn write_daemon(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\ndaemon (first / last sample; growth over the second half):"
        )?;
        match (self.samples.first(), self.samples.last()) {
            (Some(a), Some(z)) => self.write_samples(f, a, z)?,
            _ => writeln!(f, "  no sample")?,
        }
        writeln!(
            f,
            "  after every VM stopped, the VMs held: {} MiB of pool, {} file references",
            self.pool_left.held_bytes >> 20,
            self.pool_left.file_refs
        )
    }

    /// The first and last of the daemon's samples, growth, the pool.
    fn write_samples(
        &self,
        f: &mut fmt::Formatter<'_>,
        a: &DaemonSample,
        z: &DaemonSample,
    ) -> fmt::Result {
        let g = self.growths();
        let by_minute: Vec<String> = self
            .samples
            .iter()
            .step_by(6)
            .map(|x| format!("{:.1}", x.anon_rss_kib as f64 / 1024.0))
            .collect();
        // `+ 0.0`: a slope of -0 prints as 0.
        let rate = |figure: fn(&DaemonSample) -> u64| per_hour(&self.samples, figure) + 0.0;
        writeln!(
            f,
            "  anonymous RSS {} → {} MiB ({:+.1} %, {:+.1} MiB/h); by minute: {}",
            a.anon_rss_kib >> 10,
            z.anon_rss_kib >> 10,
            g[0].1,
            rate(|x| x.anon_rss_kib) / 1024.0,
            by_minute.join(" ")
        )?;
        writeln!(
            f,
            "  open descriptors {} → {} ({:+.1} %, {:+.0}/h)",
            a.fds,
            z.fds,
            g[1].1,
            rate(|x| x.fds)
        )?;
        writeln!(
            f,
            "  threads {} → {} ({:+.1} %, {:+.0}/h)",
            a.threads,
            z.threads,
            g[2].1,
            rate(|x| x.threads)
        )?;
        let peak = self.samples.iter().map(|x| x.pool.allocated_bytes).max();
        writeln!(
            f,
            "  pool bytes allocated {} → {} MiB (peak {} MiB); file chunks aliased: {}",
            a.pool.allocated_bytes >> 20,
            z.pool.allocated_bytes >> 20,
            peak.unwrap_or(0) >> 20,
            self.pool_aliased_extents
        )?;
        writeln!(
            f,
            "  pool held by the VMs {} → {} MiB, {} → {} file references",
            a.pool.held_bytes >> 20,
            z.pool.held_bytes >> 20,
            a.pool.file_refs,
            z.pool.file_refs
        )
    }

    /// The host's file check and the verdict.
    fn write_verdict(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\nfiles checked by the host: {} ({} mismatched)",
            self.files_checked,
            self.file_mismatches.len()
        )?;
        let problems = self.problems();
        if problems.is_empty() {
            return writeln!(
                f,
                "verdict: nothing lost, nothing leaked, every guest served"
            );
        }
        writeln!(f, "verdict: {} problem(s):", problems.len())?;
        for p in problems {
            writeln!(f, "  {p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn guest_logs_map_laps_to_the_host_clock_per_boot() {
        let laps = "1.0 BOOT a\n5.0 LAP 1 800 9000\n9.0 LAP 2 820 9100\n2.0 BOOT b\n4.0 LAP 1 790 8800\n6.0 STOP 2\n";
        let errors = "5.1 ENOSPC w.1\n6.0 VICTIM 135\n7.0 FILE w.2.ab read back cd\n";
        let g = read_guest_log(laps, errors, &[secs(10), secs(100)]);
        assert_eq!(g.boots, 2);
        assert_eq!(g.stops, 1);
        assert_eq!(g.laps.len(), 3);
        assert_eq!(g.laps[0].at, secs(15));
        assert_eq!(g.laps[2].at, secs(104));
        assert_eq!(g.laps[1].p99_ns, 9100.0);
        assert_eq!(g.injected["ENOSPC"], 1);
        assert_eq!(g.injected["VICTIM"], 1);
        assert_eq!(g.errors, ["7.0 FILE w.2.ab read back cd"]);
    }

    fn report(laps_a: Vec<Lap>, laps_b: Vec<Lap>) -> Report {
        let mut guests = BTreeMap::new();
        guests.insert(
            "vm0".to_string(),
            GuestLog {
                laps: laps_a,
                boots: 1,
                stops: 1,
                ..GuestLog::default()
            },
        );
        guests.insert(
            "vm1".to_string(),
            GuestLog {
                laps: laps_b,
                boots: 2,
                stops: 1,
                ..GuestLog::default()
            },
        );
        Report {
            guests,
            faults: vec![FaultRecord {
                fault: Fault::KillVm,
                vm: Some("vm1".into()),
                start: secs(100),
                end: secs(160),
                outcome: Ok("killed".into()),
            }],
            samples: Vec::new(),
            files_checked: 10,
            file_mismatches: Vec::new(),
            kernel_problems: Vec::new(),
            unstopped: Vec::new(),
            length: secs(300),
            pool_aliased_extents: 1,
            pool_left: PoolSample::default(),
            small_pool: true,
            bounds: Bounds {
                rss_growth_pct: Some(2.0),
                rss_cap_mib: 256,
                fd_growth_pct: 0.0,
                stuck_after: secs(90),
                neighbour_p99_ratio: 1.5,
                window: secs(60),
            },
        }
    }

    fn lap(at: u64, p99: f64) -> Lap {
        Lap {
            at: secs(at),
            p50_ns: 800.0,
            p99_ns: p99,
        }
    }

    #[test]
    fn a_killed_vm_s_neighbour_is_judged_against_its_own_calm_latency() {
        let a: Vec<Lap> = (0..30)
            .map(|i| {
                lap(
                    i * 10,
                    if (100..=160).contains(&(i * 10)) {
                        20_000.0
                    } else {
                        10_000.0
                    },
                )
            })
            .collect();
        let b: Vec<Lap> = (0..30)
            .filter(|i| !(10..=16).contains(i))
            .map(|i| lap(i * 10, 10_000.0))
            .collect();
        let r = report(a.clone(), b.clone());
        assert_eq!(r.neighbour_latency("vm0"), (Some(10_000.0), Some(20_000.0)));
        // vm1's own kill is not a stall; vm0's 2x is over the 1.5x bound.
        let p = r.problems();
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("neighbours' median lap p99 20000"),
            "{p:?}"
        );
        // Within bounds: no problem, and the table says so.
        let calm: Vec<Lap> = (0..30).map(|i| lap(i * 10, 10_000.0)).collect();
        let r = report(calm, b);
        assert!(r.problems().is_empty(), "{:?}", r.problems());
        assert!(r.to_string().contains("nothing lost"), "{r}");
    }

    #[test]
    fn stalls_errors_and_failed_faults_fail_the_soak() {
        let a: Vec<Lap> = vec![lap(0, 1.0), lap(10, 1.0), lap(200, 1.0)];
        let mut r = report(a, vec![lap(0, 1.0)]);
        r.guests
            .get_mut("vm1")
            .unwrap()
            .errors
            .push("7.0 MEMORY node1".into());
        r.faults.push(FaultRecord {
            fault: Fault::Enospc,
            vm: None,
            start: secs(250),
            end: secs(260),
            outcome: Err("no tmpfs".into()),
        });
        let p = r.problems().join("\n");
        assert!(p.contains("vm0: no lap for 190s"), "{p}");
        assert!(p.contains("vm1: 7.0 MEMORY node1"), "{p}");
        assert!(p.contains("fault ENOSPC on the share"), "{p}");
        assert!(percentile(&[3.0, 1.0, 2.0], 50.0) == 2.0);
    }

    #[test]
    fn pool_references_left_after_every_vm_stopped_fail_the_soak() {
        let calm: Vec<Lap> = (0..30).map(|i| lap(i * 10, 10_000.0)).collect();
        let mut r = report(calm.clone(), calm);
        assert!(r.problems().is_empty(), "{:?}", r.problems());
        r.pool_left = PoolSample {
            allocated_bytes: 40 << 20,
            held_bytes: 4 << 20,
            file_refs: 3,
        };
        let p = r.problems().join("\n");
        assert!(
            p.contains("still holds 3 pool file references (4 MiB of extents)"),
            "{p}"
        );
        assert!(
            r.to_string()
                .contains("after every VM stopped, the VMs held: 4 MiB of pool, 3 file references"),
            "{r}"
        );
    }
}
