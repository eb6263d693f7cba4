"""dlbridge's main job: registry kernels wrapped for PyTorch, run on torch tensors.

Each kernel is wrapped with ``dlbridge.to_pytorch_func`` (TVM's name and
meaning), called on torch tensors (zero copy in, outputs allocated by torch),
checked against torch's own result, and timed beside torch.

    ./dev.sh demo                                   # what a newcomer runs
    .venv/bin/python examples/pytorch_demo.py --quick   # every check, one sample per timing

Each output is checked where the kernels' documented rule puts it
(docs/kernels.md, "Where outputs live"): an output shaped like its inputs
follows their memory order, other outputs are row-major. The rule is
derived independently by the torch operators' fake implementation
(``dlbridge.torch.fake_of``), which the demo asks for the expected strides.
"""

import argparse
import os

import numpy as np
import torch

import dlbridge
import dlbridge.torch
from dlbridge import _bench

# --quick: one sample of one call per timing (the test command runs the demo so).
QUICK = False


def median_time(f, number=None):
    """Seconds per call of f(): the median of 7 samples (--quick: one sample of one
    call), without a warm-up call (the checks have run each kernel already)."""
    if QUICK:
        return _bench.median_time(f, 1, 1, warm_up=False)
    return _bench.median_time(f, number, repeat=7, warm_up=False)


