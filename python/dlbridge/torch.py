"""dlbridge kernels as PyTorch operators, derived from their signatures.

    >>> import dlbridge.torch, torch
    >>> gelu = dlbridge.torch.as_op("gelu")          # torch.ops.dlbridge.gelu
    >>> gelu._schemas[""].__str__()
    'dlbridge::gelu(Tensor x) -> Tensor'
    >>> torch.compile(lambda x: gelu(x) * 2, fullgraph=True)(torch.ones(3)).shape
    torch.Size([3])

One signature drives every registration ``as_op`` makes through
``torch.library``:

- **the schema**: tensors become ``Tensor``, a ``mut`` input a mutated
  ``Tensor(a!)`` (each with its own alias set), the outputs the returns, and the
  scalars ``f64`` / ``i64`` / ``bool`` become ``float`` / ``int`` / ``bool``;
- **the fake implementation** (what ``torch.compile``, ``torch.export`` and
  FakeTensor run instead of the kernel): it checks every argument as the kernel
  would (dtype against concrete types and type variables, rank, fixed dims,
  dims bound to the same symbol, devices), with the kernel's own error text, and
  returns empty outputs whose shapes come from the bound symbols, so a dim bound
  to a symbol is a SymInt under dynamic shapes and ``T[*S]`` broadcasts;
- **the implementations**: CPU, and CUDA where the kernel has one, each the
  kernel itself called on the dispatcher's tensors (zero copies; outputs
  allocated by torch);
- **autograd**, when a backward is given (or the kernel is a built-in that has
  one): ``backward(saved, *grads)`` with ``saved.<name>`` each input, output
  and scalar of the signature; or ``backward={"x": kernel, ...}`` with registry
  kernels whose parameters are named after the forward's inputs, outputs and
  ``grad_<output>``, each returning the gradient of one input.

The eager call of such an operator goes through torch's dispatcher straight to
the kernel (no Python wrapper in between); ``python/bench/bench_calls.py``
measures it beside ``torch.library.custom_op`` on the same no-op.
"""

from __future__ import annotations

import functools
import itertools
import keyword
import operator
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

import dlbridge

from . import _backwards, _compile, _tc_grad
from ._backwards import Saved, as_grads
from ._introspect import kernel_of

__all__ = ["as_op", "register_all", "schema_of", "fake_of", "builtin_backward"]

_NAMESPACE = "dlbridge"

# dlbridge dtype names -> torch dtypes: torch spells them as NumPy does (the one table, in Rust).
_TORCH_DTYPES: dict[str, torch.dtype] = {k: getattr(torch, v) for k, v in _compile._NUMPY_NAMES.items()}
_DLBRIDGE_DTYPES = {v: k for k, v in _TORCH_DTYPES.items()}
_SCALAR_TYPES = {"f64": "float", "i64": "int", "bool": "bool"}
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_LOCK = threading.RLock()


def _kernel_of(kernel: Any) -> dlbridge.Kernel:
    return kernel_of(kernel, "as_op")


def _arg_names(kernel: dlbridge.Kernel) -> list[str]:
    """Schema argument names: the signature's, with a trailing underscore where
    one is a Python keyword or clashes (torch calls take them as keywords)."""
    names, taken = [], set()
    for p in kernel.params:
        name = p.name
        while keyword.iskeyword(name) or name in taken or name == "self":
            name += "_"
        taken.add(name)
        names.append(name)
    return names


def schema_of(kernel: Any) -> str:
    """The torch.library schema (without the operator's name) of ``kernel``'s
    signature: ``(Tensor a, Tensor b) -> Tensor`` for ``add``."""
    k = _kernel_of(kernel)
    args, alias = [], iter("abcdefghijklmnopqrstuvwxyz")
    for p, name in zip(k.params, _arg_names(k), strict=True):
        if p.kind == "scalar":
            args.append(f"{_SCALAR_TYPES[p.dtype]} {name}")
        elif p.mutable:
            args.append(f"Tensor({next(alias)}!) {name}")
        else:
            args.append(f"Tensor {name}")
    n = len(k.outputs)
    ret = "()" if n == 0 else "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
    return f"({', '.join(args)}) -> {ret}"


