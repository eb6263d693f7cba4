"""The call path's fast paths skip no check the slow paths make.

Exact NumPy arrays are read in place (the array object's own fields; other
buffers through the buffer protocol) instead of through `__dlpack__`; torch tensors that are written are borrowed through the exchange
API (torch has no read-only tensors) instead of exported; `dlbridge.Array`s are
read in place. Each is zero copy, and each still refuses what it must.
"""

import numpy as np
import pytest
import torch

import dlbridge

add = dlbridge.get_kernel("add")
axpy = dlbridge.get_kernel("axpy")


class DlpackCounting(np.ndarray):
    """A NumPy subclass whose __dlpack__ is observable: subclasses keep the DLPack path."""

    calls = 0

    def __dlpack__(self, *args, **kwargs):
        type(self).calls += 1
        return super().__dlpack__(*args, **kwargs)


def test_numpy_in_and_out_are_zero_copy():
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    out = np.empty((2, 3), np.float32)
    before = out.__array_interface__["data"][0]
    r = add(a[:, ::-1], b, out=out)  # a strided input, a given output
    assert r is out and out.__array_interface__["data"][0] == before
    np.testing.assert_array_equal(out, a[:, ::-1] + 1)
    # Outputs allocated for NumPy callers are NumPy arrays.
    new = add(a, b)
    assert type(new) is np.ndarray and new.dtype == np.float32
    np.testing.assert_array_equal(new, a + b)


def test_read_only_numpy_is_refused_for_writing_and_never_written():
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match=r"^add: output out: the tensor is read-only"):
        add(np.ones(3, np.float32), np.ones(3, np.float32), out=ro)
    with pytest.raises(BufferError, match=r"^axpy: argument y: the tensor is read-only"):
        axpy(1.0, np.ones(3, np.float32), ro)
    assert (ro == 0).all()
    # Read-only arrays are fine to read.
    np.testing.assert_array_equal(add(ro, ro), np.zeros(3, np.float32))


def test_numpy_subclasses_and_unusual_arrays_take_the_dlpack_path():
    DlpackCounting.calls = 0
    a = np.ones(3, np.float32).view(DlpackCounting)
    np.testing.assert_array_equal(np.asarray(add(a, a)), np.full(3, 2, np.float32))
    assert DlpackCounting.calls == 2
    # A non-native byte order: neither path reads it as native floats.
    swapped = np.ones(3, np.dtype(np.float32).newbyteorder())
    with pytest.raises((BufferError, TypeError, ValueError)):
        add(swapped, swapped)


def test_written_torch_tensors_are_borrowed_zero_copy_and_still_checked():
    x, y = torch.ones(4), torch.arange(4.0)
    ptr, version = y.data_ptr(), y._version
    axpy(2.0, x, y)
    assert y.data_ptr() == ptr and y.tolist() == [2.0, 3.0, 4.0, 5.0]
    assert y._version > version, "autograd saw the write"
    z = torch.empty(4)
    assert add(x, y, out=z) is z and z.tolist() == [3.0, 4.0, 5.0, 6.0]
    # A strided output view is written in place, through the borrowed layout.
    big = torch.zeros(4, 2)
    add(x, x, out=big[:, 1])
    assert big[:, 1].tolist() == [2.0] * 4 and big[:, 0].tolist() == [0.0] * 4
    # The checks a written torch tensor must pass are all still made.
    g = torch.zeros(4, requires_grad=True)
    with pytest.raises(BufferError, match="requires grad"):
        axpy(1.0, x, g)
    with torch.inference_mode():
        inf = torch.zeros(4)
    with pytest.raises(BufferError, match="inference tensor"):
        axpy(1.0, x, inf)
    with pytest.raises(BufferError, match="negative-bit"):
        axpy(1.0, x, torch.zeros(4)._neg_view())
    assert inf.tolist() == [0.0] * 4


def test_dlbridge_arrays_are_read_and_written_in_place():
    a = dlbridge.asarray(np.arange(4, dtype=np.float32))
    y = dlbridge.zeros((4,), "f32")
    axpy(1.0, a, y)
    axpy(1.0, a, y)
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0]
    ro_np = np.zeros(4, np.float32)
    ro_np.flags.writeable = False
    ro = dlbridge.from_dlpack(ro_np)
    with pytest.raises(BufferError):
        axpy(1.0, a, ro)
    assert ro.tolist() == [0.0] * 4


