//! `cxlfs replay` runs the library's one replay loop (`Replayer::drive`, as
//! the replay benchmark does): same statistics as the library and as feeding
//! one access at a time; arrival modes recorded by `trace gen` and honoured;
//! the warning for traces whose times make every re-access a coalesced miss;
//! errors named by line past the look-ahead.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use common::{cxlfs, SMALL};

use cxlfs_device_model::replay::{Arrival, ReplayReport, Replayer};
use cxlfs_device_model::trace::{encode_record, Access, BinaryReader, BINARY_MAGIC_V1};
use cxlfs_device_model::{Device, DeviceConfig, Op};
use serde_json::Value;
use std::io::BufReader;
use std::path::Path;

/// Runs cxlfs, which must succeed; returns stdout and stderr.
fn ok(args: &[&str]) -> (String, String) {
    let out = cxlfs(args);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "cxlfs {args:?} failed: {stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

/// `cxlfs replay SMALL... ARGS... --json --reproducible`: the JSON and stderr.
fn replay_json(args: &[&str]) -> (Value, String) {
    let mut all = vec!["replay"];
    all.extend(SMALL);
    all.extend_from_slice(args);
    all.extend(["--json", "--reproducible"]);
    let (out, err) = ok(&all);
    (serde_json::from_str(&out).unwrap(), err)
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn small_config() -> DeviceConfig {
    cxlfs_device_model::presets::preset("femu")
        .unwrap()
        .with_overrides(&["cache.size_bytes=4MiB"])
        .unwrap()
}

/// Every field of `report` equals the CLI's (the report is flattened into its JSON).
fn assert_same_report(cli: &Value, report: &ReplayReport, what: &str) {
    let lib = serde_json::to_value(report).unwrap();
    for (key, value) in lib.as_object().unwrap() {
        assert_eq!(&cli[key], value, "{what}: {key}");
    }
}

#[test]
fn cli_replay_is_the_library_loop_and_equals_one_access_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("z.bin");
    let csv = dir.path().join("z.csv");
    ok(&[
        "trace",
        "gen",
        "--workload",
        "zipf:0.9",
        "--wss",
        "64MiB",
        "--accesses",
        "60000",
        "--write-ratio",
        "0.2",
        "--seed",
        "3",
        "--out",
        path_str(&bin),
    ]);
    ok(&["trace", "convert", path_str(&bin), path_str(&csv)]);
    let warmup = 10_000u64;
    let (cli, err) = replay_json(&["--trace", path_str(&bin), "--warmup", "10000"]);
    assert!(err.is_empty(), "{err}");
    assert_eq!(cli["arrival"], "closed");
    assert_eq!(cli["accesses"], 50_000);
    let (cli_csv, _) = replay_json(&["--trace", path_str(&csv), "--warmup", "10000"]);
    assert_eq!(cli_csv["arrival"], "closed");

    // What the bench runs: the binary trace through BinaryReader and Replayer::drive.
    let file = std::fs::File::open(&bin).unwrap();
    let reader = BinaryReader::new(BufReader::new(file)).unwrap();
    assert_eq!(
        reader.header().arrival,
        Some(Arrival::Closed { think_ns: 0 })
    );
    let accesses: Vec<Access> =
        BinaryReader::new(BufReader::new(std::fs::File::open(&bin).unwrap()))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
    let mut dev = Device::new(small_config()).unwrap();
    let mut looped = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    assert_eq!(looped.drive(reader, warmup, &mut ()).unwrap(), 60_000);
    let looped = looped.report();

    // One access at a time, no look-ahead.
    let mut dev = Device::new(small_config()).unwrap();
    let mut single = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    for (i, access) in accesses.iter().enumerate() {
        if i as u64 == warmup {
            single.reset_stats();
        }
        single.feed(*access).unwrap();
    }
    let single = single.report();

    assert_eq!(looped, single);
    assert!(looped.hits > 0 && looped.misses > 0 && looped.writes > 0);
    assert_same_report(&cli, &looped, "binary trace");
    assert_same_report(&cli_csv, &looped, "CSV trace");
}

#[test]
fn generated_traces_record_their_arrival_and_replay_like_the_workload() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("w.bin");
    let shape = [
        "--workload",
        "stride:1KiB",
        "--wss",
        "8MiB",
        "--accesses",
        "30000",
    ];
    let mut gen = vec!["trace", "gen", "--out", path_str(&bin)];
    gen.extend(shape);
    let (_, said) = ok(&gen);
    assert!(said.contains("arrival closed"), "{said}");
    let (workload, _) = replay_json(&shape);
    let (trace, err) = replay_json(&["--trace", path_str(&bin)]);
    assert!(err.is_empty(), "{err}");
    for key in [
        "accesses",
        "hits",
        "misses",
        "hit_rate",
        "latency_ns",
        "nand",
        "sim_time_ns",
    ] {
        assert_eq!(workload[key], trace[key], "{key}");
    }
    // Three of four accesses hit (one miss per 4 KiB page), none coalesced.
    assert_eq!(trace["hit_rate"], 0.75);
    assert_eq!(trace["coalesced"], 0);
    // The table says where the mode came from.
    let mut table = vec!["replay"];
    table.extend(SMALL);
    table.extend(["--trace", path_str(&bin), "--reproducible"]);
    let (out, _) = ok(&table);
    assert!(
        out.contains("arrival closed (recorded in the trace)"),
        "{out}"
    );

    // A think time and a fixed interval are recorded too; trace is refused.
    let think = dir.path().join("think.csv");
    let mut gen = vec![
        "trace",
        "gen",
        "--arrival",
        "closed:50ns",
        "--out",
        path_str(&think),
    ];
    gen.extend(shape);
    ok(&gen);
    let text = std::fs::read_to_string(&think).unwrap();
    assert!(text.starts_with("# arrival: closed:50\n"), "{text:.40}");
    let (j, _) = replay_json(&["--trace", path_str(&think)]);
    assert_eq!(j["arrival"], "closed:50");
    // --arrival on the command line wins over the trace's.
    let (j, _) = replay_json(&["--trace", path_str(&think), "--arrival", "closed"]);
    assert_eq!(j["arrival"], "closed");
    assert_eq!(j["hits"], trace["hits"]);

    let fixed = dir.path().join("fixed.bin");
    let mut gen = vec![
        "trace",
        "gen",
        "--arrival",
        "fixed:1us",
        "--out",
        path_str(&fixed),
    ];
    gen.extend(shape);
    ok(&gen);
    let times: Vec<u64> = BinaryReader::new(&std::fs::read(&fixed).unwrap()[..])
        .unwrap()
        .take(3)
        .map(|a| a.unwrap().time_ns)
        .collect();
    assert_eq!(times, [0, 1000, 2000]);
    let (j, _) = replay_json(&["--trace", path_str(&fixed)]);
    assert_eq!(j["arrival"], "fixed:1000");
    let (as_trace, _) = replay_json(&["--trace", path_str(&fixed), "--arrival", "trace"]);
    for key in ["hits", "misses", "coalesced", "latency_ns", "sim_time_ns"] {
        assert_eq!(j[key], as_trace[key], "{key}");
    }

    let mut gen = vec![
        "trace",
        "gen",
        "--arrival",
        "trace",
        "--out",
        path_str(&fixed),
    ];
    gen.extend(shape);
    let out = cxlfs(&gen);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no times of its own"));
}

