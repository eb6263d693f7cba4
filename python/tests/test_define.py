"""``dlbridge.define``: Tensor Comprehensions' language on every framework's tensors.

TC's documented examples run as TC's documentation writes them and match torch; their
gradients are derived (torch.autograd.gradcheck in f64); errors name what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import dlbridge
import dlbridge.torch as dtorch

from conftest import ROOT

# TC's documentation examples, as written there (shared with the Rust tests).
TC_EXAMPLES = (ROOT / "kernels/compile/tests/tc_examples.tc").read_text()

DEFS = dlbridge.define(TC_EXAMPLES)


def _layernorm_as_written(x: torch.Tensor) -> torch.Tensor:
    # TC's example divides by rsqrt(var): it scales by the standard deviation.
    centered = x - x.mean(-1, keepdim=True)
    return centered * centered.pow(2).mean(-1, keepdim=True).sqrt()


def _inputs(dtype: torch.dtype = torch.float32) -> dict[str, tuple]:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    return {
        "matmul": (r(5, 7), r(7, 3)),
        "batch_matmul": (r(2, 4, 6), r(2, 6, 3)),
        "tensordot": (r(2, 3, 4, 2, 3), r(2, 4, 5, 2, 3)),
        "fully_connected": (r(4, 6), r(5, 6), r(5)),
        "fcrelu": (r(4, 6), r(5, 6), r(5)),
        "convolution": (r(2, 3, 6, 5), r(4, 3, 3, 2)),
        "group_convolution": (r(2, 2, 3, 5, 6), r(2, 4, 3, 3, 3), r(2, 4)),
        "avgpool": (r(2, 3, 6, 8),),
        "softmax": (r(4, 9),),
        "layernorm": (r(3, 2, 8),),
    }


def _reference(name: str, *x: torch.Tensor) -> torch.Tensor:
    F = torch.nn.functional
    if name == "matmul":
        return x[0] @ x[1]
    if name == "batch_matmul":
        return torch.bmm(x[0], x[1])
    if name == "tensordot":
        return torch.einsum("nabhw,nbchw->nachw", x[0], x[1])
    if name == "fully_connected":
        return F.linear(x[0], x[1], x[2])
    if name == "fcrelu":
        return F.relu(F.linear(x[0], x[1], x[2]))
    if name == "convolution":
        return F.conv2d(x[0], x[1])
    if name == "group_convolution":
        n, g, c, h, w = x[0].shape
        out = F.conv2d(x[0].reshape(n, g * c, h, w), x[1].reshape(-1, c, *x[1].shape[3:]), groups=g)
        return out.reshape(n, g, -1, *out.shape[2:]) + x[2][None, :, :, None, None]
    if name == "avgpool":
        return F.avg_pool2d(x[0], 2)
    if name == "softmax":
        return torch.softmax(x[0], -1)
    if name == "layernorm":
        return _layernorm_as_written(x[0])
    raise KeyError(name)


@pytest.mark.parametrize("name", list(_inputs()))
def test_tcs_documented_examples_match_torch(name):
    kernel = DEFS[name]
    x = _inputs()[name]
    got = kernel(*x)
    got = got[0] if isinstance(got, tuple) else got
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, _reference(name, *x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(_inputs()))
def test_tcs_documented_examples_differentiate_in_f64(name):
    op = dtorch.as_op(DEFS[name])
    x = tuple(t.requires_grad_() for t in _inputs(torch.float64)[name])
    if name == "fcrelu":  # away from relu's kink
        x[2].data += 3.0
    assert torch.autograd.gradcheck(op, x, eps=1e-6, atol=1e-5)


def test_the_seed_example_runs_as_written():
    lang = """
