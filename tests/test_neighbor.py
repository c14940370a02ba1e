"""Neighborhood collectives of mcr's topologies (Neighbor_allgather(v),
Neighbor_alltoall(v)) in their three forms, on MPI and composed on Gloo, on
Cartesian grids (periodic dimensions of 1 and 2 processes included, where one
process is both neighbours), graphs with repeated edges and distributed
graphs, at 1-4 ranks.

Expected values come from the topology's definition, computed here from the
coordinates and edge lists (not from MPI): the i-th receive block comes from
the i-th source; on a Cartesian grid the slot of the neighbour in the negative
direction holds what it sent towards the positive direction (MPI 4.0); between
two processes joined by several edges, blocks match in the order of the edges.
"""

import os
import subprocess
import sys

import numpy as np
import torch
from mpi4py import MPI as M4

import mcr
from mcr import _core, backends
from mpiharness import case, mpi_cases
from util import assert_equal, raises

# where the mcr this test imported lives (the source tree, or the installed package)
MCR_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mcr.__file__)))
BACKENDS = ("mpi", "gloo")
FORMS = ("blocking", "nonblocking", "persistent")


# -- The topologies, and where each block goes ----------------------------------------

class Topology:
    """A topology as the test knows it: every process's sources and
    destinations, and for each receive slot the (process, send slot) it
    comes from."""

    def __init__(self, name, sources, dests, origin, create):
        self.name, self.sources, self.dests, self.origin = name, sources, dests, origin
        self.create = create            # create(comm): the communicator


def cartesian(dims, periods):
    """The grid's neighbour lists from the coordinates (row-major ranks)."""
    size = int(np.prod(dims))

    def coords(r):
        return list(np.unravel_index(r, dims))

    def rank_at(c):
        return int(np.ravel_multi_index(c, dims))

    def neighbours(r):
        out = []
        for d, (n, periodic) in enumerate(zip(dims, periods)):
            for step in (-1, 1):
                c = coords(r)
                c[d] += step
                if not 0 <= c[d] < n:
                    if not periodic:
                        out.append(M4.PROC_NULL)
                        continue
                    c[d] %= n
                out.append(rank_at(c))
        return out

    lists = [neighbours(r) for r in range(size)]

    def origin(r, k):
        # slot 2d (negative direction) holds what that neighbour sent towards
        # the positive direction (its slot 2d + 1), and the other way round
        source = lists[r][k]
        return (source, k + 1 if k % 2 == 0 else k - 1)

    return Topology(f"cart {dims} {periods}", lists, lists, origin,
                    lambda comm: comm.Create_cart(dims, periods))


def graph(name, dests, sources=None):
    """A graph from every process's destination list (an edge repeated is a
    block sent twice): the sources follow from it, in rank order, unless
    given (a Create_graph topology's are its destinations)."""
    size = len(dests)
    if sources is None:
        sources = [[] for _ in range(size)]
        for i in range(size):
            for j in dests[i]:
                sources[j].append(i)

    def origin(r, k):
        i = sources[r][k]
        nth = sources[r][:k].count(i)            # the nth edge from i to r
        return (i, [k2 for k2, j in enumerate(dests[i]) if j == r][nth])

    return Topology(name, sources, dests, origin,
                    lambda comm: comm.Create_dist_graph_adjacent(sources[comm.rank],
                                                                 dests[comm.rank]))


def topologies(size):
    out = [cartesian([size], [True]), cartesian([size], [False]),
           cartesian([size, 1], [True, True])]
    if size == 4:
        out.append(cartesian([2, 2], [True, False]))
    out.append(graph("dist graph", [[(r + 1) % size, (r + 1) % size, (r + 2) % size]
                                    for r in range(size)]))
    return out


def symmetric_graph(size):
    """A Create_graph topology (symmetric, with a repeated edge): each process
    joined twice to the next and twice to the one before."""
    index, edges = [], []
    for r in range(size):
        edges += [(r + 1) % size, (r + 1) % size, (r - 1) % size, (r - 1) % size]
        index.append(len(edges))
    return index, edges


# -- Data -------------------------------------------------------------------------------

def block(rank, slot, n, shift=0):
    """What `rank` sends in its send slot `slot`: n float64 values."""
    return torch.arange(n, dtype=torch.float64) + 1000 * rank + 10 * slot + 0.5 + shift


