"""Message specs: every form of DESIGN.md, on COMM_SELF and at world sizes 1-4.

Simple messages (`buf`, `[buf, count]`, `[buf, datatype]`,
`[buf, count, datatype]`, `[buf, (count, displ)]`, `[buf, (count, displ),
datatype]`, `[buf, count, displ, datatype]`, mcr's `[buf, count, displ]`),
vector messages (`[buf, counts]`, `[buf, (counts, displs)]`,
`[buf, counts, displs]`, `[buf, counts, displs, datatype]`, ...) with counts
and displacements as lists, tuples and 1-D integer tensors/arrays, None and
IN_PLACE, explicit datatypes as mpi4py Datatype objects and typecode strings,
and unusual buffers: 0-d and empty tensors, nn.Parameter, objects that only
speak DLPack. Expected values are computed with torch/numpy (util.rank_data).
"""

import numpy as np
import torch
from mpi4py import MPI as _mpi4py

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases
from util import all_data, assert_equal, rank_data

N = 8
FILL = -1.0


class DLPackOnly:
    """Exposes a tensor (or array) through __dlpack__/__dlpack_device__ only."""

    def __init__(self, obj):
        self._obj = obj

    def __dlpack__(self, **kwargs):
        return self._obj.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._obj.__dlpack_device__()


class MyTensor(torch.Tensor):
    """A plain tensor subclass, as libraries define them."""


def region(full, lo, hi, n=N, fill=FILL):
    """A length-n float32 buffer: `full[lo:hi]` placed at [lo, hi), `fill` elsewhere."""
    out = torch.full((n,), fill)
    out[lo:hi] = full[lo:hi]
    return out


# (spec maker, (lo, hi) of the elements the spec covers), on an N-element float32 buffer
SIMPLE_FORMS = [
    (lambda b: b, (0, N)),
    (lambda b: [b], (0, N)),
    (lambda b: [b, 3], (0, 3)),
    (lambda b: (b, 3), (0, 3)),
    (lambda b: [b, 0], (0, 0)),
    (lambda b: [b, np.int64(4)], (0, 4)),
    (lambda b: [b, torch.tensor(5)], (0, 5)),
    (lambda b: [b, MPI.FLOAT], (0, N)),
    (lambda b: [b, "f"], (0, N)),
    (lambda b: [b, "f4"], (0, N)),
    (lambda b: [b, 3, MPI.FLOAT], (0, 3)),
    (lambda b: [b, 3, "f"], (0, 3)),
    (lambda b: [b, 3, None], (0, 3)),
    (lambda b: [b, (3, 2)], (2, 5)),
    (lambda b: [b, (None, 6)], (6, N)),
    (lambda b: [b, (0, N)], (N, N)),
    (lambda b: [b, (3, 2), MPI.FLOAT], (2, 5)),
    (lambda b: [b, (3, 2), "f"], (2, 5)),
    (lambda b: [b, 3, 5, MPI.FLOAT], (5, 8)),
    (lambda b: [b, 2, 1, "f"], (1, 3)),
    (lambda b: [b, 3, 4], (4, 7)),            # mcr: [buf, count, displ]
]


def simple_forms_roundtrip(comm, peer_send, peer_recv):
    """Each form on both sides of a Sendrecv and of an Allreduce on COMM_SELF."""
    full = rank_data(peer_recv, N, torch.float32)
    mine = rank_data(comm.rank, N, torch.float32)
    for i, (form, (lo, hi)) in enumerate(SIMPLE_FORMS):
        # send the covered elements into the same place on the other side
        out = torch.full((N,), FILL)
        st = mcr.Status()
        comm.Sendrecv(form(mine), peer_send, i, form(out), peer_recv, i, st)
        assert_equal(out, region(full, lo, hi))
        assert st.Get_count() == hi - lo, (i, st.Get_count())


