//! The layout the architecture page (docs/architecture.md, "Layers") describes
//! holds in the code:
//!
//! - every workspace crate lives in one of the layer folders, bottom to top
//!   `crates/`, `kernels/`, `adapters/`, `python/`, `tests/`, and no crate
//!   depends (normal, dev or build dependency, as `cargo metadata` reports
//!   them) on a crate of a higher folder;
//! - inside each crate, no two modules import each other, directly or around
//!   a longer circle (`use crate::a` in `b` and `use crate::b` in `a`, or
//!   `super::` from a top-level module).
//!
//! - every crate is named `dlbridge-<its folder's name>` (`kernels/cpu` is
//!   `dlbridge-cpu`), but the facade, which is `dlbridge` in `adapters/dlbridge`.
//!
//! An exception is allowed only when the page's "Exceptions" table names it
//! with its reason; a named exception that no longer exists fails too, so the
//! table stays true.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The layer folders, bottom to top.
const LAYERS: [&str; 5] = ["crates", "kernels", "adapters", "python", "tests"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The workspace's packages: (name, directory relative to the root, workspace dependencies by name).
fn packages(root: &Path) -> Vec<(String, String, Vec<String>)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root)
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pkgs = meta["packages"].as_array().unwrap();
    let names: BTreeSet<&str> = pkgs.iter().map(|p| p["name"].as_str().unwrap()).collect();
    pkgs.iter()
        .map(|p| {
            let dir = Path::new(p["manifest_path"].as_str().unwrap()).parent().unwrap();
            let rel = dir.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["name"].as_str().unwrap())
                .filter(|d| names.contains(d))
                .map(str::to_owned)
                .collect();
            (p["name"].as_str().unwrap().to_owned(), rel, deps)
        })
        .collect()
}

fn layer(dir: &str) -> usize {
    let top = dir.split('/').next().unwrap();
    LAYERS.iter().position(|l| *l == top).unwrap_or_else(|| panic!("{dir} is in no layer folder ({LAYERS:?})"))
}

/// The rows of the page's exceptions table: (what, reason).
fn exceptions(root: &Path) -> BTreeMap<String, String> {
    let page = fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let start = page.find("\n### Exceptions").expect("docs/architecture.md has an \"### Exceptions\" section");
    let section = &page[start + 1..];
    let section = &section[..section[1..].find("\n#").map_or(section.len(), |e| e + 1)];
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert!(cells.len() == 2 && !cells[1].is_empty(), "an exception needs its reason: {l}");
            (cells[0].trim_matches('`').to_owned(), cells[1].to_owned())
        })
        .collect()
}

/// The top-level modules of a crate's `src/` (file stems; `lib`/`main` the
/// root; a folder module is one node, the text of every file below it).
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let Ok(entries) = fs::read_dir(src) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.extension().is_some_and(|x| x == "rs") {
            out.entry(name).or_default().push_str(&fs::read_to_string(&p).unwrap());
        } else if p.is_dir() {
            let text = out.entry(name).or_default();
            for f in rust_files(&p) {
                if f.file_stem().is_some_and(|s| s == "tests") {
                    continue; // a module's own tests may use anything
                }
                let body = fs::read_to_string(&f).unwrap();
                let body = body.find("\n#[cfg(test)]\nmod ").map_or(&body[..], |at| &body[..at]);
                text.push('\n');
                if f.parent() == Some(p.as_path()) && f.file_stem().is_some_and(|s| s == "mod") {
                    text.push_str(body);
                } else {
                    // Below the folder's root, `super::` names the folder's own modules.
                    text.push_str(&body.replace("super::", "super_in_folder::"));
                }
            }
        }
    }
    out
}

/// Every `.rs` file below `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The sibling modules `text` (module `name`) imports: `crate::m` anywhere,
/// the names inside `use crate::{...}`, and `super::m` from a top-level module.
fn imports(name: &str, text: &str, siblings: &BTreeSet<String>) -> BTreeSet<String> {
    // A module's own tests (`#[cfg(test)] mod tests`, at its end) may use anything.
    let text = text.find("\n#[cfg(test)]\nmod ").map_or(text, |at| &text[..at]);
    let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut found = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    for prefix in ["crate::", "super::"] {
        if prefix == "super::" && (name == "lib" || name == "main") {
            continue;
        }
        for (at, _) in code.match_indices(prefix) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[at + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let body = &group[..group.find('}').unwrap_or(group.len())];
                found.extend(body.split(',').map(|p| ident(p.trim())));
            } else {
                found.insert(ident(rest));
            }
        }
    }
    found.retain(|m| m != name && siblings.contains(m));
    found
}

