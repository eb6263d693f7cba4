"""Kernels from source at run time: CuPy's ``ElementwiseKernel`` on any framework's arrays.

``dlbridge.ElementwiseKernel('T x, T y', 'T z', 'z = (x - y) * (x - y)', 'squared_diff')``
is CuPy's class with CuPy's parameter language and semantics; the kernel is registered
under its name (``dlbridge.get_kernel('squared_diff')``, ``dlbridge list``, Rust and tch
see it too). Inputs broadcast as NumPy broadcasts them, any strides; outputs are allocated
by the framework of the first array argument (torch, NumPy, else ``dlbridge.Array``) or
passed after the inputs (positionally, as in CuPy, or with ``out=``). The C++ for each
combination of dtypes is generated, compiled by the system compiler (``$CXX``, else
``c++``) and cached on disk on first use.

On CUDA tensors (torch ``cuda`` tensors, any ``__dlpack__`` producer on ``cuda``) the
same kernel runs on the GPU, as CuPy runs it: CUDA C generated from the same text,
compiled by NVRTC for the device on first use (cached on disk), launched on the caller's
stream (torch's current stream). Outputs, and the 0-d arrays Python scalars become, are
made by torch on the inputs' device.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Sequence
from typing import Any

from . import _dlbridge

__all__ = ["ElementwiseKernel", "ReductionKernel"]

# dlbridge dtype names -> NumPy / torch names.
_NUMPY_NAMES: dict[str, str] = _dlbridge.dtype_names()  # {"f32": "float32", ...}, from dlbridge-core
_FROM_NUMPY = {v: k for k, v in _NUMPY_NAMES.items()}


def _is_scalar(x: Any) -> bool:
    """A Python or NumPy scalar (not an array of any framework)."""
    if isinstance(x, (bool, numbers.Number)):
        return not hasattr(x, "__dlpack__") or type(x).__module__ == "numpy"
    # NumPy scalars that are not Numbers (np.bool_), but not 0-d arrays.
    return type(x).__module__ == "numpy" and type(x).__name__ != "ndarray" and getattr(x, "shape", None) == ()


def _framework(x: Any) -> str:
    mod = type(x).__module__.split(".")[0]
    return mod if mod in ("torch", "numpy") else "other"


def _dtype_of(x: Any) -> str:
    """The dlbridge dtype name of an array of any framework."""
    dt = getattr(x, "dtype", None)
    if dt is not None:
        name = str(dt).removeprefix("torch.")
        if name in _FROM_NUMPY:
            return _FROM_NUMPY[name]
        if name in _NUMPY_NAMES:
            return name
    return _dlbridge.from_dlpack(x).dtype


def _scalar_dtype(v: Any) -> str:
    """NumPy's dtype for a Python scalar when nothing else binds it."""
    if hasattr(v, "dtype"):
        return _FROM_NUMPY.get(str(v.dtype), "f64")
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, numbers.Integral):
        return "i64"
    if isinstance(v, complex):
        return "c128"
    return "f64"


# Kernels registered by ReductionKernel, by name: their signature. Each output's
# shape must be the kept (leading) dims of the inputs' broadcast shape, which
# the signature language does not say (`x: T[...S], y: mut T[...O]`); the torch
# operators' fake implementation checks it from here.
_REDUCTIONS: dict[str, str] = {}


def is_reduction(kernel: Any) -> bool:
    """Whether ``kernel`` (a ``dlbridge.Kernel``) is the one a ``ReductionKernel`` registered."""
    return _REDUCTIONS.get(kernel.name) == kernel.signature