@pytest.mark.parametrize("n", [4, 1 << 16])  # the GIL is kept / released (owning imports)
def test_only_written_torch_tensors_get_their_version_bumped(n):
    # A tensor autograd saved is only read: backward must still work afterwards.
    a = torch.ones(n, requires_grad=True)
    b = a * 2
    s = b.sin()
    x, y, z = b.detach(), torch.ones(n), torch.empty(n)
    versions = (x._version, y._version, z._version)
    add(x, y, out=z)
    assert (x._version, y._version) == versions[:2], "read arguments are not modified"
    assert z._version > versions[2], "the written output is"
    s.sum().backward()
    torch.testing.assert_close(a.grad, 2 * torch.cos(b.detach()))
    w = torch.zeros(n)
    before = (x._version, w._version)
    axpy(1.0, x, w)
    assert x._version == before[0] and w._version > before[1]


# ---- borrowed torch tensors are validated once per call, and never used stale ----------------


class _SwapOnAllocation:
    """A TorchDispatchMode that, when torch allocates the call's output (dlbridge asks
    torch's exchange-API allocator, which dispatches through Python modes), replaces
    the storage of `victim` — whose old storage is then freed."""

    def __init__(self, victim, replacement):
        from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

        seen = self.seen = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(str(func))
                if func is torch.ops.aten.empty.memory_format and len(seen) == 1:
                    with _disable_current_modes():
                        victim.set_(replacement)
                return func(*args, **(kwargs or {}))

        self.mode = Mode()


def test_python_code_run_by_the_output_allocator_makes_every_borrowed_view_be_taken_again():
    # The inputs are borrowed (and validated) once before the outputs are allocated;
    # Python code that runs during the allocation changes x: the kernel must see the new x.
    x, y = torch.ones(4), torch.ones(4)
    old = x.data_ptr()
    swap = _SwapOnAllocation(x, torch.full((4,), 5.0))
    with swap.mode:
        out = add(x, y)
    assert swap.seen == ["aten.empty.memory_format"]
    assert x.data_ptr() != old
    assert out.tolist() == [6.0] * 4  # a stale view would have read the freed storage (ones)


def test_a_tensor_reshaped_during_allocation_is_checked_again_not_read_out_of_bounds():
    x, y = torch.ones(4), torch.ones(4)
    swap = _SwapOnAllocation(x, torch.full((2,), 5.0))
    # The output was sized from x's old shape [4]; x is now [2], and says so.
    with swap.mode, pytest.raises(ValueError, match=r"add: argument b: \.\.\.S = \[2\] \(bound by a\) but got \[4\]"):
        add(x, y)


def test_complex_torch_tensors_have_their_conjugate_bit_checked_after_the_deferred_borrow():
    copy = dlbridge.get_kernel("copy")
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    assert copy(z).tolist() == [1 + 2j, 3 - 1j]
    with pytest.raises(BufferError, match="conjugate-bit view") as e:
        copy(z.conj())
    assert (e.value.kernel, e.value.argument) == ("copy", "x")
    w = torch.zeros(2, dtype=torch.complex64)
    with pytest.raises(BufferError, match="conjugate-bit view") as e:
        copy(z, out=w.conj())
    assert (e.value.argument, e.value.output) == ("y", True)
    assert w.tolist() == [0j, 0j]


# Exact NumPy arrays are read in place (the array object's own fields, the
# layout checked once against NumPy's own answers); arrays that path declines
# (more than 4 dims, odd dtypes) take the buffer protocol. Either way, every
# layout gives NumPy's own result, and written arguments are written in place.
LAYOUTS = {
    "0-d": lambda: np.array(3.5, np.float32),
    "1-d": lambda: np.arange(7, dtype=np.float32),
    "negative strides": lambda: np.arange(24, dtype=np.float32).reshape(4, 6)[::-1, ::-2],
    "sliced, offset": lambda: np.arange(60, dtype=np.float32).reshape(5, 12)[1:4, 3:9:2],
    "transposed 3-d": lambda: np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(2, 0, 1),
    "4-d": lambda: np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)[:, ::2],
    "5-d (buffer protocol)": lambda: np.arange(240, dtype=np.float32).reshape(2, 3, 4, 5, 2)[..., ::-1],
    "broadcast (read-only, zero strides)": lambda: np.broadcast_to(np.arange(3, dtype=np.float32), (4, 3)),
    "empty": lambda: np.zeros((3, 0), np.float32),
}