def run(topo, op, form, backend, sendbuf, recvbuf, starts=1, refill=None):
    if form == "blocking":
        getattr(topo, "Neighbor_" + op)(sendbuf, recvbuf, backend=backend)
    elif form == "nonblocking":
        req = getattr(topo, "Ineighbor_" + op)(sendbuf, recvbuf, backend=backend)
        assert isinstance(req, mcr.Request)
        req.Wait()
    else:
        req = getattr(topo, "Neighbor_" + op + "_init")(sendbuf, recvbuf, backend=backend)
        assert isinstance(req, mcr.Prequest)
        for i in range(starts):
            if refill is not None:
                refill(i)
            req.Start()
            req.Wait()
        req.Free()


def check_topology(comm, t, topo, backends=BACKENDS):
    rank = comm.rank
    src, dst = t.sources[rank], t.dests[rank]
    nin, nout = len(src), len(dst)
    for backend in backends:
        for form in FORMS:
            where = f"{t.name} {backend} {form}"
            # alltoall: 3 elements a block; a persistent request started twice,
            # with new data each time
            send = torch.cat([block(rank, k, 3) for k in range(nout)] or [torch.zeros(0)])
            got = torch.full((3 * nin,), -1.0, dtype=torch.float64)

            def refill(i, send=send):
                send.copy_(torch.cat([block(rank, k, 3, shift=i) for k in range(nout)]
                                     or [torch.zeros(0)]))
            run(topo, "alltoall", form, backend, send, got, starts=2, refill=refill)
            shift = 1 if form == "persistent" else 0
            want = torch.cat([block(*t.origin(rank, k), 3, shift=shift)
                              if src[k] != M4.PROC_NULL else torch.full((3,), -1.0,
                                                                        dtype=torch.float64)
                              for k in range(nin)] or [torch.zeros(0, dtype=torch.float64)])
            assert torch.equal(got, want), f"{where} alltoall:\n{got}\n{want}"
            # alltoallv: block k of 1 + (k + rank) % 3 elements for destination k,
            # received with a gap of one element between the blocks
            counts = [1 + (k + rank) % 3 for k in range(nout)]
            offsets = list(np.cumsum([0] + counts[:-1]))
            send = torch.cat([block(rank, k, counts[k]) for k in range(nout)]
                             or [torch.zeros(0, dtype=torch.float64)])
            rcounts = []
            for k in range(nin):
                if src[k] == M4.PROC_NULL:
                    rcounts.append(0)
                else:
                    i, slot = t.origin(rank, k)
                    rcounts.append(1 + (slot + i) % 3)
            rdispls = [sum(rcounts[:k]) + k for k in range(nin)]
            got = torch.full((sum(rcounts) + nin,), -1.0, dtype=torch.float64)
            run(topo, "alltoallv", form, backend, [send, counts, offsets],
                [got, rcounts, rdispls])
            want = torch.full_like(got, -1.0)
            for k in range(nin):
                if rcounts[k]:
                    want[rdispls[k]:rdispls[k] + rcounts[k]] = block(*t.origin(rank, k),
                                                                     rcounts[k])
            assert torch.equal(got, want), f"{where} alltoallv:\n{got}\n{want}"
            # allgather: every neighbour's one block of 2; allgatherv: blocks of
            # 1 + source % 2 at reversed places, into a numpy array
            got = torch.full((2 * nin,), -1.0, dtype=torch.float64)
            run(topo, "allgather", form, backend, block(rank, 0, 2), got)
            want = torch.cat([block(i, 0, 2) if i != M4.PROC_NULL
                              else torch.full((2,), -1.0, dtype=torch.float64) for i in src]
                             or [torch.zeros(0, dtype=torch.float64)])
            assert torch.equal(got, want), f"{where} allgather:\n{got}\n{want}"
            rcounts = [0 if i == M4.PROC_NULL else 1 + i % 2 for i in src]
            rdispls = [2 * (nin - 1 - k) for k in range(nin)]
            out = np.full(2 * nin, -1.0)
            run(topo, "allgatherv", form, backend, block(rank, 0, 1 + rank % 2).numpy(),
                [out, rcounts, rdispls])
            want = np.full(2 * nin, -1.0)
            for k, i in enumerate(src):
                if rcounts[k]:
                    want[rdispls[k]:rdispls[k] + rcounts[k]] = block(i, 0, rcounts[k]).numpy()
            np.testing.assert_array_equal(out, want, err_msg=f"{where} allgatherv")


