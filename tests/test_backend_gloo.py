"""Backend "gloo" beyond the operation matrix (tests/test_ops.py), compared with "mpi" and
with torch/numpy on the whole data: Split/Dup sub-communicators; point-to-point with MPI's
matching (to oneself, tags out of order, ANY_SOURCE/ANY_TAG, Probe/Iprobe, counts, PROC_NULL,
ERR_TRUNCATE, both sides of the eager limit, many large sends, Free with operations pending,
the set-up by a PROC_NULL call); errors as on MPI, raised before communicating; TypeError for
what Gloo cannot run; the store (a file on one host, TCP at MCR_STORE_HOST or where a rank
cannot see the file). Every element type, Sendrecv(_replace), the persistent forms and PROC_NULL
messages: tests/test_p2p_buf.py; request sets: test_backend_mixing.
"""

import contextlib
import functools
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import torch

import mcr
import mcr.backends.gloo
from mcr import MPI, launch
from mcr.backends import store
from mpiharness import case, mpi_cases, mpi_env
from opmatrix import Findings
from opref import OPS, data, expect, operands, reduce_ref, sentinel
from util import assert_truncated, raises, ring, status_of

GLOO = "gloo"
BACKENDS = ("mpi", GLOO)
N = 5
EAGER = mcr.backends.gloo.BACKEND.eager_limit      # bytes
OPEN_MPI = launch.is_open_mpi(launch.find_mpiexec())


def checked(min_size=1, quick=False, **axes):
    """Register ``fn(comm, found, **axes)`` as a case per combination of `axes`, run at
    `min_size` ranks or more, failing at its end with what `found` recorded."""
    def register(fn):
        @functools.wraps(fn)
        def run(comm, **chosen):
            if comm.size >= min_size:
                found = Findings()
                fn(comm, found, **chosen)
                found.report()
        if axes:
            case.matrix(quick=(lambda **_: True) if quick else None, **axes)(run)
        else:
            (case.quick if quick else case)(run)
        return fn
    return register


def post(found, what, call):
    """The request `call()` returns, or None when it raises (recorded)."""
    with found.check(what):
        return call()
    return None


def wait_posted(found, what, requests):
    """Waitall on the requests that were posted (None: the post failed)."""
    with found.check(what):
        mcr.Request.Waitall([r for r in requests if r is not None])


@checked()
def sub_communicators(comm, found):
    """Gloo on communicators made by Split and Dup, each with its own group."""
    split = comm.Split(comm.rank % 2, comm.size - comm.rank)     # keys reverse the order
    same_color = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
    for sub, members in ((split, same_color[::-1]), (comm.Dup(), list(range(comm.size)))):
        xs = [data(r, N, torch.bfloat16, "SUM") for r in members]
        for backend in BACKENDS:
            what = f"on a {sub.size}-rank sub-communicator, {backend}"
            recv = sentinel(N, torch.bfloat16)
            with found.check(f"Allreduce {what}"):
                sub.Allreduce(xs[sub.rank], recv, backend=backend)
                expect(recv, reduce_ref(xs, "SUM"))
            recv = sentinel(N * sub.size, torch.bfloat16)
            with found.check(f"Allgather {what}"):
                sub.Allgather(xs[sub.rank], recv, backend=backend)
                expect(recv, torch.cat(xs))
        sub.Free()


