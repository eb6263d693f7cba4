"""Type stubs for the dlbridge extension module."""

import inspect
import os
import sys
from types import EllipsisType
from typing import Any, Callable, ClassVar, Literal, Sequence, SupportsIndex, final, overload

from typing_extensions import CapsuleType, TypeAlias

from ._device import DLDeviceType

__version__: str
__all__ = [
    "Array",
    "Kernel",
    "Param",
    "Plugin",
    "list_kernels",
    "dtype_names",
    "get_kernel",
    "load_plugin",
    "from_dlpack",
    "asarray",
    "zeros",
    "full",
    "elementwise_kernel",
    "_numpy_read_in_place",
    "_kernel_vectorcall",
    "_freeze_kernel_type",
    "reduction_kernel",
    "tc_define",
    "compile_stats",
    "load_inline",
    "inspect_capsule",
    "arange",
    "cuda_status",
    "cuda_memory_stats",
    "cuda_raw_kernel",
    "cuda_raw_kernel_ptx",
    "xla_ffi_handler",
    "register_allocator",
    "_empty_like",
    "_hand_over",
    "__version__",
]

_DTypeLike: TypeAlias = str | type | Any
"""A dtype name (``"f32"`` or NumPy's ``"float32"``), a NumPy or torch dtype, a NumPy scalar
type, or Python's ``float``/``int``/``bool``/``complex`` (f64/i64/bool/c128); None: f32."""

_Index: TypeAlias = SupportsIndex | slice | EllipsisType

@final
class Array:
    """dlbridge's own n-dimensional array: host or CUDA memory, any DLPack dtype.

    Exchanges memory with zero copies through ``__dlpack__`` and (host memory) the buffer
    protocol. A CUDA array's pending work is ordered on the legacy default stream;
    ``__dlpack__(stream=s)`` orders ``s`` after it with an event.
    Its Python surface follows NumPy's names where they overlap: ``shape``, ``ndim``,
    ``size``, ``strides`` (bytes), ``itemsize``, ``T``, ``transpose``, basic indexing;
    ``dtype`` is dlbridge's dtype name (``"f32"``).
    """

    __dlpack_c_exchange_api__: ClassVar[CapsuleType]
    """The DLPack C exchange API (a ``"dlpack_exchange_api"`` capsule): one C call per import."""
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in bytes, as NumPy gives them; TypeError for sub-byte dtypes."""
    @property
    def element_strides(self) -> tuple[int, ...]:
        """Strides in elements (DLPack's and torch's ``stride()`` convention)."""
    @property
    def itemsize(self) -> int:
        """Bytes per element; TypeError for sub-byte dtypes."""
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
        """The array with its dims reversed, as NumPy's ``.T`` (a view sharing memory)."""
    def broadcast_to(self, shape: Sequence[int]) -> Array:
        """NumPy's ``broadcast_to``: a read-only view with new leading dims and size-1 dims repeated."""
    @overload
    def transpose(self, axes: Sequence[SupportsIndex] | None = None, /) -> Array: ...
    @overload
    def transpose(self, *axes: SupportsIndex) -> Array:
        """NumPy's ``transpose``: no axes or None reverses the dims, else output dim ``i``
        is input dim ``axes[i]`` (a view sharing memory). ValueError for axes that are not
        a permutation of the dims."""
    def __getitem__(self, key: _Index | tuple[_Index, ...], /) -> Array:
        """NumPy's basic indexing, always a view sharing memory: ints drop their dim,
        slices (any step) keep it, ``...`` stands for the dims not indexed. An int out of
        range, too many indices or another index type: IndexError."""
    def contiguous(self) -> Array:
        """A compact copy on the array's own device."""
    def to_device(self, device: str | tuple[int, int], /, *, stream: None = None) -> Array:
        """A copy on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a DLPack
        ``(device_type, device_id)`` pair); the array itself when it is there already."""
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
    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int, /) -> memoryview:
            """PEP 3118 export, zero copy. BufferError for a C-/F-/ANY-contiguous request the
            layout does not meet, a request without PyBUF_STRIDES on a non-C-contiguous layout,
            PyBUF_WRITABLE on a read-only array, and dtypes with no struct format (bf16, float8, ...)."""

