"""Programs that mix the MPI and Gloo backends on one communicator: progress (waiting on Gloo
drives MPI for peers waiting on MPI, and the converse); one Request class (Wait/Test{all,any,
some} over any mix, null and persistent requests too, each reported once with its status, even
after Get_status or a failed Testall); randomized interleavings with seeds shared by the ranks
(matrix collectives on random backends, blocking calls on one backend while the other has
requests outstanding, same tags on both backends); communicators (own Gloo groups made at any
first Gloo call, released by Free; freed and null ones refuse every backend); stream-ordered
works (NCCL's collectives and receives) waited at once, not polled. Expected values: torch on
the whole data.
"""

import itertools
import random
import time

import pytest
import torch

import mcr
import mcr.backends.gloo
from mcr import MPI, _core
from mcr.backends import compose
from mcr.backends.torchpg import StreamOrdered
from mpiharness import case, mpi_cases, run_script, world_sizes
from opmatrix import COMPLETIONS, OPERATIONS, complete, nonblocking, poller, run_operation
from opref import rank_data
from util import Failures, assert_comm_works, assert_equal, raises, ring, status_of

BACKENDS = ("mpi", "gloo")
BIG = 1 << 20                   # float32 elements: 4 MiB, past every eager limit
SEEDS = range(8)
OPS_PER_SEED = 10
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16,
          torch.bfloat16]


def warm_up(comm):
    """Make comm's Gloo group (collective, at the first Gloo call) with every rank here."""
    comm.Barrier(backend="gloo")


def full(n, value):
    return torch.full((n,), float(value))


# -- progress ----------------------------------------------------------------------------------
def gloo_wait(comm, how, x):
    """A Gloo Allreduce of `x` in place, "blocking" or completed by `how` of COMPLETIONS."""
    if how == "blocking":
        comm.Allreduce(mcr.IN_PLACE, x, backend="gloo")
    else:
        complete([comm.Iallreduce(mcr.IN_PLACE, x, backend="gloo")], how, random.Random(0))