# -- Point-to-point --------------------------------------------------------------------
@checked(quick=True, backend=BACKENDS)
def eager_and_backend_payloads(comm, found, backend):
    """Both sides of the eager limit, to the neighbours and to oneself, received by tag out of
    order; truncated (at Recv, or at Wait for Irecv), then ANY_SOURCE after a Probe."""
    right, left = ring(comm)
    for n in (4, EAGER // 4, EAGER // 4 + 1, 3 * EAGER // 4 + 5):     # float32 elements
        comm.Barrier()
        sends = [post(found, f"Isend {n} to {dest}", lambda dest=dest, t=t: comm.Isend(
            data(comm.rank, n, seed=t), dest, 10 + t, backend=backend))
            for t, dest in ((1, right), (2, right), (3, comm.rank))]
        for t, src in ((2, left), (1, left), (3, comm.rank)):   # tags out of order
            buf, st = sentinel(n + 1, torch.float32), mcr.Status()
            with found.check(f"Recv {n} tag {10 + t} from {src}"):
                comm.Recv(buf, src, 10 + t, st, backend=backend)
                expect(buf, torch.cat([data(src, n, seed=t), sentinel(1, torch.float32)]))
                assert status_of(st) == (src, 10 + t, n), status_of(st)
        wait_posted(found, f"sends of {n}", sends)
        buf = sentinel(n, torch.float32)
        with found.check(f"Sendrecv {n} with self"):
            comm.Sendrecv(data(comm.rank, n, seed=4), comm.rank, 14, buf, comm.rank, 14,
                          backend=backend)
            expect(buf, data(comm.rank, n, seed=4))
        if comm.size == 1:
            continue
        # truncated at Recv, and at Wait (5 elements: a large message truncated there corrupts
        # Open MPI's heap); the next still matches: Probe, then ANY_SOURCE into the probed size
        sends = [post(found, f"Isend {k} tag {20 + t}", lambda t=t, k=k: comm.Isend(
            data(comm.rank, k, seed=9 - t), right, 20 + t, backend=backend))
            for t, k in ((0, n), (1, n), (2, 5))]
        with found.check(f"Recv {n} into {n - 1}"):
            assert_truncated(lambda: comm.Recv(torch.zeros(n - 1), left, 21, backend=backend),
                             "buf", 4 * (n - 1), left, 21, 4 * n)
        req = post(found, "Irecv", lambda: comm.Irecv(torch.zeros(2), left, 22, backend=backend))
        with found.check("Wait for 5 elements into 2"):
            assert_truncated(req.Wait, "buf", 8, left, 22, 20)
        st, buf = mcr.Status(), sentinel(n, torch.float32)
        with found.check(f"Probe {n}"):
            comm.Probe(MPI.ANY_SOURCE, 20, st, backend=backend)
            got = (st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE))
            assert got == (left, 20, 4 * n), got
        with found.check(f"Recv ANY_SOURCE {n} after Probe"):
            comm.Recv(buf, MPI.ANY_SOURCE, 20, backend=backend)
            expect(buf, data(left, n, seed=9))
        wait_posted(found, f"Isend tags 20-22 of {n}", sends)


