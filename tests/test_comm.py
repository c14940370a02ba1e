"""Communicators: Dup, Split, Create_group, Compare, Free, handles, pickling,
topologies (Create_cart, Create_graph, Create_dist_graph(_adjacent), Sub), and
operations on the communicators they make, at 1-4 ranks."""

import time

import numpy as np
import pytest
import torch
from mpi4py import MPI as M4

import mcr
from mpiharness import case, mpi_cases
from opref import cat, data, expect, reduce_ref
from util import assert_comm_works, raises, ring


def world_ranks(sub, comm):
    """The world ranks of `sub`'s processes, in sub-rank order (from mpi4py)."""
    return M4.Group.Translate_ranks(sub.Get_group(), list(range(sub.size)), comm.Get_group())


@case
def split_by_parity_runs_collectives(comm):
    sub = comm.Split(comm.rank % 2, key=-comm.rank)          # reversed order
    order = world_ranks(sub, comm)
    assert isinstance(sub, mcr.Comm)
    assert order == [r for r in reversed(range(comm.size)) if r % 2 == comm.rank % 2]
    out = torch.zeros(5)
    sub.Allreduce(data(comm.rank, 5), out)
    expect(out, reduce_ref([data(r, 5) for r in order], "SUM"))
    counts = [r % 3 for r in order]              # uneven Allgatherv in sub-rank order
    gathered = torch.zeros(sum(counts), dtype=torch.int64)
    sub.Allgatherv(data(comm.rank, comm.rank % 3, torch.int64), [gathered, counts])
    expect(gathered, cat([data(r, r % 3, torch.int64) for r in order]))
    buf = data(order[0], 4, torch.float16) if sub.rank == 0 else torch.zeros(4, dtype=torch.float16)
    sub.Ibcast(buf, root=0).Wait()
    expect(buf, data(order[0], 4, torch.float16))
    sub.Free()


@case
def dup_is_congruent_and_independent(comm):
    dup = comm.Dup()
    assert isinstance(dup, mcr.Comm)
    assert comm.Compare(dup) == M4.CONGRUENT and comm.Compare(comm) == M4.IDENT
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size   # do not mix:
    a, b = torch.zeros(2), torch.zeros(2)
    mcr.Request.Waitall([dup.Irecv(a, left, 0), comm.Irecv(b, left, 0),
                         comm.Isend(torch.full((2,), 1.0), right, 0),
                         dup.Isend(torch.full((2,), 2.0), right, 0)])
    assert a.tolist() == [2.0, 2.0] and b.tolist() == [1.0, 1.0]
    dup.Free()