/// The circles (strongly connected components of two or more) of `graph`.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, recursive: the graphs are a few dozen nodes.
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_crate_depends_on_a_higher_folder_and_no_modules_import_each_other() {
    let root = root();
    let allowed = exceptions(&root);
    let pkgs = packages(&root);
    let dir_of: BTreeMap<&str, &str> = pkgs.iter().map(|(n, d, _)| (n.as_str(), d.as_str())).collect();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (name, dir, deps) in &pkgs {
        for d in deps {
            let (from, to) = (layer(dir), layer(dir_of[d.as_str()]));
            if to > from {
                let key = format!("{name} -> {d}");
                if allowed.contains_key(&key) {
                    seen.insert(key);
                } else {
                    problems.push(format!(
                        "{key}: {dir} ({}) depends on {} ({}), a higher folder",
                        LAYERS[from],
                        dir_of[d.as_str()],
                        LAYERS[to]
                    ));
                }
            }
        }
        let mods = modules(&root.join(dir).join("src"));
        let names: BTreeSet<String> = mods.keys().cloned().collect();
        let graph: BTreeMap<String, BTreeSet<String>> = mods.iter().map(|(m, t)| (m.clone(), imports(m, t, &names))).collect();
        for c in circles(&graph) {
            let key = format!("{name}: {}", c.join(" <-> "));
            if allowed.contains_key(&key) {
                seen.insert(key);
            } else {
                let ties: Vec<String> =
                    c.iter().flat_map(|a| graph[a].iter().filter(|b| c.contains(b)).map(move |b| format!("{a} -> {b}"))).collect();
                problems.push(format!("{key}: modules import each other ({})", ties.join(", ")));
            }
        }
    }
    for stale in allowed.keys().filter(|k| !seen.contains(*k)) {
        problems.push(format!("{stale}: named as an exception in docs/architecture.md, but the code no longer has it"));
    }
    assert!(problems.is_empty(), "the layering of docs/architecture.md does not hold:\n  {}", problems.join("\n  "));
}

#[test]
fn every_crate_is_named_after_its_folder() {
    let root = root();
    let mut wrong = Vec::new();
    for (name, dir, _) in packages(&root) {
        let folder = dir.rsplit('/').next().unwrap();
        let expected = if folder == "dlbridge" { "dlbridge".to_owned() } else { format!("dlbridge-{folder}") };
        if name != expected {
            wrong.push(format!("{dir} holds {name}; name it {expected} (or move it to a folder named after it)"));
        }
    }
    assert!(wrong.is_empty(), "crates named apart from their folders:\n{}", wrong.join("\n"));
}

#[test]
fn the_import_reader_sees_groups_super_and_skips_comments() {
    let sib: BTreeSet<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
    let text = "use crate::{a, b::X};\nuse super::c;\n// use crate::d;\nfn f() { crate::a::g(); }\n#[cfg(test)]\nmod tests {\n    use crate::d;\n}";
    assert_eq!(imports("m", text, &sib), ["a", "b", "c"].iter().map(|s| s.to_string()).collect());
    assert!(imports("lib", "use super::c;", &sib).is_empty(), "the root's `super` is outside the crate");
    let g: BTreeMap<String, BTreeSet<String>> =
        [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")].iter().map(|(x, y)| (x.to_string(), BTreeSet::from([y.to_string()]))).collect();
    assert_eq!(circles(&g), vec![vec!["a".to_string(), "b".into(), "c".into()]]);
}

/// Folders a walk of the tree passes over: builds, environments, caches.
const NOT_SOURCE: [&str; 9] =
    ["target", ".venv", ".git", "__pycache__", "site", "node_modules", ".pytest_cache", ".hypothesis", ".mypy_cache"];

/// Extensions of source files.
const SOURCE: [&str; 9] = ["rs", "py", "pyi", "c", "h", "cpp", "cu", "cuh", "tc"];

/// The folders under `dir` (relative to `root`) that hold source files, but
/// for test-only ones: a `tests` folder and what is under it, and a folder
/// whose only source file is `tests.rs` (a module's tests beside it).
fn source_folders(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let mut names: Vec<String> = Vec::new();
    let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if !NOT_SOURCE.contains(&name.as_str()) && name != "tests" && !name.starts_with('.') {
                source_folders(root, &p, out);
            }
        } else if p.extension().is_some_and(|e| SOURCE.contains(&e.to_string_lossy().as_ref())) {
            names.push(name);
        }
    }
    if !names.is_empty() && names.iter().any(|n| n != "tests.rs") && dir != root {
        out.push(dir.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
    }
}

#[test]
fn every_source_folder_is_on_the_architecture_page_and_every_page_in_the_index() {
    let root = root();
    let page = fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut folders = Vec::new();
    for top in ["crates", "kernels", "adapters", "python", "examples"] {
        source_folders(&root, &root.join(top), &mut folders);
    }
    let missing: Vec<&String> = folders.iter().filter(|f| !page.contains(&format!("`{f}`"))).collect();
    assert!(missing.is_empty(), "source folders docs/architecture.md (\"Every source folder\") does not name: {missing:?}");
    // A crate's own map (its lib.rs) names each folder of its source.
    for f in folders.iter().filter(|f| f.matches("/src/").count() == 1 && !f.ends_with("/src")) {
        let (krate, sub) = f.split_once("/src/").unwrap();
        if sub.contains('/') {
            continue;
        }
        let lib = fs::read_to_string(root.join(krate).join("src/lib.rs")).unwrap();
        assert!(lib.contains(&format!("`{sub}/`")), "{krate}/src/lib.rs's map does not name its folder `{sub}/`");
    }
    // docs/index.md lists every page.
    let index = fs::read_to_string(root.join("docs/index.md")).unwrap();
    for e in fs::read_dir(root.join("docs")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "index.md" {
            assert!(index.contains(&format!("]({name})")), "docs/index.md does not list {name}");
        }
    }
}
