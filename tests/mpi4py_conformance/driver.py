"""Run a unittest suite under mpiexec at one world size and report the outcome.

It serves both conformance runs: mpi4py's test suite through mcr.MPI (worker.py here) and torch's
``DistributedTest`` on the "mcr" backend (tests/torch_conformance/worker.py). One job runs every
selected test, each rank recording each test's outcome as it ends. A test that crashes the job or
stops it making progress is reported as a crash or a hang, and the tests after it run again in a new
job (for mpi4py's suite, the rest of a hung test's module is reported as not run: each hang costs
the stall timeout). A test passes when it passes (or is skipped) on every rank.

At one process, some of mpi4py's process-local modules (``ONE_PROCESS`` in exclusions.py; those
of ``APART``) run beside the job, in a process started without mpiexec (MPI's singleton
initialization): on 2 cores the size takes the time of the longer part, not of both.
"""

import argparse
import atexit
import contextlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for mpiharness

import mcr  # noqa: E402
from mcr import launch as mcr_launch  # noqa: E402
from mpiharness import jsonl_bytes, mpi_env_in, read_jsonl  # noqa: E402

from mpi4py_conformance.exclusions import EXCLUSIONS, MPICH_ONLY, ONE_PROCESS  # noqa: E402

# a test that records nothing for this long on every rank is taken as hung
STALL_TIMEOUT = float(os.environ.get("MCR_CONFORMANCE_STALL_TIMEOUT", "60"))
TRACEBACK_LINES = 12
# the process-local modules run beside the job at one process: test_util_dtlib (mpi4py's own
# Python, about 40 % of the time at one process) and test_pack, so that the two parts take about
# as long (test_datatype, about 20 %, runs in the job)
APART = ("test_util_dtlib", "test_pack")


class Outcome:
    """One test's outcome over all ranks."""

    def __init__(self, test, kind, detail="", ranks=(), seconds=0.0, gate=None):
        self.test, self.kind, self.detail = test, kind, detail
        self.ranks, self.seconds = sorted(ranks), seconds
        self.gate = gate    # torch's suite: the backend name its gates were read for

    @property
    def module(self):
        return self.test.split(".")[0]


