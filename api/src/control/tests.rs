//! The protocol's types against each other and against the examples of
//! `docs/control-api.md`.

#![allow(clippy::unwrap_used)]

use super::*;
use serde_json::json;
use std::collections::BTreeSet;

/// One request of every command (exhaustive: a new command fails to
/// compile here until it has an example).
fn one_of_each() -> Vec<Request> {
    let all = vec![
        Request::Prefetch(RangeSpec::file("a.bin", Some(4096), Some(8192))),
        Request::Pin(RangeSpec::pool(0, Some(2 << 20))),
        Request::Unpin(RangeSpec::file("d/b.bin", None, None)),
        Request::Evict(RangeSpec::file("a.bin", None, Some(1))),
        Request::SetPolicy {
            name: "s3fifo".into(),
            params: json!({"s3fifo_small_ratio": 0.2})
                .as_object()
                .unwrap()
                .clone(),
        },
        Request::SetPrefetch {
            degree: 4,
            stride: Some(2),
        },
        Request::SetCxlRatio { percent: 30 },
        Request::QueryStats {
            vm: Some("vm0".into()),
        },
        Request::ResetStats {},
        Request::GetConfig {},
        Request::MemoryFd { vm: "vm0".into() },
    ];
    for r in &all {
        match r {
            Request::Prefetch(_)
            | Request::Pin(_)
            | Request::Unpin(_)
            | Request::Evict(_)
            | Request::SetPolicy { .. }
            | Request::SetPrefetch { .. }
            | Request::SetCxlRatio { .. }
            | Request::QueryStats { .. }
            | Request::ResetStats {}
            | Request::GetConfig {}
            | Request::MemoryFd { .. } => {}
        }
    }
    all
}

fn refused(line: &str) -> (Value, ErrorCode) {
    let e = RequestEnvelope::parse_line(line.as_bytes()).unwrap_err();
    (e.id, e.error.code)
}

#[test]
fn command_names_come_from_the_enum() {
    assert_eq!(
        Request::command_names(),
        [
            "prefetch",
            "pin",
            "unpin",
            "evict",
            "set_policy",
            "set_prefetch",
            "set_cxl_ratio",
            "query_stats",
            "reset_stats",
            "get_config",
            "memory_fd"
        ]
    );
    let reqs = one_of_each();
    assert_eq!(reqs.len(), Request::command_names().len());
    for (r, name) in reqs.iter().zip(Request::command_names()) {
        assert_eq!(serde_json::to_value(r).unwrap()["cmd"], json!(name));
        if let Some((op, _)) = r.as_range() {
            assert_eq!(op.name(), *name);
        }
    }
}

