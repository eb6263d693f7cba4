"""Hostile DLPack input: random hand-built capsules and producers (ctypes, see
``dlbridge._capsules``) fed to ``dlbridge.from_dlpack`` and to kernels (``copy``, and ``add``
writing into them with ``out=``).

Every case ends in a result or an ``Exception`` subclass (never ``PanicException``, a
``BaseException``, never a crash), every deleter runs exactly once, a tensor that breaks a
rule dlbridge promises to check (docs/rust.md, "What the validator checks") is refused, and an
accepted tensor reads (and, as ``out=``, writes) exactly the elements its layout names.

Memory safety of the test itself: a tensor whose layout dlbridge could accept always points
into a real buffer covering every byte the layout touches, so an accepted layout is read
safely; only tensors that break a promised check (ndim out of range, negative dims, NULL
shape, extents of 2**64 bytes and more, wrapping byte offsets, ...) may carry a pointer to a
small dummy buffer, which dlbridge must refuse before reading.

Determinism: hypothesis's default random exploration with ``database=None`` (no example
database written into the checkout); a failure prints the seed to reproduce it with
``--hypothesis-seed``. ``derandomize`` would make CI see the same 2000 cases forever.
"""

import ctypes
import gc
import math

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dlbridge  # noqa: E402
from dlbridge import _capsules as caps  # noqa: E402

copy, add = dlbridge.get_kernel("copy"), dlbridge.get_kernel("add")

# What DLPack 1.3 defines (and dlbridge accepts): bits per type code.
ALLOWED_BITS = {0: (1, 2, 4, 8, 16, 32, 64), 1: (1, 2, 4, 8, 16, 32, 64), 2: (16, 32, 64), 3: (8, 16, 32, 64), 4: (16,),
                5: (32, 64, 128), 6: (8,), **{c: (8,) for c in range(7, 15)}, 15: (6,), 16: (6,), 17: (4,)}
NUMPY = {(0, 8): "i1", (0, 16): "i2", (0, 32): "i4", (0, 64): "i8", (1, 8): "u1", (1, 16): "u2", (1, 32): "u4",
         (1, 64): "u8", (2, 16): "f2", (2, 32): "f4", (2, 64): "f8", (5, 64): "c8", (5, 128): "c16", (6, 8): "?"}
KNOWN_DEVICES = (1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18)
HOST = (1, 3, 13)  # CPU, CUDA pinned, CUDA managed: memory the CPU may read
CAP = 4 << 20  # the largest buffer a case allocates
I64_MAX = 2**63 - 1

_dummy_owner, DUMMY = caps.aligned_buffer(256)  # where refused tensors point: never read

# A corruption breaks one rule; `True` marks the rules dlbridge promises to check (the
# verdict itself comes from `refusals`, on the final fields, as corruptions can undo each other).
CORRUPTIONS = {
    "ndim_negative": True,
    "ndim_too_big": True,
    "negative_dim": True,
    "null_shape": True,
    "overflow_dims": True,
    "overflow_stride": True,
    "bad_major_version": True,
    "unknown_dtype_code": True,
    "bad_bits": True,
    "zero_lanes": True,
    "unknown_device": True,
    "negative_device_id": True,
    "null_data": True,  # guaranteed only with elements
    "misaligned": True,  # guaranteed only with elements and a scalar of 2+ bytes
    "wrapping_byte_offset": True,  # guaranteed only with elements
    "used_name": True,
    "garbage_name": True,
    "producer_raises": True,
    "producer_returns_junk": True,
    "huge_minor_version": False,
    "huge_device_id": False,
    "garbage_flags": False,
    "device_answer_lies": False,
}


