"""Programs that mix the MPI and Gloo backends on one communicator.

- Progress: a rank that waits on Gloo work (in any of the ways mcr offers)
  keeps MPI moving, so that peers waiting on MPI finish (the deadlock the
  design rules out), for a large Iallreduce and a large (rendezvous) Isend;
  and the converse, a rank blocked in MPI while its peers wait on Gloo.
- One Request class: Waitall/Waitany/Waitsome/Testall/Testany/Testsome over
  any mix of MPI and Gloo requests (null ones and persistent ones on both
  backends too), each request reported exactly once, with statuses; a
  completion that was peeked at (Get_status) or seen by a Testall that
  returned False is still reported later, as MPI does.
- Randomized interleavings: with a seed shared by all ranks, collectives each
  on a random backend, posted in the same order everywhere and completed in a
  per-rank random order (Wait one by one, or Waitany/Waitsome/Testall/...
  loops); blocking calls on one backend while requests on the other are
  outstanding, interleaved differently on each rank; point-to-point messages
  on both backends with the same tags, which must not cross.
- Communicators: Dup/Split/Create have their own Gloo groups, made at their
  first Gloo call (even a non-blocking one); Free releases them, and freed or
  null communicators refuse every backend alike.

Expected values come from torch on every rank's data (util.rank_data), never
from mcr. Wrong results are recorded, not raised, so that every rank keeps
making the same calls; a case fails at its end with all of them.
"""

import random
import time

import pytest
import torch

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases, run_script, world_sizes
from util import Failures, assert_comm_works, assert_equal, raises, rank_data

BACKENDS = ("mpi", "gloo")
BIG = 1 << 20                   # float32 elements: 4 MiB, past every eager limit
SEEDS = range(8)
OPS_PER_SEED = 10


def ring(comm):
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def warm_up(comm):
    """Make comm's Gloo group now, while every rank is at the same point (it is
    made collectively over MPI at the first Gloo call)."""
    comm.Barrier(backend="gloo")


def other(backend):
    return "gloo" if backend == "mpi" else "mpi"


def backoff(polls):
    """Let the other ranks (4 processes share 2 cores) run while polling."""
    if polls > 1000:
        time.sleep(0.0002)


# -- completing a list of requests, in every way mcr offers ---------------------------------

COMPLETIONS = ("wait", "test", "waitall", "testall", "waitany", "testany", "waitsome",
               "testsome")


def complete(requests, how, rng):
    """Complete `requests` by `how` (one of COMPLETIONS); `rng` orders the
    one-by-one forms. Return {index: Status} of every request reported; each
    must be reported once."""
    n = len(requests)
    got = {}

    def report(i, status):
        assert i not in got, f"{how}: request {i} reported twice"
        got[i] = status

    if how in ("wait", "test"):
        order = list(range(n))
        rng.shuffle(order)
        for i in order:
            status, polls = mcr.Status(), 0
            if how == "wait":
                assert requests[i].Wait(status) is True
            else:
                while not requests[i].Test(status):
                    polls += 1
                    backoff(polls)
            report(i, status)
    elif how in ("waitall", "testall"):
        statuses, polls = [], 0
        if how == "waitall":
            assert mcr.Request.Waitall(requests, statuses) is True
        else:
            while not mcr.Request.Testall(requests, statuses):
                polls += 1
                backoff(polls)
        assert len(statuses) >= n
        for i in range(n):
            report(i, statuses[i])
    elif how in ("waitany", "testany"):
        polls = 0
        while True:
            status = mcr.Status()
            if how == "waitany":
                index, flag = mcr.Request.Waitany(requests, status), True
            else:
                index, flag = mcr.Request.Testany(requests, status)
            if flag and index == mcr.UNDEFINED:
                break
            if flag:
                report(index, status)
            else:
                polls += 1
                backoff(polls)
    elif how in ("waitsome", "testsome"):
        polls = 0
        while True:
            statuses = []
            fn = mcr.Request.Waitsome if how == "waitsome" else mcr.Request.Testsome
            indices = fn(requests, statuses)
            if indices is None:
                break
            if how == "waitsome":
                assert indices, "Waitsome returned no index"
            if not indices:
                polls += 1
                backoff(polls)
            for k, i in enumerate(indices):
                report(i, statuses[k])
    else:
        raise ValueError(how)
    return got


