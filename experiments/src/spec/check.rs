//! From a TOML tree to a checked [`Spec`]: deserialising it (naming the
//! failing key) and the spec-wide checks — phase names, counts, units,
//! files, sweep keys, the daemon's device config and CXL memory, variable
//! names. One phase's own rules are in `check_phase.rs`.

use super::check_phase::{check_phase, check_share_path};
use super::tree::{flatten_sets, size_value, value_text};
use super::types::{Backend, DaemonSpec, Spec};
use super::{LoadSpecError, DEFAULT_PRESET};
use cxlfs_api::hits::{access_bits, access_sampling_rate};
use cxlfs_device_model::presets::preset;
use cxlfs_device_model::units::{parse_duration_ns, parse_size};
use cxlfs_device_model::DeviceConfig;

/// A failing key (dotted, relative to the spec) and what is wrong with it.
type KeyError = (String, String);

/// Deserialises a tree into a [`Spec`], naming the failing key.
pub(super) fn parse_tree(
    path: &str,
    tree: &toml::Value,
    context: &str,
) -> Result<Spec, LoadSpecError> {
    let spec = deserialize(path, tree, context)?;
    let key_err = |(key, message): KeyError| LoadSpecError::Key {
        path: path.to_string(),
        key: format!("{key}{context}"),
        message,
    };
    check_phase_names(&spec).map_err(key_err)?;
    check_counts(&spec).map_err(key_err)?;
    check_units(&spec).map_err(key_err)?;
    check_files(&spec).map_err(key_err)?;
    check_sweep_keys(&spec).map_err(key_err)?;
    device_config(&spec.daemon).map_err(key_err)?;
    check_cxl_memory(&spec.daemon).map_err(key_err)?;
    check_backend(&spec.daemon).map_err(key_err)?;
    check_access_sampling(&spec.daemon).map_err(key_err)?;
    check_latency_compensation(&spec.daemon).map_err(key_err)?;
    check_dax_eviction_backlog(&spec.daemon).map_err(key_err)?;
    check_vars(&spec).map_err(key_err)?;
    check_image_not_swept(&spec).map_err(key_err)?;
    check_replay_iolog(&spec).map_err(key_err)?;
    for (i, p) in spec.phases.iter().enumerate() {
        check_phase(&spec, p)
            .map_err(|(key, message)| key_err((format!("phases.{i}.{key}"), message)))?;
    }
    Ok(spec)
}

/// The tree as a [`Spec`]; an unknown, missing or mistyped key is named
/// (with `context` after it).
fn deserialize(path: &str, tree: &toml::Value, context: &str) -> Result<Spec, LoadSpecError> {
    serde_path_to_error::deserialize(tree.clone()).map_err(|e| {
        let key = e.path().to_string();
        LoadSpecError::Key {
            path: path.to_string(),
            key: if key == "." {
                "(top level)".into()
            } else {
                key
            } + context,
            // toml appends "in `KEY`" lines; the key is already named.
            message: e
                .into_inner()
                .to_string()
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
        }
    })
}

/// At least one phase; phase names are plain and unique.
fn check_phase_names(spec: &Spec) -> Result<(), KeyError> {
    if spec.phases.is_empty() {
        return Err(("phases".into(), "at least one [[phases]] is needed".into()));
    }
    for (i, p) in spec.phases.iter().enumerate() {
        if p.name.is_empty()
            || !p
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err((
                format!("phases.{i}.name"),
                format!("`{}`: use letters, digits, `-`, `_`, `.`", p.name),
            ));
        }
        if spec.phases[..i].iter().any(|q| q.name == p.name) {
            return Err((
                format!("phases.{i}.name"),
                format!("`{}` used twice", p.name),
            ));
        }
    }
    Ok(())
}