# -- Cases ------------------------------------------------------------------------------

@case.quick
def every_topology_backend_and_form_moves_the_right_blocks(comm):
    for t in topologies(comm.size):
        topo = t.create(comm)
        check_topology(comm, t, topo)
        topo.Free()
    index, edges = symmetric_graph(comm.size)
    topo = comm.Create_graph(index, edges)
    dests = [edges[index[r - 1] if r else 0:index[r]] for r in range(comm.size)]
    check_topology(comm, graph("graph", dests, sources=dests), topo)
    topo.Free()


@case
def the_communicators_backend_is_the_default(comm):
    # backend None: the communicator's (here Gloo: its sub-communicator is
    # made by the call); auto runs them on MPI
    c = comm.Dup()
    c.backend = "gloo"
    ring = c.Create_cart([comm.size], periods=[True])
    assert "gloo" not in (ring.Get_attr(backends._keyval()) or {})
    t = cartesian([comm.size], [True])
    left, right = t.sources[comm.rank]
    got = torch.zeros(8, dtype=torch.float64)
    req = ring.Ineighbor_alltoall(torch.cat([block(comm.rank, 0, 4), block(comm.rank, 1, 4)]),
                                  got)
    assert isinstance(req, mcr.Request)
    req.Wait()
    assert "gloo" in ring.Get_attr(backends._keyval())
    assert_equal(got, torch.cat([block(*t.origin(comm.rank, 0), 4),
                                 block(*t.origin(comm.rank, 1), 4)]))
    got.zero_()
    ring.Neighbor_allgather(block(comm.rank, 0, 4), got, backend="auto")
    assert_equal(got, torch.cat([block(left, 0, 4), block(right, 0, 4)]))
    ring.Free()
    c.Free()


@case
def cuda_memory_is_staged_through_host_copies_on_mpi(comm):
    # the path of CUDA tensors on MPI (host copies, the result copied back),
    # run on host tensors: tests stage host memory as they would CUDA memory
    previous = _core._set_host_staging(True)
    try:
        for t in topologies(comm.size)[:3]:
            topo = t.create(comm)
            check_topology(comm, t, topo, backends=("mpi",))
            topo.Free()
    finally:
        _core._set_host_staging(previous)


@case
def bad_arguments_are_refused_before_communicating(comm):
    size, rank = comm.size, comm.rank
    ring = comm.Create_cart([size], periods=[True])        # two neighbours each
    x = torch.zeros(6)
    for backend in BACKENDS:
        with raises(ValueError, "sendbuf", "IN_PLACE"):
            ring.Neighbor_alltoall(mcr.IN_PLACE, x, backend=backend)
        with raises(ValueError, "recvbuf", "5 elements do not split evenly among 2 neighbours"):
            ring.Neighbor_alltoall(torch.zeros(4), torch.zeros(5), backend=backend)
        with raises(ValueError, "recvbuf", "blocks 0", "overlap"):
            ring.Ineighbor_alltoallv([torch.zeros(4), [2, 2], [0, 2]],
                                     [torch.zeros(4), [2, 2], [0, 1]], backend=backend)
        with raises(ValueError, "recvbuf: buffer holds 3 elements, 2 elements per neighbour x 2 "
                               "neighbours needs 4"):
            ring.Neighbor_allgather_init([torch.zeros(2), 2], [torch.zeros(3), 2],
                                         backend=backend)
    with raises(TypeError, "sendbuf has float32 elements but recvbuf has int64"):
        ring.Neighbor_alltoall(torch.zeros(4), torch.zeros(4, dtype=torch.int64),
                               backend="gloo")
    with raises(ValueError, "Neighbor_alltoallw", "backend 'gloo' cannot run it"):
        ring.Neighbor_alltoallw([torch.zeros(2), [1, 1], [0, 4], [M4.FLOAT] * 2],
                                [torch.zeros(2), [1, 1], [0, 4], [M4.FLOAT] * 2],
                                backend="gloo")
    with raises(ValueError, "backend 'gloo' moves torch element types"):
        vector = M4.FLOAT.Create_vector(2, 1, 2).Commit()
        try:
            ring.Neighbor_allgather([np.zeros(4, np.float32), 1, vector],
                                    [np.zeros(8, np.float32), 1, vector], backend="gloo")
        finally:
            vector.Free()
    with raises(ValueError, "recvbuf: 3 elements per neighbour, but sendbuf sends 2"):
        ring.Neighbor_alltoall(torch.zeros(4), torch.zeros(6), backend="mpi")
    # a block longer than its slot at another process (rank 0 sends 3, every
    # slot holds 2): on Gloo every process raises MPI's truncation error
    # before any data moves, where Gloo itself would abort the process
    n = 3 if rank == 0 else 2
    with raises(mcr.Exception):
        try:
            ring.Neighbor_alltoallv([torch.ones(2 * n), [n, n], [0, n]],
                                    [torch.zeros(4), [2, 2], [0, 2]], backend="gloo")
        except mcr.Exception as exc:
            assert exc.Get_error_class() == M4.ERR_TRUNCATE, exc
            raise
    # the same call completes once the arguments are right
    got = torch.zeros(4)
    ring.Neighbor_alltoall(torch.ones(4) * rank, got, backend="gloo")
    left, right = (rank - 1) % size, (rank + 1) % size
    assert_equal(got, torch.tensor([left, left, right, right], dtype=torch.float32))
    ring.Free()


