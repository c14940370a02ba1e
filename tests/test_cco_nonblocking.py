"""Nonblocking collectives: every I-variant, checked against torch/numpy on the
whole data, with many requests outstanding at once and completed with
Request.Waitall, by polling Request.Testall or Test, and by Wait in orders that
differ between ranks (all operations are posted, in the same order on every
rank, before any is waited on, so any completion order is deadlock-free).
"""

import gc
import random

import numpy as np
import torch

import mcr
from ccoref import (OP_NAMES, layout, np_operand, np_reduce_ref, operands, place,
                    reduce_ref, reduction_cases, roots, sentinel)
from mpiharness import case, mpi_cases
from util import all_data, assert_equal, rank_data

N = 4
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8,
          torch.complex128, torch.bool]


def counts_for(size, shift):
    return [(i + shift) % 3 for i in range(size)]


def post_all(comm, dtype, seed, in_place=False):
    """Post one of every nonblocking collective on `dtype`, in the same order on
    every rank. Return [(name, request, check)]: check() asserts the result."""
    size, rank = comm.size, comm.rank
    root = (seed + size - 1) % size
    posted = []

    def post(name, request, check=None):
        assert isinstance(request, mcr.Request), (name, type(request))
        posted.append((name, request, check or (lambda: None)))

    # reductions do not apply to every type: pick an op that does
    op = "SUM" if dtype.is_complex or dtype.is_floating_point else "BXOR"
    if dtype == torch.bool:
        op = "LXOR"
    elif dtype == torch.int64:
        op = "MAX"

    post("Ibarrier", comm.Ibarrier())

    # Ibcast
    expected_bcast = rank_data(root, N, dtype, seed)
    buf = expected_bcast.clone() if rank == root else sentinel(N, dtype)
    post("Ibcast", comm.Ibcast(buf, root=root),
         lambda buf=buf: assert_equal(buf, expected_bcast))

    # Igather / Iscatter
    data = all_data(size, N, dtype, seed + 1)
    if in_place and rank == root:
        gbuf = sentinel(size * N, dtype)
        gbuf[root * N:(root + 1) * N] = data[root]
        post("Igather", comm.Igather(mcr.IN_PLACE, gbuf, root=root),
             lambda: assert_equal(gbuf, torch.cat(data)))
    else:
        gbuf = sentinel(size * N, dtype) if rank == root else None
        post("Igather", comm.Igather(data[rank], gbuf, root=root),
             (lambda: assert_equal(gbuf, torch.cat(data))) if rank == root else None)
    whole = torch.cat(data)
    if in_place and rank == root:
        post("Iscatter", comm.Iscatter(whole, mcr.IN_PLACE, root=root),
             lambda: assert_equal(whole, torch.cat(data)))
    else:
        sbuf = sentinel(N, dtype)
        post("Iscatter", comm.Iscatter(whole if rank == root else None, sbuf, root=root),
             lambda: assert_equal(sbuf, data[rank]))

    # Igatherv / Iscatterv: uneven with zeros, blocks in reverse order with gaps
    counts = counts_for(size, seed)
    displs, length = layout(counts, "reversed")
    vdata = all_data(size, 2, dtype, seed + 2)
    blocks = [d[:c] for d, c in zip(vdata, counts)]
    vexpected = place(sentinel(length, dtype), blocks, displs)
    if in_place and rank == root:
        gvbuf = place(sentinel(length, dtype), [blocks[root]], [displs[root]])
        post("Igatherv", comm.Igatherv(mcr.IN_PLACE, [gvbuf, counts, displs], root=root),
             lambda: assert_equal(gvbuf, vexpected))
    else:
        gvbuf = sentinel(length, dtype)
        post("Igatherv", comm.Igatherv(blocks[rank], [gvbuf, (counts, displs)]
                                       if rank == root else None, root=root),
             (lambda: assert_equal(gvbuf, vexpected)) if rank == root else None)
    svsrc = vexpected.clone()
    if in_place and rank == root:
        post("Iscatterv", comm.Iscatterv([svsrc, counts, displs], mcr.IN_PLACE, root=root),
             lambda: assert_equal(svsrc, vexpected))
    else:
        svbuf = sentinel(counts[rank], dtype)
        post("Iscatterv", comm.Iscatterv([svsrc, torch.tensor(counts), np.array(displs)]
                                         if rank == root else None, svbuf, root=root),
             lambda: assert_equal(svbuf, blocks[rank]))

    # Iallgather / Iallgatherv
    agbuf = sentinel(size * N, dtype)
    if in_place:
        agbuf[rank * N:(rank + 1) * N] = data[rank]
        post("Iallgather", comm.Iallgather(mcr.IN_PLACE, agbuf),
             lambda: assert_equal(agbuf, torch.cat(data)))
    else:
        post("Iallgather", comm.Iallgather(data[rank], agbuf),
             lambda: assert_equal(agbuf, torch.cat(data)))
    gdispls, glength = layout(counts, "gaps")
    agvbuf = sentinel(glength, dtype)
    gexpected = place(sentinel(glength, dtype), blocks, gdispls)
    if in_place:
        agvbuf[gdispls[rank]:gdispls[rank] + counts[rank]] = blocks[rank]
        post("Iallgatherv", comm.Iallgatherv(mcr.IN_PLACE, [agvbuf, counts, gdispls]),
             lambda: assert_equal(agvbuf, gexpected))
    else:
        post("Iallgatherv", comm.Iallgatherv(blocks[rank], [agvbuf, tuple(counts),
                                                            tuple(gdispls)]),
             lambda: assert_equal(agvbuf, gexpected))

    # Ialltoall / Ialltoallv
    def a2a_send(i):
        return torch.cat([rank_data(i * size + j, 2, dtype, seed + 3) for j in range(size)])
    a2a_expected = torch.cat([a2a_send(j)[2 * rank:2 * rank + 2] for j in range(size)])
    if in_place:
        a2abuf = a2a_send(rank)
        post("Ialltoall", comm.Ialltoall(mcr.IN_PLACE, a2abuf),
             lambda: assert_equal(a2abuf, a2a_expected))
    else:
        a2abuf = sentinel(2 * size, dtype)
        post("Ialltoall", comm.Ialltoall(a2a_send(rank), a2abuf),
             lambda: assert_equal(a2abuf, a2a_expected))

    def v_side(i, kind, count):
        cs = [count(i, j) for j in range(size)]
        ds, n = layout(cs, kind)
        bl = [rank_data(i * size + j, 2, dtype, seed + 4)[:c] for j, c in enumerate(cs)]
        return place(sentinel(n, dtype), bl, ds), cs, ds, bl

    if in_place:
        def count(i, j):
            return (i + j + seed) % 3                       # symmetric
        a2avbuf, cs, ds, _ = v_side(rank, "gaps", count)
        incoming = [v_side(j, "gaps", count)[3][rank] for j in range(size)]
        a2avexpected = place(sentinel(len(a2avbuf), dtype), incoming, ds)
        post("Ialltoallv", comm.Ialltoallv(mcr.IN_PLACE, [a2avbuf, cs, ds]),
             lambda: assert_equal(a2avbuf, a2avexpected))
    else:
        def count(i, j):
            return (2 * i + j + seed) % 3
        send, scs, sds, _ = v_side(rank, "reversed", count)
        rcs = [count(j, rank) for j in range(size)]
        rds, rn = layout(rcs, "gaps")
        incoming = [v_side(j, "reversed", count)[3][rank] for j in range(size)]
        a2avbuf = sentinel(rn, dtype)
        a2avexpected = place(sentinel(rn, dtype), incoming, rds)
        post("Ialltoallv", comm.Ialltoallv([send, scs, sds], [a2avbuf, (rcs, rds)]),
             lambda: assert_equal(a2avbuf, a2avexpected))

    # reductions
    mop = OP_NAMES[op]
    rdata = operands(size, N, dtype, op, seed + 5)
    rexpected = reduce_ref(rdata, op)
    if in_place and rank == root:
        rbuf = rdata[rank].clone()
        post("Ireduce", comm.Ireduce(mcr.IN_PLACE, rbuf, mop, root),
             lambda: assert_equal(rbuf, rexpected))
    else:
        rbuf = sentinel(N, dtype) if rank == root else None
        post("Ireduce", comm.Ireduce(rdata[rank], rbuf, op=mop, root=root),
             (lambda: assert_equal(rbuf, rexpected)) if rank == root else None)
    arbuf = rdata[rank].clone() if in_place else sentinel(N, dtype)
    post("Iallreduce", comm.Iallreduce(mcr.IN_PLACE if in_place else rdata[rank], arbuf,
                                       op=mop),
         lambda: assert_equal(arbuf, rexpected))

    bdata = operands(size, 2 * size, dtype, op, seed + 6)
    bexpected = reduce_ref(bdata, op)[2 * rank:2 * rank + 2]
    rsbbuf = bdata[rank].clone() if in_place else sentinel(2, dtype)
    post("Ireduce_scatter_block",
         comm.Ireduce_scatter_block(mcr.IN_PLACE if in_place else bdata[rank], rsbbuf,
                                    op=mop),
         lambda: assert_equal(rsbbuf[:2], bexpected))

    start, total = sum(counts[:rank]), sum(counts)
    sdata = operands(size, total, dtype, op, seed + 7)
    sexpected = reduce_ref(sdata, op)[start:start + counts[rank]]
    rsbuf = sdata[rank].clone() if in_place else sentinel(counts[rank], dtype)
    post("Ireduce_scatter",
         comm.Ireduce_scatter(mcr.IN_PLACE if in_place else sdata[rank], rsbuf, counts,
                              op=mop),
         lambda: assert_equal(rsbuf[:counts[rank]], sexpected))

    scbuf = rdata[rank].clone() if in_place else sentinel(N, dtype)
    post("Iscan", comm.Iscan(mcr.IN_PLACE if in_place else rdata[rank], scbuf, op=mop),
         lambda: assert_equal(scbuf, reduce_ref(rdata[:rank + 1], op)))
    exbuf = rdata[rank].clone() if in_place else sentinel(N, dtype)
    post("Iexscan", comm.Iexscan(mcr.IN_PLACE if in_place else rdata[rank], exbuf, op=mop),
         (lambda: assert_equal(exbuf, reduce_ref(rdata[:rank], op))) if rank > 0 else None)
    return posted


