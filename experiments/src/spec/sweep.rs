//! Sweep expansion: [`LoadedSpec::expand`] turns a loaded spec into one
//! [`RunPlan`] per sweep point and repeat (the cartesian product of the
//! swept values set into the tree), with `--quick` applied — its `[quick]
//! set` keys before the sweep, its shrinking to each point's spec.
//!
//! A swept key whose values are tables is a list of *cases*: each case has
//! a `name` (the key's value in results) and sets its other keys, dotted
//! paths, together — several settings that only make sense as a set.

use super::check::{device_config, parse_tree};
use super::quick::apply_quick;
use super::tree::{apply_sets, flatten_sets, set_path, split_path, value_text};
use super::types::Spec;
use super::{LoadSpecError, LoadedSpec};
use cxlfs_device_model::DeviceConfig;
use serde::Serialize;

/// One run's configuration: a sweep point (and repeat) with everything resolved.
#[derive(Debug, Clone, Serialize)]
pub struct RunPlan {
    /// 1-based run number over the whole experiment.
    pub run: u32,
    /// 0-based sweep point.
    pub point: u32,
    /// 0-based repeat.
    pub repeat: u32,
    /// The swept keys and this point's values.
    pub params: Vec<(String, toml::Value)>,
    /// The spec at this point (after `--quick`).
    pub spec: Spec,
    /// `cxlfsd --set` arguments (flattened `daemon.device`).
    pub device_sets: Vec<String>,
    /// The effective device config.
    #[serde(skip)]
    pub device: DeviceConfig,
}

