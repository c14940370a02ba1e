"""Persistent requests beyond the operation matrix (which starts every collective's *_init form
with new data written in place): Send_init/Recv_init, their statuses and PROC_NULL, Info,
Startall over mixed requests, the mode fixed at creation, buffers kept alive, Free, starting an
active or freed request, bad input at *_init time. Collectives run in both modes: MPI-4 native
and emulated (the non-blocking form posted at each Start: opmatrix.emulation)."""

import gc
import itertools

import numpy as np
import pytest
import torch
from mpi4py import MPI as _mpi4py

import mcr
import mcr.log
from mcr import MPI
from mpiharness import case, mpi_cases
from opmatrix import (COMPLETIONS, Findings, allgatherv_maker, allreduce_maker,
                      alltoallv_maker, barrier_maker, bcast_maker, complete, emulation,
                      gatherv_maker, refill, run, scan_maker, scatterv_maker)
from opref import expect, rank_data, sentinel
from util import assert_comm_works, assert_equal, raises

N = 4
ITERATIONS = 3
MODES = (False, True)                 # emulated?


# -- point-to-point -----------------------------------------------------------------------
def ring(comm, dtype, seed, n=N, tag=5, source=None, recv_tag=None, extra=0):
    """A persistent send to the right and receive from the left into `extra` more elements than
    the message: (send, recv, fill, check)."""
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    sbuf, rbuf = sentinel(n, dtype), sentinel(n + extra, dtype)
    send = comm.Send_init(sbuf, right, tag)
    recv = comm.Recv_init(rbuf, left if source is None else source,
                          tag if recv_tag is None else recv_tag)

    def fill(it):
        sbuf.copy_(rank_data(rank, n, dtype, seed + it))
        rbuf.copy_(sentinel(n + extra, dtype))

    def check(it):
        want = sentinel(n + extra, dtype)
        want[:n] = rank_data(left, n, dtype, seed + it)
        expect(rbuf, want)

    return send, recv, fill, check


@case.quick
def send_init_recv_init(comm):
    """A ring restarted with new contents by Start or Startall, completed every way, in both
    modes (p2p is always native: the switch must not disturb it)."""
    found, turns = Findings(), itertools.cycle(COMPLETIONS)
    for emulated in MODES:
        with emulation(emulated):
            for seed, dtype in enumerate([torch.float32, torch.float16, torch.bfloat16,
                                          torch.int64, torch.bool, torch.complex128, torch.int8]):
                send, recv, fill, check = ring(comm, dtype, 10 * seed)
                assert isinstance(send, mcr.Prequest) and isinstance(recv, mcr.Prequest)
                for it in range(ITERATIONS):
                    fill(it)
                    how = next(turns)
                    if it % 2:
                        mcr.Prequest.Startall([recv, send])
                    else:
                        recv.Start()
                        send.Start()
                    complete([recv, send], how)
                    with found.check(f"ring emulated={emulated} {dtype} start {it} {how}"):
                        check(it)
                send.Free()
                recv.Free()
    found.report()


