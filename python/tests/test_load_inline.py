"""dlbridge.load_inline: your own C functions as typed kernels on NumPy and torch CPU tensors."""

from __future__ import annotations

import os

import numpy as np
import pytest

import dlbridge

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", os.environ.get("DLBRIDGE_TEST_CACHE", str(tmp_path_factory.getbasetemp() / "cache")))


SAXPY = """
void py_saxpy(const float* x, float* y, double a, long long n) {
  for (long long i = 0; i < n; ++i) y[i] += (float)a * x[i];
}
"""

MATMUL = """
#include <math.h>
void py_matmul(const T* a, const T* b, T* c, long long M, long long K, long long N) {
  for (long long i = 0; i < M; ++i)
    for (long long j = 0; j < N; ++j) {
      T acc = 0;
      for (long long k = 0; k < K; ++k) acc += a[i * K + k] * b[k * N + j];
      c[i * N + j] = acc;
    }
}
void py_scale(const T* x, double s, long long shift, int neg, T* y, long long B) {
  for (long long i = 0; i < B; ++i) { T v = (T)(s * x[i] + shift); y[i] = neg ? -v : v; }
}
"""

FUNCS = {
    "py_matmul": "py_matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])",
    "py_scale": "py_scale<T: f32|f64>(x: T[...B], s: f64, shift: i64, neg: bool) -> (y: T[...B])",
}


def test_saxpy_writes_a_numpy_array_in_place_and_is_registered():
    mod = dlbridge.load_inline("py_blas1", SAXPY, {"py_saxpy": "py_saxpy(x: f32[N], y: mut f32[N], a: f64)"})
    x = np.arange(4, dtype=np.float32)
    y = np.ones(4, dtype=np.float32)
    mod.py_saxpy(x, y, 2.0)
    np.testing.assert_array_equal(y, [1, 3, 5, 7])
    assert dlbridge.get_kernel("py_saxpy").signature == mod.py_saxpy.signature
    assert "py_saxpy" in [k.name for k in dlbridge.list_kernels()]
    assert "py_blas1" in repr(mod) and "py_saxpy(x: f32[N], y: mut f32[N], a: f64)" in repr(mod) and "cpu" in repr(mod)
    assert "py_saxpy" in dir(mod)
    # torch tensors too
    ty = torch.zeros(4)
    mod.py_saxpy(torch.ones(4), ty, 0.5)
    assert ty.tolist() == [0.5] * 4


def test_a_read_only_array_is_refused_for_a_mut_parameter():
    mod = dlbridge.load_inline("py_blas1_ro", SAXPY, ["py_saxpy(x: f32[N], y: mut f32[N], a: f64)"])
    y = np.ones(3, dtype=np.float32)
    y.flags.writeable = False
    with pytest.raises(Exception, match="y"):
        mod.py_saxpy(np.ones(3, dtype=np.float32), y, 1.0)
    np.testing.assert_array_equal(y, [1, 1, 1])


def test_generic_functions_allocate_outputs_in_the_callers_framework():
    mod = dlbridge.load_inline("py_linalg", MATMUL, FUNCS)
    a, b = np.random.rand(3, 4), np.random.rand(4, 5)
    c = mod.py_matmul(a, b)
    assert isinstance(c, np.ndarray) and c.dtype == np.float64
    np.testing.assert_allclose(c, a @ b, rtol=1e-12)
    ta, tb = torch.rand(6, 2), torch.rand(2, 3)
    tc = mod.py_matmul(ta, tb)
    assert isinstance(tc, torch.Tensor) and tc.dtype == torch.float32
    torch.testing.assert_close(tc, ta @ tb)
    out = torch.empty(6, 3)
    mod.py_matmul(ta, tb, out=out)
    torch.testing.assert_close(out, ta @ tb)
    x = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
    torch.testing.assert_close(mod.py_scale(x, 2.0, 1, True), -(2 * x + 1))
    torch.testing.assert_close(mod.py_scale(x, 0.5, -3, False), 0.5 * x - 3)
    with pytest.raises(ValueError):
        mod.py_matmul(a, np.random.rand(3, 5))
    with pytest.raises(TypeError):
        mod.py_matmul(a.astype(np.int32), b.astype(np.int32))


