"""Hangs turned into errors, on MPI and Gloo. Checked mode: when the last rank calls another
collective, root, count, type, op, backend or form, or skips one, every rank raises MismatchError
before any communicates. Timeouts: every rank that waits raises TimeoutError within the timeout,
naming its pending calls. Then the communicator works. Expected values: torch on the whole data."""

import json
import os
import shutil
import tempfile
import threading
import time
import warnings

import mpi4py.MPI
import numpy as np
import torch

import mcr
from mcr import _core
from mpiharness import LAYER_SIZES, case, mpi_cases
from opmatrix import run_operation

BACKENDS = ("mpi", "gloo")
OTHER = {"mpi": "gloo", "gloo": "mpi"}
TIMEOUT = 0.25
SLACK = 20.0        # a loaded 2-core machine: well before the harness's timeout, not to the ms


def raises(exc_type, fn, *args, **kwargs):
    """The `exc_type` exception that fn(*args, **kwargs) raises."""
    try:
        fn(*args, **kwargs)
    except exc_type as exc:
        return exc
    raise AssertionError(f"{exc_type.__name__} not raised by {fn}")


def data(rank, n=4, dtype=torch.float32):
    return torch.arange(n, dtype=dtype) + 10 * rank


def assert_allreduce_works(c, backend="mpi"):
    """An Allreduce on `c` sums every rank's data: the communicator works."""
    x = data(c.rank)
    c.Allreduce(mcr.IN_PLACE, x, backend=backend)
    assert torch.equal(x, sum(data(r) for r in range(c.size)))


def checked(comm):
    c = comm.Dup()
    c.checked = True
    return c


def checked_ring(comm):
    """A checked duplicate of `comm`, and a periodic ring over it."""
    k = checked(comm)
    return k, k.Create_cart([comm.size], periods=[True])


def timed(comm, check=False):
    """A duplicate of `comm` with the timeout (then checked, where `check`)."""
    c = comm.Dup()
    c.timeout = TIMEOUT
    if check:
        c.checked = True
    return c


def free(*comms):
    for c in comms:
        c.Free()


def expect_mismatch(c, call, deviant, *words):
    """call(odd), `odd` on the last rank only: every rank raises MismatchError naming `words`,
    the last rank's call showing `deviant` (at one rank it works). Then `c` still works."""
    size = c.size
    if size == 1:
        call(False)
    else:
        exc = raises(mcr.MismatchError, call, c.rank == size - 1)
        assert all(word in str(exc) for word in words), (words, str(exc))
        assert len(exc.calls) == size, exc.calls
        assert deviant in exc.calls[size - 1] or deviant in str(exc), exc.calls
    assert_allreduce_works(c)


def expect_timeout(call, *words):
    """call() raises TimeoutError naming `words`, within the timeout: the error."""
    t0 = time.monotonic()
    exc = raises(mcr.TimeoutError, call)
    took = time.monotonic() - t0
    assert TIMEOUT * 0.9 <= took < TIMEOUT + SLACK, took
    assert all(word in str(exc) for word in words), (words, str(exc))
    return exc


def refused_at_rank0(rank, words, fn, *args, **kwargs):
    """fn(*args, **kwargs), checked, refused at rank 0 alone (ValueError): every other rank
    raises MismatchError naming rank 0's refusal. Each of `words` is in every rank's error."""
    exc = raises(ValueError if rank == 0 else mcr.MismatchError, fn, *args, **kwargs)
    assert all(word in str(exc) for word in words), (words, str(exc))
    assert rank == 0 or "the arguments of rank 0 were refused" in str(exc), str(exc)
    return exc


def late(comm, call, *words, again=None):
    """The last rank comes late to call(): the others time out naming `words` (then again[0]()
    naming again[1:]); once `comm` lets the last come, it works. (Their error, its result.)"""
    exc = None
    if comm.rank != comm.size - 1:
        exc = expect_timeout(call, *words)
        if again:
            expect_timeout(*again)
    comm.Barrier()              # (the parent) every rank has timed out: now the last comes
    return exc, call()


def late_request(comm, start, op, *words, waits=True):
    """start() posts `op` (its request, or a tuple ending in it), the last rank late: where
    `waits`, the others' Wait times out naming `words`. (Their error, start's result.)"""
    last, exc, got = comm.rank == comm.size - 1, None, None
    if not last:
        got = start()
        req = got[-1] if isinstance(got, tuple) else got
        assert isinstance(req, mcr.Request), req
        if waits:
            exc = expect_timeout(req.Wait, *words)
            assert [p["op"] for p in exc.pending] == [op], exc.pending
    comm.Barrier()              # (the parent)
    got = start() if last else got
    (got[-1] if isinstance(got, tuple) else got).Wait()
    return exc, got


# -- Checked mode ----------------------------------------------------------------------

@case.matrix(backend=BACKENDS)
def checked_calls_that_agree_run_as_usual(comm, backend):
    # (the matrix's vector makers: counts that differ by rank, legitimately)
    c = checked(comm)
    assert c.checked and c.Dup().checked and c.Split(0, comm.rank).checked
    for op in ("Allreduce", "Bcast", "Gatherv", "Allgatherv", "Alltoallv", "Barrier"):
        run_operation(c, op, backend, "blocking", [torch.float32])
    run_operation(c, "Allreduce", backend, "nonblocking", [torch.float32])
    c.Free()


def allreduce(c, backend, n=4, dtype=torch.float32, op=mcr.SUM, compress=None):
    c.Allreduce(mcr.IN_PLACE, data(c.rank, n, dtype), op, backend=backend, compress=compress)


def skip_then_barrier(c, odd, backend):
    if not odd:
        allreduce(c, backend)
    c.Barrier(backend=backend)


def iallgather(c, odd, backend):
    n = 3 if odd else 4
    c.Iallgather(data(c.rank, n), torch.zeros(n * c.size), backend=backend).Wait()