# -- progress ----------------------------------------------------------------------------------


def gloo_wait(comm, how, x):
    """Run a Gloo Allreduce of `x` in place, completed by `how`: "blocking",
    or one of COMPLETIONS on its request."""
    if how == "blocking":
        comm.Allreduce(mcr.IN_PLACE, x, backend="gloo")
    else:
        complete([comm.Iallreduce(mcr.IN_PLACE, x, backend="gloo")], how, random.Random(0))


@case
def waiting_on_gloo_drives_mpi_progress(comm):
    # rank 0 posts a large MPI Iallreduce, then waits on Gloo; the others
    # wait for that Iallreduce first, which needs rank 0's MPI to progress
    warm_up(comm)
    size = comm.size
    failures = Failures(comm)
    for k, how in enumerate(("blocking",) + COMPLETIONS):
        mine = torch.full((BIG,), float(comm.rank + k))
        out = torch.zeros(BIG)
        small = torch.full((3,), float(comm.rank + 1))
        req = comm.Iallreduce(mine, out)
        if comm.rank == 0:
            gloo_wait(comm, how, small)
            req.Wait()
        else:
            req.Wait()
            gloo_wait(comm, how, small)
        failures.check(f"MPI Iallreduce while rank 0 waits on gloo ({how})", out[:4],
                       torch.full((4,), float(sum(range(size)) + k * size)))
        failures.check(f"gloo Allreduce ({how})", small,
                       torch.full((3,), float(size * (size + 1) // 2)))
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
            sreq = comm.Isend(torch.full((BIG,), float(k)), 1, tag=k)
            gloo_wait(comm, how, small)
            sreq.Wait()
        elif comm.rank == 1:
            out = torch.zeros(BIG)
            comm.Recv(out, 0, tag=k)
            failures.check(f"4 MiB MPI message while rank 0 waits on gloo ({how})",
                           out[-3:], torch.full((3,), float(k)))
            gloo_wait(comm, how, small)
        else:
            gloo_wait(comm, how, small)
        failures.check(f"gloo Allreduce ({how})", small, torch.full((2,), float(comm.size)))
    failures.done()


@case
def blocking_on_mpi_while_peers_wait_on_gloo(comm):
    warm_up(comm)
    size = comm.size
    failures = Failures(comm)
    for k, how in enumerate(COMPLETIONS):
        big = torch.full((BIG,), float(comm.rank + k))
        small = torch.full((2,), float(comm.rank))
        greq = comm.Iallreduce(mcr.IN_PLACE, big, backend="gloo")
        if comm.rank == 0:
            comm.Allreduce(mcr.IN_PLACE, small)             # blocking MPI first
            complete([greq], how, random.Random(k))
        else:
            complete([greq], how, random.Random(k))
            comm.Allreduce(mcr.IN_PLACE, small)
        failures.check(f"gloo Iallreduce ({how}) while rank 0 blocks in MPI", big[:3],
                       torch.full((3,), float(sum(range(size)) + k * size)))
        failures.check("MPI Allreduce", small, torch.full((2,), float(sum(range(size)))))
    failures.done()


# -- one Request class --------------------------------------------------------------------------


def mixed_requests(comm, n, tag0):
    """Receives and collectives on both backends plus a null request, in an
    order that alternates backends; return (requests, checks) where checks[i]
    is None or (status expected of a receive, output, expected output)."""
    right, left = ring(comm)
    size = comm.size
    requests, checks, sends = [], [], []
    for k, backend in enumerate(BACKENDS * 2):
        tag = tag0 + k
        if size > 1:
            out = torch.zeros(n, dtype=torch.int64)
            requests.append(comm.Irecv(out, left, tag, backend=backend))
            checks.append(((left, tag, n), out, rank_data(left, n, torch.int64, tag)))
            sends.append(comm.Isend(rank_data(comm.rank, n, torch.int64, tag), right, tag,
                                    backend=backend))
        out = torch.zeros(n)
        requests.append(comm.Iallreduce(rank_data(comm.rank, n, seed=tag), out,
                                        backend=backend))
        checks.append((None, out, torch.stack([rank_data(r, n, seed=tag)
                                               for r in range(size)]).sum(0)))
        if k == 1:
            requests.append(mcr.Request())                   # a null request
            checks.append(None)
        # a numpy array: a buffer that is not a tensor, on either backend
        total = torch.zeros(n, dtype=torch.int32)
        requests.append(comm.Iallreduce(rank_data(comm.rank, n, torch.int32, tag).numpy(),
                                        total.numpy(), op=mcr.MAX, backend=backend))
        checks.append((None, total, torch.stack([rank_data(r, n, torch.int32, tag)
                                                 for r in range(size)]).amax(0)))
    return requests, checks, sends


@case
def request_sets_over_both_backends(comm):
    warm_up(comm)
    failures = Failures(comm)
    rng = random.Random(comm.rank)
    for k, how in enumerate(COMPLETIONS):
        requests, checks, sends = mixed_requests(comm, 3, 100 + 10 * k)
        got = complete(requests, how, rng)
        active = {i for i, c in enumerate(checks) if c is not None}
        if how in ("waitany", "testany", "waitsome", "testsome"):
            assert set(got) == active, (how, sorted(got), sorted(active))
        else:
            assert set(got) == set(range(len(requests))), (how, sorted(got))
        for i, c in enumerate(checks):
            if c is None:
                continue
            expected_status, out, expected = c
            failures.check(f"{how}: request {i}", out, expected)
            if expected_status is not None:
                st = got[i]
                found = (st.source, st.tag, st.Get_count())
                if found != expected_status:
                    failures.found.append(f"{how}: request {i} status {found}, expected "
                                          f"{expected_status}")
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
        out = torch.zeros(2)
        req = comm.Iallreduce(torch.ones(2), out, backend=backend)
        polls = 0
        while not req.Get_status():
            polls += 1
            backoff(polls)
        assert req, f"{backend}: Get_status completed the request"
        assert mcr.Request.Waitany([req]) == 0, backend
        assert not req
        assert mcr.Request.Waitany([req]) == mcr.UNDEFINED, backend
        assert_equal(out, torch.full((2,), float(comm.size)))


@case
def a_testall_that_fails_completes_nothing(comm):
    # MPI: when Testall returns False, no request is completed; each is
    # reported later by Waitany. Rank 0 polls while the others hold back the
    # second operation (they wait for it on a separate communicator).
    warm_up(comm)
    sync = comm.Dup()
    if comm.size == 1:
        sync.Free()
        return
    for backend in BACKENDS:
        first = torch.zeros(2)
        reqs = [comm.Iallreduce(torch.ones(2), first, backend=backend)]
        if comm.rank == 0:
            reqs.append(comm.Ibarrier(backend=backend))
            # poll until the first operation has surely finished inside mcr:
            # 0.2 s after its result is in place (or after 3 s at most)
            polls, filled, deadline = 0, None, time.monotonic() + 3.0
            while time.monotonic() < deadline:
                assert mcr.Request.Testall(reqs) is False, backend
                now = time.monotonic()
                if filled is None and torch.equal(first, torch.full((2,), float(comm.size))):
                    filled = now
                if filled is not None and now - filled > 0.2:
                    break
                polls += 1
                backoff(polls)
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
        assert_equal(first, torch.full((2,), float(comm.size)))
    sync.Free()


@case
def persistent_requests_on_both_backends(comm):
    warm_up(comm)
    right, left = ring(comm)
    size, n = comm.size, 3
    failures = Failures(comm)
    sendbufs = {b: torch.zeros(n, dtype=torch.int32) for b in BACKENDS}
    recvbufs = {b: torch.zeros(n, dtype=torch.int32) for b in BACKENDS}
    inputs = {b: torch.zeros(n) for b in BACKENDS}
    outputs = {b: torch.zeros(n * size) for b in BACKENDS}
    requests, labels = [], []
    for b in BACKENDS:
        if size > 1:
            requests += [comm.Recv_init(recvbufs[b], left, 7, backend=b),
                         comm.Send_init(sendbufs[b], right, 7, backend=b)]
            labels += [f"Recv_init on {b}", f"Send_init on {b}"]
        requests.append(comm.Allgather_init(inputs[b], outputs[b], backend=b))
        labels.append(f"Allgather_init on {b}")
    assert all(isinstance(r, mcr.Prequest) for r in requests)
    rng = random.Random(comm.rank)
    for it, how in enumerate(COMPLETIONS):
        for k, b in enumerate(BACKENDS):            # new contents, in place
            seed = 10 * it + k
            sendbufs[b].copy_(rank_data(comm.rank, n, torch.int32, seed))
            recvbufs[b].fill_(-1)
            inputs[b].copy_(rank_data(comm.rank, n, seed=seed))
            outputs[b].fill_(-1)
        mcr.Prequest.Startall(requests)
        got = complete(requests, how, rng)
        assert set(got) == set(range(len(requests))), (how, sorted(got))
        for k, b in enumerate(BACKENDS):
            seed = 10 * it + k
            if size > 1:
                failures.check(f"iteration {it} ({how}): Recv_init on {b}", recvbufs[b],
                               rank_data(left, n, torch.int32, seed))
                st = got[labels.index(f"Recv_init on {b}")]
                if (st.source, st.tag, st.Get_count()) != (left, 7, n):
                    failures.found.append(f"iteration {it} ({how}): status on {b} "
                                          f"{(st.source, st.tag, st.Get_count())}")
            failures.check(f"iteration {it} ({how}): Allgather_init on {b}", outputs[b],
                           torch.cat([rank_data(r, n, seed=seed) for r in range(size)]))
    for r in requests:
        r.Free()
    failures.done()


# -- randomized interleavings ------------------------------------------------------------
#
# OPS[name](comm, rng) draws an operation from `rng` (the same draws on every
# rank) and returns (method, args, kwargs, outputs, expected) for its
# blocking form; the non-blocking form is "I" + method.

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16,
          torch.bfloat16]


def draw(rng):
    """(n, dtype, seed) for one operation."""
    return rng.randint(1, 5), rng.choice(DTYPES), rng.randrange(1000)


def op_allreduce(comm, rng):
    n, dtype, seed = draw(rng)
    op = rng.choice(["SUM", "MAX", "MIN"])
    xs = [rank_data(r, n, dtype, seed) for r in range(comm.size)]
    stacked = torch.stack(xs)
    want = {"SUM": stacked.sum(0), "MAX": stacked.amax(0), "MIN": stacked.amin(0)}[op]
    out = torch.zeros(n, dtype=dtype)
    return "Allreduce", (xs[comm.rank], out), {"op": getattr(mcr, op)}, [out], [want.to(dtype)]


def op_allreduce_in_place(comm, rng):
    n, dtype, seed = draw(rng)
    buf = rank_data(comm.rank, n, dtype, seed)
    want = torch.stack([rank_data(r, n, dtype, seed) for r in range(comm.size)]).sum(0)
    return "Allreduce", (mcr.IN_PLACE, buf), {}, [buf], [want.to(dtype)]


def op_bcast(comm, rng):
    n, dtype, seed = draw(rng)
    root = rng.randrange(comm.size)
    buf = rank_data(root, n, dtype, seed) if comm.rank == root else torch.zeros(n, dtype=dtype)
    return "Bcast", (buf,), {"root": root}, [buf], [rank_data(root, n, dtype, seed)]


def op_reduce(comm, rng):
    n, dtype, seed = draw(rng)
    root = rng.randrange(comm.size)
    out = torch.zeros(n, dtype=dtype) if comm.rank == root else None
    want = torch.stack([rank_data(r, n, dtype, seed) for r in range(comm.size)]).amax(0)
    return ("Reduce", (rank_data(comm.rank, n, dtype, seed), out),
            {"op": mcr.MAX, "root": root}, [out] if out is not None else [],
            [want] if out is not None else [])


def op_allgather(comm, rng):
    n, dtype, seed = draw(rng)
    out = torch.zeros(n * comm.size, dtype=dtype)
    want = torch.cat([rank_data(r, n, dtype, seed) for r in range(comm.size)])
    return "Allgather", (rank_data(comm.rank, n, dtype, seed), out), {}, [out], [want]


def op_allgatherv(comm, rng):
    _, dtype, seed = draw(rng)
    counts = [rng.randint(0, 3) for _ in range(comm.size)]
    out = torch.zeros(sum(counts), dtype=dtype)
    want = torch.cat([rank_data(r, counts[r], dtype, seed) for r in range(comm.size)])
    return ("Allgatherv", (rank_data(comm.rank, counts[comm.rank], dtype, seed),
                           [out, counts]), {}, [out], [want])


def op_gatherv(comm, rng):
    _, dtype, seed = draw(rng)
    root = rng.randrange(comm.size)
    counts = [rng.randint(0, 3) for _ in range(comm.size)]
    here = comm.rank == root
    out = torch.zeros(sum(counts), dtype=dtype) if here else None
    want = torch.cat([rank_data(r, counts[r], dtype, seed) for r in range(comm.size)])
    return ("Gatherv", (rank_data(comm.rank, counts[comm.rank], dtype, seed),
                        [out, counts] if here else None), {"root": root},
            [out] if here else [], [want] if here else [])


def op_scatter(comm, rng):
    n, dtype, seed = draw(rng)
    root = rng.randrange(comm.size)
    whole = rank_data(root, n * comm.size, dtype, seed)
    out = torch.zeros(n, dtype=dtype)
    return ("Scatter", (whole if comm.rank == root else None, out), {"root": root}, [out],
            [whole[comm.rank * n:(comm.rank + 1) * n]])


def op_alltoall(comm, rng):
    n, dtype, seed = draw(rng)
    size, rank = comm.size, comm.rank
    out = torch.zeros(n * size, dtype=dtype)
    want = torch.cat([rank_data(r, n * size, dtype, seed)[rank * n:(rank + 1) * n]
                      for r in range(size)])
    return "Alltoall", (rank_data(rank, n * size, dtype, seed), out), {}, [out], [want]


def op_reduce_scatter_block(comm, rng):
    n, dtype, seed = draw(rng)
    size, rank = comm.size, comm.rank
    total = torch.stack([rank_data(r, n * size, dtype, seed) for r in range(size)]).sum(0)
    out = torch.zeros(n, dtype=dtype)
    return ("Reduce_scatter_block", (rank_data(rank, n * size, dtype, seed), out), {}, [out],
            [total[rank * n:(rank + 1) * n].to(dtype)])


def op_scan(comm, rng):
    n, dtype, seed = draw(rng)
    out = torch.zeros(n, dtype=dtype)
    want = torch.stack([rank_data(r, n, dtype, seed) for r in range(comm.rank + 1)]).sum(0)
    return "Scan", (rank_data(comm.rank, n, dtype, seed), out), {}, [out], [want.to(dtype)]


def op_barrier(comm, rng):
    return "Barrier", (), {}, [], []


OPS = [op_allreduce, op_allreduce_in_place, op_bcast, op_reduce, op_allgather,
       op_allgatherv, op_gatherv, op_scatter, op_alltoall, op_reduce_scatter_block, op_scan,
       op_barrier]


def nonblocking(method):
    return "I" + method[0].lower() + method[1:]


def draw_ops(comm, rng, count, backends=BACKENDS):
    """`count` operations, each on a backend drawn from `backends`."""
    return [(rng.choice(OPS)(comm, rng), rng.choice(backends)) for _ in range(count)]


def post(comm, op, backend, failures, label):
    """Post `op` non-blocking on `backend`; its Request, or None if posting failed."""
    method, args, kwargs, _, _ = op
    try:
        return getattr(comm, nonblocking(method))(*args, backend=backend, **kwargs)
    except Exception as exc:  # noqa: BLE001 - recorded; raised alike on every rank
        failures.error(f"{label}: posting {nonblocking(method)} on {backend}", exc)
        return None


def check_ops(ops, failures, label):
    for k, ((method, _, _, outputs, expected), backend) in enumerate(ops):
        for got, want in zip(outputs, expected):
            failures.check(f"{label}: op {k} {method} on {backend}", got, want)


@case
def random_collectives_completed_in_random_orders(comm):
    warm_up(comm)
    failures = Failures(comm)
    for seed in SEEDS:
        shared = random.Random(seed)                      # the same draws on every rank
        ops = draw_ops(comm, shared, OPS_PER_SEED)
        how = COMPLETIONS[seed % len(COMPLETIONS)]
        label = f"seed {seed} ({how})"
        requests = [post(comm, op, b, failures, label) for op, b in ops]
        posted = [r for r in requests if r is not None]
        got = complete(posted, how, random.Random(1000 * seed + comm.rank))
        assert len(got) == len(posted), (label, len(got), len(posted))
        check_ops([o for o, r in zip(ops, requests) if r is not None], failures, label)
    failures.done()


@case
def blocking_calls_while_the_other_backend_has_requests_outstanding(comm):
    warm_up(comm)
    failures = Failures(comm)
    for seed in SEEDS:
        for outstanding in BACKENDS:
            blocking = other(outstanding)
            shared = random.Random(seed)
            posted_ops = draw_ops(comm, shared, OPS_PER_SEED // 2, (outstanding,))
            blocking_ops = draw_ops(comm, shared, OPS_PER_SEED // 2, (blocking,))
            label = f"seed {seed}, {outstanding} outstanding, {blocking} blocking"
            # each backend's operations in the same order on every rank; how
            # the two sequences interleave differs from rank to rank
            mine = random.Random(1000 * seed + comm.rank)
            steps = ["post"] * len(posted_ops) + ["block"] * len(blocking_ops)
            mine.shuffle(steps)
            pending, to_post, to_block = [], iter(posted_ops), iter(blocking_ops)
            for step in steps:
                if step == "post":
                    op, b = next(to_post)
                    pending.append(post(comm, op, b, failures, label))
                else:
                    (method, args, kwargs, _, _), b = next(to_block)
                    try:
                        getattr(comm, method)(*args, backend=b, **kwargs)
                    except Exception as exc:  # noqa: BLE001 - recorded, alike on every rank
                        failures.error(f"{label}: blocking {method} on {b}", exc)
            live = [r for r in pending if r is not None]
            complete(live, COMPLETIONS[(seed + comm.rank) % len(COMPLETIONS)], mine)
            check_ops([o for o, r in zip(posted_ops, pending) if r is not None], failures,
                      label)
            check_ops(blocking_ops, failures, label)
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
            assert (st.source, st.tag, st.Get_count()) == (left, tag, 4)
    failures.done()


@case
def random_messages_on_both_backends(comm):
    warm_up(comm)
    size = comm.size
    if size == 1:
        return
    failures = Failures(comm)
    for seed in SEEDS:
        shared = random.Random(seed)
        # (source, dest, backend, n, dtype): unique tags, so any posting order matches
        messages = []
        for _ in range(3 * size):
            src = shared.randrange(size)
            dst = (src + shared.randrange(1, size)) % size
            messages.append((src, dst, shared.choice(BACKENDS), shared.randint(0, 6),
                             shared.choice(DTYPES)))
        mine = random.Random(1000 * seed + comm.rank)
        order = list(range(len(messages)))
        mine.shuffle(order)
        requests, checks = [], []
        for tag in order:                         # receives and sends, rank-shuffled
            src, dst, b, n, dtype = messages[tag]
            if dst == comm.rank:
                out = torch.zeros(n, dtype=dtype)
                requests.append(comm.Irecv(out, src, tag, backend=b))
                checks.append((tag, out, rank_data(src, n, dtype, seed * 100 + tag)))
            if src == comm.rank:
                requests.append(comm.Isend(rank_data(src, n, dtype, seed * 100 + tag), dst,
                                           tag, backend=b))
                checks.append(None)
        got = complete(requests, COMPLETIONS[(seed + comm.rank) % len(COMPLETIONS)], mine)
        for i, c in enumerate(checks):
            if c is None:
                continue
            tag, out, want = c
            src, _, b, n, _ = messages[tag]
            failures.check(f"seed {seed}: message {tag} on {b}", out, want)
            st = got[i]
            if (st.source, st.tag, st.Get_count()) != (src, tag, n):
                failures.found.append(f"seed {seed}: message {tag} on {b}: status "
                                      f"{(st.source, st.tag, st.Get_count())}")
    failures.done()


# -- communicators ----------------------------------------------------------------------------


@case
def derived_communicators_have_their_own_gloo_groups(comm):
    size, rank = comm.size, comm.rank
    dup = comm.Dup()
    half = comm.Split(rank % 2, rank)
    group = comm.Get_group().Incl(list(range((size + 1) // 2)))
    first = comm.Create(group)                          # null on the other ranks
    group.Free()
    comms = {"comm": comm, "dup": dup, "split": half}
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
    for name in ("dup", "split", "create"):
        if name in comms:
            comms[name].Free()
    if "create" not in comms:
        first.Free()                                    # a null communicator: no-op
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
                dup.Send(torch.full((2,), float(rank)), right, 1, backend="gloo")
                req.Wait()
            else:
                req = dup.Isend(torch.full((2,), float(rank)), right, 1, backend="gloo")
                dup.Recv(out[:2], left, 1, backend="gloo")
                req.Wait()
            failures.check(f"first call {first}", out[:2], torch.full((2,), float(left)))
        elif first == "Ibarrier":
            dup.Ibarrier(backend="gloo").Wait()
        elif first == "Iallgather":
            dup.Iallgather(torch.full((2,), float(rank)), out, backend="gloo").Wait()
            failures.check(f"first call {first}", out,
                           torch.arange(size).float().repeat_interleave(2))
        elif first == "Bcast":
            buf = torch.full((2,), float(rank))
            dup.Bcast(buf, root=size - 1, backend="gloo")
            failures.check(f"first call {first}", buf, torch.full((2,), float(size - 1)))
        dup.Allreduce(mcr.IN_PLACE, out, backend="gloo")     # the group works on
        dup.Free()
    failures.done()


@case
def free_releases_gloo_groups_repeatedly(comm):
    right, left = ring(comm)
    for k in range(4):
        dup = comm.Dup()
        x = torch.full((2,), float(comm.rank + k))
        dup.Allreduce(mcr.IN_PLACE, x, backend="gloo")
        assert_equal(x, torch.full((2,), float(sum(range(comm.size)) + k * comm.size)))
        if comm.size > 1:
            # an outstanding buffered send is delivered before its group goes
            out = torch.zeros(2)
            dup.Isend(torch.full((2,), float(comm.rank)), right, k, backend="gloo")
            dup.Recv(out, left, k, backend="gloo")
            assert_equal(out, torch.full((2,), float(left)))
        dup.Free()
        dup.Free()                                      # idempotent
    assert_comm_works(comm)


@case
def freed_and_null_communicators_refuse_every_backend(comm):
    dup = comm.Dup()
    dup.Barrier(backend="gloo")
    dup.Free()
    null = comm.Split(mcr.UNDEFINED if comm.rank == 0 else 0, 0)
    targets = {"freed": dup}
    if comm.rank == 0:
        targets["null"] = null
    for what, c in targets.items():
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
    failures = Failures(comm)
    for k, backend in enumerate(BACKENDS):
        out = torch.zeros(3)
        try:
            req = comm.Irecv(out, comm.rank, 40 + k, backend=backend)
            comm.Send(rank_data(comm.rank, 3, seed=k), comm.rank, 40 + k, backend=backend)
            req.Wait()
            failures.check(f"Send to self on {backend}", out, rank_data(comm.rank, 3, seed=k))
            back = torch.zeros(3)
            comm.Sendrecv(rank_data(comm.rank, 3, seed=k + 5), comm.rank, 50 + k, back,
                          comm.rank, 50 + k, backend=backend)
            failures.check(f"Sendrecv to self on {backend}", back,
                           rank_data(comm.rank, 3, seed=k + 5))
        except Exception as exc:  # noqa: BLE001 - recorded; raised alike on every rank
            failures.error(f"message to self on {backend}", exc)
    failures.done()


test_mpi = mpi_cases(__name__, timeout=150)


# A freed receive goes on (MPI): freeing its communicator must not wait
# forever for it. Its own short job, as a hang here would otherwise cost the
# whole module's timeout.
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
print(f"delivered on rank {comm.rank}", flush=True)   # one write: MPICH's mpiexec mixes unbuffered ranks' output
"""


@pytest.mark.parametrize("nprocs", world_sizes([2]))
def test_freeing_a_communicator_after_freeing_a_gloo_receive(nprocs):
    code, out = run_script(nprocs, ["-c", FREED_RECEIVE], timeout=40)
    assert code is not None, f"Comm.Free hung (killed after 40 s):\n{out[-3000:]}"
    assert code == 0, out[-3000:]
    for rank in range(nprocs):
        assert f"delivered on rank {rank}" in out, out[-3000:]
