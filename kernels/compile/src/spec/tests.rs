//! The kernel specifications' checks: parameter text, names, placement
//! rules, fragments that would leave their place, derived signatures.

use dlbridge_core::ErrorKind;

use super::*;

#[test]
fn return_in_a_comment_or_a_string_is_not_a_return() {
    assert_eq!(
        code_only("y = x; // no early return\nz = 1; /* return */ w = \"return\"; c = '\\''; return"),
        "y = x; \nz = 1;   w =  ; c =  ; return"
    );
    assert!(has_word(&code_only("y = x; return;"), "return"));
    assert!(!has_word(&code_only("y = x; // no early return here"), "return"));
    assert!(!has_word(&code_only("y = x; /* return */"), "return"));
}

#[test]
fn a_return_spliced_across_lines_in_loop_prep_or_after_loop_is_refused() {
    // A backslash-newline joins `ret` and `urn` before the compiler tokenizes.
    let e = ElementwiseSpec::new("T x", "T z", "z = x", "splice", "", "if (1) ret\\\nurn;", "").unwrap_err();
    assert!(e.to_string().contains("loop_prep uses `return`"), "{e}");
    assert!(!has_word(&code_only("// a comment \\\n return;"), "return"), "a continued comment hides the line");
    // As the compiler lexes: a lone carriage return ends a `//` comment; a `'`
    // after an identifier opens a character literal (a digit separator only
    // inside a number).
    assert!(has_word(&code_only("y = x; // note\r y = i;"), "i"));
    assert!(has_word(&code_only("y = x; // note\r\n y = i;"), "i"));
    assert!(has_word(&code_only("z += sizeof'\"' * 0 + (T)i; // \""), "i"));
    assert!(has_word(&code_only("z = $1'a' + i; // '"), "i"));
    assert!(has_word(&code_only("z = \u{e9}1'a' + i; // '"), "i"));
    assert!(!has_word(&code_only("z = 1'000 + 0x1'f + 1e+5'0; // i"), "i"));
    assert!(has_word(&code_only("z = 1'000 + i; w = '\"'"), "i"));
    assert!(has_word(&code_only("z = i\"\" ;"), "i"), "an identifier before a literal is no prefix");
    assert!(has_word(&code_only("z = x; /* *\\\x0c\n/ z = x + (T)i; /* */"), "i"), "a splice past a form feed");
    assert!(has_word(&code_only("z = x; /* *\\\x0b\n/ z = x + (T)i; /* */"), "i"), "a splice past a vertical tab");
    for (prep, after) in [("return;", ""), ("", "if (1) return;")] {
        let e = ElementwiseSpec::new("T x", "T z", "z = x", "frag", "", prep, after).unwrap_err();
        assert!(e.to_string().contains("uses `return`"), "{e}");
    }
    // The operation runs per element: a `return` there ends that element.
    ElementwiseSpec::new("T x", "T z", "z = x; if (x > 0) return; z = -1", "early", "", "", "").unwrap();
    ElementwiseSpec::new("T x", "T z", "z = TWICE(x)", "mac_ok", "#define TWICE(v) ((v) * 2)", "", "").unwrap();
}

#[test]
fn digraphs_count_as_the_brackets_and_directives_they_spell() {
    let e = ElementwiseSpec::new("T x", "T z", "z = x; %> %>", "dg", "", "", "").unwrap_err();
    assert!(e.to_string().contains("closes a `}`"), "{e}");
    let e = ElementwiseSpec::new("T x", "T z", "z = x; <%", "dg2", "", "", "").unwrap_err();
    assert!(e.to_string().contains("leaves the `{`"), "{e}");
    let e = ElementwiseSpec::new("T x", "T z", "%:define Y 1\nz = x", "dg3", "", "", "").unwrap_err();
    assert!(e.to_string().contains("belongs in the preamble"), "{e}");
    ElementwiseSpec::new("T x", "T z", "z = x; int a<:2:> = <%0, 1%>; (void)a;", "dg_ok", "", "", "").unwrap();
    assert_eq!(digraphs_spelled_out("std::vector<::x> <:1:> %:%:"), "std::vector<::x> [1] ##");
}

#[test]
fn a_parameter_named_like_a_c_library_macro_is_refused_by_name() {
    for name in ["M_PI", "NULL", "errno", "INFINITY"] {
        let e = ElementwiseSpec::new(&format!("T x, T {name}"), "T z", "z = x", "mac_param", "", "", "").unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "ElementwiseKernel `mac_param`: in_params: parameter name `{name}` is reserved: a macro of the C library headers the generated code includes"
            )
        );
    }
}

