//! The check of a generated source's user fragments after preprocessing.
//!
//! A kernel from source is generated C++ with the user's texts pasted in (the
//! preamble at file scope, the operation in a lambda per element, `loop_prep`
//! and `after_loop` in the loop's function, expressions in helper functions).
//! Whether a text stays in its place is a question about what the compiler
//! makes of it, not about its spelling: line splices, digraphs (`<%`, `%>`,
//! `%:`), raw strings and macros (`##` pasting, `#` stringising, a function
//! macro picking up the generated text's parentheses) all change what a
//! spelling means. So the check runs on the compiler's own preprocessed output
//! (`$CXX -E`) of the whole generated file, and the library is compiled from
//! that very output (`kernel.ii`): what was checked is what is compiled, and a
//! header the preamble includes is read once.
//!
//! Each fragment is marked in the generated source by a `#pragma
//! dlbridge_fragment NONCE begin LABEL` line before it and an `end` line after
//! it, with a nonce made for each source from this user's secret, which no
//! user text can know in advance. In the preprocessed output:
//! * every mark is found once, in order, on a line of its own (a fragment that
//!   swallows a mark, or a mark produced by user text, is refused);
//! * the generated code outside the fragments has exactly the tokens it has
//!   when every fragment is blank (a macro that rewrites a generated name,
//!   `for_runs` or `parallel_chunks` say, is refused, naming the token);
//! * each fragment's tokens close every bracket they open and no other
//!   (digraphs counted as the brackets they are), so none reaches out of its
//!   function or into the generated code after it;
//! * `loop_prep`, `after_loop` and the expressions have no `return` (nor
//!   `co_return`, `co_yield`, `co_await`): there it would end more than one
//!   element. The operation runs in a function of its own per element, where a
//!   `return` ends that element only;
//! * no fragment opens a namespace named `dlbridge...` or names
//!   `dlbridge::detail`: names under that prefix belong to the generated code;
//! * no line of a fragment is a directive other than `#pragma`.

use dlbridge_core::{Error, ErrorKind, Result};

/// The first line of a marked source, followed by its nonce.
pub(crate) const HEADER: &str = "// dlbridge fragment marks: ";

/// The pragma every mark is.
const PRAGMA: &str = "#pragma dlbridge_fragment ";

/// A fresh nonce: 32 hex digits no user text can predict (a counter and the
/// clock, sealed under this user's secret).
pub(crate) fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let tag = dlbridge_registry::trust::seal("fragment marks", format!("{n} {t} {}", std::process::id()).as_bytes());
    tag.chars().filter(char::is_ascii_hexdigit).take(32).collect()
}

/// One mark line.
pub(crate) fn mark(nonce: &str, which: &str, label: &str) -> String {
    format!("{PRAGMA}{nonce} {which} {label}")
}

/// The nonce of a marked source (its first line), if it is one.
pub(crate) fn nonce_of(source: &str) -> Option<&str> {
    let first = source.lines().next()?;
    first.strip_prefix(HEADER).filter(|n| n.len() == 32 && n.chars().all(|c| c.is_ascii_hexdigit()))
}

/// `source` with its nonce replaced by a fixed word: what decides the
/// library's code, for its cache key.
pub(crate) fn unmarked(source: &str) -> std::borrow::Cow<'_, str> {
    match nonce_of(source) {
        Some(n) => source.replace(n, "NONCE").into(),
        None => source.into(),
    }
}

/// Whether a marked source has any fragment to check.
pub(crate) fn has_fragments(source: &str, nonce: &str) -> bool {
    source.contains(&mark(nonce, "begin", ""))
}

/// `source` with every fragment's text blanked (its lines kept as empty
/// lines, so the generated code's line numbers do not move): the reference
/// the generated code is compared with.
pub(crate) fn blanked(source: &str, nonce: &str) -> String {
    let begin = mark(nonce, "begin", "");
    let end = mark(nonce, "end", "");
    let mut out = String::with_capacity(source.len());
    let mut inside = false;
    let mut first_of_fragment = false;
    for line in source.split_inclusive('\n') {
        let l = line.trim_end_matches(['\n', '\r']);
        if l.starts_with(&begin) {
            inside = true;
            first_of_fragment = true;
            out.push_str(line);
        } else if l.starts_with(&end) {
            inside = false;
            out.push_str(line);
        } else if inside && first_of_fragment {
            // The fragment's `#line 1 "label"`.
            first_of_fragment = false;
            out.push_str(line);
        } else if inside {
            out.push('\n');
        } else {
            out.push_str(line);
        }
    }
    out
}

/// One token of preprocessed C++, with the line of the preprocessed file it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tok<'s> {
    text: &'s str,
    line: usize,
}

/// Punctuators, longest first (digraphs among them).
const PUNCT: [&str; 50] = [
    "%:%:", "<=>", "->*", "<<=", ">>=", "...", "::", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+=", "-=", "*=",
    "/=", "%=", "&=", "|=", "^=", ".*", "##", "<%", "%>", "<:", ":>", "%:", "{", "}", "[", "]", "(", ")", ";", ":", "?", ".", "+", "-",
    "*", "/", "%", "^", "&",
];
const PUNCT_1: &str = "|~!=<>,#";

