"""Neighborhood collectives of a periodic ring: ``python -m mcr.bench.neighbor
[options]``.

Times ``Neighbor_alltoall`` and ``Neighbor_allgather`` (blocking, and the
``Ineighbor_`` form waited for at once) on an mcr ring (``Create_cart`` with a
periodic dimension of every rank) running MPI and Gloo, against mpi4py's own
ring on the same tensors. Rounds alternate between the variants; a variant's
time per call is the slowest rank's, and the figure is the minimum over
rounds. Started as a plain program it runs itself under ``mpiexec -n N``
(:mod:`mcr.launch`); rank 0 prints one line per operation, form and size, with
mcr-mpi's time over mpi4py's, and checks every result against the ring's
definition (MPI 4.0's order: the slot of the left neighbour holds what it sent
to its right). At 1 and 2 ranks one process is both neighbours: there mcr
composes the non-blocking alltoall on MPI too (Open MPI's takes another order),
and Gloo runs two rounds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mcr import launch
from mcr.bench.rounds import add_round_options, check_round_options, us_per_call

__all__ = ["main", "parse_args"]

OPS = ("Neighbor_alltoall", "Neighbor_allgather")
FORMS = ("blocking", "nonblocking")
VARIANTS = ("mpi4py", "mcr-mpi", "mcr-gloo")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line (default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(prog="python -m mcr.bench.neighbor",
                                     description=__doc__.split("\n\n")[0])
    add_round_options(parser, "4,1024,65536", "per block")
    launch.add_job_options(parser, timeout=600)
    args = parser.parse_args(argv)
    check_round_options(parser, args)
    return args


def _call(ring: Any, op: str, form: str, variant: str, n: int, rank: int,
          size: int) -> tuple[Callable[[], None], Any, Any]:
    """One call of `op` in `form` on `ring`, its output and what it should hold."""
    import torch
    left, right = (rank - 1) % size, (rank + 1) % size
    kw = {} if variant == "mpi4py" else {"backend": variant[4:]}
    name = op if form == "blocking" else "I" + op[0].lower() + op[1:]
    method = getattr(ring, name)
    out = torch.empty(2 * n)
    if op == "Neighbor_alltoall":
        # block 0 to the left neighbour, block 1 to the right
        send = torch.cat([torch.full((n,), 10.0 * rank), torch.full((n,), 10.0 * rank + 1)])
        expected = torch.cat([torch.full((n,), 10.0 * left + 1), torch.full((n,), 10.0 * right)])
    else:
        send = torch.full((n,), float(rank))
        expected = torch.cat([torch.full((n,), float(left)), torch.full((n,), float(right))])

    def call() -> None:
        result = method(send, out, **kw)
        if form == "nonblocking":
            result.Wait()
    return call, out, expected


def _worker(args: argparse.Namespace) -> None:
    import torch
    from mpi4py import MPI as M4

    import mcr
    torch.set_num_threads(1)
    world = mcr.COMM_WORLD
    rank, size = world.rank, world.size
    rings = {"mpi4py": M4.COMM_WORLD.Create_cart([size], periods=[True]),
             "mcr-mpi": world.Create_cart([size], periods=[True])}
    rings["mcr-gloo"] = rings["mcr-mpi"]
    if rank == 0:
        print(f"# mcr.bench.neighbor: a periodic ring of {size} ranks, torch "
              f"{torch.__version__}, {args.rounds} rounds of {args.time:g} s per variant; "
              f"us per call (slowest rank, best round)")
        print(f"{'op':<20}{'form':<13}{'bytes':>8}" + "".join(f"{v:>11}" for v in VARIANTS)
              + f"{'mpi/mpi4py':>12}", flush=True)
    wrong: set[tuple[str, str]] = set()
    for op in OPS:
        for form in FORMS:
            for nbytes in args.sizes:
                n = nbytes // 4
                calls = {v: _call(rings[v], op, form, v, n, rank, size) for v in VARIANTS}
                best = {v: float("inf") for v in VARIANTS}
                for _ in range(args.rounds):
                    for variant in VARIANTS:
                        call, out, expected = calls[variant]
                        out.fill_(-1.0)
                        call()                                   # warm, and checked
                        if variant == "mpi4py" and not torch.equal(out, expected):
                            wrong.add((op, form))        # Open MPI's order: reported
                        elif not torch.equal(out, expected):
                            raise AssertionError(f"{op} ({form}) {nbytes} B on {variant}: "
                                                 f"wrong result {out.tolist()[:8]}")
                        best[variant] = min(best[variant], us_per_call(world, call, args.time))
                if rank == 0:
                    print(f"{op:<20}{form:<13}{nbytes:>8}"
                          + "".join(f"{best[v]:>11.1f}" for v in VARIANTS)
                          + f"{best['mcr-mpi'] / best['mpi4py']:>11.2f}x"
                          + ("  (mpi4py: other order*)" if (op, form) in wrong else ""),
                          flush=True)
    if rank == 0 and wrong:
        print("* mpi4py's result differs from MPI 4.0's order of blocks (Open MPI's "
              "non-blocking form on a ring of 1 or 2 processes); its time is still shown")
    rings["mcr-mpi"].Free()
    rings["mpi4py"].Free()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; started outside mpiexec, it starts ``mpiexec`` itself."""
    args = parse_args(argv)
    return launch.main_in_job("mcr.bench.neighbor", args.nprocs, argv, timeout=args.timeout,
                              work=lambda: _worker(args), in_job=args.worker)


if __name__ == "__main__":
    sys.exit(main())
