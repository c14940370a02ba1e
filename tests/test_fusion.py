"""Tensor fusion (mcr.Fusion): small collectives packed into buckets.

Every case runs at 1-4 ranks on MPI and on Gloo, and checks results against
sums computed here with torch on every rank's data (integer sums exact, and
float sums too: the values are small integers). The groups a run made
(``Fusion.trace``) must be the same on every rank, which is what the
agreement rule promises even when the ranks' clocks and tests disagree.
"""

import os
import random
import re
import subprocess
import sys
import time

import torch

import mcr
from mcr import launch
from mpiharness import case, mpi_cases
from util import assert_comm_works, raises

BACKENDS = ("mpi", "gloo")


def data(rank, i, n, dtype):
    """Call `i`'s tensor on rank `rank`: small integers, exact in any dtype."""
    return ((torch.arange(n) * (i + 1) + 3 * rank + i) % 11).to(dtype)


def total(size, i, n, dtype, op=None):
    values = torch.stack([data(r, i, n, torch.float64) for r in range(size)])
    if op is mcr.MAX:
        result = values.max(0).values
    elif op is mcr.PROD:
        result = values.prod(0)
    else:
        result = values.sum(0)
    return result.to(dtype)


def same_everywhere(comm, value):
    values = comm.allgather(value)
    assert all(v == values[0] for v in values), values
    return values[0]


@case
def allreduce_sums_match_torch(comm):
    size, rank = comm.size, comm.rank
    for backend in BACKENDS:
        for dtype in (torch.int64, torch.float32):
            f = mcr.Fusion(comm, bucket_bytes=3 * 40 * 8, backend=backend, trace=True)
            shapes = [(40,), (5, 8), (40,), (1,), (0,), (3, 4, 2)] * 3
            xs = [data(rank, i, torch.Size(s).numel(), dtype).reshape(s)
                  for i, s in enumerate(shapes)]
            ys = [torch.empty(s, dtype=dtype) for s in shapes]
            reqs = []
            for i, (x, y) in enumerate(zip(xs, ys)):
                if i % 2:      # half in place
                    y.copy_(x)
                    reqs.append(f.Iallreduce(mcr.IN_PLACE, y))
                else:
                    reqs.append(f.Iallreduce(x, y, mcr.SUM))
            assert all(isinstance(r, mcr.Request) for r in reqs)
            assert mcr.Request.Waitall(reqs)
            assert not any(reqs), "every fused request completes (and becomes inactive)"
            for i, (s, y) in enumerate(zip(shapes, ys)):
                want = total(size, i, torch.Size(s).numel(), dtype).reshape(s)
                assert torch.equal(y, want), (backend, dtype, i, y, want)
            trace = same_everywhere(comm, f.trace)
            assert sum(k for _, _, k in trace) == len(shapes)
            assert len(trace) > 1, trace      # the buckets filled up
            f.close()
    assert_comm_works(comm)


@case
def kinds_go_to_separate_buckets(comm):
    size, rank = comm.size, comm.rank
    ops_dtypes = [(mcr.SUM, torch.float32), (mcr.MAX, torch.int32),
                  (mcr.PROD, torch.float64), (mcr.SUM, torch.int64), (mcr.SUM, torch.float32)]
    for backend in BACKENDS:
        with mcr.Fusion(comm, bucket_bytes=1 << 20, backend=backend, trace=True) as f:
            ys, reqs = [], []
            for i in range(10):
                op, dtype = ops_dtypes[i % len(ops_dtypes)]
                ys.append(torch.empty(6, dtype=dtype))
                reqs.append(f.Iallreduce(data(rank, i, 6, dtype) % 3 + 1, ys[-1], op))
            mcr.Request.Waitall(reqs)
            trace = same_everywhere(comm, f.trace)
            # one bucket per (op, dtype): the two float32 SUMs share theirs
            assert sorted(k for _, _, k in trace) == [2, 2, 2, 4], trace
        for i, y in enumerate(ys):
            op, dtype = ops_dtypes[i % len(ops_dtypes)]
            values = torch.stack([data(r, i, 6, dtype) % 3 + 1 for r in range(size)]).double()
            want = (values.max(0).values if op is mcr.MAX else
                    values.prod(0) if op is mcr.PROD else values.sum(0)).to(dtype)
            assert torch.equal(y, want), (i, y, want)


