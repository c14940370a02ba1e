"""Point-to-point on buffers: Send/Recv, Isend/Irecv, Sendrecv, the send modes
(Bsend/Ssend/Rsend, their I- and _init forms) and Isendrecv(_replace).

Rings and pairs at world sizes 1-4 on every element type, PROC_NULL,
ANY_SOURCE/ANY_TAG with the Status they fill, messages shorter than the
receive buffer, explicit counts/displacements/datatypes, and numpy arrays,
bytearray and array.array as buffers. Every received value is checked against
the sender's data computed independently (util.rank_data), and the part of a
receive buffer that the message does not cover must stay untouched.
"""

import array
import contextlib
import time

import numpy as np
import torch

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases
from util import assert_comm_works, assert_equal, raises, rank_data

# every element type mcr moves
P2P_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.bool,
              torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.uint16, torch.uint32, torch.uint64, torch.complex64, torch.complex128]
NUMPY_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16,
                np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.complex64,
                np.complex128, np.bool_]


def blank_like(expected):
    """A receive buffer that differs from `expected` in every element."""
    if expected.dtype == torch.bool:
        return ~expected
    return torch.zeros_like(expected)        # rank_data values are >= 1


def np_data(rank, n, dtype, seed=0):
    return rank_data(rank, n, torch.int64, seed).numpy().astype(dtype)


def right(comm):
    return (comm.rank + 1) % comm.size


def left(comm):
    return (comm.rank - 1) % comm.size


def partner(comm):
    """Pairs (0,1), (2,3), ...; the odd one out at odd sizes gets PROC_NULL."""
    p = comm.rank ^ 1
    return p if p < comm.size else MPI.PROC_NULL


# -- Send / Recv ------------------------------------------------------------------------


@case.quick
def ring_pass_every_dtype(comm):
    """A token goes around the ring: rank 0 sends first, the others receive first."""
    if comm.size == 1:
        return
    for seed, dtype in enumerate(P2P_DTYPES):
        n = 7 + seed
        expected = rank_data(left(comm), n, dtype, seed)
        buf = blank_like(expected)
        mine = rank_data(comm.rank, n, dtype, seed)
        if comm.rank == 0:
            comm.Send(mine, right(comm), tag=seed)
            comm.Recv(buf, left(comm), tag=seed)
        else:
            comm.Recv(buf, left(comm), tag=seed)
            comm.Send(mine, right(comm), tag=seed)
        assert_equal(buf, expected)


@case
def pairs_send_recv_every_dtype(comm):
    """Even ranks send then receive, odd ranks receive then send; at odd sizes
    the last rank talks to PROC_NULL and its buffer stays untouched."""
    p = partner(comm)
    for seed, dtype in enumerate(P2P_DTYPES):
        n = 5
        mine = rank_data(comm.rank, n, dtype, seed)
        if p == MPI.PROC_NULL:
            untouched = rank_data(comm.size + 7, n, dtype, seed)
            buf = untouched.clone()
        else:
            expected = rank_data(p, n, dtype, seed)
            buf = blank_like(expected)
        status = mcr.Status()
        if comm.rank % 2 == 0:
            comm.Send(mine, p, 3)
            comm.Recv(buf, p, 3, status)
        else:
            comm.Recv(buf, p, 3, status)
            comm.Send(mine, p, 3)
        if p == MPI.PROC_NULL:
            assert_equal(buf, untouched)
            assert status.source == MPI.PROC_NULL and status.tag == MPI.ANY_TAG
            assert status.Get_count() == 0
        else:
            assert_equal(buf, expected)
            assert (status.source, status.tag, status.Get_count()) == (p, 3, n)


@case
def send_recv_multidim_and_views(comm):
    """2-D tensors move as their elements in order; a contiguous slice with a
    storage offset receives exactly its own elements."""
    p = partner(comm)
    if p == MPI.PROC_NULL:
        return
    mine = rank_data(comm.rank, 12, torch.float64).reshape(3, 4)
    theirs = rank_data(p, 12, torch.float64).reshape(3, 4)
    big = torch.full((20,), -1.0, dtype=torch.float64)
    row = torch.zeros(2, 4, dtype=torch.float64)
    if comm.rank % 2 == 0:
        comm.Send(mine, p, 0)
        comm.Recv(big[5:17], p, 0)
        comm.Send(mine[1], p, 1)          # a row: contiguous, with an offset
        comm.Recv(row[1], p, 1)
    else:
        comm.Recv(big[5:17], p, 0)
        comm.Send(mine, p, 0)
        comm.Recv(row[1], p, 1)
        comm.Send(mine[1], p, 1)
    expected = torch.full((20,), -1.0, dtype=torch.float64)
    expected[5:17] = theirs.flatten()
    assert_equal(big, expected)
    assert_equal(row, torch.stack([torch.zeros(4, dtype=torch.float64), theirs[1]]))


