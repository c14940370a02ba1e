"""torch's own distributed tests pass on the "mcr" backend (the backend claim).

torch's ``DistributedTest._DistTestBase`` runs under mpiexec at 2 and 3 processes on one
default group, on "mcr", then on torch's Gloo as the baseline (tests/torch_conformance/). Each
size passes when every test that ran on "mcr" passed and every test that passes on Gloo
passes on "mcr". Gloo runs only the tests "mcr" skipped: the others decide the result without
it. A hang or a crash fails its test and the run goes on in a new job. Left out:
tests/torch_conformance/exclusions.py. The report alone: ``python
tests/torch_conformance/run.py -n 2 [-i REGEX]``.
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
    comparison = report.baseline_where_skipped(report.run(nprocs, "mcr", timeout=TIMEOUT),
                                               timeout=TIMEOUT)
    print(comparison.text())
    if not comparison.ok:
        pytest.fail(comparison.text(), pytrace=False)


def test_comparison_requires_what_passes_on_gloo_to_pass_on_mcr():
    """A test that ran on "mcr" and did not pass fails, and so does one that passes on Gloo
    but is skipped on "mcr"."""
    def outcomes(title, **kinds):
        r = driver.Report(2, title)
        for name, kind in kinds.items():
            r.outcomes[f"distributed_test.{name}"] = driver.Outcome(
                f"distributed_test.{name}", kind, "CUDA is not available." * (kind == "skip"),
                gate="mcr")
        return r

    gloo = outcomes("gloo", test_a="pass", test_b="pass", test_c="skip")
    same = report.Comparison(outcomes("mcr", test_a="pass", test_b="pass", test_c="skip"), gloo)
    assert same.ok and "(+1 that need CUDA)" in same.text()
    for bad in ("fail", "error", "crash", "hang"):
        assert not report.Comparison(outcomes("mcr", test_a="pass", test_b=bad), gloo).ok
    lost = report.Comparison(outcomes("mcr", test_a="pass", test_b="skip"), gloo)
    assert not lost.ok and "LOST: distributed_test.test_b" in lost.text()
    # nothing skipped on "mcr": no baseline to run, and the result is "mcr"'s
    assert report.baseline_where_skipped(outcomes("mcr", test_a="pass")).ok
    assert not report.baseline_where_skipped(outcomes("mcr", test_a="fail")).ok
