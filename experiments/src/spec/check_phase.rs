//! One phase's own rules: fio or a command (a job file runs alone), one
//! valid memory policy, outputs read exactly one way, a replay check that
//! names a histogram output. Errors name the key relative to the phase.

use super::phase::{NodeName, NumaSpec, OutputSpec, PhaseSpec, ReplayCheckSpec};
use super::types::Spec;

/// A failing key (relative to the phase) and what is wrong with it.
type KeyError = (String, String);

/// A phase's own rules: fio or a command, one policy, readable outputs.
pub(super) fn check_phase(spec: &Spec, p: &PhaseSpec) -> Result<(), KeyError> {
    check_fio_or_command(spec, p)?;
    if let Some(n) = &p.numa {
        check_numa(spec, n)?;
    }
    if p.tiering.is_some() && spec.daemon.cxl_memory.is_none() {
        return Err((
            "tiering".into(),
            "memory tiering needs a CXL node: set daemon.cxl_memory".into(),
        ));
    }
    for (name, o) in &p.outputs {
        check_output(name, o)?;
    }
    if let Some(rc) = &p.replay_check {
        check_replay_check(p, rc)?;
    }
    if let Some(mc) = &p.miss_check {
        if !p.outputs.get(&mc.histogram).is_some_and(|o| o.histogram) {
            return Err((
                "miss_check.histogram".into(),
                format!("`{}` is not a histogram output of this phase", mc.histogram),
            ));
        }
        if mc.miss_above_ns.is_nan() || mc.miss_above_ns <= 0.0 {
            return Err(("miss_check.miss_above_ns".into(), "must be positive".into()));
        }
    }
    Ok(())
}

