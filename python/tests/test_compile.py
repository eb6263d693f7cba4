"""Kernels from source: CuPy's documented ElementwiseKernel examples, run as written with
``dlbridge`` in place of ``cupy`` and NumPy or torch arrays in place of CuPy's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dlbridge

from conftest import Box, cupy_l2norm, cupy_squared_diff, on_threads

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    # Subprocesses started by a test see the same directory the test asks for.
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", os.environ.get("DLBRIDGE_TEST_CACHE", str(tmp_path_factory.getbasetemp() / "cache")))


# --- CuPy's user guide, "User-Defined Kernels", as written (cp -> dlbridge / np) ---------


def test_cupy_squared_difference_example_runs_as_written():
    squared_diff = cupy_squared_diff("squared_diff")
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    y = np.arange(5, dtype=np.float32)
    got = squared_diff(x, y)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (2, 5)
    np.testing.assert_array_equal(got, (x - y) ** 2)
    np.testing.assert_array_equal(squared_diff(x, 5), (x - 5) ** 2)
    z = np.empty((2, 5), dtype=np.float32)
    assert squared_diff(x, y, z) is z  # the output given, not a tuple of it
    np.testing.assert_array_equal(z, (x - y) ** 2)
    assert squared_diff(x, y, out=z) is z


def test_cupy_generic_squared_difference_binds_T_from_the_arguments():
    squared_diff_generic = cupy_squared_diff("squared_diff_generic")
    for dtype in (np.float32, np.float64, np.int32, np.int64):
        x = np.arange(10, dtype=dtype).reshape(2, 5)
        y = np.arange(5, dtype=dtype)
        got = squared_diff_generic(x, y)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, (x - y) * (x - y))
    # A scalar takes T from the array.
    x = np.arange(6, dtype=np.float64)
    np.testing.assert_array_equal(squared_diff_generic(x, 2.5), (x - 2.5) ** 2)
    # Mismatched dtypes are refused, naming the argument and what bound T.
    with pytest.raises(TypeError, match=r"argument y: dtype mismatch: expected T = f32 \(bound by x\), got f64"):
        squared_diff_generic(np.zeros(3, np.float32), np.zeros(3, np.float64))


def test_cupy_super_generic_squared_difference_binds_Z_from_the_output_given():
    squared_diff_super_generic = cupy_squared_diff("squared_diff_super_generic")
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    y = np.arange(5, dtype=np.int32)
    z = np.empty((2, 5), dtype=np.float64)
    assert squared_diff_super_generic(x, y, z) is z
    np.testing.assert_array_equal(z, (x.astype(np.float64) - y) ** 2)
    z16 = np.empty((2, 5), dtype=np.int16)
    assert squared_diff_super_generic(x, y, out=z16) is z16
    np.testing.assert_array_equal(z16, ((x - y) ** 2).astype(np.int16))
    # Z is no input's type: without z nothing can allocate it.
    with pytest.raises(TypeError, match=r"squared_diff_super_generic: the outputs \(z\) cannot be allocated \(raw, or of a type no input has\)"):
        squared_diff_super_generic(x, y)
    with pytest.raises(ValueError, match="z"):
        squared_diff_super_generic(x, y, np.empty((3, 5), np.float64))


def test_cupy_size_gives_the_loop_of_a_kernel_whose_arguments_are_all_raw():
    # CuPy's user guide: "If you want to mark all arguments as raw, you must specify
    # the size argument on invocation, which defines the value of _ind.size()."
    double_raw = dlbridge.ElementwiseKernel("raw T x", "raw T y", "y[i] = x[i] * 2", "double_raw")
    x = np.arange(5, dtype=np.float32)
    y = np.zeros(5, dtype=np.float32)
    assert double_raw(x, y, size=5) is y
    np.testing.assert_array_equal(y, x * 2)
    y3 = np.zeros(5, dtype=np.float32)
    double_raw(x, y3, size=3)  # only the first 3
    np.testing.assert_array_equal(y3, [0, 2, 4, 0, 0])
    with pytest.raises(TypeError, match="double_raw: every input is raw, so the loop's size must be given"):
        double_raw(x, y)
    with pytest.raises(TypeError, match=r"double_raw: the outputs \(y\) cannot be allocated"):
        double_raw(x, size=5)
    with pytest.raises(RuntimeError, match="raw argument `x`: index 5 is out of range for its 5 elements"):
        double_raw(x, y, size=6)  # never a read past the end
    # A non-raw output of a raw-only kernel takes the loop's shape: size=, or the output given.
    reverse = dlbridge.ElementwiseKernel("raw T x", "T y", "y = x[_ind.size() - i - 1]", "reverse_raw")
    np.testing.assert_array_equal(reverse(x, size=5), x[::-1])
    out = np.empty(5, np.float32)
    assert reverse(x, out) is out
    np.testing.assert_array_equal(out, x[::-1])
    with pytest.raises(TypeError, match="size= is for kernels whose inputs are all raw"):
        dlbridge.ElementwiseKernel("T x", "T y", "y = x", "copy_sized")(x, size=5)


def test_a_kernel_name_is_a_label_and_the_builtin_keeps_its_name():
    relu = dlbridge.ElementwiseKernel("T x", "T y", "y = x > 0 ? x * 2 : 0", "relu")
    again = dlbridge.ElementwiseKernel("T x", "T y", "y = x > 0 ? x * 3 : 0", "relu")
    x = np.array([-1.0, 2.0], np.float32)
    assert relu.name == again.name == "relu"
    assert relu(x).tolist() == [0.0, 4.0] and again(x).tolist() == [0.0, 6.0]
    assert dlbridge.get_kernel("relu")(x).tolist() == [0.0, 2.0], "the built-in"
    assert relu.kernel.name.startswith("relu_") and relu.kernel.name != "relu"
    assert dlbridge.get_kernel(relu.kernel.name) == again.kernel, "the latest kernel of a label replaces the one before"
    l2 = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum")
    assert l2(np.ones((2, 3), np.float32), axis=1).tolist() == [3.0, 3.0]
    assert dlbridge.get_kernel("sum").origins[0][1].startswith("built-in")


def test_cupy_add_reverse_with_a_raw_argument_and_ind_size():
    add_reverse = dlbridge.ElementwiseKernel("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse")
    x = np.arange(5, dtype=np.float32)
    y = np.arange(5, dtype=np.float32) * 10
    np.testing.assert_array_equal(add_reverse(x, y), x + y[::-1])
    # raw arguments take their own layout: a strided view is indexed logically.
    yy = np.arange(10, dtype=np.float32)[::2]
    np.testing.assert_array_equal(add_reverse(x, yy), x + yy[::-1])


def test_torch_tensors_in_torch_tensors_out_with_broadcasting_and_strides():
    k = dlbridge.ElementwiseKernel("T x, T y, T b", "T z", "z = x * y + b", "fma_bcast")
    x = torch.randn(64, 32).t()  # transposed: strided
    y = torch.randn(64, 1).t()  # (1, 64): broadcast along dim 0
    b = torch.randn(32, 1)
    z = k(x, y, b)
    assert isinstance(z, torch.Tensor) and z.shape == (32, 64)
    torch.testing.assert_close(z, x * y + b)


def test_outputs_in_place_and_mut_inputs():
    iadd = dlbridge.ElementwiseKernel("mut T x, T y", "", "x += y", "iadd_mut")
    x = np.ones((3, 4), np.float32)
    y = np.arange(4, dtype=np.float32)
    assert iadd(x, y) is None
    np.testing.assert_array_equal(x, 1 + np.broadcast_to(y, (3, 4)))
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="x"):
        iadd(ro, y)


def test_writing_an_input_without_mut_is_a_clear_error():
    bad = dlbridge.ElementwiseKernel("T x", "T z", "x = 1; z = x", "writes_input")
    with pytest.raises(ValueError) as e:
        bad(np.zeros(3, np.float32))
    assert "operation line 1" in str(e.value) and "`mut`" in str(e.value), str(e.value)


def test_a_compile_error_names_the_line_and_column_of_the_operation():
    k = dlbridge.ElementwiseKernel("T x", "T z", "T t = x;\nz = t * undefined_name;", "bad_body")
    with pytest.raises(ValueError) as e:
        k(np.zeros(3, np.float32))
    msg = str(e.value)
    assert "ElementwiseKernel bad_body (T=f32)" in msg, msg
    assert "operation line 2, column 9" in msg and "undefined_name" in msg, msg
    assert "z = t * undefined_name;\n            ^" in msg, msg


# Source text refused at construction, each with an error that says why: a `return` outside
# the operation,
# an unknown type, a reserved name, and a fragment that would leave its place in the
# generated code (a `}` would end the generated function and put the rest at file scope; an
# open comment or `#if 0` would swallow the generated code after it).
REFUSED = [
    pytest.param(lambda: dlbridge.ElementwiseKernel("T x", "T z", "z = x", "uses_return", loop_prep="if (1) return;"),
                 "use `continue`", id="return-in-loop-prep"),
    pytest.param(lambda: dlbridge.ElementwiseKernel("T x", "T y", "y = x", "return_for_real", after_loop="return"),
                 "uses `return`", id="return-in-after-loop"),
    pytest.param(lambda: dlbridge.ElementwiseKernel("float33 x", "float32 z", "z = x", "bad_type"),
                 "float33", id="unknown-type"),
    pytest.param(lambda: dlbridge.ElementwiseKernel("T i", "T z", "z = i", "reserved_name"),
                 "i", id="reserved-name"),
    pytest.param(lambda: dlbridge.ElementwiseKernel("T x", "T y", "y = x; } void evil() { int z = 0", "escape_brace"),
                 "operation closes a `}` on line 1 that it did not open", id="closing-brace"),
    pytest.param(lambda: dlbridge.ElementwiseKernel("T x", "T y", "y = x", "escape_if", preamble="#if 0"),
                 "preamble leaves the `#if` of line 1 open", id="open-if"),
    pytest.param(lambda: dlbridge.ElementwiseKernel("T x", "T y", "y = x; /*", "escape_comment"),
                 "operation leaves a `/\\*` comment open", id="open-comment"),
    pytest.param(lambda: dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0), evil(", "escape_identity"),
                 "identity closes a `\\)`", id="identity-closing-parenthesis"),
    pytest.param(lambda: dlbridge.ElementwiseKernel("T x", "T y", "y = x", "macro_i", preamble="#define i 0"),
                 "preamble \\(re\\)defines the macro `i`", id="macro-i"),
]


@pytest.mark.parametrize("make, error", REFUSED)
def test_bad_source_text_is_refused_at_construction(make, error):
    with pytest.raises(ValueError, match=error):
        make()


def test_the_kernel_is_registered_for_every_caller():
    dlbridge.ElementwiseKernel("T x", "T y", "y = x * 2", "twice_compiled")
    k = dlbridge.get_kernel("twice_compiled")
    assert k.signature.startswith("twice_compiled<T:") and "x: T[*S]" in k.signature
    np.testing.assert_array_equal(k(np.arange(4.0)), np.arange(4.0) * 2)
    names = [k.name for k in dlbridge.list_kernels()]
    assert "twice_compiled" in names
    # A kernel of the same name replaces it (CuPy's names are labels), a built-in never:
    # a kernel labelled like one is registered under a free variant of the name.
    dlbridge.ElementwiseKernel("T x", "T y", "y = x * 3", "twice_compiled")
    np.testing.assert_array_equal(dlbridge.get_kernel("twice_compiled")(np.arange(4.0)), np.arange(4.0) * 3)
    mine = dlbridge.ElementwiseKernel("T x, T y", "T z", "z = x - y", "add")
    assert mine.kernel.name != "add" and dlbridge.get_kernel("add").origins[0][1].startswith("built-in")


def test_large_inputs_run_on_threads_and_match():
    k = dlbridge.ElementwiseKernel("T x, T y", "T z", "z = x * y + 1", "fma1_big")
    x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    y = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32)
    # Bit for bit: the compiler does not contract x * y + 1 into an FMA.
    np.testing.assert_array_equal(k(x, y), x * y + 1)


def test_a_fused_tanh_gelu_matches_torchs_and_math_functions_vectorise_correctly():
    gelu = dlbridge.ElementwiseKernel(
        "T x",
        "T y",
        "const T c = (T)0.7978845608028654; y = (T)0.5 * x * ((T)1 + tanh(c * (x + (T)0.044715 * x * x * x)));",
        "gelu_tanh_test",
    )
    x = torch.linspace(-12, 12, 1 << 18)
    torch.testing.assert_close(gelu(x), torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-5, atol=1e-6)
    xd = x.double()
    torch.testing.assert_close(gelu(xd), torch.nn.functional.gelu(xd, approximate="tanh"), rtol=1e-12, atol=1e-14)
    erf_k = dlbridge.ElementwiseKernel("T x", "T y", "y = erf(x) + exp(x * (T)0.1) + log1p(abs(x))", "erf_exp_test")
    want = torch.erf(xd) + torch.exp(xd * 0.1) + torch.log1p(xd.abs())
    torch.testing.assert_close(erf_k(x).double(), want, rtol=2e-6, atol=1e-6)


def test_concurrent_first_use_from_threads_compiles_once():
    k = dlbridge.ElementwiseKernel("T x", "T y", "y = x + 7", "concurrent_first")
    x = np.arange(100, dtype=np.int16)
    results = on_threads(lambda: k(x), 8)
    assert len(results) == 8
    for r in results:
        np.testing.assert_array_equal(r, x + 7)


def test_a_second_process_finds_the_kernel_in_the_disk_cache(tmp_path):
    script = textwrap.dedent(
        """
        import time, numpy as np, dlbridge
        t = time.perf_counter()
        k = dlbridge.ElementwiseKernel('T x, T y', 'T z', 'z = (x - y) * (x - y) + 0.25', 'cache_probe')
        z = k(np.arange(4.0), np.ones(4))
        assert list(z) == [1.25, 0.25, 1.25, 4.25], z
        print(dlbridge._dlbridge.compile_stats())
        """
    )
    env = dict(os.environ, DLBRIDGE_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert "'compiled': 1" in first.stdout and "'disk_hits': 0" in first.stdout, first.stdout
    assert "'compiled': 0" in second.stdout and "'disk_hits': 1" in second.stdout, second.stdout
    libs = list((tmp_path / "cpu").glob("*.so"))
    assert len(libs) == 1 and not list((tmp_path / "cpu").glob("*.tmp*")), libs


def test_a_library_planted_in_the_cache_never_runs_its_constructor(tmp_path):
    """Whoever writes into the cache directory (or copies a cache from elsewhere) can
    replace a library and write anything beside it, but cannot seal it with this
    user's secret: the planted library is rebuilt without being opened."""
    script = textwrap.dedent(
        """
        import numpy as np, dlbridge
        k = dlbridge.ElementwiseKernel('T x', 'T z', 'z = x * 3', 'planted_target')
        assert list(k(np.arange(3.0))) == [0.0, 3.0, 6.0]
        print(dlbridge._dlbridge.compile_stats())
        """
    )
    cache = tmp_path / "cache"
    env = dict(os.environ, DLBRIDGE_CACHE_DIR=str(cache))
    subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    (lib,) = (cache / "cpu").glob("*.so")
    marker = tmp_path / "constructor-ran"
    planted = tmp_path / "planted.c"
    planted.write_text(
        "#include <stdio.h>\n"
        f'__attribute__((constructor)) static void run(void) {{ FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
    )
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(planted)], check=True)
    import hashlib

    # What anyone can compute beside it: the library's SHA-256, under every name a digest might have.
    digest = hashlib.sha256(lib.read_bytes()).hexdigest()
    for suffix in (".seal", ".sha256"):
        lib.with_suffix(suffix).write_text(digest)
    again = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert not marker.exists(), "the planted library was loaded"
    assert "'compiled': 1" in again.stdout and "'disk_hits': 0" in again.stdout, again.stdout
    # Rebuilt and sealed again: a third process finds it.
    third = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert "'compiled': 0" in third.stdout and "'disk_hits': 1" in third.stdout, third.stdout


