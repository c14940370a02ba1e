"""The ``python -m mcr.bench`` command: OSU Micro-Benchmarks on mcr, in OSU's format.

``mpiexec -n N python -m mcr.bench <name> [options]`` times one operation (or
several, one after the other) over a range of message sizes and prints a table
that scripts written for the OSU Micro-Benchmarks read: ``latency``
(``osu_latency``, ping-pong between ranks 0 and 1), ``bw`` (``osu_bw``,
windows of non-blocking sends) and every collective of
:data:`mcr.bench.ops.OPERATIONS`, blocking, non-blocking (with OSU's overlap
measurement) or persistent. The first iteration of every size is checked
against values computed independently; a wrong result ends the run on every
rank with status 1, a bad option with status 2 before anything is
communicated.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from mpi4py import MPI

import mcr
import mcr.backends
from mcr._core import TYPE_TABLE

from .ops import (FORMS, OPERATIONS, Case, Make, buffer_maker, fill, mismatch, numpy_dtype,
                  rank_values)

__all__ = ["main", "parse_args", "message_sizes", "NAMES"]

PROG = "python -m mcr.bench"
P2P = {"latency": "Latency", "bw": "Bandwidth"}
NAMES = tuple(P2P) + tuple(OPERATIONS)
BUFFERS = ("torch", "torch-cuda", "numpy")
# the element types torch has (the buffers are made as tensors): not long double
DTYPES = tuple(row[0] for row in TYPE_TABLE
               if isinstance(getattr(torch, row[0], None), torch.dtype))

# OSU's defaults: sizes above LARGE_MESSAGE bytes get fewer iterations
LARGE_MESSAGE = 8192
ITERATIONS, ITERATIONS_LARGE = 1000, 100
WARMUP, WARMUP_LARGE = 200, 10
MAX_MESSAGE = 1 << 20
WINDOW = 64                 # osu_bw's window of outstanding sends

SIZE_WIDTH, FIELD_WIDTH, ITER_WIDTH = 10, 18, 12    # OSU's columns: %-10d, %18.2f, %12d


# -- Options --------------------------------------------------------------------------

class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:   # argparse's NoReturn; raised instead
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="OSU-style benchmarks of mcr's communication, "
                "run under mpiexec; output in the OSU Micro-Benchmarks' format.",
                epilog=f"names: {', '.join(NAMES)}")
    p.add_argument("names", nargs="+", choices=NAMES, metavar="name",
                   help="latency, bw, or a collective (allreduce, gatherv, ...); several "
                        "names run one after the other, one table each")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--nonblocking", action="store_true",
                      help="time the I-form (post and Wait) and its overlap with computation")
    form.add_argument("--persistent", action="store_true",
                      help="time Start and Wait of a persistent request (<name>_init once "
                           "per size)")
    p.add_argument("-m", "--message-size", metavar="[MIN:]MAX",
                   help="message sizes in bytes, the powers of two from MIN to MAX "
                        f"(default 1:{MAX_MESSAGE}, 0:{MAX_MESSAGE} for latency)")
    p.add_argument("-i", "--iterations", type=int, metavar="ITER",
                   help=f"timed iterations per size (default {ITERATIONS}, "
                        f"{ITERATIONS_LARGE} above {LARGE_MESSAGE} bytes)")
    p.add_argument("-x", "--warmup", type=int, metavar="WARMUP",
                   help=f"warm-up iterations per size (default {WARMUP}, "
                        f"{WARMUP_LARGE} above {LARGE_MESSAGE} bytes)")
    p.add_argument("-f", "--full", action="store_true",
                   help="also print the minimum and maximum over ranks and the iterations")
    p.add_argument("-W", "--window-size", type=int, default=WINDOW, metavar="WINDOW",
                   help=f"bw: sends per window (default {WINDOW})")
    p.add_argument("--backend", default="mpi", choices=mcr.backends.names() + ("auto",),
                   help="the backend every timed call runs on (default mpi)")
    p.add_argument("--buffer", default="torch", choices=BUFFERS,
                   help="torch CPU tensors (default), CUDA tensors, or numpy arrays")
    p.add_argument("--dtype", default="float32", choices=DTYPES, metavar="DTYPE",
                   help=f"element type (default float32; one of {', '.join(DTYPES)})")
    # the test suite's way to exercise the wrong-result path end to end
    p.add_argument("--inject-wrong-result", type=int, metavar="RANK",
                   help=argparse.SUPPRESS)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line without communicating.

    Adds ``form`` (``"blocking"``, ``"nonblocking"`` or ``"persistent"``) and
    ``torch_dtype``.

    Raises
    ------
    _UsageError
        With the message to print for a bad option (exit status 2).
    """
    args = _parser().parse_args(argv)
    args.form = ("nonblocking" if args.nonblocking else
                 "persistent" if args.persistent else "blocking")
    assert args.form in FORMS
    args.torch_dtype = getattr(torch, args.dtype)
    problem = _check(args)
    if problem:
        raise _UsageError(problem)
    return args