def test_numpy_arrays_are_read_in_place_with_this_numpy():
    # The layout check passed: a check that wrongly failed would silently send
    # every array through the slower buffer protocol.
    assert dlbridge._dlbridge._numpy_read_in_place()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_numpy_arrays_on_every_layout_give_numpys_result(layout):
    a = LAYOUTS[layout]()
    b = a.copy() * 2 + 1  # contiguous, same shape (0-d stays 0-d)
    np.testing.assert_array_equal(add(a, b), a + b)
    np.testing.assert_array_equal(add(b, a), b + a)


def test_written_numpy_arguments_and_outputs_are_written_in_place():
    base = np.zeros(64, np.float32)
    y = base[60:3:-7]  # an offset and a negative stride
    x = np.arange(y.size, dtype=np.float32)
    ptr = y.__array_interface__["data"][0]
    axpy(2.0, x, y)
    assert y.__array_interface__["data"][0] == ptr
    np.testing.assert_array_equal(y, 2 * x)
    assert base.sum() == 2 * x.sum()  # nothing outside y was written
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out_t = np.empty((3, 2), np.float32).T  # a transposed given output
    ptr = out_t.__array_interface__["data"][0]
    assert add(a, a, out=out_t) is out_t and out_t.__array_interface__["data"][0] == ptr
    np.testing.assert_array_equal(out_t, a + a)


@pytest.mark.parametrize(
    "dtype",
    [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.intc, np.uintc, np.int_, np.uint, np.longlong,
     np.ulonglong, np.float16, np.float32, np.float64, np.complex64, np.complex128],
)
def test_every_numpy_dtype_with_a_dlpack_code_is_read_as_itself(dtype):
    copy = dlbridge.get_kernel("copy")
    a = (np.arange(12) % 3).astype(dtype).reshape(3, 4)[:, ::-1]
    r = copy(a)
    assert type(r) is np.ndarray and r.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(r, a)


_FP_SOURCE = """
void fp_scale(const float* x, double s, float* y, long long n) { for (long long i = 0; i < n; i++) y[i] = x[i] * s; }
void fp_axpy(float* y, const float* x, double s, long long n) { for (long long i = 0; i < n; i++) y[i] += x[i] * s; }
"""


def _fp():
    """Kernels with a scalar after their tensors: converting the scalar runs its __float__."""
    return dlbridge.load_inline(
        "fast_paths_fp",
        _FP_SOURCE,
        {"fp_scale": "fp_scale(x: f32[...S], s: f64) -> (y: f32[...S])", "fp_axpy": "fp_axpy(y: mut f32[...S], x: f32[...S], s: f64)"},
    )


def test_a_numpy_array_changed_by_python_code_during_binding_is_an_error_not_a_stale_read():
    fp = _fp()
    x = np.ones(4, np.float32)

    class Resizes:
        def __float__(self):
            x.resize((1 << 16,), refcheck=False)  # frees the buffer bound a moment ago
            return 2.0

    with pytest.raises(RuntimeError, match="NumPy array was resized, reshaped, retyped"):
        fp.fp_scale(x, Resizes())

    y = np.ones((2, 3), np.float32)

    class Reshapes:
        def __float__(self):
            y.shape = (3, 2)  # same buffer, new shape and strides
            return 2.0

    with pytest.raises(RuntimeError, match="NumPy array was resized, reshaped, retyped"):
        fp.fp_scale(y, Reshapes())

    w, v = np.zeros(3, np.float32), np.ones(3, np.float32)

    class Freezes:
        def __float__(self):
            w.flags.writeable = False  # w was bound writable a moment ago
            return 2.0

    with pytest.raises(RuntimeError, match="had its flags changed"):
        fp.fp_axpy(w, v, Freezes())
    np.testing.assert_array_equal(w, 0)  # never written


def test_python_code_that_leaves_numpy_arrays_alone_does_not_disturb_the_call():
    fp = _fp()
    x, y = np.arange(5, dtype=np.float32), np.ones(5, np.float32)

    class Harmless:
        def __float__(self):
            np.ones(1000).sum()  # Python and NumPy code run; x and y are untouched
            return 3.0

    np.testing.assert_array_equal(fp.fp_scale(x, Harmless()), x * 3)
    fp.fp_axpy(y, x, Harmless())
    np.testing.assert_array_equal(y, 1 + 3 * x)


