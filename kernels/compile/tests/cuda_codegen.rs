//! The CUDA backend without a GPU: the CUDA C generated for CuPy's documented
//! examples compiles with NVRTC (to PTX for compute_75 and to PTX and CUBIN
//! for sm_90), compile errors point at the user's text, unsupported dtypes
//! are Type errors, and both devices are registered. Without NVRTC the
//! compiling tests print `skipped: <reason>` and return.

use dlbridge_compile::internals::{CUDA_GENERATED_FILE as GENERATED_FILE, CudaSource, elementwise_source, reduction_source};
use dlbridge_compile::{ElementwiseKernel, ElementwiseOptions, Reduction, ReductionKernel};
use dlbridge_compile::{ElementwiseSpec, ReductionSpec};
use dlbridge_core::{DType, DeviceType, ErrorKind};
use dlbridge_cuda::generated::Program;
use dlbridge_registry::Registry;

const ARCHS: [&str; 2] = ["--gpu-architecture=compute_75", "--gpu-architecture=sm_90"];

use dlbridge_cuda::nvrtc::available_or_skip as nvrtc_or_skip;

fn ew(i: &str, o: &str, op: &str, name: &str) -> ElementwiseSpec {
    ElementwiseSpec::new(i, o, op, name, "", "", "").unwrap()
}

/// An argmax whose reduce type is a struct of the preamble (no identity), named `name`.
fn argmax(name: &str) -> ReductionSpec {
    ReductionSpec::new(&Reduction {
        reduce_type: Some("Pair"),
        preamble: "struct Pair { double v; long long j; };",
        ..Reduction::new(
            "T x",
            "int64 idx",
            "Pair{(double)x, _j}",
            "(b.v > a.v || (b.v == a.v && b.j < a.j)) ? b : a",
            "idx = a.j",
            None,
            name,
        )
    })
    .unwrap()
}

/// Compiles for both architectures (and a CUBIN for sm_90) and checks the entry point.
fn compiles(src: &CudaSource) {
    for arch in ARCHS {
        let ptx = src.ptx(arch).unwrap_or_else(|e| panic!("{} for {arch}: {e}\n{}", src.entry, src.text));
        assert!(ptx.contains(&format!(".entry {}(", src.entry)), "{} for {arch}", src.entry);
    }
    let cubin = src.program().cubin("--gpu-architecture=sm_90").unwrap();
    assert!(cubin.starts_with(b"\x7fELF"), "a CUBIN is an ELF image");
}

#[test]
fn cupys_elementwise_examples_compile_for_compute_75_and_sm_90() {
    if !nvrtc_or_skip() {
        return;
    }
    let sq32 = ew("float32 x, float32 y", "float32 z", "z = (x - y) * (x - y)", "squared_diff");
    compiles(&elementwise_source(&sq32, &[]).unwrap());
    let sq = ew("T x, T y", "T z", "z = (x - y) * (x - y)", "squared_diff_generic");
    for d in
        [DType::F32, DType::F64, DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64, DType::BOOL]
    {
        let src = elementwise_source(&sq, &[('T', d)]).unwrap();
        for arch in ARCHS {
            src.ptx(arch).unwrap_or_else(|e| panic!("{d} {arch}: {e}"));
        }
    }
    let rev = ew("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse");
    compiles(&elementwise_source(&rev, &[('T', DType::F32)]).unwrap());
    // A raw argument with _ind.size(), n, its own size and shape, loop_prep / after_loop / preamble.
    let spec = ElementwiseSpec::new(
        "T x, raw U table, mut T acc",
        "T z, float64 w",
        "T s = twice(x); z = s + table[i % table.size()] + (T)_ind.ndim() + (T)table.shape()[0]; acc = acc + z; w = n + count; \
         if (i < 0) continue;",
        "raw_and_ind",
        "template <typename V> __device__ V twice(V v) { return v + v; }",
        "long long count = 0; const double inf = CUDART_INF;",
        "count += 1; (void)inf;",
    )
    .unwrap();
    compiles(&elementwise_source(&spec, &[('T', DType::F64), ('U', DType::I32)]).unwrap());
    // A kernel without outputs writes a `mut` input in place; helpers without __device__ compile (-default-device).
    let spec = ElementwiseSpec::new("mut T x", "", "x = helper(x)", "in_place", "float helper(float v) { return v * 2; }", "", "").unwrap();
    compiles(&elementwise_source(&spec, &[('T', DType::F32)]).unwrap());
}

