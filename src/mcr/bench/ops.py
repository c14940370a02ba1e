"""The collectives the benchmarks time: one table, with their buffers and checks.

``OPERATIONS`` maps a collective's benchmark name (``allreduce``, ``gatherv``,
...) to an :class:`OpSpec`; ``P2P_OPERATIONS`` maps ``latency`` to
:class:`PingPong`; ``NAMES`` lists both, in table order.
``spec.setup(comm, count, dtype, make)`` allocates and fills the buffers of
one message size and returns a :class:`Case`, which gives the
call of one iteration in each form (blocking, non-blocking, persistent) and
checks the result against values computed independently with torch from
every rank's known input. The same code drives mcr (``mcr.Comm``) and mpi4py
(``mpi4py.MPI.Intracomm``) on torch tensors (CPU or CUDA) or numpy arrays,
which is what makes the comparisons fair.

Message sizes follow the OSU Micro-Benchmarks. ``count`` is the number of
elements per process, and with ``P`` processes and root 0:

* ``bcast``, ``reduce``, ``allreduce``, ``scan``, ``exscan``: every rank
  sends ``count`` elements (and receives ``count``);
* ``gather(v)``, ``allgather(v)``: every rank sends ``count``, the receivers
  get ``P * count``; ``scatter(v)``: the root sends ``P * count``, every rank
  receives ``count``; ``alltoall(v)``: ``count`` to and from every rank
  (buffers of ``P * count``). The v-variants use the same counts for every
  rank and displacements ``i * count``, as OSU does;
* ``reduce_scatter``: the reduced vector has ``count`` elements, split as OSU
  splits it (``count // P`` each, the first ``count % P`` ranks one more);
  ``reduce_scatter_block``: blocks of ``max(1, count // P)`` elements, so
  vectors of ``P`` times that;
* ``barrier``: no data.

Reductions use ``SUM`` (``LXOR`` for bool). Inputs are small positive
integers that depend on the rank and the index, so every sum is exact: in
bfloat16 up to 64 ranks, in float16 up to 512; 8-bit integer sums that
overflow wrap around in MPI and in the expected values alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy
import torch

if TYPE_CHECKING:      # imported where used: a driver that only reads the table stays out of MPI
    from mpi4py import MPI

__all__ = ["OPERATIONS", "OpSpec", "Case", "Make", "FORMS", "buffer_maker", "numpy_dtype",
           "rank_values", "reduction_op", "reduce_all", "fill", "contents", "mismatch",
           "PingPong", "P2P_OPERATIONS", "NAMES"]

# make(shape_or_n, dtype) -> a zero-filled buffer (torch CPU/CUDA tensor or numpy array)
Make = Callable[[Any, torch.dtype], Any]

FORMS = ("blocking", "nonblocking", "persistent")


# -- Buffers ----------------------------------------------------------------------

def buffer_maker(kind: str) -> Make:
    """A ``make(shape_or_n, dtype)`` for buffers of one kind.

    Parameters
    ----------
    kind : str
        ``"torch"`` (CPU tensors), ``"torch-cuda"`` (tensors on the current
        CUDA device) or ``"numpy"`` (numpy arrays).

    Raises
    ------
    ValueError
        For another kind. The returned function raises ``ValueError`` for a
        dtype numpy has no type for (bfloat16) when ``kind`` is ``"numpy"``.
    """
    if kind == "torch":
        return lambda shape, dtype: torch.zeros(shape, dtype=dtype)
    if kind == "torch-cuda":
        return lambda shape, dtype: torch.zeros(shape, dtype=dtype, device="cuda")
    if kind == "numpy":
        def make_numpy(shape: Any, dtype: torch.dtype) -> Any:
            return numpy.zeros(shape, dtype=numpy_dtype(dtype))
        return make_numpy
    raise ValueError(f"buffer: expected 'torch', 'torch-cuda' or 'numpy', got {kind!r}")


def numpy_dtype(dtype: torch.dtype) -> Any:
    """The numpy dtype of torch ``dtype``; ValueError if numpy has none."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        raise ValueError(f"numpy has no element type for torch.{str(dtype)[6:]}") from None