@case
def create_group_of_the_first_half(comm):
    half = list(range((comm.size + 1) // 2))
    group = comm.Get_group().Incl(half)
    if comm.rank in half:
        sub = comm.Create_group(group)
        assert isinstance(sub, mcr.Comm) and sub.size == len(half)
        y = np.zeros(3, dtype=np.int32)
        sub.Allreduce(np.full(3, comm.rank, dtype=np.int32), y, op=mcr.MAX)
        assert y.tolist() == [max(half)] * 3
        sub.Free()
        # without a parent (MPI-4): an mcr.Comm (it was mpi4py's Intracomm), on any backend
        made = mcr.Comm.Create_from_group(group, "mcr.test")
        assert type(made) is mcr.Comm and made.size == len(half), type(made)
        x = torch.full((2,), float(comm.rank + 1))
        made.Allreduce(mcr.IN_PLACE, x, backend="gloo")
        assert torch.equal(x, torch.full((2,), float(sum(r + 1 for r in half))))
        made.Free()
        from mcr import MPI
        made = MPI.Comm.Create_from_group(group, "mcr.test2")
        assert isinstance(made, MPI.Comm) and isinstance(made, mcr.Comm), type(made)
        made.Free()
    group.Free()


@case
def free_is_idempotent_and_freed_comms_raise(comm):
    dup = comm.Dup()
    dup.Free()
    dup.Free()                                       # idempotent
    assert repr(dup) == "<mcr.Comm null>"
    with raises(ValueError, "comm:", "null"):
        dup.Bcast(torch.zeros(1))
    with raises(ValueError, "comm:", "null"):
        dup.Iallreduce(torch.ones(1), torch.zeros(1))
    for predefined in (mcr.COMM_WORLD, mcr.COMM_SELF):
        with pytest.raises(M4.Exception) as info:   # MPI's error, as mpi4py raises
            predefined.Free()
        assert isinstance(info.value, mcr.Exception) and info.value.Get_error_class() == M4.ERR_COMM
        predefined.free()                            # mpi4py's safe free: a no-op
        assert predefined and predefined.handle == M4.Comm(predefined).handle != 0
    assert_comm_works(comm)


@case.matrix(backend=("mpi", "gloo"))
def free_with_pending_operations_completes_them(comm, backend):
    # MPI: pending operations complete normally after MPI_Comm_free. Open MPI
    # freed pending collectives' schedules with the communicator (a segfault
    # at 3 and 4 ranks); pending point-to-point holds the communicator itself
    size, rank = comm.size, comm.rank
    dup = comm.Dup()
    x = torch.arange(4, dtype=torch.float64) + rank
    total = torch.zeros(4, dtype=torch.float64)
    sent = torch.arange(5, dtype=torch.float32) if rank == 0 else torch.zeros(5)
    gathered = torch.zeros(size, dtype=torch.int64)
    requests = [dup.Iallreduce(x, total, backend=backend),
                dup.Ibcast(sent, root=0, backend=backend),
                dup.Iallgather(torch.tensor([rank * 10]), gathered, backend=backend),
                dup.Ibarrier(backend=backend)]
    dup.Free()
    assert repr(dup) == "<mcr.Comm null>"
    with raises(ValueError, "comm:", "null"):
        dup.Iallreduce(x, total)
    mcr.Request.Waitall(requests)
    assert torch.equal(total, sum(torch.arange(4, dtype=torch.float64) + r for r in range(size)))
    assert sent.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert gathered.tolist() == [r * 10 for r in range(size)]
    dup = comm.Dup()
    got = torch.zeros(3, dtype=torch.int32)
    requests = [dup.Irecv(got, (rank - 1) % size, tag=7, backend=backend),
                dup.Isend(torch.full((3,), rank, dtype=torch.int32), (rank + 1) % size, tag=7,
                          backend=backend)]
    dup.Free()
    requests[0].Wait()
    requests[1].Wait()
    assert got.tolist() == [(rank - 1) % size] * 3
    # neighbourhood collectives (MPI's schedules, or mcr's exchanges in stages on private copies
    # of the communicator, as for a compressed collective), started persistent ones too
    dup = comm.Dup()
    ring = dup.Create_cart([size], periods=[True])
    left, right = ring.Shift(0, 1)
    blocks, want = torch.tensor([10. * rank + left, 10. * rank + right]), [10. * left + rank,
                                                                          10. * right + rank]
    swapped, again, summed = torch.zeros(2), torch.zeros(2), torch.zeros(4)
    persistent = ring.Neighbor_alltoall_init(blocks, again, backend=backend)
    persistent.Start()
    requests = [ring.Ineighbor_alltoall(blocks, swapped, backend=backend), persistent,
                dup.Iallreduce(x.float(), summed, backend=backend, compress="bf16")]  # exact
    ring.Free()
    dup.Free()
    mcr.Request.Waitall(requests)
    assert swapped.tolist() == want and again.tolist() == want, (swapped, again)
    assert torch.equal(summed, total.float()), summed
    persistent.Free()
    # a duplicate being made (Open MPI's Idup is a schedule on its parent too)
    dup = comm.Dup()
    copy, started = dup.Idup()
    dup.Free()
    started.Wait()
    assert_comm_works(copy)
    copy.Free()
    assert_comm_works(comm)


@case.matrix(backend=("mpi", "gloo"), let_go=("dropped", "freed"))
def free_frees_the_comm_after_a_request_let_go_completes(comm, backend, let_go):
    # Free defers MPI's free to the last pending operation: one whose request was
    # dropped or freed before it completed counts too, when it ends
    freed = []
    key = M4.Comm.Create_keyval(delete_fn=lambda handle, key, value: freed.append(value))
    dup = comm.Dup()
    dup.Set_attr(key, "dup")
    request = dup.Iallreduce(torch.ones(3), torch.zeros(3), backend=backend)
    if let_go == "freed":
        request.Free()
    del request
    dup.Free()
    deadline = time.monotonic() + 20
    while not comm.allreduce(bool(freed) or time.monotonic() > deadline, op=M4.LAND):
        assert_comm_works(comm)      # a call: the works of freed requests get a turn
    M4.Comm.Free_keyval(key)
    assert freed == ["dup"], freed


@case.matrix(backend=("mpi", "gloo"), wait=("Wait", "Test", "Waitall", "Waitany", "Waitsome"))
def free_frees_the_comm_after_a_request_whose_wait_failed(comm, backend, wait):
    # a truncated receive's wait raises: its operation is over, so the MPI free
    # comes at Free, not when the program lets the request go (it keeps it here)
    if comm.size == 1 and backend == "mpi":
        return                       # Open MPI truncates a message to oneself silently
    freed = []
    key = M4.Comm.Create_keyval(delete_fn=lambda handle, key, value: freed.append(value))
    dup = comm.Dup()
    dup.Set_attr(key, "dup")
    right, left = ring(comm)
    request = dup.Irecv(torch.zeros(2), left, 5, backend=backend)
    sent = dup.Isend(torch.ones(5), right, 5, backend=backend)
    statuses = [mcr.Status()]
    with pytest.raises(mcr.Exception) as raised:
        if wait == "Wait":
            request.Wait()
        elif wait == "Test":
            while not request.Test():
                pass
        else:
            getattr(mcr.Request, wait)([request], *([] if wait == "Waitany" else [statuses]))
    error = raised.value.Get_error_class()
    in_status = backend == "mpi" and wait in ("Waitall", "Waitsome")
    assert error == (M4.ERR_IN_STATUS if in_status else M4.ERR_TRUNCATE), raised.value
    assert any("does not fit the receive buffer of 8 bytes" in note
               for note in getattr(raised.value, "__notes__", ())), raised.value
    if in_status:                    # the request's own error in its status, as mpi4py gives
        assert M4.Get_error_class(statuses[0].Get_error()) == M4.ERR_TRUNCATE
    sent.Wait()
    dup.Free()
    M4.Comm.Free_keyval(key)
    assert freed == ["dup"], freed
    assert_comm_works(comm)


@case
def free_with_a_fusion_posts_its_buckets_first(comm):
    dup = comm.Dup()
    f = mcr.Fusion(dup, bucket_bytes=1 << 20)
    xs = [torch.full((3,), float(comm.rank + i)) for i in range(4)]
    ys = [torch.zeros(3) for _ in xs]
    requests = [f.Iallreduce(x, y) for x, y in zip(xs, ys)]   # one open bucket
    dup.Free()
    mcr.Request.Waitall(requests)
    for i, y in enumerate(ys):
        assert y.tolist() == [float(sum(range(comm.size)) + i * comm.size)] * 3
    f.close()
    assert_comm_works(comm)


class MyComm(mcr.Comm):
    """A user's subclass."""


@case
def subclass_dup_and_clone_keep_the_class_and_backend(comm):
    mine = MyComm(comm)
    mine.backend = "gloo"
    for copy in (mine.Dup(), mine.Clone()):
        assert type(copy) is MyComm and copy.backend == "gloo"
        assert comm.Compare(copy) == M4.CONGRUENT
        copy.backend = "mpi"
        out = torch.zeros(2)
        copy.Allreduce(torch.ones(2), out)
        assert out.tolist() == [comm.size] * 2
        copy.Free()
    sub = mine.Split(0, comm.rank)
    assert type(sub) is mcr.Comm and sub.backend == "gloo"   # as mpi4py: not the subclass
    sub.Free()


@case
def handles_round_trip(comm):
    dup = comm.Dup()
    for cls in (mcr.Comm, MyComm):
        for made in (cls.fromhandle(dup.handle), cls.fromint(dup.toint()),
                     cls.f2py(dup.py2f())):
            assert type(made) is cls and made == dup
    assert type(mcr.Comm.fromhandle(M4.COMM_NULL.handle)) is mcr.Comm
    dup.Free()
    if comm.size > 1:
        half = comm.Split(comm.rank % 2)
        inter = half.Create_intercomm(0, comm, 1 - comm.rank % 2)
        with raises(TypeError, "handle:", "Intercomm"):
            mcr.Comm.fromhandle(inter.handle)
        inter.Free()
        half.Free()


def test_pickle_of_predefined_communicators():
    import pickle
    for predefined in (mcr.COMM_WORLD, mcr.COMM_SELF):
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            assert pickle.loads(pickle.dumps(predefined, protocol)) is predefined
            copy = pickle.loads(pickle.dumps(mcr.Comm(predefined), protocol))
            assert type(copy) is mcr.Comm and copy == predefined and copy is not predefined
        predefined.free()                            # mpi4py's safe free: a no-op
        assert predefined and predefined.handle == M4.Comm(predefined).handle
    dup = mcr.COMM_SELF.Dup()
    with raises(ValueError, "cannot serialize"):
        pickle.dumps(dup)
    dup.Free()


@case
def cartesian_topology_is_an_mcr_comm(comm):
    size, rank = comm.size, comm.rank
    c = comm.Dup()
    c.backend = "gloo"                  # settings pass to the topology
    ring = c.Create_cart([size], periods=[True])
    assert all(isinstance(ring, cls) for cls in (mcr.Cartcomm, mcr.Comm, M4.Cartcomm))
    assert ring.backend == "gloo" and ring.Get_topo() == ([size], [1], [rank])
    left, right = ring.Shift(0, 1)
    assert (left, right) == ((rank - 1) % size, (rank + 1) % size)
    for backend in ("mpi", "gloo"):     # mcr's buffer methods, on each backend
        got = torch.zeros(5, dtype=torch.float64)
        ring.Sendrecv(data(rank, 5, torch.float64), right, recvbuf=got, source=left,
                      backend=backend)
        expect(got, data(left, 5, torch.float64))
        total = torch.zeros(3, dtype=torch.int32)
        ring.Allreduce(data(rank, 3, torch.int32), total, backend=backend)
        expect(total, reduce_ref([data(r, 3, torch.int32) for r in range(size)], "SUM"))
    # a neighbourhood collective, on the default backend (Gloo): the left
    # neighbour's block, then the right one's (all of them: test_neighbor)
    both = torch.zeros(8)
    ring.Neighbor_allgather(data(rank, 4), both)
    expect(both, cat([data(left, 4), data(right, 4)]))
    dup = ring.Dup()
    copies = [ring.Dup_with_info(M4.INFO_NULL), ring.Clone()]
    for started in (ring.Idup(), ring.Idup_with_info(M4.INFO_NULL)):
        started[1].Wait()
        copies.append(started[0])
    for copy in [dup] + copies:
        assert type(copy) is mcr.Cartcomm and copy.Get_topo() == ring.Get_topo()
        assert copy.backend == "gloo"
        assert_comm_works(copy)
        if copy is not dup:
            copy.Free()
    sub = ring.Sub([True])
    assert type(sub) is mcr.Cartcomm and sub.size == size and sub.backend == "gloo"
    assert_comm_works(sub)
    for each in (sub, dup, ring):
        each.Free()
    if size == 4:
        # a 2 x 2 grid: its rows, and the processes past a smaller grid
        grid = c.Create_cart([2, 2], periods=[False, True])
        row, col = grid.Get_coords(rank)
        assert (row, col) == divmod(rank, 2)
        rows = grid.Sub([False, True])
        assert type(rows) is mcr.Cartcomm and rows.size == 2
        x = torch.zeros(2)
        rows.Allreduce(torch.full((2,), float(rank)), x)
        expect(x, torch.full((2,), float(2 * (2 * row) + 1)))
        rows.Free()
        grid.Free()
    line = c.Create_cart([max(size - 1, 1)])
    if rank < max(size - 1, 1):
        assert type(line) is mcr.Cartcomm and line.size == max(size - 1, 1)
        assert_comm_works(line)
        line.Free()
    else:
        assert line == M4.COMM_NULL     # left out of the grid
    c.Free()


@case
def graph_topologies_are_mcr_comms(comm):
    size, rank = comm.size, comm.rank
    left, right = (rank - 1) % size, (rank + 1) % size
    # every process's edge to its right neighbour: an adjacency list, distributed graphs
    graph = comm.Create_graph([i + 1 for i in range(size)], [(i + 1) % size for i in range(size)])
    assert type(graph) is mcr.Graphcomm and isinstance(graph, M4.Graphcomm)
    assert graph.Get_neighbors(rank) == [right]
    adjacent = comm.Create_dist_graph_adjacent([left], [right])
    made = comm.Create_dist_graph([rank], [1], [right])
    for g in (adjacent, made):
        assert type(g) is mcr.Distgraphcomm and isinstance(g, M4.Distgraphcomm)
        sources, destinations, _ = g.Get_dist_neighbors()
        assert sources == [left] and destinations == [right]
        got = torch.zeros(3, dtype=torch.int64)
        g.Neighbor_alltoall(data(rank, 3, torch.int64), got)
        expect(got, data(left, 3, torch.int64))
    for g in (graph, adjacent, made):
        assert_comm_works(g)
        g.Free()


@case
def bad_grids_are_refused_before_communicating(comm):
    size = comm.size
    for dims, exc, fragments in [
            ([size + 1], ValueError, ("dims: a grid of", f"= {size + 1} processes", f"of {size}")),
            ([1, 0], ValueError, ("dims: dimension 1 is 0",)),
            ([-2], ValueError, ("dims: dimension 0 is -2",)),
            (size, TypeError, ("dims: expected a sequence of integers, got int",)),
            (["2"], TypeError, ("dims: expected a sequence of integers, got list",))]:
        with raises(exc, *fragments):
            comm.Create_cart(dims)
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)
