"""Every example in README.md and docs/ runs as a reader would run it, and prints what the page says.

A reader has run ``./dev.sh demo`` and works from the repository root. Each block runs in a
fresh process there, in the order the page shows them (a page may build what its later blocks
use, as its reader would):

- ```` ```python ````: a script run by the interpreter of ``.venv``. A ```` ```text ```` block
  right after it, with ``<!-- output of the block above -->`` on the line before its fence, is
  what the script prints.
- ```` ```console ````: each ``$ `` line is a command run by bash; the lines after it, up to the
  next ``$ ``, are what it prints on stdout. Commands run in the reader's environment: the test
  command's own additions (``.venv/bin`` on ``PATH``, ``VIRTUAL_ENV``, ``PYO3_PYTHON``,
  ``LIBTORCH_USE_PYTORCH``) are taken away, so a command that needs them says so itself.
- Quoted output matches line by line: ``...`` alone on a line stands for any lines, a trailing
  ``...`` for the rest of a line, a ``0x`` address for any address; runs of spaces compare equal.
- A block that cannot run says why on the line before its fence: ``<!-- not run: REASON -->``.

The other conventions (```` ```rust ```` doctests, ```` ```rust,ignore ```` blocks kept in a file
that runs) are checked by ``tests/docs.rs``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import dlbridge

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUTPUT = "output of the block above"


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    comment: str | None  # the HTML comment on the line before the fence
    lines: list[str]

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def code(self) -> str:
        return "\n".join(self.lines) + "\n"


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, start = lines[i][3:].strip(), i
            prev = lines[i - 1].strip() if i else ""
            comment = prev[4:-3].strip() if prev.startswith("<!--") and prev.endswith("-->") else None
            i += 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            assert i < len(lines), f"{path.relative_to(ROOT)}:{start + 1}: unclosed code block"
            out.append(Block(path, start + 1, lang, comment, body))
        i += 1
    return out


ALL = [b for page in PAGES for b in blocks(page)]
RUNNABLE = [b for b in ALL if b.lang in ("python", "console")]


def _norm(s: str) -> str:
    words = []
    for w in s.split():
        t = w[2:]
        words.append("0xADDR" if w.startswith("0x") and t and all(c in "0123456789abcdefABCDEF" for c in t) else w)
    return " ".join(words)


def _line_matches(quoted: str, actual: str) -> bool:
    q, a = _norm(quoted), _norm(actual)
    return a.startswith(q[:-3].rstrip()) if q.endswith("...") else q == a


def matches(quoted: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` lines are what ``quoted`` lines describe (the rules in the module doc)."""
    if not quoted:
        return not actual
    if quoted[0].strip() == "...":
        return any(matches(quoted[1:], actual[skip:]) for skip in range(len(actual) + 1))
    return bool(actual) and _line_matches(quoted[0], actual[0]) and matches(quoted[1:], actual[1:])


def test_matches_follows_its_rules():
    assert matches(["a  b", "...", "z"], ["a b", "x", "y", "z"])
    assert matches(["data 0x1f", "tail ..."], ["data 0xdeadbeef", "tail and the rest"])
    assert not matches(["a"], ["a", "b"])
    assert not matches(["a", "...", "z"], ["a", "y"])
    assert not matches(["data 0x1f"], ["data 0xgg"])


def reader_env(cmd: str = "") -> dict[str, str]:
    """The environment of a reader who ran ``./dev.sh demo``: without what ``./dev.sh test`` adds,
    but for the lint wrapper (``RUSTC_WORKSPACE_WRAPPER``: it compiles what rustc compiles, and
    keeps the pages' cargo commands on the test run's build), which a ``pip install`` leaves out:
    it builds the extension in release as ``./dev.sh`` did, with rustc, and reuses that build."""
    dropped = ("VIRTUAL_ENV", "PYO3_PYTHON", "LIBTORCH_USE_PYTORCH")
    if "pip install" in cmd:
        dropped += ("RUSTC_WORKSPACE_WRAPPER", "CLIPPY_ARGS")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p.rstrip("/") != venv_bin)
    env.update(MPLBACKEND="Agg", PAGER="cat")
    return env


