"""mcr: a Mix-and-match Communication Runtime for Python.

mpi4py-style communicators whose buffer methods run full MPI semantics on
PyTorch tensors and on any buffer (numpy arrays, buffer-protocol objects,
DLPack producers)::

    import mcr
    comm = mcr.COMM_WORLD
    comm.Allreduce(mcr.IN_PLACE, tensor, op=mcr.SUM)

or, as a drop-in for mpi4py, ``from mcr import MPI``, or under PyTorch's own
API, ``torch.distributed.init_process_group("mcr")`` (see :mod:`mcr.distributed`).

``import mcr`` itself does not initialize MPI, as ``import mpi4py`` does not:
the first use of one of the names below (``mcr.COMM_WORLD``, ``from mcr import
Comm``, ...) loads the compiled core, which imports ``mpi4py.MPI`` and so
initializes MPI as ``mpi4py.rc`` says. Tools that only start jobs
(:mod:`mcr.launch`) import nothing that touches MPI.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "COMM_WORLD", "COMM_SELF", "Comm", "Cartcomm", "Graphcomm", "Distgraphcomm",
    "Request", "Prequest", "Status", "Exception",
    "SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
    "IN_PLACE", "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "UNDEFINED", "build_info",
    "Fusion", "MismatchError", "TimeoutError",
]
# the names bound at first use (loading them initializes MPI)
_LAZY_NAMES = [name for name in __all__
               if name not in ("Fusion", "MismatchError", "TimeoutError")]

# mpi4py's own objects (ops, IN_PLACE and the integer constants), so that code
# mixing mcr and mpi4py works; the other names are the compiled core's
_MPI4PY_NAMES = ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
                 "IN_PLACE", "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "UNDEFINED")

if TYPE_CHECKING:
    from mpi4py.MPI import (ANY_SOURCE, ANY_TAG, BAND, BOR, BXOR, IN_PLACE, LAND, LOR,
                            LXOR, MAX, MIN, PROC_NULL, PROD, SUM, UNDEFINED)

    from ._core import (COMM_SELF, COMM_WORLD, Cartcomm, Comm, Distgraphcomm, Exception,
                        Graphcomm, Prequest, Request, Status, build_info)

from .errors import MismatchError, TimeoutError   # noqa: A004 (mcr.TimeoutError is one)
from .fusion import Fusion   # imports neither torch nor mpi4py.MPI until used
from . import _services   # noqa: E402


# The modules the compiled core calls, provided to it here (the core lies
# below them: they import it), each imported at the core's first need.
def _module(name: str) -> Any:
    import importlib
    return lambda: importlib.import_module(f"{__name__}.{name}")


for _name, _path in (("backends", "backends"), ("stages", "stages"), ("tuning", "tuning"),
                     ("compress", "compress"), ("device", "device"), ("launch", "launch"),
                     ("message", "backends.message")):
    _services.provide(_name, _module(_path))
del _name, _path


def _check_default_backend() -> None:
    """A bad $MCR_BACKEND fails ``import mcr`` (the core reads it when it loads)."""
    import os

    name = os.environ.get("MCR_BACKEND", "").strip()
    if name:
        from .backends import check_name   # no MPI, no torch
        try:
            check_name(name)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"MCR_BACKEND: {exc}") from None


def _check_log() -> None:
    """A bad $MCR_LOG fails ``import mcr``; logging starts when the core loads."""
    import os

    if os.environ.get("MCR_LOG"):
        from .log.config import Config   # no MPI, no torch
        Config.from_env()


_check_default_backend()
_check_log()

from ._transports import bound_receives as _bound_receives   # noqa: E402

_bound_receives()   # checked mode: Open MPI's receives keep within their buffers

from ._torchreg import install as _join_torch   # noqa: E402

_join_torch()   # the "mcr" torch.distributed backend (imports neither torch nor MPI)


# the public submodules, imported at their first use as attributes of mcr
_SUBMODULES = ("backends", "bench", "compress", "debug", "device", "distributed", "errors",
               "fusion", "hooks", "interceptors", "launch", "log", "progress", "stages", "tune",
               "tuning", "workloads")


def _load() -> None:
    """Import the core (this initializes MPI) and bind every public name here."""
    from mpi4py import MPI  # loads the libmpi mcr must share

    from . import _core
    globals().update({name: getattr(MPI if name in _MPI4PY_NAMES else _core, name)
                      for name in _LAZY_NAMES})
    from .log import _from_env
    _from_env()


def __getattr__(name: str) -> Any:
    if name in _LAZY_NAMES:
        _load()
        return globals()[name]
    if name in _SUBMODULES:         # mcr.backends.names() without importing mcr.backends
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'mcr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
