"""dlbridge.torch: registry kernels as torch operators, derived from their
signatures (schema, fake implementation, backends, autograd) — checked with
torch's own tools: torch.library.opcheck, torch.compile(fullgraph=True) with
torch._dynamo.explain, torch.export, make_fx with symbolic shapes and
torch.autograd.gradcheck."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import dlbridge  # noqa: E402
import dlbridge.torch as dt  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

BUILTINS = ["add", "axpy", "copy", "div", "gelu", "matmul", "maximum", "mean", "mean_all", "mul", "relu",
            "softmax", "sub", "sum", "sum_all"]
WITH_BACKWARD = ["add", "mul", "relu", "gelu", "softmax", "matmul", "sum", "sub", "div", "mean", "sum_all", "mean_all",
                 "copy"]

_DTYPES = {"f32": torch.float32, "f64": torch.float64, "i32": torch.int32, "i64": torch.int64}


def samples(kernel, dtype="f32", sizes=None, requires_grad=False, seed=0):
    """Arguments for `kernel` derived from its signature: each symbol a size,
    each `...S` pack a shape, each type variable `dtype`, scalars fixed."""
    sizes = dict(sizes or {})
    counter = itertools.count(2)
    gen = torch.Generator().manual_seed(seed)
    args = []
    for p in kernel.params:
        if p.kind == "scalar":
            args.append({"f64": 0.75, "i64": 3, "bool": True}[p.dtype])
            continue
        shape = []
        for d in p.dims:
            if isinstance(d, int):
                shape.append(d)
            elif d[:1] in ".*":
                shape.extend(sizes.setdefault(d, (2, 3)))
            else:
                shape.append(sizes.setdefault(d, next(counter) + 1))
        dt_ = _DTYPES[p.dtype if p.dtype in _DTYPES else dtype]
        t = torch.randn(shape, generator=gen, dtype=torch.float64).to(dt_) if dt_.is_floating_point else \
            torch.randint(-5, 5, shape, generator=gen, dtype=dt_)
        if p.dtype == "T" and dt_.is_floating_point and kernel.name == "div" and p.name == "b":
            t = t.abs() + 0.5  # away from zero, for gradcheck's finite differences
        args.append(t.requires_grad_(requires_grad and dt_.is_floating_point and not p.mutable))
    return tuple(args)


@pytest.fixture(scope="module")
def ops():
    return dt.register_all()


# --- the schema ---------------------------------------------------------------------------------


def test_every_builtin_is_registered_under_torch_ops_dlbridge(ops):
    assert set(BUILTINS) <= set(ops)
    for name in BUILTINS:
        assert ops[name] is getattr(torch.ops.dlbridge, name)
        assert dt.as_op(name) is ops[name], "registering again returns the same operator"


@pytest.mark.parametrize(
    "name, schema",
    [
        ("add", "dlbridge::add(Tensor a, Tensor b) -> Tensor"),
        ("matmul", "dlbridge::matmul(Tensor a, Tensor b) -> Tensor"),
        ("axpy", "dlbridge::axpy(float alpha, Tensor x, Tensor(a!) y) -> ()"),
        ("sum", "dlbridge::sum(Tensor x) -> Tensor"),
    ],
)
def test_the_schema_follows_the_signature(ops, name, schema):
    assert str(ops[name].default._schema) == schema
    assert dt.schema_of(name) == schema.split(name, 1)[1]


def test_scalars_mutation_and_several_outputs_map_to_the_schema(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    lib = dlbridge.load_inline("torchop_inline", c_source=r'''
void two(const double* x, double s, long long k, int flag, double* y, double* z, long long n) {
    for (long long i = 0; i < n; i++) { y[i] = flag ? x[i] * s : x[i]; z[i] = x[i] + (double)k; }
}
void bump(float* a, float* b, long long n) {
    for (long long i = 0; i < n; i++) { a[i] += 1; b[i] *= 2; }
}''', functions={"two": "two(x: f64[N], s: f64, k: i64, flag: bool) -> (y: f64[N], z: f64[N])",
                 "bump": "bump(a: mut f32[N], b: mut f32[N])"})
    assert dt.schema_of(lib.two) == "(Tensor x, float s, int k, bool flag) -> (Tensor, Tensor)"
    op = dt.as_op(lib.two)
    x = torch.arange(4.0, dtype=torch.float64)
    y, z = op(x, 2.0, 3, True)
    assert torch.equal(y, x * 2) and torch.equal(z, x + 3)
    torch.library.opcheck(op, (x, 2.0, 3, False))
    assert dt.schema_of(lib.bump) == "(Tensor(a!) a, Tensor(b!) b) -> ()"
    a, b = torch.ones(3), torch.ones(3)
    assert dt.as_op(lib.bump)(a, b) is None
    assert torch.equal(a, torch.full((3,), 2.0)) and torch.equal(b, torch.full((3,), 2.0))
    torch.library.opcheck(dt.as_op(lib.bump), (a, b))


def test_compiled_kernel_scalars_are_scalars_in_an_overload(tmp_path, monkeypatch):
    # CuPy's broadcast inputs take arrays or scalars: the default overload takes
    # tensors, and each set of inputs given as scalars is an overload of its own.
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    k = dlbridge.ElementwiseKernel("T x, float64 s", "T y", "y = x * s", "torchop_scale")
    assert dt.schema_of(k) == "(Tensor x, Tensor s) -> Tensor"
    op = dt.as_op(k, backward=lambda saved, g: (g * saved.s,))  # tensor gradients only
    assert str(op.Scalar_s._schema) == "dlbridge::torchop_scale.Scalar_s(Tensor x, Scalar s) -> Tensor"
    assert str(op.Scalar_x._schema) == "dlbridge::torchop_scale.Scalar_x(Scalar x, Tensor s) -> Tensor"
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(op(x, 1.5), x * 1.5)
    torch.testing.assert_close(op(x, torch.tensor(2.0, dtype=torch.float64)), x * 2)
    assert torch.autograd.gradcheck(lambda x: op(x, 1.5), (x,))
    compiled = torch.compile(lambda x: op(x, 0.5) + 1, fullgraph=True)
    torch.testing.assert_close(compiled(x.detach()), x.detach() * 0.5 + 1)
    # The scalar's dtype comes from its parameter: an int parameter refuses a float.
    ik = dlbridge.ElementwiseKernel("T x, int32 s", "T y", "y = x * s", "torchop_iscale")
    iop = dt.as_op(ik)
    assert iop(torch.arange(3), 2).tolist() == [0, 2, 4]
    with pytest.raises(TypeError, match="argument s: the scalar 1.5 is not an integer"):
        iop(torch.arange(3), 1.5)


def test_a_backward_may_return_gradients_for_the_tensors_only(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    k = dlbridge.load_inline("torchop_tscale", c_source=r'''
void tscale(const double* x, double s, double* y, long long n) {
    for (long long i = 0; i < n; i++) y[i] = s * x[i];
}''', functions={"tscale": "tscale(x: f64[N], s: f64) -> (y: f64[N])"}).tscale
    op = dt.as_op(k, backward=lambda saved, g: g * saved.s)  # one gradient: x's
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: op(x, 3.0), (x,))


def test_names_that_are_python_keywords_get_an_underscore(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    k = dlbridge.ElementwiseKernel("T lambda_, T y", "T z", "z = lambda_ + y", "torchop_kw")
    assert dt.schema_of(k) == "(Tensor lambda_, Tensor y) -> Tensor"


def test_a_taken_name_with_another_signature_is_an_error(ops):
    with pytest.raises(ValueError, match=r"dlbridge::add is already registered for add<.*not relu<"):
        dt.as_op("relu", name="add")
    relu2 = dt.as_op("relu", name="mylib::relu2")
    assert relu2 is torch.ops.mylib.relu2
    assert torch.equal(relu2(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))
    with pytest.raises(ValueError, match="not a valid operator name"):
        dt.as_op("relu", name="my lib::relu")
    with pytest.raises(TypeError, match="expected a dlbridge.Kernel"):
        dt.as_op(42)


# --- the implementations: the kernel itself, zero copies -------------------------------------


def test_the_eager_operator_computes_what_the_kernel_computes(ops):
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    assert torch.equal(ops["add"](x, y), x + y)
    assert torch.equal(ops["relu"](x), dlbridge.get_kernel("relu")(x))
    torch.testing.assert_close(ops["matmul"](x, y.T), x @ y.T)
    torch.testing.assert_close(ops["softmax"](x), torch.softmax(x, -1))
    torch.testing.assert_close(ops["sum"](x), x.sum(-1))


def test_a_mutated_input_is_written_in_place_through_a_strided_view(ops):
    base = torch.zeros(10)
    y = base[::2]  # a view with stride 2: written where it lives, not through a copy
    x = torch.arange(5.0)
    ptr = y.data_ptr()
    assert ops["axpy"](2.0, x, y) is None
    assert y.data_ptr() == ptr
    assert torch.equal(base, torch.tensor([0.0, 0, 2, 0, 4, 0, 6, 0, 8, 0]))


def test_the_operator_reads_its_inputs_without_a_copy(ops, tmp_path, monkeypatch):
    # The kernel writes the address of its input: the tensor's own.
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    lib = dlbridge.load_inline("torchop_address", c_source=r'''
void address(const float* x, long long* p, long long n) { (void)n; p[0] = (long long)(size_t)x; }
''', functions={"address": "address(x: f32[N], p: mut i64[1])"})
    op = dt.as_op(lib.address)
    x = torch.randn(6, 4)[2]
    p = torch.empty(1, dtype=torch.int64)
    assert op(x, p) is None
    assert p.item() == x.data_ptr()


# --- opcheck ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_opcheck_passes_for_every_builtin(ops, name):
    k = dlbridge.get_kernel(name)
    torch.library.opcheck(ops[name], samples(k))
    if name in WITH_BACKWARD:
        torch.library.opcheck(ops[name], samples(k, "f64", requires_grad=True))
    if any("i32" in p.dtypes for p in k.params if p.kind == "tensor"):
        torch.library.opcheck(ops[name], samples(k, "i32"))


# --- torch.compile, export, dynamic shapes --------------------------------------------------------


def model(x, w, b):
    h = torch.ops.dlbridge.gelu(torch.ops.dlbridge.add(torch.ops.dlbridge.matmul(x, w), b))
    return torch.ops.dlbridge.softmax(h) * 2


def _inputs(m=8, k=16, n=4):
    g = torch.Generator().manual_seed(1)
    return torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), torch.randn(m, n, generator=g)


def _reference(x, w, b):
    return torch.softmax(torch.nn.functional.gelu(x @ w + b), -1) * 2


def test_compile_fullgraph_has_no_graph_break_static_and_dynamic(ops):
    for dynamic in (False, True):
        explained = torch._dynamo.explain(model)(*_inputs())
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
        for m in (8, 13):
            args = _inputs(m)
            torch.testing.assert_close(compiled(*args), _reference(*args), rtol=1e-5, atol=1e-6)


def test_dynamic_shapes_compile_once_and_the_graph_calls_the_operators(ops):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    for m, k in [(8, 16), (13, 16), (21, 5)]:
        args = _inputs(m, k)
        torch.testing.assert_close(compiled(*args), _reference(*args), rtol=1e-5, atol=1e-6)
    assert len(graphs) == 1, "one graph for every shape"
    targets = {str(n.target).removesuffix(".default") for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert {"dlbridge.matmul", "dlbridge.gelu", "dlbridge.softmax", "dlbridge.add"} <= targets


def test_the_fake_implementation_gives_symbolic_output_shapes(ops):
    gm = make_fx(lambda a, b: torch.ops.dlbridge.matmul(a, b), tracing_mode="symbolic")(torch.randn(3, 4), torch.randn(4, 5))
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    m, n = node.meta["val"].shape
    assert isinstance(m, torch.SymInt) and isinstance(n, torch.SymInt)
    a, b = [p.meta["val"] for p in gm.graph.nodes if p.op == "placeholder"]
    assert str(m) == str(a.shape[0]) and str(n) == str(b.shape[1])
    # ...S binds the whole shape; T[...B, N] -> T[...B] drops the last dim.
    gm = make_fx(lambda x: torch.ops.dlbridge.sum(torch.ops.dlbridge.relu(x)), tracing_mode="symbolic")(torch.randn(2, 3, 4))
    out = [n for n in gm.graph.nodes if n.op == "call_function"][-1].meta["val"]
    x = [p.meta["val"] for p in gm.graph.nodes if p.op == "placeholder"][0]
    assert [str(s) for s in out.shape] == [str(s) for s in x.shape[:2]]


def test_the_fake_implementation_refuses_what_the_kernel_refuses(ops):
    with FakeTensorMode():
        a, b = torch.empty(3, 4), torch.empty(5, 2)
        with pytest.raises(ValueError, match=r"matmul: argument b: dim K = 4 \(bound by a\) but got 5"):
            torch.ops.dlbridge.matmul(a, b)
        with pytest.raises(TypeError, match=r"add: argument b: dtype mismatch: expected T = f32 \(bound by a\), got f64"):
            torch.ops.dlbridge.add(a, torch.empty(3, 4, dtype=torch.float64))
        with pytest.raises(TypeError, match=r"add: argument a: dtype mismatch: expected T \(one of .*\), got i8"):
            torch.ops.dlbridge.add(torch.empty(2, dtype=torch.int8), torch.empty(2, dtype=torch.int8))
        with pytest.raises(ValueError, match=r"matmul: argument a: expected 2 dims \[M, K\] but got 3 dims"):
            torch.ops.dlbridge.matmul(torch.empty(1, 3, 4), b)
        with pytest.raises(ValueError, match=r"add: argument b: \.\.\.S = \[3, 4\] \(bound by a\) but got \[4, 3\]"):
            torch.ops.dlbridge.add(a, torch.empty(4, 3))
    # ...and so does the real kernel, with the same words.
    with pytest.raises(ValueError, match=r"matmul: argument b: dim K = 4 \(bound by a\) but got 5"):
        torch.ops.dlbridge.matmul(torch.empty(3, 4), torch.empty(5, 2))


def test_a_broadcasting_elementwise_kernel_traces_with_dynamic_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    k = dlbridge.ElementwiseKernel("T x, T y", "T z", "z = (x - y) * (x - y)", "torchop_squared_diff")
    op = dt.as_op(k)
    f = torch.compile(lambda x, y: op(x, y) + 1, fullgraph=True, dynamic=True)
    for n in (3, 7):
        x, y = torch.randn(n, 5), torch.randn(5)
        torch.testing.assert_close(f(x, y), (x - y) ** 2 + 1)
    with pytest.raises(Exception, match="does not broadcast"):
        with FakeTensorMode():
            op(torch.empty(3, 5), torch.empty(4))


def test_export_of_a_module_using_the_operators(ops):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(16, 4))
            self.b = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            h = torch.ops.dlbridge.matmul(x, self.w)
            return torch.ops.dlbridge.relu(h + self.b)

    m = Block()
    x = torch.randn(8, 16)
    batch = torch.export.Dim("batch", min=2)
    ep = torch.export.export(m, (x,), dynamic_shapes={"x": {0: batch}})
    assert any(n.target is torch.ops.dlbridge.matmul.default for n in ep.graph.nodes)
    for rows in (8, 3):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(ep.module()(x), torch.relu(x @ m.w + m.b))


# --- autograd ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", WITH_BACKWARD)
def test_gradcheck_in_f64_for_builtins_with_a_backward(ops, name):
    args = samples(dlbridge.get_kernel(name), "f64", requires_grad=True)
    assert torch.autograd.gradcheck(ops[name], args)


def test_gradients_through_a_compiled_model_match_torch(ops):
    x, w, b = (t.double().requires_grad_() for t in _inputs())
    compiled = torch.compile(model, fullgraph=True)
    compiled(x, w, b).pow(2).sum().backward()
    got = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    _reference(x, w, b).pow(2).sum().backward()
    for g, t in zip(got, (x, w, b)):
        torch.testing.assert_close(g, t.grad)


def test_a_python_backward_sees_the_saved_values_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    k = dlbridge.load_inline("torchop_square", c_source=r'''
void scaled_square(const double* x, double s, double* y, long long n) {
    for (long long i = 0; i < n; i++) y[i] = s * x[i] * x[i];
}''', functions={"scaled_square": "scaled_square(x: f64[N], s: f64) -> (y: f64[N])"}).scaled_square
    seen = []

    def backward(saved, grad_y):
        seen.append(sorted(n for n in vars(saved) if n != "shapes" and not n.startswith("_")))
        return {"x": grad_y * 2 * saved.s * saved.x}

    op = dt.as_op(k, backward=backward)
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: op(x, 1.5), (x,))
    assert seen[0] == ["s", "x", "y"]


def test_a_backward_written_as_registry_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    fwd = dlbridge.ElementwiseKernel("T x, T y", "T z", "z = x * y", "torchop_bmul")
    # Parameters named after the forward's inputs and grad_<output>; y broadcasts,
    # so its gradient is summed back to y's shape.
    gx = dlbridge.ElementwiseKernel("T grad_z, T y", "T grad_x", "grad_x = grad_z * y", "torchop_bmul_gx")
    gy = dlbridge.ElementwiseKernel("T grad_z, T x", "T grad_y", "grad_y = grad_z * x", "torchop_bmul_gy")
    op = dt.as_op(fwd, backward={"x": gx, "y": gy})
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(op, (x, y))
    bad = dlbridge.ElementwiseKernel("T g, T y", "T grad_x", "grad_x = g * y", "torchop_bmul_bad")
    with pytest.raises(ValueError, match=r"takes g; its parameters must be named after torchop_bmul's inputs"):
        dt.as_op(fwd, name="torchop_bmul2", backward={"x": bad})
    with pytest.raises(ValueError, match="which is not an input"):
        dt.as_op(fwd, name="torchop_bmul3", backward={"w": gx})


def test_a_backward_returning_the_wrong_count_is_a_clear_error(ops, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    op = dt.as_op("mul", name="torchop::mul_bad", backward=lambda s, g: g)
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"mul backward: returned 1 gradients; the kernel has 2 inputs \(a, b\)"):
        op(x, x).sum().backward()
    with pytest.raises(ValueError, match=r"writes its inputs \(mut\)"):
        dt.as_op("axpy", name="torchop::axpy_grad", backward=lambda s, g: g)


def test_the_fast_no_grad_path_still_goes_through_modes(ops):
    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(4)
    with Log() as log:
        y = ops["relu"](x)
    assert torch.ops.dlbridge.relu.default in log.ops
    assert torch.equal(y, x.clamp(min=0))
    with torch.no_grad():
        xg = x.clone().requires_grad_()
        assert not ops["relu"](xg).requires_grad
    assert ops["relu"](x.clone().requires_grad_()).requires_grad


def test_the_fake_implementations_docstring_says_what_it_derives():
    doc = dt.fake_of("matmul").__doc__
    assert "matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])" in doc
    assert "c: empty [M, N]" in doc


# --- found by the outside-in test ------------------------------------------------------------------


def test_a_gradient_through_an_op_without_a_backward_is_an_error_not_silence(ops):
    x = torch.randn(4, requires_grad=True)
    y = ops["maximum"](x, torch.zeros(4))
    assert y.requires_grad  # the forward runs (a mask or a metric needs no gradient)...
    with pytest.raises(RuntimeError, match=r"dlbridge::maximum has no backward: give one with dlbridge.torch.as_op"):
        y.sum().backward()  # ...but a gradient through it is never silently dropped
    with pytest.raises(RuntimeError, match=r"dlbridge::axpy writes y in place and has no backward"):
        ops["axpy"](1.0, x, torch.zeros(4))
    compiled = torch.compile(lambda a: ops["maximum"](a, torch.zeros_like(a)).sum(), backend="aot_eager")
    with pytest.raises(Exception, match="has no backward"):
        compiled(x).backward()


def test_as_op_again_runs_a_recompiled_kernel_and_register_all_keeps_its_backward(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    first = dlbridge.ElementwiseKernel("T x", "T y", "y = x + 1", "torchop_redefined")
    op = dt.as_op(first, backward=lambda s, g: g)
    x = torch.zeros(3)
    assert torch.equal(op(x), torch.ones(3))
    second = dlbridge.ElementwiseKernel("T x", "T y", "y = x + 100", "torchop_redefined")
    assert second.kernel != first.kernel and dlbridge.get_kernel("torchop_redefined") == second.kernel
    assert dt.as_op(second, backward=lambda s, g: g) is op
    assert torch.equal(op(x), torch.full((3,), 100.0)), "the operator runs the kernel registered last"
    assert dt.register_all()["torchop_redefined"] is op  # the same kernel again: its backward stays
    xg = torch.zeros(3, requires_grad=True)
    op(xg).sum().backward()
    assert torch.equal(xg.grad, torch.ones(3))


def test_builtin_backwards_save_only_what_they_need(ops):
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    h = ops["add"](ops["matmul"](x, w), torch.zeros(3, 5))
    h.add_(1)  # add saves nothing, matmul saves its inputs: the in-place change is fine
    h.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3, 5) @ w.detach().T)
    xs = x.detach().requires_grad_()
    ops["sum"](xs).sum().backward()  # sum saves no tensor, only x's shape
    assert torch.equal(xs.grad, torch.ones(3, 4))


def test_a_failed_as_op_leaves_nothing_behind_and_clashes_are_clear(ops):
    with pytest.raises(ValueError, match=r"writes its inputs \(mut\)"):
        dt.as_op("axpy", name="torchop::axpy_retry", backward=lambda s, g: g)
    assert dt.as_op("axpy", name="torchop::axpy_retry") is torch.ops.torchop.axpy_retry
    lib = torch.library.Library("torchop_outside", "FRAGMENT")
    lib.define("relu(Tensor x) -> Tensor")
    with pytest.raises(ValueError, match=r"torchop_outside::relu is already defined outside dlbridge.torch"):
        dt.as_op("relu", name="torchop_outside::relu")


def test_a_backward_calling_a_kernel_directly_gets_a_hint_under_compile(ops):
    relu = dlbridge.get_kernel("relu")
    op = dt.as_op("gelu", name="torchop::gelu_direct", backward=lambda s, g: g * relu(s.x))
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    op(x).sum().backward()  # eager: real tensors, works
    f = torch.compile(lambda a: op(a).sum(), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="call operators there"):
        f(x.detach().requires_grad_()).backward()


# --- operators keep what they were given -------------------------------------------------------


def test_as_op_again_without_a_backward_drops_the_old_kernels_backward():
    square = dlbridge.ElementwiseKernel("T x", "T y", "y = x * x", "keeps_square_then_cube")
    op = dt.as_op(square, backward=lambda saved, grad_y: 2 * saved.x * grad_y)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    op(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    # Recompiled as x^3, with no backward: x^2's derivative must not stay behind.
    cube = dlbridge.ElementwiseKernel("T x", "T y", "y = x * x * x", "keeps_square_then_cube")
    assert dt.as_op(cube) is op
    y = op(x)
    torch.testing.assert_close(y, x.detach() ** 3)
    with pytest.raises(RuntimeError, match=r"dlbridge::keeps_square_then_cube has no backward"):
        y.sum().backward()


def test_torch_namespaces_are_refused():
    k = dlbridge.ElementwiseKernel("T x", "T y", "y = x", "ns_probe")
    for name in ("aten::ns_probe", "prims::ns_probe", "prim::ns_probe"):
        with pytest.raises(ValueError, match=r"the namespace '(aten|prims|prim)' is torch's own"):
            dt.as_op(k, name)


def test_a_reduction_ops_fake_refuses_the_output_shapes_the_kernel_refuses():
    l2 = dlbridge.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "fake_l2norm")
    op = dt.as_op(l2)
    x = torch.ones(3, 4)
    for bad in (torch.empty(4), torch.empty(3, 4, 1)):
        with pytest.raises(ValueError, match=r"fake_l2norm: output `y` has shape \[\d(, \d)*\]; it must be the kept \(leading\) dims"):
            l2.kernel(x, bad)  # the kernel's own refusal...
        with FakeTensorMode() as mode, pytest.raises(ValueError, match=r"fake_l2norm: output `y` has shape .*; it must be the kept \(leading\) dims"):
            op(mode.from_tensor(x), mode.from_tensor(bad))  # ...and the fake's, under torch.compile's tracing
    y = torch.empty(3)
    op(x, y)
    torch.testing.assert_close(y, torch.full((3,), 2.0))
    with FakeTensorMode() as mode:
        op(mode.from_tensor(x), mode.from_tensor(torch.empty(3)))  # the kept dims: accepted


def test_register_all_is_all_or_nothing():
    # In a fresh interpreter, so that register_all has operators to register.
    code = """
