"""dlbridge kernels as JAX functions (dlbridge.jax): eager calls return
jax.Arrays, and under jax.jit / jax.vmap a call is one XLA FFI custom call
into dlbridge's handler, checked against jax.numpy references."""

from __future__ import annotations

import subprocess
import sys
import weakref

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import dlbridge  # noqa: E402
import dlbridge._frameworks  # noqa: E402
import dlbridge.jax as djax  # noqa: E402


def arange(*shape: int, dtype: str = "float32") -> jax.Array:
    n = int(np.prod(shape))
    return (jnp.arange(n, dtype=dtype).reshape(shape) - n / 3) / 7


def test_an_eager_call_returns_a_jax_array():
    add = djax.as_op("add")
    x = arange(3, 4)
    y = add(x, x)
    assert isinstance(y, jax.Array)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x + x))


@pytest.mark.parametrize(
    ("name", "args", "reference"),
    [
        ("add", (arange(4, 5), arange(4, 5) * 2), lambda a, b: a + b),
        ("mul", (arange(4, 5), arange(4, 5)), lambda a, b: a * b),
        ("relu", (arange(6, 7),), lambda x: jnp.maximum(x, 0)),
        ("gelu", (arange(6, 7),), lambda x: jax.nn.gelu(x, approximate=False)),
        ("softmax", (arange(3, 8),), lambda x: jax.nn.softmax(x, axis=-1)),
        ("sum", (arange(3, 8),), lambda x: x.sum(-1)),
        ("mean_all", (arange(3, 8),), lambda x: x.mean()),
        ("matmul", (arange(5, 3), arange(3, 4)), lambda a, b: a @ b),
    ],
)
def test_builtins_under_jit_match_jax_numpy(name, args, reference):
    op = djax.as_op(name)
    got = jax.jit(op)(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference(*args)), rtol=1e-5, atol=1e-6)


def test_the_jitted_call_is_dlbridges_custom_call_and_no_callback():
    f = jax.jit(lambda x: djax.as_op("relu")(x) * 2)
    text = f.lower(arange(8)).as_text()
    assert f'custom_call @{djax.TARGET}' in text or f'call_target_name = "{djax.TARGET}"' in text, text
    assert 'dlbridge_kernel = "relu"' in text, text
    assert "callback" not in text, text


def test_vmap_batches_a_leading_group_in_one_call_and_matmul_per_element():
    softmax, matmul = djax.as_op("softmax"), djax.as_op("matmul")
    x = arange(4, 3, 5)
    np.testing.assert_allclose(np.asarray(jax.vmap(softmax)(x)), np.asarray(jax.nn.softmax(x, -1)), rtol=1e-6)
    a, b = arange(4, 2, 3), arange(4, 3, 5)
    np.testing.assert_allclose(np.asarray(jax.vmap(matmul)(a, b)), np.asarray(a @ b), rtol=1e-5, atol=1e-6)
    text = jax.jit(jax.vmap(softmax)).lower(x).as_text()
    assert text.count("dlbridge_kernel_handle") == 1, "one custom call for the whole batch"


def test_a_mut_parameter_comes_back_as_a_new_array_and_the_argument_is_unchanged():
    axpy = djax.as_op("axpy")
    x, y = arange(6), jnp.ones(6, dtype="float32")
    before = np.asarray(y).copy()
    new_y = jax.jit(axpy, static_argnums=0)(2.0, x, y)
    np.testing.assert_allclose(np.asarray(new_y), before + 2.0 * np.asarray(x), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(y), before)


def test_a_kernel_from_source_runs_under_jit():
    k = dlbridge.ElementwiseKernel("T x, T y", "T z", "z = (x - y) * (x - y)", "jax_squared_diff")
    op = djax.as_op(k)
    x, y = arange(3, 4), arange(4) * 3
    np.testing.assert_allclose(np.asarray(jax.jit(op)(x, y)), np.asarray((x - y) ** 2), rtol=1e-6)


def test_a_signature_mismatch_is_a_trace_time_error_naming_kernel_and_argument():
    matmul = djax.as_op("matmul")
    with pytest.raises(ValueError, match=r"matmul: argument b: dim K = 3 \(bound by a\) but got 4"):
        jax.jit(matmul).lower(arange(2, 3), arange(4, 5))
    with pytest.raises(TypeError, match=r"matmul: argument a: .*i8"):
        jax.jit(matmul).lower(jnp.zeros((2, 2), "int8"), jnp.zeros((2, 2), "int8"))


