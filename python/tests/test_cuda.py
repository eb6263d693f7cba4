"""CUDA through dlbridge from Python.

Runs everywhere: the status functions, the kernels' device lists, and the error a CUDA
tensor gets on a machine without a driver. The rest needs a GPU and a CUDA build of torch
and is skipped with the reason otherwise (scripts/gpu-check.sh runs it on a GPU machine,
where a skip counts as a failure).
"""

from __future__ import annotations

import functools

import pytest

import dlbridge
import dlbridge.cuda
from dlbridge import _capsules as caps
from dlbridge import _dlbridge

from conftest import no_gpu_reason

torch = pytest.importorskip("torch")

NO_GPU = no_gpu_reason()
needs_gpu = pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))


def test_status_says_whether_cuda_is_usable_and_why_not():
    s = dlbridge.cuda.status()
    assert set(s) >= {"available", "reason", "driver_version", "devices", "nvrtc", "nvrtc_version", "nvrtc_error"}
    if s["available"]:
        assert s["reason"] is None and s["devices"] >= 1 and s["driver_version"].startswith("CUDA ")
    else:
        assert isinstance(s["reason"], str) and s["reason"]
        assert dlbridge.cuda.unavailable_reason() == s["reason"]
        assert s["devices"] == 0
    # NVRTC is either found (torch's CUDA wheels carry it) or its absence is explained.
    assert (s["nvrtc"] is None) == (s["nvrtc_version"] is None) == (s["nvrtc_error"] is not None)


def test_builtin_kernels_list_their_cuda_implementations():
    for name in ["add", "mul", "relu", "gelu", "softmax", "sum", "mean", "sum_all", "mean_all", "matmul"]:
        assert dlbridge.get_kernel(name).devices == ["cpu", "cuda"], name
    assert dlbridge.get_kernel("sub").devices == ["cpu"]
    assert "[cpu, cuda]" in repr(dlbridge.get_kernel("add"))


def _fake_cuda_producer():
    # kDLCUDA memory at an address nobody reads on this machine.
    return caps.Producer(
        lambda versioned: caps.ManagedTensor(data=0x7F0000000000, shape=(3,), device=(2, 0), versioned=versioned),
        device=(2, 0),
    )


@pytest.mark.skipif(NO_GPU is None, reason="checks the error on a machine without a CUDA driver; this one has a GPU")
def test_a_cuda_tensor_without_a_driver_is_an_error_that_says_why():
    a, b, out = _fake_cuda_producer(), _fake_cuda_producer(), _fake_cuda_producer()
    with pytest.raises(Exception) as e:
        dlbridge.get_kernel("add")(a, b, out=out)
    msg = str(e.value)
    assert "CUDA is not available here" in msg and "no CUDA driver" in msg, msg
    for p in (a, b, out):
        p.release()
        assert all(t.deleter_calls == 1 for t in p.tensors), "every imported tensor released exactly once"


def test_tensors_on_two_devices_are_an_error_naming_both():
    a = _fake_cuda_producer()
    with pytest.raises(Exception) as e:
        dlbridge.get_kernel("add")(torch.ones(3), a)
    msg = str(e.value)
    assert "cpu" in msg and "cuda" in msg, msg
    a.release()


