//! Unsafe code stays where the architecture page (docs/architecture.md) says it is.
//!
//! Every crate root of every workspace member (library, binaries, examples,
//! benches, build script; not test targets, which exercise unsafe APIs) opens
//! with `#![forbid(unsafe_code)]` or `#![deny(unsafe_code)]`, and `unsafe_code`
//! is allowed only by `#[allow(unsafe_code)]` on a `mod` line (the whole module)
//! or on single items. This test walks every crate's module tree, collects the
//! modules that allow unsafe code, and compares them with the table of the
//! page's "Crates and where unsafe lives" section, so the table and the code
//! cannot drift apart:
//!
//! - every workspace member has exactly one row, and every row is a member;
//! - a crate whose row says "none" forbids unsafe code in every root; a crate
//!   with modules listed denies it at the root, and its allowed modules are
//!   exactly the ones listed (a module named `lib.rs`/`main.rs` stands for
//!   item-level allows in the crate root);
//! - no `#![allow(unsafe_code)]` inside a module (the parent names it instead);
//! - an allowed module actually uses unsafe (no stale allows), and no file
//!   outside an allowed module uses it (which also covers crates that the
//!   default `cargo test` does not compile: the pyo3 and tch crates).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The workspace (`DLBRIDGE_CHECK_ROOT` overrides it, to try the check on a mutated copy).
fn root() -> PathBuf {
    match std::env::var_os("DLBRIDGE_CHECK_ROOT") {
        Some(r) => PathBuf::from(r),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf(),
    }
}

/// `members = [ ... ]` of the workspace manifest.
fn members(root: &Path) -> Vec<String> {
    let text = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let start = text.find("\nmembers = [").expect("workspace members");
    let body = &text[start..];
    let body = &body[..body.find(']').unwrap()];
    body.split('"').skip(1).step_by(2).map(str::to_owned).collect()
}

/// Crate roots of a package that are not tests: (kind, path).
fn crate_roots(dir: &Path) -> Vec<(String, PathBuf)> {
    let manifest = fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let mut roots: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut section = String::new();
    let mut build_script: Option<PathBuf> = None;
    let mut lib_path: Option<PathBuf> = None;
    for line in manifest.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            section = l.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let Some((key, value)) = l.split_once('=') else { continue };
        let value = value.trim().trim_matches('"');
        match (section.as_str(), key.trim()) {
            ("lib", "path") => lib_path = Some(dir.join(value)),
            ("bin" | "example" | "bench", "path") => {
                roots.insert(dir.join(value), section.clone());
            }
            ("package", "build") => build_script = Some(dir.join(value)),
            _ => {}
        }
    }
    let lib = lib_path.unwrap_or_else(|| dir.join("src/lib.rs"));
    if lib.exists() {
        roots.insert(lib, "lib".into());
    }
    let main = dir.join("src/main.rs");
    if main.exists() {
        roots.insert(main, "bin".into());
    }
    for (sub, kind) in [("src/bin", "bin"), ("examples", "example"), ("benches", "bench")] {
        if let Ok(entries) = fs::read_dir(dir.join(sub)) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "rs") {
                    roots.entry(p).or_insert_with(|| kind.into());
                } else if p.join("main.rs").exists() {
                    roots.entry(p.join("main.rs")).or_insert_with(|| kind.into());
                }
            }
        }
    }
    let build = build_script.unwrap_or_else(|| dir.join("build.rs"));
    if build.exists() {
        roots.insert(build, "build".into());
    }
    roots.into_iter().map(|(p, k)| (k, p)).collect()
}

/// A line without its `//` comment (string contents containing `//` are cut
/// too, which only ever removes text).
fn code(line: &str) -> &str {
    line.find("//").map_or(line, |i| &line[..i])
}

/// Whether a line of code uses unsafe: blocks, functions, impls, traits,
/// extern blocks and unsafe attributes.
fn uses_unsafe(line: &str) -> bool {
    let c = code(line);
    ["unsafe {", "unsafe fn", "unsafe impl", "unsafe trait", "unsafe extern", "unsafe(", "unsafe{"].iter().any(|p| c.contains(p))
}

