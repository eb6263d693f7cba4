"""dlbridge.Array as a DLPack producer and consumer, and the buffer protocol."""

import array
import threading
import time

import numpy as np
import pytest
import torch

import dlbridge
from dlbridge import _dlbridge

from conftest import on_threads


def test_torch_and_numpy_take_an_array_with_zero_copies():
    a = dlbridge.arange(6, "f32")
    t = torch.from_dlpack(a)
    assert t.data_ptr() == a.data_ptr and t.tolist() == [0, 1, 2, 3, 4, 5]
    n = np.from_dlpack(a)
    assert n.__array_interface__["data"][0] == a.data_ptr
    m = memoryview(a)
    assert m.format == "f" and m.shape == (6,) and not m.readonly
    t[0] = 10.0  # shared memory
    assert n[0] == 10.0


def test_from_dlpack_and_asarray_import_with_zero_copies():
    t = torch.arange(10.0).reshape(2, 5)[:, ::2]
    a = dlbridge.from_dlpack(t)
    assert a.data_ptr == t.data_ptr() and a.shape == (2, 3) and a.element_strides == (5, 2) and a.strides == (20, 8)
    assert a.tolist() == t.tolist()
    n = np.arange(6, dtype=np.int16)
    b = dlbridge.asarray(n)
    assert b.data_ptr == n.__array_interface__["data"][0] and b.dtype == "i16"
    ro = dlbridge.asarray(b"abcd")
    assert ro.readonly and ro.dtype == "u8"
    rw = dlbridge.asarray(bytearray(4))
    assert not rw.readonly
    f = dlbridge.asarray(array.array("d", [1.5, 2.5]))
    assert f.dtype == "f64" and f.tolist() == [1.5, 2.5]


def test_producer_is_dropped_before_the_consumer():
    t = torch.arange(5.0)
    a = dlbridge.from_dlpack(t)
    del t
    assert a.tolist() == [0, 1, 2, 3, 4]
    arr = dlbridge.arange(4, "i32")
    n = np.from_dlpack(arr)
    del arr
    assert n.tolist() == [0, 1, 2, 3]


def test_dlpack_protocol_arguments():
    a = dlbridge.arange(3, "f64")
    assert _dlbridge.inspect_capsule(a.__dlpack__())["name"] == "dltensor"  # max_version None: legacy
    info = _dlbridge.inspect_capsule(a.__dlpack__(max_version=(1, 0)))
    assert info["name"] == "dltensor_versioned" and info["version"][0] == 1 and info["flags"] == 0
    assert info["strides"] == [1]
    copied = _dlbridge.inspect_capsule(a.__dlpack__(max_version=(1, 3), copy=True))
    assert copied["flags"] & 2 and copied["data"] != a.data_ptr  # IS_COPIED, a real copy
    assert _dlbridge.inspect_capsule(a.__dlpack__(max_version=(1, 3), copy=False))["data"] == a.data_ptr
    assert a.__dlpack_device__() == (dlbridge.DLDeviceType.kDLCPU, 0)
    assert isinstance(a.__dlpack_device__()[0], dlbridge.DLDeviceType)
    assert a.__dlpack__(dl_device=(1, 0), max_version=(1, 3)) is not None
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(2, 0))
    with pytest.raises(ValueError, match="stream must be None"):
        a.__dlpack__(stream=1)
    with pytest.raises(TypeError):
        a.__dlpack__(1)  # keyword-only


def test_read_only_arrays_stay_read_only_everywhere():
    ro = dlbridge.asarray(b"\x00\x01")
    with pytest.raises(BufferError):
        ro.__dlpack__()  # legacy capsules cannot carry READ_ONLY
    assert _dlbridge.inspect_capsule(ro.__dlpack__(max_version=(1, 3)))["flags"] & 1
    assert memoryview(ro).readonly
    with pytest.raises(BufferError):
        dlbridge.get_kernel("add")(ro, ro, out=ro)


def test_buffer_protocol_of_strided_arrays_and_unsupported_dtypes():
    t = dlbridge.from_dlpack(torch.arange(12.0, dtype=torch.float64).reshape(3, 4)).T
    m = memoryview(t)
    assert m.shape == (4, 3) and m.strides == (8, 32) and m.tolist()[0] == [0.0, 4.0, 8.0]
    bf = dlbridge.zeros([2], "bf16")
    with pytest.raises(BufferError, match="bf16"):
        memoryview(bf)
    assert torch.from_dlpack(bf).dtype == torch.bfloat16


def test_many_threads_calling_kernels_concurrently():
    a = torch.rand(200, 200)
    expect = a @ a

    def work():
        for _ in range(5):
            torch.testing.assert_close(dlbridge.get_kernel("matmul")(a, a), expect, rtol=1e-4, atol=1e-4)

    on_threads(work, 4)


def test_the_gil_is_released_while_a_large_kernel_runs():
    a = torch.rand(1500, 1500)
    k = dlbridge.get_kernel("matmul")
    t0 = time.perf_counter()
    k(a, a)
    duration = time.perf_counter() - t0
    started = threading.Event()
    done = threading.Event()

    def run():
        started.set()
        k(a, a)
        done.set()

    th = threading.Thread(target=run)
    th.start()
    started.wait()
    gaps, last = [], time.perf_counter()
    while not done.is_set():
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    th.join()
    # Holding the GIL would stall this loop for the whole kernel.
    assert max(gaps) < duration / 2, (max(gaps), duration)


def test_from_dlpack_copy_false_asks_the_producer_and_refuses_a_copy():
    from dlbridge import _capsules as caps
    from dlbridge.testing import _f32

    # copy=False reaches the producer's __dlpack__ as it is.
    p = caps.Producer(_f32([1, 2, 3], shape=[3]))
    a = dlbridge.from_dlpack(p, copy=False)
    assert a.tolist() == [1.0, 2.0, 3.0] and a.data_ptr == p.tensors[0].base
    assert p.calls[-1]["copy"] is False
    # A producer that can only export a copy (IS_COPIED) is refused, and its copy freed.
    copier = caps.Producer(_f32([1, 2, 3], shape=[3], flags=2))
    with pytest.raises(ValueError, match=r"from_dlpack\(copy=False\): Producer.__dlpack__ exported a copy \(DLPack IS_COPIED\)"):
        dlbridge.from_dlpack(copier, copy=False)
    assert copier.calls[-1]["copy"] is False and copier.tensors[0].deleter_calls == 1
    # copy=None takes the producer's answer as it comes; a 2022 producer (no copy
    # keyword) is zero copy by that standard, so copy=False holds for it too.
    old = caps.Producer2022(_f32([4, 5], shape=[2]))
    assert dlbridge.from_dlpack(old, copy=False).tolist() == [4.0, 5.0]
    del a
    p.release()
    copier.release()
    old.release()


def test_hand_built_capsules_survive_another_module_retyping_ctypes_pythonapi():
    import ctypes

    from dlbridge import _capsules

    f = ctypes.pythonapi.PyCapsule_New
    saved = f.argtypes
    f.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]  # what tvm_ffi sets
    try:
        from dlbridge.testing import _f32

        p = _capsules.Producer(_f32([1, 2, 3], shape=[3]))
        assert dlbridge.from_dlpack(p).tolist() == [1.0, 2.0, 3.0]
    finally:
        f.argtypes = saved