def gatherv_one_too_many(c, odd, backend):
    # the root expects 2 from each rank; the last rank sends 3
    recv = [torch.zeros(2 * c.size), [2] * c.size] if c.rank == 0 else None
    c.Gatherv(data(c.rank, 3 if odd else 2), recv, root=0, backend=backend)


def alltoallv_pairs_differ(c, odd, backend):
    # each rank sends 2 to each; the last sends rank 0 one more and rank 1 one less: the
    # totals add up, the pairs do not
    n = 2 * c.size
    counts = [3, 1] + [2] * (c.size - 2) if odd else [2] * c.size
    c.Alltoallv([data(c.rank, n), counts], [torch.zeros(n), [2] * c.size], backend=backend)


# kind: (call(c, odd, backend), `odd` on the last rank; what its call shows; words of
# every rank's message), formatted with {n}: 2 * size, {sent}: 2 * size + 1, {on}: the
# backend as a call names it (MPI, the default, goes unnamed)
MISMATCHES = {
    "operation": (lambda c, odd, b: (c.Bcast(data(0), root=0, backend=b) if odd
                                     else allreduce(c, b)),
                  "Bcast", "different operations", "Allreduce float32[4] SUM",
                  "Bcast float32[4] root=0"),
    "root": (lambda c, odd, b: c.Bcast(data(0), root=int(odd), backend=b),
             "root=1", "different roots", "root=0", "root=1"),
    "count": (lambda c, odd, b: allreduce(c, b, n=5 if odd else 4),
              "float32[5]", "different counts", "float32[4]", "float32[5]"),
    "element_type": (lambda c, odd, b: allreduce(c, b, dtype=torch.float64 if odd
                                                 else torch.float32),
                     "float64[4]", "different element types", "float32[4]"),
    "reduction_op": (lambda c, odd, b: allreduce(c, b, op=mcr.MAX if odd else mcr.SUM),
                     "MAX", "different reduction ops", "SUM", "MAX"),
    "backend": (lambda c, odd, b: allreduce(c, OTHER[b] if odd else b),
                "on gloo", "different backends"),
    "skipped": (skip_then_barrier, "Barrier", "Allreduce float32[4] SUM", "Barrier", "#1"),
    "nonblocking": (iallgather, "float32[3]", "different counts", "Allgather"),
    "form": (lambda c, odd, b: (c.Iallreduce(mcr.IN_PLACE, data(c.rank), backend=b).Wait()
                                if odd else allreduce(c, b)),
             "Iallreduce", "forms", "Allreduce float32[4] SUM{on} #1",
             "Iallreduce float32[4] SUM{on} #1"),
    "vector_counts": (gatherv_one_too_many, "send 3", "do not add up",
                      "send {sent} elements in all and receive {n}"),
    "pair_counts": (alltoallv_pairs_differ, "Alltoallv", "counts that do not match",
                    "sends another a block"),
    "compression": (lambda c, odd, b: allreduce(c, b, compress="fp16" if odd else None),
                    "compressed fp16", "different compression", "Allreduce float32[4] SUM"),
    "codec": (lambda c, odd, b: allreduce(c, b, compress="bf16" if odd else "fp16"),
              "compressed bf16", "different compression", "compressed fp16"),
}


@case.matrix(kind=tuple(MISMATCHES), backend=BACKENDS)
def checked_mismatch(comm, kind, backend):
    call, deviant, *words = MISMATCHES[kind]
    c = checked(comm)
    fill = {"n": 2 * c.size, "sent": 2 * c.size + 1, "on": " on gloo" * (backend == "gloo")}
    expect_mismatch(c, lambda odd: call(c, odd, backend), deviant.format(**fill),
                    *(word.format(**fill) for word in words))
    c.Free()


@case
def checked_with_a_timeout_on_one_rank(comm):
    # a timeout set on one rank only makes its blocking calls non-blocking ones
    c = checked(comm)
    c.timeout = TIMEOUT if c.rank == 0 else None
    if c.size > 1:
        exc = raises(mcr.MismatchError, allreduce, c, "mpi")
        assert "forms" in str(exc) and "rank 0: Iallreduce" in str(exc), str(exc)
    c.timeout = None
    assert_allreduce_works(c)
    c.Free()


@case
def checked_constructors_are_matched_too(comm):
    # MPI's constructors (and Free) cannot be interrupted: checked, they are
    # matched first, numbered among the collectives
    size, rank, last = comm.size, comm.rank, comm.size - 1
    c = checked(comm)
    made = []
    expect_mismatch(c, lambda odd: made.append(c.Dup() if odd else c.Split(0, -rank)),
                    "Dup #1", "different operations", "Split #1")
    expect_mismatch(c, lambda odd: c.Barrier() if odd else made.append(c.Clone()),
                    "Barrier #3", "different operations", "Clone #3")
    s = c.Split(0, -rank)
    assert s.size == size and s.rank == last - rank and s.checked
    d = c.Dup()
    assert d.size == size and d.checked
    assert_allreduce_works(s)
    assert_allreduce_works(d)
    expect_mismatch(c, lambda odd: c.Barrier() if odd else made.append(c.Clone()),
                    "Barrier #7", "Barrier #7", "Clone #7")
    if size > 1:    # Free is collective too: the others would wait for the one that freed
        exc = raises(mcr.MismatchError, lambda: c.Barrier() if rank == last else c.Free())
        assert "Free #9" in str(exc) and "Barrier #9" in str(exc), str(exc)
        assert_allreduce_works(c)   # not freed
    free(*made, d, s, c)


@case.matrix(backend=BACKENDS)
def checked_root_only_refusal_raises_everywhere(comm, backend):
    size, rank = comm.size, comm.rank
    c = checked(comm)
    # the root's receive buffer is too small: only the root can tell
    recv = torch.zeros(max(size - 1, 0)) if rank == 0 else None
    refused_at_rank0(rank, ["recvbuf"], c.Gather, data(rank, 1), recv, root=0, backend=backend)
    out = torch.zeros(size) if rank == 0 else None
    c.Gather(data(rank, 1), out, root=0, backend=backend)
    assert rank != 0 or torch.equal(out, torch.tensor([10.0 * r for r in range(size)]))
    c.Free()


