"""Hangs turned into errors: checked mode (MismatchError) and timeouts
(TimeoutError), on MPI and Gloo, at 1-4 ranks.

Each case plants one kind of mistake on a duplicate of COMM_WORLD: the last
rank calls another collective, root, count, element type, reduction op or
backend, skips a collective, or passes arguments only the root can refuse. In
checked mode every rank must raise before any communicates, and the
communicator must still work; with a timeout every rank must raise
TimeoutError within it, naming its pending calls, and the calls left pending
must still complete once the mistake is undone. At one rank there is nothing to
disagree with: the same calls must simply work. Expected values are computed
with torch on the whole data.
"""

import time
import warnings

import mpi4py.MPI
import torch

import mcr
from mpiharness import case, mpi_cases

BACKENDS = ("mpi", "gloo")
TIMEOUT = 2.0
SLACK = 20.0        # a loaded 2-core machine: the error must come well before the
                    # harness's own timeout, not at TIMEOUT to the millisecond


def raises(exc_type, fn, *args, **kwargs):
    """The `exc_type` exception that fn(*args, **kwargs) raises."""
    try:
        fn(*args, **kwargs)
    except exc_type as exc:
        return exc
    raise AssertionError(f"{exc_type.__name__} not raised by {fn}")


def checked(comm):
    c = comm.Dup()
    c.checked = True
    return c


def data(rank, n=4, dtype=torch.float32):
    return torch.arange(n, dtype=dtype) + 10 * rank


def assert_allreduce_works(c, backend="mpi"):
    """An Allreduce on `c` sums every rank's data: the communicator works."""
    x = data(c.rank)
    c.Allreduce(mcr.IN_PLACE, x, backend=backend)
    assert torch.equal(x, sum(data(r) for r in range(c.size)))


def expect_mismatch(c, call, deviant, *words):
    """Run call(rank) on every rank: with more than one rank, every rank raises
    MismatchError whose message holds `words`; at one rank it works. Then the
    communicator still works."""
    size, rank = c.size, c.rank
    if size == 1:
        call(rank)
    else:
        exc = raises(mcr.MismatchError, call, rank)
        for word in words:
            assert word in str(exc), (word, str(exc))
        assert len(exc.calls) == size, exc.calls
        assert str(deviant) in exc.calls[size - 1] or deviant in str(exc), exc.calls
    y = torch.zeros(4)
    c.Allreduce(data(rank), y)
    assert torch.equal(y, sum(data(r) for r in range(size)))


# -- Checked mode: calls that agree ------------------------------------------------

@case
def checked_calls_that_agree_run_as_usual(comm):
    size, rank = comm.size, comm.rank
    for backend in BACKENDS:
        c = checked(comm)
        assert c.checked and c.Dup().checked and c.Split(0, rank).checked
        total = sum(data(r) for r in range(size))
        y = torch.zeros(4)
        c.Allreduce(data(rank), y, backend=backend)
        assert torch.equal(y, total)
        b = data(0) if rank == 0 else torch.zeros(4)
        c.Bcast(b, root=0, backend=backend)
        assert torch.equal(b, data(0))
        # vector collectives whose counts differ by rank, legitimately
        counts = [r + 1 for r in range(size)]
        mine = torch.full((rank + 1,), float(rank))
        out = torch.zeros(sum(counts)) if rank == 0 else None
        c.Gatherv(mine, [out, counts] if rank == 0 else None, root=0, backend=backend)
        if rank == 0:
            assert torch.equal(out, torch.cat([torch.full((r + 1,), float(r))
                                               for r in range(size)]))
        every = torch.zeros(sum(counts))
        c.Allgatherv(mine, [every, counts], backend=backend)
        assert torch.equal(every, torch.cat([torch.full((r + 1,), float(r))
                                             for r in range(size)]))
        send = torch.arange(size, dtype=torch.float32) + 100 * rank
        recv = torch.zeros(size)
        c.Alltoallv([send, [1] * size], [recv, [1] * size], backend=backend)
        assert torch.equal(recv, torch.tensor([100.0 * r + rank for r in range(size)]))
        req = c.Iallreduce(data(rank), y, mcr.MAX, backend=backend)
        req.Wait()
        assert torch.equal(y, data(size - 1))
        c.Barrier(backend=backend)
        c.Free()


# -- Checked mode: each kind of mismatch -------------------------------------------

@case
def checked_different_operation(comm):
    size = comm.size
    for backend in BACKENDS:
        c = checked(comm)

        def call(rank):
            x = data(rank)
            if rank == size - 1 and size > 1:
                c.Bcast(x, root=0, backend=backend)
            else:
                c.Allreduce(mcr.IN_PLACE, x, backend=backend)

        expect_mismatch(c, call, "Bcast", "different operations", "Allreduce float32[4] SUM",
                        "Bcast float32[4] root=0")
        c.Free()


@case
def checked_different_root(comm):
    size = comm.size
    for backend in BACKENDS:
        c = checked(comm)

        def call(rank):
            root = 1 if rank == size - 1 and size > 1 else 0
            c.Bcast(data(0) if rank == root else torch.zeros(4), root=root, backend=backend)

        expect_mismatch(c, call, "root=1", "different roots", "root=0", "root=1")
        c.Free()


