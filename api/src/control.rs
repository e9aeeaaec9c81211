//! The control socket protocol (JSON lines): requests, replies, error codes.
//!
//! This module is the one definition of the protocol that `cxlfsd
//! --control-socket` speaks (`docs/control-api.md`): the daemon parses
//! request lines with [`RequestEnvelope::parse_line`] and executes the
//! [`Request`] it gets; `cxlfs ctl` builds a [`Request`], sends it with
//! [`RequestEnvelope::to_line`] and decodes the [`Reply`] and its typed
//! result ([`RangeResult`], [`StatsResult`], ...). There is no other list
//! of commands: [`Request::command_names`] is read off this enum.
//!
//! A request is one line of JSON: `{"v":1,"id":7,"cmd":"pin","file":"a.bin","len":4096}`;
//! its reply is one line: `{"v":1,"id":7,"ok":true,"result":{...}}` or
//! `{"v":1,"id":7,"ok":false,"error":{"code":"forbidden","message":"..."}}`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;

/// Version of the socket protocol (`"v"` in every request and reply).
pub const PROTOCOL_VERSION: u64 = 1;
/// Longest request line accepted (bytes, newline excluded); longer lines
/// get [`ErrorCode::TooLarge`].
pub const MAX_REQUEST_LINE: usize = 64 * 1024;
/// Concurrent connections a daemon serves; more get [`ErrorCode::Busy`].
pub const MAX_CONNECTIONS: usize = 16;
/// Default mode of the socket file: owner only.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;

// ------------------------------------------------------------------ requests

/// The range of a range command: a file of the share (`file`, optional
/// `offset` and `len`) or, from the host, a pool range (`pool_offset` and
/// `len`) or a range of a VM's CXL memory region (`vm`, `memory_offset`
/// and `len`). Which one it is, and whether the combination is valid, is
/// [`RangeSpec::target`]'s answer: the wire format is one flat object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeSpec {
    /// File, relative to the shared directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// First byte of a pool (device address space) range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_offset: Option<u64>,
    /// The VM of a memory range (memory mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
    /// First byte of a memory range, in the VM's CXL memory region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_offset: Option<u64>,
    /// First byte in the file (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Bytes (file: default to the end of the file; pool: required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<u64>,
}

/// A [`RangeSpec`], checked: what the range names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeTarget<'a> {
    /// Bytes of a file of the share.
    File {
        /// Path relative to the shared directory (not yet resolved).
        path: &'a str,
        /// First byte.
        offset: u64,
        /// Bytes; 0 = to the end of the file.
        len: u64,
    },
    /// A range of the pool (device address space).
    Pool {
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// A range of a VM's CXL memory region (memory mode).
    Memory {
        /// The VM.
        vm: &'a str,
        /// First byte in the region.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

/// Why a [`RangeSpec`] names no range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeTargetError {
    /// `pool_offset` together with `offset`.
    #[error("a pool range takes `pool_offset` and `len`, not `offset`")]
    OffsetInPoolRange,
    /// `pool_offset` without `len`.
    #[error("a pool range needs `len`")]
    PoolRangeWithoutLen,
    /// Both or neither of `file` and `pool_offset`.
    #[error("give exactly one of `file`, `pool_offset` and `memory_offset`")]
    NotExactlyOne,
    /// A memory range without `vm` or `len`, or with `offset`; or `vm`
    /// without `memory_offset`.
    #[error("a memory range takes `vm`, `memory_offset` and `len`")]
    BadMemoryRange,
}

impl RangeSpec {
    /// A file range: `offset` defaults to 0, `len` to the end of the file.
    pub fn file(path: impl Into<String>, offset: Option<u64>, len: Option<u64>) -> Self {
        RangeSpec {
            file: Some(path.into()),
            offset,
            len,
            ..RangeSpec::default()
        }
    }

    /// A pool range (`len` is required; without it the daemon refuses).
    pub fn pool(offset: u64, len: Option<u64>) -> Self {
        RangeSpec {
            pool_offset: Some(offset),
            len,
            ..RangeSpec::default()
        }
    }

    /// A range of VM `vm`'s CXL memory region (`len` is required).
    pub fn memory(vm: impl Into<String>, offset: u64, len: Option<u64>) -> Self {
        RangeSpec {
            vm: Some(vm.into()),
            memory_offset: Some(offset),
            len,
            ..RangeSpec::default()
        }
    }

    /// What the range names.
    pub fn target(&self) -> Result<RangeTarget<'_>, RangeTargetError> {
        match (&self.vm, self.memory_offset) {
            (None, None) => {}
            (Some(vm), Some(offset)) => {
                return match (&self.file, self.pool_offset, self.offset, self.len) {
                    (None, None, None, Some(len)) => Ok(RangeTarget::Memory { vm, offset, len }),
                    (Some(_), _, _, _) | (_, Some(_), _, _) => Err(RangeTargetError::NotExactlyOne),
                    _ => Err(RangeTargetError::BadMemoryRange),
                };
            }
            _ => return Err(RangeTargetError::BadMemoryRange),
        }
        match (&self.file, self.pool_offset) {
            (Some(path), None) => Ok(RangeTarget::File {
                path,
                offset: self.offset.unwrap_or(0),
                len: self.len.unwrap_or(0),
            }),
            (None, Some(offset)) => {
                if self.offset.is_some() {
                    return Err(RangeTargetError::OffsetInPoolRange);
                }
                Ok(RangeTarget::Pool {
                    offset,
                    len: self.len.ok_or(RangeTargetError::PoolRangeWithoutLen)?,
                })
            }
            _ => Err(RangeTargetError::NotExactlyOne),
        }
    }
}

