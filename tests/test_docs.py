"""The documentation builds with warnings as errors.

Sphinx reads the API reference from the compiled module's docstrings, and docs/conf.py warns
about any public name of mcr that docs/api.rst leaves out: this test fails on a broken
docstring, a broken page or an undocumented method.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sphinx") is None,
                                reason="sphinx is not installed (pip install '.[test]')")


def test_docs_build_without_warnings(tmp_path):
    out = tmp_path / "html"
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
           "-d", str(tmp_path / "doctrees"), DOCS, str(out)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the docs build did not finish in {exc.timeout:.0f} s")
    log = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, f"sphinx failed ({proc.returncode}):\n{log}"
    assert "WARNING" not in log and "ERROR" not in log, log
    api = (out / "api.html").read_text()
    for name in ("mcr.Comm.Igatherv", "mcr.Comm.Alltoallv", "mcr.Request.Waitall",
                 "mcr.Status.Get_count", "mcr.build_info"):
        assert f'id="{name}"' in api, f"{name} is missing from the API reference"
