"""Backend "gloo": every Comm buffer method on torch's ProcessGroupGloo.

Each collective runs with backend="mpi" and backend="gloo", blocking,
non-blocking (I<name>, a Request) and persistent (<name>_init, a Prequest
started twice with new data written into the same buffers); every result is
compared with numpy/torch on the whole data, never with mcr. Covered:

- reductions over a table of (element type, op) pairs chosen to catch
  signed/unsigned and rounding mistakes (uint32/uint64 values above
  2**31/2**63, float16, bfloat16, complex SUM/PROD, bool and integer
  logical ops, integer bitwise ops), with IN_PLACE;
- data movement on several element types, with IN_PLACE; vector collectives
  with uneven and zero counts, gaps and reversed displacements; numpy arrays;
- point-to-point with MPI's matching (tags out of order, ANY_SOURCE/ANY_TAG,
  Probe/Iprobe, Status counts in elements, PROC_NULL, truncation errors),
  Sendrecv(_replace), Send_init/Recv_init, messages to oneself;
- Waitall/Waitany/Waitsome/Testall over Gloo requests mixed with MPI ones;
- validation errors: the same type as on MPI, raised before communicating;
  TypeError for what Gloo cannot run (derived datatypes, user-defined ops).

A wrong result is recorded, not raised, so that every rank keeps making the
same calls in the same order; a case fails at its end with all of them.
"""

import contextlib
import functools
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import mcr
import mcr.backends.gloo
from ccoref import LAYOUTS, layout, place
from mcr import MPI, launch
from mpiharness import case, mpi_cases, mpi_env

GLOO = "gloo"
BACKENDS = ("mpi", GLOO)
MODES = ("blocking", "nonblocking", "persistent")
N = 5

