"""Programs in the style of mpi4py's tutorial, unchanged under either import.

Each program is written as an mpi4py user writes it (``MPI`` the module, ``comm`` its
COMM_WORLD, ``np`` numpy) and returns a dict of its results on this process. ``tutorial``
runs it with ``mcr.MPI`` and with ``mpi4py.MPI``: identical results, equal to values computed
independently with numpy. ``tutorial_torch`` runs it under mcr with ``np=torch`` (the buffers
are tensors): the same results as on numpy arrays.
"""

import math

import numpy
import torch
from mpi4py import MPI as MPI4PY

from mcr import MPI as MCR
from mpiharness import case, mpi_cases


def point_to_point(MPI, comm, np=numpy):
    """Send/Recv: ``[data, MPI.INT]``, automatic datatypes, a count; Probe sizes a receive."""
    rank, size = comm.Get_rank(), comm.Get_size()
    results = {}
    if size > 1 and rank == 0:
        comm.Send([np.arange(1000, dtype=np.int32), MPI.INT], dest=1, tag=77)
        comm.Send(np.arange(100, dtype=np.float64), dest=1, tag=13)     # datatype discovery
        comm.Send([np.arange(1000, dtype=np.int32) * 3, 10, MPI.INT], dest=1, tag=21)  # 10 only
    elif size > 1 and rank == 1:
        results["explicit"] = np.empty(1000, dtype=np.int32)
        comm.Recv([results["explicit"], MPI.INT], source=0, tag=77)
        results["automatic"] = np.empty(100, dtype=np.float64)
        comm.Recv(results["automatic"], source=0, tag=13)
        results["partial"] = np.full((20,), -1, dtype=np.int32)        # a larger buffer
        status = MPI.Status()
        comm.Recv([results["partial"], MPI.INT], source=0, tag=21, status=status)
        results["partial_count"] = status.Get_count(MPI.INT)
    # every process to the next: the receiver learns the length with Probe
    right, left = (rank + 1) % size, (rank - 1) % size
    req = comm.Isend([np.full((rank + 1,), 1.5 * rank, dtype=np.float64), MPI.DOUBLE],
                     dest=right, tag=5)
    status = MPI.Status()
    comm.Probe(source=MPI.ANY_SOURCE, tag=5, status=status)
    n = status.Get_count(MPI.DOUBLE)
    inbox = np.empty(n, dtype=np.float64)
    comm.Recv([inbox, n, MPI.DOUBLE], source=status.Get_source(), tag=status.Get_tag())
    req.Wait()
    return dict(results, probed=inbox, probed_from=status.Get_source())


def expected_point_to_point(size, rank):
    left = (rank - 1) % size
    results = {"probed": numpy.full(left + 1, 1.5 * left), "probed_from": left}
    if size > 1 and rank == 1:
        partial = numpy.full(20, -1, dtype=numpy.int32)
        partial[:10] = 3 * numpy.arange(10)
        results.update(explicit=numpy.arange(1000, dtype=numpy.int32), partial=partial,
                       automatic=numpy.arange(100, dtype=numpy.float64), partial_count=10)
    return results


