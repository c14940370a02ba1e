"""Every Comm operation on a torch process group (Gloo, NCCL), from a few
primitives: broadcast, allreduce, reduce, allgather, alltoall_base, barrier,
send and recv.

This is the one place where operations a backend lacks are built. The core
has already parsed and validated the arguments exactly as for MPI (the same
``_Msg`` parsers); each operation here packs what it sends into byte tensors,
posts one primitive, and leaves the unpacking to a step that runs when the
request completes. So every operation is one backend call plus local copies,
and a request never needs another process to make progress on its behalf.

- Vector collectives (Gatherv, Scatterv, Alltoallv) pack blocks at their
  displacements into one tensor for ``alltoall_base``; Allgatherv pads blocks
  to the longest for ``allgather``.
- Reductions the backend has for the element type (``Backend.reductions``)
  run natively; the others (logical ops, unsigned types, Scan, Exscan) gather
  the operands and reduce them in rank order here, exactly.
- Point-to-point messages carry MPI semantics (tags, ANY_SOURCE, ANY_TAG,
  Probe, truncation errors): a small header goes over MPI (on a private
  duplicate of the communicator), so MPI does the matching, and the payload
  over the backend, tagged with a per-pair sequence number. Sends are
  buffered: they complete once the payload is copied, so a sender never waits
  for the receiver's host thread.
"""

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from mpi4py import MPI

from mcr import _core
from mcr.device import byte_region

from .base import Backend
from .store import c10d

__all__ = ["TorchBackend", "TorchSubcomm"]

_OP_NAMES: dict[int, str] = {}
for _name in ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"):
    _OP_NAMES[getattr(MPI, _name).py2f()] = _name

_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
_BYTE = torch.uint8
_SEQ_MOD = 1 << 30


_waiters: Any = None


class _Waited:
    """A work handle whose is_completed() only turns true inside wait() (Gloo's
    send and receive): a pool thread waits for it, and polling asks the thread.
    The payload is already on its way (the receive is posted once the header
    has arrived), so these waits always end."""

    __slots__ = ("future",)

    def __init__(self, work: Any) -> None:
        global _waiters
        if _waiters is None:
            from concurrent.futures import ThreadPoolExecutor
            _waiters = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mcr-p2p")
        self.future = _waiters.submit(work.wait)

    def is_completed(self) -> bool:
        return bool(self.future.done())

    def wait(self) -> None:
        self.future.result()


def op_name(op: object, backend: str) -> str:
    name = _OP_NAMES.get(op.py2f()) if isinstance(op, MPI.Op) else None
    if name is None:
        raise TypeError(f"op: user-defined operations run on backend 'mpi' only, not "
                        f"{backend!r}")
    return name


class Side:
    """One side of a parsed message (``_Msg.side``) as tensors."""

    __slots__ = ("kind", "addr", "count", "counts", "displs", "nelems", "tname",
                 "extent", "device", "owner", "_bytes")

    def __init__(self, described: tuple[Any, ...]) -> None:
        (self.kind, self.addr, self.count, self.counts, self.displs, self.nelems,
         self.tname, self.extent, self.device, self.owner) = described
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
        return self.bytes()[displ * self.extent:(displ + count) * self.extent]

    def typed(self, count: int, displ: int = 0) -> torch.Tensor:
        """``count`` elements at ``displ``, as a tensor of the element type."""
        return self.block(displ, count).view(getattr(torch, self.tname))

    def blocks(self, size: int) -> tuple[list[int], list[int]]:
        """(counts, displs) in elements, for the block or vector form."""
        if self.counts is not None and self.displs is not None:
            return self.counts, self.displs
        return [self.count] * size, [i * self.count for i in range(size)]

    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.device) if self.device >= 0 else torch.device("cpu")


