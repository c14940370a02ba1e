"""Hangs turned into errors, seen from outside the job (MCR_CHECK, MCR_TIMEOUT, the flight
recorder read by ``python -m mcr.debug``, a dying rank, Ctrl-C on mpiexec): each test runs a small
program under mpiexec and checks what it printed, how it ended and how long it took."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import mcr
from mcr import launch
from mcr._env import count, seconds
from mcr.backends import store
from mpiharness import mpi_env
from test_debug import run_cli

JOB_TIMEOUT = 120
MPICH = "MPICH" in mcr.build_info()["mpi_library_version"]
# MCR_TIMEOUT of the timed programs (they wait for it on purpose): whole seconds, since the
# checks below read "for 2" and "failed after 2" in ages that mcr.debug prints as 2.0 to 2.9
TIMED = 2
MODES = {"checked": {"MCR_CHECK": 1}, "timed": {"MCR_TIMEOUT": TIMED}}
HEAD = "import os, signal, sys, time, mcr\ncomm = mcr.COMM_WORLD\n"    # every program's start


def _env(**extra):
    """The job's environment: mpiharness's, with the mcr imported here first on the path."""
    env = mpi_env()
    root = os.path.dirname(os.path.dirname(os.path.abspath(mcr.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    for key in ("MCR_CHECK", "MCR_TIMEOUT", "MCR_FLIGHT_RECORDER"):
        env.pop(key, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(tmp_path, nprocs, code, *args, **env):
    """HEAD and `code` run on `nprocs` processes: (exit status, output, seconds taken)."""
    script = tmp_path / "job.py"
    # torch first where the program uses it: the ranks then leave MPI_Init together, with no
    # import between them and their first (timed) call
    first = "import torch\n" if "import torch" in code else ""
    script.write_text(first + HEAD + code)
    t0 = time.monotonic()
    result = launch.run(nprocs, [sys.executable, str(script), *args], timeout=JOB_TIMEOUT,
                        env=_env(**env), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    return result.returncode, result.stdout, time.monotonic() - t0


def _recorded(tmp_path, nprocs, code, ok, out_has, report_has, **env):
    """Run `code` with the flight recorder: it ends with status 0 (`ok`) or another, its output
    holds `out_has`, mcr.debug's report (status 1, blanks squeezed) `report_has`. (The recorder's
    directory, the output, the report.)"""
    flight = tmp_path / "flight"
    status, out, _ = _run(tmp_path, nprocs, code, MCR_FLIGHT_RECORDER=flight, **env)
    assert status is not None and (status == 0) == ok, out
    for fragment in out_has:
        assert fragment in out, (fragment, out)
    status, text, err = run_cli(flight)
    assert status == 1, text + err
    text = " ".join(text.split())
    for fragment in report_has:
        assert fragment in text, (fragment, text)
    return flight, out, text


def _file(flight, rank):
    return json.loads((flight / f"mcr-flight-{rank}.json").read_text())


SKIP = """
import torch
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
    others = "rank 1" if nprocs == 2 else f"ranks 1-{nprocs - 1}"
    flight, _, _ = _recorded(
        tmp_path, nprocs, SKIP, False,
        [f"rank {r}: TimeoutError: rank {r}: no completion after {TIMED:g} s"
         for r in range(nprocs)]
        + ["waiting for Allreduce float32[4] SUM #2 on world [mpi]",
           "waiting for Recv float32[4] from 0 tag 7 on world [mpi]"],
        ["communicator world", "ranks diverge at call #2", "rank 0: Allreduce float32[4] SUM",
         f"{others}: no call #2", "Recv from 0 tag 7"], MCR_TIMEOUT=TIMED)
    files = sorted(os.listdir(flight))
    assert files == [f"mcr-flight-{r}.json" for r in range(nprocs)], files
    record = _file(flight, 0)
    assert record["reason"] == "timeout" and record["comms"]["world"]["next_seq"] == 3
    # one job: every rank wrote its launcher's name for it (Open MPI: PMIx's namespace; MPICH: none)
    jobs = {_file(flight, r)["job"] for r in range(nprocs)}
    assert len(jobs) == 1 and (MPICH or None not in jobs), jobs
    pending = [c for c in record["calls"] if c["state"] == "pending"]
    assert [(c["op"], c["seq"]) for c in pending] == [("Allreduce", 2)], pending


