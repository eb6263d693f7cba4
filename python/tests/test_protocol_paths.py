"""The import paths honour what the producer says, at every call size.

- a hand-built DLPack C exchange API (ctypes) whose tensors are READ_ONLY:
  written arguments must come in through the owning path that carries flags;
- a producer written to the 2022 standard (``__dlpack__(self, *, stream=None)``);
- ``__dlpack__`` answering with a legacy capsule: read-only for writing, while a
  bare legacy capsule the caller made stays writable;
- ``from_dlpack(x, /, *, device=None, copy=None)`` as the array API standard says.
"""

import ctypes
import gc

import numpy as np
import pytest
import torch

import dlbridge

add = dlbridge.get_kernel("add")
axpy = dlbridge.get_kernel("axpy")

# ---- a fake producer with the DLPack C exchange API ---------------------------------


from dlbridge._capsules import DELETER, DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion, DLTensor  # noqa: E402

FROM_PY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
BORROW = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(DLTensor))
STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


class ExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("prev_api", ctypes.c_void_p),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", FROM_PY),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", BORROW),
        ("current_work_stream", STREAM),
    ]


_live = {}  # address of a managed struct -> (struct, shape array): kept alive until deleted
deleted = []


def _obj(ptr):
    return ctypes.cast(ptr, ctypes.py_object).value


def _fill(t: DLTensor, arr: np.ndarray, shape):
    t.data = arr.ctypes.data
    t.device = DLDevice(1, 0)
    t.ndim = arr.ndim
    t.dtype = DLDataType(2, 32, 1)
    t.shape = ctypes.addressof(shape)
    t.strides = None
    t.byte_offset = 0


@DELETER
def _deleter(addr):
    _live.pop(addr, None)
    deleted.append(addr)


@FROM_PY
def _from_py(obj, out):
    fake = _obj(obj)
    m = DLManagedTensorVersioned()
    shape = (ctypes.c_int64 * fake.arr.ndim)(*fake.arr.shape)
    m.version = DLPackVersion(1, 3)
    m.deleter = _deleter
    m.flags = 1 if fake.read_only else 0  # READ_ONLY
    _fill(m.dl_tensor, fake.arr, shape)
    _live[ctypes.addressof(m)] = (m, shape)
    out[0] = ctypes.addressof(m)
    return 0


@BORROW
def _borrow(obj, out):
    fake = _obj(obj)
    _fill(out.contents, fake.arr, fake.shape)
    return 0


@STREAM
def _stream(device_type, device_id, out):
    out[0] = None
    return 0


_API = ExchangeAPI(1, 3, None, None, _from_py, None, _borrow, _stream)
ctypes.pythonapi.PyCapsule_New.restype = ctypes.py_object
ctypes.pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


_API_NAME = ctypes.create_string_buffer(b"dlpack_exchange_api")  # a capsule keeps a pointer to its name


class FakeTensor:
    """A producer whose only import path is the exchange API (no __dlpack__)."""

    __dlpack_c_exchange_api__ = ctypes.pythonapi.PyCapsule_New(ctypes.addressof(_API), ctypes.addressof(_API_NAME), None)

    def __init__(self, arr: np.ndarray, read_only: bool):
        self.arr = arr
        self.read_only = read_only
        self.shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)


@pytest.mark.parametrize("n", [1, 7, 1 << 16])
def test_exchange_api_read_only_output_is_refused_at_every_size(n):
    x, y = np.ones(n, np.float32), np.ones(n, np.float32)
    target = np.zeros(n, np.float32)
    before = len(deleted)
    with pytest.raises(BufferError, match="read-only"):
        add(x, y, out=FakeTensor(target, read_only=True))
    with pytest.raises(BufferError, match="read-only"):
        add(x, y, FakeTensor(target, read_only=True))  # destination-passing
    with pytest.raises(BufferError, match="read-only"):
        axpy(2.0, x, FakeTensor(target, read_only=True))  # `mut` argument
    assert not target.any(), "a READ_ONLY tensor was written"
    gc.collect()
    assert len(deleted) - before == 3, "every imported tensor is released exactly once"
    assert not _live


@pytest.mark.parametrize("n", [1, 1 << 16])
def test_exchange_api_writable_output_is_written_and_read_only_input_is_read(n):
    x = FakeTensor(np.full(n, 2, np.float32), read_only=True)  # read: allowed
    target = np.zeros(n, np.float32)
    add(x, np.ones(n, np.float32), out=FakeTensor(target, read_only=False))
    np.testing.assert_array_equal(target, 3)
    gc.collect()
    assert not _live


# ---- producers that answer with legacy capsules ------------------------------------


class Producer2022:
    """Written to the 2022 array API: no max_version keyword."""

    def __init__(self, t: torch.Tensor):
        self.t = t
        self.calls = []

    def __dlpack__(self, *, stream=None):
        self.calls.append(stream)
        return torch.utils.dlpack.to_dlpack(self.t)

    def __dlpack_device__(self):
        return (1, 0)


