"""One rank of a torch conformance job: torch's ``DistributedTest`` on one default group.

Started by tests/mpi4py_conformance/driver.py under mpiexec as ``python
worker.py OUTDIR SELECTION``. SELECTION is a JSON file: ``backend`` (the
process group under test, "mcr" or torch's "gloo"), ``gates`` (the backend
names whose skip decorators a test is tried under, in order), ``include``
(regexes of test names), ``exclude`` (patterns of test ids, see
exclusions.py) and ``skip`` (ids already run by an earlier job).

torch's own harness (``TestDistBackend``) starts fresh processes per test;
here the processes are MPI's, and the default group is made under mpiexec,
as a user's program makes it, and made again after each test that ran. torch's test bodies run unchanged:
this file supplies what ``TestDistBackend`` supplies (``rank``,
``world_size``, the temporary directory of its file barrier) and maps torch's
skip exit codes (``sys.exit(TEST_SKIPS[...])``) to skips.

torch's skip decorators read the module constant ``BACKEND`` when the module
is imported. The module is imported once per gate, with ``BACKEND`` set to
that name for the decorators, then set to the backend under test for the
bodies. A test all ranks skip under one gate is tried under the next, so a
test that torch runs for Gloo only, or for MPI only, runs on "mcr" with that
gate; its record names the gate it ran under (MPI's from 3 processes on,
the size torch runs its MPI tests at: their subgroups need 3).
"""

import faulthandler
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/

from mpi4py_conformance.worker import Recorder, excluded  # noqa: E402

TEST_ID = "distributed_test.{}"


def import_for_gate(gate, backend):
    """torch's distributed_test module, its decorators evaluated for ``gate``.

    Its bodies see ``BACKEND`` as the backend under test for its own gate, as
    the gate's name for another (they branch on it: ``if BACKEND == "gloo"``
    picks the CPU set-up), and so do torch's run-time skips, which read the
    environment's ``BACKEND`` (see :func:`attempt`)."""
    path = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    name = f"distributed_test_{gate}"
    os.environ["BACKEND"] = gate
    spec = importlib.util.spec_from_file_location(name, path.origin)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module     # pickle finds the tests' classes (torch.save of a model)
    spec.loader.exec_module(module)
    module.BACKEND = backend if gate == backend else gate
    return module


def test_class(module, world):
    """A TestCase of torch's ``_DistTestBase`` with what ``TestDistBackend`` gives it."""
    from torch.testing._internal.common_utils import TestCase

    class MPITestDist(module.DistributedTest._DistTestBase, TestCase):
        rank = world.Get_rank()
        world_size = str(world.Get_size())    # a string, as TestDistBackend has it
        file_name = os.path.join(os.environ["TEMP_DIR"], "init_dir", "shared_init_file")

        @property
        def init_method(self):
            return "file://" + self.file_name

    return MPITestDist


