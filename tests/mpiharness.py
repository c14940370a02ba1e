"""Run test cases on real MPI processes under mpiexec, with a timeout.

A test module registers cases with ``@case`` and exposes them to pytest with
``test_mpi = mpi_cases(__name__)``. For each world size, the module's cases run
in one ``mpiexec -n N`` job (``tests/mpiworker.py``); every rank writes one
line per finished case, so a case that hangs shows up as the one that never
finished, and the job is killed at the timeout instead of hanging the suite.
Each (case, world size) is reported as its own pytest test. Jobs are started
by :mod:`mcr.launch`, which this process imports without initializing MPI.

World sizes: the cases run at 1, 2, 3 and 4 ranks (:data:`SIZES`), or at the
sizes a module names. ``MCR_TEST_SIZES`` (sizes separated by commas, e.g.
``2`` or ``1,2``) restricts them: the default cases run at the sizes it lists,
a module naming its own sizes at those of them it lists (when it lists none
of them, the module's tests are reported as skipped, with the reason). Tests
that parametrize ``nprocs`` themselves use :func:`world_sizes` for the same.
Tests that start one tool at one fixed size (``run_script(2, ...)``) are not
affected.
"""

import json
import os
import subprocess
import sys
import tempfile
import traceback

import pytest

from mcr import launch

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SIZES = (1, 2, 3, 4)


def _sizes_from_env():
    """The world sizes of ``$MCR_TEST_SIZES`` (a tuple), or None when it is unset."""
    text = os.environ.get("MCR_TEST_SIZES", "").strip()
    if not text:
        return None
    try:
        sizes = tuple(int(word) for word in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ValueError(f"MCR_TEST_SIZES: expected world sizes >= 1 separated by commas "
                         f"(e.g. '2' or '1,2'), got {text!r}")
    return tuple(dict.fromkeys(sizes))


CHOSEN_SIZES = _sizes_from_env()     # None: no restriction
SIZES = DEFAULT_SIZES if CHOSEN_SIZES is None else CHOSEN_SIZES
DEFAULT_TIMEOUT = float(os.environ.get("MCR_TEST_TIMEOUT", "180"))


def case(fn):
    """Register `fn(comm)` as an MPI test case of its module."""
    module = sys.modules[fn.__module__]
    registry = module.__dict__.setdefault("_mpi_cases", {})
    registry[fn.__name__] = fn
    return fn


def mpiexec_command(nprocs):
    """The mpiexec command line for `nprocs` ranks (see :mod:`mcr.launch`)."""
    return launch.command(nprocs)


def mpi_env():
    """The environment of a test job: :func:`mcr.launch.job_env`, with this
    directory on PYTHONPATH (the workers import the harness)."""
    env = launch.job_env(launch.find_mpiexec())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
    return env


def run_script(nprocs, args, timeout=DEFAULT_TIMEOUT):
    """Run `python args...` on `nprocs` ranks; return (returncode, output).

    returncode is None when the job was killed at the timeout.
    """
    result = launch.run(nprocs, [sys.executable] + list(args), timeout=timeout, env=mpi_env(),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return result.returncode, result.stdout


_results = {}


# Open MPI's launcher sometimes fails to start at all on a loaded machine
# (seen here once in several hundred jobs, with no other job running): no rank
# starts, so no case has run, and the job is started again.
LAUNCH_FAILURES = ("The PMIx server's listener thread failed to start",)
LAUNCH_TRIES = 3


def run_cases(path, nprocs, timeout):
    """Run all cases of the test module at `path` on `nprocs` ranks (cached)."""
    key = (path, nprocs)
    if key not in _results:
        for attempt in range(1, LAUNCH_TRIES + 1):
            code, out, per_case = _run_once(path, nprocs, timeout)
            if per_case or code == 0 or not any(f in out for f in LAUNCH_FAILURES):
                break
            print(f"mpiharness: mpiexec failed to start ({nprocs} ranks, try {attempt} of "
                  f"{LAUNCH_TRIES}): {out.strip().splitlines()[-1] if out.strip() else ''}",
                  file=sys.stderr)
        _results[key] = (code, out, per_case)
    return _results[key]


def _run_once(path, nprocs, timeout):
    with tempfile.TemporaryDirectory(prefix="mcr-test-") as tmp:
        code, out = run_script(nprocs, [os.path.join(HERE, "mpiworker.py"), path, tmp],
                               timeout)
        per_case = {}
        for rank in range(nprocs):
            try:
                with open(os.path.join(tmp, f"rank{rank}.jsonl")) as f:
                    lines = f.read().splitlines()
            except FileNotFoundError:
                lines = []
            for line in lines:
                rec = json.loads(line)
                per_case.setdefault(rec["case"], {})[rank] = rec
    return code, out, per_case


def world_sizes(sizes=None):
    """The pytest parameters of a test's ``nprocs``: `sizes` (default
    :data:`SIZES`) restricted to ``$MCR_TEST_SIZES``; when that leaves none,
    every size of `sizes`, each skipped with the reason."""
    if sizes is None:
        return list(SIZES)
    if CHOSEN_SIZES is None:
        return list(sizes)
    kept = [n for n in sizes if n in CHOSEN_SIZES]
    if kept:
        return kept
    reason = (f"MCR_TEST_SIZES={os.environ['MCR_TEST_SIZES']} leaves none of this test's "
              f"world sizes {tuple(sizes)}")
    return [pytest.param(n, marks=pytest.mark.skip(reason=reason)) for n in sizes]


def mpi_cases(module_name, sizes=None, timeout=DEFAULT_TIMEOUT):
    """A pytest test running each registered case of `module_name` at each
    size of `sizes` (default :data:`SIZES`; see :func:`world_sizes`)."""
    module = sys.modules[module_name]
    names = list(module.__dict__.get("_mpi_cases", {}))
    path = os.path.abspath(module.__file__)

    @pytest.mark.parametrize("nprocs", world_sizes(sizes))
    @pytest.mark.parametrize("name", names)
    def test_mpi(name, nprocs):
        code, out, per_case = run_cases(path, nprocs, timeout)
        ranks = per_case.get(name, {})
        failed = {r: rec for r, rec in ranks.items() if not rec["ok"]}
        if failed:
            details = "\n".join(f"--- rank {r} ---\n{rec['error']}"
                                for r, rec in sorted(failed.items()))
            pytest.fail(f"case {name} failed at {nprocs} ranks:\n{details}", pytrace=False)
        if len(ranks) < nprocs:
            missing = sorted(set(range(nprocs)) - set(ranks))
            why = (f"the job was killed after {timeout:.0f} s (deadlock?)" if code is None
                   else f"the job exited with code {code}")
            pytest.fail(f"case {name} did not finish on ranks {missing} at {nprocs} "
                        f"ranks: {why}\n--- job output (tail) ---\n{out[-6000:]}",
                        pytrace=False)

    return test_mpi


def format_exception(exc):
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