@st.composite
def cases(draw):
    c = {}
    # a well-formed layout first (small: at most a few thousand elements, or one long 1-d run)
    if draw(st.integers(0, 15)) == 0:
        shape = [draw(st.integers(1 << 15, 1 << 16))]  # large enough for the GIL-releasing path
        strides = draw(st.sampled_from([None, [1], [-1], [2]]))
        code, bits, lanes = draw(st.sampled_from([(2, 32, 1), (2, 64, 1), (0, 32, 1), (2, 16, 1), (1, 8, 1)]))
    else:
        ndim = draw(st.one_of(st.integers(0, 4), st.sampled_from([8, 64])))
        if ndim > 4:
            twos = draw(st.sets(st.integers(0, ndim - 1), max_size=8))
            shape = [2 if i in twos else 1 for i in range(ndim)]
        else:
            shape = draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim))
        kind = draw(st.sampled_from(["null", "row-major", "random", "random"]))
        strides = (None if kind == "null" else caps_row_major(shape) if kind == "row-major"
                   else draw(st.lists(st.integers(-9, 9), min_size=ndim, max_size=ndim)))
        if draw(st.booleans()):  # half the time a dtype NumPy has, so values can be compared
            code, bits = draw(st.sampled_from(sorted(NUMPY)))
        else:
            code = draw(st.sampled_from(sorted(ALLOWED_BITS)))
            bits = draw(st.sampled_from(ALLOWED_BITS[code]))
        lanes = draw(st.sampled_from([1, 1, 1, 1, 1, 2, 4]))
    c.update(shape=shape, strides=strides, ndim=len(shape), dtype=[code, bits, lanes],
             offset_items=draw(st.integers(0, 8)), versioned=draw(st.booleans()), version=[1, draw(st.integers(0, 5))],
             flags=draw(st.sampled_from([0, 0, 0, 0, caps.READ_ONLY, caps.IS_COPIED, caps.READ_ONLY | caps.IS_COPIED, caps.IS_SUBBYTE_TYPE_PADDED])),
             device=list(draw(st.sampled_from([(1, 0)] * 8 + [(3, 0), (13, 0), (2, 0), (1, 1)]))),
             deleter=draw(st.integers(0, 24)) != 0, null_data_when_empty=draw(st.booleans()),
             mode=draw(st.sampled_from(["capsule", "producer"])), byte_offset=None, misalign=0, name=None,
             null_name=False, null_shape=False, producer="ok", device_answer=None)
    if draw(st.booleans()):
        for bad in draw(st.lists(st.sampled_from(sorted(CORRUPTIONS)), min_size=1, max_size=3, unique=True)):
            corrupt(draw, c, bad)
    return c


def caps_row_major(shape):
    out, step = [], 1
    for d in reversed(shape):
        out.insert(0, step)
        step *= d
    return out


