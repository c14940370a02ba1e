"""Bad input raises a Python exception naming the argument and the numbers involved, before any
communication, and the communicator works afterwards; MPI's own errors come back as mcr.Exception
without aborting the job. Where only some ranks can detect an error (the root's receive buffer),
only they make the call and the others keep step, so that no peer waits.
"""

from functools import partial

import numpy as np
import torch
from mpi4py import MPI as _mpi4py

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases
from opref import rank_data
from util import assert_comm_works, assert_equal, assert_truncated, raises, ring


def check(comm, exc, rows, here=True):
    """Each row ("fragment|fragment", fn, *args): fn(*args) raises `exc` with every fragment (only
    where `here`); then comm works, on every rank."""
    for fragments, fn, *args in rows:
        if here:
            with raises(exc, *fragments.split("|")):
                fn(*args)
        assert_comm_works(comm)


class FakeCudaArray:
    """Looks like a CUDA array of 4 float32 to consumers (CuPy, Numba): device memory only."""
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0x7f0000000000, False),
                                "version": 3}


# -- counts and displacements -------------------------------------------------------------
@case
def vector_counts(comm):
    s, r = comm.size, comm.rank
    x, out, out2 = torch.ones(2), torch.zeros(2 * s + 4), torch.zeros(2 * s)
    ag, a2a, rs = comm.Allgatherv, comm.Alltoallv, comm.Reduce_scatter
    d = list(range(0, 2 * s, 2))
    first = min(i for i in range(s) if 3 * i + 3 > 2 * s)   # the first block past the end
    check(comm, ValueError, [
        (f"recvbuf|counts has {s + 1} entries|expected {s}", ag, x, [out, [2] * (s + 1)]),
        (f"recvbuf|counts has {s - 1} entries|expected {s}", ag, x, [out, [2] * (s - 1), d]),
        (f"recvbuf|displs has {s + 2} entries|expected {s}", ag, x, [out, [2] * s, [0] * (s + 2)]),
        ("recvbuf|displs has 0 entries", ag, x, [out, ([2] * s, [])]),
        (f"sendbuf|counts has {s + 1} entries",
         a2a, [torch.ones(s), [1] * (s + 1)], [torch.zeros(s), [1] * s]),
        (f"recvbuf|counts has {s + 1} entries", ag, x, [out, torch.full((s + 1,), 2)]),
        (f"recvbuf|displs has {s + 1} entries",
         ag, x, [out, np.full(s, 2), np.zeros(s + 1, np.int64)]),
        (f"recvcounts|has {s + 1} entries|expected {s}",
         rs, torch.ones(s), torch.zeros(1), [1] * (s + 1)),
        (f"recvbuf|counts[{s - 1}]|non-negative|-1", ag, x, [out, [2] * (s - 1) + [-1]]),
        ("recvbuf|displs[0]|non-negative|-2", ag, x, [out, [2] * s, [-2] + d[1:]]),
        ("recvbuf|displs[0]|-2", ag, x, [out, ([2] * s, [-2] + d[1:]), MPI.FLOAT]),
        ("recvcounts[0]|non-negative|-3", rs, torch.ones(s), torch.zeros(4), [-3] + [1] * (s - 1)),
        ("recvbuf|count|non-negative|-4", a2a, torch.ones(s), [torch.zeros(s), -4]),
        # past the buffer: the last block starts at its end; counts adding up to more
        (f"recvbuf|block {s - 1}|count 2 at displacement {2 * s}|buffer of {2 * s} elements",
         ag, x, [out2, [2] * s, d[:-1] + [2 * s]]),
        (f"recvbuf|block {first}|count 3 at displacement {3 * first}|buffer of {2 * s} elements",
         ag, torch.ones(3), [out2, [3] * s]),
        ("sendbuf|block 0|count 5|buffer of 4 elements",
         a2a, [torch.ones(4), [5] * s, [0] * s], [torch.zeros(5 * s), 5]),
        (f"sendbuf|has {s + 1} elements|sum(recvcounts) is {s}",
         rs, torch.ones(s + 1), torch.zeros(1), [1] * s),
        (f"recvbuf|counts must be 1-D|(1, {s})", ag, x, [out2, torch.full((1, s), 2)]),
        # Reduce_scatter without recvcounts gathers every process's counts: a send count wrong at
        # one rank is refused on all (none hangs)
        (f"sendbuf|has {s + 1} elements at rank {s - 1}|sum to {s}",
         rs, torch.ones(s + 1 if r == s - 1 else s), torch.zeros(1), None, mcr.SUM)])
    check(comm, TypeError, [
        ("recvbuf|counts must hold integers|float32", ag, x, [out2, torch.full((s,), 2.0)]),
        ("recvbuf|counts[0] must be an integer|float", ag, x, [out2, [2.0] * s]),
        ("recvbuf|counts must be a sequence of ints|object", ag, x, [out2, object()])])
    # and when rank 0 alone passes a bad argument
    check(comm, TypeError if r == 0 else ValueError, [
        ("recvbuf|got object", rs, torch.ones(s), object(), None, mcr.SUM) if r == 0 else
        ("refused at rank 0", rs, torch.ones(s), torch.zeros(1), None, mcr.SUM)])
    # Gatherv/Scatterv: only the root reads the vector spec; the others skip
    root, x4 = s - 1, torch.ones(2 * s)
    check(comm, ValueError, [
        (f"recvbuf|counts has {s + 1} entries",
         comm.Gatherv, x, [torch.zeros(4 * s), [2] * (s + 1)], root),
        (f"recvbuf|block {root}|reaches past the buffer",
         comm.Gatherv, x, [out2, [2] * s, [0] * (s - 1) + [2 * s - 1]], root),
        ("sendbuf|displs[0]|non-negative",
         comm.Scatterv, [x4, [2] * s, [-1] + [0] * (s - 1)], torch.zeros(2), root),
        (f"sendbuf|counts has {s - 1} entries",
         comm.Scatterv, [x4, [2] * (s - 1)], torch.zeros(2), root)], here=r == root)
    if s < 2:
        return
    # MPI forbids receiving into one location twice: overlapping blocks are refused, naming the
    # blocks and their elements (in any order)
    check(comm, ValueError, [
        ("recvbuf|blocks 0 (elements 0..1) and 1 (elements 1..2) overlap|twice",
         ag, x, [out2, [2] * s, [0, 1] + d[2:]]),
        (f"recvbuf|blocks {s - 1} (elements 1..2) and 0 (elements 2..3) overlap",
         ag, x, [torch.zeros(2 * s + 2), [2] * s, d[1:] + [1]]),
        ("recvbuf|overlap", a2a, torch.ones(2 * s), [out2, [2] * s, [0] * s]),
        ("recvbuf|overlap", comm.Ialltoallv, torch.ones(2 * s), [out2, 2, 1])])
    comm.Allgatherv(torch.ones(0), [torch.zeros(1), [0] * s, [0] * s])   # empty: no overlap
    check(comm, ValueError, [("recvbuf|overlap", comm.Gatherv, x, [out2, [2] * s, [0] * s],
                              root)], here=r == root)