@final
class Param:
    """One input or output of a kernel's signature (``Kernel.params``, ``Kernel.outputs``)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> Literal["tensor", "scalar"]: ...
    @property
    def dtype(self) -> str:
        """A tensor's dtype as written, concrete (``"f32"``) or a type variable (``"T"``);
        a scalar's type (``"f64"``, ``"i64"``, ``"bool"``)."""
    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes it accepts: the type variable's allowed set, or the one dtype."""
    @property
    def dims(self) -> tuple[int | str, ...] | None:
        """A tensor's dims as written: ``int`` (fixed), ``"M"`` (a symbol), ``"...B"``
        (any number of dims); None for a scalar."""
    @property
    def mutable(self) -> bool:
        """Whether the kernel writes this input in place (``mut``)."""
    @property
    def annotation(self) -> str:
        """The type as the signature writes it: ``"T[M, K]"``, ``"mut f32[N]"``, ``"f64"``."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

class _SignatureOf:
    @overload
    def __get__(self, obj: None, objtype: type | None = None, /) -> None: ...
    @overload
    def __get__(self, obj: Kernel, objtype: type | None = None, /) -> inspect.Signature: ...

@final
class Kernel:
    """A registry kernel. Call it on torch tensors, NumPy arrays, dlbridge Arrays,
    any DLPack producer or buffer; outputs come back in the first tensor's framework.

    ``kernel(*params)``, ``kernel(*params, *outputs)`` or ``kernel(*params, out=outputs)``;
    ``inspect.signature(kernel)`` gives exactly that, and ``kernel.__doc__`` / ``help(kernel)``
    the signature text and the description."""

    @property
    def name(self) -> str: ...
    @property
    def signature(self) -> str:
        """The signature text: ``matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])``."""
    @property
    def doc(self) -> str:
        """The one-line description."""
    def _digest(self) -> str:
        """A digest of what this kernel is (signature, options, origins, source or file)."""
    @property
    def per_element(self) -> bool:
        """Whether each output element depends only on the inputs' elements at its own position."""
    def _handle(self) -> int:
        """A number naming this very kernel for programs of other frameworks
        (dlbridge.jax's custom calls): they run it even after its name is
        given to another kernel."""
    @property
    def devices(self) -> list[str]: ...
    @property
    def outputs_follow_inputs(self) -> bool:
        """Whether an output whose dims are exactly an input's (``...S``, ``...B, N``) is
        allocated in the memory order of the inputs shaped like it (NumPy's ``order='K'``);
        False: always row-major."""
    @property
    def params(self) -> list[Param]:
        """The inputs in call order."""
    @property
    def outputs(self) -> list[Param]: ...
    @property
    def dtypes(self) -> dict[str, list[str]]:
        """Each type variable's allowed dtypes: ``{"T": ["f32", "f64"]}``."""
    __signature__: _SignatureOf
    """``inspect.Signature`` of a call of this kernel (None on the class)."""
    def prepare_outputs(self, *args: Any) -> list[tuple[list[int], str, str]]:
        """``(shape, dtype, device)`` of each output for these inputs."""
    @property
    def origins(self) -> list[tuple[str, str]]:
        """``(device, origin)`` of each implementation: ``built-in (file:line)``,
        a plugin's path, or what compiled it."""
    def abstract_outputs(self, *args: Any) -> list[tuple[list[int], str]]:
        """``(shape, dtype)`` of each output for arguments known by shape and
        dtype only: a ``(shape, dtype)`` pair per tensor, a number per scalar."""
    def abstract_call(self, *args: Any) -> list[tuple[list[int], list[Any], str, list[int]]]:
        """The call's own checks, and ``(shape, dims, dtype, order)`` of each
        output, for arguments known by layout only: ``(shape, dtype)`` or
        ``(shape, strides, dtype, (device_type, device_id))`` per tensor, a
        number per scalar. ``dims`` says where each output dim comes from (an
        int, ``("dim", arg, axis)``, or ``(op, a, b)`` with ``op`` one of ``+ -
        * // min max``); ``order`` is the memory order, outermost dim first
        (empty: row-major)."""
    def __call__(self, *args: Any, out: Any | Sequence[Any] | None = None) -> Any: ...
    def __eq__(self, other: object, /) -> bool:
        """The same registered kernel (a recompiled one, or one extended to a device, is another)."""
    def __hash__(self) -> int: ...

@final
class Plugin:
    """A loaded plugin library, as ``load_plugin`` returns it."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def abi(self) -> int:
        """The plugin ABI version it was built for."""
    @property
    def path(self) -> str:
        """Canonical path of the library."""
    @property
    def kernels(self) -> list[Kernel]:
        """Its kernels, as registered."""

def list_kernels() -> list[Kernel]: ...
def dtype_names() -> dict[str, str]: ...
def cuda_raw_kernel(
    source: str, name: str, signature: str, options: list[str] = ..., block: int = 256, grid: int | None = None
) -> Kernel:
    """The kernel of dlbridge.cuda.RawKernel (compiled once now, with NVRTC)."""
def cuda_raw_kernel_ptx(source: str, name: str, signature: str, arch: str, options: list[str] = ...) -> str:
    """The PTX NVRTC makes of a raw kernel's source for one architecture."""
