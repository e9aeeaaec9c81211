//! `cxlfs ctl`: the host's client of `cxlfsd --control-socket` (protocol in
//! `docs/control-api.md`): one JSON request line out, one reply line back.
//! Requests, replies and results are `cxlfs_api::control`'s types; this
//! module only maps the command line onto a `Request` and prints results.

use crate::device_args::{format_ns, human_size};
use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use cxlfs_api::control::{
    ConfigResult, MemoryFdResult, PrefetchSettings, RangeOp, RangeResult, RangeSpec, Reply,
    Request, RequestEnvelope, ResetStatsResult, SetCxlRatioResult, SetPolicyResult, StatsResult,
};
use cxlfs_device_model::units::parse_size;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// A file range (relative to the shared directory), a pool range or a
/// range of a VM's CXL memory region.
#[derive(Debug, Args)]
pub struct RangeArgs {
    /// File, relative to the shared directory.
    #[arg(long, value_name = "PATH", conflicts_with = "pool_offset")]
    file: Option<String>,
    /// A pool (device address) range instead of a file: its first byte.
    #[arg(long, value_name = "BYTES")]
    pool_offset: Option<String>,
    /// A range of this VM's CXL memory region (memory mode), with
    /// --memory-offset and --len.
    #[arg(long, value_name = "NAME", requires = "memory_offset")]
    vm: Option<String>,
    /// First byte of the memory range in the VM's region.
    #[arg(long, value_name = "BYTES", requires = "vm")]
    memory_offset: Option<String>,
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
    /// Memory mode: take VM's CXL memory region (`cxlfsd --cxl-memory
    /// VM=SIZE`) as a descriptor and run COMMAND with it — normally QEMU
    /// or `qemu-configs/run-vm.sh --cxl-memory SIZE --cxl-memory-fd {fd}`.
    /// `{fd}` in the arguments becomes the descriptor's number, `{size}`
    /// the region's size in MiB; the environment has CXLFS_MEMORY_FD and
    /// CXLFS_MEMORY_SIZE (bytes). Without a command, prints the size.
    MemoryFd {
        /// The VM.
        vm: String,
        /// The command and its arguments (after `--`).
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
}

fn size(s: &Option<String>, what: &str) -> anyhow::Result<Option<u64>> {
    s.as_deref()
        .map(|t| parse_size(t).map_err(|e| anyhow!("--{what} `{t}`: {e}")))
        .transpose()
}

impl RangeArgs {
    fn spec(&self) -> anyhow::Result<RangeSpec> {
        if let (Some(vm), Some(off)) = (&self.vm, size(&self.memory_offset, "memory-offset")?) {
            return Ok(RangeSpec::memory(vm, off, size(&self.len, "len")?));
        }
        match (&self.file, size(&self.pool_offset, "pool-offset")?) {
            (Some(f), None) => {
                let offset = size(&self.offset, "offset")?;
                Ok(RangeSpec::file(f, offset, size(&self.len, "len")?))
            }
            (None, Some(p)) => Ok(RangeSpec::pool(p, size(&self.len, "len")?)),
            _ => bail!("give --file PATH, --pool-offset N or --vm NAME --memory-offset N"),
        }
    }
}

fn request(cmd: &CtlCommand) -> anyhow::Result<Request> {
    Ok(match cmd {
        CtlCommand::Prefetch(a) => Request::range(RangeOp::Prefetch, a.spec()?),
        CtlCommand::Pin(a) => Request::range(RangeOp::Pin, a.spec()?),
        CtlCommand::Unpin(a) => Request::range(RangeOp::Unpin, a.spec()?),
        CtlCommand::Evict(a) => Request::range(RangeOp::Evict, a.spec()?),
        CtlCommand::SetPolicy { name, params } => {
            let mut p = Map::new();
            for kv in params {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| anyhow!("--param `{kv}` is not KEY=VALUE"))?;
                let v = serde_json::from_str(v).unwrap_or_else(|_| Value::from(v));
                p.insert(k.to_string(), v);
            }
            Request::SetPolicy {
                name: name.clone(),
                params: p,
            }
        }
        &CtlCommand::SetPrefetch { degree, stride } => Request::SetPrefetch { degree, stride },
        &CtlCommand::SetCxlRatio { percent } => Request::SetCxlRatio { percent },
        CtlCommand::Stats { vm } => Request::QueryStats { vm: vm.clone() },
        CtlCommand::ResetStats => Request::ResetStats {},
        CtlCommand::MemoryFd { vm, .. } => Request::MemoryFd { vm: vm.clone() },
        CtlCommand::Config => Request::GetConfig {},
    })
}

