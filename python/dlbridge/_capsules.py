"""Hand-built DLPack capsules and producers (ctypes), for conformance checks and fuzzing.

    t = ManagedTensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    cap = t.capsule()                 # a "dltensor_versioned" PyCapsule, DLPack 1.3
    consumer(cap) ...
    t.release()                       # calls the deleter if no consumer took the capsule
    assert t.deleter_calls == 1

Every field is settable, valid or not (``ndim=-1``, ``shape=[-3]``, ``dtype=(99, 7, 0)``,
``version=(2, 0)``, ``name=b"garbage"``, ``data=None`` ...), so the same builder makes the
well-formed tensors of :func:`dlbridge.testing.check_consumer` and the hostile ones of the
fuzz tests.

Ownership, as DLPack defines it: a consumer that takes the tensor renames the capsule to
``used_dltensor[_versioned]`` and must call the deleter exactly once. This module never
gives its capsules a destructor; it keeps its own reference to each capsule instead, and
:meth:`ManagedTensor.release` plays the capsule destructor (calls the deleter when the name
is still the original one). That keeps every call into Python code out of the consumer's
error paths, where CPython may hold an in-flight exception. The deleter itself is a ctypes
callback: if a consumer calls it with a Python exception set, that exception is lost (a
Python function cannot run with one pending); the deleter notices and records it in
``ManagedTensor.pending_exception`` so a check can report it.

A tensor is kept alive (struct, shape/strides arrays, data buffer) until its deleter has run
and the caller dropped it; a tensor whose deleter never runs is kept for the whole process,
so a consumer that still holds it never reads freed memory.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
from typing import Any, Sequence

READ_ONLY, IS_COPIED, IS_SUBBYTE_TYPE_PADDED = 1, 2, 4

# DLPack 1.3 DLDataTypeCode values
INT, UINT, FLOAT, OPAQUE_HANDLE, BFLOAT, COMPLEX, BOOL = 0, 1, 2, 3, 4, 5, 6


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# Prototypes of our own: `ctypes.pythonapi.PyCapsule_New` is one object shared by every
# module of the process, and others (tvm_ffi, for one) set its argtypes to theirs.
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))

_names: dict[bytes, Any] = {}  # a capsule keeps a pointer to its name: these live forever
_lock = threading.Lock()
_live: dict[int, "ManagedTensor"] = {}  # struct address -> tensor, until its deleter ran
_leaked: list["ManagedTensor"] = []  # deleter never ran (or NULL): kept for the process
_stray: list[int] = []  # deleter calls for addresses not (or no longer) live: double calls


def _static_name(name: bytes | None):
    if name is None:
        return None
    with _lock:
        buf = _names.get(name)
        if buf is None:
            buf = _names[name] = ctypes.create_string_buffer(name)
    return ctypes.addressof(buf)


def _on_delete(addr):
    # A consumer may call this with a Python exception set: the first call below then raises
    # SystemError chained to it (and the consumer's exception is gone: recorded, see above).
    pending = None
    try:
        t = _live.get(addr)
    except SystemError as e:
        pending = repr(e.__cause__ or e.__context__)
        t = _live.get(addr)
    if t is None:
        _stray.append(addr)
        return
    t.deleter_calls += 1
    if pending is not None:
        t.pending_exception = pending
    t.deleter_threads.add(threading.get_ident())
    with _lock:
        _live.pop(addr, None)


_DELETER = DELETER(_on_delete)


def aligned_buffer(nbytes: int, align: int = 256):
    """``(owner, address)``: ``nbytes`` zeroed bytes at an ``align``-aligned address."""
    owner = (ctypes.c_uint8 * (max(int(nbytes), 0) + align))()
    addr = ctypes.addressof(owner)
    return owner, addr + (-addr) % align


def numpy_dtype_code(dtype) -> tuple[int, int, int]:
    """DLPack ``(code, bits, lanes)`` of a NumPy dtype."""
    kind = {"f": FLOAT, "i": INT, "u": UINT, "c": COMPLEX, "b": BOOL}[dtype.kind]
    return (kind, dtype.itemsize * 8, 1)


def span(shape: Sequence[int], strides: Sequence[int] | None, itemsize: int) -> tuple[int, int]:
    """``(lowest, end)`` byte offsets a layout touches, relative to ``data + byte_offset``
    (``(0, 0)`` for zero elements); strides ``None`` means compact row-major."""
    if any(d == 0 for d in shape):
        return 0, 0
    if strides is None:
        return 0, math.prod(shape) * itemsize
    lo = sum((d - 1) * s for d, s in zip(shape, strides) if s < 0)
    hi = sum((d - 1) * s for d, s in zip(shape, strides) if s > 0)
    return lo * itemsize, (hi + 1) * itemsize


_ids = itertools.count(1)


class ManagedTensor:
    """One hand-built ``DLManagedTensor[Versioned]`` and its capsule; every field is free."""

    def __init__(
        self,
        *,
        data: int | None = None,
        keep: Any = None,
        shape: Sequence[int] | None = (),
        strides: Sequence[int] | None = None,
        ndim: int | None = None,
        dtype: tuple[int, int, int] = (FLOAT, 32, 1),
        device: tuple[int, int] = (1, 0),
        byte_offset: int = 0,
        versioned: bool = True,
        version: tuple[int, int] = (1, 3),
        flags: int = 0,
        deleter: bool = True,
        name: bytes | None = None,
        null_name: bool = False,
        shape_alloc: int | None = None,
    ):
        """``data`` is an address (``keep`` is whatever owns that memory); ``shape``/``strides``
        ``None`` are NULL pointers; ``ndim`` defaults to ``len(shape)``; when ``ndim`` exceeds
        the entries given, the shape/strides arrays are padded with 1s up to
        ``shape_alloc`` entries (default ``min(ndim, 1024)``), so a consumer that reads them
        before refusing ``ndim`` reads memory that exists. ``name`` defaults to
        ``dltensor_versioned`` / ``dltensor``; ``null_name`` makes a capsule with a NULL name."""
        self.id = next(_ids)
        self.versioned = versioned
        self.deleter_calls = 0
        self.deleter_threads: set[int] = set()
        self.pending_exception: str | None = None
        self.has_deleter = deleter
        self._keep = [keep]
        nd = len(shape) if ndim is None and shape is not None else (ndim or 0)
        alloc = shape_alloc if shape_alloc is not None else min(max(nd, 0), 1024)

        def array(values):
            if values is None:
                return None
            values = list(values)
            n = max(alloc, len(values))
            arr = (ctypes.c_int64 * max(n, 1))(*(values + [1] * (n - len(values))))
            self._keep.append(arr)
            return ctypes.addressof(arr)

        if versioned:
            m = DLManagedTensorVersioned()
            m.version = DLPackVersion(*version)
            m.flags = flags
        else:
            m = DLManagedTensor()
        m.manager_ctx = self.id
        if deleter:
            m.deleter = _DELETER
        t = m.dl_tensor
        t.data = data
        t.device = DLDevice(*device)
        t.ndim = nd
        t.dtype = DLDataType(*dtype)
        t.shape = array(shape)
        t.strides = array(strides)
        t.byte_offset = byte_offset
        self.struct = m
        self.address = ctypes.addressof(m)
        self.name = None if null_name else name if name is not None else (b"dltensor_versioned" if versioned else b"dltensor")
        self._capsule = None
        self._released = False

    @classmethod
    def from_numpy(cls, arr, *, base=None, **kw) -> "ManagedTensor":
        """A tensor describing NumPy array ``arr`` (zero copy; ``arr`` kept alive): its shape,
        strides in elements, dtype and data pointer; keywords override any field."""
        item = arr.dtype.itemsize
        fields = dict(
            data=arr.__array_interface__["data"][0] or None,
            keep=arr if base is None else (arr, base),
            shape=list(arr.shape),
            strides=[s // item for s in arr.strides],
            dtype=numpy_dtype_code(arr.dtype),
        )
        fields.update(kw)
        return cls(**fields)

    def capsule(self):
        """The capsule (the same object on every call); registers the tensor as live."""
        if self._capsule is None:
            with _lock:
                _live[self.address] = self
            self._capsule = _capsule_new(self.address, _static_name(self.name), None)
        return self._capsule

    @property
    def capsule_name(self) -> bytes | None:
        return None if self._capsule is None else _capsule_name(self._capsule)

    @property
    def consumed(self) -> bool:
        """A consumer took ownership: the capsule was renamed."""
        return self._capsule is not None and self.capsule_name != self.name

    def release(self) -> None:
        """Plays the capsule destructor: calls the deleter if no consumer renamed the capsule,
        and drops this module's capsule reference. Idempotent."""
        if self._released or self._capsule is None:
            return
        self._released = True
        if not self.consumed and self.has_deleter:
            self.struct.deleter(self.address)
        if self.has_deleter and self.deleter_calls == 0:
            with _lock:
                _leaked.append(self)  # a consumer owns it and never released it: keep the memory
        elif not self.has_deleter:
            with _lock:
                _leaked.append(self)  # nobody can tell when a NULL-deleter tensor is free

    def __repr__(self) -> str:
        t = self.struct.dl_tensor
        return (f"ManagedTensor(#{self.id} {self.name!r} ndim={t.ndim} dtype=({t.dtype.code},{t.dtype.bits},"
                f"{t.dtype.lanes}) device=({t.device.device_type},{t.device.device_id}) deleter_calls={self.deleter_calls})")