def test_cupy_l2norm_reduction_along_an_axis():
    l2norm_kernel = cupy_l2norm("l2norm")
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    got = l2norm_kernel(x, axis=1)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (2,)
    np.testing.assert_allclose(got, np.linalg.norm(x, axis=1), rtol=1e-6)
    np.testing.assert_allclose(l2norm_kernel(x, axis=0), np.linalg.norm(x, axis=0), rtol=1e-6)
    np.testing.assert_allclose(l2norm_kernel(x), np.linalg.norm(x), rtol=1e-6)
    full = l2norm_kernel(x, keepdims=True)  # every axis, kept: a (1, 1) array, not a scalar
    assert full.shape == (1, 1)
    np.testing.assert_allclose(full, np.linalg.norm(x, keepdims=True), rtol=1e-6)
    kd = l2norm_kernel(x, axis=1, keepdims=True)
    assert kd.shape == (2, 1)
    np.testing.assert_allclose(kd, np.linalg.norm(x, axis=1, keepdims=True), rtol=1e-6)
    # torch in, torch out; a 3-d input over two axes; negative axes.
    t = torch.randn(4, 6, 8, dtype=torch.float64)
    got = l2norm_kernel(t, axis=(0, -1))
    assert isinstance(got, torch.Tensor) and got.shape == (6,)
    torch.testing.assert_close(got, torch.linalg.vector_norm(t, dim=(0, 2)))
    with pytest.raises(ValueError, match="axis 3 is out of bounds"):
        l2norm_kernel(x, axis=3)