/// The four range commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RangeOp {
    /// Bring into the device cache.
    Prefetch,
    /// Bring in and keep.
    Pin,
    /// Release pins.
    Unpin,
    /// Drop from the cache.
    Evict,
}

impl RangeOp {
    /// The command's name on the wire (`"prefetch"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RangeOp::Prefetch => "prefetch",
            RangeOp::Pin => "pin",
            RangeOp::Unpin => "unpin",
            RangeOp::Evict => "evict",
        }
    }
}

/// One command: the `cmd` of a request line and its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Read a range from NAND into the device cache.
    Prefetch(RangeSpec),
    /// Prefetch a range and pin it.
    Pin(RangeSpec),
    /// Release pins on a range.
    Unpin(RangeSpec),
    /// Drop a range from the device cache.
    Evict(RangeSpec),
    /// Switch the eviction policy.
    SetPolicy {
        /// Policy name (`fifo lifo lru clock s3fifo 2q lfru`).
        name: String,
        /// Parameters to change (keys of the device's `cache.params`);
        /// the others keep their value.
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        params: Map<String, Value>,
    },
    /// Change the next-N prefetcher.
    SetPrefetch {
        /// Pages prefetched after a miss (0 = off).
        degree: u32,
        /// Stride in pages (`None`: keep the current one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<u32>,
    },
    /// Change the DRAM/CXL placement ratio.
    SetCxlRatio {
        /// Share of file pages on the CXL-SSD, percent.
        percent: u32,
    },
    /// Counters, per VM and in total.
    QueryStats {
        /// One VM (`None`: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vm: Option<String>,
    },
    /// Zero the counters.
    ResetStats {},
    /// The effective configuration.
    GetConfig {},
    /// Memory mode: the CXL memory region file of a VM, for its QEMU to
    /// map as a CPU-less NUMA node. The descriptor comes with the reply
    /// (`SCM_RIGHTS`) on the control socket only; guests may not ask.
    MemoryFd {
        /// The VM (`cxlfsd --cxl-memory NAME=SIZE`).
        vm: String,
    },
}

impl Request {
    /// A range command.
    pub fn range(op: RangeOp, spec: RangeSpec) -> Self {
        match op {
            RangeOp::Prefetch => Request::Prefetch(spec),
            RangeOp::Pin => Request::Pin(spec),
            RangeOp::Unpin => Request::Unpin(spec),
            RangeOp::Evict => Request::Evict(spec),
        }
    }

    /// The range command this is, if it is one.
    pub fn as_range(&self) -> Option<(RangeOp, &RangeSpec)> {
        match self {
            Request::Prefetch(s) => Some((RangeOp::Prefetch, s)),
            Request::Pin(s) => Some((RangeOp::Pin, s)),
            Request::Unpin(s) => Some((RangeOp::Unpin, s)),
            Request::Evict(s) => Some((RangeOp::Evict, s)),
            _ => None,
        }
    }

    /// Changes what every VM sees (not only a file range); a guest needs
    /// `--guest-device-control` for these.
    pub fn is_device_wide(&self) -> bool {
        matches!(
            self,
            Request::SetPolicy { .. }
                | Request::SetPrefetch { .. }
                | Request::SetCxlRatio { .. }
                | Request::ResetStats {}
        )
    }

