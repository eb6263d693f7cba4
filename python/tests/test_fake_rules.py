"""dlbridge.torch's fake implementations against the registry's own answers.

``dlbridge.torch.fake_of`` re-derives in Python what the Rust binding layer decides for a
call: the output shapes (signature dims, broadcasting), dtypes, memory order (an output
shaped like its inputs follows their layout) and which calls are refused. Hypothesis draws
calls of every built-in kernel and of kernels compiled from source (random sizes, broadcast
shapes, transposed, sliced and expanded layouts, dtypes, and a wrong size now and then) and
holds the fake's answer to what the real kernel does with the same tensors."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

import dlbridge

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
dt = pytest.importorskip("dlbridge.torch")

TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64, "i32": torch.int32, "i64": torch.int64}


def _source_kernels() -> list[Any]:
    return [
        # Broadcasting operands (`*S`), a raw one with its own shape, two outputs of two dtypes.
        dlbridge.ElementwiseKernel("T x, raw T r, T y", "T z, float64 w", "z = x + y + r[0]; w = (double)x", "fake_rules_raw"),
        # A reduction over trailing dims.
        dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "fake_rules_sum"),
    ]


KERNELS = {k.name: k for k in dlbridge.list_kernels()}


@pytest.fixture(scope="module")
def kernels() -> dict[str, Any]:
    out = dict(KERNELS)
    for k in _source_kernels():
        out[k.name] = dlbridge.get_kernel(k.name)
    return out


def _allowed(k: Any) -> list[torch.dtype]:
    m = re.match(r"[^<(]*<\w+: ([^>]*)>", k.signature)
    names = m.group(1).split("|") if m else list(TORCH_DTYPES)
    return [TORCH_DTYPES[n] for n in names if n in TORCH_DTYPES]


@st.composite
def calls(draw: Any, k: Any) -> tuple[list[Any], str]:
    """Arguments for one call of ``k`` and a description of how they were drawn."""
    dtypes = _allowed(k) or [torch.float32]
    dtype = draw(st.sampled_from(dtypes))
    sizes: dict[str, Any] = {}
    how = []

    def size(sym: str) -> int:
        if sym not in sizes:
            sizes[sym] = draw(st.integers(0, 4))
        return sizes[sym]

    def rest(sym: str) -> tuple[int, ...]:
        if sym not in sizes:
            sizes[sym] = tuple(draw(st.lists(st.integers(1, 4), max_size=3)))
        return sizes[sym]

    args: list[Any] = []
    for p in k.params:
        if p.kind != "tensor":
            kind = str(p.dtype)
            args.append(draw(st.booleans()) if kind == "bool" else draw(st.integers(-3, 3)) if kind[0] in "iu" else draw(st.floats(-2, 2)))
            continue
        shape: list[int] = []
        for d in p.dims:
            d = str(d)
            if d.startswith("*"):
                full = rest(d[1:])
                # A broadcasting operand: fewer leading dims, some dims 1.
                drop = draw(st.integers(0, len(full)))
                shape += [1 if draw(st.booleans()) else s for s in full[drop:]]
            elif d.startswith("..."):
                shape += list(rest(d[3:]))
            else:
                shape.append(size(d))
        if shape and draw(st.integers(0, 9)) == 0:
            at = draw(st.integers(0, len(shape) - 1))
            shape[at] += 1
            how.append(f"{p.name}: dim {at} one too large")
        layout = draw(st.sampled_from(["contiguous", "transposed", "sliced", "expanded"]))
        t = _tensor(shape, dtype, layout, draw)
        how.append(f"{p.name}: {tuple(t.shape)} strides {t.stride()} ({layout})")
        args.append(t)
    return args, "; ".join(how)


def _tensor(shape: list[int], dtype: torch.dtype, layout: str, draw: Any) -> torch.Tensor:
    """A tensor of ``shape`` laid out as ``layout`` says (its own memory)."""

    def filled(s: list[int]) -> torch.Tensor:
        return (torch.arange(math.prod(s)) % 7 + 1).to(dtype).reshape(s)  # no zero: div by 0 is a data error

    n = len(shape)
    if layout == "transposed" and n >= 2:
        perm = draw(st.permutations(list(range(n))))
        return filled([shape[d] for d in perm]).permute([perm.index(d) for d in range(n)])
    if layout == "sliced" and n >= 1:
        d = draw(st.integers(0, n - 1))
        wide = list(shape)
        wide[d] *= 2
        return filled(wide)[(slice(None),) * d + (slice(None, None, 2),)]
    if layout == "expanded" and n >= 1:
        d = draw(st.integers(0, n - 1))
        one = list(shape)
        one[d] = 1
        return filled(one).expand(shape)
    return filled(shape)


def _outcome(f: Any, args: list[Any]) -> Any:
    try:
        out = f(*args)
    except (TypeError, ValueError, RuntimeError, IndexError) as e:
        return ("error", type(e).__name__)
    outs = out if isinstance(out, tuple) else (out,)
    return [None if o is None else (tuple(o.shape), o.dtype, _strides(o)) for o in outs]


def _strides(t: torch.Tensor) -> tuple[Any, ...]:
    # A dim of size 0 or 1 has any stride; an empty tensor any layout.
    if t.numel() == 0:
        return ()
    return tuple(s if n > 1 else None for s, n in zip(t.stride(), t.shape))


@pytest.mark.parametrize("name", sorted(KERNELS) + ["fake_rules_raw", "fake_rules_sum"])
def test_the_fake_answers_what_the_kernel_does(kernels, name):
    k = kernels[name]
    fake = dt.fake_of(k)

    @hypothesis.settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(calls(k))
    def check(drawn: tuple[list[Any], str]) -> None:
        args, how = drawn
        got = _outcome(fake, args)
        real = _outcome(k, args)
        if real[0] == "error" or got[0] == "error":
            assert (real[0] == "error") == (got[0] == "error"), f"{name}: kernel {real}, fake {got}; {how}"
        else:
            assert got == real, f"{name}: fake {got} but the kernel {real}; {how}"

    check()
