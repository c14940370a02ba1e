"""GPU checks for mcr: the operation matrix on CUDA tensors, and what only a GPU has.

The makers of tests/opmatrix.py run on the device's buffers on MPI and NCCL; besides: CUDA
buffer kinds, stream semantics, MPI and NCCL requests mixed, wrong-device errors, mcr.tune,
the logger and compression, checked mode, torch.distributed and the workloads on the device.

    python tests/gpu/check_gpu.py                # on a machine with a CUDA device
    python tests/gpu/check_gpu.py --device cpu   # dry run: CPU tensors, Gloo for NCCL
    python tests/gpu/check_gpu.py --logdir $OUT/gpu-logs   # keep every case's log, pass or fail

Without a CUDA device (nor ``--device cpu``) it prints ``check_gpu: skipped: no CUDA device``
and exits 0. This process does not initialize MPI: it runs each of :func:`phases` as a job
under mpiexec (:mod:`mcr.launch`), each with a time limit, all within ``--budget`` seconds.
Results are compared with torch/numpy on the whole data on the CPU (:mod:`opref`), never with
mcr. Rank 0 prints a PASS/FAIL line per group of checks. Exit status: 0 when every check
passed (or there is no CUDA device), 1 when one failed, 2 when the checks could not start.
"""

import argparse
import collections
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
import types
from unittest import mock

try:
    import torch
except ImportError as _exc:          # mcr needs torch: nothing to check without it
    torch = None
    _TORCH_ERROR = _exc

from mcr import launch

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))   # tests/: opmatrix, opref
opmatrix = opref = None        # imported by child() only: they initialize MPI
DTYPES = ("float32", "float16", "bfloat16", "int64")
KINDS = ("tensor", "cai", "dlpack")
FORMS = ("blocking", "nonblocking", "persistent")
# also run with large messages (the matrix's are a few elements)
LARGE = ("Bcast", "Gatherv", "Allgatherv", "Alltoallv", "Allreduce", "Reduce_scatter", "Scan")
SLEEP_CYCLES = 200_000_000           # torch.cuda._sleep: ~0.1 s at 2 GHz


# == The parent: start each phase under mpiexec, collect, summarize =========================

Phase = collections.namedtuple("Phase", "name nprocs limit what env skip",
                               defaults=({}, None))      # skip: why not run it, or None


def phases(device, ndev):
    other = "gloo" if device == "cpu" else "nccl"
    two = device == "cpu" or ndev >= 2
    n = 2 if two else 1
    return [  # the PyPI Open MPI is not CUDA-aware: mcr stages through pinned memory
        Phase("mpi", 2, 120, "MPI on 2 processes sharing cuda:0, the library's CUDA-awareness"),
        Phase("mpi-aware0", 2, 80, "MPI on 2 processes, MCR_CUDA_AWARE=0",
              env={"MCR_CUDA_AWARE": "0"}),
        Phase("nccl1", 1, 80, f"{other} on 1 process (NCCL refuses two ranks on one GPU), "
              "mixed with MPI"),
        Phase("mixed2", 2, 60, f"MPI on 2 processes with {other} on each process alone"),
        Phase("nccl2", 2, 90, f"{other} on 2 processes (one device each)",
              skip=None if two else f"needs 2 CUDA devices, found {ndev}"),
        Phase("tune", 1, 90, f"mcr.tune of {other} against MPI (4 B to 1 MiB, four "
              "collectives), then backend='auto' running where the table says"),
        Phase("ext", 1, 60, f"the logger and compression on {other} and MPI"),
        Phase("workloads", n, 150, "the MoE, DLRM and DDP transformer steps on mcr groups "
              f"and on torch's own {other}, losses compared"),
        Phase("check", n, 60, f"checked mode and timeouts on {other} and MPI, {device} tensors"),
        Phase("torch", n, 120, f"DDP and torch.distributed on the 'mcr' backend ({other} and "
              f"MPI) against torch's own {other}")]


def jobs(chosen, device):
    """`chosen` phases as the jobs that run them (lists of phases, in order of their first). On
    CUDA each phase is a job of its own: a CUDA error can leave a process unusable. On the CPU
    dry run the phases of one process count share a job (a job start costs about 2 s: MPI,
    Python and torch in each process), each phase's environment set for its run (child)."""
    if device != "cpu":
        return [[ph] for ph in chosen]
    shared = {}
    for ph in chosen:
        shared.setdefault(ph.nprocs, []).append(ph)
    return list(shared.values())


