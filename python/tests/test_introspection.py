"""An installable, introspectable package: kernels introspect like Python functions
(``inspect.signature``, ``help``, ``params``/``outputs``/``dtypes``), ``load_plugin``
describes the plugin, ``dlbridge.Array`` follows NumPy's names and semantics where they
overlap, and the type stubs match the module (mypy's stubtest)."""

import inspect
import itertools
import os
import pydoc
import random
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import dlbridge
from dlbridge import _introspect

ROOT = Path(__file__).resolve().parents[2]
P = inspect.Parameter


# ---------------------------------------------------------------------------
# Kernels


def test_every_kernel_has_a_signature_that_describes_its_call():
    kernels = dlbridge.list_kernels()
    assert kernels
    for k in kernels:
        sig = inspect.signature(k)
        params = list(sig.parameters.values())
        inputs = params[: len(k.params)]
        assert [p.name for p in inputs] == [p.name for p in k.params], k.name
        assert all(p.kind is P.POSITIONAL_ONLY and p.default is P.empty for p in inputs), k.name
        for p, q in zip(inputs, k.params):
            want = {"f64": float, "i64": int, "bool": bool}[q.dtype] if q.kind == "scalar" else q.annotation
            assert p.annotation == want, (k.name, p)
        args = [object()] * len(k.params)
        sig.bind(*args)
        if k.outputs:
            outs, out = params[len(k.params) :]
            assert (outs.name, outs.kind) == ("outs", P.VAR_POSITIONAL)
            assert (out.name, out.kind, out.default) == ("out", P.KEYWORD_ONLY, None)
            sig.bind(*args, *[object()] * len(k.outputs))  # destination-passing
            sig.bind(*args, out=object())
            assert sig.return_annotation == k.outputs[0].annotation if len(k.outputs) == 1 else True
        else:
            assert len(params) == len(k.params) and sig.return_annotation is None
            with pytest.raises(TypeError):
                sig.bind(*args, out=object())
        with pytest.raises(TypeError):
            sig.bind(*args[:-1]) if args else sig.bind(1, out=None, bogus=1)


def test_signatures_of_matmul_and_axpy():
    matmul = dlbridge.get_kernel("matmul")
    assert str(inspect.signature(matmul)) == (
        "(a: 'T[M, K]', b: 'T[K, N]', /, *outs: 'T[M, N]', out: 'T[M, N] | None' = None) -> 'T[M, N]'"
    )
    assert str(inspect.signature(dlbridge.get_kernel("axpy"))) == "(alpha: float, x: 'T[N]', y: 'mut T[N]', /) -> None"
    # The signature is the real call: whatever it binds, the kernel accepts.
    a, b = np.ones((2, 3)), np.ones((3, 4))
    bound = inspect.signature(matmul).bind(a, b)
    bound.apply_defaults()
    np.testing.assert_allclose(matmul(*bound.args, **bound.kwargs), a @ b)
    c = np.empty((2, 4))
    bound = inspect.signature(matmul).bind(a, b, out=c)
    assert matmul(*bound.args, **bound.kwargs) is c


def test_signature_of_scalars_keywords_and_several_outputs():
    """Built from the kernel's params: i64/bool scalars are int/bool, names that are Python
    keywords or `out`/`outs` get an underscore (positional-only names never reach a call)."""

    def param(name, kind, dtype, annotation, mutable=False):
        return types.SimpleNamespace(name=name, kind=kind, dtype=dtype, annotation=annotation, mutable=mutable)

    fake = types.SimpleNamespace(
        name="f",
        signature="f(lambda: i64, out: f32[N], flag: bool) -> (y: f32[N], n: i64[])",
        doc="",
        devices=["cpu"],
        dtypes={},
        params=[param("lambda", "scalar", "i64", "i64"), param("out", "tensor", "f32", "f32[N]"), param("flag", "scalar", "bool", "bool")],
        outputs=[param("y", "tensor", "f32", "f32[N]"), param("n", "tensor", "i64", "i64[]")],
    )
    assert str(_introspect.signature_of(fake)) == (
        "(lambda_: int, out_: 'f32[N]', flag: bool, /, *outs: 'f32[N] | i64[]', "
        "out: 'tuple[f32[N], i64[]] | None' = None) -> 'tuple[f32[N], i64[]]'"
    )


