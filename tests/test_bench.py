"""``python -m mcr.bench``: OSU-format tables for every benchmark and form, checks, options.

Tiny settings: the format is checked (OSU's headers, a row per message size,
positive numbers), not the figures; the v-variants also at 3 ranks. Bad options
exit with status 2, a wrong result with status 1 on every rank; ``Case.check()``.
"""

import functools
import json
import re

import numpy
import pytest
import torch

import mcr
from mcr.bench import ops, osu
from mpi4py import MPI
from mpiharness import run_script

TINY = ["-m", "4:64", "-i", "3", "-x", "1"]
SIZES = [4, 8, 16, 32, 64]
COLLECTIVES = list(ops.OPERATIONS)
VECTOR = ["gatherv", "scatterv", "allgatherv", "alltoallv", "reduce_scatter",
          "reduce_scatter_block"]
GLOO, NUMPY = ["allreduce", "alltoallv", "scan", "latency", "bw"], ["allgather", "reduce", "bw"]

AVG, MINMAX = "       Avg Latency(us)", "   Min Latency(us)   Max Latency(us)"
COMPUTE = "       Compute(us)    Pure Comm.(us)"
COMM_MINMAX = "     Min Comm.(us)     Max Comm.(us)"
NB, OVERLAP, ITERS = "           Overall(us)" + COMPUTE, "        Overlap(%)", "  Iterations"
COLUMNS = {
    "latency": "# Size          Latency (us)",
    "bw": "# Size      Bandwidth (MB/s)",
    "blocking": "# Size" + AVG,
    "full": "# Size" + AVG + MINMAX + ITERS,
    "nonblocking": "# Size" + NB + OVERLAP,
    "nonblocking-full": "# Size" + NB + COMM_MINMAX + OVERLAP + ITERS,
    "barrier-blocking": "# Avg Latency(us)",
    "barrier-full": "# Avg Latency(us)" + MINMAX + ITERS,
    "barrier-nonblocking-full": "#     Overall(us)" + COMPUTE + COMM_MINMAX + OVERLAP + ITERS,
}
ROW = re.compile(r"^(\d+ *)?( +-?\d+\.\d\d)+( +\d+)?$")

# one job per world size runs them all (through osu.main); the tables' titles differ
COMMANDS = {
    2: [[*osu.NAMES, "-m", "0:64", "-i", "3", "-x", "1"],    # latency from 0 bytes, the
        [*COLLECTIVES, "--nonblocking", "-f", *TINY],       # others from one float32
        [*COLLECTIVES, "--persistent", "-f", *TINY],        # element (4 bytes)
        [*GLOO, "--backend", "gloo", *TINY],
        [*NUMPY, "--buffer", "numpy", "--dtype", "float64", *TINY]],
    # 4 to 16 bytes: reduce_scatter splits 1, 2 and 4 elements over 3 ranks;
    # persistent in bfloat16: its sums must be exact too
    3: [[*VECTOR, *form, "-m", "4:16", "-i", "3", "-x", "1"]
        for form in ([], ["--nonblocking"], ["--persistent", "--dtype", "bfloat16"])],
}
# what test_tables checks in their output: (ranks, names, the tables' form and header)
TABLES = {
    "blocking": (2, [n for n in osu.NAMES if n != "latency"], {}),
    "latency-from-0": (2, ["latency"], {"sizes": [0] + SIZES}),
    "nonblocking": (2, COLLECTIVES, {"form": "nonblocking", "full": True}),
    "persistent": (2, COLLECTIVES, {"form": "persistent", "full": True}),
    "gloo": (2, GLOO, {"backend": "gloo"}),
    "numpy": (2, NUMPY, {"buffer": "numpy", "dtype": "float64", "sizes": [8, 16, 32, 64]}),
    **{f"vector-{form}": (3, VECTOR, {"form": form, "sizes": [4, 8, 16], "dtype": dtype})
       for form, dtype in [("blocking", "float32"), ("nonblocking", "float32"),
                           ("persistent", "bfloat16")]},
}
DRIVER = ("import json, sys; from mpi4py import MPI; from mcr.bench import osu\n"
          "codes = MPI.COMM_WORLD.gather([osu.main(a) for a in json.loads(sys.argv[1])])\n"
          "sys.stdout.flush(); MPI.COMM_WORLD.rank or print('statuses', json.dumps(codes))\n")


