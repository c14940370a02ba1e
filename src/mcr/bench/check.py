"""What checked mode, timeouts and the flight recorder cost per call:
``python -m mcr.bench.check [options]``.

Times ``Allreduce`` and ``Alltoallv`` on each backend at each message size on
a communicator that is plain, checked (``comm.checked = True``), timed
(``comm.timeout``), recorded (the flight recorder on) and checked and timed.
Rounds alternate between the variants; a variant's time per call is the
slowest rank's, and the figure is the minimum over rounds. Started as a plain
program it runs itself under ``mpiexec -n N`` (:mod:`mcr.launch`); rank 0
prints one line per operation, backend and size: microseconds per call for
each variant and its ratio to plain. Every result is checked against what
torch computes here.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from mcr import launch
from mcr.bench.rounds import add_round_options, check_round_options

__all__ = ["main", "parse_args"]

OPS = ("Allreduce", "Alltoallv")
VARIANTS = ("plain", "checked", "timeout", "recorder", "checked+timeout")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line (default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(prog="python -m mcr.bench.check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="mpi,gloo",
                        help="comma-separated backends (default mpi,gloo)")
    add_round_options(parser, "4,65536", "per rank")
    launch.add_job_options(parser, timeout=600)
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not args.backends:
        parser.error("--backends: expected at least one backend")
    check_round_options(parser, args)
    return args


def _comm(base: Any, variant: str) -> Any:
    comm = base.Dup()
    comm.checked = "checked" in variant
    comm.timeout = 600.0 if "timeout" in variant else None
    return comm


def _buffers(comm: Any, op: str, n: int, torch: Any) -> tuple[Any, Any, Any]:
    """(send, receive, expected result) of `op` on `n` floats per rank."""
    size, rank = comm.Get_size(), comm.Get_rank()
    if op == "Allreduce":
        return (torch.full((n,), float(rank + 1)), torch.empty(n),
                torch.full((n,), float(size * (size + 1) // 2)))
    per = max(n // size, 1)
    x = torch.arange(per * size, dtype=torch.float32) + 1000 * rank
    expected = torch.cat([torch.arange(rank * per, (rank + 1) * per, dtype=torch.float32)
                          + 1000 * r for r in range(size)])
    return [x, [per] * size], [torch.empty(per * size), [per] * size], expected


def _time(comm: Any, op: str, backend: str, bufs: tuple[Any, Any, Any], calls: int,
          torch: Any) -> float:
    """Seconds per call over `calls` calls (the slowest rank's); the result
    is checked after them."""
    from mpi4py import MPI
    send, recv, expected = bufs
    method = getattr(comm, op)
    out = recv[0] if isinstance(recv, list) else recv
    out.fill_(-1)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        method(send, recv, backend=backend)
    took = time.perf_counter() - t0
    if not torch.equal(out, expected):
        raise AssertionError(f"{op} on {backend}: wrong result")
    return float(comm.allreduce(took / calls, op=MPI.MAX))


def _calls(comm: Any, op: str, backend: str, bufs: tuple[Any, Any, Any], seconds: float,
           torch: Any) -> int:
    """How many calls take about `seconds` (the same number on every rank)."""
    per = _time(comm, op, backend, bufs, 8, torch)
    return max(int(seconds / per), 8)


def _worker(args: argparse.Namespace) -> None:
    import torch

    import mcr
    from mcr import _core

    base = mcr.COMM_WORLD
    rank = base.Get_rank()
    folder = tempfile.mkdtemp(prefix="mcr-bench-check-") if rank == 0 else None
    folder = base.bcast(folder, root=0)
    comms = {v: _comm(base, v) for v in VARIANTS}
    if rank == 0:
        print(f"mcr.bench.check: {base.Get_size()} ranks; us per call (ratio to plain)",
              flush=True)
    for op in OPS:
        for backend in args.backends:
            for nbytes in args.sizes:
                n = max(nbytes // 4, 1)
                best = {v: float("inf") for v in VARIANTS}
                bufs = _buffers(base, op, n, torch)
                calls = _calls(comms["plain"], op, backend, bufs, args.time, torch)
                for _ in range(args.rounds):
                    for v in VARIANTS:
                        _core._set_flight_recorder(folder if v == "recorder" else None)
                        best[v] = min(best[v], _time(comms[v], op, backend, bufs, calls,
                                                     torch))
                        _core._set_flight_recorder(None)
                if rank == 0:
                    cells = "  ".join(f"{v} {best[v] * 1e6:8.1f} ({best[v] / best['plain']:.2f})"
                                      for v in VARIANTS)
                    print(f"{op:10s} {backend:5s} {nbytes:>8d} B  {cells}", flush=True)
    base.Barrier()
    if rank == 0:                # (the recorder writes there only when a call times out)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; started outside mpiexec, it starts ``mpiexec`` itself."""
    args = parse_args(argv)
    return launch.main_in_job("mcr.bench.check", args.nprocs, argv, timeout=args.timeout,
                              work=lambda: _worker(args), in_job=args.worker)


if __name__ == "__main__":
    sys.exit(main())
