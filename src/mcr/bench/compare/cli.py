"""The command line of ``python -m mcr.bench compare``: the peers, operations,
forms and sizes it times, parsed and checked. No MPI here: the driver reads it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from mcr._outputs import unwritable, unwritable_figure
from mcr.bench.ops import FORMS, NAMES

__all__ = ["parse_args", "column", "OPS", "FORMS", "PEERS", "C_PEERS", "FORM_PEERS",
           "CUDA_PEERS", "DTYPES", "C_DTYPES", "ITEMSIZE", "LARGE", "MIN_ITERS",
           "counted_sizes", "iterations", "pyplot"]

OPS = NAMES                 # every operation of mcr.bench.ops, collectives then latency
FORM_SUFFIX = {"blocking": "", "nonblocking": " nb", "persistent": " pers"}
PEERS = ("C", "C-mt", "mpi4py-numpy", "mpi4py-torch", "torch-gloo", "torch-nccl",
         "mcr-gloo", "mcr-nccl", "mcr-mpi", "mcr-auto")
C_PEERS = ("C", "C-mt")
FORM_PEERS = ("C", "C-mt", "mcr-mpi")     # the peers timed in every form
CUDA_PEERS = ("torch-nccl", "mcr-nccl")
DEFAULT_PEERS = PEERS
SUMMARY_SIZES = "4,64,1024,16384,262144,1048576,4194304"
C_DTYPES = ("float32", "float64", "int8", "uint8", "int16", "int32", "int64")
DTYPES = C_DTYPES + ("float16", "bfloat16", "complex64", "complex128", "bool")
ITEMSIZE = {"float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2, "int32": 4,
            "int64": 8, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16,
            "bool": 1}
LARGE = 8192            # bytes; above, fewer iterations (OSU's LARGE_MESSAGE_SIZE)
MIN_ITERS = 5           # timed calls per loop, at least, however slow the peer


def column(peer: str, form: str) -> str:
    """The table column of ``peer`` timed in ``form`` (``"mcr-mpi pers"``)."""
    return peer + FORM_SUFFIX[form]



def _names(text: str, known: Sequence[str], what: str,
           parser: argparse.ArgumentParser) -> list[str]:
    if text == "all":
        return list(known)
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad or not names:
        parser.error(f"{what}: unknown {', '.join(bad) or 'empty list'}; "
                     f"choose from {', '.join(known)} or all")
    return [x for x in known if x in names]


def _runs(peer: str, dtype: str) -> bool:
    """Whether ``peer`` can time ``dtype`` (the others' cells say why not)."""
    if peer in C_PEERS:
        return dtype in C_DTYPES
    return not (peer.startswith("mpi4py") and dtype == "bfloat16")


def _sizes(text: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        lo, _, hi = text.rpartition(":")
        low, high = int(lo or 1), int(hi)
    except ValueError:
        parser.error(f"-m: expected MIN:MAX or MAX in bytes, got {text!r}")
    if low < 1 or high < low:
        parser.error(f"-m: expected 1 <= MIN <= MAX, got {low}:{high}")
    sizes = []
    while low <= high:
        sizes.append(low)
        low *= 2
    return sizes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line of ``python -m mcr.bench compare``.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (default ``sys.argv[1:]``).

    Returns
    -------
    argparse.Namespace
        With ``ops``, ``forms`` and ``peers`` as lists and ``sizes`` as the
        list of message sizes in bytes.
    """
    p = argparse.ArgumentParser(
        prog="python -m mcr.bench compare",
        description="Time mcr against C, mpi4py and torch.distributed side by side "
                    "(starts mpiexec itself).",
        epilog="Example: python -m mcr.bench compare -n 2 --ops allreduce,bcast "
               "-m 4:1048576 --forms blocking,persistent --plot compare.png.  Exit "
               "status: 0 done, 1 a failed job or an unwritten --json/--plot, 2 a bad "
               "option (checked before anything runs: one under which nothing would be "
               "timed, an unwritable --json or --plot), 130 interrupted (Ctrl-C stops "
               "the job).")
    p.add_argument("-n", "--nprocs", type=int, default=2, help="world size (default 2)")
    p.add_argument("--ops", default="allreduce",
                   help=f"comma-separated operations or 'all' ({', '.join(OPS)}); "
                        "default allreduce")
    p.add_argument("-m", "--message-size", default="4:1048576", metavar="[MIN:]MAX",
                   help="message sizes in bytes, doubling from MIN (default 4:1048576)")
    p.add_argument("-i", "--iterations", type=int, default=1000, metavar="ITER",
                   help="timed calls per loop up to 8 KiB (default 1000); above, "
                        "--iterations-large")
    p.add_argument("-x", "--warmup", type=int, default=200,
                   help="warm-up calls before each loop up to 8 KiB (default 200)")
    p.add_argument("--iterations-large", type=int, default=None, metavar="ITER",
                   help="timed calls per loop above 8 KiB (default ITER / 10)")
    p.add_argument("--warmup-large", type=int, default=None, metavar="WARMUP",
                   help="warm-up calls above 8 KiB (default WARMUP / 20)")
    p.add_argument("--loop-time", type=float, default=0.05, metavar="SECONDS",
                   help="cap on one timed loop of a Python peer: slow peers make "
                        f"fewer calls, at least {MIN_ITERS} (default 0.05)")
    p.add_argument("--rounds", type=int, default=5,
                   help="timed loops per peer, operation and size (default 5)")
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="element type (default float32; C has no float16, bfloat16, "
                        "complex or bool)")
    p.add_argument("--forms", default="blocking,persistent",
                   help="forms for C and mcr-mpi: blocking, nonblocking, persistent "
                        "(default blocking,persistent); the other peers are blocking")
    p.add_argument("--peers", default=None,
                   help=f"implementations to time ({', '.join(PEERS)}); default all "
                        "that can run --buffer and --dtype (the NCCL ones need --buffer "
                        "torch-cuda)")
    p.add_argument("--buffer", default="torch", choices=("torch", "torch-cuda"),
                   help="where the tensors live (default torch: CPU)")
    p.add_argument("--plot", metavar="FILE",
                   help="draw latency against message size, one panel per operation "
                        "(needs matplotlib: pip install 'mcr[bench]')")
    p.add_argument("--json", metavar="FILE", help="write every round and summary to FILE")
    p.add_argument("--summary", nargs="?", const=SUMMARY_SIZES, metavar="SIZES",
                   help="also print one table of every operation at these message sizes "
                        "(bytes, comma-separated; without a value: "
                        f"{SUMMARY_SIZES})")
    p.add_argument("--timeout", type=float, default=3600,
                   help="seconds before a launched job is killed (default 3600)")
    p.add_argument("--worker", metavar="FILE", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.ops = _names(args.ops, OPS, "--ops", p)
    args.forms = _names(args.forms, FORMS, "--forms", p)
    named = args.peers is not None
    args.peers = _names(args.peers if named else ",".join(DEFAULT_PEERS), PEERS, "--peers", p)
    if "blocking" not in args.forms:
        args.forms.insert(0, "blocking")      # every ratio is taken against it
    if args.buffer != "torch-cuda":
        cuda = [x for x in args.peers if x in CUDA_PEERS]
        if named and cuda:
            p.error(f"--peers {','.join(cuda)}: NCCL runs on CUDA tensors only, and --buffer "
                    f"is {args.buffer} (give --buffer torch-cuda, or leave them out)")
        args.peers = [x for x in args.peers if x not in CUDA_PEERS]
    if not any(_runs(peer, args.dtype) for peer in args.peers):
        why = ([f"the C reference has only {', '.join(C_DTYPES)}"]
               if any(x in C_PEERS for x in args.peers) else []) + \
              (["mpi4py has no bfloat16"] if any(x.startswith("mpi4py") for x in args.peers)
               else [])
        p.error(f"--dtype {args.dtype}: none of --peers {','.join(args.peers)} can run it "
                f"({'; '.join(why)})")
    args.sizes = _sizes(args.message_size, p)
    itemsize = ITEMSIZE[args.dtype]
    if any(op != "barrier" for op in args.ops) and max(args.sizes) < itemsize:
        p.error(f"-m {args.message_size}: no message size holds one {args.dtype} element "
                f"({itemsize} bytes)")
    if isinstance(args.summary, str):
        try:
            args.summary = [int(x) for x in args.summary.split(",") if x.strip()]
        except ValueError:
            p.error(f"--summary: expected comma-separated byte counts, got {args.summary!r}")
    for option, value, least in (("-n", args.nprocs, 1), ("-i", args.iterations, 1),
                                 ("--rounds", args.rounds, 1), ("-x", args.warmup, 0),
                                 ("--iterations-large", args.iterations_large, 1),
                                 ("--warmup-large", args.warmup_large, 0)):
        if value is not None and value < least:
            p.error(f"{option}: expected at least {least}, got {value}")
    for option, seconds in (("--loop-time", args.loop_time), ("--timeout", args.timeout)):
        if not seconds > 0:
            p.error(f"{option}: expected seconds > 0, got {seconds:g}")
    if args.iterations_large is None:
        args.iterations_large = max(1, args.iterations // 10)
    if args.warmup_large is None:
        args.warmup_large = max(1, args.warmup // 20) if args.warmup else 0
    if args.plot and not args.worker:
        pyplot()                          # fail now, not after the run
    for option, path, check in (("--json", args.json, unwritable),
                                ("--plot", args.plot, unwritable_figure)):
        problem = check(path) if path and not args.worker else None
        if problem:
            p.error(f"{option} {path}: {problem}")
    return args


def pyplot() -> Any:
    try:
        mpl = importlib.import_module("matplotlib")
    except ImportError:
        sys.exit("error: --plot needs matplotlib: pip install 'mcr[bench]' "
                 "(or pip install matplotlib)")
    mpl.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def counted_sizes(op: str, sizes: Sequence[int], dtype: str) -> list[int]:
    """The sizes in bytes an operation is timed at: whole elements; barrier: 0."""
    if op == "barrier":
        return [0]
    return [n for n in sizes if n >= ITEMSIZE[dtype]]


def iterations(args: argparse.Namespace, nbytes: int) -> tuple[int, int]:
    if nbytes > LARGE:
        return args.iterations_large, args.warmup_large
    return args.iterations, args.warmup
