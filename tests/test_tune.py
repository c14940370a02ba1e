"""python -m mcr.tune: the tuning suite, its table, merging, figure and errors.

One short run at 2 ranks writes a table, checked against choices computed here from its
latencies; a second run with another operation merges into it. Bad options exit with status
2 naming the option (an unusable ``--out`` before anything is measured; checked in this
process, where starting a job fails the test), a wrong result with status 1. Counts, sizes,
summary and progress: on made-up numbers, in this process.
"""

import fcntl
import io
import json
import math
import os
import socket
import subprocess
import sys
import threading

import pytest
import torch

from mcr import launch, tuning
from mcr.bench.ops import OPERATIONS
from mcr.tune import cli, plot, progress, report, schedule
from mpiharness import run_script

JOB_TIMEOUT = 150           # the driver stops the job after this (--timeout)
TIMEOUT = JOB_TIMEOUT + 60  # and this test stops the driver
FIRST = ["--ops", "allreduce,bcast,alltoallv", "-m", "4:64", "--rounds", "1", "--time-budget", "2"]
SIZES = [4, 8, 16, 32, 64]
PNG = b"\x89PNG\r\n\x1a\n"


def tune(*args, timeout=TIMEOUT):
    """Run ``python -m mcr.tune args`` as a plain program; (status, output)."""
    env = {k: v for k, v in os.environ.items() if k not in launch.LAUNCHER_VARS}
    cmd = [sys.executable, "-m", "mcr.tune", "--timeout", str(JOB_TIMEOUT), *args]
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in {exc.timeout:.0f} s")
    return proc.returncode, proc.stdout


def refused(monkeypatch, capsys, *args):
    """``python -m mcr.tune args`` in this process, for a run refused before any job starts
    (launching one fails the test); (status, output)."""
    from mcr.tune import driver
    for name in launch.LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)

    def no_job(*args, **kwargs):
        raise AssertionError("a job was started")
    monkeypatch.setattr(launch, "run", no_job)
    try:
        code = driver.main(["--timeout", str(JOB_TIMEOUT), *args])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A first run, then a second one with another operation into the same file."""
    tmp = tmp_path_factory.mktemp("tune")
    out, png = tmp / "table.json", tmp / "table.png"
    code, first_out = tune(*FIRST, "--out", str(out), "--plot", str(png))
    assert code == 0, f"exit {code}:\n{first_out}"
    first = json.loads(out.read_text())
    code, second_out = tune("--ops", "allgather", "-m", "4:16", "--rounds", "1", "--time-budget",
                            "1", "--out", str(out))
    assert code == 0, f"exit {code}:\n{second_out}"
    return {"out": out, "png": png, "first": first, "first_out": first_out,
            "second": json.loads(out.read_text()), "second_out": second_out}


def fastest(latency):
    """The backend of smallest latency, mpi on a tie (computed here, not by mcr)."""
    best = min(latency.values())
    tied = sorted(b for b, v in latency.items() if v == best)
    return "mpi" if "mpi" in tied else tied[0]


def check_ranges(entries):
    """Each (op, device)'s entries cover 0 up to every larger size, without gaps."""
    keys = [None] + [(e.op, e.device) for e in entries] + [None]
    for i, e in enumerate(entries):
        assert e.min_bytes == (entries[i - 1].bytes + 1 if keys[i] == keys[i + 1] else 0), e
        assert e.max_bytes == (e.bytes if keys[i + 2] == keys[i + 1] else None), e


