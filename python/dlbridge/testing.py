"""Conformance checks any library can run on its DLPack producer and consumer.

    import dlbridge.testing
    dlbridge.testing.check_producer(lambda shape, dtype: mylib.zeros(shape, dtype))
    dlbridge.testing.check_consumer("mylib:from_dlpack")

``check_producer(make_tensor)``: ``make_tensor(shape, dtype)`` returns a fresh tensor of
the given shape (a tuple) and dtype (dlbridge's short names: ``"f32"``, ``"i64"``, ...) on
the CPU; the checks call its ``__dlpack__`` and read the capsules.

``check_consumer(from_dlpack)``: hand-built producers (ctypes capsules, see
``dlbridge._capsules``) feed ``from_dlpack`` well-formed and malformed tensors: versioned
and legacy capsules, READ_ONLY, negative/zero/NULL strides, byte offsets, 0-d and
size-0 tensors, unknown versions and codes, used capsules; the deleter is counted.

The code under test runs in child interpreters (given as ``"module:attr"``; a producer's
factory too when it is importable by name, and always from the command line): one that
exits, whatever its status, crashes or hangs past the timeout fails the check it was running,
naming how, never hidden. The results come back on a pipe of their own, not on stdout, so
nothing the code prints passes for one. This is robustness to buggy code, not a sandbox: the
checks read the memory the code hands them, in its address space.

Every check comes from the DLPack 1.3 header and the array API standard's data-interchange
rules. A check that fails raises ``AssertionError`` listing every failure, unless it is
declared in ``known_failures={name: reason}``, in which case it is reported as a known
failure — and a declared failure that passes is itself an error, so stale declarations get
removed. ``python -m dlbridge.testing [--markdown]`` runs both on every library installed
here and prints the matrix library x rule; ``--producer module:factory`` and ``--consumer
module:function`` run them on your own library, ``--timeout SECONDS`` bounds each check
(``--help`` for the rest).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from . import _capsules as caps
from . import from_dlpack, get_kernel
from ._dlbridge import inspect_capsule

READ_ONLY, IS_COPIED = 1, 2


@dataclass
class Result:
    """The outcome of one check."""

    name: str
    status: str  # "pass", "fail", "skip", "known failure"
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.name:45s} {self.status}{': ' + self.detail if self.detail else ''}"


class _Fail(Exception):
    pass


class _Skip(Exception):
    pass


def _expect(cond: bool, detail: str) -> None:
    if not cond:
        raise _Fail(detail)


def _row_major(shape: tuple) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.insert(0, step)
        step *= d
    return strides


# ---- producer checks -------------------------------------------------------------------


def _checks(make: Callable[[tuple, str], Any], dtype: str, shape: tuple, make_read_only):
    def dlpack_device_is_a_cpu_pair():
        dev = make(shape, dtype).__dlpack_device__()
        _expect(isinstance(dev, tuple) and len(dev) == 2, f"__dlpack_device__() returned {dev!r}")
        _expect((int(dev[0]), int(dev[1])) == (1, 0), f"expected (kDLCPU=1, 0), got {dev!r}")

    def legacy_capsule_without_max_version():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # numpy deprecates legacy exports
            info = inspect_capsule(make(shape, dtype).__dlpack__())
        _expect(info["name"] == "dltensor", f"capsule named {info['name']!r}")

    def versioned_capsule_when_asked():
        info = inspect_capsule(make(shape, dtype).__dlpack__(max_version=(1, 3)))
        _expect(info["name"] in ("dltensor_versioned", "dltensor"), f"capsule named {info['name']!r}")
        if info["name"] == "dltensor_versioned":
            _expect(info["version"][0] == 1 and info["version"][1] <= 3, f"version {info['version']} for max_version (1, 3)")
        else:
            return "answers with a legacy capsule (allowed, but it cannot carry flags)"

    def shape_dtype_and_strides_describe_the_tensor():
        info = inspect_capsule(make(shape, dtype).__dlpack__(max_version=(1, 3)))
        _expect(info["shape"] == list(shape), f"shape {info['shape']}, expected {list(shape)}")
        _expect(info["dtype"] == dtype, f"dtype {info['dtype']}, expected {dtype}")
        _expect(info["strides"] == _row_major(shape), f"strides {info['strides']} for a fresh contiguous tensor")

    def exports_are_zero_copy():
        t = make((4,), dtype)
        a = inspect_capsule(t.__dlpack__(max_version=(1, 3)))["data"]
        b = inspect_capsule(t.__dlpack__(max_version=(1, 3)))["data"]
        _expect(a == b, f"two exports point at {a:#x} and {b:#x}")

    def copy_false_is_zero_copy():
        t = make((4,), dtype)
        a = inspect_capsule(t.__dlpack__(max_version=(1, 3)))["data"]
        b = inspect_capsule(t.__dlpack__(max_version=(1, 3), copy=False))["data"]
        _expect(a == b, "copy=False moved the data")

    def copy_true_copies_and_sets_is_copied():
        t = make((4,), dtype)
        a = inspect_capsule(t.__dlpack__(max_version=(1, 3)))["data"]
        info = inspect_capsule(t.__dlpack__(max_version=(1, 3), copy=True))
        _expect(info["data"] != a, "copy=True returned the same memory")
        _expect(info["name"] != "dltensor", "copied, but a legacy capsule cannot carry flags: IS_COPIED cannot be set "
                "(the producer answers max_version=(1, 3) with a legacy capsule)")
        _expect(info["flags"] & IS_COPIED, f"copy=True left IS_COPIED unset (flags {info['flags']:#x})")

    def dl_device_cpu_is_accepted():
        inspect_capsule(make((2,), dtype).__dlpack__(max_version=(1, 3), dl_device=(1, 0)))

    def unsupported_dl_device_is_a_buffer_error():
        try:
            make((2,), dtype).__dlpack__(max_version=(1, 3), dl_device=(16, 0))  # Hexagon: nobody here supports it
        except BufferError:
            return
        except Exception as e:  # noqa: BLE001 - the type is what is checked
            raise _Fail(f"raised {type(e).__name__}: {e}") from None
        raise _Fail("exported to an unsupported device without error")

    def stream_on_cpu_must_be_none():
        make((2,), dtype).__dlpack__(stream=None, max_version=(1, 3))
        try:
            make((2,), dtype).__dlpack__(stream=5, max_version=(1, 3))
        except Exception as e:  # noqa: BLE001 - the standard names no exception type for this
            return f"refused with {type(e).__name__}"
        raise _Fail("stream=5 on a CPU tensor was accepted")

    def read_only_sets_the_flag():
        if make_read_only is None:
            raise _Skip("no read-only tensors to export")
        info = inspect_capsule(make_read_only(shape, dtype).__dlpack__(max_version=(1, 3)))
        _expect(info["name"] != "dltensor", "read-only data exported as a legacy capsule, which cannot carry READ_ONLY "
                "(the producer answers max_version=(1, 3) with a legacy capsule)")
        _expect(info["flags"] & READ_ONLY, f"READ_ONLY unset on read-only data (flags {info['flags']:#x})")

    def read_only_is_never_a_legacy_capsule():
        if make_read_only is None:
            raise _Skip("no read-only tensors to export")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                cap = make_read_only(shape, dtype).__dlpack__()
        except BufferError:
            return
        except Exception as e:  # noqa: BLE001 - the type is what is checked
            raise _Fail(f"raised {type(e).__name__}, expected BufferError: {e}") from None
        raise _Fail(f"read-only data exported as a writable legacy capsule ({inspect_capsule(cap)['name']!r})")

    def device_matches_the_capsule():
        t = make(shape, dtype)
        dev = tuple(int(x) for x in t.__dlpack_device__())
        got = tuple(inspect_capsule(t.__dlpack__(max_version=(1, 3)))["device"])
        _expect(dev == got, f"__dlpack_device__() says {dev}, the capsule says {got}")

    def views_export_their_layout():
        # A slice (and a transpose) of a larger array: zero copy, its first element and
        # strides are the base's; or a compact copy of it (JAX slices copy).
        base_shape = (4, 6) if len(shape) == 2 else (6,)
        base = make(base_shape, dtype)
        try:
            view = base[1:, ::2] if len(base_shape) == 2 else base[1::2]
        except Exception as e:  # noqa: BLE001 - slicing is not part of DLPack
            raise _Skip(f"the array does not take NumPy's basic slicing ({type(e).__name__})") from None
        b = inspect_capsule(base.__dlpack__(max_version=(1, 3)))
        v = inspect_capsule(view.__dlpack__(max_version=(1, 3)))
        want_shape, shared = ([3, 3], [6, 2]) if len(base_shape) == 2 else ([3], [2])
        _expect(v["shape"] == want_shape, f"a slice exported shape {v['shape']}, expected {want_shape}")
        bits = "".join(c for c in dtype if c.isdigit())
        item = max(1, int(bits) // 8) if bits else 1  # bool: one byte
        first = b["data"] + (base_shape[-1] if len(base_shape) == 2 else 1) * item
        if v["data"] == first:
            _expect(v["strides"] == shared, f"a view of the slice exported strides {v['strides']}, expected {shared}")
            kind = "a view"
        else:
            _expect(v["strides"] == _row_major(tuple(want_shape)),
                    f"a slice is neither the base's memory nor a compact copy: data {v['data']:#x}, strides {v['strides']}")
            kind = "a copy"
        transposed = getattr(base, "T", None) if len(base_shape) == 2 else None
        if transposed is not None and hasattr(transposed, "__dlpack__"):
            t = inspect_capsule(transposed.__dlpack__(max_version=(1, 3)))
            _expect(t["shape"] == [6, 4], f"a transpose exported shape {t['shape']}, expected [6, 4]")
            if t["data"] == b["data"]:
                _expect(t["strides"] == [1, 6], f"a transposed view exported strides {t['strides']}, expected [1, 6]")
            else:
                _expect(t["strides"] == [4, 1], f"a transpose is neither the base's memory nor a compact copy: strides {t['strides']}")
        return kind

    def capsule_is_consumed_once():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            cap = make((3,), dtype).__dlpack__()
        from_dlpack(cap)
        try:
            from_dlpack(cap)
        except Exception:  # noqa: BLE001 - any clean exception is conforming
            return
        raise _Fail("a consumed capsule was imported twice")

    def consumer_sees_the_producers_memory():
        t = make(shape, dtype)
        expected = inspect_capsule(t.__dlpack__(max_version=(1, 3)))["data"]
        a = from_dlpack(t)
        _expect(a.data_ptr == expected, "from_dlpack copied")
        del t
        copied = get_kernel("copy")(a)  # reads every element (tolist() cannot show f16/bf16/complex)
        _expect(copied.shape == tuple(shape), "data unreadable after the producer was dropped")

    return [
        dlpack_device_is_a_cpu_pair,
        legacy_capsule_without_max_version,
        versioned_capsule_when_asked,
        shape_dtype_and_strides_describe_the_tensor,
        exports_are_zero_copy,
        copy_false_is_zero_copy,
        copy_true_copies_and_sets_is_copied,
        dl_device_cpu_is_accepted,
        unsupported_dl_device_is_a_buffer_error,
        stream_on_cpu_must_be_none,
        read_only_sets_the_flag,
        read_only_is_never_a_legacy_capsule,
        device_matches_the_capsule,
        views_export_their_layout,
        capsule_is_consumed_once,
        consumer_sees_the_producers_memory,
    ]


CHECKS = [c.__name__ for c in _checks(lambda s, d: None, "f32", (2, 3), None)]

# Each producer rule: where it is written, and how to follow it.
HEADER, ARRAY_API = "DLPack 1.3 header (dlpack.h)", "array API standard, __dlpack__"
PRODUCER_RULES: dict[str, tuple[str, str]] = {
    "dlpack_device_is_a_cpu_pair": ("array API standard, __dlpack_device__: returns (device_type, device_id), an enum and an int",
                                    "return (1, 0) for host memory (kDLCPU), e.g. by passing on NumPy's __dlpack_device__()"),
    "legacy_capsule_without_max_version": (f"{ARRAY_API}: without max_version, a legacy 'dltensor' capsule",
                                           "called without max_version, export a DLManagedTensor in a capsule named 'dltensor'"),
    "versioned_capsule_when_asked": (f"{ARRAY_API}: max_version=(1, 3) lets the producer return a 'dltensor_versioned' capsule",
                                     "pass max_version on to the exporter (NumPy, torch and dlbridge take it)"),
    "shape_dtype_and_strides_describe_the_tensor": (f"{HEADER}: DLTensor.shape, .dtype, .strides (in elements)",
                                                    "export the array's own shape, dtype and strides"),
    "exports_are_zero_copy": (f"{ARRAY_API}: copy=None shares memory whenever it can",
                              "export the array's memory itself, not a copy of it"),
    "copy_false_is_zero_copy": (f"{ARRAY_API}: copy=False never copies (BufferError where it would have to)",
                                "pass copy on to the exporter, or refuse copy=False with BufferError where only a copy works"),
    "copy_true_copies_and_sets_is_copied": (f"{ARRAY_API}: copy=True always copies; {HEADER}: DLPACK_FLAG_BITMASK_IS_COPIED",
                                            "for copy=True export a new copy, in a versioned capsule with IS_COPIED set"),
    "dl_device_cpu_is_accepted": (f"{ARRAY_API}: dl_device names the device the consumer wants the data on",
                                  "accept dl_device=(1, 0) for host memory (pass it on to the exporter)"),
    "unsupported_dl_device_is_a_buffer_error": (f"{ARRAY_API}: a dl_device the producer cannot export to raises BufferError",
                                                "raise BufferError for any dl_device other than the array's own"),
    "stream_on_cpu_must_be_none": (f"{ARRAY_API}: stream is None for CPU arrays",
                                   "raise for a stream other than None on CPU data (pass stream on to the exporter)"),
    "read_only_sets_the_flag": (f"{HEADER}: DLPACK_FLAG_BITMASK_READ_ONLY",
                                "export read-only data in a versioned capsule with READ_ONLY set"),
    "read_only_is_never_a_legacy_capsule": (f"{HEADER}: a legacy DLManagedTensor cannot say READ_ONLY",
                                            "raise BufferError when read-only data is asked for without max_version"),
    "device_matches_the_capsule": (f"array API standard, __dlpack_device__ and {HEADER}: DLTensor.device describe one device",
                                   "return from __dlpack_device__ the (device_type, device_id) the exported DLTensor holds"),
    "views_export_their_layout": (f"{HEADER}: DLTensor.data + byte_offset is element 0, strides are in elements",
                                  "export a view with its own first element (data, byte_offset) and strides, or a compact copy"),
    "capsule_is_consumed_once": (f"{ARRAY_API}: the consumer renames the capsule 'used_dltensor' and owns the tensor",
                                 "return a new capsule on each call and let consumers rename it; never reuse one"),
    "consumer_sees_the_producers_memory": (f"{HEADER}: the deleter keeps the memory alive until the consumer calls it",
                                           "make the DLManagedTensor's deleter own a reference to the array's memory"),
}

# Rules a producer that ignores __dlpack__'s keywords breaks together: one cause.
_KEYWORD_RULES = ("copy_true_copies_and_sets_is_copied", "unsupported_dl_device_is_a_buffer_error",
                  "stream_on_cpu_must_be_none", "read_only_sets_the_flag", "copy_false_is_zero_copy")


def root_causes(results: list[Result]) -> list[str]:
    """Single causes that explain several failures of one producer's results,
    each one sentence with its fix (the root cause first in a report)."""
    by = {r.name: r for r in results}
    broken = [n for n in _KEYWORD_RULES if n in by and by[n].status == "fail"]
    legacy = "legacy capsule" in by.get("versioned_capsule_when_asked", Result("", "")).detail
    if legacy and len(broken) >= 2:
        return [
            f"__dlpack__ ignores its keywords: it answers max_version=(1, 3) with a legacy capsule, and {len(broken)} rules "
            f"that depend on max_version, copy, dl_device or stream fail ({', '.join(broken)}). Fix: pass **kwargs on to "
            "the exporter (NumPy's, torch's) or implement the keywords of the array API's __dlpack__."
        ]
    return []


def _fold(failures: list[str]) -> str:
    """Per-dtype failures ``"f32: what"`` as one text: ``"what (f32, f64)"`` where
    the dtypes saw the same thing."""
    by_what: dict[str, list[str]] = {}
    for f in failures:
        dtype, sep, what = f.partition(": ")
        if not sep or " " in dtype:
            dtype, what = "", f
        by_what.setdefault(what, []).append(dtype)
    parts = [f"{what} ({', '.join(d for d in dtypes if d)})" if any(dtypes) else what for what, dtypes in by_what.items()]
    return "; ".join(parts)


def _summarize(name: str, outcomes: list[tuple[str, str]], known: dict[str, str]) -> Result:
    """One Result from per-dtype (or single) outcomes ``(status, detail)``."""
    failures = [d for s, d in outcomes if s == "fail"]
    skips = [d for s, d in outcomes if s == "skip"]
    details = sorted({d for s, d in outcomes if s == "pass" and d})
    if failures and name in known:
        return Result(name, "known failure", f"{known[name]} (saw: {failures[0]})")
    if failures:
        return Result(name, "fail", _fold(failures))
    if skips and len(skips) == len(outcomes):
        return Result(name, "skip", skips[0])
    if name in known:
        return Result(name, "fail", f"declared a known failure ({known[name]}) but passes: remove the declaration")
    return Result(name, "pass", "; ".join(details))


def _finish(kind: str, results: list[Result], raise_on_failure: bool) -> list[Result]:
    bad = [r for r in results if r.status == "fail"]
    if bad and raise_on_failure:
        raise AssertionError(f"DLPack {kind} checks failed:\n" + "\n".join(str(r) for r in bad))
    return results


def _producer_outcomes(make, name: str, dtypes: tuple, shape: tuple, make_read_only) -> list[tuple[str, str]]:
    """Runs one producer check for every dtype, here: its ``(status, detail)`` per dtype."""
    outcomes = []
    for dtype in dtypes:
        check = next(c for c in _checks(make, dtype, tuple(shape), make_read_only) if c.__name__ == name)
        try:
            outcomes.append(("pass", check() or ""))
        except _Skip as e:
            outcomes.append(("skip", str(e)))
        except _Fail as e:
            outcomes.append(("fail", f"{dtype}: {e}"))
        except Exception as e:  # noqa: BLE001 - an unexpected exception is a failure
            outcomes.append(("fail", f"{dtype}: {type(e).__name__}: {e}"))
    return outcomes


def _known(known_failures: dict[str, str] | None, names: list[str]) -> dict[str, str]:
    known = dict(known_failures or {})
    unknown = set(known) - set(names)
    if unknown:
        raise ValueError(f"unknown checks in known_failures: {sorted(unknown)}")
    return known


DEFAULT_DTYPES = ("f32", "f64", "i32", "i64", "u8")
# Every dtype a producer may be asked to export.
DTYPES = ("bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64", "c64", "c128")


def _checked_dtypes(dtypes: Any) -> tuple[str, ...]:
    """``dtypes`` as a tuple, or a ValueError: none at all would check nothing
    (every rule "passes" without the factory being called)."""
    if isinstance(dtypes, str):
        raise ValueError(f"dtypes must be a sequence of dtype names such as ('f32', 'i64'), not the string {dtypes!r}")
    out = tuple(dtypes)
    if not out:
        raise ValueError(f"dtypes is empty: name at least one of {', '.join(DTYPES)}")
    unknown = [d for d in out if d not in DTYPES]
    if unknown:
        raise ValueError(f"unknown dtypes {', '.join(map(repr, unknown))}: known are {', '.join(DTYPES)}")
    return out
DEFAULT_TIMEOUT = 30.0


def check_producer(
    make_tensor: Callable[[tuple, str], Any] | str,
    *,
    dtypes: tuple = DEFAULT_DTYPES,
    shape: tuple = (2, 3),
    make_read_only: Callable[[tuple, str], Any] | str | None = None,
    known_failures: dict[str, str] | None = None,
    raise_on_failure: bool = True,
    isolate: bool | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[Result]:
    """Runs every producer check for every dtype; see the module docs.

    ``shape`` is the tensor the layout checks export (``(6,)`` for a 1-d-only library);
    ``make_read_only(shape, dtype)`` makes read-only tensors for the READ_ONLY checks
    (skipped without it). The factories are callables or ``"module:attr"``. With
    ``isolate`` the checks run in child interpreters (see :func:`check_consumer`), each
    given ``timeout`` seconds; that needs factories importable by name. The default,
    ``None``, isolates exactly when they are (a lambda or a local class runs here)."""
    known = _known(known_failures, CHECKS)
    dtypes = _checked_dtypes(dtypes)
    specs = [f if isinstance(f, str) or f is None else _spec_of(f) for f in (make_tensor, make_read_only)]
    nameable = specs[0] is not None and (make_read_only is None or specs[1] is not None)
    if isolate is None:
        isolate = nameable
    if isolate:
        if not nameable:
            f = make_tensor if specs[0] is None else make_read_only
            raise ValueError(f"{f!r} is not importable by name: pass 'module:attr', or isolate=False")
        job = {"kind": "producer", "factory": specs[0], "read_only": specs[1], "dtypes": list(dtypes), "shape": list(shape)}
        outcomes, _ = _box(job, CHECKS, timeout)
    else:
        make = _resolve(make_tensor) if isinstance(make_tensor, str) else make_tensor
        ro = _resolve(make_read_only) if isinstance(make_read_only, str) else make_read_only
        outcomes = {n: _producer_outcomes(make, n, tuple(dtypes), tuple(shape), ro) for n in CHECKS}
    return _finish("producer", [_summarize(n, outcomes[n], known) for n in CHECKS], raise_on_failure)


# ---- consumer checks -------------------------------------------------------------------


_KNOWN_RESULTS = ("pyarrow", "array_api_strict", "torch", "numpy", "jax", "dlbridge")


def _via_dlpack(r) -> Any:
    """An imported array of a library the checks do not know, read back through
    DLPack (``dlbridge.from_dlpack``, zero copy): its pointer, flags, shape and
    values are what its own ``__dlpack__`` says. None for a known library, or
    a result without ``__dlpack__``."""
    if type(r).__module__.startswith(_KNOWN_RESULTS) or not hasattr(r, "__dlpack__"):
        return None
    return from_dlpack(r)


def _values(r) -> Any:
    """The imported array's values as nested lists (or a scalar for 0-d)."""
    mod = type(r).__module__
    if (a := _via_dlpack(r)) is not None:
        return a.tolist()
    if mod.startswith("pyarrow"):
        return r.to_pylist() if hasattr(r, "to_pylist") else r.to_numpy().tolist()
    if hasattr(r, "_array") and mod.startswith("array_api_strict"):
        return r._array.tolist()
    if hasattr(r, "tolist"):
        return r.tolist()
    import numpy as np

    return np.asarray(r).tolist()