# ---------------------------------------------------------------------------
# The fake implementation: the registry's own checks and output rule
# (``Kernel.abstract_call``) run on the arguments' layouts, with the sizes
# torch traces with; each output dim is then built from the argument dim (or
# the arithmetic on argument dims) it comes from, so it stays a SymInt under
# dynamic shapes.

# torch device types -> DLPack's (kDLExtDev for the rest: only equality matters).
_DL_DEVICES = {"cpu": 1, "cuda": 2, "mps": 8, "xpu": 14}
_DIM_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": operator.floordiv,
    "min": lambda a, b: torch.sym_min(a, b),
    "max": lambda a, b: torch.sym_max(a, b),
}


def _hint(k: dlbridge.Kernel, name: str, v: Any) -> Any:
    """The value a (possibly symbolic) size or scalar has in the traced call,
    without adding a guard."""
    if isinstance(v, (bool, int, float)):
        return v
    node = getattr(v, "node", None)
    hint = getattr(node, "hint", None)
    if hint is None:
        raise ValueError(
            f"{k.name}: argument {name}: {v} has no value at trace time (a data-dependent size?); "
            "a dlbridge kernel checks its arguments' sizes when it is traced"
        )
    return hint


def _layout(k: dlbridge.Kernel, p: Any, t: Any) -> tuple[Any, ...]:
    """``(shape, strides, dtype, device)`` of tensor ``t``, as ``abstract_call`` reads them."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{k.name}: argument {p.name}: expected a tensor {p.annotation}, got {type(t).__name__}")
    shape = [_hint(k, p.name, n) for n in t.shape]
    strides = [_hint(k, p.name, s) for s in t.stride()]
    dtype = _DLBRIDGE_DTYPES.get(t.dtype) or str(t.dtype).removeprefix("torch.")
    device = (_DL_DEVICES.get(t.device.type, 12), t.device.index or 0)
    return shape, strides, dtype, device


def _size(origin: Any, args: Sequence[Any]) -> Any:
    """An output dim from its origin: an int, ``("dim", arg, axis)`` or ``(op, a, b)``."""
    if isinstance(origin, int):
        return origin
    if origin[0] == "dim":
        return args[origin[1]].shape[origin[2]]
    op, a, b = origin
    return _DIM_OPS[op](_size(a, args), _size(b, args))


def _empty(shape: list[Any], dtype: torch.dtype, device: torch.device, order: Sequence[int]) -> torch.Tensor:
    """An empty tensor of ``shape`` laid out in memory ``order`` (outermost dim first; empty: row-major)."""
    if not order:
        return torch.empty(shape, dtype=dtype, device=device)
    axes = [0] * len(order)
    for i, d in enumerate(order):
        axes[d] = i
    return torch.empty([shape[d] for d in order], dtype=dtype, device=device).permute(axes)


def fake_of(kernel: Any) -> Callable[..., Any]:
    """The fake implementation of ``kernel``: the kernel's own checks (with its
    error text) on the arguments' layouts, and empty outputs of the shapes,
    dtypes, memory order and device a call would give."""
    k = _kernel_of(kernel)
    params = list(k.params)

    def fake(*args: Any) -> Any:
        metas = []
        device = None
        for p, a in zip(params, args, strict=True):
            if p.kind == "tensor":
                metas.append(_layout(k, p, a))
                device = device or a.device
            else:
                metas.append(_hint(k, p.name, a))
        outs = [
            _empty([_size(d, args) for d in dims], _TORCH_DTYPES[dtype], device or torch.device("cpu"), order)
            for _shape, dims, dtype, order in k.abstract_call(*metas)
        ]
        return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)

    fake.__name__ = f"{k.name}_fake"
    fake.__qualname__ = fake.__name__
    fake.__doc__ = _explain_fake(k)
    return fake


def _explain_fake(k: dlbridge.Kernel) -> str:
    """What the fake implementation checks and returns, in words."""
    lines = [f"The fake implementation derived from `{k.signature}`:"]
    seen: set[str] = set()
    for p in k.params:
        if p.kind == "scalar":
            lines.append(f"  {p.name}: {p.dtype} scalar, not checked here")
            continue
        names = ([p.dtype] if p.dtype not in _TORCH_DTYPES else []) + [
            d.lstrip("*") if isinstance(d, str) and d.startswith("*") else d for d in p.dims if isinstance(d, str)
        ]
        binds = [n for n in dict.fromkeys(names) if n not in seen]
        checks = [n for n in dict.fromkeys(names) if n in seen]
        seen.update(names)
        what = []
        if p.dtype in _TORCH_DTYPES:
            what.append(f"dtype {p.dtype}")
        if binds:
            what.append("binds " + ", ".join(binds))
        if checks:
            what.append("checks " + ", ".join(checks))
        fixed = [str(d) for d in p.dims if isinstance(d, int)]
        if fixed:
            what.append("fixed dims " + ", ".join(fixed))
        if any(isinstance(d, str) and d.startswith("*") for d in p.dims):
            what.append("broadcasts")
        lines.append(f"  {p.name}: {p.annotation} ({'; '.join(what) or 'any tensor'})")
    for o in k.outputs:
        shape = "[" + ", ".join(str(d).lstrip("*") for d in o.dims) + "]"
        alike = any(p.kind == "tensor" and list(p.dims) == list(o.dims) for p in k.params)
        order = ", in the memory order of the inputs shaped like it" if alike and k.outputs_follow_inputs else ""
        lines.append(f"  returns {o.name}: empty {shape} of dtype {o.dtype}, on the inputs' device{order}")
    if not k.outputs:
        lines.append("  returns nothing (the kernel writes its mut inputs)")
    lines.append(
        "The checks are the kernel's own (Kernel.abstract_call), on the sizes traced with; "
        "dims bound from symbolic shapes stay symbolic (SymInt)."
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Autograd.


def _sum_to(g: Any, shape: Any) -> Any:
    """A gradient of a broadcast input, summed back to that input's shape."""
    if g is None or g.shape == shape:
        return g
    return g.sum_to_size(shape)