def test_help_and_doc_show_the_signature_and_the_description():
    for k in dlbridge.list_kernels():
        assert k.__doc__.startswith(k.signature + "\n")
        assert k.doc in k.__doc__ and inspect.getdoc(k) == k.__doc__
    k = dlbridge.get_kernel("matmul")
    text = pydoc.render_doc(k, renderer=pydoc.plaintext)
    assert k.signature in text and k.doc in text and "matmul(a, b, out=c)" in text
    assert "writes y in place; returns None" in dlbridge.get_kernel("axpy").__doc__
    # The class keeps its own docstring, and inspect is not confused by the class.
    assert "kernel" in dlbridge.Kernel.__doc__.lower()
    assert dlbridge.Kernel.__signature__ is None
    try:
        inspect.signature(dlbridge.Kernel)
    except ValueError:
        pass  # "no signature found" is fine; a TypeError about __signature__ is not
    assert "Kernel" in pydoc.render_doc(dlbridge.Kernel, renderer=pydoc.plaintext)


def test_wrappers_keep_the_signature():
    f = dlbridge.to_pytorch_func(dlbridge.get_kernel("matmul"))
    assert inspect.signature(f) == inspect.signature(dlbridge.get_kernel("matmul"))


def test_params_outputs_and_dtypes():
    matmul = dlbridge.get_kernel("matmul")
    assert matmul.name == "matmul" and matmul.devices == ["cpu", "cuda"]
    assert matmul.signature == "matmul<T: f32|f64>(a: T[M, K], b: T[K, N]) -> (c: T[M, N])"
    assert matmul.doc.startswith("c = a @ b")
    assert matmul.dtypes == {"T": ["f32", "f64"]}
    a, b = matmul.params
    assert (a.name, a.kind, a.dtype, a.dtypes, a.dims, a.mutable) == ("a", "tensor", "T", ("f32", "f64"), ("M", "K"), False)
    assert (b.dims, b.annotation, str(b)) == (("K", "N"), "T[K, N]", "b: T[K, N]")
    (c,) = matmul.outputs
    assert (c.name, c.dims, c.mutable) == ("c", ("M", "N"), False)
    assert repr(a) == "dlbridge.Param(name='a', kind='tensor', dtype='T', dtypes=('f32', 'f64'), dims=('M', 'K'), mutable=False)"
    assert isinstance(a, dlbridge.Param)

    alpha, x, y = dlbridge.get_kernel("axpy").params
    assert (alpha.kind, alpha.dtype, alpha.dtypes, alpha.dims, alpha.annotation) == ("scalar", "f64", ("f64",), None, "f64")
    assert (y.mutable, y.annotation, x.mutable) == (True, "mut T[N]", False)
    assert dlbridge.get_kernel("axpy").outputs == []

    mean = dlbridge.get_kernel("mean")
    assert mean.params[0].dims == ("...B", "N") and mean.outputs[0].dims == ("...B",)
    assert dlbridge.get_kernel("sum_all").outputs[0].dims == ()
    # Values, so equal params compare and hash equal.
    assert dlbridge.get_kernel("add").params[0] == dlbridge.get_kernel("sub").params[0]
    assert len({dlbridge.get_kernel("add").params[0], dlbridge.get_kernel("sub").params[0]}) == 1
    assert dlbridge.get_kernel("add").params[0] != dlbridge.get_kernel("add").params[1]
    with pytest.raises(AttributeError):
        a.name = "z"
    # Every type variable a param names is in the kernel's dtypes, with the same set.
    for k in dlbridge.list_kernels():
        for p in k.params + k.outputs:
            if p.dtype in k.dtypes:
                assert list(p.dtypes) == k.dtypes[p.dtype]


def test_load_plugin_describes_the_plugin(c_plugin):
    plugin = dlbridge.load_plugin(c_plugin)  # a path-like works as well as a str
    assert isinstance(plugin, dlbridge.Plugin)
    assert (plugin.name, plugin.version, plugin.abi) == ("example-c", "1.0.0", 1)
    assert plugin.path == str(Path(c_plugin).resolve())
    assert [k.name for k in plugin.kernels] == ["c_saxpy", "c_dot", "c_sqrt"]
    assert all(isinstance(k, dlbridge.Kernel) for k in plugin.kernels)
    dot = plugin.kernels[1]
    assert dot.signature == "c_dot(a: f64[N], b: f64[N]) -> (out: f64[])" and dot.doc == "dot product (C)"
    assert str(inspect.signature(dot)) == "(a: 'f64[N]', b: 'f64[N]', /, *outs: 'f64[]', out: 'f64[] | None' = None) -> 'f64[]'"
    assert dot(np.arange(3.0), np.arange(3.0)) == 5.0
    assert repr(plugin).startswith("dlbridge.Plugin(name='example-c', version='1.0.0', abi=1, path=")
    assert repr(plugin).endswith("kernels=['c_saxpy', 'c_dot', 'c_sqrt'])")
    again = dlbridge.load_plugin(str(c_plugin))
    assert (again.name, again.path, [k.signature for k in again.kernels]) == (plugin.name, plugin.path, [k.signature for k in plugin.kernels])
    with pytest.raises(AttributeError):
        plugin.name = "other"


