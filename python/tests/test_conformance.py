"""dlbridge.testing on every library installed here, as producer and as consumer, and on
deliberately broken producers and consumers; then the consumer paths of dlbridge itself."""

import array
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dlbridge
import dlbridge.testing as dt
from dlbridge import _capsules as caps

from conftest import ROOT

TORCH = {"f32": torch.float32, "f64": torch.float64, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}
def test_dlbridge_array_passes_every_producer_check():
    results = dt.check_producer(lambda shape, dtype: dlbridge.zeros(list(shape), dtype), make_read_only=dt._dlbridge_producer()["make_read_only"])
    assert [r.status for r in results] == ["pass"] * len(dt.CHECKS), results


def test_torch_deviations_are_recorded_as_known_failures():
    results = dt.check_producer(
        lambda shape, dtype: torch.zeros(shape, dtype=TORCH[dtype]),
        known_failures={"copy_true_copies_and_sets_is_copied": "torch copies on copy=True but leaves IS_COPIED unset"},
    )
    by_name = {r.name: r.status for r in results}
    assert by_name["copy_true_copies_and_sets_is_copied"] == "known failure"
    assert by_name["stream_on_cpu_must_be_none"] == "pass"  # AssertionError is a refusal: the standard names no type
    assert by_name["read_only_sets_the_flag"] == "skip"  # torch has no read-only tensors
    assert all(s == "pass" for n, s in by_name.items() if n not in ("copy_true_copies_and_sets_is_copied", "read_only_sets_the_flag", "read_only_is_never_a_legacy_capsule"))


def test_numpy_passes_every_producer_check():
    results = dt.check_producer(**dt._numpy_producer())
    bad = [r for r in results if r.status != "pass"]
    assert not bad, bad


def test_a_stale_known_failure_declaration_is_an_error():
    with pytest.raises(AssertionError, match="but passes: remove the declaration"):
        dt.check_producer(lambda s, d: dlbridge.zeros(list(s), d), known_failures={"exports_are_zero_copy": "not really"})
    with pytest.raises(AssertionError, match="but passes: remove the declaration"):
        dt.check_consumer(np.from_dlpack, known_failures={"zero_dim_tensor": "not really"})


class _Wraps:
    """A producer that forwards to another tensor's __dlpack__, changing one behaviour."""

    def __init__(self, shape, dtype):
        self.inner = dlbridge.zeros(list(shape), dtype)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        return self.inner.__dlpack__(**kwargs)


def test_a_broken_producer_fails_with_the_checks_named():
    class Copies(_Wraps):
        def __dlpack__(self, **kwargs):
            return dlbridge.zeros(list(self.inner.shape), self.inner.dtype).__dlpack__(**kwargs)  # a fresh buffer every time

    with pytest.raises(AssertionError, match="exports_are_zero_copy"):
        dt.check_producer(Copies)


def test_any_exception_refuses_a_cpu_stream():
    class Asserts(_Wraps):
        def __dlpack__(self, *, stream=None, **kwargs):
            assert stream is None  # torch does this
            return self.inner.__dlpack__(**kwargs)

    class Accepts(_Wraps):
        def __dlpack__(self, *, stream=None, **kwargs):
            return self.inner.__dlpack__(**kwargs)

    by_name = {r.name: r for r in dt.check_producer(Asserts, raise_on_failure=False)}
    assert by_name["stream_on_cpu_must_be_none"].status == "pass"
    assert "AssertionError" in by_name["stream_on_cpu_must_be_none"].detail
    by_name = {r.name: r for r in dt.check_producer(Accepts, raise_on_failure=False)}
    assert by_name["stream_on_cpu_must_be_none"].status == "fail"


