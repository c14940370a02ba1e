"""Run test cases on real MPI processes under mpiexec, with a timeout (docs/testing.rst).

A module registers cases with ``@case`` (``@case.quick``: also in the quick tier, run at 2
processes; ``@case.matrix``) and exposes them with ``test_mpi = mpi_cases(__name__)``. For each
world size, the selected cases of all modules run in one ``mpiexec -n N`` job (tests/mpiworker.py):
a process start is paid once per size. Every rank writes a line before and after each case, so a
case that crashes the job, or goes without finishing for its module's timeout (then the job is
killed), fails alone, and a new job goes on at the next case. Jobs are started by :mod:`mcr.launch`,
which this process imports without initializing MPI. World sizes: 1 to 4 (:data:`SIZES`) or those a
module names, restricted by ``MCR_TEST_SIZES`` (e.g. ``2`` or ``1,2``; see :func:`world_sizes`).
"""

import atexit
import collections
import contextlib
import functools
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import pytest

from mcr import launch

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SIZES = (1, 2, 3, 4)
# the world sizes of the modules on what runs around a call (checked mode and timeouts, fusion,
# staged progress, requests' lives, the torch.distributed backend): 4 ranks give their code no
# rank it has not met at 3 (a first, a middle and a last; more ranks than cores), and the calls
# themselves run at 4 in the modules of the operations (test_ops, test_p2p_buf, test_neighbor,
# ...); about 50 s of the suite on 2 cores (docs/testing.rst)
LAYER_SIZES = (1, 2, 3)


def _sizes_from_env():
    """The world sizes of ``$MCR_TEST_SIZES`` (a tuple), or None when it is unset."""
    text = os.environ.get("MCR_TEST_SIZES", "").strip()
    if not text:
        return None
    try:
        sizes = tuple(int(word) for word in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ValueError(f"MCR_TEST_SIZES: expected world sizes >= 1 separated by commas "
                         f"(e.g. '2' or '1,2'), got {text!r}")
    return tuple(dict.fromkeys(sizes))


CHOSEN_SIZES = _sizes_from_env()     # None: no restriction
SIZES = DEFAULT_SIZES if CHOSEN_SIZES is None else CHOSEN_SIZES
DEFAULT_TIMEOUT = float(os.environ.get("MCR_TEST_TIMEOUT", "180"))
# seconds a job may go on without a record once a case failed on some rank: the others are
# most likely waiting for that rank in a collective of the case, which it left
FAILED_GRACE = 10.0


def case(fn):
    """Register `fn(comm)` as an MPI test case of its module."""
    sys.modules[fn.__module__].__dict__.setdefault("_mpi_cases", {})[fn.__name__] = fn
    return fn


def _quick(fn):
    """``@case.quick``: a case of the quick tier too (``pytest -m quick``, at 2 processes)."""
    case(fn)
    sys.modules[fn.__module__].__dict__.setdefault("_quick", set()).add(fn.__name__)
    return fn


def _matrix(quick=None, **axes):
    """``@case.matrix(backend=("mpi", "gloo"), form=FORMS)``: one case per combination,
    ``fn(comm, backend=..., form=...)``, each its own test ``fn[backend=mpi,form=blocking]``.
    ``quick(**combination)``, when given, says which belong to the quick tier."""
    def register(fn):
        module = sys.modules[fn.__module__].__dict__
        for values in itertools.product(*axes.values()):
            chosen = dict(zip(axes, values))
            label = ",".join(f"{axis}={_label(value)}" for axis, value in chosen.items())
            name = f"{fn.__name__}[{label}]"
            module.setdefault("_mpi_cases", {})[name] = functools.partial(fn, **chosen)
            if quick is not None and quick(**chosen):
                module.setdefault("_quick", set()).add(name)
        return fn
    return register


def _label(value):
    """A short name for an axis value in a test id (torch.float32: float32)."""
    return getattr(value, "__name__", None) or str(value).removeprefix("torch.")


case.quick = _quick
case.matrix = _matrix
QUICK_SIZE = 2


def mpi_env():
    """:func:`mcr.launch.job_env` with tests/ (the harness) and tests/plugins (the
    third-party backend "tiny", found through its entry point) on PYTHONPATH."""
    mpiexec = launch.find_mpiexec()
    env = launch.job_env(mpiexec)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.path.join(HERE, "plugins"),
                                                      env.get("PYTHONPATH")]))
    if not launch.is_open_mpi(mpiexec):
        # MPICH's mpiexec sets PYTHONUNBUFFERED=1 where the environment lacks it; unbuffered,
        # print() writes a line and its newline apart, and the launcher joins the ranks' lines
        # ("on vm.Hello, ..."). Empty, it counts as unset: a line goes out in one write
        env["PYTHONUNBUFFERED"] = ""
    return env


