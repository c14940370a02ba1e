"""What the per-call benchmarks that alternate variants in rounds share
(:mod:`mcr.bench.torchdist`, :mod:`mcr.bench.neighbor`, and the options of
:mod:`mcr.bench.check`): their ``--sizes``,
``--rounds`` and ``--time`` options, and the timing of one variant in one
round."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

__all__ = ["add_round_options", "check_round_options", "us_per_call"]


def add_round_options(parser: argparse.ArgumentParser, sizes: str, what: str) -> None:
    """``--sizes`` (default `sizes`, bytes `what`), ``--rounds``, ``--time``."""
    parser.add_argument("--sizes", default=sizes,
                        help=f"bytes {what}, comma-separated (default {sizes})")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per variant (5)")
    parser.add_argument("--time", type=float, default=0.05,
                        help="seconds of calls per variant and round (0.05)")


def check_round_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Parse ``args.sizes`` into a list; refuse bad values (``parser.error``)."""
    try:
        args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--sizes: expected comma-separated byte counts, got {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 4:
        parser.error("--sizes: expected byte counts of at least 4")
    if args.nprocs < 1 or args.rounds < 1 or args.time <= 0:
        parser.error("--nprocs and --rounds must be at least 1, --time positive")


def us_per_call(world: Any, call: Callable[[], None], seconds: float) -> float:
    """Microseconds per `call()` over about `seconds` of calls on `world`
    (an mcr communicator): every rank runs the count rank 0 picks from one
    call, from a barrier; the time is the slowest rank's."""
    import mcr
    t0 = time.perf_counter()
    call()
    once = max(time.perf_counter() - t0, 1e-7)
    count = int(world.bcast(max(1, min(100_000, int(seconds / once))), root=0))
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(count):
        call()
    elapsed = float(world.allreduce(time.perf_counter() - t0, op=mcr.MAX))
    return elapsed / count * 1e6
