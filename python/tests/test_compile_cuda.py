"""dlbridge.ElementwiseKernel / ReductionKernel on torch CUDA tensors.

CuPy's documented examples, run as written on torch ``cuda`` tensors, against torch's own
results; outputs allocated by torch on the inputs' device; broadcasting, strided and
transposed inputs, scalars, ``axis=`` / ``keepdims=``; and the kernel launched on torch's
current stream. Needs a GPU and a CUDA build of torch; skipped with the reason otherwise.
"""

from __future__ import annotations

import pytest

import dlbridge

from conftest import cupy_l2norm, no_gpu_reason

torch = pytest.importorskip("torch")

NO_GPU = no_gpu_reason()
pytestmark = pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))


def _cuda(*shape, dtype=None, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    return t.to(dtype or torch.float32).cuda()


# ---- CuPy's ElementwiseKernel examples, as written -------------------------------------


def test_squared_diff_float32_runs_on_the_gpu_and_torch_allocates_the_output():
    squared_diff = dlbridge.ElementwiseKernel(
        "float32 x, float32 y", "float32 z", "z = (x - y) * (x - y)", "squared_diff_cuda32"
    )
    x = torch.arange(10, dtype=torch.float32, device="cuda").reshape(2, 5)
    y = torch.arange(5, dtype=torch.float32, device="cuda")
    z = squared_diff(x, y)
    assert isinstance(z, torch.Tensor) and z.device == x.device and z.dtype == torch.float32
    torch.testing.assert_close(z, (x - y) * (x - y), rtol=0, atol=0)
    # With an output given (CuPy passes it after the inputs).
    out = torch.empty(2, 5, device="cuda")
    r = squared_diff(x, 5.0, out)
    assert r is out
    torch.testing.assert_close(out, (x - 5) * (x - 5), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.int8])
def test_squared_diff_generic_matches_torch_for_every_dtype(dtype):
    squared_diff_generic = dlbridge.ElementwiseKernel(
        "T x, T y", "T z", "z = (x - y) * (x - y)", "squared_diff_generic_cuda"
    )
    if dtype.is_floating_point:
        x, y = _cuda(3, 4, dtype=dtype, seed=1), _cuda(4, dtype=dtype, seed=2)
    else:
        x = torch.randint(0, 10, (3, 4), dtype=dtype, device="cuda")
        y = torch.randint(0, 10, (4,), dtype=dtype, device="cuda")
    z = squared_diff_generic(x, y)
    assert z.dtype == dtype and z.device == x.device
    torch.testing.assert_close(z, (x - y) * (x - y), rtol=0, atol=0)


def test_a_scalar_argument_becomes_a_0d_tensor_on_the_inputs_device():
    squared_diff_generic = dlbridge.ElementwiseKernel(
        "T x, T y", "T z", "z = (x - y) * (x - y)", "squared_diff_scalar_cuda"
    )
    x = _cuda(100, seed=3)
    z = squared_diff_generic(x, 5)
    torch.testing.assert_close(z, (x - 5) * (x - 5), rtol=0, atol=0)


def test_a_scalar_named_n_scales_every_element():
    k = dlbridge.ElementwiseKernel("T x, int32 n", "T y", "y = x * n", "scale_by_n")
    x = torch.arange(10_000, dtype=torch.float32, device="cuda")
    torch.testing.assert_close(k(x, 5), x * 5)


def test_add_reverse_with_a_raw_argument():
    add_reverse = dlbridge.ElementwiseKernel(
        "T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse_cuda"
    )
    x = torch.arange(5, dtype=torch.float32, device="cuda")
    y = torch.arange(5, dtype=torch.float32, device="cuda") * 10
    z = add_reverse(x, y)
    torch.testing.assert_close(z, x + y.flip(0), rtol=0, atol=0)


