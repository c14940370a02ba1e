"""Message specs, as tables, at world sizes 1-4 and on COMM_SELF.

Simple messages (`buf`, `[buf, count]`, `[buf, (count, displ), datatype]`, ..., mcr's `[buf,
count, displ]`), different specs on the two sides, vector messages with counts and displacements
as every kind of integer sequence, None (empty, or IN_PLACE) and BOTTOM, explicit datatypes as
mpi4py Datatype objects and typecodes, and unusual buffers: 0-d and empty tensors, nn.Parameter,
tensor subclasses, objects that only speak DLPack. Expected values come from opref.
"""

import itertools

import numpy as np
import torch
from mpi4py import MPI as _mpi4py

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases
from opref import (all_data, cat, data, expect, int_forms, layout, pair_block, place,
                   reduce_ref, roots, sentinel, vcounts)
from util import raises, ring

N = 8
F32 = torch.float32


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


def blank(n=N, dtype=F32):
    return sentinel(n, dtype)


def region(full, lo, hi, n=N):
    """`full[lo:hi]` at [lo, hi) of a blank buffer of n elements."""
    return place(blank(n, full.dtype), [full[lo:hi]], [lo])


# (spec maker, (lo, hi) of the elements the spec covers), on an N-element float32 buffer
SIMPLE_FORMS = [
    (lambda b: b, (0, N)), (lambda b: [b], (0, N)), (lambda b: [b, 3], (0, 3)),
    (lambda b: (b, 3), (0, 3)), (lambda b: [b, 0], (0, 0)), (lambda b: [b, N], (0, N)),
    (lambda b: [b, np.int64(4)], (0, 4)), (lambda b: [b, torch.tensor(5)], (0, 5)),
    (lambda b: [b, MPI.FLOAT], (0, N)), (lambda b: [b, "f"], (0, N)),
    (lambda b: [b, "f4"], (0, N)), (lambda b: [b, 3, MPI.FLOAT], (0, 3)),
    (lambda b: [b, 5, MPI.FLOAT], (0, 5)), (lambda b: (b, 2, MPI.FLOAT), (0, 2)),
    (lambda b: [b, 3, "f"], (0, 3)), (lambda b: [b, 3, None], (0, 3)),
    (lambda b: [b, (3, 2)], (2, 5)), (lambda b: [b, (4, 4)], (4, N)),
    (lambda b: [b, (None, 6)], (6, N)), (lambda b: [b, (0, N)], (N, N)),
    (lambda b: [b, (3, 2), MPI.FLOAT], (2, 5)), (lambda b: [b, (3, 1), "f"], (1, 4)),
    (lambda b: [b, 3, 5, MPI.FLOAT], (5, 8)), (lambda b: [b, 2, 0, MPI.FLOAT], (0, 2)),
    (lambda b: [b, 2, 1, "f"], (1, 3)), (lambda b: [b, 2, 6, "f"], (6, 8)),
    (lambda b: [b, 3, 4], (4, 7)), (lambda b: [b, 3, 1], (1, 4)),   # mcr: [buf, count, displ]
]


@case
def simple_forms(comm):
    """Every pair of forms (none that truncates) by Sendrecv or Isend and Recv; each form on both
    sides of Allreduce and Sendrecv on COMM_SELF, Allreduce, and Bcast (the root's buffer whole)."""
    size, rank = comm.size, comm.rank
    (right, left), xs = ring(comm), all_data(size, N)
    total = reduce_ref(xs, "SUM")
    pairs = itertools.product(enumerate(SIMPLE_FORMS), repeat=2)
    for tag, ((i, (sform, (slo, shi))), (j, (rform, (rlo, rhi)))) in enumerate(pairs):
        if shi - slo > rhi - rlo:
            continue
        out, st = blank(), mcr.Status()
        if tag % 2:
            comm.Sendrecv(sform(xs[rank]), right, tag, rform(out), left, tag, st)
        else:
            req = comm.Isend(sform(xs[rank]), right, tag)
            comm.Recv(rform(out), left, tag, st)
            req.Wait()
        expect(out, place(blank(), [xs[left][slo:shi]], [rlo]), f"forms {i} to {j}")
        assert st.Get_count() == shi - slo, (i, j, st.Get_count())
    for i, (form, (lo, hi)) in enumerate(SIMPLE_FORMS):
        for method, args in (("Allreduce", ()), ("Sendrecv", (0, i))):
            out = blank()
            getattr(mcr.COMM_SELF, method)(form(xs[rank]), *args, form(out), *args)
            expect(out, region(xs[rank], lo, hi), f"{method} on COMM_SELF {i}")
        root = i % size
        buf = xs[root].clone() if rank == root else blank()
        comm.Bcast(form(buf), root)
        expect(buf, xs[root] if rank == root else region(xs[root], lo, hi), f"Bcast {i}")
        out = blank()
        comm.Allreduce(form(xs[rank]), form(out), op=mcr.SUM)
        expect(out, region(total, lo, hi), f"Allreduce {i}")
    buf = xs[rank].clone()
    comm.Allreduce(mcr.IN_PLACE, [buf, 2, MPI.FLOAT])
    expect(buf, cat([total[:2], xs[rank][2:]]))


