"""Persistent requests: Send_init, Recv_init and every collective as <name>_init.

Each persistent request is made once, then started three times; before each
start the send buffers get new contents *in place* (the very objects the
request was made with) and the receive buffers are reset to a sentinel, and
after completion the receive buffers are checked against torch/numpy on the
whole data of that iteration. Completion varies between Wait, Request.Waitall,
polling Test and polling Request.Testall.

Every collective runs in both modes: MPI-4 native persistent collectives and
the emulation that posts the non-blocking form at each Start (the private
switch mcr._core._set_persistent_emulation, restored after each use).

A wrong result is recorded, not raised, so that every rank keeps making the
same calls in the same order; the case fails at its end with all of them.
"""

import contextlib
import gc

import numpy as np
import torch
from mpi4py import MPI as _mpi4py

import mcr
from mcr import MPI, _core
from ccoref import OP_NAMES, layout, operands, place, reduce_ref, roots, sentinel
from mpiharness import case, mpi_cases
from util import all_data, assert_comm_works, assert_equal, raises, rank_data

N = 4
ITERATIONS = 3
MODES = (False, True)                 # emulated?
MOVE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool]
# (dtype, op): every reduction exact on the small-integer operands of ccoref
REDUCTIONS = [(torch.float32, "SUM"), (torch.float16, "SUM"), (torch.bfloat16, "SUM"),
              (torch.float64, "PROD"), (torch.int32, "MIN"), (torch.int64, "MAX"),
              (torch.uint8, "BXOR"), (torch.bool, "LOR"), (torch.complex64, "SUM")]
COMPLETIONS = ("wait", "waitall", "test", "testall")


@contextlib.contextmanager
def emulation(on):
    """Make *_init collectives native (False) or emulated (True) inside the block."""
    previous = _core._set_persistent_emulation(on)
    try:
        assert _core._set_persistent_emulation(on) == on
        yield
    finally:
        _core._set_persistent_emulation(previous)


def mode_name(emulated):
    return "emulated" if emulated else "native"


def complete(requests, how, statuses=None):
    """Complete `requests` (a list) by `how`; statuses, if a list, gets one each."""
    if how == "wait":
        for i, req in enumerate(requests):
            st = statuses[i] if statuses is not None else None
            assert req.Wait(st) is True
    elif how == "waitall":
        assert mcr.Request.Waitall(requests, statuses) is True
    elif how == "test":
        for i, req in enumerate(requests):
            st = statuses[i] if statuses is not None else None
            polls = 0
            while not req.Test(st):
                polls += 1
                assert polls < 10_000_000, "Test never reported completion"
    elif how == "testall":
        polls = 0
        while not mcr.Request.Testall(requests, statuses):
            polls += 1
            assert polls < 10_000_000, "Testall never reported completion"
    else:
        raise ValueError(how)


class Runner:
    """Runs persistent requests for ITERATIONS starts; collects wrong results."""

    def __init__(self, comm):
        self.comm = comm
        self.failures = []
        self.runs = 0

    def run(self, label, built):
        """`built` is (request, fill, check): fill(it) writes iteration it's
        inputs into the send buffers in place and resets the receive buffers;
        check(it) asserts the receive buffers."""
        req, fill, check = built
        assert isinstance(req, mcr.Prequest), (label, type(req))
        shift = self.runs
        self.runs += 1
        for it in range(ITERATIONS):
            fill(it)
            assert req.Start() is None
            how = COMPLETIONS[(it + shift) % len(COMPLETIONS)]
            complete([req], how)
            try:
                check(it)
            except AssertionError as exc:
                self.failures.append(f"{label}, iteration {it}, completed by {how} "
                                     f"(rank {self.comm.rank}): {exc}")
        req.Free()

    def done(self):
        assert not self.failures, "\n".join(self.failures)


def rooted_variants(size):
    return [(root, in_place) for root in roots(size) for in_place in (False, True)]


def counts_for(size, shift):
    """Uneven counts with zeros: 0, 1, 2, 0, ... rotated by `shift`."""
    return [(i + shift) % 3 for i in range(size)]


# -- builders: (request, fill, check) for one persistent operation -------------------


def build_bcast(comm, dtype, root, seed, info=None):
    rank = comm.rank
    buf = sentinel(N, dtype)

    def fill(it):
        buf.copy_(rank_data(root, N, dtype, seed + it) if rank == root else sentinel(N, dtype))

    def check(it):
        assert_equal(buf, rank_data(root, N, dtype, seed + it))

    return comm.Bcast_init(buf, root, info), fill, check


def build_gather(comm, dtype, root, in_place, seed):
    size, rank = comm.size, comm.rank
    at_root = rank == root
    send = sentinel(N, dtype)
    out = sentinel(size * N, dtype) if at_root else None

    def fill(it):
        data = all_data(size, N, dtype, seed + it)
        send.copy_(data[rank])
        if at_root:
            out.copy_(sentinel(size * N, dtype))
            if in_place:
                out[root * N:(root + 1) * N] = data[root]

    def check(it):
        if at_root:
            assert_equal(out, torch.cat(all_data(size, N, dtype, seed + it)))

    sendbuf = mcr.IN_PLACE if in_place and at_root else send
    return comm.Gather_init(sendbuf, out, root), fill, check


