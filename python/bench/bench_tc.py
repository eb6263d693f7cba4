"""dlbridge.define's kernels beside torch on the CPU, in one run: a defined matmul
against the built-in matmul (both GEMMs), a defined convolution and average pooling
against torch's own CPU kernels, and a fused multi-statement definition against the
same expression in torch eager.

    .venv/bin/python python/bench/bench_tc.py [--quick]

Prints medians of interleaved timings (f32, torch tensors in and out) and the ratio
dlbridge / the other (the machine is noisy: compare within a run).
"""

import argparse

import torch

import dlbridge
from dlbridge._bench import median_time

LANG = """
def tc_matmul(float(M,N) A, float(N,K) B) -> (output) {
  output(i, j) +=! A(i, kk) * B(kk, j)
}
def tc_conv(float(N,C,H,W) I, float(M,C,KH,KW) W1) -> (O) {
  O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw)
}
def tc_avgpool(float(B, C, H, W) input) -> (output) {
  output(b, c, h, w) +=! input(b, c, h * 2 + r_kh, w * 2 + r_kw) / 4.0 where r_kh in 0:2, r_kw in 0:2
}
def tc_bias_gelu_scale(float(R, C) X, float(C) B, float(C) G) -> (Y) {
  Y(r, c) = X(r, c) + B(c)
  Y(r, c) = 0.5 * Y(r, c) * (1.0 + erf(Y(r, c) * 0.7071067811865476)) * G(c)
}
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one sample of one call each (a smoke run)")
    quick = parser.parse_args().quick
    time = (lambda f: median_time(f, 1, 1)) if quick else (lambda f: median_time(f, repeat=7))
    defs = dlbridge.define(LANG)
    mm = dlbridge.get_kernel("matmul")
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    n = 64 if quick else 512
    a, b = r(n, n), r(n, n)
    x, w = (r(2, 4, 12, 12), r(4, 4, 3, 3)) if quick else (r(8, 32, 56, 56), r(32, 32, 3, 3))
    p = r(2, 4, 12, 12) if quick else r(16, 64, 112, 112)
    rows, cols = (64, 64) if quick else (4096, 1024)
    y, bias, gain = r(rows, cols), r(cols), r(cols)
    cases = [
        (f"matmul {n}^3", "built-in matmul", lambda: defs.tc_matmul(a, b), lambda: mm(a, b)),
        (f"convolution {tuple(x.shape)} * {tuple(w.shape)}", "torch conv2d", lambda: defs.tc_conv(x, w), lambda: F.conv2d(x, w)),
        (f"average pooling 2x2 {tuple(p.shape)}", "torch avg_pool2d", lambda: defs.tc_avgpool(p), lambda: F.avg_pool2d(p, 2)),
        (f"bias + gelu + scale {rows}x{cols} (fused)", "torch eager", lambda: defs.tc_bias_gelu_scale(y, bias, gain),
         lambda: F.gelu(y + bias) * gain),
    ]  # fmt: skip
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; dlbridge {dlbridge.__version__}; f32 on the CPU")
    for label, other, ours, theirs in cases:
        torch.testing.assert_close(ours(), theirs(), rtol=1e-3, atol=1e-3)
        t_ours, t_theirs = time(ours), time(theirs)
        print(f"{label:44s} define {t_ours * 1e3:9.3f} ms   {other:16s} {t_theirs * 1e3:9.3f} ms   ratio {t_ours / t_theirs:5.2f}")


if __name__ == "__main__":
    main()