def test_strided_tensors_are_refused_not_miscomputed():
    mod = dlbridge.load_inline("py_linalg_strided", MATMUL, FUNCS)
    a = torch.rand(4, 3)
    with pytest.raises(ValueError, match=r"py_matmul: argument a: this kernel needs a contiguous \(compact row-major\) tensor, got shape \[3, 4\]"):
        mod.py_matmul(a.t(), torch.rand(4, 2))
    torch.testing.assert_close(mod.py_matmul(a.t().contiguous(), torch.ones(4, 2)), a.t() @ torch.ones(4, 2))


STRIDED = r"""
void scale2d(const double* x, double s, double* y, long long M, long long N,
             const long long* xs, const long long* ys) {
    for (long long i = 0; i < M; i++)
        for (long long j = 0; j < N; j++)
            y[i * ys[0] + j * ys[1]] = s * x[i * xs[0] + j * xs[1]];
}
"""


def test_a_function_that_takes_strides_gets_any_layout_zero_copy():
    mod = dlbridge.load_inline(
        "py_strided", STRIDED, {"scale2d": "scale2d(x: f64[M, N], s: f64) -> (y: f64[M, N])"}, strided=["scale2d"]
    )
    x = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    for view in (x.t(), x[:, ::2], x.flip(0), x[1:3, 2:5], x[:1].expand(3, 6)):
        torch.testing.assert_close(mod.scale2d(view, 2.0), view * 2)
    out = torch.zeros(6, 4, dtype=torch.float64).t()  # written through its own strides
    assert mod.scale2d(x, 1.0, out=out) is out and out.stride() == (1, 4)
    torch.testing.assert_close(out, x)
    with pytest.raises(ValueError, match="output y: writable view: shape \\[4, 6\\] strides \\[0, 0\\] map several elements"):
        mod.scale2d(x, 1.0, out=torch.zeros(1, dtype=torch.float64).expand(4, 6))
    # Inside a compiled graph, a view reaches the function as it is.
    op = dlbridge.torch.as_op(mod.scale2d)
    compiled = torch.compile(lambda a: op(a.t(), 3.0) + 1, fullgraph=True)
    torch.testing.assert_close(compiled(x), x.t() * 3 + 1)
    with pytest.raises(ValueError, match="`strided` names `nope`, which `functions` does not list"):
        dlbridge.load_inline("py_strided_bad", STRIDED, ["scale2d(x: f64[M, N], s: f64) -> (y: f64[M, N])"], strided=["nope"])


def test_reloading_a_library_replaces_its_functions():
    v1 = "void py_bump(float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] += 1; }"
    v2 = "void py_bump(float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] += 10; }"
    sig = {"py_bump": "py_bump(y: mut f32[N])"}
    dlbridge.load_inline("py_reload", v1, sig)
    dlbridge.load_inline("py_reload", v2, sig)
    y = np.zeros(2, dtype=np.float32)
    dlbridge.get_kernel("py_bump")(y)
    np.testing.assert_array_equal(y, [10, 10])


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"functions\[\"py_other\"\] has the signature of `py_saxpy`"):
        dlbridge.load_inline("py_err", SAXPY, {"py_other": "py_saxpy(x: f32[N], y: mut f32[N], a: f64)"})
    with pytest.raises(ValueError, match="give c_source, cuda_source, sources, or several"):
        dlbridge.load_inline("py_err", None, ["f(x: f32[N])"])
    with pytest.raises(ValueError, match="clashes with the kernel `axpy`"):
        dlbridge.load_inline("py_err", "void axpy(const float* x, float* y, double a, long long n) {}", ["axpy(x: f32[N], y: mut f32[N], a: f64)"])
    bad = "\nvoid py_bad(const float* x, float* y, float a, long long n) {}\n"
    with pytest.raises(ValueError, match="c_source line 2, column") as e:
        dlbridge.load_inline("py_err", bad, ["py_bad(x: f32[N], y: mut f32[N], a: f64)"])
    assert "void py_bad(const float* x, float* y, double a, long long N);" in str(e.value)
    with pytest.raises(TypeError):
        dlbridge.load_inline("py_err", SAXPY, "py_saxpy(x: f32[N], y: mut f32[N], a: f64)")


