"""CuPy and JAX on a GPU: CuPy's documented kernel examples run as written on
CuPy arrays and return CuPy arrays, kernels launch on CuPy's current stream, and
JAX GPU arrays work eagerly and under jax.jit. Each part is skipped, with the
reason, where its framework or a GPU is missing."""

from __future__ import annotations

import numpy as np
import pytest

import dlbridge
import dlbridge.cuda

from conftest import cupy_l2norm, cupy_squared_diff


def _cupy_reason():
    try:
        import cupy
    except ImportError as e:
        return f"CuPy is not installed ({e})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no GPU"
    except Exception as e:  # noqa: BLE001 - no driver: CuPy raises its own runtime error
        return f"CuPy sees no GPU ({type(e).__name__}: {e})"
    if not dlbridge.cuda.is_available():
        return f"dlbridge has no CUDA here: {dlbridge.cuda.unavailable_reason()}"
    return None


def _jax_gpu_reason():
    try:
        import jax
    except ImportError as e:
        return f"JAX is not installed ({e})"
    try:
        if not jax.devices("gpu"):
            return "JAX sees no GPU"
    except RuntimeError as e:
        return f"JAX sees no GPU ({e})"
    if not dlbridge.cuda.is_available():
        return f"dlbridge has no CUDA here: {dlbridge.cuda.unavailable_reason()}"
    return None


NO_CUPY, NO_JAX_GPU = _cupy_reason(), _jax_gpu_reason()
cupy_only = pytest.mark.skipif(NO_CUPY is not None, reason=str(NO_CUPY))
jax_gpu_only = pytest.mark.skipif(NO_JAX_GPU is not None, reason=str(NO_JAX_GPU))


# ---- CuPy's user guide, "User-Defined Kernels", as written (cp.ElementwiseKernel -> dlbridge's)


@cupy_only
def test_cupys_elementwise_examples_run_as_written_on_cupy_arrays():
    import cupy as cp

    squared_diff = cupy_squared_diff("squared_diff")
    x = cp.arange(10, dtype=np.float32).reshape(2, 5)
    y = cp.arange(5, dtype=np.float32)
    z = squared_diff(x, y)
    assert isinstance(z, cp.ndarray) and z.device == x.device
    cp.testing.assert_array_equal(z, (x - y) * (x - y))
    z5 = squared_diff(x, 5)  # a Python scalar: a 0-d array on the GPU
    assert isinstance(z5, cp.ndarray)
    cp.testing.assert_array_equal(z5, (x - 5) * (x - 5))
    z = cp.empty((2, 5), dtype=np.float32)
    assert squared_diff(x, y, z) is z

    squared_diff_generic = cupy_squared_diff("squared_diff_generic")
    for dtype in (np.float32, np.float64, np.int32):
        a, b = cp.arange(10, dtype=dtype).reshape(2, 5), cp.arange(5, dtype=dtype)
        got = squared_diff_generic(a, b)
        assert isinstance(got, cp.ndarray) and got.dtype == dtype
        cp.testing.assert_array_equal(got, (a - b) * (a - b))

    squared_diff_super_generic = cupy_squared_diff("squared_diff_super_generic")
    z = cp.empty((2, 5), dtype=np.float64)
    squared_diff_super_generic(x, cp.arange(5, dtype=np.int32), z)
    cp.testing.assert_array_equal(z, (x.astype(np.float64) - cp.arange(5)) ** 2)

    add_reverse = dlbridge.ElementwiseKernel("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse")
    v = cp.arange(5, dtype=np.float32)
    got = add_reverse(v, v)
    assert isinstance(got, cp.ndarray)
    cp.testing.assert_array_equal(got, v + v[::-1])


@cupy_only
def test_cupys_l2norm_reduction_runs_as_written_on_cupy_arrays():
    import cupy as cp

    l2norm_kernel = cupy_l2norm("l2norm")
    x = cp.arange(10, dtype=np.float32).reshape(2, 5)
    got = l2norm_kernel(x, axis=1)
    assert isinstance(got, cp.ndarray) and got.device == x.device
    cp.testing.assert_allclose(got, cp.linalg.norm(x, axis=1), rtol=1e-6)