    /// The `cmd` names, in declaration order, as serde knows them (read
    /// off the derived deserializer, so never a second list).
    pub fn command_names() -> &'static [&'static str] {
        use serde::de::value::MapDeserializer;
        let probe = MapDeserializer::<_, VariantList>::new(std::iter::once(("cmd", "")));
        match Request::deserialize(probe) {
            Err(VariantList(names)) => names,
            Ok(_) => &[],
        }
    }
}

/// A deserializer error that keeps the list of variants serde offers when
/// it meets an unknown one ([`Request::command_names`]).
#[derive(Debug)]
struct VariantList(&'static [&'static str]);

impl fmt::Display for VariantList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "variants: {:?}", self.0)
    }
}

impl std::error::Error for VariantList {}

impl serde::de::Error for VariantList {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        VariantList(&[])
    }
    fn unknown_variant(_variant: &str, expected: &'static [&'static str]) -> Self {
        VariantList(expected)
    }
}

/// A request line: the protocol version, the caller's id and the command.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestEnvelope {
    /// Protocol version ([`PROTOCOL_VERSION`]).
    pub v: u64,
    /// Echoed in the reply: a string, number or null.
    pub id: Value,
    /// The command.
    #[serde(flatten)]
    pub request: Request,
}

/// Why a request line was refused before any command ran: the reply to
/// send (the id is null where the line gave none that could be read).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("request refused")]
pub struct ParseRequestError {
    /// The request's id, or null.
    pub id: Value,
    /// Code and message of the reply.
    #[source]
    pub error: ErrorBody,
}

impl RequestEnvelope {
    /// A request of this protocol version.
    pub fn new(id: impl Into<Value>, request: Request) -> Self {
        RequestEnvelope {
            v: PROTOCOL_VERSION,
            id: id.into(),
            request,
        }
    }

    /// The request as one line of JSON, `\n` included.
    pub fn to_line(&self) -> String {
        json_line(self)
    }

    /// Parses one request line (newline excluded), checking in this order:
    /// JSON (`parse_error`), an object, `id` a string / number / null,
    /// `v` present and supported, `cmd` present and known, arguments.
    pub fn parse_line(line: &[u8]) -> Result<Self, ParseRequestError> {
        let refuse = |id: &Value, code, message: String| ParseRequestError {
            id: id.clone(),
            error: ErrorBody { code, message },
        };
        let parsed: Value = serde_json::from_slice(line).map_err(|e| {
            refuse(
                &Value::Null,
                ErrorCode::ParseError,
                format!("not JSON: {e}"),
            )
        })?;
        let Value::Object(mut obj) = parsed else {
            return Err(refuse(
                &Value::Null,
                ErrorCode::BadRequest,
                "a request is a JSON object".into(),
            ));
        };
        let id = obj.remove("id").unwrap_or(Value::Null);
        if matches!(id, Value::Object(_) | Value::Array(_)) {
            return Err(refuse(
                &Value::Null,
                ErrorCode::BadRequest,
                "`id` must be a string, number or null".into(),
            ));
        }
        match obj.remove("v") {
            Some(Value::Number(n)) if n.as_u64() == Some(PROTOCOL_VERSION) => {}
            Some(other) => {
                return Err(refuse(
                    &id,
                    ErrorCode::UnsupportedVersion,
                    format!("protocol version {other} is not supported (this daemon speaks {PROTOCOL_VERSION})"),
                ))
            }
            None => {
                return Err(refuse(
                    &id,
                    ErrorCode::BadRequest,
                    format!("missing protocol version `v` (use {PROTOCOL_VERSION})"),
                ))
            }
        }
        let known = Request::command_names();
        match obj.get("cmd") {
            Some(Value::String(c)) if known.contains(&c.as_str()) => {}
            Some(c) => {
                return Err(refuse(
                    &id,
                    ErrorCode::UnknownCommand,
                    format!("unknown command {c} (known: {})", known.join(", ")),
                ))
            }
            None => return Err(refuse(&id, ErrorCode::BadRequest, "missing `cmd`".into())),
        }
        match serde_json::from_value(Value::Object(obj)) {
            Ok(request) => Ok(RequestEnvelope {
                v: PROTOCOL_VERSION,
                id,
                request,
            }),
            Err(e) => Err(refuse(&id, ErrorCode::BadRequest, e.to_string())),
        }
    }
}

// ------------------------------------------------------------------- replies

