"""What the workloads share: process groups per variant, the all-to-all with
its backward, gradient allreduce overlapped with backward, and the example
command line.

A *variant* is a way to run the same torch.distributed calls: ``"mcr"``
(an mcr group choosing its backend per call, ``backend="auto"``),
``"mcr-mpi"`` (an mcr group on MPI), ``"gloo"`` and ``"nccl"`` (torch's own
groups; NCCL on this rank's GPU). :data:`VARIANTS` is the table;
:func:`group` makes one.

Every collective of a workload must be started in the same order on every
rank, also in backward, where the order follows each rank's graph:
:class:`Alltoall` runs in reverse on every rank or on none, and
:class:`GradientAllreduce` starts its allreduces in one fixed order, on a
group of their own (:func:`duplicate`).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

__all__ = ["VARIANTS", "Variant", "init", "group", "groups", "duplicate", "device", "blocks",
           "Stopwatch", "Alltoall", "alltoall", "GradientAllreduce", "update", "Trainer", "losses",
           "add_config_arguments", "config_from_args", "run_example"]


@dataclass(frozen=True)
class Variant:
    """How a variant's group is made: the torch.distributed backend, the mcr
    backend its calls run on (mcr groups only), and the device of its tensors."""

    backend: str
    mcr_backend: str | None = None
    device: str = "cpu"


VARIANTS = {
    "mcr": Variant("mcr", "auto"),
    "mcr-mpi": Variant("mcr", "mpi"),
    "gloo": Variant("gloo"),
    "nccl": Variant("nccl", device="cuda"),
    # CUDA tensors on mcr groups: auto (NCCL where the table says) and NCCL
    "mcr-cuda": Variant("mcr", "auto", device="cuda"),
    "mcr-nccl": Variant("mcr", "nccl", device="cuda"),
}


def init() -> None:
    """Start torch.distributed on this MPI job (once): the world group on
    Gloo, its rank, size and store from MPI (``import mcr`` teaches the
    ``env://`` rendezvous that once MPI is initialized; no MASTER_ADDR, no
    torchrun)."""
    import mcr  # noqa: F401  (registers the backend "mcr" and the rendezvous over MPI)
    from mpi4py import MPI  # noqa: F401  (initialized: a program without mpiexec is 1 rank)
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def group(variant: str) -> Any:
    """A new process group of every rank for ``variant`` (collective: every
    rank makes the same groups in the same order).

    Raises
    ------
    ValueError
        When ``variant`` is not in :data:`VARIANTS`.
    RuntimeError
        When the variant needs CUDA and there is none.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {', '.join(VARIANTS)}, got {variant!r}")
    how = VARIANTS[variant]
    if how.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"variant {variant!r}: needs CUDA, and torch sees no GPU")
    init()
    if how.device == "cuda":
        torch.cuda.set_device(device(variant))
    if how.backend == "mcr":
        from mcr.distributed import Options
        return dist.new_group(backend="mcr", pg_options=Options(backend=how.mcr_backend))
    return dist.new_group(backend=how.backend)


def duplicate(group: Any) -> Any:
    """A new process group of ``group``'s ranks on its backend (collective
    over the world): the data-parallel group of a workload whose
    model-parallel exchanges run on ``group``. Backward runs the two kinds
    of collectives interleaved in an order that depends on the shape of each
    rank's graph; on one group they could be matched wrongly across ranks,
    on two each keeps its own order."""
    ranks = dist.get_process_group_ranks(group)
    backend = dist.get_backend(group)
    if backend == "mcr":
        from mcr.distributed import Options
        return dist.new_group(ranks, backend="mcr",
                              pg_options=Options(backend=group.comm.backend))
    return dist.new_group(ranks, backend=backend)


def groups(variants: Iterable[str]) -> dict[str, Any]:
    """One process group per variant, by name (collective)."""
    return {name: group(name) for name in variants}