@case
def checked_different_count(comm):
    size = comm.size
    for backend in BACKENDS:
        c = checked(comm)

        def call(rank):
            n = 5 if rank == size - 1 and size > 1 else 4
            c.Allreduce(mcr.IN_PLACE, data(rank, n), backend=backend)

        expect_mismatch(c, call, "float32[5]", "different counts", "float32[4]", "float32[5]")
        c.Free()


@case
def checked_different_dtype(comm):
    size = comm.size
    for backend in BACKENDS:
        c = checked(comm)

        def call(rank):
            dtype = torch.float64 if rank == size - 1 and size > 1 else torch.float32
            c.Allreduce(mcr.IN_PLACE, data(rank, dtype=dtype), backend=backend)

        expect_mismatch(c, call, "float64[4]", "different element types", "float32[4]")
        c.Free()


@case
def checked_different_reduction_op(comm):
    size = comm.size
    for backend in BACKENDS:
        c = checked(comm)

        def call(rank):
            op = mcr.MAX if rank == size - 1 and size > 1 else mcr.SUM
            c.Allreduce(mcr.IN_PLACE, data(rank), op, backend=backend)

        expect_mismatch(c, call, "MAX", "different reduction ops", "SUM", "MAX")
        c.Free()


@case
def checked_different_backend(comm):
    size = comm.size
    c = checked(comm)

    def call(rank):
        backend = "gloo" if rank == size - 1 and size > 1 else "mpi"
        c.Allreduce(mcr.IN_PLACE, data(rank), backend=backend)

    expect_mismatch(c, call, "on gloo", "different backends")
    c.Free()


@case
def checked_rank_skips_a_collective(comm):
    size = comm.size
    for backend in BACKENDS:
        c = checked(comm)

        def call(rank):
            if not (rank == size - 1 and size > 1):
                c.Allreduce(mcr.IN_PLACE, data(rank), backend=backend)
            c.Barrier(backend=backend)

        expect_mismatch(c, call, "Barrier", "Allreduce float32[4] SUM", "Barrier", "#1")
        # every rank raised at its first call: the calls are in step again
        c.Free()


@case
def checked_constructors_are_matched_too(comm):
    # MPI's constructors block and cannot be interrupted: checked, a rank that
    # calls another constructor (or Free), or a collective, makes every rank
    # raise first
    size, rank = comm.size, comm.rank
    last = size - 1
    c = checked(comm)
    made = []

    def split_or_dup(r):
        made.append(c.Dup() if r == last and size > 1 else c.Split(0, -r))

    expect_mismatch(c, split_or_dup, "Dup #1", "different operations", "Split #1")

    def clone_or_barrier(r):
        if r == last and size > 1:
            c.Barrier()
        else:
            made.append(c.Clone())

    expect_mismatch(c, clone_or_barrier, "Barrier #3", "different operations", "Clone #3")
    # constructors that agree work, and count in the sequence like collectives
    s = c.Split(0, -rank)
    assert s.size == size and s.rank == last - rank and s.checked
    d = c.Dup()
    assert d.size == size and d.checked
    assert_allreduce_works(s)
    assert_allreduce_works(d)
    if size > 1:
        exc = raises(mcr.MismatchError, lambda: c.Barrier() if rank == last else c.Clone())
        assert "Clone #7" in str(exc) and "Barrier #7" in str(exc), str(exc)
    else:
        made.append(c.Clone())
    assert_allreduce_works(c)
    # Free is collective too: the others would wait for the one that freed
    if size > 1:
        exc = raises(mcr.MismatchError, lambda: c.Barrier() if rank == last else c.Free())
        assert "Free #9" in str(exc) and "Barrier #9" in str(exc), str(exc)
        assert_allreduce_works(c)   # not freed
    for each in (*made, d, s, c):
        each.Free()


@case
def checked_nonblocking_mismatch(comm):
    size = comm.size
    for backend in BACKENDS:
        c = checked(comm)

        def call(rank):
            n = 3 if rank == size - 1 and size > 1 else 4
            c.Iallgather(data(rank, n), torch.zeros(n * size), backend=backend).Wait()

        expect_mismatch(c, call, "float32[3]", "different counts", "Allgather")
        c.Free()


@case
def checked_blocking_against_nonblocking(comm):
    size = comm.size
    c = checked(comm)

    def call(rank):
        if rank == size - 1 and size > 1:
            c.Iallreduce(mcr.IN_PLACE, data(rank)).Wait()
        else:
            c.Allreduce(mcr.IN_PLACE, data(rank))

    expect_mismatch(c, call, "Iallreduce", "forms", "Allreduce float32[4] SUM #1",
                    "Iallreduce float32[4] SUM #1")
    # a timeout set on one rank only makes its blocking calls non-blocking ones
    c.timeout = TIMEOUT if c.rank == 0 else None
    x = data(c.rank)
    if size > 1:
        exc = raises(mcr.MismatchError, c.Allreduce, mcr.IN_PLACE, x)
        assert "forms" in str(exc) and "rank 0: Iallreduce" in str(exc), str(exc)
    c.timeout = None
    c.Allreduce(mcr.IN_PLACE, x)
    assert torch.equal(x, sum(data(r) for r in range(size)))
    c.Free()