def _shape(r) -> tuple:
    if (a := _via_dlpack(r)) is not None:
        return tuple(a.shape)
    shape = getattr(r, "shape", None)
    if shape is None and type(r).__module__.startswith("pyarrow"):
        return (len(r),)
    return tuple(shape)


def _data_ptr(r) -> int | None:
    """Address of the imported array's first element, or None where it cannot be read."""
    mod = type(r).__module__
    if (a := _via_dlpack(r)) is not None:
        return a.data_ptr
    if mod.startswith("torch"):
        return r.data_ptr()
    if mod.startswith("numpy"):
        return r.__array_interface__["data"][0]
    if mod.startswith("jax"):
        return r.unsafe_buffer_pointer()
    if mod.startswith("array_api_strict"):
        return r._array.__array_interface__["data"][0]
    if mod.startswith("dlbridge"):
        return r.data_ptr
    if mod.startswith("pyarrow"):
        if hasattr(r, "buffers"):
            return r.buffers()[1].address + r.offset * r.type.bit_width // 8
        return r.to_numpy().__array_interface__["data"][0]
    return None


def _writable(r) -> bool | None:
    """Whether writes through the imported array reach memory; None where unknown.
    A library the checks do not know answers through its own __dlpack__ (READ_ONLY)."""
    mod = type(r).__module__
    if (a := _via_dlpack(r)) is not None:
        return not a.readonly
    if mod.startswith("torch"):
        return True  # torch has no read-only tensors
    if mod.startswith("numpy"):
        return bool(r.flags.writeable)
    if mod.startswith("jax"):
        return False  # JAX arrays are immutable
    if mod.startswith("array_api_strict"):
        return bool(r._array.flags.writeable)
    if mod.startswith("dlbridge"):
        return not r.readonly
    if mod.startswith("pyarrow"):
        return bool(getattr(r, "is_mutable", False))
    try:
        return not memoryview(r).readonly
    except TypeError:
        return None


