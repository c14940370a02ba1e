"""torch's own distributed tests pass on the "mcr" backend (the backend claim).

torch's ``DistributedTest._DistTestBase`` (in the torch wheel) runs under
mpiexec at 2 and 3 processes, in-process on one default group, first on
"mcr", then on torch's Gloo as the baseline (tests/torch_conformance/). A test
torch runs only for Gloo or only for MPI runs on "mcr" with that gate. Each
size passes when every test that ran on "mcr" passed and every test that
passes on Gloo passes on "mcr". Each test has a stall timeout; a hang or a
crash fails it and the run goes on in a new job. The tests left out, each
with its reason, are in tests/torch_conformance/exclusions.py.
Alone: ``python -m pytest tests/test_torch_conformance.py``, or
``python tests/torch_conformance/run.py -n 2 [-i REGEX]`` for the report.
"""

import pytest

from mpi4py_conformance import driver
from mpiharness import world_sizes
from torch_conformance import report

SIZES = (2, 3)
TIMEOUT = 1500  # seconds per run (one backend, one size), reruns after hangs included


@pytest.mark.timeout(2 * TIMEOUT + 120)
@pytest.mark.parametrize("nprocs", world_sizes(SIZES))
def test_torch_distributed_tests_on_mcr(nprocs):
    comparison = report.Comparison(report.run(nprocs, "mcr", timeout=TIMEOUT),
                                   report.run(nprocs, "gloo", timeout=TIMEOUT))
    print(comparison.text())
    if not comparison.ok:
        pytest.fail(comparison.text(), pytrace=False)


def test_comparison_requires_what_passes_on_gloo_to_pass_on_mcr():
    """The gate (no MPI): a test that ran on "mcr" and did not pass fails the
    size, and so does a test that passes on Gloo but is skipped on "mcr"."""
    def outcomes(title, **kinds):
        r = driver.Report(2, title)
        for name, kind in kinds.items():
            r.outcomes[f"distributed_test.{name}"] = driver.Outcome(
                f"distributed_test.{name}", kind, "CUDA is not available." if kind == "skip"
                else "", gate="mcr")
        return r

    gloo = outcomes("gloo", test_a="pass", test_b="pass", test_c="skip")
    assert report.Comparison(outcomes("mcr", test_a="pass", test_b="pass", test_c="skip"),
                             gloo).ok
    for bad in ("fail", "error", "crash", "hang"):
        assert not report.Comparison(outcomes("mcr", test_a="pass", test_b=bad), gloo).ok
    lost = report.Comparison(outcomes("mcr", test_a="pass", test_b="skip"), gloo)
    assert not lost.ok and "LOST: distributed_test.test_b" in lost.text()
    assert "(+1 that need CUDA)" in report.Comparison(
        outcomes("mcr", test_a="pass", test_b="pass", test_c="skip"), gloo).text()