@case
def checked_root_only_refusal_raises_everywhere(comm):
    size, rank = comm.size, comm.rank
    for backend in BACKENDS:
        c = checked(comm)
        # the root's receive buffer is too small: only the root can tell
        recv = torch.zeros(size - 1 if size > 1 else 0) if rank == 0 else None
        if rank == 0:
            exc = raises(ValueError, c.Gather, data(rank, 1), recv, root=0, backend=backend)
            assert "recvbuf" in str(exc)
        else:
            exc = raises(mcr.MismatchError, c.Gather, data(rank, 1), recv, root=0,
                         backend=backend)
            assert "the arguments of rank 0 were refused" in str(exc), str(exc)
            assert "recvbuf" in str(exc)
        out = torch.zeros(size) if rank == 0 else None
        c.Gather(data(rank, 1), out, root=0, backend=backend)
        if rank == 0:
            assert torch.equal(out, torch.tensor([10.0 * r for r in range(size)]))
        c.Free()


@case
def checked_vector_counts_that_do_not_add_up(comm):
    size, rank = comm.size, comm.rank
    for backend in BACKENDS:
        c = checked(comm)

        def call(rank):
            # the root expects 2 from each rank; the last rank sends 3
            n = 3 if rank == size - 1 and size > 1 else 2
            recv = [torch.zeros(2 * size), [2] * size] if rank == 0 else None
            c.Gatherv(data(rank, n), recv, root=0, backend=backend)

        expect_mismatch(c, call, "send 3", "do not add up",
                        f"send {2 * size + 1} elements in all and receive {2 * size}")
        c.Free()


# -- Timeouts -----------------------------------------------------------------------

def timed(comm):
    c = comm.Dup()
    c.timeout = TIMEOUT
    return c


def checked_and_timed(comm):
    """A duplicate in checked mode with a timeout, whose private communicator
    (for the fingerprints) exists already."""
    c = timed(comm)
    c.checked = True
    c.Barrier()
    return c


def expect_timeout(call, *words):
    t0 = time.monotonic()
    exc = raises(mcr.TimeoutError, call)
    took = time.monotonic() - t0
    assert TIMEOUT * 0.9 <= took < TIMEOUT + SLACK, took
    for word in words:
        assert word in str(exc), (word, str(exc))
    return exc


@case
def dropped_request_is_pending_until_it_completes(comm):
    # a request dropped before it completes (comm.Isend(...) as a statement)
    # stays among the pending calls a TimeoutError lists until its operation
    # completes, then goes: a small message (inside the header on Gloo) and a
    # large one
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    peer, source = (rank + 1) % size, (rank - 1) % size
    for backend in BACKENDS:
        c = timed(comm)
        for n in (4, 1 << 15):
            c.Isend(data(rank, n), dest=peer, tag=3, backend=backend)
            y = torch.zeros(n)
            c.Recv(y, source=source, tag=3, backend=backend)
            assert torch.equal(y, data(source, n))
            c.Barrier()                 # every send has been received
            req = c.Irecv(torch.zeros(1), source=source, tag=99)
            exc = expect_timeout(req.Wait, "Recv float32[1]")
            assert [p["op"] for p in exc.pending] == ["Recv"], (backend, n, exc.pending)
            c.Barrier()                 # every rank has timed out
            c.Send(torch.zeros(1), dest=peer, tag=99)
            req.Wait()
        c.Free()


@case
def timeout_names_the_pending_calls(comm):
    size, rank = comm.size, comm.rank
    last = size - 1
    for backend in BACKENDS:
        c = timed(comm)
        assert c.timeout == TIMEOUT and c.Dup().timeout == TIMEOUT    # (Dup: c's #1)
        if size == 1:
            # a receive nobody sends: the wait times out, the request stays usable
            req = c.Irecv(y := torch.zeros(4), source=0, tag=9, backend="mpi")
            exc = expect_timeout(req.Wait, "Recv float32[4] from 0 tag 9")
            assert [p["op"] for p in exc.pending] == ["Recv"]
            c.Send(data(0), dest=0, tag=9)
            req.Wait()
            assert torch.equal(y, data(0))
            c.Free()
            break
        x = data(rank)
        if rank != last:
            # the last rank skipped this Allreduce: it waits for rank 0's message
            exc = expect_timeout(lambda: c.Allreduce(mcr.IN_PLACE, x, backend=backend),
                                 "Allreduce float32[4] SUM #2", f"[{backend}, blocking]")
            assert exc.pending[-1]["op"] == "Allreduce" and exc.pending[-1]["seq"] == 2
        else:
            y = torch.zeros(4)
            exc = expect_timeout(lambda: c.Recv(y, source=0, tag=9, backend=backend),
                                 "Recv float32[4] from 0 tag 9")
            assert exc.pending[-1]["peer"] == 0 and exc.pending[-1]["tag"] == 9
        assert isinstance(exc.request, mcr.Request)
        # (the parent) every rank has timed out before the last one joins the
        # Allreduce: the clocks of the ranks start apart (the first Gloo call
        # connects the group), and a last rank that joined at its own timeout
        # could complete the others' Allreduce before theirs
        comm.Barrier()
        # undo the mistake: the pending calls complete
        if rank == last:
            c.Allreduce(mcr.IN_PLACE, x, backend=backend)
            exc.request.Wait()
            assert torch.equal(y, data(0))
        else:
            exc.request.Wait()
            if rank == 0:
                c.Send(data(0), dest=last, tag=9, backend=backend)
        assert torch.equal(x, sum(data(r) for r in range(size)))
        c.Free()


