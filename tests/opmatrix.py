"""The operation matrix: every collective, in every form, on every backend.

An operation's *maker* builds fresh buffers for a data set (a seed) and the check of its result;
:func:`run` calls the operation in one form on one backend with them:

- ``blocking``: ``comm.Allreduce(...)``;
- ``nonblocking``: ``comm.Iallreduce(...)``, completed by one of :data:`COMPLETIONS` in turn;
- ``persistent``: ``comm.Allreduce_init(...)`` made once and started twice, new data written into
  the same buffers before each start (on MPI both native MPI-4 collectives and their emulation).

Backends (:data:`BACKENDS`): ``mpi``; ``staged``, MPI with host buffers staged through
``mcr.device.HostInterface`` as CUDA buffers are (the private switch
``mcr._core._set_host_staging``); ``gloo``, torch's ProcessGroupGloo; ``tiny``, the third-party
backend of ``tests/plugins`` (found through the ``mcr.backends`` entry points), which defines only
three primitives so that every operation runs by composition. With a CUDA device, ``tests/gpu`` runs
the same makers on CUDA tensors, NCCL among the backends.

Variants (element type, reduction, root, IN_PLACE, layout) run inside a case, and a wrong result is
recorded, not raised (:class:`Findings`), so that every rank keeps making the same calls; the case
fails at its end with all of them. Expected values come from :mod:`opref` (torch/numpy on the whole
data).
"""

import contextlib
import itertools
import time

import numpy as np
import torch

import mcr
from mcr import MPI, _core  # noqa: F401 - mcr.MPI loads libmpi before mcr._core
from opref import (LAYOUTS, MOVE, OPS, cat, copy, data, expect, layout, operands, pair_block,
                   place, reduce_ref, reductions, roots, sentinel, vcounts)

BACKENDS = ("mpi", "staged", "gloo", "tiny")
FORMS = ("blocking", "nonblocking", "persistent")
COMPLETIONS = ("wait", "test", "waitall", "testall", "waitany", "testany", "waitsome", "testsome")
N = 5
# data to move: every torch element type, and numpy arrays
MOVE_TYPES = MOVE + [np.float64, np.int32, np.uint8, np.complex64, np.bool_]


class Findings(list):
    """The failures of one case, kept so that every rank makes all its calls."""

    @contextlib.contextmanager
    def check(self, what):
        try:
            yield
        except Exception as exc:  # noqa: B902 - record anything, keep the ranks in step
            self.append(f"{what}: {type(exc).__name__}: {exc}")

    def report(self):
        if self:
            raise AssertionError(f"{len(self)} failure(s):\n" + "\n".join(self))


@contextlib.contextmanager
def switched(setter, on):
    """A private switch of mcr._core (``_set_host_staging``, ...) set to `on` inside the block."""
    previous = setter(on)
    try:
        yield
    finally:
        setter(previous)


def staging(on):
    return switched(_core._set_host_staging, on)


def emulation(on):
    return switched(_core._set_persistent_emulation, on)


def nonblocking(method):
    return "I" + method[0].lower() + method[1:]


def poller():
    """To call after each failed poll: past 1000 it lets the other ranks run (on 2 cores)."""
    polls = itertools.count()
    return lambda: next(polls) > 1000 and time.sleep(0.0002)


