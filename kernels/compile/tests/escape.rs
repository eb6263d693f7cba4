//! Source text cannot escape its function: a generated corpus of spellings
//! (digraphs, line splices, macros that paste or stringise, directives spelled
//! `%:`) of the ways a kernel's text could close the generated function, run
//! code when its library is loaded, end more than its own element or rewrite
//! the generated code. Each is refused with an error naming what was wrong, or
//! (where the text is legitimate C++) runs and gives the right result; none
//! runs code at load.

mod common;

use dlbridge_array::Array;
use dlbridge_compile::{ElementwiseKernel, ElementwiseOptions};
use dlbridge_registry::Registry;

/// What code run at load would set.
const FLAG: &str = "DLBRIDGE_ESCAPE_RAN";

/// The refusal of a text that defines something the generated code or the
/// libraries it calls could bind to (C linkage, `asm`, `std`): made before
/// the ELF check, which stays behind it.
const REFUSED_TEXT: &str = "may not define anything the generated code or the libraries it calls could bind to";

/// Builds and calls `name` (`T x` -> `T z` over 1000 f32 elements); the
/// error text, or the output.
fn attempt(name: &str, operation: &str, preamble: &str, loop_prep: &str) -> Result<Vec<f32>, String> {
    let opts = ElementwiseOptions { preamble: preamble.into(), loop_prep: loop_prep.into(), ..Default::default() };
    let reg = Registry::new();
    let k = ElementwiseKernel::new("T x", "T z", operation, name, opts).map_err(|e| e.to_string())?;
    let kernel = k.register(&reg).map_err(|e| e.to_string())?;
    let x = Array::from_slice(&(0..1000).map(|i| i as f32).collect::<Vec<_>>(), &[1000]).unwrap();
    let out = common::run(&kernel, &[&x]).map_err(|e| e.to_string())?;
    Ok(out[0].to_vec::<f32>().unwrap())
}

fn ran_at_load() -> bool {
    std::env::var_os(FLAG).is_some()
}

/// Ways to write `{` and `}`.
const BRACES: [(&str, &str); 4] = [("{", "}"), ("<%", "%>"), ("<\\\n%", "%\\\n>"), ("LB", "RB")];

/// What would run at load, once outside the function.
fn loaders() -> Vec<String> {
    let set = format!("setenv(\"{FLAG}\", \"1\", 1);");
    vec![
        format!("__attribute__((constructor)) static void dlb_escape() {{ {set} }}"),
        format!("static struct Escape {{ Escape() {{ {set} }} }} dlb_escape_obj;"),
        format!(
            "static void dlb_escape2() {{ {set} }} __attribute__((section(\".init_array\"), used)) static void (*dlb_p)() = dlb_escape2;"
        ),
    ]
}

#[test]
fn closing_the_function_with_any_spelling_of_a_brace_is_refused_and_runs_nothing() {
    let mut cases = 0;
    for (k, (open, close)) in BRACES.iter().enumerate() {
        let preamble = "#include <cstdlib>\n#define LB {\n%:define RB }\n";
        for (l, loader) in loaders().iter().enumerate() {
            // Close the lambda, the function and its namespace, add the loader,
            // reopen as many.
            let loader = loader.replace('{', open).replace('}', close);
            let op =
                format!("z = x; ; {close} ; {close} {close}\n{loader}\nnamespace {open} void f() {open} auto g = [&]() {open} do {open} ");
            let name = format!("escape_{k}_{l}");
            let r = attempt(&name, &op, preamble, "");
            cases += 1;
            let e = r.expect_err(&format!("{name} built and ran"));
            assert!(e.contains(&name) && (e.contains("close") || e.contains("open")), "{name}: {e}");
            assert!(!ran_at_load(), "{name}: code ran at load");
        }
    }
    assert_eq!(cases, BRACES.len() * 3);
}

#[test]
fn code_in_the_preamble_that_would_run_at_load_is_refused_before_the_library_is_opened() {
    for (l, loader) in loaders().iter().enumerate() {
        for spelled in [loader.clone(), loader.replace('{', "<%").replace('}', "%>")] {
            let name = format!("loader_{l}_{}", spelled.len());
            let e = attempt(&name, "z = x", &format!("#include <cstdlib>\n{spelled}"), "").expect_err(&name);
            // A `section` attribute is refused in the text; the others by the ELF check.
            let says = if spelled.contains("section(") { "uses the attribute `section`" } else { "may not run when its library is loaded" };
            assert!(e.contains(says), "{name}: {e}");
            assert!(!ran_at_load(), "{name}: code ran at load");
        }
    }
    // The same through `asm` adding an entry of its own.
    let asm = "extern \"C\" void dlb_asm_escape() {}\nasm(\".pushsection .init_array,\\\"aw\\\"\\n.quad dlb_asm_escape\\n.popsection\");";
    let e = attempt("loader_asm", "z = x", asm, "").expect_err("asm");
    assert!(e.contains("may not run when its library is loaded") || e.contains(REFUSED_TEXT), "{e}");
}

#[test]
fn a_pasted_or_spliced_return_in_loop_prep_is_refused_after_preprocessing() {
    let pastes = [
        ("#define J(a, b) a##b", "J(ret, urn);"),
        ("%:define J(a, b) a%:%:b", "J(ret, urn);"),
        ("#define R return", "if (1) R;"),
        ("#define E(...) __VA_ARGS__", "E(return);"),
        ("#define J(a, b) a##b\n#define K J(co_, return)", "K;"),
    ];
    for (k, (preamble, prep)) in pastes.iter().enumerate() {
        let name = format!("paste_{k}");
        let e = attempt(&name, "z = x", preamble, prep).expect_err(&name);
        assert!(e.contains("loop_prep") && e.contains("return"), "{name}: {e}");
    }
}

