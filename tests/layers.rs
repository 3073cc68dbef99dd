//! The layout's rules, checked on the source itself: each top-level module
//! of `src/` is a layer that imports only layers below it (the order in
//! `src/lib.rs`'s doc comment), so there is no import cycle; no file in
//! `src/` reaches 700 lines, no binary 250.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layer of each top-level module, lowest first. `tools` and `serve` share
/// a rank and must not import each other.
const LAYERS: &[(&str, usize)] = &[
    ("sys", 0),
    ("kernels", 1),
    ("model", 2),
    ("method", 3),
    ("engine", 4),
    ("store", 5),
    ("tools", 6),
    ("serve", 6),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level module a library file belongs to (`None`: lib.rs, bins).
fn layer_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "bin" | "lib.rs" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// Top-level modules named by `crate::x` / `$crate::x` / `selectinfer::x`
/// (the crate's name for itself in its tests, `extern crate self`) in the
/// code (not in comments) of `text`.
fn imports(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        for prefix in ["crate::", "selectinfer::"] {
            let mut rest = code;
            while let Some(i) = rest.find(prefix) {
                let before = rest[..i].chars().last();
                let tail = &rest[i + prefix.len()..];
                let name: String = tail
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let joined = before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
                if !joined && !name.is_empty() {
                    found.insert(name);
                }
                rest = tail;
            }
        }
    }
    found
}

/// Module → the modules it imports, over every library file.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let Some(layer) = layer_of(&f) else { continue };
        let text = std::fs::read_to_string(&f).unwrap();
        let deps = g.entry(layer.clone()).or_default();
        deps.extend(imports(&text).into_iter().filter(|d| *d != layer));
    }
    g
}

#[test]
fn layers_import_only_layers_below_them() {
    let rank: BTreeMap<&str, usize> = LAYERS.iter().copied().collect();
    let g = graph();
    let modules: BTreeSet<&str> = g.keys().map(String::as_str).collect();
    let known: BTreeSet<&str> = rank.keys().copied().collect();
    assert_eq!(modules, known, "top-level modules vs the layer table");
    let mut upward = Vec::new();
    for (from, deps) in &g {
        for to in deps {
            let (a, b) = (rank[from.as_str()], rank.get(to.as_str()).copied());
            if b.is_none_or(|b| b >= a) {
                upward.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that do not point down: {upward:?}"
    );
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let g = graph();
    // Depth-first search; a node met again on the current path closes a cycle.
    fn visit<'a>(
        n: &'a str,
        g: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| *p == n) {
            return Some(path[i..].iter().map(|s| s.to_string()).collect());
        }
        if !done.insert(n) {
            return None;
        }
        path.push(n);
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        let cycle = visit(n, &g, &mut Vec::new(), &mut done);
        assert!(cycle.is_none(), "import cycle: {cycle:?}");
    }
}

#[test]
fn imports_name_their_module_on_the_line() {
    // What `imports` cannot read must not be written: grouped `crate::{..}`
    // imports (a group may span lines) and paths out of a parent module.
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut found = Vec::new();
    for f in files.iter().filter(|f| layer_of(f).is_some()) {
        for (i, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            let code = line.trim_start();
            if !code.starts_with("//")
                && (code.contains("crate::{") || code.contains("super::super"))
            {
                found.push(format!("{}:{}", f.display(), i + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "write `use crate::layer::..` one per line: {found:?}"
    );
}

#[test]
fn the_checks_see_imports() {
    // The scanner finds what the layer tests rely on, and skips comments.
    let text = "use crate::model::Mlp;\n// crate::serve in a comment\nlet x = $crate::sys::named::parse(s);\nmycrate::tools::x();\nselectinfer::store::y();\nnotselectinfer::serve::z();";
    let found: Vec<String> = imports(text).into_iter().collect();
    assert_eq!(found, ["model", "store", "sys"]);
}

#[test]
fn files_stay_small() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut long = Vec::new();
    for f in files {
        let lines = std::fs::read_to_string(&f).unwrap().lines().count();
        let bin = f.strip_prefix(src()).unwrap().starts_with("bin");
        let limit = if bin { 250 } else { 700 };
        if lines >= limit {
            long.push(format!("{} ({lines} lines, limit {limit})", f.display()));
        }
    }
    assert!(long.is_empty(), "files too long: {long:?}");
}

/// `pub` items declared in `text`: lines starting `pub fn|struct|enum|
/// const|static|type|trait|mod|use` (or `pub unsafe fn`, `pub async fn`);
/// `pub(crate)` and fields are not counted.
fn pub_items(text: &str) -> usize {
    const KINDS: [&str; 9] = [
        "fn", "struct", "enum", "const", "static", "type", "trait", "mod", "use",
    ];
    text.lines()
        .filter(|line| {
            let Some(rest) = line.trim_start().strip_prefix("pub ") else {
                return false;
            };
            let mut words = rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            match words.next() {
                Some(w) if KINDS.contains(&w) => true,
                Some("unsafe" | "async") => words.next() == Some("fn"),
                _ => false,
            }
        })
        .count()
}

#[test]
fn each_layer_has_a_small_public_surface() {
    // Each top-level layer of the product crate keeps fewer than 60 `pub`
    // items: `pub(crate)` by default, public only what the binaries, the
    // other crates of the workspace and the integration tests use.
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    for f in files {
        let Some(layer) = layer_of(&f) else { continue };
        let text = std::fs::read_to_string(&f).unwrap();
        *counts.entry(layer).or_default() += pub_items(&text);
    }
    assert_eq!(counts.len(), LAYERS.len(), "layers: {counts:?}");
    let big: Vec<_> = counts.iter().filter(|(_, &n)| n >= 60).collect();
    assert!(
        big.is_empty(),
        "layers with 60 or more pub items: {big:?} (all: {counts:?})"
    );
}

#[test]
fn the_count_sees_pub_items() {
    let text = "pub fn a() {}\n    pub(crate) fn b() {}\n  pub struct C;\npub unsafe fn d() {}\npub unsafe extern \"C\" fn e() {}\n    pub field: u32,\npub use x::y;\npub(super) mod m;\npub const fn f() {}";
    assert_eq!(pub_items(text), 5);
}