def complete(requests, how, rng=None):
    """Complete `requests` by `how` (one of COMPLETIONS), the one-by-one forms in the order `rng`
    draws (default: in order); {index: Status}, each request reported once, every active one."""
    got, poll, active = {}, poller(), {i for i, r in enumerate(requests) if r}

    def report(i, status):
        assert i not in got, f"{how}: request {i} reported twice"
        got[i] = status
    if how in ("wait", "test"):
        for i in rng.sample(range(len(requests)), len(requests)) if rng else range(len(requests)):
            status = mcr.Status()
            if how == "wait":
                assert requests[i].Wait(status) is True
            while how == "test" and not requests[i].Test(status):
                poll()
            report(i, status)
    elif how in ("waitall", "testall"):
        statuses = []
        if how == "waitall":
            assert mcr.Request.Waitall(requests, statuses) is True
        while how == "testall" and not mcr.Request.Testall(requests, statuses):
            poll()
        assert len(statuses) >= len(requests)
        for i in range(len(requests)):
            report(i, statuses[i])
    elif how in ("waitany", "testany"):
        while True:
            status = mcr.Status()
            if how == "waitany":
                index, flag = mcr.Request.Waitany(requests, status), True
            else:
                index, flag = mcr.Request.Testany(requests, status)
            if not flag:
                poll()
            elif index == mcr.UNDEFINED:
                break
            else:
                report(index, status)
    else:
        some = mcr.Request.Waitsome if how == "waitsome" else mcr.Request.Testsome
        while (indices := some(requests, statuses := [])) is not None:
            assert indices or how == "testsome", "Waitsome returned no index"
            if not indices:
                poll()
            for k, i in enumerate(indices):
                report(i, statuses[k])
    assert active <= set(got), (how, "not reported:", sorted(active - set(got)))
    return got


def buffers(args):
    """The tensors and arrays in `args`, message specs included, in order."""
    for a in args:
        if isinstance(a, (torch.Tensor, np.ndarray)):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from buffers(a)


def refill(args, new_args):
    """Write the buffers of `new_args` into those of `args`, in place."""
    for old, new in zip(buffers(args), buffers(new_args), strict=True):
        old[...] = new


def run(comm, found, what, backend, form, method, make, turn=0):
    """Run `method` in `form` on `backend`, recording failures in `found`. `make(seed)` returns
    (args, check): fresh buffers for data set `seed`, and `check(args)` asserting the result."""
    label = f"{method} {what} [{backend} {form}]"
    kw = {"backend": "mpi" if backend == "staged" else backend}
    with staging(backend == "staged"):
        if form == "blocking":
            args, check = make(0)
            with found.check(label):
                assert getattr(comm, method)(*args, **kw) is None
                check(args)
        elif form == "nonblocking":
            args, check = make(1)
            how = COMPLETIONS[turn % len(COMPLETIONS)]
            with found.check(f"{label} {how}"):
                req = getattr(comm, nonblocking(method))(*args, **kw)
                assert type(req) is mcr.Request, type(req)
                complete([req], how)
                check(args)
        else:
            for emulated in ((False, True) if kw["backend"] == "mpi" else (None,)):
                args, _ = make(2)
                mode = {None: "", False: " native", True: " emulated"}[emulated]
                with found.check(label + mode):
                    with emulation(bool(emulated)):
                        preq = getattr(comm, method + "_init")(*args, **kw)
                    assert isinstance(preq, mcr.Prequest), type(preq)
                    for start in (1, 2):
                        new_args, check = make(2 + start)
                        refill(args, new_args)
                        how = COMPLETIONS[(turn + start) % len(COMPLETIONS)]
                        assert preq.Start() is None
                        complete([preq], how)
                        with found.check(f"{label}{mode} start {start} {how}"):
                            check(args)
                    preq.Free()


def no_check(args):
    pass


def without_root(make, count):
    """A maker of an all-* collective from its rooted one's at root = this rank: the arguments
    cut to the first `count`, the check the same."""
    def cut(seed):
        args, check = make(seed)
        return args[:count], check
    return cut


# -- makers: (args, check) for data set `seed` -----------------------------------------

def reduce_maker(comm, dtype, op, root, in_place):
    rank, size = comm.rank, comm.size

    def make(seed):
        xs = operands(size, N, dtype, op, seed)
        if rank != root:
            return (xs[rank], None, OPS[op], root), no_check
        want = reduce_ref(xs, op)
        recv = copy(xs[rank]) if in_place else sentinel(N, dtype)
        send = mcr.IN_PLACE if in_place else xs[rank]
        return (send, recv, OPS[op], root), lambda a: expect(a[1], want)
    return make


