"""mpi4py's own demo programs, ported to mcr by their import line, run as on mpi4py.

The demos of the installed mpi4py (``demo/`` of its sdist: tests/mpi4py_conformance/sdist.py)
look like users' programs: benchmarks, the MPI-1 standard's examples, pi, Mandelbrot,
one-sided counters, threads, ``mpi4py.rc`` options, a C library through ctypes. Each demo of
tests/mpi4py_conformance/demos.py runs under mpiexec as shipped, on mpi4py, then ported (every
``from mpi4py import MPI`` is ``from mcr import MPI``, the one change the README promises).
Both runs must exit with 0 (mpi4py's gets a second try: see ``run_twice``); the ported run
must print what mpi4py's printed (as ``output`` says) and no error or warning that mpi4py's
did not. The ``shared`` examples of mpi-ref-v1 run in one job per size, each checked alone
when anything in that job goes wrong.
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

import mcr
from mcr import launch
from mpi4py_conformance import sdist
from mpi4py_conformance.demos import DEMOS
from mpiharness import mpi_env, world_sizes

start_early = sdist.prefetch      # conftest.py: the download overlaps the MPI jobs
TIMEOUT = 60        # seconds for a build, or a folder's shared demos (a demo's own: Demo.timeout)
_IMPORT = re.compile(r"^(\s*)from mpi4py import MPI\b", re.MULTILINE)
_NUMBER = re.compile(r"\d+(\.\d*)?([eE][-+]?\d+)?")
_TROUBLE = re.compile(r"Traceback|Error|Warning|error|warning")
_EXEC = re.compile(r"open\(\"([^\"]+\.py)\"\)")   # a demo that runs another file's source


def _params():
    for demo in DEMOS:
        for size in world_sizes(demo.sizes):    # a pytest.param: skipped by MCR_TEST_SIZES
            n, marks = (size.values[0], size.marks) if hasattr(size, "values") else (size, ())
            yield pytest.param(demo, n, marks=marks, id=f"{demo.name}-{n}")


def port(tree):
    """Rewrite the import line of every Python file below ``tree``; the files that had one."""
    ported = set()
    for folder, _, files in os.walk(tree):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                new, count = _IMPORT.subn(r"\1from mcr import MPI", text)
                if count:
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(new)
                    ported.add(os.path.relpath(path, tree))
    return ported


@pytest.fixture(scope="module")
def demo_trees(tmp_path_factory):
    """Two copies of mpi4py's demo folder: as shipped, and ported."""
    try:
        shipped = sdist.demo_dir()
    except sdist.SuiteUnavailable as exc:
        pytest.fail(f"mpi4py's demos are not available: {exc}", pytrace=False)
    base = tmp_path_factory.mktemp("mpi4py-demos")
    trees = {"mpi4py": str(base / "mpi4py"), "mcr": str(base / "mcr")}
    for tree in trees.values():
        shutil.copytree(shipped, tree)
    return trees, port(trees["mcr"])


