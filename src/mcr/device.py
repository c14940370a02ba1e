"""The device interface: what mcr needs from the memory a buffer lives in.

The MPI backend gives MPI a CUDA buffer as it is when the library is
CUDA-aware, after the caller's current stream has finished writing it; otherwise
it stages the buffer through pinned host memory (``alloc_host``, ``copy`` before the call,
``copy`` back when the operation completes, on the caller's current stream so
that the stream observes the result). The core (``staging.pxi``) does all of
this through the few methods below, so the same logic runs on host memory
(``HostInterface``, which stages through a plain copy) and is tested without a
GPU; ``CudaInterface`` is the real thing.

``MCR_CUDA_AWARE=1`` (or ``0``) overrides what the MPI library reports.
"""

import ctypes
import os
from typing import Any

import torch

from ._env import flag

__all__ = ["interface", "mpi_cuda_aware", "byte_region", "HostInterface", "CudaInterface"]


def byte_region(owner: Any, addr: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over the ``nbytes`` bytes at ``addr`` inside ``owner``.

    ``owner`` is the object that keeps the memory alive: a torch tensor (CPU or
    CUDA; the region is a view of it) or any host buffer (the region is a view
    of its memory by address, and must not outlive it).
    """
    if isinstance(owner, torch.Tensor):
        flat = owner.detach()       # each step only where needed: ~1 us apiece
        if flat.dim() != 1:
            flat = flat.reshape(-1)
        if flat.dtype is not torch.uint8:
            flat = flat.view(torch.uint8)
        offset = addr - flat.data_ptr()
        if not 0 <= offset <= flat.numel() - nbytes:
            raise ValueError(f"region of {nbytes} bytes at offset {offset} lies outside "
                             f"the tensor's {flat.numel()} bytes")
        return flat if offset == 0 and nbytes == flat.numel() else flat[offset:offset + nbytes]
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    memory = (ctypes.c_char * nbytes).from_address(addr)
    return torch.frombuffer(memory, dtype=torch.uint8)


class HostInterface:
    """Host memory staged through a copy, exactly as device memory is staged
    (used by tests through ``mcr._core._set_host_staging``)."""

    mpi_reads_device = False

    def region(self, owner: Any, addr: int, nbytes: int) -> torch.Tensor:
        return byte_region(owner, addr, nbytes)

    def synchronize(self, region: torch.Tensor) -> None:
        pass

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        """Host memory for MPI to read and write in place of a buffer."""
        return torch.empty(nbytes, dtype=torch.uint8)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)


class CudaInterface:
    """CUDA memory: stream-ordered copies through pinned host memory, or (for
    a CUDA-aware MPI) a synchronization with the caller's stream."""

    def __init__(self, ordinal: int, aware: bool) -> None:
        self.ordinal = ordinal
        self.mpi_reads_device = aware

    def region(self, owner: Any, addr: int, nbytes: int) -> torch.Tensor:
        if not isinstance(owner, torch.Tensor) or not owner.is_cuda:
            raise TypeError(f"CUDA buffer of type {type(owner).__name__}: mcr reads CUDA "
                            "memory through torch tensors")
        return byte_region(owner, addr, nbytes)

    def synchronize(self, region: torch.Tensor) -> None:
        # the caller's writes, queued on its current stream, must be done
        # before MPI reads the memory from the host thread
        torch.cuda.current_stream(region.device).synchronize()

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        # device to host: on the current stream, after the work queued on it,
        # and waited for, since MPI reads the host copy next
        if dst.is_cuda:
            # queued on the caller's current stream: later work on it sees the
            # result; torch keeps the pinned source alive until the copy is done
            dst.copy_(src, non_blocking=True)
        else:
            dst.copy_(src)


def mpi_cuda_aware() -> bool:
    """Whether MPI is given CUDA memory directly: ``$MCR_CUDA_AWARE`` if set,
    else what the MPI library reports (unknown counts as not aware)."""
    if os.environ.get("MCR_CUDA_AWARE", "").strip():
        return flag("MCR_CUDA_AWARE")      # (a value it does not know raises ValueError)
    from mpi4py import MPI  # noqa: F401 - first: it loads the libmpi _core links to

    from mcr import _core
    return bool(_core._mpi_cuda_aware() == 1)


_HOST = HostInterface()
_CUDA: dict[int, CudaInterface] = {}


def interface(ordinal: int) -> HostInterface | CudaInterface:
    """The interface for device ``ordinal`` (-1: host memory)."""
    if ordinal < 0:
        return _HOST
    found = _CUDA.get(ordinal)
    if found is None:
        found = _CUDA[ordinal] = CudaInterface(ordinal, mpi_cuda_aware())
    return found