# -- Timeouts ---------------------------------------------------------------------------

@case.matrix(backend=BACKENDS)
def dropped_request_is_pending_until_it_completes(comm, backend):
    # a request dropped before it completes (comm.Isend(...) as a statement) is
    # among the pending calls until it completes: small (in Gloo's header) or large
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    peer, source = (rank + 1) % size, (rank - 1) % size
    c = timed(comm)
    for n in (4, 1 << 15):
        c.Isend(data(rank, n), dest=peer, tag=3, backend=backend)
        c.Recv(y := torch.zeros(n), source=source, tag=3, backend=backend)
        assert torch.equal(y, data(source, n))
        c.Barrier()                 # every send has been received
        req = c.Irecv(torch.zeros(1), source=source, tag=99)
        exc = expect_timeout(req.Wait, "Recv float32[1]")
        assert [p["op"] for p in exc.pending] == ["Recv"], (backend, n, exc.pending)
        c.Barrier()                 # every rank has timed out
        c.Send(torch.zeros(1), dest=peer, tag=99)
        req.Wait()
    c.Free()


@case.matrix(backend=BACKENDS)
def persistent_starts_are_timed_and_leave_no_record_behind(comm, backend):
    # each start is timed and recorded once, emulated (a non-blocking call per start: Gloo)
    # or MPI's own; a completed start leaves nothing pending
    c = timed(comm)
    x, y = data(comm.rank), torch.zeros(4)
    p = c.Allreduce_init(x, y, backend=backend)
    for _ in range(3):
        p.Start()
        p.Wait()
        assert torch.equal(y, sum(data(r) for r in range(comm.size)))
    late_request(comm, lambda: (p.Start(), p)[1], "Allreduce", "Allreduce float32[4] SUM")
    # compressed: its starts post outside the chain (they were not timed: a hang)
    q = c.Allreduce_init(x, y, backend=backend, compress="fp16")
    q.Start()
    q.Wait()
    assert torch.allclose(y, sum(data(r) for r in range(comm.size)), rtol=1e-3)
    late_request(comm, lambda: (q.Start(), q)[1], "Allreduce", "Allreduce float32[4] SUM")
    q.Free()
    req = c.Irecv(torch.zeros(1), source=c.rank, tag=99)
    exc = expect_timeout(req.Wait, "Recv float32[1]")
    assert [pend["op"] for pend in exc.pending] == ["Recv"], exc.pending
    c.Send(torch.zeros(1), dest=c.rank, tag=99)
    req.Wait()
    p.Free()
    c.Free()


@case
def timeout_names_the_pending_calls(comm):
    size, rank, last = comm.size, comm.rank, comm.size - 1
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
        x, y = data(rank), torch.zeros(4)
        if rank != last:        # the last rank skipped this Allreduce: it waits for rank 0's
            exc = expect_timeout(lambda: c.Allreduce(mcr.IN_PLACE, x, backend=backend),
                                 "Allreduce float32[4] SUM #2", f"[{backend}, blocking]")
            assert exc.pending[-1]["op"] == "Allreduce" and exc.pending[-1]["seq"] == 2
        else:
            exc = expect_timeout(lambda: c.Recv(y, source=0, tag=9, backend=backend),
                                 "Recv float32[4] from 0 tag 9")
            assert exc.pending[-1]["peer"] == 0 and exc.pending[-1]["tag"] == 9
        assert isinstance(exc.request, mcr.Request)
        comm.Barrier()          # (the parent) every rank has timed out: their clocks start apart
        if rank == last:        # undo the mistake: the pending calls complete
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
    req = c.Irecv(y := torch.zeros(4), source=(rank - 1) % size, tag=3)
    exc = expect_timeout(lambda: mcr.Request.Waitall([req]), "Recv float32[4]")
    assert exc.request is None and exc.pending[0]["tag"] == 3
    expect_timeout(lambda: mcr.Request.Waitany([req]), "Recv float32[4]")
    c.Barrier()                    # no message is sent before every rank timed out
    c.Send(data(rank), dest=(rank + 1) % size, tag=3)
    mcr.Request.Waitall([req])
    assert torch.equal(y, data((rank - 1) % size))
    c.Free()


@case
def timeout_in_a_blocking_probe(comm):
    """Probe of a message not sent yet, on MPI and on Gloo, and Mprobe (mpi4py's) on MPI:
    TimeoutError naming it (MPI_Probe, MPI_Mprobe and Gloo's header probe blocked past the
    timeout); once it is sent, Probe finds it and Mprobe matches it."""
    size, rank = comm.size, comm.rank
    c = timed(comm)
    expect_timeout(lambda: c.Mprobe((rank - 1) % size, 6),
                   f"Mprobe (source {(rank - 1) % size}, tag 6) [mpi]")
    c.Barrier()
    sent = c.Isend(data(rank), dest=(rank + 1) % size, tag=6)    # (1 process: to oneself)
    message = c.Mprobe((rank - 1) % size, 6, st := mcr.Status())
    assert st.Get_count(mpi4py.MPI.FLOAT) == 4 and st.Get_source() == (rank - 1) % size
    message.Recv(y := torch.zeros(4))
    sent.Wait()
    assert torch.equal(y, data((rank - 1) % size))
    for tag, backend in ((4, "mpi"), (5, "gloo")):
        c.Barrier(backend=backend)             # (Gloo's set-up: not part of the wait)
        expect_timeout(lambda: c.Probe((rank - 1) % size, tag, backend=backend),
                       f"Probe (source {(rank - 1) % size}, tag {tag}) [{backend}]")
        c.Barrier()
        sent = c.Isend(data(rank), dest=(rank + 1) % size, tag=tag, backend=backend)
        st = mcr.Status()
        assert c.Probe((rank - 1) % size, tag, st, backend=backend)
        assert st.Get_count(mpi4py.MPI.FLOAT) == 4, st.Get_count(mpi4py.MPI.FLOAT)
        c.Recv(y := torch.zeros(4), (rank - 1) % size, tag, backend=backend)
        sent.Wait()
        assert torch.equal(y, data((rank - 1) % size))
    c.Free()


