"""Call hooks (mcr.hooks): every buffer method, on every backend and in every form, passes
through them once before it communicates; a raising hook stops the call, the comm still works."""

import torch

import mcr
import mcr.hooks
from mpiharness import case, mpi_cases
from util import assert_comm_works, assert_equal, raises

BACKENDS = ("mpi", "gloo")
FORMS = ("blocking", "nonblocking", "persistent")


class Recorder:
    """A hook that records each Call and the result its callable receives."""

    def __init__(self):
        self.calls, self.results = [], []

    def __call__(self, call):
        self.calls.append(call)
        return self.results.append

    def seen(self):
        return [(c.op, c.form, c.backend) for c in self.calls]


def refuse(call):
    raise RuntimeError(f"refused {call.op}")


def data(rank, n=4):
    return torch.arange(n, dtype=torch.float64) + 10 * rank


def untouched(n):
    return torch.full((n,), -1.0, dtype=torch.float64)


def ring_data(comm):
    """What Neighbor_allgather of data(rank) gives on a periodic ring."""
    return torch.cat([data((comm.rank - 1) % comm.size), data((comm.rank + 1) % comm.size)])


@case.matrix(backend=BACKENDS)
def every_form_on_every_backend(comm, backend):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    rec, status = Recorder(), mcr.Status()
    y, y2, got = (torch.zeros(4, dtype=torch.float64) for _ in range(3))
    b = data(0) if rank == 0 else torch.zeros(4, dtype=torch.float64)
    with mcr.hooks.installed(rec):
        assert comm.Allreduce(data(rank), y, backend=backend) is None
        req = comm.Iallreduce(data(rank), y2, mcr.SUM, backend=backend)
        req.Wait()
        preq = comm.Bcast_init(b, 0, backend=backend)
        preq.Start()
        preq.Wait()
        preq.Free()
        comm.Sendrecv(data(rank), right, 7, got, left, 7, status, backend=backend)
    total = sum(data(r) for r in range(size))
    for out, want in ((y, total), (y2, total), (b, data(0)), (got, data(left))):
        assert_equal(out, want)
    assert status.Get_source() == left
    # a persistent request emulated on Gloo posts Ibcast at Start: seen as such
    started = [("Bcast", "nonblocking", backend)] if backend == "gloo" else []
    assert rec.seen() == [("Allreduce", "blocking", backend),
                          ("Allreduce", "nonblocking", backend), ("Bcast", "persistent", backend),
                          *started, ("Sendrecv", "blocking", backend)], rec.seen()
    assert rec.calls[0].comm is comm and rec.calls[0].args[2] is mcr.SUM  # the default op
    assert rec.calls[1].args[2] is mcr.SUM                  # op given positionally
    assert rec.calls[-1].args[1:3] == (right, 7) and rec.calls[-1].args[4:7] == (left, 7, status)
    # the results: None for blocking calls, the very Request and Prequest returned
    assert rec.results[0] is None and rec.results[1] is req
    assert rec.results[2] is preq and rec.results[-1] is None


@case.matrix(backend=(*BACKENDS, "auto"))
def neighborhood_collectives_are_seen(comm, backend):
    # every form, on MPI, Gloo and auto (MPI for these), with (sendbuf, recvbuf)
    ring = comm.Create_cart([comm.size], periods=[True])
    rec, x = Recorder(), data(comm.rank)
    ys = [torch.zeros(8, dtype=torch.float64) for _ in FORMS]
    with mcr.hooks.installed(rec):
        assert ring.Neighbor_allgather(x, ys[0], backend=backend) is None
        req = ring.Ineighbor_allgather(x, ys[1], backend=backend)
        req.Wait()
        preq = ring.Neighbor_allgather_init(x, ys[2], backend=backend)
        preq.Start()
        preq.Wait()
        preq.Free()
    ring.Free()
    for y in ys:
        assert_equal(y, ring_data(comm))
    ran = "mpi" if backend == "auto" else backend
    assert rec.seen() == [("Neighbor_allgather", form, ran) for form in FORMS], rec.seen()
    for call, y in zip(rec.calls, ys):
        assert call.comm is ring and call.args[0] is x and call.args[1] is y
    assert rec.results == [None, req, preq]