def allreduce_maker(comm, dtype, op, root, in_place):
    return without_root(reduce_maker(comm, dtype, op, comm.rank, in_place), 3)


def reduce_scatter_block_maker(comm, dtype, op, root, in_place, k=2):
    rank, size = comm.rank, comm.size

    def make(seed):
        xs = operands(size, k * size, dtype, op, seed)
        want = reduce_ref(xs, op)[rank * k:(rank + 1) * k]
        if in_place:
            return (mcr.IN_PLACE, copy(xs[rank]), OPS[op]), lambda a: expect(a[1][:k], want)
        return (xs[rank], sentinel(k, dtype), OPS[op]), lambda a: expect(a[1], want)
    return make


def reduce_scatter_maker(comm, dtype, op, root, in_place):
    """Uneven counts with zeros; the receive buffer one element longer than the block, that element
    untouched. Root 1 (a second variant): recvcounts None, equal blocks."""
    rank, size = comm.rank, comm.size
    counts = vcounts(size) if root == 0 else [3] * size     # root: see OPERATIONS
    start, mine = sum(counts[:rank]), counts[rank]

    def make(seed):
        xs = operands(size, sum(counts), dtype, op, seed)
        want = reduce_ref(xs, op)[start:start + mine]
        given = counts if root == 0 else None
        if in_place:
            return ((mcr.IN_PLACE, copy(xs[rank]), given, OPS[op]),
                    lambda a: expect(a[1][:mine], want))
        if given is None:           # the receive buffer's size is the count
            return (xs[rank], sentinel(mine, dtype), None, OPS[op]), \
                lambda a: expect(a[1], want)
        padded = cat([want, sentinel(1, dtype)])
        return ((xs[rank], sentinel(mine + 1, dtype), given, OPS[op]),
                lambda a: expect(a[1], padded))
    return make


def scan_maker(comm, dtype, op, root, in_place, exclusive=False):
    rank, size = comm.rank, comm.size

    def make(seed):
        xs = operands(size, N, dtype, op, seed)
        check = no_check
        if not (exclusive and rank == 0):           # undefined in MPI
            want = reduce_ref(xs[:rank] if exclusive else xs[:rank + 1], op)
            check = (lambda a: expect(a[1], want))
        if in_place:
            return (mcr.IN_PLACE, copy(xs[rank]), OPS[op]), check
        return (xs[rank], sentinel(N, dtype), OPS[op]), check
    return make


def exscan_maker(comm, dtype, op, root, in_place):
    return scan_maker(comm, dtype, op, root, in_place, exclusive=True)


def barrier_maker(comm, dtype, root, in_place, kind):
    return lambda seed: ((), no_check)


def bcast_maker(comm, dtype, root, in_place, kind):
    def make(seed):
        want = data(root, N, dtype, None, seed)
        buf = copy(want) if comm.rank == root else sentinel(N, dtype)
        return (buf, root), lambda a: expect(a[0], want)
    return make


def gather_maker(comm, dtype, root, in_place, kind, k=3):
    rank, size = comm.rank, comm.size

    def make(seed):
        blocks = operands(size, k, dtype, None, seed)
        if rank != root:
            return (blocks[rank], None, root), no_check
        want = cat(blocks)
        recv = sentinel(k * size, dtype)
        if in_place:
            recv[rank * k:(rank + 1) * k] = blocks[rank]
        send = mcr.IN_PLACE if in_place else blocks[rank]
        return (send, recv, root), lambda a: expect(a[1], want)
    return make


def vblocks(size, counts, dtype, seed):
    return [data(r, counts[r], dtype, None, seed) for r in range(size)]


