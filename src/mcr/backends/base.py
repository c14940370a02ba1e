"""The interface every backend implements: a ``Backend`` (what it serves) and
its ``Subcomm`` (one method per operation of a Comm).

A backend's sub-communicator defines three primitives on byte tensors
(``tensor_alltoall``, ``tensor_send``, ``tensor_recv``) and gets every
operation: ``Subcomm``'s default bodies compose them (``compose``). It
overrides the operations it runs itself, which are its ``native`` ones.
"""

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from mpi4py import MPI

from mcr import _core, progress

from . import compose
from .message import Side

__all__ = ["Backend", "OPERATIONS", "Subcomm", "Work"]


class Work(Protocol):
    """A backend's handle of posted work (torch's ``Work`` is one)."""

    def is_completed(self) -> bool: ...

    def wait(self) -> object: ...


class Subcomm:
    """A Comm's sub-communicator on one backend, over the same processes.

    The core parses and checks the arguments of an operation exactly as for
    MPI, then calls the method named after the operation in lower case (the
    I- form of one, ``sendrecv`` for ``Isendrecv``) with the parsed message
    ``msg`` (``msg.side(0)``, ``msg.side(1)``: a ``MessageSide`` each, read
    through ``self.side``) and the keywords of the operation. Every method
    returns a ``Request`` (``self.request``) that completes the operation, and
    must not block on another process (the blocking form waits on it).

    Primitives a backend must define (called once ``connect`` has run;
    collective ones in the same order on every rank; each returns a ``Work``,
    on uint8 tensors on the buffers' device, on the host for Barrier):

    - ``tensor_alltoall(output, input, output_split, input_split)``;
    - ``tensor_send(tensor, dest, tag)`` and ``tensor_recv(tensor, source, tag)``.

    Hooks it may define: ``connect`` (collective set-up, at the first
    operation) and ``disconnect`` (at ``Comm.Free``).
    """

    native: frozenset[str] = frozenset()    # set for each subclass, from what it defines

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.native = frozenset(
            comm_name for method, comm_names in OPERATIONS.items()
            if getattr(cls, method) is not getattr(Subcomm, method)
            for comm_name in comm_names)

    def __init__(self, backend: "Backend", comm: Any) -> None:
        self.backend = backend
        self.name = backend.name
        self.comm = comm
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self._hcomm: Any = None
        self._meeting: Any = None       # the set-up's barrier, while it waits
        self.leaving: Any = None        # Free's barrier (compose.drain), while it waits
        # point-to-point matching (compose.py): per-destination sequence
        # numbers, probed headers, sends in flight, payloads to this rank,
        # receives posted (weakly: a freed or dropped one is kept by the
        # core until complete), payload buffers to reuse
        self.seq = [0] * self.size
        self.stash: list[Any] = []
        self.inflight: list[Any] = []
        self.loopback: dict[int, torch.Tensor] = {}
        self.receives: weakref.WeakSet[Any] = weakref.WeakSet()
        self.spare: list[torch.Tensor] = []
        # held while that state changes, and by the set-up: the threads of a
        # process may call on the communicator at once (compose.py)
        self.lock = threading.RLock()

    # -- set-up ------------------------------------------------------------------------

    def connect(self) -> None:
        """Set up the backend's own communicator (collective over ``comm``); called
        by the first operation that communicates, after its arguments are
        checked, so bad input is reported before any process blocks here."""

    def disconnect(self) -> None:
        """Release what ``connect`` made (collective; in ``Comm.Free``)."""

    def start(self) -> None:
        """Connect, once: the backend's communicator and the MPI duplicate that
        carries point-to-point headers.

        Collective: the processes first meet in a barrier, which the
        communicator's timeout bounds (a process that never makes a call on
        this backend, as with a point-to-point exchange between two of four
        processes, is a TimeoutError here, not a hang in the set-up)."""
        if self._hcomm is not None:
            return
        with self.lock:         # (another thread's first call waits for the same set-up)
            if self._hcomm is None:
                self._start()

    def _start(self) -> None:
        reason = self.backend.unavailable()
        if reason is not None:
            raise RuntimeError(f"backend {self.name!r}: {reason}")
        if self._meeting is None:
            self._meeting = self.comm.to_mpi4py().Ibarrier()
        _core._meet(self.comm, self._meeting,
                    f"to make its first call on backend {self.name!r} (that call "
                    "sets the backend up, collectively over the communicator)")
        self._meeting = None
        with progress.window():     # (blocking: the staged operations go on meanwhile)
            self.connect()
            self._hcomm = self.comm.to_mpi4py().Dup()

    @property
    def hcomm(self) -> Any:
        """The private MPI communicator of point-to-point headers."""
        if self._hcomm is None:
            self.start()
        return self._hcomm

    def free(self) -> None:
        """Deliver outstanding sends, then release the backend (collective)."""
        if self._hcomm is not None:
            compose.drain(self)
            self.spare.clear()
            self.disconnect()
            self._hcomm.Free()
            self._hcomm = None

    # -- plumbing ----------------------------------------------------------------------

    def side(self, msg: Any, which: int, arg: str) -> Side:
        """Side ``which`` of ``msg`` as tensors, checked for this backend
        (``arg``: the argument named in errors)."""
        x = Side(msg.side(which))
        if x.kind == "buf":
            err = self.backend.device_error(arg, x.device)
            if err is not None:
                raise err
            if x.tname is None:
                raise TypeError(f"{arg}: backend {self.name!r} moves the element types of "
                                "torch tensors only, not MPI datatypes that are none (derived "
                                "ones, MPI.BYTE, MPI.AINT, pairs such as MPI.FLOAT_INT); "
                                "use backend='mpi'")
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
                compose.op_name(arg, self.name)

    def request(self, works: Sequence[Work | None], steps: Sequence[Callable[[], object]] = (),
                keep: object = None, status: Callable[[], tuple[Any, ...]] | None = None) -> Any:
        """The Request completed by ``works``, running ``steps`` after them;
        ``keep``: what must stay alive until then; ``status``: for a receive,
        a callable returning its ``RecvStatus``."""
        if status is not None:
            status = _plain(status)
        return _core._work_request(self.name, [w for w in works if w is not None],
                                   list(steps), keep, status)

    def native_reduction(self, op: str, tname: str | None) -> bool:
        """Whether the backend reduces ``tname`` elements with ``op`` itself."""
        return tname in self.backend.reductions.get(op, ())

    def missing(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"backend {self.name!r} does not define {what} "
                                   f"({type(self).__module__}.{type(self).__qualname__})")

    # -- Primitives (what a backend must define) ---------------------------------------

    def tensor_alltoall(self, output: torch.Tensor, input: torch.Tensor,
                        output_split: list[int], input_split: list[int]) -> Work:
        """Post an all-to-all of bytes (collective): ``input_split[i]`` bytes go
        to rank ``i``, taken one block after another from the start of
        ``input``; ``output_split[i]`` bytes come from rank ``i``, stored one
        block after another in ``output``. Both are contiguous uint8 tensors;
        blocks may be empty."""
        raise self.missing("tensor_alltoall")

    def tensor_send(self, tensor: torch.Tensor, dest: int, tag: int) -> Work:
        """Post a send of the uint8 ``tensor`` (a private copy, kept alive by
        the caller until done) to rank ``dest``, never this rank; ``tag`` is
        below 2**30, and one (source, tag) pair is received once at a time."""
        raise self.missing("tensor_send")

    def tensor_recv(self, tensor: torch.Tensor, source: int, tag: int) -> Work:
        """Post the receive into the uint8 ``tensor`` of exactly its size from
        rank ``source`` (never this rank, never ANY_SOURCE) with ``tag``."""
        raise self.missing("tensor_recv")

    # -- Point-to-point ----------------------------------------------------------------

    def send(self, msg: Any, dest: int, tag: int) -> Any:
        """Send side 0 of ``msg`` to ``dest`` with ``tag`` (Send, Isend, Send_init).
        Composed: buffered, complete once the payload is copied."""
        return compose.send(self, msg, dest, tag)

    def bsend(self, msg: Any, dest: int, tag: int) -> Any:
        """A buffered send. Composed: the composed send is buffered already."""
        return compose.send(self, msg, dest, tag)

    def rsend(self, msg: Any, dest: int, tag: int) -> Any:
        """A ready send. Composed: a send whose receive is known to be posted."""
        return compose.send(self, msg, dest, tag)

    def ssend(self, msg: Any, dest: int, tag: int) -> Any:
        """A synchronous send: complete once the receiver has matched it."""
        return compose.send(self, msg, dest, tag, synchronous=True)

    def recv(self, msg: Any, source: int, tag: int) -> Any:
        """Receive into side 1 of ``msg`` from ``source`` (or ANY_SOURCE) with
        ``tag`` (or ANY_TAG); the request's status is the message's."""
        return compose.recv(self, msg, source, tag)

    def sendrecv(self, msg: Any, dest: int, sendtag: int, source: int, tag: int) -> Any:
        """Send side 0 to ``dest`` and receive side 1 from ``source`` (Sendrecv)."""
        return compose.sendrecv(self, msg, dest, sendtag, source, tag)

    def sendrecv_replace(self, msg: Any, dest: int, sendtag: int, source: int,
                         tag: int) -> Any:
        """Send side 1 of ``msg`` to ``dest``, then receive into it from ``source``."""
        return compose.sendrecv_replace(self, msg, dest, sendtag, source, tag)

    def probe(self, source: int, tag: int, status: Any, blocking: bool) -> bool:
        """Whether a message from ``source`` with ``tag`` has arrived (Iprobe), or
        wait for one (``blocking``: Probe); fill ``status`` (None: nothing)."""
        return compose.probe(self, source, tag, status, blocking)

    # -- Collectives -------------------------------------------------------------------

    def barrier(self, msg: Any) -> Any:
        """Complete once every rank has entered it (``msg`` has no buffers)."""
        return compose.barrier(self, msg)

    def bcast(self, msg: Any, root: int) -> Any:
        """Copy side 1 of ``msg`` at ``root`` to side 1 on every rank."""
        return compose.bcast(self, msg, root)

    def gather(self, msg: Any, root: int) -> Any:
        """Side 0 of every rank into block ``i`` of side 1 at ``root``."""
        return compose.gather(self, msg, root)

    def gatherv(self, msg: Any, root: int) -> Any:
        """Gather at ``root``, side 1 in the vector form (counts, displacements)."""
        return compose.gather(self, msg, root)

    def scatter(self, msg: Any, root: int) -> Any:
        """Block ``i`` of side 0 at ``root`` into side 1 of rank ``i``."""
        return compose.scatter(self, msg, root)

    def scatterv(self, msg: Any, root: int) -> Any:
        """Scatter from ``root``, side 0 in the vector form."""
        return compose.scatter(self, msg, root)

    def allgather(self, msg: Any) -> Any:
        """Side 0 of every rank into block ``i`` of side 1 on every rank."""
        return compose.allgather(self, msg)

    def allgatherv(self, msg: Any) -> Any:
        """Allgather, side 1 in the vector form."""
        return compose.allgather(self, msg)

    def alltoall(self, msg: Any) -> Any:
        """Block ``j`` of side 0 on rank ``i`` into block ``i`` of side 1 on ``j``."""
        return compose.alltoall(self, msg)

    def alltoallv(self, msg: Any) -> Any:
        """Alltoall, both sides in the vector form."""
        return compose.alltoall(self, msg)

    # -- Reductions --------------------------------------------------------------------

    def allreduce(self, msg: Any, op: Any) -> Any:
        """The ``op`` reduction of side 0 over all ranks into side 1 everywhere."""
        return compose.reduce_all(self, msg, op, "all")

    def scan(self, msg: Any, op: Any) -> Any:
        """The reduction over ranks 0..rank into side 1."""
        return compose.reduce_all(self, msg, op, "scan")

    def exscan(self, msg: Any, op: Any) -> Any:
        """The reduction over ranks 0..rank-1 into side 1 (rank 0: untouched)."""
        return compose.reduce_all(self, msg, op, "exscan")

    def reduce(self, msg: Any, op: Any, root: int) -> Any:
        """The reduction of side 0 over all ranks into side 1 at ``root``."""
        return compose.reduce(self, msg, op, root)

    def reduce_scatter(self, msg: Any, op: Any) -> Any:
        """Block ``rank`` of the reduction (side 1's counts) into side 1."""
        return compose.reduce_scatter(self, msg, op, block=False)

    def reduce_scatter_block(self, msg: Any, op: Any) -> Any:
        """Reduce_scatter with side 1's count on every rank."""
        return compose.reduce_scatter(self, msg, op, block=True)


