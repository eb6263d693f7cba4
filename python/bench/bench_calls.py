"""The call path, side by side with tvm-ffi and torch, in one interleaved run.

    .venv/bin/python python/bench/bench_calls.py            # ~1 minute
    .venv/bin/python python/bench/bench_calls.py --quick    # a smoke run (used by the tests)

Every case is timed in rounds that interleave all cases (so a noisy moment of
the machine hits them all alike); each figure is the median over the rounds of
the mean per call in a round, in nanoseconds, on 1-element float32 tensors,
with torch at one thread. Ratios are dlbridge / anchor (below 1: dlbridge is
faster). The operators of `dlbridge.torch.as_op` are timed against
`torch.library.custom_op` wrapping the same kernel. The no-op kernel is a C plugin (python/bench/nop.c, compiled here
with the system C compiler) taking three tensors, against tvm-ffi's
`testing.nop`; `add` is dlbridge's built-in against `torch.add`.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import dlbridge

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# (what, dlbridge case, anchor case, target ratio): the targets the call path is held to.
PAIRS = [
    ("no-op, 3 torch tensors", "dlbridge nop(torch)", "tvm-ffi nop(torch)", 0.8),
    ("no-op, 3 NumPy arrays", "dlbridge nop(numpy)", "tvm-ffi nop(numpy)", 1.0),
    ("no-op, 3 dlbridge.Arrays", "dlbridge nop(Array)", "tvm-ffi nop(Array)", None),
    ("add(x, y, out=z)", "dlbridge add(x, y, out=z)", "torch.add(x, y, out=z)", 0.5),
    ("add(x, y, z) (destination-passing)", "dlbridge add(x, y, z)", "torch.add(x, y, out=z)", 0.5),
    ("add(x, y) (new torch tensor)", "dlbridge add(x, y)", "torch.add(x, y)", 1.0),
    # Kernels as torch operators (dlbridge.torch.as_op) against
    # torch.library.custom_op wrapping the same kernel.
    ("op: no-op, 3 torch tensors", "dlbridge op nop(torch)", "custom_op nop(torch)", 0.4),
    ("op: add(x, y), with a backward", "dlbridge op add(x, y)", "custom_op add(x, y)", 0.4),
    ("op: no-op vs the plain kernel call", "dlbridge op nop(torch)", "dlbridge nop(torch)", None),
    ("op: add(x, y) vs the plain kernel", "dlbridge op add(x, y)", "dlbridge add(x, y)", None),
]

# Importing a dlbridge.Array elsewhere: through its C exchange API
# (`__dlpack_c_exchange_api__`) against the same Array seen through
# `__dlpack__` only (what every consumer got before the Array offered the API).
IMPORTS = [
    ("tvm_ffi.from_dlpack(Array)", "tvm-ffi from_dlpack(Array)", "tvm-ffi from_dlpack(Array via __dlpack__)"),
    ("tvm-ffi nop(3 Arrays)", "tvm-ffi nop(Array)", "tvm-ffi nop(Array via __dlpack__)"),
    ("torch.from_dlpack(Array)", "torch.from_dlpack(Array)", "torch.from_dlpack(Array via __dlpack__)"),
]


class DlpackOnly:
    """An Array seen through `__dlpack__` only (no C exchange API on its type)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, *args, **kwargs):
        return self.a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def build_nop(tmp):
    out = Path(tmp) / "libdlbridge_bench_nop.so"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-std=c11", "-I", str(ROOT / "include"),
                    str(HERE / "nop.c"), "-o", str(out)], check=True)
    return out


