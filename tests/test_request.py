"""Requests: many non-blocking operations outstanding at once, completed with
Waitall/Testall/Wait/Test in different orders; the Status they fill; and the
Request keeping the buffers of its operation alive until it completes.

Expected data comes from util.rank_data (any rank computes any rank's data).
"""

import gc
import weakref

import numpy as np
import torch

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases
from util import all_data, assert_equal, raises, rank_data

K = 6      # messages per (sender, receiver) pair


def right(comm):
    return (comm.rank + 1) % comm.size


def left(comm):
    return (comm.rank - 1) % comm.size


def post_all_to_all(comm, dtype=torch.float32, n=5):
    """K messages from every rank to every rank (self included), receives
    posted first. Returns (recv requests, send requests, [(buf, expected,
    source, tag)]) with the recv entries in the order of the recv requests."""
    recvs, sends, expect = [], [], []
    for src in range(comm.size):
        for k in range(K):
            tag = 100 * comm.rank + k            # tag names the receiver and k
            exp = rank_data(src, n + k, dtype, seed=comm.rank * K + k)
            buf = torch.zeros(n + k + 2, dtype=dtype)
            recvs.append(comm.Irecv(buf, src, tag))
            expect.append((buf, exp, src, tag))
    for dst in range(comm.size):
        for k in range(K):
            data = rank_data(comm.rank, n + k, dtype, seed=dst * K + k)
            sends.append(comm.Isend(data, dst, 100 * dst + k))
    return recvs, sends, expect


def check_received(expect, statuses=None):
    for i, (buf, exp, src, tag) in enumerate(expect):
        n = exp.numel()
        assert_equal(buf[:n], exp)
        assert_equal(buf[n:], torch.zeros(buf.numel() - n, dtype=buf.dtype))
        if statuses is not None:
            st = statuses[i]
            assert (st.source, st.tag) == (src, tag), (i, st.source, st.tag, src, tag)
            assert st.Get_count() == n, (i, st.Get_count(), n)
            assert st.Get_count(MPI.BYTE) == n * buf.element_size()


# -- Waitall / Testall -------------------------------------------------------------------


@case.quick
def waitall_many_with_statuses(comm):
    for dtype in (torch.float32, torch.float16, torch.complex128):
        recvs, sends, expect = post_all_to_all(comm, dtype)
        statuses = []
        assert mcr.Request.Waitall(recvs + sends, statuses) is True
        assert len(statuses) == len(recvs) + len(sends)
        assert all(isinstance(st, mcr.Status) for st in statuses)
        check_received(expect, statuses[:len(recvs)])
        assert all(not r for r in recvs + sends)       # all are REQUEST_NULL now


@case
def waitall_extends_a_short_statuses_list(comm):
    recvs, sends, expect = post_all_to_all(comm, torch.int64)
    first = mcr.Status()
    statuses = [first]
    mcr.Request.Waitall(sends + recvs, statuses)
    assert statuses[0] is first and len(statuses) == len(sends) + len(recvs)
    check_received(expect, statuses[len(sends):])


@case
def waitall_empty_and_already_complete(comm):
    assert mcr.Request.Waitall([]) is True
    assert mcr.Request.Testall([]) is True
    recvs, sends, expect = post_all_to_all(comm)
    reqs = recvs + sends
    mcr.Request.Waitall(reqs)
    # null requests complete at once, with an empty status
    statuses = []
    assert mcr.Request.Waitall(reqs, statuses) is True
    assert mcr.Request.Testall(reqs) is True
    assert statuses[0].source == MPI.ANY_SOURCE and statuses[0].tag == MPI.ANY_TAG
    assert reqs[0].Wait() is True and reqs[0].Test() is True
    check_received(expect)


@case
def polling_with_testall(comm):
    # receives are posted before anybody sends: Testall must say False first
    n = 4
    recvs = []
    bufs = []
    for src in range(comm.size):
        b = torch.zeros(n, dtype=torch.float64)
        recvs.append(comm.Irecv(b, src, 5))
        bufs.append(b)
    assert mcr.Request.Testall(recvs) is False
    assert all(recvs)                       # still active
    comm.Barrier()
    sends = [comm.Isend(rank_data(comm.rank, n, torch.float64, dst), dst, 5)
             for dst in range(comm.size)]
    statuses = []
    while not mcr.Request.Testall(recvs + sends, statuses):
        pass
    for src, b in enumerate(bufs):
        assert_equal(b, rank_data(src, n, torch.float64, comm.rank))
        assert statuses[src].source == src and statuses[src].Get_count() == n


