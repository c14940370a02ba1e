"""Reductions: Reduce, Allreduce, Reduce_scatter_block, Reduce_scatter, Scan,
Exscan.

Every op on every element type it applies to (SUM PROD MAX MIN on float32,
float64, float16, bfloat16; all ten ops on integers; LAND LOR LXOR on bool;
SUM PROD on complex), with IN_PLACE wherever MPI allows it. Operands are small
integers (ccoref.operand), so every reduction order gives the exact result and
each rank's result is compared with torch/numpy on the whole data.
"""

import numpy as np
import torch

import mcr
from ccoref import (OP_NAMES, int_forms, np_operand, np_reduce_ref, operands,
                    reduce_ref, reduction_cases, roots, sentinel)
from mcr import MPI
from mpiharness import case, mpi_cases
from util import assert_equal

N = 6
CASES = reduction_cases()


def check(actual, expected, dtype, op, what=""):
    assert actual.dtype == expected.dtype, (what, dtype, op, actual.dtype)
    assert torch.equal(actual, expected), (f"{what} {op} on {dtype}:\n"
                                           f"actual:   {actual}\nexpected: {expected}")


# -- Reduce --------------------------------------------------------------------------


@case
def reduce_every_op_dtype_and_root(comm):
    size, rank = comm.size, comm.rank
    for root in roots(size):
        for seed, (dtype, op) in enumerate(CASES):
            data = operands(size, N, dtype, op, seed)
            recv = sentinel(N, dtype) if rank == root else None
            comm.Reduce(data[rank], recv, op=OP_NAMES[op], root=root)
            if rank == root:
                check(recv, reduce_ref(data, op), dtype, op, f"Reduce root {root}")


@case
def reduce_in_place_at_root(comm):
    size, rank = comm.size, comm.rank
    for root in roots(size):
        for seed, (dtype, op) in enumerate(CASES):
            data = operands(size, N, dtype, op, seed)
            if rank == root:
                buf = data[rank].clone()
                comm.Reduce(mcr.IN_PLACE, buf, OP_NAMES[op], root)
                check(buf, reduce_ref(data, op), dtype, op, f"Reduce IN_PLACE root {root}")
            else:
                comm.Reduce(data[rank], None, OP_NAMES[op], root)


@case
def reduce_default_op_and_spec_forms(comm):
    size, rank, dtype = comm.size, comm.rank, torch.float32
    data = operands(size, N, dtype, "SUM")
    expected = reduce_ref(data, "SUM")
    recv = sentinel(N, dtype) if rank == 0 else None
    comm.Reduce(data[rank], recv)                           # op=SUM, root=0
    if rank == 0:
        assert_equal(recv, expected)
    # part of a larger buffer on both sides, with explicit datatypes
    padded = torch.cat([sentinel(2, dtype), data[rank], sentinel(1, dtype)])
    recv = sentinel(N + 3, dtype)
    comm.Reduce([padded, (N, 2), MPI.FLOAT], [recv, N, 1, "f"], op=mcr.SUM,
                root=size - 1)
    if rank == size - 1:
        assert_equal(recv, torch.cat([sentinel(1, dtype), expected, sentinel(2, dtype)]))
    # only the first 3 elements
    recv = sentinel(N, dtype)
    comm.Reduce([data[rank], 3], [recv, 3], op=mcr.MAX, root=0)
    if rank == 0:
        assert_equal(recv, torch.cat([reduce_ref(data, "MAX")[:3], sentinel(N - 3, dtype)]))


@case
def reduce_numpy(comm):
    size, rank = comm.size, comm.rank
    numpy_cases = [(np.float32, "SUM"), (np.float64, "MAX"), (np.int32, "PROD"),
                   (np.int64, "MIN"), (np.uint8, "BOR"), (np.int8, "BXOR"),
                   (np.bool_, "LAND"), (np.bool_, "LXOR"), (np.int16, "LOR"),
                   (np.complex128, "SUM"), (np.complex64, "PROD"), (np.float16, "SUM")]
    for root in roots(size):
        for seed, (dtype, op) in enumerate(numpy_cases):
            data = [np_operand(r, N, dtype, op, seed) for r in range(size)]
            expected = np_reduce_ref(data, op)
            recv = np.zeros(N, dtype) if rank == root else None
            comm.Reduce(data[rank], recv, OP_NAMES[op], root)
            if rank == root:
                np.testing.assert_array_equal(recv, expected)
                buf = data[rank].copy()
                comm.Reduce(mcr.IN_PLACE, buf, OP_NAMES[op], root)
                np.testing.assert_array_equal(buf, expected)
            else:
                comm.Reduce(data[rank], None, OP_NAMES[op], root)


# -- Allreduce -----------------------------------------------------------------------