def fill(buf: Any, values: torch.Tensor) -> None:
    """Copy ``values`` (a CPU tensor) into ``buf`` (a tensor on any device or an array)."""
    if isinstance(buf, torch.Tensor):
        buf.copy_(values)
    else:
        numpy.copyto(buf, values.numpy())


def contents(buf: Any) -> torch.Tensor:
    """What ``buf`` holds, as a flat CPU tensor."""
    if isinstance(buf, torch.Tensor):
        return buf.detach().cpu().reshape(-1)
    return torch.from_numpy(numpy.array(buf)).reshape(-1)


def mismatch(buf: Any, expected: torch.Tensor, name: str) -> str | None:
    """None if ``buf`` holds ``expected``, else the first difference, in words."""
    got = contents(buf)
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return (f"{name} holds {got.numel()} {str(got.dtype)[6:]} elements, "
                f"expected {expected.numel()} {str(expected.dtype)[6:]}")
    if torch.equal(got, expected):
        return None
    bad = int(torch.nonzero(got != expected)[0, 0])
    return f"{name}[{bad}] is {got[bad].item()}, expected {expected[bad].item()}"


def rank_values(seed: int, n: int, dtype: torch.dtype, reduced: bool) -> torch.Tensor:
    """The known input block ``seed`` (a rank, or a pair of ranks) of ``n`` elements.

    Small positive integers that differ between seeds and along the block:
    1 to 4 for operands of a reduction (so sums of up to 63 of them are exact
    in bfloat16 and uint8), 1 to 101 otherwise; 0/1 for bool.
    """
    i = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        return ((i + seed) % 2 == 1) if reduced else ((i * (seed + 1) + seed) % 3 == 1)
    v = (i + seed) % 4 + 1 if reduced else (i + 13 * seed) % 101 + 1
    return v.to(dtype)


