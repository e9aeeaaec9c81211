//! The compact text table of a run's results (what `cxlfs run` and
//! `cxlfs table` print): the columns a spec measured, and no others — fio's
//! only where fio ran, the device's counts with the memory regions' added
//! where a VM has one, then the phase outputs (`out.*`) and the
//! full-system vs replay hit shares (`hit_share.*`) when there are any.

use crate::results::{cell_text, ResultsFile, Row};
use serde_json::Value;
use std::fmt::Write as _;

/// The most output columns shown (the rest are in results.csv).
const MAX_OUTPUTS: usize = 8;

/// A figure column: its header and how a row's cell is made.
struct Column {
    header: String,
    cell: Box<dyn Fn(&Row) -> String>,
}

fn get(r: &Row, k: &str) -> Option<f64> {
    r.get(k).and_then(Value::as_f64)
}

/// Whether any row has any of `keys`.
fn any_has(res: &ResultsFile, keys: &[&str]) -> bool {
    res.rows
        .iter()
        .any(|r| keys.iter().any(|k| r.contains_key(*k)))
}

/// fio's columns, when fio ran in some phase.
fn fio_columns(res: &ResultsFile) -> Vec<Column> {
    let fio = [
        "read_bw_bytes_per_sec",
        "write_bw_bytes_per_sec",
        "read_iops",
        "write_iops",
    ];
    if !any_has(res, &fio) {
        return Vec::new();
    }
    let mb = |k: &'static str| -> Box<dyn Fn(&Row) -> String> {
        Box::new(move |r| {
            get(r, k)
                .map(|x| format!("{:.1}", x / 1e6))
                .unwrap_or_default()
        })
    };
    vec![
        Column {
            header: "read MB/s".into(),
            cell: mb("read_bw_bytes_per_sec"),
        },
        Column {
            header: "write MB/s".into(),
            cell: mb("write_bw_bytes_per_sec"),
        },
        Column {
            header: "kIOPS".into(),
            cell: Box::new(|r| match (get(r, "read_iops"), get(r, "write_iops")) {
                (None, None) => String::new(),
                (a, b) => format!("{:.2}", (a.unwrap_or(0.0) + b.unwrap_or(0.0)) / 1e3),
            }),
        },
        Column {
            header: "rd p99 us".into(),
            cell: Box::new(|r| {
                get(r, "read_clat_p99_ns")
                    .map(|x| format!("{:.0}", x / 1e3))
                    .unwrap_or_default()
            }),
        },
    ]
}

/// A VM's device hits and misses: its file pages' (FUSE and DAX traps)
/// plus its CXL memory region's, where it has one.
fn device_counts(r: &Row) -> Option<(f64, f64)> {
    let pick = |file: &str, region: &str| match (get(r, file), get(r, region)) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    };
    Some((
        pick("device_hits", "daemon.region_device_hits")?,
        pick("device_misses", "daemon.region_device_misses")?,
    ))
}

/// A VM's references (accessed bits: resident pages it reached that the
/// device's policy was told of, each at most once a period).
fn device_references(r: &Row) -> Option<f64> {
    get(r, "daemon.references")
}

/// The hit share the device counted: (hits + references) / (hits +
/// references + misses); `None` with no count at all.
pub fn counted_hit_share(r: &Row) -> Option<f64> {
    let (h, m) = device_counts(r)?;
    let seen = h + device_references(r).unwrap_or(0.0);
    (seen + m > 0.0).then(|| seen / (seen + m))
}

/// Whether the device saw none of the VM's hits on mapped pages: its
/// pages were mapped (traps of a DAX window or a memory region) and both
/// hit sources were off.
fn hits_blind(r: &Row) -> bool {
    let text = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
    let mapped = get(r, "daemon.pool_traps").is_some_and(|t| t > 0.0)
        || get(r, "daemon.region_traps").is_some_and(|t| t > 0.0);
    mapped && text("daemon.access_bits") == "off" && text("daemon.access_sampling") == "off"
}