_producers: list[caps.Producer] = []  # made by the case now running


def _f32(values: list, **fields):
    """``make(versioned)`` for a float32 tensor over a fresh 256-aligned buffer holding
    ``values``; ``offset`` (elements) moves the data pointer; other keywords are
    ManagedTensor fields. The tensor's ``base`` attribute is the buffer's address."""

    offset = fields.pop("offset", 0)
    null_data = fields.pop("null_data", False)
    used = fields.pop("used", False)

    def make(versioned: bool) -> caps.ManagedTensor:
        owner, addr = caps.aligned_buffer(4 * max(len(values), 1))
        (ctypes.c_float * len(values)).from_address(addr)[:] = [float(v) for v in values]
        extra = {"name": b"used_dltensor_versioned" if versioned else b"used_dltensor"} if used else {}
        t = caps.ManagedTensor(data=None if null_data else addr + 4 * offset, keep=owner, versioned=versioned, **extra, **fields)
        t.base = addr
        return t

    return make


def _producer(make, cls=caps.Producer, **kw) -> caps.Producer:
    p = cls(make, **kw)
    _producers.append(p)
    return p


def _import_ok(fd, p, expected_values, expected_shape=None):
    r = fd(p)
    got = _values(r)
    _expect(got == expected_values, f"read {got}, expected {expected_values}")
    if expected_shape is not None:
        _expect(_shape(r) == expected_shape, f"shape {_shape(r)}, expected {expected_shape}")
    return r