def threads_per_process(nprocs):
    """Half the cores shared out (OpenMP threads spinning beside MPI's polling slow it all)."""
    return max(1, (os.cpu_count() or 2) // (2 * nprocs))


def pump(stream):
    for line in stream:         # a job's progress lines, as they come
        sys.stdout.write(line)
        sys.stdout.flush()


def say(text, file=sys.stdout):
    print(f"check_gpu: {text}", file=file, flush=True)


def log_paths(logdir, name):
    """A phase's summary (JSON) and case log in `logdir`."""
    return os.path.join(logdir, name + ".json"), os.path.join(logdir, name + ".cases")


def run_job(group, args, mpiexec, logdir, limit):
    """Run the phases of `group` in one job; [(status, summary dict or None, seconds)], one
    per phase. A phase the job did not reach, after one that ended it, is NOT RUN."""
    names = [ph.name for ph in group]
    errlog = os.path.join(logdir, "+".join(names) + ".stderr")
    for name in names:
        for path in log_paths(logdir, name):
            with contextlib.suppress(OSError):
                os.remove(path)
    env = {k: v for k, v in os.environ.items()     # the MPI checks run on the default backend
           if k not in ("MCR_BACKEND", "MCR_DEMO_NPROCS")}
    env.update(group[0].env, PYTHONUNBUFFERED="1")
    nprocs = group[0].nprocs
    env.setdefault("OMP_NUM_THREADS", str(threads_per_process(nprocs)))
    env.setdefault("MCR_BACKEND_TIMEOUT", "60")  # a stuck Gloo/NCCL call fails, not hangs
    argv = [sys.executable, "-u", HERE, "--phase", ",".join(names), "--device", args.device,
            "--logdir", logdir, "--hang-after", str(max(int(limit) - 8, 5))]
    for ph in group:
        say(f"phase {ph.name}: {ph.what}" + (f" (limit {limit:.0f} s)" if len(group) == 1 else ""))
    if len(group) > 1:
        say(f"one job for phases {', '.join(names)} (limit {limit:.0f} s)")
    t0 = time.monotonic()
    with open(errlog, "w") as err:
        err.write(" ".join(launch.command(nprocs, mpiexec) + argv) + "\n")
        err.flush()
        with launch.start(nprocs, argv, env=env, mpiexec=mpiexec, stdout=subprocess.PIPE,
                          stderr=err, text=True) as job:
            reader = threading.Thread(target=pump, args=(job.process.stdout,), daemon=True)
            reader.start()
            rc = job.wait(timeout=limit)
        reader.join(5)
    seconds, outcomes, ended = time.monotonic() - t0, [], None
    for name in names:
        result = None
        with contextlib.suppress(OSError, ValueError), open(log_paths(logdir, name)[0]) as f:
            result = json.load(f)
        if ended is not None:
            status = "NOT RUN"
        elif result is None:
            status = "TIMEOUT" if rc is None else "ERROR"
            say(f"phase {name} did not finish in {limit:.0f} s; killed its job" if rc is None
                else f"phase {name} ended with exit status {rc} without a summary")
            ended = name
        else:
            last = name == names[-1]
            status = "FAIL" if result["failed"] or (rc != 0 and last) else "PASS"
            if any(f.startswith("phase error") for f in result["failed"]):
                ended = name                # (its processes ended the job: see child)
        if result is not None:
            took = result["seconds"]
        else:   # (a phase alone: its job's time; one of several: unknown)
            took = seconds if len(names) == 1 else 0.0
        outcomes.append((status, result, took))
    if rc != 0:
        with contextlib.suppress(OSError), open(errlog, errors="replace") as f:
            say(f"last lines of {errlog}:")
            for line in f.readlines()[-30:]:
                print(f"    {line.rstrip()[:300]}", flush=True)
    return outcomes


def parent(args):
    if torch is None:
        say(f"torch cannot be imported ({_TORCH_ERROR}); mcr needs it", sys.stderr)
        return 2
    if args.device != "cpu" and not torch.cuda.is_available():
        say(f"skipped: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda})")
        return 0
    device = args.device = "cpu" if args.device == "cpu" else "cuda"
    ndev = torch.cuda.device_count() if device == "cuda" else 0
    try:
        mpiexec = launch.find_mpiexec()
    except launch.MpiexecNotFoundError as exc:
        say(exc, sys.stderr)
        return 2
    logdir = args.logdir or tempfile.mkdtemp(prefix="mcr-gpu-check-")
    os.makedirs(logdir, exist_ok=True)
    start = time.monotonic()
    what = (f"{ndev} CUDA device(s), torch {torch.__version__} (CUDA {torch.version.cuda})"
            if device == "cuda" else f"DRY RUN on CPU tensors, torch {torch.__version__}")
    say(f"{what}; budget {args.budget:.0f} s; logs in {logdir}")
    chosen = set(args.phases.split(",")) if args.phases else None
    order = [ph.name for ph in phases(device, ndev)]
    rows, failures = {}, []
    for ph in phases(device, ndev):
        if ph.skip and (chosen is None or ph.name in chosen):
            say(f"phase {ph.name}: SKIP ({ph.skip})")
            rows[ph.name] = ("SKIP", ph.skip, 0.0)
    for group in jobs([ph for ph in phases(device, ndev) if not ph.skip
                       and (chosen is None or ph.name in chosen)], device):
        # ending a job that overran takes some seconds more (SIGTERM, then SIGKILL)
        remaining = start + args.budget - time.monotonic() - 15
        if remaining < 20:
            for ph in group:
                rows[ph.name] = ("NOT RUN", "time budget spent", 0.0)
                failures.append(f"{ph.name}: not run, the time budget was spent")
            continue
        limit = min(sum(ph.limit for ph in group), remaining)
        stderr = "+".join(ph.name for ph in group) + ".stderr"
        for ph, (status, result, seconds) in zip(group, run_job(group, args, mpiexec, logdir,
                                                                limit)):
            detail = "no summary"
            if result is not None:
                detail = f"{result['passed']} checks passed, {len(result['failed'])} failed"
                failures += [f"{ph.name}: {f}" for f in result["failed"]]
            if status in ("TIMEOUT", "ERROR"):
                failures.append(f"{ph.name}: {status.lower()} (see {stderr}, "
                                f"{ph.name}.cases in {logdir})")
            if status == "NOT RUN":
                detail = "an earlier phase of its job ended it"
                failures.append(f"{ph.name}: not run, an earlier phase of its job ended it")
            rows[ph.name] = (status, detail, seconds)
    total = time.monotonic() - start
    say("summary")
    for name, (status, detail, seconds) in sorted(rows.items(), key=lambda r: order.index(r[0])):
        print(f"  {name:<11} {status:<7} {detail:<40} {seconds:6.1f} s")
    for f in failures[:15]:
        print(f"  FAIL {short(f, 220)}")
    if len(failures) > 15:
        print(f"  ... {len(failures) - 15} more in {logdir}")
    if failures:
        say(f"RESULT FAIL ({len(failures)} failure(s)) in {total:.0f} s; logs in {logdir}")
        return 1
    kept = f"logs in {logdir}"
    if not args.logdir:         # a folder of our own: nothing in it is needed after a pass
        shutil.rmtree(logdir, ignore_errors=True)
        kept = "logs removed (--logdir DIR keeps them)"
    say(f"RESULT PASS in {total:.0f} s{' (dry run on CPU)' * (device == 'cpu')}; {kept}")
    return 0


# == The checks, run by every process of a phase =========================================

class CheckFailed(AssertionError):
    """A result differs from what torch computes."""


class Note(Exception):
    """Not a failure: a limitation worth reporting (printed as NOTE)."""


def ensure(ok, message):
    if not ok:
        raise CheckFailed(message)


def compare(got, expected, what):
    """`got` (on any device) equals `expected` (on the host): dtype, shape, values."""
    got = got.cpu()
    ensure(got.dtype == expected.dtype and got.shape == expected.shape,
           f"{what}: got {got.dtype} {tuple(got.shape)}, expected {expected.dtype} "
           f"{tuple(expected.shape)}")
    if not torch.equal(got, expected):
        bad = (got != expected).nonzero().flatten()
        i = int(bad[0])
        raise CheckFailed(f"{what}: {bad.numel()} of {got.numel()} elements differ, first "
                          f"at [{i}]: got {got[i].item()}, expected {expected[i].item()}")


def ones(n, times=1):
    return torch.full((n,), float(times))


class CudaArray:
    """A CUDA buffer seen only through __cuda_array_interface__ (as CuPy or Numba arrays are)."""

    def __init__(self, t):
        self._t = t

    __cuda_array_interface__ = property(lambda self: self._t.__cuda_array_interface__)


class DLPackArray:
    """A buffer seen only through the DLPack protocol."""

    def __init__(self, t):
        self.__dlpack__, self.__dlpack_device__ = t.__dlpack__, t.__dlpack_device__


def tensors(x, fn):
    """`x` (an argument list) with `fn` applied to every tensor in it."""
    if isinstance(x, (list, tuple)):
        return type(x)(tensors(a, fn) for a in x)
    return fn(x) if isinstance(x, torch.Tensor) else x


class AsKind:
    """`comm` whose methods get every tensor argument as buffer `kind`: "cai" (only through
    __cuda_array_interface__; a numpy view on the dry run) or "dlpack" (only through DLPack)."""

    def __init__(self, comm, kind):
        self.comm, self.kind = comm, kind

    def __getattr__(self, name):
        method = getattr(self.comm, name)
        return lambda *args, **kw: method(*tensors(args, self.wrap), **kw)

    def wrap(self, t):
        if self.kind == "dlpack":
            return DLPackArray(t)
        return CudaArray(t) if t.is_cuda else t.numpy()


def refused_cai(kind, bfloat16, text):
    """mcr refusing bfloat16 through __cuda_array_interface__ (no type string that torch reads,
    "<V2"): a limitation, not a failure (torch's bare message would be)."""
    return kind == "cai" and bfloat16 and "TypeError" in text and \
        "cannot be read through __cuda_array_interface__" in text


class Ctx:
    """Where checks run: a communicator, a backend (None: MPI, the default; `staged`: on the
    dry run, host buffers staged as CUDA ones are) and a device."""

    def __init__(self, MPI, comm, backend, device, staged=False):
        self.MPI, self.comm, self.backend, self.device = MPI, comm, backend, device
        self.name = backend or "mpi"
        self.matrix_backend = "staged" if staged else self.name     # opmatrix.BACKENDS
        self.kw = {} if backend is None else {"backend": backend}
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.cuda = device.type == "cuda"
        self.big = 1 << 20 if self.cuda else 1 << 16

    def free(self):
        self.comm.Free()
        return f"{self.name} sub-communicator released"

    def as_kind(self, kind):
        return self.comm if kind == "tensor" else AsKind(self.comm, kind)

    def kind_name(self, kind):
        return {"cai": "__cuda_array_interface__" if self.cuda else "numpy",
                "dlpack": "__dlpack__"}.get(kind, kind)

    def dev(self, host):
        return host.to(self.device) if self.cuda else host.clone()

    def fresh(self, n, dtype=None):
        return self.dev(opref.sentinel(n, dtype or torch.float32))

    def data(self, key, n, seed=0):
        return opref.data(key, n, torch.float32, None, seed)

    def operands(self, n, seed, dtype=None):
        """Every process's data: this process's on the device, and their SUM."""
        xs = opref.operands(self.size, n, dtype or torch.float32, None, seed)
        return self.dev(xs[self.rank]), opref.reduce_ref(xs, "SUM")


# -- the operation matrix on the device ------------------------------------------------

@contextlib.contextmanager
def longer(n):
    """The matrix's messages about `n` elements long (0: as they are): opmatrix.N and
    opmatrix.vcounts scaled meanwhile (Bcast, the reductions, the v-collectives)."""
    saved = opmatrix.N, opmatrix.vcounts
    if n:
        opmatrix.N = n
        opmatrix.vcounts = lambda size: [c * (n // 4) for c in opref.vcounts(size)]
    try:
        yield
    finally:
        opmatrix.N, opmatrix.vcounts = saved


def long_alltoallv(comm, dtype, n):
    """A maker of Alltoallv with uneven counts of about n / size (the matrix's do not scale),
    packed send and gapped receive layouts."""
    rank, size = comm.rank, comm.size
    scounts = [max(n // size - 1 + (rank + 2 * j) % 3, 0) for j in range(size)]
    rcounts = [max(n // size - 1 + (i + 2 * rank) % 3, 0) for i in range(size)]
    sdispls, _ = opref.layout(scounts, "packed")
    rdispls, rlength = opref.layout(rcounts, "gaps")

    def make(seed):
        send = opref.cat([opref.pair_block(rank, j, scounts[j], dtype, seed) for j in range(size)])
        incoming = [opref.pair_block(i, rank, rcounts[i], dtype, seed) for i in range(size)]
        want = opref.place(opref.sentinel(rlength, dtype), incoming, rdispls)
        return (([send, scounts, sdispls], [opref.sentinel(rlength, dtype), rcounts, rdispls]),
                lambda a: opref.expect(a[1][0], want))
    return make


def matrix_case(t, method, form, kind, n=0):
    """Every variant of collective `method` in `form` on `t` with `kind` buffers, checked on
    the host; with `n`, messages about n elements long (the reductions: SUM only)."""
    def on_device(make):              # opmatrix's makers have no device argument
        def make_there(seed):
            args, check = make(seed)
            return (tensors(args, lambda x: x.to(t.device)),
                    lambda a: check(tensors(a, lambda x: x.cpu())))
        return make_there

    def run():
        dtypes = [getattr(torch, d) for d in DTYPES
                  if not (d == "bfloat16" and kind == "cai" and not t.cuda)]  # not in numpy
        op, found = opmatrix.OPERATIONS[method], opmatrix.Findings()
        with longer(n):
            if n and method == "Alltoallv":
                variants = [(f"on {opmatrix.name(d)} n={n}", long_alltoallv(t.comm, d, n))
                            for d in dtypes]
            else:
                variants = [(what, make) for what, make in op.variants(t.comm, dtypes)
                            if not (n and op.reduction and not what.startswith("SUM "))]
            for turn, (what, make) in enumerate(variants):
                opmatrix.run(t.as_kind(kind), found, what, t.matrix_backend, form, method,
                             on_device(make), turn)
        notes = [f for f in found if refused_cai(kind, "bfloat16" in f, f)]
        fails = [short(f) for f in found if f not in notes]
        ensure(not fails, f"{len(fails)} of {len(variants)} variants failed:\n" + "\n".join(fails))
        if notes:
            raise Note(f"bfloat16 through __cuda_array_interface__ refused: {short(notes[0])}")
    return run


def p2p_case(t, kind, dtype, n, form):
    """A ring: each process sends the next one `n` elements, receives from the previous (blocking:
    even ranks send first); statuses checked; persistent requests started twice, new data
    written on the stream between."""
    def run():
        MPI, r, kw, comm = t.MPI, t.rank, t.kw, t.as_kind(kind)
        dest, source, tag = (r + 1) % t.size, (r - 1) % t.size, 7
        send, recv, st = t.fresh(n, dtype), t.fresh(n, dtype), MPI.Status()

        def fill(seed):
            send.copy_(t.dev(opref.data(r, n, dtype, None, seed)))
            recv.copy_(t.fresh(n, dtype))
            return opref.data(source, n, dtype, None, seed)
        if form == "persistent":
            reqs = [comm.Recv_init(recv, source, tag, **kw), comm.Send_init(send, dest, tag, **kw)]
            for seed in (0, 1):
                want = fill(seed)
                MPI.Prequest.Startall(reqs)
                MPI.Request.Waitall(reqs)
                compare(recv, want, f"recv buf (start {seed + 1})")
            for q in reqs:
                q.Free()
            return
        want = fill(0)
        if form == "nonblocking":
            MPI.Request.Waitall([comm.Irecv(recv, source, tag, **kw),
                                 comm.Isend(send, dest, tag, **kw)], [st, MPI.Status()])
        elif t.size == 1:
            req = comm.Isend(send, dest, tag, **kw)
            comm.Recv(recv, source, tag, st, **kw)
            req.Wait()
        else:
            for sends in ((True, False) if r % 2 == 0 else (False, True)):
                if sends:
                    comm.Send(send, dest, tag, **kw)
                else:
                    comm.Recv(recv, source, tag, st, **kw)
        compare(recv, want, "recv buf")
        ensure((st.Get_source(), st.Get_tag(), st.Get_count()) == (source, tag, n),
               f"status: source {st.Get_source()}, tag {st.Get_tag()}, count "
               f"{st.Get_count()}; expected {source}, {tag}, {n}")

    def noting():
        try:
            run()
        except TypeError as exc:
            if refused_cai(kind, dtype == torch.bfloat16 and t.cuda, repr(exc)):
                raise Note(f"bfloat16 through __cuda_array_interface__ refused: {exc}") from None
            raise
    return noting


def run_matrix(rep, t, quick):
    """Every collective of the matrix on `t`, in every form, with each kind of buffer, and large
    messages unless `quick`; then Send/Recv in a ring."""
    kinds = "/".join(t.kind_name(k) for k in KINDS)
    rep.section(f"{t.name}: the operation matrix, {'/'.join(FORMS)} x {'/'.join(DTYPES)} x "
                f"{kinds}" + ("" if quick else f"; n={t.big} for {', '.join(LARGE)}"))
    for method in opmatrix.OPERATIONS:
        large = [("tensor", t.big)] if method in LARGE and not quick else []
        rep.group(f"{t.name} {method}", [
            (f"{form} {t.kind_name(kind)}{f' n={n}' * bool(n)}",
             matrix_case(t, method, form, kind, n))
            for kind, n in [(k, 0) for k in KINDS] + large for form in FORMS])
    if t.size == 1 and t.backend is not None:
        rep.say(f"SKIP {t.name} Send/Recv: send to self is not supported on {t.name}")
        return
    sizes = {"tensor": (1, 1000) if quick else (1, 1000, t.big), "cai": (1000,), "dlpack": (1000,)}
    rep.group(f"{t.name} Send/Recv", [
        (f"{form} {d} {t.kind_name(kind)} n={n}", p2p_case(t, kind, getattr(torch, d), n, form))
        for form in FORMS for d in DTYPES for kind in KINDS for n in sizes[kind]
        if not (kind == "cai" and d == "bfloat16" and not t.cuda)])


# -- stream semantics, backends mixed, wrong devices ------------------------------------

def stream_case(t, how):
    """DESIGN.md: the communication waits for work queued on the caller's current stream (a long
    kernel, then the write of the send buffer); Wait() makes the caller's current stream wait
    for the result, and on NCCL returns before the device has finished (the host is not held).
    `how`: blocking, nonblocking, persistent (made before the write), elsewhere (Iallreduce
    waited on another stream while the posting one is kept busy: a copy-back queued on the
    posting stream would land after the read), or waitany (Iallreduce, Request.Waitany)."""
    n, comm, kw, cuda = t.big, t.comm, t.kw, t.cuda

    def on(stream):
        return torch.cuda.stream(stream) if cuda else contextlib.nullcontext()

    def sleep():
        if cuda:
            torch.cuda._sleep(SLEEP_CYCLES)
    s, s2 = [torch.cuda.Stream(device=t.device) if cuda else None for _ in range(2)]
    with on(s):
        x, y = t.dev(ones(n)), t.dev(ones(n, -1))
    if cuda:
        s.synchronize()
    req = comm.Allreduce_init(x, y, **kw) if how == "persistent" else None
    with on(s):
        sleep()
        x.add_(t.rank + 1)
        busy = cuda and not s.query()
        if how == "blocking":
            comm.Allreduce(x, y, **kw)
            queued = cuda and not s.query()
        elif how == "persistent":
            req.Start()
        else:
            req = comm.Iallreduce(x, y, **kw)
        if how == "elsewhere":
            sleep()
    with on(s2 if how == "elsewhere" else s):
        if req is not None:
            if how == "waitany":
                type(req).Waitany([req])              # (mcr.Request's class method)
            else:
                req.Wait()
            queued = cuda and not s.query()
        if cuda:                  # no host synchronization before this copy
            h = torch.empty(n, pin_memory=True)
            h.copy_(y, non_blocking=True)
            (s2 if how == "elsewhere" else s).synchronize()
            late = not s.query()
            s.synchronize()
    if how == "persistent":
        req.Free()
    compare(h if cuda else y, ones(n, sum(r + 2 for r in range(t.size))),
            "recvbuf read on the stream current at Wait")
    # NCCL's wait only queues the caller's stream (torchpg.StreamOrdered): the host goes on
    ensure(not (t.name == "nccl" and busy and how in ("blocking", "nonblocking", "waitany")
                and not queued),
           "the host waited for the device: the stream was idle when the call returned")
    if cuda and how == "elsewhere" and not late:
        raise Note("the posting stream was idle when the result was read: inconclusive")
    if cuda and not busy:
        raise Note("the queued kernel had already finished when mcr was called: "
                   "inconclusive (raise SLEEP_CYCLES)")
    return "kernel still running at the call" if cuda else "dry run"


STREAM_CASES = {"blocking": "Allreduce after queued writes",
                "nonblocking": "Iallreduce after queued writes + Wait",
                "persistent": "Allreduce_init Start after queued writes",
                "elsewhere": "Wait orders the stream current at Wait",
                "waitany": "Iallreduce after queued writes + Waitany"}


def mixed_cases(tm, tb):
    """Requests of MPI (tm) and of the other backend (tb: NCCL; Gloo on the dry run) on the
    device's buffers, completed together."""
    MPI, n = tm.MPI, 1 << 16

    def post_all():
        """MPI Iallreduce, backend Iallreduce, MPI Ibcast, backend Iallgatherv (composed: it
        unpacks at completion); the inputs kept alive."""
        (xa, wa), (xb, wb) = tm.operands(n, 1), tb.operands(n, 2)
        ya, yb, wc = tm.fresh(n), tb.fresh(n), tm.data(0, n, seed=3)
        c = tm.dev(wc) if tm.rank == 0 else tm.fresh(n)
        counts = [k * (n // 4) for k in opref.vcounts(tb.size)]
        displs, length = opref.layout(counts, "gaps")
        blocks = [tb.data(r, counts[r], seed=4) for r in range(tb.size)]
        xd, yd = tb.dev(blocks[tb.rank]), tb.fresh(length)
        wd = opref.place(opref.sentinel(length, torch.float32), blocks, displs)
        reqs = [tm.comm.Iallreduce(xa, ya, **tm.kw), tb.comm.Iallreduce(xb, yb, **tb.kw),
                tm.comm.Ibcast(c, root=0, **tm.kw),
                tb.comm.Iallgatherv(xd, [yd, counts, displs], **tb.kw)]
        return reqs, [(ya, wa, "MPI Iallreduce recvbuf"),
                      (yb, wb, f"{tb.name} Iallreduce recvbuf"), (c, wc, "MPI Ibcast buf"),
                      (yd, wd, f"{tb.name} Iallgatherv recvbuf")], (xa, xb, xd)

    def blocking_other_during_mpi():
        (x, want), y = tm.operands(n, 5), tm.fresh(n)
        req = tm.comm.Iallreduce(x, y, **tm.kw)
        (xb, wb), yb = tb.operands(n, 6), tb.fresh(n)
        tb.comm.Allreduce(xb, yb, **tb.kw)
        req.Wait()
        compare(y, want, "MPI Iallreduce recvbuf")
        compare(yb, wb, f"{tb.name} Allreduce recvbuf")

    def completed(how):
        reqs, results, _inputs = post_all()
        if how == "Waitall":
            MPI.Request.Waitall(reqs, [MPI.Status() for _ in reqs])
        elif how == "Testall":
            deadline = time.monotonic() + 30
            while not MPI.Request.Testall(reqs):
                ensure(time.monotonic() < deadline, "Testall still False after 30 s")
        else:                                   # Waitany or Waitsome, in a loop
            seen = []
            while (got := getattr(MPI.Request, how)(reqs)) not in (None, MPI.UNDEFINED):
                got = [got] if how == "Waitany" else got
                ensure(got and not set(got) & set(seen) and len(seen) <= len(reqs),
                       f"{how} returned {got} (seen {seen})")
                seen += got
            ensure(sorted(seen) == list(range(len(reqs))),
                   f"{how} completed {sorted(seen)}, expected all of 0..3")
        for got, want, what in results:
            compare(got, want, what)
    return [(f"MPI Iallreduce, {tb.name} Allreduce, MPI Wait", blocking_other_during_mpi)] + [
        (f"{how}{' loop' * (how != 'Waitall')} over MPI + {tb.name} requests",
         functools.partial(completed, how))
        for how in ("Waitall", "Testall", "Waitany", "Waitsome")]


def wrong_device_cases(t):
    """A buffer the backend cannot serve is refused, naming the backend; the comm stays usable."""
    def refused(backend, device):
        x, y = torch.ones(4, device=device), torch.empty(4, device=device)
        try:
            t.comm.Allreduce(x, y, backend=backend)
        except Exception as exc:         # any type: the text is what is checked
            text = f"{type(exc).__name__}: {exc}"
            ensure(backend in str(exc), f"the error does not name {backend}: {text}")
            return text
        raise CheckFailed("no error raised")

    def still_usable():
        y = t.fresh(8)
        t.comm.Allreduce(t.dev(ones(8)), y, **t.kw)
        compare(y, ones(8, t.size), "recvbuf after the refused call")
    return ([("CPU tensor with backend='nccl'", functools.partial(refused, "nccl", "cpu"))]
            + [("CUDA tensor with backend='gloo'",
                functools.partial(refused, "gloo", t.device))] * t.cuda
            + [(f"{t.name} works after the refused calls", still_usable)])


# -- reporting ------------------------------------------------------------------------

def short(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Reporter:
    """Runs groups of cases on every process in the same order; rank 0 prints one line per
    group and writes every case to the case log."""

    def __init__(self, hc, phase, caselog):
        self.hc, self.phase, self.rank = hc, phase, hc.Get_rank()
        self.passed, self.failed, self.notes = 0, [], []
        self.log = open(caselog, "a") if caselog and self.rank == 0 else None
        self.t0, self.current = time.monotonic(), None

    def section(self, title=None):
        """Start a section (None: end the last one); prints the time of the last."""
        now = time.monotonic()
        if self.current:
            self.say(f"-- {now - self.since:.1f} s")
        self.current, self.since = title, now
        if title:
            self.say(f"== {title}")

    def say(self, text, log=True):
        if self.rank == 0:
            print(f"[{self.phase}] {text}", flush=True)
            if log:
                self.write([text])

    def write(self, lines):
        if self.log is not None:
            self.log.write("".join(line + "\n" for line in lines))
            self.log.flush()

    def group(self, title, cases):
        t0 = time.monotonic()
        fails, notes, infos, lines = [], [], [], []
        for label, fn in cases:
            c0 = time.monotonic()
            try:
                info = fn()
                infos += [info] if isinstance(info, str) else []
                outcome = "ok"
            except Note as exc:
                notes.append(f"{label}: {exc}" if label else str(exc))
                outcome = f"note: {exc}"
            except Exception as exc:             # reported, never fatal
                text = f"{type(exc).__name__}: {exc}"
                fails.append(short(f"{label}: {text}" if label else text))
                outcome = f"FAIL: {text}\n" + traceback.format_exc()
            lines.append(f"    {label or title}: {outcome} ({time.monotonic() - c0:.3f} s)")
        everyone = self.hc.allgather((fails, notes, lines))
        seconds = time.monotonic() - t0
        if self.rank != 0:
            return
        allfails = [f"rank {r}: {f}" for r, (fs, _, _) in enumerate(everyone) for f in fs]
        allnotes = list(dict.fromkeys(n for _, ns, _ in everyone for n in ns))
        self.write([f"== {title}"] + [f"  rank {r}{line}" for r, (_, _, ls)
                                      in enumerate(everyone) for line in ls])
        count = len(cases)
        if allfails:
            self.failed.append(f"{title}: {allfails[0]}")
            bad = len({f.split(": ", 2)[1] for f in allfails})
            shown = [f"FAIL {title:<40} {bad} of {count} failed {seconds:6.2f} s"]
            shown += [f"       {short(f, 200)}" for f in allfails[:2]]
            shown += [f"       ... {len(allfails) - 2} more in the case log"] * (len(allfails) > 2)
        else:
            self.passed += 1
            what = f"{count} cases" if count > 1 else ""
            info = f"  ({short(infos[0], 160)})" if infos and count == 1 else ""
            shown = [f"PASS {title:<40} {what:>9} {seconds:6.2f} s{info}"]
        for line in shown + [f"NOTE {short(n, 200)}" for n in allnotes[:2]]:
            self.say(line, log=False)
        self.notes += allnotes

    def finish(self, path):
        self.section(None)
        seconds = time.monotonic() - self.t0
        if self.rank != 0:
            return
        self.say(f"done: {self.passed} passed, {len(self.failed)} failed, {len(self.notes)} notes, "
                 f"{seconds:.1f} s", log=False)
        if path:
            with open(path, "w") as f:
                json.dump({"phase": self.phase, "passed": self.passed, "failed": self.failed,
                           "notes": self.notes, "seconds": seconds}, f, indent=1)


# -- the phases: each runs on every process of its job, with `env` (see child) ------------

def describe(rep, env):
    from mcr import _core, device as mdev
    t, ordinal, aware = env.t, env.ordinal, _core._mpi_cuda_aware()
    version = env.mcr.build_info()["mpi_library_version"].splitlines()[0].split(",")[0]
    where = f"{torch.cuda.get_device_name(ordinal)} (cuda:{ordinal})" if t.cuda else "CPU (dry run)"
    rep.say(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {where}, {t.size} "
            f"process(es), mcr {env.mcr.__version__}, {' '.join(version.split())}")
    meaning = {1: "aware", 0: "not aware", -1: "cannot tell"}.get(aware, "?")
    how = {None: "", True: "; CUDA buffers go to MPI directly",
           False: "; CUDA buffers are staged through pinned host memory"}[
        mdev.interface(ordinal).mpi_reads_device if t.cuda else None]
    rep.say(f"MCR_CUDA_AWARE={os.environ.get('MCR_CUDA_AWARE', '(unset)')}, "
            f"mcr._core._mpi_cuda_aware() = {aware} ({meaning}), "
            f"mcr.device.mpi_cuda_aware() = {mdev.mpi_cuda_aware()}{how}")


def awareness(t, ordinal):
    from mcr import _core, device as mdev
    aware, setting = _core._mpi_cuda_aware(), os.environ.get("MCR_CUDA_AWARE", "").strip()
    ensure(aware in (-1, 0, 1), f"_mpi_cuda_aware() returned {aware!r}, expected -1, 0 or 1")
    want = (setting.lower() not in ("0", "no", "false", "off")) if setting else aware == 1
    ensure(mdev.mpi_cuda_aware() == want,
           f"mcr.device.mpi_cuda_aware() is {mdev.mpi_cuda_aware()}, expected {want} "
           f"(MCR_CUDA_AWARE={setting or 'unset'}, library says {aware})")
    if t.cuda:
        reads = mdev.interface(ordinal).mpi_reads_device
        ensure(reads == want, f"interface({ordinal}).mpi_reads_device is {reads}, expected {want}")
    return f"MPI given device memory directly: {want}"


def phase_mpi(rep, env):
    """The MPI backend on the device's buffers at 2 processes ("mpi-aware0": with
    MCR_CUDA_AWARE=0, no large messages)."""
    staged = not env.t.cuda and env.phase == "mpi"
    t = Ctx(env.MPI, env.MPI.COMM_WORLD, None, env.device, staged=staged)
    if not t.cuda:
        # the dry run stages host buffers exactly as CUDA ones are staged
        from mcr import _core
        _core._set_host_staging(staged)
        rep.say(f"host buffers staged through a copy: {staged}")
    rep.group("CUDA-awareness setting", [("", functools.partial(awareness, t, env.ordinal))])
    run_matrix(rep, t, quick=env.phase != "mpi")
    device_extras(rep, t)


def device_extras(rep, t):
    rep.section(f"{t.name}: stream semantics")
    for how, title in STREAM_CASES.items():
        rep.group(f"{t.name} {title}", [("", functools.partial(stream_case, t, how))])
    rep.group(f"{t.name}: tensor fusion (mcr.Fusion)", fusion_cases(t))
    rep.group(f"{t.name}: neighborhood collectives of a ring", neighbor_cases(t))


def fusion_cases(t):
    """mcr.Fusion on this context's backend and device: many small calls run in a few buckets,
    every result against torch's on the host."""
    import mcr
    calls, n = 40, 300

    def allreduce(dtype):
        xs = [opref.operands(t.size, n, dtype, None, i) for i in range(calls)]
        ys = [t.fresh(n, dtype) for _ in range(calls)]
        with mcr.Fusion(t.comm, bucket_bytes=8 * n * 4, backend=t.backend, trace=True) as f:
            mcr.Request.Waitall([f.Iallreduce(t.dev(x[t.rank]), y) for x, y in zip(xs, ys)])
            buckets = len(f.trace)
        for i, (x, y) in enumerate(zip(xs, ys)):
            compare(y, opref.reduce_ref(x, "SUM"), f"Iallreduce call {i}")
        return f"{calls} calls in {buckets} buckets"

    def bcast_allgather():
        with mcr.Fusion(t.comm, backend=t.backend) as f:
            xs = [t.data(0, n, seed=i) for i in range(calls)]
            bufs = [t.dev(x) if t.rank == 0 else t.fresh(n) for x in xs]
            gs = [opref.operands(t.size, n, torch.int64, None, i) for i in range(calls)]
            outs = [t.fresh(n * t.size, torch.int64) for _ in range(calls)]
            reqs = [f.Ibcast(b, 0) for b in bufs]
            reqs += [f.Iallgather(t.dev(g[t.rank]), o) for g, o in zip(gs, outs)]
            mcr.Request.Waitall(reqs)
        for i, (x, b, g, o) in enumerate(zip(xs, bufs, gs, outs)):
            compare(b, x, f"Ibcast call {i}")
            compare(o, torch.cat(g), f"Iallgather call {i}")
    return [(f"Iallreduce {d}", functools.partial(allreduce, getattr(torch, d)))
            for d in ("float32", "bfloat16", "int64")] + [
        ("Ibcast and Iallgather", bcast_allgather)]


def neighbor_cases(t):
    """The neighborhood collectives of a periodic ring on this context's backend and device (on
    MPI, CUDA tensors go through host copies; on NCCL, rounds of Alltoallv), in every form."""
    n, left, right = 1000, (t.rank - 1) % t.size, (t.rank + 1) % t.size

    def blocks(r):           # what process r sends its left, then its right neighbour
        return [t.data(r, n, seed=k) for k in (0, 1)]
    # slot 0 (from the left) holds what the left one sent right, and the other way round
    # (MPI 4.0: so also with 1 or 2 processes)
    expected = torch.cat([blocks(left)[1], blocks(right)[0]])

    def case(form):
        ring = t.comm.Create_cart([t.size], periods=[True])
        try:
            x, y = t.dev(torch.cat(blocks(t.rank))), t.fresh(2 * n)
            if form == "blocking":
                ring.Neighbor_alltoall(x, y, **t.kw)
            elif form == "nonblocking":
                ring.Ineighbor_alltoall(x, y, **t.kw).Wait()
            else:
                req = ring.Neighbor_alltoall_init(x, y, **t.kw)
                req.Start()
                req.Wait()
                req.Free()
            compare(y, expected, f"Neighbor_alltoall ({form})")
            g = t.fresh(2 * n)
            ring.Neighbor_allgather(t.dev(blocks(t.rank)[0]), g, **t.kw)
            compare(g, torch.cat([blocks(left)[0], blocks(right)[0]]), "Neighbor_allgather")
        finally:
            ring.Free()
    return [(form, functools.partial(case, form)) for form in FORMS]


def phase_nccl(rep, env):
    """The other backend on 1 process (nccl1) or 2 (nccl2, no large messages: one device each),
    mixed with MPI."""
    comm = env.MPI.COMM_WORLD.Dup()              # freed at the end: releases the backend
    t = Ctx(env.MPI, comm, env.other, env.device)

    def starts():
        y = t.fresh(4)
        t.comm.Allreduce(t.dev(ones(4)), y, **t.kw)
        compare(y, ones(4, t.size), "recvbuf")
    rep.group(f"{t.name} starts (its first call)", [("", starts)])
    if rep.failed:
        rep.say(f"SKIP the other {t.name} checks: the backend does not start")
    else:
        rep.group("a buffer on the wrong device is refused", wrong_device_cases(t))
        run_matrix(rep, t, quick=env.phase == "nccl2")
        device_extras(rep, t)
        mixed(rep, env.t, t,
              f"{t.name} mixed with MPI (MPI on {'CUDA' if t.cuda else 'host'} buffers)")
    if t.cuda and torch.cuda.device_count() >= 2 and t.size == 2:
        rep.group("MPI: buffers on a device other than the current one",
                  other_device_cases(env.t, env.ordinal))
    rep.group(f"Comm.Free with a {t.name} sub-communicator", [("", t.free)])


def phase_mixed2(rep, env):
    world = env.MPI.COMM_WORLD
    alone = world.Split(world.Get_rank())     # the backend on each process alone
    tb = Ctx(env.MPI, alone, env.other, env.device)
    mixed(rep, env.t, tb, f"MPI over {world.Get_size()} processes mixed with {tb.name} over 1")
    rep.group(f"Comm.Free with a {tb.name} sub-communicator", [("", tb.free)])


def mixed(rep, tm, tb, title):
    rep.section(title)
    for what, fn in mixed_cases(tm, tb):
        rep.group(what, [("", fn)])


def other_device_cases(t, ordinal):
    """Buffers on this process's device while another device is current."""
    other = 1 - ordinal

    def run(kind):
        (x, want), y = t.operands(1000, 7), t.fresh(1000)
        with torch.cuda.device(other):
            t.as_kind(kind).Allreduce(x, y, **t.kw)
        compare(y, want, f"recvbuf on cuda:{ordinal}")
    return [(f"{kind} on cuda:{ordinal} while cuda:{other} is current",
             functools.partial(run, kind)) for kind in KINDS]


TUNE_OPS = ("allreduce", "bcast", "allgather", "alltoall")


def phase_tune(rep, env):
    """mcr.tune: the other backend against MPI on the device's buffers, then backend="auto"
    running each call where the table says."""
    import mcr.hooks
    from mcr import tuning
    from mcr.tune import worker
    world, other, tm, kind = env.MPI.COMM_WORLD, env.other, env.t, env.device.type
    folder = world.bcast(tempfile.mkdtemp(prefix="mcr-gpu-tune-") if tm.rank == 0 else None)
    path = os.path.join(folder, "tuning.json")

    def tune():
        status = worker.main(["--devices", kind, "--backends", f"mpi,{other}",
                              "--ops", ",".join(TUNE_OPS), "-m", "4:1048576", "--rounds", "1",
                              "--time-budget", "30", "--out", path])
        ensure(not status, f"mcr.tune exited with status {status}")
        table = tuning.Table.load(path)
        for op in (name.capitalize() for name in TUNE_OPS):
            entries = [e for e in table.entries if (e.op, e.device) == (op, kind)]
            ensure(len(entries) == 19, f"{op}: {len(entries)} entries, expected 19")  # 4 B..1 MiB
            for e in entries:
                ensure(set(e.latency_us) == {"mpi", other},
                       f"{op} {e.bytes} B: measured {sorted(e.latency_us)}")
        chosen = {(e.op, e.backend) for e in table.entries}
        return "chosen: " + ", ".join(f"{op} {b}" for op, b in sorted(chosen))

    def auto_follows_table():
        # as measured, with Allreduce above 1 KiB sent to the other backend by hand (a table's
        # choices may be edited), so that auto runs both
        table = tuning.Table.load(path)
        for e in table.entries:
            if e.op == "Allreduce" and e.bytes > 1024:
                e.backend = other
        edited = os.path.join(folder, f"edited-{tm.rank}.json")
        table.save(edited)
        os.environ["MCR_TUNING"] = edited
        comm, seen = world.Dup(), []
        comm.backend = "auto"
        try:
            for e in (x for x in table.entries if x.op == "Allreduce"):
                n = max(1, e.bytes // 4)
                choice = comm.choose("Allreduce", 4 * n, kind)
                ensure(choice.backend == e.backend,
                       f"choose at {4 * n} B: {choice.backend}, table {e.backend}")
                (x, want), y = tm.operands(n, n), tm.fresh(n)
                with mcr.hooks.installed(lambda call: seen.append(call.backend)):
                    comm.Allreduce(x, y)
                ensure(seen[-1] == e.backend,
                       f"auto ran {4 * n} B on {seen[-1]}, table {e.backend}")
                compare(y, want, f"Allreduce of {4 * n} B under auto")
        finally:
            comm.Free()
            del os.environ["MCR_TUNING"]
        ensure(set(seen) == {"mpi", other},
               f"auto ran on {sorted(set(seen))}, not on mpi and {other}")
        return f"{len(seen)} sizes, on " + ", ".join(sorted(set(seen)))
    rep.group(f"mcr.tune: {other} against MPI on {kind} buffers", [("", tune)])
    rep.group("backend='auto' runs where the table says", [("", auto_follows_table)])
    world.Barrier()
    if tm.rank == 0:
        shutil.rmtree(folder, ignore_errors=True)


def phase_ext(rep, env):
    """Issue 12 on the other backend and on MPI: the logger times calls on CUDA tensors with
    events (no device synchronization); compression encodes and decodes on the device."""
    import mcr.log
    tm, kind, n, backends = env.t, env.device.type, 1 << 16, ("mpi", env.other)
    comm = env.MPI.COMM_WORLD.Dup()

    def logged():
        mcr.log.reset()
        mcr.log.start(records=True)
        x, total = tm.operands(n, 8)
        try:
            for backend in backends:
                for call in ("Allreduce", "Iallreduce"):
                    y = tm.fresh(n)
                    req = getattr(comm, call)(x, y, backend=backend)
                    if req is not None:
                        req.Wait()
                    compare(y, total, f"{call} on {backend} while logging")
            records, rows = mcr.log.records(), mcr.log.summary()["rows"]
        finally:
            mcr.log.stop()
            mcr.log.reset()
        where = f"cuda:{env.ordinal}" if tm.cuda else "cpu"
        got = [(r["op"], r["form"], r["backend"], r["device"], r["bytes"]) for r in records]
        want = [("Allreduce", form, b, where, 4 * n) for b in backends
                for form in ("blocking", "nonblocking")]
        ensure(got == want, f"records {got}, expected {want}")
        ensure(all(r["duration_us"] > 0 for r in records),
               f"durations {[r['duration_us'] for r in records]}")
        ensure(sum(r["calls"] for r in rows) == 4, f"summary rows {rows}")
        return "durations (us): " + ", ".join(f"{r['duration_us']:.1f}" for r in records)

    def compressed():
        # random floats: a value the cast rounds shows that it was compressed
        xs = [torch.randn(n, generator=torch.Generator().manual_seed(r)) * 8
              for r in range(tm.size)]
        out = []
        for backend in backends:
            for spec, cast in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
                y = tm.fresh(n)
                comm.Allreduce(tm.dev(xs[tm.rank]), y, backend=backend, compress=spec)
                acc = xs[0].to(cast).float()
                for x in xs[1:]:
                    acc = acc + x.to(cast).float()
                compare(y, acc.to(cast).float(), f"Allreduce compress={spec} on {backend}")
                g = tm.fresh(n * tm.size)
                comm.Iallgather(tm.dev(xs[tm.rank]), g, backend=backend, compress=spec).Wait()
                compare(g, torch.cat([x.to(cast).float() for x in xs]),
                        f"Iallgather compress={spec} on {backend}")
                out.append(f"{spec} on {backend}")
        return ", ".join(out)
    rep.group(f"mcr.log on {kind} tensors" + " (CUDA events)" * tm.cuda, [("", logged)])
    rep.group(f"compression on {kind} tensors", [("", compressed)])
    comm.Free()


def phase_check(rep, env):
    """Issue 14 on the other backend and on MPI: a planted count mismatch raises MismatchError
    on every rank in checked mode; a receive nobody sends raises TimeoutError at the timeout
    and completes once sent."""
    MPI, mcr, tm = env.MPI, env.mcr, env.t
    r, size = tm.rank, tm.size

    def mismatch(backend):
        comm = MPI.COMM_WORLD.Dup()
        comm.checked = True
        x = tm.dev(ones(5 if r == size - 1 and size > 1 else 4))
        try:
            comm.Allreduce(MPI.IN_PLACE, x, backend=backend)
            ensure(size == 1, "no MismatchError")
            message = "one process: nothing to mismatch"
        except mcr.MismatchError as exc:
            ensure(size > 1 and "different counts" in str(exc), f"unexpected: {exc}")
            message = str(exc)
        y = tm.dev(ones(4))
        comm.Allreduce(MPI.IN_PLACE, y, backend=backend)
        compare(y, ones(4, size), f"Allreduce on {backend} after")
        comm.Free()
        return message

    seconds = 2.0 if tm.cuda else 0.5       # (the dry run: no first CUDA use to wait for)

    def timeout(backend):
        comm = MPI.COMM_WORLD.Dup()
        comm.timeout = seconds
        y = tm.fresh(4)
        req = comm.Irecv(y, source=(r - 1) % size, tag=5, backend=backend)
        t0 = time.monotonic()
        try:
            req.Wait()
            raise CheckFailed("no TimeoutError")
        except mcr.TimeoutError as exc:
            took = time.monotonic() - t0
            ensure(0.9 * seconds <= took < 30 and "Recv" in str(exc),
                   f"after {took:.1f} s: {exc}")
        comm.Barrier()
        comm.Send(tm.dev(ones(4, r)), dest=(r + 1) % size, tag=5, backend=backend)
        req.Wait()
        compare(y, ones(4, (r - 1) % size), f"Recv on {backend} after the timeout")
        comm.Free()
        return f"TimeoutError after {took:.1f} s, then received"
    backends = ("mpi", env.other)
    rep.group(f"checked mode on {env.device.type} tensors",
              [(b, functools.partial(mismatch, b)) for b in backends])
    rep.group(f"timeouts on {env.device.type} tensors", [
        (b, functools.partial(timeout, b)) for b in backends if b != "nccl" or size > 1])


def phase_torch(rep, env):
    """Issue 13: the 'mcr' torch.distributed backend. DDP trains the same model on mcr groups
    running the other backend and MPI, and on torch's own group of it; the losses must agree."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    device, other, cuda = env.device, env.other, env.t.cuda
    # no MASTER_ADDR: rank and size from MPI; torch takes a device_id on CUDA only
    dist.init_process_group("mcr", device_id=device if cuda else None)
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {f"mcr-{b}": dist.new_group(backend="mcr", pg_options=env.mcr.distributed.Options(
        backend=b)) for b in (other, "mpi")}
    groups[f"torch-{other}"] = dist.new_group(backend=other)

    def full(shape, value, where=device):
        return torch.full(shape, float(value), device=where)

    def calls(g):
        x = torch.arange(6, dtype=torch.float32, device=device) + rank
        dist.all_reduce(x, group=g)
        compare(x, sum(torch.arange(6.0) + r for r in range(size)), "all_reduce")
        rows = [(rank + q) % 3 + 1 for q in range(size)]          # uneven splits
        back = [(q + rank) % 3 + 1 for q in range(size)]
        send = torch.cat([full((n, 2), 10 * rank + q) for q, n in enumerate(rows)])
        recv = torch.empty(sum(back), 2, device=device)
        dist.all_to_all_single(recv, send, back, rows, group=g, async_op=True).wait()
        compare(recv, torch.cat([full((n, 2), 10 * q + rank, "cpu") for q, n in enumerate(back)]),
                "all_to_all_single")
        out = torch.empty(size * 3, device=device)
        dist.all_gather_into_tensor(out, full((3,), rank), group=g)
        compare(out, torch.arange(size, dtype=torch.float32).repeat_interleave(3),
                "all_gather_into_tensor")
        # a transpose: through a contiguous copy, written back on the caller's stream
        t = (torch.arange(12.0, device=device).view(4, 3) + rank).t()
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=g, async_op=True).wait()
        compare(t.reshape(-1), (torch.arange(12.0).view(4, 3) + (size - 1) / 2).t().reshape(-1),
                "strided all_reduce")
        return ("all_reduce, all_to_all_single (uneven), all_gather_into_tensor, "
                "strided all_reduce (AVG)")
    losses = {}

    def ddp(name):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                    torch.nn.Linear(64, 4)).to(device)
        wrapped = DistributedDataParallel(model, process_group=groups[name], bucket_cap_mb=0.01,
                                          device_ids=[env.ordinal] if cuda else None)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(3)
        xs, ys = torch.randn(10, size, 16, 32, generator=gen), torch.randn(10, size, 16, 4,
                                                                           generator=gen)
        got = losses[name] = []
        for step in range(10):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(wrapped(xs[step, rank].to(device)),
                                                ys[step, rank].to(device))
            loss.backward()
            opt.step()
            got.append(loss.item())
        return f"loss {got[0]:.4f} -> {got[-1]:.4f}"

    def same():
        ref = torch.tensor(losses[f"torch-{other}"])
        for name, got in losses.items():
            ensure(torch.allclose(torch.tensor(got), ref, rtol=1e-4, atol=1e-5),
                   f"{name} losses {got} differ from torch-{other}'s {ref.tolist()}")
        return f"{len(losses)} runs agree"
    rep.group(f"torch.distributed on 'mcr' groups, {device.type} tensors",
              [(name, functools.partial(calls, g)) for name, g in groups.items()
               if name.startswith("mcr")])
    rep.group(f"DDP on {device.type} tensors",
              [(name, functools.partial(ddp, name)) for name in groups])
    rep.group("DDP losses equal torch's own backend", [("", same)])
    dist.destroy_process_group()


def phase_workloads(rep, env):
    """Issue 13's training steps (mcr.workloads): a few steps of each on mcr groups and on
    torch's own group of the other backend, with steps/s, the losses of every step compared."""
    from mcr.bench import workloads as bench
    from mcr.workloads import common
    variants = "mcr-cuda,mcr-nccl,nccl" if env.t.cuda else f"mcr,mcr-mpi,{env.other}"
    args = bench.parse_args(["--variants", variants, "--steps", "3", "--rounds", "1"])
    groups = common.groups(args.variants)

    def run(workload):
        row = bench._bench(workload, args, groups)
        ensure(row["agree"],
               f"losses differ by up to {row['max_abs_diff_warmup']:.2e}: {row['losses']}")
        return ", ".join(f"{v} {s:.1f} steps/s" for v, s in row["steps_per_s"].items())
    rep.group(f"workloads ({variants})", [(w, functools.partial(run, w)) for w in args.workloads])
    torch.distributed.destroy_process_group()   # torch's Gloo threads may abort at exit


PHASES = {"mpi": phase_mpi, "mpi-aware0": phase_mpi, "nccl1": phase_nccl,
          "mixed2": phase_mixed2, "nccl2": phase_nccl, "tune": phase_tune, "ext": phase_ext,
          "workloads": phase_workloads, "check": phase_check, "torch": phase_torch}


def child(args):
    import faulthandler
    global opmatrix, opref
    # a hung collective: every process prints where it is, then exits
    faulthandler.dump_traceback_later(args.hang_after, exit=True)
    from mpi4py import MPI as M4
    hc = M4.COMM_WORLD.Dup()                  # the harness's own traffic
    rank, cuda = hc.Get_rank(), args.device == "cuda"
    torch.set_num_threads(threads_per_process(hc.Get_size()))
    envs = {ph.name: ph.env for ph in phases(args.device, 0)}
    for phase in args.phase.split(","):       # (several: the CPU dry run's jobs, see jobs())
        # (the job's environment is the first phase's: mcr.device reads it at each call)
        phase_env = mock.patch.dict(os.environ, envs[phase])
        phase_env.start()
        summary, caselog = log_paths(args.logdir, phase)
        ordinal = (rank if phase == "nccl2" else 0) if cuda else -1
        if cuda:
            torch.cuda.set_device(ordinal)
        rep = Reporter(hc, phase, caselog)
        try:
            import mcr
            import opmatrix
            import opref
            from mcr import MPI
            device = torch.device("cuda", ordinal) if cuda else torch.device("cpu")
            env = types.SimpleNamespace(phase=phase, MPI=MPI, mcr=mcr, ordinal=ordinal,
                                        device=device, other="nccl" if cuda else "gloo",
                                        t=Ctx(MPI, MPI.COMM_WORLD, None, device))
            describe(rep, env)
            PHASES[phase](rep, env)
        except BaseException:
            # outside any case: the other processes may be waiting in a collective
            traceback.print_exc()
            sys.stderr.flush()
            if rank == 0:
                rep.failed.append(f"phase error: {short(traceback.format_exc(limit=3), 400)}")
                rep.finish(summary)
            sys.stdout.flush()
            M4.COMM_WORLD.Abort(1)
        rep.finish(summary)
        phase_env.stop()
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
    parser.add_argument("--logdir", help="where to keep per-case logs and stderr (default: a "
                        "new temporary directory, removed when every check passed)")
    parser.add_argument("--phases", help="comma-separated subset of: " + ",".join(PHASES))
    parser.add_argument("--phase", help=argparse.SUPPRESS)     # a process of a job: its phases
    parser.add_argument("--hang-after", type=float, default=100, help=argparse.SUPPRESS)
    args = parser.parse_args()
    return child(args) if args.phase else parent(args)


if __name__ == "__main__":
    sys.exit(main())
