"""Collectives beyond the operation matrix (tests/test_ops.py): message specs of every form
(counts and displacements as every int_forms kind), default op and root, empty, one-element
and large messages, numpy types and reductions the matrix does not run, buffer-protocol
objects, the mpi4py namespace, many requests at once, and Alltoallw (every form, IN_PLACE,
derived datatypes, errors). Expected values come from opref (torch/numpy on the whole data).
"""

import array
import gc
import itertools
import random

import numpy as np
import torch
from mpi4py import MPI as _mpi4py

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases
from opmatrix import (FORMS, MOVE_TYPES, OPERATIONS, Findings, allgather_maker, alltoall_maker,
                      gather_maker, name, nonblocking, run, scatter_maker)
from opref import (LAYOUTS, OPS, all_data, cat, copy, expect, int_forms, layout, operands,
                   pair_block, place, rank_data, reduce_ref, roots, sentinel, vcounts)
from util import assert_comm_works, raises

N = 5
F32, F64 = torch.float32, torch.float64


def spec(buf, tail):
    """The message spec `[buf, *tail]`, or the bare buffer for no tail."""
    return [buf, *tail] if tail else buf


def padded(x, lead, trail):
    return cat([sentinel(lead, x.dtype), x, sentinel(trail, x.dtype)])


def call(comm, form, method, *args, **kw):
    """`method` blocking, or its nonblocking form waited on at once."""
    req = getattr(comm, method if form == "blocking" else nonblocking(method))(*args, **kw)
    if form != "blocking":
        req.Wait()


# -- message specs of Bcast, Gather, Scatter, Allgather, Alltoall ------------------------
@case
def bcast_spec_forms(comm):
    """Counts, displacements and datatypes select part of the buffer; the rest is untouched."""
    n, root, rank = 8, comm.size - 1, comm.rank
    full, blank = rank_data(root, n), sentinel(n, F32)
    for tail, lo, hi in [([3], 0, 3), ([0], 0, 0), ([MPI.FLOAT], 0, n), (["f"], 0, n),
                         ([3, MPI.FLOAT], 0, 3), ([3, "f"], 0, 3), ([(3, 2)], 2, 5),
                         ([(None, 2)], 2, n), ([(3, 2), MPI.FLOAT], 2, 5),
                         ([3, 5, MPI.FLOAT], 5, 8), ([3, 5, "f"], 5, 8), ([(0, n)], n, n)]:
        buf = copy(full if rank == root else blank)
        comm.Bcast([buf, *tail], root=root)
        expect(buf, full if rank == root else cat([blank[:lo], full[lo:hi], blank[hi:]]),
               f"Bcast [buf, {tail}]")
    for dtype, datatype in [(F64, MPI.DOUBLE), (torch.int32, MPI.INT),
                            (torch.int64, MPI.INT64_T), (torch.int8, MPI.SIGNED_CHAR),
                            (torch.uint8, MPI.UNSIGNED_CHAR),
                            (torch.complex128, MPI.C_DOUBLE_COMPLEX), (torch.bool, MPI.C_BOOL)]:
        want = rank_data(root, n, dtype, 3)
        buf = copy(want) if rank == root else sentinel(n, dtype)
        comm.Bcast([buf, n, datatype], root=root)
        expect(buf, want, f"Bcast [buf, {n}, {datatype}]")


