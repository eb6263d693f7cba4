"""`dlbridge.Array.__dlpack_c_exchange_api__`: the DLPack C exchange
API, called from C (ctypes) as a consumer would, and by tvm-ffi, a consumer we
did not write. Every entry point is zero copy, keeps READ_ONLY, and reports bad
input as the spec says (-1 with a Python exception, or SetError)."""

import ctypes

import numpy as np
import pytest

import dlbridge
import dlbridge.cuda
from dlbridge._capsules import DELETER, DLManagedTensorVersioned, DLTensor

# Consumers call with the GIL held (the spec): PYFUNCTYPE keeps it, and raises the
# exception a failing call set.
FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.POINTER(DLManagedTensorVersioned)))
TO_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLManagedTensorVersioned), ctypes.POINTER(ctypes.py_object))
BORROW = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))
STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))
SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
ALLOC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(ctypes.POINTER(DLManagedTensorVersioned)), ctypes.c_void_p, SET_ERROR)


class ExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("prev_api", ctypes.c_void_p),
        ("managed_tensor_allocator", ALLOC),
        ("managed_tensor_from_py_object_no_sync", FROM_PY),
        ("managed_tensor_to_py_object_no_sync", TO_PY),
        ("dltensor_from_py_object_no_sync", BORROW),
        ("current_work_stream", STREAM),
    ]


def api() -> ExchangeAPI:
    cap = dlbridge.Array.__dlpack_c_exchange_api__
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return ExchangeAPI.from_address(get(cap, b"dlpack_exchange_api"))


def test_the_table_is_on_the_type_and_names_dlpack_1_3():
    a = api()
    assert (a.major, a.minor) == (1, 3) and not a.prev_api
    assert type(dlbridge.asarray(np.ones(2))).__dlpack_c_exchange_api__ is dlbridge.Array.__dlpack_c_exchange_api__


def test_owning_export_is_zero_copy_and_keeps_read_only():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    arr = dlbridge.asarray(x)
    out = ctypes.POINTER(DLManagedTensorVersioned)()
    assert api().managed_tensor_from_py_object_no_sync(arr, ctypes.byref(out)) == 0
    m = out.contents
    assert m.dl_tensor.data == x.ctypes.data and m.dl_tensor.ndim == 2
    assert list((ctypes.c_int64 * 2).from_address(m.dl_tensor.shape)) == [2, 3]
    assert m.flags & 1 == 0
    m.deleter(ctypes.addressof(m))  # the consumer owns it
    ro = dlbridge.asarray(np.frombuffer(bytes(8), np.float32))
    assert api().managed_tensor_from_py_object_no_sync(ro, ctypes.byref(out)) == 0
    assert out.contents.flags & 1 == 1  # READ_ONLY
    out.contents.deleter(ctypes.addressof(out.contents))


def test_borrow_is_zero_copy_and_refuses_read_only_arrays():
    x = np.arange(4, dtype=np.int64)
    arr = dlbridge.asarray(x)
    t = DLTensor()
    assert api().dltensor_from_py_object_no_sync(arr, ctypes.byref(t)) == 0
    assert t.data == x.ctypes.data and t.ndim == 1
    assert ctypes.c_int64.from_address(t.shape).value == 4 and ctypes.c_int64.from_address(t.strides).value == 1
    assert (t.dtype.code, t.dtype.bits) == (0, 64)
    ro = dlbridge.asarray(np.frombuffer(bytes(8), np.float32))
    with pytest.raises(BufferError, match="read-only"):  # ctypes re-raises the exception the callee set
        api().dltensor_from_py_object_no_sync(ro, ctypes.byref(t))


def test_objects_of_another_type_are_a_type_error_not_a_crash():
    out = ctypes.POINTER(DLManagedTensorVersioned)()
    with pytest.raises(TypeError, match="expected a dlbridge.Array, got ndarray"):
        api().managed_tensor_from_py_object_no_sync(np.ones(2), ctypes.byref(out))
    with pytest.raises(TypeError, match="got int"):
        api().dltensor_from_py_object_no_sync(3, ctypes.byref(DLTensor()))