class _Backward:
    """A backward and the names of what it needs saved (None: everything)."""

    def __init__(self, fn: Callable[..., Any], saves: Sequence[str] | None) -> None:
        self.fn, self.saves = fn, None if saves is None else tuple(saves)


def _kernel_backward(k: dlbridge.Kernel, grads: Mapping[str, Any]) -> _Backward:
    """``backward={"x": kernel}``: each kernel is called (as an operator, so it
    traces) with its parameters taken by name from the forward's inputs,
    outputs and ``grad_<output>``."""
    inputs = {p.name for p in k.params}
    plans = []
    for name, g in grads.items():
        if name not in inputs:
            raise ValueError(f"as_op({k.name}): backward for {name!r}, which is not an input of {k.signature}")
        gk = _kernel_of(g)
        if len(gk.outputs) != 1:
            raise ValueError(f"as_op({k.name}): the backward kernel {gk.name} for {name} must have one output, it has {len(gk.outputs)}")
        known = inputs | {o.name for o in k.outputs} | {f"grad_{o.name}" for o in k.outputs}
        missing = [p.name for p in gk.params if p.name not in known]
        if missing:
            raise ValueError(
                f"as_op({k.name}): the backward kernel {gk.signature} for {name} takes {', '.join(missing)}; "
                f"its parameters must be named after {k.name}'s inputs, outputs or grad_<output> ({', '.join(sorted(known))})"
            )
        plans.append((name, as_op(gk), [p.name for p in gk.params]))

    def backward(saved: Saved, *gs: Any) -> dict[str, Any]:
        env = dict(saved.__dict__)
        env.update({f"grad_{o.name}": g for o, g in zip(k.outputs, gs)})
        return {name: _sum_to(op(*(env[a] for a in args)), saved.shapes[name]) for name, op, args in plans}

    grads_in = {f"grad_{o.name}" for o in k.outputs}
    return _Backward(backward, sorted({a for _, _, args in plans for a in args} - grads_in))