@case
def counts_beyond_mpis_int_limit(comm):
    """MPI counts are C ints: a larger one is refused, naming the argument and the numbers (the
    2 GiB tensors are never touched, so they take no memory)."""
    n, limit, over = 2**31 + 8, "MPI count limit 2147483647", 2**31
    big, big2, x = torch.empty(n, dtype=torch.int8), torch.empty(n, dtype=torch.int8), torch.ones(2)
    dst, src = ring(comm)
    check(comm, OverflowError, [
        (f"buf|{n} elements exceed the {limit}", comm.Bcast, big, 0),
        (f"buf|{n} elements|{limit}", partial(comm.Bcast, backend="gloo"), big, 0),
        (f"buf|{n} elements|{limit}", comm.Send, big, dst),
        (f"buf|{n} elements|{limit}", comm.Recv_init, big, src),
        (f"recvbuf|{n} elements|{limit}", comm.Iallreduce, big, big2),
        (f"buf|{n} elements|{limit}", comm.Bcast, np.empty(n, np.int8), 0),
        (f"buf|{n} elements|{limit}", comm.Bcast, torch.empty(n, dtype=torch.float32), 0),
        (f"buf|count {over} exceeds the MPI limit", comm.Bcast, [x, over, MPI.FLOAT], 0),
        (f"recvbuf|counts[0] {over} exceeds", comm.Allgatherv, x, [x, [over] * comm.size]),
        (f"recvbuf|displs[0] {over} exceeds",
         comm.Allgatherv, x, [x, [2] * comm.size, [over] * comm.size])])


@case
def in_place_and_none_where_no_buffer_may_be(comm):
    """IN_PLACE and None where no such marker may be: refused, naming the argument (and rank)."""
    (dst, src), r = ring(comm), comm.rank
    no, ip, x = "IN_PLACE is not a buffer", MPI.IN_PLACE, torch.ones(2)
    check(comm, ValueError, [
        (f"recvbuf|{no}|only valid as the sendbuf of a collective", comm.Allreduce, x, ip),
        (f"recvbuf|{no}", comm.Allreduce, ip, ip), (f"buf|{no}", comm.Bcast, ip),
        (f"buf|{no}", comm.Ibcast, ip), (f"buf|{no}", comm.Send, ip, dst),
        (f"buf|{no}", comm.Isend, [ip, 0, MPI.INT], dst), (f"buf|{no}", comm.Recv, ip, src),
        (f"sendbuf|{no}", comm.Sendrecv, ip, dst, 0, torch.zeros(2), src, 0),
        (f"recvbuf|{no}", comm.Sendrecv, x, dst, 0, ip, src, 0),
        (f"recvbuf|{no}", comm.Allgatherv, x, ip), (f"recvbuf|{no}", comm.Allgather, ip, ip)])
    check(comm, TypeError, [
        ("recvbuf|None is not a buffer|2 elements of float32", comm.Allreduce, x, None),
        ("recvbuf|None is not a buffer", comm.Allreduce, None, None),
        ("recvbuf|None is not a buffer", comm.Iallreduce, ip, None),
        ("recvbuf|None is not a buffer", comm.Scan, x, None),
        (f"recvbuf|None is not a buffer|each of the {comm.size} processes", comm.Allgather, x,
         None),
        ("recvbuf|None is not a buffer", comm.Ialltoallv, x, None)])
    check(comm, ValueError, [
        (f"sendbuf|IN_PLACE is only valid at the root (0)|rank {r}",
         comm.Reduce, ip, None, mcr.SUM, 0),
        (f"sendbuf|IN_PLACE|rank {r}", comm.Gather, ip, None, 0),
        (f"recvbuf|IN_PLACE|rank {r}", comm.Scatter, None, ip, 0)], here=r != 0)
    g = "gloo" if comm.size > 1 else "mpi"    # the root's buffer that is None (only it calls)
    check(comm, TypeError, [
        (f"sendbuf|None at the root (rank 0)|each of the {comm.size} processes",
         comm.Scatter, None, x, 0),
        ("sendbuf|None at the root", partial(comm.Scatterv, backend=g), None, x, 0),
        (f"recvbuf|None at the root (rank 0)|each of the {comm.size} processes",
         comm.Gather, x, None, 0),
        ("recvbuf|None at the root", partial(comm.Igatherv, backend=g), x, None, 0)], here=r == 0)
    for backend in ("mpi", "gloo"):     # in point-to-point, None is an empty message
        req, status = comm.Isend(None, dst, 7, backend=backend), MPI.Status()
        comm.Recv(None, src, 7, status, backend=backend)
        assert req.Wait() and status.Get_count(MPI.BYTE) == 0 and status.source == src