def matmul(float(M,N) A, float(N,K) B) -> (output) {
  output(i, j) +=! A(i, kk) * B(kk, j)
}
"""
    matmul = dlbridge.define(lang, name="matmul")
    mat1, mat2 = torch.randn(3, 4), torch.randn(4, 5)
    out = matmul(mat1, mat2)
    torch.testing.assert_close(out, mat1 @ mat2)
    # The built-in `matmul` is untouched; the definition's name is a label.
    assert matmul.name != "matmul" and matmul.name.startswith("matmul")
    assert dlbridge.get_kernel("matmul").signature.startswith("matmul<T: f32|f64>")
    assert dlbridge.get_kernel(matmul.name) is not None
    assert any(k.name == matmul.name for k in dlbridge.list_kernels())


def test_definitions_are_attributes_and_kernels_of_every_framework():
    assert isinstance(DEFS, dlbridge.Definitions)
    assert DEFS.softmax is DEFS["softmax"] and len(list(DEFS)) == 10
    x = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    o, mx, _, s = DEFS.softmax(x)
    assert isinstance(o, np.ndarray) and o.dtype == np.float64
    np.testing.assert_allclose(o, np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
    np.testing.assert_allclose(mx, x.max(1))
    a = dlbridge.asarray(np.ones((2, 3), dtype=np.float32))
    out = DEFS.matmul(a, dlbridge.asarray(np.ones((3, 4), dtype=np.float32)))
    assert isinstance(out, dlbridge.Array) and out.shape == (2, 4) and out.tolist()[0] == [3.0] * 4
    assert "(H - KH + 1)" in DEFS.convolution.signature


def test_outputs_follow_range_inference():
    x = torch.randn(1, 2, 7, 9)
    assert DEFS.avgpool(x).shape == (1, 2, 3, 4)
    w = torch.randn(3, 2, 4, 2)
    assert DEFS.convolution(x, w).shape == (1, 3, 4, 8)


def test_a_convolution_given_too_small_an_input_is_refused_by_its_rule_when_traced():
    op = dtorch.as_op(DEFS.convolution)
    x, w = torch.randn(1, 2, 2, 3), torch.randn(3, 2, 4, 2)
    want = r"convolution: output O: dim \(H - KH \+ 1\) is -1, below 0 with H = 2, KH = 4: the inputs are too small for it"
    with pytest.raises(ValueError, match=want):
        op(x, w)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=want):
        torch.compile(op, fullgraph=True)(x, w)
    with pytest.raises(ValueError, match=want), FakeTensorMode():
        op(torch.empty(1, 2, 2, 3), torch.empty(3, 2, 4, 2))


def test_an_output_dim_computed_from_input_dims_stays_symbolic_when_traced():
    op = dtorch.as_op(DEFS.convolution)
    gm = make_fx(op, tracing_mode="symbolic")(torch.randn(1, 2, 7, 9), torch.randn(3, 2, 4, 2))
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    x, w = [p.meta["val"] for p in gm.graph.nodes if p.op == "placeholder"]
    out = node.meta["val"]
    assert str(out.shape[2]) == str(x.shape[2] - w.shape[2] + 1) and str(out.shape[3]) == str(x.shape[3] - w.shape[3] + 1)
    compiled = torch.compile(op, fullgraph=True, dynamic=True)
    for h in (7, 11):
        x, w = torch.randn(1, 2, h, 9), torch.randn(3, 2, 4, 2)
        torch.testing.assert_close(compiled(x, w), DEFS.convolution(x, w), rtol=1e-4, atol=1e-4)


def test_f16_and_bf16_compute_in_f32():
    x = torch.randn(8, 33)
    for dt in (torch.float16, torch.bfloat16):
        got = DEFS.softmax(x.to(dt))[0]
        assert got.dtype == dt
        torch.testing.assert_close(got.float(), torch.softmax(x.to(dt).float(), -1), rtol=1e-2, atol=1e-2)


def test_a_fused_definition_with_integer_tensors_and_conditions():
    (k,) = dlbridge.define(
        """
        def clipped_gather(float(N) X, int64(M) idx_bound, float(M, N) W) -> (Y) {
          # where x is positive, weight it; else 0
          Y(m) +=! X(n) > 0 && n < idx_bound(m) ? X(n) * W(m, n) : 0.0
        }
        """
    )
    x, w = torch.randn(10, dtype=torch.float64), torch.randn(3, 10, dtype=torch.float64)
    bound = torch.tensor([2, 5, 10])
    mask = (x > 0) & (torch.arange(10)[None, :] < bound[:, None])
    torch.testing.assert_close(k(x, bound, w), torch.where(mask, x * w, 0.0).sum(1))


@pytest.mark.parametrize(
    "text, want",
    [
        ("def f(float(N) A) -> (B) {\n  B(i) = A(i) +* 2\n}", "line 2, column 16: expected an expression, found `*`"),
        ("def f(float(N) A) -> (O) { O(i) +=! A(i + j + k) }", "the range of index `i` cannot be inferred"),
        ("def f(float(N) A) -> (O) { O(i) = foo(A(i)) }", "`foo` is neither a tensor of this definition nor a builtin"),
        ("def f(float(N) A) -> (O) { O(i) += A(i) }", "whose start value is unset"),
        ("def f(float(N) A) -> (O) { O(i) = A(j) }", "`j` appears only on the right of `=`"),
        ("def f(float(N) A) -> (O) {\n  O(i) = A(i) * 1e999\n}", "line 2, column 17: the number `1e999` is out of range"),
        ("def f(float(N) A) -> (O) { O(i) = " + " + ".join(["A(i)"] * 3000) + " }", "more than 128 levels deep"),
        ("def f(float(N) A) -> (O) {\n  O(i) = A(i) + 0x10\n}", "line 2, column 17: `0x10` is not a number"),
        (
            "def f(float(N) A) -> (O) {\n  O(i) = A(i) where i in 0:2\n  O(i) += A(i) where i in 0:4\n}",
            "line 3, column 3: def f: in `O(i) += A(i) where i in 0:4`: `O(i)` reaches index 3 along dim 0, which has size 2",
        ),
    ],
)
def test_language_errors_say_where_and_what(text, want):
    with pytest.raises(ValueError) as e:
        dlbridge.define(text)
    assert want in str(e.value)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_division_truncates_and_wraps_and_refuses_zero(dtype):
    ty = str(dtype).removeprefix("torch.")
    (k,) = dlbridge.define(f"def divmod({ty}(N) A, {ty}(N) B) -> (Q, R) {{\n  Q(i) = A(i) / B(i)\n  R(i) = A(i) % B(i)\n}}")
    low = torch.iinfo(dtype).min
    a = torch.tensor([low, 7, -7, 7, -7, low, 5, low + 1], dtype=dtype)
    b = torch.tensor([-1, 2, 2, -2, -2, 1, -1, -1], dtype=dtype)
    q, r = k(a, b)
    # C's truncating division (torch's rounding_mode="trunc", torch.fmod); MIN / -1 wraps to MIN.
    want_q = torch.tensor([low, 3, -3, -3, 3, low, -5, -(low + 1)], dtype=dtype)
    torch.testing.assert_close(q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(r, torch.fmod(a, b), rtol=0, atol=0)
    torch.testing.assert_close(q[1:], torch.div(a[1:], b[1:], rounding_mode="trunc"), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="divmod: integer division or modulo by zero"):
        k(torch.tensor([1, 2], dtype=dtype), torch.tensor([1, 0], dtype=dtype))


def test_integers_wrap_on_overflow():
    (k,) = dlbridge.define("def grows(int64(N) A) -> (O, P) {\n O(i) = A(i) + 1 > A(i) ? 1 : 0\n P(i) = A(i) * 2\n}")
    big = torch.tensor([2**63 - 1, 5, -(2**63)])
    o, p = k(big)
    torch.testing.assert_close(o, torch.tensor([0, 1, 1]))
    torch.testing.assert_close(p, big * 2)


def test_integer_sums_and_products_stored_back_agree_with_torch():
    (k,) = dlbridge.define("def narrow(int8(N) A, int8(N) B, int32(N) C) -> (P, Q) {\n P(i) = A(i) * B(i) + A(i) * 3 - 1\n Q(i) = C(i) * 2 + 7\n}")
    a = torch.tensor([127, -128, 5, -7], dtype=torch.int8)
    b = torch.tensor([127, -1, 7, 100], dtype=torch.int8)
    c = torch.tensor([2**31 - 1, -(2**31), 5, 123456789], dtype=torch.int32)
    p, q = k(a, b, c)
    torch.testing.assert_close(p, a * b + a * 3 - 1, rtol=0, atol=0)
    torch.testing.assert_close(q, c * 2 + 7, rtol=0, atol=0)
    # Intermediates compute in the tensors' type, wrapping there, as torch's do:
    # int8 (127 + 127) / 2 is -1.
    (half,) = dlbridge.define("def half8(int8(N) A, int8(N) B) -> (O) { O(i) = (A(i) + B(i)) / 2 }")
    torch.testing.assert_close(half(a[:1], b[:1]), torch.tensor([-1], dtype=torch.int8))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32])
def test_integer_intermediates_wrap_in_the_tensors_type_as_torchs(dtype):
    name = str(dtype).removeprefix("torch.")
    (k,) = dlbridge.define(
        f"def wrap_{name}({name}(N) A, {name}(N) B) -> (O, P) {{\n"
        " O(i) = (A(i) + B(i)) / 2 - A(i) * B(i) % 7\n"
        " P(i) = (A(i) * 3 + 1) / 4 > 0 ? A(i) + 1 : -B(i)\n}"
    )
    info = torch.iinfo(dtype)
    values = [info.min, info.max, info.max - 1, info.min + 1, 0, 1, 3, 100 % info.max]
    a = torch.tensor(values, dtype=dtype)
    b = torch.tensor(values[::-1], dtype=dtype)
    o, p = k(a, b)
    want_o = torch.div(a + b, 2, rounding_mode="trunc") - torch.fmod(a * b, 7)
    want_p = torch.where(torch.div(a * 3 + 1, 4, rounding_mode="trunc") > 0, a + 1, -b if dtype != torch.uint8 else (0 - b))
    assert o.dtype == p.dtype == dtype
    torch.testing.assert_close(o, want_o, rtol=0, atol=0)
    torch.testing.assert_close(p, want_p, rtol=0, atol=0)


def test_float_remainder_is_fmod_and_differentiates():
    (k,) = dlbridge.define("def rem(double(N) X, double(N) Y) -> (O) { O(i) = X(i) % Y(i) }")
    x = torch.tensor([5.5, -5.5, 5.5, 7.25, 1.0], dtype=torch.float64)
    y = torch.tensor([2.0, 2.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    torch.testing.assert_close(k(x, y), torch.fmod(x, y), equal_nan=True)
    op = dtorch.as_op(k)
    xs, ys = torch.tensor([5.3, -2.2], dtype=torch.float64, requires_grad=True), torch.tensor([2.0, 0.7], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: op(x, ys), (xs,))


def test_a_long_sum_of_one_read_differentiates_as_one_statement():
    (k,) = dlbridge.define("def s(double(N) A) -> (O) { O(i) = " + " + ".join(["A(i) * A(i)"] * 31) + " }")
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    op = dtorch.as_op(k)
    torch.testing.assert_close(op(x), 31 * x.detach() ** 2)
    op(x).sum().backward()
    torch.testing.assert_close(x.grad, 62 * x.detach())


def test_an_output_of_declared_sizes_written_in_part_is_zero_elsewhere():
    (k,) = dlbridge.define("def head(float(N) A) -> (float(N) O) { O(i) = A(i) where i in 0:2 }")
    torch.testing.assert_close(k(torch.arange(1.0, 9.0)), torch.tensor([1.0, 2, 0, 0, 0, 0, 0, 0]))
    np.testing.assert_array_equal(k(np.full(5, 7.0)), [7.0, 7.0, 0, 0, 0])
    (k,) = dlbridge.define("def col(float(M, N) A) -> (float(M, N) O) { O(i, j) +=! A(i, j) * A(i, k) where j in 0:1 }")
    a = torch.rand(3, 4, dtype=torch.float64)
    want = torch.zeros(3, 4, dtype=torch.float64)
    want[:, 0] = a[:, 0] * a.sum(1)
    torch.testing.assert_close(k(a), want)


@pytest.mark.parametrize(
    "text, want",
    [
        ("def f(float(N) A) -> (O) {\n O(i) = A(i)\n O(i) = O(i) + O(N - 1 - i)\n}", "reads `O(N - 1 - i)`, another element of `O`"),
        ("def f(float(N) A) -> (O) {\n O(i) = A(i)\n O(i) = O(i - 1) + A(i) where i in 1:N\n}", "reads `O(i - 1)`, another element"),
        ("def f(float(N, N) A) -> (O) {\n O(i) = A(i, 0)\n O(i) +=! O(i) * A(i, k)\n}", "reads `O(i)` while it reduces over `k`"),
    ],
)
def test_a_statement_reads_its_own_output_only_where_it_writes(text, want):
    with pytest.raises(ValueError, match="line 3, column 2") as e:
        dlbridge.define(text)
    assert want in str(e.value)


def test_builtins_of_integers_compute_in_floating_point():
    (k,) = dlbridge.define("def half(double(N) A) -> (O) { O(i) = A(i) + sigmoid(0) }")
    torch.testing.assert_close(k(torch.zeros(2, dtype=torch.float64)), torch.full((2,), 0.5, dtype=torch.float64))
    (k,) = dlbridge.define("def ints(int32(N) A, bool(N) B) -> (S, R, T) {\n S(i) = sigmoid(A(i))\n R(i) = rsqrt(A(i))\n T(i) = sigmoid(B(i))\n}")
    a, b = torch.tensor([1, 4, -2], dtype=torch.int32), torch.tensor([True, False, True])
    s, r, t = k(a, b)
    torch.testing.assert_close(s, torch.sigmoid(a.float()))
    torch.testing.assert_close(r, torch.rsqrt(a.float()), equal_nan=True)
    torch.testing.assert_close(t, torch.sigmoid(b.float()))


@pytest.mark.parametrize("values", [[0.0, 2.0, 3.0], [0.0, 2.0, 0.0], [1.5, -2.0, 3.0], [-1.0, 0.5, 0.0, 4.0]])
def test_the_gradient_of_a_product_with_zeros_is_torchs(values):
    (k,) = dlbridge.define("def prodrow(float(M, N) A) -> (O) { O(i) *=! A(i, k) }")
    op = dtorch.as_op(k)
    a = torch.tensor([values, values[::-1]], dtype=torch.float64, requires_grad=True)
    ref = a.detach().clone().requires_grad_()
    g = torch.tensor([1.5, -0.5], dtype=torch.float64)
    (op(a) * g).sum().backward()
    (ref.prod(1) * g).sum().backward()
    torch.testing.assert_close(a.grad, ref.grad)
    # `*=` from a start value: one more factor, which may be zero too.
    (k,) = dlbridge.define("def scaled(float(M) S, float(M, N) A) -> (O) {\n O(i) = S(i)\n O(i) *= A(i, k)\n}")
    op = dtorch.as_op(k)
    s = torch.tensor([0.0, 2.0], dtype=torch.float64, requires_grad=True)
    a = torch.tensor([values, values[::-1]], dtype=torch.float64, requires_grad=True)
    s2, a2 = s.detach().clone().requires_grad_(), a.detach().clone().requires_grad_()
    op(s, a).sum().backward()
    (s2 * a2.prod(1)).sum().backward()
    torch.testing.assert_close((s.grad, a.grad), (s2.grad, a2.grad))


def test_tied_maxima_share_the_gradient_as_torchs_amax():
    (mx,) = dlbridge.define("def rowmax(float(M, N) A) -> (O) { O(i) max=! A(i, j) }")
    (mn,) = dlbridge.define("def rowmin_from(float(M) S, float(M, N) A) -> (O) {\n O(i) = S(i)\n O(i) min= A(i, j)\n}")
    a = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 1.0]], dtype=torch.float64, requires_grad=True)
    ref = a.detach().clone().requires_grad_()
    dtorch.as_op(mx)(a).sum().backward()
    ref.amax(1).sum().backward()
    torch.testing.assert_close(a.grad, ref.grad)
    assert a.grad.sum().item() == pytest.approx(2.0)
    s = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    a = torch.tensor([[1.0, 3.0, 1.0], [4.0, 2.0, 2.0]], dtype=torch.float64, requires_grad=True)
    s2, a2 = s.detach().clone().requires_grad_(), a.detach().clone().requires_grad_()
    dtorch.as_op(mn)(s, a).sum().backward()
    torch.cat([s2[:, None], a2], 1).amin(1).sum().backward()
    torch.testing.assert_close((s.grad, a.grad), (s2.grad, a2.grad))


def test_tensor_names_with_a_dim_suffix_stay_apart():
    (k,) = dlbridge.define("def suffixes(float(M, N) A, float(M) A_0, float(N) A_1) -> (O) { O(i, j) = A(i, j) + A_0(i) * A_1(j) }")
    a, a0, a1 = torch.rand(3, 4), torch.rand(3), torch.rand(4)
    torch.testing.assert_close(k(a, a0, a1), a + a0[:, None] * a1)


def test_a_definition_relabelled_beside_a_builtin_never_replaces_another_label():
    # `mean_all` is a built-in no other test relabels (a torch operator keeps its schema).
    (first,) = dlbridge.define("def mean_all(float(N) A, float(N) B) -> (O) { O(i) = A(i) + B(i) * 10 }")
    assert first.name != "mean_all"
    (second,) = dlbridge.define(f"def {first.name}(float(N) A) -> (O) {{ O(i) = A(i) * 100 }}")
    assert second.name != first.name
    x = torch.ones(2)
    torch.testing.assert_close(dlbridge.get_kernel(first.name)(x, x), torch.full((2,), 11.0))
    torch.testing.assert_close(dlbridge.get_kernel(second.name)(x), torch.full((2,), 100.0))
    torch.testing.assert_close(dlbridge.get_kernel("mean_all")(x), torch.tensor(1.0))


def test_a_builtin_name_and_its_relabel_in_one_text_stay_apart():
    # `maximum` is a built-in no other test relabels.
    defs = dlbridge.define(
        "def maximum(double(N) A) -> (O) { O(i) = A(i) * A(i) }\ndef maximum_2(double(N) A) -> (O) { O(i) = A(i) * A(i) * A(i) }"
    )
    assert len({defs.maximum.name, defs.maximum_2.name, "maximum"}) == 3
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    dtorch.as_op(defs.maximum)(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    x.grad = None
    dtorch.as_op(defs.maximum_2)(x).sum().backward()
    torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)


def test_an_untyped_output_is_floating_once_a_statement_writes_it_a_float():
    (k,) = dlbridge.define("def widen(double(N) A) -> (O) {\n O(i) = 2 where i in 0:N\n O(i) = O(i) + A(i)\n}")
    x = torch.tensor([0.7, 1.5, -0.7], dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(k(x.detach()), x.detach() + 2)
    dtorch.as_op(k)(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3, dtype=torch.float64))


def test_max_and_min_builtins_split_a_tie_as_torch_maximum():
    (k,) = dlbridge.define("def hi_lo(double(N) A, double(N) B) -> (O) { O(i) = max(A(i), B(i)) + 2 * min(A(i), B(i)) }")
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([1.0, 5.0, 0.0], dtype=torch.float64, requires_grad=True)
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    dtorch.as_op(k)(a, b).sum().backward()
    (torch.maximum(a2, b2) + 2 * torch.minimum(a2, b2)).sum().backward()
    torch.testing.assert_close((a.grad, b.grad), (a2.grad, b2.grad))


def test_a_handle_kept_from_before_a_redefinition_keeps_its_kernel_and_backward():
    (old,) = dlbridge.define("def again(double(N) A) -> (O) { O(i) = A(i) * A(i) }")
    (new,) = dlbridge.define("def again(double(N) A) -> (O) { O(i) = A(i) * 5 }")
    assert old.name == new.name and old != new
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    dtorch.as_op(old)(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    x.grad = None
    dtorch.as_op(new)(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2,), 5.0, dtype=torch.float64))
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import dlbridge.jax as djax

    jax.config.update("jax_enable_x64", True)
    v = jnp.array([1.0, 2.0])
    np.testing.assert_allclose(np.asarray(jax.jit(djax.as_op(old))(v)), [1.0, 4.0])
    np.testing.assert_allclose(np.asarray(jax.grad(lambda v: djax.as_op(old)(v).sum())(v)), [2.0, 4.0])
    np.testing.assert_allclose(np.asarray(jax.jit(djax.as_op(new))(v)), [5.0, 10.0])


def test_a_backward_over_the_tensor_bound_says_why_when_asked_for():
    body = "O(i) = A(i)\n" + "O(i) = O(i) * A(i) + 1\n" * 6
    (k,) = dlbridge.define(f"def chain7(float(N) A) -> (O) {{\n{body}}}")
    x = torch.rand(3, dtype=torch.float64, requires_grad=True)
    y = dtorch.as_op(k)(x).sum()
    with pytest.raises(RuntimeError, match=r"the backward of `chain7` needs 17 tensors .*more than a kernel takes \(16\)"):
        y.backward()


def test_numpy_scalars_as_the_first_tensor_give_numpy_outputs():
    (k,) = dlbridge.define("def scaled_by(float S, float(N) A) -> (O) { O(i) = S * A(i) }")
    out = k(np.float32(2), np.ones(3, np.float32))
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, [2.0, 2.0, 2.0])
    total = dlbridge.get_kernel("add")(np.float64(2), np.float64(3))
    assert type(total) is np.ndarray and total.shape == () and total == 5.0


def test_call_errors_name_the_arguments():
    a, b = torch.randn(3, 4), torch.randn(5, 2)
    with pytest.raises(ValueError, match=r"argument B: dim N = 4 \(bound by A\) but got 5"):
        DEFS.matmul(a, b)
    with pytest.raises(TypeError, match="argument B: dtype mismatch: expected T = f32 \\(bound by A\\), got f64"):
        DEFS.matmul(a, torch.randn(4, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="no `def nope`"):
        dlbridge.define(TC_EXAMPLES, name="nope")


def test_jax_grad_of_a_definition():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import dlbridge.jax as djax

    jax.config.update("jax_enable_x64", True)
    op = djax.as_op(DEFS.matmul)
    a = jnp.arange(6.0).reshape(2, 3) / 5
    b = jnp.arange(12.0).reshape(3, 4) / 7
    ga, gb = jax.jit(jax.grad(lambda a, b: (op(a, b) ** 2).sum(), argnums=(0, 1)))(a, b)
    ra, rb = jax.grad(lambda a, b: ((a @ b) ** 2).sum(), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(ra), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(gb), np.asarray(rb), rtol=1e-10)


def test_a_definition_is_a_torch_operator_under_compile():
    op = dtorch.as_op(DEFS.fcrelu)
    x, w, b = torch.randn(4, 6), torch.randn(5, 6), torch.randn(5)
    compiled = torch.compile(lambda x, w, b: op(x, w, b) * 2, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, w, b), torch.relu(torch.nn.functional.linear(x, w, b)) * 2)


def test_a_definition_on_jax_arrays_returns_jax_arrays():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4) / 5
    o = DEFS.softmax(x)[0]
    assert isinstance(o, jax.Array)
    np.testing.assert_allclose(np.asarray(o), np.asarray(jax.nn.softmax(x, axis=-1)), rtol=1e-6)


def test_a_window_of_half_a_size_shapes_the_output():
    (k,) = dlbridge.define("def halfwin(float(N) A) -> (O) {\n  O(i) +=! A(i + k) where k in 0:N/2\n}")
    assert k.signature.endswith("-> (O: T[(N + 1 - N / 2)])"), k.signature
    for n in (1, 6, 7):
        a = np.random.default_rng(n).random(n)
        want = np.lib.stride_tricks.sliding_window_view(a, n // 2).sum(axis=1) if n // 2 else np.zeros(n + 1)
        np.testing.assert_allclose(k(a), want, rtol=1e-12)


def test_a_centred_window_divides_a_size_in_an_index():
    (k,) = dlbridge.define("def same_conv(float(N) A, float(K) W) -> (O) {\n  O(i) +=! A(i + k - K/2) * W(k)\n}")
    x, w = torch.randn(11, dtype=torch.float64, requires_grad=True), torch.randn(3, dtype=torch.float64, requires_grad=True)
    # Every access in bounds: i runs over N - K + 1 positions, from K/2 on.
    want = torch.nn.functional.conv1d(x[None, None], w[None, None])[0, 0]
    out = k(x.detach(), w.detach())
    # i runs over [K/2, N - K + 1 + K/2): the output's first K/2 elements are zero.
    assert out.shape == (10,) and out[0] == 0
    torch.testing.assert_close(out[1:], want.detach())
    assert torch.autograd.gradcheck(dtorch.as_op(k), (x, w))


def test_a_sum_of_comparisons_counts_in_int64():
    (k,) = dlbridge.define("def count_pos(float(N,D) A) -> (C, Any) {\n  C(i) +=! A(i, j) > 0\n  Any(i) max=! A(i, j) > 2\n}")
    assert k.signature.endswith("-> (C: i64[N], Any: bool[N])"), k.signature
    a = np.array([[1.0, 2.0, 3.0], [-1.0, 5.0, -2.0]])
    count, any_big = k(a)
    np.testing.assert_array_equal(count, (a > 0).sum(axis=1))
    assert count.dtype == np.int64
    np.testing.assert_array_equal(any_big, [True, True])


def test_a_derived_backward_never_replaces_a_kernel_of_yours():
    mine = dlbridge.ElementwiseKernel("T x", "T y", "y = x + 100", "hardtanh6_backward")
    (k,) = dlbridge.define("def hardtanh6(float(N) A) -> (O) {\n  O(i) = fmin(fmax(A(i), 0), 6)\n}")
    assert dlbridge.get_kernel("hardtanh6_backward") == mine.kernel
    x = torch.tensor([-1.0, 3.0, 8.0], dtype=torch.float64, requires_grad=True)
    dtorch.as_op(k)(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))
    # Nor does a definition of yours named as a derived backward replace it.
    (sq,) = dlbridge.define("def square_it(float(N) A) -> (O) { O(i) = A(i) * A(i) }")
    (yours,) = dlbridge.define("def square_it_backward(float(N) A) -> (O) { O(i) = A(i) + 100 }")
    assert yours.name == "square_it_backward_2"
    x.grad = None
    dtorch.as_op(sq)(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())


def test_a_derived_backward_is_a_first_derivative_in_torch_and_jax():
    (k,) = dlbridge.define("def cube_it(double(N) A) -> (O) { O(i) = A(i) * A(i) * A(i) }")
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(dtorch.as_op(k)(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g, 3 * x.detach() ** 2)
    with pytest.raises(RuntimeError, match=r"cube_it_backward has no backward: .*the derived backward of cube_it, a first derivative"):
        g.sum().backward()
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import dlbridge.jax as djax

    jax.config.update("jax_enable_x64", True)
    op = djax.as_op(k)
    v = jnp.array([1.0, 2.0])
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(lambda v: op(v).sum()))(v)), [3.0, 12.0])
    with pytest.raises(NotImplementedError, match=r"cube_it: a derivative of its derivative .* is not available"):
        jax.grad(lambda v: jax.grad(lambda v: op(v).sum())(v).sum())(v)
    with pytest.raises(NotImplementedError, match=r"cube_it_backward has no backward: .*a first derivative"):
        jax.grad(lambda v: djax.as_op(k.name + "_backward")(v, v)[0].sum())(v)


def test_jax_says_why_a_definition_has_no_backward():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import dlbridge.jax as djax

    body = "O(i) = A(i)\n" + "O(i) = O(i) * A(i) + 1\n" * 6
    (k,) = dlbridge.define(f"def chain7j(float(N) A) -> (O) {{\n{body}}}")
    op = djax.as_op(k)
    np.testing.assert_allclose(np.asarray(op(jnp.ones(2, jnp.float32))), [7.0, 7.0])
    with pytest.raises(NotImplementedError, match=r"chain7j has no backward: .*needs 17 tensors"):
        jax.grad(lambda v: op(v).sum())(jnp.ones(2, jnp.float32))


def test_an_out_of_bounds_constant_index_is_named_at_the_call():
    (k,) = dlbridge.define("def first_times(float(N) A, float(M) B) -> (O) { O(i) = A(0) * B(i) }")
    torch.testing.assert_close(k(torch.full((2,), 3.0), torch.ones(3)), torch.full((3,), 3.0))
    with pytest.raises(RuntimeError, match=r"A\(0\)`? reaches index 0 along dim 0, which has size 0") as e:
        k(torch.ones(0), torch.ones(3))
    assert "where" not in str(e.value)


def test_truth_values_in_integer_arithmetic_are_integers():
    defs = dlbridge.define("""
