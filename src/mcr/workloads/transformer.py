"""A small transformer language model trained with ``DistributedDataParallel``.

Run it as an example::

    mpiexec -n 2 python -m mcr.workloads.transformer [--steps N] [--backend mcr|mcr-mpi|gloo|nccl]

**The model.** Token and position embeddings, ``layers`` pre-norm
transformer encoder layers with a causal mask (no dropout: runs are
deterministic), and a linear head predicting the next token. The data are
sequences of a fixed random Markov chain (each token is followed by its image
under a fixed permutation, or, one time in ten, by a random token), so the
loss falls towards the chain's entropy.

**The step** is plain data parallelism through
``DistributedDataParallel(model, process_group=group)``: each rank runs
forward and backward on its slice of the global batch of ``batch``
sequences, and DDP averages the gradients over the group with allreduces of
gradient buckets (25 MiB by default, so this model's gradients go in one
bucket), started during backward as buckets fill; then an Adam step. DDP
broadcasts the parameters from rank 0 when it wraps the model.

**Same data everywhere.** The global batch and the parameters are the same at
every world size. DDP averages gradients, so each rank's loss is scaled by
the number of ranks times its share of the batch: the gradients are those of
the global batch's mean loss whatever the split.

**Sizes.** The defaults (2 layers of width 64 with 4 heads, sequences of 64
tokens, a global batch of 32 sequences, 64 words) keep a step to tens of
milliseconds on two CPU cores: a step computes far more per byte it
communicates than the MoE and DLRM steps (one allreduce of ~440 KiB of
gradients per step), as data-parallel training of a dense model does: the
backends run it at nearly the same speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import common

__all__ = ["Config", "LanguageModel", "Transformer", "main"]


@dataclass
class Config:
    """The sizes of the transformer workload (global: the same at every world size)."""

    batch: int = field(default=32, metadata={"help": "sequences per step, all ranks together"})
    length: int = field(default=64, metadata={"help": "tokens per sequence"})
    words: int = field(default=64, metadata={"help": "vocabulary size"})
    width: int = field(default=64, metadata={"help": "model dimension"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    layers: int = field(default=2, metadata={"help": "transformer layers"})
    batches: int = field(default=4, metadata={"help": "distinct batches, cycled"})
    lr: float = field(default=3e-3, metadata={"help": "Adam learning rate"})
    seed: int = field(default=0, metadata={"help": "seed of the data and the parameters"})


class LanguageModel(nn.Module):
    """Embeddings, causal pre-norm encoder layers, a next-token head."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.tokens = nn.Embedding(config.words, config.width)
        self.positions = nn.Parameter(torch.randn(config.length, config.width) * 0.02)
        layer = nn.TransformerEncoderLayer(config.width, config.heads, 4 * config.width,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.head = nn.Linear(config.width, config.words)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # the mask is made here, not kept as a buffer, which DDP would
        # broadcast before every forward
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1],
                                                              device=tokens.device)
        h = self.tokens(tokens) + self.positions[:tokens.shape[1]]
        logits: torch.Tensor = self.head(self.encoder(h, mask=mask, is_causal=True))
        return logits


def model(config: Config) -> LanguageModel:
    """The model, its parameters drawn from ``config.seed`` alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return LanguageModel(config)


def data(config: Config) -> list[torch.Tensor]:
    """The global batches of token sequences, (batch, length + 1) each (inputs
    and next-token targets)."""
    gen = torch.Generator().manual_seed(config.seed * 1000 + 3)
    successor = torch.randperm(config.words, generator=gen)
    out = []
    for _ in range(config.batches):
        seq = torch.empty(config.batch, config.length + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(config.words, (config.batch,), generator=gen)
        noise = torch.rand(config.batch, config.length, generator=gen) < 0.1
        random = torch.randint(config.words, (config.batch, config.length), generator=gen)
        for t in range(config.length):
            seq[:, t + 1] = torch.where(noise[:, t], random[:, t], successor[seq[:, t]])
        out.append(seq)
    return out


class Transformer:
    """The transformer workload on one process group: the model wrapped in
    DDP, this rank's slice of every batch.

    Parameters
    ----------
    config : Config
        The sizes.
    group : torch.distributed.ProcessGroup
        The ranks, and what DDP's broadcast and gradient allreduces run on.
    device : torch.device or str
        Where the tensors live (a GPU for NCCL).
    """

    def __init__(self, config: Config, group: Any, device: torch.device | str = "cpu") -> None:
        self.config = config
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        rows = common.blocks(config.batch, size)
        start = sum(rows[:rank])
        self.batches = [seq[start:start + rows[rank]].to(device) for seq in data(config)]
        self.model = DistributedDataParallel(model(config).to(device), process_group=group)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr)
        self.tokens = config.batch * config.length          # in the global batch
        self.scale = size                 # undoes DDP's average: a sum of shares
        self.waiting: common.Stopwatch | None = None       # DDP waits inside itself
        self.steps = 0

    def step(self) -> torch.Tensor:
        """One DDP training step; this rank's share of the global mean loss."""
        seq = self.batches[self.steps % len(self.batches)]
        self.steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model(seq[:, :-1])
        share = nn.functional.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten(),
                                            reduction="sum") / self.tokens
        torch.autograd.backward(share * self.scale)
        self.optimizer.step()
        return share.detach()


def main(argv: Sequence[str] | None = None) -> int:
    """The example: ``mpiexec -n N python -m mcr.workloads.transformer [options]``."""
    return common.run_example(__doc__ or "", Config, Transformer, argv)


if __name__ == "__main__":
    raise SystemExit(main())
