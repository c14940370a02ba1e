"""Rooted data movement: Bcast, Gather, Gatherv, Scatter, Scatterv.

Every case runs on all ranks at world sizes 1-4, with the first and the last
rank as root, and checks each rank's result against torch/numpy on the whole
data (see ccoref.py).
"""

import array

import numpy as np
import torch
from mpi4py import MPI as _mpi4py

import mcr
from ccoref import (LAYOUTS, MOVE_DTYPES, NUMPY_DTYPES, int_forms, layout, np_data,
                    np_sentinel, place, roots, sentinel)
from mcr import MPI
from mpiharness import case, mpi_cases
from util import all_data, assert_equal, rank_data

N = 5


def uneven_counts(size, shift=0):
    """Block sizes 0..2, at least one of them 0 (rank `-shift` mod size gets none)."""
    return [(i + shift) % size % 3 for i in range(size)] if size > 1 else [2]


# -- Bcast --------------------------------------------------------------------------


@case
def bcast_every_dtype_and_root(comm):
    for root in roots(comm.size):
        for seed, dtype in enumerate(MOVE_DTYPES):
            expected = rank_data(root, N, dtype, seed)
            buf = expected.clone() if comm.rank == root else sentinel(N, dtype)
            comm.Bcast(buf, root=root)
            assert_equal(buf, expected)


@case
def bcast_empty_and_longer(comm):
    for root in roots(comm.size):
        for n in (0, 1, 1000):
            expected = rank_data(root, n, torch.float64, n)
            buf = expected.clone() if comm.rank == root else sentinel(n, torch.float64)
            comm.Bcast(buf, root)
            assert_equal(buf, expected)


@case
def bcast_spec_forms(comm):
    """Counts, displacements and datatypes select part of the buffer; the rest
    is untouched on the receivers."""
    n = 8
    root = comm.size - 1
    dtype = torch.float32
    full = rank_data(root, n, dtype)
    blank = sentinel(n, dtype)

    def region(lo, hi):
        return torch.cat([blank[:lo], full[lo:hi], blank[hi:]])

    forms = [  # (make spec from buffer, region moved)
        (lambda b: [b, 3], (0, 3)),
        (lambda b: [b, 0], (0, 0)),
        (lambda b: [b, MPI.FLOAT], (0, n)),
        (lambda b: [b, "f"], (0, n)),
        (lambda b: [b, 3, MPI.FLOAT], (0, 3)),
        (lambda b: [b, 3, "f"], (0, 3)),
        (lambda b: [b, (3, 2)], (2, 5)),
        (lambda b: [b, (None, 2)], (2, n)),
        (lambda b: [b, (3, 2), MPI.FLOAT], (2, 5)),
        (lambda b: [b, 3, 5, MPI.FLOAT], (5, 8)),
        (lambda b: [b, 3, 5, "f"], (5, 8)),
        (lambda b: [b, (0, n)], (n, n)),
    ]
    for i, (spec, (lo, hi)) in enumerate(forms):
        buf = full.clone() if comm.rank == root else blank.clone()
        comm.Bcast(spec(buf), root=root)
        expected = full if comm.rank == root else region(lo, hi)
        assert torch.equal(buf, expected), (i, buf, expected)
    # explicit MPI datatypes matching other element types
    for dtype, datatype in [(torch.float64, MPI.DOUBLE), (torch.int32, MPI.INT),
                            (torch.int64, MPI.INT64_T), (torch.int8, MPI.SIGNED_CHAR),
                            (torch.uint8, MPI.UNSIGNED_CHAR),
                            (torch.complex128, MPI.C_DOUBLE_COMPLEX),
                            (torch.bool, MPI.C_BOOL)]:
        expected = rank_data(root, n, dtype, 3)
        buf = expected.clone() if comm.rank == root else sentinel(n, dtype)
        comm.Bcast([buf, n, datatype], root=root)
        assert_equal(buf, expected)


