"""The named objects between mcr's core and the backends: one side of a parsed
message (what the core hands over), its view as torch tensors, and the status
of a receive (what a backend hands back)."""

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from mcr.device import byte_region

__all__ = ["MessageSide", "RecvStatus", "Side"]

_BYTE = torch.uint8


class MessageSide(NamedTuple):
    """One side of a message parsed by the core (``msg.side(which)``, which
    0: the send side, 1: the receive side)."""

    kind: str                     # "buf", "in_place" or "null"
    addr: int                     # address of the message's first element
    count: int  # type: ignore[assignment]  # elements in the block form (shadows tuple.count: the core's name)
    counts: list[int] | None      # per-rank counts of the vector form, else None
    displs: list[int] | None      # per-rank displacements (elements), else None
    nelems: int                   # elements from addr to the end of the message
    tname: str | None             # torch element type name; None: a derived datatype
    extent: int                   # bytes per element
    device: int                   # CUDA device ordinal, -1: host memory
    owner: object                 # the object owning the memory (kept alive)


class RecvStatus(NamedTuple):
    """What a completed receive reports to the core's ``Status``."""

    source: int
    tag: int
    nbytes: int                   # bytes received
    datatype: int                 # MPI datatype handle of the elements (0: none)


class Side:
    """One side of a parsed message as tensors over the caller's memory.

    Built from a ``MessageSide``, any tuple in its order, or any object with
    its attribute names."""

    __slots__ = MessageSide._fields + ("_bytes",)

    def __init__(self, described: Any) -> None:
        if isinstance(described, tuple):
            (self.kind, self.addr, self.count, self.counts, self.displs, self.nelems,
             self.tname, self.extent, self.device, self.owner) = described
        else:
            for field in MessageSide._fields:
                setattr(self, field, getattr(described, field))
        self._bytes: torch.Tensor | None = None

    def bytes(self) -> torch.Tensor:
        """All the bytes of the buffer from the message's start."""
        if self._bytes is None:
            nbytes = self.nelems * self.extent
            if self.owner is None or nbytes == 0:
                self._bytes = torch.empty(0, dtype=_BYTE, device=self.torch_device())
            else:
                self._bytes = byte_region(self.owner, self.addr, nbytes)
        return self._bytes

    def block(self, displ: int, count: int) -> torch.Tensor:
        """Bytes of ``count`` elements at element displacement ``displ``."""
        whole = self.bytes()
        if displ == 0 and count * self.extent == whole.numel():
            return whole
        return whole[displ * self.extent:(displ + count) * self.extent]

    def typed(self, count: int, displ: int = 0) -> torch.Tensor:
        """``count`` elements at ``displ``, as a tensor of the element type."""
        dtype = getattr(torch, self.tname)
        owner = self.owner
        if type(owner) is torch.Tensor and owner.dtype is dtype and owner.is_contiguous() \
                and owner.element_size() == self.extent:
            # a view of the caller's tensor in one step, not through its bytes
            # (which costs four tensor operations more: ~5 us of a small call)
            start, rest = divmod(self.addr - owner.data_ptr(), self.extent)
            start += displ
            if rest == 0 and 0 <= start and start + count <= owner.numel():
                if start == 0 and count == owner.numel() and owner.dim() == 1:
                    return owner.detach()
                return owner.detach().as_strided((count,), (1,), owner.storage_offset() + start)
        return self.block(displ, count).view(dtype)

    def blocks(self, size: int) -> tuple[Sequence[int], Sequence[int]]:
        """(counts, displs) in elements, for the block or vector form."""
        if self.counts is not None and self.displs is not None:
            return self.counts, self.displs
        return [self.count] * size, [i * self.count for i in range(size)]

    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.device) if self.device >= 0 else torch.device("cpu")