def _plain(status: Callable[[], tuple[Any, ...]]) -> Callable[[], tuple[Any, ...]]:
    # the core takes the status as an exact tuple (a Cython ``tuple`` argument
    # refuses subclasses, NamedTuples included)
    return lambda: tuple(status())


# Subcomm method -> the Comm operations it runs (one source: the methods above).
OPERATIONS: dict[str, tuple[str, ...]] = {
    name: (name[0].upper() + name[1:],) + (("Iprobe",) if name == "probe" else ())
    for name in ("send", "bsend", "rsend", "ssend", "recv", "sendrecv", "sendrecv_replace",
                 "probe", "barrier", "bcast", "gather", "gatherv", "scatter", "scatterv",
                 "allgather", "allgatherv", "alltoall", "alltoallv", "allreduce", "scan",
                 "exscan", "reduce", "reduce_scatter", "reduce_scatter_block")}


class Backend:
    """A communication backend, registered under its name.

    Attributes
    ----------
    name : str
        The name users pass as ``backend=``.
    devices : frozenset of str
        Where the buffers it serves live: ``"cpu"`` (host memory), ``"cuda"``.
    subcomm : type
        Its ``Subcomm`` subclass; ``create`` makes one per Comm.
    reductions : dict
        Reduction op name (``"SUM"`` ...) -> element type names the backend
        reduces itself; other op/type pairs are reduced by mcr (exactly, in
        rank order) after gathering the operands.
    p2p_pollable : bool
        Whether ``is_completed()`` of its ``tensor_send``/``tensor_recv`` works
        turns true on its own (Gloo's only does inside ``wait()``).
    eager_limit : int
        Point-to-point messages in host memory of at most this many bytes
        travel inside their header, over MPI (eager); larger ones, and device
        memory, over the backend's ``tensor_send``. 0: every payload on the
        backend.
    """

    name: str = ""
    devices: frozenset[str] = frozenset()
    subcomm: type[Subcomm] = Subcomm
    reductions: dict[str, frozenset[str]] = {}
    p2p_pollable: bool = True
    eager_limit: int = 65536

    @property
    def native(self) -> frozenset[str]:
        """The Comm operations its sub-communicator runs itself (the methods its
        ``subcomm`` class defines); every other one is composed."""
        return self.subcomm.native

    def unavailable(self) -> str | None:
        """None when the backend can run here, else the reason it cannot."""
        return None

    def create(self, comm: Any) -> Subcomm:
        """The sub-communicator of ``comm`` on this backend. Its collective
        set-up waits for its first operation (``Subcomm.connect``)."""
        return self.subcomm(self, comm)

    def device_error(self, arg: str, device: int) -> ValueError | None:
        """The error for a buffer this backend cannot serve, or None."""
        where = "cuda" if device >= 0 else "cpu"
        if where in self.devices:
            return None
        place = f"CUDA device {device}" if device >= 0 else "host memory"
        served = " and ".join("CUDA" if d == "cuda" else "host (CPU)" for d in
                              sorted(self.devices))
        return ValueError(f"{arg}: backend {self.name!r} cannot serve a buffer in {place}; "
                          f"it serves {served} buffers (use backend='mpi', which serves both)")
