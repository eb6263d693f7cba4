"""Kernels from source on float16, bfloat16, complex64 and complex128 (CPU backend).

float16/bfloat16 are storage types computed in float: an expression is
evaluated in float32 and rounded once (to nearest even) when stored; complex
is std::complex, mixing with real scalars as CuPy's thrust::complex does.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import dlbridge

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", os.environ.get("DLBRIDGE_TEST_CACHE", str(tmp_path_factory.getbasetemp() / "cache")))


def _all_f16() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _random_f32(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def _same_bits_or_both_nan(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bits = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits))


def test_float16_conversions_are_numpys_bit_for_bit():
    up = dlbridge.ElementwiseKernel("float16 x", "float32 z", "z = x", "f16_to_f32")
    down = dlbridge.ElementwiseKernel("float32 x", "float16 z", "z = x", "f32_to_f16")
    h = _all_f16()
    _same_bits_or_both_nan(up(h), h.astype(np.float32))  # every f16 value, subnormals and infinities included
    f = np.concatenate([h.astype(np.float32), _random_f32(1 << 20)])
    # The midpoints between neighbouring f16 values are ties: rounded to even.
    finite = h[np.isfinite(h)].astype(np.float32)
    f = np.concatenate([f, (finite[:-1] + finite[1:]) / 2, np.array([65519.99, 65520.0, 1e-8, 2.98e-8, -0.0], np.float32)])
    with np.errstate(over="ignore"):
        _same_bits_or_both_nan(down(f), f.astype(np.float16))


def test_bfloat16_conversions_are_torchs_bit_for_bit():
    up = dlbridge.ElementwiseKernel("bfloat16 x", "float32 z", "z = x", "bf16_to_f32")
    down = dlbridge.ElementwiseKernel("float32 x", "bfloat16 z", "z = x", "f32_to_bf16")
    b = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    got = up(b)
    assert got.dtype == torch.float32
    _same_bits_or_both_nan(got.numpy(), b.float().numpy())
    f = torch.from_numpy(np.concatenate([_random_f32(1 << 20, 1), np.array([3.3895314e38, 1e-40, -0.0], np.float32)]))
    got = down(f)
    assert got.dtype == torch.bfloat16
    want = f.to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


def test_half_expressions_are_computed_in_float_and_rounded_once():
    fma = dlbridge.ElementwiseKernel("T x, T y, T b", "T z", "z = x * y + b", "fma_halfs")
    rng = np.random.default_rng(2)
    x, y, b = (rng.standard_normal(100_003).astype(np.float32) * 8 for _ in range(3))
    x16, y16, b16 = (a.astype(np.float16) for a in (x, y, b))
    got = fma(x16, y16, b16)
    assert got.dtype == np.float16
    want = (x16.astype(np.float32) * y16.astype(np.float32) + b16.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    # The same with torch's bfloat16, on strided and broadcast operands, with a Python scalar.
    xt = torch.from_numpy(x[: 200 * 474]).to(torch.bfloat16).reshape(200, 474)[:, ::2].t()  # sliced and transposed
    yt = torch.from_numpy(y[:200]).to(torch.bfloat16)  # broadcast along the first dim
    got = fma(xt, yt, 0.5)
    want = (xt.float() * yt.float() + 0.5).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_half_bodies_as_cupy_writes_them_compile_and_run():
    # max/min with another type, math functions, compound assignment, ++, a
    # temporary of type T, a ternary with T(0), comparison: all in float.
    k = dlbridge.ElementwiseKernel(
        "T x",
        "T y, float32 w",
        "T t = x * 2; t += 1; t++; y = x > 0 ? t : T(0); y = max(y, 0.25f) + min(x, 1.0) * 0; w = tanh(x) + sqrt(abs(x))",
        "half_body",
    )
    x = np.linspace(-4, 4, 1001, dtype=np.float16)
    y, w = k(x)
    xf = x.astype(np.float32)
    t = ((xf * 2).astype(np.float16).astype(np.float32) + 1).astype(np.float16).astype(np.float32) + 1
    want_y = np.maximum(np.where(xf > 0, t.astype(np.float16).astype(np.float32), 0), 0.25).astype(np.float16)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_allclose(w, np.tanh(xf) + np.sqrt(np.abs(xf)), rtol=1e-5, atol=1e-6)


def test_a_large_half_kernel_on_threads_and_out_given():
    k = dlbridge.ElementwiseKernel("T x", "T y", "y = x * x", "half_square")
    x = torch.from_numpy(np.linspace(-3, 3, 1 << 18, dtype=np.float32)).half()  # (torch's float16 linspace has NaNs at this size)
    assert not torch.isnan(x).any()
    out = torch.empty_like(x)
    r = k(x, out)
    assert r.data_ptr() == out.data_ptr()
    assert torch.equal(out, (x.float() * x.float()).half())


def test_half_reductions_accumulate_in_the_reduce_type():
    s = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_halfs", reduce_type="float")
    x = np.random.default_rng(3).random((64, 3000)).astype(np.float16)
    got = s(x, axis=1)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), x.astype(np.float64).sum(axis=1), rtol=1e-3)
    # Without reduce_type the partial sums are float16 and lose the small addends.
    naive = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_halfs_naive")
    tenths = np.full(1 << 16, 0.1, np.float16)
    exact = float(tenths.astype(np.float64).sum())
    assert abs(float(s(tenths)) - exact) < 1e-3 * exact and abs(float(naive(tenths)) - exact) > 1e-2 * exact
    xb = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    got = s(xb, axis=0, keepdims=True)
    assert got.dtype == torch.bfloat16 and got.shape == (1, 3000)
    torch.testing.assert_close(got.float(), xb.float().sum(0, keepdim=True), rtol=1e-2, atol=0)
    m = dlbridge.ReductionKernel("T x", "T y", "x", "max(a, b)", "y = a", "-CUDART_INF_F", "max_halfs")
    assert m(x, axis=None) == x.max()


def test_complex_kernels_follow_numpy_and_mix_with_real_scalars():
    fma = dlbridge.ElementwiseKernel("T x, T y", "T z", "z = x * y + 1", "cfma")
    rng = np.random.default_rng(4)
    for dt in (np.complex64, np.complex128):
        x = (rng.standard_normal(1000) + 1j * rng.standard_normal(1000)).astype(dt)
        y = (rng.standard_normal((3, 1000)) + 1j * rng.standard_normal((3, 1000))).astype(dt)
        got = fma(x, y)
        assert got.dtype == dt and got.shape == (3, 1000)
        np.testing.assert_allclose(got, x * y + 1, rtol=1e-6 if dt == np.complex64 else 1e-14)
    # CuPy's thrust::complex mixes with real values: int, double, float16, and the other complex type.
    mix = dlbridge.ElementwiseKernel(
        "complex64 x, complex128 w, float16 h", "complex64 z, complex128 v, float64 a",
        "z = 2 * x - x / 2.0 + h; v = x * w + 1.5f; a = abs(w) + real(x) - imag(conj(x))",
        "cmix",
    )
    x = np.array([1 + 2j, -3.5 + 0.25j], np.complex64)
    w = np.array([0.5 - 1j, 2 + 2j], np.complex128)
    h = np.array([0.5, -1], np.float16)
    z, v, a = mix(x, w, h)
    np.testing.assert_allclose(z, 2 * x - x / 2 + h, rtol=1e-6)
    np.testing.assert_allclose(v, x.astype(np.complex128) * w + 1.5, rtol=1e-12)
    np.testing.assert_allclose(a, np.abs(w) + x.real + x.imag, rtol=1e-12)
    # torch's complex tensors, a complex Python scalar, an exp.
    e = dlbridge.ElementwiseKernel("T x, T s", "T z", "z = exp(x) * s", "cexp")
    xt = torch.randn(50, dtype=torch.complex64)
    got = e(xt, 2j)
    assert got.dtype == torch.complex64
    torch.testing.assert_close(got, torch.exp(xt) * 2j)


def test_complex_reductions_and_a_16_byte_atomic_is_a_clear_error():
    s = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "csum")
    x = (np.arange(12) + 1j * np.arange(12)[::-1]).reshape(3, 4).astype(np.complex128)
    np.testing.assert_allclose(s(x, axis=1), x.sum(axis=1))
    norm = dlbridge.ReductionKernel("T x", "float64 y", "norm(x)", "a + b", "y = sqrt(a)", "0", "cnorm", reduce_type="double")
    np.testing.assert_allclose(norm(x, axis=0), np.linalg.norm(x, axis=0))
    acc = dlbridge.ElementwiseKernel("complex64 x, mut raw complex64 s", "", "atomicAdd(&s[0], x)", "catomic64")
    tot = np.zeros(1, np.complex64)
    acc(np.full(1 << 17, 1 + 2j, np.complex64), tot)
    assert tot[0] == (1 << 17) * (1 + 2j)
    acc128 = dlbridge.ElementwiseKernel("complex128 x, mut raw complex128 s", "", "atomicAdd(&s[0], x)", "catomic128")
    with pytest.raises(ValueError, match=r"static assertion failed: atomics on a 16-byte type \(complex128\) are not supported"):
        acc128(np.ones(4, np.complex128), np.zeros(1, np.complex128))


def test_the_signature_lists_the_new_dtypes_and_mismatches_are_still_type_errors():
    k = dlbridge.ElementwiseKernel("T x, bfloat16 b", "T z", "z = x + b", "sig_halfs")
    sig = dlbridge.get_kernel("sig_halfs").signature
    assert "T: bool|i8|i16|i32|i64|u8|u16|u32|u64|f16|bf16|f32|f64|c64|c128" in sig and "b: bf16[*S]" in sig
    with pytest.raises(TypeError, match="bf16"):
        k(torch.ones(3), torch.ones(3))  # b must be bfloat16
    got = k(torch.ones(3, dtype=torch.float16), torch.ones(3, dtype=torch.bfloat16))
    assert got.dtype == torch.float16 and got.tolist() == [2.0, 2.0, 2.0]


def test_max_and_min_follow_cuda_a_nan_loses_in_either_order():
    # CUDA's max/min on floats are fmax/fmin: CuPy's ReLU max(x, T(0)) maps NaN to 0,
    # and a max reduction skips a NaN wherever it is (std::max kept or dropped it by order).
    relu = dlbridge.ElementwiseKernel("T x", "T y, T z", "y = max(x, T(0)); z = min(T(0), x)", "relu_nan")
    for dt in (np.float16, np.float32, np.float64):
        y, z = relu(np.array([np.nan, -1, 2], dt))
        np.testing.assert_array_equal(y, np.array([0, 0, 2], dt))
        np.testing.assert_array_equal(z, np.array([0, -1, 0], dt))
    m = dlbridge.ReductionKernel("T x", "T y", "x", "max(a, b)", "y = a", "-CUDART_INF", "max_nan")
    for dt in (np.float16, np.float32, np.float64):
        x = np.array([[np.nan, 1, 3], [1, np.nan, 3], [1, 3, np.nan]], dt)
        np.testing.assert_array_equal(m(x, axis=1), np.array([3, 3, 3], dt))
    long = np.arange(5000, dtype=np.float32)
    long[::1024] = np.nan  # a NaN first in every block of the long-reduction path
    assert m(long) == 4999


def test_a_double_is_rounded_once_to_float16_and_the_two_byte_types_convert():
    down = dlbridge.ElementwiseKernel("float64 x", "float16 z", "z = x", "f64_to_f16")
    d = np.concatenate([[65519.99999999, 65520.0, 1 + 2.0**-11 + 2.0**-40, 2.0**-25 + 2.0**-60],
                        np.random.default_rng(6).standard_normal(1 << 18) * 1000])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(down(d).view(np.uint16), d.astype(np.float16).view(np.uint16))
    swap = dlbridge.ElementwiseKernel("float16 x, bfloat16 y", "bfloat16 a, float16 b", "a = x; b = y", "f16_bf16")
    a, b = swap(torch.tensor([1.5, -2.0, 65504.0], dtype=torch.float16), torch.tensor([3.0, 0.5, -1e-3], dtype=torch.bfloat16))
    assert torch.equal(a, torch.tensor([1.5, -2.0, 65504.0]).to(torch.bfloat16))
    assert torch.equal(b, torch.tensor([3.0, 0.5, -1e-3], dtype=torch.bfloat16).to(torch.float16))


def test_isnan_isinf_isfinite_of_a_complex_look_at_both_parts():
    k = dlbridge.ElementwiseKernel("T x", "bool a, bool b, bool c", "a = isnan(x); b = isinf(x); c = isfinite(x)", "cisnan")
    x = np.array([1 + 1j, complex(np.nan, 0), complex(0, np.inf), complex(np.inf, np.nan)], np.complex64)
    a, b, c = k(x)
    np.testing.assert_array_equal(a, np.isnan(x))
    np.testing.assert_array_equal(b, np.isinf(x))
    np.testing.assert_array_equal(c, np.isfinite(x))
