"""The derived backwards of ``dlbridge.define``'s kernels, for every framework that
differentiates them (``dlbridge.torch``, ``dlbridge.jax``).

Each definition ``NAME`` comes with ``NAME_backward``, derived from its statements
(see docs/tc.md): it takes the definition's inputs and ``grad_<output>`` per output
and returns ``grad_<input>`` per floating-point input first (scratch tensors after;
``grad_<input>_2`` where the definition has a tensor of that name).
A framework's operator of the definition calls that kernel as an operator of the same
framework, so the backward traces (``torch.compile``, ``jax.jit``) like the forward.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

# Per kernel (a dlbridge.Kernel is equal to another handle of the same registered
# kernel, and weakly referenced here): (its backward kernel or None, why there is
# none). A definition made again under the same name is another kernel with a
# record of its own, so a handle kept from before still gets its own backward.
_RECORDS: weakref.WeakKeyDictionary[Any, tuple[Any, str]] = weakref.WeakKeyDictionary()
# The latest kernel of each name, held: its record lives while the registry
# holds the kernel, whoever else holds it.
_LATEST: dict[str, Any] = {}
_LOCK = threading.Lock()


def record(kernel: Any, backward: Any, why: str) -> None:
    """Remembers the backward derived for ``kernel`` (None, and why, where there is none)."""
    with _LOCK:
        _RECORDS[kernel] = (backward, why)
        _LATEST[kernel.name] = kernel
        if backward is not None:
            # A derived backward is a first derivative: differentiating it
            # again is an error that says so.
            _RECORDS[backward] = (None, f"{backward.name} is the derived backward of {kernel.name}, a first derivative")
            _LATEST[backward.name] = backward


def _entry(kernel: Any) -> tuple[Any, str] | None:
    with _LOCK:
        return _RECORDS.get(kernel)


def why_not(kernel: Any) -> str | None:
    """Why a defined kernel has no derived backward; None for one that has one, or
    a kernel ``dlbridge.define`` did not make."""
    entry = _entry(kernel)
    if entry is None or entry[0] is not None:
        return None
    return entry[1]


def rule(kernel: Any, as_op: Callable[[Any], Any]) -> Callable[..., Any] | None:
    """``backward(saved, *output_grads)`` for a kernel ``dlbridge.define`` made,
    calling its derived backward through ``as_op`` (the framework's own); None for
    any other kernel, or one without a derived backward."""
    entry = _entry(kernel)
    if entry is None or entry[0] is None:
        return None
    op = as_op(entry[0])
    params = [p.name for p in kernel.params]
    # The backward's first outputs are the floating inputs' gradients (type
    # `T`), in order: by position, since a name the definition uses itself
    # (a parameter called `grad_A`) is taken by another.
    position = itertools.count()
    slots = [next(position) if p.dtype == "T" else None for p in kernel.params]

    def backward(saved: Any, *grads: Any) -> tuple[Any, ...]:
        result = op(*(saved[p] for p in params), *grads)
        result = result if isinstance(result, tuple) else (result,)
        return tuple(None if i is None else result[i] for i in slots)

    return backward
