"""The backends a Comm can run an operation on, registered by module.

Every module of this package that defines ``BACKEND`` (a ``base.Backend``) is
a backend named after the module: adding a backend is adding one module.
``mpi`` is the compiled core itself; ``gloo`` and ``nccl`` wrap torch's
process groups, and run what they lack through ``compose``, the one place
where missing operations are built from the ones a backend has.

A Comm's sub-communicator on a backend is made at its first call on that
backend (collective over the Comm, like NCCL's lazy initialization), kept as
an attribute of the MPI communicator (so every Python object sharing the
handle shares it), and shut down by ``Comm.Free``.
"""

import importlib
import pkgutil
from typing import Any

_HELPERS = frozenset({"base", "compose", "store"})
_KEYVAL: int | None = None


_NAMES: tuple[str, ...] = ()


def names() -> tuple[str, ...]:
    """The names of the registered backends, ``mpi`` first (the package is
    scanned once)."""
    global _NAMES
    if not _NAMES:
        found = sorted(m.name for m in pkgutil.iter_modules(__path__)
                       if m.name not in _HELPERS and not m.name.startswith("_"))
        _NAMES = tuple(sorted(found, key=lambda n: n != "mpi"))
    return _NAMES


def get(name: str) -> Any:
    """The ``Backend`` object registered under ``name``."""
    check_name(name)
    if name == "auto":
        raise ValueError("backend: 'auto' is not a backend, it asks mcr to choose one "
                         f"({', '.join(names())})")
    return importlib.import_module(f"{__name__}.{name}").BACKEND


def check_name(name: object) -> None:
    """Raise TypeError/ValueError unless ``name`` is a backend or ``"auto"``."""
    if not isinstance(name, str):
        raise TypeError(f"backend: expected a string or None, got {type(name).__name__}")
    if name != "auto" and name not in names():
        raise ValueError(f"backend: unknown backend {name!r}; available: "
                         f"{', '.join(names())}, or 'auto'")


def _keyval() -> int:
    global _KEYVAL
    if _KEYVAL is None:
        from mpi4py import MPI
        # no copy function: a duplicated communicator gets its own
        # sub-communicators, made at its first call on each backend
        _KEYVAL = MPI.Comm.Create_keyval()
    return _KEYVAL


def subcomm(comm: Any, name: str) -> Any:
    """``comm``'s sub-communicator on backend ``name``, made at first use
    (collective over ``comm``)."""
    subs = comm.Get_attr(_keyval())
    if subs is None:
        subs = {}
        comm.Set_attr(_keyval(), subs)
    found = subs.get(name)
    if found is None:
        backend = get(name)
        if backend is None or name == "mpi":
            raise ValueError(f"backend: {name!r} runs in mcr's core, not as a "
                             "sub-communicator")
        found = subs[name] = backend.create(comm)
    return found


def release(comm: Any) -> None:
    """Shut down ``comm``'s sub-communicators (before the MPI communicator is
    freed). Outstanding sends are delivered first."""
    if _KEYVAL is None:
        return
    subs = comm.Get_attr(_KEYVAL)
    if not subs:
        return
    comm.Delete_attr(_KEYVAL)
    for sub in subs.values():
        sub.free()
