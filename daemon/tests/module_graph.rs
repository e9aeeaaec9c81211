//! The daemon's modules depend on each other in one direction only: this
//! test reads every source file under `daemon/src`, collects the
//! `crate::<module>` references of each top-level module — in code, unit
//! tests and doc links alike (a doc link or a test that reaches up a layer
//! is a dependency a reader sees) — and fails on any cycle,
//! printing it. It also pins the few rules DESIGN.md states: `metrics`,
//! `ids` and `abi` are leaves, `device` and `server` know no layer above
//! them, and only `daemon` (with `main.rs`) may know every module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read daemon/src") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`None`: lib.rs / main.rs).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "lib" && name != "main").then_some(name)
}

/// `crate::x` references anywhere in `text` (code, tests, comments;
/// `use crate::{a, b::c}` groups expanded).
fn references(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if after.starts_with('{') {
            // use crate::{a::b, c, d::{e, f}};
            let mut depth = 0;
            let mut item = String::new();
            for ch in after.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        if depth == 1 {
                            continue;
                        }
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                if depth == 1 && ch == ',' {
                    push_head(&item, &mut out);
                    item.clear();
                } else {
                    item.push(ch);
                }
            }
            push_head(&item, &mut out);
        } else {
            push_head(after, &mut out);
        }
        rest = after;
    }
    out
}

fn push_head(path: &str, out: &mut BTreeSet<String>) {
    let head: String = path
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if !head.is_empty() && head != "self" {
        out.insert(head);
    }
}

fn graph() -> Graph {
    graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The module graph of the crate whose sources are under `src`.
fn graph_of(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g = Graph::new();
    for f in files {
        let Some(m) = module_of(src, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).expect("read a source file");
        let deps = g.entry(m.clone()).or_default();
        for r in references(&text) {
            if r != m {
                deps.insert(r);
            }
        }
    }
    g
}

/// A cycle through `start`, if any (depth-first).
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        n: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut c = stack[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, d, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(g, n, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_daemon_modules_have_no_import_cycle() {
    let g = graph();
    assert!(g.len() >= 10, "found too few modules: {g:?}");
    if let Some(c) = find_cycle(&g) {
        panic!("import cycle among the daemon's modules: {}", c.join(" → "));
    }
}

/// The same rule for every other crate of the workspace (the device
/// model's cache, policies, config and presets once imported each other).
#[test]
fn no_crate_of_the_workspace_has_an_import_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for krate in [
        "device-model",
        "experiments",
        "api",
        "kvm-ept",
        "fuse-abi",
        "hint",
        "tests",
    ] {
        let g = graph_of(&root.join(krate).join("src"));
        if krate == "device-model" {
            assert!(g.len() >= 8, "found too few modules: {g:?}");
        }
        if let Some(c) = find_cycle(&g) {
            panic!("import cycle among {krate}'s modules: {}", c.join(" → "));
        }
    }
}

#[test]
fn layers_point_down() {
    let g = graph();
    let deps = |m: &str| g.get(m).cloned().unwrap_or_default();
    for leaf in ["metrics", "ids", "abi"] {
        assert!(
            deps(leaf).is_empty(),
            "{leaf} must be a leaf, uses {:?}",
            deps(leaf)
        );
    }
    let allowed = |m: &str, ok: &[&str]| {
        let extra: Vec<String> = deps(m)
            .into_iter()
            .filter(|d| !ok.contains(&d.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "{m} may use only {ok:?}, also uses {extra:?}"
        );
    };
    allowed("device", &["ids", "metrics"]);
    allowed("server", &["abi", "ids", "metrics"]);
    allowed("passthrough", &["abi", "ids", "server"]);
    allowed("timing", &["abi", "device", "ids", "metrics", "server"]);
    for m in g.keys() {
        if m != "daemon" {
            assert!(
                !deps(m).contains("daemon"),
                "only main.rs may use the daemon module; {m} does"
            );
        }
    }
}

#[test]
fn the_detector_finds_a_cycle_and_reads_use_groups() {
    let refs = references(
        "use crate::{a::X, b, c::{d, e}};\nfn f() { crate::g::h(); }\n/// [`crate::z`]\n",
    );
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        ["a", "b", "c", "g", "z"]
    );
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    if let Some(d) = g.get_mut("c") {
        d.clear();
    }
    assert_eq!(find_cycle(&g), None);
}