def build_gatherv(comm, dtype, root, in_place, seed):
    size, rank = comm.size, comm.rank
    at_root = rank == root
    counts = counts_for(size, seed)
    displs, length = layout(counts, "reversed")
    send = sentinel(counts[rank], dtype)
    out = sentinel(length, dtype) if at_root else None

    def blocks(it):
        return [d[:c] for d, c in zip(all_data(size, 2, dtype, seed + it), counts)]

    def fill(it):
        b = blocks(it)
        send.copy_(b[rank])
        if at_root:
            out.copy_(sentinel(length, dtype))
            if in_place:
                out[displs[root]:displs[root] + counts[root]] = b[root]

    def check(it):
        if at_root:
            assert_equal(out, place(sentinel(length, dtype), blocks(it), displs))

    sendbuf = mcr.IN_PLACE if in_place and at_root else send
    recvbuf = ([out, (counts, displs)] if seed % 2 else [out, torch.tensor(counts), displs]) \
        if at_root else None
    return comm.Gatherv_init(sendbuf, recvbuf, root), fill, check


def build_scatter(comm, dtype, root, in_place, seed):
    size, rank = comm.size, comm.rank
    at_root = rank == root
    whole = sentinel(size * N, dtype) if at_root else None
    recv = sentinel(N, dtype)

    def fill(it):
        if at_root:
            whole.copy_(torch.cat(all_data(size, N, dtype, seed + it)))
        recv.copy_(sentinel(N, dtype))

    def check(it):
        data = all_data(size, N, dtype, seed + it)
        if in_place and at_root:
            assert_equal(whole, torch.cat(data))          # untouched
            assert_equal(recv, sentinel(N, dtype))        # never written
        else:
            assert_equal(recv, data[rank])

    recvbuf = mcr.IN_PLACE if in_place and at_root else recv
    return comm.Scatter_init(whole, recvbuf, root), fill, check


def build_scatterv(comm, dtype, root, in_place, seed):
    size, rank = comm.size, comm.rank
    at_root = rank == root
    counts = counts_for(size, seed + 1)
    displs, length = layout(counts, "gaps")
    src = sentinel(length, dtype) if at_root else None
    recv = sentinel(counts[rank], dtype)

    def blocks(it):
        return [d[:c] for d, c in zip(all_data(size, 2, dtype, seed + it), counts)]

    def fill(it):
        if at_root:
            src.copy_(place(sentinel(length, dtype), blocks(it), displs))
        recv.copy_(sentinel(counts[rank], dtype))

    def check(it):
        if in_place and at_root:
            assert_equal(src, place(sentinel(length, dtype), blocks(it), displs))
        else:
            assert_equal(recv, blocks(it)[rank])

    sendbuf = [src, counts, np.array(displs)] if at_root else None
    recvbuf = mcr.IN_PLACE if in_place and at_root else recv
    return comm.Scatterv_init(sendbuf, recvbuf, root), fill, check


def build_allgather(comm, dtype, in_place, seed):
    size, rank = comm.size, comm.rank
    send = sentinel(N, dtype)
    out = sentinel(size * N, dtype)

    def fill(it):
        data = all_data(size, N, dtype, seed + it)
        send.copy_(data[rank])
        out.copy_(sentinel(size * N, dtype))
        if in_place:
            out[rank * N:(rank + 1) * N] = data[rank]

    def check(it):
        assert_equal(out, torch.cat(all_data(size, N, dtype, seed + it)))

    return comm.Allgather_init(mcr.IN_PLACE if in_place else send, out), fill, check


def build_allgatherv(comm, dtype, in_place, seed):
    size, rank = comm.size, comm.rank
    counts = counts_for(size, seed)
    displs, length = layout(counts, "gaps")
    send = sentinel(counts[rank], dtype)
    out = sentinel(length, dtype)

    def blocks(it):
        return [d[:c] for d, c in zip(all_data(size, 2, dtype, seed + it), counts)]

    def fill(it):
        b = blocks(it)
        send.copy_(b[rank])
        out.copy_(sentinel(length, dtype))
        if in_place:
            out[displs[rank]:displs[rank] + counts[rank]] = b[rank]

    def check(it):
        assert_equal(out, place(sentinel(length, dtype), blocks(it), displs))

    return (comm.Allgatherv_init(mcr.IN_PLACE if in_place else send,
                                 [out, tuple(counts), tuple(displs)]), fill, check)


def a2a_row(i, size, dtype, seed):
    """What rank i sends in Alltoall: 2 elements for each rank."""
    return torch.cat([rank_data(i * size + j, 2, dtype, seed) for j in range(size)])


def build_alltoall(comm, dtype, in_place, seed):
    size, rank = comm.size, comm.rank
    send = sentinel(2 * size, dtype)
    out = sentinel(2 * size, dtype)

    def fill(it):
        row = a2a_row(rank, size, dtype, seed + it)
        send.copy_(row)
        out.copy_(row if in_place else sentinel(2 * size, dtype))

    def check(it):
        expected = torch.cat([a2a_row(j, size, dtype, seed + it)[2 * rank:2 * rank + 2]
                              for j in range(size)])
        assert_equal(out, expected)

    return comm.Alltoall_init(mcr.IN_PLACE if in_place else send, out), fill, check