def test_the_library_name_and_the_flags_cannot_smuggle_code_or_split_into_characters():
    sig = ["py_saxpy(x: f32[N], y: mut f32[N], a: f64)"]
    # The name reaches generated code and file names: a C identifier, bounded, like a kernel's.
    for name in ("lib\nint evil = 1;", "a-b", "", "x" * 300):
        with pytest.raises(ValueError, match="(?s)load_inline: the library name `.*` (is not a C identifier|is longer than)"):
            dlbridge.load_inline(name, SAXPY, sig)
    # A str of flags is not a list of flags.
    for what in ("extra_cflags", "cuda_options"):
        with pytest.raises(TypeError, match=f"{what} must be a list of str"):
            dlbridge.load_inline("py_flags", SAXPY, sig, **{what: "-O2 -g"})
        with pytest.raises(TypeError, match=f"{what} must be a list of str"):
            dlbridge.load_inline("py_flags", SAXPY, sig, **{what: ["-O2", 3]})


def test_a_cpp_exception_becomes_a_python_exception():
    src = 'void py_throws(float* y, long long n) { if (n > 2) throw std::runtime_error("too long"); }'
    mod = dlbridge.load_inline("py_throw", src, ["py_throws(y: mut f32[N])"])
    mod.py_throws(np.zeros(2, dtype=np.float32))
    with pytest.raises(RuntimeError, match="too long"):
        mod.py_throws(np.zeros(3, dtype=np.float32))


