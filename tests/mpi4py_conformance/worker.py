"""One rank of a conformance job: mpi4py's test suite with mcr.MPI as mpi4py.MPI.

Started by driver.py under mpiexec (or alone: driver.alone) as ``python worker.py TESTDIR OUTDIR
SELECTION``. SELECTION is a JSON file: ``include`` (regexes of test module file names), ``exclude``
(patterns of test ids, see exclusions.py; ``arrayimpl.<class>`` drops that array type from the
buffer tests' loops), ``skip`` (test ids run by an earlier job) and, optionally, ``exclude_modules``
(regexes of test module file names to leave unloaded: they run in another process). Each rank writes
``OUTDIR/rank<N>.jsonl``: the test ids it selected and excluded, then a "start" and an "end" line
around each test as it happens, so that the driver knows which test a crash or hang was in.
"""

import faulthandler
import fnmatch
import json
import os
import sys
import time
import unittest


def excluded(test_id, patterns):
    return any(test_id == p or test_id.startswith(p + ".") or fnmatch.fnmatchcase(test_id, p)
               for p in patterns)


def flatten(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from flatten(item)
        else:
            yield item


class Recorder:
    """Appends one JSON line per event to this rank's file, flushed at once."""

    def __init__(self, path):
        self.file = open(path, "a", encoding="utf-8")

    def write(self, **record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


class Outcome:
    """A unittest result's methods keeping the running test's ``kind`` and ``detail``: its
    first failure or error, else a skip, else a pass."""
    kind, detail = "pass", ""

    def _note(self, test, kind, detail):
        if self.kind in ("pass", "skip"):
            self.kind, self.detail = kind, detail

    def addError(self, test, err):
        super().addError(test, err)
        self._note(test, "error", self._exc_info_to_string(err, test))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._note(test, "fail", self._exc_info_to_string(err, test))

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self._note(test, kind, f"{subtest}\n" + self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        if isinstance(test, unittest.TestCase) and self.kind == "pass":
            self.kind, self.detail = "skip", reason

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._note(test, "fail", "unexpected success of a test marked expectedFailure")


def recording_result(recorder):
    """A TextTestResult class that also records every test's outcome."""

    class RecordingResult(Outcome, unittest.TextTestResult):
        def startTest(self, test):
            super().startTest(test)
            self.kind, self.detail, self._started = "pass", "", time.perf_counter()
            recorder.write(event="start", test=test.id())

        def stopTest(self, test):
            super().stopTest(test)
            recorder.write(event="end", test=test.id(), outcome=self.kind, detail=self.detail,
                           time=round(time.perf_counter() - self._started, 4))

        def _note(self, test, kind, detail):
            if isinstance(test, unittest.TestCase):
                super()._note(test, kind, detail)
            else:  # a setUpModule/setUpClass/tearDownClass error: no start/stop around it
                recorder.write(event="end", test=str(test), outcome=kind, detail=detail,
                               time=0.0, fixture=True)
    return RecordingResult


def main():
    testdir, outdir, selection_path = sys.argv[1:4]
    with open(selection_path, encoding="utf-8") as f:
        selection = json.load(f)
    faulthandler.enable()
    # mcr.MPI in place of mpi4py.MPI, before any test module imports it: the tests' `from
    # mpi4py import MPI` reads the package attribute, so they get mcr.MPI, as a ported
    # program does. sys.modules keeps mpi4py's own module, as in a ported program: pickle
    # finds mpi4py's classes there by name.
    import mpi4py
    from mcr import MPI as mcr_MPI
    mpi4py.MPI = mcr_MPI
    sys.path.insert(0, testdir)
    os.chdir(testdir)
    import main as mpi4py_main  # mpi4py's test/main.py

    patterns = [p for p in selection["exclude"] if not p.startswith("arrayimpl.")]
    import arrayimpl  # mpi4py's array types, looped over by the buffer tests
    arrayimpl.ArrayBackends[:] = [cls for cls in arrayimpl.ArrayBackends
                                  if f"arrayimpl.{cls.__name__}" not in selection["exclude"]]
    rank = mcr_MPI.COMM_WORLD.Get_rank()
    recorder = Recorder(os.path.join(outdir, f"rank{rank}.jsonl"))
    skip = set(selection["skip"])

    class Program(mpi4py_main.TestProgram):
        def createTests(self, from_discovery=False, Loader=None):
            super().createTests(from_discovery, Loader)
            chosen, dropped = [], []
            for test in flatten(self.test):
                if test.id() not in skip:
                    (dropped if excluded(test.id(), patterns) else chosen).append(test)
            recorder.write(event="collected", tests=[t.id() for t in chosen],
                           excluded=[t.id() for t in dropped])
            self.test = unittest.TestSuite(chosen)

        def runTests(self):
            unittest.TextTestRunner(stream=sys.stderr, verbosity=0,
                                    resultclass=recording_result(recorder)).run(self.test)
            recorder.write(event="done")

    Program(module=None, argv=["mpi4py-test"]
            + [a for regex in selection["include"] for a in ("-i", regex)]
            + [a for regex in selection.get("exclude_modules", ()) for a in ("-e", regex)],
            exit=False)


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    main()