/// The tokens of a text and its directive lines (with their line numbers).
type Tokens<'s> = (Vec<Tok<'s>>, Vec<(usize, &'s str)>);

/// Tokens of `text` (preprocessed: no comments, no line splices), skipping
/// lines that are directives (returned apart, with their line).
fn tokens(text: &str) -> std::result::Result<Tokens<'_>, String> {
    let b = text.as_bytes();
    let (mut toks, mut directives) = (Vec::new(), Vec::new());
    let (mut k, mut line, mut line_start) = (0usize, 1usize, true);
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    while k < b.len() {
        let c = b[k];
        if c == b'\n' {
            line += 1;
            line_start = true;
            k += 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            k += 1;
            continue;
        }
        if line_start && (c == b'#' || b[k..].starts_with(b"%:")) {
            let end = text[k..].find('\n').map_or(b.len(), |e| k + e);
            directives.push((line, &text[k..end]));
            k = end;
            continue;
        }
        line_start = false;
        let start = k;
        if ident(c) && !c.is_ascii_digit() {
            while k < b.len() && ident(b[k]) {
                k += 1;
            }
            // A string or character literal with a prefix (u8"", R"()", L'x').
            if k < b.len()
                && (b[k] == b'"' || b[k] == b'\'')
                && matches!(&text[start..k], "u8" | "u" | "U" | "L" | "R" | "u8R" | "uR" | "UR" | "LR")
            {
                let raw = text[start..k].ends_with('R') && b[k] == b'"';
                k = literal(text, k, raw).ok_or_else(|| format!("an unterminated literal on line {line}"))?;
            }
        } else if c.is_ascii_digit() || (c == b'.' && b.get(k + 1).is_some_and(u8::is_ascii_digit)) {
            // A pp-number: digits, letters, `.`, `'` between digits, signs after exponents.
            k += 1;
            while k < b.len() {
                let d = b[k];
                let digit_separator = d == b'\'' && b.get(k + 1).is_some_and(|&n| ident(n));
                let exponent_sign = (d == b'+' || d == b'-') && matches!(b[k - 1], b'e' | b'E' | b'p' | b'P');
                if ident(d) || d == b'.' || digit_separator || exponent_sign {
                    k += 1;
                } else {
                    break;
                }
            }
        } else if c == b'"' || c == b'\'' {
            k = literal(text, k, false).ok_or_else(|| format!("an unterminated literal on line {line}"))?;
        } else if b[k..].starts_with(b"<::") && !matches!(b.get(k + 3), Some(b':' | b'>')) {
            // `<::` not followed by `:` or `>` is `<` then `::`, not the digraph `<:`.
            k += 1;
        } else if let Some(p) = PUNCT.iter().find(|p| b[k..].starts_with(p.as_bytes())) {
            k += p.len();
        } else if PUNCT_1.as_bytes().contains(&c) {
            k += 1;
        } else {
            // Anything else (`$`, `@`, a stray backslash) is a token of its own.
            k += text[k..].chars().next().map_or(1, char::len_utf8);
        }
        toks.push(Tok { text: &text[start..k], line });
        // A literal may span lines only as a raw string.
        line += text[start..k].matches('\n').count();
    }
    Ok((toks, directives))
}

/// The end of the literal opening at `k` (a `"` or `'`), or None when it is
/// not closed.
fn literal(text: &str, k: usize, raw: bool) -> Option<usize> {
    let b = text.as_bytes();
    if raw {
        let open = text[k + 1..].find('(')? + k + 1;
        let close = format!("){}\"", &text[k + 1..open]);
        return text[open..].find(&close).map(|e| open + e + close.len());
    }
    let quote = b[k];
    let mut j = k + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'\n' => return None,
            q if q == quote => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// A fragment's place in the preprocessed file.
struct Span<'s> {
    label: &'s str,
    /// Lines (0-based, exclusive of the marks) of its text.
    lines: std::ops::Range<usize>,
}

/// The fragments of a preprocessed marked file, or why they cannot be found.
fn spans<'s>(ii: &'s str, nonce: &str, labels: &[&str]) -> std::result::Result<Vec<Span<'s>>, String> {
    let prefix = format!("{PRAGMA}{nonce} ");
    let mut found: Vec<(usize, &str, &str)> = Vec::new();
    for (n, l) in ii.lines().enumerate() {
        if let Some(rest) = l.trim().strip_prefix(&prefix) {
            let (which, label) = rest.split_once(' ').unwrap_or((rest, ""));
            found.push((n, which, label.trim()));
        } else if l.contains(nonce) {
            return Err(format!("the mark of a fragment is not on a line of its own (line {} of the preprocessed file)", n + 1));
        }
    }
    let mut out = Vec::new();
    let mut it = found.iter();
    for want in labels {
        match (it.next(), it.next()) {
            (Some(&(b, "begin", lb)), Some(&(e, "end", le))) if lb == *want && le == *want => {
                out.push(Span { label: lb, lines: b + 1..e });
            }
            _ => return Err(format!("the text of `{want}` does not stay between its marks: it reaches into the generated code around it")),
        }
    }
    if it.next().is_some() {
        return Err("the preprocessed file has more fragment marks than the generated source".into());
    }
    Ok(out)
}

/// The labels of the fragments a marked source has, in order.
fn labels_of<'s>(source: &'s str, nonce: &str) -> Vec<&'s str> {
    let begin = mark(nonce, "begin", "");
    source.lines().filter_map(|l| l.strip_prefix(begin.as_str())).map(str::trim).collect()
}

/// The names of the macros the fragments of a marked source define (spelled
/// `#define` or `%:define`, continued lines joined).
fn user_macros(source: &str, nonce: &str) -> Vec<String> {
    let (begin, end) = (mark(nonce, "begin", ""), mark(nonce, "end", ""));
    let mut texts = Vec::new();
    let mut current: Option<String> = None;
    for line in source.lines() {
        if line.starts_with(&begin) {
            current = Some(String::new());
        } else if line.starts_with(&end) {
            texts.extend(current.take());
        } else if let Some(t) = current.as_mut() {
            t.push_str(line);
            t.push('\n');
        }
    }
    let mut names = Vec::new();
    for text in texts {
        for l in crate::params::scan(&text).code.lines() {
            let l = l.trim_start();
            if let Some(rest) = l.strip_prefix('#').map(str::trim_start).and_then(|r| r.strip_prefix("define")) {
                let name: String = rest.trim_start().chars().take_while(|&c| c.is_ascii_alphanumeric() || c == '_').collect();
                if !name.is_empty() {
                    names.push(name);
                }
            }
        }
    }
    names
}