#[test]
fn a_trace_stamped_all_at_once_is_flagged() {
    let dir = tempfile::tempdir().unwrap();
    // 32 pages, each read 64 times, every access at t = 0, no arrival recorded.
    let csv = dir.path().join("zero.csv");
    let mut text = String::from("time_ns,op,addr,len\n");
    for i in 0..2048u64 {
        text.push_str(&format!("0,R,{:#x},64\n", (i % 32) * 4096 + (i / 32) * 64));
    }
    std::fs::write(&csv, text).unwrap();
    let (j, err) = replay_json(&["--trace", path_str(&csv)]);
    assert_eq!(j["arrival"], "trace");
    assert_eq!(j["hits"], 0);
    assert_eq!(j["misses"], 2048);
    assert_eq!(j["coalesced"], 2048 - 32);
    assert!(err.starts_with("warning: 2016 of 2048 misses (98.4 %) joined a fill already in flight: all 2048 accesses arrive at t = 0 ns"), "{err}");
    assert!(
        err.contains(
            "if the trace's times are not real arrival times, replay it with --arrival closed"
        ),
        "{err}"
    );
    assert_eq!(j["coalescing_warning"]["coalesced"], 2016);
    // Closed loop: no warning, and the re-accesses hit.
    let (j, err) = replay_json(&["--trace", path_str(&csv), "--arrival", "closed"]);
    assert!(err.is_empty(), "{err}");
    assert!(j.get("coalescing_warning").is_none());
    assert_eq!(j["hits"], 2048 - 32);
    // Spread out in time (1 ms apart): nothing to say.
    let spread = dir.path().join("spread.csv");
    let mut text = String::new();
    for i in 0..2048u64 {
        text.push_str(&format!("{},R,{:#x},64\n", i * 1_000_000, (i % 32) * 4096));
    }
    std::fs::write(&spread, text).unwrap();
    let (j, err) = replay_json(&["--trace", path_str(&spread)]);
    assert!(err.is_empty(), "{err}");
    assert_eq!(j["coalesced"], 0);

    // `trace gen --interval 0` says so too, and in a sweep the point is named.
    let gen = dir.path().join("zero.bin");
    ok(&[
        "trace",
        "gen",
        "--workload",
        "seq",
        "--wss",
        "1MiB",
        "--passes",
        "1",
        "--interval",
        "0",
        "--out",
        path_str(&gen),
    ]);
    let mut args = vec!["replay"];
    args.extend(SMALL);
    args.extend([
        "--trace",
        path_str(&gen),
        "--sweep",
        "cache.policy=fifo,lru",
        "--reproducible",
    ]);
    let (_, err) = ok(&args);
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(err.contains("warning (cache.policy=lru): "), "{err}");
    assert!(err.contains("(arrival fixed:0)"), "{err}");
    assert!(
        err.contains("that is the arrival mode the trace records: --arrival closed"),
        "{err}"
    );
}