def pack(src: torch.Tensor, sizes: Sequence[int], offsets: Sequence[int]) -> torch.Tensor:
    """The byte blocks (``sizes`` at ``offsets`` in ``src``) one after another;
    a view of ``src`` when they already are."""
    total, at = sum(sizes), 0
    if all(o == sum(sizes[:i]) for i, o in enumerate(offsets) if sizes[i]):
        return src[:total] if total else src[:0]
    out = torch.empty(total, dtype=_BYTE, device=src.device)
    for n, o in zip(sizes, offsets):
        if n:
            out[at:at + n].copy_(src[o:o + n])
            at += n
    return out


def unpack(packed: torch.Tensor, sizes: Sequence[int], dst: torch.Tensor,
           offsets: Sequence[int]) -> None:
    at = 0
    for n, o in zip(sizes, offsets):
        if n:
            dst[o:o + n].copy_(packed[at:at + n])
            at += n


def fold(op: str, operands: Sequence[torch.Tensor]) -> torch.Tensor:
    """Reduce ``operands`` (tensors of one type) in rank order, as MPI's
    predefined ``op`` does."""
    dtype = operands[0].dtype
    signed = _SIGNED.get(dtype)
    if signed is not None:
        # torch lacks arithmetic on uint16/32/64: same-width signed integers
        # wrap identically, and flipping the top bit maps unsigned order to
        # signed order for MAX/MIN
        values = [x.view(signed) for x in operands]
        if op in ("MAX", "MIN"):
            top = torch.tensor(torch.iinfo(signed).min, dtype=signed, device=values[0].device)
            return fold(op, [x ^ top for x in values]).__xor__(top).view(dtype)
        return fold(op, values).view(dtype)
    acc = operands[0].clone()
    if op in ("LAND", "LOR", "LXOR"):
        acc = acc != 0
    for x in operands[1:]:
        if op == "SUM":
            acc = acc + x
        elif op == "PROD":
            acc = acc * x
        elif op == "MAX":
            acc = torch.maximum(acc, x)
        elif op == "MIN":
            acc = torch.minimum(acc, x)
        elif op == "LAND":
            acc = acc & (x != 0)
        elif op == "LOR":
            acc = acc | (x != 0)
        elif op == "LXOR":
            acc = acc ^ (x != 0)
        elif op == "BAND":
            acc = acc & x
        elif op == "BOR":
            acc = acc | x
        elif op == "BXOR":
            acc = acc ^ x
    return acc.to(dtype)


class _Inflight:
    """A buffered send: header request, payload work, and the payload copy."""

    __slots__ = ("header_req", "work", "keep")

    def __init__(self, header_req: Any, work: Any, keep: object) -> None:
        self.header_req, self.work, self.keep = header_req, work, keep

    def done(self) -> bool:
        return bool(self.header_req.Test()
                and (self.work is None or self.work.is_completed()))


class _Matched:
    """A synchronous send's work: complete once the receiver has matched the
    header (the MPI request of its synchronous send)."""

    __slots__ = ("req",)

    def __init__(self, req: Any) -> None:
        self.req = req

    def is_completed(self) -> bool:
        return bool(self.req.Test())

    def wait(self) -> None:
        self.req.Wait()


class _Received:
    """A header taken off MPI by Probe, until a receive claims it."""

    __slots__ = ("source", "tag", "nbytes", "seq")

    def __init__(self, source: int, tag: int, nbytes: int, seq: int) -> None:
        self.source, self.tag, self.nbytes, self.seq = source, tag, nbytes, seq

    def matches(self, source: int, tag: int) -> bool:
        return (source in (MPI.ANY_SOURCE, self.source)) and tag in (MPI.ANY_TAG, self.tag)


