"""Point-to-point on buffers.

The matrix cases: each send mode in each form against each receive form, and Sendrecv, Isendrecv
(native and composed) and their _replace forms, on MPI and Gloo, over every torch and numpy element
type, with each message's Status. Then PROC_NULL, wildcards, matching order, large messages,
buffer kinds, Bsend's buffer, Issend's completion, composed Isendrecv requests and bad arguments.
Expected values come from opref; what a message does not cover must stay.
"""

import array
import contextlib
import itertools
import time

import numpy as np
import torch

import mcr
import mpi4py.MPI
from mcr import MPI
from mpiharness import case, mpi_cases
from opmatrix import FORMS, Findings, name
from opref import MOVE, cat, copy, data, expect, place, sentinel
from util import assert_comm_works, assert_truncated, raises, ring

TYPES = MOVE + [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16,
                np.int32, np.uint32, np.int64, np.uint64, np.complex64, np.complex128, np.bool_]
MODES = ("Send", "Bsend", "Ssend", "Rsend")
BACKENDS = ("mpi", "gloo")
F64 = torch.float64


def partner(comm):
    """Pairs (0,1), (2,3), ...; the odd one out at odd sizes gets PROC_NULL."""
    p = comm.rank ^ 1
    return p if p < comm.size else MPI.PROC_NULL


def blank(want):
    """A receive buffer that differs from `want` in every element."""
    return ~want if want.dtype in (torch.bool, np.bool_) else sentinel(len(want), want.dtype)


def message(sender, tag, dtype, n=None):
    """What `sender` sends with `tag`: by default 0 to 4 elements, the length depending on both."""
    return data(sender, (sender + tag) % 5 if n is None else n, dtype, seed=tag)


def receive_buffer(want, extra=2):
    """A buffer `extra` elements longer than `want`, all different, and what it holds with it."""
    tail = sentinel(extra, want.dtype)
    return cat([blank(want), tail]), cat([want, tail])


def wildcards(tag, source):
    """(source, tag) to receive message `tag`: ANY_SOURCE for odd tags, ANY_TAG every third."""
    return (MPI.ANY_SOURCE if tag % 2 else source), (MPI.ANY_TAG if tag % 3 == 0 else tag)


@contextlib.contextmanager
def attached(nbytes, messages):
    """MPI's buffer for Bsend: the messages plus an overhead each."""
    MPI.Attach_buffer(bytearray(nbytes + messages * MPI.BSEND_OVERHEAD))
    try:
        yield
    finally:
        MPI.Detach_buffer()


def send(comm, mode, form, buf, dest, tag, backend="mpi"):
    """Send in `mode` and `form`: None once sent, else the started request."""
    if form == "blocking":
        assert getattr(comm, mode)(buf, dest, tag, backend=backend) is None
        return None
    if form == "nonblocking":
        return getattr(comm, "I" + mode[0].lower() + mode[1:])(buf, dest, tag, backend=backend)
    req = getattr(comm, mode + "_init")(buf, dest, tag, backend=backend)
    assert isinstance(req, mcr.Prequest), type(req)
    return started(req)


def started(req):
    req.Start()
    return req


def finish(reqs):
    """Wait for the requests that are not None; free the persistent ones."""
    reqs = [r for r in reqs if r is not None]
    mcr.Request.Waitall(reqs)
    for r in reqs:
        if isinstance(r, mcr.Prequest):
            r.Free()


# -- every element type: the matrix ----------------------------------------------------
@case.matrix(mode=MODES, form=FORMS, recv=("Irecv", "Recv_init"), backend=BACKENDS,
             quick=lambda mode, form, recv, backend: (form, recv) == ("blocking", "Irecv") or
             (mode, form, recv) == ("Send", "persistent", "Recv_init"))
