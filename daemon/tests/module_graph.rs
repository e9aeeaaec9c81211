//! The daemon's modules depend on each other in one direction only, at
//! every level of nesting: this test reads every source file under
//! `daemon/src`, collects the module paths each module names — `use`
//! declarations, `crate::` / `super::` / `self::` paths in code, unit tests
//! and doc links alike (a doc link or a test that reaches up a layer is a
//! dependency a reader sees) — and fails on any cycle, printing it.
//!
//! A path is resolved from the (file or inline) module it is written in, to
//! the deepest module it names; a name a module re-exports (`pub use`)
//! counts as the module that defines it. A dependency of `a::x::…` on
//! `a::y::…` is an edge `a::x → a::y` between the two siblings under their
//! closest common module, so the top-level modules form one graph and the
//! children of every module another; a module and its own descendants (a
//! `mod.rs` composing and re-exporting its submodules, which use its items)
//! are no edge. It also pins the few rules DESIGN.md states: `sync`, `ids`
//! and `abi` are leaves and `metrics` uses only `sync`, `device` and
//! `server` know no layer above them, and only `daemon` (with `main.rs`)
//! may know every module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module (`a::b`) → the sibling modules it uses.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// A module's path from the crate root (`[]`: the root).
type ModPath = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read a source directory") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module a file under `src` is (`[]`: lib.rs / main.rs); `None` for
/// the crate roots of `src/bin/` (separate crates).
fn file_module(src: &Path, file: &Path) -> Option<ModPath> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.len() > 1 && parts[0] == "bin" {
        return None;
    }
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
    let root = parts.is_empty() && (stem == "lib" || stem == "main");
    if !root && stem != "mod" {
        parts.push(stem);
    }
    Some(parts)
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Skips whitespace and comments.
fn skip_ws(c: &[char], i: &mut usize) {
    loop {
        match (c.get(*i), c.get(*i + 1)) {
            (Some(ch), _) if ch.is_whitespace() => *i += 1,
            (Some('/'), Some('/')) => {
                while c.get(*i).is_some_and(|&ch| ch != '\n') {
                    *i += 1;
                }
            }
            (Some('/'), Some('*')) => {
                *i += 2;
                while *i < c.len() && !(c[*i] == '*' && c.get(*i + 1) == Some(&'/')) {
                    *i += 1;
                }
                *i += 2;
            }
            _ => return,
        }
    }
}

fn word(c: &[char], i: &mut usize) -> String {
    let start = *i;
    if c.get(*i) == Some(&'*') {
        *i += 1;
    } else {
        while c.get(*i).copied().is_some_and(is_ident) {
            *i += 1;
        }
    }
    c[start..*i].iter().collect()
}

/// The paths of a `use` tree (or of a single path) starting at `c[*i]`:
/// `a::{b, c::{d, e as f}}` → `a::b`, `a::c::d`, `a::c::e`.
fn use_tree(c: &[char], i: &mut usize) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    loop {
        skip_ws(c, i);
        if c.get(*i) == Some(&'{') {
            *i += 1;
            let mut out = Vec::new();
            loop {
                skip_ws(c, i);
                match c.get(*i) {
                    None => break,
                    Some('}') => {
                        *i += 1;
                        break;
                    }
                    Some(',') => {
                        *i += 1;
                        continue;
                    }
                    _ => {}
                }
                let before = *i;
                for sub in use_tree(c, i) {
                    out.push(prefix.iter().cloned().chain(sub).collect());
                }
                skip_ws(c, i);
                let mut j = *i;
                if word(c, &mut j) == "as" {
                    skip_ws(c, &mut j);
                    word(c, &mut j);
                    *i = j;
                }
                if *i == before {
                    *i += 1; // not a path (a comment in a group): step over
                }
            }
            return out;
        }
        let seg = word(c, i);
        if seg.is_empty() {
            break;
        }
        prefix.push(seg);
        if c.get(*i) == Some(&':') && c.get(*i + 1) == Some(&':') {
            *i += 2;
        } else {
            break;
        }
    }
    if prefix.is_empty() {
        Vec::new()
    } else {
        vec![prefix]
    }
}