@case
def block_collective_counts_are_per_process(comm):
    """As in mpi4py, a block collective's explicit count is per process; the rest stays."""
    size, rank = comm.size, comm.rank
    xs = all_data(size, 5)
    for rspec in (lambda b: [b, 3], lambda b: [b, 3, MPI.FLOAT], lambda b: [b, 3, "f"],
                  lambda b: [b, (3, 0), MPI.FLOAT]):
        out = blank(3 * size + 2)
        comm.Allgather([xs[rank], 3], rspec(out))
        expect(out, cat([x[:3] for x in xs] + [blank(2)]))
    send = cat([pair_block(rank, j, 2, F32) for j in range(size)] + [blank(1)])
    out = blank(2 * size + 1)
    comm.Alltoall([send, 2, MPI.FLOAT], [out, 2, MPI.FLOAT])
    expect(out, cat([pair_block(j, rank, 2, F32) for j in range(size)] + [blank(1)]))


# -- vector messages ---------------------------------------------------------------------
def vector_forms(buf, counts, displs):
    """Every vector form for explicit counts and displacements."""
    return [[buf, counts, displs], [buf, (counts, displs)], [buf, counts, displs, MPI.FLOAT],
            [buf, counts, displs, "f"], [buf, (counts, displs), MPI.FLOAT],
            [buf, (counts, displs), "f"]]


@case
def allgatherv_vector_forms(comm):
    """Uneven counts, reversed blocks with gaps, every form and integer sequence; then no displs."""
    size, rank = comm.size, comm.rank
    counts = vcounts(size)
    displs, total = layout(counts, "reversed")
    blocks = [data(r, counts[r]) for r in range(size)]
    want = place(blank(total), blocks, displs)
    for c, d, k in itertools.product(int_forms(counts), int_forms(displs), range(6)):
        out = blank(total)
        comm.Allgatherv(blocks[rank], vector_forms(out, c, d)[k])
        expect(out, want)
    packed = cat(blocks + [blank(2)])
    for spec_of in (lambda b, c: [b, c], lambda b, c: [b, (c, None)],
                    lambda b, c: [b, c, None], lambda b, c: [b, c, MPI.FLOAT],
                    lambda b, c: [b, c, "f"], lambda b, c: [b, (c, None), MPI.FLOAT],
                    lambda b, c: [b, c, None, MPI.FLOAT]):
        # a tuple in second place is mpi4py's (counts, displs) pair, not counts
        for c in [c for c in int_forms(counts) if not isinstance(c, tuple)]:
            out = blank(sum(counts) + 2)
            comm.Allgatherv(blocks[rank], spec_of(out, c))
            expect(out, packed)


