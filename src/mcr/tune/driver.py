"""The launching side of ``python -m mcr.tune``: a plain program (no MPI in it)
that checks the options and the ``--out`` file, starts the ranks through
:mod:`mcr.launch`, shows their progress and, at the end, the table they
wrote. Under mpiexec, it runs as one of the ranks instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence

from mcr import launch, tuning
from mcr._outputs import stamp, unwritable

from .cli import PROG, existing_table, parse_args
from .plot import show
from .progress import Follower

__all__ = ["main"]


def _busy_cores(seconds: float = 0.5) -> float | None:
    """How many cores other work keeps busy now (from ``/proc/stat`` over
    ``seconds``; the load average would still count the previous job), or
    None where that cannot be read."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)     # idle, iowait
        return sum(ticks) - idle, sum(ticks)
    try:
        busy0, total0 = sample()
        time.sleep(seconds)
        busy1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)


def _warn_if_busy(nprocs: int) -> None:
    """Say so when other work shares the cores: ranks that wait by spinning
    (MPI's shared memory) lose whole time slices then, and the table would
    choose by the interference."""
    busy = _busy_cores()
    cores = os.cpu_count() or 1
    if busy is not None and busy > max(0.5, cores - nprocs + 0.5):
        print(f"{PROG}: warning: the machine is busy ({busy:.1f} of {cores} cores in use "
              f"before {nprocs} ranks start): the latencies, and so the choices, may "
              "reflect the other work", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mcr.tune [options]`` and ``python -m mcr.tune plot TABLE --out PNG``.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 done, 1 a wrong result, a failed measurement or a job that ran past
        ``--timeout``, 2 a bad option or an unusable ``--out`` file, 130
        interrupted (Ctrl-C: the job is stopped).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plot"]:
        from .plot import main as plot
        return plot(argv[1:])
    if launch.launched():
        from .worker import main as worker      # imports MPI: only in the ranks
        return worker(argv)
    args = parse_args(argv)
    out = args.out or tuning.cache_path(args.nprocs)
    problem = unwritable(out, make_folder=True, replace=True)     # before anything is measured
    if problem:
        print(f"{PROG}: error: --out {out}: {problem}", file=sys.stderr)
        return 2
    try:
        existing_table(out, args.nprocs)
    except tuning.TuningError as exc:
        print(f"{PROG}: error: --out: {exc}", file=sys.stderr)
        return 2
    try:
        mpiexec = launch.find_mpiexec()
    except launch.MpiexecNotFoundError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    before = stamp(out)
    try:
        return _run(args, argv, out, mpiexec)
    except KeyboardInterrupt:       # the job was stopped on the way out of launch.run
        saved = stamp(out) != before
        print(f"{PROG}: interrupted; " + (f"the table was saved to {out} before" if saved
                                          else "the run was stopped, nothing was saved"),
              file=sys.stderr, flush=True)
        return 130


def _run(args: argparse.Namespace, argv: list[str], out: str, mpiexec: str) -> int:
    """Launch the ranks, follow their progress and show the table; the status."""
    _warn_if_busy(args.nprocs)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mcr-tune-") as tmp:
        channel = os.path.join(tmp, "progress.jsonl")
        follower = Follower(channel)
        follower.start()
        try:
            result = launch.run(args.nprocs, [sys.executable, "-m", "mcr.tune", *argv,
                                              "--progress-file", channel],
                                timeout=args.timeout, mpiexec=mpiexec)
        finally:
            follower.stop()
    if result.timed_out:
        print(f"{PROG}: error: the job did not finish in {args.timeout:g} s and was "
              f"stopped: {' '.join(result.command)}", file=sys.stderr)
        return 1
    if result.returncode != 0:
        return result.returncode if result.returncode in (1, 2) else 1
    try:
        table = tuning.Table.load(out)
    except tuning.TuningError as exc:
        print(f"{PROG}: error: the job ended without a table this process can read (was "
              f"rank 0 on another node?): {exc}", file=sys.stderr)
        return 1
    status = show(table, args, out)
    print(f"({args.nprocs} ranks, {time.perf_counter() - t0:.0f} s in all)")
    return status