def message_sizes(spec: str | None, smallest: int) -> list[int]:
    """The message sizes of ``-m [MIN:]MAX``: the powers of two in [MIN, MAX], and
    0 when MIN is 0.

    Raises
    ------
    ValueError
        For a malformed or empty range.
    """
    text = spec if spec is not None else f"{smallest}:{MAX_MESSAGE}"
    lo_text, sep, hi_text = text.rpartition(":")
    if not sep:
        lo_text = str(smallest)
    try:
        lo = int(lo_text) if lo_text.strip() else smallest
        hi = int(hi_text) if hi_text.strip() else MAX_MESSAGE
    except ValueError:
        raise ValueError(f"-m {text}: expected [MIN:]MAX in bytes, as 4:1024 or 1024") \
            from None
    if lo < 0 or hi < 0:
        raise ValueError(f"-m {text}: sizes must be >= 0")
    if lo > hi:
        raise ValueError(f"-m {text}: MIN {lo} is larger than MAX {hi}")
    sizes = [0] if lo == 0 else []
    size = 1
    while size <= hi:
        if size >= lo:
            sizes.append(size)
        size *= 2
    if not sizes:
        raise ValueError(f"-m {text}: no power of two between {lo} and {hi}")
    return sizes


def _sizes(args: argparse.Namespace, name: str) -> list[int]:
    """The message sizes of benchmark ``name`` in bytes: those of ``-m`` that hold
    whole elements (barrier: [0]).

    Raises
    ------
    ValueError
        For a bad ``-m``, or when no size holds one element.
    """
    sizes = message_sizes(args.message_size, 0 if name == "latency" else 1)
    if name == "barrier":
        return [0]
    itemsize = args.torch_dtype.itemsize
    # sizes below one element are skipped (latency: but for 0 bytes, as OSU)
    sizes = [s for s in sizes if s >= itemsize or (s == 0 and name == "latency")]
    if not sizes:
        raise ValueError(f"-m {args.message_size}: no message size holds one {args.dtype} "
                         f"element ({itemsize} bytes)")
    return sizes