def check_all(posted, context):
    for name, request, check in posted:
        try:
            check()
        except AssertionError as exc:
            raise AssertionError(f"{name} ({context}): {exc}") from None


@case.quick
def every_operation_with_waitall(comm):
    for seed, dtype in enumerate(DTYPES):
        for in_place in (False, True):
            posted = post_all(comm, dtype, seed, in_place)
            assert len(posted) == 16
            statuses = []
            assert mcr.Request.Waitall([r for _, r, _ in posted], statuses) is True
            assert len(statuses) == len(posted)
            check_all(posted, f"{dtype}, in_place={in_place}, Waitall")


@case
def every_operation_polled_with_testall(comm):
    for seed, dtype in enumerate(DTYPES[:4]):
        for in_place in (False, True):
            posted = post_all(comm, dtype, seed, in_place)
            requests = [r for _, r, _ in posted]
            polls = 0
            while not mcr.Request.Testall(requests):
                polls += 1
                assert polls < 10_000_000, "Testall never reported completion"
            # once complete, Testall stays true and Waitall returns at once
            assert mcr.Request.Testall(requests)
            mcr.Request.Waitall(requests)
            check_all(posted, f"{dtype}, in_place={in_place}, Testall")


@case
def every_operation_waited_in_reverse_order(comm):
    for seed, dtype in enumerate(DTYPES):
        posted = post_all(comm, dtype, seed, in_place=seed % 2 == 1)
        for name, request, check in reversed(posted):
            request.Wait()
            check()


