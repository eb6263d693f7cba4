"""dlbridge kernels as JAX functions: eager, under ``jax.jit``, ``jax.vmap``
and ``jax.grad``.

    >>> import jax, jax.numpy as jnp
    >>> import dlbridge.jax
    >>> add = dlbridge.jax.as_op("add")
    >>> jax.jit(lambda x: add(x, x))(jnp.arange(3.0))
    Array([0., 2., 4.], dtype=float32)

``as_op(kernel)`` returns a function of JAX arrays that lowers to one XLA FFI
custom call, ``custom_call @dlbridge``, into dlbridge's own handler: XLA passes
its buffers, the handler runs the kernel through the registry's checks. No
Python runs in the call and nothing goes through the host. The outputs' shapes
and dtypes come from the kernel's signature when the call is traced
(``Kernel.abstract_outputs``), so a mismatch is an error at trace time naming
the kernel and the argument.

- Tensor parameters take JAX arrays (or anything ``jnp.asarray`` takes);
  scalar parameters take Python numbers, fixed when the call is traced (they
  become attributes of the custom call, as ``jax.jit``'s static arguments).
- A kernel's outputs are returned (one array, or a tuple); a kernel with
  ``mut`` parameters returns their new values after its outputs (JAX arrays
  are never written: XLA hands the kernel a copy it may write, or the
  argument's own buffer when it was donated).
- ``jax.grad``: the built-ins differentiate with the rules their torch
  operators use (``dlbridge._backwards``); any kernel takes ``backward=``.
- ``jax.vmap`` batches a kernel whose tensors all lead with one ``...`` group
  (``add``, ``relu``, ``softmax``, ``sum``) in one call of the batched shapes;
  any other (``matmul``) runs once per batch element.
- CPU always; CUDA when JAX has a GPU (XLA's stream, the call's device).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import dlbridge

from . import _backwards, _compile, _dlbridge, _tc_grad
from ._backwards import Saved, as_grads
from ._introspect import kernel_of

TARGET = "dlbridge"
"""The XLA FFI target name every call lowers to."""

_KERNEL_ATTR = "dlbridge_kernel"
_HANDLE_ATTR = "dlbridge_kernel_handle"
_DIGEST_ATTR = "dlbridge_kernel_digest"
_NUMPY_SCALARS = {"f64": np.float64, "i64": np.int64, "bool": np.bool_}


@functools.cache
def platforms() -> tuple[str, ...]:
    """Registers dlbridge's handler with XLA (once) and returns the platforms
    it serves: ``("cpu",)``, and ``"cuda"`` where JAX has a CUDA GPU."""
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(_dlbridge.xla_ffi_handler("cpu")), platform="cpu")
    served = ["cpu"]
    try:
        cuda = bool(jax.devices("cuda"))
    except RuntimeError:  # no CUDA backend in this jaxlib
        cuda = False
    if cuda:
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(_dlbridge.xla_ffi_handler("cuda")), platform="CUDA")
        served.append("cuda")
    return tuple(served)


# Registered on import: a program deserialised in this process (`jax.export`)
# finds the handler even before any `as_op` of this process's runs.
platforms()


def _lead(kernel: dlbridge.Kernel) -> str | None:
    """The one group every tensor (parameters and outputs) leads with, if any."""
    leads = {(d[0] if d else None) for d in (t.dims for t in [*kernel.params, *kernel.outputs] if t.kind == "tensor")}
    lead = leads.pop() if len(leads) == 1 else None
    return lead if isinstance(lead, str) and lead[:1] in (".", "*") else None


def _vmap_method(kernel: dlbridge.Kernel) -> str:
    """``broadcast_all`` (one call on the batched shapes) where that is known
    to compute each batch element on its own: every tensor leads with one
    group, and the kernel is elementwise (a ``*`` broadcast group, which only
    ``ElementwiseKernel`` declares) or a built-in (each treats a leading
    ``...`` group element by element). ``sequential`` (one call per batch
    element) otherwise: a ``load_inline`` or plugin kernel may read across
    its ``...`` group, and an ``ElementwiseKernel`` that reads its index
    ``i``, its size (``n``, ``_ind``) or a raw input sees the batch's."""
    lead = _lead(kernel)
    built_in = all(origin.startswith("built-in") for _, origin in kernel.origins)
    # An ElementwiseKernel that reads `i`, `n`, `_ind` or a raw input sees
    # positions across the whole batch in one call: it goes one call per element.
    if lead is not None and ((lead.startswith("*") and kernel.per_element) or built_in):
        return "broadcast_all"
    return "sequential"


