"""dlbridge's CUDA paths beside torch (and CuPy, when it is importable) on the same GPU, in one
interleaved run.

    python3 python/bench/bench_cuda.py           # on a machine with an NVIDIA GPU and torch (CUDA)
    python3 python/bench/bench_cuda.py --quick   # fewer rounds

scripts/gpu-check.sh runs it after the GPU tests. Without a GPU it prints why and exits 0.

Device time per call, from CUDA events around each call (medians of interleaved
rounds, microseconds), on torch CUDA tensors, outputs preallocated on both sides
where torch allows (`out=`):

* row reductions over the last dim at 16M elements, row lengths 32 .. 262144
  (every launch shape: a warp a row, a block a row, split rows): softmax, sum
  and mean in f32, softmax and sum in bf16, against torch; sum of every element;
* elementwise maps, 16M f32: add, relu, gelu against torch, and add against a
  device-to-device copy of the same bytes (the bandwidth bound);
* kernels from source: `z = x * y + b` as one `dlbridge.ElementwiseKernel`
  against torch eager and CuPy's own `ElementwiseKernel` of the same text; an L2
  norm as a `dlbridge.ReductionKernel` along axis 1, axis 0 and to a scalar
  against `torch.linalg.vector_norm` and CuPy's `ReductionKernel`;
* matmul through cuBLAS (4096^3 f32) against torch's own;
* host time per call on 1-element tensors (the whole Python call, launch
  included): `add` against `torch.add`; `ElementwiseKernel`, `ReductionKernel`
  and `RawKernel` against CuPy's (on CuPy arrays, each library's own type).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
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


RAW_SOURCE = r"""
extern "C" __global__ void bench_raw_scale(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""


def sweep(k, rounds: int, reps: int) -> None:
    """The row reductions over the last dim at 16M elements, every row length class."""
    n = 1 << 24
    print("\nrow reductions over the last dim, 16M elements (device us; ratio dlbridge / torch)")
    print(f"  {'dtype':<5} {'rows x cols':>14}  {'softmax torch':>13} {'dlbridge':>9} {'ratio':>6}"
          f"  {'sum torch':>9} {'dlbridge':>9} {'ratio':>6}  {'mean torch':>10} {'dlbridge':>9} {'ratio':>6}")
    for dtype in (torch.float32, torch.bfloat16):
        for cols in (32, 128, 1024, 4096, 16384, 65536, 262144):
            rows = n // cols
            x = torch.randn(rows, cols, device="cuda").to(dtype)
            y, r = torch.empty_like(x), torch.empty(rows, device="cuda", dtype=dtype)
            fns = {
                "softmax torch": lambda: torch.softmax(x, -1),
                "softmax dlbridge": lambda: k["softmax"](x, out=y),
                "sum torch": lambda: torch.sum(x, -1, out=r),
                "sum dlbridge": lambda: k["sum"](x, out=r),
            }
            if dtype == torch.float32:
                fns |= {"mean torch": lambda: torch.mean(x, -1, out=r), "mean dlbridge": lambda: k["mean"](x, out=r)}
            t = device_us(fns, rounds, reps)
            cells = []
            for op in ("softmax", "sum", "mean"):
                if f"{op} torch" in t:
                    a, b = t[f"{op} torch"], t[f"{op} dlbridge"]
                    cells.append(f"{a:>{max(len(op) + 6, 9)}.1f} {b:9.1f} {b / a:6.2f}")
            name = "f32" if dtype == torch.float32 else "bf16"
            print(f"  {name:<5} {f'{rows} x {cols}':>14}  " + "  ".join(cells))
    x = torch.randn(n, device="cuda")
    s = torch.empty((), device="cuda")
    table(
        "sum of every element, 16M f32",
        device_us({"torch.sum": lambda: torch.sum(x, out=s), "dlbridge sum_all": lambda: k["sum_all"](x, out=s)}, rounds, reps),
        "torch.sum",
    )


def from_source(cp, rounds: int, reps: int) -> None:
    """Kernels from source against torch and CuPy's own kernels of the same text."""
    n = 1 << 24
    x, y, b = (torch.randn(n, device="cuda") for _ in range(3))
    o = torch.empty_like(x)
    text = ("T x, T y, T b", "T z", "z = x * y + b")
    fma = dlbridge.ElementwiseKernel(*text, "bench_cuda_fma")
    fns = {"torch eager x * y + b": lambda: torch.add(x * y, b, out=o), "dlbridge ElementwiseKernel": lambda: fma(x, y, b, o)}
    if cp is not None:
        cfma = cp.ElementwiseKernel(*text, "bench_cuda_fma")
        cx, cy, cb, co = (cp.from_dlpack(t) for t in (x, y, b, o))
        fns["CuPy ElementwiseKernel"] = lambda: cfma(cx, cy, cb, co)
    table("ElementwiseKernel z = x * y + b, 16M f32", device_us(fns, rounds, reps), "CuPy ElementwiseKernel" if cp else "torch eager x * y + b")
    gelu_t = dlbridge.ElementwiseKernel("T x", "T y", GELU_TANH, "bench_cuda_gelu_tanh")
    f = torch.nn.functional
    c = 0.7978845608028654
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
    l2_text = ("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0")
    l2 = dlbridge.ReductionKernel(*l2_text, "bench_cuda_l2norm")
    cl2 = cp.ReductionKernel(*l2_text, "bench_cuda_l2norm") if cp is not None else None
    m = torch.randn(4096, 4096, device="cuda")
    for axis, label in ((1, "along axis 1"), (0, "along axis 0"), (None, "to a scalar")):
        out = torch.empty(() if axis is None else 4096, device="cuda")
        dims = (0, 1) if axis is None else axis
        fns = {
            "torch.linalg.vector_norm": lambda: torch.linalg.vector_norm(m, dim=dims, out=out),
            "dlbridge ReductionKernel": lambda: l2(m, out, axis=axis),
        }
        if cl2 is not None:
            cm, cout = cp.from_dlpack(m), cp.from_dlpack(out)
            fns["CuPy ReductionKernel"] = lambda: cl2(cm, axis=axis, out=cout)
        table(f"ReductionKernel L2 norm {label}, 4096 x 4096 f32", device_us(fns, rounds, reps), "CuPy ReductionKernel" if cl2 else "torch.linalg.vector_norm")


def host_costs(k, cp, rounds: int, calls: int) -> None:
    """Host time per call on 1-element arrays, each library on its own arrays."""
    one, one_o = torch.ones(1, device="cuda"), torch.empty(1, device="cuda")
    table(
        "call overhead, host time per call, 1-element f32 torch tensors",
        host_us({"torch.add": lambda: torch.add(one, one, out=one_o), "dlbridge add": lambda: k["add"](one, one, out=one_o)}, rounds, calls),
        "torch.add",
    )
    if cp is None:
        print("\n(CuPy is not importable: no host-cost comparison with CuPy's kernels)")
        return
    x, o = cp.ones(1, dtype=cp.float32), cp.empty(1, dtype=cp.float32)
    text = ("T x, T y", "T z", "z = (x - y) * (x - y)")
    ours, theirs = dlbridge.ElementwiseKernel(*text, "bench_cuda_sqdiff"), cp.ElementwiseKernel(*text, "bench_cuda_sqdiff")
    red = ("T x", "T y", "x", "a + b", "y = a", "0")
    rours, rtheirs = dlbridge.ReductionKernel(*red, "bench_cuda_rsum"), cp.ReductionKernel(*red, "bench_cuda_rsum")
    raw_ours = dlbridge.cuda.RawKernel(RAW_SOURCE, "bench_raw_scale", "bench_raw_scale(x: f32[N]) -> (y: f32[N])")
    raw_theirs = cp.RawKernel(RAW_SOURCE, "bench_raw_scale")
    n1 = np.int64(1)
    table(
        "call overhead, host time per call, 1-element f32 CuPy arrays",
        host_us(
            {
                "CuPy ElementwiseKernel": lambda: theirs(x, x, o),
                "dlbridge ElementwiseKernel": lambda: ours(x, x, o),
                "CuPy ReductionKernel": lambda: rtheirs(x, axis=0, out=o[0]),
                "dlbridge ReductionKernel": lambda: rours(x, o[0], axis=0),
                "CuPy RawKernel": lambda: raw_theirs((1,), (128,), (x, o, n1)),
                "dlbridge RawKernel": lambda: raw_ours(x, out=o),
            },
            rounds,
            calls,
        ),
        "CuPy ElementwiseKernel",
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and dlbridge.cuda.is_available()):
        print(f"bench_cuda: skipped: no GPU (torch: {torch.cuda.is_available()}, dlbridge: {dlbridge.cuda.unavailable_reason()})")
        return 0
    try:
        import cupy as cp
    except ImportError:
        cp = None
    rounds, reps = (5, 5) if args.quick else (15, 20)
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, CuPy {cp.__version__ if cp else '-'}, dlbridge {dlbridge.__version__}")
    print(f"medians of {rounds} interleaved rounds of {reps} calls")
    k = {name: dlbridge.get_kernel(name) for name in ("add", "relu", "gelu", "softmax", "sum", "mean", "sum_all", "matmul")}
    sweep(k, rounds, reps)
    n = 1 << 24
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    o = torch.empty_like(x)
    f = torch.nn.functional
    t = device_us(
        {
            "copy (device to device, 2 x 64 MiB moved)": lambda: o.copy_(x),
            "torch.add": lambda: torch.add(x, y, out=o),
            "dlbridge add": lambda: k["add"](x, y, out=o),
            "torch.relu": lambda: torch.relu(x),
            "dlbridge relu": lambda: k["relu"](x, out=o),
            "torch F.gelu": lambda: f.gelu(x),
            "dlbridge gelu": lambda: k["gelu"](x, out=o),
        },
        rounds,
        reps,
    )
    print("\nelementwise maps, 16M f32 (device us)")
    for a, b in (("torch.add", "dlbridge add"), ("torch.relu", "dlbridge relu"), ("torch F.gelu", "dlbridge gelu")):
        print(f"  {b:<16} {t[b]:9.1f} us  {t[a]:9.1f} us {a:<14} {t[b] / t[a]:5.2f}x")
    copy = t["copy (device to device, 2 x 64 MiB moved)"]
    print(f"  device-to-device copy {copy:9.1f} us ({2 * 4 * n / copy / 1e3:.0f} GB/s); "
          f"add moves 1.5x its bytes: {t['dlbridge add'] / (1.5 * copy):.2f}x the copy's bandwidth time")
    from_source(cp, rounds, reps)
    m, mo = torch.randn(4096, 4096, device="cuda"), torch.empty(4096, 4096, device="cuda")
    m2 = torch.randn(4096, 4096, device="cuda")
    table(
        "matmul 4096^3 f32 (cuBLAS both)",
        device_us({"torch.mm": lambda: torch.mm(m, m2, out=mo), "dlbridge matmul": lambda: k["matmul"](m, m2, out=mo)}, rounds, max(1, reps // 4)),
        "torch.mm",
    )
    host_costs(k, cp, rounds, 200 if args.quick else 2000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