def test_integer_division_by_zero_in_an_inline_function_is_an_error_not_a_crash():
    mod = dlbridge.load_inline(
        "inl_divzero",
        "void idiv(const int* x, long long d, int* y, long long n) { for (long long i = 0; i < n; i++) y[i] = x[i] / d; }",
        {"idiv": "idiv(x: i32[N], d: i64) -> (y: i32[N])"},
    )
    x = np.arange(6, dtype=np.int32) * 10
    with pytest.raises(RuntimeError, match=r"^idiv: integer division or modulo by zero"):
        mod.idiv(x, 0)
    np.testing.assert_array_equal(mod.idiv(x, 5), x // 5)


def test_zero_size_tensors_are_accepted_whatever_their_strides():
    import torch

    mod = dlbridge.load_inline(
        "py_zero_size",
        "void zs_copy(const float* x, float* y, long long M, long long N) { for (long long i = 0; i < M * N; i++) y[i] = x[i]; }",
        {"zs_copy": "zs_copy(x: f32[M, N]) -> (y: f32[M, N])"},
    )
    for shape in ((3, 0), (0, 3), (0, 0)):
        x = torch.empty(shape)  # torch.empty(3, 0).stride() == (1, 1)
        y = mod.zs_copy(x)
        assert isinstance(y, torch.Tensor) and tuple(y.shape) == shape
        assert mod.zs_copy(np.empty(shape, np.float32)).shape == shape


CPP = r"""
#include <vector>
#include <numeric>
#include <algorithm>

template <typename V>
static V sum_of(const std::vector<V>& v) { return std::accumulate(v.begin(), v.end(), V(0)); }

static float twice(float x) { return 2 * x; }
static double twice(double x) { return 2 * x; }

void cpp_normalise(const float* x, float* y, long long n) {
  std::vector<float> v(x, x + n);
  const float s = sum_of(v);
  std::transform(v.begin(), v.end(), y, [s](float e) { return twice(e) / (2 * s); });
}
"""


def test_cpp_with_templates_overloads_and_standard_headers_compiles_as_cpp():
    mod = dlbridge.load_inline("cpp_as_cpp", CPP, ["cpp_normalise(x: f32[N]) -> (y: f32[N])"])
    x = np.array([1, 2, 3, 4], np.float32)
    np.testing.assert_allclose(mod.cpp_normalise(x), x / x.sum(), rtol=1e-6)


def test_source_files_are_compiled_by_path_and_a_changed_header_makes_a_new_build(tmp_path):
    (tmp_path / "scale.h").write_text("static const float kScale = 3;\n")
    src = tmp_path / "scale.cpp"
    src.write_text('#include "scale.h"\nvoid file_scale(const float* x, float* y, long long n) {\n  for (long long i = 0; i < n; ++i) y[i] = kScale * x[i];\n}\n')
    sig = ["file_scale(x: f32[N]) -> (y: f32[N])"]
    x = np.arange(4, dtype=np.float32)
    mod = dlbridge.load_inline("from_files", functions=sig, sources=[src])
    np.testing.assert_array_equal(mod.file_scale(x), 3 * x)
    (tmp_path / "scale.h").write_text("static const float kScale = 5;\n")
    mod = dlbridge.load_inline("from_files", functions=sig, sources=[str(src)])
    np.testing.assert_array_equal(mod.file_scale(x), 5 * x)
    src.write_text('#include "scale.h"\nvoid file_scale(const float* x, float* y, long long n) {\n  y[0] = undefined_here;\n}\n')
    with pytest.raises(ValueError, match="scale.cpp:3"):
        dlbridge.load_inline("from_files", functions=sig, sources=[src])
    with pytest.raises(FileNotFoundError, match="load_inline 'from_files': the source file .*no_such_file.cpp does not exist"):
        dlbridge.load_inline("from_files", functions=sig, sources=[tmp_path / "no_such_file.cpp"])
    with pytest.raises(TypeError, match="sources must be a list of paths"):
        dlbridge.load_inline("from_files", functions=sig, sources=str(src))
    with pytest.raises(FileNotFoundError, match="is not a file"):
        dlbridge.load_inline("from_files", functions=sig, sources=[tmp_path])


@pytest.mark.parametrize("flag", ["-include", "-imacros"])
def test_a_file_a_flag_makes_the_compiler_read_is_part_of_the_build_and_the_kernels_digest(tmp_path, flag):
    header = tmp_path / "scale.h"
    src = "void flag_scale(const float* x, float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] = FLAG_SCALE * x[i]; }"
    sig = ["flag_scale(x: f32[N]) -> (y: f32[N])"]
    x = np.arange(3, dtype=np.float32)
    digests = []
    for scale in (2, 3):
        header.write_text(f"#define FLAG_SCALE {scale}\n")
        mod = dlbridge.load_inline("flag_files", src, sig, extra_cflags=[flag, str(header)])
        np.testing.assert_array_equal(mod.flag_scale(x), scale * x)
        digests.append(mod.flag_scale._digest())
    assert digests[0] != digests[1], "a program built for one header's kernel must not run the other's"


def test_the_build_follows_every_include_the_compiler_reads_however_the_source_spells_it(tmp_path):
    # A splice past a form feed ends the comment for GCC: the `#include` is live code.
    header = tmp_path / "hidden_scale.h"
    src = (f"/* *\\\f\n/\n#include \"{header}\"\n/* */\n"
           "void hidden_scale(const float* x, float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] = HIDDEN_SCALE * x[i]; }\n")
    x = np.ones(2, np.float32)
    for scale in (2, 7):
        header.write_text(f"#define HIDDEN_SCALE {scale}\n")
        mod = dlbridge.load_inline("hidden_include", src, ["hidden_scale(x: f32[N]) -> (y: f32[N])"])
        np.testing.assert_array_equal(mod.hidden_scale(x), [scale, scale])


def test_the_compilers_search_path_variables_do_not_reach_a_build(tmp_path, monkeypatch):
    (tmp_path / "only_on_the_env_path.h").write_text("#define ENV_SCALE 3\n")
    monkeypatch.setenv("CPLUS_INCLUDE_PATH", str(tmp_path))
    monkeypatch.setenv("CPATH", str(tmp_path))
    src = '#include <only_on_the_env_path.h>\nvoid env_scale(const float* x, float* y, long long n) { y[0] = ENV_SCALE; }\n'
    with pytest.raises(ValueError, match="only_on_the_env_path.h"):
        dlbridge.load_inline("env_paths", src, ["env_scale(x: f32[N]) -> (y: f32[N])"])


def test_a_response_file_in_the_flags_is_refused_naming_it(tmp_path):
    flags = tmp_path / "flags.txt"
    flags.write_text("-DFLAG_SCALE=2\n")
    src = "void at_scale(const float* x, float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] = FLAG_SCALE * x[i]; }"
    with pytest.raises(ValueError, match=r"load_inline \"at_files\": extra_cflags `@.*` is a response file.*pass the flags themselves"):
        dlbridge.load_inline("at_files", src, ["at_scale(x: f32[N]) -> (y: f32[N])"], extra_cflags=[f"@{flags}"])


def test_a_name_or_source_of_the_wrong_type_is_a_type_error_naming_it():
    sig = ["wrong_types(x: f32[N]) -> (y: f32[N])"]
    with pytest.raises(TypeError, match="load_inline: name must be a str"):
        dlbridge.load_inline(None, "void wrong_types() {}", sig)
    with pytest.raises(TypeError, match="load_inline 'wrong_types': c_source must be a str of source text or None, got bytes"):
        dlbridge.load_inline("wrong_types", b"void wrong_types() {}", sig)
    with pytest.raises(TypeError, match="cuda_source must be a str"):
        dlbridge.load_inline("wrong_types", None, sig, cuda_source=42)