/// Sends one request and returns the reply's `result` (an `ok: false`
/// reply is an error carrying the daemon's code and message).
pub fn call(socket: &Path, request: Request, timeout: Duration) -> anyhow::Result<Value> {
    let (stream, id) = send(socket, request, timeout)?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .context("no reply from the daemon")?;
    if reply.is_empty() {
        bail!("the daemon closed the connection without a reply");
    }
    result_of(reply.as_bytes(), &id)
}

/// Connects and sends one request line; returns the stream and the id.
fn send(socket: &Path, request: Request, timeout: Duration) -> anyhow::Result<(UnixStream, Value)> {
    let id = Value::from(std::process::id());
    let line = RequestEnvelope::new(id.clone(), request).to_line();
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("cannot connect to the control socket {}", socket.display()))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(line.as_bytes())?;
    Ok((stream, id))
}

/// The result of a reply line to the request `id`.
fn result_of(reply: &[u8], id: &Value) -> anyhow::Result<Value> {
    let reply: Reply =
        serde_json::from_slice(reply).context("the reply is not a protocol reply")?;
    if reply.id != *id {
        bail!("the reply's id {} is not the request's {id}", reply.id);
    }
    Ok(reply.into_result()?)
}

/// The result as the request's result type.
fn decode<T: DeserializeOwned>(result: Value) -> anyhow::Result<T> {
    serde_json::from_value(result).context("the daemon's result is not what the protocol says")
}

fn print_range(op: RangeOp, r: &RangeResult) {
    let changed = match op {
        RangeOp::Prefetch => "read from NAND",
        RangeOp::Pin => "newly pinned",
        RangeOp::Unpin => "released",
        RangeOp::Evict => "evicted",
    };
    println!(
        "{}: {} pages, {} {changed}, {} skipped, {} written back; device time {}",
        op.name(),
        r.pages,
        r.changed,
        r.skipped,
        r.written_back,
        format_ns(r.latency_ns as f64)
    );
    if r.plane_filled + r.plane_evicted > 0 {
        println!(
            "DAX residency plane: {} pages stored, {} dropped",
            r.plane_filled, r.plane_evicted
        );
    }
}

fn print_stats(s: &StatsResult) {
    println!(
        "policy {}, prefetch degree {} stride {}",
        s.policy, s.prefetch.degree, s.prefetch.stride
    );
    println!(
        "{:<12} {:>14} {:>14} {:>12} {:>12}",
        "VM", "HITS", "MISSES", "TRAPS", "PINNED"
    );
    let rows = s.vms.iter().map(|(n, c)| (n.as_str(), c));
    for (name, c) in rows.chain([("total", &s.total)]) {
        println!(
            "{:<12} {:>14} {:>14} {:>12} {:>12}",
            name,
            c.hits,
            c.misses,
            c.traps,
            human_size(c.pinned_bytes)
        );
    }
}

fn print_config(c: &ConfigResult) -> anyhow::Result<()> {
    if let Value::Object(m) = serde_json::to_value(c)? {
        for (k, v) in m {
            if k != "device" && k != "device_toml" {
                println!("# {k} = {v}");
            }
        }
    }
    print!("{}", c.device_toml);
    Ok(())
}

