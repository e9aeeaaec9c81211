//! `cxlfs ctl`: the host's client of `cxlfsd --control-socket` (protocol in
//! `docs/control-api.md`): one JSON request line out, one reply line back.

use crate::device_args::{format_ns, human_size};
use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use cxlfs_device_model::units::parse_size;
use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Version of the control protocol this client speaks.
const PROTOCOL_VERSION: u64 = 1;

/// `cxlfs ctl` arguments.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The daemon's control socket (`cxlfsd --control-socket`).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Print the reply's result as JSON (one line) instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Give up on a reply after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    timeout: u64,
    #[command(subcommand)]
    command: CtlCommand,
}

/// A file range (relative to the shared directory) or a pool range.
#[derive(Debug, Args)]
pub struct RangeArgs {
    /// File, relative to the shared directory.
    #[arg(long, value_name = "PATH", conflicts_with = "pool_offset")]
    file: Option<String>,
    /// A pool (device address) range instead of a file: its first byte.
    #[arg(long, value_name = "BYTES")]
    pool_offset: Option<String>,
    /// First byte in the file (default 0).
    #[arg(long, value_name = "BYTES", conflicts_with = "pool_offset")]
    offset: Option<String>,
    /// Bytes (default: to the end of the file; required for a pool range).
    #[arg(long, value_name = "BYTES")]
    len: Option<String>,
}

#[derive(Debug, Subcommand)]
enum CtlCommand {
    /// Bring a range into the device cache.
    Prefetch(RangeArgs),
    /// Bring a range in and keep it there.
    Pin(RangeArgs),
    /// Release pins on a range (all holders', the host is the admin).
    Unpin(RangeArgs),
    /// Drop a range from the device cache (pinned pages stay).
    Evict(RangeArgs),
    /// Switch the eviction policy (fifo lifo lru clock s3fifo 2q lfru); resident pages stay.
    SetPolicy {
        /// Policy name.
        name: String,
        /// A policy parameter, e.g. `--param s3fifo_small_ratio=0.2` (repeatable).
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
    },
    /// Change the prefetcher.
    SetPrefetch {
        /// Pages prefetched after a miss (0 = off).
        #[arg(long)]
        degree: u32,
        /// Stride in pages (default: keep the current one).
        #[arg(long)]
        stride: Option<u32>,
    },
    /// Set the share of memory placed on the CXL device (percent).
    SetCxlRatio {
        /// Percent.
        percent: u32,
    },
    /// Hit / miss / trap / pin counters, per VM and in total, and the policy.
    Stats {
        /// Only this VM.
        #[arg(long)]
        vm: Option<String>,
    },
    /// Zero the device's counters (and the per-VM hit / miss / trap counts).
    ResetStats,
    /// The daemon's effective configuration.
    Config,
}

fn size(s: &Option<String>, what: &str) -> anyhow::Result<Option<u64>> {
    s.as_deref()
        .map(|t| parse_size(t).map_err(|e| anyhow!("--{what} `{t}`: {e}")))
        .transpose()
}

fn range_request(cmd: &str, a: &RangeArgs) -> anyhow::Result<Value> {
    let mut req = Map::new();
    req.insert("cmd".into(), json!(cmd));
    match (&a.file, size(&a.pool_offset, "pool-offset")?) {
        (Some(f), None) => {
            req.insert("file".into(), json!(f));
            if let Some(o) = size(&a.offset, "offset")? {
                req.insert("offset".into(), json!(o));
            }
        }
        (None, Some(p)) => {
            req.insert("pool_offset".into(), json!(p));
        }
        _ => bail!("give --file PATH or --pool-offset N"),
    }
    if let Some(l) = size(&a.len, "len")? {
        req.insert("len".into(), json!(l));
    }
    Ok(Value::Object(req))
}

fn request(cmd: &CtlCommand) -> anyhow::Result<Value> {
    Ok(match cmd {
        CtlCommand::Prefetch(a) => range_request("prefetch", a)?,
        CtlCommand::Pin(a) => range_request("pin", a)?,
        CtlCommand::Unpin(a) => range_request("unpin", a)?,
        CtlCommand::Evict(a) => range_request("evict", a)?,
        CtlCommand::SetPolicy { name, params } => {
            let mut p = Map::new();
            for kv in params {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| anyhow!("--param `{kv}` is not KEY=VALUE"))?;
                let v = serde_json::from_str(v).unwrap_or_else(|_| json!(v));
                p.insert(k.to_string(), v);
            }
            json!({"cmd": "set_policy", "name": name, "params": p})
        }
        CtlCommand::SetPrefetch { degree, stride } => {
            let mut v = json!({"cmd": "set_prefetch", "degree": degree});
            if let Some(s) = stride {
                v["stride"] = json!(s);
            }
            v
        }
        CtlCommand::SetCxlRatio { percent } => json!({"cmd": "set_cxl_ratio", "percent": percent}),
        CtlCommand::Stats { vm } => match vm {
            Some(vm) => json!({"cmd": "query_stats", "vm": vm}),
            None => json!({"cmd": "query_stats"}),
        },
        CtlCommand::ResetStats => json!({"cmd": "reset_stats"}),
        CtlCommand::Config => json!({"cmd": "get_config"}),
    })
}

