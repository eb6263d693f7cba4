"""torch's medians for the cases of kernels/cpu/benches/kernels.rs, to compare with criterion's.

    .venv/bin/python python/bench/torch_kernels.py            # 1 and 2 threads
    .venv/bin/python python/bench/torch_kernels.py 1 gelu     # 1 thread, names containing "gelu"

Every case writes into a preallocated output (``out=``) laid out as torch's own
functional call lays out its result (``x.t() + x.t()`` is a transposed tensor),
as the criterion bench writes into the layout dlbridge's adapters allocate (the
same rule); the second column is the plain functional call, allocation
included. Layouts of the 4096x1024 operand are those of kernels/cpu/benches/kernels.rs:
contiguous, transposed (``.t()`` of a 1024x4096), into_contiguous (add, relu,
gelu, softmax: transposed operands, a given row-major output: a transpose), broadcast
(one row expanded; for add only
the second operand, a bias), sliced (``base[::2, 256:1280]`` of 8192x2048),
flipped (``base.flip(0, 1)`` -- torch has no negative strides, so this row
is a contiguous-input copy-free stand-in: torch's flip itself copies).
"""

import os
import sys

import torch

from dlbridge._bench import median_time

# The rows as kernels/cpu/benches/kernels.rs takes them (DLBRIDGE_BENCH_ROWS, for smoke runs).
R, C = int(os.environ.get("DLBRIDGE_BENCH_ROWS") or 4096), 1024


def median(f, repeat=11):
    """Seconds per call of f(): the median of ``repeat`` samples of about 20 ms."""
    return median_time(f, repeat=repeat)


def operand(layout, dtype):
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: (torch.rand(*s, generator=g) * 8 - 4).to(dtype)  # noqa: E731
    if layout == "contiguous":
        return rnd(R, C)
    if layout in ("transposed", "into_contiguous"):
        return rnd(C, R).t()
    if layout == "broadcast":
        return rnd(C).expand(R, C)
    if layout == "sliced":
        return rnd(2 * R, 2 * C)[::2, 256:1280]
    if layout == "flipped":
        return rnd(R, C)  # see the module docstring
    raise ValueError(layout)


def _out(functional, layout, dtype):
    """The output to write into: row-major for ``into_contiguous``, else laid
    out as torch's functional call lays out its own result."""
    if layout == "into_contiguous":
        return torch.empty(R, C, dtype=dtype)
    return torch.empty_like(functional(), memory_format=torch.preserve_format)


def cases(dtype):
    for layout in ["contiguous", "transposed", "into_contiguous", "broadcast", "sliced", "flipped"]:
        x = operand(layout, dtype)
        o = torch.empty(R, C, dtype=dtype)
        r = torch.empty(R, dtype=dtype)
        a = operand("contiguous", dtype) if layout == "broadcast" else x
        f = lambda a=a, x=x: torch.add(a, x)  # noqa: E731
        yield "add", layout, (lambda a=a, x=x, o=_out(f, layout, dtype): torch.add(a, x, out=o)), f
        f = lambda x=x: torch.relu(x)  # noqa: E731
        yield "relu", layout, (lambda x=x, o=_out(f, layout, dtype): torch.clamp_min(x, 0, out=o)), f
        f = lambda x=x: torch.nn.functional.gelu(x)  # noqa: E731
        yield "gelu", layout, (lambda x=x, o=_out(f, layout, dtype): torch._C._nn.gelu(x, out=o)), f
        f = lambda x=x: torch.softmax(x, -1)  # noqa: E731
        yield "softmax", layout, (lambda x=x, o=_out(f, layout, dtype): torch.ops.aten._softmax.out(x, -1, False, out=o)), f
        if layout == "into_contiguous":
            continue  # sum and mean have row-major outputs: the same as `transposed`
        yield "sum", layout, (lambda x=x, r=r: torch.sum(x, -1, out=r)), (lambda x=x: x.sum(-1))
        yield "mean", layout, (lambda x=x, r=r: torch.mean(x, -1, out=r)), (lambda x=x: x.mean(-1))


def fmt(s):
    return f"{s * 1e3:8.3f} ms"


def main():
    threads = [int(sys.argv[1])] if len(sys.argv) > 1 else [1, 2]
    pattern = sys.argv[2] if len(sys.argv) > 2 else ""
    print(f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}")
    for n in threads:
        torch.set_num_threads(n)
        print(f"\n{n} thread(s): median per call ({'out= contiguous':>15s}, {'functional':>11s})")
        rows = []
        for dtype, dname in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
            for name, layout, with_out, functional in cases(dtype):
                label = f"{name}/{dname}/{layout}"
                if pattern in label:
                    rows.append((label, median(with_out), median(functional)))
                    print(f"{label:28s} {fmt(rows[-1][1])} {fmt(rows[-1][2])}", flush=True)
        if pattern in "matmul/f32/1024":
            a, b = torch.rand(1024, 1024), torch.rand(1024, 1024)
            o = torch.empty(1024, 1024)
            print(f"{'matmul/f32/1024':28s} {fmt(median(lambda: torch.mm(a, b, out=o)))} {fmt(median(lambda: a.mm(b)))}")


if __name__ == "__main__":
    main()
