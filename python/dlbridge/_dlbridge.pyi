"""Type stubs for the dlbridge extension module."""

from typing import Any, Callable, Sequence

from ._device import DLDeviceType

__version__: str

class Array:
    """dlbridge's own n-dimensional array: CPU memory, any DLPack dtype.

    Exchanges memory with zero copies through ``__dlpack__`` and the buffer protocol.
    """

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements (DLPack convention), not bytes."""
    @property
    def dtype(self) -> str:
        """``f32``, ``f64``, ``f16``, ``bf16``, ``i8`` ... ``u64``, ``bool``, ``c64``, ``c128``, ``f8_e4m3fn``, ..."""
    @property
    def ndim(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def T(self) -> Array:
        """The transpose of a 2-d array (a view sharing memory)."""
    def contiguous(self) -> Array: ...
    def tolist(self) -> Any:
        """Nested lists (a scalar for a 0-d array): ``bool``, ``int`` (any integer width,
        sub-byte too), ``float`` (f16, bf16, f32, f64 and the float8/6/4 families, decoded
        exactly) or ``complex``. Vector and opaque-handle dtypes raise TypeError; a result
        too large for memory raises MemoryError."""
    def __len__(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: int | Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[DLDeviceType, int]: ...
    def __buffer__(self, flags: int, /) -> memoryview:
        """PEP 3118 export, zero copy. BufferError for a C-/F-/ANY-contiguous request the
        layout does not meet, a request without PyBUF_STRIDES on a non-C-contiguous layout,
        PyBUF_WRITABLE on a read-only array, and dtypes with no struct format (bf16, float8, ...)."""

class Kernel:
    """A registry kernel. Call it on torch tensors, NumPy arrays, dlbridge Arrays,
    any DLPack producer or buffer; outputs come back in the first tensor's framework."""

    @property
    def name(self) -> str: ...
    @property
    def signature(self) -> str: ...
    @property
    def doc(self) -> str: ...
    @property
    def devices(self) -> list[str]: ...
    def prepare_outputs(self, *args: Any) -> list[tuple[list[int], str, str]]:
        """``(shape, dtype, device)`` of each output for these inputs."""
    def __call__(self, *args: Any, out: Any | Sequence[Any] | None = None) -> Any: ...

def list_kernels() -> list[Kernel]: ...
def get_kernel(name: str) -> Kernel:
    """Raises KeyError if no kernel has this name."""
def load_plugin(path: str) -> tuple[str, str, list[str]]:
    """Loads a plugin shared library; returns ``(name, version, signatures)``."""
def from_dlpack(x: Any, /, *, device: Any | None = None, copy: bool | None = None) -> Array:
    """Any DLPack producer (or capsule) as an Array: zero copy unless ``copy=True``
    (always a new writable array); ``copy=False`` raises ValueError where only a copy works."""
def asarray(obj: Any) -> Array:
    """A buffer-protocol object (bytes, bytearray, memoryview, array.array, NumPy) as an Array, zero copy."""
def zeros(shape: int | Sequence[int], dtype: str = "f32") -> Array:
    """A zero-filled Array. More than 64 dims, negative dims or a size that overflows:
    ValueError; memory that cannot be had: MemoryError."""
def arange(n: int, dtype: str = "f32") -> Array:
    """``0, 1, .., n-1``. Negative ``n``: ValueError; too large for memory: MemoryError."""
def inspect_capsule(capsule: Any) -> dict[str, Any]:
    """Reads a DLPack capsule without consuming it."""

ToDlpack = Callable[[Any], Any]