@case
def allreduce_every_op_and_dtype(comm):
    size, rank = comm.size, comm.rank
    for seed, (dtype, op) in enumerate(CASES):
        data = operands(size, N, dtype, op, seed)
        recv = sentinel(N, dtype)
        comm.Allreduce(data[rank], recv, op=OP_NAMES[op])
        check(recv, reduce_ref(data, op), dtype, op, "Allreduce")


@case
def allreduce_in_place(comm):
    size, rank = comm.size, comm.rank
    for seed, (dtype, op) in enumerate(CASES):
        data = operands(size, N, dtype, op, seed)
        buf = data[rank].clone()
        comm.Allreduce(mcr.IN_PLACE, buf, op=OP_NAMES[op])
        check(buf, reduce_ref(data, op), dtype, op, "Allreduce IN_PLACE")


@case
def allreduce_sizes_and_spec_forms(comm):
    size, rank = comm.size, comm.rank
    for n in (0, 1, 1000):
        for dtype in (torch.float16, torch.bfloat16, torch.int64):
            data = operands(size, n, dtype, "SUM", n)
            recv = sentinel(n, dtype)
            comm.Allreduce(data[rank], recv)
            assert_equal(recv, reduce_ref(data, "SUM"))
    dtype = torch.float64
    data = operands(size, N, dtype, "MIN")
    expected = reduce_ref(data, "MIN")
    padded = torch.cat([sentinel(1, dtype), data[rank]])
    sends = [data[rank], [data[rank], MPI.DOUBLE], [data[rank], N, "d"],
             [padded, (N, 1)], [padded, (None, 1), MPI.DOUBLE], [padded, N, 1, "d"]]
    for i, send in enumerate(sends):
        recv = sentinel(N + 2, dtype)
        comm.Allreduce(send, [recv, (N, 2), MPI.DOUBLE], op=mcr.MIN)
        want = torch.cat([sentinel(2, dtype), expected])
        assert torch.equal(recv, want), (i, recv, want)
        buf = torch.cat([data[rank], sentinel(2, dtype)])
        comm.Allreduce(mcr.IN_PLACE, [buf, N], op=mcr.MIN)
        assert_equal(buf, torch.cat([expected, sentinel(2, dtype)]))


@case
def allreduce_numpy_and_buffers(comm):
    size, rank = comm.size, comm.rank
    for seed, (dtype, op) in enumerate([(np.float32, "SUM"), (np.float64, "PROD"),
                                        (np.float16, "MAX"), (np.int32, "BAND"),
                                        (np.int64, "SUM"), (np.uint8, "MIN"),
                                        (np.bool_, "LOR"), (np.complex64, "SUM")]):
        data = [np_operand(r, N, dtype, op, seed) for r in range(size)]
        recv = np.zeros(N, dtype)
        comm.Allreduce(data[rank], recv, op=OP_NAMES[op])
        np.testing.assert_array_equal(recv, np_reduce_ref(data, op))
        buf = data[rank].copy()
        comm.Allreduce(mcr.IN_PLACE, buf, op=OP_NAMES[op])
        np.testing.assert_array_equal(buf, np_reduce_ref(data, op))
    # a bytearray reduces as uint8
    buf = bytearray([rank + 1, 2 * rank, 7])
    comm.Allreduce(mcr.IN_PLACE, buf, op=mcr.BXOR)
    expected = [0, 0, 7 if size % 2 else 0]
    for r in range(size):
        expected[0] ^= r + 1
        expected[1] ^= 2 * r
    assert list(buf) == expected, (list(buf), expected)


# -- Reduce_scatter_block ------------------------------------------------------------


@case
def reduce_scatter_block_every_op_and_dtype(comm):
    size, rank, k = comm.size, comm.rank, 3
    for seed, (dtype, op) in enumerate(CASES):
        data = operands(size, k * size, dtype, op, seed)
        expected = reduce_ref(data, op)[rank * k:(rank + 1) * k]
        recv = sentinel(k, dtype)
        comm.Reduce_scatter_block(data[rank], recv, op=OP_NAMES[op])
        check(recv, expected, dtype, op, "Reduce_scatter_block")
        # IN_PLACE: the input is the whole buffer, the result its first block
        buf = data[rank].clone()
        comm.Reduce_scatter_block(mcr.IN_PLACE, buf, op=OP_NAMES[op])
        check(buf[:k], expected, dtype, op, "Reduce_scatter_block IN_PLACE")