def build_alltoallv(comm, dtype, in_place, seed):
    size, rank = comm.size, comm.rank
    if in_place:
        def count(i, j):
            return (i + j + seed) % 3                       # symmetric, with zeros
        send_kind = recv_kind = "gaps"
    else:
        def count(i, j):
            return (2 * i + j + seed) % 3                   # uneven, with zeros
        send_kind, recv_kind = "reversed", "gaps"

    def send_side(i, it):
        cs = [count(i, j) for j in range(size)]
        ds, n = layout(cs, send_kind)
        bl = [rank_data(i * size + j, 2, dtype, seed + it)[:c] for j, c in enumerate(cs)]
        return place(sentinel(n, dtype), bl, ds), cs, ds, bl

    _, scs, sds, _ = send_side(rank, 0)
    rcs = [count(j, rank) for j in range(size)]
    rds, rn = layout(rcs, recv_kind)
    send = sentinel(len(send_side(rank, 0)[0]), dtype)
    out = sentinel(rn, dtype)

    def fill(it):
        send.copy_(send_side(rank, it)[0])
        out.copy_(send_side(rank, it)[0] if in_place else sentinel(rn, dtype))

    def check(it):
        incoming = [send_side(j, it)[3][rank] for j in range(size)]
        assert_equal(out, place(sentinel(rn, dtype), incoming, rds))

    if in_place:
        return comm.Alltoallv_init(mcr.IN_PLACE, [out, scs, sds]), fill, check
    return (comm.Alltoallv_init([send, scs, sds], [out, (torch.tensor(rcs), rds)]),
            fill, check)


def build_reduce(comm, dtype, op, root, in_place, seed):
    size, rank = comm.size, comm.rank
    at_root = rank == root
    send = sentinel(N, dtype)
    out = sentinel(N, dtype) if at_root else None

    def fill(it):
        data = operands(size, N, dtype, op, seed + it)
        send.copy_(data[rank])
        if at_root:
            out.copy_(data[rank] if in_place else sentinel(N, dtype))

    def check(it):
        if at_root:
            assert_equal(out, reduce_ref(operands(size, N, dtype, op, seed + it), op))

    sendbuf = mcr.IN_PLACE if in_place and at_root else send
    return comm.Reduce_init(sendbuf, out, OP_NAMES[op], root), fill, check


def build_allreduce(comm, dtype, op, in_place, seed, info=None):
    size, rank = comm.size, comm.rank
    send = sentinel(N, dtype)
    out = sentinel(N, dtype)

    def fill(it):
        data = operands(size, N, dtype, op, seed + it)
        send.copy_(data[rank])
        out.copy_(data[rank] if in_place else sentinel(N, dtype))

    def check(it):
        assert_equal(out, reduce_ref(operands(size, N, dtype, op, seed + it), op))

    return (comm.Allreduce_init(mcr.IN_PLACE if in_place else send, out, OP_NAMES[op], info),
            fill, check)


def build_reduce_scatter_block(comm, dtype, op, in_place, seed):
    size, rank = comm.size, comm.rank
    send = sentinel(2 * size, dtype)
    out = sentinel(2 * size if in_place else 2, dtype)

    def fill(it):
        data = operands(size, 2 * size, dtype, op, seed + it)
        send.copy_(data[rank])
        out.copy_(data[rank] if in_place else sentinel(2, dtype))

    def check(it):
        expected = reduce_ref(operands(size, 2 * size, dtype, op, seed + it), op)
        assert_equal(out[:2], expected[2 * rank:2 * rank + 2])

    return (comm.Reduce_scatter_block_init(mcr.IN_PLACE if in_place else send, out,
                                           OP_NAMES[op]), fill, check)


def build_reduce_scatter(comm, dtype, op, in_place, seed):
    size, rank = comm.size, comm.rank
    counts = counts_for(size, seed)
    start, total = sum(counts[:rank]), sum(counts)
    send = sentinel(total, dtype)
    out = sentinel(total if in_place else counts[rank], dtype)

    def fill(it):
        data = operands(size, total, dtype, op, seed + it)
        send.copy_(data[rank])
        out.copy_(data[rank] if in_place else sentinel(counts[rank], dtype))

    def check(it):
        expected = reduce_ref(operands(size, total, dtype, op, seed + it), op)
        assert_equal(out[:counts[rank]], expected[start:start + counts[rank]])

    return (comm.Reduce_scatter_init(mcr.IN_PLACE if in_place else send, out, counts,
                                     OP_NAMES[op]), fill, check)


def build_scan(comm, dtype, op, in_place, seed, exclusive):
    size, rank = comm.size, comm.rank
    send = sentinel(N, dtype)
    out = sentinel(N, dtype)

    def fill(it):
        data = operands(size, N, dtype, op, seed + it)
        send.copy_(data[rank])
        out.copy_(data[rank] if in_place else sentinel(N, dtype))

    def check(it):
        data = operands(size, N, dtype, op, seed + it)
        if exclusive:
            if rank > 0:                  # undefined on rank 0
                assert_equal(out, reduce_ref(data[:rank], op))
        else:
            assert_equal(out, reduce_ref(data[:rank + 1], op))

    init = comm.Exscan_init if exclusive else comm.Scan_init
    return init(mcr.IN_PLACE if in_place else send, out, OP_NAMES[op]), fill, check


# -- every collective, both modes ---------------------------------------------------------


@case
def barrier_init(comm):
    for emulated in MODES:
        with emulation(emulated):
            for how in COMPLETIONS:
                req = comm.Barrier_init()
                assert isinstance(req, mcr.Prequest)
                for _ in range(ITERATIONS):
                    req.Start()
                    complete([req], how)
                req.Free()
    assert_comm_works(comm)


@case
def bcast_init(comm):
    r = Runner(comm)
    info = _mpi4py.Info.Create()
    try:
        for emulated in MODES:
            with emulation(emulated):
                for seed, dtype in enumerate(MOVE_DTYPES + [torch.complex64, torch.uint8]):
                    for root in roots(comm.size):
                        r.run(f"Bcast_init {mode_name(emulated)} {dtype} root {root}",
                              build_bcast(comm, dtype, root, 10 * seed,
                                          info if seed % 2 else None))
    finally:
        info.Free()
    r.done()


