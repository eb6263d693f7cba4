"""dlbridge beside CuPy on CuPy arrays, in one run (needs a GPU and CuPy): the
same ElementwiseKernel text compiled by each, an eager call's overhead on
1-element arrays and its throughput on 16M float32 elements, and dlbridge's
built-in `add` against CuPy's `+`.

    python python/bench/bench_cupy.py [--quick]

Prints medians of repeated timings (each sample ends with a device
synchronisation) and the ratio dlbridge / CuPy.
"""

import argparse

import cupy as cp
import numpy as np

import dlbridge
from dlbridge._bench import median_time


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one sample of one call each (a smoke run)")
    quick = parser.parse_args().quick
    print(f"CuPy {cp.__version__} on {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; dlbridge {dlbridge.__version__}")
    sync = cp.cuda.get_current_stream().synchronize

    def time(f, n):
        def many():
            for _ in range(n):
                f()
            sync()

        return (median_time(many, 1, 1) if quick else median_time(many, 1, 9)) / n

    def row(label, ours, theirs, unit):
        scale = {"us": 1e6, "ms": 1e3}[unit]
        print(f"{label:40s} dlbridge {ours * scale:9.2f} {unit}   CuPy {theirs * scale:9.2f} {unit}   ratio {ours / theirs:5.2f}")

    text = ("T x, T y", "T z", "z = (x - y) * (x - y)")
    ours = dlbridge.ElementwiseKernel(*text, "bench_squared_diff")
    theirs = cp.ElementwiseKernel(*text, "bench_squared_diff")
    add = dlbridge.get_kernel("add")
    for n_elems, unit, calls in [(1, "us", 2000), (1 << 24, "ms", 20)]:
        x, y = cp.ones(n_elems, dtype=np.float32), cp.full(n_elems, 3, dtype=np.float32)
        assert isinstance(ours(x, y), cp.ndarray)
        cp.testing.assert_array_equal(ours(x, y), theirs(x, y))
        size = "1 element (per call)" if n_elems == 1 else "16M f32"
        row(f"ElementwiseKernel, {size}", time(lambda: ours(x, y), calls), time(lambda: theirs(x, y), calls), unit)
        row(f"add, {size}", time(lambda: add(x, y), calls), time(lambda: x + y, calls), unit)


if __name__ == "__main__":
    main()
