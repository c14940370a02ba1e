"""mcr demo: mpi4py-style collectives on torch tensors, checked against torch.

    python demo/demo.py                  # starts itself on 4 processes
    mpiexec -n 3 python demo/demo.py     # or on as many as you like

Started without mpiexec, the demo runs itself again under ``mpiexec -n 4``,
found and started by :mod:`mcr.launch` (``MCR_MPIEXEC`` overrides its
choice), with what Open MPI needs to run as root and on fewer cores than
processes. This first process does not initialize MPI.

Each step is a call a data-parallel or HPC program makes, written as with
mpi4py (``from mcr import MPI``) but on torch tensors. Every process can
compute every process's input, so each one also computes with plain torch, on
the whole data, what the call must produce, and compares. Rank 0 prints a
summary; the exit status is 0 when every check passed on every process.
"""

import argparse
import os
import sys
import traceback

from mcr import launch


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--nprocs", type=int, default=4,
                        help="processes to start when run without mpiexec (default 4)")
    parser.add_argument("--timeout", type=float,
                        default=float(os.environ.get("MCR_DEMO_TIMEOUT", "300")),
                        help="seconds before the started job is killed (default 300)")
    return parser.parse_args()


# -- starting itself under mpiexec --------------------------------------------

def under_launcher():
    return launch.launched() or "MCR_DEMO_NPROCS" in os.environ


def relaunch(nprocs, timeout):
    """Run this script on `nprocs` processes; return its exit status."""
    try:
        mpiexec = launch.find_mpiexec()
    except launch.MpiexecNotFoundError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    argv = [sys.executable, os.path.abspath(__file__)]
    print(f"demo: starting {' '.join(launch.command(nprocs, mpiexec) + argv)}", flush=True)
    env = dict(os.environ, MCR_DEMO_NPROCS=str(nprocs))
    result = launch.run(nprocs, argv, timeout=timeout, env=env, mpiexec=mpiexec)
    if result.timed_out:
        print(f"demo: the job did not finish in {timeout:.0f} s; killed it", file=sys.stderr)
        return 124
    return result.returncode


# -- the demo proper ------------------------------------------------------------

def main_mpi():
    import torch

    import mcr
    from mcr import MPI               # drop-in for `from mpi4py import MPI`

    comm = MPI.COMM_WORLD
    expected_size = os.environ.get("MCR_DEMO_NPROCS")
    if expected_size and comm.size != int(expected_size):
        print(f"demo: mpiexec started {expected_size} processes, but each sees a "
              f"COMM_WORLD of size {comm.size}: that mpiexec belongs to another MPI than "
              f"the one mcr uses ({mcr.build_info()['libmpi']}); set MCR_MPIEXEC to "
              "the right one", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    records = []
    try:
        for step in STEPS:
            records += step(comm, MPI, torch)
    except BaseException:
        # One process failing inside a collective would leave the others waiting.
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
    report(comm, mcr, records)
    failed = comm.allreduce(sum(not rec.ok for rec in records))   # mpi4py's, pickled
    return 1 if failed else 0


class Record:
    """What one process saw of one call: for the summary that rank 0 prints."""

    def __init__(self, title, shown, ok=True, error=None):
        self.title = title            # the call, as rank 0 describes it
        self.shown = shown            # this process's result (None: nothing to show)
        self.ok = ok
        self.error = error


def report(comm, mcr, records):
    """Rank 0 prints each call, the results, and what went wrong anywhere."""
    everyone = comm.gather(records, root=0)                        # mpi4py's, pickled
    if comm.rank != 0:
        return
    # "Open MPI v5.0.11, package: ..." or "MPICH Version:      5.0.2\nMPICH Release ..."
    version = " ".join(mcr.build_info()["mpi_library_version"].splitlines()[0]
                       .split(",")[0].split())
    procs = f"{comm.size} process{'es' if comm.size > 1 else ''}"
    print(f"\nmcr {mcr.__version__} demo on {procs} ({version})")
    for i, rec in enumerate(records):
        if rec.title.startswith("#"):
            print(f"\n{rec.title[1:].strip()}")
            continue
        per_rank = [everyone[r][i] for r in range(comm.size)]
        bad = [r for r, x in enumerate(per_rank) if not x.ok]
        print(f"  [{'FAILED' if bad else 'ok'}] {rec.title}")
        shown = [(r, x.shown) for r, x in enumerate(per_rank) if x.shown is not None]
        if comm.size > 1 and len(shown) == comm.size and len({s for _, s in shown}) == 1:
            print(f"         every rank: {shown[0][1]}")
        else:
            for r, text in shown:
                print(f"         rank {r}: {text}")
        for r in bad:
            print(f"         rank {r} FAILED: {per_rank[r].error}")
    nbad = sum(not rec.ok for per_rank in everyone for rec in per_rank)
    if nbad:
        print(f"\n{nbad} check(s) FAILED.")
    else:
        nchecks = sum(not rec.title.startswith("#") for rec in records)
        print(f"\nAll {nchecks} checks passed on {procs}: every result equals what torch "
              "computes from the whole data.")
    sys.stdout.flush()


def checked(title, actual, expected, shown=None):
    """A Record comparing `actual` with `expected` exactly (values and dtype)."""
    if actual is None:
        return Record(title, None)
    shown = short(actual) if shown is None else shown
    if actual.dtype == expected.dtype and actual.shape == expected.shape and \
            bool((actual == expected).all()):
        return Record(title, shown)
    return Record(title, shown, False, f"got {actual.tolist()} ({actual.dtype}), expected "
                  f"{expected.tolist()} ({expected.dtype})")


def short(t, n=10):
    values = t.tolist()
    text = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values[:n])
    return f"[{text}{', ...' if len(values) > n else ''}]"