@case
def reduce_scatter_block_numpy(comm):
    size, rank, k = comm.size, comm.rank, 2
    for seed, (dtype, op) in enumerate([(np.float32, "SUM"), (np.float16, "MIN"),
                                        (np.int8, "BOR"), (np.bool_, "LAND")]):
        data = [np_operand(r, k * size, dtype, op, seed) for r in range(size)]
        expected = np_reduce_ref(data, op)[rank * k:(rank + 1) * k]
        recv = np.zeros(k, dtype)
        comm.Reduce_scatter_block(data[rank], recv, OP_NAMES[op])
        np.testing.assert_array_equal(recv, expected)
        buf = data[rank].copy()
        comm.Reduce_scatter_block(mcr.IN_PLACE, buf, OP_NAMES[op])
        np.testing.assert_array_equal(buf[:k], expected)


# -- Reduce_scatter ------------------------------------------------------------------


def uneven_recvcounts(size):
    """Uneven block sizes with zeros (rank 0 gets none)."""
    return [i % 3 for i in range(size)] if size > 1 else [2]


@case
def reduce_scatter_uneven_every_op_and_dtype(comm):
    size, rank = comm.size, comm.rank
    counts = uneven_recvcounts(size)
    start, total = sum(counts[:rank]), sum(counts)
    for seed, (dtype, op) in enumerate(CASES):
        data = operands(size, total, dtype, op, seed)
        expected = reduce_ref(data, op)[start:start + counts[rank]]
        recv = sentinel(counts[rank], dtype)
        comm.Reduce_scatter(data[rank], recv, counts, op=OP_NAMES[op])
        check(recv, expected, dtype, op, "Reduce_scatter")
        buf = data[rank].clone()
        comm.Reduce_scatter(mcr.IN_PLACE, buf, counts, op=OP_NAMES[op])
        check(buf[:counts[rank]], expected, dtype, op, "Reduce_scatter IN_PLACE")


@case
def reduce_scatter_without_recvcounts(comm):
    size, rank, k = comm.size, comm.rank, 2
    for seed, (dtype, op) in enumerate(CASES[::3]):
        data = operands(size, k * size, dtype, op, seed)
        expected = reduce_ref(data, op)[rank * k:(rank + 1) * k]
        recv = sentinel(k, dtype)
        comm.Reduce_scatter(data[rank], recv, op=OP_NAMES[op])
        check(recv, expected, dtype, op, "Reduce_scatter equal blocks")
        buf = data[rank].clone()
        comm.Reduce_scatter(mcr.IN_PLACE, buf, None, OP_NAMES[op])
        check(buf[:k], expected, dtype, op, "Reduce_scatter equal blocks IN_PLACE")


@case
def reduce_scatter_recvcounts_forms(comm):
    size, rank, dtype = comm.size, comm.rank, torch.float32
    counts = [(i * 2 + 1) % 4 for i in range(size)]       # 1 3 1 3 ... (with 0 at 4+)
    counts[-1] = 0
    start, total = sum(counts[:rank]), sum(counts)
    data = operands(size, total, dtype, "SUM")
    expected = reduce_ref(data, "SUM")[start:start + counts[rank]]
    for i, c in enumerate(int_forms(counts)):
        # a receive buffer longer than this rank's block: the rest is untouched
        recv = sentinel(counts[rank] + 2, dtype)
        comm.Reduce_scatter(data[rank], recv, c)
        want = torch.cat([expected, sentinel(2, dtype)])
        assert torch.equal(recv, want), (i, recv, want)
        buf = data[rank].clone()
        comm.Reduce_scatter(mcr.IN_PLACE, buf, recvcounts=c, op=mcr.SUM)
        assert torch.equal(buf[:counts[rank]], expected), (i, buf, expected)


@case
def reduce_scatter_all_counts_zero(comm):
    zeros = [0] * comm.size
    recv = sentinel(2, torch.int32)
    comm.Reduce_scatter(torch.zeros(0, dtype=torch.int32), recv, zeros, op=mcr.SUM)
    assert_equal(recv, sentinel(2, torch.int32))


@case
def reduce_scatter_numpy(comm):
    size, rank = comm.size, comm.rank
    counts = uneven_recvcounts(size)
    start, total = sum(counts[:rank]), sum(counts)
    for seed, (dtype, op) in enumerate([(np.float64, "SUM"), (np.int32, "MAX"),
                                        (np.uint8, "BAND"), (np.bool_, "LOR")]):
        data = [np_operand(r, total, dtype, op, seed) for r in range(size)]
        expected = np_reduce_ref(data, op)[start:start + counts[rank]]
        recv = np.zeros(counts[rank], dtype)
        comm.Reduce_scatter(data[rank], recv, np.array(counts), OP_NAMES[op])
        np.testing.assert_array_equal(recv, expected)
        buf = data[rank].copy()
        comm.Reduce_scatter(mcr.IN_PLACE, buf, counts, OP_NAMES[op])
        np.testing.assert_array_equal(buf[:counts[rank]], expected)