@case
def large_message_ring(comm):
    """Messages past the eager limit (rendezvous path) around the ring."""
    n = 1 << 19
    mine = torch.arange(n, dtype=torch.float32) + comm.rank
    out = torch.zeros(n)
    r = comm.Irecv(out, left(comm), 9)
    comm.Send(mine, right(comm), 9)
    r.Wait()
    assert_equal(out, torch.arange(n, dtype=torch.float32) + left(comm))


# -- Isend / Irecv ----------------------------------------------------------------------


@case.quick
def ring_isend_irecv_every_dtype(comm):
    """All messages of all dtypes outstanding at once, both directions."""
    recvs, sends, expect = [], [], []
    for seed, dtype in enumerate(P2P_DTYPES):
        n = 3 + seed
        for d, (src, dst) in enumerate([(left(comm), right(comm)),
                                       (right(comm), left(comm))]):
            exp = rank_data(src, n, dtype, 10 * seed + d)
            buf = blank_like(exp)
            tag = 2 * seed + d
            recvs.append(comm.Irecv(buf, src, tag))
            sends.append(comm.Isend(rank_data(comm.rank, n, dtype, 10 * seed + d), dst, tag))
            expect.append((buf, exp))
    statuses = []
    mcr.Request.Waitall(recvs + sends, statuses)
    for (buf, exp), st in zip(expect, statuses):
        assert_equal(buf, exp)
        assert st.Get_count() == exp.numel()


@case
def isend_irecv_to_self(comm):
    x = rank_data(comm.rank, 6, torch.complex128)
    y = torch.zeros(6, dtype=torch.complex128)
    r = comm.Irecv(y, comm.rank, 4)
    s = comm.Isend(x, comm.rank, 4)
    st = mcr.Status()
    s.Wait()
    r.Wait(st)
    assert_equal(y, x)
    assert (st.source, st.tag, st.Get_count(), st.Get_count(MPI.BYTE)) == (comm.rank, 4, 6, 96)


@case
def tag_matching_out_of_order(comm):
    """Messages are matched by tag, not by arrival order."""
    dst, src = right(comm), left(comm)
    reqs = [comm.Isend(torch.full((4,), float(10 * comm.rank + t)), dst, t) for t in (1, 2, 3)]
    got = {}
    for t in (3, 1, 2):
        buf = torch.zeros(4)
        comm.Recv(buf, src, t)
        got[t] = buf
    mcr.Request.Waitall(reqs)
    for t in (1, 2, 3):
        assert_equal(got[t], torch.full((4,), float(10 * src + t)))


@case
def non_overtaking_same_tag(comm):
    """Two messages with the same source and tag arrive in the order sent."""
    dst, src = right(comm), left(comm)
    reqs = [comm.Isend(torch.full((3,), float(k + 100 * comm.rank)), dst, 7) for k in range(4)]
    for k in range(4):
        buf = torch.zeros(3)
        comm.Recv(buf, src, 7)
        assert_equal(buf, torch.full((3,), float(k + 100 * src)))
    mcr.Request.Waitall(reqs)


# -- Sendrecv ---------------------------------------------------------------------------


@case.quick
def sendrecv_ring_every_dtype(comm):
    for seed, dtype in enumerate(P2P_DTYPES):
        n = 9
        exp = rank_data(left(comm), n, dtype, seed)
        buf = blank_like(exp)
        st = mcr.Status()
        comm.Sendrecv(rank_data(comm.rank, n, dtype, seed), right(comm), seed, buf,
                      left(comm), seed, st)
        assert_equal(buf, exp)
        assert (st.source, st.tag, st.Get_count()) == (left(comm), seed, n)


@case
def sendrecv_both_directions_any_source(comm):
    """Send right, receive from ANY_SOURCE/ANY_TAG: the status says who sent."""
    x = rank_data(comm.rank, 4, torch.int64)
    y = torch.zeros(4, dtype=torch.int64)
    st = mcr.Status()
    comm.Sendrecv(x, right(comm), 20 + comm.rank, y, MPI.ANY_SOURCE, MPI.ANY_TAG, st)
    assert_equal(y, rank_data(left(comm), 4, torch.int64))
    assert (st.source, st.tag) == (left(comm), 20 + left(comm))
    assert st.Get_count() == 4 and st.Get_count(MPI.BYTE) == 32


@case
def sendrecv_pairs_with_proc_null(comm):
    p = partner(comm)
    x = rank_data(comm.rank, 5, torch.bfloat16)
    y = torch.full((5,), -3.0, dtype=torch.bfloat16)
    st = mcr.Status()
    comm.Sendrecv(x, p, 1, y, p, 1, st)
    if p == MPI.PROC_NULL:
        assert_equal(y, torch.full((5,), -3.0, dtype=torch.bfloat16))
        assert st.source == MPI.PROC_NULL and st.Get_count() == 0
    else:
        assert_equal(y, rank_data(p, 5, torch.bfloat16))
        assert st.source == p


