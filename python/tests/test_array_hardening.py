"""dlbridge.Array hardening: fallible allocation (MemoryError, never an abort),
constructors that refuse what the validator refuses, ndim bounded before
shape/strides are read, PEP 3118 request flags honoured, and tolist for every
dtype an Array can hold."""

import ctypes
import math
import warnings

import pytest

import dlbridge

np = pytest.importorskip("numpy")

# ---------------------------------------------------------------------------
# Hand-made DLPack capsules (ctypes), for dtypes, flags and ndim no framework
# produces. Everything they point to is kept alive for the whole session.


from dlbridge._capsules import (  # noqa: E402  (the DLPack structs, shared with the fuzz tests)
    IS_COPIED,
    IS_SUBBYTE_TYPE_PADDED,
    READ_ONLY,
    DELETER,
    DLDataType,
    DLDevice,
    DLManagedTensorVersioned,
    DLPackVersion,
)

_KEEP = []  # ctypes objects a capsule points to; never freed while the test session runs
_DELETED = []


@DELETER
def _count_deleter(_ptr):
    _DELETED.append(1)


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = ctypes.create_string_buffer(b"dltensor_versioned")


def capsule(data: bytes, dtype, shape, strides=None, flags=0, ndim=None):
    """A versioned DLPack capsule over a copy of `data`; dtype is (code, bits, lanes)."""
    buf = ctypes.create_string_buffer(bytes(data), max(len(data), 1) + 64)
    addr = ctypes.addressof(buf)
    addr += (-addr) % 64  # 64-byte aligned start inside the buffer
    ctypes.memmove(addr, bytes(data), len(data))
    shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    strides_arr = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
    m = DLManagedTensorVersioned()
    m.version = DLPackVersion(1, 1)
    m.deleter = _count_deleter
    m.flags = flags
    m.dl_tensor.data = addr
    m.dl_tensor.device = DLDevice(1, 0)
    m.dl_tensor.ndim = len(shape) if ndim is None else ndim
    m.dl_tensor.dtype = DLDataType(*dtype)
    m.dl_tensor.shape = ctypes.addressof(shape_arr)
    if strides_arr is not None:
        m.dl_tensor.strides = ctypes.addressof(strides_arr)
    _KEEP.extend([buf, shape_arr, strides_arr, m])
    return _PyCapsule_New(ctypes.addressof(m), _CAPSULE_NAME, None)


