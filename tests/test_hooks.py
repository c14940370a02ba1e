"""Call hooks (mcr.hooks): every buffer method passes through them, once, on
every backend, before it communicates.

Each case installs a recording hook, makes real calls on MPI and Gloo in
every form, and checks what the hook saw (operation, form, chosen backend,
arguments, result) and that the results are still right (computed with torch
on the whole data). A hook that raises stops the call before any process
communicates: every rank raises, and the communicator still works.
"""

import torch

import mcr
import mcr.hooks
from mpiharness import case, mpi_cases
from util import assert_comm_works, raises

BACKENDS = ("mpi", "gloo")


class Recorder:
    """A hook that records each Call and the result its callable receives."""

    def __init__(self):
        self.calls = []
        self.results = []

    def __call__(self, call):
        self.calls.append(call)
        return self.results.append

    def seen(self):
        return [(c.op, c.form, c.backend) for c in self.calls]


def data(rank, n=4):
    return torch.arange(n, dtype=torch.float64) + 10 * rank


@case
def every_form_on_every_backend(comm):
    size, rank = comm.size, comm.rank
    total = sum(data(r) for r in range(size))
    for backend in BACKENDS:
        rec = Recorder()
        with mcr.hooks.installed(rec):
            y = torch.zeros(4, dtype=torch.float64)
            assert comm.Allreduce(data(rank), y, backend=backend) is None
            assert torch.equal(y, total), (backend, y, total)

            y2 = torch.zeros(4, dtype=torch.float64)
            req = comm.Iallreduce(data(rank), y2, mcr.SUM, backend=backend)
            req.Wait()
            assert torch.equal(y2, total)

            b = data(0) if rank == 0 else torch.zeros(4, dtype=torch.float64)
            preq = comm.Bcast_init(b, 0, backend=backend)
            preq.Start()
            preq.Wait()
            preq.Free()
            assert torch.equal(b, data(0))

            got = torch.zeros(4, dtype=torch.float64)
            right, left = (rank + 1) % size, (rank - 1) % size
            status = mcr.Status()
            comm.Sendrecv(data(rank), right, 7, got, left, 7, status, backend=backend)
            assert torch.equal(got, data(left)) and status.Get_source() == left
        # a persistent request emulated on Gloo posts Ibcast at Start: seen as such
        started = [("Bcast", "nonblocking", backend)] if backend == "gloo" else []
        assert rec.seen() == [("Allreduce", "blocking", backend),
                              ("Allreduce", "nonblocking", backend),
                              ("Bcast", "persistent", backend), *started,
                              ("Sendrecv", "blocking", backend)], rec.seen()
        first = rec.calls[0]
        assert first.comm is comm and first.args[2] is mcr.SUM    # the default op
        assert rec.calls[1].args[2] is mcr.SUM                  # op given positionally
        sendrecv = rec.calls[-1]
        assert sendrecv.args[1:3] == (right, 7) and sendrecv.args[4:7] == (left, 7, status)
        # the results: None for blocking calls, the very Request and Prequest returned
        assert rec.results[0] is None and rec.results[1] is req
        assert rec.results[2] is preq and rec.results[-1] is None
    # the default backend is the one reported when backend=None
    rec = Recorder()
    old = comm.backend
    comm.backend = "gloo"
    try:
        with mcr.hooks.installed(rec):
            comm.Barrier()
    finally:
        comm.backend = old
    assert rec.seen() == [("Barrier", "blocking", "gloo")], rec.seen()


@case
def a_raising_hook_stops_the_call(comm):
    def refuse(call):
        raise RuntimeError(f"refused {call.op}")

    for backend in BACKENDS:
        y = torch.full((4,), -1.0, dtype=torch.float64)
        with mcr.hooks.installed(refuse):
            with raises(RuntimeError, "refused Allreduce"):
                comm.Allreduce(data(comm.rank), y, backend=backend)
            with raises(RuntimeError, "refused Gather"):
                comm.Igather(data(comm.rank), None, 0, backend=backend)
        assert torch.equal(y, torch.full((4,), -1.0, dtype=torch.float64))
        assert_comm_works(comm)


@case
def neighborhood_collectives_are_seen(comm):
    # every form, on MPI, Gloo and auto (MPI for these), with (sendbuf, recvbuf)
    size, rank = comm.size, comm.rank
    ring = comm.Create_cart([size], periods=[True])
    left, right = (rank - 1) % size, (rank + 1) % size
    want = torch.cat([data(left), data(right)])
    for backend in (*BACKENDS, "auto"):
        rec = Recorder()
        x = data(rank)
        ys = [torch.zeros(8, dtype=torch.float64) for _ in range(3)]
        with mcr.hooks.installed(rec):
            assert ring.Neighbor_allgather(x, ys[0], backend=backend) is None
            req = ring.Ineighbor_allgather(x, ys[1], backend=backend)
            req.Wait()
            preq = ring.Neighbor_allgather_init(x, ys[2], backend=backend)
            preq.Start()
            preq.Wait()
            preq.Free()
        for y in ys:
            assert torch.equal(y, want), (backend, y, want)
        ran = "mpi" if backend == "auto" else backend
        assert rec.seen() == [("Neighbor_allgather", form, ran)
                              for form in ("blocking", "nonblocking", "persistent")], rec.seen()
        for call, y in zip(rec.calls, ys):
            assert call.comm is ring and call.args[0] is x and call.args[1] is y
        assert rec.results == [None, req, preq]

    def refuse(call):
        raise RuntimeError(f"refused {call.op}")

    y = torch.full((8,), -1.0, dtype=torch.float64)
    for backend in BACKENDS:
        with mcr.hooks.installed(refuse):
            with raises(RuntimeError, "refused Neighbor_alltoall"):
                ring.Ineighbor_alltoall(torch.ones(8, dtype=torch.float64), y,
                                        backend=backend)
        assert torch.equal(y, torch.full((8,), -1.0, dtype=torch.float64))
    ring.Neighbor_allgather(data(rank), y, backend="gloo")   # the ring still works
    assert torch.equal(y, want)
    ring.Free()


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
    first, second = (lambda c: order.append(1)), (lambda c: order.append(2))
    with mcr.hooks.installed(first), mcr.hooks.installed(second):
        comm.Barrier()
    assert order == [1, 2]


test_mpi = mpi_cases(__name__, sizes=(1, 2, 3), timeout=180)