def _backward_of(k: dlbridge.Kernel, backward: Any, save: Sequence[str] | None) -> _Backward | None:
    if backward is None:
        return None
    if any(p.mutable for p in k.params):
        raise ValueError(f"as_op({k.name}): a backward for a kernel that writes its inputs (mut) is not supported by torch.library")
    if isinstance(backward, _Backward):
        return backward
    if isinstance(backward, Mapping):
        return _kernel_backward(k, backward)
    if not callable(backward):
        raise TypeError(f"as_op({k.name}): backward must be a function or a dict of kernels, not {type(backward).__name__}")
    names = {p.name for p in k.params} | {o.name for o in k.outputs}
    if save is not None and not set(save) <= names:
        raise ValueError(f"as_op({k.name}): save= names {sorted(set(save) - names)}, which are not in {k.signature}")
    return _Backward(backward, save)


_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_BACKEND_KEYS = {"CPU": torch._C.DispatchKey.CPU, "CUDA": torch._C.DispatchKey.CUDA}


class _Op:
    """One registered operator: the kernel and backward it runs now (as_op
    again with a recompiled kernel of the same name, or another backward,
    replaces them), and its Library (kept alive: a collected Library takes
    its registrations with it)."""

    def __init__(self, k: dlbridge.Kernel, backward: _Backward | None) -> None:
        self.kernel, self.backward = k, backward
        self.signature = k.signature
        self.lib: Any = None
        self.op: Any = None

    def impl(self, *args: Any) -> Any:
        return self.kernel(*args)


def _register(state: _Op, ns: str, opname: str) -> None:
    """define, the backend implementations, the fake and the Autograd kernel."""
    k = state.kernel
    lib = torch.library.Library(ns, "FRAGMENT")
    try:
        lib.define(f"{opname}{schema_of(k)}")
    except RuntimeError as e:
        lib._destroy()
        raise ValueError(f"as_op({k.name}): {ns}::{opname} is already defined outside dlbridge.torch; choose another name= ({e})") from None
    try:
        for device in k.devices:
            if device in _DISPATCH_KEYS:
                lib.impl(opname, state.impl, _DISPATCH_KEYS[device])
        torch.library.register_fake(f"{ns}::{opname}", fake_of(k), lib=lib)
        _register_autograd(lib, opname, state)
        _register_scalar_overloads(lib, opname, state)
    except BaseException:
        lib._destroy()
        raise
    state.lib = lib


# Inputs that broadcast (an ElementwiseKernel's `T[*S]`) take Python scalars, as in
# CuPy: each set of them, up to this many, is an overload with `Scalar`s there.
_MAX_SCALAR_INPUTS = 3


def _scalar_overloads(k: dlbridge.Kernel) -> list[tuple[str, frozenset[int]]]:
    """``(overload name, positions of the scalar inputs)`` for each set of an
    ElementwiseKernel's broadcast inputs given as scalars (at least one input stays a tensor)."""
    params = list(k.params)
    broadcast = [i for i, p in enumerate(params) if p.kind == "tensor" and not p.mutable and tuple(p.dims or ()) == ("*S",)]
    if not broadcast or len(broadcast) > _MAX_SCALAR_INPUTS:
        return []
    tensors = sum(1 for p in params if p.kind == "tensor")
    names = _arg_names(k)
    out = []
    for r in range(1, len(broadcast) + 1):
        for subset in itertools.combinations(broadcast, r):
            if len(subset) < tensors:
                out.append(("Scalar_" + "_".join(names[i] for i in subset), frozenset(subset)))
    return out