def mpi_env_in(folder):
    """:func:`mpi_env` for a job whose ranks keep their temporary files (store files, Open
    MPI's session folder) in `folder`/tmp: removed with `folder`, even after a killed job."""
    env = dict(mpi_env(), TMPDIR=os.path.join(folder, "tmp"))
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return env


def run_script(nprocs, args, timeout=DEFAULT_TIMEOUT):
    """Run `python args...` on `nprocs` ranks; (returncode or None when killed, output)."""
    result = launch.run(nprocs, [sys.executable] + list(args), timeout=timeout, env=mpi_env(),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return result.returncode, result.stdout


# Open MPI's launcher sometimes fails to start at all on a loaded machine
# (seen here once in several hundred jobs, with no other job running): no rank
# starts, so no case has run, and the job is started again.
LAUNCH_FAILURES = ("The PMIx server's listener thread failed to start",)
LAUNCH_TRIES = 3


# a test module's MPI cases, as mpi_cases registered them
Module = collections.namedtuple("Module", "path names sizes timeout own_job")


_modules = {}       # path -> Module, in registration (collection) order
# where a long job says which module it is at (conftest.py: pytest's terminal)
progress_line = None
_selected = None    # {(path, case, nprocs)} that pytest will run; None: all
_results = {}       # (path, case, nprocs) -> (outcome record per rank, job detail)


def select(items):
    """Note the cases pytest selected (``-k``, ``-m``, a file) for the jobs (conftest.py)."""
    global _selected
    _selected = set()
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is not None and getattr(item.function, "mpi_module", None):
            _selected.add((item.function.mpi_module, spec.params["name"],
                           spec.params["nprocs"]))


def _plan(module, nprocs):
    """The (path, case) pairs a job runs at `nprocs`: those of every module sharing jobs,
    or of `module` alone."""
    modules = [module] if module.own_job else [
        m for m in _modules.values() if not m.own_job and nprocs in m.sizes]
    return [(m.path, name) for m in modules for name in m.names
            if (m.path, name, nprocs) not in _results
            and (_selected is None or (m.path, name, nprocs) in _selected)]


def run_cases(module, nprocs):
    """Run `module`'s cases (and those sharing its job) at `nprocs` ranks; a crash or a
    hang fails the case that was running, and a new job goes on at the next case."""
    plan = _plan(module, nprocs)
    while plan:
        for attempt in range(1, LAUNCH_TRIES + 1):
            code, out, records = _run_once(plan, nprocs)
            if records or code == 0 or not any(f in out for f in LAUNCH_FAILURES):
                break
            print(f"mpiharness: mpiexec failed to start ({nprocs} ranks, try {attempt} of "
                  f"{LAUNCH_TRIES}): {out.strip().splitlines()[-1] if out.strip() else ''}",
                  file=sys.stderr)
        finished = 0
        for path, name in plan:
            per_rank = records.get((path, name), {})
            if len(per_rank) == nprocs and all("ok" in r for r in per_rank.values()):
                _results[(path, name, nprocs)] = (per_rank, None)
                finished += 1
                continue
            # the case the job died in: it fails; the job starts again after it
            failed = sorted(r for r, rec in per_rank.items() if rec.get("ok") is False)
            if code is not None:
                why = f"the job exited with code {code}"
            elif failed:
                why = (f"the job made no progress for {FAILED_GRACE:.0f} s after the case "
                       f"failed on ranks {failed} and was killed (the others waiting for "
                       f"them in a collective?)")
            else:
                why = (f"the job made no progress for {_modules[path].timeout:.0f} s and was "
                       f"killed (deadlock?)")
            _results[(path, name, nprocs)] = (
                {r: rec for r, rec in per_rank.items() if "ok" in rec},
                f"{why}\n--- job output (tail) ---\n{_tail(out)}")
            finished += 1
            break
        plan = plan[finished:]


def _tail(out, limit=6000):
    """The last `limit` characters of a job's output, and the ranks' stacks whole."""
    output, marker, stacks = out.partition(STACKS)
    return output[-limit:] + marker + stacks


def case_seconds():
    """{(path, case, nprocs): the slowest rank's seconds} so far (for ``--durations``)."""
    return {key: max(rec.get("seconds", 0) for rec in per_rank.values())
            for key, (per_rank, _) in _results.items() if per_rank}


def _run_once(plan, nprocs):
    """One job over `plan`; (exit code or None when killed, output, records by case)."""
    with tempfile.TemporaryDirectory(prefix="mcr-test-") as tmp:
        with open(os.path.join(tmp, "plan.json"), "w") as f:
            json.dump(plan, f)
        timeouts = {path: _modules[path].timeout for path, _ in plan}
        code, out = _run_watched(nprocs, [os.path.join(HERE, "mpiworker.py"), tmp], tmp,
                                 timeouts)
        records = {}
        for rank in range(nprocs):
            for rec in read_jsonl(os.path.join(tmp, f"rank{rank}.jsonl")):
                records.setdefault((rec["module"], rec["case"]), {})[rank] = rec
    return code, out, records


def read_jsonl(path):
    """The records of a file of JSON lines, up to a line cut short by a crash ([]: none)."""
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                records.append(json.loads(line))
    except (FileNotFoundError, ValueError):
        pass
    return records


def jsonl_bytes(folder):
    """How much has been written to the files of JSON lines in `folder`."""
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)
               if name.endswith(".jsonl"))


