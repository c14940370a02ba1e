"""Neighborhood collectives (Neighbor_allgather(v), Neighbor_alltoall(v,w)) in their three forms, on
MPI (also host-staged) and, but alltoallw, composed on Gloo, on float64, float32 and bfloat16 (which
has no buffer format), on Cartesian grids (periodic dimensions of 1 and 2: one process is both
neighbours), graphs with repeated edges and distributed graphs (one where a process has no source or
no destination, one made from a grid). Expected values come from the topology's definition: the i-th
receive block comes from the i-th source; on a grid the slot of the neighbour in the negative
direction holds what it sent towards the positive one (MPI 4.0); between two processes joined by
several edges, blocks match in order."""

import collections
import functools
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from mpi4py import MPI as M4

import mcr
from mcr import backends
from mpiharness import case, mpi_cases
from opmatrix import staging
from opref import expect, place
from util import assert_equal, raises

# where the mcr this test imported lives (the source tree, or the installed package)
MCR_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mcr.__file__)))
BACKENDS = ("mpi", "gloo")
FORMS = ("blocking", "nonblocking", "persistent")


# -- The topologies, and where each block goes ----------------------------------------
# every process's sources and destinations; origin(r, k): the (process, send
# slot) that receive slot k of process r comes from; create(comm): the communicator
Topology = collections.namedtuple("Topology", "name sources dests origin create")


def cartesian(dims, periods):
    """The grid's neighbour lists from the coordinates (row-major ranks)."""
    def neighbours(r):
        out = []
        for d, (n, periodic) in enumerate(zip(dims, periods)):
            for step in (-1, 1):
                c = list(np.unravel_index(r, dims))
                c[d] += step
                if periodic or 0 <= c[d] < n:
                    c[d] %= n
                    out.append(int(np.ravel_multi_index(c, dims)))
                else:
                    out.append(M4.PROC_NULL)
        return out

    lists = [neighbours(r) for r in range(int(np.prod(dims)))]

    def origin(r, k):
        # slot 2d (negative direction) holds what that neighbour sent towards
        # the positive direction (its slot 2d + 1), and the other way round
        return (lists[r][k], k + 1 if k % 2 == 0 else k - 1)

    return Topology(f"cart {dims} {periods}", lists, lists, origin,
                    lambda comm: comm.Create_cart(dims, periods))


def graph(name, dests, sources=None):
    """A graph from every process's destinations (an edge repeated: a block sent twice); the
    sources follow, in rank order, unless given (a Create_graph topology's are its dests)."""
    if sources is None:
        sources = [[i for i, d in enumerate(dests) for j in d if j == r]
                   for r in range(len(dests))]

    def origin(r, k):
        i = sources[r][k]
        nth = sources[r][:k].count(i)            # the nth edge from i to r
        return (i, [k2 for k2, j in enumerate(dests[i]) if j == r][nth])

    return Topology(name, sources, dests, origin,
                    lambda comm: comm.Create_dist_graph_adjacent(sources[comm.rank],
                                                                 dests[comm.rank]))


def dist_graph(size):
    return graph("dist graph", [[(r + 1) % size, (r + 1) % size, (r + 2) % size]
                                for r in range(size)])


def chain_with_proc_null(size):
    """A dist graph of a chain, its ends' missing neighbours given as PROC_NULL (which
    crashes Open MPI's own neighborhood collectives), the sources in another order."""
    def rank(r):
        return r if 0 <= r < size else M4.PROC_NULL
    return graph("dist graph with PROC_NULL", [[rank(r - 1), rank(r + 1)] for r in range(size)],
                 [[M4.PROC_NULL, rank(r + 1), rank(r - 1)] for r in range(size)])


def made_from_grid(t):
    """`t` made by Create_dist_graph_adjacent on a periodic ring (Open MPI labels the graph
    CART: Get_topology and its own neighborhood collectives take it for a grid)."""
    def create(comm):
        ring = comm.Create_cart([comm.size], [True])
        try:
            return ring.Create_dist_graph_adjacent(t.sources[comm.rank], t.dests[comm.rank])
        finally:
            ring.Free()
    return t._replace(name=t.name + " made from a grid", create=create)


def topologies(size):
    out = [cartesian([size], [True]), cartesian([size], [False]),
           cartesian([size, 1], [True, True])]
    return out + ([cartesian([2, 2], [True, False])] if size == 4 else []) + [
        dist_graph(size), chain_with_proc_null(size), made_from_grid(dist_graph(size)),
        graph("dist graph r -> r + 1", [[r + 1] if r + 1 < size else [] for r in range(size)])]