@case
def sendrecv_different_lengths_and_types(comm):
    """The sent and the received message differ in length and element type."""
    x = rank_data(comm.rank, 2 + comm.rank, torch.int16)
    y = torch.zeros(10, dtype=torch.int16)
    st = mcr.Status()
    comm.Sendrecv(x, right(comm), 0, y, left(comm), 0, st)
    n = 2 + left(comm)
    assert_equal(y[:n], rank_data(left(comm), n, torch.int16))
    assert_equal(y[n:], torch.zeros(10 - n, dtype=torch.int16))
    assert st.Get_count() == n and st.Get_count(MPI.BYTE) == 2 * n
    # send float64, receive into a numpy float64 array
    a = np.zeros(3)
    comm.Sendrecv(rank_data(comm.rank, 3, torch.float64), right(comm), 1, a, left(comm), 1)
    np.testing.assert_array_equal(a, rank_data(left(comm), 3, torch.float64).numpy())


# -- PROC_NULL ---------------------------------------------------------------------------


@case
def proc_null_everywhere(comm):
    x = torch.ones(4)
    y = torch.full((4,), 5.0)
    comm.Send(x, MPI.PROC_NULL)
    comm.Send(x, MPI.PROC_NULL, tag=123)
    st = mcr.Status()
    comm.Recv(y, MPI.PROC_NULL, 0, st)
    assert_equal(y, torch.full((4,), 5.0))
    assert st.source == MPI.PROC_NULL and st.tag == MPI.ANY_TAG and st.Get_count() == 0
    reqs = [comm.Isend(x, MPI.PROC_NULL), comm.Irecv(y, MPI.PROC_NULL)]
    statuses = []
    mcr.Request.Waitall(reqs, statuses)
    assert statuses[1].source == MPI.PROC_NULL
    assert_equal(y, torch.full((4,), 5.0))
    comm.Sendrecv(x, MPI.PROC_NULL, 0, y, MPI.PROC_NULL, 0)
    assert_equal(y, torch.full((4,), 5.0))
    # None is an empty message, as in mpi4py
    comm.Send(None, MPI.PROC_NULL)
    comm.Recv(None, MPI.PROC_NULL)
    comm.Sendrecv(None, MPI.PROC_NULL, 0, None, MPI.PROC_NULL, 0)


# -- ANY_SOURCE / ANY_TAG and Status -------------------------------------------------


@case
def any_source_any_tag_gathers_at_root(comm):
    """Every rank (the root too) sends rank+1 float64 elements with tag 50+rank
    to rank 0, which receives them with ANY_SOURCE/ANY_TAG into a larger buffer
    and learns source, tag and length from the status."""
    req = comm.Isend(rank_data(comm.rank, comm.rank + 1, torch.float64), 0, 50 + comm.rank)
    if comm.rank == 0:
        seen = set()
        for _ in range(comm.size):
            buf = torch.zeros(comm.size + 3, dtype=torch.float64)
            st = mcr.Status()
            comm.Recv(buf, MPI.ANY_SOURCE, MPI.ANY_TAG, st)
            src = st.source
            assert st.Get_source() == src and st.tag == st.Get_tag() == 50 + src
            n = src + 1
            assert st.Get_count() == n, (st.Get_count(), n)
            assert st.Get_count(MPI.BYTE) == 8 * n
            assert st.Get_count(MPI.DOUBLE) == n and st.Get_count(MPI.FLOAT) == 2 * n
            assert st.Get_count("d") == n
            assert_equal(buf[:n], rank_data(src, n, torch.float64))
            assert_equal(buf[n:], torch.zeros(comm.size + 3 - n, dtype=torch.float64))
            seen.add(src)
        assert seen == set(range(comm.size))
    req.Wait()


@case
def any_tag_from_given_source(comm):
    dst, src = right(comm), left(comm)
    req = comm.Isend(rank_data(comm.rank, 3, torch.int32), dst, 1000 + comm.rank)
    buf = torch.zeros(3, dtype=torch.int32)
    st = mcr.Status()
    comm.Recv(buf, src, MPI.ANY_TAG, st)
    req.Wait()
    assert_equal(buf, rank_data(src, 3, torch.int32))
    assert st.tag == 1000 + src and st.source == src and st.error == MPI.SUCCESS
    assert st.Get_count() == 3 and st.Get_count(MPI.BYTE) == 12


