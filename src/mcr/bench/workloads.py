"""The paper's workloads side by side: ``python -m mcr.bench.workloads [options]``.

Trains each workload of :mod:`mcr.workloads` (the MoE layer, the DLRM-style
model, the DDP transformer) on one process group per variant (``mcr``: an
mcr group choosing its backend per call; ``mcr-mpi``: an mcr group on MPI;
``gloo``: torch's Gloo; ``nccl``: torch's NCCL, on GPUs), all made in one
job. Each variant has its own copy of the model, from the same parameters and
data. Rounds of ``--steps`` steps alternate between the variants (their order
rotating each round) after one warm-up round; a round's time is the slowest
rank's, and a variant's figure is its best round in steps per second. The
loss of every step is compared across the variants: they compute the same
thing, so they differ only by the order of floating-point sums (none at 2
ranks; at more, Gloo sums in another order than MPI). Training amplifies
such differences (after some 50 Adam steps the transformer's losses drift
apart by more than rounding), so agreement is judged over the warm-up
round, the first ``--steps`` steps from the same start, and the largest
difference over all steps is shown beside it.

Started as a plain program, it runs itself under ``mpiexec -n N``
(:mod:`mcr.launch`); rank 0 prints the table. ``--log`` then runs
``--steps`` more steps per mcr variant under mcr's logger and prints where
their communication time went, per operation and message size.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from mcr import launch
from mcr._outputs import unwritable
from mcr.workloads import WORKLOADS

__all__ = ["main", "parse_args"]

TARGET = 2.0                    # the goal: mcr at least 2x Gloo in steps/s ...
TARGET_WORKLOADS = ("moe", "dlrm")   # ... on these workloads, on CPU
AGREE_RTOL = 1e-4               # losses agree when within this of each other, relatively


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line (default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(
        prog="python -m mcr.bench.workloads", description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 done, 2 a bad option (checked before the job starts: "
               "sizes below 1, a CUDA variant without a GPU, an unwritable --json), 130 "
               "interrupted (Ctrl-C stops the job), another a failed job or an unwritten "
               "--json.")
    parser.add_argument("--workloads", default="moe,dlrm,transformer",
                        help="comma-separated, of moe, dlrm, transformer (all)")
    parser.add_argument("--variants", default="mcr,mcr-mpi,gloo",
                        help="comma-separated, of mcr, mcr-mpi, gloo, nccl (mcr,mcr-mpi,gloo)")
    parser.add_argument("--steps", type=int, default=20, help="steps per round (20)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per variant (5)")
    parser.add_argument("--set", action="append", default=[], metavar="WORKLOAD.FIELD=VALUE",
                        help="change a size from its default, e.g. moe.hidden=256 "
                             "(repeatable; the fields are the workload's Config)")
    parser.add_argument("--log", action="store_true",
                        help="then log --steps steps per mcr variant: time per operation")
    parser.add_argument("--json", metavar="PATH", help="write every figure and loss here")
    launch.add_job_options(parser, timeout=900)
    args = parser.parse_args(argv)
    from mcr.workloads.common import VARIANTS
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.variants = [v for v in args.variants.split(",") if v]
    for what, chosen, known in (("--workloads", args.workloads, WORKLOADS),
                                ("--variants", args.variants, VARIANTS)):
        bad = [x for x in chosen if x not in known]
        if bad or not chosen or len(set(chosen)) != len(chosen):
            parser.error(f"{what}: expected distinct names of {', '.join(known)}, "
                         f"got {','.join(chosen)!r}")
    for name in ("nprocs", "steps", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected at least 1, got {getattr(args, name)}")
    cuda = [v for v in args.variants if VARIANTS[v].device == "cuda"]
    if cuda:
        import torch
        if not torch.cuda.is_available():
            parser.error(f"--variants {','.join(cuda)}: needs CUDA, and torch sees no GPU "
                         f"(torch {torch.__version__}, torch.cuda.is_available() is False)")
    try:
        args.configs = _configs(args.set, args.workloads)
    except ValueError as exc:
        parser.error(f"--set: {exc}")
    problem = unwritable(args.json) if args.json else None
    if problem:
        parser.error(f"--json {args.json}: {problem}")
    return args


def _configs(settings: Sequence[str], workloads: Sequence[str]) -> dict[str, Any]:
    """Each workload's Config, with the ``WORKLOAD.FIELD=VALUE`` settings applied."""
    configs = {w: importlib.import_module(f"mcr.workloads.{w}").Config() for w in workloads}
    for setting in settings:
        key, sep, value = setting.partition("=")
        workload, _, name = key.partition(".")
        if not sep or workload not in configs:
            raise ValueError(f"expected WORKLOAD.FIELD=VALUE with WORKLOAD one of "
                             f"{', '.join(workloads)}, got {setting!r}")
        fields = {f.name: f for f in dataclasses.fields(configs[workload])}
        if name not in fields:
            raise ValueError(f"{workload} has no size {name!r}; it has {', '.join(fields)}")
        kind = type(getattr(configs[workload], name))
        try:
            setattr(configs[workload], name, kind(value))
        except ValueError:
            raise ValueError(f"{key}: expected {kind.__name__}, got {value!r}") from None
        number = getattr(configs[workload], name)
        # every int but the seed is a size or a count
        if kind is int and name != "seed" and number < 1:
            raise ValueError(f"{key}: expected at least 1, got {number}")
        if kind is float and not 0 <= number < math.inf:
            raise ValueError(f"{key}: expected a finite number >= 0, got {value!r}")
    return configs