@case
def bcast_numpy_and_buffers(comm):
    for root in roots(comm.size):
        for seed, dtype in enumerate(NUMPY_DTYPES):
            expected = np_data(root, N, dtype, seed)
            buf = expected.copy() if comm.rank == root else np_sentinel(N, dtype)
            comm.Bcast(buf, root=root)
            assert buf.dtype == dtype
            np.testing.assert_array_equal(buf, expected)
        # bytearray and array.array through the buffer protocol
        data = bytes(range(root, root + 16))
        buf = bytearray(data) if comm.rank == root else bytearray(16)
        comm.Bcast(buf, root=root)
        assert bytes(buf) == data
        values = [root * 10 + i for i in range(6)]
        buf = array.array("i", values if comm.rank == root else [0] * 6)
        comm.Bcast(buf, root=root)
        assert buf.tolist() == values
        # a numpy slice (contiguous view) with a displacement in the spec
        base = np.arange(10, dtype=np.float64) + root if comm.rank == root else np.zeros(10)
        comm.Bcast([base[2:8], (3, 1)], root=root)
        expected = np.zeros(10)
        expected[3:6] = np.arange(3, 6) + root
        if comm.rank != root:
            np.testing.assert_array_equal(base, expected)


@case
def bcast_mpi4py_namespace_and_backend(comm):
    """`mcr.MPI.COMM_WORLD` is an mcr.Comm, and backend="mpi"/"auto" run the call."""
    world = MPI.COMM_WORLD
    assert isinstance(world, mcr.Comm)
    for backend in (None, "mpi", "auto"):
        buf = torch.arange(4.0) if comm.rank == 0 else torch.zeros(4)
        world.Bcast(buf, root=0, backend=backend)
        assert_equal(buf, torch.arange(4.0))
    # a Comm wrapping an mpi4py communicator
    wrapped = mcr.Comm(_mpi4py.COMM_WORLD)
    buf = torch.arange(3) if comm.rank == 0 else torch.zeros(3, dtype=torch.int64)
    wrapped.Bcast(buf)
    assert_equal(buf, torch.arange(3))


# -- Gather -------------------------------------------------------------------------


@case
def gather_every_dtype_and_root(comm):
    for root in roots(comm.size):
        for seed, dtype in enumerate(MOVE_DTYPES):
            data = all_data(comm.size, N, dtype, seed)
            recv = sentinel(comm.size * N, dtype) if comm.rank == root else None
            comm.Gather(data[comm.rank], recv, root=root)
            if comm.rank == root:
                assert_equal(recv, torch.cat(data))


@case
def gather_in_place_at_root(comm):
    for root in roots(comm.size):
        for seed, dtype in enumerate(MOVE_DTYPES):
            data = all_data(comm.size, N, dtype, seed)
            if comm.rank == root:
                recv = sentinel(comm.size * N, dtype)
                recv[root * N:(root + 1) * N] = data[root]
                comm.Gather(mcr.IN_PLACE, recv, root=root)
                assert_equal(recv, torch.cat(data))
            else:
                comm.Gather(data[comm.rank], None, root=root)


@case
def gather_spec_forms(comm):
    """Receive specs with inferred counts and datatypes; send specs that take
    part of a larger buffer."""
    size, rank, dtype = comm.size, comm.rank, torch.float32
    data = all_data(size, N, dtype)
    expected = torch.cat(data)
    padded = torch.cat([sentinel(2, dtype), data[rank], sentinel(3, dtype)])
    sends = [data[rank], [data[rank], MPI.FLOAT], [data[rank], N], [data[rank], N, "f"],
             [padded, (N, 2)], [padded, N, 2, MPI.FLOAT], [padded, (N, 2), "f"]]
    recvs = [lambda b: b, lambda b: [b, MPI.FLOAT], lambda b: [b, "f"]]
    for i, send in enumerate(sends):
        for j, recv_spec in enumerate(recvs):
            root = (i + j) % size
            recv = sentinel(size * N, dtype)
            comm.Gather(send, recv_spec(recv) if rank == root else None, root=root)
            if rank == root:
                assert torch.equal(recv, expected), (i, j, recv)
    # a view into a larger tensor receives in place
    recv = sentinel(size * N + 4, dtype)
    comm.Gather(data[rank], [recv[:size * N], MPI.FLOAT], root=0)
    if rank == 0:
        assert_equal(recv, torch.cat([expected, sentinel(4, dtype)]))


