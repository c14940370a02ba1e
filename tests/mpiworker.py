"""Runs the MPI cases of a plan on this rank (see mpiharness.py): ``mpiworker.py RESULT_DIR``.

RESULT_DIR/plan.json lists ``[module path, case name]`` pairs. Each rank writes
RESULT_DIR/rank<N>.jsonl: a line before each case and its outcome after it, flushed at once,
so that the harness knows which case a crash or hang was in. On SIGUSR1 it writes the Python
stack of each of its threads to RESULT_DIR/rank<N>.stacks, whose process id is in rank<N>.pid:
the harness asks for them before it kills a hung job. With ``$MCR_TEST_COVERAGE``, it also
records what the cases call (:class:`Coverage`, conftest.py).
"""

import contextlib
import faulthandler
import importlib.util
import json
import os
import signal
import sys
import time


def load(path):
    """Import the test module at `path` (once; under a name of its own)."""
    name = "mcr_case_" + os.path.splitext(os.path.basename(path))[0]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def dtype_of(args):
    """The element type of a call's first buffer argument ("-": none)."""
    for arg in args:
        if isinstance(arg, (list, tuple)) and arg:
            arg = arg[0]
        dtype = getattr(arg, "dtype", None)
        if dtype is not None:
            return str(dtype).removeprefix("torch.")
    return "-"


class Coverage:
    """The (operation, form, backend, element type) of every buffer call, through a call
    hook, appended to a file of this process in ``$MCR_TEST_COVERAGE`` after each case."""

    def __init__(self, folder, size):
        import mcr.hooks
        os.makedirs(folder, exist_ok=True)          # (the README's command names a new folder)
        self.path = os.path.join(folder, f"calls-{os.getpid()}.jsonl")
        self.size, self.seen, self.written = size, set(), set()
        self.hooks = mcr.hooks

    def during(self, module):
        """The hook, installed for one case of `module`; none for a module that checks the
        interceptor chain itself (``CHAIN_UNDER_TEST = True``), as it would be in that chain."""
        if getattr(module, "CHAIN_UNDER_TEST", False):
            return contextlib.nullcontext()
        return self.hooks.installed(self.record)

    def record(self, call):
        self.seen.add((call.op, call.form, call.backend, dtype_of(call.args)))

    def flush(self):
        new = self.seen - self.written
        if new:
            with open(self.path, "a") as f:
                for combination in sorted(new):
                    f.write(json.dumps(list(combination) + [self.size]) + "\n")
            self.written |= new


def main():
    outdir = sys.argv[1]
    with open(os.path.join(outdir, "plan.json")) as f:
        plan = json.load(f)
    import mcr
    from mpi4py import MPI

    from mpiharness import format_exception
    world, comm = MPI.COMM_WORLD, mcr.COMM_WORLD
    folder = os.environ.get("MCR_TEST_COVERAGE")
    coverage = Coverage(folder, world.Get_size()) if folder else None
    between = world.Dup()          # mpi4py's own, not mcr's: no interceptor sees it
    rank = world.Get_rank()
    stacks = open(os.path.join(outdir, f"rank{rank}.stacks"), "w")   # open while it lives
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    with open(os.path.join(outdir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    with open(os.path.join(outdir, f"rank{rank}.jsonl"), "w") as out:
        for path, name in plan:
            out.write(json.dumps({"module": path, "case": name}) + "\n")
            out.flush()
            start = time.perf_counter()
            try:
                module = load(path)
                with coverage.during(module) if coverage else contextlib.nullcontext():
                    module._mpi_cases[name](comm)
                rec = {"module": path, "case": name, "ok": True}
            except BaseException as exc:  # noqa: B902 - report everything, keep going
                rec = {"module": path, "case": name, "ok": False,
                       "error": format_exception(exc)}
            rec["seconds"] = round(time.perf_counter() - start, 3)
            if coverage is not None:
                coverage.flush()
            # the outcome first: a rank that failed alone waits below for the others, which
            # may wait for it in a collective of the case; the harness stops such a job soon
            out.write(json.dumps(rec) + "\n")
            out.flush()
            # keep ranks in step between cases, on a communicator no case uses (a barrier on
            # COMM_WORLD could meet a collective of the case on a rank that is still in it)
            request = between.Ibarrier()
            while not request.Test():       # asleep, not spinning: the core goes to the
                time.sleep(0.0005)          # ranks still in the case (more ranks than cores)


if __name__ == "__main__":
    main()
