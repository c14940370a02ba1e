"""Peers side by side: mcr against C, mpi4py and torch.distributed in one run.

``python -m mcr.bench compare`` (or ``python -m mcr.bench.compare``) is a plain
program that starts its own ``mpiexec`` jobs and times, for each operation and
message size, these implementations ("peers"):

``C``
    Raw MPI in the OSU Micro-Benchmarks' manner: ``mcr/bench/osu_c.c``,
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
``mcr-auto``
    The same with ``backend="auto"``: the backend the tuning table chooses
    (:mod:`mcr.tuning`; MPI without one). Its ratio to the fastest of the
    other mcr peers shows what choosing costs, or gains.

The NCCL peers take part with ``--buffer torch-cuda`` on a machine with CUDA.
The persistent (``_init``, ``Start``, ``Wait``) and non-blocking (``I...``,
``Wait``) forms are timed for ``C`` and ``mcr-mpi`` when ``--forms`` names them.

Timing follows OSU: warm-up calls, an ``MPI_Barrier``, a loop of back-to-back
calls; each rank's mean per call, averaged over the ranks. Every Python peer is
timed in ``--rounds`` rounds, the peers taking turns within a round in a
rotating order; the C program runs half its rounds before and half after the
Python job. Tables show the minimum and the median of the round averages
(interference only ever adds time, so the minimum is the steadier figure), the
ratios that issue 10 sets targets for, and whether the targets are met. Each
peer's result is checked once per size against values computed independently.
Message sizes, in bytes of one message, follow OSU (:mod:`mcr.bench.ops`).

The parts: :mod:`~mcr.bench.compare.cli` (the command line),
:mod:`~mcr.bench.compare.driver` (the plain program that starts the jobs
through :mod:`mcr.launch` and does not initialize MPI),
:mod:`~mcr.bench.compare.worker` (the ranks of the Python job) and
:mod:`~mcr.bench.compare.report` (tables, targets, figure). The operations
are those of :mod:`mcr.bench.ops`, as for ``python -m mcr.bench <name>``.
"""

from .driver import main

__all__ = ["main"]
