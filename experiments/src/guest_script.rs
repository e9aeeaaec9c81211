//! The guest side of one run: `.cxlfs/run.sh` in the share, which every
//! guest runs at boot (`$CXLFS_VM` names it).
//!
//! Each phase is one fio invocation with `--output-format=json`; its JSON,
//! its console output and its exit status go to `.cxlfs/out/VM/K.{json,log,rc}`
//! in the share, where the host reads them. Around every phase the guests
//! meet the host at a barrier: guest `ready-VM-K` files, host `go-K` file.
//! The host scrapes the daemon's metrics at each barrier, so the counters of
//! phase K are the difference between barriers K and K+1, and the phases of
//! all guests start together. A failing fio does not stop the script: the
//! next barriers are still reached, so the other guests go on.

use crate::spec::{PhaseSpec, Spec};
use std::fmt::Write as _;

/// Quotes `s` for `sh` (single quotes).
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A fio option value as text, with `{vm}`, `{vm_index}` and `{vms}` replaced.
fn fio_value(v: &toml::Value, vm: &str, index: u32, count: u32) -> String {
    let text = match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Boolean(b) => u8::from(*b).to_string(),
        other => other.to_string(),
    };
    text.replace("{vm}", vm)
        .replace("{vm_index}", &index.to_string())
        .replace("{vms}", &count.to_string())
}

fn options(t: &toml::Table, vm: &str, index: u32, count: u32, out: &mut Vec<String>) {
    for (k, v) in t {
        out.push(format!("--{k}={}", fio_value(v, vm, index, count)));
    }
}

/// fio's arguments for one phase of guest `vm` (after `fio`, before the
/// output options): global options (spec `fio` merged with the phase's),
/// then one `--name=` section per job.
pub fn fio_args(spec: &Spec, phase: &PhaseSpec, vm: &str, index: u32) -> Vec<String> {
    let count = spec.vms.count;
    let mut global = spec.fio.clone();
    for (k, v) in &phase.fio {
        global.insert(k.clone(), v.clone());
    }
    let mut args = vec!["--group_reporting".to_string()];
    options(&global, vm, index, count, &mut args);
    if phase.jobs.is_empty() {
        args.push(format!("--name={}", phase.name));
    } else {
        for (j, job) in phase.jobs.iter().enumerate() {
            let name = job
                .get("name")
                .map(|n| fio_value(n, vm, index, count))
                .unwrap_or_else(|| format!("{}-{j}", phase.name));
            args.push(format!("--name={name}"));
            let mut rest = job.clone();
            rest.remove("name");
            options(&rest, vm, index, count, &mut args);
        }
    }
    args
}

/// The whole `.cxlfs/run.sh`.
pub fn script(spec: &Spec) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"# Written by `cxlfs run` (experiments/src/guest_script.rs); run by every guest.
vm="$CXLFS_VM"
out="/mnt/.cxlfs/out/$vm"
barrier() {{
    : >"/mnt/.cxlfs/sync/ready-$vm-$1"
    while [ ! -e "/mnt/.cxlfs/sync/go-$1" ]; do sleep 0.05; done
}}
phase() {{
    k=$1; shift
    fio --output-format=json --output="/tmp/$k.json" "$@" >"/tmp/$k.log" 2>&1
    echo $? >"/tmp/$k.rc"
    cp "/tmp/$k.json" "$out/$k.json" 2>/dev/null
    cp "/tmp/$k.log" "$out/$k.log"
    cp "/tmp/$k.rc" "$out/$k.rc"
}}
{{ fio --version; uname -r; }} >/tmp/versions.txt 2>&1
cp /tmp/versions.txt "$out/versions.txt"
case "$vm" in
"#
    );
    for index in 0..spec.vms.count {
        let vm = format!("vm{index}");
        let _ = writeln!(s, "{vm})");
        for (k, phase) in spec.phases.iter().enumerate() {
            let _ = writeln!(s, "    barrier {k}");
            if phase.drop_caches {
                let _ = writeln!(s, "    sync; echo 3 >/proc/sys/vm/drop_caches");
            }
            let args: Vec<String> = fio_args(spec, phase, &vm, index)
                .iter()
                .map(|a| sh_quote(a))
                .collect();
            let _ = writeln!(s, "    phase {k} {}", args.join(" "));
        }
        let _ = writeln!(s, "    barrier {}\n    ;;", spec.phases.len());
    }
    s.push_str("*) echo \"cxlfs run: no job for VM $vm\"; exit 1 ;;\nesac\nexit 0\n");
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::spec::load_str;

    #[test]
    fn phases_become_fio_invocations_between_barriers() {
        let text = r#"
name = "t"
[vms]
count = 2
[fio]
rw = "randread"
filename = "f-{vm}.bin"
time_based = true
[[phases]]
name = "one"
fio.bs = "4k"
[[phases]]
name = "two"
drop_caches = true
jobs = [{ name = "a", rw = "read" }, { bs = "1m", opendir = "it's" }]
"#;
        let spec = load_str("t.toml", text, &[]).unwrap().spec;
        let a = fio_args(&spec, &spec.phases[0], "vm1", 1);
        assert_eq!(
            a,
            [
                "--group_reporting",
                "--bs=4k",
                "--filename=f-vm1.bin",
                "--rw=randread",
                "--time_based=1",
                "--name=one"
            ]
        );
        let b = fio_args(&spec, &spec.phases[1], "vm0", 0);
        assert_eq!(
            &b[4..],
            [
                "--name=a",
                "--rw=read",
                "--name=two-1",
                "--bs=1m",
                "--opendir=it's"
            ]
        );
        let s = script(&spec);
        assert!(
            s.contains("vm0)\n    barrier 0\n    phase 0 '--group_reporting'"),
            "{s}"
        );
        assert!(
            s.contains("    barrier 1\n    sync; echo 3 >/proc/sys/vm/drop_caches\n    phase 1"),
            "{s}"
        );
        assert!(s.contains("'--opendir=it'\\''s'"), "{s}");
        assert!(s.contains("    barrier 2\n    ;;\nvm1)"), "{s}");
        assert_eq!(s.matches("barrier 2").count(), 2);
    }

    #[test]
    fn the_script_is_valid_sh() {
        let spec = load_str(
            "t.toml",
            "name = \"t\"\n[[phases]]\nname = \"p\"\nfio.rw = \"it's\"",
            &[],
        )
        .unwrap()
        .spec;
        let st = std::process::Command::new("sh")
            .args(["-n", "-c", &script(&spec)])
            .status()
            .unwrap();
        assert!(st.success());
    }
}
