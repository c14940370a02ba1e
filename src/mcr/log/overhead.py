"""What the logger costs per call: ``python -m mcr.log overhead``.

Times small calls on MPI with the logger off, on with totals only
(``MCR_LOG=summary``) and on keeping every record (``json``/``trace``), in
alternated rounds in one job, and prints the minimum of the round averages
and the difference to "off" per call. Started outside ``mpiexec``, it
launches itself (``-n`` ranks) through :mod:`mcr.launch`.
"""

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

MODES = ("off", "summary", "records")
CALLS = ("Allreduce 4 B", "Iallreduce+Wait 4 B", "Bcast 4 B", "Allreduce 4 KiB")


def _calls(comm: Any) -> dict[str, Callable[[], None]]:
    import torch
    x, y = torch.ones(1), torch.empty(1)
    big_x, big_y = torch.ones(1024), torch.empty(1024)
    return {
        "Allreduce 4 B": lambda: comm.Allreduce(x, y),
        "Iallreduce+Wait 4 B": lambda: comm.Iallreduce(x, y).Wait(),
        "Bcast 4 B": lambda: comm.Bcast(x, 0),
        "Allreduce 4 KiB": lambda: comm.Allreduce(big_x, big_y),
    }


def _set_mode(mode: str) -> None:
    import mcr.log
    if mode == "off":
        mcr.log.stop()
    else:
        mcr.log.start(records=mode == "records")
    mcr.log.reset()


def worker(iters: int, rounds: int) -> None:
    """Run on every rank; rank 0 prints the table."""
    import mcr
    import mcr.log
    comm = mcr.COMM_WORLD
    calls = _calls(comm)
    best = {(name, mode): float("inf") for name in calls for mode in MODES}
    for _ in range(rounds):
        for name, fn in calls.items():
            for mode in MODES:
                _set_mode(mode)
                for _ in range(max(iters // 10, 10)):     # warm up
                    fn()
                comm.Barrier()
                t = time.perf_counter()
                for _ in range(iters):
                    fn()
                elapsed = (time.perf_counter() - t) / iters
                best[name, mode] = min(best[name, mode], elapsed)
        mcr.log.records()          # what a kept record costs later is paid in the run
    _set_mode("off")
    if comm.rank == 0:
        print(f"mcr.log overhead: {comm.size} ranks, {iters} calls x {rounds} alternated "
              "rounds, minimum of the round averages (us per call)")
        print(f"{'call':<22}{'off':>9}{'summary':>10}{'records':>10}"
              f"{'+summary':>10}{'+records':>10}")
        for name in calls:
            off, summ, rec = (best[name, m] * 1e6 for m in MODES)
            print(f"{name:<22}{off:>9.2f}{summ:>10.2f}{rec:>10.2f}{summ - off:>+10.2f}"
                  f"{rec - off:>+10.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcr.log overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--nprocs", type=int, default=2,
                        help="ranks to launch when started outside mpiexec (default 2)")
    parser.add_argument("--iters", type=int, default=20000,
                        help="calls per timed run (default 20000)")
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds (default 5)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds before the job is stopped (default 600)")
    args = parser.parse_args(argv)
    for name in ("nprocs", "iters", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive number, got {getattr(args, name)}")
    from mcr import launch
    if launch.launched():
        worker(args.iters, args.rounds)
        return 0
    return launch.run_module(args.nprocs, ["mcr.log", "overhead", "--iters", str(args.iters),
                                           "--rounds", str(args.rounds)],
                             timeout=args.timeout, name="mcr.log overhead")
