"""Checked mode's Open MPI transports: a message longer than its receive buffer stays out of the
memory past the buffer.

Open MPI's ob1 moves a message above the eager limit by RDMA: a single-copy read of the sender's
memory on one host (the ``smsc`` components: CMA, KNEM, XPMEM), put and get in the ``self``
transport (a message to oneself), put in ``tcp``. Those protocols move the whole message, and a
receive buffer shorter than it is overwritten past its end by what it lacks before
``MPI_ERR_TRUNCATE`` is reported: the process crashes later, or its data is silently wrong
(measured with Open MPI 5.0.11, through mpi4py as through mcr). The copy protocols that remain
store only what fits.

So in checked mode (``MCR_CHECK`` set when mcr is imported, before MPI is initialized), mcr sets
the settings below that the environment does not set already. They cost bandwidth on large
point-to-point messages (docs/debugging.rst). MPICH ignores them.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import MutableMapping

from ._env import flag

__all__ = ["BOUNDED_RECEIVES", "bound_receives"]

# Open MPI reads OMPI_MCA_<name> from the environment when MPI is initialized.
BOUNDED_RECEIVES = {
    "OMPI_MCA_smsc": "^cma,knem,xpmem",            # one host: no single-copy read
    "OMPI_MCA_btl_self_flags": "send,inplace",      # to oneself: no put, no get
    "OMPI_MCA_btl_tcp_flags": "send,inplace,need-ack,need-csum,hetero-rdma",   # TCP: no put
}


def bound_receives(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """In checked mode, set the settings of BOUNDED_RECEIVES that `environ` (default
    ``os.environ``) lacks, and return their names. Nothing when checked mode is off, or when
    MPI is initialized already (then with a warning, if a setting is missing)."""
    environ = os.environ if environ is None else environ
    try:
        if not flag("MCR_CHECK", environ):
            return []
    except ValueError:
        return []        # a bad value fails when the core loads, with this error
    missing = [name for name in BOUNDED_RECEIVES if name not in environ]
    if not missing:
        return []
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and (mpi.Is_initialized() or mpi.Is_finalized()):
        warnings.warn("MCR_CHECK: MPI was initialized before mcr was imported, so Open MPI "
                      "may write a message longer than its receive buffer past the buffer's "
                      f"end; import mcr first, or set {', '.join(missing)} (docs: "
                      "debugging.rst)", RuntimeWarning, stacklevel=3)
        return []
    for name in missing:
        environ[name] = BOUNDED_RECEIVES[name]
    return missing
