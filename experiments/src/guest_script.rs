//! The guest side of one run: `.cxlfs/run.sh` in the share, which every
//! guest runs at boot (`$CXLFS_VM` names it).
//!
//! Each phase is one fio invocation with `--output-format=json` (options
//! from the spec, or a job file verbatim) or one shell command, under the
//! phase's memory policy (`numactl`, or `cxlfs-numa` for weighted
//! interleave); its stdout, stderr, exit status (and fio's JSON) go to
//! `.cxlfs/out/VM/K/{stdout,stderr,rc,fio.json}` in the share, where the
//! host reads them; a command may leave more files there (`$CXLFS_OUT`). Around every phase the guests
//! meet the host at a barrier: guest `ready-VM-K` files, host `go-K` file.
//! The host scrapes the daemon's metrics at each barrier, so the counters of
//! phase K are the difference between barriers K and K+1, and the phases of
//! all guests start together. A failing fio does not stop the script: the
//! next barriers are still reached, so the other guests go on.

use crate::spec::{NodeName, NumaSpec, PhaseSpec, Spec};
use crate::template::{self, RenderTemplateError, TemplateValue};
use std::collections::BTreeMap;
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

/// The name of a phase's fio I/O log in the guest's `$out/K/`
/// (`replay_iolog`).
pub const IOLOG: &str = "iolog";

/// The phases whose fio logs its I/O (`replay_iolog`, where this run
/// replays it: [`Spec::replays_iolog`]): every fio phase, or none.
pub fn logged_phases(spec: &Spec) -> Vec<usize> {
    if !spec.replays_iolog() {
        return Vec::new();
    }
    (0..spec.phases.len())
        .filter(|&k| spec.phases[k].command.is_none())
        .collect()
}

/// Where fio writes phase `k`'s I/O log in the guest (`replay_iolog`): off
/// the share while the phases run.
fn iolog_in_guest(k: usize) -> String {
    format!("/tmp/cxlfs-iolog-{k}")
}

/// Where a phase's job file lies in the guest (copied into the share by
/// the runner): `fio.job_file` of phase `k`.
pub fn job_file_in_guest(k: usize) -> String {
    format!("/mnt/.cxlfs/jobs/{k}.fio")
}

/// The fio job file a phase names (`fio.job_file`, the phase's over the
/// spec's), as written in the spec.
pub fn job_file(spec: &Spec, phase: &PhaseSpec) -> Option<String> {
    phase
        .fio
        .get("job_file")
        .or_else(|| spec.fio.get("job_file"))
        .map(crate::spec::value_text)
}