#[test]
fn a_return_in_the_operation_ends_its_own_element_only() {
    for (k, (preamble, op)) in [
        ("", "z = 1; if (x >= 0) return; z = 2;"),
        ("#define J(a, b) a##b", "z = 1; J(ret, urn); z = 2;"),
        ("#define BAIL return", "z = 1; if (i % 2) BAIL; z = 2;"),
    ]
    .iter()
    .enumerate()
    {
        let z = attempt(&format!("early_{k}"), op, preamble, "").unwrap();
        assert_eq!(z.len(), 1000);
        for (i, v) in z.iter().enumerate() {
            let want = if k == 2 && i % 2 == 0 { 2.0 } else { 1.0 };
            assert_eq!(*v, want, "early_{k}: element {i}");
        }
    }
}

#[test]
fn a_macro_named_like_generated_code_is_refused_naming_it() {
    for (k, (preamble, token)) in [
        ("#define for_runs(...) size", "for_runs"),
        ("#define parallel_chunks(...) (void)0", "parallel_chunks"),
        ("%:define parallel_chunks(...) (void)0", "parallel_chunks"),
        ("#define dlbridge_body(...) (void)0", "dlbridge_body"),
        ("#define J(a, b) a##b\n#define chunks_for(...) 0", "chunks_for"),
        ("#define init(...) init(0, nullptr, nullptr)", "init"),
    ]
    .iter()
    .enumerate()
    {
        let name = format!("hijack_{k}");
        let e = attempt(&name, "z = x", preamble, "").expect_err(&name);
        let said = e.contains(&format!("its macro `{token}` rewrites the generated code")) || e.contains("(re)defines the macro");
        assert!(said && e.contains(&format!("`{token}`")), "{name}: {e}");
    }
}

#[test]
fn legitimate_macros_digraphs_and_raw_strings_still_work() {
    let z = attempt(
        "legit",
        "int a<:2:> = <%1, 2%>; const char* s = R\"x(}}} return %> )x\"; z = TWICE(x) + a<:1:> + (s[0] == '}' ? 0 : 100);",
        "#define TWICE(v) ((v) * 2)\nnamespace mine { inline float one() { return 1; } }",
        "float unused = mine::one(); (void)unused;",
    )
    .unwrap();
    assert!(z.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32 + 2.0), "{:?}", &z[..4]);
}

#[test]
fn a_function_resolved_at_load_or_an_executable_stack_is_refused_before_the_library_is_opened() {
    let ifunc = "extern \"C\" { static void dlb_impl(void) {} static void* dlb_resolver(void) { setenv(\"DLBRIDGE_ESCAPE_RAN\", \"1\", 1); return (void*)&dlb_impl; } }\n\
                 static void dlb_f(void) __attribute__((ifunc(\"dlb_resolver\")));\n\
                 __attribute__((used)) static void (*volatile dlb_ptr)(void) = &dlb_f;";
    let asm_ifunc = "extern \"C\" void* dlb_res2(void) { return 0; }\n\
                     asm(\".type dlb_if2, @gnu_indirect_function\\n.set dlb_if2, dlb_res2\\n.section .data.rel\\n.quad dlb_if2\\n.text\");";
    for (k, pre) in [ifunc, asm_ifunc].iter().enumerate() {
        let name = format!("ifunc_{k}");
        let e = attempt(&name, "z = x", &format!("#include <cstdlib>\n{pre}"), "").expect_err(&name);
        assert!(e.contains("resolved at load (an IFUNC") || e.contains(REFUSED_TEXT), "{name}: {e}");
        assert!(!ran_at_load(), "{name}: the resolver ran");
    }
    let e = attempt("exec_stack", "z = x", "asm(\".section .note.GNU-stack,\\\"x\\\",@progbits\\n.text\");", "").expect_err("exec stack");
    assert!(e.contains("asks for an executable stack") || e.contains(REFUSED_TEXT), "{e}");
}

#[test]
fn the_generated_code_cannot_be_overloaded_aliased_or_skipped_from_the_text() {
    // A global function that would win overload resolution against the runtime's.
    let z = attempt(
        "hj_base_of",
        "z = x + 1",
        "static float dlb_scratch[1 << 16];\ninline void* base_of(DLTensor*) { return dlb_scratch; }",
        "",
    )
    .expect("an unrelated global is fine: the generated code calls the runtime by its full name");
    assert!(z.iter().enumerate().all(|(i, &v)| v == i as f32 + 1.0));
    for (k, pre) in
        ["namespace dlbx = dlbridge;", "using namespace dlbridge;", "using dlbridge::detail::Walk;", "namespace dlbx = ::dlbridge;"]
            .iter()
            .enumerate()
    {
        let name = format!("alias_{k}");
        let e = attempt(&name, "z = x", pre, "").expect_err(&name);
        assert!(e.contains("which belongs to the generated code"), "{name}: {e}");
    }
    // loop_prep may not jump past the loop, nor move the chunk's bounds.
    let e = attempt("computed_goto", "z = x", "", "void* dlb_p = &&dlb_skip; goto *dlb_p; dlb_skip:;").expect_err("goto");
    assert!(e.contains("loop_prep") && e.contains("`goto`"), "{e}");
    let e = attempt("end_assign", "z = x", "", "_end = _begin;").expect_err("_end");
    assert!(e.contains("`loop_prep` line 1 uses `_end`"), "{e}");
    attempt("uses_public_size", "dlbridge::Size s(3); z = x + (T)s.size();", "", "").expect("dlbridge::Size is public");
}