def _refused(fd, p, what: str) -> str:
    try:
        r = fd(p)
    except Exception as e:  # noqa: BLE001 - any clean exception refuses
        return f"refused with {type(e).__name__}"
    raise _Fail(f"imported {what}: read {_values(r)!r}")


def _imported_or_refused(fd, p, expected) -> str:
    try:
        r = fd(p)
    except Exception as e:  # noqa: BLE001 - a clean refusal is conforming
        return f"refused with {type(e).__name__}: {str(e)[:80]}"
    got = _values(r)
    _expect(got == expected, f"imported but read {got}, expected {expected}")
    return "imported correctly"


def _asked_versioned(p) -> bool:
    mv = p.calls[0].get("max_version") if p.calls else None
    return mv is not None and tuple(mv) >= (1, 0)


def _consumer_cases():
    def asks_for_versioned_capsule(fd):
        p = _producer(_f32(list(range(6)), shape=[6]))
        _import_ok(fd, p, [0, 1, 2, 3, 4, 5])
        _expect(_asked_versioned(p), f"calls __dlpack__({_kwargs(p.calls[0])}): only legacy capsules, which cannot carry READ_ONLY")
        return f"max_version={tuple(p.calls[0]['max_version'])}"

    def imports_a_versioned_capsule(fd):
        p = _producer(_f32(list(range(6)), shape=[6]))
        _import_ok(fd, p, [0, 1, 2, 3, 4, 5], (6,))
        if not _asked_versioned(p):
            raise _Skip("never asks for a versioned capsule")

    def imports_with_zero_copy(fd):
        p = _producer(_f32(list(range(6)), shape=[6]))
        r = _import_ok(fd, p, [0, 1, 2, 3, 4, 5])
        ptr = _data_ptr(r)
        if ptr is None:
            raise _Skip(f"cannot read the data pointer of a {type(r).__name__}")
        _expect(ptr == p.tensors[0].base, "copied the data")

    def accepts_a_legacy_answer(fd):
        # the standard lets a producer answer max_version with an older (legacy) capsule: JAX does
        _import_ok(fd, _producer(_f32(list(range(6)), shape=[6]), answer="legacy"), [0, 1, 2, 3, 4, 5], (6,))

    def falls_back_to_legacy_on_type_error(fd):
        p = _producer(_f32([1, 2, 3], shape=[3]), cls=caps.Producer2022)
        _import_ok(fd, p, [1, 2, 3])

    def refuses_a_future_major_version(fd):
        return _refused(fd, _producer(_f32([1, 2], shape=[2], version=(2, 0)), answer="versioned"), "a DLPack 2.0 tensor")

    def refuses_unknown_dtype_code(fd):
        return _refused(fd, _producer(_f32([1, 2], shape=[2], dtype=(99, 32, 1))), "dtype code 99")

    def refuses_unknown_device_type(fd):
        return _refused(fd, _producer(_f32([1, 2], shape=[2], device=(99, 0)), device=(99, 0)), "device type 99")

    def refuses_a_used_capsule(fd):
        return _refused(fd, _producer(_f32([1, 2], shape=[2], used=True)), "a capsule named used_*")

    def honours_read_only(fd):
        p = _producer(_f32([1, 2, 3], shape=[3], flags=caps.READ_ONLY), read_only=True)

        def untouched():
            # Refusing or not, the consumer must not have written into the memory.
            for t in p.tensors:
                held = [float(v) for v in (ctypes.c_float * 3).from_address(t.base)]
                _expect(held == [1.0, 2.0, 3.0], f"wrote into a READ_ONLY tensor's memory: it holds {held}, not [1.0, 2.0, 3.0]")

        try:
            r = fd(p)
        except Exception as e:  # noqa: BLE001 - refusing is conforming
            untouched()
            if not _asked_versioned(p):
                return f"never asks for a versioned capsule, so read-only data is refused ({type(e).__name__})"
            return f"refused with {type(e).__name__}"
        untouched()
        w = _writable(r)
        if w is None:
            raise _Skip(f"cannot tell whether a {type(r).__name__} is writable")
        _expect(not w, "imported a READ_ONLY tensor as a writable array")
        return "read-only result"

    def renames_the_capsule(fd):
        p = _producer(_f32([1, 2, 3], shape=[3]))
        _import_ok(fd, p, [1, 2, 3])
        _expect(p.tensors[0].consumed, f"the capsule is still named {p.tensors[0].capsule_name!r} after the import")

    def calls_the_deleter_once(fd):
        p = _producer(_f32([1, 2, 3], shape=[3]))
        r = _import_ok(fd, p, [1, 2, 3])
        t = p.tensors[0]
        if _data_ptr(r) == t.base:
            _expect(t.deleter_calls == 0, "the deleter ran while the imported array still uses the memory")
        del r
        if t.deleter_calls == 0:  # an array kept alive by a reference cycle (a collection is slow in a big process)
            gc.collect()
        _expect(t.deleter_calls == 1, f"the deleter ran {t.deleter_calls} times once the array was dropped")

    def negative_strides_imported_or_refused(fd):
        return _imported_or_refused(fd, _producer(_f32([0, 1, 2, 3], shape=[4], strides=[-1], offset=3)), [3, 2, 1, 0])

    def zero_strides_imported_or_refused(fd):
        return _imported_or_refused(fd, _producer(_f32([7], shape=[3], strides=[0])), [7, 7, 7])

    def null_strides_read_as_row_major(fd):
        _import_ok(fd, _producer(_f32(list(range(6)), shape=[2, 3], strides=None)), [[0, 1, 2], [3, 4, 5]], (2, 3))

    def applies_byte_offset(fd):
        _import_ok(fd, _producer(_f32(list(range(6)), shape=[4], byte_offset=8)), [2, 3, 4, 5])

    def zero_dim_tensor(fd):
        _import_ok(fd, _producer(_f32([42], shape=[])), 42, ())

    def size_zero_with_null_data(fd):
        _import_ok(fd, _producer(_f32([], shape=[0], null_data=True)), [], (0,))

    return [
        asks_for_versioned_capsule,
        imports_a_versioned_capsule,
        imports_with_zero_copy,
        accepts_a_legacy_answer,
        falls_back_to_legacy_on_type_error,
        refuses_a_future_major_version,
        refuses_unknown_dtype_code,
        refuses_unknown_device_type,
        refuses_a_used_capsule,
        honours_read_only,
        renames_the_capsule,
        calls_the_deleter_once,
        negative_strides_imported_or_refused,
        zero_strides_imported_or_refused,
        null_strides_read_as_row_major,
        applies_byte_offset,
        zero_dim_tensor,
        size_zero_with_null_data,
    ]


CONSUMER_CHECKS = [c.__name__ for c in _consumer_cases()]

