"""dlbridge against outside libraries: JAX, pyarrow, array-api-strict, NumPy and torch.

For each library: every kernel on its arrays (contiguous, strided where the library can make
strided arrays, 0-d, empty; every dtype the library has), checked against NumPy, with dtypes
a kernel does not take refused as TypeError; zero-copy round trips both ways checked by data
pointer; the library's producer and consumer through ``dlbridge.testing``; and the read-only
promises: an immutable array (JAX, Arrow), a read-only NumPy array or a torch conj/neg view is
never written, whichever way it comes in as an output.
"""

import gc
import importlib.util
import math
import re

import numpy as np
import pytest
import torch

import dlbridge
import dlbridge.testing as dt

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)  # f64/i64/u64 arrays (JAX is used by this module only)
jnp = pytest.importorskip("jax.numpy")
pa = pytest.importorskip("pyarrow")
xp = pytest.importorskip("array_api_strict")

KERNELS = {k.name: k for k in dlbridge.list_kernels()}
NP = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i8": np.int8, "i16": np.int16, "i32": np.int32,
      "i64": np.int64, "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "bool": np.bool_,
      "c64": np.complex64, "c128": np.complex128}
TORCH = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64, "i8": torch.int8,
         "i16": torch.int16, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8, "bool": torch.bool,
         "c64": torch.complex64, "c128": torch.complex128}


def accepted(kernel: str) -> set[str]:
    """The dtypes a kernel's signature takes: ``add<T: f32|f64|...>`` -> {"f32", "f64", ...}."""
    m = re.search(r"<T: ([^>]*)>", KERNELS[kernel].signature)
    return set(m.group(1).split("|"))


# ---- the libraries -----------------------------------------------------------------------


def values(shape, dtype: str, seed: int = 0) -> np.ndarray:
    """Small exact values (halves in [-2.5, 2.5]; non-negative for unsigned): identical in
    every dtype, so references computed in float64 are exact up to the result's rounding."""
    n = math.prod(shape)
    i = np.arange(n) + seed
    if dtype == "bool":
        v = (i % 3 == 0)
    elif dtype.startswith("u"):
        v = (i * 7) % 11
    elif dtype.startswith("i"):
        v = (i * 7) % 11 - 5
    elif dtype.startswith("c"):
        v = ((i * 7) % 11 - 5) / 2 + 1j * ((i * 5) % 7 - 3) / 2
    else:
        v = ((i * 7) % 11 - 5) / 2
    return np.asarray(v).reshape(shape)


class Lib:
    name = ""
    dtypes: tuple = ()
    immutable = False
    out_type: type | None = None  # kernel outputs for this library's inputs; None: dlbridge.Array

    def make(self, v: np.ndarray, dtype: str):
        raise NotImplementedError

    def readonly(self, x) -> bool:
        """Whether dlbridge must treat ``x`` as read-only."""
        return self.immutable

    def ptr(self, x) -> int:
        raise NotImplementedError

    def layouts(self, dtype: str, seed: int) -> dict:
        """name -> (array, the same values as float64/complex128/bool NumPy)."""
        out = {}
        for name, shape in (("2-d", (3, 4)), ("1-d", (5,)), ("0-d", ()), ("empty", (2, 0))):
            v = values(shape, dtype, seed)
            out[name] = (self.make(v, dtype), v)
        return out

    def strided_layouts(self, dtype: str, seed: int, transpose=lambda a: a.T) -> dict:
        """``layouts`` plus a column-step view and a transpose, for libraries that make views."""
        out = Lib.layouts(self, dtype, seed)
        wide = values((3, 8), dtype, seed)
        out["strided"] = (self.make(wide, dtype)[:, ::2], wide[:, ::2])
        tall = values((4, 3), dtype, seed)
        out["transposed"] = (transpose(self.make(tall, dtype)), tall.T)
        return out


class NumpyLib(Lib):
    name, out_type = "numpy", np.ndarray
    dtypes = tuple(NP)

    def make(self, v, dtype):
        return v.astype(NP[dtype], order="C")

    def ptr(self, x):
        return x.__array_interface__["data"][0]

    def layouts(self, dtype, seed):
        out = self.strided_layouts(dtype, seed)
        rev = values((5,), dtype, seed)
        out["negative stride"] = (self.make(rev, dtype)[::-1], rev[::-1])
        return out