@case
def gather_scatter_explicit_count_is_per_process(comm):
    """In mpi4py, the count of a Gather/Scatter spec `[buf, count, datatype]` is
    the per-process block count (it becomes recvcount/sendcount).

    Only the root parses that spec: if it rejects it, the root completes the
    collective with a plain buffer (so that no rank is left waiting) and the
    case fails at the end.
    """
    size, rank, dtype = comm.size, comm.rank, torch.float32
    data = all_data(size, N, dtype)
    errors = []
    recv = sentinel(size * N, dtype)
    if rank == 0:
        try:
            comm.Gather(data[rank], [recv, N, MPI.FLOAT], root=0)
        except ValueError as exc:
            errors.append(f"Gather(sendbuf, [recvbuf, {N}, MPI.FLOAT]): {exc}")
            comm.Gather(data[rank], recv, root=0)
        else:
            assert_equal(recv, torch.cat(data))
    else:
        comm.Gather(data[rank], None, root=0)
    recv = sentinel(N, dtype)
    if rank == 0:
        send = torch.cat(data)
        try:
            comm.Scatter([send, N, MPI.FLOAT], recv, root=0)
        except ValueError as exc:
            errors.append(f"Scatter([sendbuf, {N}, MPI.FLOAT], recvbuf): {exc}")
            comm.Scatter(send, recv, root=0)
    else:
        comm.Scatter(None, recv, root=0)
    assert_equal(recv, data[rank])
    assert not errors, "\n".join(errors)


@case
def gather_numpy(comm):
    for root in roots(comm.size):
        for seed, dtype in enumerate(NUMPY_DTYPES):
            data = [np_data(r, N, dtype, seed) for r in range(comm.size)]
            if comm.rank == root:
                recv = np_sentinel(comm.size * N, dtype)
                comm.Gather(data[comm.rank], recv, root=root)
                np.testing.assert_array_equal(recv, np.concatenate(data))
                recv = np_sentinel(comm.size * N, dtype)
                recv[root * N:(root + 1) * N] = data[root]
                comm.Gather(mcr.IN_PLACE, recv, root=root)
                np.testing.assert_array_equal(recv, np.concatenate(data))
            else:
                comm.Gather(data[comm.rank], None, root=root)
                comm.Gather(data[comm.rank], None, root=root)


# -- Gatherv -------------------------------------------------------------------------


def gatherv_expected(data, counts, displs, length, dtype):
    return place(sentinel(length, dtype), [d[:c] for d, c in zip(data, counts)], displs)


@case
def gatherv_uneven_every_dtype_layout_and_root(comm):
    size, rank = comm.size, comm.rank
    for shift in range(min(size, 2)):
        counts = uneven_counts(size, shift)
        for kind in LAYOUTS:
            displs, length = layout(counts, kind)
            for root in roots(size):
                for seed, dtype in enumerate(MOVE_DTYPES):
                    data = all_data(size, 3, dtype, seed)
                    send = data[rank][:counts[rank]]
                    recv = sentinel(length, dtype) if rank == root else None
                    comm.Gatherv(send, [recv, counts, displs] if rank == root else None,
                                 root=root)
                    if rank == root:
                        assert_equal(recv, gatherv_expected(data, counts, displs,
                                                            length, dtype))


@case
def gatherv_in_place_at_root(comm):
    size, rank = comm.size, comm.rank
    counts = [i + 1 for i in range(size)]
    counts[0] = 0
    for kind in LAYOUTS:
        displs, length = layout(counts, kind)
        for root in roots(size):
            for seed, dtype in enumerate(MOVE_DTYPES):
                data = all_data(size, size + 1, dtype, seed)
                blocks = [d[:c] for d, c in zip(data, counts)]
                if rank == root:
                    recv = place(sentinel(length, dtype), [blocks[root]], [displs[root]])
                    comm.Gatherv(mcr.IN_PLACE, [recv, (counts, displs)], root=root)
                    assert_equal(recv, place(sentinel(length, dtype), blocks, displs))
                else:
                    comm.Gatherv(blocks[rank], None, root=root)