def _sync(device: Any) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _losses(shares: Sequence[Any]) -> list[float]:
    """Every step's loss, summed over the ranks by MPI (not by a variant's group)."""
    import numpy
    from mpi4py import MPI
    local = numpy.array([float(s) for s in shares], dtype=numpy.float64)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, local)
    return [float(v) for v in local]


def _bench(workload: str, args: argparse.Namespace, groups: dict[str, Any]) -> dict[str, Any]:
    """Time ``workload`` on every variant; its row of the table, as a dict."""
    from mpi4py import MPI

    from mcr.workloads import common
    world = MPI.COMM_WORLD
    module = importlib.import_module(f"mcr.workloads.{workload}")
    build = getattr(module, WORKLOADS[workload])
    variants = args.variants
    trainers = {v: build(args.configs[workload], groups[v], common.device(v)) for v in variants}
    shares: dict[str, list[Any]] = {v: [] for v in variants}
    rounds: dict[str, list[float]] = {v: [] for v in variants}
    blocked: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds + 1):              # round 0 warms up
        for i in range(len(variants)):
            v = variants[(i + r) % len(variants)]
            waiting = trainers[v].waiting
            waited = waiting.seconds if waiting else 0.0
            world.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                shares[v].append(trainers[v].step())
            _sync(common.device(v))
            elapsed = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            waited = world.allreduce(waiting.seconds - waited if waiting else float("nan"))
            if r:
                rounds[v].append(elapsed)
                blocked[v].append(waited / world.Get_size())
    losses = {v: _losses(shares[v]) for v in variants}
    ref = losses[variants[0]]
    diff = max(abs(a - b) for v in variants for a, b in zip(losses[v], ref))
    first = max(abs(a - b) for v in variants
                for a, b in zip(losses[v][:args.steps], ref[:args.steps]))
    agree = all(abs(a - b) <= AGREE_RTOL * max(abs(b), 1e-12) for v in variants
                for a, b in zip(losses[v][:args.steps], ref[:args.steps]))
    logs = _logged(trainers, args) if args.log else {}
    return {"workload": workload, "ranks": world.Get_size(), "steps": args.steps,
            "config": dataclasses.asdict(args.configs[workload]),
            "steps_per_s": {v: args.steps / min(rounds[v]) for v in variants},
            "round_s": rounds, "blocked_s": blocked, "losses": losses,
            "max_abs_diff_warmup": first, "max_abs_diff": diff, "agree": agree,
            "log": logs}