/// Repeats, guests, the CXL share and the cache mode in range.
fn check_counts(spec: &Spec) -> Result<(), KeyError> {
    if spec.repeats == 0 {
        return Err(("repeats".into(), "must be at least 1".into()));
    }
    if spec.vms.count == 0 || spec.vms.count > 16 {
        return Err(("vms.count".into(), format!("{} (1..=16)", spec.vms.count)));
    }
    if let Some(p) = spec.vms.realtime_priority.filter(|p| !(1..=99).contains(p)) {
        return Err(("vms.realtime_priority".into(), format!("{p} (1..=99)")));
    }
    if let Some(a) = spec.vms.kernel_args.iter().find(|a| {
        a.is_empty()
            || a.chars()
                .any(|c| c.is_whitespace() || c == '"' || c == '\'')
    }) {
        return Err((
            "vms.kernel_args".into(),
            format!("`{a}`: one argument an entry, without spaces or quotes"),
        ));
    }
    if let Some(r) = spec.daemon.cxl_ratio {
        if r > 100 {
            return Err(("daemon.cxl_ratio".into(), format!("{r} (0..=100)")));
        }
    }
    if !matches!(spec.daemon.cache.as_str(), "never" | "auto" | "always") {
        return Err((
            "daemon.cache".into(),
            format!("`{}`: never | auto | always", spec.daemon.cache),
        ));
    }
    Ok(())
}

/// Durations and sizes that are text read with their units; the quick
/// divisor.
fn check_units(spec: &Spec) -> Result<(), KeyError> {
    parse_duration_ns(&spec.vms.timeout).map_err(|e| ("vms.timeout".to_string(), e.to_string()))?;
    parse_duration_ns(&spec.daemon.metrics_interval)
        .map_err(|e| ("daemon.metrics_interval".to_string(), e.to_string()))?;
    parse_size(&spec.quick.min_size).map_err(|e| ("quick.min_size".to_string(), e.to_string()))?;
    parse_duration_ns(&spec.quick.max_runtime)
        .map_err(|e| ("quick.max_runtime".to_string(), e.to_string()))?;
    if spec.quick.size_divisor == 0 {
        return Err(("quick.size_divisor".into(), "must be at least 1".into()));
    }
    Ok(())
}

/// Each `[[files]]` entry: a size, `{i}` when there are several, a path
/// inside the share.
fn check_files(spec: &Spec) -> Result<(), KeyError> {
    for (i, f) in spec.files.iter().enumerate() {
        size_value(&f.size).map_err(|e| (format!("files.{i}.size"), e))?;
        if f.count > 1 && !f.path.contains("{i}") {
            return Err((
                format!("files.{i}.path"),
                format!(
                    "`{}`: count = {} needs `{{i}}` in the path",
                    f.path, f.count
                ),
            ));
        }
        check_share_path(&f.path).map_err(|e| (format!("files.{i}.path"), e))?;
    }
    Ok(())
}

/// Each swept key has values and is not under `sweep` itself; a list of
/// cases (tables) has only cases, each with its own `name` and keys that
/// could be swept themselves.
fn check_sweep_keys(spec: &Spec) -> Result<(), KeyError> {
    for (k, values) in &spec.sweep {
        if values.is_empty() {
            return Err((format!("sweep.{k}"), "no values".into()));
        }
        if k.starts_with("sweep") || k.is_empty() {
            return Err((format!("sweep.{k}"), "cannot sweep this key".into()));
        }
        if values.iter().any(toml::Value::is_table) {
            check_cases(k, values)?;
        }
    }
    Ok(())
}

/// A swept key's cases: all tables, each named once, each setting keys.
fn check_cases(k: &str, cases: &[toml::Value]) -> Result<(), KeyError> {
    let mut names = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let at = format!("sweep.{k}.{i}");
        let Some(t) = case.as_table() else {
            return Err((at, "all values are cases (tables) or none is".into()));
        };
        let Some(name) = t.get("name").and_then(toml::Value::as_str) else {
            return Err((at, "a case needs a `name` (its value in results)".into()));
        };
        if names.contains(&name) {
            return Err((at, format!("case `{name}` is named twice")));
        }
        names.push(name);
        let keys: Vec<&String> = t.keys().filter(|key| key.as_str() != "name").collect();
        if keys.is_empty() {
            return Err((at, format!("case `{name}` sets no key")));
        }
        for key in keys {
            if key.starts_with("sweep") || key.starts_with("image") || key.is_empty() {
                return Err((format!("{at}.{key}"), "cannot sweep this key".into()));
            }
        }
    }
    Ok(())
}