# -- message specs, receive buffers too small, element types --------------------------------
@case
def message_specs(comm):
    buf, (dst, src), of4 = torch.zeros(4), ring(comm), "buffer of 4 elements"
    check(comm, ValueError, [
        (f"buf|count 5 at displacement 0|{of4}", comm.Send, [buf, 5], dst),
        (f"buf|count 2 at displacement 3|{of4}", comm.Recv, [buf, (2, 3)], src),
        (f"buf|count 1 at displacement 4|{of4}", comm.Isend, [buf, 1, 4, MPI.FLOAT], dst),
        (f"buf|displacement 5|past the end|{of4}", comm.Irecv, [buf, (None, 5)], src),
        ("buf|count must be non-negative|-1", comm.Send, [buf, -1], dst),
        ("buf|displacement must be non-negative|-1", comm.Send, [buf, (1, -1)], dst),
        ("buf|message must have 1 to 4 items|got 5", comm.Send, [buf, 1, 0, "f", 5], dst),
        ("buf|message must have 1 to 4 items|got 0", comm.Send, [], dst),
        ("buf|(count, displacement) pair|got 3 items", comm.Send, [buf, (1, 2, 3)], dst),
        (f"sendbuf|count 9|{of4}", comm.Sendrecv, [buf, 9], dst, 0, torch.zeros(9), src, 0),
        (f"recvbuf|count 9|{of4}", comm.Sendrecv, torch.zeros(9), dst, 0, [buf, 9], src, 0),
        (f"recvbuf|count 5 at displacement 0|{of4}", comm.Allreduce, torch.ones(5), [buf, 5]),
        (f"buf|count 8|{of4}", comm.Bcast, [buf, 8], 0),
        ("buf|buffer is None but count is 1", comm.Send, [None, 1, MPI.INT], dst),
        ("buf|buffer is BOTTOM but count is 2", comm.Send, [MPI.BOTTOM, 2, MPI.INT], dst),
        ("buf|displacement 1|empty message", comm.Send, [None, 0, 1, MPI.INT], dst),
        ("recvbuf|buffer is None but counts[0] is 1",
         comm.Allgatherv, [None, 0, MPI.INT], [None, [1] * comm.size, MPI.INT]),
        ("buf|cannot infer count|buffer length 10|datatype extent 8",
         comm.Send, [bytearray(10), MPI.DOUBLE], dst),
        ("buf|count 3|buffer of 2 elements",
         comm.Send, [torch.zeros(4, dtype=torch.int16), 3, MPI.INT], dst),
        ("buf|unknown typecode|'x?'", comm.Send, [torch.zeros(2), "x?"], dst),
        ("buf|DATATYPE_NULL", comm.Send, [torch.zeros(2), MPI.DATATYPE_NULL], dst)])
    check(comm, TypeError, [
        ("buf|count must be an integer|float", comm.Send, [buf, 1.5], dst),
        ("buf|datatype must be an MPI.Datatype or a typecode|int",
         comm.Send, [torch.zeros(2), 1, 0, 5], dst),
        ("sendbuf|float32|recvbuf|float64|element types must match",
         comm.Allreduce, [torch.zeros(2, dtype=torch.float64), MPI.FLOAT],
         torch.zeros(1, dtype=torch.float64)),
        ("4 bytes|1 bytes|datatypes must match",
         comm.Allreduce, [torch.zeros(2), MPI.FLOAT], [bytearray(8), MPI.BYTE])])


@case
def receive_buffer_too_small(comm):
    s, r, has = comm.size, comm.rank, "sendbuf has 4 elements|recvbuf has 3"
    f4, triple = np.float32, MPI.DOUBLE.Create_contiguous(3).Commit()   # datatypes differ:
    signature = "({} bytes of type signature sent, {} received)"        # their bytes are told
    rows = [(f"{has}|counts must match", comm.Allreduce, torch.ones(4), torch.zeros(3)),
            (has, comm.Iallreduce, torch.ones(4), torch.zeros(3)),
            (has, comm.Scan, torch.ones(4), torch.zeros(3)),
            (f"sendbuf|has 4 elements|recvbuf takes 3|rank {r}",
             comm.Allgather, torch.ones(4), torch.zeros(3 * s)),
            ("sendbuf sends 4 elements|recvbuf takes 3",
             comm.Alltoall, torch.ones(4 * s), torch.zeros(3 * s)),
            (f"sendbuf has {4 * s} elements|recvbuf count 3|{s} processes",
             comm.Reduce_scatter_block, torch.ones(4 * s), torch.zeros(3)),
            (f"recvbuf|holds 1 elements|recvcounts[{r}]|needs 2",
             comm.Reduce_scatter, torch.ones(2 * s), torch.zeros(1), [2] * s),
            (f"sendbuf|has 4 elements|recvbuf takes 3|rank {r}|{signature.format(4, 12)}",
             comm.Allgather, [np.ones(1, f4), 4, MPI.BYTE], [np.zeros(3 * s, f4), 3, MPI.FLOAT])]
    if s > 1:
        rows.append((f"recvbuf|{4 * s - 1} elements do not split evenly|{s} processes",
                     comm.Allgather, torch.ones(4), torch.zeros(4 * s - 1)))
    check(comm, ValueError, rows)
    for root in sorted({0, s - 1}):     # only the root knows its receive buffer is too small
        rows = [(f"sendbuf|has 3 elements|recvbuf takes 2|rank {root}",
                 comm.Gather, torch.ones(3), torch.zeros(2 * s), root),
                ("recvbuf|holds 2 elements|root sends itself 3",
                 comm.Scatter, torch.ones(3 * s), torch.zeros(2), root),
                ("sendbuf has 3 elements|recvbuf has 2",
                 comm.Reduce, torch.ones(3), torch.zeros(2), mcr.SUM, root),
                ("sendbuf|has 3 elements|recvbuf takes 2",
                 comm.Igather, torch.ones(3), torch.zeros(2 * s), root),
                (f"recvbuf|holds 2 elements|root sends itself 1|{signature.format(24, 16)}",
                 comm.Scatter, [np.ones(3 * s), 1, triple], [np.zeros(2), 2, MPI.DOUBLE], root)]
        if s > 1:
            rows += [(f"recvbuf|{3 * s + 1} elements do not split evenly|{s} processes",
                      comm.Gather, torch.ones(3), torch.zeros(3 * s + 1), root),
                     (f"sendbuf|{3 * s - 1} elements do not split evenly",
                      comm.Scatter, torch.ones(3 * s - 1), torch.zeros(3), root)]
        check(comm, ValueError, rows, here=r == root)
    triple.Free()