class Report:
    """The outcome of every selected test at one world size."""

    def __init__(self, nprocs, title):
        self.nprocs, self.title = nprocs, title
        self.outcomes = {}          # test id -> Outcome, in running order
        self.excluded = []
        self.fixture_errors = []    # setUpClass/setUpModule errors (no test id of their own)
        self.jobs, self.seconds = 0, 0.0
        self.apart = []             # the modules run beside the job, without mpiexec

    def merged(self, other, seconds):
        """This report with the outcomes of `other` (the process-local modules, run beside this
        one's job) added; `seconds`: the time both took."""
        for test, outcome in other.outcomes.items():
            self.outcomes[test + " (beside the job)" * (test in self.outcomes)] = outcome
        self.apart = sorted({o.module for o in other.outcomes.values()})
        self.excluded += other.excluded
        self.fixture_errors += other.fixture_errors
        self.jobs, self.seconds = self.jobs + other.jobs, seconds
        return self

    def count(self, kind):
        return sum(1 for o in self.outcomes.values() if o.kind == kind)

    @property
    def ran(self):
        return len(self.outcomes) - self.count("skip")

    @property
    def ok(self):
        """Every test that ran passed, no set-up failed, no crash, no hang."""
        return self.count("pass") == self.ran and not self.fixture_errors

    def figures(self):
        return (f"collected {len(self.outcomes)}, passed {self.count('pass')}, failed "
                f"{self.count('fail')}, errors {self.count('error')}, skipped "
                f"{self.count('skip')}, excluded {len(self.excluded)}, crashes "
                f"{self.count('crash')}, hangs {self.count('hang')}")

    def text(self, per_module=True, max_failures=200):
        ran = self.ran
        rate = 100.0 * self.count("pass") / ran if ran else 100.0
        lines = [f"{self.title} at {self.nprocs} process{'es' if self.nprocs > 1 else ''}: "
                 f"{self.seconds:.0f} s, {self.jobs} job{'s' if self.jobs > 1 else ''}",
                 self.figures(),
                 f"passed {self.count('pass')} of the {ran} tests that ran ({rate:.1f}%; "
                 f"every one must pass, 0 crashes, 0 hangs): {'OK' if self.ok else 'FAIL'}"]
        if self.apart:
            lines.insert(1, f"({', '.join(self.apart)} in a process of their own beside the "
                         "job, started without mpiexec)")
        if per_module:
            lines.append(self.module_table())
        # crashes and hangs first: they are what a long list would hide
        bad = [o for kinds in (("crash", "hang"), ("fail", "error"))
               for o in self.outcomes.values() if o.kind in kinds] + self.fixture_errors
        for o in bad[:max_failures]:
            lines.append(f"{o.kind.upper()}: {o.test} (ranks {','.join(map(str, o.ranks))})")
            detail = o.detail.strip().splitlines()
            # a crash or hang: what happened, then the end of the job's output (the stack it
            # died in); a failure: the test's own line, then the frames that raised and the error
            head = 2 if o.kind in ("crash", "hang") else 3
            if len(detail) > TRACEBACK_LINES + head:
                detail = detail[:head] + ["..."] + detail[-TRACEBACK_LINES:]
            lines += ["    " + line for line in detail]
        if len(bad) > max_failures:
            lines.append(f"... and {len(bad) - max_failures} more")
        return "\n".join(lines)

    def module_table(self):
        modules = {}
        for o in self.outcomes.values():
            row = modules.setdefault(o.module, {"seconds": 0.0})
            row[o.kind] = row.get(o.kind, 0) + 1
            row["seconds"] += o.seconds
        for test in self.excluded:
            row = modules.setdefault(test.split(".")[0], {"seconds": 0.0})
            row["excluded"] = row.get("excluded", 0) + 1
        kinds = ("pass", "fail", "error", "skip", "excluded", "crash", "hang")
        rows = [f"  {'module':<24}" + "".join(f"{k:>9}" for k in kinds) + f"{'seconds':>9}"]
        rows += [f"  {name:<24}" + "".join(f"{row.get(k, 0):>9}" for k in kinds)
                 + f"{row['seconds']:>9.1f}" for name, row in modules.items()]
        return "\n".join(rows)


def read_records(outdir, nprocs):
    """Each rank's list of records (an empty list for a rank that wrote none)."""
    return [read_jsonl(os.path.join(outdir, f"rank{rank}.jsonl")) for rank in range(nprocs)]


@contextlib.contextmanager
def alone(argv, env, log):
    """``argv`` as one process started without mpiexec (MPI's singleton initialization), as
    :func:`mcr.launch.start` starts a job; stopped on leaving the block if it still runs."""
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    atexit.register(process.kill)
    try:
        yield types.SimpleNamespace(process=process)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        atexit.unregister(process.kill)


def launch(nprocs, worker, outdir, selection, log_path, deadline, stall, path=()):
    """Run one job of ``worker + [OUTDIR, SELECTION]``; return (exit code or None when
    killed as hung, output). ``path``: folders for the ranks' PYTHONPATH; `nprocs` None: one
    process without mpiexec (:func:`alone`)."""
    selection_path = os.path.join(outdir, "selection.json")
    with open(selection_path, "w", encoding="utf-8") as f:
        json.dump(selection, f)
    env = mpi_env_in(outdir)
    # mcr from wherever this process imports it (an in-place build on PYTHONPATH, or
    # installed), and the folders the worker names
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*path, env.get("PYTHONPATH")]))
    argv = [sys.executable, *worker, outdir, selection_path]
    with open(log_path, "w") as log, \
            alone(argv, env, log) if nprocs is None else \
            mcr_launch.start(nprocs, argv, env=env, stdout=log, stderr=subprocess.STDOUT) as job:
        last, last_change = jsonl_bytes(outdir), time.monotonic()
        while True:
            try:
                code = job.process.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                now, current = time.monotonic(), jsonl_bytes(outdir)
            if current != last:
                last, last_change = current, now
            elif now - last_change > stall or now > deadline:
                code = None         # hung: the job is stopped on leaving the block
                break
    with open(log_path, errors="replace") as f:
        return code, f.read()


