import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def c_plugin(tmp_path_factory):
    """The example C plugin, compiled here from kernels/plugin-c/example.c with the system cc."""
    out = tmp_path_factory.mktemp("plugin") / "libdlbridge_plugin_example_c.so"
    cc = os.environ.get("CC", "cc")
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-std=c11", "-I", str(ROOT / "include"),
         str(ROOT / "kernels/plugin-c/example.c"), "-o", str(out), "-lm"],
        check=True,
    )
    return out


def no_gpu_reason():
    """Why the GPU tests cannot run here (they need a CUDA build of torch that sees a GPU,
    and dlbridge's CUDA support), or None where they can."""
    import torch

    import dlbridge.cuda

    if torch.cuda.is_available() and dlbridge.cuda.is_available():
        return None
    return f"no GPU: torch.cuda.is_available()={torch.cuda.is_available()}, dlbridge: {dlbridge.cuda.unavailable_reason()}"


def on_threads(f, n):
    """Calls ``f()`` on ``n`` threads at once; their results, once every thread is done.
    An exception on any thread fails the test, naming every one."""
    results, errors = [], []

    def run():
        try:
            results.append(f())
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def cupy_l2norm(name):
    """CuPy's ReductionKernel example (its user guide, "User-Defined Kernels"), as written,
    registered under ``name``."""
    import dlbridge

    return dlbridge.ReductionKernel(
        "T x",  # input params
        "T y",  # output params
        "x * x",  # map
        "a + b",  # reduce
        "y = sqrt(a)",  # post-reduction map
        "0",  # identity value
        name,  # kernel name
    )


# CuPy's ElementwiseKernel examples (its user guide, "User-Defined Kernels"): one operation,
# by name, with the parameters each writes.
CUPY_SQUARED_DIFF_PARAMS = {
    "squared_diff": ("float32 x, float32 y", "float32 z"),
    "squared_diff_generic": ("T x, T y", "T z"),
    "squared_diff_super_generic": ("X x, Y y", "Z z"),
}


def cupy_squared_diff(name):
    """One of CuPy's squared-difference ElementwiseKernel examples, as written, by its name there."""
    import dlbridge

    in_params, out_params = CUPY_SQUARED_DIFF_PARAMS[name]
    return dlbridge.ElementwiseKernel(in_params, out_params, "z = (x - y) * (x - y)", name)


class Box:
    """A minimal framework: an array behind __dlpack__, nothing else (no shape, no indexing)."""

    def __init__(self, a) -> None:
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()