@case
def element_types(comm):
    s, dst = comm.size, ring(comm)[0]

    def z(n, dtype):
        return torch.zeros(n, dtype=dtype)
    rows = [("sendbuf has float32 elements|recvbuf has float64|element types must match",
             comm.Allreduce, torch.ones(3), z(3, torch.float64)),
            ("sendbuf has int32|recvbuf has int64",
             comm.Allgather, z(2, torch.int32), z(2 * s, torch.int64)),
            ("sendbuf has float16|recvbuf has bfloat16",
             comm.Alltoall, z(s, torch.float16), z(s, torch.bfloat16)),
            ("sendbuf has complex64|recvbuf has float64",
             comm.Reduce_scatter_block, z(s, torch.complex64), z(1, torch.float64)),
            ("sendbuf has bool|recvbuf has uint8",
             comm.Iallreduce, z(2, torch.bool), z(2, torch.uint8), mcr.LOR),
            ("sendbuf has float64|recvbuf has float32",
             comm.Allreduce, np.ones(3), np.zeros(3, np.float32)),
            ("sendbuf has int64|recvbuf has float64", comm.Exscan, z(3, torch.int64), np.zeros(3)),
            ("buf|torch.qint8|not supported",
             comm.Send, torch.quantize_per_tensor(torch.ones(4), 0.5, 0, torch.qint8), dst),
            ("buf|buffer format|not supported", comm.Send, np.zeros(2, "i4,f4"), dst)]
    for dtype in (torch.complex32, torch.float8_e4m3fn, torch.float8_e5m2):
        rows += [(f"buf|tensor dtype {dtype}|not supported|float32", comm.Send, z(4, dtype), dst),
                 (f"recvbuf|tensor dtype {dtype}|not supported",
                  comm.Allreduce, MPI.IN_PLACE, z(4, dtype)),
                 (f"recvbuf|tensor dtype {dtype}|not supported",       # and non-blocking
                  comm.Iallreduce, MPI.IN_PLACE, z(4, dtype)),
                 (f"buf|tensor dtype {dtype}|not supported", comm.Ibcast, z(4, dtype)),
                 (f"recvbuf|tensor dtype {dtype}|not supported",
                  comm.Iallgather, MPI.IN_PLACE, z(s, dtype))]
    check(comm, TypeError, rows)
    check(comm, BufferError, [("buf|byte order|not the machine's",
                               comm.Send, np.zeros(2, ">f4" if np.little_endian else "<f4"), dst)])
    check(comm, TypeError, [("sendbuf has float32|recvbuf has int32",     # the root's own block
                             comm.Gather, torch.ones(2), z(2 * s, torch.int32), 0)],
          here=comm.rank == 0)


# (element type, op, exception, fragments): refused by every reduction, before MPI
BAD_OPS = [
    (torch.float32, mcr.BAND, TypeError, "MPI.BAND does not apply to float32|SUM, PROD, MAX, MIN"),
    (torch.float64, mcr.BXOR, TypeError, "MPI.BXOR does not apply to float64|MAX"),
    (torch.float16, mcr.LAND, TypeError, "MPI.LAND does not apply to float16|MIN"),
    (torch.bfloat16, mcr.BOR, TypeError, "MPI.BOR does not apply to bfloat16|SUM"),
    (torch.complex64, mcr.MAX, TypeError, "MPI.MAX does not apply to complex64|SUM, PROD"),
    (torch.complex128, mcr.MIN, TypeError, "MPI.MIN does not apply to complex128|PROD"),
    (torch.bool, mcr.SUM, TypeError, "MPI.SUM does not apply to bool|LAND, LOR, LXOR"),
    (torch.bool, mcr.MAX, TypeError, "MPI.MAX does not apply to bool|LOR"),
    (torch.bool, mcr.BAND, TypeError, "MPI.BAND does not apply to bool|LXOR"),
    # REPLACE, NO_OP (one-sided only), OP_NULL, MAXLOC/MINLOC on plain types
    (torch.float32, MPI.REPLACE, TypeError, "MPI.REPLACE|not a reduction|float32"),
    (torch.int64, MPI.NO_OP, TypeError, "MPI.NO_OP|not a reduction|int64"),
    (torch.float64, MPI.OP_NULL, ValueError, "MPI.OP_NULL|not an operation|float64"),
    (torch.float64, MPI.MAXLOC, TypeError, "MPI.MAXLOC|float64|MPI.DOUBLE_INT"),
    (torch.int32, MPI.MINLOC, TypeError, "MPI.MINLOC|int32|pairs"),
]