@case.matrix(mode=MODES[:3], form=FORMS, recv=("Recv",), backend=BACKENDS)
def send_recv(comm, mode, form, recv, backend):
    """Irecv and Recv_init: a ring, every receive posted first (Rsend needs it). Recv (no Rsend):
    pairs, the even rank sending first; the odd one out receives from PROC_NULL."""
    found, (right, left) = Findings(), ring(comm)
    peer, dest = (partner(comm),) * 2 if recv == "Recv" else (left, right)
    comm.Barrier(backend=backend)   # Gloo's group is made here, by all
    bsend = attached(1 << 16, len(TYPES)) if mode == "Bsend" and backend == "mpi" \
        else contextlib.nullcontext()       # Gloo's sends are buffered: no buffer needed
    with bsend:
        wants, recvs, sends = [], [], []
        for tag, dtype in enumerate(TYPES):
            if peer == MPI.PROC_NULL:
                buf = want = data(comm.size + 7, 5, dtype)
                wants.append((buf, copy(want), (peer, tag)))
            else:
                buf, want = receive_buffer(message(peer, tag, dtype))
                wants.append((buf, want, wildcards(tag, peer)))
            if recv == "Irecv":
                recvs.append(comm.Irecv(buf, *wants[-1][2], backend=backend))
            elif recv == "Recv_init":
                recvs.append(started(comm.Recv_init(buf, *wants[-1][2], backend=backend)))
        comm.Barrier()
        statuses = [mcr.Status() for _ in TYPES]
        for tag, dtype in enumerate(TYPES):
            buf, _, source = wants[tag]
            with found.check(f"{name(dtype)} {mode} {form}"):
                if recv == "Recv" and comm.rank % 2:
                    comm.Recv(buf, *source, statuses[tag], backend=backend)
                sends.append(send(comm, mode, form, message(comm.rank, tag, dtype), dest, tag,
                                  backend))
                if recv == "Recv" and comm.rank % 2 == 0:
                    comm.Recv(buf, *source, statuses[tag], backend=backend)
        with found.check("completion"):
            if recvs:
                mcr.Request.Waitall(recvs, statuses)
            finish(recvs + sends)
    for tag, (dtype, (buf, want, _), st) in enumerate(zip(TYPES, wants, statuses)):
        with found.check(f"{name(dtype)} by {mode} {form} to {recv}"):
            expect(buf, want)
            sent = data(0, 0, dtype) if peer == MPI.PROC_NULL else message(peer, tag, dtype)
            got = (st.source, st.tag, st.Get_count(), st.Get_count(MPI.BYTE))
            assert got == ((MPI.PROC_NULL, MPI.ANY_TAG) if peer == MPI.PROC_NULL else
                           (peer, tag)) + (len(sent), sent.nbytes), got
    found.report()


@case.matrix(call=("Isendrecv", "Isendrecv_replace"), backend=BACKENDS, composed=(False, True))
@case.matrix(call=("Sendrecv", "Sendrecv_replace"), backend=BACKENDS, composed=(False,),
             quick=lambda **_: True)
def sendrecv(comm, call, backend, composed):
    """Around the ring, every element type; then message specs in the _replace forms. composed:
    an Irecv and an Isend under one request, as on MPICH (whose Isendrecv sets no status)."""
    found, (right, left) = Findings(), ring(comm)
    replace = call.endswith("_replace")
    messages = []        # (send spec, receive spec or None, buffer, expected, count)
    for tag, dtype in enumerate(TYPES):
        if replace:
            buf, want = message(comm.rank, tag, dtype, 3), message(left, tag, dtype, 3)
            messages.append((buf, None, buf, want, len(want)))
        else:
            buf, want = receive_buffer(message(left, tag, dtype))
            messages.append((message(comm.rank, tag, dtype), buf, buf, want, len(want) - 2))
    if replace:
        a, t = data(comm.rank, 4, np.int16), data(comm.rank, 6, torch.int32)
        messages += [([a, 2, 1, MPI.SHORT], None, a, place(a, [data(left, 4, np.int16)[1:3]],
                                                          [1]), 2),
                     ([t, 4], None, t, cat([data(left, 6, torch.int32)[:4], t[4:]]), 4)]
    mcr._core._compose_isendrecv(True if composed else None)
    try:
        reqs, statuses = [], [mcr.Status() for _ in messages]
        for tag, (sendspec, recvspec, *_) in enumerate(messages):
            dest = float(right) if tag == 1 else right     # (a float rank, as mpi4py takes it)
            args = (sendspec, dest, tag) + ((recvspec,) if not replace else ()) + \
                wildcards(tag, left)
            with found.check(f"message {tag}"):
                if call.startswith("I"):
                    reqs.append(getattr(comm, call)(*args, backend=backend))
                else:
                    assert getattr(comm, call)(*args, statuses[tag], backend=backend) is None
        mcr.Request.Waitall(reqs, statuses if reqs else None)
    finally:
        mcr._core._compose_isendrecv(None)         # as the library calls for
    for tag, ((*_, buf, want, count), st) in enumerate(zip(messages, statuses)):
        with found.check(f"message {tag} ({type(buf).__name__} of {buf.dtype}) by {call}"):
            expect(buf, want)
            assert (st.source, st.tag, st.Get_count()) == (left, tag, count), \
                (st.source, st.tag, st.Get_count())
    found.report()


