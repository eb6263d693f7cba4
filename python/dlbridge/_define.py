"""Tensor Comprehensions' ``define``: the comprehension language on every framework's tensors.

``matmul = dlbridge.define(lang, name="matmul"); out = matmul(mat1, mat2)`` is TC's own
line with ``dlbridge`` for ``tc``::

    def matmul(float(M,N) A, float(N,K) B) -> (output) {
      output(i, j) +=! A(i, kk) * B(kk, j)
    }

Each ``def`` becomes a registered kernel whose signature comes from the text (size
symbols are dims, every floating parameter shares the type ``T`` of f32, f64, f16 or
bf16, the outputs' shapes follow from TC's range inference), so it runs on torch, NumPy,
CuPy and JAX arrays, ``dlbridge.Array`` and tch tensors, on the CPU and on CUDA, with
outputs made by the caller's framework. ``dlbridge.torch.as_op`` (and
``dlbridge.jax.as_op``) of a definition differentiate it: the backward is derived from
the comprehension, not written by hand. The language is described in docs/tc.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from . import _dlbridge, _tc_grad

__all__ = ["Definitions", "define"]


class Definitions:
    """Every definition of one text, as attributes (``defs.matmul``), by name
    (``defs["matmul"]``) and in order (``for kernel in defs``)."""

    __slots__ = ("__kernels",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.__kernels = dict(pairs)

    def __getattr__(self, name: str) -> Any:
        # Only for names the object itself does not have: the definitions'.
        kernels = object.__getattribute__(self, "_Definitions__kernels")
        try:
            return kernels[name]
        except KeyError:
            raise AttributeError(f"no `def {name}` here (the text defines {', '.join(kernels)})") from None

    def __getitem__(self, name: str) -> Any:
        try:
            return self.__kernels[name]
        except KeyError:
            raise KeyError(f"no `def {name}` here (the text defines {', '.join(self.__kernels)})") from None

    def __iter__(self) -> Iterator[Any]:
        return iter(self.__kernels.values())

    def __len__(self) -> int:
        return len(self.__kernels)

    def __dir__(self) -> list[str]:
        return sorted(set(object.__dir__(self)) | set(self.__kernels))

    def __repr__(self) -> str:
        return f"<dlbridge.Definitions {', '.join(self.__kernels)}>"


def define(lang: str, name: str | None = None) -> Any:
    """Every ``def`` of ``lang`` as a kernel: with ``name``, that definition's kernel
    (TC's ``tc.define(lang, name="matmul")``); without it, a :class:`Definitions`
    with one attribute per ``def``.

    Each is registered under its name (``dlbridge.get_kernel``, ``dlbridge list``, Rust
    and tch see it); a name a built-in holds is only a label, as for CuPy's kernels:
    the definition is registered as ``name_2`` (its ``kernel.name``) and the built-in
    stays reachable. Defining a name again replaces the earlier definition. A parse
    error gives the line and column; an index whose range cannot be inferred is named
    with the accesses that leave it open.
    """
    if not isinstance(lang, str):
        raise TypeError(f"define: the language text must be a str, not {type(lang).__name__}")
    defined = _dlbridge.tc_define(lang)
    for _, kernel, backward, why in defined:
        _tc_grad.record(kernel, backward, why)
    pairs = [(def_name, kernel) for def_name, kernel, _, _ in defined]
    if name is None:
        return Definitions(pairs)
    for def_name, kernel in pairs:
        if def_name == name:
            return kernel
    raise ValueError(f"define: the text has no `def {name}` (it defines {', '.join(n for n, _ in pairs)})")