/// The error codes of the protocol (`error.code` of a refused request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The line is not JSON.
    ParseError,
    /// Not an object; a missing, unknown or mistyped argument; out of range.
    BadRequest,
    /// `v` is not [`PROTOCOL_VERSION`].
    UnsupportedVersion,
    /// `cmd` is not a command.
    UnknownCommand,
    /// A line longer than [`MAX_REQUEST_LINE`].
    TooLarge,
    /// No such file or VM.
    NotFound,
    /// A path that leaves the share; a guest without the right.
    Forbidden,
    /// A pin over the VM's quota.
    QuotaExceeded,
    /// Every way of a cache set is pinned.
    CacheFullyPinned,
    /// The device model refused the command.
    DeviceError,
    /// An I/O error on the host.
    IoError,
    /// More than [`MAX_CONNECTIONS`] connections.
    Busy,
}

impl ErrorCode {
    /// The code on the wire (`"bad_request"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ParseError => "parse_error",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::UnknownCommand => "unknown_command",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::CacheFullyPinned => "cache_fully_pinned",
            ErrorCode::DeviceError => "device_error",
            ErrorCode::IoError => "io_error",
            ErrorCode::Busy => "busy",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `error` of a refused request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ErrorBody {
    /// What kind of refusal.
    pub code: ErrorCode,
    /// For people.
    pub message: String,
}

impl ErrorBody {
    /// An error of `code`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            code,
            message: message.into(),
        }
    }
}

/// A reply line: `{"v":1,"id":..,"ok":true,"result":..}` or
/// `{"v":1,"id":..,"ok":false,"error":{"code":..,"message":..}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// Protocol version ([`PROTOCOL_VERSION`]).
    pub v: u64,
    /// The request's id (null if the request could not be read).
    #[serde(default)]
    pub id: Value,
    /// Whether the command ran.
    pub ok: bool,
    /// The command's result (`ok: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why it did not run (`ok: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// Why a reply carries no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplyError {
    /// The daemon refused the request.
    #[error(transparent)]
    Refused(#[from] ErrorBody),
    /// The reply is not one of the two shapes of the protocol.
    #[error("malformed reply: `ok` is {ok} but {missing} is missing")]
    Malformed {
        /// The reply's `ok`.
        ok: bool,
        /// The member it lacks.
        missing: &'static str,
    },
}

impl Reply {
    /// A command's result.
    pub fn success(id: Value, result: Value) -> Self {
        Reply {
            v: PROTOCOL_VERSION,
            id,
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    /// A refusal.
    pub fn failure(id: Value, error: ErrorBody) -> Self {
        Reply {
            v: PROTOCOL_VERSION,
            id,
            ok: false,
            result: None,
            error: Some(error),
        }
    }

    /// The reply as one line of JSON, `\n` included.
    pub fn to_line(&self) -> String {
        json_line(self)
    }

    /// The result, or the daemon's refusal.
    pub fn into_result(self) -> Result<Value, ReplyError> {
        match (self.ok, self.result, self.error) {
            (true, Some(r), _) => Ok(r),
            (false, _, Some(e)) => Err(ReplyError::Refused(e)),
            (ok, ..) => Err(ReplyError::Malformed {
                ok,
                missing: if ok { "`result`" } else { "`error`" },
            }),
        }
    }
}

/// `value` as a line of JSON. The protocol's types hold only strings,
/// numbers, booleans and JSON values, so encoding cannot fail; should it,
/// the line is a `bad_request` reply saying so rather than nothing.
fn json_line(value: &impl Serialize) -> String {
    let mut s = serde_json::to_string(value).unwrap_or_else(|e| {
        serde_json::json!({"v": PROTOCOL_VERSION, "id": null, "ok": false,
            "error": {"code": ErrorCode::BadRequest.as_str(), "message": format!("cannot encode: {e}")}})
        .to_string()
    });
    s.push('\n');
    s
}

// ------------------------------------------------------------------- results

/// Result of `prefetch`, `pin`, `unpin` and `evict`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeResult {
    /// Pages in the range.
    pub pages: u64,
    /// Pages read from NAND (prefetch, pin), newly pinned by this caller
    /// (pin), released (unpin) or evicted (evict).
    pub changed: u64,
    /// Pages left alone: already pinned by this caller (pin), pinned pages
    /// an evict skipped, pages pinned by others a guest's unpin left pinned.
    pub skipped: u64,
    /// Dirty pages an evict wrote back.
    pub written_back: u64,
    /// Pages stored into the residency plane (DAX on).
    pub plane_filled: u64,
    /// Pages dropped from the residency plane (DAX on).
    pub plane_evicted: u64,
    /// Modeled device time of the command.
    pub latency_ns: u64,
    /// Device time (ns since daemon start) when the command is done; the
    /// reply is not sent before.
    pub completes_at_ns: u64,
    /// Bytes the calling VM holds pinned (guests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_bytes: Option<u64>,
    /// The calling VM's pin quota (guests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_quota_bytes: Option<u64>,
}

/// Result of `set_policy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetPolicyResult {
    /// The policy now in force.
    pub policy: String,
    /// The policy before.
    pub previous: String,
    /// All parameters of the policies, as now in force (the device's
    /// `cache.params`).
    pub params: Value,
}

