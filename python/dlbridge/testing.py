"""Conformance checks any library can run on its own ``__dlpack__`` producer.

    import dlbridge.testing
    report = dlbridge.testing.check_producer(lambda shape, dtype: mylib.zeros(shape, dtype))

``make_tensor(shape, dtype)`` returns a fresh tensor of the given shape
(a tuple) and dtype (dlbridge's short names: ``"f32"``, ``"i64"``, ...) on
the CPU. Every check comes from the DLPack 1.3 header and the array API
standard's data-interchange rules (``__dlpack__``, ``__dlpack_device__``,
``from_dlpack``). A check that fails raises ``AssertionError`` listing every
failure, unless it is declared in ``known_failures={name: reason}``, in which
case it is reported as a known failure — and a declared failure that passes
is itself an error, so stale declarations get removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import from_dlpack
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


def _expect(cond: bool, detail: str) -> None:
    if not cond:
        raise _Fail(detail)


def _checks(make: Callable[[tuple, str], Any], dtype: str):
    def dlpack_device_is_a_cpu_pair():
        dev = make((2, 3), dtype).__dlpack_device__()
        _expect(isinstance(dev, tuple) and len(dev) == 2, f"__dlpack_device__() returned {dev!r}")
        _expect((int(dev[0]), int(dev[1])) == (1, 0), f"expected (kDLCPU=1, 0), got {dev!r}")

    def legacy_capsule_without_max_version():
        info = inspect_capsule(make((2, 3), dtype).__dlpack__())
        _expect(info["name"] == "dltensor", f"capsule named {info['name']!r}")

    def versioned_capsule_when_asked():
        info = inspect_capsule(make((2, 3), dtype).__dlpack__(max_version=(1, 3)))
        _expect(info["name"] in ("dltensor_versioned", "dltensor"), f"capsule named {info['name']!r}")
        if info["name"] == "dltensor_versioned":
            _expect(info["version"][0] == 1 and info["version"][1] <= 3, f"version {info['version']} for max_version (1, 3)")

    def shape_dtype_and_strides_describe_the_tensor():
        info = inspect_capsule(make((2, 3), dtype).__dlpack__(max_version=(1, 3)))
        _expect(info["shape"] == [2, 3], f"shape {info['shape']}")
        _expect(info["dtype"] == dtype, f"dtype {info['dtype']}, expected {dtype}")
        _expect(info["strides"] == [3, 1], f"strides {info['strides']} for a fresh contiguous tensor")

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
        make((2,), dtype).__dlpack__(stream=None)
        try:
            make((2,), dtype).__dlpack__(stream=5)
        except (ValueError, BufferError):
            return
        except Exception as e:  # noqa: BLE001 - the type is what is checked
            raise _Fail(f"stream=5 on a CPU tensor raised {type(e).__name__}, expected ValueError or BufferError") from None
        raise _Fail("stream=5 on a CPU tensor was accepted")

    def capsule_is_consumed_once():
        cap = make((3,), dtype).__dlpack__()
        from_dlpack(cap)
        try:
            from_dlpack(cap)
        except Exception:  # noqa: BLE001 - any clean exception is conforming
            return
        raise _Fail("a consumed capsule was imported twice")

    def consumer_sees_the_producers_memory():
        t = make((2, 3), dtype)
        expected = inspect_capsule(t.__dlpack__(max_version=(1, 3)))["data"]
        a = from_dlpack(t)
        _expect(a.data_ptr == expected, "from_dlpack copied")
        del t
        _expect(len(a.tolist()) == 2 if dtype != "bf16" else True, "data unreadable after the producer was dropped")

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
        capsule_is_consumed_once,
        consumer_sees_the_producers_memory,
    ]


CHECKS = [c.__name__ for c in _checks(lambda s, d: None, "f32")]


def check_producer(
    make_tensor: Callable[[tuple, str], Any],
    *,
    dtypes: tuple = ("f32", "f64", "i32", "i64", "u8"),
    known_failures: dict[str, str] | None = None,
    raise_on_failure: bool = True,
) -> list[Result]:
    """Runs every producer check for every dtype; see the module docs."""
    known = dict(known_failures or {})
    unknown = set(known) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks in known_failures: {sorted(unknown)}")
    results: list[Result] = []
    for name in CHECKS:
        failures = []
        for dtype in dtypes:
            check = next(c for c in _checks(make_tensor, dtype) if c.__name__ == name)
            try:
                check()
            except _Fail as e:
                failures.append(f"{dtype}: {e}")
            except Exception as e:  # noqa: BLE001 - an unexpected exception is a failure
                failures.append(f"{dtype}: {type(e).__name__}: {e}")
        if not failures and name in known:
            results.append(Result(name, "fail", f"declared a known failure ({known[name]}) but passes: remove the declaration"))
        elif failures and name in known:
            results.append(Result(name, "known failure", f"{known[name]} (saw: {failures[0]})"))
        elif failures:
            results.append(Result(name, "fail", "; ".join(failures)))
        else:
            results.append(Result(name, "pass"))
    bad = [r for r in results if r.status == "fail"]
    if bad and raise_on_failure:
        raise AssertionError("DLPack producer checks failed:\n" + "\n".join(str(r) for r in bad))
    return results


def _table() -> int:
    """Prints the producer checks for every library importable here; returns the failure count."""
    from . import zeros

    makers: dict[str, tuple[Callable, dict]] = {"dlbridge.Array (Python)": (lambda s, d: zeros(list(s), d), {})}
    try:
        import torch

        kinds = {"f32": torch.float32, "f64": torch.float64, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}
        makers["torch"] = (
            lambda s, d: torch.zeros(s, dtype=kinds[d]),
            {
                "copy_true_copies_and_sets_is_copied": "torch copies on copy=True but leaves IS_COPIED unset",
                "stream_on_cpu_must_be_none": "torch raises AssertionError for a stream on a CPU tensor",
            },
        )
    except ImportError:
        print("torch: skipped (not installed)")
    try:
        import numpy as np

        makers["numpy"] = (
            lambda s, d: np.zeros(s, dtype={"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "u8": np.uint8}[d]),
            {"stream_on_cpu_must_be_none": "numpy raises RuntimeError for a stream on a CPU array"},
        )
    except ImportError:
        print("numpy: skipped (not installed)")
    failures = 0
    for name, (make, known) in makers.items():
        print(name)
        for r in check_producer(make, known_failures=known, raise_on_failure=False):
            failures += r.status == "fail"
            print(f"  {r}")
    print(f"{len(makers)} producers x {len(CHECKS)} checks, {failures} failures")
    return failures


if __name__ == "__main__":
    raise SystemExit(3 if _table() else 0)  # 3: checks failed (1 is Python's own error code)
