"""README.md's Python blocks run, and the error texts it quotes are the real ones.

Every ```python block of README.md runs as a script in its own interpreter (as a
reader pasting it would: a fresh process, the repository root as the working
directory), unless the line before it is ``<!-- not run: REASON -->``. Keep such
exceptions rare: a block that cannot run is a block that can drift. The Rust
blocks run as doctests and the other conventions are checked by tests/readme.rs.
"""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import dlbridge

from conftest import ROOT

README = ROOT / "README.md"


def blocks(lang):
    """(line, comment before the fence or None, code) of every ```LANG block."""
    lines = README.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            info, start = lines[i][3:].strip(), i
            prev = lines[i - 1].strip() if i else ""
            comment = prev[4:-3].strip() if prev.startswith("<!--") and prev.endswith("-->") else None
            i += 1
            body = []
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if info == lang:
                out.append((start + 1, comment, "\n".join(body) + "\n"))
        i += 1
    return out


PYTHON_BLOCKS = blocks("python")


@pytest.fixture(scope="session")
def rust_plugin():
    """target/debug/libdlbridge_plugin_rust.so, which the README loads (built here if missing)."""
    path = ROOT / "target/debug/libdlbridge_plugin_rust.so"
    if not path.exists() and shutil.which("cargo"):
        subprocess.run(["cargo", "build", "--quiet", "-p", "dlbridge-plugin-rust"], cwd=ROOT, check=True)
    return path


def test_the_readme_has_python_blocks():
    assert PYTHON_BLOCKS, "README.md has no ```python block: did the parser or the README change?"


@pytest.mark.parametrize("line,comment,code", PYTHON_BLOCKS, ids=[f"README.md:{b[0]}" for b in PYTHON_BLOCKS])
def test_readme_python_block_runs(line, comment, code, rust_plugin):
    if comment is not None:
        assert comment.startswith("not run: ") and comment[len("not run: "):].strip(), (
            f"README.md:{line}: the comment before a ```python block must be `<!-- not run: REASON -->`, got {comment!r}"
        )
        pytest.skip(f"README.md:{line}: {comment}")
    # Line numbers in a traceback point into the README.
    script = "\n" * line + code
    env = dict(os.environ, MPLBACKEND="Agg", PAGER="cat")
    r = subprocess.run([sys.executable, "-c", f"exec(compile({script!r}, {str(README)!r}, 'exec'))"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"README.md:{line}: the block failed:\n{r.stderr[-4000:]}"


def _readme_errors():
    """The lines of the ```text block of error messages (the one starting with `matmul: argument`)."""
    for line, _comment, body in blocks("text"):
        if body.startswith("matmul: argument"):
            return line, body.splitlines()
    pytest.fail("README.md no longer has the ```text block of error messages starting with `matmul: argument`")


def _error(f):
    with pytest.raises(Exception) as e:
        f()
    return str(e.value)


def _read_only_y():
    y = np.zeros(3, np.float32)
    y.flags.writeable = False
    return dlbridge.get_kernel("axpy")(2.0, np.ones(3, np.float32), y)


def _overlap():
    x = torch.zeros(4)
    return dlbridge.get_kernel("add")(x[:3], x[:3], out=x[1:])


# One way to meet each error the README quotes, keyed by the start of its line.
REPRODUCERS = {
    "matmul: argument b: dim K": lambda: dlbridge.get_kernel("matmul")(torch.ones(2, 3), torch.ones(4, 5)),
    "matmul: argument a: dtype mismatch": lambda: dlbridge.get_kernel("matmul")(
        torch.ones(2, 3, dtype=torch.int32), torch.ones(3, 5, dtype=torch.int32)),
    "axpy: argument y:": _read_only_y,
    "add: output out: overlaps": _overlap,
}


def test_readme_error_texts_are_the_real_messages():
    line, quoted = _readme_errors()
    for q in quoted:
        keys = [k for k in REPRODUCERS if q.startswith(k)]
        assert keys, f"README.md:{line}: no reproducer for `{q}`: add one to REPRODUCERS in {__file__}"
        assert _error(REPRODUCERS[keys[0]]) == q


def test_the_error_the_python_section_quotes_is_real():
    text = " ".join(README.read_text().split())
    quoted = re.search(r"each naming the kernel and the argument once: `([^`]*)`", text)
    assert quoted, "README.md no longer quotes an example error in the Python section"
    assert _error(REPRODUCERS["matmul: argument b: dim K"]) == quoted.group(1)


def test_readme_conformance_matrix_is_what_dlbridge_testing_prints():
    """The README's "who follows which DLPack rule" matrix is `python -m dlbridge.testing --markdown`,
    for the library versions it names."""
    from importlib.metadata import PackageNotFoundError, version

    text = " ".join(README.read_text().split())
    m = re.search(r"\(torch ([\w.]+), NumPy ([\w.]+), JAX ([\w.]+) CPU, pyarrow ([\w.]+), array-api-strict ([\w.]+)\):", text)
    assert m, "README.md no longer names the library versions of its conformance matrix"
    wanted = dict(zip(["torch", "numpy", "jax", "pyarrow", "array-api-strict"], m.groups()))
    installed = {}
    for name in wanted:
        try:
            installed[name] = version(name).split("+")[0]
        except PackageNotFoundError:
            installed[name] = None
    if installed != wanted:
        pytest.skip(f"the README's matrix is for {wanted}; installed here: {installed}")
    r = subprocess.run([sys.executable, "-m", "dlbridge.testing", "--markdown"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    lines = r.stdout.splitlines()
    first = next(i for i, l in enumerate(lines) if l.startswith("| rule |"))
    last = max(i for i, l in enumerate(lines) if l.startswith("- ["))
    matrix = "\n".join(lines[first:last + 1])
    assert matrix in README.read_text(), (
        "README.md's conformance matrix differs from `python -m dlbridge.testing --markdown`; paste this:\n" + matrix)
