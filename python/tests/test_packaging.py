"""The package as pip sees it: one pyproject.toml at the repository root drives both
`pip install .` and `./dev.sh` (maturin develop); the extension is one abi3 module; the
installed metadata says what the wheel says. (Building a wheel here would take minutes:
these checks read the same sources and the installed result instead.)"""

import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

import dlbridge
import dlbridge._dlbridge

from conftest import ROOT

REPO_URL = "https://example.invalid/dlbridge"


def toml(path):
    with open(ROOT / path, "rb") as f:
        return tomllib.load(f)


@pytest.fixture(scope="module")
def pyproject():
    return toml("pyproject.toml")


@pytest.fixture(scope="module")
def meta():
    return importlib.metadata.metadata("dlbridge")


def abi3_floor():
    """The oldest CPython the extension's `pyo3/abi3-py3XX` feature builds for, as (3, XX)."""
    features = toml("adapters/python/Cargo.toml")["dependencies"]["pyo3"]["features"]
    abi3 = [f for f in features if f.startswith("abi3")]
    assert len(abi3) == 1, f"adapters/python/Cargo.toml: want exactly one abi3-py3XX pyo3 feature, got {features}"
    m = re.fullmatch(r"abi3-py3(\d+)", abi3[0])
    assert m, abi3
    return (3, int(m.group(1)))


def test_one_pyproject_at_the_root_builds_the_extension_crate(pyproject):
    assert pyproject["build-system"]["build-backend"] == "maturin"
    assert any(r.startswith("maturin") for r in pyproject["build-system"]["requires"])
    maturin = pyproject["tool"]["maturin"]
    assert maturin["manifest-path"] == "adapters/python/Cargo.toml"
    assert maturin["python-source"] == "python"
    assert maturin["module-name"] == "dlbridge._dlbridge"
    assert (ROOT / maturin["python-source"] / "dlbridge" / "__init__.py").is_file()
    # A second pyproject next to the manifest would be a second source of metadata.
    assert not (ROOT / "python" / "pyproject.toml").exists() and not (ROOT / "adapters" / "python" / "pyproject.toml").exists()


def test_requires_python_is_the_abi3_floor(pyproject):
    floor = abi3_floor()
    assert pyproject["project"]["requires-python"] == f">={floor[0]}.{floor[1]}"
    assert sys.version_info[:2] >= floor


def test_the_extension_is_the_abi3_module():
    assert dlbridge._dlbridge.__file__.endswith(".abi3.so"), dlbridge._dlbridge.__file__
    # No interpreter-specific build beside it (it would be imported first).
    stale = [p.name for p in (ROOT / "python" / "dlbridge").glob("_dlbridge*.so") if not p.name.endswith(".abi3.so")]
    assert not stale, stale


def test_installed_metadata(pyproject, meta):
    assert meta["Name"] == "dlbridge"
    assert meta["Version"] == dlbridge.__version__ == toml("Cargo.toml")["workspace"]["package"]["version"]
    assert meta["License-Expression"] == "MIT OR Apache-2.0" == toml("Cargo.toml")["workspace"]["package"]["license"]
    assert meta["Requires-Python"] == pyproject["project"]["requires-python"]
    assert meta["Summary"] == pyproject["project"]["description"]
    assert pyproject["project"]["readme"] == "README.md"
    assert meta["Description-Content-Type"].startswith("text/markdown")
    assert meta.get_payload().startswith("# dlbridge\n"), "the long description is README.md"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Repository", "Issues"} <= urls.keys(), urls
    assert all(u.startswith(REPO_URL) for u in urls.values()), urls
    assert urls["Repository"] == REPO_URL == toml("Cargo.toml")["workspace"]["package"]["repository"]
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Rust" in classifiers
    floor = abi3_floor()
    assert f"Programming Language :: Python :: {floor[0]}.{floor[1]}" in classifiers
    versions = [tuple(map(int, m.groups())) for c in classifiers if (m := re.fullmatch(r"Programming Language :: Python :: (\d+)\.(\d+)", c))]
    assert versions and min(versions) == floor, classifiers


def test_torch_and_numpy_are_optional(meta):
    requires = meta.get_all("Requires-Dist") or []
    assert all("extra ==" in r for r in requires), requires
    assert {"torch", "numpy"} <= set(meta.get_all("Provides-Extra") or [])


@pytest.mark.skipif(shutil.which("cargo") is None, reason="cargo is not on PATH")
def test_the_extension_does_not_build_the_cli_or_conformance_crates():
    out = subprocess.run(
        ["cargo", "tree", "--offline", "-p", "dlbridge-python", "-e", "normal", "--prefix", "none", "--format", "{p}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    names = {line.split()[0] for line in out.stdout.splitlines() if line.strip()}
    assert "dlbridge" in names and "pyo3" in names, names
    assert not names & {"clap", "dlbridge-conformance", "dlbridge-cli"}, names