@case.matrix(backend=BACKENDS)
def a_raising_hook_stops_the_call(comm, backend):
    ring = comm.Create_cart([comm.size], periods=[True])
    y, z = untouched(4), untouched(8)
    with mcr.hooks.installed(refuse):
        with raises(RuntimeError, "refused Allreduce"):
            comm.Allreduce(data(comm.rank), y, backend=backend)
        with raises(RuntimeError, "refused Gather"):
            comm.Igather(data(comm.rank), None, 0, backend=backend)
        with raises(RuntimeError, "refused Neighbor_alltoall"):
            ring.Ineighbor_alltoall(torch.ones(8, dtype=torch.float64), z, backend=backend)
    assert_equal(y, untouched(4))
    assert_equal(z, untouched(8))
    assert_comm_works(comm)
    ring.Neighbor_allgather(data(comm.rank), z, backend=backend)   # the ring still works
    assert_equal(z, ring_data(comm))
    ring.Free()


def raised(fn):
    """The RuntimeError fn() raises."""
    try:
        fn()
    except RuntimeError as exc:
        return exc
    raise AssertionError("RuntimeError not raised")


def fail_after(call):
    def then(result):
        raise RuntimeError(f"after {call.op}")
    return then


@case.matrix(backend=BACKENDS)
def a_hook_returning_a_non_callable_or_a_raising_one(comm, backend):
    # a non-callable is refused before the call runs; a callable raising after a non-blocking
    # or persistent call leaves its request on the error, not lost
    y = untouched(4)
    with mcr.hooks.installed(lambda call: 5):
        with raises(TypeError, "hook '", "<lambda>': returned int", "a callable", "or None"):
            comm.Iallreduce(data(comm.rank), y, backend=backend)
    assert_equal(y, untouched(4))
    with mcr.hooks.installed(fail_after):
        err = raised(lambda: comm.Iallreduce(data(comm.rank), y, backend=backend))
        assert str(err) == "after Allreduce" and "Allreduce (nonblocking) was made: its " \
            "request is the exception's `request`" in err.__notes__[0], err.__notes__
        err.request.Wait()
        assert_equal(y, sum(data(r) for r in range(comm.size)))
        err = raised(lambda: comm.Bcast_init(y, 0, backend=backend))
        assert str(err) == "after Bcast" and isinstance(err.request, mcr.Prequest)
        err.request.Free()
        err = raised(lambda: comm.Barrier(backend=backend))
        assert not hasattr(err, "request")      # (blocking: it ran)
    assert_comm_works(comm)


@case
def install_and_remove(comm):
    rec = Recorder()
    mcr.hooks.add(rec)
    comm.Barrier()
    mcr.hooks.remove(rec)
    comm.Barrier()
    assert rec.seen() == [("Barrier", "blocking", "mpi")]
    with raises(ValueError, "is not installed"):
        mcr.hooks.remove(rec)
    with raises(TypeError, "hook", "int"):
        mcr.hooks.add(3)
    # hooks run in the order they were added
    order = []
    with mcr.hooks.installed(lambda c: order.append(1)), \
            mcr.hooks.installed(lambda c: order.append(2)):
        comm.Barrier()
    assert order == [1, 2]
    # the default backend is the one reported when backend=None
    rec, old = Recorder(), comm.backend
    comm.backend = "gloo"
    try:
        with mcr.hooks.installed(rec):
            comm.Barrier()
    finally:
        comm.backend = old
    assert rec.seen() == [("Barrier", "blocking", "gloo")], rec.seen()


test_mpi = mpi_cases(__name__, sizes=(1, 2, 3), timeout=180)