@cupy_only
@pytest.mark.parametrize(
    ("name", "n_args", "reference"),
    [
        ("add", 2, lambda cp, a, b: a + b),
        ("mul", 2, lambda cp, a, b: a * b),
        ("relu", 1, lambda cp, a: cp.maximum(a, 0)),
        ("sum", 1, lambda cp, a: a.sum(-1)),
        ("softmax", 1, lambda cp, a: cp.exp(a - a.max(-1, keepdims=True)) / cp.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True)),
    ],
)
def test_builtins_on_cupy_arrays_return_cupy_arrays(name, n_args, reference):
    import cupy as cp

    args = [cp.random.default_rng(i).standard_normal((64, 33), dtype=np.float32) for i in range(n_args)]
    got = dlbridge.get_kernel(name)(*args)
    assert isinstance(got, cp.ndarray) and got.device == args[0].device
    cp.testing.assert_allclose(got, reference(cp, *args), rtol=1e-5, atol=1e-5)


@cupy_only
def test_cupy_outputs_come_from_cupys_memory_pool():
    import cupy as cp

    pool = cp.get_default_memory_pool()
    x = cp.ones(1 << 20, dtype=np.float32)
    before = pool.used_bytes()
    y = dlbridge.get_kernel("add")(x, x)
    assert pool.used_bytes() - before == x.nbytes, "the output is one allocation from CuPy's pool"
    cp.testing.assert_array_equal(y, 2)


@cupy_only
def test_a_kernel_on_cupy_arrays_runs_on_cupys_current_stream():
    import cupy as cp

    import dlbridge._frameworks as fw

    asked = []

    def stream(device):
        asked.append(fw._cupy_stream(device))
        return asked[-1]

    dlbridge.register_allocator("cupy.ndarray", fw._cupy_allocate, stream=stream)
    try:
        double = dlbridge.ElementwiseKernel("T x", "T y", "y = x * 2", "gpu_double_on_stream")
        # A slow producer on a non-blocking stream: the kernel sees its writes by
        # running after it on the same stream.
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            x = cp.zeros(1 << 24, dtype=np.float32)
            for _ in range(20):
                x += 1
            y = double(x)
            z = dlbridge.get_kernel("add")(x, x)
        s.synchronize()
    finally:
        fw.install()
    assert asked == [s.ptr, s.ptr], "each call launched on CuPy's current stream"
    assert float(y.min()) == float(y.max()) == 40.0
    assert float(z.min()) == float(z.max()) == 40.0


@cupy_only
def test_a_cupy_array_written_in_place_sees_the_kernels_writes():
    import cupy as cp

    k = dlbridge.ElementwiseKernel("mut T x", "", "x = x + 1", "gpu_increment")
    x = cp.zeros(1000, dtype=np.float32)
    k(x)
    assert float(x.sum()) == 1000.0


# ---- JAX on the GPU


@jax_gpu_only
def test_a_plain_call_on_jax_gpu_arrays_returns_jax_gpu_arrays():
    import jax.numpy as jnp

    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    for name, want in [("add", x + x), ("relu", jnp.maximum(x - 5, 0))]:
        got = dlbridge.get_kernel(name)(x, x) if name == "add" else dlbridge.get_kernel(name)(x - 5)
        assert got.devices() == x.devices(), name
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


@jax_gpu_only
def test_dlbridge_jax_ops_run_under_jit_on_the_gpu():
    import jax
    import jax.numpy as jnp

    import dlbridge.jax as djax

    # Logits of order 1: softmax of large logits turns the last bits of the
    # matmul (JAX's default TF32 on the GPU against cuBLAS's f32) into large
    # relative differences. The reference multiplies in full f32.
    x = jnp.arange(4096, dtype=jnp.float32).reshape(64, 64) / 32768
    add, softmax, matmul = djax.as_op("add"), djax.as_op("softmax"), djax.as_op("matmul")
    f = jax.jit(lambda a: softmax(matmul(add(a, a), a)))
    got = f(x)
    want = jax.nn.softmax(jnp.matmul(x + x, x, precision=jax.lax.Precision.HIGHEST), axis=-1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)
    text = jax.jit(lambda a: add(a, a)).lower(x).as_text()
    assert djax.TARGET in text and "callback" not in text
    sq = dlbridge.ElementwiseKernel("T x, T y", "T z", "z = (x - y) * (x - y)", "gpu_jax_squared_diff")
    np.testing.assert_allclose(np.asarray(jax.jit(djax.as_op(sq))(x, x * 2)), np.asarray(x * x), rtol=1e-6)