/// A parameter named `n` takes CuPy-less `n` over in the body, and the loop
/// over the elements never reads it (a scalar `n` of 5 would otherwise run 5
/// elements of 10, a raw `n` would not compile).
#[test]
fn a_parameter_named_n_does_not_bound_the_loop() {
    for (params, op) in [("T x, int32 n", "y = x * n"), ("T x, raw T n", "y = x + n[0]")] {
        let src = elementwise_source(&ew(params, "T y", op, "param_n"), &[('T', DType::F32)]).unwrap();
        let text = &src.text;
        assert!(text.contains("i < _size; i += _stride") && text.contains("_q < _nv; _q += _stride"), "{text}");
        assert!(!text.contains("const ptrdiff_t n = _size;"), "the parameter is the only `n`: {text}");
        if nvrtc_or_skip() {
            compiles(&src);
        }
    }
    let src = elementwise_source(&ew("T x", "T y", "y = x + n", "size_n"), &[('T', DType::F32)]).unwrap();
    assert!(src.text.contains("const ptrdiff_t n = _size;"), "without a parameter `n` is the size, as on the CPU");
}

#[test]
fn cupys_reduction_examples_compile_with_and_without_an_identity() {
    if !nvrtc_or_skip() {
        return;
    }
    let l2 = ReductionSpec::new(&Reduction::new("T x", "T y", "x * x", "a + b", "y = sqrt(a)", Some("0"), "l2norm")).unwrap();
    for d in [DType::F32, DType::F64] {
        compiles(&reduction_source(&l2, &[('T', d)]).unwrap());
    }
    let mx = ReductionSpec::new(&Reduction::new("T x", "T y", "x", "max(a, b)", "y = a", None, "my_max")).unwrap();
    for d in [DType::F32, DType::I32, DType::U8, DType::I64] {
        compiles(&reduction_source(&mx, &[('T', d)]).unwrap());
    }
    // Two inputs, two outputs, a reduce_type, _i / _j / _J, a struct reduce type from the preamble.
    let dot = ReductionSpec::new(&Reduction {
        reduce_type: Some("float64"),
        ..Reduction::new(
            "T x, T y",
            "float64 s, T mean",
            "(double)x * (double)y + 0 * (_i + _j)",
            "a + b",
            "s = a; mean = (T)(a / _J)",
            Some("0"),
            "dot_mean",
        )
    })
    .unwrap();
    compiles(&reduction_source(&dot, &[('T', DType::F32)]).unwrap());
    let argmax = argmax("argmax_pair");
    compiles(&reduction_source(&argmax, &[('T', DType::F64)]).unwrap());
}

#[test]
fn the_generated_source_uses_the_indexer_grid_stride_loops_and_line_directives() {
    let rev = ew("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse");
    let src = elementwise_source(&rev, &[('T', DType::I32)]).unwrap();
    let t = &src.text;
    assert_eq!(src.entry, "dlbridge_add_reverse");
    assert!(t.contains("struct DlbIndexer"), "the shared indexer");
    assert!(t.contains("typedef int32_t T;"));
    assert!(t.contains("const ::ptrdiff_t _stride = static_cast< ::ptrdiff_t>(gridDim.x) * blockDim.x;"), "grid-stride");
    assert!(t.contains("i < _size; i += _stride"), "grid-stride");
    assert!(t.contains("dlbridge_kContig ? i : dlbridge_offset(_x0, i)"), "contiguous fast path");
    assert!(t.contains("typedef T dlbridge_type_T;"), "the generated code's own name of the type");
    assert!(t.contains("const dlbridge::Raw<const dlbridge_type_T> y(_p1, _x1, _n1, _c1);"));
    assert!(t.contains("#line 1 \"operation\"\nz = x + y[_ind.size() - i - 1]\n; } while (0);\n"));
    assert!(!t.contains("#pragma once"));
    // Every return to generated numbering names the true next line.
    for (at, l) in t.lines().enumerate() {
        if let Some(rest) = l.strip_prefix("#line ")
            && rest.ends_with(&format!("\"{GENERATED_FILE}\""))
        {
            let n: usize = rest.split(' ').next().unwrap().parse().unwrap();
            assert_eq!(n, at + 2, "line {}: {l}", at + 1);
        }
    }
    let red = ReductionSpec::new(&Reduction::new("T x", "T y", "x", "a + b", "y = a", None, "s")).unwrap();
    let t = reduction_source(&red, &[('T', DType::F32)]).unwrap().text;
    assert!(
        t.contains("  a.has = false;") && t.contains("  if (!b.has) return a;") && !t.contains("dlbridge_identity"),
        "no identity: flags"
    );
    assert!(t.contains("void __launch_bounds__(512) dlbridge_s_finish("), "the second pass of a split reduction");
}

