"""The paper's workloads (mcr.workloads) and their benchmark (mcr.bench.workloads).

A few small steps on mcr choosing its backend, mcr on MPI and torch's Gloo, at 2 and 3 ranks
(uneven splits): the losses are finite, fall, and equal those of the model trained in one
process with plain torch on the whole global batch (which checks the exchanges' backward
too). Then the example and the benchmark's CLI.
"""

import dataclasses
import json
import math
import os
import re
import subprocess
import sys

import numpy
import torch
from mpi4py import MPI
from torch import nn

from mcr import launch
from mcr.workloads import dlrm, moe, transformer
from mpiharness import case, mpi_cases, run_script

VARIANTS = ("mcr", "mcr-mpi", "gloo")
STEPS = 4
RTOL = 1e-4           # float32 sums in another order, over a few steps

MOE = moe.Config(tokens=192, width=16, hidden=24, experts=5, batches=2, lr=0.2)
DLRM = dlrm.Config(batch=96, dense=5, tables=5, rows=50, dim=8, pooling=3, hidden=16,
                   batches=2, lr=0.5)
TRANSFORMER = transformer.Config(batch=6, length=12, words=16, width=16, heads=2, layers=1,
                                 batches=2, lr=1e-2)

_groups = {}


def check(build, config, reference):
    """Every variant's losses over STEPS steps (summed over the ranks) against `reference`."""
    from mcr.workloads import common
    if not _groups:                     # one process group per variant, made once per job
        _groups.update(common.groups(VARIANTS))
    got = {}
    for variant, group in _groups.items():
        trainer = build(config, group)
        shares = numpy.array([float(trainer.step()) for _ in range(STEPS)])
        got[variant] = MPI.COMM_WORLD.allreduce(shares, op=MPI.SUM).tolist()
    want = reference(config)
    for variant, losses in got.items():
        assert all(math.isfinite(x) for x in losses), (variant, losses)
        assert losses[-1] < losses[0], (variant, losses)
        for step, (a, b) in enumerate(zip(losses, want)):
            assert abs(a - b) <= RTOL * abs(b), (variant, step, losses, want)


# -- Single-process references: the whole global batch, no communication -------

def train_whole(optimizer, batches, loss):
    """The losses of STEPS steps of `loss(batch)` with `optimizer`, cycling `batches`."""
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        value = loss(batches[step % len(batches)])
        value.backward()
        optimizer.step()
        losses.append(value.item())
    return losses


def moe_reference(cfg):
    router = moe.router(cfg)
    shared = moe.mlp(cfg.width, cfg.hidden, moe.shared_seed(cfg))
    experts = nn.ModuleList(moe.mlp(cfg.width, cfg.hidden, moe.expert_seed(cfg, e))
                            for e in range(cfg.experts))

    def loss(batch):
        x, target = batch
        gate, choice = torch.softmax(router(x), dim=-1).max(dim=-1)
        every = torch.stack([e(x) for e in experts], dim=1)         # (tokens, experts, width)
        chosen = every[torch.arange(len(x)), choice]
        return ((x + shared(x) + gate[:, None] * chosen - target) ** 2).mean()
    params = [*router.parameters(), *shared.parameters(), *experts.parameters()]
    return train_whole(torch.optim.SGD(params, lr=cfg.lr), moe.data(cfg), loss)


def dlrm_reference(cfg):
    bottom, top = dlrm.bottom_mlp(cfg), dlrm.top_mlp(cfg)
    tables = nn.ModuleList(dlrm.table(cfg, t) for t in range(cfg.tables))

    def loss(b):
        dense = bottom(b.dense)
        vectors = [dense] + [t(idx) for t, idx in zip(tables, b.indices)]
        dots = [(vectors[i] * vectors[j]).sum(1) for i in range(len(vectors)) for j in range(i)]
        logit = top(torch.cat([dense, torch.stack(dots, dim=1)], dim=1)).squeeze(1)
        return nn.functional.binary_cross_entropy_with_logits(logit, b.labels)
    params = [*bottom.parameters(), *top.parameters(), *tables.parameters()]
    return train_whole(torch.optim.SGD(params, lr=cfg.lr), dlrm.data(cfg), loss)