# ---- on a GPU -------------------------------------------------------------------------


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_builtin_cuda_kernels_match_torch(dtype):
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.rand(64, 300, device="cuda", generator=g) * 8 - 4).to(dt)
    y = (torch.rand(64, 300, device="cuda", generator=g) * 8 - 4).to(dt)
    tol = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    # References computed in the kernels' accumulation precision (f64 for f64, f32 otherwise).
    ref = x.double() if dt == torch.float64 else x.float()
    cases = {
        "add": ((x, y), x + y),
        "mul": ((x, y), x * y),
        "relu": ((x,), torch.relu(x)),
        "gelu": ((x,), torch.nn.functional.gelu(ref).to(dt)),
        "softmax": ((x,), torch.softmax(ref, -1).to(dt)),
        "sum": ((x,), ref.sum(-1).to(dt)),
    }
    for name, (args, want) in cases.items():
        got = dlbridge.get_kernel(name)(*args)
        assert isinstance(got, torch.Tensor) and got.device == x.device and got.dtype == dt, name
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * (300 if name == "sum" else 1), msg=name)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_row_reductions_match_torch_at_every_row_length_and_layout(dtype):
    # Every launch shape: a warp a row (<= 1024), a block a row, long rows in
    # few rows split into pieces with a second pass, and sums of everything.
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(1)
    tol = {"float32": 2e-5, "float64": 1e-12, "bfloat16": 2e-2}[dtype]
    k = {n: dlbridge.get_kernel(n) for n in ["softmax", "sum", "mean", "sum_all", "mean_all"]}
    for rows, cols in [(4099, 1), (777, 33), (64, 1024), (300, 1025), (50, 4096), (3, 9000), (4, 262_144), (1, 1 << 22)]:
        x = (torch.randn(rows, cols, device="cuda", generator=g) * 3).to(dt)
        layouts = {"contiguous": x, "offset by one": torch.randn(rows, cols + 1, device="cuda", generator=g).to(dt)[:, 1:]}
        if rows > 1:
            layouts["transposed"] = x.t().contiguous().t()
        for layout, v in layouts.items():
            r = v.double()
            what = f"{rows}x{cols} {layout}"
            torch.testing.assert_close(k["softmax"](v).double(), torch.softmax(r, -1), rtol=tol, atol=tol, msg=what)
            scale = r.abs().sum(-1, keepdim=True).clamp(min=1)
            torch.testing.assert_close(k["sum"](v).double() / scale[:, 0], r.sum(-1) / scale[:, 0], rtol=tol, atol=tol, msg=what)
            torch.testing.assert_close(k["mean"](v).double(), r.mean(-1), rtol=tol, atol=tol * 10, msg=what)
            total = r.abs().sum().clamp(min=1)
            torch.testing.assert_close(k["sum_all"](v).double() / total, r.sum() / total, rtol=tol, atol=tol, msg=what)
            torch.testing.assert_close(k["mean_all"](v).double(), r.mean(), rtol=tol, atol=tol * 10, msg=what)
    # Special values: -inf rows give NaN as in torch, a NaN poisons only its row; empty dims.
    x = torch.randn(8, 20000, device="cuda").to(dt)
    x[0] = float("-inf")
    x[1, 123] = float("nan")
    x[2, :100] = float("-inf")
    got, want = k["softmax"](x).double(), torch.softmax(x.double(), -1)
    assert got[0].isnan().all() and got[1].isnan().all() and not got[2:].isnan().any()
    torch.testing.assert_close(got[2:], want[2:], rtol=tol, atol=tol)
    empty = torch.empty(5, 0, device="cuda", dtype=dt)
    assert (k["sum"](empty) == 0).all() and k["mean"](empty).isnan().all()
    assert k["sum_all"](empty).item() == 0 and k["mean_all"](empty).isnan().item()


@needs_gpu
def test_transposed_and_broadcast_cuda_operands():
    x = torch.randn(300, 64, device="cuda").t()
    b = torch.randn(300, device="cuda").expand(64, 300)
    torch.testing.assert_close(dlbridge.get_kernel("add")(x, b), x + b)
    torch.testing.assert_close(dlbridge.get_kernel("relu")(x), torch.relu(x))


@needs_gpu
def test_out_is_written_in_place_with_zero_copies():
    x = torch.randn(1000, device="cuda")
    out = torch.empty_like(x)
    ptr = out.data_ptr()
    r = dlbridge.get_kernel("mul")(x, x, out=out)
    assert r is out and out.data_ptr() == ptr
    torch.testing.assert_close(out, x * x)


