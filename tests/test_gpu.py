"""The GPU checks (tests/gpu/check_gpu.py) pass on a machine with a CUDA device.

The script runs its own jobs under mpiexec (MPI on CUDA tensors at 2 processes, NCCL at 1,
the two mixed, mcr.tune of NCCL against MPI and auto) within a time budget; here it runs
once, with a hard limit, skipped without a CUDA device. Its dry run on CPU tensors (Gloo
for NCCL, host staging for CUDA staging) tests the script itself where there is no GPU.
"""

import os
import subprocess
import sys

import pytest

from mcr import launch

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "gpu", "check_gpu.py")
LIMIT = 300
# set by MPI launchers; the script must start its own jobs
LAUNCHER_VARS = launch.LAUNCHER_VARS + ("MCR_DEMO_NPROCS",)


@pytest.mark.timeout(LIMIT + 30)
@pytest.mark.parametrize("args", [[], ["--device", "cpu"]], ids=["cuda", "dry_run_on_cpu"])
def test_gpu_checks(args):
    if not args and not torch.cuda.is_available():
        pytest.skip(f"no CUDA device (torch {torch.__version__}, "
                    f"torch.cuda.is_available() is False)")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    try:
        proc = subprocess.run([sys.executable, SCRIPT, *args, "--budget", str(LIMIT - 20)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=LIMIT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"tests/gpu/check_gpu.py did not finish in {exc.timeout:.0f} s")
    assert proc.returncode == 0, (f"check_gpu.py exited with {proc.returncode}:\n"
                                  f"{proc.stdout[-12000:]}")
    assert "RESULT PASS" in proc.stdout, proc.stdout[-12000:]