OPS = {name: getattr(mcr, name) for name in
       ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR")}
LOGICAL = ("LAND", "LOR", "LXOR")
BITWISE = ("BAND", "BOR", "BXOR")
UFUNCS = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum,
          "LAND": np.logical_and, "LOR": np.logical_or, "LXOR": np.logical_xor,
          "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}

# (element type, op) for every reduction; the first of every three also runs
# non-blocking and persistent
REDUCTIONS = [
    (torch.float16, "SUM"), (torch.bfloat16, "SUM"), (torch.float32, "SUM"),
    (torch.uint64, "MAX"), (torch.uint64, "MIN"), (torch.uint64, "SUM"),
    (torch.uint32, "MAX"), (torch.uint32, "MIN"), (torch.uint16, "BOR"),
    (torch.bool, "LAND"), (torch.bool, "LOR"), (torch.bool, "LXOR"),
    (torch.complex128, "PROD"), (torch.complex64, "SUM"), (torch.complex64, "PROD"),
    (torch.int32, "BXOR"), (torch.int32, "BAND"), (torch.int64, "BOR"),
    (torch.int64, "LXOR"), (torch.int16, "LAND"), (torch.int32, "LOR"),
    (torch.bfloat16, "MAX"), (torch.float16, "PROD"), (torch.float64, "MIN"),
    (torch.int8, "MIN"), (torch.uint8, "BXOR"), (torch.int16, "PROD"),
    (torch.uint8, "SUM"), (torch.int64, "MAX"), (torch.complex128, "SUM"),
]
MOVE_DTYPES = [torch.float32, torch.bfloat16, torch.uint64, torch.bool, torch.complex128,
               torch.int16]
# values above 2**31 / 2**63: wrong if reduced or compared as signed
HIGH = {torch.uint32: 1 << 31, torch.uint64: 1 << 63}


# -- data and expected values ----------------------------------------------------------


def operand(key, n, dtype, op=None, seed=0):
    """Deterministic data of `key` (a rank, or any int) for reduction `op`
    (None: data to move). Small integers, so every reduction order is exact;
    zeros and non-zeros for logical ops, negatives for signed order and bitwise
    ops, and uint32/uint64 values above 2**31/2**63. Logical operands are 0 and 1:
    MPI returns a lone operand as it is (Scan on rank 0)."""
    g = torch.Generator().manual_seed(10007 * seed + key)

    def ints(lo, hi):
        return torch.randint(lo, hi, (n,), generator=g)

    if op in LOGICAL or dtype == torch.bool:
        return ints(0, 2).to(dtype)
    if dtype.is_complex:
        if op == "PROD":
            return torch.complex(ints(1, 4).double(), ints(0, 2).double()).to(dtype)
        return torch.complex(ints(1, 8).double(), ints(-3, 4).double()).to(dtype)
    if op == "PROD":
        return ints(1, 4).to(dtype)
    if op in BITWISE:
        return ints(-64 if dtype.is_signed else 0, 64).to(dtype)
    if dtype in HIGH:
        small = ints(0, 8).numpy().astype(np.uint64)
        high = ints(0, 2).numpy().astype(np.uint64) * np.uint64(HIGH[dtype])
        return torch.from_numpy(small + high).to(dtype)
    if dtype.is_signed and op in ("SUM", "MAX", "MIN"):
        return (ints(1, 8) - 4).to(dtype)
    return ints(1, 8).to(dtype)


def operands(size, n, dtype, op=None, seed=0):
    return [operand(r, n, dtype, op, seed) for r in range(size)]


def pair_block(src, dst, n, dtype, seed):
    """What rank `src` sends rank `dst` in an all-to-all."""
    return operand(100 + 8 * src + dst, n, dtype, None, seed)


def reduce_expected(tensors, op):
    """`op` over `tensors` in rank order with numpy (bfloat16 through float32,
    exact on these small integers), as a tensor of their element type."""
    dtype = tensors[0].dtype
    arrays = [(t.float() if dtype == torch.bfloat16 else t).numpy() for t in tensors]
    if op in LOGICAL:
        arrays = [a != 0 for a in arrays]
    return torch.from_numpy(np.asarray(functools.reduce(UFUNCS[op], arrays))).to(dtype)


def sentinel(n, dtype):
    """A receive buffer holding a value no result has (bool: all False)."""
    if dtype == torch.bool:
        return torch.zeros(n, dtype=dtype)
    return torch.full((n,), 77, dtype=dtype)


def vcounts(size):
    """Uneven block sizes with zeros: 1 3 0 2 ..."""
    return [(2 * r + 1) % 5 for r in range(size)]


def expect(actual, expected, what=""):
    """Assert `actual` equals `expected` in element type and every value."""
    if isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype and np.array_equal(actual, expected), (
            f"{what}\n  actual:   {actual}\n  expected: {expected}")
        return
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, not {expected.dtype}"
    assert torch.equal(actual, expected), (
        f"{what}\n  actual:   {actual.tolist()}\n  expected: {expected.tolist()}")


def no_check(args):
    pass


# -- running one operation every way ---------------------------------------------------


class Findings(list):
    """The failures of one case, kept so that every rank makes all its calls."""

    @contextlib.contextmanager
    def check(self, what):
        try:
            yield
        except Exception as exc:  # noqa: B902 - record anything, keep the ranks in step
            self.append(f"{what}: {type(exc).__name__}: {exc}")

    def report(self):
        if self:
            raise AssertionError(f"{len(self)} failure(s):\n" + "\n".join(self))


def nonblocking_name(method):
    return "I" + method[0].lower() + method[1:]


def buffers(args):
    """The tensors and arrays in `args`, message specs included, in order."""
    for a in args:
        if isinstance(a, (torch.Tensor, np.ndarray)):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from buffers(a)


def refill(args, new_args):
    """Write the buffers of `new_args` into those of `args`, in place."""
    for old, new in zip(buffers(args), buffers(new_args), strict=True):
        old[...] = new


def run_modes(comm, found, what, method, make, modes=MODES):
    """Run `method` on each backend in each of `modes`, recording failures.

    `make(seed)` returns (args, check): fresh buffers for data set `seed`, and
    `check(args)`, which asserts that `args` hold the result. The persistent
    request is made once and started twice, its buffers refilled in place.
    """
    for backend in BACKENDS:
        for mode in modes:
            label = f"{method} {what} backend={backend} {mode}"
            if mode == "blocking":
                args, check = make(0)
                with found.check(label):
                    assert getattr(comm, method)(*args, backend=backend) is None
                    check(args)
            elif mode == "nonblocking":
                args, check = make(1)
                with found.check(label):
                    req = getattr(comm, nonblocking_name(method))(*args, backend=backend)
                    assert type(req) is mcr.Request, type(req)
                    req.Wait()
                    check(args)
            else:
                args, _ = make(2)
                with found.check(label):
                    preq = getattr(comm, method + "_init")(*args, backend=backend)
                    assert isinstance(preq, mcr.Prequest), type(preq)
                    for seed in (3, 4):
                        new_args, check = make(seed)
                        refill(args, new_args)
                        preq.Start()
                        preq.Wait()
                        with found.check(f"{label} start {seed - 2}"):
                            check(args)
                    preq.Free()


def roots(size):
    return sorted({0, size - 1})


# -- Reductions ------------------------------------------------------------------------


def reduce_maker(comm, dtype, op, in_place, root):
    rank, size = comm.rank, comm.size

    def make(seed):
        xs = operands(size, N, dtype, op, seed)
        if rank != root:
            return (xs[rank], None, OPS[op], root), no_check
        want = reduce_expected(xs, op)
        recv = xs[rank].clone() if in_place else sentinel(N, dtype)
        send = mcr.IN_PLACE if in_place else xs[rank]
        return (send, recv, OPS[op], root), lambda a: expect(a[1], want)
    return make


def allreduce_maker(comm, dtype, op, in_place, root):
    rank, size = comm.rank, comm.size

    def make(seed):
        xs = operands(size, N, dtype, op, seed)
        want = reduce_expected(xs, op)
        if in_place:
            return (mcr.IN_PLACE, xs[rank].clone(), OPS[op]), lambda a: expect(a[1], want)
        return (xs[rank], sentinel(N, dtype), OPS[op]), lambda a: expect(a[1], want)
    return make


def reduce_scatter_block_maker(comm, dtype, op, in_place, root, k=2):
    rank, size = comm.rank, comm.size

    def make(seed):
        xs = operands(size, k * size, dtype, op, seed)
        want = reduce_expected(xs, op)[rank * k:(rank + 1) * k]
        if in_place:
            return (mcr.IN_PLACE, xs[rank].clone(), OPS[op]), lambda a: expect(a[1][:k], want)
        return (xs[rank], sentinel(k, dtype), OPS[op]), lambda a: expect(a[1], want)
    return make


def reduce_scatter_maker(comm, dtype, op, in_place, root):
    rank, size = comm.rank, comm.size
    counts = vcounts(size)
    start, mine = sum(counts[:rank]), counts[rank]

    def make(seed):
        xs = operands(size, sum(counts), dtype, op, seed)
        want = reduce_expected(xs, op)[start:start + mine]
        if in_place:
            return ((mcr.IN_PLACE, xs[rank].clone(), counts, OPS[op]),
                    lambda a: expect(a[1][:mine], want))
        # one element more than the block: it must stay untouched
        want_padded = torch.cat([want, sentinel(1, dtype)])
        return ((xs[rank], sentinel(mine + 1, dtype), counts, OPS[op]),
                lambda a: expect(a[1], want_padded))
    return make


def scan_maker(comm, dtype, op, in_place, root, exclusive=False):
    rank, size = comm.rank, comm.size

    def make(seed):
        xs = operands(size, N, dtype, op, seed)
        if exclusive and rank == 0:           # undefined in MPI
            check = no_check
        else:
            want = reduce_expected(xs[:rank] if exclusive else xs[:rank + 1], op)

            def check(a):
                expect(a[1], want)
        if in_place:
            return (mcr.IN_PLACE, xs[rank].clone(), OPS[op]), check
        return (xs[rank], sentinel(N, dtype), OPS[op]), check
    return make


def check_reductions(comm, method, maker, rooted=False):
    found = Findings()
    for i, (dtype, op) in enumerate(REDUCTIONS):
        modes = MODES if i % 3 == 0 else ("blocking",)
        for in_place in (False, True):
            for root in (roots(comm.size) if rooted else [0]):
                make = maker(comm, dtype, op, in_place, root)
                what = (f"{op} on {dtype}{' IN_PLACE' if in_place else ''}"
                        f"{f' root {root}' if rooted else ''}")
                run_modes(comm, found, what, method, make, modes)
    found.report()


@case.quick
def reduce_every_op_type_and_root(comm):
    check_reductions(comm, "Reduce", reduce_maker, rooted=True)


@case.quick
def allreduce_every_op_and_type(comm):
    check_reductions(comm, "Allreduce", allreduce_maker)


@case.quick
def reduce_scatter_block_every_op_and_type(comm):
    check_reductions(comm, "Reduce_scatter_block", reduce_scatter_block_maker)


@case.quick
def reduce_scatter_uneven_counts(comm):
    check_reductions(comm, "Reduce_scatter", reduce_scatter_maker)


@case.quick
def scan_every_op_and_type(comm):
    check_reductions(comm, "Scan", scan_maker)


@case.quick
def exscan_every_op_and_type(comm):
    check_reductions(comm, "Exscan", functools.partial(scan_maker, exclusive=True))


@case
def reduce_scatter_equal_blocks_without_recvcounts(comm):
    rank, size, k = comm.rank, comm.size, 3
    found = Findings()
    for dtype, op in [(torch.float16, "SUM"), (torch.uint64, "MAX"), (torch.bool, "LXOR")]:
        def make(seed, dtype=dtype, op=op):
            xs = operands(size, k * size, dtype, op, seed)
            want = reduce_expected(xs, op)[rank * k:(rank + 1) * k]
            return (xs[rank], sentinel(k, dtype), None, OPS[op]), lambda a: expect(a[1], want)
        run_modes(comm, found, f"{op} on {dtype}, recvcounts None", "Reduce_scatter", make)
    found.report()


# -- Data movement ---------------------------------------------------------------------


def bcast_maker(comm, dtype, root, in_place, kind):
    def make(seed):
        data = operand(root, N, dtype, None, seed)
        buf = data.clone() if comm.rank == root else sentinel(N, dtype)
        return (buf, root), lambda a: expect(a[0], data)
    return make


def gather_maker(comm, dtype, root, in_place, kind, k=3):
    rank, size = comm.rank, comm.size

    def make(seed):
        blocks = operands(size, k, dtype, None, seed)
        if rank != root:
            return (blocks[rank], None, root), no_check
        want = torch.cat(blocks)
        recv = sentinel(k * size, dtype)
        if in_place:
            recv[rank * k:(rank + 1) * k] = blocks[rank]
        send = mcr.IN_PLACE if in_place else blocks[rank]
        return (send, recv, root), lambda a: expect(a[1], want)
    return make


def gatherv_maker(comm, dtype, root, in_place, kind):
    rank, size = comm.rank, comm.size
    counts = vcounts(size)
    displs, length = layout(counts, kind)

    def make(seed):
        blocks = [operand(r, counts[r], dtype, None, seed) for r in range(size)]
        if rank != root:
            return (blocks[rank], None, root), no_check
        recv = sentinel(length, dtype)
        want = place(recv, blocks, displs)
        if in_place:
            recv = place(recv, [blocks[rank]], [displs[rank]])
        send = mcr.IN_PLACE if in_place else blocks[rank]
        return (send, [recv, counts, displs], root), lambda a: expect(a[1][0], want)
    return make


def scatter_maker(comm, dtype, root, in_place, kind, k=3):
    rank, size = comm.rank, comm.size

    def make(seed):
        blocks = operands(size, k, dtype, None, seed)
        if rank != root:
            return (None, sentinel(k, dtype), root), lambda a: expect(a[1], blocks[rank])
        whole = torch.cat(blocks)
        if in_place:               # the root's block stays in the send buffer
            return (whole.clone(), mcr.IN_PLACE, root), lambda a: expect(a[0], whole)
        return (whole, sentinel(k, dtype), root), lambda a: expect(a[1], blocks[rank])
    return make


def scatterv_maker(comm, dtype, root, in_place, kind):
    rank, size = comm.rank, comm.size
    counts = vcounts(size)
    displs, length = layout(counts, kind)

    def make(seed):
        blocks = [operand(r, counts[r], dtype, None, seed) for r in range(size)]
        # a receive buffer one element longer than the block: the last stays
        recv = [sentinel(counts[rank] + 1, dtype), counts[rank]]
        want = torch.cat([blocks[rank], sentinel(1, dtype)])
        if rank != root:
            return (None, recv, root), lambda a: expect(a[1][0], want)
        send = place(sentinel(length, dtype), blocks, displs)
        if in_place:
            unchanged = send.clone()
            return ([send, counts, displs], mcr.IN_PLACE, root), \
                lambda a: expect(a[0][0], unchanged)
        return ([send, counts, displs], recv, root), lambda a: expect(a[1][0], want)
    return make


def allgather_maker(comm, dtype, root, in_place, kind, k=2):
    rank, size = comm.rank, comm.size

    def make(seed):
        blocks = operands(size, k, dtype, None, seed)
        want = torch.cat(blocks)
        recv = sentinel(k * size, dtype)
        if in_place:
            recv[rank * k:(rank + 1) * k] = blocks[rank]
        send = mcr.IN_PLACE if in_place else blocks[rank]
        return (send, recv), lambda a: expect(a[1], want)
    return make


def allgatherv_maker(comm, dtype, root, in_place, kind):
    rank, size = comm.rank, comm.size
    counts = vcounts(size)
    displs, length = layout(counts, kind)

    def make(seed):
        blocks = [operand(r, counts[r], dtype, None, seed) for r in range(size)]
        recv = sentinel(length, dtype)
        want = place(recv, blocks, displs)
        if in_place:
            recv = place(recv, [blocks[rank]], [displs[rank]])
        send = mcr.IN_PLACE if in_place else blocks[rank]
        return (send, [recv, counts, displs]), lambda a: expect(a[1][0], want)
    return make


def alltoall_maker(comm, dtype, root, in_place, kind, k=2):
    rank, size = comm.rank, comm.size

    def make(seed):
        send = torch.cat([pair_block(rank, j, k, dtype, seed) for j in range(size)])
        want = torch.cat([pair_block(j, rank, k, dtype, seed) for j in range(size)])
        if in_place:
            return (mcr.IN_PLACE, send), lambda a: expect(a[1], want)
        return (send, sentinel(k * size, dtype)), lambda a: expect(a[1], want)
    return make


def alltoallv_maker(comm, dtype, root, in_place, kind):
    """Send layout `kind`, receive layout the next one; IN_PLACE needs
    symmetric counts (what rank i sends j is what j sends i)."""
    rank, size = comm.rank, comm.size
    if in_place:
        def count(i, j):
            return (i + j + 1) % 3
    else:
        def count(i, j):
            return (i + 2 * j + 1) % 4
    scounts = [count(rank, j) for j in range(size)]
    rcounts = [count(j, rank) for j in range(size)]
    rkind = LAYOUTS[(LAYOUTS.index(kind) + 1) % len(LAYOUTS)]
    sdispls, slength = layout(scounts, kind)
    rdispls, rlength = layout(rcounts, rkind)

    def make(seed):
        outgoing = [pair_block(rank, j, scounts[j], dtype, seed) for j in range(size)]
        incoming = [pair_block(j, rank, rcounts[j], dtype, seed) for j in range(size)]
        want = place(sentinel(rlength, dtype), incoming, rdispls)
        if in_place:
            buf = place(sentinel(rlength, dtype), outgoing, rdispls)
            return (mcr.IN_PLACE, [buf, rcounts, rdispls]), lambda a: expect(a[1][0], want)
        send = place(sentinel(slength, dtype), outgoing, sdispls)
        recv = sentinel(rlength, dtype)
        return (([send, scounts, sdispls], [recv, np.array(rcounts), rdispls]),
                lambda a: expect(a[1][0], want))
    return make


def check_movement(comm, method, maker, rooted=False, vector=False, in_place=(False, True)):
    found = Findings()
    kinds = LAYOUTS if vector else ("packed",)
    for i, dtype in enumerate(MOVE_DTYPES):
        for j, kind in enumerate(kinds):
            modes = MODES if (i + j) % 2 == 0 else ("blocking",)
            for ip in in_place:
                for root in (roots(comm.size) if rooted else [0]):
                    make = maker(comm, dtype, root, ip, kind)
                    what = (f"on {dtype}{' ' + kind if vector else ''}"
                            f"{' IN_PLACE' if ip else ''}{f' root {root}' if rooted else ''}")
                    run_modes(comm, found, what, method, make, modes)
    found.report()


@case.quick
def barrier(comm):
    found = Findings()
    run_modes(comm, found, "", "Barrier", lambda seed: ((), no_check))
    found.report()


@case.quick
def bcast_every_root(comm):
    check_movement(comm, "Bcast", bcast_maker, rooted=True, in_place=(False,))


@case.quick
def gather_every_root(comm):
    check_movement(comm, "Gather", gather_maker, rooted=True)


@case.quick
def gatherv_uneven_gaps_reversed(comm):
    check_movement(comm, "Gatherv", gatherv_maker, rooted=True, vector=True)


@case.quick
def scatter_every_root(comm):
    check_movement(comm, "Scatter", scatter_maker, rooted=True)


@case.quick
def scatterv_uneven_gaps_reversed(comm):
    check_movement(comm, "Scatterv", scatterv_maker, rooted=True, vector=True)


@case.quick
def allgather(comm):
    check_movement(comm, "Allgather", allgather_maker)


@case.quick
def allgatherv_uneven_gaps_reversed(comm):
    check_movement(comm, "Allgatherv", allgatherv_maker, vector=True)


@case.quick
def alltoall(comm):
    check_movement(comm, "Alltoall", alltoall_maker)


@case.quick
def alltoallv_uneven_gaps_reversed(comm):
    check_movement(comm, "Alltoallv", alltoallv_maker, vector=True)


@case
def numpy_arrays(comm):
    """numpy arrays as buffers, on both backends."""
    rank, size = comm.rank, comm.size
    found = Findings()
    for dtype, op in [(torch.float32, "SUM"), (torch.int64, "MIN"), (torch.uint8, "BXOR"),
                      (torch.bool, "LOR"), (torch.complex128, "PROD"), (torch.uint64, "MAX")]:
        def make(seed, dtype=dtype, op=op):
            xs = [x.numpy() for x in operands(size, N, dtype, op, seed)]
            want = reduce_expected([torch.from_numpy(x) for x in xs], op).numpy()
            return (xs[rank], np.zeros(N, xs[rank].dtype), OPS[op]), lambda a: expect(a[1], want)
        run_modes(comm, found, f"numpy {op} on {dtype}", "Allreduce", make)
    counts = vcounts(size)
    displs, length = layout(counts, "reversed")

    def allgatherv(seed):
        blocks = [operand(r, counts[r], torch.float64, None, seed).numpy() for r in range(size)]
        recv = np.full(length, -1.0)
        want = place(recv, blocks, displs)
        return (blocks[rank], [recv, counts, displs]), lambda a: expect(a[1][0], want)
    run_modes(comm, found, "numpy float64 reversed", "Allgatherv", allgatherv)

    def bcast(seed):
        data = operand(size - 1, N, torch.int16, None, seed).numpy()
        buf = data.copy() if rank == size - 1 else np.zeros(N, np.int16)
        return (buf, size - 1), lambda a: expect(a[0], data)
    run_modes(comm, found, "numpy int16", "Bcast", bcast)
    found.report()


@case
def sub_communicators(comm):
    """Gloo on communicators made by Split and Dup, each with its own group."""
    found = Findings()
    split = comm.Split(comm.rank % 2, comm.size - comm.rank)     # keys reverse the order
    same_color = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
    for sub, members in ((split, same_color[::-1]), (comm.Dup(), list(range(comm.size)))):
        xs = [operand(r, N, torch.bfloat16, "SUM") for r in members]
        want = reduce_expected(xs, "SUM")
        for backend in BACKENDS:
            recv = sentinel(N, torch.bfloat16)
            with found.check(f"Allreduce on a {sub.size}-rank sub-communicator, {backend}"):
                sub.Allreduce(xs[sub.rank], recv, backend=backend)
                expect(recv, want)
            recv = sentinel(N * sub.size, torch.bfloat16)
            with found.check(f"Allgather on a {sub.size}-rank sub-communicator, {backend}"):
                sub.Allgather(xs[sub.rank], recv, backend=backend)
                expect(recv, torch.cat(xs))
        sub.Free()
    found.report()


# -- Point-to-point --------------------------------------------------------------------
# Rings and pairs need 2+ ranks; messages to oneself have their own case.


def ring(comm):
    """(right, left) neighbours."""
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def post(found, what, call):
    """The request `call()` returns, or None when it raises (recorded)."""
    with found.check(what):
        return call()
    return None


def wait_posted(found, what, requests, statuses=None):
    """Waitall on the requests that were posted (None: the post failed)."""
    with found.check(what):
        mcr.Request.Waitall([r for r in requests if r is not None], statuses)


def status_of(st):
    return st.Get_source(), st.Get_tag(), st.Get_count()


@case
def messages_to_self(comm):
    """Send, Isend/Irecv and Sendrecv from a rank to itself (on a duplicate of
    the communicator, so that a message left over cannot match elsewhere)."""
    comm = comm.Dup()
    rank = comm.rank
    found = Findings()
    for backend in BACKENDS:
        data = operand(rank, N, torch.complex64)
        out = sentinel(N, torch.complex64)
        st = mcr.Status()
        send = post(found, f"Isend to self, {backend}",
                    lambda: comm.Isend(data, rank, 3, backend=backend))
        with found.check(f"Recv from self, {backend}"):
            comm.Recv(out, rank, 3, st, backend=backend)
            expect(out, data)
            assert status_of(st) == (rank, 3, N), status_of(st)
        wait_posted(found, f"Isend to self, {backend}", [send])
        out = sentinel(N, torch.complex64)
        with found.check(f"Sendrecv with self, {backend}"):
            comm.Sendrecv(data, rank, 4, out, rank, 4, backend=backend)
            expect(out, data)
    comm.Free()
    found.report()


@case
def free_with_operations_pending(comm):
    """MPI lets a communicator be freed with operations pending, which then
    complete: Irecv and Isend around a ring (above and below the eager limit,
    and to self), Free, then Waitall. One rank frees late. On Gloo, each rank's
    Free waits for its sends, whose payloads wait for the receiver to match
    their headers: Free matches them (it hung before, every rank waiting for
    its own sends)."""
    right, left = ring(comm)
    for backend in BACKENDS:
        sub = comm.Dup()
        sub.timeout = 60.0                  # a hang fails this case
        sub.Barrier(backend=backend)        # the backend is set up
        reqs, expected = [], []
        for k, n in enumerate((EAGER // 4 * 8, 5)):     # 8x the limit, then eager
            for peer_in, peer_out in ((left, right), (comm.rank, comm.rank)):
                tag = 10 * k + (peer_in == comm.rank)
                out = torch.zeros(n)
                reqs.append(sub.Irecv(out, peer_in, tag, backend=backend))
                expected.append((out, operand(peer_in, n, torch.float32, None, tag)))
                reqs.append(sub.Isend(operand(comm.rank, n, torch.float32, None, tag),
                                      peer_out, tag, backend=backend))
        if comm.rank == 0:
            time.sleep(0.2)
        sub.Free()
        mcr.Request.Waitall(reqs)
        for out, exp in expected:
            expect(out, exp, backend)


@case.quick
def tags_matched_out_of_order(comm):
    """Each rank sends tags 1 then 2 to its right (rank 0 to rank 1); the
    receiver takes tag 2 first."""
    if comm.size == 1:
        return
    right, left = ring(comm)
    found = Findings()
    for backend in BACKENDS:
        sends = [post(found, f"Isend tag {t}, {backend}",
                      lambda t=t: comm.Isend(operand(10 * comm.rank + t, 4, torch.float16),
                                             right, t, backend=backend))
                 for t in (1, 2)]
        for t in (2, 1):
            buf = sentinel(4, torch.float16)
            st = mcr.Status()
            with found.check(f"Recv tag {t} first, {backend}"):
                comm.Recv(buf, left, t, st, backend=backend)
                expect(buf, operand(10 * left + t, 4, torch.float16))
                assert status_of(st) == (left, t, 4), status_of(st)
        wait_posted(found, f"sends, {backend}", sends)
    found.report()


@case
def any_source_any_tag_with_statuses(comm):
    """Every other rank sends rank elements, tag 50+rank, to rank 0, which takes
    them with ANY_SOURCE/ANY_TAG into a larger buffer and learns the source,
    tag and count (in elements) from the status."""
    found = Findings()
    for backend in BACKENDS:
        for dtype in (torch.float64, torch.bfloat16, torch.uint64):
            comm.Barrier()                 # no message of the last round is left
            if comm.rank != 0:
                send = post(found, f"Isend {dtype}, {backend}", lambda: comm.Isend(
                    operand(comm.rank, comm.rank, dtype), 0, 50 + comm.rank, backend=backend))
                wait_posted(found, f"Isend {dtype}, {backend}", [send])
                continue
            seen = []
            for _ in range(comm.size - 1):
                buf = sentinel(comm.size + 2, dtype)
                st = mcr.Status()
                with found.check(f"Recv ANY_SOURCE ANY_TAG {dtype}, {backend}"):
                    comm.Recv(buf, MPI.ANY_SOURCE, MPI.ANY_TAG, st, backend=backend)
                    src = st.Get_source()
                    seen.append(src)
                    assert (st.source, st.tag, st.Get_tag()) == (src, 50 + src, 50 + src), (
                        src, st.tag)
                    assert st.Get_count() == src, (st.Get_count(), src)
                    assert st.Get_count(MPI.BYTE) == src * buf.element_size()
                    expect(buf, torch.cat([operand(src, src, dtype),
                                           sentinel(comm.size + 2 - src, dtype)]))
            with found.check(f"every source seen once, {backend}"):
                assert sorted(seen) == list(range(1, comm.size)), seen
    found.report()


@case
def probe_and_iprobe_then_recv(comm):
    if comm.size == 1:
        return
    right, left = ring(comm)
    found = Findings()
    n, m = comm.rank + 2, left + 2
    for backend in BACKENDS:
        sends = [post(found, f"Isend tag {5 + t}, {backend}",
                      lambda t=t: comm.Isend(operand(comm.rank, n, torch.int32, None, t), right,
                                             5 + t, backend=backend))
                 for t in (0, 1)]
        # Probe: learn source, tag and size, then receive exactly that
        st = mcr.Status()
        with found.check(f"Probe, {backend}"):
            assert comm.Probe(MPI.ANY_SOURCE, 5, st, backend=backend) is True
            assert (st.Get_source(), st.Get_tag()) == (left, 5), status_of(st)
            assert (st.Get_count(MPI.INT32_T), st.Get_count(MPI.BYTE)) == (m, 4 * m), (
                st.Get_count(MPI.INT32_T), st.Get_count(MPI.BYTE), m)
        buf = sentinel(m, torch.int32)
        rst = mcr.Status()
        with found.check(f"Recv after Probe, {backend}"):
            comm.Recv(buf, left, 5, rst, backend=backend)
            expect(buf, operand(left, m, torch.int32, None, 0))
            assert status_of(rst) == (left, 5, m), status_of(rst)
        # Iprobe: nothing with tag 99; tag 6 arrives eventually
        with found.check(f"Iprobe of a message never sent, {backend}"):
            assert comm.Iprobe(MPI.ANY_SOURCE, 99, backend=backend) is False
        st = mcr.Status()
        with found.check(f"Iprobe, {backend}"):
            deadline = time.monotonic() + 60
            while not comm.Iprobe(left, MPI.ANY_TAG, st, backend=backend):
                assert time.monotonic() < deadline, "Iprobe never saw the message"
            assert (st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT32_T)) == (left, 6, m), (
                st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT32_T))
        buf = sentinel(m + 1, torch.int32)
        with found.check(f"Recv after Iprobe, {backend}"):
            comm.Recv(buf, left, 6, None, backend=backend)
            expect(buf, torch.cat([operand(left, m, torch.int32, None, 1),
                                   sentinel(1, torch.int32)]))
        wait_posted(found, f"sends, {backend}", sends)
    found.report()


@case
def get_count_in_elements(comm):
    if comm.size == 1:
        return
    right, left = ring(comm)
    found = Findings()
    for backend in BACKENDS:
        for seed, dtype in enumerate([torch.uint8, torch.bfloat16, torch.float16, torch.bool,
                                      torch.uint32, torch.complex64, torch.complex128]):
            n, what = 3 + seed, f"{dtype}, {backend}"
            buf = sentinel(n + 4, dtype)
            req = post(found, f"Irecv {what}",
                       lambda: comm.Irecv(buf, left, seed, backend=backend))
            with found.check(f"Send {what}"):
                comm.Send(operand(comm.rank, n, dtype, None, seed), right, seed, backend=backend)
            st = mcr.Status()
            with found.check(f"Wait {what}"):
                req.Wait(st)
                assert status_of(st) == (left, seed, n), status_of(st)
                assert st.Get_count(MPI.BYTE) == n * buf.element_size()
                expect(buf[:n], operand(left, n, dtype, None, seed))
                expect(buf[n:], sentinel(4, dtype))
    found.report()


@case
def proc_null(comm):
    found = Findings()
    for backend in BACKENDS:
        x = operand(comm.rank, 4, torch.float32)
        y = sentinel(4, torch.float32)
        st = mcr.Status()
        with found.check(f"Send and Recv, {backend}"):
            comm.Send(x, MPI.PROC_NULL, 3, backend=backend)
            comm.Recv(y, MPI.PROC_NULL, 3, st, backend=backend)
            assert status_of(st) == (MPI.PROC_NULL, MPI.ANY_TAG, 0), status_of(st)
        statuses = []
        with found.check(f"Isend and Irecv, {backend}"):
            mcr.Request.Waitall([comm.Isend(x, MPI.PROC_NULL, backend=backend),
                                 comm.Irecv(y, MPI.PROC_NULL, backend=backend)], statuses)
            assert status_of(statuses[1]) == (MPI.PROC_NULL, MPI.ANY_TAG, 0)
        with found.check(f"Sendrecv and Sendrecv_replace, {backend}"):
            comm.Sendrecv(x, MPI.PROC_NULL, 0, y, MPI.PROC_NULL, 0, backend=backend)
            comm.Sendrecv_replace(y, MPI.PROC_NULL, 0, MPI.PROC_NULL, 0, backend=backend)
        with found.check(f"Probe, {backend}"):
            assert comm.Probe(MPI.PROC_NULL, 0, st, backend=backend) is True
            assert status_of(st) == (MPI.PROC_NULL, MPI.ANY_TAG, 0), status_of(st)
        with found.check(f"the buffer is untouched, {backend}"):
            expect(y, sentinel(4, torch.float32))
    found.report()


def assert_truncated(call, source, tag, capacity):
    """ERR_TRUNCATE, noted in the same words on every backend (the message's
    size only where it is known)."""
    try:
        call()
    except mcr.Exception as exc:
        assert isinstance(exc, MPI.Exception)
        assert exc.Get_error_class() == MPI.ERR_TRUNCATE, exc
        tail = (f" from rank {source} (tag {tag}) does not fit the receive buffer of "
                f"{capacity} bytes")
        notes = getattr(exc, "__notes__", [])
        assert f"buf: message of 20 bytes{tail}" in notes or f"buf: a message{tail}" in notes, \
            notes
    else:
        raise AssertionError("no error")


@case
def truncation_raises_err_truncate(comm):
    """A message longer than the receive buffer: mcr.Exception with error class
    ERR_TRUNCATE at Recv, or at Wait for Irecv; the next message still matches."""
    if comm.size == 1:
        return
    right, left = ring(comm)
    found = Findings()
    for backend in BACKENDS:
        sends = [post(found, f"Isend tag {t}, {backend}",
                      lambda t=t: comm.Isend(operand(comm.rank, 5, torch.float32, None, t),
                                             right, t, backend=backend))
                 for t in (1, 2, 3)]
        with found.check(f"Recv 5 elements into 3, {backend}"):
            assert_truncated(lambda: comm.Recv(torch.zeros(3), left, 1, backend=backend),
                             left, 1, 12)
        req = post(found, f"Irecv, {backend}",
                   lambda: comm.Irecv(torch.zeros(2), left, 2, backend=backend))
        with found.check(f"Wait for 5 elements into 2, {backend}"):
            assert_truncated(req.Wait, left, 2, 8)
        buf = torch.zeros(5)
        with found.check(f"the next message, {backend}"):
            comm.Recv(buf, left, 3, backend=backend)
            expect(buf, operand(left, 5, torch.float32, None, 3))
        wait_posted(found, f"sends, {backend}", sends)
    found.report()


@case
def truncation_of_a_message_to_itself(comm):
    """A rank's Gloo message to itself, longer than the receive posted for it:
    ERR_TRUNCATE as between two ranks (the header carrying it is truncated
    silently by Open MPI between a process and itself), then the next one."""
    me = comm.rank
    req = comm.Irecv(torch.zeros(2), me, 7, backend="gloo")
    comm.Send(torch.ones(5), me, 7, backend="gloo")
    assert_truncated(req.Wait, me, 7, 8)
    buf = torch.zeros(5)
    comm.Send(torch.full((5,), 2.0), me, 8, backend="gloo")
    comm.Recv(buf, me, 8, backend="gloo")
    expect(buf, torch.full((5,), 2.0))



EAGER = mcr.backends.gloo.BACKEND.eager_limit


@case
def eager_and_backend_payloads(comm):
    """Point-to-point messages on both sides of the eager limit (payload inside
    the MPI header, or over Gloo after it): to the neighbours and to oneself,
    received by tag out of order, with ANY_SOURCE after a Probe, and truncated;
    every payload and status checked."""
    right, left = ring(comm)
    found = Findings()
    sizes = (EAGER // 4, EAGER // 4 + 1, 3 * EAGER // 4 + 5)    # float32 elements
    for backend in BACKENDS:
        for k, n in enumerate(sizes):
            comm.Barrier()
            sends = [post(found, f"Isend {n} to {dest}, {backend}", lambda dest=dest, t=t:
                          comm.Isend(operand(comm.rank, n, torch.float32, None, t), dest,
                                     10 + t, backend=backend))
                     for t, dest in ((1, right), (2, right), (3, comm.rank))]
            for t, src in ((2, left), (1, left), (3, comm.rank)):   # tags out of order
                buf, st = sentinel(n + 1, torch.float32), mcr.Status()
                with found.check(f"Recv {n} tag {10 + t} from {src}, {backend}"):
                    comm.Recv(buf, src, 10 + t, st, backend=backend)
                    expect(buf, torch.cat([operand(src, n, torch.float32, None, t),
                                           sentinel(1, torch.float32)]))
                    assert status_of(st) == (src, 10 + t, n), status_of(st)
            wait_posted(found, f"sends of {n}, {backend}", sends)
            if comm.size == 1:
                continue
            # Probe, then ANY_SOURCE into exactly the probed size; then a truncation
            send = post(found, f"Isend {n} tag 20, {backend}", lambda: comm.Isend(
                operand(comm.rank, n, torch.float32, None, 9), right, 20, backend=backend))
            st = mcr.Status()
            with found.check(f"Probe {n}, {backend}"):
                comm.Probe(MPI.ANY_SOURCE, 20, st, backend=backend)
                got = (st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE))
                assert got == (left, 20, 4 * n), got
            buf = sentinel(n, torch.float32)
            with found.check(f"Recv ANY_SOURCE {n} after Probe, {backend}"):
                comm.Recv(buf, MPI.ANY_SOURCE, 20, backend=backend)
                expect(buf, operand(left, n, torch.float32, None, 9))
            short = post(found, f"Isend {n} tag 21, {backend}", lambda: comm.Isend(
                operand(comm.rank, n, torch.float32, None, 8), right, 21, backend=backend))
            with found.check(f"Recv {n} into {n - 1}, {backend}"):
                try:
                    comm.Recv(torch.zeros(n - 1), left, 21, backend=backend)
                except mcr.Exception as exc:
                    assert exc.Get_error_class() == MPI.ERR_TRUNCATE, exc
                else:
                    raise AssertionError("no ERR_TRUNCATE")
            wait_posted(found, f"Isend tags 20 and 21 of {n}, {backend}", [send, short])
    found.report()


@case
def many_large_sends_then_receives(comm):
    """More buffered sends above the eager limit than the threads that wait
    for sends, each rank's receives waited one at a time after all of them
    (once a thread per send waited and polled receives queued behind them: a
    deadlock); many sizes, each received whole and intact, with the send
    buffer changed right after each Send (buffered: the copy travels). The
    payloads are copied into buffers that delivered sends used before, smaller
    and larger messages than the buffer; the sub-communicator keeps at most a
    few such buffers."""
    if comm.size == 1:
        return
    right, left = ring(comm)
    found = Findings()
    sizes = [EAGER // 4 + 1, 3 * EAGER, EAGER // 2 + 7, 2 * EAGER + 3, EAGER // 4 + 1,
             3 * EAGER, 5 * EAGER // 4]                  # float32 elements
    for rnd in range(2):
        recvs = []
        for i, n in enumerate(sizes):
            buf = sentinel(n, torch.float32)
            recvs.append((buf, n, i, post(found, f"Irecv {n} #{i}", lambda buf=buf, i=i:
                                          comm.Irecv(buf, left, 40 + i, backend=GLOO))))
        for i, n in enumerate(sizes):
            data = operand(comm.rank, n, torch.float32, None, 10 * rnd + i).clone()
            with found.check(f"Send {n} #{i}"):
                comm.Send(data, right, 40 + i, backend=GLOO)
            data.fill_(-1)                     # the message already left with its copy
        for buf, n, i, req in recvs:
            wait_posted(found, f"Irecv {n} #{i}", [req])
            with found.check(f"payload {n} #{i}, round {rnd}"):
                expect(buf, operand(left, n, torch.float32, None, 10 * rnd + i))
        comm.Barrier()
    # every send is delivered now; each Send settles the ones seen delivered
    # (the first look hands a send's wait to a thread, a later one sees it done)
    one = torch.ones(1)
    for _ in range(2):
        with found.check("small Sendrecv"):
            comm.Sendrecv(one, right, 50, torch.empty(1), left, 50, backend=GLOO)
        comm.Barrier()
    with found.check("spare payload buffers"):
        spare = mcr.backends.subcomm(comm, GLOO).spare
        assert 1 <= len(spare) <= 4 and sum(b.numel() for b in spare) <= 1 << 26, \
            [b.numel() for b in spare]
    found.report()


@case.quick
def sendrecv_and_sendrecv_replace_ring(comm):
    if comm.size == 1:
        return
    right, left = ring(comm)
    found = Findings()
    for backend in BACKENDS:
        for seed, dtype in enumerate([torch.bfloat16, torch.uint64, torch.bool, torch.int8,
                                      torch.complex128]):
            buf = sentinel(6, dtype)
            st = mcr.Status()
            with found.check(f"Sendrecv {dtype}, {backend}"):
                comm.Sendrecv(operand(comm.rank, 6, dtype, None, seed), right, seed, buf,
                              left, seed, st, backend=backend)
                expect(buf, operand(left, 6, dtype, None, seed))
                assert status_of(st) == (left, seed, 6), status_of(st)
            buf = operand(comm.rank, 4, dtype, None, seed).clone()
            st = mcr.Status()
            with found.check(f"Sendrecv_replace {dtype}, {backend}"):
                comm.Sendrecv_replace(buf, right, 7, left, 7, st, backend=backend)
                expect(buf, operand(left, 4, dtype, None, seed))
                assert status_of(st) == (left, 7, 4), status_of(st)
        # numpy arrays, a message shorter than the receive buffer
        out = np.zeros(8, np.float32)
        with found.check(f"Sendrecv numpy, {backend}"):
            comm.Sendrecv(operand(comm.rank, comm.rank + 1, torch.float32).numpy(), right, 1,
                          out, left, 1, backend=backend)
            expect(out, np.concatenate([operand(left, left + 1, torch.float32).numpy(),
                                        np.zeros(7 - left, np.float32)]))
    found.report()


@case.quick
def send_init_recv_init(comm):
    """Persistent point-to-point, started twice with new data."""
    if comm.size == 1:
        return
    right, left = ring(comm)
    found = Findings()
    for backend in BACKENDS:
        out = sentinel(N, torch.uint32)
        data = operand(comm.rank, N, torch.uint32)
        with found.check(f"Recv_init and Send_init, {backend}"):
            reqs = [comm.Recv_init(out, left, 4, backend=backend),
                    comm.Send_init(data, right, 4, backend=backend)]
            for seed in (1, 2):
                data[...] = operand(comm.rank, N, torch.uint32, None, seed)
                out[...] = sentinel(N, torch.uint32)
                statuses = []
                mcr.Prequest.Startall(reqs)
                mcr.Request.Waitall(reqs, statuses)
                with found.check(f"start {seed}, {backend}"):
                    expect(out, operand(left, N, torch.uint32, None, seed))
                    assert status_of(statuses[0]) == (left, 4, N), status_of(statuses[0])
            for req in reqs:
                req.Free()
    found.report()


# -- Request sets ----------------------------------------------------------------------


@case
def waitany_waitsome_testall_over_gloo(comm):
    if comm.size == 1:
        return
    right, left = ring(comm)
    found = Findings()
    k = 4
    for how in ("Waitany", "Waitsome", "Testall"):
        bufs = [sentinel(t + 1, torch.int64) for t in range(k)]
        with found.check(f"{how}: posting"):
            recvs = [comm.Irecv(bufs[t], left, 20 + t, backend=GLOO) for t in range(k)]
            sends = [comm.Isend(operand(comm.rank, t + 1, torch.int64, None, t), right, 20 + t,
                                backend=GLOO) for t in reversed(range(k))]
        done = []
        with found.check(how):
            if how == "Waitany":
                while True:
                    st = mcr.Status()
                    index = mcr.Request.Waitany(recvs, st)
                    if index == MPI.UNDEFINED:
                        break
                    done.append(index)
                    assert status_of(st) == (left, 20 + index, index + 1), status_of(st)
            elif how == "Waitsome":
                while True:
                    statuses = [mcr.Status() for _ in range(k)]
                    indices = mcr.Request.Waitsome(recvs, statuses)
                    if indices is None:
                        break
                    assert indices, "Waitsome returned no index"
                    for i, index in enumerate(indices):
                        done.append(index)
                        assert statuses[i].Get_tag() == 20 + index, (i, index)
            else:
                deadline = time.monotonic() + 60
                while not mcr.Request.Testall(recvs):
                    assert time.monotonic() < deadline, "Testall never true"
                done = list(range(k))
            assert sorted(done) == list(range(k)), done
            for t in range(k):
                expect(bufs[t], operand(left, t + 1, torch.int64, None, t), f"tag {20 + t}")
            mcr.Request.Waitall(sends)
    found.report()


@case
def gloo_and_mpi_requests_mixed(comm):
    """Collectives (and, at 2+ ranks, point-to-point) on both backends
    outstanding at once, completed by Waitall, Waitany loops, Waitsome loops."""
    rank, size = comm.rank, comm.size
    right, left = ring(comm)
    found = Findings()
    for how in ("Waitall", "Waitany", "Waitsome"):
        xs = operands(size, N, torch.float16, "SUM", 7)
        red, gat = sentinel(N, torch.float16), sentinel(N * size, torch.float16)
        ag = sentinel(N * size, torch.uint64)
        bc = operand(0, N, torch.int32) if rank == 0 else sentinel(N, torch.int32)
        p2p, p2p_mpi = sentinel(N, torch.uint64), sentinel(N, torch.uint64)
        mine = operand(rank, N, torch.uint64)
        calls = {
            "Iallreduce gloo": lambda: comm.Iallreduce(xs[rank], red, backend=GLOO),
            "Iallgather mpi": lambda: comm.Iallgather(xs[rank], gat, backend="mpi"),
            "Iallgather gloo": lambda: comm.Iallgather(mine, ag, backend=GLOO),
            "Ibcast gloo": lambda: comm.Ibcast(bc, 0, backend=GLOO),
        }
        if size > 1:
            calls.update({
                "Irecv gloo": lambda: comm.Irecv(p2p, left, 1, backend=GLOO),
                "Irecv mpi": lambda: comm.Irecv(p2p_mpi, left, 1, backend="mpi"),
                "Isend mpi": lambda: comm.Isend(operand(rank, N, torch.uint64, None, 1),
                                                right, 1, backend="mpi"),
                "Isend gloo": lambda: comm.Isend(operand(rank, N, torch.uint64, None, 2),
                                                 right, 1, backend=GLOO),
            })
        posted = {what: post(found, f"{how}: {what}", call) for what, call in calls.items()}
        reqs = [r for r in posted.values() if r is not None]
        with found.check(how):
            if how == "Waitall":
                assert mcr.Request.Waitall(reqs) is True
            elif how == "Waitany":
                while mcr.Request.Waitany(reqs) != MPI.UNDEFINED:
                    pass
            else:
                while mcr.Request.Waitsome(reqs) is not None:
                    pass
        results = {
            "Iallreduce gloo": (red, reduce_expected(xs, "SUM")),
            "Iallgather mpi": (gat, torch.cat(xs)),
            "Iallgather gloo": (ag, torch.cat([operand(r, N, torch.uint64)
                                               for r in range(size)])),
            "Ibcast gloo": (bc, operand(0, N, torch.int32)),
            "Irecv gloo": (p2p, operand(left, N, torch.uint64, None, 2)),
            "Irecv mpi": (p2p_mpi, operand(left, N, torch.uint64, None, 1)),
        }
        for what, (actual, expected) in results.items():
            if posted.get(what) is not None:
                with found.check(f"{how}: {what}"):
                    expect(actual, expected)
    found.report()


# -- Errors ----------------------------------------------------------------------------


def bad_calls(comm):
    """(what, call(backend)) with arguments that are wrong on every rank."""
    size = comm.size
    right = (comm.rank + 1) % size
    x3, x2 = torch.zeros(3), torch.zeros(2)
    return [
        ("Bcast root = size", lambda b: comm.Bcast(x3, size, backend=b)),
        ("Reduce root -1", lambda b: comm.Reduce(x3, torch.zeros(3), mcr.SUM, -1, backend=b)),
        ("Igather root = size", lambda b: comm.Igather(x3, torch.zeros(3 * size), size,
                                                       backend=b)),
        ("Allreduce counts differ", lambda b: comm.Allreduce(x3, x2, backend=b)),
        ("Allreduce_init counts differ", lambda b: comm.Allreduce_init(x3, x2, backend=b)),
        ("Allreduce float32 into float64",
         lambda b: comm.Allreduce(x3, torch.zeros(3, dtype=torch.float64), backend=b)),
        ("Allreduce BAND on float", lambda b: comm.Allreduce(x3, torch.zeros(3), mcr.BAND,
                                                             backend=b)),
        ("Iallreduce LAND on complex",
         lambda b: comm.Iallreduce(mcr.IN_PLACE, torch.zeros(3, dtype=torch.complex64),
                                   mcr.LAND, backend=b)),
        ("Allgatherv counts of length size+1",
         lambda b: comm.Allgatherv(x2, [torch.zeros(9), [1] * (size + 1)], backend=b)),
        ("Allgatherv displacement past the end",
         lambda b: comm.Allgatherv(x2[:1], [torch.zeros(size), [1] * size, [size] * size],
                                   backend=b)),
        ("Allgather receive buffer too short",
         lambda b: comm.Allgather(x2, torch.zeros(2 * size - 1), backend=b)),
        ("Reduce_scatter recvcounts do not sum to the send count",
         lambda b: comm.Reduce_scatter(torch.zeros(size + 1), torch.zeros(1), [1] * size,
                                       backend=b)),
        ("Alltoallv counts of length size-1",
         lambda b: comm.Ialltoallv([x3, [1] * (size - 1)], [x3, [1] * size], backend=b)),
        ("Send tag -5", lambda b: comm.Send(x3, right, -5, backend=b)),
        ("Isend dest = size", lambda b: comm.Isend(x3, size, 0, backend=b)),
        ("Recv into bytes", lambda b: comm.Recv(bytes(4), MPI.PROC_NULL, 0, backend=b)),
    ]


def raised(call):
    try:
        call()
    except Exception as exc:  # noqa: B902
        return exc
    return None


def argument_named(exc):
    return str(exc).split(":")[0]


@case
def validation_errors_as_on_mpi(comm):
    """Every rank makes the same bad call: Gloo raises what MPI raises, naming
    the same argument."""
    found = Findings()
    for what, call in bad_calls(comm):
        on_mpi, on_gloo = raised(lambda: call("mpi")), raised(lambda: call(GLOO))
        with found.check(what):
            assert on_mpi is not None, "not raised on mpi"
            assert on_gloo is not None, "not raised on gloo"
            assert type(on_gloo) is type(on_mpi), (type(on_gloo), type(on_mpi), str(on_gloo))
            assert isinstance(on_gloo, (TypeError, ValueError, IndexError, BufferError))
            assert argument_named(on_gloo) == argument_named(on_mpi), (str(on_gloo),
                                                                       str(on_mpi))
    with found.check("the communicator works after the errors"):
        recv = sentinel(N, torch.int64)
        xs = operands(comm.size, N, torch.int64, "SUM")
        comm.Allreduce(xs[comm.rank], recv, backend=GLOO)
        expect(recv, reduce_expected(xs, "SUM"))
    found.report()


@case
def validation_before_communication(comm):
    """The last rank alone makes each bad call on Gloo: each must raise at once,
    with no other process taking part; then everyone communicates as usual."""
    found = Findings()
    comm.Barrier(backend=GLOO)             # the Gloo sub-communicator exists
    if comm.rank == comm.size - 1:
        for what, call in bad_calls(comm):
            with found.check(what):
                assert raised(lambda: call(GLOO)) is not None, "not raised"
    xs = operands(comm.size, N, torch.uint64, "MAX")
    recv = sentinel(N, torch.uint64)
    with found.check("Allreduce after the errors"):
        comm.Allreduce(xs[comm.rank], recv, mcr.MAX, backend=GLOO)
        expect(recv, reduce_expected(xs, "MAX"))
    found.report()


@contextlib.contextmanager
def raises_type_error(arg):
    try:
        yield
    except TypeError as exc:
        assert str(exc).startswith(f"{arg}:"), f"error does not name {arg!r}: {exc}"
    else:
        raise AssertionError("TypeError not raised")


@case
def gloo_rejects_derived_datatypes_and_user_ops(comm):
    right, left = ring(comm)
    found = Findings()
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    one = MPI.DOUBLE.Create_contiguous(1).Commit()       # derived, the size of a double
    strided = MPI.FLOAT.Create_vector(2, 1, 2).Commit()
    user_op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    x, y = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    f = torch.zeros(4 * comm.size)
    g = torch.zeros(4 * comm.size, dtype=torch.float64)
    ld = np.ones(3, dtype=np.longdouble)
    lds = np.ones(comm.size, dtype=np.longdouble)
    calls = [
        ("buf", lambda: comm.Bcast([x, pair], 0, backend=GLOO)),
        ("buf", lambda: comm.Ibcast([f[:3], 1, strided], 0, backend=GLOO)),
        ("buf", lambda: comm.Bcast_init([x, one], 0, backend=GLOO)),
        ("buf", lambda: comm.Send([x, 1, pair], right, 0, backend=GLOO)),
        ("buf", lambda: comm.Irecv([x, pair], left, 0, backend=GLOO)),
        ("sendbuf", lambda: comm.Allgather([x, one], g, backend=GLOO)),
        ("recvbuf", lambda: comm.Allgather(x, [g, one], backend=GLOO)),
        ("recvbuf", lambda: comm.Allreduce(mcr.IN_PLACE, [x, pair], backend=GLOO)),
        ("op", lambda: comm.Allreduce(x, y, user_op, backend=GLOO)),
        ("op", lambda: comm.Ireduce(x, y, user_op, 0, backend=GLOO)),
        ("op", lambda: comm.Scan_init(x, y, user_op, backend=GLOO)),
        ("op", lambda: comm.Reduce_scatter_block(f, torch.zeros(4), user_op, backend=GLOO)),
        # long double: torch has no such type, so only MPI reduces it
        ("sendbuf", lambda: comm.Allreduce(ld, ld.copy(), backend=GLOO)),
        ("sendbuf", lambda: comm.Ireduce(ld, ld.copy(), mcr.MAX, 0, backend=GLOO)),
        ("sendbuf", lambda: comm.Scan(ld, ld.copy(), backend=GLOO)),
        ("recvbuf", lambda: comm.Exscan(mcr.IN_PLACE, ld.copy(), backend=GLOO)),
        ("recvbuf", lambda: comm.Reduce_scatter_block(mcr.IN_PLACE, lds, backend=GLOO)),
        ("sendbuf", lambda: comm.Reduce_scatter(lds, ld[:1].copy(), [1] * comm.size,
                                                backend=GLOO)),
    ]
    for i, (arg, call) in enumerate(calls):
        with found.check(f"call {i} ({arg})"), raises_type_error(arg):
            call()
    for datatype in (pair, one, strided):
        datatype.Free()
    user_op.Free()
    with found.check("the communicator works after the errors"):
        xs = operands(comm.size, N, torch.float64, "PROD")
        recv = sentinel(N, torch.float64)
        comm.Allreduce(xs[comm.rank], recv, mcr.PROD, backend=GLOO)
        expect(recv, reduce_expected(xs, "PROD"))
    with found.check("long double moves on Gloo, and reduces on MPI"):
        got = np.zeros(3 * comm.size, dtype=np.longdouble)
        comm.Allgather(ld * (comm.rank + 1), got, backend=GLOO)
        assert (got == np.repeat(np.arange(1, comm.size + 1), 3).astype(np.longdouble)).all()
        total = np.zeros(3, dtype=np.longdouble)
        comm.Allreduce(ld, total, backend="mpi")
        assert (total == comm.size).all(), total
    found.report()


@case
def bad_first_call_on_a_new_communicator_raises_alone(comm):
    """The first Gloo call on a communicator creates its Gloo group (collective).
    A bad call must raise before that, on the one rank that makes it.

    Rank 0 makes the bad call in a thread while the others wait 4 s; if it has
    not raised within 2 s it is blocked waiting for them. Either way, the others
    then make a valid Gloo call, which completes the group if rank 0 blocked,
    and rank 0 joins in once its thread is done, so that no rank hangs.
    """
    if comm.size == 1:
        return
    fresh = comm.Dup()
    found = Findings()
    if comm.rank == 0:
        outcome = []
        thread = threading.Thread(target=lambda: outcome.append(raised(
            lambda: fresh.Bcast(torch.zeros(3), fresh.size, backend=GLOO))), daemon=True)
        thread.start()
        thread.join(2.0)
        with found.check("Bcast with root = size, alone on a new communicator"):
            assert not thread.is_alive(), (
                "blocked: the Gloo group was created before the arguments were checked")
        thread.join()
        with found.check("Bcast with root = size raises IndexError"):
            assert isinstance(outcome[0], IndexError), outcome
    else:
        time.sleep(4.0)
    with found.check("Barrier on the new communicator"):
        fresh.Barrier(backend=GLOO)
    fresh.Free()
    found.report()


test_mpi = mpi_cases(__name__)


# -- the store across nodes: MCR_STORE_HOST ------------------------------------------------

STORE_AT_ADDRESS = """
import torch
import mcr
from mcr.backends.store import rendezvous
comm = mcr.COMM_WORLD
store = rendezvous(comm)
store.set(f"rank{comm.rank}", str(comm.rank))
assert [store.get(f"rank{r}").decode() for r in range(comm.size)] == ["0", "1"]
print(f"rank {comm.rank} store at {store.host}:{store.port}")
x = torch.full((3,), float(comm.rank + 1))
comm.Allreduce(mcr.IN_PLACE, x, backend="gloo")
print(f"rank {comm.rank} gloo sum {x.tolist()}")
comm.Barrier()
"""


def non_loopback_address():
    """An IPv4 address of this machine other than 127.x, or None."""
    try:
        names = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
        found = [info[4][0] for info in names]
    except OSError:
        found = []
    try:
        found += subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                                timeout=10).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return next((a for a in found if "." in a and not a.startswith("127.")), None)


def test_store_at_mcr_store_host():
    """With MCR_STORE_HOST set to a non-loopback address (as across nodes), the
    ranks meet at that address and Gloo runs over it."""
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no IPv4 address but loopback")
    env = dict(mpi_env(), MCR_STORE_HOST=address, MCR_BACKEND_TIMEOUT="60")
    result = launch.run(2, [sys.executable, "-c", STORE_AT_ADDRESS], timeout=120, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0, result.stdout
    for rank in (0, 1):
        assert f"rank {rank} store at {address}:" in result.stdout, result.stdout
        assert f"rank {rank} gloo sum [3.0, 3.0, 3.0]" in result.stdout, result.stdout
