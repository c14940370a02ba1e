"""The command line of ``python -m mcr.tune``: parsed and checked without MPI.

The launching process (:mod:`~mcr.tune.driver`) and the ranks
(:mod:`~mcr.tune.worker`) parse the same arguments with :func:`parse_args`;
nothing here initializes MPI. Operation names are the benchmark names of
:mod:`mcr.bench.ops` (``allreduce``, ``reduce_scatter_block``, ...); the table
records them under their MPI names (:data:`mcr.tuning.OPS`), mapped by
:data:`TUNED`.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import os
from collections.abc import Sequence
from typing import Any

from mcr import tuning
from mcr._outputs import unwritable_figure
from mcr.backends import BUILTINS, names as backend_names
from mcr.bench.ops import OPERATIONS, P2P_OPERATIONS

from . import schedule

__all__ = ["PROG", "parser", "TUNED", "DTYPE", "ITEMSIZE", "DEFAULT_SIZES", "DEFAULT_ROUNDS",
           "parse_args", "parse_plot_args", "message_sizes", "existing_table",
           "save_merged", "pyplot"]

PROG = "python -m mcr.tune"
# benchmark name -> MPI name, for the collectives auto chooses a backend for
TUNED: dict[str, str] = {name: spec.method for name, spec in OPERATIONS.items()
                         if spec.method in tuning.OPS}
DTYPE = "float32"             # the element type of every measurement
ITEMSIZE = 4
DEFAULT_SIZES = "4:1048576"
DEFAULT_ROUNDS = 3
DEFAULT_TIMEOUT = 3600.0      # seconds before a launched job is stopped (no --time-budget)


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m mcr.tune`` (its help is the usage the docs show)."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Measure every collective on each backend that can serve it and "
                    "write the tuning table backend='auto' chooses by (mcr.tuning). "
                    "Started outside mpiexec it launches itself on -n ranks; under "
                    "mpiexec it runs as the ranks.",
        epilog=f"Example: {PROG} -n 2 --ops allreduce,bcast -m 4:65536 --time-budget 60 "
               f"--plot tuning.png.  Plot an existing table: {PROG} plot TABLE.json "
               "--out tuning.png.  Exit status: 0 done, 1 a wrong result or a failed "
               "measurement, 2 a bad option or an unusable --out file, 130 interrupted "
               "(Ctrl-C stops the job).")
    p.add_argument("-n", "--nprocs", type=int, default=2,
                   help="ranks to launch (default 2; ignored under mpiexec)")
    p.add_argument("--ops", default="all",
                   help="comma-separated collectives or 'all' (default): "
                        f"{', '.join(TUNED)}")
    p.add_argument("-m", "--message-size", default=DEFAULT_SIZES, metavar="[MIN:]MAX",
                   help="message sizes in bytes: the powers of two from MIN to MAX "
                        f"(default {DEFAULT_SIZES}); sizes as in python -m mcr.bench "
                        f"(count {DTYPE} elements per process)")
    p.add_argument("--devices", default="cpu",
                   help="where the buffers live: cpu, cuda or cpu,cuda (default cpu)")
    p.add_argument("--backends", default=None,
                   help="backends to measure (default: every built-in one that can serve "
                        f"the devices: {', '.join(BUILTINS)}); mpi serves both devices, "
                        "gloo host memory, nccl CUDA tensors")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="fit the measurements, from the ranks' start, into about this "
                        "many seconds (iteration counts adapt; at least "
                        f"{schedule.MIN_ITERS} timed calls per loop); default: OSU's counts "
                        f"({schedule.ITERS} calls up to {schedule.LARGE // 1024} KiB, "
                        f"{schedule.ITERS_LARGE} above), a loop of slow calls cut to "
                        f"{schedule.LOOP_CAP:g} s")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                   help="passes over every operation and size, one timed loop per backend "
                        "each, the backends taking turns; the minimum is kept (default "
                        f"{DEFAULT_ROUNDS})")
    p.add_argument("--out", metavar="PATH", default=None,
                   help="the table to write, merged into what it holds already (default "
                        "the cache: " + tuning.cache_path(0).replace("-n0.json", "-nN.json")
                        + ")")
    p.add_argument("--plot", metavar="PNG", default=None,
                   help="also draw the table: latency against size, one panel per "
                        "operation (needs matplotlib: pip install 'mcr[tune]')")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the launched job after this long (default: 3 times the "
                        f"budget plus 5 minutes, else {DEFAULT_TIMEOUT:.0f})")
    # the test suite's way to exercise the wrong-result path end to end
    p.add_argument("--inject-wrong-result", type=int, metavar="RANK", help=argparse.SUPPRESS)
    # set by the launching process: rank 0 reports its progress there, and
    # the launching process shows it and the summary (mcr.tune.progress)
    p.add_argument("--progress-file", metavar="PATH", help=argparse.SUPPRESS)
    return p


def _names(text: str, known: Sequence[str], option: str,
           parser: argparse.ArgumentParser, extra: str = "") -> list[str]:
    if text.strip() == "all":
        return list(known)
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if not names:
        parser.error(f"{option}: empty list; choose from {', '.join(known)}")
    if bad:
        parser.error(f"{option}: unknown {', '.join(repr(x) for x in bad)}{extra}; "
                     f"choose from {', '.join(known)}")
    return [x for x in known if x in names]


def message_sizes(text: str) -> list[int]:
    """The sizes of ``-m [MIN:]MAX``: the powers of two in [MIN, MAX] that hold
    one element (MIN defaults to the element size).

    Raises
    ------
    ValueError
        For a malformed or empty range; the message names ``-m`` and the text.
    """
    lo_text, sep, hi_text = text.rpartition(":")
    try:
        lo = int(lo_text) if sep and lo_text.strip() else ITEMSIZE
        hi = int(hi_text)
    except ValueError:
        raise ValueError(f"-m {text!r}: expected [MIN:]MAX in bytes, as {DEFAULT_SIZES} "
                         "or 65536") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"-m {text!r}: expected 1 <= MIN <= MAX, got MIN {lo}, MAX {hi}")
    sizes = [1 << k for k in range(hi.bit_length()) if lo <= 1 << k <= hi
             and 1 << k >= ITEMSIZE]
    if not sizes:
        raise ValueError(f"-m {text!r}: no power of two from {lo} to {hi} holds one "
                         f"{DTYPE} element ({ITEMSIZE} bytes)")
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line (no MPI; torch only for ``--devices cuda``).

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after ``python -m mcr.tune`` (default ``sys.argv[1:]``).

    Returns
    -------
    argparse.Namespace
        With ``ops`` (benchmark names), ``devices`` and ``backends`` as lists,
        ``backends_named`` (whether ``--backends`` was given) and ``sizes`` (bytes).

    Raises
    ------
    SystemExit
        With status 2 and a message naming the option, for a bad option.
    """
    p = parser()
    args = p.parse_args(argv)
    args.ops = _names(args.ops, list(TUNED), "--ops", p,
                      " (latency is point-to-point: auto always runs it on mpi)"
                      if any(x.strip() in P2P_OPERATIONS for x in args.ops.split(",")) else "")
    args.devices = _names(args.devices, tuning.DEVICES, "--devices", p)
    args.backends_named = args.backends is not None
    args.backends = _names(args.backends if args.backends_named else ",".join(BUILTINS),
                           backend_names(), "--backends", p)
    try:
        args.sizes = message_sizes(args.message_size)
    except ValueError as exc:
        p.error(str(exc))
    if args.nprocs < 1:
        p.error(f"-n: expected at least 1 rank, got {args.nprocs}")
    if args.rounds < 1:
        p.error(f"--rounds: expected at least 1, got {args.rounds}")
    if args.time_budget is not None and not args.time_budget > 0:
        p.error(f"--time-budget: expected seconds > 0, got {args.time_budget:g}")
    if args.timeout is not None and not args.timeout > 0:
        p.error(f"--timeout: expected seconds > 0, got {args.timeout:g}")
    if args.timeout is None:
        args.timeout = (3 * args.time_budget + 300 if args.time_budget is not None
                        else DEFAULT_TIMEOUT)
    if "cuda" in args.devices:
        import torch
        if not torch.cuda.is_available():
            p.error(f"--devices cuda: CUDA is not available here (torch {torch.__version__}, "
                    "torch.cuda.is_available() is False)")
    if args.plot is not None:
        try:
            pyplot()
        except ImportError as exc:
            p.error(f"--plot {args.plot}: {exc}")
        problem = unwritable_figure(args.plot)
        if problem:
            p.error(f"--plot {args.plot}: {problem}")
    return args