@case
def collectives_completed_by_testall(comm):
    x = rank_data(comm.rank, 6, torch.int32)
    s = torch.zeros(6, dtype=torch.int32)
    g = torch.zeros(6 * comm.size, dtype=torch.int32)
    reqs = [comm.Iallreduce(x, s), comm.Iallgather(x, g), comm.Ibarrier()]
    while not mcr.Request.Testall(reqs):
        pass
    data = all_data(comm.size, 6, torch.int32)
    assert_equal(s, torch.stack(data).sum(0, dtype=torch.int32))
    assert_equal(g, torch.cat(data))


# -- Wait / Test in different orders -----------------------------------------------------


def rank_order(n, rank):
    """Completion order of n requests: reversed on odd ranks, rotated by rank."""
    order = list(range(n))
    if rank % 2:
        order.reverse()
    shift = (rank * 7) % max(n, 1)
    return order[shift:] + order[:shift]


@case
def wait_individually_in_rank_dependent_order(comm):
    recvs, sends, expect = post_all_to_all(comm, torch.bfloat16)
    reqs = recvs + sends
    statuses = [mcr.Status() for _ in reqs]
    for i in rank_order(len(reqs), comm.rank):
        assert reqs[i].Wait(statuses[i]) is True
        assert not reqs[i]
    check_received(expect, statuses[:len(recvs)])


@case
def wait_sends_before_receives_reversed(comm):
    """Small sends complete without their receives; receives waited last to first."""
    recvs, sends, expect = post_all_to_all(comm, torch.uint8)
    mcr.Request.Waitall(sends)
    statuses = {}
    for i in reversed(range(len(recvs))):
        statuses[i] = mcr.Status()
        recvs[i].Wait(statuses[i])
    check_received(expect, [statuses[i] for i in range(len(recvs))])


@case
def per_request_test_loops(comm):
    recvs, sends, expect = post_all_to_all(comm, torch.complex64)
    pending = dict(enumerate(recvs + sends))
    statuses = {}
    order = rank_order(len(pending), comm.rank)
    while pending:
        for i in order:
            if i in pending:
                st = mcr.Status()
                if pending[i].Test(st):
                    statuses[i] = st
                    del pending[i]
    check_received(expect, [statuses[i] for i in range(len(recvs))])


@case
def request_test_false_until_message_sent(comm):
    buf = torch.zeros(3)
    req = comm.Irecv(buf, left(comm), 77)
    st = mcr.Status()
    assert req.Test(st) is False
    assert req                              # still active
    comm.Barrier()                          # nobody sends before this
    sreq = comm.Isend(torch.full((3,), float(comm.rank)), right(comm), 77)
    while not req.Test(st):
        pass
    sreq.Wait()
    assert_equal(buf, torch.full((3,), float(left(comm))))
    assert (st.source, st.tag, st.Get_count()) == (left(comm), 77, 3)


@case
def p2p_and_collectives_outstanding_together(comm):
    """Ring messages, Iallreduce, Ibcast, Iallgather, Ialltoall, Ireduce and
    Ibarrier all outstanding at once; completed in a rank-dependent order."""
    size, rank = comm.size, comm.rank
    n = 4
    data = all_data(size, n, torch.float64)
    x = data[rank]
    rbuf = torch.zeros(n, dtype=torch.float64)
    red = torch.zeros(n, dtype=torch.float64)
    bc = x.clone() if rank == size - 1 else torch.zeros(n, dtype=torch.float64)
    ag = torch.zeros(n * size, dtype=torch.float64)
    a2a_send = torch.arange(size * 2, dtype=torch.float64) + 100 * rank
    a2a = torch.zeros(size * 2, dtype=torch.float64)
    rd = torch.zeros(n, dtype=torch.float64)
    reqs = [comm.Irecv(rbuf, left(comm), 1),
            comm.Iallreduce(x, red, op=mcr.MAX),
            comm.Ibcast(bc, root=size - 1),
            comm.Isend(x, right(comm), 1),
            comm.Iallgather(x, ag),
            comm.Ialltoall(a2a_send, a2a),
            comm.Ireduce(x, rd, op=mcr.SUM, root=0),
            comm.Ibarrier()]
    for i in rank_order(len(reqs), rank):
        reqs[i].Wait()
    whole = torch.stack(data)
    assert_equal(rbuf, data[left(comm)])
    assert_equal(red, whole.max(0).values)
    assert_equal(bc, data[size - 1])
    assert_equal(ag, torch.cat(data))
    expected_a2a = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float64) + 100 * s
                              for s in range(size)])
    assert_equal(a2a, expected_a2a)
    if rank == 0:
        assert_equal(rd, whole.sum(0))