/// Where a line of the preprocessed file is in the user's text: the label and
/// line of the last line marker before it (`# 3 "operation"`).
fn user_line(ii_lines: &[&str], at: usize) -> Option<(String, usize)> {
    let mut extra = 0;
    for l in ii_lines[..at.min(ii_lines.len())].iter().rev() {
        let t = l.trim_start();
        if let Some(rest) = t.strip_prefix('#') {
            let mut parts = rest.split_whitespace();
            let first = parts.next().unwrap_or("");
            let (num, file) = if first == "line" { (parts.next(), parts.next()) } else { (Some(first), parts.next()) };
            if let (Some(n), Some(f)) = (num.and_then(|n| n.parse::<usize>().ok()), file) {
                return Some((f.trim_matches('"').to_owned(), n + extra));
            }
            continue;
        }
        extra += 1;
    }
    None
}

/// The generated code's names a kernel's text may use (docs/compile.md).
const DOCUMENTED: [&str; 6] = ["_ind", "_i", "_j", "_in_ind", "_out_ind", "_type_reduce"];

/// Whether `w` is spelled like a name of the generated code's own: `_` and a
/// lower-case letter or digit (`_end`, `_q0`; not `__restrict__`, not `_Bool`).
fn is_private_name(w: &str) -> bool {
    let mut c = w.chars();
    c.next() == Some('_') && c.next().is_some_and(|d| d.is_ascii_lowercase() || d.is_ascii_digit())
}

/// The names of namespace `dlbridge` a kernel's text may use.
const PUBLIC: [&str; 3] = ["Raw", "Size", "Indexer"];

/// The runtime's names documented macros expand to (`rsqrt` is
/// `dlbridge_rsqrt`): the only names under the `dlbridge` prefix a text's
/// tokens may hold after preprocessing.
const MACRO_TARGETS: [&str; 2] = ["dlbridge_rsqrt", "dlbridge_rsqrtf"];

/// Words a fragment other than the preamble and the operation may not hold:
/// each would end more than the element it runs for (a `goto`, computed or
/// not, could skip the loop).
const ENDING: [&str; 6] = ["return", "co_return", "co_yield", "co_await", "goto", "__builtin_return"];

/// Words no fragment may hold: each jumps out of the function it is in,
/// past the generated code that called it (to a `setjmp` of the text's).
const NONLOCAL: [&str; 6] = ["longjmp", "_longjmp", "siglongjmp", "__builtin_longjmp", "setcontext", "swapcontext"];

/// Words no fragment may hold: each ends the calling thread in the middle
/// of a call, or registers code that runs when a thread exits, after it.
/// (The library's imports are checked for these too, whatever the spelling:
/// `elf.rs`.)
const THREAD_HOOKS: [&str; 6] = ["pthread_exit", "thrd_exit", "pthread_cancel", "pthread_key_create", "tss_create", "pthread_atfork"];

/// GCC's builtins that read or rewrite the frames and the return path
/// around the function they are in (`__builtin_eh_return` returns to any
/// address, past the generated code that called it): whole families by
/// prefix, then single names.
const FRAME_BUILTIN_FAMILIES: [&str; 4] = ["__builtin_eh_", "__builtin_unwind_", "__builtin_apply", "__builtin_dwarf_"];
const FRAME_BUILTINS: [&str; 7] = [
    "__builtin_frob_return_addr",
    "__builtin_extract_return_addr",
    "__builtin_init_dwarf_reg_size_table",
    "__builtin_return_address",
    "__builtin_frame_address",
    "__builtin_stack_save",
    "__builtin_stack_restore",
];

/// GCC attributes (also spelt `__name__`) whose argument the assembler reads
/// as a symbol or section name: pasted into the assembly verbatim, a newline
/// in it starts an assembler directive.
const SYMBOL_ATTRIBUTES: [&str; 5] = ["section", "alias", "weakref", "symver", "ifunc"];

/// The pragmas a kernel's text may use: loop and diagnostic hints. The others
/// are refused: `weak`, `redefine_extname` and `GCC visibility` make or
/// rename symbols, `GCC system_header` hides the text from these checks.
const ALLOWED_PRAGMAS: [&str; 9] = ["omp", "GCC unroll", "GCC ivdep", "unroll", "GCC diagnostic", "once", "pack", "message", "STDC"];

/// Whether `#pragma` followed by `rest` is one of [`ALLOWED_PRAGMAS`].
fn pragma_allowed(rest: &str) -> bool {
    let words: Vec<&str> = rest.split(|c: char| c.is_whitespace() || c == '(').filter(|w| !w.is_empty()).collect();
    ALLOWED_PRAGMAS.iter().any(|p| {
        let want: Vec<&str> = p.split(' ').collect();
        words.len() >= want.len() && words[..want.len()] == want[..]
    })
}

/// Whether `file` (a line marker's path) lies in one of the compiler's
/// system include directories, once `..` and links are resolved.
pub(crate) fn in_system_dir(file: &str, system_dirs: &[std::path::PathBuf]) -> bool {
    std::fs::canonicalize(file).is_ok_and(|f| system_dirs.iter().any(|d| f.starts_with(d)))
}

/// Checks the preprocessed marked source `ii` against `reference` (the
/// preprocessed [`blanked`] source): see the module's documentation. `what`
/// names the kernel in errors.
pub(crate) fn check(what: &str, source: &str, nonce: &str, ii: &str, reference: &str, system_dirs: &[std::path::PathBuf]) -> Result<()> {
    let fail = |m: String| Error::Coded { kind: ErrorKind::Value, message: format!("{what}: {m}") };
    let labels = labels_of(source, nonce);
    let ours = spans(ii, nonce, &labels).map_err(fail)?;
    let theirs = spans(reference, nonce, &labels).map_err(|m| fail(format!("the generated code without the user's text: {m}")))?;
    let ii_lines: Vec<&str> = ii.lines().collect();
    let ref_lines: Vec<&str> = reference.lines().collect();
    let r = outside(&ref_lines, &theirs);
    same_generated_code(source, nonce, &outside(&ii_lines, &ours), &r, &ours).map_err(fail)?;
    let private = private_names(&r);
    for s in &ours {
        check_fragment(s, &ii_lines, &private, system_dirs).map_err(fail)?;
    }
    Ok(())
}

