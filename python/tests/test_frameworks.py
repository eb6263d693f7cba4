"""Outputs in the caller's framework: any framework plugs in with
dlbridge.register_allocator, its allocations checked before a kernel writes
them (JAX's plain calls: test_jax.py)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import dlbridge

from conftest import Box

add, softmax, matmul, relu = (dlbridge.get_kernel(n) for n in ("add", "softmax", "matmul", "relu"))


def new_framework():
    """A fresh Box subclass (registrations are per type) and the calls its functions saw."""
    return type("Box", (Box,), {}), {"allocate": [], "finish": [], "stream": []}


def test_a_registered_framework_allocates_each_output_once_and_finishes_it():
    T, seen = new_framework()
    made = []

    def allocate(shape, dtype, device):
        seen["allocate"].append((shape, dtype, device))
        made.append(T(np.empty(shape, dtype)))
        return made[-1]

    def finish(box):
        seen["finish"].append(box)
        return box

    dlbridge.register_allocator(T, allocate, finish=finish, stream=lambda d: seen["stream"].append(d) or 0)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = add(T(x), x)
    assert seen["allocate"] == [((2, 3), "float32", (1, 0))]
    assert out is made[0] and seen["finish"] == [made[0]], "the object allocate made is the one the caller gets"
    np.testing.assert_array_equal(out.a, x + x)
    assert seen["stream"] == [], "a CPU call asks no framework for a stream"


def test_the_first_tensor_argument_decides_and_subclasses_inherit_a_registration():
    T, seen = new_framework()
    dlbridge.register_allocator(T, lambda s, d, dev: seen["allocate"].append(s) or T(np.empty(s, d)))
    Sub = type("Sub", (T,), {})
    x = np.ones(4, np.float32)
    assert isinstance(add(x, T(x)), np.ndarray), "NumPy first: NumPy's output"
    assert isinstance(add(Sub(x), x), T)
    assert seen["allocate"] == [(4,)]


def test_the_latest_registration_wins():
    T, _ = new_framework()
    dlbridge.register_allocator(T, lambda s, d, dev: T(np.zeros(s, d)), finish=lambda b: "first")
    dlbridge.register_allocator(T, lambda s, d, dev: T(np.zeros(s, d)), finish=lambda b: "second")
    assert add(T(np.ones(2, np.float32)), np.ones(2, np.float32)) == "second"


def test_a_name_registers_a_type_without_importing_its_module(monkeypatch):
    mod = types.ModuleType("dlbridge_test_fw")
    mod.Arr = type("Arr", (Box,), {})
    dlbridge.register_allocator("dlbridge_test_fw.Arr", lambda s, d, dev: mod.Arr(np.empty(s, d)))
    x = np.ones(3, np.float32)
    # Not in sys.modules: nothing resolves the name, so the output is dlbridge's own.
    assert isinstance(add(mod.Arr(x), x), dlbridge.Array)
    monkeypatch.setitem(sys.modules, "dlbridge_test_fw", mod)
    dlbridge.register_allocator("dlbridge_test_fw.Arr", lambda s, d, dev: mod.Arr(np.empty(s, d)))  # clears the cache
    assert isinstance(add(mod.Arr(x), x), mod.Arr)


def test_declining_gives_a_dlbridge_array_which_finish_hands_over():
    T, seen = new_framework()
    dlbridge.register_allocator(T, lambda s, d, dev: None, finish=lambda a: seen["finish"].append(a) or ("handed", a))
    tag, a = add(T(np.ones(3, np.float32)), np.ones(3, np.float32))
    assert tag == "handed" and isinstance(a, dlbridge.Array) and a.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize(
    ("made", "says"),
    [
        (lambda s, d: np.empty((s[0] + 1,), d), "returned shape [4]; the output needs"),
        (lambda s, d: np.empty(s, np.float64), "returned dtype f64; the output needs"),
        (lambda s, d: np.empty((s[0] * 2,), d)[::2], "returned a non-contiguous array (strides [2])"),
    ],
)
def test_an_allocation_that_does_not_fit_is_an_error_naming_the_registration(made, says):
    T, _ = new_framework()
    dlbridge.register_allocator(T, lambda s, d, dev: T(made(s, d)))
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"add: output out: the allocator registered for .*Box returned") as e:
        add(T(x), x)
    assert says in str(e.value)


def test_a_read_only_allocation_is_refused_and_never_written():
    T, _ = new_framework()
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    dlbridge.register_allocator(T, lambda s, d, dev: ro)
    with pytest.raises(ValueError, match="the allocator registered for .*Box returned ndarray, which dlbridge cannot write"):
        add(T(np.ones(3, np.float32)), np.ones(3, np.float32))
    assert ro.tolist() == [0, 0, 0]


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "says"),
    [
        ((3, lambda *a: None), {}, TypeError, "array_type must be a type or a \"module.Name\" string, not int"),
        (("cupy", lambda *a: None), {}, ValueError, "is not a \"module.Name\" string"),
        (("cupy.", lambda *a: None), {}, ValueError, "is not a \"module.Name\" string"),
        ((Box, 42), {}, TypeError, "allocate must be callable, not int"),
        ((Box,), {"finish": "x"}, TypeError, "finish must be callable, not str"),
        ((Box,), {}, TypeError, "give allocate, finish or both"),
    ],
)
def test_a_malformed_registration_is_refused(args, kwargs, error, says):
    with pytest.raises(error, match=r".*") as e:
        dlbridge.register_allocator(*args, **kwargs)
    assert says in str(e.value)


def test_an_unknown_dlpack_producer_still_gets_dlbridge_arrays():
    T = type("Unregistered", (Box,), {})
    out = add(T(np.ones(2, np.float32)), np.ones(2, np.float32))
    assert isinstance(out, dlbridge.Array) and out.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("reuse", ["first input", "second input", "part of an input", "the other output"])
def test_an_allocator_that_recycles_memory_the_call_uses_is_refused_before_the_kernel_writes(reuse):
    T, _ = new_framework()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.arange(12, dtype=np.float32).reshape(3, 4) * 10
    before = (x.copy(), y.copy())
    made = []

    def allocate(shape, dtype, device):
        if reuse == "first input":
            return T(x)
        if reuse == "second input":
            return T(y)
        if reuse == "part of an input":
            return T(y.reshape(-1)[: int(np.prod(shape))].reshape(shape)) if shape == (3, 4) else T(np.empty(shape, dtype))
        made.append(np.empty(shape, dtype))
        return T(made[0])

    dlbridge.register_allocator(T, allocate)
    k = dlbridge.ElementwiseKernel("T a, T b", "T s, T d", "s = a + b; d = a - b", "sum_and_difference")
    with pytest.raises(ValueError) as e:
        k(T(x), y)
    msg = str(e.value)
    assert msg.startswith("sum_and_difference: output s: the allocator registered for ") or msg.startswith(
        "sum_and_difference: output d: the allocator registered for "
    ), msg
    assert "returned memory that overlaps" in msg and "an allocator must return new memory" in msg, msg
    assert np.array_equal(x, before[0]) and np.array_equal(y, before[1]), "the caller's inputs are untouched"


@pytest.mark.parametrize("kind", ["ReductionKernel", "ElementwiseKernel with a leading scalar"])
def test_an_allocator_that_recycles_an_input_is_refused_where_python_code_makes_the_outputs(kind):
    # ReductionKernel (and an ElementwiseKernel whose first argument is a scalar) make their
    # outputs in Python, through the same allocators: the same refusal, before anything is written.
    T, _ = new_framework()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    before = x.copy()
    dlbridge.register_allocator(T, lambda shape, dtype, device: T(x.reshape(-1)[: int(np.prod(shape))].reshape(shape)))
    if kind == "ReductionKernel":
        k = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "recycled_rowsum")
        call, says = (lambda: k(T(x), axis=1)), "recycled_rowsum: output y: the allocator registered for "
    else:
        k = dlbridge.ElementwiseKernel("T s, T x", "T y", "y = s * x", "recycled_scale")
        call, says = (lambda: k(2.0, T(x))), "recycled_scale: output y: the allocator registered for "
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(says) and "returned memory that overlaps argument x" in msg, msg
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("keepdims", [False, True])
def test_a_reduction_writes_a_dlpack_only_frameworks_own_output(keepdims):
    T, seen = new_framework()
    dlbridge.register_allocator(T, lambda shape, dtype, device: seen["allocate"].append(shape) or T(np.empty(shape, dtype)))
    k = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "boxed_rowsum")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = k(T(x), axis=1, keepdims=keepdims)
    assert isinstance(out, T) and seen["allocate"] == [(2, 1) if keepdims else (2,)]
    np.testing.assert_array_equal(out.a, x.sum(1, keepdims=keepdims))


def test_an_output_python_code_cannot_allocate_names_the_kernel_and_output():
    T, _ = new_framework()

    def allocate(shape, dtype, device):
        raise MemoryError("pool exhausted")

    dlbridge.register_allocator(T, allocate)
    k = dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "starved_rowsum")
    with pytest.raises(MemoryError) as e:
        k(T(np.ones((2, 3), np.float32)), axis=1)
    assert e.value.args == ("pool exhausted",)
    assert any("in dlbridge kernel starved_rowsum: output y" in n for n in getattr(e.value, "__notes__", [])), e.value
    with pytest.raises(MemoryError) as e:
        k(_huge_rows(), axis=1)
    assert any("in dlbridge kernel starved_rowsum: output y" in n for n in getattr(e.value, "__notes__", [])), e.value


def _huge_rows():
    """A broadcast view of 2**41 rows of one float: its row sums need 8 TiB, which NumPy cannot allocate."""
    return np.broadcast_to(np.zeros((1, 1), np.float32), (2**41, 1))


@pytest.mark.parametrize(
    "error",
    [KeyError("no such pool"), MemoryError("no room"), MemoryError("pool exhausted", 42), FileNotFoundError(2, "nofile", "f"), ValueError("custom", 42)],
)
def test_an_exception_raised_by_an_allocator_keeps_its_own_arguments(error):
    T, _ = new_framework()

    def allocate(shape, dtype, device):
        raise error

    dlbridge.register_allocator(T, allocate)
    with pytest.raises(type(error)) as e:
        add(T(np.zeros(3, np.float32)), np.zeros(3, np.float32))
    assert e.value is error and e.value.args == error.args
    notes = getattr(e.value, "__notes__", [])
    assert any("in dlbridge kernel add: output out" in n and "allocator registered for" in n for n in notes), notes