class _LastRecords:
    """The last record of each rank of a running job, read as the rank files grow."""

    def __init__(self, folder, nprocs):
        self.paths = [os.path.join(folder, f"rank{rank}.jsonl") for rank in range(nprocs)]
        self.read = [0] * nprocs
        self.last = [None] * nprocs

    def poll(self):
        """Read the lines written since the last poll; True when any rank wrote one."""
        grew = False
        for rank, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.read[rank])
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1
            if end:
                grew = True
                self.read[rank] += end
                self.last[rank] = json.loads(data[:end].splitlines()[-1])
        return grew

    def failed(self):
        """The ranks whose last record is a failed case (each waits for the others)."""
        return [rank for rank, rec in enumerate(self.last) if rec and rec.get("ok") is False]


def _run_watched(nprocs, args, outdir, timeouts):
    """Run `python args...` on `nprocs` ranks until it exits, or until no rank has written
    a record for the running case's module timeout, or for :data:`FAILED_GRACE` after the
    case failed on some rank (then kill it: exit code None)."""
    with tempfile.TemporaryFile("w+") as log:
        with launch.start(nprocs, [sys.executable] + list(args), env=mpi_env_in(outdir), stdout=log,
                          stderr=subprocess.STDOUT, text=True) as job:
            records, changed, current, shown, hung = _LastRecords(outdir, nprocs), \
                time.monotonic(), None, None, False
            while not hung and job.process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    job.process.wait(timeout=0.25)      # (its end is seen at once)
                now = time.monotonic()
                if records.poll():
                    changed = now
                    current = records.last[0]["module"] if records.last[0] else current
                if current != shown and progress_line is not None:
                    shown = current
                    progress_line(f"[mpiexec -n {nprocs}: {os.path.basename(current)}]")
                limit = timeouts.get(current, DEFAULT_TIMEOUT)
                if records.failed():
                    limit = min(limit, FAILED_GRACE)
                hung = now - changed > limit
            stacks = _stacks(outdir, nprocs) if hung else ""
            job.stop()
            code = None if hung else job.process.returncode
        log.seek(0)
        return code, log.read() + stacks


STACKS = "\n--- where each rank was when the job was stopped (Python stacks) ---\n"


def _stacks(outdir, nprocs, wait=3.0, limit=2000):
    """The Python stacks of a hung job's ranks (mpiworker.py writes them on SIGUSR1), each
    cut to `limit` characters, after :data:`STACKS`; "" when no rank wrote one."""
    paths = [os.path.join(outdir, f"rank{rank}.stacks") for rank in range(nprocs)]
    signalled = []
    for rank in range(nprocs):
        try:
            with open(os.path.join(outdir, f"rank{rank}.pid")) as f:
                pid = int(f.read())
            # this job's worker, on this host (a rank elsewhere, or gone, has no such
            # process here: SIGUSR1 would end whatever process has its number)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if outdir.encode() not in f.read():
                    continue
            os.kill(pid, signal.SIGUSR1)
            signalled.append(rank)
        except (OSError, ValueError):          # not started yet, gone, or no /proc
            pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not all(
            os.path.exists(paths[rank]) and os.path.getsize(paths[rank]) for rank in signalled):
        time.sleep(0.1)
    time.sleep(0.2)                 # each writes its threads' stacks in a few writes
    texts = {}
    for rank in signalled:
        with contextlib.suppress(OSError):
            with open(paths[rank]) as f:
                texts[rank] = _threads(f.read())
    texts = {rank: text for rank, text in texts.items() if text}
    if not texts:
        return ""
    return STACKS + "".join(f"rank {rank}:\n{texts[rank][:limit]}\n" if rank in texts else
                            f"rank {rank}: none (another host's, gone, or no answer in "
                            f"{wait:.0f} s)\n" for rank in range(nprocs))