@case
def get_count_counts_elements_of_the_receive_type(comm):
    """Get_count() counts in the receive's element type, Get_count(BYTE) bytes,
    and UNDEFINED when the bytes are not a whole number of the datatype."""
    dst, src = right(comm), left(comm)
    for dtype, itemsize in [(torch.uint8, 1), (torch.float16, 2), (torch.bfloat16, 2),
                            (torch.int32, 4), (torch.complex64, 8), (torch.complex128, 16)]:
        req = comm.Isend(rank_data(comm.rank, 5, dtype), dst, 2)
        buf = torch.zeros(8, dtype=dtype)
        st = mcr.Status()
        comm.Recv(buf, src, 2, st)
        req.Wait()
        assert st.Get_count() == 5, (dtype, st.Get_count())
        assert st.Get_count(MPI.BYTE) == 5 * itemsize, dtype
    # 3 int16 = 6 bytes: not a whole number of int32
    req = comm.Isend(torch.ones(3, dtype=torch.int16), dst, 3)
    st = mcr.Status()
    comm.Recv(torch.zeros(4, dtype=torch.int16), src, 3, st)
    req.Wait()
    assert st.Get_count(MPI.INT32_T) == MPI.UNDEFINED
    assert st.Get_count(MPI.BYTE) == 6


# -- shorter messages, counts, displacements, datatypes -------------------------------


@case
def message_shorter_than_receive_buffer(comm):
    dst, src = right(comm), left(comm)
    for n in (0, 1, 3):
        req = comm.Isend(rank_data(comm.rank, n, torch.float32, n), dst, n)
        buf = torch.full((10,), -1.0)
        st = mcr.Status()
        comm.Recv(buf, src, n, st)
        req.Wait()
        assert_equal(buf[:n], rank_data(src, n, torch.float32, n))
        assert_equal(buf[n:], torch.full((10 - n,), -1.0))
        assert st.Get_count() == n


def _spec_cases(n):
    """(send spec maker, recv spec maker, sent slice, received slice), 8 float32."""
    return [
        (lambda b: [b, 3], lambda b: b, slice(0, 3), slice(0, 3)),
        (lambda b: b, lambda b: [b, n], slice(0, n), slice(0, n)),
        (lambda b: [b, MPI.FLOAT], lambda b: [b, MPI.FLOAT], slice(0, n), slice(0, n)),
        (lambda b: [b, 3, MPI.FLOAT], lambda b: [b, 5, MPI.FLOAT], slice(0, 3), slice(0, 3)),
        (lambda b: [b, (3, 2)], lambda b: [b, (4, 4)], slice(2, 5), slice(4, 7)),
        (lambda b: [b, (3, 2), MPI.FLOAT], lambda b: [b, (3, 1), "f"], slice(2, 5),
         slice(1, 4)),
        (lambda b: [b, 2, 6, MPI.FLOAT], lambda b: [b, 2, 0, MPI.FLOAT], slice(6, 8),
         slice(0, 2)),
        (lambda b: [b, 2, 6, "f"], lambda b: [b, 3, 5, "f"], slice(6, 8), slice(5, 7)),
        (lambda b: [b, "f"], lambda b: [b, "f"], slice(0, n), slice(0, n)),
        (lambda b: [b, 4, "f"], lambda b: [b, (None, 4)], slice(0, 4), slice(4, 8)),
        (lambda b: [b, 3, 1], lambda b: [b, 3, 2], slice(1, 4), slice(2, 5)),
        (lambda b: [b, 3, None], lambda b: [b, 3], slice(0, 3), slice(0, 3)),
        (lambda b: [b, 0], lambda b: [b, 0], slice(0, 0), slice(0, 0)),
        (lambda b: (b, 2), lambda b: (b, 2, MPI.FLOAT), slice(0, 2), slice(0, 2)),
    ]


@case
def explicit_counts_displacements_datatypes(comm):
    n = 8
    dst, src = right(comm), left(comm)
    mine = rank_data(comm.rank, n, torch.float32)
    theirs = rank_data(src, n, torch.float32)
    for i, (sspec, rspec, ssl, rsl) in enumerate(_spec_cases(n)):
        buf = torch.full((n,), -1.0)
        st = mcr.Status()
        req = comm.Isend(sspec(mine), dst, i)
        comm.Recv(rspec(buf), src, i, st)
        req.Wait()
        expected = torch.full((n,), -1.0)
        expected[rsl] = theirs[ssl]
        assert_equal(buf, expected)
        assert st.Get_count() == ssl.stop - ssl.start, i
        # and through Sendrecv
        buf = torch.full((n,), -1.0)
        comm.Sendrecv(sspec(mine), dst, i, rspec(buf), src, i)
        assert_equal(buf, expected)


@case
def explicit_datatype_reinterprets_bytes(comm):
    """An explicit datatype overrides the buffer's element type: float32 data
    sent as MPI.FLOAT from a uint8 tensor, received into a bytearray."""
    dst, src = right(comm), left(comm)
    data = rank_data(comm.rank, 4, torch.float32)
    raw = data.view(torch.uint8)
    req = comm.Isend([raw, 4, MPI.FLOAT], dst, 0)
    out = bytearray(16)
    st = mcr.Status()
    comm.Recv([out, MPI.FLOAT], src, 0, st)
    req.Wait()
    assert_equal(torch.frombuffer(out, dtype=torch.float32), rank_data(src, 4, torch.float32))
    assert st.Get_count() == 4 and st.Get_count(MPI.BYTE) == 16
    # typecode strings for the sender's and receiver's types
    for typecode, dtype in [("i", torch.int32), ("q", torch.int64), ("d", torch.float64),
                            ("e", torch.float16), ("B", torch.uint8), ("b", torch.int8),
                            ("h", torch.int16), ("?", torch.bool), ("F", torch.complex64),
                            ("D", torch.complex128), ("Zf", torch.complex64)]:
        x = rank_data(comm.rank, 3, dtype)
        y = blank_like(rank_data(src, 3, dtype))
        comm.Sendrecv([x, typecode], dst, 0, [y, 3, typecode], src, 0)
        assert_equal(y, rank_data(src, 3, dtype))