@case
def gather_init(comm):
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, dtype in enumerate(MOVE_DTYPES):
                for root, in_place in rooted_variants(comm.size):
                    r.run(f"Gather_init {mode_name(emulated)} {dtype} root {root} "
                          f"in_place={in_place}",
                          build_gather(comm, dtype, root, in_place, 10 * seed))
    r.done()


@case
def gatherv_init(comm):
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, dtype in enumerate(MOVE_DTYPES):
                for root, in_place in rooted_variants(comm.size):
                    r.run(f"Gatherv_init {mode_name(emulated)} {dtype} root {root} "
                          f"in_place={in_place}",
                          build_gatherv(comm, dtype, root, in_place, 10 * seed + root))
    r.done()


@case
def scatter_init(comm):
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, dtype in enumerate(MOVE_DTYPES):
                for root, in_place in rooted_variants(comm.size):
                    r.run(f"Scatter_init {mode_name(emulated)} {dtype} root {root} "
                          f"in_place={in_place}",
                          build_scatter(comm, dtype, root, in_place, 10 * seed))
    r.done()


@case
def scatterv_init(comm):
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, dtype in enumerate(MOVE_DTYPES):
                for root, in_place in rooted_variants(comm.size):
                    r.run(f"Scatterv_init {mode_name(emulated)} {dtype} root {root} "
                          f"in_place={in_place}",
                          build_scatterv(comm, dtype, root, in_place, 10 * seed + root))
    r.done()


def run_in_place_variants(comm, name, build, seed_of):
    """Run `build(comm, dtype, in_place, seed)` in both modes, for every dtype and
    with and without IN_PLACE."""
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, dtype in enumerate(MOVE_DTYPES):
                for in_place in (False, True):
                    r.run(f"{name} {mode_name(emulated)} {dtype} in_place={in_place}",
                          build(comm, dtype, in_place, seed_of(seed, in_place)))
    r.done()


@case
def allgather_init(comm):
    run_in_place_variants(comm, "Allgather_init", build_allgather,
                          lambda seed, in_place: 10 * seed)


@case
def allgatherv_init(comm):
    run_in_place_variants(comm, "Allgatherv_init", build_allgatherv,
                          lambda seed, in_place: 10 * seed + in_place)


@case
def alltoall_init(comm):
    run_in_place_variants(comm, "Alltoall_init", build_alltoall,
                          lambda seed, in_place: 10 * seed)


@case
def alltoallv_init(comm):
    run_in_place_variants(comm, "Alltoallv_init", build_alltoallv,
                          lambda seed, in_place: 10 * seed + in_place)


@case
def reduce_init(comm):
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, (dtype, op) in enumerate(REDUCTIONS):
                for root, in_place in rooted_variants(comm.size):
                    r.run(f"Reduce_init {mode_name(emulated)} {dtype} {op} root {root} "
                          f"in_place={in_place}",
                          build_reduce(comm, dtype, op, root, in_place, 10 * seed))
    r.done()


@case
def allreduce_init(comm):
    r = Runner(comm)
    info = _mpi4py.Info.Create()
    try:
        for emulated in MODES:
            with emulation(emulated):
                for seed, (dtype, op) in enumerate(REDUCTIONS):
                    for in_place in (False, True):
                        r.run(f"Allreduce_init {mode_name(emulated)} {dtype} {op} "
                              f"in_place={in_place}",
                              build_allreduce(comm, dtype, op, in_place, 10 * seed,
                                              info if seed % 3 == 0 else None))
    finally:
        info.Free()
    r.done()


@case
def reduce_scatter_block_init(comm):
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, (dtype, op) in enumerate(REDUCTIONS):
                for in_place in (False, True):
                    r.run(f"Reduce_scatter_block_init {mode_name(emulated)} {dtype} {op} "
                          f"in_place={in_place}",
                          build_reduce_scatter_block(comm, dtype, op, in_place, 10 * seed))
    r.done()


@case
def reduce_scatter_init(comm):
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, (dtype, op) in enumerate(REDUCTIONS):
                for in_place in (False, True):
                    r.run(f"Reduce_scatter_init {mode_name(emulated)} {dtype} {op} "
                          f"in_place={in_place}",
                          build_reduce_scatter(comm, dtype, op, in_place, 10 * seed + in_place))
    r.done()


@case
def scan_init(comm):
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, (dtype, op) in enumerate(REDUCTIONS):
                for in_place in (False, True):
                    r.run(f"Scan_init {mode_name(emulated)} {dtype} {op} in_place={in_place}",
                          build_scan(comm, dtype, op, in_place, 10 * seed, exclusive=False))
    r.done()


@case
def exscan_init(comm):
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, (dtype, op) in enumerate(REDUCTIONS):
                for in_place in (False, True):
                    r.run(f"Exscan_init {mode_name(emulated)} {dtype} {op} in_place={in_place}",
                          build_scan(comm, dtype, op, in_place, 10 * seed, exclusive=True))
    r.done()