def test_scalars_are_fixed_at_trace_time():
    axpy = djax.as_op("axpy")
    with pytest.raises(TypeError, match="axpy: argument alpha: a f64 scalar is fixed when the call is traced"):
        jax.jit(axpy)(2.0, arange(3), arange(3))
    with pytest.raises(TypeError, match="axpy: argument alpha: expected a f64 scalar, got str"):
        axpy("2", arange(3), arange(3))


def test_register_all_gives_every_kernel_with_results():
    ops = djax.register_all()
    assert {"add", "softmax", "matmul", "axpy"} <= set(ops)
    np.testing.assert_allclose(np.asarray(ops["sub"](arange(3), arange(3))), 0.0)


def test_kernels_are_weakly_referenceable():
    k = dlbridge.get_kernel("add")
    assert weakref.ref(k)() is k


def test_the_benchmark_runs_and_prints_ratios_against_jax_numpy():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "bench_jax.py"
    out = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if "ratio" in line]
    assert len(rows) == 4, out
    assert all("jax.numpy" in r for r in rows), out


@pytest.mark.parametrize(
    ("name", "args", "reference"),
    [
        ("mul", (arange(3, 4), arange(3, 4) + 1), lambda a, b: a * b),
        ("div", (arange(3, 4), arange(3, 4) + 5), lambda a, b: a / b),
        ("relu", (arange(4, 5),), lambda x: jnp.maximum(x, 0)),
        ("gelu", (arange(4, 5),), lambda x: jax.nn.gelu(x, approximate=False)),
        ("softmax", (arange(3, 6),), lambda x: jax.nn.softmax(x, axis=-1)),
        ("matmul", (arange(3, 4), arange(4, 2)), lambda a, b: a @ b),
        ("mean", (arange(3, 6),), lambda x: x.mean(-1)),
        ("sum_all", (arange(3, 6),), lambda x: x.sum()),
    ],
)
def test_grad_of_builtins_matches_jax_numpy(name, args, reference):
    op = djax.as_op(name)
    argnums = tuple(range(len(args)))
    weights = arange(*np.shape(reference(*args))) + 1  # a cotangent that is not all ones

    def loss(f):
        return lambda *a: (f(*a) * weights).sum()

    got = jax.jit(jax.grad(loss(op), argnums=argnums))(*args)
    want = jax.grad(loss(reference), argnums=argnums)(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-5)


def test_a_kernel_from_source_takes_a_backward_and_broadcast_inputs_get_summed_gradients():
    k = dlbridge.ElementwiseKernel("T x, T b", "T y", "y = x * x + b", "jax_square_plus")
    op = djax.as_op(k, backward=lambda s, g: (2 * s.x * g, g))
    x, b = arange(3, 4), arange(4)
    gx, gb = jax.grad(lambda x, b: op(x, b).sum(), argnums=(0, 1))(x, b)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(2 * x), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gb), np.full(4, 3.0), rtol=1e-6)
    assert gb.shape == b.shape


def test_a_backward_for_a_kernel_that_writes_its_inputs_is_refused():
    with pytest.raises(ValueError, match=r"as_op\(axpy\): a backward for a kernel that writes its inputs"):
        djax.as_op("axpy", backward=lambda s, g: None)


def test_vmap_of_an_elementwise_kernel_lines_the_batch_up_with_broadcast_arguments():
    op = djax.as_op(dlbridge.ElementwiseKernel("T x, T y", "T z", "z = x * y", "jax_vmap_mul"))
    x, y = jnp.ones((3, 3), "float32"), jnp.array([1.0, 2.0, 3.0], "float32")
    np.testing.assert_array_equal(np.asarray(jax.vmap(op)(x, y)), np.asarray(jax.vmap(jnp.multiply)(x, y)))
    twice = jax.vmap(lambda x: op(x, jnp.float32(2)))(jnp.ones((4, 3), "float32"))
    np.testing.assert_array_equal(np.asarray(twice), np.full((4, 3), 2.0))