# -- numpy arrays, bytearray, array.array ----------------------------------------------


@case
def numpy_arrays_every_dtype(comm):
    dst, src = right(comm), left(comm)
    for seed, dtype in enumerate(NUMPY_DTYPES):
        x = np_data(comm.rank, 6, dtype, seed)
        y = np.zeros(6, dtype) if dtype is not np.bool_ else ~np_data(src, 6, dtype, seed)
        req = comm.Irecv(y, src, seed)
        comm.Send(x, dst, seed)
        st = mcr.Status()
        req.Wait(st)
        np.testing.assert_array_equal(y, np_data(src, 6, dtype, seed))
        assert y.dtype == dtype
        assert st.Get_count() == 6 and st.Get_count(MPI.BYTE) == 6 * y.itemsize


@case
def numpy_multidim_and_fortran_order(comm):
    dst, src = right(comm), left(comm)
    x = np_data(comm.rank, 12, np.float64).reshape(3, 4)
    y = np.zeros((3, 4))
    comm.Sendrecv(x, dst, 0, y, src, 0)
    np.testing.assert_array_equal(y, np_data(src, 12, np.float64).reshape(3, 4))
    # a Fortran-ordered array is contiguous: its memory order is what moves
    xf = np.asfortranarray(x)
    yf = np.zeros(12)
    comm.Sendrecv(xf, dst, 1, yf, src, 1)
    np.testing.assert_array_equal(yf, np_data(src, 12, np.float64).reshape(3, 4).T.ravel())


@case
def torch_to_numpy_and_back(comm):
    dst, src = right(comm), left(comm)
    y = np.zeros(5, np.int32)
    comm.Sendrecv(rank_data(comm.rank, 5, torch.int32), dst, 0, y, src, 0)
    np.testing.assert_array_equal(y, rank_data(src, 5, torch.int32).numpy())
    t = torch.zeros(5, dtype=torch.complex64)
    comm.Sendrecv(rank_data(comm.rank, 5, torch.complex64).numpy(), dst, 1, t, src, 1)
    assert_equal(t, rank_data(src, 5, torch.complex64))


@case
def bytearray_and_bytes(comm):
    dst, src = right(comm), left(comm)
    msg = bytes(f"hello from {comm.rank:02d}", "ascii")
    out = bytearray(32)
    st = mcr.Status()
    comm.Sendrecv(msg, dst, 0, out, src, 0, st)      # bytes are fine to send
    expected = bytes(f"hello from {src:02d}", "ascii")
    assert bytes(out[:len(expected)]) == expected
    assert bytes(out[len(expected):]) == bytes(32 - len(expected))
    assert st.Get_count() == len(expected) == st.Get_count(MPI.BYTE)
    # a float tensor received into a bytearray: counts are in bytes
    out = bytearray(12)
    req = comm.Isend(rank_data(comm.rank, 3, torch.float32), dst, 1)
    comm.Recv(out, src, 1, st)
    req.Wait()
    assert st.Get_count() == 12
    assert_equal(torch.frombuffer(out, dtype=torch.float32), rank_data(src, 3, torch.float32))
    # memoryview slices are buffers too
    big = bytearray(b"." * 20)
    comm.Sendrecv(memoryview(msg)[:5], dst, 2, memoryview(big)[10:], src, 2)
    assert bytes(big) == b"." * 10 + msg[:5] + b"." * 5


@case
def array_array_buffers(comm):
    dst, src = right(comm), left(comm)
    for code in "bBhHiIlLqQfd":
        x = array.array(code, rank_data(comm.rank, 4, torch.int64).tolist())
        y = array.array(code, [0] * 6)
        st = mcr.Status()
        comm.Sendrecv(x, dst, 0, y, src, 0, st)
        expected = rank_data(src, 4, torch.int64).tolist()
        assert list(y) == expected + [0, 0], code
        assert st.Get_count() == 4 and st.Get_count(MPI.BYTE) == 4 * y.itemsize, code
    # array.array into a torch tensor of the same type
    t = torch.zeros(4, dtype=torch.float64)
    comm.Sendrecv(array.array("d", [comm.rank + 0.5] * 4), dst, 1, t, src, 1)
    assert_equal(t, torch.full((4,), src + 0.5, dtype=torch.float64))


# -- Send modes: Bsend, Ssend, Rsend and their I- and _init forms -----------------------