@needs_gpu
def test_kernels_run_on_torchs_current_stream():
    s = torch.cuda.Stream()
    x = torch.randn(1 << 22, device="cuda")
    s.wait_stream(torch.cuda.current_stream())  # x was made on the default stream
    with torch.cuda.stream(s):
        # Queued on s after a long torch op on s: correct only if dlbridge launches on s too.
        y = torch.mm(torch.randn(2048, 2048, device="cuda"), torch.randn(2048, 2048, device="cuda"))
        z = x * 2
        r = dlbridge.get_kernel("add")(z, z)
    s.synchronize()
    torch.testing.assert_close(r, x * 4)
    assert y.shape == (2048, 2048)


@needs_gpu
def test_a_cpu_and_a_cuda_tensor_are_refused():
    with pytest.raises(Exception) as e:
        dlbridge.get_kernel("add")(torch.ones(3), torch.ones(3, device="cuda"))
    assert "cpu" in str(e.value) and "cuda" in str(e.value)


# ---- RawKernel ------------------------------------------------------------------------

SCALE = r"""
extern "C" __global__ void scale(const T* x, double alpha, T* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = (T)(alpha * (double)x[i]);
}
"""
SCALE_SIG = "scale<T: f32|f64>(x: T[N], alpha: f64) -> (y: T[N])"

needs_nvrtc = pytest.mark.skipif(
    dlbridge.cuda.status()["nvrtc"] is None, reason=f"no NVRTC: {dlbridge.cuda.status()['nvrtc_error']}"
)


def test_nvrtc_is_found_in_the_nvidia_wheels_torch_brings():
    import glob
    import site

    wheels = [
        f
        for d in site.getsitepackages()
        for f in glob.glob(f"{d}/nvidia/*/lib/libnvrtc.so.1[23]")
    ]
    if not wheels:
        pytest.skip("no NVIDIA NVRTC wheel in this environment")
    assert dlbridge.cuda.status()["nvrtc"] is not None, dlbridge.cuda.status()["nvrtc_error"]


@needs_nvrtc
def test_a_raw_kernel_compiles_when_made_and_describes_itself():
    k = dlbridge.cuda.RawKernel(SCALE, "scale", SCALE_SIG)
    assert k.kernel.devices == ["cuda"]
    assert k.signature == SCALE_SIG
    assert repr(k) == f"dlbridge.cuda.RawKernel('scale', '{SCALE_SIG}')"
    ptx = k.ptx("compute_80")
    assert ".entry scale(" in ptx and ".target sm_80" in ptx
    # A name the source defines no kernel of is refused when the kernel is made, not at its first launch.
    with pytest.raises(ValueError, match=r"RawKernel nope: the compiled source has no kernel named \"nope\".*its kernels: `scale`"):
        dlbridge.cuda.RawKernel(SCALE, "nope", SCALE_SIG.replace("scale", "nope", 1))


@needs_nvrtc
def test_a_raw_kernel_that_does_not_compile_raises_with_nvrtcs_log():
    bad = SCALE.replace("alpha *", "alpha * undefined_thing *")
    with pytest.raises(RuntimeError) as e:
        dlbridge.cuda.RawKernel(bad, "scale", SCALE_SIG)
    msg = str(e.value)
    # The log names the user's own file and line (the typedefs in front do not shift it).
    assert "undefined_thing" in msg and "scale.cu(4)" in msg, msg


def test_raw_kernel_arguments_are_checked_before_compiling():
    with pytest.raises(ValueError, match="not a C identifier"):
        dlbridge.cuda.RawKernel(SCALE, "no such name", SCALE_SIG)
    with pytest.raises(ValueError, match="block = 0"):
        dlbridge.cuda.RawKernel(SCALE, "scale", SCALE_SIG, block=0)
    with pytest.raises(ValueError, match="c64"):
        dlbridge.cuda.RawKernel(SCALE, "scale", "scale(x: c64[N]) -> (y: c64[N])")
    with pytest.raises(ValueError, match="RawKernel 'scale': the signature names `other`, not the kernel `scale`"):
        dlbridge.cuda.RawKernel(SCALE, "scale", SCALE_SIG.replace("scale", "other", 1))
    with pytest.raises(ValueError, match="RawKernel 'scale': signature error at column"):
        dlbridge.cuda.RawKernel(SCALE, "scale", "scale(x: f32[N] -> (y: f32[N])")
    with pytest.raises(TypeError, match="RawKernel: source must be a str, got bytes"):
        dlbridge.cuda.RawKernel(SCALE.encode(), "scale", SCALE_SIG)