def test_vmap_of_a_load_inline_function_runs_per_element_by_default():
    src = "void normalize(const float* x, float* y, long long n) { float s = 0; for (long long i = 0; i < n; ++i) s += x[i]; for (long long i = 0; i < n; ++i) y[i] = x[i] / s; }"
    mod = dlbridge.load_inline("jax_normalize", src, ["normalize(x: f32[...S]) -> (y: f32[...S])"])
    op = djax.as_op(mod.normalize)
    x = jnp.array([[1.0, 1.0], [3.0, 5.0]], "float32")
    np.testing.assert_allclose(np.asarray(jax.vmap(op)(x)), [[0.5, 0.5], [0.375, 0.625]], rtol=1e-6)


def test_a_scalar_given_to_a_differentiable_kernel_is_checked_before_tracing_reaches_it():
    src = "void jax_scale(const float* x, double a, float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] = x[i] * (float)a; }"
    mod = dlbridge.load_inline("jax_scale_lib", src, ["jax_scale(x: f32[N], a: f64) -> (y: f32[N])"])
    op = djax.as_op(mod.jax_scale, backward=lambda s, g: (g * s.a, None))
    with pytest.raises(TypeError, match="jax_scale: argument a: a f64 scalar is fixed when the call is traced"):
        jax.jit(op)(arange(3), 0.5)
    with pytest.raises(TypeError, match=r"jax_scale: argument a: expected a f64 scalar, got bool"):
        op(arange(3), np.bool_(True))
    np.testing.assert_allclose(np.asarray(jax.grad(lambda x: op(x, 3.0).sum())(arange(3))), 3.0)


# --- Plain kernel calls on JAX arrays: JAX arrays are immutable, so dlbridge
# allocates and JAX takes the buffer over (dlbridge.register_allocator's `finish`).

add, relu, softmax, matmul = (dlbridge.get_kernel(n) for n in ("add", "relu", "softmax", "matmul"))
x32 = arange


@pytest.mark.parametrize(
    ("kernel", "args", "reference"),
    [
        (add, (x32(3, 4), x32(3, 4)), lambda a, b: a + b),
        (relu, (x32(5, 6),), lambda x: jnp.maximum(x, 0)),
        (softmax, (x32(4, 8),), lambda x: jax.nn.softmax(x, axis=-1)),
        (dlbridge.get_kernel("sum"), (x32(4, 8),), lambda x: x.sum(-1)),
        (matmul, (x32(5, 3), x32(3, 4)), lambda a, b: a @ b),
    ],
)
def test_a_plain_call_on_jax_arrays_returns_jax_arrays(kernel, args, reference):
    out = kernel(*args)
    assert isinstance(out, jax.Array)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference(*args)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transform", ["jit", "grad", "vmap"])
def test_a_plain_call_inside_a_jax_transform_says_to_use_as_op(transform):
    def f(x):
        return relu(x).sum()

    wrapped = {"jit": jax.jit(f), "grad": jax.grad(f), "vmap": jax.vmap(f)}[transform]
    with pytest.raises(TypeError, match=r"a JAX tracer \(\w+Tracer\): .*call the kernel through dlbridge.jax.as_op\(kernel\)") as e:
        wrapped(x32(3, 4))
    assert e.value.__cause__ is not None, "JAX's own error is kept as the cause"
    assert float(jax.jit(lambda x: djax.as_op(relu)(x).sum())(x32(3, 4))) > 0


def test_jax_takes_the_buffer_the_kernel_filled_without_a_copy():
    written = []

    def finish(a):
        written.append(a.data_ptr)
        return dlbridge._frameworks._jax_finish(a)

    dlbridge.register_allocator("jax.Array", finish=finish)
    try:
        out = add(x32(1024), x32(1024))
    finally:
        dlbridge._frameworks.install()
    assert out.unsafe_buffer_pointer() == written[0], "the jax.Array is the dlbridge output's memory"


def test_a_jax_array_is_never_written():
    x = x32(4)
    before = np.asarray(x).copy()
    with pytest.raises(BufferError):
        add(x, x, out=x)
    np.testing.assert_array_equal(np.asarray(x), before)