def mpicc():
    """The MPI compiler wrapper of the MPI that the jobs run on."""
    beside = os.path.join(os.path.dirname(launch.find_mpiexec()), "mpicc")
    for candidate in (beside, mcr.build_info().get("mpicc"), shutil.which("mpicc")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(f"no mpicc beside {beside} or on PATH: the ctypes demo compiles a C library")


def run(demo, nprocs, tree, tmp_path, label):
    """Build (if asked) and run ``demo`` in ``tree``; its stdout and stderr."""
    folder = os.path.join(tree, os.path.dirname(demo.path))
    if demo.build:
        command = [mpicc() if word == "mpicc" else word for word in demo.build]
        built = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=TIMEOUT)
        assert built.returncode == 0, f"{' '.join(command)} failed:\n{built.stderr}"
    stdin = tmp_path / f"stdin-{label}"
    stdin.write_text(demo.stdin)
    with open(stdin) as f:
        result = launch.run(nprocs, [sys.executable, os.path.basename(demo.path), *demo.args],
                            timeout=demo.timeout, env=mpi_env(), cwd=folder, stdin=f,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    where = f"{demo.name} on {nprocs} processes under {label}"
    assert result.returncode is not None, \
        f"{where} did not finish in {demo.timeout:g} s:\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, \
        f"{where} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout, result.stderr


# the shared demos of a folder, one after another in one job (a process start costs more
# than most of them): on each rank, one line per demo, whether it ran to its end (or to
# SystemExit(0), as a demo that needs more processes)
SHARED_RUNNER = """\
import json, runpy, sys, traceback
from mcr import MPI
for path in sys.argv[1:]:
    try:
        runpy.run_path(path, run_name="__main__")
        ok = True
    except SystemExit as exc:
        ok = exc.code in (None, 0)
    except BaseException:
        ok = False
        traceback.print_exc()
    print(json.dumps([path, ok]), flush=True)
    MPI.COMM_WORLD.Barrier()
"""
_shared = {}        # (tree, folder, nprocs) -> {demo path: ran cleanly on every rank}


def ran_shared(demo, nprocs, tree):
    """Whether ``demo`` ran cleanly in the one job of its folder's shared demos at
    ``nprocs``: every rank finished it, the job exited with 0 and printed no error or warning."""
    folder = os.path.dirname(demo.path)
    key = (tree, folder, nprocs)
    if key not in _shared:
        paths = [os.path.basename(d.path) for d in DEMOS
                 if d.shared and os.path.dirname(d.path) == folder and nprocs in d.sizes]
        result = launch.run(nprocs, [sys.executable, "-c", SHARED_RUNNER, *paths],
                            timeout=TIMEOUT, env=mpi_env(), cwd=os.path.join(tree, folder),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
        clean = result.returncode == 0 and not _TROUBLE.search(result.stderr)
        lines = [json.loads(line) for line in result.stdout.splitlines()
                 if line.startswith("[")] if clean else []
        _shared[key] = {path: sum(1 for p, ok in lines if p == path and ok) == nprocs
                        for path in paths}
    return _shared[key].get(os.path.basename(demo.path), False)


def run_twice(demo, nprocs, tree, tmp_path, label, why):
    """``run``, once more when it fails and `why` says why that is fair: mpi4py's own run (the
    reference of the ported one) involves no mcr code, and Open MPI's one-sided layer fails one
    now and then; the ported run only where the demo's ``retry`` names such a failure."""
    try:
        return run(demo, nprocs, tree, tmp_path, label)
    except AssertionError as first:
        if not why:
            raise
        try:
            return run(demo, nprocs, tree, tmp_path, label)
        except AssertionError as second:
            raise AssertionError(f"the {label} run failed twice ({why}):\n{first}\n{second}") \
                from None


def mask(line):
    """``line`` with every number as ``#`` and every run of blanks as one (padding varies)."""
    return " ".join(_NUMBER.sub("#", line).split())


def masked(text):
    return sorted(mask(line) for line in text.splitlines())


def numbers_close(out, expected):
    """Whether the lines of ``out`` are those of ``expected`` (in any order) with numbers
    compared to 1e-12, relative or absolute (sums in another order differ in the last bits)."""
    def parsed(text):
        return sorted((mask(line), [float(m.group()) for m in _NUMBER.finditer(line)])
                      for line in text.splitlines())
    got, want = parsed(out), parsed(expected)
    return len(got) == len(want) and all(
        text == want_text and len(values) == len(want_values)
        and all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
                for a, b in zip(values, want_values))
        for (text, values), (want_text, want_values) in zip(got, want))


@pytest.mark.timeout(5 * TIMEOUT + 60)
@pytest.mark.parametrize("demo, nprocs", list(_params()))
def test_demo_ported_to_mcr(demo_trees, demo, nprocs, tmp_path):
    trees, ported = demo_trees
    with open(os.path.join(trees["mcr"], demo.path), encoding="utf-8") as f:
        folder = os.path.dirname(demo.path)
        sources = [demo.path, *(os.path.join(folder, name) for name in _EXEC.findall(f.read()))]
    assert ported.intersection(sources), \
        f"{demo.path} has no 'from mpi4py import MPI' to port: it would run on mpi4py"
    if demo.shared and ran_shared(demo, nprocs, trees["mcr"]):
        assert demo.output == "exit", f"{demo.name}: a shared demo is checked by its exit"
        return
    out, err = run_twice(demo, nprocs, trees["mcr"], tmp_path, "mcr", demo.retry)
    if demo.output != "exit" or _TROUBLE.search(err):
        expected_out, expected_err = run_twice(demo, nprocs, trees["mpi4py"], tmp_path, "mpi4py",
                                               "mpi4py's own run: no mcr code in it")
        if demo.output == "same":
            assert sorted(out.splitlines()) == sorted(expected_out.splitlines())
        elif demo.output == "close":
            assert numbers_close(out, expected_out), \
                f"numbers differ beyond 1e-12:\n{out}\non mpi4py:\n{expected_out}"
        elif demo.output == "timings":
            assert masked(out) == masked(expected_out)
        else:
            assert demo.output == "exit", f"{demo.name}: unknown output check {demo.output!r}"
        # errors and warnings: only those mpi4py's run printed too (such as Open MPI's notes on
        # its one-sided components), numbers (process ids) aside
        known = set(masked(expected_err))
        new = [line for line in err.splitlines()
               if _TROUBLE.search(line) and mask(line) not in known]
        assert not new, f"the ported {demo.name} printed what mpi4py's run did not:\n{err}"