#[test]
fn hooks_the_c_runtime_calls_at_load_and_writable_code_are_refused() {
    let cases = [
        (
            "gmon",
            "#include <cstdlib>\nextern \"C\" void __gmon_start__(void) { setenv(\"DLBRIDGE_ESCAPE_RAN\", \"1\", 1); }",
            "`__gmon_start__`",
        ),
        (
            "itm",
            "#include <cstdlib>\nextern \"C\" void _ITM_registerTMCloneTable(void*, unsigned long) { setenv(\"DLBRIDGE_ESCAPE_RAN\", \"1\", 1); }\n\
             asm(\".pushsection .tm_clone_table,\\\"aw\\\",@progbits\\n .quad 0,0\\n .popsection\");",
            "TMCloneTable",
        ),
        ("wx", "asm(\".pushsection .wtext,\\\"awx\\\",@progbits\\n nop\\n .popsection\");", "both writable and executable"),
    ];
    for (name, pre, says) in cases {
        let e = attempt(name, "z = x", pre, "").expect_err(name);
        assert!(e.contains(says) || e.contains(REFUSED_TEXT), "{name}: {e}");
        assert!(!ran_at_load(), "{name}: ran at load");
    }
}

#[test]
fn the_texts_may_not_name_the_generated_codes_own_names() {
    let cases = [
        (
            "hj_chunk",
            "template <bool B, class W, class D, class T, class I> void dlbridge_chunk(W& w, D d, T t, I& ind, long b, long e) {}",
            "z = x",
            "",
            "`dlbridge_chunk`",
        ),
        (
            "hj_raw",
            "template <> class dlbridge::Raw<const float> { public: Raw(DLTensor*, const char*) {} };",
            "z = x",
            "",
            "`dlbridge::Raw`",
        ),
        ("cc_end", "", "z = x", "const_cast<ptrdiff_t&>(_end) = _begin;", "`_end`"),
        ("cc_data", "", "z = x", "const_cast<void**>(_data)[1] = const_cast<void**>(_data)[0];", "`_data`"),
        ("op_w", "", "z = x + (T)_w.size", "", "`_w`"),
        ("incbin", "asm(\".pushsection .rodata\\nincb_d: .incbin \\\"/etc/hostname\\\"\\n.popsection\");", "z = x", "", "`.incbin`"),
    ];
    for (name, pre, op, prep, says) in cases {
        let e = attempt(name, op, pre, prep).expect_err(name);
        assert!(e.contains(says) || e.contains(REFUSED_TEXT), "{name}: {e}");
    }
    // The documented names and a leading `::` stay usable.
    attempt("doc_names", "z = x + (T)_ind.size() * 0", "typedef ::dlbridge::Size dlb_size_t;", "").expect("documented names");
}

#[test]
fn nothing_is_defined_where_the_generated_code_or_its_libraries_would_bind_to_it() {
    let cases = [
        ("op_amp", "const DLBridgePlugin* operator&(const DLBridgePlugin& p) { return __builtin_addressof(p); }", "z = x * 2", ""),
        ("asm_label", "extern __thread const DLBridgeCpuContext* my_ctx asm(\"_ZN8dlbridge6detail9t_contextE\");", "z = x", ""),
        ("asm_label_op", "", "{ extern int dlb_y asm(\"errno\"); (void)dlb_y; } z = x", ""),
        ("libc_memset", "#include <cstring>\nextern \"C\" void* memset(void* p, int, std::size_t) { return p; }", "z = 0", ""),
        (
            "std_ns",
            "#include <exception>\nnamespace std { exception_ptr current_exception() noexcept { return exception_ptr(); } }",
            "z = x",
            "",
        ),
        ("std_spec", "#include <vector>\ntemplate <> class std::vector<float*> {};", "z = x", ""),
        ("op_new", "#include <cstdlib>\nvoid* operator new(std::size_t n) { return std::malloc(n); }", "z = x", ""),
    ];
    for (name, pre, op, prep) in cases {
        match attempt(name, op, pre, prep) {
            Err(e) => assert!(e.contains("may not define anything") || e.contains("which belongs to the generated code"), "{name}: {e}"),
            Ok(z) => {
                // The `&` of a class is not the generated code's any more: it still runs as written.
                assert_eq!(name, "op_amp", "{name} was accepted");
                assert!(z.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32), "{name}: {:?}", &z[..4]);
            }
        }
    }
    // Not even an empty `asm` statement: assembler text is refused whole.
    let e = attempt("asm_stmt", "asm volatile(\"\" ::: \"memory\"); z = x", "", "").expect_err("an asm statement");
    assert!(e.contains("`operation` line 1 uses `asm`"), "{e}");
}

/// Defines `_setjmp` (which the generated code calls before any element runs)
/// to set [`FLAG`]: the text's code would run outside its element.
fn setjmp_hijacks(dir: &std::path::Path) -> Vec<(&'static str, String, String, &'static str)> {
    let set = "#include <cstdlib>\n\
               __attribute__((used, noinline)) void dlb_mark() { setenv(\"DLBRIDGE_ESCAPE_RAN\", \"1\", 1); }\n";
    let body = ".globl _setjmp\\n.type _setjmp,@function\\n_setjmp:\\n push %rdi\\n call _Z8dlb_markv@PLT\\n pop %rdi\\n xor %esi, %esi\\n jmp __sigsetjmp@PLT";
    let header = dir.join("dlb_hidden.h");
    std::fs::write(&header, "#pragma GCC system_header\nextern \"C\" int dlb_hidden(void) { return 1; }\n").unwrap();
    vec![
        (
            "hj_asm_op",
            set.to_owned(),
            format!(
                "asm volatile(\".ifndef dlb_once\\n.set dlb_once, 1\\n.pushsection .text.dlbhj,\\\"ax\\\",@progbits\\n{body}\\n.popsection\\n.endif\" ::: \"memory\");\nz = x * 2"
            ),
            "uses `asm`",
        ),
        (
            "hj_section",
            format!("{set}__attribute__((section(\".text.dlbhj,\\\"ax\\\",@progbits\\n{body}\\n#\"))) void dlb_carrier() {{}}\n"),
            "z = x * 2".to_owned(),
            "uses the attribute `section`",
        ),
        (
            "hj_section_spelt",
            format!("{set}[[gnu::__section__(\".text.dlbhj,\\\"ax\\\",@progbits\\n{body}\\n#\")]] void dlb_carrier() {{}}\n"),
            "z = x * 2".to_owned(),
            "uses the attribute `__section__`",
        ),
        ("hj_pragma_weak", format!("{set}#pragma weak _setjmp = _Z8dlb_markv\n"), "z = x * 2".to_owned(), "has `#pragma weak"),
        ("hj_pragma_pasted", format!("{set}_Pragma(\"weak _setjmp = _Z8dlb_markv\")\n"), "z = x * 2".to_owned(), "has `#pragma weak"),
        (
            "hj_system_header",
            format!("#include \"{}\"\n", header.display()),
            "z = x * (T)dlb_hidden()".to_owned(),
            "which is not in the compiler's system include directories",
        ),
        (
            "hj_line_marker",
            "# 1 \"/usr/include/stdio.h\" 3\nnamespace q { inline int f() { int r; __asm__(\"mov $7, %0\" : \"=r\"(r)); return r; } }\n"
                .to_owned(),
            "z = x + (T)q::f()".to_owned(),
            "sets line numbers",
        ),
        ("hj_line_digraph", "%:line 1 \"/usr/include/stdio.h\"\n".to_owned(), "z = x".to_owned(), "sets line numbers"),
        (
            "hj_global",
            "int stderr_copy = 0;\n".to_owned(),
            "z = x * 2".to_owned(),
            "defines `stderr_copy` under a name outside C++'s mangling",
        ),
    ]
}