@case
def simple_forms_sendrecv(comm):
    simple_forms_roundtrip(comm, (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size)


@case
def simple_forms_on_comm_self(comm):
    self_comm = mcr.COMM_SELF
    assert isinstance(self_comm, mcr.Comm) and self_comm.size == 1
    full = rank_data(comm.rank, N, torch.float32, 3)
    for i, (form, (lo, hi)) in enumerate(SIMPLE_FORMS):
        out = torch.full((N,), FILL)
        self_comm.Allreduce(form(full), form(out))
        assert_equal(out, region(full, lo, hi))
        out = torch.full((N,), FILL)
        self_comm.Sendrecv(form(full), 0, i, form(out), 0, i)
        assert_equal(out, region(full, lo, hi))


@case
def simple_forms_in_collectives(comm):
    """Bcast, Allreduce and Allgather with explicit counts, displacements and
    datatypes on either side."""
    size = comm.size
    data = all_data(size, N, torch.float32)
    for i, (form, (lo, hi)) in enumerate(SIMPLE_FORMS):
        root = i % size
        buf = data[root].clone() if comm.rank == root else torch.full((N,), FILL)
        comm.Bcast(form(buf), root)
        expected = data[root] if comm.rank == root else region(data[root], lo, hi)
        assert_equal(buf, expected)
        out = torch.full((N,), FILL)
        comm.Allreduce(form(data[comm.rank]), form(out), op=mcr.SUM)
        assert_equal(out, region(torch.stack(data).sum(0), lo, hi))
    # Allgather: 3 elements from each rank, picked out by displacement, into a typed spec
    out = torch.full((3 * size,), FILL)
    comm.Allgather([data[comm.rank], (3, 2), MPI.FLOAT], [out, "f"])
    assert_equal(out, torch.cat([d[2:5] for d in data]))


@case
def block_collective_counts_are_per_process(comm):
    """As in mpi4py, an explicit count in the message of a block collective
    (Allgather, Alltoall, Gather, Scatter) is the count per process (MPI's
    recvcount/sendcount), not the total; the rest of the buffer is untouched."""
    size, rank = comm.size, comm.rank
    data = all_data(size, 5, torch.float32)
    for rspec in (lambda b: [b, 3], lambda b: [b, 3, MPI.FLOAT], lambda b: [b, 3, "f"],
                  lambda b: [b, (3, 0), MPI.FLOAT]):
        out = torch.full((3 * size + 2,), FILL)
        comm.Allgather([data[rank], 3], rspec(out))
        expected = torch.cat([d[:3] for d in data] + [torch.full((2,), FILL)])
        assert_equal(out, expected)
    # Alltoall: 2 elements to and from each process, out of larger buffers
    sbuf = torch.arange(2 * size + 1, dtype=torch.float32) + 100 * rank
    out = torch.full((2 * size + 1,), FILL)
    comm.Alltoall([sbuf, 2, MPI.FLOAT], [out, 2, MPI.FLOAT])
    expected = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 100 * s
                          for s in range(size)] + [torch.tensor([FILL])])
    assert_equal(out, expected)


# -- vector messages ---------------------------------------------------------------------


def uneven(size):
    """Counts with zeros and a layout with gaps, blocks in reverse rank order."""
    counts = [(i * 2 + 1) % 4 for i in range(size)]          # 1, 3, 1, 3 ... (then zeros)
    counts = [c if i % 3 != 2 else 0 for i, c in enumerate(counts)]
    displs, pos = [0] * size, 1
    for i in reversed(range(size)):
        displs[i] = pos
        pos += counts[i] + 1
    return counts, displs, pos + 1


def int_forms(values):
    """The same integers as list, tuple, torch and numpy 1-D arrays of two widths."""
    return [list(values), tuple(values), torch.tensor(values, dtype=torch.int64),
            torch.tensor(values, dtype=torch.int32), np.array(values, dtype=np.int64),
            np.array(values, dtype=np.int32)]


def gathered(data, counts, displs, total, dtype=torch.float32):
    out = torch.full((total,), FILL, dtype=dtype)
    for r, (c, d) in enumerate(zip(counts, displs)):
        out[d:d + c] = data[r][:c]
    return out


def vector_forms(buf, counts, displs):
    """Every vector form for explicit counts and displacements."""
    return [
        [buf, counts, displs],
        [buf, (counts, displs)],
        [buf, counts, displs, MPI.FLOAT],
        [buf, counts, displs, "f"],
        [buf, (counts, displs), MPI.FLOAT],
        [buf, (counts, displs), "f"],
    ]


@case
def allgatherv_vector_forms(comm):
    size, rank = comm.size, comm.rank
    counts, displs, total = uneven(size)
    data = all_data(size, 4, torch.float32)
    x = data[rank][:counts[rank]]
    expected = gathered(data, counts, displs, total)
    for c in int_forms(counts):
        for d in int_forms(displs):
            for spec_of in (lambda b: vector_forms(b, c, d),):
                for k in range(6):
                    out = torch.full((total,), FILL)
                    comm.Allgatherv(x, spec_of(out)[k])
                    assert_equal(out, expected)
    # displacements inferred from the counts: blocks packed in rank order
    packed = torch.cat([data[r][:counts[r]] for r in range(size)])
    for spec_of in (lambda b, c: [b, c], lambda b, c: [b, (c, None)],
                    lambda b, c: [b, c, None], lambda b, c: [b, c, MPI.FLOAT],
                    lambda b, c: [b, c, "f"], lambda b, c: [b, (c, None), MPI.FLOAT],
                    lambda b, c: [b, c, None, MPI.FLOAT]):
        # a tuple in second place is mpi4py's (counts, displs) pair, not counts
        for c in [c for c in int_forms(counts) if not isinstance(c, tuple)]:
            out = torch.full((sum(counts) + 2,), FILL)
            comm.Allgatherv(x, spec_of(out, c))
            assert_equal(out, torch.cat([packed, torch.full((2,), FILL)]))