/// A path named in a module.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Named {
    /// The (file or inline) module it is written in.
    at: ModPath,
    /// Its segments as written (`super::x::Y`, `crate::a`, `child::Z`).
    path: Vec<String>,
    /// Named by a `use` declaration (may start with a child module).
    by_use: bool,
    /// Named by a `pub use` (a re-export).
    reexport: bool,
}

/// Whether a path starts at `c[i]` with `head` (not in the middle of one).
fn path_starts(c: &[char], i: usize, head: &str) -> bool {
    let n = head.chars().count();
    i + n <= c.len()
        && c[i..i + n].iter().copied().eq(head.chars())
        && (i == 0 || !(is_ident(c[i - 1]) || c[i - 1] == ':'))
}

/// Where the scanner of [`named_paths`] is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lex {
    Code,
    LineComment,
    /// Nesting depth.
    BlockComment(usize),
    /// A string literal: raw, and with how many `#`.
    Str(bool, usize),
}

/// Every path `text` (the source of module `file`) names, with the inline
/// module (`mod tests { … }`) it is written in: `crate::` / `super::` /
/// `self::` paths in code and comments (not in string literals) and
/// `use` declarations.
fn named_paths(file: &ModPath, text: &str) -> Vec<Named> {
    let mut s = Scan::new(file, text);
    while s.i < s.c.len() {
        s.read_path_here();
        if s.skip_comment_or_string() {
            continue;
        }
        s.code_char();
    }
    s.out
}

/// [`named_paths`]' scan of one file.
struct Scan<'a> {
    file: &'a ModPath,
    c: Vec<char>,
    out: Vec<Named>,
    /// Inline modules open here: (name, brace depth inside them).
    inline: Vec<(String, usize)>,
    depth: usize,
    /// The code since the last `;`, `{` or `}`: `mod x {`, `pub use`.
    code: String,
    lex: Lex,
    /// The end of the last `use` declaration read (its paths are read).
    used_to: usize,
    i: usize,
}

impl<'a> Scan<'a> {
    fn new(file: &'a ModPath, text: &str) -> Self {
        Scan {
            file,
            c: text.chars().collect(),
            out: Vec::new(),
            inline: Vec::new(),
            depth: 0,
            code: String::new(),
            lex: Lex::Code,
            used_to: 0,
            i: 0,
        }
    }

    /// The module the scan is in: the file's, then the open inline ones.
    fn at(&self) -> ModPath {
        let mut m = self.file.clone();
        m.extend(self.inline.iter().map(|(n, _)| n.clone()));
        m
    }