def test_allocator_and_to_py_object_round_trip_to_a_dlbridge_array():
    shape = (ctypes.c_int64 * 2)(3, 5)
    proto = DLTensor()
    proto.ndim, proto.shape = 2, ctypes.addressof(shape)
    proto.dtype.code, proto.dtype.bits, proto.dtype.lanes = 2, 32, 1
    proto.device.device_type, proto.device.device_id = 1, 0
    errors = []
    on_error = SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
    out = ctypes.POINTER(DLManagedTensorVersioned)()
    assert api().managed_tensor_allocator(ctypes.byref(proto), ctypes.byref(out), None, on_error) == 0 and not errors
    data = out.contents.dl_tensor.data
    obj = ctypes.py_object()
    assert api().managed_tensor_to_py_object_no_sync(out, ctypes.byref(obj)) == 0
    arr = obj.value
    assert isinstance(arr, dlbridge.Array) and arr.shape == (3, 5) and arr.dtype == "f32"
    assert np.from_dlpack(arr).ctypes.data == data  # the allocation itself, no copy
    assert not np.from_dlpack(arr).any()

    proto.device.device_type = 10  # ROCm: dlbridge.Array holds host or CUDA memory
    assert api().managed_tensor_allocator(ctypes.byref(proto), ctypes.byref(out), None, on_error) == -1
    assert not out and errors == [(b"BufferError", b"dlbridge.Array allocator: dlbridge.Array allocates host or CUDA memory, not rocm:0")]
    if not dlbridge.cuda.is_available():
        # CUDA: from the device's pool, so without a driver an error that says why.
        proto.device.device_type = 2
        assert api().managed_tensor_allocator(ctypes.byref(proto), ctypes.byref(out), None, on_error) == -1
        assert not out and errors[-1][0] == b"BufferError" and b"cuda:0" in errors[-1][1], errors
        assert dlbridge.cuda.unavailable_reason().encode()[:20] in errors[-1][1], errors


def test_to_py_object_refuses_device_memory_and_runs_its_deleter():
    # A ROCm tensor handed to the Array (host or CUDA memory): refused, and (ownership passed) deleted.
    deleted = []
    keep = np.ones(2, np.float32)
    shape = (ctypes.c_int64 * 1)(2)
    m = DLManagedTensorVersioned()
    m.version.major, m.version.minor = 1, 3
    m.deleter = DELETER(lambda addr: deleted.append(addr))
    m.dl_tensor.data, m.dl_tensor.ndim, m.dl_tensor.shape = keep.ctypes.data, 1, ctypes.addressof(shape)
    m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 2, 32, 1
    m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = 10, 0
    obj = ctypes.py_object()
    with pytest.raises(BufferError, match="rocm:0"):
        api().managed_tensor_to_py_object_no_sync(ctypes.pointer(m), ctypes.byref(obj))
    assert deleted == [ctypes.addressof(m)]


def test_a_cuda_tensor_is_held_with_zero_copies_and_deleted_once():
    # CUDA memory (never touched here: no host read happens) becomes a CUDA dlbridge.Array.
    deleted = []
    shape = (ctypes.c_int64 * 2)(2, 3)
    m = DLManagedTensorVersioned()
    m.version.major, m.version.minor = 1, 3
    m.deleter = DELETER(lambda addr: deleted.append(addr))
    m.dl_tensor.data, m.dl_tensor.ndim, m.dl_tensor.shape = 0x7F0000001000, 2, ctypes.addressof(shape)
    m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 2, 32, 1
    m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = 2, 0
    obj = ctypes.py_object()
    assert api().managed_tensor_to_py_object_no_sync(ctypes.pointer(m), ctypes.byref(obj)) == 0
    arr = obj.value
    ctypes.pythonapi.Py_DecRef(obj)  # the new reference the API wrote: ours now (ctypes won't drop it)
    del obj
    assert (arr.device, arr.shape, arr.data_ptr) == ("cuda:0", (2, 3), 0x7F0000001000)
    assert arr.T.data_ptr == 0x7F0000001000 and arr.__dlpack_device__() == (dlbridge.DLDeviceType.kDLCUDA, 0)
    with pytest.raises(BufferError, match="cuda:0 has no buffer protocol"):
        memoryview(arr)
    assert deleted == []
    del arr
    assert deleted == [ctypes.addressof(m)]


def test_stream_is_null_for_host_memory():
    s = ctypes.c_void_p(1234)
    assert api().current_work_stream(1, 0, ctypes.byref(s)) == 0 and s.value is None


def test_tvm_ffi_imports_an_array_through_it_with_zero_copies():
    tvm_ffi = pytest.importorskip("tvm_ffi")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    arr = dlbridge.asarray(x)
    t = tvm_ffi.from_dlpack(arr)
    assert tuple(t.shape) == (2, 3)
    assert np.from_dlpack(t).ctypes.data == x.ctypes.data