@case.matrix(backend=BACKENDS)
def free_with_operations_pending(comm, backend):
    """Free with Irecv/Isend pending (ring and self, both sides of the eager limit), then
    Waitall: on Gloo, Free matches the headers its sends wait on (it hung)."""
    right, left = ring(comm)
    sub = comm.Dup()
    sub.timeout = 60.0                  # a hang fails this case
    sub.Barrier(backend=backend)        # the backend is set up
    reqs, expected = [], []
    for k, n in enumerate((EAGER // 4 * 8, 5)):     # 8x the limit, then eager
        for src, dest in ((left, right), (comm.rank, comm.rank)):
            tag = 10 * k + (src == comm.rank)
            out = torch.zeros(n)
            reqs += [sub.Irecv(out, src, tag, backend=backend),
                     sub.Isend(data(comm.rank, n, seed=tag), dest, tag, backend=backend)]
            expected.append((out, data(src, n, seed=tag)))
    if comm.rank == 0:
        time.sleep(0.2)
    sub.Free()
    mcr.Request.Waitall(reqs)
    for out, want in expected:
        expect(out, want, backend)


@checked(backend=BACKENDS)
def any_source_any_tag_with_statuses(comm, found, backend):
    """Rank r sends r elements, tag 50+r, to rank 0, which takes them with ANY_SOURCE/ANY_TAG
    into a larger buffer and reads source, tag and count from the status."""
    for dtype in (torch.float64, torch.bfloat16, torch.uint64):
        comm.Barrier()                 # no message of the last round is left
        if comm.rank != 0:
            with found.check(f"Isend {dtype}"):
                comm.Isend(data(comm.rank, comm.rank, dtype), 0, 50 + comm.rank,
                           backend=backend).Wait()
            continue
        seen = []
        for _ in range(comm.size - 1):
            buf, st = sentinel(comm.size + 2, dtype), mcr.Status()
            with found.check(f"Recv ANY_SOURCE ANY_TAG {dtype}"):
                comm.Recv(buf, MPI.ANY_SOURCE, MPI.ANY_TAG, st, backend=backend)
                src = st.Get_source()
                seen.append(src)
                assert (st.source, st.tag, st.Get_tag()) == (src, 50 + src, 50 + src), st.tag
                assert (st.Get_count(), st.Get_count(MPI.BYTE)) == \
                    (src, src * buf.element_size()), st.Get_count()
                expect(buf, torch.cat([data(src, src, dtype),
                                       sentinel(comm.size + 2 - src, dtype)]))
        with found.check("every source seen once"):
            assert sorted(seen) == list(range(1, comm.size)), seen


@checked(min_size=2, backend=BACKENDS)
def probe_and_iprobe_then_recv(comm, found, backend):
    right, left = ring(comm)
    n, m = comm.rank + 2, left + 2
    sends = [post(found, f"Isend tag {5 + t}", lambda t=t: comm.Isend(
        data(comm.rank, n, torch.int32, None, t), right, 5 + t, backend=backend))
        for t in (0, 1)]
    # Probe: learn source, tag and size, then receive exactly that
    st, rst = mcr.Status(), mcr.Status()
    with found.check("Probe"):
        assert comm.Probe(MPI.ANY_SOURCE, 5, st, backend=backend) is True
        got = (st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT32_T), st.Get_count(MPI.BYTE))
        assert got == (left, 5, m, 4 * m), got
    buf = sentinel(m, torch.int32)
    with found.check("Recv after Probe"):
        comm.Recv(buf, left, 5, rst, backend=backend)
        expect(buf, data(left, m, torch.int32, None, 0))
        assert status_of(rst) == (left, 5, m), status_of(rst)
    with found.check("Iprobe of a message never sent"):
        assert comm.Iprobe(MPI.ANY_SOURCE, 99, backend=backend) is False
    st = mcr.Status()
    with found.check("Iprobe"):                 # tag 6 arrives eventually
        deadline = time.monotonic() + 60
        while not comm.Iprobe(left, MPI.ANY_TAG, st, backend=backend):
            assert time.monotonic() < deadline, "Iprobe never saw the message"
        got = (st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT32_T))
        assert got == (left, 6, m), got
    buf = sentinel(m + 1, torch.int32)
    with found.check("Recv after Iprobe"):
        comm.Recv(buf, left, 6, None, backend=backend)
        expect(buf, torch.cat([data(left, m, torch.int32, None, 1), sentinel(1, torch.int32)]))
    wait_posted(found, "sends", sends)


@checked(min_size=2, backend=BACKENDS)
def a_probed_message_overtakes_none(comm, found, backend):
    """A probe by tag finds a later message of its sender; the earlier ones still come first
    (to a probe or a receive by any tag), small and large (a payload after the header)."""
    right, left = ring(comm)
    sizes = {1: 3, 2: 5, 3: 70000, 4: 2}
    sends = [post(found, f"Isend tag {t}", lambda t=t: comm.Isend(
        data(comm.rank, n, torch.int32, None, t), right, t, backend=backend))
        for t, n in sizes.items()]
    st = mcr.Status()
    with found.check("Iprobe tag 3, then Probe any tag"):
        deadline = time.monotonic() + 60
        while not comm.Iprobe(left, 3, st, backend=backend):
            assert time.monotonic() < deadline, "Iprobe never saw tag 3"
        assert (st.Get_tag(), st.Get_count(MPI.INT32_T)) == (3, sizes[3]), st.Get_tag()
        assert comm.Probe(left, MPI.ANY_TAG, st, backend=backend) is True
        assert (st.Get_tag(), st.Get_count(MPI.INT32_T)) == (1, sizes[1]), st.Get_tag()
    with found.check("Probe any source, tag 4"):
        assert comm.Probe(MPI.ANY_SOURCE, 4, st, backend=backend) is True
        assert (st.Get_source(), st.Get_tag()) == (left, 4), (st.Get_source(), st.Get_tag())
    for t, n in sizes.items():
        buf, rst = sentinel(max(sizes.values()), torch.int32), mcr.Status()
        with found.check(f"Recv any tag: tag {t}"):
            comm.Recv(buf, left, MPI.ANY_TAG, rst, backend=backend)
            assert status_of(rst) == (left, t, n), status_of(rst)
            expect(buf[:n], data(left, n, torch.int32, None, t))
    wait_posted(found, "sends", sends)


