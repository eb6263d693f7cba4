#!/usr/bin/env bash
# dlbridge developer entry point. Usage: ./dev.sh {demo|test|setup}
#
#   setup  create .venv (python/requirements-dev.txt: torch==2.13.0, numpy, maturin,
#          pytest, mkdocs, ...); idempotent and fast when already done (a stamp keyed
#          on that file)
#   demo   set up, build the Python extension (pyproject.toml: the same build
#          `pip install .` runs), run the PyTorch demo (examples/pytorch_demo.py)
#   test   set up, build, then run every test: the demo (--quick), rustfmt --check,
#          the Rust workspace, clippy and rustdoc with warnings as errors, the docs
#          site (mkdocs build --strict), and the Python suite (pytest: every code
#          block of README.md and docs/, and a smoke run of every benchmark, among them)
set -euo pipefail
cd "$(dirname "$0")"

step="starting"
# Seconds per step, printed as a table when the run ends (passed or failed).
step_names=()
step_secs=()
now_ms() { local t=${EPOCHREALTIME//[!0-9]/}; echo $((t / 1000)); }
step_start=$(now_ms)
end_step() {
    if [ "$step" != "starting" ]; then
        step_names+=("$step")
        step_secs+=($(($(now_ms) - step_start)))
    fi
}
log() {
    end_step
    step="$*"
    step_start=$(now_ms)
    printf '\033[1m==> %s\033[0m\n' "$*" >&2
}
# Steps run beside another (their own seconds; the total counts the wall clock only).
beside_names=()
beside_secs=()
print_steps() {
    [ "${#step_names[@]}" -gt 0 ] || return 0
    local total=0 i
    printf '\n%8s  %s\n' "seconds" "step" >&2
    for i in "${!step_names[@]}"; do
        printf '%6d.%d  %s\n' $((step_secs[i] / 1000)) $((step_secs[i] % 1000 / 100)) "${step_names[$i]:0:90}" >&2
        total=$((total + step_secs[i]))
    done
    for i in "${!beside_names[@]}"; do
        printf '%6d.%d  %s\n' $((beside_secs[i] / 1000)) $((beside_secs[i] % 1000 / 100)) "${beside_names[$i]:0:90}" >&2
    done
    printf '%6d.%d  %s\n' $((total / 1000)) $((total % 1000 / 100)) "total" >&2
}
# The last line of a failed run names the step that failed (a log shown only in part, as CI's
# may be, still says where to look).
# A build still running beside a step that failed goes with it.
trap 'rc=$?; end_step; print_steps; [ "$rc" -eq 0 ] || printf "\033[1m==> FAILED (exit %s) in: %s\033[0m\n" "$rc" "$step" >&2; kill $(jobs -p) 2>/dev/null || true' EXIT

find_python() {
    # >= 3.11: the abi3 extension needs the buffer protocol of the 3.11 limited API (pyproject.toml).
    for py in python3.11 python3; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))'; then
            echo "$py"
            return
        fi
    done
    echo "dev.sh: need Python >= 3.11 on PATH" >&2
    exit 1
}

# Free space (GiB, rounded down) on the file system that holds the checkout.
free_gib() { df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }'; }

setup() {
    command -v cargo >/dev/null || { echo "dev.sh: cargo not found: install Rust first (https://rustup.rs)" >&2; exit 1; }
    local req=python/requirements-dev.txt
    local stamp
    stamp=".venv/.dlbridge-setup-$(sha256sum "$req" | cut -c1-16)"
    if [ -f "$stamp" ] && [ -x .venv/bin/python ]; then
        return
    fi
    local py
    py=$(find_python)
    if [ ! -x .venv/bin/python ]; then
        log "creating .venv with $($py --version)"
        "$py" -m venv .venv
    fi
    # torch's Linux wheel brings its CUDA libraries: .venv takes about 6 GiB, and the builds in
    # target/ about 10 GiB more. Say so up front rather than fail half-way through pip.
    local free
    free=$(free_gib)
    if [ "$free" -lt 7 ]; then
        echo "dev.sh: only ${free} GiB free in $PWD; .venv needs about 6 GiB (torch and its CUDA" \
             "libraries) and target/ about 10 GiB more: free some space and run again" >&2
        exit 1
    fi
    # Downloading and installing are two steps, so the table at the end tells the network's
    # share apart. No pip cache: it would keep a second copy of every wheel (about 3 GiB for
    # torch alone); the downloaded wheels go once installed.
    local wheels
    wheels=$(mktemp -d "${TMPDIR:-/tmp}/dlbridge-wheels.XXXXXX")
    log "pip download: Python dependencies (torch is large: this takes a few minutes once)"
    .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-cache-dir \
        -d "$wheels" -r "$req"
    log "pip install: Python dependencies into .venv"
    # --no-compile: Python writes each module's bytecode when it is first imported; compiling
    # all 9,500 files up front (most never imported) is half a minute of one core.
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-compile \
        --no-index --find-links "$wheels" -r "$req"
    rm -rf "$wheels"
    rm -f .venv/.dlbridge-setup-*
    touch "$stamp"
}