@case
def block_spec_forms(comm):
    """Gather/Scatter/Allgather: every spec of block and whole buffer; Alltoall: whole-buffer."""
    size, rank, w = comm.size, comm.rank, comm.size * N
    for dtype, dt, char in ((F32, MPI.FLOAT, "f"), (F64, MPI.DOUBLE, "d")):
        # (tail, buffer length, offset of the data): a rank's block of N ...
        bforms = [([], N, 0), ([dt], N, 0), ([char], N, 0), ([N], N + 3, 0), ([N, char], N + 3, 0),
                  ([(N, 1)], N + 3, 1), ([(N, 1), dt], N + 3, 1), ([(N, 1), char], N + 3, 1),
                  ([N, 1, dt], N + 3, 1), ([N, 1, char], N + 3, 1)]
        # ... and the whole buffer: a count is per process (recvcount/sendcount), as in mpi4py
        wforms = [([], w, 0), ([dt], w, 0), ([char], w, 0), ([(None, 2)], w + 2, 2),
                  ([(None, 2), char], w + 2, 2), ([None, 2, dt], w + 2, 2), ([N, dt], w, 0),
                  ([N, char], w + 1, 0)]
        blocks = all_data(size, N, dtype)
        mine, whole = blocks[rank], cat(blocks)
        outgoing = cat([pair_block(rank, j, N, dtype) for j in range(size)])
        incoming = cat([pair_block(j, rank, N, dtype) for j in range(size)])

        def buffer(length, at, x):
            return place(sentinel(length, dtype), [x], [at])
        for i, ((bt, bn, bat), (wt, wn, wat)) in enumerate(itertools.product(bforms, wforms)):
            root, what = i % size, f"block {bt}, whole {wt} on {dtype}"
            recv = sentinel(wn, dtype)
            comm.Gather(spec(buffer(bn, bat, mine), bt), spec(recv, wt) if rank == root else None,
                        root=root)
            if rank == root:
                expect(recv, buffer(wn, wat, whole), f"Gather {what}")
            recv = sentinel(bn, dtype)
            comm.Scatter(spec(buffer(wn, wat, whole), wt) if rank == root else None,
                         spec(recv, bt), root=root)
            expect(recv, buffer(bn, bat, mine), f"Scatter {what}")
            recv = sentinel(wn, dtype)
            comm.Allgather(spec(buffer(bn, bat, mine), bt), spec(recv, wt))
            expect(recv, buffer(wn, wat, whole), f"Allgather {what}")
        for (st, sn, sat), (rt, rn, rat) in itertools.product(wforms, wforms):
            recv = sentinel(rn, dtype)
            comm.Alltoall(spec(buffer(sn, sat, outgoing), st), spec(recv, rt))
            expect(recv, buffer(rn, rat, incoming), f"Alltoall send {st}, recv {rt} on {dtype}")
    # a view into a larger tensor receives in place
    blocks = all_data(size, N, F32)
    recv = sentinel(size * N + 4, F32)
    comm.Gather(blocks[rank], [recv[:size * N], MPI.FLOAT], root=0)
    if rank == 0:
        expect(recv, padded(cat(blocks), 0, 4))


# -- message specs of Gatherv, Allgatherv, Scatterv, Alltoallv --------------------------
def vector_forms(counts, dt, char, k=2, stride=3):
    """Two lists of (tail, counts, displs, length), every vector spec: uneven `counts` with
    reversed displacements (packed if none) as every int_forms kind; equal blocks of `k`."""
    displs, length = layout(counts, "reversed")
    given, packed = (counts, displs, length), (counts, *layout(counts, "packed"))
    uneven = []
    for c, d in zip(int_forms(counts), int_forms(displs)):
        uneven += [(t, *given) for t in ([c, d], [(c, d)], [c, d, dt], [c, d, char],
                                         [(c, d), dt], [(c, d), char])]
        uneven += [(t, *packed) for t in ([(c, None)], [(c, None), dt], [(c, None), char])]
        if not isinstance(c, tuple):    # right after the buffer a 2-tuple is (counts, displs)
            uneven += [(t, *packed) for t in ([c], [c, dt], [c, char])]
    n = len(counts)

    def equal(step):
        return [k] * n, [step * i for i in range(n)], step * n
    return uneven, ([(t, *equal(k)) for t in ([], [dt], [k], [k, dt])]
                    + [(t, *equal(stride)) for t in ([(k, stride)], [(k, stride), char])])


def check_vector(comm, form, method, dtype, vside, rside=None, root=0):
    """`method` with vector side `vside` (tail, counts, displs, length), the other a block
    (Scatterv: into the middle of a larger one); Alltoallv: `vside` sends, `rside` receives."""
    size, rank = comm.size, comm.rank
    tail, counts, displs, length = vside
    what = f"{method} {form} {tail}{'' if rside is None else rside[0]} on {dtype}"
    if method == "Alltoallv":
        rtail, rcounts, rdispls, rlength = rside
        send = place(sentinel(length, dtype),
                     [pair_block(rank, j, c, dtype) for j, c in enumerate(counts)], displs)
        recv = sentinel(rlength, dtype)
        call(comm, form, method, spec(send, tail), spec(recv, rtail))
        incoming = [pair_block(j, rank, c, dtype) for j, c in enumerate(rcounts)]
        return expect(recv, place(sentinel(rlength, dtype), incoming, rdispls), what)
    blocks = [rank_data(r, c, dtype) for r, c in enumerate(counts)]
    whole = place(sentinel(length, dtype), blocks, displs)
    if method == "Scatterv":
        recv = sentinel(counts[rank] + 2, dtype)
        call(comm, form, method, spec(whole, tail) if rank == root else None,
             [recv, (counts[rank], 1)], root)
        return expect(recv, padded(blocks[rank], 1, 1), what)
    recv = sentinel(length, dtype)
    if method == "Gatherv":
        call(comm, form, method, blocks[rank], spec(recv, tail) if rank == root else None, root)
    else:
        call(comm, form, method, blocks[rank], spec(recv, tail))
    if method == "Allgatherv" or rank == root:
        expect(recv, whole, what)