# --- The vectorcall entry of dlbridge.Kernel -----------------------------------
#
# Calls take the Kernel type's vectorcall entry (no argument tuple, no keyword
# dict); `type(k).__call__(k, ...)` still reaches pyo3's tp_call. Both must bind,
# check and fail alike.


def test_kernels_are_called_through_vectorcall_on_this_python():
    # The type-object layout check passed: a check that wrongly failed would
    # silently send every call through the slower tp_call.
    assert dlbridge._dlbridge._kernel_vectorcall()


def _both_entries(kernel, *args, **kwargs):
    """The kernel called through vectorcall and through tp_call, results or errors."""
    out = []
    for call in (kernel, lambda *a, **k: type(kernel).__call__(kernel, *a, **k)):
        try:
            out.append(("ok", call(*args, **kwargs)))
        except Exception as e:  # noqa: BLE001 - compared below
            out.append((type(e), str(e), getattr(e, "kernel", None), getattr(e, "argument", None)))
    return out


def test_vectorcall_and_tp_call_agree_on_results():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((2, 3), np.float32)
    (_, r1), (_, r2) = _both_entries(add, a, b)
    np.testing.assert_array_equal(r1, a + b)
    np.testing.assert_array_equal(r2, a + b)
    # out= as a keyword (kwnames in vectorcall, a dict in tp_call), and destination-passing.
    for kwargs, extra in (({"out": np.empty((2, 3), np.float32)}, ()), ({}, (np.empty((2, 3), np.float32),))):
        target = kwargs.get("out", extra[0] if extra else None)
        for kind, r in _both_entries(add, a, b, *extra, **kwargs):
            assert kind == "ok" and r is target
            np.testing.assert_array_equal(target, a + b)
    # A scalar parameter, and a keyword passed through ** (PyObject_Call with a dict).
    x = torch.arange(4, dtype=torch.float32)
    y = torch.ones(4)
    for kind, r in _both_entries(axpy, 2.0, x, y):  # y += 2 x, once through each entry
        assert kind == "ok" and r is None
    torch.testing.assert_close(y, 4 * x + 1)
    out = torch.empty(4)
    assert add(x, y, **{"out": out}) is out
    torch.testing.assert_close(out, x + y)


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((), {}, "add() takes 2 arguments"),
        ((np.ones(2, np.float32),), {}, "add() takes 2 arguments"),
        ((np.ones(2, np.float32),) * 2, {"foo": 1}, "unexpected keyword argument 'foo'"),
        ((np.ones(2, np.float32),) * 2, {"out": np.empty(2, np.float32), "bar": 1}, "unexpected keyword argument 'bar'"),
        ((np.ones(2, np.float32), "x"), {}, "expected a tensor"),
        ((np.ones(2, np.float32), np.ones(3, np.float32)), {}, "add"),
        ((np.ones(2, np.float32),) * 3, {"out": np.empty(2, np.float32)}, "outputs are given twice"),
    ],
)
def test_vectorcall_and_tp_call_agree_on_errors(args, kwargs, message):
    (e1, *rest1), (e2, *rest2) = _both_entries(add, *args, **kwargs)
    assert e1 is e2 and e1 != "ok" and issubclass(e1, Exception)
    assert rest1 == rest2
    assert message in rest1[0]


def test_vectorcall_writes_nothing_into_a_read_only_output():
    a = np.ones(3, np.float32)
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    for kind, *rest in _both_entries(add, a, a, out=ro):
        assert kind is not None and kind != "ok", rest
    np.testing.assert_array_equal(ro, 0)


def test_kernel_type_is_immutable_so_call_cannot_diverge_from_the_entry():
    # On 3.11, assigning __call__ on a type with a vectorcall entry would change
    # tp_call only; the type refuses the assignment instead.
    with pytest.raises(TypeError):
        dlbridge.Kernel.__call__ = lambda *a, **k: "patched"
    a = np.ones(2, np.float32)
    np.testing.assert_array_equal(add(a, a), a + a)


def test_a_keyword_that_is_not_valid_utf8_is_an_unexpected_keyword_on_both_entries():
    a = np.ones(2, np.float32)
    (e1, m1, *_), (e2, m2, *_) = _both_entries(add, a, a, **{"\ud800": 1})
    assert e1 is e2 is TypeError
    assert "unexpected keyword argument" in m1 and "unexpected keyword argument" in m2