def _register_scalar_overloads(lib: Any, opname: str, state: _Op) -> None:
    """``op(x, 1.5)``: an overload per set of scalar inputs (``Scalar`` in its
    schema), which makes each scalar a 0-d tensor on the tensors' device, of the
    dtype its parameter takes from them (as ``ElementwiseKernel`` does), and
    calls the operator's default overload: CompositeImplicitAutograd, so autograd,
    fake tensors, ``torch.compile`` and ``torch.export`` see that call (a scalar
    gets no gradient)."""
    k = state.kernel
    params, names = list(k.params), _arg_names(k)
    default = getattr(getattr(torch.ops, lib.ns), opname).default
    args_text = schema_of(k)
    for overload, scalars in _scalar_overloads(k):
        parts = args_text[1 : args_text.index(") -> ")].split(", ")
        for i in scalars:
            parts[i] = f"Scalar {names[i]}"
        lib.define(f"{opname}.{overload}({', '.join(parts)}){args_text[args_text.index(') -> ') + 1 :]}")

        def impl(*args: Any, _scalars: frozenset[int] = scalars) -> Any:
            like = next(a for i, a in enumerate(args) if i not in _scalars and isinstance(a, torch.Tensor))
            bound = {p.dtype: _compile._FROM_NUMPY[str(a.dtype).removeprefix("torch.")]
                     for i, (p, a) in enumerate(zip(params, args)) if i not in _scalars and p.kind == "tensor"
                     and p.dtypes != (p.dtype,) and str(a.dtype).removeprefix("torch.") in _compile._FROM_NUMPY}
            converted = list(args)
            for i in sorted(_scalars):
                p, v = params[i], args[i]
                dtype = p.dtype if p.dtypes == (p.dtype,) else bound.setdefault(p.dtype, _compile._scalar_dtype(v))
                _compile._check_scalar(k.name, p.name, v, dtype)
                converted[i] = torch.scalar_tensor(v, dtype=getattr(torch, _compile._NUMPY_NAMES[dtype]), device=like.device)
            return default(*converted)

        lib.impl(f"{opname}.{overload}", impl, "CompositeImplicitAutograd")


