//! Scanning the C++ fragments a kernel carries (operation, preamble,
//! `loop_prep`, `after_loop`, map/reduce/post-map expressions) as the compiler
//! would read them: comments, string and character literals, line splices,
//! digraphs, brackets and directives. A fragment that would leave its place
//! in the generated code is refused here, before any compiler runs; the
//! compiler's own reading is checked again at build time
//! (`../builder/fragments.rs`).

use dlbridge_core::Result;

use super::{invalid, macro_clash, shortened};

pub(crate) fn check_text(kind: &str, name: &str, field: &str, text: &str, required: bool) -> Result<()> {
    if text.contains('\0') {
        return Err(invalid(format!("{kind} `{name}`: {field} contains a NUL character")));
    }
    if required && text.trim().is_empty() {
        return Err(invalid(format!("{kind} `{name}`: {field} is empty")));
    }
    let scanned = scan(text);
    if let Some((what, line)) = scanned.open {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} leaves {what} open (from line {line}): it would swallow the generated code after it"
        )));
    }
    if scanned.continued {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} ends in a backslash, which would continue its last line into the generated code"
        )));
    }
    // Each fragment stays where it is put: it closes what it opens and opens
    // nothing it leaves open (`}` would end the generated function and put
    // the rest of the text outside it; an open `#if 0` would swallow it).
    if let Some(why) = misplaced(&scanned.code) {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} {why}: each fragment must close the brackets and `#if`s it opens, and no others"
        )));
    }
    let code = scanned.code;
    // Line numbers are the generated code's: its `#line`s map diagnostics back,
    // and the preprocessor's line markers are how a build tells the system's
    // headers from the text (`# 1 "/usr/include/stdio.h" 3` would pass the
    // text's next lines off as the system's).
    if let Some(line) = code
        .lines()
        .map(str::trim_start)
        .find(|l| is_directive(l, "line") || l.strip_prefix('#').is_some_and(|r| r.trim_start().starts_with(|c: char| c.is_ascii_digit())))
    {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} sets line numbers (`{}`): a kernel's text may not (`#line` and `# N \"file\"` are the generated code's)",
            shortened(line.trim())
        )));
    }
    // Fragments inside the generated function hold statements or expressions:
    // a macro defined there would go on rewriting the generated code after it.
    if field != "preamble"
        && let Some(line) = code.lines().map(str::trim_start).find(|l| ["define", "undef", "include"].iter().any(|d| is_directive(l, d)))
    {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} has the directive `{}`, which belongs in the preamble (it would go on acting on the generated code after it)",
            shortened(line.trim())
        )));
    }
    // The preamble's macros act on everything after it: none may take a name the generated code uses.
    for line in code.lines().map(str::trim_start).filter(|l| is_directive(l, "define") || is_directive(l, "undef")) {
        let rest = line[1..].trim_start();
        let rest = rest.strip_prefix("define").or_else(|| rest.strip_prefix("undef")).unwrap_or(rest).trim_start();
        let macro_name: String = rest.chars().take_while(|&c| c.is_ascii_alphanumeric() || c == '_').collect();
        if let Some(why) = macro_clash(&macro_name) {
            return Err(invalid(format!("{kind} `{name}`: {field} (re)defines the macro `{}`, which {why}", shortened(&macro_name))));
        }
    }
    // `<iostream>` defines a static `std::ios_base::Init` whose constructor
    // runs when the library is loaded, which the ELF check refuses: say so here.
    if let Some(line) = code.lines().map(str::trim_start).find(|l| {
        is_directive(l, "include") && l[1..].trim_start()["include".len()..].trim().trim_matches(['<', '>', '"']).trim() == "iostream"
    }) {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} has `{}`: that header defines a static object whose constructor runs when the kernel's \
             library is loaded, which a kernel's text may not do; include `<ostream>`, `<istream>` or `<cstdio>` instead",
            shortened(line.trim())
        )));
    }
    // Headers come before the text's own macros: a macro defined (or a
    // header's macro undefined) before an `#include` would be expanded on
    // the header's lines, which the build's checks leave to the system.
    let mut macro_line = None;
    for line in code.lines().map(str::trim_start) {
        if is_directive(line, "define") || is_directive(line, "undef") {
            macro_line.get_or_insert(line);
        } else if let Some(first) = macro_line
            && ["include", "include_next", "import"].iter().any(|d| is_directive(line, d))
        {
            return Err(invalid(format!(
                "{kind} `{name}`: {field} has `{}` after `{}`: a kernel's text includes its headers before it defines or \
                 undefines any macro (a macro would act on the header's own lines); move the `#include` up",
                shortened(line.trim()),
                shortened(first.trim())
            )));
        }
    }
    // `loop_prep`, `after_loop` and the expressions run in functions that
    // serve many elements: a `return` there would end more than one. The
    // operation runs in a function of its own per element, where a `return`
    // ends that element only. (What macros make of a text is checked after
    // preprocessing, when the library is built: see `fragments`.)
    if field != "preamble" && field != "operation" && has_word(&code, "return") {
        return Err(invalid(format!(
            "{kind} `{name}`: {field} uses `return`, which would end more than one element here; use `continue` in the operation to skip an element"
        )));
    }
    Ok(())
}

