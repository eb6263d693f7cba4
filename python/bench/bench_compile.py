"""Fused kernels from source beside torch eager, in one interleaved run.

    .venv/bin/python python/bench/bench_compile.py            # ~1 minute
    .venv/bin/python python/bench/bench_compile.py --quick    # a smoke run (used by the tests)

Two expressions on 16M float32 elements (4M with --quick), each as one
`dlbridge.ElementwiseKernel` (one pass over memory) against the same
expression in torch eager (one pass per operator, with temporaries):

* `z = x * y + b`                       torch: `x * y + b`
* gelu, tanh approximation              torch: `0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3)))`
                                        and `torch.nn.functional.gelu(x, approximate="tanh")` (torch's own fused kernel)

Outputs are preallocated for both sides where torch allows (`out=`) so the
figures compare the work, not the allocator. Figures are medians over
interleaved rounds, in milliseconds; torch and dlbridge use the same number
of threads (torch.get_num_threads(), DLBRIDGE_NUM_THREADS). The first call's
time (generate + compile, with an empty cache directory) and a second
process's first call (the disk cache) are printed too.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

GELU_TANH = """
const T c = (T)0.7978845608028654;
T u = c * (x + (T)0.044715 * x * x * x);
y = (T)0.5 * x * ((T)1 + tanh(u));
"""


GELU_TORCH = "torch F.gelu(tanh) (torch kernel)"


def first_call_seconds(cache: str) -> tuple[float, float]:
    """Seconds for kernel construction + first call in a fresh process, and the
    same again in a second process that finds the library on disk."""
    script = (
        "import time, numpy as np, dlbridge\n"
        "t = time.perf_counter()\n"
        "k = dlbridge.ElementwiseKernel('T x, T y, T b', 'T z', 'z = x * y + b', 'bench_fma')\n"
        "k(np.ones(8, np.float32), np.ones(8, np.float32), np.ones(8, np.float32))\n"
        "print(time.perf_counter() - t)\n"
    )
    env = dict(os.environ, DLBRIDGE_CACHE_DIR=cache)
    times = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return times[0], times[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    n = (1 << 22) if args.quick else (1 << 24)
    rounds = 3 if args.quick else args.rounds
    threads = torch.get_num_threads()
    os.environ.setdefault("DLBRIDGE_NUM_THREADS", str(threads))

    with tempfile.TemporaryDirectory() as cache:
        cold, warm_process = first_call_seconds(cache)
        os.environ["DLBRIDGE_CACHE_DIR"] = cache
        import dlbridge  # after DLBRIDGE_CACHE_DIR: the cache directory is read once

        fma = dlbridge.ElementwiseKernel("T x, T y, T b", "T z", "z = x * y + b", "bench_fma")
        gelu = dlbridge.ElementwiseKernel("T x", "T y", GELU_TANH, "bench_gelu_tanh")
        g = torch.Generator().manual_seed(0)
        x, y, b = (torch.randn(n, generator=g) for _ in range(3))
        z = torch.empty(n)
        c = 0.7978845608028654

        def torch_fma():
            torch.add(torch.mul(x, y), b, out=z)

        def torch_gelu_eager():
            torch.mul(torch.mul(x, 0.5), torch.add(torch.tanh(torch.mul(torch.add(x, torch.mul(torch.pow(x, 3), 0.044715)), c)), 1), out=z)

        def torch_gelu_fused():
            z.copy_(torch.nn.functional.gelu(x, approximate="tanh"))

        cases = {
            "dlbridge fma (fused)": lambda: fma(x, y, b, z),
            "torch x * y + b (eager)": torch_fma,
            "dlbridge gelu-tanh (fused)": lambda: gelu(x, z),
            "torch gelu-tanh (eager ops)": torch_gelu_eager,
            "torch F.gelu(tanh) (torch kernel)": torch_gelu_fused,
        }
        # Correctness first: the fused kernels compute what torch computes.
        fma(x, y, b, z)
        torch.testing.assert_close(z, x * y + b)
        gelu(x, z)
        torch.testing.assert_close(z, torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-5, atol=1e-6)
        for f in cases.values():  # warm-up (and the specialisations' first use)
            f()
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(rounds):
            for name, f in cases.items():
                t = time.perf_counter()
                f()
                times[name].append((time.perf_counter() - t) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        cached = dlbridge._dlbridge.compile_stats()

    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {threads} threads, n = {n:,} f32, {rounds} rounds")
    print(f"first call (generate + compile, empty cache): {cold * 1e3:8.1f} ms")
    print(f"first call in a second process (disk cache):  {warm_process * 1e3:8.1f} ms")
    print(f"this process: {cached['compiled']} compiled, {cached['disk_hits']} found on disk")
    print()
    print(f"{'case':40s} {'median ms':>10s}")
    for k, v in med.items():
        print(f"{k:40s} {v:10.3f}")
    print()
    print("ratios (dlbridge / torch; below 1: the fused kernel is faster)")
    print(f"  x * y + b      vs torch eager        {med['dlbridge fma (fused)'] / med['torch x * y + b (eager)']:.2f}")
    print(f"  gelu-tanh      vs torch eager ops    {med['dlbridge gelu-tanh (fused)'] / med['torch gelu-tanh (eager ops)']:.2f}")
    print(f"  gelu-tanh      vs torch F.gelu       {med['dlbridge gelu-tanh (fused)'] / med[GELU_TORCH]:.2f}")


if __name__ == "__main__":
    main()