import torch, dlbridge, dlbridge.torch as dt
lib = torch.library.Library("dlbridge", "FRAGMENT")
lib.define("zzz_defined_outside(Tensor x) -> Tensor")
dlbridge.ElementwiseKernel("T x", "T y", "y = x", "zzz_defined_outside")
try:
    dt.register_all()
except ValueError as e:
    assert "zzz_defined_outside is already defined outside dlbridge.torch" in str(e), e
else:
    raise AssertionError("register_all succeeded over a name defined outside dlbridge")
assert dt._REGISTERED == {}, sorted(dt._REGISTERED)
try:
    torch._C._dispatch_find_schema_or_throw("dlbridge::add", "")
except RuntimeError:
    pass
else:
    raise AssertionError("dlbridge::add stayed registered")
lib._destroy()
ops = dt.register_all()
assert torch.equal(ops["add"](torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_python_int_for_an_integer_placeholder_works_eager_and_compiled(tmp_path, monkeypatch, dynamic):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    k = dlbridge.ElementwiseKernel("T x, T s", "T z", "z = x * s", "torchop_int_scale")
    op = dt.as_op(k)
    x = torch.arange(6, dtype=torch.int32)
    assert torch.equal(op(x, 3), x * 3)
    f = torch.compile(lambda x, s: op(x, s) + 1, fullgraph=True, dynamic=dynamic)
    for s in (3, 4):
        assert torch.equal(f(x, s), x * s + 1)
    with pytest.raises(Exception, match="out of range for i32"):
        f(x, 2**40)


def test_an_int_zero_or_one_for_a_bool_placeholder_works_eager_and_under_dynamic_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    op = dt.as_op(dlbridge.ElementwiseKernel("T x, T s", "T z", "z = x + s", "torchop_bool_shift"))
    x = torch.zeros(2, dtype=torch.bool)
    assert op(x, 1).tolist() == [True, True]
    f = torch.compile(lambda x: op(x, x.shape[0] - 1), fullgraph=True, dynamic=True)
    assert f(x).tolist() == [True, True] and f(torch.zeros(1, dtype=torch.bool)).tolist() == [False]
    with pytest.raises(Exception, match="torchop_bool_shift: argument s: the scalar is not a bool"):
        f(torch.zeros(3, dtype=torch.bool))


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_python_int_beyond_float16s_range_is_refused_eager_and_compiled(tmp_path, monkeypatch, dynamic):
    monkeypatch.setenv("DLBRIDGE_CACHE_DIR", str(tmp_path))
    op = dt.as_op(dlbridge.ElementwiseKernel("T x, T s", "T z", "z = x + s", "torchop_f16_shift"))
    x = torch.zeros(2, dtype=torch.float16)
    with pytest.raises(OverflowError, match="torchop_f16_shift: argument s: the scalar 70000 is out of range for f16"):
        op(x, 70000)
    f = torch.compile(lambda x, s: op(x, s), fullgraph=True, dynamic=dynamic)
    assert f(x, 65519).tolist() == [65504.0, 65504.0]
    for s in (65520, 70000, -70000):
        with pytest.raises(Exception, match="torchop_f16_shift: argument s: the scalar .*out of range for f16"):
            f(x, s)
