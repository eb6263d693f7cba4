"""dlbridge.jax beside jax.numpy, in one run: a jitted call's overhead and
throughput on the CPU (XLA's own fused code against dlbridge's kernels
behind one custom call).

    .venv/bin/python python/bench/bench_jax.py [--quick]

Prints medians of repeated timings and the ratio dlbridge / jax.numpy (the
machine is noisy: compare within a run).
"""

import argparse

import jax
import jax.numpy as jnp

import dlbridge
import dlbridge.jax
from dlbridge._bench import median_time


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one sample of one call each (a smoke run)")
    quick = parser.parse_args().quick
    time = (lambda f, n: median_time(f, 1, 1)) if quick else median_time
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; dlbridge {dlbridge.__version__}")

    def row(label, ours, theirs, unit):
        scale = {"us": 1e6, "ms": 1e3}[unit]
        print(f"{label:36s} dlbridge {ours * scale:9.2f} {unit}   jax.numpy {theirs * scale:9.2f} {unit}   ratio {ours / theirs:5.2f}")

    add, gelu, softmax = (dlbridge.jax.as_op(n) for n in ("add", "gelu", "softmax"))
    cases = [
        ("add, 1 element (per call)", add, jnp.add, (jnp.ones(1), jnp.ones(1)), "us", 2000),
        ("add, 16M f32", add, jnp.add, (jnp.ones(1 << 24), jnp.ones(1 << 24)), "ms", 5),
        ("gelu, 16M f32", gelu, lambda x: jax.nn.gelu(x, approximate=False), (jnp.ones(1 << 24),), "ms", 5),
        ("softmax, 4096x1024 f32", softmax, lambda x: jax.nn.softmax(x, axis=-1), (jnp.ones((4096, 1024)),), "ms", 5),
    ]
    for label, ours, theirs, args, unit, n in cases:
        f, g = jax.jit(ours), jax.jit(theirs)
        f(*args).block_until_ready(), g(*args).block_until_ready()
        t_ours = time(lambda: f(*args).block_until_ready(), n)
        t_theirs = time(lambda: g(*args).block_until_ready(), n)
        row(label, t_ours, t_theirs, unit)


if __name__ == "__main__":
    main()