# -- Data -------------------------------------------------------------------------------
def block(rank, slot, n, shift=0, dtype=torch.float64):
    """What `rank` sends in send slot `slot`: n values, distinct per (rank, slot), exact in
    bfloat16 (integers below 256)."""
    return (torch.arange(n, dtype=torch.float64) + 64 * rank + 8 * slot + shift).to(dtype)


def hole(n, dtype=torch.float64):
    """`n` elements no block has: a receive buffer, or a slot nothing fills."""
    return torch.full((n,), -1.0, dtype=dtype)


def cat(blocks, dtype=torch.float64):
    return torch.cat(blocks) if blocks else hole(0, dtype)


def run(topo, op, form, backend, sendbuf, recvbuf, starts=1, refill=None):
    backend = "mpi" if backend == "staged" else backend
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


def check_topology(comm, t, backend, dtype):
    """Every operation in every form on `t` (made from `comm`) on `backend`, on `dtype`."""
    rank, topo = comm.rank, t.create(comm)
    src, nout = t.sources[rank], len(t.dests[rank])
    nin = len(src)
    # (float64: allgatherv on numpy arrays; alltoallw in the datatype of the element size)
    host = (lambda x: x.numpy()) if dtype == torch.float64 else (lambda x: x)
    item = dtype.itemsize
    mpitype = {8: M4.DOUBLE, 4: M4.FLOAT, 2: M4.UINT16_T}[item]
    holes, blocks = functools.partial(hole, dtype=dtype), functools.partial(block, dtype=dtype)
    cats = functools.partial(cat, dtype=dtype)

    def received(k, n, shift=0):
        """Receive slot k's block of n, or the hole a PROC_NULL source leaves."""
        return holes(n) if src[k] == M4.PROC_NULL else blocks(*t.origin(rank, k), n, shift)

    for form in FORMS:
        where = f"{t.name} {backend} {form}"
        # alltoall: 3 elements a block; a persistent request started twice,
        # with new data each time
        send, got = cats([blocks(rank, k, 3) for k in range(nout)]), holes(3 * nin)

        def refill(i, send=send):
            send.copy_(cats([blocks(rank, k, 3, shift=i) for k in range(nout)]))
        run(topo, "alltoall", form, backend, send, got, starts=2, refill=refill)
        shift = 1 if form == "persistent" else 0
        expect(got, cats([received(k, 3, shift) for k in range(nin)]), f"{where} alltoall")
        # alltoallv: block k of 1 + (k + rank) % 3 elements for destination k,
        # received with a gap of one element between the blocks
        counts = [1 + (k + rank) % 3 for k in range(nout)]
        send = cats([blocks(rank, k, c) for k, c in enumerate(counts)])
        rcounts = [0 if i == M4.PROC_NULL else 1 + sum(t.origin(rank, k)) % 3
                   for k, i in enumerate(src)]
        rdispls = [sum(rcounts[:k]) + k for k in range(nin)]
        got = holes(sum(rcounts) + nin)
        displs = [sum(counts[:k]) for k in range(nout)]
        run(topo, "alltoallv", form, backend, [send, counts, displs], [got, rcounts, rdispls])
        expect(got, place(holes(len(got)), [received(k, c) for k, c in enumerate(rcounts)],
                          rdispls), f"{where} alltoallv")
        if backend != "gloo":       # alltoallw (MPI only): blocks of 2 elements, received as
            pair = mpitype.Create_contiguous(2).Commit()     # one pair at reversed places
            send, got = cats([blocks(rank, k, 2) for k in range(nout)]), holes(3 * nin)
            run(topo, "alltoallw", form, backend, [send, [2] * nout,
                                                   [2 * item * k for k in range(nout)],
                                                   [mpitype] * nout],
                [got, [1] * nin, [3 * item * (nin - 1 - k) for k in range(nin)], [pair] * nin])
            expect(got, place(holes(3 * nin), [received(k, 2) for k in range(nin)],
                              [3 * (nin - 1 - k) for k in range(nin)]), f"{where} alltoallw")
            pair.Free()
        # allgather: every neighbour's one block of 2; allgatherv: blocks of
        # 1 + source % 2 at reversed places, into a numpy array (float64)
        got = holes(2 * nin)
        run(topo, "allgather", form, backend, blocks(rank, 0, 2), got)
        expect(got, cats([holes(2) if i == M4.PROC_NULL else blocks(i, 0, 2) for i in src]),
               f"{where} allgather")
        rcounts = [0 if i == M4.PROC_NULL else 1 + i % 2 for i in src]
        rdispls = [2 * (nin - 1 - k) for k in range(nin)]
        out = host(holes(2 * nin))
        run(topo, "allgatherv", form, backend, host(blocks(rank, 0, 1 + rank % 2)),
            [out, rcounts, rdispls])
        expect(out, place(host(holes(2 * nin)),
                          [host(blocks(i, 0, c)) for i, c in zip(src, rcounts)], rdispls),
               f"{where} allgatherv")
    if backend == "mpi" and dtype == torch.float64:     # pickled objects: mpi4py's methods
        # (composed on MPI where Open MPI's would crash)
        assert topo.neighbor_allgather(("from", rank)) == [
            None if i == M4.PROC_NULL else ("from", i) for i in src], t.name
        assert topo.neighbor_alltoall([("to", rank, k) for k in range(nout)]) == [
            None if i == M4.PROC_NULL else ("to", *t.origin(rank, k))
            for k, i in enumerate(src)], t.name
    topo.Free()