def _register_autograd(lib: Any, opname: str, state: _Op) -> None:
    """The operator's Autograd kernel. When a tensor argument requires grad: an
    ``autograd.Function`` around the backend call (what
    ``torch.library.register_autograd`` builds) whose backward is the op's, or
    an error that names the op when it has none (a kernel that writes its
    inputs refuses such tensors at once). Otherwise the kernel is called at once
    when nothing but its own backend is below autograd (no mode, no
    functionalization, no subclass), else the call is redispatched."""
    k = state.kernel
    tensors = [p.name for p in k.params if p.kind == "tensor"] + [o.name for o in k.outputs]
    scalars = [p.name for p in k.params if p.kind == "scalar"]
    params = [p.name for p in k.params]
    outputs = [o.name for o in k.outputs]
    mutates = [p.name for p in k.params if p.mutable]
    overload = getattr(getattr(torch.ops, lib.ns), opname).default
    direct = {_BACKEND_KEYS[_DISPATCH_KEYS[d]] for d in k.devices if d in _DISPATCH_KEYS}
    qualname = f"{lib.ns}::{opname}"

    def forward(ctx: Any, keyset: Any, *args: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            result = overload.redispatch(keyset & _AFTER_AUTOGRAD, *args)
        by_name = dict(zip(params, args))
        outs = () if result is None else result if isinstance(result, tuple) else (result,)
        by_name.update(zip(outputs, outs))
        bw = state.backward
        keep = tensors if bw is None or bw.saves is None else [n for n in tensors if n in bw.saves]
        ctx.save_for_backward(*(by_name[n] for n in keep))
        ctx.dlbridge_saved = (keep, {n: by_name[n] for n in scalars}, {n: by_name[n].shape for n in tensors}, bw)
        return result

    def backward_(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        keep, scalar_values, shapes, bw = ctx.dlbridge_saved
        if bw is None:
            why = _tc_grad.why_not(k)
            raise RuntimeError(
                f"{qualname} has no backward: give one with dlbridge.torch.as_op(kernel, backward=...), "
                f"or detach its inputs{f' (none was derived: {why})' if why else ''}"
            )
        saved = Saved({**dict(zip(keep, ctx.saved_tensors)), **scalar_values}, shapes)
        needs = ctx.needs_input_grad[1:]
        try:
            got = as_grads(k, bw.fn(saved, *grads), needs)
        except (TypeError, BufferError, AttributeError) as e:
            if any(type(t) is not torch.Tensor for t in (*ctx.saved_tensors, *grads) if isinstance(t, torch.Tensor)):
                raise type(e)(
                    f"{e} (in the backward of {qualname}, which ran on fake or functional tensors, as under "
                    "torch.compile and opcheck: call operators there — dlbridge.torch.as_op(kernel) or "
                    "torch.ops... — not kernels directly)"
                ) from e
            raise
        return (None, *(g if need else None for g, need in zip(got, needs)))

    function = type(
        f"{k.name}_autograd", (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward_)}
    )
    grad_enabled, any_requires_grad = torch.is_grad_enabled, torch._C._any_requires_grad
    # Whether a dispatch key set (by its raw bits) has only the kernel's own
    # backend below autograd: decided once per key set.
    plain: dict[int, bool] = {}

    def autograd_kernel(keyset: Any, *args: Any) -> Any:
        if grad_enabled() and any_requires_grad(*args):
            if mutates:
                raise RuntimeError(
                    f"{qualname} writes {', '.join(mutates)} in place and has no backward: it cannot take tensors "
                    "that require grad (detach them, or call it under torch.no_grad())"
                )
            return function.apply(keyset, *args)
        raw = keyset.raw_repr()
        direct_call = plain.get(raw)
        if direct_call is None:
            direct_call = plain[raw] = (keyset & _AFTER_AUTOGRAD).highestPriorityTypeId() in direct
        if direct_call:
            return state.kernel(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & _AFTER_AUTOGRAD, *args)

    lib.impl(opname, autograd_kernel, "Autograd", with_keyset=True)


# The array operations the built-in backwards are written against, in torch:
# dlbridge's own `mul` and `matmul` operators, so a backward traces as the forward does.
_TORCH_OPS = _backwards.Ops(
    mul=lambda a, b: as_op("mul")(a, b), matmul=lambda a, b: as_op("matmul")(a, b),
    where=torch.where, zeros_like=torch.zeros_like, erf=torch.erf, exp=torch.exp, mT=lambda a: a.mT,
    expand=lambda g, shape: g.expand(shape), unsqueeze_last=lambda g: g.unsqueeze(-1),
    sum_last_keepdim=lambda x: x.sum(-1, keepdim=True),
)


@functools.cache
def _torch_backward(name: str) -> _Backward:
    entry = _backwards.BUILTINS[name]
    return _Backward(lambda s, g: entry.rule(_TORCH_OPS, s, g), entry.saves)


def builtin_backward(kernel: Any) -> Callable[..., Any] | None:
    """The backward dlbridge ships for a built-in kernel (add, sub, mul, div,
    relu, gelu, softmax, matmul, sum, mean, sum_all, mean_all, copy), or None."""
    b = _builtin(kernel)
    return None if b is None else b.fn


def _builtin(kernel: Any) -> _Backward | None:
    """A built-in's backward, or the one derived for a ``dlbridge.define`` kernel."""
    k = _kernel_of(kernel)
    if _backwards.builtin(k.name, k.signature):
        return _torch_backward(k.name)
    derived = _tc_grad.rule(k, as_op)
    return None if derived is None else _Backward(derived, [p.name for p in k.params])


# ---------------------------------------------------------------------------
# Registration.


def _qualname(k: dlbridge.Kernel, name: str | None) -> tuple[str, str]:
    full = name or k.name
    ns, _, op = full.rpartition("::")
    ns = ns or _NAMESPACE
    for part in (ns, op):
        if not _IDENT.match(part):
            raise ValueError(f"as_op({k.name}): {full!r} is not a valid operator name (want `name` or `namespace::name`)")
    if ns in _TORCH_NAMESPACES:
        raise ValueError(f"as_op({k.name}): the namespace {ns!r} is torch's own; choose another (the default is {_NAMESPACE!r})")
    return ns, op


_REGISTERED: dict[str, _Op] = {}

# Operator namespaces torch itself defines: an operator of dlbridge's there would
# stand beside (or, under a taken name, be refused by) torch's own.
_TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "_prims", "quantized", "_quantized", "c10d", "profiler", "inductor", "higher_order"})


