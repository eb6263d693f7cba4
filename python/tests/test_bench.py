"""The call-path benchmark runs (a smoke run: its figures are read by people, not asserted)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_calls_prints_every_pair_with_a_ratio():
    r = subprocess.run([sys.executable, str(ROOT / "python/bench/bench_calls.py"), "--quick"],
                       capture_output=True, text=True, timeout=300, check=True)
    lines = r.stdout.splitlines()
    assert "tvm-ffi 0." in lines[0], r.stdout  # the anchor is installed by ./dev.sh setup
    for what in ("no-op, 3 torch tensors", "no-op, 3 NumPy arrays", "no-op, 3 dlbridge.Arrays", "add(x, y, out=z)",
                 "add(x, y, z)", "add(x, y) (new torch tensor)"):
        row = next(line for line in lines if line.startswith(what))
        assert re.search(r" \d+ +\d+ +\d+\.\d\dx ", row), row  # dlbridge ns, anchor ns, ratio


def test_bench_compile_prints_compile_times_and_ratios_against_torch():
    r = subprocess.run([sys.executable, str(ROOT / "python/bench/bench_compile.py"), "--quick"],
                       capture_output=True, text=True, timeout=300, check=True)
    out = r.stdout
    assert re.search(r"first call \(generate \+ compile, empty cache\): +\d+\.\d ms", out), out
    assert re.search(r"first call in a second process \(disk cache\): +\d+\.\d ms", out), out
    for what in ("x * y + b      vs torch eager", "gelu-tanh      vs torch eager ops", "gelu-tanh      vs torch F.gelu"):
        row = next(line for line in out.splitlines() if line.strip().startswith(what))
        assert re.search(r"\d+\.\d\d$", row), row