# -- Cases ------------------------------------------------------------------------------
@case.matrix(backend=("mpi", "staged", "gloo"),
             dtype=(torch.float64, torch.float32, torch.bfloat16),
             quick=lambda backend, dtype: backend != "staged" and dtype == torch.float64)
def every_topology_and_form_moves_the_right_blocks(comm, backend, dtype):
    # Create_graph (symmetric, with repeated edges): each process joined twice
    # to the next and twice to the one before
    dests = [[(r + 1) % comm.size] * 2 + [(r - 1) % comm.size] * 2 for r in range(comm.size)]
    made = graph("graph", dests, sources=dests)._replace(create=lambda c: c.Create_graph(
        list(itertools.accumulate(len(d) for d in dests)), sum(dests, [])))
    # "staged": MPI with the path of CUDA tensors (host copies, the result
    # copied back), run on host tensors
    with staging(backend == "staged"):
        for t in topologies(comm.size) + [made]:
            check_topology(comm, t, backend, dtype)


@case
def the_communicators_backend_is_the_default(comm):
    # backend None: the communicator's (here Gloo: its sub-communicator is
    # made by the call); auto runs them on MPI
    rank, c = comm.rank, comm.Dup()
    c.backend = "gloo"
    ring = c.Create_cart([comm.size], periods=[True])
    assert "gloo" not in (ring.Get_attr(backends._keyval()) or {})
    t, got = cartesian([comm.size], [True]), hole(8)
    req = ring.Ineighbor_alltoall(cat([block(rank, 0, 4), block(rank, 1, 4)]), got)
    assert isinstance(req, mcr.Request)
    req.Wait()
    assert "gloo" in ring.Get_attr(backends._keyval())
    assert_equal(got, cat([block(*t.origin(rank, k), 4) for k in (0, 1)]))
    got.fill_(-1)
    ring.Neighbor_allgather(block(rank, 0, 4), got, backend="auto")
    assert_equal(got, cat([block(i, 0, 4) for i in t.sources[rank]]))
    ring.Free()
    c.Free()


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
        with raises(ValueError, "sendbuf: counts has 3 entries, expected 2 (one per neighbour)"):
            ring.Neighbor_alltoallv([torch.zeros(3), [1, 1, 1]], [torch.zeros(2), [1, 1]],
                                    backend=backend)
        with raises(ValueError, "recvbuf", "blocks 0", "overlap"):
            ring.Ineighbor_alltoallv([torch.zeros(4), [2, 2], [0, 2]],
                                     [torch.zeros(4), [2, 2], [0, 1]], backend=backend)
        with raises(ValueError, "recvbuf: buffer holds 3 elements, 2 elements per neighbour x 2 "
                               "neighbours needs 4"):
            ring.Neighbor_allgather_init([torch.zeros(2), 2], [torch.zeros(3), 2],
                                         backend=backend)
        # send and receive buffers that share memory (and no IN_PLACE to offer)
        w = torch.zeros(8)
        for call, sendbuf, recvbuf in [
                (ring.Neighbor_alltoall, w[:4], w[2:6]),
                (ring.Ineighbor_allgather, w[2:4], w[:4]),
                (ring.Neighbor_allgatherv, w[1:3], [w[:4], [2, 2]]),
                (ring.Neighbor_alltoallv_init, [w[:4], [2, 2]], [w[3:7], [2, 2]])]:
            with raises(ValueError, "sendbuf and recvbuf overlap in memory (", "), which MPI "
                        "forbids"):
                call(sendbuf, recvbuf, backend=backend)
        ring.Neighbor_alltoall(w[:4], w[4:], backend=backend)       # apart: no complaint
    for (call, sendbuf), backend in itertools.product(
            ((ring.Neighbor_allgatherv, torch.zeros(2)),                  # as mpi4py refuses
             (ring.Ineighbor_alltoallv, [torch.zeros(4), [2, 2]])), BACKENDS):
        with raises(TypeError, "recvbuf: expected a buffer or a message spec, got None"):
            call(sendbuf, None, backend=backend)    # (MPI matched blocks with no receive)
    with raises(TypeError, "sendbuf has float32 elements but recvbuf has int64"):
        ring.Neighbor_alltoall(torch.zeros(4), torch.zeros(4, dtype=torch.int64),
                               backend="gloo")
    for call in (ring.Neighbor_alltoallw, ring.Ineighbor_alltoallw, ring.Neighbor_alltoallw_init):
        with raises(ValueError, "sendbuf: 3 counts for 2 neighbours"):
            call([torch.zeros(3), [1] * 3, [0, 4, 8], [M4.FLOAT] * 3],
                 [torch.zeros(2), [1] * 2, [0, 4], [M4.FLOAT] * 2])
    made = made_from_grid(dist_graph(size)).create(comm)      # pickled, composed on MPI
    with raises(ValueError, "sendobj: 1 objects for 3 neighbours (one per neighbour)"):
        made.neighbor_alltoall([rank])
    made.Free()
    with raises(ValueError, "sendobj: 1 objects for 2 neighbours (one per neighbour)"):
        ring.neighbor_alltoall([rank])          # (not composed: mpi4py's method, after the check)
    assert ring.neighbor_alltoall([("-", rank), ("+", rank)]) == \
        [("+", (rank - 1) % size), ("-", (rank + 1) % size)]
    with raises(ValueError, "edges: edges[1] is 6; the graph has 1 node (len(index)), 0 to 0"):
        comm.Create_graph([2], [0, 6])          # (Open MPI takes it)
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
    with pytest.raises(mcr.Exception) as info:
        ring.Neighbor_alltoallv([torch.ones(2 * n), [n, n], [0, n]],
                                [torch.zeros(4), [2, 2], [0, 2]], backend="gloo")
    assert info.value.Get_error_class() == M4.ERR_TRUNCATE, info.value
    # the same call completes once the arguments are right
    got = torch.zeros(4)
    ring.Neighbor_alltoall(torch.ones(4) * rank, got, backend="gloo")
    left, right = (rank - 1) % size, (rank + 1) % size
    assert_equal(got, torch.tensor([left, left, right, right], dtype=torch.float32))
    ring.Free()