SEND_MODES = ("Bsend", "Ssend", "Rsend")


@contextlib.contextmanager
def attached_buffer(nbytes):
    """MPI's buffer for Bsend (what it must hold: the messages plus an overhead each)."""
    MPI.Attach_buffer(bytearray(nbytes + 16 * MPI.BSEND_OVERHEAD))
    try:
        yield
    finally:
        MPI.Detach_buffer()


def send_in_mode(comm, name, form, buf, dest, tag, backend=None):
    """Send `buf` with method `name` in `form` (blocking, nonblocking, persistent)
    after the matching receive is posted (Rsend needs it); return once sent."""
    kw = {} if backend is None else {"backend": backend}
    if form == "blocking":
        getattr(comm, name)(buf, dest, tag, **kw)
    elif form == "nonblocking":
        getattr(comm, "I" + name[0].lower() + name[1:])(buf, dest, tag, **kw).Wait()
    else:
        req = getattr(comm, name + "_init")(buf, dest, tag, **kw)
        assert isinstance(req, mcr.Prequest)
        req.Start()
        req.Wait()
        req.Free()


@case
def send_modes_ring_every_form(comm):
    """Each mode, each form, torch tensors and numpy arrays: the ring pass arrives."""
    dst, src = right(comm), left(comm)
    with attached_buffer(1 << 12):
        for k, (name, form) in enumerate((n, f) for n in SEND_MODES
                                         for f in ("blocking", "nonblocking", "persistent")):
            for j, dtype in enumerate((torch.float64, torch.int16, torch.complex64)):
                tag = 10 * k + j
                exp = rank_data(src, 5 + j, dtype, tag)
                buf = blank_like(exp)
                r = comm.Irecv(buf, src, tag)
                comm.Barrier()                  # every receive is posted: Rsend is legal
                send_in_mode(comm, name, form, rank_data(comm.rank, 5 + j, dtype, tag),
                             dst, tag)
                st = mcr.Status()
                r.Wait(st)
                assert_equal(buf, exp)
                assert (st.source, st.tag, st.Get_count()) == (src, tag, 5 + j)
            y = np.zeros(4, np.int32)
            r = comm.Irecv(y, src, 99)
            comm.Barrier()
            send_in_mode(comm, name, form, np_data(comm.rank, 4, np.int32, k), dst, 99)
            r.Wait()
            np.testing.assert_array_equal(y, np_data(src, 4, np.int32, k))


@case
def send_modes_explicit_specs_and_proc_null(comm):
    """[buf, count, displ, datatype] specs in every mode; PROC_NULL sends nothing."""
    dst, src = right(comm), left(comm)
    x = rank_data(comm.rank, 8, torch.int32)
    with attached_buffer(1 << 10):
        for k, name in enumerate(SEND_MODES):
            y = torch.zeros(8, dtype=torch.int32)
            r = comm.Irecv([y, 3, 2, MPI.INT], src, k)
            comm.Barrier()
            send_in_mode(comm, name, "blocking", [x, 3, 4, MPI.INT], dst, k)
            r.Wait()
            expected = torch.zeros(8, dtype=torch.int32)
            expected[2:5] = rank_data(src, 8, torch.int32)[4:7]
            assert_equal(y, expected)
            for form in ("blocking", "nonblocking", "persistent"):
                send_in_mode(comm, name, form, x, MPI.PROC_NULL, k)


@case
def issend_completes_only_once_received(comm):
    """A synchronous send is not complete before the receive starts (MPI and Gloo)."""
    if comm.size == 1:
        return
    for backend in ("mpi", "gloo"):
        comm.Barrier(backend=backend)        # Gloo's group is made here, by all
        x = rank_data(comm.rank, 3, torch.float32)
        y = torch.zeros(3)
        if comm.rank % 2 == 0 and comm.rank + 1 < comm.size:
            req = comm.Issend(x, comm.rank + 1, 5, backend=backend)
            comm.Barrier()                   # the receiver has not posted its receive
            assert not req.Test(), backend
            comm.Barrier()
            req.Wait()
        elif comm.rank % 2 == 1:
            comm.Barrier()
            comm.Barrier()
            comm.Recv(y, comm.rank - 1, 5, backend=backend)
            assert_equal(y, rank_data(comm.rank - 1, 3, torch.float32))
        else:
            comm.Barrier()
            comm.Barrier()


@case
def send_modes_on_gloo(comm):
    """Composed on Gloo: every mode and form delivers, and Bsend needs no
    attached buffer (Gloo's sends are buffered)."""
    dst, src = right(comm), left(comm)
    for k, name in enumerate(SEND_MODES):
        for f, form in enumerate(("blocking", "nonblocking", "persistent")):
            tag = 10 * k + f
            y = torch.zeros(6, dtype=torch.int64)
            r = comm.Irecv(y, src, tag, backend="gloo")
            comm.Barrier()
            if name == "Ssend" and form == "blocking" and comm.size == 1:
                comm.Issend(rank_data(comm.rank, 6, torch.int64), dst, tag,
                            backend="gloo").Wait()
            else:
                send_in_mode(comm, name, form, rank_data(comm.rank, 6, torch.int64), dst,
                             tag, backend="gloo")
            r.Wait()
            assert_equal(y, rank_data(src, 6, torch.int64))