def scaled_flag(float(N) A) -> (O) { O(i) = (A(i) > 0) * 3 }
def negated_flag(float(N) A) -> (O) { O(i) = -(A(i) > 0) }
def largest_flag(float(N, M) A) -> (O) { O(i) max=! (A(i, j) > 0) * 5 }
def flag_then_count(float(N) A, int32(N) B) -> (O) {
  O(i) = A(i) > 0
  O(i) += B(i)
}
""")
    a = torch.tensor([-1.0, 0.5, 2.0])
    b = torch.tensor([5, 6, 7], dtype=torch.int32)
    for kernel, args, want in [
        (defs.scaled_flag, (a,), (a > 0) * 3),
        (defs.negated_flag, (a,), -(a > 0).long()),
        (defs.largest_flag, (a[:, None],), torch.amax((a[:, None] > 0) * 5, 1)),
        (defs.flag_then_count, (a, b), (a > 0).int() + b),
    ]:
        got = kernel(*args)
        assert got.dtype == want.dtype, (kernel.signature, got.dtype, want.dtype)
        torch.testing.assert_close(got, want)


def test_jax_differentiates_a_definition_with_an_integer_output():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import dlbridge.jax as djax

    (k,) = dlbridge.define("def count_and_sum(float(N, M) A) -> (C, S) {\n  C(i) +=! A(i, j) > 0\n  S(i) +=! A(i, j) * A(i, j)\n}")
    op = djax.as_op(k)
    a = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3) - 2
    count, _ = op(a)
    np.testing.assert_array_equal(np.asarray(count), [0, 3])
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(lambda a: op(a)[1].sum()))(a)), 2 * np.asarray(a))


def test_a_definition_never_replaces_a_load_inline_function():
    (k,) = dlbridge.define("def inl_sq(double(N) A) -> (O) { O(i) = A(i) * A(i) }")
    lib = dlbridge.load_inline(
        "inl_sq_lib",
        c_source="void inl_sq_backward(const double* x, double* y, long long n) { for (long long i = 0; i < n; i++) y[i] = x[i] + 100; }",
        functions={"inl_sq_backward": "inl_sq_backward(x: f64[N]) -> (y: f64[N])"},
    )
    assert dlbridge.get_kernel("inl_sq_backward").params[0].name == "x", "load_inline's function takes its exact name"
    torch.testing.assert_close(lib.inl_sq_backward(torch.ones(2, dtype=torch.float64)), torch.full((2,), 101.0, dtype=torch.float64))
    (again,) = dlbridge.define("def inl_sq(double(N) A) -> (O) { O(i) = A(i) * A(i) * A(i) }")
    assert dlbridge.get_kernel("inl_sq_backward").params[0].name == "x", "load_inline's function keeps its name"
    assert dlbridge.get_kernel("inl_sq_backward_2").params[0].name == "A"
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    dtorch.as_op(again)(x).sum().backward()
    torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)


def test_tensors_named_like_the_backwards_own_still_differentiate():
    (k,) = dlbridge.define("def named_like_grads(float(N) A, float(N) grad_O, float(N) grad_A) -> (O) { O(i) = A(i) * grad_O(i) + grad_A(i) * 2 }")
    args = tuple(torch.randn(4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(dtorch.as_op(k), args)
    a, g, h = args
    dtorch.as_op(k)(*args).sum().backward()
    torch.testing.assert_close(a.grad, g.detach())
    torch.testing.assert_close(g.grad, a.detach())
    torch.testing.assert_close(h.grad, torch.full((4,), 2.0, dtype=torch.float64))


def test_signed_with_unsigned_integers_compute_in_a_type_that_holds_both():
    (k,) = dlbridge.define("""