def test_strided_and_transposed_inputs_and_loop_prep():
    k = dlbridge.ElementwiseKernel(
        "T x, T y",
        "T z",
        "z = x * scale + y",
        "strided_cuda",
        loop_prep="T scale = (T)2;",
        preamble="__device__ float unused_helper(float v) { return v; }",
    )
    base = _cuda(6, 8, seed=4)
    x = base.t()  # [8, 6], transposed
    y = _cuda(8, 12, seed=5)[:, ::2]  # every other column
    z = k(x, y)
    assert z.shape == (8, 6)
    torch.testing.assert_close(z, x * 2 + y, rtol=0, atol=0)


def test_an_empty_tensor_gives_an_empty_result():
    k = dlbridge.ElementwiseKernel("T x", "T z", "z = x + 1", "empty_cuda")
    z = k(torch.empty(0, 3, device="cuda"))
    assert z.shape == (0, 3) and z.device.type == "cuda"


def test_a_compile_error_points_at_the_operation():
    k = dlbridge.ElementwiseKernel("T x", "T z", "z = x +\n  not_declared;", "broken_cuda_py")
    with pytest.raises(Exception) as e:
        k(torch.ones(3, device="cuda"))
    assert "operation line 2" in str(e.value) and "not_declared" in str(e.value)


def test_float16_and_bfloat16_run_on_cuda_and_complex_is_a_type_error():
    fma = dlbridge.ElementwiseKernel("T x, T y, T b", "T z", "z = x * y + b", "fma_halfs_cuda")
    for dt in (torch.float16, torch.bfloat16):
        x, y, b = (_cuda(100_003, dtype=dt, seed=s) for s in (1, 2, 3))
        got = fma(x, y, b)
        assert got.dtype == dt and got.device == x.device
        want = (x.float() * y.float() + b.float()).to(dt)  # computed in float, rounded once
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        down = dlbridge.ElementwiseKernel("float32 x, T like", "T z", "z = x", "f32_to_halfs_cuda")
        f = torch.randn(1 << 20, device="cuda") * 1e4
        assert torch.equal(down(f, torch.zeros((), dtype=dt, device="cuda")).view(torch.int16), f.to(dt).view(torch.int16))
    s = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_halfs_cuda", reduce_type="float")
    x = _cuda(64, 3000, dtype=torch.float16)
    torch.testing.assert_close(s(x, axis=1).float(), x.float().sum(1), rtol=1e-3, atol=1e-2)
    k = dlbridge.ElementwiseKernel("complex64 x", "float32 z", "z = 0", "c64_cuda")
    with pytest.raises(TypeError) as e:
        k(torch.ones(3, dtype=torch.complex64, device="cuda"))
    assert "c64" in str(e.value)


# ---- CuPy's ReductionKernel examples ----------------------------------------------------


def test_l2norm_over_axis_1_matches_torch():
    l2norm_kernel = cupy_l2norm("l2norm_cuda")
    x = torch.arange(10, dtype=torch.float32, device="cuda").reshape(2, 5)
    y = l2norm_kernel(x, axis=1)
    assert y.device == x.device and y.shape == (2,)
    torch.testing.assert_close(y, torch.linalg.vector_norm(x, dim=1))
    big = _cuda(3, 100_000, dtype=torch.float64, seed=6)
    torch.testing.assert_close(l2norm_kernel(big, axis=1), torch.linalg.vector_norm(big, dim=1))


def test_reductions_over_other_axes_keepdims_and_without_identity():
    max_kernel = dlbridge.ReductionKernel("T x", "T y", "x", "max(a, b)", "y = a", None, "max_cuda")
    x = _cuda(4, 5, 6, seed=7)
    torch.testing.assert_close(max_kernel(x, axis=0), x.amax(dim=0), rtol=0, atol=0)
    torch.testing.assert_close(max_kernel(x, axis=(0, 2)), x.amax(dim=(0, 2)), rtol=0, atol=0)
    r = max_kernel(x, axis=1, keepdims=True)
    assert r.shape == (4, 1, 6)
    torch.testing.assert_close(r, x.amax(dim=1, keepdim=True), rtol=0, atol=0)
    torch.testing.assert_close(max_kernel(x), x.amax(), rtol=0, atol=0)
    with pytest.raises(Exception) as e:
        max_kernel(torch.empty(3, 0, device="cuda"), axis=1)
    assert "no identity" in str(e.value)