def bench(nprocs, *args):
    code, out = run_script(nprocs, list(args), timeout=90)
    assert code is not None, f"{' '.join(args)} hung:\n{out[-4000:]}"
    return code, out


@functools.cache
def job(nprocs):
    """The output of every command line of COMMANDS[nprocs], each ending with status 0."""
    code, out = bench(nprocs, "-c", DRIVER, json.dumps(COMMANDS[nprocs]))
    assert code == 0, out[-4000:]
    statuses = [[0] * len(COMMANDS[nprocs])] * nprocs
    assert f"statuses {json.dumps(statuses)}" in out, out[-4000:]
    return out


def tables(out):
    """{title line: (column header, [rows])} for every table in the output."""
    found, title = {}, None
    for line in out.splitlines():
        if line.startswith("# OSU MPI "):
            assert line not in found, f"two tables {line!r}"
            title = line
            found[title] = (None, [])
        elif title is None:
            continue
        elif line.startswith("# Size") or line.startswith("# ") and "(us)" in line:
            found[title] = (line, [])
        elif ROW.match(line):
            found[title][1].append(line.split())
    return found


def title(name, form="blocking", backend="mpi", buffer="torch", dtype="float32"):
    prefix = {"blocking": "", "nonblocking": "Non-blocking ", "persistent": "Persistent "}
    what = {"latency": "Latency", "bw": "Bandwidth"}.get(name) or \
        f"{prefix[form]}{ops.OPERATIONS[name].title} Latency"
    return (f"# OSU MPI {what} Test (mcr {mcr.__version__}, backend {backend}, "
            f"buffer {buffer}, {dtype})")


def check_tables(out, names, form="blocking", full=False, sizes=SIZES, **header):
    found = tables(out)
    for name in names:
        key = title(name, form, **header)
        assert key in found, f"no table {key!r} in:\n{out[-4000:]}"
        columns, rows = found[key]
        if name in ("latency", "bw"):
            expected = COLUMNS[name]
        else:
            key = ("nonblocking-full" if full and form == "nonblocking" else "full" if full
                   else {"persistent": "blocking"}.get(form, form))
            expected = COLUMNS[("barrier-" if name == "barrier" else "") + key]
        assert columns == expected, (name, columns)
        if name == "barrier":
            assert len(rows) == 1, (name, rows)
        else:
            assert [int(r[0]) for r in rows] == sizes, (name, rows, out[-3000:])
        for row in rows:
            numbers = [float(v) for v in (row if name == "barrier" else row[1:])]
            if full:
                assert numbers.pop() == 3, (name, row)      # the Iterations column
            if form == "nonblocking":
                assert 0 <= numbers.pop() <= 100, (name, row)   # Overlap(%)
            # latency 0 bytes: bandwidth and latency positive all the same
            assert all(v > 0 for v in numbers), (name, row)


@pytest.mark.parametrize("what", TABLES)
def test_tables(what):
    nprocs, names, expected = TABLES[what]
    check_tables(job(nprocs), names, **expected)


# -- Failures -----------------------------------------------------------------------

def test_wrong_result_exits_1_on_every_rank():
    code, out = bench(2, "-m", "mcr.bench", "allreduce", "--inject-wrong-result", "1", *TINY)
    assert code == 1, out[-4000:]
    assert re.search(r"wrong result \(blocking, backend mpi, 4 bytes\): allreduce: rank 1, "
                     r"count 1: recvbuf\[0\] is \S+, expected 3\.0", out), out[-4000:]
    assert not tables(out)[title("allreduce")][1], "no row after a wrong result"


def test_bad_option_exits_2_before_communicating():
    code, out = bench(2, "-m", "mcr.bench", "allreduce", "-m", "8:4")
    assert code == 2, out[-4000:]
    assert out.count("python -m mcr.bench: error: -m 8:4: MIN 8 is larger than MAX 4") == 1
    assert "# OSU" not in out