def test_cupys_elementwise_examples_on_jax_arrays_return_jax_arrays():
    squared_diff = dlbridge.ElementwiseKernel("T x, T y", "T z", "z = (x - y) * (x - y)", "squared_diff_fw")
    x = x32(2, 5)
    for got, want in [
        (squared_diff(x, 5), (x - 5) ** 2),
        (squared_diff(5, x), (5 - x) ** 2),  # a leading scalar: still JAX's outputs
        (squared_diff(x, x32(1, 5) * 2), (x - x32(1, 5) * 2) ** 2),  # broadcasting
    ]:
        assert isinstance(got, jax.Array)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    # raw arguments and _ind (CuPy's reversing example)
    rev = dlbridge.ElementwiseKernel("T x, raw T y", "T z", "z = x + y[_ind.size() - i - 1]", "add_reverse_fw")
    v = x32(6)
    got = rev(v, v)
    assert isinstance(got, jax.Array)
    np.testing.assert_allclose(np.asarray(got), np.asarray(v + v[::-1]), rtol=1e-6)


def test_cupys_l2norm_reduction_on_jax_arrays_returns_jax_arrays():
    l2norm = dlbridge.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm_fw")
    x = x32(3, 5)
    for kwargs, want in [
        ({"axis": 1}, jnp.linalg.norm(x, axis=1)),
        ({"axis": 0, "keepdims": True}, jnp.linalg.norm(x, axis=0, keepdims=True)),
        ({}, jnp.linalg.norm(x)),
    ]:
        got = l2norm(x, **kwargs)
        assert isinstance(got, jax.Array), kwargs
        assert got.shape == want.shape, kwargs
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)


def test_a_64_bit_argument_jax_narrowed_is_named_with_the_setting_that_keeps_it():
    # A fresh process: other tests here turn jax_enable_x64 on.
    script = """
import numpy as np, jax.numpy as jnp, dlbridge, dlbridge.jax
k = dlbridge.define("def takes_i64(float(N) X, int64(N) Q) -> (A) { A(i) = X(i) * Q(i) }", name="takes_i64")
try:
    dlbridge.jax.as_op(k)(jnp.ones(3), np.array([1, 2, 3], np.int64))
except TypeError as e:
    print(e)
print(dlbridge.jax.as_op("add")(jnp.ones(3, jnp.int32), np.array([1, 2, 3], np.int64)).tolist())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True).stdout.splitlines()
    assert out[0] == (
        "takes_i64: argument Q: dtype mismatch: expected i64, got i32 "
        "(JAX keeps 64-bit types only with jax.config.update('jax_enable_x64', True): Q: int64 became int32)"
    ), out
    assert out[1] == "[2, 3, 4]", "an argument JAX narrows to what the kernel takes still runs"


_EXPORTER = """
import sys, numpy as np, jax, jax.numpy as jnp, dlbridge, dlbridge.jax as djax
relu_like = dlbridge.ElementwiseKernel("T x", "T y", "y = x > 0 ? x : T(0)", "exported_relu_like")
op = djax.as_op(relu_like)
# dlbridge's custom call has no compatibility guarantee across JAX versions: export says so.
unchecked = [jax.export.DisabledSafetyCheck.custom_call(djax.TARGET)]
exported = jax.export.export(jax.jit(op), disabled_checks=unchecked)(jax.ShapeDtypeStruct((4,), jnp.float32))
sys.stdout.buffer.write(exported.serialize())
"""

_LOADER = """
import sys, numpy as np, jax, jax.numpy as jnp, dlbridge, dlbridge.jax as djax
# No call through as_op before the program runs: importing dlbridge.jax registers the handler.
# Kernels defined first take the handle numbers the exporting process gave its kernel.
for k in range(8):
    djax.as_op(dlbridge.ElementwiseKernel("T x", "T y", f"y = x * {k + 2}", f"collider_{k}"))
mode = sys.argv[1]
if mode == "same":
    dlbridge.ElementwiseKernel("T x", "T y", "y = x > 0 ? x : T(0)", "exported_relu_like")
elif mode == "other":
    dlbridge.ElementwiseKernel("T x", "T y", "y = -x", "exported_relu_like")
exported = jax.export.deserialize(bytearray(sys.stdin.buffer.read()))
try:
    print("result", np.asarray(exported.call(jnp.array([-1.0, 2.0, -3.0, 4.0], jnp.float32))).tolist())
except Exception as e:
    print("error", type(e).__name__, e)