#[test]
fn return_in_loop_prep_is_refused_and_points_to_continue() {
    let e = ElementwiseSpec::new("T x", "T z", "z = x", "ret", "", "if (1) return;", "").unwrap_err().to_string();
    assert!(e.contains("uses `return`") && e.contains("use `continue`"), "{e}");
    ElementwiseSpec::new("T x", "T z", "z = x; T returned = x; (void)returned", "ret_ok", "", "", "").unwrap();
    ElementwiseSpec::new("T x", "T z", "z = f(x)", "ret_pre", "__device__ T f(T v) { return v; }", "", "").unwrap();
}

fn ew_err(op: &str, preamble: &str, prep: &str, after: &str) -> String {
    ElementwiseSpec::new("T x", "T z", op, "k", preamble, prep, after).unwrap_err().to_string()
}

#[test]
fn a_fragment_that_would_leave_its_place_is_refused() {
    for ((op, preamble, prep, after), says) in [
        // `}` ends the generated function: what follows would be code at file scope.
        (("z = x; } void evil() { z = x;", "", "", ""), "operation closes a `}` on line 1 that it did not open"),
        (("z = x", "int helper() {", "", ""), "preamble leaves the `{` of line 1 open"),
        (("z = (x", "", "", ""), "operation leaves the `(` of line 1 open"),
        (("z = x", "", "", "if (1) { (void)0; )"), "after_loop closes `{` (line 1) with `)` on line 1"),
        // A comment or string left open swallows the generated code after it.
        (("z = x; /* and the rest", "", "", ""), "operation leaves a `/*` comment open (from line 1)"),
        (("z = x", "", "const char* s = \"open;", ""), "loop_prep leaves a string literal open (from line 1)"),
        (("z = x; // \\", "", "", ""), "operation ends in a backslash"),
        (("z = x + 1\\\n", "", "", ""), "operation ends in a backslash"),
        (("z = x + 1\\\t\r\n  \n", "", "", ""), "operation ends in a backslash"),
        (("z = x", "", "#pragma GCC unroll 4\\\n", ""), "loop_prep ends in a backslash"),
        (
            ("z = x", "#include <cmath>\n#  include  <iostream>", "", ""),
            "preamble has `#  include  <iostream>`: that header defines a static object",
        ),
        // `#if 0` left open in the preamble would compile the kernel out.
        (("z = x", "#if 0\nint unused;", "", ""), "preamble leaves the `#if` of line 1 open (no `#endif`)"),
        (("z = x", "#endif", "", ""), "preamble has `#endif` on line 1 without its `#if`"),
        // Macros belong in the preamble; there none may rename what the generated code uses.
        (
            ("#define SQ(v) ((v) * (v))\nz = SQ(x)", "", "", ""),
            "operation has the directive `#define SQ(v) ((v) * (v))`, which belongs in the preamble",
        ),
    ] {
        let m = ew_err(op, preamble, prep, after);
        assert!(m.contains(says), "{m}");
    }
    for (mac, why) in [
        ("i", "the generated code declares"),
        ("float", "keyword"),
        ("size_t", "type or namespace"),
        ("_ind", "the generated code declares"),
        ("_q0", "reserved"),
    ] {
        let m = ew_err("z = x", &format!("#define {mac} 0"), "", "");
        assert!(m.contains(&format!("preamble (re)defines the macro `{mac}`")) && m.contains(why), "{m}");
    }
    let m = ew_err("z = x", "#undef DLBRIDGE_PARALLEL_MIN", "", "");
    assert!(m.contains("(re)defines the macro `DLBRIDGE_PARALLEL_MIN`"), "{m}");
    // The same for every reduction fragment: an identity that closes the cast it is put in.
    let e = ReductionSpec::new(&Reduction::new("T x", "T y", "x", "a + b", "y = a", Some("0), evil("), "r")).unwrap_err();
    assert!(e.to_string().contains("identity closes a `)` on line 1 that it did not open"), "{e}");
}