    /// Outside string literals and `use` declarations already read, the
    /// `crate::` / `super::` / `self::` path that starts here.
    fn read_path_here(&mut self) {
        let i = self.i;
        if !matches!(self.lex, Lex::Str(..))
            && i >= self.used_to
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|h| path_starts(&self.c, i, h))
        {
            let mut j = i;
            for path in use_tree(&self.c, &mut j) {
                self.out.push(Named {
                    at: self.at(),
                    path,
                    by_use: false,
                    reexport: false,
                });
            }
        }
    }

    /// In a comment or a string literal, steps over the character here (or
    /// the two that end or open one) and says so; in code, does nothing.
    fn skip_comment_or_string(&mut self) -> bool {
        let (c, i) = (&self.c, self.i);
        let ch = c[i];
        match self.lex {
            Lex::LineComment => {
                if ch == '\n' {
                    self.lex = Lex::Code;
                }
                self.i += 1;
            }
            Lex::BlockComment(n) => {
                if ch == '*' && c.get(i + 1) == Some(&'/') {
                    self.lex = if n == 1 {
                        Lex::Code
                    } else {
                        Lex::BlockComment(n - 1)
                    };
                    self.i += 2;
                } else if ch == '/' && c.get(i + 1) == Some(&'*') {
                    self.lex = Lex::BlockComment(n + 1);
                    self.i += 2;
                } else {
                    self.i += 1;
                }
            }
            Lex::Str(raw, hashes) => {
                if !raw && ch == '\\' {
                    self.i += 2;
                    return true;
                }
                let closes = (1..=hashes).all(|k| c.get(i + k) == Some(&'#'));
                if ch == '"' && closes {
                    self.lex = Lex::Code;
                    self.i += 1 + hashes;
                } else {
                    self.i += 1;
                }
            }
            Lex::Code => return false,
        }
        true
    }

    /// One character of code: comment and literal starts, braces (and the
    /// inline modules they open and close), `;`, and `use` declarations.
    fn code_char(&mut self) {
        let (c, i) = (&self.c, self.i);
        let ch = c[i];
        match ch {
            '/' if c.get(i + 1) == Some(&'/') => self.lex = Lex::LineComment,
            '/' if c.get(i + 1) == Some(&'*') => {
                self.lex = Lex::BlockComment(1);
                self.i += 1;
            }
            '"' => self.string_start(),
            // A char literal ('x', '{', '\n', '\u{1F}'), not a lifetime.
            '\'' if c.get(i + 1) == Some(&'\\') => {
                self.i += 2;
                while self.i < self.c.len() && self.c[self.i] != '\'' {
                    self.i += 1;
                }
            }
            '\'' if c.get(i + 2) == Some(&'\'') => self.i += 2,
            '{' => self.open_brace(),
            '}' => self.close_brace(),
            ';' => self.code.clear(),
            'u' if path_starts(c, i, "use") && c.get(i + 3).is_some_and(|x| x.is_whitespace()) => {
                self.use_declaration();
                return;
            }
            _ => self.code.push(ch),
        }
        self.i += 1;
    }

    /// The `"` here opens a string literal.
    fn string_start(&mut self) {
        let (c, i) = (&self.c, self.i);
        // r"…", r#"…"#, br"…": a raw string ends at `"` and as many `#`.
        let mut k = i;
        while k > 0 && c[k - 1] == '#' {
            k -= 1;
        }
        let r = k > 0 && c[k - 1] == 'r';
        let lead = |p: usize| p == 0 || !is_ident(c[p - 1]);
        let raw = r && (lead(k - 1) || (k >= 2 && c[k - 2] == 'b' && lead(k - 2)));
        self.lex = Lex::Str(raw, if raw { i - k } else { 0 });
        self.code.clear();
    }

    /// A `{`: one level deeper, and an inline module's body after `mod x`.
    fn open_brace(&mut self) {
        self.depth += 1;
        let t = self.code.trim_end();
        let name: String = t.chars().rev().take_while(|&x| is_ident(x)).collect();
        let name: String = name.chars().rev().collect();
        let before = t[..t.len() - name.len()].trim_end();
        let is_mod = before
            .strip_suffix("mod")
            .is_some_and(|b| !b.ends_with(is_ident));
        if !name.is_empty() && is_mod {
            self.inline.push((name, self.depth));
        }
        self.code.clear();
    }

    /// A `}`: one level up, closing the inline module it ends.
    fn close_brace(&mut self) {
        if self.inline.last().is_some_and(|(_, d)| *d == self.depth) {
            self.inline.pop();
        }
        self.depth = self.depth.saturating_sub(1);
        self.code.clear();
    }

    /// The `use` here: its paths (re-exported after `pub`), and the scan
    /// goes on after the keyword.
    fn use_declaration(&mut self) {
        let last = self.code.split_whitespace().last().unwrap_or("");
        let reexport = last == "pub" || last.starts_with("pub(");
        let mut j = self.i + 3;
        for path in use_tree(&self.c, &mut j) {
            self.out.push(Named {
                at: self.at(),
                path,
                by_use: true,
                reexport,
            });
        }
        self.used_to = j;
        self.code.push_str("use");
        self.i += 3;
    }
}

/// The absolute segments of a path named in module `at` (`None`: an extern
/// crate's path, or a path above the root).
fn absolute(n: &Named, modules: &BTreeSet<ModPath>) -> Option<Vec<String>> {
    let (first, rest) = n.path.split_first()?;
    let mut abs = match first.as_str() {
        "crate" => Vec::new(),
        "self" => n.at.clone(),
        "super" => {
            let mut m = n.at.clone();
            m.pop()?;
            m
        }
        // `use child::…` names a submodule of the module it is in.
        _ if n.by_use => {
            let mut m = n.at.clone();
            m.push(first.clone());
            if !modules.contains(&m) {
                return None;
            }
            m
        }
        _ => return None,
    };
    for s in rest {
        match s.as_str() {
            "super" => {
                abs.pop()?;
            }
            "self" => {}
            _ => abs.push(s.clone()),
        }
    }
    Some(abs)
}