@needs_nvrtc
def test_a_raw_kernel_refuses_host_tensors_by_device():
    k = dlbridge.cuda.RawKernel(SCALE, "scale", SCALE_SIG)
    with pytest.raises(BufferError, match="cuda"):
        k(torch.ones(3), 2.0)


@needs_gpu
def test_a_raw_kernel_runs_on_torch_cuda_tensors():
    k = dlbridge.cuda.RawKernel(SCALE, "scale", SCALE_SIG)
    for dt in (torch.float32, torch.float64):
        x = torch.randn(100_001, device="cuda", dtype=dt)
        y = k(x, -2.5)
        assert y.device == x.device and y.dtype == dt
        torch.testing.assert_close(y, x * -2.5)
        out = torch.empty_like(x)
        assert k(x, 3.0, out=out) is out
        torch.testing.assert_close(out, x * 3.0)
    with pytest.raises(Exception, match="contiguous"):
        k(torch.randn(10, 10, device="cuda").t().reshape(-1)[::2], 1.0)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_through_cublas_on_every_layout(dtype):
    dt = getattr(torch, dtype)
    a = torch.randn(37, 53, device="cuda", dtype=dt)
    b = torch.randn(53, 29, device="cuda", dtype=dt)
    mm = dlbridge.get_kernel("matmul")
    tol = 1e-4 if dtype == "float32" else 1e-10
    for x, y in [(a, b), (a.t().contiguous().t(), b), (a, b.t().contiguous().t())]:
        torch.testing.assert_close(mm(x, y), x @ y, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="neither row- nor column-major"):
        mm(a[:, ::2], b[::2, :])


# ---- dlbridge.Array in CUDA memory: zero copy, copies between devices, streams ----

SLOW_FILL = r"""
extern "C" __global__ void slow_fill(const T* x, double v, T* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    long long t0 = clock64();
    while (clock64() - t0 < 100000000LL) {}   // ~50 ms: long enough to lose a race
    if (i < n) y[i] = (T)v;
}"""


@functools.cache
def _slow_fill():
    # Made once and kept: its module stays loaded while a fill it queued still runs.
    return dlbridge.cuda.RawKernel(SLOW_FILL, "slow_fill", "slow_fill<T: f32>(x: T[N], v: f64) -> (y: T[N])")


def _filled_slowly(n, value):
    """A new CUDA array of ``n`` f32 ``value``s, written by a kernel queued on the legacy
    stream that takes ~50 ms."""
    fill = _slow_fill()
    a = dlbridge.from_dlpack(torch.zeros(n, device="cuda"))
    torch.cuda.synchronize()
    return fill(a, value)


@needs_gpu
def test_from_dlpack_of_a_torch_cuda_tensor_is_a_cuda_array_with_zero_copies():
    x = torch.arange(6.0, device="cuda").reshape(2, 3)
    a = dlbridge.from_dlpack(x)
    assert (a.device, a.shape, a.dtype, a.data_ptr) == ("cuda:0", (2, 3), "f32", x.data_ptr())
    assert a.__dlpack_device__() == (dlbridge.DLDeviceType.kDLCUDA, 0)
    assert "device='cuda:0'" in repr(a)
    back = torch.from_dlpack(a)
    assert back.device == x.device and back.data_ptr() == x.data_ptr()
    assert a.tolist() == x.tolist() and a.T.tolist() == x.t().tolist() and a[1].tolist() == x[1].tolist()
    assert a.T.data_ptr == x.data_ptr()
    with pytest.raises(BufferError, match="cuda:0 has no buffer protocol"):
        memoryview(a)