@case
def bsend_needs_the_attached_buffer(comm):
    """Bsend copies into the attached buffer, so it returns before any receive.
    (Not tested: a Bsend larger than the buffer, which raises MPI_ERR_BUFFER
    but leaves Open MPI 5.0 hanging in a later Isendrecv, mpi4py's too.)"""
    dst, src = right(comm), left(comm)
    x = rank_data(comm.rank, 256, torch.float64)
    with attached_buffer(x.numel() * 8):
        comm.Bsend(x, dst, 1)                # no receive posted yet: buffered
        x.zero_()                            # the copy went out, not the tensor
        y = torch.zeros(256, dtype=torch.float64)
        comm.Recv(y, src, 1)
        assert_equal(y, rank_data(src, 256, torch.float64))
    comm.Barrier()


@case
def send_modes_errors(comm):
    """Bad arguments raise before anything is sent, naming the argument."""
    x = torch.arange(4.)
    with attached_buffer(1 << 10):
        for name in SEND_MODES:
            i_name = "I" + name[0].lower() + name[1:]
            for method in (getattr(comm, name), getattr(comm, i_name),
                           getattr(comm, name + "_init")):
                with raises(IndexError, "dest", str(comm.size)):
                    method(x, comm.size, 0)
                with raises(ValueError, "tag"):
                    method(x, 0, -5)
                with raises(ValueError, "buf", "count 10", "past the buffer of 4"):
                    method([x, 10], 0, 0)
                with raises(TypeError, "buf"):
                    method("not a buffer", 0, 0)
                with raises(TypeError):
                    method(x, 0, 0, backend=3)
                with raises(ValueError, "backend"):
                    method(x, 0, 0, backend="nope")
    assert_comm_works(comm)


# -- Isendrecv, Isendrecv_replace -----------------------------------------------------


@case
def isendrecv_ring_every_dtype(comm):
    dst, src = right(comm), left(comm)
    reqs, expect = [], []
    for seed, dtype in enumerate(P2P_DTYPES):
        exp = rank_data(src, 7, dtype, seed)
        buf = blank_like(exp)
        reqs.append(comm.Isendrecv(rank_data(comm.rank, 7, dtype, seed), dst, seed, buf,
                                   src, seed))
        expect.append((buf, exp, seed))
    statuses = []
    mcr.Request.Waitall(reqs, statuses)
    for (buf, exp, seed), st in zip(expect, statuses):
        assert_equal(buf, exp)
        assert (st.source, st.tag, st.Get_count()) == (src, seed, 7)
    # numpy arrays, ANY_SOURCE/ANY_TAG, a status of the request
    y = np.zeros(5, np.float32)
    st = mcr.Status()
    comm.Isendrecv(np_data(comm.rank, 3, np.float32), dst, 40 + comm.rank, y,
                   MPI.ANY_SOURCE, MPI.ANY_TAG).Wait(st)
    np.testing.assert_array_equal(y[:3], np_data(src, 3, np.float32))
    np.testing.assert_array_equal(y[3:], 0)
    assert (st.source, st.tag, st.Get_count(), st.Get_count(MPI.BYTE)) == \
        (src, 40 + src, 3, 12)


@case
def isendrecv_replace_ring(comm):
    dst, src = right(comm), left(comm)
    for seed, dtype in enumerate((torch.float32, torch.int64, torch.complex128,
                                  torch.bfloat16, torch.bool)):
        buf = rank_data(comm.rank, 6, dtype, seed)
        st = mcr.Status()
        comm.Isendrecv_replace(buf, dst, seed, src, seed).Wait(st)
        assert_equal(buf, rank_data(src, 6, dtype, seed))
        assert (st.source, st.tag, st.Get_count()) == (src, seed, 6)
    a = np_data(comm.rank, 4, np.int16)
    comm.Isendrecv_replace([a, 2, 1, MPI.SHORT], dst, 9, src, 9).Wait()
    expected = np_data(comm.rank, 4, np.int16)
    expected[1:3] = np_data(src, 4, np.int16)[1:3]
    np.testing.assert_array_equal(a, expected)


@case
def isendrecv_proc_null_and_gloo(comm):
    x = rank_data(comm.rank, 4, torch.float32)
    y = torch.full((4,), -1.0)
    st = mcr.Status()
    comm.Isendrecv(x, MPI.PROC_NULL, 0, y, MPI.PROC_NULL, 0).Wait(st)
    assert_equal(y, torch.full((4,), -1.0))
    assert st.source == MPI.PROC_NULL
    dst, src = right(comm), left(comm)
    st = mcr.Status()
    comm.Isendrecv(x, dst, 3, y, src, 3, backend="gloo").Wait(st)
    assert_equal(y, rank_data(src, 4, torch.float32))
    assert (st.source, st.tag, st.Get_count()) == (src, 3, 4)
    z = rank_data(comm.rank, 5, torch.int32)
    comm.Isendrecv_replace(z, dst, 4, src, 4, backend="gloo").Wait()
    assert_equal(z, rank_data(src, 5, torch.int32))


