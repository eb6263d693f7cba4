"""The rule a traced call follows (``Kernel.abstract_call``, behind ``dlbridge.torch``'s fake
implementations and JAX's abstract evaluation) against answers written apart from it.

The fake and the kernel share one rule (the registry's), so comparing them would prove
nothing. Hypothesis draws calls of every built-in kernel and of kernels compiled from source
(random sizes, broadcast shapes, transposed, sliced and expanded layouts, dtypes, a wrong size
now and then), and holds the fake's answer (refused or not; each output's shape, dtype and
strides) to rules of other origin: NumPy's broadcasting, torch's own operators on the same
tensors (TensorIterator's memory order, ``torch.matmul``'s shapes and refusals, torch's
internal-overlap test for a tensor written in place) and a table of each signature's meaning."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

import numpy as np

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


# The built-in kernels: other test modules of the same worker define kernels of their own when
# imported, and those have no expected answers here.
KERNELS = {k.name: k for k in dlbridge.list_kernels() if all(o.startswith("built-in") for _, o in k.origins)}


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
    except (TypeError, ValueError, RuntimeError, IndexError):
        return ("error",)
    outs = out if isinstance(out, tuple) else (out,) if out is not None else ()
    return [(tuple(o.shape), o.dtype, _strides(o)) for o in outs]


def _strides(t: torch.Tensor) -> tuple[Any, ...]:
    # A dim of size 0 or 1 has any stride; an empty tensor any layout.
    if t.numel() == 0:
        return ()
    return tuple(s if n > 1 else None for s, n in zip(t.stride(), t.shape))


def _row_major(shape: tuple[int, ...]) -> tuple[Any, ...]:
    return _strides(torch.empty(shape))


def _dtype_ok(k: Any, args: list[Any]) -> bool:
    """A signature's dtypes, read as a table: a concrete dtype is that dtype; every tensor of one
    type variable has the same dtype, one the variable allows."""
    bound: dict[str, torch.dtype] = {}
    for p, a in zip(k.params, args):
        if p.kind != "tensor":
            continue
        if p.dtype in TORCH_DTYPES:
            if a.dtype != TORCH_DTYPES[p.dtype]:
                return False
        elif a.dtype not in [TORCH_DTYPES.get(d) for d in p.dtypes] or bound.setdefault(p.dtype, a.dtype) != a.dtype:
            return False
    return True


def _expected(k: Any, args: list[Any]) -> Any:
    """What a call of ``k`` on ``args`` gives, by rules written apart from dlbridge's."""
    name = k.name
    if not _dtype_ok(k, args):
        return ("error",)
    tensors = [a for p, a in zip(k.params, args) if p.kind == "tensor"]
    dtype = tensors[0].dtype
    try:
        if name in ("add", "sub", "mul", "div", "maximum"):
            a, b = tensors
            if a.shape != b.shape:  # `...S` twice: equal shapes, no broadcasting
                return ("error",)
            return [(tuple(a.shape), dtype, _strides(torch.add(a, b)))]
        if name in ("relu", "gelu"):
            return [(tuple(tensors[0].shape), dtype, _strides(torch.abs(tensors[0])))]
        if name == "copy":  # a contiguous copy
            return [(tuple(tensors[0].shape), dtype, _row_major(tuple(tensors[0].shape)))]
        if name == "matmul":
            a, b = tensors
            if a.dim() != 2 or b.dim() != 2:
                return ("error",)
            shape = tuple(torch.matmul(a.to("meta"), b.to("meta")).shape)
            return [(shape, dtype, _row_major(shape))]
        if name == "softmax":
            x = tensors[0]
            return ("error",) if x.dim() < 1 else [(tuple(x.shape), dtype, _strides(torch.abs(x)))]
        if name in ("sum", "mean"):
            x = tensors[0]
            if x.dim() < 1:
                return ("error",)
            shape = tuple(torch.sum(x.to("meta"), -1).shape)
            return [(shape, dtype, _row_major(shape))]
        if name in ("sum_all", "mean_all"):
            return [((), dtype, ())]
        if name == "axpy":
            x, y = tensors
            if x.dim() != 1 or y.dim() != 1 or x.shape != y.shape or torch._debug_has_internal_overlap(y) == 1:
                return ("error",)
            return []
        if name == "fake_rules_raw":
            x, _r, y = tensors
            shape = tuple(np.broadcast_shapes(tuple(x.shape), tuple(y.shape)))
            strides = _strides(torch.add(x, y))
            return [(shape, dtype, strides), (shape, torch.float64, strides)]
        if name == "fake_rules_sum":  # y: the kept (leading) dims of x, written in place
            x, y = tensors
            if tuple(y.shape) != tuple(x.shape[: y.dim()]) or y.dim() > x.dim() or torch._debug_has_internal_overlap(y) == 1:
                return ("error",)
            return []
    except (ValueError, RuntimeError):
        return ("error",)
    raise AssertionError(f"no expected answer written for {name}: add one")


@pytest.mark.parametrize("name", sorted(KERNELS) + ["fake_rules_raw", "fake_rules_sum"])
def test_the_fake_follows_rules_written_apart_from_it(kernels, name):
    k = kernels[name]
    fake = dt.fake_of(k)

    @hypothesis.settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(calls(k))
    def check(drawn: tuple[list[Any], str]) -> None:
        args, how = drawn
        got, want = _outcome(fake, args), _expected(k, args)
        refused, fake_refused = want == ("error",), got == ("error",)
        if refused or fake_refused:
            assert refused == fake_refused, f"{name}: expected {want}, the fake {got}; {how}"
        else:
            assert got == want, f"{name}: expected {want}, the fake {got}; {how}"

    check()


def test_the_expected_answers_disagree_with_a_broken_rule(kernels):
    """The table above is not the fake's mirror: answers it gives for hand-picked calls."""
    x = torch.ones(3, 4).t()  # shape (4, 3), strides (1, 4)
    assert _expected(kernels["relu"], [x])[0][2] == (1, 4)
    assert _expected(kernels["matmul"], [torch.ones(2, 3), torch.ones(4, 5)]) == ("error",)
    assert _expected(kernels["fake_rules_sum"], [torch.ones(2, 3), torch.ones(3)]) == ("error",)
    assert _expected(kernels["fake_rules_raw"], [torch.ones(2, 1), torch.ones(1), torch.ones(3)])[0][0] == (2, 3)