def signmix(int32(N) A, uint32(N) B, int8(N) C) -> (Q, R, M, L1, L2) {
  Q(i) = A(i) / B(i)
  R(i) = A(i) % B(i)
  M(i) = max(A(i), B(i))
  L1(i) = A(i) < B(i)
  L2(i) = B(i) < C(i)
}""")
    assert k.signature.endswith("-> (Q: i64[N], R: i64[N], M: i64[N], L1: bool[N], L2: bool[N])"), k.signature
    a, b, c = np.array([-6, -7, 2**31 - 1], np.int32), np.array([2, 3, 2**32 - 1], np.uint32), np.array([-128, 5, 127], np.int8)
    q, r, m, l1, l2 = k(a, b, c)
    ai, bi, ci = a.astype(object), b.astype(object), c.astype(object)
    np.testing.assert_array_equal(q, [int(x / y) for x, y in zip(ai, bi)])  # truncating
    np.testing.assert_array_equal(r, [x - int(x / y) * y for x, y in zip(ai, bi)])
    np.testing.assert_array_equal(m, np.maximum(ai, bi).astype(np.int64))
    np.testing.assert_array_equal(l1, ai < bi)
    np.testing.assert_array_equal(l2, bi < ci)
    (wide,) = dlbridge.define("def signmix64(int64(N) C, uint64(N) D) -> (S, L, G) {\n S(i) = C(i) + D(i)\n L(i) = C(i) < D(i)\n G(i) = D(i) >= C(i) + 0\n}")
    c64, d64 = np.array([-5, 10, -1], np.int64), np.array([3, 2**63 + 5, 2**64 - 1], np.uint64)
    s, lt, ge = wide(c64, d64)
    np.testing.assert_array_equal(s, (c64.astype(object) + d64.astype(object) + 2**63) % 2**64 - 2**63)
    np.testing.assert_array_equal(lt, [True, True, True])
    np.testing.assert_array_equal(ge, [True, True, True])


def test_an_integer_literal_takes_the_other_operands_type_as_in_torch():
    (k,) = dlbridge.define("""