MISMATCH = """
import torch
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
    # (#2: the Dup before it is #1)
    line = ("collective mismatch on world (different operations): ranks 0-1: Allreduce "
            "float32[4] SUM #2; rank 2: Bcast float32[4] root=0 #2")
    flight, _, _ = _recorded(
        tmp_path, 3, MISMATCH, True,
        [f"rank {r}: {end}" for r in range(3) for end in (f"MismatchError: {line}", "after")],
        ["communicator world (ranks 0-2): ranks diverge at call #2",
         "ranks 0-1: Allreduce float32[4] SUM [mpi, blocking] failed after",
         "rank 2: Bcast float32[4] root=0 [mpi, blocking] failed after", "(call #1 agrees)"],
        MCR_CHECK=1)
    record = _file(flight, 2)
    assert record["reason"] == "mismatch" and line in record["message"]
    # the recorder has the Dup as #1 and the mismatched calls as #2, failed
    assert [(c["op"], c["seq"], c["state"]) for c in record["calls"]
            if c["comm"] == "world"] == [("Dup", 1, "done"), ("Bcast", 2, "failed"),
                                         ("Barrier", 3, "done")], record["calls"]


SPLIT_SKIP = """
import torch
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


@pytest.mark.parametrize("mode", MODES)
def test_a_constructor_against_another_call_is_recorded(tmp_path, mode):
    # making and freeing communicators are numbered among the collectives, checked and timed
    # alike, and recorded: mcr.debug names the call where the last rank went another way
    checked = mode == "checked"
    flight, _, _ = _recorded(
        tmp_path, 3, SPLIT_SKIP, checked,
        [f"rank {r}: {'Mismatch' if checked else 'Timeout'}Error" for r in range(3)] + (
            ["ranks 0-1: Split #2; rank 2: Allreduce float32[4] SUM #2"] if checked else
            ["to call Split (making a communicator is collective)",
             f"Split #2 on world [mpi, blocking], 0 bytes, for {TIMED:g}"]),
        ["communicator world (ranks 0-2): ranks diverge at call #2", "(call #1 agrees)",
         "communicator 0-2#1 (ranks 0-2): call #1 agrees, all completed"] + (
            ["ranks 0-1: Split [mpi, blocking] failed after",
             "rank 2: Allreduce float32[4] SUM [mpi, blocking] failed after"] if checked else
            ["rank 2: no call #2 (its last on this communicator: #1 Dup [mpi, blocking], done)",
             "rank 2: Recv from 0 tag 7, 16 bytes, pending for"]), **MODES[mode])
    # (timed: failed once it raised; pending in the file written at the timeout, if the job
    # ended that rank before it wrote the file again at exit)
    for rank in (0, 1):
        split = [(c["op"], c["state"]) for c in _file(flight, rank)["calls"] if c["seq"] == 2]
        assert split in ([("Split", "failed")], [("Split", "pending")]), (rank, split)


