"""The derived backwards of ``dlbridge.define``'s kernels, for every framework that
differentiates them (``dlbridge.torch``, ``dlbridge.jax``).

Each definition ``NAME`` comes with ``NAME_backward``, derived from its statements
(see docs/tc.md): it takes the definition's inputs and ``grad_<output>`` per output
and returns ``grad_<input>`` per floating-point input first (scratch tensors after).
A framework's operator of the definition calls that kernel as an operator of the same
framework, so the backward traces (``torch.compile``, ``jax.jit``) like the forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# kernel name -> (its signature, its backward kernel or None, why there is none)
_RECORDS: dict[str, tuple[str, Any, str]] = {}


def record(kernel: Any, backward: Any, why: str) -> None:
    """Remembers the backward derived for ``kernel`` (None, and why, where there is none)."""
    _RECORDS[kernel.name] = (kernel.signature, backward, why)


def why_not(kernel: Any) -> str | None:
    """Why a defined kernel has no derived backward; None for one that has one, or
    a kernel ``dlbridge.define`` did not make."""
    entry = _RECORDS.get(kernel.name)
    if entry is None or entry[0] != kernel.signature or entry[1] is not None:
        return None
    return entry[2]


def rule(kernel: Any, as_op: Callable[[Any], Any]) -> Callable[..., Any] | None:
    """``backward(saved, *output_grads)`` for a kernel ``dlbridge.define`` made,
    calling its derived backward through ``as_op`` (the framework's own); None for
    any other kernel, or one without a derived backward."""
    entry = _RECORDS.get(kernel.name)
    if entry is None or entry[0] != kernel.signature or entry[1] is None:
        return None
    op = as_op(entry[1])
    params = [p.name for p in kernel.params]
    position = {o.name: i for i, o in enumerate(entry[1].outputs)}
    slots = [position.get(f"grad_{p}") for p in params]

    def backward(saved: Any, *grads: Any) -> tuple[Any, ...]:
        result = op(*(getattr(saved, p) for p in params), *grads)
        result = result if isinstance(result, tuple) else (result,)
        return tuple(None if i is None else result[i] for i in slots)

    return backward