def test_reduction_inputs_broadcast_and_axis_takes_numpy_integers():
    wsum = dlbridge.ReductionKernel("T x, T w", "T y", "x * w", "a + b", "y = a", "0", "weighted_sum_bcast")
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    w = np.array([1.0, -2.0, 0.5, 3.0])
    np.testing.assert_allclose(wsum(x, w, axis=1), (x * w).sum(1))
    np.testing.assert_allclose(wsum(w, x, axis=np.int64(0)), (x * w).sum(0))  # the first input broadcasts
    np.testing.assert_allclose(wsum(x, w, axis=(np.int32(0), -1)), (x * w).sum())
    t = torch.from_numpy(x)
    got = wsum(t, torch.from_numpy(w)[None, :], axis=0)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, (t * torch.from_numpy(w)).sum(0))
    with pytest.raises(ValueError, match=r"weighted_sum_bcast: argument w: shape \[3\] does not broadcast"):
        wsum(x, np.ones(3), axis=1)
    with pytest.raises(TypeError, match="axis must be an int or a tuple of ints, not 1.5"):
        wsum(x, w, axis=1.5)


def test_a_reduction_without_identity_and_a_large_full_reduction():
    amax = dlbridge.ReductionKernel("T x", "T y", "x", "max(a, b)", "y = a", None, "amax_noid")
    x = np.random.default_rng(3).standard_normal((300, 7)).astype(np.float64)
    np.testing.assert_array_equal(amax(x, axis=0), x.max(axis=0))
    big = np.random.default_rng(4).standard_normal(1 << 21).astype(np.float32)
    total = dlbridge.ReductionKernel("T x", "float64 y", "x", "a + b", "y = a", "0", "sum_to_f64", reduce_type="float64")
    np.testing.assert_allclose(total(big), big.astype(np.float64).sum(), rtol=1e-9)


