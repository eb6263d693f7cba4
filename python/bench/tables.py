"""Regenerates the CPU tables of docs/performance.md: runs every benchmark and
pastes what it prints, with the command, the machine and the date.

    .venv/bin/python python/bench/tables.py                      # every table (about 5 minutes)
    .venv/bin/python python/bench/tables.py calls compile        # only these tables
    .venv/bin/python python/bench/tables.py --quick --out F.md   # smoke runs, written to F.md (the tests)

Each table lives between ``<!-- bench: NAME -->`` and ``<!-- end bench -->`` in
the page; everything between the two markers is replaced, nothing else is
touched. Run it on an otherwise idle machine: the figures are medians of
interleaved rounds, but two noisy cores are still two noisy cores.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "performance.md"
PY = ".venv/bin/python"
TCH_ENV = ". .venv/bin/activate && LIBTORCH_USE_PYTORCH=1"


@dataclass(frozen=True)
class Bench:
    """One table: the command a reader runs (from the repository root), and the
    command of its smoke run. A smoke run builds Rust code in the dev profile,
    which the test command has built already (a release build of each bench
    would add minutes to it), and times little: its figures are not to be read."""

    name: str
    command: str
    quick: str


CRITERION_QUICK = "--warm-up-time 0.05 --measurement-time 0.1 --sample-size 10"

BENCHES = [
    Bench("calls", f"{PY} python/bench/bench_calls.py", f"{PY} python/bench/bench_calls.py --quick"),
    Bench("rust-calls", "cargo bench -q -p dlbridge --bench call",
          f"cargo bench -q --profile dev -p dlbridge --bench call -- {CRITERION_QUICK}"),
    Bench("kernels", f"{PY} python/bench/compare_kernels.py 1",
          f"DLBRIDGE_BENCH_ROWS=64 {PY} python/bench/compare_kernels.py 1 relu --quick"),
    Bench("kernels-2", f"{PY} python/bench/compare_kernels.py 2 add",
          f"DLBRIDGE_BENCH_ROWS=64 {PY} python/bench/compare_kernels.py 2 add --quick"),
    Bench("compile", f"{PY} python/bench/bench_compile.py", f"{PY} python/bench/bench_compile.py --quick"),
    Bench("tc", f"{PY} python/bench/bench_tc.py", f"{PY} python/bench/bench_tc.py --quick"),
    Bench("mlp", f"{TCH_ENV} cargo run -q --release -p dlbridge-tch --example mlp -- 1",
          f"{TCH_ENV} cargo run -q -p dlbridge-tch --example mlp -- 1 3"),
    Bench("mlp-2", f"{TCH_ENV} cargo run -q --release -p dlbridge-tch --example mlp -- 2",
          f"{TCH_ENV} cargo run -q -p dlbridge-tch --example mlp -- 2 3"),
]

BEGIN = "<!-- bench: {} -->"
END = "<!-- end bench -->"


def machine() -> str:
    """The CPU (model, cores, caches) and the software the figures depend on."""
    info = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    model = info.get("Model name") or platform.processor() or platform.machine()
    flags = info.get("Flags", "").split()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else platform.machine()
    caches = ", ".join(f"{k.split()[0]} {info[k]}" for k in ("L2 cache", "L3 cache") if k in info)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parts = [f"{cpus} CPUs of an {model} ({isa})", caches, f"Python {platform.python_version()}"]
    try:
        import torch

        parts.append(f"torch {torch.__version__}")
    except ImportError:
        pass
    return "; ".join(p for p in parts if p)


def run(cmd: str, name: str) -> str:
    t0 = time.monotonic()
    r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"`{cmd}` failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    print(f"{name}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return r.stdout.rstrip("\n")


# Criterion's comparison with its previous run of the same bench: not part of a table.
CRITERION_NOISE = re.compile(
    r"^\s*(change:|Performance has|No change in performance|Change within noise|Found \d+ outliers|\d+ \(\d+\.\d+%\) (low|high) (mild|severe))")


def tidy(output: str) -> str:
    return "\n".join(line for line in output.splitlines() if not CRITERION_NOISE.match(line))


def section(name: str, cmd: str, output: str, quick: bool, where: str) -> str:
    today = datetime.date.today().isoformat()
    what = "a smoke run" if quick else "measured"
    return (
        f"{BEGIN.format(name)}\n"
        f"`{cmd}`, {what} on {today} ({where}):\n\n"
        f"```text\n{output}\n```\n"
        f"{END}"
    )


def replace(page: str, b: Bench, text: str) -> str:
    pattern = re.compile(re.escape(BEGIN.format(b.name)) + r".*?" + re.escape(END), re.S)
    if not pattern.search(page):
        sys.exit(f"{PAGE.relative_to(ROOT)} has no `{BEGIN.format(b.name)}` ... `{END}` section")
    return pattern.sub(lambda _: text, page, count=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"tables to regenerate (default: all of {[b.name for b in BENCHES]})")
    ap.add_argument("--quick", action="store_true", help="smoke runs (figures not to be read)")
    ap.add_argument("--out", type=Path, help="write the page here instead of over docs/performance.md")
    args = ap.parse_args()
    unknown = set(args.names) - {b.name for b in BENCHES}
    if unknown:
        ap.error(f"unknown tables {sorted(unknown)}; known: {[b.name for b in BENCHES]}")
    page = PAGE.read_text()
    where = machine()
    for b in BENCHES:
        if args.names and b.name not in args.names:
            continue
        cmd = b.quick if args.quick else b.command
        page = replace(page, b, section(b.name, cmd, tidy(run(cmd, b.name)), args.quick, where))
    (args.out or PAGE).write_text(page)


if __name__ == "__main__":
    main()
