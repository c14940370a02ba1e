"""The demo (demo/demo.py) passes its own checks: started by itself (under mpiexec on 4
processes, as the README's quick start runs it) and under mpiexec at 1 and 3 processes."""

import os
import re
import subprocess
import sys

import pytest

from mcr import launch
from mpiharness import run_script, world_sizes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "demo", "demo.py")
# set by MPI launchers; the demo runs in place instead of starting itself
LAUNCHER_VARS = launch.LAUNCHER_VARS + ("MCR_DEMO_NPROCS",)


def passed(out, nprocs):
    procs = f"{nprocs} process{'es' if nprocs > 1 else ''}"
    return re.search(rf"^All \d+ checks passed on {procs}:", out, re.M) is not None


def test_demo_starts_itself_on_4_processes():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    try:
        proc = subprocess.run([sys.executable, DEMO, "--timeout", "200"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=240)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"python demo/demo.py did not finish in {exc.timeout:.0f} s")
    assert proc.returncode == 0, f"demo exited with {proc.returncode}:\n{proc.stdout}"
    assert "mpiexec" in proc.stdout and passed(proc.stdout, 4), proc.stdout
    assert "FAILED" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("nprocs", world_sizes([1, 3]))
def test_demo_under_mpiexec(nprocs):
    code, out = run_script(nprocs, [DEMO], timeout=200)
    assert code is not None, f"the demo did not finish in 200 s at {nprocs} processes:\n{out}"
    assert code == 0, f"demo exited with {code} at {nprocs} processes:\n{out}"
    assert passed(out, nprocs), out