def test_break_or_continue_at_the_top_level_ends_one_element_only():
    k = dlbridge.ElementwiseKernel("T x", "T y", "y = x * 2; if (x < 0) { y = 0; break; } if (x > 5) continue; y = y + 1",
                                   "break_one_element")
    x = np.random.default_rng(0).normal(0, 4, 200_000)  # large enough to run in parallel
    want = np.where(x < 0, 0, np.where(x > 5, x * 2, x * 2 + 1))
    np.testing.assert_array_equal(k(x), want)
    out = np.full_like(x, -7.0)
    k(x, out)
    np.testing.assert_array_equal(out, want)
    # A break inside the operation's own loop leaves that loop, as in C.
    first = dlbridge.ElementwiseKernel("T x", "T y", "y = 0; for (int k = 1; k < 100; ++k) { if (k * k > x) { y = k; break; } }",
                                       "break_inner_loop")
    np.testing.assert_array_equal(first(np.array([0.5, 3.0, 50.0])), [1.0, 2.0, 8.0])


def test_return_in_a_comment_is_not_refused():
    k = dlbridge.ElementwiseKernel("T x", "T y", "y = x; // no early return here\n/* return */", "return_in_comment")
    np.testing.assert_array_equal(k(np.arange(3.0)), np.arange(3.0))