def nonblocking(MPI, comm, np=numpy):
    """Isend/Irecv completed by Wait, Waitall with statuses, Waitany and Waitsome until no
    request is active, and by polling Testall."""
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    results = {}
    if size > 1 and rank == 0:
        comm.Isend([np.arange(50, dtype=np.float32), MPI.FLOAT], dest=1, tag=11).Wait()
    elif size > 1 and rank == 1:
        results["pair"] = np.empty(50, dtype=np.float32)
        comm.Irecv([results["pair"], MPI.FLOAT], source=0, tag=11).Wait()
    # halo exchange with both neighbours
    mine = np.arange(4, dtype=np.int64) + 10 * rank
    from_left, from_right = np.empty(4, dtype=np.int64), np.empty(4, dtype=np.int64)
    reqs = [comm.Irecv(from_left, source=left, tag=1), comm.Irecv(from_right, source=right, tag=2),
            comm.Isend(mine, dest=right, tag=1), comm.Isend(mine, dest=left, tag=2)]
    statuses = [MPI.Status() for _ in reqs]
    results["waitall"] = MPI.Request.Waitall(reqs, statuses)
    results["from_left"], results["from_right"] = from_left, from_right
    results["sources"] = [s.Get_source() for s in statuses[:2]]
    results["tags"] = [s.Get_tag() for s in statuses[:2]]
    results["counts"] = [s.Get_count(MPI.INT64_T) for s in statuses[:2]]
    # in whatever order they complete
    inboxes = [np.zeros(3, dtype=np.float64) for _ in range(3)]
    reqs = [comm.Irecv(buf, source=left, tag=20 + i) for i, buf in enumerate(inboxes)]
    reqs += [comm.Isend(np.full((3,), rank + 0.25 * i, dtype=np.float64), dest=right,
                        tag=20 + i) for i in range(3)]
    done = []
    while (index := MPI.Request.Waitany(reqs)) != MPI.UNDEFINED:
        done.append(index)
    results["waitany"] = sorted(done)
    results["waitany_data"] = [buf.tolist() for buf in inboxes]
    floats, ints = np.zeros(3, dtype=np.float64), np.zeros(4, dtype=np.int64)
    reqs = [comm.Irecv(floats, source=left, tag=30), comm.Isend(mine, dest=right, tag=31),
            comm.Irecv(ints, source=left, tag=31),
            comm.Isend(np.full((3,), -rank, dtype=np.float64), dest=right, tag=30)]
    done = []
    while (indices := MPI.Request.Waitsome(reqs)) is not None:
        done.extend(indices)
    results["waitsome"] = sorted(done)
    results["waitsome_data"] = [floats.tolist(), ints.tolist()]
    # polling
    polled = np.empty(4, dtype=np.int64)
    reqs = [comm.Irecv(polled, source=right, tag=40), comm.Isend(mine * 2, dest=left, tag=40)]
    while not MPI.Request.Testall(reqs):
        pass
    return dict(results, testall=polled, testany_after=MPI.Request.Testany(reqs))


def expected_nonblocking(size, rank):
    right, left = (rank + 1) % size, (rank - 1) % size
    four = numpy.arange(4, dtype=numpy.int64)
    results = {"waitall": True, "from_left": four + 10 * left, "from_right": four + 10 * right,
               "sources": [left, right], "tags": [1, 2], "counts": [4, 4],
               "waitany": list(range(6)),
               "waitany_data": [[left + 0.25 * i] * 3 for i in range(3)],
               "waitsome": list(range(4)),
               "waitsome_data": [[float(-left)] * 3, list(range(10 * left, 10 * left + 4))],
               "testall": 2 * (four + 10 * right), "testany_after": (MPI4PY.UNDEFINED, True)}
    if size > 1 and rank == 1:
        results["pair"] = numpy.arange(50, dtype=numpy.float32)
    return results


def broadcast(MPI, comm, np=numpy):
    """Bcast of an array from rank 0, and of a 2-D array with a datatype from the last rank."""
    rank, size = comm.Get_rank(), comm.Get_size()
    data = np.arange(100, dtype=np.int32) if rank == 0 else np.empty(100, dtype=np.int32)
    comm.Bcast(data, root=0)
    table = np.arange(12, dtype=np.float64).reshape(3, 4) * (rank + 1)
    comm.Bcast([table, MPI.DOUBLE], root=size - 1)
    return {"data": data, "table": table}


def expected_broadcast(size, rank):
    return {"data": numpy.arange(100, dtype=numpy.int32),
            "table": numpy.arange(12, dtype=numpy.float64).reshape(3, 4) * size}