def explicit(counts, kind):
    """The vector side [buf, counts, displs] of `counts` in layout `kind`."""
    displs, length = layout(counts, kind)
    return [counts, displs], counts, displs, length


@case
def vector_spec_and_count_forms(comm):
    """Blocking and nonblocking (the request keeps what it converted alive)."""
    size, rank = comm.size, comm.rank

    def count(i, j):                    # what rank i sends rank j in the Alltoallv
        return (i + 2 * j + 1) % 3
    for method, (dtype, dt, char) in {
            "Gatherv": (F32, MPI.FLOAT, "f"), "Allgatherv": (torch.int64, MPI.INT64_T, "q"),
            "Scatterv": (F64, MPI.DOUBLE, "d"), "Alltoallv": (F32, MPI.FLOAT, "f")}.items():
        if method == "Alltoallv":
            sends = vector_forms([count(rank, j) for j in range(size)], dt, char)
            recvs = vector_forms([count(j, rank) for j in range(size)], dt, char)
            pairs = [p for g in (0, 1) for p in zip(sends[g], reversed(recvs[g]))]
        else:
            pairs = [(f, None) for group in vector_forms(vcounts(size), dt, char) for f in group]
        for form in ("blocking", "nonblocking"):
            for i, (vside, rside) in enumerate(pairs):
                check_vector(comm, form, method, dtype, vside, rside, root=i % size)


# -- message specs and defaults of reductions ----------------------------------------
@case
def reduction_spec_forms_and_defaults(comm):
    size, rank, root = comm.size, comm.rank, comm.size - 1
    xs, recv = operands(size, N, F32, "SUM"), sentinel(N, F32) if rank == 0 else None
    want = reduce_ref(xs, "SUM")
    comm.Reduce(xs[rank], recv)                                 # op SUM, root 0
    if rank == 0:
        expect(recv, want, "Reduce defaults")
    recv = sentinel(N + 3, F32)
    comm.Reduce([padded(xs[rank], 2, 1), (N, 2), MPI.FLOAT], [recv, N, 1, "f"], op=mcr.SUM,
                root=root)
    if rank == root:
        expect(recv, padded(want, 1, 2), "Reduce part of the buffers")
    ys, recv = operands(size, N, F32, "MAX"), sentinel(N, F32)  # only the first 3
    comm.Reduce([ys[rank], 3], [recv, 3], op=mcr.MAX, root=0)
    if rank == 0:
        expect(recv, cat([reduce_ref(ys, "MAX")[:3], sentinel(N - 3, F32)]), "Reduce first 3")
    xs = operands(size, N, F64, "MIN")
    want, p = reduce_ref(xs, "MIN"), padded(xs[rank], 1, 0)
    for send in (xs[rank], [xs[rank], MPI.DOUBLE], [xs[rank], N, "d"], [p, (N, 1)],
                 [p, (None, 1), MPI.DOUBLE], [p, N, 1, "d"]):
        recv = sentinel(N + 2, F64)
        comm.Allreduce(send, [recv, (N, 2), MPI.DOUBLE], op=mcr.MIN)
        expect(recv, padded(want, 2, 0), f"Allreduce {send}")
    buf = padded(xs[rank], 0, 2)
    comm.Allreduce(mcr.IN_PLACE, [buf, N], op=mcr.MIN)
    expect(buf, padded(want, 0, 2), "Allreduce IN_PLACE [buf, N]")
    xs, recv = operands(size, N, torch.int32, "SUM"), sentinel(N + 1, torch.int32)
    comm.Scan([xs[rank], 4, MPI.INT], [recv, (4, 1), MPI.INT])  # op SUM
    expect(recv, padded(reduce_ref(xs[:rank + 1], "SUM")[:4], 1, N - 4), "Scan")
    ys, recv = operands(size, N, torch.int32, "MAX"), sentinel(N, torch.int32)
    comm.Exscan([ys[rank], 2], [recv, 2], op=mcr.MAX)
    if rank > 0:
        expect(recv, padded(reduce_ref(ys[:rank], "MAX")[:2], 0, N - 2), "Exscan")
    counts = [(i * 2 + 1) % 4 for i in range(size)]
    counts[-1], start = 0, sum(counts[:rank])
    xs = operands(size, sum(counts), F32, "SUM")
    want = reduce_ref(xs, "SUM")[start:start + counts[rank]]
    for c in int_forms(counts):
        recv = sentinel(counts[rank] + 2, F32)      # longer than the block: the rest stays
        comm.Reduce_scatter(xs[rank], recv, c)      # op SUM
        expect(recv, padded(want, 0, 2), f"Reduce_scatter recvcounts {c!r}")
        buf = copy(xs[rank])
        comm.Reduce_scatter(mcr.IN_PLACE, buf, recvcounts=c, op=mcr.SUM)
        expect(buf[:counts[rank]], want, f"Reduce_scatter IN_PLACE recvcounts {c!r}")
    xs, recv = operands(size, 2 * size, F32, "SUM"), sentinel(2, F32)
    comm.Reduce_scatter(xs[rank], recv)             # no recvcounts: equal blocks
    expect(recv, reduce_ref(xs, "SUM")[2 * rank:2 * rank + 2], "Reduce_scatter defaults")
    recv = sentinel(2, torch.int32)
    comm.Reduce_scatter(torch.zeros(0, dtype=torch.int32), recv, [0] * size, op=mcr.SUM)
    expect(recv, sentinel(2, torch.int32), "Reduce_scatter every count 0")