def _check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, or None; nothing is communicated."""
    for name in args.names:
        if name in P2P and args.form != "blocking":
            return (f"--{args.form} applies to the collectives; {name} has one form "
                    "(latency: Send/Recv, bw: Isend/Irecv and Waitall)")
        if name in P2P and args.full:
            return f"-f applies to the collectives; {name} reports rank 0's figure only"
        try:
            _sizes(args, name)
        except ValueError as exc:
            return str(exc)
    for option, value in (("-i", args.iterations), ("-W", args.window_size)):
        if value is not None and value < 1:
            return f"{option} {value}: must be >= 1"
    if args.warmup is not None and args.warmup < 0:
        return f"-x {args.warmup}: must be >= 0"
    if args.buffer == "torch-cuda" and not torch.cuda.is_available():
        return ("--buffer torch-cuda: CUDA is not available here (torch "
                f"{torch.__version__}, torch.cuda.is_available() is False)")
    if args.buffer == "numpy":
        try:
            numpy_dtype(args.torch_dtype)
        except ValueError as exc:
            return f"--buffer numpy --dtype {args.dtype}: {exc}"
    if args.backend != "auto":
        backend = mcr.backends.get(args.backend)
        where = "cuda" if args.buffer == "torch-cuda" else "cpu"
        if where not in backend.devices:
            served = " and ".join("CUDA" if d == "cuda" else "host" for d in
                                  sorted(backend.devices))
            hint = ("--buffer torch-cuda" if "cuda" in backend.devices else
                    "--buffer torch or numpy")
            return (f"--backend {args.backend} serves {served} buffers only; --buffer "
                    f"{args.buffer} is in {'CUDA' if where == 'cuda' else 'host'} memory "
                    f"(use {hint}, or --backend mpi)")
        reason = backend.unavailable()
        if reason:
            return f"--backend {args.backend}: {reason}"
    return None


def _iterations(args: argparse.Namespace, nbytes: int) -> tuple[int, int]:
    large = nbytes > LARGE_MESSAGE
    iters = args.iterations or (ITERATIONS_LARGE if large else ITERATIONS)
    warmup = args.warmup if args.warmup is not None else (WARMUP_LARGE if large else WARMUP)
    return iters, warmup


# -- Output ---------------------------------------------------------------------------

def _header(args: argparse.Namespace, columns: Sequence[str], sized: bool = True) -> str:
    if args.name in P2P:
        what = P2P[args.name]
    else:
        form = {"blocking": "", "nonblocking": "Non-blocking ",
                "persistent": "Persistent "}[args.form]
        what = f"{form}{OPERATIONS[args.name].title} Latency"
    lines = [f"# OSU MPI {what} Test (mcr {mcr.__version__}, backend {args.backend}, "
             f"buffer {args.buffer}, {args.dtype})"]
    if args.form == "nonblocking":
        lines.append("# Overall = Post + Compute + Wait; Overlap(%) = "
                     "max(0, 100 - 100 * (Overall - Compute) / Pure Comm.)")
    head = "".join(f"{c:>{ITER_WIDTH if c == 'Iterations' else FIELD_WIDTH}}"
                   for c in columns)
    if sized:
        lines.append(f"{'# Size':<{SIZE_WIDTH}}{head}")
    else:                           # barrier: OSU prints no size column
        lines.append(f"# {columns[0]:>{FIELD_WIDTH - 3}}{head[FIELD_WIDTH:]}")
    return "\n".join(lines)


def _row(nbytes: int | None, values: Sequence[float], iters: int | None = None) -> str:
    text = "".join(f"{v:{FIELD_WIDTH}.2f}" for v in values)
    # barrier: no size column, the first value under "# Avg Latency(us)"
    text = f"{nbytes:<{SIZE_WIDTH}d}{text}" if nbytes is not None else text[1:]
    if iters is not None:
        text += f"{iters:{ITER_WIDTH}d}"
    return text


def _say(text: str) -> None:
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(text, flush=True)


# -- Running --------------------------------------------------------------------------

@dataclass
class _Run:
    """What every measurement needs: the options, communicators and buffers."""

    args: argparse.Namespace
    comm: mcr.Comm          # the benchmarked calls
    world: MPI.Intracomm    # barriers, checks and statistics (mpi4py's)
    make: Make
    sync: Callable[[], None] | None     # CUDA: wait for the stream after each iteration

    def agree(self, problem: str | None, what: str) -> bool:
        """Whether every rank's check passed; print the failures (collective)."""
        if problem:
            print(f"{PROG}: wrong result ({what}): {problem}", file=sys.stderr, flush=True)
        return not self.world.allreduce(1 if problem else 0, op=MPI.MAX)

    def stats(self, seconds: float, iters: int) -> tuple[float, float, float]:
        """Average, minimum and maximum over ranks of the time per iteration (us)."""
        per_rank = self.world.allgather(seconds / iters * 1e6)
        return sum(per_rank) / len(per_rank), min(per_rank), max(per_rank)

    def timed(self, iteration: Callable[[], None], iters: int, warmup: int) -> float:
        """Seconds that ``iters`` iterations took on this rank, after the warm-up."""
        for _ in range(warmup):
            iteration()
        self.world.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            iteration()
        return time.perf_counter() - t0

    def synced(self, iteration: Callable[[], None]) -> Callable[[], None]:
        sync = self.sync
        if sync is None:
            return iteration

        def iteration_synced() -> None:
            iteration()
            sync()
        return iteration_synced

    def count(self, nbytes: int) -> int:
        itemsize: int = self.args.torch_dtype.itemsize
        return nbytes // itemsize


