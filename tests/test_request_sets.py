"""Request.Waitany/Testany/Waitsome/Testsome and Sendrecv_replace at 1-4 ranks."""

import numpy as np
import torch

import mcr
from mcr import MPI
from mpi4py import MPI as _mpi4py
from mpiharness import case, mpi_cases
from util import assert_comm_works, assert_equal, raises, rank_data


def ring(comm):
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


@case
def waitany_completes_every_request_once(comm):
    right, left = ring(comm)
    bufs = [torch.zeros(k + 1, dtype=torch.int32) for k in range(4)]
    reqs = [comm.Irecv(bufs[k], left, tag=k) for k in range(4)]
    sends = [comm.Isend(rank_data(comm.rank, k + 1, torch.int32, seed=k), right, tag=k)
             for k in reversed(range(4))]
    seen = []
    while True:
        status = mcr.Status()
        index = mcr.Request.Waitany(reqs, status)
        if index == mcr.UNDEFINED:
            break
        seen.append(index)
        assert status.source == left and status.tag == index
        assert status.Get_count() == index + 1              # elements, not bytes
        assert_equal(bufs[index], rank_data(left, index + 1, torch.int32, seed=index))
    assert sorted(seen) == [0, 1, 2, 3]
    mcr.Request.Waitall(sends)
    assert mcr.Request.Testany(reqs) == (mcr.UNDEFINED, True)


@case
def polling_testany_until_done(comm):
    right, left = ring(comm)
    out = torch.zeros(3, dtype=torch.float64)
    reqs = [mcr.Request(), comm.Irecv(out, left, tag=7)]           # a null request too
    send = comm.Isend(rank_data(comm.rank, 3, torch.float64), right, tag=7)
    while True:
        index, flag = mcr.Request.Testany(reqs)
        if flag:
            break
    assert index == 1
    send.Wait()
    assert_equal(out, rank_data(left, 3, torch.float64))


@case
def waitsome_and_testsome_report_indices_and_statuses(comm):
    right, left = ring(comm)
    n = 5
    bufs = [torch.zeros(2, dtype=torch.bfloat16) for _ in range(n)]
    reqs = [comm.Irecv(bufs[k], left, tag=10 + k) for k in range(n)]
    sends = [comm.Isend(rank_data(comm.rank, 2, torch.bfloat16, seed=k), right, tag=10 + k)
             for k in range(n)]
    done = []
    polled = False
    while len(done) < n:
        statuses = []
        if not polled:
            indices = mcr.Request.Testsome(reqs, statuses)    # may be empty
            polled = True
        else:
            indices = mcr.Request.Waitsome(reqs, statuses)
        assert indices is not None
        assert len(statuses) >= len(indices)
        for index, status in zip(indices, statuses):
            assert status.tag == 10 + index and status.source == left
            assert status.Get_count() == 2
        done += indices
    assert sorted(done) == list(range(n))
    for k in range(n):
        assert_equal(bufs[k], rank_data(left, 2, torch.bfloat16, seed=k))
    assert mcr.Request.Waitsome(reqs) is None            # none active
    assert mcr.Request.Testsome(reqs) is None
    mcr.Request.Waitall(sends)


