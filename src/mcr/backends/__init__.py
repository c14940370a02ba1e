"""The backends a Comm can run an operation on, registered by name.

The built-in backends are the modules named in ``BUILTINS``, each defining
``BACKEND`` (a ``base.Backend``): ``mpi`` is the compiled core itself;
``gloo`` and ``nccl`` wrap torch's process groups (``torchpg``), and run what
they lack through ``compose``, the one place where missing operations are
built from a backend's primitives. Other packages add backends through the
entry-point group ``mcr.backends`` (the entry point's name is the backend's,
its value ``module:attr`` a ``Backend`` instance or class), read once, when
a name is not a built-in one or ``names()`` is asked for.

A Comm's sub-communicator on a backend is made at its first call on that
backend (collective over the Comm, like NCCL's lazy initialization), kept as
an attribute of the MPI communicator (so every Python object sharing the
handle shares it), and shut down by ``Comm.Free``.
"""

import importlib
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:         # both are slow to import: read when a backend is loaded
    from importlib.metadata import EntryPoint

    from .base import Backend

__all__ = ["BUILTINS", "ENTRY_POINT_GROUP", "names", "get", "check_name", "subcomm",
           "release"]

BUILTINS: tuple[str, ...] = ("mpi", "gloo", "nccl")
ENTRY_POINT_GROUP = "mcr.backends"
_KEYVAL: int | None = None
_NAMES: tuple[str, ...] = ()
_PLUGINS: "dict[str, EntryPoint] | None" = None     # read once, at first need
_LOADED: "dict[str, Backend]" = {}


def names() -> tuple[str, ...]:
    """The names of the registered backends: the built-in ones, ``mpi`` first,
    then those of the ``mcr.backends`` entry points."""
    global _NAMES
    if not _NAMES:
        _NAMES = BUILTINS + tuple(sorted(_plugins()))
    return _NAMES


def _plugins() -> "dict[str, EntryPoint]":
    global _PLUGINS
    if _PLUGINS is None:
        from importlib.metadata import entry_points
        found: dict[str, EntryPoint] = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in BUILTINS or ep.name in found:
                kept = "mcr's own" if ep.name in BUILTINS else f"{found[ep.name].value!r}"
                warnings.warn(f"backend {ep.name!r}: entry point {ep.value!r} of "
                              f"{_distribution(ep)} is ignored; {kept} has that name",
                              RuntimeWarning, stacklevel=3)
                continue
            found[ep.name] = ep
        _PLUGINS = found
    return _PLUGINS


def _distribution(ep: "EntryPoint") -> str:
    dist = getattr(ep, "dist", None)
    return f"distribution {dist.name!r}" if dist is not None else "an unknown distribution"


def get(name: str) -> "Backend":
    """The ``Backend`` object registered under ``name``."""
    check_name(name)
    if name == "auto":
        raise ValueError("backend: 'auto' is not a backend, it asks mcr to choose one "
                         f"({', '.join(names())})")
    if name in BUILTINS:
        backend: "Backend" = importlib.import_module(f"{__name__}.{name}").BACKEND
        return backend
    found = _LOADED.get(name)
    if found is None:
        found = _LOADED[name] = _load(_plugins()[name])
    return found


def _load(ep: "EntryPoint") -> "Backend":
    """The backend of entry point ``ep``; errors name it and its distribution."""
    from .base import Backend
    where = (f"entry point {ep.name!r} = {ep.value!r} (group {ENTRY_POINT_GROUP!r}) of "
             f"{_distribution(ep)}")
    try:
        found = ep.load()
        if isinstance(found, type) and issubclass(found, Backend):
            found = found()
    except Exception as exc:
        raise RuntimeError(f"backend {ep.name!r}: {where} failed to load: "
                           f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(found, Backend):
        raise TypeError(f"backend {ep.name!r}: {where} gives a {type(found).__name__}, "
                        "not a mcr.backends.base.Backend instance or subclass")
    if found.name != ep.name:
        raise ValueError(f"backend {ep.name!r}: {where} gives a backend named "
                         f"{found.name!r}; the two names must be the same")
    return found


def check_name(name: object) -> None:
    """Raise TypeError/ValueError unless ``name`` is a backend or ``"auto"``."""
    if not isinstance(name, str):
        raise TypeError(f"backend: expected a string or None, got {type(name).__name__}")
    if name != "auto" and name not in BUILTINS and name not in names():
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
    for sub in subs.values():
        sub.free()              # a TimeoutError keeps the rest for the next Free
    comm.Delete_attr(_KEYVAL)
