"""A mixture-of-experts (MoE) layer's training step, expert-parallel.

Run it as an example::

    mpiexec -n 2 python -m mcr.workloads.moe [--steps N] [--backend mcr|mcr-mpi|gloo|nccl]

**The layer.** ``out = x + shared(x) + gate * expert[router(x)](x)``: a
linear router picks one expert per token (top-1 of a softmax, the gate being
its probability), ``experts`` two-layer MLPs are spread over the ranks in
contiguous blocks (expert-parallel), and a shared two-layer MLP (as in
DeepSpeed's residual MoE) is data-parallel like the router. The loss is the
squared error against a fixed random target function of ``x``.

**The step**, on each rank's slice of the global batch of ``tokens`` tokens:

1. route: the router's choice, the tokens sorted by expert (stably);
2. exchange the token counts per expert (a small all-to-all), which fix the
   uneven splits of the next two exchanges;
3. start the all-to-all of the token rows to the ranks that own their experts
   (``Ialltoallv``: ``all_to_all_single(..., async_op=True)`` with split
   sizes), and compute the shared MLP while the tokens are in flight;
4. run each local expert on its rows, from every rank;
5. send the results back (``Alltoallv``), unsort, weigh by the gate;
6. backward: the two exchanges run in reverse (their gradients go back to the
   senders), while each router and shared-MLP gradient is summed over the
   ranks by an ``all_reduce(async_op=True)`` started as soon as backward has
   produced it, overlapping what backward still computes (on a second group
   of the same ranks: DeepSpeed too keeps expert- and data-parallel groups
   apart); expert gradients need no allreduce (every token that used an
   expert is on its rank);
7. wait for the allreduces, SGD step.

**Same data everywhere.** The global batch, the parameters (each expert from
its own seed) and so the loss of every step are the same at every world size
and on every backend, up to the order of floating-point sums.

**Sizes.** The defaults (a global batch of 4096 tokens of width 64, MLPs of
hidden width 128, 4 experts) keep a step to ~15 ms on two CPU cores, and
make communicating cost about as much as computing, as in the paper's MoE
steps: each exchange moves 512 KiB per rank, and at 2 ranks a step computes
for ~15 ms while Gloo keeps it blocked on communication for another ~10 ms
(MPI: ~2 ms). What sets the balance is the MLPs' arithmetic per byte
exchanged, i.e. their hidden width: a GPU does hundreds of times more
arithmetic per byte its network moves than a CPU core does per byte MPI
moves through shared memory, so a GPU-sized layer (hidden 4096) would be all
compute here, and run as fast on every backend. Measured at 2 ranks: hidden
256 gives mcr ~1.2x Gloo; fewer tokens per rank make the step latency-bound
and widen the gap (1024 tokens: ~2.3x).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import common

__all__ = ["Config", "MoE", "main"]


@dataclass
class Config:
    """The sizes of the MoE workload (global: the same at every world size)."""

    tokens: int = field(default=4096, metadata={"help": "tokens per step, all ranks together"})
    width: int = field(default=64, metadata={"help": "token width (model dimension)"})
    hidden: int = field(default=128, metadata={"help": "hidden width of every MLP"})
    experts: int = field(default=4, metadata={"help": "experts, spread over the ranks"})
    batches: int = field(default=4, metadata={"help": "distinct batches, cycled"})
    lr: float = field(default=0.05, metadata={"help": "SGD learning rate"})
    seed: int = field(default=0, metadata={"help": "seed of the data and the parameters"})


def mlp(width: int, hidden: int, seed: int) -> nn.Sequential:
    """A two-layer MLP whose parameters depend on ``seed`` alone."""
    gen = torch.Generator().manual_seed(seed)
    layers = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, width))
    with torch.no_grad():
        for p in layers.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return layers


def router(config: Config) -> nn.Linear:
    """The router: token -> one logit per expert."""
    gen = torch.Generator().manual_seed(config.seed * 1000 + 1)
    layer = nn.Linear(config.width, config.experts, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) /
                           config.width ** 0.5)
    return layer


def expert_seed(config: Config, e: int) -> int:
    """The seed of expert ``e``'s parameters (the same on whichever rank owns it)."""
    return config.seed * 1000 + 100 + e


def shared_seed(config: Config) -> int:
    """The seed of the shared MLP's parameters."""
    return config.seed * 1000 + 2