BAD_OPTIONS = {
    "allreduce -m 8:4": "-m 8:4: MIN 8 is larger than MAX 4",
    "allreduce -m x:4": "-m x:4: expected [MIN:]MAX in bytes",
    "allreduce -m 1:2": "-m 1:2: no message size holds one float32 element (4 bytes)",
    "allreduce -i 0": "-i 0: must be >= 1",
    "allreduce -x -1": "-x -1: must be >= 0",
    "allreduce --backend nccl": "--backend nccl serves CUDA buffers only; --buffer torch is in "
                                "host memory",
    "allreduce --backend nccl --buffer numpy": "--backend nccl serves CUDA",
    "allreduce --buffer numpy --dtype bfloat16": "--buffer numpy --dtype bfloat16: numpy has "
                                                 "no element type for torch.bfloat16",
    "latency --nonblocking": "--nonblocking applies to the collectives",
    "bw -f": "-f applies to the collectives",
    "allreduce --nonblocking --persistent": "argument --persistent: not allowed with "
                                            "argument --nonblocking",
    "allreduce --dtype float128": "argument --dtype: invalid choice: 'float128'",
    "allreduce --dtype longdouble": "argument --dtype: invalid choice: 'longdouble'",
    "allgatherx": "argument name: invalid choice: 'allgatherx'",
}
if not torch.cuda.is_available():
    BAD_OPTIONS["allreduce --buffer torch-cuda"] = "--buffer torch-cuda: CUDA is not available here"


@pytest.mark.parametrize("argv", list(BAD_OPTIONS))
def test_bad_options_in_process(argv, capsys):
    assert osu.main(argv.split()) == 2
    err = capsys.readouterr().err
    assert f"python -m mcr.bench: error: {BAD_OPTIONS[argv]}" in err, err


def test_message_sizes():
    for text, sizes in [("4:64", SIZES), ("3:33", [4, 8, 16, 32]), ("0:4", [0, 1, 2, 4]),
                        ("16", [1, 2, 4, 8, 16])]:
        assert osu.message_sizes(text, 1) == sizes, text
    assert osu.message_sizes(None, 0)[:2] == [0, 1] and osu.message_sizes(None, 1)[-1] == 1 << 20
    with pytest.raises(ValueError, match="no power of two between 5 and 7"):
        osu.message_sizes("5:7", 1)


# -- Case.check, in process -----------------------------------------------------------

MAKERS = {"torch": ops.buffer_maker("torch"), "numpy": ops.buffer_maker("numpy")}


@pytest.mark.parametrize("comm_kind", ["mcr", "mpi4py"])
@pytest.mark.parametrize("buffer", ["torch", "numpy"])
@pytest.mark.parametrize("name", [n for n in COLLECTIVES if n != "barrier"])
def test_check_detects_a_spoiled_result(name, buffer, comm_kind):
    comm = mcr.COMM_SELF if comm_kind == "mcr" else MPI.COMM_SELF
    for form in ops.FORMS:
        case = ops.OPERATIONS[name].setup(comm, 5, torch.int32, MAKERS[buffer])
        iteration = case.run(form)
        # before the first iteration the receive buffers are zero (bcast: the
        # root's buffer is its input; exscan: nothing defined on rank 0 of 1)
        assert case.check() is not None or name in ("bcast", "exscan")
        iteration()
        assert case.check() is None, (form, case.check())
        if name != "exscan":
            recv = case.outputs[0][0]
            recv[3] = recv[3] + 1      # spoil one element
            problem = case.check()
            assert problem is not None and problem.startswith(f"{name}: rank 0, count 5: ")
            assert "recvbuf[3] is" in problem or "buf[3] is" in problem, problem
            case.run(form)()            # bcast: the root's data is the input, still spoiled
            assert name == "bcast" or case.check() is None, "an iteration rewrites the result"
        case.close()


def test_check_reports_bool_and_post():
    case = ops.OPERATIONS["allreduce"].setup(mcr.COMM_SELF, 4, torch.bool, MAKERS["torch"])
    case.post().Wait()
    assert case.check() is None
    case.corrupt()
    assert "recvbuf[0] is" in (case.check() or "")
    assert isinstance(ops.contents(numpy.zeros(3)), torch.Tensor)
