//! Runs one [`Request`] for a [`Principal`]: resolves a range's file (the
//! passthrough file system's rules, never a path join) and runs the range
//! commands (`range`) and the device-wide ones here. The socket and the
//! guest hint path both end here; the command list is `Request`'s.

use super::range::{ResolvedFile, Target};
use super::{bad, ControlCommandError, Controller, Principal, SetCxlRatioError};
use crate::device::Publish;
use crate::ids::FileKey;
use crate::passthrough::check_name;
use cxlfs_api::control::{
    ConfigResult, Counters, MemoryFdResult, PrefetchSettings, RangeOp, RangeSpec, RangeTarget,
    Request, ResetStatsResult, SetPolicyResult, StatsResult, PROTOCOL_VERSION,
};
use cxlfs_device_model::config::PolicyParams;
use cxlfs_device_model::{Device, PolicyKind, PAGE_SIZE};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

/// What a command did: its result (the reply's `result`) and, for a range
/// command, the device time its modeled work completes at.
#[derive(Debug, Clone, PartialEq)]
pub struct Executed {
    /// The result, as the protocol's result type in JSON.
    pub result: Value,
    /// When a range command is done (the reply is held until then).
    pub completes_at_ns: Option<u64>,
}

/// A result as JSON. The protocol's result types hold numbers, strings and
/// JSON values only; should encoding fail anyway, the result is null.
fn encode(result: &impl Serialize) -> Value {
    serde_json::to_value(result).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot encode a control result");
        Value::Null
    })
}

impl Controller {
    /// Runs one command for `who`. A guest names ranges by an open file
    /// ([`Controller::range`]), never by path, and changes the device only
    /// with `--guest-device-control`.
    pub fn execute(&self, who: &Principal, req: Request) -> Result<Executed, ControlCommandError> {
        if matches!(who, Principal::Vm(_))
            && req.is_device_wide()
            && !self.opts.guest_device_control
        {
            return Err(ControlCommandError::Forbidden(
                "guests may not change the device (cxlfsd --guest-device-control is off)".into(),
            ));
        }
        let span = tracing::info_span!("control", who = who.label());
        let _g = span.enter();
        if let Some((op, spec)) = req.as_range() {
            return self.execute_range(who, op, spec);
        }
        let result = match req {
            Request::SetPolicy { name, params } => encode(&self.set_policy(&name, params)?),
            Request::SetPrefetch { degree, stride } => encode(&self.set_prefetch(degree, stride)?),
            Request::SetCxlRatio { percent } => encode(
                &self
                    .placement
                    .set_cxl_ratio(percent)
                    .map_err(|SetCxlRatioError::Invalid(m)| bad(m))?,
            ),
            Request::QueryStats { vm } => encode(&self.query_stats(vm.as_deref())?),
            Request::ResetStats {} => encode(&self.reset_stats()),
            Request::GetConfig {} => encode(&self.get_config()),
            Request::MemoryFd { vm } => {
                if *who != Principal::Host {
                    return Err(ControlCommandError::Forbidden(
                        "only the host hands out memory regions".into(),
                    ));
                }
                // The socket attaches the descriptor (Controller::memory_region).
                encode(&self.memory_region(&vm)?.0)
            }
            Request::Prefetch(_) | Request::Pin(_) | Request::Unpin(_) | Request::Evict(_) => {
                return Err(bad("a range command without its range"))
            }
        };
        Ok(Executed {
            result,
            completes_at_ns: None,
        })
    }

    fn execute_range(
        &self,
        who: &Principal,
        op: RangeOp,
        spec: &RangeSpec,
    ) -> Result<Executed, ControlCommandError> {
        let target = match spec.target().map_err(|e| bad(e.to_string()))? {
            RangeTarget::File { .. } if *who != Principal::Host => {
                return Err(ControlCommandError::Forbidden(
                    "guests name a range by an open file, not by path".into(),
                ))
            }
            RangeTarget::File { path, offset, len } => Target::File {
                file: self.resolve_file(path)?,
                offset,
                len,
            },
            RangeTarget::Pool { offset, len } => Target::Pool { offset, len },
            RangeTarget::Memory { .. } if *who != Principal::Host => {
                return Err(ControlCommandError::Forbidden(
                    "guests may only name file ranges".into(),
                ))
            }
            RangeTarget::Memory { vm, offset, len } => {
                let region = self
                    .memory
                    .as_ref()
                    .and_then(|m| m.region(vm))
                    .ok_or_else(|| {
                        ControlCommandError::NotFound(format!("VM `{vm}` has no CXL memory region"))
                    })?;
                if len == 0 || offset.checked_add(len).map_or(true, |e| e > region.size) {
                    return Err(bad(format!(
                        "memory range {offset:#x}+{len:#x} is empty or beyond the region of {vm} ({:#x} bytes)",
                        region.size
                    )));
                }
                Target::Memory {
                    offset: region.base + offset,
                    len,
                }
            }
        };
        let r = self.range(who, op, target)?;
        tracing::info!(
            op = op.name(),
            pages = r.pages,
            changed = r.changed,
            "range command"
        );
        Ok(Executed {
            completes_at_ns: Some(r.completes_at_ns),
            result: encode(&r),
        })
    }