def scatter_gather(MPI, comm, np=numpy):
    """Scatter the rows of a 2-D array from rank 0, Gather them back (changed) at the last."""
    rank, size = comm.Get_rank(), comm.Get_size()
    sendbuf = None
    if rank == 0:
        sendbuf = np.empty([size, 100], dtype=np.int32)
        sendbuf[:, :] = np.arange(size, dtype=np.int32)[:, None]
    recvbuf = np.empty(100, dtype=np.int32)
    comm.Scatter(sendbuf, recvbuf, root=0)
    gathered = np.empty([size, 100], dtype=np.int32) if rank == size - 1 else None
    comm.Gather(recvbuf * 2 + np.arange(100, dtype=np.int32), gathered, root=size - 1)
    return {"scattered": recvbuf, "gathered": gathered}


def expected_scatter_gather(size, rank):
    rows = numpy.arange(size, dtype=numpy.int32)[:, None] * 2 + numpy.arange(100, dtype=numpy.int32)
    return {"scattered": numpy.full(100, rank, dtype=numpy.int32),
            "gathered": rows if rank == size - 1 else None}


def matvec(MPI, comm, np=numpy):
    """A matrix-vector product: each process owns 3 rows of A and 3 entries of x, Allgathers x,
    and the product is Allgathered too."""
    rank, size = comm.Get_rank(), comm.Get_size()
    m, n = 3, 3 * size
    A = np.arange(n * n, dtype=np.float64).reshape(n, n) % 7 - 3
    x = np.arange(n, dtype=np.float64) - 2
    A_local, x_local = A[rank * m:(rank + 1) * m], x[rank * m:(rank + 1) * m]
    xg = np.zeros(n, dtype=np.float64)
    comm.Allgather([x_local, MPI.DOUBLE], [xg, MPI.DOUBLE])
    y_local = A_local @ xg
    y = np.empty(n, dtype=np.float64)
    comm.Allgather(y_local, y)
    norm2 = np.full((1,), float((y_local * y_local).sum()), dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, norm2, op=MPI.SUM)
    ranks = np.empty([size, 2], dtype=np.int64)
    comm.Allgather(np.full((2,), rank, dtype=np.int64), ranks)
    return {"x": xg, "y": y, "norm2": norm2, "ranks": ranks}


def expected_matvec(size, rank):
    n = 3 * size
    A = numpy.arange(n * n, dtype=numpy.float64).reshape(n, n) % 7 - 3
    y = A @ (numpy.arange(n, dtype=numpy.float64) - 2)
    return {"x": numpy.arange(n, dtype=numpy.float64) - 2, "y": y,
            "norm2": numpy.array([y @ y]),
            "ranks": numpy.repeat(numpy.arange(size, dtype=numpy.int64), 2).reshape(size, 2)}


def compute_pi(MPI, comm, np=numpy):
    """pi by the midpoint rule: rank 0 Bcasts the number of intervals, each process sums its
    share, Reduce (IN_PLACE at the root, None elsewhere) and Allreduce add the shares up."""
    rank, size = comm.Get_rank(), comm.Get_size()
    N = np.full((1,), 5000 if rank == 0 else 0, dtype=np.int32)
    comm.Bcast([N, MPI.INT], root=0)
    h = 1.0 / int(N[0])
    s = 0.0
    for i in range(rank, int(N[0]), size):
        x = h * (i + 0.5)
        s += 4.0 / (1.0 + x * x)
    mypi = np.full((1,), s * h, dtype=np.float64)
    if rank == 0:
        comm.Reduce(MPI.IN_PLACE, [mypi, MPI.DOUBLE], op=MPI.SUM, root=0)
    else:
        comm.Reduce([mypi, MPI.DOUBLE], None, op=MPI.SUM, root=0)
    PI = np.zeros(1, dtype=np.float64)
    comm.Allreduce(np.full((1,), s * h, dtype=np.float64), PI, op=MPI.SUM)
    return {"N": int(N[0]), "pi": float(mypi[0]) if rank == 0 else None,
            "pi_everywhere": float(PI[0])}


class Close(float):
    """An expected float a result may differ from by rounding (MPI's order of sums)."""


def expected_compute_pi(size, rank):
    h = 1.0 / 5000
    pi = math.fsum(4.0 / (1.0 + (h * (i + 0.5)) ** 2) for i in range(5000)) * h
    assert abs(pi - math.pi) < 1e-8
    return {"N": 5000, "pi": Close(pi) if rank == 0 else None, "pi_everywhere": Close(pi)}