# -- Scan and Exscan -----------------------------------------------------------------


@case
def scan_every_op_and_dtype(comm):
    size, rank = comm.size, comm.rank
    for seed, (dtype, op) in enumerate(CASES):
        data = operands(size, N, dtype, op, seed)
        expected = reduce_ref(data[:rank + 1], op)
        recv = sentinel(N, dtype)
        comm.Scan(data[rank], recv, op=OP_NAMES[op])
        check(recv, expected, dtype, op, "Scan")
        buf = data[rank].clone()
        comm.Scan(mcr.IN_PLACE, buf, op=OP_NAMES[op])
        check(buf, expected, dtype, op, "Scan IN_PLACE")


@case
def exscan_every_op_and_dtype(comm):
    """Rank 0's Exscan result is undefined in MPI: only ranks 1.. are checked."""
    size, rank = comm.size, comm.rank
    for seed, (dtype, op) in enumerate(CASES):
        data = operands(size, N, dtype, op, seed)
        recv = sentinel(N, dtype)
        comm.Exscan(data[rank], recv, op=OP_NAMES[op])
        buf = data[rank].clone()
        comm.Exscan(mcr.IN_PLACE, buf, op=OP_NAMES[op])
        if rank > 0:
            expected = reduce_ref(data[:rank], op)
            check(recv, expected, dtype, op, "Exscan")
            check(buf, expected, dtype, op, "Exscan IN_PLACE")


@case
def scan_exscan_numpy_and_forms(comm):
    size, rank = comm.size, comm.rank
    for seed, (dtype, op) in enumerate([(np.float32, "SUM"), (np.float16, "MAX"),
                                        (np.int64, "MIN"), (np.uint8, "BXOR"),
                                        (np.bool_, "LXOR"), (np.complex128, "SUM")]):
        data = [np_operand(r, N, dtype, op, seed) for r in range(size)]
        recv = np.zeros(N, dtype)
        comm.Scan(data[rank], recv, OP_NAMES[op])
        np.testing.assert_array_equal(recv, np_reduce_ref(data[:rank + 1], op))
        recv = np.zeros(N, dtype)
        comm.Exscan(data[rank], recv, OP_NAMES[op])
        if rank > 0:
            np.testing.assert_array_equal(recv, np_reduce_ref(data[:rank], op))
    # spec forms: part of the buffers, explicit datatype
    dtype = torch.int32
    data = operands(size, N, dtype, "SUM")
    recv = sentinel(N + 1, dtype)
    comm.Scan([data[rank], 4, MPI.INT], [recv, (4, 1), MPI.INT])
    prefix = reduce_ref(data[:rank + 1], "SUM")
    assert_equal(recv, torch.cat([sentinel(1, dtype), prefix[:4], sentinel(N - 4, dtype)]))
    recv = sentinel(N, dtype)
    comm.Exscan([data[rank], 2], [recv, 2], op=mcr.MAX)
    if rank > 0:
        assert_equal(recv, torch.cat([reduce_ref(data[:rank], "MAX")[:2],
                                      sentinel(N - 2, dtype)]))


# -- large messages (segmented algorithms; the user-defined half-type ops
# -- then see partial counts) -------------------------------------------------------


@case
def large_messages(comm):
    size, rank = comm.size, comm.rank
    n = (1 << 16) + 3
    for seed, (dtype, op) in enumerate([(torch.float16, "SUM"), (torch.bfloat16, "SUM"),
                                        (torch.float16, "MAX"), (torch.bfloat16, "PROD"),
                                        (torch.float32, "MIN"), (torch.int8, "BXOR")]):
        data = operands(size, n, dtype, op, seed)
        expected = reduce_ref(data, op)
        mop = OP_NAMES[op]
        recv = sentinel(n, dtype)
        comm.Allreduce(data[rank], recv, mop)
        check(recv, expected, dtype, op, "large Allreduce")
        recv = sentinel(n, dtype) if rank == size - 1 else None
        comm.Reduce(data[rank], recv, mop, root=size - 1)
        if rank == size - 1:
            check(recv, expected, dtype, op, "large Reduce")
        counts = [(n // size) + (1 if i < n % size else 0) for i in range(size)]
        start = sum(counts[:rank])
        recv = sentinel(counts[rank], dtype)
        comm.Reduce_scatter(data[rank], recv, counts, mop)
        check(recv, expected[start:start + counts[rank]], dtype, op, "large Reduce_scatter")
        buf = data[rank].clone()
        comm.Scan(mcr.IN_PLACE, buf, mop)
        check(buf, reduce_ref(data[:rank + 1], op), dtype, op, "large Scan")


test_mpi = mpi_cases(__name__)