#[test]
fn the_text_cannot_define_a_symbol_the_generated_code_or_its_libraries_call() {
    let dir = tempfile::tempdir().unwrap();
    for (name, pre, op, says) in setjmp_hijacks(dir.path()) {
        let e = attempt(name, &op, &pre, "").expect_err(name);
        assert!(e.contains(says), "{name}: {e}");
        assert!(!ran_at_load(), "{name}: the text's code ran");
    }
    // Globals in a namespace, or of internal linkage, are the text's own.
    let z = attempt(
        "ns_global",
        "k::calls += 1; z = x * 2 + (T)k::table[0] + (T)one",
        "namespace k { int calls = 0; float table[2] = {0, 0}; }\nstatic int one = 0;",
        "",
    )
    .expect("namespaced globals");
    assert!(z.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32), "{:?}", &z[..4]);
}

/// `x * 2` for the inputs [`attempt`] passes.
fn doubled(z: &[f32]) -> bool {
    z.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32)
}

#[test]
fn a_line_marker_inside_a_raw_string_is_part_of_the_string() {
    // The preprocessor keeps a raw string's lines as they are: one that reads
    // like a system header's line marker must not hide what follows it.
    let marker = "R\"dlb(\n# 1 \"/usr/include/stdio.h\" 3\n)dlb\"";
    let cases = [
        ("rs_asm", format!("static const char* dlb_s = {marker};\n__asm__(\".pushsection .rodata\\n.popsection\");"), "", "uses `asm`"),
        ("rs_return", String::new(), "const char* s = R\"dlb(\n# 1 \"/usr/include/stdio.h\" 3\n)dlb\"; (void)s; return;", "uses `return`"),
    ];
    for (name, pre, prep, says) in cases {
        let e = attempt(name, "z = x * 2", &pre, prep).expect_err(name);
        assert!(e.contains(says), "{name}: {e}");
    }
    // The string itself is fine, marker-like line and all.
    let z = attempt("rs_ok", &format!("z = x * 2 + (T)({marker}[1] == '#' ? 0 : 1)"), "", "").expect("a raw string");
    assert!(doubled(&z), "{:?}", &z[..4]);
}

/// The identifiers of the generated code between the end of `loop_prep` and
/// the end of its function that a declaration in `loop_prep` could stand in
/// for: not a keyword, not under `_` or `dlbridge`, not after `::`, `.` or `->`.
fn shadowable_after_loop_prep() -> Vec<String> {
    let spec =
        dlbridge_compile::ElementwiseSpec::new("T x, raw float32 r, int64 s", "T z", "z = x", "k", "", "int dlb_prep = 0;", "(void)0")
            .unwrap();
    let src = dlbridge_compile::internals::elementwise_cpp(&spec, &[('T', dlbridge_core::DType::F32)]).unwrap();
    let end_of_prep = src.lines().position(|l| l.contains("dlbridge_fragment") && l.ends_with("end loop_prep")).unwrap();
    let lines: Vec<&str> = src.lines().collect();
    let end_of_function = (end_of_prep..lines.len()).find(|&n| lines[n] == "}").unwrap();
    let text: String = lines[end_of_prep + 1..end_of_function]
        .iter()
        .filter(|l| !l.starts_with('#') && !l.contains("dlbridge_fragment"))
        .map(|l| format!("{l}\n"))
        .collect();
    const KEYWORDS: [&str; 16] = [
        "const",
        "auto",
        "void",
        "do",
        "while",
        "for",
        "static_cast",
        "true",
        "false",
        "if",
        "else",
        "__restrict__",
        "return",
        "int",
        "bool",
        "float",
    ];
    let b = text.as_bytes();
    let mut names = Vec::new();
    let mut k = 0;
    while k < b.len() {
        if b[k].is_ascii_alphabetic() || b[k] == b'_' {
            let start = k;
            while k < b.len() && (b[k].is_ascii_alphanumeric() || b[k] == b'_') {
                k += 1;
            }
            let word = &text[start..k];
            let before = text[..start].trim_end();
            let qualified = before.ends_with("::") || before.ends_with('.') || before.ends_with("->");
            if !qualified
                && !KEYWORDS.contains(&word)
                && !word.starts_with('_')
                && !word.starts_with("dlbridge")
                && !names.iter().any(|n| n == word)
            {
                names.push(word.to_owned());
            }
        } else if b[k].is_ascii_digit() {
            while k < b.len() && b[k].is_ascii_alphanumeric() {
                k += 1;
            }
        } else {
            k += 1;
        }
    }
    names
}