@case
def allgatherv_equal_blocks_and_scalar_count(comm):
    size, rank = comm.size, comm.rank
    data = all_data(size, 3, torch.int32)
    expected = torch.cat(data)
    for spec_of in (lambda b: b, lambda b: [b], lambda b: [b, 3], lambda b: [b, np.int32(3)],
                    lambda b: [b, torch.tensor(3)], lambda b: [b, 3, MPI.INT32_T],
                    lambda b: [b, MPI.INT], lambda b: [b, "i"],
                    lambda b: [b, (None, None)],
                    lambda b: [b, 3, list(range(0, 3 * size, 3))]):
        out = torch.zeros(3 * size, dtype=torch.int32)
        comm.Allgatherv(data[rank], spec_of(out))
        assert_equal(out, expected)


@case
def alltoallv_vector_forms_both_sides(comm):
    """Rank r sends (r + j) % 3 elements to rank j, from a gapped layout; the
    receive side is laid out in reverse order. Every form, on both sides."""
    size, rank = comm.size, comm.rank

    def sendcount(src, dst):
        return (src + dst) % 3

    def layout(counts):
        displs, pos = [], 1
        for c in counts:
            displs.append(pos)
            pos += c + 2
        return displs, pos

    scounts = [sendcount(rank, j) for j in range(size)]
    sdispls, stotal = layout(scounts)
    rcounts = [sendcount(i, rank) for i in range(size)]
    rdispls_rev, rtotal = layout(rcounts[::-1])
    rdispls = rdispls_rev[::-1]
    sbuf = rank_data(rank, stotal, torch.float32)
    expected = torch.full((rtotal,), FILL)
    for i in range(size):
        src_buf = rank_data(i, layout([sendcount(i, j) for j in range(size)])[1],
                            torch.float32)
        src_displs = layout([sendcount(i, j) for j in range(size)])[0]
        c = rcounts[i]
        expected[rdispls[i]:rdispls[i] + c] = src_buf[src_displs[rank]:src_displs[rank] + c]
    forms_s = vector_forms(sbuf, scounts, sdispls)
    forms_s[0] = [sbuf, torch.tensor(scounts), np.array(sdispls)]
    for k in range(6):
        out = torch.full((rtotal,), FILL)
        rform = vector_forms(out, rcounts, rdispls)[(k + rank) % 6]
        comm.Alltoallv(forms_s[k], rform)
        assert_equal(out, expected)


@case
def mpi4py_vector_forms_scalar_count_and_stride(comm):
    """mpi4py's vector forms with a single count or an integer (strided)
    displacement: in `[buf, (count, displ)]` a tuple is always (counts, displs),
    and an integer displs means block i starts at i * displs. Run on COMM_SELF
    so that a rejection cannot leave other ranks waiting."""
    self_comm = mcr.COMM_SELF
    x = rank_data(comm.rank, 3, torch.float32)
    expected = torch.cat([x, torch.full((3,), FILL)])
    for spec_of in (lambda b: [b, (3, None)], lambda b: [b, (3, None), MPI.FLOAT],
                    lambda b: [b, (3, 5)], lambda b: [b, ([3], 5), "f"],
                    lambda b: [b, [3], 5, MPI.FLOAT], lambda b: [b, 3, 0, MPI.FLOAT]):
        out = torch.full((6,), FILL)
        self_comm.Allgatherv(x, spec_of(out))
        assert_equal(out, expected)


@case
def gatherv_scatterv_none_off_root(comm):
    """At the root a vector spec; elsewhere the unused buffer is None."""
    size, rank = comm.size, comm.rank
    counts, displs, total = uneven(size)
    data = all_data(size, 4, torch.float64)
    for root in sorted({0, size - 1}):
        out = torch.full((total,), FILL, dtype=torch.float64) if rank == root else None
        rspec = [out, torch.tensor(counts), np.array(displs), MPI.DOUBLE] if rank == root else None
        comm.Gatherv(data[rank][:counts[rank]], rspec, root)
        if rank == root:
            assert_equal(out, gathered(data, counts, displs, total, torch.float64))
        # Scatterv back from the gathered layout
        src = gathered(data, counts, displs, total, torch.float64)
        sspec = [src, (counts, displs), "d"] if rank == root else None
        got = torch.full((4,), FILL, dtype=torch.float64)
        comm.Scatterv(sspec, [got, counts[rank]], root)
        exp = torch.full((4,), FILL, dtype=torch.float64)
        exp[:counts[rank]] = data[rank][:counts[rank]]
        assert_equal(got, exp)
        # non-vector Gather/Scatter: None off the root, too
        out = torch.zeros(2 * size) if rank == root else None
        comm.Gather(rank_data(rank, 2, torch.float32), out, root)
        if rank == root:
            assert_equal(out, torch.cat(all_data(size, 2, torch.float32)))
        got = torch.zeros(2)
        comm.Scatter(torch.cat(all_data(size, 2, torch.float32)) if rank == root else None,
                     got, root)
        assert_equal(got, rank_data(rank, 2, torch.float32))
        res = torch.zeros(2) if rank == root else None
        comm.Reduce(rank_data(rank, 2, torch.float32), res, mcr.SUM, root)
        if rank == root:
            assert_equal(res, torch.stack(all_data(size, 2, torch.float32)).sum(0))


