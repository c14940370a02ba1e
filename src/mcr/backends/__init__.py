"""The backends a Comm can run an operation on, registered by name.

Every backend is an entry point of the group ``mcr.backends`` (its name is
the backend's, its value ``module:attr`` a ``base.Backend`` instance or
class), mcr's own as well as other packages': mcr's pyproject.toml declares
``mpi``, ``gloo`` and ``nccl`` (``mcr.backends.mpi:BACKEND``, ...). ``mpi`` is
the compiled core itself; ``gloo`` and ``nccl`` wrap torch's process groups
(``torchpg``), and run what they lack through ``compose``, the one place
where missing operations are built from a backend's primitives. The entry
points are read once, at the first name asked for; a backend's module is
imported when that backend is first used. An entry point of another
distribution that takes one of mcr's names is ignored, with a warning.

A Comm's sub-communicator on a backend is made at its first call on that
backend (collective over the Comm, like NCCL's lazy initialization), kept as
an attribute of the MPI communicator (so every Python object sharing the
handle shares it), and shut down by ``Comm.Free``.
"""

import threading
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:         # both are slow to import: read when a backend is loaded
    from importlib.metadata import EntryPoint

    from .base import Backend

    BUILTINS: tuple[str, ...]     # (at run time: from __getattr__, below)

__all__ = ["BUILTINS", "ENTRY_POINT_GROUP", "OWN_DISTRIBUTION", "names", "get", "check_name",
           "subcomm", "release"]

ENTRY_POINT_GROUP = "mcr.backends"
OWN_DISTRIBUTION = "mcr"        # the distribution whose entry points are mcr's own backends
_KEYVAL: int | None = None
_ENTRY_POINTS: "dict[str, EntryPoint] | None" = None     # read once, at first need
_BUILTINS: tuple[str, ...] = ()
_NAMES: tuple[str, ...] = ()
_LOADED: "dict[str, Backend]" = {}
_MAKING = threading.Lock()              # held while a communicator's sub-communicator is made


def __getattr__(attr: str) -> tuple[str, ...]:
    """``BUILTINS``: the names of mcr's own backends, ``mpi`` first, as its
    entry points declare them (read at the first use of the name)."""
    if attr == "BUILTINS":
        _entry_points()
        return _BUILTINS
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def names() -> tuple[str, ...]:
    """The names of the registered backends: mcr's own, ``mpi`` first, then
    those of other distributions' ``mcr.backends`` entry points, each in
    sorted order."""
    if not _NAMES:
        _entry_points()
    return _NAMES


def _entry_points() -> "dict[str, EntryPoint]":
    """Every backend's entry point by name, mcr's own and plug-ins' (read once).

    Raises
    ------
    RuntimeError
        When mcr's own entry points are missing: its metadata is not installed.
    """
    global _ENTRY_POINTS, _BUILTINS, _NAMES
    if _ENTRY_POINTS is None:
        from importlib.metadata import entry_points
        every = list(entry_points(group=ENTRY_POINT_GROUP))
        own = {ep.name: ep for ep in every if _distribution_name(ep) == OWN_DISTRIBUTION}
        if "mpi" not in own:
            seen = f"only {', '.join(sorted(own))} found" if own else "none found"
            raise RuntimeError(
                f"mcr.backends: mcr's own backends (mpi, gloo, nccl) are entry points of "
                f"group {ENTRY_POINT_GROUP!r} of distribution {OWN_DISTRIBUTION!r}, "
                f"{seen}: mcr runs from a source tree that was never installed, or was "
                "installed before its pyproject.toml declared them; run `pip install -e .` "
                "(or `pip install .`) in mcr's source tree")
        found = dict(own)
        for ep in every:
            if _distribution_name(ep) == OWN_DISTRIBUTION:
                continue
            if ep.name in found:
                kept = "mcr's own" if ep.name in own else f"{found[ep.name].value!r}"
                warnings.warn(f"backend {ep.name!r}: entry point {ep.value!r} of "
                              f"{_distribution(ep)} is ignored; {kept} has that name",
                              RuntimeWarning, stacklevel=4)
                continue
            found[ep.name] = ep
        _BUILTINS = ("mpi", *sorted(set(own) - {"mpi"}))
        _NAMES = (*_BUILTINS, *sorted(set(found) - set(own)))
        _ENTRY_POINTS = found
    return _ENTRY_POINTS


def _distribution_name(ep: "EntryPoint") -> str | None:
    dist = getattr(ep, "dist", None)
    return None if dist is None else str(dist.name)


def _distribution(ep: "EntryPoint") -> str:
    name = _distribution_name(ep)
    return f"distribution {name!r}" if name is not None else "an unknown distribution"


def get(name: str) -> "Backend":
    """The ``Backend`` object registered under ``name`` (its entry point is
    loaded at the first call).

    Raises
    ------
    TypeError, ValueError
        When ``name`` is not a string, or not a registered backend's name.
    RuntimeError
        When the backend's entry point fails to load.
    """
    check_name(name)
    if name == "auto":
        raise ValueError("backend: 'auto' is not a backend, it asks mcr to choose one "
                         f"({', '.join(names())})")
    found = _LOADED.get(name)
    if found is None:
        found = _LOADED[name] = _load(_entry_points()[name])
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
    found = None if subs is None else subs.get(name)
    if found is not None:
        return found
    with _MAKING:               # (two threads' first calls get the same one)
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