@case.matrix(call=("Send", "Recv", "Probe"))
def proc_null_call_sets_the_backend_up(comm, call):
    """A call with a PROC_NULL peer is a call on the backend: it joins the collective set-up,
    so rank 0 making only that one call lets the others set Gloo up (they waited for it)."""
    sub = comm.Dup()
    sub.timeout = 30.0                  # a process missing from the set-up: TimeoutError
    if comm.rank == 0:
        args = {"Send": (torch.ones(4), MPI.PROC_NULL), "Recv": (torch.zeros(4), MPI.PROC_NULL),
                "Probe": (MPI.PROC_NULL,)}[call]
        getattr(sub, call)(*args, backend=GLOO)
    else:
        assert sub.Iprobe(MPI.ANY_SOURCE, backend=GLOO) is False
    comm.Barrier()      # (not sub's: MPI may match it with the set-up's Ibarrier)
    sub.Free()


@case
def truncation_of_a_message_to_itself(comm):
    """A Gloo message to oneself longer than its receive: ERR_TRUNCATE as between two ranks
    (Open MPI truncates the header silently to oneself), then the next one."""
    me = comm.rank
    req = comm.Irecv(torch.zeros(2), me, 7, backend=GLOO)
    comm.Send(torch.ones(5), me, 7, backend=GLOO)
    assert_truncated(req.Wait, "buf", 8, me, 7, 20)
    buf = torch.zeros(5)
    comm.Send(torch.full((5,), 2.0), me, 8, backend=GLOO)
    comm.Recv(buf, me, 8, backend=GLOO)
    expect(buf, torch.full((5,), 2.0))