@case
def timeout_in_a_backends_set_up(comm):
    # the first call on Gloo sets it up over the whole communicator: a Send
    # between ranks 0 and 1 that the others never join on Gloo waits there
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
def timeout_in_autos_agreement(comm):
    # the first collective under auto agrees on the tuning table over the whole
    # communicator (mcr's exchange, on mpi4py's view): one that never comes is a timeout
    if comm.size == 1:
        return
    c, y = timed(comm), torch.zeros(4)
    call = lambda: c.Allreduce(data(0), y, backend="auto")     # noqa: E731
    late(comm, call, "every process of", "to agree on the tuning table of backend='auto'",
         again=(call, "to agree on the tuning table"))
    assert torch.equal(y, data(0) * comm.size)
    c.Free()


@case
def timeout_in_free_with_a_backend(comm):
    # Free is collective: with a Gloo sub-communicator it waits for every
    # process (MPI_Comm_free alone returns at once), so the timeout bounds it
    c = timed(comm)
    c.Barrier(backend="gloo")
    late(comm, c.Free, "every process of", "to free the communicator",
         "'gloo' sub-communicator")     # the others: the same barrier again
    raises(ValueError, c.Barrier)
    c.Free()                    # freed: nothing to do


def objects_results(c):
    """Every collective of mpi4py's on pickled objects on `c`: they work as on mpi4py."""
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
    # mpi4py's methods on pickled objects, watched, are numbered among the collectives
    # and meet first (timed: a rank that skips one times out the others; checked: a mismatch)
    size, rank, last = comm.size, comm.rank, comm.size - 1
    c = timed(comm)
    objects_results(c)                          # #1-#10
    bcast = lambda: c.bcast({"k": rank}, root=0)     # noqa: E731
    exc, got = late(comm, bcast, "every process of",
                    "to call bcast (a collective on pickled objects)",
                    again=(bcast, "to call bcast"))
    assert got == {"k": 0}
    assert not exc or [exc.pending[-1][k] for k in ("op", "seq", "desc")] == [
        "bcast", 11, "bcast root=0"], exc.pending
    objects_results(c)
    assert_allreduce_works(c)
    d = checked(comm)
    objects_results(d)                          # #1-#10
    expect_mismatch(d, lambda odd: d.gather(rank) if odd else d.bcast(rank),
                    "gather root=0 #11", "different operations", "bcast root=0 #11")
    expect_mismatch(d, lambda odd: d.bcast(rank, root=min(rank, 1)), "bcast root=1 #13",
                    "different roots", "bcast root=0 #13")
    expect_mismatch(d, lambda odd: d.allreduce(rank) if odd else d.Dup(),
                    "allreduce SUM #15", "different operations", "Dup #15")
    expect_mismatch(d, lambda odd: d.allreduce(rank, op=mcr.MAX if odd else mcr.SUM),
                    "allreduce MAX", "different reduction ops", "allreduce SUM")
    # what mpi4py refuses at one rank only (the root's list to scatter, an object that does
    # not pickle) reaches the others before anyone communicates
    for method, sent, words in ((d.scatter, list(range(size + 1)),
                                 (f"expecting {size} items, got {size + 1}",)),
                                (d.bcast, threading.Lock(), ("pickle",))):
        if size > 1:
            exc = raises(Exception, method, sent if rank == last else None, root=last)
            assert all(w in str(exc) for w in words), str(exc)
            assert rank == last or isinstance(exc, mcr.MismatchError) and \
                f"the arguments of rank {last} were refused" in str(exc), str(exc)
    objects_results(d)
    for each in (c, d):
        each.Free()
        # on a freed communicator: mpi4py's error, as on mpi4py (no meeting, no number)
        exc = raises(mpi4py.MPI.Exception, lambda: each.bcast(1))
        assert exc.Get_error_class() == mpi4py.MPI.ERR_COMM, str(exc)


def objects_p2p_results(c):
    """mpi4py's point-to-point methods on pickled objects, around a ring on `c`: as on mpi4py."""
    size, rank = c.size, c.rank
    peer, source = (rank + 1) % size, (rank - 1) % size
    st, pending = mcr.Status(), []

    def send(obj, tag):
        """c.send; to oneself (1 process) c.isend, completed at the end: a blocking send to
        oneself may wait for its receive (MPICH's does)."""
        if size > 1:
            assert c.send(obj, dest=peer, tag=tag) is None
        else:
            pending.append(c.isend(obj, dest=peer, tag=tag))
    send({"from": rank, "x": list(range(rank + 2))}, 5)
    assert c.recv(source=source, tag=5, status=st) == {"from": source, "x": list(range(source + 2))}
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
    send(("probed", rank), 8)
    assert c.probe(source=source, tag=8, status=st) is True and st.Get_source() == source
    assert c.mprobe(source, 8).recv() == ("probed", source)
    c.send(1, dest=mpi4py.MPI.PROC_NULL)            # nothing sent, an empty receive
    assert c.recv(source=mpi4py.MPI.PROC_NULL) is None
    # the non-blocking ones, completed by mpi4py's lowercase methods
    reqs = [c.irecv(source=source, tag=12), c.isend({"i": rank}, dest=peer, tag=12)]
    assert mcr.Request.waitall(reqs) == [{"i": source}, None]
    r, s = c.irecv(source=source, tag=13), c.issend(rank, dest=peer, tag=13)
    flag, got = r.test()
    while not flag:
        flag, got = r.test()
    assert got == source and s.wait() is None
    assert mcr.Request.waitall(pending) == [None] * len(pending)


