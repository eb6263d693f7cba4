"""Our kernels beside torch's at the same thread count, with ratios.

    .venv/bin/python python/bench/compare_kernels.py              # 1 and 2 threads, every case
    .venv/bin/python python/bench/compare_kernels.py 1 gelu       # 1 thread, kernels whose name contains "gelu"
    .venv/bin/python python/bench/compare_kernels.py 1,2 --before /tmp/old/kernels/cpu/Cargo.toml
    .venv/bin/python python/bench/compare_kernels.py 1 relu --quick   # a smoke run (used by the tests)

For each thread count n and each kernel it runs the criterion bench
(``cargo bench -p dlbridge-cpu --bench kernels``) filtered to that
kernel with ``DLBRIDGE_NUM_THREADS=n`` (and ``RAYON_NUM_THREADS=n``, which
older revisions used), then torch's cases for the same kernel with
``torch.set_num_threads(n)`` (python/bench/torch_kernels.py), interleaved kernel by
kernel so that a change in the machine's load hits both sides alike. It prints
criterion's median, torch's median (``out=`` an output laid out as torch lays
out its own result, as ours is laid out as the adapters allocate it; row-major
for ``into_contiguous``), ours/torch, and ours on each layout over ours on the contiguous operand. ``--before MANIFEST`` also runs the same bench of
another checkout of this crate (its Cargo.toml; e.g. the previous commit's
``kernels/cpu`` copied elsewhere, with this bench file) and prints its median
first. Criterion's medians are read from ``$CARGO_TARGET_DIR/criterion``
(default ``target/criterion``), saved under the baselines ``t<n>`` and ``b<n>``.

torch's "flipped" row is a contiguous stand-in (see torch_kernels.py): its
ratio compares our flipped case with torch's contiguous one.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ["add", "relu", "gelu", "softmax", "sum", "mean"]
LAYOUTS = ["contiguous", "transposed", "into_contiguous", "broadcast", "sliced", "flipped"]


def criterion_dir():
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "criterion"


# A smoke run (--quick): the bench built in the dev profile (which the tests have
# built already) and criterion's shortest runs. Its figures are not to be read.
QUICK_PROFILE = ["--profile", "dev"]
QUICK = ["--warm-up-time", "0.05", "--measurement-time", "0.1", "--sample-size", "10"]


def bench(n, regex, baseline, manifest=None, quick=False):
    env = dict(os.environ, RAYON_NUM_THREADS=str(n), DLBRIDGE_NUM_THREADS=str(n))
    where = ["--manifest-path", str(manifest)] if manifest else ["-p", "dlbridge-cpu"]
    profile, extra = (QUICK_PROFILE, QUICK) if quick else ([], [])
    cmd = ["cargo", "bench", "-q", *profile, *where, "--bench", "kernels", "--", "--save-baseline", baseline, *extra, regex]
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"{cmd} failed:\n{r.stderr}")


def median_of(group, case, baseline):
    f = criterion_dir() / group.replace("/", "_") / case / baseline / "estimates.json"
    return json.loads(f.read_text())["median"]["point_estimate"] * 1e-9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("threads", nargs="?", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("pattern", nargs="?", default="", help="only kernels whose name contains this")
    ap.add_argument("--before", type=Path, help="Cargo.toml of another checkout of this crate, measured first")
    ap.add_argument("--quick", action="store_true", help="a smoke run: a dev-profile build, short criterion runs, 3 torch samples")
    args = ap.parse_args()
    repeat = 3 if args.quick else 11
    threads = [int(t) for t in args.threads.split(",")]
    print(f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cpus")
    for n in threads:
        torch.set_num_threads(n)
        print(f"\n{n} thread(s), medians in ms")
        before = f"{'before':>8s} " if args.before else ""
        print(f"{'case':26s} {before}{'ours':>8s} {'torch':>8s} {'ours/torch':>10s} {'vs contig':>9s}")
        for name in KERNELS:
            if args.pattern not in name:
                continue
            # A smoke run times two cases of f32 (contiguous and one strided layout): its
            # figures are not read, only that every part of the comparison runs.
            dts, layouts = (["f32"], ["contiguous", "transposed"]) if args.quick else (["f32", "bf16"], LAYOUTS)
            which = f"^{name}/({'|'.join(dts)})/({'|'.join(layouts)})$"
            if args.before:
                bench(n, which, f"b{n}", args.before, args.quick)
            bench(n, which, f"t{n}", quick=args.quick)
            theirs = {
                f"{k}/{dt}/{lay}": torch_kernels.median(f, repeat)
                for dtype, dt in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]
                if dt in dts
                for k, lay, f, _ in torch_kernels.cases(dtype)
                if k == name and lay in layouts
            }
            for dt in dts:
                contiguous = median_of(f"{name}/{dt}", "contiguous", f"t{n}")
                for lay in layouts:
                    if f"{name}/{dt}/{lay}" not in theirs:
                        continue  # into_contiguous: kernels whose outputs follow their inputs only
                    t = median_of(f"{name}/{dt}", lay, f"t{n}")
                    th = theirs[f"{name}/{dt}/{lay}"]
                    label = f"{name}/{dt}/{lay}"
                    old = f"{median_of(f'{name}/{dt}', lay, f'b{n}') * 1e3:8.3f} " if args.before else ""
                    print(f"{label:26s} {old}{t * 1e3:8.3f} {th * 1e3:8.3f} {t / th:10.2f} {t / contiguous:9.2f}", flush=True)
        if args.pattern in "matmul":
            if args.before:
                bench(n, "^matmul/", f"b{n}", args.before, args.quick)
            bench(n, "^matmul/", f"t{n}", quick=args.quick)
            a, b = torch.rand(1024, 1024), torch.rand(1024, 1024)
            o = torch.empty(1024, 1024)
            t, th = median_of("matmul/f32", "1024", f"t{n}"), torch_kernels.median(lambda: torch.mm(a, b, out=o), repeat)
            old = f"{median_of('matmul/f32', '1024', f'b{n}') * 1e3:8.3f} " if args.before else ""
            print(f"{'matmul/f32/1024':26s} {old}{t * 1e3:8.3f} {th * 1e3:8.3f} {t / th:10.2f}")


if __name__ == "__main__":
    main()