# -- empty, one-element and large messages --------------------------------------------
@case
def empty_and_one_element_messages(comm):
    size, rank = comm.size, comm.rank
    found = Findings()
    for (method, maker), k, (i, dtype) in itertools.product(
            {"Gather": gather_maker, "Scatter": scatter_maker, "Allgather": allgather_maker,
             "Alltoall": alltoall_maker}.items(), (0, 1), enumerate(MOVE_TYPES)):
        for in_place, root in itertools.product(
                (False, True), roots(size) if method in ("Gather", "Scatter") else [0]):
            make = maker(comm, dtype, root, in_place, "packed", k=k)
            for form in ("blocking", "nonblocking"):
                run(comm, found, f"blocks of {k} on {name(dtype)}{' IN_PLACE' * in_place} "
                    f"root {root}", "mpi", form, method, make, i)
    for n, form in itertools.product((0, 1, 1000), ("blocking", "nonblocking")):
        for root in roots(size):
            want = rank_data(root, n, F64, n)
            buf = copy(want) if rank == root else sentinel(n, F64)
            call(comm, form, "Bcast", buf, root)
            expect(buf, want, f"Bcast {form} of {n}")
        for dtype in (torch.float16, torch.bfloat16, torch.int64):
            xs, recv = operands(size, n, dtype, "SUM", n), sentinel(n, dtype)
            call(comm, form, "Allreduce", xs[rank], recv)       # op SUM
            expect(recv, reduce_ref(xs, "SUM"), f"Allreduce {form} of {n}")
    for root in roots(size):                    # every count 0
        recv = torch.zeros(0) if rank == root else None
        comm.Gatherv(torch.zeros(0), [recv, [0] * size] if rank == root else None, root=root)
        recv = sentinel(2, F32)
        comm.Gatherv(torch.zeros(0), [recv, [0] * size, [1] * size], root=root)
        expect(recv, sentinel(2, F32), "Gatherv every count 0")
    zeros, recv = [0] * size, sentinel(3, torch.int32)
    comm.Alltoallv([torch.zeros(2, dtype=torch.int32), zeros, [1] * size],
                   [recv, zeros, [2] * size])
    expect(recv, sentinel(3, torch.int32), "Alltoallv every count 0")
    empty = torch.zeros(0, dtype=torch.int32)
    comm.Alltoallv([empty, zeros], [empty.clone(), zeros])
    found.report()