@case
def point_to_point_on_objects_is_timed_too(comm):
    # mpi4py's send, recv, ... on pickled objects, timed, are polled: a receive or probe that
    # timed out leaves nothing posted (the next one gets the message); a send leaves its request
    size, rank, last = comm.size, comm.rank, comm.size - 1
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
                late_small = exc.request
                assert exc.pending[-1]["op"] == "ssend" and exc.pending[-1]["bytes"] > 0
                exc = expect_timeout(lambda: c.sendrecv("there", last, 11, None, last, 12),
                                     f"sendrecv to {last} tag 11, from {last} tag 12")
                assert isinstance(exc.request, mcr.Request) and exc.received is None
                # its receive completes (the last rank sent it first), its send (1 MiB: not
                # eager) is not received: the object received comes with the error
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
                late_small.Wait()
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
    # recv(buf) and sendrecv(recvbuf=...) on pickled objects, on mpi4py's path and polled: MPI's
    # truncation error, a warning, the next message comes (a ring: truncation to oneself passes)
    size, rank = comm.size, comm.rank
    if size == 1:
        return
    peer, source = (rank + 1) % size, (rank - 1) % size
    long, short = list(range(100)), [rank]
    c = timed(comm)
    for each in (comm, c):
        # (buf may be a number of bytes too: mpi4py allocates them)
        for call, room in (("recv", bytearray(16)), ("recv", 16), ("sendrecv", bytearray(16))):
            each.send(long, dest=peer, tag=3)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                exc = raises(mpi4py.MPI.Exception, lambda: each.recv(room, source, 3)
                             if call == "recv" else
                             each.sendrecv(short, peer, 4, room, source, 3))
            assert exc.Get_error_class() == mpi4py.MPI.ERR_TRUNCATE, (each, call, exc)
            assert any("'buf' argument is deprecated" in str(w.message) for w in seen)
            if call == "sendrecv":
                assert each.recv(source=source, tag=4) == [source]
            each.send(short, dest=peer, tag=5)
            assert each.recv(bytearray(64) if isinstance(room, bytearray) else 64,
                             source, 5) == [source]
        # a buf that is no buffer is refused before the message is received: it stays
        each.send(short, dest=peer, tag=6)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            raises(TypeError, lambda: each.recv(object(), source, 6))
        assert each.recv(source=source, tag=6) == [source]
    c.Free()


@case
def timeout_in_making_a_communicator(comm):
    # MPI's constructors block uninterruptibly: timed, the ranks meet in a polled barrier
    # first (a Dup after a Split that timed out waits for it too)
    size, rank = comm.size, comm.rank
    c = timed(comm)
    _, s = late(comm, lambda: c.Split(0, -rank), "every process of",
                "to call Split (making a communicator is collective)",
                again=(c.Dup, "to call Dup"))
    assert s.size == size and s.rank == size - 1 - rank and s.timeout == TIMEOUT
    assert_allreduce_works(s)
    d = c.Dup()
    assert d.size == size and d.timeout == TIMEOUT
    assert_allreduce_works(d)
    for each in (d, s, c):
        each.Free()


@case
def dups_with_hints_and_nonblocking_dups_are_watched(comm):
    # Dup_with_info blocks as Dup does; Idup's request times out. Copies keep timeout and backend
    c = timed(comm)
    c.backend = "gloo"
    _, hinted = late(comm, lambda: c.Dup_with_info(mpi4py.MPI.INFO_NULL),
                     "to call Dup_with_info (making a communicator is collective)")
    assert hinted.timeout == TIMEOUT and hinted.backend == "gloo"
    assert_allreduce_works(hinted, "gloo")
    _, (copy, _) = late_request(comm, c.Idup, "Idup", "waiting for Idup #2")
    assert copy.timeout == TIMEOUT and copy.backend == "gloo"
    assert_allreduce_works(copy)
    copy2, req2 = c.Idup_with_info(mpi4py.MPI.INFO_NULL)
    mcr.Request.Waitall([req2])
    assert_allreduce_works(copy2, "gloo")
    free(copy2, copy, hinted, c)
    k = checked(comm)
    made = []

    def idup_or_dup(odd):
        copy, req = (k.Dup(), None) if odd else k.Idup()
        made.append(copy)
        if not odd:
            req.Wait()

    expect_mismatch(k, idup_or_dup, "Dup #1", "different operations", "Idup #1")
    free(*made, k)


@case
def an_idup_waited_late_under_a_timeout_and_checked_mode(comm):
    """Valid MPI: Idup, then blocking collectives on the parent and on another communicator, one
    rank late, then the Idup's Wait. Timed and checked calls post non-blocking collectives,
    which Open MPI ordered differently from the Idup's rounds on the processes
    (MPI_ERR_INTERN, TimeoutError): they wait for the Idup first."""
    for check in (False, True):
        c, other = timed(comm, check), timed(comm)
        c.timeout = other.timeout = 30.0
        copy, req = c.Idup()
        if comm.rank == 0:
            time.sleep(0.2)
        x, y = torch.ones(2), torch.ones(3)
        other.Allreduce(mcr.IN_PLACE, y)
        c.Allreduce(mcr.IN_PLACE, x)
        req.Wait()
        assert torch.equal(x, torch.full((2,), float(comm.size)))
        assert torch.equal(y, torch.full((3,), float(comm.size)))
        assert_allreduce_works(copy)
        free(copy, other, c)


@case
def topologies_are_watched_as_constructors(comm):
    # Create_cart, the graph constructors and Cartcomm.Sub block as Split does, keeping the timeout
    size, rank = comm.size, comm.rank
    c = timed(comm)
    _, ring = late(comm, lambda: c.Create_cart([size], periods=[True]), "every process of",
                   "to call Create_cart (making a communicator is collective)")
    _, sub = late(comm, lambda: ring.Sub([True]), "to call Sub")
    left, right = (rank - 1) % size, (rank + 1) % size
    _, graph = late(comm, lambda: c.Create_dist_graph_adjacent([left], [right]),
                    "to call Create_dist_graph_adjacent")
    for each, kind in ((ring, mcr.Cartcomm), (sub, mcr.Cartcomm), (graph, mcr.Distgraphcomm)):
        assert isinstance(each, kind) and each.timeout == TIMEOUT, each
        assert_allreduce_works(each)
    free(graph, sub, ring, c)
    k = checked(comm)
    made = []
    expect_mismatch(k, lambda odd: made.append(k.Dup() if odd else k.Create_cart([size])),
                    "Dup #1", "different operations", "Create_cart #1")
    grid = k.Create_cart([size])
    assert isinstance(grid, mcr.Cartcomm) and grid.checked
    assert_allreduce_works(grid)
    expect_mismatch(grid, lambda odd: grid.Barrier() if odd else made.append(grid.Sub([True])),
                    "Barrier #2", "different operations", "Sub #2")
    free(*made, grid, k)