def broadcast_f32(n):
    """A NumPy float32 view of `n` elements, all at one address (stride 0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (n,), (0,))


HUGE = 1 << 46  # 2^46 float32 elements: 256 TiB


# ---------------------------------------------------------------------------
# 1. Every allocation is fallible.


def test_zeros_of_256_tib_raises_memory_error():
    with pytest.raises(MemoryError):
        dlbridge.zeros((HUGE,), "f32")
    with pytest.raises(MemoryError):
        dlbridge.zeros([1 << 20, 1 << 26], "f32")
    with pytest.raises(MemoryError):
        dlbridge.arange(HUGE, "f32")


def test_copies_of_a_broadcast_array_raise_memory_error():
    a = dlbridge.from_dlpack(broadcast_f32(HUGE))
    assert a.shape == (HUGE,) and a.strides == (0,)
    with pytest.raises(MemoryError):
        a.contiguous()
    with pytest.raises(MemoryError):
        a.__dlpack__(copy=True)
    with pytest.raises(MemoryError):
        a.tolist()


def test_kernels_on_a_broadcast_input_of_2_pow_46_elements_raise_memory_error():
    a = dlbridge.from_dlpack(broadcast_f32(HUGE))
    with pytest.raises(MemoryError):
        dlbridge.get_kernel("relu")(a)  # the 256 TiB output
    with pytest.raises(MemoryError):
        dlbridge.get_kernel("sum_all")(a)  # a 0-d output, but the kernel's gathered copy of the input
    with pytest.raises(MemoryError):
        dlbridge.get_kernel("sum_all")(broadcast_f32(HUGE))  # NumPy in, NumPy out
    # Still usable afterwards, and small broadcasts still work.
    small = dlbridge.from_dlpack(broadcast_f32(5))
    assert dlbridge.get_kernel("relu")(small).tolist() == [0.0] * 5
    assert dlbridge.get_kernel("sum_all")(small).tolist() == 0.0


# ---------------------------------------------------------------------------
# 2. Constructors refuse what the validator refuses; no panic reaches Python.


def test_zeros_refuses_more_than_64_dims_negative_dims_and_overflow():
    assert dlbridge.zeros((1,) * 64).ndim == 64
    with pytest.raises(ValueError, match="64"):
        dlbridge.zeros((1,) * 65)
    with pytest.raises(ValueError, match="64"):
        dlbridge.zeros([0] * 100_000)
    with pytest.raises(ValueError, match="negative"):
        dlbridge.zeros((2, -1))
    with pytest.raises(ValueError):
        dlbridge.zeros((1 << 62, 1 << 62))  # element count overflows
    with pytest.raises(ValueError):
        dlbridge.zeros((1 << 62,), "f64")  # byte size overflows
    with pytest.raises(ValueError, match="64 bits"):
        dlbridge.zeros((2**70,))
    with pytest.raises(ValueError):
        dlbridge.arange(-1)
    with pytest.raises(ValueError, match="64 bits"):
        dlbridge.arange(2**64)
    with pytest.raises(TypeError):
        dlbridge.zeros("abc")
    assert dlbridge.zeros(3, "i8").shape == (3,)
    assert dlbridge.zeros((0, 1 << 62)).size == 0


def test_no_panic_exception_reaches_python():
    bad_calls = [
        lambda: dlbridge.zeros((1,) * 65),
        lambda: dlbridge.zeros((-5,)),
        lambda: dlbridge.zeros((HUGE,)),
        lambda: dlbridge.zeros((2,), "f32x4").tolist(),
        lambda: memoryview(dlbridge.zeros((2,), "bf16")),
        lambda: dlbridge.from_dlpack(capsule(b"", (2, 32, 1), (1 << 62,), (0,))).tolist(),
    ]
    for call in bad_calls:
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - checking the class is the point
            assert type(e).__name__ != "PanicException", repr(e)
            assert isinstance(e, Exception), repr(e)


# ---------------------------------------------------------------------------
# 3. ndim is bounded before shape/strides are read.


def test_a_65_dim_dlpack_capsule_is_refused_naming_ndim():
    with pytest.raises(ValueError, match="ndim"):
        dlbridge.from_dlpack(capsule(b"\0" * 4, (2, 32, 1), (1,) * 65))
    # A lying ndim over a one-entry shape array: refused before the shape is read.
    with pytest.raises(ValueError, match="ndim"):
        dlbridge.from_dlpack(capsule(b"\0" * 4, (2, 32, 1), (1,), ndim=1 << 30))


def test_a_65_dim_buffer_protocol_object_is_refused_naming_ndim():
    t = ctypes.c_float
    for _ in range(65):
        t = t * 1
    obj = t()
    with pytest.raises(ValueError):
        memoryview(obj)  # CPython's own limit; dlbridge reads the Py_buffer directly
    with pytest.raises(ValueError, match="ndim"):
        dlbridge.asarray(obj)
    t64 = ctypes.c_float
    for _ in range(64):
        t64 = t64 * 1
    assert dlbridge.asarray(t64()).ndim == 64


# ---------------------------------------------------------------------------
# 4. The buffer protocol honours PEP 3118 request flags.

PyBUF_SIMPLE = 0
PyBUF_WRITABLE = 0x0001
PyBUF_FORMAT = 0x0004
PyBUF_ND = 0x0008
PyBUF_STRIDES = 0x0010 | PyBUF_ND
PyBUF_C_CONTIGUOUS = 0x0020 | PyBUF_STRIDES
PyBUF_F_CONTIGUOUS = 0x0040 | PyBUF_STRIDES
PyBUF_ANY_CONTIGUOUS = 0x0080 | PyBUF_STRIDES
PyBUF_RECORDS = PyBUF_STRIDES | PyBUF_WRITABLE | PyBUF_FORMAT


class Py_buffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int]
_GetBuffer.restype = ctypes.c_int
_ReleaseBuffer = ctypes.pythonapi.PyBuffer_Release
_ReleaseBuffer.argtypes = [ctypes.POINTER(Py_buffer)]
_ReleaseBuffer.restype = None


def get_buffer(obj, flags):
    """PyObject_GetBuffer(obj, flags): the filled fields as a dict (buffer released), or the exception."""
    view = Py_buffer()
    _GetBuffer(obj, ctypes.byref(view), flags)  # ctypes.pythonapi raises the Python error on -1
    try:
        ndim = view.ndim
        return {
            "len": view.len,
            "itemsize": view.itemsize,
            "readonly": bool(view.readonly),
            "ndim": ndim,
            "format": view.format,
            "shape": None if not view.shape else tuple(view.shape[i] for i in range(ndim)),
            "strides": None if not view.strides else tuple(view.strides[i] for i in range(ndim)),
        }
    finally:
        _ReleaseBuffer(ctypes.byref(view))


def transposed():
    n = np.arange(6, dtype=np.float32).reshape(2, 3)
    return dlbridge.from_dlpack(n).T, n.T


def test_a_transposed_array_exports_strided_buffers():
    a, n = transposed()
    mv = memoryview(a)
    assert mv.shape == (3, 2) and mv.strides == (4, 12) and mv.format == "f"
    assert not mv.c_contiguous and mv.f_contiguous
    assert mv.tolist() == n.tolist()
    assert np.asarray(a).tolist() == n.tolist()
    assert np.shares_memory(np.asarray(a), n)


def test_contiguity_requests_are_refused_when_the_layout_is_not_so():
    a, _ = transposed()  # Fortran-contiguous, not C-contiguous
    with pytest.raises(BufferError, match="C-contiguous"):
        get_buffer(a, PyBUF_C_CONTIGUOUS)
    f = get_buffer(a, PyBUF_F_CONTIGUOUS | PyBUF_FORMAT)
    assert f["strides"] == (4, 12) and f["shape"] == (3, 2) and f["len"] == 24 and f["format"] == b"f"
    assert get_buffer(a, PyBUF_ANY_CONTIGUOUS)["strides"] == (4, 12)
    assert get_buffer(a, PyBUF_STRIDES)["strides"] == (4, 12)
    for flags in (PyBUF_SIMPLE, PyBUF_ND, PyBUF_WRITABLE, PyBUF_FORMAT):
        with pytest.raises(BufferError, match="strides"):
            get_buffer(a, flags)

    gapped = dlbridge.from_dlpack(np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2])  # neither C nor F
    for flags, what in ((PyBUF_C_CONTIGUOUS, "C-contiguous"), (PyBUF_F_CONTIGUOUS, "Fortran"), (PyBUF_ANY_CONTIGUOUS, "neither")):
        with pytest.raises(BufferError, match=what):
            get_buffer(gapped, flags)
    assert get_buffer(gapped, PyBUF_RECORDS)["strides"] == (32, 16)

    c = dlbridge.arange(6, "i16")  # C-contiguous: every request is served
    for flags in (PyBUF_SIMPLE, PyBUF_ND, PyBUF_C_CONTIGUOUS, PyBUF_F_CONTIGUOUS, PyBUF_ANY_CONTIGUOUS):
        got = get_buffer(c, flags)
        assert got["len"] == 12
    assert get_buffer(c, PyBUF_SIMPLE)["shape"] is None
    assert get_buffer(c, PyBUF_ND)["shape"] == (6,) and get_buffer(c, PyBUF_ND)["strides"] is None


def test_writable_requests_on_a_read_only_array_are_refused():
    ro = dlbridge.asarray(b"abcd")
    assert ro.readonly
    with pytest.raises(BufferError, match="read-only"):
        get_buffer(ro, PyBUF_WRITABLE)
    with pytest.raises(BufferError, match="read-only"):
        get_buffer(ro, PyBUF_RECORDS)
    assert get_buffer(ro, PyBUF_SIMPLE)["readonly"]
    assert memoryview(ro).readonly
    rw = dlbridge.zeros((4,), "u8")
    assert not get_buffer(rw, PyBUF_WRITABLE)["readonly"]


def test_broadcast_buffers_never_license_reads_past_their_memory():
    # PEP 3118 / the CPython docs: len = product(shape) * itemsize, and buf[0..len) may be
    # read only under a request that guarantees contiguity -- which a broadcast refuses.
    b = dlbridge.from_dlpack(broadcast_f32(4))
    for flags in (PyBUF_SIMPLE, PyBUF_ND, PyBUF_C_CONTIGUOUS, PyBUF_F_CONTIGUOUS, PyBUF_ANY_CONTIGUOUS):
        with pytest.raises(BufferError):
            get_buffer(b, flags)
    got = get_buffer(b, PyBUF_STRIDES)
    assert got["strides"] == (0,) and got["len"] == 16
    mv = memoryview(b)
    assert mv.tolist() == [0.0] * 4 and mv.tobytes() == b"\0" * 16
    # A broadcast whose logical size overflows Py_ssize_t cannot be described at all.
    huge = dlbridge.from_dlpack(capsule(b"\0" * 8, (2, 64, 1), (1 << 62,), (0,)))
    assert huge.size == 1 << 62
    with pytest.raises(BufferError, match="too large"):
        memoryview(huge)
    with pytest.raises(BufferError):
        get_buffer(huge, PyBUF_STRIDES)


# ---------------------------------------------------------------------------
# 5. tolist for every dtype an Array can hold.


@pytest.mark.parametrize(
    "np_dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
)
def test_tolist_of_every_integer_width(np_dtype):
    info = np.iinfo(np_dtype)
    n = np.array([info.min, 0, 1, info.max], dtype=np_dtype)
    got = dlbridge.from_dlpack(n).tolist()
    assert got == n.tolist()
    assert all(type(v) is int for v in got)


def test_tolist_of_bool():
    got = dlbridge.from_dlpack(np.array([True, False, True])).tolist()
    assert got == [True, False, True] and all(type(v) is bool for v in got)


@pytest.mark.parametrize("np_dtype", [np.float16, np.float32, np.float64])
def test_tolist_of_ieee_floats(np_dtype):
    n = np.array([[1.5, -0.0, np.inf], [np.nan, 65504.0, 2.0**-14]], dtype=np_dtype)
    got = dlbridge.from_dlpack(n).tolist()
    want = n.tolist()
    assert all(type(v) is float for row in got for v in row)
    assert [[repr(v) for v in row] for row in got] == [[repr(v) for v in row] for row in want]


def test_tolist_of_bfloat16():
    # 1.0, -2.5, +inf, NaN as bfloat16 bit patterns.
    raw = np.array([0x3F80, 0xC020, 0x7F80, 0x7FC0], dtype=np.uint16).tobytes()
    got = dlbridge.from_dlpack(capsule(raw, (4, 16, 1), (4,))).tolist()
    assert got[:3] == [1.0, -2.5, math.inf] and math.isnan(got[3])
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.0, -3.25, 1e30], dtype=torch.bfloat16)
    assert dlbridge.from_dlpack(t).tolist() == t.tolist()


@pytest.mark.parametrize("np_dtype", [np.complex64, np.complex128])
def test_tolist_of_complex(np_dtype):
    n = np.array([[1 + 2j, -3.5j], [0, 4 - 1j]], dtype=np_dtype)
    got = dlbridge.from_dlpack(n).tolist()
    assert got == n.tolist() and all(type(v) is complex for row in got for v in row)
    # Strided (transposed) too.
    assert dlbridge.from_dlpack(n).T.tolist() == n.T.tolist()


def test_tolist_follows_negative_and_zero_strides():
    rev = np.arange(5, dtype=np.int32)[::-1]
    assert dlbridge.from_dlpack(rev).tolist() == [4, 3, 2, 1, 0]
    assert dlbridge.from_dlpack(broadcast_f32(3)).tolist() == [0.0, 0.0, 0.0]
    assert dlbridge.zeros((), "f64").tolist() == 0.0
    assert dlbridge.zeros((2, 0), "i8").tolist() == [[], []]


ML_FLOATS = {
    # dlbridge dtype: (DLPack code, bits, ml_dtypes name)
    "f8_e3m4": (7, 8, "float8_e3m4"),
    "f8_e4m3": (8, 8, "float8_e4m3"),
    "f8_e4m3b11fnuz": (9, 8, "float8_e4m3b11fnuz"),
    "f8_e4m3fn": (10, 8, "float8_e4m3fn"),
    "f8_e4m3fnuz": (11, 8, "float8_e4m3fnuz"),
    "f8_e5m2": (12, 8, "float8_e5m2"),
    "f8_e5m2fnuz": (13, 8, "float8_e5m2fnuz"),
    "f8_e8m0fnu": (14, 8, "float8_e8m0fnu"),
    "f6_e2m3fn": (15, 6, "float6_e2m3fn"),
    "f6_e3m2fn": (16, 6, "float6_e3m2fn"),
    "f4_e2m1fn": (17, 4, "float4_e2m1fn"),
}


@pytest.mark.parametrize("name", sorted(ML_FLOATS))
def test_tolist_of_small_floats_matches_ml_dtypes_for_every_bit_pattern(name):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    code, bits, ml_name = ML_FLOATS[name]
    ml = getattr(ml_dtypes, ml_name, None)
    if ml is None:
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {ml_name}")
    patterns = np.arange(1 << bits, dtype=np.uint8)
    # One pattern per byte: the padded layout for sub-byte types, plain bytes for float8.
    flags = IS_SUBBYTE_TYPE_PADDED if bits < 8 else 0
    a = dlbridge.from_dlpack(capsule(patterns.tobytes(), (code, bits, 1), (len(patterns),), flags=flags))
    assert a.dtype == name
    got = a.tolist()
    want = patterns.view(ml).astype(np.float64).tolist()
    assert all(type(v) is float for v in got)
    assert [repr(v) for v in got] == [repr(v) for v in want]


def test_tolist_of_packed_sub_byte_types():
    # float4_e2m1fn codes 1, 2, 3, 7 (0.5, 1, 1.5, 6), low nibble first.
    a = dlbridge.from_dlpack(capsule(bytes([0x21, 0x73]), (17, 4, 1), (2, 2)))
    assert a.tolist() == [[0.5, 1.0], [1.5, 6.0]]
    assert a.T.tolist() == [[0.5, 1.5], [1.0, 6.0]]
    i4 = dlbridge.from_dlpack(capsule(bytes([0xF7, 0x08]), (0, 4, 1), (3,)))
    assert i4.tolist() == [7, -1, -8]
    u1 = dlbridge.from_dlpack(capsule(bytes([0b101]), (1, 1, 1), (3,)))
    assert u1.tolist() == [1, 0, 1]


def test_tolist_of_torch_float8_when_torch_exports_it():
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.0, -448.0, 0.5], dtype=torch.float8_e4m3fn)
    try:
        a = dlbridge.from_dlpack(t)
    except (BufferError, TypeError, RuntimeError) as e:
        pytest.skip(f"torch {torch.__version__} does not export float8 through DLPack: {e}")
    assert a.dtype == "f8_e4m3fn"
    assert a.tolist() == t.float().tolist()


@pytest.mark.parametrize("dtype", ["f32x4", "i8x2", "handle64"])
def test_tolist_of_dtypes_without_a_python_scalar_is_a_type_error_naming_them(dtype):
    a = dlbridge.zeros((2,), dtype)
    with pytest.raises(TypeError, match=dtype):
        a.tolist()
