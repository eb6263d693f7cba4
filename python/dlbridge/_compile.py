"""Kernels from source at run time: CuPy's ``ElementwiseKernel`` on any framework's arrays.

``dlbridge.ElementwiseKernel('T x, T y', 'T z', 'z = (x - y) * (x - y)', 'squared_diff')``
is CuPy's class with CuPy's parameter language and semantics; the kernel is registered
under its name (``dlbridge.get_kernel('squared_diff')``, ``dlbridge list``, Rust and tch
see it too). Inputs broadcast as NumPy broadcasts them, any strides; outputs are made
by the framework of the first array argument (torch, NumPy, CuPy, JAX, any framework
given to ``dlbridge.register_allocator``, else ``dlbridge.Array``) or passed after the inputs (positionally, as in CuPy, or with ``out=``). The C++ for each
combination of dtypes is generated, compiled by the system compiler (``$CXX``, else
``c++``) and cached on disk on first use.

On CUDA tensors (torch ``cuda`` tensors, any ``__dlpack__`` producer on ``cuda``) the
same kernel runs on the GPU, as CuPy runs it: CUDA C generated from the same text,
compiled by NVRTC for the device on first use (cached on disk), launched on the caller's
stream (torch's or CuPy's current stream). Outputs are made on the inputs' device, and
so are the 0-d arrays Python scalars become.
"""

from __future__ import annotations

import numbers
import operator
import sys
from collections.abc import Sequence
from typing import Any

from . import _dlbridge
from ._device import DLDeviceType

__all__ = ["ElementwiseKernel", "ReductionKernel"]

# dlbridge dtype names -> NumPy / torch names.
_NUMPY_NAMES: dict[str, str] = _dlbridge.dtype_names()  # {"f32": "float32", ...}, from dlbridge-core
_FROM_NUMPY = {v: k for k, v in _NUMPY_NAMES.items()}


# Types seen to be arrays (exporters of __dlpack__ that are not NumPy scalars): a call's
# arguments are checked with one set lookup each.
_ARRAY_TYPES: set[type] = set()


def _is_scalar(x: Any) -> bool:
    """A Python or NumPy scalar (not an array of any framework)."""
    t = type(x)
    if t in _ARRAY_TYPES:
        return False
    if t is float or t is int or t is bool:
        return True
    if isinstance(x, (bool, numbers.Number)):
        scalar = not hasattr(x, "__dlpack__") or t.__module__ == "numpy"
    else:
        # NumPy scalars that are not Numbers (np.bool_), but not 0-d arrays.
        scalar = t.__module__ == "numpy" and t.__name__ != "ndarray" and getattr(x, "shape", None) == ()
    if not scalar and hasattr(t, "__dlpack__"):
        _ARRAY_TYPES.add(t)
    return scalar


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


def _symbolic(v: Any, kind: str) -> bool:
    """Whether ``v`` is torch's symbolic ``SymInt`` / ``SymFloat`` / ``SymBool`` (a
    Python scalar traced by ``torch.compile(dynamic=True)``)."""
    t = type(v)
    return t.__name__ == kind and t.__module__.startswith("torch")


def _scalar_dtype(v: Any) -> str:
    """NumPy's dtype for a Python scalar when nothing else binds it."""
    if hasattr(v, "dtype"):
        return _FROM_NUMPY.get(str(v.dtype), "f64")
    if isinstance(v, bool) or _symbolic(v, "SymBool"):
        return "bool"
    if isinstance(v, numbers.Integral) or _symbolic(v, "SymInt"):
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


def _check_texts(kind: str, name: Any, **texts: Any) -> None:
    """A ValueError naming the argument whose text is not UTF-8 (a lone surrogate), which
    no compiler could read."""
    for arg, text in texts.items():
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(
                    f"{kind} `{name}`: {arg} holds {text[e.start]!r} at position {e.start}, which is not a character UTF-8 "
                    "can encode (a lone surrogate)"
                ) from None


# The largest finite value of each float dtype, and the spacing of values just
# below it: a number at least half a spacing above it rounds to infinity.
_FLOAT_LIMITS = {
    "f16": (65504.0, 32.0),
    "bf16": (3.3895313892515355e38, 2.0**120),
    "f32": (3.4028234663852886e38, 2.0**104),
    "f64": (1.7976931348623157e308, 2.0**971),
}