@case
def create_group_is_recorded_not_numbered(comm):
    # only the group's processes make it: neither agreed on nor numbered (the others' next
    # collective keeps its number), but recorded; the new communicator keeps the settings
    size, rank, members = comm.size, comm.rank, list(range(0, comm.size, 2))
    c = timed(comm, check=True)
    flight = tempfile.mkdtemp(prefix="mcr-flight-")
    _core._set_flight_recorder(flight)
    try:
        if rank in members:
            g = c.Create_group(c.Get_group().Incl(members), tag=5)
            assert g.size == len(members) and g.checked and g.timeout == TIMEOUT
            assert_allreduce_works(g)
            g.Free()
        expect_mismatch(c, lambda odd: c.Bcast(torch.ones(1), root=0) if odd else c.Barrier(),
                        "Barrier #1", "different operations", "Bcast")
        _core._flight_dump()
        with open(os.path.join(flight, f"mcr-flight-{rank}.json")) as f:
            calls = json.load(f)["calls"]
    finally:
        _core._set_flight_recorder(None)
        shutil.rmtree(flight)
    made = [(x["op"], x["seq"], x["state"]) for x in calls if x["op"] == "Create_group"]
    assert made == [("Create_group", None, "done")] * (rank in members), calls
    c.Free()


def timed_ring(comm):
    """A timed duplicate of `comm`, a periodic ring on it, the ring's left and right neighbours,
    this rank's blocks for them (for Neighbor_alltoall) and the blocks it should get: the left
    neighbour's for its right neighbour, then the right one's for its left."""
    c, rank = timed(comm), comm.rank
    ring = c.Create_cart([comm.size], periods=[True])
    left, right = ring.Shift(0, 1)
    return (c, ring, left, right, torch.cat([data(rank) + 100 * left, data(rank) + 100 * right]),
            torch.cat([data(left) + 100 * rank, data(right) + 100 * rank]))


@case
def neighborhood_collectives_are_watched(comm):
    # timed: Neighbor_alltoall times out at the call, Ineighbor_allgather in its Wait on the
    # skipper's neighbours only
    size, rank, last = comm.size, comm.rank, comm.size - 1
    c, ring, left, right, blocks, want = timed_ring(comm)
    got = torch.zeros(8)
    late(comm, lambda: ring.Neighbor_alltoall(blocks, got),
         "to call Neighbor_alltoall (a neighborhood collective)")
    assert torch.equal(got, want)
    gathered = torch.zeros(8)
    exc, _ = late_request(comm, lambda: ring.Ineighbor_allgather(data(rank), gathered),
                          "Ineighbor_allgather", "waiting for Ineighbor_allgather #2",
                          waits=last in (left, right))
    if exc:     # mpi4py moves the data: its size is not known here, and not shown as 0
        assert exc.pending[0]["bytes"] == -1 and " bytes" not in str(exc), str(exc)
    assert torch.equal(gathered, torch.cat([data(left), data(right)]))
    # composed on Gloo (an Alltoallv of the whole communicator): every rank waits (the first
    # composed call, on every rank, sets up the Gloo groups)
    swapped = torch.zeros(8)
    ring.Ineighbor_alltoall(blocks, swapped, backend="gloo").Wait()
    swapped.zero_()
    late_request(comm, lambda: ring.Ineighbor_alltoall(blocks, swapped, backend="gloo"),
                 "Ineighbor_alltoall", "waiting for Ineighbor_alltoall #", "[gloo]")
    assert torch.equal(swapped, got)
    free(ring, c)
    k = checked(comm)
    grid = k.Create_cart([size], periods=[True])

    def gather_or_barrier(odd):
        if odd:
            grid.Barrier()
        else:
            assert grid.neighbor_allgather(rank) == [(rank - 1) % size, (rank + 1) % size]

    expect_mismatch(grid, gather_or_barrier, "Barrier #1", "different operations",
                    "neighbor_allgather #1")
    free(grid, k)


@case
def persistent_neighborhood_collectives_are_watched(comm):
    # timed: each Start is recorded and its Wait times out (on the late rank's neighbours only
    # where MPI runs it; composed on Gloo, everywhere); checked: the processes agree at *_init
    size, rank, last = comm.size, comm.rank, comm.size - 1
    c, ring, left, right, blocks, want = timed_ring(comm)
    got, on_gloo = torch.zeros(8), torch.zeros(8)
    p = ring.Neighbor_alltoall_init(blocks, got)
    q = ring.Neighbor_alltoall_init(blocks, on_gloo, backend="gloo")
    for _ in range(2):
        mcr.Prequest.Startall([p, q])
        mcr.Request.Waitall([p, q])
        assert torch.equal(got, want) and torch.equal(on_gloo, want), (got, on_gloo)
    got.zero_()
    on_gloo.zero_()
    late_request(comm, lambda: (p.Start(), p)[1], "Neighbor_alltoall_init",
                 "waiting for Neighbor_alltoall_init #", "[mpi]", waits=last in (left, right))
    late_request(comm, lambda: (q.Start(), q)[1], "Neighbor_alltoall_init",
                 "waiting for Neighbor_alltoall_init #", "[gloo]")
    assert torch.equal(got, want) and torch.equal(on_gloo, want), (got, on_gloo)
    free(p, q, ring, c)
    k = checked(comm)
    grid, made = k.Create_cart([size], periods=[True]), []
    gathered = torch.zeros(8)
    expect_mismatch(grid, lambda odd: made.append(
        grid.Neighbor_allgather_init(data(rank), gathered) if odd else
        grid.Neighbor_alltoall_init(blocks, got)),
        "Neighbor_allgather_init #1", "different operations", "Neighbor_alltoall_init #1")
    expect_mismatch(grid, lambda odd: grid.Neighbor_allgather(data(rank), gathered) if odd else
                    made.append(grid.Neighbor_allgather_init(data(rank), gathered)),
                    "Neighbor_allgather #3", "different operations", "Neighbor_allgather_init #3")
    p = grid.Neighbor_allgather_init(data(rank), gathered)
    p.Start()
    p.Wait()
    assert torch.equal(gathered, torch.cat([data(left), data(right)])), gathered
    free(p, *made, grid, k)