def _scalar(kernel: dlbridge.Kernel, p: Any, value: Any) -> Any:
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{kernel.name}: argument {p.name}: a {p.dtype} scalar is fixed when the call is traced; "
            "pass a Python number (a traced value cannot be one)"
        )
    boolean = isinstance(value, (bool, np.bool_))
    ok = {
        "bool": boolean,
        "i64": not boolean and isinstance(value, (int, np.integer)),
        "f64": not boolean and isinstance(value, (int, float, np.integer, np.floating)),
    }[p.dtype]
    if not ok:
        raise TypeError(f"{kernel.name}: argument {p.name}: expected {'an' if p.dtype[0] in 'aeiou' else 'a'} {p.dtype} scalar, got {type(value).__name__} {_compile._shown(value)}")
    if p.dtype == "i64" and not -(2**63) <= int(value) < 2**63:
        raise OverflowError(f"{kernel.name}: argument {p.name}: {_compile._shown(value)} is out of the range of an i64 scalar")
    if p.dtype == "f64" and isinstance(value, (int, np.integer)):
        try:
            float(value)
        except OverflowError:
            raise OverflowError(f"{kernel.name}: argument {p.name}: {_compile._shown(value)} is out of the range of an f64 scalar") from None
    return _NUMPY_SCALARS[p.dtype](value)


# NumPy's dtype for each of dlbridge's (bf16 is JAX's own).
_NUMPY_DTYPES = {
    "bool": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
    "f16": np.float16, "bf16": jnp.bfloat16, "f32": np.float32, "f64": np.float64,
    "c64": np.complex64, "c128": np.complex128,
}


def _tensor_from_number(kernel: dlbridge.Kernel, p: Any, value: Any) -> Any:
    """A Python or NumPy number given for a tensor parameter of one dtype
    (``int32 s`` of an ElementwiseKernel), as an array of that dtype, checked
    against its range as the kernel's own call checks it (``jnp.asarray``
    would take ``2**40`` as int64 and JAX, without x64, cut it to int32; a
    float16 would take ``1e5`` as infinity)."""
    if not isinstance(value, (bool, int, float, complex, np.generic)) or len(p.dtypes) != 1:
        return value
    name = p.dtypes[0]
    boolean = isinstance(value, (bool, np.bool_))
    integer = isinstance(value, (int, np.integer)) and not boolean
    real = integer or isinstance(value, (float, np.floating))
    # Only a number of the parameter's kind (a float for an int32 parameter
    # stays a float, which the kernel refuses, as its own call does).
    if name == "bool":
        ok = boolean
    elif name[0] in "iu":
        ok = integer
    elif name[0] in "fb":
        ok = real
    else:
        ok = not boolean
    if not ok:
        return value
    _compile._check_scalar(kernel.name, p.name, value, name)
    return np.asarray(value, dtype=_NUMPY_DTYPES[name])


@functools.cache
def _registered(name: str) -> Callable[..., Any]:
    return as_op(name)


# The array operations the built-in backwards are written against, in JAX
# (dlbridge's own `mul` and `matmul` among them).
_JAX_OPS = _backwards.Ops(
    mul=lambda a, b: _registered("mul")(a, b), matmul=lambda a, b: _registered("matmul")(a, b), mT=lambda a: jnp.swapaxes(a, -1, -2),
    where=jnp.where, zeros_like=jnp.zeros_like, erf=jax.scipy.special.erf, exp=jnp.exp, expand=jnp.broadcast_to,
    unsqueeze_last=lambda g: g[..., None], sum_last_keepdim=lambda x: x.sum(-1, keepdims=True),
)


def _sum_to(g: Any, shape: tuple[int, ...]) -> Any:
    """A gradient of a broadcast input, summed back to that input's shape."""
    if g.shape == shape:
        return g
    g = g.sum(axis=tuple(range(g.ndim - len(shape))))
    return g.sum(axis=tuple(d for d, n in enumerate(shape) if n == 1 and g.shape[d] != 1), keepdims=True)


