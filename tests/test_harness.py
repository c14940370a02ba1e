"""The MPI test harness itself: a crash or a hang fails only its own case.

A module of cases (one passes, one kills its process, one hangs, one fails on one rank, one
fails on one rank while the other waits for it, one passes after them, a matrix of six
combinations, one failing) runs through mpiharness at 2.
"""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import mpiharness

CASES = textwrap.dedent('''
    import os, time
    from mpiharness import case

    @case
    def passes_first(comm):
        assert comm.allreduce(1) == comm.size

    @case
    def crashes(comm):
        if comm.rank == 1:
            os.abort()
        comm.Barrier()

    @case
    def hangs(comm):
        comm.Barrier(backend="gloo")        # a Gloo group: its store file is in the job's TMPDIR
        if comm.rank == 0:
            comm.recv(source=1, tag=99)     # never sent

    @case
    def fails_on_one_rank(comm):
        assert comm.rank != 1, "rank 1 says no"

    @case
    def fails_on_one_rank_the_other_waiting(comm):
        assert comm.rank != 1, "rank 1 leaves the barrier alone"
        comm.Barrier()

    @case
    def passes_last(comm):
        assert comm.allreduce(comm.rank) == comm.size * (comm.size - 1) // 2

    @case.matrix(n=(1, 2, 3), op=("sum", "max"))
    def matrix(comm, n, op):
        assert (n, op) != (2, "max"), "this combination fails"
''')


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", mpiharness.world_sizes([2]))
def test_a_crash_or_a_hang_fails_only_its_case(tmp_path, nprocs, monkeypatch):
    path = str(tmp_path / "cases_for_harness.py")
    with open(path, "w") as f:
        f.write(CASES)
    matrix = [f"matrix[n={n},op={op}]" for n in (1, 2, 3) for op in ("sum", "max")]
    names = ["passes_first", "crashes", "hangs", "fails_on_one_rank",
             "fails_on_one_rank_the_other_waiting", "passes_last"] + matrix
    monkeypatch.setattr(mpiharness, "_selected", None)    # every case of the plan
    monkeypatch.setattr(mpiharness, "FAILED_GRACE", 2.0)  # (shorter than the timeout, 8 s)
    mpiharness._modules[path] = mpiharness.Module(path, names, [nprocs], timeout=8,
                                                  own_job=True)
    started = time.time()
    try:
        mpiharness.run_cases(mpiharness._modules[path], nprocs)
        results = {name: mpiharness._results[(path, name, nprocs)] for name in names}
    finally:
        del mpiharness._modules[path]
    for name in ("passes_first", "passes_last"):
        ranks, died = results[name]
        assert died is None and all(r["ok"] for r in ranks.values()), (name, results[name])
    assert "exited with code" in results["crashes"][1]
    assert "made no progress for 8 s" in results["hangs"][1]
    # and says where each rank was: rank 0 in the case's recv, rank 1 between cases
    stacks = results["hangs"][1].partition(mpiharness.STACKS)[2]
    assert "rank 0:" in stacks and "rank 1:" in stacks, results["hangs"][1]
    line = next(i for i, text in enumerate(CASES.splitlines(), 1) if "never sent" in text)
    assert f'cases_for_harness.py", line {line} in hangs' in stacks.split("rank 1:")[0], stacks
    # the killed job's store file went with the job's folder
    tmp = tempfile.gettempdir()
    left = [name for name in os.listdir(tmp) if name.startswith("mcr-store-")
            and os.path.getmtime(os.path.join(tmp, name)) >= started]
    assert not left, f"the killed job left {left} in {tmp}"
    ranks, died = results["fails_on_one_rank"]
    assert died is None and ranks[0]["ok"] and not ranks[1]["ok"]
    assert "rank 1 says no" in ranks[1]["error"]
    # rank 0 waits for rank 1 in the barrier: the job is stopped soon after rank 1 failed,
    # and the case reports rank 1's error
    ranks, died = results["fails_on_one_rank_the_other_waiting"]
    assert list(ranks) == [1] and "rank 1 leaves the barrier alone" in ranks[1]["error"]
    assert "no progress for 2 s after the case failed on ranks [1]" in died, died
    # a matrix: each combination passes or fails alone
    failed = [name for name in matrix if not all(r["ok"] for r in results[name][0].values())]
    assert failed == ["matrix[n=2,op=max]"], failed


HANGS = textwrap.dedent('''
    import os, time
    from mpiharness import case, mpi_cases

    @case
    def hangs(comm):
        with open(os.environ["RANK_PIDS"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(600)

    test_mpi = mpi_cases(__name__)
''')


@pytest.mark.timeout(200)
def test_sigterm_to_pytest_stops_its_job(tmp_path):
    # a developer's `timeout` or kill ends pytest with SIGTERM: its MPI job ends with it
    (tmp_path / "test_hangs_for_harness.py").write_text(HANGS)
    pids, here = tmp_path / "pids", os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, RANK_PIDS=str(pids), MCR_TEST_SIZES="2",
               PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "conftest", "-q",
                             "test_hangs_for_harness.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the job did not start its 2 ranks:\n{proc.communicate()[0]}")
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode != 0, out
    ranks = [int(pid) for pid in pids.read_text().split()]
    deadline = time.monotonic() + 20
    while any(mpiharness.alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in ranks if mpiharness.alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks {left} outlived pytest:\n{out}"