def corrupt(draw, c, bad):
    c.setdefault("bad", []).append(bad)
    if bad == "ndim_negative":
        c["ndim"] = draw(st.sampled_from([-1, -64, -(2**31)]))
    elif bad == "ndim_too_big":
        c["ndim"] = draw(st.sampled_from([65, 100, 1000, 2**31 - 1]))
    elif bad == "negative_dim":
        if not c["shape"]:
            c["shape"], c["strides"], c["ndim"] = [1], None, 1
        c["shape"][draw(st.integers(0, len(c["shape"]) - 1))] = draw(st.sampled_from([-1, -3, -(2**63)]))
    elif bad == "null_shape":
        if not c["shape"]:
            c["shape"], c["strides"], c["ndim"] = [2], None, 1
        c["null_shape"] = True
    elif bad == "overflow_dims":  # element count x scalar >= 2**64 bytes, no zero dim
        c["shape"], c["strides"], c["ndim"] = draw(st.sampled_from([[2**62, 2**62], [I64_MAX, 64], [2**33, 2**33, 2**33]])), None, None
    elif bad == "overflow_stride":  # byte extent >= 2**64, even at 1 bit per element
        s = draw(st.sampled_from([I64_MAX, -I64_MAX, 2**62 + 1, -(2**62) - 1]))
        c["shape"], c["strides"], c["ndim"] = [129, 2], [s, 1], None
    elif bad == "bad_major_version":
        c["versioned"], c["version"] = True, [draw(st.sampled_from([0, 2, 3, 2**32 - 1])), 0]
    elif bad == "huge_minor_version":
        c["version"][1] = 2**32 - 1
    elif bad == "unknown_dtype_code":
        c["dtype"][0] = draw(st.sampled_from([18, 19, 100, 255]))
    elif bad == "bad_bits":
        c["dtype"][1] = draw(st.sampled_from([b for b in (0, 3, 7, 24, 255) if b not in ALLOWED_BITS.get(c["dtype"][0], ())]))
    elif bad == "zero_lanes":
        c["dtype"][2] = 0
    elif bad == "unknown_device":
        c["device"][0] = draw(st.sampled_from([0, 5, 6, 19, 1000, -1]))
    elif bad == "negative_device_id":
        c["device"][1] = draw(st.sampled_from([-1, -(2**31)]))
    elif bad == "huge_device_id":
        c["device"][1] = 2**31 - 1
    elif bad == "null_data":
        c["null_data"] = True
    elif bad == "misaligned":
        c["misalign"] = 1
    elif bad == "wrapping_byte_offset":
        c["byte_offset"] = draw(st.sampled_from([2**64 - 8, 2**64 - 64, 2**64 - 1]))
    elif bad == "used_name":
        c["name"] = "used"
    elif bad == "garbage_name":
        if draw(st.booleans()):
            c["null_name"] = True
        else:
            c["name"] = draw(st.sampled_from(["garbage", "", "dltensor_versioned_", "DLTENSOR"]))
    elif bad == "garbage_flags":
        c["flags"] = draw(st.integers(0, 2**64 - 1))
    elif bad == "producer_raises":
        c["mode"], c["producer"] = "producer", "raises"
    elif bad == "producer_returns_junk":
        c["mode"], c["producer"] = "producer", draw(st.sampled_from(["int", "none", "foreign capsule"]))
    elif bad == "device_answer_lies":
        c["mode"], c["device_answer"] = "producer", draw(st.sampled_from([(2, 0), (1,), "cpu", (99, 0), "raise"]))


# ---- the model: which rules a case breaks, which bytes it touches --------------------------


def scalar_bytes(c) -> int:
    """Bytes per element, rounded up (sub-byte types: 1): generous, for buffer sizes."""
    _, bits, lanes = c["dtype"]
    return max(1, math.ceil(bits * lanes / 8))


def ndim_of(c) -> int:
    return len(c["shape"]) if c["ndim"] is None else c["ndim"]


def layout_ok(c) -> bool:
    return 0 <= ndim_of(c) <= 64 and ndim_of(c) == len(c["shape"]) and not c["null_shape"] and all(d >= 0 for d in c["shape"])


def elements(c) -> int:
    return math.prod(c["shape"]) if layout_ok(c) else -1


def span(c) -> tuple[int, int]:
    """Byte range [lo, hi) relative to data + byte_offset (generous scalar size)."""
    return caps.span(c["shape"], c["strides"], scalar_bytes(c))


