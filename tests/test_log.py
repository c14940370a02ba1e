"""The communication logger (mcr.log): MPI cases check the records of real calls against the
calls (sizes by nccl-tests' rule, computed here from the tensors); jobs run ``MCR_LOG`` end to
end; the configuration, the report and the formats are tested without MPI."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI as MPI4

import mcr
import mcr.hooks
import mcr.log
from mcr import _core
from mcr import launch
from mcr.log import output, report
from mcr.log.__main__ import main as log_main
from mcr.log.config import Config
from mpiharness import case, mpi_cases, mpi_env, run_script
from opref import rank_data
from util import assert_comm_works, logging_on, raises

BACKENDS = ("mpi", "gloo")


def fields(records, *names):
    return [tuple(r[n] for n in names) for r in records]


def has(record, **want):
    assert {k: record[k] for k in want} == want, record


def calls(rows):
    """The summary rows as {(op, backend, bytes): calls}."""
    return {(r["op"], r["backend"], r["bytes"]): r["calls"] for r in rows}


@case.matrix(backend=BACKENDS, timed=(False, True))
def every_form(comm, backend, timed):
    """Each form is logged as the program called it; under a timeout too, where a blocking call
    is posted and waited for."""
    if timed:
        comm = comm.Dup()
        comm.timeout = 60
    size, rank = comm.size, comm.rank
    f8 = torch.float64
    x = rank_data(rank, 6, f8)
    total = sum(rank_data(r, 6, f8) for r in range(size))
    with logging_on() as log:
        ys = [torch.zeros(6, dtype=f8) for _ in range(4)]
        comm.Allreduce(x, ys[0], backend=backend)
        reqs = [comm.Iallreduce(x, y, backend=backend) for y in ys[1:]]
        reqs[0].Wait()
        while not reqs[1].Test():
            pass
        mcr.Request.Waitall(reqs[2:])
        b = x.clone() if rank == 0 else torch.zeros(6, dtype=f8)
        preq = comm.Bcast_init(b, 0, backend=backend)
        for _ in range(2):
            preq.Start()
            preq.Wait()
        preq.Free()
    assert all(torch.equal(y, total) for y in ys) and torch.equal(b, rank_data(0, 6, f8))
    assert fields(log.records, "op", "form") == [("Allreduce", "blocking")] + [
        ("Allreduce", "nonblocking")] * 3 + [("Bcast", "persistent")] * 2, log.records
    for r in log.records:
        has(r, backend=backend, bytes=48, count=6, dtype="float64", procs=size, rank=rank,
            wire_bytes=48, why=None, device="cpu", tag=None,
            peer=0 if r["op"] == "Bcast" else None)
        assert r["end"] >= r["start"] and r["duration_us"] >= 0
    assert calls(log.rows) == {("Allreduce", backend, 48): 4, ("Bcast", backend, 48): 2}
    if timed:
        comm.Free()


@case.matrix(backend=BACKENDS)
def nonblocking_runs_to_the_completion_seen(comm, backend):
    # the record ends when Wait reports completion, not when the data arrived
    x, y = torch.ones(4), torch.zeros(4)
    with logging_on() as log:
        req = comm.Iallreduce(x, y, backend=backend)
        time.sleep(0.05)
        req.Wait()
        reqs = [comm.Ibcast(x, 0, backend=backend)]
        time.sleep(0.05)
        assert mcr.Request.Waitany(reqs) == 0
    assert [r["form"] for r in log.records] == ["nonblocking"] * 2
    assert all(r["duration_us"] >= 45e3 for r in log.records), log.records
    assert torch.equal(y, torch.full((4,), float(comm.size)))


@case
def freed_and_stopped_are_not_recorded(comm):
    x, y = torch.ones(2), torch.zeros(2)
    with logging_on() as log:
        comm.Isend(x, mcr.PROC_NULL, 0).Free()     # never reported complete: no record
        comm.Barrier()
        mcr.log.stop()
        comm.Allreduce(x, y)         # logger off
        mcr.log.start(records=True)
        comm.Bcast(x, 0)
    assert [r["op"] for r in log.records] == ["Barrier", "Bcast"], log.records
    assert log.records[0]["bytes"] == 0 and not mcr.log.active()


@case
def sizes_follow_nccl_tests(comm):
    # the size of each operation, computed here from the tensors
    size, rank = comm.size, comm.rank
    n, counts = 3, [k + 1 for k in range(size)]
    x = rank_data(rank, n)
    with logging_on() as log:
        comm.Allgather(x, torch.zeros(n * size))
        comm.Alltoall(torch.ones(n * size), torch.zeros(n * size))
        comm.Gather(x, torch.zeros(n * size) if rank == 0 else None, 0)
        comm.Scatter(torch.ones(n * size) if rank == size - 1 else None, torch.zeros(n), size - 1)
        comm.Reduce_scatter_block(torch.ones(n * size), torch.zeros(n))
        comm.Allgatherv(torch.ones(rank + 1), [torch.zeros(sum(counts)), counts])
        comm.Gatherv(torch.ones(rank + 1),
                     [torch.zeros(sum(counts)), counts] if rank == 0 else None, 0)
        comm.Reduce(x.to(torch.int32), torch.zeros(n, dtype=torch.int32), mcr.MAX, 0)
        comm.Scan(x, torch.zeros(n))
    e = torch.tensor([], dtype=torch.float32).element_size()
    assert fields(log.records, "op", "bytes", "peer") == [
        ("Allgather", n * size * e, None), ("Alltoall", n * size * e, None),
        ("Gather", n * size * e, 0), ("Scatter", n * size * e, size - 1),
        ("Reduce_scatter_block", n * size * e, None), ("Allgatherv", sum(counts) * e, None),
        ("Gatherv", (sum(counts) if rank == 0 else rank + 1) * e, 0),
        ("Reduce", n * 4, 0), ("Scan", n * e, None)], log.records
    has(log.records[7], dtype="int32", count=n)
    (ag,) = [r for r in log.rows if r["op"] == "Allgather"]
    assert ag["busbw_GBps"] == pytest.approx(ag["algbw_GBps"] * (size - 1) / size)


@case
def point_to_point_peers_and_tags(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    out = torch.zeros(5, dtype=torch.int64)
    with logging_on() as log:
        # a Gloo pair cannot send to itself
        for backend in BACKENDS[:1] if size == 1 else BACKENDS:
            req = comm.Isend(torch.arange(5) + rank, right, 7, backend=backend)
            comm.Recv(out, left, 7, backend=backend)
            req.Wait()
            assert torch.equal(out, torch.arange(5) + left)
    for r in log.records:
        has(r, bytes=40, dtype="int64", tag=7, peer=right if r["op"] == "Send" else left)
    assert {r["op"] for r in log.records} == {"Send", "Recv"}


@case
def auto_says_why(comm):
    x, y = torch.ones(8), torch.zeros(8)
    with logging_on() as log:
        comm.Allreduce(x, y, backend="auto")
        comm.Send(x, mcr.PROC_NULL, 1, backend="auto")
        for emulated in (False, True):     # MPI's persistent request, and mcr's
            previous = _core._set_persistent_emulation(emulated)
            try:
                req = comm.Allreduce_init(x, y, backend="auto")
                req.Start()
                req.Wait()
                req.Free()
            finally:
                _core._set_persistent_emulation(previous)
    ar, send, *started = log.records
    choice = comm.choose("Allreduce", 32)
    has(ar, backend=choice.backend, why=choice.reason)
    has(send, backend="mpi", why=None)
    for r in started:
        has(r, form="persistent", backend=choice.backend, why=choice.reason)
    assert len(started) == 2


@case
def stragglers_show_who_waited(comm):
    mcr.log.reset()
    mcr.log.start()
    for _ in range(3):
        if comm.rank == 0:
            time.sleep(0.03)         # rank 0 arrives late: the others wait for it
        comm.Barrier()
    table = mcr.log.summary(stragglers=True)
    mcr.log.stop()
    mcr.log.reset()
    (row,) = [r for r in table["stragglers"] if r["op"] == "Barrier"]
    assert row["ranks"] == comm.size
    if comm.size > 1:
        assert row["slowest_rank"] != 0 and row["max_avg_us"] >= 25e3, row
        assert row["min_avg_us"] < row["max_avg_us"]


@case.matrix(backend=BACKENDS)
def neighborhood_collectives_are_logged(comm, backend):
    # every form on a ring: a record per call (per Start), sized as the collectives are (what an
    # allgather receives, what an alltoall sends); a composed call's Alltoallv rounds are not
    size, rank = comm.size, comm.rank
    ring = comm.Create_cart([size], periods=[True])
    left, right = (rank - 1) % size, (rank + 1) % size
    f8, n = torch.float64, 3
    mine = lambda r, slot: rank_data(r, n, f8, seed=slot)     # noqa: E731
    with logging_on() as log:
        got = torch.zeros(2 * n, dtype=f8)
        ring.Neighbor_allgather(mine(rank, 0), got, backend=backend)
        assert torch.equal(got, torch.cat([mine(left, 0), mine(right, 0)]))
        # slot 0 goes towards the negative direction, into the positive neighbour's (MPI 4.0)
        got = torch.zeros(2 * n, dtype=f8)
        req = ring.Ineighbor_alltoall(torch.cat([mine(rank, 0), mine(rank, 1)]), got,
                                      backend=backend)
        time.sleep(0.02)
        req.Wait()
        assert torch.equal(got, torch.cat([mine(left, 1), mine(right, 0)]))
        # one element to the left, two to the right: two come from the left
        out = torch.zeros(3, dtype=torch.int32)
        preq = ring.Neighbor_alltoallv_init(
            [torch.tensor([rank, rank + 10, rank + 20], dtype=torch.int32), [1, 2], [0, 1]],
            [out, [2, 1], [0, 2]], backend=backend)
        for _ in range(2):
            preq.Start()
            preq.Wait()
        preq.Free()
        assert out.tolist() == [left + 10, left + 20, right]
    assert fields(log.records, "op", "form", "backend", "bytes", "count", "dtype") == [
        ("Neighbor_allgather", "blocking", backend, 2 * n * 8, 2 * n, "float64"),
        ("Neighbor_alltoall", "nonblocking", backend, 2 * n * 8, 2 * n, "float64")] + [
        ("Neighbor_alltoallv", "persistent", backend, 12, 3, "int32")] * 2, log.records
    for r in log.records:
        has(r, peer=None, tag=None, procs=size, device="cpu")
        assert r["end"] >= r["start"]
    assert log.records[1]["duration_us"] >= 15e3, log.records[1]
    assert calls(log.rows) == {("Neighbor_allgather", backend, 48): 1,
                               ("Neighbor_alltoall", backend, 48): 1,
                               ("Neighbor_alltoallv", backend, 12): 2}, log.rows
    if backend == "mpi":
        # Neighbor_alltoallw (MPI datatypes; on MPI only): its elements are not counted
        with logging_on() as log:
            got = np.zeros(2, np.float32)
            ring.Neighbor_alltoallw([np.array([rank, rank + 0.5], np.float32), [1, 1], [0, 4],
                                     [MPI4.FLOAT] * 2], [got, [1, 1], [0, 4], [MPI4.FLOAT] * 2])
            assert got.tolist() == [left + 0.5, right]
        assert fields(log.records, "op", "backend", "bytes", "dtype") == [
            ("Neighbor_alltoallw", "mpi", 0, "derived")], log.records
    ring.Free()


@case
def hooks_and_private_comms(comm):
    seen = []
    private = comm.Dup()
    mcr._core._set_unlogged(private)
    x, y = torch.ones(3), torch.zeros(3)
    with logging_on() as log, mcr.hooks.installed(lambda call: seen.append(call.op)):
        comm.Allreduce(x, y)
        private.Allreduce(x, y)      # mcr's own traffic: not logged, still hooked
    private.Free()
    assert [r["op"] for r in log.records] == ["Allreduce"]
    assert seen == ["Allreduce", "Allreduce"]
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)


# -- MCR_LOG end to end ------------------------------------------------------------------

PROGRAM = """
import torch, mcr
comm = mcr.COMM_WORLD
x, y = torch.ones(256), torch.zeros(256)
for _ in range(5):
    comm.Allreduce(x, y)
