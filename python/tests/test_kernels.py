"""Calling registry kernels from Python on torch, NumPy, dlbridge.Array and buffers."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import dlbridge


def test_torch_in_torch_out_allocated_by_torch():
    x, y = torch.rand(3, 4), torch.rand(4, 5)
    c = dlbridge.get_kernel("matmul")(x, y)
    assert type(c) is torch.Tensor
    assert c.shape == (3, 5) and c.dtype == torch.float32
    torch.testing.assert_close(c, x @ y)
    c[0, 0] = 42.0  # an ordinary, writable torch tensor
    assert c[0, 0] == 42.0


def test_numpy_in_numpy_out():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    out = dlbridge.get_kernel("sum")(a)
    assert type(out) is np.ndarray and out.dtype == np.float64
    np.testing.assert_array_equal(out, a.sum(-1))


def test_array_in_array_out():
    a = dlbridge.arange(6, "i64")
    out = dlbridge.get_kernel("add")(a, a)
    assert isinstance(out, dlbridge.Array)
    assert out.tolist() == [0, 2, 4, 6, 8, 10]


def test_buffer_objects_are_inputs_and_outputs_are_arrays():
    import array

    a = array.array("f", [1.0, -2.0, 3.0])
    out = dlbridge.get_kernel("relu")(a)
    assert isinstance(out, dlbridge.Array) and out.tolist() == [1.0, 0.0, 3.0]
    mv = memoryview(bytearray(np.array([4.0, 9.0], dtype=np.float32).tobytes())).cast("f")
    assert dlbridge.get_kernel("relu")(mv).tolist() == [4.0, 9.0]


def test_out_writes_in_place_and_returns_it():
    x, y = torch.rand(100), torch.rand(100)
    z = torch.empty(100)
    ptr = z.data_ptr()
    r = dlbridge.get_kernel("add")(x, y, out=z)
    assert r is z and z.data_ptr() == ptr
    torch.testing.assert_close(z, x + y)
    n = np.zeros(100, dtype=np.float32)
    assert dlbridge.get_kernel("add")(x.numpy(), y.numpy(), out=n) is n
    np.testing.assert_allclose(n, (x + y).numpy())


def test_destination_passing_style_writes_into_the_extra_positional_tensors():
    x, y = torch.rand(7), torch.rand(7)
    z = torch.zeros(7)
    dlbridge.get_kernel("mul")(x, y, z)
    torch.testing.assert_close(z, x * y)


def test_zero_copy_inputs_strided_views_and_mut_params():
    base = torch.arange(12.0).reshape(3, 4)
    t = base.t()  # a strided view: read in place
    out = dlbridge.get_kernel("copy")(t)
    assert out.is_contiguous() and torch.equal(out, t.contiguous())
    y = torch.ones(5)
    ptr = y.data_ptr()
    assert dlbridge.get_kernel("axpy")(0.5, torch.arange(5.0), y) is None
    assert y.data_ptr() == ptr
    torch.testing.assert_close(y, 1 + 0.5 * torch.arange(5.0))
    ny = np.ones(3)
    dlbridge.get_kernel("axpy")(2.0, np.arange(3.0), ny)
    np.testing.assert_array_equal(ny, [1.0, 3.0, 5.0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64])
def test_elementwise_dtypes_match_torch(dtype):
    x = (torch.arange(-8, 8) * 3).to(dtype)
    y = (torch.arange(8, -8, -1) + 1).to(dtype)
    for name, ref in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("maximum", torch.maximum)]:
        got = dlbridge.get_kernel(name)(x, y)
        assert got.dtype == dtype
        torch.testing.assert_close(got, ref(x, y))


def test_softmax_gelu_and_reductions_match_torch():
    v = torch.randn(64, 33, dtype=torch.float64)
    torch.testing.assert_close(dlbridge.get_kernel("softmax")(v), torch.softmax(v, -1))
    torch.testing.assert_close(dlbridge.get_kernel("gelu")(v), torch.nn.functional.gelu(v))
    torch.testing.assert_close(dlbridge.get_kernel("mean")(v), v.mean(-1))
    torch.testing.assert_close(dlbridge.get_kernel("sum_all")(v), v.sum())
    h = v.to(torch.float16)
    torch.testing.assert_close(dlbridge.get_kernel("softmax")(h), torch.softmax(h.float(), -1).half(), atol=2e-3, rtol=1e-2)


def test_large_calls_release_the_gil_and_return_correct_results():
    a = torch.rand(300, 300)
    torch.testing.assert_close(dlbridge.get_kernel("matmul")(a, a), a @ a, rtol=1e-4, atol=1e-4)


def test_kernel_objects_describe_themselves():
    k = dlbridge.get_kernel("matmul")
    assert k.name == "matmul"
    assert k.signature == "matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])"
    assert repr(k) == "<dlbridge.Kernel matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N]) [cpu, cuda]>"
    assert k.devices == ["cpu", "cuda"]
    names = [k.name for k in dlbridge.list_kernels()]
    assert names == sorted(names) and {"add", "softmax", "matmul", "axpy"} <= set(names)
    assert k.prepare_outputs(torch.rand(2, 3), torch.rand(3, 4)) == [([2, 4], "f32", "cpu")]


def test_plugin_kernels_run_on_torch_and_numpy(c_plugin):
    plugin = dlbridge.load_plugin(str(c_plugin))
    assert (plugin.name, plugin.version) == ("example-c", "1.0.0")
    assert "c_saxpy(alpha: f64, x: f32[N], y: mut f32[N])" in [k.signature for k in plugin.kernels]
    assert dlbridge.load_plugin(str(c_plugin)).name == "example-c"  # loading twice is harmless
    y = torch.ones(4)
    dlbridge.get_kernel("c_saxpy")(3.0, torch.arange(4.0), y)
    torch.testing.assert_close(y, 1 + 3 * torch.arange(4.0))
    out = dlbridge.get_kernel("c_dot")(np.arange(3.0), np.arange(3.0))
    assert out.shape == () and out == 5.0
    with pytest.raises(ValueError, match=r"c_sqrt: negative input -4 at index 0 \(plugin example-c\)"):
        dlbridge.get_kernel("c_sqrt")(torch.tensor([-4.0]))


_FORK_CHILD = r"""
import os, sys, numpy as np, dlbridge
relu = dlbridge.get_kernel("relu")
x = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024) - 1000.0
want = np.maximum(x, 0)
assert np.array_equal(relu(x), want)  # the parent's helper threads are running now
pid = os.fork()
if pid == 0:  # the child has the parent's team and pool, but none of their threads
    ok = np.array_equal(relu(x), want) and np.array_equal(relu(x.T), want.T)
    os._exit(0 if ok else 3)
for _ in range(300):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(os.waitstatus_to_exitcode(status))
    __import__("time").sleep(0.1)
os.kill(pid, 9)
sys.exit("the forked child hung in a parallel kernel")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_forked_child_runs_parallel_kernels_without_the_parents_threads():
    env = dict(os.environ, DLBRIDGE_NUM_THREADS="2")
    r = subprocess.run([sys.executable, "-c", _FORK_CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