class LegacyAnswer:
    """Takes max_version but still answers with a legacy capsule (as JAX does)."""

    def __init__(self, t: torch.Tensor):
        self.t = t

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return torch.utils.dlpack.to_dlpack(self.t)

    def __dlpack_device__(self):
        return (1, 0)


def test_a_2022_producer_is_read_through_the_legacy_call():
    t = torch.arange(6, dtype=torch.float32)
    p = Producer2022(t)
    a = dlbridge.from_dlpack(p)
    assert a.data_ptr == t.data_ptr()
    assert p.calls == [None]
    out = add(Producer2022(t), Producer2022(t))
    np.testing.assert_array_equal(np.asarray(out), (2 * t).numpy())


@pytest.mark.parametrize("producer", [Producer2022, LegacyAnswer])
@pytest.mark.parametrize("n", [1, 1 << 16])
def test_legacy_answer_from_a_producer_is_never_written(producer, n):
    t = torch.zeros(n)
    x = torch.ones(n)
    for call in (lambda: add(x, x, out=producer(t)), lambda: add(x, x, producer(t)), lambda: axpy(1.0, x, producer(t))):
        with pytest.raises(BufferError, match="legacy DLPack capsules"):
            call()
    assert not t.any()
    assert dlbridge.from_dlpack(producer(t)).readonly


@pytest.mark.parametrize("n", [1, 1 << 16])
def test_a_bare_legacy_capsule_from_the_caller_stays_writable(n):
    t = torch.zeros(n)
    x = torch.ones(n)
    add(x, x, out=torch.utils.dlpack.to_dlpack(t))
    assert (t == 2).all()
    f = dlbridge.convert_func(add, torch.Tensor, torch.utils.dlpack.to_dlpack)
    z = torch.zeros(n)
    f(x, x, z)  # TVM style: every tensor, the output too, goes in as a capsule
    assert (z == 2).all()


def test_convert_func_torch_in_torch_out():
    matmul = dlbridge.get_kernel("matmul")
    f = dlbridge.convert_func(matmul, torch.Tensor, torch.utils.dlpack.to_dlpack)
    x, y = torch.rand(5, 3), torch.rand(3, 4)
    z = torch.empty(5, 4)
    assert f(x, y, z) is not None
    torch.testing.assert_close(z, x @ y)


def test_a_consumed_capsule_is_refused_not_reused():
    cap = torch.utils.dlpack.to_dlpack(torch.ones(3))
    dlbridge.from_dlpack(cap)
    with pytest.raises(ValueError, match="already consumed"):
        dlbridge.from_dlpack(cap)


class NotACapsule:
    def __dlpack__(self, **kwargs):
        return 42

    def __dlpack_device__(self):
        return (1, 0)


def test_dlpack_returning_a_non_capsule_says_so():
    with pytest.raises(TypeError, match=r"NotACapsule.__dlpack__\(\) returned int, not a DLPack capsule"):
        dlbridge.from_dlpack(NotACapsule())
    with pytest.raises(TypeError, match="not a DLPack capsule"):
        add(NotACapsule(), NotACapsule())


# ---- from_dlpack(x, /, *, device=None, copy=None) --------------------------------------


def test_from_dlpack_copy_none_and_false_share_memory():
    x = np.arange(6, dtype=np.float32)
    assert dlbridge.from_dlpack(x).data_ptr == x.ctypes.data
    assert dlbridge.from_dlpack(x, copy=False).data_ptr == x.ctypes.data
    assert dlbridge.from_dlpack(x, device="cpu").data_ptr == x.ctypes.data
    assert dlbridge.from_dlpack(x, device=(1, 0), copy=False).data_ptr == x.ctypes.data


@pytest.mark.parametrize("make", [
    lambda: np.arange(6, dtype=np.float32),
    lambda: torch.arange(6, dtype=torch.float32),
    lambda: np.arange(6, dtype=np.float32)[::2],
])
def test_from_dlpack_copy_true_is_new_writable_and_independent(make):
    x = make()
    a = dlbridge.from_dlpack(x, copy=True)
    src_ptr = x.data_ptr() if isinstance(x, torch.Tensor) else x.ctypes.data
    assert a.data_ptr != src_ptr
    assert not a.readonly
    before = np.asarray(a).copy()
    x[...] = -1
    np.testing.assert_array_equal(np.asarray(a), before)


def test_from_dlpack_copy_true_of_a_read_only_source_is_writable():
    x = np.arange(4, dtype=np.float32)
    x.flags.writeable = False
    assert dlbridge.from_dlpack(x).readonly
    a = dlbridge.from_dlpack(x, copy=True)
    assert not a.readonly
    add(a, a, out=a)
    np.testing.assert_array_equal(np.asarray(a), 2 * x)


def test_from_dlpack_refuses_devices_it_cannot_serve():
    x = np.arange(4, dtype=np.float32)
    with pytest.raises(BufferError, match="device"):
        dlbridge.from_dlpack(x, device=(2, 0))
    with pytest.raises(BufferError, match="device"):
        dlbridge.from_dlpack(x, device="cuda")


def test_from_dlpack_is_positional_only_for_x():
    with pytest.raises(TypeError):
        dlbridge.from_dlpack(x=np.ones(2))