# The values each integer dtype holds.
_INT_RANGES = {
    f"{kind}{bits}": ((-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if kind == "i" else (0, (1 << bits) - 1))
    for kind in "iu"
    for bits in (8, 16, 32, 64)
}


def _check_scalar(kernel: str, arg: str, value: Any, dtype: str) -> None:
    """An integer parameter takes an integer that fits it: a float is refused, never
    truncated (as a plain kernel's i64 scalar refuses one), and a value out of the
    dtype's range is an OverflowError, whatever framework makes the 0-d array."""
    if dtype not in _INT_RANGES:
        return
    if not isinstance(value, numbers.Integral):
        raise TypeError(f"{kernel}: argument {arg}: the scalar {value!r} is not an integer, and {arg} is {dtype} (it is not truncated)")
    lo, hi = _INT_RANGES[dtype]
    if not lo <= int(value) <= hi:
        raise OverflowError(f"{kernel}: argument {arg}: the scalar {value!r} is out of range for {dtype} ({lo} to {hi})")


def _zero_d(value: Any, dtype: str, like: Any) -> Any:
    """A 0-d array holding ``value`` as ``dtype``, in the framework of ``like``."""
    fw = _framework(like) if like is not None else "other"
    if fw == "torch":
        import torch

        return torch.tensor(value, dtype=getattr(torch, _NUMPY_NAMES[dtype]), device=like.device)
    if fw == "numpy":
        import numpy

        return numpy.asarray(value, dtype=_NUMPY_NAMES[dtype])
    return _dlbridge.full((), value, dtype)


class _SourceKernel:
    """What CuPy's two kernel classes share: their parameters as given, and the
    registered kernel compiled from them."""

    def __init__(self, kernel: _dlbridge.Kernel, in_params: str, out_params: str, name: str, options: Sequence[str]) -> None:
        self.in_params = in_params
        self.out_params = out_params
        self.name = name
        self.options = tuple(options)
        self.kernel: _dlbridge.Kernel = kernel

    @property
    def signature(self) -> str:
        """The registry signature derived from the parameters."""
        return self.kernel.signature

    def __repr__(self) -> str:
        return f"<dlbridge.{type(self).__name__} {self.kernel.signature}>"


class ElementwiseKernel(_SourceKernel):
    """CuPy's ``ElementwiseKernel``: an elementwise operation compiled from C++ source.

    ``in_params`` / ``out_params``: comma-separated ``[raw] [mut] TYPE NAME``; ``TYPE`` is a
    one-letter type placeholder (bound from the arguments, one specialisation per dtype
    combination) or a NumPy dtype name. ``raw`` arguments are not broadcast: the body
    indexes them (``y[_ind.size() - i - 1]``) with a flat C-order index. Inputs are
    read-only in the body unless ``mut``. ``operation`` is C++ run for every element: ``i``
    is the flat index of the element, ``_ind.size()`` the number of elements. CUDA
    qualifiers (``__device__``) in ``preamble`` compile on the CPU.

    On CUDA tensors the kernel runs on the GPU (CUDA C from the same text, NVRTC).
    ``reduce_dims``, ``options`` (NVRTC options) and ``block_size`` are CuPy's launch
    details: accepted for compatibility, dlbridge chooses its own.
    """

    def __init__(
        self,
        in_params: str,
        out_params: str,
        operation: str,
        name: str = "kernel",
        reduce_dims: bool = True,
        preamble: str = "",
        no_return: bool = False,
        return_tuple: bool = False,
        loop_prep: str = "",
        after_loop: str = "",
        options: Sequence[str] = (),
    ) -> None:
        kernel = _dlbridge.elementwise_kernel(in_params, out_params, operation, name, preamble, loop_prep, after_loop)
        super().__init__(kernel, in_params, out_params, name, options)
        self.operation = operation
        self.preamble = preamble
        self.no_return = no_return
        self.return_tuple = return_tuple
        self._params = self.kernel.params
        self.nin = len(self._params)
        self.nout = len(self.kernel.outputs)
        self.nargs = self.nin + self.nout
        # Which inputs broadcast (may be given as scalars), and their type placeholder.
        self._scalar_ok = [any(str(d).startswith("*") for d in (p.dims or ())) for p in self._params]

    def __call__(self, *args: Any, size: int | None = None, block_size: int | None = None, out: Any = None) -> Any:
        if size is not None:
            raise TypeError(f"{self.name}: size= is for kernels whose arguments are all raw; this one has non-raw arguments")
        if len(args) not in (self.nin, self.nargs):
            raise TypeError(
                f"{self.name}: takes {self.nin} input arguments"
                + (f" (or {self.nargs} with the outputs)" if self.nout else "")
                + f", got {len(args)}"
            )
        ins, outs = list(args[: self.nin]), list(args[self.nin :])
        if outs and out is not None:
            raise TypeError(f"{self.name}: outputs given both positionally and with out=")
        if out is not None:
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if any(_is_scalar(a) for a in ins):
            ins = self._scalars_to_arrays(ins, outs)
        result = self.kernel(*ins, out=(tuple(outs) if outs else None))
        if self.no_return:
            return None
        if self.nout == 1 and isinstance(result, (tuple, list)):
            result = result[0]
        if self.nout == 1:
            return (result,) if self.return_tuple else result
        return tuple(result) if isinstance(result, (tuple, list)) else result

    def _scalars_to_arrays(self, ins: list[Any], outs: list[Any]) -> list[Any]:
        return _scalars_to_arrays(self.name, self._params, self._scalar_ok, ins, outs)


def _scalars_to_arrays(name: str, params: Sequence[Any], scalar_ok: Sequence[bool], ins: list[Any], outs: list[Any]) -> list[Any]:
    """Python scalars become 0-d arrays (which broadcast) of the dtype their
    parameter's type takes from the array arguments, as CuPy does."""
    arrays = [a for a in ins + outs if not _is_scalar(a)]
    if not arrays:
        raise TypeError(f"{name}: every argument is a scalar; at least one must be an array (it decides the loop's size)")
    like = arrays[0]
    bound: dict[str, str] = {}
    for p, a in zip(params, ins, strict=True):
        if not _is_scalar(a) and p.dtypes != (p.dtype,):
            bound.setdefault(p.dtype, _dtype_of(a))
    converted = []
    for ok, p, a in zip(scalar_ok, params, ins, strict=True):
        if not _is_scalar(a):
            converted.append(a)
            continue
        if not ok:
            raise TypeError(f"{name}: argument {p.name} is raw: it takes an array, not the scalar {a!r}")
        dtype = p.dtype if p.dtypes == (p.dtype,) else bound.setdefault(p.dtype, _scalar_dtype(a))
        _check_scalar(name, p.name, a, dtype)
        try:
            converted.append(_zero_d(a, dtype, like))
        except (OverflowError, TypeError, ValueError) as e:
            raise type(e)(f"{name}: argument {p.name}: the scalar {a!r} is not a {dtype}: {e}") from None
    return converted


def _permuted(a: Any, perm: list[int]) -> Any:
    """A zero-copy view of ``a`` with its axes in the order ``perm``, in ``a``'s own
    framework where it has one (a torch tensor stays on its device)."""
    fw = _framework(a)
    if fw == "torch":
        return a.permute(*perm)
    if fw == "numpy":
        return a.transpose(perm)
    return _dlbridge.from_dlpack(a).transpose(perm)


def _broadcast_shapes(kernel: str, names: list[str], shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """NumPy's broadcast of ``shapes``; a mismatch names the arguments."""
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for name, s in zip(names, shapes):
        for i, n in enumerate(s, ndim - len(s)):
            if n != 1:
                if out[i] not in (1, n):
                    raise ValueError(
                        f"{kernel}: argument {name}: shape {list(s)} does not broadcast with the other inputs "
                        f"({', '.join(f'{m} {list(t)}' for m, t in zip(names, shapes))})"
                    )
                out[i] = n
    return tuple(out)


def _broadcast_to(a: Any, shape: tuple[int, ...]) -> Any:
    """A zero-copy, zero-stride view of ``a`` broadcast to ``shape``."""
    fw = _framework(a)
    if fw == "torch":
        return a.expand(shape)
    import numpy

    if fw == "numpy":
        return numpy.broadcast_to(a, shape)
    # Any other producer: through NumPy's view of its memory, then back as a dlbridge.Array.
    return _dlbridge.from_dlpack(numpy.broadcast_to(numpy.from_dlpack(a), shape))


def _empty(shape: tuple[int, ...], dtype: str, like: Any) -> Any:
    """An uninitialised (or zeroed) array of ``shape`` in the framework of ``like``."""
    fw = _framework(like)
    if fw == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, _NUMPY_NAMES[dtype]), device=like.device)
    if fw == "numpy":
        import numpy

        return numpy.empty(shape, dtype=_NUMPY_NAMES[dtype])
    return _dlbridge.zeros(shape, dtype)