#[test]
fn a_compile_error_points_at_the_operations_line() {
    if !nvrtc_or_skip() {
        return;
    }
    let spec = ew("T x", "T z", "T t = x;\nz = t * undefined_q;", "broken_cuda");
    let e = elementwise_source(&spec, &[('T', DType::F32)]).unwrap().ptx(ARCHS[0]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Value);
    let m = e.to_string();
    assert!(m.starts_with("ElementwiseKernel broken_cuda (T=f32): NVRTC"), "{m}");
    assert!(m.contains("operation line 2: error: identifier \"undefined_q\" is undefined\n    z = t * undefined_q;\n            ^"), "{m}");
    // Writing an input suggests `mut`.
    let spec = ew("T x", "T z", "x = 1; z = x;", "writes_input");
    let m = elementwise_source(&spec, &[('T', DType::F32)]).unwrap().ptx(ARCHS[0]).unwrap_err().to_string();
    assert!(m.contains("operation line 1: error:") && m.contains("declare the parameter `mut`"), "{m}");
    // Reductions: the map expression's own line.
    let red = ReductionSpec::new(&Reduction::new("T x", "T y", "x * nope", "a + b", "y = a", Some("0"), "broken_red")).unwrap();
    let m = reduction_source(&red, &[('T', DType::F64)]).unwrap().ptx(ARCHS[1]).unwrap_err().to_string();
    assert!(m.contains("map_expr line 1: error: identifier \"nope\" is undefined"), "{m}");
    // A preamble error.
    let spec = ElementwiseSpec::new("T x", "T z", "z = x", "broken_pre", "int f() { return missing; }", "", "").unwrap();
    let m = elementwise_source(&spec, &[('T', DType::I32)]).unwrap().ptx(ARCHS[0]).unwrap_err().to_string();
    assert!(m.contains("preamble line 1: error: identifier \"missing\" is undefined"), "{m}");
}

#[test]
fn complex_is_a_type_error_naming_the_dtype_and_f16_bf16_compile() {
    assert_eq!(dlbridge_compile::internals::CUDA_DTYPES.len(), 13);
    assert!(dlbridge_compile::internals::CUDA_DTYPES.iter().all(|d| !matches!(d.code(), dlbridge_core::DTypeCode::Complex)));
    let red = ReductionSpec::new(&Reduction::new("complex64 x", "float32 y", "0", "a + b", "y = a", Some("0"), "rc")).unwrap();
    let e = reduction_source(&red, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Type);
    assert!(e.to_string().contains("dtype c64 (complex64) is not supported by the CUDA backend"), "{e}");
    let spec = ew("T x", "T z", "z = x", "k");
    let e = elementwise_source(&spec, &[('T', DType::C128)]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("ElementwiseKernel `k`: type placeholder `T`: dtype c128 (complex128) is not supported by the CUDA backend (yet)"),
        "{e}"
    );
    if !nvrtc_or_skip() {
        return;
    }
    // float16/bfloat16 bodies as CuPy writes them: arithmetic, math functions, max/min, compound assignment.
    let spec = ew("T x, T y", "T z", "T t = x * y + 1; z = max(t, x) + exp(y) - sqrt(abs(x)); z += 1; z *= 0.5", "half_body");
    for d in [DType::F16, DType::BF16] {
        compiles(&elementwise_source(&spec, &[('T', d)]).unwrap());
    }
    let spec = ew("float16 x, bfloat16 y", "float32 z", "z = x + y", "mixed");
    compiles(&elementwise_source(&spec, &[]).unwrap());
    let red = ReductionSpec::new(&Reduction {
        reduce_type: Some("float"),
        ..Reduction::new("T x", "T y", "x", "a + b", "y = a", Some("0"), "rt")
    })
    .unwrap();
    for d in [DType::F16, DType::BF16] {
        compiles(&reduction_source(&red, &[('T', d)]).unwrap());
    }
    let red = ReductionSpec::new(&Reduction::new("T x", "T y", "x", "max(a, b)", "y = a", Some("-CUDART_INF_F"), "rmax")).unwrap();
    compiles(&reduction_source(&red, &[('T', DType::F16)]).unwrap());
    // CuPy's mean idiom: _in_ind.size() / _out_ind.size().
    let post = "y = a / _type_reduce(_in_ind.size() / _out_ind.size())";
    let red = ReductionSpec::new(&Reduction {
        reduce_type: Some("float"),
        ..Reduction::new("T x", "T y", "x", "a + b", post, Some("0"), "rmean")
    })
    .unwrap();
    compiles(&reduction_source(&red, &[('T', DType::BF16)]).unwrap());
}