def sendrecv_ring(MPI, comm, np=numpy):
    """Tokens around a ring with Sendrecv until each process has seen all; Sendrecv_replace."""
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    token = np.arange(3, dtype=np.int64) + 10 * rank
    total = np.zeros(3, dtype=np.int64)
    total += token
    incoming = np.empty(3, dtype=np.int64)
    for step in range(size - 1):
        comm.Sendrecv(token, dest=right, sendtag=step, recvbuf=incoming, source=left, recvtag=step)
        token[:] = incoming
        total += incoming
    row = np.arange(4, dtype=np.float64) + 100 * rank
    status = MPI.Status()
    comm.Sendrecv_replace([row, MPI.DOUBLE], dest=right, sendtag=7, source=left,
                          recvtag=7, status=status)
    return {"total": total, "last_token": token, "row": row,
            "row_from": status.Get_source(), "row_count": status.Get_count(MPI.DOUBLE)}


def expected_sendrecv_ring(size, rank):
    left = (rank - 1) % size
    return {"total": sum(numpy.arange(3, dtype=numpy.int64) + 10 * r for r in range(size)),
            "last_token": numpy.arange(3, dtype=numpy.int64) + 10 * ((rank + 1) % size),
            "row": numpy.arange(4, dtype=numpy.float64) + 100 * left,
            "row_from": left, "row_count": 4}


def persistent(MPI, comm, np=numpy):
    """Send_init/Recv_init made once, started with new contents in the same buffers
    (Startall + Waitall, then Start + Wait), and a persistent Allreduce."""
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    sendbuf, recvbuf = np.zeros(5, dtype=np.float64), np.zeros(5, dtype=np.float64)
    reqs = [comm.Recv_init([recvbuf, MPI.DOUBLE], source=left, tag=3),
            comm.Send_init([sendbuf, MPI.DOUBLE], dest=right, tag=3)]
    history = []
    for it in range(3):
        sendbuf[:] = np.arange(5, dtype=np.float64) + 100 * rank + it
        MPI.Prequest.Startall(reqs)
        MPI.Request.Waitall(reqs)
        history.append(recvbuf.tolist())
    for it in range(2):
        sendbuf[:] = -rank - it
        for req in reqs:
            req.Start()
        reqs[0].Wait()
        reqs[1].Wait()
        history.append(recvbuf.tolist())
    for req in reqs:
        req.Free()
    grad = np.zeros(3, dtype=np.float64)
    req = comm.Allreduce_init(MPI.IN_PLACE, grad, op=MPI.SUM)
    sums = []
    for step in range(3):
        grad[:] = rank + step       # same array, new contents
        req.Start()
        req.Wait()
        sums.append(grad.tolist())
    req.Free()
    return {"history": history, "sums": sums}


def expected_persistent(size, rank):
    left = (rank - 1) % size
    history = [(numpy.arange(5.0) + 100 * left + it).tolist() for it in range(3)]
    history += [[float(-left - it)] * 5 for it in range(2)]
    sums = [[float(sum(r + step for r in range(size)))] * 3 for step in range(3)]
    return {"history": history, "sums": sums}


def vector_collectives(MPI, comm, np=numpy):
    """Scatterv of uneven blocks, Gatherv back into a spread-out buffer, and Allgatherv."""
    rank, size = comm.Get_rank(), comm.Get_size()
    counts = [r + 1 for r in range(size)]
    displs = [sum(counts[:r]) for r in range(size)]
    total = sum(counts)
    sendbuf = np.arange(total, dtype=np.float64) * 0.5 if rank == 0 else None
    recvbuf = np.empty(counts[rank], dtype=np.float64)
    comm.Scatterv([sendbuf, counts, displs, MPI.DOUBLE], recvbuf, root=0)
    # back to the last rank, each block twice as far in as in sendbuf
    spread = [2 * d for d in displs]
    gathered = np.full((2 * total,), -1.0, dtype=np.float64) if rank == size - 1 else None
    comm.Gatherv(recvbuf * 2, [gathered, (counts, spread), MPI.DOUBLE], root=size - 1)
    everything = np.empty(total, dtype=np.float64)
    comm.Allgatherv([recvbuf, MPI.DOUBLE], [everything, np.asarray(counts)])
    return {"scattered": recvbuf, "gathered": gathered, "allgathered": everything}