/// The generated code of a file apart from its fragments: the text before,
/// between and after them.
fn outside(lines: &[&str], spans: &[Span<'_>]) -> Vec<String> {
    let mut parts = Vec::with_capacity(spans.len() + 1);
    let mut from = 0;
    for s in spans {
        parts.push(lines[from..s.lines.start].join("\n"));
        from = s.lines.end;
    }
    parts.push(lines[from..].join("\n"));
    parts
}

/// The generated code, fragment by fragment apart, has the same tokens in
/// the user's file (`a`) as in the reference (`r`).
fn same_generated_code(source: &str, nonce: &str, a: &[String], r: &[String], ours: &[Span<'_>]) -> std::result::Result<(), String> {
    for (k, (pa, pr)) in a.iter().zip(r).enumerate() {
        let (ta, _) = tokens(pa).map_err(|m| format!("the generated code after preprocessing has {m}"))?;
        let (tr, _) = tokens(pr).map_err(|m| format!("the generated code without the user's text has {m}"))?;
        if let Some(at) = (0..ta.len().max(tr.len())).find(|&i| ta.get(i).map(|t| t.text) != tr.get(i).map(|t| t.text)) {
            let after = if k == 0 { "before the first fragment".to_owned() } else { format!("after `{}`", ours[k - 1].label) };
            // The macro at fault: one the user's text defines, among the
            // generated tokens just before the difference (a function macro's
            // arguments differ after its name).
            let defined = user_macros(source, nonce);
            let culprit = tr[at.saturating_sub(16)..(at + 1).min(tr.len())].iter().rev().find(|t| defined.iter().any(|d| d == t.text));
            let m = match culprit {
                Some(t) => format!(
                    "the kernel's text changes the generated code {after}: its macro `{}` rewrites the generated code's `{}`; rename the macro",
                    t.text, t.text
                ),
                None => {
                    let expected = tr.get(at).map_or("the end of the file", |t| t.text);
                    let got = ta.get(at).map_or("the end of the file", |t| t.text);
                    format!(
                        "the kernel's text changes the generated code {after}: where it has `{expected}`, the preprocessed file has `{got}` \
                         (a macro of the kernel's text named like a name the generated code uses; rename it)"
                    )
                }
            };
            return Err(m);
        }
    }
    Ok(())
}

/// The generated code's own names after the preamble (`_end`, `_data`,
/// `_q0`, `dlbridge_chunk`, ...): a fragment that names one reaches into the
/// loop's state or overloads what the generated code calls. (The runtime's
/// names before the preamble, `dlbridge_rsqrt` behind `rsqrt`, stay usable.)
/// Taken from the reference itself, so every name it will ever have counts.
fn private_names(r: &[String]) -> std::collections::BTreeSet<&str> {
    let mut private: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for part in r.iter().skip(1) {
        if let Ok((toks, _)) = tokens(part) {
            private.extend(toks.iter().map(|t| t.text).filter(|w| is_private_name(w) || (w.starts_with("dlbridge") && *w != "dlbridge")));
        }
    }
    private
}

/// One fragment's tokens after preprocessing: no directive but `#pragma` and
/// line markers, its brackets closed within it, and none of the refusals of
/// [`refused_token`].
fn check_fragment(
    s: &Span<'_>,
    ii_lines: &[&str],
    private: &std::collections::BTreeSet<&str>,
    system_dirs: &[std::path::PathBuf],
) -> std::result::Result<(), String> {
    let text = ii_lines[s.lines.clone()].join("\n");
    let (all_toks, directives) = tokens(&text).map_err(|m| format!("`{}` has {m}", s.label))?;
    // What a system header the text includes brings (`/usr/include`: its
    // `extern "C"` blocks and `namespace std` included) is not the text's own:
    // the line markers say which lines come from one (flag 3), and the file
    // must lie in one of the compiler's own system directories (a file of the
    // user's that says `#pragma GCC system_header` gets flag 3 too).
    // The markers are taken from the tokenizer's directives, never from the
    // text's lines: a line inside a raw string literal that looks like a
    // marker is part of a string, not a marker.
    let mut system = vec![false; text.lines().count() + 2];
    let mut in_system = false;
    let mut markers = directives.iter().peekable();
    for (line, slot) in system.iter_mut().enumerate() {
        while let Some((_, d)) = markers.next_if(|(l, _)| *l == line) {
            if let Some((file, flags)) = d
                .strip_prefix('#')
                .map(str::trim_start)
                .and_then(|rest| rest.split_once('"'))
                .and_then(|(num, r)| num.trim().chars().all(|c| c.is_ascii_digit()).then_some(r).and_then(|r| r.rsplit_once('"')))
            {
                in_system = flags.split_whitespace().any(|f| f == "3") && in_system_dir(file, system_dirs);
                // Entering a file (flag 1): only the system's headers may be included.
                if flags.split_whitespace().any(|f| f == "1") && !in_system_dir(file, system_dirs) {
                    return Err(format!(
                        "`{}` includes `{file}`, which is not in the compiler's system include directories: a kernel's text includes \
                         system headers only (put helper code in the preamble, or use `load_inline` for C++ of your own files)",
                        s.label
                    ));
                }
            }
        }
        *slot = in_system;
    }
    let own = |line: usize| !system.get(line).copied().unwrap_or(false);
    let toks: Vec<Tok<'_>> = all_toks.into_iter().filter(|t| own(t.line)).collect();
    let at = |t: &Tok<'_>| match user_line(ii_lines, s.lines.start + t.line - 1) {
        Some((f, l)) if f == s.label => format!("`{}` line {l}", s.label),
        _ => format!("`{}`", s.label),
    };
    for (line, d) in directives.iter().filter(|(line, _)| own(*line)) {
        let is_marker = d.trim_start_matches(['#', ' ', '\t']).starts_with(|c: char| c.is_ascii_digit());
        let body = d.strip_prefix('#').or_else(|| d.strip_prefix("%:")).unwrap_or(d).trim_start();
        let where_ = || at(&Tok { text: "", line: *line });
        if let Some(pragma) = body.strip_prefix("pragma") {
            if !pragma_allowed(pragma) {
                return Err(format!(
                    "{} has `{}`: a kernel's text may use the pragmas {} only (others can rename, alias or hide symbols)",
                    where_(),
                    d.trim(),
                    ALLOWED_PRAGMAS.iter().map(|p| format!("`#pragma {p}`")).collect::<Vec<_>>().join(", ")
                ));
            }
        } else if !is_marker && !body.starts_with("line") {
            return Err(format!("{} makes the directive `{}` after preprocessing", where_(), d.trim()));
        }
    }
    // A pragma's clauses are code the compiler compiles (`#pragma omp simd
    // if(...)` takes an expression, a lambda or a statement expression
    // included): its tokens are checked as the text's own.
    for (line, d) in directives.iter().filter(|(line, _)| own(*line)) {
        let body = d.strip_prefix('#').or_else(|| d.strip_prefix("%:")).unwrap_or(d).trim_start();
        if let Some(clauses) = body.strip_prefix("pragma") {
            let (ptoks, _) = tokens(clauses).map_err(|m| format!("`{}` has {m}", s.label))?;
            let ptoks: Vec<Tok<'_>> = ptoks.into_iter().map(|t| Tok { text: t.text, line: *line }).collect();
            for (i, t) in ptoks.iter().enumerate() {
                if let Some(why) = refused_token(s.label, &ptoks, i, private, false) {
                    return Err(format!("{} (in `{}`) {why}", at(t), d.trim()));
                }
            }
        }
    }
    let mut stack: Vec<&Tok<'_>> = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        let open = match t.text {
            "(" => Some(")"),
            "[" | "<:" => Some("]"),
            "{" | "<%" => Some("}"),
            _ => None,
        };
        let close = match t.text {
            ")" => Some(")"),
            "]" | ":>" => Some("]"),
            "}" | "%>" => Some("}"),
            _ => None,
        };
        if open.is_some() {
            stack.push(t);
        } else if let Some(c) = close {
            let matching = stack.pop().map(|o| {
                (
                    o,
                    if matches!(o.text, "(") {
                        ")"
                    } else if matches!(o.text, "[" | "<:") {
                        "]"
                    } else {
                        "}"
                    },
                )
            });
            match matching {
                Some((_, want)) if want == c => {}
                Some((o, _)) => {
                    return Err(format!(
                        "{} closes `{}` with `{}` after preprocessing: each fragment closes the brackets it opens, and no others",
                        at(t),
                        o.text,
                        t.text
                    ));
                }
                None => {
                    return Err(format!(
                        "{} closes a `{}` it did not open (after preprocessing): it would end the generated code around it",
                        at(t),
                        t.text
                    ));
                }
            }
        }
        // Only at file scope may a declarator be qualified (C++ refuses a
        // qualified definition in a block or a class, and out of the
        // namespaces enclosing what it defines; the preamble is the only
        // fragment at file scope).
        let file_scope = s.label == "preamble" && !stack.iter().any(|o| matches!(o.text, "{" | "<%"));
        if let Some(why) = refused_token(s.label, &toks, i, private, file_scope) {
            return Err(format!("{} {why}", at(t)));
        }
    }
    if let Some(o) = stack.pop() {
        return Err(format!("{} leaves `{}` open after preprocessing: it would take in the generated code after it", at(o), o.text));
    }
    Ok(())
}

