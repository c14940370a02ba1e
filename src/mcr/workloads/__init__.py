"""The paper's deep-learning workloads, on any torch.distributed process group.

- :mod:`mcr.workloads.moe`: a mixture-of-experts layer (uneven all-to-alls
  of tokens, gradient allreduce overlapped with backward);
- :mod:`mcr.workloads.dlrm`: a DLRM-style recommender (model-parallel
  embedding tables exchanged by all-to-all, a data-parallel MLP);
- :mod:`mcr.workloads.transformer`: a small transformer trained with
  ``DistributedDataParallel``.

Each is an example program (``mpiexec -n 2 python -m mcr.workloads.moe``) and
a benchmark workload (``python -m mcr.bench.workloads``); :mod:`.common`
makes the process groups they run on.
"""

# module -> its workload class (what mcr.bench.workloads builds)
WORKLOADS = {"moe": "MoE", "dlrm": "DLRM", "transformer": "Transformer"}
