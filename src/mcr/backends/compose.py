"""Every Comm operation composed from a backend's three primitives: an
all-to-all of bytes (``tensor_alltoall``), and a send and a receive of bytes
(``tensor_send``, ``tensor_recv``). These are the default bodies of
``base.Subcomm``'s operations: the one place where what a backend does not
run itself is built.

The core has already parsed and validated the arguments exactly as for MPI
(the same ``_Call`` parsers); each operation here packs what it sends into
byte tensors, posts one primitive, and leaves the unpacking to a step that
runs when the request completes. So every operation is one backend call plus
local copies, and a request never needs another process to make progress on
its behalf.

- Barrier, Bcast, Gather(v), Scatter(v), Allgather(v), Alltoall(v) are
  all-to-alls with the right blocks empty; vector forms pack blocks at their
  displacements into one tensor and unpack them on completion.
- Reductions gather the operands and reduce them in rank order here, exactly
  as MPI's predefined ops define them (a backend that reduces some op/type
  pairs itself overrides the operation and comes here for the rest).
- Point-to-point messages carry MPI semantics (tags, ANY_SOURCE, ANY_TAG,
  Probe, truncation errors): a small header goes over MPI (on a private
  duplicate of the communicator, ``Subcomm.hcomm``), so MPI does the
  matching, and the payload over the backend, tagged with a per-pair
  sequence number. A payload in host memory of at most
  ``Backend.eager_limit`` bytes travels inside its header instead (eager):
  one MPI message, no backend rendezvous after the header (Gloo's costs
  ~100 us). Sends are buffered: they complete once the payload is copied, so
  a sender never waits for the receiver's host thread. A larger payload in
  host memory is copied into a buffer that an earlier, delivered send used
  (``payload_buffer``): fresh memory costs a page fault per 4 KiB, more than
  the copy itself.

A sub-communicator's point-to-point state (sequence numbers, sends in flight,
probed headers, spare buffers) is shared by the threads that use the
communicator (MPI_THREAD_MULTIPLE): every step that reads and changes it
holds ``Subcomm.lock``, and no step blocks while holding it.
"""

import ctypes
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from mpi4py import MPI

from mcr import _core

from .message import RecvStatus, Side

if TYPE_CHECKING:
    from .base import Subcomm, Work

__all__ = ["op_name", "copy", "clone", "pack", "unpack", "fold", "operand"]

_OP_NAMES: dict[int, str] = {}
for _name in ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"):
    _OP_NAMES[getattr(MPI, _name).py2f()] = _name

_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
_BYTE = torch.uint8
_SEQ_MOD = 1 << 30
_NO_MESSAGE = RecvStatus(MPI.PROC_NULL, MPI.ANY_TAG, 0, 0)
_HEADER = 16                # bytes of a header: payload bytes and sequence number (int64)
_HEADER_FORMAT = struct.Struct("=qq")


def op_name(op: object, backend: str) -> str:
    """The name of a predefined MPI op; TypeError for any other."""
    name = _OP_NAMES.get(op.py2f()) if isinstance(op, MPI.Op) else None
    if name is None:
        raise TypeError(f"op: user-defined operations run on backend 'mpi' only, not "
                        f"{backend!r}")
    return name


def in_order(sizes: Sequence[int], offsets: Sequence[int]) -> bool:
    """Whether the blocks (``sizes`` at ``offsets``) lie one after another from 0."""
    at = 0
    for n, o in zip(sizes, offsets):
        if n:
            if o != at:
                return False
            at += n
    return True


def copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[:] = src`` (same type and length). In host memory, one memmove,
    on this thread and without the GIL: torch's ``copy_`` splits a large copy
    over its intra-op threads, which wait for each other when the ranks share
    the cores (4 MiB, two ranks on two cores: 0.9 ms against 0.3)."""
    if dst.device.type == "cpu" and src.device.type == "cpu" \
            and dst.dtype == src.dtype and dst.is_contiguous() and src.is_contiguous():
        nbytes = dst.numel() * dst.element_size()
        if nbytes != src.numel() * src.element_size():
            raise ValueError(f"copy of {src.numel()} elements into {dst.numel()}")
        if nbytes:
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)
    else:
        dst.copy_(src)


def clone(src: torch.Tensor) -> torch.Tensor:
    """A copy of ``src`` (through ``copy``)."""
    out = torch.empty_like(src, memory_format=torch.contiguous_format)
    copy(out, src)
    return out


def repeated(src: torch.Tensor, times: int) -> torch.Tensor:
    """``times`` copies of the 1-D ``src``, one after another."""
    n = src.numel()
    out = torch.empty(n * times, dtype=src.dtype, device=src.device)
    for i in range(times):
        copy(out[i * n:(i + 1) * n], src)
    return out


def pack(src: torch.Tensor, sizes: Sequence[int], offsets: Sequence[int]) -> torch.Tensor:
    """The byte blocks (``sizes`` at ``offsets`` in ``src``) one after another;
    a view of ``src`` when they already are."""
    total, at = sum(sizes), 0
    if in_order(sizes, offsets):
        return src[:total] if total else src[:0]
    out = torch.empty(total, dtype=_BYTE, device=src.device)
    for n, o in zip(sizes, offsets):
        if n:
            copy(out[at:at + n], src[o:o + n])
            at += n
    return out


def unpack(packed: torch.Tensor, sizes: Sequence[int], dst: torch.Tensor,
           offsets: Sequence[int]) -> None:
    """Store the consecutive blocks of ``packed`` (``sizes``) at ``offsets`` of ``dst``."""
    at = 0
    for n, o in zip(sizes, offsets):
        if n:
            copy(dst[o:o + n], packed[at:at + n])
            at += n


def fold(op: str, operands: Sequence[torch.Tensor]) -> torch.Tensor:
    """Reduce ``operands`` (tensors of one type) in rank order, as MPI's
    predefined ``op`` does: a lone operand as it is (MPI applies no operation
    to it, so a logical one is not made 0 or 1)."""
    if len(operands) == 1:
        return clone(operands[0])
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
    acc = clone(operands[0])
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


def operand(sub: "Subcomm", msg: Any) -> tuple[Side, Side, Side]:
    """(send side, receive side, the side holding this rank's operand) of a
    reduction; TypeError for elements torch has no type for (long double),
    which only MPI reduces."""
    s, r = sub.side(msg, 0, "sendbuf"), sub.side(msg, 1, "recvbuf")
    x = r if s.kind == "in_place" else s
    if x.tname is not None and not isinstance(getattr(torch, x.tname, None), torch.dtype):
        raise TypeError(f"{'recvbuf' if s.kind == 'in_place' else 'sendbuf'}: backend "
                        f"{sub.name!r} cannot reduce {x.tname} elements (torch has no such "
                        "type); reduce them on backend 'mpi'")
    return s, r, x


# -- Point-to-point ---------------------------------------------------------------------

_waiters: Any = None
_WAITED_LOCK = threading.Lock()


class _Waited:
    """A work handle whose is_completed() only turns true inside wait() (Gloo's
    send and receive). Polled (a send's), a pool thread waits for it and
    polling asks the thread; a matched receive's is waited for by the caller
    itself, with no thread between (``_RecvWork``): its payload is already on
    its way (the receive is posted once the header has arrived), so that wait
    always ends, and it must not queue behind sends' waits in the pool."""

    __slots__ = ("work", "future", "inline", "done")

    def __init__(self, work: "Work") -> None:
        self.work: "Work" = work
        self.future: Any = None                 # the pool's wait, once polled
        self.inline: threading.Event | None = None     # set when a caller's own wait ends
        self.done = False

    def is_completed(self) -> bool:
        if self.done:
            return True
        with _WAITED_LOCK:      # (one wait only: a second one of Gloo's would never end)
            if self.future is None and self.inline is None:
                global _waiters
                if _waiters is None:
                    from concurrent.futures import ThreadPoolExecutor
                    _waiters = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mcr-p2p")
                self.future = _waiters.submit(self.work.wait)
        if self.inline is not None:
            return self.inline.is_set()
        return bool(self.future.done())

    def wait(self) -> None:
        if self.done:
            return
        mine = False
        with _WAITED_LOCK:
            if self.future is None and self.inline is None:
                self.inline, mine = threading.Event(), True
        if mine:
            try:
                self.work.wait()
            finally:
                self.inline.set()   # type: ignore[union-attr]
        elif self.inline is not None:
            self.inline.wait()      # another thread's wait of the same work
        else:
            self.future.result()
        self.done = True


def header_buffer(nbytes: int) -> Any:
    """A buffer for one header and a payload of up to ``nbytes`` inside it.
    (The eager path reads and writes these with struct and memmove: a torch
    operation costs microseconds, as much as the MPI message.)"""
    return np.empty(_HEADER + nbytes, dtype=np.uint8)


def read_header(buf: Any, st: Any) -> "_Received":
    """The header received into ``buf`` (an MPI message of status ``st``)."""
    nbytes, seq = _HEADER_FORMAT.unpack_from(buf)
    payload = None
    if nbytes and st.Get_count(MPI.BYTE) == _HEADER + nbytes:
        payload = buf
    return _Received(st.Get_source(), st.Get_tag(), nbytes, seq, payload)


def pollable(sub: "Subcomm", work: "Work") -> "Work":
    """A handle of a point-to-point work whose is_completed() turns true on its own."""
    return work if sub.backend.p2p_pollable else _Waited(work)


class _Inflight:
    """A buffered send: header request, payload work, the header and payload
    copies, and the payload's buffer to reuse once the send is delivered."""

    __slots__ = ("header_req", "work", "keep", "buffer")

    def __init__(self, header_req: Any, work: Any, keep: object,
                 buffer: torch.Tensor | None) -> None:
        self.header_req, self.work, self.keep, self.buffer = header_req, work, keep, buffer

    def done(self) -> bool:
        return bool(self.header_req.Test()
                    and (self.work is None or self.work.is_completed()))


_SPARE_BUFFERS = 4              # payload buffers a sub-communicator keeps for reuse
_SPARE_BYTES = 1 << 26          # and the bytes they may hold together


def payload_buffer(sub: "Subcomm", nbytes: int) -> torch.Tensor:
    """Host memory for a payload of ``nbytes``: the smallest spare buffer that
    holds it, else a new one of the next power of two (so that messages of
    about one size reuse each other's)."""
    fits = [(b.numel(), i) for i, b in enumerate(sub.spare) if b.numel() >= nbytes]
    if fits:
        return sub.spare.pop(min(fits)[1])
    return torch.empty(1 << (nbytes - 1).bit_length(), dtype=_BYTE)


def settle(sub: "Subcomm") -> None:
    """Forget the delivered sends, keeping their payload buffers for reuse."""
    with sub.lock:
        _settle(sub)


def _settle(sub: "Subcomm") -> None:
    """settle, the lock held."""
    pending = []
    for f in sub.inflight:
        if not f.done():
            pending.append(f)
        elif f.buffer is not None and f.buffer.numel() <= _SPARE_BYTES:
            sub.spare.append(f.buffer)
            sub.spare.sort(key=lambda b: b.numel())      # keep the largest that fit
            while len(sub.spare) > _SPARE_BUFFERS or \
                    sum(b.numel() for b in sub.spare) > _SPARE_BYTES:
                del sub.spare[0]
    sub.inflight = pending


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
    """A header taken off MPI (by a receive, or by Probe until a receive
    claims it), with its payload when the payload came inside it."""

    __slots__ = ("source", "tag", "nbytes", "seq", "payload")

    # payload: the header's buffer (header first), when the payload came inside it
    def __init__(self, source: int, tag: int, nbytes: int, seq: int,
                 payload: Any = None) -> None:
        self.source, self.tag, self.nbytes, self.seq = source, tag, nbytes, seq
        self.payload = payload

    def matches(self, source: int, tag: int) -> bool:
        return (source in (MPI.ANY_SOURCE, self.source)) and tag in (MPI.ANY_TAG, self.tag)


class _RecvWork:
    """A receive: the header (MPI) first, then the payload (the backend)."""

    def __init__(self, sub: "Subcomm", r: Side, source: int, tag: int) -> None:
        self.sub, self.r = sub, r
        self.work: Any = None
        self.error: str | None = None
        self.got: _Received | None = None
        self.target: torch.Tensor | None = None
        # room for an eager payload that fits the receive buffer; a larger one
        # is a truncation, reported as on MPI
        self.capacity = r.count * r.extent
        self.header = header_buffer(min(sub.backend.eager_limit, self.capacity))
        with sub.lock:          # (a probe in between would stash the header it waits for)
            sub.receives.add(self)
            for i, h in enumerate(sub.stash):
                if h.matches(source, tag):
                    del sub.stash[i]
                    self.arrived(h)
                    return
            self.hstatus = MPI.Status()
            self.hreq = sub.hcomm.Irecv(self.header, source, tag)

    def arrived(self, h: _Received) -> None:
        try:
            self._arrived(h)
        finally:
            # last: a thread that sees the header taken (matched(), without the
            # lock) must find the payload in place or its receive posted
            self.got = h

    def _arrived(self, h: _Received) -> None:
        capacity = self.r.count * self.r.extent
        if h.nbytes > capacity:
            self.error = (f"message of {h.nbytes} bytes from rank {h.source} (tag {h.tag}) "
                          f"does not fit the receive buffer of {capacity} bytes")
        if h.payload is not None:                         # it came with the header
            if self.error is None:
                if self.r.device < 0:
                    ctypes.memmove(self.r.addr, h.payload.ctypes.data + _HEADER, h.nbytes)
                else:
                    self.r.bytes()[:h.nbytes].copy_(
                        torch.from_numpy(h.payload[_HEADER:_HEADER + h.nbytes]))
            return
        if self.error is not None:
            target = torch.empty(h.nbytes, dtype=_BYTE, device=self.r.torch_device())
        else:
            target = self.r.bytes()[:h.nbytes]
        if h.nbytes and h.source == self.sub.rank:        # a message to itself
            payload = self.sub.loopback.pop(h.seq, None)
            # (none: it came inside a header too long for the receive's
            # buffer, which Open MPI truncates silently between a process and
            # itself; the receive fails, as it should)
            if payload is not None:
                copy(target, payload)
        elif h.nbytes:
            self.work = pollable(self.sub, self.sub.tensor_recv(target, h.source, h.seq))
            self.target = target

    def matched(self) -> bool:
        """Whether the header has arrived (the payload's receive is posted then)."""
        if self.got is not None:
            return True
        with self.sub.lock:     # (another thread may test it too: one takes the header)
            if self.got is not None:
                return True
            try:
                if not self.hreq.Test(self.hstatus):
                    return False
            except MPI.Exception as exc:
                if exc.Get_error_class() != MPI.ERR_TRUNCATE:
                    raise
                # an eager payload longer than the receive buffer
                source, tag = self.hstatus.Get_source(), self.hstatus.Get_tag()
                self.error = (f"a message from rank {source} (tag {tag}) does not fit "
                              f"the receive buffer of {self.capacity} bytes")
                self.got = _Received(source, tag, self.capacity, 0)
                return True
            self.arrived(read_header(self.header, self.hstatus))
        return True

    def is_completed(self) -> bool:
        if not self.matched():
            return False
        if self.work is not None and not self.sub.backend.p2p_pollable:
            # the payload is on its way: wait for it here, not through a pool
            # thread, whose threads the sends' waits may all hold (those end
            # only when the peers receive, which may be after this does)
            self.work.wait()
        return self.work is None or bool(self.work.is_completed())

    def wait_ready(self) -> bool:
        """Whether wait() ends without this process driving MPI: once the
        header has matched, the payload is on its way."""
        return self.matched()

    def payload_pending(self) -> bool:
        """The header has matched and the payload is still arriving."""
        return self.got is not None and self.work is not None and \
            not self.work.is_completed()

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
        if self.error is not None:
            exc = _core.Exception(MPI.ERR_TRUNCATE)
            # BaseException.add_note is Python 3.11+; __notes__ is what it fills
            exc.__notes__ = [*getattr(exc, "__notes__", []), f"buf: {self.error}"]
            raise exc

    def status(self) -> RecvStatus:
        h = self.got
        assert h is not None
        nbytes = min(h.nbytes, self.r.count * self.r.extent)
        rtype = _core._datatype_handle(self.r.tname) if self.r.tname else 0
        return RecvStatus(h.source, h.tag, nbytes, rtype)


def post_send(sub: "Subcomm", s: Side, dest: int, tag: int, synchronous: bool = False) -> Any:
    """Send the message of side ``s``, buffered: the request is complete
    (``synchronous``: once the receiver has matched the header)."""
    if dest == MPI.PROC_NULL:
        sub.start()        # a call on the backend: it joins the set-up as any other
        return sub.request([], status=lambda: _NO_MESSAGE)     # (source PROC_NULL, as MPI's)
    with sub.lock:
        hreq = _post_send(sub, s, dest, tag, synchronous)
    return sub.request([_Matched(hreq)] if synchronous else [])


def _post_send(sub: "Subcomm", s: Side, dest: int, tag: int, synchronous: bool) -> Any:
    """post_send's steps, under the sub-communicator's lock; the header's request."""
    nbytes = s.count * s.extent
    seq = sub.seq[dest]
    sub.seq[dest] = (seq + 1) % _SEQ_MOD
    eager = s.device < 0 and nbytes <= sub.backend.eager_limit
    header = header_buffer(nbytes if eager else 0)
    _HEADER_FORMAT.pack_into(header, 0, nbytes, seq)
    work = payload = buffer = hreq = None
    isend = sub.hcomm.Issend if synchronous else sub.hcomm.Isend
    if eager and nbytes:
        ctypes.memmove(header.ctypes.data + _HEADER, s.addr, nbytes)
    elif nbytes:
        # the header goes once the copy's memory is there (nothing after it can
        # fail short of the backend itself): the receiver posts its receive
        # while this copies
        if s.device < 0:
            buffer = payload_buffer(sub, nbytes)
            payload = buffer[:nbytes]
            if dest != sub.rank:
                hreq = isend(header, dest, tag)
            ctypes.memmove(buffer.data_ptr(), s.addr, nbytes)
        else:
            payload = clone(s.bytes()[:nbytes])
        if dest == sub.rank:       # Gloo pairs do not connect a rank to itself
            sub.loopback[seq] = payload
            buffer = None
        else:
            work = pollable(sub, sub.tensor_send(payload, dest, seq))
    if hreq is None:
        hreq = isend(header, dest, tag)
    _settle(sub)
    sub.inflight.append(_Inflight(hreq, work, (header, payload), buffer))
    return hreq


def send(sub: "Subcomm", msg: Any, dest: int, tag: int, synchronous: bool = False) -> Any:
    return post_send(sub, sub.side(msg, 0, "buf"), dest, tag, synchronous)


def recv(sub: "Subcomm", msg: Any, source: int, tag: int, arg: str = "buf") -> Any:
    r = sub.side(msg, 1, arg)
    if source == MPI.PROC_NULL:
        sub.start()
        return sub.request([], status=lambda: _NO_MESSAGE)
    work = _RecvWork(sub, r, source, tag)
    return sub.request([work], status=work.status, keep=msg)


def sendrecv(sub: "Subcomm", msg: Any, dest: int, sendtag: int, source: int,
             tag: int) -> Any:
    # the send completes at once (buffered): the request is the receive's
    post_send(sub, sub.side(msg, 0, "sendbuf"), dest, sendtag)
    return recv(sub, msg, source, tag, "recvbuf")


def sendrecv_replace(sub: "Subcomm", msg: Any, dest: int, sendtag: int, source: int,
                     tag: int) -> Any:
    # the send copies the buffer at once, so receiving into it is safe
    post_send(sub, sub.side(msg, 1, "buf"), dest, sendtag)
    return recv(sub, msg, source, tag)


def probe(sub: "Subcomm", source: int, tag: int, status: Any, blocking: bool) -> bool:
    if source == MPI.PROC_NULL:
        sub.start()
        _core._fill_status(status, MPI.PROC_NULL, MPI.ANY_TAG, 0)
        return True
    # blocking: polled, not MPI's Mprobe, which would hold the lock while it
    # waits, or (without it) wait for a header another thread's probe stashed
    spins, timeout = 0, sub.comm.timeout if blocking else None
    deadline = None if not timeout else time.monotonic() + timeout
    while not _probed(sub, source, tag, status):
        if not blocking:
            return False
        if deadline is not None and time.monotonic() > deadline:
            _core._raise_wait_timeout(sub.comm, f"Probe (source {source}, tag {tag}) "
                                      f"[{sub.name}]")
        spins += 1
        if spins > 100:
            time.sleep(1e-5 if spins < 10000 else 1e-4)
    return True


def _probed(sub: "Subcomm", source: int, tag: int, status: Any) -> bool:
    """One try of probe: a stashed header, or one taken off MPI into the stash.

    The stash holds, of each sender, the earliest headers not yet received,
    in order (a receive looks there before MPI): a header found by its tag is
    taken with those its sender sent before it, so that none overtakes them."""
    with sub.lock:
        for h in sub.stash:
            if h.matches(source, tag):
                _core._fill_status(status, h.source, h.tag, h.nbytes)
                return True
        st = MPI.Status()
        if not sub.hcomm.Iprobe(source, tag, st):
            return False
        sender = st.Get_source()
        while True:             # the sender's headers, oldest first, up to the one found
            message = sub.hcomm.Improbe(sender, MPI.ANY_TAG, st)
            header = header_buffer(st.Get_count(MPI.BYTE) - _HEADER)
            message.Recv(header)
            h = read_header(header, st)
            sub.stash.append(h)
            if h.matches(source, tag):
                break
    _core._fill_status(status, h.source, h.tag, h.nbytes)
    return True


def drain(sub: "Subcomm") -> None:
    """Deliver ``sub``'s outstanding sends and finish its matched receives
    (collective, before the backend goes away).

    A backend payload is sent once its receiver has matched the header and
    posted the payload's receive, so while this waits for its own sends, it
    also matches the headers that reach its posted receives (those of
    requests not waited for yet: MPI lets a communicator be freed with
    operations pending, to complete later). Then a barrier: once every rank's
    sends are delivered, the payloads of all receives here that have matched
    a message have arrived, and those receives (freed ones too) are finished.

    The communicator's timeout bounds the wait (a process that never frees
    the communicator): TimeoutError, and the barrier stays pending, so that
    freeing again waits for the same one."""
    timeout = sub.comm.timeout
    deadline = None if timeout is None else time.monotonic() + timeout
    spins = 0
    while True:
        settle(sub)
        with sub.lock:
            receives = list(sub.receives)
        for r in receives:
            r.matched()     # a header in: its payload's receive is posted
        _core._poll()       # MPI, and freed receives that the peers' sends wait for
        if sub.leaving is None and not sub.inflight:
            sub.leaving = sub.hcomm.Ibarrier()
        if sub.leaving is not None and sub.leaving.Test():
            break
        if deadline is not None and time.monotonic() > deadline:
            _core._raise_timeout(sub.comm, f"to free the communicator (Free is collective; "
                                 f"its {sub.name!r} sub-communicator first delivers this "
                                 "process's sends)")
        spins += 1
        if spins > 64:
            time.sleep(1e-4)
    sub.leaving = None
    with sub.lock:
        receives = list(sub.receives)
    while any(r.payload_pending() for r in receives):
        _core._poll()
        time.sleep(1e-5)


# -- Collectives: all-to-alls with the right blocks empty --------------------------------


def exchange(sub: "Subcomm", output: torch.Tensor, input: torch.Tensor,
             output_split: list[int], input_split: list[int]) -> "Work":
    """The backend's all-to-all of bytes, on a contiguous input (connected first)."""
    sub.start()
    return sub.tensor_alltoall(output, input.contiguous(), output_split, input_split)


def barrier(sub: "Subcomm", msg: Any) -> Any:
    # a byte to and from every rank: no rank leaves before all have entered
    ones = [1] * sub.size
    inp = torch.zeros(sub.size, dtype=_BYTE)
    out = torch.empty(sub.size, dtype=_BYTE)
    return sub.request([exchange(sub, out, inp, ones, ones)], keep=(inp, out))


def bcast(sub: "Subcomm", msg: Any, root: int) -> Any:
    r = sub.side(msg, 1, "buf")
    nbytes = r.count * r.extent
    if nbytes == 0:
        return sub.request([])
    size, here = sub.size, sub.rank == root
    mine = r.block(0, r.count)
    in_split = [0 if i == root or not here else nbytes for i in range(size)]
    out_split = [0 if i != root or here else nbytes for i in range(size)]
    inp = repeated(mine, size - 1) if here else mine[:0]
    out = mine[:0] if here else mine
    return sub.request([exchange(sub, out, inp, out_split, in_split)], keep=(msg, inp))


def gather(sub: "Subcomm", msg: Any, root: int) -> Any:
    s, r = sub.side(msg, 0, "sendbuf"), sub.side(msg, 1, "recvbuf")
    size, rank, extent = sub.size, sub.rank, s.extent
    mine = 0 if s.kind == "in_place" else s.count * extent
    in_split = [0] * size
    in_split[root] = mine
    # (IN_PLACE at the root: no bytes of its own, on the receive buffer's device,
    # as a backend such as NCCL takes tensors of one device only)
    inp = s.block(0, s.count) if mine else (r if s.kind == "in_place" else s).bytes()[:0]
    steps, out_split = [], [0] * size
    out = inp[:0]
    if rank == root:
        counts, displs = r.blocks(size)
        out_split = [c * extent for c in counts]
        if s.kind == "in_place":
            out_split[root] = 0
        offsets = [d * extent for d in displs]
        if in_order(out_split, offsets):    # the blocks land where they belong: no copy
            out = r.bytes()[:sum(out_split)]
        else:
            out = torch.empty(sum(out_split), dtype=_BYTE, device=inp.device)
            steps.append(lambda: unpack(out, out_split, r.bytes(), offsets))
    work = exchange(sub, out, inp, out_split, in_split)
    return sub.request([work], steps, keep=(msg, out, inp))


def scatter(sub: "Subcomm", msg: Any, root: int) -> Any:
    s, r = sub.side(msg, 0, "sendbuf"), sub.side(msg, 1, "recvbuf")
    size, rank = sub.size, sub.rank
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
    work = exchange(sub, out, inp, out_split, in_split)
    return sub.request([work], keep=(msg, inp))


def allgather(sub: "Subcomm", msg: Any) -> Any:
    s, r = sub.side(msg, 0, "sendbuf"), sub.side(msg, 1, "recvbuf")
    size, rank, extent = sub.size, sub.rank, r.extent
    counts, displs = r.blocks(size)
    out_split = [c * extent for c in counts]
    if sum(out_split) == 0:
        return sub.request([])
    mine = r.block(displs[rank], counts[rank]) if s.kind == "in_place" \
        else s.block(0, s.count)
    inp = repeated(mine, size)              # a copy: in place, the result overwrites it
    out = torch.empty(sum(out_split), dtype=_BYTE, device=mine.device)
    offsets = [d * extent for d in displs]
    work = exchange(sub, out, inp, out_split, [mine.numel()] * size)
    return sub.request([work], [lambda: unpack(out, out_split, r.bytes(), offsets)],
                       keep=(msg, inp, out))


def alltoall(sub: "Subcomm", msg: Any) -> Any:
    s, r = sub.side(msg, 0, "sendbuf"), sub.side(msg, 1, "recvbuf")
    size, extent = sub.size, r.extent
    rcounts, rdispls = r.blocks(size)
    src = r if s.kind == "in_place" else s
    scounts, sdispls = src.blocks(size)
    in_split = [c * extent for c in scounts]
    out_split = [c * extent for c in rcounts]
    inp = pack(src.bytes(), in_split, [d * extent for d in sdispls])
    if s.kind == "in_place":
        inp = clone(inp)            # the result overwrites what is sent
    offsets = [d * extent for d in rdispls]
    if in_order(out_split, offsets):    # the blocks land where they belong: no copy
        work = exchange(sub, r.bytes()[:sum(out_split)], inp, out_split, in_split)
        return sub.request([work], keep=(msg, inp))
    out = torch.empty(sum(out_split), dtype=_BYTE, device=inp.device)
    work = exchange(sub, out, inp, out_split, in_split)
    return sub.request([work], [lambda: unpack(out, out_split, r.bytes(), offsets)],
                       keep=(msg, inp, out))


# -- Reductions: gather the operands, fold them in rank order ---------------------------


def gathered(sub: "Subcomm", x: Side, count: int, to_root: int | None = None
             ) -> tuple["Work", Callable[[], list[torch.Tensor]], object]:
    """Post a gather of every rank's ``count`` elements of ``x`` (to all, or
    to ``to_root``); return (work, function giving the operands, what to keep)."""
    size, nbytes = sub.size, count * x.extent
    mine = x.block(0, count)
    dtype = getattr(torch, x.tname)
    here = to_root is None or sub.rank == to_root
    out = torch.empty(nbytes * size if here else 0, dtype=_BYTE, device=mine.device)
    if to_root is None:
        inp, in_split = repeated(mine, size), [nbytes] * size
    else:
        inp, in_split = mine, [0] * size
        in_split[to_root] = nbytes
    out_split = [nbytes if here else 0] * size
    work = exchange(sub, out, inp, out_split, in_split)
    return work, lambda: list(out.view(dtype).view(size, count).unbind(0)), (inp, out)


def reduce_all(sub: "Subcomm", msg: Any, op: object, kind: str) -> Any:
    """Allreduce (``kind`` "all"), Scan ("scan") or Exscan ("exscan")."""
    s, r, x = operand(sub, msg)
    name = op_name(op, sub.name)
    count = r.count
    if count == 0:
        return sub.request([])
    out = r.typed(count)
    work, operands, keep = gathered(sub, x, count)
    rank = sub.rank

    def reduce_here() -> None:
        values = operands()
        if kind == "all":
            copy(out, fold(name, values))
        elif kind == "scan":
            copy(out, fold(name, values[:rank + 1]))
        elif rank > 0:              # exscan: rank 0's result is undefined
            copy(out, fold(name, values[:rank]))
    return sub.request([work], [reduce_here], keep=(msg, keep))


def reduce(sub: "Subcomm", msg: Any, op: object, root: int) -> Any:
    s, r, x = operand(sub, msg)
    name = op_name(op, sub.name)
    count = x.count
    if count == 0:
        return sub.request([])
    work, operands, keep = gathered(sub, x, count, to_root=root)
    steps = [lambda: copy(r.typed(count), fold(name, operands()))] \
        if sub.rank == root else []
    return sub.request([work], steps, keep=(msg, keep))


def scattered_counts(sub: "Subcomm", r: Side, block: bool) -> tuple[list[int], int, int]:
    """Reduce_scatter(_block)'s (counts, total, this rank's start)."""
    counts = [r.count] * sub.size if block else list(r.counts or ())
    return counts, sum(counts), sum(counts[:sub.rank])


def reduce_scatter(sub: "Subcomm", msg: Any, op: object, block: bool) -> Any:
    s, r, _ = operand(sub, msg)
    name = op_name(op, sub.name)
    counts, total, start = scattered_counts(sub, r, block)
    mine = counts[sub.rank]
    if total == 0:
        return sub.request([])
    work, operands, keep = gathered(sub, r if s.kind == "in_place" else s, total)

    def take() -> None:
        if mine:
            copy(r.typed(mine), fold(name, operands())[start:start + mine])
    return sub.request([work], [take], keep=(msg, keep))