/// The device's columns: hits, misses, references (where the accessed
/// bits gave any), hit %: what the device counted, (hits + references) /
/// (hits + references + misses); `blind` where it saw no hit on mapped
/// pages at all; and where the guests' fio logs were replayed
/// (`replay_iolog`), the replay's share counted the same way.
fn device_columns(res: &ResultsFile) -> Vec<Column> {
    let count = |i: usize| -> Box<dyn Fn(&Row) -> String> {
        Box::new(move |r| {
            device_counts(r)
                .map(|c| format!("{:.0}", if i == 0 { c.0 } else { c.1 }))
                .unwrap_or_default()
        })
    };
    let mut cols = vec![
        Column {
            header: "dev hits".into(),
            cell: count(0),
        },
        Column {
            header: "dev misses".into(),
            cell: count(1),
        },
    ];
    if any_has(res, &["daemon.references"]) {
        cols.push(Column {
            header: "dev refs".into(),
            cell: Box::new(|r| {
                device_references(r)
                    .map(|x| format!("{x:.0}"))
                    .unwrap_or_default()
            }),
        });
    }
    cols.push(Column {
        header: "hit %".into(),
        cell: Box::new(|r| {
            if hits_blind(r) {
                return "blind".into();
            }
            counted_hit_share(r)
                .map(|x| format!("{:.1}", 100.0 * x))
                .unwrap_or_default()
        }),
    });
    if any_has(res, &["replay.counted_hit_share"]) {
        cols.push(Column {
            header: "replay hit %".into(),
            cell: Box::new(|r| {
                if hits_blind(r) {
                    return "blind".into();
                }
                get(r, "replay.counted_hit_share")
                    .map(|x| format!("{:.1}", 100.0 * x))
                    .unwrap_or_default()
            }),
        });
    }
    cols
}

/// A number as the table shows it: integers whole, others to 3
/// significant digits past the point at most.
fn short_number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.3}")
    }
}

/// The hit-share checks (`hit_share.KIND`, headed `hit% KIND`, in percent),
/// the miss-latency check (`miss_p50_ns`, `miss_p99_ns`, `modeled_miss_ns`)
/// and the phase outputs (`out.NAME`, headed NAME, in the order the
/// results list them); at most [`MAX_OUTPUTS`].
fn output_columns(res: &ResultsFile) -> (Vec<Column>, usize) {
    let present = |c: &str| res.rows.iter().any(|r| r.contains_key(c));
    // The hit shares first, measured before predicted, then the outputs.
    let shares = [
        "full_system",
        "replay",
        "replay_blind",
        "replay_visible",
        "diff_points",
    ]
    .map(|k| format!("hit_share.{k}"));
    let misses = ["miss_p50_ns", "miss_p99_ns", "modeled_miss_ns"].map(String::from);
    let keys: Vec<String> = shares
        .into_iter()
        .chain(misses)
        .filter(|c| present(c))
        .chain(
            res.columns
                .iter()
                .filter(|c| c.starts_with("out.") && present(c))
                .cloned(),
        )
        .collect();
    let left = keys.len().saturating_sub(MAX_OUTPUTS);
    let cols = keys
        .into_iter()
        .take(MAX_OUTPUTS)
        .map(|k| {
            if let Some(kind) = k.strip_prefix("hit_share.") {
                let percent = kind != "diff_points";
                let header = if percent {
                    format!("hit% {kind}")
                } else {
                    "hit diff pts".to_string()
                };
                Column {
                    header,
                    cell: Box::new(move |r| {
                        get(r, &k)
                            .map(|x| {
                                if percent {
                                    format!("{:.1}", x * 100.0)
                                } else {
                                    format!("{x:.1}")
                                }
                            })
                            .unwrap_or_default()
                    }),
                }
            } else {
                Column {
                    header: k.trim_start_matches("out.").to_string(),
                    cell: Box::new(move |r| get(r, &k).map(short_number).unwrap_or_default()),
                }
            }
        })
        .collect();
    (cols, left)
}