# Each consumer rule: where it is written, and how to follow it.
CONSUMER_RULES: dict[str, tuple[str, str]] = {
    "asks_for_versioned_capsule": (f"{ARRAY_API}: a consumer passes max_version to get a 'dltensor_versioned' capsule",
                                   "call __dlpack__(max_version=(1, 3)) (the highest version you read)"),
    "imports_a_versioned_capsule": (f"{HEADER}: DLManagedTensorVersioned",
                                    "read 'dltensor_versioned' capsules: version, flags, then the DLTensor"),
    "imports_with_zero_copy": (f"{ARRAY_API}: from_dlpack shares the producer's memory (copy=None)",
                               "wrap the DLTensor's data in place; keep the capsule's tensor until its deleter runs"),
    "accepts_a_legacy_answer": (f"{ARRAY_API}: a producer may answer max_version with a legacy 'dltensor' capsule",
                                "read a 'dltensor' capsule returned to a max_version request too"),
    "falls_back_to_legacy_on_type_error": (f"{ARRAY_API}: producers written to older standards raise TypeError for max_version",
                                           "on TypeError, call __dlpack__() again without max_version"),
    "refuses_a_future_major_version": (f"{HEADER}: DLPACK_MAJOR_VERSION: a newer major version is another ABI",
                                       "refuse (BufferError) a tensor whose version.major is above the one you read"),
    "refuses_unknown_dtype_code": (f"{HEADER}: DLDataTypeCode",
                                   "refuse a dtype code (or bits, lanes) you have no type for instead of guessing one"),
    "refuses_unknown_device_type": (f"{HEADER}: DLDeviceType",
                                    "refuse a device type you cannot reach instead of reading its memory as the host's"),
    "refuses_a_used_capsule": (f"{ARRAY_API}: a consumed capsule is renamed 'used_dltensor' and never consumed again",
                               "check the capsule's name before taking its pointer"),
    "honours_read_only": (f"{HEADER}: DLPACK_FLAG_BITMASK_READ_ONLY",
                          "make the imported array read-only when the flag is set (or refuse it)"),
    "renames_the_capsule": (f"{ARRAY_API}: the consumer renames the capsule 'used_dltensor' / 'used_dltensor_versioned'",
                            "rename the capsule when you take ownership of its tensor"),
    "calls_the_deleter_once": (f"{HEADER}: DLManagedTensor.deleter: called once by the consumer when done",
                               "call the deleter exactly once, when the last user of the memory is gone"),
    "negative_strides_imported_or_refused": (f"{HEADER}: DLTensor.strides may be negative",
                                             "follow negative strides, or refuse the tensor cleanly (never crash)"),
    "zero_strides_imported_or_refused": (f"{HEADER}: DLTensor.strides may be zero (broadcast)",
                                         "follow zero strides read-only, or refuse the tensor cleanly"),
    "null_strides_read_as_row_major": (f"{HEADER}: strides NULL means compact row-major",
                                       "read NULL strides as row-major strides"),
    "applies_byte_offset": (f"{HEADER}: DLTensor.byte_offset: element 0 is at data + byte_offset",
                            "add byte_offset to data before reading"),
    "zero_dim_tensor": (f"{HEADER}: ndim = 0 is a scalar (shape and strides may be NULL)",
                        "import ndim = 0 as a 0-d array"),
    "size_zero_with_null_data": (f"{HEADER}: a tensor with no elements may have data = NULL",
                                 "accept NULL data when a dim is 0"),
}


def _kwargs(call: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in call.items() if v is not None) or ""


def _run_consumer_case(fd, name: str) -> tuple[str, str]:
    """Runs one case in this process: ``(status, detail)``; then releases every producer and
    checks each tensor's deleter ran exactly once."""
    case = next(c for c in _consumer_cases() if c.__name__ == name)
    _producers.clear()
    status, detail = "pass", ""
    try:
        detail = case(fd) or ""
    except _Skip as e:
        status, detail = "skip", str(e)
    except _Fail as e:
        status, detail = "fail", str(e)
    except Exception as e:  # noqa: BLE001 - an unexpected exception is a failure
        status, detail = "fail", f"{type(e).__name__}: {e}"
    # What the consumer took and has not given back may be held by a reference cycle (a
    # traceback's frames): collected before the deleters are counted. A collection takes
    # long in a process holding torch and JAX, so only when one is missing.
    if any(t.consumed and t.deleter_calls == 0 for p in _producers for t in p.tensors):
        gc.collect()
    problems = []
    for p in _producers:
        p.release()
        for t in p.tensors:
            if t.pending_exception:
                problems.append(f"the deleter was called with a Python exception set ({t.pending_exception})")
            if t.deleter_calls != 1:
                problems.append(f"the deleter ran {t.deleter_calls} times" + (" (leaked)" if t.deleter_calls == 0 else ""))
    _producers.clear()
    if problems:
        status, detail = "fail", "; ".join(([detail] if status == "fail" else []) + sorted(set(problems)))
    return status, detail