@case
def numpy_buffers(comm):
    """Persistent collectives on numpy arrays, contents replaced in place."""
    size, rank = comm.size, comm.rank
    r = Runner(comm)
    for emulated in MODES:
        with emulation(emulated):
            for seed, dtype in enumerate([np.float32, np.float16, np.int64]):
                send = np.zeros(N, dtype)
                out = np.zeros(N, dtype)

                def data(it, dtype=dtype, seed=seed):
                    return [rank_data(i, N, torch.int64, 10 * seed + it).numpy().astype(dtype)
                            for i in range(size)]

                def fill(it, send=send, out=out, data=data):
                    send[:] = data(it)[rank]
                    out[:] = 0

                def check(it, out=out, data=data):
                    np.testing.assert_array_equal(out, np.sum(data(it), axis=0).astype(out.dtype))

                r.run(f"Allreduce_init numpy {mode_name(emulated)} {np.dtype(dtype)}",
                      (comm.Allreduce_init(send, out), fill, check))
                gout = np.zeros(N * size, dtype)

                def gfill(it, send=send, gout=gout, data=data):
                    send[:] = data(it)[rank]
                    gout[:] = 0

                def gcheck(it, gout=gout, data=data):
                    np.testing.assert_array_equal(gout, np.concatenate(data(it)))

                r.run(f"Allgather_init numpy {mode_name(emulated)} {np.dtype(dtype)}",
                      (comm.Allgather_init(send, gout), gfill, gcheck))
    r.done()


# -- point-to-point -----------------------------------------------------------------------


def build_ring(comm, dtype, seed, n=N, tag=5, recv_source=None, recv_tag=None, extra=0):
    """A persistent send to the right and receive from the left, with a receive
    buffer `extra` elements longer than the message. Returns (send, recv, fill,
    check)."""
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    sbuf = sentinel(n, dtype)
    rbuf = sentinel(n + extra, dtype)
    send = comm.Send_init(sbuf, right, tag)
    recv = comm.Recv_init(rbuf, left if recv_source is None else recv_source,
                          tag if recv_tag is None else recv_tag)

    def fill(it):
        sbuf.copy_(rank_data(rank, n, dtype, seed + it))
        rbuf.copy_(sentinel(n + extra, dtype))

    def check(it):
        expected = sentinel(n + extra, dtype)
        expected[:n] = rank_data(left, n, dtype, seed + it)
        assert_equal(rbuf, expected)

    return send, recv, fill, check


@case.quick
def send_init_recv_init(comm):
    """A ring of persistent sends and receives, restarted with new contents,
    on several dtypes, completed every way, in both modes (p2p is always
    native; the switch must not disturb it)."""
    failures = []
    k = 0
    for emulated in MODES:
        with emulation(emulated):
            for seed, dtype in enumerate(MOVE_DTYPES + [torch.complex128, torch.int8]):
                send, recv, fill, check = build_ring(comm, dtype, 10 * seed)
                assert isinstance(send, mcr.Prequest) and isinstance(recv, mcr.Prequest)
                for it in range(ITERATIONS):
                    fill(it)
                    how = COMPLETIONS[k % len(COMPLETIONS)]
                    k += 1
                    if it % 2:
                        mcr.Prequest.Startall([recv, send])
                    else:
                        recv.Start()
                        send.Start()
                    complete([recv, send], how)
                    try:
                        check(it)
                    except AssertionError as exc:
                        failures.append(f"ring {mode_name(emulated)} {dtype} iteration {it} "
                                        f"{how}: {exc}")
                send.Free()
                recv.Free()
    assert not failures, "\n".join(failures)