def _collective(run: _Run) -> int:
    args = run.args
    spec = OPERATIONS[args.name]
    sized = spec.name != "barrier"
    if args.form == "nonblocking":
        columns = ["Overall(us)", "Compute(us)", "Pure Comm.(us)"]
        if args.full:
            columns += ["Min Comm.(us)", "Max Comm.(us)"]
        columns.append("Overlap(%)")
        per_iter_compute = _calibrate_compute()
    else:
        columns = ["Avg Latency(us)"]
        if args.full:
            columns += ["Min Latency(us)", "Max Latency(us)"]
    if args.full:
        columns.append("Iterations")
    _say(_header(args, columns, sized))
    for nbytes in args.sizes:
        count = max(1, run.count(nbytes))
        case = spec.setup(run.comm, count, args.torch_dtype, run.make)
        iteration = run.synced(case.run(args.form))    # run.comm's default backend
        iteration()
        size = count * args.torch_dtype.itemsize if sized else 0
        what = f"{args.form}, backend {args.backend}, {size} bytes"
        if args.inject_wrong_result == run.world.Get_rank() and case.outputs:
            case.corrupt()
        if not run.agree(case.check(), what):
            return 1
        iters, warmup = _iterations(args, nbytes)
        pure = run.stats(run.timed(iteration, iters, warmup), iters)
        if args.form == "nonblocking":
            overall, compute = _overlap(run, case, pure[0], per_iter_compute, iters, warmup)
            values = [overall, compute, pure[0]]
            if args.full:
                values += [pure[1], pure[2]]
            values.append(max(0.0, 100.0 - 100.0 * (overall - compute) / pure[0])
                          if pure[0] > 0 else 0.0)
        else:
            values = list(pure if args.full else pure[:1])
        case.close()
        _say(_row(nbytes if sized else None, values, iters if args.full else None))
    return 0


def _compute(n: int) -> float:
    # the synthetic computation overlapped with a non-blocking collective
    x = 0.0
    for _ in range(n):
        x = x * 0.5 + 1.0
    return x


_CALIBRATED: list[float] = []


def _calibrate_compute() -> float:
    """Seconds per iteration of :func:`_compute` on this rank (measured once)."""
    if _CALIBRATED:
        return _CALIBRATED[0]
    n = 10000
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        _compute(n)
        best = min(best, time.perf_counter() - t0)
    _CALIBRATED.append(best / n)
    return best / n


def _overlap(run: _Run, case: Case, pure_us: float, per_iter: float, iters: int,
             warmup: int) -> tuple[float, float]:
    """Overall and compute time (us, averaged over ranks) of post, compute, Wait,
    with the computation calibrated to take ``pure_us``."""
    post = case.poster(None)
    sync = run.sync
    n = max(1, round(pure_us * 1e-6 / per_iter))
    overall = compute = 0.0
    perf_counter = time.perf_counter
    for i in range(warmup + iters):
        if i == warmup:
            run.world.Barrier()
            overall = compute = 0.0
        t0 = perf_counter()
        request = post()
        t1 = perf_counter()
        _compute(n)
        t2 = perf_counter()
        request.Wait()
        if sync is not None:
            sync()
        t3 = perf_counter()
        overall += t3 - t0
        compute += t2 - t1
    return run.stats(overall, iters)[0], run.stats(compute, iters)[0]


