"""dlbridge's CUDA paths beside torch on the same GPU, in one interleaved run.

    python3 python/bench/bench_cuda.py           # on a machine with an NVIDIA GPU and torch (CUDA)
    python3 python/bench/bench_cuda.py --quick   # fewer rounds

scripts/gpu-check.sh runs it after the GPU tests. Without a GPU it prints why and exits 0.

Device time per call, from CUDA events around each call (medians of interleaved
rounds, microseconds), on torch CUDA tensors, outputs preallocated on both sides
where torch allows (`out=`):

* built-in kernels: add and gelu (16M f32), softmax and sum over the last dim
  (4096 x 4096 f32), matmul through cuBLAS (4096^3 f32) against torch's own;
* kernels from source: `z = x * y + b` and the tanh gelu as one
  `dlbridge.ElementwiseKernel` against torch eager (one kernel per operator) and
  torch's fused `F.gelu(approximate="tanh")`; an L2 norm along axis 1 as a
  `dlbridge.ReductionKernel` against `torch.linalg.vector_norm`;
* call overhead: host time per call on 1-element tensors (the whole Python call,
  launch included), dlbridge's `add` against `torch.add`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import dlbridge
import dlbridge.cuda

GELU_TANH = """
const T c = (T)0.7978845608028654;
T u = c * (x + (T)0.044715 * x * x * x);
y = (T)0.5 * x * ((T)1 + tanh(u));
"""


def device_us(fns: dict[str, object], rounds: int, reps: int) -> dict[str, float]:
    """Median device microseconds per call of each function, interleaved round by round."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():  # warm-up: compilation, pools, cuBLAS handles
        f()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, f in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                f()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1000 / reps)
    return {k: statistics.median(v) for k, v in times.items()}


def host_us(fns: dict[str, object], rounds: int, calls: int) -> dict[str, float]:
    """Median host microseconds per call (the Python call and its launch)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, f in fns.items():
            t = time.perf_counter()
            for _ in range(calls):
                f()
            times[name].append((time.perf_counter() - t) * 1e6 / calls)
            torch.cuda.synchronize()
    return {k: statistics.median(v) for k, v in times.items()}


def table(title: str, res: dict[str, float], base: str, unit: str = "us") -> None:
    print(f"\n{title}")
    for name, t in res.items():
        ratio = "" if name == base else f"  {t / res[base]:.2f}x of {base}"
        print(f"  {name:<44} {t:10.1f} {unit}{ratio}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and dlbridge.cuda.is_available()):
        print(f"bench_cuda: skipped: no GPU (torch: {torch.cuda.is_available()}, dlbridge: {dlbridge.cuda.unavailable_reason()})")
        return 0
    rounds, reps = (5, 5) if args.quick else (15, 20)
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, dlbridge {dlbridge.__version__}")
    print(f"medians of {rounds} interleaved rounds of {reps} calls")
    k = {name: dlbridge.get_kernel(name) for name in ("add", "gelu", "softmax", "sum", "matmul")}
    n = 1 << 24
    x, y, b = (torch.randn(n, device="cuda") for _ in range(3))
    o = torch.empty_like(x)
    table(
        "add, 16M f32 (out= given)",
        device_us({"torch.add": lambda: torch.add(x, y, out=o), "dlbridge add": lambda: k["add"](x, y, out=o)}, rounds, reps),
        "torch.add",
    )
    f = torch.nn.functional
    table(
        "gelu (erf), 16M f32",
        device_us({"torch F.gelu": lambda: f.gelu(x), "dlbridge gelu": lambda: k["gelu"](x, out=o)}, rounds, reps),
        "torch F.gelu",
    )
    m = torch.randn(4096, 4096, device="cuda")
    mo = torch.empty_like(m)
    table(
        "softmax over the last dim, 4096 x 4096 f32",
        # torch.softmax takes no out=: both allocate (torch's caching allocator for both).
        device_us({"torch.softmax": lambda: torch.softmax(m, -1), "dlbridge softmax": lambda: k["softmax"](m)}, rounds, reps),
        "torch.softmax",
    )
    so = torch.empty(4096, device="cuda")
    table(
        "sum over the last dim, 4096 x 4096 f32",
        device_us({"torch.sum": lambda: torch.sum(m, -1, out=so), "dlbridge sum": lambda: k["sum"](m, out=so)}, rounds, reps),
        "torch.sum",
    )
    a2, b2 = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    table(
        "matmul 4096^3 f32 (cuBLAS both)",
        device_us({"torch.mm": lambda: torch.mm(a2, b2, out=mo), "dlbridge matmul": lambda: k["matmul"](a2, b2, out=mo)}, rounds, max(1, reps // 4)),
        "torch.mm",
    )

    fma = dlbridge.ElementwiseKernel("T x, T y, T b", "T z", "z = x * y + b", "bench_cuda_fma")
    gelu_t = dlbridge.ElementwiseKernel("T x", "T y", GELU_TANH, "bench_cuda_gelu_tanh")
    c = 0.7978845608028654
    table(
        "ElementwiseKernel z = x * y + b, 16M f32",
        device_us({"torch eager x * y + b": lambda: torch.add(x * y, b, out=o), "dlbridge ElementwiseKernel": lambda: fma(x, y, b, o)}, rounds, reps),
        "torch eager x * y + b",
    )
    table(
        "ElementwiseKernel gelu (tanh), 16M f32",
        device_us(
            {
                "torch eager formula": lambda: 0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * x**3))),
                "torch F.gelu(tanh) (torch kernel)": lambda: f.gelu(x, approximate="tanh"),
                "dlbridge ElementwiseKernel": lambda: gelu_t(x, o),
            },
            rounds,
            reps,
        ),
        "torch eager formula",
    )
    l2 = dlbridge.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "bench_cuda_l2norm")
    table(
        "ReductionKernel L2 norm along axis 1, 4096 x 4096 f32",
        device_us({"torch.linalg.vector_norm": lambda: torch.linalg.vector_norm(m, dim=1, out=so), "dlbridge ReductionKernel": lambda: l2(m, so, axis=1)}, rounds, reps),
        "torch.linalg.vector_norm",
    )
    one, one_o = torch.ones(1, device="cuda"), torch.empty(1, device="cuda")
    calls = 200 if args.quick else 2000
    table(
        "call overhead, host time per call, 1-element f32",
        host_us({"torch.add": lambda: torch.add(one, one, out=one_o), "dlbridge add": lambda: k["add"](one, one, out=one_o)}, rounds, calls),
        "torch.add",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
