"""Run torch's ``DistributedTest`` on "mcr" and on torch's Gloo, and compare them.

"mcr" tries each test under the gates of "mcr", Gloo, then MPI (worker.py); Gloo is the
baseline. The comparison passes when every test that ran on "mcr" passed (no failure,
error, crash or hang) and every test that passed on Gloo passed on "mcr" too. Tests left
out are in exclusions.py; tests that skip for want of CUDA are counted apart.
"""

import collections
import importlib.metadata
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/

from mpi4py_conformance import driver  # noqa: E402

from torch_conformance.exclusions import EXCLUSIONS  # noqa: E402

GATES = {"mcr": ["mcr", "gloo", "mpi"], "gloo": ["gloo"]}
# a test that records nothing for this long is taken as hung (some of torch's tests wait
# on purpose: monitored_barrier and store timeouts of 10-30 s)
STALL_TIMEOUT = float(os.environ.get("MCR_TORCH_CONFORMANCE_STALL_TIMEOUT", "90"))
CUDA = re.compile(r"cuda|gpu|nccl|accelerator", re.IGNORECASE)


def run(nprocs, backend, include=(), timeout=1800.0):
    """torch's DistributedTest at `nprocs` ranks on the default group `backend` ("mcr" or
    "gloo"); a :class:`driver.Report`. `include`: regexes of test names."""
    title = f"torch {importlib.metadata.version('torch')} DistributedTest on {backend!r}"
    return driver.run_suite(
        nprocs, driver.Report(nprocs, title), [os.path.join(HERE, "worker.py")],
        [pattern for pattern, _ in EXCLUSIONS], include, timeout, stall=STALL_TIMEOUT,
        hang_skips_module=False, extra={"backend": backend, "gates": GATES[backend]})


def baseline_where_skipped(mcr, timeout=1800.0):
    """`mcr`'s report beside Gloo's run of only the tests `mcr` skipped: a test that ran on
    "mcr" passes or fails whatever Gloo does, so only a skipped one needs the baseline."""
    skipped = [test.split(".", 1)[-1] for test, o in mcr.outcomes.items() if o.kind == "skip"]
    gloo = (run(mcr.nprocs, "gloo", [f"^{re.escape(name)}$" for name in skipped], timeout)
            if skipped else driver.Report(mcr.nprocs, "(nothing to run)"))
    return Comparison(mcr, gloo, f", only the {len(skipped)} tests skipped on 'mcr'")


def needs_cuda(outcome):
    return outcome.kind == "skip" and bool(CUDA.search(outcome.detail + outcome.test))


class Comparison:
    """The "mcr" run beside the Gloo baseline, at one world size."""

    def __init__(self, mcr, gloo, baseline=""):
        self.mcr, self.gloo, self.baseline = mcr, gloo, baseline   # what the baseline ran

    def lost(self):
        """Tests that pass on Gloo and do not pass on "mcr" (excluded ones aside)."""
        return [test for test, o in self.gloo.outcomes.items() if o.kind == "pass"
                and test not in self.mcr.excluded
                and self.mcr.outcomes.get(test, driver.Outcome(test, "missing")).kind != "pass"]

    @property
    def ok(self):
        return self.mcr.ok and not self.lost()

    def figures(self, report):
        skips = [o for o in report.outcomes.values() if o.kind == "skip"]
        cuda = sum(1 for o in skips if needs_cuda(o))
        return (f"passed {report.count('pass')}, failed {report.count('fail')}, errors "
                f"{report.count('error')}, skipped {len(skips) - cuda} (+{cuda} that need "
                f"CUDA), excluded {len(report.excluded)}, crashes {report.count('crash')}, "
                f"hangs {report.count('hang')}; {report.seconds:.0f} s")

    def text(self, max_failures=100):
        m, g = self.mcr, self.gloo
        gates = collections.Counter(o.gate for o in m.outcomes.values()
                                    if o.kind != "skip" and o.gate and o.gate != "mcr")
        lost = self.lost()
        lines = [f"torch's DistributedTest at {m.nprocs} processes",
                 f"  torch's Gloo (baseline{self.baseline}): {self.figures(g)}",
                 f"  'mcr':                   {self.figures(m)}"]
        if gates:
            lines.append("  'mcr' ran " + ", ".join(f"{n} with {gate}'s gates"
                                                    for gate, n in sorted(gates.items())))
        lines += [f"  every test that ran on 'mcr' passed, and every test that passes on "
                  f"Gloo passes on 'mcr' ({len(lost)} do not): "
                  f"{'OK' if self.ok else 'FAIL'}", "",
                  f"  {'test':<72} {'gloo':>6} {'mcr':>6}  gate / reason"]
        for test in sorted(set(g.outcomes) | set(m.outcomes) | set(m.excluded)):
            go, mo = g.outcomes.get(test), m.outcomes.get(test)
            mk = "excl" if test in m.excluded else (mo.kind if mo else "-")
            why = ""
            if mo is not None and mo.kind == "skip":
                why = "CUDA: " if needs_cuda(mo) else ""
                why += mo.detail.strip().splitlines()[-1][:60] if mo.detail.strip() else ""
            elif mo is not None and mo.gate not in (None, "mcr"):
                why = f"{mo.gate}'s gate"
            lines.append(f"  {test.split('.', 1)[-1]:<72} {go.kind if go else '-':>6} "
                         f"{mk:>6}  {why}")
        bad = [o for o in m.outcomes.values() if o.kind in ("crash", "hang", "fail", "error")]
        bad += m.fixture_errors
        for o in bad[:max_failures]:
            lines.append(f"'mcr' {o.kind.upper()}: {o.test} (ranks "
                         f"{','.join(map(str, o.ranks))}; {o.gate}'s gates)")
            detail = o.detail.strip().splitlines()
            if len(detail) > 2 * driver.TRACEBACK_LINES:
                detail = detail[:4] + ["..."] + detail[-driver.TRACEBACK_LINES:]
            lines += ["    " + line for line in detail]
        for test in lost:
            lines.append(f"LOST: {test} passes on Gloo, on 'mcr' it is "
                         f"{m.outcomes[test].kind if test in m.outcomes else 'missing'}")
        return "\n".join(lines)
