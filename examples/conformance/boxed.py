"""A small array library to check with `dlbridge conformance --producer`: `Boxed`
exports NumPy memory through `__dlpack__`, as a library wrapping another one would.

    .venv/bin/python -m dlbridge.testing --producer boxed:make --read-only boxed:make_read_only --consumer boxed:from_dlpack
    (run in examples/conformance, so that `boxed` is importable)
"""

from __future__ import annotations

import numpy as np

NUMPY = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "u8": np.uint8}


class Boxed:
    """An array: NumPy memory, exported as it is."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    def __dlpack__(self, **kwargs):
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.data.__dlpack_device__()


def make(shape: tuple, dtype: str) -> Boxed:
    """A new array of `shape` and dlbridge's `dtype` ("f32", "i64", ...)."""
    return Boxed(np.zeros(shape, NUMPY[dtype]))


def make_read_only(shape: tuple, dtype: str) -> Boxed:
    a = np.zeros(shape, NUMPY[dtype])
    a.flags.writeable = False
    return Boxed(a)


class Careless(Boxed):
    """The same array with a bug: it ignores every request and exports a legacy capsule."""

    def __dlpack__(self, **kwargs):
        return self.data.__dlpack__()


def make_careless(shape: tuple, dtype: str) -> Careless:
    return Careless(np.zeros(shape, NUMPY[dtype]))


def from_dlpack(x) -> Boxed:
    """A consumer: any DLPack producer's memory as a `Boxed`, zero copy (NumPy imports it)."""
    return Boxed(np.from_dlpack(x))


def from_dlpack_copying(x) -> Boxed:
    """The same consumer with a bug: it copies (and the copy is writable)."""
    return Boxed(np.array(np.from_dlpack(x)))