@case
def waitany_waitsome_testany_testsome(comm):
    """The inherited completion class methods return mpi4py's results."""
    recvs, sends, expect = post_all_to_all(comm, torch.int16)
    mcr.Request.Waitall(sends)
    done = set()
    while len(done) < len(recvs):
        st = mcr.Status()
        i = mcr.Request.Waitany(recvs, st)
        assert 0 <= i < len(recvs) and i not in done
        buf, exp, src, tag = expect[i]
        assert (st.source, st.tag) == (src, tag)
        assert st.Get_count(MPI.BYTE) == 2 * exp.numel()
        done.add(i)
    assert mcr.Request.Waitany(recvs) == MPI.UNDEFINED
    check_received(expect)
    recvs, sends, expect = post_all_to_all(comm, torch.int16)
    got = set()
    while len(got) < len(recvs):
        idx = mcr.Request.Waitsome(recvs)
        assert idx is not None and not got & set(idx)
        got |= set(idx)
        flag = mcr.Request.Testany(sends)
        assert isinstance(flag, tuple) and len(flag) == 2
        mcr.Request.Testsome(sends)
    mcr.Request.Waitall(sends)
    check_received(expect)


@case
def cancel_unmatched_receive(comm):
    buf = torch.zeros(2)
    req = comm.Irecv(buf, left(comm), 31000)      # nobody sends this tag
    req.Cancel()
    st = mcr.Status()
    req.Wait(st)
    assert st.Is_cancelled()
    assert_equal(buf, torch.zeros(2))


# -- the Request keeps its buffers alive ------------------------------------------------


def scribble(n, dtype, times=8):
    """Allocate and fill tensors like a freed buffer, to catch reuse of its memory."""
    return [torch.full((n,), -7, dtype=dtype) for _ in range(times)]


@case
def irecv_dropped_buffer_is_the_one_received_into(comm):
    """Drop our reference; a weak reference shows the Request still holds the
    tensor (alive after gc), and it holds the received data after Wait."""
    n = 1 << 14
    buf = torch.zeros(n)
    ref = weakref.ref(buf)
    req = comm.Irecv(buf, left(comm), 4)
    del buf
    gc.collect()
    junk = scribble(n, torch.float32)
    assert ref() is not None, "the Request let its receive buffer die"
    sreq = comm.Isend(torch.arange(n, dtype=torch.float32) * (comm.rank + 1), right(comm), 4)
    held = ref()
    req.Wait()
    sreq.Wait()
    assert_equal(held, torch.arange(n, dtype=torch.float32) * (left(comm) + 1))
    del junk


@case
def isend_keeps_dropped_tensor_alive(comm):
    """A large (rendezvous) Isend from a temporary tensor: the data must still
    be there when the receiver, which posts late, takes it."""
    n = 1 << 18
    ref = weakref.ref(sreq_src := torch.arange(n, dtype=torch.float32) - comm.rank)
    sreq = comm.Isend(sreq_src, right(comm), 5)
    del sreq_src
    gc.collect()
    assert ref() is not None, "the Request let its send buffer die"
    junk = scribble(n, torch.float32)
    comm.Barrier()              # the receive is posted after the sender dropped its data
    out = torch.zeros(n)
    comm.Recv(out, left(comm), 5)
    sreq.Wait()
    del junk
    gc.collect()
    assert ref() is None, "the Request still holds the send buffer after Wait"
    assert_equal(out, torch.arange(n, dtype=torch.float32) - left(comm))


def poll_until(comm, done, what, rounds=2000):
    """Make calls (each gives the operations of dropped requests a turn) until
    `done()` holds on every rank."""
    flag = torch.zeros(1, dtype=torch.int32)
    for _ in range(rounds):
        flag[0] = int(bool(done()))
        comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MIN)
        if flag[0]:
            return
    raise AssertionError(f"{what}: not after {rounds} calls")


