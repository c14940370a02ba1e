"""python -m mcr.bench compare: the peers side by side, their tables and targets.

One short comparison at 2 ranks (allreduce and bcast, 4 to 64 bytes, one round): its tables,
targets section, --json file and --plot figure. The C reference (mcr/bench/osu_c.c) is
compiled and checks its own results for every operation and form. The report's arithmetic
on made-up numbers.
"""

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys

import pytest

from mcr import launch
from mcr.bench.compare import cli, driver, report

PEERS = ("C", "C-mt", "mpi4py-numpy", "mpi4py-torch", "torch-gloo", "mcr-gloo", "mcr-mpi",
         "mcr-auto", "C pers", "C-mt pers", "mcr-mpi pers")
SIZES = (4, 8, 16, 32, 64)
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One comparison, shared by the tests that read its output."""
    tmp = tmp_path_factory.mktemp("compare")
    out_json, out_png = tmp / "compare.json", tmp / "compare.png"
    cmd = [sys.executable, "-m", "mcr.bench.compare", "-n", "2", "--ops", "allreduce,bcast",
           "-m", "4:64", "-i", "20", "-x", "5", "--rounds", "1", "--json", str(out_json)]
    if HAVE_MATPLOTLIB:
        cmd += ["--plot", str(out_png)]
    env = {k: v for k, v in os.environ.items() if k not in launch.LAUNCHER_VARS}
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=240)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}"
    return proc.stdout, out_json, out_png


def cell(us, spread):
    """A made-up result of two rounds."""
    return {"rounds_us": [us, us + spread], "error": None}


def table(out, op):
    """The header and rows of the 'minimum' table of `op`."""
    lines = out.splitlines()
    start = lines.index(f"{op}: minimum of the round averages, us per call")
    rows = [line.split() for line in itertools.takewhile(str.strip, lines[start + 1:])]
    return rows[0], rows[1:]


def test_tables(run):
    out, _, _ = run
    for op in ("allreduce", "bcast"):
        head, rows = table(out, op)
        text = " ".join(head)
        for peer in PEERS:
            assert re.search(rf"(^| ){re.escape(peer)}( |$)", text), (peer, text)
        for ratio in ("mcr-C (us)", "mcr/mpi4py-np", "mcr/mpi4py-pt", "mcr/C",
                      "pers/nonpers", "auto/best"):
            assert ratio in text, (ratio, text)
        assert [int(r[0]) for r in rows] == list(SIZES)
        for r in rows:
            # every timed column has a number: all peers have these operations
            assert all(re.fullmatch(r"[+-]?\d+(\.\d+)?", x) for x in r), r
    assert "Not measured" not in out, out


def test_targets_section(run):
    out, _, _ = run
    section = out[out.index("Targets (issue 10"):]
    text = " ".join(section.split())              # the lines wrap
    for what in ("mcr - C-mt <= 0.5 us", "1 KiB to 1 MiB: mcr / C-mt",
                 "mcr / mpi4py-numpy <= 0.8",
                 "mcr / mpi4py-torch <= 1/20", "mcr-gloo / torch-gloo <= 1.1",
                 "mcr pers / mcr <=", "mcr-auto / min(mcr-mpi, mcr-gloo) <= 1.05"):
        # nothing of 1 KiB or more was measured
        verdict = r"n/a" if "1 KiB to" in what else r"(met|NOT met) \(worst "
        assert re.search(re.escape(what) + r"[^:]*: " + verdict, text), (what, section)


def test_json(run):
    _, out_json, _ = run
    data = json.loads(out_json.read_text())
    assert data["nprocs"] == 2
    assert data["info"]["build_info"]["mpicc"] == driver._mcr_build_info()["mpicc"]
    assert set(data["results"]) == {"allreduce", "bcast"}
    for op, rows in data["results"].items():
        assert list(rows) == [str(n) for n in SIZES]
        for nbytes, cells in rows.items():
            for peer in PEERS:
                got = cells[peer]
                assert got["error"] is None, (op, nbytes, peer, got)
                assert len(got["rounds_us"]) == 1 and got["rounds_us"][0] > 0
                assert got["iters"] >= 5
            us = {peer: cells[peer]["rounds_us"][0] for peer in PEERS}
            summary = data["summary"][op][nbytes]
            assert summary["us"]["mcr-mpi"]["min"] == us["mcr-mpi"]
            assert summary["ratios"]["min"]["mcr/C"] == pytest.approx(us["mcr-mpi"] / us["C"])
            assert summary["ratios"]["min"]["auto/best"] == pytest.approx(
                us["mcr-auto"] / min(us["mcr-mpi"], us["mcr-gloo"]))
    names = [t["name"] for t in data["targets"]]
    assert len(names) == 7 and all(t["applies"] for t in data["targets"])


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib is not installed")
def test_plot(run):
    _, _, out_png = run
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_osu_c_builds_and_checks_itself(tmp_path):
    mpicc = driver.find_mpicc(driver._mcr_build_info())   # from a subprocess: no MPI here
    assert mpicc, "no mpicc found for the C reference"
    exe = driver.build_c(mpicc, cache=str(tmp_path))
    assert os.access(exe, os.X_OK)
    assert driver.build_c(mpicc, cache=str(tmp_path)) == exe  # cached
    argv = [exe, "-o", ",".join(cli.OPS), "-f", "blocking,nonblocking,persistent", "-i", "3",
            "-w", "1", "-r", "2", "4", "12"]
    job = launch.run(2, argv, timeout=120, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True)
    assert job.returncode == 0, job.stderr
    results = [json.loads(line) for line in job.stdout.splitlines()]
    # every operation in every form at both sizes (barrier: one, no data)
    assert len(results) == 3 * (1 + 2 * (len(cli.OPS) - 1))
    for r in results:
        assert r["ok"] and r["error"] == "" and len(r["rounds_us"]) == 2, r


def test_sizes_and_lists():
    args = cli.parse_args(["-m", "3:20", "--ops", "all", "--forms", "persistent"])
    assert (args.sizes, args.ops) == ([3, 6, 12], list(cli.OPS))
    assert args.forms == ["blocking", "persistent"]
    assert "mcr-nccl" not in args.peers           # CPU tensors: no NCCL peers (unless named)
    assert cli.parse_args(["--ops", "barrier", "-m", "2"]).sizes == [1, 2]    # no element
    assert cli.parse_args(["-m", "64"]).sizes == [1, 2, 4, 8, 16, 32, 64]    # bad: test_tune


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch, capsys):
    real = cli.importlib.import_module

    def no_matplotlib(name, *a):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a)
    monkeypatch.setattr(cli.importlib, "import_module", no_matplotlib)
    with pytest.raises(SystemExit) as info:
        cli.parse_args(["--plot", "x.png"])
    assert "pip install 'mcr[bench]'" in str(info.value)


def test_ctrl_c_says_so_without_a_traceback(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt     # as Ctrl-C in launch.run, which stops the job on its way out
    monkeypatch.setattr(launch, "run", interrupted)
    monkeypatch.setattr(driver, "_mcr_build_info", lambda cuda=False: None)
    try:
        assert driver.main(["--ops", "allreduce", "-m", "4", "--peers", "mcr-mpi"]) == 130
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt escaped (a traceback)")
    assert capsys.readouterr().err.splitlines()[-1] == \
        "python -m mcr.bench compare: interrupted; the run was stopped, nothing was written"


def test_targets_arithmetic():
    us = {"4": {"C": 0.5, "C-mt": 0.6, "mcr-mpi": 1.0, "mpi4py-numpy": 2.0, "mpi4py-torch": 25.0,
                "mcr-mpi pers": 0.9, "C pers": 0.6, "torch-gloo": 200.0, "mcr-gloo": 210.0},
          "1024": {"C": 1.0, "C-mt": 1.2, "mcr-mpi": 1.8, "mpi4py-numpy": 2.0},
          "1048576": {"C": 100.0, "C-mt": 100.0, "mcr-mpi": 104.0, "mcr-mpi pers": 104.0,
                      "C pers": 99.0, "torch-gloo": 1000.0, "mcr-gloo": 1200.0}}
    results = {"allreduce": {n: {peer: cell(t, 5) for peer, t in row.items()}
                             for n, row in us.items()}}
    got = {t["ratio"]: t for t in report.targets(results, 2, "torch")}
    # 4 B: 1.0 - 0.6 = 0.4 met; 1 KiB: 1.8 - 1.2 = 0.6 missed
    assert not got["mcr-Cmt (us)"]["met"]
    assert got["mcr-Cmt (us)"]["misses"] == [{"op": "allreduce", "bytes": 1024,
                                             "value": pytest.approx(0.6)}]
    assert not got["mcr/C-mt"]["met"]                       # 1.5 at 1 KiB, 1.04 at 1 MiB
    assert [m["bytes"] for m in got["mcr/C-mt"]["misses"]] == [1024]
    assert not got["mcr/mpi4py-np"]["met"]                  # 0.5 at 4 B, 0.9 at 1 KiB
    assert got["mcr/mpi4py-pt"]["met"]                      # 0.04
    assert not got["gloo/torch"]["met"]                     # 1.05 at 4 B, 1.2 at 1 MiB
    assert got["gloo/torch"]["misses"] == [{"op": "allreduce", "bytes": 1048576,
                                           "value": pytest.approx(1.2)}]
    assert got["pers/nonpers"]["met"]                       # 0.9 and 1.0
    assert report.targets(results, 3, "torch")[0]["applies"] is False


def test_summary_table():
    args = cli.parse_args(["--ops", "barrier,allreduce", "--peers", "C,C-mt,mcr-mpi",
                           "--forms", "blocking", "--summary", "4,1024"])
    assert args.summary == [4, 1024]
    results = {"barrier": {"0": {"C": cell(0.3, 1), "C-mt": cell(0.4, 1),
                                 "mcr-mpi": cell(0.9, 1)}},
               "allreduce": {str(n): {"C": cell(n / 100, 1), "C-mt": cell(n / 100 + 0.1, 1),
                                      "mcr-mpi": cell(n / 100 + 0.4, 1)} for n in (4, 8, 1024)}}
    lines = report.summary(args, results, args.summary)
    assert lines[0].endswith("at 4 B, 1 KiB")
    rows = [line.split() for line in lines[2:] if line.strip()]
    # barrier at its one size; allreduce at 4 B and 1 KiB, not 8 B
    assert [r[:3] for r in rows] == [["barrier", "0", "B"], ["allreduce", "4", "B"],
                                     ["allreduce", "1", "KiB"]]
    names = report.columns_of(args) + report._ratio_columns(args)
    kib = dict(zip(names, rows[2][3:]))                   # after "allreduce 1 KiB"
    assert (kib["mcr-Cmt (us)"], kib["mcr/C-mt"]) == ("+0.30", "1.03"), kib
    assert cli.parse_args(["--summary"]).summary == [int(x) for x in cli.SUMMARY_SIZES.split(",")]