def device(variant: str) -> torch.device:
    """The device a variant's tensors live on (for CUDA: this rank's GPU)."""
    if VARIANTS[variant].device == "cuda":
        return torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def blocks(n: int, parts: int) -> list[int]:
    """``n`` split into ``parts`` contiguous blocks, the first ones one larger
    when it does not divide (experts and tables over ranks)."""
    return [n // parts + (i < n % parts) for i in range(parts)]


# -- Waiting for communication ------------------------------------------------

class Stopwatch:
    """Seconds spent inside its ``with`` blocks: a workload's time blocked on
    communication (waiting for exchanges and allreduces to complete)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._since = 0.0

    def __enter__(self) -> Stopwatch:
        self._since = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._since


# -- All-to-all with a backward ---------------------------------------------------

class _Received(torch.autograd.Function):
    """The rows an all-to-all received, joined to the graph of the rows sent:
    the gradient goes back by the reverse all-to-all (the splits swapped)."""

    @staticmethod
    def forward(ctx: Any, sent: torch.Tensor, received: torch.Tensor,
                exchange: Alltoall) -> torch.Tensor:
        ctx.exchange = exchange
        return received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        exchange = ctx.exchange
        send_splits, recv_splits = exchange.splits
        grad_sent = grad.new_empty(exchange.x.shape)
        with exchange.waiting:
            dist.all_to_all_single(grad_sent, grad.contiguous(), send_splits, recv_splits,
                                   group=exchange.group)
        return grad_sent, None, None


class Alltoall:
    """An all-to-all of rows in flight (``Ialltoallv``): row block ``i`` of
    ``x`` (``send_splits[i]`` rows) goes to rank ``i``, and ``recv_splits[j]``
    rows come from rank ``j``. :meth:`wait` returns the received rows.

    With ``backward`` (default: whether autograd is recording), the exchange
    runs in reverse in backward, sending the received rows' gradient back to
    their senders (blocking). It must be the same on every rank, as every
    collective: a rank whose ``x`` needs no gradient (an MoE rank without
    experts, a DLRM rank without tables) still takes part in the reverse
    exchange the others make. Time blocked in either direction goes to
    ``waiting``.
    """

    def __init__(self, x: torch.Tensor, send_splits: Sequence[int],
                 recv_splits: Sequence[int], group: Any,
                 waiting: Stopwatch | None = None, backward: bool | None = None) -> None:
        self.x = x
        self.splits = (list(send_splits), list(recv_splits))
        self.group = group
        self.waiting = waiting or Stopwatch()
        self.backward = torch.is_grad_enabled() if backward is None else backward
        self.out = x.new_empty((sum(recv_splits), *x.shape[1:]))
        self.work = dist.all_to_all_single(self.out, x.detach().contiguous(),
                                           self.splits[1], self.splits[0], group=group,
                                           async_op=True)

    def wait(self) -> torch.Tensor:
        """Wait for the exchange; the received rows (in the graph with ``backward``)."""
        with self.waiting:
            self.work.wait()
        if not self.backward:
            return self.out
        # a stand-in that needs a gradient, so that backward reaches the reverse
        # exchange on this rank too
        sent = self.x if self.x.requires_grad else self.x.detach().requires_grad_()
        apply: Any = _Received.apply           # untyped in torch's stubs
        received: torch.Tensor = apply(sent, self.out, self)
        return received


def alltoall(x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
             group: Any, waiting: Stopwatch | None = None,
             backward: bool | None = None) -> torch.Tensor:
    """The blocking :class:`Alltoall` (``Alltoallv``)."""
    return Alltoall(x, send_splits, recv_splits, group, waiting, backward).wait()


# -- Gradient allreduce overlapped with backward ---------------------------------

class GradientAllreduce:
    """Sums data-parallel gradients over the group, each one started (``async``)
    as soon as backward has accumulated it, so the allreduces of the last
    layers run while backward computes the first ones; :meth:`wait` before the
    optimizer step. One allreduce per parameter: no bucketing (the DDP
    workload shows bucketing).

    The allreduces start in one fixed order on every rank, the reverse of
    ``params`` (the order backward meets them in a feed-forward model): the
    order in which backward produces gradients depends on the shape of each
    rank's graph (an MoE rank without experts has a different one), and
    collectives started in different orders on different ranks would be
    matched wrongly. A gradient that is ready early waits for those before it.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], group: Any,
                 waiting: Stopwatch | None = None) -> None:
        self.group = group
        self.waiting = waiting or Stopwatch()
        self.order = list(params)[::-1]
        self.position = {id(p): i for i, p in enumerate(self.order)}
        self.ready = [False] * len(self.order)
        self.started = 0                       # order[:started] are in flight
        self.pending: list[Any] = []
        for p in self.order:
            hook: Any = p.register_post_accumulate_grad_hook   # untyped in torch's stubs
            hook(self._ready)

    def _ready(self, p: torch.Tensor) -> None:
        self.ready[self.position[id(p)]] = True
        while self.started < len(self.order) and self.ready[self.started]:
            self._start(self.order[self.started])

    def _start(self, p: torch.Tensor) -> None:
        if p.grad is None:            # unused on this rank, maybe not on others
            p.grad = torch.zeros_like(p)
        self.pending.append(dist.all_reduce(p.grad, group=self.group, async_op=True))
        self.started += 1

    def wait(self) -> None:
        """Start what backward did not reach, and wait for every allreduce."""
        while self.started < len(self.order):
            self._start(self.order[self.started])
        with self.waiting:
            for work in self.pending:
                work.wait()
        self.pending.clear()
        self.ready = [False] * len(self.order)
        self.started = 0


