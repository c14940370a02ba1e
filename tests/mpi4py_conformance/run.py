"""Run mpi4py's test suite through mcr.MPI and print the report.

    python tests/mpi4py_conformance/run.py -n 2 [-i REGEX ...]

Exits with status 1 when a test that ran does not pass (a failure, an error, a crash, a
hang, or a failed set-up of a class or module) at some size. The suite comes from sdist.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mpi4py_conformance import driver, sdist  # noqa: E402


def main(argv=None):
    args = driver.arguments(__doc__.splitlines()[0], (1, 2, 3), "test module file names to "
                            "run, e.g. 'test_p2p_buf\\.py$'", 3600.0).parse_args(argv)
    try:
        testdir = sdist.test_dir()
    except sdist.SuiteUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    ok = True
    for nprocs in args.nprocs or (1, 2, 3):
        report = driver.run(nprocs, testdir, args.include, args.timeout)
        print(report.text(), flush=True)
        ok = ok and report.ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