class _RecvWork:
    """A receive: the header (MPI) first, then the payload (the backend)."""

    def __init__(self, sub: "TorchSubcomm", r: Side, source: int, tag: int) -> None:
        self.sub, self.r = sub, r
        self.work: Any = None
        self.error: str | None = None
        self.got: _Received | None = None
        self.target: torch.Tensor | None = None
        self.header = torch.zeros(2, dtype=torch.int64).numpy()
        for i, h in enumerate(sub.stash):
            if h.matches(source, tag):
                del sub.stash[i]
                self.arrived(h)
                return
        self.hstatus = MPI.Status()
        self.hreq = sub.hcomm.Irecv(self.header, source, tag)

    def arrived(self, h: _Received) -> None:
        self.got = h
        capacity = self.r.count * self.r.extent
        if h.nbytes > capacity:
            self.error = (f"message of {h.nbytes} bytes from rank {h.source} (tag {h.tag}) "
                          f"does not fit the receive buffer of {capacity} bytes")
            target = torch.empty(h.nbytes, dtype=_BYTE, device=self.r.torch_device())
        else:
            target = self.r.bytes()[:h.nbytes]
        if h.nbytes and h.source == self.sub.rank:
            target.copy_(self.sub.loopback.pop(h.seq))    # a message to itself
        elif h.nbytes:
            self.work = self.sub.p2p(self.sub.pg.recv([target], h.source, h.seq))
            self.target = target

    def is_completed(self) -> bool:
        if self.got is None:
            if not self.hreq.Test(self.hstatus):
                return False
            self.arrived(_Received(self.hstatus.Get_source(), self.hstatus.Get_tag(),
                                   int(self.header[0]), int(self.header[1])))
        return self.work is None or bool(self.work.is_completed())

    def payload_pending(self) -> bool:
        """The header has matched and the payload is still arriving."""
        return self.got is not None and self.work is not None and \
            not self.work.is_completed()

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
        if self.error is not None:
            exc = _core.Exception(MPI.ERR_TRUNCATE)
            exc.add_note(f"buf: {self.error}")
            raise exc

    def status(self) -> tuple[int, int, int, int]:
        h = self.got
        assert h is not None
        nbytes = min(h.nbytes, self.r.count * self.r.extent)
        rtype = _core._datatype_handle(self.r.tname) if self.r.tname else 0
        return (h.source, h.tag, nbytes, rtype)


