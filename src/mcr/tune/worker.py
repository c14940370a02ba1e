"""The ranks of ``python -m mcr.tune``: time every collective on each backend,
check each result once, and (rank 0) merge the latencies into the tuning table.

Every backend runs on a duplicate of ``mcr.COMM_WORLD`` whose default backend
it is (its calls carry no ``backend=`` keyword, as in ``python -m
mcr.bench``); barriers, counts and averages go over a duplicate of mpi4py's
``COMM_WORLD``. Timing follows OSU: warm-up calls, a barrier, a loop of
back-to-back blocking calls, each rank's mean per call averaged over the
ranks. Each round visits every point (:mod:`~mcr.tune.schedule`), the
backends taking turns in an order that rotates every round, and the minimum
over rounds is kept (interference on a shared machine only ever adds time).
The first visit of a point checks each backend's result and probes how long
a call takes, from which rank 0 sets the iteration counts of every visit.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from mpi4py import MPI

import mcr
import mcr.backends
from mcr import tuning
from mcr._outputs import unwritable
from mcr.bench.ops import OPERATIONS, Case, buffer_maker

from .cli import DTYPE, ITEMSIZE, PROG, TUNED, existing_table, parse_args, save_merged
from .progress import Reporter
from .plot import show
from .report import size_text
from .schedule import Budget, Point, points

__all__ = ["main"]

PROBE = 2       # calls timed to estimate a call's duration


class _Failed(Exception):
    """A measurement went wrong; the message (rank 0 prints it) says where."""


def _parse(argv: Sequence[str] | None, rank: int) -> argparse.Namespace | int:
    """The options, or the exit status of a bad option (the message from rank 0 only)."""
    with contextlib.ExitStack() as stack:
        if rank:
            quiet = stack.enter_context(open(os.devnull, "w"))
            stack.enter_context(contextlib.redirect_stdout(quiet))
            stack.enter_context(contextlib.redirect_stderr(quiet))
        try:
            return parse_args(argv)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 2


def _served(args: argparse.Namespace) -> tuple[dict[str, list[str]], str | None]:
    """The backends measured on each device, or the error of a bad ``--backends``."""
    served: dict[str, list[str]] = {d: [] for d in args.devices}
    devices = ",".join(args.devices)
    for name in args.backends:
        backend = mcr.backends.get(name)
        reason = backend.unavailable()
        where = [d for d in args.devices if d in backend.devices]
        if args.backends_named and reason:
            return served, f"--backends {name}: {reason}"
        if args.backends_named and not where:
            kinds = " and ".join("CUDA" if d == "cuda" else "host (cpu)"
                                 for d in sorted(backend.devices))
            return served, (f"--backends {name}: it serves {kinds} buffers only, and "
                            f"--devices is {devices}")
        if reason is None:
            for d in where:
                served[d].append(name)
    for device, names in served.items():
        if not names:
            return served, (f"--devices {device}: none of the backends "
                            f"{', '.join(args.backends)} can serve {device} buffers here")
    return served, None


class _Tuner:
    """One rank's state: the options, communicators, buffers' device and budget."""

    def __init__(self, args: argparse.Namespace, control: MPI.Intracomm,
                 served: dict[str, list[str]], start: float) -> None:
        self.args, self.control, self.served = args, control, served
        self.rank, self.size = control.Get_rank(), control.Get_size()
        self.dtype = getattr(torch, DTYPE)
        self.comms: dict[str, mcr.Comm] = {}
        for name in dict.fromkeys(b for names in served.values() for b in names):
            comm = mcr.COMM_WORLD.Dup()
            comm.backend = name
            self.comms[name] = comm
        self.makes = {d: buffer_maker("torch-cuda" if d == "cuda" else "torch")
                      for d in args.devices}
        self.points = points(args.ops, args.devices, args.sizes)
        loops = sum(len(served[p.device]) for p in self.points) * args.rounds
        self.budget = Budget(args.time_budget, loops, len(self.points) * args.rounds, start)
        deadline = start + args.time_budget if args.time_budget is not None else None
        self.progress = Reporter(loops, self.rank == 0, deadline, args.progress_file)
        # seconds per call of each backend at each point, from the first round
        self.probes: dict[Point, dict[str, float]] = {}

    def free(self) -> None:
        for comm in self.comms.values():
            comm.Free()

    @staticmethod
    def _sync(device: str) -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def _loop(self, call: Callable[[], None], n: int, device: str) -> float:
        perf_counter = time.perf_counter
        t0 = perf_counter()
        for _ in range(n):
            call()
        self._sync(device)
        return perf_counter() - t0

    def _first(self, where: str, point: Point, case: Case, call: Callable[[], None],
               corrupt: bool) -> None:
        """One checked call on every rank.

        Raises
        ------
        _Failed
            On every rank, when the result is wrong or the call raised on some rank.
        """
        try:
            call()
            self._sync(point.device)
            if corrupt:
                case.corrupt()
            problem = case.check()
            if problem:
                problem = f"wrong result: {problem}"
        except Exception as exc:        # noqa: BLE001 - reported on rank 0, then status 1
            problem = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        problems = [p for p in self.control.allgather(problem) if p]
        if problems:
            raise _Failed(f"{where}: {problems[0]}")

    def visit(self, point: Point, rnd: int, best: dict[str, float]) -> None:
        """Round ``rnd`` of ``point``: time one loop per backend serving its
        device (in the first round, after checking each result and probing
        each call's duration), keeping in ``best`` the smallest rank-averaged
        mean per call (us).

        Raises
        ------
        _Failed
            When a result is wrong or a call fails.
        """
        t0 = time.perf_counter()
        spec, backends = OPERATIONS[point.op], self.served[point.device]
        count = max(1, point.nbytes // ITEMSIZE)
        cases = {b: spec.setup(self.comms[b], count, self.dtype, self.makes[point.device])
                 for b in backends}
        calls = {b: cases[b].run("blocking") for b in backends}
        looping = 0.0
        try:
            if point not in self.probes:
                for b in backends:
                    where = (f"{TUNED[point.op]} on {point.device}, backend {b}, "
                             f"{point.nbytes} bytes")
                    corrupt = self.args.inject_wrong_result == self.rank and b == backends[0]
                    self._first(where, point, cases[b], calls[b], corrupt)
                self.probes[point] = {b: self._loop(calls[b], PROBE, point.device) / PROBE
                                      for b in backends}
            now = time.perf_counter()
            mine = {b: self.budget.counts(point.nbytes, self.probes[point][b], now)
                    for b in backends} if self.rank == 0 else None
            counts: dict[str, tuple[int, int]] = self.control.bcast(mine, root=0)
            k = rnd % len(backends)           # the backends take turns going first
            for b in backends[k:] + backends[:k]:
                iters, warmup = counts[b]
                t = time.perf_counter()
                self._loop(calls[b], warmup, point.device)
                self.control.Barrier()
                per_call = self._loop(calls[b], iters, point.device) / iters * 1e6
                looping += time.perf_counter() - t
                mean = self.control.allreduce(per_call, op=MPI.SUM) / self.size
                best[b] = min(best[b], mean)
        finally:
            for case in cases.values():
                case.close()
        self.budget.done(len(backends), time.perf_counter() - t0, looping)

    def run(self) -> dict[Point, dict[str, float]]:
        """Measure every point in every round; the latencies (us) by point and backend.

        Raises
        ------
        _Failed
            When a result is wrong or a call fails.
        """
        best = {p: {b: math.inf for b in self.served[p.device]} for p in self.points}
        rounds = self.args.rounds
        try:
            for rnd in range(rounds):
                for point in self.points:
                    self.visit(point, rnd, best[point])
                    op = TUNED[point.op]
                    size = f" {size_text(point.nbytes)} B" if point.op != "barrier" else ""
                    self.progress.step(f"{op} {point.device}{size}, round {rnd + 1}/{rounds}",
                                       f"round {rnd + 1}/{rounds}, {op} {point.device}",
                                       len(self.served[point.device]))
        finally:
            self.progress.close()
        return best


def _machine(world_size: int, ppn: int, table: tuning.Table) -> dict[str, Any]:
    """The table's ``machine`` block: this host, MPI, torch, the processes and
    the devices the table has entries for."""
    # Open MPI ends the string with a NUL
    version = MPI.Get_library_version().replace("\0", "").strip().splitlines()
    return {"host": socket.gethostname(), "mpi": version[0].strip() if version else "?",
            "torch": torch.__version__, "mcr": mcr.__version__,
            "world_size": world_size, "ppn": ppn,
            "devices": [d for d in tuning.DEVICES if any(e.device == d for e in table.entries)]}


def _say(rank: int, text: str) -> None:
    if rank == 0:
        print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run as one rank of a tuning job (under mpiexec).

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after ``python -m mcr.tune`` (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The same on every rank: 0 done, 1 a wrong result or a failed
        measurement (rank 0 says which), 2 a bad option or an unusable
        ``--out`` file.
    """
    start = time.perf_counter()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    args = _parse(argv, rank)
    if isinstance(args, int):
        return args
    given = list(sys.argv[1:] if argv is None else argv)
    if rank == 0 and args.nprocs != size and any(a.startswith(("-n", "--nprocs"))
                                                 for a in given):
        print(f"{PROG}: note: -n {args.nprocs} is ignored under mpiexec ({size} ranks)",
              file=sys.stderr, flush=True)
    out = args.out or tuning.cache_path(size)
    # rank 0 decides what is measured; a problem stops every rank before measuring
    problem: str | None = None
    served: dict[str, list[str]] = {}
    if rank == 0:
        unusable = unwritable(out, make_folder=True, replace=True)
        try:
            if unusable:
                problem = f"--out {out}: {unusable}"
            else:
                existing_table(out, size)
                served, problem = _served(args)
        except tuning.TuningError as exc:
            problem = f"--out: {exc}"
    problem, served = world.bcast((problem, served), root=0)
    if problem:
        _say(rank, problem)
        return 2
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    ppn, local_rank = local.Get_size(), local.Get_rank()
    local.Free()
    if "cuda" in args.devices:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    control = world.Dup()
    tuner = _Tuner(args, control, served, start)
    status = 0
    try:
        results = tuner.run()
    except _Failed as exc:
        _say(rank, str(exc))
        status = 1
    if status == 0 and rank == 0:
        measured = tuning.Table()
        for point, latency in results.items():
            measured.add(TUNED[point.op], point.device, point.nbytes, latency)
        measured.machine = _machine(size, ppn, measured)
        status = _write(measured, out, args, size)
    status = control.bcast(status, root=0)
    tuner.free()
    control.Free()
    return int(status)


def _write(measured: tuning.Table, out: str, args: argparse.Namespace, world_size: int) -> int:
    """Rank 0: merge what was measured into the table at ``out`` as it is now
    (another run may have saved it meanwhile) and, unless the launching
    process does (``--progress-file``), show it; the status."""
    try:
        table = save_merged(measured, out, world_size)
    except tuning.TuningError as exc:
        print(f"{PROG}: error: --out: {exc}; nothing was saved", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:
        print(f"{PROG}: error: --out {out}: cannot write the table: "
              f"{exc.strerror or exc}", file=sys.stderr, flush=True)
        return 1
    return show(table, args, out) if args.progress_file is None else 0