@case
def ops_that_do_not_apply(comm):
    for backend in (None, "mpi", "gloo"):
        for dtype, op, exc, what in BAD_OPS:
            x = rank_data(comm.rank, comm.size, dtype)
            y, y1, ip = torch.zeros_like(x), x[:1].clone(), MPI.IN_PLACE
            calls = [(comm.Allreduce, x, y, op), (comm.Allreduce, ip, x.clone(), op),
                     (comm.Iallreduce, x, y, op), (comm.Reduce, x, y, op, 0),
                     (comm.Scan, x, y, op), (comm.Exscan, x, y, op),
                     (comm.Reduce_scatter_block, x, y1, op),
                     (comm.Reduce_scatter, x, y1, None, op), (comm.Allreduce_init, x, y, op)]
            check(comm, exc, [(f"op|{what}", partial(fn, backend=backend), *args)
                              for fn, *args in calls])
    x, y = torch.ones(2), torch.zeros(2)
    check(comm, TypeError, [
        ("op|expected an MPI.Op|str", comm.Allreduce, x, y, "sum"),
        ("op|expected an MPI.Op|NoneType", comm.Allreduce, x, y, None),
        ("MPI.REPLACE|uint8", comm.Allreduce, np.ones(2, np.uint8), np.zeros(2, np.uint8),
         MPI.REPLACE)])
    # characters, moved as their bytes: MPI reduces none (MPI_ERR_OP; Gloo summed them)
    w, out = [np.ones(2, np.int32), MPI.WCHAR], [np.zeros(2, np.int32), MPI.WCHAR]
    check(comm, TypeError, [(f"op|MPI.{name} does not apply to MPI.WCHAR",
                             partial(comm.Allreduce, backend=b), w, out, op)
                            for name, op in (("MAX", MPI.MAX), ("SUM", MPI.SUM))
                            for b in ("mpi", "gloo")])


# -- objects that are not (usable) buffers ------------------------------------------------
@case
def not_buffers(comm):
    dst, src = ring(comm)
    expected = "expected a torch.Tensor, a numpy array or an object with the buffer protocol"
    # a CUDA buffer, a tensor on another device, sparse layouts (a COO tensor is refused for its
    # layout: t.contiguous() would not make it usable)
    cuda, meta = FakeCudaArray(), torch.zeros(4, device="meta")
    csr, coo = torch.eye(3).to_sparse_csr(), torch.zeros(3).to_sparse()
    rows = [("sendbuf|got object", comm.Allreduce, object(), torch.zeros(2)),
            ("recvbuf|got object", comm.Allreduce, torch.ones(2), object()),
            ("recvbuf|got object", comm.Sendrecv, torch.ones(2), dst, 0, object(), src, 0),
            ("buf|got object", comm.Send, [object(), 2], dst),
            ("buf|CUDA buffer (FakeCudaArray)|no CUDA device", comm.Send, cuda, dst),
            ("buf|CUDA", comm.Irecv, cuda, src),
            ("sendbuf|CUDA", comm.Allreduce, cuda, torch.zeros(4)),
            ("recvbuf|CUDA", comm.Allreduce, torch.ones(4), cuda),
            ("buf|device meta|not supported", comm.Send, meta, dst),
            ("recvbuf|device meta", comm.Allreduce, torch.ones(4), meta),
            ("buf|layout torch.sparse_csr|not supported", comm.Send, csr, dst),
            ("recvbuf|layout torch.sparse_csr", comm.Allreduce, torch.ones(3, 3), csr),
            ("buf|layout torch.sparse_coo|not supported", comm.Send, coo, dst),
            ("recvbuf|layout torch.sparse_coo", comm.Allreduce, torch.ones(3), coo)]
    for obj in (object(), "abc", 3.5, 7, {1: 2}, True):
        name = type(obj).__name__
        rows += [(f"buf|{expected}|got {name}", comm.Send, obj, dst),
                 (f"buf|got {name}", comm.Irecv, obj, src)]
    check(comm, TypeError, rows)


@case
def read_only_and_non_contiguous_buffers(comm):
    dst, src = ring(comm)
    ro_np, strided = np.zeros(4), np.zeros(8)[::2]
    ro_np.setflags(write=False)
    rows = [("recvbuf|read-only", comm.Allgather, b"x", bytes(comm.size)),
            ("buf|read-only|writable", comm.Recv, ro_np, src),
            ("recvbuf|read-only", comm.Allreduce, np.ones(4), ro_np),
            ("buf|not contiguous",      # channels_last: dense but not C-contiguous
             comm.Send, torch.zeros(1, 2, 2, 2).to(memory_format=torch.channels_last), dst),
            ("buf|not contiguous", comm.Send, strided, dst),
            ("buf|not contiguous", comm.Recv, strided, src),
            ("recvbuf|not contiguous", comm.Allreduce, np.ones((3, 2)), np.zeros((3, 4))[:, 1:3])]
    for ro in (b"abcdefgh", memoryview(b"abcdefgh")):
        rows += [(f"buf|buffer of {type(ro).__name__} is read-only|receive buffer must be "
                  "writable", comm.Recv, ro, src),
                 ("buf|read-only", comm.Irecv, [ro, 4], src),
                 ("recvbuf|read-only", comm.Sendrecv, b"12345678", dst, 0, ro, src, 0),
                 ("recvbuf|read-only", comm.Allreduce, bytearray(8), ro, mcr.BOR)]
    for t, shape, strides in [(torch.zeros(8)[::2], "(4,)", "(2,)"),
                              (torch.zeros(3, 4).t(), "(4, 3)", "(1, 4)"),
                              (torch.zeros(3, 4)[:, 1:3], "(3, 2)", "(4, 1)"),
                              (torch.zeros(1).expand(4), "(4,)", "(0,)")]:
        rows += [(f"buf|tensor is not contiguous|shape {shape}|strides {strides}|contiguous()",
                  comm.Send, t, dst),
                 ("buf|not contiguous", comm.Irecv, [t, 1], src),
                 ("recvbuf|not contiguous", comm.Allreduce, torch.ones(t.shape), t),
                 ("sendbuf|not contiguous", comm.Allreduce, t, torch.zeros(t.shape))]
    check(comm, BufferError, rows)
    out = bytearray(8)                  # sending from read-only memory is fine
    comm.Sendrecv(b"abcdefgh", dst, 0, out, src, 0)
    assert bytes(out) == b"abcdefgh"
    # Bcast: only the receivers need writable memory
    check(comm, BufferError, [("buf|read-only", comm.Bcast, b"abcd", 0)], here=comm.rank != 0)