@case
def a_distributed_graphs_nonblocking_call_does_not_wait(comm):
    # rank 0 posts the call, then waits for a message that rank 1 sends
    # synchronously (the send completes once received) before it posts its
    # own. Waiting at the call for rank 1, rank 0 would hang there, and rank
    # 1 in its Ssend: the job would time out. On the graph mcr made, its
    # rounds were agreed then; on a copy, the call agrees them in a stage of
    # its own. (The first staged call on a communicator and backend makes
    # its private communicators, collectively: each graph's is made first.)
    size, rank = comm.size, comm.rank
    t = graph("dist graph", [[(r + 1) % size, (r + 1) % size, (r + 2) % size]
                             for r in range(size)])
    nin, nout = len(t.sources[rank]), len(t.dests[rank])
    made = t.create(comm)
    for topo in (made, made.Dup()):
        send = torch.cat([block(rank, k, 2) for k in range(nout)])
        want = torch.cat([block(*t.origin(rank, k), 2) for k in range(nin)])
        first = torch.zeros(2 * nin, dtype=torch.float64)
        topo.Ineighbor_alltoall(send, first, backend="gloo").Wait()
        assert torch.equal(first, want)
        for form in ("nonblocking", "persistent"):
            got = torch.full((2 * nin,), -1.0, dtype=torch.float64)
            token = torch.zeros(1)
            if form == "nonblocking":
                post = lambda: topo.Ineighbor_alltoall(send, got, backend="gloo")  # noqa: E731
            else:
                preq = topo.Neighbor_alltoall_init(send, got, backend="gloo")

                def post():
                    preq.Start()
                    return preq
            if rank == 0:
                req = post()
                if size > 1:
                    comm.Recv(token, 1, 5)
            else:
                if rank == 1:
                    comm.Ssend(torch.ones(1), 0, 5)
                req = post()
            req.Wait()
            assert torch.equal(got, want), f"{form}:\n{got}\n{want}"
            assert rank != 0 or size == 1 or token.item() == 1.0
            if form == "persistent":
                preq.Free()
        topo.Free()


test_mpi = mpi_cases(__name__)


def test_bench_neighbor_tiny():
    """``python -m mcr.bench.neighbor`` starts its own job and prints one row,
    checked against the ring's definition, per operation, form and size."""
    from mcr import launch
    env = {k: v for k, v in os.environ.items() if k not in launch.LAUNCHER_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [MCR_ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "mcr.bench.neighbor", "-n", "2", "--sizes",
                           "4,4096", "--rounds", "1", "--time", "0.005", "--timeout", "150"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("Neighbor_")]
    assert [tuple(r[:3]) for r in rows] == [
        (op, form, size) for op in ("Neighbor_alltoall", "Neighbor_allgather")
        for form in ("blocking", "nonblocking") for size in ("4", "4096")], proc.stdout
    for row in rows:
        assert all(float(x) > 0 for x in row[3:6]) and row[6].endswith("x"), row