# Builds the Python extension into .venv when any Rust, C, C++, CUDA or packaging input changed.
build_python() {
    local stamp sum
    sum=$(find Cargo.toml Cargo.lock pyproject.toml crates adapters kernels python -type f \
            \( -name '*.rs' -o -name '*.toml' -o -name '*.c' -o -name '*.h' -o -name '*.cpp' -o -name '*.cu' \
               -o -name '*.cuh' -o -name Cargo.lock \) \
            -not -path '*/target/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
    stamp=".venv/.dlbridge-ext-$sum"
    if [ -f "$stamp" ]; then
        return
    fi
    log "building the dlbridge Python extension (release) into .venv"
    # Reads ./pyproject.toml (the package's only metadata), as `pip install .` does.
    # rustc itself, not clippy-driver (see cargo_env): the same build `./dev.sh demo` makes.
    env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --release --quiet
    # The editable install puts _dlbridge.abi3.so in python/dlbridge/; an interpreter-specific
    # one left by an older (non-abi3) build would be imported first, so it goes.
    find python/dlbridge -maxdepth 1 -name '_dlbridge*.so' ! -name '_dlbridge.abi3.so' -delete
    rm -f .venv/.dlbridge-ext-*
    touch "$stamp"
}

demo() {
    log "running the demo: examples/pytorch_demo.py $*"
    .venv/bin/python examples/pytorch_demo.py "$@"
}

# What every cargo command of a test run shares: pyo3 crates find the interpreter through
# PYO3_PYTHON; tch (torch-sys) links the torch==2.13.0 of .venv (LIBTORCH_USE_PYTORCH=1 asks
# `python` on PATH where it is). The workspace's own crates are compiled by clippy-driver,
# which is rustc plus clippy's lints (warnings are errors): the test build is clippy's check
# too, one compile of each crate instead of a build and a separate check. Exported for the
# rest of the run, so the cargo commands the Python tests run reuse that build.
cargo_env() {
    export PYO3_PYTHON="$PWD/.venv/bin/python"
    export LIBTORCH_USE_PYTORCH=1
    export PATH="$PWD/.venv/bin:$PATH"
    # A one-off build (CI's clean clone) gains nothing from incremental data, which is several
    # GiB of target/ for this workspace.
    if [ -n "${CI:-}" ]; then
        export CARGO_INCREMENTAL=0
    fi
    local driver
    driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)
    if [ -z "$driver" ]; then
        echo "dev.sh: clippy-driver not found: install clippy (rustup component add clippy)" >&2
        exit 1
    fi
    export RUSTC_WORKSPACE_WRAPPER="$driver"
    # `-D warnings`, encoded as `cargo clippy -- -D warnings` passes it to clippy-driver.
    export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
    # The lints must really run: clippy-driver refuses a known lint under these settings.
    local canary
    canary=$(mktemp -d "${TMPDIR:-/tmp}/dlbridge-canary.XXXXXX")
    printf 'fn main() {\n    let v: Vec<u8> = Vec::new();\n    if v.len() == 0 {}\n}\n' >"$canary/canary.rs"
    if "$driver" --edition 2021 --emit=metadata -o "$canary/canary.rmeta" "$canary/canary.rs" >/dev/null 2>&1; then
        rm -rf "$canary"
        echo "dev.sh: $driver let clippy::len_zero pass with CLIPPY_ARGS=$CLIPPY_ARGS: its lints would not run" >&2
        exit 1
    fi
    rm -rf "$canary"
}