# -- PROC_NULL, wildcards, the Status, matching -----------------------------------------
@case
def proc_null_peer(comm):
    """Sends in every mode and form (None too) complete at once; receives (and Probe) leave the
    buffer untouched, with a status of source PROC_NULL, tag ANY_TAG and count 0."""
    null, x = MPI.PROC_NULL, torch.ones(4)
    # a send's status is undefined in MPI: on MPI, mcr's is the library's (source PROC_NULL on
    # Open MPI, ANY_SOURCE on MPICH); on Gloo, PROC_NULL
    lib = mpi4py.MPI.Status()
    mpi4py.MPI.COMM_SELF.Isend(np.zeros(4), null, 123).Wait(lib)
    receives = {
        "Recv": lambda y, st, b: comm.Recv(y, null, 0, st, backend=b),
        "Irecv": lambda y, st, b: comm.Irecv(y, null, backend=b).Wait(st),
        "Recv_init": lambda y, st, b: started(comm.Recv_init(y, null, backend=b)).Wait(st),
        "Sendrecv": lambda y, st, b: comm.Sendrecv(x, null, 0, y, null, 0, st, backend=b),
        "Isendrecv": lambda y, st, b: comm.Isendrecv(x, null, 0, y, null, 0, backend=b).Wait(st),
        "Sendrecv_replace": lambda y, st, b: comm.Sendrecv_replace(y, null, 0, null, 0, st,
                                                                   backend=b),
        "Isendrecv_replace": lambda y, st, b: comm.Isendrecv_replace(y, null, 0, null, 0,
                                                                     backend=b).Wait(st),
        "Probe": lambda y, st, b: comm.Probe(null, 0, st, backend=b)}
    for backend in BACKENDS:
        with attached(1 << 10, 24):
            for mode, form, buf in itertools.product(MODES, FORMS, (x, None)):
                req, st = send(comm, mode, form, buf, null, 123, backend), mcr.Status()
                if req is not None:
                    req.Wait(st)
                    assert st.source == (lib.source if backend == "mpi" else null), \
                        (mode, form, backend, st.source, lib.source)
                finish([req])
        for composed, (what, call), y in itertools.product(
                (None, True), receives.items(), (torch.full((4,), 5.0), None)):
            if y is None and "replace" in what:
                continue
            st = mcr.Status()
            mcr._core._compose_isendrecv(composed)
            try:
                call(y, st, backend)
            finally:
                mcr._core._compose_isendrecv(None)
            assert y is None or torch.equal(y, torch.full((4,), 5.0)), (what, y)
            assert (st.source, st.tag, st.Get_count()) == (null, MPI.ANY_TAG, 0), (what, backend)