@case
def large_messages(comm):
    """Segmented and pipelined algorithms (the half types' user-defined ops see partial counts)."""
    size, rank, root = comm.size, comm.rank, comm.size - 1
    n = (1 << 16) + 3
    for seed, (dtype, op) in enumerate([(torch.float16, "SUM"), (torch.bfloat16, "SUM"),
                                        (torch.float16, "MAX"), (torch.bfloat16, "PROD"),
                                        (F32, "MIN"), (torch.int8, "BXOR")]):
        xs, what = operands(size, n, dtype, op, seed), f"{op} on {dtype}"
        want = reduce_ref(xs, op)
        recv = sentinel(n, dtype)
        comm.Allreduce(xs[rank], recv, OPS[op])
        expect(recv, want, f"Allreduce {what}")
        recv = sentinel(n, dtype) if rank == root else None
        comm.Reduce(xs[rank], recv, OPS[op], root=root)
        if rank == root:
            expect(recv, want, f"Reduce {what}")
        counts = [n // size + (i < n % size) for i in range(size)]
        start, recv = sum(counts[:rank]), sentinel(counts[rank], dtype)
        comm.Reduce_scatter(xs[rank], recv, counts, OPS[op])
        expect(recv, want[start:start + counts[rank]], f"Reduce_scatter {what}")
        buf = copy(xs[rank])
        comm.Scan(mcr.IN_PLACE, buf, OPS[op])
        expect(buf, reduce_ref(xs[:rank + 1], op), f"Scan {what}")
    n = 1 << 17
    for dtype in (F32, torch.bfloat16, torch.uint8):
        want = rank_data(root, n, dtype, 1)
        buf = copy(want) if rank == root else sentinel(n, dtype)
        comm.Bcast(buf, root=root)
        expect(buf, want, f"Bcast on {dtype}")
        counts = [(n // 4) * (i % 3) + i for i in range(size)]     # rank 0's empty
        for method, r in (("Gatherv", 0), ("Scatterv", root)):
            check_vector(comm, "blocking", method, dtype, explicit(counts, "reversed"), root=r)
    n, found = 1 << 15, Findings()
    for dtype in (F64, torch.float16, torch.int8):
        for method, maker in (("Allgather", allgather_maker), ("Alltoall", alltoall_maker)):
            run(comm, found, f"blocks of {n} on {dtype}", "mpi", "blocking", method,
                maker(comm, dtype, 0, False, None, k=n))
        check_vector(comm, "blocking", "Allgatherv", dtype,
                     explicit([(n // 3) * (i % 3) + i for i in range(size)], "gaps"))

        def count(i, j):
            return (n // 4) * ((i + 2 * j) % 3) + i
        check_vector(comm, "blocking", "Alltoallv", dtype,
                     explicit([count(rank, j) for j in range(size)], "packed"),
                     explicit([count(j, rank) for j in range(size)], "reversed"))
    found.report()


@case
def reduce_scatter_in_place_with_blocks_longer_than_their_start(comm):
    """MPICH 5.0.2 copies each result from its block to the start of the buffer with memcpy, and
    aborts where the two overlap (rank 1's 3k elements at k, from about 512 KiB); mcr passes a
    copy of the input there. Every form; the persistent one started twice on new data."""
    size, rank, k = comm.size, comm.rank, 1 << 15
    counts = [3 * k if r == 1 else k for r in range(size)]
    start, mine = sum(counts[:rank]), counts[rank]
    for form in ("blocking", "nonblocking", "persistent"):
        buf = torch.empty(sum(counts), dtype=F32)
        if form == "persistent":
            preq = comm.Reduce_scatter_init(mcr.IN_PLACE, buf, counts, mcr.SUM)
        for turn in range(2 if form == "persistent" else 1):
            xs = operands(size, sum(counts), F32, "SUM", turn)
            buf.copy_(xs[rank])
            if form == "persistent":
                preq.Start()
                preq.Wait()
            else:
                call(comm, form, "Reduce_scatter", mcr.IN_PLACE, buf, counts, mcr.SUM)
            expect(buf[:mine], reduce_ref(xs, "SUM")[start:start + mine], f"{form} {turn}")
    preq.Free()


# -- numpy, buffer-protocol objects, the mpi4py namespace -----------------------------
NUMPY_MOVE = [np.float32, np.float16, np.int64, np.int8, np.complex128]
NUMPY_REDUCE = [(np.float64, "PROD"), (np.float64, "SUM"), (np.float16, "MAX"),
                (np.float16, "MIN"), (np.int32, "BAND"), (np.int32, "MAX"), (np.int32, "BOR"),
                (np.int64, "SUM"), (np.uint8, "MIN"), (np.uint8, "BAND"), (np.uint8, "BXOR"),
                (np.int8, "BOR"), (np.bool_, "LOR"), (np.complex64, "SUM"),
                (np.complex128, "PROD")]


@case
def numpy_types_beyond_the_matrix(comm):
    """Operation.variants on the numpy element types and reductions above, on MPI."""
    found = Findings()
    for method, operation in OPERATIONS.items():
        if method == "Barrier":
            continue
        pairs = NUMPY_REDUCE if operation.reduction else [(t, None) for t in NUMPY_MOVE]
        places = (False, True) if operation.in_place else (False,)
        for (i, (dtype, op)), in_place, root in itertools.product(
                enumerate(pairs), places, roots(comm.size) if operation.rooted else [0]):
            kind = LAYOUTS[(i + root + in_place) % len(LAYOUTS)]
            make = operation.maker(comm, dtype, *((op, root, in_place) if op else
                                                  (root, in_place, kind)))
            what = f"{op or kind} on {name(dtype)}{' IN_PLACE' * in_place} root {root}"
            for form in ("blocking", "nonblocking"):
                run(comm, found, what, "mpi", form, method, make)
    found.report()


@case
def buffer_protocol_objects(comm):
    size, rank = comm.size, comm.rank
    for root in roots(size):
        data = bytes(range(root, root + 16))
        buf = bytearray(data) if rank == root else bytearray(16)
        comm.Bcast(buf, root=root)
        assert bytes(buf) == data
        values = [root * 10 + i for i in range(6)]
        buf = array.array("i", values if rank == root else [0] * 6)
        comm.Bcast(buf, root=root)
        assert buf.tolist() == values
        # a numpy slice (a contiguous view) with a displacement in the spec
        base = np.arange(10, dtype=np.float64) + root if rank == root else np.zeros(10)
        comm.Bcast([base[2:8], (3, 1)], root=root)
        if rank != root:
            expect(base, place(np.zeros(10), [np.arange(3.0, 6.0) + root], [3]))
    buf = bytearray([rank + 1, 2 * rank, 7])              # reduced as uint8
    comm.Allreduce(mcr.IN_PLACE, buf, op=mcr.BXOR)
    want = reduce_ref([np.array([r + 1, 2 * r, 7], np.uint8) for r in range(size)], "BXOR")
    assert list(buf) == want.tolist(), (list(buf), want)


@case
def mpi4py_namespace_and_backend(comm):
    """MPI.COMM_WORLD is an mcr.Comm, backend None/mpi/auto run, mcr.Comm wraps mpi4py's."""
    world = MPI.COMM_WORLD
    assert isinstance(world, mcr.Comm)
    for backend in (None, "mpi", "auto"):
        buf = torch.arange(4.0) if comm.rank == 0 else torch.zeros(4)
        world.Bcast(buf, root=0, backend=backend)
        expect(buf, torch.arange(4.0), f"backend {backend}")
    buf = torch.arange(3) if comm.rank == 0 else torch.zeros(3, dtype=torch.int64)
    mcr.Comm(_mpi4py.COMM_WORLD).Bcast(buf)
    expect(buf, torch.arange(3), "mcr.Comm(mpi4py.MPI.COMM_WORLD)")


# -- nonblocking: many requests at once -------------------------------------------------
MODES = ("waitall", "testall", "reversed", "shuffled", "rotated", "test", "half")


def complete_together(requests, mode, rank, seed):
    """Complete `requests` together; the order of Wait or Test differs by rank."""
    if mode == "waitall":
        statuses = []
        assert mcr.Request.Waitall(requests, statuses) is True
        assert len(statuses) == len(requests)
    elif mode == "testall":
        while not mcr.Request.Testall(requests):
            pass
        # once complete, Testall stays true and Waitall returns at once
        assert mcr.Request.Testall(requests) and mcr.Request.Waitall(requests)
    elif mode == "test":
        pending = requests[::-1] if rank % 2 else list(requests)
        while pending:
            pending = [r for r in pending if not r.Test()]
    else:
        order, s = list(range(len(requests))), rank * 5 % len(requests)
        order = {"reversed": order[::-1], "rotated": order[s:] + order[:s]}.get(mode, order)
        if mode in ("shuffled", "half"):
            random.Random(1000 * seed + rank).shuffle(order)
        for i in order[:len(order) // 2] if mode == "half" else order:
            requests[i].Wait()
        if mode == "half":            # the rest; the completed ones are null now
            assert mcr.Request.Waitall(requests) is True


@case.quick
def many_requests_outstanding(comm):
    """Every variant of every operation on one type posted at once, in the same order on every
    rank (any completion order is deadlock-free), completed together in one of MODES."""
    found = Findings()
    for seed, dtype in enumerate(MOVE_TYPES):
        mode, posted = MODES[seed % len(MODES)], []
        for method, operation in OPERATIONS.items():
            for what, make in operation.variants(comm, [dtype]):
                args, check = make(seed)
                posted.append((f"{method} {what} ({mode})", args, check,
                               getattr(comm, nonblocking(method))(*args)))
        complete_together([p[3] for p in posted], mode, comm.rank, seed)
        for what, args, check, _ in posted:
            with found.check(what):
                check(args)
    found.report()


@case
def request_lifetime(comm):
    """The Request keeps dropped send buffers alive until completion, then is REQUEST_NULL."""
    size, rank = comm.size, comm.rank
    outs, requests = [], []
    for k in range(4):
        outs += [torch.zeros(1000 * size), torch.zeros(1000)]
        requests += [comm.Iallgather(torch.full((1000,), float(rank + k)), outs[-2]),
                     comm.Iallreduce(torch.full((1000,), float(rank * k)), outs[-1])]
    gc.collect()
    junk = [torch.full((1000,), -1.0) for _ in range(50)]   # reuse the freed memory
    mcr.Request.Waitall(requests)
    del junk
    for k in range(4):
        expect(outs[2 * k], cat([torch.full((1000,), float(r + k)) for r in range(size)]))
        expect(outs[2 * k + 1], torch.full((1000,), float(k * sum(range(size)))))
    req = comm.Ibarrier()
    assert req.Wait() is True
    assert not req                        # MPI_REQUEST_NULL
    assert req.Test() is True             # a null request tests complete
    buf = torch.arange(3.0) if comm.rank == 0 else torch.zeros(3)
    req = comm.Ibcast(buf)
    while not req.Test():
        pass
    assert not req
    expect(buf, torch.arange(3.0))
    assert mcr.Request.Waitall([]) is True and mcr.Request.Testall([]) is True


# -- Alltoallw: a count, a byte displacement and a datatype per process on each side ----
# Rank i sends rank j a block whose type and count depend on i + j (both ends agree, a rank's
# blocks differ in type), at 8-byte aligned displacements with a gap before each, in bytes.
W_KINDS = [(np.int32, MPI.INT), (np.float64, MPI.DOUBLE), (np.int16, MPI.SHORT)]
GAP = 0xA5


def w_block(src, dst, salt=0):
    """The datatype and values rank `src` sends rank `dst`."""
    nptype, mpitype = W_KINDS[(src + dst) % 3]
    return mpitype, 1000 * src + 10 * dst + salt + np.arange((src + dst) % 3 + 1, dtype=nptype)


def w_side(comm, kind, sending, salt=0):
    """[buf, counts, displs, datatypes] of a send side (blocks in rank order, written) or a
    receive side (reverse order), and the buffer's bytes."""
    size, rank = comm.size, comm.rank
    blocks = [w_block(rank, p, salt) if sending else w_block(p, rank) for p in range(size)]
    displs, at = [0] * size, 8
    for p in range(size) if sending else reversed(range(size)):
        displs[p] = at
        at += -(-blocks[p][1].nbytes // 8) * 8 + 8
    raw = np.full(at, GAP, np.uint8)
    buf = torch.from_numpy(raw) if kind == "torch" else raw     # the same memory
    for p, (_, values) in enumerate(blocks if sending else ()):
        raw[displs[p]:displs[p] + values.nbytes] = values.view(np.uint8)
    return [buf, [len(v) for _, v in blocks], displs, [t for t, _ in blocks]], raw


def check_received(comm, raw, displs, salt=0):
    want = np.full(raw.nbytes, GAP, np.uint8)
    for i, d in enumerate(displs):
        values = w_block(i, comm.rank, salt)[1]
        want[d:d + values.nbytes] = values.view(np.uint8)
    np.testing.assert_array_equal(raw, want)


@case.quick
def alltoallw_every_form(comm):
    """Blocking, nonblocking, persistent (restarted on new data); torch, numpy; 4 and 3 items."""
    for kind, form in itertools.product(("torch", "numpy"), FORMS):
        smsg, sraw = w_side(comm, kind, True)
        (rbuf, rcounts, rdispls, rtypes), rraw = w_side(comm, kind, False)
        rmsg = [rbuf, (rcounts, rdispls), rtypes]
        if form == "blocking":
            comm.Alltoallw(smsg, rmsg)
        else:
            persistent = form == "persistent"
            req = (comm.Alltoallw_init if persistent else comm.Ialltoallw)(smsg, rmsg)
            assert type(req) is (mcr.Prequest if persistent else mcr.Request), type(req)
            if persistent:
                req.Start()
            req.Wait()
        check_received(comm, rraw, rdispls)
        if form == "persistent":
            sraw[:] = w_side(comm, "numpy", True, salt=5)[1]
            req.Start()
            req.Wait()
            check_received(comm, rraw, rdispls, salt=5)
            req.Free()


@case
def alltoallw_other_forms(comm):
    """IN_PLACE (what goes to i is taken where i's block lands); [buf, datatypes] (one element
    each from the start); a strided datatype; blocks of zero elements (nothing moves)."""
    size, rank = comm.size, comm.rank
    msg, raw = w_side(comm, "torch", True)     # (rank, i) and (i, rank): the same type
    comm.Alltoallw(MPI.IN_PLACE, msg)
    check_received(comm, raw, msg[2])
    x = torch.arange(4, dtype=torch.int32) + 10 * rank
    out = torch.full((size,), -1, dtype=torch.int32)
    comm.Alltoallw([x, [MPI.INT] * size],
                   [out, [1] * size, [4 * i for i in range(size)], [MPI.INT] * size])
    assert out.tolist() == [10 * i for i in range(size)]
    every_other = MPI.INT.Create_vector(2, 1, 2).Commit()
    try:
        y = torch.full((4 * size,), -1, dtype=torch.int32)
        comm.Alltoallw([x, [1] * size, [0] * size, [every_other] * size],
                       [y, [2] * size, [16 * i for i in range(size)], [MPI.INT] * size])
        want = np.full(4 * size, -1, np.int32)
        for i in range(size):
            want[4 * i:4 * i + 2] = [10 * i, 10 * i + 2]
        np.testing.assert_array_equal(y.numpy(), want)
    finally:
        every_other.Free()
    y = np.full(3, -1.0)
    comm.Alltoallw([np.arange(3.0), [0] * size, [10 ** 6] * size, [MPI.DOUBLE] * size],
                   [y, [0] * size, [0] * size, [MPI.DOUBLE] * size])
    np.testing.assert_array_equal(y, -1.0)


@case
def alltoallw_errors(comm):
    """Each mistake raises on every rank before communicating; the comm still works."""
    size = comm.size
    x, y = np.zeros(8, np.float64), np.zeros(8, np.float64)
    doubles, ones, zeros = [MPI.DOUBLE] * size, [1] * size, [0] * size
    good = [y, ones, zeros, doubles]
    for method in (comm.Alltoallw, comm.Ialltoallw, comm.Alltoallw_init):
        for exc, fragments, send, recv in [
                (ValueError, ("recvbuf", f"datatypes has {size + 1} entries", f"expected {size}"),
                 [x, doubles], [y, ones, zeros, doubles + [MPI.DOUBLE]]),
                (ValueError, ("sendbuf", f"counts has {size + 2} entries"),
                 [x, [1] * (size + 2), zeros, doubles], good),
                (ValueError, ("sendbuf", "block 0", "past the buffer of 64 bytes"),
                 [x, [3] * size, [48] * size, doubles], good),
                (ValueError, ("recvbuf", "past the buffer of 64 bytes"),
                 [x, doubles], [y, [9] * size, zeros, doubles]),
                (ValueError, ("displs[0]", "non-negative"), [x, ones, [-8] * size, doubles], good),
                (TypeError, ("datatypes must be a list",), [x, ones, zeros, MPI.DOUBLE], good),
                (TypeError, ("datatypes[0]",), [x, ones, zeros, [8] * size], good),
                (TypeError, ("recvbuf", "got ndarray"), [x, doubles], y),
                (ValueError, ("recvbuf", "2 to 4 items"), [x, doubles], [y]),
                (ValueError, ("BOTTOM needs counts",), [MPI.BOTTOM, doubles], good),
                (BufferError, ("recvbuf", "read-only"), [x, doubles],
                 [b"read-only", [MPI.BYTE] * size])]:
            with raises(exc, *fragments):
                method(send, recv)
        with raises(ValueError, "backend 'gloo'", method.__name__):
            method([x, doubles], good, backend="gloo")
    # blocks that overlap (where each is one run of bytes): two receives, or a send and a receive
    buf = np.arange(4.0 * size) + 100 * comm.rank
    shifted = [y, [2] * size, [8 * i for i in range(size)], doubles]
    overlap = [buf[size - 1:], ones, [8 * i for i in range(size)], doubles]
    for method in (comm.Alltoallw, comm.Ialltoallw, comm.Alltoallw_init):
        if size > 1:
            with raises(ValueError, "recvbuf: recvbuf's block 0 (bytes 0..15 of recvbuf) and "
                                    "recvbuf's block 1 (bytes 8..23 of recvbuf) overlap"):
                method([x, doubles], shifted)
        with raises(ValueError, "sendbuf and recvbuf overlap in memory: sendbuf's block "
                                f"{size - 1} (bytes {8 * size - 8}..{8 * size - 1} of sendbuf) and "
                                "recvbuf's block 0 (bytes 0..7 of recvbuf)", "IN_PLACE"):
            method([buf, ones, [8 * i for i in range(size)], doubles], overlap)
    # one buffer, apart: element i goes to process i, comes back at size + i; and interleaved
    # blocks of a datatype with holes (MPI's to judge): odd elements receive what even ones sent
    comm.Alltoallw([buf, ones, [8 * i for i in range(size)], doubles],
                   [buf, ones, [8 * (size + i) for i in range(size)], doubles])
    np.testing.assert_array_equal(buf[size:2 * size], [comm.rank + 100 * j for j in range(size)])
    buf = np.arange(4.0 * size) + 100 * comm.rank
    pairs = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
    comm.Alltoallw([buf, ones, [32 * i for i in range(size)], [pairs] * size],
                   [buf, ones, [32 * i + 8 for i in range(size)], [pairs] * size])
    pairs.Free()
    np.testing.assert_array_equal(buf[1::2], [4 * comm.rank + 2 * (k % 2) + 100 * (k // 2)
                                              for k in range(2 * size)])
    if size == 1:   # mcr moves the block itself: a smaller receive is MPI's truncation error
        x, y = np.arange(4, dtype=np.float64), np.zeros(4)
        with raises(mcr.Exception, "truncat"):
            comm.Alltoallw([x, [3], [8], [MPI.DOUBLE]], [y, [2], [0], [MPI.DOUBLE]])
        y = np.zeros(4)
        comm.Alltoallw([x, [3], [8], [MPI.DOUBLE]], [y, [3], [8], [MPI.DOUBLE]])
        np.testing.assert_array_equal(y, [0, 1, 2, 3])
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)