# Builds the tests (all crates but the extension module, every target: clippy lints them all)
# in the background, beside the extension's release build: each leaves a core idle much of
# the time (one crate's code generation at a time). `wait_test_build` joins it.
start_test_build() {
    test_build_log=$(mktemp "${TMPDIR:-/tmp}/dlbridge-test-build.XXXXXX")
    test_build_start=$(now_ms)
    cargo test --workspace --exclude dlbridge-python --all-targets --quiet --no-run >"$test_build_log" 2>&1 &
    test_build_pid=$!
}

wait_test_build() {
    local rc=0
    log "cargo test --workspace --all-targets --no-run, with clippy's lints: waiting for the build"
    wait "$test_build_pid" || rc=$?
    beside_names+=("cargo test --no-run: build the tests, linted (beside the extension's build)")
    beside_secs+=($(($(now_ms) - test_build_start)))
    cat "$test_build_log" >&2
    rm -f "$test_build_log"
    [ "$rc" -eq 0 ] || exit "$rc"
}

# clippy for the extension module (the test build lints every other crate), then rustdoc
# (warnings are errors in both), appending "milliseconds name" for each to the file $1 (the
# step that fails is the last line).
lint() {
    local t rc=0
    t=$(now_ms)
    cargo clippy -p dlbridge-python --all-targets --quiet -- -D warnings || rc=$?
    echo "$(($(now_ms) - t)) cargo clippy -p dlbridge-python --all-targets (warnings are errors)" >>"$1"
    [ "$rc" -eq 0 ] || return "$rc"
    t=$(now_ms)
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet || rc=$?
    echo "$(($(now_ms) - t)) cargo doc --workspace --no-deps (rustdoc warnings, broken intra-doc links among them, are errors)" >>"$1"
    return "$rc"
}

run_tests() {
    demo --quick
    wait_test_build
    # cargo test's binaries run one after another, leaving a core idle much of the time, so
    # clippy (for the extension module) and rustdoc, which only check, run beside them. cargo
    # test lets go of target/'s lock once its build is found fresh; clippy starts a moment
    # later (were it first, the tests would wait for it: slower, never wrong).
    log "cargo test --workspace: run, with clippy (extension module) and rustdoc beside it"
    local lint_out lint_times test_rc=0 lint_rc=0 ms name
    lint_out=$(mktemp "${TMPDIR:-/tmp}/dlbridge-lint.XXXXXX")
    lint_times=$(mktemp "${TMPDIR:-/tmp}/dlbridge-lint-times.XXXXXX")
    # --no-fail-fast: every test target runs, and cargo ends by naming each one that failed.
    cargo test --workspace --exclude dlbridge-python --quiet --no-fail-fast &
    local test_pid=$!
    sleep 3
    lint "$lint_times" >"$lint_out" 2>&1 &
    local lint_pid=$!
    wait "$test_pid" || test_rc=$?
    wait "$lint_pid" || lint_rc=$?
    cat "$lint_out" >&2
    while read -r ms name; do
        beside_names+=("$name (beside cargo test)")
        beside_secs+=("$ms")
    done <"$lint_times"
    rm -f "$lint_out" "$lint_times"
    [ "$test_rc" -eq 0 ] || exit "$test_rc"
    if [ "$lint_rc" -ne 0 ]; then
        step="$(tail -n 1 <<<"$(printf '%s\n' "${beside_names[@]}")")"
        exit "$lint_rc"
    fi
    log "mkdocs build --strict (mkdocs.yml: a broken link or anchor, or a page left out of the nav, fails)"
    NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
    if compgen -G "python/tests/test_*.py" >/dev/null; then
        # One worker per core, at most 4 (each imports torch and JAX), a test file's
        # tests on one worker (its module fixtures built once).
        local cores workers
        cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
        workers=$(( cores < 4 ? cores : 4 ))
        # torch.compile's caches (/tmp/torchinductor_$USER otherwise) live in the checkout, so a
        # clean clone's run compiles what a fresh machine's would.
        export TORCHINDUCTOR_CACHE_DIR="$PWD/target/torchinductor"
        log "pytest python/tests (${workers} workers)"
        .venv/bin/python -m pytest python/tests -q -n "$workers" --dist loadfile
    fi
}

test_setup() {
    setup
    log "cargo fmt --check (rustfmt.toml)"
    cargo fmt --check
    cargo_env
    start_test_build
}

case "${1:-}" in
    setup) setup ;;
    demo) setup; build_python; demo ;;
    test) test_setup; build_python; run_tests ;;
    *) echo "usage: ./dev.sh {demo|test|setup}" >&2; exit 2 ;;
esac