@case
def isend_dropped_before_completion(comm):
    """``comm.Isend(temporary, ...)`` as a statement: request and tensor both
    dropped at once. A large (rendezvous) message, received only after the
    sender's memory is reused, must still arrive intact (MPI would read the
    freed tensor otherwise); so too from a persistent request dropped while
    active, and from requests freed (``Free``) while active."""
    n = 1 << 18
    comm.Isend(torch.arange(n, dtype=torch.float32) - comm.rank, right(comm), 9)
    preq = comm.Send_init(torch.arange(n, dtype=torch.float32) * 2 + comm.rank, right(comm), 10)
    preq.Start()
    del preq
    comm.Isend(torch.arange(n, dtype=torch.float32) * 3 + comm.rank, right(comm), 11).Free()
    preq = comm.Send_init(torch.arange(n, dtype=torch.float32) * 4 + comm.rank, right(comm), 12)
    preq.Start()
    preq.Free()
    assert not preq
    del preq
    gc.collect()
    junk = scribble(n, torch.float32)
    comm.Barrier()
    out = torch.zeros(n)
    for tag, times in ((9, -1), (10, 2), (11, 3), (12, 4)):
        comm.Recv(out, left(comm), tag)
        if times < 0:
            assert_equal(out, torch.arange(n, dtype=torch.float32) - left(comm))
        else:
            assert_equal(out, torch.arange(n, dtype=torch.float32) * times + left(comm))
    del junk


@case
def irecv_dropped_before_completion(comm):
    """A dropped Irecv keeps its buffer until the message is in, then lets it
    go (nothing leaks); a dropped one that fails (truncated) is a
    RuntimeWarning, not an error raised by some later, unrelated call."""
    import warnings
    n = 1 << 16
    for backend in ("mpi", "gloo"):
        buf = torch.zeros(n)
        ref = weakref.ref(buf)
        comm.Irecv(buf, left(comm), 11, backend=backend)
        del buf
        gc.collect()
        assert ref() is not None, (backend, "the dropped Irecv let its buffer die")
        comm.Send(torch.ones(n), right(comm), 11, backend=backend)
        poll_until(comm, lambda: ref() is None,
                   f"{backend}: the buffer of a completed, dropped Irecv released")
        if comm.size == 1 and backend == "mpi":
            continue        # Open MPI truncates a message to itself silently
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            comm.Irecv(torch.zeros(2), left(comm), 12, backend=backend)
            comm.Send(torch.ones(10), right(comm), 12, backend=backend)
            poll_until(comm, lambda: seen, f"{backend}: the truncation's warning")
            got = torch.zeros(3)
            req = comm.Irecv(got, left(comm), 13, backend=backend)   # unaffected
            comm.Send(torch.full((3,), 5.0), right(comm), 13, backend=backend)
            req.Wait()
            assert_equal(got, torch.full((3,), 5.0))
        (w,) = seen
        assert w.category is RuntimeWarning, (backend, w)
        text = str(w.message)
        assert f"on backend {backend!r}" in text and "freed or dropped" in text, text
        assert "truncat" in text.lower(), text
        with warnings.catch_warnings(record=True) as seen:    # a failed Recv raises, once
            warnings.simplefilter("always")
            comm.Send(torch.ones(10), right(comm), 14, backend=backend)
            with raises(mcr.Exception):
                comm.Recv(torch.zeros(2), left(comm), 14, backend=backend)
            poll_until(comm, lambda: True, "", rounds=5)
        assert not seen, [str(w.message) for w in seen]


@case
def request_in_a_garbage_cycle_keeps_its_buffers(comm):
    """A pending request collected with a garbage cycle (held by an object in
    a reference cycle, or by an exception kept in a frame) keeps its buffers
    until the message is in, as a dropped one does: the cycle collector must
    not clear them first. Before, MPI wrote into the freed buffer (the
    tensors allocated after it were overwritten) and Gloo crashed."""
    n = 1 << 16
    for backend, persistent in (("mpi", False), ("mpi", True), ("gloo", False)):
        buf = torch.zeros(n)
        ref = weakref.ref(buf)
        if persistent:
            req = comm.Recv_init(buf, left(comm), 21)
            req.Start()
        else:
            req = comm.Irecv(buf, left(comm), 21, backend=backend)
        cycle = [req]
        cycle.append(cycle)
        del buf, req, cycle
        gc.collect()
        assert ref() is not None, (backend, persistent, "the collector let the buffer go")
        junk = scribble(n, torch.float32)
        comm.Barrier()              # the message comes after every rank collected
        comm.Send(torch.full((n,), 3.0), right(comm), 21, backend=backend)
        poll_until(comm, lambda: ref() is None,
                   f"{backend}: the buffer of a completed, collected Irecv released")
        assert all(bool((j == -7).all()) for j in junk), (backend, persistent,
                                                          "a freed buffer was written into")


