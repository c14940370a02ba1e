"""Bootstrap of torch process groups over MPI: no torchrun, no environment.

Rank 0 of the communicator starts a TCPStore on a free port and broadcasts its
address over MPI; the other ranks connect to it. On one node the address is
127.0.0.1; across nodes it is rank 0's host name (``MCR_STORE_HOST`` overrides).
"""

import datetime
import os
import socket

__all__ = ["rendezvous", "timeout"]


def timeout():
    """How long backend operations may take before they fail
    (``MCR_BACKEND_TIMEOUT`` seconds, default 600)."""
    return datetime.timedelta(seconds=float(os.environ.get("MCR_BACKEND_TIMEOUT", 600)))


def rendezvous(comm):
    """A torch TCPStore shared by the processes of ``comm`` (collective)."""
    from torch.distributed import TCPStore

    rank, size = comm.Get_rank(), comm.Get_size()
    host = os.environ.get("MCR_STORE_HOST")
    if not host:
        hosts = comm.allgather(socket.gethostname())
        host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
    store, port = None, None
    if rank == 0:
        try:
            store = TCPStore(host, 0, size, True, timeout=timeout(), wait_for_workers=False)
            port = store.port
        except Exception as exc:           # every rank must learn of the failure
            port = f"{type(exc).__name__}: {exc}"
    port = comm.bcast(port, root=0)
    if isinstance(port, str):
        raise RuntimeError(f"backend bootstrap: rank 0 could not start a TCPStore on "
                           f"{host}: {port}")
    if rank != 0:
        store = TCPStore(host, port, size, False, timeout=timeout())
    return store