#[test]
fn names_the_text_declares_never_change_the_generated_codes_types() {
    // The generated code after `loop_prep` names nothing a declaration there
    // could stand in for but what it declares itself (the element's index
    // and operands, which the operation's function declares itself).
    let names = shadowable_after_loop_prep();
    assert!(names.iter().all(|n| ["i", "x", "s", "z"].contains(&n.as_str())), "{names:?}");
    // A corpus: each such name, the placeholder and the runtime's integer
    // types declared as another type in `loop_prep`, or in the preamble's
    // anonymous namespace (where the generated code used to reopen it).
    // Each is refused or runs right; none changes what the loop reads or writes.
    let mut corpus: Vec<String> = names.clone();
    corpus.extend(["T", "ptrdiff_t", "int64_t", "size_t", "DLTensor"].map(str::to_owned));
    corpus.dedup();
    for (n, name) in corpus.iter().enumerate() {
        let in_prep = attempt(&format!("shadow_prep_{n}"), "z = x * 2", "#include <cstdint>", &format!("typedef int16_t {name};"));
        let in_anon =
            attempt(&format!("shadow_anon_{n}"), "z = x * 2", &format!("#include <cstdint>\nnamespace {{ typedef int16_t {name}; }}"), "");
        for (where_, r) in [("loop_prep", in_prep), ("the preamble's anonymous namespace", in_anon)] {
            if let Ok(z) = r {
                assert!(doubled(&z), "`typedef int16_t {name};` in {where_} changed the result: {:?}", &z[..4]);
            }
        }
    }
    // The reduce type: a preamble's own `_type_reduce` is not the generated code's.
    let reg = Registry::new();
    let spec = dlbridge_compile::Reduction {
        preamble: "namespace { typedef int _type_reduce; }",
        ..dlbridge_compile::Reduction::new("T x", "T y", "x", "a + b", "y = a", Some("0"), "shadow_reduce")
    };
    if let Ok(k) = dlbridge_compile::ReductionKernel::new(spec)
        && let Ok(kernel) = k.register(&reg)
    {
        let x = Array::from_slice(&[0.25f32; 8], &[8]).unwrap();
        if let Ok(mut y) = k.reduce(&kernel, &[&x], None, false) {
            assert_eq!(y.remove(0).to_vec::<f32>().unwrap(), [2.0], "a preamble's `_type_reduce` changed the sum");
        }
    }
}

#[test]
fn the_runtimes_own_names_and_members_of_its_types_are_not_the_texts() {
    let cases = [
        ("rt_divguard", "dlbridge_divguard::t_jmp = nullptr; z = x", "", "`dlbridge_divguard`"),
        ("rt_errors", "z = x", "namespace k { using namespace dlbridge_errors; }", "`dlbridge_errors`"),
        (
            "raw_member",
            "z = x",
            "template <> const float& dlbridge::Raw<const float>::operator[](ptrdiff_t k) const { static float f = 0; (void)k; return f; }",
            "`dlbridge::Raw",
        ),
        (
            "raw_member_nested",
            "z = x",
            "template <> dlbridge::Raw<const dlbridge::Raw<float>>::Raw(DLTensor*, const char*) {}",
            "`dlbridge::Raw",
        ),
        ("raw_member_named", "z = x", "static auto dlb_size = &dlbridge::Raw<const float>::size;", "a member of `dlbridge::Raw`"),
        (
            "std_ctor",
            "z = x",
            "#include <stdexcept>\nstd::out_of_range::out_of_range(const char*) : std::logic_error(\"fine\") {}",
            "defines `std::out_of_range::out_of_range`",
        ),
        (
            "std_what",
            "z = x",
            "#include <stdexcept>\nconst char* ::std::logic_error::what() const noexcept { return \"fine\"; }",
            "defines `std::logic_error::what`",
        ),
        (
            "std_dtor",
            "z = x",
            "#include <stdexcept>\nstd::logic_error::~logic_error() {}",
            "the destructor `std::logic_error::~logic_error`",
        ),
    ];
    for (name, op, pre, says) in cases {
        let e = attempt(name, op, pre, "").expect_err(name);
        assert!(e.contains(says), "{name}: {e}");
    }
    // Uses of the same names stay: a call, a member of a class template, a
    // qualified name in a condition.
    let z = attempt(
        "std_uses",
        "if (std::isnan(x)) { z = 0; } else { z = x * 2 + std::numeric_limits<T>::epsilon() * 0 + (T)std::min(0, 1); }",
        "#include <limits>\n#include <algorithm>\n#include <cmath>",
        "",
    )
    .expect("uses of std");
    assert!(doubled(&z), "{:?}", &z[..4]);
}

#[test]
fn the_c_librarys_integer_division_by_zero_is_an_error_not_a_signal() {
    for (name, call) in [
        ("div0", "std::div((int)x, (int)(x * 0)).quot"),
        ("ldiv0", "std::ldiv((long)x, 0L).quot"),
        ("imaxdiv0", "imaxdiv((intmax_t)x, 0).quot"),
    ] {
        let e = attempt(name, &format!("z = (T){call}"), "#include <cstdlib>\n#include <cinttypes>", "").expect_err(name);
        assert!(e.contains("integer division or modulo by zero"), "{name}: {e}");
    }
    let z = attempt("div_ok", "z = (T)std::div((int)x * 4, 2).quot", "#include <cstdlib>", "").expect("a division");
    assert!(doubled(&z), "{:?}", &z[..4]);
}

