"""All-to-all data movement: Allgather, Allgatherv, Alltoall, Alltoallv.

Every case runs on all ranks at world sizes 1-4 and checks each rank's result
against torch/numpy on the whole data (see ccoref.py).
"""

import numpy as np
import torch

import mcr
from ccoref import (LAYOUTS, MOVE_DTYPES, NUMPY_DTYPES, int_forms, layout, np_data,
                    np_sentinel, place, sentinel)
from mcr import MPI
from mpiharness import case, mpi_cases
from util import all_data, assert_equal, rank_data

N = 4


def uneven_counts(size, shift=0):
    """Block sizes 0..2, at least one of them 0 (rank `-shift` mod size gets none)."""
    return [(i + shift) % size % 3 for i in range(size)] if size > 1 else [2]


# -- Allgather -----------------------------------------------------------------------


@case
def allgather_every_dtype(comm):
    for seed, dtype in enumerate(MOVE_DTYPES):
        for n in (N, 1):
            data = all_data(comm.size, n, dtype, seed)
            recv = sentinel(comm.size * n, dtype)
            comm.Allgather(data[comm.rank], recv)
            assert_equal(recv, torch.cat(data))


@case
def allgather_in_place(comm):
    for seed, dtype in enumerate(MOVE_DTYPES):
        data = all_data(comm.size, N, dtype, seed)
        recv = sentinel(comm.size * N, dtype)
        recv[comm.rank * N:(comm.rank + 1) * N] = data[comm.rank]
        comm.Allgather(mcr.IN_PLACE, recv)
        assert_equal(recv, torch.cat(data))


@case
def allgather_empty(comm):
    recv = torch.zeros(0, dtype=torch.int32)
    comm.Allgather(torch.zeros(0, dtype=torch.int32), recv)
    comm.Allgather(mcr.IN_PLACE, recv)
    assert recv.numel() == 0


@case
def allgather_spec_forms(comm):
    size, rank, dtype = comm.size, comm.rank, torch.float32
    data = all_data(size, N, dtype)
    expected = torch.cat(data)
    padded = torch.cat([sentinel(1, dtype), data[rank], sentinel(2, dtype)])
    sends = [data[rank], [data[rank], MPI.FLOAT], [data[rank], "f"], [data[rank], N],
             [padded, (N, 1)], [padded, (N, 1), MPI.FLOAT], [padded, N, 1, "f"]]
    lead = torch.cat([sentinel(2, dtype), sentinel(size * N, dtype)])
    recvs = [(lambda b: b, sentinel(size * N, dtype), slice(None)),
             (lambda b: [b, MPI.FLOAT], sentinel(size * N, dtype), slice(None)),
             (lambda b: [b, (None, 2)], lead, slice(2, None)),
             (lambda b: [b, (None, 2), "f"], lead, slice(2, None)),
             (lambda b: [b, None, 2, MPI.FLOAT], lead, slice(2, None))]
    for i, send in enumerate(sends):
        for j, (recv_spec, template, part) in enumerate(recvs):
            recv = template.clone()
            comm.Allgather(send, recv_spec(recv))
            want = template.clone()
            want[part] = expected
            assert torch.equal(recv, want), (i, j, recv, want)


@case
def allgather_alltoall_explicit_count_is_per_process(comm):
    """In mpi4py, the count of an Allgather/Alltoall spec `[buf, count,
    datatype]` is the per-process block count (recvcount/sendcount)."""
    size, rank, dtype = comm.size, comm.rank, torch.float32
    data = all_data(size, N, dtype)
    errors = []
    recv = sentinel(size * N, dtype)
    try:                                  # every rank parses the spec: all fail alike
        comm.Allgather(data[rank], [recv, N, MPI.FLOAT])
    except ValueError as exc:
        errors.append(f"Allgather(sendbuf, [recvbuf, {N}, MPI.FLOAT]): {exc}")
    else:
        if not torch.equal(recv, torch.cat(data)):
            errors.append(f"Allgather(sendbuf, [recvbuf, {N}, MPI.FLOAT]) gave {recv}")
    send = torch.cat(all_data(size, N, dtype, 1 + rank))
    recv = sentinel(size * N, dtype)
    try:
        comm.Alltoall([send, N, MPI.FLOAT], [recv, N, MPI.FLOAT])
    except ValueError as exc:
        errors.append(f"Alltoall([sendbuf, {N}, MPI.FLOAT], [recvbuf, {N}, MPI.FLOAT]): "
                      f"{exc}")
    else:
        expected = torch.cat([torch.cat(all_data(size, N, dtype, 1 + j))[rank * N:
                                                                          (rank + 1) * N]
                              for j in range(size)])
        if not torch.equal(recv, expected):
            errors.append(f"Alltoall([sendbuf, {N}, MPI.FLOAT], [recvbuf, {N}, MPI.FLOAT]) "
                          f"gave {recv}, expected {expected}")
    assert not errors, "\n".join(errors)