@case
def status_counts_and_many_sources(comm):
    """Get_count in any datatype, the accessors; rank 0 receiving from all by ANY_SOURCE/TAG."""
    (right, left), st = ring(comm), mcr.Status()
    comm.Sendrecv(data(comm.rank, 3, F64), right, 5, sentinel(4, F64), left, 5, st)
    assert (st.Get_source(), st.Get_tag(), st.error) == (left, 5, MPI.SUCCESS)
    assert (st.Get_count(MPI.BYTE), st.Get_count(MPI.DOUBLE), st.Get_count(MPI.FLOAT),
            st.Get_count("d")) == (24, 3, 6, 3)
    comm.Sendrecv(torch.ones(3, dtype=torch.int16), right, 3, torch.zeros(4, dtype=torch.int16),
                  left, 3, st)
    assert st.Get_count(MPI.INT32_T) == MPI.UNDEFINED and st.Get_count(MPI.BYTE) == 6
    req = comm.Isend(data(comm.rank, comm.rank + 1, F64), 0, 50 + comm.rank)
    if comm.rank == 0:
        seen = set()
        for _ in range(comm.size):
            buf, st = sentinel(comm.size + 3, F64), mcr.Status()
            comm.Recv(buf, MPI.ANY_SOURCE, MPI.ANY_TAG, st)
            src = st.source
            assert st.tag == 50 + src and st.Get_count() == src + 1, (src, st.tag)
            expect(buf, cat([data(src, src + 1, F64), sentinel(comm.size + 2 - src, F64)]))
            seen.add(src)
        assert seen == set(range(comm.size))
    req.Wait()


@case
def matching_by_tag_then_in_order(comm):
    """By tag, not by arrival; with one source and tag in order; a message to oneself."""
    right, left = ring(comm)
    reqs = [comm.Isend(torch.full((4,), float(10 * comm.rank + t)), right, t) for t in (1, 2, 3)]
    reqs += [comm.Isend(torch.full((4,), float(k + 100 * comm.rank)), right, 7) for k in range(4)]
    for tag, value in [(3, 10 * left + 3), (1, 10 * left + 1), (2, 10 * left + 2)] + \
            [(7, k + 100 * left) for k in range(4)]:
        buf = torch.zeros(4)
        comm.Recv(buf, left, tag)
        expect(buf, torch.full((4,), float(value)), f"tag {tag}")
    mcr.Request.Waitall(reqs)
    x, y, st = data(comm.rank, 6, torch.complex128), torch.zeros(6, dtype=torch.complex128), \
        mcr.Status()
    r, s = comm.Irecv(y, comm.rank, 4), comm.Isend(x, comm.rank, 4)
    s.Wait()
    r.Wait(st)
    expect(y, x)
    assert (st.source, st.tag, st.Get_count(), st.Get_count(MPI.BYTE)) == (comm.rank, 4, 6, 96)


@case
def large_message_ring(comm):
    """Past the eager limit (the rendezvous path)."""
    (right, left), n = ring(comm), 1 << 19
    out = torch.zeros(n)
    r = comm.Irecv(out, left, 9)
    comm.Send(torch.arange(n, dtype=torch.float32) + comm.rank, right, 9)
    r.Wait()
    expect(out, torch.arange(n, dtype=torch.float32) + left)


# -- buffer kinds ------------------------------------------------------------------------
def buffer_kinds(me, src):
    """(what, `me`'s send buffer, receive buffer, what it then holds, count, its base if a view)."""
    mine, theirs = data(me, 12, F64), data(src, 12, F64)
    big, row = torch.full((20,), -1.0, dtype=F64), torch.zeros(2, 4, dtype=F64)
    text = [f"hello from {r:02d}".encode() for r in (me, src)]
    dots = bytearray(b"." * 20)
    ints = [data(r, 4, torch.int64).tolist() for r in (me, src)]
    return [
        ("2-D into a slice", mine.reshape(3, 4), big[5:17], place(big, [theirs], [5]), 12, big),
        ("a row: an offset", mine.reshape(3, 4)[1], row[1], torch.stack([row[0], theirs[4:8]]),
         4, row),
        ("numpy 2-D", mine.numpy().reshape(3, 4), np.zeros((3, 4)),
         theirs.numpy().reshape(3, 4), 12),
        ("Fortran order: memory order moves", np.asfortranarray(mine.numpy().reshape(3, 4)),
         np.zeros(12), theirs.numpy().reshape(3, 4).T.ravel(), 12),
        ("torch to numpy", data(me, 5, torch.int32), np.zeros(5, np.int32),
         data(src, 5, np.int32), 5),
        ("numpy to torch", data(me, 5, np.complex64), torch.zeros(5, dtype=torch.complex64),
         data(src, 5, torch.complex64), 5),
        ("bytes into a bytearray", text[0], bytearray(32), text[1] + bytes(32 - 13), 13),
        ("float32 into a bytearray: bytes", data(me, 3), bytearray(12),
         data(src, 3).numpy().tobytes(), 12),
        ("memoryview slices", memoryview(text[0])[:5], memoryview(dots)[10:],
         b"." * 10 + text[1][:5] + b"." * 5, 5, dots),
        ("array.array into torch", array.array("d", [me + 0.5] * 4), torch.zeros(4, dtype=F64),
         torch.full((4,), src + 0.5, dtype=F64), 4),
    ] + [(f"array.array {code}", array.array(code, ints[0]), array.array(code, [0] * 6),
          array.array(code, ints[1] + [0, 0]), 4) for code in "bBhHiIlLqQfd"]