def run(nprocs, testdir, include=(), timeout=3600.0):
    """Run the mpi4py test modules of `testdir` (sdist.test_dir) whose file names match
    `include` (regexes, mpi4py's ``-i``; all if empty) at `nprocs` ranks, in `timeout` seconds
    with the reruns; return a Report."""
    title = f"mpi4py {importlib.metadata.version('mpi4py')} test suite through mcr.MPI"
    # the test directory on the path for the workers mpi4py.futures spawns (at one
    # process), which unpickle functions of the test modules
    mpich = "MPICH" in mcr.build_info()["mpi_library_version"]
    left_out = EXCLUSIONS + (MPICH_ONLY if mpich else []) + (ONE_PROCESS if nprocs > 1 else [])
    patterns = [pattern for pattern, _ in left_out]
    worker = [os.path.join(HERE, "worker.py"), testdir]
    if nprocs > 1:
        return run_suite(nprocs, Report(nprocs, title), worker, patterns, include, timeout,
                         path=[testdir])
    # at one process: the process-local modules (the selected ones) in a thread of their own
    local = [f"^{name}\\.py$" for name, _ in ONE_PROCESS if name in APART and (
             not include or any(re.search(regex, f"{name}.py") for regex in include))]
    apart, failed = Report(1, title), []

    def run_apart():
        try:
            run_suite(None, apart, worker, patterns, local, timeout, path=[testdir])
        except BaseException as exc:  # noqa: B902 - raised again in the caller's thread
            failed.append(exc)
    beside = threading.Thread(target=run_apart, name="mpi4py-local", daemon=True)
    start = time.monotonic()
    if local:
        beside.start()
    report = run_suite(1, Report(1, title), worker, patterns, include, timeout, path=[testdir],
                       extra={"exclude_modules": local})
    if local:
        beside.join()
    if failed:
        raise failed[0]
    return report.merged(apart, time.monotonic() - start)


