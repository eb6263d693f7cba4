"""``inspect.signature(kernel)``, ``kernel.__doc__`` and ``help(kernel)`` for
``dlbridge.Kernel``, built from the kernel's own signature.

The call a kernel accepts is ``kernel(*params)``, ``kernel(*params, *outputs)``
(destination-passing) or ``kernel(*params, out=outputs)``; its
``inspect.Signature`` says exactly that: the inputs positional-only (tensors
annotated with their signature type as a string, ``'T[M, K]'``; scalars with
``float``, ``int`` or ``bool``), then ``*outs`` and ``out=None`` when the kernel
has outputs, and the return annotation the output type (a tuple of them for
several; ``None`` for a kernel without outputs, which writes its ``mut`` inputs).
"""

from __future__ import annotations

import inspect
import keyword
from typing import Any

_SCALARS = {"f64": float, "i64": int, "bool": bool}


def kernel_of(kernel: Any, who: str) -> Any:
    """The ``dlbridge.Kernel`` that ``kernel`` is, names (a registered kernel's
    name) or holds (``ElementwiseKernel``, ``ReductionKernel``, ``RawKernel``);
    a TypeError naming ``who`` otherwise."""
    import dlbridge

    if isinstance(kernel, str):
        return dlbridge.get_kernel(kernel)
    if isinstance(kernel, dlbridge.Kernel):
        return kernel
    inner = getattr(kernel, "kernel", None)
    if isinstance(inner, dlbridge.Kernel):
        return inner
    raise TypeError(f"{who}: expected a dlbridge.Kernel, a kernel's name or a compiled kernel, not {type(kernel).__name__}")


def _param_name(name: str, taken: set[str]) -> str:
    # Positional-only names never reach a call, so a signature name that is a
    # Python keyword or clashes with `outs`/`out` only gets an underscore.
    while keyword.iskeyword(name) or name in taken:
        name += "_"
    return name


def signature_of(kernel: Any) -> inspect.Signature:
    """The ``inspect.Signature`` of a call of ``kernel``."""
    P = inspect.Parameter
    outputs = kernel.outputs
    reserved = {"outs", "out"} if outputs else set()
    params, taken = [], set(reserved)
    for p in kernel.params:
        name = _param_name(p.name, taken)
        taken.add(name)
        annotation = _SCALARS.get(p.dtype, p.annotation) if p.kind == "scalar" else p.annotation
        params.append(P(name, P.POSITIONAL_ONLY, annotation=annotation))
    if not outputs:
        return inspect.Signature(params, return_annotation=None)
    types = [o.annotation for o in outputs]
    ret = types[0] if len(types) == 1 else f"tuple[{', '.join(types)}]"
    params.append(P("outs", P.VAR_POSITIONAL, annotation=" | ".join(dict.fromkeys(types))))
    params.append(P("out", P.KEYWORD_ONLY, default=None, annotation=f"{ret} | None"))
    return inspect.Signature(params, return_annotation=ret)


def doc_of(kernel: Any) -> str:
    """The signature text, the description and how the kernel is called."""
    params = ", ".join(p.name for p in kernel.params)
    outs = ", ".join(o.name for o in kernel.outputs)
    lines = [kernel.signature, ""]
    if kernel.doc:
        lines += [kernel.doc, ""]
    if outs:
        lines.append(
            f"Call as {kernel.name}({params}): the outputs ({outs}) are allocated by the first "
            f"tensor argument's framework and returned; {kernel.name}({params}, {outs}) or "
            f"{kernel.name}({params}, out={outs if len(kernel.outputs) == 1 else '(' + outs + ')'}) "
            "writes into given outputs and returns them."
        )
    else:
        mutated = [p.name for p in kernel.params if p.mutable]
        writes = f"; writes {', '.join(mutated)} in place" if mutated else ""
        lines.append(f"Call as {kernel.name}({params}){writes}; returns None.")
    if kernel.dtypes:
        tvs = "; ".join(f"{t}: {' | '.join(ds)}" for t, ds in kernel.dtypes.items())
        lines.append(f"Type variables: {tvs}.")
    lines.append(f"Devices: {', '.join(kernel.devices)}.")
    return "\n".join(lines)


class _PerKernel:
    """A descriptor: ``compute(kernel)`` on a Kernel, ``on_class`` on the class
    itself (so ``Kernel.__doc__`` stays the class docstring and
    ``inspect.signature(Kernel)`` is not confused by an instance attribute)."""

    def __init__(self, compute: Any, on_class: Any) -> None:
        self.compute = compute
        self.on_class = on_class

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self.on_class if obj is None else self.compute(obj)


def install(kernel_type: type) -> None:
    """Gives ``kernel_type`` (``dlbridge.Kernel``) its per-kernel ``__doc__`` and ``__signature__``."""
    if isinstance(kernel_type.__dict__.get("__signature__"), _PerKernel):
        return
    class_doc = kernel_type.__doc__
    kernel_type.__doc__ = _PerKernel(doc_of, class_doc)  # type: ignore[assignment]
    kernel_type.__signature__ = _PerKernel(signature_of, None)  # type: ignore[attr-defined]
