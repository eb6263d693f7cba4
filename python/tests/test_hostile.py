"""Hostile callers: Python code that runs in the middle of a call, autograd's
bookkeeping, buffers asked for with odd flags, errors raised where errors are not
expected. Each case here once crashed dlbridge or gave a silently wrong answer."""

import ctypes
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import dlbridge

add = dlbridge.get_kernel("add")
axpy = dlbridge.get_kernel("axpy")
relu = dlbridge.get_kernel("relu")
sum_all = dlbridge.get_kernel("sum_all")


def run_child(code: str) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter: a crash there is a failed test, not a dead suite."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_python_code_run_by_a_later_argument_cannot_free_a_lent_tensor():
    # x is read through torch's lent DLTensor (small call: the GIL is kept). B's
    # __dlpack__ runs after x was imported and swaps x's storage; the old 64 MiB
    # storage is unmapped. dlbridge must read x's current memory, never the old one.
    r = run_child("""
        import torch, numpy as np, dlbridge
        x = torch.empty_strided((8192,), (2048,)).fill_(1.0)
        y = np.zeros(8192, np.float32)
        class B:
            def __dlpack__(self, **kw):
                x.set_(torch.empty_strided((8192,), (2048,)).fill_(5.0))
                return y.__dlpack__(**kw)
            def __dlpack_device__(self):
                return (1, 0)
        out = dlbridge.get_kernel("add")(x, B())
        assert (out == 5).all(), out
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stderr[-2000:])


def test_a_torch_function_override_cannot_free_a_lent_tensor():
    r = run_child("""
        import torch, dlbridge
        class T(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") in ("is_neg", "is_conj"):
                    with torch._C.DisableTorchFunctionSubclass():
                        args[0].set_(torch.empty_strided((8192,), (2048,)).fill_(2.0))
                return super().__torch_function__(func, types, args, kwargs or {})
        x = torch.Tensor._make_subclass(T, torch.empty_strided((8192,), (2048,)).fill_(1.0))
        s = dlbridge.get_kernel("sum_all")(x)
        assert float(s) == 2 * 8192, s
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stderr[-2000:])


class Py_buffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
                ("strides", ctypes.POINTER(ctypes.c_ssize_t)), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


def test_a_simple_buffer_request_is_a_one_dimensional_byte_run():
    api = ctypes.pythonapi
    api.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int]
    api.PyBuffer_Release.argtypes = [ctypes.POINTER(Py_buffer)]
    a = dlbridge.zeros((3, 4), "f32")
    b = Py_buffer()
    assert api.PyObject_GetBuffer(a, ctypes.byref(b), 0) == 0  # PyBUF_SIMPLE
    try:
        assert b.ndim == 1 and not b.shape and b.len == 48
    finally:
        api.PyBuffer_Release(ctypes.byref(b))
    r = run_child("""
        import ctypes, dlbridge
        from ctypes import pythonapi as api
        class Py_buffer(ctypes.Structure):
            _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                        ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                        ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]
        api.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int]
        api.PyMemoryView_FromBuffer.argtypes = [ctypes.POINTER(Py_buffer)]
        api.PyMemoryView_FromBuffer.restype = ctypes.py_object
        b = Py_buffer()
        api.PyObject_GetBuffer(dlbridge.zeros((3, 4), "f32"), ctypes.byref(b), 0)
        mv = api.PyMemoryView_FromBuffer(ctypes.byref(b))
        assert mv.nbytes == 48, mv.nbytes
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stderr[-2000:])


def test_from_dlpack_refuses_a_tensor_that_requires_grad():
    g = torch.ones(3, requires_grad=True)
    with pytest.raises(BufferError, match="requires grad"):
        dlbridge.from_dlpack(g)
    assert dlbridge.from_dlpack(g.detach()).data_ptr == g.data_ptr()


@pytest.mark.parametrize("n", [3, 1 << 16])
@pytest.mark.parametrize("how", ["out", "dps", "mut"])
def test_writes_bump_the_autograd_version_so_stale_gradients_are_caught(how, n):
    w = torch.ones(n, requires_grad=True)
    y = (w * w).sum()  # saves w for backward
    d = w.detach()  # shares w's memory and version counter
    before = d._version
    if how == "out":
        add(d, d, out=d)
    elif how == "dps":
        add(d, d, d)
    else:
        axpy(1.0, torch.ones(n), d)
    assert d._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_inference_tensors_are_written_only_in_inference_mode():
    with torch.inference_mode():
        t = torch.zeros(4)
    with pytest.raises(BufferError, match="inference"):
        add(torch.ones(4), torch.ones(4), out=t)
    assert not t.any()
    with torch.inference_mode():
        add(torch.ones(4), torch.ones(4), out=t)
    assert (t == 2).all()


@pytest.mark.parametrize("make", [
    lambda: torch.eye(3).to_sparse(),
    lambda: torch.eye(3).to_sparse_csr(),
    lambda: torch.empty(3, device="meta"),
    lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8),
])
def test_tensors_without_plain_storage_are_a_buffer_error_with_a_short_message(make):
    t = make()
    for call in (lambda: relu(t), lambda: dlbridge.from_dlpack(t)):
        with pytest.raises(BufferError) as e:
            call()
        assert len(str(e.value)) < 400 and "\n" not in str(e.value), str(e.value)


def test_a_foreign_deleter_never_runs_with_an_exception_pending():
    from dlbridge import _capsules as caps

    r = run_child("""
        import numpy as np, dlbridge
        from dlbridge import _capsules as caps
        t = caps.ManagedTensor.from_numpy(np.zeros(4, np.float32), dtype=(2, 32, 4), shape=[1])
        try:
            dlbridge.from_dlpack(t.capsule()).tolist()
        except TypeError as e:
            print("TypeError", e)
    """)
    assert r.returncode == 0 and "TypeError" in r.stdout and "SystemError" not in r.stderr, (r.stdout, r.stderr[-2000:])
    assert caps  # the module the child uses is importable here too


def test_errors_raised_while_looking_for_dlpack_propagate():
    class Prop:
        @property
        def __dlpack__(self):
            raise ZeroDivisionError("boom")

    with pytest.raises(ZeroDivisionError):
        relu(Prop())


def test_scalar_errors_keep_their_type_and_complex_is_refused():
    x, y = torch.ones(2), torch.zeros(2)
    with pytest.raises(OverflowError):
        axpy(2**1024, x, y)

    class Bad:
        def __float__(self):
            raise ZeroDivisionError("no float")

    with pytest.raises(ZeroDivisionError):
        axpy(Bad(), x, y)
    for c in (np.complex64(1 + 2j), 1 + 2j, np.complex128(3j)):
        with pytest.raises(TypeError, match="complex"):
            axpy(c, x, y)
    assert not y.any()
    axpy(np.float32(2.0), x, y)
    assert (y == 2).all()


def test_out_may_be_a_list_and_counts_are_spelled_right():
    x = torch.ones(3)
    z = torch.zeros(3)
    add(x, x, out=[z])
    assert (z == 2).all()
    with pytest.raises(TypeError, match=r"out= needs 1 tensor, got 2"):
        add(x, x, out=(z, z))


def test_types_made_at_run_time_are_not_kept_alive_by_dlbridge():
    import gc
    import weakref

    refs = []
    for i in range(200):
        cls = type(f"Producer{i}", (), {"__dlpack__": lambda self, **kw: np.ones(2, np.float32).__dlpack__(**kw),
                                        "__dlpack_device__": lambda self: (1, 0)})
        np.testing.assert_array_equal(np.asarray(relu(cls())), 1)
        refs.append(weakref.ref(cls))
        del cls
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive <= 1, f"{alive} of 200 classes kept alive"  # the most recent may linger in a cache slot


def test_an_output_over_an_input_of_another_width_reads_the_whole_input_first():
    # f32 input, f64 output at the same address, shape and element strides: the
    # output's bytes cover the input's twice over, so an element-wise pass would
    # overwrite inputs it has not read yet. The input is read from a copy.
    widen = dlbridge.ElementwiseKernel("float32 x", "float64 y", "y = x + 1", "hostile_widen")
    buf = np.arange(200_000, dtype=np.float32)
    x, y = buf[:100_000], buf.view(np.float64)[:100_000]
    assert x.ctypes.data == y.ctypes.data and x.shape == y.shape
    want = np.arange(100_000, dtype=np.float64) + 1
    assert widen(x, out=y) is y
    assert np.array_equal(y, want)
    # The same bytes under a dtype of the same width are exactly the input: in place.
    same = dlbridge.ElementwiseKernel("float32 x", "int32 y", "y = (int)x + 1", "hostile_same_width")
    z = np.arange(5, dtype=np.float32)
    same(z, out=z.view(np.int32))
    assert z.view(np.int32).tolist() == [1, 2, 3, 4, 5]


def test_a_failed_torch_allocation_is_a_memory_error_naming_kernel_and_output():
    # A 2^20 x 2^20 f32 result (4 TiB) from two zero-stride views: torch's
    # allocator refuses it, and the error says where, without torch's C++ trace.
    x = torch.zeros(1).expand(1 << 20, 1 << 20)
    with pytest.raises(MemoryError, match=r"^add: output out: allocating out: f32\[1048576, 1048576\] on cpu: ") as e:
        add(x, x)
    assert "Exception raised from" not in str(e.value) and len(str(e.value)) < 400, str(e.value)
    assert (e.value.kernel, e.value.argument, e.value.output) == ("add", "out", True)


def test_a_failed_array_or_numpy_allocation_names_kernel_and_output():
    # The same 4 TiB result allocated as a dlbridge.Array (the inputs are
    # Arrays) and by NumPy (the inputs are ndarrays; NumPy's own MemoryError
    # subclass is kept, with a note saying where).
    big = np.broadcast_to(np.zeros(1, np.float32), (1 << 20, 1 << 20))
    x = dlbridge.from_dlpack(big)
    with pytest.raises(MemoryError, match=r"^add: output out: out of memory: cannot allocate 4398046511104 bytes") as e:
        add(x, x)
    assert (e.value.kernel, e.value.argument, e.value.output) == ("add", "out", True)
    with pytest.raises(MemoryError) as e:
        add(big, big)
    assert "in dlbridge kernel add: output out" in getattr(e.value, "__notes__", []), e.value
