"""The worker of ``python -m mcr.bench compare``: runs on every rank under
mpiexec and times the Python peers (mpi4py, torch.distributed, mcr) on the
operations of :mod:`mcr.bench.ops`; rank 0 writes the rounds as JSON.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .cli import C_PEERS, FORM_PEERS, ITEMSIZE, MIN_ITERS, column, counted_sizes, iterations

__all__ = ["worker"]


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

    def total(n: int) -> Any:
        return ops.reduce_all([values(r, n, True) for r in range(size)], dtype)

    def filled(vals: Any) -> Any:
        buf = make(vals.numel(), dtype)
        buf.copy_(vals)
        return buf

    def expect(buf: Any, vals: Any) -> Callable[[], str | None]:
        return lambda: ops.mismatch(buf, vals, f"{op}: rank {rank}: buffer")

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
        if op == "allreduce":
            return functools.partial(dist.all_reduce, buf, **red, **g), \
                expect(buf, total(count))
        check = expect(buf, total(count)) if rank == 0 else (lambda: None)
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
        return functools.partial(reduce_scatter, recv, send, **red, **g), \
            expect(recv, total(blk * size)[rank * blk:(rank + 1) * blk])
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
        # an mcr peer runs on a communicator whose default is its backend, so
        # that its calls are written as users write them (no backend= keyword)
        for peer, comm in self.comms.items():
            if peer.startswith("mcr-"):
                comm.backend = peer.split("-", 1)[1]
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
        """init_process_group("gloo") on a store bootstrapped over MPI, as mcr does."""
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
        return ops.P2P_OPERATIONS[op](comm, count, self.dtype, make)

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
        return _Entry(name, _positional(case.run(form)), case.check, case.close, halve)

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
        iters, warmup = iterations(self.args, nbytes)
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
            for nbytes in counted_sizes(op, args.sizes, args.dtype):
                results[op][str(nbytes)] = w.measure(op, nbytes)
            if w.rank == 0:
                print(f"compare: {op} done ({time.perf_counter() - start:.0f} s)",
                      file=sys.stderr, flush=True)
    finally:
        w.close()
    if w.rank == 0:
        with open(args.worker, "w") as f:
            json.dump({"nprocs": w.size, "info": w.info, "results": results}, f)