#[test]
fn both_kernels_register_a_cpu_and_a_cuda_implementation() {
    let reg = Registry::new();
    let k = ElementwiseKernel::new("T x, T y", "T z", "z = x + y", "two_devices_ew", ElementwiseOptions::default()).unwrap();
    let defs = k.defs();
    assert_eq!(defs.iter().map(|d| d.device).collect::<Vec<_>>(), [DeviceType::CPU, DeviceType::CUDA]);
    assert!(defs.iter().all(|d| d.signature == k.signature()));
    let kernel = k.register(&reg).unwrap();
    let devices: Vec<String> = kernel.origins().map(|(d, _)| format!("{d:?}")).collect();
    assert_eq!(devices.len(), 2, "{devices:?}");
    let r = ReductionKernel::new(Reduction::new("T x", "T y", "x", "a + b", "y = a", Some("0"), "two_devices_red")).unwrap();
    assert_eq!(r.defs().iter().map(|d| d.device).collect::<Vec<_>>(), [DeviceType::CPU, DeviceType::CUDA]);
    r.register(&reg).unwrap();
    // Registering again replaces both.
    k.register(&reg).unwrap();
    assert_eq!(k.cuda_specialisations(), 0);
}

#[test]
fn the_program_name_and_options_are_what_the_cache_keys_on() {
    let spec = ew("T x", "T z", "z = x", "keyed");
    let src = elementwise_source(&spec, &[('T', DType::F32)]).unwrap();
    let p: Program = src.program();
    assert_eq!(p.options_for(ARCHS[0]), [ARCHS[0], "--std=c++17", "-default-device"]);
    assert_eq!(p.source(), src.text);
}

#[test]
fn a_contiguous_elementwise_kernel_reads_its_inputs_16_bytes_at_a_time() {
    if !nvrtc_or_skip() {
        return;
    }
    let spec = ew("T x, T y, T b", "T z", "z = x * y + b", "fma_vector");
    // Four elements a load: 16 bytes of f32, two 16-byte loads of f64, 8 bytes of f16 and bf16.
    for (d, wide) in [(DType::F32, ".v4.f32"), (DType::F64, ".v2.f64"), (DType::F16, ".v4.u16"), (DType::BF16, ".v4.u16")] {
        let ptx = elementwise_source(&spec, &[('T', d)]).unwrap().ptx(ARCHS[1]).unwrap();
        let loads: std::collections::BTreeSet<&str> = ptx.split_whitespace().filter(|w| w.starts_with("ld.global")).collect();
        assert!(loads.iter().any(|l| l.contains(wide)), "{d}: no vector load among {loads:?}");
        assert!(!ptx.contains(".local"), "{d}: the register copies spilled to local memory");
    }
}

#[test]
fn generated_kernels_fit_their_largest_block_in_registers_without_spilling() {
    if !nvrtc_or_skip() {
        return;
    }
    let l2 = ReductionSpec::new(&Reduction::new("T x", "T y", "x * x", "a + b", "y = sqrt(a)", Some("0"), "l2_regs")).unwrap();
    let argmax = argmax("argmax_regs");
    let fma = ew("T x, T y, T b", "T z", "z = x * y + b", "fma_regs");
    let sources = [
        (reduction_source(&l2, &[('T', DType::F32)]).unwrap(), 512),
        (reduction_source(&argmax, &[('T', DType::F64)]).unwrap(), 512),
        (elementwise_source(&fma, &[('T', DType::F64)]).unwrap(), 256),
    ];
    for (src, block) in sources {
        let mut options = src.program().options_for("--gpu-architecture=sm_90");
        options.push("--ptxas-options=-v".into());
        let (_, log) =
            dlbridge_cuda::nvrtc::compile_with_log(&src.text, "kernel.cu", &options, dlbridge_cuda::nvrtc::Output::Cubin).unwrap();
        let number_before = |line: &str, what: &str| -> Option<u32> { line[..line.find(what)?].split_whitespace().last()?.parse().ok() };
        let regs: Vec<u32> = log.lines().filter_map(|l| number_before(l, "registers")).collect();
        let spills: Vec<u32> = log.lines().filter_map(|l| number_before(l, "bytes spill stores")).collect();
        assert!(!regs.is_empty() && regs.iter().all(|r| r * block <= 65_536), "{}: {regs:?} registers, {block} threads\n{log}", src.entry);
        assert!(spills.iter().all(|&s| s == 0), "{} spills: {log}", src.entry);
    }
}

#[test]
fn the_operation_is_pasted_once_so_labels_and_errors_appear_once() {
    let spec = ew("T x", "T z", "z = 0; if (x < 0) goto done; z = x; done: ;", "with_label");
    let src = elementwise_source(&spec, &[('T', DType::F32)]).unwrap();
    assert_eq!(src.text.matches("#line 1 \"operation\"").count(), 1, "{}", src.text);
    if nvrtc_or_skip() {
        compiles(&src);
    }
}