def test_first_run_table(runs):
    table = tuning.Table.from_json(runs["first"])             # as the first run left it
    assert sorted((e.op, e.device, e.bytes) for e in table.entries) == sorted(
        (op, "cpu", n) for op in ("Bcast", "Alltoallv", "Allreduce") for n in SIZES)
    for e in table.entries:
        assert set(e.latency_us) == {"mpi", "gloo"}, e
        assert all(v > 0 and math.isfinite(v) for v in e.latency_us.values()), e
        if e.op not in tuning.FIXED_OPS:
            assert e.backend == fastest(e.latency_us), e
    # Alltoallv: one backend for every size, the smallest geometric mean
    fixed = [e for e in table.entries if e.op == "Alltoallv"]
    means = {b: sum(math.log(e.latency_us[b]) for e in fixed) for b in ("mpi", "gloo")}
    assert {e.backend for e in fixed} == {fastest(means)}
    check_ranges(table.entries)
    m = table.machine
    assert (m["world_size"], m["ppn"], m["host"], m["devices"]) == (
        2, 2, socket.gethostname(), ["cpu"]) and m["mpi"] and m["torch"], m


def test_first_run_summary(runs):
    out = runs["first_out"]
    assert f"table written to {runs['out']} (15 entries)" in out, out
    rows = [line.split() for line in out.splitlines()
            if line.split()[:2] in (["Allreduce", "cpu"], ["Bcast", "cpu"], ["Alltoallv", "cpu"])]
    assert {r[0] for r in rows} == {"Allreduce", "Bcast", "Alltoallv"}, out
    for r in rows:                                # the chosen backend after the sizes
        assert r[4 if r[0] == "Alltoallv" else 3] in ("mpi", "gloo"), r
    assert [r for r in rows if r[0] == "Alltoallv"][0][2:4] == ["4..64", "*"]


def test_rerun_merges(runs):
    second = runs["second"]
    assert [e for e in second["entries"] if e["op"] != "Allgather"] == runs["first"]["entries"]
    added = [e for e in second["entries"] if e["op"] == "Allgather"]
    assert [e["bytes"] for e in added] == [4, 8, 16]
    assert all(set(e["latency_us"]) == {"mpi", "gloo"} for e in added)
    assert second["machine"]["world_size"] == 2
    check_ranges(tuning.Table.load(str(runs["out"])).entries)
    # the summary shows what this run measured
    assert "Allgather" in runs["second_out"] and "Allreduce" not in runs["second_out"]


