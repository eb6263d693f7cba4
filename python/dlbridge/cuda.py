"""CUDA in dlbridge: is it usable here, and why not.

    >>> import dlbridge.cuda
    >>> dlbridge.cuda.is_available()          # False on a machine without an NVIDIA driver
    False
    >>> dlbridge.cuda.unavailable_reason()    # doctest: +ELLIPSIS
    'no CUDA driver: libcuda.so could not be loaded ...'

dlbridge loads libcuda and NVRTC when first asked (nothing CUDA is needed to import
dlbridge). The built-in kernels add, mul, relu, gelu, softmax and sum have CUDA
implementations, compiled with NVRTC on first use and run on the caller's current
stream (torch's, through its DLPack exchange API). ``dlbridge.Array`` holds CUDA memory
too (``dlbridge.from_dlpack`` of a CUDA tensor, ``Array.to_device("cuda")``), its work
ordered on the legacy default stream (see docs/cuda.md). These paths pass their
tests on an H100 (``scripts/gpu-check.sh``).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from ._dlbridge import Kernel, cuda_memory_stats, cuda_raw_kernel, cuda_raw_kernel_ptx, cuda_status

__all__ = ["RawKernel", "is_available", "memory_stats", "status", "unavailable_reason"]


def status() -> dict[str, Any]:
    """Everything dlbridge knows about CUDA here: ``available``, ``reason``,
    ``driver_version``, ``devices``, ``nvrtc`` (where NVRTC was loaded from),
    ``nvrtc_version`` and ``nvrtc_error``."""
    return cuda_status()


def memory_stats(device: int = 0) -> dict[str, int]:
    """dlbridge's memory pool and stream ordering on ``cuda:device``: ``raw_allocs`` and
    ``raw_frees`` (cuMemAlloc / cuMemFree calls), ``hits`` (requests served from the
    pool's cache), ``bytes_in_use``, ``bytes_cached``, and ``stream_waits`` (events one
    stream was made to wait for on another). Raises where CUDA is unavailable."""
    return cuda_memory_stats(device)


def is_available() -> bool:
    """Whether a CUDA driver and at least one device are usable."""
    return bool(cuda_status()["available"])


def unavailable_reason() -> str | None:
    """Why CUDA cannot be used here (``None`` when it can)."""
    return cuda_status()["reason"]


class RawKernel:
    """A CUDA C kernel compiled at run time with NVRTC, called like any dlbridge kernel.

        >>> scale = dlbridge.cuda.RawKernel(r'''
        ... extern "C" __global__ void scale(const T* x, double alpha, T* y, long long n) {
        ...     long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
        ...     if (i < n) y[i] = (T)(alpha * x[i]);
        ... }''', "scale", "scale<T: f32|f64>(x: T[N], alpha: f64) -> (y: T[N])")
        >>> y = scale(torch.arange(4.0, device="cuda"), 2.0)   # y allocated by torch, on x's device

    The ``signature`` (dlbridge's signature language) checks every call and sizes the
    outputs, which the caller's framework allocates (or ``out=`` gives). The function
    ``name`` receives one pointer per tensor parameter, one value per scalar (``double``,
    ``long long``, ``int`` for bool), one pointer per output, and ``long long n``, the
    first output's element count. Each type variable is a ``typedef`` of its C type for
    the call (``T`` is ``float`` for f32; f16/bf16 are ``unsigned short`` bits). Tensors
    must be contiguous. Launch: ``block`` threads a block, ``grid`` blocks (default
    ``ceil(n / block)``), on the caller's current stream.

    The source is compiled when the kernel is made (for the GPU's architecture, or
    ``compute_75`` without one): a compile error raises ``RuntimeError`` with NVRTC's log.
    PTX is cached in memory and on disk (``$DLBRIDGE_CACHE_DIR/nvrtc``, else
    ``$XDG_CACHE_HOME/dlbridge/nvrtc``, else ``~/.cache/dlbridge/nvrtc``), keyed by a hash of source, options and architecture.
    """

    def __init__(
        self,
        source: str,
        name: str,
        signature: str,
        *,
        options: Sequence[str] = (),
        block: int = 256,
        grid: int | None = None,
    ) -> None:
        for what, text in (("name", name), ("source", source), ("signature", signature)):
            if not isinstance(text, str):
                raise TypeError(f"RawKernel: {what} must be a str, got {type(text).__name__}")
        first = re.match(r"\s*([A-Za-z_]\w*)", signature)
        head = first.group(1) if first else ""
        if name.isidentifier() and head and head != name:
            raise ValueError(f"RawKernel {name!r}: the signature names `{head}`, not the kernel `{name}` (a signature starts with its kernel's name)")
        # A str is a sequence too: "-O2 -g" would become six one-character options.
        if isinstance(options, (str, bytes)) or not all(isinstance(o, str) for o in options):
            raise TypeError(f"RawKernel {name!r}: options must be a list of str, got {options!r}")
        for what, value in (("block", block), ("grid", grid)):
            if value is None and what == "grid":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"RawKernel {name!r}: {what} must be an int, got {value!r}")
            if value < 0:
                raise ValueError(f"RawKernel {name!r}: {what} must be positive, got {value}")
            if value > 2**31 - 1:
                raise ValueError(f"RawKernel {name!r}: {what} must be at most 2**31 - 1 (CUDA's largest grid), got {value}")
        self.source = source
        self.name = name
        self.options = tuple(options)
        try:
            self.kernel: Kernel = cuda_raw_kernel(source, name, signature, list(self.options), block, grid)
        except ValueError as e:
            if str(e).startswith("RawKernel"):
                raise
            raise ValueError(f"RawKernel {name!r}: {e}") from e

    @property
    def signature(self) -> str:
        return self.kernel.signature

    def ptx(self, arch: str = "compute_75") -> str:
        """The PTX of the source for ``arch`` (the first dtype of each type variable)."""
        return cuda_raw_kernel_ptx(self.source, self.name, self.kernel.signature, arch, list(self.options))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.kernel(*args, **kwargs)

    def __repr__(self) -> str:
        return f"dlbridge.cuda.RawKernel({self.name!r}, {self.kernel.signature!r})"