@case
def every_operation_waited_in_rank_dependent_order(comm):
    """Each rank waits in its own random order, or rotated by its rank, or
    polls its requests one by one with Test."""
    for seed, dtype in enumerate(DTYPES):
        for mode in ("shuffle", "rotate", "test"):
            posted = post_all(comm, dtype, seed, in_place=mode == "rotate")
            order = list(range(len(posted)))
            if mode == "shuffle":
                random.Random(1000 * seed + comm.rank).shuffle(order)
            elif mode == "rotate":
                shift = comm.rank * 5 % len(order)
                order = order[shift:] + order[:shift]
            if mode == "test":
                pending = order[::-1] if comm.rank % 2 else order
                while pending:
                    pending = [i for i in pending if not posted[i][1].Test()]
            else:
                for i in order:
                    posted[i][1].Wait()
            check_all(posted, f"{dtype}, {mode} (rank {comm.rank})")


@case
def reductions_every_op_and_dtype(comm):
    """Ireduce, Iallreduce, Ireduce_scatter_block, Ireduce_scatter, Iscan and
    Iexscan for every op on every type it applies to, a type's worth of
    requests outstanding at once, completed with one Waitall."""
    size, rank = comm.size, comm.rank
    counts = counts_for(size, 1)
    start, total = sum(counts[:rank]), sum(counts)
    by_dtype = {}
    for dtype, op in reduction_cases():
        by_dtype.setdefault(dtype, []).append(op)
    for seed, (dtype, ops) in enumerate(by_dtype.items()):
        posted = []
        for k, op in enumerate(ops):
            mop = OP_NAMES[op]
            data = operands(size, 2 * size, dtype, op, seed * 16 + k)
            expected = reduce_ref(data, op)
            root = k % size
            out = sentinel(2 * size, dtype) if rank == root else None
            posted.append(("Ireduce", comm.Ireduce(data[rank], out, mop, root),
                           out, expected if rank == root else None))
            out = sentinel(2 * size, dtype)
            posted.append(("Iallreduce", comm.Iallreduce(data[rank], out, mop), out,
                           expected))
            out = data[rank].clone()
            posted.append(("Ireduce_scatter_block IN_PLACE",
                           comm.Ireduce_scatter_block(mcr.IN_PLACE, out, mop), out[:2],
                           expected[2 * rank:2 * rank + 2]))
            vdata = operands(size, total, dtype, op, seed * 16 + k + 8)
            out = sentinel(counts[rank], dtype)
            posted.append(("Ireduce_scatter", comm.Ireduce_scatter(vdata[rank], out, counts,
                                                                   mop),
                           out, reduce_ref(vdata, op)[start:start + counts[rank]]))
            out = sentinel(2 * size, dtype)
            posted.append(("Iscan", comm.Iscan(data[rank], out, mop), out,
                           reduce_ref(data[:rank + 1], op)))
            out = data[rank].clone()
            posted.append(("Iexscan IN_PLACE", comm.Iexscan(mcr.IN_PLACE, out, mop), out,
                           reduce_ref(data[:rank], op) if rank > 0 else None))
        mcr.Request.Waitall([request for _, request, _, _ in posted])
        for i, (name, _, out, expected) in enumerate(posted):
            if expected is not None:
                assert torch.equal(out, expected), (f"{name} {ops[i // 6]} on {dtype}:\n"
                                                    f"actual: {out}\nexpected: {expected}")


