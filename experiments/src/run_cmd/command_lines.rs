//! What a run plan turns into on the command line: the `cxlfsd` arguments,
//! the `run-vm.sh` arguments of a guest, the template variables its guests
//! share, and what each phase runs (as text).

use super::tools::Tools;
use crate::guest_script;
use crate::spec::{access_sampling_text, PhaseSpec, RunPlan, DEFAULT_PRESET};
use crate::template::TemplateValue;
use anyhow::Result;
use cxlfs_api::hits::RegionKind;
use cxlfs_device_model::units::parse_duration_ns;
use std::collections::BTreeMap;
use std::path::Path;

/// The `cxlfsd` arguments of a run (besides `--shared-dir`, `--vm`, `--metrics-addr`).
pub(super) fn daemon_args(
    plan: &RunPlan,
    tools: Option<&Tools>,
    metrics_file: &Path,
) -> Vec<String> {
    let d = &plan.spec.daemon;
    let mut a = vec![
        "--preset".to_string(),
        d.preset
            .clone()
            .unwrap_or_else(|| DEFAULT_PRESET.to_string()),
    ];
    for s in &plan.device_sets {
        a.push("--set".into());
        a.push(s.clone());
    }
    a.extend(["--cache".to_string(), d.cache.clone()]);
    if let Some(r) = d.cxl_ratio {
        a.extend(["--cxl-ratio".to_string(), r.to_string()]);
    }
    if d.dax {
        a.extend(["--dax".to_string(), "on".to_string()]);
        // One size for both sides, the spec's vms.dax_window: QEMU's
        // cache-size (`vm_args`) must equal it (the patched QEMU asks the
        // daemon and refuses to start with another), and the window's bit
        // area is made for it.
        a.extend(["--dax-window".to_string(), plan.spec.vms.dax_window.clone()]);
        if d.dax_eviction_backlog.is_some() {
            a.extend([
                "--dax-eviction-backlog".to_string(),
                d.dax_eviction_backlog().to_string(),
            ]);
        }
    }
    a.extend([
        "--access-bits".to_string(),
        d.access_bits().as_str().to_string(),
    ]);
    if let Some(p) = &d.access_bits_period {
        a.extend(["--access-bits-period".to_string(), p.clone()]);
    }
    if let Some(m) = d.cxl_memory_bytes() {
        for i in 0..plan.spec.vms.count {
            a.extend(["--cxl-memory".to_string(), format!("vm{i}={m}")]);
        }
    }
    if let Some(rate) = d.access_sampling_rate() {
        a.extend([
            "--access-sampling".to_string(),
            access_sampling_text(Some(rate)),
        ]);
    }
    if let Some(c) = &d.latency_compensation {
        a.extend(["--latency-compensation".to_string(), c.clone()]);
    }
    if tools.map_or(true, |t| t.metrics_file) {
        a.push("--metrics-file".into());
        a.push(metrics_file.display().to_string());
        a.push("--metrics-interval".into());
        a.push(d.metrics_interval.clone());
    }
    a.extend(d.args.iter().cloned());
    a
}