class Result(unittest.TestResult):
    """One attempt's outcome: pass, fail, error or skip, with its detail.
    ``sys.exit`` with one of torch's skip codes is torch's way to skip."""

    def __init__(self, skip_codes):
        super().__init__()
        self.skip_codes = skip_codes
        self.kind, self.detail = "pass", ""

    def _note(self, kind, detail):
        if self.kind in ("pass", "skip"):
            self.kind, self.detail = kind, detail

    def addError(self, test, err):
        if issubclass(err[0], SystemExit) and err[1].code in self.skip_codes:
            self._note("skip", self.skip_codes[err[1].code])
        else:
            self._note("error", self._exc_info_to_string(err, test))

    def addFailure(self, test, err):
        self._note("fail", self._exc_info_to_string(err, test))

    def addSubTest(self, test, subtest, err):
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self._note(kind, f"{subtest}\n" + self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        if self.kind == "pass":
            self.kind, self.detail = "skip", reason

    def addUnexpectedSuccess(self, test):
        self._note("fail", "unexpected success of a test marked expectedFailure")


def attempt(name, cls, module, world, skip_codes):
    """Run test `name` once, with torch's view of the backend the module's."""
    os.environ["BACKEND"] = module.BACKEND
    fresh_barrier(module, world)
    result = Result(skip_codes)
    cls(name).run(result)
    return result


def fresh_barrier(module, world):
    """Reset torch's file barrier (``Barrier.init`` on one rank: it deletes the
    other ranks' files) before a test."""
    if world.Get_rank() == 0:
        barrier = os.path.join(os.environ["TEMP_DIR"], "barrier")
        for name in os.listdir(barrier):
            os.unlink(os.path.join(barrier, name))
    world.Barrier()
    module.Barrier.barrier_id = 0


def main():
    outdir, selection_path = sys.argv[1:3]
    with open(selection_path, encoding="utf-8") as f:
        selection = json.load(f)
    faulthandler.enable()
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    recorder = Recorder(os.path.join(outdir, f"rank{rank}.jsonl"))
    recorder.write(event="pid", pid=os.getpid())  # for the driver, to kill a hung rank

    # what TestDistBackend's set-up gives the tests: one temporary directory
    # (its file barrier, its lock file, the init file), shared by the ranks
    temp = world.bcast(tempfile.mkdtemp(prefix="mcr-torchdist-") if rank == 0 else None)
    if rank == 0:
        for sub in ("barrier", "test_dir", "init_dir"):
            os.makedirs(os.path.join(temp, sub), exist_ok=True)
    world.Barrier()
    os.environ.update(TEMP_DIR=temp, WORLD_SIZE=str(world.Get_size()),
                      INIT_METHOD="env://")

    import mcr  # noqa: F401  (registers the "mcr" backend)
    import torch.distributed as dist
    from torch.testing._internal import common_distributed
    backend = selection["backend"]
    # "mcr" joins the feature sets torch's tests are gated on, as a backend
    # that supports DDP, subgroups and is a plug-in
    for feature in ("plugin", "ddp", "subgroup"):
        common_distributed.DistTestCases.backend_feature[feature].add("mcr")
    skip_codes = {skip.exit_code: skip.message
                  for skip in common_distributed.TEST_SKIPS.values()}
    # torch runs its MPI tests at 3 processes (their subgroups need 3)
    gates = [gate for gate in selection["gates"] if gate != "mpi" or world.Get_size() >= 3]
    modules = {gate: import_for_gate(gate, backend) for gate in gates}
    classes = {gate: test_class(module, world) for gate, module in modules.items()}

    dist.init_process_group(backend)

    names = sorted(name for name in dir(classes[gates[0]])
                   if name.startswith("test_"))
    include = [re.compile(regex) for regex in selection["include"]]
    chosen, dropped = [], []
    for name in names:
        test_id = TEST_ID.format(name)
        if test_id in selection["skip"] or (include and not any(r.search(name)
                                                                for r in include)):
            continue
        (dropped if excluded(test_id, selection["exclude"]) else chosen).append(name)
    recorder.write(event="collected", tests=[TEST_ID.format(n) for n in chosen],
                   excluded=[TEST_ID.format(n) for n in dropped])

    for name in chosen:
        test_id = TEST_ID.format(name)
        recorder.write(event="start", test=test_id)
        started = time.perf_counter()
        for gate in gates:
            result = attempt(name, classes[gate], modules[gate], world, skip_codes)
            # the next gate only when every rank skipped under this one
            if not world.allreduce(result.kind == "skip", op=MPI.LAND):
                break
        kind, detail = result.kind, result.detail   # a skip: the last gate's reason
        if kind != "skip":
            # a fresh default group for the next test, as torch's own harness
            # gives each test (a test may leave the group out of step on
            # purpose: monitored_barrier with a rank that never arrives)
            dist.destroy_process_group()
            dist.init_process_group(backend)
        recorder.write(event="end", test=test_id, outcome=kind, detail=detail, gate=gate,
                       time=round(time.perf_counter() - started, 4))
    recorder.write(event="done")
    world.Barrier()
    if rank == 0:
        shutil.rmtree(temp, ignore_errors=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    main()