/// Sends one request and returns the reply's `result` (an `ok: false`
/// reply is an error carrying the daemon's code and message).
pub fn call(socket: &PathBuf, mut req: Value, timeout: Duration) -> anyhow::Result<Value> {
    let id = std::process::id();
    req["v"] = json!(PROTOCOL_VERSION);
    req["id"] = json!(id);
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("cannot connect to the control socket {}", socket.display()))?;
    stream.set_read_timeout(Some(timeout))?;
    let mut line = req.to_string();
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .context("no reply from the daemon")?;
    if reply.is_empty() {
        bail!("the daemon closed the connection without a reply");
    }
    let v: Value = serde_json::from_str(&reply).context("the reply is not JSON")?;
    if v["id"] != json!(id) {
        bail!("the reply's id {} is not the request's {id}", v["id"]);
    }
    if v["ok"] == json!(true) {
        return Ok(v["result"].clone());
    }
    let code = v["error"]["code"].as_str().unwrap_or("error");
    let msg = v["error"]["message"].as_str().unwrap_or("(no message)");
    bail!("{code}: {msg}")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn print_human(cmd: &CtlCommand, r: &Value) {
    match cmd {
        CtlCommand::Prefetch(_)
        | CtlCommand::Pin(_)
        | CtlCommand::Unpin(_)
        | CtlCommand::Evict(_) => {
            let (verb, changed) = match cmd {
                CtlCommand::Prefetch(_) => ("prefetch", "read from NAND"),
                CtlCommand::Pin(_) => ("pin", "newly pinned"),
                CtlCommand::Unpin(_) => ("unpin", "released"),
                _ => ("evict", "evicted"),
            };
            println!(
                "{verb}: {} pages, {} {changed}, {} skipped, {} written back; device time {}",
                u(&r["pages"]),
                u(&r["changed"]),
                u(&r["skipped"]),
                u(&r["written_back"]),
                format_ns(u(&r["latency_ns"]) as f64)
            );
            if u(&r["plane_filled"]) + u(&r["plane_evicted"]) > 0 {
                println!(
                    "DAX residency plane: {} pages stored, {} dropped",
                    u(&r["plane_filled"]),
                    u(&r["plane_evicted"])
                );
            }
        }
        CtlCommand::SetPolicy { .. } => println!(
            "policy: {} -> {}",
            r["previous"].as_str().unwrap_or("?"),
            r["policy"].as_str().unwrap_or("?")
        ),
        CtlCommand::SetPrefetch { .. } => println!(
            "prefetch: degree {}, stride {} pages",
            u(&r["degree"]),
            u(&r["stride"])
        ),
        CtlCommand::SetCxlRatio { .. } => println!("cxl ratio: {r}"),
        CtlCommand::Stats { .. } => {
            println!(
                "policy {}, prefetch degree {} stride {}",
                r["policy"].as_str().unwrap_or("?"),
                u(&r["prefetch"]["degree"]),
                u(&r["prefetch"]["stride"])
            );
            println!(
                "{:<12} {:>14} {:>14} {:>12} {:>12}",
                "VM", "HITS", "MISSES", "TRAPS", "PINNED"
            );
            let row = |name: &str, s: &Value| {
                println!(
                    "{:<12} {:>14} {:>14} {:>12} {:>12}",
                    name,
                    u(&s["hits"]),
                    u(&s["misses"]),
                    u(&s["traps"]),
                    human_size(u(&s["pinned_bytes"]))
                );
            };
            if let Some(vms) = r["vms"].as_object() {
                for (name, s) in vms {
                    row(name, s);
                }
            }
            row("total", &r["total"]);
        }
        CtlCommand::ResetStats => println!("statistics reset"),
        CtlCommand::Config => {
            if let Some(m) = r.as_object() {
                for (k, v) in m {
                    if k != "device" && k != "device_toml" {
                        println!("# {k} = {v}");
                    }
                }
            }
            print!("{}", r["device_toml"].as_str().unwrap_or(""));
        }
    }
}

/// Runs `cxlfs ctl`.
pub fn run(args: &CtlArgs) -> anyhow::Result<()> {
    let req = request(&args.command)?;
    let result = call(&args.socket, req, Duration::from_secs(args.timeout.max(1)))?;
    if args.json {
        println!("{result}");
    } else {
        print_human(&args.command, &result);
    }
    Ok(())
}
