"""Alltoallw, Ialltoallw and Alltoallw_init: a count, a byte displacement and a
datatype per process on each side.

Rank ``i`` sends rank ``j`` a block whose element type and count depend on
``i + j`` (so each pair agrees on both ends, and a rank's blocks differ in
type), laid out at byte displacements with gaps in a byte buffer (numpy array
or torch tensor). Every received block is checked against the values the sender
wrote, computed independently with numpy; the gaps must stay untouched. Also:
the 3- and 2-item spec forms, IN_PLACE, a derived (strided) datatype, the
persistent form started twice, and the errors (datatypes or counts of the
wrong length, blocks past the buffer, backends other than MPI).
"""

import numpy as np
import torch

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases
from util import assert_comm_works, raises

# (numpy type, MPI datatype) by (i + j) % 3
KINDS = [(np.int32, MPI.INT), (np.float64, MPI.DOUBLE), (np.int16, MPI.SHORT)]
SENTINEL = 0xA5


def block(src, dst, salt=0):
    """The values rank `src` sends rank `dst`: its type, count and data."""
    nptype, mpitype = KINDS[(src + dst) % 3]
    count = (src + dst) % 3 + 1
    return nptype, mpitype, 1000 * src + 10 * dst + salt + np.arange(count, dtype=nptype)


