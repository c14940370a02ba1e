"""The NCCL backend: torch's ProcessGroupNCCL, for CUDA buffers only.

NCCL runs on its own streams; torch's work handles order them after the
caller's current stream when an operation is posted, and ``wait()`` (which
``Request.Wait`` calls) makes the caller's current stream wait for the result.
Point-to-point payloads between two ranks are matched in the order they were
sent (NCCL has no tags): receives that match messages out of order by tag are
not supported on this backend.
"""

from typing import Any

from .base import Backend
from .compose import TorchSubcomm
from .store import c10d, rendezvous, timeout

__all__ = ["BACKEND"]

_REDUCED = frozenset({"uint8", "int8", "int32", "int64", "float16", "bfloat16",
                      "float32", "float64"})


class NcclBackend(Backend):
    name = "nccl"
    devices = frozenset({"cuda"})
    native = frozenset({"Barrier", "Bcast", "Allgather", "Alltoall", "Reduce",
                        "Allreduce"})
    reductions = {"SUM": _REDUCED | {"complex64", "complex128"}, "PROD": _REDUCED,
                  "MAX": _REDUCED, "MIN": _REDUCED}

    def unavailable(self) -> str | None:
        try:
            import torch
            import torch.distributed as dist
        except ImportError as exc:
            return f"torch.distributed cannot be imported ({exc})"
        if not dist.is_available() or not dist.is_nccl_available():
            return "this torch build has no NCCL"
        if not torch.cuda.is_available():
            return "no CUDA device is available"
        return None

    def create(self, comm: Any) -> TorchSubcomm:
        return TorchSubcomm(self, comm, self.make_group)

    @staticmethod
    def make_group(comm: Any) -> tuple[Any, Any]:
        dist = c10d()
        store = rendezvous(comm)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout()
        pg = dist.ProcessGroupNCCL(dist.PrefixStore("mcr/nccl/", store), comm.Get_rank(),
                                   comm.Get_size(), options)
        return pg, store


BACKEND = NcclBackend()