fn is_unsafe_code_lint(line: &str, levels: &[&str]) -> bool {
    let c = code(line).trim();
    c.contains("unsafe_code") && levels.iter().any(|l| c.contains(&format!("{l}(")))
}

/// `mod NAME;` (any visibility) -> NAME.
fn mod_decl(line: &str) -> Option<&str> {
    let c = code(line).trim();
    let rest = c.strip_prefix("pub(crate) ").or_else(|| c.strip_prefix("pub ")).unwrap_or(c);
    let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
    Some(name.trim())
}

#[derive(Default, Debug)]
struct Scan {
    /// Module paths whose subtree allows unsafe code (`#[allow]` on the mod line),
    /// plus crate roots / modules with item-level allows (named `lib.rs` etc. for roots).
    allowed: BTreeSet<String>,
    /// Files using unsafe that no allow covers.
    uncovered: Vec<String>,
    /// Allows that cover no use of unsafe.
    stale: Vec<String>,
    /// `#![allow(unsafe_code)]` (or warn/expect) inner attributes.
    inner_allows: Vec<String>,
}

/// Walks one module file and its children; returns whether the subtree uses
/// unsafe. `covered`: an ancestor's `mod` line allows unsafe code.
fn scan_module(file: &Path, module: &str, is_root: bool, covered: bool, scan: &mut Scan, root: &Path) -> bool {
    let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let rel = file.strip_prefix(root).unwrap_or(file).display().to_string();
    let dir = file.parent().unwrap();
    let stem = file.file_stem().unwrap().to_str().unwrap();
    let child_dir = if is_root || stem == "mod" { dir.to_path_buf() } else { dir.join(stem) };
    let (mut item_allow, mut pending_allow, mut uses, mut subtree_uses) = (false, false, false, false);
    for (i, line) in text.lines().enumerate() {
        let c = code(line).trim();
        if c.starts_with("#![") && is_unsafe_code_lint(c, &["allow", "warn", "expect"]) {
            scan.inner_allows.push(format!("{rel}:{}", i + 1));
        }
        if c.starts_with("#[") && is_unsafe_code_lint(c, &["allow", "warn", "expect"]) {
            pending_allow = true;
            continue;
        }
        uses |= uses_unsafe(line);
        if c.starts_with("#[") || c.is_empty() {
            continue;
        }
        if let Some(name) = mod_decl(line) {
            let child = if module.is_empty() { name.to_string() } else { format!("{module}::{name}") };
            let path = [child_dir.join(format!("{name}.rs")), child_dir.join(name).join("mod.rs")]
                .into_iter()
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("{rel}: module file for `{name}` not found"));
            let child_uses = scan_module(&path, &child, false, covered || pending_allow, scan, root);
            if pending_allow && !covered {
                scan.allowed.insert(child);
                if !child_uses {
                    scan.stale.push(path.strip_prefix(root).unwrap_or(&path).display().to_string());
                }
            }
            subtree_uses |= child_uses;
        } else if pending_allow {
            item_allow = true;
        }
        pending_allow = false;
    }
    if item_allow && !covered {
        scan.allowed.insert(if is_root { format!("{stem}.rs") } else { module.to_string() });
        if !uses {
            scan.stale.push(rel.clone());
        }
    }
    if uses && !covered && !item_allow {
        scan.uncovered.push(rel);
    }
    uses || subtree_uses
}

/// The page that holds the table.
const PAGE: &str = "docs/architecture.md";
/// The heading of the table's section.
const SECTION: &str = "\n## Crates and where unsafe lives";