reqs = [comm.Iallgather(x, torch.zeros(256 * comm.size)) for _ in range(2)]
mcr.Request.Waitall(reqs)
comm.Allreduce(x, y, backend="gloo")
assert torch.equal(y, torch.full((256,), float(comm.size)))
"""


def run_logged(args, mcr_log):
    """The output of `python args...` on 2 ranks with MCR_LOG=`mcr_log`."""
    result = launch.run(2, [sys.executable] + args, timeout=120,
                        env=dict(mpi_env(), MCR_LOG=mcr_log), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0, result.stdout
    return result.stdout


def test_mcr_log_env_writes_table_json_and_trace(tmp_path, capsys):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    jpath, tpath = tmp_path / "calls.jsonl", tmp_path / "trace.json"
    out = run_logged([str(script)], f"summary:stragglers,json:{jpath},trace:{tpath}")
    assert "mcr communication summary (rank 0 of 2)" in out, out
    assert "mcr stragglers" in out and "busbw GB/s" in out
    assert out.count("mcr communication summary") == 1     # rank 0 only
    table = out[out.index("mcr communication summary"):]
    assert "Allreduce  mpi      1 KiB" in table and "Iallgather" not in table, table

    records = output.read_json(str(jpath))
    assert len(records) == 2 * 8
    for rank in (0, 1):
        mine = [r for r in records if r["rank"] == rank]
        assert fields(mine, "op", "form", "backend") == [("Allreduce", "blocking", "mpi")] * 5 \
            + [("Allgather", "nonblocking", "mpi")] * 2 + [("Allreduce", "blocking", "gloo")]
        assert mine[5]["bytes"] == 256 * 4 * 2

    events = json.loads(tpath.read_text())["traceEvents"]
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    # the two Iallgathers overlap (both are posted, then waited for together)
    assert {(pid, name) for (pid, _), name in thread.items()} == {
        (rank, name) for rank in (0, 1)
        for name in ("gloo", "mpi", "mpi requests", "mpi requests 2")}, thread
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 16 and {e["ph"] for e in events} == {"M", "X"}
    for e in complete:
        assert e["ts"] >= 0 and e["dur"] >= 0, e
        form = e["args"]["record"]["form"]
        expect = "mpi requests" if form == "nonblocking" else e["cat"]
        assert thread[e["pid"], e["tid"]].startswith(expect), (e, thread)
    key = lambda r: (r["rank"], r["start"])                          # noqa: E731
    assert sorted(output.read_json(str(tpath)), key=key) == sorted(records, key=key)

    summ = subprocess.run([sys.executable, "-m", "mcr.log", "summary", str(jpath)],
                          capture_output=True, text=True, timeout=60)
    assert summ.returncode == 0 and "Allreduce  gloo" in summ.stdout, summ
    png = tmp_path / "log.png"
    plotted = subprocess.run([sys.executable, "-m", "mcr.log", "plot", str(tpath), "--out",
                              str(png)], capture_output=True, text=True, timeout=120)
    assert plotted.returncode == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the file written is the one named, and said; one that cannot be is refused first
    noext = tmp_path / "figure"
    assert log_main(["plot", str(tpath), "--out", str(noext)]) == 0
    assert f"wrote {noext} (16 calls)" in capsys.readouterr().out
    assert noext.read_bytes()[:8] == png.read_bytes()[:8]
    for out, why in ((tmp_path, "it is a folder"),
                     (tmp_path / "no" / "x.png", f"cannot create a file in {tmp_path}/no"),
                     (tmp_path / "x.pnj", "matplotlib writes no 'pnj' files")):
        assert log_main(["plot", str(tpath), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"mcr.log: cannot write {out}: {why}") and err.count("\n") == 1, err


def test_summary_per_rank_and_files_per_rank_after_finalize(tmp_path):
    """A program that finalizes MPI itself: each rank labels its table and writes its own
    file, named by its rank."""
    jpath = tmp_path / "calls.jsonl"
    out = run_logged(["-c", "import mcr, torch\nmcr.COMM_WORLD.Bcast(torch.ones(3), 0)\n"
                      "from mpi4py import MPI\nMPI.Finalize()\n"], f"summary:ranks,json:{jpath}")
    assert "(rank 0 of 2)" in out and "(rank 1 of 2)" in out and out.count("Bcast") == 2, out
    assert not jpath.exists()
    for rank in (0, 1):
        assert fields(output.read_json(f"{jpath}.{rank}"), "rank", "op") == [(rank, "Bcast")]


def test_bad_mcr_log_fails_import_without_mpi(tmp_path):
    """Bad syntax, and a log that could not be written at exit (its records lost after the
    whole run, before), fail the import naming the item; a writable one is not left behind."""
    for value, error in [("summary,jsn:x", "MCR_LOG: 'jsn:x' is not understood"),
                         (f"json:{tmp_path}/no/such/x.jsonl",
                          f"MCR_LOG: 'json:{tmp_path}/no/such/x.jsonl': cannot write the file: "
                          f"cannot create a file in {tmp_path}/no/such: No such file"),
                         (f"summary,trace:{tmp_path}",
                          f"MCR_LOG: 'trace:{tmp_path}': cannot write the file: it is a folder")]:
        proc = subprocess.run([sys.executable, "-c", "import mcr"], capture_output=True,
                              text=True, env=dict(os.environ, MCR_LOG=value), timeout=60)
        assert proc.returncode != 0 and error in proc.stderr, proc.stderr
    fine = tmp_path / "calls.jsonl"
    cfg = subprocess.run([sys.executable, "-c", "from mcr.log.config import Config\n"
                          "print(Config.from_env().json)"], capture_output=True, text=True,
                         env=dict(os.environ, MCR_LOG=f"json:{fine}"), timeout=60)
    assert cfg.stdout.strip() == str(fine) and not fine.exists(), cfg.stdout + cfg.stderr


def test_overhead_benchmark_runs():
    code, out = run_script(1, ["-m", "mcr.log", "overhead", "--iters", "20", "--rounds", "1"],
                           timeout=120)
    assert code == 0 and "Allreduce 4 B" in out and "+summary" in out, out


# -- without MPI ---------------------------------------------------------------------------

def test_config_parse():
    cfg = Config.parse("summary:stragglers, trace:/tmp/t.json")
    assert cfg.summary and cfg.stragglers and not cfg.ranks
    assert cfg.trace == "/tmp/t.json" and cfg.json is None and cfg.keep
    assert not Config.parse("summary").keep
    for bad in ("summary:all", "json", "trace:", "csv:x"):
        with raises(ValueError, "MCR_LOG", repr(bad)):
            Config.parse(bad)


def test_bus_factors_are_nccl_tests():
    for op, procs, factor in (("Allreduce", 4, 2 * 3 / 4), ("Allgather", 8, 7 / 8),
                              ("Reduce_scatter_block", 2, 0.5), ("Alltoall", 4, 0.75),
                              ("Bcast", 4, 1.0), ("Send", 2, 1.0), ("Allreduce", 1, 0.0)):
        assert report.bus_factor(op, procs) == pytest.approx(factor, abs=0), (op, procs)


def test_rows_and_tables():
    rows = report.rows({("Allreduce", "mpi", 1 << 20, 4): (4, 4_000_000, 900_000,
                                                          1_200_000, 4 << 20)})
    (r,) = rows
    assert r["avg_us"] == pytest.approx(1000.0) and r["calls"] == 4
    assert r["algbw_GBps"] == pytest.approx((1 << 20) / 1e6)
    assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 1.5)
    text = report.format_summary(rows)
    assert "1 MiB" in text and "1000.00" in text
    again = report.rows_from_records([dict(op="Allreduce", backend="mpi", bytes=1 << 20,
                                           procs=4, duration_us=1000.0, wire_bytes=1 << 20)])
    assert again[0]["avg_us"] == pytest.approx(1000.0)
    strag = report.stragglers([rows, [dict(rows[0], avg_us=2000.0)]])
    assert strag[0]["slowest_rank"] == 1 and strag[0]["spread"] == pytest.approx(2.0)
    assert "(no calls logged)" in report.format_summary([])


def test_read_json_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"op": "Bcast", "duration_us": 1}\n{oops\n')
    with raises(ValueError, f"{path}:2"):
        output.read_json(str(path))
    path.write_text('[1, 2]\n')
    with raises(ValueError, f"{path}:1", "not an mcr log record"):
        output.read_json(str(path))


def test_trace_puts_overlapping_requests_on_separate_threads(tmp_path):
    def rec(rank, backend, form, start_us, dur_us, op="Allreduce"):
        return dict(rank=rank, backend=backend, form=form, op=op, start=100 + start_us / 1e6,
                    duration_us=float(dur_us))

    records = [rec(0, "mpi", "blocking", 0, 50),
               rec(0, "mpi", "nonblocking", 10, 100, "Alltoall"),    # overlaps the next two
               rec(0, "mpi", "nonblocking", 20, 30),
               rec(0, "mpi", "nonblocking", 60, 10),                # after the one above ends
               rec(0, "mpi", "persistent", 200, 5, "Bcast"),        # after every other
               rec(0, "gloo", "nonblocking", 15, 100),
               rec(1, "gloo", "blocking", 0, 10)]
    events = output.trace_events(records)
    assert {e["ph"] for e in events} == {"M", "X"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(names.values()) == sorted(["gloo", "gloo requests", "mpi", "mpi requests",
                                             "mpi requests 2", "gloo", "mpi"]), names
    calls = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in calls] == ["Allreduce", "Ialltoall", "Iallreduce", "Iallreduce",
                                          "Bcast_init", "Iallreduce", "Allreduce"]
    assert [names[e["pid"], e["tid"]] for e in calls] == [
        "mpi", "mpi requests", "mpi requests 2", "mpi requests 2", "mpi requests",
        "gloo requests", "gloo"]
    # no two calls of one thread overlap (checked pairwise, from the records)
    placed = [((e["pid"], e["tid"]), r["start"], r["start"] + r["duration_us"] / 1e6)
              for e, r in zip(calls, records)]
    for i, (thread, start, end) in enumerate(placed):
        for other, start2, end2 in placed[i + 1:]:
            assert thread != other or end <= start2 or end2 <= start, (thread, start, start2)
    assert calls[1]["ts"] == pytest.approx(10) and calls[1]["dur"] == 100
    # the file round-trips to the records
    path = tmp_path / "t.json"
    output.write_trace(str(path), records)
    assert output.read_json(str(path)) == records