#[test]
fn every_command_round_trips() {
    for (i, r) in one_of_each().into_iter().enumerate() {
        let env = RequestEnvelope::new(i as u64, r.clone());
        let line = env.to_line();
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        let back = RequestEnvelope::parse_line(line.trim_end().as_bytes()).unwrap();
        assert_eq!(back, env, "{line}");
        if let Some((op, spec)) = r.as_range() {
            assert_eq!(Request::range(op, spec.clone()), r);
        }
    }
    // Defaults: no params, no stride, no vm.
    let env = RequestEnvelope::new(
        "x",
        Request::SetPolicy {
            name: "lru".into(),
            params: Map::new(),
        },
    );
    assert_eq!(
        env.to_line(),
        "{\"v\":1,\"id\":\"x\",\"cmd\":\"set_policy\",\"name\":\"lru\"}\n"
    );
    let env = RequestEnvelope::parse_line(br#"{"v":1,"cmd":"query_stats"}"#).unwrap();
    assert_eq!(env.id, Value::Null);
    assert_eq!(env.request, Request::QueryStats { vm: None });
}

#[test]
fn malformed_requests_are_refused_with_their_codes() {
    use ErrorCode::*;
    assert_eq!(refused("{not json"), (Value::Null, ParseError));
    assert_eq!(refused("[1,2]"), (Value::Null, BadRequest));
    assert_eq!(
        refused(r#"{"v":1,"id":{"a":1},"cmd":"get_config"}"#),
        (Value::Null, BadRequest)
    );
    assert_eq!(
        refused(r#"{"id":1,"cmd":"get_config"}"#),
        (json!(1), BadRequest)
    );
    assert_eq!(
        refused(r#"{"v":2,"id":1,"cmd":"get_config"}"#),
        (json!(1), UnsupportedVersion)
    );
    assert_eq!(refused(r#"{"v":1,"id":"a"}"#), (json!("a"), BadRequest));
    assert_eq!(
        refused(r#"{"v":1,"id":1,"cmd":"format_disk"}"#),
        (json!(1), UnknownCommand)
    );
    assert_eq!(
        refused(r#"{"v":1,"id":1,"cmd":7}"#),
        (json!(1), UnknownCommand)
    );
    let e = RequestEnvelope::parse_line(br#"{"v":1,"cmd":"format_disk"}"#).unwrap_err();
    assert!(
        e.error.message.contains("known: prefetch, pin"),
        "{}",
        e.error
    );
    // Unknown or mistyped arguments, for every command.
    for name in Request::command_names() {
        let line = format!(r#"{{"v":1,"id":1,"cmd":"{name}","file":"a","bogus":1}}"#);
        assert_eq!(refused(&line), (json!(1), BadRequest), "{line}");
    }
    for line in [
        r#"{"v":1,"cmd":"pin","file":"ok.bin","lenn":5}"#,
        r#"{"v":1,"cmd":"pin","len":-1,"file":"ok.bin"}"#,
        r#"{"v":1,"cmd":"set_prefetch","degree":"x"}"#,
        r#"{"v":1,"cmd":"set_prefetch"}"#,
        r#"{"v":1,"cmd":"set_policy","name":"lru","params":[]}"#,
        r#"{"v":1,"cmd":"set_cxl_ratio","percent":-1}"#,
        r#"{"v":1,"cmd":"reset_stats","all":true}"#,
        r#"{"v":1,"cmd":"get_config","pad":""}"#,
    ] {
        assert_eq!(refused(line), (Value::Null, BadRequest), "{line}");
    }
}

#[test]
fn range_specs_name_one_range() {
    let t = |s: &str| {
        let env = RequestEnvelope::parse_line(s.as_bytes()).unwrap();
        let (_, spec) = env.request.as_range().unwrap();
        spec.target().map(|t| format!("{t:?}"))
    };
    assert_eq!(
        t(r#"{"v":1,"cmd":"pin","file":"a"}"#).unwrap(),
        format!(
            "{:?}",
            RangeTarget::File {
                path: "a",
                offset: 0,
                len: 0
            }
        )
    );
    assert_eq!(
        t(r#"{"v":1,"cmd":"evict","pool_offset":4096,"len":8192}"#).unwrap(),
        format!(
            "{:?}",
            RangeTarget::Pool {
                offset: 4096,
                len: 8192
            }
        )
    );
    assert_eq!(
        t(r#"{"v":1,"cmd":"pin","file":"a","pool_offset":0}"#),
        Err(RangeTargetError::NotExactlyOne)
    );
    assert_eq!(
        t(r#"{"v":1,"cmd":"pin","len":1}"#),
        Err(RangeTargetError::NotExactlyOne)
    );
    assert_eq!(
        t(r#"{"v":1,"cmd":"pin","pool_offset":0}"#),
        Err(RangeTargetError::PoolRangeWithoutLen)
    );
    assert_eq!(
        t(r#"{"v":1,"cmd":"pin","pool_offset":0,"offset":1,"len":1}"#),
        Err(RangeTargetError::OffsetInPoolRange)
    );
}

#[test]
fn device_wide_commands() {
    let wide: Vec<bool> = one_of_each().iter().map(Request::is_device_wide).collect();
    assert_eq!(
        wide,
        [false, false, false, false, true, true, true, false, true, false, false]
    );
}

#[test]
fn replies_and_error_codes() {
    let ok = Reply::success(json!(7), json!({"reset": true}));
    assert_eq!(
        ok.to_line(),
        "{\"v\":1,\"id\":7,\"ok\":true,\"result\":{\"reset\":true}}\n"
    );
    let err = Reply::failure(Value::Null, ErrorBody::new(ErrorCode::TooLarge, "long"));
    assert_eq!(
        err.to_line(),
        "{\"v\":1,\"id\":null,\"ok\":false,\"error\":{\"code\":\"too_large\",\"message\":\"long\"}}\n"
    );
    let back: Reply = serde_json::from_str(&err.to_line()).unwrap();
    assert_eq!(
        back.into_result().unwrap_err().to_string(),
        "too_large: long"
    );
    let r: Reply = serde_json::from_str(r#"{"v":1,"id":1,"ok":true}"#).unwrap();
    assert!(matches!(
        r.into_result(),
        Err(ReplyError::Malformed { ok: true, .. })
    ));
    use ErrorCode::*;
    for c in [
        ParseError,
        BadRequest,
        UnsupportedVersion,
        UnknownCommand,
        TooLarge,
        NotFound,
        Forbidden,
        QuotaExceeded,
        CacheFullyPinned,
        DeviceError,
        IoError,
        Busy,
    ] {
        assert_eq!(serde_json::to_value(c).unwrap(), json!(c.as_str()));
        let back: ErrorCode = serde_json::from_value(json!(c.as_str())).unwrap();
        assert_eq!(back, c);
    }
}

#[test]
fn results_round_trip() {
    fn same<T: Serialize + serde::de::DeserializeOwned>(v: Value) {
        let t: T = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&t).unwrap(), v);
    }
    same::<RangeResult>(
        json!({"pages": 2, "changed": 1, "skipped": 1, "written_back": 0,
        "plane_filled": 0, "plane_evicted": 0, "latency_ns": 5, "completes_at_ns": 9,
        "pinned_bytes": 4096, "pin_quota_bytes": 8192}),
    );
    same::<SetPolicyResult>(
        json!({"policy": "lru", "previous": "fifo", "params": {"twoq_kin_ratio": 0.25}}),
    );
    same::<PrefetchSettings>(json!({"degree": 4, "stride": 1}));
    same::<SetCxlRatioResult>(json!({"old_cxl_ratio": 100, "cxl_ratio": 30,
        "discarded_device_pages": 3, "plane_evicted_pages": 0}));
    same::<ResetStatsResult>(json!({"reset": true}));
    same::<ConfigResult>(json!({
        "shared_dir": "/srv/share", "vms": [{"name": "vm0", "socket": "/run/vm0.sock"}],
        "cache": "never", "dax_window": 0, "metrics_addr": null, "control_socket": "/run/c.sock",
        "control_socket_mode": "0600", "device_origin": "preset femu",
        "protocol_version": 1, "device": {"cache": {"size_bytes": 1048576}},
        "device_toml": "[cache]\n", "pin_quota_bytes": 262144, "guest_device_control": false,
        "dax": false, "cxl_ratio": 100}));
}

/// The JSON examples of `docs/control-api.md`: a block's lines, with
/// indented lines joined to the line before.
fn doc_examples() -> Vec<Value> {
    let doc = include_str!("../../../docs/control-api.md");
    let mut out: Vec<String> = Vec::new();
    let mut in_json = false;
    for line in doc.lines() {
        match line.trim() {
            "```json" => in_json = true,
            "```" => in_json = false,
            _ if !in_json => {}
            l if line.starts_with(' ') => out.last_mut().unwrap().push_str(l),
            l => out.push(l.to_string()),
        }
    }
    out.iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn the_documented_examples_are_what_the_types_read_and_write() {
    let examples = doc_examples();
    let mut cmds = BTreeSet::new();
    let (mut replies, mut stats) = (0, 0);
    for ex in &examples {
        if ex.get("cmd").is_some() {
            let env = RequestEnvelope::parse_line(ex.to_string().as_bytes())
                .unwrap_or_else(|e| panic!("{ex}: {}", e.error));
            assert_eq!(serde_json::to_value(&env).unwrap(), *ex);
            cmds.insert(ex["cmd"].as_str().unwrap().to_string());
        } else if ex.get("ok").is_some() {
            let reply: Reply = serde_json::from_value(ex.clone()).unwrap();
            assert_eq!(serde_json::to_value(&reply).unwrap(), *ex);
            if let Ok(result) = reply.into_result() {
                let r: RangeResult = serde_json::from_value(result.clone()).unwrap();
                assert_eq!(serde_json::to_value(r).unwrap(), result);
            }
            replies += 1;
        } else if ex.get("vms").is_some() {
            let s: StatsResult = serde_json::from_value(ex.clone()).unwrap();
            assert_eq!(serde_json::to_value(s).unwrap(), *ex);
            stats += 1;
        }
    }
    let all: BTreeSet<String> = Request::command_names()
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(cmds, all, "the documentation shows every command");
    assert!(replies >= 2 && stats == 1, "{examples:?}");
}

#[test]
fn memory_ranges_name_a_vm_an_offset_and_a_length() {
    let t = |line: &str| {
        RequestEnvelope::parse_line(line.as_bytes())
            .map(|e| match e.request.as_range() {
                Some((_, spec)) => spec.target().map(|t| format!("{t:?}")),
                None => Ok("not a range".into()),
            })
            .unwrap()
    };
    assert_eq!(
        t(r#"{"v":1,"cmd":"evict","vm":"vm0","memory_offset":4096,"len":8192}"#),
        Ok(r#"Memory { vm: "vm0", offset: 4096, len: 8192 }"#.to_string())
    );
    assert_eq!(
        t(r#"{"v":1,"cmd":"pin","vm":"vm0","memory_offset":0}"#),
        Err(RangeTargetError::BadMemoryRange)
    );
    assert_eq!(
        t(r#"{"v":1,"cmd":"pin","vm":"vm0","len":1}"#),
        Err(RangeTargetError::BadMemoryRange)
    );
    assert_eq!(
        t(r#"{"v":1,"cmd":"pin","vm":"vm0","memory_offset":0,"len":1,"offset":1}"#),
        Err(RangeTargetError::BadMemoryRange)
    );
    assert_eq!(
        t(r#"{"v":1,"cmd":"pin","vm":"vm0","memory_offset":0,"len":1,"file":"a"}"#),
        Err(RangeTargetError::NotExactlyOne)
    );
    let spec = RangeSpec::memory("vm1", 0, Some(4096));
    assert_eq!(
        spec.target(),
        Ok(RangeTarget::Memory {
            vm: "vm1",
            offset: 0,
            len: 4096
        })
    );
}