@case
def send_init_numpy_and_proc_null(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    sbuf = np.zeros(5, np.float64)
    rbuf = np.zeros(5, np.float64)
    send = comm.Send_init(sbuf, right, 3)
    recv = comm.Recv_init(rbuf, left, 3)
    null_send = comm.Send_init(np.zeros(2), mcr.PROC_NULL)
    null_buf = np.full(2, 7.0)
    null_recv = comm.Recv_init(null_buf, mcr.PROC_NULL)
    for it in range(ITERATIONS):
        sbuf[:] = np.arange(5) * (rank + 1) + it
        rbuf[:] = -1
        mcr.Prequest.Startall([recv, send, null_send, null_recv])
        statuses = []
        mcr.Request.Waitall([recv, send, null_send, null_recv], statuses)
        np.testing.assert_array_equal(rbuf, np.arange(5) * (left + 1) + it)
        np.testing.assert_array_equal(null_buf, np.full(2, 7.0))
        assert statuses[3].Get_source() == mcr.PROC_NULL
        assert statuses[3].Get_count() == 0
    for req in (send, recv, null_send, null_recv):
        req.Free()
    assert_comm_works(comm)


@case
def recv_init_status_counts_elements(comm):
    """Status after completing a persistent receive: Get_count() counts elements
    of the receive's type, source and tag are the sender's (ANY_SOURCE/ANY_TAG
    receive), for every way of completing it."""
    size, rank = comm.size, comm.rank
    left = (rank - 1) % size
    failures = []
    for seed, dtype in enumerate([torch.float64, torch.int16, torch.complex64]):
        send, recv, fill, check = build_ring(comm, dtype, 10 * seed, n=3, tag=7 + seed,
                                             recv_source=mcr.ANY_SOURCE,
                                             recv_tag=mcr.ANY_TAG, extra=2)
        for it, how in enumerate(COMPLETIONS):
            fill(it)
            mcr.Prequest.Startall([recv, send])
            statuses = [mcr.Status(), mcr.Status()]
            complete([recv, send], how, statuses)
            st = statuses[0]
            try:
                check(it)
                assert st.Get_source() == left and st.source == left, (st.source, left)
                assert st.Get_tag() == 7 + seed and st.tag == 7 + seed, st.tag
                assert st.Get_count(MPI.BYTE) == 3 * dtype.itemsize, \
                    st.Get_count(MPI.BYTE)
                assert st.Get_count() == 3, (f"Get_count() is {st.Get_count()}, "
                                             f"expected 3 elements of {dtype}")
            except AssertionError as exc:
                failures.append(f"Recv_init {dtype} completed by {how}: {exc}")
        send.Free()
        recv.Free()
    assert not failures, "\n".join(failures)


# -- Startall over several kinds of persistent requests -------------------------------------


def build_mixed(comm, seed, modes):
    """Allreduce_init, Bcast_init, Alltoallv_init, Barrier_init, Scan_init and a
    ring of Send_init/Recv_init, each collective made in the mode that `modes`
    gives it (cycled). Returns (requests, fills, checks)."""
    size = comm.size
    built = []
    makers = [
        lambda: build_allreduce(comm, torch.float32, "SUM", False, seed),
        lambda: build_bcast(comm, torch.bfloat16, size - 1, seed + 1),
        lambda: build_alltoallv(comm, torch.int64, False, seed + 2),
        lambda: build_scan(comm, torch.float16, "SUM", True, seed + 3, exclusive=False),
        lambda: build_allgatherv(comm, torch.float64, False, seed + 4),
    ]
    for i, make in enumerate(makers):
        with emulation(modes[i % len(modes)]):
            built.append(make())
    with emulation(modes[0]):
        barrier = comm.Barrier_init()
    send, recv, rfill, rcheck = build_ring(comm, torch.int32, seed + 5)
    requests = [req for req, _, _ in built] + [barrier, recv, send]
    fills = [fill for _, fill, _ in built] + [rfill]
    checks = [check for _, _, check in built] + [rcheck]
    return requests, fills, checks


@case
def startall_mixed_requests(comm):
    failures = []
    for label, modes in [("native", (False,)), ("emulated", (True,)),
                         ("mixed", (False, True)), ("mixed2", (True, False))]:
        requests, fills, checks = build_mixed(comm, 100, modes)
        for it in range(ITERATIONS + 1):
            for fill in fills:
                fill(it)
            assert mcr.Prequest.Startall(tuple(requests) if it % 2 else requests) is None
            how = "testall" if it == ITERATIONS else "waitall"
            complete(requests, how)
            for i, check in enumerate(checks):
                try:
                    check(it)
                except AssertionError as exc:
                    failures.append(f"Startall {label} iteration {it} request {i}: {exc}")
        for req in requests:
            req.Free()
    assert not failures, "\n".join(failures)
    assert_comm_works(comm)


@case
def startall_rejects_non_persistent_before_starting_any(comm):
    for emulated in MODES:
        with emulation(emulated):
            x, y = torch.ones(3), torch.zeros(3)
            req = comm.Allreduce_init(x, y)
            with raises(TypeError, "requests[1]", "Prequest"):
                mcr.Prequest.Startall([req, mcr.Request()])
            # req was not started: starting it now is fine (emulated would say
            # "still active" otherwise)
            req.Start()
            req.Wait()
            assert_equal(y, torch.full((3,), float(comm.size)))
            assert mcr.Prequest.Startall([]) is None
            req.Free()
    assert_comm_works(comm)


@case
def init_mode_is_fixed_at_creation(comm):
    """A request made in one mode keeps working after the switch changes."""
    size = comm.size
    for emulated in MODES:
        with emulation(emulated):
            x, y = torch.zeros(2), torch.zeros(2)
            req = comm.Allreduce_init(x, y)
        with emulation(not emulated):
            for it in range(ITERATIONS):
                x.fill_(float(comm.rank + it))
                req.Start()
                req.Wait()
                assert_equal(y, torch.full((2,), float(sum(range(size)) + size * it)))
        req.Free()


@case
def request_keeps_buffers_alive(comm):
    """The caller may drop its references: the Prequest keeps the buffers."""
    size = comm.size
    for emulated in MODES:
        with emulation(emulated):
            out = torch.zeros(1000 * size)
            req = comm.Allgather_init(torch.full((1000,), float(comm.rank)), out)
            gc.collect()
            junk = [torch.full((1000,), -1.0) for _ in range(50)]
            for _ in range(2):
                out.zero_()
                req.Start()
                req.Wait()
                assert_equal(out, torch.cat([torch.full((1000,), float(r))
                                             for r in range(size)]))
            del junk
            req.Free()


# -- Free, restarting, misuse -----------------------------------------------------------


@case
def free_after_use_and_twice(comm):
    size = comm.size
    for emulated in MODES:
        with emulation(emulated):
            x, y = torch.ones(3), torch.zeros(3)
            coll = comm.Allreduce_init(x, y)
            send, recv, fill, check = build_ring(comm, torch.float32, 0)
            for it in range(2):
                fill(it)
                mcr.Prequest.Startall([coll, recv, send])
                mcr.Request.Waitall([coll, recv, send])
                check(it)
                assert_equal(y, torch.full((3,), float(size)))
            for req in (coll, recv, send):
                assert req.Free() is None
                assert not req                      # null after Free, as in mpi4py
                req.Free()                          # twice: harmless
                assert not req
                with raises(ValueError, "freed"):
                    req.Start()
                with raises(ValueError, "freed"):
                    mcr.Prequest.Startall([req])
                assert req.Wait() is True           # a null request is complete
                assert req.Test() is True
            # freed without ever being started
            never = comm.Bcast_init(torch.zeros(2), 0)
            never.Free()
            never.Free()
            with raises(ValueError, "freed"):
                never.Start()
            assert_comm_works(comm)


@case
def emulated_start_while_active(comm):
    """Emulated: Start on a request that has not completed raises ValueError and
    leaves the running operation alone; it completes and restarts normally."""
    size = comm.size
    with emulation(True):
        x, y = torch.zeros(3), torch.zeros(3)
        req = comm.Allreduce_init(x, y)
        for it in range(ITERATIONS):
            x.fill_(float(comm.rank + it))
            req.Start()
            with raises(ValueError, "still active"):
                req.Start()
            with raises(ValueError, "still active"):
                mcr.Prequest.Startall([req])
            req.Wait()
            assert_equal(y, torch.full((3,), float(sum(range(size)) + size * it)))
        req.Free()
    assert_comm_works(comm)


@case
def native_start_while_active(comm):
    """Native: MPI's own error for starting an active request (MPI_ERR_REQUEST)
    comes back as the emulation's ValueError "still active", with MPI's error
    as its cause; the operation still completes."""
    size = comm.size
    with emulation(False):
        x, y = torch.ones(3), torch.zeros(3)
        req = comm.Allreduce_init(x, y)
        req.Start()
        try:
            req.Start()
        except ValueError as exc:
            assert "still active" in str(exc), exc
            assert isinstance(exc.__cause__, mcr.Exception), exc.__cause__
            assert exc.__cause__.Get_error_class() == MPI.ERR_REQUEST
        else:
            raise AssertionError("starting an active request did not raise")
        req.Wait()
        assert_equal(y, torch.full((3,), float(size)))
        req.Free()
    assert_comm_works(comm)


# -- bad input at *_init time -----------------------------------------------------------


def check_init(comm, exc, fragments, fn, *args, **kwargs):
    with raises(exc, *fragments):
        fn(*args, **kwargs)
    assert_comm_works(comm)


@case
def bad_input_at_init(comm):
    """Errors every rank detects: every rank makes the call and gets the error,
    before any MPI call; the communicator works afterwards; so does a persistent
    request made after them."""
    size, rank = comm.size, comm.rank
    for emulated in MODES:
        with emulation(emulated):
            check_init(comm, ValueError, ["sendbuf has 4 elements", "recvbuf has 3"],
                       comm.Allreduce_init, torch.ones(4), torch.zeros(3))
            check_init(comm, ValueError, ["sendbuf has 4 elements", "recvbuf has 3"],
                       comm.Scan_init, torch.ones(4), torch.zeros(3))
            check_init(comm, IndexError, ["root", f"rank {size}", f"size {size}"],
                       comm.Bcast_init, torch.zeros(2), size)
            check_init(comm, IndexError, ["root", "rank -1"],
                       comm.Bcast_init, torch.zeros(2), -1)
            check_init(comm, IndexError, ["root", f"rank {size + 3}"],
                       comm.Reduce_init, torch.ones(2), torch.zeros(2), mcr.SUM, size + 3)
            check_init(comm, IndexError, ["root"],
                       comm.Gather_init, torch.ones(2), torch.zeros(2 * size), size)
            check_init(comm, ValueError, ["recvbuf", f"counts has {size + 1} entries"],
                       comm.Allgatherv_init, torch.ones(2),
                       [torch.zeros(2 * size + 2), [2] * (size + 1)])
            check_init(comm, ValueError, ["sendbuf", f"counts has {size + 1} entries"],
                       comm.Alltoallv_init, [torch.ones(size), [1] * (size + 1)],
                       [torch.zeros(size), [1] * size])
            check_init(comm, ValueError, ["recvcounts", f"has {size + 1} entries"],
                       comm.Reduce_scatter_init, torch.ones(size), torch.zeros(1),
                       [1] * (size + 1))
            check_init(comm, ValueError, [f"sendbuf has {2 * size} elements"],
                       comm.Reduce_scatter_block_init, torch.ones(2 * size), torch.zeros(3))
            check_init(comm, TypeError, ["op", "BAND", "float32"],
                       comm.Allreduce_init, torch.ones(2), torch.zeros(2), mcr.BAND)
            check_init(comm, TypeError, ["op", "BAND", "float32"],
                       comm.Exscan_init, torch.ones(2), torch.zeros(2), mcr.BAND)
            check_init(comm, TypeError, ["info"],
                       comm.Allreduce_init, torch.ones(2), torch.zeros(2), mcr.SUM, "info")
            check_init(comm, TypeError, ["info"], comm.Barrier_init, 5)
            check_init(comm, ValueError, ["backend", "nccl-x"],
                       comm.Allgather_init, torch.ones(2), torch.zeros(2 * size),
                       backend="nccl-x")
            check_init(comm, BufferError, ["not contiguous"],
                       comm.Allreduce_init, torch.ones(4, 2).t(), torch.zeros(8))
            # point-to-point
            check_init(comm, IndexError, ["dest", f"rank {size}"],
                       comm.Send_init, torch.ones(2), size)
            check_init(comm, IndexError, ["source", "rank -7"],
                       comm.Recv_init, torch.zeros(2), -7)
            check_init(comm, ValueError, ["tag", "-5", "out of range"],
                       comm.Send_init, torch.ones(2), (rank + 1) % size, -5)
            check_init(comm, ValueError, ["tag", "out of range"],
                       comm.Recv_init, torch.zeros(2), (rank - 1) % size, 1 << 40)
            check_init(comm, ValueError, ["buf", "count 5", "buffer of 4 elements"],
                       comm.Send_init, [torch.zeros(4), 5], (rank + 1) % size)
            # errors only the root sees: only the root calls
            root = size - 1
            if rank == root:
                check_init(comm, ValueError, ["recvbuf", f"counts has {size + 1} entries"],
                           comm.Gatherv_init, torch.ones(2),
                           [torch.zeros(4 * size), [2] * (size + 1)], root)
                check_init(comm, ValueError, ["sendbuf", f"counts has {size - 1} entries"],
                           comm.Scatterv_init, [torch.ones(2 * size), [2] * (size - 1)],
                           torch.zeros(2), root)
            else:
                assert_comm_works(comm)
                assert_comm_works(comm)
            # everything still works, persistent requests included
            r = Runner(comm)
            r.run(f"Allreduce_init after errors {mode_name(emulated)}",
                  build_allreduce(comm, torch.float32, "SUM", False, 0))
            r.done()


@case
def start_while_active_says_still_active_in_both_modes(comm):
    """Start, or Startall, on a request that has not completed: ValueError
    "still active" naming the request, natively (MPI's MPI_ERR_REQUEST
    translated) as emulated; the running operation completes with the right
    result and the request starts again."""
    size = comm.size
    for emulated in MODES:
        with emulation(emulated):
            x, y = torch.zeros(3), torch.zeros(3)
            req = comm.Allreduce_init(x, y)
            other = comm.Barrier_init()
            for it in range(ITERATIONS):
                x.fill_(float(comm.rank + it))
                req.Start()
                with raises(ValueError, "request: still active", "Wait/Test"):
                    req.Start()
                with raises(ValueError, "requests[0]: still active"):
                    mcr.Prequest.Startall([req])
                with raises(ValueError, "requests[1]: still active"):
                    mcr.Prequest.Startall([other, req])
                if not emulated:        # MPI tells only when it gets there
                    other.Wait()
                req.Wait()
                assert_equal(y, torch.full((3,), float(sum(range(size)) + size * it)))
            req.Free()
            other.Free()
    # persistent point-to-point (always native on MPI)
    right, left = (comm.rank + 1) % size, (comm.rank - 1) % size
    out = torch.zeros(2)
    recv = comm.Recv_init(out, left, 5)
    send = comm.Send_init(torch.full((2,), float(comm.rank)), right, 5)
    recv.Start()
    with raises(ValueError, "request: still active"):
        recv.Start()
    send.Start()
    mcr.Request.Waitall([recv, send])
    assert_equal(out, torch.full((2,), float(left)))
    recv.Free()
    send.Free()
    assert_comm_works(comm)


@case
def request_lifecycle_is_the_same_in_both_modes(comm):
    for on in (False, True):
        with emulation(on):
            x = torch.ones(2)
            y = torch.zeros(2)
            req = comm.Allreduce_init(x, y)
            assert req                                  # alive before any start
            req.Start()
            if on:
                with raises(ValueError, "still active", "before freeing"):
                    req.Free()
            req.Wait()
            assert_equal(y, torch.full((2,), float(comm.size)))
            assert req                                  # inactive, not freed
            req.Free()
            assert not req
            req.Free()                                  # harmless


@case
def startall_checks_before_starting_any(comm):
    with emulation(True):
        first = comm.Allreduce_init(torch.ones(1), out := torch.zeros(1))
        second = comm.Barrier_init()
        second.Start()                                  # active
        with raises(ValueError, "requests[1]", "still active"):
            mcr.Prequest.Startall([first, second])
        assert mcr.Request.Testall([first])             # never started: nothing to wait
        assert out.item() == 0.0
        second.Wait()
        mcr.Prequest.Startall([first, second])
        mcr.Request.Waitall([first, second])
        assert out.item() == float(comm.size)
        first.Free()
        second.Free()
        with raises(ValueError, "requests[0]", "freed"):
            mcr.Prequest.Startall([first])


@case
def start_after_the_communicator_was_freed_raises(comm):
    for on in (False, True):
        with emulation(on):
            dup = comm.Dup()
            req = dup.Allreduce_init(torch.ones(2), torch.zeros(2))
            dup.Free()
            with raises(ValueError, "communicator was freed"):
                req.Start()
            with raises(ValueError, "requests[0]", "communicator was freed"):
                mcr.Prequest.Startall([req])
            req.Free()
    assert_comm_works(comm)


@case
def collectives_on_numpy_arrays(comm):
    size, rank = comm.size, comm.rank
    counts = [(r % 3) for r in range(size)]            # uneven, with zeros
    displs = list(np.cumsum([0] + counts[:-1]))
    for on in (False, True):
        with emulation(on):
            x = np.zeros(4, dtype=np.float64)
            total = np.zeros(4, dtype=np.float64)
            prefix = np.zeros(4, dtype=np.float64)
            mine = np.zeros(counts[rank], dtype=np.int32)
            gathered = np.zeros(sum(counts), dtype=np.int32)
            reqs = [comm.Allreduce_init(x, total, op=mcr.SUM),
                    comm.Scan_init(x, prefix, op=mcr.MAX),
                    comm.Allgatherv_init(mine, [gathered, counts, displs])]
            for it in range(3):
                data = [np.arange(4.0) * (r + 1) + it for r in range(size)]
                x[:] = data[rank]
                mine[:] = np.arange(counts[rank], dtype=np.int32) + 10 * rank + it
                mcr.Prequest.Startall(reqs)
                mcr.Request.Waitall(reqs)
                np.testing.assert_array_equal(total, np.sum(data, axis=0))
                np.testing.assert_array_equal(prefix, np.max(data[:rank + 1], axis=0))
                expected = np.concatenate([np.arange(counts[r], dtype=np.int32) + 10 * r + it
                                           for r in range(size)])
                np.testing.assert_array_equal(gathered, expected)
            for req in reqs:
                req.Free()


test_mpi = mpi_cases(__name__)