# Each step runs on every process and returns its Records. Inputs are functions
# of the rank, so every process can compute every input and the expected result.

def gatherv_count(r):
    return (3 * r + 2) % 5                            # 2, 0, 3, 1, 4, 2, ...


def alltoallv_count(src, dst):
    return (src + 2 * dst) % 3                        # 0, 1 or 2 elements


def alltoallv_block(src, dst, torch):
    return 100 * src + 10 * dst + torch.arange(alltoallv_count(src, dst))


def step_nonblocking(comm, MPI, torch):
    """Igatherv, Ialltoallv and Iallreduce outstanding at once, then Waitall."""
    rank, size = comm.rank, comm.size

    # Igatherv at root 0: uneven counts (zeros too), a free slot after each block
    counts = [gatherv_count(r) for r in range(size)]
    displs = [sum(counts[:r]) + r for r in range(size)]
    mine = torch.arange(counts[rank], dtype=torch.float32) + 10 * rank
    gathered = torch.full((sum(counts) + size,), -1.0) if rank == 0 else None
    reqs = [comm.Igatherv(mine, [gathered, counts, displs] if rank == 0 else None, root=0)]

    # Alltoallv: each process knows what it sends; an Alltoall of the counts (1-D
    # int32 tensors) tells it what it receives
    scounts = torch.tensor([alltoallv_count(rank, j) for j in range(size)], dtype=torch.int32)
    rcounts = torch.empty(size, dtype=torch.int32)
    comm.Alltoall(scounts, rcounts)
    sdispls = torch.cumsum(scounts, 0) - scounts
    rdispls = torch.cumsum(rcounts, 0) - rcounts
    send = torch.cat([alltoallv_block(rank, j, torch) for j in range(size)])
    recv = torch.empty(int(rcounts.sum()), dtype=torch.int64)
    reqs.append(comm.Ialltoallv([send, scounts, sdispls], [recv, rcounts, rdispls]))

    # Iallreduce of a float32 vector (multiples of 1/2: exact in any order)
    vec = torch.arange(5, dtype=torch.float32) * 0.5 * (rank + 1)
    total = torch.empty(5)
    reqs.append(comm.Iallreduce(vec, total, op=MPI.SUM))

    MPI.Request.Waitall(reqs)

    expected_gather = torch.full((sum(counts) + size,), -1.0)
    for r in range(size):
        expected_gather[displs[r]:displs[r] + counts[r]] = torch.arange(counts[r]) + 10 * r
    expected_rcounts = torch.tensor([alltoallv_count(i, rank) for i in range(size)],
                                    dtype=torch.int32)
    expected_recv = torch.cat([alltoallv_block(i, rank, torch) for i in range(size)])
    expected_total = torch.stack([torch.arange(5, dtype=torch.float32) * 0.5 * (r + 1)
                                  for r in range(size)]).sum(0)
    return [
        Record("# Igatherv, Ialltoallv and Iallreduce outstanding at once, completed "
               "by one Request.Waitall:", None),
        checked(f"Igatherv float32 to root 0, counts {counts} at displs {displs} (rank r "
                "sends 10r, 10r+1, ...; -1: gaps)",
                gathered, expected_gather),
        checked("Alltoall of the int32 send counts gives the receive counts", rcounts,
                expected_rcounts),
        checked("Ialltoallv int64 with those counts, value 100*src + 10*dst + k",
                recv, expected_recv),
        checked("Iallreduce float32 SUM of [0, 0.5, 1, 1.5, 2] * (rank + 1)",
                total, expected_total),
    ]


