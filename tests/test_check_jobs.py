"""Hangs turned into errors, seen from outside the job: the environment
switches (MCR_CHECK, MCR_TIMEOUT), the flight recorder read by
``python -m mcr.debug``, a rank that dies, and Ctrl-C on mpiexec.

Each test runs a small program under mpiexec (mcr.launch) with a timeout of
its own, and checks what the job printed, how it ended and how long it took.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import mcr
from mcr import launch
from mpiharness import mpi_env

HERE = os.path.dirname(os.path.abspath(__file__))
JOB_TIMEOUT = 120


def _env(**extra):
    """The job's environment: mpiharness's, with the mcr this test imported
    (the source tree or the installed package) first on the path."""
    env = mpi_env()
    root = os.path.dirname(os.path.dirname(os.path.abspath(mcr.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    for key in ("MCR_CHECK", "MCR_TIMEOUT", "MCR_FLIGHT_RECORDER"):
        env.pop(key, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(tmp_path, nprocs, code, **env):
    script = tmp_path / "job.py"
    script.write_text(code)
    t0 = time.monotonic()
    result = launch.run(nprocs, [sys.executable, str(script)], timeout=JOB_TIMEOUT,
                        env=_env(**env), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    return result.returncode, result.stdout, time.monotonic() - t0


SKIP = """
import sys, torch, mcr
comm = mcr.COMM_WORLD
x = torch.ones(4)
comm.Allreduce(mcr.IN_PLACE, x)                     # 1, on every rank
try:
    if comm.rank == 0:
        comm.Allreduce(mcr.IN_PLACE, x)             # 2: the other ranks skip it
        for r in range(1, comm.size):
            comm.Send(x, dest=r, tag=7)
    else:
        comm.Recv(x, source=0, tag=7)