/// Names re-exported by a module (`pub use x::Y` in `m`: `(m, "Y")`) →
/// the module that defines them.
type Reexports = BTreeMap<(ModPath, String), ModPath>;

/// The module an absolute path names: its longest prefix that is a
/// module, or the module the next name is re-exported from.
fn target(abs: &[String], modules: &BTreeSet<ModPath>, reexports: &Reexports) -> ModPath {
    let mut n = abs.len();
    while n > 0 && !modules.contains(&abs[..n].to_vec()) {
        n -= 1;
    }
    let m = abs[..n].to_vec();
    match abs.get(n) {
        Some(next) => reexports
            .get(&(m.clone(), next.clone()))
            .cloned()
            .unwrap_or(m),
        None => m,
    }
}

/// The module graph of the crate whose files are `files` (module, text):
/// every module is a node, and each of its edges goes to a sibling.
fn graph_from(files: &[(ModPath, String)]) -> Graph {
    let named: Vec<Named> = files
        .iter()
        .flat_map(|(m, text)| named_paths(m, text))
        .collect();
    let mut modules = BTreeSet::new();
    for m in files
        .iter()
        .map(|(m, _)| m)
        .chain(named.iter().map(|n| &n.at))
    {
        for k in 0..=m.len() {
            modules.insert(m[..k].to_vec());
        }
    }
    // Re-exports, resolved through re-exports of re-exports.
    let exported: Vec<((ModPath, String), Vec<String>)> = named
        .iter()
        .filter(|n| n.reexport)
        .filter_map(|n| {
            let abs = absolute(n, &modules)?;
            let name = abs.last()?.clone();
            let item = name != "*" && !modules.contains(&abs);
            item.then(|| ((n.at.clone(), name), abs))
        })
        .collect();
    let mut reexports = Reexports::new();
    for _ in 0..4 {
        let next: Reexports = exported
            .iter()
            .map(|(k, abs)| (k.clone(), target(abs, &modules, &reexports)))
            .collect();
        reexports = next;
    }
    let mut g = Graph::new();
    for m in modules.iter().filter(|m| !m.is_empty()) {
        g.entry(m.join("::")).or_default();
    }
    for n in &named {
        let Some(abs) = absolute(n, &modules) else {
            continue;
        };
        let to = target(&abs, &modules, &reexports);
        let from = &n.at;
        let k = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        // A module and its own ancestors or descendants: no edge.
        if k == from.len() || k == to.len() {
            continue;
        }
        g.entry(from[..=k].join("::"))
            .or_default()
            .insert(to[..=k].join("::"));
    }
    g
}