@case
def conjugate_and_negative_bits(comm):
    dst, src = ring(comm)
    x = rank_data(comm.rank, 4, torch.complex64).conj()
    assert x.is_conj()
    check(comm, BufferError, [
        ("buf|conjugate bit|resolve_conj()", comm.Send, x, dst),
        ("sendbuf|conjugate bit", comm.Allreduce, x, torch.zeros(4, dtype=torch.complex64)),
        ("recvbuf|conjugate bit", comm.Allreduce, torch.ones(4, dtype=torch.complex128),
         torch.zeros(4, dtype=torch.complex128).conj())])
    y = torch.zeros(4, dtype=torch.complex64)   # resolved, it sends the conjugated values
    comm.Sendrecv(x.resolve_conj(), dst, 0, y, src, 0)
    assert_equal(y, rank_data(src, 4, torch.complex64).conj().resolve_conj())
    # the negative bit (x.conj().imag): memory holds the un-negated values, which must not be sent
    # as they are: refused, or sent as the tensor shows them
    neg = rank_data(comm.rank, 1, torch.complex64).conj().imag
    assert neg.is_neg() and neg.is_contiguous()
    out = torch.zeros(1)
    try:
        comm.Sendrecv(neg, dst, 0, out, src, 0)
    except BufferError as exc:
        assert "buf" in str(exc) and "neg" in str(exc), exc
        assert_comm_works(comm)
        return
    assert_equal(out, rank_data(src, 1, torch.complex64).conj().imag.resolve_neg())


# -- ranks, tags, backends, status, requests, communicators --------------------------------
@case
def ranks_and_tags_out_of_range(comm):
    s, x, z, (dst, src) = comm.size, torch.ones(2), torch.zeros(2), ring(comm)
    valid, tag_ub = f"valid: 0..{s - 1}", comm.Get_attr(MPI.TAG_UB)
    rows = []
    for bad in (s, s + 3, -3, MPI.ANY_SOURCE):
        rows += [(f"dest|rank {bad}|size {s}|{valid}", comm.Send, x, bad),
                 (f"dest|rank {bad}", comm.Isend, x, bad),
                 (f"dest|rank {bad}", comm.Sendrecv, x, bad, 0, z, src, 0),
                 (f"root|rank {bad}|{valid}", comm.Bcast, x, bad),
                 (f"root|rank {bad}", comm.Reduce, x, z, mcr.SUM, bad),
                 (f"root|rank {bad}", comm.Gather, x, torch.zeros(2 * s), bad),
                 (f"root|rank {bad}", comm.Scatterv, None, x, bad),
                 (f"root|rank {bad}", comm.Ibcast, x, bad)]
    for bad in (s, s + 1, -3, -7):
        rows += [(f"source|rank {bad}|{valid}", comm.Recv, x, bad),
                 (f"source|rank {bad}", comm.Irecv, x, bad),
                 (f"source|rank {bad}", comm.Sendrecv, x, dst, 0, z, bad, 0),
                 (f"source|rank {bad}", comm.Probe, bad)]
    check(comm, IndexError, rows)
    check(comm, ValueError, [
        (f"tag|tag -1|out of range|0..{tag_ub}", comm.Send, x, dst, -1),
        (f"tag|tag -5|0..{tag_ub}|ANY_TAG", comm.Recv, x, src, -5),
        ("tag|tag -2", comm.Isend, x, dst, -2), ("tag|tag -9", comm.Irecv, x, src, -9),
        ("sendtag|tag -1", comm.Sendrecv, x, dst, -1, z, src, 0),
        ("recvtag|tag -3", comm.Sendrecv, x, dst, 0, z, src, -3),
        ("tag|tag -4", comm.Iprobe, MPI.ANY_SOURCE, -4),
        (f"tag|tag {MPI.ANY_TAG}", comm.Send, x, dst, MPI.ANY_TAG)])   # for receives only
    # above TAG_UB: a C int may overflow first
    exc = (OverflowError, ValueError) if tag_ub == 2**31 - 1 else ValueError
    for fn, peer in ((comm.Send, dst), (comm.Irecv, src)):
        try:
            fn(x, peer, tag_ub + 1)
        except exc as e:
            assert "tag" in str(e) and (str(tag_ub + 1) in str(e) or str(tag_ub) in str(e)), e
        else:
            raise AssertionError(f"tag {tag_ub + 1} > TAG_UB {tag_ub} was accepted")
        assert_comm_works(comm)


