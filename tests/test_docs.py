"""The documentation builds with warnings as errors.

Sphinx reads the API reference from the compiled module's docstrings, and docs/conf.py warns
about any public name of mcr that docs/api.rst leaves out: this test fails on a broken
docstring, a broken page or an undocumented method.
"""

import importlib.util
import os
import subprocess

import pytest

from mpiharness import Background, scratch_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sphinx") is None,
                                reason="sphinx is not installed (pip install '.[test]')")


_early = []     # the build, once started: [(mpiharness.Background, its output folder)]


def start_early():
    """Start the build (conftest.py calls this once the tests are chosen)."""
    if not _early and importlib.util.find_spec("sphinx") is not None:
        tmp = scratch_folder("mcr-docs-")
        _early.append((Background(["-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                                   "-d", str(tmp / "doctrees"), DOCS, str(tmp / "html")],
                                  ROOT), tmp / "html"))


def test_docs_build_without_warnings():
    start_early()
    build, out = _early[0]
    try:
        returncode, stdout, stderr = build.result(timeout=240)
    except subprocess.TimeoutExpired as exc:
        build.stop()
        pytest.fail(f"the docs build did not finish in {exc.timeout:.0f} s")
    log = (stdout + stderr).strip()
    assert returncode == 0, f"sphinx failed ({returncode}):\n{log}"
    assert "WARNING" not in log and "ERROR" not in log, log
    api = (out / "api.html").read_text()
    for name in ("mcr.Comm.Igatherv", "mcr.Comm.Alltoallv", "mcr.Request.Waitall",
                 "mcr.Status.Get_count", "mcr.build_info"):
        assert f'id="{name}"' in api, f"{name} is missing from the API reference"