def run_suite(nprocs, report, worker, patterns, include=(), timeout=3600.0,
              stall=STALL_TIMEOUT, hang_skips_module=True, path=(), extra=None):
    """Run a worker's tests at `nprocs` ranks (None: one process without mpiexec), again after each
    crash or hang, until every selected test has an outcome; fill and return `report`. `worker`:
    the worker script and its first arguments (OUTDIR and SELECTION follow; see worker.py);
    `patterns`: test ids to leave out; `stall`: seconds without a record on any rank after which
    the job is taken as hung; `hang_skips_module`: after a hang, report the rest of its module
    as not run; `extra`: more fields for the SELECTION file."""
    order, done, include = None, set(), list(include)
    start = time.monotonic()
    deadline, everyone = start + timeout, set(range(nprocs or 1))
    while True:
        with tempfile.TemporaryDirectory(prefix="mcr-conformance-") as outdir:
            selection = {"include": include, "exclude": patterns, "skip": sorted(done),
                         **(extra or {})}
            code, output = launch(nprocs, worker, outdir, selection,
                                  os.path.join(outdir, "job.log"), deadline, stall, path)
            per_rank = read_records(outdir, nprocs or 1)
        report.jobs += 1
        kind = "hang" if code is None else "crash"
        finished = code is not None and all(
            records and records[-1].get("event") == "done" for records in per_rank)
        collected = next((r for records in per_rank for r in records
                          if r["event"] == "collected"), None)
        if collected is None:
            # died before choosing its tests: nothing to attribute it to
            report.outcomes["<start-up>"] = Outcome(
                "<start-up>", kind, f"the job {describe_exit(code, stall)} before running any test"
                f"\n--- job output (tail) ---\n{output[-4000:]}", everyone)
            break
        if order is None:
            order, report.excluded = list(collected["tests"]), list(collected["excluded"])
        pending = [t for t in collected["tests"] if t not in done]
        ends, starts = {}, {}
        for rank, records in enumerate(per_rank):
            for r in records:
                if r["event"] == "start":
                    starts.setdefault(r["test"], set()).add(rank)
                elif r["event"] == "end" and r.get("fixture"):
                    report.fixture_errors.append(
                        Outcome(r["test"], r["outcome"], r["detail"], [rank]))
                elif r["event"] == "end":
                    ends.setdefault(r["test"], {})[rank] = r
        for test in pending:
            if set(ends.get(test, {})) == everyone:
                report.outcomes[test] = combine(test, ends[test])
                done.add(test)
        if finished:
            for test in pending:
                if test not in done:  # a setUpClass/setUpModule failed on some rank
                    report.outcomes[test] = Outcome(
                        test, "error", "did not run: a class or module fixture failed "
                        "(see the setUpClass/setUpModule error)",
                        everyone - set(ends.get(test, {})))
                    done.add(test)
            break
        unfinished = [t for t in pending if t not in done]
        culprit = next((t for t in unfinished if starts.get(t, set()) - set(ends.get(t, {}))),
                       unfinished[0] if unfinished else None)
        if culprit is None:
            report.outcomes["<shutdown>"] = Outcome(
                "<shutdown>", kind, f"the job {describe_exit(code, stall)} after its last test"
                f"\n--- job output (tail) ---\n{output[-4000:]}", everyone)
            break
        running = sorted(starts.get(culprit, set()) - set(ends.get(culprit, {})))
        report.outcomes[culprit] = Outcome(
            culprit, kind, f"the job {describe_exit(code, stall)} while this test ran on ranks "
            f"{running}\n--- job output (tail) ---\n{output[-3000:]}", running or everyone)
        done.add(culprit)
        if kind == "hang" and hang_skips_module:
            # a hang costs the stall timeout each time: the rest of its module is not run
            for test in unfinished:
                if test not in done and test.split(".")[0] == culprit.split(".")[0]:
                    report.outcomes[test] = Outcome(
                        test, "error", f"not run: {culprit} hung before it", everyone)
                    done.add(test)
        if time.monotonic() > deadline:
            for test in unfinished:
                if test not in done:
                    report.outcomes[test] = Outcome(test, "hang", "not run: the conformance "
                                                    f"run's {timeout:.0f} s were spent", everyone)
            break
        # the rest again, reading only the modules that still have tests to run
        modules = sorted({t.split(".")[0] for t in unfinished if t not in done})
        if not modules:
            break
        if hang_skips_module:
            include = [f"^{m}\\.py$" for m in modules]
    if order is not None:  # report in running order
        report.outcomes = {t: report.outcomes[t] for t in
                           [t for t in order if t in report.outcomes] +
                           [t for t in report.outcomes if t not in set(order)]}
    report.seconds = time.monotonic() - start
    return report


def arguments(description, sizes, include_help, timeout):
    """The command line of a conformance run.py: ``-n`` and ``-i`` (repeatable), ``--timeout``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-n", "--nprocs", type=int, action="append",
                        help=f"world size (repeat for several; default "
                             f"{', '.join(map(str, sizes[:-1]))} and {sizes[-1]})")
    parser.add_argument("-i", "--include", action="append", default=[], metavar="REGEX",
                        help=include_help)
    parser.add_argument("--timeout", type=float, default=timeout,
                        help="seconds for each run, reruns included")
    return parser


def describe_exit(code, stall=STALL_TIMEOUT):
    if code is None:
        return f"made no progress for {stall:.0f} s (killed)"
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def combine(test, per_rank):
    """One Outcome from each rank's end record of `test`."""
    kinds = {rank: r["outcome"] for rank, r in per_rank.items()}
    seconds = max(r.get("time", 0.0) for r in per_rank.values())
    for kind in ("fail", "error"):
        ranks = [rank for rank, k in kinds.items() if k == kind]
        if ranks:
            first = per_rank[ranks[0]]
            return Outcome(test, kind, first["detail"], ranks, seconds, first.get("gate"))
    first = next(iter(per_rank.values()))
    if all(k == "skip" for k in kinds.values()):
        return Outcome(test, "skip", first["detail"], kinds, seconds, first.get("gate"))
    return Outcome(test, "pass", "", kinds, seconds, first.get("gate"))