fn print_human(req: &Request, result: Value) -> anyhow::Result<()> {
    if let Some((op, _)) = req.as_range() {
        print_range(op, &decode(result)?);
        return Ok(());
    }
    match req {
        Request::SetPolicy { .. } => {
            let r: SetPolicyResult = decode(result)?;
            println!("policy: {} -> {}", r.previous, r.policy);
        }
        Request::SetPrefetch { .. } => {
            let r: PrefetchSettings = decode(result)?;
            println!("prefetch: degree {}, stride {} pages", r.degree, r.stride);
        }
        Request::SetCxlRatio { .. } => {
            let r: SetCxlRatioResult = decode(result)?;
            println!("cxl ratio: {}", serde_json::to_value(r)?);
        }
        Request::QueryStats { .. } => print_stats(&decode(result)?),
        Request::ResetStats {} => {
            let _: ResetStatsResult = decode(result)?;
            println!("statistics reset");
        }
        Request::GetConfig {} => print_config(&decode(result)?)?,
        Request::MemoryFd { .. } => {
            let r: MemoryFdResult = decode(result)?;
            println!(
                "{}: CXL memory region of {}",
                r.vm,
                human_size(r.size_bytes)
            );
        }
        Request::Prefetch(_) | Request::Pin(_) | Request::Unpin(_) | Request::Evict(_) => {}
    }
    Ok(())
}

/// Sends `request` and reads its reply together with the descriptor the
/// daemon attached to it (`memory_fd`).
pub fn call_with_fd(
    socket: &Path,
    request: Request,
    timeout: Duration,
) -> anyhow::Result<(Value, std::fs::File)> {
    use std::io::Read;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let (mut stream, id) = send(socket, request, timeout)?;
    let mut buf = vec![0u8; 64 * 1024];
    let (n, file) = stream
        .recv_with_fd(&mut buf)
        .map_err(|e| anyhow!("no reply from the daemon: {e}"))?;
    let mut reply = buf[..n].to_vec();
    while !reply.ends_with(b"\n") && reply.len() < buf.len() {
        let k = stream.read(&mut buf).context("reading the reply")?;
        if k == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..k]);
    }
    let result = result_of(&reply, &id)?;
    let file = file.ok_or_else(|| anyhow!("the daemon attached no descriptor"))?;
    Ok((result, file))
}

/// `memory-fd VM -- COMMAND...`: exec COMMAND with the region's descriptor.
fn run_memory_fd(args: &CtlArgs, vm: &str, command: &[String]) -> anyhow::Result<()> {
    use std::os::fd::IntoRawFd;
    use std::os::unix::process::CommandExt;
    let timeout = Duration::from_secs(args.timeout.max(1));
    let (result, file) = call_with_fd(&args.socket, Request::MemoryFd { vm: vm.into() }, timeout)?;
    let Some((program, rest)) = command.split_first() else {
        if args.json {
            println!("{result}");
            return Ok(());
        }
        return print_human(&Request::MemoryFd { vm: vm.into() }, result);
    };
    let r: MemoryFdResult = decode(result)?;
    let fd = file.into_raw_fd();
    // SAFETY: fcntl on the descriptor we just received and own; it must
    // survive exec (the command is its new owner).
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
        bail!(
            "cannot keep the descriptor across exec: {}",
            std::io::Error::last_os_error()
        );
    }
    let subst = |a: &String| {
        a.replace("{fd}", &fd.to_string())
            .replace("{size}", &format!("{}M", r.size_bytes >> 20))
    };
    let err = std::process::Command::new(subst(program))
        .args(rest.iter().map(subst))
        .env("CXLFS_MEMORY_FD", fd.to_string())
        .env("CXLFS_MEMORY_SIZE", r.size_bytes.to_string())
        .exec();
    bail!("cannot run {program}: {err}")
}

/// Runs `cxlfs ctl`.
pub fn run(args: &CtlArgs) -> anyhow::Result<()> {
    if let CtlCommand::MemoryFd { vm, command } = &args.command {
        return run_memory_fd(args, vm, command);
    }
    let req = request(&args.command)?;
    let result = call(
        &args.socket,
        req.clone(),
        Duration::from_secs(args.timeout.max(1)),
    )?;
    if args.json {
        println!("{result}");
        Ok(())
    } else {
        print_human(&req, result)
    }
}