def test_a_preamble_macro_that_keeps_to_itself_is_fine():
    k = dlbridge.ElementwiseKernel("T x", "T y", "y = SQ(x)", "macro_ok", preamble="#define SQ(v) ((v) * (v))")
    np.testing.assert_array_equal(k(np.arange(3.0)), [0.0, 1.0, 4.0])


def test_scalars_in_reductions_and_numpy_bool_scalars():
    wsum = dlbridge.ReductionKernel("T x, T w", "T y", "x * w", "a + b", "y = a", "0", "scaled_sum_scalar")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(wsum(x, 2.0, axis=1), (x * 2).sum(1))
    assert wsum(x, 2.0, axis=1).dtype == np.float32  # the scalar takes T from x, as in CuPy
    pick = dlbridge.ElementwiseKernel("T x, bool flag", "T y", "y = flag ? x : -x", "np_bool_scalar")
    np.testing.assert_array_equal(pick(x, np.bool_(False)), -x)
    with pytest.raises(OverflowError, match=r"int_scalar_overflow: argument s: the scalar 1180591620717411303424 is out of range for i64"):
        dlbridge.ElementwiseKernel("T x, int64 s", "T y", "y = x + s", "int_scalar_overflow")(x, 2**70)
    with pytest.raises(TypeError, match="every argument is a scalar"):
        pick(1.0, True)