/// What only `cxlfsd` does is refused with the stock `virtiofsd`: a DAX
/// window, memory mode, access sampling, a device (its figures would be
/// absent, not the device's).
fn check_backend(d: &DaemonSpec) -> Result<(), KeyError> {
    if d.backend != Backend::Virtiofsd {
        return Ok(());
    }
    let only_cxlfsd = [
        ("daemon.dax", d.dax),
        ("daemon.cxl_memory", d.cxl_memory.is_some()),
        ("daemon.access_sampling", d.access_sampling.is_some()),
        ("daemon.cxl_ratio", d.cxl_ratio.is_some()),
    ];
    if let Some((key, _)) = only_cxlfsd.iter().find(|(_, set)| *set) {
        return Err((
            key.to_string(),
            "only cxlfsd has it: not with daemon.backend = \"virtiofsd\"".into(),
        ));
    }
    if !["never", "auto", "always"].contains(&d.cache.as_str()) {
        return Err((
            "daemon.cache".into(),
            format!("{:?}: virtiofsd takes never, auto or always", d.cache),
        ));
    }
    Ok(())
}

/// The CXL memory region (memory mode): at least 16 MiB, whole 2 MiB pages.
fn check_cxl_memory(d: &DaemonSpec) -> Result<(), KeyError> {
    if let Some(m) = &d.cxl_memory {
        let b = size_value(m).map_err(|e| ("daemon.cxl_memory".to_string(), e))?;
        if b < 16 << 20 || b % (2 << 20) != 0 {
            return Err((
                "daemon.cxl_memory".into(),
                format!("{b} bytes: at least 16 MiB, a multiple of 2 MiB"),
            ));
        }
    }
    Ok(())
}

/// `access_sampling` (`off`, a whole number, or `N/s`) and `access_bits`
/// (`on` / `off`), with the daemon's own parsers (`cxlfs_api::hits`).
fn check_access_sampling(d: &DaemonSpec) -> Result<(), KeyError> {
    if let Some(v) = &d.access_sampling {
        access_sampling_rate(v.into())
            .map_err(|e| ("daemon.access_sampling".to_string(), e.to_string()))?;
    }
    if let Some(v) = &d.access_bits {
        access_bits(v.into()).map_err(|e| ("daemon.access_bits".to_string(), e.to_string()))?;
    }
    if let Some(t) = &d.access_bits_period {
        cxlfs_device_model::units::parse_duration_ns(t)
            .map_err(|e| e.to_string())
            .and_then(|ns| {
                cxlfs_api::hits::access_bits_period(ns)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| ("daemon.access_bits_period".to_string(), e))?;
    }
    Ok(())
}

/// `dax_eviction_backlog` (`auto`, `off` or pages), with the daemon's own
/// parser (`cxlfs_api::dax`).
fn check_dax_eviction_backlog(d: &DaemonSpec) -> Result<(), KeyError> {
    match &d.dax_eviction_backlog {
        Some(v) => cxlfs_api::dax::eviction_backlog(v.into())
            .map(|_| ())
            .map_err(|e| ("daemon.dax_eviction_backlog".to_string(), e.to_string())),
        None => Ok(()),
    }
}

/// `latency_compensation`: words, numbers, units, `=` and `,` only (the
/// daemon checks the rest when it starts).
fn check_latency_compensation(d: &DaemonSpec) -> Result<(), KeyError> {
    if let Some(v) = &d.latency_compensation {
        let ok = !v.trim().is_empty()
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "=,. ".contains(c));
        if !ok {
            return Err((
                "daemon.latency_compensation".into(),
                format!("`{v}`: give auto, off, a duration (12us) or dax=…,fuse=…"),
            ));
        }
    }
    Ok(())
}