@case
def numpy_and_dlpack_buffers_kept_alive(comm):
    n = 1 << 12
    arr_ref = weakref.ref(arr := np.zeros(n))
    req = comm.Irecv(arr, left(comm), 6)
    del arr
    t = torch.zeros(n, dtype=torch.int64)

    class DLOnly:
        def __init__(self, tensor):
            self._t = tensor

        def __dlpack__(self, **kwargs):
            return self._t.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self._t.__dlpack_device__()

    req2 = comm.Irecv(DLOnly(t), left(comm), 7)       # the wrapper is dropped at once
    gc.collect()
    assert arr_ref() is not None
    s1 = comm.Isend(np.arange(n, dtype=np.float64) + comm.rank, right(comm), 6)
    s2 = comm.Isend(torch.arange(n) * comm.rank, right(comm), 7)
    held = arr_ref()
    mcr.Request.Waitall([req, req2, s1, s2])
    np.testing.assert_array_equal(held, np.arange(n, dtype=np.float64) + left(comm))
    assert_equal(t, torch.arange(n) * left(comm))


@case
def buffer_export_held_until_completion(comm):
    """A bytearray cannot be resized while a Request holds its buffer; after
    Wait (or Waitall) the export is released and resizing works again."""
    for complete in ("Wait", "Waitall", "Test"):
        ba = bytearray(8)
        req = comm.Irecv(memoryview(ba), left(comm), 8)   # the memoryview is dropped
        try:
            ba.extend(b"xx")
        except BufferError:
            pass
        else:
            raise AssertionError("bytearray resized while an Irecv holds its buffer")
        sreq = comm.Isend(bytes([comm.rank + 1]) * 8, right(comm), 8)
        if complete == "Wait":
            req.Wait()
        elif complete == "Waitall":
            mcr.Request.Waitall([req])
        else:
            while not req.Test():
                pass
        sreq.Wait()
        assert bytes(ba) == bytes([left(comm) + 1]) * 8
        ba.extend(b"xx")                                  # export released
        assert len(ba) == 10


@case
def collective_request_keeps_buffers_alive(comm):
    n = 1 << 12
    out_ref = weakref.ref(out := torch.zeros(n))
    req = comm.Iallreduce(torch.full((n,), float(comm.rank + 1)), out)
    del out
    gc.collect()
    junk = scribble(n, torch.float32)
    assert out_ref() is not None
    held = out_ref()
    req.Wait()
    assert_equal(held, torch.full((n,), float(sum(range(1, comm.size + 1)))))
    del junk


# -- status arguments (MPI and Gloo requests alike) ----------------------------------------

# the backends of the requests in a list: all MPI, all Gloo, and mixed
REQUEST_MIXES = (("mpi", "mpi", "mpi"), ("gloo", "gloo", "gloo"), ("gloo", "mpi", "gloo"))


def post_ring(comm, backends, tag):
    """Per entry of `backends`, an Irecv of k + 2 float32 from the left (tag
    `tag` + k) and an Isend of as many to the right, on that backend.
    Returns (receives, sends, receive buffers)."""
    bufs = [torch.zeros(k + 2) for k in range(len(backends))]
    recvs = [comm.Irecv(bufs[k], left(comm), tag + k, backend=b)
             for k, b in enumerate(backends)]
    sends = [comm.Isend(rank_data(comm.rank, k + 2, seed=tag + k), right(comm), tag + k,
                        backend=b) for k, b in enumerate(backends)]
    return recvs, sends, bufs


def check_ring_status(comm, st, tag, k, what):
    got = (st.Get_source(), st.Get_tag(), st.Get_count())
    assert got == (left(comm), tag + k, k + 2), (what, got)


def untouched():
    """A Status whose source says that nothing wrote into it."""
    st = MPI.Status()
    st.source = 4321
    return st