def literal_types(uint8(N) A, int8(N) B) -> (O1, O2, O3, O4, D) {
  O1(i) = A(i) / -2
  O2(i) = -2 / A(i)
  O3(i) = B(i) / 200
  O4(i) = max(B(i), 200)
  D(i) = (A(i) > 100) - (B(i) < 110)
}""")
    a, b = torch.tensor([10, 200], dtype=torch.uint8), torch.tensor([100, 127], dtype=torch.int8)
    o1, o2, o3, o4, d = k(a, b)
    torch.testing.assert_close(o1, torch.div(a, -2, rounding_mode="trunc"), rtol=0, atol=0)
    torch.testing.assert_close(o2, torch.div(torch.full_like(a, 254), a, rounding_mode="trunc"), rtol=0, atol=0)
    torch.testing.assert_close(o3, torch.div(b, 200, rounding_mode="trunc"), rtol=0, atol=0)
    torch.testing.assert_close(o4, torch.maximum(b, torch.tensor(200).to(torch.int8)), rtol=0, atol=0)
    torch.testing.assert_close(d, torch.tensor([-1, 1]), rtol=0, atol=0)


def test_a_tensor_named_shapes_differentiates():
    (k,) = dlbridge.define("def shaped(float(N) shapes, float(N) B) -> (O) { O(i) = shapes(i) * B(i) }")
    args = tuple(torch.randn(3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(dtorch.as_op(k), args)


@pytest.mark.parametrize("name", ["_kernels", "__class__", "__len__", "_Definitions__kernels"])
def test_a_def_whose_name_starts_with_an_underscore_is_refused_saying_what_to_do(name):
    with pytest.raises(ValueError, match=rf"`def {name}`: a definition's name may not start with `_`.*rename it"):
        dlbridge.define(f"def {name}(float(N) A) -> (O) {{ O(i) = A(i) * 2 }}")
    assert name not in [k.name for k in dlbridge.list_kernels()], "nothing was registered"


def test_definitions_are_reached_by_attribute_and_by_name():
    defs = dlbridge.define("def len_like(float(N) A) -> (O) { O(i) = A(i) * 2 }\ndef other(float(N) A) -> (O) { O(i) = A(i) }")
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(defs["len_like"](x), defs.len_like(x))
    assert len(defs) == 2 and defs.other.name == "other" and type(defs).__name__ == "Definitions"
    assert "len_like" in dir(defs)
    with pytest.raises(AttributeError, match="no `def missing` here"):
        defs.missing


@pytest.mark.parametrize(
    "text",
    [
        "def bs1(float(N) A) -> (O) {\n  # a comment ending in a backslash \\\n  O(i) = A(i) * 2\n}",
        "def bs2(float(N) A) -> (O) {\n  O(i) = A(i) * 2 # trailing \\\n}",
        "# before \\\ndef bs3(float(N) A) -> (O) { O(i) = A(i) * 2 }",
        "def bs4(float(N) A) # in the signature \\\n -> (O) { O(i) = A(i) * 2 }",
    ],
)
def test_a_comment_ending_in_a_backslash_ends_at_its_line(text):
    # In TC a `#` comment ends at its line, whatever it ends with: the statement
    # after it runs (it is not continued into the comment, as a C++ `//` would be).
    (k,) = list(dlbridge.define(text))
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(k(x), x * 2)