/// `replay_iolog`: guests over the DAX window of `cxlfsd`, and fio phases
/// of one job each, set by the spec's options (one log a phase).
fn check_replay_iolog(spec: &Spec) -> Result<(), KeyError> {
    if !spec.replay_iolog {
        return Ok(());
    }
    let refuse = |why: &str| Err(("replay_iolog".to_string(), why.to_string()));
    if !spec.daemon.dax || spec.daemon.backend != Backend::Cxlfsd {
        return refuse(
            "replays the guests' I/O at the device: it needs cxlfsd with daemon.dax = true \
             (through FUSE the guest's page cache takes the re-reads)",
        );
    }
    for p in spec.phases.iter().filter(|p| p.command.is_none()) {
        let numjobs = p.fio.get("numjobs").or_else(|| spec.fio.get("numjobs"));
        let one_job = numjobs.map_or(true, |n| value_text(n) == "1");
        let job_file = p.fio.contains_key("job_file") || spec.fio.contains_key("job_file");
        if !p.jobs.is_empty() || job_file || !one_job {
            return refuse(&format!(
                "phase `{}`: one fio job a phase, from the spec's options \
                 (no jobs, job_file or numjobs): each guest writes one log a phase",
                p.name
            ));
        }
        if p.fio.contains_key("write_iolog") || spec.fio.contains_key("write_iolog") {
            return refuse("sets fio's write_iolog itself: leave it out");
        }
    }
    Ok(())
}

/// `[vars]` names are identifiers (phase commands write `{name}`).
fn check_vars(spec: &Spec) -> Result<(), KeyError> {
    for (k, _) in &spec.vars {
        if !is_identifier(k) {
            return Err((
                format!("vars.{k}"),
                "a variable name is letters, digits and `_`, not starting with a digit".into(),
            ));
        }
    }
    Ok(())
}

/// The guest image is built once per experiment: no sweep under `image`.
fn check_image_not_swept(spec: &Spec) -> Result<(), KeyError> {
    for k in spec.sweep.keys() {
        if k.starts_with("image") {
            return Err((
                format!("sweep.{k}"),
                "the image is one per experiment: not sweepable".into(),
            ));
        }
    }
    Ok(())
}