/// A compact text table of the results (what `make demo` prints).
pub fn text_table(res: &ResultsFile) -> String {
    let short = |p: &str| p.rsplit('.').next().unwrap_or(p).to_string();
    // The policy column only when no swept key already shows it.
    let show_policy = !res.param_columns.iter().any(|p| short(p) == "policy");
    let mut header: Vec<String> = ["run", "phase", "vm", "status"].map(String::from).to_vec();
    header.extend(res.param_columns.iter().map(|p| short(p)));
    if show_policy {
        header.push("policy".into());
    }
    let (outputs, left) = output_columns(res);
    let mut figures = fio_columns(res);
    figures.extend(device_columns(res));
    figures.extend(outputs);
    header.extend(figures.iter().map(|c| c.header.clone()));
    let mut lines: Vec<Vec<String>> = vec![header];
    let mut errors = Vec::new();
    for r in &res.rows {
        let text = |k: &str| r.get(k).map(cell_text).unwrap_or_default();
        // With one guest the aggregate row repeats it.
        if text("vm") == "all" && text("vms") == "1" {
            continue;
        }
        let mut line = vec![text("run"), text("phase"), text("vm"), text("status")];
        line.extend(res.param_columns.iter().map(|p| text(p)));
        if show_policy {
            line.push(text("policy"));
        }
        line.extend(figures.iter().map(|c| (c.cell)(r)));
        let failed = r.get("status").and_then(Value::as_str) != Some("ok");
        let line_err = format!("run {}: {}", text("run"), text("error"));
        if failed
            && r.get("vm").and_then(Value::as_str) == Some("all")
            && !errors.contains(&line_err)
        {
            errors.push(line_err);
        }
        lines.push(line);
    }
    let mut out = aligned(&lines, 4);
    if left > 0 {
        let _ = writeln!(out, "(and {left} more output column(s) in results.csv)");
    }
    for e in errors {
        let short: String = e.chars().take(300).collect();
        let _ = writeln!(out, "{short}");
    }
    out
}