/// The `run-vm.sh` arguments of guest `vm` (besides image, socket, serial),
/// whose socket is `socket`.
pub(super) fn vm_args(plan: &RunPlan, vm: &str, socket: &Path) -> Vec<String> {
    let v = &plan.spec.vms;
    let timeout_s = parse_duration_ns(&v.timeout).unwrap_or(600_000_000_000) / 1_000_000_000;
    let mut a = vec![
        "--name".to_string(),
        vm.to_string(),
        "--smp".into(),
        v.smp.to_string(),
        "--mem".into(),
        v.memory.clone(),
        "--timeout".into(),
        timeout_s.max(1).to_string(),
    ];
    let mountopts = v
        .mountopts
        .clone()
        .or_else(|| plan.spec.daemon.dax.then(|| "dax=always".to_string()));
    if let Some(m) = mountopts.filter(|m| !m.is_empty()) {
        a.extend(["--mountopts".to_string(), m]);
    }
    if let Some(p) = v.realtime_priority {
        a.extend(["--realtime-priority".to_string(), p.to_string()]);
    }
    if plan.spec.daemon.dax {
        // The daemon's --dax-window (`daemon_args`): the same value.
        a.extend(["--cache-size".to_string(), v.dax_window.clone()]);
    }
    if plan.spec.daemon.cxl_memory.is_some() {
        // `cxlfs ctl memory-fd` fills in the region's size and descriptor.
        a.extend(["--cxl-memory", "{size}", "--cxl-memory-fd", "{fd}"].map(String::from));
        // The guest's HMAT: node 1 costs a CXL link plus the device's hit.
        let latency = CXL_LINK_NS.saturating_add(plan.device.cache.hit_latency_ns);
        a.extend(["--cxl-latency".to_string(), latency.to_string()]);
    }
    // One --append (run-vm.sh keeps the last): the CXL node's memory is
    // movable, then the spec's own arguments.
    let mut kernel_args = Vec::new();
    if plan.spec.daemon.cxl_memory.is_some() {
        kernel_args.push("movable_node");
    }
    kernel_args.extend(v.kernel_args.iter().map(String::as_str));
    if !kernel_args.is_empty() {
        a.extend(["--append".to_string(), kernel_args.join(" ")]);
    }
    if plan.spec.daemon.access_bits().is_on() {
        // The areas `cxlfsd --access-bits on` made beside the socket.
        let area = |r: RegionKind| r.area_path(socket).to_string_lossy().into_owned();
        if plan.spec.daemon.dax {
            a.extend(["--dax-abits".to_string(), area(RegionKind::File)]);
        }
        if plan.spec.daemon.cxl_memory.is_some() {
            a.extend(["--cxl-abits".to_string(), area(RegionKind::Memory)]);
        }
    }
    a
}

/// A CXL link's share of a load's latency (ns), added to the device's hit
/// latency for node 1's HMAT entry: about what a CXL memory expander adds
/// to a local DRAM access.
const CXL_LINK_NS: u64 = 170;

/// The template variables every guest of a run shares: the spec's `vars`,
/// the device cache size (`cache_bytes`), the CXL memory region size
/// (`cxl_memory_bytes`, 0 without one).
pub(super) fn template_base(plan: &RunPlan) -> BTreeMap<String, TemplateValue> {
    let mut v: BTreeMap<String, TemplateValue> = plan
        .spec
        .vars
        .iter()
        .map(|(k, x)| (k.clone(), TemplateValue::of_toml(x)))
        .collect();
    v.insert(
        "cache_bytes".into(),
        TemplateValue::Number(plan.device.cache.size_bytes as f64),
    );
    let region = plan.spec.daemon.cxl_memory_bytes().unwrap_or(0);
    v.insert(
        "cxl_memory_bytes".into(),
        TemplateValue::Number(region as f64),
    );
    v
}

