"""A DLRM-style recommender's training step: model-parallel embedding tables,
data-parallel MLPs.

Run it as an example::

    mpiexec -n 2 python -m mcr.workloads.dlrm [--steps N] [--backend mcr|mcr-mpi|gloo|nccl]

**The model** (after DLRM, Naumov et al. 2019). A sample has ``dense``
continuous features and, for each of ``tables`` embedding tables, ``pooling``
row indices (multi-hot). A bottom MLP turns the dense features into a vector
of ``dim``; each table sums its rows into one vector of ``dim``
(``EmbeddingBag``); the pairwise dot products of these ``tables + 1`` vectors
and the bottom vector feed a top MLP, whose output is the logit of a click,
trained with binary cross-entropy against synthetic labels drawn from a fixed
random model of the same inputs.

**Parallelism.** The tables are model-parallel: each rank owns a contiguous
block of them, whole, and looks up its tables for the *global* batch (the
input pipeline hands each rank the indices of its tables). The MLPs are
data-parallel: each rank runs them on its slice of the batch.

**The step:**

1. look up this rank's tables for every sample of the global batch;
2. start the all-to-all that sends each rank the pooled vectors of its
   samples, from every table (``all_to_all_single(..., async_op=True)``;
   uneven splits when the ranks do not divide the tables), and run the bottom
   MLP while the vectors are in flight;
3. interaction and top MLP on this rank's samples, loss;
4. backward: the all-to-all in reverse brings each table's gradient for the
   whole batch back to its owner (sparse row gradients), while each MLP
   gradient is summed by an ``all_reduce(async_op=True)`` started as soon as
   backward has produced it (on a second group of the same ranks);
5. wait for the allreduces, SGD step (sparse for the tables).

**Same data everywhere.** The global batch, the tables (each from its own
seed) and the MLPs are the same at every world size; so are the losses, up to
the order of floating-point sums.

**Sizes.** The defaults (8 tables of 10000 rows of 32 floats, 4 lookups per
table, a global batch of 2048 samples, MLPs of width 64) keep a step to
~15-20 ms on two CPU cores and make communicating cost about as much as
computing, as in distributed DLRM training, where the embedding all-to-all
is a main cost: each all-to-all moves 2048 x 8 x 32 floats (2 MiB) in all, and
at 2 ranks a step computes for ~15 ms (the tables' sparse updates and the
interaction's batched products first) while Gloo keeps it blocked for
another ~8 ms (MPI: ~1-2 ms). A smaller batch makes the step
latency-bound and widens the gap (512 samples: ~1.8-2.2x at 2 ranks); one
lookup per table (Criteo's one-hot features) ~1.6x.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import common

__all__ = ["Config", "DLRM", "main"]


@dataclass
class Config:
    """The sizes of the DLRM workload (global: the same at every world size)."""

    batch: int = field(default=2048, metadata={"help": "samples per step, all ranks together"})
    dense: int = field(default=13, metadata={"help": "dense features per sample"})
    tables: int = field(default=8, metadata={"help": "embedding tables, spread over the ranks"})
    rows: int = field(default=10000, metadata={"help": "rows per table"})
    dim: int = field(default=32, metadata={"help": "embedding width"})
    pooling: int = field(default=4, metadata={"help": "lookups per table per sample"})
    hidden: int = field(default=64, metadata={"help": "hidden width of the MLPs"})
    batches: int = field(default=4, metadata={"help": "distinct batches, cycled"})
    lr: float = field(default=0.1, metadata={"help": "SGD learning rate"})
    seed: int = field(default=0, metadata={"help": "seed of the data and the parameters"})


def seeded(module: nn.Module, seed: int) -> nn.Module:
    """``module`` with parameters drawn from ``seed`` alone (scaled normals)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return module


def bottom_mlp(config: Config) -> nn.Module:
    """Dense features -> a vector of ``dim``."""
    return seeded(nn.Sequential(nn.Linear(config.dense, config.hidden), nn.ReLU(),
                                nn.Linear(config.hidden, config.dim), nn.ReLU()),
                  config.seed * 1000 + 1)


def top_mlp(config: Config) -> nn.Module:
    """The bottom vector and the pairwise dot products -> the logit."""
    pairs = (config.tables + 1) * config.tables // 2
    return seeded(nn.Sequential(nn.Linear(config.dim + pairs, config.hidden), nn.ReLU(),
                                nn.Linear(config.hidden, 1)), config.seed * 1000 + 2)


def table(config: Config, t: int) -> nn.EmbeddingBag:
    """Embedding table ``t`` (sums its ``pooling`` rows; sparse gradients)."""
    bag = nn.EmbeddingBag(config.rows, config.dim, mode="sum", sparse=True)
    gen = torch.Generator().manual_seed(config.seed * 1000 + 100 + t)
    with torch.no_grad():
        bag.weight.copy_(torch.randn(bag.weight.shape, generator=gen) /
                         (config.dim * config.pooling) ** 0.5)
    return bag