/// Why token `i` of a fragment labelled `label` is refused, if it is
/// (`file_scope`: the token stands outside any braces of the preamble).
fn refused_token(label: &str, toks: &[Tok<'_>], i: usize, private: &std::collections::BTreeSet<&str>, file_scope: bool) -> Option<String> {
    let t = &toks[i];
    if NONLOCAL.contains(&t.text) {
        return Some(format!(
            "uses `{}`, which would jump out of its function past the generated code around it; throw an exception to end a call with an error",
            t.text
        ));
    }
    if THREAD_HOOKS.contains(&t.text) {
        return Some(format!(
            "uses `{}`, which would end the calling thread in the middle of a call or run code of the text's after the call              returned; throw an exception to end a call with an error",
            t.text
        ));
    }
    if FRAME_BUILTINS.contains(&t.text) || FRAME_BUILTIN_FAMILIES.iter().any(|f| t.text.starts_with(f)) {
        return Some(format!(
            "uses `{}`, which reads or rewrites the frames and return path around its function, past the generated code that called it: a kernel's text may not",
            t.text
        ));
    }
    // A computed `goto` jumps to any address taken with `&&label`, a label
    // of another fragment's function too.
    if t.text == "goto" && toks.get(i + 1).is_some_and(|n| n.text == "*") {
        return Some(
            "uses a computed `goto` (`goto *p`), which could jump into the code of another function: a kernel's text \
             may not (use a `switch`)"
                .to_string(),
        );
    }
    // The attributes that switch instrumentation off for a function: its
    // integer divisions would trap (SIGFPE) instead of being an error.
    let bare = t.text.trim_start_matches("__").trim_end_matches("__");
    if bare.starts_with("no_sanitize") || bare.starts_with("disable_sanitizer") {
        return Some(format!("uses `{}`, which would turn the integer-division check off: a kernel's text may not", t.text));
    }
    // The linker's names for the C library's divisions and their checked stand-ins.
    if t.text.starts_with("__real_") || t.text.starts_with("__wrap_") {
        return Some(format!("uses `{}`: names under `__real_` and `__wrap_` are the linker's, for the division check", t.text));
    }
    // GCC's complex integers divide without the check.
    if matches!(t.text, "__complex__" | "__complex" | "_Complex") {
        return Some(format!("uses `{}`: GCC's complex integer division is not checked for a zero divisor; use `std::complex`", t.text));
    }
    // GCC's vector types divide without the check (a zero lane traps): made by
    // `vector_size`, `ext_vector_type`, or a vector machine mode (`mode(V4SI)`).
    let vector_mode = bare == "mode"
        && toks.get(i + 1).is_some_and(|n| n.text == "(")
        && toks.get(i + 2).is_some_and(|m| {
            let m = m.text.trim_start_matches('_');
            m.starts_with('V') && m[1..].starts_with(|c: char| c.is_ascii_digit())
        });
    if matches!(bare, "vector_size" | "ext_vector_type") || vector_mode {
        return Some(format!(
            "uses `{}`: integer division on vector types is not checked for a zero divisor, so a kernel's text declares none \
             (write the lanes out; the compiler vectorises the loop)",
            t.text
        ));
    }
    if label != "preamble" && label != "operation" && ENDING.contains(&t.text) {
        return Some(format!(
            "uses `{}` (after preprocessing), which would end more than one element here; use `continue` in the operation to skip an element",
            t.text
        ));
    }
    // Every name under the prefix is the generated code's or its runtime's
    // (the runtime's global `dlbridge_divguard`, `dlbridge_errors`, ... too),
    // whether or not this source uses it, but for what documented macros
    // expand to.
    if t.text.starts_with("dlbridge") && t.text != "dlbridge" && !MACRO_TARGETS.contains(&t.text) {
        return Some(format!(
            "uses `{}`: names starting with `dlbridge` belong to the generated code and its runtime, not to the text",
            t.text
        ));
    }
    if private.contains(t.text) && !DOCUMENTED.contains(&t.text) {
        return Some(format!(
            "uses `{}`, a name of the generated code's own (a kernel's text may use `{}`)",
            t.text,
            DOCUMENTED.join("`, `")
        ));
    }
    if (t.text.starts_with('"') || t.text.contains("R\"")) && (t.text.contains(".incbin") || t.text.contains(".include")) {
        return Some("has an assembler `.incbin`/`.include`: a file read by the assembler is not part of what the kernel's cache entry is keyed on; use `#include`".to_string());
    }
    // Nothing is defined where the generated code or the libraries it
    // calls would find it: not in `std` (a specialisation of a container
    // the runtime uses), not with C linkage (a `memset` the compiler's own
    // calls bind to), not the global allocation functions, and no `asm`
    // at file scope or as a symbol name (which names any symbol, the
    // runtime's included).
    let next = |k: usize| toks.get(i + k).map_or("", |n| n.text);
    let prev = if i > 0 { toks[i - 1].text } else { "" };
    let refused: Option<String> = match t.text {
        "namespace" if prev == "using" && (next(1) == "std" || (next(1) == "::" && next(2) == "std")) => Some(
            "uses `using namespace std` (name `std`'s members qualified, or with using-declarations such as `using std::min;`)".to_owned(),
        ),
        // Past attributes (`namespace [[]] std`): `std`, and every name the
        // standard reserves to the implementation (`__cxxabiv1`, `__gnu_cxx`, `_V2`).
        "namespace" if prev != "using" => {
            let j = past_attributes(toks, i + 1);
            let j = if toks.get(j).is_some_and(|n| n.text == "::") { j + 1 } else { j };
            toks.get(j).map(|n| n.text).filter(|n| {
                let mut c = n.chars();
                *n == "std" || (c.next() == Some('_') && c.next().is_some_and(|d| d == '_' || d.is_ascii_uppercase()))
            })
            .map(|n| format!("opens the namespace `{n}`, which is the implementation's (the standard reserves `std` and names under `__` or `_` and a capital)"))
        }
        "extern" if next(1).contains('"') => Some(format!("gives a declaration a language linkage (`extern {}`)", next(1))),
        "operator" if matches!(next(1), "new" | "delete") => {
            Some("defines an allocation function (`operator new`/`operator delete`)".to_owned())
        }
        // Assembler text defines symbols and reads files no check sees (an
        // `asm` statement's `.globl`, `.incbin`, `.section`, an `asm` label).
        "asm" | "__asm" | "__asm__" => Some("uses `asm`: a CPU kernel's text may not hold assembler text".to_owned()),
        // The attributes whose argument goes to the assembler as a symbol or
        // section name (GCC pastes it in verbatim).
        a if SYMBOL_ATTRIBUTES.contains(&a.trim_start_matches("__").trim_end_matches("__"))
            && next(1) == "("
            && prev != "."
            && prev != "->" =>
        {
            Some(format!("uses the attribute `{a}`, whose argument the assembler reads as a symbol or section name"))
        }
        _ => None,
    };
    let refused = refused.or_else(|| if file_scope { defines_out_of_scope(toks, i) } else { None });
    if let Some(why) = refused {
        return Some(format!("{why}: a kernel's text may not define anything the generated code or the libraries it calls could bind to"));
    }
    // A class key, past any attributes, then a qualified name or `std`: a class
    // declared or specialised in a namespace or class the text cannot open.
    if matches!(t.text, "class" | "struct" | "union" | "enum") {
        let j = past_attributes(toks, i + 1);
        let k = if toks.get(j).is_some_and(|n| n.text == "::") { j + 1 } else { j };
        let qualified = toks.get(after_template_args(toks, k + 1)).is_some_and(|n| n.text == "::");
        if let Some(n) = toks.get(k).filter(|n| n.text == "std" || n.text == "dlbridge" || (is_name(n.text) && qualified)) {
            return Some(format!(
                "declares the class `{}...` by a qualified name (a kernel's text declares classes in its own scope, and none of \
                 `std` or `dlbridge`): a kernel's text may not define anything the generated code or the libraries it calls could \
                 bind to",
                n.text
            ));
        }
    }
    if t.text == "namespace"
        && let Some(n) = toks.get(past_attributes(toks, i + 1)).filter(|n| n.text.starts_with("dlbridge"))
    {
        return Some(format!("opens the namespace `{}`, which belongs to the generated code", n.text));
    }
    // The namespace `dlbridge` is named only to reach its public types
    // (`dlbridge::Raw`, `dlbridge::Size`, `dlbridge::Indexer`): not aliased,
    // not used whole, not entered (`dlbridge::detail`), so no text can
    // declare, specialise or overload anything the generated code calls.
    if t.text == "dlbridge" {
        // Before it (past a leading `::`): no `class`/`struct`/... declaring or
        // specialising one of its types.
        let before = if i > 0 && toks[i - 1].text == "::" { i.checked_sub(2) } else { i.checked_sub(1) };
        let declares = before.is_some_and(|b| matches!(toks[b].text, "class" | "struct" | "union" | "enum" | "friend"));
        let public =
            toks.get(i + 1).is_some_and(|n| n.text == "::") && toks.get(i + 2).is_some_and(|n| PUBLIC.contains(&n.text)) && !declares;
        // After the type (past its template arguments): no `::`, which only
        // names a member to define or specialise it out of its class.
        if public && toks.get(after_template_args(toks, i + 3)).is_some_and(|n| n.text == "::") {
            return Some(format!(
                "names a member of `dlbridge::{}` (`dlbridge::{}<...>::...`): a kernel's text may use dlbridge's types, not define or \
                 specialise their members",
                toks[i + 2].text,
                toks[i + 2].text
            ));
        }
        if !public {
            let what = match toks.get(i + 2) {
                Some(n) if toks[i + 1].text == "::" => format!("`dlbridge::{}`", n.text),
                _ => "the namespace `dlbridge` itself".to_owned(),
            };
            return Some(format!(
                "names {what}, which belongs to the generated code (a kernel's text may name `dlbridge::{}` only)",
                PUBLIC.join("`, `dlbridge::")
            ));
        }
    }
    None
}

/// The index just past the template arguments starting at `k` (`<` ...
/// `>`, nested, `>>` closing two), or `k` when there are none.
fn after_template_args(toks: &[Tok<'_>], k: usize) -> usize {
    if toks.get(k).is_none_or(|t| t.text != "<") {
        return k;
    }
    let mut depth = 0usize;
    let mut round = 0usize;
    for (j, t) in toks.iter().enumerate().skip(k) {
        match t.text {
            "(" | "[" | "{" | "<:" | "<%" => round += 1,
            ")" | "]" | "}" | ":>" | "%>" => round = round.saturating_sub(1),
            "<" if round == 0 => depth += 1,
            ">" if round == 0 => depth = depth.saturating_sub(1),
            ">>" if round == 0 => depth = depth.saturating_sub(2),
            ";" => return j,
            _ => {}
        }
        if depth == 0 {
            return j + 1;
        }
    }
    toks.len()
}

/// The index of the `)` closing the `(` at `k`, if it is one and closed.
fn closing_paren(toks: &[Tok<'_>], k: usize) -> Option<usize> {
    if toks.get(k)?.text != "(" {
        return None;
    }
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().skip(k) {
        match t.text {
            "(" => depth += 1,
            ")" => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

/// Keywords that start an expression or statement, not a declaration: a
/// qualified name after one is used, not declared.
const NOT_A_TYPE: [&str; 17] = [
    "return",
    "case",
    "throw",
    "else",
    "do",
    "sizeof",
    "alignof",
    "new",
    "delete",
    "typeid",
    "co_return",
    "co_yield",
    "co_await",
    "goto",
    "not",
    "compl",
    "using",
];

/// Why token `i`, the first of a qualified name (`E::out_of_range`,
/// `::std::logic_error::what`, `decltype(x)::f`, `W<int>::type::g`), is
/// refused as the declarator of a definition out of its class or namespace:
/// a function body, a `try` block, a qualifier only a declaration has
/// (`const`, `noexcept`, ...), or, where a declaration starts, a
/// constructor's initialisers, `= default`, a trailing return type or a
/// static member's initialiser; a destructor named at all; or a class
/// declared by a qualified name. What a qualified name's first part stands
/// for (`std`, an alias, a typedef, a `using`) is the compiler's to know, so
/// no qualified declarator is the text's: it defines functions and members
/// inside their class or namespace, where nothing of another can be reached.
/// A use of such a name (a call, `std::numeric_limits<T>::max()`) is none of
/// these.
fn defines_out_of_scope(toks: &[Tok<'_>], i: usize) -> Option<String> {
    let text = |k: usize| toks.get(k).map_or("", |t| t.text);
    let prev = if i > 0 { text(i - 1) } else { "" };
    let global = prev == "::" && (i < 2 || !(is_name(text(i - 2)) || matches!(text(i - 2), ">" | ")")));
    if !is_name(text(i)) || matches!(prev, "." | "->") || (prev == "::" && !global) {
        return None;
    }
    // A declarator may be parenthesised (`int (Foo::n) = 3;`, `void (std::X::f)() {}`).
    let first = if global { i - 1 } else { i };
    let parens = (0..first).rev().take_while(|&k| toks[k].text == "(").count();
    let mut names: Vec<&str> = vec![text(i)];
    let mut j = if text(i) == "decltype" { closing_paren(toks, i + 1).map_or(i + 1, |c| c + 1) } else { after_template_args(toks, i + 1) };
    let mut destructor = false;
    while text(j) == "::" {
        j += 1;
        if text(j) == "template" {
            j += 1;
        }
        if text(j) == "~" {
            destructor = true;
            j += 1;
        }
        if text(j) == "operator" {
            // The operator's own tokens up to its parameters (`operator()` has a
            // pair of its own first).
            names.push("operator");
            j += 1;
            if text(j) == "(" && text(j + 1) == ")" {
                j += 2;
            }
            while j < toks.len() && text(j) != "(" && text(j) != ";" {
                j += 1;
            }
            break;
        }
        if !is_name(text(j)) {
            return None;
        }
        names.push(text(j));
        j = after_template_args(toks, j + 1);
    }
    if names.len() < 2 {
        return None;
    }
    let qualified = names.join("::");
    if destructor {
        return Some(format!("names the destructor `{}::~{}`", names[..names.len() - 1].join("::"), names[names.len() - 1]));
    }
    // Past the parentheses around the declarator, if the qualified name is all they hold.
    let wrapped = parens > 0 && (0..parens).all(|p| text(j + p) == ")");
    if wrapped {
        j += parens;
    }
    let before_at = first.checked_sub(if wrapped { parens + 1 } else { 1 });
    let before = before_at.map_or("", text);
    if matches!(before, "class" | "struct" | "union" | "enum") {
        return Some(format!("declares the class `{qualified}` by a qualified name (declare a class inside its namespace)"));
    }
    // Where a declaration starts: the start, after `;`, `{`, `}`, a
    // template's `>`, or a type (a name that is not an expression's keyword)
    // which itself starts a declaration: `q::use (q::two);` and
    // `return q::use(q::two);` call a function.
    let typed = is_name(before) && !NOT_A_TYPE.contains(&before) && before_at.is_some_and(|b| type_starts_declaration(toks, b));
    let starts = typed || matches!(before, "" | ";" | "{" | "}" | ">" | "<%" | "%>");
    let why = || {
        format!(
            "defines `{qualified}` out of its class or namespace: a kernel's text defines functions and members inside their \
             class or namespace (`struct Foo {{ float f() const {{ ... }} }};`)"
        )
    };
    let Some(close) = closing_paren(toks, j) else {
        // A static member's definition: a type, the qualified name, then `=`, `{` or `;`.
        return (typed && matches!(text(j), "=" | "{" | "<%" | ";")).then(why);
    };
    // Past what may follow a declarator's parameters (attributes, cv- and
    // ref-qualifiers, an exception specification, `override`, `final`).
    let mut k = close + 1;
    loop {
        let before_k = k;
        k = past_attributes(toks, k);
        if matches!(text(k), "const" | "volatile" | "&" | "&&" | "override" | "final" | "mutable") {
            k += 1;
        } else if matches!(text(k), "noexcept" | "throw") {
            k = if text(k + 1) == "(" { closing_paren(toks, k + 1).map_or(k + 1, |c| c + 1) } else { k + 1 };
        }
        if k == before_k {
            break;
        }
    }
    let qualified_by = k > close + 1;
    let after = text(k);
    let defines = matches!(after, "{" | "<%" | "try")
        || (qualified_by && matches!(after, ";" | "=" | "->"))
        || (starts && matches!(after, ":" | "=" | "->"));
    defines.then(why)
}

/// Whether the type whose last name is token `k` (`float`, `q::Foo`,
/// `::std::size_t`) stands where a declaration starts: at the start, after
/// `;`, `{`, `}`, a template's `>`, or another word of a type (`const`,
/// `unsigned`, `static`). After anything else (`=`, `(`, `return`) it is a
/// function called in an expression.
fn type_starts_declaration(toks: &[Tok<'_>], mut k: usize) -> bool {
    let text = |k: usize| toks.get(k).map_or("", |t| t.text);
    while k >= 2 && text(k - 1) == "::" && is_name(text(k - 2)) {
        k -= 2;
    }
    if k >= 1 && text(k - 1) == "::" {
        k -= 1;
    }
    let b = if k == 0 { "" } else { text(k - 1) };
    matches!(b, "" | ";" | "{" | "}" | ">" | "<%" | "%>") || (is_name(b) && !NOT_A_TYPE.contains(&b))
}

/// The index past any attribute specifiers at `k` (`[[...]]`,
/// `__attribute__((...))`, `alignas(...)`, `__declspec(...)`).
fn past_attributes(toks: &[Tok<'_>], mut k: usize) -> usize {
    let text = |k: usize| toks.get(k).map_or("", |t| t.text);
    loop {
        if matches!(text(k), "[" | "<:") && matches!(text(k + 1), "[" | "<:") {
            // To the `]]` closing it.
            let mut depth = 0usize;
            let mut j = k;
            while j < toks.len() {
                match text(j) {
                    "[" | "<:" => depth += 1,
                    "]" | ":>" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            k = j + 1;
        } else if matches!(text(k), "__attribute__" | "__attribute" | "alignas" | "_Alignas" | "__declspec") && text(k + 1) == "(" {
            k = closing_paren(toks, k + 1).map_or(toks.len(), |c| c + 1);
        } else {
            return k;
        }
    }
}

/// Whether `w` is an identifier.
fn is_name(w: &str) -> bool {
    w.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || !c.is_ascii())
        && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || !c.is_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(text: &str) -> Vec<&str> {
        tokens(text).unwrap().0.into_iter().map(|t| t.text).collect()
    }

    #[test]
    fn digraphs_are_the_brackets_they_spell() {
        assert_eq!(toks("a <% b %> <:1:> %:"), ["a", "<%", "b", "%>", "<:", "1", ":>", "%:"]);
        assert_eq!(toks("std::vector<::x> v;"), ["std", "::", "vector", "<", "::", "x", ">", "v", ";"]);
        assert_eq!(toks("x<:::y:>"), ["x", "<:", "::", "y", ":>"]);
    }

    #[test]
    fn literals_and_numbers_are_one_token() {
        assert_eq!(
            toks(r#"u8"a}b" R"x(})x" 'q' 1'000'000 1e+5f 0x1p-3"#),
            [r#"u8"a}b""#, r#"R"x(})x""#, "'q'", "1'000'000", "1e+5f", "0x1p-3"]
        );
        assert_eq!(toks("#pragma x\n# 1 \"operation\"\nz"), ["z"]);
    }

    #[test]
    fn blanking_keeps_lines_and_marks() {
        let n = "0123456789abcdef0123456789abcdef";
        let src = format!("{HEADER}{n}\nA\n{}\n#line 1 \"op\"\nx;\ny;\n{}\nB\n", mark(n, "begin", "op"), mark(n, "end", "op"));
        let b = blanked(&src, n);
        assert_eq!(b.lines().count(), src.lines().count());
        assert!(!b.contains("x;") && b.contains("#line 1 \"op\"") && b.contains("\nB\n"), "{b}");
        assert_eq!(labels_of(&src, n), ["op"]);
        assert_eq!(nonce_of(&src), Some(n));
        assert!(!unmarked(&src).contains(n));
    }
}
