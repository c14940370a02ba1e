"""Staged operations (mcr.stages: compressed collectives, composed non-blocking neighborhood
collectives, a Fusion's open buckets) under MPI's progress rule and in call order.

A progress case is a correct MPI program that deadlocks (the harness's timeout) unless a process
blocked in another call posts the later stages of an operation it started: rank 0 starts it,
then blocks in a call the last rank satisfies only after its own Wait on it. The order cases
post staged operations and collectives on the same communicators, tested in a different order
on every rank: stages posted in test order would pair different operations across ranks."""

import os
import random
import threading
import time

import torch

import mcr
import mcr.hooks
from mcr import _core, progress
from mpiharness import LAYER_SIZES, case, mpi_cases
from util import assert_equal, raises

KINDS = ("compressed", "compressed-gloo", "neighbor-gloo", "neighbor-mpi", "fused-mpi",
         "fused-gloo")


def summed(comm, n, times=1):
    """Allreduce of full(n, times * (rank + 1)), computed here."""
    return torch.full((n,), float(times * comm.size * (comm.size + 1) // 2))


def same_everywhere(comm, value):
    values = comm.allgather(value)
    assert all(v == values[0] for v in values), values
    return values[0]


def spin(req):
    while not req.Test():
        pass


class Ctx:
    """A periodic ring (composed on Gloo, and on MPI at 1-2 ranks: Open MPI's order), and a Fusion
    of `comm` per backend (its buckets' collectives on `comm`, as the case's own)."""

    def __init__(self, comm):
        self.topo = comm.Create_cart([comm.size], periods=[True])
        self.fusion = {b: mcr.Fusion(comm, backend=b, trace=True) for b in ("mpi", "gloo")}

    def close(self, comm):
        for f in self.fusion.values():
            same_everywhere(comm, f.trace)          # the same buckets
            f.close()
        self.topo.Free()


def start(comm, kind, ctx):
    """Start a staged operation of `kind`; (request, check of its result)."""
    if kind.startswith("neighbor"):
        # from the left neighbour its block sent right, from the right one its block sent left
        left, right = (comm.rank - 1) % comm.size, (comm.rank + 1) % comm.size
        r, want = torch.zeros(2), torch.tensor([10.0 * left + 1, 10.0 * right])
        req = ctx.topo.Ineighbor_alltoall(torch.tensor([10.0 * comm.rank, 10.0 * comm.rank + 1]),
                                          r, backend=kind[len("neighbor-"):])
        return req, lambda: assert_equal(r, want)
    if kind == "compressed":
        # small integers: exact in bf16, and their sums too
        y, want = torch.zeros(6), sum(torch.arange(6.0) + r for r in range(comm.size))
        return (comm.Iallreduce(torch.arange(6.0) + comm.rank, y, compress="bf16"),
                lambda: assert_equal(y, want))
    n = 3 if kind.startswith("fused") else 5
    x, y = torch.full((n,), float(comm.rank + 1)), torch.zeros(n)
    req = ctx.fusion[kind[len("fused-"):]].Iallreduce(x, y) if kind.startswith("fused") \
        else comm.Iallreduce(x, y, compress="fp16", backend="gloo")
    return req, lambda: assert_equal(y, summed(comm, n))


def blocked_until_last_waits(comm, block, unblock=None):
    """Every kind: the ranks but the last start it and `block()`; the last waits, then
    `unblock()`s (default: `block()`)."""
    ctx = Ctx(comm)
    for kind in KINDS:
        req, check = start(comm, kind, ctx)
        if comm.rank != comm.size - 1:
            block()
            req.Wait()
        else:
            if comm.size > 1:
                time.sleep(0.05)    # (the others are in their blocking call by now)
            req.Wait()
            (unblock or block)()
        check()
    ctx.close(comm)


@case
def wait_loops_sleep_sooner_on_an_oversubscribed_host(comm):
    # more ranks on this host than cores (the launcher's count): 16 turns of a wait loop
    # yield the core before it sleeps, not 256 (docs/performance.rst)
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or os.environ.get("MPI_LOCALNRANKS")
    assert local is not None, "the harness starts its jobs with Open MPI or MPICH"
    assert _core._idle_yields() == (16 if int(local) > os.cpu_count() else 256)


@case
def a_blocking_collective_drives_stages(comm):
    blocked_until_last_waits(comm, comm.Barrier)
    x = torch.ones(2)
    blocked_until_last_waits(comm, lambda: comm.Allreduce(mcr.IN_PLACE, x))
    assert_equal(x, torch.full((2,), float(comm.size ** len(KINDS))))


@case.matrix(how=("Recv", "Probe", "Wait", "Test", "Waitall", "Waitany", "Waitsome"))
def blocking_point_to_point_drives_stages(comm, how):
    # rank 0 blocks receiving the last rank's message (no one blocks at 1 rank)
    last, got = comm.size - 1, torch.zeros(1)
    blocking = comm.rank == 0 and last > 0

    def irecv():
        return comm.Irecv(got, source=last, tag=8)

    block = {"Recv": lambda: comm.Recv(got, source=last, tag=8),
             "Probe": lambda: (comm.Probe(source=last, tag=8), comm.Recv(got, source=last, tag=8)),
             "Wait": lambda: irecv().Wait(), "Test": lambda: spin(irecv())}.get(
        how, lambda: getattr(mcr.Request, how)([irecv()]))
    blocked_until_last_waits(comm, lambda: blocking and block(),
                             lambda: last > 0 and comm.Send(torch.ones(1), dest=0, tag=8))


@case
def mpi4py_methods_drive_stages(comm):
    last, got, made = comm.size - 1, [], []
    blocking = comm.rank == 0 and last > 0
    blocked_until_last_waits(comm, lambda: blocking and got.append(comm.recv(source=last, tag=9)),
                             lambda: last > 0 and comm.send({"from": last}, 0, 9))
    assert got == ([{"from": last}] * len(KINDS) if blocking else [])
    blocked_until_last_waits(comm, lambda: comm.bcast(None, root=last),
                             lambda: comm.bcast("x", root=last))
    blocked_until_last_waits(comm, lambda: made.append(comm.Dup()))
    for dup in made:
        dup.Free()


@case.matrix(backend=("mpi", "gloo"))
def fused_calls_progress_while_any_rank_blocks(comm, backend):
    """Open buckets while ranks block (Recv, Probe, a Test loop, a collective elsewhere): blocked,
    rank 0 (which decides where buckets end) posts its buckets; the others as its decisions come."""
    other, got, v = comm.Dup(), torch.zeros(1), torch.ones(1)
    with mcr.Fusion(comm, backend=backend, trace=True) as f:
        for waiter in (comm.size - 1, 0):
            for how in ("Recv", "Probe", "Test loop", "Allreduce elsewhere"):
                x = torch.full((4,), float(comm.rank + 1))
                y, y2 = torch.zeros(4), torch.zeros(4)
                reqs = [f.Iallreduce(x, y), f.Iallreduce(2 * x, y2)]
                if comm.rank == waiter:
                    time.sleep(0.05)   # (the others are in their blocking call by now)
                    mcr.Request.Waitall(reqs)
                if how == "Allreduce elsewhere":
                    other.Allreduce(mcr.IN_PLACE, v)
                elif comm.rank == waiter:
                    for r in set(range(comm.size)) - {waiter}:
                        comm.Send(torch.ones(1), dest=r, tag=5)
                elif how == "Test loop":
                    spin(comm.Irecv(got, source=waiter, tag=5))
                else:
                    if how == "Probe":
                        comm.Probe(source=waiter, tag=5)
                    comm.Recv(got, source=waiter, tag=5)
                if comm.rank != waiter:
                    mcr.Request.Waitall(reqs)
                assert_equal(y, summed(comm, 4))
                assert_equal(y2, summed(comm, 4, 2))
        assert sum(k for _, _, k in same_everywhere(comm, f.trace)) == 16, f.trace
    assert_equal(v, torch.full((1,), float(comm.size ** 2)))   # (one per waiter)
    assert not progress._active
    other.Free()


@case
def direct_collectives_come_after_fused_calls(comm):
    """Collectives on the fused communicator while buckets are open (rank 0 deciding at rank-
    dependent times): every rank posts, as hooks see, each bucket before the next direct call."""
    fused, seen = comm.Dup(), []

    def hook(call):
        if call.comm == fused:
            seen.append((call.op, call.form))

    with mcr.hooks.installed(hook):
        f = mcr.Fusion(fused, trace=True)
        for i in range(9):
            y = torch.zeros(3)
            req = f.Iallreduce(torch.full((3,), float(comm.rank + 1 + i)), y)
            if (comm.rank + i) % 2:
                req.Test()                  # (rank 0 decides here in some rounds)
            time.sleep(0.002 * ((comm.rank + i) % 3))
            v = torch.ones(2)
            if i % 3 == 0:
                fused.Allreduce(mcr.IN_PLACE, v)
            elif i % 3 == 1:
                fused.Barrier()
            else:
                fused.Iallreduce(mcr.IN_PLACE, v).Wait()
            req.Wait()
            assert_equal(y, summed(comm, 3) + comm.size * i)
            if i % 3 != 1:
                assert_equal(v, torch.full((2,), float(comm.size)))
        f.close()
    fused.Free()
    seq = same_everywhere(comm, seen)
    assert seq[:2] == [("Allreduce", "nonblocking"), ("Allreduce", "blocking")], seq
    assert len(seq) == 18, seq      # 9 buckets, 9 direct calls
    assert not progress._active


@case
def making_private_comms_drives_stages(comm):
    """Rank 0 blocks in the first compressed call on a backend (making its private communicators,
    collectively) while the last rank waits for rank 0's next stage of an earlier call."""
    fresh = comm.Dup()
    x, y, z = torch.arange(4.0) + fresh.rank, torch.zeros(4), torch.zeros(4)
    first = fresh.Iallreduce(x, y, compress="bf16")
    if fresh.rank == fresh.size - 1:
        time.sleep(0.05)
        first.Wait()
    second = fresh.Iallreduce(x, z, compress="fp16", backend="gloo")
    mcr.Request.Waitall([first, second])
    for out in (y, z):
        assert_equal(out, sum(torch.arange(4.0) + r for r in range(fresh.size)))
    fresh.Free()


@case
def stages_are_posted_in_call_order(comm):
    """Staged operations and plain collectives on the same communicators, tested in rank order."""
    ctx = Ctx(comm)
    dgraph = comm.Create_dist_graph_adjacent([(comm.rank - 1) % comm.size],
                                             [(comm.rank + 1) % comm.size])
    copy = dgraph.Dup()                 # (its rounds are agreed in a stage)
    for round_ in range(3):
        checks, reqs = [], []
        for kind in KINDS:
            req, check = start(comm, kind, ctx)
            y = torch.zeros(3)
            backend = None if kind.startswith("compressed") else kind.split("-")[-1]
            reqs += [req, ctx.topo.Iallreduce(torch.full((3,), float(comm.rank + 1)), y,
                                              backend=backend)]
            checks += [check, lambda y=y: assert_equal(y, summed(comm, 3))]
        for g in (dgraph, copy):
            r = torch.zeros(1)
            reqs.append(g.Ineighbor_alltoall(torch.tensor([float(comm.rank)]), r, backend="gloo"))
            checks.append(lambda r=r: assert_equal(
                r, torch.tensor([float((comm.rank - 1) % comm.size)])))
        # each rank tests them in its own order before waiting for all
        shift = comm.rank % len(reqs)
        order = list(range(shift, len(reqs))) + list(range(shift))
        for i in order[::-1] if (comm.rank + round_) % 2 else order:
            reqs[i].Test()
            time.sleep(0.002)
        mcr.Request.Waitall(reqs)
        for check in checks:
            check()
    copy.Free()
    dgraph.Free()
    ctx.close(comm)


@case
def random_interleavings_complete(comm):
    """Every kind, then a blocking call (Barrier, Allreduce, Send/Irecv ring, bcast, none) before
    they complete on half the ranks, after on the others, in random orders of Test and Wait."""
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
            comm.Allreduce(mcr.IN_PLACE, v := torch.ones(1))
            assert v.item() == comm.size
        elif what == 2:
            q = comm.Irecv(got := torch.zeros(1), source=left, tag=3)
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
    assert not progress._active
    ctx.close(comm)


@case
def a_failed_stage_fails_its_own_request(comm):
    """A stage whose local work raises (a codec's decode) fails its own request only."""
    def bad_decode(payload, like):
        raise ValueError("this decode refuses")

    x, y, z = torch.ones(4), torch.zeros(4), torch.zeros(4)
    bad = comm.Iallreduce(x, y, compress=(lambda t: t.clone(), bad_decode))
    good = comm.Iallreduce(x, z, compress="bf16")
    with raises(ValueError, "this decode refuses"):
        bad.Wait()
    good.Wait()
    assert_equal(z, torch.full((4,), float(comm.size)))
    assert not progress._active, "no operation left with stages to post"


@case
def nothing_left_pending(comm):
    """After the operations complete the call path's flag is off."""
    req, check = start(comm, "compressed", None)
    req.Wait()
    check()
    assert not progress._active
    with mcr.Fusion(comm) as f:
        y = torch.zeros(2)
        req = f.Iallreduce(torch.ones(2), y)
        assert progress._active, "an open bucket is driven"
        req.Wait()
        assert not progress._active
    assert_equal(y, torch.full((2,), float(comm.size)))



class Overlaps:
    """A driver whose pump lasts 2 ms, counting pumps by the helper and by the calling thread,
    and the times two threads were inside it at once."""

    def __init__(self):
        self.lock, self.inside, self.overlaps, self.pumps = threading.Lock(), 0, 0, [0, 0]

    def pump(self, helper):
        with self.lock:
            self.inside += 1
            self.overlaps += self.inside > 1
            self.pumps[helper] += 1
        time.sleep(0.002)
        with self.lock:
            self.inside -= 1

    def blocking(self):
        pass

    def collective(self, comm):
        pass


class DrivesWhenTested:
    """The work of a freed request whose test drives, through pump_all (a staged operation's
    request) and in the driver's own code (a Fusion's call); complete at its third test."""

    def __init__(self, driver):
        self.driver, self.tests = driver, 0

    def is_completed(self):
        self.tests += 1
        progress.pump_all()
        self.driver.pump(False)
        return self.tests >= 3

    def wait(self):
        pass


@case
def one_thread_at_a_time_drives(comm):
    """The helper drives in a blocking call's window; the calling thread, after the call and
    inside the window, tests the works of freed requests, which drive too: the helper pauses
    meanwhile (a Fusion driven by both threads lost a decision: a hang)."""
    d = Overlaps()
    progress.enlist(d)
    try:
        for _ in range(4):
            _core._work_request("test", [DrivesWhenTested(d)]).Free()
            comm.Barrier()
            time.sleep(0.01)
    finally:
        progress.dismiss(d)
    assert d.overlaps == 0 and d.pumps[False], (d.overlaps, d.pumps)   # 20 a rank, unpaused


def window_thread():
    """A thread that enters a blocking call's window and stays there until `leave` is set:
    (the thread, not started; `inside`, set once it is in; `leave`)."""
    inside, leave = threading.Event(), threading.Event()

    def blocked():
        with progress.window():
            inside.set()
            leave.wait(10)
    return threading.Thread(target=blocked), inside, leave


def helper_pumps(d):
    """How many times the helper pumps driver `d` in the next 50 ms."""
    before = d.pumps[True]
    time.sleep(0.05)
    return d.pumps[True] - before


@case
def the_helper_drives_while_any_thread_is_blocked(comm):
    """Two threads in a blocking call's window: the first one's return hands the helper to the
    second (it stopped it: a second thread blocked in Recv left the stages undriven, a hang)."""
    d, (second, inside, leave) = Overlaps(), window_thread()
    progress.enlist(d)
    try:
        with progress.window():
            second.start()
            inside.wait(10)
        pumped = helper_pumps(d)
        leave.set()
        second.join()
    finally:
        progress.dismiss(d)
    assert pumped > 0 and d.overlaps == 0, (pumped, d.overlaps)


@case
def a_pause_holds_while_another_thread_blocks(comm):
    """A thread pausing the helper in its window (its driver code runs) keeps it paused while a
    second thread enters a window, and the helper drives again once the pause ends."""
    d, (second, inside, leave) = Overlaps(), window_thread()
    progress.enlist(d)
    try:
        with progress.window():
            with progress.paused():
                second.start()
                inside.wait(10)
                during = helper_pumps(d)
            after = helper_pumps(d)
    finally:
        leave.set()
        second.join()
        progress.dismiss(d)
    assert during == 0 and after > 0, (during, after)


test_mpi = mpi_cases(__name__, sizes=LAYER_SIZES)