@case
def timeout_in_waitall_and_waitany(comm):
    size, rank = comm.size, comm.rank
    c = timed(comm)
    peer = (rank + 1) % size
    y = torch.zeros(4)
    req = c.Irecv(y, source=(rank - 1) % size, tag=3)
    exc = expect_timeout(lambda: mcr.Request.Waitall([req]), "Recv float32[4]")
    assert exc.request is None and exc.pending[0]["tag"] == 3
    expect_timeout(lambda: mcr.Request.Waitany([req]), "Recv float32[4]")
    c.Barrier()                    # no message is sent before every rank timed out
    c.Send(data(rank), dest=peer, tag=3)
    mcr.Request.Waitall([req])
    assert torch.equal(y, data((rank - 1) % size))
    c.Free()


@case
def timeout_in_a_backends_set_up(comm):
    # the first call on Gloo sets it up over the whole communicator: a
    # point-to-point exchange between ranks 0 and 1 that the others never
    # join on Gloo waits there, and the timeout turns that into an error
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    c = timed(comm)
    if rank == 0:
        exc = expect_timeout(lambda: c.Send(data(0), dest=1, tag=4, backend="gloo"),
                             "every process of", "first call on backend 'gloo'",
                             "collectively over the communicator",
                             "Send float32[4] to 1 tag 4 on")
        assert exc.pending[-1]["backend"] == "gloo" and exc.pending[-1]["peer"] == 1
        # a second try waits for the same set-up, and times out again
        expect_timeout(lambda: c.Send(data(0), dest=1, tag=4, backend="gloo"),
                       "first call on backend 'gloo'")
    comm.Barrier()              # (the parent) now every rank makes a first call on Gloo
    if rank == 0:
        c.Send(data(0), dest=1, tag=4, backend="gloo")
    elif rank == 1:
        c.Recv(y := torch.zeros(4), source=0, tag=4, backend="gloo")
        assert torch.equal(y, data(0))
    else:
        assert c.Iprobe(source=0, tag=4, backend="gloo") is False
    assert_allreduce_works(c, "gloo")
    c.Free()


@case
def timeout_in_free_with_a_backend(comm):
    # Free is collective: with a Gloo sub-communicator it waits for every
    # process (MPI_Comm_free alone returns at once), so the timeout bounds it
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    c = timed(comm)
    c.Barrier(backend="gloo")
    last = size - 1
    if rank != last:
        expect_timeout(c.Free, "every process of", "to free the communicator",
                       "'gloo' sub-communicator")
    comm.Barrier()              # (the parent) now the last rank frees it too
    c.Free()                    # the others: waits for the same barrier again
    raises(ValueError, c.Barrier)
    c.Free()                    # freed: nothing to do