def gatherv_maker(comm, dtype, root, in_place, kind):
    rank, size = comm.rank, comm.size
    counts = vcounts(size)
    displs, length = layout(counts, kind)

    def make(seed):
        blocks = vblocks(size, counts, dtype, seed)
        if rank != root:
            return (blocks[rank], None, root), no_check
        recv = sentinel(length, dtype)
        want = place(recv, blocks, displs)
        if in_place:
            recv = place(recv, [blocks[rank]], [displs[rank]])
        send = mcr.IN_PLACE if in_place else blocks[rank]
        return (send, [recv, counts, displs], root), lambda a: expect(a[1][0], want)
    return make


def scatter_maker(comm, dtype, root, in_place, kind, k=3):
    rank, size = comm.rank, comm.size

    def make(seed):
        blocks = operands(size, k, dtype, None, seed)
        if rank != root:
            return (None, sentinel(k, dtype), root), lambda a: expect(a[1], blocks[rank])
        whole = cat(blocks)
        if in_place:               # the root's block stays in the send buffer
            return (copy(whole), mcr.IN_PLACE, root), lambda a: expect(a[0], whole)
        return (whole, sentinel(k, dtype), root), lambda a: expect(a[1], blocks[rank])
    return make


def scatterv_maker(comm, dtype, root, in_place, kind):
    rank, size = comm.rank, comm.size
    counts = vcounts(size)
    displs, length = layout(counts, kind)

    def make(seed):
        blocks = vblocks(size, counts, dtype, seed)
        # a receive buffer one element longer than the block: the last stays
        recv = [sentinel(counts[rank] + 1, dtype), counts[rank]]
        want = cat([blocks[rank], sentinel(1, dtype)])
        if rank != root:
            return (None, recv, root), lambda a: expect(a[1][0], want)
        send = place(sentinel(length, dtype), blocks, displs)
        if in_place:
            unchanged = copy(send)
            return ([send, counts, displs], mcr.IN_PLACE, root), \
                lambda a: expect(a[0][0], unchanged)
        return ([send, counts, displs], recv, root), lambda a: expect(a[1][0], want)
    return make


def allgather_maker(comm, dtype, root, in_place, kind, k=2):
    return without_root(gather_maker(comm, dtype, comm.rank, in_place, kind, k), 2)


def allgatherv_maker(comm, dtype, root, in_place, kind):
    return without_root(gatherv_maker(comm, dtype, comm.rank, in_place, kind), 2)


def alltoall_maker(comm, dtype, root, in_place, kind, k=2):
    rank, size = comm.rank, comm.size

    def make(seed):
        send = cat([pair_block(rank, j, k, dtype, seed) for j in range(size)])
        want = cat([pair_block(j, rank, k, dtype, seed) for j in range(size)])
        if in_place:
            return (mcr.IN_PLACE, send), lambda a: expect(a[1], want)
        return (send, sentinel(k * size, dtype)), lambda a: expect(a[1], want)
    return make


def alltoallv_maker(comm, dtype, root, in_place, kind):
    """Send layout `kind`, receive layout the next one; IN_PLACE needs symmetric counts (what
    rank i sends j is what j sends i)."""
    rank, size = comm.rank, comm.size

    def count(i, j):
        return (i + j + 1) % 3 if in_place else (i + 2 * j + 1) % 4
    scounts = [count(rank, j) for j in range(size)]
    rcounts = [count(j, rank) for j in range(size)]
    rkind = LAYOUTS[(LAYOUTS.index(kind) + 1) % len(LAYOUTS)]
    sdispls, slength = layout(scounts, kind)
    rdispls, rlength = layout(rcounts, rkind)

    def make(seed):
        outgoing = [pair_block(rank, j, scounts[j], dtype, seed) for j in range(size)]
        incoming = [pair_block(j, rank, rcounts[j], dtype, seed) for j in range(size)]
        want = place(sentinel(rlength, dtype), incoming, rdispls)
        if in_place:
            buf = place(sentinel(rlength, dtype), outgoing, rdispls)
            return (mcr.IN_PLACE, [buf, rcounts, rdispls]), lambda a: expect(a[1][0], want)
        send = place(sentinel(slength, dtype), outgoing, sdispls)
        recv = [sentinel(rlength, dtype), np.array(rcounts), rdispls]
        return ([send, scounts, sdispls], recv), lambda a: expect(a[1][0], want)
    return make


