"""Tensor fusion: many small collectives of one kind run as one.

``mcr.Fusion(comm)`` stands for the communicator ``comm``: its ``Iallreduce``,
``Ibcast`` and ``Iallgather`` gather small tensors into buckets of up to
``bucket_bytes`` bytes, and each bucket runs as one collective on ``comm``
(so call hooks and ``backend="auto"`` see one large operation). Every call
still returns its own ``mcr.Request``, completed when its bucket's collective
has completed and its result has been copied out. Every other method is
``comm``'s, called after the open buckets are flushed, so a loop of
``Iallreduce`` calls is fused by changing only the object it calls::

    with mcr.Fusion(comm, bucket_bytes=1 << 20) as fcomm:
        reqs = [fcomm.Iallreduce(mcr.IN_PLACE, g) for g in grads]
        mcr.Request.Waitall(reqs)

What is fused. Plain contiguous torch tensors (CPU or CUDA): ``Iallreduce``
with ``SUM``, ``PROD``, ``MAX`` or ``MIN`` (not on bool; ``MAX``/``MIN`` not
on complex), ``Ibcast``, and ``Iallgather`` (blocks of equal size; sendbuf a
tensor or ``IN_PLACE``). A bucket holds calls of one kind only: operation,
op (Allreduce) or root (Bcast), dtype, device and backend; calls of other
kinds go to their own buckets. Anything else (a message spec list, a tensor
of more than ``bucket_bytes`` bytes, other ops, arguments the core rejects, such
as a dtype it does not support) runs unfused, after a flush.
``bucket_bytes`` counts what each rank contributes (for Allgather, its send
block).

When a bucket is flushed (its collective is posted): when it is full (the
next call would not fit, or it holds exactly ``bucket_bytes``), when one of its
requests is tested or waited for (``Wait``, ``Test``, ``Request.Waitall``,
..., ``Free``), at ``flush()`` and at the end of a ``with`` block, before any
call forwarded to ``comm`` (except queries such as ``Get_rank`` and
non-blocking point-to-point calls such as ``Isend``, which take no part in
the order of collectives), when ``cycle`` seconds have passed, when the
process tests or waits for any request or enters a blocking call (progress,
below), and before a collective called on ``comm`` itself.

Agreement: rank 0 decides. Every rank must run the same collectives in the
same order, so every rank must cut the sequence of fused calls into the same
buckets. "Full" is a function of the sequence of calls, but the other
triggers are not: a clock differs between ranks, and ``Waitany``/``Testany``
test requests only until one is complete, which depends on timing. So rank 0
alone decides where each bucket ends, on all the triggers above, and posts
its collective at once; it sends each decision to the other ranks (a few
bytes, non-blocking, on a private duplicate of ``comm``) as "the bucket that
starts at call i holds that kind's calls before call n" (or "every open
bucket holds the calls before call n"). The other ranks keep adding calls to
their open buckets, never closing one themselves: they read decisions when
one of their buckets is tested or waited for, when their own bucket reaches
``bucket_bytes`` (then at every 8th call until the decision has come), and when
they reach call n of a decision they read early; and they post the
collectives in the order rank 0 decided them. Where a rank must have posted
everything (``flush()``, the end of a ``with`` block, a call forwarded to
``comm``), it waits for rank 0's decisions up to that point; rank 0, running
the same program, flushes at the same point, so the wait ends.

The clock. ``cycle`` is read by rank 0 only, whenever it enters the fusion
code (a fused call, a test or wait of a fused request, a flush): when
``cycle`` seconds have passed since a call found no bucket open, every open
bucket is flushed. While rank 0 computes outside mcr, no clock flush
happens; the other ranks ignore the clock.

Ordering. Fused collectives are posted on ``comm`` in rank 0's order, and
every forwarded call flushes first, so collectives issued through the
``Fusion`` reach ``comm`` in program order on every rank, as MPI requires.
A collective called on ``comm`` directly flushes first as well (``collective``,
called by the core before every collective while a bucket is open).

Progress. Fused calls are non-blocking collectives the program has started:
they complete while every rank is inside mcr, whatever call it is in. While
a bucket is open the ``Fusion`` is driven as mcr's staged operations are
(``mcr.progress``): at every test and wait of the process, rank 0 posts every
open bucket and the others apply the decisions that have come (``pump``);
at the start of a blocking call, the same (``blocking``); while the calling
thread is blocked in MPI, the helper thread applies rank 0's decisions on
the other ranks. A ``Fusion`` and its requests are used by one thread at a
time: it keeps no locks; mcr.progress works on it only from the thread that
opened its newest bucket (or for it, while it is blocked), never from inside
the fusion's own code (``_busy``).
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING, Any

from .errors import TimeoutError as _Timeout

if TYPE_CHECKING:
    from ._core import Comm, Request

__all__ = ["Fusion", "DEFAULT_BUCKET_BYTES"]

DEFAULT_BUCKET_BYTES = 1 << 20

_ALLREDUCE, _BCAST, _ALLGATHER = "allreduce", "bcast", "allgather"
_OPEN, _POSTED, _DONE, _FAILED, _STALLED = 0, 1, 2, 3, 4
_EVERY = -1                 # a decision's first call that means "every open bucket"
_NEVER = 1 << 62            # a call index no program reaches
_TAG = 1

# forwarded without a flush: queries, and non-blocking point-to-point calls
# (they are not ordered with collectives, and fusing loops mix them in)
_NO_FLUSH = frozenset({
    "Get_rank", "Get_size", "Get_group", "Get_name", "Get_topology", "Get_attr",
    "Get_info", "Get_errhandler", "Is_inter", "Is_intra", "Is_topo", "Compare",
    "to_mpi4py", "py2f", "f2py", "handle", "Isend", "Ibsend", "Issend", "Irsend", "Irecv",
    "Iprobe", "Improbe", "isend", "ibsend", "issend", "irecv", "iprobe",
    "Send_init", "Bsend_init", "Ssend_init", "Rsend_init", "Recv_init",
})


class _Bucket:
    """Calls of one kind (``key``), run as one collective once closed."""

    __slots__ = ("fusion", "key", "kind", "arg", "backend", "itemsize", "ins", "outs",
                 "counts", "calls", "works", "nbytes", "state", "req", "buf", "error")

    def __init__(self, fusion: Fusion, key: tuple[Any, ...], kind: str, arg: Any,
                 backend: str | None, itemsize: int) -> None:
        self.fusion = fusion
        self.key = key
        self.kind = kind
        self.arg = arg                      # the op (Allreduce) or the root (Bcast)
        self.backend = backend
        self.itemsize = itemsize
        self.ins: list[Any] = []            # flat tensors to send
        self.outs: list[Any] = []           # flat tensors to receive into
        self.counts: list[int] = []         # elements each call sends
        self.calls: list[int] = []          # the calls' positions in the fusion's sequence
        # each call's request waits on the one-item list of handles it was
        # made with, [this bucket]: a call moved to another bucket (split)
        # is moved by replacing that item
        self.works: list[list[Any]] = []
        self.nbytes = 0
        self.state = _OPEN
        self.req: Request | None = None
        self.buf: Any = None
        self.error: BaseException | None = None     # why its collective was not posted

    @property
    def first(self) -> int:
        return self.calls[0]

    def split(self, end: int) -> _Bucket | None:
        """Keep the calls before call `end`; return the others as a new open
        bucket (None if there are none)."""
        cut = bisect_left(self.calls, end)
        if cut == len(self.calls):
            return None
        rest = _Bucket(self.fusion, self.key, self.kind, self.arg, self.backend, self.itemsize)
        rest.ins, self.ins = self.ins[cut:], self.ins[:cut]
        rest.outs, self.outs = self.outs[cut:], self.outs[:cut]
        rest.counts, self.counts = self.counts[cut:], self.counts[:cut]
        rest.calls, self.calls = self.calls[cut:], self.calls[:cut]
        rest.works, self.works = self.works[cut:], self.works[:cut]
        rest.nbytes = sum(rest.counts) * self.itemsize
        self.nbytes -= rest.nbytes
        for handles in rest.works:
            handles[0] = rest
        return rest

    def add(self, index: int, inp: Any, out: Any, n: int) -> list[Any]:
        """Add call `index` (`n` elements from `inp` into `out`); the list of
        handles its request waits on. The core's fast path (_fuse_quick)
        calls it too, and reads ``nbytes`` and ``itemsize``."""
        handles = [self]
        self.calls.append(index)
        self.works.append(handles)
        self.ins.append(inp)
        self.outs.append(out)
        self.counts.append(n)
        self.nbytes += n * self.itemsize
        return handles

    def packed(self) -> Any:
        """The inputs, one after another in one new tensor (memcpy by the core
        for host tensors it reads directly; torch.cat otherwise)."""
        f = self.fusion
        buf = self.outs[0].new_empty(sum(self.counts))
        if f._pack(self.ins, buf):
            return buf
        return f._torch.cat([t.reshape(-1) for t in self.ins])

    def post(self) -> None:
        """Pack the inputs and post the one collective."""
        f = self.fusion
        if self.kind == _ALLREDUCE:
            self.buf = self.packed()
            self.req = f._comm.Iallreduce(f._in_place, self.buf, self.arg, backend=self.backend)
        elif self.kind == _BCAST:
            self.buf = (self.packed() if f._rank == self.arg
                        else self.outs[0].new_empty(sum(self.counts)))
            self.req = f._comm.Ibcast(self.buf, self.arg, backend=self.backend)
        else:
            send = self.packed()
            self.buf = send.new_empty(f._size * send.numel())
            self.req = f._comm.Iallgather(send, self.buf, backend=self.backend)
        self.ins = []
        self.state = _POSTED
        f._posted.append(self)
        if f.trace is not None:
            f.trace.append((self.kind, self.first, len(self.calls)))

    def fail(self, error: BaseException) -> None:
        """Its collective could not be posted (`error`): every call's request
        raises `error` when it is waited for or tested."""
        self.state, self.error = _FAILED, error
        self.ins, self.outs, self.buf, self.req = [], [], None, None

    def stall(self, error: BaseException) -> None:
        """Posting its collective timed out (`error`, an mcr.TimeoutError: a backend's
        first use, set up collectively, waits for a late process): it stays to post,
        again at the next wait or test of its calls, or flush."""
        self.state, self.error = _STALLED, error
        self.buf, self.req = None, None

    def test(self) -> bool:
        """Whether the posted collective has completed (Waitall and the other
        class methods ask once per turn for all the calls of the bucket)."""
        if self.state == _FAILED:
            raise self.error  # type: ignore[misc]
        if self.state == _STALLED:
            self.fusion._posting([])          # (again, with the buckets stalled before it)
        if self.state == _POSTED:
            f = self.fusion
            if f._st.timed and f._st.open:
                f._tick()
            assert self.req is not None
            if not self.req.Test():
                return False
            self.state = _DONE
        return True

    # the work of every call's request (is_completed, wait): Waitall asks
    # once per turn for all the calls of a bucket (the core's _Poll)

    def is_completed(self) -> bool:
        if self.state == _DONE:
            return True
        if self.state == _FAILED:
            raise self.error  # type: ignore[misc]
        if self.state == _STALLED:
            return self.test()
        if self.state == _OPEN:
            f = self.fusion
            f._wanted(self)           # rank 0 posts it; the others read decisions
            if self.state == _OPEN:
                return False
            if not f._leader:
                # rank 0's cut may have moved the asking call to another
                # bucket (its handle replaced): it asks again next turn
                return False
        return self.test()

    def wait_ready(self) -> bool:
        """Whether wait() needs no polling: the collective is posted and its
        works are waited at once (NCCL's: stream-ordered)."""
        return self.state == _POSTED and self.fusion._waits_at_once(self.req)

    def wait(self) -> None:
        self.finish()

    def describe(self, index: int, comm: str) -> str:
        """Why fused call `index` of this bucket is not complete, for the
        TimeoutError of a wait for it (the core asks; `comm`: the
        communicator's label)."""
        return self.fusion._pending(self, index, comm)

    def finish(self) -> None:
        """Copy the results out, once for the whole bucket."""
        if self.state == _FAILED:
            raise self.error  # type: ignore[misc]
        if self.state == _STALLED:
            self.fusion._posting([])
        if self.buf is None:
            return
        if self.state != _DONE:
            assert self.req is not None
            self.req.Wait()
            self.state = _DONE
        f = self.fusion
        if self.kind == _ALLREDUCE or (self.kind == _BCAST and f._rank != self.arg):
            if not f._unpack(self.buf, self.outs):
                f._torch.split_with_sizes_copy(self.buf, self.counts,
                                               out=[o.view(-1) for o in self.outs])
        elif self.kind == _ALLGATHER:
            size = f._size
            f._torch.split_with_sizes_copy(self.buf.view(size, -1), self.counts, dim=1,
                                           out=[o.view(size, -1) for o in self.outs])
        self.buf = None
        self.outs = []
        self.calls = []
        self.works = []
        if f._driven and not f._st.open:
            f._quiet()


class Fusion:
    """A communicator that fuses small collectives into buckets.

    Collective over `comm` (it duplicates `comm` for its own messages). Used
    in place of `comm`: ``Iallreduce``, ``Ibcast`` and ``Iallgather`` on
    plain contiguous tensors are fused; every other call is `comm`'s, after a
    flush. See :mod:`mcr.fusion` for the rules.

    Parameters
    ----------
    comm : mcr.Comm
        The communicator the fused collectives run on.
    bucket_bytes : int, optional
        Largest bucket, in bytes each rank contributes (default 1 MiB).
        Larger tensors run unfused.
    cycle : float, optional
        Seconds after which rank 0 flushes every open bucket (checked when it
        enters the fusion code); None (default): no clock.
    backend : str, optional
        Backend of the fused collectives (``"mpi"``, ``"gloo"``, ``"nccl"``,
        ``"auto"``); None: `comm`'s default. A call's own ``backend=`` takes
        precedence (its calls get buckets of their own).
    trace : bool, optional
        Record each posted bucket as ``(kind, first call, number of calls)``
        in ``trace`` (for tests and tuning).

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or value (named in the message).
    """

    __slots__ = ("_comm", "_torch", "_tensor", "_in_place", "_request", "_meta", "_quick",
                 "_pack", "_unpack", "_ops", "_dtypes", "_waits_at_once", "_timed_wait",
                 "_rank", "_size", "_leader", "_st", "_cycle", "_since",
                 "_backend", "_ctl", "_sends", "_rbuf", "_rreq", "_queue", "_posted",
                 "_stalled",
                 "_driving", "_quiet_calls", "_thread", "_busy", "_defer", "_cuda", "_driven",
                 "trace")

    def __init__(self, comm: Comm, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 cycle: float | None = None, *, backend: str | None = None,
                 trace: bool = False) -> None:
        import torch
        from mpi4py import MPI

        from . import _core, progress
        from .backends import check_name

        if not isinstance(comm, _core.Comm):
            raise TypeError(f"comm: expected an mcr.Comm, got {type(comm).__name__}")
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int):
            raise TypeError(f"bucket_bytes: expected an int, got {type(bucket_bytes).__name__}")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes: expected at least 1 byte, got {bucket_bytes}")
        if cycle is not None:
            if isinstance(cycle, bool) or not isinstance(cycle, (int, float)):
                raise TypeError(f"cycle: expected seconds (a float) or None, got "
                                f"{type(cycle).__name__}")
            if not (cycle > 0 and math.isfinite(cycle)):
                raise ValueError(f"cycle: expected a positive finite number of seconds, "
                                 f"got {cycle}")
        if backend is not None:
            check_name(backend)
        self._comm = comm
        self._driving: Any = progress       # (imported with MPI: at the first Fusion)
        self._torch: Any = torch              # imported here: import mcr stays light
        self._tensor = torch.Tensor
        self._in_place = MPI.IN_PLACE
        self._request = _core._fused_request
        self._timed_wait = _core._fusion_wait
        self._meta = _core._tensor_key
        self._quick = _core._fuse_quick
        self._pack, self._unpack = _core._pack, _core._unpack
        self._quiet_calls = _core._staged_quiet
        self._waits_at_once = _core._waits_at_once
        self._ops = (MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN)
        # the dtypes the core takes: a call on any other goes unfused, so the core
        # rejects it at the call rather than its bucket at the Wait
        self._dtypes = frozenset(getattr(torch, row[0]) for row in _core.TYPE_TABLE
                                 if hasattr(torch, row[0]))
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._leader = self._rank == 0
        # what the core's fast path (_fuse_quick) reads and updates: the
        # communicator (its timeout bounds the fused calls' waits), the open
        # buckets, the calls so far, the bucket size, the next call a decision
        # ends at, whether it is closed or timed
        self._st = _core._FusionState()
        self._st.comm = comm
        self._st.limit = bucket_bytes
        self._cycle = float(cycle) if cycle is not None else 0.0
        self._st.timed = cycle is not None and self._leader
        self._since = 0.0
        self._backend = backend
        self._st.open = {}                   # key -> its open _Bucket
        self._st.count = 0                   # fused calls so far
        self._st.closed = False
        self._posted: deque[_Bucket] = deque()   # posted, not yet seen complete
        self._stalled: list[_Bucket] = []        # closed, their posting timed out: in order
        # driven by every wait of the process while buckets are open
        # (mcr.stages): the thread that opened the newest bucket, whether the
        # fusion is posting buckets (nothing it calls may drive it then), and
        # whether a bucket was ever on CUDA (the helper thread leaves it alone)
        self._thread = threading.get_ident()
        self._busy = False
        self._defer = False     # driven: a bucket's posting error waits for its calls
        self._cuda = False
        self._driven = False                 # enlisted with mcr.progress
        self.trace: list[tuple[str, int, int]] | None = [] if trace else None
        # decisions: rank 0 sends (first call, end call) pairs; the others
        # queue them until they reach the end call
        if self._size > 1:
            # (a collective on comm, by mpi4py: another Fusion's open buckets
            # go first, as before mcr's own Dup, or the processes would match
            # them with it)
            progress.before_collective(comm)
        self._ctl = comm.to_mpi4py().Dup() if self._size > 1 else None
        self._sends: list[Any] = []
        self._rbuf = array("q", (0, 0))
        self._queue: deque[tuple[int, int]] = deque()
        self._st.next_at = _NEVER
        self._rreq = (self._ctl.Irecv(self._rbuf, 0, _TAG)
                      if self._ctl is not None and not self._leader else None)

    # ------------------------------------------------------------------
    # Fused collectives. The checks are written out in each method: this is
    # the path every small call takes.

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = None, *,
                   backend: str | None = None) -> Request:
        """Start an allreduce, fused when eligible; return a ``Request``.
        Arguments as ``mcr.Comm.Iallreduce`` (`op` None: ``SUM``)."""
        if op is None:
            op = self._ops[0]
        quick: Request | None = self._quick(self._st, sendbuf, recvbuf, op, backend)
        if quick is not None:
            return quick
        meta = self._meta(recvbuf)
        if meta is not None and not self._st.closed:
            # a contiguous host tensor the core reads directly (the common
            # case, the call fitting in the open bucket with nothing else
            # due, is the core's _fuse_quick): one call for (bytes, element
            # type), where torch's API takes five
            inp = recvbuf if sendbuf is self._in_place else \
                sendbuf if self._meta(sendbuf) == meta else None
            if inp is not None:
                key: tuple[Any, ...] = (id(op), meta[1], -1, backend)    # as below
                req = self._add(key, _ALLREDUCE, op, backend, inp, recvbuf, recvbuf.numel())
                if req is not None:
                    return req
            return self._unfused("Iallreduce", sendbuf, recvbuf, op, backend=backend)
        T = self._tensor
        if type(recvbuf) is T and recvbuf.is_contiguous() and not self._st.closed:
            n = recvbuf.numel()
            dtype = recvbuf.dtype
            device = recvbuf.get_device()
            out = recvbuf if recvbuf.dim() == 1 else recvbuf.view(-1)
            if sendbuf is self._in_place:
                inp = out
            elif (type(sendbuf) is T and sendbuf.dtype is dtype and sendbuf.is_contiguous()
                  and sendbuf.get_device() == device and sendbuf.numel() == n):
                inp = sendbuf if sendbuf.dim() == 1 else sendbuf.reshape(-1)
            else:
                inp = None
            if inp is not None:
                key = (id(op), dtype, device, backend)      # Ops are not hashable: their id
                req = self._add(key, _ALLREDUCE, op, backend, inp, out, n)
                if req is not None:
                    return req
        return self._unfused("Iallreduce", sendbuf, recvbuf, op, backend=backend)

    def Ibcast(self, buf: Any, root: int = 0, *, backend: str | None = None) -> Request:
        """Start a broadcast, fused when eligible; return a ``Request``.
        Arguments as ``mcr.Comm.Ibcast``."""
        if (type(buf) is self._tensor and buf.is_contiguous() and not self._st.closed
                and type(root) is int and 0 <= root < self._size):
            flat = buf if buf.dim() == 1 else buf.view(-1)
            req = self._add((_BCAST, root, buf.dtype, buf.get_device(), backend), _BCAST,
                            root, backend, flat, flat, buf.numel())
            if req is not None:
                return req
        return self._unfused("Ibcast", buf, root, backend=backend)

    def Iallgather(self, sendbuf: Any, recvbuf: Any, *, backend: str | None = None) -> Request:
        """Start an allgather, fused when eligible; return a ``Request``.
        Arguments as ``mcr.Comm.Iallgather``."""
        T = self._tensor
        if type(recvbuf) is T and recvbuf.is_contiguous() and not self._st.closed:
            size, rank = self._size, self._rank
            total = recvbuf.numel()
            n = total // size
            dtype = recvbuf.dtype
            device = recvbuf.get_device()
            out = recvbuf.view(-1)
            if sendbuf is self._in_place:
                inp = out[rank * n:(rank + 1) * n] if n * size == total else None
            elif (type(sendbuf) is T and sendbuf.dtype == dtype and sendbuf.is_contiguous()
                  and sendbuf.get_device() == device and sendbuf.numel() * size == total):
                inp = sendbuf.reshape(-1)
            else:
                inp = None
            if inp is not None:
                req = self._add((_ALLGATHER, dtype, device, backend), _ALLGATHER, None,
                                backend, inp, out, n)
                if req is not None:
                    return req
        return self._unfused("Iallgather", sendbuf, recvbuf, backend=backend)

    def _add(self, key: tuple[Any, ...], kind: str, arg: Any, backend: str | None,
             inp: Any, out: Any, n: int) -> Request | None:
        """Add a call to the open bucket of `key`; None if it is not fused (too
        large, or an op/dtype/device that is not). Rank 0 closes the bucket
        once it is full."""
        st = self._st
        b = st.open.get(key)
        if b is None:
            b = self._bucket(key, kind, arg, backend, out)
            if b is None:
                return None
        nbytes = n * b.itemsize
        limit = st.limit
        if nbytes > limit:
            if not b.calls:
                del st.open[key]
            return None
        leader = self._leader
        if leader and b.nbytes + nbytes > limit and b.calls:
            self._close(b)
            b = st.open.get(key) or self._bucket(key, kind, arg, backend, out)
            assert b is not None
        index = st.count
        st.count = index + 1
        req: Request = self._request(st, b.add(index, inp, out, n), index)
        if self._posted and not index & 31:
            self._progress()
        if leader:
            if b.nbytes >= limit:
                self._close(b)
            if st.timed:
                self._tick()
        elif (b.nbytes >= limit and not index & 7) or index >= st.next_at:
            # this bucket is due: look for rank 0's decision (every 8th call:
            # a look costs more than a call)
            self._advance()
        return req

    def _progress(self) -> None:
        """Let posted buckets advance while calls are added (MPI moves a
        non-blocking collective only inside MPI calls): test the oldest."""
        posted = self._posted
        quiet = self._quiet_calls(True)       # (its own tests: see _posting)
        try:
            while posted and (posted[0].state == _DONE
                              or posted[0].req.Test()):  # type: ignore[union-attr]
                posted.popleft().state = _DONE
        finally:
            self._quiet_calls(quiet)

    def _bucket(self, key: tuple[Any, ...], kind: str, arg: Any, backend: str | None,
                tensor: Any) -> _Bucket | None:
        """A new open bucket for `key`, or None if such calls are not fused."""
        device = tensor.device.type
        if device not in ("cpu", "cuda") or tensor.dtype not in self._dtypes:
            return None
        if kind == _ALLREDUCE:
            dtype = tensor.dtype
            known = [k for k, op in enumerate(self._ops) if arg is op]
            if not known or dtype == self._torch.bool or (dtype.is_complex and known[0] >= 2):
                return None
        if not self._st.open:
            if self._st.timed:
                self._since = time.perf_counter()
            if not self._driven:
                self._driven = True
                self._driving.enlist(self)
        self._thread = threading.get_ident()
        if device == "cuda":
            self._cuda = True
        b = _Bucket(self, key, kind, arg, backend if backend is not None else self._backend,
                    tensor.element_size())
        self._st.open[key] = b
        return b

    # ------------------------------------------------------------------
    # Closing buckets: rank 0 decides, the others follow

    def _close(self, b: _Bucket) -> None:
        """Rank 0: post bucket `b` and tell the others where it ends."""
        del self._st.open[b.key]
        # tell first: posting may block until the others post too (a backend's
        # first use makes its communicator, collectively)
        self._send(b.first, self._st.count)
        self._posting([b])

    def _flush_all(self) -> None:
        """Rank 0: post every open bucket (in the order of their first calls)."""
        if not self._st.open:
            return
        buckets = sorted(self._st.open.values(), key=_first)
        self._st.open.clear()
        self._send(_EVERY, self._st.count)
        self._posting(buckets)

    def _posting(self, buckets: list[_Bucket]) -> None:
        """Post `buckets`, in order, after those whose posting timed out before
        (stalled: every process posts the buckets in one order), as this
        fusion's own work: what the posting calls drive (mcr.stages) leaves
        this fusion alone (busy), and the calls of this thread drive nothing
        meanwhile (quiet: a bucket costs no look at every driver). A timeout
        leaves the buckets from there stalled, another error fails them."""
        if self._stalled:
            buckets, self._stalled = self._stalled + buckets, []
        busy, self._busy = self._busy, True
        quiet = self._quiet_calls(True)
        try:
            for i, b in enumerate(buckets):
                try:
                    b.post()
                except BaseException as exc:
                    if isinstance(exc, _Timeout):
                        self._stalled = buckets[i:]
                        for stalled in self._stalled:
                            stalled.stall(exc)
                    else:
                        for failed in buckets[i:]:    # (they stay unposted: calls fail)
                            failed.fail(exc)
                    if not self._defer:
                        raise
                    break
        finally:
            self._quiet_calls(quiet)
            self._busy = busy

    def _send(self, first: int, end: int) -> None:
        if self._ctl is None:
            return
        msg = array("q", (first, end))
        for r in range(1, self._size):
            self._sends.append(self._ctl.Isend(msg, r, _TAG))
        if len(self._sends) > 64:
            self._sends = [s for s in self._sends if not s.Test()]

    def _tick(self) -> None:
        """Rank 0: flush everything once the cycle time has passed."""
        if self._st.open and time.perf_counter() - self._since >= self._cycle:
            self._flush_all()

    def _wanted(self, b: _Bucket) -> None:
        """A request of open bucket `b` is tested: rank 0 posts the bucket;
        the others take the decisions that have come."""
        if self._leader:
            self._close(b)
            if self._st.timed:
                self._tick()
        else:
            self._advance()

    def _advance(self) -> None:
        """Not rank 0: read the decisions that have come; apply those whose
        end call this rank has reached, in order."""
        assert self._rreq is not None and self._ctl is not None
        while self._rreq.Test():
            self._queue.append((self._rbuf[0], self._rbuf[1]))
            self._rreq = self._ctl.Irecv(self._rbuf, 0, _TAG)
        queue = self._queue
        while queue and queue[0][1] <= self._st.count:
            first, end = queue.popleft()
            if first == _EVERY:
                buckets = sorted((b for b in self._st.open.values() if b.first < end), key=_first)
            else:
                buckets = [b for b in self._st.open.values() if b.first == first]
                if not buckets:
                    raise RuntimeError(
                        f"fusion: rank 0 closed a bucket starting at call {first}, which "
                        f"starts no open bucket on rank {self._rank}; the ranks made "
                        "different sequences of fused calls")
            for b in buckets:
                rest = b.split(end)
                if rest is None:
                    del self._st.open[b.key]
                else:
                    self._st.open[b.key] = rest
            self._posting(buckets)
        # a decision read early applies when this rank reaches its end call
        self._st.next_at = queue[0][1] - 1 if queue else _NEVER

    # ------------------------------------------------------------------
    # Driven by every wait of the process while a bucket is open (mcr.stages)

    def _mine(self, helper: bool) -> bool:
        """Whether this thread may work on the fusion now: the thread that
        uses it, or the helper while that thread is blocked in MPI (any of
        the threads it drives for; not on CUDA tensors: packing runs on the
        calling thread's stream); and not from inside the fusion's own code.
        With no bucket open, it is no longer driven (until the next one
        opens; not at every bucket of a loop: enlisting costs a lock)."""
        if self._busy:
            return False
        if helper:
            if self._cuda or not self._driving.is_blocked(self._thread):
                return False
        elif threading.get_ident() != self._thread:
            return False
        if not self._st.open or self._st.closed:
            if self._driven:
                self._quiet()
            return False
        return True

    def _quiet(self) -> None:
        """No bucket is open: no longer driven."""
        self._driven = False
        self._driving.dismiss(self)

    def pump(self, helper: bool) -> None:
        """A test or wait of the process, or the helper meanwhile: rank 0
        posts every open bucket (the others may be waiting for them); the
        others post those rank 0 has decided. A bucket that cannot be posted
        then fails its own calls' waits and tests, not the call driving it."""
        if self._mine(helper):
            defer, self._defer = self._defer, True
            try:
                if self._leader:
                    self._flush_all()
                else:
                    self._advance()
            finally:
                self._defer = defer

    def blocking(self) -> None:
        """The calling thread is about to block in MPI: as ``pump``."""
        self.pump(False)

    def collective(self, comm: Any) -> None:
        """The calling thread is about to make a collective call on `comm`:
        if it is this fusion's communicator, that call comes after every
        fused call made so far, so flush (every rank makes the same call)."""
        if self._mine(False) and comm == self._comm:
            defer, self._defer = self._defer, True    # (as in pump)
            try:
                self.flush()
            finally:
                self._defer = defer

    def flush(self) -> None:
        """Post every open bucket.

        Collective over the communicator in program order, like a fused call:
        on ranks other than 0, it waits until rank 0's decisions cover every
        call made so far (rank 0 flushes at the same point).

        Raises
        ------
        mcr.TimeoutError
            On a rank other than 0, when rank 0's decisions have not come
            within the communicator's timeout (``comm.timeout``). The calls
            not yet decided stay in their open buckets: a later ``flush()``
            or wait goes on from there.
        """
        if self._st.closed:
            return
        if self._stalled:
            self._posting([])
        if self._leader:
            self._flush_all()
            return
        end = self._st.count
        self._advance()
        while any(b.first < end for b in self._st.open.values()):
            assert self._rreq is not None
            # the staged operations are driven meanwhile, not this fusion
            # (its request is being waited for)
            busy, self._busy = self._busy, True
            try:
                if self._comm.timeout is None:
                    with self._driving.window():    # blocked in MPI: by the helper
                        self._rreq.Wait()
                else:
                    # polled (MPI's wait cannot be interrupted), driving them itself
                    self._timed_wait(self._comm, self._rreq,
                                     lambda comm: self._undecided(end, comm))
            finally:
                self._busy = busy
            self._advance()

    def close(self) -> None:
        """Flush, and release the private communicator; collective. Afterwards
        every call is forwarded unfused. Closing twice is harmless.

        Raises
        ------
        mcr.TimeoutError
            At the communicator's timeout, as ``flush()``; the fusion stays
            open, and ``close()`` can be called again.
        """
        if self._st.closed:
            return
        self.flush()
        self._st.closed = True
        if self._driven:
            self._quiet()
        if self._ctl is None:
            return
        from mpi4py import MPI
        if self._leader:
            if self._comm.timeout is None:
                MPI.Request.Waitall(self._sends)
            else:
                for send in self._sends:
                    self._timed_wait(self._comm, send, self._undelivered)
            self._sends = []
        else:
            assert self._rreq is not None
            self._rreq.Cancel()
            self._rreq.Wait()
        self._ctl.Free()

    def __enter__(self) -> Fusion:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # after an error (perhaps on this rank only) a collective flush could
        # wait for ranks that never come: leave the buckets as they are
        if exc_type is None:
            self.close()

    # ------------------------------------------------------------------
    # Everything else is the communicator's

    @property
    def comm(self) -> Comm:
        """The communicator the fused collectives run on."""
        return self._comm

    @property
    def bucket_bytes(self) -> int:
        """Largest bucket, in bytes each rank contributes."""
        return self._st.limit

    def _unfused(self, name: str, *args: Any, backend: str | None) -> Request:
        """Flush, then start `name` on the communicator itself (on this
        fusion's backend, unless the call names one)."""
        self.flush()
        req: Request = getattr(self._comm, name)(
            *args, backend=backend if backend is not None else self._backend)
        return req

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._comm, name)
        if name in _NO_FLUSH or not callable(attr):
            return attr

        def flushed(*args: Any, **kwargs: Any) -> Any:
            self.flush()
            return attr(*args, **kwargs)

        flushed.__name__ = name
        flushed.__doc__ = attr.__doc__
        return flushed

    def __repr__(self) -> str:
        state = "closed" if self._st.closed else f"{len(self._st.open)} open buckets"
        return f"<mcr.Fusion of {self._comm!r}, bucket_bytes={self._st.limit}, {state}>"

    # ------------------------------------------------------------------
    # What a timed-out wait waits for (mcr.TimeoutError's message; `comm` is
    # the communicator's label there, "world", ...)

    def _pending(self, b: _Bucket, index: int, comm: str) -> str:
        """Fused call `index`, of bucket `b`, not complete: "fused Iallreduce
        float32[4] SUM (call 3 of an mcr.Fusion) on world [mpi]: ..." """
        where = bisect_left(b.calls, index)
        count = b.counts[where] if where < len(b.calls) and b.calls[where] == index else "?"
        dtype = str(b.outs[0].dtype).replace("torch.", "") if b.outs else "?"
        if b.kind == _ALLREDUCE:
            names = [n for op, n in zip(self._ops, ("SUM", "PROD", "MAX", "MIN")) if op is b.arg]
            call = f"Iallreduce {dtype}[{count}] {names[0] if names else b.arg}"
        elif b.kind == _BCAST:
            call = f"Ibcast {dtype}[{count}] root={b.arg}"
        else:
            call = f"Iallgather {dtype}[{count}]"
        calls = f"calls {b.first}-{b.calls[-1]}" if b.calls else "its calls"
        if b.state == _STALLED:
            why = f"its bucket ({calls}) is not posted yet: {b.error}"
        elif b.state == _OPEN:
            why = (f"its bucket ({calls}) is not posted" if self._leader else
                   f"its bucket ({calls}) is not posted: rank 0 has not decided where it "
                   "ends (it does when it waits for or tests a request, or flushes)")
        else:
            why = f"the collective of its bucket ({calls}) has not completed"
        backend = b.backend or self._comm.backend
        return f"fused {call} (call {index} of an mcr.Fusion) on {comm} [{backend}]: {why}"

    def _undecided(self, end: int, comm: str) -> str:
        """A flush waiting for rank 0's decisions on the calls before `end`."""
        first = min((b.first for b in self._st.open.values()), default=end)
        return (f"rank 0 of {comm} to flush an mcr.Fusion: rank 0 decides where the "
                f"buckets of fused calls end, and has not decided on calls {first}-{end - 1} "
                "of this process (a flush waits until it has)")

    def _undelivered(self, comm: str) -> str:
        """Rank 0's close waiting for its decisions to be received."""
        return (f"every process of {comm} to receive rank 0's decisions on the buckets of "
                "an mcr.Fusion (at its close)")


def _first(b: _Bucket) -> int:
    return b.first