@case
def a_distributed_graphs_nonblocking_call_does_not_wait(comm):
    # rank 0 posts the call, then waits for rank 1's Ssend, which rank 1 makes
    # before posting its own: a call waiting for rank 1 would hang. On the
    # graph mcr made, its rounds were agreed then; on a copy, the call agrees
    # them in a stage. (The first staged call on a communicator and backend
    # makes its private communicators, collectively: each graph's comes first.)
    size, rank = comm.size, comm.rank
    t = dist_graph(size)
    made = t.create(comm)
    send = cat([block(rank, k, 2) for k in range(len(t.dests[rank]))])
    want = cat([block(*t.origin(rank, k), 2) for k in range(len(t.sources[rank]))])
    for topo in (made, made.Dup()):
        got = hole(len(want))
        topo.Ineighbor_alltoall(send, got, backend="gloo").Wait()
        expect(got, want, "first call")
        for form in ("nonblocking", "persistent"):
            got, token = hole(len(want)), torch.zeros(1)
            preq = topo.Neighbor_alltoall_init(send, got, backend="gloo") \
                if form == "persistent" else None

            def post():
                if preq is None:
                    return topo.Ineighbor_alltoall(send, got, backend="gloo")
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
            expect(got, want, form)
            assert rank != 0 or size == 1 or token.item() == 1.0
            if preq is not None:
                preq.Free()
        topo.Free()


@case
def a_tensor_given_new_memory_between_starts_is_refused(comm):
    """MPI's own persistent neighbourhood request refuses to start when a tensor of it holds
    new memory (MPI would write into the freed memory), as a persistent Allreduce does."""
    size, rank = comm.size, comm.rank
    ring = comm.Create_dist_graph_adjacent([(rank - 1) % size], [(rank + 1) % size])
    for side in ("sendbuf", "recvbuf"):
        x, y = torch.ones(2), torch.zeros(2)
        req = ring.Neighbor_alltoall_init(x, y, backend="mpi")
        req.Start()
        req.Wait()
        expect(y, torch.ones(2), "first start")
        (x if side == "sendbuf" else y).set_(torch.zeros(2))
        with raises(ValueError, f"request: {side} no longer holds the memory MPI was given"):
            req.Start()
        req.Free()
    ring.Free()


test_mpi = mpi_cases(__name__)


def test_bench_neighbor_tiny():
    """``python -m mcr.bench.neighbor``: a row per operation, form and size, checked."""
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