fn is_identifier(k: &str) -> bool {
    k.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The effective device config of a daemon spec; on error the failing key.
pub(super) fn device_config(d: &DaemonSpec) -> Result<DeviceConfig, (String, String)> {
    let name = d.preset.as_deref().unwrap_or(DEFAULT_PRESET);
    let base = preset(name).map_err(|e| ("daemon.preset".to_string(), e.to_string()))?;
    let mut sets = Vec::new();
    flatten_sets("", &d.device, &mut sets);
    base.with_overrides(&sets)
        .map_err(|e| ("daemon.device".to_string(), e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use crate::spec::load_str;
    use crate::spec::test_specs::{REPLAYED, SPEC};

    #[test]
    fn virtiofsd_refuses_what_only_cxlfsd_has() {
        let ok = SPEC
            .replace("cxl_ratio = 50\n", "")
            .replace("[daemon]", "[daemon]\nbackend = \"virtiofsd\"");
        load_str("s.toml", &ok, &[]).unwrap();
        for (set, key) in [
            ("dax = true", "daemon.dax"),
            ("cxl_memory = \"64MiB\"", "daemon.cxl_memory"),
            ("cxl_ratio = 50", "daemon.cxl_ratio"),
        ] {
            let bad = ok.replace("[daemon]", &format!("[daemon]\n{set}"));
            let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("only cxlfsd"), "{set}: {e}");
        }
        let bad = SPEC.replace("[daemon]", "[daemon]\nbackend = \"nfs\"");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(e.contains("backend"), "{e}");
    }

    #[test]
    fn replay_iolog_needs_the_dax_window_and_one_job_a_phase() {
        load_str("s.toml", REPLAYED, &[]).unwrap();
        for (from, to, why) in [
            ("dax = true", "dax = false", "daemon.dax = true"),
            (
                "dax = true",
                "dax = true\nbackend = \"virtiofsd\"",
                "only cxlfsd",
            ),
            (
                "name = \"a\"",
                "name = \"a\"\njobs = [{ bs = \"4k\" }]",
                "phase `a`: one fio job",
            ),
            (
                "rw = \"randread\"",
                "rw = \"randread\"\nnumjobs = 2",
                "phase `a`: one fio job",
            ),
            (
                "name = \"a\"",
                "name = \"a\"\nfio.job_file = \"j.fio\"",
                "phase `a`",
            ),
            (
                "rw = \"randread\"",
                "rw = \"randread\"\nwrite_iolog = \"x\"",
                "write_iolog",
            ),
        ] {
            let bad = REPLAYED.replacen(from, to, 1);
            let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
            assert!(e.contains(why), "{to}: {e}");
        }
        // One job spelled out is one job.
        let one = REPLAYED.replace("rw = \"randread\"", "rw = \"randread\"\nnumjobs = 1");
        load_str("s.toml", &one, &[]).unwrap();
    }

    #[test]
    fn a_vcpu_realtime_priority_is_1_to_99() {
        let with =
            |p: &str| SPEC.replace("count = 2", &format!("count = 2\nrealtime_priority = {p}"));
        load_str("s.toml", &with("4"), &[]).unwrap();
        let e = load_str("s.toml", &with("0"), &[]).unwrap_err().to_string();
        assert!(e.contains("vms.realtime_priority"), "{e}");
    }

    #[test]
    fn kernel_args_are_one_argument_an_entry() {
        let with =
            |args: &str| SPEC.replace("count = 2", &format!("count = 2\nkernel_args = {args}"));
        load_str("s.toml", &with(r#"["nohz_full=1", "rcu_nocbs=1"]"#), &[]).unwrap();
        for bad in [r#"["nohz_full=1 quiet"]"#, r#"[""]"#, r#"["a=\"b\""]"#] {
            let e = load_str("s.toml", &with(bad), &[]).unwrap_err().to_string();
            assert!(e.contains("vms.kernel_args"), "{bad}: {e}");
        }
    }

    #[test]
    fn unknown_keys_are_named_with_the_file() {
        let bad = SPEC.replace("count = 2", "count = 2\nmemry = \"1G\"");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("s.toml: vms.memry: unknown field `memry`"),
            "{e}"
        );
        let bad = SPEC.replace("repeats = 2", "repeats = 2\nsweeep = 1");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(e.contains("s.toml: ") && e.contains("sweeep"), "{e}");
        let bad = SPEC.replace("device.nand.read_ns", "device.nand.red_ns");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("s.toml: daemon.device: ") && e.contains("red_ns"),
            "{e}"
        );
        let bad = SPEC.replace("cxl_ratio = 50", "cxl_ratio = 150");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(e.starts_with("s.toml: daemon.cxl_ratio: "), "{e}");
        let bad = SPEC.replace(
            "cxl_ratio = 50",
            "cxl_ratio = 50\naccess_sampling = \"fast\"",
        );
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("s.toml: daemon.access_sampling: \"fast\": "),
            "{e}"
        );
        let bad = SPEC.replace("cxl_ratio = 50", "cxl_ratio = 50\naccess_bits = \"yes\"");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("s.toml: daemon.access_bits: \"yes\": "),
            "{e}"
        );
        let bad = SPEC.replace(
            "cxl_ratio = 50",
            "cxl_ratio = 50\ndax_eviction_backlog = -3",
        );
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("s.toml: daemon.dax_eviction_backlog: ") && e.contains("-3"),
            "{e}"
        );
        // A swept value is checked at load as well, naming the point.
        let swept = load_str("s.toml", SPEC, &["sweep.daemon.access_sampling=[0]".into()])
            .unwrap()
            .expand(false)
            .unwrap_err()
            .to_string();
        assert!(
            swept.starts_with("s.toml: daemon.access_sampling (sweep point ")
                && swept.contains("): a rate of 0"),
            "{swept}"
        );
        let e = load_str("s.toml", "name = \"x\"\n[[phases]]\nname = \"a b\"", &[])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.toml: phases.0.name: "), "{e}");
        let e = load_str("s.toml", "name = ", &[]).unwrap_err().to_string();
        assert!(e.starts_with("s.toml: "), "{e}");
        let e = load_str("s.toml", "name = \"x\"", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("phases"), "{e}");
        let bad = SPEC.replace("path = \"data/f{i}.bin\"", "path = \"../f{i}.bin\"");
        let e = load_str("s.toml", &bad, &[]).unwrap_err().to_string();
        assert!(e.starts_with("s.toml: files.0.path: "), "{e}");
    }
}
