"""mcr: a Mix-and-match Communication Runtime for Python.

mpi4py-style communicators whose buffer methods run full MPI semantics on
PyTorch tensors and on any buffer (numpy arrays, buffer-protocol objects,
DLPack producers)::

    import mcr
    comm = mcr.COMM_WORLD
    comm.Allreduce(mcr.IN_PLACE, tensor, op=mcr.SUM)

or, as a drop-in for mpi4py, ``from mcr import MPI``.
"""

from mpi4py import MPI as _mpi4py  # initializes MPI and loads the libmpi mcr must share

from ._core import (  # noqa: E402
    COMM_SELF,
    COMM_WORLD,
    Comm,
    Exception,
    Prequest,
    Request,
    Status,
    build_info,
)

# Ops, IN_PLACE and the integer constants are mpi4py's own objects, so that
# code mixing mcr and mpi4py works.
SUM = _mpi4py.SUM
PROD = _mpi4py.PROD
MAX = _mpi4py.MAX
MIN = _mpi4py.MIN
LAND = _mpi4py.LAND
LOR = _mpi4py.LOR
LXOR = _mpi4py.LXOR
BAND = _mpi4py.BAND
BOR = _mpi4py.BOR
BXOR = _mpi4py.BXOR
IN_PLACE = _mpi4py.IN_PLACE
ANY_SOURCE = _mpi4py.ANY_SOURCE
ANY_TAG = _mpi4py.ANY_TAG
PROC_NULL = _mpi4py.PROC_NULL
UNDEFINED = _mpi4py.UNDEFINED

__version__ = "0.1.0"

__all__ = [
    "COMM_WORLD", "COMM_SELF", "Comm", "Request", "Prequest", "Status", "Exception",
    "SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
    "IN_PLACE", "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "UNDEFINED", "build_info",
]