def test_integer_division_by_zero_in_a_body_is_an_error_not_a_crash():
    # NumPy gives 0 with a warning, C++ traps (SIGFPE); dlbridge raises, names
    # the kernel, and the process and the kernel go on working. A body run on
    # several threads (2^20 elements) and on one.
    k = dlbridge.ElementwiseKernel("int32 x, int32 y", "int32 q, int32 r", "q = x / y; r = x % y", "divmod_py")
    for n in (5, 1 << 20):
        x = np.arange(n, dtype=np.int32) + 7
        y = (np.arange(n, dtype=np.int32) % 5 + 1)
        bad = y.copy()
        bad[n - 2] = 0
        with pytest.raises(RuntimeError, match=r"^divmod_py: integer division or modulo by zero"):
            k(x, bad)
        q, r = k(x, y)
        np.testing.assert_array_equal(q, x // y)
        np.testing.assert_array_equal(r, x % y)
    # In a reduction's map expression too.
    s = dlbridge.ReductionKernel("int64 x", "int64 y", "100 / x", "a + b", "y = a", "0", "recip_sum_py")
    with pytest.raises(RuntimeError, match="integer division or modulo by zero"):
        s(np.array([1, 2, 0, 4], np.int64))
    assert int(s(np.array([1, 2, 4], np.int64))) == 175
    # A long reduction to one output: per-thread partials, combined (and
    # post-mapped: here 100 / 0) on the calling thread.
    p = dlbridge.ReductionKernel("int64 x", "int64 y", "x", "a + b", "y = 100 / a", "0", "post_div_py")
    with pytest.raises(RuntimeError, match="integer division or modulo by zero"):
        p(np.zeros(1 << 20, np.int64))
    assert int(p(np.ones(1 << 20, np.int64) * 0 + np.arange(1 << 20) % 2)) == 100 // (1 << 19)


def test_cuda_device_functions_cupy_bodies_use_compile_on_the_cpu():
    # rsqrt, max of a float and a double, and atomicAdd into a raw output from
    # many threads (a histogram over 2^20 elements), as CuPy bodies write them.
    k = dlbridge.ElementwiseKernel("float32 x", "float32 y", "y = rsqrt(max(x, 0.25)) + rsqrtf(4.0f)", "cuda_fns_py")
    x = np.array([0.0, 1.0, 4.0, 16.0], np.float32)
    np.testing.assert_allclose(k(x), 1 / np.sqrt(np.maximum(x, 0.25)) + 0.5, rtol=1e-6)
    hist = dlbridge.ElementwiseKernel("int32 x, mut raw int32 h", "", "atomicAdd(&h[x], 1)", "histogram_py")
    v = (np.arange(1 << 20, dtype=np.int64) * 7919 % 16).astype(np.int32)
    h = np.zeros(16, np.int32)
    hist(v, h)
    np.testing.assert_array_equal(h, np.bincount(v, minlength=16))
    fmax = dlbridge.ElementwiseKernel(
        "float32 x, mut raw float32 m", "", "atomicMax(&m[0], x); atomicAdd(&m[1], x); atomicAdd(&m[2], 1)", "fmax_py"
    )
    m = np.zeros(3, np.float32)
    xs = np.linspace(-1, 3, 1 << 20, dtype=np.float32)
    fmax(xs, m)
    assert m[0] == 3.0 and m[2] == 1 << 20  # an int value into a float array converts, as in CUDA
    np.testing.assert_allclose(m[1], xs.sum(dtype=np.float64), rtol=1e-3)


def test_cupys_in_ind_out_ind_mean_idiom_and_a_parameter_named_n():
    # CuPy's own mean: the reduced count is _in_ind.size() / _out_ind.size().
    mean = dlbridge.ReductionKernel(
        "T x", "T y", "x", "a + b", "y = a / _type_reduce(_in_ind.size() / _out_ind.size())", "0", "mean_cupy",
        reduce_type="double",
    )
    x = np.random.default_rng(5).random((4, 6, 5))
    for axis in (None, 0, (0, 2), -1):
        np.testing.assert_allclose(mean(x, axis=axis), x.mean(axis=axis), rtol=1e-12)
    np.testing.assert_allclose(mean(x, axis=1, keepdims=True), x.mean(axis=1, keepdims=True), rtol=1e-12)
    # CuPy reserves only `i`: `n` is a parameter like any other (a scalar here, a raw array there).
    times_n = dlbridge.ElementwiseKernel("T x, int32 n", "T y", "y = x * n", "times_n")
    np.testing.assert_array_equal(times_n(np.arange(5.0), 3), np.arange(5.0) * 3)
    first_n = dlbridge.ElementwiseKernel("raw T n, T x", "T y", "y = x + n[0] + n.size()", "raw_n")
    np.testing.assert_array_equal(first_n(np.array([10.0, 0.0]), np.arange(3.0)), np.arange(3.0) + 12)


def test_a_preamble_helper_named_like_a_std_function_is_not_ambiguous():
    # CuPy preambles define their own clamp/gcd; the generated code does not
    # `using namespace std`, so they are not ambiguous with std::clamp.
    k = dlbridge.ElementwiseKernel(
        "T x", "T y", "y = clamp(x, T(0), T(1)) + gcd(12, 18) + numeric_limits<T>::epsilon() * 0 + sqrt(T(4))", "clamp_pre",
        preamble="template <typename T> __device__ T clamp(T v, T lo, T hi) { return v < lo ? lo : (v > hi ? hi : v); }\n"
        "__device__ int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }",
    )
    x = np.array([-1.0, 0.25, 3.0], np.float32)
    np.testing.assert_array_equal(k(x), np.clip(x, 0, 1) + 6 + 2)


def test_a_float_scalar_for_an_integer_parameter_is_refused_and_a_too_large_one_overflows():
    import torch

    add = dlbridge.ElementwiseKernel("T x, T y", "T z", "z = x + y", "scalar_checked_add")
    for x in (np.arange(3, dtype=np.int32), torch.arange(3, dtype=torch.int32)):
        with pytest.raises(TypeError, match=r"scalar_checked_add: argument y: the scalar 2\.5 is not an integer, and y is i32"):
            add(x, 2.5)
        with pytest.raises(OverflowError, match="scalar_checked_add: argument y: the scalar 4294967296 is out of range for i32"):
            add(x, 2**32)
        with pytest.raises(OverflowError, match="out of range for i32"):
            add(x, -(2**31) - 1)
        assert add(x, 2).tolist() == [2, 3, 4]
    fixed = dlbridge.ElementwiseKernel("uint8 x, uint8 y", "uint8 z", "z = x + y", "scalar_checked_u8")
    with pytest.raises(OverflowError, match="scalar_checked_u8: argument y: the scalar -1 is out of range for u8 \\(0 to 255\\)"):
        fixed(np.zeros(2, np.uint8), -1)


def test_reduction_calls_alternating_axes_shapes_and_keepdims_each_get_their_own_layout():
    # Every (shape, axis, keepdims) has its own plan; repeated calls must not reuse another's.
    l2 = dlbridge.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2_alternating")
    rng = np.random.default_rng(5)
    arrays = [rng.random((3, 4, 5)), rng.random((5, 4, 3)), rng.random((2, 3, 4, 5))]
    for _ in range(2):
        for x in arrays:
            for axis in (0, 1, 2, (0, 2), [2, 0], None, -1, (1,)):
                for keep in (False, True):
                    want = np.sqrt((x * x).sum(axis=tuple(axis) if isinstance(axis, list) else axis, keepdims=keep))
                    got = l2(x, axis=axis, keepdims=keep)
                    assert got.shape == want.shape, (x.shape, axis, keep)
                    np.testing.assert_allclose(got, want, rtol=1e-12)
    with pytest.raises(TypeError, match="axis must be an int or a tuple of ints"):
        l2(arrays[0], axis=[[0]])
    with pytest.raises(ValueError, match="out of bounds"):
        l2(arrays[0], axis=3)


def test_a_preamble_may_include_memory_and_use_smart_pointers():
    # <memory> of libstdc++ 12 spells an attribute with CUDA's `__noinline__`, which the runtime defines.
    preamble = textwrap.dedent(
        """
        #include <memory>
        #include <numeric>
        namespace k {
        inline float twice(float v) {
            auto p = std::make_unique<float>(v);
            std::shared_ptr<float> q = std::make_shared<float>(*p);
            return *p + *q;
        }
        }
        """
    )
    k = dlbridge.ElementwiseKernel("float32 x", "float32 z", "z = k::twice(x);", "smart_pointers", preamble=preamble)
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(k(x), 2 * x)


def test_a_reduction_takes_any_dlpack_producer_and_refuses_bool_axis_and_keepdims():
    red = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "dlpack_only_sum")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert red(Box(x), axis=1).tolist() == x.sum(axis=1).tolist()
    out = Box(np.zeros(4, np.float32))
    assert red(Box(x), axis=0, out=out) is out  # written in place, the caller's own object back
    np.testing.assert_array_equal(out.a, x.sum(axis=0))
    with pytest.raises(TypeError, match="dlpack_only_sum: argument x: object has no __dlpack__"):
        red(object(), axis=1)
    with pytest.raises(TypeError, match="dlpack_only_sum: axis must be an int or a tuple of ints, not True"):
        red(x, axis=True)
    with pytest.raises(TypeError, match="dlpack_only_sum: keepdims must be a bool, not 'yes'"):
        red(x, keepdims="yes")
    assert red(x, axis=1, keepdims=np.True_).shape == (3, 1)