@case
def completion_calls_on_fused_requests(comm):
    size, rank = comm.size, comm.rank
    n = 16
    for backend in BACKENDS:
        f = mcr.Fusion(comm, bucket_bytes=1 << 20, backend=backend, trace=True)

        def post(k, first):
            ys = [torch.empty(n) for _ in range(k)]
            return ys, [f.Iallreduce(data(rank, first + i, n, torch.float32), y)
                        for i, y in enumerate(ys)]

        def check(ys, first):
            for i, y in enumerate(ys):
                assert torch.equal(y, total(size, first + i, n, torch.float32)), (first, i)

        ys, reqs = post(3, 0)                       # Wait, one at a time
        for r in reqs:
            assert r.Wait() is True
        check(ys, 0)
        ys, reqs = post(3, 3)                       # Test until complete
        while not reqs[1].Test():
            pass
        assert reqs[0].Wait() and reqs[2].Wait()
        check(ys, 3)
        ys, reqs = post(4, 6)                       # Waitany until all are done
        done = set()
        while len(done) < 4:
            i = mcr.Request.Waitany(reqs)
            assert i not in done and 0 <= i < 4, (i, done)
            done.add(i)
        assert mcr.Request.Waitany(reqs) == mcr.UNDEFINED
        check(ys, 6)
        ys, reqs = post(4, 10)                      # Testall, Testany, Waitsome
        while not mcr.Request.Testall(reqs[:2]):
            pass
        while mcr.Request.Testany(reqs[2:3])[1] is False:
            pass
        got = mcr.Request.Waitsome(reqs)
        assert got and set(got) <= {3}, got
        check(ys, 10)
        ys, reqs = post(2, 14)                      # mixed with an unfused request
        other = torch.empty(n)
        plain = comm.Iallreduce(data(rank, 99, n, torch.float32), other, backend=backend)
        # a Gloo request's Status has no source: only Waitall's result here
        assert mcr.Request.Waitall([reqs[0], plain, reqs[1]])
        check(ys, 14)
        assert torch.equal(other, total(size, 99, n, torch.float32))
        ys, reqs = post(2, 16)                      # freed, then flushed
        reqs[0].Free()
        reqs[1].Wait()
        check(ys[1:], 17)
        same_everywhere(comm, f.trace)
        f.close()
        check(ys, 16)


@case
def flush_points(comm):
    size, rank = comm.size, comm.rank
    n = 8                                     # float64: 64 bytes per call
    for backend in BACKENDS:
        f = mcr.Fusion(comm, bucket_bytes=3 * 64, backend=backend, trace=True)
        ys = [torch.empty(n, dtype=torch.float64) for _ in range(13)]

        def post(i):
            return f.Iallreduce(data(rank, i, n, torch.float64), ys[i])

        reqs = [post(i) for i in range(4)]         # full at 3: (0, 3); 3 open
        reqs[3].Wait()                             # waited: (3, 1)
        reqs += [post(i) for i in range(4, 6)]
        f.flush()                                  # flush(): (4, 2)
        reqs += [post(6)]
        # an unfused call in between: it flushes (6, 1) first, and the order of
        # collectives on comm stays the program's
        big = torch.full((100,), float(rank))
        f.Allreduce(mcr.IN_PLACE, big)
        reqs += [post(i) for i in range(7, 9)]
        large = torch.full((64,), float(rank), dtype=torch.float64)   # 512 bytes > B
        lreq = f.Iallreduce(mcr.IN_PLACE, large)   # unfused, after a flush: (7, 2)
        reqs += [post(i) for i in range(9, 11)]
        reqs[9].Test()                             # tested: (9, 2) posted
        reqs += [post(i) for i in range(11, 13)]
        assert f.Get_size() == size and f.rank == rank   # queries flush nothing
        mcr.Request.Waitall(reqs + [lreq])         # (11, 2)
        assert torch.equal(big, torch.full((100,), float(sum(range(size)))))
        assert torch.equal(large, torch.full((64,), float(sum(range(size))),
                                             dtype=torch.float64))
        for i, y in enumerate(ys):
            assert torch.equal(y, total(size, i, n, torch.float64)), (i, y)
        trace = same_everywhere(comm, f.trace)
        assert [(first, k) for _, first, k in trace] == [
            (0, 3), (3, 1), (4, 2), (6, 1), (7, 2), (9, 2), (11, 2)], trace
        f.close()