def step_blocking(comm, MPI, torch):
    rank, size = comm.rank, comm.size
    records = [Record("# Blocking collectives:", None)]

    # Allreduce IN_PLACE of a bfloat16 "gradient"; torch adds the same values in
    # bfloat16 one process after another
    grad = (0.25 * (torch.arange(8) + rank)).to(torch.bfloat16)
    comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
    expected = (0.25 * torch.arange(8)).to(torch.bfloat16)
    for r in range(1, size):
        expected = expected + (0.25 * (torch.arange(8) + r)).to(torch.bfloat16)
    records.append(checked("Allreduce(IN_PLACE) bfloat16 SUM of 0.25 * (arange(8) + rank)",
                           grad, expected))

    # Allreduce MAX of float16 values that differ on every process
    def noise(r):
        return torch.randn(6, generator=torch.Generator().manual_seed(r)).to(torch.float16)

    out = torch.empty(6, dtype=torch.float16)
    comm.Allreduce(noise(rank), out, op=MPI.MAX)
    expected = torch.stack([noise(r) for r in range(size)]).amax(0)
    records.append(checked("Allreduce float16 MAX of random values", out, expected))

    # Scatterv from the last process: process r gets r + 1 elements
    root = size - 1
    counts = [r + 1 for r in range(size)]
    whole = torch.arange(sum(counts), dtype=torch.float64) / 2
    out = torch.empty(counts[rank], dtype=torch.float64)
    comm.Scatterv([whole, counts] if rank == root else None, out, root=root)
    start = sum(counts[:rank])
    records.append(checked(f"Scatterv float64 of arange({sum(counts)}) / 2 from root "
                           f"{root}, counts {counts}", out,
                           whole[start:start + counts[rank]]))

    # Reduce_scatter with uneven blocks: sum everything, keep one's own block
    recvcounts = [1 + r % 2 for r in range(size)]
    n = sum(recvcounts)
    out = torch.empty(recvcounts[rank], dtype=torch.int32)
    comm.Reduce_scatter(torch.arange(n, dtype=torch.int32) * (rank + 1), out, recvcounts,
                        op=MPI.SUM)
    total = torch.stack([torch.arange(n, dtype=torch.int32) * (r + 1)
                         for r in range(size)]).sum(0, dtype=torch.int32)
    start = sum(recvcounts[:rank])
    records.append(checked(f"Reduce_scatter int32 SUM of arange({n}) * (rank + 1), "
                           f"recvcounts {recvcounts}", out,
                           total[start:start + recvcounts[rank]]))
    return records


def step_mixing(comm, MPI, torch):
    """MPI and Gloo in one step: an Ialltoall on MPI stays outstanding while a
    blocking Allreduce runs on Gloo, and rank 0 waits on Gloo first while the
    others wait on MPI first; one Request.Waitall completes requests of both."""
    rank, size = comm.rank, comm.size
    tokens = torch.arange(2 * size, dtype=torch.float32) + 100 * rank
    routed = torch.empty(2 * size)
    moe = comm.Ialltoall(tokens, routed, backend="mpi")
    grad = torch.full((4,), float(rank + 1))
    if rank == 0:
        comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM, backend="gloo")
        moe.Wait()
    else:
        moe.Wait()
        comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM, backend="gloo")
    counts = [r + 1 for r in range(size)]
    gathered = torch.empty(sum(counts))
    both = [comm.Iallgatherv(torch.full((rank + 1,), float(rank)), [gathered, counts],
                             backend="gloo"),
            comm.Iallreduce(MPI.IN_PLACE, grad, op=MPI.MAX, backend="mpi")]
    MPI.Request.Waitall(both)
    expected_routed = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32)
                                 + 100 * src for src in range(size)])
    return [
        Record("# Mixing backends: MPI and Gloo requests outstanding together, waited "
               "in rank-dependent orders:", None),
        checked("Ialltoall on MPI (tokens 100*rank + k) while Allreduce runs on Gloo",
                routed, expected_routed),
        checked("Allreduce SUM on Gloo of rank + 1", grad,
                torch.full((4,), float(size * (size + 1) // 2))),
        checked(f"Iallgatherv on Gloo, counts {counts}, one Waitall with an MPI request",
                gathered, torch.cat([torch.full((r + 1,), float(r)) for r in range(size)])),
    ]


def step_bad_input(comm, MPI, torch):
    """A wrong call raises before any communication; the communicator still works."""
    records = [Record("# Bad input raises before any communication:", None)]
    try:
        comm.Allreduce(torch.zeros(3), torch.zeros(4), op=MPI.SUM)
    except ValueError as exc:
        records.append(Record("Allreduce(3 elements, 4 elements) raised ValueError",
                              repr(str(exc))))
    else:
        records.append(Record("Allreduce(3 elements, 4 elements)", "no error", False,
                              "did not raise ValueError"))
    x = torch.ones(2)
    comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    records.append(checked("the next Allreduce (SUM of ones) works", x,
                           torch.full((2,), float(comm.size))))
    return records


STEPS = [step_nonblocking, step_blocking, step_mixing, step_bad_input]


def main():
    args = parse_args()
    if not under_launcher():
        return relaunch(args.nprocs, args.timeout)
    return main_mpi()


if __name__ == "__main__":
    sys.exit(main())