    /// VM `vm`'s CXL memory region file (memory mode) and what the
    /// `memory_fd` reply says of it.
    pub fn memory_region(
        &self,
        vm: &str,
    ) -> Result<(MemoryFdResult, Arc<File>), ControlCommandError> {
        let region = self
            .memory
            .as_ref()
            .and_then(|m| m.region(vm))
            .ok_or_else(|| {
                ControlCommandError::NotFound(format!(
                    "VM `{vm}` has no CXL memory region (cxlfsd --cxl-memory {vm}=SIZE)"
                ))
            })?;
        Ok((
            MemoryFdResult {
                vm: vm.to_string(),
                size_bytes: region.size,
                fd_attached: true,
            },
            region.file().clone(),
        ))
    }

    /// Resolves `path` (relative to the shared directory) to a regular file
    /// with the passthrough rules: one component at a time, `O_NOFOLLOW`,
    /// no `.`/`..`/empty components, no symlinks anywhere.
    pub fn resolve_file(&self, path: &str) -> Result<ResolvedFile, ControlCommandError> {
        if path.is_empty() {
            return Err(bad("empty file path"));
        }
        if path.starts_with('/') {
            return Err(ControlCommandError::Forbidden(format!(
                "file path `{path}` must be relative to the shared directory"
            )));
        }
        let parts: Vec<&str> = path.split('/').collect();
        let mut dir = rustix::io::dup(&self.root).map_err(|e| ControlCommandError::Io {
            what: "dup the shared directory".into(),
            source: e.into(),
        })?;
        for (i, part) in parts.iter().enumerate() {
            if check_name(part.as_bytes()).is_err() {
                return Err(ControlCommandError::Forbidden(format!(
                    "file path `{path}`: component `{part}` is not allowed (no empty, `.`, `..` or over-long components)"
                )));
            }
            let last = i + 1 == parts.len();
            let fd = rustix::fs::openat(
                &dir,
                *part,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| match e {
                Errno::NOENT => ControlCommandError::NotFound(format!(
                    "`{path}`: no such file in the shared directory"
                )),
                e => ControlCommandError::Io {
                    what: format!("open `{path}`"),
                    source: e.into(),
                },
            })?;
            let st = rustix::fs::fstat(&fd).map_err(|e| ControlCommandError::Io {
                what: format!("stat `{path}`"),
                source: e.into(),
            })?;
            let kind = st.st_mode & libc::S_IFMT;
            if kind == libc::S_IFLNK {
                return Err(ControlCommandError::Forbidden(format!(
                    "`{path}`: `{part}` is a symlink; symlinks are not followed"
                )));
            }
            if !last {
                if kind != libc::S_IFDIR {
                    return Err(ControlCommandError::NotFound(format!(
                        "`{path}`: `{part}` is not a directory"
                    )));
                }
                dir = fd;
                continue;
            }
            if kind != libc::S_IFREG {
                return Err(bad(format!("`{path}` is not a regular file")));
            }
            let key = FileKey {
                dev: st.st_dev,
                ino: st.st_ino,
            };
            let file = self.pool_file(key, &fd)?;
            return Ok(ResolvedFile {
                key,
                plane: self.dax_on().then(|| file.clone()),
                data: file,
                size: st.st_size as u64,
            });
        }
        Err(bad("empty file path"))
    }