@case
def waiting_on_gloo_drives_mpi_progress(comm):
    # rank 0 waits on Gloo after a large MPI Iallreduce the others wait for first
    warm_up(comm)
    size, failures = comm.size, Failures(comm)
    for k, how in enumerate(("blocking",) + COMPLETIONS):
        out, small = torch.zeros(BIG), full(3, comm.rank + 1)
        req = comm.Iallreduce(full(BIG, comm.rank + k), out)
        if comm.rank == 0:
            gloo_wait(comm, how, small)
        req.Wait()
        if comm.rank != 0:
            gloo_wait(comm, how, small)
        failures.check(f"MPI Iallreduce while rank 0 waits on gloo ({how})", out[:4],
                       full(4, sum(range(size)) + k * size))
        failures.check(f"gloo Allreduce ({how})", small, full(3, size * (size + 1) // 2))
    failures.done()


@case
def waiting_on_gloo_completes_a_large_mpi_send(comm):
    # rendezvous: the 4 MiB message moves only while its sender drives MPI
    warm_up(comm)
    if comm.size == 1:
        return
    failures = Failures(comm)
    for k, how in enumerate(("blocking",) + COMPLETIONS):
        small = torch.ones(2)
        if comm.rank == 0:
            sreq = comm.Isend(full(BIG, k), 1, tag=k)
            gloo_wait(comm, how, small)
            sreq.Wait()
        elif comm.rank == 1:
            out = torch.zeros(BIG)
            comm.Recv(out, 0, tag=k)
            failures.check(f"4 MiB MPI message while rank 0 waits on gloo ({how})", out[-3:],
                           full(3, k))
        if comm.rank != 0:
            gloo_wait(comm, how, small)
        failures.check(f"gloo Allreduce ({how})", small, full(2, comm.size))
    failures.done()


@case
def blocking_on_mpi_while_peers_wait_on_gloo(comm):
    warm_up(comm)
    size, failures = comm.size, Failures(comm)
    for k, how in enumerate(COMPLETIONS):
        big, small = full(BIG, comm.rank + k), full(2, comm.rank)
        greq = comm.Iallreduce(mcr.IN_PLACE, big, backend="gloo")
        if comm.rank == 0:
            comm.Allreduce(mcr.IN_PLACE, small)             # blocking MPI first
        complete([greq], how, random.Random(k))
        if comm.rank != 0:
            comm.Allreduce(mcr.IN_PLACE, small)
        failures.check(f"gloo Iallreduce ({how}) while rank 0 blocks in MPI", big[:3],
                       full(3, sum(range(size)) + k * size))
        failures.check("MPI Allreduce", small, full(2, sum(range(size))))
    failures.done()


# -- one Request class --------------------------------------------------------------------------
def mixed_requests(comm, n, tag0):
    """Receives, collectives (numpy too) and a null request on both backends, alternating;
    (requests, checks, sends), checks[i] None or (status of a receive or None, out, want)."""
    right, left = ring(comm)
    size, rank, i64, i32 = comm.size, comm.rank, torch.int64, torch.int32
    requests, checks, sends = [], [], []
    for k, backend in enumerate(BACKENDS * 2):
        tag = tag0 + k
        if size > 1:
            out = torch.zeros(n, dtype=i64)
            requests.append(comm.Irecv(out, left, tag, backend=backend))
            checks.append(((left, tag, n), out, rank_data(left, n, i64, tag)))
            sends.append(comm.Isend(rank_data(rank, n, i64, tag), right, tag, backend=backend))
        out = torch.zeros(n)
        requests.append(comm.Iallreduce(rank_data(rank, n, seed=tag), out, backend=backend))
        checks.append((None, out, sum(rank_data(r, n, seed=tag) for r in range(size))))
        if k == 1:
            requests.append(mcr.Request())                   # a null request
            checks.append(None)
        total = torch.zeros(n, dtype=i32)
        requests.append(comm.Iallreduce(rank_data(rank, n, i32, tag).numpy(), total.numpy(),
                                        op=mcr.MAX, backend=backend))
        checks.append((None, total, torch.stack([rank_data(r, n, i32, tag)
                                                 for r in range(size)]).amax(0)))
    return requests, checks, sends


@case
def request_sets_over_both_backends(comm):
    warm_up(comm)
    failures, rng = Failures(comm), random.Random(comm.rank)
    for k, how in enumerate(COMPLETIONS):
        requests, checks, sends = mixed_requests(comm, 3, 100 + 10 * k)
        got = complete(requests, how, rng)
        # the null request is reported by Wait/Test and the "all" forms only
        active = {i for i, c in enumerate(checks) if c is not None or how[4:] in ("", "all")}
        assert set(got) == active, (how, sorted(got), sorted(active))
        for i, c in enumerate(checks):
            if c is not None:
                failures.check(f"{how}: request {i}", c[1], c[2])
                if c[0] is not None and status_of(got[i]) != c[0]:
                    failures.found.append(f"{how}: request {i} status {status_of(got[i])}, "
                                          f"expected {c[0]}")
        assert not any(requests), f"{how}: a completed request is still active"
        mcr.Request.Waitall(sends)
        # nothing left: the set functions say so for every backend
        assert mcr.Request.Waitany(requests) == mcr.UNDEFINED
        assert mcr.Request.Testany(requests) == (mcr.UNDEFINED, True)
        assert mcr.Request.Waitsome(requests) is None
        assert mcr.Request.Testall(requests) is True
    failures.done()


@case
def a_peeked_completion_is_still_reported(comm):
    # MPI: Get_status does not complete a request; Wait/Waitany report it later
    warm_up(comm)
    for backend in BACKENDS:
        out, poll = torch.zeros(2), poller()
        req = comm.Iallreduce(torch.ones(2), out, backend=backend)
        while not req.Get_status():
            poll()
        assert req, f"{backend}: Get_status completed the request"
        assert mcr.Request.Waitany([req]) == 0, backend
        assert not req
        assert mcr.Request.Waitany([req]) == mcr.UNDEFINED, backend
        assert_equal(out, full(2, comm.size))


@case
def a_testall_that_fails_completes_nothing(comm):
    # MPI: when Testall returns False, no request is completed; each is
    # reported later by Waitany. Rank 0 polls while the others hold back the
    # second operation (they wait for it on a separate communicator).
    warm_up(comm)
    sync = comm.Dup()
    for backend in BACKENDS if comm.size > 1 else ():
        first = torch.zeros(2)
        reqs = [comm.Iallreduce(torch.ones(2), first, backend=backend)]
        if comm.rank == 0:
            reqs.append(comm.Ibarrier(backend=backend))
            # poll until the first operation has surely finished inside mcr:
            # 0.2 s after its result is in place (or after 3 s at most)
            poll, filled, deadline = poller(), None, time.monotonic() + 3.0
            while time.monotonic() < deadline:
                assert mcr.Request.Testall(reqs) is False, backend
                now = time.monotonic()
                if filled is None and torch.equal(first, full(2, comm.size)):
                    filled = now
                if filled is not None and now - filled > 0.2:
                    break
                poll()
            assert mcr.Request.Testany([reqs[1]]) == (mcr.UNDEFINED, False)
            if backend != "mpi":
                with raises(ValueError, f"backend {backend!r}", "cannot be cancelled"):
                    reqs[1].Cancel()
            sync.Barrier()
        else:
            reqs[0].Wait()
            sync.Barrier()
            reqs.append(comm.Ibarrier(backend=backend))
        seen = []
        while (index := mcr.Request.Waitany(reqs)) != mcr.UNDEFINED:
            seen.append(index)
        # rank 0 has completed neither; the others, the first one already
        assert sorted(seen) == ([0, 1] if comm.rank == 0 else [1]), (backend, seen)
        assert_equal(first, full(2, comm.size))
    sync.Free()


@case
def persistent_requests_on_both_backends(comm):
    warm_up(comm)
    right, left = ring(comm)
    size, n, failures = comm.size, 3, Failures(comm)
    bufs = {b: (torch.zeros(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32),
                torch.zeros(n), torch.zeros(n * size)) for b in BACKENDS}
    requests, recv_index = [], {}       # recv_index: where each backend's Recv_init is
    for b, (send, recv, mine, gathered) in bufs.items():
        if size > 1:
            recv_index[b] = len(requests)
            requests += [comm.Recv_init(recv, left, 7, backend=b),
                         comm.Send_init(send, right, 7, backend=b)]
        requests.append(comm.Allgather_init(mine, gathered, backend=b))
    assert all(isinstance(r, mcr.Prequest) for r in requests)
    rng = random.Random(comm.rank)
    for it, how in enumerate(COMPLETIONS):
        for k, (send, recv, mine, gathered) in enumerate(bufs.values()):   # new contents
            send.copy_(rank_data(comm.rank, n, torch.int32, 10 * it + k))
            mine.copy_(rank_data(comm.rank, n, seed=10 * it + k))
            recv.fill_(-1)
            gathered.fill_(-1)
        mcr.Prequest.Startall(requests)
        got = complete(requests, how, rng)
        assert set(got) == set(range(len(requests))), (how, sorted(got))
        for k, (b, (send, recv, mine, gathered)) in enumerate(bufs.items()):
            seed, label = 10 * it + k, f"iteration {it} ({how})"
            if size > 1:
                failures.check(f"{label}: Recv_init on {b}", recv,
                               rank_data(left, n, torch.int32, seed))
                st = got[recv_index[b]]
                if status_of(st) != (left, 7, n):
                    failures.found.append(f"{label}: status on {b} {status_of(st)}")
            failures.check(f"{label}: Allgather_init on {b}", gathered,
                           torch.cat([rank_data(r, n, seed=seed) for r in range(size)]))
    for r in requests:
        r.Free()
    failures.done()


# -- randomized interleavings ------------------------------------------------------------
def draw_ops(comm, rng, count, backends=BACKENDS):
    """`count` (label, method, args, check, backend) drawn from `rng` (alike on every rank):
    matrix variants on a drawn element type, data set and backend of `backends`."""
    ops = []
    for _ in range(count):
        method = rng.choice(list(OPERATIONS))
        what, make = rng.choice(list(OPERATIONS[method].variants(comm, [rng.choice(DTYPES)])))
        args, check = make(rng.randrange(1000))
        ops.append((f"{method} {what}", method, args, check, rng.choice(backends)))
    return ops


def post(comm, op, failures, label):
    """Post `op` non-blocking; its Request, or None if posting failed."""
    what, method, args, _, backend = op
    try:
        return getattr(comm, nonblocking(method))(*args, backend=backend)
    except Exception as exc:  # noqa: BLE001 - recorded; raised alike on every rank
        failures.error(f"{label}: posting {what} on {backend}", exc)
        return None


def check_ops(ops, failures, label):
    for k, (what, _, args, check, backend) in enumerate(ops):
        try:
            check(args)
        except AssertionError as exc:
            failures.error(f"{label}: op {k} {what} on {backend}", exc)


@case
def random_collectives_completed_in_random_orders(comm):
    warm_up(comm)
    failures = Failures(comm)
    for seed in SEEDS:
        ops = draw_ops(comm, random.Random(seed), OPS_PER_SEED)
        how = COMPLETIONS[seed % len(COMPLETIONS)]
        label = f"seed {seed} ({how})"
        requests = [post(comm, op, failures, label) for op in ops]
        posted = [r for r in requests if r is not None]
        got = complete(posted, how, random.Random(1000 * seed + comm.rank))
        assert len(got) == len(posted), (label, len(got), len(posted))
        check_ops([o for o, r in zip(ops, requests) if r is not None], failures, label)
    failures.done()


@case
def blocking_calls_while_the_other_backend_has_requests_outstanding(comm):
    warm_up(comm)
    failures = Failures(comm)
    for seed, outstanding in itertools.product(SEEDS, BACKENDS):
        blocking = BACKENDS[1 - BACKENDS.index(outstanding)]
        shared = random.Random(seed)
        posted_ops = draw_ops(comm, shared, OPS_PER_SEED // 2, (outstanding,))
        blocking_ops = draw_ops(comm, shared, OPS_PER_SEED // 2, (blocking,))
        label = f"seed {seed}, {outstanding} outstanding, {blocking} blocking"
        # each backend's operations in the same order on every rank; how the
        # two sequences interleave differs from rank to rank
        mine = random.Random(1000 * seed + comm.rank)
        steps = ["post"] * len(posted_ops) + ["block"] * len(blocking_ops)
        mine.shuffle(steps)
        pending, to_post, to_block = [], iter(posted_ops), iter(blocking_ops)
        for step in steps:
            if step == "post":
                pending.append(post(comm, next(to_post), failures, label))
                continue
            what, method, args, _, b = next(to_block)
            try:
                getattr(comm, method)(*args, backend=b)
            except Exception as exc:  # noqa: BLE001 - recorded, alike on every rank
                failures.error(f"{label}: blocking {what} on {b}", exc)
        complete([r for r in pending if r is not None],
                 COMPLETIONS[(seed + comm.rank) % len(COMPLETIONS)], mine)
        check_ops([o for o, r in zip(posted_ops, pending) if r is not None] + blocking_ops,
                  failures, label)
    failures.done()


@case
def messages_on_both_backends_with_the_same_tags_do_not_cross(comm):
    warm_up(comm)
    if comm.size == 1:
        return
    right, left = ring(comm)
    failures = Failures(comm)
    for tag in (0, 5):
        outs = {b: torch.zeros(4, dtype=torch.int64) for b in BACKENDS}
        # receives posted gloo first, with wildcards: they must still take
        # the message of their own backend
        reqs = [comm.Irecv(outs[b], mcr.ANY_SOURCE, mcr.ANY_TAG, backend=b)
                for b in reversed(BACKENDS)]
        sends = [comm.Isend(rank_data(comm.rank, 4, torch.int64, 10 * tag + k), right, tag,
                            backend=b) for k, b in enumerate(BACKENDS)]
        statuses = []
        mcr.Request.Waitall(reqs + sends, statuses)
        for k, b in enumerate(BACKENDS):
            failures.check(f"tag {tag} on {b}", outs[b],
                           rank_data(left, 4, torch.int64, 10 * tag + k))
        for st in statuses[:2]:
            assert status_of(st) == (left, tag, 4)
    failures.done()


@case
def random_messages_on_both_backends(comm):
    warm_up(comm)
    size = comm.size
    failures = Failures(comm)
    for seed in SEEDS if size > 1 else ():
        shared = random.Random(seed)
        # (source, dest, backend, n, dtype): unique tags, so any posting order matches
        messages = []
        for _ in range(3 * size):
            src = shared.randrange(size)
            messages.append((src, (src + shared.randrange(1, size)) % size,
                             shared.choice(BACKENDS), shared.randint(0, 6),
                             shared.choice(DTYPES)))
        mine = random.Random(1000 * seed + comm.rank)
        requests, checks = [], []
        for tag in mine.sample(range(len(messages)), len(messages)):   # rank-shuffled
            src, dst, b, n, dtype = messages[tag]
            if dst == comm.rank:
                out = torch.zeros(n, dtype=dtype)
                requests.append(comm.Irecv(out, src, tag, backend=b))
                checks.append((len(requests) - 1, tag, out,
                               rank_data(src, n, dtype, seed * 100 + tag)))
            if src == comm.rank:
                requests.append(comm.Isend(rank_data(src, n, dtype, seed * 100 + tag), dst,
                                           tag, backend=b))
        got = complete(requests, COMPLETIONS[(seed + comm.rank) % len(COMPLETIONS)], mine)
        for i, tag, out, want in checks:
            src, _, b, n, _ = messages[tag]
            failures.check(f"seed {seed}: message {tag} on {b}", out, want)
            if status_of(got[i]) != (src, tag, n):
                failures.found.append(f"seed {seed}: message {tag} on {b}: status "
                                      f"{status_of(got[i])}")
    failures.done()


# -- communicators ----------------------------------------------------------------------------
@case
def derived_communicators_have_their_own_gloo_groups(comm):
    size, rank = comm.size, comm.rank
    comms = {"comm": comm, "dup": comm.Dup(), "split": comm.Split(rank % 2, rank)}
    group = comm.Get_group().Incl(list(range((size + 1) // 2)))
    first = comm.Create(group)                          # null on the other ranks
    group.Free()
    if first.to_mpi4py() != MPI.COMM_NULL:
        comms["create"] = first
    failures = Failures(comm)
    # the first Gloo call on each new communicator is non-blocking; requests
    # on all of them (both backends) outstanding at once, waited in reverse
    requests, checks = [], []
    for name, c in comms.items():
        members = c.allgather(rank)
        for k, b in enumerate(("gloo", "mpi")):
            seed = 10 * len(requests) + k
            out = torch.zeros(3 * c.size, dtype=torch.int64)
            requests.append(c.Iallgather(rank_data(rank, 3, torch.int64, seed), out,
                                         backend=b))
            checks.append((f"Iallgather on {name} ({b})", out,
                           torch.cat([rank_data(r, 3, torch.int64, seed) for r in members])))
    for req in reversed(requests):
        req.Wait()
    for label, out, want in checks:
        failures.check(label, out, want)
    for c in (comms["dup"], comms["split"], first):     # first: null (a no-op) on some ranks
        c.Free()
    failures.done()
    assert_comm_works(comm)


@case
def the_first_gloo_call_on_a_communicator_can_be_any_call(comm):
    # the Gloo group is made collectively at the first call that communicates,
    # whatever it is; every rank makes the same first call here
    size, rank = comm.size, comm.rank
    right, left = ring(comm)
    failures = Failures(comm)
    for first in ("Irecv", "Recv", "Ibarrier", "Iallgather", "Bcast"):
        dup = comm.Dup()
        out = torch.zeros(2 * size)
        if first in ("Irecv", "Recv") and size > 1:
            if first == "Irecv":
                req = dup.Irecv(out[:2], left, 1, backend="gloo")
                dup.Send(full(2, rank), right, 1, backend="gloo")
            else:
                req = dup.Isend(full(2, rank), right, 1, backend="gloo")
                dup.Recv(out[:2], left, 1, backend="gloo")
            req.Wait()
            failures.check(f"first call {first}", out[:2], full(2, left))
        elif first == "Ibarrier":
            dup.Ibarrier(backend="gloo").Wait()
        elif first == "Iallgather":
            dup.Iallgather(full(2, rank), out, backend="gloo").Wait()
            failures.check(f"first call {first}", out,
                           torch.arange(size).float().repeat_interleave(2))
        elif first == "Bcast":
            buf = full(2, rank)
            dup.Bcast(buf, root=size - 1, backend="gloo")
            failures.check(f"first call {first}", buf, full(2, size - 1))
        dup.Allreduce(mcr.IN_PLACE, out, backend="gloo")     # the group works on
        dup.Free()
    failures.done()


@case
def free_releases_gloo_groups_repeatedly(comm):
    right, left = ring(comm)
    for k in range(4):
        dup = comm.Dup()
        x = full(2, comm.rank + k)
        dup.Allreduce(mcr.IN_PLACE, x, backend="gloo")
        assert_equal(x, full(2, sum(range(comm.size)) + k * comm.size))
        if comm.size > 1:
            # an outstanding buffered send is delivered before its group goes
            out = torch.zeros(2)
            dup.Isend(full(2, comm.rank), right, k, backend="gloo")
            dup.Recv(out, left, k, backend="gloo")
            assert_equal(out, full(2, left))
        dup.Free()
        dup.Free()                                      # idempotent
    assert_comm_works(comm)


@case
def freed_and_null_communicators_refuse_every_backend(comm):
    dup = comm.Dup()
    dup.Barrier(backend="gloo")
    dup.Free()
    null = comm.Split(mcr.UNDEFINED if comm.rank == 0 else 0, 0)
    for c in (dup, null) if comm.rank == 0 else (dup,):
        for backend in (None, "mpi", "auto", "gloo", "nccl"):
            with raises(ValueError, "comm:", "null"):
                c.Allreduce(torch.ones(2), torch.zeros(2), backend=backend)
            with raises(ValueError, "comm:", "null"):
                c.Barrier(backend=backend)
    if comm.rank != 0:
        null.Free()
    assert_comm_works(comm)


@case
def messages_to_self_on_every_backend(comm):
    # MPI allows a process to message itself; so must every backend that
    # takes point-to-point calls (last case: a failure must not upset others)
    warm_up(comm)
    failures, me = Failures(comm), comm.rank
    for k, backend in enumerate(BACKENDS):
        out, back = torch.zeros(3), torch.zeros(3)
        try:
            req = comm.Irecv(out, me, 40 + k, backend=backend)
            comm.Send(rank_data(me, 3, seed=k), me, 40 + k, backend=backend)
            req.Wait()
            failures.check(f"Send to self on {backend}", out, rank_data(me, 3, seed=k))
            comm.Sendrecv(rank_data(me, 3, seed=k + 5), me, 50 + k, back, me, 50 + k,
                          backend=backend)
            failures.check(f"Sendrecv to self on {backend}", back, rank_data(me, 3, seed=k + 5))
        except Exception as exc:  # noqa: BLE001 - recorded; raised alike on every rank
            failures.error(f"message to self on {backend}", exc)
    failures.done()



# -- stream-ordered works ----------------------------------------------------------------------
class Queued:
    """A NCCL work as the host sees it while the device is busy: never finished, and its
    wait() returns at once (it only makes the caller's current stream wait)."""

    def __init__(self):
        self.waits = 0

    def is_completed(self):
        return False

    def wait(self):
        self.waits += 1
        return True


@case
def stream_ordered_works_are_waited_not_polled(comm):
    """Wait and Waitall wait a stream-ordered work at once (polled until the device finished,
    Queued would hang them); Test asks the device. Then Gloo's works marked stream-ordered, as
    NCCL's are, run the collectives of the group and composed ones right, in both forms, and a
    Fusion's buckets."""
    for how in ("Wait", "Waitall"):
        q, ran = Queued(), []
        req = _core._work_request("nccl", [StreamOrdered(q)], [lambda: ran.append(how)])
        assert not req.Test() and not mcr.Request.Testall([req]) and not ran
        if how == "Wait":
            req.Wait()
        else:
            mcr.Request.Waitall([comm.Ibarrier(), req])
        assert q.waits == 1 and ran == [how], (how, q.waits, ran)
    gloo, xs = mcr.backends.gloo.BACKEND, [torch.ones(3) for _ in range(3)]
    plain = [comm.Iallreduce(mcr.IN_PLACE, x, backend=b) for b, x in zip(BACKENDS, xs)]
    gloo.stream_ordered = True
    try:
        ordered = comm.Iallreduce(mcr.IN_PLACE, xs[2], backend="gloo")
        assert [_core._waits_at_once(r) for r in plain + [ordered]] == [False, False, True]
        mcr.Request.Waitall(plain + [ordered])
        assert all(torch.equal(x, full(3, comm.size)) for x in xs), xs
        for method in ("Bcast", "Allgatherv", "Allreduce", "Reduce", "Reduce_scatter",
                       "Alltoallv"):
            for form in ("blocking", "nonblocking"):
                run_operation(comm, method, "gloo", form, [torch.float32])
        with mcr.Fusion(comm, backend="gloo") as f:     # a posted bucket is waited at once
            ys = [torch.zeros(k + 1) for k in range(3)]
            reqs = [f.Iallreduce(full(k + 1, k + comm.rank), y) for k, y in enumerate(ys)]
            reqs[1].Wait()
            mcr.Request.Waitall(reqs)
        for k, y in enumerate(ys):
            assert_equal(y, full(k + 1, k * comm.size + comm.size * (comm.size - 1) // 2))
    finally:
        del gloo.stream_ordered


class BusyDevice:
    """A Gloo group whose receives look as NCCL's do while the device is busy: never finished,
    and wait() returns once the payload is there (NCCL's would only queue the stream). Its sends
    are polled through a thread, as Gloo's are."""

    def __init__(self, pg):
        self.pg, self.waits = pg, 0

    def __getattr__(self, name):
        return getattr(self.pg, name)

    def recv(self, tensors, source, tag):
        work, busy = self.pg.recv(tensors, source, tag), Queued()

        def wait():
            self.waits += 1
            return work.wait()
        busy.wait = wait
        return busy

    def send(self, tensors, dest, tag):
        return compose._Waited(self.pg.send(tensors, dest, tag))


@case
def stream_ordered_receives_are_waited_not_polled(comm):
    """A receive whose payload comes on a stream-ordered backend (NCCL's point-to-point) is
    complete once its payload's wait() returns: Recv, Sendrecv, Wait, Waitall, Waitany and
    Waitsome (polled until the device finished, BusyDevice would hang them). Test asks the
    device."""
    dup, gloo = comm.Dup(), mcr.backends.gloo.BACKEND
    right, left = ring(comm)
    n = gloo.eager_limit // 4 + 3            # past the eager limit: the payload goes on Gloo
    warm_up(dup)
    sub = mcr.backends.subcomm(dup, "gloo")
    sub._pg = busy = BusyDevice(sub.pg)
    gloo.stream_ordered, gloo.p2p_pollable = True, True
    try:
        outs = [torch.zeros(n) for _ in range(9)]     # outs[k]: the message of seed k
        dup.Sendrecv(rank_data(comm.rank, n, seed=1), right, 1, outs[1], left, 1, backend="gloo")
        req = dup.Irecv(outs[2], left, 2, backend="gloo")
        dup.Send(rank_data(comm.rank, n, seed=2), right, 2, backend="gloo")
        if comm.size > 1:       # (a message to itself is copied: no payload on the group)
            dup.Barrier()       # the header has arrived, and the payload with it
            assert not req.Test() and not mcr.Request.Testall([req]), "Test: the device is busy"
        req.Wait()
        reqs = [dup.Irecv(outs[k], left, k, backend="gloo") for k in (3, 4)]
        for k in (3, 4):
            dup.Send(rank_data(comm.rank, n, seed=k), right, k, backend="gloo")
        mcr.Request.Waitall(reqs)
        for first, complete in ((5, lambda: [mcr.Request.Waitany(reqs)]),
                                (7, lambda: mcr.Request.Waitsome(reqs))):
            reqs = [dup.Irecv(outs[k], left, k, backend="gloo") for k in (first, first + 1)]
            for k in (first, first + 1):
                dup.Send(rank_data(comm.rank, n, seed=k), right, k, backend="gloo")
            done = []
            while len(done) < 2:
                done += complete()
            assert sorted(done) == [0, 1], done
        for k in range(1, 9):
            assert_equal(outs[k], rank_data(left, n, seed=k))
        assert busy.waits == (8 if comm.size > 1 else 0), busy.waits
    finally:
        del gloo.stream_ordered, gloo.p2p_pollable
        sub._pg = busy.pg
    dup.Free()

test_mpi = mpi_cases(__name__, timeout=150)


# A freed receive goes on (MPI): freeing its communicator must not wait forever for it. Its
# own short job, as a hang here would otherwise cost the whole module's timeout. One write per
# rank: MPICH's mpiexec mixes unbuffered ranks' output.
FREED_RECEIVE = """
import torch, mcr
comm = mcr.COMM_WORLD
right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
dup = comm.Dup()
freed = torch.zeros(2)
dup.Irecv(freed, left, 5, backend="gloo").Free()
dup.Send(torch.full((2,), float(comm.rank)), right, 5, backend="gloo")
dup.Free()
assert freed.tolist() == [float(left)] * 2, freed
print(f"delivered on rank {comm.rank}", flush=True)
"""


@pytest.mark.parametrize("nprocs", world_sizes([2]))
def test_freeing_a_communicator_after_freeing_a_gloo_receive(nprocs):
    code, out = run_script(nprocs, ["-c", FREED_RECEIVE], timeout=40)
    assert code is not None, f"Comm.Free hung (killed after 40 s):\n{out[-3000:]}"
    assert code == 0, out[-3000:]
    for rank in range(nprocs):
        assert f"delivered on rank {rank}" in out, out[-3000:]