def _logged(trainers: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``--steps`` more steps of each mcr variant under mcr's logger: its
    summary, the steps' time (slowest rank) and this rank's time blocked."""
    from mpi4py import MPI

    import mcr.log
    from mcr.workloads.common import VARIANTS, device
    out = {}
    for v, trainer in trainers.items():
        if VARIANTS[v].backend != "mcr":
            continue
        mcr.log.reset()
        waited = trainer.waiting.seconds if trainer.waiting else float("nan")
        MPI.COMM_WORLD.Barrier()
        mcr.log.start()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            trainer.step()
        _sync(device(v))
        elapsed = time.perf_counter() - t0
        mcr.log.stop()
        if trainer.waiting:
            waited = trainer.waiting.seconds - waited
        out[v] = {"elapsed_s": MPI.COMM_WORLD.allreduce(elapsed, op=MPI.MAX),
                  "blocked_s": waited, "summary": mcr.log.summary()}
    mcr.log.reset()
    return out


def _table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    variants = args.variants
    ratios = [v for v in variants if v != "gloo"] if "gloo" in variants else []
    head = (f"{'workload':<12}{'ranks':>6}" + "".join(f"{v:>10}" for v in variants) +
            "".join(f"{v + '/gloo':>14}" for v in ratios) +
            f"{'loss max|diff|':>16}{'(all steps)':>13}  agree")
    lines = [head]
    for row in rows:
        speed = row["steps_per_s"]
        lines.append(f"{row['workload']:<12}{row['ranks']:>6}" +
                     "".join(f"{speed[v]:>10.2f}" for v in variants) +
                     "".join(f"{speed[v] / speed['gloo']:>14.2f}" for v in ratios) +
                     f"{row['max_abs_diff_warmup']:>16.2e}{row['max_abs_diff']:>13.2e}  "
                     f"{'yes' if row['agree'] else 'NO'}")
    judged = [r for r in rows if r["workload"] in TARGET_WORKLOADS]
    if "mcr" in variants and "gloo" in variants and judged:
        speedups = [(r["workload"], r["steps_per_s"]["mcr"] / r["steps_per_s"]["gloo"])
                    for r in judged]
        verdicts = [f"{name} {x:.2f}x {'met' if x >= TARGET else 'NOT met'}"
                    for name, x in speedups]
        lines.append(f"target: mcr at least {TARGET:g}x gloo in steps/s on "
                     f"{' and '.join(TARGET_WORKLOADS)}: {', '.join(verdicts)}")
    return "\n".join(lines)


def _time_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Per variant, a step's time (mean over the timed rounds, slowest rank),
    how much of it a rank spent blocked on communication (mean over ranks),
    and the rest: computing (and, for Gloo, competing with its threads). On
    GPUs NCCL's waits are stream-ordered and return at once: its blocked
    time says nothing there."""
    lines = [f"{'workload':<12}{'variant':<10}{'step ms':>9}{'blocked ms':>12}{'rest ms':>9}"]
    for row in rows:
        for v in args.variants:
            step = sum(row["round_s"][v]) / len(row["round_s"][v]) / row["steps"] * 1e3
            waited = sum(row["blocked_s"][v]) / len(row["blocked_s"][v]) / row["steps"] * 1e3
            known = waited == waited                  # not NaN: the workload's own waits
            lines.append(f"{row['workload']:<12}{v:<10}{step:>9.2f}" +
                         (f"{waited:>12.2f}{step - waited:>9.2f}" if known else
                          f"{'-':>12}{'-':>9}"))
    return "\n".join(lines)


def _log_report(row: dict[str, Any]) -> str:
    from mcr.log import format_summary
    parts = []
    for v, logged in row["log"].items():
        rows = logged["summary"]["rows"]
        step_ms = logged["elapsed_s"] * 1e3 / row["steps"]
        blocked = logged["blocked_s"] * 1e3 / row["steps"]
        title = (f"{row['workload']} on {v}, rank 0: {row['steps']} steps of {step_ms:.2f} ms, "
                 f"{'-' if blocked != blocked else f'{blocked:.2f}'} ms of each blocked on "
                 f"communication; a call's time runs from its post to its completion, "
                 f"so a non-blocking call's includes the compute it overlaps")
        parts.append(format_summary(rows, title))
    return "\n\n".join(parts)


def _worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed
    from mpi4py import MPI

    from mcr.workloads import common
    torch.manual_seed(0)
    groups = common.groups(args.variants)
    rows = [_bench(w, args, groups) for w in args.workloads]
    # before exit: torch's Gloo threads can abort at interpreter shutdown
    torch.distributed.destroy_process_group()
    if MPI.COMM_WORLD.Get_rank() != 0:
        return 0
    devices = sorted({str(common.device(v)) for v in args.variants})
    print(f"# mcr.bench.workloads: {MPI.COMM_WORLD.Get_size()} ranks, "
          f"{', '.join(devices)}, {torch.get_num_threads()} thread(s) per rank; "
          f"{args.steps} steps per round, best of {args.rounds} alternated rounds after a "
          f"warm-up round; steps/s of the slowest rank")
    print(_table(rows, args))
    print()
    print("# where a step's time goes: blocked = waiting for communication to complete "
          "(DDP's waits are its own: not counted)")
    print(_time_table(rows, args))
    for row in rows:
        if row["log"]:
            print()
            print(_log_report(row))
    sys.stdout.flush()
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump({"argv": sys.argv[1:], "rows": rows}, f, indent=1)
        except OSError as exc:
            print(f"python -m mcr.bench.workloads: error: --json {args.json}: cannot write "
                  f"the figures: {exc.strerror or exc}", file=sys.stderr, flush=True)
            return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; started outside mpiexec, it starts ``mpiexec`` itself."""
    args = parse_args(argv)
    try:
        return launch.main_in_job("mcr.bench.workloads", args.nprocs, argv,
                                  timeout=args.timeout, work=lambda: _worker(args),
                                  in_job=args.worker)
    except KeyboardInterrupt:
        if args.worker or launch.launched():
            raise
        # the job was stopped on the way out of mcr.launch.run
        print("python -m mcr.bench.workloads: interrupted; the job was stopped",
              file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