def layout(rank, size, order):
    """Byte displacements of the blocks exchanged with each process, visited in
    `order`, 8-byte aligned with an 8-byte gap before each; the buffer size."""
    displs, at = [0] * size, 8
    for p in order:
        displs[p] = at
        at += -(-block(rank, p)[2].nbytes // 8) * 8 + 8
    return displs, at


def make_buffer(nbytes, kind):
    if kind == "torch":
        t = torch.full((nbytes,), SENTINEL, dtype=torch.uint8)
        return t, t.numpy()            # the tensor, and a numpy view of its memory
    a = np.full(nbytes, SENTINEL, np.uint8)
    return a, a


def put(raw, displ, values):
    raw[displ:displ + values.nbytes] = values.view(np.uint8)


def send_side(comm, kind, salt=0, order=None):
    size, rank = comm.size, comm.rank
    displs, nbytes = layout(rank, size, order or range(size))
    buf, raw = make_buffer(nbytes, kind)
    counts, types = [], []
    for j in range(size):
        _, mpitype, values = block(rank, j, salt)
        put(raw, displs[j], values)
        counts.append(len(values))
        types.append(mpitype)
    return buf, raw, counts, displs, types


def recv_side(comm, kind):
    size, rank = comm.size, comm.rank
    displs, nbytes = layout(rank, size, reversed(range(size)))
    buf, raw = make_buffer(nbytes, kind)
    counts = [len(block(i, rank)[2]) for i in range(size)]
    types = [block(i, rank)[1] for i in range(size)]
    return buf, raw, counts, displs, types


def check_received(comm, raw, displs, salt=0):
    expected = np.full(raw.nbytes, SENTINEL, np.uint8)
    for i in range(comm.size):
        put(expected, displs[i], block(i, comm.rank, salt)[2])
    np.testing.assert_array_equal(raw, expected)


@case.quick
def alltoallw_every_form(comm):
    """Blocking, non-blocking, persistent; torch and numpy buffers; the 4- and
    3-item spec forms."""
    for kind in ("torch", "numpy"):
        for form in ("blocking", "nonblocking", "persistent"):
            sbuf, _, scounts, sdispls, stypes = send_side(comm, kind)
            rbuf, rraw, rcounts, rdispls, rtypes = recv_side(comm, kind)
            smsg = [sbuf, scounts, sdispls, stypes]
            rmsg = [rbuf, (rcounts, rdispls), rtypes]
            if form == "blocking":
                comm.Alltoallw(smsg, rmsg)
            elif form == "nonblocking":
                req = comm.Ialltoallw(smsg, rmsg)
                assert isinstance(req, mcr.Request)
                req.Wait()
            else:
                req = comm.Alltoallw_init(smsg, rmsg)
                assert isinstance(req, mcr.Prequest)
                req.Start()
                req.Wait()
            check_received(comm, rraw, rdispls)
            if form == "persistent":             # new data in the same buffers
                _, sraw2, *_ = send_side(comm, "numpy", salt=5)
                (sbuf.numpy() if kind == "torch" else sbuf)[:] = sraw2
                req.Start()
                req.Wait()
                check_received(comm, rraw, rdispls, salt=5)
                req.Free()


@case
def alltoallw_in_place(comm):
    """IN_PLACE: what is sent to process i is taken from where i's block lands."""
    size, rank = comm.size, comm.rank
    displs, nbytes = layout(rank, size, range(size))
    buf, raw = make_buffer(nbytes, "torch")
    for i in range(size):
        put(raw, displs[i], block(rank, i)[2])     # (rank, i) and (i, rank): same type
    counts = [len(block(i, rank)[2]) for i in range(size)]
    types = [block(i, rank)[1] for i in range(size)]
    comm.Alltoallw(MPI.IN_PLACE, [buf, counts, displs, types])
    check_received(comm, raw, displs)


@case
def alltoallw_two_item_form_and_derived_type(comm):
    """[buf, datatypes] sends one element of each type from the start of buf;
    a strided datatype picks every other element."""
    size, rank = comm.size, comm.rank
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
        expected = np.full(4 * size, -1, np.int32)
        for i in range(size):
            expected[4 * i:4 * i + 2] = [10 * i, 10 * i + 2]
        np.testing.assert_array_equal(y.numpy(), expected)
    finally:
        every_other.Free()


@case
def alltoallw_zero_counts(comm):
    """Blocks of zero elements may have any displacement and move nothing."""
    size = comm.size
    x = np.arange(3, dtype=np.float64)
    y = np.full(3, -1.0)
    comm.Alltoallw([x, [0] * size, [10 ** 6] * size, [MPI.DOUBLE] * size],
                   [y, [0] * size, [0] * size, [MPI.DOUBLE] * size])
    np.testing.assert_array_equal(y, -1.0)


@case
def alltoallw_errors(comm):
    """Each mistake raises on every rank before communicating; the comm still works."""
    size = comm.size
    x = np.zeros(8, np.float64)
    y = np.zeros(8, np.float64)
    good = [y, [1] * size, [0] * size, [MPI.DOUBLE] * size]
    for method in (comm.Alltoallw, comm.Ialltoallw, comm.Alltoallw_init):
        with raises(ValueError, "recvbuf", f"datatypes has {size + 1} entries",
                    f"expected {size}"):
            method([x, [MPI.DOUBLE] * size], [y, [1] * size, [0] * size,
                                              [MPI.DOUBLE] * (size + 1)])
        with raises(ValueError, "sendbuf", f"counts has {size + 2} entries"):
            method([x, [1] * (size + 2), [0] * size, [MPI.DOUBLE] * size], good)
        with raises(ValueError, "sendbuf", "block 0", "past the buffer of 64 bytes"):
            method([x, [3] * size, [48] * size, [MPI.DOUBLE] * size], good)
        with raises(ValueError, "recvbuf", "past the buffer of 64 bytes"):
            method([x, [MPI.DOUBLE] * size], [y, [9] * size, [0] * size,
                                              [MPI.DOUBLE] * size])
        with raises(ValueError, "displs[0]", "non-negative"):
            method([x, [1] * size, [-8] * size, [MPI.DOUBLE] * size], good)
        with raises(TypeError, "datatypes must be a list"):
            method([x, [1] * size, [0] * size, MPI.DOUBLE], good)
        with raises(TypeError, "datatypes[0]"):
            method([x, [1] * size, [0] * size, [8] * size], good)
        with raises(TypeError, "recvbuf", "got ndarray"):
            method([x, [MPI.DOUBLE] * size], y)
        with raises(ValueError, "recvbuf", "2 to 4 items"):
            method([x, [MPI.DOUBLE] * size], [y])
        with raises(ValueError, "BOTTOM needs counts"):
            method([MPI.BOTTOM, [MPI.DOUBLE] * size], good)
        with raises(BufferError, "recvbuf", "read-only"):
            method([x, [MPI.DOUBLE] * size], [b"read-only", [MPI.BYTE] * size])
        with raises(ValueError, "backend 'gloo'", method.__name__):
            method([x, [MPI.DOUBLE] * size], good, backend="gloo")
    assert_comm_works(comm)


@case
def alltoallw_self_block_size_checked(comm):
    """At one process mcr moves the block itself: a receive smaller than what
    is sent is MPI's truncation error, with the sizes."""
    if comm.size != 1:
        return
    x = np.arange(4, dtype=np.float64)
    y = np.zeros(4)
    with raises(mcr.Exception, "truncat"):
        comm.Alltoallw([x, [3], [8], [MPI.DOUBLE]], [y, [2], [0], [MPI.DOUBLE]])
    y = np.zeros(4)
    comm.Alltoallw([x, [3], [8], [MPI.DOUBLE]], [y, [3], [8], [MPI.DOUBLE]])
    np.testing.assert_array_equal(y, [0, 1, 2, 3])


test_mpi = mpi_cases(__name__)