@case
def in_place_forms(comm):
    size, rank = comm.size, comm.rank
    data = all_data(size, 4, torch.float32)
    total = torch.stack(data).sum(0)
    buf = data[rank].clone()
    comm.Allreduce(MPI.IN_PLACE, buf)
    assert_equal(buf, total)
    buf = data[rank].clone()
    comm.Allreduce(mcr.IN_PLACE, [buf, 2, MPI.FLOAT])
    assert_equal(buf, torch.cat([total[:2], data[rank][2:]]))
    # Allgather / Allgatherv: this rank's block already in place
    out = torch.zeros(4 * size)
    out[4 * rank:4 * rank + 4] = data[rank]
    comm.Allgather(MPI.IN_PLACE, out)
    assert_equal(out, torch.cat(data))
    counts, displs, ltotal = uneven(size)
    out = torch.full((ltotal,), FILL)
    out[displs[rank]:displs[rank] + counts[rank]] = data[rank][:counts[rank]]
    comm.Allgatherv(MPI.IN_PLACE, [out, counts, displs])
    assert_equal(out, gathered(data, counts, displs, ltotal))
    # rooted: IN_PLACE at the root only
    root = size - 1
    if rank == root:
        out = torch.zeros(4 * size)
        out[4 * root:] = data[root]
        comm.Gather(MPI.IN_PLACE, out, root)
        assert_equal(out, torch.cat(data))
        red = data[root].clone()
        comm.Reduce(MPI.IN_PLACE, red, mcr.SUM, root)
        assert_equal(red, total)
        whole = torch.cat(data)
        comm.Scatter(whole, MPI.IN_PLACE, root)
    else:
        comm.Gather(data[rank], None, root)
        comm.Reduce(data[rank], None, mcr.SUM, root)
        got = torch.zeros(4)
        comm.Scatter(None, got, root)
        assert_equal(got, data[rank])
    # IN_PLACE Alltoall: every block of recvbuf is replaced
    a = torch.arange(2 * size, dtype=torch.float32) + 100 * rank
    comm.Alltoall(MPI.IN_PLACE, a)
    assert_equal(a, torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32)
                               + 100 * s for s in range(size)]))


@case
def none_as_empty_message(comm):
    # None with PROC_NULL, as mpi4py accepts it
    comm.Send(None, MPI.PROC_NULL)
    comm.Recv(None, MPI.PROC_NULL)
    comm.Isend(None, MPI.PROC_NULL).Wait()
    comm.Irecv(None, MPI.PROC_NULL).Wait()
    st = mcr.Status()
    comm.Sendrecv(None, MPI.PROC_NULL, 0, None, MPI.PROC_NULL, 0, st)
    assert st.source == MPI.PROC_NULL
    # and as an empty message to a real peer
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    st = mcr.Status()
    comm.Sendrecv(None, right, 3, None, left, 3, st)
    assert st.source == left and st.tag == 3 and st.Get_count() == 0