@case
def bad_backends(comm):
    x, dst = torch.ones(2), ring(comm)[0]
    check(comm, TypeError, [("backend|expected a string or None|int",
                             partial(comm.Bcast, backend=3), x, 0)])
    # a backend that cannot serve the buffer names itself and the buffer
    rows = [("sendbuf|backend 'nccl'|host memory",
             partial(comm.Allreduce, backend="nccl"), x, torch.zeros(2)),
            ("buf|backend 'nccl'|host memory", partial(comm.Send, backend="nccl"), x, dst)]
    for name in ("nccl-x", "Gloo", "", "MPI", "ucc"):
        rows += [(f"backend|unknown backend {name!r}|mpi, gloo, nccl",
                  partial(comm.Allreduce, backend=name), x, torch.zeros(2)),
                 (f"backend|{name!r}", partial(comm.Send, backend=name), x, dst),
                 ("backend", partial(comm.Ibarrier, backend=name))]
    check(comm, ValueError, rows)
    for name in (None, "mpi", "auto", "gloo"):     # the valid names work
        y = torch.zeros(2)
        comm.Allreduce(x, y, backend=name)
        assert_equal(y, torch.full((2,), float(comm.size)))


@case
def bad_status_and_requests(comm):
    x = torch.ones(2)
    req = comm.Irecv(x, MPI.PROC_NULL)
    check(comm, TypeError, [("status|expected an MPI.Status or None|int",
                             comm.Recv, x, MPI.PROC_NULL, 0, 5),
                            ("status|got str", req.Wait, "status"),
                            ("status|got str", req.Test, "status")])
    req.Wait()
    check(comm, TypeError, [("requests[1]|expected an MPI.Request|int",
                             mcr.Request.Waitall, [req, 1]),
                            ("requests[0]|got NoneType", mcr.Request.Testall, [None])])
    # a bad status is refused before the message is taken: it is there for the next receive
    dst, src = ring(comm)
    for backend in ("mpi", "gloo"):
        sreq = comm.Isend(rank_data(comm.rank, 3), dst, 21, backend=backend)
        out = torch.zeros(3)
        for got, fn, *args in [
                ("int", comm.Recv, out, src, 21, 123), ("str", comm.Probe, src, 21, "x"),
                ("list", comm.Iprobe, src, 21, []),
                ("int", comm.Sendrecv, rank_data(comm.rank, 3, seed=1), dst, 21, out, src, 21, 5),
                ("float", comm.Sendrecv_replace, out, dst, 21, src, 21, 1.0)]:
            with raises(TypeError, "status", f"got {got}"):
                fn(*args, backend=backend)
        st = MPI.Status()
        comm.Recv(out, src, 21, st, backend=backend)    # the first message, nothing else
        assert_equal(out, rank_data(src, 3))
        assert (st.Get_source(), st.Get_tag(), st.Get_count(MPI.FLOAT)) == (src, 21, 3)
        sreq.Wait()
        assert not comm.Iprobe(MPI.ANY_SOURCE, 21, backend=backend)
        comm.Barrier()
    assert_comm_works(comm)


@case
def aliased_buffers_and_null_communicators(comm):
    x, z, big, (dst, src) = torch.ones(4), torch.zeros(2), torch.ones(8), ring(comm)
    null = comm.Split(mcr.UNDEFINED)
    assert isinstance(null, mcr.Comm) and null == MPI.COMM_NULL
    dup = comm.Dup()
    assert_comm_works(dup)
    dup.Free()
    msg, y = "comm|communicator is null", torch.ones(2)
    s, r, w = comm.size, comm.rank, torch.zeros(3 * comm.size)
    mine, counts = w[3 * r:3 * r + 3], [3] * comm.size
    check(comm, ValueError, [
        ("sendbuf and recvbuf overlap|IN_PLACE as sendbuf", comm.Allreduce, x, x),
        ("overlap|sendbuf's 16 bytes, recvbuf's 16, recvbuf starting 8 bytes after sendbuf",
         comm.Allreduce, big[:4], big[2:6]),
        ("overlap|recvbuf starting 8 bytes before", comm.Allreduce, big[2:6], big[:4]),
        ("overlap|Sendrecv_replace sends a buffer and receives into it", comm.Sendrecv, x, dst,
         0, x, src, 0),
        # every collective with a send and a receive buffer (Open MPI runs some, and an
        # Alltoall computes garbage; MPICH refuses them)
        ("overlap|IN_PLACE as sendbuf", comm.Allgather, mine, w),
        ("overlap", comm.Allgatherv, w[:3], [w, counts]),
        ("overlap", comm.Alltoall, w, w), ("overlap", comm.Ialltoall, w, w),
        ("overlap", comm.Alltoall_init, w, w),
        ("overlap", partial(comm.Alltoall, backend="gloo"), w, w),
        ("overlap", comm.Alltoallv, [w, counts], [w, counts]),
        ("overlap", comm.Reduce_scatter_block, w, w[:3]),
        ("overlap", comm.Reduce_scatter, w, w[:3], counts),
        ("overlap", comm.Reduce_scatter, w, w[:3]),     # (counts gathered: all refuse together)
        ("overlap|IN_PLACE as sendbuf", comm.Gather, mine, w, r),     # each rank its own root
        ("overlap|IN_PLACE as recvbuf", comm.Scatterv, [w, counts], w[:3], r),
        (msg, null.Send, y, 0), (msg, null.Irecv, y, 0), (msg, null.Allreduce, y, z),
        (msg, null.Iallreduce, y, z), (msg, null.Bcast, y, 0), (msg, null.Barrier),
        (msg, null.Sendrecv, y, 0, 0, z, 0, 0),
        ("comm|null|freed", dup.Allreduce, y, z), ("comm|null", dup.Send, y, 0)])
    # two halves of one tensor do not overlap
    halves = torch.cat([rank_data(r, 3 * s), torch.zeros(3 * s)])
    comm.Alltoall(halves[:3 * s], halves[3 * s:])
    assert_equal(halves[3 * s:], torch.cat([rank_data(q, 3 * s)[3 * r:3 * r + 3]
                                            for q in range(s)]))
    # the odd ranks get a communicator, the even ones a null one (at 1 process, rank 0 alone)
    half = comm.Split(mcr.UNDEFINED if comm.rank % 2 == 0 else 0, comm.rank)
    if comm.rank % 2:
        assert isinstance(half, mcr.Comm) and half.size == comm.size // 2
        assert_comm_works(half)
    else:
        assert half == MPI.COMM_NULL and half.to_mpi4py() == _mpi4py.COMM_NULL
        with raises(ValueError, *msg.split("|")):
            half.Allreduce(y, z)
    half.Free()                                  # on a null comm: a no-op
    assert_comm_works(comm)


