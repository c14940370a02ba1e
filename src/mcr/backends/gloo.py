"""The Gloo backend: torch's ProcessGroupGloo, for host (CPU) buffers.

Gloo moves bytes for every operation; it reduces the element types and ops
listed in ``reductions`` itself, and mcr reduces the rest (``compose``). Its
sub-communicator is ``torchpg.TorchSubcomm``: this module only makes the group.
"""

from typing import Any

from .torchpg import TorchBackend
from .store import c10d, rendezvous, timeout

__all__ = ["BACKEND"]

_REDUCED = frozenset({"uint8", "int8", "int32", "int64", "float16", "bfloat16",
                      "float32", "float64"})
_INTS = frozenset({"uint8", "int8", "int32", "int64"})


class GlooBackend(TorchBackend):
    name = "gloo"
    devices = frozenset({"cpu"})
    p2p_pollable = False
    reductions = {
        "SUM": _REDUCED | {"complex64", "complex128"},
        "PROD": _REDUCED, "MAX": _REDUCED, "MIN": _REDUCED,
        "BAND": _INTS, "BOR": _INTS, "BXOR": _INTS,
    }

    def make_group(self, comm: Any) -> tuple[Any, Any]:
        dist = c10d()
        store = rendezvous(comm)
        pg = dist.ProcessGroupGloo(dist.PrefixStore("mcr/gloo/", store), comm.Get_rank(),
                                   comm.Get_size(), timeout())
        return pg, store


BACKEND = GlooBackend()