def kernel_threads():
    """The thread count dlbridge's kernels use (its own setting where the
    package offers one, else the environment, else every core)."""
    get = getattr(dlbridge, "get_num_threads", None)
    if get is not None:
        return get()
    env = os.environ.get("DLBRIDGE_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def fmt(seconds):
    return f"{seconds * 1e6:9.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:9.2f} ms"


def layouts(dtype):
    """(name, x, a) for each layout of a 4096x1024 operand x; `a` is add's first
    operand: x itself, or for `broadcast` (x a bias row expanded to 4096 rows,
    stride 0) a contiguous matrix."""
    g = torch.Generator().manual_seed(1)
    contiguous = torch.randn(4096, 1024, generator=g).to(dtype)
    transposed = torch.randn(1024, 4096, generator=g).to(dtype).t()  # strides (1, 4096)
    bias = torch.randn(1024, generator=g).to(dtype).expand(4096, 1024)  # strides (0, 1)
    sliced = torch.randn(8192, 2048, generator=g).to(dtype)[::2, 256:1280]  # strides (4096, 1)
    return [
        ("contiguous", contiguous, contiguous),
        ("transposed", transposed, transposed),
        ("broadcast", bias, contiguous),
        ("sliced", sliced, sliced),
    ]


def main():
    global QUICK
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="every check, but one sample per timing")
    QUICK = ap.parse_args().quick
    torch.manual_seed(0)
    print(f"dlbridge {dlbridge.__version__}, torch {torch.__version__}, {torch.get_num_threads()} torch threads")
    print(f"{len(dlbridge.list_kernels())} kernels registered\n")

    # The TVM seed example, with dlbridge in place of tvm.
    f = dlbridge.get_kernel("matmul")
    f_pytorch = dlbridge.to_pytorch_func(f)
    x = torch.rand(56, 56)
    y = torch.rand(56, 56)
    z = torch.empty(56, 56)
    f_pytorch(x, y, z)
    np.testing.assert_allclose(z.numpy(), x.mm(y).numpy(), rtol=1e-5)
    print("TVM seed example: 56x56 matmul written into torch.empty(56, 56) matches x.mm(y)\n")

    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    big = torch.randn(1 << 24)
    cases = [
        ("matmul 1024x1024", "matmul", (a, b), lambda: a.mm(b), 1e-4),
        ("matmul on a transposed view", "matmul", (a.t(), b), lambda: a.t().mm(b), 1e-4),
        ("add 16M", "add", (big, big), lambda: torch.add(big, big), 0),
    ]
    # The elementwise and last-dim kernels on every layout of a 4096x1024
    # operand, in f32 and bf16 (benches/kernels.rs measures the same cases; its
    # torch_kernels.py prints torch's side at 1 and 2 threads).
    for dtype, dname, tol in [(torch.float32, "f32", 1e-6), (torch.bfloat16, "bf16", 1e-2)]:
        for layout, x, a2 in layouts(dtype):
            tag = f"{dname} {layout}"
            cases += [
                (f"add {tag}", "add", (a2, x), lambda a2=a2, x=x: torch.add(a2, x), tol),
                (f"relu {tag}", "relu", (x,), lambda x=x: torch.relu(x), 0),
                (f"gelu {tag}", "gelu", (x,), lambda x=x: torch.nn.functional.gelu(x), tol),
                (f"softmax {tag}", "softmax", (x,), lambda x=x: torch.softmax(x, dim=-1), tol),
                (f"sum last dim {tag}", "sum", (x,), lambda x=x: x.sum(-1), 10 * tol),
                (f"mean last dim {tag}", "mean", (x,), lambda x=x: x.mean(-1), 10 * tol),
            ]
    # Both sides at the same thread count: torch follows dlbridge's (its setting,
    # or DLBRIDGE_NUM_THREADS, else every core).
    ours_n = kernel_threads()
    torch_n = torch.get_num_threads()
    torch.set_num_threads(ours_n)
    print(f"kernel timings at {ours_n} thread(s) on both sides; 'vs contiguous': dlbridge on this layout / on the contiguous one")
    print(f"{'kernel':34s} {'dlbridge':>12s} {'torch':>12s} {'ratio':>7s} {'vs contiguous':>14s}  max |error|")
    contiguous = {}
    for label, name, args, reference, tol in cases:
        k = dlbridge.to_pytorch_func(dlbridge.get_kernel(name))
        got = k(*args)
        want = reference()
        assert isinstance(got, torch.Tensor), type(got)
        assert got.dtype == want.dtype and got.shape == want.shape, (label, got.dtype, got.shape)
        # Laid out where the documented rule puts it (an elementwise or softmax output
        # follows its operands' memory order; torch's own softmax is always row-major).
        laid_out = dlbridge.torch.fake_of(name)(*args).stride()
        assert got.stride() == laid_out, (label, got.stride(), laid_out)
        err = (got.float() - want.float()).abs().max().item()
        scale = want.float().abs().max().item() or 1.0
        assert err <= tol * max(1.0, scale) * 10 + 1e-6, f"{label}: error {err}"
        t_ours = median_time(lambda: k(*args))
        t_torch = median_time(reference)
        kind, _, layout = label.rpartition(" ")
        if layout == "contiguous":
            contiguous[kind] = t_ours
        vs = f"{t_ours / contiguous[kind]:13.2f}x" if kind in contiguous else f"{'':14s}"
        print(f"{label:34s} {fmt(t_ours)} {fmt(t_torch)} {t_ours / t_torch:6.2f}x {vs}  {err:.2e}")
    torch.set_num_threads(torch_n)

    # In place, zero copy: axpy writes into the caller's tensor.
    yv = torch.ones(8)
    ptr = yv.data_ptr()
    dlbridge.get_kernel("axpy")(2.0, torch.arange(8.0), yv)
    assert yv.data_ptr() == ptr and torch.equal(yv, 1 + 2 * torch.arange(8.0))
    print("\naxpy wrote into the torch tensor in place (same data_ptr)")

    # Small-call overhead, out= preallocated.
    add = dlbridge.get_kernel("add")
    s1, s2, s3 = torch.rand(1), torch.rand(1), torch.empty(1)
    t_ours = median_time(lambda: add(s1, s2, out=s3), number=20000)
    t_torch = median_time(lambda: torch.add(s1, s2, out=s3), number=20000)
    print(f"1-element add(x, y, out=z): dlbridge {t_ours * 1e9:.0f} ns, torch.add {t_torch * 1e9:.0f} ns ({t_ours / t_torch:.2f}x)")
    print("\nall results match torch" + (" (--quick: timings are single samples)" if QUICK else ""))


if __name__ == "__main__":
    main()