class TorchLib(Lib):
    name, out_type = "torch", torch.Tensor
    dtypes = tuple(TORCH)

    def make(self, v, dtype):
        return torch.tensor(v, dtype=TORCH[dtype])

    def ptr(self, x):
        return x.data_ptr()

    def layouts(self, dtype, seed):
        return self.strided_layouts(dtype, seed, transpose=lambda a: a.t())


class JaxLib(Lib):
    name, immutable, out_type = "jax", True, jax.Array
    dtypes = ("f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool", "c64", "c128")

    def make(self, v, dtype):
        return jnp.asarray(v, dtype=jnp.bfloat16 if dtype == "bf16" else NP[dtype])

    def ptr(self, x):
        return x.unsafe_buffer_pointer()
    # JAX exports contiguous buffers only: a slice is a new array


class PyarrowLib(Lib):
    """pyarrow.Array (1-d, immutable; slices are offsets into a buffer) and pyarrow.Tensor (n-d)."""

    name, immutable = "pyarrow", True
    dtypes = ("f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")  # bool is bit-packed

    def make(self, v, dtype):
        a = v.astype(NP[dtype], order="C")
        return pa.array(a) if a.ndim == 1 else pa.Tensor.from_numpy(a)

    def readonly(self, x):
        return not x.is_mutable if isinstance(x, pa.Tensor) else True  # Arrow arrays are immutable

    def ptr(self, x):
        if isinstance(x, pa.Tensor):
            return x.to_numpy().__array_interface__["data"][0]
        return x.buffers()[1].address + x.offset * x.type.bit_width // 8

    def layouts(self, dtype, seed):
        out = super().layouts(dtype, seed)
        long = values((7,), dtype, seed)
        out["offset slice"] = (self.make(long, dtype).slice(2, 4), long[2:6])
        return out


class ArrayApiStrictLib(Lib):
    name = "array-api-strict"
    dtypes = ("f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool", "c64", "c128")

    def make(self, v, dtype):
        return xp.asarray(v.astype(NP[dtype], order="C"))

    def ptr(self, x):
        return x._array.__array_interface__["data"][0]

    def layouts(self, dtype, seed):
        return self.strided_layouts(dtype, seed)


LIBS = {lib.name: lib for lib in (NumpyLib(), TorchLib(), JaxLib(), PyarrowLib(), ArrayApiStrictLib())}
CASES = [(name, d) for name, lib in LIBS.items() for d in lib.dtypes]


def to_numpy(out) -> np.ndarray:
    if isinstance(out, torch.Tensor):
        out = out.resolve_conj().resolve_neg()
        return (out.float() if out.dtype == torch.bfloat16 else out).numpy()
    if isinstance(out, np.ndarray):
        return out
    if isinstance(out, jax.Array):  # JAX's own output: the buffer the kernel filled (bf16 read as f32)
        return np.asarray(out.astype(jnp.float32) if out.dtype == jnp.bfloat16 else out)
    assert isinstance(out, dlbridge.Array), type(out)
    if out.dtype == "bf16":
        return torch.from_dlpack(out).float().numpy()
    return np.from_dlpack(out)


def erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def softmax(x):
    if x.shape[-1] == 0:
        return x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def mean(x):
    with np.errstate(invalid="ignore", divide="ignore"):
        return x.mean(axis=-1) if x.shape[-1] else np.full(x.shape[:-1], np.nan)


UNARY = {
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: x * 0.5 * (1 + erf(x / math.sqrt(2))),
    "copy": lambda x: x,
    "sum": lambda x: x.sum(axis=-1),
    "mean": mean,
    "sum_all": lambda x: np.asarray(x.sum()),
    "mean_all": lambda x: np.asarray(x.mean() if x.size else np.nan),
    "softmax": softmax,
}
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum}
NEEDS_A_DIM = {"sum", "mean", "softmax"}


