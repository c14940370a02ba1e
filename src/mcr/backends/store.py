"""Bootstrap of torch process groups over MPI: no torchrun, no environment.

A communicator whose processes share one host and see the same temporary
folder meets through a torch ``FileStore``: rank 0 makes the file and
broadcasts its path over MPI. Under Open MPI's launcher the file goes in the
job's own folder, which the launcher removes at the end of the job, also when
a process was killed before it could remove the file. Otherwise rank 0 starts
a ``TCPStore`` on a free port and broadcasts its address; the other ranks
connect to it, at rank 0's host name (``MCR_STORE_HOST`` overrides it, and
asks for the TCP store on one host too).

Why not TCP on one host: torch's TCP store looks up the host name of every
connection's address, once in the client and once in the server. The address
is IPv4-mapped IPv6 (``::ffff:127.0.0.1``), which ``/etc/hosts`` does not list,
so each lookup is a DNS query; where the name server drops one (measured: one
lookup in a hundred, in a sandbox), the connection waits for the resolver's
5-s timeout. The file store takes no network and no name server.
"""

import atexit
import datetime
import os
import socket
import tempfile
from typing import Any

from .._env import seconds

__all__ = ["c10d", "rendezvous", "timeout"]

_made: list[tuple[int, str]] = []   # (maker's pid, store file): removed at exit if still there


def c10d() -> Any:
    """torch.distributed (typed loosely: its stubs do not export the store and
    process-group classes mcr uses)."""
    import torch.distributed
    return torch.distributed


def timeout() -> datetime.timedelta:
    """How long backend operations may take before they fail
    (``MCR_BACKEND_TIMEOUT`` seconds, 600 when unset or 0; ValueError naming it
    for a value that is no number of seconds >= 0). Beyond 30 years it is 30
    years, as a communicator's timeout: a longer one overflows the backends'
    clocks."""
    return datetime.timedelta(seconds=min(seconds("MCR_BACKEND_TIMEOUT") or 600, 1e9))


def rendezvous(comm: Any) -> Any:
    """A torch store shared by the processes of ``comm`` (collective). Its
    exchanges are mcr's, not the program's: they run on mpi4py's view of
    ``comm``, which no interceptor (the logger, hooks, checked mode) sees.
    The processes first agree on the variables that shape it, so that a
    value one of them lacks or cannot use raises on every one (no process
    waits for a store the others do not make)."""
    from mpi4py import MPI
    comm = MPI.Intracomm(comm)
    host = os.environ.get("MCR_STORE_HOST", "")
    try:
        timeout()
        problem = None
    except ValueError as exc:
        problem = str(exc)
    path = _new_file() if comm.Get_rank() == 0 and not host else None
    seen = comm.allgather((socket.gethostname(), path, host, problem))
    _agree([(name, host, problem) for name, _, host, problem in seen], path)
    if host:
        return _tcp_store(comm, host)
    path = seen[0][1]
    seen = comm.allgather((socket.gethostname(), path is not None and os.path.exists(path)))
    hosts = [name for name, _ in seen]
    one_host = len(set(hosts)) == 1
    if one_host and all(visible for _, visible in seen):    # (none sees a file not made)
        store = c10d().FileStore(path, comm.Get_size())
        store.set_timeout(timeout())
        return store
    if comm.Get_rank() == 0 and path is not None:
        _remove(path)
    return _tcp_store(comm, "127.0.0.1" if one_host else hosts[0])


def _agree(every: list[tuple[str, str, str | None]], path: str | None) -> None:
    """Raise on every process where one could not read MCR_BACKEND_TIMEOUT,
    or MCR_STORE_HOST differs between them (`every`: each process's host
    name, MCR_STORE_HOST and problem; `path`: the store file rank 0 made, or
    None, removed then)."""
    problems = [f"rank {rank} ({name}): {problem}"
                for rank, (name, _, problem) in enumerate(every) if problem]
    hosts = {host for _, host, _ in every}
    if not problems and len(hosts) == 1:
        return
    if path is not None:
        _remove(path)
    if problems:
        raise ValueError("backend bootstrap: " + "; ".join(problems[:4]))
    values = "; ".join(f"rank {rank}: {host or '(unset)'}"
                       for rank, (_, host, _) in enumerate(every) if rank < 8)
    raise ValueError(f"MCR_STORE_HOST differs between the processes ({values}); set it alike "
                     "on every one (Open MPI: mpiexec -x MCR_STORE_HOST)")


def _job_folder() -> str | None:
    """Open MPI's folder for this job on this host (its launcher removes it when the
    job ends, however the processes end), or None under another launcher."""
    process_folder = os.environ.get("OMPI_FILE_LOCATION")    # <session>/<job>/<rank>
    folder = os.path.dirname(process_folder) if process_folder else None
    return folder if folder and os.path.isdir(folder) else None


def _new_file() -> str | None:
    """A fresh, empty store file in the job's folder or the temporary folder, or None
    where none can be made."""
    try:
        fd, path = tempfile.mkstemp(prefix="mcr-store-", dir=_job_folder())
    except OSError:
        return None
    os.close(fd)
    if not _made:
        atexit.register(_remove_made)
    elif len(_made) >= 64:                 # forget the files torch removed already
        _made[:] = [made for made in _made if os.path.exists(made[1])]
    _made.append((os.getpid(), path))
    return path


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove_made() -> None:
    """At exit: the store files this process made. torch removes a file when
    every process has dropped its store; a store still held at exit is not. A forked
    child inherits the list and this handler, not its parent's files."""
    for pid, path in _made:
        if pid == os.getpid():
            _remove(path)


def _tcp_store(comm: Any, host: str) -> Any:
    """A TCPStore on rank 0, at ``host``, which the other ranks join."""
    dist = c10d()
    rank, size = comm.Get_rank(), comm.Get_size()
    store: Any = None
    port: int | str | None = None
    if rank == 0:
        try:
            store = dist.TCPStore(host, 0, size, True, timeout=timeout(),
                                  wait_for_workers=False)
            port = store.port
        except Exception as exc:           # every rank must learn of the failure
            port = f"{type(exc).__name__}: {exc}"
    port = comm.bcast(port, root=0)
    if isinstance(port, str):
        raise RuntimeError(f"backend bootstrap: rank 0 could not start a TCPStore on "
                           f"{host}: {port}")
    if rank != 0:
        store = dist.TCPStore(host, port, size, False, timeout=timeout())
    return store