@case
def neighborhood_blocks_longer_than_their_slots_are_refused(comm):
    # checked: the processes swap their block sizes at the call, in every form and on every
    # backend, and every one raises MPI's truncation error before any data moves (Open MPI writes
    # such a block past its slot). Rank 0 sends blocks of 2 floats where every slot holds 1.
    size, rank = comm.size, comm.rank
    k, ring = checked_ring(comm)
    left, right = ring.Shift(0, 1)
    n = 2 if rank == 0 else 1
    seen = "recvbuf: process 0 sends a block of 8 bytes to a slot of 4" if 0 in (left, right) \
        else "recvbuf: another process got a block longer than its slot"
    for backend in BACKENDS:
        for name in ("Neighbor_alltoallv", "Ineighbor_alltoallv", "Neighbor_alltoallv_init",
                     "Neighbor_allgatherv", "Ineighbor_allgatherv", "Neighbor_allgatherv_init"):
            got = torch.full((4,), -1.0)
            sendbuf = torch.ones(n) if "allgatherv" in name else [torch.ones(2 * n), [n, n], [0, n]]
            exc = raises(mcr.Exception, getattr(ring, name), sendbuf, [got, [1, 1], [0, 2]],
                         backend=backend)
            assert exc.Get_error_class() == mpi4py.MPI.ERR_TRUNCATE and exc.__notes__ == [seen], \
                (name, backend, exc, exc.__notes__)
            assert (got == -1).all(), got
    # a side in a derived datatype takes part without a size: rank 0's receive side here
    one = mpi4py.MPI.FLOAT.Create_contiguous(1).Commit()
    got = np.full(4, -1, np.float32)
    ring.Ineighbor_allgatherv(np.full(1, rank, np.float32),
                              [got, ([1, 1], [0, 2]), one] if rank == 0 else [got, [1, 1], [0, 2]]
                              ).Wait()
    assert got.tolist() == [left, -1, right, -1], got
    one.Free()
    assert_allreduce_works(ring)
    free(ring, k)


NB_FORMS = ("Neighbor_alltoall", "Ineighbor_alltoall", "Neighbor_alltoall_init")


def ring_alltoall(ring, method, sendbuf, recvbuf, backend):
    """Neighbor_alltoall through `method` (one of NB_FORMS), waited for."""
    got = getattr(ring, method)(sendbuf, recvbuf, backend=backend)
    if isinstance(got, mcr.Prequest):
        got.Start()
        got.Wait()
        got.Free()
    elif got is not None:
        got.Wait()


@case.matrix(backend=BACKENDS, method=NB_FORMS)
def checked_neighborhood_refusal_raises_everywhere(comm, backend, method):
    # rank 0 sends blocks of 8 floats into slots of 4: only rank 0 can tell. Its refusal travels
    # in its fingerprint, and every rank raises before any communicates (the others waited in the
    # fingerprint exchange, on Gloo in the block sizes' exchange). Then the ring works.
    size, rank = comm.size, comm.rank
    k, ring = checked_ring(comm)
    left, right = ring.Shift(0, 1)
    blocks = torch.cat([data(rank) + 100 * left, data(rank) + 100 * right])
    got = torch.full((8,), -1.0)
    exc = refused_at_rank0(rank, ["recvbuf: 4 elements per neighbour, but sendbuf sends 8"],
                           ring_alltoall, ring, method,
                           torch.cat([blocks, blocks]) if rank == 0 else blocks, got, backend)
    assert rank == 0 or f"{method} #1" in str(exc), str(exc)
    assert (got == -1).all(), got
    ring_alltoall(ring, method, blocks, got, backend)
    assert torch.equal(got, torch.cat([data(left) + 100 * rank, data(right) + 100 * rank])), got
    free(ring, k)


@case.matrix(backend=BACKENDS)
def checked_unknown_backend_raises_everywhere(comm, backend):
    # a backend name that rank 0 alone gets wrong is refused as its other arguments are: in its
    # fingerprint, before any process communicates (the others waited in the exchange)
    size, rank = comm.size, comm.rank
    c, ring = checked_ring(comm)
    name = "no-such-backend" if rank == 0 else backend
    for fn, args in ((c.Allreduce, (mcr.IN_PLACE, data(rank))), (c.Ibcast, (data(rank),)),
                     (ring.Neighbor_allgather, (data(rank, 1), torch.zeros(2)))):
        refused_at_rank0(rank, ["unknown backend 'no-such-backend'"], fn, *args, backend=name)
    assert_allreduce_works(c, backend)
    free(ring, c)