#[test]
fn ordinary_code_stays_accepted() {
    // Brackets, literals and comments that close, digit separators, raw strings,
    // `#pragma` in the body, conditionals and helper macros in the preamble.
    ElementwiseSpec::new("T x", "T z", "#pragma unroll\nfor (int k = 0; k < 2; ++k) { z = x + 1'000 + (T)u8'a'; }\nconst char* s = R\"d(a ) \" } return)d\"; (void)s; /* { */", "ok", "#ifndef SCALE\n#define SCALE(v) ((v) * 2)\n#endif\n#define _USE_MATH_DEFINES\ntemplate <typename V> V twice(V v) { return v + v; }", "int count = 0; // {", "(void)count;")
    .unwrap();
    assert_eq!(scan("a R\"x(} return\n)x\" b").code, "a  \n b");
    assert_eq!(scan("x = 1'000'000; y = 'c';").code, "x = 1'000'000; y =  ;");
}

fn err(r: Result<impl std::fmt::Debug>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Value, "{e}");
            e.to_string()
        }
    }
}

fn ew(i: &str, o: &str) -> Result<ElementwiseSpec> {
    ElementwiseSpec::new(i, o, "z = x", "k", "", "", "")
}

fn red(i: &str, o: &str) -> Result<ReductionSpec> {
    ReductionSpec::new(&Reduction::new(i, o, "x", "a + b", "y = a", Some("0"), "r"))
}

#[test]
fn params_parse_types_keywords_and_names() {
    let ps = parse_params(" T x,raw  U y , float32 alpha, mut raw T b, _non_const int64 c ", "in_params").unwrap();
    assert_eq!(
        ps,
        vec![
            Param { name: "x".into(), ty: ParamType::Var('T'), raw: false, mutable: false },
            Param { name: "y".into(), ty: ParamType::Var('U'), raw: true, mutable: false },
            Param { name: "alpha".into(), ty: ParamType::Concrete(DType::F32), raw: false, mutable: false },
            Param { name: "b".into(), ty: ParamType::Var('T'), raw: true, mutable: true },
            Param { name: "c".into(), ty: ParamType::Concrete(DType::I64), raw: false, mutable: true },
        ]
    );
    assert!(parse_params("", "out_params").unwrap().is_empty());
    assert!(parse_params("   ", "out_params").unwrap().is_empty());
}

#[test]
fn param_syntax_errors_name_the_offending_token() {
    assert_eq!(
        err(parse_params("T x, raww T y", "in_params")),
        "in_params: parameter 2 (`raww T y`): unknown keyword `raww` (the keywords are `raw` and `mut`, also spelt `_non_const`)"
    );
    assert_eq!(
        err(parse_params("float33 x", "in_params")),
        "in_params: parameter 1 (`float33 x`): unknown type `float33` (a type is a one-letter placeholder such as \
         `T` or a NumPy dtype name: bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16, \
         float32, float64, complex64, complex128)"
    );
    assert_eq!(
        err(parse_params("f32 x", "in_params")).split(" (a type").next().unwrap(),
        "in_params: parameter 1 (`f32 x`): unknown type `f32`"
    );
    assert_eq!(err(parse_params("x", "out_params")), "out_params: parameter 1 (`x`): expected `TYPE NAME`, e.g. `T x` or `float32 x`");
    assert_eq!(err(parse_params("T x,", "in_params")), "in_params: parameter 2 is empty (a stray comma?)");
    assert_eq!(err(parse_params("T x,, T y", "in_params")), "in_params: parameter 2 is empty (a stray comma?)");
    assert_eq!(
        err(parse_params("1 x", "in_params")),
        "in_params: parameter 1 (`1 x`): type placeholder `1` must be one ASCII letter, like `T`"
    );
    assert_eq!(err(parse_params("raw raw T x", "in_params")), "in_params: parameter 1 (`raw raw T x`): keyword `raw` given twice");
    assert_eq!(
        err(parse_params("mut _non_const T x", "in_params")),
        "in_params: parameter 1 (`mut _non_const T x`): keyword `_non_const` given twice"
    );
}

