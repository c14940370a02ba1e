"""The Gloo backend: torch's ProcessGroupGloo, for host (CPU) buffers.

Gloo moves bytes for every operation; it reduces the element types and ops
listed in ``reductions`` itself, and mcr reduces the rest (``compose``).
"""

from typing import Any

from .base import Backend
from .compose import TorchSubcomm
from .store import c10d, rendezvous, timeout

__all__ = ["BACKEND"]

_REDUCED = frozenset({"uint8", "int8", "int32", "int64", "float16", "bfloat16",
                      "float32", "float64"})
_INTS = frozenset({"uint8", "int8", "int32", "int64"})


class GlooBackend(Backend):
    name = "gloo"
    devices = frozenset({"cpu"})
    p2p_pollable = False
    native = frozenset({"Barrier", "Bcast", "Allgather", "Alltoall", "Reduce",
                        "Allreduce"})
    reductions = {
        "SUM": _REDUCED | {"complex64", "complex128"},
        "PROD": _REDUCED, "MAX": _REDUCED, "MIN": _REDUCED,
        "BAND": _INTS, "BOR": _INTS, "BXOR": _INTS,
    }

    def unavailable(self) -> str | None:
        try:
            import torch.distributed as dist
        except ImportError as exc:
            return f"torch.distributed cannot be imported ({exc})"
        if not dist.is_available() or not dist.is_gloo_available():
            return "this torch build has no Gloo"
        return None

    def create(self, comm: Any) -> TorchSubcomm:
        return TorchSubcomm(self, comm, self.make_group)

    @staticmethod
    def make_group(comm: Any) -> tuple[Any, Any]:
        dist = c10d()
        store = rendezvous(comm)
        pg = dist.ProcessGroupGloo(dist.PrefixStore("mcr/gloo/", store), comm.Get_rank(),
                                   comm.Get_size(), timeout())
        return pg, store


BACKEND = GlooBackend()
