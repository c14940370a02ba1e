"""Bootstrap of torch process groups over MPI: no torchrun, no environment.

Rank 0 of the communicator starts a TCPStore on a free port and broadcasts its
address over MPI; the other ranks connect to it. On one node the address is
127.0.0.1; across nodes it is rank 0's host name (``MCR_STORE_HOST`` overrides).
"""

import datetime
import os
import socket
from typing import Any

__all__ = ["c10d", "rendezvous", "timeout"]


def c10d() -> Any:
    """torch.distributed (typed loosely: its stubs do not export the store and
    process-group classes mcr uses)."""
    import torch.distributed
    return torch.distributed


def timeout() -> datetime.timedelta:
    """How long backend operations may take before they fail
    (``MCR_BACKEND_TIMEOUT`` seconds, default 600)."""
    return datetime.timedelta(seconds=float(os.environ.get("MCR_BACKEND_TIMEOUT", 600)))


def rendezvous(comm: Any) -> Any:
    """A torch TCPStore shared by the processes of ``comm`` (collective)."""
    dist = c10d()
    rank, size = comm.Get_rank(), comm.Get_size()
    host = os.environ.get("MCR_STORE_HOST")
    if not host:
        hosts = comm.allgather(socket.gethostname())
        host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
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