def test_a_legacy_only_producer_is_told_legacy_capsules_cannot_carry_flags():
    class LegacyOnly(_Wraps):
        def __dlpack__(self, *, max_version=None, copy=None, **kwargs):
            inner = dlbridge.zeros(list(self.inner.shape), self.inner.dtype) if copy else self.inner
            return inner.__dlpack__(**kwargs)  # never versioned, like JAX

    by_name = {r.name: r for r in dt.check_producer(LegacyOnly, raise_on_failure=False, make_read_only=LegacyOnly)}
    assert by_name["versioned_capsule_when_asked"].status == "pass"  # a lower version is allowed
    assert "a legacy capsule cannot carry flags" in by_name["copy_true_copies_and_sets_is_copied"].detail
    assert "legacy capsule" in by_name["read_only_sets_the_flag"].detail


# ---- consumers -------------------------------------------------------------------------


def test_check_consumer_runs_every_case_on_numpy_in_a_child():
    results = dt.check_consumer("numpy:from_dlpack")
    assert [r.status for r in results] == ["pass"] * len(dt.CONSUMER_CHECKS), results
    assert dict((r.name, r.detail) for r in results)["asks_for_versioned_capsule"] == "max_version=(1, 0)"


def test_dlbridge_passes_every_consumer_check_in_process():
    results = dt.check_consumer(dlbridge.from_dlpack, isolate=False)
    assert [r.status for r in results] == ["pass"] * len(dt.CONSUMER_CHECKS), results


def test_a_consumer_that_crashes_the_process_is_a_failure_never_a_skip(monkeypatch, tmp_path):
    # A consumer that crashes the process on every tensor (as torch does on negative strides),
    # in a module of its own: each check's fresh child imports it and nothing else.
    (tmp_path / "aborting.py").write_text("import os\n\n\ndef consumer(x):\n    os.abort()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    results = dt.check_consumer("aborting:consumer", raise_on_failure=False, timeout=120)
    assert len(results) == len(dt.CONSUMER_CHECKS)
    assert all(r.status == "fail" for r in results), results
    assert all(r.detail == "the consumer crashed the process: killed by signal SIGABRT" for r in results), results


def test_a_consumer_that_cannot_be_imported_is_skipped_with_the_reason():
    results = dt.check_consumer("no_such_module_here:from_dlpack", raise_on_failure=False)
    assert all(r.status == "skip" and "ModuleNotFoundError" in r.detail for r in results), results


def test_a_lambda_needs_isolate_false():
    with pytest.raises(ValueError, match="not importable by name"):
        dt.check_consumer(lambda x: np.from_dlpack(x))


def test_broken_consumers_fail_the_rules_they_break():
    def ignores_read_only(x):  # reads through NumPy, then hands out a writable copy of the view
        a = np.from_dlpack(x)
        return np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape) if a.ndim else a.copy()

    by_name = {r.name: r for r in dt.check_consumer(ignores_read_only, isolate=False, raise_on_failure=False)}
    assert by_name["imports_with_zero_copy"].status == "fail"
    ro = by_name["honours_read_only"]
    assert ro.status == "pass" or "writable" in ro.detail

    def legacy_only(x):
        return np.from_dlpack(_LegacyOnlyView(x))

    by_name = {r.name: r for r in dt.check_consumer(legacy_only, isolate=False, raise_on_failure=False)}
    assert by_name["asks_for_versioned_capsule"].status == "fail"

    def never_deletes(x):  # takes the capsule and never calls the deleter
        cap = x.__dlpack__(max_version=(1, 3))
        import ctypes

        ctypes.pythonapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_void_p]
        ctypes.pythonapi.PyCapsule_SetName(cap, caps._static_name(b"used_dltensor_versioned"))
        return np.array([1, 2, 3], dtype=np.float32)

    by_name = {r.name: r for r in dt.check_consumer(never_deletes, isolate=False, raise_on_failure=False)}
    assert "the deleter ran 0 times (leaked)" in by_name["renames_the_capsule"].detail


class _LegacyOnlyView:
    def __init__(self, inner):
        self.inner = inner

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        return self.inner.__dlpack__(stream=None)


