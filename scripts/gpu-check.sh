#!/usr/bin/env bash
# The GPU test set, built where Rust is and run where a GPU is.
#
#   scripts/gpu-check.sh build     (here: needs Rust and ./dev.sh's .venv) builds the
#                                  test binaries of every crate with GPU tests, the abi3
#                                  wheel, and gathers pytest's wheels and the Python GPU
#                                  tests into target/gpu-check/
#   scripts/gpu-check.sh [run]     (on the GPU machine: needs only Linux x86-64, an
#                                  NVIDIA GPU and a CUDA 12 or 13 driver; no Rust, no
#                                  internet) runs them, from a checkout or a copy of
#                                  target/gpu-check/ with this script beside it, then
#                                  python/bench/bench_cuda.py, bench_cupy.py and bench_jax.py
#                                  (GPU_CHECK_BENCH_ARGS=--quick for fewer rounds)
#
# On the GPU machine a test that reports `skipped:` is a failure: the point of
# the run is that nothing is skipped. NVRTC is looked for in CUDA_PATH,
# /usr/local/cuda and the NVIDIA wheels of `python3` (set DLBRIDGE_NVRTC to a
# libnvrtc.so.* to choose). The report names the GPU, the driver and NVRTC.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=${1:-run}

# Test targets that need a GPU (cargo arguments; the others run in ./dev.sh test).
TARGETS=("-p dlbridge-cuda" "-p dlbridge-compile --test cuda --test inline")
# Test binaries of those crates that need no GPU (they run in ./dev.sh test).
NOT_GPU="host_emulation"
# Python tests that need a GPU.
PY_TESTS=(test_cuda.py test_compile_cuda.py test_gpu_frameworks.py)

build() {
    cd "$here/.."
    local out=target/gpu-check
    rm -rf "$out" && mkdir -p "$out/bin"
    for t in "${TARGETS[@]}"; do
        # shellcheck disable=SC2086 # each entry is a list of cargo arguments
        cargo test --release $t --no-run --message-format=json |
            python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' |
            while read -r exe; do
                case "$(basename "$exe")" in "$NOT_GPU"-*) ;; *) cp "$exe" "$out/bin/" ;; esac
            done
    done
    # Debug info makes them ~50 MB each; the device tool carries 64 MiB in all.
    strip --strip-debug "$out"/bin/*
    # The Python side: the abi3 wheel (any CPython >= 3.11), pytest's wheels (pure
    # Python), and the tests, for a machine with its own Python and torch but no internet.
    VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin build --release --quiet -o "$out/wheels"
    .venv/bin/python -m pip download --quiet --only-binary :all: --python-version 3.11 -d "$out/wheels" pytest
    mkdir -p "$out/python-tests"
    # test_define.py: the TC examples test_compile_cuda.py runs on the GPU.
    for f in conftest.py test_define.py "${PY_TESTS[@]}"; do cp "python/tests/$f" "$out/python-tests/"; done
    cp python/bench/bench_cuda.py python/bench/bench_cupy.py python/bench/bench_jax.py "$out/python-tests/"
    cp "$here/gpu-check.sh" "$out/"
    ls "$out/bin" "$out/wheels"
    echo "copy $out to the GPU machine and run: bash gpu-check.sh"
}

find_nvrtc() {
    [ -n "${DLBRIDGE_NVRTC:-}" ] && return
    # torch's own NVRTC first (it matches torch's CUDA, which works with this driver;
    # a newer toolkit's PTX may not load on an older driver), then the toolkit's.
    local c
    c=$(python3 -c '
import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
for d in dirs:
    for pat in ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cu12/lib/libnvrtc.so.12"):
        for f in glob.glob(os.path.join(d, pat)):
            print(f); raise SystemExit' 2>/dev/null || true)
    [ -n "$c" ] && { export DLBRIDGE_NVRTC=$c; return; }
    for c in "${CUDA_PATH:-/nonexistent}"/lib64/libnvrtc.so.1[23] /usr/local/cuda/lib64/libnvrtc.so.1[23]; do
        [ -f "$c" ] && { export DLBRIDGE_NVRTC=$c; return; }
    done
    return 0
}

run() {
    local bin
    if [ -d "$here/bin" ]; then bin="$here/bin"; else bin="$here/../target/gpu-check/bin"; fi
    [ -d "$bin" ] || { echo "gpu-check: no test binaries: run 'scripts/gpu-check.sh build' where Rust is" >&2; exit 2; }
    echo "== GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"
    find_nvrtc
    echo "== NVRTC: ${DLBRIDGE_NVRTC:-(by name on the loader path)}"
    local failed=0 log
    log=$(mktemp)
    for t in "$bin"/*; do
        echo "== $(basename "$t")"
        if ! "$t" --test-threads=1 --nocapture >"$log" 2>&1; then
            failed=1
            cat "$log" # the whole output: the panics' messages
        else
            grep -E "^test |test result|skipped:|panicked|NVRTC " "$log" || true
        fi
        if grep -q "skipped:" "$log"; then
            echo "!! a test was skipped on the GPU machine (see above)"
            failed=1
        fi
    done
    local wheels tests
    if [ -d "$here/wheels" ]; then wheels="$here/wheels" tests="$here/python-tests"; else wheels="$here/../target/gpu-check/wheels" tests="$here/../target/gpu-check/python-tests"; fi
    if [ -d "$wheels" ] && python3 -c 'import torch' 2>/dev/null; then
        echo "== Python: $(python3 --version), torch $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
        # Installed beside (not into) the machine's Python, which brings torch.
        local site
        site=$(mktemp -d)
        python3 -m pip install --quiet --no-index --find-links "$wheels" --target "$site" dlbridge pytest
        if ! (cd "$tests" && PYTHONPATH="$site" python3 -m pytest -q -rs -p no:cacheprovider "${PY_TESTS[@]}" \
            -k "not without_a_driver" >"$log" 2>&1); then failed=1; fi
        cat "$log"
        if grep -qE "SKIPPED.*(no GPU|no NVRTC|not available)" "$log"; then
            echo "!! a Python GPU test was skipped on the GPU machine (see above)"
            failed=1
        fi
        # The figures: dlbridge's CUDA paths beside torch on this GPU.
        echo "== bench_cuda.py ${GPU_CHECK_BENCH_ARGS:-}"
        # shellcheck disable=SC2086 # optional arguments
        if ! (cd "$tests" && PYTHONPATH="$site" python3 bench_cuda.py ${GPU_CHECK_BENCH_ARGS:-}); then failed=1; fi
        # CuPy and JAX beside dlbridge on the same arrays (each where it is installed).
        local b
        for b in cupy jax; do
            if python3 -c "import $b" 2>/dev/null; then
                b="bench_$b.py"
                echo "== $b ${GPU_CHECK_BENCH_ARGS:-}"
                # shellcheck disable=SC2086 # optional arguments
                if ! (cd "$tests" && PYTHONPATH="$site" python3 "$b" ${GPU_CHECK_BENCH_ARGS:-}); then failed=1; fi
            fi
        done
    else
        echo "!! Python GPU tests not run: no wheels in $wheels, or no python3 with torch"
        failed=1
    fi
    rm -f "$log"
    if [ "$failed" = 0 ]; then echo "== gpu-check: all passed, nothing skipped"; else echo "== gpu-check: FAILED"; fi
    return "$failed"
}

case "$mode" in
    build) build ;;
    run) run ;;
    *) echo "usage: $0 [build|run]" >&2; exit 2 ;;
esac