@case
def statuses_tuples_and_short_lists_filled_as_mpi4py(comm):
    """A tuple of Status objects is filled (as far as it goes) and never
    extended; a short list is extended; by Waitall, Testall, Waitsome and
    Testsome, on MPI, Gloo and mixed requests."""
    for mix in REQUEST_MIXES:
        n = len(mix)
        # Waitall: a full tuple, a short tuple, a short list
        recvs, sends, _ = post_ring(comm, mix, 10)
        full = tuple(untouched() for _ in range(n))
        assert mcr.Request.Waitall(recvs, full) is True
        for k in range(n):
            check_ring_status(comm, full[k], 10, k, (mix, "Waitall tuple"))
        mcr.Request.Waitall(sends, (untouched(),))
        recvs, sends, _ = post_ring(comm, mix, 20)
        short = (untouched(),)
        mcr.Request.Waitall(recvs, short)
        assert len(short) == 1
        check_ring_status(comm, short[0], 20, 0, (mix, "Waitall short tuple"))
        mcr.Request.Waitall(sends)
        recvs, sends, _ = post_ring(comm, mix, 30)
        listed = [untouched()]
        mcr.Request.Waitall(recvs, listed)
        assert len(listed) == n, (mix, len(listed))
        for k in range(n):
            check_ring_status(comm, listed[k], 30, k, (mix, "Waitall short list"))
        mcr.Request.Waitall(sends)
        # Testall: a tuple longer than the requests keeps its extra entries
        recvs, sends, _ = post_ring(comm, mix, 40)
        longer = tuple(untouched() for _ in range(n + 1))
        while not mcr.Request.Testall(recvs, longer):
            pass
        for k in range(n):
            check_ring_status(comm, longer[k], 40, k, (mix, "Testall tuple"))
        assert longer[n].Get_source() == 4321
        mcr.Request.Waitall(sends)
        # Waitsome / Testsome: the first entries, in the order of the indices
        for method in (mcr.Request.Waitsome, mcr.Request.Testsome):
            recvs, sends, _ = post_ring(comm, mix, 50)
            seen = []
            while len(seen) < n:
                got = tuple(untouched() for _ in range(n))
                indices = method(recvs, got)
                assert indices is not None
                for pos, k in enumerate(indices):
                    check_ring_status(comm, got[pos], 50, k, (mix, method.__name__))
                assert all(st.Get_source() == 4321 for st in got[len(indices):])
                seen += indices
            assert sorted(seen) == list(range(n))
            assert method(recvs, ()) is None              # none active
            mcr.Request.Waitall(sends)


@case
def lowercase_methods_complete_every_backend_as_mpi4py(comm):
    """mpi4py's lowercase methods (wait, test, waitall, ..., get_status_*) on
    mcr's requests wait for the operation on every backend (mpi4py's own
    would return at once for Gloo's), return what mpi4py's return (None for
    a buffer operation, the object for mpi4py's irecv, in a list mixed with
    mcr's requests), and the get_status methods complete nothing."""
    R = MPI.Request
    for t, mix in enumerate(REQUEST_MIXES):
        n, tag = len(mix), 100 + 20 * t

        def expect(bufs, base, mix=mix):
            for k in range(len(mix)):
                assert_equal(bufs[k], rank_data(left(comm), k + 2, seed=base + k))

        recvs, sends, bufs = post_ring(comm, mix, tag)
        statuses = []
        assert R.waitall(recvs, statuses) == [None] * n
        expect(bufs, tag)
        for k in range(n):
            check_ring_status(comm, statuses[k], tag, k, (mix, "waitall"))
        assert [s.wait() for s in sends] == [None] * n and not any(recvs + sends)
        recvs, sends, bufs = post_ring(comm, mix, tag + 5)
        assert [r.wait() for r in recvs] == [None] * n
        expect(bufs, tag + 5)
        while not R.testall(sends)[0]:
            pass
        recvs, sends, bufs = post_ring(comm, mix, tag + 10)
        while not R.get_status_all(recvs):      # non-destructive: still active after
            pass
        assert all(recvs) and R.get_status_any(recvs)[1] is True
        assert sorted(R.get_status_some(recvs)) == list(range(n)) and all(recvs)
        assert recvs[0].get_status() is True and recvs[0]
        seen = []
        while len(seen) < n:
            index, flag, obj = R.testany(recvs)
            if flag:
                assert obj is None and index not in seen
                seen.append(index)
        assert R.testany(recvs) == (MPI.UNDEFINED, True, None)   # none active
        expect(bufs, tag + 10)
        assert R.waitany(sends)[1] is None
        indices, objects = R.waitsome(sends)
        assert objects == [None] * len(indices)
        for s in sends:
            flag, obj = s.test()
            while not flag:
                flag, obj = s.test()
            assert obj is None
        assert R.waitsome(sends) == (None, None)
        # mpi4py's irecv among mcr's requests: its object, at its place
        recvs, sends, bufs = post_ring(comm, mix, tag + 15)
        mine = comm.to_mpi4py()
        objects = mine.irecv(source=left(comm), tag=tag + 19)
        mine.isend({"from": comm.rank}, dest=right(comm), tag=tag + 19).wait()
        got = R.waitall(recvs[:1] + [objects] + recvs[1:])
        assert got == [None, {"from": left(comm)}] + [None] * (n - 1), got
        expect(bufs, tag + 15)
        objects = mine.irecv(source=left(comm), tag=tag + 18)
        mine.isend(("any", comm.rank), dest=right(comm), tag=tag + 18).wait()
        got = []
        while len(got) < 2:
            index, obj = R.waitany([objects, sends[0]])
            got.append((index, obj))
        assert sorted(got) == [(0, ("any", left(comm))), (1, None)], got
        R.waitall(sends)