def itemsize(buf):
    return buf.element_size() if isinstance(buf, torch.Tensor) else memoryview(buf).itemsize


@case
def buffer_kinds_sent_and_received(comm):
    """Every other kind by Sendrecv, the others by Isend and Recv."""
    right, left = ring(comm)
    for tag, (what, x, y, want, count, *view) in enumerate(buffer_kinds(comm.rank, left)):
        st, holder = mcr.Status(), view[0] if view else y
        if tag % 2:
            req = comm.Isend(x, right, tag)
            comm.Recv(y, left, tag, st)
            req.Wait()
        else:
            comm.Sendrecv(x, right, tag, y, left, tag, st)
        if isinstance(holder, torch.Tensor):
            expect(holder, want, what)
        else:
            assert bytes(memoryview(holder)) == bytes(memoryview(want)), (what, holder)
        assert (st.Get_count(), st.Get_count(MPI.BYTE)) == (count, count * itemsize(y)), what


# -- send modes ---------------------------------------------------------------------------
@case
def send_modes_take_message_specs(comm):
    """[buf, count, displ, datatype] on both sides, in every mode."""
    (right, left), x = ring(comm), data(comm.rank, 8, torch.int32)
    with attached(1 << 10, 4):
        for tag, mode in enumerate(MODES):
            y = torch.zeros(8, dtype=torch.int32)
            r = comm.Irecv([y, 3, 2, MPI.INT], left, tag)
            comm.Barrier()
            finish([send(comm, mode, "blocking", [x, 3, 4, MPI.INT], right, tag)])
            r.Wait()
            expect(y, place(torch.zeros(8, dtype=torch.int32), [data(left, 8, torch.int32)[4:7]],
                            [2]), mode)


@case
def issend_completes_only_once_received(comm):
    """A synchronous send is not complete before the receive starts (MPI and Gloo)."""
    if comm.size == 1:
        return
    for backend in BACKENDS:
        comm.Barrier(backend=backend)        # Gloo's group is made here, by all
        if comm.rank % 2 == 0 and comm.rank + 1 < comm.size:
            req = comm.Issend(data(comm.rank, 3), comm.rank + 1, 5, backend=backend)
            comm.Barrier()                   # the receiver has not posted its receive
            assert not req.Test(), backend
            comm.Barrier()
            req.Wait()
            continue
        comm.Barrier()
        comm.Barrier()
        if comm.rank % 2 == 1:
            y = torch.zeros(3)
            comm.Recv(y, comm.rank - 1, 5, backend=backend)
            expect(y, data(comm.rank - 1, 3), backend)


@case
def bsend_returns_before_any_receive(comm):
    """Bsend copies into the attached buffer. (Not tested: a Bsend larger than the buffer, which
    raises MPI_ERR_BUFFER but leaves Open MPI 5.0 hanging in a later Isendrecv, mpi4py's too.)"""
    (right, left), x = ring(comm), data(comm.rank, 256, F64)
    with attached(x.nbytes, 1):
        comm.Bsend(x, right, 1)              # no receive posted yet: buffered
        x.zero_()                            # the copy went out, not the tensor
        y = torch.zeros(256, dtype=F64)
        comm.Recv(y, left, 1)
        expect(y, data(left, 256, F64))
    comm.Barrier()