def assert_truncated(call, arg, capacity, source, tag):
    """`call` raises MPI_ERR_TRUNCATE with the note of a 40-byte message."""
    try:
        call()
    except mcr.Exception as exc:
        assert exc.Get_error_class() == MPI.ERR_TRUNCATE, str(exc)
        tail = (f" from rank {source} (tag {tag}) does not fit the receive buffer of "
                f"{capacity} bytes")
        notes = getattr(exc, "__notes__", [])
        assert f"{arg}: message of 40 bytes{tail}" in notes or \
            f"{arg}: a message{tail}" in notes, notes
    else:
        raise AssertionError("MPI_ERR_TRUNCATE not raised")


@case
def isendrecv_composed(comm):
    """Isendrecv(_replace) as an Irecv and an Isend under one request, as mcr
    runs them on MPICH (whose MPI_Isendrecv leaves the status unset) and on
    libraries before MPI-4: the cases above, then truncation, Test, Waitany
    and Free on such a request."""
    mcr._core._compose_isendrecv(True)
    try:
        isendrecv_ring_every_dtype(comm)
        isendrecv_replace_ring(comm)
        isendrecv_proc_null_and_gloo(comm)
        dst, src = right(comm), left(comm)
        data = torch.arange(10.0)                   # 40 bytes
        if comm.size > 1:    # (Open MPI: a receive from itself posted first does not truncate)
            req = comm.Isendrecv(data, dst, 5, torch.zeros(3), src, 5)
            assert_truncated(req.Wait, "recvbuf", 12, src, 5)
        sreq = comm.Isend(data, dst, 6)
        req = comm.Isendrecv_replace(torch.zeros(1), MPI.PROC_NULL, 6, src, 6)
        assert_truncated(req.Wait, "buf", 4, src, 6)
        sreq.Wait()
        y = torch.zeros(4)
        req = comm.Isendrecv(rank_data(comm.rank, 4, torch.float32), dst, 7, y, src, 7)
        st = mcr.Status()
        while not req.Test(st):
            pass
        assert_equal(y, rank_data(src, 4, torch.float32))
        assert (st.source, st.tag, st.Get_count()) == (src, 7, 4)
        z = torch.zeros(4)
        reqs = [comm.Irecv(z, src, 8),
                comm.Isendrecv(rank_data(comm.rank, 4, torch.float32), dst, 9, y, src, 9)]
        comm.Send(rank_data(comm.rank + 1, 4, torch.float32), dst, 8)
        done = sorted(mcr.Request.Waitany(reqs) for _ in range(2))
        assert done == [0, 1]
        assert_equal(z, rank_data(src + 1, 4, torch.float32))
        assert_equal(y, rank_data(src, 4, torch.float32))
        w = torch.zeros(4)
        comm.Isendrecv(rank_data(comm.rank, 4, torch.float32), dst, 10, w, src, 10).Free()
        deadline = time.monotonic() + 30
        while not torch.equal(w, rank_data(src, 4, torch.float32)):
            assert time.monotonic() < deadline, "a freed Isendrecv did not complete"
            mcr._core._poll()                         # drives MPI and freed requests
        comm.Barrier()
    finally:
        mcr._core._compose_isendrecv(None)         # as the library calls for
    assert_comm_works(comm)


@case
def isendrecv_errors(comm):
    x = torch.arange(4.)
    y = torch.zeros(4)
    with raises(ValueError, "overlap"):
        comm.Isendrecv(x, 0, 0, [x, 2], 0, 0)
    with raises(ValueError, "recvbuf", "count 9"):
        comm.Isendrecv(x, 0, 0, [y, 9], 0, 0)
    with raises(BufferError, "recvbuf", "read-only"):
        comm.Isendrecv(x, 0, 0, b"read-only", 0, 0)
    with raises(IndexError, "source"):
        comm.Isendrecv(x, 0, 0, y, comm.size + 3, 0)
    with raises(ValueError, "sendtag"):
        comm.Isendrecv(x, 0, -2, y, 0, 0)
    with raises(BufferError, "buf", "read-only"):
        comm.Isendrecv_replace(b"read-only", 0, 0, 0, 0)
    with raises(IndexError, "dest"):
        comm.Isendrecv_replace(y, -7, 0, 0, 0)
    for backend in ("mpi", "gloo"):
        with raises(ValueError, "recvbuf", "count 9"):
            comm.Isendrecv(x, 0, 0, [y, 9], 0, 0, backend=backend)
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)
