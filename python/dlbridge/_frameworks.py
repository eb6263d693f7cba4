"""The frameworks whose outputs are Python functions: CuPy and JAX, registered
with :func:`dlbridge.register_allocator` as any other framework would be.

Both are named by string, so registering imports neither: the names are
looked up once a call's first argument is of a type not seen before.
(NumPy and torch are served in Rust, from the same table.)
"""

from __future__ import annotations

from typing import Any

from . import _dlbridge
from ._device import DLDeviceType


def _cupy_allocate(shape: tuple[int, ...], dtype: str, device: tuple[int, int]) -> Any:
    """``cupy.empty`` on the inputs' device, so CuPy's memory pool serves it."""
    import cupy

    if device[0] != DLDeviceType.kDLCUDA:
        return None
    try:
        dt = cupy.dtype(dtype)
    except TypeError:  # a dtype CuPy lacks (bfloat16, float8): a dlbridge.Array
        return None
    with cupy.cuda.Device(device[1]):
        return cupy.empty(shape, dt)


def _cupy_stream(device: tuple[int, int]) -> int:
    """CuPy's current stream on the device (0: the legacy default stream)."""
    import cupy

    return int(cupy.cuda.get_current_stream(device[1]).ptr)


def _jax_finish(array: Any) -> Any:
    """A ``jax.Array`` of the memory the kernel wrote, zero copy (JAX arrays
    are immutable, so dlbridge allocates and JAX takes the buffer over)."""
    import jax

    return jax.dlpack.from_dlpack(array)


def install() -> None:
    _dlbridge.register_allocator("cupy.ndarray", _cupy_allocate, stream=_cupy_stream)
    _dlbridge.register_allocator("jax.Array", finish=_jax_finish)