/// The policy words `run_phase` takes: kind and node spec.
fn policy_words(numa: Option<&NumaSpec>) -> (&'static str, String) {
    let names = |set: &[NodeName]| {
        set.iter()
            .map(|n| match n {
                NodeName::Number(i) => i.to_string(),
                NodeName::Name(s) => s.clone(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    // Specs are checked at load: a ratio always resolves.
    match numa.and_then(|n| n.resolved().ok()) {
        None | Some(NumaSpec::Ratio(_)) => ("none", String::new()),
        Some(NumaSpec::Membind(m)) => ("membind", names(&m.names())),
        Some(NumaSpec::Interleave(i)) => ("interleave", names(&i.names())),
        Some(NumaSpec::Preferred(p)) => ("preferred", names(&[p])),
        Some(NumaSpec::WeightedInterleave(w)) => (
            "weighted",
            w.iter()
                .map(|(node, weight)| format!("{node}:{weight}"))
                .collect::<Vec<_>>()
                .join(" "),
        ),
    }
}

/// The template variables of guest `vm` (index `index`): `base` (the run's
/// figures and the spec's `vars`) plus `vm`, `vm_index`, `vms`.
pub fn vm_vars(
    base: &BTreeMap<String, TemplateValue>,
    vm: &str,
    index: u32,
    count: u32,
) -> BTreeMap<String, TemplateValue> {
    let mut v = base.clone();
    v.insert("vm".into(), TemplateValue::Text(vm.to_string()));
    v.insert("vm_index".into(), TemplateValue::Number(f64::from(index)));
    v.insert("vms".into(), TemplateValue::Number(f64::from(count)));
    v
}

/// The command line of a command phase for guest `vm` (templates rendered).
pub fn command_line(
    phase: &PhaseSpec,
    vars: &BTreeMap<String, TemplateValue>,
) -> Result<Option<String>, RenderTemplateError> {
    phase
        .command
        .as_deref()
        .map(|c| template::render(c, vars))
        .transpose()
}

/// The shell functions every guest script starts with.
const PRELUDE: &str = r#"# Written by `cxlfs run` (experiments/src/guest_script.rs); run by every guest.
vm="$CXLFS_VM"
out="/mnt/.cxlfs/out/$vm"
barrier() {
    : >"/mnt/.cxlfs/sync/ready-$vm-$1"
    while [ ! -e "/mnt/.cxlfs/sync/go-$1" ]; do sleep 0.05; done
}
# nodes cxl|dram|N...: node numbers, comma separated (cxl: the CPU-less
# memory nodes, memory mode; dram: the nodes with CPUs).
nodes() {
    r=
    for n in "$@"; do
        case "$n" in
        cxl) l=$(cat /run/cxlfs/cxl-nodes 2>/dev/null)
             [ -n "$l" ] || { echo "no CXL memory node in this guest (set daemon.cxl_memory)"; return 1; } ;;
        dram) l=$(for d in /sys/devices/system/node/node[0-9]*; do
                      [ -n "$(cat "$d/cpulist")" ] && echo "${d##*/node}"; done) ;;
        *) l=$n ;;
        esac
        r="$r $l"
    done
    echo $r | tr ' ' ','
}
# weights NAME:W...: NODE:W,NODE:W (each node of NAME gets weight W).
weights() {
    r=
    for nw in "$@"; do
        l=$(nodes "${nw%%:*}") || { echo "$l"; return 1; }
        for n in $(echo "$l" | tr ',' ' '); do r="$r${r:+,}$n:${nw#*:}"; done
    done
    echo "$r"
}
# run_phase K KIND NODESPEC COMMAND...: COMMAND under the memory policy
# (numactl; cxlfs-numa for weighted interleave), its stdout, stderr and
# exit status in $out/K/.
run_phase() {
    k=$1 kind=$2 spec=$3; shift 3
    d="$out/$k"
    mkdir -p "$d"
    case "$kind" in
    none) ;;
    weighted) w=$(weights $spec) || { echo "$w" >"$d/stderr"; echo 3 >"$d/rc"; return; }
              set -- cxlfs-numa --weighted-interleave "$w" -- "$@" ;;
    *) n=$(nodes $spec) || { echo "$n" >"$d/stderr"; echo 3 >"$d/rc"; return; }
       set -- numactl "--$kind=$n" -- "$@" ;;
    esac
    tier_counters >/tmp/vmstat-$k.0 2>/dev/null
    # The counters every second while the phase runs (vmstat.jsonl).
    ( while :; do
          tier_counters >/tmp/vmstat-$k.s 2>/dev/null
          t=$(cut -d' ' -f1 /proc/uptime)
          j=$(vmstat_json /tmp/vmstat-$k.0 /tmp/vmstat-$k.s)
          if [ "$j" = "{}" ]; then echo "{\"t_s\":$t}"; else echo "{\"t_s\":$t,${j#?}"; fi
          sleep 1
      done ) >"$d/vmstat.jsonl" 2>/dev/null &
    sampler=$!
    CXLFS_OUT="$d" "$@" >"$d/stdout" 2>"$d/stderr"
    echo $? >"$d/rc"
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    tier_counters >/tmp/vmstat-$k.1 2>/dev/null
    vmstat_json /tmp/vmstat-$k.0 /tmp/vmstat-$k.1 >"$d/vmstat.json"
    c=$(file_cache_kib)
    echo "{\"file_cache_bytes\":$(( c > cache0 ? (c - cache0) * 1024 : 0 ))}" >"$d/meminfo.json"
}
# The page cache of files (Cached less Shmem: tmpfs, the root file system),
# in KiB.
file_cache_kib() {
    awk '/^Cached:/ { c = $2 } /^Shmem:/ { s = $2 } END { print c - s }' /proc/meminfo
}
# set_tiering K PROMOTION DEMOTION (1 or 0): the guest kernel's memory
# tiering from phase K on; what failed goes to $out/K/stderr (rc 3).
set_tiering() {
    d="$out/$1"
    mkdir -p "$d"
    nb=0; [ "$2" = 1 ] && nb=2
    dm=false; [ "$3" = 1 ] && dm=true
    { echo "$nb" >/proc/sys/kernel/numa_balancing && echo "$dm" >/sys/kernel/mm/numa/demotion_enabled; } 2>"$d/stderr" && return 0
    echo "cannot set memory tiering (kernel.numa_balancing=$nb, demotion_enabled=$dm)" >>"$d/stderr"
    echo 3 >"$d/rc"
    return 1
}
# The tiering counters of /proc/vmstat, one "name value" a line.
tier_counters() {
    grep -E '^(pgpromote_success|pgdemote_kswapd|pgdemote_direct|numa_hint_faults) ' /proc/vmstat
}
# vmstat_json BEFORE AFTER: the counters' growth as one JSON object.
vmstat_json() {
    awk 'NR == FNR { a[$1] = $2; next }
         { printf "%s\"%s\":%d", (n++ ? "," : "{"), $1, $2 - a[$1] }
         END { print (n ? "}" : "{}") }' "$1" "$2"
}
# fio_phase K KIND NODESPEC FIO-ARGS...: fio's JSON in $out/K/fio.json.
fio_phase() {
    k=$1; kind=$2 spec=$3; shift 3
    run_phase "$k" "$kind" "$spec" fio --output-format=json --output="/tmp/$k.json" "$@"
    cp "/tmp/$k.json" "$out/$k/fio.json" 2>/dev/null
}
{ fio --version; uname -r; } >/tmp/versions.txt 2>&1
cp /tmp/versions.txt "$out/versions.txt"
# The file page cache at the start, emptied first: what a phase's
# meminfo.json reports (file_cache_bytes) is the file data the guest
# caches by the phase's end.
sync; echo 3 >/proc/sys/vm/drop_caches
cache0=$(file_cache_kib)
"#;