@case
def allgather_numpy(comm):
    for seed, dtype in enumerate(NUMPY_DTYPES):
        data = [np_data(r, N, dtype, seed) for r in range(comm.size)]
        recv = np_sentinel(comm.size * N, dtype)
        comm.Allgather(data[comm.rank], recv)
        np.testing.assert_array_equal(recv, np.concatenate(data))
        recv = np_sentinel(comm.size * N, dtype)
        recv[comm.rank * N:(comm.rank + 1) * N] = data[comm.rank]
        comm.Allgather(mcr.IN_PLACE, recv)
        np.testing.assert_array_equal(recv, np.concatenate(data))


# -- Allgatherv ----------------------------------------------------------------------


@case
def allgatherv_uneven_every_dtype_and_layout(comm):
    size, rank = comm.size, comm.rank
    for shift in range(min(size, 2)):
        counts = uneven_counts(size, shift)
        for kind in LAYOUTS:
            displs, length = layout(counts, kind)
            for seed, dtype in enumerate(MOVE_DTYPES):
                blocks = [d[:c] for d, c in zip(all_data(size, 2, dtype, seed), counts)]
                recv = sentinel(length, dtype)
                comm.Allgatherv(blocks[rank], [recv, counts, displs])
                assert_equal(recv, place(sentinel(length, dtype), blocks, displs))


