"""dlbridge: run typed kernels on any framework's tensors with zero copies.

    >>> import dlbridge, torch
    >>> matmul = dlbridge.get_kernel("matmul")
    >>> matmul(torch.rand(4, 3), torch.rand(3, 2)).shape      # torch in, torch out
    torch.Size([4, 2])
    >>> import inspect; inspect.signature(matmul)
    <Signature (a: 'T[M, K]', b: 'T[K, N]', /, *outs: 'T[M, N]', out: 'T[M, N] | None' = None) -> 'T[M, N]'>

Tensors come in through the DLPack C exchange API where the type offers it
(torch), else ``__dlpack__``, else the buffer protocol; outputs are made by
the first tensor argument's framework (torch, NumPy, CuPy, JAX, or any
framework given to ``register_allocator``; else ``dlbridge.Array``), or
written into ``out=``.
"""

from ._device import DLDeviceType
from ._dlbridge import (
    Array,
    Kernel,
    Param,
    Plugin,
    __version__,
    arange,
    asarray,
    from_dlpack,
    full,
    get_kernel,
    list_kernels,
    load_plugin,
    register_allocator,
    zeros,
)
from ._compile import ElementwiseKernel, ReductionKernel
from ._define import Definitions, define
from ._inline import load_inline
from ._frameworks import install as _install_frameworks
from ._introspect import install as _install_introspection

_install_frameworks()  # CuPy's and JAX's outputs (neither is imported here)

# inspect.signature(kernel), kernel.__doc__ and help(kernel) describe each kernel.
_install_introspection(Kernel)
_dlbridge._freeze_kernel_type()  # after the attributes above; see _dlbridge's vectorcall entry

__all__ = [
    "Array",
    "DLDeviceType",
    "Definitions",
    "ElementwiseKernel",
    "Kernel",
    "Param",
    "Plugin",
    "ReductionKernel",
    "arange",
    "asarray",
    "convert_func",
    "define",
    "from_dlpack",
    "full",
    "get_kernel",
    "list_kernels",
    "load_inline",
    "load_plugin",
    "register_allocator",
    "to_pytorch_func",
    "zeros",
]


def convert_func(func, tensor_type, to_dlpack_func):
    """Wrap ``func`` so every argument of ``tensor_type`` is converted with
    ``to_dlpack_func`` (e.g. ``torch.utils.dlpack.to_dlpack``) before the call.

    Same name and meaning as TVM's ``tvm.contrib.dlpack.convert_func``: the
    wrapped function takes ``tensor_type`` objects, ``func`` receives DLPack
    capsules. Any dlbridge kernel accepts capsules, so this works with every
    kernel; it is also the slow path (a capsule per argument per call) that
    :func:`to_pytorch_func` avoids.
    """

    def _wrapper(*args, **kwargs):
        args = tuple(to_dlpack_func(a) if isinstance(a, tensor_type) else a for a in args)
        return func(*args, **kwargs)

    _wrapper.__wrapped__ = func
    _wrapper.__doc__ = getattr(func, "__doc__", None)
    return _wrapper


def to_pytorch_func(func):
    """Wrap ``func`` (a dlbridge kernel, or any callable taking DLPack tensors)
    so it takes and returns ``torch.Tensor``: TVM's ``to_pytorch_func``.

    dlbridge kernels read torch tensors directly through torch's DLPack C
    exchange API and allocate outputs with torch's own allocator, so for them
    no conversion happens at all; other callables get TVM's behaviour
    (``convert_func`` with ``torch.utils.dlpack.to_dlpack``).
    """
    import torch

    if isinstance(func, Kernel):

        def _kernel(*args, **kwargs):
            return func(*args, **kwargs)

        _kernel.__wrapped__ = func
        _kernel.__doc__ = f"{func.signature} on torch tensors"
        return _kernel
    return convert_func(func, torch.Tensor, torch.utils.dlpack.to_dlpack)


def __getattr__(name):
    # `dlbridge.torch` (PyTorch operators from signatures) imports torch, and
    # `dlbridge.jax` imports jax, so each is loaded on first use rather than
    # with dlbridge.
    if name in ("torch", "jax"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'dlbridge' has no attribute {name!r}")