/// The architecture page's crate table: path -> the modules its last column
/// names (backticked words outside parentheses), or None for "none".
fn unsafe_map(root: &Path) -> BTreeMap<String, Option<BTreeSet<String>>> {
    let page = fs::read_to_string(root.join(PAGE)).unwrap_or_else(|e| panic!("{PAGE}: {e}"));
    let start = page.find(SECTION).unwrap_or_else(|| panic!("{PAGE} has no `{}` section", SECTION.trim()));
    let section = &page[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut rows = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let first = cells[0];
        if !first.starts_with('`') {
            continue; // header or separator
        }
        let path = first.trim_matches('`').trim_end_matches('/').to_string();
        let last = cells.last().unwrap();
        let mut outside = String::new();
        let mut depth = 0;
        for ch in last.chars() {
            match ch {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => outside.push(ch),
                _ => {}
            }
        }
        let modules: BTreeSet<String> = outside.split('`').skip(1).step_by(2).map(str::to_owned).collect();
        let value = if outside.trim_start().starts_with("none") && modules.is_empty() { None } else { Some(modules) };
        assert!(rows.insert(path.clone(), value).is_none(), "{PAGE} lists `{path}` twice");
    }
    rows
}

#[test]
fn unsafe_code_is_confined_to_the_modules_the_architecture_page_names() {
    let root = root();
    let layout = unsafe_map(&root);
    let members = members(&root);
    let mut problems = Vec::new();
    for m in &members {
        if !layout.contains_key(m.as_str()) {
            problems.push(format!("{PAGE} has no row for workspace member `{m}`"));
        }
    }
    for path in layout.keys() {
        if !members.contains(path) {
            problems.push(format!("{PAGE} lists `{path}`, which is not a workspace member"));
        }
    }
    for m in &members {
        let dir = root.join(m);
        let mut scan = Scan::default();
        let roots = crate_roots(&dir);
        assert!(!roots.is_empty(), "{m}: no crate roots found");
        for (kind, file) in &roots {
            let rel = file.strip_prefix(&root).unwrap().display();
            let text = fs::read_to_string(file).unwrap();
            let level = text.lines().map(|l| code(l).trim()).find_map(|l| {
                (l.starts_with("#![") && l.contains("unsafe_code")).then(|| {
                    if l.contains("forbid(") {
                        "forbid"
                    } else if l.contains("deny(") {
                        "deny"
                    } else {
                        "other"
                    }
                })
            });
            match level {
                Some("forbid") | Some("deny") => {}
                _ => problems.push(format!("{rel} ({kind} root) has neither #![forbid(unsafe_code)] nor #![deny(unsafe_code)]")),
            }
            let before = scan.allowed.len();
            scan_module(file, "", true, false, &mut scan, &root);
            if scan.allowed.len() == before && level == Some("deny") {
                problems.push(format!("{rel} ({kind} root) allows unsafe nowhere: make it #![forbid(unsafe_code)]"));
            }
            if scan.allowed.len() > before && level == Some("forbid") {
                problems.push(format!("{rel} ({kind} root) forbids unsafe code but allows it in a module"));
            }
        }
        for f in &scan.inner_allows {
            problems.push(format!("{f}: an inner #![allow(unsafe_code)]: put #[allow(unsafe_code)] on the `mod` line instead"));
        }
        for f in &scan.uncovered {
            problems.push(format!("{f} uses unsafe but no #[allow(unsafe_code)] covers it"));
        }
        for f in &scan.stale {
            problems.push(format!("{f} is allowed unsafe code but uses none: remove the allow"));
        }
        match layout.get(m.as_str()) {
            Some(None) if !scan.allowed.is_empty() => {
                problems.push(format!("{PAGE} says `{m}` has no unsafe code, but it allows it in {:?}", scan.allowed))
            }
            Some(Some(listed)) if *listed != scan.allowed => {
                problems.push(format!("{PAGE} says `{m}` allows unsafe code in {listed:?}; the code allows it in {:?}", scan.allowed))
            }
            _ => {}
        }
    }
    assert!(problems.is_empty(), "unsafe code and {PAGE} disagree:\n  {}", problems.join("\n  "));
}