@case
def send_init_numpy_and_proc_null(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    sbuf, rbuf, null_buf = np.zeros(5), np.zeros(5), np.full(2, 7.0)
    requests = [comm.Recv_init(rbuf, left, 3), comm.Send_init(sbuf, right, 3),
                comm.Send_init(np.zeros(2), mcr.PROC_NULL),
                comm.Recv_init(null_buf, mcr.PROC_NULL)]
    for it in range(ITERATIONS):
        sbuf[:] = np.arange(5) * (rank + 1) + it
        rbuf[:] = -1
        mcr.Prequest.Startall(requests)
        statuses = []
        mcr.Request.Waitall(requests, statuses)
        np.testing.assert_array_equal(rbuf, np.arange(5) * (left + 1) + it)
        np.testing.assert_array_equal(null_buf, np.full(2, 7.0))
        assert (statuses[3].Get_source(), statuses[3].Get_count()) == (mcr.PROC_NULL, 0)
    for req in requests:
        req.Free()
    assert_comm_works(comm)


@case.matrix(backend=("mpi", "gloo"))
def a_receive_whose_wait_failed_starts_again(comm, backend):
    # a truncated persistent receive raises at its wait and is inactive then, as after
    # completing: the next Start receives the next message
    if comm.size == 1 and backend == "mpi":
        return                       # Open MPI truncates a message to oneself silently
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    buf = torch.zeros(2)
    recv = comm.Recv_init(buf, left, 6, backend=backend)
    recv.Start()
    sent = comm.Isend(torch.ones(5), right, 6, backend=backend)
    with raises(mcr.Exception, "truncated"):
        recv.Wait()
    sent.Wait()
    recv.Start()
    sent = comm.Isend(rank_data(comm.rank, 2, torch.float32, 1), right, 6, backend=backend)
    recv.Wait()
    sent.Wait()
    expect(buf, rank_data(left, 2, torch.float32, 1))
    recv.Free()
    assert_comm_works(comm)


@case
def recv_init_status_counts_elements(comm):
    """A persistent ANY_SOURCE/ANY_TAG receive's Status, completed every way: Get_count() counts
    elements of the receive's type, source and tag are the sender's."""
    left = (comm.rank - 1) % comm.size
    found = Findings()
    for seed, dtype in enumerate([torch.float64, torch.int16, torch.complex64]):
        send, recv, fill, check = ring(comm, dtype, 10 * seed, n=3, tag=7 + seed,
                                       source=mcr.ANY_SOURCE, recv_tag=mcr.ANY_TAG, extra=2)
        for it, how in enumerate(("wait", "waitall", "test", "testall")):
            fill(it)
            mcr.Prequest.Startall([recv, send])
            st = complete([recv, send], how)[0]
            with found.check(f"Recv_init {dtype} completed by {how}"):
                check(it)
                got = (st.Get_source(), st.source, st.Get_tag(), st.tag)
                assert got == (left, left, 7 + seed, 7 + seed), got
                got = (st.Get_count(MPI.BYTE), st.Get_count())
                assert got == (3 * dtype.itemsize, 3), (got, dtype)
        send.Free()
        recv.Free()
    found.report()


# -- collectives: what the matrix does not vary ----------------------------------------------
def with_info(make, info):
    """`make` with `info` appended to its arguments (Bcast_init's, Allreduce_init's last)."""
    def made(seed):
        args, check = make(seed)
        return (*args, info), check
    return made


@case
def info_argument(comm):
    found = Findings()
    info = _mpi4py.Info.Create()
    try:
        for given in (info, None):
            run(comm, found, f"info {given}", "mpi", "persistent", "Bcast",
                with_info(bcast_maker(comm, torch.float32, comm.size - 1, False, None), given))
            run(comm, found, f"info {given}", "mpi", "persistent", "Allreduce",
                with_info(allreduce_maker(comm, torch.int32, "SUM", 0, False), given))
    finally:
        info.Free()
    found.report()


def nested(args):
    """Vector specs [buf, counts, displs] as [buf, (counts tensor, displs array)]."""
    return tuple([a[0], (torch.tensor(list(a[1])), np.array(a[2]))]
                 if isinstance(a, list) and len(a) == 3 else a for a in args)


def mixed_makers(comm):
    last = comm.size - 1
    return [("Allreduce", allreduce_maker(comm, torch.float32, "SUM", 0, False)),
            ("Bcast", bcast_maker(comm, torch.bfloat16, last, False, None)),
            ("Alltoallv", alltoallv_maker(comm, torch.int64, 0, False, "reversed")),
            ("Scan", scan_maker(comm, torch.float16, "SUM", 0, True)),
            ("Allgatherv", allgatherv_maker(comm, torch.float64, 0, False, "gaps")),
            ("Gatherv", gatherv_maker(comm, torch.int32, last, True, "reversed")),
            ("Scatterv", scatterv_maker(comm, torch.uint8, 0, False, "gaps")),
            ("Allreduce", allreduce_maker(comm, np.float64, "MAX", 0, False)),
            ("Barrier", barrier_maker(comm, None, 0, False, None))]


@case
def startall_mixed_requests(comm):
    """One Startall over collectives made in one mode or in both (vector counts and displacements
    as a tensor and an array, numpy buffers) and a Send_init/Recv_init ring."""
    found = Findings()
    for k, (label, modes) in enumerate([("native", (False,)), ("emulated", (True,)),
                                        ("mixed", (False, True)), ("mixed2", (True, False))]):
        made = []
        for i, (method, make) in enumerate(mixed_makers(comm)):
            args = nested(make(0)[0])
            with emulation(modes[i % len(modes)]):
                made.append((getattr(comm, method + "_init")(*args), method, args, make))
        send, recv, fill, check = ring(comm, torch.int32, 50)
        requests = [req for req, *_ in made] + [recv, send]
        for it in range(1, ITERATIONS + 1):
            checks = []
            for _, method, args, make in made:
                new_args, method_check = make(it)
                refill(args, nested(new_args))
                checks.append((method, args, method_check))
            fill(it)
            assert mcr.Prequest.Startall(tuple(requests) if it % 2 else requests) is None
            how = COMPLETIONS[(it + 3 * k) % len(COMPLETIONS)]
            complete(requests, how)
            for method, args, method_check in checks:
                with found.check(f"Startall {label} start {it} {how}: {method}"):
                    method_check(args)
            with found.check(f"Startall {label} start {it} {how}: ring"):
                check(it)
        for req in requests:
            req.Free()
    found.report()
    assert_comm_works(comm)


@case
def startall_takes_mpi4pys_requests_too(comm):
    """A communicator mcr leaves to mpi4py (Create_from_group) makes mpi4py's Prequests:
    Startall starts them with mcr's; a freed one is refused before any starts."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    group = comm.Get_group()
    other = MPI.Intracomm.Create_from_group(group)
    got, y = np.zeros(2), torch.zeros(3)
    theirs = [other.Recv_init(got, left, 1),
              other.Send_init(np.full(2, float(comm.rank)), right, 1)]
    assert not any(isinstance(r, mcr.Prequest) for r in theirs), theirs
    ours = comm.Allreduce_init(torch.ones(3), y)
    for _ in range(2):
        got[:] = -1
        mcr.Prequest.Startall([theirs[0], ours, theirs[1]])
        MPI.Request.Waitall(theirs + [ours])
        assert np.array_equal(got, np.full(2, float(left))), got
        assert_equal(y, torch.full((3,), float(comm.size)))
    freed = other.Send_init(np.zeros(1), right, 2)
    freed.Free()
    with raises(ValueError, "requests[1]", "freed"):
        mcr.Prequest.Startall([ours, freed])
    ours.Start()            # (not started by the refused Startall)
    ours.Wait()
    for r in theirs + [ours]:
        r.Free()
    other.Free()
    group.Free()


@case.matrix(emulated=MODES)
def startall_rejects_non_persistent_before_starting_any(comm, emulated):
    with emulation(emulated):
        req = comm.Allreduce_init(torch.ones(3), y := torch.zeros(3))
        with raises(TypeError, "requests[1]", "Prequest"):
            mcr.Prequest.Startall([req, mcr.Request()])
        req.Start()         # req was not started (emulated would say "still active" otherwise)
        req.Wait()
        assert_equal(y, torch.full((3,), float(comm.size)))
        assert mcr.Prequest.Startall([]) is None
        req.Free()
    assert_comm_works(comm)


@case.matrix(emulated=MODES)
def init_mode_is_fixed_at_creation(comm, emulated):
    """A request made in one mode keeps working after the switch changes."""
    with emulation(emulated):
        req = comm.Allreduce_init(x := torch.zeros(2), y := torch.zeros(2))
    with emulation(not emulated):
        for it in range(ITERATIONS):
            x.fill_(float(comm.rank + it))
            req.Start()
            req.Wait()
            assert_equal(y, torch.full((2,), float(sum(range(comm.size)) + comm.size * it)))
    req.Free()


@case.matrix(emulated=MODES)
def request_keeps_buffers_alive(comm, emulated):
    """The caller may drop its references: the Prequest keeps the buffers."""
    with emulation(emulated):
        out = torch.zeros(1000 * comm.size)
        req = comm.Allgather_init(torch.full((1000,), float(comm.rank)), out)
        gc.collect()
        junk = [torch.full((1000,), -1.0) for _ in range(50)]
        for _ in range(2):
            out.zero_()
            req.Start()
            req.Wait()
            assert_equal(out, torch.cat([torch.full((1000,), float(r)) for r in range(comm.size)]))
        del junk
        req.Free()


@case.matrix(emulated=MODES)
def a_tensor_given_new_memory_between_starts(comm, emulated):
    """A tensor given new memory between starts (set_, .data =, resize_): MPI's own request
    refuses to start, naming it (MPI went on writing into the freed memory: a crash later); an
    emulated one, posted again at each Start, moves what the new memory holds."""
    changes = {"set_": lambda t: t.set_(torch.zeros(N)),
               ".data =": lambda t: setattr(t, "data", torch.zeros(N)),
               "resize_": lambda t: t.resize_(4 * N)}
    with emulation(emulated):
        for (what, change), side in itertools.product(changes.items(), ("sendbuf", "recvbuf")):
            if emulated and what == "resize_":
                continue                # (the sizes would differ: refused as any Allreduce)
            x, y = torch.ones(N), torch.zeros(N)
            req = comm.Allreduce_init(x, y)
            other = comm.Allreduce_init(torch.ones(1), torch.zeros(1))
            req.Start()
            req.Wait()
            change(x if side == "sendbuf" else y)
            if emulated:
                x.fill_(2.0)
                req.Start()
                req.Wait()
                assert_equal(y, torch.full((N,), 2.0 * comm.size))
            else:
                with raises(ValueError, f"request: {side} no longer holds the memory MPI was "
                                        "given", "make the request again"):
                    req.Start()
                with raises(ValueError, f"requests[1]: {side} no longer holds"):
                    MPI.Prequest.Startall([other, req])
                assert MPI.Request.Testall([other, req])        # neither started
            req.Free()
            other.Free()


# -- Free, restarting, misuse -----------------------------------------------------------
@case.matrix(emulated=MODES)
def free_after_use_and_twice(comm, emulated):
    with emulation(emulated):
        coll = comm.Allreduce_init(torch.ones(3), y := torch.zeros(3))
        send, recv, fill, check = ring(comm, torch.float32, 0)
        for it in range(2):
            fill(it)
            mcr.Prequest.Startall([coll, recv, send])
            mcr.Request.Waitall([coll, recv, send])
            check(it)
            assert_equal(y, torch.full((3,), float(comm.size)))
        never = comm.Bcast_init(torch.zeros(2), 0)      # freed without a start
        for req in (coll, recv, send, never):
            assert req.Free() is None
            assert not req                      # null after Free, as in mpi4py
            req.Free()                          # twice: harmless
            assert not req
            with raises(ValueError, "freed"):
                req.Start()
            with raises(ValueError, "freed"):
                mcr.Prequest.Startall([req])
            assert req.Wait() is True and req.Test() is True    # a null request is complete
        assert_comm_works(comm)


@case
def start_while_active_says_still_active_in_both_modes(comm):
    """Start or Startall on a request not completed: ValueError "still active" naming it, native
    (MPI's MPI_ERR_REQUEST kept as the cause) as emulated; the operation completes right, the
    logger keeps the record of the start running, and the request starts again."""
    size = comm.size
    for emulated in MODES:
        mcr.log.reset()
        mcr.log.start(records=True)
        with emulation(emulated):
            req = comm.Allreduce_init(x := torch.zeros(3), y := torch.zeros(3))
            other = comm.Barrier_init()
            for it in range(ITERATIONS):
                x.fill_(float(comm.rank + it))
                req.Start()
                with pytest.raises(ValueError) as info:
                    req.Start()
                exc = info.value
                assert "request: still active" in str(exc) and "Wait/Test" in str(exc), exc
                if not emulated:
                    assert isinstance(exc.__cause__, mcr.Exception), exc.__cause__
                    assert exc.__cause__.Get_error_class() == MPI.ERR_REQUEST
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
        mcr.log.stop()
        starts = [r for r in mcr.log.records() if r["op"] == "Allreduce"]
        assert len(starts) == ITERATIONS, (emulated, starts)
        mcr.log.reset()
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


@case.matrix(emulated=MODES)
def request_lifecycle_is_the_same_in_both_modes(comm, emulated):
    with emulation(emulated):
        req = comm.Allreduce_init(torch.ones(2), y := torch.zeros(2))
        assert req                                  # alive before any start
        req.Start()
        if emulated:
            with raises(ValueError, "still active", "before freeing"):
                req.Free()
        req.Wait()
        assert_equal(y, torch.full((2,), float(comm.size)))
        assert req                                  # inactive, not freed
        req.Free()
        assert not req
        req.Free()                                  # harmless


# MPI's results on a list of inactive requests, which count as complete: all True, none active
ALL_INACTIVE = {"Waitall": True, "Testall": True, "Waitany": MPI.UNDEFINED,
                "Testany": (MPI.UNDEFINED, True), "Waitsome": None, "Testsome": None,
                "Get_status_all": True, "Get_status_any": (MPI.UNDEFINED, True),
                "Get_status_some": None}


@case.matrix(emulated=MODES)
def an_inactive_request_may_be_listed_twice(comm, emulated):
    """An inactive persistent request (not started yet, or completed since its start) listed
    twice, or twenty times, counts as complete in every completion method, as in MPI and mpi4py
    (before, mcr refused a native one as if active: "the same request as requests[0]"; the
    Get_status_* methods called one inactive at index 0 complete, and on an emulated one ran
    mpi4py's, which Open MPI lacks); the statuses are empty. Started, the same list is refused
    before anything is waited for."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    with emulation(emulated):
        got, total = torch.zeros(N), torch.zeros(N)
        recv = comm.Recv_init(got, left, 70)
        reduce = comm.Allreduce_init(torch.ones(N), total)
        gloo = comm.Allreduce_init(torch.ones(N), total, backend="gloo")
        for phase in ("not started", "completed"):
            for reqs in ([recv, recv], [reduce, gloo, reduce, gloo], [recv, reduce] * 10):
                for method, want in ALL_INACTIVE.items():
                    assert getattr(MPI.Request, method)(reqs) == want, (phase, method, reqs)
                statuses = []
                MPI.Request.Waitall(reqs, statuses)
                assert [(st.source, st.tag, st.Get_count(MPI.BYTE)) for st in statuses] == \
                    [(MPI.ANY_SOURCE, MPI.ANY_TAG, 0)] * len(reqs), phase
            if phase == "completed":
                break
            for req in (recv, reduce):          # active: refused
                req.Start()
                with raises(ValueError, "requests[2]: the same request as requests[0]"):
                    MPI.Request.Waitall([req, MPI.REQUEST_NULL, req])
                assert req
            comm.Send(torch.full((N,), float(comm.rank)), right, 70)
            MPI.Request.Waitall([recv, reduce])
            assert_equal(got, torch.full((N,), float(left)))
            assert_equal(total, torch.full((N,), float(comm.size)))
        for req in (recv, reduce, gloo):
            req.Free()


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


@case.matrix(emulated=MODES)
def start_after_the_communicator_was_freed_raises(comm, emulated):
    with emulation(emulated):
        dup = comm.Dup()
        req = dup.Allreduce_init(torch.ones(2), torch.zeros(2))
        dup.Free()
        with raises(ValueError, "communicator was freed"):
            req.Start()
        with raises(ValueError, "requests[0]", "communicator was freed"):
            mcr.Prequest.Startall([req])
        req.Free()
    assert_comm_works(comm)


# -- bad input at *_init time -----------------------------------------------------------
def bad_inits(comm):
    """(exception, message fragments, method, args, kwargs): errors every rank detects."""
    size, rank = comm.size, comm.rank
    one, two, right, left = torch.ones(2), torch.zeros(2), (rank + 1) % size, (rank - 1) % size
    return [
        (ValueError, ["sendbuf has 4 elements", "recvbuf has 3"], "Allreduce_init",
         (torch.ones(4), torch.zeros(3))),
        (ValueError, ["sendbuf has 4 elements", "recvbuf has 3"], "Scan_init",
         (torch.ones(4), torch.zeros(3))),
        (IndexError, ["root", f"rank {size}", f"size {size}"], "Bcast_init", (two, size)),
        (IndexError, ["root", "rank -1"], "Bcast_init", (two, -1)),
        (IndexError, ["root", f"rank {size + 3}"], "Reduce_init", (one, two, mcr.SUM, size + 3)),
        (IndexError, ["root"], "Gather_init", (one, torch.zeros(2 * size), size)),
        (ValueError, ["recvbuf", f"counts has {size + 1} entries"], "Allgatherv_init",
         (one, [torch.zeros(2 * size + 2), [2] * (size + 1)])),
        (ValueError, ["sendbuf", f"counts has {size + 1} entries"], "Alltoallv_init",
         ([torch.ones(size), [1] * (size + 1)], [torch.zeros(size), [1] * size])),
        (ValueError, ["recvcounts", f"has {size + 1} entries"], "Reduce_scatter_init",
         (torch.ones(size), torch.zeros(1), [1] * (size + 1))),
        (ValueError, [f"sendbuf has {2 * size} elements"], "Reduce_scatter_block_init",
         (torch.ones(2 * size), torch.zeros(3))),
        (TypeError, ["op", "BAND", "float32"], "Allreduce_init", (one, two, mcr.BAND)),
        (TypeError, ["op", "BAND", "float32"], "Exscan_init", (one, two, mcr.BAND)),
        (TypeError, ["info"], "Allreduce_init", (one, two, mcr.SUM, "info")),
        (TypeError, ["info"], "Barrier_init", (5,)),
        (ValueError, ["backend", "nccl-x"], "Allgather_init",
         (one, torch.zeros(2 * size)), {"backend": "nccl-x"}),
        (BufferError, ["not contiguous"], "Allreduce_init", (torch.ones(4, 2).t(), torch.zeros(8))),
        # point-to-point
        (IndexError, ["dest", f"rank {size}"], "Send_init", (one, size)),
        (IndexError, ["source", "rank -7"], "Recv_init", (two, -7)),
        (ValueError, ["tag", "-5", "out of range"], "Send_init", (one, right, -5)),
        (ValueError, ["tag", "out of range"], "Recv_init", (two, left, 1 << 40)),
        (ValueError, ["buf", "count 5", "buffer of 4 elements"], "Send_init",
         ([torch.zeros(4), 5], right)),
    ]


def root_only_bad_inits(comm, root):
    size = comm.size
    return [
        (ValueError, ["recvbuf", f"counts has {size + 1} entries"], "Gatherv_init",
         (torch.ones(2), [torch.zeros(4 * size), [2] * (size + 1)], root)),
        (ValueError, ["sendbuf", f"counts has {size - 1} entries"], "Scatterv_init",
         ([torch.ones(2 * size), [2] * (size - 1)], torch.zeros(2), root)),
    ]


def check_inits(comm, table):
    for exc, fragments, method, args, *kwargs in table:
        with raises(exc, *fragments):
            getattr(comm, method)(*args, **(kwargs[0] if kwargs else {}))
        assert_comm_works(comm)


@case
def bad_input_at_init(comm):
    """Errors every rank detects: every rank gets them before any MPI call; errors only the root
    sees: only the root calls. The communicator and new persistent requests work afterwards."""
    root = comm.size - 1
    for emulated in MODES:
        with emulation(emulated):
            check_inits(comm, bad_inits(comm))
            if comm.rank == root:
                check_inits(comm, root_only_bad_inits(comm, root))
            else:
                for _ in root_only_bad_inits(comm, root):
                    assert_comm_works(comm)
    found = Findings()
    run(comm, found, "after errors", "mpi", "persistent", "Allreduce",
        allreduce_maker(comm, torch.float32, "SUM", 0, False))
    found.report()


test_mpi = mpi_cases(__name__)