def _p2p(run: _Run) -> int:
    args = run.args
    comm, rank = run.comm, run.world.Get_rank()
    backend = args.backend
    latency = args.name == "latency"
    _say(_header(args, ["Latency (us)" if latency else "Bandwidth (MB/s)"]))
    window = args.window_size
    ack = run.make(4, torch.uint8)
    for nbytes in args.sizes:
        count = run.count(nbytes)
        send, recv = run.make(count, args.torch_dtype), run.make(count, args.torch_dtype)
        fill(send, rank_values(rank, count, args.torch_dtype, False))
        if latency:
            iteration = _ping_pong(comm, rank, send, recv, backend)
        else:
            iteration = _window(comm, rank, send, recv, ack, window, backend)
        iteration = run.synced(iteration)
        iteration()
        problem = None
        if rank in (0, 1) and (latency or rank == 1):   # bw: only rank 1 receives
            if args.inject_wrong_result == rank and count:
                fill(recv, rank_values(rank + 7, count, args.torch_dtype, False))
            expected = rank_values(1 - rank, count, args.torch_dtype, False)
            problem = mismatch(recv, expected, "recvbuf")
        what = f"backend {args.backend}, {nbytes} bytes"
        if not run.agree(problem and f"{args.name}: rank {rank}: {problem}", what):
            return 1
        iters, warmup = _iterations(args, nbytes)
        seconds = run.timed(iteration, iters, warmup)
        seconds = run.world.bcast(seconds, root=0)
        if latency:
            value = seconds / iters / 2 * 1e6
        else:
            value = nbytes / 1e6 * iters * window / seconds if seconds > 0 else 0.0
        _say(_row(nbytes, [value]))
    return 0


def _ping_pong(comm: mcr.Comm, rank: int, send: Any, recv: Any,
               backend: str) -> Callable[[], None]:
    Send, Recv = comm.Send, comm.Recv

    def ping() -> None:
        Send(send, 1, 1, backend=backend)
        Recv(recv, 1, 1, backend=backend)

    def pong() -> None:
        Recv(recv, 0, 1, backend=backend)
        Send(send, 0, 1, backend=backend)

    return ping if rank == 0 else pong if rank == 1 else (lambda: None)


def _window(comm: mcr.Comm, rank: int, send: Any, recv: Any, ack: Any, window: int,
            backend: str) -> Callable[[], None]:
    Isend, Irecv, Send, Recv = comm.Isend, comm.Irecv, comm.Send, comm.Recv
    Waitall = mcr.Request.Waitall

    def sender() -> None:
        Waitall([Isend(send, 1, 100, backend=backend) for _ in range(window)])
        Recv(ack, 1, 101, backend=backend)

    def receiver() -> None:
        Waitall([Irecv(recv, 0, 100, backend=backend) for _ in range(window)])
        Send(ack, 0, 101, backend=backend)

    return sender if rank == 0 else receiver if rank == 1 else (lambda: None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one benchmark; return the exit status (0, 1: wrong result, 2: bad option).

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after ``python -m mcr.bench`` (default: ``sys.argv[1:]``).
    """
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    quiet = open(os.devnull, "w") if rank else None
    try:
        with contextlib.ExitStack() as stack:
            if quiet:                   # one copy of usage and help, from rank 0
                stack.enter_context(contextlib.redirect_stdout(quiet))
                stack.enter_context(contextlib.redirect_stderr(quiet))
            try:
                args = parse_args(argv)
            except _UsageError as exc:
                _parser().print_usage(sys.stderr)
                print(f"{PROG}: error: {exc}", file=sys.stderr)
                return 2
            for name in args.names:
                if name in P2P and world.Get_size() < 2:
                    print(f"{PROG}: error: {name} needs at least 2 processes "
                          "(mpiexec -n 2)", file=sys.stderr)
                    return 2
    finally:
        if quiet:
            quiet.close()
    sync = torch.cuda.current_stream().synchronize if args.buffer == "torch-cuda" else None
    # the timed calls run on a communicator whose default backend is the one
    # asked for: no backend= keyword in the timed call
    comm = mcr.COMM_WORLD.Dup()
    comm.backend = args.backend
    run = _Run(args, comm, world, buffer_maker(args.buffer), sync)
    for k, name in enumerate(args.names):
        if k:
            _say("")
        args.name, args.sizes = name, _sizes(args, name)
        status = _p2p(run) if name in P2P else _collective(run)
        if status:
            return status
    return 0