def data(config: Config) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batches: (tokens, targets), each of shape (tokens, width)."""
    gen = torch.Generator().manual_seed(config.seed * 1000 + 3)
    w = config.width
    teacher_in = torch.randn(w, w, generator=gen) / w ** 0.5
    teacher_out = torch.randn(w, w, generator=gen) / w ** 0.5
    out = []
    for _ in range(config.batches):
        x = torch.randn(config.tokens, w, generator=gen)
        out.append((x, torch.tanh(x @ teacher_in) @ teacher_out))
    return out


class MoE:
    """The MoE workload on one process group: this rank's slice of the data,
    its experts, and replicas of the router and the shared MLP.

    Parameters
    ----------
    config : Config
        The sizes.
    group : torch.distributed.ProcessGroup
        The ranks, and what the exchanges of tokens run on (expert parallelism).
    device : torch.device or str
        Where the tensors live (a GPU for NCCL).
    grad_group : torch.distributed.ProcessGroup, optional
        What the gradient allreduces run on (data parallelism): the ranks of
        ``group``. Default: a new group like ``group``
        (:func:`mcr.workloads.common.duplicate`).
    """

    def __init__(self, config: Config, group: Any, device: torch.device | str = "cpu",
                 grad_group: Any = None) -> None:
        self.config, self.group = config, group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        self.size = size
        self.owned = common.blocks(config.experts, size)          # experts per rank
        self.mine = self.owned[rank]
        first = sum(self.owned[:rank])
        self.router = router(config).to(device)
        self.shared = mlp(config.width, config.hidden, shared_seed(config)).to(device)
        self.experts = nn.ModuleList(mlp(config.width, config.hidden, expert_seed(config, e))
                                     for e in range(first, first + self.mine)).to(device)
        self.owner = torch.repeat_interleave(torch.arange(size), torch.tensor(self.owned)
                                             ).to(device)                 # rank of each expert
        rows = common.blocks(config.tokens, size)
        start = sum(rows[:rank])
        self.batches = [(x[start:start + rows[rank]].to(device),
                         t[start:start + rows[rank]].to(device)) for x, t in data(config)]
        self.norm = config.tokens * config.width       # the loss is a mean over all ranks
        self.waiting = common.Stopwatch()
        # gradients are summed on a group of their own (see common.duplicate)
        self.grad_group = grad_group if grad_group is not None else common.duplicate(group)
        dense = [*self.router.parameters(), *self.shared.parameters()]
        self.allreduce = common.GradientAllreduce(dense, self.grad_group, self.waiting)
        self.optimizer = torch.optim.SGD([*dense, *self.experts.parameters()], lr=config.lr)
        self.steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer on this rank's tokens (steps 1-5 of the module's docstring)."""
        probs = torch.softmax(self.router(x), dim=-1)
        gate, choice = probs.max(dim=-1)
        order = torch.argsort(choice, stable=True)
        per_expert = torch.bincount(choice, minlength=self.config.experts)
        # counts[src, e]: tokens rank src sends to this rank's expert e
        counts = per_expert.new_empty(self.size * self.mine)
        with self.waiting:
            dist.all_to_all_single(counts, per_expert, [self.mine] * self.size, self.owned,
                                   group=self.group)
        counts = counts.view(self.size, self.mine)
        send = torch.bincount(self.owner[choice], minlength=self.size).tolist()
        recv = counts.sum(dim=1).tolist()
        # x needs a gradient on every rank or on none: so does the dispatch
        dispatch = common.Alltoall(x[order], send, recv, self.group, self.waiting,
                                   backward=x.requires_grad)
        shared: torch.Tensor = self.shared(x)          # while the tokens travel
        y = self.run_experts(dispatch.wait(), counts)
        back = common.alltoall(y, recv, send, self.group, self.waiting)
        return x + shared + gate.unsqueeze(1) * back[torch.argsort(order)]

    def run_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Each local expert on its rows; ``rows`` come grouped by source rank,
        then by expert (``counts[src, e]`` rows each), and go back in that order."""
        mine = counts.shape[1]
        if mine == 0:                # no expert here: no rank sent anything
            return rows
        if mine == 1:
            only: torch.Tensor = self.experts[0](rows)
            return only
        expert_of = torch.arange(mine, device=rows.device).repeat(self.size)
        by_expert = torch.argsort(expert_of.repeat_interleave(counts.flatten()), stable=True)
        parts = torch.split(rows[by_expert], counts.sum(0).tolist())
        outs = [e(part) for e, part in zip(self.experts, parts)]
        return torch.cat(outs)[torch.argsort(by_expert)]

    def step(self) -> torch.Tensor:
        """One training step (the module's docstring); this rank's share of the loss."""
        x, target = self.batches[self.steps % len(self.batches)]
        self.steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = ((self.forward(x) - target) ** 2).sum() / self.norm
        return common.update(loss, self.optimizer, self.allreduce)


def main(argv: Sequence[str] | None = None) -> int:
    """The example: ``mpiexec -n N python -m mcr.workloads.moe [options]``."""
    return common.run_example(__doc__ or "", Config, MoE, argv)


if __name__ == "__main__":
    raise SystemExit(main())