@case
def same_operation_many_times_outstanding(comm):
    """Many requests of one kind at once, on distinct buffers, in a rank-dependent
    completion order."""
    size, rank = comm.size, comm.rank
    requests, checks = [], []
    for k in range(12):
        dtype = DTYPES[k % 4]
        data = operands(size, k + 1, dtype, "SUM", k)
        out = sentinel(k + 1, dtype)
        requests.append(comm.Iallreduce(data[rank], out))
        checks.append((out, reduce_ref(data, "SUM")))
        root = k % size
        buf = rank_data(root, k, dtype, k) if rank == root else sentinel(k, dtype)
        requests.append(comm.Ibcast(buf, root=root))
        checks.append((buf, rank_data(root, k, dtype, k)))
    order = list(range(len(requests)))
    random.Random(rank).shuffle(order)
    for i in order[: len(order) // 2]:
        requests[i].Wait()
    mcr.Request.Waitall(requests)          # the rest; completed ones are null now
    for out, expected in checks:
        assert_equal(out, expected)


@case
def requests_keep_buffers_alive(comm):
    """The send buffers of a nonblocking call may be dropped by the caller: the
    Request keeps them alive until completion."""
    size, rank = comm.size, comm.rank
    outs, requests = [], []
    for k in range(4):
        out = torch.zeros(1000 * size)
        requests.append(comm.Iallgather(torch.full((1000,), float(rank + k)), out))
        outs.append(out)
        red = torch.zeros(1000)
        requests.append(comm.Iallreduce(torch.full((1000,), float(rank * k)), red))
        outs.append(red)
    gc.collect()
    # churn the allocator so that freed memory would be reused
    junk = [torch.full((1000,), -1.0) for _ in range(50)]
    mcr.Request.Waitall(requests)
    del junk
    for k in range(4):
        assert_equal(outs[2 * k], torch.cat([torch.full((1000,), float(r + k))
                                             for r in range(size)]))
        assert_equal(outs[2 * k + 1], torch.full((1000,), float(k * sum(range(size)))))


@case
def completed_requests_are_null(comm):
    req = comm.Ibarrier()
    assert req.Wait() is True
    assert not req                        # MPI_REQUEST_NULL after completion
    assert req.Test() is True             # a null request tests complete
    buf = torch.arange(3.0) if comm.rank == 0 else torch.zeros(3)
    req = comm.Ibcast(buf)
    while not req.Test():
        pass
    assert not req
    assert_equal(buf, torch.arange(3.0))
    assert mcr.Request.Waitall([]) is True
    assert mcr.Request.Testall([]) is True


@case
def nonblocking_numpy(comm):
    size, rank = comm.size, comm.rank
    for root in roots(size):
        for seed, (dtype, op) in enumerate([(np.float32, "SUM"), (np.float16, "MAX"),
                                            (np.int32, "BOR"), (np.bool_, "LAND"),
                                            (np.complex128, "PROD")]):
            data = [np_operand(r, N, dtype, op, seed) for r in range(size)]
            expected = np_reduce_ref(data, op)
            posted = []
            bbuf = data[root].copy() if rank == root else np.zeros(N, dtype)
            posted.append((comm.Ibcast(bbuf, root), bbuf, data[root]))
            rbuf = np.zeros(N, dtype)
            posted.append((comm.Iallreduce(data[rank], rbuf, OP_NAMES[op]), rbuf, expected))
            gbuf = np.zeros(N * size, dtype)
            posted.append((comm.Iallgather(data[rank], gbuf), gbuf, np.concatenate(data)))
            if rank == root:
                red = np.zeros(N, dtype)
                posted.append((comm.Ireduce(data[rank], red, OP_NAMES[op], root), red,
                               expected))
            else:
                posted.append((comm.Ireduce(data[rank], None, OP_NAMES[op], root), None,
                               None))
            scan = data[rank].copy()
            posted.append((comm.Iscan(mcr.IN_PLACE, scan, OP_NAMES[op]), scan,
                           np_reduce_ref(data[:rank + 1], op)))
            counts = counts_for(size, seed)
            displs, length = layout(counts, "gaps")
            blocks = [d[:c] for d, c in zip(data, counts)]
            vbuf = np.zeros(length, dtype)
            posted.append((comm.Iallgatherv(blocks[rank], [vbuf, np.array(counts),
                                                           np.array(displs)]),
                           vbuf, place(np.zeros(length, dtype), blocks, displs)))
            for request, _, _ in reversed(posted):
                request.Wait()
            for request, out, want in posted:
                if out is not None:
                    np.testing.assert_array_equal(out, want)


# keep this case last: while the bug above stands, it kills the job


@case
def ialltoall_in_place(comm):
    size, rank = comm.size, comm.rank
    for seed, dtype in enumerate(DTYPES):
        def send(i):
            return torch.cat([rank_data(i * size + j, 2, dtype, seed) for j in range(size)])
        buf = send(rank)
        request = comm.Ialltoall(mcr.IN_PLACE, buf)
        request.Wait()
        assert_equal(buf, torch.cat([send(j)[2 * rank:2 * rank + 2] for j in range(size)]))


test_mpi = mpi_cases(__name__)