#[test]
fn a_reduce_types_destructor_dividing_by_zero_is_an_error_on_every_path() {
    // Few outputs over many elements: per-thread partials (where the thread
    // budget allows more than one), and many outputs: one output a thread.
    let reg = Registry::new();
    let spec = dlbridge_compile::Reduction {
        preamble: "struct DlbAcc {\n  float v; int d = 0;\n  DlbAcc(float x = 0) : v(x) {}\n  ~DlbAcc() { volatile int k = 1 / d; (void)k; }\n};",
        reduce_type: Some("DlbAcc"),
        ..dlbridge_compile::Reduction::new("T x", "T y", "DlbAcc(x)", "DlbAcc(a.v + b.v)", "y = a.v", Some("DlbAcc(0)"), "dtor_div0")
    };
    let k = dlbridge_compile::ReductionKernel::new(spec).unwrap();
    let kernel = k.register(&reg).unwrap();
    for shape in [[1i64, 1 << 18], [1 << 10, 256]] {
        let x = Array::zeros(dlbridge_core::DType::F32, &shape).unwrap();
        let e = k.reduce(&kernel, &[&x], Some(&[1]), false).expect_err("a destructor dividing by zero");
        assert!(e.to_string().contains("integer division or modulo by zero"), "{shape:?}: {e}");
    }
}

#[test]
fn headers_come_before_the_texts_own_macros() {
    // A macro the text defines before an `#include` would be expanded on the
    // header's lines, which the build's checks leave to the system.
    let cases = [
        ("hdr_undef", "#undef __BEGIN_DECLS\n#define __BEGIN_DECLS __asm__(\"nop\");\n#include <assert.h>"),
        ("hdr_digraph", "%:define DLB_M 1\n#inc\\\nlude <cmath>"),
        ("hdr_next", "#define div dlb_div\n#include_next <stdlib.h>"),
    ];
    for (name, pre) in cases {
        let e = attempt(name, "z = x * 2", pre, "").expect_err(name);
        assert!(e.contains("includes its headers before it defines or undefines any macro"), "{name}: {e}");
    }
    let z = attempt("hdr_first", "z = DLB_TWICE(x)", "#include <cmath>\n#define DLB_TWICE(v) ((v) * 2)", "").expect("headers first");
    assert!(doubled(&z), "{:?}", &z[..4]);
}

#[test]
fn no_spelling_turns_the_division_check_off_or_jumps_out_of_the_generated_code() {
    let cases = [
        (
            "nosan",
            "__attribute__((no_sanitize(\"integer-divide-by-zero\"), noinline)) static int dlb_div(int a, int b) { return a / b; }",
            "z = (T)dlb_div((int)x, 0)",
            "",
            "uses `no_sanitize`",
        ),
        (
            "nosan_ub",
            "[[gnu::no_sanitize_undefined]] static int dlb_div(int a, int b) { return a / b; }",
            "z = (T)dlb_div((int)x, 0)",
            "",
            "uses `no_sanitize_undefined`",
        ),
        ("bret_prep", "", "z = x * 2", "__builtin_return(__builtin_apply_args());", "uses `__builtin_return`"),
        ("ljmp", "#include <csetjmp>\nstatic std::jmp_buf dlb_jb;", "std::longjmp(dlb_jb, 1); z = x", "", "uses `longjmp`"),
    ];
    for (name, pre, op, prep, says) in cases {
        let e = attempt(name, op, pre, prep).expect_err(name);
        assert!(e.contains(says), "{name}: {e}");
    }
}

#[test]
fn no_spelling_of_a_foreign_class_lets_the_text_define_its_members() {
    let cases = [
        (
            "ns_alias",
            "#include <stdexcept>\nnamespace s = std;\ns::out_of_range::out_of_range(const char* m) : s::logic_error(\"hijacked\") {}",
            "defines `s::out_of_range::out_of_range` out of its class",
        ),
        (
            "typedef_root",
            "#include <stdexcept>\ntypedef std::logic_error dlb_le;\nconst char* dlb_le::what() const noexcept { return \"hijacked\"; }",
            "defines `dlb_le::what` out of its class",
        ),
        (
            "alias_class",
            "#include <functional>\nnamespace s = std;\nstruct DlbK {};\ntemplate <> struct s::hash<DlbK> {};",
            "declares the class `s...`",
        ),
        (
            "global_root",
            "#include <stdexcept>\nconst char* ::std::logic_error::what() const noexcept { return \"x\"; }",
            "defines `std::logic_error::what`",
        ),
        // The constructor through a typedef, its initialiser unqualified.
        (
            "typedef_ctor",
            "#include <stdexcept>\ntypedef std::out_of_range E;\nE::out_of_range(const char*) : logic_error(\"hijacked\") {}",
            "defines `E::out_of_range`",
        ),
        (
            "using_decl",
            "#include <stdexcept>\nnamespace zz { struct out_of_range {}; }\nusing std::out_of_range;\nout_of_range::out_of_range(const char*) : logic_error(\"x\") {}",
            "defines `out_of_range::out_of_range`",
        ),
        (
            "template_alias",
            "#include <stdexcept>\ntemplate <class U> using A = std::out_of_range;\nA<int>::out_of_range(const char*) : logic_error(\"x\") {}",
            "defines `A::out_of_range`",
        ),
        (
            "decltype_root",
            "#include <stdexcept>\ndecltype(std::out_of_range(\"\"))::out_of_range(const char*) : logic_error(\"x\") {}",
            "defines `decltype::out_of_range`",
        ),
        (
            "nested_typedef",
            "#include <stdexcept>\ntemplate <class U> struct W { typedef std::out_of_range type; };\nW<int>::type::out_of_range(const char*) : logic_error(\"x\") {}",
            "defines `W::type::out_of_range`",
        ),
        ("static_member", "struct DlbS { static int n; };\nint DlbS::n = 0;", "defines `DlbS::n`"),
    ];
    for (name, pre, says) in cases {
        let e = attempt(name, "z = x", pre, "").expect_err(name);
        assert!(e.contains(says), "{name}: {e}");
    }
    // Inside their class or namespace, the text's own functions and members are its own;
    // uses of qualified names (a call in a conditional, an assignment to a member) stay.
    let z = attempt(
        "own_members",
        "DlbK::calls = 0; z = (x >= 0 ? DlbK{}.f(x) : dlb_ns::zero()) + dlb_ns::zero()",
        "struct DlbK { static inline int calls = 0; float f(float v) const { return v * 2; } };\nnamespace dlb_ns { float zero() { return 0; } }",
        "",
    )
    .expect("own members");
    assert!(doubled(&z), "{:?}", &z[..4]);
}