/// Whether `line` (code only, leading spaces trimmed) is the preprocessor
/// directive `name` (`#define`, `# define`, ...).
pub(crate) fn is_directive(line: &str, name: &str) -> bool {
    line.strip_prefix('#').is_some_and(|rest| {
        rest.trim_start().strip_prefix(name).is_some_and(|r| !r.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
    })
}

/// `text` as the compiler's tokenizer sees it: lines ending in a backslash
/// joined to the next (`ret\` + newline + `urn` is `return`, and a `//`
/// comment so continued goes on), then comments and string / character
/// literals blanked out (each replaced by a space; newlines inside a block
/// comment or raw string kept, so lines still count), so a word in them is not
/// taken for code. Unterminated ones end the text.
#[cfg(test)]
pub(crate) fn code_only(text: &str) -> String {
    scan(text).code
}

/// What [`scan`] found.
pub(crate) struct Scanned {
    /// The code, as [`code_only`] returns it.
    pub code: String,
    /// A comment or literal still open at the end of the text, and the line it opened on.
    pub open: Option<(&'static str, usize)>,
    /// Whether the last line ends in a backslash (continued into whatever follows).
    pub continued: bool,
}

/// Joins continued lines (a backslash, optionally spaces, then a newline: GCC
/// and Clang splice those too), then blanks comments and literals.
pub(crate) fn scan(text: &str) -> Scanned {
    // Phase 1, as GCC and Clang read a file: `\r\n` and a lone `\r` each end a line.
    let chars: Vec<char> = text.replace("\r\n", "\n").replace('\r', "\n").chars().collect();
    // Splice, remembering each kept character's line.
    let (mut joined, mut lines) = (Vec::with_capacity(chars.len()), Vec::with_capacity(chars.len()));
    let (mut k, mut line) = (0, 1);
    let mut continued = false;
    while k < chars.len() {
        if chars[k] == '\\' {
            let mut e = k + 1;
            // GCC splices past any horizontal space: blanks, tabs, form feeds, vertical tabs.
            while e < chars.len() && matches!(chars[e], ' ' | '\t' | '\x0b' | '\x0c') {
                e += 1;
            }
            if e < chars.len() && chars[e] == '\r' && chars.get(e + 1) == Some(&'\n') {
                e += 1;
            }
            if e < chars.len() && chars[e] == '\n' {
                // A splice with nothing after it but blanks joins the text's
                // last line to the generated code's next one.
                if chars[e + 1..].iter().all(|c| c.is_whitespace()) {
                    continued = true;
                    break;
                }
                k = e + 1;
                line += 1;
                continue;
            }
            if e == chars.len() {
                continued = true;
                break;
            }
        }
        joined.push(chars[k]);
        lines.push(line);
        if chars[k] == '\n' {
            line += 1;
        }
        k += 1;
    }
    // Identifier characters as GCC lexes them: `$` and any non-ASCII letter too.
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$' || !c.is_ascii();
    let mut out = String::with_capacity(joined.len());
    let mut open = None;
    // The token the last kept characters belong to: a `'` continues a
    // preprocessing number (`1'000`, `0x1'f`) only, and only when an
    // identifier character follows it; after an identifier it opens a
    // character literal (`sizeof'"'`).
    #[derive(PartialEq)]
    enum Tok {
        Other,
        Ident,
        Number,
    }
    let mut tok = Tok::Other;
    let mut k = 0;
    while k < joined.len() {
        let c = joined[k];
        let next = joined.get(k + 1).copied();
        let prev = if k > 0 { joined[k - 1] } else { ' ' };
        tok = match (&tok, c) {
            (Tok::Number, c) if ident(c) || c == '.' || c == '\'' => Tok::Number,
            (Tok::Number, '+' | '-') if matches!(prev, 'e' | 'E' | 'p' | 'P') => Tok::Number,
            (Tok::Ident, c) if ident(c) => Tok::Ident,
            (_, c) if c.is_ascii_digit() => Tok::Number,
            (_, '.') if next.is_some_and(|d| d.is_ascii_digit()) => Tok::Number,
            (_, c) if ident(c) => Tok::Ident,
            _ => Tok::Other,
        };
        match c {
            '/' if next == Some('/') => {
                while k < joined.len() && joined[k] != '\n' {
                    k += 1;
                }
                continue;
            }
            '/' if next == Some('*') => {
                let at = lines[k];
                k += 2;
                out.push(' ');
                loop {
                    if k >= joined.len() {
                        open = Some(("a `/*` comment", at));
                        break;
                    }
                    if joined[k] == '*' && joined.get(k + 1) == Some(&'/') {
                        k += 2;
                        break;
                    }
                    if joined[k] == '\n' {
                        out.push('\n');
                    }
                    k += 1;
                }
                continue;
            }
            '"' | '\'' => {
                // The identifier just before: a literal's prefix (u8, u, U, L, R, u8R, ...)
                // goes with the literal; any other stays code.
                let mut b = out.len();
                while b > 0 && out[..b].ends_with(ident) {
                    b -= out[..b].chars().next_back().map_or(1, char::len_utf8);
                }
                let before = &out[b..];
                let raw = c == '"' && matches!(before, "R" | "u8R" | "uR" | "UR" | "LR");
                if !raw && !matches!(before, "u8" | "u" | "U" | "L") {
                    b = out.len();
                }
                if c == '\'' && tok == Tok::Number && next.is_some_and(ident) {
                    out.push(c);
                    k += 1;
                    continue;
                }
                tok = Tok::Other;
                let at = lines[k];
                out.truncate(b);
                out.push(' ');
                k += 1;
                if raw {
                    // R"delim( ... )delim"
                    let d: String = joined[k..].iter().take_while(|&&x| x != '(').collect();
                    let close: Vec<char> = format!("){d}\"").chars().collect();
                    k += d.chars().count() + 1;
                    loop {
                        if k >= joined.len() {
                            open = Some(("a raw string literal", at));
                            break;
                        }
                        if joined[k..].starts_with(&close) {
                            k += close.len();
                            break;
                        }
                        if joined[k] == '\n' {
                            out.push('\n');
                        }
                        k += 1;
                    }
                    continue;
                }
                let mut escaped = false;
                loop {
                    if k >= joined.len() || joined[k] == '\n' {
                        open = Some((if c == '"' { "a string literal" } else { "a character literal" }, at));
                        break;
                    }
                    let d = joined[k];
                    k += 1;
                    if !escaped && d == c {
                        break;
                    }
                    escaped = !escaped && d == '\\';
                }
                continue;
            }
            c => out.push(c),
        }
        k += 1;
        if open.is_some() {
            break;
        }
    }
    Scanned { code: digraphs_spelled_out(&out), open, continued }
}

/// `code` (comments and literals blanked) with each digraph replaced by the
/// token it is (`<%` `{`, `%>` `}`, `<:` `[`, `:>` `]`, `%:` `#`), so that
/// brackets and directives are seen whichever way they are spelled. `<::`
/// not followed by `:` or `>` is `<` then `::`, as the compiler reads it.
pub(crate) fn digraphs_spelled_out(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut k = 0;
    while k < b.len() {
        let two = &b[k..b.len().min(k + 2)];
        let rep = match two {
            b"<%" => Some('{'),
            b"%>" => Some('}'),
            b"<:" if b.get(k + 2) != Some(&b':') || matches!(b.get(k + 3), Some(b':' | b'>')) => Some('['),
            b":>" => Some(']'),
            b"%:" => Some('#'),
            _ => None,
        };
        match rep {
            Some(c) => {
                out.push(c);
                k += 2;
            }
            None => {
                let ch = code[k..].chars().next().unwrap_or(' ');
                out.push(ch);
                k += ch.len_utf8();
            }
        }
    }
    out
}

/// Why `code` (from [`scan`]) cannot stay where it is put: a bracket closed
/// that it did not open, or one left open, or a preprocessor conditional not
/// closed in it (each would carry the text out of its place, or the generated
/// code after it into the user's).
pub(crate) fn misplaced(code: &str) -> Option<String> {
    let mut stack: Vec<(char, usize)> = Vec::new();
    let mut conds: Vec<usize> = Vec::new();
    for (n, l) in code.lines().enumerate() {
        let line = n + 1;
        let t = l.trim_start();
        if ["if", "ifdef", "ifndef"].iter().any(|d| is_directive(t, d)) {
            conds.push(line);
        } else if ["elif", "else", "elifdef", "elifndef"].iter().any(|d| is_directive(t, d)) && conds.is_empty() {
            return Some(format!("has `{}` on line {line} without its `#if`", t.trim_end()));
        } else if is_directive(t, "endif") && conds.pop().is_none() {
            return Some(format!("has `#endif` on line {line} without its `#if`"));
        }
        for c in l.chars() {
            match c {
                '(' | '[' | '{' => stack.push((c, line)),
                ')' | ']' | '}' => {
                    let want = match c {
                        ')' => '(',
                        ']' => '[',
                        _ => '{',
                    };
                    match stack.pop() {
                        Some((o, _)) if o == want => {}
                        Some((o, at)) => return Some(format!("closes `{o}` (line {at}) with `{c}` on line {line}")),
                        None => return Some(format!("closes a `{c}` on line {line} that it did not open")),
                    }
                }
                _ => {}
            }
        }
    }
    if let Some((o, at)) = stack.pop() {
        return Some(format!("leaves the `{o}` of line {at} open"));
    }
    conds.pop().map(|at| format!("leaves the `#if` of line {at} open (no `#endif`)"))
}

/// Whether `word` appears in `text` as a whole identifier.
pub(crate) fn has_word(text: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}