@case
def allgatherv_in_place(comm):
    size, rank = comm.size, comm.rank
    counts = [size - i for i in range(size)]
    counts[size // 2] = 0
    for kind in LAYOUTS:
        displs, length = layout(counts, kind)
        for seed, dtype in enumerate(MOVE_DTYPES):
            blocks = [d[:c] for d, c in zip(all_data(size, size, dtype, seed), counts)]
            recv = place(sentinel(length, dtype), [blocks[rank]], [displs[rank]])
            comm.Allgatherv(mcr.IN_PLACE, [recv, (counts, displs)])
            assert_equal(recv, place(sentinel(length, dtype), blocks, displs))


@case
def allgatherv_spec_and_count_forms(comm):
    size, rank, dtype = comm.size, comm.rank, torch.int64
    counts = uneven_counts(size, 1)
    blocks = [d[:c] for d, c in zip(all_data(size, 2, dtype), counts)]
    displs, length = layout(counts, "gaps")
    packed, plength = layout(counts, "packed")
    specs = []
    for c, d in zip(int_forms(counts), int_forms(displs)):
        specs += [(lambda b, c=c, d=d: [b, c, d], displs, length),
                  (lambda b, c=c, d=d: [b, (c, d)], displs, length),
                  (lambda b, c=c, d=d: [b, c, d, MPI.INT64_T], displs, length),
                  (lambda b, c=c, d=d: [b, (c, d), MPI.INT64_T], displs, length),
                  (lambda b, c=c, d=d: [b, (c, d), "q"], displs, length),
                  (lambda b, c=c: [b, (c, None)], packed, plength)]
        # right after the buffer a 2-tuple is (counts, displs), as in mpi4py:
        # counts alone are given as any sequence but a tuple
        if not isinstance(c, tuple):
            specs += [(lambda b, c=c: [b, c], packed, plength),
                      (lambda b, c=c: [b, c, MPI.INT64_T], packed, plength)]
    for i, (spec, where, n) in enumerate(specs):
        recv = sentinel(n, dtype)
        comm.Allgatherv(blocks[rank], spec(recv))
        expected = place(sentinel(n, dtype), blocks, where)
        assert torch.equal(recv, expected), (i, recv, expected)
    # no counts (equal blocks) and a scalar count
    data = all_data(size, 3, dtype)
    for spec in (lambda b: b, lambda b: [b, MPI.INT64_T], lambda b: [b, 3]):
        recv = sentinel(3 * size, dtype)
        comm.Allgatherv(data[rank], spec(recv))
        assert_equal(recv, torch.cat(data))
    # (count, stride): equal blocks every `stride` elements
    strided = place(sentinel(5 * size, dtype), data, [5 * i for i in range(size)])
    for spec in (lambda b: [b, (3, 5)], lambda b: [b, (3, 5), "q"]):
        recv = sentinel(5 * size, dtype)
        comm.Allgatherv(data[rank], spec(recv))
        assert_equal(recv, strided)


@case
def allgatherv_numpy(comm):
    size, rank = comm.size, comm.rank
    counts = uneven_counts(size)
    displs, length = layout(counts, "reversed")
    for seed, dtype in enumerate(NUMPY_DTYPES):
        blocks = [np_data(r, 2, dtype, seed)[:counts[r]] for r in range(size)]
        recv = np_sentinel(length, dtype)
        expected = place(np_sentinel(length, dtype), blocks, displs)
        comm.Allgatherv(blocks[rank], [recv, np.array(counts), np.array(displs)])
        np.testing.assert_array_equal(recv, expected)
        recv = place(np_sentinel(length, dtype), [blocks[rank]], [displs[rank]])
        comm.Allgatherv(mcr.IN_PLACE, [recv, (counts, displs)])
        np.testing.assert_array_equal(recv, expected)


# -- Alltoall ------------------------------------------------------------------------


def alltoall_send(rank, size, n, dtype, seed):
    """Rank `rank`'s send buffer: block j (n elements) goes to rank j."""
    return torch.cat([rank_data(rank * size + j, n, dtype, seed) for j in range(size)])


def alltoall_expected(rank, size, n, dtype, seed):
    return torch.cat([alltoall_send(j, size, n, dtype, seed)[rank * n:(rank + 1) * n]
                      for j in range(size)])


@case
def alltoall_every_dtype(comm):
    size, rank = comm.size, comm.rank
    for seed, dtype in enumerate(MOVE_DTYPES):
        for n in (N, 1):
            recv = sentinel(size * n, dtype)
            comm.Alltoall(alltoall_send(rank, size, n, dtype, seed), recv)
            assert_equal(recv, alltoall_expected(rank, size, n, dtype, seed))


@case
def alltoall_in_place(comm):
    size, rank = comm.size, comm.rank
    for seed, dtype in enumerate(MOVE_DTYPES):
        buf = alltoall_send(rank, size, N, dtype, seed)
        comm.Alltoall(mcr.IN_PLACE, buf)
        assert_equal(buf, alltoall_expected(rank, size, N, dtype, seed))


@case
def alltoall_spec_forms(comm):
    size, rank, dtype = comm.size, comm.rank, torch.float64
    send = alltoall_send(rank, size, N, dtype, 0)
    expected = alltoall_expected(rank, size, N, dtype, 0)
    lead = torch.cat([sentinel(1, dtype), send])
    sends = [send, [send, MPI.DOUBLE], [send, "d"], [lead, (None, 1)],
             [lead, None, 1, MPI.DOUBLE]]
    tail = torch.cat([sentinel(size * N, dtype), sentinel(3, dtype)])
    recvs = [(lambda b: b, sentinel(size * N, dtype), slice(None)),
             (lambda b: [b, MPI.DOUBLE], sentinel(size * N, dtype), slice(None)),
             (lambda b: [b[:size * N], "d"], tail, slice(0, size * N))]
    for i, s in enumerate(sends):
        for j, (recv_spec, template, part) in enumerate(recvs):
            recv = template.clone()
            comm.Alltoall(s, recv_spec(recv))
            want = template.clone()
            want[part] = expected
            assert torch.equal(recv, want), (i, j, recv, want)


def to_numpy(t, dtype):
    """An int64 tensor as a numpy array of `dtype` (bool: odd values are True)."""
    a = t.numpy()
    return (a % 2).astype(dtype) if dtype == np.bool_ else a.astype(dtype)


@case
def alltoall_numpy(comm):
    size, rank = comm.size, comm.rank
    for seed, dtype in enumerate(NUMPY_DTYPES):
        send = to_numpy(alltoall_send(rank, size, 2, torch.int64, seed), dtype)
        expected = to_numpy(alltoall_expected(rank, size, 2, torch.int64, seed), dtype)
        recv = np_sentinel(2 * size, dtype)
        comm.Alltoall(send, recv)
        np.testing.assert_array_equal(recv, expected)
        comm.Alltoall(mcr.IN_PLACE, send)
        np.testing.assert_array_equal(send, expected)


# -- Alltoallv -----------------------------------------------------------------------


def v_count(i, j, size):
    """Elements rank i sends to rank j: uneven, with zeros (0..2)."""
    return (i + 2 * j + size) % 3


def v_send(i, size, kind, dtype, seed):
    """Rank i's Alltoallv send side: (buffer, counts, displs, blocks)."""
    counts = [v_count(i, j, size) for j in range(size)]
    displs, length = layout(counts, kind)
    blocks = [rank_data(i * size + j, 2, dtype, seed)[:c] for j, c in enumerate(counts)]
    return place(sentinel(length, dtype), blocks, displs), counts, displs, blocks


@case
def alltoallv_uneven_every_dtype_and_layout(comm):
    size, rank = comm.size, comm.rank
    for skind in LAYOUTS:
        rkind = LAYOUTS[(LAYOUTS.index(skind) + 1) % len(LAYOUTS)]
        for seed, dtype in enumerate(MOVE_DTYPES):
            send, scounts, sdispls, _ = v_send(rank, size, skind, dtype, seed)
            rcounts = [v_count(j, rank, size) for j in range(size)]
            rdispls, rlength = layout(rcounts, rkind)
            recv = sentinel(rlength, dtype)
            comm.Alltoallv([send, scounts, sdispls], [recv, rcounts, rdispls])
            incoming = [v_send(j, size, skind, dtype, seed)[3][rank] for j in range(size)]
            assert_equal(recv, place(sentinel(rlength, dtype), incoming, rdispls))


@case
def alltoallv_spec_and_count_forms(comm):
    size, rank, dtype = comm.size, comm.rank, torch.float32
    send, scounts, sdispls, _ = v_send(rank, size, "reversed", dtype, 0)
    psend, _, pdispls, _ = v_send(rank, size, "packed", dtype, 0)
    rcounts = [v_count(j, rank, size) for j in range(size)]
    rdispls, rlength = layout(rcounts, "gaps")
    packed, plength = layout(rcounts, "packed")
    incoming = [v_send(j, size, "packed", dtype, 0)[3][rank] for j in range(size)]
    pairs = []
    for (sc, sd), (rc, rd) in zip(zip(int_forms(scounts), int_forms(sdispls)),
                                  reversed(list(zip(int_forms(rcounts),
                                                    int_forms(rdispls))))):
        pairs += [([send, sc, sd], lambda b, rc=rc, rd=rd: [b, rc, rd], rdispls, rlength),
                  ([send, (sc, sd)], lambda b, rc=rc, rd=rd: [b, (rc, rd)], rdispls,
                   rlength),
                  ([send, sc, sd, MPI.FLOAT], lambda b, rc=rc, rd=rd: [b, rc, rd, "f"],
                   rdispls, rlength),
                  ([send, (sc, sd), "f"], lambda b, rc=rc, rd=rd: [b, (rc, rd), MPI.FLOAT],
                   rdispls, rlength),
                  ([psend, (sc, None)], lambda b, rc=rc: [b, (rc, None), "f"], packed,
                   plength)]
        # right after the buffer a 2-tuple is (counts, displs), as in mpi4py:
        # counts alone are given as any sequence but a tuple
        if not isinstance(sc, tuple) and not isinstance(rc, tuple):
            pairs += [([psend, sc], lambda b, rc=rc: [b, rc], packed, plength),
                      ([psend, sc, MPI.FLOAT], lambda b, rc=rc: [b, rc, "f"], packed,
                       plength)]
    for i, (s, recv_spec, where, n) in enumerate(pairs):
        recv = sentinel(n, dtype)
        comm.Alltoallv(s, recv_spec(recv))
        expected = place(sentinel(n, dtype), incoming, where)
        assert torch.equal(recv, expected), (i, recv, expected)
    # equal blocks: no counts, and a scalar count
    for s, r in ((lambda b: b, lambda b: b), (lambda b: [b, 2], lambda b: [b, 2, "f"])):
        recv = sentinel(2 * size, dtype)
        comm.Alltoallv(s(alltoall_send(rank, size, 2, dtype, 0)), r(recv))
        assert_equal(recv, alltoall_expected(rank, size, 2, dtype, 0))
    # (count, stride): equal blocks every `stride` elements, on both sides
    send = alltoall_send(rank, size, 2, dtype, 0)
    strided = place(sentinel(3 * size, dtype), [send[2 * j:2 * j + 2] for j in range(size)],
                    [3 * j for j in range(size)])
    expected = alltoall_expected(rank, size, 2, dtype, 0)
    recv = sentinel(4 * size, dtype)
    comm.Alltoallv([strided, (2, 3)], [recv, (2, 4), MPI.FLOAT])
    assert_equal(recv, place(sentinel(4 * size, dtype),
                             [expected[2 * j:2 * j + 2] for j in range(size)],
                             [4 * j for j in range(size)]))


def symmetric_count(i, j):
    """Alltoallv with IN_PLACE takes both directions from one counts array, so
    what i sends to j must equal what j sends to i."""
    return (i + j) % 3


@case
def alltoallv_in_place(comm):
    size, rank = comm.size, comm.rank

    def initial(i, kind, dtype, seed):
        counts = [symmetric_count(i, j) for j in range(size)]
        displs, length = layout(counts, kind)
        blocks = [rank_data(i * size + j, 2, dtype, seed)[:c] for j, c in enumerate(counts)]
        return place(sentinel(length, dtype), blocks, displs), counts, displs, blocks

    for kind in LAYOUTS:
        for seed, dtype in enumerate(MOVE_DTYPES):
            buf, counts, displs, _ = initial(rank, kind, dtype, seed)
            length = len(buf)
            comm.Alltoallv(mcr.IN_PLACE, [buf, counts, displs])
            incoming = [initial(j, kind, dtype, seed)[3][rank] for j in range(size)]
            assert_equal(buf, place(sentinel(length, dtype), incoming, displs))


@case
def alltoallv_all_counts_zero(comm):
    zeros = [0] * comm.size
    recv = sentinel(3, torch.int32)
    comm.Alltoallv([torch.zeros(2, dtype=torch.int32), zeros, [1] * comm.size],
                   [recv, zeros, [2] * comm.size])
    assert_equal(recv, sentinel(3, torch.int32))
    empty = torch.zeros(0, dtype=torch.int32)
    comm.Alltoallv([empty, zeros], [empty.clone(), zeros])


@case
def alltoallv_numpy(comm):
    size, rank = comm.size, comm.rank
    for seed, dtype in enumerate(NUMPY_DTYPES):
        send, scounts, sdispls, _ = v_send(rank, size, "gaps", torch.int64, seed)
        rcounts = [v_count(j, rank, size) for j in range(size)]
        rdispls, rlength = layout(rcounts, "reversed")
        incoming = [to_numpy(v_send(j, size, "gaps", torch.int64, seed)[3][rank], dtype)
                    for j in range(size)]
        recv = np_sentinel(rlength, dtype)
        comm.Alltoallv([to_numpy(send, dtype), np.array(scounts), np.array(sdispls)],
                       [recv, np.array(rcounts, dtype=np.int32), rdispls])
        np.testing.assert_array_equal(recv, place(np_sentinel(rlength, dtype), incoming,
                                                  rdispls))


# -- large messages (segmented and pipelined algorithms) ----------------------------


@case
def large_messages(comm):
    size, rank = comm.size, comm.rank
    n = 1 << 15
    for dtype in (torch.float64, torch.float16, torch.int8):
        data = all_data(size, n, dtype, 3)
        recv = sentinel(size * n, dtype)
        comm.Allgather(data[rank], recv)
        assert_equal(recv, torch.cat(data))
        counts = [(n // 3) * (i % 3) + i for i in range(size)]
        displs, length = layout(counts, "gaps")
        blocks = [d[:c] for d, c in zip(data, counts)]
        recv = sentinel(length, dtype)
        comm.Allgatherv(blocks[rank], [recv, counts, displs])
        assert_equal(recv, place(sentinel(length, dtype), blocks, displs))
        recv = sentinel(size * n, dtype)
        comm.Alltoall(alltoall_send(rank, size, n, dtype, 4), recv)
        assert_equal(recv, alltoall_expected(rank, size, n, dtype, 4))

        def count(i, j):
            return (n // 4) * ((i + 2 * j) % 3) + i

        def send(i):
            cs = [count(i, j) for j in range(size)]
            ds, _ = layout(cs, "packed")
            blocks = [rank_data(i * size + j, c, dtype, 5) for j, c in enumerate(cs)]
            return torch.cat(blocks), cs, ds

        buf, scounts, sdispls = send(rank)
        rcounts = [count(j, rank) for j in range(size)]
        rdispls, rlength = layout(rcounts, "reversed")
        recv = sentinel(rlength, dtype)
        comm.Alltoallv([buf, scounts, sdispls], [recv, rcounts, rdispls])
        incoming = []
        for j in range(size):
            jbuf, jcounts, jdispls = send(j)
            incoming.append(jbuf[jdispls[rank]:jdispls[rank] + jcounts[rank]])
        assert_equal(recv, place(sentinel(rlength, dtype), incoming, rdispls))


test_mpi = mpi_cases(__name__)
