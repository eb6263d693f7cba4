"""dlbridge beside torch, in one run: per-call overhead and kernel throughput.

    .venv/bin/python python/bench/bench_torch.py

Prints medians of repeated timings (the machine is noisy: compare within a
run, read the ratios).
"""

import gc

import torch

import dlbridge
from dlbridge._bench import median_time as median


def row(label, ours, theirs=None, unit="ns"):
    scale = {"ns": 1e9, "us": 1e6, "ms": 1e3}[unit]
    text = f"{label:52s} {ours * scale:10.1f} {unit}"
    if theirs is not None:
        text += f"   torch {theirs * scale:10.1f} {unit}   ratio {ours / theirs:5.2f}"
    print(text)


def main():
    gc.disable()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; dlbridge {dlbridge.__version__}")
    add = dlbridge.get_kernel("add")
    x, y, z = torch.rand(1), torch.rand(1), torch.empty(1)
    tvm_style = dlbridge.convert_func(add, torch.Tensor, torch.utils.dlpack.to_dlpack)
    n = 20000
    print("\n-- per call, 1-element f32 tensors --")
    t_out = median(lambda: add(x, y, out=z), n)
    t_torch_out = median(lambda: torch.add(x, y, out=z), n)
    row("add(x, y, out=z)", t_out, t_torch_out)
    row("TVM-style convert_func wrapper, to_dlpack per arg", median(lambda: tvm_style(x, y, z), n), t_torch_out)
    row("add(x, y) -> new torch tensor", median(lambda: add(x, y), n), median(lambda: torch.add(x, y), n))

    print("\n-- importing a tensor (dlbridge.from_dlpack, zero copy) --")
    small = torch.rand(1)
    huge = torch.empty(1 << 28)  # 1 GiB of f32
    t_small = median(lambda: dlbridge.from_dlpack(small), n)
    t_huge = median(lambda: dlbridge.from_dlpack(huge), n)
    row("1 element", t_small)
    row("1 GiB (2^28 f32)", t_huge)
    print(f"{'ratio 1 GiB / 1 element':52s} {t_huge / t_small:10.2f}")
    assert dlbridge.from_dlpack(huge).data_ptr == huge.data_ptr()
    del huge

    print("\n-- kernels (outputs allocated by torch in both cases) --")
    a, b = torch.rand(1 << 24), torch.rand(1 << 24)
    c = torch.empty(1 << 24)
    row("add 16M f32, out= preallocated", median(lambda: add(a, b, out=c), 5), median(lambda: torch.add(a, b, out=c), 5), "ms")
    row("add 16M f32, new output", median(lambda: add(a, b), 5), median(lambda: torch.add(a, b), 5), "ms")
    m1, m2 = torch.rand(1024, 1024), torch.rand(1024, 1024)
    mm = dlbridge.get_kernel("matmul")
    row("matmul 1024x1024 f32", median(lambda: mm(m1, m2), 3), median(lambda: m1 @ m2, 3), "ms")
    s = torch.rand(4096, 1024)
    sm = dlbridge.get_kernel("softmax")
    row("softmax 4096x1024 f32", median(lambda: sm(s), 3), median(lambda: torch.softmax(s, -1), 3), "ms")


if __name__ == "__main__":
    main()