def expected_vector_collectives(size, rank):
    counts = numpy.arange(1, size + 1)
    displs = numpy.concatenate([[0], numpy.cumsum(counts)[:-1]])
    data = numpy.arange(counts.sum(), dtype=numpy.float64) * 0.5
    gathered = numpy.full(2 * counts.sum(), -1.0)
    for c, d in zip(counts, displs):
        gathered[2 * d:2 * d + c] = 2 * data[d:d + c]
    return {"scattered": data[displs[rank]:displs[rank] + counts[rank]],
            "gathered": gathered if rank == size - 1 else None, "allgathered": data}


def python_objects(MPI, comm):
    """The lowercase, pickle-based methods on Python objects."""
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    results = {}
    if size > 1 and rank == 0:
        comm.send({"a": 7, "b": 3.14}, dest=1, tag=11)
        comm.isend({"list": [1, 2, 3]}, dest=1, tag=12).wait()
    elif size > 1 and rank == 1:
        results["send_recv"] = comm.recv(source=0, tag=11)
        results["isend_irecv"] = comm.irecv(source=0, tag=12).wait()
    data = {"key1": [7, 2.72, 2 + 3j], "key2": ("abc", "xyz")} if rank == 0 else None
    results["bcast"] = comm.bcast(data, root=0)
    results["bcast_array"] = comm.bcast(numpy.arange(4) if rank == size - 1 else None,
                                        root=size - 1)
    data = [(i + 1) ** 2 for i in range(size)] if rank == 0 else None
    results["scatter"] = comm.scatter(data, root=0)
    results["gather"] = comm.gather((rank + 1) ** 2, root=0)
    results["allgather"] = comm.allgather({"rank": rank})
    results["alltoall"] = comm.alltoall([10 * rank + j for j in range(size)])
    results["reduce"] = comm.reduce(rank + 1, op=MPI.PROD, root=size - 1)
    results["allreduce"] = comm.allreduce(rank, op=MPI.SUM)
    results["allreduce_max"] = comm.allreduce((7 * rank) % 5, op=MPI.MAX)
    results["sendrecv"] = comm.sendrecv(("from", rank), dest=right, source=left)
    comm.barrier()
    return results


def expected_python_objects(size, rank):
    results = {"bcast": {"key1": [7, 2.72, 2 + 3j], "key2": ("abc", "xyz")},
               "bcast_array": numpy.arange(4), "scatter": (rank + 1) ** 2,
               "gather": [(r + 1) ** 2 for r in range(size)] if rank == 0 else None,
               "allgather": [{"rank": r} for r in range(size)],
               "alltoall": [10 * r + rank for r in range(size)],
               "reduce": math.factorial(size) if rank == size - 1 else None,
               "allreduce": size * (size - 1) // 2,
               "allreduce_max": max((7 * r) % 5 for r in range(size)),
               "sendrecv": ("from", (rank - 1) % size)}
    if size > 1 and rank == 1:
        results.update(send_recv={"a": 7, "b": 3.14}, isend_irecv={"list": [1, 2, 3]})
    return results