@case
def gatherv_spec_and_count_forms(comm):
    """Every vector spec form, with counts/displacements as lists, tuples,
    torch int tensors and numpy int arrays."""
    size, rank, dtype = comm.size, comm.rank, torch.float32
    counts = uneven_counts(size, 1)
    data = all_data(size, 3, dtype)
    blocks = [d[:c] for d, c in zip(data, counts)]
    displs, length = layout(counts, "reversed")
    packed, plength = layout(counts, "packed")
    specs = []
    for c, d in zip(int_forms(counts), int_forms(displs)):
        specs += [
            (lambda b, c=c, d=d: [b, c, d], displs, length),
            (lambda b, c=c, d=d: [b, (c, d)], displs, length),
            (lambda b, c=c, d=d: [b, c, d, MPI.FLOAT], displs, length),
            (lambda b, c=c, d=d: [b, (c, d), MPI.FLOAT], displs, length),
            (lambda b, c=c, d=d: [b, (c, d), "f"], displs, length),
            (lambda b, c=c: [b, (c, None)], packed, plength),
            (lambda b, c=c: [b, (c, None), MPI.FLOAT], packed, plength),
        ]
        # right after the buffer a 2-tuple is (counts, displs), as in mpi4py:
        # counts alone are given as any sequence but a tuple
        if not isinstance(c, tuple):
            specs += [(lambda b, c=c: [b, c], packed, plength),
                      (lambda b, c=c: [b, c, MPI.FLOAT], packed, plength)]
    for i, (spec, where, n) in enumerate(specs):
        root = i % size
        recv = sentinel(n, dtype)
        comm.Gatherv(blocks[rank], spec(recv) if rank == root else None, root=root)
        if rank == root:
            expected = place(sentinel(n, dtype), blocks, where)
            assert torch.equal(recv, expected), (i, recv, expected)
    # no counts: equal blocks; a scalar count: that many from every process
    for spec in (lambda b: b, lambda b: [b, MPI.FLOAT], lambda b: [b, 3],
                 lambda b: [b, 3, MPI.FLOAT]):
        recv = sentinel(3 * size, dtype)
        comm.Gatherv(data[rank], spec(recv) if rank == 0 else None, root=0)
        if rank == 0:
            assert_equal(recv, torch.cat(data))
    # (count, stride): equal blocks every `stride` elements
    strided = place(sentinel(4 * size, dtype), data, [4 * i for i in range(size)])
    for spec in (lambda b: [b, (3, 4)], lambda b: [b, (3, 4), MPI.FLOAT]):
        recv = sentinel(4 * size, dtype)
        comm.Gatherv(data[rank], spec(recv) if rank == size - 1 else None, root=size - 1)
        if rank == size - 1:
            assert_equal(recv, strided)


@case
def gatherv_all_counts_zero(comm):
    for root in roots(comm.size):
        recv = torch.zeros(0) if comm.rank == root else None
        comm.Gatherv(torch.zeros(0), [recv, [0] * comm.size] if recv is not None else None,
                     root=root)
        recv = sentinel(2, torch.float32)
        comm.Gatherv(torch.zeros(0), [recv, [0] * comm.size, [1] * comm.size], root=root)
        assert_equal(recv, sentinel(2, torch.float32))


@case
def gatherv_numpy(comm):
    size, rank = comm.size, comm.rank
    counts = uneven_counts(size)
    displs, length = layout(counts, "gaps")
    for root in roots(size):
        for seed, dtype in enumerate(NUMPY_DTYPES):
            data = [np_data(r, 3, dtype, seed)[:counts[r]] for r in range(size)]
            recv = np_sentinel(length, dtype) if rank == root else None
            comm.Gatherv(data[rank], [recv, np.array(counts), np.array(displs)]
                         if rank == root else None, root=root)
            if rank == root:
                np.testing.assert_array_equal(
                    recv, place(np_sentinel(length, dtype), data, displs))


# -- Scatter -------------------------------------------------------------------------


@case
def scatter_every_dtype_and_root(comm):
    for root in roots(comm.size):
        for seed, dtype in enumerate(MOVE_DTYPES):
            data = all_data(comm.size, N, dtype, seed)
            send = torch.cat(data) if comm.rank == root else None
            recv = sentinel(N, dtype)
            comm.Scatter(send, recv, root=root)
            assert_equal(recv, data[comm.rank])


@case
def scatter_in_place_at_root(comm):
    for root in roots(comm.size):
        for seed, dtype in enumerate(MOVE_DTYPES):
            data = all_data(comm.size, N, dtype, seed)
            if comm.rank == root:
                send = torch.cat(data)
                comm.Scatter(send, mcr.IN_PLACE, root=root)
                assert_equal(send, torch.cat(data))   # the root's block stays put
            else:
                recv = sentinel(N, dtype)
                comm.Scatter(None, recv, root=root)
                assert_equal(recv, data[comm.rank])