#[test]
fn numpy_names_round_trip_and_cpu_types() {
    for (d, name) in dlbridge_core::dtype::NUMPY_NAMES {
        assert_eq!(numpy_dtype(name), Some(d));
        assert_eq!(numpy_name(d), Some(name));
    }
    assert_eq!(numpy_dtype("float"), None);
    assert_eq!(numpy_dtype("f32"), None);
    assert_eq!(numpy_name(DType::BF16), Some("bfloat16"));
    assert_eq!(cpu_ctype(DType::F32).unwrap(), "float");
    assert_eq!(cpu_ctype(DType::U16).unwrap(), "uint16_t");
    assert_eq!(cpu_ctype(DType::F16).unwrap(), "float16");
    assert_eq!(cpu_ctype(DType::BF16).unwrap(), "bfloat16");
    assert_eq!(cpu_ctype(DType::C128).unwrap(), "std::complex<double>");
    for &d in CPU_DTYPES {
        assert!(cpu_ctype(d).is_ok(), "{d}");
    }
    let f8 = DType::new(dlbridge_core::DTypeCode::Float, 64, 2).unwrap();
    let e = cpu_ctype(f8).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Type);
    assert_eq!(
        e.to_string(),
        format!(
            "dtype {f8} is not supported by the CPU backend (yet); it supports bool, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64, c64, c128"
        )
    );
}

#[test]
fn elementwise_signature_broadcasts_non_raw_operands_and_gives_raw_ones_their_own_group() {
    let s = ElementwiseSpec::new("T x, mut T y, raw T r, float32 alpha, raw mut U q", "T z, float64 w", "z = x", "k", "", "", "").unwrap();
    assert_eq!(s.type_vars(), vec!['T', 'U']);
    let all = "bool|i8|i16|i32|i64|u8|u16|u32|u64|f16|bf16|f32|f64|c64|c128";
    let sig = s.signature();
    assert_eq!(
        sig,
        format!("k<T: {all}, U: {all}>(x: T[*S], y: mut T[*S], r: T[...R0], alpha: f32[*S], q: mut U[...R1]) -> (z: T[*S], w: f64[*S])")
    );
    assert_eq!(Signature::parse(&sig).unwrap().to_string(), sig);
    let spec = s.specialised_signature(&[('U', DType::I32), ('T', DType::F64)]).unwrap();
    assert_eq!(spec, "k(x: f64[*S], y: mut f64[*S], r: f64[...R0], alpha: f32[*S], q: mut i32[...R1]) -> (z: f64[*S], w: f64[*S])");
    assert_eq!(Signature::parse(&spec).unwrap().to_string(), spec);
}

#[test]
fn cupy_examples_are_accepted() {
    let sq = ElementwiseSpec::new("float32 x, float32 y", "float32 z", "z = (x - y) * (x - y)", "squared_diff", "", "", "").unwrap();
    assert_eq!(sq.signature(), "squared_diff(x: f32[*S], y: f32[*S]) -> (z: f32[*S])");
    assert_eq!(sq.specialised_signature(&[]).unwrap(), sq.signature());
    let rev = ElementwiseSpec::new("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse", "", "", "").unwrap();
    assert!(rev.signature().ends_with("(x: T[*S], y: T[...R0]) -> (z: T[*S])"), "{}", rev.signature());
    let l2 = ReductionSpec::new(&Reduction::new("T x", "T y", "x * x", "a + b", "y = sqrt(a)", Some("0"), "l2norm")).unwrap();
    let sig = l2.signature();
    assert!(sig.starts_with("l2norm<T: bool|") && sig.ends_with(">(x: T[...S], y: mut T[...O])"), "{sig}");
    Signature::parse(&sig).unwrap();
    assert_eq!(l2.specialised_signature(&[('T', DType::F32)]).unwrap(), "l2norm(x: f32[...S], y: mut f32[...O])");
    assert_eq!(l2.identity.as_deref(), Some("0"));
    let blank =
        ReductionSpec::new(&Reduction { reduce_type: Some(""), ..Reduction::new("T x", "T y", "x", "a + b", "y = a", Some(" "), "s") })
            .unwrap();
    assert_eq!((blank.identity, blank.reduce_type), (None, None));
}

#[test]
fn a_placeholder_only_raw_inputs_use_is_fine() {
    let s = ElementwiseSpec::new("float32 x, raw U table", "float32 z", "z = x + table[0]", "k", "", "", "").unwrap();
    assert_eq!(s.type_vars(), vec!['U']);
    Signature::parse(&s.signature()).unwrap();
}

