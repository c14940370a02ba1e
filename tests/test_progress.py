"""Staged operations (mcr.stages: compressed collectives, composed
non-blocking neighborhood collectives, and a Fusion's open buckets) under
MPI's progress rule and in call order, at 1-4 ranks.

Each progress case is a correct MPI program that deadlocks if a process
blocked in some other call does not post the later stages of an operation it
started: rank 0 starts the operation, then blocks in a call that the last
rank satisfies only after its own Wait on the operation has returned. A
deadlock kills the job (the harness's timeout) and fails every case.

The order cases post several staged operations and other collectives on the
same communicators, and the ranks test them in different orders: stages
posted in test order would pair different operations across ranks (wrong
data, MPI errors or a hang). A randomized case mixes both.

Expected values are computed here with torch from every rank's data.
"""

import random
import time

import torch

import mcr
from mcr import stages
from mpiharness import case, mpi_cases
from util import assert_equal, raises


def ring(comm):
    """A periodic ring: composed on Gloo, and on MPI at 1-2 ranks (Open MPI's order)."""
    return comm.Create_cart([comm.size], periods=[True])


def ring_expected(comm):
    """What Neighbor_alltoall of [10 r, 10 r + 1] gives on a ring: from the
    left neighbour its block sent right, from the right one its block sent left."""
    left, right = (comm.rank - 1) % comm.size, (comm.rank + 1) % comm.size
    return torch.tensor([10.0 * left + 1, 10.0 * right])


class Ctx:
    """What the operations of a case run on: a ring, and a Fusion of `comm`
    per backend (its buckets' collectives on `comm` itself, as the case's
    own collectives)."""

    def __init__(self, comm):
        self.topo = ring(comm)
        self.fusion = {b: mcr.Fusion(comm, backend=b, trace=True) for b in ("mpi", "gloo")}

    def close(self, comm):
        for f in self.fusion.values():
            traces = comm.allgather(f.trace)
            assert all(t == traces[0] for t in traces), traces   # the same buckets
            f.close()
        self.topo.Free()