REFUSED = """
import torch
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


@pytest.mark.parametrize("mode", MODES)
def test_a_refused_call_is_recorded(tmp_path, mode):
    # the root refuses its Bcast's arguments: unchecked, it goes on while the others wait in the
    # Bcast; checked, every rank raises. The refused call is recorded with its number
    checked = mode == "checked"
    flight, _, _ = _recorded(
        tmp_path, 3, REFUSED, checked, ["rank 0: TypeError: buf: expected a torch.Tensor"] + (
            [f"rank {r}: MismatchError: Bcast float32[3] root=0 #1 on world: the arguments "
             "of rank 0 were refused" for r in (1, 2)] if checked else
            [f"rank {r}: TimeoutError" for r in range(3)]),
        ["communicator world (ranks 0-2): ranks diverge at call #1",
         # (at once: under a second; checked, it still tells the others, 0.1 s when loaded)
         "rank 0: Bcast root=0 refused (TypeError) [mpi, blocking] failed after 0.",
         "ranks 1-2: Bcast float32[3] root=0 [mpi, blocking] "
         + ("failed after" if checked else "pending for")]
        + ([] if checked else ["rank 0: Recv from 1 tag 7, 12 bytes, pending for"]),
        **MODES[mode])
    calls = _file(flight, 0)["calls"]
    assert [c["op"] for c in calls] == ["Bcast"] + ["Recv"] * (not checked), calls


CROSSED = """
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
    # mpi4py's recv on pickled objects, timed: two ranks that both receive first raise; each
    # one's receive is recorded (failed: nothing stays posted) after the exchange that worked
    flight, _, text = _recorded(
        tmp_path, 2, CROSSED, False,
        [f"rank {r}: TimeoutError: rank {r}: no completion after {TIMED:g} s (the "
         f"communicator's timeout) waiting for recv from {1 - r} tag 2 on world [mpi]"
         for r in range(2)]
        + [f"recv from {1 - r} tag 2 on world [mpi, blocking], for {TIMED:g}" for r in range(2)],
        ["communicator world (ranks 0-1): no collective call recorded"], MCR_TIMEOUT=TIMED)
    assert (f"rank 0: recv from 1 tag 2, failed after {TIMED:g}" in text
            or "rank 0: recv from 1 tag 2, pending for" in text), text
    for rank in range(2):
        calls = _file(flight, rank)["calls"]
        seen = [(c["op"], c["desc"], c["seq"], c["state"]) for c in calls]
        assert seen[:2] == [("send", f"send to {1 - rank} tag 1", None, "done"),
                            ("recv", f"recv from {1 - rank} tag 1", None, "done")], seen
        # (failed once it raised, or pending: as above)
        assert seen[2:] in ([("recv", f"recv from {1 - rank} tag 2", None, state)]
                            for state in ("failed", "pending")), seen
        assert calls[0]["bytes"] == calls[1]["bytes"] > 0, calls   # the pickled object's
        assert calls[2]["bytes"] == -1, calls                      # (none came)