"""


def _run(code: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], input=stdin, capture_output=True, timeout=300)


def test_an_exported_program_runs_the_kernel_it_was_built_for_in_another_process_or_refuses():
    made = _run(_EXPORTER)
    assert made.returncode == 0, made.stderr.decode()
    blob = made.stdout
    same = _run(_LOADER, "same", stdin=blob)
    assert same.returncode == 0, same.stderr.decode()
    assert same.stdout.decode().strip() == "result [0.0, 2.0, 0.0, 4.0]", same.stdout.decode()
    other = _run(_LOADER, "other", stdin=blob).stdout.decode()
    assert "error" in other and "exported_relu_like" in other and "built for the kernel with digest" in other, other
    assert "y = -x" not in other and "result" not in other, other
    missing = _run(_LOADER, "missing", stdin=blob).stdout.decode()
    assert "this program calls a kernel this process has not defined; define it" in missing, missing


@pytest.mark.parametrize(
    "operation, preamble",
    [
        ("y = x + i", ""),
        ("y = x + _ind.size()", ""),
        ("y = x * n", ""),
        ("y = x + (T)CAT(_, ind).size()", "#define CAT(a, b) a##b"),
        # Read as the compiler lexes: a `'` after an identifier opens a character literal,
        # and a lone carriage return ends a `//` comment.
        ("y = x; y += sizeof'\"' * 0 + (T)i; // \"", ""),
        ("y = x; // note\r y = x + (T)i;", ""),
        # Names of state each call starts afresh, however called.
        ("volatile float a = x, b = 3.0f; y = (T)(a / b) * 3.0f - x; (fesetround)(FE_UPWARD);", ""),
        ("volatile float a = x, b = 3.0f; y = (T)(a / b) * 3.0f - x; auto exp = fesetround; exp(FE_UPWARD);", ""),
        ("y = x + (T)(errno == 77); errno = 77;", ""),
        ("y = x + (T)[]{ return errno == 77; }(); []{ return errno = 77; }();", ""),
        ("int a = 0; (void)a, errno = errno; y = x + (T)(errno == 77); errno = 77;", ""),
        # Math a vector library computes in a loop's body and the scalar one in its tail.
        ("y = tanh(x)", ""),
        # A splice past a form feed, as GCC reads it.
        ("y = x; /* *\\\f\n/ y = x + (T)i; /* */", ""),
        # A preamble function whose own body reads the floating-point environment,
        # which each call starts from afresh.
        (
            "y = q::first(x)",
            "namespace q { inline float first(float v) { float r = fegetround() == FE_TONEAREST ? v : v + 100.0f; "
            "fesetround(FE_UPWARD); return r; } }",
        ),
    ],
)
def test_vmap_of_an_elementwise_kernel_that_reads_its_position_matches_calls_per_element(operation, preamble):
    k = dlbridge.ElementwiseKernel("T x", "T y", operation, f"positional_{abs(hash(operation)) % 10**6}", preamble=preamble)
    assert not k.kernel.per_element
    op = djax.as_op(k)
    xs = arange(3, 5)
    batched = np.asarray(jax.vmap(op)(xs))
    one_by_one = np.stack([np.asarray(op(x)) for x in xs])
    np.testing.assert_array_equal(batched, one_by_one)
    assert dlbridge.ElementwiseKernel("T x", "T y", "y = x * 2", "not_positional").kernel.per_element


@pytest.mark.parametrize(
    "operation, preamble",
    [
        ("static int count = 0; y = x + (T)(count++)", ""),
        ("y = x + (T)(((size_t)&y / sizeof(T)) % 7)", ""),
        ("y = x + (T)((reinterpret_cast<unsigned long>(__builtin_addressof(y)) % 64) / sizeof(T))", ""),
        ("y = x + (T)((reinterpret_cast<unsigned long>(std::addressof(y)) % 64) / sizeof(T))", "#include <memory>"),
        ("y = x + (T)(where_of(y) % 7)", "template <class V> unsigned long where_of(const V& v) { return (unsigned long)&v / sizeof(V); }"),
        # Functions that take the element by reference, however spelt: only calls that cannot see
        # an address (the runtime's math, casts, the preamble's own functions) are batched.
        ("y = x + (T)((reinterpret_cast<unsigned long>(std::__addressof(y)) % 64) / sizeof(T))", ""),
        ("y = x + (T)(reinterpret_cast<unsigned long>(std::pointer_traits<T*>::pointer_to(y)) % 7)", "#include <memory>"),
        ("y = x + (T)(reinterpret_cast<unsigned long>(std::__addressof(y)) % 7)", "#include <memory>\nusing namespace std;"),
        # `bitand y` is `&y`; a member function sees the element as `this`.
        ("y = x + (T)(((size_t)(bitand y) / sizeof(T)) % 16)", ""),
        ("y = x + (T)(((W&&)y).where())", "struct W { float v; unsigned long where() { return (unsigned long)this / sizeof(float) % 16; } };"),
        # An operator of the preamble's runs without a call; a cast to a reference to an array decays.
        ("y = x + (T)(((W&&)y) + 0)", "struct W { float v; unsigned long operator+(int) { return (unsigned long)this / sizeof(float) % 16; } };"),
        ("y = x + (T)((((unsigned long)(T(&&)[1])y) / sizeof(T)) % 16)", ""),
        # A reference type made without `&`: a type trait, a typedef spelt with `and`.
        ("y = x + (T)((((unsigned long)(std::add_lvalue_reference_t<T[1]>)y) / sizeof(T)) % 16)", ""),
        ("typedef T A1[1]; typedef A1 and AR; y = x + (T)((((unsigned long)(AR)y) / sizeof(T)) % 16)", ""),
        # A number made an address: of data, or of a function (never run here).
        ("y = *(T*)(size_t)4096", ""),
        ("y = rint(x); ((int(*)(int))4096ULL)(0x800)", ""),
        # A constructor runs without a call's name before its parentheses.
        ("R r{1}; y = x", "struct R { int v; R(int k) : v(k) { fesetround(FE_UPWARD); } };"),
    ],
)
def test_an_elementwise_kernel_with_state_or_addresses_is_batched_one_call_per_element(operation, preamble):
    # Such a kernel gives other values from call to call: what vmap must not do is
    # run the batch as one call, where the state or addresses span the batch.
    k = dlbridge.ElementwiseKernel("T x", "T y", operation, f"stateful_{abs(hash(operation)) % 10**6}", preamble=preamble)
    assert not k.kernel.per_element
    assert djax._vmap_method(k.kernel) == "sequential"


def test_vmap_of_the_addressof_spelling_libstdcxx_uses_matches_calls_per_element():
    k = dlbridge.ElementwiseKernel(
        "T x", "T y", "y = x + (T)((reinterpret_cast<unsigned long>(std::__addressof(y)) % 64) / sizeof(T))", "vm_libstdcxx_addressof"
    )
    op = djax.as_op(k)
    xs = arange(3, 4)
    np.testing.assert_array_equal(np.asarray(jax.vmap(op)(xs)), np.stack([np.asarray(op(x)) for x in xs]))


def test_only_a_kernel_naming_its_arguments_math_casts_and_control_flow_is_batched_as_one_call():
    for operation in ("y = sqrt(x) * T(2) + max(x, T(0))", "y = std::fabs(x) + static_cast<T>(1)", "if (x > 0) { y = x; } else { y = -x; }"):
        k = dlbridge.ElementwiseKernel("T x", "T y", operation, f"blind_{abs(hash(operation)) % 10**6}")
        assert k.kernel.per_element, operation
    # A preamble, a local, a name from elsewhere: calls per element (always right, only slower).
    for operation, preamble in (("y = k::twice(x)", "namespace k { inline float twice(float v) { return 2 * v; } }"),
                                ("auto t = tanh(x); y = t", ""), ("y = x + (T)[]{ return errno == 77; }()", ""),
                                # A vector library may round tanh otherwise than the scalar one.
                                ("y = tanh(x)", ""),
                                ("int a = 0; (void)a, errno = errno; y = x", "")):
        k = dlbridge.ElementwiseKernel("T x", "T y", operation, f"named_{abs(hash(operation)) % 10**6}", preamble=preamble)
        assert not k.kernel.per_element, operation


@pytest.mark.parametrize("value", [np.uint64(2**64 - 1), 2**63, -(2**63) - 1])
def test_an_i64_scalar_out_of_range_is_an_overflow_error_naming_kernel_and_argument(value):
    src = "void shift_i64(const float* x, long long s, float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] = x[i] + (float)s; }"
    mod = dlbridge.load_inline("i64_scalar_range", src, ["shift_i64(x: f32[N], s: i64) -> (y: f32[N])"])
    op = djax.as_op(mod.shift_i64)
    with pytest.raises(OverflowError, match=r"shift_i64: argument s: .* is out of the range of an i64 scalar"):
        op(arange(3), value)
    with pytest.raises(OverflowError, match=r"shift_i64"):
        mod.shift_i64(np.zeros(3, np.float32), value)


def test_a_scalar_of_thousands_of_digits_is_an_overflow_error_naming_kernel_and_argument():
    # Python prints no int of more than 4300 digits: the message gives its size instead.
    k = dlbridge.ElementwiseKernel("T x, int64 s", "T z", "z = x + (T)s", "huge_int_scalar")
    for call in (lambda: k(np.zeros(2, np.float32), 10**5000), lambda: djax.as_op(k)(arange(2), 10**5000)):
        with pytest.raises(OverflowError, match=r"huge_int_scalar: argument s: .*integer of about 5001 digits"):
            call()


@pytest.mark.parametrize("value", [np.int64(2**40 + 5), 2**40, np.int64(2**32 - 1), -(2**31) - 1])
def test_a_number_for_a_typed_tensor_parameter_is_range_checked_as_the_kernels_own_call_checks_it(value):
    k = dlbridge.ElementwiseKernel("T x, int32 s", "T z", "z = x + (T)s", "jax_i32_param")
    op = djax.as_op(k)
    x = jnp.ones(4, jnp.float32)
    with pytest.raises(OverflowError, match=r"jax_i32_param: argument s: the scalar .* is out of range for i32"):
        op(x, value)
    with pytest.raises(OverflowError, match=r"jax_i32_param: argument s: the scalar .* is out of range for i32"):
        k(np.ones(4, np.float32), value)
    # In range, any Python or NumPy integer is taken at the parameter's own dtype.
    np.testing.assert_array_equal(np.asarray(op(x, np.int64(2**31 - 1))), np.ones(4, np.float32) + np.float32(2**31 - 1))
    u8 = djax.as_op(dlbridge.ElementwiseKernel("T x, uint8 u", "T z", "z = x + (T)u", "jax_u8_param"))
    np.testing.assert_array_equal(np.asarray(u8(x, 3)), np.full(4, 4, np.float32))
    with pytest.raises(OverflowError, match=r"jax_u8_param: argument u: the scalar 256 is out of range for u8"):
        u8(x, 256)


def test_an_f64_scalar_too_large_for_a_float_is_an_overflow_error_naming_kernel_and_argument():
    src = "void scale_f64(const float* x, double s, float* y, long long n) { for (long long i = 0; i < n; ++i) y[i] = x[i] * (float)s; }"
    mod = dlbridge.load_inline("f64_scalar_range", src, ["scale_f64(x: f32[N], s: f64) -> (y: f32[N])"])
    with pytest.raises(OverflowError, match=r"scale_f64: argument s: .* is out of the range of an f64 scalar"):
        djax.as_op(mod.scale_f64)(arange(3), 10**400)


def test_a_float_scalar_its_dtype_would_round_to_infinity_is_an_overflow_error():
    for dtype, name, big, fine in (("float16", "f16", 1e5, 65504.0), ("float32", "f32", 1e300, 3.0e38)):
        k = dlbridge.ElementwiseKernel(f"float32 x, {dtype} s", "float32 z", "z = x + (float)s", f"jax_{name}_param")
        x32 = np.arange(2, dtype=np.float32)
        with pytest.raises(OverflowError, match=rf"jax_{name}_param: argument s: the scalar .* is out of range for {name}"):
            djax.as_op(k)(jnp.asarray(x32), big)
        with pytest.raises(OverflowError, match=rf"jax_{name}_param: argument s: the scalar .* is out of range for {name}"):
            k(x32, big)
        assert np.isfinite(np.asarray(djax.as_op(k)(jnp.asarray(x32), fine))).all()
        assert np.isinf(k(x32, float("inf"))).all()  # infinity itself is a float value
    bf = djax.as_op(dlbridge.ElementwiseKernel("float32 x, bfloat16 s", "float32 z", "z = x + (float)s", "jax_bf16_param"))
    np.testing.assert_array_equal(np.asarray(bf(jnp.zeros(2, jnp.float32), 1.5)), np.full(2, 1.5, np.float32))