def transformer_reference(cfg):
    model = transformer.model(cfg)

    def loss(seq):
        logits = model(seq[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    return train_whole(optimizer, transformer.data(cfg), loss)


# -- The workloads on every variant ----------------------------------------------

# name: (trainer, sizes, reference, what the model spreads over the ranks)
SPREAD = {"moe": (moe.MoE, MOE, moe_reference, "experts"),
          "dlrm": (dlrm.DLRM, DLRM, dlrm_reference, "tables")}


@case.matrix(workload=tuple(SPREAD), one_rank_without=(False, True))
def matches_one_process(comm, workload, one_rank_without):
    build, config, reference, spread = SPREAD[workload]
    if one_rank_without:
        # fewer experts (tables) than ranks: a rank receives no tokens (looks
        # nothing up) yet takes part in both directions of the exchanges
        config = dataclasses.replace(config, **{spread: comm.size - 1})
    check(build, config, reference)


@case
def transformer_ddp_matches_one_process(comm):
    if comm.size == 2:            # DDP: at 2 ranks only (the suite's time)
        check(transformer.Transformer, TRANSFORMER, transformer_reference)


test_mpi = mpi_cases(__name__, sizes=(2, 3))


# -- The example programs and the benchmark's command line ------------------------

def test_example_prints_losses_and_steps_per_second():
    code, out = run_script(2, ["-m", "mcr.workloads.moe", "--steps", "3", "--backend",
                               "mcr-mpi", "--tokens", "64", "--width", "8", "--hidden", "8"],
                           timeout=120)
    assert code == 0, out
    assert len(re.findall(r"^step +\d+  loss \d+\.\d+$", out, re.M)) == 3, out
    assert re.search(r"^mcr-mpi: 2 ranks, \d+\.\d+ steps/s \(steps 1-2\)$", out, re.M), out


def test_benchmark_table(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in launch.LAUNCHER_VARS}
    path = tmp_path / "bench.json"
    sizes = ["moe.tokens=64", "moe.width=8", "moe.hidden=8", "dlrm.batch=32", "dlrm.rows=20"]
    cmd = [sys.executable, "-m", "mcr.bench.workloads", "-n", "2", "--steps", "2", "--rounds",
           "1", "--workloads", "moe,dlrm", "--log", "--json", str(path),
           *(arg for size in sizes for arg in ("--set", size))]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out
    assert "# mcr.bench.workloads: 2 ranks, cpu" in out, out
    lines = [r"^workload +ranks +mcr +mcr-mpi +gloo +mcr/gloo +mcr-mpi/gloo "
             r"+loss max\|diff\| +\(all steps\) +agree$",
             r"^target: mcr at least 2x gloo in steps/s on moe and dlrm: "
             r"moe \d+\.\d\dx (met|NOT met), dlrm \d+\.\d\dx (met|NOT met)$",
             r"^moe on mcr-mpi, rank 0: 2 steps of", r"^Alltoallv +mpi "]
    for name in ("moe", "dlrm"):
        lines.append(rf"^{name} +2( +\d+\.\d\d){{5}}( +\d\.\d\de[-+]\d\d){{2}} +yes$")
        lines += [rf"^{name} +{variant} +\d+\.\d\d +\d+\.\d\d +-?\d+\.\d\d$"
                  for variant in VARIANTS]
    for line in lines:
        assert re.search(line, out, re.M), (line, out)
    rows = json.loads(path.read_text())["rows"]
    assert [r["workload"] for r in rows] == ["moe", "dlrm"]
    for r in rows:
        assert sorted(r["losses"]) == sorted(VARIANTS)
        assert all(len(x) == 4 for x in r["losses"].values())   # warm-up + 1 round
        assert r["config"]["batch" if r["workload"] == "dlrm" else "tokens"] in (32, 64)