@needs_gpu
def test_kernels_on_cuda_arrays_return_cuda_arrays_from_dlbridges_pool():
    x = torch.randn(1000, device="cuda")
    a = dlbridge.from_dlpack(x)
    add = dlbridge.get_kernel("add")
    y = add(a, a)
    assert isinstance(y, dlbridge.Array) and y.device == "cuda:0"
    torch.testing.assert_close(torch.from_dlpack(y.contiguous()), x + x)
    del y
    before = dlbridge.cuda.memory_stats()
    for _ in range(20):
        y = add(a, a)
        del y
    after = dlbridge.cuda.memory_stats()
    assert after["raw_allocs"] - before["raw_allocs"] <= 1, (before, after)
    assert after["hits"] - before["hits"] >= 19, (before, after)


@needs_gpu
def test_to_device_copies_both_ways_and_keeps_values_and_layouts():
    np = pytest.importorskip("numpy")
    h = dlbridge.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    d = h.to_device("cuda")
    assert d.device == "cuda:0" and d.to_device("cuda:0") is d and d.to_device((2, 0)) is d
    assert d.to_device("cpu").tolist() == h.tolist()
    dt = h.T.to_device("cuda")  # a strided host array arrives compact
    assert dt.shape == (4, 3) and dt.element_strides == (3, 1) and dt.tolist() == h.T.tolist()
    back = d.T.to_device("cpu")  # a device view keeps its layout on the host
    assert back.element_strides == (1, 4) and back.tolist() == h.T.tolist()
    assert d[::-1, 1:3].to_device("cpu").tolist() == h[::-1, 1:3].tolist()
    c = d.T.contiguous()
    assert c.device == "cuda:0" and c.element_strides == (3, 1) and c.tolist() == h.T.tolist()
    with pytest.raises(ValueError, match="cuda:N"):
        d.to_device("gpu")


@needs_gpu
def test_dlpack_dl_device_and_copy_requests_follow_the_standard():
    np = pytest.importorskip("numpy")
    x = torch.arange(8.0, device="cuda")
    d = dlbridge.from_dlpack(x)
    with pytest.raises(BufferError):
        d.__dlpack__(dl_device=(1, 0), copy=False)
    host = np.from_dlpack(d, device="cpu")  # dl_device=(1, 0), copy=None: a host copy
    assert host.tolist() == x.tolist()
    cap = d.__dlpack__(max_version=(1, 3), copy=True)
    t = torch.from_dlpack(cap)
    assert t.device == x.device and t.data_ptr() != x.data_ptr() and t.tolist() == x.tolist()
    assert _dlbridge.inspect_capsule(d.__dlpack__(max_version=(1, 3), dl_device=(1, 0), copy=True))["flags"] & caps.IS_COPIED
    # Host to device on request.
    h = dlbridge.asarray(np.ones(4, np.float32))
    t = torch.from_dlpack(h.__dlpack__(max_version=(1, 3), dl_device=(2, 0), copy=True))
    assert t.device.type == "cuda" and t.tolist() == [1.0] * 4
    # from_dlpack's device=: copies where needed, refuses with copy=False.
    assert dlbridge.from_dlpack(x, device="cpu").device == "cpu"
    assert dlbridge.from_dlpack(np.ones(3), device="cuda").device == "cuda:0"
    with pytest.raises(ValueError, match="only a copy"):
        dlbridge.from_dlpack(x, device="cpu", copy=False)