#[test]
fn a_pragmas_clauses_are_checked_as_the_texts_code() {
    let prep = |clause: &str| format!("#pragma omp simd if({clause})\nfor (int dlb_k = 0; dlb_k < 1; ++dlb_k) {{}}");
    let cases = [
        ("omp_return", "#define CAT(a, b) a##b", prep("({ CAT(re, turn); 1; })"), "uses `return`"),
        ("omp_runtime", "", prep("({ dlbridge_divguard::t_jmp = nullptr; 1; })"), "`dlbridge_divguard`"),
        ("omp_asm", "", prep("([]{ asm volatile(\"nop\"); }(), 1)"), "uses `asm`"),
    ];
    for (name, pre, prep, says) in cases {
        let e = attempt(name, "z = x * 2", pre, &prep).expect_err(name);
        assert!(e.contains(says) && e.contains("#pragma omp simd"), "{name}: {e}");
    }
    let z = attempt("omp_ok", "z = x * 2", "", &prep("1")).expect("a plain clause");
    assert!(doubled(&z), "{:?}", &z[..4]);
}

#[test]
fn vector_types_whose_division_is_unchecked_are_refused() {
    for (name, pre) in [
        ("vec_gnu", "typedef int dlb_v4 __attribute__((vector_size(16)));"),
        ("vec_cxx11", "typedef int dlb_v4 [[gnu::vector_size(16)]];"),
        ("vec_mode", "typedef int dlb_v4 __attribute__((mode(V4SI)));"),
        ("vec_mode_underscored", "typedef int dlb_v4 __attribute__((__mode__(__V4SI__)));"),
    ] {
        let e = attempt(name, "z = x", pre, "").expect_err(name);
        assert!(e.contains("integer division on vector types is not checked"), "{name}: {e}");
    }
}

#[test]
fn the_floating_point_environment_a_kernel_changes_is_restored_after_its_call() {
    let reg = Registry::new();
    let make = |name: &str, op: &str| {
        let opts = ElementwiseOptions { preamble: "#include <cfenv>".into(), ..Default::default() };
        ElementwiseKernel::new("T x", "T z", op, name, opts).unwrap().register(&reg).unwrap()
    };
    // Many elements: chunks on dlbridge's threads as well as the caller's.
    let n = 1usize << 18;
    let x = Array::from_slice(&(0..n).map(|i| i as f64).collect::<Vec<_>>(), &[n as i64]).unwrap();
    common::run(&make("fenv_up", "fesetround(FE_UPWARD); z = x"), &[&x]).unwrap();
    common::run(&make("fenv_trap", "feenableexcept(FE_DIVBYZERO | FE_INVALID); z = x"), &[&x]).unwrap();
    // This thread: rounding to nearest, and no trap on a division by zero.
    let third = std::hint::black_box(1.0f64) / std::hint::black_box(3.0);
    assert_eq!(third.to_bits(), (1.0f64 / 3.0).to_bits(), "the caller's rounding changed");
    assert!((std::hint::black_box(1.0f64) / std::hint::black_box(0.0)).is_infinite());
    // Every thread a later kernel runs on.
    let z = common::run(&make("fenv_third", "z = x / 3"), &[&x]).unwrap().remove(0).to_vec::<f64>().unwrap();
    assert!(z.iter().enumerate().all(|(i, &v)| v.to_bits() == (i as f64 / 3.0).to_bits()), "a later kernel's rounding changed");
}

#[test]
fn no_attribute_qualifier_or_linkage_spelling_reaches_a_foreign_definition() {
    let acc =
        "#include <optional>\n#include <vector>\n#include <exception>\nstruct Acc { double v; Acc() : v(0) {} Acc(double x) : v(x) {} };\n";
    let cases = [
        (
            "ref_qualified",
            "template<> Acc& std::optional<Acc>::operator*() & noexcept { static Acc e(1.0); return e; }",
            "defines `std::optional::operator`",
        ),
        (
            "empty_attribute",
            "template<> std::exception_ptr& std::vector<std::exception_ptr>::operator[](size_type) [[]] { static std::exception_ptr e; return e; }",
            "defines `std::vector::operator`",
        ),
        ("class_attr", "template<> class [[]] std::optional<Acc> { public: Acc a; };", "declares the class `std..."),
        ("class_alignas", "template<> class alignas(8) std::optional<Acc> { public: Acc a; };", "declares the class `std..."),
        (
            "class_gnu_attr",
            "template<> class __attribute__((aligned(8))) std::optional<Acc> { public: Acc a; };",
            "declares the class `std...",
        ),
        ("raw_linkage", "extern R\"(C)\" div_t __real_div(int, int);", "language linkage (`extern R\"(C)\"`)"),
        ("raw_linkage_new", "#include <cstdlib>\nextern R\"(C)\" void* _Znwm(size_t n) { return std::malloc(n); }", "language linkage"),
        ("real_name", "namespace k { int __real_x = 0; }", "uses `__real_x`"),
    ];
    for (name, pre, says) in cases {
        let e = attempt(name, "z = x", &format!("{acc}{pre}"), "").expect_err(name);
        assert!(e.contains(says), "{name}: {e}");
    }
    let e = attempt("complex_int", "__complex__ int a = (int)x + 1; __complex__ int b = (int)x; z = (T)__real__ (a / b)", "", "")
        .expect_err("complex integers");
    assert!(e.contains("GCC's complex integer division is not checked"), "{e}");
}