@case
def cycle_rule_holds_when_clocks_disagree(comm):
    """Rank 0 pauses longer than the cycle twice, the others elsewhere: only
    rank 0's clock counts, and every rank makes the groups rank 0 made."""
    size, rank = comm.size, comm.rank
    n = 4
    for backend in BACKENDS:
        f = mcr.Fusion(comm, bucket_bytes=1 << 20, cycle=0.2, backend=backend, trace=True)
        ys = [torch.empty(n, dtype=torch.int32) for _ in range(12)]
        reqs = []
        for i in range(12):
            reqs.append(f.Iallreduce(data(rank, i, n, torch.int32), ys[i]))
            if (rank == 0 and i in (3, 7)) or (rank != 0 and i in (1, 5, 9)):
                time.sleep(0.3)
        mcr.Request.Waitall(reqs)
        for i, y in enumerate(ys):
            assert torch.equal(y, total(size, i, n, torch.int32)), (i, y)
        trace = same_everywhere(comm, f.trace)
        # rank 0's clock fires at its calls 4 and 8 (after each pause), and
        # Waitall flushes the rest: (0, 5), (5, 4), (9, 3); a stall of rank 0
        # longer than the cycle elsewhere (a busy machine) may cut more
        firsts = [first for _, first, _ in trace]
        assert {0, 5, 9} <= set(firsts), trace
        f.close()


@case
def random_programs_agree(comm):
    """The same random program on every rank (kinds, sizes, Waitany, Testany,
    flush), with timing of its own per rank (pauses, a 2 ms cycle): every
    rank makes rank 0's groups, and every result is right."""
    size, rank = comm.size, comm.rank
    for backend in BACKENDS:
        program = random.Random(7)
        timing = random.Random(100 + rank)
        f = mcr.Fusion(comm, bucket_bytes=256, cycle=0.002, backend=backend, trace=True)
        pending, checks = [], []
        for i in range(60):
            kind = program.choice(["sum", "max", "bcast"])
            n = program.randint(1, 20)
            if kind == "bcast":
                root = program.randrange(size)
                y = data(rank, i, n, torch.float32) if rank == root else torch.zeros(n)
                pending.append(f.Ibcast(y, root))
                checks.append((y, data(root, i, n, torch.float32)))
            else:
                dtype = torch.int64 if kind == "sum" else torch.float32
                op = mcr.SUM if kind == "sum" else mcr.MAX
                y = torch.empty(n, dtype=dtype)
                pending.append(f.Iallreduce(data(rank, i, n, dtype), y, op))
                checks.append((y, total(size, i, n, dtype, op)))
            step = program.random()
            if step < 0.1:
                pending.pop(mcr.Request.Waitany(pending))
            elif step < 0.2:
                index, _ = mcr.Request.Testany(pending)
                if index != mcr.UNDEFINED:
                    pending.pop(index)
            elif step < 0.25:
                f.flush()
            if timing.random() < 0.2:
                time.sleep(timing.random() * 0.004)
        mcr.Request.Waitall(pending)
        for k, (y, want) in enumerate(checks):
            assert torch.equal(y, want), (backend, k, y, want)
        trace = same_everywhere(comm, f.trace)
        assert sum(k for _, _, k in trace) == 60
        f.close()


@case
def bcast_and_allgather_are_fused(comm):
    size, rank = comm.size, comm.rank
    for backend in BACKENDS:
        with mcr.Fusion(comm, bucket_bytes=1 << 16, backend=backend, trace=True) as f:
            roots = [0, size - 1, 0, size - 1, 0]
            bufs = [data(root, i, 5 + i, torch.float32) if rank == root
                    else torch.zeros(5 + i) for i, root in enumerate(roots)]
            breqs = [f.Ibcast(b, root) for b, root in zip(bufs, roots)]
            gathered = [torch.zeros(size, 3 + i, dtype=torch.int64) for i in range(4)]
            greqs = []
            for i, out in enumerate(gathered):
                if i % 2:
                    out[rank] = data(rank, i, 3 + i, torch.int64)
                    greqs.append(f.Iallgather(mcr.IN_PLACE, out))
                else:
                    greqs.append(f.Iallgather(data(rank, i, 3 + i, torch.int64), out))
            mcr.Request.Waitall(greqs + breqs)
            trace = same_everywhere(comm, f.trace)
        for i, (b, root) in enumerate(zip(bufs, roots)):
            assert torch.equal(b, data(root, i, 5 + i, torch.float32)), (i, root, b)
        for i, out in enumerate(gathered):
            want = torch.stack([data(r, i, 3 + i, torch.int64) for r in range(size)])
            assert torch.equal(out, want), (i, out, want)
        kinds = sorted((kind, k) for kind, _, k in trace)
        want = [("allgather", 4)] + ([("bcast", 5)] if size == 1 else
                                     [("bcast", 2), ("bcast", 3)])
        assert kinds == want, kinds