def update(loss: torch.Tensor, optimizer: torch.optim.Optimizer,
           allreduce: GradientAllreduce) -> torch.Tensor:
    """The end of a data-parallel step: backward from ``loss`` (which starts the
    gradient allreduces), wait for them, take the optimizer step. Returns
    ``loss``, detached."""
    torch.autograd.backward(loss)
    allreduce.wait()
    optimizer.step()
    return loss.detach()


# -- Training loop ------------------------------------------------------------------

class Trainer(Protocol):
    """A workload, built for one group: ``step()`` runs one training step and
    returns this rank's share of its loss (the shares sum to the loss of the
    global batch); ``waiting`` times what it spent blocked on communication
    (None where the waits are not its own: DDP's)."""

    @property
    def waiting(self) -> Stopwatch | None: ...

    def step(self) -> torch.Tensor: ...


def losses(shares: Sequence[torch.Tensor], group: Any) -> list[float]:
    """The loss of every step, from this rank's shares (one allreduce)."""
    total = torch.stack(list(shares)).double()
    dist.all_reduce(total, group=group)
    return [float(v) for v in total.cpu()]


# -- Example command line ---------------------------------------------------------

def add_config_arguments(parser: argparse.ArgumentParser, config: type) -> None:
    """One ``--name`` option per field of the ``config`` dataclass (its type,
    default and ``help`` metadata)."""
    for f in dataclasses.fields(config):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default),
                            default=f.default, help=f"{f.metadata.get('help', '')} "
                                                    f"(default {f.default})")


def config_from_args(config: type, args: argparse.Namespace) -> Any:
    """The ``config`` dataclass from the options of :func:`add_config_arguments`."""
    return config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config)})


def run_example(doc: str, config: type, build: Callable[..., Trainer],
                argv: Sequence[str] | None) -> int:
    """The example program of a workload: ``mpiexec -n N python -m
    mcr.workloads.NAME [--steps N] [--backend VARIANT] [sizes...]``; rank 0
    prints every step's loss and the steps per second (after the first step).
    """
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--backend", default="mcr", choices=list(VARIANTS),
                        help="the variant to run on (default mcr)")
    add_config_arguments(parser, config)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps: expected at least 2 (the first warms up), got {args.steps}")
    pg = group(args.backend)
    trainer = build(config_from_args(config, args), pg, device(args.backend))
    shares = [trainer.step()]
    dist.barrier(group=pg)
    t0 = time.perf_counter()
    shares += [trainer.step() for _ in range(args.steps - 1)]
    _ = [s.item() for s in shares]       # the device has finished the last step
    # on pg (so on the variant's device: NCCL reduces no host tensor), not on
    # the default group: torch 2.13 keeps the default group's Gloo threads
    # running after destroy_process_group once torch._dynamo is imported
    # (torch.optim imports it), and a Gloo thread that drops the last
    # reference to a tensor while the interpreter exits aborts the process
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64,
                           device=device(args.backend))
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=pg)
    trajectory = losses(shares, pg)
    if dist.get_rank() == 0:
        for i, loss in enumerate(trajectory):
            print(f"step {i:4d}  loss {loss:.6f}")
        print(f"{args.backend}: {dist.get_world_size()} ranks, "
              f"{(args.steps - 1) / float(elapsed):.2f} steps/s (steps 1-{args.steps - 1})")
    dist.destroy_process_group()
    return 0