def tolerance(dtype: str, kernel: str) -> dict:
    if dtype in ("f16", "bf16"):
        return dict(rtol=2e-2, atol=2e-2)
    if dtype == "f32":
        return dict(rtol=1e-5, atol=1e-6)
    if dtype in ("f64", "c128"):
        return dict(rtol=1e-12, atol=1e-12)
    return dict(rtol=0, atol=0)


def check(kernel: str, dtype: str, out, expected, lib: Lib):
    assert isinstance(out, lib.out_type or dlbridge.Array), f"{kernel}: returned {type(out).__name__}"
    got = to_numpy(out)
    expected = np.asarray(expected)
    assert got.shape == expected.shape, f"{kernel}: shape {got.shape}, expected {expected.shape}"
    if dtype != "bf16":
        assert got.dtype == np.dtype(NP[dtype]), f"{kernel}: dtype {got.dtype}, expected {dtype}"
    if dtype in ("f16", "bf16", "f32", "f64", "c64", "c128"):
        want = expected.astype(np.float32 if dtype == "bf16" else NP[dtype])
        np.testing.assert_allclose(got, want, equal_nan=True, err_msg=kernel, **tolerance(dtype, kernel))
    else:
        np.testing.assert_array_equal(got, expected.astype(NP[dtype]), err_msg=kernel)