def as_op(kernel: Any, name: str | None = None, *, backward: Any = None, save: Sequence[str] | None = None) -> Any:
    """Register ``kernel`` as a torch operator and return it
    (``torch.ops.dlbridge.<kernel name>`` unless ``name`` says
    ``"namespace::name"`` or another name).

    ``kernel`` is a ``dlbridge.Kernel``, a registered kernel's name, or an
    ``ElementwiseKernel`` / ``ReductionKernel`` / ``RawKernel``. ``backward``:
    a function ``backward(saved, *grads)`` returning one gradient per input
    (a tuple in parameter order, or a dict by name; None where there is none;
    a shorter tuple gives the inputs that need one, scalars never do),
    with ``save=`` the names it reads (default: every input and output), or a
    dict ``{input name: kernel}``; built-ins get theirs by default. Without a
    backward, a gradient through the operator is an error that says so.

    An ``ElementwiseKernel``'s broadcast inputs take Python scalars, as in CuPy:
    besides the default overload (all tensors), each set of them given as
    scalars is an overload with ``Scalar`` there (``op.Scalar_s``), which torch
    picks for ``op(x, 1.5)``.

    Registering under a taken name again returns the same operator, which then
    runs ``kernel`` (e.g. recompiled with the same signature) and the backward
    given with it (a built-in's own when none is given; else none; the same
    kernel registered again keeps the backward it has); another
    signature under a taken name is an error. The namespaces torch owns
    (``aten``, ``prim``, ``prims``, ...) are refused, and so is a name defined
    outside ``dlbridge.torch``.
    """
    k = _kernel_of(kernel)
    ns, opname = _qualname(k, name)
    qualname = f"{ns}::{opname}"
    with _LOCK:
        state = _REGISTERED.get(qualname)
        if state is not None and state.signature != k.signature:
            raise ValueError(
                f"as_op: {qualname} is already registered for {state.signature}, not {k.signature}: a torch "
                "operator keeps its schema; register this kernel under another name (as_op(kernel, name=...))"
            )
        given = _backward_of(k, backward, save) if backward is not None else None
        if state is not None:
            # The operator now runs the kernel given, with the backward given (or
            # the built-in's; none when neither): a recompiled kernel never keeps
            # the old one's. The same kernel again (register_all) keeps its own.
            if given is not None or state.kernel != k:
                state.backward = given if given is not None else _builtin(k)
            state.kernel = k
            return state.op
        state = _Op(k, given if given is not None else _builtin(k))
        _register(state, ns, opname)
        state.op = getattr(getattr(torch.ops, ns), opname)
        _REGISTERED[qualname] = state
        return state.op


def register_all() -> dict[str, Any]:
    """``as_op`` for every kernel in the registry; returns them by name. All or
    nothing: when one fails, the operators it registered are removed again and
    the ones that existed run what they ran before, and the error propagates."""
    with _LOCK:
        before = {q: (s.kernel, s.backward) for q, s in _REGISTERED.items()}
        try:
            return {k.name: as_op(k) for k in dlbridge.list_kernels()}
        except BaseException:
            for q in [q for q in _REGISTERED if q not in before]:
                _REGISTERED.pop(q).lib._destroy()
            for q, (kernel, backward) in before.items():
                _REGISTERED[q].kernel, _REGISTERED[q].backward = kernel, backward
            raise