# -- MPI's own errors ---------------------------------------------------------------------
def started(preq):
    try:
        preq.Start()
        preq.Wait()
    finally:
        preq.Free()


def until_done(req):
    while not req.Test():
        pass


@case
def mpi_errors_come_back_as_mcr_exceptions(comm):
    """MPI_ERR_TRUNCATE as an mcr.Exception from every way to receive, with a note giving the sizes,
    source and tag (as the Gloo path words it); an uncommitted datatype's error too."""
    dst, src = ring(comm)
    data, z, trunc = torch.arange(10.0), torch.zeros, MPI.ERR_TRUNCATE     # 40 bytes
    # (argument, its bytes, error class, receive of the message of tag t that sreq sends)
    rows = [("buf", 16, trunc, lambda t: comm.Recv(z(4), src, t)),
            ("buf", 12, trunc, lambda t: comm.Irecv(z(3), src, t).Wait()),
            ("buf", 6, trunc, lambda t: until_done(comm.Irecv(z(3, dtype=torch.int16), src, t))),
            ("buf", 4, trunc, lambda t: comm.Sendrecv_replace(z(1), MPI.PROC_NULL, t, src, t)),
            ("requests[1]", 4, MPI.ERR_IN_STATUS,
             lambda t: mcr.Request.Waitall([sreq, comm.Irecv(z(1), src, t)], (MPI.Status(),))),
            ("requests[0]", 4, trunc, lambda t: mcr.Request.Waitany([comm.Irecv(z(1), src, t)])),
            ("buf", 8, trunc, lambda t: started(comm.Recv_init(z(2), src, t)))]
    if comm.size > 1:     # Open MPI does not see a receive from itself posted first truncate
        rows.append(("recvbuf", 8, trunc, lambda t: comm.Sendrecv(data, dst, t, z(2), src, t)))
    for tag, (arg, capacity, error_class, receive) in enumerate(rows, 31):
        sreq = None if arg == "recvbuf" else comm.Isend(data, dst, tag)   # Sendrecv sends
        exc = assert_truncated(lambda: receive(tag), arg, capacity, src, tag, 40, error_class)
        assert tag != 31 or "TRUNCATE" in str(exc) or "truncat" in str(exc), exc
        if sreq is not None:
            sreq.Wait()
        assert_comm_works(comm)
    sreq = comm.Isend(data, dst, 13)         # Waitall, the send last, no statuses
    with raises(mcr.Exception):
        mcr.Request.Waitall([comm.Irecv(z(2), src, 13), sreq])
    sreq.Wait()
    out = z(10)                              # and the ring still moves data
    comm.Sendrecv(data + comm.rank, dst, 14, out, src, 14)
    assert_equal(out, data + src)
    # mcr does not pre-validate user datatypes; MPI rejects an uncommitted one
    dt = MPI.FLOAT.Create_contiguous(2)
    try:
        with raises(mcr.Exception):
            comm.Send([z(4), 2, dt], dst, 0)
        try:
            comm.Allreduce([z(4), 2, dt], [z(4), 2, dt], mcr.SUM)
        except mcr.Exception as exc:
            assert isinstance(exc, _mpi4py.Exception)
            assert exc.Get_error_class() in (MPI.ERR_TYPE, MPI.ERR_OP, MPI.ERR_ARG), exc
        else:
            raise AssertionError("MPI accepted an uncommitted datatype")
    finally:
        dt.Free()
    assert_comm_works(comm)


@case
def errors_do_not_leak_requests_or_block(comm):
    """Many failing calls, then a real exchange: nothing was left half-posted (no stray message)."""
    dst, src = ring(comm)
    for i in range(50):
        with raises(ValueError):
            comm.Isend([torch.ones(2), 3], dst, i)
        with raises(IndexError):
            comm.Irecv(torch.zeros(2), comm.size + i)
    st = mcr.Status()
    out = torch.zeros(8)
    comm.Sendrecv(torch.full((2,), float(comm.rank)), dst, 0, out, src, MPI.ANY_TAG, st)
    assert st.tag == 0 and st.Get_count() == 2
    assert_equal(out[:2], torch.full((2,), float(src)))
    assert_comm_works(comm)


def test_errors_in_process_on_comm_self():
    """The same checks on COMM_SELF, in this process, without mpiexec."""
    comm = mcr.COMM_SELF
    check(comm, ValueError, [
        ("buf|count 5", comm.Send, [torch.zeros(4), 5], 0),
        ("backend|'nccl-x'", partial(comm.Barrier, backend="nccl-x")),
        ("backend 'nccl'|host memory", partial(comm.Bcast, backend="nccl"), torch.ones(2))])
    check(comm, IndexError, [("dest|rank 1|size 1", comm.Send, torch.zeros(4), 1)])
    check(comm, TypeError, [("op|MPI.BAND|float32",
                             comm.Allreduce, torch.ones(2), torch.zeros(2), mcr.BAND)])
    check(comm, BufferError, [("buf|not contiguous", comm.Send, torch.zeros(4)[::2], 0)])
    sreq = comm.Isend(torch.arange(6.0), 0, 0)
    with raises(mcr.Exception):
        comm.Recv(torch.zeros(2), 0, 0)
    sreq.Wait()
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)