@dataclass
class Batch:
    """One global batch: ``dense`` (batch, dense), ``indices`` (tables, batch,
    pooling), ``labels`` (batch,) of 0.0 and 1.0."""

    dense: torch.Tensor
    indices: torch.Tensor
    labels: torch.Tensor


def data(config: Config) -> list[Batch]:
    """The global batches, labelled by a fixed random model of the same inputs."""
    gen = torch.Generator().manual_seed(config.seed * 1000 + 3)
    weights = torch.randn(config.dense, generator=gen) / config.dense ** 0.5
    row_scores = torch.randn(config.tables, config.rows, generator=gen) / \
        (config.tables * config.pooling) ** 0.5
    out = []
    for _ in range(config.batches):
        dense = torch.randn(config.batch, config.dense, generator=gen)
        indices = torch.randint(config.rows, (config.tables, config.batch, config.pooling),
                                generator=gen)
        score = dense @ weights + torch.gather(row_scores, 1, indices.flatten(1)).view(
            indices.shape).sum(dim=(0, 2))
        noise = 0.5 * torch.randn(config.batch, generator=gen)
        out.append(Batch(dense, indices, (score + noise > 0).float()))
    return out


class DLRM:
    """The DLRM workload on one process group: this rank's tables, its slice
    of the samples, and replicas of the MLPs.

    Parameters
    ----------
    config : Config
        The sizes.
    group : torch.distributed.ProcessGroup
        The ranks, and what the exchanges of pooled vectors run on (model parallelism).
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
        self.owned = common.blocks(config.tables, size)          # tables per rank
        self.samples = common.blocks(config.batch, size)         # samples per rank
        first = sum(self.owned[:rank])
        mine = range(first, first + self.owned[rank])
        self.tables = nn.ModuleList(table(config, t) for t in mine).to(device)
        self.bottom = bottom_mlp(config).to(device)
        self.top = top_mlp(config).to(device)
        start = sum(self.samples[:rank])
        local = slice(start, start + self.samples[rank])
        self.batches = [Batch(b.dense[local].to(device), b.indices[first:first + len(mine)]
                              .to(device), b.labels[local].to(device)) for b in data(config)]
        # this rank sends its tables' vectors for rank r's samples, and gets
        # every table's vectors for its own samples
        self.send = [self.owned[rank] * n for n in self.samples]
        self.recv = [n * self.samples[rank] for n in self.owned]
        self.waiting = common.Stopwatch()
        # gradients are summed on a group of their own (see common.duplicate)
        self.grad_group = grad_group if grad_group is not None else common.duplicate(group)
        dense = [*self.bottom.parameters(), *self.top.parameters()]
        self.allreduce = common.GradientAllreduce(dense, self.grad_group, self.waiting)
        self.optimizer = torch.optim.SGD([*dense, *self.tables.parameters()], lr=config.lr)
        pairs = torch.tril_indices(config.tables + 1, config.tables + 1, offset=-1,
                                   device=device)
        self.pairs = pairs[0] * (config.tables + 1) + pairs[1]
        self.steps = 0

    def forward(self, batch: Batch) -> torch.Tensor:
        """The logits of this rank's samples (steps 1-3 of the module's docstring)."""
        cfg = self.config
        pooled = torch.stack([bag(idx) for bag, idx in zip(self.tables, batch.indices)]) \
            if len(self.tables) else batch.dense.new_empty((0, cfg.batch, cfg.dim))
        # rows for rank r: every local table's vectors of r's samples, table by table
        send = torch.cat([part.reshape(-1, cfg.dim)
                          for part in torch.split(pooled, self.samples, dim=1)])
        exchange = common.Alltoall(send, self.send, self.recv, self.group, self.waiting)
        bottom = self.bottom(batch.dense)              # while the vectors travel
        vectors = exchange.wait().view(cfg.tables, -1, cfg.dim).transpose(0, 1)
        z = torch.cat([bottom.unsqueeze(1), vectors], dim=1)      # (samples, tables+1, dim)
        dots = torch.bmm(z, z.transpose(1, 2)).flatten(1)[:, self.pairs]
        logits: torch.Tensor = self.top(torch.cat([bottom, dots], dim=1)).squeeze(1)
        return logits

    def step(self) -> torch.Tensor:
        """One training step (the module's docstring); this rank's share of the loss."""
        batch = self.batches[self.steps % len(self.batches)]
        self.steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.binary_cross_entropy_with_logits(
            self.forward(batch), batch.labels, reduction="sum") / self.config.batch
        return common.update(loss, self.optimizer, self.allreduce)


def main(argv: Sequence[str] | None = None) -> int:
    """The example: ``mpiexec -n N python -m mcr.workloads.dlrm [options]``."""
    return common.run_example(__doc__ or "", Config, DLRM, argv)


if __name__ == "__main__":
    raise SystemExit(main())
