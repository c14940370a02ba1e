"""torch.distributed calls on the "mcr" backend against torch's own Gloo:
``python -m mcr.bench.torchdist [options]``.

Times ``dist.all_reduce``, ``dist.broadcast``, ``dist.all_gather_into_tensor``
and ``dist.all_to_all_single`` (even splits) through torch.distributed's own
functions, at each message size, on an "mcr" group running MPI, one running
``auto`` and torch's Gloo group, and, as the floor, mcr's own
``Comm.Allreduce`` (etc.) on the same tensors. Rounds alternate between the
variants; a variant's time per call is the slowest rank's, and the figure is the
minimum over rounds. Started as a plain program it runs itself under
``mpiexec -n N`` (:mod:`mcr.launch`); rank 0 prints one line per operation and
size, with the ratio of Gloo's time to each mcr variant's, and checks every
result against what torch computes here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mcr import launch
from mcr.bench.rounds import add_round_options, check_round_options, us_per_call

__all__ = ["main", "parse_args"]

OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "all_to_all_single")
VARIANTS = ("mcr-mpi", "mcr-auto", "gloo", "Comm")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line (default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(prog="python -m mcr.bench.torchdist",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(OPS),
                        help=f"comma-separated, of {', '.join(OPS)} (default all)")
    add_round_options(parser, "4,1024,65536,1048576", "per rank")
    launch.add_job_options(parser, timeout=600)
    args = parser.parse_args(argv)
    args.ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = [op for op in args.ops if op not in OPS]
    if unknown or not args.ops:
        parser.error(f"--ops: unknown {unknown}; choose from {', '.join(OPS)}")
    check_round_options(parser, args)
    return args


def _calls(op: str, group: Any, comm: Any, n: int, rank: int,
           size: int) -> tuple[Callable[[], None], Callable[[], Any], Any]:
    """One call of ``op`` on ``group`` (or on mcr's ``comm`` when it is given),
    what the output should hold, and the output."""
    import torch
    import torch.distributed as dist

    from mcr import MPI
    if op == "all_reduce":
        t = torch.full((n,), float(rank + 1))

        def reduce_call() -> None:
            t.fill_(float(rank + 1))
            if comm is None:
                dist.all_reduce(t, group=group)
            else:
                comm.Allreduce(MPI.IN_PLACE, t)
        return reduce_call, lambda: torch.full((n,), float(size * (size + 1) // 2)), t
    if op == "broadcast":
        t = torch.full((n,), float(rank))

        def bcast_call() -> None:
            if comm is None:
                dist.broadcast(t, src=0, group=group)
            else:
                comm.Bcast(t, root=0)
        return bcast_call, lambda: torch.zeros(n), t
    if op == "all_gather_into_tensor":
        mine, out = torch.full((n,), float(rank)), torch.empty(n * size)

        def gather_call() -> None:
            if comm is None:
                dist.all_gather_into_tensor(out, mine, group=group)
            else:
                comm.Allgather(mine, out)
        everyone = torch.arange(size, dtype=torch.float32).repeat_interleave(n)
        return gather_call, lambda: everyone, out
    per = max(1, n // size)
    send = torch.arange(per * size, dtype=torch.float32) + 1000 * rank
    recv = torch.empty(per * size)

    def a2a_call() -> None:
        if comm is None:
            dist.all_to_all_single(recv, send, group=group)
        else:
            comm.Alltoall(send, recv)
    expected = torch.cat([torch.arange(rank * per, (rank + 1) * per, dtype=torch.float32)
                          + 1000 * q for q in range(size)])
    return a2a_call, lambda: expected, recv


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import mcr
    torch.set_num_threads(1)
    dist.init_process_group("mcr")
    rank, size = dist.get_rank(), dist.get_world_size()
    world = mcr.COMM_WORLD
    groups = {"mcr-mpi": dist.new_group(backend="mcr",
                                        pg_options=mcr.distributed.Options(backend="mpi")),
              "mcr-auto": dist.new_group(backend="mcr",
                                         pg_options=mcr.distributed.Options(backend="auto")),
              "gloo": dist.new_group(backend="gloo"), "Comm": None}
    comm = world.Dup()
    if rank == 0:
        print(f"# mcr.bench.torchdist: {size} ranks, torch {torch.__version__}, "
              f"{args.rounds} rounds of {args.time:g} s per variant; us per call "
              f"(slowest rank, best round); gloo/x: how many times faster than torch's Gloo")
        print(f"{'op':<24}{'bytes':>9}" + "".join(f"{v:>11}" for v in VARIANTS)
              + f"{'gloo/mpi':>10}{'gloo/auto':>10}", flush=True)
    for op in args.ops:
        for nbytes in args.sizes:
            n = nbytes // 4
            calls = {v: _calls(op, g, comm if v == "Comm" else None, n, rank, size)
                     for v, g in groups.items()}
            best = {v: float("inf") for v in VARIANTS}
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    call, expected, out = calls[variant]
                    call()                                   # warm, and checked
                    if not torch.equal(out, expected()):
                        raise AssertionError(f"{op} {nbytes} B on {variant}: wrong result")
                    best[variant] = min(best[variant], us_per_call(world, call, args.time))
            if rank == 0:
                print(f"{op:<24}{nbytes:>9}" + "".join(f"{best[v]:>11.1f}" for v in VARIANTS)
                      + f"{best['gloo'] / best['mcr-mpi']:>9.1f}x"
                      + f"{best['gloo'] / best['mcr-auto']:>9.1f}x", flush=True)
    comm.Free()
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; started outside mpiexec, it starts ``mpiexec`` itself."""
    args = parse_args(argv)
    return launch.main_in_job("mcr.bench.torchdist", args.nprocs, argv, timeout=args.timeout,
                              work=lambda: _worker(args), in_job=args.worker)


if __name__ == "__main__":
    sys.exit(main())