/// A command phase takes no fio options; a fio phase has no outputs, and a
/// fio job file comes with no other fio option.
fn check_fio_or_command(spec: &Spec, p: &PhaseSpec) -> Result<(), KeyError> {
    let job_file = p.fio.contains_key("job_file") || spec.fio.contains_key("job_file");
    if p.command.is_some() {
        if !p.fio.is_empty() || !p.jobs.is_empty() {
            return Err((
                "command".into(),
                "a command phase takes no fio options or jobs".into(),
            ));
        }
    } else {
        if !p.outputs.is_empty() || p.replay_check.is_some() || p.miss_check.is_some() {
            return Err((
                "outputs".into(),
                "outputs and replay_check read a command's output: set `command`".into(),
            ));
        }
        if job_file {
            let extra: Vec<&String> = spec
                .fio
                .keys()
                .chain(p.fio.keys())
                .filter(|k| *k != "job_file")
                .collect();
            if !extra.is_empty() || !p.jobs.is_empty() {
                return Err((
                    "fio.job_file".into(),
                    format!(
                        "a job file runs verbatim: put {extra:?} in it (fio's ${{VAR}} reads the spec's [vars] from the environment)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The policy resolves, its weights are 1..=255, its nodes exist (`cxl`
/// only with a CXL memory node).
fn check_numa(spec: &Spec, n: &NumaSpec) -> Result<(), KeyError> {
    let n = n.resolved().map_err(|e| ("numa.ratio".to_string(), e))?;
    if let NumaSpec::WeightedInterleave(w) = &n {
        if let Some((k, v)) = w.iter().find(|(_, v)| **v == 0 || **v > 255) {
            return Err((
                "numa.weighted_interleave".into(),
                format!("{k} = {v}: weights are 1..=255 (leave a node out for 0)"),
            ));
        }
    }
    let names = n.nodes();
    for name in &names {
        match name {
            NodeName::Name(s) if s == "cxl" && spec.daemon.cxl_memory.is_none() => {
                return Err((
                    "numa".into(),
                    "`cxl` needs a CXL memory node: set daemon.cxl_memory".into(),
                ))
            }
            NodeName::Name(s) if s != "cxl" && s != "dram" => {
                return Err((
                    "numa".into(),
                    format!("node `{s}`: a number, `cxl` or `dram`"),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// One output: a plain name, exactly one way to read it, a histogram from
/// JSON, a regex with a capture group, a file in the share, an aggregate.
fn check_output(name: &str, o: &OutputSpec) -> Result<(), KeyError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
    {
        return Err((
            format!("outputs.{name}"),
            "output names are letters, digits, `_`, `-`".into(),
        ));
    }
    let ways = [o.json.is_some(), o.regex.is_some(), o.csv.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if ways != 1 {
        return Err((
            format!("outputs.{name}"),
            "give exactly one of json, regex, csv".into(),
        ));
    }
    if o.histogram && o.json.is_none() {
        return Err((
            format!("outputs.{name}.histogram"),
            "a histogram is read from JSON".into(),
        ));
    }
    if let Some(r) = &o.regex {
        let re =
            regex::Regex::new(r).map_err(|e| (format!("outputs.{name}.regex"), e.to_string()))?;
        if re.captures_len() < 2 {
            return Err((
                format!("outputs.{name}.regex"),
                "needs a capture group: the number is group 1".into(),
            ));
        }
    }
    if let Some(f) = &o.file {
        check_share_path(f).map_err(|e| (format!("outputs.{name}.file"), e))?;
    }
    if !matches!(o.aggregate.as_deref(), None | Some("mean" | "sum")) {
        return Err((format!("outputs.{name}.aggregate"), "mean | sum".into()));
    }
    Ok(())
}

/// The replay check reads a sequence file in the share and a histogram
/// output of the same phase, with a positive hit threshold.
fn check_replay_check(p: &PhaseSpec, rc: &ReplayCheckSpec) -> Result<(), KeyError> {
    check_share_path(&rc.sequence).map_err(|e| ("replay_check.sequence".to_string(), e))?;
    if !p.outputs.get(&rc.histogram).is_some_and(|o| o.histogram) {
        return Err((
            "replay_check.histogram".into(),
            format!("`{}` is not a histogram output of this phase", rc.histogram),
        ));
    }
    if rc.hit_below_ns.is_nan() || rc.hit_below_ns <= 0.0 {
        return Err((
            "replay_check.hit_below_ns".into(),
            "must be positive".into(),
        ));
    }
    Ok(())
}

/// A path relative to the share that stays inside it and off `.cxlfs`.
pub(super) fn check_share_path(p: &str) -> Result<(), String> {
    let bad = p.is_empty()
        || p.starts_with('/')
        || p.split('/')
            .any(|c| c.is_empty() || c == "." || c == ".." || c == ".cxlfs");
    if bad {
        Err(format!(
            "`{p}`: a relative path inside the share (no `..`, not `.cxlfs`)"
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use crate::spec::load_str;
    use crate::spec::test_specs::MEMORY;

    #[test]
    fn bad_phases_are_refused_with_their_key() {
        let err = |from: &str, to: &str| {
            let text = MEMORY.replace(from, to);
            load_str("m.toml", &text, &[])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let e = err(
            r#"numa = { ratio = "3:1" }"#,
            r#"numa = { membind = "dram", interleave = "cxl" }"#,
        );
        assert!(e.contains("phases[0].numa"), "{e}");
        let e = err(r#"cxl_memory = "256MiB""#, "");
        assert!(e.contains("set daemon.cxl_memory"), "{e}");
        let e = err(
            r#"numa = { ratio = "3:1" }"#,
            r#"numa = { membind = "hbm" }"#,
        );
        assert!(e.contains("node `hbm`"), "{e}");
        let e = err(
            r#"outputs.bw = { json = "read_mb_s" }"#,
            r#"outputs.bw = { regex = "bw [0-9]+" }"#,
        );
        assert!(e.contains("capture group"), "{e}");
        let e = err(
            r#"outputs.bw = { json = "read_mb_s" }"#,
            r#"outputs.bw = { json = "a", regex = "(1)" }"#,
        );
        assert!(e.contains("exactly one of json, regex, csv"), "{e}");
        let e = err(r#"histogram = "lat""#, r#"histogram = "bw""#);
        assert!(e.contains("not a histogram output"), "{e}");
        let e = err(
            r#"command = "probe --size {int:x*cache_bytes}""#,
            "fio.rw = \"read\"",
        );
        assert!(e.contains("set `command`"), "{e}");
        let e = err(r#"cxl_memory = "256MiB""#, r#"cxl_memory = "3MiB""#);
        assert!(e.contains("at least 16 MiB"), "{e}");
    }
}