class ReductionKernel(_SourceKernel):
    """CuPy's ``ReductionKernel``: ``map_expr`` on each input element, ``reduce_expr``
    combining two values ``a`` and ``b`` from ``identity``, ``post_map_expr`` writing the
    outputs from the reduced ``a``; ``axis=`` and ``keepdims=`` at call time.

    ``dlbridge.ReductionKernel('T x', 'T y', 'x * x', 'a + b', 'y = sqrt(a)', '0', 'l2norm')``
    registers ``l2norm<T: ...>(x: T[...S], y: mut T[...O])``: called through the registry,
    it reduces ``x`` over its last ``x.ndim - y.ndim`` dims into ``y``. Calling this object
    moves the reduced axes last (a zero-copy view) and allocates ``y`` in the input's
    framework (torch, NumPy, else ``dlbridge.Array``).
    """

    def __init__(
        self,
        in_params: str,
        out_params: str,
        map_expr: str,
        reduce_expr: str,
        post_map_expr: str,
        identity: str | None,
        name: str = "reduce_kernel",
        reduce_type: str | None = None,
        reduce_dims: bool = True,
        preamble: str = "",
        options: Sequence[str] = (),
    ) -> None:
        kernel = _dlbridge.reduction_kernel(
            in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name, reduce_type, preamble
        )
        super().__init__(kernel, in_params, out_params, name, options)
        self.identity = identity
        _REDUCTIONS[name] = self.kernel.signature
        params = self.kernel.params
        self._outs = [p for p in params if p.mutable]
        self._ins = [p for p in params if not p.mutable]
        self.nin, self.nout = len(self._ins), len(self._outs)

    def __call__(self, *args: Any, out: Any = None, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Any:
        if len(args) not in (self.nin, self.nin + self.nout):
            raise TypeError(f"{self.name}: takes {self.nin} input arguments (or {self.nin + self.nout} with the outputs), got {len(args)}")
        ins, outs = list(args[: self.nin]), list(args[self.nin :])
        if out is not None:
            if outs:
                raise TypeError(f"{self.name}: outputs given both positionally and with out=")
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if any(_is_scalar(a) for a in ins):  # 0-d arrays, which broadcast (as in ElementwiseKernel)
            ins = _scalars_to_arrays(self.name, self._ins, [True] * self.nin, ins, outs)
        first = ins[0]
        shapes = [tuple(int(n) for n in a.shape) for a in ins]
        shape = _broadcast_shapes(self.name, [p.name for p in self._ins], shapes)
        if any(s != shape for s in shapes):  # inputs broadcast, as in CuPy
            ins = [a if s == shape else _broadcast_to(a, shape) for a, s in zip(ins, shapes)]
        ndim = len(shape)
        if axis is None:
            axes = list(range(ndim))
        else:
            try:
                raw = [operator.index(axis)] if not isinstance(axis, (tuple, list)) else [operator.index(a) for a in axis]
            except TypeError:
                raise TypeError(f"{self.name}: axis must be an int or a tuple of ints, not {axis!r}") from None
            axes = []
            for a in raw:
                d = a + ndim if a < 0 else a
                if not 0 <= d < ndim:
                    raise ValueError(f"{self.name}: axis {a} is out of bounds for an array of {ndim} dims")
                if d in axes:
                    raise ValueError(f"{self.name}: axis {a} is repeated")
                axes.append(d)
            axes.sort()
        kept = [d for d in range(ndim) if d not in axes]
        perm = kept + axes
        if perm != list(range(ndim)):
            ins = [_permuted(a, perm) for a in ins]
        out_shape = tuple(shape[d] for d in kept)
        keep_shape = tuple(1 if d in axes else shape[d] for d in range(ndim))
        if not outs:
            bound: dict[str, str] = {}
            for p, a in zip(self._ins, ins, strict=True):
                if p.dtypes != (p.dtype,):
                    bound.setdefault(p.dtype, _dtype_of(a))
            for p in self._outs:
                dtype = p.dtype if p.dtypes == (p.dtype,) else bound[p.dtype]
                outs.append(_empty(keep_shape if keepdims else out_shape, dtype, first))
        # A keepdims output is written through a view without the reduced dims.
        # (The trailing Ellipsis keeps an all-integer index a 0-d view, not a NumPy scalar.)
        index = tuple(0 if d in axes else slice(None) for d in range(ndim)) + (Ellipsis,)
        targets = [o[index] if len(o.shape) == ndim and ndim != len(out_shape) else o for o in outs]
        self.kernel(*ins, *targets)
        return outs[0] if self.nout == 1 else tuple(outs)
