import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def c_plugin(tmp_path_factory):
    """The example C plugin, compiled here from kernels/plugin-c/example.c with the system cc."""
    out = tmp_path_factory.mktemp("plugin") / "libdlbridge_plugin_example_c.so"
    cc = os.environ.get("CC", "cc")
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-std=c11", "-I", str(ROOT / "crates/dlbridge-registry/include"),
         str(ROOT / "kernels/plugin-c/example.c"), "-o", str(out), "-lm"],
        check=True,
    )
    return out