@case
def scatter_spec_forms(comm):
    size, rank, dtype = comm.size, comm.rank, torch.float64
    data = all_data(size, N, dtype)
    whole = torch.cat(data)
    # an explicit count in a Scatter send spec is per process in mpi4py (see
    # gather_scatter_explicit_count_is_per_process); here the count is inferred
    lead = torch.cat([sentinel(1, dtype), whole])
    sends = [lambda: whole, lambda: [whole, MPI.DOUBLE], lambda: [whole, "d"],
             lambda: [lead, (None, 1)], lambda: [lead, (None, 1), "d"],
             lambda: [lead, None, 1, MPI.DOUBLE]]
    big = torch.cat([sentinel(1, dtype), sentinel(N, dtype), sentinel(2, dtype)])
    recvs = [(lambda b: b, sentinel(N, dtype), slice(None)),
             (lambda b: [b, MPI.DOUBLE], sentinel(N, dtype), slice(None)),
             (lambda b: [b, N], big, slice(0, N)),
             (lambda b: [b, (N, 1)], big, slice(1, N + 1)),
             (lambda b: [b, N, 1, MPI.DOUBLE], big, slice(1, N + 1))]
    for i, send in enumerate(sends):
        for j, (recv_spec, template, part) in enumerate(recvs):
            root = (i + j) % size
            recv = template.clone()
            comm.Scatter(send() if rank == root else None, recv_spec(recv), root=root)
            expected = template.clone()
            expected[part] = data[rank]
            assert torch.equal(recv, expected), (i, j, recv, expected)


@case
def scatter_numpy(comm):
    for root in roots(comm.size):
        for seed, dtype in enumerate(NUMPY_DTYPES):
            data = [np_data(r, N, dtype, seed) for r in range(comm.size)]
            send = np.concatenate(data) if comm.rank == root else None
            recv = np_sentinel(N, dtype)
            comm.Scatter(send, recv, root=root)
            np.testing.assert_array_equal(recv, data[comm.rank])
            if comm.rank == root:
                comm.Scatter(send, mcr.IN_PLACE, root=root)
                np.testing.assert_array_equal(send, np.concatenate(data))
            else:
                recv = np_sentinel(N, dtype)
                comm.Scatter(None, recv, root=root)
                np.testing.assert_array_equal(recv, data[comm.rank])


# -- Scatterv -------------------------------------------------------------------------


def scatterv_source(size, counts, displs, length, dtype, seed):
    """The root's send buffer: block i (rank_data of i) at displs[i], sentinel elsewhere."""
    blocks = [rank_data(i, 3, dtype, seed)[:c] for i, c in enumerate(counts)]
    return place(sentinel(length, dtype), blocks, displs), blocks


@case
def scatterv_uneven_every_dtype_layout_and_root(comm):
    size, rank = comm.size, comm.rank
    for shift in range(min(size, 2)):
        counts = uneven_counts(size, shift)
        for kind in LAYOUTS:
            displs, length = layout(counts, kind)
            for root in roots(size):
                for seed, dtype in enumerate(MOVE_DTYPES):
                    send, blocks = scatterv_source(size, counts, displs, length, dtype,
                                                   seed)
                    recv = sentinel(counts[rank], dtype)
                    comm.Scatterv([send, counts, displs] if rank == root else None, recv,
                                  root=root)
                    assert_equal(recv, blocks[rank])


@case
def scatterv_in_place_at_root(comm):
    size, rank = comm.size, comm.rank
    counts = [i + 1 for i in range(size)]
    counts[-1] = 0
    for kind in LAYOUTS:
        displs, length = layout(counts, kind)
        for root in roots(size):
            for seed, dtype in enumerate(MOVE_DTYPES):
                send, blocks = scatterv_source(size, counts, displs, length, dtype, seed)
                if rank == root:
                    before = send.clone()
                    comm.Scatterv([send, (counts, displs)], mcr.IN_PLACE, root=root)
                    assert_equal(send, before)
                else:
                    recv = sentinel(counts[rank], dtype)
                    comm.Scatterv(None, recv, root=root)
                    assert_equal(recv, blocks[rank])


