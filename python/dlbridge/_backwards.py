"""The built-in kernels' backwards, once, for every framework that
differentiates them (``dlbridge.torch``, ``dlbridge.jax``).

Each backward is written against ``ops``, a framework's handful of array
operations (the framework's own operators ``*``, ``/``, ``-`` aside):
``mul`` and ``matmul`` (dlbridge's kernels as that framework's operations),
``where``, ``zeros_like``, ``erf``, ``exp``, ``expand(g, shape)``,
``unsqueeze_last(g)``, ``sum_last_keepdim(x)`` and ``mT(a)`` (the last two
dims swapped). A backward takes what the forward saved (``s.<name>``, and
``s.shapes[name]`` for every tensor) and the outputs' gradients, and returns
the inputs' gradients in parameter order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple


class Ops(NamedTuple):
    """A framework's array operations the rules use (see the module's docs)."""

    mul: Callable[[Any, Any], Any]
    matmul: Callable[[Any, Any], Any]
    where: Callable[[Any, Any, Any], Any]
    zeros_like: Callable[[Any], Any]
    erf: Callable[[Any], Any]
    exp: Callable[[Any], Any]
    expand: Callable[[Any, Any], Any]
    unsqueeze_last: Callable[[Any], Any]
    sum_last_keepdim: Callable[[Any], Any]
    mT: Callable[[Any], Any]  # noqa: N815 (torch's name)


class Entry(NamedTuple):
    """One built-in's backward: the signature it was written for (a kernel of
    that name with another signature gets none), what it saves, and the rule."""

    signature: str
    saves: tuple[str, ...]
    rule: Callable[[Any, Any, Any], Any]  # (ops, saved, grad) -> grads


class Saved:
    """What a backward sees: the inputs, outputs and scalars of the forward's
    signature that it saves, by name (``saved.x``, ``saved.y``,
    ``saved.alpha``, or ``saved["x"]``, which also reaches a tensor named
    ``shapes``), and ``saved.shapes[name]``, every tensor's shape."""

    def __init__(self, values: Mapping[str, Any], shapes: Mapping[str, Any]) -> None:
        self.__dict__.update(values)
        self.__values = dict(values)
        self.shapes = dict(shapes)

    def __getitem__(self, name: str) -> Any:
        return self.__values[name]

    def __repr__(self) -> str:
        return f"Saved({', '.join(self.__values)})"


def as_grads(k: Any, result: Any, needs: Sequence[bool] | None = None) -> tuple[Any, ...]:
    """A backward's result (a tuple in parameter order, one value, or a dict by
    name) as one gradient per parameter (None where it gave none). A shorter
    tuple holds the gradients of the inputs that need one (``needs``, in
    order), or of the tensor parameters: scalars, and tensors made of Python
    scalars, get none."""
    names = [p.name for p in k.params]
    if isinstance(result, Mapping):
        unknown = set(result) - set(names)
        if unknown:
            raise ValueError(f"{k.name} backward: gradients for {sorted(unknown)}, which are not inputs of {k.signature}")
        return tuple(result.get(n) for n in names)
    if not isinstance(result, (tuple, list)):
        result = (result,)
    if len(result) == len(names):
        return tuple(result)
    candidates = [] if needs is None else [[n for n, need in zip(names, needs) if need]]
    candidates.append([p.name for p in k.params if p.kind == "tensor"])
    for takes in candidates:
        if len(result) == len(takes):
            by_name = dict(zip(takes, result))
            return tuple(by_name.get(n) for n in names)
    raise ValueError(
        f"{k.name} backward: returned {len(result)} gradients; the kernel has {len(names)} inputs ({', '.join(names)})"
    )


def _gelu_grad(ops: Any, x: Any) -> Any:
    cdf = 0.5 * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))
    pdf = ops.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return cdf + x * pdf


BUILTINS: dict[str, Entry] = {
    "add": Entry("add<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])", (),
                 lambda ops, s, g: (g, g)),
    "sub": Entry("sub<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])", (),
                 lambda ops, s, g: (g, -g)),
    "mul": Entry("mul<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])", ("a", "b"),
                 lambda ops, s, g: (ops.mul(g, s.b), ops.mul(g, s.a))),
    "div": Entry("div<T: f32|f64|f16|bf16|i32|i64>(a: T[...S], b: T[...S]) -> (out: T[...S])", ("b", "out"),
                 lambda ops, s, g: (g / s.b, -g * s.out / s.b)),
    "relu": Entry("relu<T: f32|f64|f16|bf16|i32|i64>(x: T[...S]) -> (y: T[...S])", ("y",),
                  lambda ops, s, g: ops.where(s.y > 0, g, ops.zeros_like(g))),
    "gelu": Entry("gelu<T: f32|f64|f16|bf16>(x: T[...S]) -> (y: T[...S])", ("x",),
                  lambda ops, s, g: g * _gelu_grad(ops, s.x)),
    "softmax": Entry("softmax<T: f32|f64|f16|bf16>(x: T[...B, N]) -> (y: T[...B, N])", ("y",),
                     lambda ops, s, g: s.y * (g - ops.sum_last_keepdim(g * s.y))),
    "matmul": Entry("matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])", ("a", "b"),
                    lambda ops, s, g: (ops.matmul(g, ops.mT(s.b)), ops.matmul(ops.mT(s.a), g))),
    "sum": Entry("sum<T: f32|f64|f16|bf16|i32|i64>(x: T[...B, N]) -> (y: T[...B])", (),
                 lambda ops, s, g: ops.expand(ops.unsqueeze_last(g), s.shapes["x"])),
    "mean": Entry("mean<T: f32|f64|f16|bf16>(x: T[...B, N]) -> (y: T[...B])", (),
                  lambda ops, s, g: ops.expand(ops.unsqueeze_last(g), s.shapes["x"]) / s.shapes["x"][-1]),
    "sum_all": Entry("sum_all<T: f32|f64|f16|bf16|i32|i64>(x: T[...S]) -> (y: T[])", (),
                     lambda ops, s, g: ops.expand(g, s.shapes["x"])),
    "mean_all": Entry("mean_all<T: f32|f64|f16|bf16>(x: T[...S]) -> (y: T[])", (),
                      lambda ops, s, g: ops.expand(g, s.shapes["x"]) / math.prod(s.shapes["x"])),
    "copy": Entry("copy<T: f32|f64|f16|bf16|i8|i16|i32|i64|u8|u16|u32|u64|bool|c64|c128>(x: T[...S]) -> (y: T[...S])", (),
                  lambda ops, s, g: g),
}  # fmt: skip


def builtin(name: str, signature: str) -> Entry | None:
    """The backward of the built-in kernel ``name``, if its signature is the
    one the backward was written for."""
    entry = BUILTINS.get(name)
    return entry if entry is not None and entry.signature == signature else None
