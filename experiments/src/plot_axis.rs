//! Words, units and ticks for plot axes: which label, unit and scale a
//! results column gets (`read_bw_bytes_per_sec` → "Read bandwidth (MB/s)",
//! ÷1e6), tick positions (1, 2, 5 × 10^k) and their labels (`1.5k`, `20M`).

/// How a column is shown on an axis or in a legend.
#[derive(Debug, Clone, PartialEq)]
pub struct AxisInfo {
    /// The quantity in words ("Read bandwidth").
    pub name: String,
    /// The unit after scaling ("MB/s"); empty for plain counts.
    pub unit: String,
    /// Values are divided by this before drawing.
    pub scale: f64,
}

impl AxisInfo {
    fn new(name: &str, unit: &str, scale: f64) -> Self {
        AxisInfo {
            name: name.to_string(),
            unit: unit.to_string(),
            scale,
        }
    }

    /// The axis title: "Name (unit)".
    pub fn label(&self) -> String {
        if self.unit.is_empty() {
            self.name.clone()
        } else {
            format!("{} ({})", self.name, self.unit)
        }
    }

    /// A value as a legend shows it ("16 MiB", "50 %", "lru").
    pub fn value_text(&self, v: f64) -> String {
        let t = eng(v / self.scale);
        match self.unit.as_str() {
            "" => t,
            "×" => format!("{t}×"),
            u => format!("{t} {u}"),
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// "read_clat_p99" → "Read latency, p99" (fio's latency columns).
fn fio_latency(dir: &str, stat: &str) -> String {
    let stat = match stat {
        "mean" => "mean".to_string(),
        "p50" => "median".to_string(),
        s => s.to_string(),
    };
    format!("{} latency, {stat}", capitalise(dir))
}

/// Columns known by their exact name.
fn exact(col: &str) -> Option<AxisInfo> {
    let a = AxisInfo::new;
    Some(match col {
        "read_bw_bytes_per_sec" => a("Read bandwidth", "MB/s", 1e6),
        "write_bw_bytes_per_sec" => a("Write bandwidth", "MB/s", 1e6),
        "read_iops" => a("Read IOPS", "operations/s", 1.0),
        "write_iops" => a("Write IOPS", "operations/s", 1.0),
        "device_hits" => a("Device-cache hits", "pages", 1.0),
        "device_misses" => a("Device-cache misses", "pages", 1.0),
        "device_hit_rate" => a("Device-cache hit rate", "%", 0.01),
        "elapsed_s" => a("Phase duration", "s", 1.0),
        "fio_runtime_ms" => a("fio runtime", "s", 1e3),
        "fio_usr_cpu" => a("fio user CPU", "%", 1.0),
        "fio_sys_cpu" => a("fio system CPU", "%", 1.0),
        "cxl_ratio" | "daemon.cxl_ratio" => a("File pages on the CXL-SSD", "%", 1.0),
        "policy" | "daemon.device.cache.policy" => a("Eviction policy", "", 1.0),
        "fio.size" | "fio.filesize" => a("Working set", "MiB", MIB),
        "fio.bs" => a("Block size", "KiB", 1024.0),
        "daemon.device.cache.size_bytes" => a("Device cache", "MiB", MIB),
        "daemon.device.prefetch.degree" => a("Prefetch degree", "pages", 1.0),
        "daemon.device.nand.read_ns" => a("NAND read time (tR)", "µs", 1e3),
        "daemon.device.nand.program_ns" => a("NAND program time (tProg)", "µs", 1e3),
        "vms.count" | "vms" => a("VMs", "", 1.0),
        "vm" => a("VM", "", 1.0),
        "numa" | "phase.numa" => a("NUMA placement", "", 1.0),
        "phase" => a("Phase", "", 1.0),
        "run" => a("Run", "", 1.0),
        "repeat" => a("Repeat", "", 1.0),
        "point" => a("Sweep point", "", 1.0),
        "daemon.pool_traps" | "pool_traps" => a("DAX traps (device misses)", "", 1.0),
        "daemon.fuse_requests" => a("FUSE requests", "", 1.0),
        "modeled_miss_ns" => a("Modeled miss latency, mean", "µs", 1e3),
        "miss_p50_ns" => a("Miss latency the guest felt, median", "µs", 1e3),
        "miss_p99_ns" => a("Miss latency the guest felt, p99", "µs", 1e3),
        "daemon.read_bytes" => a("Bytes read through FUSE", "MiB", MIB),
        "daemon.write_bytes" => a("Bytes written through FUSE", "MiB", MIB),
        "daemon.nand_reads" | "daemon.vm_nand_reads" => a("NAND page reads", "", 1.0),
        "daemon.nand_programs" | "daemon.vm_nand_programs" => a("NAND page programs", "", 1.0),
        "daemon.dram_tier_pages" => a("DRAM-tier page accesses", "", 1.0),
        "daemon.device_resident_pages" | "resident_cxl_pages" => {
            a("Pages in the device cache", "", 1.0)
        }
        "resident_dram_pages" => a("DRAM-tier pages", "", 1.0),
        "traps" => a("File pages faulted in (DAX traps)", "", 1.0),
        "shared_pages" => a("Pages mapped by two or more VMs", "", 1.0),
        "placed_cxl_pages" => a("Pages placed on the CXL tier", "", 1.0),
        "placed_dram_pages" => a("Pages placed on the DRAM tier", "", 1.0),
        "achieved_cxl_share" => a("Pages on the CXL tier", "%", 0.01),
        "pool_resident_bytes" => a("Pool bytes resident", "MiB", MIB),
        "dax_maps" => a("DAX slots mapped", "", 1.0),
        "dax_unmaps" => a("DAX slots unmapped", "", 1.0),
        "mapped_pages" | "dax_mapped_pages" => a("File pages mapped in the DAX window", "", 1.0),
        "dax_mapped_bytes" => a("File bytes mapped in the VM's DAX window", "MiB", MIB),
        "region_traps" => a("Memory-region traps", "", 1.0),
        "region_vmm_traps" => a("Memory-region traps by the VMM", "", 1.0),
        "region_device_hits" => a("Memory-region device-cache hits", "pages", 1.0),
        "region_device_misses" => a("Memory-region device-cache misses", "pages", 1.0),
        "region_trap_modeled_ns" => a("Modeled memory-region trap time", "ms", 1e6),
        "region_writeback_bytes" => a("Memory-region write-back", "MiB", MIB),
        "region_readahead_refused" => a("Readaheads refused", "", 1.0),
        "region_device_resident_pages" => a("Memory-region pages in the device cache", "", 1.0),
        "region_sampled_accesses" => a("Resident-page accesses sampled", "", 1.0),
        "region_sampling_armed_pages" => a("Pages armed for access sampling", "", 1.0),
        "region_prefetch_filled_pages" => a("Prefetched region pages pushed", "", 1.0),
        "wss_over_cache" => a("Working set / device cache", "×", 1.0),
        "share" => a("Share of loads", "%", 1.0),
        "cumulative_share" => a("Cumulative share of loads", "%", 1.0),
        "time_s" => a("Time since the first sample", "s", 1.0),
        "pgpromote_success" => a("Pages promoted to DRAM", "", 1.0),
        "pgdemote_kswapd" => a("Pages demoted by kswapd", "", 1.0),
        "pgdemote_direct" => a("Pages demoted in direct reclaim", "", 1.0),
        "numa_hint_faults" => a("NUMA hinting faults", "", 1.0),
        _ => return None,
    })
}

/// "read_mb_s" → "Read"; capitalises, spaces for `_` and `.`.
pub fn humanise(s: &str) -> String {
    let words: Vec<&str> = s.split(['_', '.', '-']).filter(|w| !w.is_empty()).collect();
    let mut out = words.join(" ");
    // `p99 latency` keeps its lower-case p; other first words are capitalised.
    let first = words.first().copied().unwrap_or("");
    let pct =
        first.len() > 1 && first.starts_with('p') && first[1..].chars().all(|c| c.is_ascii_digit());
    if !pct {
        out = capitalise(&out);
    }
    out
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// `p99`, `p999`, `mean`, `median`, `max`, `min`, `avg`: a statistic's name.
fn is_stat(s: &str) -> bool {
    matches!(s, "mean" | "median" | "max" | "min" | "avg" | "count")
        || (s.len() > 1 && s.starts_with('p') && s[1..].chars().all(|c| c.is_ascii_digit()))
}

/// A name by its unit suffix: `read_mb_s` → ("Read throughput", MB/s),
/// `p99_ms` → ("p99 latency", ms), `hit_share` → ("Hit share", %).
fn by_suffix(name: &str) -> AxisInfo {
    if let Some(a) = exact(name) {
        return a;
    }
    let a = AxisInfo::new;
    // Nested series fields: `trap_latency_ns.p99` → "Trap latency, p99 (µs)".
    if let Some((base, stat)) = name.rsplit_once('.') {
        if is_stat(stat) {
            let b = by_suffix(base);
            return AxisInfo {
                name: format!("{}, {stat}", b.name),
                ..b
            };
        }
    }
    let rate = |rest: &str, unit: &str, scale: f64| {
        let n = if rest.is_empty() {
            "Throughput".to_string()
        } else {
            format!("{} throughput", humanise(rest))
        };
        a(&n, unit, scale)
    };
    let time = |rest: &str, unit: &str, scale: f64| {
        let r = humanise(rest);
        let n = if rest.is_empty() {
            "Latency".to_string()
        } else if is_stat(rest.rsplit('_').next().unwrap_or(""))
            || rest.ends_with("latency")
            || rest.ends_with("lat")
        {
            let r = r.strip_suffix(" lat").unwrap_or(&r).to_string();
            if r.ends_with("latency") {
                r
            } else {
                format!("{r} latency")
            }
        } else {
            r
        };
        a(&n, unit, scale)
    };
    for (suffix, unit, scale) in [
        ("bytes_per_sec", "MB/s", 1e6),
        ("mb_s", "MB/s", 1.0),
        ("mb_per_s", "MB/s", 1.0),
        ("mib_s", "MiB/s", 1.0),
        ("gb_s", "GB/s", 1.0),
        ("kb_s", "kB/s", 1.0),
    ] {
        if let Some(rest) = strip_suffix_word(name, suffix) {
            return rate(rest, unit, scale);
        }
    }
    for suffix in ["ops_per_sec", "ops_per_s", "ops_s", "per_sec", "iops"] {
        if let Some(rest) = strip_suffix_word(name, suffix) {
            let n = if rest.is_empty() || rest == "ops" {
                "Throughput".to_string()
            } else {
                format!("{} throughput", humanise(rest))
            };
            return a(&n, "operations/s", 1.0);
        }
    }
    for (suffix, unit, scale) in [
        ("ns", "µs", 1e3),
        ("us", "µs", 1.0),
        ("ms", "ms", 1.0),
        ("sec", "s", 1.0),
        ("s", "s", 1.0),
    ] {
        if let Some(rest) = strip_suffix_word(name, suffix) {
            return time(rest, unit, scale);
        }
    }
    for (suffix, unit, scale) in [
        ("share", "%", 0.01),
        ("hit_rate", "%", 0.01),
        ("miss_rate", "%", 0.01),
        ("fraction", "%", 0.01),
        ("pct", "%", 1.0),
        ("percent", "%", 1.0),
    ] {
        if let Some(rest) = strip_suffix_word(name, suffix) {
            let n = match suffix {
                "pct" | "percent" => humanise(rest),
                _ => humanise(name),
            };
            return a(&n, unit, scale);
        }
    }
    if let Some(rest) = strip_suffix_word(name, "bytes") {
        return a(&humanise(rest), "MiB", MIB);
    }
    if let Some(rest) = strip_suffix_word(name, "pages") {
        let n = if rest.is_empty() {
            "Pages".to_string()
        } else {
            format!("{} pages", humanise(rest))
        };
        return a(&n, "", 1.0);
    }
    if name.contains("size") {
        return a(&humanise(name), "MiB", MIB);
    }
    // `wss_over_cache` → "Wss / cache (×)".
    if let Some((num, den)) = name.split_once("_over_") {
        return a(
            &format!("{} / {}", humanise(num), den.replace('_', " ")),
            "×",
            1.0,
        );
    }
    a(&humanise(name), "", 1.0)
}

/// `name` without `_suffix` (or equal to `suffix`: the empty rest).
fn strip_suffix_word<'a>(name: &'a str, suffix: &str) -> Option<&'a str> {
    if name == suffix {
        return Some("");
    }
    name.strip_suffix(suffix)?.strip_suffix('_')
}

/// How column `col` is shown: its name in words, unit and scale.
pub fn axis_info(col: &str) -> AxisInfo {
    if let Some(a) = exact(col) {
        return a;
    }
    // fio: `read_clat_p99_ns`, `write_clat_mean_ns`, `read_lat_max_ns`.
    for dir in ["read", "write"] {
        for kind in ["clat", "lat", "slat"] {
            let prefix = format!("{dir}_{kind}_");
            if let Some(stat) = col
                .strip_prefix(&prefix)
                .and_then(|r| r.strip_suffix("_ns"))
            {
                let mut name = fio_latency(dir, stat);
                if kind == "slat" {
                    name = name.replacen("latency", "submission latency", 1);
                }
                return AxisInfo::new(&name, "µs", 1e3);
            }
        }
        if let Some(rest) = col.strip_prefix(&format!("{dir}_")) {
            if let Some(io) = rest.strip_suffix("io_bytes") {
                let _ = io;
                return AxisInfo::new(&format!("{} volume", capitalise(dir)), "MiB", MIB);
            }
        }
    }
    // Output of a guest command: `out.read_mb_s`, `out.p99_ms`.
    if let Some(name) = col.strip_prefix("out.") {
        return by_suffix(name);
    }
    // Series fields at a phase's end and daemon figures.
    for prefix in ["metrics.", "daemon.", "params.", "phase.", "fio.", "vms."] {
        if let Some(rest) = col.strip_prefix(prefix) {
            if let Some(a) = exact(rest) {
                return a;
            }
            if prefix == "daemon." && rest.contains('.') {
                // A device key: `daemon.device.cache.ways` → "Cache ways".
                let tail: Vec<&str> = rest.rsplitn(2, '.').collect();
                return by_suffix(&format!(
                    "{}_{}",
                    rest.split('.').rev().nth(1).unwrap_or(""),
                    tail[0]
                ));
            }
            return by_suffix(rest);
        }
    }
    by_suffix(col)
}

/// A number as a tick label: at most 3 significant digits, SI suffixes
/// from 1000 on (`1.5k`, `20M`, `3G`), never an exponent for usual values.
pub fn eng(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let (x, suffix) = if a >= 1e15 {
        (v / 1e15, "P")
    } else if a >= 1e12 {
        (v / 1e12, "T")
    } else if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    if x.abs() < 1e-4 {
        return format!("{x:.0e}");
    }
    format!("{}{suffix}", sig3(x))
}

/// `x` rounded to 3 significant digits, without trailing zeros.
fn sig3(x: f64) -> String {
    let mag = x.abs().log10().floor() as i32;
    let decimals = (2 - mag).clamp(0, 6) as usize;
    let s = format!("{x:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

/// Tick positions for a linear axis over `lo..hi`: multiples of 1, 2 or 5
/// × 10^k, about `want` of them.
pub fn linear_ticks(lo: f64, hi: f64, want: usize) -> Vec<f64> {
    if hi <= lo || !lo.is_finite() || !hi.is_finite() {
        return vec![lo];
    }
    let raw = (hi - lo) / want.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    // 0.6000000000000001 → 0.6: round to the step's decimals.
    let decimals = (-step.log10().floor()).max(0.0) as usize + 1;
    (first..=last)
        .map(|i| {
            let t = i as f64 * step;
            format!("{t:.decimals$}").parse().unwrap_or(t)
        })
        .collect()
}

/// The end of a linear axis: the first tick at or above `hi`.
pub fn nice_ceiling(hi: f64, want: usize) -> f64 {
    if hi <= 0.0 {
        return 1.0;
    }
    let raw = hi / want.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (hi / step).ceil() * step
}

/// Tick positions for a log axis over `lo..hi` (both > 0): decades, with
/// 2 and 5 in between when the axis spans few decades.
/// Returns (labelled ticks, minor grid lines).
pub fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    if !(lo > 0.0 && hi > lo) {
        return (vec![lo.max(f64::MIN_POSITIVE)], Vec::new());
    }
    let d0 = lo.log10().floor() as i32;
    let d1 = hi.log10().ceil() as i32;
    let decades = d1 - d0;
    let mults: &[f64] = if decades <= 1 {
        &[1.0, 1.5, 2.0, 3.0, 5.0, 7.0]
    } else if decades <= 3 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    let step = if decades > 8 { 2 } else { 1 };
    let mut major = Vec::new();
    let mut minor = Vec::new();
    for d in d0..=d1 {
        let base = 10f64.powi(d);
        for m in 1..10 {
            let v = base * f64::from(m);
            if v < lo * (1.0 - 1e-9) || v > hi * (1.0 + 1e-9) {
                continue;
            }
            let labelled = mults.contains(&f64::from(m)) && (m != 1 || (d - d0) % step == 0);
            if labelled {
                major.push(v);
            } else {
                minor.push(v);
            }
        }
        if decades <= 1 {
            let v = base * 1.5;
            if v >= lo && v <= hi {
                major.push(v);
            }
        }
    }
    major.sort_by(f64::total_cmp);
    (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_columns_get_words_units_and_scales() {
        let l = |c: &str| axis_info(c).label();
        assert_eq!(l("read_bw_bytes_per_sec"), "Read bandwidth (MB/s)");
        assert_eq!(axis_info("read_bw_bytes_per_sec").scale, 1e6);
        assert_eq!(l("read_clat_p99_ns"), "Read latency, p99 (µs)");
        assert_eq!(l("write_clat_p50_ns"), "Write latency, median (µs)");
        assert_eq!(axis_info("read_clat_p99_ns").scale, 1e3);
        assert_eq!(l("daemon.cxl_ratio"), "File pages on the CXL-SSD (%)");
        assert_eq!(l("cxl_ratio"), "File pages on the CXL-SSD (%)");
        assert_eq!(l("fio.size"), "Working set (MiB)");
        assert_eq!(axis_info("fio.size").scale, 1048576.0);
        assert_eq!(l("daemon.pool_traps"), "DAX traps (device misses)");
        assert_eq!(l("wss_over_cache"), "Working set / device cache (×)");
        assert_eq!(l("out.wss_over_cache"), "Working set / device cache (×)");
        assert_eq!(l("device_hit_rate"), "Device-cache hit rate (%)");
        assert_eq!(axis_info("device_hit_rate").scale, 0.01);
        assert_eq!(l("daemon.device.cache.policy"), "Eviction policy");
        // Guest command outputs.
        assert_eq!(l("out.read_mb_s"), "Read throughput (MB/s)");
        assert_eq!(l("out.ops_per_sec"), "Throughput (operations/s)");
        assert_eq!(l("out.p99_ms"), "p99 latency (ms)");
        assert_eq!(l("out.load_p50_ns"), "Load p50 latency (µs)");
        assert_eq!(l("out.hit_share"), "Hit share (%)");
        assert_eq!(axis_info("out.hit_share").scale, 0.01);
        // Series fields.
        assert_eq!(l("metrics.trap_latency_ns.p99"), "Trap latency, p99 (µs)");
        assert_eq!(l("metrics.resident_cxl_pages"), "Pages in the device cache");
        assert_eq!(
            l("daemon.device_resident_pages"),
            "Pages in the device cache"
        );
        assert_eq!(l("daemon.device.cache.size_bytes"), "Device cache (MiB)");
        // Unknown: humanised.
        assert_eq!(l("daemon.dax_maps"), "DAX slots mapped");
        assert_eq!(l("some_new_figure"), "Some new figure");
        assert_eq!(l("out.wss_bytes"), "Wss (MiB)");
        assert_eq!(l("daemon.device.cache.ways"), "Cache ways");
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(eng(0.0), "0");
        assert_eq!(eng(1.0), "1");
        assert_eq!(eng(2.5), "2.5");
        assert_eq!(eng(0.1 + 0.2), "0.3");
        assert_eq!(eng(0.05), "0.05");
        assert_eq!(eng(100.0), "100");
        assert_eq!(eng(1000.0), "1k");
        assert_eq!(eng(999.0), "999");
        assert_eq!(eng(1500.0), "1.5k");
        assert_eq!(eng(20_000.0), "20k");
        assert_eq!(eng(20e6), "20M");
        assert_eq!(eng(6e8), "600M");
        assert_eq!(eng(1.25e9), "1.25G");
        assert_eq!(eng(-3000.5), "-3k");
        assert_eq!(eng(123_456.0), "123k");
        assert!(!eng(6e8).contains('e'));
    }

    #[test]
    fn ticks_are_1_2_5_multiples() {
        assert_eq!(
            linear_ticks(0.0, 100.0, 5),
            vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
        );
        assert_eq!(
            linear_ticks(0.0, 1.0, 5),
            vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
        );
        let t = linear_ticks(0.0, 0.3, 3);
        assert_eq!(
            t.iter().map(|v| eng(*v)).collect::<Vec<_>>(),
            ["0", "0.1", "0.2", "0.3"]
        );
        assert_eq!(nice_ceiling(93.0, 5), 100.0);
        assert_eq!(nice_ceiling(1234.0, 6), 1250.0);
        let (major, minor) = log_ticks(1.0, 1000.0);
        assert_eq!(
            major,
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        );
        assert!(minor.contains(&3.0));
        let (major, _) = log_ticks(0.1, 1e5);
        assert_eq!(major, vec![0.1, 1.0, 10.0, 100.0, 1000.0, 1e4, 1e5]);
    }
}
