"""The tuning suite: ``python -m mcr.tune`` measures every collective on each
backend and writes the tuning table ``backend="auto"`` chooses by.

For each collective of :data:`mcr.tuning.OPS` (named on the command line as
in ``python -m mcr.bench``: ``allreduce``, ``reduce_scatter_block``, ...),
each device asked for (``cpu``; ``cuda`` where torch sees a GPU) and each
message size (the powers of two of ``-m MIN:MAX`` bytes, counted as
``python -m mcr.bench`` counts them: float32 elements per process), it times
the blocking call on every backend that serves the device (``mpi``: both;
``gloo``: host memory; ``nccl``: CUDA tensors), OSU-style, in ``--rounds``
rounds with the backends taking turns, keeping the minimum over rounds of the
rank-averaged mean. Every result is checked once against values computed
independently (:mod:`mcr.bench.ops`); a wrong one stops the run with status 1.
Rank 0 shows the progress (a tqdm bar, or plain lines without tqdm), merges
the latencies into the table at ``--out`` (default
:func:`mcr.tuning.cache_path`, where auto looks), and prints which backend is
chosen over which sizes::

    python -m mcr.tune -n 2 --ops allreduce,bcast -m 4:65536 --time-budget 60
    python -m mcr.tune --plot tuning.png            # every collective, CPU
    python -m mcr.tune plot ~/.cache/mcr/tuning/HOST-n2.json --out tuning.png
    mpiexec -n 4 python -m mcr.tune --devices cpu,cuda   # runs as the ranks

Started outside mpiexec it launches itself on ``-n`` ranks (default 2)
through :mod:`mcr.launch`, as ``python -m mcr.bench compare`` does; under
mpiexec it runs as the ranks. With ``--time-budget SECONDS`` the iteration
counts adapt so that the measurements (counted from the ranks' start, after
Python and torch are loaded) fit in about that time; without it they are
OSU's. Exit status: 0 done, 1 a wrong result or a failed measurement, 2 a bad
option or an ``--out`` file that is not a tuning table of this world size.

The parts: :mod:`~mcr.tune.cli` (the options, no MPI),
:mod:`~mcr.tune.driver` (the launching process, no MPI),
:mod:`~mcr.tune.worker` (the ranks), :mod:`~mcr.tune.schedule` (the points
measured and their iteration counts), :mod:`~mcr.tune.progress`,
:mod:`~mcr.tune.report` (the summary) and :mod:`~mcr.tune.plot` (the figure).
The table itself is :mod:`mcr.tuning`.
"""

from .driver import main

__all__ = ["main"]