def cuda_memory_stats(device: int = 0) -> dict[str, int]: ...
def cuda_status() -> dict[str, Any]:
    """CUDA support in this process (keys: available, reason, driver_version, devices, nvrtc, nvrtc_version, nvrtc_error)."""
def xla_ffi_handler(platform: str) -> int:
    """The address of dlbridge's XLA FFI handler for ``"cpu"`` or ``"cuda"``."""

def register_allocator(
    array_type: type | str,
    allocate: Callable[[tuple[int, ...], str, tuple[int, int]], Any] | None = None,
    *,
    finish: Callable[[Any], Any] | None = None,
    stream: Callable[[tuple[int, int]], int] | None = None,
) -> None:
    """Makes calls whose first tensor argument is an ``array_type`` return that framework's arrays."""
def _empty_like(like: Any, shape: Sequence[int], dtype: str, kernel: str, output: str, inputs: Sequence[tuple[str, Any]]) -> Any: ...
def _hand_over(like: Any, out: Any) -> Any: ...
def get_kernel(name: str) -> Kernel:
    """Raises KeyError if no kernel has this name."""
def load_plugin(path: str | os.PathLike[str]) -> Plugin:
    """Loads a plugin shared library (again: the same description, nothing new registered)."""
def from_dlpack(x: Any, /, *, device: Any | None = None, copy: bool | None = None) -> Array:
    """Any DLPack producer (or capsule) as an Array (host or CUDA memory): zero copy
    unless ``copy=True`` (always a new writable array) or ``device`` (``"cpu"``,
    ``"cuda"``, ``"cuda:N"``, a ``(device_type, device_id)`` pair) is elsewhere (a copy);
    ``copy=False`` raises ValueError where only a copy works."""
def asarray(obj: Any) -> Array:
    """A buffer-protocol object (bytes, bytearray, memoryview, array.array, NumPy) as an Array, zero copy."""
def full(shape: int | Sequence[int], fill_value: complex, dtype: _DTypeLike | None = None) -> Array:
    """An Array of ``shape`` filled with ``fill_value`` (NumPy's ``full``); the default dtype
    follows the value (bool, i64, f64, c128). An int that does not fit: OverflowError."""
def elementwise_kernel(
    in_params: str,
    out_params: str,
    operation: str,
    name: str,
    preamble: str = "",
    loop_prep: str = "",
    after_loop: str = "",
) -> Kernel:
    """Registers a CuPy-style elementwise kernel (see ``dlbridge.ElementwiseKernel``)."""
def reduction_kernel(
    in_params: str,
    out_params: str,
    map_expr: str,
    reduce_expr: str,
    post_map_expr: str,
    identity: str | None,
    name: str,
    reduce_type: str | None = None,
    preamble: str = "",
) -> Kernel:
    """Registers a CuPy-style reduction kernel (see ``dlbridge.ReductionKernel``)."""
def tc_define(lang: str) -> list[tuple[str, Kernel, Kernel | None, str]]:
    """Checks and registers every ``def`` of a Tensor Comprehensions text (see
    ``dlbridge.define``) with its derived backward; returns ``(def name, kernel,
    backward kernel or None, why there is none)`` in order."""
def load_inline(
    name: str,
    c_source: str | None,
    functions: list[tuple[str | None, str]],
    cuda_source: str | None = None,
    extra_cflags: list[str] = ...,
    cuda_options: list[str] = ...,
    strided: list[str] = ...,
    sources: list[str] = ...,
) -> list[Kernel]:
    """Registers the functions of ``dlbridge.load_inline`` (``(key, signature)`` pairs); the kernels in order."""
def _numpy_read_in_place() -> bool:
    """Whether exact NumPy arrays are read in place (their layout checked once against NumPy's answers)."""
def _kernel_vectorcall() -> bool:
    """Whether calling a ``Kernel`` takes its vectorcall entry (the type object's layout checked once),
    rather than ``tp_call`` with an argument tuple and a keyword dict."""
def _freeze_kernel_type() -> None:
    """Makes ``Kernel`` immutable once the package has set its attributes (called by ``dlbridge``)."""
def compile_stats() -> dict[str, Any]:
    """What the CPU kernel cache did in this process: ``compiled``, ``disk_hits``, ``dir``."""
def zeros(shape: int | Sequence[int], dtype: _DTypeLike | None = None) -> Array:
    """A zero-filled Array, NumPy's ``zeros(shape, dtype)`` (the default dtype is f32, not
    NumPy's float64). More than 64 dims, negative dims or a size that overflows: ValueError;
    memory that cannot be had: MemoryError."""
def arange(n: int, dtype: _DTypeLike | None = None) -> Array:
    """``0, 1, .., n-1`` (default dtype f32). Negative ``n``: ValueError; too large for
    memory: MemoryError."""
def inspect_capsule(obj: Any) -> dict[str, Any]:
    """Reads a DLPack capsule without consuming it."""