#[test]
fn errors_past_the_look_ahead_name_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("far.csv");
    let mut text = String::from("# a trace\ntime_ns,op,addr,len\n");
    for i in 0..100u64 {
        if i % 10 == 0 {
            text.push_str("# every tenth line a comment\n\n");
        }
        let addr = if i == 40 { 0xffff_ffff_ff00 } else { i * 4096 };
        text.push_str(&format!("{i},R,{addr:#x},64\n"));
    }
    std::fs::write(&csv, &text).unwrap();
    let line = text.lines().position(|l| l.starts_with("40,R,")).unwrap() + 1;
    let mut args = vec!["replay"];
    args.extend(SMALL);
    args.extend(["--trace", path_str(&csv)]);
    let out = cxlfs(&args);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(&format!("far.csv:{line}: access 40: ")),
        "line {line}: {err}"
    );
    // Binary: by record.
    let bin = dir.path().join("far.bin");
    ok(&["trace", "convert", path_str(&csv), path_str(&bin)]);
    let mut args = vec!["replay"];
    args.extend(SMALL);
    args.extend(["--trace", path_str(&bin)]);
    let err = String::from_utf8(cxlfs(&args).stderr).unwrap();
    assert!(err.contains("far.bin: record 40: access 40: "), "{err}");
    // A bad line after a good stretch: the reader's own line number.
    let fixed = text
        .replace("0xffffffffff00", "0x0")
        .replace("70,R,", "70,Q,");
    std::fs::write(&csv, &fixed).unwrap();
    let line = fixed.lines().position(|l| l.starts_with("70,Q,")).unwrap() + 1;
    let mut args = vec!["replay"];
    args.extend(SMALL);
    args.extend(["--trace", path_str(&csv), "--arrival", "closed"]);
    let err = String::from_utf8(cxlfs(&args).stderr).unwrap();
    assert!(
        err.contains(&format!("far.csv:{line}: field 2 (op): op must be R or W")),
        "line {line}: {err}"
    );
}

#[test]
fn version_1_binary_traces_still_replay() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = dir.path().join("old.bin");
    let mut bytes = BINARY_MAGIC_V1.to_vec();
    bytes.extend_from_slice(&3u64.to_le_bytes());
    for (t, addr) in [(0, 0), (100_000, 64), (200_000, 4096)] {
        let access = Access {
            time_ns: t,
            op: Op::Read,
            addr,
            len: 64,
        };
        bytes.extend_from_slice(&encode_record(&access).unwrap());
    }
    std::fs::write(&v1, bytes).unwrap();
    let (j, err) = replay_json(&["--trace", path_str(&v1)]);
    assert!(err.is_empty(), "{err}");
    assert_eq!(j["arrival"], "trace");
    assert_eq!(
        (j["accesses"].as_u64(), j["hits"].as_u64()),
        (Some(3), Some(1))
    );
}