@case
def ineligible_calls_run_unfused(comm):
    size, rank = comm.size, comm.rank
    with mcr.Fusion(comm, trace=True) as f:
        x = torch.full((6,), rank + 1, dtype=torch.int32)
        y = torch.empty(6, dtype=torch.int32)
        f.Iallreduce(x, y, mcr.BOR).Wait()            # an op not fused
        assert torch.equal(y, torch.full((6,), _bor(size), dtype=torch.int32))
        strided = torch.zeros(12)[::2]                # not contiguous: the core says no
        with raises(BufferError, "recvbuf", "not contiguous"):
            f.Iallreduce(torch.ones(6), strided)
        with raises(ValueError, "recvbuf has 5"):     # the core's error, unchanged
            f.Iallreduce(torch.ones(6), torch.zeros(5))
        assert f.trace == []
    assert_comm_works(comm)
    # after the with block: forwarded unfused, not fused
    y = torch.empty(3)
    f.Iallreduce(torch.ones(3), y).Wait()
    assert torch.equal(y, torch.full((3,), float(size))) and f.trace == []


def _bor(size):
    result = 0
    for r in range(size):
        result |= r + 1
    return result


@case
def bad_arguments_name_themselves(comm):
    with raises(TypeError, "comm", "mcr.Comm", "int"):
        mcr.Fusion(3)
    with raises(ValueError, "bucket_bytes", "at least 1", "0"):
        mcr.Fusion(comm, bucket_bytes=0)
    with raises(TypeError, "bucket_bytes", "int", "float"):
        mcr.Fusion(comm, bucket_bytes=1.5)
    with raises(ValueError, "cycle", "positive", "-1"):
        mcr.Fusion(comm, cycle=-1)
    with raises(TypeError, "cycle", "str"):
        mcr.Fusion(comm, cycle="1")
    with raises(ValueError, "backend", "nope"):
        mcr.Fusion(comm, backend="nope")
    f = mcr.Fusion(comm)
    with raises(AttributeError, "No_such"):
        f.No_such_method()
    f.close()
    f.close()                                        # twice is harmless
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)


def test_benchmark_runs_tiny():
    """``python -m mcr.bench.fusion``, tiny, at 2 ranks: its table and verdict."""
    env = {k: v for k, v in os.environ.items() if k not in launch.LAUNCHER_VARS}
    cmd = [sys.executable, "-m", "mcr.bench.fusion", "-n", "2", "--count", "20",
           "--bytes", "64", "--rounds", "1", "--sweep", "256", "--bucket", "512"]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout
    assert "20 x 64 B float32 Iallreduce + Waitall, 2 ranks" in proc.stdout, proc.stdout
    for variant in ("unfused", "by hand", "fused B=256", "fused B=512"):
        assert re.search(rf"^{re.escape(variant)}\s+\d+\.\d+\s+\d+\.\d+$", proc.stdout,
                         re.M), (variant, proc.stdout)
    assert re.search(r"^target: fused \(B=512\) at least 5x faster than unfused: "
                     r"\d+\.\d+x, (met|NOT met)$", proc.stdout, re.M), proc.stdout


FIRST_CALLS = """
import torch, mcr
comm = mcr.COMM_WORLD
f = mcr.Fusion(comm, bucket_bytes=1 << 14, trace=True)
xs = [torch.full((256,), float(comm.rank + k)) for k in range(64)]
ys = [torch.zeros(256) for _ in range(64)]
reqs = [f.Iallreduce(x, y) for x, y in zip(xs, ys)]   # before mcr has read any tensor
mcr.Request.Waitall(reqs)
traces = comm.allgather(f.trace)
assert all(t == traces[0] for t in traces), traces
for k, y in enumerate(ys):
    assert torch.equal(y, torch.full((256,), float(sum(r + k for r in range(comm.size)))))
f.close()
print(f"groups {len(traces[0])}")    # one write: MPICH's mpiexec mixes unbuffered ranks' output
"""


def test_fused_calls_before_any_other_call():
    # the first calls of a program go through fusion before the core has read
    # a tensor (its fast path binds then): every rank must still group alike
    from mpiharness import run_script
    code, out = run_script(3, ["-c", FIRST_CALLS], timeout=120)
    assert code == 0, out
    assert out.count("groups 4") == 3, out        # 64 calls of 1 KiB, 16 KiB buckets