class TorchSubcomm:
    """A Comm's sub-communicator on a torch process group.

    The group is made at the first operation that communicates (collective
    over the communicator), after that operation's arguments are checked, so
    that bad input is reported before any process blocks in the bootstrap.
    """

    def __init__(self, backend: Any, comm: Any,
                 make_group: Callable[[Any], tuple[Any, Any]]) -> None:
        self.backend = backend
        self.name = backend.name
        self.comm = comm
        self.make_group = make_group    # comm -> (process group, store)
        self._pg: Any = None
        self.store: Any = None
        self._hcomm: Any = None
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.seq = [0] * self.size
        self.stash: list[_Received] = []
        self.inflight: list[_Inflight] = []
        self.loopback: dict[int, torch.Tensor] = {}     # payloads sent to this rank
        self.receives: list[_RecvWork] = []             # posted, not yet complete

    @property
    def pg(self) -> Any:
        if self._pg is None:
            reason = self.backend.unavailable()
            if reason is not None:
                raise RuntimeError(f"backend {self.name!r}: {reason}")
            self._pg, self.store = self.make_group(self.comm)   # the group may use the store
            self._hcomm = self.comm.to_mpi4py().Dup()             # point-to-point headers
        return self._pg

    @property
    def hcomm(self) -> Any:
        if self._hcomm is None:
            self.pg
        return self._hcomm

    # -- plumbing -------------------------------------------------------------

    def run(self, name: str, msg: Any, **kw: Any) -> Any:
        """Post operation ``name`` (a Comm method name) on the parsed message
        ``msg``; return its Request."""
        key = name[1:] if name[0] == "I" and name[1].islower() else name
        return getattr(self, key.lower())(msg, **kw)

    def side(self, msg: Any, which: int, arg: str) -> Side:
        x = Side(msg.side(which))
        if x.kind == "buf":
            err = self.backend.device_error(arg, x.device)
            if err is not None:
                raise err
            if x.tname is None:
                raise TypeError(f"{arg}: backend {self.name!r} moves the element types of "
                                "torch tensors only, not derived MPI datatypes")
        return x

    def check(self, msg: Any, args: Sequence[object], one_buffer: bool) -> None:
        """Raise what running ``msg`` (with the operation's ``args``) on this
        backend would raise, without communicating: for persistent requests,
        which must report bad arguments when they are made. ``one_buffer``:
        the operation has a single ``buf`` argument (Send, Recv, Bcast)."""
        if msg is not None:
            for which, name in ((0, "sendbuf"), (1, "recvbuf")):
                self.side(msg, which, "buf" if one_buffer else name)
        for arg in args:
            if isinstance(arg, MPI.Op):
                op_name(arg, self.name)

    def request(self, works: Sequence[Any], steps: Sequence[Callable[[], object]] = (),
                keep: object = None, status: object = None) -> Any:
        return _core._work_request(self.name, [w for w in works if w is not None],
                                   list(steps), keep, status)

    def p2p(self, work: Any) -> Any:
        """A pollable handle for a point-to-point work."""
        return work if self.backend.p2p_pollable else _Waited(work)

    def native_reduction(self, op: str, tname: str | None) -> bool:
        return tname in self.backend.reductions.get(op, ())

    def free(self) -> None:
        """Deliver outstanding sends, then release the group (collective).

        Once every rank's sends are delivered (a barrier after its own), the
        payloads of all receives here that have matched a message have
        arrived: those receives (freed ones too) are finished before the
        group goes away."""
        if self._pg is None:
            return
        everyone = self._hcomm.Ibarrier()
        sent = False
        spins = 0
        while True:
            self.inflight = [f for f in self.inflight if not f.done()]
            _core._poll()       # MPI, and freed receives that the peers' sends wait for
            if not self.inflight and not sent:
                sent = True
            if sent and everyone.Test():
                break
            spins += 1
            if spins > 64:
                time.sleep(1e-4)
        while any(r.payload_pending() for r in self.receives):
            _core._poll()
            time.sleep(1e-5)
        shutdown = getattr(self._pg, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except RuntimeError:
                pass
        self._pg = self.store = None
        self._hcomm.Free()
        self._hcomm = None

    # -- Point-to-point -----------------------------------------------------

    def send(self, msg: Any, dest: int, tag: int) -> Any:
        return self.post_send(self.side(msg, 0, "buf"), dest, tag)

    # The send modes. Sends here are buffered already, which is all a buffered
    # send asks (it needs no buffer attached with MPI.Attach_buffer); a ready
    # send is a standard send whose receive is known to be posted.
    bsend = rsend = send

    def ssend(self, msg: Any, dest: int, tag: int) -> Any:
        """A synchronous send: complete once the receiver has matched the
        message (its header goes by MPI's synchronous send)."""
        return self.post_send(self.side(msg, 0, "buf"), dest, tag, synchronous=True)

    def sendrecv(self, msg: Any, dest: int, sendtag: int, source: int, tag: int) -> Any:
        # the send completes at once (buffered): the request is the receive's
        self.post_send(self.side(msg, 0, "sendbuf"), dest, sendtag)
        return self.recv(msg, source, tag, "recvbuf")

    def post_send(self, s: Side, dest: int, tag: int, synchronous: bool = False) -> Any:
        """Send the message of side ``s``, buffered: the request is complete
        (``synchronous``: once the receiver has matched the header)."""
        if dest == MPI.PROC_NULL:
            return self.request([])
        nbytes = s.count * s.extent
        seq = self.seq[dest]
        self.seq[dest] = (seq + 1) % _SEQ_MOD
        header = torch.tensor([nbytes, seq], dtype=torch.int64).numpy()
        hreq = (self.hcomm.Issend if synchronous else self.hcomm.Isend)(header, dest, tag)
        work = payload = None
        if nbytes:
            payload = s.bytes()[:nbytes].clone()
            if dest == self.rank:       # Gloo pairs do not connect a rank to itself
                self.loopback[seq] = payload
            else:
                work = self.p2p(self.pg.send([payload], dest, seq))
        self.inflight = [f for f in self.inflight if not f.done()]
        self.inflight.append(_Inflight(hreq, work, (header, payload)))
        return self.request([_Matched(hreq)] if synchronous else [])

    def recv(self, msg: Any, source: int, tag: int, arg: str = "buf") -> Any:
        r = self.side(msg, 1, arg)
        if source == MPI.PROC_NULL:
            return self.request([], status=lambda: (MPI.PROC_NULL, MPI.ANY_TAG, 0, 0))
        work = _RecvWork(self, r, source, tag)
        self.receives = [w for w in self.receives if w.payload_pending() or w.got is None]
        self.receives.append(work)
        return self.request([work], status=work.status, keep=msg)

    def sendrecv_replace(self, msg: Any, dest: int, sendtag: int, source: int,
                         tag: int) -> Any:
        # the send copies the buffer at once, so receiving into it is safe
        self.post_send(self.side(msg, 1, "buf"), dest, sendtag)
        return self.recv(msg, source, tag)

    def probe(self, source: int, tag: int, status: Any, blocking: bool) -> bool:
        if source == MPI.PROC_NULL:
            _core._fill_status(status, MPI.PROC_NULL, MPI.ANY_TAG, 0)
            return True
        for h in self.stash:
            if h.matches(source, tag):
                _core._fill_status(status, h.source, h.tag, h.nbytes)
                return True
        st = MPI.Status()
        if blocking:
            message = self.hcomm.Mprobe(source, tag, st)
        else:
            message = self.hcomm.Improbe(source, tag, st)
            if message is None:
                return False
        header = torch.zeros(2, dtype=torch.int64).numpy()
        message.Recv(header)
        h = _Received(st.Get_source(), st.Get_tag(), int(header[0]), int(header[1]))
        self.stash.append(h)
        _core._fill_status(status, h.source, h.tag, h.nbytes)
        return True

    # -- Collectives ----------------------------------------------------------

    def barrier(self, msg: Any) -> Any:
        return self.request([self.pg.barrier()])

    def bcast(self, msg: Any, root: int) -> Any:
        r = self.side(msg, 1, "buf")
        if r.count == 0:
            return self.request([])
        opts = c10d().BroadcastOptions()
        opts.rootRank = root
        return self.request([self.pg.broadcast([r.block(0, r.count)], opts)], keep=msg)

    def gather(self, msg: Any, root: int, v: bool = False) -> Any:
        s, r = self.side(msg, 0, "sendbuf"), self.side(msg, 1, "recvbuf")
        size, rank, extent = self.size, self.rank, s.extent
        mine = 0 if s.kind == "in_place" else s.count * extent
        in_split = [0] * size
        in_split[root] = mine
        inp = s.block(0, s.count) if mine else s.bytes()[:0]
        steps, out_split = [], [0] * size
        out = inp[:0]
        if rank == root:
            counts, displs = r.blocks(size)
            out_split = [c * extent for c in counts]
            if s.kind == "in_place":
                out_split[root] = 0
            out = torch.empty(sum(out_split), dtype=_BYTE, device=inp.device)
            offsets = [d * extent for d in displs]
            steps.append(lambda: unpack(out, out_split, r.bytes(), offsets))
        work = self.pg.alltoall_base(out, inp.contiguous(), out_split, in_split)
        return self.request([work], steps, keep=(msg, out, inp))

    def gatherv(self, msg: Any, root: int) -> Any:
        return self.gather(msg, root, True)

    def scatter(self, msg: Any, root: int, v: bool = False) -> Any:
        s, r = self.side(msg, 0, "sendbuf"), self.side(msg, 1, "recvbuf")
        size, rank = self.size, self.rank
        extent = r.extent
        in_split, inp = [0] * size, r.bytes()[:0]
        if rank == root:
            counts, displs = s.blocks(size)
            in_split = [c * extent for c in counts]
            if r.kind == "in_place":
                in_split[root] = 0
            inp = pack(s.bytes(), in_split, [d * extent for d in displs])
        out_split = [0] * size
        out_split[root] = 0 if r.kind == "in_place" else r.count * extent
        out = r.block(0, r.count) if out_split[root] else inp[:0]
        work = self.pg.alltoall_base(out, inp.contiguous(), out_split, in_split)
        return self.request([work], keep=(msg, inp))

    def scatterv(self, msg: Any, root: int) -> Any:
        return self.scatter(msg, root, True)

    def allgather(self, msg: Any, v: bool = False) -> Any:
        s, r = self.side(msg, 0, "sendbuf"), self.side(msg, 1, "recvbuf")
        size, rank, extent = self.size, self.rank, r.extent
        counts, displs = r.blocks(size)
        longest = max(counts) * extent
        if longest == 0:
            return self.request([])
        mine = r.block(displs[rank], counts[rank]) if s.kind == "in_place" \
            else s.block(0, s.count)
        inp = torch.zeros(longest, dtype=_BYTE, device=mine.device)
        inp[:mine.numel()].copy_(mine)
        outs = [torch.empty(longest, dtype=_BYTE, device=mine.device) for _ in range(size)]
        work = self.pg.allgather([outs], [inp])

        def unpack_blocks() -> None:
            for i in range(size):
                if counts[i]:
                    r.block(displs[i], counts[i]).copy_(outs[i][:counts[i] * extent])
        return self.request([work], [unpack_blocks], keep=(msg, inp, outs))

    def allgatherv(self, msg: Any) -> Any:
        return self.allgather(msg, True)

    def alltoall(self, msg: Any, v: bool = False) -> Any:
        s, r = self.side(msg, 0, "sendbuf"), self.side(msg, 1, "recvbuf")
        size, extent = self.size, r.extent
        rcounts, rdispls = r.blocks(size)
        src = r if s.kind == "in_place" else s
        scounts, sdispls = src.blocks(size)
        in_split = [c * extent for c in scounts]
        out_split = [c * extent for c in rcounts]
        inp = pack(src.bytes(), in_split, [d * extent for d in sdispls])
        if s.kind == "in_place":
            inp = inp.clone()           # the result overwrites what is sent
        out = torch.empty(sum(out_split), dtype=_BYTE, device=inp.device)
        offsets = [d * extent for d in rdispls]
        work = self.pg.alltoall_base(out, inp.contiguous(), out_split, in_split)
        return self.request([work], [lambda: unpack(out, out_split, r.bytes(), offsets)],
                            keep=(msg, inp, out))

    def alltoallv(self, msg: Any) -> Any:
        return self.alltoall(msg, True)

    # -- Reductions -----------------------------------------------------------

    def operand(self, msg: Any) -> tuple[Side, Side, Side]:
        """(send side, receive side, the side holding this rank's operand)."""
        s, r = self.side(msg, 0, "sendbuf"), self.side(msg, 1, "recvbuf")
        return s, r, (r if s.kind == "in_place" else s)

    def gathered(self, x: Side, count: int, to_root: int | None = None
                 ) -> tuple[Any, Callable[[], list[torch.Tensor]], object]:
        """Post a gather of every rank's ``count`` elements of ``x`` (to all,
        or to ``to_root``); return (work, function giving the operands)."""
        size, nbytes = self.size, count * x.extent
        mine = x.block(0, count).clone()
        dtype = getattr(torch, x.tname)
        if to_root is None:
            outs = [torch.empty(nbytes, dtype=_BYTE, device=mine.device) for _ in range(size)]
            work = self.pg.allgather([outs], [mine])
            return work, lambda: [o.view(dtype) for o in outs], (mine, outs)
        here = self.rank == to_root
        out = torch.empty(nbytes * size if here else 0, dtype=_BYTE, device=mine.device)
        in_split = [0] * size
        in_split[to_root] = nbytes
        out_split = [nbytes if here else 0] * size
        work = self.pg.alltoall_base(out, mine, out_split, in_split)
        return work, lambda: list(out.view(dtype).view(size, count).unbind(0)), (mine, out)

    def allreduce(self, msg: Any, op: object, kind: str = "all") -> Any:
        s, r, x = self.operand(msg)
        name = op_name(op, self.name)
        count = r.count
        if count == 0:
            return self.request([])
        out = r.typed(count)
        if kind == "all" and self.native_reduction(name, r.tname):
            if s.kind != "in_place":
                out.copy_(s.typed(count))
            return self.request([self.pg.allreduce([out], _reduce_op(name))], keep=msg)
        work, operands, keep = self.gathered(x, count)
        rank = self.rank

        def reduce_here() -> None:
            values = operands()
            if kind == "all":
                out.copy_(fold(name, values))
            elif kind == "scan":
                out.copy_(fold(name, values[:rank + 1]))
            elif rank > 0:              # exscan: rank 0's result is undefined
                out.copy_(fold(name, values[:rank]))
        return self.request([work], [reduce_here], keep=(msg, keep))

    def scan(self, msg: Any, op: object) -> Any:
        return self.allreduce(msg, op, "scan")

    def exscan(self, msg: Any, op: object) -> Any:
        return self.allreduce(msg, op, "exscan")

    def reduce(self, msg: Any, op: object, root: int) -> Any:
        s, r, x = self.operand(msg)
        name = op_name(op, self.name)
        count = x.count
        if count == 0:
            return self.request([])
        here = self.rank == root
        if self.native_reduction(name, x.tname):
            if here:
                t = r.typed(count)
                if s.kind != "in_place":
                    t.copy_(s.typed(count))
            else:
                t = s.typed(count).clone()   # the backend may overwrite it
            opts = c10d().ReduceOptions()
            opts.rootRank = root
            opts.reduceOp = _reduce_op(name)
            return self.request([self.pg.reduce([t], opts)], keep=(msg, t))
        work, operands, keep = self.gathered(x, count, to_root=root)
        steps = [lambda: r.typed(count).copy_(fold(name, operands()))] if here else []
        return self.request([work], steps, keep=(msg, keep))

    def reduce_scatter(self, msg: Any, op: object, block: bool = False) -> Any:
        s, r, _ = self.operand(msg)
        name = op_name(op, self.name)
        size, rank = self.size, self.rank
        counts = [r.count] * size if block else r.counts
        total = sum(counts)
        start = sum(counts[:rank])
        whole = r if s.kind == "in_place" else s
        if total == 0:
            return self.request([])

        def take(result: torch.Tensor) -> None:
            if counts[rank]:
                r.typed(counts[rank]).copy_(result[start:start + counts[rank]])
        if self.native_reduction(name, whole.tname):
            t = whole.typed(total).clone()
            work = self.pg.allreduce([t], _reduce_op(name))
            return self.request([work], [lambda: take(t)], keep=(msg, t))
        work, operands, keep = self.gathered(whole, total)
        return self.request([work], [lambda: take(fold(name, operands()))],
                            keep=(msg, keep))

    def reduce_scatter_block(self, msg: Any, op: object) -> Any:
        return self.reduce_scatter(msg, op, True)


def _reduce_op(name: str) -> Any:
    ReduceOp = c10d().ReduceOp
    return {"SUM": ReduceOp.SUM, "PROD": ReduceOp.PRODUCT, "MAX": ReduceOp.MAX,
            "MIN": ReduceOp.MIN, "BAND": ReduceOp.BAND, "BOR": ReduceOp.BOR,
            "BXOR": ReduceOp.BXOR}[name]


class TorchBackend(Backend):
    """A backend on a torch process group: it only says how to make the group
    (``make_group``); every operation comes from ``TorchSubcomm``."""

    def unavailable(self) -> str | None:
        try:
            dist = c10d()
        except ImportError as exc:
            return f"torch.distributed cannot be imported ({exc})"
        if not dist.is_available() or not getattr(dist, f"is_{self.name}_available")():
            return f"this torch build has no {self.name.upper()}"
        return None

    def create(self, comm: Any) -> TorchSubcomm:
        return TorchSubcomm(self, comm, self.make_group)

    def make_group(self, comm: Any) -> tuple[Any, Any]:
        """The process group over ``comm`` and the store it rendezvoused
        through (collective over ``comm``)."""
        raise NotImplementedError