# -- composed Isendrecv requests, errors --------------------------------------------------
@case
def composed_isendrecv_requests(comm):
    """Composed (see `sendrecv`): truncation, Test, Waitany among other requests, and Free."""
    mcr._core._compose_isendrecv(True)
    right, left = ring(comm)
    try:
        tensor = torch.arange(10.0)                 # 40 bytes
        if comm.size > 1:    # (Open MPI: a receive from itself posted first does not truncate)
            req = comm.Isendrecv(tensor, right, 5, torch.zeros(3), left, 5)
            assert_truncated(req.Wait, "recvbuf", 12, left, 5, 40)
        sreq = comm.Isend(tensor, right, 6)
        req = comm.Isendrecv_replace(torch.zeros(1), MPI.PROC_NULL, 6, left, 6)
        assert_truncated(req.Wait, "buf", 4, left, 6, 40)
        sreq.Wait()
        mine, theirs = data(comm.rank, 4), data(left, 4)
        y, st = torch.zeros(4), mcr.Status()
        req = comm.Isendrecv(mine, right, 7, y, left, 7)
        while not req.Test(st):
            pass
        expect(y, theirs)
        assert (st.source, st.tag, st.Get_count()) == (left, 7, 4)
        z = torch.zeros(4)
        reqs = [comm.Irecv(z, left, 8), comm.Isendrecv(mine, right, 9, y, left, 9)]
        comm.Send(data(comm.rank + 1, 4), right, 8)
        assert sorted(mcr.Request.Waitany(reqs) for _ in range(2)) == [0, 1]
        expect(z, data(left + 1, 4))
        expect(y, theirs)
        w = torch.zeros(4)
        comm.Isendrecv(mine, right, 10, w, left, 10).Free()
        deadline = time.monotonic() + 30
        while not torch.equal(w, theirs):
            assert time.monotonic() < deadline, "a freed Isendrecv did not complete"
            mcr._core._poll()                         # drives MPI and freed requests
        comm.Barrier()
    finally:
        mcr._core._compose_isendrecv(None)
    assert_comm_works(comm)


@case
def bad_arguments_raise_before_anything_is_sent(comm):
    """Naming the argument: each send mode and form, then the Sendrecv family on MPI and Gloo."""
    x, y, size = torch.arange(4.), torch.zeros(4), comm.size
    with attached(1 << 10, 4):
        for mode, form in itertools.product(MODES, FORMS):
            for args, exc, fragments in [     # (a bad backend: test_backend_registry)
                    ((x, size, 0), IndexError, ("dest", str(size))),
                    ((x, 0, -5), ValueError, ("tag",)),
                    (([x, 10], 0, 0), ValueError, ("buf", "count 10", "past the buffer of 4")),
                    (("not a buffer", 0, 0), TypeError, ("buf",))]:
                with raises(exc, *fragments):
                    send(comm, mode, form, *args)
    for (method, args, exc, fragments), backend in itertools.product([
            ("Isendrecv", (x, 0, 0, [x, 2], 0, 0), ValueError, ("overlap",)),
            ("Isendrecv", (x, 0, 0, [y, 9], 0, 0), ValueError, ("recvbuf", "count 9")),
            ("Isendrecv", (x, 0, 0, b"read-only", 0, 0), BufferError, ("recvbuf", "read-only")),
            ("Isendrecv", (x, 0, 0, y, size + 3, 0), IndexError, ("source",)),
            ("Isendrecv", (x, 0, -2, y, 0, 0), ValueError, ("sendtag",)),
            ("Isendrecv_replace", (b"read-only", 0, 0, 0, 0), BufferError, ("buf", "read-only")),
            ("Isendrecv_replace", (y, -7, 0, 0, 0), IndexError, ("dest",)),
            ("Sendrecv_replace", (torch.zeros(2), size), IndexError, ("dest: rank", str(size))),
            ("Sendrecv_replace", (b"abcd", 0), BufferError, ("buf:", "read-only")),
            ("Sendrecv_replace", (torch.zeros(4)[::2], 0), BufferError, ("not contiguous",))],
            BACKENDS):
        with raises(exc, *fragments):
            getattr(comm, method)(*args, backend=backend)
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)