def _following_output(b: Block) -> Block | None:
    """The ```text block quoting ``b``'s output, if the page has one right after it."""
    page = [x for x in ALL if x.path == b.path]
    i = page.index(b)
    if i + 1 < len(page) and page[i + 1].comment == OUTPUT:
        return page[i + 1]
    return None


def _run_python(b: Block) -> subprocess.CompletedProcess:
    # Line numbers in a traceback point into the page.
    script = "\n" * (b.line) + b.code
    return subprocess.run([sys.executable, "-c", f"exec(compile({script!r}, {str(b.path)!r}, 'exec'))"],
                          cwd=ROOT, env=reader_env(), capture_output=True, text=True, timeout=600)


def _commands(b: Block) -> list[tuple[str, list[str]]]:
    """(command, quoted output lines) for each ``$ `` line of a console block."""
    out: list[tuple[str, list[str]]] = []
    for line in b.lines:
        if line.startswith("$ "):
            out.append((line[2:], []))
        else:
            assert out, f"{b.where}: a console block starts with a `$ ` command line"
            out[-1][1].append(line)
    return out


def test_the_pages_have_runnable_blocks():
    assert any(b.lang == "python" for b in RUNNABLE) and any(b.lang == "console" for b in RUNNABLE), (
        "no ```python or ```console block found: did the parser or the pages change?")


def test_every_docs_page_starts_with_an_example():
    """Each page of docs/ shows an example before its first section."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        body = text.split("\n## ", 1)[0]
        assert re.search(r"^```(python|console|rust)", body, re.M), (
            f"{page.relative_to(ROOT)}: no ```python, ```console or ```rust block before the first `## ` section")


@pytest.mark.parametrize("b", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_every_example_runs_and_prints_what_the_page_says(b: Block):
    if b.comment is not None and b.comment != OUTPUT:
        assert b.comment.startswith("not run: ") and b.comment[len("not run: "):].strip(), (
            f"{b.where}: the comment before a ```{b.lang} block must be `<!-- not run: REASON -->`, got {b.comment!r}")
        pytest.skip(f"{b.where}: {b.comment}")
    if b.lang == "python":
        r = _run_python(b)
        assert r.returncode == 0, f"{b.where}: the block failed:\n{r.stderr[-4000:]}"
        quoted = _following_output(b)
        if quoted is not None:
            actual = r.stdout.splitlines()
            assert matches(quoted.lines, actual), (
                f"{quoted.where} quotes\n" + quoted.code + f"but {b.where} prints\n" + r.stdout)
        return
    for cmd, quoted in _commands(b):
        r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=reader_env(cmd), capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, f"{b.where}: `{cmd}` failed (exit {r.returncode}):\n{r.stderr[-4000:]}"
        if quoted:
            assert matches(quoted, r.stdout.splitlines()), (
                f"{b.where}: `{cmd}` prints\n{r.stdout}\nbut the page quotes\n" + "\n".join(quoted))


def test_the_readmes_links_lead_somewhere():
    """mkdocs checks the links of docs/; the README's are checked here (files and anchors)."""
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links, "README.md has no links"
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README.md links to `{link}`, which is not a file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README.md links to `{link}`: no such heading in {path}"


def test_every_quoted_output_follows_a_block_that_prints_it():
    for b in ALL:
        if b.comment == OUTPUT:
            page = [x for x in ALL if x.path == b.path]
            i = page.index(b)
            assert b.lang == "text" and i > 0 and page[i - 1].lang == "python", (
                f"{b.where}: `<!-- {OUTPUT} -->` belongs before a ```text block that follows a ```python block")


# --- the error texts the pages quote are the real ones -----------------------------------------


def _quoted_errors() -> Block:
    """The ```text block of error messages (the one starting with `matmul: argument`)."""
    found = [b for b in ALL if b.lang == "text" and b.lines and b.lines[0].startswith("matmul: argument")]
    assert len(found) == 1, f"expected one ```text block of errors starting with `matmul: argument`, found {len(found)}"
    return found[0]