impl RunPlan {
    /// `key=value` of each swept key, for logs and file names.
    pub fn label(&self) -> String {
        if self.params.is_empty() {
            return "default".into();
        }
        self.params
            .iter()
            .map(|(k, v)| format!("{k}={}", value_text(v)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl LoadedSpec {
    /// Every run: the cartesian product of the sweep (first key outermost),
    /// each point repeated `repeats` times; with `quick` the sizes and
    /// runtimes shrink but the points stay.
    pub fn expand(&self, quick: bool) -> Result<Vec<RunPlan>, LoadSpecError> {
        if quick && !self.spec.quick.set.is_empty() {
            return self.with_quick_sets()?.expand_points(true);
        }
        self.expand_points(quick)
    }

    /// The spec with `[quick] set` applied to its tree, then the command
    /// line's `--set` again (what the user asks for wins).
    fn with_quick_sets(&self) -> Result<LoadedSpec, LoadSpecError> {
        let mut tree = self.tree.clone();
        for (key, value) in &self.spec.quick.set {
            set_path(&mut tree, &split_path(key), value.clone()).map_err(|message| {
                LoadSpecError::Key {
                    path: self.path.clone(),
                    key: format!("quick.set.{key}"),
                    message,
                }
            })?;
        }
        if let Some(toml::Value::Table(q)) = tree.get_mut("quick") {
            q.remove("set");
        }
        apply_sets(&self.path, &mut tree, &self.sets)?;
        let spec = parse_tree(&self.path, &tree, " (quick.set)")?;
        Ok(LoadedSpec {
            path: self.path.clone(),
            tree,
            spec,
            sets: self.sets.clone(),
        })
    }

    fn expand_points(&self, quick: bool) -> Result<Vec<RunPlan>, LoadSpecError> {
        let dims: Vec<(&String, &Vec<toml::Value>)> = self.spec.sweep.iter().collect();
        let points: usize = dims.iter().map(|(_, v)| v.len()).product();
        let mut plans = Vec::new();
        let mut run = 0;
        for point in 0..points {
            let chosen = point_params(&dims, point);
            let (spec, context) = self.point_spec(&chosen, quick)?;
            let params = shown(&chosen);
            let device =
                device_config(&spec.daemon).map_err(|(key, message)| LoadSpecError::Key {
                    path: self.path.clone(),
                    key: key + &context,
                    message,
                })?;
            let mut device_sets = Vec::new();
            flatten_sets("", &spec.daemon.device, &mut device_sets);
            for repeat in 0..spec.repeats {
                run += 1;
                plans.push(RunPlan {
                    run,
                    point: point as u32,
                    repeat,
                    params: params.clone(),
                    spec: spec.clone(),
                    device_sets: device_sets.clone(),
                    device: device.clone(),
                });
            }
        }
        Ok(plans)
    }

    /// The spec at one sweep point (`params` set into the tree, `--quick`
    /// applied) and the ` (sweep point ...)` that follows its errors' keys.
    fn point_spec(
        &self,
        params: &[(String, toml::Value)],
        quick: bool,
    ) -> Result<(Spec, String), LoadSpecError> {
        let mut tree = self.tree.clone();
        if let toml::Value::Table(t) = &mut tree {
            t.remove("sweep");
        }
        for (k, v) in params {
            for (key, value) in point_sets(k, v) {
                set_path(&mut tree, &split_path(&key), value.clone()).map_err(|message| {
                    LoadSpecError::Key {
                        path: self.path.clone(),
                        key: format!("sweep.{key}"),
                        message,
                    }
                })?;
            }
        }
        let context = format!(
            " (sweep point {})",
            shown(params)
                .iter()
                .map(|(k, v)| format!("{k}={}", value_text(v)))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut spec = parse_tree(&self.path, &tree, &context)?;
        spec.sweep = self.spec.sweep.clone();
        if quick {
            apply_quick(&mut spec).map_err(|(key, message)| LoadSpecError::Key {
                path: self.path.clone(),
                key: key + &context,
                message,
            })?;
        }
        Ok((spec, context))
    }
}

/// The swept keys as results show them: a case by its `name`, any other
/// value as it is.
fn shown(params: &[(String, toml::Value)]) -> Vec<(String, toml::Value)> {
    params
        .iter()
        .map(|(k, v)| {
            let name = v.as_table().and_then(|t| t.get("name"));
            (k.clone(), name.unwrap_or(v).clone())
        })
        .collect()
}

/// What one swept value sets: `key = value`, or each of a case's keys
/// (all but `name`).
fn point_sets<'a>(key: &'a str, v: &'a toml::Value) -> Vec<(String, &'a toml::Value)> {
    match v.as_table() {
        Some(case) => case
            .iter()
            .filter(|(k, _)| k.as_str() != "name")
            .map(|(k, v)| (k.clone(), v))
            .collect(),
        None => vec![(key.to_string(), v)],
    }
}

/// The swept keys and their values at sweep point `point`: its digits in
/// mixed radix (one digit per key, the last key fastest).
fn point_params(dims: &[(&String, &Vec<toml::Value>)], point: usize) -> Vec<(String, toml::Value)> {
    let mut rest = point;
    let mut params = vec![(String::new(), toml::Value::Boolean(false)); dims.len()];
    for (i, (k, values)) in dims.iter().enumerate().rev() {
        params[i] = ((*k).clone(), values[rest % values.len()].clone());
        rest /= values.len();
    }
    params
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use crate::spec::load_str;
    use crate::spec::test_specs::{MEMORY, SPEC};
    use crate::spec::NumaSpec;

    #[test]
    fn sweep_expands_to_the_cartesian_product_with_repeats() {
        let l = load_str("s.toml", SPEC, &[]).unwrap();
        let plans = l.expand(false).unwrap();
        assert_eq!(plans.len(), 2 * 3 * 2);
        let pts: Vec<(i64, i64, u32)> = plans
            .iter()
            .map(|p| {
                (
                    i64::from(p.spec.daemon.cxl_ratio.unwrap()),
                    i64::from(p.spec.vms.count),
                    p.repeat,
                )
            })
            .collect();
        assert_eq!(pts[0], (0, 1, 0));
        assert_eq!(pts[1], (0, 1, 1));
        assert_eq!(pts[2], (0, 2, 0));
        assert_eq!(pts[6], (100, 1, 0));
        assert_eq!(pts[11], (100, 3, 1));
        assert_eq!(
            plans.iter().map(|p| p.run).collect::<Vec<_>>(),
            (1..=12).collect::<Vec<_>>()
        );
        assert_eq!(plans[2].point, 1);
        assert_eq!(plans[6].label(), "daemon.cxl_ratio=100 vms.count=1");
        // A bad value surfaces with its point.
        let bad = load_str("s.toml", SPEC, &["sweep.vms.count=[1, 0]".into()]).unwrap();
        let e = bad.expand(false).unwrap_err().to_string();
        assert!(e.contains("vms.count") && e.contains("sweep point"), "{e}");
        let bad = load_str("s.toml", SPEC, &["sweep.daemon.cxl_rattio=[1]".into()]).unwrap();
        let e = bad.expand(false).unwrap_err().to_string();
        assert!(e.contains("cxl_rattio"), "{e}");
        // A sweep over a phase's fio option.
        let l = load_str(
            "s.toml",
            SPEC,
            &["sweep.phases.0.fio.bs=[\"4k\", \"1m\"]".into()],
        )
        .unwrap();
        let plans = l.expand(false).unwrap();
        assert_eq!(plans.len(), 2 * 2 * 3 * 2);
        assert_eq!(plans[0].spec.phases[0].fio["bs"].as_str(), Some("4k"));
        // No sweep: one point.
        let l = load_str("s.toml", SPEC, &["repeats=1".into()]).unwrap();
        let mut l2 = l.clone();
        l2.spec.sweep.clear();
        if let toml::Value::Table(t) = &mut l2.tree {
            t.remove("sweep");
        }
        let plans = l2.expand(false).unwrap();
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].label(), "default");
    }

    #[test]
    fn a_list_of_cases_sets_each_case_s_keys_together() {
        let cases = r#"
[sweep]
config = [
  { name = "cxl", "phases.0.numa" = { membind = "cxl" }, "vars.x" = 0.5 },
  { name = "split", "phases.0.numa" = { ratio = "1:1" }, "vars.x" = 2.0 },
]
"#;
        let spec = MEMORY.replace("[sweep]\n\"vars.x\" = [0.5, 2.0]\n", "") + cases;
        let plans = load_str("m.toml", &spec, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[0].label(), "config=cxl");
        assert_eq!(plans[1].params[0].1.as_str(), Some("split"));
        assert_eq!(plans[0].spec.vars["x"].as_float(), Some(0.5));
        assert_eq!(plans[1].spec.vars["x"].as_float(), Some(2.0));
        assert!(matches!(
            plans[0].spec.phases[0].numa,
            Some(NumaSpec::Membind(_))
        ));
        assert_eq!(
            plans[1].spec.phases[0].numa,
            Some(NumaSpec::Ratio("1:1".into()))
        );
        // Cases are all tables, named once, each setting a real key.
        for (bad, says) in [
            (
                "config = [{ name = \"a\", \"vars.x\" = 1.0 }, 3]",
                "cases (tables) or none",
            ),
            ("config = [{ \"vars.x\" = 1.0 }]", "needs a `name`"),
            (
                "config = [{ name = \"a\", \"vars.x\" = 1.0 }, { name = \"a\", \"vars.x\" = 2.0 }]",
                "named twice",
            ),
            ("config = [{ name = \"a\" }]", "sets no key"),
            (
                "config = [{ name = \"a\", \"image.kernel\" = \"x\" }]",
                "cannot sweep",
            ),
            (
                "config = [{ name = \"a\", \"daemon.cxl_rattio\" = 1 }]",
                "cxl_rattio",
            ),
        ] {
            let spec =
                MEMORY.replace("[sweep]\n\"vars.x\" = [0.5, 2.0]\n", "") + "[sweep]\n" + bad + "\n";
            let e = load_str("m.toml", &spec, &[])
                .and_then(|l| l.expand(false))
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn quick_sets_apply_before_the_sweep_and_the_command_line_wins() {
        let quick = load_str("m.toml", MEMORY, &[])
            .unwrap()
            .expand(true)
            .unwrap();
        assert_eq!(quick.len(), 1);
        assert_eq!(quick[0].device.cache.size_bytes, 8 << 20);
        let mine = load_str(
            "m.toml",
            MEMORY,
            &["daemon.device.cache.size_bytes=16MiB".into()],
        )
        .unwrap()
        .expand(true)
        .unwrap();
        assert_eq!(mine[0].device.cache.size_bytes, 16 << 20);
    }
}