    /// The host file kept open for the residency plane: the pool's, or a
    /// fresh read-write open through `/proc/self/fd` (never a path lookup).
    /// Also what the file's layout is read from.
    fn pool_file(&self, key: FileKey, opath: &OwnedFd) -> Result<Arc<File>, ControlCommandError> {
        if let Some(f) = self.dax.as_ref().and_then(|d| d.window_file(key)) {
            return Ok(f);
        }
        let name = opath.as_fd().as_raw_fd().to_string();
        let fd = rustix::fs::openat(
            &self.proc_self_fd,
            name.as_str(),
            OFlags::RDWR | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .or_else(|_| {
            rustix::fs::openat(
                &self.proc_self_fd,
                name.as_str(),
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
        })
        .map_err(|e| ControlCommandError::Io {
            what: "reopen the file for the residency plane".into(),
            source: e.into(),
        })?;
        Ok(Arc::new(File::from(fd)))
    }

    fn set_policy(
        &self,
        name: &str,
        params: Map<String, Value>,
    ) -> Result<SetPolicyResult, ControlCommandError> {
        let kind: PolicyKind = name.parse().map_err(bad)?;
        let switch = |dev: &mut Device| -> Result<_, ControlCommandError> {
            let previous = dev.config().cache.policy;
            let mut merged =
                serde_json::to_value(&dev.config().cache.params).map_err(|e| bad(e.to_string()))?;
            for (k, v) in params {
                let slot = merged
                    .get_mut(&k)
                    .ok_or_else(|| bad(format!("unknown policy parameter `{k}`")))?;
                *slot = v;
            }
            let params: PolicyParams = serde_json::from_value(merged)
                .map_err(|e| bad(format!("policy parameters: {e}")))?;
            dev.set_policy_with_params(kind, params.clone())
                .map_err(|e| bad(e.to_string()))?;
            Ok((previous, params))
        };
        let (previous, params) = self
            .shared
            .transact(Publish::Wait, |_, dev| switch(dev))
            .0?;
        tracing::info!(from = %previous, to = %kind, "eviction policy switched");
        Ok(SetPolicyResult {
            policy: kind.name().to_string(),
            previous: previous.name().to_string(),
            params: encode(&params),
        })
    }

    fn set_prefetch(
        &self,
        degree: u32,
        stride: Option<u32>,
    ) -> Result<PrefetchSettings, ControlCommandError> {
        let stride = self
            .shared
            .transact(Publish::Hand, |_, dev| {
                let stride = stride.unwrap_or(dev.config().prefetch.stride_pages);
                let mut cfg = dev.config().clone();
                cfg.prefetch.degree = degree;
                cfg.prefetch.stride_pages = stride;
                if stride == 0 {
                    return Err(bad("stride must be at least 1 page"));
                }
                cfg.validate().map_err(|e| bad(e.to_string()))?;
                dev.set_prefetch(degree, stride);
                Ok(stride)
            })
            .0?;
        tracing::info!(degree, stride, "prefetcher changed");
        Ok(PrefetchSettings { degree, stride })
    }

    fn query_stats(&self, vm: Option<&str>) -> Result<StatsResult, ControlCommandError> {
        self.prune_pins();
        let names: Vec<String> = match vm {
            Some(name) => {
                if self.metrics.vm_if_known(name).is_none() {
                    return Err(ControlCommandError::NotFound(format!(
                        "no VM named `{name}`"
                    )));
                }
                vec![name.to_string()]
            }
            None => self.metrics.vm_names(),
        };
        let st = self.shared.stats();
        let cfg = self.shared.read(|_, dev| dev.config().prefetch.clone());
        let vms: BTreeMap<String, Counters> = names
            .into_iter()
            .map(|n| (n.clone(), self.vm_stats(&n)))
            .collect();
        Ok(StatsResult {
            policy: st.policy.clone(),
            prefetch: PrefetchSettings {
                degree: cfg.degree,
                stride: cfg.stride_pages,
            },
            cxl_ratio: self.placement.cxl_ratio(),
            vms,
            total: Counters {
                hits: st.hits,
                misses: st.misses,
                traps: self.metrics.traps_total(),
                pinned_bytes: st.pinned_pages * PAGE_SIZE,
                pin_quota_bytes: None,
            },
            device: encode(&st),
        })
    }

    fn reset_stats(&self) -> ResetStatsResult {
        self.shared
            .transact(Publish::Hand, |_, dev| dev.reset_stats());
        self.metrics.reset_device_counters();
        tracing::info!("statistics reset");
        ResetStatsResult { reset: true }
    }

    fn get_config(&self) -> ConfigResult {
        let (device, device_toml) = self
            .shared
            .read(|_, dev| (encode(dev.config()), dev.config().to_toml_string()));
        ConfigResult {
            daemon: self.daemon.clone(),
            protocol_version: PROTOCOL_VERSION,
            device,
            device_toml,
            pin_quota_bytes: self.opts.pin_quota_bytes,
            guest_device_control: self.opts.guest_device_control,
            dax: self.dax_on(),
            cxl_ratio: self.placement.cxl_ratio(),
        }
    }
}
