"""``python -m mcr.bench.compression``: compressed against uncompressed
collectives, per codec and size: bytes on the wire, time, and the largest
absolute error against the uncompressed result.

Started as a plain program, it runs itself on ``-n`` ranks through
:mod:`mcr.launch`; rank 0 prints the table. Each size is a float32 vector of
that many bytes per rank (Allreduce: the vector; Allgather and Alltoall: the
block each rank sends), of normal values; the time is the minimum over
``--rounds`` rounds of the mean over ``--iters`` blocking calls.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from mcr import backends, launch

__all__ = ["main"]

OPS = ("Allreduce", "Allgather", "Alltoall")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = UNITS.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _sizes(text: str) -> list[int]:
    """``"64K..64M"`` (powers of 4 between) or a comma list of sizes."""
    if ".." in text:
        lo, hi = (_size(t) for t in text.split(".."))
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= 4
        return out
    return [_size(t) for t in text.split(",")]


def _label(n: int) -> str:
    for unit in ("M", "K"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]}{unit}"
    return str(n)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mcr.bench.compression",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64K..64M",
                        help="bytes per rank: MIN..MAX (powers of 4) or a list (64K..64M)")
    parser.add_argument("--codecs", default="fp16,bf16,zfp:rate=8",
                        help="codecs, comma-separated (fp16,bf16,zfp:rate=8)")
    parser.add_argument("--ops", default="Allreduce",
                        help=f"operations, comma-separated, of {', '.join(OPS)} (Allreduce)")
    parser.add_argument("--backend", default="mpi", choices=backends.names(),
                        help="a registered backend (mpi)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=0,
                        help="calls per round (default: fewer for larger sizes)")
    launch.add_job_options(parser, timeout=1800)
    args = parser.parse_args(argv)
    try:
        args.sizes = _sizes(args.sizes)
    except (ValueError, IndexError):
        parser.error(f"--sizes: expected MIN..MAX or a list such as 64K,1M, got {args.sizes!r}")
    args.codecs = [c for c in args.codecs.split(",") if c]
    args.ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        parser.error(f"--ops: unknown {', '.join(bad)}; choose from {', '.join(OPS)}")
    if args.nprocs < 1 or args.rounds < 1:
        parser.error("-n and --rounds must be at least 1")
    return args


def _buffers(op: str, nbytes: int, size: int, rank: int, device: Any) -> tuple[Any, Any]:
    import torch
    n = max(nbytes // 4, 1)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(n * (size if op == "Alltoall" else 1), generator=g).to(device)
    y = torch.zeros(n if op == "Allreduce" else n * size, device=device)
    return x, y


def _call(comm: Any, op: str, x: Any, y: Any, backend: str, spec: str | None) -> None:
    from mcr import SUM
    args = (x, y, SUM) if op == "Allreduce" else (x, y)
    getattr(comm, op)(*args, backend=backend, compress=False if spec is None else spec)


def _timed(comm: Any, op: str, x: Any, y: Any, backend: str, spec: str | None,
           rounds: int, iters: int) -> tuple[float, int]:
    """(seconds per call, min over rounds; bytes this rank put on the wire per
    call, as the logger records them)."""
    import mcr.log
    mcr.log.reset()
    mcr.log.start(records=True)
    _call(comm, op, x, y, backend, spec)          # warm up: private comms, groups
    wire = mcr.log.records()[-1]["wire_bytes"]
    mcr.log.stop()
    mcr.log.reset()
    best = float("inf")
    for _ in range(rounds):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            _call(comm, op, x, y, backend, spec)
        best = min(best, (time.perf_counter() - t0) / iters)
    worst = comm.allreduce(best, op=__import__("mpi4py").MPI.MAX)
    return worst, wire


def _worker(args: argparse.Namespace) -> int:
    import torch

    import mcr
    from mcr import compress
    comm = mcr.COMM_WORLD
    size, rank = comm.size, comm.rank
    device = torch.device("cuda", rank % max(torch.cuda.device_count(), 1)) \
        if args.backend == "nccl" else torch.device("cpu")
    for spec in args.codecs:
        compress.codec(spec)            # a bad spec fails before any timing
    rows = []
    for op in args.ops:
        for nbytes in args.sizes:
            iters = args.iters or max(2, min(50, (8 << 20) // nbytes))
            x, y = _buffers(op, nbytes, size, rank, device)
            plain_t, _ = _timed(comm, op, x, y, args.backend, None, args.rounds, iters)
            exact = y.clone()
            # the uncompressed bytes each rank sends, counted as compress counts them
            per_block = x.numel() * 4 // (size if op == "Alltoall" else 1)
            plain_wire = per_block * (size - 1) * (2 if op == "Allreduce" else 1) // \
                (size if op == "Allreduce" else 1)
            rows.append((op, nbytes, "none", plain_wire, plain_t, 0.0))
            for spec in args.codecs:
                t, wire = _timed(comm, op, x, y, args.backend, spec, args.rounds, iters)
                err = (y - exact).abs().max().item()
                err = comm.allreduce(err, op=__import__("mpi4py").MPI.MAX)
                rows.append((op, nbytes, spec, wire, t, err))
    if rank == 0:
        print(f"# mcr.bench.compression: {size} ranks, backend {args.backend}, float32, "
              f"rounds {args.rounds}")
        print(f"{'op':<10} {'size':>6} {'codec':<12} {'wire bytes':>12} {'time us':>10} "
              f"{'speedup':>8} {'max abs err':>12}")
        base: dict[tuple[str, int], float] = {}
        for op, nbytes, spec, wire, t, err in rows:
            if spec == "none":
                base[(op, nbytes)] = t
            speed = base[(op, nbytes)] / t if t else float("nan")
            print(f"{op:<10} {_label(nbytes):>6} {spec:<12} {wire:>12} {t * 1e6:>10.1f} "
                  f"{speed:>8.2f} {err:>12.3g}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; started outside mpiexec, it starts ``mpiexec`` itself."""
    args = parse_args(argv)
    return launch.main_in_job("mcr.bench.compression", args.nprocs, argv, timeout=args.timeout,
                              work=lambda: _worker(args), in_job=args.worker)


if __name__ == "__main__":
    sys.exit(main())