except mcr.TimeoutError as exc:
    print(f"rank {comm.rank}: TimeoutError: {exc}", flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("nprocs", [2, 3])
def test_timeout_from_the_environment_and_the_merged_report(tmp_path, nprocs):
    flight = tmp_path / "flight"
    code, out, took = _run(tmp_path, nprocs, SKIP, MCR_TIMEOUT=3,
                           MCR_FLIGHT_RECORDER=flight)
    assert code not in (None, 0), out
    for rank in range(nprocs):
        assert f"rank {rank}: TimeoutError: rank {rank}: no completion after 3 s" in out, out
    assert "waiting for Allreduce float32[4] SUM #2 on world [mpi]" in out
    assert "waiting for Recv float32[4] from 0 tag 7 on world [mpi]" in out
    files = sorted(os.listdir(flight))
    assert files == [f"mcr-flight-{r}.json" for r in range(nprocs)], files
    record = json.loads((flight / "mcr-flight-0.json").read_text())
    assert record["reason"] == "timeout" and record["comms"]["world"]["next_seq"] == 3
    # one job: every rank wrote the name its launcher gave it (Open MPI's is
    # PMIx's namespace; MPICH's mpiexec gives none)
    jobs = {json.loads((flight / name).read_text())["job"] for name in files}
    assert len(jobs) == 1 and (MPICH or None not in jobs), jobs
    pending = [c for c in record["calls"] if c["state"] == "pending"]
    assert [(c["op"], c["seq"]) for c in pending] == [("Allreduce", 2)], pending
    report = subprocess.run([sys.executable, "-m", "mcr.debug", str(flight)],
                            capture_output=True, text=True, timeout=60, env=_env())
    assert report.returncode == 1, report.stderr
    text = " ".join(report.stdout.split())      # (the report aligns its columns)
    assert "communicator world" in text and "ranks diverge at call #2" in text, text
    assert "rank 0: Allreduce float32[4] SUM" in text, text
    others = "rank 1" if nprocs == 2 else f"ranks 1-{nprocs - 1}"
    assert f"{others}: no call #2" in text, text
    assert "Recv from 0 tag 7" in text


MISMATCH = """
import torch, mcr
comm = mcr.COMM_WORLD
assert comm.checked and comm.Dup().checked
try:
    if comm.rank == comm.size - 1:
        comm.Bcast(torch.ones(4), root=0)
    else:
        comm.Allreduce(mcr.IN_PLACE, torch.ones(4))
except mcr.MismatchError as exc:
    print(f"rank {comm.rank}: MismatchError: {exc}", flush=True)
comm.Barrier()                         # still usable: every rank raised together
print(f"rank {comm.rank}: after", flush=True)
"""


def test_checked_mode_from_the_environment(tmp_path):
    flight = tmp_path / "flight"
    code, out, _ = _run(tmp_path, 3, MISMATCH, MCR_CHECK=1, MCR_FLIGHT_RECORDER=flight)
    assert code == 0, out
    # (#2: the Dup before it is #1)
    line = ("collective mismatch on world (different operations): ranks 0-1: Allreduce "
            "float32[4] SUM #2; rank 2: Bcast float32[4] root=0 #2")
    for rank in range(3):
        assert f"rank {rank}: MismatchError: {line}" in out, out
        assert f"rank {rank}: after" in out
    record = json.loads((flight / "mcr-flight-2.json").read_text())
    assert record["reason"] == "mismatch" and line in record["message"]
    # the recorder has the Dup as #1 and the mismatched calls as #2, failed
    assert [(c["op"], c["seq"], c["state"]) for c in record["calls"]
            if c["comm"] == "world"] == [("Dup", 1, "done"), ("Bcast", 2, "failed"),
                                         ("Barrier", 3, "done")], record["calls"]
    text = _debug(flight, status=1)
    assert "communicator world (ranks 0-2): ranks diverge at call #2" in text, text
    assert "ranks 0-1: Allreduce float32[4] SUM [mpi, blocking] failed after" in text, text
    assert "rank 2: Bcast float32[4] root=0 [mpi, blocking] failed after" in text, text
    assert "(call #1 agrees)" in text, text


def _debug(flight, status):
    """``python -m mcr.debug flight``'s report, blanks squeezed (it aligns columns)."""
    report = subprocess.run([sys.executable, "-m", "mcr.debug", str(flight)],
                            capture_output=True, text=True, timeout=60, env=_env())
    assert report.returncode == status, report.stdout + report.stderr
    return " ".join(report.stdout.split())


def _recorded(tmp_path, code, mode):
    """Run `code` on 3 processes with the flight recorder, checked
    (``mode="checked"``) or with a 3 s timeout: (exit status, output, the
    recorder's directory)."""
    flight = tmp_path / "flight"
    env = {"MCR_CHECK": 1} if mode == "checked" else {"MCR_TIMEOUT": 3}
    status, out, _ = _run(tmp_path, 3, code, MCR_FLIGHT_RECORDER=flight, **env)
    return status, out, flight


SPLIT_SKIP = """
import sys, time, torch, mcr
comm = mcr.COMM_WORLD
comm.Dup().Free()                                   # 1 and (on the copy) its 1
try:
    if comm.rank != comm.size - 1:
        comm.Split(0, comm.rank)                    # 2: the last rank goes another way
        comm.Send(torch.ones(4), dest=comm.size - 1, tag=7)
    elif comm.checked:
        comm.Allreduce(mcr.IN_PLACE, torch.ones(4))
    else:       # (an Allreduce against an Ibarrier: undefined in MPI, Open MPI may fail)
        comm.Recv(torch.ones(4), source=0, tag=7)
except mcr.MismatchError as exc:         # (checked) every rank raised: the job goes on
    print(f"rank {comm.rank}: MismatchError: {exc}", flush=True)
except mcr.TimeoutError as exc:
    print(f"rank {comm.rank}: TimeoutError: {exc}", flush=True)
    time.sleep(1)                               # the others write their files
    sys.exit(3)
"""


@pytest.mark.parametrize("mode", ["checked", "timed"])
def test_a_constructor_against_another_call_is_recorded(tmp_path, mode):
    # making and freeing communicators have their numbers among the
    # collectives, in checked mode and with a timeout alike, and the recorder
    # keeps them: mcr.debug names the call where the last rank went another way
    code, out, flight = _recorded(tmp_path, SPLIT_SKIP, mode)
    error = "MismatchError" if mode == "checked" else "TimeoutError"
    for rank in range(3):
        assert f"rank {rank}: {error}" in out, out
    text = _debug(flight, status=1)
    assert "communicator world (ranks 0-2): ranks diverge at call #2" in text, text
    if mode == "checked":
        assert code == 0, out
        assert "ranks 0-1: Split #2; rank 2: Allreduce float32[4] SUM #2" in out, out
        assert "ranks 0-1: Split [mpi, blocking] failed after" in text, text
        assert "rank 2: Allreduce float32[4] SUM [mpi, blocking] failed after" in text, text
    else:
        assert code not in (None, 0), out
        assert "to call Split (making a communicator is collective)" in out, out
        assert "Split #2 on world [mpi, blocking], 0 bytes, for 3" in out, out
        # (failed once it raised; pending in the file written at the timeout, if
        # the job ended that rank before it wrote the file again at exit)
        for rank in (0, 1):
            calls = json.loads((flight / f"mcr-flight-{rank}.json").read_text())["calls"]
            split = [(c["op"], c["state"]) for c in calls if c["seq"] == 2]
            assert split in ([("Split", "failed")], [("Split", "pending")]), (rank, calls)
        assert ("rank 2: no call #2 (its last on this communicator: #1 Dup [mpi, "
                "blocking], done)") in text, text
        assert "rank 2: Recv from 0 tag 7, 16 bytes, pending for" in text, text
    assert "(call #1 agrees)" in text, text
    assert "communicator 0-2#1 (ranks 0-2): call #1 agrees, all completed" in text, text


REFUSED = """
import sys, time, torch, mcr
comm = mcr.COMM_WORLD
x = torch.ones(3)
if comm.rank == 0:
    try:
        comm.Send("x", dest=1, tag=5)               # refused: no number, no record
    except TypeError:
        pass
try:
    try:
        comm.Bcast("x" if comm.rank == 0 else x, root=0)    # 1: the root's is no buffer
    except (TypeError, mcr.MismatchError) as exc:
        print(f"rank {comm.rank}: {type(exc).__name__}: {exc}", flush=True)
    if comm.rank == 0 and not comm.checked:
        comm.Recv(x, source=1, tag=7)               # the root goes on: nobody sends it
except mcr.TimeoutError as exc:
    print(f"rank {comm.rank}: TimeoutError", flush=True)
    time.sleep(1)                                   # the others write their files
    sys.exit(3)
"""


@pytest.mark.parametrize("mode", ["checked", "timed"])
def test_a_refused_call_is_recorded(tmp_path, mode):
    # the root refuses its Bcast's arguments. Unchecked, it goes on while the
    # others wait for it in the Bcast; checked, every rank raises. Either way
    # the recorder has the root's refused call, with its number, and mcr.debug
    # shows it against the others'
    code, out, flight = _recorded(tmp_path, REFUSED, mode)
    assert "rank 0: TypeError: buf: expected a torch.Tensor" in out, out
    if mode == "checked":
        assert code == 0, out
        for rank in (1, 2):
            assert f"rank {rank}: MismatchError: Bcast float32[3] root=0 #1 on world: " \
                   "the arguments of rank 0 were refused" in out, out
    else:
        assert code not in (None, 0), out
        for rank in range(3):
            assert f"rank {rank}: TimeoutError" in out, out
    text = _debug(flight, status=1)
    assert "communicator world (ranks 0-2): ranks diverge at call #1" in text, text
    assert ("rank 0: Bcast root=0 refused (TypeError) [mpi, blocking] failed after "
            "0.0 s") in text, text
    others = "failed after" if mode == "checked" else "pending for"
    assert f"ranks 1-2: Bcast float32[3] root=0 [mpi, blocking] {others}" in text, text
    if mode == "timed":
        assert "rank 0: Recv from 1 tag 7, 12 bytes, pending for" in text, text
    calls = json.loads((flight / "mcr-flight-0.json").read_text())["calls"]
    assert [c["op"] for c in calls] == ["Bcast"] + ["Recv"] * (mode == "timed"), calls


CROSSED = """
import sys, time, mcr
comm = mcr.COMM_WORLD
peer = 1 - comm.rank
comm.send({"hello": comm.rank}, dest=peer, tag=1)
assert comm.recv(source=peer, tag=1) == {"hello": peer}
try:
    comm.recv(source=peer, tag=2)                   # both receive first: a deadlock
    comm.send("reply", dest=peer, tag=2)
except mcr.TimeoutError as exc:
    print(f"rank {comm.rank}: TimeoutError: {exc}", flush=True)
    time.sleep(1)                                   # the other writes its file
    sys.exit(3)
"""


def test_point_to_point_on_objects_times_out_and_is_recorded(tmp_path):
    # mpi4py's recv on pickled objects, from the environment's timeout: two
    # ranks that both receive first raise, and the recorder shows each one's
    # receive (failed: nothing stays posted) after the exchange that worked
    flight = tmp_path / "flight"
    code, out, _ = _run(tmp_path, 2, CROSSED, MCR_TIMEOUT=3, MCR_FLIGHT_RECORDER=flight)
    assert code not in (None, 0), out
    for rank in range(2):
        assert (f"rank {rank}: TimeoutError: rank {rank}: no completion after 3 s (the "
                f"communicator's timeout) waiting for recv from {1 - rank} tag 2 on world "
                "[mpi]") in out, out
        assert f"recv from {1 - rank} tag 2 on world [mpi, blocking], for 3" in out, out
        calls = json.loads((flight / f"mcr-flight-{rank}.json").read_text())["calls"]
        seen = [(c["op"], c["desc"], c["seq"], c["state"]) for c in calls]
        assert seen[:2] == [("send", f"send to {1 - rank} tag 1", None, "done"),
                            ("recv", f"recv from {1 - rank} tag 1", None, "done")], seen
        # (failed once it raised; pending in the file written at the timeout, if
        # the job ended that rank before it wrote the file again at exit)
        assert seen[2:] in ([("recv", f"recv from {1 - rank} tag 2", None, state)]
                            for state in ("failed", "pending")), seen
        assert calls[0]["bytes"] == calls[1]["bytes"] > 0, calls   # the pickled object's
        assert calls[2]["bytes"] == -1, calls                      # (none came)
    text = _debug(flight, status=1)
    assert "communicator world (ranks 0-1): no collective call recorded" in text, text
    assert "rank 0: recv from 1 tag 2, failed after 3" in text or \
        "rank 0: recv from 1 tag 2, pending for" in text, text


POSTED = """
import mcr
comm = mcr.COMM_WORLD
peer = 1 - comm.rank
reqs = [comm.irecv(source=peer, tag=1), comm.isend(("hi", comm.rank), dest=peer, tag=1)]
assert mcr.Request.waitall(reqs) == [("hi", peer), None]
r = comm.irecv(source=peer, tag=2)
comm.issend(comm.rank, dest=peer, tag=2).wait()
assert r.wait() == peer
if comm.rank == 0:
    lost = comm.irecv(source=1, tag=3)              # nobody sends it: pending at exit
comm.barrier()
"""


def test_nonblocking_point_to_point_on_objects_is_recorded(tmp_path):
    # with the recorder alone (no timeout), mpi4py's isend, issend and irecv
    # are recorded, non-blocking, done once a lowercase wait completes them;
    # a receive nobody matched is pending in the file written at exit
    flight = tmp_path / "flight"
    code, out, _ = _run(tmp_path, 2, POSTED, MCR_FLIGHT_RECORDER=flight)
    assert code == 0, out
    calls = json.loads((flight / "mcr-flight-0.json").read_text())["calls"]
    seen = [(c["op"], c["desc"], c["form"], c["state"]) for c in calls]
    assert seen == [("irecv", "irecv from 1 tag 1", "nonblocking", "done"),
                    ("isend", "isend to 1 tag 1", "nonblocking", "done"),
                    ("irecv", "irecv from 1 tag 2", "nonblocking", "done"),
                    ("issend", "issend to 1 tag 2", "nonblocking", "done"),
                    ("irecv", "irecv from 1 tag 3", "nonblocking", "pending"),
                    ("barrier", "barrier", "blocking", "done")], seen
    assert calls[1]["bytes"] > 0 and calls[0]["bytes"] == -1, calls
    text = _debug(flight, status=1)
    assert "pending point-to-point: rank 0: irecv from 1 tag 3, pending for" in text, text


LEFT_AT_EXIT = """
import torch, mcr
comm = mcr.COMM_WORLD
peer = 1 - comm.rank
comm.Barrier(backend="gloo")
y = torch.zeros(4)
gloo = comm.Irecv(y, source=peer, tag=5, backend="gloo")     # never sent
mpi = comm.Irecv(torch.zeros(4), source=peer, tag=6)         # never sent
print(f"rank {comm.rank}: leaving", flush=True)
"""


def test_requests_left_pending_at_exit_end_quietly(tmp_path):
    # requests still pending in a module's globals when the program ends are
    # collected while Python tears its modules down: nothing can be waited
    # for or warned about then, and the job ends without tracebacks
    code, out, _ = _run(tmp_path, 2, LEFT_AT_EXIT)
    assert code == 0, out
    assert "rank 0: leaving" in out and "rank 1: leaving" in out, out
    assert "Traceback" not in out and "Exception ignored" not in out, out


def test_bad_environment_values_are_refused(tmp_path):
    code, out, _ = _run(tmp_path, 1, "import mcr\nmcr.COMM_WORLD\n", MCR_TIMEOUT="soon")
    assert code != 0 and "MCR_TIMEOUT: expected a number of seconds > 0, got 'soon'" in out
    code, out, _ = _run(tmp_path, 1, "import mcr\nmcr.COMM_WORLD\n", MCR_CHECK="maybe")
    assert code != 0 and "MCR_CHECK: expected 1 (on) or 0 (off), got 'maybe'" in out


DIE = """
import os, signal, sys, time, torch, mcr
comm = mcr.COMM_WORLD
where = sys.argv[1]
backend = "mpi" if where == "mpi" else "gloo"
if where != "bootstrap":
    comm.Allreduce(mcr.IN_PLACE, torch.ones(4), backend=backend)
print(f"rank {comm.rank}: ready", flush=True)
if comm.rank == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
for _ in range(3):
    comm.Allreduce(mcr.IN_PLACE, torch.ones(4), backend=backend)
"""


@pytest.mark.parametrize("where", ["mpi", "gloo", "bootstrap"])
def test_a_dead_rank_ends_the_job_and_is_named(tmp_path, where):
    script = tmp_path / "die.py"
    script.write_text(DIE)
    t0 = time.monotonic()
    result = launch.run(3, [sys.executable, str(script), where], timeout=JOB_TIMEOUT,
                        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True)
    took = time.monotonic() - t0
    assert result.returncode not in (None, 0), result.stdout
    assert took < 30 + 15, took          # 30 s, plus the job's start on a loaded machine
    out = " ".join(result.stdout.split()).lower()
    # Open MPI: "process rank 1 with PID ... exited on signal 9 (Killed)";
    # MPICH: "RANK 1 PID ... KILLED BY SIGNAL: 9". On Gloo a survivor may fail
    # first, on Gloo's error for the closed connection (which names the peer's
    # address, not its rank), and the launcher then names that survivor: seen
    # once in a few dozen runs over TCP
    named = "rank 1" in out and ("signal 9" in out or "signal: 9" in out)
    gloo_error = where != "mpi" and ("connection closed by peer" in out
                                     or "connection reset by peer" in out)
    assert named or gloo_error, out


MPICH = "MPICH" in mcr.build_info()["mpi_library_version"]

HANG = """
import torch, mcr
comm = mcr.COMM_WORLD
print(f"rank {comm.rank}: waiting", flush=True)
comm.Recv(torch.zeros(4), source=(comm.rank + 1) % comm.size, tag=1)   # never sent
"""


def test_ctrl_c_on_mpiexec_ends_every_rank(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    with launch.start(2, [sys.executable, str(script)], env=_env(), stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True) as job:
        seen = []
        deadline = time.monotonic() + JOB_TIMEOUT
        while len(seen) < 2 and time.monotonic() < deadline:
            line = job.process.stdout.readline()
            if not line:
                break
            if "waiting" in line:
                seen.append(line)
        assert len(seen) == 2, seen
        time.sleep(1)
        t0 = time.monotonic()
        job.process.send_signal(signal.SIGINT)       # what Ctrl-C sends mpiexec
        if MPICH:
            # MPICH's mpiexec (Hydra) passes the first Ctrl-C on to the ranks,
            # which are inside MPI_Recv, where Python runs no handler, and says
            # "Press Ctrl-C again to force abort"; Open MPI's ends them at once
            try:
                job.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                job.process.send_signal(signal.SIGINT)
        try:
            job.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("mpiexec still runs 30 s after SIGINT")
        assert time.monotonic() - t0 < 30
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    leftovers = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(script).encode() in f.read():
                    leftovers.append(pid)
        except OSError:
            pass
    assert not leftovers, f"ranks still running after Ctrl-C: {leftovers}"


def test_cost_benchmark_runs_and_checks_its_results():
    """python -m mcr.bench.check: one line per operation, backend and size,
    every variant timed (its results are checked inside)."""
    env = _env()
    env.pop("PYTHONUNBUFFERED", None)
    result = subprocess.run([sys.executable, "-m", "mcr.bench.check", "-n", "2", "--rounds",
                             "1", "--time", "0.01", "--sizes", "4", "--backends", "mpi"],
                            capture_output=True, text=True, timeout=JOB_TIMEOUT, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if " B  plain" in line]
    assert [line.split()[:2] for line in lines] == [["Allreduce", "mpi"],
                                                   ["Alltoallv", "mpi"]], result.stdout
    for line in lines:
        for variant in ("checked", "timeout", "recorder", "checked+timeout"):
            assert f" {variant} " in line, line