@pytest.mark.parametrize("lib,dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_every_kernel_on_every_layout_matches_numpy(lib, dtype):
    lib = LIBS[lib]
    layouts_a = lib.layouts(dtype, 0)
    layouts_b = lib.layouts(dtype, 3)
    ran = 0
    for layout, (x, vx) in layouts_a.items():
        y, vy = layouts_b[layout]
        for kernel, ref in UNARY.items():
            if kernel in NEEDS_A_DIM and vx.ndim == 0:
                with pytest.raises((ValueError, TypeError), match="dims" if dtype in accepted(kernel) else "dtype mismatch"):
                    KERNELS[kernel](x)
                continue
            if dtype not in accepted(kernel):
                with pytest.raises(TypeError, match=f"{kernel}: argument x: dtype mismatch"):
                    KERNELS[kernel](x)
                continue
            check(f"{kernel}({layout})", dtype, KERNELS[kernel](x), ref(vx), lib)
            ran += 1
        for kernel, ref in BINARY.items():
            if dtype not in accepted(kernel):
                with pytest.raises(TypeError, match="dtype mismatch"):
                    KERNELS[kernel](x, y)
                continue
            check(f"{kernel}({layout})", dtype, KERNELS[kernel](x, y), ref(vx, vy), lib)
            ran += 1
        if vx.ndim == 2 and vx.shape[1] and dtype in accepted("matmul"):
            w, vw = lib.make(values((vx.shape[1], 2), dtype, 1), dtype), values((vx.shape[1], 2), dtype, 1)
            check(f"matmul({layout})", dtype, KERNELS["matmul"](x, w), vx @ vw, lib)
            ran += 1
    assert ran or not any(dtype in accepted(k) for k in (*UNARY, *BINARY))


@pytest.mark.parametrize("lib,dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_from_dlpack_is_zero_copy_on_every_layout(lib, dtype):
    lib = LIBS[lib]
    for layout, (x, vx) in lib.layouts(dtype, 0).items():
        a = dlbridge.from_dlpack(x)
        assert a.shape == vx.shape and a.dtype == dtype, layout
        if vx.size:
            assert a.data_ptr == lib.ptr(x), f"{layout}: from_dlpack copied"
        assert a.readonly == lib.readonly(x), f"{layout}: readonly={a.readonly}"
        c = dlbridge.get_kernel("copy")(a)
        np.testing.assert_array_equal(to_numpy(c), vx.astype(np.float32 if dtype == "bf16" else NP[dtype]), err_msg=layout)


CONSUMERS = {
    "numpy": (np.from_dlpack, lambda y: y.__array_interface__["data"][0]),
    "torch": (torch.from_dlpack, lambda y: y.data_ptr()),
    "jax.dlpack": (jax.dlpack.from_dlpack, lambda y: y.unsafe_buffer_pointer()),
    "jax.numpy": (jnp.from_dlpack, lambda y: y.unsafe_buffer_pointer()),
    "array-api-strict": (xp.from_dlpack, lambda y: y._array.__array_interface__["data"][0]),
    "pyarrow.Array": (pa.Array.from_dlpack, lambda y: y.buffers()[1].address),
    "pyarrow.Tensor": (pa.Tensor.from_dlpack, lambda y: y.to_numpy().__array_interface__["data"][0]),
}


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64", "u8"])
def test_every_consumer_takes_a_dlbridge_array_with_zero_copies(consumer, dtype):
    fd, ptr = CONSUMERS[consumer]
    a = dlbridge.arange(6, dtype)
    y = fd(a)
    assert ptr(y) == a.data_ptr, f"{consumer} copied"
    np.testing.assert_array_equal(np.asarray(y.to_numpy() if hasattr(y, "to_numpy") else y._array if consumer == "array-api-strict" else y), np.arange(6))
    del a
    gc.collect()
    np.testing.assert_array_equal(np.asarray(y.to_numpy() if hasattr(y, "to_numpy") else y._array if consumer == "array-api-strict" else y), np.arange(6))


@pytest.mark.parametrize("lib", sorted(LIBS))
def test_round_trip_through_dlbridge_comes_back_to_the_same_memory(lib):
    lib = LIBS[lib]
    x = lib.make(values((6,), "f32"), "f32")
    a = dlbridge.from_dlpack(x)
    back = {"numpy": np.from_dlpack, "torch": torch.from_dlpack, "jax": jax.dlpack.from_dlpack,
            "pyarrow": pa.Array.from_dlpack, "array-api-strict": xp.from_dlpack}[lib.name]
    ptr = {"numpy": lambda y: y.ctypes.data, "torch": lambda y: y.data_ptr(), "jax": lambda y: y.unsafe_buffer_pointer(),
           "pyarrow": lambda y: y.buffers()[1].address, "array-api-strict": lambda y: y._array.ctypes.data}[lib.name]
    if lib.name == "jax":
        # The Array is read-only (JAX arrays are immutable) and JAX asks for legacy capsules only,
        # which cannot say READ_ONLY: exporting one would hand out writable memory (BufferError).
        with pytest.raises(BufferError):
            back(a)
        y = back(dlbridge.from_dlpack(x, copy=True))  # a writable copy goes
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
        return
    y = back(a)
    assert ptr(y) == lib.ptr(x), f"{lib.name} -> dlbridge -> {lib.name} copied"


def test_jax_answers_max_version_with_a_legacy_capsule():
    info = dlbridge._dlbridge.inspect_capsule(jnp.arange(3.0).__dlpack__(max_version=(1, 3)))
    assert info["name"] == "dltensor" and info["version"] is None and info["flags"] == 0


# ---- the libraries through dlbridge.testing -------------------------------------------

TESTING_LIBS = {lib.name: lib for lib in dt.LIBRARIES}


@pytest.mark.parametrize("name", sorted(TESTING_LIBS))
def test_every_library_as_producer_passes_or_declares_its_deviations(name):
    lib = TESTING_LIBS[name]
    if importlib.util.find_spec(lib.module) is None:
        pytest.skip(f"{lib.module} not installed")
    results = dt.check_producer(**lib.producer())  # raises on an undeclared failure or a stale declaration
    known = {r.name: r.detail for r in results if r.status == "known failure"}
    assert set(known) == set(lib.producer().get("known_failures", {})), known


@pytest.mark.parametrize("name", sorted(TESTING_LIBS))
def test_every_library_as_consumer_passes_or_declares_its_deviations(name):
    lib = TESTING_LIBS[name]
    if importlib.util.find_spec(lib.module) is None:
        pytest.skip(f"{lib.module} not installed")
    results = dt.check_consumer(lib.consumer, known_failures=lib.consumer_known)
    assert {r.name for r in results if r.status == "known failure"} == set(lib.consumer_known)


# ---- read-only promises ----------------------------------------------------------------

add, axpy, copy, relu = (KERNELS[k] for k in ("add", "axpy", "copy", "relu"))


def _writes(target):
    """Every way a kernel call can write ``target`` (a 4-element f32 array of any library)."""
    x = np.ones(4, np.float32)
    return {
        "out=": lambda: add(x, x, out=target),
        "destination-passing": lambda: add(x, x, target),
        "axpy mut": lambda: axpy(2.0, x, target),
    }


@pytest.mark.parametrize("how", ["out=", "destination-passing", "axpy mut"])
@pytest.mark.parametrize("n", [4, 1 << 16])
def test_a_jax_array_is_never_written(how, n):
    j = jnp.zeros(n, jnp.float32)
    x = np.ones(n, np.float32)
    call = {"out=": lambda: add(x, x, out=j), "destination-passing": lambda: add(x, x, j), "axpy mut": lambda: axpy(2.0, x, j)}[how]
    with pytest.raises(BufferError, match="read-only"):
        call()
    assert not np.asarray(j).any(), "an immutable JAX array was written"


@pytest.mark.parametrize("how", ["out=", "destination-passing", "axpy mut"])
def test_an_arrow_array_is_never_written(how):
    p = pa.array(np.zeros(4, np.float32))
    with pytest.raises(BufferError, match="read-only"):
        _writes(p)[how]()
    assert p.to_pylist() == [0.0] * 4


@pytest.mark.parametrize("how", ["out=", "destination-passing", "axpy mut"])
def test_a_read_only_numpy_array_is_never_written(how):
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        _writes(ro)[how]()
    assert not ro.any()


@pytest.mark.parametrize("n", [1, 1 << 16])
def test_a_bare_legacy_capsule_from_the_caller_stays_writable(n):
    t = torch.zeros(n)
    add(torch.ones(n), torch.ones(n), out=torch.utils.dlpack.to_dlpack(t))
    assert (t == 2).all()
    u = torch.zeros(n)
    axpy(3.0, torch.ones(n), torch.utils.dlpack.to_dlpack(u))
    assert (u == 3).all()


def _conj(n):
    return torch.complex(torch.arange(n, dtype=torch.float32), torch.ones(n)).conj()


VIEWS = {
    "x.conj()": lambda n: _conj(n),
    "x.conj().imag": lambda n: _conj(n).imag,
    "torch._neg_view(x)": lambda n: torch._neg_view(torch.arange(n, dtype=torch.float32)),
}


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("n", [1, 1 << 16])
def test_conj_and_neg_views_are_refused_as_inputs(view, n):
    v = VIEWS[view](n)
    assert v.is_conj() or v.is_neg()
    kernel = copy if v.is_complex() else relu
    with pytest.raises((TypeError, BufferError, ValueError), match="conj|neg"):
        kernel(v)
    if not v.is_complex():
        with pytest.raises((TypeError, BufferError, ValueError), match="conj|neg"):
            add(v, torch.ones(n))
        with pytest.raises((TypeError, BufferError, ValueError), match="conj|neg"):
            add(torch.ones(n), v)


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("n", [1, 1 << 16])
def test_conj_and_neg_views_are_refused_as_outputs(view, n):
    v = VIEWS[view](n)
    before = v.resolve_conj().resolve_neg().clone()
    if v.is_complex():
        src = torch.complex(torch.ones(n), torch.ones(n))
        calls = [lambda: copy(src, out=v), lambda: copy(src, v)]
    else:
        one = torch.ones(n)
        calls = [lambda: add(one, one, out=v), lambda: add(one, one, v), lambda: axpy(1.0, one, v)]
    for call in calls:
        with pytest.raises((TypeError, BufferError, ValueError), match="conj|neg"):
            call()
    assert torch.equal(v.resolve_conj().resolve_neg(), before), "a conj/neg view was written"


def test_conj_and_neg_messages_are_clean():
    for view in VIEWS.values():
        v = view(4)
        with pytest.raises(Exception) as e:
            (copy if v.is_complex() else relu)(v)
        assert "  " not in str(e.value), f"stray whitespace in the message: {str(e.value)!r}"