def test_hand_built_capsules_count_their_deleter():
    t = caps.ManagedTensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    a = dlbridge.from_dlpack(t.capsule())
    assert t.consumed and t.deleter_calls == 0
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]
    del a
    t.release()
    assert t.deleter_calls == 1
    u = caps.ManagedTensor.from_numpy(np.arange(3, dtype=np.float32), name=b"garbage")
    with pytest.raises(Exception):  # noqa: B017 - any clean refusal
        dlbridge.from_dlpack(u.capsule())
    assert not u.consumed and u.deleter_calls == 0
    u.release()  # the producer's side: nobody took it
    assert u.deleter_calls == 1


@pytest.mark.skipif(not importlib.util.find_spec("jax"), reason="jax not installed")
def test_pyarrow_cannot_import_a_jax_array():
    """The interop gap the matrix shows: pyarrow reads a legacy answer as versioned."""
    pa = pytest.importorskip("pyarrow")
    import jax.numpy as jnp

    with pytest.raises(ValueError, match="incorrect name"):
        pa.Tensor.from_dlpack(jnp.arange(4.0))
    # through dlbridge it works: dlbridge reads the legacy capsule, pyarrow the versioned one
    t = pa.Tensor.from_dlpack(dlbridge.from_dlpack(jnp.arange(4.0)))
    assert t.to_numpy().tolist() == [0, 1, 2, 3]


SOURCES = {
    "torch": lambda: torch.arange(6, dtype=torch.float32).reshape(2, 3),
    "numpy": lambda: np.arange(6, dtype=np.float32).reshape(2, 3),
    "dlbridge.Array": lambda: dlbridge.from_dlpack(torch.arange(6, dtype=torch.float32).reshape(2, 3)),
    "bytearray": lambda: memoryview(bytearray(np.arange(6, dtype=np.float32).tobytes())).cast("f", (2, 3)),
    "array.array": lambda: array.array("f", range(6)),
}


def _ptr(obj):
    if isinstance(obj, torch.Tensor):
        return obj.data_ptr()
    if isinstance(obj, np.ndarray):
        return obj.__array_interface__["data"][0]
    if isinstance(obj, dlbridge.Array):
        return obj.data_ptr
    return dlbridge.asarray(obj).data_ptr


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_consumer_paths_are_zero_copy_and_outlive_the_producer(source):
    obj = SOURCES[source]()
    a = dlbridge.asarray(obj) if source in ("bytearray", "array.array") else dlbridge.from_dlpack(obj)
    assert a.data_ptr == _ptr(obj)
    values = a.tolist()
    del obj
    assert a.tolist() == values
    out = dlbridge.get_kernel("copy")(a)
    assert out.tolist() == values


@pytest.mark.parametrize("shape", [(), (0,), (3, 0)])
def test_zero_dim_and_zero_size_tensors_cross_every_path(shape):
    for obj in (torch.zeros(shape), np.zeros(shape, dtype=np.float32), dlbridge.zeros(list(shape))):
        a = dlbridge.from_dlpack(obj)
        assert a.shape == shape
        assert dlbridge.get_kernel("relu")(obj).shape == shape


def test_negative_strides_from_numpy_are_read_correctly():
    rev = np.arange(5, dtype=np.float64)[::-1]
    a = dlbridge.from_dlpack(rev)
    assert a.strides == rev.strides == (-8,) and a.element_strides == (-1,) and a.tolist() == [4.0, 3.0, 2.0, 1.0, 0.0]
    assert dlbridge.get_kernel("copy")(rev).tolist() == [4.0, 3.0, 2.0, 1.0, 0.0]


def test_transposed_and_offset_views_keep_their_layout():
    t = torch.arange(20.0).reshape(4, 5)[1:, 1:].t()
    a = dlbridge.from_dlpack(t)
    assert a.element_strides == tuple(t.stride()) and a.tolist() == t.tolist()
    assert a.data_ptr == t.data_ptr()


