"""One rank of a torch conformance job: torch's ``DistributedTest`` on one default group.

Started by tests/mpi4py_conformance/driver.py under mpiexec as ``python worker.py OUTDIR
SELECTION``. SELECTION is a JSON file: ``backend`` (the group under test, "mcr" or "gloo"),
``gates`` (the backends whose skip decorators a test is tried under, in order), ``include``
(regexes of test names), ``exclude`` (see exclusions.py) and ``skip`` (ids run by an earlier
job). The processes are MPI's; the default group is made as a user's program makes it, and
again after each test that ran. torch's test bodies run unchanged: this file supplies what
``TestDistBackend`` does (``rank``, ``world_size``, its file barrier's directory) and maps
torch's skip exit codes to skips. The module is imported once per gate (its skip decorators
read ``BACKEND`` at import); a test every rank skips under one gate is tried under the next,
and its record names the gate it ran under (MPI's from 3 processes on: their subgroups need 3).
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

from mpi4py_conformance.worker import Outcome, Recorder, excluded  # noqa: E402

TEST_ID = "distributed_test.{}"


def import_for_gate(gate, backend):
    """torch's distributed_test module, its decorators evaluated for ``gate``. Its bodies
    (and torch's run-time skips, see :func:`attempt`) see ``BACKEND`` as the backend under
    test for its own gate, as the gate's name for another (``if BACKEND == "gloo"``)."""
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


class Result(Outcome, unittest.TestResult):
    """One attempt's outcome; ``sys.exit`` with one of torch's skip codes is a skip."""

    def __init__(self, skip_codes):
        super().__init__()
        self.skip_codes = skip_codes

    def addError(self, test, err):
        if issubclass(err[0], SystemExit) and err[1].code in self.skip_codes:
            self._note(test, "skip", self.skip_codes[err[1].code])
        else:
            super().addError(test, err)


def attempt(name, cls, module, world, skip_codes):
    """Run test `name` once, with torch's view of the backend the module's, after resetting
    torch's file barrier (``Barrier.init`` on one rank deletes the other ranks' files)."""
    os.environ["BACKEND"] = module.BACKEND
    if world.Get_rank() == 0:
        barrier = os.path.join(os.environ["TEMP_DIR"], "barrier")
        for entry in os.listdir(barrier):
            os.unlink(os.path.join(barrier, entry))
    world.Barrier()
    module.Barrier.barrier_id = 0
    result = Result(skip_codes)
    cls(name).run(result)
    return result


def main():
    outdir, selection_path = sys.argv[1:3]
    with open(selection_path, encoding="utf-8") as f:
        selection = json.load(f)
    faulthandler.enable()
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    recorder = Recorder(os.path.join(outdir, f"rank{rank}.jsonl"))
    # what TestDistBackend's set-up gives the tests: one temporary directory (its file
    # barrier, its lock file, the init file), shared by the ranks
    temp = world.bcast(tempfile.mkdtemp(prefix="mcr-torchdist-") if rank == 0 else None)
    if rank == 0:
        for sub in ("barrier", "test_dir", "init_dir"):
            os.makedirs(os.path.join(temp, sub), exist_ok=True)
    world.Barrier()
    os.environ.update(TEMP_DIR=temp, WORLD_SIZE=str(world.Get_size()), INIT_METHOD="env://")

    import mcr  # noqa: F401  (registers the "mcr" backend)
    import torch.distributed as dist
    from torch.testing._internal import common_distributed
    backend = selection["backend"]
    # "mcr" joins the feature sets torch's tests are gated on (DDP, subgroups, a plug-in)
    for feature in ("plugin", "ddp", "subgroup"):
        common_distributed.DistTestCases.backend_feature[feature].add("mcr")
    skip_codes = {skip.exit_code: skip.message for skip in common_distributed.TEST_SKIPS.values()}
    # torch runs its MPI tests at 3 processes (their subgroups need 3)
    gates = [gate for gate in selection["gates"] if gate != "mpi" or world.Get_size() >= 3]
    modules = {gate: import_for_gate(gate, backend) for gate in gates}
    classes = {gate: test_class(module, world) for gate, module in modules.items()}
    dist.init_process_group(backend)
    names = sorted(name for name in dir(classes[gates[0]]) if name.startswith("test_"))
    include = [re.compile(regex) for regex in selection["include"]]
    chosen, dropped = [], []
    for name in names:
        test_id = TEST_ID.format(name)
        if test_id not in selection["skip"] and (not include or any(r.search(name)
                                                                     for r in include)):
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
            # a fresh default group for the next test, as torch's harness gives each (a test
            # may leave it out of step on purpose: monitored_barrier with a missing rank)
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
