"""The NCCL backend: torch's ProcessGroupNCCL, for CUDA buffers only.

NCCL runs on its own streams; torch's work handles order them after the
caller's current stream when an operation is posted, and ``wait()`` (which
``Request.Wait`` calls at once: ``stream_ordered``) makes the caller's current
stream wait for the result, without the host waiting for the device.
Point-to-point payloads between two ranks are matched in the order they were
sent (NCCL has no tags): receives that match messages out of order by tag are
not supported on this backend.
"""

from typing import Any

from .torchpg import TorchBackend
from .store import c10d, rendezvous, timeout

__all__ = ["BACKEND"]

_REDUCED = frozenset({"uint8", "int8", "int32", "int64", "float16", "bfloat16",
                      "float32", "float64"})


class NcclBackend(TorchBackend):
    name = "nccl"
    devices = frozenset({"cuda"})
    stream_ordered = True
    reductions = {"SUM": _REDUCED | {"complex64", "complex128"}, "PROD": _REDUCED,
                  "MAX": _REDUCED, "MIN": _REDUCED}

    def unavailable(self) -> str | None:
        reason = super().unavailable()
        if reason is None:
            import torch
            if not torch.cuda.is_available():
                reason = "no CUDA device is available"
        return reason

    def make_group(self, comm: Any) -> tuple[Any, Any]:
        dist = c10d()
        store = rendezvous(comm)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout()
        pg = dist.ProcessGroupNCCL(dist.PrefixStore("mcr/nccl/", store), comm.Get_rank(),
                                   comm.Get_size(), options)
        return pg, store


BACKEND = NcclBackend()
