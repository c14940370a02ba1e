"""Tensor fusion benchmark: ``python -m mcr.bench.fusion [options]``.

Times ``count`` non-blocking allreduces of ``bytes`` bytes each, then one
``mcr.Request.Waitall``, unfused (``comm.Iallreduce``) and fused
(``mcr.Fusion(comm, bucket_bytes=B).Iallreduce``) for each bucket size B of
the sweep; and, as the floor, the same work fused by hand (``torch.cat``, one
``Allreduce``, ``torch.split_with_sizes_copy`` back). Rounds alternate between
the variants; each variant's time is the slowest rank's, and the figure is
the minimum over rounds. Started as a plain
program, it runs itself under ``mpiexec -n N`` (:mod:`mcr.launch`); rank 0
prints the table and checks every result against the sum computed here.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from mcr import launch

__all__ = ["main", "parse_args"]

TARGET = 5.0        # the goal: fused at least 5x faster than unfused


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line (default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(prog="python -m mcr.bench.fusion",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="calls per round (1000)")
    parser.add_argument("--bytes", type=int, default=4096, help="bytes per call (4096)")
    parser.add_argument("--bucket", type=int, default=None,
                        help="the bucket size the target is judged at (default: "
                             "mcr.fusion.DEFAULT_BUCKET_BYTES)")
    parser.add_argument("--sweep", default="65536,262144,1048576,4194304",
                        help="bucket sizes to time as well, comma-separated bytes")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per variant (15)")
    parser.add_argument("--backend", default="mpi", help="backend (mpi, gloo, nccl, auto)")
    parser.add_argument("--dtype", default="float32", help="torch dtype name (float32)")
    launch.add_job_options(parser, timeout=600)
    args = parser.parse_args(argv)
    try:
        sweep = [int(x) for x in args.sweep.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--sweep: expected comma-separated byte counts, got {args.sweep!r}")
    for name in ("nprocs", "count", "bytes", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected at least 1, got {getattr(args, name)}")
    if args.bucket is None:
        from mcr.fusion import DEFAULT_BUCKET_BYTES
        args.bucket = DEFAULT_BUCKET_BYTES
    if args.bucket < 1 or any(b < 1 for b in sweep):
        parser.error("--bucket, --sweep: expected positive byte counts")
    args.buckets = sorted(set(sweep) | {args.bucket})
    return args


def _worker(args: argparse.Namespace) -> None:
    import torch

    import mcr
    from mpi4py import MPI

    comm = mcr.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    dtype = getattr(torch, args.dtype)
    device = "cuda" if args.backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    n = max(1, args.bytes // torch.empty((), dtype=dtype).element_size())
    # small integers: every sum is exact in any dtype, so results compare exactly
    xs = [torch.full((n,), (rank + i) % 7, dtype=dtype, device=device)
          for i in range(args.count)]
    ys = [torch.empty_like(x) for x in xs]
    fusions = {b: mcr.Fusion(comm, bucket_bytes=b, backend=args.backend)
               for b in args.buckets}

    def unfused() -> None:
        mcr.Request.Waitall([comm.Iallreduce(x, y, backend=args.backend)
                             for x, y in zip(xs, ys)])

    sizes = [n] * args.count

    def by_hand() -> None:
        # the floor: what fusion does, written for this one loop (no requests)
        buf = torch.cat(xs)
        comm.Allreduce(MPI.IN_PLACE, buf, backend=args.backend)
        torch.split_with_sizes_copy(buf, sizes, out=ys)

    def fused(f: Any) -> Callable[[], None]:
        def run() -> None:
            mcr.Request.Waitall([f.Iallreduce(x, y) for x, y in zip(xs, ys)])
        return run

    variants: list[tuple[str, Callable[[], None]]] = [("unfused", unfused),
                                                      ("by hand", by_hand)]
    variants += [(f"fused B={b}", fused(fusions[b])) for b in args.buckets]
    best = {name: float("inf") for name, _ in variants}
    for _ in range(args.rounds + 1):          # the first round warms up
        for name, run in variants:
            for y in ys:
                y.zero_()
            if device == "cuda":
                torch.cuda.synchronize()
            comm.Barrier()
            t0 = time.perf_counter()
            run()
            if device == "cuda":
                torch.cuda.synchronize()
            elapsed = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            best[name] = min(best[name], elapsed) if _ else best[name]
            for i, y in enumerate(ys):
                want = sum((r + i) % 7 for r in range(size))
                if not bool((y == want).all()):
                    raise SystemExit(f"rank {rank}: {name}: call {i} gave {y[:4].tolist()}, "
                                     f"expected {want}")
    for f in fusions.values():
        f.close()
    if rank != 0:
        return
    base = best["unfused"]
    print(f"# mcr tensor fusion: {args.count} x {n * xs[0].element_size()} B {args.dtype} "
          f"Iallreduce + Waitall, {size} ranks, backend {args.backend}, {device}")
    print(f"# minimum over {args.rounds} alternated rounds of the slowest rank's time")
    print(f"{'variant':<20}{'time (ms)':>12}{'speedup':>10}")
    for name, _ in variants:
        print(f"{name:<20}{best[name] * 1e3:>12.2f}{base / best[name]:>10.2f}")
    ratio = base / best[f"fused B={args.bucket}"]
    verdict = "met" if ratio >= TARGET else "NOT met"
    print(f"target: fused (B={args.bucket}) at least {TARGET:g}x faster than unfused: "
          f"{ratio:.2f}x, {verdict}")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; started outside mpiexec, it starts ``mpiexec`` itself."""
    args = parse_args(argv)
    return launch.main_in_job("mcr.bench.fusion", args.nprocs, argv, timeout=args.timeout,
                              work=lambda: _worker(args), in_job=args.worker)


if __name__ == "__main__":
    sys.exit(main())