@case
def scatterv_spec_and_count_forms(comm):
    size, rank, dtype = comm.size, comm.rank, torch.float32
    counts = uneven_counts(size, 1)
    displs, length = layout(counts, "gaps")
    packed, plength = layout(counts, "packed")
    send, blocks = scatterv_source(size, counts, displs, length, dtype, 0)
    psend, _ = scatterv_source(size, counts, packed, plength, dtype, 0)
    specs = []
    for c, d in zip(int_forms(counts), int_forms(displs)):
        specs += [lambda c=c, d=d: [send, c, d],
                  lambda c=c, d=d: [send, (c, d)],
                  lambda c=c, d=d: [send, c, d, MPI.FLOAT],
                  lambda c=c, d=d: [send, (c, d), "f"],
                  lambda c=c, d=d: [send, (c, d), MPI.FLOAT],
                  lambda c=c: [psend, (c, None), "f"]]
        # right after the buffer a 2-tuple is (counts, displs), as in mpi4py:
        # counts alone are given as any sequence but a tuple
        if not isinstance(c, tuple):
            specs += [lambda c=c: [psend, c], lambda c=c: [psend, c, MPI.FLOAT]]
    for i, spec in enumerate(specs):
        root = i % size
        recv = sentinel(counts[rank] + 2, dtype)
        # receive into the middle of a larger buffer: [buf, (count, displ)]
        comm.Scatterv(spec() if rank == root else None, [recv, (counts[rank], 1)],
                      root=root)
        expected = place(sentinel(counts[rank] + 2, dtype), [blocks[rank]], [1])
        assert torch.equal(recv, expected), (i, recv, expected)
    # no counts: equal blocks
    data = all_data(size, 2, dtype)
    for spec in (lambda b: b, lambda b: [b, MPI.FLOAT], lambda b: [b, 2]):
        recv = sentinel(2, dtype)
        comm.Scatterv(spec(torch.cat(data)) if rank == 0 else None, recv, root=0)
        assert_equal(recv, data[rank])
    # (count, stride): equal blocks every `stride` elements
    strided = place(sentinel(3 * size, dtype), data, [3 * i for i in range(size)])
    for spec in (lambda b: [b, (2, 3)], lambda b: [b, (2, 3), "f"]):
        recv = sentinel(2, dtype)
        comm.Scatterv(spec(strided) if rank == size - 1 else None, recv, root=size - 1)
        assert_equal(recv, data[rank])


@case
def scatterv_numpy(comm):
    size, rank = comm.size, comm.rank
    counts = uneven_counts(size)
    displs, length = layout(counts, "reversed")
    for root in roots(size):
        for seed, dtype in enumerate(NUMPY_DTYPES):
            blocks = [np_data(r, 3, dtype, seed)[:counts[r]] for r in range(size)]
            send = place(np_sentinel(length, dtype), blocks, displs)
            recv = np_sentinel(counts[rank], dtype)
            comm.Scatterv([send, tuple(counts), np.array(displs, dtype=np.int32)]
                          if rank == root else None, recv, root=root)
            np.testing.assert_array_equal(recv, blocks[rank])


# -- large messages (segmented and pipelined algorithms) ----------------------------


@case
def large_messages(comm):
    size, rank = comm.size, comm.rank
    n = 1 << 17
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        root = size - 1
        expected = rank_data(root, n, dtype, 1)
        buf = expected.clone() if rank == root else sentinel(n, dtype)
        comm.Bcast(buf, root=root)
        assert_equal(buf, expected)
        # uneven blocks, one of them empty, in reverse order
        counts = [(n // 4) * (i % 3) + i for i in range(size)]
        displs, length = layout(counts, "reversed")
        blocks = [rank_data(r, counts[r], dtype, 2) for r in range(size)]
        whole = place(sentinel(length, dtype), blocks, displs)
        recv = sentinel(length, dtype) if rank == 0 else None
        comm.Gatherv(blocks[rank], [recv, counts, displs] if rank == 0 else None, root=0)
        if rank == 0:
            assert_equal(recv, whole)
        recv = sentinel(counts[rank], dtype)
        comm.Scatterv([whole, counts, displs] if rank == root else None, recv, root=root)
        assert_equal(recv, blocks[rank])


test_mpi = mpi_cases(__name__)