# ---------------------------------------------------------------------------
# Array: NumPy's names, argument order and semantics


def test_zeros_takes_numpy_style_shape_and_dtype():
    assert dlbridge.zeros((2, 3)).dtype == "f32"  # dlbridge's default (NumPy's is float64)
    assert dlbridge.zeros((2, 3), "float32").dtype == "f32"
    assert dlbridge.zeros([2], dtype="f64").dtype == "f64"
    for given, want in [
        ("float16", "f16"), ("bfloat16", "bf16"), ("int64", "i64"), ("uint8", "u8"), ("complex64", "c64"), ("bool", "bool"),
        (np.float32, "f32"), (np.dtype("int16"), "i16"), (np.dtype(np.complex128), "c128"), (np.bool_, "bool"),
        (float, "f64"), (int, "i64"), (bool, "bool"), (complex, "c128"), (None, "f32"),
        (torch.bfloat16, "bf16"), (torch.int32, "i32"), (torch.float64, "f64"),
    ]:
        assert dlbridge.zeros(2, given).dtype == want, given
        if want not in ("bool", "c64", "c128"):  # arange takes integer and float dtypes
            assert dlbridge.arange(2, dtype=given).dtype == want, given
    np.testing.assert_array_equal(np.asarray(dlbridge.zeros((2, 3), "float64")), np.zeros((2, 3)))
    for bad in ["nope", 3.5, object]:
        with pytest.raises(TypeError):
            dlbridge.zeros(2, bad)


def test_shape_ndim_size_dtype_strides_and_len_match_numpy():
    n = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    for view in [n, n[:, ::-1, 1::2], n.transpose(2, 0, 1), n[1], n[1, 2, 3, ...]]:
        a = dlbridge.from_dlpack(view)
        assert a.shape == view.shape and a.ndim == view.ndim and a.size == view.size
        assert a.strides == view.strides and a.itemsize == view.itemsize == 8
        assert a.element_strides == tuple(s // 8 for s in view.strides)
        assert a.dtype == "f64"
        if view.ndim:
            assert len(a) == len(view)
        else:
            with pytest.raises(TypeError):
                len(a)
    with pytest.raises(TypeError, match="i4"):
        dlbridge.zeros(4, "i4").strides
    assert dlbridge.zeros(4, "i4").element_strides == (1,)


def test_repr():
    assert repr(dlbridge.zeros((2, 3))) == "dlbridge.Array(shape=(2, 3), dtype='f32')"
    assert repr(dlbridge.zeros(5, "i8")) == "dlbridge.Array(shape=(5,), dtype='i8')"
    assert repr(dlbridge.zeros((2, 3), "f64").T) == "dlbridge.Array(shape=(3, 2), dtype='f64', element_strides=(1, 3))"
    assert repr(dlbridge.asarray(b"ab")) == "dlbridge.Array(shape=(2,), dtype='u8', readonly=True)"


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (2, 3, 4), (2, 1, 3, 4)])
def test_T_reverses_every_dim_like_numpy(shape):
    n = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    a = dlbridge.from_dlpack(n)
    t = a.T
    assert t.shape == n.T.shape and t.strides == n.T.strides and t.data_ptr == a.data_ptr
    np.testing.assert_array_equal(np.asarray(t), n.T)
    np.testing.assert_array_equal(np.from_dlpack(t), n.T)


def test_transpose_follows_numpy():
    n = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    a = dlbridge.from_dlpack(n)
    for args in [(), (None,), ((1, 0, 2),), ([2, 0, 1],), (1, 0, 2), (2, 1, 0), (-1, 0, -2), (np.int64(1), 0, 2)]:
        t = a.transpose(*args)
        want = n.transpose(*args)
        assert t.shape == want.shape and t.strides == want.strides and t.data_ptr == a.data_ptr, args
        np.testing.assert_array_equal(np.asarray(t), want)
    v = dlbridge.from_dlpack(np.arange(3.0))
    assert v.transpose(0).shape == (3,) and v.transpose().shape == (3,)
    for bad in [(0, 1), (0, 1, 1), (0, 1, 3), (0, 1, -4), ((0, 1, 2, 3),)]:
        with pytest.raises(ValueError):
            n.transpose(*bad)
        with pytest.raises(ValueError):
            a.transpose(*bad)