def _shown(value: Any) -> str:
    """``value`` for an error message: an integer of more than 40 digits by its size (Python
    will not print one of more than 4300, and thousands of digits name nothing)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        try:
            bits = int(value).bit_length()
        except Exception:  # noqa: BLE001 - a foreign integral type: its repr, as for any value
            return repr(value)
        if bits > 133:
            return f"<{'a negative ' if value < 0 else 'an '}integer of about {int(bits * 0.30103) + 1} digits>"
    return repr(value)


def _check_float(kernel: str, arg: str, value: Any, dtype: str) -> None:
    """A finite number that the dtype would round to infinity is an OverflowError (NumPy
    and torch make it ``inf``, with a warning at most)."""
    if not isinstance(value, numbers.Real) or _symbolic(value, "SymFloat") or _symbolic(value, "SymInt"):
        return
    top, spacing = _FLOAT_LIMITS[dtype]
    try:
        v = abs(float(value))
    except OverflowError:
        v = float("inf")
    else:
        if v != v or (v == float("inf") and not isinstance(value, numbers.Integral)):
            return  # NaN and infinity are values of every float dtype
    if v >= top + spacing / 2:
        raise OverflowError(f"{kernel}: argument {arg}: the scalar {_shown(value)} is out of range for {dtype} (largest finite {top:g})")


def _check_scalar(kernel: str, arg: str, value: Any, dtype: str) -> None:
    """An integer parameter takes an integer that fits it: a float is refused, never
    truncated (as a plain kernel's i64 scalar refuses one), and a value out of the
    dtype's range is an OverflowError, whatever framework makes the 0-d array."""
    if dtype in _FLOAT_LIMITS:
        top, spacing = _FLOAT_LIMITS[dtype]
        if _symbolic(value, "SymInt") and top < 2**63:
            # An integer known when the compiled code runs (f16's range is within an int's).
            import torch

            bound = int(top + spacing / 2)  # from here on, the dtype rounds to infinity
            why = f"{kernel}: argument {arg}: the scalar is out of range for {dtype} (largest finite {top:g})"
            torch._check(value < bound, lambda: why)
            torch._check(value > -bound, lambda: why)
            return
        _check_float(kernel, arg, value, dtype)
        return
    if dtype == "bool":
        if _symbolic(value, "SymInt"):
            # An integer known when the compiled code runs: 0 or 1, as in eager mode.
            import torch

            why = f"{kernel}: argument {arg}: the scalar is not a bool (0 or 1), and {arg} is bool (it is not truncated)"
            torch._check(value >= 0, lambda: why)
            torch._check(value <= 1, lambda: why)
            return
        # True, False, 0 and 1 are bools; 0.5 is not (it is not truncated), nor is 2.
        is_bool = isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b"
        if is_bool or (isinstance(value, numbers.Number) and value in (0, 1)):
            return
        raise TypeError(f"{kernel}: argument {arg}: the scalar {_shown(value)} is not a bool, and {arg} is bool (it is not truncated)")
    if dtype not in _INT_RANGES:
        return
    if _symbolic(value, "SymInt"):
        # Its value is known when the compiled code runs: checked there.
        import torch

        lo, hi = _INT_RANGES[dtype]
        torch._check(value >= lo, lambda: f"{kernel}: argument {arg}: the scalar is out of range for {dtype} ({lo} to {hi})")
        torch._check(value <= hi, lambda: f"{kernel}: argument {arg}: the scalar is out of range for {dtype} ({lo} to {hi})")
        return
    if not isinstance(value, numbers.Integral):
        raise TypeError(f"{kernel}: argument {arg}: the scalar {_shown(value)} is not an integer, and {arg} is {dtype} (it is not truncated)")
    lo, hi = _INT_RANGES[dtype]
    if not lo <= int(value) <= hi:
        raise OverflowError(f"{kernel}: argument {arg}: the scalar {_shown(value)} is out of range for {dtype} ({lo} to {hi})")


def _zero_d(value: Any, dtype: str, like: Any) -> Any:
    """A 0-d array holding ``value`` as ``dtype`` on ``like``'s device: torch's and
    NumPy's own, else a ``dlbridge.Array`` (copied to the device where it is not the host)."""
    fw = _framework(like) if like is not None else "other"
    if fw == "torch":
        import torch

        return torch.tensor(value, dtype=getattr(torch, _NUMPY_NAMES[dtype]), device=like.device)
    if fw == "numpy":
        import numpy

        return numpy.asarray(value, dtype=_NUMPY_NAMES[dtype])
    a = _dlbridge.full((), value, dtype)
    device = like.__dlpack_device__() if like is not None and hasattr(like, "__dlpack_device__") else None
    if device is not None and int(device[0]) not in (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost):
        a = a.to_device((int(device[0]), int(device[1])))
    return a


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
        _check_texts(
            "ElementwiseKernel", name, in_params=in_params, out_params=out_params, operation=operation, preamble=preamble,
            loop_prep=loop_prep, after_loop=after_loop,
        )
        kernel = _dlbridge.elementwise_kernel(in_params, out_params, operation, name, preamble, loop_prep, after_loop)
        super().__init__(kernel, in_params, out_params, name, options)
        self.operation = operation
        self.preamble = preamble
        self.no_return = no_return
        self.return_tuple = return_tuple
        self._params = self.kernel.params
        self.nout = len(self.kernel.outputs)
        # Raw outputs, and outputs whose type no input has (CuPy's `X x, Y y` ->
        # `Z z`), are the registry kernel's trailing `mut` inputs: the caller passes them.
        self._outputs_given = 0
        if self.nout == 0 and out_params.strip():
            self._outputs_given = self.nout = len(out_params.split(","))
            self._params = self._params[: -self.nout]
        # With every input raw, the loop's shape is the caller's (size=): the
        # registry kernel takes it as its `_loop` input, an array of that shape.
        self._sized = bool(self._params) and self._params[-1].name == "_loop"
        if self._sized:
            self._params = self._params[:-1]
        self.nin = len(self._params)
        self.nargs = self.nin + self.nout
        # Which inputs broadcast (may be given as scalars), and their type placeholder.
        self._scalar_ok = [any(str(d).startswith("*") for d in (p.dims or ())) for p in self._params]

    def __call__(self, *args: Any, size: int | None = None, block_size: int | None = None, out: Any = None) -> Any:
        nin = self.nin
        if size is None and out is None and not self._sized:
            for a in args:
                if type(a) not in _ARRAY_TYPES:
                    break
            else:
                # Arrays only (no scalars to convert, no loop size): straight to the kernel.
                n = len(args)
                if n == self.nargs and self.nout:
                    if self._outputs_given:
                        self.kernel(*args)
                        return self._result(args[nin:])
                    return self._result(self.kernel(*args[:nin], out=args[nin:]))
                if n == nin and not self._outputs_given:
                    return self._result(self.kernel(*args))
        if size is not None and not self._sized:
            raise TypeError(f"{self.name}: size= is for kernels whose inputs are all raw; this one has non-raw inputs")
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
        scalars = [_is_scalar(a) for a in ins]
        like = next((a for a, sc in zip(ins, scalars) if not sc), None)
        made = False
        if True in scalars:
            first_is_scalar = scalars[0]
            ins = self._scalars_to_arrays(ins, outs)
            if first_is_scalar and not outs and like is not None:
                # The outputs are made by the first array argument's framework, not
                # by the 0-d array a leading scalar became.
                arrays = [(p.name, a) for p, a, sc in zip(self._params, ins, scalars) if not sc]
                outs = [
                    _dlbridge._empty_like(like, shape, dtype, self.name, o.name, arrays)
                    for (shape, dtype, _), o in zip(self.kernel.prepare_outputs(*ins), self.kernel.outputs, strict=True)
                ]
                made = True
        if self._sized:
            ins.append(self._loop(size, like, outs))
        if self._outputs_given:
            if not outs:
                names = ", ".join(p.name for p in self.kernel.params[len(ins) :])
                raise TypeError(
                    f"{self.name}: the outputs ({names}) cannot be allocated (raw, or of a type no input has): "
                    "pass them after the inputs or with out=, as in CuPy"
                )
            self.kernel(*ins, *outs)
            result = outs[0] if len(outs) == 1 else tuple(outs)
        else:
            result = self.kernel(*ins, out=(tuple(outs) if outs else None))
        if made:
            handed = tuple(_dlbridge._hand_over(like, o) for o in outs)
            result = handed[0] if len(handed) == 1 else handed
        return self._result(result)

    def _result(self, result: Any) -> Any:
        """The call's return value from the kernel's outputs, as CuPy returns them."""
        if self.no_return:
            return None
        if self.nout == 1 and isinstance(result, (tuple, list)):
            result = result[0]
        if self.nout == 1:
            return (result,) if self.return_tuple else result
        return tuple(result) if isinstance(result, (tuple, list)) else result

    def _scalars_to_arrays(self, ins: list[Any], outs: list[Any]) -> list[Any]:
        return _scalars_to_arrays(self.name, self._params, self._scalar_ok, ins, outs)

    def _loop(self, size: Any, like: Any, outs: list[Any]) -> Any:
        """The ``_loop`` argument: one byte seen as ``size`` elements (stride 0),
        or, without ``size``, as the shape of the first non-raw output given (as
        CuPy), on the device of the arrays."""
        declared = self.kernel.params[self.nin + 1 :] if self._outputs_given else self.kernel.outputs
        shaped = [o for o, p in zip(outs, declared) if tuple(p.dims or ()) == ("*S",)]
        if size is None and shaped:
            shape = tuple(int(d) for d in shaped[0].shape)
        elif size is None:
            raise TypeError(f"{self.name}: every input is raw, so the loop's size must be given: call it with size=")
        else:
            try:
                shape = (operator.index(size),)
            except TypeError:
                raise TypeError(f"{self.name}: size must be an int, not {type(size).__name__}") from None
            if shape[0] < 0:
                raise ValueError(f"{self.name}: size must not be negative, got {shape[0]}")
            if shape[0] > 2**63 - 1:
                raise OverflowError(f"{self.name}: size {shape[0]} is out of range (at most 2**63 - 1)")
        like = like if like is not None else next(iter(outs), None)
        one = _dlbridge.zeros((1,), "u8")
        device = like.__dlpack_device__() if like is not None and hasattr(like, "__dlpack_device__") else None
        if device is not None and int(device[0]) not in (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost):
            one = one.to_device((int(device[0]), int(device[1])))
        return one.broadcast_to(shape)


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
            raise TypeError(f"{name}: argument {p.name} is raw: it takes an array, not the scalar {_shown(a)}")
        dtype = p.dtype if p.dtypes == (p.dtype,) else bound.setdefault(p.dtype, _scalar_dtype(a))
        _check_scalar(name, p.name, a, dtype)
        try:
            converted.append(_zero_d(a, dtype, like))
        except (OverflowError, TypeError, ValueError) as e:
            raise type(e)(f"{name}: argument {p.name}: the scalar {_shown(a)} is not a {dtype}: {e}") from None
    return converted


def _numpy_bool_types() -> tuple[type, ...]:
    """NumPy's bool scalar type, where NumPy is imported."""
    np = sys.modules.get("numpy")
    return (np.bool_,) if np is not None else ()


def _shaped(kernel: str, name: str, a: Any) -> Any:
    """``a`` when it has a shape (a framework's array), else a dlbridge.Array view of it (a
    plain ``__dlpack__`` producer or buffer); what is neither is a TypeError naming the argument."""
    if hasattr(a, "shape"):
        return a
    try:
        return _dlbridge.from_dlpack(a)
    except (TypeError, BufferError) as e:
        raise type(e)(f"{kernel}: argument {name}: {e}") from None


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
    if fw == "numpy":
        import numpy

        return numpy.broadcast_to(a, shape)
    # Any other producer, on any device: a dlbridge.Array view of its memory.
    return _dlbridge.from_dlpack(a).broadcast_to(shape)


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
        _check_texts(
            "ReductionKernel", name, in_params=in_params, out_params=out_params, map_expr=map_expr, reduce_expr=reduce_expr,
            post_map_expr=post_map_expr, identity=identity, reduce_type=reduce_type, preamble=preamble,
        )
        kernel = _dlbridge.reduction_kernel(
            in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name, reduce_type, preamble
        )
        super().__init__(kernel, in_params, out_params, name, options)
        self.identity = identity
        _REDUCTIONS[self.kernel.name] = self.kernel.signature
        params = self.kernel.params
        self._outs = [p for p in params if p.mutable]
        self._ins = [p for p in params if not p.mutable]
        self.nin, self.nout = len(self._ins), len(self._outs)
        # Axis plans by (input shape, axis, keepdims), at most 64.
        self._plans: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def __call__(self, *args: Any, out: Any = None, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Any:
        if len(args) not in (self.nin, self.nin + self.nout):
            raise TypeError(f"{self.name}: takes {self.nin} input arguments (or {self.nin + self.nout} with the outputs), got {len(args)}")
        ins, outs = list(args[: self.nin]), list(args[self.nin :])
        if out is not None:
            if outs:
                raise TypeError(f"{self.name}: outputs given both positionally and with out=")
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not isinstance(keepdims, (bool, *_numpy_bool_types())):
            raise TypeError(f"{self.name}: keepdims must be a bool, not {keepdims!r}")
        if isinstance(axis, bool) or (isinstance(axis, (tuple, list)) and any(isinstance(a, bool) for a in axis)):
            raise TypeError(f"{self.name}: axis must be an int or a tuple of ints, not {axis!r}")
        # The framework of the first array argument makes the outputs.
        scalars = [_is_scalar(a) for a in ins]
        like = next((a for a, sc in zip(ins, scalars) if not sc), None)
        if True in scalars:  # 0-d arrays, which broadcast (as in ElementwiseKernel)
            ins = _scalars_to_arrays(self.name, self._ins, [True] * self.nin, ins, outs)
        # Any other DLPack producer or buffer: reduced through a dlbridge.Array view of its memory.
        ins = [_shaped(self.name, p.name, a) for p, a in zip(self._ins, ins, strict=True)]
        given = outs
        outs = [_shaped(self.name, p.name, o) for p, o in zip(self._outs, outs)]
        made: list[Any] = []
        shapes = [tuple(a.shape) for a in ins]
        shape = shapes[0]
        if any(s != shape for s in shapes):  # inputs broadcast, as in CuPy
            shape = _broadcast_shapes(self.name, [p.name for p in self._ins], [tuple(int(n) for n in s) for s in shapes])
            ins = [a if s == shape else _broadcast_to(a, shape) for a, s in zip(ins, shapes)]
        key = (shape, tuple(axis) if isinstance(axis, list) else axis, keepdims)
        try:
            plan = self._plans.get(key)
        except TypeError:  # unhashable (a malformed axis, symbolic sizes): planned every call
            key, plan = None, None
        if plan is None:
            plan = self._plan(shape, axis, keepdims)
            if key is not None and len(self._plans) < 64:
                self._plans[key] = plan
        perm, out_shape, keep_shape, index = plan
        if perm is not None:
            ins = [_permuted(a, perm) for a in ins]
        if not outs:
            bound: dict[str, str] = {}
            for p, a in zip(self._ins, ins, strict=True):
                if p.dtypes != (p.dtype,):
                    bound.setdefault(p.dtype, _dtype_of(a))
            for p in self._outs:
                dtype = p.dtype if p.dtypes == (p.dtype,) else bound[p.dtype]
                arrays = [(q.name, a) for q, a in zip(self._ins, ins)]
                raw = _dlbridge._empty_like(like, keep_shape if keepdims else out_shape, dtype, self.name, p.name, arrays)
                made.append(raw)
                outs.append(_shaped(self.name, p.name, raw))  # written through a view: `raw` may be DLPack-only
        ndim = len(shape)
        targets = [o[index] if len(o.shape) == ndim and ndim != len(out_shape) else o for o in outs]
        self.kernel(*ins, *targets)
        # Made here in the input's framework: handed over as its calls' outputs are (JAX's zero-copy import).
        for i, raw in enumerate(made, start=len(outs) - len(made)):
            outs[i] = _dlbridge._hand_over(like, raw)
        outs = [*given, *outs[len(given) :]]  # the caller's own objects, written in place
        return outs[0] if self.nout == 1 else tuple(outs)

    def _plan(self, shape: tuple[int, ...], axis: Any, keepdims: bool) -> tuple[Any, ...]:
        """For inputs of ``shape`` and this ``axis``: the permutation that moves the reduced
        axes last (None when they are), the output's shape without and with ``keepdims``,
        and the index that views a ``keepdims`` output without its reduced dims."""
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
        out_shape = tuple(int(shape[d]) for d in kept)
        keep_shape = tuple(1 if d in axes else int(shape[d]) for d in range(ndim))
        # A keepdims output is written through a view without the reduced dims.
        # (The trailing Ellipsis keeps an all-integer index a 0-d view, not a NumPy scalar.)
        index = tuple(0 if d in axes else slice(None) for d in range(ndim)) + (Ellipsis,)
        return (None if perm == list(range(ndim)) else perm), out_shape, keep_shape, index