@pytest.mark.parametrize(
    "shape, axis",
    [
        ((4096, 300), 1),  # a warp per output
        ((300, 5000), 1),  # a block per output
        ((3, 1 << 20), 1),  # few long rows: split with a second pass
        ((1 << 20, 64), 0),  # a column reduction: outputs along the lanes, split
        ((100_000, 8), 1),  # short reductions: a thread per output
        ((2048, 2048), 0),  # a leading axis of a square matrix
        ((1 << 22,), None),  # to a scalar
        ((64, 128, 96), (0, 2)),  # several axes
    ],
)
def test_reductions_match_torch_in_every_launch_layout(shape, axis):
    # Each shape takes another launch layout (see dlbridge-compile's reduction_launch).
    x = _cuda(*shape, seed=3)
    total = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_layouts_cuda", reduce_type="float64")
    biggest = dlbridge.ReductionKernel("T x", "T y", "x", "max(a, b)", "y = a", None, "max_layouts_cuda")
    dims = tuple(range(x.dim())) if axis is None else axis
    torch.testing.assert_close(total(x, axis=axis), x.double().sum(dim=dims).float(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(biggest(x, axis=axis), x.amax(dim=dims), rtol=0, atol=0)
    # The same on a transposed view (the other memory order for the same reduction).
    if x.dim() == 2 and axis is not None:
        xt = x.t().contiguous().t()
        torch.testing.assert_close(total(xt, axis=axis), x.double().sum(dim=axis).float(), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(biggest(xt, axis=axis), x.amax(dim=axis), rtol=0, atol=0)


def test_a_mean_with_a_reduce_type():
    mean = dlbridge.ReductionKernel(
        "T x", "T y", "x", "a + b", "y = a / _J", "0", "mean_cuda", reduce_type="float64"
    )
    x = _cuda(7, 333, seed=8)
    torch.testing.assert_close(mean(x, axis=1), x.double().mean(dim=1).float())


# ---- streams ---------------------------------------------------------------------------


def test_kernels_run_on_torchs_current_stream():
    k = dlbridge.ElementwiseKernel("T x", "T z", "z = x * x", "square_on_stream")
    red = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_on_stream")
    s = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        # A long op queued on s, then x filled on s: the kernels read 3s only if they run
        # on s too (on another stream they would read the zeros).
        torch.cuda._sleep(50_000_000)
        x.fill_(3.0)
        z = k(x)
        total = red(x.reshape(1024, 1024), axis=1)
    s.synchronize()
    torch.testing.assert_close(z, torch.full_like(x, 9.0), rtol=0, atol=0)
    torch.testing.assert_close(total, torch.full((1024,), 3.0 * 1024, device="cuda"))


# ---- dlbridge.load_inline with cuda_source --------------------------------------------

_INLINE_C = """
void inl_scale(const T* x, double s, T* y, long long n) {
  for (long long i = 0; i < n; ++i) y[i] = (T)(s * x[i]);
}
"""

_INLINE_CUDA = """
extern "C" __global__ void inl_scale(const T* x, double s, T* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = (T)(s * x[i]);
}
extern "C" __global__ void inl_rowsum(const float* a, float* out, long long M, long long N) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < M) {
    float acc = 0.0f;
    for (long long j = 0; j < N; ++j) acc += a[i * N + j];
    out[i] = acc;
  }
}
"""

_INLINE_FUNCS = {
    "inl_scale": "inl_scale<T: f32|f64>(x: T[...B], s: f64) -> (y: T[...B])",
    "inl_rowsum": "inl_rowsum(a: f32[M, N]) -> (out: f32[M])",
}


def test_load_inline_cuda_source_matches_torch_and_the_cpu_source():
    mod = dlbridge.load_inline("inl_cuda", _INLINE_C, _INLINE_FUNCS, cuda_source=_INLINE_CUDA)
    assert sorted(mod.inl_scale.devices) == ["cpu", "cuda"] and mod.inl_rowsum.devices == ["cuda"]
    for dtype in (torch.float32, torch.float64):
        x = _cuda(3, 1000, dtype=dtype)
        y = mod.inl_scale(x, 2.5)
        assert y.device == x.device and y.dtype == dtype
        torch.testing.assert_close(y, 2.5 * x)
        torch.testing.assert_close(mod.inl_scale(x.cpu(), 2.5), y.cpu())
    a = _cuda(300, 7)
    torch.testing.assert_close(mod.inl_rowsum(a), a.sum(dim=1), rtol=1e-5, atol=1e-5)
    out = torch.empty(300, device="cuda")
    mod.inl_rowsum(a, out=out)
    torch.testing.assert_close(out, a.sum(dim=1), rtol=1e-5, atol=1e-5)
    empty = torch.empty(0, device="cuda")
    assert mod.inl_scale(empty, 1.0).shape == (0,)
    with pytest.raises(Exception, match="contiguous"):
        mod.inl_rowsum(a.t())


def test_load_inline_cuda_kernels_run_on_torchs_current_stream():
    mod = dlbridge.load_inline("inl_cuda_stream", _INLINE_C, _INLINE_FUNCS, cuda_source=_INLINE_CUDA)
    x = torch.zeros(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        # x is filled on s after a long op: the kernel reads 3s only if it runs on s too.
        torch.cuda._sleep(50_000_000)
        x.fill_(3.0)
        y = mod.inl_scale(x, 3.0)
    s.synchronize()
    torch.testing.assert_close(y, torch.full_like(x, 9.0), rtol=0, atol=0)


def test_load_inline_broken_cuda_source_fails_at_load_with_nvrtcs_line():
    bad = 'extern "C" __global__ void inl_bad(float* y, long long n) {\n  y[0] = q;\n}\n'
    with pytest.raises(ValueError, match="cuda_source line 2"):
        dlbridge.load_inline("inl_cuda_bad", None, ["inl_bad(y: mut f32[N])"], cuda_source=bad)


# ---- dlbridge.define on CUDA tensors


def test_the_tc_seed_example_runs_on_cuda_tensors():
    lang = """
def matmul(float(M,N) A, float(N,K) B) -> (output) {
  output(i, j) +=! A(i, kk) * B(kk, j)
}
"""
    matmul = dlbridge.define(lang, name="matmul")
    mat1, mat2 = torch.randn(3, 4).cuda(), torch.randn(4, 5).cuda()
    out = matmul(mat1, mat2)
    assert out.device == mat1.device
    torch.testing.assert_close(out, mat1 @ mat2, rtol=1e-5, atol=1e-5)


def test_tcs_examples_match_torch_on_cuda_and_differentiate():
    from test_define import DEFS, _inputs, _reference

    import dlbridge.torch as dtorch

    for name, x in _inputs().items():
        xs = tuple(t.cuda() for t in x)
        got = DEFS[name](*xs)
        got = got[0] if isinstance(got, tuple) else got
        assert got.device == xs[0].device, name
        torch.testing.assert_close(got, _reference(name, *xs), rtol=1e-4, atol=1e-4, msg=name)
    for name in ("matmul", "convolution", "softmax", "layernorm"):
        xs = tuple(t.cuda().requires_grad_() for t in _inputs(torch.float64)[name])
        assert torch.autograd.gradcheck(dtorch.as_op(DEFS[name]), xs, eps=1e-6, atol=1e-5), name
