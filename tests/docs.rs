//! README.md and the pages of docs/ stay true: their code blocks follow the
//! conventions below, and the Rust-side output they quote is what the code
//! prints.
//!
//! Every fenced block names its language. How each kind is checked:
//!
//! - ```` ```rust ````: compiled and run as a doctest of this crate
//!   (`support.rs` includes README.md and every page with such a block under
//!   `cfg(doctest)`), so each block is a complete program
//!   (`fn main() -> dlbridge::Result<()>`).
//! - ```` ```rust,ignore ```` and ```` ```toml ````: only with a comment on the
//!   line before it, `<!-- runs in PATH: REASON -->`; every line of the block
//!   must appear, in order, in PATH, a file that runs in `./dev.sh test` (the
//!   tch examples, which need libtorch, run from the pages' console blocks).
//! - ```` ```python ```` and ```` ```console ````: run by
//!   `python/tests/test_docs.py` as a reader would run them, unless the line
//!   before is `<!-- not run: REASON -->`; a ```` ```text ```` block after a
//!   Python block, marked `<!-- output of the block above -->`, is what it
//!   prints.
//! - ```` ```text ````: output, error messages, pictures; the ones this file
//!   knows are compared with what the code prints (`...` on a line of its own
//!   stands for any lines, a trailing `...` for the rest of the line, and `0x`
//!   addresses for any address), the Python error texts by `test_docs.py`.
//! - ```` ```sh ````: only with `<!-- not run: REASON -->` before it (the
//!   README's two commands, which CI runs itself); a command a reader should
//!   run is a ```` ```console ```` block.
#![forbid(unsafe_code)]

use std::fs;
use std::path::{Path, PathBuf};

use dlbridge::{Array, ArrayArg, DType};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// README.md and every page of docs/, as paths relative to the root.
fn pages() -> Vec<String> {
    let mut pages: Vec<String> = fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    pages.sort();
    pages.insert(0, "README.md".into());
    pages
}

#[derive(Debug)]
struct Block {
    /// `PAGE:LINE` of the opening fence.
    at: String,
    lang: String,
    /// The HTML comment on the line before the fence, if any (without `<!--`/`-->`).
    comment: Option<String>,
    lines: Vec<String>,
}

fn blocks(page: &str) -> Vec<Block> {
    let text = fs::read_to_string(root().join(page)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(lang) = lines[i].strip_prefix("```") {
            let comment = i
                .checked_sub(1)
                .map(|j| lines[j].trim())
                .and_then(|l| l.strip_prefix("<!--")?.strip_suffix("-->"))
                .map(|c| c.trim().to_string());
            let start = i;
            i += 1;
            let mut body = Vec::new();
            while i < lines.len() && !lines[i].starts_with("```") {
                body.push(lines[i].to_string());
                i += 1;
            }
            assert!(i < lines.len(), "{page}:{}: unclosed code block", start + 1);
            out.push(Block { at: format!("{page}:{}", start + 1), lang: lang.trim().to_string(), comment, lines: body });
        }
        i += 1;
    }
    out
}

fn all_blocks() -> Vec<Block> {
    pages().iter().flat_map(|p| blocks(p)).collect()
}

fn not_run(c: &str) -> bool {
    c.strip_prefix("not run: ").is_some_and(|r| !r.trim().is_empty())
}