def check_consumer(
    from_dlpack: Callable | str,
    *,
    known_failures: dict[str, str] | None = None,
    raise_on_failure: bool = True,
    isolate: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[Result]:
    """Runs every consumer check on ``from_dlpack``; see the module docs.

    ``from_dlpack`` is a callable or ``"module:attr"``. With ``isolate`` (the default) the
    cases run in child interpreters, which needs the function importable by name: a case that
    ends its process fails, naming how (``the consumer crashed the process: killed by signal
    SIGABRT``, ``... exited with status 0 before reporting``, ``... did not finish within 30 s``:
    ``timeout`` seconds a case), and a new child runs the rest. A function that cannot be
    imported skips every check, saying why."""
    known = _known(known_failures, CONSUMER_CHECKS)
    try:
        outcomes = _consumer_outcomes(from_dlpack, isolate, timeout)
    except SpecError as e:
        outcomes = {n: [("skip", str(e))] for n in CONSUMER_CHECKS}
    return _finish("consumer", [_summarize(n, outcomes[n], known) for n in CONSUMER_CHECKS], raise_on_failure)


def _consumer_outcomes(from_dlpack: Callable | str, isolate: bool, timeout: float) -> dict[str, list[tuple[str, str]]]:
    """Every consumer case's outcomes; SpecError where ``from_dlpack`` names nothing usable."""
    if isolate:
        spec = from_dlpack if isinstance(from_dlpack, str) else _spec_of(from_dlpack)
        if spec is None:
            raise ValueError(f"{from_dlpack!r} is not importable by name: pass 'module:attr', or isolate=False")
        return _box({"kind": "consumer", "function": spec}, CONSUMER_CHECKS, timeout)[0]
    fd = _resolve(from_dlpack) if isinstance(from_dlpack, str) else from_dlpack
    return {n: [_run_consumer_case(fd, n)] for n in CONSUMER_CHECKS}


# ---- the box: the code under test runs in child interpreters ----------------------------
#
# A factory or a consumer may end its process (sys.exit, os._exit, a crash) or never return.
# Each runs in a child interpreter, and the child's messages travel on a pipe of their own
# (one JSON object a line, with the child's pid), never on its stdout or stderr, which the
# code under test writes as it likes: those go to a file, whose last line a failure quotes.
# This keeps a report true in spite of buggy code; it is no sandbox: the checks read the
# tensors the code makes, in its address space, so code that means harm can forge anything.


class SpecError(ValueError):
    """A ``module:attr`` that names nothing usable, said in one line."""


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_spec(spec: str) -> tuple[str, list[str]]:
    """``"module:attr.attr"`` as the module and the attribute path; SpecError for a malformed one."""
    if not isinstance(spec, str):
        raise SpecError(f"{spec!r} is not a 'module:attr' string")
    if ":" not in spec:
        raise SpecError(f"{spec}: no colon: expected MODULE:NAME (e.g. mylib:zeros)")
    module, _, attr = spec.partition(":")
    if not module.strip():
        raise SpecError(f"{spec}: no module before the colon: expected MODULE:NAME")
    if not attr.strip():
        raise SpecError(f"{spec}: no name after the colon: expected MODULE:NAME")
    if not all(p.isidentifier() for p in module.split(".")):
        raise SpecError(f"{spec}: {module!r} is not a module name")
    parts = attr.split(".")
    if not all(p.isidentifier() for p in parts):
        raise SpecError(f"{spec}: {attr!r} is not a name")
    return module, parts


def _resolve(spec: str) -> Callable:
    """The callable ``"module:attr"`` names, imported here; SpecError, one line, saying what was
    wrong where there is none (malformed, not importable, no such attribute, not callable)."""
    module, parts = _parse_spec(spec)
    try:
        obj: Any = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - whatever the import raised, reported in one line
        raise SpecError(_one_line(f"{spec}: cannot import {module}: {type(e).__name__}: {e}")) from None
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SpecError(f"{spec}: {module} has no attribute {'.'.join(parts[: i + 1])}") from None
    if not callable(obj):
        raise SpecError(f"{spec}: {'.'.join(parts)} is a {type(obj).__name__}, not callable")
    return obj


def _spec_of(f) -> str | None:
    """``"module:qualname"`` of a callable a child interpreter can import, else None."""
    module, qualname = getattr(f, "__module__", None), getattr(f, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return None
    try:
        return f"{module}:{qualname}" if _resolve(f"{module}:{qualname}") is f else None
    except Exception:  # noqa: BLE001 - not importable by name
        return None


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _boxed(argv: list[str]) -> None:
    """The child side of the box: ``argv`` is the pipe's file descriptor, the job (JSON) and the
    checks to run. Each step is announced (``start``, with who runs in it) before it runs, and
    each check's outcomes are sent when it is done; ``done`` ends a child that ran to the end."""
    fd, job, names = int(argv[0]), json.loads(argv[1]), argv[2:]
    os.set_inheritable(fd, False)  # processes the code under test starts never get the pipe
    pipe = os.fdopen(fd, "w", encoding="utf-8")
    pid = os.getpid()
    sys.path[:0] = [p for p in job.get("path", []) if p not in sys.path]

    def send(**msg) -> None:
        if os.getpid() != pid:  # a fork made by the code under test came back here: not ours to report
            os._exit(0)
        pipe.write(json.dumps({"pid": pid, **msg}) + "\n")
        pipe.flush()

    def importing(spec: str) -> str:
        return f"importing {spec.partition(':')[0]}"

    kind = job["kind"]
    try:
        if kind == "resolve":
            for flag, spec in job["specs"]:
                send(start=flag, who=importing(spec))
                try:
                    _resolve(spec)
                except SpecError as e:
                    send(unusable=f"{flag} {e}")
                    return
        elif kind == "producer":
            if job.get("kwargs_of"):
                send(start="setup", who=f"{job['kwargs_of']}()")
                try:
                    kw = _resolve(job["kwargs_of"])()
                except Exception as e:  # noqa: BLE001 - sent to the parent
                    send(unusable=_one_line(f"{type(e).__name__}: {e}"))
                    return
                make, ro = kw["make_tensor"], kw.get("make_read_only")
                dtypes, shape = tuple(kw.get("dtypes", DEFAULT_DTYPES)), tuple(kw.get("shape", (2, 3)))
                send(setup={"known_failures": dict(kw.get("known_failures") or {})})
            else:
                send(start="setup", who=importing(job["factory"]))
                make = _resolve(job["factory"])
                ro = None
                if job.get("read_only"):
                    send(start="setup", who=importing(job["read_only"]))
                    ro = _resolve(job["read_only"])
                dtypes, shape = tuple(job["dtypes"]), tuple(job["shape"])
            # The factories once per dtype before any check: one that ends the process or hangs
            # fails every check at once. What they raise, the checks report.
            for who, factory in (("the factory", make), ("the read-only factory", ro)):
                if factory is not None:
                    send(start="factories", who=who)
                    for dtype in dtypes:
                        try:
                            factory(shape, dtype)
                        except Exception:  # noqa: BLE001, S110 - reported by the checks
                            pass
            for name in names:
                send(start=name, who="the producer")
                send(result=name, outcomes=_producer_outcomes(make, name, dtypes, shape, ro))
        elif kind == "consumer":
            send(start="setup", who=importing(job["function"]))
            fd_ = _resolve(job["function"])
            for name in names:
                send(start=name, who="the consumer")
                send(result=name, outcomes=[_run_consumer_case(fd_, name)])
    except SpecError as e:
        send(unusable=str(e))
        return
    send(done=True)


@dataclass
class _Run:
    """What one child said, and how it ended."""

    messages: list
    step: str  # the step started last and not finished ("" once its result came)
    who: str  # who ran in it: "the factory", "importing mylib", ...
    limit: float  # the seconds it was given
    rc: int | None = None  # None: killed once past its limit
    log: str = ""  # the last line the child wrote on stdout or stderr
    done: bool = False


# Starting an interpreter and importing dlbridge is the harness's own work: it gets this long
# however short the checks' timeout.
_STARTUP_S = 60.0


def _child_run(job: dict, names: list[str], timeout: float) -> _Run:
    """One child interpreter running ``names`` of ``job``, until it ends or a step outlives its limit."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    job = {**job, "path": [p or os.getcwd() for p in sys.path]}
    cmd = [sys.executable, "-c", "import sys; from dlbridge.testing import _boxed; _boxed(sys.argv[1:])"]
    run = _Run([], "startup", "the checker's child interpreter", max(timeout, _STARTUP_S))
    with tempfile.TemporaryFile() as log:
        rfd, wfd = os.pipe()
        try:
            proc = subprocess.Popen([*cmd, str(wfd), json.dumps(job), *names], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env, pass_fds=(wfd,), start_new_session=True)
        except BaseException:
            os.close(rfd)
            raise
        finally:
            os.close(wfd)
        try:
            _follow(proc, rfd, run, timeout)
        finally:
            os.close(rfd)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # what the code under test started and left running
        log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
        lines = [ln for ln in log.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        run.log = _one_line(lines[-1], 200) if lines else ""
    return run


def _follow(proc: subprocess.Popen, rfd: int, run: _Run, timeout: float) -> None:
    """Reads the child's messages into ``run`` until the child ends (``run.rc``) or its step
    outlives its limit (``run.rc`` stays None; the caller kills it)."""
    buf, open_ = b"", True
    deadline = time.monotonic() + run.limit

    def take(line: bytes) -> None:
        nonlocal deadline
        try:
            msg = json.loads(line)
        except ValueError:
            return
        if not isinstance(msg, dict) or msg.get("pid") != proc.pid:
            return
        run.messages.append(msg)
        if "start" in msg:
            run.step, run.who, run.limit = str(msg["start"]), str(msg.get("who", "")), timeout
            deadline = time.monotonic() + timeout
        elif "result" in msg:
            run.step = ""
        elif msg.get("done"):
            # What the code under test left to run at exit (hooks, threads) gets the timeout too.
            run.done, run.step, run.who, run.limit = True, "exit", "the code under test", timeout
            deadline = time.monotonic() + timeout

    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if open_ and select.select([rfd], [], [], min(left, 0.1))[0]:
            chunk = os.read(rfd, 1 << 16)
            if chunk:
                *lines, buf = (buf + chunk).split(b"\n")
                for line in lines:
                    take(line)
                continue
            open_ = False
        if proc.poll() is not None:
            # Ended; a process it started may still hold the pipe open: read what is there.
            os.set_blocking(rfd, False)
            with contextlib.suppress(BlockingIOError, OSError):
                while chunk := os.read(rfd, 1 << 16):
                    buf += chunk
            for line in buf.split(b"\n"):
                take(line)
            run.rc = proc.returncode
            return
        if not open_:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=min(left, 0.1))


_DEATH = re.compile(
    r"did not finish within [0-9.]+ s|did not end within [0-9.]+ s|crashed the process(?: at exit)?: killed by signal"
    r"|exited with status -?\d+ before reporting|made the process exit with status -?\d+ at exit"
)


def _death(run: _Run) -> str:
    """How a child that did not finish ended, naming who ran in it."""
    if run.step == "exit":
        if run.rc is None:
            return f"{run.who} kept the process from ending: it did not end within {run.limit:g} s (a thread left running, or an exit hook that hangs?)"
        if run.rc < 0:
            return f"{run.who} crashed the process at exit: killed by signal {_signal_name(-run.rc)}"
        return f"{run.who} made the process exit with status {run.rc} at exit" + (f" (its last output: {run.log})" if run.log else "")
    if run.rc is None:
        return f"{run.who} did not finish within {run.limit:g} s"
    if run.rc < 0:
        return f"{run.who} crashed the process: killed by signal {_signal_name(-run.rc)}"
    return f"{run.who} exited with status {run.rc} before reporting" + (f" (its last output: {run.log})" if run.log else "")


def _box(job: dict, names: list[str], timeout: float) -> tuple[dict[str, list[tuple[str, str]]], dict]:
    """Runs the checks ``names`` of ``job`` in child interpreters: each check's outcomes, and what
    the child said of its setup (a library's known failures). A child that ends or hangs in a
    check fails that check, naming how, and a new child runs the rest; one that does so before
    its first check (importing, the factories' first calls) fails every check left. SpecError
    where the job's code cannot be found."""
    out: dict[str, list[tuple[str, str]]] = {}
    setup: dict = {}
    todo = list(names)
    while todo:
        run = _child_run(job, todo, timeout)
        for msg in run.messages:
            if "unusable" in msg:
                raise SpecError(str(msg["unusable"]))
            if isinstance(msg.get("setup"), dict):
                setup.update(msg["setup"])
            if msg.get("result") in todo and isinstance(msg.get("outcomes"), list):
                out[msg["result"]] = [(str(s), str(d)) for s, d in msg["outcomes"]]
        todo = [n for n in todo if n not in out]
        if run.done and run.rc != 0:
            # Every check reported, then the process crashed, failed or hung on its way out: the
            # last check it ran fails, naming how (its results stand).
            ran = [m["result"] for m in run.messages if m.get("result") in out]
            if ran:
                out[ran[-1]] = [*out[ran[-1]], ("fail", f"after this check, {_death(run)}")]
        if not todo:
            break
        if run.done:
            for n in todo:
                out[n] = [("fail", "the checker's child finished without a result for this check")]
            break
        why = _death(run)
        if run.step in todo:
            out[run.step] = [("fail", why)]
            todo.remove(run.step)
        else:
            for n in todo:
                out[n] = [("fail", why)]
            break
    return out, setup


def _check_specs(specs: list[tuple[str, str]], timeout: float) -> None:
    """Whether every ``(flag, "module:attr")`` names a callable, tried in a child interpreter:
    SpecError, one line naming the flag and what was wrong, where one does not."""
    for flag, spec in specs:
        try:
            _parse_spec(spec)
        except SpecError as e:
            raise SpecError(f"{flag} {e}") from None
    run = _child_run({"kind": "resolve", "specs": specs}, [], timeout)
    for msg in run.messages:
        if "unusable" in msg:
            raise SpecError(str(msg["unusable"]))
    if not run.done:
        flag = run.step if run.step in dict(specs) else specs[0][0]
        raise SpecError(f"{flag} {dict(specs)[flag]}: {_death(run)}")


# ---- every library installed here -----------------------------------------------------


@dataclass
class Library:
    """One column of the matrix: how to make its tensors and which function imports."""

    name: str
    module: str
    producer: Callable[[], dict] | None  # () -> check_producer keyword arguments
    consumer: str | None  # "module:attr"
    consumer_known: dict
    no_producer: str = ""
    no_consumer: str = ""


def _torch_producer() -> dict:
    import torch

    kinds = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64, "i8": torch.int8,
             "i16": torch.int16, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8, "bool": torch.bool,
             "c64": torch.complex64, "c128": torch.complex128}
    return dict(
        make_tensor=lambda s, d: torch.zeros(s, dtype=kinds[d]),
        dtypes=tuple(kinds),
        known_failures={"copy_true_copies_and_sets_is_copied": "torch copies on copy=True but leaves IS_COPIED unset"},
    )


_NUMPY_DTYPES = ("f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool", "c64", "c128")


def _np_dtype(d: str):
    import numpy as np

    from . import _compile

    return np.dtype(_compile._NUMPY_NAMES[d])


def _numpy_producer() -> dict:
    import numpy as np

    def read_only(s, d):
        a = np.zeros(s, dtype=_np_dtype(d))
        a.flags.writeable = False
        return a

    return dict(make_tensor=lambda s, d: np.zeros(s, dtype=_np_dtype(d)), dtypes=_NUMPY_DTYPES, make_read_only=read_only)


def _jax_producer() -> dict:
    import jax

    jax.config.update("jax_enable_x64", True)  # f64/i64 arrays; this process only
    import jax.numpy as jnp

    dtypes = ("f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool", "c64", "c128")
    kinds = {d: (jnp.bfloat16 if d == "bf16" else _np_dtype(d)) for d in dtypes}
    make = lambda s, d: jnp.zeros(s, dtype=kinds[d])  # noqa: E731
    return dict(
        make_tensor=make,
        dtypes=dtypes,
        make_read_only=make,  # every JAX array is immutable
        known_failures={
            "copy_true_copies_and_sets_is_copied": "JAX answers every request with a legacy capsule: no IS_COPIED",
            "read_only_sets_the_flag": "JAX arrays are immutable, yet JAX exports only legacy capsules, which cannot say READ_ONLY",
            "read_only_is_never_a_legacy_capsule": "JAX exports its immutable arrays as legacy (writable) capsules",
        },
    )


def _pyarrow_tensor_producer() -> dict:
    import numpy as np
    import pyarrow as pa

    dtypes = ("f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")

    def read_only(s, d):
        a = np.zeros(s, dtype=_np_dtype(d))
        a.flags.writeable = False
        return pa.Tensor.from_numpy(a)

    return dict(
        make_tensor=lambda s, d: pa.Tensor.from_numpy(np.zeros(s, dtype=_np_dtype(d))),
        dtypes=dtypes,
        make_read_only=read_only,
        known_failures={"read_only_is_never_a_legacy_capsule": "pyarrow refuses with ArrowNotImplementedError, not BufferError"},
    )


def _pyarrow_array_producer() -> dict:
    import numpy as np
    import pyarrow as pa

    dtypes = ("f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
    make = lambda s, d: pa.array(np.zeros(s, dtype=_np_dtype(d)))  # noqa: E731
    return dict(
        make_tensor=make,
        dtypes=dtypes,
        shape=(6,),
        make_read_only=make,  # Arrow arrays are immutable
        known_failures={"read_only_is_never_a_legacy_capsule": "pyarrow exports its immutable arrays as legacy (writable) capsules too"},
    )


def _array_api_strict_producer() -> dict:
    import array_api_strict as xp

    kinds = {"f32": xp.float32, "f64": xp.float64, "i8": xp.int8, "i16": xp.int16, "i32": xp.int32, "i64": xp.int64,
             "u8": xp.uint8, "u16": xp.uint16, "u32": xp.uint32, "u64": xp.uint64, "bool": xp.bool,
             "c64": xp.complex64, "c128": xp.complex128}
    return dict(make_tensor=lambda s, d: xp.zeros(s, dtype=kinds[d]), dtypes=tuple(kinds))


def _paddle_producer() -> dict:
    import paddle

    kinds = {"f32": paddle.float32, "f64": paddle.float64, "i32": paddle.int32, "i64": paddle.int64, "u8": paddle.uint8}
    return dict(make_tensor=lambda s, d: paddle.zeros(s, dtype=kinds[d]), dtypes=tuple(kinds))


def _dlbridge_producer() -> dict:
    from . import zeros

    def read_only(s, d):
        fmt = {"f32": "f", "f64": "d", "i32": "i", "i64": "q", "u8": "B"}[d]
        n = 1
        for x in s:
            n *= x
        from . import asarray

        return asarray(memoryview(bytes(n * {"f": 4, "d": 8, "i": 4, "q": 8, "B": 1}[fmt])).cast(fmt, s))

    return dict(make_tensor=lambda s, d: zeros(list(s), d), make_read_only=read_only)


_PYARROW_CONSUMER = {
    "accepts_a_legacy_answer": "pyarrow cannot read a legacy answer to max_version=(1, 3) (ValueError: PyCapsule_GetPointer "
                               "called with incorrect name): it cannot import JAX arrays",
    "falls_back_to_legacy_on_type_error": "pyarrow does not retry without max_version when __dlpack__ rejects it",
}

LIBRARIES = [
    Library("dlbridge.Array", "dlbridge", _dlbridge_producer, "dlbridge:from_dlpack", {}),
    Library("torch", "torch", _torch_producer, "torch:from_dlpack", {
        "honours_read_only": "torch has no read-only tensors: it imports READ_ONLY data as a writable tensor",
        "negative_strides_imported_or_refused": "torch aborts the process on negative strides",
        "applies_byte_offset": "torch refuses a non-zero byte_offset",
    }),
    Library("numpy", "numpy", _numpy_producer, "numpy:from_dlpack", {}),
    Library("jax", "jax", _jax_producer, "jax.dlpack:from_dlpack", {
        "asks_for_versioned_capsule": "JAX calls __dlpack__(stream=None) only: legacy capsules",
    }),
    Library("pyarrow.Tensor", "pyarrow", _pyarrow_tensor_producer, "pyarrow:Tensor.from_dlpack", _PYARROW_CONSUMER),
    Library("pyarrow.Array", "pyarrow", _pyarrow_array_producer, "pyarrow:Array.from_dlpack", {
        **_PYARROW_CONSUMER,
        "null_strides_read_as_row_major": "pyarrow.Array.from_dlpack takes 1-d tensors only (documented)",
        "zero_dim_tensor": "pyarrow.Array.from_dlpack takes 1-d tensors only (documented)",
    }),
    Library("array-api-strict", "array_api_strict", _array_api_strict_producer, "array_api_strict:from_dlpack", {}),
    Library("paddle", "paddle", _paddle_producer, "paddle.utils.dlpack:from_dlpack", {}),
]


def run_all(libraries: list[Library] | None = None, timeout: float = DEFAULT_TIMEOUT) -> dict[str, dict[str, Result]]:
    """Producer and consumer checks on every library importable here: library -> rule ->
    Result (rules prefixed ``producer.`` / ``consumer.``); missing libraries are skips. The
    libraries run in child interpreters, ``timeout`` seconds a check (see :func:`check_consumer`)."""
    matrix: dict[str, dict[str, Result]] = {}
    for lib in libraries or LIBRARIES:
        row: dict[str, Result] = {}
        try:
            found = importlib.util.find_spec(lib.module) is not None
        except (ImportError, ValueError):
            found = False
        missing = "" if found else f"{lib.module} not installed (ModuleNotFoundError)"
        for name in CHECKS:
            row[f"producer.{name}"] = Result(name, "skip", missing or lib.no_producer)
        for name in CONSUMER_CHECKS:
            row[f"consumer.{name}"] = Result(name, "skip", missing or lib.no_consumer)
        if not missing and lib.producer is not None:
            try:
                spec = _spec_of(lib.producer)
                if spec is None:  # a library of the caller's, made here
                    results = check_producer(raise_on_failure=False, timeout=timeout, **lib.producer())
                else:
                    outcomes, setup = _box({"kind": "producer", "kwargs_of": spec}, CHECKS, timeout)
                    known = _known(setup.get("known_failures"), CHECKS)
                    results = [_summarize(n, outcomes[n], known) for n in CHECKS]
                for r in results:
                    row[f"producer.{r.name}"] = r
            except Exception as e:  # noqa: BLE001 - a harness error is a failure of every check
                why = str(e) if isinstance(e, SpecError) else f"{type(e).__name__}: {e}"
                for name in CHECKS:
                    row[f"producer.{name}"] = Result(name, "fail", f"could not run: {why}")
        if not missing and lib.consumer is not None:
            for r in check_consumer(lib.consumer, known_failures=lib.consumer_known, raise_on_failure=False, timeout=timeout):
                row[f"consumer.{r.name}"] = r
        matrix[lib.name] = row
    return matrix


_SHORT = {"pass": "pass", "fail": "FAIL", "known failure": "known", "skip": "skip"}


def format_matrix(matrix: dict[str, dict[str, Result]], markdown: bool = False) -> str:
    """The matrix library x rule, with numbered notes for every known failure, failure and skip."""
    libs = list(matrix)
    rules = list(next(iter(matrix.values()))) if matrix else []
    notes: dict[str, int] = {}

    def cell(r: Result) -> str:
        if r.status == "pass":
            return "pass"
        detail = r.detail.split(" (saw: ")[0] if markdown else r.detail  # the docs keep the reason only
        key = f"{r.status}: {detail}"
        n = notes.setdefault(key, len(notes) + 1)
        return f"{_SHORT[r.status]} [{n}]"

    rows = [[rule] + [cell(matrix[lib][rule]) for lib in libs] for rule in rules]
    header = ["rule"] + libs
    lines = []
    if markdown:
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append("")
    for key, n in notes.items():
        lines.append(f"{'- ' if markdown else ''}[{n}] {key}")
    return "\n".join(lines)


def _table(markdown: bool = False, timeout: float = DEFAULT_TIMEOUT) -> int:
    """Prints the matrix for every library importable here; returns the failure count."""
    matrix = run_all(timeout=timeout)
    print(format_matrix(matrix, markdown))
    for row in matrix.values():
        _tally([r for rule, r in row.items() if rule.startswith("producer.")], CHECKS)
        _tally([r for rule, r in row.items() if rule.startswith("consumer.")], CONSUMER_CHECKS)
    failures = sum(r.status == "fail" for row in matrix.values() for r in row.values())
    print(f"\n{len(matrix)} libraries x {len(CHECKS)} producer + {len(CONSUMER_CHECKS)} consumer rules, {failures} failures")
    return failures


_STATUSES = ("pass", "known failure", "skip", "fail")


def _tally(results: list[Result], names: list[str]) -> dict[str, int]:
    """How many results have each status. Every rule of ``names`` has exactly one result and
    every result one of the statuses, so the counts add up to the rules: else RuntimeError
    (a report that does not add up is never printed as if it did)."""
    got = sorted(r.name for r in results)
    if got != sorted(names):
        missing, extra = sorted(set(names) - set(got)), sorted(n for n in set(got) if got.count(n) > 1 or n not in names)
        raise RuntimeError(f"the report does not add up: no result for {missing}, unexpected or repeated {extra}")
    counts = {s: sum(r.status == s for r in results) for s in _STATUSES}
    if sum(counts.values()) != len(names):
        odd = sorted({r.status for r in results} - set(_STATUSES))
        raise RuntimeError(f"the report does not add up: results of unknown status {odd}")
    return counts


def _totals(counts: dict[str, int]) -> str:
    """``"16 rules: 13 passed, 0 skipped, 3 failures"`` (known failures named where there are any)."""
    known = f", {counts['known failure']} known failures" if counts["known failure"] else ""
    return f"{sum(counts.values())} rules: {counts['pass']} passed{known}, {counts['skip']} skipped, {counts['fail']} failures"


def _yours(args: Any) -> int:
    """``--producer`` / ``--consumer``: the checks on the caller's own library; the failure count.
    SpecError where a ``module:attr`` names nothing usable."""
    specs = [(flag, v) for flag, v in (("--producer", args.producer), ("--read-only", args.read_only),
                                       ("--consumer", args.consumer)) if v is not None]
    _check_specs(specs, args.timeout)
    sections: list[tuple[str, dict, list[str], list[Result]]] = []
    if args.producer is not None:
        dtypes = args.dtypes if args.dtypes is not None else DEFAULT_DTYPES
        rs = check_producer(args.producer, make_read_only=args.read_only, dtypes=dtypes, raise_on_failure=False,
                            isolate=True, timeout=args.timeout)
        sections.append((f"producer {args.producer}", PRODUCER_RULES, CHECKS, rs))
    if args.consumer is not None:
        outcomes = _consumer_outcomes(args.consumer, True, args.timeout)
        rs = [_summarize(n, outcomes[n], {}) for n in CONSUMER_CHECKS]
        sections.append((f"consumer {args.consumer}", CONSUMER_RULES, CONSUMER_CHECKS, rs))
    total = dict.fromkeys(_STATUSES, 0)
    for title, rules, names, rs in sections:
        print(title)
        for cause in root_causes(rs) if rules is PRODUCER_RULES else []:
            print(f"  root cause: {cause}")
        for r in rs:
            print(f"  {r}")
            rule = rules.get(r.name)
            # A check whose child hung, crashed or exited says so; the rule's fix is not about that.
            if r.status == "fail" and rule and not _DEATH.search(r.detail):
                print(f"      rule: {rule[0]}")
                print(f"      fix:  {rule[1]}")
        counts = _tally(rs, names)
        print(f"  {_totals(counts)}")
        total = {s: total[s] + counts[s] for s in _STATUSES}
    print(f"\n{_totals(total)}")
    return total["fail"]


def _seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds above 0, got {text!r}")
    return value


def _dtype_list(text: str) -> tuple[str, ...]:
    import argparse

    try:
        return _checked_dtypes(d.strip() for d in text.split(",") if d.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e} (got {text!r})") from None


def _main(argv: list[str] | None = None) -> int:
    """The command line; returns the failure count (exits 2, with one line on stderr, where an
    option is wrong or a ``module:attr`` names nothing usable)."""
    import argparse

    class Once(argparse.Action):
        """An option given at most once: a second ``--producer`` would silently replace the first."""

        def __call__(self, parser, namespace, values, option_string=None):
            if getattr(namespace, self.dest, None) not in (None, self.default):
                parser.error(f"{option_string} is given twice: run one check per command")
            setattr(namespace, self.dest, values)

    parser = argparse.ArgumentParser(
        prog="python -m dlbridge.testing",
        description="DLPack conformance: without options, the matrix library x rule for every library installed "
        "here; with --producer / --consumer, the checks on your own library. The code under test runs in child "
        "interpreters: one that exits, crashes or hangs fails the check it was running, naming how. "
        "Exit status 3: a check failed; 2: a wrong option or a MODULE:NAME that names nothing usable.",
    )
    parser.add_argument("--markdown", action="store_true", help="print the matrix as a Markdown table")
    parser.add_argument("--producer", metavar="MODULE:FACTORY", action=Once,
                        help="check your producer: factory(shape, dtype) returns a new array (dtype: f32, i64, ...)")
    parser.add_argument("--read-only", metavar="MODULE:FACTORY", action=Once, help="with --producer: a factory of read-only arrays")
    parser.add_argument("--dtypes", metavar="LIST", type=_dtype_list, action=Once, help="with --producer: dtypes to export, comma-separated (default f32,f64,i32,i64,u8)")
    parser.add_argument("--consumer", metavar="MODULE:FUNCTION", action=Once, help="check your consumer: a from_dlpack taking any DLPack producer")
    parser.add_argument("--timeout", metavar="SECONDS", type=_seconds, default=DEFAULT_TIMEOUT,
                        help=f"how long each check (and importing your module) may run before it fails as hung "
                        f"(default {DEFAULT_TIMEOUT:g})")
    args = parser.parse_args(argv)
    if (args.read_only is not None or args.dtypes is not None) and args.producer is None:
        parser.error("--read-only and --dtypes go with --producer")
    if args.producer is not None or args.consumer is not None:
        if args.markdown:
            parser.error("--markdown is for the matrix, not for --producer / --consumer")
        try:
            return _yours(args)
        except SpecError as e:
            parser.exit(2, f"{parser.prog}: error: {_one_line(e)}\n")
    return _table(args.markdown, args.timeout)


if __name__ == "__main__":
    raise SystemExit(3 if _main() else 0)  # 3: checks failed (1 is Python's own error code)
