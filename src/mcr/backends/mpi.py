"""The MPI backend: mcr's compiled core (``mcr._core``) runs every operation
on MPI directly; this module only registers it and declares what it serves."""

from typing import Any, NoReturn

from .base import Backend

__all__ = ["BACKEND"]


class MpiBackend(Backend):
    name = "mpi"
    devices = frozenset({"cpu", "cuda"})   # CUDA: directly if CUDA-aware, else staged
    native = frozenset({
        "Send", "Bsend", "Ssend", "Rsend", "Recv", "Sendrecv", "Sendrecv_replace", "Probe",
        "Iprobe",
        "Barrier", "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather",
        "Allgatherv", "Alltoall", "Alltoallv", "Alltoallw", "Reduce", "Allreduce",
        "Reduce_scatter_block", "Reduce_scatter", "Scan", "Exscan"})

    def create(self, comm: Any) -> NoReturn:
        raise ValueError("backend 'mpi' runs in mcr's core")


BACKEND = MpiBackend()