def _threads(dump):
    """A faulthandler dump of all threads, the worker's main thread first; threads with
    only the standard library's frames (idle pools) are counted, not shown."""
    blocks = [b.strip() for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump) if b.strip()]
    main = [b for b in blocks if "mpiworker.py" in b]
    ours = [b for b in blocks if b not in main and any(
        not _in_stdlib(path) for path in re.findall(r'File "([^"]*)"', b))]
    idle = len(blocks) - len(main) - len(ours)
    return "\n".join(main + ours + [f"(threads idle in the standard library: {idle})"] * bool(idle))


def _in_stdlib(path):
    rest = os.path.relpath(path, STDLIB)
    return not rest.startswith(("..", "site-packages", "dist-packages"))


STDLIB = os.path.dirname(os.__file__)


def world_sizes(sizes=None):
    """The pytest parameters of a test's ``nprocs``: `sizes` (default :data:`SIZES`)
    restricted to ``$MCR_TEST_SIZES``; when that leaves none, each skipped with the reason."""
    if sizes is None or CHOSEN_SIZES is None:
        return list(SIZES if sizes is None else sizes)
    kept = [n for n in sizes if n in CHOSEN_SIZES]
    if kept:
        return kept
    reason = (f"MCR_TEST_SIZES={os.environ['MCR_TEST_SIZES']} leaves none of this test's "
              f"world sizes {tuple(sizes)}")
    return [pytest.param(n, marks=pytest.mark.skip(reason=reason)) for n in sizes]


def mpi_cases(module_name, sizes=None, timeout=DEFAULT_TIMEOUT, own_job=False):
    """A pytest test running each case of `module_name` at each of `sizes` (see
    :func:`world_sizes`), in the one job per size (``own_job=True``: in jobs of the module's
    own, for cases that change the process for good). `timeout`: seconds one case may go
    without finishing before its job is taken as hung."""
    module = sys.modules[module_name]
    names = list(module.__dict__.get("_mpi_cases", {}))
    path = os.path.abspath(module.__file__)
    quick = module.__dict__.get("_quick", set())
    params = []
    for name in names:
        for size in world_sizes(sizes):
            size, marks = (size.values[0], list(size.marks)) if hasattr(size, "values") \
                else (size, [])
            if name in quick and size == QUICK_SIZE:
                marks.append(pytest.mark.quick)
            params.append(pytest.param(name, size, marks=marks, id=f"{name}-{size}"))
    chosen = [size for size in world_sizes(sizes) if isinstance(size, int)]
    _modules[path] = Module(path, names, chosen, timeout, own_job)

    @pytest.mark.timeout(0)     # the job's own watch bounds each case (above)
    @pytest.mark.parametrize("name,nprocs", params)
    def test_mpi(name, nprocs):
        if (path, name, nprocs) not in _results:
            run_cases(_modules[path], nprocs)
        ranks, died = _results[(path, name, nprocs)]
        failed = {r: rec for r, rec in ranks.items() if not rec["ok"]}
        missing = sorted(set(range(nprocs)) - set(ranks))
        unfinished = f"did not finish on ranks {missing} at {nprocs} ranks: {died}"
        if failed:
            details = "\n".join(f"--- rank {r} ---\n{rec['error']}"
                                for r, rec in sorted(failed.items()))
            pytest.fail(f"case {name} failed at {nprocs} ranks:\n{details}"
                        + (f"\n--- and it {unfinished}" if missing else ""), pytrace=False)
        if missing:
            pytest.fail(f"case {name} {unfinished}", pytrace=False)

    test_mpi.mpi_module = path
    return test_mpi


class Background:
    """``python argv...`` in `cwd`, started now at the lowest priority, so that it runs on
    what the MPI jobs leave of the cores (a test module's ``start_early``, conftest.py);
    :meth:`result` waits for it. Killed at exit if nobody waited."""

    def __init__(self, argv, cwd):
        self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen([sys.executable, *argv], cwd=cwd, text=True,
                                        stdout=self.out, stderr=self.err,
                                        preexec_fn=lambda: os.nice(19))
        atexit.register(self.stop)

    def result(self, timeout):
        """(return code, stdout, stderr), waiting up to `timeout` seconds."""
        self.process.wait(timeout=timeout)
        self.out.seek(0)
        self.err.seek(0)
        return self.process.returncode, self.out.read(), self.err.read()

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def scratch_folder(prefix):
    """A new temporary folder (a pathlib.Path), removed at exit: for what a ``start_early``
    writes, which outlives pytest's per-test folders."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def alive(pid):
    """Whether process `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def format_exception(exc):
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