def stray_deleter_calls() -> int:
    """Deleter calls for tensors that were not live (already deleted: a double call)."""
    return len(_stray)


class Producer:
    """An object with ``__dlpack__``/``__dlpack_device__`` answering with hand-built capsules.

    ``make(versioned: bool) -> ManagedTensor`` builds one tensor per ``__dlpack__`` call.
    ``answer``: ``"auto"`` (versioned iff ``max_version >= (1, 0)`` was passed, as the standard
    says), ``"legacy"`` (always ``dltensor``) or ``"versioned"`` (always, even unasked).
    ``calls`` records the keyword arguments of every ``__dlpack__`` call; ``tensors`` every
    tensor handed out. ``read_only=True``: asked for a legacy capsule, it raises BufferError
    (a legacy capsule cannot say READ_ONLY), as the standard requires of read-only data.
    """

    def __init__(self, make, *, device=(1, 0), answer: str = "auto", read_only: bool = False):
        self.make = make
        self.device = device
        self.answer = answer
        self.read_only = read_only
        self.calls: list[dict] = []
        self.tensors: list[ManagedTensor] = []

    def _capsule(self, max_version):
        versioned = self.answer == "versioned" or (
            self.answer == "auto" and max_version is not None and tuple(max_version) >= (1, 0)
        )
        if self.read_only and not versioned:
            raise BufferError("read-only data cannot be exported as a legacy (dltensor) capsule")
        t = self.make(versioned)
        self.tensors.append(t)
        return t.capsule()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy})
        return self._capsule(max_version)

    def __dlpack_device__(self):
        return self.device

    def release(self) -> None:
        for t in self.tensors:
            t.release()


class Producer2022(Producer):
    """Written to the 2022 array API: ``__dlpack__(self, *, stream=None)``, legacy capsules;
    passing ``max_version`` is a ``TypeError``."""

    def __dlpack__(self, *, stream=None):  # type: ignore[override]
        self.calls.append({"stream": stream})
        return self._capsule(None)