#[test]
fn every_block_follows_the_conventions() {
    let mut problems = Vec::new();
    for b in all_blocks() {
        let at = &b.at;
        match (b.lang.as_str(), b.comment.as_deref()) {
            ("", _) => {
                problems.push(format!("{at}: a block without a language (rustdoc would compile it as Rust): use ```text for output"))
            }
            ("rust", Some(c)) => problems.push(format!("{at}: a ```rust block runs as a doctest; the comment `{c}` before it is wrong")),
            ("rust" | "console", None) | ("text", None | Some("output of the block above")) => {}
            ("sh", Some(c)) if not_run(c) => {}
            ("rust,ignore" | "toml", Some(c)) if c.starts_with("runs in ") => {
                let Some((path, reason)) = c["runs in ".len()..].split_once(": ") else {
                    problems.push(format!("{at}: write `<!-- runs in PATH: REASON -->`"));
                    continue;
                };
                if reason.trim().is_empty() {
                    problems.push(format!("{at}: `runs in {path}` needs a reason"));
                }
                let Ok(text) = fs::read_to_string(root().join(path)) else {
                    problems.push(format!("{at}: `{path}` does not exist"));
                    continue;
                };
                let mut rest = text.as_str();
                for l in b.lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
                    match rest.find(l) {
                        Some(i) => rest = &rest[i + l.len()..],
                        None => {
                            problems.push(format!("{at}: the line `{l}` is not in {path} (in order): the page and the file drifted apart"));
                            break;
                        }
                    }
                }
            }
            ("python", None) => {}
            ("python" | "console", Some(c)) if not_run(c) => {}
            (lang, comment) => problems.push(format!("{at}: ```{lang} with comment {comment:?}: see tests/docs.rs for the conventions")),
        }
    }
    assert!(problems.is_empty(), "code blocks of README.md and docs/:\n  {}", problems.join("\n  "));
}

#[test]
fn every_page_with_rust_blocks_runs_them_as_doctests() {
    let support = fs::read_to_string(root().join("tests/support.rs")).unwrap();
    for page in pages() {
        if blocks(&page).iter().any(|b| b.lang == "rust") {
            let include = format!("include_str!(\"../{page}\")");
            assert!(support.contains(&include), "{page} has ```rust blocks: tests/support.rs must `{include}` under cfg(doctest)");
        }
    }
}

/// The one ```text block whose first line starts with `first`, in any page.
fn text_block(first: &str) -> Block {
    let mut found: Vec<Block> =
        all_blocks().into_iter().filter(|b| b.lang == "text" && b.lines.first().is_some_and(|l| l.starts_with(first))).collect();
    assert_eq!(found.len(), 1, "expected one ```text block starting with `{first}` in README.md and docs/: {found:?}");
    found.remove(0)
}

#[test]
fn the_quoted_error_texts_are_what_the_registry_says() {
    // The Python suite (python/tests/test_docs.py) checks every line of this
    // block through the Python adapter; here, the ones a Rust caller meets the same way.
    let b = text_block("matmul: argument");
    let k = dlbridge::get_kernel("matmul").unwrap();
    let f32s = |shape: &[i64]| Array::zeros(DType::F32, shape).unwrap();
    let i32s = |shape: &[i64]| Array::zeros(DType::I32, shape).unwrap();
    let produced = [
        dlbridge::call(&k, &mut [ArrayArg::In(&f32s(&[2, 3])), ArrayArg::In(&f32s(&[4, 5]))]).unwrap_err(),
        dlbridge::call(&k, &mut [ArrayArg::In(&i32s(&[2, 3])), ArrayArg::In(&i32s(&[3, 5]))]).unwrap_err(),
    ];
    for e in produced {
        let msg = e.to_string();
        assert!(b.lines.contains(&msg), "{} does not quote the error `{msg}`:\n{}", b.at, b.lines.join("\n"));
    }
}

#[test]
fn the_quoted_validator_error_is_what_the_validator_says() {
    // `check_layout` is what every foreign tensor goes through (`dlbridge_core::raw`).
    let e = dlbridge_core::layout::check_layout(&[2, -3], None, DType::F32, 64, 0, false).unwrap_err().to_string();
    assert_eq!(e, "invalid DLTensor field `shape[1]` = -3: dims must not be negative");
    let page = fs::read_to_string(root().join("docs/rust.md")).unwrap();
    let prose = page.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(prose.contains(&format!("(`{e}`)")), "docs/rust.md no longer quotes the validator's error `{e}`");
}