/// The prefetcher's settings: result of `set_prefetch`, and `prefetch` in
/// [`StatsResult`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchSettings {
    /// Pages prefetched after a miss (0 = off).
    pub degree: u32,
    /// Stride in pages.
    pub stride: u32,
}

/// Result of `set_cxl_ratio`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetCxlRatioResult {
    /// The ratio before (percent on the CXL-SSD).
    pub old_cxl_ratio: u32,
    /// The ratio now.
    pub cxl_ratio: u32,
    /// Pages moved to DRAM, dropped from the device cache.
    pub discarded_device_pages: u64,
    /// Pages moved to the CXL-SSD, dropped from the residency plane.
    pub plane_evicted_pages: u64,
}

/// Hit / miss / trap / pin counters of one VM or of all (`query_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Device page hits.
    pub hits: u64,
    /// Device page misses.
    pub misses: u64,
    /// DAX pool traps.
    pub traps: u64,
    /// Bytes held pinned.
    pub pinned_bytes: u64,
    /// The VM's pin quota (per VM only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_quota_bytes: Option<u64>,
}

/// Result of `query_stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsResult {
    /// The eviction policy in force.
    pub policy: String,
    /// The prefetcher in force.
    pub prefetch: PrefetchSettings,
    /// The DRAM/CXL ratio in force (percent on the CXL-SSD), if placement
    /// is on.
    pub cxl_ratio: Option<u32>,
    /// Per VM, by name.
    pub vms: BTreeMap<String, Counters>,
    /// All VMs (and the host): the device model's own counters.
    pub total: Counters,
    /// The device model's statistics (`DeviceStats`).
    pub device: Value,
}

/// Result of `reset_stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetStatsResult {
    /// Always true.
    pub reset: bool,
}

/// A VM the daemon serves, in [`DaemonSummary`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmEndpoint {
    /// The VM's name.
    pub name: String,
    /// Its vhost-user socket.
    pub socket: String,
}

/// What `get_config` reports about the daemon besides the device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonSummary {
    /// The shared directory.
    pub shared_dir: String,
    /// The VMs.
    pub vms: Vec<VmEndpoint>,
    /// The FUSE cache mode.
    pub cache: String,
    /// DAX window bytes (0 = off).
    pub dax_window: u64,
    /// The metrics endpoint.
    pub metrics_addr: Option<String>,
    /// The control socket.
    pub control_socket: Option<String>,
    /// Its mode, octal text.
    pub control_socket_mode: String,
    /// Where the device configuration came from.
    pub device_origin: String,
}

/// Result of `memory_fd` (the descriptor travels beside the reply line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryFdResult {
    /// The VM.
    pub vm: String,
    /// The region's size in bytes (QEMU's `size=`).
    pub size_bytes: u64,
    /// Whether a descriptor was attached (`false` where the transport
    /// cannot carry one, e.g. the guest hint path).
    pub fd_attached: bool,
}

/// Result of `get_config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigResult {
    /// The daemon.
    #[serde(flatten)]
    pub daemon: DaemonSummary,
    /// [`PROTOCOL_VERSION`].
    pub protocol_version: u64,
    /// The device configuration in force, as JSON.
    pub device: Value,
    /// The same as `daemon.toml`'s device section.
    pub device_toml: String,
    /// Bytes one VM may hold pinned.
    pub pin_quota_bytes: u64,
    /// Whether guests may run the device-wide commands.
    pub guest_device_control: bool,
    /// Whether range commands drive the DAX residency plane.
    pub dax: bool,
    /// The DRAM/CXL ratio in force, if placement is on.
    pub cxl_ratio: Option<u32>,
}

#[cfg(test)]
mod tests;