def parse_plot_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``python -m mcr.tune plot TABLE --out PNG`` (SystemExit 2 when bad)."""
    p = argparse.ArgumentParser(prog=f"{PROG} plot",
                                description="Draw a tuning table: latency against message "
                                            "size per backend, one panel per operation, "
                                            "the sizes where each backend is chosen shaded.")
    p.add_argument("table", help="the tuning table (JSON written by python -m mcr.tune)")
    p.add_argument("--out", required=True, metavar="PNG", help="the figure to write")
    args = p.parse_args(argv)
    try:
        pyplot()
    except ImportError as exc:
        p.error(str(exc))
    problem = unwritable_figure(args.out)
    if problem:
        p.error(f"--out {args.out}: {problem}")
    return args


def existing_table(path: str, world_size: int) -> tuning.Table | None:
    """The table at ``path`` that a run merges into, or None when there is none.

    Raises
    ------
    mcr.tuning.TuningError
        When the file is not a usable tuning table, or was measured on
        another number of processes; the message names the file.
    """
    if not os.path.exists(path):
        return None
    table = tuning.Table.load(path)
    measured = table.machine.get("world_size")
    if measured is not None and measured != world_size:
        raise tuning.TuningError(
            f"{path}: measured at world_size {measured}, this run has {world_size} "
            "processes; a table holds one world size (use another --out)")
    return table


def save_merged(new: tuning.Table, path: str, world_size: int) -> tuning.Table:
    """Merge ``new`` into the table at ``path`` as it is now and save it; the
    merged table.

    The file is read again under an exclusive lock on ``path + ".lock"`` (left
    in place: removing it would let two writers lock different files), so a
    table saved meanwhile by another run, of other operations, is kept: what
    ``new`` measured replaces its figures, the rest stays. ``new``'s machine
    block is taken, its ``devices`` those the merged table has entries for.

    Raises
    ------
    mcr.tuning.TuningError
        When the file became unusable meanwhile (as :func:`existing_table`).
    OSError
        When the lock or the table cannot be written.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)            # released when the file is closed
        table = existing_table(path, world_size) or tuning.Table()
        table.merge(new)
        table.machine["devices"] = [d for d in tuning.DEVICES
                                    if any(e.device == d for e in table.entries)]
        table.save(path)
    return table


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend.

    Raises
    ------
    ImportError
        When matplotlib is not installed, saying how to install it.
    """
    try:
        mpl = importlib.import_module("matplotlib")
    except ImportError:
        raise ImportError("matplotlib is not installed: pip install 'mcr[tune]' "
                          "(or pip install matplotlib)") from None
    mpl.use("Agg")
    return importlib.import_module("matplotlib.pyplot")