/// The whole `.cxlfs/run.sh`; `base` holds the template variables every
/// guest shares (the spec's `vars`, `cache_bytes`, ...).
pub fn script(
    spec: &Spec,
    base: &BTreeMap<String, TemplateValue>,
) -> Result<String, RenderTemplateError> {
    let mut s = String::new();
    s.push_str(PRELUDE);
    for (k, v) in &spec.vars {
        let _ = writeln!(
            s,
            "{k}={}; export {k}",
            sh_quote(&match TemplateValue::of_toml(v) {
                TemplateValue::Number(x) => template::number_text(x),
                TemplateValue::Text(t) => t,
            })
        );
    }
    let logged = logged_phases(spec);
    s.push_str("case \"$vm\" in\n");
    for index in 0..spec.vms.count {
        let vm = format!("vm{index}");
        let vars = vm_vars(base, &vm, index, spec.vms.count);
        let _ = writeln!(s, "{vm})");
        for (k, phase) in spec.phases.iter().enumerate() {
            let _ = writeln!(s, "    barrier {k}");
            if phase.drop_caches {
                let _ = writeln!(s, "    sync; echo 3 >/proc/sys/vm/drop_caches");
            }
            let (kind, nodes) = policy_words(phase.numa.as_ref());
            let head = format!("{k} {kind} {}", sh_quote(&nodes));
            // Tiering first; the phase runs only if it could be set.
            let then = phase.tiering.map_or(String::new(), |t| {
                let on = |b: bool| u8::from(b);
                format!("set_tiering {k} {} {} && ", on(t.promotion), on(t.demotion))
            });
            if let Some(cmd) = command_line(phase, &vars)? {
                let _ = writeln!(s, "    {then}run_phase {head} sh -c {}", sh_quote(&cmd));
            } else if job_file(spec, phase).is_some() {
                let _ = writeln!(s, "    {then}fio_phase {head} {}", job_file_in_guest(k));
            } else {
                let mut args: Vec<String> = fio_args(spec, phase, &vm, index)
                    .iter()
                    .map(|a| sh_quote(a))
                    .collect();
                if logged.contains(&k) {
                    args.push(sh_quote(&format!("--write_iolog={}", iolog_in_guest(k))));
                }
                let _ = writeln!(s, "    {then}fio_phase {head} {}", args.join(" "));
            }
        }
        let _ = writeln!(s, "    barrier {}", spec.phases.len());
        // The logs reach the share after the last snapshot: their writes
        // are not the phases'.
        for k in &logged {
            let _ = writeln!(s, "    cp {} \"$out/{k}/{IOLOG}\"", iolog_in_guest(*k));
        }
        let _ = writeln!(s, "    ;;");
    }
    s.push_str("*) echo \"cxlfs run: no job for VM $vm\"; exit 1 ;;\nesac\nexit 0\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::spec::load_str;

    #[test]
    fn replayed_runs_log_fio_off_the_share_and_copy_it_after_the_last_barrier() {
        let spec = load_str("t.toml", crate::spec::test_specs::REPLAYED, &[])
            .unwrap()
            .spec;
        let s = script(&spec, &BTreeMap::new()).unwrap();
        let vm0 = &s[s.find("vm0)").unwrap()..s.find("vm1)").unwrap()];
        let lines: Vec<&str> = vm0.lines().map(str::trim).collect();
        let at = |needle: &str| lines.iter().position(|l| l.contains(needle));
        // Phase 0 (fio) logs into the guest's /tmp; phase 1 is a command.
        let fio = at("fio_phase 0").unwrap();
        assert!(
            lines[fio].ends_with("'--write_iolog=/tmp/cxlfs-iolog-0'"),
            "{vm0}"
        );
        assert_eq!(vm0.matches("--write_iolog").count(), 1, "{vm0}");
        // The copy into the share comes after the last barrier only.
        let last = at("barrier 2").unwrap();
        let copy = at("cp /tmp/cxlfs-iolog-0 \"$out/0/iolog\"").unwrap();
        assert!(copy > last, "{vm0}");
        assert!(at("cxlfs-iolog-1").is_none(), "{vm0}");
        // Not at a ratio the runner cannot replay, nor when off.
        for (from, to) in [
            ("dax = true", "dax = true\ncxl_ratio = 50"),
            ("replay_iolog = true", ""),
        ] {
            let text = crate::spec::test_specs::REPLAYED.replacen(from, to, 1);
            let spec = load_str("t.toml", &text, &[]).unwrap().spec;
            let s = script(&spec, &BTreeMap::new()).unwrap();
            assert!(!s.contains("iolog"), "{to}: {s}");
        }
    }

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
        let s = script(&spec, &BTreeMap::new()).unwrap();
        assert!(
            s.contains("vm0)\n    barrier 0\n    fio_phase 0 none '' '--group_reporting'"),
            "{s}"
        );
        assert!(
            s.contains(
                "    barrier 1\n    sync; echo 3 >/proc/sys/vm/drop_caches\n    fio_phase 1"
            ),
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
            .args(["-n", "-c", &script(&spec, &BTreeMap::new()).unwrap()])
            .status()
            .unwrap();
        assert!(st.success());
    }

    #[test]
    fn tiering_is_set_before_its_phase_and_needs_a_cxl_node() {
        let text = r#"
name = "t"
[daemon]
cxl_memory = "64MiB"
[[phases]]
name = "warm"
command = "true"
[[phases]]
name = "tiered"
command = "true"
tiering = { promotion = true, demotion = true }
[[phases]]
name = "demote-only"
command = "true"
tiering = { demotion = true }
"#;
        let spec = load_str("t.toml", text, &[]).unwrap().spec;
        let s = script(&spec, &BTreeMap::new()).unwrap();
        assert!(s.contains("    run_phase 0 none"), "{s}");
        assert!(
            s.contains("    set_tiering 1 1 1 && run_phase 1 none"),
            "{s}"
        );
        assert!(
            s.contains("    set_tiering 2 0 1 && run_phase 2 none"),
            "{s}"
        );
        let st = std::process::Command::new("sh")
            .args(["-n", "-c", &s])
            .status()
            .unwrap();
        assert!(st.success());
        let no_node = text.replace("cxl_memory = \"64MiB\"", "");
        let e = load_str("t.toml", &no_node, &[]).unwrap_err().to_string();
        assert!(e.contains("tiering"), "{e}");
    }

    #[test]
    fn vmstat_json_reports_the_counters_growth() {
        let f = &PRELUDE[PRELUDE.find("vmstat_json() {").unwrap()..];
        let f = &f[..f.find("\n}\n").unwrap() + 3];
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "numa_hint_faults 10\npgpromote_success 5\n").unwrap();
        std::fs::write(&b, "numa_hint_faults 25\npgpromote_success 5\n").unwrap();
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("{f}vmstat_json \"$1\" \"$2\""), "sh"])
            .arg(&a)
            .arg(&b)
            .output()
            .unwrap();
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            got,
            serde_json::json!({"numa_hint_faults": 15, "pgpromote_success": 0})
        );
    }

    #[test]
    fn the_file_page_cache_is_cached_less_shmem() {
        let f = &PRELUDE[PRELUDE.find("file_cache_kib() {").unwrap()..];
        let f = &f[..f.find("\n}\n").unwrap() + 3];
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("{f}file_cache_kib")])
            .output()
            .unwrap();
        let got: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let field = |k: &str| -> i64 {
            let l = meminfo.lines().find(|l| l.starts_with(k)).unwrap();
            l.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        let want = field("Cached:") - field("Shmem:");
        // The host's page cache moves while the test runs.
        assert!(
            (got - want).abs() < 64 * 1024,
            "{got} KiB against {want} KiB"
        );
        assert!(
            PRELUDE.contains("meminfo.json"),
            "each phase writes meminfo.json"
        );
    }

    #[test]
    fn command_phases_run_under_their_policy_with_templates_rendered() {
        let text = r#"
name = "t"
[daemon]
cxl_memory = "64MiB"
[vars]
n = 3
[[phases]]
name = "a"
command = "probe --n {n} --vm {vm} && awk '{ print $1 }'"
numa = { membind = ["cxl", 0] }
[[phases]]
name = "b"
command = "true"
numa = { ratio = "3:1" }
"#;
        let spec = load_str("t.toml", text, &[]).unwrap().spec;
        let base: BTreeMap<String, TemplateValue> =
            [("n".to_string(), TemplateValue::Number(3.0))].into();
        let s = script(&spec, &base).unwrap();
        let want_a = format!(
            "run_phase 0 membind 'cxl 0' sh -c {}",
            sh_quote("probe --n 3 --vm vm0 && awk '{ print $1 }'")
        );
        assert!(s.contains(&want_a), "{s}");
        assert!(
            s.contains("run_phase 1 weighted 'cxl:1 dram:3' sh -c 'true'"),
            "{s}"
        );
        assert!(s.contains("n='3'; export n"), "{s}");
        let st = std::process::Command::new("sh")
            .args(["-n", "-c", &s])
            .status()
            .unwrap();
        assert!(st.success());
    }
}
