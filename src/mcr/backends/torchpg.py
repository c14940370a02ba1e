"""Backends on a torch ``ProcessGroup`` (Gloo, NCCL): the sub-communicator
whose primitives are the group's ``alltoall_base``, ``send`` and ``recv``, and
which runs Barrier, Bcast, Allgather(v) and, for the op/type pairs the group
reduces, Allreduce, Reduce and Reduce_scatter(_block) as one group call.
Everything else is composed (``compose``).

A backend here only says how to make its group (``TorchBackend.make_group``),
and whether its group's works are stream-ordered (NCCL's: ``StreamOrdered``).
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import compose
from .base import Backend, Subcomm, Work
from .store import c10d

__all__ = ["StreamOrdered", "TorchBackend", "TorchSubcomm"]

_BYTE = torch.uint8


def _reduce_op(name: str) -> Any:
    ReduceOp = c10d().ReduceOp
    return {"SUM": ReduceOp.SUM, "PROD": ReduceOp.PRODUCT, "MAX": ReduceOp.MAX,
            "MIN": ReduceOp.MIN, "BAND": ReduceOp.BAND, "BOR": ReduceOp.BOR,
            "BXOR": ReduceOp.BXOR}[name]


_OPTIONS: dict[tuple[str, str | None, int], Any] = {}


def _options(kind: str, op: str | None = None, root: int = -1) -> Any:
    """The group's options object for an ``"allreduce"``, ``"reduce"`` or
    ``"broadcast"`` with reduction ``op`` and ``root``, made once and reused
    (the group reads it and keeps nothing). A bare ``ReduceOp`` costs more:
    the group's binding converts it on every call (~6 us of a small one)."""
    key = (kind, op, root)
    found = _OPTIONS.get(key)
    if found is None:
        dist = c10d()
        found = {"allreduce": dist.AllreduceOptions, "reduce": dist.ReduceOptions,
                 "broadcast": dist.BroadcastOptions}[kind]()
        if op is not None:
            found.reduceOp = _reduce_op(op)
        if root >= 0:
            found.rootRank = root
        found = _OPTIONS.setdefault(key, found)
    return found


class StreamOrdered:
    """A group work of a stream-ordered backend (NCCL). Its ``wait()`` makes
    the caller's current stream wait for the operation, and the host goes on:
    the core waits it at once (``wait_ready``), as torch's blocking calls do,
    instead of polling until the device has finished. Until it is waited,
    ``is_completed()`` says whether the device has finished (``Test``)."""

    __slots__ = ("work", "waited")

    def __init__(self, work: Work) -> None:
        self.work = work
        self.waited = False

    def is_completed(self) -> bool:
        return self.waited or bool(self.work.is_completed())

    def wait_ready(self) -> bool:
        return True

    def wait(self) -> bool:
        if not self.waited:
            self.work.wait()        # raises the operation's error
            self.waited = True
        return True


