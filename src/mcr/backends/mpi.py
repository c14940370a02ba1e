"""The MPI backend: mcr's compiled core (``mcr._core``) runs every operation
on MPI directly; this module only registers it and declares what it serves."""

from typing import Any, NoReturn

from .base import OPERATIONS, Backend

__all__ = ["BACKEND"]


class MpiBackend(Backend):
    name = "mpi"
    devices = frozenset({"cpu", "cuda"})   # CUDA: directly if CUDA-aware, else staged

    @property
    def native(self) -> frozenset[str]:
        """Every operation of the backend interface, and Alltoallw, which only
        MPI runs (one datatype per process)."""
        return frozenset(name for names in OPERATIONS.values() for name in names) | {
            "Alltoallw"}

    def create(self, comm: Any) -> NoReturn:
        raise ValueError("backend 'mpi' runs in mcr's core")


BACKEND = MpiBackend()