POSTED = """
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
    # the recorder alone records mpi4py's isend, issend and irecv, done once a lowercase wait
    # completes them; a receive nobody matched is pending in the file written at exit
    flight, _, _ = _recorded(tmp_path, 2, POSTED, True, [],
                             ["pending point-to-point: rank 0: irecv from 1 tag 3, pending for"])
    calls = _file(flight, 0)["calls"]
    assert [(c["op"], c["desc"], c["form"], c["state"]) for c in calls] == [
        ("irecv", "irecv from 1 tag 1", "nonblocking", "done"),
        ("isend", "isend to 1 tag 1", "nonblocking", "done"),
        ("irecv", "irecv from 1 tag 2", "nonblocking", "done"),
        ("issend", "issend to 1 tag 2", "nonblocking", "done"),
        ("irecv", "irecv from 1 tag 3", "nonblocking", "pending"),
        ("barrier", "barrier", "blocking", "done")], calls
    assert calls[1]["bytes"] > 0 and calls[0]["bytes"] == -1, calls


LEFT_AT_EXIT = """
import torch
peer = 1 - comm.rank
comm.Barrier(backend="gloo")
y = torch.zeros(4)
gloo = comm.Irecv(y, source=peer, tag=5, backend="gloo")     # never sent
mpi = comm.Irecv(torch.zeros(4), source=peer, tag=6)         # never sent
print(f"rank {comm.rank}: leaving", flush=True)
"""


def test_requests_left_pending_at_exit_end_quietly(tmp_path):
    # requests pending in a module's globals at the end are collected while Python tears its
    # modules down: nothing can be waited for or warned about then; no tracebacks
    code, out, _ = _run(tmp_path, 2, LEFT_AT_EXIT)
    assert code == 0, out
    assert "rank 0: leaving" in out and "rank 1: leaving" in out, out
    assert "Traceback" not in out and "Exception ignored" not in out, out


def test_environment_seconds_zero_is_none():
    """MCR_TIMEOUT=0 means no timeout, as comm.timeout = 0 does (it was refused)."""
    for value, expected in [("", 0.0), ("0", 0.0), (" 2.5 ", 2.5), ("1e-3", 0.001)]:
        assert seconds("MCR_TIMEOUT", {"MCR_TIMEOUT": value}) == expected, value
    for value in ["-1", "inf", "nan", "soon"]:
        with pytest.raises(ValueError, match=f"MCR_TIMEOUT: .* got '{value}'"):
            seconds("MCR_TIMEOUT", {"MCR_TIMEOUT": value})


def test_huge_environment_values(monkeypatch):
    """A count past a C ssize_t is refused naming its variable (it was an OverflowError deep in
    the core's import); a backend timeout of 1e300 s is 30 years (it overflowed timedelta)."""
    huge = str(sys.maxsize + 1)
    assert count("MCR_FLIGHT_KEEP", 1000, {"MCR_FLIGHT_KEEP": str(sys.maxsize)}) == sys.maxsize
    with pytest.raises(ValueError, match=f"MCR_FLIGHT_KEEP: expected a whole number from 1 to "
                                         f"{sys.maxsize}, got '{huge}'"):
        count("MCR_FLIGHT_KEEP", 1000, {"MCR_FLIGHT_KEEP": huge})
    monkeypatch.setenv("MCR_BACKEND_TIMEOUT", "1e300")
    assert store.timeout().total_seconds() == 1e9
    monkeypatch.setenv("MCR_BACKEND_TIMEOUT", "2.5")
    assert store.timeout().total_seconds() == 2.5


@pytest.mark.parametrize("name, value, error", [
    ("MCR_TIMEOUT", "soon", "MCR_TIMEOUT: expected a number of seconds >= 0 (0: none), got 'soon'"),
    ("MCR_CHECK", "maybe", "MCR_CHECK: expected 1 (on) or 0 (off), got 'maybe'"),
    ("MCR_FLIGHT_KEEP", "abc", "MCR_FLIGHT_KEEP: expected a whole number from 1 to"),
    ("MCR_FLIGHT_KEEP", "0", "MCR_FLIGHT_KEEP: expected a whole number from 1 to")])
def test_bad_environment_values_are_refused(tmp_path, name, value, error):
    code, out, _ = _run(tmp_path, 1, "", **{name: value})        # (HEAD makes COMM_WORLD)
    assert code != 0 and error in out, out


TRUNCATED = """
import torch
from mcr import MPI
from mcr._transports import BOUNDED_RECEIVES
print(f"rank {comm.rank}: set", all(os.environ.get(k) == v for k, v in BOUNDED_RECEIVES.items()))
N, CAP = 100000, 1000           # floats: far above every eager limit, into a buffer of 4 kB
for peer in ("self", "other"):
    src = dst = comm.rank if peer == "self" else comm.size - 1 - comm.rank
    for form in ("Recv", "Irecv", "Recv_init", "Sendrecv", "Mrecv"):
        whole = torch.full((N + 1000,), -1.0)
        buf = whole[:CAP]
        send = comm.Isend(torch.arange(N, dtype=torch.float32), dst, tag=3)
        try:
            if form == "Recv":
                comm.Recv(buf, src, tag=3)
            elif form == "Irecv":
                comm.Irecv(buf, src, tag=3).Wait()
            elif form == "Recv_init":
                req = comm.Recv_init(buf, src, tag=3)
                req.Start()
                try:
                    req.Wait()
                finally:
                    req.Free()
            elif form == "Sendrecv":
                comm.Sendrecv(torch.ones(1), dst, 4, buf, src, 3)
            else:
                comm.Mprobe(src, 3).Recv(buf)        # (mpi4py's Message)
            error = None
        except MPI.Exception as exc:
            error = exc.Get_error_class()
        send.Wait()
        if form == "Sendrecv":
            comm.Recv(torch.empty(1), src, tag=4)
        past = int((whole[CAP:] != -1.0).sum())
        print(f"rank {comm.rank}: {peer} {form} error {error} past {past}", flush=True)
"""


@pytest.mark.parametrize("transport", ["default", "tcp"])
def test_checked_mode_keeps_a_truncated_message_inside_its_buffer(tmp_path, transport):
    # Open MPI's RDMA protocols write all of a long message past a short receive buffer; checked
    # mode turns them off (mcr._transports): every form raises ERR_TRUNCATE, nothing is written
    # past the buffer's end, from oneself (self) or another rank (sm, or tcp)
    from mcr import MPI
    env = {"OMPI_MCA_btl": "self,tcp"} if transport == "tcp" else {}
    code, out, _ = _run(tmp_path, 2, TRUNCATED, MCR_CHECK=1, **env)
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("rank ")]
    assert sorted(x for x in lines if x.endswith(": set True")) == \
        ["rank 0: set True", "rank 1: set True"], out
    for rank in (0, 1):
        for peer in ("self", "other"):
            for form in ("Recv", "Irecv", "Recv_init", "Sendrecv", "Mrecv"):
                line = f"rank {rank}: {peer} {form} error {MPI.ERR_TRUNCATE} past 0"
                assert line in lines, (line, out)