class Operation:
    """A collective of the matrix: its maker and which variants apply."""

    def __init__(self, maker, reduction=False, rooted=False, in_place=True, vector=False,
                 root_label="root {}".format):
        self.maker, self.reduction, self.rooted = maker, reduction, rooted
        self.in_place, self.vector, self.root_label = in_place, vector, root_label

    def variants(self, comm, dtypes=None, every=True):
        """(label, make) for each element type (and reduction), root, IN_PLACE and layout;
        `dtypes` restricts the element types. Each type (each (type, op) pair of a reduction) runs
        on every root and IN_PLACE; with `every` False, on one of these arrangements, in turn (for
        reductions shifted by one at each type, so that each op meets each arrangement)."""
        places = (False, True) if self.in_place else (False,)
        rootset = roots(comm.size) if self.rooted else [0]
        arranged = [(in_place, root) for in_place in places for root in rootset]
        if self.reduction:
            items = reductions(dtypes)
            shift = list(dict.fromkeys(dtype for dtype, _ in items)).index
        else:
            items = [(t, None) for t in MOVE_TYPES if dtypes is None or t in dtypes]
            shift = (lambda dtype: 0)
        kinds = LAYOUTS if self.vector else ("packed",)
        for i, (dtype, op) in enumerate(items):
            turn = (i + shift(dtype)) % len(arranged)
            for in_place, root in arranged if every else [arranged[turn]]:
                where = f"{' IN_PLACE' * in_place}{(' ' + self.root_label(root)) * self.rooted}"
                if self.reduction:
                    yield (f"{op} on {name(dtype)}{where}",
                           self.maker(comm, dtype, op, root, in_place))
                    continue
                kind = kinds[(i + root + in_place) % len(kinds)]
                yield (f"on {name(dtype)}{' ' + kind if self.vector else ''}{where}",
                       self.maker(comm, dtype, root, in_place, kind))


def name(dtype):
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    return "numpy " + np.dtype(dtype).name


OPERATIONS = {
    "Barrier": Operation(barrier_maker, in_place=False),
    "Bcast": Operation(bcast_maker, rooted=True, in_place=False),
    "Gather": Operation(gather_maker, rooted=True),
    "Gatherv": Operation(gatherv_maker, rooted=True, vector=True),
    "Scatter": Operation(scatter_maker, rooted=True),
    "Scatterv": Operation(scatterv_maker, rooted=True, vector=True),
    "Allgather": Operation(allgather_maker),
    "Allgatherv": Operation(allgatherv_maker, vector=True),
    "Alltoall": Operation(alltoall_maker),
    "Alltoallv": Operation(alltoallv_maker, vector=True),
    "Reduce": Operation(reduce_maker, reduction=True, rooted=True),
    "Allreduce": Operation(allreduce_maker, reduction=True),
    "Reduce_scatter_block": Operation(reduce_scatter_block_maker, reduction=True),
    # a "root" of 0: uneven recvcounts; the other: recvcounts None (equal blocks)
    "Reduce_scatter": Operation(reduce_scatter_maker, reduction=True, rooted=True,
                                root_label=lambda r: "recvcounts None" if r else "uneven"),
    "Scan": Operation(scan_maker, reduction=True),
    "Exscan": Operation(exscan_maker, reduction=True),
}


def run_operation(comm, method, backend, form, dtypes=None):
    """Every variant of collective `method` in `form` on `backend`; raises with every wrong
    result at the end."""
    found = Findings()
    variants = OPERATIONS[method].variants(comm, dtypes, every=form == "blocking")
    if method == "Barrier":
        variants = [("", barrier_maker(comm, None, 0, False, None))] * 3
    for turn, (what, make) in enumerate(variants):
        run(comm, found, what, backend, form, method, make, turn)
    found.report()