def reduce_all(blocks: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """SUM (LXOR for bool) of ``blocks``, computed wide and cast back (exact)."""
    if dtype == torch.bool:
        return torch.stack([b.to(torch.int64) for b in blocks]).sum(0).remainder(2).bool()
    wide = torch.complex128 if dtype.is_complex else (
        torch.float64 if dtype.is_floating_point else torch.int64)
    return torch.stack([b.to(wide) for b in blocks]).sum(0).to(dtype)


def reduction_op(dtype: torch.dtype) -> MPI.Op:
    """The op the reductions use: SUM, or LXOR for bool (MPI has no SUM on bool)."""
    from mpi4py import MPI
    return MPI.LXOR if dtype == torch.bool else MPI.SUM


# -- Cases ------------------------------------------------------------------------

@dataclass
class Case:
    """The buffers and calls of one operation at one message size on one rank.

    Attributes
    ----------
    spec : OpSpec
        The operation.
    comm : mpi4py.MPI.Intracomm
        The communicator (an ``mcr.Comm`` or mpi4py's).
    count : int
        Elements per process (see the module's description of sizes).
    dtype : torch.dtype
        The element type.
    args : tuple
        The positional arguments of the call (the buffers, as message specs).
    kwargs : dict
        Its keyword arguments (``root``, ``op``, ``recvcounts``).
    outputs : list of (buffer, torch.Tensor, str)
        Each receive buffer of this rank, the values it must hold after one
        iteration, and its name for messages.
    inputs : list of (buffer, torch.Tensor)
        The send buffers and the values to fill them with (:meth:`refill`).
    """

    spec: OpSpec
    comm: MPI.Intracomm
    count: int
    dtype: torch.dtype
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: list[tuple[Any, torch.Tensor, str]]
    inputs: list[tuple[Any, torch.Tensor]]
    _prequests: list[Any] = field(default_factory=list)

    def _call(self, nonblocking: bool, suffix: str, backend: str | None) -> Any:
        name = self.spec.method + suffix
        if nonblocking:                   # Iallreduce, Ibcast, ...
            name = "I" + name[0].lower() + name[1:]
        method = getattr(self.comm, name)
        kwargs = dict(self.kwargs)
        if backend is not None:           # mpi4py has no backend keyword
            kwargs["backend"] = backend
        if not kwargs:                    # keywords cost ~0.1 us per call
            return functools.partial(method, *self.args)
        return functools.partial(method, *self.args, **kwargs)

    def run(self, form: str, backend: str | None = None) -> Callable[[], None]:
        """A zero-argument callable doing one iteration in ``form``.

        Parameters
        ----------
        form : str
            ``"blocking"`` (the call), ``"nonblocking"`` (the ``I`` call and
            ``Wait``) or ``"persistent"`` (``Start`` and ``Wait`` of a request
            made here, once, by the ``_init`` call; :meth:`close` frees it).
        backend : str, optional
            Passed as ``backend=`` when given (mcr only).

        Raises
        ------
        ValueError
            For an unknown form.
        """
        if form == "blocking":
            call: Callable[[], None] = self._call(False, "", backend)
            return call
        if form == "nonblocking":
            post = self._call(True, "", backend)

            def nonblocking() -> None:
                post().Wait()
            return nonblocking
        if form == "persistent":
            request = self._call(False, "_init", backend)()
            self._prequests.append(request)
            start, wait = request.Start, request.Wait

            def persistent() -> None:
                start()
                wait()
            return persistent
        raise ValueError(f"form: expected one of {', '.join(FORMS)}, got {form!r}")

    def poster(self, backend: str | None = None) -> Callable[[], MPI.Request]:
        """A zero-argument callable posting the non-blocking call; returns its Request."""
        post: Callable[[], MPI.Request] = self._call(True, "", backend)
        return post

    def post(self, backend: str | None = None) -> MPI.Request:
        """Post the non-blocking call once and return its Request."""
        return self.poster(backend)()

    def check(self) -> str | None:
        """None if every receive buffer holds the expected result, else what is wrong."""
        for buf, expected, name in self.outputs:
            problem = mismatch(buf, expected, name)
            if problem:
                return (f"{self.spec.name}: rank {self.comm.Get_rank()}, count "
                        f"{self.count}: {problem}")
        return None

    def refill(self) -> None:
        """Write the known inputs into the send buffers and zero the receive buffers."""
        for buf, values in self.inputs:
            fill(buf, values)
        for buf, expected, _ in self.outputs:
            if not any(buf is b for b, _ in self.inputs):
                fill(buf, torch.zeros_like(expected))

    def corrupt(self) -> None:
        """Spoil the first element of this rank's first receive buffer (for tests)."""
        if self.outputs:
            buf, expected, _ = self.outputs[0]
            wrong = expected.clone()
            wrong[0] = ~expected[0] if expected.dtype == torch.bool else expected[0] + 1
            fill(buf, wrong)

    def close(self) -> None:
        """Free the persistent requests made by :meth:`run`."""
        for request in self._prequests:
            request.Free()
        self._prequests.clear()


# -- The table ----------------------------------------------------------------------

# builder(rank, size, count, dtype, make) -> (args, kwargs, outputs, inputs)
_Built = tuple[tuple[Any, ...], dict[str, Any], list[tuple[Any, torch.Tensor, str]],
               list[tuple[Any, torch.Tensor]]]
_Builder = Callable[[int, int, int, torch.dtype, Make], _Built]


@dataclass(frozen=True)
class OpSpec:
    """One benchmarked operation.

    Attributes
    ----------
    name : str
        The benchmark name (``"allreduce"``).
    method : str
        The Comm method (``"Allreduce"``; ``"I"`` + it and it + ``"_init"``
        are the other forms).
    title : str
        The name in the OSU header (``"Allreduce"``).
    sizes : str
        How ``count`` maps onto the buffers, in words.
    """

    name: str
    method: str
    title: str
    sizes: str
    build: _Builder = field(repr=False)

    def setup(self, comm: MPI.Intracomm, count: int, dtype: torch.dtype,
              make: Make) -> Case:
        """Allocate and fill the buffers for ``count`` elements per process.

        Parameters
        ----------
        comm : mpi4py.MPI.Intracomm
            Any communicator with mpi4py's buffer API (``mcr.Comm`` included).
        count : int
            Elements per process, >= 1 (ignored by ``barrier``).
        dtype : torch.dtype
            The element type.
        make : callable
            ``make(shape_or_n, dtype)`` returning a zero-filled buffer.

        Returns
        -------
        Case
            With its send buffers filled and its receive buffers zeroed.
        """
        rank, size = comm.Get_rank(), comm.Get_size()
        args, kwargs, outputs, inputs = self.build(rank, size, count, dtype, make)
        case = Case(self, comm, count, dtype, args, kwargs, outputs, inputs)
        case.refill()
        return case


ROOT = 0


def _vspec(buf: Any, size: int, count: int) -> list[Any]:
    return [buf, ([count] * size, [i * count for i in range(size)])]


def _barrier(rank: int, size: int, count: int, dtype: torch.dtype, make: Make) -> _Built:
    return (), {}, [], []


def _bcast(rank: int, size: int, count: int, dtype: torch.dtype, make: Make) -> _Built:
    buf = make(count, dtype)
    expected = rank_values(ROOT, count, dtype, False)
    inputs = [(buf, expected)] if rank == ROOT else []
    return (buf,), {"root": ROOT}, [(buf, expected, "buf")], inputs


def _gather(vector: bool) -> _Builder:
    def build(rank: int, size: int, count: int, dtype: torch.dtype, make: Make) -> _Built:
        send = make(count, dtype)
        inputs = [(send, rank_values(rank, count, dtype, False))]
        if rank != ROOT:
            return (send, None), {"root": ROOT}, [], inputs
        recv = make(size * count, dtype)
        expected = torch.cat([rank_values(r, count, dtype, False) for r in range(size)])
        spec = _vspec(recv, size, count) if vector else recv
        return (send, spec), {"root": ROOT}, [(recv, expected, "recvbuf")], inputs
    return build


def _scatter(vector: bool) -> _Builder:
    def build(rank: int, size: int, count: int, dtype: torch.dtype, make: Make) -> _Built:
        recv = make(count, dtype)
        outputs = [(recv, rank_values(rank, count, dtype, False), "recvbuf")]
        if rank != ROOT:
            return (None, recv), {"root": ROOT}, outputs, []
        send = make(size * count, dtype)
        values = torch.cat([rank_values(r, count, dtype, False) for r in range(size)])
        spec = _vspec(send, size, count) if vector else send
        return (spec, recv), {"root": ROOT}, outputs, [(send, values)]
    return build


def _allgather(vector: bool) -> _Builder:
    def build(rank: int, size: int, count: int, dtype: torch.dtype, make: Make) -> _Built:
        send, recv = make(count, dtype), make(size * count, dtype)
        expected = torch.cat([rank_values(r, count, dtype, False) for r in range(size)])
        spec = _vspec(recv, size, count) if vector else recv
        return ((send, spec), {}, [(recv, expected, "recvbuf")],
                [(send, rank_values(rank, count, dtype, False))])
    return build


def _alltoall(vector: bool) -> _Builder:
    def build(rank: int, size: int, count: int, dtype: torch.dtype, make: Make) -> _Built:
        # block j of rank r's send buffer goes to rank j: seed r * size + j
        send, recv = make(size * count, dtype), make(size * count, dtype)
        values = torch.cat([rank_values(rank * size + j, count, dtype, False)
                            for j in range(size)])
        expected = torch.cat([rank_values(r * size + rank, count, dtype, False)
                              for r in range(size)])
        if vector:
            args: tuple[Any, ...] = (_vspec(send, size, count), _vspec(recv, size, count))
        else:
            args = (send, recv)
        return args, {}, [(recv, expected, "recvbuf")], [(send, values)]
    return build


def _reduce(rank: int, size: int, count: int, dtype: torch.dtype, make: Make) -> _Built:
    send = make(count, dtype)
    kwargs = {"op": reduction_op(dtype), "root": ROOT}
    inputs = [(send, rank_values(rank, count, dtype, True))]
    if rank != ROOT:
        return (send, None), kwargs, [], inputs
    recv = make(count, dtype)
    expected = reduce_all([rank_values(r, count, dtype, True) for r in range(size)], dtype)
    return (send, recv), kwargs, [(recv, expected, "recvbuf")], inputs


def _allreduce(rank: int, size: int, count: int, dtype: torch.dtype, make: Make) -> _Built:
    send, recv = make(count, dtype), make(count, dtype)
    expected = reduce_all([rank_values(r, count, dtype, True) for r in range(size)], dtype)
    return ((send, recv), {"op": reduction_op(dtype)}, [(recv, expected, "recvbuf")],
            [(send, rank_values(rank, count, dtype, True))])


def _split(count: int, size: int) -> list[int]:
    # as osu_reduce_scatter splits its vector
    portion, remainder = divmod(count, size)
    return [portion + (1 if i < remainder else 0) for i in range(size)]


def _reduce_scatter(block: bool) -> _Builder:
    def build(rank: int, size: int, count: int, dtype: torch.dtype, make: Make) -> _Built:
        counts = [max(1, count // size)] * size if block else _split(count, size)
        total = sum(counts)
        send, recv = make(total, dtype), make(counts[rank], dtype)
        full = reduce_all([rank_values(r, total, dtype, True) for r in range(size)], dtype)
        start = sum(counts[:rank])
        expected = full[start:start + counts[rank]]
        kwargs: dict[str, Any] = {"op": reduction_op(dtype)}
        if not block:
            kwargs["recvcounts"] = counts
        return ((send, recv), kwargs, [(recv, expected, "recvbuf")],
                [(send, rank_values(rank, total, dtype, True))])
    return build


def _scan(exclusive: bool) -> _Builder:
    def build(rank: int, size: int, count: int, dtype: torch.dtype, make: Make) -> _Built:
        send, recv = make(count, dtype), make(count, dtype)
        last = rank if exclusive else rank + 1
        outputs = []
        if last > 0:            # Exscan leaves rank 0's receive buffer undefined
            expected = reduce_all([rank_values(r, count, dtype, True)
                                    for r in range(last)], dtype)
            outputs.append((recv, expected, "recvbuf"))
        return ((send, recv), {"op": reduction_op(dtype)}, outputs,
                [(send, rank_values(rank, count, dtype, True))])
    return build


_ROOTED = "root 0; "

OPERATIONS: dict[str, OpSpec] = {spec.name: spec for spec in [
    OpSpec("barrier", "Barrier", "Barrier", "no data", _barrier),
    OpSpec("bcast", "Bcast", "Broadcast", _ROOTED + "count elements", _bcast),
    OpSpec("gather", "Gather", "Gather",
           _ROOTED + "count from each rank, P * count at the root", _gather(False)),
    OpSpec("gatherv", "Gatherv", "Gatherv",
           _ROOTED + "count from each rank, P * count at the root", _gather(True)),
    OpSpec("scatter", "Scatter", "Scatter",
           _ROOTED + "P * count at the root, count to each rank", _scatter(False)),
    OpSpec("scatterv", "Scatterv", "Scatterv",
           _ROOTED + "P * count at the root, count to each rank", _scatter(True)),
    OpSpec("allgather", "Allgather", "Allgather",
           "count from each rank, P * count received", _allgather(False)),
    OpSpec("allgatherv", "Allgatherv", "Allgatherv",
           "count from each rank, P * count received", _allgather(True)),
    OpSpec("alltoall", "Alltoall", "All-to-All Personalized Exchange",
           "count to and from each rank", _alltoall(False)),
    OpSpec("alltoallv", "Alltoallv", "All-to-Allv Personalized Exchange",
           "count to and from each rank", _alltoall(True)),
    OpSpec("reduce", "Reduce", "Reduce", _ROOTED + "count elements", _reduce),
    OpSpec("allreduce", "Allreduce", "Allreduce", "count elements", _allreduce),
    OpSpec("reduce_scatter", "Reduce_scatter", "Reduce_scatter",
           "count elements reduced, count // P to each rank (the first count % P "
           "ranks one more)", _reduce_scatter(False)),
    OpSpec("reduce_scatter_block", "Reduce_scatter_block", "Reduce_scatter_block",
           "max(1, count // P) to each rank, P times that reduced",
           _reduce_scatter(True)),
    OpSpec("scan", "Scan", "Scan", "count elements", _scan(False)),
    OpSpec("exscan", "Exscan", "Exscan", "count elements", _scan(True)),
]}


# -- Point-to-point ---------------------------------------------------------------

class PingPong:
    """``latency``: a round trip between ranks 0 and 1 (Send, then Recv on rank 0;
    the reverse on rank 1); other ranks idle. Same interface as :class:`Case`,
    made like ``spec.setup``: ``PingPong(comm, count, dtype, make)``."""

    def __init__(self, comm: Any, count: int, dtype: torch.dtype, make: Make) -> None:
        self.comm, self.rank = comm, comm.Get_rank()
        self.send, self.recv = make(count, dtype), make(count, dtype)
        fill(self.send, rank_values(self.rank, count, dtype, False))
        self.expected = rank_values(1 - self.rank, count, dtype, False)
        self._requests: list[Any] = []

    def check(self) -> str | None:
        """None if rank 0 and 1 received each other's values, else the difference."""
        if self.rank > 1:
            return None
        return mismatch(self.recv, self.expected, f"latency: rank {self.rank}: recvbuf")

    def run(self, form: str, backend: str | None = None) -> Callable[[], None]:
        """One round trip in ``form``; ranks above 1 do nothing."""
        if self.rank > 1:
            return lambda: None
        kw = {} if backend is None else {"backend": backend}
        c, peer, s, r = self.comm, 1 - self.rank, self.send, self.recv
        send: Callable[[], Any]
        recv: Callable[[], Any]
        if form == "blocking":
            send = functools.partial(c.Send, s, peer, 1, **kw)
            recv = functools.partial(c.Recv, r, peer, 1, **kw)
        elif form == "nonblocking":
            isend = functools.partial(c.Isend, s, peer, 1, **kw)
            irecv = functools.partial(c.Irecv, r, peer, 1, **kw)
            send, recv = (lambda: isend().Wait()), (lambda: irecv().Wait())
        else:
            ps, pr = c.Send_init(s, peer, 1, **kw), c.Recv_init(r, peer, 1, **kw)
            self._requests += [ps, pr]
            send, recv = (lambda: (ps.Start(), ps.Wait())), (lambda: (pr.Start(), pr.Wait()))
        first, second = (send, recv) if self.rank == 0 else (recv, send)

        def pingpong() -> None:
            first()
            second()
        return pingpong

    def close(self) -> None:
        """Free the persistent requests."""
        for request in self._requests:
            request.Free()
        self._requests.clear()


P2P_OPERATIONS: dict[str, Callable[[Any, int, torch.dtype, Make], PingPong]] = {
    "latency": PingPong,
}

NAMES: tuple[str, ...] = tuple(OPERATIONS) + tuple(P2P_OPERATIONS)