def _error(f) -> str:
    with pytest.raises(Exception) as e:
        f()
    return str(e.value)


def _read_only_y():
    y = np.zeros(3, np.float32)
    y.flags.writeable = False
    return dlbridge.get_kernel("axpy")(2.0, np.ones(3, np.float32), y)


# One way to meet each error the pages quote, keyed by the start of its line.
REPRODUCERS = {
    "matmul: argument b: dim K": lambda: dlbridge.get_kernel("matmul")(torch.ones(2, 3), torch.ones(4, 5)),
    "matmul: argument a: dtype mismatch": lambda: dlbridge.get_kernel("matmul")(
        torch.ones(2, 3, dtype=torch.int32), torch.ones(3, 5, dtype=torch.int32)),
    "axpy: argument y:": _read_only_y,
}


def test_the_quoted_error_texts_are_the_real_messages():
    b = _quoted_errors()
    for q in b.lines:
        keys = [k for k in REPRODUCERS if q.startswith(k)]
        assert keys, f"{b.where}: no reproducer for `{q}`: add one to REPRODUCERS in {__file__}"
        assert _error(REPRODUCERS[keys[0]]) == q


def test_the_error_the_python_page_quotes_is_real():
    text = " ".join((ROOT / "docs" / "python.md").read_text().split())
    quoted = re.search(r"each naming the kernel and the argument once: `([^`]*)`", text)
    assert quoted, "docs/python.md no longer quotes an example error in its Errors section"
    assert _error(REPRODUCERS["matmul: argument b: dim K"]) == quoted.group(1)


def test_the_conformance_matrix_is_what_dlbridge_testing_prints():
    """docs/conformance.md's "who follows which DLPack rule" matrix is
    `python -m dlbridge.testing --markdown`, for the library versions it names."""
    from importlib.metadata import PackageNotFoundError, version

    page = ROOT / "docs" / "conformance.md"
    text = " ".join(page.read_text().split())
    m = re.search(r"\(torch ([\w.]+), NumPy ([\w.]+), JAX ([\w.]+) CPU, pyarrow ([\w.]+), array-api-strict ([\w.]+)\):", text)
    assert m, "docs/conformance.md no longer names the library versions of its matrix"
    wanted = dict(zip(["torch", "numpy", "jax", "pyarrow", "array-api-strict"], m.groups()))
    installed = {}
    for name in wanted:
        try:
            installed[name] = version(name).split("+")[0]
        except PackageNotFoundError:
            installed[name] = None
    if installed != wanted:
        pytest.skip(f"the matrix is for {wanted}; installed here: {installed}")
    r = subprocess.run([sys.executable, "-m", "dlbridge.testing", "--markdown"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    lines = r.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| rule |"))
    last = max(i for i, line in enumerate(lines) if line.startswith("- ["))
    matrix = "\n".join(lines[first:last + 1])
    assert matrix in page.read_text(), (
        "docs/conformance.md's matrix differs from `python -m dlbridge.testing --markdown`; paste this:\n" + matrix)


# --- the pages say nothing of their own history ------------------------------------------------


def test_the_product_speaks_of_itself_as_it_is():
    """No session or issue numbers in the pages, the code, the tests or their error texts:
    history lives in git and CHANGELOG.md."""
    pattern = re.compile(r"session [0-9]|issue #?[0-9]", re.I)
    roots = [ROOT / "README.md", ROOT / "docs", ROOT / "crates", ROOT / "adapters", ROOT / "kernels",
             ROOT / "python", ROOT / "examples", ROOT / "tests", ROOT / "scripts"]
    found = []
    for root in roots:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for f in files:
            if f.suffix not in (".md", ".rs", ".py", ".pyi", ".c", ".h", ".cpp", ".cu", ".cuh", ".sh", ".toml"):
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "history in the product:\n" + "\n".join(found)
