"""GPU checks for mcr: the MPI backend on CUDA tensors, CUDA stream semantics,
the NCCL backend, and requests that mix MPI and NCCL.

    python tests/gpu/check_gpu.py                # on a machine with a CUDA device
    python tests/gpu/check_gpu.py --device cpu   # dry run: the same checks on CPU
                                                 # tensors, Gloo in place of NCCL
    python tests/gpu/check_gpu.py --logdir $OUT/gpu-logs   # keep every case's log

Without a CUDA device (and without ``--device cpu``) it prints
``check_gpu: skipped: no CUDA device`` and exits 0.

Started without ``--phase``, the script runs each part as its own job under
``mpiexec``, started by :mod:`mcr.launch` (``MCR_MPIEXEC`` overrides its
choice of mpiexec; this parent process does not initialize MPI), each with a
time limit, all within ``--budget`` seconds:

``mpi``         2 processes sharing cuda:0, MPI backend, the MPI library's own
                CUDA-awareness (the PyPI Open MPI is not CUDA-aware, so mcr
                stages CUDA buffers through pinned host memory);
``mpi-aware0``  the same with ``MCR_CUDA_AWARE=0`` (smaller sizes);
``nccl1``       1 process, NCCL (it refuses two ranks on one GPU): every
                collective, a CPU tensor refused, MPI and NCCL mixed;
``mixed2``      2 processes: MPI over both, NCCL over each process alone,
                requests of both completed together;
``nccl2``       2 processes on cuda:0 and cuda:1, only with two CUDA devices;
``tune``        1 process: ``mcr.tune`` times NCCL against MPI on CUDA tensors
                (4 B to 1 MiB, four collectives), then ``backend="auto"`` runs
                each Allreduce size on the backend the table chose.
``ext``         1 process: the logger, compression and fusion on CUDA tensors.
``workloads``   1 process (2 with two CUDA devices): ``mcr.bench.workloads``'s
                MoE, DLRM and DDP transformer steps on CUDA tensors, on mcr
                groups (auto and NCCL) and on torch's NCCL; losses must agree.
``torch``       1 process (2 with two CUDA devices): ``init_process_group("mcr")``,
                torch.distributed calls on CUDA tensors, and DDP on "mcr" groups
                running NCCL and MPI, with the losses of torch's own NCCL.

Every result is compared with what torch computes from the whole data on the
CPU (every process can compute every process's input), never with mcr. Rank 0
prints one PASS/FAIL line per operation (all modes, dtypes, buffer kinds and
sizes of it), with its time; ``--logdir`` keeps every case, and each job's
stderr. Exit status: 0 when every check passed (or there is no CUDA device),
1 when one failed, 2 when the checks could not be started.
"""

import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib

try:
    import torch
except ImportError as _exc:          # mcr needs torch: nothing to check without it
    torch = None
    _TORCH_ERROR = _exc

from mcr import launch

HERE = os.path.abspath(__file__)
DTYPES = ("float32", "float16", "bfloat16", "int64")
MODES = ("blocking", "nonblocking", "persistent")
SENTINEL = -3
SLEEP_CYCLES = 200_000_000           # torch.cuda._sleep: ~0.1 s at 2 GHz


# =============================================================================
# The parent: start each phase under mpiexec, collect, summarize
# =============================================================================

class Phase:
    def __init__(self, name, nprocs, limit, what, env=None, skip=None):
        self.name, self.nprocs, self.limit, self.what = name, nprocs, limit, what
        self.env = env or {}
        self.skip = skip                 # reason not to run it, or None


def phases(device, ndev):
    other = "gloo" if device == "cpu" else "nccl"
    two = None if device == "cpu" or ndev >= 2 else \
        f"needs 2 CUDA devices, found {ndev}"
    return [
        Phase("mpi", 2, 120, "MPI backend on 2 processes, the library's CUDA-awareness"),
        Phase("mpi-aware0", 2, 80, "MPI backend on 2 processes, MCR_CUDA_AWARE=0",
              env={"MCR_CUDA_AWARE": "0"}),
        Phase("nccl1", 1, 80, f"{other} backend on 1 process, mixed with MPI"),
        Phase("mixed2", 2, 60, f"MPI on 2 processes with {other} on each process alone"),
        Phase("nccl2", 2, 90, f"{other} backend on 2 processes (one device each)", skip=two),
        Phase("tune", 1, 90, f"mcr.tune of {other} against MPI, and backend='auto'"),
        Phase("ext", 1, 60, f"the logger, compression and fusion on {other} and MPI"),
        Phase("workloads", 2 if device == "cpu" or ndev >= 2 else 1, 150,
              f"the MoE, DLRM and DDP transformer steps on mcr groups and on torch's "
              f"own {other}, losses compared"),
        Phase("check", 2 if device == "cpu" or ndev >= 2 else 1, 60,
              f"checked mode and timeouts on {other} and MPI with {device} tensors"),
        Phase("torch", 2 if device == "cpu" or ndev >= 2 else 1, 120,
              f"DDP and torch.distributed calls on the 'mcr' backend ({other} and MPI) "
              f"against torch's own {other}"),
    ]


def threads_per_process(nprocs):
    """Torch threads per process: half the cores shared out (OpenMP threads
    spinning beside MPI's polling slow everything down when cores are short)."""
    return max(1, (os.cpu_count() or 2) // (2 * nprocs))


def pump(stream):
    """Echo a job's output as it comes: the progress lines."""
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()


def tail(path, lines):
    try:
        with open(path, errors="replace") as f:
            return f.readlines()[-lines:]
    except OSError:
        return []


def run_phase(ph, args, mpiexec, logdir, limit):
    """Run one phase; return (status, summary dict or None, seconds)."""
    summary = os.path.join(logdir, f"{ph.name}.json")
    errlog = os.path.join(logdir, f"{ph.name}.stderr")
    caselog = os.path.join(logdir, f"{ph.name}.cases")
    for path in (summary, caselog):
        with contextlib.suppress(OSError):
            os.remove(path)
    env = dict(os.environ)
    env.pop("MCR_BACKEND", None)             # the MPI checks run on the default backend
    env.pop("MCR_DEMO_NPROCS", None)
    env.update(ph.env, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", str(threads_per_process(ph.nprocs)))
    env.setdefault("MCR_BACKEND_TIMEOUT", "60")  # a stuck Gloo/NCCL call fails, not hangs
    argv = [sys.executable, "-u", HERE, "--phase", ph.name, "--device", args.device,
            "--summary", summary, "--caselog", caselog,
            "--hang-after", str(max(int(limit) - 8, 5))]
    print(f"check_gpu: phase {ph.name}: {ph.what} (limit {limit:.0f} s)", flush=True)
    t0 = time.monotonic()
    with open(errlog, "w") as err:
        err.write(" ".join(launch.command(ph.nprocs, mpiexec) + argv) + "\n")
        err.flush()
        with launch.start(ph.nprocs, argv, env=env, mpiexec=mpiexec, stdout=subprocess.PIPE,
                          stderr=err, text=True) as job:
            reader = threading.Thread(target=pump, args=(job.process.stdout,), daemon=True)
            reader.start()
            rc = job.wait(timeout=limit)
        reader.join(5)
    seconds = time.monotonic() - t0
    result = None
    with contextlib.suppress(OSError, ValueError):
        with open(summary) as f:
            result = json.load(f)
    if rc is None:
        status = "TIMEOUT"
        print(f"check_gpu: phase {ph.name} did not finish in {limit:.0f} s; killed it",
              flush=True)
    elif result is None:
        status = "ERROR"
        print(f"check_gpu: phase {ph.name} ended with exit status {rc} without a summary",
              flush=True)
    elif result["failed"] or rc != 0:
        status = "FAIL"
    else:
        status = "PASS"
    if status != "PASS" and (result is None or rc != 0):
        lines = tail(errlog, 30)
        if lines:
            print(f"check_gpu: last lines of {errlog}:", flush=True)
            for line in lines:
                print(f"    {line.rstrip()[:300]}", flush=True)
    return status, result, seconds


def parent(args):
    if torch is None:
        print(f"check_gpu: torch cannot be imported ({_TORCH_ERROR}); mcr needs it",
              file=sys.stderr)
        return 2
    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"check_gpu: skipped: no CUDA device (torch {torch.__version__}, "
              f"CUDA build {torch.version.cuda})", flush=True)
        return 0
    device = "cpu" if args.device == "cpu" else "cuda"
    args.device = device
    ndev = torch.cuda.device_count() if device == "cuda" else 0
    try:
        mpiexec = launch.find_mpiexec()
    except launch.MpiexecNotFoundError as exc:
        print(f"check_gpu: {exc}", file=sys.stderr)
        return 2
    logdir = args.logdir or tempfile.mkdtemp(prefix="mcr-gpu-check-")
    os.makedirs(logdir, exist_ok=True)
    start = time.monotonic()
    deadline = start + args.budget
    what = (f"{ndev} CUDA device(s), torch {torch.__version__} (CUDA {torch.version.cuda})"
            if device == "cuda" else f"DRY RUN on CPU tensors, torch {torch.__version__}")
    print(f"check_gpu: {what}; budget {args.budget:.0f} s; logs in {logdir}", flush=True)
    chosen = set(args.phases.split(",")) if args.phases else None
    rows, failures = [], []
    for ph in phases(device, ndev):
        if chosen is not None and ph.name not in chosen:
            continue
        if ph.skip:
            print(f"check_gpu: phase {ph.name}: SKIP ({ph.skip})", flush=True)
            rows.append((ph.name, "SKIP", ph.skip, 0.0))
            continue
        # ending a job that overran takes some seconds more (SIGTERM, then SIGKILL)
        remaining = deadline - time.monotonic() - 15
        if remaining < 20:
            rows.append((ph.name, "NOT RUN", "time budget spent", 0.0))
            failures.append(f"{ph.name}: not run, the time budget was spent")
            continue
        status, result, seconds = run_phase(ph, args, mpiexec, logdir,
                                            min(ph.limit, remaining))
        if result is not None:
            detail = f"{result['passed']} checks passed, {len(result['failed'])} failed"
            failures += [f"{ph.name}: {f}" for f in result["failed"]]
        else:
            detail = "no summary"
        if status in ("TIMEOUT", "ERROR"):
            failures.append(f"{ph.name}: {status.lower()} (see {ph.name}.stderr, "
                            f"{ph.name}.cases in {logdir})")
        rows.append((ph.name, status, detail, seconds))
    total = time.monotonic() - start
    print("check_gpu: summary", flush=True)
    for name, status, detail, seconds in rows:
        print(f"  {name:<11} {status:<7} {detail:<40} {seconds:6.1f} s")
    for f in failures[:15]:
        print(f"  FAIL {short(f, 220)}")
    if len(failures) > 15:
        print(f"  ... {len(failures) - 15} more in {logdir}")
    if failures:
        print(f"check_gpu: RESULT FAIL ({len(failures)} failure(s)) in {total:.0f} s; "
              f"logs in {logdir}", flush=True)
        return 1
    dry = " (dry run on CPU)" if device == "cpu" else ""
    print(f"check_gpu: RESULT PASS in {total:.0f} s{dry}; logs in {logdir}", flush=True)
    return 0


# =============================================================================
# The checks, run by every process of a phase
# =============================================================================

class CheckFailed(AssertionError):
    """A result differs from what torch computes."""


class Note(Exception):
    """Not a failure: a limitation worth reporting (printed as NOTE)."""


def make_data(key, n, dtype):
    """The same input on every process: seeded by `key`."""
    g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 8).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int64).to(dtype)