#[test]
fn names_must_be_c_identifiers_and_not_reserved() {
    let name = |n: &str| err(ElementwiseSpec::new("T x", "T z", "z = x", n, "", "", ""));
    assert_eq!(
        name("my-kernel"),
        "ElementwiseKernel name `my-kernel` is not a C identifier (ASCII letters, digits and `_`, not starting with a digit)"
    );
    assert_eq!(
        name("1st"),
        "ElementwiseKernel name `1st` is not a C identifier (ASCII letters, digits and `_`, not starting with a digit)"
    );
    assert_eq!(name(""), "ElementwiseKernel name `` is not a C identifier (ASCII letters, digits and `_`, not starting with a digit)");
    assert_eq!(name("class"), "ElementwiseKernel name `class` is a C++ keyword");
    assert_eq!(name("_k"), "ElementwiseKernel name `_k` is reserved: names starting with `_` or `dlbridge` belong to the generated code");
    assert_eq!(name(&"k".repeat(65)), format!("ElementwiseKernel name `{}` is longer than 64 bytes", "k".repeat(65)));
    assert_eq!(name(&"k".repeat(5000)), format!("ElementwiseKernel name `{}...` is longer than 64 bytes", "k".repeat(77)));
    let param = |i: &str, o: &str| err(ew(i, o));
    assert_eq!(
        param("T i", "T z"),
        "ElementwiseKernel `k`: in_params: parameter name `i` is reserved: the generated code declares it (`i` the flat index, `_ind` the size)"
    );
    assert!(ew("T x, int32 n", "T z").is_ok(), "`n` is free for parameters, as in CuPy");
    assert!(param("T _ind", "T z").contains("parameter name `_ind` is reserved"));
    assert_eq!(
        param("T x", "T dlbridge_out"),
        "ElementwiseKernel `k`: out_params: parameter name `dlbridge_out` is reserved: names starting with `_` or `dlbridge` belong to the generated code"
    );
    assert_eq!(
        param("T x", "T _z"),
        "ElementwiseKernel `k`: out_params: parameter name `_z` is reserved: names starting with `_` or `dlbridge` belong to the generated code"
    );
    assert_eq!(param("T int", "T z"), "ElementwiseKernel `k`: in_params: parameter name `int` is a C++ keyword");
    assert_eq!(
        param("T x, T int64_t", "T z"),
        "ElementwiseKernel `k`: in_params: parameter name `int64_t` is reserved: the generated code uses that type or namespace"
    );
    assert!(param("T std", "T z").contains("parameter name `std` is reserved"));
    assert_eq!(
        param("T x.y", "T z"),
        "ElementwiseKernel `k`: in_params: parameter name `x.y` is not a C identifier (ASCII letters, digits and `_`, not starting with a digit)"
    );
    assert_eq!(
        param("T x, T x", "T z"),
        "ElementwiseKernel `k`: in_params: parameter `x` is declared twice (names are unique across in_params and out_params)"
    );
    assert_eq!(
        param("T x", "T x"),
        "ElementwiseKernel `k`: out_params: parameter `x` is declared twice (names are unique across in_params and out_params)"
    );
    assert_eq!(param("T x, T T", "T z"), "ElementwiseKernel `k`: in_params: parameter `T` has the name of a type placeholder");
}

#[test]
fn parameter_text_errors_name_the_kernel() {
    assert_eq!(
        err(ew("T x, raww T y", "T z")),
        "ElementwiseKernel `k`: in_params: parameter 2 (`raww T y`): unknown keyword `raww` (the keywords are `raw` and `mut`, also spelt `_non_const`)"
    );
    assert_eq!(err(red("T x", "T")), "ReductionKernel `r`: out_params: parameter 1 (`T`): expected `TYPE NAME`, e.g. `T x` or `float32 x`");
}