def _testing(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dlbridge.testing", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_every_rule_says_where_it_is_written_and_how_to_follow_it():
    assert set(dt.PRODUCER_RULES) == set(dt.CHECKS)
    assert set(dt.CONSUMER_RULES) == set(dt.CONSUMER_CHECKS)
    for name, (source, fix) in {**dt.PRODUCER_RULES, **dt.CONSUMER_RULES}.items():
        assert source.startswith(("array API standard", "DLPack 1.3 header")), name
        assert fix and fix[0].islower() and not fix.endswith("."), name


def test_your_own_producer_from_the_command_line_with_a_report_that_teaches():
    fixture = ROOT / "examples" / "conformance"
    good = _testing("--producer", "boxed:make", "--read-only", "boxed:make_read_only", cwd=fixture)
    assert good.returncode == 0, good.stdout + good.stderr
    for rule in ("exports_are_zero_copy", "copy_false_is_zero_copy", "read_only_sets_the_flag", "read_only_is_never_a_legacy_capsule"):
        assert re.search(rf"^  {rule} +pass", good.stdout, re.M), good.stdout  # run, never skipped
    assert good.stdout.rstrip().endswith("0 failures")
    bad = _testing("--producer", "boxed:make_careless", cwd=fixture)
    assert bad.returncode == 3, bad.stdout + bad.stderr
    lines = bad.stdout.splitlines()
    assert lines[1].startswith("  root cause: __dlpack__ ignores its keywords"), bad.stdout
    # One line per broken rule, the dtypes folded into it, then its source and its fix.
    assert "  copy_true_copies_and_sets_is_copied           fail: copy=True returned the same memory (f32, f64, i32, i64, u8)" in lines
    assert bad.stdout.count("      fix:  ") == 3 and bad.stdout.rstrip().endswith("3 failures")
    # A consumer whose results offer __dlpack__ only: zero copy and READ_ONLY are read back through DLPack.
    ok = _testing("--consumer", "boxed:from_dlpack", cwd=fixture)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(r"^  imports_with_zero_copy +pass$", ok.stdout, re.M) and "honours_read_only                             pass" in ok.stdout
    copying = _testing("--consumer", "boxed:from_dlpack_copying", cwd=fixture)
    assert copying.returncode == 3, copying.stdout + copying.stderr
    assert "imports_with_zero_copy                        fail: copied the data" in copying.stdout
    assert "honours_read_only                             fail: imported a READ_ONLY tensor as a writable array" in copying.stdout
    assert "      fix:  make the imported array read-only when the flag is set (or refuse it)" in copying.stdout
    usage = _testing("--help", cwd=ROOT)
    assert usage.returncode == 0 and "--producer MODULE:FACTORY" in usage.stdout and "Exit status 3" in usage.stdout
    wrong = _testing("--dtypes", "f32", cwd=ROOT)
    assert wrong.returncode == 2 and "--read-only and --dtypes go with --producer" in wrong.stderr
    # No dtype at all would check nothing: every rule "passing" with the factory never called.
    for dtypes, says in ((",", "dtypes is empty"), (" ", "dtypes is empty"), ("f32,q99", "unknown dtypes 'q99'")):
        r = _testing("--producer", "boxed:make", "--dtypes", dtypes, cwd=fixture)
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 2 and "error: argument --dtypes: " in last and says in last, (dtypes, r.stdout, r.stderr)
    twice = _testing("--producer", "boxed:make_careless", "--producer", "boxed:make", cwd=fixture)
    assert twice.returncode == 2 and "--producer is given twice" in twice.stderr.strip().splitlines()[-1], twice.stderr
    for dtypes in ((), ("f32", "q99"), "f32"):
        with pytest.raises(ValueError, match="dtypes"):
            dt.check_producer("boxed:make", dtypes=dtypes)
