"""The mpi4py namespace with mcr's communicators, requests and status.

``from mcr import MPI`` in place of ``from mpi4py import MPI``: ``COMM_WORLD``,
``COMM_SELF``, ``Comm``, ``Request``, ``Prequest``, ``Status`` and ``Exception``
are mcr's; every other name (``MPI.DOUBLE``, ``MPI.Wtime``, ``MPI.SUM``, error
classes, ...) is mpi4py's own object.
"""

from mpi4py import MPI as _mpi4py

globals().update({name: value for name, value in vars(_mpi4py).items()
                  if not name.startswith("__")})

from mcr._core import (  # noqa: E402,F401  (replace mpi4py's)
    COMM_SELF,
    COMM_WORLD,
    Comm,
    Exception,
    Prequest,
    Request,
    Status,
)