/// What a phase runs in vm0, as text: the rendered command, the job file,
/// or fio's arguments.
pub(super) fn phase_text(plan: &RunPlan, phase: &PhaseSpec) -> Result<String> {
    let vars = guest_script::vm_vars(&template_base(plan), "vm0", 0, plan.spec.vms.count);
    if let Some(c) = guest_script::command_line(phase, &vars)? {
        return Ok(format!("sh -c {}", guest_script::sh_quote(&c)));
    }
    if let Some(j) = guest_script::job_file(&plan.spec, phase) {
        return Ok(format!("fio {j} (job file, verbatim)"));
    }
    Ok(format!(
        "fio {}",
        guest_script::fio_args(&plan.spec, phase, "vm0", 0).join(" ")
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::run_cmd::test_spec::SPEC;
    use crate::spec::load_str;

    #[test]
    fn daemon_and_vm_arguments_follow_the_spec() {
        let plans = load_str("t.toml", SPEC, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        let a = daemon_args(&plans[0], None, Path::new("m.jsonl"));
        assert_eq!(
            a,
            [
                "--preset",
                "femu",
                "--set",
                "cache.size_bytes=8MiB",
                "--cache",
                "never",
                "--cxl-ratio",
                "0",
                "--dax",
                "on",
                "--dax-window",
                "64M",
                "--access-bits",
                "on",
                "--metrics-file",
                "m.jsonl",
                "--metrics-interval",
                "1s"
            ]
        );
        let sampled = load_str(
            "t.toml",
            SPEC,
            &["sweep.daemon.access_sampling=[\"off\", 500, \"2000/s\"]".into()],
        )
        .unwrap()
        .expand(false)
        .unwrap();
        let flag = |p: &RunPlan| {
            let a = daemon_args(p, None, Path::new("m.jsonl"));
            a.iter()
                .position(|x| x == "--access-sampling")
                .map(|i| a[i + 1].clone())
        };
        let flags: Vec<Option<String>> = sampled.iter().map(flag).collect();
        assert_eq!(flags.iter().filter(|f| f.is_none()).count(), 2, "{flags:?}");
        assert!(flags.contains(&Some("500/s".into())), "{flags:?}");
        assert!(flags.contains(&Some("2000/s".into())), "{flags:?}");
        let v = vm_args(&plans[1], "vm1", Path::new("w/vm1.sock"));
        assert_eq!(
            v,
            [
                "--name",
                "vm1",
                "--smp",
                "1",
                "--mem",
                "1G",
                "--timeout",
                "600",
                "--mountopts",
                "dax=always",
                "--cache-size",
                "64M",
                "--dax-abits",
                "w/vm1.sock.dax-abits"
            ]
        );
        // With the bits off, no area, and the daemon is told.
        let mut off = plans[1].clone();
        off.spec.daemon.access_bits = Some(toml::Value::String("off".into()));
        off.spec.daemon.access_bits_period = Some("20ms".into());
        let v = vm_args(&off, "vm1", Path::new("w/vm1.sock"));
        assert_eq!(v.last().map(String::as_str), Some("64M"), "{v:?}");
        let a = daemon_args(&off, None, Path::new("m.jsonl"));
        assert!(a.windows(2).any(|w| w == ["--access-bits", "off"]), "{a:?}");
        assert!(
            a.windows(2).any(|w| w == ["--access-bits-period", "20ms"]),
            "{a:?}"
        );
        // The eviction backlog goes to a daemon with DAX, as given.
        let mut bound = plans[0].clone();
        bound.spec.daemon.dax_eviction_backlog = Some(toml::Value::Integer(0));
        let a = daemon_args(&bound, None, Path::new("m.jsonl"));
        assert!(
            a.windows(2).any(|w| w == ["--dax-eviction-backlog", "0"]),
            "{a:?}"
        );
        bound.spec.daemon.dax = false;
        let a = daemon_args(&bound, None, Path::new("m.jsonl"));
        assert!(!a.iter().any(|x| x == "--dax-eviction-backlog"), "{a:?}");
    }

    #[test]
    fn kernel_args_and_vcpu_priority_reach_run_vm() {
        let plans = load_str("t.toml", SPEC, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        let mut p = plans[0].clone();
        p.spec.vms.realtime_priority = Some(4);
        p.spec.vms.kernel_args = vec!["nohz_full=1".into(), "rcu_nocbs=1".into()];
        let v = vm_args(&p, "vm0", Path::new("w/vm0.sock"));
        assert!(
            v.windows(2).any(|w| w == ["--realtime-priority", "4"]),
            "{v:?}"
        );
        assert!(
            v.windows(2)
                .any(|w| w == ["--append", "nohz_full=1 rcu_nocbs=1"]),
            "{v:?}"
        );
        // Memory mode's movable_node and the spec's arguments share one
        // --append: run-vm.sh keeps only the last.
        p.spec.daemon.cxl_memory = Some("64MiB".into());
        let v = vm_args(&p, "vm0", Path::new("w/vm0.sock"));
        assert_eq!(v.iter().filter(|x| *x == "--append").count(), 1, "{v:?}");
        assert!(
            v.windows(2)
                .any(|w| w == ["--append", "movable_node nohz_full=1 rcu_nocbs=1"]),
            "{v:?}"
        );
        p.spec.vms.kernel_args.clear();
        let v = vm_args(&p, "vm0", Path::new("w/vm0.sock"));
        assert!(
            v.windows(2).any(|w| w == ["--append", "movable_node"]),
            "{v:?}"
        );
    }
}