#[test]
fn an_exceptions_own_code_runs_under_the_division_check() {
    let what = "#include <exception>\nstruct DlbE : std::exception {\n  const char* what() const noexcept override { volatile int z = 0; static char b[2] = {0, 0}; b[0] = char('a' + 7 / z); return b; }\n};";
    let dtor = "struct DlbD { int d; ~DlbD() { volatile int z = d; if (7 / z == 3) __builtin_printf(\"x\"); } };";
    for (name, pre, op) in [("what_div0", what, "if (x > 2) throw DlbE(); z = x"), ("dtor_div0", dtor, "if (x > 2) throw DlbD{0}; z = x")] {
        let e = attempt(name, op, pre, "").expect_err(name);
        assert!(e.contains("integer division or modulo by zero"), "{name}: {e}");
    }
}

#[test]
fn parentheses_and_attributes_hide_no_definition_or_namespace() {
    let acc = "#include <optional>\n#include <vector>\n#include <stdexcept>\nstruct Acc { long v; Acc(long a = 0) : v(a) {} };\n";
    let cases = [
        (
            "paren_size",
            "template<> std::vector<std::optional<Acc>>::size_type (std::vector<std::optional<Acc>>::size)() const noexcept { return 1; }",
            "defines `std::vector::size`",
        ),
        ("paren_what", "const char* (std::logic_error::what)() const noexcept { return \"R\"; }", "defines `std::logic_error::what`"),
        ("paren_data", "struct DlbF { static int n; };\nint (((DlbF::n))) = 3;", "defines `DlbF::n`"),
        ("paren_global", "struct DlbF { void g(); };\nvoid (::DlbF::g)() {}", "defines `DlbF::g`"),
        ("ns_attr", "namespace [[]] std { int dlb_marker = 5; }", "opens the namespace `std`"),
        ("ns_gnu_attr", "namespace __attribute__((visibility(\"default\"))) std { int dlb_marker = 5; }", "opens the namespace `std`"),
        ("ns_reserved", "namespace [[]] __cxxabiv1 { int dlb_marker = 5; }", "opens the namespace `__cxxabiv1`"),
        ("ns_dlbridge", "namespace [[]] dlbridge_x { int dlb_marker = 5; }", "`dlbridge_x`"),
    ];
    for (name, pre, says) in cases {
        let e = attempt(name, "z = x", &format!("{acc}{pre}"), "").expect_err(name);
        assert!(e.contains(says), "{name}: {e}");
    }
    // The idiom that keeps a `max` macro out, and a parenthesised argument, are uses.
    let z = attempt(
        "paren_uses",
        "z = x * 2 + (T)((std::numeric_limits<int>::max)() * 0) + (T)(std::min)(0, 1)",
        "#include <limits>\n#include <algorithm>",
        "",
    )
    .expect("parenthesised uses");
    assert!(doubled(&z), "{:?}", &z[..4]);
}

#[test]
fn no_builtin_context_switch_or_thread_hook_leaves_the_generated_code() {
    let ctx = "#include <ucontext.h>\nnamespace q { static ucontext_t uc; static int jumped = 0; }";
    let cases = [
        ("eh_return", "", "z = x; if (i == 2) __builtin_eh_return(0L, __builtin_return_address(0));", "", "uses `__builtin_eh_return`"),
        (
            "eh_helper",
            "[[gnu::noinline]] static void dlb_h() { __builtin_eh_return(0L, nullptr); }",
            "dlb_h(); z = x",
            "",
            "uses `__builtin_eh_return`",
        ),
        ("unwind_init", "", "__builtin_unwind_init(); z = x", "", "uses `__builtin_unwind_init`"),
        ("frame", "", "z = x + (T)(__builtin_frame_address(0) != nullptr)", "", "uses `__builtin_frame_address`"),
        ("ctx", ctx, "if (i == 5 && !q::jumped) { q::jumped = 1; setcontext(&q::uc); } z = x", "getcontext(&q::uc);", "uses `setcontext`"),
        (
            "key_hook",
            "#include <pthread.h>\nnamespace q { inline void hook(void*) {} }",
            "static pthread_key_t key; static bool once = false; if (!once) { once = true; pthread_key_create(&key, q::hook); } z = x",
            "",
            "uses `pthread_key_create`",
        ),
        ("thread_exit", "#include <pthread.h>", "z = x; if (i == 2) pthread_exit(nullptr);", "", "uses `pthread_exit`"),
        (
            "terminate_hook",
            "#include <exception>\n#include <cstdlib>\nnamespace q { inline void hook() { std::_Exit(7); } }",
            "std::set_terminate(q::hook); z = x",
            "",
            "std::set_terminate",
        ),
        (
            "ssignal_hook",
            "#include <signal.h>\nnamespace q { inline void hook(int) {} }",
            "ssignal(SIGUSR1, q::hook); z = x",
            "",
            "`ssignal`",
        ),
        (
            "computed_goto",
            "namespace q { static void* p = nullptr; static int hops = 0; }",
            "z = x * 2; if (i == 3 && q::p && q::hops++ == 0) goto *q::p;",
            "q::p = &&dlb_l; dlb_l: ;",
            "computed `goto`",
        ),
    ];
    for (name, pre, op, prep, says) in cases {
        let e = attempt(name, op, pre, prep).expect_err(name);
        assert!(e.contains(says), "{name}: {e}");
    }
    // A qualified function called as a statement, or given another as its argument, is no definition.
    let z = attempt(
        "qualified_calls",
        "q::use(q::two); (void)q::use(q::two); z = x * q::use(q::two)",
        "namespace q { inline float two() { return 2; } inline float use(float (*f)()) { return f(); } }",
        "",
    )
    .expect("calls");
    assert!(doubled(&z), "{:?}", &z[..4]);
}