@checked(min_size=2)
def many_large_sends_then_receives(comm, found):
    """More sends above the eager limit than sender threads, receives waited after all of
    them (a thread per send once deadlocked), each send buffer overwritten after Send; the
    buffers of delivered payloads are reused, a few kept."""
    right, left = ring(comm)
    sizes = [EAGER // 4 + 1, 3 * EAGER, EAGER // 2 + 7, 2 * EAGER + 3, EAGER // 4 + 1,
             3 * EAGER, 5 * EAGER // 4]                  # float32 elements
    for rnd in range(2):
        bufs = [sentinel(n, torch.float32) for n in sizes]
        recvs = [post(found, f"Irecv #{i}", lambda i=i: comm.Irecv(bufs[i], left, 40 + i,
                                                                   backend=GLOO))
                 for i in range(len(sizes))]
        for i, n in enumerate(sizes):
            x = data(comm.rank, n, seed=10 * rnd + i).clone()
            with found.check(f"Send {n} #{i}"):
                comm.Send(x, right, 40 + i, backend=GLOO)
            x.fill_(-1)                     # the message already left with its copy
        for i, n in enumerate(sizes):
            wait_posted(found, f"Irecv {n} #{i}", [recvs[i]])
            with found.check(f"payload {n} #{i}, round {rnd}"):
                expect(bufs[i], data(left, n, seed=10 * rnd + i))
        comm.Barrier()
    # every send is delivered now; each Send settles the ones seen delivered
    # (the first look hands a send's wait to a thread, a later one sees it done)
    for _ in range(2):
        with found.check("small Sendrecv"):
            comm.Sendrecv(torch.ones(1), right, 50, torch.empty(1), left, 50, backend=GLOO)
        comm.Barrier()
    with found.check("spare payload buffers"):
        spare = mcr.backends.subcomm(comm, GLOO).spare
        assert 1 <= len(spare) <= 4 and sum(b.numel() for b in spare) <= 1 << 26, \
            [b.numel() for b in spare]


# -- Errors ----------------------------------------------------------------------------
def bad_calls(comm):
    """(what, method, args) with arguments that are wrong on every rank."""
    size, right, z = comm.size, (comm.rank + 1) % comm.size, torch.zeros
    x3, x2 = z(3), z(2)
    return [
        ("Bcast root = size", "Bcast", (x3, size)),
        ("Reduce root -1", "Reduce", (x3, z(3), mcr.SUM, -1)),
        ("Igather root = size", "Igather", (x3, z(3 * size), size)),
        ("Allreduce counts differ", "Allreduce", (x3, x2)),
        ("Allreduce_init counts differ", "Allreduce_init", (x3, x2)),
        ("Allreduce float32 into float64", "Allreduce", (x3, z(3, dtype=torch.float64))),
        ("Allreduce BAND on float", "Allreduce", (x3, z(3), mcr.BAND)),
        ("Iallreduce LAND on complex", "Iallreduce",
         (mcr.IN_PLACE, z(3, dtype=torch.complex64), mcr.LAND)),
        ("Allgatherv counts of length size+1", "Allgatherv", (x2, [z(9), [1] * (size + 1)])),
        ("Allgatherv displacement past the end", "Allgatherv",
         (x2[:1], [z(size), [1] * size, [size] * size])),
        ("Allgather receive buffer too short", "Allgather", (x2, z(2 * size - 1))),
        ("Reduce_scatter recvcounts do not sum to the send count", "Reduce_scatter",
         (z(size + 1), z(1), [1] * size)),
        ("Alltoallv counts of length size-1", "Ialltoallv",
         ([x3, [1] * (size - 1)], [x3, [1] * size])),
        ("Send tag -5", "Send", (x3, right, -5)), ("Isend dest = size", "Isend", (x3, size, 0)),
        ("Recv into bytes", "Recv", (bytes(4), MPI.PROC_NULL, 0)),
    ]


def raised(call, *args, **kwargs):
    """The exception `call(*args, **kwargs)` raises, or None."""
    try:
        call(*args, **kwargs)
    except Exception as exc:  # noqa: B902
        return exc
    return None


def allreduce_works(comm, found, dtype, op):
    """`op` over `dtype` on Gloo, as a check that the communicator still works."""
    xs, recv = operands(comm.size, N, dtype, op), sentinel(N, dtype)
    with found.check(f"Allreduce {op} on {dtype} after the errors"):
        comm.Allreduce(xs[comm.rank], recv, OPS[op], backend=GLOO)
        expect(recv, reduce_ref(xs, op))


@checked()
def validation_errors_as_on_mpi_before_communicating(comm, found):
    """Every rank makes the same bad call: Gloo raises what MPI raises, naming the argument.
    Then the last rank alone makes each on Gloo: each raises at once, with no other rank."""
    for what, method, args in bad_calls(comm):
        on_mpi, on_gloo = (raised(getattr(comm, method), *args, backend=b) for b in BACKENDS)
        with found.check(what):
            assert on_mpi is not None and on_gloo is not None, (on_mpi, on_gloo)
            assert type(on_gloo) is type(on_mpi), (type(on_gloo), type(on_mpi), str(on_gloo))
            assert isinstance(on_gloo, (TypeError, ValueError, IndexError, BufferError))
            named = [str(exc).split(":")[0] for exc in (on_mpi, on_gloo)]   # the argument
            assert named[0] == named[1], (str(on_gloo), str(on_mpi))
    allreduce_works(comm, found, torch.int64, "SUM")
    for what, method, args in bad_calls(comm) if comm.rank == comm.size - 1 else ():
        with found.check(f"{what}, on the last rank alone"):
            assert raised(getattr(comm, method), *args, backend=GLOO) is not None
    allreduce_works(comm, found, torch.uint64, "MAX")


@checked()
def gloo_rejects_derived_datatypes_and_user_ops(comm, found):
    right, left = ring(comm)
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    one = MPI.DOUBLE.Create_contiguous(1).Commit()       # derived, the size of a double
    strided = MPI.FLOAT.Create_vector(2, 1, 2).Commit()
    user_op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    z, d = torch.zeros, torch.float64
    x, y, f, g = z(4, dtype=d), z(4, dtype=d), z(4 * comm.size), z(4 * comm.size, dtype=d)
    ld, lds = np.ones(3, dtype=np.longdouble), np.ones(comm.size, dtype=np.longdouble)
    calls = {  # the argument the TypeError names: (method, args)
        "buf": [("Bcast", ([x, pair], 0)), ("Ibcast", ([f[:3], 1, strided], 0)),
                ("Bcast_init", ([x, one], 0)), ("Send", ([x, 1, pair], right, 0)),
                ("Irecv", ([x, pair], left, 0)), ("Bcast", ([x, 32, MPI.BYTE], 0))],
        # long double: torch has no such type, so only MPI reduces it
        "sendbuf": [("Allgather", ([x, one], g)), ("Allreduce", (ld, ld.copy())),
                    ("Ireduce", (ld, ld.copy(), mcr.MAX, 0)), ("Scan", (ld, ld.copy())),
                    ("Reduce_scatter", (lds, ld[:1].copy(), [1] * comm.size))],
        "recvbuf": [("Allgather", (x, [g, one])), ("Allreduce", (mcr.IN_PLACE, [x, pair])),
                    ("Exscan", (mcr.IN_PLACE, ld.copy())),
                    ("Reduce_scatter_block", (mcr.IN_PLACE, lds))],
        "op": [("Allreduce", (x, y, user_op)), ("Ireduce", (x, y, user_op, 0)),
               ("Scan_init", (x, y, user_op)), ("Reduce_scatter_block", (f, z(4), user_op))],
    }
    for arg, method, args in ((a, m, args) for a, group in calls.items() for m, args in group):
        exc = raised(getattr(comm, method), *args, backend=GLOO)
        with found.check(f"{method} ({arg})"):
            assert isinstance(exc, TypeError) and str(exc).startswith(f"{arg}:") \
                and "'mpi'" in str(exc), repr(exc)
    for handle in (pair, one, strided, user_op):
        handle.Free()
    allreduce_works(comm, found, torch.float64, "PROD")
    with found.check("long double moves on Gloo, and reduces on MPI"):
        got = np.zeros(3 * comm.size, dtype=np.longdouble)
        comm.Allgather(ld * (comm.rank + 1), got, backend=GLOO)
        assert (got == np.repeat(np.arange(1, comm.size + 1), 3).astype(np.longdouble)).all()
        total = np.zeros(3, dtype=np.longdouble)
        comm.Allreduce(ld, total, backend="mpi")
        assert (total == comm.size).all(), total
    with found.check("MPI.WCHAR and typecode 'U' move as their bytes"):
        for spec in ("U", MPI.WCHAR):
            got = np.zeros(4 * comm.size, "U1")
            comm.Allgather([np.array(list("mcr\u20ac"), "U1"), spec], [got, spec], backend=GLOO)
            assert "".join(got) == "mcr\u20ac" * comm.size, got
    for code in ("f2", "e", "i2", "u8", "c8", "b1"):      # numpy's typecodes as struct's
        with found.check(f"typecode {code!r} is an element type"):
            got = np.zeros(3 * comm.size, dtype=code)
            comm.Allgather([np.arange(3).astype(code), code], [got, code], backend=GLOO)
            assert (got == np.tile(np.arange(3).astype(code), comm.size)).all(), got


@checked(min_size=2)
def bad_first_call_on_a_new_communicator_raises_alone(comm, found):
    """A bad first call raises before the (collective) Gloo group is made. Rank 0 makes it in a
    thread (not raised in 2 s: blocked); then every rank makes a valid Gloo call, so none hangs."""
    fresh = comm.Dup()
    if comm.rank == 0:
        outcome = []
        thread = threading.Thread(target=lambda: outcome.append(raised(
            fresh.Bcast, torch.zeros(3), fresh.size, backend=GLOO)), daemon=True)
        thread.start()
        thread.join(2.0)
        comm.bcast("go on", root=0)
        with found.check("Bcast with root = size, alone on a new communicator"):
            assert not thread.is_alive(), (
                "blocked: the Gloo group was created before the arguments were checked")
        thread.join()
        with found.check("Bcast with root = size raises IndexError"):
            assert isinstance(outcome[0], IndexError), outcome
    else:
        comm.bcast(None, root=0)
    with found.check("Barrier on the new communicator"):
        fresh.Barrier(backend=GLOO)
    fresh.Free()


@case
def threads_share_a_communicators_gloo_point_to_point(comm):
    """MPI_THREAD_MULTIPLE on one communicator's Gloo point-to-point, each step of which hung
    before its state had a lock: two threads' first calls (one set-up, not two); two threads'
    large Sendrecvs (sends in flight lost, a send's work waited twice); and a thread probing
    ANY_SOURCE while another receives (the header it waits for stashed by the probe)."""
    right, left = ring(comm)
    fresh, errors = comm.Dup(), []

    def in_threads(*bodies):
        def run(body):
            try:
                body()
            except BaseException as exc:          # (reported below, not lost in a thread)
                errors.append(exc)
        threads = [threading.Thread(target=run, args=(b,), daemon=True) for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a thread hangs"
        assert not errors, errors

    def exchanges(tag, times, n):
        def body():
            for i in range(times):
                got = torch.zeros(n)
                fresh.Sendrecv(torch.full((n,), float(1000 * comm.rank + i)), right, tag, got,
                               left, tag, backend=GLOO)
                assert (got == float(1000 * left + i)).all(), (tag, i, got[:3])
        return body

    in_threads(exchanges(1, 1, 4), exchanges(2, 1, 4))            # both threads' first call
    in_threads(exchanges(3, 20, 100000), exchanges(4, 20, 100000))    # 400 kB: no eager
    messages, stop = 300, threading.Event()

    def prober():
        while not stop.is_set():
            fresh.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, backend=GLOO)

    def receiver():
        try:
            got = torch.zeros(2)
            for i in range(messages):
                fresh.Recv(got, left, i, backend=GLOO)
                assert got[0].item() == i, (i, got)
        finally:
            stop.set()

    def sender():
        for i in range(messages):
            fresh.Send(torch.full((2,), float(i)), right, i, backend=GLOO)
    in_threads(prober, receiver, sender)
    fresh.Free()


@case
def store_variables_one_process_lacks_raise_everywhere(comm):
    """MCR_STORE_HOST set on the last process only (mpiexec -x forgotten), or an
    MCR_BACKEND_TIMEOUT it cannot use: every process raises ValueError naming the variable at the
    set-up (the others waited for a store that process did not make); then Gloo works."""
    last = comm.size - 1
    for name, value, fragments in [
            ("MCR_STORE_HOST", "127.0.0.1", ["MCR_STORE_HOST differs", "rank 0: (unset)",
                                             f"rank {last}: 127.0.0.1", "mpiexec -x"]),
            ("MCR_BACKEND_TIMEOUT", "abc", [f"rank {last} (", "MCR_BACKEND_TIMEOUT: expected a "
                                            "number of seconds >= 0 (0: none), got 'abc'"])]:
        if comm.size == 1 and name == "MCR_STORE_HOST":
            continue
        fresh = comm.Dup()
        saved = os.environ.pop(name, None)
        if comm.rank == last:
            os.environ[name] = value
        try:
            with raises(ValueError, *fragments):
                fresh.Allreduce(mcr.IN_PLACE, torch.ones(2), backend=GLOO)
        finally:
            os.environ.pop(name, None)
            if saved is not None:
                os.environ[name] = saved
        fresh.Free()
    fresh = comm.Dup()
    x = torch.ones(2)
    fresh.Allreduce(mcr.IN_PLACE, x, backend=GLOO)
    assert x.tolist() == [float(comm.size)] * 2, x
    fresh.Free()


test_mpi = mpi_cases(__name__)


# -- the store: a file on one host, TCP at MCR_STORE_HOST ---------------------------------
STORE_SCRIPT = """
import os, sys
import torch
import mcr
from mcr.backends.store import rendezvous
comm = mcr.COMM_WORLD
if sys.argv[1] == "hidden" and comm.rank == 1:     # as a process that sees another /tmp
    seen = os.path.exists
    os.path.exists = lambda path: "mcr-store-" not in path and seen(path)
store = rendezvous(comm)
store.set(f"rank{comm.rank}", str(comm.rank))
assert [store.get(f"rank{r}").decode() for r in range(comm.size)] == ["0", "1"]
where = store.path if hasattr(store, "path") else f"{store.host}:{store.port}"
print(f"rank {comm.rank} {type(store).__name__} at {where}")
x = torch.full((3,), float(comm.rank + 1))
comm.Allreduce(mcr.IN_PLACE, x, backend="gloo")
print(f"rank {comm.rank} gloo sum {x.tolist()}")
comm.Barrier()
"""


def run_store_script(mode, **env):
    """STORE_SCRIPT at 2 ranks: its output, after checking that both ranks met and summed."""
    result = launch.run(2, [sys.executable, "-c", STORE_SCRIPT, mode], timeout=120,
                        env=dict(mpi_env(), MCR_BACKEND_TIMEOUT="60", **env),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0, result.stdout
    for rank in (0, 1):
        assert f"rank {rank} gloo sum [3.0, 3.0, 3.0]" in result.stdout, result.stdout
    return result.stdout


def test_store_on_one_host_is_a_file(tmp_path):
    """One host: the ranks meet in a FileStore in the temporary folder (under Open MPI in
    the job's folder there), removed at exit."""
    out = run_store_script("file", TMPDIR=str(tmp_path))
    folder = f"{tmp_path}/ompi\\.[0-9]+/[0-9]+" if OPEN_MPI else re.escape(str(tmp_path))
    for rank in (0, 1):
        assert re.search(f"rank {rank} FileStore at {folder}/mcr-store-", out), out
    assert list(tmp_path.iterdir()) == []


KILLED_SCRIPT = """
import os, signal, time
import torch
import mcr
comm = mcr.COMM_WORLD
comm.Allreduce(mcr.IN_PLACE, torch.ones(2), backend="gloo")
comm.Barrier()
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)                 # (rank 0 is stopped by the launcher, its atexit never runs)
"""


@pytest.mark.skipif(not OPEN_MPI, reason="the job's folder is Open MPI's; "
                                         "other launchers leave the file")
def test_a_killed_job_leaves_no_store_file(tmp_path):
    """Open MPI: the store file is in the job's folder, which the launcher removes."""
    result = launch.run(2, [sys.executable, "-c", KILLED_SCRIPT], timeout=120,
                        env=dict(mpi_env(), TMPDIR=str(tmp_path)),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result.returncode != 0 and "signal 9" in result.stdout, result.stdout
    assert list(tmp_path.rglob("mcr-store-*")) == []


def test_a_forked_child_leaves_its_parents_store_file(tmp_path, monkeypatch):
    """A forked child's exit does not remove the store files its parent made (it inherits the
    list and the atexit handler); the parent's exit does."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("OMPI_FILE_LOCATION", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(store, "_made", [])
    path = store._new_file()
    assert path is not None and os.path.dirname(path) == str(tmp_path), path
    child = os.fork()
    if child == 0:
        store._remove_made()
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0 and os.path.exists(path)
    store._remove_made()
    assert not os.path.exists(path)


def test_store_is_tcp_where_a_rank_cannot_see_the_file(tmp_path):
    """A rank that does not see rank 0's file: TCP on 127.0.0.1, and the file is removed."""
    out = run_store_script("hidden", TMPDIR=str(tmp_path))
    for rank in (0, 1):
        assert f"rank {rank} TCPStore at 127.0.0.1:" in out, out
    assert list(tmp_path.iterdir()) == []


def non_loopback_address():
    """An IPv4 address of this machine other than 127.x, or None."""
    found = []
    with contextlib.suppress(OSError):
        found += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None,
                                                            socket.AF_INET)]
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        found += subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                                timeout=10).stdout.split()
    return next((a for a in found if "." in a and not a.startswith("127.")), None)


def test_store_at_mcr_store_host():
    """MCR_STORE_HOST a non-loopback address (as across nodes): the ranks meet and run there."""
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no IPv4 address but loopback")
    out = run_store_script("tcp", MCR_STORE_HOST=address)
    for rank in (0, 1):
        assert f"rank {rank} TCPStore at {address}:" in out, out
