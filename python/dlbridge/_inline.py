"""``dlbridge.load_inline``: your own C (and CUDA C) functions as typed, registered kernels."""

from __future__ import annotations

import os
import types
from collections.abc import Iterable, Mapping, Sequence

from . import _dlbridge

__all__ = ["InlineModule", "load_inline"]


class InlineModule(types.ModuleType):
    """The functions of one ``dlbridge.load_inline`` library, as attributes (each a
    registered ``dlbridge.Kernel``); ``__kernels__`` maps their names to them."""

    __kernels__: dict[str, _dlbridge.Kernel]

    def __init__(self, name: str, kernels: Sequence[_dlbridge.Kernel]) -> None:
        super().__init__(name, f"dlbridge.load_inline library {name!r}: " + ", ".join(k.name for k in kernels))
        self.__kernels__ = {k.name: k for k in kernels}
        for k in kernels:
            setattr(self, k.name, k)

    def __repr__(self) -> str:
        lines = [f"<dlbridge.load_inline module {self.__name__!r}:"]
        for k in self.__kernels__.values():
            lines.append(f"  {k.signature}  [{', '.join(k.devices)}]")
        return "\n".join(lines) + ">"

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__kernels__))


def load_inline(
    name: str,
    c_source: str | None = None,
    functions: Mapping[str, str] | Sequence[str] = (),
    *,
    cuda_source: str | None = None,
    extra_cflags: Sequence[str] = (),
    cuda_options: Sequence[str] = (),
    strided: Sequence[str] = (),
    sources: Sequence[str | os.PathLike[str]] = (),
) -> InlineModule:
    """Compiles your C functions (``c_source``) and/or CUDA kernels (``cuda_source``) into
    registered kernels, one per entry of ``functions``, and returns them as a module.

    ``functions`` is ``{name: signature}`` (each key must be its signature's name) or a
    list of signatures in dlbridge's signature language, e.g.
    ``{"axpy": "axpy(x: f32[N], y: mut f32[N], a: f64)"}``. Every call is checked against
    the signature (dtypes, shapes, devices, read-only ``mut`` arguments, overlaps); outputs
    (after ``->``) are allocated by the caller's framework or given with ``out=``.

    **Calling convention.** ``void f(<one pointer per tensor parameter, in order: const E*
    for an input, E* for a mut input>, <one value per scalar parameter: f64 double, i64
    long long, bool int>, <one E* per output>, <one long long per size of the signature, in
    order of first appearance; a group ...B passes its element count>)``. ``E`` is a type
    variable's name (a ``typedef`` of the call's dtype; one build per dtype combination)
    or a concrete dtype's C type: f32 ``float``, f64 ``double``, i8 ``signed char``, i16
    ``short``, i32 ``int``, i64 ``long long``, u8/bool ``unsigned char``, u16/f16/bf16
    ``unsigned short``, u32 ``unsigned int``, u64 ``unsigned long long``. Tensors are
    C-contiguous: a strided input or output is refused with an error (copy it first),
    except for the C functions named in ``strided``, which take any layout: after the
    sizes, one ``const long long*`` per tensor (parameters, then outputs) holding its
    strides in elements, one per dim (the pointers are element ``[0, .., 0]``; strides may
    be zero or negative). Broadcast groups (``*S``) are not allowed.

    ``c_source`` is compiled as C++17 with the system compiler (``$CXX``, else ``c++``),
    after the common C headers (``math.h``, ``stdint.h``, ...) and each function's prototype
    declared ``extern "C"``: the functions the signatures name get C linkage from those
    declarations, and the rest of the source is ordinary C++ (templates, ``#include
    <vector>``, overloads). A definition that does not match its signature is a compile
    error pointing at its ``c_source`` line; ``extra_cflags`` are added (and part of
    the cache key). C++ exceptions become Python exceptions. Builds are cached on disk.

    ``sources`` are C++ files (paths, as torch's ``load(sources=...)``), compiled after
    ``c_source`` and named by their paths in diagnostics; quoted ``#include``s resolve
    beside them, and a change to a file or to any header it includes makes a new build.

    ``cuda_source``: each function is an ``extern "C" __global__`` kernel with the same
    parameters, compiled by NVRTC (``cuda_options`` added), launched on the caller's stream
    (torch's current stream) with 256-thread blocks and ``ceil(n / 256)`` blocks, ``n`` the
    first output's element count (else the first tensor's). A function in both sources runs
    where its tensors are; one only in ``cuda_source`` is CUDA-only. A function belongs to
    a source when its name occurs in it (outside comments).

    Both sources are compiled here, for the first dtype of each type variable, so a broken
    source raises now. ``name`` names the library: loading it again replaces its kernels
    (and drops functions it no longer has); a function name taken by a built-in or plugin
    kernel is a ValueError.
    """
    if not isinstance(name, str):
        raise TypeError(f"load_inline: name must be a str (the library's name), got {name!r}")
    for what, text in (("c_source", c_source), ("cuda_source", cuda_source)):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"load_inline {name!r}: {what} must be a str of source text or None, got {type(text).__name__}")
    if isinstance(sources, (str, bytes, os.PathLike)) or not all(isinstance(p, (str, os.PathLike)) for p in sources):
        raise TypeError(f"load_inline {name!r}: sources must be a list of paths, got {sources!r}")
    paths = [os.path.abspath(os.fspath(p)) for p in sources]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"load_inline {name!r}: the source file {path} does not exist or is not a file")
    if c_source is None and cuda_source is None and not paths:
        raise ValueError(f"load_inline {name!r}: give c_source, cuda_source, sources, or several")
    pairs: list[tuple[str | None, str]]
    if isinstance(functions, Mapping):
        pairs = []
        for key, sig in functions.items():
            if not isinstance(key, str) or not isinstance(sig, str):
                raise TypeError(f"load_inline {name!r}: functions must map names (str) to signatures (str), got {key!r}: {sig!r}")
            pairs.append((key, sig))
    elif isinstance(functions, str):
        raise TypeError(f"load_inline {name!r}: functions must be a dict {{name: signature}} or a list of signatures, not a str")
    else:
        pairs = []
        for sig in functions:
            if not isinstance(sig, str):
                raise TypeError(f"load_inline {name!r}: a signature must be a str, got {sig!r}")
            pairs.append((None, sig))
    flags = {"extra_cflags": extra_cflags, "cuda_options": cuda_options, "strided": strided}
    for what, value in flags.items():
        # A str is a sequence too: "-O2 -g" would become eight one-character flags.
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or not all(isinstance(f, str) for f in value):
            raise TypeError(f"load_inline {name!r}: {what} must be a list of str, got {value!r}")
    kernels = _dlbridge.load_inline(
        name,
        c_source,
        pairs,
        cuda_source=cuda_source,
        extra_cflags=list(extra_cflags),
        cuda_options=list(cuda_options),
        strided=list(strided),
        sources=paths,
    )
    return InlineModule(name, kernels)