/// `lines` as columns two spaces apart, padded to their widths: the first
/// `left` left-aligned, the rest right-aligned; trailing blanks trimmed.
pub fn aligned(lines: &[Vec<String>], left: usize) -> String {
    let cols = lines.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for l in lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < left {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn row(v: Value) -> Row {
        v.as_object().unwrap().clone()
    }

    fn header(table: &str) -> Vec<String> {
        let first = table.lines().next().unwrap();
        first
            .split("  ")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    }

    #[test]
    fn fio_runs_show_fio_and_the_device() {
        let mut res = ResultsFile::new("t", vec![]);
        res.push([row(json!({"run": 1, "phase": "p", "status": "ok", "vm": "vm0",
            "read_bw_bytes_per_sec": 3e6, "read_iops": 1500.0, "device_hits": 30, "device_misses": 10}))]);
        let t = text_table(&res);
        let h = header(&t);
        assert!(h.contains(&"read MB/s".to_string()), "{t}");
        assert!(!h.iter().any(|c| c.starts_with("hit%")), "{t}");
        let line = t.lines().nth(1).unwrap();
        assert!(line.contains("3.0") && line.contains("1.50"), "{t}");
        assert!(line.trim_end().ends_with("30          10   75.0"), "{t}");
    }

    #[test]
    fn a_memory_mode_probe_shows_its_outputs_and_region_counts_not_fio() {
        let mut res = ResultsFile::new("t", vec![]);
        res.push([row(
            json!({"run": 1, "phase": "zipf", "status": "ok", "vm": "vm0",
            "device_hits": 0, "device_misses": 66,
            "daemon.region_device_hits": 34, "daemon.region_device_misses": 300,
            "out.loads_per_s": 49478.8, "out.mean_ns": 20.25,
            "hit_share.full_system": 0.8481, "hit_share.replay": 0.854,
            "hit_share.diff_points": -0.59}),
        )]);
        let t = text_table(&res);
        let h = header(&t);
        assert!(!h.iter().any(|c| c.contains("MB/s") || c == "kIOPS"), "{t}");
        for want in [
            "loads_per_s",
            "mean_ns",
            "hit% full_system",
            "hit% replay",
            "hit diff pts",
        ] {
            assert!(h.contains(&want.to_string()), "no {want}: {t}");
        }
        let line = t.lines().nth(1).unwrap();
        // 34 hits of 400 page accesses (the region's and the share's).
        for want in [
            " 34 ", " 366 ", " 8.5 ", " 49479 ", " 20.250 ", " 84.8 ", " 85.4 ", " -0.6",
        ] {
            assert!(format!("{line} ").contains(want), "no {want:?} in {line}");
        }
    }

    #[test]
    fn references_count_as_seen_hits_and_a_blind_device_says_so() {
        let mut res = ResultsFile::new("t", vec![]);
        res.push([
            row(json!({"run": 1, "phase": "p", "status": "ok", "vm": "vm0",
                "device_hits": 4, "device_misses": 100, "daemon.references": 296,
                "daemon.pool_traps": 104, "daemon.access_bits": "on",
                "daemon.access_sampling": "off"})),
            row(json!({"run": 2, "phase": "p", "status": "ok", "vm": "vm0",
                "device_hits": 4, "device_misses": 100, "daemon.pool_traps": 104,
                "daemon.access_bits": "off", "daemon.access_sampling": "off"})),
        ]);
        let t = text_table(&res);
        let h = header(&t);
        assert!(h.contains(&"dev refs".to_string()), "{t}");
        let lines: Vec<&str> = t.lines().collect();
        // (4 + 296) / (4 + 296 + 100) = 75 %.
        assert!(lines[1].trim_end().ends_with("296   75.0"), "{t}");
        assert!(lines[2].trim_end().ends_with("blind"), "{t}");
    }

    #[test]
    fn a_replayed_run_shows_the_replays_counted_share_beside_the_devices() {
        let mut res = ResultsFile::new("t", vec![]);
        res.push([
            row(json!({"run": 1, "phase": "p", "status": "ok", "vm": "vm0",
                "device_hits": 4, "device_misses": 100, "daemon.references": 296,
                "daemon.pool_traps": 104, "daemon.access_bits": "on",
                "daemon.access_sampling": "off", "replay.counted_hit_share": 0.7125})),
            // A run at a ratio the runner does not replay: an empty cell.
            row(json!({"run": 2, "phase": "p", "status": "ok", "vm": "vm0",
                "device_hits": 4, "device_misses": 100, "daemon.references": 296,
                "daemon.pool_traps": 104, "daemon.access_bits": "on",
                "daemon.access_sampling": "off"})),
        ]);
        let t = text_table(&res);
        assert_eq!(header(&t).last().unwrap(), "replay hit %", "{t}");
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[1].trim_end().ends_with("75.0          71.2"), "{t}");
        assert!(lines[2].trim_end().ends_with("75.0"), "{t}");
    }

    #[test]
    fn outputs_beyond_the_limit_are_counted_not_shown() {
        let mut res = ResultsFile::new("t", vec![]);
        let mut r = json!({"run": 1, "phase": "p", "status": "ok", "vm": "vm0"});
        for i in 0..(MAX_OUTPUTS + 2) {
            r[format!("out.x{i}")] = json!(i);
        }
        res.push([row(r)]);
        let t = text_table(&res);
        assert!(
            t.contains("(and 2 more output column(s) in results.csv)"),
            "{t}"
        );
        assert!(!header(&t).contains(&format!("x{}", MAX_OUTPUTS)), "{t}");
    }
}