class TorchSubcomm(Subcomm):
    """A Comm's sub-communicator on a torch process group.

    The group is made at the first operation that communicates (collective
    over the communicator), after that operation's arguments are checked, so
    that bad input is reported before any process blocks in the bootstrap.
    """

    backend: "TorchBackend"

    def __init__(self, backend: "TorchBackend", comm: Any) -> None:
        super().__init__(backend, comm)
        self._pg: Any = None
        self.store: Any = None

    @property
    def pg(self) -> Any:
        if self._pg is None:
            self.start()
        return self._pg

    def connect(self) -> None:
        self._pg, self.store = self.backend.make_group(self.comm)  # the group may use the store

    def disconnect(self) -> None:
        shutdown = getattr(self._pg, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except RuntimeError:
                pass
        self._pg = self.store = None

    def request(self, works: Sequence[Work | None], steps: Sequence[Callable[[], object]] = (),
                keep: object = None, status: Callable[[], tuple[Any, ...]] | None = None) -> Any:
        """``Subcomm.request``; on a stream-ordered backend, the group's own
        works are wrapped (``StreamOrdered``), not mcr's point-to-point
        handles, which need this process to drive MPI (their payload's
        receive is wrapped in ``tensor_recv``)."""
        if self.backend.stream_ordered:
            group_work = c10d().Work
            works = [StreamOrdered(w) if isinstance(w, group_work) else w for w in works]
        return super().request(works, steps, keep, status)

    # -- Primitives --------------------------------------------------------------------

    def tensor_alltoall(self, output: torch.Tensor, input: torch.Tensor,
                        output_split: list[int], input_split: list[int]) -> Work:
        work: Work = self.pg.alltoall_base(output, input, output_split, input_split)
        return work

    def tensor_send(self, tensor: torch.Tensor, dest: int, tag: int) -> Work:
        work: Work = self.pg.send([tensor], dest, tag)
        return work

    def tensor_recv(self, tensor: torch.Tensor, source: int, tag: int) -> Work:
        # a receive's payload is waited as the group's collectives are: on a
        # stream-ordered backend, its wait() only queues the caller's stream.
        # (A send's is not waited: it is buffered, and its payload copy is
        # kept until the device has sent it.)
        work: Work = self.pg.recv([tensor], source, tag)
        return StreamOrdered(work) if self.backend.stream_ordered else work

    # -- Collectives the group runs ----------------------------------------------------

    def barrier(self, msg: Any) -> Any:
        # not stream-ordered: a barrier's wait returns once every process has entered it
        return super().request([self.pg.barrier()])

    def bcast(self, msg: Any, root: int) -> Any:
        r = self.side(msg, 1, "buf")
        if r.count == 0:
            return self.request([])
        return self.request([self.pg.broadcast([r.block(0, r.count)],
                                               _options("broadcast", root=root))], keep=msg)

    def allgather(self, msg: Any) -> Any:
        # equal blocks in rank order go straight into the receive buffer; other
        # vector forms pad every block to the longest
        s, r = self.side(msg, 0, "sendbuf"), self.side(msg, 1, "recvbuf")
        size, rank, extent = self.size, self.rank, r.extent
        counts, displs = r.blocks(size)
        longest = max(counts) * extent
        if longest == 0:
            return self.request([])
        mine = r.block(displs[rank], counts[rank]) if s.kind == "in_place" \
            else s.block(0, s.count)
        if min(counts) == max(counts) and \
                all(d == i * counts[0] for i, d in enumerate(displs)):
            if s.kind == "in_place":
                mine = compose.clone(mine)  # the group writes every block, ours too
            out = r.block(0, counts[0] * size)
            return self.request([self.pg._allgather_base(out, mine)], keep=(msg, mine))
        inp = torch.zeros(longest, dtype=_BYTE, device=mine.device)
        compose.copy(inp[:mine.numel()], mine)
        outs = [torch.empty(longest, dtype=_BYTE, device=mine.device) for _ in range(size)]
        work = self.pg.allgather([outs], [inp])

        def unpack_blocks() -> None:
            for i in range(size):
                if counts[i]:
                    compose.copy(r.block(displs[i], counts[i]), outs[i][:counts[i] * extent])
        return self.request([work], [unpack_blocks], keep=(msg, inp, outs))

    allgatherv = allgather

    # -- Reductions the group has (the others are composed) ----------------------------

    def allreduce(self, msg: Any, op: Any) -> Any:
        s, r, _ = compose.operand(self, msg)
        name = compose.op_name(op, self.name)
        if r.count == 0 or not self.native_reduction(name, r.tname):
            return super().allreduce(msg, op)
        out = r.typed(r.count)
        if s.kind != "in_place":
            compose.copy(out, s.typed(r.count))
        return self.request([self.pg.allreduce([out], _options("allreduce", name))], keep=msg)

    def reduce(self, msg: Any, op: Any, root: int) -> Any:
        s, r, x = compose.operand(self, msg)
        name = compose.op_name(op, self.name)
        count = x.count
        if count == 0 or not self.native_reduction(name, x.tname):
            return super().reduce(msg, op, root)
        if self.rank == root:
            t = r.typed(count)
            if s.kind != "in_place":
                compose.copy(t, s.typed(count))
        else:
            t = compose.clone(s.typed(count))   # the group may overwrite it
        return self.request([self.pg.reduce([t], _options("reduce", name, root))], keep=(msg, t))

    def reduce_scatter(self, msg: Any, op: Any, block: bool = False) -> Any:
        # an allreduce of the whole vector, of which each rank keeps its block
        s, r, _ = compose.operand(self, msg)
        name = compose.op_name(op, self.name)
        whole = r if s.kind == "in_place" else s
        counts, total, start = compose.scattered_counts(self, r, block)
        if total == 0 or not self.native_reduction(name, whole.tname):
            return (super().reduce_scatter_block(msg, op) if block
                    else super().reduce_scatter(msg, op))
        t = compose.clone(whole.typed(total))
        mine = counts[self.rank]

        def take() -> None:
            if mine:
                compose.copy(r.typed(mine), t[start:start + mine])
        return self.request([self.pg.allreduce([t], _options("allreduce", name))], [take],
                            keep=(msg, t))

    def reduce_scatter_block(self, msg: Any, op: Any) -> Any:
        return self.reduce_scatter(msg, op, True)


class TorchBackend(Backend):
    """A backend on a torch process group: it only says how to make the group
    (``make_group``); its sub-communicator is a ``TorchSubcomm``.

    Attributes
    ----------
    stream_ordered : bool
        Whether the group's works are stream-ordered: ``wait()`` queues the
        caller's current stream after the operation and returns (NCCL). The
        core then waits them at once (``StreamOrdered``).
    """

    subcomm = TorchSubcomm
    stream_ordered: bool = False

    def unavailable(self) -> str | None:
        try:
            dist = c10d()
        except ImportError as exc:
            return f"torch.distributed cannot be imported ({exc})"
        if not dist.is_available() or not getattr(dist, f"is_{self.name}_available")():
            return f"this torch build has no {self.name.upper()}"
        return None

    def make_group(self, comm: Any) -> tuple[Any, Any]:
        """The process group over ``comm`` and the store it rendezvoused
        through (collective over ``comm``)."""
        raise NotImplementedError