def start(comm, kind, ctx):
    """Start a staged operation of `kind`; (request, check of its result)."""
    if kind.startswith("fused"):
        x = torch.full((3,), float(comm.rank + 1))
        y = torch.zeros(3)
        want = torch.full((3,), float(comm.size * (comm.size + 1) // 2))
        return ctx.fusion[kind.split("-")[1]].Iallreduce(x, y), lambda: assert_equal(y, want)
    if kind == "compressed":
        # small integers: exact in bf16, and their sums too
        x = torch.arange(6, dtype=torch.float32) + comm.rank
        y = torch.zeros(6)
        want = sum(torch.arange(6, dtype=torch.float32) + r for r in range(comm.size))
        return comm.Iallreduce(x, y, compress="bf16"), lambda: assert_equal(y, want)
    if kind == "compressed-gloo":
        x = torch.full((5,), float(comm.rank + 1))
        y = torch.zeros(5)
        want = torch.full((5,), float(comm.size * (comm.size + 1) // 2))
        return (comm.Iallreduce(x, y, compress="fp16", backend="gloo"),
                lambda: assert_equal(y, want))
    backend = kind.split("-")[1]
    s = torch.tensor([10.0 * comm.rank, 10.0 * comm.rank + 1])
    r = torch.zeros(2)
    want = ring_expected(comm)
    return ctx.topo.Ineighbor_alltoall(s, r, backend=backend), lambda: assert_equal(r, want)


KINDS = ("compressed", "compressed-gloo", "neighbor-gloo", "neighbor-mpi", "fused-mpi",
         "fused-gloo")


def blocked_until_last_waits(comm, block, unblock):
    """For every kind: rank 0 (and the others but the last) start it and
    `block()`; the last rank waits for it first, then `unblock()`s."""
    ctx = Ctx(comm)
    last = comm.size - 1
    for kind in KINDS:
        req, check = start(comm, kind, ctx)
        if comm.rank != last:
            block()
            req.Wait()
        else:
            time.sleep(0.05)        # (the others are in their blocking call by now)
            req.Wait()
            unblock()
        check()
    ctx.close(comm)


@case
def a_blocking_collective_drives_stages(comm):
    blocked_until_last_waits(comm, comm.Barrier, comm.Barrier)
    x = torch.ones(2)
    blocked_until_last_waits(comm, lambda: comm.Allreduce(mcr.IN_PLACE, x),
                             lambda: comm.Allreduce(mcr.IN_PLACE, x))
    assert_equal(x, torch.full((2,), float(comm.size ** len(KINDS))))


@case
def blocking_point_to_point_drives_stages(comm):
    last = comm.size - 1
    got = torch.zeros(1)
    for how in ("Recv", "Wait", "Waitall", "Waitany", "Waitsome", "Test", "Probe"):
        def block():
            if comm.rank != 0 or comm.size == 1:
                return
            if how == "Recv":
                comm.Recv(got, source=last, tag=8)
                return
            if how == "Probe":
                comm.Probe(source=last, tag=8)
                comm.Recv(got, source=last, tag=8)
                return
            q = comm.Irecv(got, source=last, tag=8)
            if how == "Wait":
                q.Wait()
            elif how == "Test":
                while not q.Test():
                    pass
            else:
                getattr(mcr.Request, how)([q])

        def unblock():
            if comm.size > 1:
                comm.Send(torch.ones(1), dest=0, tag=8)

        blocked_until_last_waits(comm, block, unblock)


@case
def mpi4py_methods_drive_stages(comm):
    last = comm.size - 1

    def recv():
        if comm.rank == 0 and comm.size > 1:
            assert comm.recv(source=last, tag=9) == {"from": last}

    def send():
        if comm.size > 1:
            comm.send({"from": last}, dest=0, tag=9)

    blocked_until_last_waits(comm, recv, send)
    blocked_until_last_waits(comm, lambda: comm.bcast(None, root=last),
                             lambda: comm.bcast("x", root=last))
    made = []
    blocked_until_last_waits(comm, lambda: made.append(comm.Dup()),
                             lambda: made.append(comm.Dup()))
    for dup in made:
        dup.Free()


@case
def fused_calls_progress_while_any_rank_blocks(comm):
    """A Fusion's open bucket while ranks block elsewhere. Rank 0 decides
    where buckets end: blocked, it posts its open buckets first (the others
    wait for them); the others, blocked while rank 0 waits, post theirs as
    rank 0's decisions come. Blocked in a Recv, a Probe, a Test loop, and a
    collective on another communicator."""
    other = comm.Dup()
    got = torch.zeros(1)
    v = torch.ones(1)
    for backend in ("mpi", "gloo"):
        with mcr.Fusion(comm, backend=backend, trace=True) as f:
            for waiter in (comm.size - 1, 0):
                for how in ("Recv", "Probe", "Test loop", "Allreduce elsewhere"):
                    x = torch.full((4,), float(comm.rank + 1))
                    y, y2 = torch.zeros(4), torch.zeros(4)
                    reqs = [f.Iallreduce(x, y), f.Iallreduce(2 * x, y2)]
                    if comm.rank != waiter:
                        if how == "Allreduce elsewhere":
                            other.Allreduce(mcr.IN_PLACE, v)
                        elif how == "Test loop":
                            q = comm.Irecv(got, source=waiter, tag=5)
                            while not q.Test():
                                pass
                        else:
                            if how == "Probe":
                                comm.Probe(source=waiter, tag=5)
                            comm.Recv(got, source=waiter, tag=5)
                        mcr.Request.Waitall(reqs)
                    else:
                        time.sleep(0.05)   # (the others are in their blocking call by now)
                        mcr.Request.Waitall(reqs)
                        if how == "Allreduce elsewhere":
                            other.Allreduce(mcr.IN_PLACE, v)
                        else:
                            for r in range(comm.size):
                                if r != waiter:
                                    comm.Send(torch.ones(1), dest=r, tag=5)
                    total = comm.size * (comm.size + 1) // 2
                    assert_equal(y, torch.full((4,), float(total)))
                    assert_equal(y2, torch.full((4,), 2.0 * total))
            traces = comm.allgather(f.trace)
            assert all(t == traces[0] for t in traces), traces
            assert sum(k for _, _, k in traces[0]) == 16, traces[0]
    assert_equal(v, torch.full((1,), float(comm.size ** 4)))
    assert not stages._active
    other.Free()


@case
def direct_collectives_come_after_fused_calls(comm):
    """Collectives called on the fused communicator itself while buckets are
    open, with rank 0's decisions made at rank-dependent times: every rank
    posts the same collectives on it in the same order, each bucket before
    the direct call made after its fused calls (the call hooks see them)."""
    import mcr.hooks
    fused = comm.Dup()
    seen = []

    def hook(call):
        if call.comm == fused:
            seen.append((call.op, call.form))

    total = comm.size * (comm.size + 1) // 2
    with mcr.hooks.installed(hook):
        f = mcr.Fusion(fused, trace=True)
        for i in range(9):
            x = torch.full((3,), float(comm.rank + 1 + i))
            y = torch.zeros(3)
            req = f.Iallreduce(x, y)
            if (comm.rank + i) % 2:
                req.Test()                  # (rank 0 decides here in some rounds)
            time.sleep(0.002 * ((comm.rank + i) % 3))
            v = torch.ones(2)
            if i % 3 == 0:
                fused.Allreduce(mcr.IN_PLACE, v)
            elif i % 3 == 1:
                fused.Barrier()
            else:
                q = fused.Iallreduce(mcr.IN_PLACE, v)
                q.Wait()
            req.Wait()
            assert_equal(y, torch.full((3,), float(total + comm.size * i)))
            if i % 3 != 1:
                assert_equal(v, torch.full((2,), float(comm.size)))
        f.close()
    fused.Free()
    seqs = comm.allgather(seen)
    assert all(q == seqs[0] for q in seqs), seqs
    assert seqs[0][:2] == [("Allreduce", "nonblocking"), ("Allreduce", "blocking")], seqs[0]
    assert len(seqs[0]) == 18, seqs[0]      # 9 buckets, 9 direct calls
    assert not stages._active


@case
def making_private_comms_drives_stages(comm):
    """The first compressed call on a backend makes its private communicators
    (a Dup, collective): rank 0 is blocked in it while the last rank waits
    for rank 0's next stage of an earlier call."""
    fresh = comm.Dup()
    x = torch.arange(4, dtype=torch.float32) + fresh.rank
    y, z = torch.zeros(4), torch.zeros(4)
    first = fresh.Iallreduce(x, y, compress="bf16")
    if fresh.rank == fresh.size - 1:
        time.sleep(0.05)
        first.Wait()
    second = fresh.Iallreduce(x, z, compress="fp16", backend="gloo")
    mcr.Request.Waitall([first, second])
    want = sum(torch.arange(4, dtype=torch.float32) + r for r in range(fresh.size))
    assert_equal(y, want)
    assert_equal(z, want)
    fresh.Free()


@case
def stages_are_posted_in_call_order(comm):
    """Staged operations and plain collectives on the same communicators,
    tested in a different order on every rank."""
    ctx = Ctx(comm)
    topo = ctx.topo
    dgraph = comm.Create_dist_graph_adjacent([(comm.rank - 1) % comm.size],
                                             [(comm.rank + 1) % comm.size])
    copy = dgraph.Dup()                 # (its rounds are agreed in a stage)
    for round_ in range(3):
        checks, reqs = [], []
        for kind in KINDS:
            req, check = start(comm, kind, ctx)
            reqs.append(req)
            checks.append(check)
            x = torch.full((3,), float(comm.rank + 1))
            y = torch.zeros(3)
            reqs.append(topo.Iallreduce(x, y, backend=kind.split("-")[-1]
                                        if not kind.startswith("compressed") else None))
            checks.append(lambda y=y: assert_equal(
                y, torch.full((3,), float(comm.size * (comm.size + 1) // 2))))
        for g in (dgraph, copy):
            s = torch.tensor([float(comm.rank)])
            r = torch.zeros(1)
            reqs.append(g.Ineighbor_alltoall(s, r, backend="gloo"))
            checks.append(lambda r=r: assert_equal(
                r, torch.tensor([float((comm.rank - 1) % comm.size)])))
        # each rank tests them in its own order before waiting for all
        order = list(range(len(reqs)))
        order = order[comm.rank % len(order):] + order[:comm.rank % len(order)]
        if (comm.rank + round_) % 2:
            order.reverse()
        for i in order:
            reqs[i].Test()
            time.sleep(0.002)
        mcr.Request.Waitall(reqs)
        for check in checks:
            check()
    for c in (copy, dgraph):
        c.Free()
    ctx.close(comm)


@case
def random_interleavings_complete(comm):
    """Every kind of staged operation, then a blocking call (Barrier,
    Allreduce, a ring of Send/Irecv, pickled bcast, or none), made before
    the operations complete on half the ranks and after on the others, each
    rank testing and waiting for them in its own random order."""
    rng = random.Random(1234 + comm.rank)
    ctx = Ctx(comm)
    left, right = (comm.rank - 1) % comm.size, (comm.rank + 1) % comm.size
    for it in range(60):
        started = [start(comm, kind, ctx) for kind in KINDS]
        reqs = [req for req, _ in started]
        if rng.random() < 0.5:
            reqs[rng.randrange(len(reqs))].Test()
        if (comm.rank + it) % 2:
            mcr.Request.Waitall(reqs)
        what = it % 5                       # (the same on every rank)
        if what == 0:
            comm.Barrier()
        elif what == 1:
            v = torch.ones(1)
            comm.Allreduce(mcr.IN_PLACE, v)
            assert v.item() == comm.size
        elif what == 2:
            got = torch.zeros(1)
            q = comm.Irecv(got, source=left, tag=3)
            comm.Send(torch.full((1,), float(comm.rank)), dest=right, tag=3)
            q.Wait()
            assert got.item() == left
        elif what == 3:
            assert comm.bcast(it if comm.rank == 0 else None, root=0) == it
        for i in rng.sample(range(len(reqs)), len(reqs)):
            if rng.random() < 0.5:
                reqs[i].Wait()
        mcr.Request.Waitall(reqs)
        for _, check in started:
            check()
    assert not stages._active
    ctx.close(comm)


@case
def a_failed_stage_fails_its_own_request(comm):
    """A stage whose local work raises (a codec's decode, on every rank)
    fails that operation's request only: the one posted after it completes."""
    def encode(x):
        return x.clone()

    def bad_decode(payload, like):
        raise ValueError("this decode refuses")

    x = torch.ones(4)
    y = torch.zeros(4)
    bad = comm.Iallreduce(x, y, compress=(encode, bad_decode))
    z = torch.zeros(4)
    good = comm.Iallreduce(x, z, compress="bf16")
    with raises(ValueError, "this decode refuses"):
        bad.Wait()
    good.Wait()
    assert_equal(z, torch.full((4,), float(comm.size)))
    assert not stages._active, "no operation left with stages to post"


@case
def nothing_left_pending(comm):
    """After the operations complete, nothing is staged: the call path's flag is off."""
    req, check = start(comm, "compressed", None)
    req.Wait()
    check()
    assert not stages._active
    with mcr.Fusion(comm) as f:
        y = torch.zeros(2)
        req = f.Iallreduce(torch.ones(2), y)
        assert stages._active, "an open bucket is driven"
        req.Wait()
        assert not stages._active
    assert_equal(y, torch.full((2,), float(comm.size)))


test_mpi = mpi_cases(__name__)
