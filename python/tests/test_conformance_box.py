"""The conformance checks run the code they check in child interpreters: a factory or a
consumer that exits, crashes or hangs fails the check it was running, naming how; what the
code prints cannot pass for a result; a ``MODULE:NAME`` that names nothing usable is one line
of error; and every report adds up."""

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

import dlbridge.testing as dt

from conftest import ROOT

LIBRARY = textwrap.dedent('''
    """Factories and consumers with the bugs the checks must survive."""
    import ctypes
    import json
    import os
    import sys
    import time

    import numpy as np

    NUMPY = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "u8": np.uint8}


    def make(shape, dtype):
        return np.zeros(shape, NUMPY[dtype])


    def exits(shape, dtype):
        sys.exit(0)


    def hangs(shape, dtype):
        time.sleep(600)


    def segfaults(shape, dtype):
        ctypes.string_at(0)


    _armed = []


    def _arm(hook):
        if not _armed:
            _armed.append(hook())


    def crashes_at_exit(shape, dtype):
        import atexit
        _arm(lambda: atexit.register(lambda: ctypes.string_at(0)))
        return make(shape, dtype)


    def exits_3_at_exit(shape, dtype):
        import atexit
        _arm(lambda: atexit.register(lambda: os._exit(3)))
        return make(shape, dtype)


    def leaves_a_thread_running(shape, dtype):
        import threading
        _arm(lambda: threading.Thread(target=time.sleep, args=(600,)).start())
        return make(shape, dtype)


    def exits_on_a_larger_array(shape, dtype):
        if shape == (4, 6):  # the base of the views check only
            os._exit(0)
        return make(shape, dtype)


    def _lookalikes():
        """What the checker's messages look like, or used to: JSON lines of every kind."""
        return [
            json.dumps({"unavailable": "x"}),
            json.dumps({"start": "zero_dim_tensor"}),
            json.dumps({"name": "imports_with_zero_copy", "status": "skip", "detail": "forged"}),
            json.dumps({"pid": os.getpid(), "result": "imports_with_zero_copy", "outcomes": [["pass", "forged"]]}),
            json.dumps({"pid": os.getpid(), "unusable": "forged"}),
            json.dumps({"pid": os.getpid(), "done": True}),
        ]


    def _chatter():
        for line in _lookalikes():
            print(line, flush=True)
            print(line, file=sys.stderr, flush=True)


    def chatty_from_dlpack(x):
        _chatter()
        return np.from_dlpack(x)


    def chatty_copying(x):
        _chatter()
        return np.array(np.from_dlpack(x))


    def writes_read_only_then_refuses(x):
        """Writes into the first element of a READ_ONLY tensor, then refuses it."""
        api = ctypes.pythonapi
        api.PyCapsule_GetName.restype, api.PyCapsule_GetName.argtypes = ctypes.c_char_p, [ctypes.py_object]
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        cap = x.__dlpack__(max_version=(1, 0))
        name = api.PyCapsule_GetName(cap)
        if name == b"dltensor_versioned":
            p = api.PyCapsule_GetPointer(cap, name)
            # DLManagedTensorVersioned: version (8), manager_ctx (8), deleter (8), flags (8), dl_tensor.data
            if ctypes.c_uint64.from_address(p + 24).value & 1:
                ctypes.c_float.from_address(ctypes.c_void_p.from_address(p + 32).value).value = -999.0
                raise ValueError("cannot import read-only data")
        return np.from_dlpack(x)


    not_callable = 42
''')

FAST = "2"  # seconds a check may take in these tests


@pytest.fixture()
def badlib(tmp_path, monkeypatch):
    (tmp_path / "badlib.py").write_text(LIBRARY)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path