def custom_ops(nop, add):
    """The same kernels wrapped by torch.library.custom_op (add with a backward,
    as dlbridge's operator has one)."""

    @torch.library.custom_op("dlbridge_bench::nop", mutates_args=())
    def cnop(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
        nop(a, b, c)

    @torch.library.custom_op("dlbridge_bench::add", mutates_args=())
    def cadd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return add(a, b)

    cadd.register_fake(lambda a, b: torch.empty_like(a))
    cadd.register_autograd(lambda ctx, g: (g, g))
    return cnop, cadd


def cases(nop):
    import dlbridge.torch

    x, y, z = torch.ones(1), torch.ones(1), torch.empty(1)
    a, b, c = (np.ones(1, np.float32) for _ in range(3))
    p, q, r = (dlbridge.asarray(np.ones(1, np.float32)) for _ in range(3))
    add = dlbridge.get_kernel("add")
    nop_op, add_op = dlbridge.torch.as_op(nop), dlbridge.torch.as_op(add)
    cnop, cadd = custom_ops(nop, add)
    out = {
        "dlbridge op nop(torch)": lambda: nop_op(x, y, z),
        "custom_op nop(torch)": lambda: cnop(x, y, z),
        "dlbridge op add(x, y)": lambda: add_op(x, y),
        "custom_op add(x, y)": lambda: cadd(x, y),
        "dlbridge nop(torch)": lambda: nop(x, y, z),
        "dlbridge nop(numpy)": lambda: nop(a, b, c),
        "dlbridge nop(Array)": lambda: nop(p, q, r),
        "dlbridge add(x, y, out=z)": lambda: add(x, y, out=z),
        "dlbridge add(x, y, z)": lambda: add(x, y, z),
        "dlbridge add(x, y)": lambda: add(x, y),
        "torch.add(x, y, out=z)": lambda: torch.add(x, y, out=z),
        "torch.add(x, y)": lambda: torch.add(x, y),
        "torch.from_dlpack(Array)": lambda: torch.from_dlpack(p),
        "torch.from_dlpack(Array via __dlpack__)": lambda: torch.from_dlpack(po),
    }
    po, qo, ro = DlpackOnly(p), DlpackOnly(q), DlpackOnly(r)
    try:
        import tvm_ffi
    except ImportError:  # reported as missing in the table
        return out
    tnop = tvm_ffi.get_global_func("testing.nop")
    out["tvm-ffi nop(torch)"] = lambda: tnop(x, y, z)
    out["tvm-ffi nop(numpy)"] = lambda: tnop(a, b, c)
    out["tvm-ffi nop(Array)"] = lambda: tnop(p, q, r)
    out["tvm-ffi nop(Array via __dlpack__)"] = lambda: tnop(po, qo, ro)
    out["tvm-ffi from_dlpack(Array)"] = lambda: tvm_ffi.from_dlpack(p)
    out["tvm-ffi from_dlpack(Array via __dlpack__)"] = lambda: tvm_ffi.from_dlpack(po)
    return out


def measure(funcs, rounds, per_round):
    samples = {k: [] for k in funcs}
    for f in funcs.values():  # warm up: first-call caches, allocators
        for _ in range(1000):
            f()
    for _ in range(rounds):
        for k, f in funcs.items():
            t0 = time.perf_counter_ns()
            for _ in range(per_round):
                f()
            samples[k].append((time.perf_counter_ns() - t0) / per_round)
    return {k: statistics.median(v) for k, v in samples.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few rounds only (a smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dlbridge.load_plugin(build_nop(tmp))
        nop = dlbridge.get_kernel("nop")
        funcs = cases(nop)
        for f in funcs.values():  # every case runs and returns before it is timed
            f()
        rounds, per_round = (3, 200) if args.quick else (15, 20000)
        med = measure(funcs, rounds, per_round)

    try:
        import tvm_ffi
        tvm = f"tvm-ffi {tvm_ffi.__version__}"
    except ImportError:
        tvm = "tvm-ffi not installed (pip install apache-tvm-ffi)"
    print(f"dlbridge {dlbridge.__version__}, torch {torch.__version__} (1 thread), numpy {np.__version__}, {tvm}")
    print(f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
          f"medians of {rounds} interleaved rounds x {per_round} calls, ns per call\n")
    print(f"{'call':36s} {'dlbridge':>9s} {'anchor':>9s} {'ratio':>7s} {'target':>7s}  anchor")
    for what, mine, anchor, target in PAIRS:
        m, a = med.get(mine), med.get(anchor)
        if m is None or a is None:
            print(f"{what:36s} {'-':>9s} {'-':>9s} {'-':>7s} {'':>7s}  {anchor} (missing)")
            continue
        ratio = m / a
        verdict = "" if target is None else (f"<={target:.1f} " + ("met" if ratio <= target else "NOT met"))
        print(f"{what:36s} {m:9.0f} {a:9.0f} {ratio:6.2f}x {verdict:>7s}  {anchor}")
    print(f"\n{'importing a dlbridge.Array':36s} {'C API':>9s} {'dlpack':>9s} {'ratio':>7s}")
    for what, fast, slow in IMPORTS:
        m, a = med.get(fast), med.get(slow)
        if m is None or a is None:
            print(f"{what:36s} {'-':>9s} {'-':>9s} {'-':>7s}  (missing)")
            continue
        print(f"{what:36s} {m:9.0f} {a:9.0f} {m / a:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