fn graph() -> Graph {
    graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The module graph of the crate whose sources are under `src`.
fn graph_of(src: &Path) -> Graph {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    let files: Vec<(ModPath, String)> = paths
        .iter()
        .filter_map(|f| {
            let m = file_module(src, f)?;
            Some((m, std::fs::read_to_string(f).expect("read a source file")))
        })
        .collect();
    graph_from(&files)
}

/// A cycle, if any (depth-first).
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
    assert!(g.len() >= 40, "found too few modules: {g:?}");
    for nested in ["device::pool", "device::placement", "dax::session"] {
        assert!(g.contains_key(nested), "no module {nested}: {g:?}");
    }
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
    for leaf in ["sync", "ids", "abi"] {
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
    allowed("metrics", &["sync"]);
    allowed("device", &["ids", "metrics", "sync"]);
    allowed("server", &["abi", "ids", "metrics", "sync"]);
    allowed("passthrough", &["abi", "ids", "server", "sync"]);
    allowed(
        "timing",
        &["abi", "device", "ids", "metrics", "server", "sync"],
    );
    for m in g.keys() {
        if m != "daemon" {
            assert!(
                !deps(m).contains("daemon"),
                "only main.rs may use the daemon module; {m} does"
            );
        }
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn use_trees_expand_to_full_paths() {
    let c: Vec<char> = "a::{b, c::{d, e as f}, self,\n // note\n g::*};"
        .chars()
        .collect();
    let mut i = 0;
    assert_eq!(
        use_tree(&c, &mut i),
        [
            strings(&["a", "b"]),
            strings(&["a", "c", "d"]),
            strings(&["a", "c", "e"]),
            strings(&["a", "self"]),
            strings(&["a", "g", "*"]),
        ]
    );
}

#[test]
fn paths_are_read_in_the_inline_module_they_are_written_in() {
    let text = "use super::x::{self, Y};\n\
                pub use child::Z;\n\
                fn f() { let _ = ('{', \"crate::in_a_string\", '\\'', r#\"}\"#); }\n\
                #[cfg(test)]\n\
                mod tests {\n\
                    use super::*;\n\
                    /// [`crate::doc::Link`]\n\
                    fn g<'a>(_: &'a ()) { super::super::sib::h(); }\n\
                }\n\
                fn k() { self::child::m(); }\n";
    let file = strings(&["p", "q"]);
    let got: Vec<(String, String, bool, bool)> = named_paths(&file, text)
        .into_iter()
        .map(|n| (n.at.join("::"), n.path.join("::"), n.by_use, n.reexport))
        .collect();
    let want = [
        ("p::q", "super::x::self", true, false),
        ("p::q", "super::x::Y", true, false),
        ("p::q", "child::Z", true, true),
        ("p::q::tests", "super::*", true, false),
        ("p::q::tests", "crate::doc::Link", false, false),
        ("p::q::tests", "super::super::sib::h", false, false),
        ("p::q", "self::child::m", false, false),
    ];
    let want: Vec<(String, String, bool, bool)> = want
        .iter()
        .map(|&(a, p, u, r)| (a.into(), p.into(), u, r))
        .collect();
    assert_eq!(got, want);
}

/// A crate whose `a::x` and `a::y` use each other, `y` through a name
/// `a` re-exports from `x`, in a doc link.
fn crate_with_a_sibling_cycle(link: &str) -> Vec<(ModPath, String)> {
    vec![
        (vec![], "pub mod a;\npub mod b;\n".into()),
        (strings(&["a"]), "mod x;\nmod y;\npub use x::X;\n".into()),
        (
            strings(&["a", "x"]),
            "use super::y::Y;\nuse super::helper;\n".into(),
        ),
        (strings(&["a", "y"]), format!("/// {link}\npub struct Y;\n")),
        (
            strings(&["b"]),
            "use crate::a::X;\nfn f() { super::a::y::g() }\n".into(),
        ),
    ]
}

#[test]
fn the_detector_finds_a_cycle_among_nested_siblings() {
    let g = graph_from(&crate_with_a_sibling_cycle("[`crate::a::X`]"));
    let edges: Vec<(&str, Vec<&str>)> = g
        .iter()
        .map(|(m, d)| (m.as_str(), d.iter().map(String::as_str).collect()))
        .collect();
    assert_eq!(
        edges,
        [
            ("a", vec![]),
            ("a::x", vec!["a::y"]),
            ("a::y", vec!["a::x"]),
            ("b", vec!["a"]),
        ]
    );
    assert_eq!(find_cycle(&g), Some(strings(&["a::x", "a::y", "a::x"])));
    let g = graph_from(&crate_with_a_sibling_cycle("the X of x"));
    assert_eq!(find_cycle(&g), None, "{g:?}");
}

#[test]
fn the_detector_finds_a_cycle() {
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(find_cycle(&g), Some(strings(&["a", "b", "c", "a"])));
    if let Some(d) = g.get_mut("c") {
        d.clear();
    }
    assert_eq!(find_cycle(&g), None);
}

/// Prints the daemon's module graph (`cargo test --test module_graph --
/// --ignored --nocapture`).
#[test]
#[ignore]
fn print_the_graph() {
    for (m, d) in graph() {
        println!("{m} → {d:?}");
    }
    let mut g = graph();
    while let Some(c) = find_cycle(&g) {
        println!("CYCLE {}", c.join(" → "));
        let (a, b) = (&c[c.len() - 2], &c[c.len() - 1]);
        g.get_mut(a).unwrap().remove(b);
    }
}