def test_plot(runs, tmp_path):
    assert runs["png"].read_bytes()[:8] == PNG
    # and from the table file alone
    again = tmp_path / "again.png"
    proc = subprocess.run([sys.executable, "-m", "mcr.tune", "plot", str(runs["out"]),
                           "--out", str(again)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and again.read_bytes()[:8] == PNG, proc.stderr
    assert again.stat().st_size > 1000


def test_plot_to_an_unwritable_file(tmp_path, monkeypatch, capsys):
    """Refused before drawing (exit 2), as is a format matplotlib lacks; a write that fails all
    the same says so (exit 1)."""
    pytest.importorskip("matplotlib")
    table = str(tmp_path / "table.json")
    made_up("Allreduce", {"mpi": 1.0, "gloo": 2.0}).save(table)
    with pytest.raises(SystemExit) as info:
        plot.main([table, "--out", "/dev/null/t.png"])
    assert info.value.code == 2
    assert "--out /dev/null/t.png: /dev/null is not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        plot.main([table, "--out", str(tmp_path / "t.pngg")])
    assert info.value.code == 2 and "matplotlib writes no 'pngg' files" in capsys.readouterr().err
    # without an extension: a PNG, in the file named (matplotlib alone adds ".png")
    assert plot.main([table, "--out", str(tmp_path / "figure")]) == 0
    assert f"figure written to {tmp_path / 'figure'}" in capsys.readouterr().out
    assert (tmp_path / "figure").read_bytes()[:8] == PNG
    monkeypatch.setattr(cli, "unwritable_figure", lambda path: None)
    assert plot.main([table, "--out", "/dev/null/t.png"]) == 1
    assert "--out /dev/null/t.png: cannot write the figure: Not a directory" \
        in capsys.readouterr().err


@pytest.mark.parametrize("args, names", [
    (["--ops", "allreduce,nosuchop"], ["--ops", "nosuchop"]),
    (["-m", "4:lots"], ["-m", "4:lots"]),
    pytest.param(["--devices", "cpu,cuda"], ["--devices cuda: CUDA is not available"],
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")),
])
def test_bad_options(args, names, tmp_path, monkeypatch, capsys):
    code, out = refused(monkeypatch, capsys, *args, "--out", str(tmp_path / "t.json"))
    assert code == 2 and all(name in out for name in names), out
    assert not (tmp_path / "t.json").exists()


def tool_args(tool):
    """The function that parses `tool`'s command line."""
    from mcr.bench import compare, torchdist, workloads
    return {"tune": cli.parse_args, "compare": compare.cli.parse_args,
            "torchdist": torchdist.parse_args, "workloads": workloads.parse_args}[tool]


BAD_OPTIONS = {   # tool: (arguments, what its error names)
    "workloads": [
        (["--workloads", "moe,bert"], ["--workloads: expected distinct names"]),
        (["--variants", "mcr,mcr"], ["--variants: expected distinct names"]),
        (["--set", "moe.experts"], ["--set: expected WORKLOAD.FIELD=VALUE"]),
        (["--set", "moe.depth=3"], ["moe has no size 'depth'"]),
        (["--set", "dlrm.rows=many"], ["dlrm.rows: expected int, got 'many'"]),
        (["--workloads", "moe", "--set", "dlrm.rows=3"], ["WORKLOAD one of moe,"]),
        (["--steps", "0"], ["--steps: expected at least 1"]),
        (["--json", "/proc/w.json"], ["--json /proc/w.json: cannot create a file in /proc"]),
        (["--set", "moe.hidden=-4"], ["--set: moe.hidden: expected at least 1, got -4"]),
        (["--set", "dlrm.tables=0"], ["--set: dlrm.tables: expected at least 1, got 0"]),
        (["--set", "moe.lr=nan"], ["--set: moe.lr: expected a finite number >= 0"]),
        *([(["--variants", "mcr,nccl"], ["--variants nccl: needs CUDA"])]
          if not torch.cuda.is_available() else [])],
    "compare": [
        (["--ops", "allreduce,nosuchop"], ["--ops", "nosuchop", "choose from"]),
        (["-m", "3"], ["-m 3: no message size holds one float32 element (4 bytes)"]),
        (["--dtype", "float64", "-m", "4"], ["-m 4", "float64 element (8 bytes)"]),
        (["--peers", "mcr-gloo,mcr-nccl"], ["--peers mcr-nccl", "--buffer torch-cuda"]),
        (["--dtype", "float16", "--peers", "C,C-mt"], ["--dtype float16", "C,C-mt"]),
        (["--dtype", "bfloat16", "--peers", "mpi4py-torch"], ["mpi4py has no bfloat16"]),
        (["--loop-time", "0"], ["--loop-time: expected seconds > 0, got 0"]),
        (["--timeout", "-1"], ["--timeout: expected seconds > 0, got -1"]),
        (["--iterations-large", "0"], ["--iterations-large: expected at least 1, got 0"]),
        (["--warmup-large", "-1"], ["--warmup-large: expected at least 0, got -1"]),
        (["-x", "-1"], ["-x: expected at least 0, got -1"]),
        (["--json", "/dev/null/c.json"], ["--json /dev/null/c.json: /dev/null is not a folder"]),
        (["--plot", "c.xyz"], ["--plot c.xyz: matplotlib writes no 'xyz' files"])],
    "torchdist": [(["--ops", "all_reduce,nope"], ["--ops: unknown ['nope']"]),
                  (["--sizes", "2"], ["--sizes: expected byte counts of at least 4"])],
    "tune": [
        (["--ops", "latency"], ["--ops", "latency", "point-to-point"]),
        (["--ops", ","], ["--ops", "empty"]),
        (["-m", "64:4"], ["-m", "MIN 64", "MAX 4"]),
        (["-m", "1:2"], ["-m", "float32"]),
        (["--backends", "mpi,nosuch"], ["--backends", "nosuch"]),
        (["--devices", "tpu"], ["--devices", "tpu"]),
        (["--rounds", "0"], ["--rounds", "0"]),
        (["--time-budget", "0"], ["--time-budget", "0"]),
        (["-n", "0"], ["-n", "0"]),
        (["--plot", "/dev/null/t.png"], ["--plot /dev/null/t.png"]),
        (["--plot", "t.jpgg"], ["--plot t.jpgg: matplotlib writes no 'jpgg' files"])]}


@pytest.mark.parametrize("tool, args, names",
                         [(tool, *row) for tool, rows in BAD_OPTIONS.items() for row in rows])
def test_bad_options_of_every_tool(tool, args, names, capsys):
    with pytest.raises(SystemExit) as info:
        tool_args(tool)(args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and all(name in err for name in names), err


@pytest.mark.parametrize("text, problem", [
    ("not json\n", "not JSON"),
    ('{"format": "something-else", "version": 1}\n', "format"),
    ('{"format": "mcr-tuning", "version": 1, "machine": {"world_size": 3}, "entries": []}\n',
     "world_size 3"),
])
def test_unusable_out_file(tmp_path, text, problem, monkeypatch, capsys):
    path = tmp_path / "table.json"
    path.write_text(text)
    code, out = refused(monkeypatch, capsys, "--ops", "allreduce", "-m", "4:4", "--out", str(path))
    assert code == 2 and str(path) in out and problem in out, out
    assert "mcr.tune:" not in out.replace("python -m mcr.tune:", "")   # no progress: nothing ran
    assert path.read_text() == text


@pytest.mark.parametrize("path, problem", [
    ("/dev/null/table.json", "/dev/null is not a folder"),
    ("/proc/table.json", "cannot create a file in /proc"),
    (".", "it is a folder"),
])
def test_unwritable_out_file(path, problem, tmp_path, monkeypatch, capsys):
    """Found before anything is measured (it was found when saving, after the run)."""
    monkeypatch.chdir(tmp_path)
    code, out = refused(monkeypatch, capsys, "--ops", "allreduce", "-m", "4:4", "--out", path)
    assert code == 2 and f"--out {path}: {problem}" in out, out
    assert "measurements" not in out                                    # nothing ran


def interrupted(*args, **kwargs):
    raise KeyboardInterrupt     # as Ctrl-C in launch.run, which stops the job on its way out


def test_ctrl_c_says_so_without_a_traceback(tmp_path, monkeypatch, capsys):
    from mcr.tune import driver
    monkeypatch.setattr(launch, "run", interrupted)
    monkeypatch.setattr(driver, "_warn_if_busy", lambda nprocs: None)
    path = tmp_path / "table.json"
    try:
        assert driver.main(["--ops", "allreduce", "-m", "4:4", "--out", str(path)]) == 130
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt escaped (a traceback)")
    assert capsys.readouterr().err.splitlines()[-1] == \
        "python -m mcr.tune: interrupted; the run was stopped, nothing was saved"
    assert not path.exists()


def test_wrong_result_stops_the_run(tmp_path):
    path = tmp_path / "table.json"
    code, out = tune("--ops", "allreduce", "-m", "4:8", "--rounds", "1",
                     "--inject-wrong-result", "1", "--out", str(path))
    assert code == 1 and "Allreduce on cpu, backend mpi, 4 bytes: wrong result: allreduce: rank 1" \
        in out, out
    assert not path.exists()


def test_under_mpiexec_rank0_speaks_once(tmp_path):
    # started as the ranks: a bad option is reported once, with status 2 on every rank
    path = tmp_path / "t.json"
    code, out = run_script(2, ["-m", "mcr.tune", "--ops", "nosuchop", "--out", str(path)],
                           timeout=JOB_TIMEOUT)
    assert code == 2 and out.count("--ops: unknown 'nosuchop'") == 1, out
    # and a run: rank 0 shows the progress and the summary, once
    code, out = run_script(2, ["-m", "mcr.tune", "--ops", "barrier,bcast", "-m", "4:8",
                               "--rounds", "1", "--time-budget", "2", "-n", "3", "--out",
                               str(path)], timeout=JOB_TIMEOUT)
    assert code == 0, out
    for once in (f"table written to {path} (3 entries)", "mcr.tune: 6 measurements",
                 "-n 3 is ignored under mpiexec (2 ranks)"):
        assert out.count(once) == 1, (once, out)
    assert [e.op for e in tuning.Table.load(str(path)).entries] == ["Barrier", "Bcast", "Bcast"]


# -- in this process: names, sizes, counts, summary ----------------------------------

def test_ops_map_onto_the_tuning_table():
    assert sorted(cli.TUNED.values()) == sorted(tuning.OPS)
    for name, op in cli.TUNED.items():
        assert OPERATIONS[name].method == op
    assert cli.parse_args(["--ops", "allreduce,bcast"]).ops == ["bcast", "allreduce"]
    assert cli.parse_args([]).ops == list(cli.TUNED)


def made_up(op, latency):
    table = tuning.Table(machine={"world_size": 2, "devices": ["cpu"]})
    table.add(op, "cpu", 4, latency)
    return table


def test_saves_merge_into_the_file_as_it_is_now(tmp_path):
    """A run reads --out again under the lock before it writes: a table another run
    saved meanwhile (another operation) is kept, not overwritten with a stale copy."""
    path = str(tmp_path / "table.json")
    cli.save_merged(made_up("Allreduce", {"mpi": 1.0, "gloo": 9.0}), path, 2)
    saver = threading.Thread(target=cli.save_merged,
                             args=(made_up("Bcast", {"mpi": 2.0, "gloo": 1.0}), path, 2))
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saver.start()
        saver.join(0.3)
        assert saver.is_alive()             # it waits for the lock
        # a third run saves while the second waits
        table = tuning.Table.load(path)
        table.merge(made_up("Barrier", {"mpi": 3.0, "gloo": 4.0}))
        table.save(path)
    saver.join(10)
    merged = tuning.Table.load(path)
    assert [(e.op, e.backend) for e in merged.entries] == [
        ("Barrier", "mpi"), ("Bcast", "gloo"), ("Allreduce", "mpi")]
    assert merged.machine["devices"] == ["cpu"]


def test_message_sizes():
    for text, sizes in (("4:64", SIZES), ("1:16", [4, 8, 16]),      # whole float32 elements
                        ("5:100", [8, 16, 32, 64]), ("16", [4, 8, 16])):
        assert cli.message_sizes(text) == sizes, text
    for bad in ("x", "4:", "0:8", "8:4", "1:2"):
        with pytest.raises(ValueError, match="-m"):
            cli.message_sizes(bad)
    pts = schedule.points(["barrier", "bcast"], ["cpu"], [4, 8])
    assert [(p.op, p.nbytes) for p in pts] == [("barrier", 0), ("bcast", 4), ("bcast", 8)]


def test_counts():
    budget = schedule.Budget(None, loops=10, visits_left=5, start=0.0)      # no budget
    assert budget.counts(4, 1e-6, 0.0) == (1000, 200)            # OSU's
    assert budget.counts(65536, 1e-6, 0.0) == (100, 10)
    iters, warmup = budget.counts(4, 0.01, 0.0)                 # slow: cut to LOOP_CAP
    assert iters == int(schedule.LOOP_CAP / 0.01) and warmup >= 1
    assert budget.counts(4, 10.0, 0.0)[0] == schedule.MIN_ITERS
    # 10 s for 100 loops in 10 visits: 0.1 s a loop at the start
    budget = schedule.Budget(10.0, loops=100, visits_left=10, start=0.0)
    iters, warmup = budget.counts(4, 1e-4, 0.0)
    assert (iters + warmup) * 1e-4 <= 0.1 + 1e-9 and iters >= 500
    # a visit took 1 s with 0.5 s of loops: that overhead is kept for the 9 left
    budget.done(loops=10, seconds=1.0, looping=0.5)
    assert budget.per_loop(1.0) == pytest.approx((9.0 - 0.5 * 9) / 90)
    # past the deadline: the fewest calls
    assert budget.counts(4, 1e-4, 20.0) == (schedule.MIN_ITERS, 1)


def test_summary_on_made_up_numbers():
    table = tuning.Table(machine={"world_size": 2, "ppn": 2, "host": "h",
                                  "mpi": "Open MPI v5.0.11, package: x", "torch": "2"})
    for n, mpi, gloo in ((4, 2.0, 50.0), (8, 2.5, 51.0), (16, 80.0, 60.0)):
        table.add("Allreduce", "cpu", n, {"mpi": mpi, "gloo": gloo})
    table.add("Barrier", "cpu", 0, {"mpi": 1.0, "gloo": 30.0})
    lines = report.summary(table, [("Allreduce", "cpu"), ("Barrier", "cpu")], "/x.json")
    assert "Open MPI v5.0.11," in lines[0] and "package" not in lines[0]
    rows = [line.split() for line in lines if line.startswith(("Allreduce", "Barrier"))]
    assert rows == [["Barrier", "cpu", "0", "*", "mpi", "1.0", "30.0"],
                    ["Allreduce", "cpu", "4..8", "mpi", "2.0..2.5", "50.0..51.0"],
                    ["Allreduce", "cpu", "16", "gloo", "80.0", "60.0"]]
    assert lines[-1] == "table written to /x.json (4 entries)"


def test_progress_lines_and_bar(monkeypatch):
    stream = io.StringIO()
    shown = progress.Progress(4, stream=stream)             # not a terminal: lines
    for done, section in ((1, "Bcast cpu"), (2, "Bcast cpu"), (4, "Allreduce cpu")):
        shown.update(done, f"{section} {done} B", section, left=None)
    shown.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and lines[0] == "mcr.tune: 4 measurements", lines
    assert lines[1].startswith("mcr.tune: 1/4 measurements (Bcast cpu), 0:00 elapsed")
    assert lines[2].startswith("mcr.tune: 4/4 measurements (Allreduce cpu)")
    stream = io.StringIO()
    shown = progress.Progress(4, stream=stream, bar=True)
    shown.update(4, "Allreduce cpu 4 B", "Allreduce cpu", left=61.0)
    shown.close()
    assert "4/4" in stream.getvalue() and "budget left 1:01" in stream.getvalue()
    monkeypatch.setitem(sys.modules, "tqdm", None)        # import tqdm fails: lines
    stream = io.StringIO()
    progress.Progress(2, stream=stream, bar=True).update(2, "Bcast cpu 4 B", "Bcast cpu")
    assert stream.getvalue().splitlines()[0] == "mcr.tune: 2 measurements"


def test_progress_from_rank0_to_the_launcher(tmp_path):
    # rank 0's records in a file, shown by the launching process's thread
    channel, stream = str(tmp_path / "progress.jsonl"), io.StringIO()
    follower = progress.Follower(channel, stream)
    follower.start()
    reporter = progress.Reporter(3, True, channel=channel)
    reporter.step("Bcast cpu 4 B", "Bcast cpu", 2)
    reporter.step("Allreduce cpu 4 B", "Allreduce cpu", 1)
    reporter.close()
    follower.stop()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "mcr.tune: 3 measurements"
    assert lines[-1].startswith("mcr.tune: 3/3 measurements (Allreduce cpu)")
    progress.Reporter(3, False, channel=str(tmp_path / "other.jsonl")).step("x", "x", 3)
    assert not (tmp_path / "other.jsonl").exists()