def sub_communicators(MPI, comm, np=numpy):
    """Dup, Split (by parity, reversed; UNDEFINED leaving rank 0 out), Create_group, Create
    and Split_type, each used and then freed."""
    rank, size = comm.Get_rank(), comm.Get_size()
    results = {}
    dup = comm.Dup()
    results["dup_compare"] = comm.Compare(dup)
    total = np.zeros(2, dtype=np.int64)
    dup.Allreduce(np.full((2,), rank + 1, dtype=np.int64), total, op=MPI.SUM)
    results["dup_sum"] = total
    dup.Free()
    results["dup_freed"] = dup == MPI.COMM_NULL
    parity = comm.Split(rank % 2, key=-rank)
    results["parity_rank_size"] = (parity.Get_rank(), parity.Get_size())
    members = np.empty(parity.Get_size(), dtype=np.int32)
    parity.Allgather(np.full((1,), rank, dtype=np.int32), members)
    results["parity_members"] = members
    word = np.arange(3, dtype=np.float32) + rank
    parity.Bcast(word, root=0)
    results["parity_bcast"] = word
    results["parity_compare"] = parity.Compare(comm)
    parity.Free()
    others = comm.Split(MPI.UNDEFINED if rank == 0 else 1, key=rank)
    results["left_out"] = others == MPI.COMM_NULL
    if others != MPI.COMM_NULL:
        biggest = np.zeros(1, dtype=np.int64)
        others.Allreduce(np.full((1,), rank, dtype=np.int64), biggest, op=MPI.MAX)
        results["others_max"] = biggest
        others.Free()
    first_half = list(range((size + 1) // 2))
    group = comm.Get_group().Incl(first_half)
    if rank in first_half:
        half = comm.Create_group(group)
        smallest = np.zeros(1, dtype=np.int64)
        half.Allreduce(np.full((1,), rank + 5, dtype=np.int64), smallest, op=MPI.MIN)
        results["half_min"] = (half.Get_size(), smallest)
        half.Free()
    created = comm.Create(group)
    results["created_size"] = None if created == MPI.COMM_NULL else created.Get_size()
    if created != MPI.COMM_NULL:
        created.Free()
    group.Free()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    results["node_size"] = node.Get_size()
    node.Free()
    return results


def expected_sub_communicators(size, rank):
    members = [r for r in range(size) if r % 2 == rank % 2][::-1]
    first_half = (size + 1) // 2
    results = {"dup_compare": MPI4PY.CONGRUENT, "dup_sum": numpy.full(2, size * (size + 1) // 2),
               "dup_freed": True,
               "parity_rank_size": (members.index(rank), len(members)),
               "parity_members": numpy.array(members, dtype=numpy.int32),
               "parity_bcast": numpy.arange(3, dtype=numpy.float32) + members[0],
               "parity_compare": MPI4PY.CONGRUENT if size == 1 else MPI4PY.UNEQUAL,
               "left_out": rank == 0}
    if rank != 0:
        results["others_max"] = numpy.array([size - 1])
    if rank < first_half:
        results["half_min"] = (first_half, numpy.array([5]))
    results["created_size"] = first_half if rank < first_half else None
    results["node_size"] = size       # the tests run on one node
    return results


def topologies(MPI, comm, np=numpy):
    """A periodic ring from Create_cart: Shift, a halo exchange, a Neighbor_alltoall; then a
    2-D grid of Compute_dims, and its rows from Sub. Each used and then freed."""
    rank, size = comm.Get_rank(), comm.Get_size()
    ring = comm.Create_cart([size], periods=[True], reorder=False)
    left, right = ring.Shift(0, 1)
    u = np.arange(6, dtype=np.float64) + 10 * rank      # this process's cells
    from_left, from_right = np.zeros(1, dtype=np.float64), np.zeros(1, dtype=np.float64)
    ring.Sendrecv(u[5:], dest=right, sendtag=1, recvbuf=from_left, source=left, recvtag=1)
    ring.Sendrecv(u[:1], dest=left, sendtag=2, recvbuf=from_right, source=right, recvtag=2)
    blocks = np.arange(2, dtype=np.int32) + 100 * rank   # one for each neighbour
    got = np.zeros(2, dtype=np.int32)
    ring.Neighbor_alltoall(blocks, got)
    results = {"shift": (left, right), "halo": (from_left, from_right), "neighbors": got,
               "is_cart": ring.Get_topology() == MPI.CART}
    ring.Free()
    dims = MPI.Compute_dims(size, 2)
    grid = comm.Create_cart(dims)
    results["coords"] = grid.Get_coords(rank)
    row = grid.Sub([False, True])                       # my row: the second dimension
    total = np.zeros(1, dtype=np.int64)
    row.Allreduce(np.full((1,), rank, dtype=np.int64), total, op=MPI.SUM)
    results["row"] = (row.Get_size(), total)
    row.Free()
    grid.Free()
    return results


def expected_topologies(size, rank):
    left, right = (rank - 1) % size, (rank + 1) % size
    dims = MPI4PY.Compute_dims(size, 2)
    row, col = divmod(rank, dims[1])                    # row-major ranks
    members = [row * dims[1] + j for j in range(dims[1])]
    return {"shift": (left, right),
            "halo": (numpy.array([5.0 + 10 * left]), numpy.array([10.0 * right])),
            "neighbors": numpy.array([1 + 100 * left, 100 * right], dtype=numpy.int32),
            "is_cart": True, "coords": [row, col],
            "row": (dims[1], numpy.array([sum(members)]))}


# -- running a program under both modules --------------------------------------------------


def assert_same(actual, expected, where="results", exact=True):
    """The same structure, arrays of the same dtype and values; `Close` floats unless `exact`."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r} is not a dict"
        assert actual.keys() == expected.keys(), \
            f"{where}: keys {sorted(actual)} != {sorted(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}[{key!r}]", exact)
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), \
            f"{where}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]", exact)
    elif isinstance(expected, numpy.ndarray):
        assert isinstance(actual, numpy.ndarray), f"{where}: {actual!r} is not an array"
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, \
            f"{where}: {actual.dtype}{actual.shape} != {expected.dtype}{expected.shape}"
        numpy.testing.assert_array_equal(actual, expected, err_msg=where)
    elif isinstance(expected, Close) and not exact:
        assert isinstance(actual, float) and math.isclose(actual, expected, rel_tol=1e-12), \
            f"{where}: {actual!r} is not close to {float(expected)!r}"
    else:
        assert type(actual) is type(expected) and actual == expected, \
            f"{where}: {actual!r} != {expected!r}"


def as_numpy(results):
    """A torch run's results, each tensor as a numpy array (and no numpy array made)."""
    if isinstance(results, dict):
        return {key: as_numpy(value) for key, value in results.items()}
    if isinstance(results, (list, tuple)):
        return type(results)(as_numpy(value) for value in results)
    assert not isinstance(results, numpy.ndarray), "the torch run made a numpy array"
    return results.numpy() if isinstance(results, torch.Tensor) else results


PROGRAMS = {point_to_point: expected_point_to_point, nonblocking: expected_nonblocking,
            broadcast: expected_broadcast, scatter_gather: expected_scatter_gather,
            matvec: expected_matvec, compute_pi: expected_compute_pi,
            sendrecv_ring: expected_sendrecv_ring, persistent: expected_persistent,
            vector_collectives: expected_vector_collectives,
            python_objects: expected_python_objects,
            sub_communicators: expected_sub_communicators, topologies: expected_topologies}


@case.matrix(program=tuple(PROGRAMS))
def tutorial(comm, program):
    assert comm is MCR.COMM_WORLD
    mine = program(MCR, MCR.COMM_WORLD)
    assert_same(mine, program(MPI4PY, MPI4PY.COMM_WORLD), "mcr vs mpi4py")
    assert_same(mine, PROGRAMS[program](comm.size, comm.rank), "mcr vs numpy", exact=False)


# python_objects: the pickle-based methods, no buffers
@case.matrix(program=tuple(p for p in PROGRAMS if p is not python_objects))
def tutorial_torch(comm, program):
    on_tensors = as_numpy(program(MCR, MCR.COMM_WORLD, np=torch))
    assert_same(on_tensors, program(MCR, MCR.COMM_WORLD), "torch vs numpy")
    assert_same(on_tensors, PROGRAMS[program](comm.size, comm.rank), "torch vs expected",
                exact=False)


test_mpi = mpi_cases(__name__)