def objects_results(c):
    """Every collective of mpi4py's on pickled objects, on `c`, each result
    checked against one computed here: they work as on mpi4py."""
    size, rank = c.size, c.rank
    c.barrier()
    assert c.bcast({"from": rank}, root=size - 1) == {"from": size - 1}
    gathered = c.gather(("r", rank), root=0)
    assert gathered == ([("r", r) for r in range(size)] if rank == 0 else None), gathered
    assert c.scatter([r * r for r in range(size)] if rank == 0 else None, root=0) == rank * rank
    assert c.allgather(rank) == list(range(size))
    assert c.alltoall([(rank, r) for r in range(size)]) == [(r, rank) for r in range(size)]
    total = c.reduce(rank + 1, op=mcr.SUM, root=0)
    assert total == (size * (size + 1) // 2 if rank == 0 else None), total
    assert c.allreduce(rank, op=mcr.MAX) == size - 1
    assert c.scan(rank + 1) == (rank + 1) * (rank + 2) // 2
    prefix = c.exscan(rank + 1)
    assert prefix == (None if rank == 0 else rank * (rank + 1) // 2), prefix


@case
def collectives_on_objects_are_watched_too(comm):
    # mpi4py's methods on pickled objects (bcast, gather, ...) block inside
    # MPI as well: on a watched communicator they are numbered among the
    # collectives and meet first, so that a rank that skips one is a
    # TimeoutError on the others (the same call made again waits for the same
    # meeting), and checked, one that calls another, or with another root, is
    # a MismatchError on every rank
    size, rank = comm.size, comm.rank
    last = size - 1
    c = timed(comm)
    objects_results(c)                          # #1-#10
    if size > 1:
        if rank != last:
            exc = expect_timeout(lambda: c.bcast({"k": rank}, root=0), "every process of",
                                 "to call bcast (a collective on pickled objects)")
            assert (exc.pending[-1]["op"], exc.pending[-1]["seq"],
                    exc.pending[-1]["desc"]) == ("bcast", 11, "bcast root=0"), exc.pending
            expect_timeout(lambda: c.bcast({"k": rank}, root=0), "to call bcast")
        comm.Barrier()                          # (the parent) now the last rank calls it too
        assert c.bcast({"k": rank}, root=0) == {"k": 0}
    objects_results(c)
    assert_allreduce_works(c)
    d = checked(comm)
    objects_results(d)                          # #1-#10
    expect_mismatch(d, lambda r: d.gather(r) if r == last and size > 1 else d.bcast(r),
                    "gather root=0 #11", "different operations", "bcast root=0 #11")
    expect_mismatch(d, lambda r: d.bcast(r, root=min(r, 1)), "bcast root=1 #13",
                    "different roots", "bcast root=0 #13")
    expect_mismatch(d, lambda r: d.allreduce(r) if r == last and size > 1 else d.Dup(),
                    "allreduce #15", "different operations", "Dup #15")
    objects_results(d)
    for each in (c, d):
        each.Free()
        # on a freed communicator: mpi4py's error, as on mpi4py (no meeting, no number)
        exc = raises(mpi4py.MPI.Exception, lambda: each.bcast(1))
        assert "MPI_ERR_COMM" in str(exc), str(exc)


def objects_p2p_results(c):
    """mpi4py's point-to-point methods on pickled objects, around a ring on
    `c`, each result checked against one computed here: they work as on
    mpi4py."""
    size, rank = c.size, c.rank
    peer, source = (rank + 1) % size, (rank - 1) % size
    st = mcr.Status()
    c.send({"from": rank, "x": list(range(rank + 2))}, dest=peer, tag=5)
    assert c.recv(source=source, tag=5, status=st) == {"from": source,
                                                        "x": list(range(source + 2))}
    assert (st.Get_source(), st.Get_tag()) == (source, 5)
    big = torch.arange(1 << 17, dtype=torch.float64) * (rank + 1)  # 1 MiB: not eager
    got = c.sendrecv(big, dest=peer, sendtag=6, source=source, recvtag=6, status=st)
    assert torch.equal(got, torch.arange(1 << 17, dtype=torch.float64) * (source + 1))
    assert (st.Get_source(), st.Get_tag()) == (source, 6) and st.Get_count() > 1 << 20
    if size > 1:                        # (a synchronous send to oneself never completes)
        if rank % 2 == 0:
            c.ssend(rank * 10, dest=peer, tag=7)
        assert c.recv(None, source, 7) == source * 10
        if rank % 2 == 1:
            c.ssend(rank * 10, dest=peer, tag=7)
    c.send(("probed", rank), dest=peer, tag=8)
    assert c.probe(source=source, tag=8, status=st) is True and st.Get_source() == source
    assert c.mprobe(source, 8).recv() == ("probed", source)
    # PROC_NULL: nothing sent, an empty receive
    c.send(1, dest=mpi4py.MPI.PROC_NULL)
    assert c.recv(source=mpi4py.MPI.PROC_NULL) is None
    # the non-blocking ones, completed by mpi4py's lowercase methods
    reqs = [c.irecv(source=source, tag=12), c.isend({"i": rank}, dest=peer, tag=12)]
    assert mcr.Request.waitall(reqs) == [{"i": source}, None]
    r = c.irecv(source=source, tag=13)
    s = c.issend(rank, dest=peer, tag=13)
    flag, got = r.test()
    while not flag:
        flag, got = r.test()
    assert got == source and s.wait() is None


@case
def point_to_point_on_objects_is_timed_too(comm):
    # mpi4py's send, recv, ... on pickled objects block inside MPI as well:
    # with a timeout they are polled, so that a receive whose message never
    # comes, or a synchronous send never received, is a TimeoutError naming
    # it. A receive or probe that timed out leaves nothing posted (the next
    # one gets the message); a send leaves its request, to wait for again
    size, rank = comm.size, comm.rank
    last = size - 1
    big = torch.arange(1 << 17, dtype=torch.float64)
    objects_p2p_results(comm)
    c = timed(comm)
    objects_p2p_results(c)
    if size > 1:
        if rank != last:
            exc = expect_timeout(lambda: c.recv(source=last, tag=9),
                                 f"waiting for recv from {last} tag 9 on ", "[mpi]")
            assert {k: exc.pending[-1][k] for k in ("op", "seq", "peer", "tag", "bytes")} \
                == {"op": "recv", "seq": None, "peer": last, "tag": 9, "bytes": -1}, exc.pending
            expect_timeout(lambda: c.probe(last, 9), f"probe from {last} tag 9")
            expect_timeout(lambda: c.mprobe(tag=9), "mprobe from any tag 9")
            if rank == 0:       # a send whose receive comes late, and a sendrecv
                exc = expect_timeout(lambda: c.ssend(["late"], dest=last, tag=10),
                                     f"waiting for ssend to {last} tag 10")
                late = exc.request
                assert exc.pending[-1]["op"] == "ssend" and exc.pending[-1]["bytes"] > 0
                exc = expect_timeout(lambda: c.sendrecv("there", last, 11, None, last, 12),
                                     f"sendrecv to {last} tag 11, from {last} tag 12")
                assert isinstance(exc.request, mcr.Request) and exc.received is None
                # a sendrecv whose receive completes (the last rank sent it
                # first) but whose send (1 MiB: not eager) is not received:
                # the object received comes with the error
                exc = expect_timeout(lambda: c.sendrecv(big, last, 16, None, last, 17),
                                     f"sendrecv to {last} tag 16, from {last} tag 17")
                assert exc.received == ("seventeen", 0), exc.received
                late_big = exc.request
        else:
            c.send(("seventeen", 0), dest=0, tag=17)
        comm.Barrier()          # (the parent) every rank has timed out: now the last
        if rank == last:        # rank receives and sends what the others waited for
            assert c.recv(source=0, tag=10) == ["late"]
            assert c.recv(source=0, tag=11) == "there"
            assert torch.equal(c.recv(source=0, tag=16), big)
            for r in range(last):
                c.send(("nine", r), dest=r, tag=9)
        else:
            if rank == 0:
                late.Wait()
                late_big.Wait()
            assert c.recv(source=last, tag=9) == ("nine", rank)
    objects_p2p_results(c)
    # the non-blocking ones are mcr Requests on it, whose lowercase waits time out
    r = c.irecv(source=last, tag=14)
    plain = comm.irecv(None, rank, 15)              # (unwatched: mpi4py's own request)
    assert isinstance(r, mcr.Request) and not isinstance(plain, mcr.Request)
    if rank != last:
        exc = expect_timeout(r.wait, f"waiting for irecv from {last} tag 14 on ")
        assert (exc.pending[-1]["op"], exc.pending[-1]["form"]) == ("irecv", "nonblocking")
        expect_timeout(lambda: mcr.Request.waitall([r]), f"irecv from {last} tag 14")
        expect_timeout(lambda: mcr.Request.waitany([r]), f"irecv from {last} tag 14")
    comm.Barrier()              # (the parent) every rank has timed out: now they send
    comm.send(rank, dest=rank, tag=15)
    assert plain.wait() == rank
    if rank == last:
        for r2 in range(size):
            c.isend(("fourteen", r2), dest=r2, tag=14).wait()
    assert r.wait() == ("fourteen", rank)
    # nothing left pending on this process: a timeout lists no call
    exc = expect_timeout(lambda: c.recv(source=rank, tag=13), f"recv from {rank} tag 13")
    assert len(exc.pending) == 1, exc.pending
    c.Free()


@case
def a_short_receive_buffer_truncates_as_on_mpi4py(comm):
    # recv(buf) and sendrecv(recvbuf=...) on pickled objects: a message longer
    # than the buffer is MPI's truncation error, on mpi4py's own path and
    # when a timeout polls the receive; the next message still comes; the
    # deprecated argument warns as mpi4py's does. (Around a ring: Open MPI
    # does not report truncation of a message to oneself.)
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    peer, source = (rank + 1) % size, (rank - 1) % size
    long, short = list(range(100)), [rank]
    c = timed(comm)
    for each in (comm, c):
        for call in ("recv", "sendrecv"):
            each.send(long, dest=peer, tag=3)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                if call == "recv":
                    exc = raises(mpi4py.MPI.Exception,
                                 lambda: each.recv(bytearray(16), source, 3))
                else:
                    exc = raises(mpi4py.MPI.Exception,
                                 lambda: each.sendrecv(short, peer, 4, bytearray(16),
                                                       source, 3))
            assert exc.Get_error_class() == mpi4py.MPI.ERR_TRUNCATE, (each, call, exc)
            assert any("'buf' argument is deprecated" in str(w.message) for w in seen)
            if call == "sendrecv":
                assert each.recv(source=source, tag=4) == [source]
            each.send(short, dest=peer, tag=5)
            assert each.recv(bytearray(64), source, 5) == [source]
    c.Free()


@case
def timeout_in_making_a_communicator(comm):
    # the last rank skips a Split, then a Dup: MPI's constructors block
    # uninterruptibly, so with a timeout the others meet in a polled barrier
    # first, and raise there
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    c = timed(comm)
    last = size - 1
    if rank != last:
        expect_timeout(lambda: c.Split(0, -rank), "every process of",
                       "to call Split (making a communicator is collective)")
        expect_timeout(c.Dup, "to call Dup")   # waits for the same barrier again
    comm.Barrier()              # (the parent) now the last rank calls Split too
    s = c.Split(0, -rank)       # the others: the barrier left pending, then MPI's Split
    assert s.size == size and s.rank == last - rank and s.timeout == TIMEOUT
    assert_allreduce_works(s)
    d = c.Dup()
    assert d.size == size and d.timeout == TIMEOUT
    assert_allreduce_works(d)
    for each in (d, s, c):
        each.Free()


@case
def dups_with_hints_and_nonblocking_dups_are_watched(comm):
    # Dup_with_info blocks in MPI as Dup does: a rank that skips it is a
    # TimeoutError on the others. Idup does not wait at the call: its request
    # times out instead, then completes once every rank has called it. Each
    # copy keeps the timeout and backend; checked, Idup against Dup is a mismatch
    size, rank = comm.size, comm.rank
    last = size - 1
    c = timed(comm)
    c.backend = "gloo"
    if rank != last:
        expect_timeout(lambda: c.Dup_with_info(mpi4py.MPI.INFO_NULL),
                       "to call Dup_with_info (making a communicator is collective)")
    comm.Barrier()              # (the parent) now the last rank calls it too
    hinted = c.Dup_with_info(mpi4py.MPI.INFO_NULL)
    assert hinted.timeout == TIMEOUT and hinted.backend == "gloo"
    assert_allreduce_works(hinted, "gloo")
    if rank != last:
        copy, req = c.Idup()
        assert isinstance(req, mcr.Request)
        exc = expect_timeout(req.Wait, "waiting for Idup #2")
        assert [p["op"] for p in exc.pending] == ["Idup"], exc.pending
    comm.Barrier()
    if rank == last:
        copy, req = c.Idup()
    req.Wait()
    assert copy.timeout == TIMEOUT and copy.backend == "gloo"
    assert_allreduce_works(copy)
    copy2, req2 = c.Idup_with_info(mpi4py.MPI.INFO_NULL)
    mcr.Request.Waitall([req2])
    assert_allreduce_works(copy2, "gloo")
    for each in (copy2, copy, hinted, c):
        each.Free()
    k = checked(comm)
    made = []

    def idup_or_dup(r):
        if r == last and size > 1:
            made.append(k.Dup())
        else:
            copy, req = k.Idup()
            req.Wait()
            made.append(copy)

    expect_mismatch(k, idup_or_dup, "Dup #1", "different operations", "Idup #1")
    for each in made + [k]:
        each.Free()


@case
def topologies_are_watched_as_constructors(comm):
    # Create_cart, the graph constructors and Cartcomm.Sub block in MPI as Split
    # does: a rank that skips one is a TimeoutError on the others, and the
    # topology keeps the timeout; checked, another constructor is a mismatch
    size, rank = comm.size, comm.rank
    last = size - 1
    c = timed(comm)
    if rank != last:
        expect_timeout(lambda: c.Create_cart([size]), "every process of",
                       "to call Create_cart (making a communicator is collective)")
    comm.Barrier()              # (the parent) now the last rank calls it too
    ring = c.Create_cart([size], periods=[True])
    assert isinstance(ring, mcr.Cartcomm) and ring.timeout == TIMEOUT
    assert_allreduce_works(ring)
    if rank != last:
        expect_timeout(lambda: ring.Sub([True]), "to call Sub")
    comm.Barrier()
    sub = ring.Sub([True])
    assert isinstance(sub, mcr.Cartcomm) and sub.timeout == TIMEOUT
    assert_allreduce_works(sub)
    left, right = (rank - 1) % size, (rank + 1) % size
    if rank != last:
        expect_timeout(lambda: c.Create_dist_graph_adjacent([left], [right]),
                       "to call Create_dist_graph_adjacent")
    comm.Barrier()
    graph = c.Create_dist_graph_adjacent([left], [right])
    assert isinstance(graph, mcr.Distgraphcomm) and graph.timeout == TIMEOUT
    assert_allreduce_works(graph)
    for each in (graph, sub, ring, c):
        each.Free()
    k = checked(comm)
    made = []

    def cart_or_dup(r):
        made.append(k.Dup() if r == last and size > 1 else k.Create_cart([size]))

    expect_mismatch(k, cart_or_dup, "Dup #1", "different operations", "Create_cart #1")
    grid = k.Create_cart([size])
    assert isinstance(grid, mcr.Cartcomm) and grid.checked
    assert_allreduce_works(grid)

    def sub_or_barrier(r):
        if r == last and size > 1:
            grid.Barrier()
        else:
            made.append(grid.Sub([True]))

    expect_mismatch(grid, sub_or_barrier, "Barrier #2", "different operations", "Sub #2")
    for each in made + [grid, k]:
        each.Free()


@case
def neighborhood_collectives_are_watched(comm):
    # mpi4py's neighborhood collectives block in MPI: with a timeout a rank
    # that skips one is a TimeoutError on the others (Neighbor_alltoall at
    # the call; the non-blocking Ineighbor_allgather in its Wait, on the
    # skipper's neighbours only), and the calls complete once it comes;
    # checked, another collective is a mismatch
    size, rank = comm.size, comm.rank
    last = size - 1
    c = timed(comm)
    ring = c.Create_cart([size], periods=[True])
    left, right = ring.Shift(0, 1)
    blocks = torch.cat([data(rank) + 100 * left, data(rank) + 100 * right])
    got = torch.zeros(8)
    if rank != last:
        expect_timeout(lambda: ring.Neighbor_alltoall(blocks, got),
                       "to call Neighbor_alltoall (a neighborhood collective)")
    comm.Barrier()              # (the parent) now the last rank calls it too
    ring.Neighbor_alltoall(blocks, got)
    # the left neighbour's block for its right neighbour, then the right one's for its left
    assert torch.equal(got, torch.cat([data(left) + 100 * rank, data(right) + 100 * rank]))
    gathered = torch.zeros(8)
    if rank != last:
        req = ring.Ineighbor_allgather(data(rank), gathered)
        assert isinstance(req, mcr.Request)
        if last in (left, right):
            exc = expect_timeout(req.Wait, "waiting for Ineighbor_allgather #2")
            assert [p["op"] for p in exc.pending] == ["Ineighbor_allgather"], exc.pending
            # mpi4py moves the data: its size is not known here, and not shown as 0
            assert exc.pending[0]["bytes"] == -1 and " bytes" not in str(exc), str(exc)
    comm.Barrier()
    if rank == last:
        req = ring.Ineighbor_allgather(data(rank), gathered)
    req.Wait()
    assert torch.equal(gathered, torch.cat([data(left), data(right)]))
    # composed on Gloo (an Alltoallv of the whole communicator): every rank
    # that waits times out, then gets its neighbours' blocks (the first
    # composed call made first, by every rank: it sets up the private
    # communicators and their Gloo groups, collectively)
    swapped = torch.zeros(8)
    ring.Ineighbor_alltoall(blocks, swapped, backend="gloo").Wait()
    swapped.zero_()
    if rank != last:
        req = ring.Ineighbor_alltoall(blocks, swapped, backend="gloo")
        exc = expect_timeout(req.Wait, "waiting for Ineighbor_alltoall #", "[gloo]")
        assert [p["op"] for p in exc.pending] == ["Ineighbor_alltoall"], exc.pending
    comm.Barrier()
    if rank == last:
        req = ring.Ineighbor_alltoall(blocks, swapped, backend="gloo")
    req.Wait()
    assert torch.equal(swapped, got)
    ring.Free()
    c.Free()
    k = checked(comm)
    grid = k.Create_cart([size], periods=[True])

    def gather_or_barrier(r):
        if r == last and size > 1:
            grid.Barrier()
        else:
            assert grid.neighbor_allgather(r) == [(r - 1) % size, (r + 1) % size]

    expect_mismatch(grid, gather_or_barrier, "Barrier #1", "different operations",
                    "neighbor_allgather #1")
    grid.Free()
    k.Free()


@case
def checked_and_timed_fingerprint_exchange_times_out(comm):
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    c = checked_and_timed(comm)
    last = size - 1
    if rank != last:
        expect_timeout(lambda: c.Allreduce(mcr.IN_PLACE, data(rank)),
                       "checked mode's fingerprint exchange", "Allreduce float32[4] SUM #2")
        # memory that the exchange's buffers would be reused for, were they freed
        canaries = [bytearray(b"\xab" * (512 * size + n)) for n in range(-8, 8) for _ in range(8)]
    comm.Barrier()              # (the parent) now the last rank comes, late: its
    if rank == last:            # exchange completes the others', then its Allreduce waits
        expect_timeout(lambda: c.Allreduce(mcr.IN_PLACE, data(rank)), "Allreduce")
    comm.Barrier()              # (driving MPI: the others' exchange receives its fingerprint)
    if rank != last:
        assert all(b == b"\xab" * len(b) for b in canaries), "freed memory was written"
    # the exchange left pending makes the communicator unusable, so this one is
    # not freed


@case
def checked_and_timed_first_exchange_times_out_then_works(comm):
    # the first checked call makes the private communicator (MPI_Comm_idup,
    # collective): the last rank comes late, the others time out there, and
    # once it has come the same call works on every rank
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    c = timed(comm)
    c.checked = True
    last = size - 1
    if rank != last:
        expect_timeout(lambda: c.Allreduce(mcr.IN_PLACE, data(rank)),
                       "making the checked communicator's private copy")
    comm.Barrier()              # (the parent) now the last rank comes too
    assert_allreduce_works(c)
    assert_allreduce_works(c)
    c.Free()


@case
def checked_and_timed_constructor_times_out(comm):
    # the last rank skips a Split: checked, the others wait in the fingerprint
    # exchange (polled), not in MPI's constructor, and raise at the timeout
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    c = checked_and_timed(comm)
    if rank != size - 1:
        expect_timeout(lambda: c.Split(0, rank), "checked mode's fingerprint exchange",
                       "Split #2")
    # as in the case above, the exchange left pending makes the communicator
    # unusable, so this one is not freed


@case
def bad_timeout_values_are_refused(comm):
    c = comm.Dup()
    raises(ValueError, setattr, c, "timeout", -1)
    raises(TypeError, setattr, c, "timeout", "soon")
    c.timeout = 0
    assert c.timeout is None
    c.timeout = None
    assert c.timeout is None and not c.checked
    c.Free()


test_mpi = mpi_cases(__name__)