@case
def bad_status_arguments_refused_before_anything_completes(comm):
    """statuses/status that are not Status objects (or a list or tuple of
    them), and requests lists holding other objects: TypeError naming the
    argument and position, before any request is waited for (they are all
    still active, the string is not written into), on MPI, Gloo and mixed
    requests; then the requests complete normally."""
    for mix in REQUEST_MIXES:
        recvs, sends, bufs = post_ring(comm, mix, 60)
        reqs = recvs + sends
        word = "x"
        not_statuses = ["not-a-status"]
        R = mcr.Request
        bad = [
            (lambda: R.Waitall(reqs, word), ["statuses", "list or tuple", "got str"]),
            (lambda: R.Waitall(reqs, not_statuses), ["statuses[0]", "MPI.Status", "got str"]),
            (lambda: R.Waitall(reqs, [MPI.Status(), 3]), ["statuses[1]", "got int"]),
            (lambda: R.Waitall(reqs, 7), ["statuses", "got int"]),
            (lambda: R.Testall(reqs, (MPI.Status(), "x")), ["statuses[1]", "got str"]),
            (lambda: R.Waitsome(reqs, word), ["statuses", "got str"]),
            (lambda: R.Waitsome(reqs, [None]), ["statuses[0]", "got NoneType"]),
            (lambda: R.Testsome(reqs, {}), ["statuses", "got dict"]),
            (lambda: R.Waitany(reqs, word), ["status", "got str"]),
            (lambda: R.Testany(reqs, 1.5), ["status", "got float"]),
            (lambda: R.Waitany(reqs, [MPI.Status()]), ["status", "got list"]),
            (lambda: R.Waitall(reqs + ["x"]), [f"requests[{len(reqs)}]", "got str"]),
            (lambda: R.Waitany([reqs[0], 3]), ["requests[1]", "got int"]),
            (lambda: R.Waitsome([None] + reqs), ["requests[0]", "got NoneType"]),
            (lambda: R.Testsome(reqs + [MPI.Status()], []), [f"requests[{len(reqs)}]"]),
            (lambda: R.Waitall(5), ["requests", "got int"]),
        ]
        for req in reqs:
            bad += [(lambda req=req: req.Wait(word), ["status", "got str"]),
                    (lambda req=req: req.Test(b"x"), ["status", "got bytes"]),
                    (lambda req=req: req.Get_status([]), ["status", "got list"])]
        for call, fragments in bad:
            with raises(TypeError, *fragments):
                call()
            assert all(reqs), (mix, fragments)             # nothing completed
        assert word == "x" and not_statuses == ["not-a-status"]
        statuses = []
        mcr.Request.Waitall(reqs, statuses)
        for k in range(len(mix)):
            check_ring_status(comm, statuses[k], 60, k, (mix, "after the errors"))
            assert_equal(bufs[k], rank_data(left(comm), k + 2, seed=60 + k))
        assert not any(reqs)


test_mpi = mpi_cases(__name__)