@needs_gpu
def test_stream_arguments_order_with_exactly_one_event_across_streams():
    d = dlbridge.from_dlpack(torch.ones(16, device="cuda"))
    waits = lambda: dlbridge.cuda.memory_stats()["stream_waits"]  # noqa: E731
    with pytest.raises(ValueError, match="ambiguous|stream=0"):
        d.__dlpack__(stream=0)
    w = waits()
    d.__dlpack__(stream=None)
    d.__dlpack__(stream=1)
    d.__dlpack__(stream=-1)
    assert waits() == w, "same stream or no ordering asked: no event"
    s = torch.cuda.Stream()
    d.__dlpack__(stream=s.cuda_stream)
    assert waits() == w + 1
    d.__dlpack__(stream=2)
    assert waits() == w + 2


@needs_gpu
def test_a_consumer_on_a_side_stream_sees_work_queued_on_the_legacy_stream():
    n = 1 << 20
    y = _filled_slowly(n, 7.0)  # queued on the legacy stream, ~50 ms
    assert y.device == "cuda:0"
    s = torch.cuda.Stream()  # a non-blocking stream: no implicit order with the legacy one
    with torch.cuda.stream(s):
        t = torch.from_dlpack(y)  # __dlpack__(stream=s): s waits for the fill
        total = t.sum()
    s.synchronize()
    assert total.item() == 7.0 * n


@needs_gpu
def test_a_call_on_a_side_stream_waits_for_a_cuda_array_and_it_for_the_call():
    n = 1 << 20
    y = _filled_slowly(n, 3.0)  # legacy stream, ~50 ms
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.ones(n, device="cuda")
        r = dlbridge.get_kernel("add")(x, y)  # runs on s: must wait for the fill
    s.synchronize()
    assert r.sum().item() == 4.0 * n


@needs_gpu
def test_pool_memory_lent_to_torch_goes_back_to_the_driver_not_the_cache():
    a = dlbridge.from_dlpack(torch.ones(4096, device="cuda"))
    add = dlbridge.get_kernel("add")
    y = add(a, a)
    before = dlbridge.cuda.memory_stats()
    del y  # never exported: back to the cache
    mid = dlbridge.cuda.memory_stats()
    assert mid["bytes_cached"] > before["bytes_cached"] and mid["raw_frees"] == before["raw_frees"]
    y = add(a, a)
    t = torch.from_dlpack(y)
    assert t.data_ptr() == y.data_ptr
    del y, t
    after = dlbridge.cuda.memory_stats()
    assert after["raw_frees"] == mid["raw_frees"] + 1, (mid, after)


def test_torch_operators_register_a_cuda_implementation_where_the_kernel_has_one():
    # Runs everywhere: the registration, read back from torch's dispatcher.
    import dlbridge.torch

    ops = dlbridge.torch.register_all()
    for name, op in ops.items():
        has_cuda = "cuda" in dlbridge.get_kernel(name).devices
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.default.name(), "CUDA") == has_cuda, name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.default.name(), "CPU"), name


@needs_gpu
def test_torch_operators_run_on_cuda_tensors_eager_compiled_and_under_opcheck():
    import dlbridge.torch

    ops = dlbridge.torch.register_all()
    x, w = torch.randn(64, 32, device="cuda"), torch.randn(32, 16, device="cuda")
    for name in ("add", "mul", "relu", "gelu", "softmax", "sum", "matmul"):
        args = (x, w) if name == "matmul" else (x, x) if name in ("add", "mul") else (x,)
        torch.library.opcheck(ops[name], args)
    y = ops["matmul"](x, w)
    assert y.device == x.device
    torch.testing.assert_close(y, x @ w, rtol=1e-4, atol=1e-4)

    def f(x, w):
        return torch.ops.dlbridge.softmax(torch.ops.dlbridge.gelu(torch.ops.dlbridge.matmul(x, w)))

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for rows in (64, 17):
        xr = torch.randn(rows, 32, device="cuda")
        torch.testing.assert_close(compiled(xr, w), torch.softmax(torch.nn.functional.gelu(xr @ w), -1),
                                   rtol=1e-4, atol=1e-5)
    xd = torch.randn(8, 4, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ops["gelu"], (xd,))