@case
def none_and_bottom_buffers_make_empty_messages(comm):
    """[None, datatype], [None, 0, datatype], [BOTTOM, 0, BYTE]: empty messages,
    in point-to-point (a probed message of zero bytes too) and collectives."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    empties = [[None, MPI.INT], [None, 0, MPI.INT], [None, 0, "i"], [None, "B"],
               [MPI.BOTTOM, 0, MPI.BYTE], [MPI.BOTTOM, "B"], [None, 0, 0, MPI.INT],
               (None, (0, None), MPI.INT), None]
    for i, empty in enumerate(empties):
        st = mcr.Status()
        comm.Sendrecv(empty, right, i, empty, left, i, st)
        assert (st.source, st.tag, st.Get_count(MPI.BYTE)) == (left, i, 0)
        rreq = comm.Irecv(empty, left, i)
        comm.Isend(empty, right, i).Wait()
        rreq.Wait()
    # a probed message of zero bytes, received into None (mpi4py.util.pkl5 does this)
    sreq = comm.Isend([None, 0, MPI.BYTE], right, 7)
    st = mcr.Status()
    comm.Probe(left, 7, st)
    assert st.Get_count(MPI.BYTE) == 0
    comm.Recv([None, st.Get_count(MPI.BYTE), MPI.BYTE], left, 7)
    sreq.Wait()
    null_b, null_v = [None, MPI.INT], [None, (0, None), MPI.INT]
    comm.Bcast(null_b)
    comm.Gather(null_b, null_b)
    comm.Scatter(null_b, null_b)
    comm.Allgather(null_b, null_b)
    comm.Alltoall(null_b, null_b)
    comm.Gatherv(null_b, null_v)
    comm.Scatterv(null_v, null_b)
    comm.Allgatherv(null_b, null_v)
    comm.Alltoallv(null_v, null_v)
    comm.Allgatherv([None, 0, MPI.FLOAT], [None, 0, MPI.FLOAT])


@case
def none_sendbuf_is_in_place(comm):
    """As in mpi4py, None stands for IN_PLACE where IN_PLACE is allowed: the
    sendbuf of Allgather, Alltoall and the reductions, at the root of Gather
    and Reduce, and the recvbuf of Scatter at its root."""
    size, rank = comm.size, comm.rank
    data = all_data(size, 3, torch.float32)
    total = torch.stack(data).sum(0)
    out = torch.zeros(3 * size)
    out[3 * rank:3 * rank + 3] = data[rank]
    comm.Allgather(None, out)
    assert_equal(out, torch.cat(data))
    counts, displs, ltotal = uneven(size)
    out = torch.full((ltotal,), FILL)
    out[displs[rank]:displs[rank] + counts[rank]] = data[rank][:counts[rank]]
    comm.Allgatherv(None, [out, counts, displs])
    assert_equal(out, gathered(data, counts, displs, ltotal))
    a = torch.arange(size, dtype=torch.float32) + 100 * rank
    comm.Alltoall(None, a)
    assert_equal(a, torch.arange(size, dtype=torch.float32) * 100 + rank)
    for method, want in (("Allreduce", total), ("Scan", torch.stack(data[:rank + 1]).sum(0))):
        buf = data[rank].clone()
        getattr(comm, method)(None, buf)
        assert_equal(buf, want)
    buf = torch.cat(data) * (rank + 1)       # block r of every rank is data[r] x (rank + 1)
    comm.Reduce_scatter_block(None, buf)
    assert_equal(buf[:3], data[rank] * (size * (size + 1) // 2))
    root = size - 1
    if rank == root:
        out = torch.zeros(3 * size)
        out[3 * root:] = data[root]
        comm.Gather(None, out, root)
        assert_equal(out, torch.cat(data))
        red = data[root].clone()
        comm.Reduce(None, red, mcr.SUM, root)
        assert_equal(red, total)
        whole = torch.cat(data)
        comm.Scatter(whole, None, root)
        assert_equal(whole, torch.cat(data))          # the root's block stays
    else:
        comm.Gather(data[rank], None, root)
        comm.Reduce(data[rank], None, mcr.SUM, root)
        got = torch.zeros(3)
        comm.Scatter(None, got, root)
        assert_equal(got, data[rank])


@case
def vector_counts_inferred_unevenly(comm):
    """A vector buffer without counts is split as mpi4py splits it: the first
    n % size blocks one element longer."""
    size, rank = comm.size, comm.rank
    n = 2 * size + 1
    counts = [n // size + (i < n % size) for i in range(size)]
    displs = [sum(counts[:i]) for i in range(size)]
    data = all_data(size, 3, torch.float64)
    out = torch.full((n,), FILL, dtype=torch.float64)
    comm.Allgatherv(data[rank][:counts[rank]], out)
    assert_equal(out, torch.cat([data[i][:counts[i]] for i in range(size)]))
    got = torch.full((counts[rank],), FILL, dtype=torch.float64)
    comm.Scatterv(out if rank == 0 else None, got, 0)
    assert_equal(got, out[displs[rank]:displs[rank] + counts[rank]])


@case
def reduce_scatter_counts_are_each_recvbuf(comm):
    """Reduce_scatter without recvcounts: each process receives what its
    recvbuf holds (rank r: r + 1 elements), as in mpi4py."""
    size, rank = comm.size, comm.rank
    counts = [r + 1 for r in range(size)]
    n = sum(counts)
    data = all_data(size, n, torch.float32)
    total = torch.stack(data).sum(0)
    mine = total[sum(counts[:rank]):sum(counts[:rank + 1])]
    out = torch.zeros(counts[rank])
    comm.Reduce_scatter(data[rank], out, None, mcr.SUM)
    assert_equal(out, mine)
    out = torch.zeros(counts[rank])
    comm.Ireduce_scatter(data[rank], out, None, mcr.SUM).Wait()
    assert_equal(out, mine)
    out = torch.zeros(counts[rank])
    req = comm.Reduce_scatter_init(data[rank], out, None, mcr.SUM)
    req.Start()
    req.Wait()
    req.Free()
    assert_equal(out, mine)
    # numpy buffers, and an empty block on rank 0
    counts = [0] + [2] * (size - 1)
    x = np.arange(sum(counts), dtype=np.int32) * (rank + 1)
    out = np.zeros(counts[rank], dtype=np.int32)
    comm.Reduce_scatter(x, out, None, mcr.SUM)
    start = sum(counts[:rank])
    want = np.arange(sum(counts), dtype=np.int32) * (size * (size + 1) // 2)
    np.testing.assert_array_equal(out, want[start:start + counts[rank]])


# -- explicit datatypes: mpi4py Datatype objects and typecodes ------------------------


TYPED = [  # (torch dtype, mpi4py datatype, typecodes)
    (torch.float32, MPI.FLOAT, ["f", "f4"]),
    (torch.float64, MPI.DOUBLE, ["d", "f8"]),
    (torch.float16, None, ["e"]),
    (torch.int8, MPI.INT8_T, ["b", "i1"]),
    (torch.int8, MPI.SIGNED_CHAR, []),
    (torch.uint8, MPI.UINT8_T, ["B", "u1"]),
    (torch.uint8, MPI.UNSIGNED_CHAR, []),
    (torch.int16, MPI.SHORT, ["h", "i2"]),
    (torch.uint16, MPI.UINT16_T, ["H", "u2"]),
    (torch.int32, MPI.INT, ["i", "i4"]),
    (torch.int32, MPI.INT32_T, []),
    (torch.uint32, MPI.UINT32_T, ["I", "u4"]),
    (torch.int64, MPI.INT64_T, ["q", "i8"]),
    (torch.int64, MPI.LONG_LONG, ["l"]),
    (torch.uint64, MPI.UINT64_T, ["Q", "u8"]),
    (torch.bool, MPI.C_BOOL, ["?", "b1"]),
    (torch.complex64, MPI.C_FLOAT_COMPLEX, ["F", "Zf", "c8"]),
    (torch.complex128, MPI.C_DOUBLE_COMPLEX, ["D", "Zd", "c16"]),
]


@case
def explicit_datatypes_and_typecodes(comm):
    """Allreduce (the reduction follows the explicit datatype) and Allgather
    with each datatype object and typecode of each element type."""
    size, rank = comm.size, comm.rank
    for seed, (dtype, datatype, codes) in enumerate(TYPED):
        data = all_data(size, 3, dtype, seed)
        op = mcr.LOR if dtype == torch.bool else mcr.SUM
        if dtype == torch.bool:
            total = torch.stack(data).any(0)
        else:
            total = torch.stack(data).to(torch.int64 if not dtype.is_floating_point and
                                         not dtype.is_complex else dtype).sum(0).to(dtype)
        for t in ([datatype] if datatype is not None else []) + codes:
            out = torch.zeros(3, dtype=dtype)
            comm.Allreduce([data[rank], t], [out, 3, t], op)
            assert_equal(out, total)
            g = torch.zeros(3 * size, dtype=dtype)
            comm.Allgather([data[rank], 3, t], [g, t])
            assert_equal(g, torch.cat(data))


@case
def mpi4py_datatypes_on_numpy_and_bytes(comm):
    size, rank = comm.size, comm.rank
    x = np.arange(4, dtype=np.float64) + rank
    g = np.zeros(4 * size)
    comm.Allgather([x, MPI.DOUBLE], [g, MPI.DOUBLE])
    np.testing.assert_array_equal(g, np.concatenate([np.arange(4.0) + r for r in range(size)]))
    # MPI.BYTE moves raw bytes: counts are in bytes
    raw = bytearray(8 * size)
    comm.Allgather([rank_data(rank, 2, torch.float32), MPI.BYTE], [raw, MPI.BYTE])
    assert_equal(torch.frombuffer(raw, dtype=torch.float32), torch.cat(all_data(size, 2)))
    # a derived datatype: pairs of floats
    pair = MPI.FLOAT.Create_contiguous(2).Commit()
    try:
        y = rank_data(rank, 6, torch.float32)
        out = torch.full((4 * size,), FILL)
        comm.Allgather([y, 2, pair], [out, pair])             # 4 floats from each rank
        assert_equal(out, torch.cat([rank_data(r, 6, torch.float32)[:4] for r in range(size)]))
        out = torch.full((6,), FILL)
        right, left = (rank + 1) % size, (rank - 1) % size
        st = mcr.Status()
        comm.Sendrecv([y, 3, pair], right, 0, [out, pair], left, 0, st)
        assert_equal(out, rank_data(left, 6, torch.float32))
        assert st.Get_count(pair) == 3 and st.Get_count(MPI.FLOAT) == 6
    finally:
        pair.Free()


# -- unusual buffers -----------------------------------------------------------------------


@case
def zero_d_tensors(comm):
    size, rank = comm.size, comm.rank
    x = torch.tensor(float(rank + 1))
    y = torch.tensor(0.0)
    comm.Allreduce(x, y)
    assert y.shape == () and y.item() == sum(range(1, size + 1))
    b = torch.tensor(7, dtype=torch.int64) if rank == 0 else torch.tensor(0, dtype=torch.int64)
    comm.Bcast(b, 0)
    assert b.item() == 7 and b.shape == ()
    g = torch.zeros(size)
    comm.Allgather(x, g)
    assert_equal(g, torch.arange(1, size + 1, dtype=torch.float32))
    z = torch.tensor(0j, dtype=torch.complex64)
    st = mcr.Status()
    comm.Sendrecv(torch.tensor(1 + 1j * rank, dtype=torch.complex64), (rank + 1) % size, 0,
                  z, (rank - 1) % size, 0, st)
    assert z.item() == 1 + 1j * ((rank - 1) % size) and st.Get_count() == 1
    # a 0-d numpy array
    a = np.array(0.0)
    comm.Allreduce(np.array(2.0), a)
    assert a.shape == () and a == 2.0 * size


@case
def empty_tensors(comm):
    size, rank = comm.size, comm.rank
    for e in (torch.empty(0), torch.empty(0, 3), torch.empty(2, 0, dtype=torch.float64),
              np.empty(0), bytearray()):
        st = mcr.Status()
        comm.Sendrecv(e, (rank + 1) % size, 0, e, (rank - 1) % size, 0, st)
        assert st.Get_count() == 0
    e = torch.empty(0)
    comm.Allreduce(e, torch.empty(0))
    comm.Allreduce(MPI.IN_PLACE, torch.empty(0, dtype=torch.int32))
    comm.Bcast(torch.empty(0, dtype=torch.bfloat16), 0)
    comm.Allgather(e, torch.empty(0))
    comm.Alltoall(torch.empty(0), torch.empty(0))
    comm.Allgatherv(e, [torch.empty(0), [0] * size])
    # an empty contribution from some ranks into a non-empty result
    counts = [r % 2 for r in range(size)]
    out = torch.full((sum(counts),), FILL)
    comm.Allgatherv(torch.full((counts[rank],), float(rank)), [out, counts])
    assert_equal(out, torch.tensor([float(r) for r in range(size) if r % 2]))
    req = comm.Irecv(torch.empty(0), (rank - 1) % size, 9)
    comm.Send(torch.empty(0), (rank + 1) % size, 9)
    st = mcr.Status()
    req.Wait(st)
    assert st.Get_count() == 0 and st.source == (rank - 1) % size


@case
def parameters_and_tensor_subclasses(comm):
    size, rank = comm.size, comm.rank
    p = torch.nn.Parameter(torch.full((3,), float(rank + 1)))
    out = torch.nn.Parameter(torch.zeros(3))
    comm.Allreduce(p, out)
    assert isinstance(out, torch.nn.Parameter)
    assert torch.equal(out.detach(), torch.full((3,), float(sum(range(1, size + 1)))))
    comm.Allreduce(MPI.IN_PLACE, p)                  # a leaf that requires grad
    assert torch.equal(p.detach(), torch.full((3,), float(sum(range(1, size + 1)))))
    assert p.requires_grad
    g = torch.zeros(3 * size).as_subclass(MyTensor)
    comm.Allgather(torch.ones(3).as_subclass(MyTensor) * rank, g)
    assert type(g) is MyTensor
    assert torch.equal(g.as_subclass(torch.Tensor),
                       torch.arange(size, dtype=torch.float32).repeat_interleave(3))
    q = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64), requires_grad=False)
    comm.Sendrecv([p.detach().double(), 3], (rank + 1) % size, 0, [q, (3, 1)], (rank - 1) % size, 0)
    assert torch.equal(q.detach(), torch.tensor([0.0] + [float(sum(range(1, size + 1)))] * 3,
                                                dtype=torch.float64))


@case
def dlpack_only_objects(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    assert not hasattr(DLPackOnly(torch.zeros(1)), "__array__")
    src = rank_data(rank, 5, torch.int32)
    dst = torch.zeros(5, dtype=torch.int32)
    st = mcr.Status()
    comm.Sendrecv(DLPackOnly(src), right, 0, DLPackOnly(dst), left, 0, st)
    assert_equal(dst, rank_data(left, 5, torch.int32))
    assert st.Get_count() == 5
    # inside message specs, in collectives, around numpy arrays
    out = torch.full((N,), FILL)
    comm.Allreduce([DLPackOnly(rank_data(rank, N, torch.float32)), 3, "f"],
                   [DLPackOnly(out), (3, 2)])
    expected = torch.full((N,), FILL)
    expected[2:5] = torch.stack(all_data(size, N))[:, :3].sum(0)
    assert_equal(out, expected)
    arr = np.zeros(2 * size)
    comm.Allgather(DLPackOnly(np.full(2, float(rank))), DLPackOnly(arr))
    np.testing.assert_array_equal(arr, np.repeat(np.arange(size, dtype=np.float64), 2))
    # non-blocking: the request holds the tensor behind the wrapper
    dst = torch.zeros(5, dtype=torch.int32)
    req = comm.Irecv(DLPackOnly(dst), left, 1)
    comm.Send(DLPackOnly(src), right, 1)
    req.Wait()
    assert_equal(dst, rank_data(left, 5, torch.int32))


@case
def mixed_buffer_kinds_in_one_call(comm):
    size, rank = comm.size, comm.rank
    # torch send, numpy receive; numpy send, torch receive; array of the same type
    out = np.zeros(3 * size, np.float32)
    comm.Allgather(rank_data(rank, 3, torch.float32), out)
    np.testing.assert_array_equal(out, torch.cat(all_data(size, 3)).numpy())
    out = torch.zeros(3, dtype=torch.int64)
    comm.Allreduce(rank_data(rank, 3, torch.int64).numpy(), out)
    assert_equal(out, torch.stack(all_data(size, 3, torch.int64)).sum(0))
    # a strided-but-contiguous view with an offset, and a 2-D tensor, as buffers
    big = torch.full((10,), FILL)
    comm.Allreduce(torch.ones(2, 2), big[3:7])
    assert_equal(big, torch.cat([torch.full((3,), FILL), torch.full((4,), float(size)),
                                 torch.full((3,), FILL)]))


# -- in-process, COMM_SELF ------------------------------------------------------------------


def test_simple_forms_in_process():
    comm = mcr.COMM_SELF
    full = rank_data(0, N, torch.float32)
    for i, (form, (lo, hi)) in enumerate(SIMPLE_FORMS):
        out = torch.full((N,), FILL)
        comm.Sendrecv(form(full), 0, i, form(out), 0, i)
        assert_equal(out, region(full, lo, hi))


def test_vector_forms_in_process():
    comm = mcr.COMM_SELF
    x = rank_data(0, 3, torch.float32)
    for c in int_forms([3]):
        for d in int_forms([2]):
            for spec in vector_forms(torch.full((6,), FILL), c, d):
                comm.Allgatherv(x, spec)
                assert_equal(spec[0], torch.cat([torch.full((2,), FILL), x,
                                                 torch.full((1,), FILL)]))


def test_wrapping_mpi4py_comm_self():
    comm = mcr.Comm(_mpi4py.COMM_SELF)
    out = torch.zeros(2)
    comm.Allreduce(DLPackOnly(torch.ones(2)), out)
    assert_equal(out, torch.ones(2))


test_mpi = mpi_cases(__name__)


def test_error_types_are_mcrs_and_mpi4pys():
    """A type mismatch is a TypeError (mcr) and a ValueError (mpi4py); an
    unknown typecode a ValueError and a KeyError; a 0-d count that is no
    integer a TypeError (mpi4py's test_msgspec expects these)."""
    comm = mcr.COMM_SELF
    for exc in (TypeError, ValueError):
        try:
            comm.Allreduce(np.ones(2, dtype=np.int32), np.zeros(2, dtype=np.float32))
        except exc as e:
            assert "element types must match" in str(e)
        else:
            raise AssertionError(f"type mismatch did not raise {exc.__name__}")
    for exc in (ValueError, KeyError):
        try:
            comm.Sendrecv([bytearray(4), 0, "\0"], mcr.PROC_NULL, 0, None, mcr.PROC_NULL)
        except exc as e:
            assert "unknown typecode" in str(e) and not str(e).startswith("'")
        else:
            raise AssertionError(f"unknown typecode did not raise {exc.__name__}")
    try:
        comm.Alltoallv([bytearray(3), (3, [0])], [bytearray(4), np.array([3.1])[0]])
    except TypeError as e:
        assert "recvbuf" in str(e) and "float64" in str(e)
    else:
        raise AssertionError("a float count did not raise TypeError")
