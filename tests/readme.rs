//! README.md stays true: its code blocks follow the conventions below, and the
//! output it quotes is what the code prints.
//!
//! Every fenced block names its language. How each kind is checked:
//!
//! - ```` ```rust ````: compiled and run as a doctest of this crate
//!   (`support.rs` includes README.md under `cfg(doctest)`), so each block is a
//!   complete program (`fn main() -> dlbridge::Result<()>`).
//! - ```` ```rust,ignore ````: only with a comment on the line before it,
//!   `<!-- runs in PATH: REASON -->`; every line of the block must appear, in
//!   order, in PATH — a test that runs in `./dev.sh test` (e.g. the tch example,
//!   which needs libtorch, runs in `adapters/tch/tests/readme.rs`).
//! - ```` ```python ````: run by `python/tests/test_readme.py`, unless the line
//!   before it is `<!-- not run: REASON -->` (kept for blocks that cannot run
//!   anywhere; there are none today).
//! - ```` ```text ````: output and error messages; the ones this file knows are
//!   compared with what the code prints (`...` on a line of its own stands for
//!   any lines, a trailing `...` for the rest of the line, and `0x` addresses
//!   for any address), the Python error texts by `test_readme.py`.
//! - ```` ```sh ````: commands, not run here (`./dev.sh test` is what runs them).
#![forbid(unsafe_code)]

use std::fs;
use std::path::{Path, PathBuf};

use dlbridge::{Array, ArrayArg, DType};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[derive(Debug)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    lang: String,
    /// The HTML comment on the line before the fence, if any (without `<!--`/`-->`).
    comment: Option<String>,
    lines: Vec<String>,
}

fn blocks(readme: &str) -> Vec<Block> {
    let lines: Vec<&str> = readme.lines().collect();
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
            assert!(i < lines.len(), "README.md:{}: unclosed code block", start + 1);
            out.push(Block { line: start + 1, lang: lang.trim().to_string(), comment, lines: body });
        }
        i += 1;
    }
    out
}

fn readme() -> String {
    fs::read_to_string(root().join("README.md")).unwrap()
}

#[test]
fn every_readme_block_follows_the_conventions() {
    let mut problems = Vec::new();
    for b in blocks(&readme()) {
        let at = format!("README.md:{}", b.line);
        match (b.lang.as_str(), b.comment.as_deref()) {
            ("", _) => {
                problems.push(format!("{at}: a block without a language (rustdoc would compile it as Rust): use ```text for output"))
            }
            ("rust", Some(c)) if c.starts_with("runs in") || c.starts_with("not run") => {
                problems.push(format!("{at}: a ```rust block runs as a doctest; the comment `{c}` before it is wrong"))
            }
            ("rust", _) | ("text", _) | ("sh", _) => {}
            ("rust,ignore", Some(c)) if c.starts_with("runs in ") => {
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
                            problems.push(format!(
                                "{at}: the line `{l}` is not in {path} (in order): the README block and its test drifted apart"
                            ));
                            break;
                        }
                    }
                }
            }
            ("python", None) => {}
            ("python", Some(c)) if c.starts_with("not run: ") && c.len() > "not run: ".len() => {}
            (lang, comment) => problems.push(format!("{at}: ```{lang} with comment {comment:?}: see tests/readme.rs for the conventions")),
        }
    }
    assert!(problems.is_empty(), "README.md code blocks:\n  {}", problems.join("\n  "));
}

/// Whether `actual` lines match the README's `quoted` lines: `...` alone
/// matches any number of lines, a trailing `...` any rest of a line, `0x…`
/// any address, and runs of spaces compare equal to one space.
fn matches(quoted: &[String], actual: &[String]) -> bool {
    fn norm(s: &str) -> String {
        let words: Vec<String> = s
            .split_whitespace()
            .map(|w| {
                let t = w.trim_start_matches("0x");
                if w.starts_with("0x") && !t.is_empty() && t.chars().all(|c| c.is_ascii_hexdigit()) { "0xADDR".into() } else { w.into() }
            })
            .collect();
        words.join(" ")
    }
    fn line_matches(q: &str, a: &str) -> bool {
        let (q, a) = (norm(q), norm(a));
        match q.strip_suffix("...") {
            Some(prefix) => a.starts_with(prefix.trim_end()),
            None => q == a,
        }
    }
    match quoted.split_first() {
        None => actual.is_empty(),
        Some((q, rest)) if q.trim() == "..." => (0..=actual.len()).any(|skip| matches(rest, &actual[skip..])),
        Some((q, rest)) => actual.split_first().is_some_and(|(a, arest)| line_matches(q, a) && matches(rest, arest)),
    }
}

/// The ```text block whose first line starts with `first`.
fn text_block(first: &str) -> Block {
    blocks(&readme())
        .into_iter()
        .find(|b| b.lang == "text" && b.lines.first().is_some_and(|l| l.starts_with(first)))
        .unwrap_or_else(|| panic!("README has no ```text block starting with `{first}`"))
}

#[test]
fn readme_demo_output_is_what_the_demo_prints() {
    let b = text_block("dlbridge demo:");
    let actual: Vec<String> = dlbridge::demo::array_round_trip().unwrap().lines().map(str::to_owned).collect();
    assert!(
        matches(&b.lines, &actual),
        "README.md:{} quotes\n{}\nbut `dlbridge demo` prints\n{}",
        b.line,
        b.lines.join("\n"),
        actual.join("\n")
    );
}

#[test]
fn readme_kernel_list_is_what_dlbridge_list_prints() {
    let b = text_block("add<");
    // The line format of `dlbridge list` (crates/dlbridge-cli): signature, devices, doc.
    let actual: Vec<String> = dlbridge::registry()
        .list()
        .iter()
        .map(|k| {
            let devices: Vec<String> = k.devices().map(|d| d.to_string()).collect();
            format!("{}  [{}]  {}", k.signature_text(), devices.join(", "), k.doc())
        })
        .collect();
    for q in b.lines.iter().filter(|l| l.trim() != "...") {
        assert!(
            actual.iter().any(|a| matches(std::slice::from_ref(q), std::slice::from_ref(a))),
            "README.md:{}: `{q}` is not a line `dlbridge list` prints:\n{}",
            b.line,
            actual.join("\n")
        );
    }
}

#[test]
fn readme_error_texts_are_what_the_registry_says() {
    // The Python suite (python/tests/test_readme.py) checks every line of this
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
        assert!(b.lines.contains(&msg), "README.md:{} does not quote the error `{msg}`:\n{}", b.line, b.lines.join("\n"));
    }
}

#[test]
fn readme_validator_error_is_what_the_validator_says() {
    // `check_layout` is what every foreign tensor goes through (`dlbridge_core::raw`).
    let e = dlbridge_core::layout::check_layout(&[2, -3], None, DType::F32, 64, 0, false).unwrap_err().to_string();
    assert_eq!(e, "invalid DLTensor field `shape[1]` = -3: dims must not be negative");
    let prose = readme().split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(prose.contains(&format!("(`{e}`)")), "README no longer quotes the validator's error `{e}`");
}