def _with_backward(k: dlbridge.Kernel, call: Callable[..., Any], rule: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` with ``rule(saved, *output_grads)`` as its derivative
    (``jax.custom_vjp``; scalar parameters are not differentiated)."""
    params, outputs = list(k.params), list(k.outputs)
    scalars = tuple(i for i, p in enumerate(params) if p.kind == "scalar")

    @functools.partial(jax.custom_vjp, nondiff_argnums=scalars)
    def differentiable(*args: Any) -> Any:
        return call(*args)

    # The forward pass as the backward sees it: differentiating it (a derivative
    # of the derivative) is an error that names the kernel, not JAX's generic one.
    @functools.partial(jax.custom_jvp, nondiff_argnums=scalars)
    def once(*args: Any) -> Any:
        return call(*args)

    @once.defjvp
    def _twice(*_: Any) -> Any:
        raise NotImplementedError(
            f"{k.name}: a derivative of its derivative (jax.grad of jax.grad, jax.hessian) is not "
            "available: dlbridge.jax.as_op differentiates once, in reverse mode"
        )

    def forward(*args: Any) -> Any:
        out = once(*args)
        tensors = tuple(jnp.asarray(a) for a, p in zip(args, params) if p.kind == "tensor")
        return out, (tensors, out if isinstance(out, tuple) else (out,))

    def backward(*rest: Any) -> tuple[Any, ...]:
        fixed, (tensors, outs), g = rest[: len(scalars)], rest[-2], rest[-1]
        values, shapes, tensor_it, scalar_it = {}, {}, iter(tensors), iter(fixed)
        for p in params:
            values[p.name] = next(tensor_it) if p.kind == "tensor" else next(scalar_it)
            if p.kind == "tensor":
                shapes[p.name] = values[p.name].shape
        for o, v in zip(outputs, outs, strict=True):
            values[o.name], shapes[o.name] = v, v.shape
        # JAX's cotangent of an integer or bool output is float0 (it has no
        # gradient); a backward takes zeros of the output's own dtype there
        # (zeros_like keeps an int64 that JAX without x64 would make int32).
        cotangents = tuple(
            jnp.zeros_like(v) if c.dtype == jax.dtypes.float0 else c
            for c, v in zip(g if isinstance(g, tuple) else (g,), outs, strict=True)
        )
        grads = as_grads(k, rule(Saved(values, shapes), *cotangents))
        return tuple(
            jnp.zeros_like(values[p.name]) if gr is None else _sum_to(jnp.asarray(gr), shapes[p.name])
            for p, gr in zip(params, grads, strict=True)
            if p.kind == "tensor"
        )

    differentiable.defvjp(forward, backward)

    def op(*args: Any) -> Any:
        # The scalars' own errors, before custom_vjp sees a traced one.
        for i in scalars[: len(args)]:
            _scalar(k, params[i], args[i])
        return differentiable(*args)

    return op


def _no_backward(k: dlbridge.Kernel, why: str) -> Callable[..., Any]:
    """A backward rule that says why ``k`` (a ``dlbridge.define`` kernel) has none."""

    def rule(saved: Any, *grads: Any) -> Any:
        raise NotImplementedError(
            f"{k.name} has no backward: give one with dlbridge.jax.as_op(kernel, backward=...), "
            f"or differentiate around it (none was derived: {why})"
        )

    return rule


def as_op(kernel: Any, *, backward: Callable[..., Any] | None = None, vmap_method: str | None = None) -> Callable[..., Any]:
    """``kernel`` (a ``dlbridge.Kernel``, a registered kernel's name, or an
    ``ElementwiseKernel`` / ``ReductionKernel`` / ``RawKernel``) as a JAX
    function: see the module's docs. ``backward(saved, *output_grads)``
    (``saved.<input or output name>``, ``saved.shapes[name]``) returns the
    inputs' gradients, in parameter order or as a dict by name; the built-ins
    bring their own (``dlbridge.torch``'s, the same rules). ``vmap_method``
    overrides how ``jax.vmap`` batches it (``jax.ffi.ffi_call``'s values; by
    default ``broadcast_all`` where that is known to be right, else
    ``sequential``)."""
    k = kernel_of(kernel, "dlbridge.jax.as_op")
    params, n_out = list(k.params), len(k.outputs)
    if clash := next((p.name for p in params if p.name in (_KERNEL_ATTR, _HANDLE_ATTR, _DIGEST_ATTR)), None):
        raise ValueError(f"as_op({k.name}): a parameter named {clash!r} collides with the custom call's own attribute")
    tensors = [p for p in params if p.kind == "tensor"]
    muts = [i for i, p in enumerate(tensors) if p.mutable]
    aliases = {i: n_out + j for j, i in enumerate(muts)} or None
    vmap_method = vmap_method or _vmap_method(k)
    # A `*` group broadcasts from the right: tensors of lower rank get leading
    # 1s, so that a batch dim put in front lines up with every tensor's.
    pad = (_lead(k) or "").startswith("*")
    names = ", ".join(p.name for p in params)

    # The custom call runs this very kernel (held by this closure), even after
    # its name is given to another (dlbridge.define again).
    handle = np.int64(k._handle())
    # What the kernel is: a program serialised here and run in another process
    # (jax.export) runs the same kernel there, or fails saying which it found.
    digest = k._digest()

    def op(*args: Any) -> Any:
        if len(args) != len(params):
            raise TypeError(f"{k.name}() takes {len(params)} arguments ({names}), got {len(args)}")
        platforms()
        arrays, shapes, abstract, attrs = [], [], [], {_KERNEL_ATTR: k.name, _HANDLE_ATTR: handle, _DIGEST_ATTR: digest}
        rank = max((jnp.ndim(a) for p, a in zip(params, args) if p.kind == "tensor"), default=0) if pad else 0
        for p, a in zip(params, args, strict=True):
            if p.kind == "tensor":
                x = jnp.asarray(_tensor_from_number(k, p, a))
                shapes.append(x.shape)
                x = x.reshape((1,) * (rank - x.ndim) + x.shape) if x.ndim < rank else x
                arrays.append(x)
                abstract.append((tuple(x.shape), x.dtype.name))
            else:
                v = _scalar(k, p, a)
                abstract.append(v.item())
                attrs[p.name] = v
        specs = k.abstract_outputs(*abstract)
        results = [jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype)) for shape, dtype in specs]
        results += [jax.ShapeDtypeStruct(arrays[i].shape, arrays[i].dtype) for i in muts]
        if not results:
            raise TypeError(f"{k.name}: a kernel with neither outputs nor `mut` parameters has nothing to return to JAX")
        out = list(jax.ffi.ffi_call(TARGET, results, vmap_method=vmap_method, input_output_aliases=aliases)(*arrays, **attrs))
        for j, i in enumerate(muts):  # a `mut` tensor's new value in its own shape (padding undone)
            out[n_out + j] = out[n_out + j].reshape(shapes[i])
        return out[0] if len(results) == 1 else tuple(out)

    rule = backward
    if rule is None and (entry := _backwards.builtin(k.name, k.signature)) is not None:
        rule = functools.partial(entry.rule, _JAX_OPS)
    if rule is None:
        rule = _tc_grad.rule(k, as_op)  # a dlbridge.define kernel's derived backward
    if rule is None and (why := _tc_grad.why_not(k)) is not None:
        rule = _no_backward(k, why)  # a definition's own reason, not JAX's generic one
    if rule is not None and muts:
        raise ValueError(f"as_op({k.name}): a backward for a kernel that writes its inputs (mut) is not supported")
    g = op if rule is None else _with_backward(k, op, rule)

    def f(*args: Any) -> Any:
        try:
            return g(*args)
        except TypeError as e:
            # JAX without x64 makes 64-bit arguments 32-bit before the kernel sees them.
            narrowed = [
                f"{p.name}: {np.dtype(d)} became {jax.dtypes.canonicalize_dtype(d)}"
                for p, a in zip(params, args)
                if p.kind == "tensor" and (d := getattr(a, "dtype", None)) is not None and jax.dtypes.canonicalize_dtype(d) != np.dtype(d)
            ]
            if not narrowed:
                raise
            raise TypeError(f"{e} (JAX keeps 64-bit types only with jax.config.update('jax_enable_x64', True): {'; '.join(narrowed)})") from e

    f.__name__ = f.__qualname__ = k.name
    f.__doc__ = f"{k.signature} on JAX arrays (dlbridge.jax.as_op)"
    f.kernel = k  # type: ignore[attr-defined]
    return f


def register_all() -> dict[str, Callable[..., Any]]:
    """``as_op`` of every registered kernel with outputs or ``mut``
    parameters, by name."""
    return {k.name: as_op(k) for k in dlbridge.list_kernels() if k.outputs or any(p.mutable for p in k.params)}