def test_checked_mode_sets_only_the_transports_the_environment_lacks():
    # the three settings of debugging.rst; a setting of the user's stays; with checked mode off
    # nothing is set; MPI initialized before mcr is imported: nothing set, a warning says so
    show = ("import json, os, warnings\nwarnings.simplefilter('always')\n{first}import mcr\n"
            "print(json.dumps({{k: v for k, v in os.environ.items()\n"
            "                  if k.startswith('OMPI_MCA_')}}))")

    def settings(first="", **env):
        result = subprocess.run([sys.executable, "-c", show.format(first=first)], env=_env(**env),
                                capture_output=True, text=True, timeout=JOB_TIMEOUT)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.splitlines()[-1]), result.stderr

    base = {k: v for k, v in _env().items() if k.startswith("OMPI_MCA_")}
    bounded = {"OMPI_MCA_smsc": "^cma,knem,xpmem", "OMPI_MCA_btl_self_flags": "send,inplace",
               "OMPI_MCA_btl_tcp_flags": "send,inplace,need-ack,need-csum,hetero-rdma"}
    assert settings() == (base, "")
    assert settings(MCR_CHECK=0) == (base, "")
    assert settings(MCR_CHECK=1) == ({**base, **bounded}, "")
    mine = {"OMPI_MCA_smsc": "cma"}
    assert settings(MCR_CHECK=1, **mine) == ({**base, **bounded, **mine}, "")
    got, err = settings("from mpi4py import MPI\n", MCR_CHECK=1)
    assert got == base
    assert "MCR_CHECK: MPI was initialized before mcr was imported" in err, err


DIE = """
import torch
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
    code, out, took = _run(tmp_path, 3, DIE, where)
    assert code not in (None, 0), out
    assert took < 30 + 15, took          # 30 s, plus the job's start on a loaded machine
    out = " ".join(out.split()).lower()
    # Open MPI: "process rank 1 with PID ... exited on signal 9 (Killed)"; MPICH: "RANK 1 PID
    # ... KILLED BY SIGNAL: 9". On Gloo a survivor may fail first, on the closed connection (the
    # error names the peer's address), and the launcher names it: once in a few dozen runs
    named = "rank 1" in out and ("signal 9" in out or "signal: 9" in out)
    gloo_error = where != "mpi" and ("connection closed by peer" in out
                                     or "connection reset by peer" in out)
    assert named or gloo_error, out


HANG = """
import torch
print(f"rank {comm.rank}: waiting", flush=True)
comm.Recv(torch.zeros(4), source=(comm.rank + 1) % comm.size, tag=1)   # never sent
"""


def test_ctrl_c_on_mpiexec_ends_every_rank(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HEAD + HANG)
    with launch.start(2, [sys.executable, str(script)], env=_env(), stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True) as job:
        deadline, waiting = time.monotonic() + JOB_TIMEOUT, 0
        while waiting < 2 and time.monotonic() < deadline:
            line = job.process.stdout.readline()
            if not line:
                break
            waiting += "waiting" in line
        assert waiting == 2, waiting
        time.sleep(1)
        t0 = time.monotonic()
        job.process.send_signal(signal.SIGINT)       # what Ctrl-C sends mpiexec
        if MPICH:
            # Hydra passes the first Ctrl-C on to the ranks, inside MPI_Recv (no Python handler
            # runs), and says "Press Ctrl-C again to force abort"; Open MPI ends them at once
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
    leftovers = [pid for pid in pids if str(script).encode() in _cmdline(pid)]
    assert not leftovers, f"ranks still running after Ctrl-C: {leftovers}"


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_cost_benchmark_runs_and_checks_its_results():
    """mcr.bench.check checks its results: a line per operation, backend and size, each variant
    timed."""
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