def _random_key(rng, ndim):
    def bound():
        return rng.choice([None, None, rng.randint(-7, 7), rng.choice([-100, 100])])

    items = []
    for _ in range(rng.randint(0, ndim)):
        if rng.random() < 0.35:
            items.append(rng.randint(-3, 2))
        else:
            items.append(slice(bound(), bound(), rng.choice([None, 1, 2, 3, -1, -2, -3, 7, -7])))
    if rng.random() < 0.3:
        items.insert(rng.randint(0, len(items)), Ellipsis)
    if len(items) == 1 and rng.random() < 0.5:
        return items[0]
    return tuple(items)


def _np_view(n, key):
    """``n[key]`` as a view even where NumPy gives a scalar (every dim indexed by an int):
    a trailing ``...`` makes it a 0-d view of the same element."""
    key = key if isinstance(key, tuple) else (key,)
    return n[key if any(k is Ellipsis for k in key) else (*key, Ellipsis)]


def test_getitem_matches_numpy_and_shares_memory():
    n = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    a = dlbridge.from_dlpack(n)
    rng = random.Random(1234)
    keys = [0, -1, 2, (1, 2), (1, 2, 3), (-1, -1, -1), slice(None), slice(None, None, -1), slice(1, None, 2),
            (slice(None), 1), (Ellipsis, 1), (1, Ellipsis), (Ellipsis,), Ellipsis, (), (slice(None, None, -2), Ellipsis, slice(4, 0, -3)),
            (slice(10, -10, -1),), (slice(5, 1),), (slice(-100, 100, 7),), (np.int64(1), np.int32(-2))]
    keys += [_random_key(rng, 3) for _ in range(400)]
    for key in keys:
        try:
            want = _np_view(n, key)
        except IndexError:
            with pytest.raises(IndexError):
                a[key]
            continue
        got = a[key]
        assert got.shape == want.shape, key
        assert got.strides == want.strides, key
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=repr(key))
        np.testing.assert_array_equal(np.from_dlpack(got), want, err_msg=repr(key))
        if want.size:
            assert got.data_ptr == want.__array_interface__["data"][0], key  # zero copy
    # Writes through the source show in the view: they share memory.
    view = a[1, ::-1]
    n[1, 3, 0] = 100.0
    assert view.tolist()[0][0] == 100.0


def test_getitem_errors_follow_numpy():
    a = dlbridge.from_dlpack(np.arange(12.0).reshape(3, 4))
    for key in [3, -4, (0, 4), (0, 0, 0), (Ellipsis, Ellipsis), None, True, 1.0, [0, 1], "x", (0, None)]:
        with pytest.raises(IndexError):
            a[key]
    with pytest.raises(IndexError, match="index 4 is out of bounds for axis 1 with size 4"):
        a[0, 4]
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 1 with size 4"):
        a[..., 5]
    with pytest.raises(IndexError):
        a[2**70]
    with pytest.raises(ValueError):
        a[::0]
    s = dlbridge.from_dlpack(np.array(3.0))
    assert s[()].shape == () and s[...].shape == () and s[()].tolist() == 3.0
    with pytest.raises(IndexError):
        s[0]


def test_iteration_and_indexing_of_torch_imports():
    t = torch.arange(12.0).reshape(3, 4)
    a = dlbridge.from_dlpack(t)
    rows = list(a)  # the sequence protocol: __len__ and __getitem__ up to IndexError
    assert len(rows) == 3 and [r.tolist() for r in rows] == t.tolist()
    assert torch.equal(torch.from_dlpack(a[:, 1::2].T), t[:, 1::2].T)
    assert a[1:, ::2].data_ptr == t[1:, ::2].data_ptr()


# ---------------------------------------------------------------------------
# The stubs match the module


def test_stubs_match_the_module(tmp_path):
    """mypy's stubtest: python/dlbridge/_dlbridge.pyi against the built extension (mypy is
    in python/requirements-dev.txt)."""
    env = dict(os.environ, MYPY_CACHE_DIR=str(tmp_path / "mypy-cache"))
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "dlbridge._dlbridge", "--allowlist", str(ROOT / "python/stubtest-allowlist.txt")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