#[test]
fn elementwise_placement_rules() {
    assert_eq!(
        err(ew("T x", "mut T z")),
        "ElementwiseKernel `k`: out_params: output `z` is `mut`: outputs are always written, `mut` is for inputs"
    );
    // No non-raw input: the caller gives the loop's shape (CuPy's size=) through `_loop`.
    let sized = ew("raw T x", "T z").unwrap();
    assert!(sized.sized_by_caller() && !sized.outputs_given());
    assert!(sized.signature().ends_with("(x: T[...R0], _loop: u8[*S]) -> (z: T[*S])"), "{}", sized.signature());
    // A raw output is passed by the caller, as a `mut` input with its own group.
    let raw_out = ew("raw T x", "raw T y").unwrap();
    assert!(raw_out.sized_by_caller() && raw_out.outputs_given());
    assert!(raw_out.signature().ends_with("(x: T[...R0], _loop: u8[*S], y: mut T[...R1])"), "{}", raw_out.signature());
    assert!(!ew("T x", "T z").unwrap().sized_by_caller());
    // An output type no input has is bound by the array passed for it (CuPy's super-generic example).
    let given = ew("X x, Y y", "Z z, X w").unwrap();
    assert!(given.outputs_given());
    assert!(given.signature().ends_with("(x: X[*S], y: Y[*S], z: mut Z[*S], w: mut X[*S])"), "{}", given.signature());
    assert!(!ew("T x", "T z").unwrap().outputs_given());
    assert_eq!(
        err(ew("A a, B b, C c, D d, E e", "A z")),
        "ElementwiseKernel `k`: 5 type placeholders (`A`, `B`, `C`, `D`, `E`); at most 4 are supported"
    );
    assert_eq!(
        err(ew("T x, raw T a, raw T b, raw T c, raw T d", "T z")),
        "ElementwiseKernel `k`: 4 raw parameters; at most 3 are supported (each is one `...` group of the signature)"
    );
    let many: Vec<String> = (0..17).map(|k| format!("T x{k}")).collect();
    assert_eq!(
        err(ew(&many.join(", "), "T z")),
        "ElementwiseKernel `k`: 18 parameters; at most 16 inputs and outputs together are supported"
    );
    // A kernel without outputs writes a `mut` input in place.
    ElementwiseSpec::new("mut T x", "", "x = x * 2", "k", "", "", "").unwrap();
}

#[test]
fn kernel_texts_are_checked() {
    assert_eq!(err(ElementwiseSpec::new("T x", "T z", "  ", "k", "", "", "")), "ElementwiseKernel `k`: operation is empty");
    assert_eq!(
        err(ElementwiseSpec::new("T x", "T z", "z = x", "k", "int a;\0", "", "")),
        "ElementwiseKernel `k`: preamble contains a NUL character"
    );
    assert_eq!(
        err(ReductionSpec::new(&Reduction::new("T x", "T y", "x", "", "y = a", None, "r"))),
        "ReductionKernel `r`: reduce_expr is empty"
    );
    assert_eq!(
        err(ReductionSpec::new(&Reduction::new("T x", "T y", "x", "a + b", "y = a", Some("0\0"), "r"))),
        "ReductionKernel `r`: identity contains a NUL character"
    );
}

#[test]
fn reduction_placement_rules() {
    for ((i, o), says) in [
        (("raw T x", "T y"), "in_params: input `x` is raw: reduction inputs are never raw"),
        (("mut T x", "T y"), "in_params: input `x` is `mut`: a reduction only reads its inputs"),
        (("T x", "raw T y"), "out_params: output `y` is raw: reduction outputs are never raw"),
        (
            ("", "T y"),
            "out_params: output `y` has type `T`, which no input has, so no call can bind it (give an input type `T` or use a concrete type)",
        ),
        (("", "float32 y"), "in_params is empty: a reduction needs an input to reduce"),
        (("T x", ""), "out_params is empty: a reduction needs an output"),
        (("T x", "mut T y"), "out_params: output `y` is `mut`: outputs are always written, `mut` is for inputs"),
        (
            ("T x", "T i"),
            "out_params: parameter name `i` is reserved: the generated code declares it (`i` the flat index, `_ind` the size)",
        ),
    ] {
        assert_eq!(err(red(i, o)), format!("ReductionKernel `r`: {says}"), "in_params {i:?}, out_params {o:?}");
    }
}

#[test]
fn binding_must_cover_exactly_the_placeholders() {
    let s = ElementwiseSpec::new("T x, U y", "T z", "z = x + y", "k", "", "", "").unwrap();
    assert_eq!(err(s.specialised_signature(&[('T', DType::F32)])), "ElementwiseKernel `k`: type placeholder `U` is not bound");
    assert_eq!(
        err(s.specialised_signature(&[('T', DType::F32), ('U', DType::F32), ('V', DType::F32)])),
        "ElementwiseKernel `k`: binds `V`, which is not one of its type placeholders"
    );
    assert_eq!(
        err(s.specialised_signature(&[('T', DType::F32), ('T', DType::F64), ('U', DType::F32)])),
        "ElementwiseKernel `k`: binds `T` twice"
    );
    let r = ReductionSpec::new(&Reduction::new("T x", "T y", "x", "a + b", "y = a", None, "r")).unwrap();
    assert_eq!(err(r.specialised_signature(&[])), "ReductionKernel `r`: type placeholder `T` is not bound");
}
