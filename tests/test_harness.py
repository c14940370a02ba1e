"""The MPI test harness itself: a crash or a hang fails only its own case.

A module of cases (one passes, one kills its process, one hangs, one fails on one rank, one
passes after them, a matrix of six combinations, one failing) runs through mpiharness at 2.
"""

import textwrap

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
        if comm.rank == 0:
            comm.recv(source=1, tag=99)     # never sent

    @case
    def fails_on_one_rank(comm):
        assert comm.rank != 1, "rank 1 says no"

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
    names = ["passes_first", "crashes", "hangs", "fails_on_one_rank", "passes_last"] + matrix
    monkeypatch.setattr(mpiharness, "_selected", None)    # every case of the plan
    mpiharness._modules[path] = mpiharness.Module(path, names, [nprocs], timeout=8,
                                                  own_job=True)
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
    ranks, died = results["fails_on_one_rank"]
    assert died is None and ranks[0]["ok"] and not ranks[1]["ok"]
    assert "rank 1 says no" in ranks[1]["error"]
    # a matrix: each combination passes or fails alone
    failed = [name for name in matrix if not all(r["ok"] for r in results[name][0].values())]
    assert failed == ["matrix[n=2,op=max]"], failed