def refusals(c) -> list[str]:
    """The promised checks this case breaks, judged on its final fields (a model of the
    validator in docs/rust.md): dlbridge must refuse it."""
    out = []
    nd = ndim_of(c)
    code, bits, lanes = c["dtype"]
    if not 0 <= nd <= 64:
        out.append("ndim out of range")
    elif c["null_shape"] and nd > 0:
        out.append("NULL shape")
    elif any(d < 0 for d in c["shape"]):
        out.append("negative dim")
    elif all(d > 0 for d in c["shape"]):
        bits_total = math.prod(c["shape"]) * bits * max(lanes, 1)
        extent = sum((d - 1) * abs(s) for d, s in zip(c["shape"], c["strides"] or [])) * bits * max(lanes, 1)
        if bits_total >= 8 * 2**64 or extent >= 8 * 2**64:
            out.append("byte extent >= 2**64")
    if c["versioned"] and c["version"][0] != 1:
        out.append("major version")
    if code not in ALLOWED_BITS:
        out.append("dtype code")
    elif bits not in ALLOWED_BITS[code]:
        out.append("dtype bits")
    if lanes == 0:
        out.append("lanes 0")
    if c["device"][0] not in KNOWN_DEVICES:
        out.append("device type")
    if c["device"][1] < 0:
        out.append("device id")
    elif c["device"][0] == 1 and c["device"][1] != 0:
        out.append("cpu device id")  # DLPack: the CPU's device_id is 0
    if elements(c) > 0:
        if c.get("null_data"):
            out.append("NULL data")
        if c["misalign"] and bits >= 16:
            out.append("misaligned")
        if c["byte_offset"] is not None and c["byte_offset"] >= 2**63:
            out.append("wrapping byte offset")
    if c["name"] is not None or c["null_name"]:
        out.append("capsule name")
    if c["mode"] == "producer" and c["producer"] != "ok":
        out.append("producer")
    return out


def build(c, payload=None):
    """A ManagedTensor for case ``c`` over a real buffer when its layout is plausible.
    Returns ``(tensor, view)``: ``view(buf_bytes)`` is the NumPy view of the elements (or None)."""
    n = elements(c)
    item = scalar_bytes(c)
    byte_offset = c["byte_offset"]
    view = None
    if n >= 0 and (n == 0 or (lambda s: s[1] - s[0])(span(c)) <= CAP):
        lo, hi = span(c)
        slack = 64
        owner, base = caps.aligned_buffer(hi - lo + 2 * slack)
        elem0 = base + slack - lo + c["misalign"]
        if byte_offset is None:
            byte_offset = c["offset_items"] * item
        data = elem0 - byte_offset if byte_offset < 2**63 else elem0
        nbytes = hi - lo + 2 * slack
        buf = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(base))
        key = (c["dtype"][0], c["dtype"][1])
        if key in NUMPY and c["dtype"][2] == 1 and not c["misalign"]:
            dt = np.dtype(NUMPY[key])
            count = nbytes // dt.itemsize
            buf.view(dt)[:count] = (np.arange(count) % 7) if dt.kind != "b" else (np.arange(count) % 2).astype(bool)
            if n > 0 and c["strides"] is not None:
                byte_strides = [s * dt.itemsize for s in c["strides"]]
            else:
                byte_strides = None
            view = lambda b, dt=dt, off=elem0 - base, bs=byte_strides: np.ndarray(  # noqa: E731
                tuple(c["shape"]), dtype=dt, buffer=b, offset=off if n else 0, strides=bs)
        else:
            buf[:] = 0
    else:
        assert refusals(c), f"a plausible layout too large to back with memory: {c}"
        owner, data, buf = _dummy_owner, DUMMY, None
        if byte_offset is None:
            byte_offset = 0
    if c.get("null_data") or (n == 0 and c["null_data_when_empty"]):
        data = None
    name = None
    if c["name"] == "used":
        name = b"used_dltensor_versioned" if c["versioned"] else b"used_dltensor"
    elif c["name"] is not None:
        name = c["name"].encode()

    def make(versioned):
        return caps.ManagedTensor(
            data=data, keep=owner, shape=None if c["null_shape"] else c["shape"], strides=c["strides"], ndim=ndim_of(c),
            dtype=tuple(c["dtype"]), device=tuple(c["device"]), byte_offset=byte_offset % 2**64, versioned=versioned,
            version=tuple(c["version"]), flags=c["flags"], deleter=c["deleter"], name=name, null_name=c["null_name"])

    return make, buf, view


class Junk(caps.Producer):
    def __init__(self, make, c):
        super().__init__(make, device=tuple(c["device"]))
        self.c = c

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        kind = self.c["producer"]
        if kind == "raises":
            raise ValueError("producer refuses")
        if kind == "int":
            return 42
        if kind == "none":
            return None
        if kind == "foreign capsule":
            return ctypes.pythonapi.PyCapsule_New  # not a capsule at all: a ctypes function
        return super().__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        lie = self.c["device_answer"]
        if lie is None:
            return self.device
        if lie == "raise":
            raise RuntimeError("no device")
        return lie