@case
def send_statuses_are_mpi4pys(comm):
    """Among completed requests, a send's status is what mpi4py gives there,
    for every set method, whatever the MPI library writes (MPICH writes
    nothing, and mpi4py starts from the empty status)."""
    right, left = ring(comm)

    def complete(cls, method, reqs):
        """{index: (source, tag, bytes)} of the completed `reqs`."""
        out = {}
        while len(out) < len(reqs):
            sts = [_mpi4py.Status() for _ in reqs]
            if method in ("Waitall", "Testall"):
                if getattr(cls, method)(reqs, sts) is not False:
                    out = dict(enumerate(sts))
            else:
                done = getattr(cls, method)(reqs, sts) or []
                out.update((i, sts[k]) for k, i in enumerate(done))
        return {i: (st.source, st.tag, st.Get_count(MPI.BYTE)) for i, st in out.items()}

    for method in ("Waitall", "Testall", "Waitsome", "Testsome"):
        for _ in range(3):                 # (the statuses' memory is reused)
            buf = np.zeros(3, np.float32)
            theirs = complete(_mpi4py.Request, method, [
                _mpi4py.Comm.Irecv(comm, buf, left, 7),
                _mpi4py.Comm.Isend(comm, np.full(3, comm.rank, np.float32), right, 7)])
            ours = complete(mcr.Request, method, [
                comm.Irecv(torch.zeros(3), left, 7),
                comm.Isend(rank_data(comm.rank, 3), right, 7)])
            assert theirs[0] == (left, 7, 12) == ours[0], (method, theirs, ours)
            assert ours[1] == theirs[1], (method, "send", ours[1], "mpi4py", theirs[1])
    assert_comm_works(comm)


@case
def get_status_peeks_without_completing(comm):
    right, left = ring(comm)
    out = torch.zeros(4, dtype=torch.int16)
    req = comm.Irecv(out, left, tag=21)
    send = comm.Isend(rank_data(comm.rank, 4, torch.int16), right, tag=21)
    status = mcr.Status()
    while not req.Get_status(status):
        pass
    assert req                                   # still a live request: not completed
    assert status.source == left and status.tag == 21 and status.Get_count() == 4
    req.Wait()
    send.Wait()
    assert not req
    assert_equal(out, rank_data(left, 4, torch.int16))


@case
def probe_then_receive_with_a_reused_status(comm):
    right, left = ring(comm)
    status = mcr.Status()
    out = torch.zeros(4, dtype=torch.float64)
    comm.Sendrecv(torch.ones(4, dtype=torch.float64), right, 1, out, left, 1, status)
    assert status.Get_count() == 4                    # elements of the receive
    send = comm.Isend(np.arange(6, dtype=np.int32), right, tag=2)
    assert comm.Probe(left, 2, status) is True
    assert status.Get_count() == 24                   # probe: bytes, not the old type
    assert status.Get_count(MPI.INT32_T) == 6
    while not comm.Iprobe(left, 2, status):
        pass
    assert status.source == left and status.tag == 2 and status.Get_count() == 24
    buf = np.zeros(6, dtype=np.int32)
    comm.Recv(buf, left, 2, status)
    assert status.Get_count() == 6 and buf.tolist() == list(range(6))
    send.Wait()
    with raises(IndexError, "source: rank"):
        comm.Probe(comm.size + 3)
    with raises(ValueError, "tag: tag -4"):
        comm.Iprobe(tag=-4)
    assert_comm_works(comm)


@case
def sendrecv_replace_on_a_ring(comm):
    right, left = ring(comm)
    for seed, dtype in enumerate([torch.float32, torch.float16, torch.int64, torch.complex64]):
        buf = rank_data(comm.rank, 6, dtype, seed)
        status = mcr.Status()
        comm.Sendrecv_replace(buf, right, 3, left, 3, status)
        assert_equal(buf, rank_data(left, 6, dtype, seed))
        assert status.source == left and status.Get_count() == 6
    # explicit count: only the first 4 elements travel, the rest stay
    buf = rank_data(comm.rank, 6, torch.int32, 9)
    comm.Sendrecv_replace([buf, 4], right, source=left)
    expected = torch.cat([rank_data(left, 6, torch.int32, 9)[:4],
                          rank_data(comm.rank, 6, torch.int32, 9)[4:]])
    assert_equal(buf, expected)


@case
def sendrecv_replace_rejects_bad_input(comm):
    with raises(IndexError, "dest: rank", str(comm.size)):
        comm.Sendrecv_replace(torch.zeros(2), comm.size)
    with raises(BufferError, "buf:", "read-only"):
        comm.Sendrecv_replace(b"abcd", 0)
    with raises(BufferError, "not contiguous"):
        comm.Sendrecv_replace(torch.zeros(4)[::2], 0)
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)