def _testing(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dlbridge.testing", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _rule(stdout: str, name: str) -> str:
    line = next((ln for ln in stdout.splitlines() if ln.startswith(f"  {name} ")), None)
    assert line is not None, stdout
    return " ".join(line.split())


def test_a_factory_that_exits_with_status_0_fails_every_check_naming_the_exit(badlib):
    r = _testing("--producer", "badlib:exits", "--timeout", FAST, cwd=badlib)
    assert r.returncode == 3, r.stdout + r.stderr
    for name in dt.CHECKS:
        assert _rule(r.stdout, name) == f"{name} fail: the factory exited with status 0 before reporting", r.stdout
    assert r.stdout.rstrip().endswith("16 rules: 0 passed, 0 skipped, 16 failures"), r.stdout
    assert "fix:" not in r.stdout, r.stdout


def test_a_hanging_factory_fails_naming_the_timeout_and_the_run_ends_soon(badlib):
    start = time.monotonic()
    r = _testing("--producer", "badlib:hangs", "--timeout", "1", cwd=badlib)
    took = time.monotonic() - start
    assert r.returncode == 3, r.stdout + r.stderr
    assert _rule(r.stdout, "exports_are_zero_copy") == "exports_are_zero_copy fail: the factory did not finish within 1 s"
    assert r.stdout.rstrip().endswith("16 failures"), r.stdout
    # The rules' fixes are about a producer that answers, not one that hangs: none is given.
    assert "fix:" not in r.stdout, r.stdout
    assert took < 25, f"took {took:.1f} s"


def test_a_factory_that_segfaults_fails_naming_the_signal(badlib):
    r = _testing("--producer", "badlib:segfaults", "--timeout", FAST, cwd=badlib)
    assert r.returncode == 3, r.stdout + r.stderr
    assert _rule(r.stdout, "dlpack_device_is_a_cpu_pair") == (
        "dlpack_device_is_a_cpu_pair fail: the factory crashed the process: killed by signal SIGSEGV")
    assert r.stdout.rstrip().endswith("16 failures"), r.stdout


@pytest.mark.parametrize(
    "factory, says",
    [
        ("crashes_at_exit", "the code under test crashed the process at exit: killed by signal SIGSEGV"),
        ("exits_3_at_exit", "the code under test made the process exit with status 3 at exit"),
        ("leaves_a_thread_running", "the code under test kept the process from ending: it did not end within 2 s"),
    ],
)
def test_code_that_crashes_exits_or_hangs_after_the_last_check_fails_naming_how(badlib, factory, says):
    r = _testing("--producer", f"badlib:{factory}", "--dtypes", "f32", "--timeout", FAST, cwd=badlib)
    assert r.returncode == 3, r.stdout + r.stderr
    last = _rule(r.stdout, dt.CHECKS[-1])
    assert f"after this check, {says}" in last, r.stdout
    assert r.stdout.rstrip().endswith(", 1 failures"), r.stdout
    assert "fix:" not in r.stdout, r.stdout


def test_a_factory_that_exits_in_one_check_fails_that_check_and_the_rest_still_run(badlib):
    r = _testing("--producer", "badlib:exits_on_a_larger_array", "--timeout", FAST, cwd=badlib)
    assert r.returncode == 3, r.stdout + r.stderr
    assert _rule(r.stdout, "views_export_their_layout") == (
        "views_export_their_layout fail: the producer exited with status 0 before reporting")
    assert _rule(r.stdout, "capsule_is_consumed_once") == "capsule_is_consumed_once pass"  # run after it, in a new child
    assert r.stdout.rstrip().endswith("16 rules: 13 passed, 2 skipped, 1 failures"), r.stdout


def test_a_consumer_printing_lookalikes_of_the_checkers_messages_gets_its_real_results(badlib):
    good = _testing("--consumer", "badlib:chatty_from_dlpack", "--timeout", "30", cwd=badlib)
    assert good.returncode == 0, good.stdout + good.stderr
    assert _rule(good.stdout, "asks_for_versioned_capsule") == "asks_for_versioned_capsule pass: max_version=(1, 0)"
    assert "forged" not in good.stdout and "unavailable" not in good.stdout
    assert good.stdout.rstrip().endswith("18 rules: 18 passed, 0 skipped, 0 failures"), good.stdout
    copying = _testing("--consumer", "badlib:chatty_copying", "--timeout", "30", cwd=badlib)
    assert copying.returncode == 3, copying.stdout + copying.stderr
    assert _rule(copying.stdout, "imports_with_zero_copy") == "imports_with_zero_copy fail: copied the data"
    assert "forged" not in copying.stdout


def test_check_consumer_ignores_lookalikes_of_its_messages_too(badlib):
    results = dt.check_consumer("badlib:chatty_copying", raise_on_failure=False, timeout=30)
    by_name = {r.name: r for r in results}
    assert by_name["imports_with_zero_copy"].status == "fail" and by_name["zero_dim_tensor"].status == "pass", results


@pytest.mark.parametrize("args, says", [
    (["--producer", "badlib"], "--producer badlib: no colon: expected MODULE:NAME"),
    (["--producer", ":make"], "--producer :make: no module before the colon"),
    (["--producer", "badlib:"], "--producer badlib:: no name after the colon"),
    (["--producer", "no_such_module_here:make"],
     "--producer no_such_module_here:make: cannot import no_such_module_here: ModuleNotFoundError"),
    (["--producer", "badlib:nothing"], "--producer badlib:nothing: badlib has no attribute nothing"),
    (["--producer", "badlib:not_callable"], "--producer badlib:not_callable: not_callable is a int, not callable"),
    (["--producer", "badlib:make", "--read-only", "badlib:nothing"], "--read-only badlib:nothing: badlib has no attribute"),
    (["--consumer", "badlib:make.nothing"], "--consumer badlib:make.nothing: badlib has no attribute make.nothing"),
    (["--consumer", "badlib:1x"], "--consumer badlib:1x: '1x' is not a name"),
])
def test_a_module_name_that_names_nothing_usable_is_a_one_line_error(badlib, args, says):
    r = _testing(*args, cwd=badlib)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "", r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m dlbridge.testing: error: {says}"), r.stderr


def test_a_module_whose_import_exits_is_an_error_naming_the_exit(badlib):
    (badlib / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    r = _testing("--producer", "exits_on_import:make", "--timeout", FAST, cwd=badlib)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == ("python -m dlbridge.testing: error: --producer exits_on_import:make: "
                                "importing exits_on_import exited with status 0 before reporting"), r.stderr


def test_a_timeout_of_no_seconds_is_refused():
    r = _testing("--producer", "badlib:make", "--timeout", "0", cwd=ROOT)
    assert r.returncode == 2 and "--timeout: expected a finite number of seconds above 0, got '0'" in r.stderr, r.stderr


def _sections(stdout: str) -> list[tuple[int, dict[str, int]]]:
    """Every ``N rules: ...`` line of a report: its indent and its counts."""
    out = []
    for line in stdout.splitlines():
        m = re.fullmatch(r"( *)(\d+) rules: (\d+) passed(?:, (\d+) known failures)?, (\d+) skipped, (\d+) failures", line)
        if m:
            total, passed, known, skipped, failed = (int(g or 0) for g in m.groups()[1:])
            out.append((len(m.group(1)), {"total": total, "pass": passed, "known": known, "skip": skipped, "fail": failed}))
    return out


def test_every_section_and_the_whole_report_add_up(badlib):
    r = _testing("--producer", "badlib:exits_on_a_larger_array", "--consumer", "badlib:chatty_copying", "--timeout", "30",
                 cwd=badlib)
    assert r.returncode == 3, r.stdout + r.stderr
    sections = _sections(r.stdout)
    assert [indent for indent, _ in sections] == [2, 2, 0], r.stdout
    (_, producer), (_, consumer), (_, whole) = sections
    for counts in (producer, consumer, whole):
        assert counts["pass"] + counts["known"] + counts["skip"] + counts["fail"] == counts["total"], r.stdout
    assert producer["total"] == len(dt.CHECKS) and consumer["total"] == len(dt.CONSUMER_CHECKS)
    for key in whole:
        assert whole[key] == producer[key] + consumer[key], r.stdout
    statuses = re.findall(r"^  \w+ +(pass|fail|skip|known failure)\b", r.stdout, re.M)
    assert statuses.count("fail") == whole["fail"] and len(statuses) == whole["total"], r.stdout


def test_a_report_that_does_not_add_up_is_refused():
    results = [dt.Result(n, "pass") for n in dt.CHECKS]
    assert dt._tally(results, dt.CHECKS)["pass"] == len(dt.CHECKS)
    with pytest.raises(RuntimeError, match="does not add up"):
        dt._tally(results[1:], dt.CHECKS)
    with pytest.raises(RuntimeError, match="does not add up"):
        dt._tally(results + results[:1], dt.CHECKS)
    with pytest.raises(RuntimeError, match="does not add up"):
        dt._tally(results[1:] + [dt.Result(dt.CHECKS[0], "maybe")], dt.CHECKS)


def test_check_producer_runs_a_factory_named_by_module_in_a_child(badlib):
    results = dt.check_producer("badlib:exits", raise_on_failure=False, timeout=float(FAST))
    assert {(r.status, r.detail) for r in results} == {("fail", "the factory exited with status 0 before reporting")}
    assert all(r.status in ("pass", "skip") for r in dt.check_producer("badlib:make", raise_on_failure=False))
    with pytest.raises(ValueError, match="not importable by name"):
        dt.check_producer(lambda s, d: None, isolate=True)
    with pytest.raises(dt.SpecError, match="badlib has no attribute nothing"):
        dt.check_producer("badlib:nothing")


def test_a_consumer_that_writes_into_read_only_memory_and_then_refuses_fails_the_rule(badlib):
    r = _testing("--consumer", "badlib:writes_read_only_then_refuses", "--timeout", "20", cwd=badlib)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "honours_read_only fail: wrote into a READ_ONLY tensor's memory: it holds [-999.0, 2.0, 3.0]" in _rule(
        r.stdout, "honours_read_only"), r.stdout