def feed(c, call, check=None):
    """Builds the case, hands it to ``call``, checks the outcome and the deleter count."""
    make, buf, view = build(c)
    if c["mode"] == "producer":
        obj = Junk(make, c)
        tensors = obj.tensors
        versioned = c["versioned"]
        obj.answer = "versioned" if versioned else "legacy"
    else:
        t = make(c["versioned"])
        obj, tensors = t.capsule(), [t]
    before = None if buf is None else buf.copy()
    result = error = None
    try:
        result = call(obj)
    except BaseException as e:  # noqa: BLE001 - the class is what is checked
        assert isinstance(e, Exception), f"{type(e).__name__} (not an Exception): {e}\n{c}"
        assert type(e).__name__ != "PanicException", f"panic: {e}\n{c}"
        error = e
    must_refuse = refusals(c)
    if must_refuse:
        assert error is not None, f"accepted a tensor breaking {must_refuse}: {c}"
    if error is None and check is not None:
        check(result, buf, before, view)
    del result, obj
    for t in tensors:
        t.release()
        if t.has_deleter and t.deleter_calls != 1:
            gc.collect()
        if t.has_deleter:
            assert t.deleter_calls == 1, f"the deleter ran {t.deleter_calls} times: {c}"
            assert t.pending_exception is None, f"the deleter was called with an exception set ({t.pending_exception}): {c}"
    return error


def well_formed(c) -> bool:
    return not c.get("bad") and c["device"][0] in HOST


SETTINGS = settings(max_examples=2000, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(cases())
def test_from_dlpack_takes_or_refuses_any_capsule(c):
    def check(a, buf, before, view):
        assert a.shape == tuple(c["shape"]), c
        if well_formed(c) and view is not None and c["device"] == [1, 0]:
            np.testing.assert_array_equal(np.from_dlpack(copy(a)), view(buf), err_msg=str(c))

    feed(c, dlbridge.from_dlpack, check)


@SETTINGS
@given(cases())
def test_kernels_read_exactly_the_elements_of_any_accepted_capsule(c):
    def check(out, buf, before, view):
        assert out.shape == tuple(c["shape"]), c
        if view is not None:
            np.testing.assert_array_equal(np.from_dlpack(out), view(buf), err_msg=str(c))
        if buf is not None:
            assert np.array_equal(buf, before), "an input was written"

    feed(c, copy, check)


@SETTINGS
@given(cases())
def test_out_capsules_are_written_exactly_where_their_layout_says_or_refused(c):
    key = (c["dtype"][0], c["dtype"][1])
    assume(key in NUMPY and layout_ok(c) or c.get("bad"))
    dt = np.dtype(NUMPY.get(key, "f4"))
    shape = tuple(c["shape"]) if layout_ok(c) and elements(c) <= 1 << 17 else (2,)
    x = np.ones(shape, dtype=dt) if dt.kind != "b" else np.ones(shape, dtype=bool)

    read_only = c["versioned"] and c["flags"] & caps.READ_ONLY  # a legacy struct has no flags

    def check(out, buf, before, view):
        assert not read_only, f"wrote into a READ_ONLY tensor: {c}"
        if view is not None:
            expected = before.copy()
            view(expected)[...] = 2
            np.testing.assert_array_equal(buf, expected, err_msg=f"wrote outside the layout or wrong values: {c}")

    error = feed(c, lambda obj: add(x, x, out=obj), check)
    if error is None:
        return
    if read_only and well_formed(c) and dt.name in ("float32", "float64", "int32", "int64", "float16"):
        assert isinstance(error, (BufferError, ValueError, TypeError)), c


def test_a_deleter_is_never_called_for_a_tensor_it_does_not_own():
    assert caps.stray_deleter_calls() == 0