def test_a_scalar_for_a_bool_type_is_a_bool_never_truncated():
    k = dlbridge.ElementwiseKernel("T x, T w", "T y", "y = x * w", "bool_scalar")
    x = np.ones(2, bool)
    with pytest.raises(TypeError, match=r"bool_scalar: argument w: the scalar 0\.5 is not a bool, and w is bool"):
        k(x, 0.5)
    with pytest.raises(TypeError, match="is not a bool"):
        k(x, 2)
    assert k(x, True).tolist() == [True, True] and k(x, 0).tolist() == [False, False]
    assert k(x, np.False_).tolist() == [False, False]


_CXX_CHILD = """
import numpy as np, dlbridge
k = dlbridge.ElementwiseKernel("T x", "T z", "z = x * (T)CXX_SCALE", "cxx_args_scale")
print(k(np.ones(2, np.float32)).tolist())
"""


def test_what_the_cxx_command_is_and_reads_is_part_of_the_key_and_a_response_file_is_refused(tmp_path):
    header = tmp_path / "forced.h"
    env = {**os.environ, "DLBRIDGE_CACHE_DIR": str(tmp_path / "cache"), "CXX": f"c++ -include {header}"}
    for scale in (2, 3):
        header.write_text(f"#define CXX_SCALE {scale}\n")
        r = subprocess.run([sys.executable, "-c", _CXX_CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.strip() == f"[{scale}.0, {scale}.0]", r.stdout + r.stderr[-2000:]
    # A wrapper script: its own flags are in its bytes.
    wrapper = tmp_path / "cxx-wrapper"
    env["CXX"] = str(wrapper)
    for scale in (4, 5):
        wrapper.write_text(f'#!/bin/sh\nexec c++ -DCXX_SCALE={scale} "$@"\n')
        wrapper.chmod(0o755)
        r = subprocess.run([sys.executable, "-c", _CXX_CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.strip() == f"[{scale}.0, {scale}.0]", r.stdout + r.stderr[-2000:]
    # A file an argument names (a specs file changing code generation, not the preprocessor's text).
    specs = tmp_path / "cxx.specs"
    env["CXX"] = f"c++ -specs={specs}"
    child = _CXX_CHILD.replace("x * (T)CXX_SCALE", "x * (T)0 + (T)(0.1 == 0.1f)")
    for flag, want in (("-fsingle-precision-constant", "[1.0, 1.0]"), ("", "[0.0, 0.0]")):
        specs.write_text(f"*cc1plus:\n+ {flag}\n\n")
        r = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.strip() == want, r.stdout + r.stderr[-2000:]
    # A file named after a comma (`-wrapper sh,FILE`), and a program `env` finds on PATH.
    script = tmp_path / "bin" / "cxx-on-path"
    script.parent.mkdir()
    for cxx in (f"c++ -wrapper sh,{script}", "env cxx-on-path"):
        env["CXX"], env["PATH"] = cxx, f"{script.parent}{os.pathsep}{os.environ['PATH']}"
        for flag, want in (("-fsingle-precision-constant", "[1.0, 1.0]"), ("", "[0.0, 0.0]")):
            if cxx.startswith("env"):
                script.write_text(f'#!/bin/sh\ncase " $* " in *" -E "*) exec c++ "$@";; esac\nexec c++ {flag} "$@"\n')
            else:
                script.write_text(f'case "$1" in *cc1plus) exec "$@" {flag};; esac\nexec "$@"\n')
            script.chmod(0o755)
            r = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0 and r.stdout.strip() == want, (cxx, r.stdout + r.stderr[-2000:])
    env["PATH"] = os.environ["PATH"]
    (tmp_path / "flags").write_text("-DCXX_SCALE=2\n")
    env["CXX"] = f"c++ @{tmp_path / 'flags'}"
    r = subprocess.run([sys.executable, "-c", _CXX_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "CXX names the response file" in r.stderr and "give the flags themselves" in r.stderr, r.stderr[-2000:]