@case
def vector_specs_without_displacements(comm):
    """Equal blocks: plain buffers, scalar counts, typed specs; mpi4py's single count or integer
    (strided: block i at i * displs) displacement, on COMM_SELF (a rejection leaves no rank
    waiting); no counts: split as mpi4py does, the first n % size blocks one element longer."""
    size, rank = comm.size, comm.rank
    xs = all_data(size, 3, torch.int32)
    for spec_of in (lambda b: b, lambda b: [b], lambda b: [b, 3], lambda b: [b, np.int32(3)],
                    lambda b: [b, torch.tensor(3)], lambda b: [b, 3, MPI.INT32_T],
                    lambda b: [b, MPI.INT], lambda b: [b, "i"], lambda b: [b, (None, None)],
                    lambda b: [b, 3, list(range(0, 3 * size, 3))]):
        out = torch.zeros(3 * size, dtype=torch.int32)
        comm.Allgatherv(xs[rank], spec_of(out))
        expect(out, cat(xs))
    x = data(rank, 3)
    for spec_of in (lambda b: [b, (3, None)], lambda b: [b, (3, None), MPI.FLOAT],
                    lambda b: [b, (3, 5)], lambda b: [b, ([3], 5), "f"],
                    lambda b: [b, [3], 5, MPI.FLOAT], lambda b: [b, 3, 0, MPI.FLOAT]):
        out = blank(6)
        mcr.COMM_SELF.Allgatherv(x, spec_of(out))
        expect(out, cat([x, blank(3)]))
    n = 2 * size + 1
    counts = [n // size + (i < n % size) for i in range(size)]
    start = sum(counts[:rank])
    xs = all_data(size, 3, torch.float64)
    out = blank(n, torch.float64)
    comm.Allgatherv(xs[rank][:counts[rank]], out)
    expect(out, cat([xs[i][:counts[i]] for i in range(size)]))
    got = blank(counts[rank], torch.float64)
    comm.Scatterv(out if rank == 0 else None, got, 0)
    expect(got, out[start:start + counts[rank]])


@case
def alltoallv_vector_forms_both_sides(comm):
    """(i + j) % 3 elements from i to j, gaps to reversed blocks; every form on both sides."""
    size, rank = comm.size, comm.rank
    scounts = [(rank + j) % 3 for j in range(size)]
    rcounts = [(i + rank) % 3 for i in range(size)]
    sdispls, slength = layout(scounts, "gaps")
    rdispls, rlength = layout(rcounts, "reversed")
    send = place(blank(slength), [pair_block(rank, j, scounts[j], F32) for j in range(size)],
                 sdispls)
    want = place(blank(rlength), [pair_block(i, rank, rcounts[i], F32) for i in range(size)],
                 rdispls)
    sforms = vector_forms(send, scounts, sdispls)
    sforms[0] = [send, torch.tensor(scounts), np.array(sdispls)]
    for k in range(6):
        out = blank(rlength)
        comm.Alltoallv(sforms[k], vector_forms(out, rcounts, rdispls)[(k + rank) % 6])
        expect(out, want, f"form {k}")


@case
def gatherv_scatterv_specs_at_the_root(comm):
    """Vector specs at the root (tensor counts, numpy displs and a datatype; a (counts, displs) pair
    and a typecode), a count on Scatterv's receive side; None for the buffers not used."""
    size, rank = comm.size, comm.rank
    counts = vcounts(size)
    displs, total = layout(counts, "reversed")
    blocks = [data(r, counts[r], torch.float64) for r in range(size)]
    gathered = place(blank(total, torch.float64), blocks, displs)
    for root in roots(size):
        out = blank(total, torch.float64)
        comm.Gatherv(blocks[rank], [out, torch.tensor(counts), np.array(displs), MPI.DOUBLE]
                     if rank == root else None, root)
        if rank == root:
            expect(out, gathered)
        got = blank(4, torch.float64)
        comm.Scatterv([gathered, (counts, displs), "d"] if rank == root else None,
                      [got, counts[rank]], root)
        expect(got, cat([blocks[rank], blank(4 - counts[rank], torch.float64)]))


@case
def reduce_scatter_counts_are_each_recvbuf(comm):
    """No recvcounts: each rank receives as much as its recvbuf holds (mpi4py), in each form."""
    size, rank = comm.size, comm.rank
    counts = [r + 1 for r in range(size)]
    xs = all_data(size, sum(counts))
    want = reduce_ref(xs, "SUM")[sum(counts[:rank]):sum(counts[:rank + 1])]
    for method in ("Reduce_scatter", "Ireduce_scatter", "Reduce_scatter_init"):
        out = torch.zeros(counts[rank])
        req = getattr(comm, method)(xs[rank], out, None, mcr.SUM)
        if method.endswith("_init"):
            req.Start()
        if req is not None:
            req.Wait()
        expect(out, want, method)
    counts = [0] + [2] * (size - 1)
    xs = all_data(size, sum(counts), np.int32)
    out = np.zeros(counts[rank], dtype=np.int32)
    comm.Reduce_scatter(xs[rank], out, None, mcr.SUM)
    start = sum(counts[:rank])
    expect(out, reduce_ref(xs, "SUM")[start:start + counts[rank]])


# -- None, BOTTOM -----------------------------------------------------------------------
@case
def none_and_bottom_buffers_make_empty_messages(comm):
    """[None, datatype], [BOTTOM, 0, BYTE], None, ...: empty messages, p2p and collectives."""
    right, left = ring(comm)
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
    for method in ("Gather", "Scatter", "Allgather", "Alltoall"):
        getattr(comm, method)(null_b, null_b)
    comm.Gatherv(null_b, null_v)
    comm.Scatterv(null_v, null_b)
    comm.Allgatherv(null_b, null_v)
    comm.Alltoallv(null_v, null_v)
    comm.Allgatherv([None, 0, MPI.FLOAT], [None, 0, MPI.FLOAT])


@case
def none_sendbuf_is_in_place(comm):
    """As in mpi4py, None stands for IN_PLACE where IN_PLACE is allowed (Scatter: the recvbuf)."""
    size, rank = comm.size, comm.rank
    xs = all_data(size, 3)
    total = reduce_ref(xs, "SUM")
    out = place(blank(3 * size), [xs[rank]], [3 * rank])
    comm.Allgather(None, out)
    expect(out, cat(xs))
    counts = vcounts(size)
    displs, length = layout(counts, "reversed")
    blocks = [x[:c] for x, c in zip(xs, counts)]
    out = place(blank(length), [blocks[rank]], [displs[rank]])
    comm.Allgatherv(None, [out, counts, displs])
    expect(out, place(blank(length), blocks, displs))
    a = cat([pair_block(rank, j, 1, F32) for j in range(size)])
    comm.Alltoall(None, a)
    expect(a, cat([pair_block(j, rank, 1, F32) for j in range(size)]))
    for method, want in (("Allreduce", total), ("Scan", reduce_ref(xs[:rank + 1], "SUM"))):
        buf = xs[rank].clone()
        getattr(comm, method)(None, buf)
        expect(buf, want, method)
    buf = cat(xs) * (rank + 1)       # block r of every rank is xs[r] x (rank + 1)
    comm.Reduce_scatter_block(None, buf)
    expect(buf[:3], xs[rank] * (size * (size + 1) // 2))
    root = size - 1
    if rank == root:
        out = place(blank(3 * size), [xs[root]], [3 * root])
        comm.Gather(None, out, root)
        expect(out, cat(xs))
        red = xs[root].clone()
        comm.Reduce(None, red, mcr.SUM, root)
        expect(red, total)
        whole = cat(xs)
        comm.Scatter(whole, None, root)
        expect(whole, cat(xs))          # the root's block stays
    else:
        comm.Gather(xs[rank], None, root)
        comm.Reduce(xs[rank], None, mcr.SUM, root)
        got = torch.zeros(3)
        comm.Scatter(None, got, root)
        expect(got, xs[rank])


# -- explicit datatypes: mpi4py Datatype objects and typecodes ------------------------
TYPED = [  # (torch dtype, mpi4py datatype, typecodes)
    (torch.float32, MPI.FLOAT, ["f", "f4"]), (torch.float64, MPI.DOUBLE, ["d", "f8"]),
    (torch.float16, None, ["e", "f2"]), (torch.int8, MPI.INT8_T, ["b", "i1"]),
    (torch.int8, MPI.SIGNED_CHAR, []), (torch.uint8, MPI.UINT8_T, ["B", "u1"]),
    (torch.uint8, MPI.UNSIGNED_CHAR, []), (torch.int16, MPI.SHORT, ["h", "i2"]),
    (torch.uint16, MPI.UINT16_T, ["H", "u2"]), (torch.int32, MPI.INT, ["i", "i4"]),
    (torch.int32, MPI.INT32_T, []), (torch.uint32, MPI.UINT32_T, ["I", "u4"]),
    (torch.int64, MPI.INT64_T, ["q", "i8"]), (torch.int64, MPI.LONG_LONG, ["l"]),
    (torch.uint64, MPI.UINT64_T, ["Q", "u8"]), (torch.bool, MPI.C_BOOL, ["?", "b1"]),
    (torch.complex64, MPI.C_FLOAT_COMPLEX, ["F", "Zf", "c8"]),
    (torch.complex128, MPI.C_DOUBLE_COMPLEX, ["D", "Zd", "c16"]),
]


@case
def explicit_datatypes_and_typecodes(comm):
    """Allreduce (by the datatype's reduction), Allgather and Sendrecv with each datatype/code."""
    size, rank, (right, left) = comm.size, comm.rank, ring(comm)
    for seed, (dtype, datatype, codes) in enumerate(TYPED):
        op = "LOR" if dtype == torch.bool else "SUM"
        xs = [data(r, 3, dtype, op, seed) for r in range(size)]
        for t in ([datatype] if datatype is not None else []) + codes:
            out = torch.zeros(3, dtype=dtype)
            comm.Allreduce([xs[rank], t], [out, 3, t], getattr(mcr, op))
            expect(out, reduce_ref(xs, op), f"Allreduce {t}")
            g = torch.zeros(3 * size, dtype=dtype)
            comm.Allgather([xs[rank], 3, t], [g, t])
            expect(g, cat(xs), f"Allgather {t}")
            y = ~xs[left] if dtype == torch.bool else sentinel(3, dtype)
            comm.Sendrecv([xs[rank], t], right, seed, [y, 3, t], left, seed)
            expect(y, xs[left], f"Sendrecv {t}")


@case
def a_status_counts_in_the_type_of_the_receive_that_wrote_it(comm):
    """Get_count() counts in the element type of the mcr receive that filled the status, a
    truncated one too, and a copy keeps it; once anything else wrote the status (mpi4py's own
    requests, waited for by themselves or in a list), in bytes."""
    right, left = ring(comm)
    st = mcr.Status()
    comm.Sendrecv(np.arange(4.0), right, 1, np.zeros(4), left, 1, st)
    copy = mcr.Status(st)
    assert (st.Get_count(), copy.Get_count(), copy.Get_count(MPI.BYTE)) == (4, 4, 32)
    plain = comm.to_mpi4py()
    for k, wait in enumerate((lambda r: r.Wait(st), lambda r: MPI.Request.Waitany([r], st),
                              lambda r: MPI.Request.Waitall([r], [st]))):
        r = plain.Irecv(np.zeros(6, "i1"), left, 2 + k)
        comm.Send(np.arange(6, dtype="i1"), right, 2 + k)
        wait(r)
        assert st.Get_count() == 6, (k, st.Get_count())
        comm.Sendrecv(np.arange(4.0), right, 1, np.zeros(4), left, 1, st)    # float64 again
    comm.Sendrecv(np.arange(4, dtype="i2"), right, 8, np.zeros(4, "i2"), left, 8, st)
    sent = comm.Isend(np.arange(3.0), right, 9)     # (1 process: to itself, received below)
    with raises(mcr.Exception):
        comm.Recv(np.zeros(2), left, 9, st)             # 3 doubles into 2
    sent.Wait()
    assert st.Get_count() * 8 == st.Get_count(MPI.BYTE), (st.Get_count(), st.Get_count(MPI.BYTE))


@case
def a_status_that_mpi4pys_probes_wrote_counts_bytes(comm):
    """The same message again (source, tag, size: the status's bytes as before): after the typed
    receive, a probe of mpi4py's (Mprobe, Improbe, probe, iprobe, improbe) wrote the status,
    and it counts bytes, as mpi4py's does (it went on counting doubles)."""
    right, left = ring(comm)
    kinds = ("Mprobe", "Improbe", "improbe", "probe", "iprobe")
    sends = [comm.Isend(np.arange(4.0), right, 7) for _ in range(2 * len(kinds))]
    st = mcr.Status()
    for kind in kinds:
        comm.Recv(np.zeros(4), left, 7, st)
        assert (st.Get_count(), st.Get_count(MPI.BYTE)) == (4, 32), kind
        found = getattr(comm, kind)(left, 7, st)
        while not found:                                # (the I... forms: until it is there)
            found = getattr(comm, kind)(left, 7, st)
        assert (st.Get_count(), st.Get_count(MPI.DOUBLE)) == (32, 4), (kind, st.Get_count())
        out = np.zeros(4)
        if kind in ("probe", "iprobe"):
            comm.Recv(out, left, 7)
        else:
            found.Recv(out)
        assert out.tolist() == [0.0, 1.0, 2.0, 3.0], (kind, out)
    MPI.Request.Waitall(sends)


@case
def mpi4py_datatypes_on_numpy_bytes_and_derived(comm):
    """BYTE moves raw bytes; a datatype overrides the buffer's; derived ones count their own."""
    size, rank, (right, left) = comm.size, comm.rank, ring(comm)
    xs = all_data(size, 4, np.float64)
    g = np.zeros(4 * size)
    comm.Allgather([xs[rank], MPI.DOUBLE], [g, MPI.DOUBLE])
    expect(g, cat(xs))
    raw = bytearray(8 * size)
    comm.Allgather([data(rank, 2), MPI.BYTE], [raw, MPI.BYTE])
    expect(torch.frombuffer(raw, dtype=F32), cat(all_data(size, 2)))
    req = comm.Isend([data(rank, 4).view(torch.uint8), 4, MPI.FLOAT], right, 0)
    out, st = bytearray(16), mcr.Status()
    comm.Recv([out, MPI.FLOAT], left, 0, st)
    req.Wait()
    expect(torch.frombuffer(out, dtype=F32), data(left, 4))
    assert st.Get_count() == 4 and st.Get_count(MPI.BYTE) == 16
    pair = MPI.FLOAT.Create_contiguous(2).Commit()
    try:
        y = data(rank, 6)
        out = blank(4 * size)
        comm.Allgather([y, 2, pair], [out, pair])             # 4 floats from each rank
        expect(out, cat([data(r, 6)[:4] for r in range(size)]))
        out = blank(6)
        comm.Sendrecv([y, 3, pair], right, 0, [out, pair], left, 0, st)
        expect(out, data(left, 6))
        assert st.Get_count(pair) == 3 and st.Get_count(MPI.FLOAT) == 6
    finally:
        pair.Free()


@case
def collectives_match_type_signatures_not_datatypes(comm):
    """MPI matches the data moved (count x type size), not the datatypes: a column type is 3
    doubles, a contiguous pair 2, BYTE any 8 bytes; odd ranks use the other side's datatype
    (so do their checked fingerprints, on a checked duplicate)."""
    size, rank, (right, left) = comm.size, comm.rank, ring(comm)
    odd, root = rank % 2, size - 1
    col = MPI.DOUBLE.Create_vector(3, 1, size).Create_resized(0, 8).Commit()
    c2 = MPI.DOUBLE.Create_contiguous(2).Commit()
    ones, offs = [1] * size, list(range(size))

    def x(r, n=2 * size):                  # rank r's doubles
        return np.arange(n, dtype=np.float64) + 100 * r

    def pairs(buf, count=1, flip=False):   # `count` pairs, or twice as many doubles
        return [buf, count, c2] if odd != flip else [buf, 2 * count, MPI.DOUBLE]

    def bcast(c, o):
        o[:] = x(0) if rank == 0 else -1
        c.Bcast(pairs(o, size, rank == 0), root=0)

    mine, at_root = x(rank), rank == root
    firsts, mat = cat([x(r)[:2] for r in range(size)]), x(0, 3 * size).reshape(3, size)
    mine_of = cat([x(r)[2 * rank:2 * rank + 2] for r in range(size)])
    rows = [  # (call, out, what it holds then: None where the call writes nothing)
        (lambda c, o: c.Scatter([mat, 1, col] if at_root else None, [o, 3, MPI.DOUBLE],
                                root=root), np.zeros(3), mat[:, rank]),
        (lambda c, o: c.Gather([x(rank, 3), 3, MPI.DOUBLE], [o, 1, col] if at_root else None,
                               root=root),
         np.zeros((3, size)), np.stack([x(r, 3) for r in range(size)], 1) if at_root else None),
        (lambda c, o: c.Allgather(pairs(mine), pairs(o, flip=True)), np.zeros(2 * size), firsts),
        (lambda c, o: c.Alltoall(pairs(mine), pairs(o, flip=True)), np.zeros(2 * size), mine_of),
        (lambda c, o: c.Alltoallv([mine, ones, offs, c2],
                                  [o, [2] * size, [2 * r for r in offs], MPI.DOUBLE]),
         np.zeros(2 * size), mine_of),
        (lambda c, o: c.Gatherv(pairs(mine), [o, ones, offs, c2] if at_root else None,
                                root=root), np.zeros(2 * size), firsts if at_root else None),
        (bcast, np.zeros(2 * size), x(0)),
        (lambda c, o: c.Allgather([mine.astype(np.float32)[:2], 8, MPI.BYTE], [o, 2, MPI.FLOAT]),
         np.zeros(2 * size, np.float32), firsts.astype(np.float32))]
    checked = comm.Dup()
    checked.checked = True
    for c in (comm, checked):
        for call, out, want in rows:
            call(c, out)
            if want is not None:
                expect(out, want)
        cart = c.Create_cart([size], periods=[True])
        got = np.zeros(4)
        cart.Neighbor_alltoall([x(rank, 4), 1, c2], [got, 2, MPI.DOUBLE])
        expect(got, cat([x(left, 4)[2:], x(right, 4)[:2]]))
        cart.Free()
    checked.Free()
    col.Free()
    c2.Free()


# -- unusual buffers -----------------------------------------------------------------------
@case
def zero_d_tensors(comm):
    size, rank, (right, left) = comm.size, comm.rank, ring(comm)
    x, y = torch.tensor(float(rank + 1)), torch.tensor(0.0)
    comm.Allreduce(x, y)
    assert y.shape == () and y.item() == sum(range(1, size + 1))
    b = torch.tensor(7 if rank == 0 else 0, dtype=torch.int64)
    comm.Bcast(b, 0)
    assert b.item() == 7 and b.shape == ()
    g = torch.zeros(size)
    comm.Allgather(x, g)
    expect(g, torch.arange(1, size + 1, dtype=F32))
    z, st = torch.tensor(0j, dtype=torch.complex64), mcr.Status()
    comm.Sendrecv(torch.tensor(1 + 1j * rank, dtype=torch.complex64), right, 0, z, left, 0, st)
    assert z.item() == 1 + 1j * left and st.Get_count() == 1
    a = np.array(0.0)
    comm.Allreduce(np.array(2.0), a)
    assert a.shape == () and a == 2.0 * size


@case
def empty_tensors(comm):
    size, rank, (right, left) = comm.size, comm.rank, ring(comm)
    for e in (torch.empty(0), torch.empty(0, 3), torch.empty(2, 0, dtype=torch.float64),
              np.empty(0), bytearray()):
        st = mcr.Status()
        comm.Sendrecv(e, right, 0, e, left, 0, st)
        assert st.Get_count() == 0
    e = torch.empty(0)
    comm.Allreduce(e, torch.empty(0))
    comm.Allreduce(MPI.IN_PLACE, torch.empty(0, dtype=torch.int32))
    comm.Bcast(torch.empty(0, dtype=torch.bfloat16), 0)
    comm.Allgather(e, torch.empty(0))
    comm.Alltoall(torch.empty(0), torch.empty(0))
    comm.Allgatherv(e, [torch.empty(0), [0] * size])
    counts = [r % 2 for r in range(size)]   # empty contributions into a non-empty result
    out = blank(sum(counts))
    comm.Allgatherv(torch.full((counts[rank],), float(rank)), [out, counts])
    expect(out, torch.tensor([float(r) for r in range(size) if r % 2]))
    req, st = comm.Irecv(torch.empty(0), left, 9), mcr.Status()
    comm.Send(torch.empty(0), right, 9)
    req.Wait(st)
    assert st.Get_count() == 0 and st.source == left


@case
def parameters_and_tensor_subclasses(comm):
    size, rank, (right, left) = comm.size, comm.rank, ring(comm)
    total = float(sum(range(1, size + 1)))
    p = torch.nn.Parameter(torch.full((3,), float(rank + 1)))
    out = torch.nn.Parameter(torch.zeros(3))
    comm.Allreduce(p, out)
    assert isinstance(out, torch.nn.Parameter)
    expect(out.detach(), torch.full((3,), total))
    comm.Allreduce(MPI.IN_PLACE, p)                  # a leaf that requires grad
    expect(p.detach(), torch.full((3,), total))
    assert p.requires_grad
    g = torch.zeros(3 * size).as_subclass(MyTensor)
    comm.Allgather(torch.ones(3).as_subclass(MyTensor) * rank, g)
    assert type(g) is MyTensor
    expect(g.as_subclass(torch.Tensor), torch.arange(size, dtype=F32).repeat_interleave(3))
    q = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64), requires_grad=False)
    comm.Sendrecv([p.detach().double(), 3], right, 0, [q, (3, 1)], left, 0)
    expect(q.detach(), torch.tensor([0.0] + [total] * 3, dtype=torch.float64))


@case
def dlpack_only_objects(comm):
    """As buffers, in specs and collectives, around numpy arrays, and held by a request."""
    size, rank, (right, left) = comm.size, comm.rank, ring(comm)
    assert not hasattr(DLPackOnly(torch.zeros(1)), "__array__")
    dst, st = torch.zeros(5, dtype=torch.int32), mcr.Status()
    comm.Sendrecv(DLPackOnly(data(rank, 5, torch.int32)), right, 0, DLPackOnly(dst), left, 0, st)
    expect(dst, data(left, 5, torch.int32))
    assert st.Get_count() == 5
    out = blank()
    comm.Allreduce([DLPackOnly(data(rank, N)), 3, "f"], [DLPackOnly(out), (3, 2)])
    expect(out, place(blank(), [reduce_ref([x[:3] for x in all_data(size, N)], "SUM")], [2]))
    arr = np.zeros(2 * size)
    comm.Allgather(DLPackOnly(np.full(2, float(rank))), DLPackOnly(arr))
    expect(arr, np.repeat(np.arange(size, dtype=np.float64), 2))
    dst = torch.zeros(5, dtype=torch.int32)
    req = comm.Irecv(DLPackOnly(dst), left, 1)
    comm.Send(DLPackOnly(data(rank, 5, torch.int32)), right, 1)
    req.Wait()
    expect(dst, data(left, 5, torch.int32))


@case
def mixed_buffer_kinds_in_one_call(comm):
    """torch sends into numpy and back; a view with an offset receives a 2-D sum."""
    size, rank = comm.size, comm.rank
    out = np.zeros(3 * size, np.float32)
    comm.Allgather(data(rank, 3), out)
    expect(out, cat(all_data(size, 3, np.float32)))
    out = torch.zeros(3, dtype=torch.int64)
    comm.Allreduce(data(rank, 3, np.int64), out)
    expect(out, reduce_ref(all_data(size, 3, torch.int64), "SUM"))
    big = blank(10)
    comm.Allreduce(torch.ones(2, 2), big[3:7])
    expect(big, place(blank(10), [torch.full((4,), float(size))], [3]))


# -- in-process, COMM_SELF ------------------------------------------------------------------
def test_simple_and_vector_forms_in_process():
    comm = mcr.COMM_SELF
    full = data(0, N)
    for i, (form, (lo, hi)) in enumerate(SIMPLE_FORMS):
        out = blank()
        comm.Sendrecv(form(full), 0, i, form(out), 0, i)
        expect(out, region(full, lo, hi), f"form {i}")
    x = data(0, 3)
    for c, d in itertools.product(int_forms([3]), int_forms([2])):
        for spec in vector_forms(blank(6), c, d):
            comm.Allgatherv(x, spec)
            expect(spec[0], cat([blank(2), x, blank(1)]))


def test_wrapping_mpi4py_comm_self():
    comm = mcr.Comm(_mpi4py.COMM_SELF)
    out = torch.zeros(2)
    comm.Allreduce(DLPackOnly(torch.ones(2)), out)
    expect(out, torch.ones(2))


test_mpi = mpi_cases(__name__)


def test_error_types_are_mcrs_and_mpi4pys():
    """Errors of mcr's class and mpi4py's (its test_msgspec): type mismatch TypeError/ValueError,
    unknown typecode ValueError/KeyError; a 0-d count that is no integer a TypeError."""
    comm = mcr.COMM_SELF
    for exc in (TypeError, ValueError):
        with raises(exc, "element types must match"):
            comm.Allreduce(np.ones(2, dtype=np.int32), np.zeros(2, dtype=np.float32))
    for exc in (ValueError, KeyError):
        try:
            comm.Sendrecv([bytearray(4), 0, "\0"], mcr.PROC_NULL, 0, None, mcr.PROC_NULL)
        except exc as e:
            assert "unknown typecode" in str(e) and not str(e).startswith("'")
        else:
            raise AssertionError(f"unknown typecode did not raise {exc.__name__}")
    with raises(TypeError, "recvbuf", "float64"):
        comm.Alltoallv([bytearray(3), (3, [0])], [bytearray(4), np.array([3.1])[0]])
