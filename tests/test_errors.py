"""Bad input: every kind of bad argument raises a Python exception that names
the argument and the numbers involved, before any communication, and the
communicator still works afterwards (util.assert_comm_works after each one).

Where every rank can detect the error, every rank makes the failing call (so
nobody is left waiting for a peer). Where only some ranks can (e.g. a too-small
receive buffer at the root of a Gather), only those make the call and the
others skip it. MPI's own errors come back as mcr.Exception (an
mpi4py.MPI.Exception) without aborting the job.
"""

import numpy as np
import torch
from mpi4py import MPI as _mpi4py

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases
from util import assert_comm_works, assert_equal, raises, rank_data


def right(comm):
    return (comm.rank + 1) % comm.size


def left(comm):
    return (comm.rank - 1) % comm.size


def check(comm, exc, fragments, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` raises `exc` with all `fragments`; comm still works."""
    with raises(exc, *fragments):
        fn(*args, **kwargs)
    assert_comm_works(comm)


class FakeCudaArray:
    """Looks like a CUDA array to consumers (CuPy, Numba): device memory only."""

    def __init__(self, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4",
                                         "data": (0x7f0000000000, False), "version": 3}


# -- counts and displacements -------------------------------------------------------------


@case
def vector_counts_wrong_length(comm):
    size = comm.size
    x = torch.ones(2)
    out = torch.zeros(2 * size + 4)
    check(comm, ValueError, ["recvbuf", f"counts has {size + 1} entries", f"expected {size}"],
          comm.Allgatherv, x, [out, [2] * (size + 1)])
    check(comm, ValueError, ["recvbuf", f"counts has {size - 1} entries", f"expected {size}"],
          comm.Allgatherv, x, [out, [2] * (size - 1), list(range(0, 2 * size, 2))])
    check(comm, ValueError, ["recvbuf", f"displs has {size + 2} entries", f"expected {size}"],
          comm.Allgatherv, x, [out, [2] * size, [0] * (size + 2)])
    check(comm, ValueError, ["recvbuf", "displs has 0 entries"],
          comm.Allgatherv, x, [out, ([2] * size, [])])
    check(comm, ValueError, ["sendbuf", f"counts has {size + 1} entries"],
          comm.Alltoallv, [torch.ones(size), [1] * (size + 1)], [torch.zeros(size), [1] * size])
    # as integer tensors/arrays too
    check(comm, ValueError, ["recvbuf", f"counts has {size + 1} entries"],
          comm.Allgatherv, x, [out, torch.full((size + 1,), 2)])
    check(comm, ValueError, ["recvbuf", f"displs has {size + 1} entries"],
          comm.Allgatherv, x, [out, np.full(size, 2), np.zeros(size + 1, np.int64)])
    check(comm, ValueError, ["recvcounts", f"has {size + 1} entries", f"expected {size}"],
          comm.Reduce_scatter, torch.ones(size), torch.zeros(1), [1] * (size + 1))


@case
def vector_counts_negative(comm):
    size = comm.size
    x = torch.ones(2)
    out = torch.zeros(2 * size + 4)
    counts = [2] * size
    counts[-1] = -1
    check(comm, ValueError, ["recvbuf", f"counts[{size - 1}]", "non-negative", "-1"],
          comm.Allgatherv, x, [out, counts])
    displs = list(range(0, 2 * size, 2))
    displs[0] = -2
    check(comm, ValueError, ["recvbuf", "displs[0]", "non-negative", "-2"],
          comm.Allgatherv, x, [out, [2] * size, displs])
    check(comm, ValueError, ["recvbuf", "displs[0]", "-2"],
          comm.Allgatherv, x, [out, ([2] * size, displs), MPI.FLOAT])
    check(comm, ValueError, ["recvcounts[0]", "non-negative", "-3"],
          comm.Reduce_scatter, torch.ones(size), torch.zeros(4), [-3] + [1] * (size - 1))
    check(comm, ValueError, ["recvbuf", "count", "non-negative", "-4"],
          comm.Alltoallv, torch.ones(size), [torch.zeros(size), -4])


@case
def vector_counts_past_the_buffer(comm):
    size = comm.size
    x = torch.ones(2)
    out = torch.zeros(2 * size)
    # the last block starts at the end of the buffer
    displs = list(range(0, 2 * size, 2))
    displs[-1] = 2 * size
    check(comm, ValueError, ["recvbuf", f"block {size - 1}", f"count 2 at displacement {2 * size}",
                             f"buffer of {2 * size} elements"],
          comm.Allgatherv, x, [out, [2] * size, displs])
    # counts that add up to more than the buffer: the first block that does not fit
    first = min(i for i in range(size) if 3 * i + 3 > 2 * size)
    check(comm, ValueError, ["recvbuf", f"block {first}", f"count 3 at displacement {3 * first}",
                             f"buffer of {2 * size} elements"],
          comm.Allgatherv, torch.ones(3), [out, [3] * size])
    check(comm, ValueError, ["sendbuf", "block 0", "count 5", "buffer of 4 elements"],
          comm.Alltoallv, [torch.ones(4), [5] * size, [0] * size], [torch.zeros(5 * size), 5])
    # counts of the wrong kind
    check(comm, ValueError, ["recvbuf", "counts must be 1-D", f"(1, {size})"],
          comm.Allgatherv, x, [out, torch.full((1, size), 2)])
    check(comm, TypeError, ["recvbuf", "counts must hold integers", "float32"],
          comm.Allgatherv, x, [out, torch.full((size,), 2.0)])
    check(comm, TypeError, ["recvbuf", "counts[0] must be an integer", "float"],
          comm.Allgatherv, x, [out, [2.0] * size])
    check(comm, TypeError, ["recvbuf", "counts must be a sequence of ints", "object"],
          comm.Allgatherv, x, [out, object()])
    check(comm, ValueError, ["sendbuf", f"has {size + 1} elements", f"sum(recvcounts) is {size}"],
          comm.Reduce_scatter, torch.ones(size + 1), torch.zeros(1), [1] * size)


@case
def vector_counts_bad_at_the_root_only(comm):
    """Gatherv/Scatterv: only the root reads the vector spec; the others skip."""
    size, root = comm.size, comm.size - 1
    if comm.rank == root:
        check_root = check
    else:
        def check_root(comm, *args, **kwargs):
            assert_comm_works(comm)
    check_root(comm, ValueError, ["recvbuf", f"counts has {size + 1} entries"],
               comm.Gatherv, torch.ones(2), [torch.zeros(4 * size), [2] * (size + 1)], root)
    check_root(comm, ValueError, ["recvbuf", f"block {root}", "reaches past the buffer"],
               comm.Gatherv, torch.ones(2), [torch.zeros(2 * size), [2] * size,
                                            [0] * (size - 1) + [2 * size - 1]], root)
    check_root(comm, ValueError, ["sendbuf", "displs[0]", "non-negative"],
               comm.Scatterv, [torch.ones(2 * size), [2] * size, [-1] + [0] * (size - 1)],
               torch.zeros(2), root)
    check_root(comm, ValueError, ["sendbuf", f"counts has {size - 1} entries"],
               comm.Scatterv, [torch.ones(2 * size), [2] * (size - 1)], torch.zeros(2), root)


@case
def overlapping_receive_blocks(comm):
    """MPI forbids receiving into one location twice: overlapping blocks of a
    vector receive are refused, with the blocks and their elements."""
    size = comm.size
    if size < 2:
        return
    x = torch.ones(2)
    out = torch.zeros(2 * size)
    displs = list(range(0, 2 * size, 2))
    displs[1] = 1                     # block 1 (elements 1..2) overlaps block 0 (0..1)
    check(comm, ValueError, ["recvbuf", "blocks 0 (elements 0..1) and 1 (elements 1..2) "
                             "overlap", "twice"],
          comm.Allgatherv, x, [out, [2] * size, displs])
    # out of order: the last block on top of the first
    displs = list(range(2, 2 * size + 2, 2))
    displs[-1] = 1
    check(comm, ValueError, ["recvbuf", f"blocks {size - 1} (elements 1..2) and 0 "
                             "(elements 2..3) overlap"],
          comm.Allgatherv, x, [torch.zeros(2 * size + 2), [2] * size, displs])
    check(comm, ValueError, ["recvbuf", "overlap"],
          comm.Alltoallv, torch.ones(2 * size), [out, [2] * size, [0] * size])
    check(comm, ValueError, ["recvbuf", "overlap"],
          comm.Ialltoallv, torch.ones(2 * size), [out, 2, 1])
    # empty blocks overlap nothing; the same buffer for send and receive is IN_PLACE's job
    comm.Allgatherv(torch.ones(0), [torch.zeros(1), [0] * size, [0] * size])
    root = size - 1
    if comm.rank == root:
        check(comm, ValueError, ["recvbuf", "overlap"],
              comm.Gatherv, x, [out, [2] * size, [0] * size], root)
    else:
        assert_comm_works(comm)


@case
def in_place_where_no_buffer_may_be(comm):
    """IN_PLACE is a sendbuf marker, not a buffer: refused, naming the argument,
    wherever a buffer is needed."""
    dst, src = right(comm), left(comm)
    where = "only valid as the sendbuf of a collective"
    check(comm, ValueError, ["recvbuf", "IN_PLACE is not a buffer", where],
          comm.Allreduce, torch.ones(2), MPI.IN_PLACE)
    check(comm, ValueError, ["recvbuf", "IN_PLACE is not a buffer"],
          comm.Allreduce, MPI.IN_PLACE, MPI.IN_PLACE)
    check(comm, ValueError, ["buf", "IN_PLACE is not a buffer"], comm.Bcast, MPI.IN_PLACE)
    check(comm, ValueError, ["buf", "IN_PLACE is not a buffer"], comm.Ibcast, MPI.IN_PLACE)
    check(comm, ValueError, ["buf", "IN_PLACE is not a buffer"], comm.Send, MPI.IN_PLACE, dst)
    check(comm, ValueError, ["buf", "IN_PLACE is not a buffer"],
          comm.Isend, [MPI.IN_PLACE, 0, MPI.INT], dst)
    check(comm, ValueError, ["buf", "IN_PLACE is not a buffer"], comm.Recv, MPI.IN_PLACE, src)
    check(comm, ValueError, ["sendbuf", "IN_PLACE is not a buffer"],
          comm.Sendrecv, MPI.IN_PLACE, dst, 0, torch.zeros(2), src, 0)
    check(comm, ValueError, ["recvbuf", "IN_PLACE is not a buffer"],
          comm.Sendrecv, torch.ones(2), dst, 0, MPI.IN_PLACE, src, 0)
    check(comm, ValueError, ["recvbuf", "IN_PLACE is not a buffer"],
          comm.Allgatherv, torch.ones(2), MPI.IN_PLACE)
    check(comm, ValueError, ["recvbuf", "IN_PLACE is not a buffer"],
          comm.Allgather, MPI.IN_PLACE, MPI.IN_PLACE)
    # None is not a buffer for the result of a reduction
    check(comm, TypeError, ["recvbuf", "None is not a buffer", "2 elements of float32"],
          comm.Allreduce, torch.ones(2), None)
    check(comm, TypeError, ["recvbuf", "None is not a buffer"], comm.Allreduce, None, None)
    check(comm, TypeError, ["recvbuf", "None is not a buffer"],
          comm.Iallreduce, MPI.IN_PLACE, None)
    check(comm, TypeError, ["recvbuf", "None is not a buffer"], comm.Scan, torch.ones(2), None)


@case
def none_buffer_with_a_count(comm):
    dst = right(comm)
    check(comm, ValueError, ["buf", "buffer is None but count is 1"],
          comm.Send, [None, 1, MPI.INT], dst)
    check(comm, ValueError, ["buf", "buffer is BOTTOM but count is 2"],
          comm.Send, [MPI.BOTTOM, 2, MPI.INT], dst)
    check(comm, ValueError, ["buf", "displacement 1", "empty message"],
          comm.Send, [None, 0, 1, MPI.INT], dst)
    check(comm, ValueError, ["recvbuf", "buffer is None but counts[0] is 1"],
          comm.Allgatherv, [None, 0, MPI.INT], [None, [1] * comm.size, MPI.INT])


@case
def reduce_scatter_refused_on_one_rank_is_refused_on_all(comm):
    """Reduce_scatter without recvcounts gathers every process's counts: when
    one process's arguments are wrong, all of them raise (none hangs)."""
    size, rank = comm.size, comm.rank
    if rank == 0:
        check(comm, TypeError, ["recvbuf", "got object"],
              comm.Reduce_scatter, torch.ones(size), object(), None, mcr.SUM)
    else:
        check(comm, ValueError, ["refused at rank 0"],
              comm.Reduce_scatter, torch.ones(size), torch.zeros(1), None, mcr.SUM)
    # a send count that does not match the sum of the receive counts, at one rank
    n = size + 1 if rank == size - 1 else size
    check(comm, ValueError, ["sendbuf", f"has {size + 1} elements at rank {size - 1}",
                             f"sum to {size}"],
          comm.Reduce_scatter, torch.ones(n), torch.zeros(1), None, mcr.SUM)


# -- simple messages: counts, displacements, datatypes ---------------------------------


@case
def simple_counts_and_displacements(comm):
    buf = torch.zeros(4)
    dst, src = right(comm), left(comm)
    check(comm, ValueError, ["buf", "count 5 at displacement 0", "buffer of 4 elements"],
          comm.Send, [buf, 5], dst)
    check(comm, ValueError, ["buf", "count 2 at displacement 3", "buffer of 4 elements"],
          comm.Recv, [buf, (2, 3)], src)
    check(comm, ValueError, ["buf", "count 1 at displacement 4", "buffer of 4 elements"],
          comm.Isend, [buf, 1, 4, MPI.FLOAT], dst)
    check(comm, ValueError, ["buf", "displacement 5", "past the end", "buffer of 4 elements"],
          comm.Irecv, [buf, (None, 5)], src)
    check(comm, ValueError, ["buf", "count must be non-negative", "-1"],
          comm.Send, [buf, -1], dst)
    check(comm, ValueError, ["buf", "displacement must be non-negative", "-1"],
          comm.Send, [buf, (1, -1)], dst)
    check(comm, TypeError, ["buf", "count must be an integer", "float"],
          comm.Send, [buf, 1.5], dst)
    check(comm, ValueError, ["buf", "message must have 1 to 4 items", "got 5"],
          comm.Send, [buf, 1, 0, "f", 5], dst)
    check(comm, ValueError, ["buf", "message must have 1 to 4 items", "got 0"],
          comm.Send, [], dst)
    check(comm, ValueError, ["buf", "(count, displacement) pair", "got 3 items"],
          comm.Send, [buf, (1, 2, 3)], dst)
    check(comm, ValueError, ["sendbuf", "count 9", "buffer of 4 elements"],
          comm.Sendrecv, [buf, 9], dst, 0, torch.zeros(9), src, 0)
    check(comm, ValueError, ["recvbuf", "count 9", "buffer of 4 elements"],
          comm.Sendrecv, torch.zeros(9), dst, 0, [buf, 9], src, 0)
    # collectives: the same parsing, the same messages
    check(comm, ValueError, ["recvbuf", "count 5 at displacement 0", "buffer of 4 elements"],
          comm.Allreduce, torch.ones(5), [buf, 5])
    check(comm, ValueError, ["buf", "count 8", "buffer of 4 elements"],
          comm.Bcast, [buf, 8], 0)


@case
def explicit_datatypes(comm):
    dst = right(comm)
    check(comm, ValueError, ["buf", "cannot infer count", "buffer length 10",
                             "datatype extent 8"],
          comm.Send, [bytearray(10), MPI.DOUBLE], dst)
    check(comm, ValueError, ["buf", "count 3", "buffer of 2 elements"],
          comm.Send, [torch.zeros(4, dtype=torch.int16), 3, MPI.INT], dst)
    check(comm, ValueError, ["buf", "unknown typecode", "'x?'"],
          comm.Send, [torch.zeros(2), "x?"], dst)
    check(comm, TypeError, ["buf", "datatype must be an MPI.Datatype or a typecode", "int"],
          comm.Send, [torch.zeros(2), 1, 0, 5], dst)
    check(comm, ValueError, ["buf", "DATATYPE_NULL"],
          comm.Send, [torch.zeros(2), MPI.DATATYPE_NULL], dst)
    check(comm, TypeError, ["sendbuf", "float32", "recvbuf", "float64",
                            "element types must match"],
          comm.Allreduce, [torch.zeros(2, dtype=torch.float64), MPI.FLOAT],
          torch.zeros(1, dtype=torch.float64))
    check(comm, TypeError, ["4 bytes", "1 bytes", "datatypes must match"],
          comm.Allreduce, [torch.zeros(2), MPI.FLOAT], [bytearray(8), MPI.BYTE])


# -- receive buffer too small ---------------------------------------------------------------


@case
def receive_buffer_too_small_everywhere(comm):
    size, n = comm.size, 4
    check(comm, ValueError, ["sendbuf has 4 elements", "recvbuf has 3", "counts must match"],
          comm.Allreduce, torch.ones(n), torch.zeros(n - 1))
    check(comm, ValueError, ["sendbuf has 4 elements", "recvbuf has 3"],
          comm.Iallreduce, torch.ones(n), torch.zeros(n - 1))
    check(comm, ValueError, ["sendbuf has 4 elements", "recvbuf has 3"],
          comm.Scan, torch.ones(n), torch.zeros(n - 1))
    check(comm, ValueError, ["sendbuf", "has 4 elements", "recvbuf takes 3",
                             f"rank {comm.rank}"],
          comm.Allgather, torch.ones(n), torch.zeros((n - 1) * size))
    check(comm, ValueError, ["sendbuf sends 4 elements", "recvbuf takes 3"],
          comm.Alltoall, torch.ones(n * size), torch.zeros((n - 1) * size))
    check(comm, ValueError, [f"sendbuf has {n * size} elements", "recvbuf count 3",
                             f"{size} processes"],
          comm.Reduce_scatter_block, torch.ones(n * size), torch.zeros(n - 1))
    check(comm, ValueError, ["recvbuf", "holds 1 elements", f"recvcounts[{comm.rank}]",
                             "needs 2"],
          comm.Reduce_scatter, torch.ones(2 * size), torch.zeros(1), [2] * size)
    if size > 1:
        check(comm, ValueError, ["recvbuf", f"{n * size - 1} elements do not split evenly",
                                 f"{size} processes"],
              comm.Allgather, torch.ones(n), torch.zeros(n * size - 1))


@case
def receive_buffer_too_small_at_the_root(comm):
    """Rooted collectives: only the root knows its receive buffer is too small."""
    size, n = comm.size, 3
    for root in sorted({0, size - 1}):
        at_root = comm.rank == root
        if at_root:
            check(comm, ValueError, ["sendbuf", "has 3 elements", "recvbuf takes 2",
                                     f"rank {root}"],
                  comm.Gather, torch.ones(n), torch.zeros(2 * size), root)
            check(comm, ValueError, ["recvbuf", "holds 2 elements", "root sends itself 3"],
                  comm.Scatter, torch.ones(n * size), torch.zeros(2), root)
            check(comm, ValueError, ["sendbuf has 3 elements", "recvbuf has 2"],
                  comm.Reduce, torch.ones(n), torch.zeros(2), mcr.SUM, root)
            check(comm, ValueError, ["sendbuf", "has 3 elements", "recvbuf takes 2"],
                  comm.Igather, torch.ones(n), torch.zeros(2 * size), root)
            if size > 1:
                check(comm, ValueError, ["recvbuf", f"{n * size + 1} elements do not split "
                                         "evenly", f"{size} processes"],
                      comm.Gather, torch.ones(n), torch.zeros(n * size + 1), root)
                check(comm, ValueError, ["sendbuf", f"{n * size - 1} elements do not split "
                                         "evenly"],
                      comm.Scatter, torch.ones(n * size - 1), torch.zeros(n), root)
        else:
            for _ in range(6 if size > 1 else 4):
                assert_comm_works(comm)


@case
def in_place_only_at_the_root(comm):
    """IN_PLACE where only the root may pass it: the other ranks detect it."""
    root = 0
    if comm.rank != root:
        check(comm, ValueError, ["sendbuf", "IN_PLACE is only valid at the root (0)",
                                 f"rank {comm.rank}"],
              comm.Reduce, MPI.IN_PLACE, None, mcr.SUM, root)
        check(comm, ValueError, ["sendbuf", "IN_PLACE", f"rank {comm.rank}"],
              comm.Gather, MPI.IN_PLACE, None, root)
        check(comm, ValueError, ["recvbuf", "IN_PLACE", f"rank {comm.rank}"],
              comm.Scatter, None, MPI.IN_PLACE, root)
    else:
        for _ in range(3):
            assert_comm_works(comm)


# -- element types --------------------------------------------------------------------------


@case
def send_recv_dtype_mismatch(comm):
    size = comm.size
    check(comm, TypeError, ["sendbuf has float32 elements", "recvbuf has float64",
                            "element types must match"],
          comm.Allreduce, torch.ones(3), torch.zeros(3, dtype=torch.float64))
    check(comm, TypeError, ["sendbuf has int32", "recvbuf has int64"],
          comm.Allgather, torch.ones(2, dtype=torch.int32),
          torch.zeros(2 * size, dtype=torch.int64))
    check(comm, TypeError, ["sendbuf has float16", "recvbuf has bfloat16"],
          comm.Alltoall, torch.ones(size, dtype=torch.float16),
          torch.zeros(size, dtype=torch.bfloat16))
    check(comm, TypeError, ["sendbuf has complex64", "recvbuf has float64"],
          comm.Reduce_scatter_block, torch.ones(size, dtype=torch.complex64),
          torch.zeros(1, dtype=torch.float64))
    check(comm, TypeError, ["sendbuf has bool", "recvbuf has uint8"],
          comm.Iallreduce, torch.ones(2, dtype=torch.bool), torch.zeros(2, dtype=torch.uint8),
          mcr.LOR)
    check(comm, TypeError, ["sendbuf has float64", "recvbuf has float32"],
          comm.Allreduce, np.ones(3), np.zeros(3, np.float32))
    check(comm, TypeError, ["sendbuf has int64", "recvbuf has float64"],
          comm.Exscan, torch.ones(3, dtype=torch.int64), np.zeros(3))
    if comm.rank == 0:       # the root compares its own block
        check(comm, TypeError, ["sendbuf has float32", "recvbuf has int32"],
              comm.Gather, torch.ones(2), torch.zeros(2 * size, dtype=torch.int32), 0)
    else:
        assert_comm_works(comm)


@case
def unsupported_dtypes(comm):
    dst = right(comm)
    for dtype in (torch.complex32, torch.float8_e4m3fn, torch.float8_e5m2):
        t = torch.zeros(4, dtype=dtype)
        check(comm, TypeError, ["buf", f"tensor dtype {dtype}", "not supported", "float32"],
              comm.Send, t, dst)
        check(comm, TypeError, ["recvbuf", f"tensor dtype {dtype}", "not supported"],
              comm.Allreduce, MPI.IN_PLACE, t)
    q = torch.quantize_per_tensor(torch.ones(4), 0.5, 0, torch.qint8)
    check(comm, TypeError, ["buf", "torch.qint8", "not supported"], comm.Send, q, dst)
    check(comm, TypeError, ["buf", "buffer format", "not supported"],
          comm.Send, np.zeros(2, "i4,f4"), dst)
    swapped = ">f4" if np.little_endian else "<f4"
    check(comm, BufferError, ["buf", "byte order", "not the machine's"],
          comm.Send, np.zeros(2, swapped), dst)


@case
def op_does_not_apply(comm):
    cases = [
        (torch.float32, mcr.BAND, "MPI.BAND does not apply to float32",
         "SUM, PROD, MAX, MIN"),
        (torch.float64, mcr.BXOR, "MPI.BXOR does not apply to float64", "MAX"),
        (torch.float16, mcr.LAND, "MPI.LAND does not apply to float16", "MIN"),
        (torch.bfloat16, mcr.BOR, "MPI.BOR does not apply to bfloat16", "SUM"),
        (torch.complex64, mcr.MAX, "MPI.MAX does not apply to complex64", "SUM, PROD"),
        (torch.complex128, mcr.MIN, "MPI.MIN does not apply to complex128", "PROD"),
        (torch.bool, mcr.SUM, "MPI.SUM does not apply to bool", "LAND, LOR, LXOR"),
        (torch.bool, mcr.MAX, "MPI.MAX does not apply to bool", "LOR"),
        (torch.bool, mcr.BAND, "MPI.BAND does not apply to bool", "LXOR"),
    ]
    size = comm.size
    for dtype, op, what, allowed in cases:
        x = rank_data(comm.rank, size, dtype)
        check(comm, TypeError, ["op", what, allowed], comm.Allreduce, x,
              torch.zeros_like(x), op)
        check(comm, TypeError, ["op", what], comm.Allreduce, MPI.IN_PLACE, x.clone(), op)
        check(comm, TypeError, ["op", what], comm.Iallreduce, x, torch.zeros_like(x), op)
        check(comm, TypeError, ["op", what], comm.Reduce, x, torch.zeros_like(x), op, 0)
        check(comm, TypeError, ["op", what], comm.Scan, x, torch.zeros_like(x), op)
        check(comm, TypeError, ["op", what], comm.Exscan, x, torch.zeros_like(x), op)
        check(comm, TypeError, ["op", what], comm.Reduce_scatter_block, x, x[:1].clone(), op)
        check(comm, TypeError, ["op", what], comm.Reduce_scatter, x, x[:1].clone(), None, op)
    check(comm, TypeError, ["op", "expected an MPI.Op", "str"],
          comm.Allreduce, torch.ones(2), torch.zeros(2), "sum")
    check(comm, TypeError, ["op", "expected an MPI.Op", "NoneType"],
          comm.Allreduce, torch.ones(2), torch.zeros(2), None)


@case
def ops_that_are_not_reductions(comm):
    """REPLACE, NO_OP (one-sided only), OP_NULL, and MAXLOC/MINLOC on plain
    element types: refused before MPI, naming the op and the element type, by
    every reduction, on MPI and Gloo."""
    size = comm.size
    cases = [
        (torch.float32, MPI.REPLACE, TypeError, ["MPI.REPLACE", "not a reduction", "float32"]),
        (torch.int64, MPI.NO_OP, TypeError, ["MPI.NO_OP", "not a reduction", "int64"]),
        (torch.float64, MPI.OP_NULL, ValueError, ["MPI.OP_NULL", "not an operation",
                                                  "float64"]),
        (torch.float64, MPI.MAXLOC, TypeError, ["MPI.MAXLOC", "float64", "MPI.DOUBLE_INT"]),
        (torch.int32, MPI.MINLOC, TypeError, ["MPI.MINLOC", "int32", "pairs"]),
    ]
    for backend in ("mpi", "gloo"):
        for dtype, op, exc, what in cases:
            x = rank_data(comm.rank, size, dtype)
            for call, args in [
                (comm.Allreduce, (x, torch.zeros_like(x), op)),
                (comm.Allreduce, (MPI.IN_PLACE, x.clone(), op)),
                (comm.Iallreduce, (x, torch.zeros_like(x), op)),
                (comm.Reduce, (x, torch.zeros_like(x), op, 0)),
                (comm.Scan, (x, torch.zeros_like(x), op)),
                (comm.Exscan, (x, torch.zeros_like(x), op)),
                (comm.Reduce_scatter_block, (x, x[:1].clone(), op)),
                (comm.Reduce_scatter, (x, x[:1].clone(), None, op)),
                (comm.Allreduce_init, (x, torch.zeros_like(x), op)),
            ]:
                check(comm, exc, ["op"] + what, call, *args, backend=backend)
    with raises(TypeError, "MPI.REPLACE", "uint8"):
        comm.Allreduce(np.ones(2, np.uint8), np.zeros(2, np.uint8), MPI.REPLACE)


# -- objects that are not (usable) buffers ------------------------------------------------


@case
def not_buffers(comm):
    dst, src = right(comm), left(comm)
    expected = "expected a torch.Tensor, a numpy array or an object with the buffer protocol"
    for obj, name in [(object(), "object"), ("abc", "str"), (3.5, "float"), (7, "int"),
                      ({1: 2}, "dict"), (True, "bool")]:
        check(comm, TypeError, ["buf", expected, f"got {name}"], comm.Send, obj, dst)
        check(comm, TypeError, ["buf", f"got {name}"], comm.Irecv, obj, src)
    check(comm, TypeError, ["sendbuf", "got object"], comm.Allreduce, object(), torch.zeros(2))
    check(comm, TypeError, ["recvbuf", "got object"], comm.Allreduce, torch.ones(2), object())
    check(comm, TypeError, ["recvbuf", "got object"],
          comm.Sendrecv, torch.ones(2), dst, 0, object(), src, 0)
    check(comm, TypeError, ["buf", "got object"], comm.Send, [object(), 2], dst)


@case
def read_only_receive_buffers(comm):
    dst, src = right(comm), left(comm)
    for ro, name in [(b"abcdefgh", "bytes"), (memoryview(b"abcdefgh"), "memoryview")]:
        check(comm, BufferError, ["buf", f"buffer of {name} is read-only",
                                  "receive buffer must be writable"], comm.Recv, ro, src)
        check(comm, BufferError, ["buf", "read-only"], comm.Irecv, [ro, 4], src)
        check(comm, BufferError, ["recvbuf", "read-only"],
              comm.Sendrecv, b"12345678", dst, 0, ro, src, 0)
        check(comm, BufferError, ["recvbuf", "read-only"],
              comm.Allreduce, bytearray(8), ro, mcr.BOR)
        check(comm, BufferError, ["recvbuf", "read-only"],
              comm.Allgather, b"x", bytes(comm.size))
    # sending from read-only memory is fine
    out = bytearray(8)
    comm.Sendrecv(b"abcdefgh", dst, 0, out, src, 0)
    assert bytes(out) == b"abcdefgh"
    # Bcast: only the receivers need writable memory; the root skips the call
    if comm.rank != 0:
        check(comm, BufferError, ["buf", "read-only"], comm.Bcast, b"abcd", 0)
    else:
        assert_comm_works(comm)


@case
def read_only_numpy_receive_buffer(comm):
    a = np.zeros(4)
    a.setflags(write=False)
    check(comm, BufferError, ["buf", "read-only", "writable"], comm.Recv, a, left(comm))
    check(comm, BufferError, ["recvbuf", "read-only"], comm.Allreduce, np.ones(4), a)


@case
def non_contiguous_tensors(comm):
    dst, src = right(comm), left(comm)
    for t, shape, strides in [
        (torch.zeros(8)[::2], "(4,)", "(2,)"),
        (torch.zeros(3, 4).t(), "(4, 3)", "(1, 4)"),
        (torch.zeros(3, 4)[:, 1:3], "(3, 2)", "(4, 1)"),
        (torch.zeros(1).expand(4), "(4,)", "(0,)"),
    ]:
        check(comm, BufferError, ["buf", "tensor is not contiguous", f"shape {shape}",
                                  f"strides {strides}", "contiguous()"], comm.Send, t, dst)
        check(comm, BufferError, ["buf", "not contiguous"], comm.Irecv, [t, 1], src)
        check(comm, BufferError, ["recvbuf", "not contiguous"],
              comm.Allreduce, torch.ones(t.shape), t)
        check(comm, BufferError, ["sendbuf", "not contiguous"],
              comm.Allreduce, t, torch.zeros(t.shape))
    # channels_last 4-D tensor: dense but not C-contiguous
    cl = torch.zeros(1, 2, 2, 2).to(memory_format=torch.channels_last)
    check(comm, BufferError, ["buf", "not contiguous"], comm.Send, cl, dst)


@case
def non_contiguous_numpy_arrays(comm):
    dst, src = right(comm), left(comm)
    a = np.zeros(8)[::2]
    check(comm, BufferError, ["buf", "not contiguous"], comm.Send, a, dst)
    check(comm, BufferError, ["buf", "not contiguous"], comm.Recv, a, src)
    b = np.zeros((3, 4))[:, 1:3]
    check(comm, BufferError, ["recvbuf", "not contiguous"], comm.Allreduce, np.ones((3, 2)), b)


@case
def cuda_like_objects(comm):
    dst, src = right(comm), left(comm)
    check(comm, TypeError, ["buf", "CUDA buffer (FakeCudaArray)", "no CUDA device"],
          comm.Send, FakeCudaArray(4), dst)
    check(comm, TypeError, ["buf", "CUDA"], comm.Irecv, FakeCudaArray(4), src)
    check(comm, TypeError, ["sendbuf", "CUDA"], comm.Allreduce, FakeCudaArray(4), torch.zeros(4))
    check(comm, TypeError, ["recvbuf", "CUDA"], comm.Allreduce, torch.ones(4), FakeCudaArray(4))
    # a tensor on a device other than the CPU
    meta = torch.zeros(4, device="meta")
    check(comm, TypeError, ["buf", "device meta", "not supported"], comm.Send, meta, dst)
    check(comm, TypeError, ["recvbuf", "device meta"], comm.Allreduce, torch.ones(4), meta)


@case
def sparse_csr_tensor(comm):
    csr = torch.eye(3).to_sparse_csr()
    check(comm, TypeError, ["buf", "layout torch.sparse_csr", "not supported"],
          comm.Send, csr, right(comm))
    check(comm, TypeError, ["recvbuf", "layout torch.sparse_csr"],
          comm.Allreduce, torch.ones(3, 3), csr)


@case
def sparse_coo_tensor(comm):
    """A COO tensor must be rejected for its layout, not called non-contiguous
    (t.contiguous() does not make it usable)."""
    coo = torch.zeros(3).to_sparse()
    check(comm, TypeError, ["buf", "layout torch.sparse_coo", "not supported"],
          comm.Send, coo, right(comm))
    check(comm, TypeError, ["recvbuf", "layout torch.sparse_coo"],
          comm.Allreduce, torch.ones(3), coo)


@case
def conjugate_bit(comm):
    dst = right(comm)
    x = rank_data(comm.rank, 4, torch.complex64).conj()
    assert x.is_conj()
    check(comm, BufferError, ["buf", "conjugate bit", "resolve_conj()"], comm.Send, x, dst)
    check(comm, BufferError, ["sendbuf", "conjugate bit"],
          comm.Allreduce, x, torch.zeros(4, dtype=torch.complex64))
    check(comm, BufferError, ["recvbuf", "conjugate bit"],
          comm.Allreduce, torch.ones(4, dtype=torch.complex128),
          torch.zeros(4, dtype=torch.complex128).conj())
    # resolved, it goes through with the conjugated values
    y = torch.zeros(4, dtype=torch.complex64)
    comm.Sendrecv(x.resolve_conj(), dst, 0, y, left(comm), 0)
    assert_equal(y, rank_data(left(comm), 4, torch.complex64).conj().resolve_conj())


@case
def negative_bit(comm):
    """A tensor with the negative bit set (x.conj().imag of one element) holds
    the un-negated values in memory: mcr must not send those as they are."""
    z = rank_data(comm.rank, 1, torch.complex64).conj()
    neg = z.imag
    assert neg.is_neg() and neg.is_contiguous()
    out = torch.zeros(1)
    try:
        comm.Sendrecv(neg, right(comm), 0, out, left(comm), 0)
    except BufferError as exc:
        assert "buf" in str(exc) and "neg" in str(exc), exc
        assert_comm_works(comm)
        return
    # accepted: then the receiver must get the values the tensor shows
    assert_equal(out, rank_data(left(comm), 1, torch.complex64).conj().imag.resolve_neg())


# -- ranks, tags, backends, status and requests ---------------------------------------------


@case
def ranks_out_of_range(comm):
    size = comm.size
    x = torch.ones(2)
    valid = f"valid: 0..{size - 1}"
    for bad in (size, size + 3, -3, MPI.ANY_SOURCE):
        check(comm, IndexError, ["dest", f"rank {bad}", f"size {size}", valid],
              comm.Send, x, bad)
        check(comm, IndexError, ["dest", f"rank {bad}"], comm.Isend, x, bad)
        check(comm, IndexError, ["dest", f"rank {bad}"],
              comm.Sendrecv, x, bad, 0, torch.zeros(2), left(comm), 0)
        check(comm, IndexError, ["root", f"rank {bad}", valid], comm.Bcast, x, bad)
        check(comm, IndexError, ["root", f"rank {bad}"], comm.Reduce, x, torch.zeros(2),
              mcr.SUM, bad)
        check(comm, IndexError, ["root", f"rank {bad}"], comm.Gather, x,
              torch.zeros(2 * size), bad)
        check(comm, IndexError, ["root", f"rank {bad}"], comm.Scatterv, None, x, bad)
        check(comm, IndexError, ["root", f"rank {bad}"], comm.Ibcast, x, bad)
    for bad in (size, size + 1, -3, -7):
        check(comm, IndexError, ["source", f"rank {bad}", valid], comm.Recv, x, bad)
        check(comm, IndexError, ["source", f"rank {bad}"], comm.Irecv, x, bad)
        check(comm, IndexError, ["source", f"rank {bad}"],
              comm.Sendrecv, x, right(comm), 0, torch.zeros(2), bad, 0)


@case
def tags_out_of_range(comm):
    tag_ub = comm.Get_attr(MPI.TAG_UB)
    x = torch.ones(2)
    dst, src = right(comm), left(comm)
    check(comm, ValueError, ["tag", "tag -1", "out of range", f"0..{tag_ub}"],
          comm.Send, x, dst, -1)
    check(comm, ValueError, ["tag", "tag -5", f"0..{tag_ub}", "ANY_TAG"],
          comm.Recv, x, src, -5)
    check(comm, ValueError, ["tag", "tag -2"], comm.Isend, x, dst, -2)
    check(comm, ValueError, ["tag", "tag -9"], comm.Irecv, x, src, -9)
    check(comm, ValueError, ["sendtag", "tag -1"],
          comm.Sendrecv, x, dst, -1, torch.zeros(2), src, 0)
    check(comm, ValueError, ["recvtag", "tag -3"],
          comm.Sendrecv, x, dst, 0, torch.zeros(2), src, -3)
    # ANY_TAG is for receives only
    check(comm, ValueError, ["tag", f"tag {MPI.ANY_TAG}"], comm.Send, x, dst, MPI.ANY_TAG)


@case
def tag_above_tag_ub(comm):
    tag_ub = comm.Get_attr(MPI.TAG_UB)
    x = torch.ones(2)
    exc = (OverflowError, ValueError) if tag_ub == 2**31 - 1 else ValueError
    for fn, args in [(comm.Send, (x, right(comm))), (comm.Irecv, (x, left(comm)))]:
        try:
            fn(*args, tag_ub + 1)
        except exc as e:
            assert "tag" in str(e), f"error for tag {tag_ub + 1} does not name the tag: {e!r}"
            assert str(tag_ub + 1) in str(e) or str(tag_ub) in str(e), e
        else:
            raise AssertionError(f"tag {tag_ub + 1} > TAG_UB {tag_ub} was accepted")
        assert_comm_works(comm)


@case
def bad_backends(comm):
    x = torch.ones(2)
    for name in ("nccl-x", "Gloo", "", "MPI", "ucc"):
        check(comm, ValueError, ["backend", f"unknown backend {name!r}", "mpi, gloo, nccl"],
              comm.Allreduce, x, torch.zeros(2), backend=name)
        check(comm, ValueError, ["backend", f"{name!r}"], comm.Send, x, right(comm), backend=name)
        check(comm, ValueError, ["backend"], comm.Ibarrier, backend=name)
    check(comm, TypeError, ["backend", "expected a string or None", "int"],
          comm.Bcast, x, 0, backend=3)
    # a backend that cannot serve the buffer names itself and the buffer
    check(comm, ValueError, ["sendbuf", "backend 'nccl'", "host memory"],
          comm.Allreduce, x, torch.zeros(2), backend="nccl")
    check(comm, ValueError, ["buf", "backend 'nccl'", "host memory"],
          comm.Send, x, right(comm), backend="nccl")
    # the valid names work
    for name in (None, "mpi", "auto", "gloo"):
        y = torch.zeros(2)
        comm.Allreduce(x, y, backend=name)
        assert_equal(y, torch.full((2,), float(comm.size)))


@case
def bad_status_and_requests(comm):
    x = torch.ones(2)
    check(comm, TypeError, ["status", "expected an MPI.Status or None", "int"],
          comm.Recv, x, MPI.PROC_NULL, 0, 5)
    req = comm.Irecv(x, MPI.PROC_NULL)
    check(comm, TypeError, ["status", "got str"], req.Wait, "status")
    check(comm, TypeError, ["status", "got str"], req.Test, "status")
    req.Wait()
    check(comm, TypeError, ["requests[1]", "expected an MPI.Request", "int"],
          mcr.Request.Waitall, [req, 1])
    check(comm, TypeError, ["requests[0]", "got NoneType"], mcr.Request.Testall, [None])


@case
def status_checked_before_receiving_on_every_backend(comm):
    """A bad status is refused before the message is taken: the message is
    still there for the next receive (Recv, Sendrecv, Sendrecv_replace, Probe,
    Iprobe; MPI and Gloo)."""
    dst, src = right(comm), left(comm)
    for backend in ("mpi", "gloo"):
        sreq = comm.Isend(rank_data(comm.rank, 3), dst, 21, backend=backend)
        out = torch.zeros(3)
        with raises(TypeError, "status", "got int"):
            comm.Recv(out, src, 21, 123, backend=backend)
        with raises(TypeError, "status", "got str"):
            comm.Probe(src, 21, "x", backend=backend)
        with raises(TypeError, "status", "got list"):
            comm.Iprobe(src, 21, [], backend=backend)
        with raises(TypeError, "status", "got int"):
            comm.Sendrecv(rank_data(comm.rank, 3, seed=1), dst, 21, out, src, 21, 5,
                          backend=backend)
        with raises(TypeError, "status", "got float"):
            comm.Sendrecv_replace(out, dst, 21, src, 21, 1.0, backend=backend)
        st = MPI.Status()
        comm.Recv(out, src, 21, st, backend=backend)    # the first message, nothing else
        assert_equal(out, rank_data(src, 3))
        assert (st.Get_source(), st.Get_tag(), st.Get_count(MPI.FLOAT)) == (src, 21, 3)
        sreq.Wait()
        assert not comm.Iprobe(MPI.ANY_SOURCE, 21, backend=backend)
        comm.Barrier()
    assert_comm_works(comm)


@case
def aliased_send_and_receive_buffers(comm):
    x = torch.ones(4)
    check(comm, ValueError, ["sendbuf and recvbuf overlap", "IN_PLACE"], comm.Allreduce, x, x)
    big = torch.ones(8)
    check(comm, ValueError, ["overlap"], comm.Allreduce, big[:4], big[2:6])
    check(comm, ValueError, ["overlap"],
          comm.Sendrecv, x, right(comm), 0, x, left(comm), 0)


# -- null communicators ------------------------------------------------------------------


@case
def null_communicator(comm):
    null = comm.Split(mcr.UNDEFINED)
    assert isinstance(null, mcr.Comm) and null == MPI.COMM_NULL
    msg = ["comm", "communicator is null"]
    x = torch.ones(2)
    check(comm, ValueError, msg, null.Send, x, 0)
    check(comm, ValueError, msg, null.Irecv, x, 0)
    check(comm, ValueError, msg, null.Allreduce, x, torch.zeros(2))
    check(comm, ValueError, msg, null.Iallreduce, x, torch.zeros(2))
    check(comm, ValueError, msg, null.Bcast, x, 0)
    check(comm, ValueError, msg, null.Barrier)
    check(comm, ValueError, msg, null.Sendrecv, x, 0, 0, torch.zeros(2), 0, 0)
    # half the ranks get a communicator, the others a null one
    half = comm.Split(0 if comm.rank % 2 == 0 else mcr.UNDEFINED, comm.rank)
    if comm.rank % 2 == 0:
        assert isinstance(half, mcr.Comm) and half.size == (comm.size + 1) // 2
        assert_comm_works(half)
        half.Free()
    else:
        assert half == MPI.COMM_NULL
        with raises(ValueError, *msg):
            half.Allreduce(x, torch.zeros(2))
    assert_comm_works(comm)


@case
def freed_communicator(comm):
    dup = comm.Dup()
    assert_comm_works(dup)
    dup.Free()
    check(comm, ValueError, ["comm", "null", "freed"], dup.Allreduce, torch.ones(2),
          torch.zeros(2))
    check(comm, ValueError, ["comm", "null"], dup.Send, torch.ones(2), 0)


# -- MPI's own errors ---------------------------------------------------------------------


def assert_mpi_error(exc, error_class):
    assert isinstance(exc, mcr.Exception), type(exc)
    assert isinstance(exc, _mpi4py.Exception)
    assert exc.Get_error_class() == error_class, (exc.Get_error_class(), error_class, str(exc))


def assert_truncation_note(exc, arg, nbytes, capacity, source, tag):
    """The note of a truncation: the receive buffer's size, the message's size
    (when MPI tells it), its source and tag, as the Gloo path words it."""
    notes = getattr(exc, "__notes__", [])
    tail = (f" from rank {source} (tag {tag}) does not fit the receive buffer of "
            f"{capacity} bytes")
    sized = f"{arg}: message of {nbytes} bytes" + tail
    assert sized in notes or f"{arg}: a message" + tail in notes, (notes, sized)


@case
def truncation_says_sizes_source_and_tag(comm):
    """MPI_ERR_TRUNCATE from Recv, Wait, Test, Sendrecv, Sendrecv_replace,
    Waitall, Waitany and a persistent receive stays an mcr.Exception of that
    class, with a note giving the sizes, source and tag."""
    dst, src = right(comm), left(comm)
    data = torch.arange(10.0)                       # 40 bytes

    def expect_truncation(call, arg, capacity, tag, error_class=MPI.ERR_TRUNCATE):
        try:
            call()
        except _mpi4py.Exception as exc:
            assert_mpi_error(exc, error_class)
            assert_truncation_note(exc, arg, 40, capacity, src, tag)
        else:
            raise AssertionError(f"MPI_ERR_TRUNCATE not raised (tag {tag})")

    sreq = comm.Isend(data, dst, 31)
    expect_truncation(lambda: comm.Recv(torch.zeros(4), src, 31), "buf", 16, 31)
    sreq.Wait()
    sreq = comm.Isend(data, dst, 32)
    rreq = comm.Irecv(torch.zeros(3), src, 32)
    expect_truncation(rreq.Wait, "buf", 12, 32)
    sreq.Wait()
    sreq = comm.Isend(data, dst, 33)
    rreq = comm.Irecv(torch.zeros(3, dtype=torch.int16), src, 33)

    def test_until_done():
        while not rreq.Test():
            pass
    expect_truncation(test_until_done, "buf", 6, 33)
    sreq.Wait()
    if comm.size > 1:     # Open MPI does not see a receive from itself posted first truncate
        expect_truncation(lambda: comm.Sendrecv(data, dst, 34, torch.zeros(2), src, 34),
                          "recvbuf", 8, 34)
    sreq = comm.Isend(data, dst, 35)                # received by Sendrecv_replace
    expect_truncation(lambda: comm.Sendrecv_replace(torch.zeros(1), MPI.PROC_NULL, 35,
                                                    src, 35), "buf", 4, 35)
    sreq.Wait()
    sreq = comm.Isend(data, dst, 37)
    rreq = comm.Irecv(torch.zeros(1), src, 37)
    expect_truncation(lambda: mcr.Request.Waitall([sreq, rreq], (MPI.Status(),)),
                      "requests[1]", 4, 37, MPI.ERR_IN_STATUS)
    sreq.Wait()
    sreq = comm.Isend(data, dst, 38)
    rreq = comm.Irecv(torch.zeros(1), src, 38)
    expect_truncation(lambda: mcr.Request.Waitany([rreq]), "requests[0]", 4, 38)
    sreq.Wait()
    preq = comm.Recv_init(torch.zeros(2), src, 39)
    sreq = comm.Isend(data, dst, 39)
    preq.Start()
    expect_truncation(preq.Wait, "buf", 8, 39)
    sreq.Wait()
    preq.Free()
    assert_comm_works(comm)


@case
def truncated_message_raises_mcr_exception(comm):
    """A message longer than the receive buffer: MPI_ERR_TRUNCATE comes back as
    mcr.Exception on the receiver, the sender completes, and nothing aborts."""
    dst, src = right(comm), left(comm)
    sreq = comm.Isend(torch.arange(10.0), dst, 11)
    try:
        comm.Recv(torch.zeros(4), src, 11)
    except _mpi4py.Exception as exc:          # as a ported mpi4py program catches it
        assert_mpi_error(exc, MPI.ERR_TRUNCATE)
        assert "TRUNCATE" in str(exc) or "truncat" in str(exc)
    else:
        raise AssertionError("MPI_ERR_TRUNCATE not raised")
    sreq.Wait()
    assert_comm_works(comm)
    # the same through Irecv + Wait
    sreq = comm.Isend(torch.arange(10.0), dst, 12)
    rreq = comm.Irecv(torch.zeros(3), src, 12)
    try:
        rreq.Wait()
    except mcr.Exception as exc:
        assert_mpi_error(exc, MPI.ERR_TRUNCATE)
    else:
        raise AssertionError("MPI_ERR_TRUNCATE not raised by Wait")
    sreq.Wait()
    assert_comm_works(comm)
    # and through Waitall: MPI reports the error in the statuses
    sreq = comm.Isend(torch.arange(10.0), dst, 13)
    rreq = comm.Irecv(torch.zeros(2), src, 13)
    with raises(mcr.Exception):
        mcr.Request.Waitall([rreq, sreq])
    sreq.Wait()
    assert_comm_works(comm)
    # and the ring still moves data
    out = torch.zeros(10)
    comm.Sendrecv(torch.arange(10.0) + comm.rank, dst, 14, out, src, 14)
    assert_equal(out, torch.arange(10.0) + src)


@case
def uncommitted_datatype_raises_mcr_exception(comm):
    """mcr does not pre-validate user datatypes; MPI rejects an uncommitted one."""
    dt = MPI.FLOAT.Create_contiguous(2)            # never committed
    try:
        with raises(mcr.Exception):
            comm.Send([torch.zeros(4), 2, dt], right(comm), 0)
        try:
            comm.Allreduce([torch.zeros(4), 2, dt], [torch.zeros(4), 2, dt], mcr.SUM)
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
    """Many failing calls in a row, then a real exchange: nothing was left
    half-posted (no stray message is received)."""
    dst, src = right(comm), left(comm)
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


# -- in-process: the same checks on COMM_SELF without mpiexec ------------------------------


def test_errors_in_process_on_comm_self():
    comm = mcr.COMM_SELF
    check(comm, ValueError, ["buf", "count 5"], comm.Send, [torch.zeros(4), 5], 0)
    check(comm, IndexError, ["dest", "rank 1", "size 1"], comm.Send, torch.zeros(4), 1)
    check(comm, TypeError, ["op", "MPI.BAND", "float32"], comm.Allreduce, torch.ones(2),
          torch.zeros(2), mcr.BAND)
    check(comm, BufferError, ["buf", "not contiguous"], comm.Send, torch.zeros(4)[::2], 0)
    check(comm, ValueError, ["backend", "'nccl-x'"], comm.Barrier, backend="nccl-x")
    check(comm, ValueError, ["backend 'nccl'", "host memory"], comm.Bcast, torch.ones(2),
          backend="nccl")
    sreq = comm.Isend(torch.arange(6.0), 0, 0)
    with raises(mcr.Exception):
        comm.Recv(torch.zeros(2), 0, 0)
    sreq.Wait()
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)
