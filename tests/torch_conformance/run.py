"""Run torch's DistributedTest on "mcr" and on torch's Gloo, and print the comparison.

    python tests/torch_conformance/run.py -n 2 [-i REGEX ...] [--no-baseline]

Exits with status 1 when a test that ran on "mcr", or passes on Gloo, does not pass on "mcr".
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torch_conformance import report  # noqa: E402


def main(argv=None):
    parser = report.driver.arguments(__doc__.splitlines()[0], (2, 3),
                                     "test names to run, e.g. 'all_gather'", 1800.0)
    parser.add_argument("--no-baseline", action="store_true",
                        help="run 'mcr' only (the Gloo column stays empty)")
    args = parser.parse_args(argv)
    ok = True
    for nprocs in args.nprocs or (2, 3):
        mcr = report.run(nprocs, "mcr", args.include, args.timeout)
        gloo = report.driver.Report(nprocs, "(not run)") if args.no_baseline else \
            report.run(nprocs, "gloo", args.include, args.timeout)
        comparison = report.Comparison(mcr, gloo)
        print(comparison.text(), flush=True)
        ok = ok and comparison.ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