@case
def checked_neighbor_alltoallw_refusal_raises_everywhere(comm):
    # mcr checks alltoallw's message (its datatypes are MPI's): rank 0's, a datatype short, is
    # refused at rank 0 alone and reaches the others in its fingerprint, in every form
    size, rank = comm.size, comm.rank
    k, ring = checked_ring(comm)
    left, right = ring.Shift(0, 1)
    F = mpi4py.MPI.FLOAT
    send, got = np.arange(2, dtype=np.float32) + 10 * rank, np.full(2, -1, np.float32)
    for method in NB_FORMS:
        method = method.replace("alltoall", "alltoallw")
        exc = refused_at_rank0(rank, ["sendbuf: 1 datatypes for 2 neighbours"],
                               getattr(ring, method),
                               [send, ([1, 1], [0, 4]), [F] if rank == 0 else [F, F]],
                               [got, ([1, 1], [0, 4]), [F, F]])
        assert rank == 0 or f"{method} #" in str(exc), str(exc)
    assert (got == -1).all(), got
    ring.Neighbor_alltoallw([send, ([1, 1], [0, 4]), [F, F]], [got, ([1, 1], [0, 4]), [F, F]])
    # (block 1 goes to the right, block 0 to the left)
    assert got.tolist() == [1 + 10 * left, 10 * right], got
    free(ring, k)


@case
def checked_neighborhood_derived_datatype_on_gloo_raises_everywhere(comm):
    # a derived datatype runs on MPI only: rank 0's receive side in one, on Gloo, is refused at
    # rank 0 alone, and reaches the others as above (they waited in the block sizes' exchange)
    size, rank = comm.size, comm.rank
    k, ring = checked_ring(comm)
    one = mpi4py.MPI.FLOAT.Create_contiguous(1).Commit()
    got = np.full(4, -1, np.float32)
    refused_at_rank0(rank, ["a derived datatype runs on backend 'mpi'"], ring.Neighbor_allgatherv,
                     np.full(1, rank, np.float32),
                     [got, ([1, 1], [0, 2]), one] if rank == 0 else [got, [1, 1], [0, 2]],
                     backend="gloo")
    assert (got == -1).all(), got
    one.Free()
    assert_allreduce_works(ring, "gloo")
    free(ring, k)


@case
def timed_neighborhood_refusal_on_gloo_times_out(comm):
    # unchecked, composed on Gloo: rank 0 refuses its blocks (as above) before the others are met,
    # and they time out in the barrier, not in the block sizes' exchange (MPI's, not timed). The
    # barrier stays posted: the call made again by every rank works.
    size, rank = comm.size, comm.rank
    c, ring, left, right, blocks, want = timed_ring(comm)
    got = torch.full((8,), -1.0)
    if rank == 0:
        exc = raises(ValueError, ring.Neighbor_alltoall, torch.cat([blocks, blocks]), got,
                     backend="gloo")
        assert "recvbuf: 4 elements per neighbour, but sendbuf sends 8" in str(exc), str(exc)
    else:
        expect_timeout(lambda: ring.Neighbor_alltoall(blocks, got, backend="gloo"),
                       "to call Neighbor_alltoall (a neighborhood collective)")
    assert (got == -1).all(), got
    comm.Barrier()              # (the parent)
    ring.Neighbor_alltoall(blocks, got, backend="gloo")
    assert torch.equal(got, want), got
    free(ring, c)


# -- Checked mode with a timeout ----------------------------------------------------

@case
def checked_and_timed_fingerprint_exchange_times_out(comm):
    size, rank, last = comm.size, comm.rank, comm.size - 1
    if size == 1:
        return
    c = timed(comm, check=True)
    c.Barrier()                 # (its private communicator, for the fingerprints, exists now)
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
    # the exchange left pending makes the communicator unusable: not freed


@case
def checked_and_timed_first_exchange_times_out_then_works(comm):
    # the first checked call makes the private communicator (MPI_Comm_idup, collective): the
    # others time out there until the last rank comes
    c = timed(comm, check=True)
    late(comm, lambda: assert_allreduce_works(c), "making the checked communicator's private copy")
    assert_allreduce_works(c)
    c.Free()


@case
def checked_and_timed_constructor_times_out(comm):
    # checked, the others wait in the (polled) fingerprint exchange, not in MPI's Split
    if comm.size == 1:
        return
    c = timed(comm, check=True)
    c.Barrier()                 # (as above)
    if comm.rank != comm.size - 1:
        expect_timeout(lambda: c.Split(0, comm.rank), "checked mode's fingerprint exchange",
                       "Split #2")
    # as above, the exchange left pending makes the communicator unusable: not freed


@case
def timeout_values_bad_and_huge(comm):
    """Bad values are refused. A huge one waits (1e10 s overflowed the deadline's nanoseconds
    into the past: every wait raised TimeoutError at once)."""
    c = comm.Dup()
    raises(ValueError, setattr, c, "timeout", -1)
    raises(TypeError, setattr, c, "timeout", "soon")
    c.timeout = 0
    assert c.timeout is None
    c.timeout = None
    assert c.timeout is None and not c.checked
    left, right = (c.rank - 1) % c.size, (c.rank + 1) % c.size
    for huge in (1e10, 1e300):
        c.timeout = huge
        for backend in BACKENDS:
            assert_allreduce_works(c, backend)
            c.Barrier(backend=backend)
            got, sent = torch.zeros(4), c.Isend(data(c.rank), right, tag=7, backend=backend)
            c.Probe(left, tag=7, backend=backend)
            c.Recv(got, left, tag=7, backend=backend)
            sent.Wait()
            assert torch.equal(got, data(left)), (backend, got)
    c.Free()
    s = mcr.COMM_SELF           # records name it "self" (it was "0#1"), a Sendrecv its receive
    s.timeout = TIMEOUT
    try:
        exc = expect_timeout(lambda: s.Sendrecv(data(4), 0, 8, got, 0, 9),
                             "Sendrecv float32[4] to 0 tag 8, from 0 tag 9 on self")
        s.Send(data(5), 0, tag=9)       # (matched by its pending receive; MPICH completes
        s.Recv(sent := torch.zeros(4), 0, tag=8)        # its send to itself once received)
        exc.request.Wait()
        assert torch.equal(got, data(5)) and torch.equal(sent, data(4)), (got, sent)
        assert [p["comm"] for p in exc.pending if p["tag"] == 8] == ["self"], exc.pending
    finally:
        s.timeout = None


test_mpi = mpi_cases(__name__, sizes=LAYER_SIZES)