def fold(op, xs):
    """MPI's predefined reduction `op` of `xs` in rank order, in their dtype."""
    acc = xs[0].clone()
    for x in xs[1:]:
        if op == "SUM":
            acc = acc + x
        elif op == "MAX":
            acc = acc.maximum(x)
        elif op == "BAND":
            acc = acc & x
        else:
            raise ValueError(op)
    return acc


def vcounts(n, size):
    """Uneven block sizes (zero for n=1 on rank 0)."""
    return [max(n - 1 + i % 3, 0) for i in range(size)]


def gapped(counts):
    """Displacements leaving a one-element gap between blocks."""
    return [sum(counts[:i]) + i for i in range(len(counts))]


def packed(counts):
    return [sum(counts[:i]) for i in range(len(counts))]


def a2a_count(n, size, src, dst):
    return max(n // size - 1 + (src + 2 * dst) % 3, 0)


def compare(got, expected, what):
    if got.dtype != expected.dtype or got.shape != expected.shape:
        raise CheckFailed(f"{what}: got {got.dtype} {tuple(got.shape)}, expected "
                          f"{expected.dtype} {tuple(expected.shape)}")
    if torch.equal(got, expected):
        return
    bad = (got != expected).nonzero().flatten()
    i = int(bad[0])
    raise CheckFailed(f"{what}: {bad.numel()} of {got.numel()} elements differ, first at "
                      f"[{i}]: got {got[i].item()}, expected {expected[i].item()}")


class CudaArray:
    """A CUDA buffer seen only through __cuda_array_interface__ (as CuPy or Numba
    arrays are)."""

    def __init__(self, t):
        self._t = t

    @property
    def __cuda_array_interface__(self):
        return self._t.__cuda_array_interface__


class DLPackArray:
    """A buffer seen only through the DLPack protocol."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, *args, **kwargs):
        return self._t.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


class Ctx:
    """Where the checks run: a communicator, a backend, a device, and what the
    checks need from the device (streams are no-ops on the CPU dry run)."""

    def __init__(self, MPI, comm, backend, device):
        self.MPI, self.comm = MPI, comm
        self.backend = backend                   # None: the communicator's default (MPI)
        self.name = backend or "mpi"
        self.kw = {} if backend is None else {"backend": backend}
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.device = device
        self.cuda = device.type == "cuda"

    # -- buffers --------------------------------------------------------------

    def data(self, key, n, dtype):
        return make_data(key, n, dtype)

    def sentinel(self, n, dtype):
        return torch.full((n,), SENTINEL, dtype=dtype)

    def fresh(self, n, dtype):
        return torch.full((n,), SENTINEL, dtype=dtype, device=self.device)

    def dev(self, host):
        return host.to(self.device) if self.cuda else host.clone()

    def put(self, dst, host):
        """Write `host` into `dst`, ordered on the current stream (the last step
        is a device-to-device copy that the host does not wait for)."""
        dst.copy_(host.to(self.device) if self.cuda else host)

    def expect(self, actual, expected, what):
        """`actual`, read on the current stream, equals `expected` (on the host)."""
        compare(actual.cpu() if self.cuda else actual.clone(), expected, what)

    def wrap(self, t, kind):
        if kind == "tensor":
            return t
        if kind == "dlpack":
            return DLPackArray(t)
        return CudaArray(t) if self.cuda else t.numpy()     # "cai"; numpy on the dry run

    # -- streams --------------------------------------------------------------

    def new_stream(self):
        return torch.cuda.Stream(device=self.device) if self.cuda else None

    def use(self, stream):
        return torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext()

    def sleep(self):
        if self.cuda:
            torch.cuda._sleep(SLEEP_CYCLES)

    def busy(self, stream):
        return self.cuda and not stream.query()

    def sync(self, stream):
        if self.cuda:
            stream.synchronize()

    def host_async(self, t):
        """A copy of `t` to pinned host memory, queued on the current stream."""
        if not self.cuda:
            return t.clone()
        h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        h.copy_(t, non_blocking=True)
        return h


def nonblocking_name(name):
    return "I" + name[0].lower() + name[1:]


def run_mode(t, mode, name, args, kw, fill, verify):
    """Call comm.<name> (blocking), I<name> + Wait, or <name>_init + Start/Wait
    twice (new inputs written on the stream before the second Start).
    fill(round) writes the inputs and returns the expected result."""
    kw = dict(kw, **t.kw)
    expected = fill(0)
    if mode == "blocking":
        getattr(t.comm, name)(*args, **kw)
        verify(expected)
    elif mode == "nonblocking":
        req = getattr(t.comm, nonblocking_name(name))(*args, **kw)
        req.Wait()
        verify(expected)
    else:
        req = getattr(t.comm, name + "_init")(*args, **kw)
        try:
            for rnd in range(2):
                if rnd:
                    expected = fill(1)
                req.Start()
                req.Wait()
                verify(expected)
        finally:
            with contextlib.suppress(Exception):
                req.Free()


# -- the operations: each writes inputs, calls mcr, compares with torch --------

def op_allreduce(t, dtype, n, kind, mode, op="SUM", in_place=False):
    P, r = t.size, t.rank
    send, recv = t.fresh(n, dtype), t.fresh(n, dtype)

    def fill(rnd):
        xs = [t.data(("allreduce", op, in_place, rnd, i), n, dtype) for i in range(P)]
        if in_place:
            t.put(recv, xs[r])
        else:
            t.put(send, xs[r])
            t.put(recv, t.sentinel(n, dtype))
        return fold(op, xs)
    sendspec = t.MPI.IN_PLACE if in_place else t.wrap(send, kind)
    run_mode(t, mode, "Allreduce", (sendspec, t.wrap(recv, kind)),
             {"op": getattr(t.MPI, op)}, fill, lambda e: t.expect(recv, e, "recvbuf"))


def op_bcast(t, dtype, n, kind, mode):
    root = t.size - 1
    buf = t.fresh(n, dtype)

    def fill(rnd):
        x = t.data(("bcast", rnd), n, dtype)
        t.put(buf, x if t.rank == root else t.sentinel(n, dtype))
        return x
    run_mode(t, mode, "Bcast", (t.wrap(buf, kind),), {"root": root}, fill,
             lambda e: t.expect(buf, e, "buf"))


def op_gather(t, dtype, n, kind, mode):
    P, r, root = t.size, t.rank, t.size - 1
    send = t.fresh(n, dtype)
    recv = t.fresh(n * P, dtype) if r == root else None

    def fill(rnd):
        xs = [t.data(("gather", rnd, i), n, dtype) for i in range(P)]
        t.put(send, xs[r])
        if recv is not None:
            t.put(recv, t.sentinel(n * P, dtype))
        return torch.cat(xs)
    run_mode(t, mode, "Gather",
             (t.wrap(send, kind), None if recv is None else t.wrap(recv, kind)),
             {"root": root}, fill, lambda e: recv is None or t.expect(recv, e, "recvbuf"))


def op_gatherv(t, dtype, n, kind, mode):
    P, r, root = t.size, t.rank, t.size - 1
    counts = vcounts(n, P)
    displs = gapped(counts)
    total = sum(counts) + P
    send = t.fresh(counts[r], dtype)
    recv = t.fresh(total, dtype) if r == root else None

    def fill(rnd):
        xs = [t.data(("gatherv", rnd, i), counts[i], dtype) for i in range(P)]
        t.put(send, xs[r])
        exp = t.sentinel(total, dtype)
        for i in range(P):
            exp[displs[i]:displs[i] + counts[i]] = xs[i]
        if recv is not None:
            t.put(recv, t.sentinel(total, dtype))
        return exp
    spec = None if recv is None else [t.wrap(recv, kind), counts, displs]
    run_mode(t, mode, "Gatherv", (t.wrap(send, kind), spec), {"root": root}, fill,
             lambda e: recv is None or t.expect(recv, e, "recvbuf"))


def op_scatter(t, dtype, n, kind, mode):
    P, r, root = t.size, t.rank, t.size - 1
    send = t.fresh(n * P, dtype) if r == root else None
    recv = t.fresh(n, dtype)

    def fill(rnd):
        whole = t.data(("scatter", rnd), n * P, dtype)
        if send is not None:
            t.put(send, whole)
        t.put(recv, t.sentinel(n, dtype))
        return whole[r * n:(r + 1) * n].clone()
    run_mode(t, mode, "Scatter",
             (None if send is None else t.wrap(send, kind), t.wrap(recv, kind)),
             {"root": root}, fill, lambda e: t.expect(recv, e, "recvbuf"))


def op_scatterv(t, dtype, n, kind, mode):
    P, r, root = t.size, t.rank, t.size - 1
    counts = vcounts(n, P)
    displs = gapped(counts)
    total = sum(counts) + P
    send = t.fresh(total, dtype) if r == root else None
    recv = t.fresh(counts[r], dtype)

    def fill(rnd):
        whole = t.data(("scatterv", rnd), total, dtype)
        if send is not None:
            t.put(send, whole)
        t.put(recv, t.sentinel(counts[r], dtype))
        return whole[displs[r]:displs[r] + counts[r]].clone()
    spec = None if send is None else [t.wrap(send, kind), counts, displs]
    run_mode(t, mode, "Scatterv", (spec, t.wrap(recv, kind)), {"root": root}, fill,
             lambda e: t.expect(recv, e, "recvbuf"))


def op_allgather(t, dtype, n, kind, mode):
    P, r = t.size, t.rank
    send, recv = t.fresh(n, dtype), t.fresh(n * P, dtype)

    def fill(rnd):
        xs = [t.data(("allgather", rnd, i), n, dtype) for i in range(P)]
        t.put(send, xs[r])
        t.put(recv, t.sentinel(n * P, dtype))
        return torch.cat(xs)
    run_mode(t, mode, "Allgather", (t.wrap(send, kind), t.wrap(recv, kind)), {}, fill,
             lambda e: t.expect(recv, e, "recvbuf"))


def op_allgatherv(t, dtype, n, kind, mode):
    P, r = t.size, t.rank
    counts = vcounts(n, P)
    displs = gapped(counts)
    total = sum(counts) + P
    send, recv = t.fresh(counts[r], dtype), t.fresh(total, dtype)

    def fill(rnd):
        xs = [t.data(("allgatherv", rnd, i), counts[i], dtype) for i in range(P)]
        t.put(send, xs[r])
        t.put(recv, t.sentinel(total, dtype))
        exp = t.sentinel(total, dtype)
        for i in range(P):
            exp[displs[i]:displs[i] + counts[i]] = xs[i]
        return exp
    run_mode(t, mode, "Allgatherv", (t.wrap(send, kind), [t.wrap(recv, kind), counts, displs]),
             {}, fill, lambda e: t.expect(recv, e, "recvbuf"))


def op_alltoall(t, dtype, n, kind, mode):
    P, r = t.size, t.rank
    send, recv = t.fresh(n * P, dtype), t.fresh(n * P, dtype)

    def fill(rnd):
        t.put(send, torch.cat([t.data(("alltoall", rnd, r, j), n, dtype) for j in range(P)]))
        t.put(recv, t.sentinel(n * P, dtype))
        return torch.cat([t.data(("alltoall", rnd, i, r), n, dtype) for i in range(P)])
    run_mode(t, mode, "Alltoall", (t.wrap(send, kind), t.wrap(recv, kind)), {}, fill,
             lambda e: t.expect(recv, e, "recvbuf"))


def op_alltoallv(t, dtype, n, kind, mode):
    P, r = t.size, t.rank
    scounts = [a2a_count(n, P, r, j) for j in range(P)]
    rcounts = [a2a_count(n, P, i, r) for i in range(P)]
    sdispls, rdispls = packed(scounts), gapped(rcounts)
    rtotal = sum(rcounts) + P
    send, recv = t.fresh(sum(scounts), dtype), t.fresh(rtotal, dtype)

    def fill(rnd):
        t.put(send, torch.cat([t.data(("alltoallv", rnd, r, j), scounts[j], dtype)
                               for j in range(P)]))
        t.put(recv, t.sentinel(rtotal, dtype))
        exp = t.sentinel(rtotal, dtype)
        for i in range(P):
            exp[rdispls[i]:rdispls[i] + rcounts[i]] = t.data(("alltoallv", rnd, i, r),
                                                             rcounts[i], dtype)
        return exp
    run_mode(t, mode, "Alltoallv", ([t.wrap(send, kind), scounts, sdispls],
                                    [t.wrap(recv, kind), rcounts, rdispls]),
             {}, fill, lambda e: t.expect(recv, e, "recvbuf"))


def op_reduce(t, dtype, n, kind, mode):
    P, r, root = t.size, t.rank, t.size - 1
    send = t.fresh(n, dtype)
    recv = t.fresh(n, dtype) if r == root else None

    def fill(rnd):
        xs = [t.data(("reduce", rnd, i), n, dtype) for i in range(P)]
        t.put(send, xs[r])
        if recv is not None:
            t.put(recv, t.sentinel(n, dtype))
        return fold("SUM", xs)
    run_mode(t, mode, "Reduce",
             (t.wrap(send, kind), None if recv is None else t.wrap(recv, kind)),
             {"op": t.MPI.SUM, "root": root}, fill,
             lambda e: recv is None or t.expect(recv, e, "recvbuf"))


def op_reduce_scatter(t, dtype, n, kind, mode):
    P, r = t.size, t.rank
    counts = vcounts(n, P)
    total = sum(counts)
    start = sum(counts[:r])
    send, recv = t.fresh(total, dtype), t.fresh(counts[r], dtype)

    def fill(rnd):
        xs = [t.data(("reduce_scatter", rnd, i), total, dtype) for i in range(P)]
        t.put(send, xs[r])
        t.put(recv, t.sentinel(counts[r], dtype))
        return fold("SUM", xs)[start:start + counts[r]].clone()
    run_mode(t, mode, "Reduce_scatter", (t.wrap(send, kind), t.wrap(recv, kind), counts),
             {"op": t.MPI.SUM}, fill, lambda e: t.expect(recv, e, "recvbuf"))


def op_reduce_scatter_block(t, dtype, n, kind, mode):
    P, r = t.size, t.rank
    send, recv = t.fresh(n * P, dtype), t.fresh(n, dtype)

    def fill(rnd):
        xs = [t.data(("reduce_scatter_block", rnd, i), n * P, dtype) for i in range(P)]
        t.put(send, xs[r])
        t.put(recv, t.sentinel(n, dtype))
        return fold("SUM", xs)[r * n:(r + 1) * n].clone()
    run_mode(t, mode, "Reduce_scatter_block", (t.wrap(send, kind), t.wrap(recv, kind)),
             {"op": t.MPI.SUM}, fill, lambda e: t.expect(recv, e, "recvbuf"))


def op_scan(t, dtype, n, kind, mode, exclusive=False):
    P, r = t.size, t.rank
    send, recv = t.fresh(n, dtype), t.fresh(n, dtype)
    name = "Exscan" if exclusive else "Scan"

    def fill(rnd):
        xs = [t.data((name, rnd, i), n, dtype) for i in range(P)]
        t.put(send, xs[r])
        t.put(recv, t.sentinel(n, dtype))
        if exclusive:
            return fold("SUM", xs[:r]) if r > 0 else None    # rank 0: undefined
        return fold("SUM", xs[:r + 1])
    run_mode(t, mode, name, (t.wrap(send, kind), t.wrap(recv, kind)), {"op": t.MPI.SUM},
             fill, lambda e: e is None or t.expect(recv, e, "recvbuf"))


def op_barrier(t, dtype, n, kind, mode):
    run_mode(t, mode, "Barrier", (), {}, lambda rnd: None, lambda e: None)


def op_p2p(t, dtype, n, kind, mode):
    """A ring: each process sends to the next and receives from the previous."""
    P, r = t.size, t.rank
    dest, source, tag = (r + 1) % P, (r - 1) % P, 7
    send, recv = t.fresh(n, dtype), t.fresh(n, dtype)
    s, rv, kw, comm, MPI = t.wrap(send, kind), t.wrap(recv, kind), t.kw, t.comm, t.MPI

    def fill(rnd):
        t.put(send, t.data(("p2p", rnd, r), n, dtype))
        t.put(recv, t.sentinel(n, dtype))
        return t.data(("p2p", rnd, source), n, dtype)

    def check_status(st):
        if st.Get_source() != source or st.Get_tag() != tag or st.Get_count() != n:
            raise CheckFailed(f"status: source {st.Get_source()}, tag {st.Get_tag()}, count "
                              f"{st.Get_count()}; expected {source}, {tag}, {n}")
    expected = fill(0)
    if mode == "blocking":
        st = MPI.Status()
        if P == 1:
            req = comm.Isend(s, dest, tag, **kw)
            comm.Recv(rv, source, tag, st, **kw)
            req.Wait()
        elif r % 2 == 0:                  # even first send, odd first receive
            comm.Send(s, dest, tag, **kw)
            comm.Recv(rv, source, tag, st, **kw)
        else:
            comm.Recv(rv, source, tag, st, **kw)
            comm.Send(s, dest, tag, **kw)
        t.expect(recv, expected, "recv buf")
        check_status(st)
    elif mode == "nonblocking":
        reqs = [comm.Irecv(rv, source, tag, **kw), comm.Isend(s, dest, tag, **kw)]
        statuses = [MPI.Status(), MPI.Status()]
        MPI.Request.Waitall(reqs, statuses)
        t.expect(recv, expected, "recv buf")
        check_status(statuses[0])
    else:
        reqs = [comm.Recv_init(rv, source, tag, **kw), comm.Send_init(s, dest, tag, **kw)]
        try:
            for rnd in range(2):
                if rnd:
                    expected = fill(1)
                MPI.Prequest.Startall(reqs)
                MPI.Request.Waitall(reqs)
                t.expect(recv, expected, f"recv buf (start {rnd + 1})")
        finally:
            for q in reqs:
                with contextlib.suppress(Exception):
                    q.Free()


# (title, function, options): the core set is what the MPI phases run in full
CORE_OPS = [
    ("Allreduce", op_allreduce, {}),
    ("Allreduce IN_PLACE", functools.partial(op_allreduce, in_place=True), {"kinds": ("tensor",)}),
    ("Bcast", op_bcast, {}),
    ("Allgatherv", op_allgatherv, {}),
    ("Alltoallv", op_alltoallv, {}),
    ("Gatherv", op_gatherv, {}),
    ("Reduce_scatter", op_reduce_scatter, {}),
    ("Scan", op_scan, {}),
    ("Send/Recv", op_p2p, {"p2p": True}),
]
EXTRA_OPS = [
    ("Barrier", op_barrier, {"dtypeless": True}),
    ("Allreduce MAX", functools.partial(op_allreduce, op="MAX"), {}),
    ("Allreduce BAND", functools.partial(op_allreduce, op="BAND"), {"dtypes": ("int64",)}),
    ("Gather", op_gather, {}),
    ("Scatter", op_scatter, {}),
    ("Scatterv", op_scatterv, {}),
    ("Allgather", op_allgather, {}),
    ("Alltoall", op_alltoall, {}),
    ("Reduce", op_reduce, {}),
    ("Reduce_scatter_block", op_reduce_scatter_block, {}),
    ("Exscan", functools.partial(op_scan, exclusive=True), {}),
]


def guarded(func, t, dtype, n, kind, mode):
    try:
        func(t, dtype, n, kind, mode)
    except (TypeError, ValueError, BufferError) as exc:
        # __cuda_array_interface__ has no bfloat16 type string that torch reads
        # ("<V2"): mcr's own refusal, naming the interface, is a limitation,
        # not a failure (torch's bare message would be)
        if (kind == "cai" and dtype == torch.bfloat16 and t.cuda and isinstance(exc, TypeError)
                and "cannot be read through __cuda_array_interface__" in str(exc)):
            raise Note(f"bfloat16 through __cuda_array_interface__ refused: "
                       f"{type(exc).__name__}: {exc}") from None
        raise


def op_cases(t, func, opts, modes, dtypes, kinds):
    """(label, callable) for every mode x dtype x buffer kind x size."""
    cases = []
    for mode in modes:
        if opts.get("dtypeless"):
            cases.append((mode, functools.partial(func, t, None, 0, "tensor", mode)))
            continue
        for dname in opts.get("dtypes", dtypes):
            dtype = getattr(torch, dname)
            for kind, sizes in kinds:
                if kind not in opts.get("kinds", (kind,)):
                    continue
                if kind == "cai" and not t.cuda and dname == "bfloat16":
                    continue                 # numpy has no bfloat16
                shown = "numpy" if kind == "cai" and not t.cuda else kind
                for n in sizes:
                    cases.append((f"{mode} {dname} {shown} n={n}",
                                  functools.partial(guarded, func, t, dtype, n, kind, mode)))
    return cases


def run_ops(rep, t, ops, dtypes, kinds, modes=MODES):
    for title, func, opts in ops:
        if opts.get("p2p") and t.size == 1 and t.backend is not None:
            rep.say(f"SKIP {t.name} {title}: send to self is not supported on {t.name}")
            continue
        rep.group(f"{t.name} {title}", op_cases(t, func, opts, modes, dtypes, kinds))


def matrix(t, dtypes, kinds):
    """The cases of each operation, in words."""
    names = {"cai": "__cuda_array_interface__" if t.cuda else "numpy", "dlpack": "__dlpack__"}
    sizes = "; ".join(f"{names.get(k, k)} n={','.join(map(str, ns))}" for k, ns in kinds)
    return f"{'/'.join(MODES)} x {'/'.join(dtypes)} x {sizes}"


def big(t):
    return 1 << 20 if t.cuda else 1 << 16


def full_kinds(t):
    return (("tensor", (1, 1000, big(t))), ("cai", (1000,)), ("dlpack", (1000,)))


def quick_kinds(t):
    return (("tensor", (1, 1000)), ("cai", (1000,)), ("dlpack", (1000,)))


# -- stream semantics ------------------------------------------------------------

def stream_cases(t):
    """DESIGN.md: the communication waits for work queued on the caller's
    current stream; Wait() makes the caller's current stream wait for the result."""
    n = big(t)
    P, r = t.size, t.rank
    f32 = torch.float32
    expected = torch.full((n,), float(sum(i + 2 for i in range(P))), dtype=f32)
    comm, kw = t.comm, t.kw

    def start(stream):
        with t.use(stream):
            x = torch.ones(n, dtype=f32, device=t.device)
            y = torch.full((n,), -1.0, dtype=f32, device=t.device)
        t.sync(stream)
        return x, y

    def queued(stream, x):
        """Queue a long kernel and then the write of the send buffer."""
        t.sleep()
        x.add_(r + 1)
        return t.busy(stream)

    def verdict(busy):
        if t.cuda and not busy:
            raise Note("the queued kernel had already finished when mcr was called: "
                       "inconclusive (raise SLEEP_CYCLES)")
        return "kernel still running at the call" if t.cuda else "dry run"

    def blocking():
        s = t.new_stream()
        x, y = start(s)
        with t.use(s):
            busy = queued(s, x)
            comm.Allreduce(x, y, **kw)
            h = t.host_async(y)          # no host synchronization before this
        t.sync(s)
        compare(h, expected, "recvbuf read on the caller's stream")
        return verdict(busy)

    def nonblocking():
        s = t.new_stream()
        x, y = start(s)
        with t.use(s):
            busy = queued(s, x)
            req = comm.Iallreduce(x, y, **kw)
            req.Wait()
            h = t.host_async(y)
        t.sync(s)
        compare(h, expected, "recvbuf read on the caller's stream after Wait")
        return verdict(busy)

    def persistent():
        s = t.new_stream()
        x, y = start(s)
        req = comm.Allreduce_init(x, y, **kw)
        try:
            with t.use(s):
                busy = queued(s, x)
                req.Start()
                req.Wait()
                h = t.host_async(y)
            t.sync(s)
        finally:
            with contextlib.suppress(Exception):
                req.Free()
        compare(h, expected, "recvbuf read on the caller's stream after Start/Wait")
        return verdict(busy)

    def wait_on_other_stream():
        # posted on s1, which then stays busy; waited on s2: the result must be
        # ordered on s2 (a copy-back queued on s1 would land after s2 reads)
        s1, s2 = t.new_stream(), t.new_stream()
        x, y = start(s1)
        with t.use(s1):
            busy = queued(s1, x)
            req = comm.Iallreduce(x, y, **kw)
            t.sleep()
        with t.use(s2):
            req.Wait()
            h = t.host_async(y)
        t.sync(s2)
        late = t.busy(s1)
        t.sync(s1)
        compare(h, expected, "recvbuf read on the stream current at Wait")
        if t.cuda and not late:
            raise Note("the posting stream was idle when the result was read: inconclusive")
        return verdict(busy)

    return [("Allreduce after queued writes", blocking),
            ("Iallreduce after queued writes + Wait", nonblocking),
            ("Allreduce_init Start after queued writes", persistent),
            ("Wait orders the stream current at Wait", wait_on_other_stream)]


def run_streams(rep, t):
    for title, fn in stream_cases(t):
        rep.group(f"{t.name} {title}", [("", fn)])


# -- backends mixed --------------------------------------------------------------

def mixed_cases(tm, tb):
    """tm: MPI on CUDA buffers; tb: the other backend (NCCL, Gloo on the dry run)."""
    MPI = tm.MPI
    f32 = torch.float32
    n = 1 << 16

    def allreduce(t, key):
        xs = [t.data((key, i), n, f32) for i in range(t.size)]
        return t.dev(xs[t.rank]), t.fresh(n, f32), fold("SUM", xs)

    def allgatherv(t, key):
        counts = vcounts(n, t.size)
        displs = gapped(counts)
        total = sum(counts) + t.size
        xs = [t.data((key, i), counts[i], f32) for i in range(t.size)]
        exp = t.sentinel(total, f32)
        for i in range(t.size):
            exp[displs[i]:displs[i] + counts[i]] = xs[i]
        return t.dev(xs[t.rank]), t.fresh(total, f32), exp, (counts, displs)

    def post_all():
        """Four requests: MPI Iallreduce, backend Iallreduce, MPI Ibcast,
        backend Iallgatherv (composed: it unpacks at completion)."""
        a = allreduce(tm, "mix-mpi")
        b = allreduce(tb, "mix-other")
        c = tm.dev(tm.data(("mix-bcast",), n, f32)) if tm.rank == 0 else tm.fresh(n, f32)
        c_exp = tm.data(("mix-bcast",), n, f32)
        d = allgatherv(tb, "mix-agv")
        reqs = [tm.comm.Iallreduce(a[0], a[1], **tm.kw),
                tb.comm.Iallreduce(b[0], b[1], **tb.kw),
                tm.comm.Ibcast(c, root=0, **tm.kw),
                tb.comm.Iallgatherv(d[0], [d[1], d[3][0], d[3][1]], **tb.kw)]

        def verify():
            tm.expect(a[1], a[2], "MPI Iallreduce recvbuf")
            tb.expect(b[1], b[2], f"{tb.name} Iallreduce recvbuf")
            tm.expect(c, c_exp, "MPI Ibcast buf")
            tb.expect(d[1], d[2], f"{tb.name} Iallgatherv recvbuf")
        return reqs, verify

    def blocking_other_during_mpi():
        x, y, exp = allreduce(tm, "mix1-mpi")
        req = tm.comm.Iallreduce(x, y, **tm.kw)
        a, b, exp_b = allreduce(tb, "mix1-other")
        tb.comm.Allreduce(a, b, **tb.kw)
        req.Wait()
        tm.expect(y, exp, "MPI Iallreduce recvbuf")
        tb.expect(b, exp_b, f"{tb.name} Allreduce recvbuf")

    def waitall():
        reqs, verify = post_all()
        statuses = [MPI.Status() for _ in reqs]
        MPI.Request.Waitall(reqs, statuses)
        verify()

    def testall():
        reqs, verify = post_all()
        deadline = time.monotonic() + 30
        while not MPI.Request.Testall(reqs):
            if time.monotonic() > deadline:
                raise CheckFailed("Testall still False after 30 s")
        verify()

    def waitany():
        reqs, verify = post_all()
        seen = []
        while True:
            i = MPI.Request.Waitany(reqs)
            if i == MPI.UNDEFINED:
                break
            if i in seen or len(seen) > len(reqs):
                raise CheckFailed(f"Waitany returned {i} again (seen {seen})")
            seen.append(i)
        if sorted(seen) != list(range(len(reqs))):
            raise CheckFailed(f"Waitany completed {sorted(seen)}, expected all of 0..3")
        verify()

    def waitsome():
        reqs, verify = post_all()
        seen = []
        while True:
            got = MPI.Request.Waitsome(reqs)
            if got is None:
                break
            if not got or set(got) & set(seen):
                raise CheckFailed(f"Waitsome returned {got} (seen {seen})")
            seen += got
        if sorted(seen) != list(range(len(reqs))):
            raise CheckFailed(f"Waitsome completed {sorted(seen)}, expected all of 0..3")
        verify()

    return [(f"MPI Iallreduce, {tb.name} Allreduce, MPI Wait", blocking_other_during_mpi),
            (f"Waitall over MPI + {tb.name} requests", waitall),
            (f"Testall loop over MPI + {tb.name} requests", testall),
            (f"Waitany loop over MPI + {tb.name} requests", waitany),
            (f"Waitsome loop over MPI + {tb.name} requests", waitsome)]


def run_mixed(rep, tm, tb):
    for title, fn in mixed_cases(tm, tb):
        rep.group(title, [("", fn)])


# -- errors ------------------------------------------------------------------------

def expect_error(fn, words):
    try:
        fn()
    except Exception as exc:         # any type: the text is what is checked
        text = f"{type(exc).__name__}: {exc}"
        missing = [w for w in words if w not in str(exc)]
        if missing:
            raise CheckFailed(f"the error does not name {missing}: {text}") from None
        return text
    raise CheckFailed("no error raised")


def wrong_device_cases(t):
    """A buffer the backend cannot serve is refused, naming the backend, and the
    communicator stays usable."""
    def cpu_tensor_on_backend():
        x, y = torch.ones(4), torch.empty(4)
        return expect_error(lambda: t.comm.Allreduce(x, y, backend="nccl"), ["nccl"])

    def cuda_tensor_on_gloo():
        x, y = torch.ones(4, device=t.device), torch.empty(4, device=t.device)
        return expect_error(lambda: t.comm.Allreduce(x, y, backend="gloo"), ["gloo"])

    def still_usable():
        x = t.dev(torch.ones(8))
        y = t.fresh(8, torch.float32)
        t.comm.Allreduce(x, y, **t.kw)
        t.expect(y, torch.full((8,), float(t.size)), "recvbuf after the refused call")
    cases = [("CPU tensor with backend='nccl'", cpu_tensor_on_backend)]
    if t.cuda:
        cases.append(("CUDA tensor with backend='gloo'", cuda_tensor_on_gloo))
    cases.append((f"{t.name} works after the refused calls", still_usable))
    return cases


# -- reporting ------------------------------------------------------------------------

def short(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Reporter:
    """Runs groups of cases on every process in the same order; rank 0 prints
    one line per group and writes every case to the case log."""

    def __init__(self, hc, phase, caselog):
        self.hc, self.phase = hc, phase
        self.rank = hc.Get_rank()
        self.passed = 0
        self.failed = []
        self.notes = []
        self.log = open(caselog, "a") if caselog and self.rank == 0 else None
        self.t0 = time.monotonic()

    def section(self, title=None):
        """Start a section (None: end the last one); prints the time of the last."""
        now = time.monotonic()
        if getattr(self, "current", None):
            self.say(f"-- {now - self.since:.1f} s")
        self.current, self.since = title, now
        if title:
            self.say(f"== {title}")

    def say(self, text):
        if self.rank == 0:
            print(f"[{self.phase}] {text}", flush=True)
            self.write(text)

    def write(self, text):
        if self.log is not None:
            self.log.write(text + "\n")
            self.log.flush()

    def group(self, title, cases):
        t0 = time.monotonic()
        fails, notes, infos, lines = [], [], [], []
        for label, fn in cases:
            c0 = time.monotonic()
            try:
                info = fn()
                if isinstance(info, str):
                    infos.append(info)
                outcome = "ok"
            except Note as exc:
                notes.append(f"{label}: {exc}" if label else str(exc))
                outcome = f"note: {exc}"
            except Exception as exc:             # reported, never fatal
                fails.append(short(f"{label}: {type(exc).__name__}: {exc}" if label
                                   else f"{type(exc).__name__}: {exc}"))
                outcome = f"FAIL: {type(exc).__name__}: {exc}\n" + traceback.format_exc()
            lines.append(f"    {label or title}: {outcome} ({time.monotonic() - c0:.3f} s)")
        everyone = self.hc.allgather((fails, notes, lines))
        seconds = time.monotonic() - t0
        if self.rank != 0:
            return
        allfails = [f"rank {r}: {f}" for r, (fs, _, _) in enumerate(everyone) for f in fs]
        allnotes = list(dict.fromkeys(n for _, ns, _ in everyone for n in ns))
        self.write(f"== {title}")
        for r, (_, _, ls) in enumerate(everyone):
            for line in ls:
                self.write(f"  rank {r}{line}")
        count = len(cases)
        what = f"{count} cases" if count > 1 else ""
        if allfails:
            self.failed.append(f"{title}: {allfails[0]}")
            bad = len({f.split(": ", 2)[1] for f in allfails})
            print(f"[{self.phase}] FAIL {title:<40} {bad} of {count} failed {seconds:6.2f} s",
                  flush=True)
            for f in allfails[:2]:
                print(f"[{self.phase}]        {short(f, 200)}", flush=True)
            if len(allfails) > 2:
                print(f"[{self.phase}]        ... {len(allfails) - 2} more in the case log",
                      flush=True)
        else:
            self.passed += 1
            info = f"  ({short(infos[0], 160)})" if infos and count == 1 else ""
            print(f"[{self.phase}] PASS {title:<40} {what:>9} {seconds:6.2f} s{info}",
                  flush=True)
        for n in allnotes[:2]:
            print(f"[{self.phase}] NOTE {short(n, 200)}", flush=True)
        self.notes += allnotes

    def finish(self, path):
        self.section(None)
        seconds = time.monotonic() - self.t0
        if self.rank != 0:
            return
        print(f"[{self.phase}] done: {self.passed} passed, {len(self.failed)} failed, "
              f"{len(self.notes)} notes, {seconds:.1f} s", flush=True)
        if path:
            with open(path, "w") as f:
                json.dump({"phase": self.phase, "passed": self.passed, "failed": self.failed,
                           "notes": self.notes, "seconds": seconds}, f, indent=1)


# -- the phases ------------------------------------------------------------------------

def describe(rep, mcr, t, ordinal):
    from mcr import _core, device as mdev
    version = mcr.build_info()["mpi_library_version"].splitlines()[0].split(",")[0]
    if t.cuda:
        where = f"{torch.cuda.get_device_name(ordinal)} (cuda:{ordinal})"
    else:
        where = "CPU (dry run)"
    rep.say(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {where}, "
            f"{t.size} process(es), mcr {mcr.__version__}, {' '.join(version.split())}")
    aware = _core._mpi_cuda_aware()
    meaning = {1: "aware", 0: "not aware", -1: "cannot tell"}.get(aware, "?")
    reads = mdev.interface(ordinal).mpi_reads_device if t.cuda else None
    how = ("" if reads is None else
           "; CUDA buffers go to MPI directly" if reads else
           "; CUDA buffers are staged through pinned host memory")
    rep.say(f"MCR_CUDA_AWARE={os.environ.get('MCR_CUDA_AWARE', '(unset)')}, "
            f"mcr._core._mpi_cuda_aware() = {aware} ({meaning}), "
            f"mcr.device.mpi_cuda_aware() = {mdev.mpi_cuda_aware()}{how}")
    return aware


def awareness_case(t, ordinal, aware):
    from mcr import device as mdev

    def check():
        setting = os.environ.get("MCR_CUDA_AWARE", "").strip()
        if aware not in (-1, 0, 1):
            raise CheckFailed(f"_mpi_cuda_aware() returned {aware!r}, expected -1, 0 or 1")
        want = (setting.lower() not in ("0", "no", "false", "off")) if setting else aware == 1
        if mdev.mpi_cuda_aware() != want:
            raise CheckFailed(f"mcr.device.mpi_cuda_aware() is {mdev.mpi_cuda_aware()}, "
                              f"expected {want} (MCR_CUDA_AWARE={setting or 'unset'}, "
                              f"library says {aware})")
        if t.cuda and mdev.interface(ordinal).mpi_reads_device != want:
            raise CheckFailed(f"interface({ordinal}).mpi_reads_device is "
                              f"{mdev.interface(ordinal).mpi_reads_device}, expected {want}")
        return f"MPI given device memory directly: {want}"
    return check


def phase_mpi(rep, env):
    """Section a (and b for MPI): the MPI backend on CUDA buffers at 2 processes."""
    MPI, mcr, ordinal, device = env["MPI"], env["mcr"], env["ordinal"], env["device"]
    t = Ctx(MPI, MPI.COMM_WORLD, None, device)
    if not t.cuda:
        # the dry run stages host buffers exactly as CUDA ones are staged
        from mcr import _core
        _core._set_host_staging(env["phase"] == "mpi")
        rep.say(f"host buffers staged through a copy: {env['phase'] == 'mpi'}")
    aware = describe(rep, mcr, t, ordinal)
    rep.group("CUDA-awareness setting", [("", awareness_case(t, ordinal, aware))])
    quick = env["phase"] != "mpi"
    kinds = quick_kinds(t) if quick else full_kinds(t)
    rep.section(f"MPI: core operations, {matrix(t, DTYPES, kinds)}")
    run_ops(rep, t, CORE_OPS, DTYPES, kinds)
    if not quick:
        rep.section("MPI: the other operations, float32/bfloat16 tensors n=1000")
        run_ops(rep, t, EXTRA_OPS, ("float32", "bfloat16"), (("tensor", (1000,)),))
    rep.section("MPI: stream semantics")
    run_streams(rep, t)
    rep.group("mpi: tensor fusion (mcr.Fusion)", fusion_cases(t))
    rep.group("mpi: neighborhood collectives of a ring", neighbor_cases(t))


def fusion_cases(t):
    """mcr.Fusion on this context's backend and device: many small calls run
    in a few buckets, every result against torch's on the host."""
    import mcr
    calls, n = 40, 300

    def allreduce(dtype):
        xs = [[t.data(("fusion", i, r), n, dtype) for r in range(t.size)]
              for i in range(calls)]
        ys = [t.fresh(n, dtype) for _ in range(calls)]
        with mcr.Fusion(t.comm, bucket_bytes=8 * n * 4, backend=t.backend, trace=True) as f:
            reqs = [f.Iallreduce(t.dev(x[t.rank]), y) for x, y in zip(xs, ys)]
            mcr.Request.Waitall(reqs)
            buckets = len(f.trace)
        for i, (x, y) in enumerate(zip(xs, ys)):
            t.expect(y, fold("SUM", x), f"Iallreduce call {i}")
        return f"{calls} calls in {buckets} buckets"

    def bcast_allgather():
        with mcr.Fusion(t.comm, backend=t.backend) as f:
            xs = [t.data(("fusion-bcast", i), n, torch.float32) for i in range(calls)]
            bufs = [t.dev(x) if t.rank == 0 else t.fresh(n, torch.float32) for x in xs]
            gs = [[t.data(("fusion-gather", i, r), n, torch.int64) for r in range(t.size)]
                  for i in range(calls)]
            outs = [t.fresh(n * t.size, torch.int64) for _ in range(calls)]
            reqs = [f.Ibcast(b, 0) for b in bufs]
            reqs += [f.Iallgather(t.dev(g[t.rank]), o) for g, o in zip(gs, outs)]
            mcr.Request.Waitall(reqs)
        for i, (x, b) in enumerate(zip(xs, bufs)):
            t.expect(b, x, f"Ibcast call {i}")
        for i, (g, o) in enumerate(zip(gs, outs)):
            t.expect(o, torch.cat(g), f"Iallgather call {i}")

    return [("Iallreduce float32", functools.partial(allreduce, torch.float32)),
            ("Iallreduce bfloat16", functools.partial(allreduce, torch.bfloat16)),
            ("Iallreduce int64", functools.partial(allreduce, torch.int64)),
            ("Ibcast and Iallgather", bcast_allgather)]


def neighbor_cases(t):
    """The neighborhood collectives of a periodic ring on this context's
    backend and device (on MPI, CUDA tensors go through host copies; on
    NCCL, rounds of Alltoallv): every form, against the ring's definition."""
    n = 1000
    left, right = (t.rank - 1) % t.size, (t.rank + 1) % t.size

    def blocks(r):           # what process r sends its left, then its right neighbour
        return [t.data(("ngh", r, k), n, torch.float32) for k in (0, 1)]

    # slot 0 (from the left) holds what the left one sent right, and the
    # other way round (MPI 4.0: so also with 1 or 2 processes)
    expected = torch.cat([blocks(left)[1], blocks(right)[0]])

    def case(form):
        def run():
            ring = t.comm.Create_cart([t.size], periods=[True])
            try:
                x, y = t.dev(torch.cat(blocks(t.rank))), t.fresh(2 * n, torch.float32)
                if form == "blocking":
                    ring.Neighbor_alltoall(x, y, **t.kw)
                elif form == "nonblocking":
                    ring.Ineighbor_alltoall(x, y, **t.kw).Wait()
                else:
                    req = ring.Neighbor_alltoall_init(x, y, **t.kw)
                    req.Start()
                    req.Wait()
                    req.Free()
                t.expect(y, expected, f"Neighbor_alltoall ({form})")
                g = t.fresh(2 * n, torch.float32)
                ring.Neighbor_allgather(t.dev(blocks(t.rank)[0]), g, **t.kw)
                t.expect(g, torch.cat([blocks(left)[0], blocks(right)[0]]),
                         "Neighbor_allgather")
            finally:
                ring.Free()
        return run

    return [(form, case(form)) for form in MODES]


def backend_checks(rep, env, t, tm, quick):
    """Section c/d on one backend communicator `t`, mixed with MPI on `tm`."""
    def starts():
        x = t.dev(torch.ones(4))
        y = t.fresh(4, torch.float32)
        t.comm.Allreduce(x, y, **t.kw)
        t.expect(y, torch.full((4,), float(t.size)), "recvbuf")
    before = rep.failed[:]
    rep.group(f"{t.name} starts (its first call)", [("", starts)])
    if rep.failed != before:
        rep.say(f"SKIP the other {t.name} checks: the backend does not start")
        return
    rep.group("a buffer on the wrong device is refused", wrong_device_cases(t))
    kinds = quick_kinds(t) if quick else full_kinds(t)
    rep.section(f"{t.name}: every collective, {matrix(t, DTYPES, kinds)}")
    run_ops(rep, t, CORE_OPS + EXTRA_OPS, DTYPES, kinds)
    rep.section(f"{t.name}: stream semantics")
    run_streams(rep, t)
    rep.group(f"{t.name}: tensor fusion (mcr.Fusion)", fusion_cases(t))
    rep.group(f"{t.name}: neighborhood collectives of a ring", neighbor_cases(t))
    rep.section(f"{t.name} mixed with MPI (MPI on {'CUDA' if t.cuda else 'host'} buffers)")
    run_mixed(rep, tm, t)


def free_case(comm, name):
    def free():
        comm.Free()
        return f"{name} sub-communicator released"
    return [("", free)]


def phase_nccl1(rep, env):
    MPI, mcr, device = env["MPI"], env["mcr"], env["device"]
    tm = Ctx(MPI, MPI.COMM_WORLD, None, device)
    describe(rep, mcr, tm, env["ordinal"])
    comm = MPI.COMM_WORLD.Dup()              # freed at the end: releases the backend
    t = Ctx(MPI, comm, env["other"], device)
    backend_checks(rep, env, t, tm, quick=False)
    rep.group(f"Comm.Free with a {t.name} sub-communicator", free_case(comm, t.name))


def phase_mixed2(rep, env):
    MPI, mcr, device = env["MPI"], env["mcr"], env["device"]
    world = MPI.COMM_WORLD
    tm = Ctx(MPI, world, None, device)
    describe(rep, mcr, tm, env["ordinal"])
    alone = world.Split(world.Get_rank())     # the backend on each process alone
    tb = Ctx(MPI, alone, env["other"], device)
    rep.section(f"MPI over {world.Get_size()} processes mixed with {tb.name} over 1")
    run_mixed(rep, tm, tb)
    rep.group(f"Comm.Free with a {tb.name} sub-communicator", free_case(alone, tb.name))


def other_device_cases(t, ordinal):
    """Buffers on this process's device while another device is current."""
    other = 1 - ordinal
    n = 1000

    def run(kind):
        xs = [t.data(("otherdev", i), n, torch.float32) for i in range(t.size)]
        x, y = t.dev(xs[t.rank]), t.fresh(n, torch.float32)
        with torch.cuda.device(other):
            t.comm.Allreduce(t.wrap(x, kind), t.wrap(y, kind), **t.kw)
        t.expect(y, fold("SUM", xs), f"recvbuf on cuda:{ordinal}")
    return [(f"{kind} on cuda:{ordinal} while cuda:{other} is current",
             functools.partial(run, kind)) for kind in ("tensor", "cai", "dlpack")]


def phase_nccl2(rep, env):
    MPI, mcr, device = env["MPI"], env["mcr"], env["device"]
    tm = Ctx(MPI, MPI.COMM_WORLD, None, device)
    describe(rep, mcr, tm, env["ordinal"])
    comm = MPI.COMM_WORLD.Dup()
    t = Ctx(MPI, comm, env["other"], device)
    backend_checks(rep, env, t, tm, quick=True)
    if t.cuda and torch.cuda.device_count() >= 2 and t.size == 2:
        rep.group("MPI: buffers on a device other than the current one",
                  other_device_cases(tm, env["ordinal"]))
    rep.group(f"Comm.Free with a {t.name} sub-communicator", free_case(comm, t.name))


TUNE_OPS = ("allreduce", "bcast", "allgather", "alltoall")


def phase_tune(rep, env):
    """mcr.tune on this phase's process: the other backend (NCCL; Gloo on the
    dry run) against MPI on the device's buffers, then backend="auto" running
    each call where the table says."""
    import mcr.hooks
    from mcr import tuning
    from mcr.tune import worker
    MPI, mcr, device = env["MPI"], env["mcr"], env["device"]
    world = MPI.COMM_WORLD
    tm = Ctx(MPI, world, None, device)
    describe(rep, mcr, tm, env["ordinal"])
    kind, other = ("cuda" if tm.cuda else "cpu"), env["other"]
    folder = world.bcast(tempfile.mkdtemp(prefix="mcr-gpu-tune-") if tm.rank == 0 else None)
    path = os.path.join(folder, "tuning.json")

    def tune():
        status = worker.main(["--devices", kind, "--backends", f"mpi,{other}",
                              "--ops", ",".join(TUNE_OPS), "-m", "4:1048576", "--rounds", "1",
                              "--time-budget", "30", "--out", path])
        if status:
            raise AssertionError(f"mcr.tune exited with status {status}")
        table = tuning.Table.load(path)
        for name in TUNE_OPS:
            op = name.capitalize()
            entries = [e for e in table.entries if (e.op, e.device) == (op, kind)]
            if len(entries) != 19:                   # 4 B to 1 MiB
                raise AssertionError(f"{op}: {len(entries)} entries, expected 19")
            for e in entries:
                if set(e.latency_us) != {"mpi", other}:
                    raise AssertionError(f"{op} {e.bytes} B: measured {sorted(e.latency_us)}")
        chosen = {(e.op, e.backend) for e in table.entries}
        return "chosen: " + ", ".join(f"{op} {b}" for op, b in sorted(chosen))
    rep.group(f"mcr.tune: {other} against MPI on {kind} buffers", [("", tune)])

    def auto_follows_table():
        # as measured, and with Allreduce above 1 KiB sent to the other backend
        # by hand (a table's choices may be edited), so that auto runs both
        table = tuning.Table.load(path)
        for e in table.entries:
            if e.op == "Allreduce" and e.bytes > 1024:
                e.backend = other
        edited = os.path.join(folder, f"edited-{tm.rank}.json")
        table.save(edited)
        os.environ["MCR_TUNING"] = edited
        comm = world.Dup()
        comm.backend = "auto"
        seen = []
        try:
            for e in (x for x in table.entries if x.op == "Allreduce"):
                n = max(1, e.bytes // 4)
                choice = comm.choose("Allreduce", 4 * n, kind)
                if choice.backend != e.backend:
                    raise AssertionError(f"choose at {4 * n} B: {choice.backend}, table "
                                         f"{e.backend}")
                xs = [tm.data(("tune", r, n), n, torch.float32) for r in range(tm.size)]
                y = tm.fresh(n, torch.float32)
                with mcr.hooks.installed(lambda call: seen.append(call.backend)):
                    comm.Allreduce(tm.dev(xs[tm.rank]), y)
                if seen[-1] != e.backend:
                    raise AssertionError(f"auto ran {4 * n} B on {seen[-1]}, table {e.backend}")
                tm.expect(y, fold("SUM", xs), f"Allreduce of {4 * n} B under auto")
        finally:
            comm.Free()
            del os.environ["MCR_TUNING"]
        if set(seen) != {"mpi", other}:
            raise AssertionError(f"auto ran on {sorted(set(seen))}, not on mpi and {other}")
        return f"{len(seen)} sizes, on " + ", ".join(sorted(set(seen)))
    rep.group("backend='auto' runs where the table says", [("", auto_follows_table)])
    world.Barrier()
    if tm.rank == 0:
        shutil.rmtree(folder, ignore_errors=True)


def phase_ext(rep, env):
    """Issue 12 on the device's buffers: the logger times calls on CUDA
    tensors with events (no device synchronization), compression encodes and
    decodes on the device, fusion packs device tensors; on the other backend
    and on MPI."""
    import mcr.log
    MPI, mcr, device = env["MPI"], env["mcr"], env["device"]
    world = MPI.COMM_WORLD
    tm = Ctx(MPI, world, None, device)
    describe(rep, mcr, tm, env["ordinal"])
    comm = world.Dup()
    kind, other = ("cuda" if tm.cuda else "cpu"), env["other"]
    n = 1 << 16

    def logged():
        mcr.log.reset()
        mcr.log.start(records=True)
        xs = [tm.data(("log", r), n, torch.float32) for r in range(tm.size)]
        try:
            for backend in ("mpi", other):
                y = tm.fresh(n, torch.float32)
                comm.Allreduce(tm.dev(xs[tm.rank]), y, backend=backend)
                tm.expect(y, fold("SUM", xs), f"Allreduce on {backend} while logging")
                z = tm.fresh(n, torch.float32)
                comm.Iallreduce(tm.dev(xs[tm.rank]), z, backend=backend).Wait()
                tm.expect(z, fold("SUM", xs), f"Iallreduce on {backend} while logging")
            records = mcr.log.records()
            rows = mcr.log.summary()["rows"]
        finally:
            mcr.log.stop()
            mcr.log.reset()
        where = f"cuda:{env['ordinal']}" if tm.cuda else "cpu"
        got = [(r["op"], r["form"], r["backend"], r["device"], r["bytes"]) for r in records]
        want = [(op, form, b, where, 4 * n) for b in ("mpi", other)
                for op, form in (("Allreduce", "blocking"), ("Allreduce", "nonblocking"))]
        if got != want:
            raise CheckFailed(f"records {got}, expected {want}")
        if any(r["duration_us"] <= 0 for r in records):
            raise CheckFailed(f"durations {[r['duration_us'] for r in records]}")
        if sum(r["calls"] for r in rows) != 4:
            raise CheckFailed(f"summary rows {rows}")
        return "durations (us): " + ", ".join(f"{r['duration_us']:.1f}" for r in records)

    def compressed():
        xs = [tm.data(("fp16", r), n, torch.float32) for r in range(tm.size)]
        out = []
        for backend in ("mpi", other):
            for spec, cast in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
                y = tm.fresh(n, torch.float32)
                comm.Allreduce(tm.dev(xs[tm.rank]), y, backend=backend, compress=spec)
                acc = xs[0].to(cast).float()
                for x in xs[1:]:
                    acc = acc + x.to(cast).float()
                tm.expect(y, acc.to(cast).float(), f"Allreduce compress={spec} on {backend}")
                g = tm.fresh(n * tm.size, torch.float32)
                comm.Iallgather(tm.dev(xs[tm.rank]), g, backend=backend, compress=spec).Wait()
                tm.expect(g, torch.cat([x.to(cast).float() for x in xs]),
                          f"Iallgather compress={spec} on {backend}")
                out.append(f"{spec} on {backend}")
        return ", ".join(out)

    rep.group(f"mcr.log on {kind} tensors" + (" (CUDA events)" if tm.cuda else ""),
              [("", logged)])
    rep.group(f"compression on {kind} tensors", [("", compressed)])
    comm.Free()


def phase_check(rep, env):
    """Issue 14 on the device: a planted count mismatch raises MismatchError on
    every rank in checked mode; a receive nobody sends raises TimeoutError at
    the timeout and completes once sent; on the other backend and on MPI."""
    MPI, mcr, device, other = env["MPI"], env["mcr"], env["device"], env["other"]
    world = MPI.COMM_WORLD
    tm = Ctx(MPI, world, None, device)
    kind = "cuda" if tm.cuda else "cpu"

    def mismatch(backend):
        def case():
            comm = world.Dup()
            comm.checked = True
            n = 5 if tm.rank == tm.size - 1 and tm.size > 1 else 4
            x = tm.dev(torch.ones(n))
            try:
                comm.Allreduce(MPI.IN_PLACE, x, backend=backend)
            except mcr.MismatchError as exc:
                if tm.size == 1 or "different counts" not in str(exc):
                    raise CheckFailed(f"unexpected: {exc}")
                message = str(exc)
            else:
                if tm.size > 1:
                    raise CheckFailed("no MismatchError")
                message = "one process: nothing to mismatch"
            y = tm.dev(torch.ones(4))
            comm.Allreduce(MPI.IN_PLACE, y, backend=backend)
            tm.expect(y, torch.full((4,), float(tm.size)), f"Allreduce on {backend} after")
            comm.Free()
            return message
        return case

    def timeout(backend):
        def case():
            comm = world.Dup()
            comm.timeout = 2.0
            peer = (tm.rank + 1) % tm.size
            y = tm.fresh(4, torch.float32)
            req = comm.Irecv(y, source=(tm.rank - 1) % tm.size, tag=5, backend=backend)
            t0 = time.monotonic()
            try:
                req.Wait()
            except mcr.TimeoutError as exc:
                took = time.monotonic() - t0
                if not 1.8 <= took < 30 or "Recv" not in str(exc):
                    raise CheckFailed(f"after {took:.1f} s: {exc}")
            else:
                raise CheckFailed("no TimeoutError")
            comm.Barrier()
            comm.Send(tm.dev(torch.full((4,), float(tm.rank))), dest=peer, tag=5,
                      backend=backend)
            req.Wait()
            tm.expect(y, torch.full((4,), float((tm.rank - 1) % tm.size)),
                      f"Recv on {backend} after the timeout")
            comm.Free()
            return f"TimeoutError after {took:.1f} s, then received"
        return case

    rep.group(f"checked mode on {kind} tensors",
              [(b, mismatch(b)) for b in ("mpi", other)])
    rep.group(f"timeouts on {kind} tensors", [(b, timeout(b)) for b in ("mpi", other)
                                              if b != "nccl" or tm.size > 1])


def phase_torch(rep, env):
    """Issue 13 on the device: the 'mcr' torch.distributed backend. DDP trains
    the same model on mcr groups running the other backend and MPI, and on
    torch's own group of the other backend; the losses must agree."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    mcr, device, other, ordinal = env["mcr"], env["device"], env["other"], env["ordinal"]
    # no MASTER_ADDR: rank and size from MPI; torch takes a device_id on CUDA only
    dist.init_process_group("mcr", device_id=device if device.type == "cuda" else None)
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {f"mcr-{b}": dist.new_group(backend="mcr",
                                         pg_options=mcr.distributed.Options(backend=b))
              for b in (other, "mpi")}
    groups[f"torch-{other}"] = dist.new_group(backend=other)
    kind = "cuda" if device.type == "cuda" else "cpu"

    def calls(name):
        def run():
            g = groups[name]
            x = torch.arange(6, dtype=torch.float32, device=device) + rank
            dist.all_reduce(x, group=g)
            want = sum(torch.arange(6.0) + r for r in range(size))
            if not torch.equal(x.cpu(), want):
                raise CheckFailed(f"all_reduce gave {x.cpu().tolist()}, expected {want.tolist()}")
            rows = [(rank + q) % 3 + 1 for q in range(size)]          # uneven splits
            back = [(q + rank) % 3 + 1 for q in range(size)]
            send = torch.cat([torch.full((n, 2), float(10 * rank + q), device=device)
                              for q, n in enumerate(rows)])
            recv = torch.empty(sum(back), 2, device=device)
            dist.all_to_all_single(recv, send, back, rows, group=g, async_op=True).wait()
            want = torch.cat([torch.full((n, 2), float(10 * q + rank)) for q, n in enumerate(back)])
            if not torch.equal(recv.cpu(), want):
                raise CheckFailed(f"all_to_all_single gave {recv.cpu().tolist()}")
            out = torch.empty(size * 3, device=device)
            dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device=device), group=g)
            if not torch.equal(out.cpu(), torch.arange(size, dtype=torch.float32).repeat_interleave(3)):
                raise CheckFailed(f"all_gather_into_tensor gave {out.cpu().tolist()}")
            return "all_reduce, all_to_all_single (uneven), all_gather_into_tensor"
        return run

    losses = {}

    def ddp(name):
        def run():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                        torch.nn.Linear(64, 4)).to(device)
            wrapped = DistributedDataParallel(
                model, process_group=groups[name], bucket_cap_mb=0.01,
                device_ids=[ordinal] if device.type == "cuda" else None)
            opt = torch.optim.SGD(wrapped.parameters(), lr=0.05)
            gen = torch.Generator().manual_seed(3)
            xs, ys = torch.randn(10, size, 16, 32, generator=gen), torch.randn(10, size, 16, 4, generator=gen)
            got = []
            for step in range(10):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(wrapped(xs[step, rank].to(device)),
                                                    ys[step, rank].to(device))
                loss.backward()
                opt.step()
                got.append(loss.item())
            losses[name] = got
            return f"loss {got[0]:.4f} -> {got[-1]:.4f}"
        return run

    def same():
        ref = torch.tensor(losses[f"torch-{other}"])
        for name, got in losses.items():
            if not torch.allclose(torch.tensor(got), ref, rtol=1e-4, atol=1e-5):
                raise CheckFailed(f"{name} losses {got} differ from torch-{other}'s {ref.tolist()}")
        return f"{len(losses)} runs agree"

    rep.group(f"torch.distributed on 'mcr' groups, {kind} tensors",
              [(name, calls(name)) for name in groups if name.startswith("mcr")])
    rep.group(f"DDP on {kind} tensors", [(name, ddp(name)) for name in groups])
    rep.group("DDP losses equal torch's own backend", [("", same)])
    dist.destroy_process_group()


def phase_workloads(rep, env):
    """Issue 13's training steps (mcr.workloads) on the device's tensors: a few
    steps of each on mcr groups and on torch's own group of the other
    backend, with steps/s, and the losses of every step compared."""
    from mcr.bench import workloads as bench
    from mcr.workloads import common
    other = env["other"]
    variants = "mcr-cuda,mcr-nccl,nccl" if env["device"].type == "cuda" else f"mcr,mcr-mpi,{other}"
    args = bench.parse_args(["--variants", variants, "--steps", "3", "--rounds", "1"])
    groups = common.groups(args.variants)

    def run(workload):
        def case():
            row = bench._bench(workload, args, groups)
            if not row["agree"]:
                raise CheckFailed(f"losses differ by up to {row['max_abs_diff_warmup']:.2e}: "
                                  f"{row['losses']}")
            return ", ".join(f"{v} {s:.1f} steps/s" for v, s in row["steps_per_s"].items())
        return case

    rep.group(f"workloads ({variants})", [(w, run(w)) for w in args.workloads])
    torch.distributed.destroy_process_group()   # torch's Gloo threads may abort at exit


PHASES = {"check": phase_check, "workloads": phase_workloads, "torch": phase_torch, "mpi": phase_mpi, "mpi-aware0": phase_mpi, "nccl1": phase_nccl1,
          "mixed2": phase_mixed2, "nccl2": phase_nccl2, "tune": phase_tune, "ext": phase_ext}


def child(args):
    import faulthandler
    # a hung collective: every process prints where it is, then exits
    faulthandler.dump_traceback_later(args.hang_after, exit=True)
    from mpi4py import MPI as M4
    hc = M4.COMM_WORLD.Dup()                  # the harness's own traffic
    rank = hc.Get_rank()
    cuda = args.device == "cuda"
    ordinal = (rank if args.phase == "nccl2" else 0) if cuda else -1
    if cuda:
        torch.cuda.set_device(ordinal)
    torch.set_num_threads(threads_per_process(hc.Get_size()))
    rep = Reporter(hc, args.phase, args.caselog)
    try:
        import mcr
        from mcr import MPI
        env = {"phase": args.phase, "MPI": MPI, "mcr": mcr, "ordinal": ordinal,
               "device": torch.device("cuda", ordinal) if cuda else torch.device("cpu"),
               "other": "nccl" if cuda else "gloo"}
        PHASES[args.phase](rep, env)
    except BaseException:
        # outside any case: the other processes may be waiting in a collective
        traceback.print_exc()
        sys.stderr.flush()
        if rank == 0:
            rep.failed.append(f"phase error: {short(traceback.format_exc(limit=3), 400)}")
            rep.finish(args.summary)
        sys.stdout.flush()
        M4.COMM_WORLD.Abort(1)
    rep.finish(args.summary)
    hc.Barrier()
    hc.Free()
    faulthandler.cancel_dump_traceback_later()
    return 0               # the failures are in the summary; mpiexec stays quiet


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="cuda (auto: when available, else skip) or cpu (dry run)")
    parser.add_argument("--budget", type=float, default=280,
                        help="seconds for all phases together (default 280)")
    parser.add_argument("--logdir", help="where to keep per-case logs and stderr "
                        "(default: a new temporary directory)")
    parser.add_argument("--phases", help="comma-separated subset of: " + ",".join(PHASES))
    parser.add_argument("--phase", help=argparse.SUPPRESS)       # a process of one phase
    parser.add_argument("--summary", help=argparse.SUPPRESS)
    parser.add_argument("--caselog", help=argparse.SUPPRESS)
    parser.add_argument("--hang-after", type=float, default=100, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        return child(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
