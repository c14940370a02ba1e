"""mpi4py's own test suite passes through mcr.MPI (the drop-in claim).

The suite of the installed mpi4py (its sdist: tests/mpi4py_conformance/sdist.py) runs with
``mcr.MPI`` in place of ``mpi4py.MPI`` at 1, 2 and 3 processes (at 1, the process-local
modules in a process of their own beside the job: driver.run). Each size passes when every
test that ran passes (a failure, an error, a crash, a hang, or a failed set-up of a class or
module fails it). Left out: tests/mpi4py_conformance/exclusions.py. The report alone:
``python tests/mpi4py_conformance/run.py -n 2 [-i REGEX]``.
"""

import pytest

from mpi4py_conformance import driver, sdist
from mpiharness import world_sizes

start_early = sdist.prefetch      # conftest.py: the download overlaps the MPI jobs
SIZES = (1, 2, 3)
TIMEOUT = 1500  # seconds per size, reruns after crashes included


@pytest.fixture(scope="module")
def mpi4py_tests():
    try:
        return sdist.test_dir()
    except sdist.SuiteUnavailable as exc:
        pytest.fail(f"mpi4py's test suite is not available: {exc}", pytrace=False)


@pytest.mark.timeout(TIMEOUT + 120)
@pytest.mark.parametrize("nprocs", world_sizes(SIZES))
def test_mpi4py_suite_through_mcr(mpi4py_tests, nprocs):
    report = driver.run(nprocs, mpi4py_tests, timeout=TIMEOUT)
    print(report.text())
    if not report.ok:
        pytest.fail(report.text(), pytrace=False)


def test_report_requires_every_test_that_ran_to_pass():
    """Skips do not count; a failure, error, crash, hang or failed class set-up fails."""
    def report(*kinds, fixture=False):
        r = driver.Report(2, "mpi4py 4.1.2 test suite through mcr.MPI")
        for i, kind in enumerate(kinds):
            r.outcomes[f"test_x.T.test{i}"] = driver.Outcome(f"test_x.T.test{i}", kind)
        if fixture:
            r.fixture_errors.append(driver.Outcome("test_x.U", "error", "setUpClass"))
        return r

    assert report().ok and report("pass", "skip", "pass").ok
    assert "passed 2 of the 2 tests that ran" in report("pass", "skip", "pass").text()
    for bad in ("fail", "error", "crash", "hang"):
        r = report(*["pass"] * 500, bad)
        assert not r.ok and "FAIL" in r.text(), bad
    assert not report("pass", fixture=True).ok
    # at one process the process-local modules run beside the job: their outcomes count too
    for bad in ("fail", "crash"):
        merged = report("pass").merged(report("pass", bad), 1.0)
        assert not merged.ok and merged.count("pass") == 2 and merged.jobs == 0, bad
    assert report("pass").merged(report("pass", "skip"), 1.0).ok
